//! The event-driven simulator. Simulated time jumps from event to event (an app arrives, a
//! lease ends, a job reaches its next milestone); on every event that frees or claims GPUs
//! the engine runs a round (`Market::run_round`), exactly as the service would.
//!
//! The simulator only executes: jobs progress at iteration time = serial time x slowdown of
//! their GPUs' placement / GPUs used, pause for a checkpoint-restore when their GPUs change,
//! successive halving stops the worse half of its jobs at each phase end, and performance-curve
//! jobs stop at their predicted iteration. Every decision about who gets which GPU is the
//! engine's.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use agora_market::app::{App, AppId, AppKind, Job, PlacementSlowdown, SuccessiveHalving};
use agora_market::fairness::{
    job_widths, place_widths, slowest_useful_speed, ContentionTracker, Lifetime, PhasePlan,
};
use agora_market::market::{Market, MarketConfig, MarketError};
use agora_market::throughput::{gpu_types, GpuSpeeds};
use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, GpuIndex, GpuLocation};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::metrics::{AppReport, MechanismStats, SimulationReport};
use crate::models;
use crate::trace::MAX_ARRIVAL_SECONDS;
use crate::workload::{Workload, WorkloadApp};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimulationConfig {
    /// The market's settings, the restart pause of a job whose GPUs change among them.
    pub market: MarketConfig,
    pub seed: u64,
    /// Relative error injected into what the market is told of each job's serial iteration
    /// time: each job's is multiplied by a factor drawn uniformly from [1 - e, 1 + e] (Fig 17).
    pub estimation_error: f64,
    /// One app that lies about its placement sensitivity (Fig 18).
    pub misreport: Option<Misreport>,
    /// What the market is told of jobs whose speed changes as they train.
    pub speed_changes: SpeedChangeReporting,
}

/// How the market learns of a job's speed changes (dynamic adaptation, Shockwave NSDI'23).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpeedChangeReporting {
    /// The job declares its schedule up front, and rho and bids use the forecast.
    #[default]
    Forecast,
    /// The market is told only the speed of the phase running now, updated after each
    /// change (the reactive estimate Shockwave attributes to Themis, §2.2).
    Reactive,
}

impl Default for SimulationConfig {
    fn default() -> Self {
        Self {
            market: MarketConfig::default(),
            seed: 0,
            estimation_error: 0.0,
            misreport: None,
            speed_changes: SpeedChangeReporting::default(),
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
    #[error(
        "app {0} arrives at an invalid time; arrival_seconds must be a number of seconds in \
         [0, 1e9]"
    )]
    InvalidArrival(AppId),
    #[error(
        "app {app}: job {job} wants {max_gpus} GPUs but the cluster has only {cluster}; \
         give it at most {cluster} (max_gpus, or num_gpu in a Tiresias trace) or simulate a \
         larger cluster"
    )]
    JobLargerThanCluster {
        app: AppId,
        job: String,
        max_gpus: u32,
        cluster: usize,
    },
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
    /// How many of the job's speed changes it has gone through.
    speed_changes_passed: usize,
    /// The successive-halving phase it was last placed in.
    placed_in_phase: usize,
    /// The most GPUs it has run on in that phase.
    widest_in_phase: usize,
}

/// An app as it actually runs: the truth, plus what was measured.
#[derive(Debug, Clone)]
struct RunningApp {
    truth: App,
    model: String,
    quality: BTreeMap<String, f64>,
    jobs: BTreeMap<String, RunningJob>,
    gpus: Vec<GpuIndex>,
    lifetime: Lifetime,
    /// T_cluster with hindsight ([`hindsight_cluster_time`]).
    cluster_seconds: f64,
    /// The app's true speed on each GPU of the cluster.
    speeds: GpuSpeeds,
    gpu_seconds: f64,
    placement_score_seconds: f64,
    running_job_seconds: f64,
    reallocations: u32,
    restarts: u32,
    restart_gpu_seconds: f64,
}

impl RunningApp {
    fn is_active(&self) -> bool {
        self.lifetime.departure().is_none()
    }
}

struct World<'a> {
    config: &'a SimulationConfig,
    cluster: &'a Cluster,
    /// Every GPU's location, for T_cluster.
    cluster_locations: Vec<GpuLocation>,
    market: Market,
    now: Timestamp,
    pending: Vec<WorkloadApp>,
    apps: BTreeMap<AppId, RunningApp>,
    contention: ContentionTracker,
    rng: ChaCha8Rng,
    rounds: u64,
    total_apps: usize,
    /// GPUs whose leases expired at `now`, by the app that held them: a lease granted on them
    /// to the same app in this instant's round is a renewal.
    just_expired: BTreeMap<AppId, BTreeSet<GpuIndex>>,
    mechanism: MechanismStats,
}

