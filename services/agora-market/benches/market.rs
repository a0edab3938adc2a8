//! Performance of a market round and of bid generation on seeded, contended, steady-state
//! scenarios (see `scenario/mod.rs` and BENCHMARKS.md at the repository root).
//!
//! - `round/<scenario>`: `Market::run_round` on a clone of a prepared market (the clone is made
//!   outside the timed region), rotating through the scenario's snapshots with a new seed each
//!   round: sorting by rho, bids of the worst ceil((1-f)N) apps, the HiGHS auction with
//!   payments, leftovers and leases.
//! - `bid/<scenario>`: `Market::agent_bid` for one bidder of an opened round, rotating through
//!   every bidder of every snapshot.
//!
//! Every individual timing is recorded; at the end of the run the p50/p95/max of each benchmark,
//! a breakdown of one round per snapshot into its phases and the phases' p50/p95/max over the
//! snapshots are printed and written to `target/criterion/percentiles.txt`.
//!
//! Run with `cargo bench -p agora-market --bench market` (add a filter such as `-- 256gpu` to run
//! one scenario).

mod naive;
mod scenario;

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agora_market::auction::{Auction, Offer};
use agora_market::market::{AuctionRecord, Market, RoundOutcome};
use criterion::{Criterion, SamplingMode};

use naive::{check_engine_choice, naive_pf};
use scenario::{percentiles, Scenario, ScenarioSpec, SCENARIOS};

/// How long the naive PF MILP may run on one round's auction before the breakdown gives up on
/// it (it has no ratio then).
const NAIVE_TIME_LIMIT: Duration = Duration::from_secs(30);

/// Every timing of every benchmark that ran, by benchmark id.
static TIMINGS: Mutex<BTreeMap<String, Vec<Duration>>> = Mutex::new(BTreeMap::new());

/// Scenarios that ran, with what their rounds work on and a per-phase breakdown.
static REPORTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn record(id: &str, samples: Vec<Duration>) {
    TIMINGS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .entry(id.to_owned())
        .or_default()
        .extend(samples);
}

/// Criterion settings per scenario: (samples, measurement time). Few samples for the large
/// ones so that the whole run stays within about ten minutes on two cores.
fn settings(spec: &ScenarioSpec) -> (usize, Duration, Duration) {
    match spec.gpus {
        0..=64 => (20, Duration::from_secs(4), Duration::from_secs(1)),
        65..=256 => (20, Duration::from_secs(10), Duration::from_secs(1)),
        257..=1024 => (10, Duration::from_secs(30), Duration::from_secs(1)),
        // A round takes seconds here: one round per sample, the minimum criterion allows.
        _ => (10, Duration::from_secs(60), Duration::from_secs(1)),
    }
}

