//! End-to-end tests of `agora simulate`: run the binary on the shipped testbed cluster with
//! small workloads, check its table, its output files, its error line and its exit code.
//!
//! Every test writes into its own temporary directory, so they run in parallel.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod support;

use support::{successful_stdout, unique_temp_path};

const AGORA: &str = env!("CARGO_BIN_EXE_agora");

/// A small workload: four Workload-2 apps.
const SMALL: &str = "workload2:apps=4,seed=1";

/// One single-job app in the project's JSON workload format.
const TINY_JSON: &str = r#"{
  "apps": [
    {
      "arrival_seconds": 0.0,
      "model": "vgg16",
      "app": {
        "id": "tiny",
        "kind": "single_job",
        "job": {
          "id": "tiny-j000",
          "total_iterations": 500,
          "serial_iteration_time": 0.8,
          "max_gpus": 4,
          "slowdown": { "same_slot": 1.0, "same_machine": 1.1, "same_rack": 1.5, "cross_rack": 2.0 }
        }
      }
    }
  ]
}
"#;

const SUMMARY_HEADER: &str = "policy,apps,max_rho,p99_rho,p95_rho,median_rho,mean_rho,\
jains_index,apps_rho_above_one,apps_rho_above_two,mean_completion_hours,p99_completion_hours,\
gpu_hours,restart_gpu_hours,makespan_hours,reallocations,restarts,leases,lease_renewals,\
mean_offer_gpus,single_gpu_offers,bids,empty_bids,mean_placement_score,rounds,unfinished_apps";

const APPS_HEADER: &str = "app,model,finished,arrival_seconds,completion_seconds,\
t_cluster_seconds,n_avg,rho,gpu_seconds,placement_score,reallocations,restarts,\
restart_gpu_seconds";

/// The terminal table's columns.
const TABLE_COLUMNS: usize = 21;

fn agora(args: &[&str]) -> Output {
    Command::new(AGORA)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the agora binary runs")
}

fn cluster(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agora-sim/clusters")
        .join(file);
    path.to_str().expect("UTF-8 path").to_owned()
}

fn testbed() -> String {
    cluster("themis-testbed.toml")
}