impl<'a> World<'a> {
    fn new(
        cluster: &'a Cluster,
        workload: &Workload,
        config: &'a SimulationConfig,
    ) -> Result<Self, SimulationError> {
        let mut pending = workload.apps.clone();
        if gpu_types(cluster).len() > 1 {
            for entry in &mut pending {
                with_default_throughput(entry);
            }
        }
        if cluster.models_resources() {
            for entry in &mut pending {
                with_default_resource_profile(entry);
            }
        }
        let mut seen = BTreeSet::new();
        for entry in &pending {
            if !seen.insert(entry.app.id.clone()) {
                return Err(SimulationError::DuplicateApp(entry.app.id.clone()));
            }
            if !(entry.arrival_seconds.is_finite()
                && (0.0..=MAX_ARRIVAL_SECONDS).contains(&entry.arrival_seconds))
            {
                return Err(SimulationError::InvalidArrival(entry.app.id.clone()));
            }
            if let Some(job) = entry
                .app
                .jobs()
                .into_iter()
                .find(|job| job.max_gpus as usize > cluster.len())
            {
                return Err(SimulationError::JobLargerThanCluster {
                    app: entry.app.id.clone(),
                    job: job.id.clone(),
                    max_gpus: job.max_gpus,
                    cluster: cluster.len(),
                });
            }
        }
        // Latest first, so the next arrival is popped from the end. Apps arriving together
        // are admitted in id order: admission order decides nothing but is fixed.
        pending.sort_by(|a, b| {
            b.arrival_seconds
                .total_cmp(&a.arrival_seconds)
                .then(b.app.id.cmp(&a.app.id))
        });
        Ok(Self {
            config,
            cluster,
            cluster_locations: cluster.gpus().map(|(_, gpu)| gpu.location).collect(),
            market: Market::new(cluster.clone(), config.market, Timestamp(0))?,
            now: Timestamp(0),
            total_apps: pending.len(),
            pending,
            apps: BTreeMap::new(),
            contention: ContentionTracker::new(Timestamp(0)),
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            rounds: 0,
            just_expired: BTreeMap::new(),
            mechanism: MechanismStats::default(),
        })
    }

    fn progress(&self) -> Progress {
        Progress {
            now: self.now,
            finished_apps: self.apps.values().filter(|app| !app.is_active()).count(),
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
        app.is_active().then_some(())?;
        running_jobs(&app.truth)
            .filter_map(|job| {
                let running = &app.jobs[&job.id];
                let speed = self.iterations_per_second(app, job, running)?;
                let left =
                    (next_stop(&app.truth, job, running.completed) - running.completed).max(0.0);
                let start = running.paused_until.max(self.now);
                Some(
                    start
                        .saturating_add(Duration::from_secs_f64(left / speed))
                        .saturating_add(Duration::from_millis(1)),
                )
            })
            .min()
    }

    fn iterations_per_second(
        &self,
        app: &RunningApp,
        job: &Job,
        running: &RunningJob,
    ) -> Option<f64> {
        let gpus = &running.gpus;
        if gpus.is_empty() {
            return None;
        }
        let used = gpus.len().min(app.truth.job_max_gpus(job).max(1) as usize);
        let slowdown = job.slowdown.at(self.cluster.locality(&gpus[..used]));
        let speed = slowest_speed(&app.speeds, self.cluster, &gpus[..used]);
        let serial = job.serial_iteration_time_at(running.completed);
        Some(used as f64 / (serial * slowdown) * speed)
    }

    /// Runs every job from `self.now` to `until` and books GPU time and placement.
    fn advance_to(&mut self, until: Timestamp) {
        let (from, cluster) = (self.now, self.cluster);
        for app in self.apps.values_mut().filter(|app| app.is_active()) {
            app.gpu_seconds += app.gpus.len() as f64 * until.saturating_since(from).as_secs_f64();
            let jobs: Vec<Job> = running_jobs(&app.truth).cloned().collect();
            for job in jobs {
                let cap = app.truth.job_max_gpus(&job).max(1) as usize;
                let running = app.jobs.get_mut(&job.id).expect("every job is tracked");
                if running.gpus.is_empty() {
                    continue;
                }
                let used = running.gpus.len().min(cap);
                let slowdown = job.slowdown.at(cluster.locality(&running.gpus[..used]));
                let speed = slowest_speed(&app.speeds, cluster, &running.gpus[..used]);
                let seconds = until
                    .saturating_since(running.paused_until.max(from))
                    .as_secs_f64();
                // Within one step a job runs at one speed: steps end at its speed changes.
                let stop = next_stop(&app.truth, &job, running.completed);
                let serial = job.serial_iteration_time_at(running.completed);
                running.completed = (running.completed
                    + seconds * used as f64 / (serial * slowdown) * speed)
                    .min(stop);
                app.placement_score_seconds += seconds / slowdown;
                app.running_job_seconds += seconds;
            }
        }
        self.now = until;
    }

    /// Applies what happens at `self.now`; true if GPUs were freed or claimed (a round is due).
    fn handle_events(&mut self) -> Result<bool, SimulationError> {
        let now = self.now;
        // Progress first: GPUs that jobs finishing now leave idle are given back before leases
        // end, so an expiring lease's app claims only the GPUs its jobs still run on.
        let mut changed = false;
        let ids: Vec<AppId> = self
            .apps
            .iter()
            .filter(|(_, app)| app.is_active())
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.pass_speed_changes(&id);
            changed |= self.settle_progress(&id)?;
        }
        self.just_expired.clear();
        let expired = self.market.expire_leases(now);
        for lease in &expired {
            self.just_expired
                .entry(lease.app.clone())
                .or_default()
                .extend(lease.gpus.iter().copied());
        }
        changed |= !expired.is_empty();

        while self
            .pending
            .last()
            .is_some_and(|entry| Timestamp::from_secs_f64(entry.arrival_seconds) <= now)
        {
            let entry = self.pending.pop().expect("checked above");
            self.arrive(entry)?;
            changed = true;
        }
        Ok(changed)
    }

