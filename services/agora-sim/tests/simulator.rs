//! The simulator on tiny hand-checkable scenarios, and its determinism.

use std::collections::BTreeMap;
use std::time::Duration;

use agora_market::app::{
    App, AppId, AppKind, CurveJob, Job, PerformanceCurve, PlacementSlowdown, SuccessiveHalving,
};
use agora_market::market::MarketConfig;
use agora_market::policy::Policy;
use agora_market::topology::{Cluster, ClusterSpec};
use agora_sim::metrics::SimulationReport;
use agora_sim::simulator::{simulate, SimulationConfig};
use agora_sim::workload::{Workload, WorkloadApp};

fn job(id: &str, iterations: u64, serial_seconds: f64, max_gpus: u32) -> Job {
    Job {
        id: id.into(),
        total_iterations: iterations,
        completed_iterations: 0,
        serial_iteration_time: serial_seconds,
        max_gpus,
        slowdown: PlacementSlowdown::NONE,
        stopped: false,
    }
}

fn arriving(seconds: f64, app: App) -> WorkloadApp {
    WorkloadApp {
        arrival_seconds: seconds,
        model: "resnet50".into(),
        app,
        job_quality: BTreeMap::new(),
    }
}

fn single(id: &str, iterations: u64, max_gpus: u32) -> App {
    App {
        id: AppId::from(id),
        kind: AppKind::SingleJob {
            job: job(&format!("{id}-job"), iterations, 1.0, max_gpus),
        },
    }
}

fn config(policy: Policy) -> SimulationConfig {
    let market = MarketConfig {
        policy,
        fairness_knob: 0.0,
        lease_length: Duration::from_secs(600),
        ..MarketConfig::default()
    };
    SimulationConfig {
        market,
        restart_pause: Duration::ZERO,
        ..SimulationConfig::default()
    }
}

fn run(cluster: &Cluster, apps: Vec<WorkloadApp>, config: &SimulationConfig) -> SimulationReport {
    simulate(cluster, &Workload { apps }, config, |_| {}).expect("valid simulation")
}

fn completion(report: &SimulationReport, app: &str) -> f64 {
    report
        .apps
        .iter()
        .find(|entry| entry.app == AppId::from(app))
        .expect("reported")
        .completion_seconds
}

fn two_gpus() -> Cluster {
    Cluster::from_spec(&ClusterSpec::uniform(1, 1, 1, 2)).expect("valid spec")
}

#[test]
fn a_lone_app_runs_at_full_speed_and_is_exactly_fair() {
    let report = run(
        &two_gpus(),
        vec![arriving(0.0, single("a", 100, 2))],
        &config(Policy::Themis),
    );
    // 100 iterations of 1 s on 2 GPUs: 50 s (events land 1 ms after the exact time).
    assert!((completion(&report, "a") - 50.0).abs() < 0.01, "{report:?}");
    assert!(
        (report.summary.max_rho - 1.0).abs() < 1e-3,
        "alone, T_sh = T_cluster"
    );
    assert!((report.apps[0].gpu_seconds - 100.0).abs() < 0.05);
    assert_eq!(report.summary.unfinished_apps, 0);
}

#[test]
fn a_late_app_waits_for_the_lease_holder_under_every_policy() {
    // a holds both GPUs from 0 (lease 600 s) and finishes at 300 s, releasing them; b arrived
    // at 100 s, gets both at 300 s and finishes 50 s later.
    for policy in Policy::ALL {
        let apps = vec![
            arriving(0.0, single("a", 600, 2)),
            arriving(100.0, single("b", 100, 2)),
        ];
        let report = run(&two_gpus(), apps, &config(policy));
        assert!(
            (completion(&report, "a") - 300.0).abs() < 0.01,
            "{policy}: {report:?}"
        );
        assert!(
            (completion(&report, "b") - 250.0).abs() < 0.01,
            "{policy}: {report:?}"
        );
        assert_eq!(report.summary.policy, policy);
    }
}

#[test]
fn a_lease_expiry_reauctions_and_a_move_costs_the_restart_pause() {
    // Lease 60 s. a (demand 2, 600 iterations) runs alone until 60 s; b arrived at 10 s. At
    // 60 s both are starving; serving both comes first, so each gets one GPU. a's GPUs changed:
    // it pauses 35 s. b runs 100 iterations on one GPU: done at 160 s.
    let mut config = config(Policy::Themis);
    config.market.lease_length = Duration::from_secs(60);
    config.restart_pause = Duration::from_secs(35);
    let apps = vec![
        arriving(0.0, single("a", 600, 2)),
        arriving(10.0, single("b", 100, 2)),
    ];
    let report = run(&two_gpus(), apps, &config);
    assert!(
        (completion(&report, "b") - 150.0).abs() < 0.01,
        "{report:?}"
    );
    let a = report
        .apps
        .iter()
        .find(|entry| entry.app == AppId::from("a"))
        .expect("reported");
    assert!(a.reallocations >= 1);
}