fn bench_scenario(c: &mut Criterion, spec: ScenarioSpec) {
    let (samples, measurement, warm_up) = settings(&spec);
    // Built on first use, so that a filtered-out scenario costs nothing.
    let scenario: OnceCell<Scenario> = OnceCell::new();
    let prepared = || {
        scenario.get_or_init(|| {
            let started = Instant::now();
            let built = Scenario::build(spec);
            eprintln!(
                "prepared {} ({} snapshots) in {:.1} s",
                spec.name,
                built.snapshots.len(),
                started.elapsed().as_secs_f64()
            );
            built
        })
    };

    let mut group = c.benchmark_group("round");
    group
        .sample_size(samples)
        .measurement_time(measurement)
        .warm_up_time(warm_up)
        .sampling_mode(SamplingMode::Flat);
    let round_id = format!("round/{}", spec.name);
    group.bench_function(spec.name, |b| {
        let scenario = prepared();
        let mut seed = 0u64;
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut timings = Vec::with_capacity(iters as usize);
            for _ in 0..iters {
                let snapshot = &scenario.snapshots[seed as usize % scenario.snapshots.len()];
                let mut market = snapshot.market.clone();
                let started = Instant::now();
                let outcome = market.run_round(black_box(snapshot.now), black_box(seed));
                let elapsed = started.elapsed();
                let outcome = outcome
                    .expect("free GPUs and bidders")
                    .expect("valid round");
                drop(black_box(outcome));
                drop(market);
                total += elapsed;
                timings.push(elapsed);
                seed += 1;
            }
            record(&round_id, timings);
            total
        });
    });
    group.finish();

    let mut group = c.benchmark_group("bid");
    group
        .sample_size(samples.max(20))
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(warm_up)
        .sampling_mode(SamplingMode::Flat);
    let bid_id = format!("bid/{}", spec.name);
    group.bench_function(spec.name, |b| {
        let scenario = prepared();
        let offers = scenario.offers();
        let bidders: Vec<(&Market, &_, &_)> = offers
            .iter()
            .flat_map(|(index, offer)| {
                let market = &scenario.snapshots[*index].market;
                offer.bidders.iter().map(move |app| (market, offer, app))
            })
            .collect();
        let mut next = 0usize;
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut timings = Vec::with_capacity(iters as usize);
            for _ in 0..iters {
                let (market, offer, app) = bidders[next % bidders.len()];
                let started = Instant::now();
                let bid = market.agent_bid(black_box(offer), black_box(app));
                let elapsed = started.elapsed();
                drop(black_box(bid.expect("a bidder")));
                total += elapsed;
                timings.push(elapsed);
                next += 1;
            }
            record(&bid_id, timings);
            total
        });
    });
    group.finish();

    if let Some(scenario) = scenario.get() {
        let report = breakdown(scenario);
        REPORTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(report);
    }
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// One round per snapshot, split into its phases: cloning the market (not part of the measured
/// round), opening the round (rho of every app, sort, offer and placement index), every bidder's
/// bid, and closing the round with those bids (validation, the auction: PF program, payments
/// and settling; leftovers; leases). The auction is nearly all of closing: leftovers and leases
/// take well under a millisecond even at 4096 GPUs. Beside each round, the naive PF MILP of the
/// round's own auction (`naive/mod.rs`) is timed and checked against the engine's PF choice:
/// the round's latency as a multiple of that one solve holds on a noisy machine, where the
/// latency alone does not.
///
/// Not inlined, so that a profiler can single it out (`valgrind --tool=callgrind
/// --toggle-collect=market::breakdown`): its rounds are deterministic.
#[inline(never)]
fn breakdown(scenario: &Scenario) -> String {
    let mut text = String::new();
    let spec = scenario.spec;
    let stats = scenario.stats();
    let _ = writeln!(
        text,
        "{}: {} GPUs, {} apps, f = {}, {} snapshots ({} broken down)",
        spec.name,
        spec.gpus,
        spec.apps,
        spec.fairness_knob,
        scenario.snapshots.len(),
        spec.breakdown_rounds.min(scenario.snapshots.len())
    );
    let rounds = scenario
        .snapshots
        .iter()
        .zip(&stats)
        .take(spec.breakdown_rounds);
    let mut phases = PhaseTimes::default();
    for (index, (snapshot, stats)) in rounds.enumerate() {
        let started = Instant::now();
        let mut market = snapshot.market.clone();
        let clone = started.elapsed();

        let started = Instant::now();
        let round = market.open_round(snapshot.now).expect("an offer");
        let open = started.elapsed();

        let started = Instant::now();
        let bids = market.agent_bids(&round).expect("every bidder");
        let bidding = started.elapsed();

        let started = Instant::now();
        let outcome = market.close_round(round, bids, 7).expect("valid round");
        let close = started.elapsed();
        let record = outcome
            .auction
            .as_ref()
            .expect("a Themis round runs the auction");
        let auction = &record.outcome;
        let pf_winners = auction
            .pf_gpus
            .values()
            .filter(|gpus| !gpus.is_empty())
            .count();
        let keepers = auction
            .allocation
            .values()
            .filter(|gpus| !gpus.is_empty())
            .count();
        let paying = auction.c.values().filter(|&&share| share < 1.0).count();
        let fallbacks = auction.payment_fallbacks.len();

        let _ = writeln!(
            text,
            "  snapshot {index} (seed {}, t = {} s): {} free GPUs offered, {} active leases, {} bidders, \
             {} bid entries; {pf_winners} PF winners, {paying} with c < 1 ({fallbacks} by the LP fallback), \
             {keepers} keep GPUs | \
             clone {:.2} ms, open_round {:.2} ms, bids {:.2} ms, close_round {:.2} ms",
            snapshot.seed,
            snapshot.now.0 / 1000,
            stats.free_gpus,
            stats.active_leases,
            stats.bidders,
            stats.bid_entries,
            millis(clone),
            millis(open),
            millis(bidding),
            millis(close),
        );
        let (line, times) = auction_phases(&outcome);
        let round = open + bidding + close;
        let instance = format!("{} snapshot {index}", spec.name);
        let naive = naive_reference(&instance, &outcome.offer, record, times.pf_fell_back);
        let _ = writeln!(text, "{line}, {}", naive.describe(round));
        phases.bids.push(bidding);
        phases.pf.push(times.pf);
        phases.payments.push(times.payments);
        phases.close.push(close);
        if let (Some(naive_time), Some(multiple)) = (naive.time, naive.multiple(round)) {
            phases.naive.push(naive_time);
            phases.round_per_naive.push(multiple);
        }
    }
    let _ = writeln!(
        text,
        "  over these snapshots, p50 / p95 / max: {}, {}, {}, {}, {}; round / naive PF {}",
        spread("bids", &mut phases.bids),
        spread("PF", &mut phases.pf),
        spread("payments", &mut phases.payments),
        spread("close_round", &mut phases.close),
        spread("naive PF MILP", &mut phases.naive),
        ratio_spread(&mut phases.round_per_naive),
    );
    text
}

