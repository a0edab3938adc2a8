//! The event-driven simulator. Simulated time jumps from event to event (an app arrives, a
//! lease ends, a job reaches its next milestone); on every event that frees or claims GPUs
//! the engine runs a round (`Market::run_round`), exactly as the service would.
//!
//! The simulator only executes: jobs progress at iteration time = serial time x slowdown of
//! their GPUs' placement / GPUs used, pause for a checkpoint-restore when their GPUs change,
//! successive halving stops the worse half of its jobs at each phase end, and performance-curve
//! jobs stop at their predicted iteration. Every decision about who gets which GPU is the
//! engine's.

use std::collections::BTreeMap;
use std::time::Duration;

use agora_market::app::{App, AppId, AppKind, Job, PlacementSlowdown};
use agora_market::fairness::{ideal_cluster_time, job_shares, ContentionTracker};
use agora_market::market::{Market, MarketConfig, MarketError};
use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, GpuIndex};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::metrics::{AppReport, SimulationReport};
use crate::workload::{Workload, WorkloadApp};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimulationConfig {
    pub market: MarketConfig,
    /// Pause of a job whose GPUs change, to checkpoint and restore (§6.2.3 measures ~35 s).
    #[serde(with = "agora_market::time::duration_seconds")]
    pub restart_pause: Duration,
    pub seed: u64,
    /// Relative error injected into what the market is told of each job's serial iteration
    /// time: each job's is multiplied by a factor drawn uniformly from [1 - e, 1 + e] (Fig 17).
    pub estimation_error: f64,
    /// One app that lies about its placement sensitivity (Fig 18).
    pub misreport: Option<Misreport>,
}

impl Default for SimulationConfig {
    fn default() -> Self {
        Self {
            market: MarketConfig::default(),
            restart_pause: Duration::from_secs(35),
            seed: 0,
            estimation_error: 0.0,
            misreport: None,
        }
    }
}

/// An app that reports each slowdown S as 1 + (S - 1)(1 + exaggeration): 0 is the truth, 1
/// doubles its claimed placement penalty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Misreport {
    pub app: AppId,
    pub exaggeration: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum SimulationError {
    #[error("the workload has two apps with id {0}; app ids must be unique")]
    DuplicateApp(AppId),
    #[error("app {0} arrives at an invalid time; arrival_seconds must be finite and >= 0")]
    InvalidArrival(AppId),
    #[error(transparent)]
    Market(#[from] MarketError),
}

/// How far a simulation has got, for progress bars.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub now: Timestamp,
    pub finished_apps: usize,
    pub total_apps: usize,
}

/// Replays `workload` on `cluster` and reports what every app experienced.
pub fn simulate(
    cluster: &Cluster,
    workload: &Workload,
    config: &SimulationConfig,
    mut on_progress: impl FnMut(Progress),
) -> Result<SimulationReport, SimulationError> {
    let mut world = World::new(cluster, workload, config)?;
    while let Some(next) = world.next_event_time() {
        world.advance_to(next);
        if world.handle_events()? {
            world.run_round()?;
        }
        world.assign_gpus_to_jobs();
        on_progress(world.progress());
    }
    Ok(world.report())
}

/// A job as it actually runs.
#[derive(Debug, Clone)]
struct RunningJob {
    completed: f64,
    gpus: Vec<GpuIndex>,
    paused_until: Timestamp,
    has_run: bool,
}

/// An app as it actually runs: the truth, plus what was measured.
#[derive(Debug, Clone)]
struct RunningApp {
    truth: App,
    model: String,
    arrival: Timestamp,
    quality: BTreeMap<String, f64>,
    jobs: BTreeMap<String, RunningJob>,
    gpus: Vec<GpuIndex>,
    finish: Option<Timestamp>,
    contention_at_arrival: f64,
    ideal_cluster_seconds: f64,
    gpu_seconds: f64,
    placement_score_seconds: f64,
    running_job_seconds: f64,
    reallocations: u32,
}

