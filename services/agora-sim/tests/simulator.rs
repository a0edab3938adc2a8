//! The simulator on tiny hand-checkable scenarios, and its determinism.

use std::collections::BTreeMap;
use std::time::Duration;

use agora_market::app::{
    App, AppId, AppKind, CurveJob, Job, PerformanceCurve, PlacementSlowdown, SpeedChange,
    SuccessiveHalving,
};
use agora_market::market::MarketConfig;
use agora_market::policy::Policy;
use agora_market::topology::{Cluster, ClusterSpec};
use agora_sim::clusters;
use agora_sim::generate::{self, GeneratorConfig};
use agora_sim::metrics::{AppReport, SimulationReport};
use agora_sim::simulator::{simulate, SimulationConfig, SpeedChangeReporting};
use agora_sim::workload::{Workload, WorkloadApp};
use proptest::prelude::*;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn job(id: &str, iterations: u64, serial_seconds: f64, max_gpus: u32) -> Job {
    Job {
        id: id.into(),
        total_iterations: iterations,
        completed_iterations: 0,
        serial_iteration_time: serial_seconds,
        max_gpus,
        slowdown: PlacementSlowdown::NONE,
        stopped: false,
        speed_changes: Vec::new(),
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
            throughput: Default::default(),
            sensitivity: Default::default(),
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
        market: MarketConfig {
            restart_pause: Duration::ZERO,
            ..market
        },
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
fn a_lone_adapting_job_pays_one_restart_per_speed_change_and_stays_exactly_fair() {
    // 100 iterations on 2 GPUs: 40 at 1 s (20 s), a 10 s restart to double the batch size,
    // then 60 at 0.5 s (15 s): 45 s. T_cluster forecasts the same, so rho is 1, whether the
    // market is told the schedule or only each new speed as it comes.
    for reporting in [
        SpeedChangeReporting::Forecast,
        SpeedChangeReporting::Reactive,
    ] {
        let mut adapting = single("a", 100, 2);
        if let AppKind::SingleJob { job, .. } = &mut adapting.kind {
            job.speed_changes = vec![SpeedChange {
                at_iteration: 40,
                serial_iteration_time: 0.5,
            }];
        }
        let mut config = config(Policy::Themis);
        config.market.restart_pause = Duration::from_secs(10);
        config.speed_changes = reporting;
        let report = run(&two_gpus(), vec![arriving(0.0, adapting)], &config);
        assert!(
            (completion(&report, "a") - 45.0).abs() < 0.01,
            "{reporting:?}: {report:?}"
        );
        assert!(
            (report.summary.max_rho - 1.0).abs() < 1e-3,
            "{reporting:?}: {report:?}"
        );
    }
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
    config.market.restart_pause = Duration::from_secs(35);
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
    // jobs (2 s per iteration) are the better ones, so they survive. Phase 1 runs every job on
    // one GPU: a and b finish at 10 s, c and d at 20 s (a job keeps its width within a phase,
    // as the job model has it). Phase 2 runs c and d on 2 GPUs each (20 x 2 / 2 = 20 s),
    // phase 3 runs d on 4 (40 x 2 / 4 = 20 s): 60 s in all, T_cluster exactly.
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
        max_gpus_per_phase: Vec::new(),
        current_phase: 0,
        jobs,
        throughput: Default::default(),
        sensitivity: Default::default(),
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
        (completion(&report, "sh") - 60.0).abs() < 0.05,
        "{report:?}"
    );
    assert_eq!(report.apps[0].t_cluster_seconds, 60.0);
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
        throughput: Default::default(),
        sensitivity: Default::default(),
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
            if let AppKind::SingleJob { job, .. } = &mut app.kind {
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
        config.market.restart_pause = Duration::from_secs(35);
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

fn report_of<'a>(report: &'a SimulationReport, app: &str) -> &'a AppReport {
    report
        .apps
        .iter()
        .find(|entry| entry.app == AppId::from(app))
        .expect("reported")
}

/// Hand-computed rho and N_avg. Events land 1 ms after a job's exact finish, so a 50 s job
/// completes at 50.001 s.
#[test]
fn hand_computed_fairness() {
    struct Case {
        name: &'static str,
        apps: Vec<WorkloadApp>,
        /// (app, T_cluster, N_avg, completion)
        expected: Vec<(&'static str, f64, f64, f64)>,
    }
    let cases = [
        Case {
            // 100 iterations of 1 s on both GPUs: 50 s, alone.
            name: "one app alone",
            apps: vec![arriving(0.0, single("a", 100, 2))],
            expected: vec![("a", 50.0, 1.0, 50.001)],
        },
        Case {
            // Each could use both GPUs (T_cluster 50 s); they split them, one each, and finish
            // together after 100 s: N_avg 2, T_id 100 s.
            name: "two identical apps arriving together split the cluster evenly",
            apps: vec![
                arriving(0.0, single("a", 100, 2)),
                arriving(0.0, single("b", 100, 2)),
            ],
            expected: vec![("a", 50.0, 2.0, 100.001), ("b", 50.0, 2.0, 100.001)],
        },
        Case {
            // b arrives after a has left: each was alone all its life.
            name: "an app arriving after another has left",
            apps: vec![
                arriving(0.0, single("a", 100, 2)),
                arriving(60.0, single("b", 100, 2)),
            ],
            expected: vec![("a", 50.0, 1.0, 50.001), ("b", 50.0, 1.0, 50.001)],
        },
    ];
    for case in cases {
        let report = run(&two_gpus(), case.apps, &config(Policy::Themis));
        for (app, t_cluster, n_avg, completion) in case.expected {
            let entry = report_of(&report, app);
            assert_eq!(entry.t_cluster_seconds, t_cluster, "{}: {app}", case.name);
            assert_eq!(entry.n_avg, n_avg, "{}: {app}", case.name);
            assert!(
                (entry.completion_seconds - completion).abs() < 1e-9,
                "{}: {app} completed after {} s",
                case.name,
                entry.completion_seconds
            );
            assert_eq!(
                entry.rho,
                entry.completion_seconds / (t_cluster * n_avg),
                "{}: {app}",
                case.name
            );
        }
    }
}

fn testbed() -> Cluster {
    clusters::load_cluster(clusters::shipped::path(clusters::shipped::THEMIS_TESTBED))
        .expect("the shipped testbed")
}

/// A small generated workload: Workload 1 or 2, a few apps, short and dense.
fn generated(kind: u8, apps: usize, seed: u64) -> Workload {
    let config = GeneratorConfig::philly_like(apps, seed, 0.01);
    match kind {
        1 => generate::workload1(&config),
        _ => generate::workload2(&config),
    }
    .expect("valid generator config")
}

/// A performance-curve app whose jobs' lengths span two orders of magnitude.
fn skewed_curve(seed: u64) -> WorkloadApp {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let jobs = (0..rng.random_range(2..40))
        .map(|n| {
            let iterations = (10.0 * 100f64.powf(rng.random::<f64>())).round() as u64 + 1;
            CurveJob {
                job: Job {
                    slowdown: PlacementSlowdown::default(),
                    ..job(
                        &format!("skewed-j{n:03}"),
                        iterations * 4,
                        3.0,
                        rng.random_range(1..=4),
                    )
                },
                predicted_final_iteration: iterations,
            }
        })
        .collect();
    arriving(
        0.0,
        App {
            id: AppId::from("skewed"),
            kind: AppKind::PerformanceCurve(PerformanceCurve {
                jobs,
                throughput: Default::default(),
                sensitivity: Default::default(),
            }),
        },
    )
}

/// An app alone on an empty cluster finishes at its T_cluster: of 100 generated apps of each
/// kind (single jobs and performance curves of Workload 1, successive halving of Workload 2,
/// performance curves with skewed job lengths), every one has rho within [0.95, 1.05].
#[test]
fn apps_alone_have_rho_one() {
    let mut outside = Vec::new();
    for seed in 0..100 {
        for kind in 0u8..3 {
            let app = match kind {
                0 => skewed_curve(seed),
                kind => generated(kind, 1, seed).apps.remove(0),
            };
            let report = run(&testbed(), vec![app], &SimulationConfig::default());
            let rho = report.apps[0].rho;
            if !(0.95..=1.05).contains(&rho) {
                outside.push((kind, seed, rho));
            }
        }
    }
    assert!(
        outside.is_empty(),
        "apps alone with rho outside [0.95, 1.05] (kind, seed, rho): {outside:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// An app's N_avg covers its own lifetime only: apps arriving after it has finished leave
    /// its rho unchanged, bit for bit.
    #[test]
    fn later_apps_leave_a_finished_apps_rho_alone(kind in 1u8..3, seed in 0u64..1000) {
        let workload = generated(kind, 4, seed);
        let cluster = testbed();
        let config = SimulationConfig::default();
        let before = run(&cluster, workload.apps.clone(), &config);
        let first_finish = before
            .apps
            .iter()
            .map(|app| app.arrival_seconds + app.completion_seconds)
            .fold(f64::INFINITY, f64::min);
        let mut extended = workload.apps.clone();
        for (n, mut late) in generated(kind, 3, seed + 1).apps.into_iter().enumerate() {
            late.app.id = AppId(format!("late-{n}"));
            late.arrival_seconds = first_finish + 1.0 + n as f64;
            extended.push(late);
        }
        let after = run(&cluster, extended, &config);
        for app in before.apps.iter().filter(|app| app.arrival_seconds + app.completion_seconds < first_finish + 1.0) {
            prop_assert_eq!(app, report_of(&after, &app.app.0));
        }
    }

    /// Every rho in a report is recomputed exactly from the report's own fields, in its JSON
    /// and in its CSV.
    #[test]
    fn rho_is_recomputed_from_the_report(kind in 1u8..3, seed in 0u64..1000) {
        let report = run(&testbed(), generated(kind, 5, seed).apps, &SimulationConfig::default());
        let json: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&report).expect("serialisable"))
                .expect("valid JSON");
        for app in json["apps"].as_array().expect("apps") {
            let field = |name: &str| app[name].as_f64().expect("a number");
            let recomputed = field("completion_seconds") / (field("t_cluster_seconds") * field("n_avg"));
            prop_assert_eq!(recomputed, field("rho"));
        }
        let csv = report.apps_csv();
        let mut lines = csv.lines();
        let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
        let column = |name: &str| header.iter().position(|column| *column == name).expect("a column");
        for line in lines {
            let cells: Vec<f64> = line.split(',').map(|cell| cell.parse().unwrap_or(f64::NAN)).collect();
            let recomputed = cells[column("completion_seconds")]
                / (cells[column("t_cluster_seconds")] * cells[column("n_avg")]);
            prop_assert_eq!(recomputed, cells[column("rho")]);
        }
    }

    /// Nothing depends on what apps are called or the order they are listed in: renaming and
    /// shuffling them leaves every app's finish time unchanged, under every policy.
    #[test]
    fn renaming_apps_changes_no_finish_time(kind in 1u8..3, seed in 0u64..1000, policy in 0usize..Policy::ALL.len()) {
        let workload = generated(kind, 6, seed);
        let mut renamed = workload.apps.clone();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        renamed.shuffle(&mut rng);
        let names: Vec<(AppId, AppId)> = renamed
            .iter_mut()
            .enumerate()
            .map(|(n, entry)| {
                // Names that sort the other way round from the originals.
                let new = AppId(format!("{:02}-renamed", 99 - n));
                (std::mem::replace(&mut entry.app.id, new.clone()), new)
            })
            .collect();
        let config = SimulationConfig {
            market: MarketConfig { policy: Policy::ALL[policy], ..MarketConfig::default() },
            ..SimulationConfig::default()
        };
        let cluster = testbed();
        let original = run(&cluster, workload.apps, &config);
        let permuted = run(&cluster, renamed, &config);
        for (old, new) in names {
            let (a, b) = (report_of(&original, &old.0), report_of(&permuted, &new.0));
            prop_assert_eq!(a.completion_seconds, b.completion_seconds, "{} / {}", old, new);
            prop_assert_eq!(a.rho, b.rho);
        }
    }
}

/// A job that lost GPUs at a lease's end and resumed on fewer widens again once its app holds
/// idle GPUs, instead of running narrow to the end of its phase. Workload 2 (30 apps, seed 2)
/// on 256 GPUs: `w2-app-0025` arrives at 39,399 s and holds its whole demand from about 44,000 s;
/// one of its four jobs was squeezed from 8 GPUs to 1 and, with 7 of the app's GPUs idle, ran
/// on 1 for 86,000 s, so the app took 140,000 s (2.9x T_cluster) under Themis, SRSF and SRTF
/// alike.
#[test]
fn a_squeezed_job_widens_again_when_its_app_has_idle_gpus() {
    let cluster =
        clusters::load_cluster(clusters::shipped::path(clusters::shipped::THEMIS_SIM_256))
            .expect("the shipped 256-GPU cluster");
    let workload = generate::workload2(&GeneratorConfig::philly_like(
        30,
        2,
        generate::DEFAULT_DURATION_SCALE,
    ))
    .expect("valid generator config");
    for policy in [Policy::Themis, Policy::Srtf] {
        let config = SimulationConfig {
            seed: 2,
            market: MarketConfig {
                policy,
                ..MarketConfig::default()
            },
            ..SimulationConfig::default()
        };
        let report = run(&cluster, workload.apps.clone(), &config);
        let app = report_of(&report, "w2-app-0025");
        assert!(
            app.completion_seconds < 1.25 * app.t_cluster_seconds,
            "{policy}: {} s against T_cluster {} s",
            app.completion_seconds,
            app.t_cluster_seconds
        );
    }
}

/// FNV-1a, 64 bits: a digest the checked-in file can be recomputed with anywhere.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Clusters of one GPU type give the same reports, byte for byte, as before GPU types had
/// speeds: every policy's JSON report and per-app CSV, as `agora simulate --out` writes them,
/// against digests of main's output (`homogeneous-digests.txt`).
#[test]
fn homogeneous_reports_are_unchanged() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let cluster = |name: &str| {
        clusters::load_cluster(clusters::shipped::path(&format!("{name}.toml"))).expect("shipped")
    };
    let example =
        agora_sim::trace::load_workload_json(root.join("workloads/example.json")).expect("shipped");
    let cases = [
        (
            "example-testbed",
            cluster("themis-testbed"),
            example.clone(),
        ),
        (
            "example-themis-sim-168",
            cluster("themis-sim-168"),
            example.clone(),
        ),
        ("example-themis-sim-256", cluster("themis-sim-256"), example),
        (
            "w1-testbed",
            cluster("themis-testbed"),
            generate::workload1(&GeneratorConfig::philly_like(3, 1, 0.005)).expect("valid"),
        ),
        (
            "w2-168",
            cluster("themis-sim-168"),
            generate::workload2(&GeneratorConfig::philly_like(3, 2, 0.002)).expect("valid"),
        ),
    ];
    let expected: Vec<String> = std::fs::read_to_string(root.join("tests/homogeneous-digests.txt"))
        .expect("checked in")
        .lines()
        .filter(|line| !line.starts_with('#'))
        .map(str::to_owned)
        .collect();
    for line in &expected {
        let mut fields = line.split(' ');
        let (Some(case), Some(policy)) = (fields.next(), fields.next()) else {
            panic!("malformed digest line {line:?}");
        };
        let (_, cluster, workload) = cases
            .iter()
            .find(|(name, ..)| *name == case)
            .expect("a known case");
        assert_eq!(
            &report_digests(case, policy, cluster, workload),
            line,
            "the report differs from main's"
        );
    }
    assert_eq!(
        expected.len(),
        cases.len() * 8,
        "every case under the eight policies"
    );
}