    /// Jobs that reached a speed change pause for a checkpoint and restart at the new speed
    /// (the cost of changing the batch size); a market told reactively learns the new speed.
    fn pass_speed_changes(&mut self, id: &AppId) {
        let (now, pause) = (self.now, self.config.market.restart_pause);
        let reactive = self.config.speed_changes == SpeedChangeReporting::Reactive;
        let app = self.apps.get_mut(id).expect("known app");
        let mut new_speeds: Vec<(String, f64)> = Vec::new();
        for job in running_jobs(&app.truth) {
            let running = app.jobs.get_mut(&job.id).expect("every job is tracked");
            let passed = job
                .speed_changes
                .iter()
                .take_while(|change| change.at_iteration as f64 <= running.completed)
                .count();
            if passed > running.speed_changes_passed {
                let phase_time = |phase: usize| {
                    phase
                        .checked_sub(1)
                        .map_or(job.serial_iteration_time, |change| {
                            job.speed_changes[change].serial_iteration_time
                        })
                };
                let ratio = phase_time(passed) / phase_time(running.speed_changes_passed);
                new_speeds.push((job.id.clone(), ratio));
                running.speed_changes_passed = passed;
                running.paused_until = running.paused_until.max(now.saturating_add(pause));
            }
        }
        if !reactive {
            return;
        }
        if let Some(reported) = self.market.app_mut(id) {
            for job in all_jobs_mut(reported) {
                if let Some((_, ratio)) = new_speeds.iter().find(|(name, _)| *name == job.id) {
                    job.serial_iteration_time *= ratio;
                }
            }
        }
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
                let names = survivors(search, &app.quality);
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
            self.contention.depart(&mut app.lifetime, now);
            app.gpus.clear();
            self.market.remove_app(id, now)?;
            return Ok(true);
        }
        self.release_surplus(id, now)
    }

    /// An app holding more GPUs than its demand gives the idle ones (no running job's) back at
    /// once, keeping enough for its demand: at its lease's end it then claims just the GPUs its
    /// jobs run on. True if it released any.
    fn release_surplus(&mut self, id: &AppId, now: Timestamp) -> Result<bool, SimulationError> {
        let demand = self.market.app(id).map_or(0, App::current_demand) as usize;
        let held: Vec<GpuIndex> = self
            .market
            .leases()
            .leases_of(id)
            .flat_map(|lease| lease.gpus.iter().copied())
            .collect();
        let surplus = held.len().saturating_sub(demand);
        if surplus == 0 {
            return Ok(false);
        }
        let app = &self.apps[id];
        let busy: BTreeSet<GpuIndex> = running_jobs(&app.truth)
            .flat_map(|job| app.jobs[&job.id].gpus.iter().copied())
            .collect();
        let mut idle: Vec<GpuIndex> = held.into_iter().filter(|gpu| !busy.contains(gpu)).collect();
        idle.sort_by_key(|&gpu| std::cmp::Reverse((self.cluster.location(gpu), gpu)));
        idle.truncate(surplus);
        if idle.is_empty() {
            return Ok(false);
        }
        self.market.release_gpus(id, &idle, now)?;
        Ok(true)
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
                    speed_changes_passed: 0,
                    placed_in_phase: 0,
                    widest_in_phase: 0,
                };
                (job.id.clone(), running)
            })
            .collect();
        // Its speeds on the GPU types and, where machines give CPUs or memory, with its
        // guaranteed GPU-proportional share of them (the same profile as the market's).
        let speeds = self
            .market
            .app_speeds(&entry.app.id)
            .unwrap_or_else(|| GpuSpeeds::of(entry.app.throughput(), self.cluster));
        let app = RunningApp {
            cluster_seconds: hindsight_cluster_time(
                &entry.app,
                &entry.job_quality,
                &self.cluster_locations,
                &speeds,
                self.config.market.restart_pause.as_secs_f64(),
            ),
            speeds,
            truth: entry.app,
            model: entry.model,
            quality: entry.job_quality,
            jobs,
            gpus: Vec::new(),
            lifetime: self.contention.arrive(now),
            gpu_seconds: 0.0,
            placement_score_seconds: 0.0,
            running_job_seconds: 0.0,
            reallocations: 0,
            restarts: 0,
            restart_gpu_seconds: 0.0,
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
        let reactive = self.config.speed_changes == SpeedChangeReporting::Reactive;
        for job in all_jobs_mut(&mut reported) {
            if error > 0.0 {
                let factor = 1.0 + self.rng.random_range(-error..=error);
                job.serial_iteration_time *= factor;
                for change in &mut job.speed_changes {
                    change.serial_iteration_time *= factor;
                }
            }
            if reactive {
                job.speed_changes.clear();
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
            let outcome = outcome?;
            self.mechanism.count_round(&outcome, &self.just_expired);
            self.apply_resource_split();
        }
        Ok(())
    }

    /// Jobs run at the speed their app's share of each machine's CPUs and memory gives them,
    /// as the market divided them after the round ([`Market::app_speeds`]).
    fn apply_resource_split(&mut self) {
        if !self.cluster.models_resources() {
            return;
        }
        for (id, app) in self.apps.iter_mut().filter(|(_, app)| app.is_active()) {
            if let Some(speeds) = self.market.app_speeds(id) {
                app.speeds = speeds;
            }
        }
    }

    /// Each app's scheduler places its running jobs on the app's GPUs ([`place_jobs`]); a job
    /// whose GPUs change pauses to checkpoint and restore.
    fn assign_gpus_to_jobs(&mut self) {
        let (now, pause) = (self.now, self.config.market.restart_pause);
        let cluster = self.cluster;
        for (id, app) in self.apps.iter_mut().filter(|(_, app)| app.is_active()) {
            let mut gpus: Vec<GpuIndex> = self
                .market
                .leases()
                .leases_of(id)
                .flat_map(|lease| lease.gpus.clone())
                .collect();
            // A canonical order, so an unchanged set of GPUs never looks like a move.
            gpus.sort_by_key(|&gpu| (cluster.location(gpu), gpu));
            if gpus != app.gpus && !app.gpus.is_empty() {
                app.reallocations += 1;
            }
            let grew = gpus.len() > app.gpus.len();
            app.gpus = gpus;
            let phase = current_phase(&app.truth);
            let busy: usize = running_jobs(&app.truth)
                .map(|job| app.jobs[&job.id].gpus.len())
                .sum();
            let has_idle = busy < app.gpus.len();
            let plans: Vec<JobPlacement> = running_jobs(&app.truth)
                .map(|job| {
                    let running = &app.jobs[&job.id];
                    JobPlacement {
                        work: job
                            .serial_seconds(running.completed, target_iterations(&app.truth, job)),
                        max_gpus: app.truth.job_max_gpus(job),
                        slowdown: job.slowdown,
                        current: running.gpus.clone(),
                        // A job squeezed below the width it ran at in this phase (it lost GPUs
                        // and resumed on fewer) widens again once the app has idle GPUs.
                        may_resize: grew
                            || running.placed_in_phase != phase
                            || (has_idle && running.gpus.len() < running.widest_in_phase),
                    }
                })
                .collect();
            // Slower types that would only slow its jobs down stay idle, as the job model
            // plans; a job already running on one keeps it until moving to a faster GPU of
            // the app's saves more than the pause.
            let locations: Vec<GpuLocation> =
                app.gpus.iter().map(|&gpu| cluster.location(gpu)).collect();
            let floor = slowest_useful_speed(
                &app.truth.running_jobs(),
                &locations,
                &app.speeds,
                pause.as_secs_f64(),
            );
            let running: BTreeSet<GpuIndex> = running_jobs(&app.truth)
                .flat_map(|job| app.jobs[&job.id].gpus.iter().copied())
                .collect();
            let useful: Vec<GpuIndex> = app
                .gpus
                .iter()
                .copied()
                .filter(|gpu| {
                    running.contains(gpu) || app.speeds.at(cluster.location(*gpu)) >= floor
                })
                .collect();
            let placed = place_jobs(&plans, &useful, cluster, &app.speeds, pause.as_secs_f64());
            let ids: Vec<String> = running_jobs(&app.truth).map(|job| job.id.clone()).collect();
            for (job, assigned) in ids.iter().zip(placed) {
                let running = app.jobs.get_mut(job).expect("every job is tracked");
                if running.placed_in_phase != phase {
                    running.widest_in_phase = 0;
                }
                running.placed_in_phase = phase;
                running.widest_in_phase = running.widest_in_phase.max(assigned.len());
                if assigned == running.gpus {
                    continue;
                }
                if running.has_run && !assigned.is_empty() {
                    running.paused_until = now.saturating_add(pause);
                    app.restarts += 1;
                    app.restart_gpu_seconds += pause.as_secs_f64() * assigned.len() as f64;
                }
                running.has_run |= !assigned.is_empty();
                running.gpus = assigned;
            }
        }
    }

    fn report(mut self) -> SimulationReport {
        let end = self.now;
        self.mechanism.restarts = self.apps.values().map(|app| u64::from(app.restarts)).sum();
        let apps = self
            .apps
            .into_values()
            .map(|app| {
                let finish = app.lifetime.departure();
                let n_avg = app.lifetime.average_contention(&self.contention, end);
                AppReport::new(
                    app.truth.id.clone(),
                    app.model,
                    finish.is_some(),
                    app.lifetime.arrival.as_secs_f64(),
                    finish
                        .unwrap_or(end)
                        .saturating_since(app.lifetime.arrival)
                        .as_secs_f64(),
                    app.cluster_seconds,
                    n_avg,
                )
                .with_usage(
                    app.gpu_seconds,
                    if app.running_job_seconds > 0.0 {
                        app.placement_score_seconds / app.running_job_seconds
                    } else {
                        1.0
                    },
                    app.reallocations,
                    app.restarts,
                    app.restart_gpu_seconds,
                )
            })
            .collect();
        SimulationReport::new(self.config.market.policy, apps, self.rounds, self.mechanism)
    }
}