struct World<'a> {
    config: &'a SimulationConfig,
    cluster: &'a Cluster,
    market: Market,
    now: Timestamp,
    pending: Vec<WorkloadApp>,
    apps: BTreeMap<AppId, RunningApp>,
    contention: ContentionTracker,
    rng: ChaCha8Rng,
    rounds: u64,
    total_apps: usize,
}

impl<'a> World<'a> {
    fn new(
        cluster: &'a Cluster,
        workload: &Workload,
        config: &'a SimulationConfig,
    ) -> Result<Self, SimulationError> {
        let mut pending = workload.apps.clone();
        let mut seen = std::collections::BTreeSet::new();
        for entry in &pending {
            if !seen.insert(entry.app.id.clone()) {
                return Err(SimulationError::DuplicateApp(entry.app.id.clone()));
            }
            if !(entry.arrival_seconds.is_finite() && entry.arrival_seconds >= 0.0) {
                return Err(SimulationError::InvalidArrival(entry.app.id.clone()));
            }
        }
        // Latest first, so the next arrival is popped from the end.
        pending.sort_by(|a, b| {
            b.arrival_seconds
                .total_cmp(&a.arrival_seconds)
                .then(b.app.id.cmp(&a.app.id))
        });
        Ok(Self {
            config,
            cluster,
            market: Market::new(cluster.clone(), config.market, Timestamp(0))?,
            now: Timestamp(0),
            total_apps: pending.len(),
            pending,
            apps: BTreeMap::new(),
            contention: ContentionTracker::new(Timestamp(0)),
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            rounds: 0,
        })
    }

    fn progress(&self) -> Progress {
        Progress {
            now: self.now,
            finished_apps: self
                .apps
                .values()
                .filter(|app| app.finish.is_some())
                .count(),
            total_apps: self.total_apps,
        }
    }

    /// The earliest of: the next arrival, the next lease end, the next job milestone.
    fn next_event_time(&self) -> Option<Timestamp> {
        let arrival = self
            .pending
            .last()
            .map(|entry| Timestamp::from_secs_f64(entry.arrival_seconds));
        let expiry = self.market.leases().next_expiry();
        let milestone = self
            .apps
            .values()
            .filter_map(|app| self.next_milestone(app))
            .min();
        [arrival, expiry, milestone]
            .into_iter()
            .flatten()
            .min()
            .map(|time| time.max(self.now))
    }

    /// When the first of the app's running jobs reaches its target (a millisecond later than
    /// the exact time, so the job is surely past it when the event is handled).
    fn next_milestone(&self, app: &RunningApp) -> Option<Timestamp> {
        app.finish.is_none().then_some(())?;
        running_jobs(&app.truth)
            .filter_map(|job| {
                let running = &app.jobs[&job.id];
                let speed = self.iterations_per_second(job, &running.gpus)?;
                let left = (target_iterations(&app.truth, job) - running.completed).max(0.0);
                let start = running.paused_until.max(self.now);
                Some(
                    start
                        .saturating_add(Duration::from_secs_f64(left / speed))
                        .saturating_add(Duration::from_millis(1)),
                )
            })
            .min()
    }

    fn iterations_per_second(&self, job: &Job, gpus: &[GpuIndex]) -> Option<f64> {
        if gpus.is_empty() {
            return None;
        }
        let used = gpus.len().min(job.max_gpus.max(1) as usize);
        let slowdown = job.slowdown.at(self.cluster.locality(&gpus[..used]));
        Some(used as f64 / (job.serial_iteration_time * slowdown))
    }

    /// Runs every job from `self.now` to `until` and books GPU time and placement.
    fn advance_to(&mut self, until: Timestamp) {
        let (from, cluster) = (self.now, self.cluster);
        for app in self.apps.values_mut().filter(|app| app.finish.is_none()) {
            app.gpu_seconds += app.gpus.len() as f64 * until.saturating_since(from).as_secs_f64();
            let jobs: Vec<Job> = running_jobs(&app.truth).cloned().collect();
            for job in jobs {
                let running = app.jobs.get_mut(&job.id).expect("every job is tracked");
                if running.gpus.is_empty() {
                    continue;
                }
                let used = running.gpus.len().min(job.max_gpus.max(1) as usize);
                let slowdown = job.slowdown.at(cluster.locality(&running.gpus[..used]));
                let seconds = until
                    .saturating_since(running.paused_until.max(from))
                    .as_secs_f64();
                let target = target_iterations(&app.truth, &job);
                running.completed = (running.completed
                    + seconds * used as f64 / (job.serial_iteration_time * slowdown))
                    .min(target);
                app.placement_score_seconds += seconds / slowdown;
                app.running_job_seconds += seconds;
            }
        }
        self.now = until;
    }

