//! Seeded, steady-state market scenarios for the benchmarks.
//!
//! A scenario is a cluster, a population of Themis-like apps (hyper-parameter searches) and a
//! short simulation that brings the market to a contended steady state:
//!
//! - apps arrive at random over the first 10 minutes and a round runs every 2 minutes; leases
//!   last the default 10 minutes, and each tick 10% of the active leases end early (a job
//!   finished or was stopped by its HPO framework), so lease ends spread out over time;
//! - between rounds every app progresses at the speed its GPUs and their placement allow;
//!   successive-halving apps move to their next phase (keeping the fastest jobs) when a phase is
//!   done, and an app that finishes leaves and is replaced by a fresh one, so the number of
//!   active apps stays constant;
//! - after 20 minutes of simulated time, each of the next few ticks yields a snapshot: the
//!   leases due at that tick end, earliest first, then random leases are released until 25% of
//!   the GPUs are free. The measured round is the round of that tick, on a clone of the
//!   snapshot. (The warm-up is short because every warm-up round costs as much as a measured
//!   one, and the largest scenario must stay within the benchmark's time budget.)
//! - the 256- and 4096-GPU scenarios, whose targets BENCHMARKS.md checks, warm up several
//!   seeds and pool their snapshots, so that one tied optimum in one warm-up cannot move the
//!   whole set of measured rounds.

use agora_market::app::{App, AppId, AppKind, Job, PlacementSlowdown, SuccessiveHalving};
use agora_market::lease::LeaseId;
use agora_market::market::{Market, MarketConfig, RoundOffer};
use agora_market::time::Timestamp;
use agora_market::topology::{
    Cluster, ClusterSpec, GpuLocation, Locality, MachineSpec, RackSpec, SlotSpec,
};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// What a scenario is made of.
#[derive(Debug, Clone, Copy)]
pub struct ScenarioSpec {
    pub name: &'static str,
    pub gpus: u32,
    pub apps: usize,
    pub fairness_knob: f64,
    /// Market states (ticks) per seed that the measured rounds rotate through.
    pub snapshots: usize,
    /// Snapshots whose round is also timed phase by phase at the end of the run.
    pub breakdown_rounds: usize,
    /// One warm-up per seed, each an independent population of apps: a percentile over the
    /// snapshots of several warm-ups does not hang on how one simulation happened to go.
    pub seeds: &'static [u64],
}

pub const SCENARIOS: [ScenarioSpec; 4] = [
    ScenarioSpec {
        name: "64gpu_20apps",
        gpus: 64,
        apps: 20,
        fairness_knob: 0.8,
        snapshots: 8,
        breakdown_rounds: 8,
        seeds: &[64],
    },
    ScenarioSpec {
        name: "256gpu_100apps",
        gpus: 256,
        apps: 100,
        fairness_knob: 0.8,
        snapshots: 8,
        breakdown_rounds: 24,
        seeds: &[256, 257, 258],
    },
    ScenarioSpec {
        name: "1024gpu_400apps",
        gpus: 1024,
        apps: 400,
        fairness_knob: 0.8,
        snapshots: 4,
        breakdown_rounds: 2,
        seeds: &[1024],
    },
    ScenarioSpec {
        name: "4096gpu_1000apps",
        gpus: 4096,
        apps: 1000,
        fairness_knob: 0.8,
        snapshots: 2,
        breakdown_rounds: 4,
        seeds: &[4096, 4097],
    },
];

/// Seconds between rounds of the warm-up simulation.
const TICK_SECONDS: u64 = 120;
/// Initial apps arrive over this many seconds.
const ARRIVAL_WINDOW_SECONDS: f64 = 600.0;
/// Simulated time before the first snapshot.
const WARM_UP_SECONDS: u64 = 1200;
/// Probability that an active lease ends early at a tick.
const EARLY_RELEASE: f64 = 0.1;
/// Fraction of the cluster that is free when a measured round starts.
const FREE_FRACTION: f64 = 0.25;

/// A market state ready for a round at `now`.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub market: Market,
    pub now: Timestamp,
    /// The seed of the warm-up it comes from.
    pub seed: u64,
}

/// Sizes of what a snapshot's round works on, for the report.
#[derive(Debug, Clone, Copy, Default)]
pub struct SnapshotStats {
    pub free_gpus: usize,
    pub active_leases: usize,
    pub bidders: usize,
    pub bid_entries: usize,
}

#[derive(Debug)]
pub struct Scenario {
    pub spec: ScenarioSpec,
    pub snapshots: Vec<Snapshot>,
}