/// A directory in the temporary directory that no other test (or test process) uses, removed
/// when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(label: &str) -> Self {
        let path = unique_temp_path("agora-simulate-test", label);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("the temporary directory is writable");
        Self(path)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn write(&self, name: &str, contents: &str) -> String {
        let path = self.join(name);
        std::fs::write(&path, contents).expect("the temporary directory is writable");
        path.to_str().expect("UTF-8 path").to_owned()
    }

    fn sub(&self, name: &str) -> String {
        self.join(name).to_str().expect("UTF-8 path").to_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn stdout_of_success(output: &Output) -> String {
    String::from_utf8(successful_stdout(output).to_vec()).expect("stdout is UTF-8")
}

/// The table's rows (after the header), split into cells.
fn table_rows(stdout: &str) -> Vec<Vec<String>> {
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().expect("a header").split_whitespace().collect();
    assert_eq!(header.first(), Some(&"policy"), "{stdout}");
    assert_eq!(header.len(), TABLE_COLUMNS, "{stdout}");
    for column in [
        "max_rho",
        "p95",
        "jain",
        "rho>1",
        "rho>2",
        "mean_jct_h",
        "gpu_h",
        "restart_h",
        "realloc",
        "restarts",
        "renewals",
        "offer",
        "empty_bids",
    ] {
        assert!(header.contains(&column), "{column} missing: {stdout}");
    }
    lines
        .map(|line| {
            let cells: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
            assert_eq!(cells.len(), TABLE_COLUMNS, "{line}");
            cells
        })
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

fn assert_input_error(args: &[&str], mentions: &str) {
    let output = agora(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(output.stdout.is_empty(), "{args:?}: stdout not empty");
    assert!(stderr.starts_with("error: "), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    assert!(
        stderr.contains(mentions),
        "{args:?}: {stderr} lacks {mentions}"
    );
}

#[test]
fn two_policies_print_both_rows_and_write_every_file() {
    let dir = TempDir::new("two");
    let out = dir.sub("out/nested");
    let stdout = stdout_of_success(&agora(&[
        "simulate",
        "--cluster",
        &testbed(),
        "--workload",
        SMALL,
        "--policy",
        "themis,gandiva",
        "--out",
        &out,
    ]));
    let rows = table_rows(&stdout);
    let policies: Vec<&str> = rows.iter().map(|row| row[0].as_str()).collect();
    assert_eq!(policies, ["themis", "gandiva"]);

    let out = Path::new(&out);
    let summary = read(&out.join("summary.csv"));
    let lines: Vec<&str> = summary.lines().collect();
    assert_eq!(lines.len(), 3, "{summary}");
    assert_eq!(lines[0], SUMMARY_HEADER);
    for (line, policy) in lines[1..].iter().zip(["themis", "gandiva"]) {
        let fields: Vec<&str> = line.split(',').collect();
        assert_eq!(fields.len(), SUMMARY_HEADER.split(',').count(), "{line}");
        assert_eq!(fields[0], policy);
        assert_eq!(fields[1], "4", "four apps: {line}");
        for field in &fields[2..] {
            field
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("{field} in {line}"));
        }
    }

    for policy in ["themis", "gandiva"] {
        let report: Value = serde_json::from_str(&read(&out.join(format!("{policy}.json"))))
            .expect("the report is JSON");
        assert_eq!(report["summary"]["policy"], policy);
        assert_eq!(report["summary"]["apps"], 4);
        assert_eq!(report["apps"].as_array().map(Vec::len), Some(4));
        assert_eq!(report["rho_cdf"].as_array().map(Vec::len), Some(4));

        let csv = read(&out.join(format!("{policy}.csv")));
        let mut lines = csv.lines();
        assert_eq!(lines.next(), Some(APPS_HEADER));
        assert_eq!(lines.count(), 4, "{csv}");
    }
}

#[test]
fn the_same_seed_gives_byte_identical_reports() {
    let dir = TempDir::new("twice");
    let run = |out: &str| {
        stdout_of_success(&agora(&[
            "simulate",
            "--cluster",
            &testbed(),
            "--workload",
            SMALL,
            "--policy",
            "themis,tiresias",
            "--seed",
            "3",
            "--estimation-error",
            "0.2",
            "--out",
            out,
        ]))
    };
    let first = run(&dir.sub("a"));
    let second = run(&dir.sub("b"));
    assert_eq!(first, second);
    for file in [
        "themis.json",
        "tiresias.json",
        "themis.csv",
        "tiresias.csv",
        "summary.csv",
    ] {
        let a = std::fs::read(dir.join("a").join(file)).expect("first run wrote it");
        let b = std::fs::read(dir.join("b").join(file)).expect("second run wrote it");
        assert!(a == b, "{file} differs between runs");
    }
}

#[test]
fn without_out_nothing_is_written() {
    let dir = TempDir::new("noout");
    let output = Command::new(AGORA)
        .args([
            "simulate",
            "--cluster",
            &testbed(),
            "--workload",
            "workload2:apps=2,seed=5",
        ])
        .current_dir(&dir.0)
        .output()
        .expect("agora runs");
    let rows = table_rows(&stdout_of_success(&output));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][0], "themis", "themis is the default policy");
    let left: Vec<_> = std::fs::read_dir(&dir.0)
        .expect("readable")
        .collect::<Result<_, _>>()
        .expect("readable");
    assert!(left.is_empty(), "wrote {left:?}");
}

#[test]
fn a_json_workload_runs() {
    let dir = TempDir::new("json");
    let workload = dir.write("tiny.json", TINY_JSON);
    let out = dir.sub("out");
    let stdout = stdout_of_success(&agora(&[
        "simulate",
        "--cluster",
        &testbed(),
        "--workload",
        &workload,
        "--policy",
        "srtf",
        "--f",
        "0",
        "--lease-minutes",
        "2.5",
        "--restart-pause-seconds",
        "0",
        "--out",
        &out,
    ]));
    let rows = table_rows(&stdout);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][0], "srtf");
    assert_eq!(
        rows[0].last().map(String::as_str),
        Some("0"),
        "the app finishes: {stdout}"
    );
    let report: Value =
        serde_json::from_str(&read(&dir.join("out/srtf.json"))).expect("the report is JSON");
    assert_eq!(report["apps"][0]["app"], "tiny");
    assert_eq!(report["apps"][0]["finished"], true);
}

#[test]
fn the_tiresias_trace_runs() {
    let trace =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/tiresias-60-jobs.csv");
    if !trace.exists() {
        eprintln!("skipped: {} is not there", trace.display());
        return;
    }
    let stdout = stdout_of_success(&agora(&[
        "simulate",
        "--cluster",
        &testbed(),
        "--workload",
        trace.to_str().expect("UTF-8 path"),
        "--policy",
        "themis",
    ]));
    let rows = table_rows(&stdout);
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][0], "themis");
    assert_eq!(
        rows[0].last().map(String::as_str),
        Some("0"),
        "every job finishes: {stdout}"
    );
}

