//! The auction alone, on instance families the round benchmark does not produce, each instance
//! timed next to ONE naive proportional-fair MILP of the same instance in the same run.
//!
//! Families (256 GPUs on 32 machines of 8, no topology: each GPU is its own class, as in
//! `agora auction solve`'s JSON; 10 to 100 apps, two seeds each):
//! - `aligned`: 20 machine-aligned bundles of 1, 2, 4 or 8 GPUs per app, 30% of apps starving;
//! - `starving`: the same bundles, every app starving;
//! - `random`: 20 bundles of 1 to 8 GPUs drawn anywhere (not aligned), 30% starving.
//!
//! The naive MILP (`naive/mod.rs`, the same one the round benchmark times) runs with a time
//! limit of [`NAIVE_TIME_LIMIT`]. Its optimum is also checked against the engine's PF objective,
//! so the benchmark doubles as an oracle: equal when the engine proved its choice, never better
//! when the engine's choice is only the best found within its node budget (`pf fb`,
//! docs/mechanism.md), in which case a line under the row says how far below the optimum that
//! choice lies.
//!
//! Run with `cargo bench -p agora-market --bench auction` (add a family name, e.g. `-- random`,
//! to run one family; `BENCH_APPS=40` runs one size).

mod naive;

use std::hint::black_box;
use std::time::{Duration, Instant};

use agora_market::app::AppId;
use agora_market::auction::{AppBid, Auction, AuctionOutcome, BidEntry, Offer};
use agora_market::rho::Rho;
use agora_market::topology::GpuId;
use rand::seq::IndexedRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use naive::{check_engine_choice, naive_pf};

const MACHINES: usize = 32;
const GPUS_PER_MACHINE: usize = 8;
const BIDS_PER_APP: usize = 20;
const APP_COUNTS: [usize; 10] = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100];
const SEEDS: [u64; 2] = [1, 2];
/// Each instance is solved this many times by each side; the median is reported. Once: the
/// largest instances take seconds.
const REPEATS: usize = 1;
/// How long the naive MILP may run on one instance; an instance it does not finish in that time
/// has no ratio.
const NAIVE_TIME_LIMIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Family {
    Aligned,
    Starving,
    Random,
}

impl Family {
    const ALL: [Self; 3] = [Self::Aligned, Self::Starving, Self::Random];

    fn name(self) -> &'static str {
        match self {
            Self::Aligned => "aligned",
            Self::Starving => "starving",
            Self::Random => "random",
        }
    }

    fn starving_fraction(self) -> f64 {
        match self {
            Self::Starving => 1.0,
            Self::Aligned | Self::Random => 0.3,
        }
    }

    fn bundle(self, all_gpus: &[GpuId], rng: &mut ChaCha8Rng) -> Vec<GpuId> {
        match self {
            Self::Aligned | Self::Starving => {
                let size = [1, 2, 4, 8][rng.random_range(0..4)];
                let machine = rng.random_range(0..MACHINES);
                let offset = size * rng.random_range(0..GPUS_PER_MACHINE / size);
                let first = machine * GPUS_PER_MACHINE + offset;
                all_gpus[first..first + size].to_vec()
            }
            Self::Random => {
                let size = rng.random_range(1..=8);
                all_gpus.sample(rng, size).cloned().collect()
            }
        }
    }

    /// An instance: apps value a bundle by its size (rho = rho_1 / k^s, s in [0.5, 1], with a
    /// placement jitter of up to 30%); apps that are not starving hold GPUs worth rho_old
    /// around rho_1, so some of their entries do not improve on it.
    fn instance(self, apps: usize, seed: u64) -> (Offer, Vec<AppBid>) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed * 1000 + apps as u64);
        let all_gpus: Vec<GpuId> = (0..MACHINES)
            .flat_map(|m| (0..GPUS_PER_MACHINE).map(move |g| GpuId(format!("m{m}g{g}"))))
            .collect();
        let rho = |value: f64| Rho::new(value).expect("positive and finite");
        let bids = (0..apps)
            .map(|index| {
                let rho_one = rng.random_range(2.0..20.0);
                let scaling = rng.random_range(0.5..1.0);
                let starving = rng.random::<f64>() < self.starving_fraction();
                let rho_old = (!starving).then(|| rho(rho_one * rng.random_range(0.6..1.5)));
                let bids = (0..BIDS_PER_APP)
                    .map(|_| {
                        let gpus = self.bundle(&all_gpus, &mut rng);
                        let size = gpus.len() as f64;
                        let jitter = rng.random_range(1.0..1.3);
                        BidEntry {
                            gpus,
                            rho: rho(rho_one / size.powf(scaling) * jitter),
                        }
                    })
                    .collect();
                AppBid {
                    app: AppId(format!("app{index}")),
                    rho_old,
                    bids,
                }
            })
            .collect();
        (Offer::without_topology(all_gpus), bids)
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// What one full solve did, for the table.
struct Work {
    /// The PF solve alone (the rest of the full solve is mostly payments).
    pf_time: Duration,
    /// Components whose PF program needed branch and bound.
    pf_by_branch_and_bound: usize,
    /// Components whose PF program ran out of its node budget.
    pf_fallbacks: usize,
    outcome: AuctionOutcome,
    winners: usize,
    certified: usize,
    solved: usize,
    fallbacks: usize,
    /// Branch-and-bound programs the payments ran.
    programs: usize,
}

