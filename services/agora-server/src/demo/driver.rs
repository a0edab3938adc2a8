//! The living demo's driver: plays the demo tenants' HPO frameworks through the real HTTP API.
//! Each [`Demo::step`] reads the service's clock (never the wall clock), registers the apps
//! whose arrival is due while the market's demand is below three times the cluster (at the
//! first step, arrivals come at once until it is: the market opens contended), bids for
//! the apps that bid explicitly, and reports the progress the GPUs each app holds made since
//! the last step; a search stops its worst half of trials at each phase's end. What happens
//! depends only on the seed, the clock and the service's answers; how often steps run (every
//! half second in `agora serve --demo`, as a test likes with a manual clock) only paces it.

use std::collections::BTreeMap;
use std::iter::Peekable;
use std::path::Path;
use std::sync::Arc;

use agora_market::time::Timestamp;
use anyhow::anyhow;
use serde_json::{json, Value};

use super::http::{get, post};
use super::plan::{Arrival, DemoOptions, Plan, Shape, SPEEDUP, TENANTS};
use crate::clock::Clock;

/// The demo admits apps while their demand is below this many times the cluster's GPUs.
pub const DEMAND_OVER_GPUS: u32 = 3;

/// The living demo; see the module's documentation.
#[allow(missing_debug_implementations)] // awc::Client is not Debug
pub struct Demo {
    client: awc::Client,
    base: String,
    admin: String,
    /// Each tenant's token; `None` for a tenant made by an earlier run (its apps are skipped).
    tokens: Vec<Option<String>>,
    clock: Arc<dyn Clock>,
    started: Timestamp,
    last_step: Timestamp,
    plan: Peekable<Plan>,
    gpus: u32,
    apps: Vec<LiveApp>,
    /// Demand has reached [`DEMAND_OVER_GPUS`] times the cluster once: arrivals now follow the
    /// plan's times.
    opened: bool,
}

impl Demo {
    /// Creates the demo tenants (logging their tokens) and reads the cluster's size. With
    /// `tokens_file`, tenants' tokens are kept there, so that a restart on the same database
    /// goes on as the same tenants (withdrawing the apps the earlier run left: their
    /// frameworks are gone).
    pub async fn new(
        base: String,
        admin: String,
        clock: Arc<dyn Clock>,
        options: DemoOptions,
        tokens_file: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let client = awc::Client::default();
        let kept: BTreeMap<String, String> = tokens_file
            .and_then(|file| std::fs::read_to_string(file).ok())
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or_default();
        let mut tokens = Vec::new();
        for tenant in TENANTS {
            let body = json!({ "name": tenant });
            tokens.push(match post(&client, &base, &admin, "/v1/tenants", body).await {
                Ok(created) => {
                    let token = created["token"].as_str().map(str::to_owned);
                    if let Some(token) = &token {
                        // Demo tokens only: they let a newcomer sign in as a tenant.
                        tracing::info!(tenant, token = %token, "demo tenant created");
                    }
                    token
                }
                // 409: the tenant exists (a restart on the same database).
                Err(error) if error.to_string().starts_with("409") => {
                    resume(&client, &base, tenant, kept.get(tenant)).await
                }
                Err(error) => {
                    tracing::warn!(tenant, %error, "demo tenant not created; no apps are added for it");
                    None
                }
            });
        }
        if let Some(file) = tokens_file {
            let known: BTreeMap<&str, &String> = TENANTS
                .iter()
                .zip(&tokens)
                .filter_map(|(tenant, token)| Some((*tenant, token.as_ref()?)))
                .collect();
            if let Err(error) = super::write_private(file, &serde_json::to_string(&known)?) {
                tracing::warn!(file = %file.display(), %error, "demo cannot keep its tenants' tokens; a restart adds no apps");
            }
        }
        let cluster = get(&client, &base, &admin, "/v1/cluster").await?;
        let gpus = cluster["gpus"].as_array().map_or(0, Vec::len) as u32;
        let now = clock.now();
        Ok(Self {
            client,
            base,
            admin,
            tokens,
            clock,
            started: now,
            last_step: now,
            plan: Plan::new(options).peekable(),
            gpus,
            apps: Vec::new(),
            opened: false,
        })
    }

    /// Apps registered and not finished.
    pub fn live_apps(&self) -> usize {
        self.apps.len()
    }

