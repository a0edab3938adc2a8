//! Heterogeneous GPUs: rho, bids and a round's outcome when apps run at different speeds on
//! different GPU types, checked by hand.

use agora_market::app::{App, AppKind, PlacementSlowdown};
use agora_market::auction::AppBid;
use agora_market::fairness::slowest_useful_speed;
use agora_market::market::{Market, MarketConfig, MarketError};
use agora_market::policy::Policy;
use agora_market::throughput::{GpuSpeeds, Throughput, ThroughputReport};
use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, Gpu, GpuId, GpuIndex, GpuLocation};

use crate::support::single_job_app;

/// Two V100s in slot 0 (machine 0) and two K80s in slot 1 (machine 1), one rack.
fn two_types() -> Cluster {
    let gpu = |id: &str, gpu_type: &str, slot: u32| Gpu {
        id: GpuId::from(id),
        gpu_type: gpu_type.to_owned(),
        location: GpuLocation {
            rack: 0,
            machine: slot,
            slot,
        },
    };
    Cluster::new(vec![
        gpu("v0", "v100", 0),
        gpu("v1", "v100", 0),
        gpu("k0", "k80", 1),
        gpu("k1", "k80", 1),
    ])
    .expect("valid cluster")
}

fn table(k80: f64, v100: f64) -> Throughput {
    Throughput([("k80".to_owned(), k80), ("v100".to_owned(), v100)].into())
}

/// One job of 1000 iterations of 1 s (at speed 1, the K80's), up to 2 GPUs, placement
/// insensitive, with the given speeds.
fn app(id: &str, throughput: Throughput) -> App {
    let mut app = single_job_app(id, 2, 1000, 1.0);
    if let AppKind::SingleJob { job, .. } = &mut app.kind {
        job.slowdown = PlacementSlowdown::NONE;
    }
    *app.throughput_mut() = throughput;
    app
}

fn is_v100(gpu: &GpuId) -> bool {
    gpu.0.starts_with('v')
}

/// The V100s and K80s `app` holds.
fn v100s_and_k80s(market: &Market, app: &str) -> (usize, usize) {
    let gpus: Vec<GpuId> = market
        .leases()
        .leases_of(&app.into())
        .flat_map(|lease| {
            lease
                .gpus
                .iter()
                .map(|&gpu| market.cluster().gpu(gpu).id.clone())
        })
        .collect();
    let fast = gpus.iter().filter(|gpu| is_v100(gpu)).count();
    (fast, gpus.len() - fast)
}