    fn active_apps(&self) -> usize {
        self.apps
            .values()
            .filter(|app| app.finish.is_none())
            .count()
    }

    /// Applies what happens at `self.now`; true if GPUs were freed or claimed (a round is due).
    fn handle_events(&mut self) -> Result<bool, SimulationError> {
        let now = self.now;
        let mut changed = !self.market.expire_leases(now).is_empty();
        let ids: Vec<AppId> = self
            .apps
            .iter()
            .filter(|(_, app)| app.finish.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            changed |= self.settle_progress(&id)?;
        }
        while self
            .pending
            .last()
            .is_some_and(|entry| Timestamp::from_secs_f64(entry.arrival_seconds) <= now)
        {
            let entry = self.pending.pop().expect("checked above");
            self.arrive(entry)?;
            changed = true;
        }
        self.contention
            .set_active_apps(now, self.active_apps() as u32);
        Ok(changed)
    }

    /// Records job completions, ends successive-halving phases and finishes apps. Tells the
    /// market what the framework would report. True if the app finished.
    fn settle_progress(&mut self, id: &AppId) -> Result<bool, SimulationError> {
        let now = self.now;
        let app = self.apps.get_mut(id).expect("known app");
        sync_completed(&mut app.truth, &app.jobs);
        let phase_done = running_jobs(&app.truth).next().is_none();
        if let AppKind::SuccessiveHalving(search) = &mut app.truth.kind {
            if phase_done && search.current_phase + 1 < search.phase_iterations.len() {
                let keep = search
                    .jobs_per_phase
                    .get(search.current_phase + 1)
                    .copied()
                    .unwrap_or(0) as usize;
                let mut survivors: Vec<&Job> =
                    search.jobs.iter().filter(|job| !job.stopped).collect();
                survivors.sort_by(|a, b| {
                    let quality = |job: &Job| app.quality.get(&job.id).copied().unwrap_or(0.0);
                    quality(b).total_cmp(&quality(a)).then(a.id.cmp(&b.id))
                });
                let names: Vec<String> = survivors
                    .iter()
                    .take(keep)
                    .map(|job| job.id.clone())
                    .collect();
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                search.advance_phase(&names);
                if let Some(AppKind::SuccessiveHalving(reported)) =
                    self.market.app_mut(id).map(|app| &mut app.kind)
                {
                    reported.advance_phase(&names);
                }
            }
        }
        let finished = app.truth.is_finished();
        let truth = app.truth.clone();
        if let Some(reported) = self.market.app_mut(id) {
            copy_progress(&truth, reported);
        }
        if finished {
            app.finish = Some(now);
            app.gpus.clear();
            self.market.remove_app(id, now)?;
            return Ok(true);
        }
        self.release_surplus(id, now)
    }

    /// An app holding more GPUs than its jobs can use gives whole leases back early, largest
    /// first, as long as it keeps enough for its demand. True if it released any.
    fn release_surplus(&mut self, id: &AppId, now: Timestamp) -> Result<bool, SimulationError> {
        let demand = self.market.app(id).map_or(0, App::current_demand) as usize;
        let mut leases: Vec<(usize, agora_market::lease::LeaseId)> = self
            .market
            .leases()
            .leases_of(id)
            .map(|lease| (lease.gpus.len(), lease.id))
            .collect();
        leases.sort_by(|a, b| b.cmp(a));
        let mut held: usize = leases.iter().map(|(size, _)| size).sum();
        let mut released = false;
        for (size, lease) in leases {
            if held - size >= demand {
                self.market.release_lease(lease, now)?;
                held -= size;
                released = true;
            }
        }
        Ok(released)
    }

