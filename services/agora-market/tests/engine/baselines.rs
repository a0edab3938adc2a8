//! The §6.1 baselines on tiny clusters where each policy's metric decides who gets what.

use std::time::Duration;

use agora_market::app::{AppId, AppKind, PlacementSlowdown};
use agora_market::market::{Market, MarketConfig};
use agora_market::policy::Policy;
use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, ClusterSpec, Locality, MachineSpec, RackSpec, SlotSpec};

use crate::support::{single_job_app, uniform_cluster};

fn market(cluster: Cluster, policy: Policy) -> Market {
    let config = MarketConfig {
        policy,
        lease_length: Duration::from_secs(600),
        ..MarketConfig::default()
    };
    Market::new(cluster, config, Timestamp(0)).expect("valid config")
}

/// Number of GPUs each app holds, in app-id order.
fn holdings(market: &Market) -> Vec<(String, usize)> {
    market
        .apps()
        .map(|app| {
            (
                app.id.0.clone(),
                market
                    .leases()
                    .leases_of(&app.id)
                    .map(|lease| lease.gpus.len())
                    .sum(),
            )
        })
        .collect()
}

fn run(market: &mut Market, now: Timestamp) {
    let outcome = market
        .run_round(now, 7)
        .expect("something to offer")
        .expect("valid round");
    assert!(outcome.auction.is_none(), "baselines run no auction");
}

fn owned(pairs: &[(&str, usize)]) -> Vec<(String, usize)> {
    pairs
        .iter()
        .map(|&(app, count)| (app.to_owned(), count))
        .collect()
}

#[test]
fn tiresias_serves_the_least_attained_service_first() {
    let mut market = market(uniform_cluster(1, 2, 1, 2), Policy::Tiresias);
    market
        .add_app(single_job_app("a", 2, 10_000, 1.0), Timestamp(0))
        .expect("new app");
    run(&mut market, Timestamp(0));
    let lease = market
        .leases()
        .leases_of(&AppId::from("a"))
        .next()
        .expect("a holds GPUs")
        .id;
    market
        .release_lease(lease, Timestamp(100_000))
        .expect("active");
    // a has attained 2 GPUs x 100 s; b and c nothing: they go first.
    for app in ["b", "c"] {
        market
            .add_app(single_job_app(app, 2, 10_000, 1.0), Timestamp(100_000))
            .expect("new app");
    }
    run(&mut market, Timestamp(100_000));
    assert_eq!(holdings(&market), owned(&[("a", 0), ("b", 2), ("c", 2)]));
}

/// a needs 400 s on its 4 GPUs but 1600 GPU-seconds; b needs 500 s on 1 GPU, 500 GPU-seconds.
fn time_versus_service(policy: Policy) -> Market {
    let mut market = market(uniform_cluster(1, 1, 1, 4), policy);
    market
        .add_app(single_job_app("a", 4, 400, 4.0), Timestamp(0))
        .expect("new app");
    market
        .add_app(single_job_app("b", 1, 500, 1.0), Timestamp(0))
        .expect("new app");
    market
}

#[test]
fn srtf_serves_the_shortest_remaining_time_first() {
    let mut market = time_versus_service(Policy::Srtf);
    run(&mut market, Timestamp(0));
    assert_eq!(holdings(&market), owned(&[("a", 4), ("b", 0)]));
}

#[test]
fn srsf_serves_the_shortest_remaining_service_first() {
    let mut market = time_versus_service(Policy::Srsf);
    run(&mut market, Timestamp(0));
    assert_eq!(holdings(&market), owned(&[("a", 3), ("b", 1)]));
}

#[test]
fn gandiva_gives_the_placement_sensitive_app_the_packed_gpus() {
    // Machine 0 (rack 0) has a 2-GPU slot; machine 1 (rack 1) has one GPU.
    let slot = |gpus| SlotSpec {
        gpus,
        gpu_type: "gpu".into(),
    };
    let rack = |gpus| RackSpec {
        machines: vec![MachineSpec::new(vec![slot(gpus)])],
    };
    let cluster = Cluster::from_spec(&ClusterSpec {
        racks: vec![rack(2), rack(1)],
    })
    .expect("valid spec");
    let mut market = market(cluster, Policy::Gandiva);
    // "a" is compute-bound (insensitive), "b" network-bound; the id order would favour "a".
    let insensitive = PlacementSlowdown::NONE;
    let sensitive = PlacementSlowdown {
        same_slot: 1.0,
        same_machine: 1.1,
        same_rack: 1.5,
        cross_rack: 2.0,
    };
    for (id, slowdown) in [("a", insensitive), ("b", sensitive)] {
        let mut app = single_job_app(id, 2, 1000, 1.0);
        let AppKind::SingleJob { job, .. } = &mut app.kind else {
            unreachable!()
        };
        job.slowdown = slowdown;
        market.add_app(app, Timestamp(0)).expect("new app");
    }
    run(&mut market, Timestamp(0));
    assert_eq!(holdings(&market), owned(&[("a", 1), ("b", 2)]));
    let b_gpus: Vec<_> = market
        .leases()
        .leases_of(&AppId::from("b"))
        .flat_map(|l| l.gpus.clone())
        .collect();
    assert_eq!(market.cluster().locality(&b_gpus), Locality::SameSlot);
}

