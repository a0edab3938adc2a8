//! The agent's bid generator against an exhaustive oracle on small offers.

use agora_market::app::{App, AppKind, PlacementSlowdown};
use agora_market::auction::Offer;
use agora_market::bids::{generate_bid, BidConfig, PreparedOffer};
use agora_market::fairness::{independent_finish_time, rho, FairnessContext};
use agora_market::throughput::GpuSpeeds;
use agora_market::time::Timestamp;
use agora_market::topology::{
    Cluster, ClusterSpec, GpuId, GpuIndex, GpuLocation, MachineSpec, RackSpec, SlotSpec,
};
use proptest::prelude::*;

use crate::support::single_job_app;

fn cluster_strategy() -> impl Strategy<Value = Cluster> {
    let slot = (1u32..=3).prop_map(|gpus| SlotSpec {
        gpus,
        gpu_type: "gpu".into(),
    });
    let machine = prop::collection::vec(slot, 1..=2).prop_map(MachineSpec::new);
    let rack = prop::collection::vec(machine, 1..=2).prop_map(|machines| RackSpec { machines });
    prop::collection::vec(rack, 1..=2)
        .prop_map(|racks| Cluster::from_spec(&ClusterSpec { racks }).expect("valid spec"))
        .prop_filter("small enough to enumerate", |cluster| cluster.len() <= 10)
}

fn context() -> FairnessContext {
    FairnessContext {
        now: Timestamp::from_secs_f64(100.0),
        arrival: Timestamp(0),
        cluster_seconds: 400.0,
        average_contention: 3.0,
        restart_pause_seconds: 35.0,
        speeds: GpuSpeeds::UNIFORM,
    }
}

/// Every subset of `items` of size `size`.
fn subsets(items: &[usize], size: usize) -> Vec<Vec<usize>> {
    if size == 0 {
        return vec![Vec::new()];
    }
    let Some((&first, rest)) = items.split_first() else {
        return Vec::new();
    };
    let mut with_first: Vec<Vec<usize>> = subsets(rest, size - 1)
        .into_iter()
        .map(|mut subset| {
            subset.insert(0, first);
            subset
        })
        .collect();
    with_first.extend(subsets(rest, size));
    with_first
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// For a single-job app, the best bundle of each size that the placement-driven generator
    /// finds is as good as the best of all subsets of that size, and sizes no better than a
    /// smaller one are left out.
    #[test]
    fn generator_finds_the_best_bundle_of_every_size(
        cluster in cluster_strategy(),
        held_mask in any::<u16>(),
        demand in 1u32..=6,
        rack_penalty in 1.0f64..2.0,
        machine_penalty in 1.0f64..1.5,
    ) {
        let mut app = single_job_app("a", demand, 1000, 2.0);
        let AppKind::SingleJob { job, .. } = &mut app.kind else { unreachable!() };
        job.slowdown = PlacementSlowdown {
            same_slot: 1.0,
            same_machine: machine_penalty,
            same_rack: machine_penalty * rack_penalty,
            cross_rack: machine_penalty * rack_penalty * 1.2,
        };
        let all: Vec<GpuIndex> = cluster.gpus().map(|(index, _)| index).collect();
        let (held, free): (Vec<GpuIndex>, Vec<GpuIndex>) =
            all.iter().partition(|gpu| held_mask & (1 << gpu.0) != 0 && gpu.0 < demand);
        let held_locations: Vec<GpuLocation> = held.iter().map(|&gpu| cluster.location(gpu)).collect();
        let offer = PreparedOffer::new(Offer::from_cluster(&cluster, &free));
        let context = context();
        let bid = generate_bid(&app, &held_locations, &[], &offer, &context, &BidConfig::default());

        prop_assert_eq!(bid.rho_old, rho(&app, &held_locations, &context));
        let unmet = (demand as usize).saturating_sub(held.len()).min(free.len());
        let positions: Vec<usize> = (0..free.len()).collect();
        let mut best_smaller = f64::INFINITY;
        for size in 1..=unmet {
            let best_possible = subsets(&positions, size)
                .into_iter()
                .filter_map(|subset| {
                    let mut gpus = held_locations.clone();
                    gpus.extend(subset.iter().map(|&p| cluster.location(free[p])));
                    rho(&app, &gpus, &context).map(|value| value.get())
                })
                .fold(f64::INFINITY, f64::min);
            let best_generated = bid.bids.iter().filter(|entry| entry.gpus.len() == size)
                .map(|entry| entry.rho.get()).fold(f64::INFINITY, f64::min);
            // A size is worth bidding for only if it beats rho_old and every smaller size.
            let improves = bid.rho_old.is_none_or(|old| best_possible < old.get())
                && best_possible < best_smaller;
            best_smaller = best_smaller.min(best_possible);
            if improves {
                prop_assert!((best_generated - best_possible).abs() < 1e-12,
                    "size {}: generated {} but {} is possible", size, best_generated, best_possible);
            } else {
                prop_assert!(best_generated.is_infinite(), "entries must improve on rho_old and on smaller bundles");
            }
        }
        for entry in &bid.bids {
            let mut gpus = held_locations.clone();
            for id in &entry.gpus {
                let index = cluster.index_of(id).expect("known gpu");
                prop_assert!(free.contains(&index), "bundles only use offered GPUs");
                gpus.push(cluster.location(index));
            }
            let mut distinct = entry.gpus.clone();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(distinct.len(), entry.gpus.len());
            prop_assert_eq!(Some(entry.rho), rho(&app, &gpus, &context));
        }
    }
}