fn full_solve(offer: &Offer, bids: &[AppBid], seed: u64) -> Work {
    let auction = Auction::new(offer, bids).expect("valid instance");
    let started = Instant::now();
    let pf = auction.proportional_fair().expect("PF solve");
    let pf_time = started.elapsed();
    let payments = auction.payments(&pf, seed).expect("payments");
    let outcome = auction.settle(&pf, &payments);
    let winners = outcome.pf.values().filter(|entry| entry.is_some()).count();
    let stats = payments.stats();
    Work {
        pf_time,
        pf_by_branch_and_bound: pf.stats().by_branch_and_bound,
        pf_fallbacks: pf.stats().fallbacks,
        outcome: black_box(outcome),
        winners,
        certified: stats.certified,
        solved: stats.solved,
        fallbacks: stats.fallbacks,
        programs: stats.programs,
    }
}

fn bench_family(family: Family) {
    println!(
        "\n{:<9} {:>4} {:>4} {:>10} {:>10} {:>6} {:>8} {:>5} {:>5} {:>7} {:>9} {:>7} {:>8} {:>8}",
        "family",
        "apps",
        "seed",
        "full (ms)",
        "naive (ms)",
        "ratio",
        "pf (ms)",
        "pf bb",
        "pf fb",
        "winners",
        "certified",
        "solved",
        "fallback",
        "programs"
    );
    let (mut full_sum, mut naive_sum) = (Duration::ZERO, Duration::ZERO);
    let mut worst_ratio: f64 = 0.0;
    let only: Option<usize> = std::env::var("BENCH_APPS")
        .ok()
        .and_then(|apps| apps.parse().ok());
    for apps in APP_COUNTS
        .into_iter()
        .filter(|a| only.is_none_or(|o| o == *a))
    {
        for seed in SEEDS {
            let (offer, bids) = family.instance(apps, seed);
            let mut work = None;
            let full = median(
                (0..REPEATS)
                    .map(|_| {
                        let started = Instant::now();
                        work = Some(full_solve(&offer, &bids, seed));
                        started.elapsed()
                    })
                    .collect(),
            );
            let mut naive_choice = None;
            let naive = median(
                (0..REPEATS)
                    .map(|_| {
                        let started = Instant::now();
                        naive_choice = Some(naive_pf(&offer, &bids, NAIVE_TIME_LIMIT));
                        started.elapsed()
                    })
                    .collect(),
            );
            let work = work.expect("solved");
            let naive_choice = naive_choice.expect("run");
            let instance = format!("{} {apps} apps seed {seed}", family.name());
            let fallback_gap = naive_choice.as_ref().and_then(|naive| {
                let fell_back = work.pf_fallbacks > 0;
                check_engine_choice(&instance, &bids, &work.outcome.pf, fell_back, naive)
            });
            let (naive, ratio) = if naive_choice.is_some() {
                let ratio = full.as_secs_f64() / naive.as_secs_f64();
                worst_ratio = worst_ratio.max(ratio);
                full_sum += full;
                naive_sum += naive;
                (format!("{:.2}", millis(naive)), format!("{ratio:.2}"))
            } else {
                let limit = format!(">{:.0}", millis(NAIVE_TIME_LIMIT));
                (limit, "-".to_owned())
            };
            println!(
                "{:<9} {apps:>4} {seed:>4} {:>10.2} {naive:>10} {ratio:>6} {:>8.2} {:>5} {:>5} {:>7} {:>9} {:>7} {:>8} {:>8}",
                family.name(),
                millis(full),
                millis(work.pf_time),
                work.pf_by_branch_and_bound,
                work.pf_fallbacks,
                work.winners,
                work.certified,
                work.solved,
                work.fallbacks,
                work.programs,
            );
            if let Some(gap) = fallback_gap {
                println!(
                    "{:<9}   the PF choice kept within the node budget: {gap}",
                    ""
                );
            }
        }
    }
    if naive_sum.is_zero() {
        println!(
            "{:<9} {:>9}   (the naive MILP finished no instance within {} s: no ratio)",
            family.name(),
            "sum",
            NAIVE_TIME_LIMIT.as_secs()
        );
        return;
    }
    println!(
        "{:<9} {:>9} {:>10.1} {:>10.1} {:>6.2}   (sum over the instances the naive MILP finished; worst ratio {worst_ratio:.2})",
        family.name(),
        "sum",
        millis(full_sum),
        millis(naive_sum),
        full_sum.as_secs_f64() / naive_sum.as_secs_f64(),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument selects families by name.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    for family in Family::ALL {
        if filters.is_empty() || filters.iter().any(|f| family.name().contains(f.as_str())) {
            bench_family(family);
        }
    }
}
