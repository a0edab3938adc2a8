//! The naive proportional-fair MILP that both benchmarks time beside the engine, in the same
//! run, so that a ratio to it holds on a noisy machine; it doubles as an oracle for the
//! engine's PF choice.
//!
//! It is what a first implementation would write: one binary column per eligible bid entry,
//! one row per app and one per class of interchangeable GPUs (its capacity: the class's GPUs
//! offered; without topology, as in the auction benchmark, every GPU is its own class, so this
//! is a row per GPU), the lexicographic objective (starving apps served first,
//! then the sum of log-valuations) as one tiered weight, HiGHS with its default settings and
//! `mip_rel_gap = 1e-9`, one thread, and a time limit (bundles drawn anywhere make programs no
//! solver finishes in minutes). It computes the PF choice only, no payment.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::time::Duration;

use agora_market::app::AppId;
use agora_market::auction::{AppBid, BidEntry, Offer};
use agora_market::topology::GpuId;
use highs::{HighsModelStatus, RowProblem, Sense};

/// Each app's chosen entry (`None`: nothing).
pub type PfChoice = BTreeMap<AppId, Option<usize>>;

/// (starving apps served, sum of gains) of a choice of entries: the PF objective.
fn pf_objective(bids: &[AppBid], chosen: &PfChoice) -> (usize, f64) {
    let mut served = 0;
    let mut welfare = 0.0;
    for bid in bids {
        if let Some(entry) = chosen[&bid.app] {
            served += usize::from(bid.rho_old.is_none());
            welfare += gain(bid, entry);
        }
    }
    (served, welfare)
}

/// An entry's log-valuation, less that of what the app holds when it holds GPUs.
fn gain(bid: &AppBid, entry: usize) -> f64 {
    let log_valuation = bid.bids[entry].rho.log_valuation();
    bid.rho_old.map_or(log_valuation, |rho_old| {
        log_valuation - rho_old.log_valuation()
    })
}

/// The naive MILP's PF choice, or `None` when it did not prove an optimum within `time_limit`.
pub fn naive_pf(offer: &Offer, bids: &[AppBid], time_limit: Duration) -> Option<PfChoice> {
    let eligible = |bid: &AppBid, entry: &BidEntry| {
        bid.rho_old
            .is_none_or(|rho_old| entry.rho.get() < rho_old.get())
    };
    let largest_gains: f64 = bids
        .iter()
        .map(|bid| {
            (0..bid.bids.len())
                .map(|entry| gain(bid, entry).abs())
                .fold(0.0, f64::max)
        })
        .sum();
    let tier = 2.0 * largest_gains + 1.0;
    let class_of: BTreeMap<&GpuId, u32> = offer
        .gpus
        .iter()
        .map(|gpu| (&gpu.id, gpu.interchange_class))
        .collect();
    let mut capacity: BTreeMap<u32, f64> = BTreeMap::new();
    for gpu in &offer.gpus {
        *capacity.entry(gpu.interchange_class).or_default() += 1.0;
    }
    let mut problem = RowProblem::default();
    let mut columns = Vec::new();
    let mut per_app = vec![Vec::new(); bids.len()];
    let mut per_class: BTreeMap<u32, Vec<_>> = BTreeMap::new();
    for (app, bid) in bids.iter().enumerate() {
        for (entry, bid_entry) in bid.bids.iter().enumerate() {
            if !eligible(bid, bid_entry) {
                continue;
            }
            let starving_bonus = if bid.rho_old.is_none() { tier } else { 0.0 };
            let column = problem.add_integer_column(starving_bonus + gain(bid, entry), 0..=1);
            per_app[app].push((column, 1.0));
            let mut counts: BTreeMap<u32, f64> = BTreeMap::new();
            for gpu in &bid_entry.gpus {
                *counts.entry(class_of[gpu]).or_default() += 1.0;
            }
            for (class, count) in counts {
                per_class.entry(class).or_default().push((column, count));
            }
            columns.push((app, entry));
        }
    }
    for row in per_app.iter().filter(|row| !row.is_empty()) {
        problem.add_row(..=1.0, row);
    }
    for (class, row) in &per_class {
        problem.add_row(..=capacity[class], row);
    }
    let mut model = problem.optimise(Sense::Maximise);
    model.make_quiet();
    model.set_threads(NonZeroU32::MIN);
    model.set_option("mip_rel_gap", 1e-9);
    model.set_option("time_limit", time_limit.as_secs_f64());
    let solved = model.solve();
    match solved.status() {
        HighsModelStatus::Optimal => {}
        HighsModelStatus::ReachedTimeLimit => return None,
        status => panic!("naive PF MILP ended with {status:?}"),
    }
    let mut chosen: PfChoice = bids.iter().map(|bid| (bid.app.clone(), None)).collect();
    for (&value, &(app, entry)) in solved.get_solution().columns().iter().zip(&columns) {
        if value > 0.5 {
            chosen.insert(bids[app].app.clone(), Some(entry));
        }
    }
    Some(chosen)
}

/// Checks the engine's PF choice against the naive MILP's optimum on `instance`: the same
/// objective when the engine proved its choice, never a better one when it kept the best found
/// within its node budget (`engine_fell_back`). For such a choice, returns how far below the
/// optimum it lies.
pub fn check_engine_choice(
    instance: &str,
    bids: &[AppBid],
    engine_choice: &PfChoice,
    engine_fell_back: bool,
    naive_choice: &PfChoice,
) -> Option<String> {
    let engine = pf_objective(bids, engine_choice);
    let naive = pf_objective(bids, naive_choice);
    if !engine_fell_back {
        assert_eq!(engine.0, naive.0, "{instance}: starving served");
        assert!(
            (engine.1 - naive.1).abs() <= 1e-6,
            "{instance}: PF welfare {} vs naive {}",
            engine.1,
            naive.1
        );
        return None;
    }
    assert!(
        engine.0 < naive.0 || (engine.0 == naive.0 && engine.1 <= naive.1 + 1e-6),
        "{instance}: the best found {engine:?} beats the optimum {naive:?}"
    );
    Some(if engine.0 < naive.0 {
        format!(
            "serves {} starving apps where the optimum serves {}",
            engine.0, naive.0
        )
    } else {
        format!(
            "log-welfare {:.3} against the optimum's {:.3}: the product of valuations {:.2}% \
             below the optimum's",
            engine.1,
            naive.1,
            100.0 * (1.0 - (engine.1 - naive.1).exp()),
        )
    })
}