/// The naive PF MILP of one round's auction: how long it took (`None`: not within
/// [`NAIVE_TIME_LIMIT`]) and, when the engine's choice is only the best found within its node
/// budget, how far below the optimum that choice lies.
struct NaiveReference {
    time: Option<Duration>,
    fallback_gap: Option<String>,
}

impl NaiveReference {
    /// `round` as a multiple of the naive PF MILP's time.
    fn multiple(&self, round: Duration) -> Option<f64> {
        self.time
            .map(|time| round.as_secs_f64() / time.as_secs_f64())
    }

    fn describe(&self, round: Duration) -> String {
        let gap = self
            .fallback_gap
            .as_ref()
            .map_or_else(String::new, |gap| format!("; the PF choice kept: {gap}"));
        match (self.time, self.multiple(round)) {
            (Some(time), Some(multiple)) => format!(
                "naive PF MILP {:.2} ms (round {multiple:.2}x){gap}",
                millis(time)
            ),
            _ => format!("naive PF MILP > {} s", NAIVE_TIME_LIMIT.as_secs()),
        }
    }
}

/// Times the naive PF MILP on the round's offer and bids and checks the engine's PF choice
/// against its optimum (see `naive::check_engine_choice`); `pf_fell_back` as in
/// [`AuctionTimes`].
fn naive_reference(
    instance: &str,
    offer: &Offer,
    record: &AuctionRecord,
    pf_fell_back: bool,
) -> NaiveReference {
    let started = Instant::now();
    let choice = naive_pf(offer, &record.bids, NAIVE_TIME_LIMIT);
    let time = started.elapsed();
    let Some(choice) = choice else {
        return NaiveReference {
            time: None,
            fallback_gap: None,
        };
    };
    let engine = &record.outcome.pf;
    let fallback_gap = check_engine_choice(instance, &record.bids, engine, pf_fell_back, &choice);
    NaiveReference {
        time: Some(time),
        fallback_gap,
    }
}

/// The broken-down rounds' phase times, one entry per snapshot.
#[derive(Default)]
struct PhaseTimes {
    bids: Vec<Duration>,
    pf: Vec<Duration>,
    payments: Vec<Duration>,
    close: Vec<Duration>,
    /// The naive PF MILP of each round's auction that finished within its time limit.
    naive: Vec<Duration>,
    /// Each such round's latency (open, bids and close) over its naive PF MILP's time.
    round_per_naive: Vec<f64>,
}