#[test]
fn bad_cluster_files_are_input_errors() {
    let dir = TempDir::new("cluster");
    let missing = dir.sub("missing.toml");
    assert_input_error(
        &["simulate", "--cluster", &missing, "--workload", SMALL],
        "missing.toml",
    );
    let broken = dir.write("broken.toml", "[[racks]]\nslots = \"four\n");
    assert_input_error(
        &["simulate", "--cluster", &broken, "--workload", SMALL],
        "broken.toml",
    );
    let empty = dir.write("empty.toml", "racks = []\n");
    assert_input_error(
        &["simulate", "--cluster", &empty, "--workload", SMALL],
        "empty.toml",
    );
}

#[test]
fn bad_workloads_are_input_errors() {
    let dir = TempDir::new("workload");
    let cluster = testbed();
    let missing_json = dir.sub("missing.json");
    let missing_csv = dir.sub("missing.csv");
    let broken_json = dir.write("broken.json", "{\"apps\": [");
    let wrong_json = dir.write("wrong.json", "{\"apps\": [], \"extra\": 1}");
    let broken_csv = dir.write("broken.csv", "job_id,num_gpu\n1,2\n");
    let other = dir.write("workload.txt", "apps");
    let header = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n";
    let far_future = dir.write("far.csv", &format!("{header}0,1,1.9e16,10,vgg16,100,0\n"));
    let endless = dir.write("endless.csv", &format!("{header}0,1,0,10,vgg16,1e8,0\n"));
    let instant = dir.write("instant.csv", &format!("{header}0,1,0,10,vgg16,1e-300,0\n"));
    let too_wide = dir.write("wide.csv", &format!("{header}0,128,0,10,vgg16,100,0\n"));
    let empty = dir.write("empty.json", "{\"apps\": []}");
    let bom = dir.write(
        "bom.csv",
        &format!("\u{feff}{header}0,1,0,10,vgg16,100,0\n"),
    );
    for (workload, mentions) in [
        (missing_json.as_str(), "missing.json"),
        (missing_csv.as_str(), "missing.csv"),
        (broken_json.as_str(), "broken.json"),
        (wrong_json.as_str(), "wrong.json"),
        (broken_csv.as_str(), "broken.csv"),
        (other.as_str(), "--workload"),
        (far_future.as_str(), "arrival_seconds"),
        (endless.as_str(), "116 days"),
        (instant.as_str(), "serial_iteration_time"),
        (too_wide.as_str(), "the cluster has only 64"),
        (empty.as_str(), "no apps"),
        ("workload3", "--workload workload3"),
        ("workload1:apps=many", "apps"),
        ("workload1:apps=0", "apps must be at least 1"),
        ("workload1:size=3", "size"),
        ("workload2:network=2", "network"),
        ("workload2:scale=0", "scale"),
    ] {
        assert_input_error(
            &["simulate", "--cluster", &cluster, "--workload", workload],
            mentions,
        );
    }
    // A byte order mark, as spreadsheet programs write, is not an error.
    stdout_of_success(&agora(&[
        "simulate",
        "--cluster",
        &cluster,
        "--workload",
        &bom,
    ]));
}

#[test]
fn bad_flags_are_input_errors() {
    let cluster = testbed();
    let base = ["simulate", "--cluster", &cluster, "--workload", SMALL];
    for (extra, mentions) in [
        (&["--policy", "fifo"][..], "themis, gandiva, tiresias"),
        (&["--policy", "themis,themis"], "--policy"),
        (&["--policy", "themis,"], "--policy"),
        (&["--f", "1"], "--f"),
        (&["--f", "-0.1"], "--f"),
        (&["--lease-minutes", "0"], "--lease-minutes"),
        (&["--lease-minutes", "-5"], "--lease-minutes"),
        (
            &["--restart-pause-seconds", "-1"],
            "--restart-pause-seconds",
        ),
        (&["--estimation-error", "1.5"], "--estimation-error"),
        // An absurd value is named as typed, not as Rust's 301-digit expansion of it.
        (&["--restart-pause-seconds", "1e300"], "got 1e300"),
        (&["--lease-minutes", "1e300"], "invalid lease length 1e300"),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        assert_input_error(&args, mentions);
    }
}

#[test]
fn a_missing_required_flag_is_a_usage_error() {
    let output = agora(&["simulate", "--workload", SMALL]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--cluster"));
}