/// What an app's scheduler knows of one running job when it places it.
#[derive(Debug, Clone)]
struct JobPlacement {
    /// GPU-seconds of work left to the job's current target.
    work: f64,
    max_gpus: u32,
    slowdown: PlacementSlowdown,
    /// The GPUs it runs on now.
    current: Vec<GpuIndex>,
    /// Whether it may change width now: it entered a new phase, the app got more GPUs, or it
    /// was squeezed below its width in this phase while the app holds idle GPUs.
    may_resize: bool,
}

impl JobPlacement {
    /// Seconds to finish on `gpus`, at the app's `speeds`.
    fn time_on(&self, gpus: &[GpuIndex], cluster: &Cluster, speeds: &GpuSpeeds) -> f64 {
        if gpus.is_empty() {
            return f64::INFINITY;
        }
        let used = gpus.len().min(self.max_gpus.max(1) as usize);
        self.work * self.slowdown.at(cluster.locality(&gpus[..used]))
            / used as f64
            / slowest_speed(speeds, cluster, &gpus[..used])
    }
}

/// How an app's scheduler places its running jobs on `held` (the app's GPUs), as the job
/// model does ([`job_widths`], [`place_widths`]) but without moving a job for nothing:
///
/// - a job keeps its GPUs, at the width it started with, while the app holds them all, unless
///   it runs on a GPU slower than a free one of another type of the app's and moving to the
///   fastest would save more than the restart pause ([`move_to_faster`]);
/// - when it enters a new phase, the app got more GPUs, or it runs on fewer GPUs than it did
///   earlier in the phase (it lost some at a lease's end) while the app holds idle ones, a job
///   whose width should change is
///   resized if that pays (growing must let the slowest of them finish sooner by more than the
///   restart pause, as the job model plans phases; a narrower share forces it) and,
///   restarting anyway, is placed afresh;
/// - jobs without GPUs, and resized ones, are placed on the free GPUs together, the job the
///   phase waits for first; once some jobs run, jobs that never ran queue for one GPU each as
///   GPUs free up, as the job model's phases do when GPUs are fewer than jobs.
///
/// Returns each job's GPUs, in the order of `jobs`.
fn place_jobs(
    jobs: &[JobPlacement],
    held: &[GpuIndex],
    cluster: &Cluster,
    speeds: &GpuSpeeds,
    restart_pause_seconds: f64,
) -> Vec<Vec<GpuIndex>> {
    let work: Vec<f64> = jobs.iter().map(|job| job.work).collect();
    let demands: Vec<u32> = jobs.iter().map(|job| job.max_gpus).collect();
    let widths: Vec<usize> = job_widths(&work, &demands, held.len())
        .into_iter()
        .map(|width| width.max(1))
        .collect();
    let holds: BTreeSet<GpuIndex> = held.iter().copied().collect();
    // Growing pays, as in the job model's plan, if the jobs that may resize finish their
    // phase sooner by more than the restart pause (the phase waits for the slowest of them).
    let resizable = || {
        jobs.iter()
            .zip(&widths)
            .filter(|(job, _)| job.may_resize && !job.current.is_empty())
    };
    let slowest = |time: &dyn Fn(&JobPlacement, usize) -> f64| {
        resizable()
            .map(|(job, &width)| time(job, width))
            .fold(0.0, f64::max)
    };
    let kept = slowest(&|job, _| job.time_on(&job.current, cluster, speeds));
    let resized = slowest(&|job, width| {
        let current = job.current.len();
        job.time_on(&job.current, cluster, speeds) * current as f64 / width.max(current) as f64
    });
    let growth_pays = kept - resized > restart_pause_seconds;
    let resizes = |job: &JobPlacement, width: usize| {
        let current = job.current.len();
        job.may_resize && (width < current || (width > current && growth_pays))
    };
    let mut placed: Vec<Vec<GpuIndex>> = jobs
        .iter()
        .zip(&widths)
        .map(|(job, &width)| {
            let intact =
                !job.current.is_empty() && job.current.iter().all(|gpu| holds.contains(gpu));
            if intact && !resizes(job, width) {
                job.current.clone()
            } else {
                Vec::new()
            }
        })
        .collect();
    move_to_faster(
        jobs,
        &mut placed,
        held,
        cluster,
        speeds,
        restart_pause_seconds,
    );
    let queueing = placed.iter().any(|gpus| !gpus.is_empty());
    let mut by_work: Vec<usize> = (0..jobs.len()).collect();
    by_work.sort_by(|&a, &b| work[b].total_cmp(&work[a]).then(a.cmp(&b)));
    let unplaced: Vec<usize> = by_work
        .into_iter()
        .filter(|&job| placed[job].is_empty())
        .collect();
    let unplaced_widths: Vec<usize> = unplaced
        .iter()
        .map(|&job| {
            let job_placement = &jobs[job];
            let intact = !job_placement.current.is_empty()
                && job_placement.current.iter().all(|gpu| holds.contains(gpu));
            match job_placement.current.len() {
                0 if queueing => 1,
                0 => widths[job],
                _ if intact => widths[job],
                // A job moved off GPUs the app lost resumes at its width.
                width => width.min(widths[job]),
            }
        })
        .collect();
    let free = free_gpus(held, &placed);
    let pool: Vec<GpuLocation> = free.iter().map(|&gpu| cluster.location(gpu)).collect();
    let unplaced_work: Vec<f64> = unplaced.iter().map(|&job| work[job]).collect();
    let placements = place_widths(&unplaced_widths, &unplaced_work, &pool, speeds);
    for (&job, positions) in unplaced.iter().zip(placements) {
        placed[job] = positions
            .into_iter()
            .map(|position| free[position])
            .collect();
    }
    placed
}