/// The hand-checked example of docs/mechanism.md ("Heterogeneous GPUs"). Three apps arrive at
/// t = 0 on two V100s and two K80s, all bid (f = 0). A runs 4x faster on a V100 than on a
/// K80, B 2x, C the same on both.
///
/// - T_cluster (each alone, on its 2 fastest GPUs): A 1000 / 2 / 4 = 125 s, B 250 s, C 500 s;
///   N_avg = 3, so T_id = 375, 750 and 1500 s.
/// - rho = remaining / T_id: A on one V100 250 / 375 = 2/3, on one K80 1000 / 375 = 8/3, on
///   both V100s 1/3, on both K80s 4/3, on a V100 and a K80 2/3 (both at the K80's pace would
///   take 500 s, so its scheduler leaves the K80 idle and runs 250 s on the V100); B 2/3, 4/3,
///   1/3, 2/3, 2/3 (500 s either way: the fastest floor, the V100 alone); C 2/3 on any one
///   GPU and 1/3 on any two.
/// - Bids (an entry must beat every smaller bundle): A {1 V100: 2/3, 1 K80: 8/3, 2 V100: 1/3},
///   B {1 V100: 2/3, 1 K80: 4/3, 2 V100: 1/3} (2 K80 at 2/3 is no better than one V100), C
///   {1 GPU of either type: 2/3, 2 GPUs of either type: 1/3}.
/// - The auction serves all three (all starving) and, among those allocations, maximises the
///   product of 1/rho: A a V100, B a V100, C both K80s gives 1.5 x 1.5 x 3 = 6.75, above any
///   other (A both V100s, B and C a K80 each: 3 x 0.75 x 1.5 = 3.375). Each keeps its bundle
///   (a starving winner keeps at least one GPU; C's share is 1: without C, A and B reach at
///   best 1.5 x 1.5 = 3 x 0.75 = 2.25, what they get with it).
/// - So the V100s go to the apps they speed up and the K80s to the app indifferent to type,
///   and every app ends at rho 2/3, 2/3 and 1/3.
#[test]
fn two_types_three_apps_hand_checked() {
    let config = MarketConfig {
        fairness_knob: 0.0,
        restart_pause: std::time::Duration::ZERO,
        ..MarketConfig::default()
    };
    let mut market = Market::new(two_types(), config, Timestamp(0)).expect("valid config");
    let apps = [
        app("a", table(1.0, 4.0)),
        app("b", table(1.0, 2.0)),
        app("c", table(1.0, 1.0)),
    ];
    for app in &apps {
        market.add_app(app.clone(), Timestamp(0)).expect("admitted");
    }
    let cluster_seconds: Vec<f64> = apps.iter().map(|app| market.cluster_time(app)).collect();
    assert_eq!(cluster_seconds, vec![125.0, 250.0, 500.0]);

    let (v0, v1, k0) = (GpuIndex(0), GpuIndex(1), GpuIndex(2));
    let k1 = GpuIndex(3);
    let rho = |app: &str, gpus: &[GpuIndex]| {
        market
            .rho_projection(&app.into(), gpus, Timestamp(0))
            .expect("known app")
            .projected
            .expect("finite")
            .get()
    };
    let third = 1.0 / 3.0;
    let expected = [
        (
            "a",
            [2.0 * third, 8.0 * third, third, 4.0 * third, 2.0 * third],
        ),
        (
            "b",
            [2.0 * third, 4.0 * third, third, 2.0 * third, 2.0 * third],
        ),
        ("c", [2.0 * third, 2.0 * third, third, third, third]),
    ];
    for (app, values) in expected {
        let bundles: [&[GpuIndex]; 5] = [&[v0], &[k0], &[v0, v1], &[k0, k1], &[v0, k0]];
        for (bundle, value) in bundles.into_iter().zip(values) {
            let actual = rho(app, bundle);
            assert!(
                (actual - value).abs() < 1e-12,
                "{app} on {bundle:?}: rho {actual}, expected {value}"
            );
        }
    }

    let outcome = market
        .run_round(Timestamp(0), 7)
        .expect("GPUs to offer")
        .expect("a valid round");
    let auction = outcome.auction.expect("a Themis round");
    // Each bid as (V100s, K80s, rho) per entry, sorted.
    let table_of = |bid: &AppBid| {
        let mut entries: Vec<(usize, usize, f64)> = bid
            .bids
            .iter()
            .map(|entry| {
                let fast = entry.gpus.iter().filter(|gpu| is_v100(gpu)).count();
                (fast, entry.gpus.len() - fast, entry.rho.get())
            })
            .collect();
        entries.sort_by(|x, y| x.partial_cmp(y).expect("finite"));
        entries.dedup();
        entries
    };
    let bid = |app: &str| {
        table_of(
            auction
                .bids
                .iter()
                .find(|bid| bid.app.0 == app)
                .expect("every app bids"),
        )
    };
    let close = |actual: Vec<(usize, usize, f64)>, expected: Vec<(usize, usize, f64)>| {
        assert_eq!(actual.len(), expected.len(), "{actual:?} vs {expected:?}");
        for (got, want) in actual.iter().zip(&expected) {
            assert!(
                got.0 == want.0 && got.1 == want.1 && (got.2 - want.2).abs() < 1e-12,
                "{actual:?} vs {expected:?}"
            );
        }
    };
    close(
        bid("a"),
        vec![(0, 1, 8.0 * third), (1, 0, 2.0 * third), (2, 0, third)],
    );
    close(
        bid("b"),
        vec![(0, 1, 4.0 * third), (1, 0, 2.0 * third), (2, 0, third)],
    );
    close(
        bid("c"),
        vec![
            (0, 1, 2.0 * third),
            (0, 2, third),
            (1, 0, 2.0 * third),
            (2, 0, third),
        ],
    );

    assert_eq!(v100s_and_k80s(&market, "a"), (1, 0));
    assert_eq!(v100s_and_k80s(&market, "b"), (1, 0));
    assert_eq!(v100s_and_k80s(&market, "c"), (0, 2));
    for (app, value) in [("a", 2.0 * third), ("b", 2.0 * third), ("c", third)] {
        let current = market
            .current_rho(&app.into(), Timestamp(0))
            .expect("known")
            .expect("holds GPUs")
            .get();
        assert!((current - value).abs() < 1e-12, "{app}: {current}");
    }
}

