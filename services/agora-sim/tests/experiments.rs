//! Every experiment runs at a tiny scale and writes its CSV and SVG files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agora_market::policy::Policy;
use agora_sim::experiments::{run_experiment, ExperimentScale, EXPERIMENTS};

fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "agora-sim-experiments-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Runs `name` tiny; checks each CSV's header and that each SVG is an SVG.
fn check(name: &str, csvs: &[(&str, &str)], svgs: &[&str]) -> PathBuf {
    let dir = out_dir(name);
    let output = run_experiment(name, &dir, ExperimentScale::tiny())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(output.name, name);
    assert!(!output.summary.is_empty());
    for (file, header) in csvs {
        let text = read(&dir, file);
        assert_eq!(text.lines().next(), Some(*header), "{file}");
        assert!(text.lines().count() > 1, "{file} has no rows");
        assert!(output.files.contains(&dir.join(file)));
    }
    for file in svgs {
        let text = read(&dir, file);
        assert!(text.contains("<svg"), "{file} is not an SVG");
        assert!(output.files.contains(&dir.join(file)));
    }
    dir
}

#[test]
fn every_listed_experiment_is_known_and_unknown_names_are_rejected() {
    assert_eq!(EXPERIMENTS.len(), 13);
    let error = run_experiment("fig99", &out_dir("unknown"), ExperimentScale::tiny())
        .expect_err("not an experiment");
    assert!(error.to_string().contains("fig18-liar"), "{error}");
}

#[test]
fn rho_cdf() {
    check(
        "fig9-10-rho-cdf",
        &[
            ("rho-cdf.csv", "workload,policy,rank,cdf,rho"),
            (
                "summary.csv",
                "workload,policy,apps,unfinished_apps,max_rho,p95_rho,median_rho,jains_index,apps_rho_above_one,apps_rho_above_two",
            ),
        ],
        &[
            "fig9-workload1-rho-cdf.svg",
            "fig10-workload2-rho-cdf.svg",
        ],
    );
}

#[test]
fn gpu_time() {
    let dir = check(
        "fig11-12-gpu-time",
        &[(
            "gpu-time.csv",
            "workload,policy,total_gpu_hours,relative_to_themis",
        )],
        &["fig11-12-gpu-time.svg"],
    );
    // Two workloads x every policy.
    assert_eq!(
        read(&dir, "gpu-time.csv").lines().count(),
        1 + 2 * Policy::ALL.len()
    );
}

#[test]
fn placement() {
    check(
        "fig13-placement",
        &[("placement.csv", "workload,policy,rank,cdf,placement_score")],
        &[
            "fig13-workload1-placement-cdf.svg",
            "fig13-workload2-placement-cdf.svg",
        ],
    );
}

#[test]
fn contention() {
    let dir = check(
        "fig14-contention",
        &[(
            "contention.csv",
            "contention,policy,max_rho,total_gpu_hours,unfinished_apps",
        )],
        &["fig14-contention.svg"],
    );
    assert_eq!(
        read(&dir, "contention.csv").lines().count(),
        1 + 3 * Policy::ALL.len()
    );
}

#[test]
fn network() {
    let dir = check(
        "fig15-16-network",
        &[(
            "network.csv",
            "network_intensive_fraction,policy,max_rho,total_gpu_hours,unfinished_apps",
        )],
        &["fig15-network-max-rho.svg", "fig16-network-gpu-time.svg"],
    );
    assert_eq!(
        read(&dir, "network.csv").lines().count(),
        1 + 6 * Policy::ALL.len()
    );
}

#[test]
fn estimation_error() {
    let dir = check(
        "fig17-estimation-error",
        &[(
            "estimation-error.csv",
            "estimation_error,seed,max_rho,total_gpu_hours,unfinished_apps",
        )],
        &["fig17-estimation-error.svg"],
    );
    assert_eq!(read(&dir, "estimation-error.csv").lines().count(), 1 + 4);
}