/// Unplaces each kept job (most work first) whose slowest GPU is slower than a free one of
/// another type of the app's, when the fastest GPUs among its own and the free ones would save
/// it more than the restart pause: its scheduler checkpoints it and resumes it there, as the
/// job model plans (it leaves a slower type idle when a faster one does better). On one GPU
/// type nothing moves, also where machines' CPU shares make the app's speeds differ (the
/// shares follow the GPUs, so moving for them would chase its own tail).
fn move_to_faster(
    jobs: &[JobPlacement],
    placed: &mut [Vec<GpuIndex>],
    held: &[GpuIndex],
    cluster: &Cluster,
    speeds: &GpuSpeeds,
    restart_pause_seconds: f64,
) {
    let speed = |gpu: GpuIndex| speeds.at(cluster.location(gpu));
    let gpu_type = |gpu: GpuIndex| cluster.gpu(gpu).gpu_type.as_str();
    let mut kept: Vec<usize> = (0..jobs.len())
        .filter(|&job| !placed[job].is_empty())
        .collect();
    kept.sort_by(|&a, &b| jobs[b].work.total_cmp(&jobs[a].work).then(a.cmp(&b)));
    for job in kept {
        let free = free_gpus(held, placed);
        let slowest = placed[job]
            .iter()
            .map(|&gpu| speed(gpu))
            .fold(f64::INFINITY, f64::min);
        let slowest_types: BTreeSet<&str> = placed[job]
            .iter()
            .filter(|&&gpu| speed(gpu) == slowest)
            .map(|&gpu| gpu_type(gpu))
            .collect();
        if !free
            .iter()
            .any(|&gpu| speed(gpu) > slowest && !slowest_types.contains(gpu_type(gpu)))
        {
            continue;
        }
        let mut fastest = free;
        fastest.extend(&placed[job]);
        fastest.sort_by(|&a, &b| {
            speed(b)
                .total_cmp(&speed(a))
                .then(cluster.location(a).cmp(&cluster.location(b)))
                .then(a.cmp(&b))
        });
        fastest.truncate(placed[job].len());
        let saved = jobs[job].time_on(&placed[job], cluster, speeds)
            - jobs[job].time_on(&fastest, cluster, speeds);
        if saved > restart_pause_seconds {
            placed[job].clear();
        }
    }
}