#[test]
fn table_respects_the_cap_for_large_demands() {
    let cluster = Cluster::from_spec(&ClusterSpec::uniform(4, 8, 4, 2)).expect("valid spec");
    let free: Vec<GpuIndex> = cluster.gpus().map(|(index, _)| index).collect();
    let app: App = single_job_app("big", 200, 10_000, 1.0);
    let offer = PreparedOffer::new(Offer::from_cluster(&cluster, &free));
    let config = BidConfig {
        max_entries: 16,
        alternatives_per_level: 2,
    };
    let bid = generate_bid(&app, &[], &[], &offer, &context(), &config);
    assert!(bid.bids.len() <= 16 && !bid.bids.is_empty());
    assert_eq!(bid.rho_old, None, "an app holding nothing is starving");
    assert!(
        bid.bids.iter().any(|entry| entry.gpus.len() == 200),
        "the whole demand is bid for"
    );
}

/// An app whose lease on two GPUs of another machine just ended may move them next to the two
/// it still holds, once that machine has room: a job placed badly while GPUs were scarce is not
/// stuck there for the rest of its life. The move's rho counts the restart it costs.
#[test]
fn a_renewing_app_bids_to_move_next_to_what_it_holds() {
    let cluster = Cluster::from_spec(&ClusterSpec::uniform(1, 2, 1, 4)).expect("valid spec");
    let mut app = single_job_app("a", 4, 100_000, 1.0);
    let AppKind::SingleJob { job, .. } = &mut app.kind else {
        unreachable!()
    };
    job.slowdown = PlacementSlowdown {
        same_slot: 1.0,
        same_machine: 1.0,
        same_rack: 1.5,
        cross_rack: 3.0,
    };
    let gpu = |name: &str| cluster.index_of(&GpuId::from(name)).expect("named gpu");
    let held: Vec<GpuLocation> = ["m0-g0", "m0-g1"]
        .iter()
        .map(|name| cluster.location(gpu(name)))
        .collect();
    let claimed = [GpuId::from("m1-g0"), GpuId::from("m1-g1")];
    let free: Vec<GpuIndex> = ["m0-g2", "m0-g3", "m1-g0", "m1-g1", "m1-g2", "m1-g3"]
        .iter()
        .map(|name| gpu(name))
        .collect();
    let offer = PreparedOffer::new(Offer::from_cluster(&cluster, &free));
    let context = context();
    let bid = generate_bid(
        &app,
        &held,
        &claimed,
        &offer,
        &context,
        &BidConfig::default(),
    );

    let best_pair = bid
        .bids
        .iter()
        .filter(|entry| entry.gpus.len() == 2)
        .min_by(|a, b| a.rho.get().total_cmp(&b.rho.get()))
        .expect("a bid for two GPUs");
    let mut moved = best_pair.gpus.clone();
    moved.sort();
    assert_eq!(moved, [GpuId::from("m0-g2"), GpuId::from("m0-g3")]);
    let mut together = held.clone();
    together.extend(moved.iter().map(|id| cluster.location(gpu(&id.0))));
    let restart = context.restart_pause_seconds / independent_finish_time(&context);
    let expected = rho(&app, &together, &context).expect("GPUs held").get() + restart;
    assert!((best_pair.rho.get() - expected).abs() < 1e-12);
    let mut renewed = held.clone();
    renewed.extend(claimed.iter().map(|id| cluster.location(gpu(&id.0))));
    let renewing = rho(&app, &renewed, &context).expect("GPUs held").get();
    assert!(
        renewing > best_pair.rho.get(),
        "the move pays for its restart"
    );
}