    /// One step at the clock's time now; see the module's documentation.
    pub async fn step(&mut self) {
        let now = self.clock.now();
        let seconds = now.0.saturating_sub(self.last_step.0) as f64 / 1_000.0;
        self.last_step = now;
        self.admit(now).await;
        let held = match self.held_gpus().await {
            Ok(held) => held,
            Err(error) => {
                tracing::warn!(%error, "demo cannot read the cluster; it tries again next step");
                return;
            }
        };
        let mut finished = Vec::new();
        for app in &mut self.apps {
            app.held = held.get(&app.id).copied().unwrap_or(0);
            if app.explicit {
                app.bid_on_offers(&self.client, &self.base).await;
            }
            if app.report_progress(&self.client, &self.base, seconds).await {
                finished.push(app.id);
            }
        }
        self.apps.retain(|app| !finished.contains(&app.id));
    }

    /// Registers the arrivals due by `now` while demand is below [`DEMAND_OVER_GPUS`] times the
    /// cluster; a due arrival waits while the market is that full. Until demand first reaches
    /// that, arrivals come at once: the market opens contended.
    async fn admit(&mut self, now: Timestamp) {
        let since_start = now.0.saturating_sub(self.started.0);
        loop {
            let demand: u32 = self.apps.iter().map(|app| app.trials.width()).sum();
            let full = demand >= DEMAND_OVER_GPUS * self.gpus;
            self.opened |= full;
            let due = self
                .plan
                .peek()
                .is_some_and(|arrival| !self.opened || arrival.at_ms <= since_start);
            if !due || full {
                return;
            }
            let Some(arrival) = self.plan.next() else {
                return;
            };
            let Some(token) = self.tokens[arrival.tenant].clone() else {
                continue;
            };
            match self.register(&arrival, &token).await {
                Ok(id) => self.apps.push(LiveApp {
                    id,
                    token,
                    explicit: arrival.explicit,
                    trials: Trials::of(&arrival.shape),
                    held: 0,
                    events_after: 0,
                }),
                Err(error) => {
                    tracing::warn!(app = arrival.name, %error, "demo app not registered")
                }
            }
        }
    }

    async fn register(&self, arrival: &Arrival, token: &str) -> anyhow::Result<i64> {
        let mut body = json!({
            "name": arrival.name,
            "bidding": if arrival.explicit { "explicit" } else { "agent" },
            "app": arrival.shape.app(),
        });
        let registered = match post(&self.client, &self.base, token, "/v1/apps", body.clone()).await
        {
            // 409: an earlier run on this database used the name; this run's start tells them apart.
            Err(error) if error.to_string().starts_with("409") => {
                body["name"] = json!(format!("{}-{}", arrival.name, self.started.0 / 1_000));
                post(&self.client, &self.base, token, "/v1/apps", body).await?
            }
            answer => answer?,
        };
        registered["id"]
            .as_i64()
            .ok_or_else(|| anyhow!("registration answered {registered}"))
    }

    /// GPUs each app holds now, from the admin's view of the cluster.
    async fn held_gpus(&self) -> anyhow::Result<BTreeMap<i64, usize>> {
        let cluster = get(&self.client, &self.base, &self.admin, "/v1/cluster").await?;
        let mut held = BTreeMap::new();
        for gpu in cluster["gpus"].as_array().into_iter().flatten() {
            if let Some(app) = gpu["app_id"].as_i64() {
                *held.entry(app).or_insert(0) += 1;
            }
        }
        Ok(held)
    }
}

