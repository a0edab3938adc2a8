//! The simulator's inputs: cluster files, the model catalogue, the workload generators and the
//! trace importers.

use std::path::{Path, PathBuf};

use agora_market::app::{AppKind, PlacementSlowdown};
use agora_market::cluster_file::{gpu_count, parse_cluster_spec, ClusterFileError};
use agora_market::topology::Cluster;
use agora_sim::clusters::{load_cluster, load_cluster_spec, machine_count, scale_cluster, shipped};
use agora_sim::generate::{self, workload1, workload2, GeneratorConfig, GeneratorError};
use agora_sim::models::{self, Sensitivity, CATEGORY_MIX};
use agora_sim::trace::{
    self, check_workload, load_tiresias_csv, load_workload_json, parse_tiresias_csv,
    parse_workload_json, CsvProblem, TraceError,
};
use agora_sim::workload::Workload;

fn shared_data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/data")
        .join(file)
}

fn scratch_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("agora-sim-world-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write scratch file");
    path
}

// ---------------------------------------------------------------- clusters

#[test]
fn shipped_cluster_files_have_their_stated_sizes() {
    for (file, gpus, machines, racks) in [
        (shipped::THEMIS_TESTBED, 64, 20, 3),
        (shipped::THEMIS_SIM_168, 168, 38, 5),
        (shipped::THEMIS_SIM_256, 256, 52, 7),
    ] {
        let path = shipped::path(file);
        let spec = load_cluster_spec(&path).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(gpu_count(&spec), gpus, "{file}");
        assert_eq!(machine_count(&spec), machines, "{file}");
        assert_eq!(spec.racks.len(), racks, "{file}");
        assert!(
            spec.racks.iter().all(|rack| rack.machines.len() <= 8),
            "{file}"
        );
        let cluster = load_cluster(&path).unwrap_or_else(|error| panic!("{error}"));
        assert_eq!(cluster.len(), gpus as usize, "{file}");
    }
}

#[test]
fn testbed_machines_are_k80_boards() {
    let cluster = load_cluster(shipped::path(shipped::THEMIS_TESTBED)).expect("loads");
    let two_gpu_machines = (0..20u32)
        .filter(|&machine| {
            cluster
                .gpus()
                .filter(|(_, gpu)| gpu.location.machine == machine)
                .count()
                == 2
        })
        .count();
    assert_eq!(two_gpu_machines, 8);
    assert!(cluster.gpus().all(|(_, gpu)| gpu.gpu_type == "K80"));
    let slots: std::collections::BTreeSet<u32> =
        cluster.gpus().map(|(_, gpu)| gpu.location.slot).collect();
    assert_eq!(slots.len(), 8 + 12 * 2, "one K80 board (2 GPUs) per slot");
}

#[test]
fn the_engines_plain_spec_form_is_a_valid_file() {
    let text = r#"racks = [{ machines = [{ slots = [{ gpus = 2, gpu_type = "K80" }] }, { slots = [{ gpus = 1, gpu_type = "P100", count = 3 }] }] }]"#;
    let spec = parse_cluster_spec(text, Path::new("plain.toml")).expect("valid");
    assert_eq!(gpu_count(&spec), 5);
    assert_eq!(spec.racks[0].machines[1].slots.len(), 3);
    Cluster::from_spec(&spec).expect("valid cluster");
}