/// The GPUs of `held` no job has been placed on, in `held`'s order.
fn free_gpus(held: &[GpuIndex], placed: &[Vec<GpuIndex>]) -> Vec<GpuIndex> {
    let taken: BTreeSet<GpuIndex> = placed.iter().flatten().copied().collect();
    held.iter()
        .copied()
        .filter(|gpu| !taken.contains(gpu))
        .collect()
}

/// T_cluster with hindsight, for the report: the app's phases as they will actually run (the
/// survivors its job quality picks, not the engine's median-job estimate), holding every GPU
/// of the cluster, under the engine's job model ([`PhasePlan::time_on`]).
pub fn hindsight_cluster_time(
    app: &App,
    quality: &BTreeMap<String, f64>,
    cluster: &[GpuLocation],
    speeds: &GpuSpeeds,
    restart_pause_seconds: f64,
) -> f64 {
    let mut app = app.clone();
    let mut phases = Vec::new();
    loop {
        phases.push(app.running_jobs());
        let AppKind::SuccessiveHalving(search) = &mut app.kind else {
            break;
        };
        if search.current_phase + 1 >= search.phase_iterations.len() {
            break;
        }
        let phase_end: u64 = search
            .phase_iterations
            .iter()
            .take(search.current_phase + 1)
            .sum();
        for job in search.jobs.iter_mut().filter(|job| !job.stopped) {
            job.completed_iterations = job.completed_iterations.max(phase_end);
        }
        let names = survivors(search, quality);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        search.advance_phase(&names);
    }
    PhasePlan::new(phases, cluster.len()).time_on(cluster, speeds, restart_pause_seconds)
}