impl Scenario {
    pub fn build(spec: ScenarioSpec) -> Self {
        let snapshots = spec
            .seeds
            .iter()
            .flat_map(|&seed| warm_up(spec, seed))
            .collect();
        Self { spec, snapshots }
    }

    pub fn stats(&self) -> Vec<SnapshotStats> {
        self.snapshots
            .iter()
            .map(|snapshot| {
                let market = &snapshot.market;
                let offer = market.open_round(snapshot.now);
                let bid_entries = offer.as_ref().map_or(0, |offer| {
                    offer
                        .bidders
                        .iter()
                        .map(|app| market.agent_bid(offer, app).expect("bidder").bids.len())
                        .sum()
                });
                SnapshotStats {
                    free_gpus: market.free_gpus().len(),
                    active_leases: market.leases().active().count(),
                    bidders: offer.map_or(0, |offer| offer.bidders.len()),
                    bid_entries,
                }
            })
            .collect()
    }

    /// Every snapshot's opened round (the offer the agents bid on).
    pub fn offers(&self) -> Vec<(usize, RoundOffer)> {
        self.snapshots
            .iter()
            .enumerate()
            .map(|(index, snapshot)| {
                let offer = snapshot
                    .market
                    .open_round(snapshot.now)
                    .expect("a snapshot has free GPUs and bidders");
                (index, offer)
            })
            .collect()
    }
}

/// `spec.snapshots` market states of one warm-up simulation seeded with `seed`.
fn warm_up(spec: ScenarioSpec, seed: u64) -> Vec<Snapshot> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let cluster = cluster(spec.gpus);
    assert_eq!(cluster.len(), spec.gpus as usize, "cluster shape");
    let config = MarketConfig {
        fairness_knob: spec.fairness_knob,
        ..MarketConfig::default()
    };
    let mut market = Market::new(cluster, config, Timestamp(0)).expect("valid config");
    let mut arrivals: Vec<(f64, App)> = (0..spec.apps)
        .map(|n| {
            let at = rng.random_range(0.0..ARRIVAL_WINDOW_SECONDS);
            (at, random_app(&mut rng, format!("app{n:05}")))
        })
        .collect();
    arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut arrivals = arrivals.into_iter().peekable();
    let mut next_app = spec.apps;
    let mut snapshots = Vec::with_capacity(spec.snapshots);
    let mut tick = 0u64;
    loop {
        let seconds = tick * TICK_SECONDS;
        let now = Timestamp(seconds * 1000);
        if tick > 0 {
            let finished = progress(&mut market, TICK_SECONDS as f64, &mut rng);
            for app in finished {
                market.remove_app(&app, now).expect("active app");
                let replacement = random_app(&mut rng, format!("app{next_app:05}"));
                next_app += 1;
                market.add_app(replacement, now).expect("fresh id");
            }
        }
        while let Some((_, app)) = arrivals.next_if(|(at, _)| *at <= seconds as f64) {
            market.add_app(app, now).expect("fresh id");
        }
        if seconds >= WARM_UP_SECONDS {
            let mut snapshot = market.clone();
            free_a_quarter(&mut snapshot, now, &mut rng);
            snapshots.push(Snapshot {
                market: snapshot,
                now,
                seed,
            });
            if snapshots.len() == spec.snapshots {
                break;
            }
        }
        market.expire_leases(now);
        release_early(&mut market, now, &mut rng);
        if let Some(round) = market.run_round(now, tick) {
            round.expect("warm-up round");
        }
        tick += 1;
    }
    snapshots
}

/// The cluster of a scenario. 64 GPUs: 2 racks x 4 machines x 2 slots x 4 GPUs. Larger ones:
/// racks of 8 machines, 3 racks of 8-GPU machines (2 slots x 4) for every 2 racks of 4-GPU
/// machines (2 slots x 2), i.e. 256 GPUs per group of 5 racks.
pub fn cluster(gpus: u32) -> Cluster {
    let spec = if gpus == 64 {
        ClusterSpec::uniform(2, 4, 2, 4)
    } else {
        assert_eq!(gpus % 256, 0, "larger clusters come in groups of 256 GPUs");
        let rack = |gpus_per_slot: u32| RackSpec {
            machines: vec![
                MachineSpec::new(vec![
                    SlotSpec {
                        gpus: gpus_per_slot,
                        gpu_type: "v100".to_owned(),
                    };
                    2
                ]);
                8
            ],
        };
        let group = [rack(4), rack(2), rack(4), rack(2), rack(4)];
        ClusterSpec {
            racks: (0..gpus / 256).flat_map(|_| group.clone()).collect(),
        }
    };
    Cluster::from_spec(&spec).expect("valid spec")
}