#[test]
fn malformed_cluster_files_give_errors_naming_the_file() {
    let broken = scratch_file(
        "broken.toml",
        "[[racks]]\n[[racks.machines]]\nslots = \"four\"\n",
    );
    let error = load_cluster(&broken).expect_err("bad slots");
    assert!(matches!(error, ClusterFileError::Parse { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains("broken.toml"), "{message}");
    assert!(message.contains("line 3"), "{message}");

    let unknown = scratch_file(
        "unknown.toml",
        "[[racks]]\n[[racks.machines]]\nslots = 1\ngpus_per_slot = 1\ngpu_type = \"K80\"\ngpu = 2\n",
    );
    let message = load_cluster(&unknown)
        .expect_err("unknown field")
        .to_string();
    assert!(
        message.contains("unknown.toml") && message.contains("gpu"),
        "{message}"
    );

    let zero = scratch_file(
        "zero.toml",
        "[[racks]]\n[[racks.machines]]\ncount = 0\nslots = 1\ngpus_per_slot = 1\ngpu_type = \"K80\"\n",
    );
    let error = load_cluster(&zero).expect_err("zero count");
    assert!(matches!(error, ClusterFileError::Invalid { .. }), "{error}");
    assert!(error.to_string().contains("zero.toml"));
    assert!(
        error.to_string().contains("racks[0].machines[0]"),
        "{error}"
    );

    let missing_type = scratch_file("notype.toml", "[[racks]]\n[[racks.machines]]\nslots = 2\n");
    let message = load_cluster(&missing_type)
        .expect_err("no type")
        .to_string();
    assert!(message.contains("gpus_per_slot"), "{message}");

    let absent = Path::new("/nonexistent/agora/cluster.toml");
    let error = load_cluster(absent).expect_err("no such file");
    assert!(matches!(error, ClusterFileError::Io { .. }));
    assert!(error
        .to_string()
        .contains("/nonexistent/agora/cluster.toml"));
}

#[test]
fn scaled_clusters_keep_the_machine_mix() {
    let spec = load_cluster_spec(shipped::path(shipped::THEMIS_SIM_256)).expect("loads");
    let half = scale_cluster(&spec, 0.5).expect("valid fraction");
    assert_eq!(machine_count(&half), 26);
    assert_eq!(
        gpu_count(&half),
        128,
        "every group of the 256 mix halves exactly"
    );
    let quarter = scale_cluster(&spec, 0.25).expect("valid fraction");
    assert_eq!(machine_count(&quarter), 13);
    assert_eq!(gpu_count(&quarter), 64);
    assert_eq!(scale_cluster(&spec, 1.0).expect("valid fraction"), spec);
    for scaled in [&half, &quarter] {
        Cluster::from_spec(scaled).expect("valid cluster");
        let kinds = |spec: &agora_market::topology::ClusterSpec| {
            let mut kinds: Vec<u32> = spec
                .racks
                .iter()
                .flat_map(|rack| &rack.machines)
                .map(|machine| machine.slots.iter().map(|slot| slot.gpus).sum())
                .collect();
            kinds.dedup();
            kinds.sort_unstable();
            kinds.dedup();
            kinds
        };
        assert_eq!(kinds(scaled), vec![1, 4, 8], "every machine kind survives");
    }
    let testbed = load_cluster_spec(shipped::path(shipped::THEMIS_TESTBED)).expect("loads");
    assert_eq!(
        gpu_count(&scale_cluster(&testbed, 0.5).expect("valid fraction")),
        32
    );
    assert_eq!(
        machine_count(&scale_cluster(&testbed, 0.01).expect("valid fraction")),
        1,
        "never empty"
    );
    assert!(scale_cluster(&testbed, 0.0).is_err());
    assert!(scale_cluster(&testbed, 1.5).is_err());
    assert!(scale_cluster(&testbed, f64::NAN).is_err());
    let sim168 = load_cluster_spec(shipped::path(shipped::THEMIS_SIM_168)).expect("loads");
    assert_eq!(
        gpu_count(&scale_cluster(&sim168, 0.5).expect("valid fraction")),
        84
    );
    let sim168_quarter = scale_cluster(&sim168, 0.25).expect("valid fraction");
    assert_eq!(
        (machine_count(&sim168_quarter), gpu_count(&sim168_quarter)),
        (10, 44)
    );
}

// ---------------------------------------------------------------- models

#[test]
fn catalogue_classes_follow_table_1() {
    for name in ["vgg16", "vgg19", "vgg11", "alexnet", "langmodel", "gnmt"] {
        let spec = models::lookup(name).expect(name);
        assert_eq!(spec.sensitivity, Sensitivity::NetworkIntensive, "{name}");
        assert_eq!(spec.slowdown(), models::NETWORK_INTENSIVE_SLOWDOWN);
    }
    for name in [
        "inception-v3",
        "inception3",
        "inception4",
        "resnet50",
        "resnet101",
        "resnet152",
        "googlenet",
        "bi-att-flow",
        "transformer",
        "wavenet",
        "deepspeech",
    ] {
        let spec = models::lookup(name).expect(name);
        assert_eq!(spec.sensitivity, Sensitivity::ComputeIntensive, "{name}");
    }
    assert_eq!(
        models::NETWORK_INTENSIVE_SLOWDOWN,
        PlacementSlowdown {
            same_slot: 1.0,
            same_machine: 1.1,
            same_rack: 1.5,
            cross_rack: 2.0
        }
    );
    assert_eq!(models::slowdown_of("bert-large"), models::DEFAULT_SLOWDOWN);
    assert_eq!(models::DEFAULT_SLOWDOWN, PlacementSlowdown::default());
}

// ---------------------------------------------------------------- generators

type Generator = fn(&GeneratorConfig) -> Result<Workload, GeneratorError>;

fn config(apps: usize, seed: u64) -> GeneratorConfig {
    GeneratorConfig {
        apps,
        seed,
        ..GeneratorConfig::default()
    }
}

fn jobs_of(kind: &AppKind) -> usize {
    match kind {
        AppKind::SingleJob { .. } => 1,
        AppKind::SuccessiveHalving(search) => search.jobs.len(),
        AppKind::PerformanceCurve(search) => search.jobs.len(),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[test]
fn generators_are_deterministic_per_seed() {
    for generator in [workload1, workload2] {
        let a = generator(&config(40, 7)).expect("valid config");
        let b = generator(&config(40, 7)).expect("valid config");
        assert_eq!(a, b);
        let c = generator(&config(40, 8)).expect("valid config");
        assert_ne!(a, c);
        let shorter = generator(&config(10, 7)).expect("valid config");
        assert_eq!(
            shorter.apps[..],
            a.apps[..10],
            "apps do not depend on later apps"
        );
    }
}

#[test]
fn generated_workloads_are_valid() {
    for generator in [workload1, workload2] {
        let workload = generator(&config(300, 3)).expect("valid config");
        assert_eq!(workload.apps.len(), 300);
        check_workload(&workload).unwrap_or_else(|problem| panic!("{problem}"));
        let mut previous = 0.0;
        for entry in &workload.apps {
            assert!(entry.arrival_seconds >= previous, "arrivals in order");
            previous = entry.arrival_seconds;
            let app = &entry.app;
            assert!(!app.running_jobs().is_empty(), "{}", app.id);
            assert!(!app.is_finished());
            assert!(app.total_work_gpu_seconds() > 0.0);
            for job in app.running_jobs() {
                assert!(job.iterations_remaining >= 1.0);
                assert!(job.serial_iteration_time > 0.0);
                assert!(job.max_gpus >= 1);
            }
            assert!(models::lookup(&entry.model).is_some_and(|spec| spec.in_table4));
            assert_eq!(entry.job_quality.len(), jobs_of(&app.kind));
        }
        assert_eq!(workload.apps[0].arrival_seconds, 0.0);
    }
}

#[test]
fn app_ids_are_numbered_per_workload() {
    let w1 = workload1(&config(12, 1)).expect("valid");
    let w2 = workload2(&config(12, 1)).expect("valid");
    assert_eq!(w1.apps[7].app.id.0, "w1-app-0007");
    assert_eq!(w2.apps[11].app.id.0, "w2-app-0011");
    for (a, b) in w1.apps.iter().zip(&w2.apps) {
        assert_eq!(a.arrival_seconds, b.arrival_seconds, "same arrivals (§6.1)");
        assert_eq!(a.model, b.model);
    }
}

#[test]
fn workload1_matches_the_traces_shape() {
    let workload = workload1(&config(4000, 11)).expect("valid");
    let counts: Vec<f64> = workload
        .apps
        .iter()
        .map(|entry| jobs_of(&entry.app.kind) as f64)
        .collect();
    let median_jobs = median(counts.clone());
    assert!((70.0..=80.0).contains(&median_jobs), "median {median_jobs}");
    let single = counts.iter().filter(|&&count| count == 1.0).count() as f64 / 4000.0;
    assert!((0.08..=0.12).contains(&single), "single-job share {single}");
    assert!(counts.iter().all(|&count| count <= 100.0));
    for entry in &workload.apps {
        match &entry.app.kind {
            AppKind::SingleJob { job, .. } => assert!(job.max_gpus <= 2),
            AppKind::PerformanceCurve(search) => {
                let gpus = search.jobs[0].job.max_gpus;
                assert!(gpus == 1 || gpus == 2);
                for curve in &search.jobs {
                    assert_eq!(curve.job.max_gpus, gpus, "one demand per app");
                    assert!(curve.predicted_final_iteration <= curve.job.total_iterations);
                    assert!(curve.predicted_final_iteration >= 1);
                }
            }
            AppKind::SuccessiveHalving(_) => panic!("workload 1 has no successive halving"),
        }
    }
    // GPU time at the default scale: the trace's 11.5 GPU-days median, scaled.
    let scale = GeneratorConfig::default().duration_scale;
    let median_days = median(
        workload
            .apps
            .iter()
            .map(|entry| entry.app.total_work_gpu_seconds() / 86_400.0 / scale)
            .collect(),
    );
    assert!(
        (10.0..=13.0).contains(&median_days),
        "median app {median_days} GPU-days"
    );
}

#[test]
fn workload2_halves_its_jobs_and_splits_the_budget() {
    let workload = workload2(&config(500, 5)).expect("valid");
    for entry in &workload.apps {
        let AppKind::SuccessiveHalving(search) = &entry.app.kind else {
            panic!("workload 2 is successive halving");
        };
        let jobs = search.jobs_per_phase[0];
        assert!((4..=64).contains(&jobs) && jobs.is_power_of_two());
        assert_eq!(search.jobs.len(), jobs as usize);
        assert_eq!(*search.jobs_per_phase.last().expect("phases"), 1);
        for pair in search.jobs_per_phase.windows(2) {
            assert_eq!(pair[1] * 2, pair[0]);
        }
        assert_eq!(search.phase_iterations.len(), search.jobs_per_phase.len());
        assert!(search
            .phase_iterations
            .iter()
            .all(|&iterations| iterations >= 1));
        let gpus = search.jobs[0].max_gpus;
        assert!([2, 4, 8].contains(&gpus));
        let total: u64 = search.phase_iterations.iter().sum();
        assert!(search.jobs.iter().all(|job| job.total_iterations == total));
        assert!(entry.job_quality.values().all(|q| (0.0..1.0).contains(q)));
        // The budget is spent evenly: every phase but the last within one iteration of B/P.
        let mut times: Vec<f64> = search
            .jobs
            .iter()
            .map(|job| job.serial_iteration_time)
            .collect();
        times.sort_by(f64::total_cmp);
        let median_time = times[times.len() / 2];
        let phases = search.phase_iterations.len() as f64;
        let planned: f64 = search
            .jobs_per_phase
            .iter()
            .zip(&search.phase_iterations)
            .map(|(&n, &it)| f64::from(n) * it as f64 * median_time)
            .sum();
        assert!(planned <= search.budget_gpu_seconds * (1.0 + 1e-9));
        let first = f64::from(search.jobs_per_phase[0]) * search.phase_iterations[0] as f64;
        let share = search.budget_gpu_seconds / phases / median_time;
        if share >= f64::from(search.jobs_per_phase[0]) {
            assert!(first <= share && first > share - f64::from(search.jobs_per_phase[0]));
        }
    }
    assert_eq!(
        generate::split_budget(10_000.0, &[4, 2, 1], 100.0),
        vec![8, 16, 36]
    );
}

#[test]
fn the_model_mix_follows_table_4() {
    let apps = 4000;
    let workload = workload1(&config(apps, 21)).expect("valid");
    for (category, share) in CATEGORY_MIX {
        let count = workload
            .apps
            .iter()
            .filter(|entry| {
                models::lookup(&entry.model).map(|spec| spec.category) == Some(category)
            })
            .count();
        let observed = count as f64 / apps as f64;
        assert!(
            (observed - share).abs() < 0.03,
            "{category:?}: {observed} vs {share}"
        );
    }
    let network = network_share(&workload);
    let expected = models::table4_network_intensive_fraction();
    assert!((network - expected).abs() < 0.03, "{network} vs {expected}");
}

fn network_share(workload: &Workload) -> f64 {
    let network = workload
        .apps
        .iter()
        .filter(|entry| {
            let AppKind::PerformanceCurve(search) = &entry.app.kind else {
                return match &entry.app.kind {
                    AppKind::SingleJob { job, .. } => {
                        job.slowdown == models::NETWORK_INTENSIVE_SLOWDOWN
                    }
                    AppKind::SuccessiveHalving(search) => {
                        search.jobs[0].slowdown == models::NETWORK_INTENSIVE_SLOWDOWN
                    }
                    AppKind::PerformanceCurve(_) => unreachable!(),
                };
            };
            search.jobs[0].job.slowdown == models::NETWORK_INTENSIVE_SLOWDOWN
        })
        .count();
    network as f64 / workload.apps.len() as f64
}

#[test]
fn the_network_intensive_fraction_overrides_the_mix() {
    let cases: [(f64, Generator); 6] = [
        (0.0, workload1),
        (0.2, workload1),
        (0.5, workload1),
        (0.8, workload1),
        (1.0, workload1),
        (0.7, workload2),
    ];
    for (fraction, generator) in cases {
        let knobs = GeneratorConfig {
            network_intensive_fraction: Some(fraction),
            ..config(2000, 13)
        };
        {
            let workload = generator(&knobs).expect("valid");
            let share = network_share(&workload);
            assert!((share - fraction).abs() < 0.035, "{share} vs {fraction}");
            for entry in &workload.apps {
                let spec = models::lookup(&entry.model).expect("catalogue model");
                let network = spec.sensitivity == Sensitivity::NetworkIntensive;
                let slowdown = entry.app.running_jobs()[0].slowdown;
                assert_eq!(slowdown == models::NETWORK_INTENSIVE_SLOWDOWN, network);
            }
        }
    }
}

#[test]
fn arrivals_are_poisson_with_the_configured_mean() {
    let knobs = GeneratorConfig {
        mean_interarrival_seconds: 300.0,
        ..config(5001, 2)
    };
    let workload = workload1(&knobs).expect("valid");
    let mean = workload.apps[5000].arrival_seconds / 5000.0;
    assert!((mean - 300.0).abs() < 15.0, "mean gap {mean}");
    let load = GeneratorConfig::default().mean_offered_gpus();
    assert!((load - 143.0).abs() < 2.0, "philly-like load {load} GPUs");
}

#[test]
fn bad_knobs_are_rejected() {
    let bad = [
        GeneratorConfig {
            duration_scale: 0.0,
            ..config(1, 0)
        },
        GeneratorConfig {
            mean_interarrival_seconds: f64::NAN,
            ..config(1, 0)
        },
        GeneratorConfig {
            network_intensive_fraction: Some(1.5),
            ..config(1, 0)
        },
    ];
    for knobs in bad {
        assert!(workload1(&knobs).is_err());
        assert!(workload2(&knobs).is_err());
    }
    assert_eq!(
        workload1(&GeneratorConfig {
            duration_scale: -1.0,
            ..config(1, 0)
        }),
        Err(GeneratorError::DurationScale(-1.0))
    );
    assert_eq!(workload2(&config(0, 0)), Err(GeneratorError::NoApps));
}

#[test]
fn tiny_scales_still_give_runnable_apps() {
    let knobs = GeneratorConfig {
        duration_scale: 1e-9,
        ..config(50, 4)
    };
    for generator in [workload1, workload2] {
        let workload = generator(&knobs).expect("valid");
        check_workload(&workload).unwrap_or_else(|problem| panic!("{problem}"));
    }
}

// ---------------------------------------------------------------- traces

#[test]
fn tiresias_trace_imports_one_app_per_row() {
    let path = shared_data("tiresias-60-jobs.csv");
    let workload = load_tiresias_csv(&path).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(workload.apps.len(), 60);
    check_workload(&workload).unwrap_or_else(|problem| panic!("{problem}"));
    let first = &workload.apps[0];
    assert_eq!(first.app.id.0, "trace-0");
    assert_eq!(first.arrival_seconds, 0.0);
    assert_eq!(first.model, "vgg19");
    let AppKind::SingleJob { job, .. } = &first.app.kind else {
        panic!("one job per app");
    };
    assert_eq!(job.max_gpus, 1);
    assert_eq!(job.total_iterations, 606);
    assert_eq!(job.serial_iteration_time, 164.0 * 1.0 / 606.0);
    assert_eq!(job.slowdown, models::NETWORK_INTENSIVE_SLOWDOWN);
    assert_eq!(first.app.total_work_gpu_seconds(), 164.0);
    // Job 1: 8 GPUs for 147 s over 133 iterations.
    let second = &workload.apps[1];
    assert_eq!(second.app.id.0, "trace-1");
    assert_eq!(second.arrival_seconds, 30.0);
    let AppKind::SingleJob { job, .. } = &second.app.kind else {
        panic!("one job per app");
    };
    assert_eq!(job.max_gpus, 8);
    assert_eq!(job.serial_iteration_time, 147.0 * 8.0 / 133.0);
    let ids: std::collections::BTreeSet<_> = workload.apps.iter().map(|a| &a.app.id).collect();
    assert_eq!(ids.len(), 60);
}

const HEADER: &str = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n";

#[test]
fn unknown_models_get_the_default_slowdown() {
    let text = format!("{HEADER}7,2,10,100,bert-large,50,0\n3,4,5,10,inception3,20,5\n");
    let workload = parse_tiresias_csv(&text, Path::new("t.csv")).expect("valid");
    assert_eq!(workload.apps[0].app.id.0, "trace-3", "sorted by arrival");
    let unknown = &workload.apps[1];
    assert_eq!(unknown.model, "bert-large");
    assert_eq!(
        unknown.app.running_jobs()[0].slowdown,
        models::DEFAULT_SLOWDOWN
    );
    assert_eq!(unknown.app.running_jobs()[0].serial_iteration_time, 1.0);
    assert_eq!(
        workload.apps[0].app.running_jobs()[0].slowdown,
        models::COMPUTE_INTENSIVE_SLOWDOWN
    );
}

#[test]
fn tiresias_csv_accepts_crlf_blank_lines_and_reordered_columns() {
    let text = "model_name, job_id ,num_gpu,submit_time,iterations,duration,interval\r\n\r\nvgg16,a1,2,0,10,5,0\r\n";
    let workload = parse_tiresias_csv(text, Path::new("t.csv")).expect("valid");
    assert_eq!(workload.apps[0].app.id.0, "trace-a1");
    assert_eq!(workload.apps[0].app.running_jobs()[0].max_gpus, 2);
}

fn csv_error(text: &str) -> (usize, CsvProblem, String) {
    match parse_tiresias_csv(text, Path::new("jobs.csv")) {
        Err(error @ TraceError::Csv { .. }) => {
            let message = error.to_string();
            let TraceError::Csv { line, problem, .. } = error else {
                unreachable!()
            };
            assert!(
                message.starts_with(&format!("jobs.csv:{line}: ")),
                "{message}"
            );
            (line, problem, message)
        }
        other => panic!("expected a CSV error, got {other:?}"),
    }
}

#[test]
fn malformed_tiresias_rows_are_rejected_with_their_line() {
    let (line, problem, message) = csv_error(&format!(
        "{HEADER}0,1,0,606,vgg19,164,30\n1,x,30,133,vgg11,147,23\n"
    ));
    assert_eq!(line, 3);
    assert!(matches!(
        problem,
        CsvProblem::BadField {
            field: "num_gpu",
            column: 2,
            ..
        }
    ));
    assert!(
        message.contains("`num_gpu`") && message.contains("`x`"),
        "{message}"
    );

    let (line, problem, _) = csv_error(&format!("{HEADER}0,1,0,606,vgg19,164\n"));
    assert_eq!(line, 2);
    assert_eq!(
        problem,
        CsvProblem::FieldCount {
            expected: 7,
            found: 6
        }
    );

    let (_, problem, _) = csv_error(&format!("{HEADER}0,0,0,606,vgg19,164,3\n"));
    assert!(matches!(
        problem,
        CsvProblem::BadField {
            field: "num_gpu",
            ..
        }
    ));
    let (_, problem, _) = csv_error(&format!("{HEADER}0,1,0,0,vgg19,164,3\n"));
    assert!(matches!(
        problem,
        CsvProblem::BadField {
            field: "iterations",
            ..
        }
    ));
    let (_, problem, _) = csv_error(&format!("{HEADER}0,1,-5,6,vgg19,164,3\n"));
    assert!(matches!(
        problem,
        CsvProblem::BadField {
            field: "submit_time",
            ..
        }
    ));
    let (_, problem, _) = csv_error(&format!("{HEADER}0,1,0,6,vgg19,0,3\n"));
    assert!(matches!(
        problem,
        CsvProblem::BadField {
            field: "duration",
            ..
        }
    ));
    let (_, problem, _) = csv_error(&format!("{HEADER}0,1,0,6,,4,3\n"));
    assert!(matches!(
        problem,
        CsvProblem::BadField {
            field: "model_name",
            ..
        }
    ));

    let (line, problem, _) =
        csv_error(&format!("{HEADER}4,1,0,6,vgg19,4,3\n\n4,1,0,6,vgg19,4,3\n"));
    assert_eq!(line, 4);
    assert_eq!(
        problem,
        CsvProblem::DuplicateJob {
            job_id: "4".into(),
            first_line: 2
        }
    );

    let (line, problem, _) = csv_error("0,1,0,606,vgg19,164,30\n");
    assert_eq!(line, 1);
    assert!(
        matches!(problem, CsvProblem::BadHeader(_)),
        "header required"
    );
    let (_, problem, _) = csv_error("job_id,num_gpu,submit_time,iterations,model_name,duration\n");
    assert!(matches!(problem, CsvProblem::BadHeader(reason) if reason.contains("interval")));
    let (_, problem, _) = csv_error("");
    assert_eq!(problem, CsvProblem::MissingHeader);
}

#[test]
fn a_missing_trace_file_is_named() {
    let error = load_tiresias_csv("/nonexistent/trace.csv").expect_err("absent");
    assert!(
        error.to_string().contains("/nonexistent/trace.csv"),
        "{error}"
    );
}

#[test]
fn json_workloads_round_trip() {
    let workload = workload2(&config(5, 9)).expect("valid");
    let path =
        std::env::temp_dir().join(format!("agora-sim-roundtrip-{}.json", std::process::id()));
    trace::save_workload_json(&workload, &path).expect("writes");
    let back = load_workload_json(&path).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(back.apps.len(), workload.apps.len());
    for (read, written) in back.apps.iter().zip(&workload.apps) {
        assert!(
            read == written,
            "{} changed in the round trip",
            written.app.id
        );
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn the_example_workload_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/example.json");
    let workload = load_workload_json(&path).unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(workload.apps.len(), 3);
    let kinds: Vec<&str> = workload
        .apps
        .iter()
        .map(|entry| match entry.app.kind {
            AppKind::SingleJob { .. } => "single_job",
            AppKind::SuccessiveHalving(_) => "successive_halving",
            AppKind::PerformanceCurve(_) => "performance_curve",
        })
        .collect();
    assert_eq!(
        kinds,
        ["single_job", "performance_curve", "successive_halving"]
    );
}

#[test]
fn json_errors_give_file_line_and_column() {
    let text = "{\n  \"apps\": [],\n  \"extra\": 1\n}\n";
    match parse_workload_json(text, Path::new("w.json")) {
        Err(error @ TraceError::Json { line: 3, .. }) => {
            let message = error.to_string();
            assert!(message.starts_with("w.json:3:"), "{message}");
            assert!(message.contains("extra"), "{message}");
        }
        other => panic!("expected a JSON error on line 3, got {other:?}"),
    }
    let bad_app = r#"{"apps": [{"arrival_seconds": 0, "model": "x", "app": {"id": "a", "kind": "single_job", "job": {"id": "j", "total_iterations": 10, "serial_iteration_time": 1.0, "max_gpus": 0}}}]}"#;
    let error = parse_workload_json(bad_app, Path::new("w.json")).expect_err("zero GPUs");
    assert!(matches!(error, TraceError::Invalid { .. }));
    assert!(error.to_string().contains("max_gpus"), "{error}");
    let duplicate = format!(
        r#"{{"apps": [{app}, {app}]}}"#,
        app = r#"{"arrival_seconds": 0, "model": "x", "app": {"id": "a", "kind": "single_job", "job": {"id": "j", "total_iterations": 10, "serial_iteration_time": 1.0, "max_gpus": 1}}}"#
    );
    let error = parse_workload_json(&duplicate, Path::new("w.json")).expect_err("twice");
    assert!(error.to_string().contains("appears twice"), "{error}");
}

#[test]
fn dynamic_apps_scale_their_batch_size_and_the_static_ones_are_untouched() {
    for generator in [workload1 as Generator, workload2] {
        let fixed = generator(&config(40, 7)).expect("valid");
        let adapting = generator(&GeneratorConfig {
            dynamic_fraction: 0.5,
            ..config(40, 7)
        })
        .expect("valid");
        let mut dynamic_apps = 0;
        for (before, after) in fixed.apps.iter().zip(&adapting.apps) {
            let mut without_changes = after.app.clone();
            match &mut without_changes.kind {
                AppKind::SingleJob { job, .. } => job.speed_changes.clear(),
                AppKind::SuccessiveHalving(search) => search
                    .jobs
                    .iter_mut()
                    .for_each(|job| job.speed_changes.clear()),
                AppKind::PerformanceCurve(search) => search
                    .jobs
                    .iter_mut()
                    .for_each(|curve| curve.job.speed_changes.clear()),
            }
            assert_eq!(before.app, without_changes, "only the schedules differ");
            let jobs = after.app.jobs();
            if jobs.iter().all(|job| job.speed_changes.is_empty()) {
                continue;
            }
            dynamic_apps += 1;
            for job in jobs.iter().filter(|job| !job.speed_changes.is_empty()) {
                let last = job.speed_changes.last().expect("changes");
                let speedup = job.serial_iteration_time / last.serial_iteration_time;
                assert!(
                    generate::DYNAMIC_TOTAL_SPEEDUP.contains(&speedup)
                        || job.speed_changes.len() < generate::DYNAMIC_CHANGE_FRACTIONS.len(),
                    "{speedup}"
                );
                assert!(job.speed_changes.len() <= 3);
            }
        }
        assert!((10..=30).contains(&dynamic_apps), "{dynamic_apps} of 40");
    }
}