/// `<case> <policy> <digest of the JSON report> <digest of the per-app CSV>`, as `agora
/// simulate --out` writes them with the default flags.
fn report_digests(case: &str, policy: &str, cluster: &Cluster, workload: &Workload) -> String {
    let config = SimulationConfig {
        market: MarketConfig {
            policy: policy.parse().expect("a policy"),
            fairness_knob: 0.8,
            lease_length: Duration::from_secs(600),
            restart_pause: Duration::from_secs(35),
            ..MarketConfig::default()
        },
        seed: 0,
        ..SimulationConfig::default()
    };
    let report = simulate(cluster, workload, &config, |_| {}).expect("simulates");
    let mut json = serde_json::to_string_pretty(&report).expect("serialisable");
    json.push('\n');
    format!(
        "{case} {policy} {:016x} {:016x}",
        fnv1a(json.as_bytes()),
        fnv1a(report.apps_csv().as_bytes())
    )
}

/// A cluster of three GPU types without CPUs or memory gives the same reports, byte for byte,
/// as main's before machines had them, under every policy (`mixed-digests.txt`).
#[test]
fn mixed_cluster_reports_are_unchanged() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let cluster =
        clusters::load_cluster(clusters::shipped::path("gavel-108.toml")).expect("shipped");
    let example =
        agora_sim::trace::load_workload_json(root.join("workloads/example.json")).expect("shipped");
    let expected =
        std::fs::read_to_string(root.join("tests/mixed-digests.txt")).expect("checked in");
    let lines: Vec<&str> = expected
        .lines()
        .filter(|line| !line.starts_with('#'))
        .collect();
    for policy in Policy::ALL {
        let line = lines
            .iter()
            .find(|line| line.split(' ').nth(1) == Some(policy.name()))
            .unwrap_or_else(|| panic!("mixed-digests.txt has no line for {policy}"));
        let actual = report_digests("example-gavel-108", policy.name(), &cluster, &example);
        assert_eq!(&actual, line, "the report differs from main's");
    }
}