/// Compute-bound models (ResNet-like) barely care where their GPUs are.
const COMPUTE_INTENSIVE: PlacementSlowdown = PlacementSlowdown {
    same_slot: 1.0,
    same_machine: 1.0,
    same_rack: 1.05,
    cross_rack: 1.1,
};

/// Communication-bound models (VGG/LSTM-like) slow down a lot across machines and racks.
const NETWORK_INTENSIVE: PlacementSlowdown = PlacementSlowdown {
    same_slot: 1.0,
    same_machine: 1.1,
    same_rack: 1.5,
    cross_rack: 2.0,
};

fn pick<T: Copy>(rng: &mut ChaCha8Rng, weighted: &[(T, f64)]) -> T {
    let total: f64 = weighted.iter().map(|(_, weight)| weight).sum();
    let mut draw = rng.random_range(0.0..total);
    for &(value, weight) in weighted {
        if draw < weight {
            return value;
        }
        draw -= weight;
    }
    weighted[weighted.len() - 1].0
}

/// An app drawn like Themis's workloads: 35% single jobs, 65% successive-halving searches of
/// 4, 8 or 16 jobs; 1-8 GPUs per job; serial iterations of 0.5-5 s; thousands of iterations;
/// half compute-intensive, half network-intensive models.
pub fn random_app(rng: &mut ChaCha8Rng, id: String) -> App {
    let max_gpus = pick(rng, &[(1u32, 0.3), (2, 0.3), (4, 0.25), (8, 0.15)]);
    let serial = rng.random_range(0.5..5.0);
    let slowdown = if rng.random_bool(0.5) {
        COMPUTE_INTENSIVE
    } else {
        NETWORK_INTENSIVE
    };
    let job = |name: String, total_iterations: u64, serial_iteration_time: f64| Job {
        id: name,
        total_iterations,
        completed_iterations: 0,
        serial_iteration_time,
        max_gpus,
        slowdown,
        stopped: false,
        speed_changes: Vec::new(),
    };
    let kind = if rng.random_bool(0.35) {
        let iterations = rng.random_range(1_000..10_000);
        AppKind::SingleJob {
            job: job(format!("{id}-job"), iterations, serial),
            throughput: Default::default(),
            sensitivity: Default::default(),
        }
    } else {
        let jobs = pick(rng, &[(4u32, 0.4), (8, 0.4), (16, 0.2)]);
        let phases = jobs.ilog2() as usize + 1;
        // Hyperband-style: each phase runs twice as long as the previous one, with half the jobs.
        let base: u64 = rng.random_range(100..600);
        let phase_iterations: Vec<u64> = (0..phases).map(|p| base << p).collect();
        let jobs_per_phase: Vec<u32> = (0..phases).map(|p| jobs >> p).collect();
        let total: u64 = phase_iterations.iter().sum();
        let jobs: Vec<Job> = (0..jobs)
            .map(|n| {
                job(
                    format!("{id}-j{n}"),
                    total,
                    serial * rng.random_range(0.85..1.15),
                )
            })
            .collect();
        let mut serials: Vec<f64> = jobs.iter().map(|job| job.serial_iteration_time).collect();
        serials.sort_by(f64::total_cmp);
        let median = serials[serials.len() / 2];
        let budget_gpu_seconds = phase_iterations
            .iter()
            .zip(&jobs_per_phase)
            .map(|(&iterations, &count)| iterations as f64 * f64::from(count) * median)
            .sum();
        AppKind::SuccessiveHalving(SuccessiveHalving {
            budget_gpu_seconds,
            phase_iterations,
            jobs_per_phase,
            max_gpus_per_phase: Vec::new(),
            current_phase: 0,
            jobs,
            throughput: Default::default(),
            sensitivity: Default::default(),
        })
    };
    App {
        id: AppId(id),
        kind,
    }
}

/// Advances every app by `seconds` of training on the GPUs it holds. Returns the apps that
/// finished.
fn progress(market: &mut Market, seconds: f64, rng: &mut ChaCha8Rng) -> Vec<AppId> {
    let held: Vec<(AppId, Vec<GpuLocation>)> = market
        .apps()
        .map(|app| {
            let mut locations: Vec<GpuLocation> = market
                .leases()
                .leases_of(&app.id)
                .flat_map(|lease| lease.gpus.iter().map(|&gpu| market.cluster().location(gpu)))
                .collect();
            locations.sort_unstable();
            (app.id.clone(), locations)
        })
        .collect();
    let mut finished = Vec::new();
    for (id, gpus) in held {
        let app = market.app_mut(&id).expect("active app");
        match &mut app.kind {
            AppKind::SingleJob { job, .. } => {
                let total = job.total_iterations;
                train(&mut [job], &gpus, seconds, |_| total);
            }
            AppKind::SuccessiveHalving(search) => {
                let phase_end: u64 = search
                    .phase_iterations
                    .iter()
                    .take(search.current_phase + 1)
                    .sum();
                let mut running: Vec<&mut Job> = search
                    .jobs
                    .iter_mut()
                    .filter(|job| !job.stopped && job.completed_iterations < phase_end)
                    .collect();
                train(&mut running, &gpus, seconds, |_| phase_end);
                if running
                    .iter()
                    .all(|job| job.completed_iterations >= phase_end)
                {
                    advance(search, rng);
                }
            }
            AppKind::PerformanceCurve(_) => {}
        }
        if app.is_finished() {
            finished.push(id);
        }
    }
    finished
}