    fn arrive(&mut self, entry: WorkloadApp) -> Result<(), SimulationError> {
        let now = self.now;
        let reported = self.reported(&entry.app);
        self.market.add_app(reported, now)?;
        let jobs = all_jobs(&entry.app)
            .map(|job| {
                let running = RunningJob {
                    completed: job.completed_iterations as f64,
                    gpus: Vec::new(),
                    paused_until: now,
                    has_run: false,
                };
                (job.id.clone(), running)
            })
            .collect();
        self.contention
            .set_active_apps(now, self.active_apps() as u32 + 1);
        let app = RunningApp {
            ideal_cluster_seconds: ideal_cluster_time(&entry.app, self.cluster.len() as u32),
            truth: entry.app,
            model: entry.model,
            arrival: now,
            quality: entry.job_quality,
            jobs,
            gpus: Vec::new(),
            finish: None,
            contention_at_arrival: self.contention.integral_at(now),
            gpu_seconds: 0.0,
            placement_score_seconds: 0.0,
            running_job_seconds: 0.0,
            reallocations: 0,
        };
        self.apps.insert(app.truth.id.clone(), app);
        Ok(())
    }

    /// What the app's framework tells the market: the truth, with injected estimation error
    /// and, for the liar, exaggerated placement sensitivity.
    fn reported(&mut self, truth: &App) -> App {
        let mut reported = truth.clone();
        let error = self.config.estimation_error;
        let exaggeration = self
            .config
            .misreport
            .as_ref()
            .filter(|liar| liar.app == truth.id)
            .map(|liar| liar.exaggeration);
        for job in all_jobs_mut(&mut reported) {
            if error > 0.0 {
                job.serial_iteration_time *= 1.0 + self.rng.random_range(-error..=error);
            }
            if let Some(exaggeration) = exaggeration {
                job.slowdown = exaggerate(job.slowdown, exaggeration);
            }
        }
        reported
    }

    fn run_round(&mut self) -> Result<(), SimulationError> {
        self.rounds += 1;
        let seed = self.config.seed ^ self.rounds.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        if let Some(outcome) = self.market.run_round(self.now, seed) {
            outcome?;
        }
        Ok(())
    }

    /// Each app's scheduler shares the app's GPUs among its running jobs; a job whose GPUs
    /// change pauses to checkpoint and restore.
    fn assign_gpus_to_jobs(&mut self) {
        let (now, pause) = (self.now, self.config.restart_pause);
        for (id, app) in self.apps.iter_mut().filter(|(_, app)| app.finish.is_none()) {
            let mut gpus: Vec<GpuIndex> = self
                .market
                .leases()
                .leases_of(id)
                .flat_map(|lease| lease.gpus.clone())
                .collect();
            // A canonical order, so an unchanged set of GPUs never looks like a move.
            gpus.sort_by_key(|&gpu| (self.cluster.location(gpu), gpu));
            if gpus != app.gpus && !app.gpus.is_empty() {
                app.reallocations += 1;
            }
            app.gpus = gpus;
            let jobs: Vec<&Job> = running_jobs(&app.truth).collect();
            let work: Vec<f64> = jobs
                .iter()
                .map(|job| {
                    (target_iterations(&app.truth, job) - app.jobs[&job.id].completed)
                        * job.serial_iteration_time
                })
                .collect();
            let demands: Vec<u32> = jobs.iter().map(|job| job.max_gpus).collect();
            let shares = job_shares(&work, &demands, app.gpus.len());
            for (job, share) in jobs.iter().zip(shares) {
                let assigned = share
                    .map(|range| app.gpus[range].to_vec())
                    .unwrap_or_default();
                let running = app.jobs.get_mut(&job.id).expect("every job is tracked");
                if assigned != running.gpus {
                    if running.has_run && !assigned.is_empty() {
                        running.paused_until = now.saturating_add(pause);
                    }
                    running.has_run |= !assigned.is_empty();
                    running.gpus = assigned;
                }
            }
        }
    }