/// The job model leaves a slower type idle only when the job finishes no later without it.
/// One job of 1000 s (at the K80's speed 1), up to 2 GPUs, on one V100 and one K80:
/// - 4x on the V100 (A): the V100 alone takes 250 s, both at the K80's pace 500 s: floor 4;
/// - 2x (B): 500 s either way, the fastest floor wins the tie: floor 2;
/// - 1.5x: the V100 alone takes 667 s, both 500 s: the K80 is used, floor 1;
/// - the same speed on both (C): nothing to leave out, floor 1;
/// - two such jobs at 4x: the V100 alone would leave one waiting, so the K80 is used, floor 1.
#[test]
fn a_slower_type_is_left_idle_only_when_it_would_slow_the_job() {
    let cluster = two_types();
    let (v0, k0) = (GpuIndex(0), GpuIndex(2));
    let pair = [cluster.location(v0), cluster.location(k0)];
    for (v100, floor) in [(4.0, 4.0), (2.0, 2.0), (1.5, 1.0), (1.0, 1.0)] {
        let app = app("a", table(1.0, v100));
        let speeds = GpuSpeeds::of(app.throughput(), &cluster);
        assert_eq!(
            slowest_useful_speed(&app.running_jobs(), &pair, &speeds, 0.0),
            floor,
            "V100 speed {v100}"
        );
    }
    let app = app("a", table(1.0, 4.0));
    let speeds = GpuSpeeds::of(app.throughput(), &cluster);
    let two_jobs = [app.running_jobs(), app.running_jobs()].concat();
    assert_eq!(slowest_useful_speed(&two_jobs, &pair, &speeds, 0.0), 1.0);
}

/// Gavel's heterogeneity-aware FTF (`baselines/gavel.rs`) on the same cluster and apps, named
/// in either order. Each app's T_id is 3x its time on 2 GPUs of its best type (the V100), so
/// rho_i = 1 / (3 y_i), y_i = X_iV + c_i X_iK with c = 1/4, 1/2, 1 for A, B, C; both types
/// have 2 GPUs and every demand is 2, so sum_i X_iV <= 1 and sum_i X_iK <= 1.
///
/// - By hand: maximise min y. The LP's optimum is y = 0.6 for all three with A on V100s
///   (X_AV = 0.6), C on K80s (X_CK = 0.6) and B on both (X_BV = X_BK = 0.4), filling both
///   types: the duals p_V = 0.4, p_K = 0.2 and weights 0.4, 0.4, 0.2 on A, B, C certify it
///   (0.4 + 0.2 = 0.6; A on a K80 earns 0.4 / 4 < 0.2, C on a V100 0.2 < 0.4). Max rho 5/9.
/// - Shares in GPUs: A 1.2 V100s; B 0.8 V100s and 0.8 K80s; C 1.2 K80s. B is furthest below
///   its share (1.6) and takes ceil(0.8) = 1 V100 and 1 K80 first; A the other V100; C the
///   other K80.
#[test]
fn gavel_ftf_shares_the_types_by_speed_whatever_the_names() {
    for [a, b, c] in [["a", "b", "c"], ["z", "y", "x"]] {
        let config = MarketConfig {
            policy: Policy::GavelFtf,
            restart_pause: std::time::Duration::ZERO,
            ..MarketConfig::default()
        };
        let mut market = Market::new(two_types(), config, Timestamp(0)).expect("valid config");
        for (id, speeds) in [
            (a, table(1.0, 4.0)),
            (b, table(1.0, 2.0)),
            (c, table(1.0, 1.0)),
        ] {
            market
                .add_app(app(id, speeds), Timestamp(0))
                .expect("admitted");
        }
        market
            .run_round(Timestamp(0), 7)
            .expect("GPUs to offer")
            .expect("a valid round");
        assert_eq!(v100s_and_k80s(&market, a), (1, 0), "{a}");
        assert_eq!(v100s_and_k80s(&market, b), (1, 1), "{b}");
        assert_eq!(v100s_and_k80s(&market, c), (0, 1), "{c}");
    }
}

#[test]
fn a_table_without_a_type_of_the_cluster_is_refused_naming_it() {
    let mut market =
        Market::new(two_types(), MarketConfig::default(), Timestamp(0)).expect("valid config");
    let only_k80 = app("a", Throughput([("k80".to_owned(), 1.0)].into()));
    let error = market
        .add_app(only_k80, Timestamp(0))
        .expect_err("no v100 speed");
    assert!(
        matches!(&error, MarketError::Throughput(app, reason) if app.0 == "a" && reason.contains("`v100`")),
        "{error}"
    );
    let negative = app("b", table(1.0, -2.0));
    let refusal = negative.validate().expect_err("negative speed");
    assert!(refusal.contains("throughput.v100"), "{refusal}");
}