/// The round's auction re-run phase by phase (its bids and offer, the same seed): how long
/// the PF choice, the payments and settling take, and how each was found.
fn auction_phases(outcome: &RoundOutcome) -> (String, AuctionTimes) {
    let record = outcome
        .auction
        .as_ref()
        .expect("a Themis round runs the auction");
    let auction = Auction::new(&outcome.offer, &record.bids).expect("the round's own bids");
    let started = Instant::now();
    let pf = auction.proportional_fair().expect("solved");
    let pf_time = started.elapsed();
    let started = Instant::now();
    let payments = auction.payments(&pf, outcome.seed).expect("solved");
    let payments_time = started.elapsed();
    let started = Instant::now();
    drop(black_box(auction.settle(&pf, &payments)));
    let settle_time = started.elapsed();
    let (pf_stats, paid) = (pf.stats(), payments.stats());
    let line = format!(
        "    auction: PF {:.2} ms ({} components: {} alone, {} by LP, {} by branch and bound), \
         payments {:.2} ms ({} payers: {} certified, {} solved, {} fallbacks; {} programs), \
         settle {:.2} ms",
        millis(pf_time),
        pf_stats.components,
        pf_stats.alone,
        pf_stats.by_relaxation,
        pf_stats.by_branch_and_bound,
        millis(payments_time),
        paid.payers,
        paid.certified,
        paid.solved,
        paid.fallbacks,
        paid.programs,
        millis(settle_time),
    );
    let times = AuctionTimes {
        pf: pf_time,
        payments: payments_time,
        pf_fell_back: pf_stats.fallbacks > 0,
    };
    (line, times)
}

/// How long one auction's PF choice and payments took, and whether the PF choice is proved.
struct AuctionTimes {
    pf: Duration,
    payments: Duration,
    /// Whether a component's PF choice is only the best found within its node budget.
    pf_fell_back: bool,
}

/// `label p50 / p95 / max ms` of `samples`.
fn spread(label: &str, samples: &mut [Duration]) -> String {
    percentiles(samples, Duration::cmp).map_or_else(String::new, |(p50, p95, max)| {
        format!(
            "{label} {:.1} / {:.1} / {:.1} ms",
            millis(p50),
            millis(p95),
            millis(max)
        )
    })
}

/// `p50 / p95 / max` of ratios.
fn ratio_spread(ratios: &mut [f64]) -> String {
    percentiles(ratios, f64::total_cmp).map_or_else(
        || "-".to_owned(),
        |(p50, p95, max)| format!("{p50:.2}x / {p95:.2}x / {max:.2}x"),
    )
}

fn percentile_report() -> String {
    let mut text = String::from(
        "Per-call timings recorded by the benchmarks (warm-up iterations included), nearest-rank\n\
         percentiles.\n\n",
    );
    let _ = writeln!(
        text,
        "{:<28} {:>8} {:>12} {:>12} {:>12}",
        "benchmark", "calls", "p50 (ms)", "p95 (ms)", "max (ms)"
    );
    let mut timings = TIMINGS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for (id, samples) in timings.iter_mut() {
        let calls = samples.len();
        if let Some((p50, p95, max)) = percentiles(samples, Duration::cmp) {
            let _ = writeln!(
                text,
                "{id:<28} {calls:>8} {:>12.3} {:>12.3} {:>12.3}",
                millis(p50),
                millis(p95),
                millis(max)
            );
        }
    }
    let reports = REPORTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if !reports.is_empty() {
        text.push_str("\nOne round per snapshot, by phase:\n");
        for report in reports.iter() {
            text.push_str(report);
        }
    }
    text
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    for spec in SCENARIOS {
        bench_scenario(&mut criterion, spec);
    }
    criterion.final_summary();
    if TIMINGS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .is_empty()
    {
        return;
    }
    let report = percentile_report();
    println!("\n{report}");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let path = target.join("criterion").join("percentiles.txt");
    let written = std::fs::create_dir_all(path.parent().unwrap_or(&target))
        .and_then(|()| std::fs::write(&path, &report));
    match written {
        Ok(()) => println!("written to {}", path.display()),
        Err(error) => eprintln!("could not write {}: {error}", path.display()),
    }
}