    fn report(self) -> SimulationReport {
        let apps = self
            .apps
            .into_values()
            .map(|app| {
                let finish = app.finish.unwrap_or(self.now);
                let average_contention =
                    self.contention
                        .average_since(app.arrival, app.contention_at_arrival, finish);
                let completion_seconds = finish.saturating_since(app.arrival).as_secs_f64();
                AppReport {
                    finished: app.finish.is_some(),
                    app: app.truth.id.clone(),
                    model: app.model,
                    arrival_seconds: app.arrival.as_secs_f64(),
                    completion_seconds,
                    rho: completion_seconds / (app.ideal_cluster_seconds * average_contention),
                    gpu_seconds: app.gpu_seconds,
                    placement_score: if app.running_job_seconds > 0.0 {
                        app.placement_score_seconds / app.running_job_seconds
                    } else {
                        1.0
                    },
                    reallocations: app.reallocations,
                }
            })
            .collect();
        SimulationReport::new(self.config.market.policy, apps, self.rounds)
    }
}

fn exaggerate(slowdown: PlacementSlowdown, exaggeration: f64) -> PlacementSlowdown {
    let scale = |value: f64| 1.0 + (value - 1.0) * (1.0 + exaggeration);
    PlacementSlowdown {
        same_slot: scale(slowdown.same_slot),
        same_machine: scale(slowdown.same_machine),
        same_rack: scale(slowdown.same_rack),
        cross_rack: scale(slowdown.cross_rack),
    }
}

fn all_jobs(app: &App) -> Box<dyn Iterator<Item = &Job> + '_> {
    match &app.kind {
        AppKind::SingleJob { job } => Box::new(std::iter::once(job)),
        AppKind::SuccessiveHalving(search) => Box::new(search.jobs.iter()),
        AppKind::PerformanceCurve(search) => Box::new(search.jobs.iter().map(|curve| &curve.job)),
    }
}

fn all_jobs_mut(app: &mut App) -> Box<dyn Iterator<Item = &mut Job> + '_> {
    match &mut app.kind {
        AppKind::SingleJob { job } => Box::new(std::iter::once(job)),
        AppKind::SuccessiveHalving(search) => Box::new(search.jobs.iter_mut()),
        AppKind::PerformanceCurve(search) => {
            Box::new(search.jobs.iter_mut().map(|curve| &mut curve.job))
        }
    }
}

/// The iteration a job runs to now: its total, its phase's end, or its predicted stop.
fn target_iterations(app: &App, job: &Job) -> f64 {
    let target = match &app.kind {
        AppKind::SingleJob { .. } => job.total_iterations,
        AppKind::SuccessiveHalving(search) => search
            .phase_iterations
            .iter()
            .take(search.current_phase + 1)
            .sum(),
        AppKind::PerformanceCurve(search) => search
            .jobs
            .iter()
            .find(|curve| curve.job.id == job.id)
            .map_or(job.total_iterations, |curve| {
                curve.predicted_final_iteration
            }),
    };
    target.min(job.total_iterations) as f64
}

/// Jobs that still have iterations to run towards their current target.
fn running_jobs(app: &App) -> impl Iterator<Item = &Job> {
    all_jobs(app).filter(move |job| {
        !job.stopped && (job.completed_iterations as f64) < target_iterations(app, job)
    })
}

/// Completed iterations the framework reports: whole iterations of each job.
fn sync_completed(app: &mut App, jobs: &BTreeMap<String, RunningJob>) {
    for job in all_jobs_mut(app) {
        if let Some(running) = jobs.get(&job.id) {
            job.completed_iterations = running.completed.floor() as u64;
        }
    }
}

/// Copies progress (completed iterations, stopped jobs) from the truth to the market's copy.
fn copy_progress(truth: &App, reported: &mut App) {
    let progress: BTreeMap<&str, (u64, bool)> = all_jobs(truth)
        .map(|job| (job.id.as_str(), (job.completed_iterations, job.stopped)))
        .collect();
    for job in all_jobs_mut(reported) {
        if let Some(&(completed, stopped)) = progress.get(job.id.as_str()) {
            job.completed_iterations = completed;
            job.stopped = stopped;
        }
    }
}