/// On a cluster of several GPU types, an app that declares no throughput table runs at its
/// model's measured speeds ([`models::throughput_of`]); on one type, speeds change nothing.
fn with_default_throughput(entry: &mut WorkloadApp) {
    if entry.app.throughput().is_empty() {
        *entry.app.throughput_mut() = models::throughput_of(&entry.model);
    }
}

/// On a cluster that gives CPUs or memory, an app that declares no profile has its model's
/// ([`models::resource_profile_of`]); elsewhere profiles change nothing.
fn with_default_resource_profile(entry: &mut WorkloadApp) {
    if entry.app.sensitivity().is_empty() {
        *entry.app.sensitivity_mut() = models::resource_profile_of(&entry.model);
    }
}

/// The speed of a job on `gpus`: that of the slowest of them.
fn slowest_speed(speeds: &GpuSpeeds, cluster: &Cluster, gpus: &[GpuIndex]) -> f64 {
    speeds.slowest(gpus.iter().map(|&gpu| cluster.location(gpu)))
}

/// The jobs a successive-halving search keeps for its next phase: the best by quality (ties by
/// job id), as many as the next phase runs.
fn survivors(search: &SuccessiveHalving, quality: &BTreeMap<String, f64>) -> Vec<String> {
    let keep = search
        .jobs_per_phase
        .get(search.current_phase + 1)
        .copied()
        .unwrap_or(0) as usize;
    let mut running: Vec<&Job> = search.jobs.iter().filter(|job| !job.stopped).collect();
    let score = |job: &Job| quality.get(&job.id).copied().unwrap_or(0.0);
    running.sort_by(|a, b| score(b).total_cmp(&score(a)).then(a.id.cmp(&b.id)));
    running
        .into_iter()
        .take(keep)
        .map(|job| job.id.clone())
        .collect()
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
        AppKind::SingleJob { job, .. } => Box::new(std::iter::once(job)),
        AppKind::SuccessiveHalving(search) => Box::new(search.jobs.iter()),
        AppKind::PerformanceCurve(search) => Box::new(search.jobs.iter().map(|curve| &curve.job)),
    }
}

