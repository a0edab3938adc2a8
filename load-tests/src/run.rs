//! A load run: tenants, then apps registered (all at once or a few at a time), then one player
//! per app for the run's duration, on one or more threads (one actix runtime each).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use futures_util::{stream, StreamExt as _};
use serde_json::json;

use crate::api::Api;
use crate::player::{registration, AckedBid, Behaviour, Player};
use crate::stats::{Live, Op, Stats};

/// What to play.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The arbiters' base URLs, comma-separated: one, or several sharing a database (`Api`).
    pub base: String,
    pub admin_token: String,
    /// Prefix of tenant and app names, unique per run so runs can share a database.
    pub label: String,
    pub tenants: usize,
    pub apps: usize,
    pub jobs_per_app: u32,
    /// Registrations in flight at once (per thread); `apps` for a burst.
    pub register_concurrency: usize,
    /// How long the players play once their apps are registered (zero: register only).
    pub duration: Duration,
    pub hold: Duration,
    pub poll_timeout: Duration,
    pub threads: usize,
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub stats: Stats,
    pub acked: Vec<AckedBid>,
    pub registered: usize,
    /// Longest time any thread took to register its apps.
    pub register_elapsed: Duration,
}

impl Outcome {
    fn merge(&mut self, other: Outcome) {
        self.stats.merge(other.stats);
        self.acked.extend(other.acked);
        self.registered += other.registered;
        self.register_elapsed = self.register_elapsed.max(other.register_elapsed);
    }
}

/// Creates the run's tenants (admin token) and returns their tokens.
pub async fn create_tenants(
    plan: &Plan,
    stats: &mut Stats,
    live: &Live,
) -> anyhow::Result<Vec<String>> {
    let api = Api::new(&plan.base);
    let mut tokens = Vec::with_capacity(plan.tenants);
    for tenant in 0..plan.tenants.max(1) {
        let body = json!({ "name": format!("{}-tenant-{tenant}", plan.label) });
        let outcome = api
            .call("POST", "/v1/tenants", &plan.admin_token, Some(&body), &[])
            .await;
        let answer = stats.record(live, Op::Tenant, &outcome).ok_or_else(|| {
            anyhow!("cannot create a tenant (is the admin token right?): {outcome:?}")
        })?;
        let token = answer.body["token"].as_str().context("tenant token")?;
        tokens.push(token.to_owned());
    }
    Ok(tokens)
}

/// The whole run on the current actix runtime (one thread): what the test suite uses.
pub async fn run_local(plan: &Plan, live: Arc<Live>) -> anyhow::Result<Outcome> {
    let mut stats = Stats::default();
    let tokens = create_tenants(plan, &mut stats, &live).await?;
    let mut outcome = run_share(plan, &tokens, 0, 1, live).await;
    outcome.stats.merge(stats);
    Ok(outcome)
}

/// The apps of one thread: those whose index is `share` modulo `shares`.
pub async fn run_share(
    plan: &Plan,
    tokens: &[String],
    share: usize,
    shares: usize,
    live: Arc<Live>,
) -> Outcome {
    let api = Rc::new(Api::new(&plan.base));
    let stats = Rc::new(RefCell::new(Stats::default()));
    let started = Instant::now();
    let apps: Vec<(i64, Rc<str>)> = stream::iter((share..plan.apps).step_by(shares.max(1)))
        .map(|index| {
            let (api, stats, live) = (api.clone(), stats.clone(), live.clone());
            let token: Rc<str> = tokens[index % tokens.len()].as_str().into();
            let body = registration(&format!("{}-app-{index}", plan.label), plan.jobs_per_app);
            async move {
                let outcome = api.call("POST", "/v1/apps", &token, Some(&body), &[]).await;
                let id = stats
                    .borrow_mut()
                    .record(&live, Op::Register, &outcome)?
                    .body["id"]
                    .as_i64()?;
                Some((id, token))
            }
        })
        .buffer_unordered(plan.register_concurrency.max(1))
        .filter_map(|registered| async move { registered })
        .collect()
        .await;
    let register_elapsed = started.elapsed();
    let behaviour = Behaviour {
        hold: plan.hold,
        poll_timeout: plan.poll_timeout,
        until: Instant::now() + plan.duration,
    };
    let registered = apps.len();
    let players = apps.into_iter().map(|(app, token)| {
        let player = Player {
            api: api.clone(),
            token,
            app,
            behaviour,
            stats: stats.clone(),
            live: live.clone(),
        };
        actix_rt::spawn(player.run())
    });
    let mut acked = Vec::new();
    for finished in futures_util::future::join_all(players.collect::<Vec<_>>()).await {
        acked.extend(finished.unwrap_or_default());
    }
    let stats = stats.take();
    Outcome {
        stats,
        acked,
        registered,
        register_elapsed,
    }
}

/// The run on `plan.threads` threads, each with its own runtime and connection pool.
pub fn run_threads(plan: &Plan, tokens: Vec<String>, live: Arc<Live>) -> Outcome {
    let tokens = Arc::new(tokens);
    let shares = plan.threads.max(1);
    let handles: Vec<_> = (0..shares)
        .map(|share| {
            let (plan, tokens, live) = (plan.clone(), tokens.clone(), live.clone());
            std::thread::spawn(move || {
                actix_rt::System::new().block_on(run_share(&plan, &tokens, share, shares, live))
            })
        })
        .collect();
    let mut outcome = Outcome::default();
    for handle in handles {
        match handle.join() {
            Ok(share) => outcome.merge(share),
            Err(_) => {
                *outcome
                    .stats
                    .errors
                    .entry("load thread panicked".to_owned())
                    .or_default() += 1;
            }
        }
    }
    outcome
}