/// A framework measures app A (declared 4x on a V100) at only 2x: from then on its rho on a
/// V100 is what a 2x speed gives (T_cluster 125 s fixed at arrival, N_avg 2, so T_id 250 s:
/// rho 1000 / 4 / 250 = 1 before, 1000 / 2 / 250 = 2 after), its rho on a K80 does not move, and a bad report changes nothing.
#[test]
fn a_throughput_report_moves_rho_on_its_type_only() {
    let mut market =
        Market::new(two_types(), MarketConfig::default(), Timestamp(0)).expect("valid config");
    for app in [app("a", table(1.0, 4.0)), app("b", table(1.0, 1.0))] {
        market.add_app(app, Timestamp(0)).expect("admitted");
    }
    let rho_on = |market: &Market, gpu: GpuIndex| {
        market
            .rho_projection(&"a".into(), &[gpu], Timestamp(0))
            .expect("known app")
            .projected
            .expect("finite")
            .get()
    };
    let (v100, k80) = (GpuIndex(0), GpuIndex(2));
    let (before_v100, before_k80) = (rho_on(&market, v100), rho_on(&market, k80));
    assert!((before_v100 - 1.0).abs() < 1e-12, "{before_v100}");

    let report = ThroughputReport {
        gpu_type: "v100".into(),
        speed: 2.0,
    };
    let table_now = market
        .report_throughput(&"a".into(), &report)
        .expect("a valid report")
        .clone();
    assert_eq!(table_now, table(1.0, 2.0));
    assert!((rho_on(&market, v100) - 2.0 * before_v100).abs() < 1e-12);
    assert_eq!(rho_on(&market, k80), before_k80);

    let zero = ThroughputReport {
        gpu_type: "v100".into(),
        speed: 0.0,
    };
    assert!(matches!(
        market.report_throughput(&"a".into(), &zero),
        Err(MarketError::ThroughputReport(_))
    ));
    assert!(matches!(
        market.report_throughput(&"nobody".into(), &report),
        Err(MarketError::UnknownApp(_))
    ));
    let a_table = market
        .apps()
        .find(|app| app.id.0 == "a")
        .expect("a")
        .throughput();
    assert_eq!(a_table, &table(1.0, 2.0), "refused reports change nothing");
}

/// An app whose demand is met still bids when it holds a GPU slower than an offered one, so
/// the worst-off app is not left on a K80 while V100s go to others (the Gavel 108 trace, 3x:
/// a DeepSpeech app held two K80s to the end at rho 1.15). One job of 1000 s at the K80's
/// speed, 4x on a V100, 1 GPU, alone (N_avg 1): T_id = 250 s; on its K80 rho = 1000 / 250 =
/// 4, on a V100 1 (holding both, its scheduler leaves the K80 idle). With the same speed on
/// both types nothing is gained, and it is not invited.
#[test]
fn an_app_whose_demand_is_met_trades_a_slow_gpu_for_a_fast_one() {
    use agora_market::market::Withdrawal;
    let config = MarketConfig {
        restart_pause: std::time::Duration::ZERO,
        ..MarketConfig::default()
    };
    let (v0, v1) = (GpuIndex(0), GpuIndex(1));
    for (v100_speed, trades_up) in [(4.0, true), (1.0, false)] {
        let mut market = Market::new(two_types(), config, Timestamp(0)).expect("valid config");
        let mut one_gpu = single_job_app("a", 1, 1000, 1.0);
        *one_gpu.throughput_mut() = table(1.0, v100_speed);
        market.add_app(one_gpu, Timestamp(0)).expect("admitted");
        for gpu in [v0, v1] {
            market.set_withdrawn(gpu, Withdrawal::Drained, true);
        }
        market
            .run_round(Timestamp(0), 1)
            .expect("K80s to offer")
            .expect("a valid round");
        assert_eq!(v100s_and_k80s(&market, "a"), (0, 1));
        for gpu in [v0, v1] {
            market.set_withdrawn(gpu, Withdrawal::Drained, false);
        }

        let offer = market.open_round(Timestamp(0));
        if !trades_up {
            assert!(offer.is_none(), "an app that gains nothing is not invited");
            continue;
        }
        let offer = offer.expect("the V100s are offered");
        assert_eq!(offer.bidders, vec!["a".into()], "demand met, yet invited");
        let bid = market.agent_bid(&offer, &"a".into()).expect("known app");
        assert_eq!(bid.rho_old.expect("holds a K80").get(), 4.0);
        let best = bid
            .bids
            .iter()
            .min_by(|x, y| x.rho.get().total_cmp(&y.rho.get()))
            .expect("a trade-up entry");
        assert_eq!((best.gpus.len(), is_v100(&best.gpus[0])), (1, true));
        assert_eq!(best.rho.get(), 1.0);
        market
            .run_round(Timestamp(0), 2)
            .expect("V100s to offer")
            .expect("a valid round");
        assert_eq!(v100s_and_k80s(&market, "a"), (1, 1));
        let rho = market
            .current_rho(&"a".into(), Timestamp(0))
            .expect("known");
        assert_eq!(rho.expect("holds GPUs").get(), 1.0);
    }
}