/// A demo tenant made by an earlier run: its kept token, if it still signs in as the tenant,
/// after the apps that run left unfinished are withdrawn.
async fn resume(
    client: &awc::Client,
    base: &str,
    tenant: &str,
    token: Option<&String>,
) -> Option<String> {
    let me = match token {
        Some(token) => get(client, base, token, "/v1/me").await.ok(),
        None => None,
    };
    let (Some(token), Some(me)) = (token, me.filter(|me| me["tenant"] == tenant)) else {
        tracing::info!(tenant, "demo tenant exists from an earlier run on this database and its token is not kept (it was printed then); no new apps are added for it");
        return None;
    };
    let unfinished: Vec<i64> = me["apps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|app| app["finished_at"].is_null())
        .filter_map(|app| app["id"].as_i64())
        .collect();
    for app in &unfinished {
        let path = format!("/v1/apps/{app}/finish");
        if let Err(error) = post(client, base, token, &path, json!({})).await {
            tracing::warn!(tenant, app, %error, "demo cannot withdraw an app of its earlier run");
        }
    }
    tracing::info!(tenant, token = %token, withdrawn = unfinished.len(), "demo tenant resumed with its kept token; the apps of the earlier run are withdrawn");
    Some(token.clone())
}

/// A registered app the demo plays the framework of.
struct LiveApp {
    id: i64,
    token: String,
    explicit: bool,
    trials: Trials,
    held: usize,
    events_after: i64,
}

impl LiveApp {
    /// Bids for every offer among the app's new events.
    async fn bid_on_offers(&mut self, client: &awc::Client, base: &str) {
        let path = format!(
            "/v1/apps/{}/events/poll?after={}&timeout_ms=0",
            self.id, self.events_after
        );
        let page = match get(client, base, &self.token, &path).await {
            Ok(page) => page,
            Err(error) => {
                tracing::warn!(app = self.id, %error, "demo app cannot read its events");
                return;
            }
        };
        self.events_after = page["last_id"].as_i64().unwrap_or(self.events_after);
        for event in page["events"].as_array().into_iter().flatten() {
            if event["kind"] != "offer" {
                continue;
            }
            let offer = &event["payload"];
            let round = offer["round"].as_i64().unwrap_or_default();
            let path = format!("/v1/rounds/{round}/bids");
            if let Err(error) = post(client, base, &self.token, &path, self.bid(offer)).await {
                tracing::info!(app = self.id, round, %error, "demo bid refused");
            }
        }
    }

    /// A simple explicit bid: the first k offered GPUs, rho falling as k grows.
    fn bid(&self, offer: &Value) -> Value {
        let rho_old = offer["rho"].as_f64();
        let base = rho_old.unwrap_or(4.0);
        let wanted = offer["unmet_demand"].as_u64().unwrap_or(1) as usize;
        let gpus: Vec<&Value> = offer["gpus"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|gpu| &gpu["id"])
            .collect();
        let held = self.held as f64;
        let bids: Vec<Value> = (1..=wanted.min(gpus.len()).min(8))
            .map(|count| {
                let rho = base * (held + 1.0) / (held + count as f64 + 1.0);
                json!({ "gpus": gpus[..count], "rho": rho })
            })
            .collect();
        json!({ "app": self.id, "rho_old": rho_old, "bids": bids })
    }

    /// Reports what the held GPUs did over `seconds`. True once the app finished.
    async fn report_progress(&mut self, client: &awc::Client, base: &str, seconds: f64) -> bool {
        let jobs = self.trials.advance(self.held as u32, seconds);
        if jobs.is_empty() {
            return false;
        }
        let path = format!("/v1/apps/{}/progress", self.id);
        match post(client, base, &self.token, &path, json!({ "jobs": jobs })).await {
            Ok(ack) => ack["finished"].as_bool().unwrap_or(false),
            Err(error) => {
                tracing::warn!(app = self.id, %error, "demo progress refused");
                false
            }
        }
    }
}

/// The framework's own view of an app's trials: a single job is a search of one phase with
/// one trial.
#[derive(Debug, Clone, PartialEq)]
pub struct Trials {
    /// (id, completed iterations, stopped)
    jobs: Vec<(String, u64, bool)>,
    /// Iterations a surviving trial has done when each phase ends.
    phase_ends: Vec<u64>,
    jobs_per_phase: Vec<u32>,
    max_gpus_per_phase: Vec<u32>,
    serial_iteration_time: f64,
    phase: usize,
}

impl Trials {
    pub fn of(shape: &Shape) -> Self {
        let (ids, phase_iterations, jobs_per_phase, max_gpus_per_phase, serial) = match shape {
            Shape::SingleJob {
                iterations,
                serial_iteration_time,
                max_gpus,
            } => (
                vec!["train".to_owned()],
                vec![*iterations],
                vec![1],
                vec![*max_gpus],
                *serial_iteration_time,
            ),
            Shape::Search {
                phase_iterations,
                jobs_per_phase,
                max_gpus_per_phase,
                serial_iteration_time,
            } => (
                (0..jobs_per_phase[0])
                    .map(|trial| format!("trial-{trial}"))
                    .collect(),
                phase_iterations.clone(),
                jobs_per_phase.clone(),
                max_gpus_per_phase.clone(),
                *serial_iteration_time,
            ),
        };
        let phase_ends = phase_iterations
            .iter()
            .scan(0, |sum, iterations| {
                *sum += iterations;
                Some(*sum)
            })
            .collect();
        Self {
            jobs: ids.into_iter().map(|id| (id, 0, false)).collect(),
            phase_ends,
            jobs_per_phase,
            max_gpus_per_phase,
            serial_iteration_time: serial,
            phase: 0,
        }
    }

    /// GPUs the trials still running can use.
    pub fn width(&self) -> u32 {
        let running = self.running().count() as u32;
        running * self.max_gpus_per_phase[self.phase]
    }

    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        let end = self.phase_ends[self.phase];
        (0..self.jobs.len()).filter(move |&job| !self.jobs[job].2 && self.jobs[job].1 < end)
    }

    /// Credits `gpus` GPUs over `seconds` of demo time to the running trials, in order, each
    /// on at most its phase's width; at a phase's end the trials beyond the next phase's count
    /// stop. Returns the progress report (empty when nothing changed).
    pub fn advance(&mut self, gpus: u32, seconds: f64) -> Vec<Value> {
        let width = self.max_gpus_per_phase[self.phase];
        let end = self.phase_ends[self.phase];
        let mut left = gpus;
        let mut changed = Vec::new();
        for job in self.running().collect::<Vec<_>>() {
            let on = left.min(width);
            left -= on;
            let iterations =
                (f64::from(on) * seconds * SPEEDUP / self.serial_iteration_time) as u64;
            if iterations > 0 {
                self.jobs[job].1 = (self.jobs[job].1 + iterations).min(end);
                changed.push(job);
            }
        }
        if self.running().next().is_none() && self.phase + 1 < self.phase_ends.len() {
            let survivors = self.jobs_per_phase[self.phase + 1] as usize;
            let alive: Vec<usize> = (0..self.jobs.len()).filter(|&j| !self.jobs[j].2).collect();
            for &job in &alive[survivors.min(alive.len())..] {
                self.jobs[job].2 = true;
                changed.push(job);
            }
            self.phase += 1;
        }
        changed.sort_unstable();
        changed.dedup();
        changed
            .into_iter()
            .map(|job| {
                let (id, completed, stopped) = &self.jobs[job];
                json!({ "job": id, "completed_iterations": completed, "stopped": stopped })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search() -> Trials {
        Trials::of(&Shape::Search {
            phase_iterations: vec![100, 100, 200],
            jobs_per_phase: vec![4, 2, 1],
            max_gpus_per_phase: vec![1, 2, 4],
            serial_iteration_time: 1.0,
        })
    }

    #[test]
    fn held_gpus_go_to_running_trials_each_on_at_most_its_phase_width() {
        let mut trials = search();
        assert_eq!(trials.width(), 4);
        // 2 GPUs for 1 s at 20x: the first two trials do 20 iterations each.
        let report = trials.advance(2, 1.0);
        assert_eq!(report.len(), 2);
        assert_eq!(
            report[0],
            json!({ "job": "trial-0", "completed_iterations": 20, "stopped": false })
        );
        assert!(
            trials.advance(0, 1.0).is_empty(),
            "no GPU, nothing to report"
        );
    }

    #[test]
    fn at_a_phase_end_the_trials_beyond_the_next_phase_stop_and_the_survivors_widen() {
        let mut trials = search();
        let report = trials.advance(4, 10.0);
        assert_eq!(report.len(), 4);
        let stopped: Vec<bool> = report.iter().map(|job| job["stopped"] == true).collect();
        assert_eq!(stopped, [false, false, true, true]);
        assert!(report.iter().all(|job| job["completed_iterations"] == 100));
        assert_eq!(trials.width(), 4, "two survivors on two GPUs each");
        trials.advance(4, 10.0);
        assert_eq!(trials.width(), 4, "one survivor on four GPUs");
        let last = trials.advance(4, 10.0);
        assert_eq!(
            last,
            vec![json!({ "job": "trial-0", "completed_iterations": 400, "stopped": false })]
        );
        assert_eq!(trials.width(), 0, "done");
    }
}