#[test]
fn successive_halving_keeps_the_better_half() {
    // Four jobs on a 4-GPU slot, phases of 10/20/40 iterations keeping 4/2/1 jobs. The slow
    // jobs (2 s per iteration) are the better ones, so they survive. Phase 1: a and b finish
    // their 10 iterations at 10 s, when c and d are halfway; the app re-shares the GPUs, 2
    // each, so c and d finish at 15 s. Phase 2 runs c and d on 2 GPUs each (20 x 2 / 2 = 20 s),
    // phase 3 runs d on 4 (40 x 2 / 4 = 20 s): 55 s in all. Keeping a and b would take 35 s.
    let jobs = vec![
        job("a", 70, 1.0, 4),
        job("b", 70, 1.0, 4),
        job("c", 70, 2.0, 4),
        job("d", 70, 2.0, 4),
    ];
    let search = SuccessiveHalving {
        budget_gpu_seconds: 240.0,
        phase_iterations: vec![10, 20, 40],
        jobs_per_phase: vec![4, 2, 1],
        current_phase: 0,
        jobs,
    };
    let mut entry = arriving(
        0.0,
        App {
            id: AppId::from("sh"),
            kind: AppKind::SuccessiveHalving(search),
        },
    );
    entry.job_quality = [("a", 0.1), ("b", 0.2), ("c", 0.8), ("d", 0.9)]
        .map(|(id, q)| (id.to_owned(), q))
        .into();
    let cluster = Cluster::from_spec(&ClusterSpec::uniform(1, 1, 1, 4)).expect("valid spec");
    let report = run(&cluster, vec![entry], &config(Policy::Themis));
    assert!(
        (completion(&report, "sh") - 55.0).abs() < 0.05,
        "{report:?}"
    );
}

#[test]
fn performance_curve_jobs_stop_at_their_prediction() {
    // Two jobs of 1000 iterations predicted to stop at 100 and 300: on one GPU each the app
    // ends at 300 s, not 1000 s.
    let curve = PerformanceCurve {
        jobs: vec![
            CurveJob {
                job: job("x", 1000, 1.0, 1),
                predicted_final_iteration: 100,
            },
            CurveJob {
                job: job("y", 1000, 1.0, 1),
                predicted_final_iteration: 300,
            },
        ],
    };
    let entry = arriving(
        0.0,
        App {
            id: AppId::from("pc"),
            kind: AppKind::PerformanceCurve(curve),
        },
    );
    let report = run(&two_gpus(), vec![entry], &config(Policy::Themis));
    assert!(
        (completion(&report, "pc") - 300.0).abs() < 0.05,
        "{report:?}"
    );
}

fn mixed_workload() -> Vec<WorkloadApp> {
    (0..12)
        .map(|n| {
            let id = format!("app{n:02}");
            let mut app = single(&id, 200 + 50 * n, 1 + (n as u32 % 4));
            if let AppKind::SingleJob { job } = &mut app.kind {
                job.slowdown = PlacementSlowdown::default();
            }
            arriving(n as f64 * 7.0, app)
        })
        .collect()
}

#[test]
fn same_seed_same_results_byte_for_byte() {
    let cluster = Cluster::from_spec(&ClusterSpec::uniform(2, 2, 2, 2)).expect("valid spec");
    for policy in Policy::ALL {
        let mut config = config(policy);
        config.market.fairness_knob = 0.8;
        config.market.lease_length = Duration::from_secs(60);
        config.restart_pause = Duration::from_secs(35);
        config.estimation_error = 0.2;
        config.seed = 42;
        let first =
            serde_json::to_string(&run(&cluster, mixed_workload(), &config)).expect("serialisable");
        let second =
            serde_json::to_string(&run(&cluster, mixed_workload(), &config)).expect("serialisable");
        assert_eq!(first, second, "{policy}");
        let report: SimulationReport = serde_json::from_str(&first).expect("round trip");
        assert_eq!(report.summary.unfinished_apps, 0, "{policy}");
    }
}