#[test]
fn optimus_spreads_gpus_where_throughput_grows_most() {
    // Linear speed-up for both: after 1 GPU each, a 2nd doubles throughput (x2) while a 3rd
    // adds only half (x1.5), so Optimus balances 2 and 2 instead of filling one app.
    let mut market = market(uniform_cluster(1, 1, 1, 4), Policy::Optimus);
    market
        .add_app(single_job_app("a", 4, 1000, 1.0), Timestamp(0))
        .expect("new app");
    market
        .add_app(single_job_app("b", 4, 1000, 1.0), Timestamp(0))
        .expect("new app");
    run(&mut market, Timestamp(0));
    assert_eq!(holdings(&market), owned(&[("a", 2), ("b", 2)]));
}

#[test]
fn slaq_serves_the_app_whose_loss_falls_most() {
    // a has just started (loss 1, falling fast); b is 90% done (loss 0.1, nearly flat).
    let mut market = market(uniform_cluster(1, 1, 1, 2), Policy::Slaq);
    market
        .add_app(single_job_app("a", 2, 1000, 1.0), Timestamp(0))
        .expect("new app");
    let mut late = single_job_app("b", 2, 1000, 1.0);
    let AppKind::SingleJob { job, .. } = &mut late.kind else {
        unreachable!()
    };
    job.completed_iterations = 900;
    market.add_app(late, Timestamp(0)).expect("new app");
    run(&mut market, Timestamp(0));
    assert_eq!(holdings(&market), owned(&[("a", 2), ("b", 0)]));
}

#[test]
fn baselines_are_work_conserving_through_leases() {
    for policy in Policy::ALL
        .into_iter()
        .filter(|&policy| policy != Policy::Themis)
    {
        let mut market = market(uniform_cluster(2, 2, 2, 2), policy);
        for (n, demand) in [3, 5, 2, 7].into_iter().enumerate() {
            market
                .add_app(
                    single_job_app(&format!("app{n}"), demand, 500, 1.0),
                    Timestamp(0),
                )
                .expect("new app");
        }
        let outcome = market
            .run_round(Timestamp(0), 1)
            .expect("offer")
            .expect("round");
        assert_eq!(outcome.policy, policy);
        assert!(
            market.free_gpus().is_empty(),
            "{policy}: 16 GPUs, demand 17, none may stay idle"
        );
        let held: usize = holdings(&market).iter().map(|(_, count)| count).sum();
        assert_eq!(held, 16, "{policy}");
    }
}

/// "old" arrived at 0 and has waited `waited` seconds; "fresh" arrives now. Both run the same
/// job: `demand` GPUs, 1000 iterations of `demand` serial seconds, so 1000 s on the full demand
/// and T_cluster = 1000 s. old's N_avg is 1 (alone until now), fresh's is 2 (two apps at its
/// arrival), so rho_old = (waited + 1000 / X_old) / 1000 and rho_fresh = 1000 / X_fresh / 2000.
fn old_versus_fresh(cluster: Cluster, demand: u32, waited: f64) -> Market {
    let mut market = market(cluster, Policy::GavelFtf);
    let serial = f64::from(demand);
    market
        .add_app(single_job_app("old", demand, 1000, serial), Timestamp(0))
        .expect("new app");
    let now = Timestamp::from_secs_f64(waited);
    market
        .add_app(single_job_app("fresh", demand, 1000, serial), now)
        .expect("new app");
    run(&mut market, now);
    market
}

#[test]
fn gavel_ftf_serves_the_worst_projected_rho_first() {
    // 4 GPUs, both want 4; old has waited 3000 s: rho_old = 3 + 1/X_old, rho_fresh = 0.5/X_fresh
    // with X_old + X_fresh <= 1. Equal rho at X_fresh = (4.5 - sqrt(14.25)) / 6 = 0.121, so
    // X_old = 0.879, 3.5 of the 4 GPUs: old takes ceil(3.5) = all 4 (the id order and SRTF
    // would both have picked "fresh").
    let market = old_versus_fresh(uniform_cluster(1, 1, 1, 4), 4, 3000.0);
    assert_eq!(holdings(&market), owned(&[("fresh", 0), ("old", 4)]));
}