#[test]
fn liar_reports_one_row_per_exaggeration() {
    let dir = check(
        "fig18-liar",
        &[(
            "liar.csv",
            "exaggeration_percent,liar_completion_hours,others_mean_completion_hours,liar_rho,others_mean_rho,liar_gpu_hours,others_mean_gpu_hours,liar_placement_score,others_mean_placement_score",
        )],
        &["fig18-liar.svg"],
    );
    let csv = read(&dir, "liar.csv");
    let xs: Vec<&str> = csv
        .lines()
        .skip(1)
        .map(|line| line.split(',').next().unwrap_or_default())
        .collect();
    assert_eq!(xs, ["0", "25", "50", "75", "100"]);
    for line in csv.lines().skip(1) {
        let completion: f64 = line.split(',').nth(1).unwrap_or("x").parse().unwrap_or(0.0);
        assert!(completion > 0.0, "{line}");
    }
}

#[test]
fn sensitivity() {
    let dir = check(
        "fig19-sensitivity",
        &[(
            "sensitivity.csv",
            "fairness_knob,lease_minutes,max_rho,total_gpu_hours,unfinished_apps",
        )],
        &[
            "fig19a-sensitivity-max-rho.svg",
            "fig19b-sensitivity-gpu-time.svg",
        ],
    );
    assert_eq!(read(&dir, "sensitivity.csv").lines().count(), 1 + 12);
}

/// The documented-size runs behind EVALUATION.md: `AGORA_EXPERIMENTS=fig18-liar,...
/// AGORA_EXPERIMENT_OUT=results cargo test --release -p agora-sim --test experiments --
/// --ignored --nocapture` (all experiments when AGORA_EXPERIMENTS is unset).
#[test]
#[ignore = "full-size runs; minutes in release builds"]
fn full_size_runs() {
    let out = std::env::var("AGORA_EXPERIMENT_OUT").unwrap_or_else(|_| "results".to_owned());
    let wanted = std::env::var("AGORA_EXPERIMENTS").ok();
    for (name, _) in EXPERIMENTS {
        if wanted
            .as_deref()
            .is_some_and(|wanted| !wanted.split(',').any(|w| w == *name))
        {
            continue;
        }
        let started = std::time::Instant::now();
        let output = run_experiment(name, &Path::new(&out).join(name), ExperimentScale::full())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        println!(
            "== {name} ({:.1} s)\n{}",
            started.elapsed().as_secs_f64(),
            output.summary
        );
    }
}

#[test]
fn heterogeneous() {
    let header =
        "contention,gpus,policy,unfinished_apps,max_rho,jains_index,mean_jct_hours,makespan_hours";
    let dir = check(
        "heterogeneous",
        &[
            ("heterogeneous-gavel108.csv", header),
            ("heterogeneous-mixed256.csv", header),
        ],
        &[
            "heterogeneous-gavel108-max_rho.svg",
            "heterogeneous-mixed256-jains_index.svg",
        ],
    );
    assert_eq!(
        read(&dir, "heterogeneous-gavel108.csv").lines().count(),
        1 + 4 * Policy::ALL.len()
    );
    // A loss row for every point where another policy's max rho is below Themis's.
    let mut lost = 0;
    for cluster in ["gavel108", "mixed256"] {
        let runs = read(&dir, &format!("heterogeneous-{cluster}.csv"));
        let rows: Vec<Vec<&str>> = runs
            .lines()
            .skip(1)
            .map(|l| l.split(',').collect())
            .collect();
        for point in rows.chunks(Policy::ALL.len()) {
            let themis: f64 = point[0][4].parse().expect("max rho");
            lost += usize::from(
                point[1..]
                    .iter()
                    .any(|row| row[4].parse::<f64>().expect("max rho") < themis),
            );
        }
    }
    let losses = read(&dir, "heterogeneous-losses.csv");
    assert!(losses.starts_with("cluster,contention,themis_max_rho,lowest_policy,"));
    assert_eq!(losses.lines().count(), 1 + lost, "{losses}");
}