fn all_jobs_mut(app: &mut App) -> Box<dyn Iterator<Item = &mut Job> + '_> {
    match &mut app.kind {
        AppKind::SingleJob { job, .. } => Box::new(std::iter::once(job)),
        AppKind::SuccessiveHalving(search) => Box::new(search.jobs.iter_mut()),
        AppKind::PerformanceCurve(search) => {
            Box::new(search.jobs.iter_mut().map(|curve| &mut curve.job))
        }
    }
}

/// The phase a successive-halving app is in (0 for other apps).
fn current_phase(app: &App) -> usize {
    match &app.kind {
        AppKind::SuccessiveHalving(search) => search.current_phase,
        _ => 0,
    }
}

/// The iteration a job runs to now: its total, its phase's end, or its predicted stop.
/// Where the job's current step of constant speed ends: its target, or its next speed change
/// before that.
fn next_stop(app: &App, job: &Job, completed: f64) -> f64 {
    let target = target_iterations(app, job);
    job.next_speed_change(completed)
        .map_or(target, |at| target.min(at as f64))
}

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

#[cfg(test)]
mod tests {
    use agora_market::throughput::Throughput;
    use agora_market::topology::{Gpu, GpuId};

    use super::*;

    /// GPU 0 of `first` in slot 0 on machine 0, GPU 1 of `second` in slot 1 on `machine`.
    fn two_gpus(first: &str, second: &str, machine: u32) -> Cluster {
        let gpu = |id: &str, gpu_type: &str, machine: u32, slot: u32| Gpu {
            id: GpuId::from(id),
            gpu_type: gpu_type.to_owned(),
            location: GpuLocation {
                rack: 0,
                machine,
                slot,
            },
        };
        Cluster::new(vec![gpu("g0", first, 0, 0), gpu("g1", second, machine, 1)])
            .expect("valid cluster")
    }

    /// Where one job of `work` K80-seconds on one GPU goes, kept on GPU 1 while GPU 0 stands
    /// free.
    fn placed(work: f64, cluster: &Cluster, speeds: &GpuSpeeds) -> Vec<Vec<GpuIndex>> {
        let job = JobPlacement {
            work,
            max_gpus: 1,
            slowdown: PlacementSlowdown::NONE,
            current: vec![GpuIndex(1)],
            may_resize: false,
        };
        place_jobs(&[job], &[GpuIndex(0), GpuIndex(1)], cluster, speeds, 35.0)
    }

    /// A V100 (GPU 0) and a K80 (GPU 1). 4x faster on the V100: 1000 s of work saves 750 s
    /// there, far more than the 35 s pause, so the job moves; 40 s of work saves 30 s, less
    /// than the pause, so it stays. On one speed nothing is saved and nothing moves.
    #[test]
    fn a_job_moves_to_a_faster_free_gpu_of_its_app_only_when_that_beats_the_pause() {
        let cluster = two_gpus("v100", "k80", 0);
        let speeds = |v100: f64| {
            let table = Throughput([("k80".to_owned(), 1.0), ("v100".to_owned(), v100)].into());
            GpuSpeeds::of(&table, &cluster)
        };
        assert_eq!(
            placed(1000.0, &cluster, &speeds(4.0)),
            vec![vec![GpuIndex(0)]]
        );
        assert_eq!(
            placed(40.0, &cluster, &speeds(4.0)),
            vec![vec![GpuIndex(1)]]
        );
        assert_eq!(
            placed(1000.0, &cluster, &speeds(1.0)),
            vec![vec![GpuIndex(1)]]
        );
    }

    /// Two V100s on two machines, the app 4x slower on machine 1 (its CPU share there): the
    /// share follows the GPUs, so the job is not moved for it.
    #[test]
    fn a_job_does_not_move_for_a_cpu_share_on_its_own_gpu_type() {
        let cluster = two_gpus("v100", "v100", 1);
        let speeds = GpuSpeeds::UNIFORM
            .scaled_per_machine(&cluster, |machine| [1.0, 0.25][machine as usize]);
        assert_eq!(placed(1000.0, &cluster, &speeds), vec![vec![GpuIndex(1)]]);
    }
}