/// Splits `gpus` among `jobs` as the engine's estimate does (evenly, in topology order, at most
/// each job's demand; one GPU each for the first jobs when there are fewer GPUs than jobs) and
/// runs them for `seconds`.
fn train(jobs: &mut [&mut Job], gpus: &[GpuLocation], seconds: f64, end: impl Fn(&Job) -> u64) {
    if jobs.is_empty() || gpus.is_empty() {
        return;
    }
    let (base, extra) = (gpus.len() / jobs.len(), gpus.len() % jobs.len());
    let mut next = 0;
    for (rank, job) in jobs.iter_mut().enumerate() {
        let share = (base + usize::from(rank < extra)).min(gpus.len() - next);
        let used = share.min(job.max_gpus as usize);
        if used == 0 {
            continue;
        }
        let locality = Locality::of(gpus[next..next + used].iter().copied());
        next += share;
        let rate = used as f64 / (job.serial_iteration_time * job.slowdown.at(locality));
        let done = (rate * seconds) as u64;
        job.completed_iterations = (job.completed_iterations + done).min(end(job));
    }
}

/// Ends the current phase of a search, keeping the fastest jobs (with a little noise) for the
/// next one.
fn advance(search: &mut SuccessiveHalving, rng: &mut ChaCha8Rng) {
    let next = search.current_phase + 1;
    let keep = search.jobs_per_phase.get(next).copied().unwrap_or(0) as usize;
    let mut alive: Vec<(f64, String)> = search
        .jobs
        .iter()
        .filter(|job| !job.stopped)
        .map(|job| {
            (
                job.serial_iteration_time * rng.random_range(0.9..1.1),
                job.id.clone(),
            )
        })
        .collect();
    alive.sort_by(|a, b| a.0.total_cmp(&b.0));
    let survivors: Vec<&str> = alive.iter().take(keep).map(|(_, id)| id.as_str()).collect();
    search.advance_phase(&survivors);
}

/// Ends each active lease with probability [`EARLY_RELEASE`].
fn release_early(market: &mut Market, now: Timestamp, rng: &mut ChaCha8Rng) {
    let leases: Vec<LeaseId> = market.leases().active().map(|lease| lease.id).collect();
    for lease in leases {
        if rng.random_bool(EARLY_RELEASE) {
            market.release_lease(lease, now).expect("active lease");
        }
    }
}

/// Ends leases until a quarter of the cluster is free: those due by `now` first (earliest
/// first), then random ones (jobs finishing or stopped early).
fn free_a_quarter(market: &mut Market, now: Timestamp, rng: &mut ChaCha8Rng) {
    let target = (market.cluster().len() as f64 * FREE_FRACTION).ceil() as usize;
    let mut free = market.free_gpus().len();
    let mut due: Vec<(Timestamp, LeaseId)> = Vec::new();
    let mut others: Vec<LeaseId> = Vec::new();
    for lease in market.leases().active() {
        if lease.end <= now {
            due.push((lease.end, lease.id));
        } else {
            others.push(lease.id);
        }
    }
    due.sort_unstable();
    others.shuffle(rng);
    for lease in due.into_iter().map(|(_, id)| id).chain(others) {
        if free >= target {
            break;
        }
        free += market
            .release_lease(lease, now)
            .expect("active lease")
            .gpus
            .len();
    }
}

/// p50, p95 and max of `samples` in the order `compare` gives, nearest-rank.
pub fn percentiles<T: Copy>(
    samples: &mut [T],
    compare: impl FnMut(&T, &T) -> std::cmp::Ordering,
) -> Option<(T, T, T)> {
    let last = samples.len().checked_sub(1)?;
    samples.sort_unstable_by(compare);
    let rank = |p: f64| {
        let index = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[index]
    };
    Some((rank(0.50), rank(0.95), samples[last]))
}