#[test]
fn gavel_ftf_rounds_the_lp_fractions_into_leases() {
    // 8 GPUs, both want 8; old has waited 1000 s: 1 + 1/(1 - x) = 0.5/x at
    // x = (2.5 - sqrt(4.25)) / 2 = 0.219, so the fair shares are 6.25 GPUs for old and 1.75
    // for fresh. old (furthest below its share) takes ceil(6.25) = 7, fresh the last one.
    let waited = old_versus_fresh(uniform_cluster(1, 2, 1, 4), 8, 1000.0);
    assert_eq!(holdings(&waited), owned(&[("fresh", 1), ("old", 7)]));

    // Apps arriving together get the same time fraction, so GPUs in proportion to demand:
    // 4 GPUs for demands 6 and 2 is X = 1/2 each, 3 and 1 GPUs.
    let mut market = market(uniform_cluster(1, 1, 1, 4), Policy::GavelFtf);
    for (id, demand) in [("a", 2), ("b", 6)] {
        market
            .add_app(single_job_app(id, demand, 1000, 1.0), Timestamp(0))
            .expect("new app");
    }
    run(&mut market, Timestamp(0));
    assert_eq!(holdings(&market), owned(&[("a", 1), ("b", 3)]));
}

#[test]
fn gavel_ftf_counts_held_gpus_against_the_fair_share() {
    // a and b, identical and fresh, want 4 GPUs each of 4: X = 1/2, two GPUs each.
    let mut market = market(uniform_cluster(1, 1, 1, 4), Policy::GavelFtf);
    for id in ["a", "b"] {
        market
            .add_app(single_job_app(id, 4, 1000, 1.0), Timestamp(0))
            .expect("new app");
    }
    run(&mut market, Timestamp(0));
    assert_eq!(holdings(&market), owned(&[("a", 2), ("b", 2)]));
    // b gives its GPUs back. The fractions are still 1/2 each (2 GPUs), but a already holds
    // its 2, so b, 2 below its share, takes both free GPUs although a comes first by id.
    let lease = market
        .leases()
        .leases_of(&AppId::from("b"))
        .next()
        .expect("b holds GPUs")
        .id;
    market.release_lease(lease, Timestamp(0)).expect("active");
    run(&mut market, Timestamp(0));
    assert_eq!(holdings(&market), owned(&[("a", 2), ("b", 2)]));
    assert!(market.free_gpus().is_empty());
}

#[test]
fn shockwave_splits_a_round_evenly_between_identical_apps() {
    // Both want 4 of 4 GPUs at one speed: the window's Nash welfare is highest with 2 each in
    // every round, and among the plans worth as much the first round's own welfare picks 2/2.
    let mut market = market(uniform_cluster(1, 1, 1, 4), Policy::Shockwave);
    for id in ["a", "b"] {
        market
            .add_app(single_job_app(id, 4, 10_000, 1.0), Timestamp(0))
            .expect("new app");
    }
    run(&mut market, Timestamp(0));
    assert_eq!(holdings(&market), owned(&[("a", 2), ("b", 2)]));
}

#[test]
fn shockwave_lets_an_app_about_to_speed_up_wait_for_its_faster_rounds() {
    // Identical apps but for "adapting", which doubles its batch size at iteration 1,200 and
    // then runs 2.5x faster per sample: a GPU is worth more to it in the window's later
    // rounds, so the first round (the one applied) leans to "steady". Named so that the id
    // order would favour "adapting".
    let mut market = market(uniform_cluster(1, 1, 1, 4), Policy::Shockwave);
    let mut adapting = single_job_app("adapting", 4, 10_000, 1.0);
    if let AppKind::SingleJob { job, .. } = &mut adapting.kind {
        job.speed_changes = vec![agora_market::app::SpeedChange {
            at_iteration: 1_200,
            serial_iteration_time: 0.4,
        }];
    }
    market.add_app(adapting, Timestamp(0)).expect("new app");
    market
        .add_app(single_job_app("steady", 4, 10_000, 1.0), Timestamp(0))
        .expect("new app");
    run(&mut market, Timestamp(0));
    let held = holdings(&market);
    assert!(held[1].1 > held[0].1, "{held:?}");
    assert_eq!(held[0].1 + held[1].1, 4, "{held:?}");
}