/// Without CPUs or memory, Synergy-Tune's reports are its base policy's, byte for byte but for
/// the policy's name.
#[test]
fn synergy_tune_is_its_base_policy_without_cpus_or_memory() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let cluster =
        clusters::load_cluster(clusters::shipped::path("gavel-108.toml")).expect("shipped");
    let example =
        agora_sim::trace::load_workload_json(root.join("workloads/example.json")).expect("shipped");
    for (tune, base) in [
        (Policy::SynergySrtf, Policy::Srtf),
        (Policy::SynergyFtf, Policy::GavelFtf),
    ] {
        let report = |policy: Policy| {
            let mut report = simulate(&cluster, &example, &config(policy), |_| {}).expect("runs");
            report.summary.policy = base;
            serde_json::to_string(&report).expect("serialisable")
        };
        assert_eq!(report(tune), report(base), "{tune}");
    }
}

/// The simulator runs jobs at the speed their share of the machine's CPUs gives them. One
/// machine of 4 GPUs and 12 CPUs; a CPU-hungry and a CPU-light job of 1000 iterations of 1 s on
/// 2 GPUs each, both arriving at 0 (the split of `tests/engine/resources.rs`): with
/// GPU-proportional CPUs both take 500 s; by sensitivity the hungry one runs at 5/3 and takes
/// 300 s, the light one still 500 s.
#[test]
fn jobs_run_at_the_speed_of_their_cpu_share() {
    use agora_market::resources::{ResourceAllocation, Sensitivity};
    let cluster = agora_market::cluster_file::parse_cluster(
        "racks = [{ machines = [{ slots = 1, gpus_per_slot = 4, gpu_type = \"v100\", cpus = 12 }] }]",
        std::path::Path::new("one-machine.toml"),
    )
    .expect("valid");
    let entry = |id: &str, cpus_per_gpu: Vec<[f64; 2]>| {
        let mut app = arriving(0.0, single(id, 1000, 2));
        *app.app.sensitivity_mut() = Sensitivity {
            cpus_per_gpu,
            memory_gib_per_gpu: Vec::new(),
        };
        app
    };
    let workload = Workload {
        apps: vec![
            entry("hungry", vec![[3.0, 1.0], [6.0, 2.0]]),
            entry("light", vec![[1.0, 1.0]]),
        ],
    };
    for (allocation, hungry_seconds) in [
        (ResourceAllocation::GpuProportional, 500.0),
        (ResourceAllocation::SensitivityAware, 300.0),
    ] {
        let config = SimulationConfig {
            market: MarketConfig {
                resource_allocation: allocation,
                restart_pause: Duration::ZERO,
                ..MarketConfig::default()
            },
            ..SimulationConfig::default()
        };
        let report = simulate(&cluster, &workload, &config, |_| {}).expect("simulates");
        let completion = |id: &str| {
            report
                .apps
                .iter()
                .find(|app| app.app.0 == id)
                .expect("reported")
                .completion_seconds
        };
        // Milestones are handled a millisecond after they fall due.
        assert!(
            (completion("hungry") - hungry_seconds).abs() < 0.01,
            "{allocation:?}"
        );
        assert!((completion("light") - 500.0).abs() < 0.01, "{allocation:?}");
    }
}