#[test]
fn heterogeneous_seeds() {
    let dir = check(
        "heterogeneous-seeds",
        &[(
            "heterogeneous-seeds.csv",
            "workload,seed,cluster,contention,policy,unfinished_apps,max_rho,jains_index,mean_jct_hours",
        )],
        &["heterogeneous-seeds-themis-vs-lowest.svg"],
    );
    // One draw at the tiny scale, on two clusters at four contentions, every policy.
    let runs = read(&dir, "heterogeneous-seeds.csv");
    assert_eq!(runs.lines().count(), 1 + 2 * 4 * Policy::ALL.len());
    // Every point where another policy's max rho is lower has its loss explained, with the
    // numbers the runs' CSV has and an app rho that its own fields give.
    let mut points: std::collections::BTreeMap<String, (f64, f64)> = Default::default();
    for line in runs.lines().skip(1) {
        let fields: Vec<&str> = line.split(',').collect();
        let point = fields[..4].join(",");
        let max_rho: f64 = fields[6].parse().expect("max rho");
        let entry = points.entry(point).or_insert((f64::NAN, f64::INFINITY));
        if fields[4] == "themis" {
            entry.0 = max_rho;
        } else {
            entry.1 = entry.1.min(max_rho);
        }
    }
    let losses = read(&dir, "heterogeneous-seeds-losses.csv");
    assert!(losses.starts_with("workload,seed,cluster,contention,themis_max_rho,lowest_policy,"));
    let lost: Vec<&String> = points
        .iter()
        .filter(|(_, (themis, lowest))| themis > lowest)
        .map(|(point, _)| point)
        .collect();
    assert_eq!(losses.lines().count(), 1 + lost.len(), "{losses}");
    for row in losses.lines().skip(1) {
        let fields: Vec<&str> = row.splitn(21, ',').collect();
        let number = |index: usize| -> f64 { fields[index].parse().expect("a number") };
        let (themis, lowest) = points[&fields[..4].join(",")];
        assert_eq!(format!("{themis:.6}"), fields[4]);
        assert_eq!(format!("{lowest:.6}"), fields[6]);
        assert_eq!(number(14), number(4), "the app is Themis's worst");
        let recomputed = number(10) / (number(9) * number(12));
        assert!((recomputed / number(14) - 1.0).abs() < 1e-3, "{row}");
        assert!(
            fields[20].contains(fields[7]),
            "the cause names the app: {row}"
        );
    }
}

#[test]
fn adaptation() {
    let header = "workload,jobs,policy,max_rho,share_rho_above_one,makespan_hours,\
                  mean_jct_hours,unfinished_apps";
    let dir = check(
        "adaptation",
        &[("adaptation.csv", header)],
        &[
            "adaptation-workload1-static-max-rho.svg",
            "adaptation-workload2-dynamic-max-rho.svg",
        ],
    );
    let csv = read(&dir, "adaptation.csv");
    // Four workloads under every policy, and Themis told reactively on the two dynamic ones.
    assert_eq!(csv.lines().count(), 1 + 4 * Policy::ALL.len() + 2);
    assert_eq!(csv.matches(",themis-reactive,").count(), 2);
}

/// Runs the Synergy experiment `name` and checks its files, its loads and its rows: per load,
/// Themis, SRTF and Gavel-FTF with both allocations and Synergy-Tune on SRTF and on Gavel-FTF.
/// A GPU-proportional run is its own reference: no job later, ratio 1.
fn check_synergy(name: &str, loads: &[&str]) {
    let csv_file = format!("{name}.csv");
    let charts = ["mean_jct", "makespan", "max_rho"].map(|chart| format!("{name}-{chart}.svg"));
    let dir = check(
        name,
        &[(
            &csv_file,
            "jobs_per_hour,policy,allocation,unfinished_apps,mean_jct_hours,makespan_hours,max_rho,\
             jobs_later_than_gpu_proportional,worst_jct_ratio",
        )],
        &charts.each_ref().map(String::as_str),
    );
    let csv = read(&dir, &csv_file);
    assert_eq!(csv.lines().count(), 1 + loads.len() * 8);
    let mut rows_per_load = BTreeMap::<&str, usize>::new();
    for line in csv.lines().skip(1) {
        *rows_per_load
            .entry(line.split(',').next().unwrap_or_default())
            .or_default() += 1;
    }
    assert_eq!(rows_per_load, loads.iter().map(|&load| (load, 8)).collect());
    assert_eq!(
        csv.matches(",synergy-srtf,sensitivity-aware,").count(),
        loads.len()
    );
    for line in csv
        .lines()
        .filter(|line| line.contains(",gpu-proportional,"))
    {
        assert!(line.ends_with(",0,1.0000"), "{line}");
    }
}

#[test]
fn synergy() {
    check_synergy("synergy", &["4", "8", "12", "16"]);
}

#[test]
fn synergy_steady() {
    // Loads the cluster keeps up with.
    check_synergy("synergy-steady", &["2", "2.6", "3.2"]);
}
