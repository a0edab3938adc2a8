//! `agora simulate`: replays one workload on one simulated cluster under one or more policies
//! (`agora_sim::simulator::simulate`), prints a summary table and optionally writes every
//! run's report.

use std::fmt::{self, Write as _};
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use agora_market::cluster_file::ClusterFileError;
use agora_market::market::MarketConfig;
use agora_market::policy::{Policy, UnknownPolicy};
use agora_market::shown::Shown;
use agora_sim::clusters::load_cluster;
use agora_sim::generate::{
    workload1, workload2, GeneratorConfig, GeneratorError, DEFAULT_APPS, DEFAULT_DURATION_SCALE,
};
use agora_sim::metrics::{RunSummary, SimulationReport};
use agora_sim::simulator::{
    simulate, Progress, SimulationConfig, SimulationError, SpeedChangeReporting,
};
use agora_sim::trace::{load_tiresias_csv, load_workload_json, TraceError};
use agora_sim::workload::Workload;
use clap::Args;

use super::{EXIT_FAILURE, EXIT_INVALID_INPUT};

/// Replay a workload on a simulated cluster under one or more policies.
///
/// Runs one simulation per policy (same workload, same seed), then prints one summary row per
/// policy on standard output. With `--out DIR`, also writes `DIR/<policy>.json` (the full
/// report), `DIR/<policy>.csv` (one line per app) and `DIR/summary.csv` (the table). A
/// progress bar is drawn on standard error when it is a terminal. README.md documents the
/// workload syntax and the outputs.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Cluster TOML file (e.g. services/agora-sim/clusters/themis-sim-256.toml).
    #[arg(long, value_name = "FILE")]
    cluster: PathBuf,

    /// A workload file (`.json`: project format, `.csv`: Tiresias trace), or a generator:
    /// `workload1` or `workload2`, optionally followed by `:apps=N,seed=S,scale=X,network=F,load=L,dynamic=D`
    /// (`dynamic`: the share of apps whose jobs scale their batch size as they train).
    #[arg(long, value_name = "SOURCE")]
    workload: String,

    /// Comma-separated policies: themis, gandiva, tiresias, optimus, slaq, srtf, srsf,
    /// gavel-ftf, oef, shockwave, synergy-srtf, synergy-ftf.
    #[arg(long, value_name = "LIST", default_value = "themis")]
    policy: String,

    /// Themis's fairness knob f in [0, 1): the worst (1 - f) fraction of apps bid each round.
    #[arg(
        long = "f",
        value_name = "F",
        allow_negative_numbers = true,
        default_value_t = 0.8
    )]
    fairness_knob: f64,

    /// Lease length in minutes (> 0).
    #[arg(
        long,
        value_name = "MINUTES",
        allow_negative_numbers = true,
        default_value_t = 10.0
    )]
    lease_minutes: f64,

    /// Checkpoint-restore pause of a job whose GPUs change, in seconds (>= 0).
    #[arg(
        long,
        value_name = "SECONDS",
        allow_negative_numbers = true,
        default_value_t = 35.0
    )]
    restart_pause_seconds: f64,

    /// Seed of the simulation (and of a generated workload, unless its spec sets `seed=`).
    #[arg(long, value_name = "N", default_value_t = 0)]
    seed: u64,

    /// Relative error e in [0, 1) of the iteration times the market is told: each job's is
    /// multiplied by a factor drawn uniformly from [1 - e, 1 + e].
    #[arg(
        long,
        value_name = "E",
        allow_negative_numbers = true,
        default_value_t = 0.0
    )]
    estimation_error: f64,

    /// What the market is told of jobs whose speed changes as they train: their declared
    /// schedule (`forecast`), or only the current phase's speed, updated after each change
    /// (`reactive`).
    #[arg(long, value_name = "HOW", value_enum, default_value = "forecast")]
    speed_changes: SpeedChanges,

    /// Directory for the per-policy reports and summary.csv (created if missing).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// What can go wrong in `agora simulate`. Every message names the file or the flag at fault.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    /// Not a `#[source]`: the file error's message already ends with its cause, and `main`
    /// prints the whole chain.
    #[error("{0}")]
    Cluster(ClusterFileError),
    /// As for `Cluster`: the message already includes the cause.
    #[error("{0}")]
    Workload(TraceError),
    #[error("--workload {spec}: {reason}")]
    WorkloadSpec { spec: String, reason: String },
    #[error("--workload {spec}")]
    Generator {
        spec: String,
        #[source]
        cause: GeneratorError,
    },
    #[error("--policy")]
    UnknownPolicy(#[source] UnknownPolicy),
    #[error("--policy: {0}")]
    PolicyList(String),
    #[error("--{flag}: {reason}")]
    Flag { flag: &'static str, reason: String },
    #[error("policy {policy}: the simulation failed")]
    Simulation {
        policy: Policy,
        #[source]
        cause: SimulationError,
    },
    #[error("cannot write {}", path.display())]
    Output {
        path: PathBuf,
        #[source]
        cause: io::Error,
    },
    #[error("cannot write the summary")]
    Stdout(#[source] io::Error),
}

impl From<ClusterFileError> for SimulateError {
    fn from(error: ClusterFileError) -> Self {
        Self::Cluster(error)
    }
}

impl From<TraceError> for SimulateError {
    fn from(error: TraceError) -> Self {
        Self::Workload(error)
    }
}

impl SimulateError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Cluster(_)
            | Self::Workload(_)
            | Self::WorkloadSpec { .. }
            | Self::Generator { .. }
            | Self::UnknownPolicy(_)
            | Self::PolicyList(_)
            | Self::Flag { .. } => EXIT_INVALID_INPUT,
            // The workload's own faults; the engine's are failures.
            Self::Simulation {
                cause:
                    SimulationError::DuplicateApp(_)
                    | SimulationError::InvalidArrival(_)
                    | SimulationError::JobLargerThanCluster { .. },
                ..
            } => EXIT_INVALID_INPUT,
            Self::Simulation { .. } | Self::Output { .. } | Self::Stdout(_) => EXIT_FAILURE,
        }
    }
}

impl SimulateArgs {
    pub fn run(self) -> Result<(), SimulateError> {
        let config = self.config()?;
        let policies = parse_policies(&self.policy)?;
        let cluster = load_cluster(&self.cluster)?;
        let workload = load_workload(&self.workload, self.seed)?;
        if let Some(dir) = &self.out {
            std::fs::create_dir_all(dir).map_err(|cause| SimulateError::Output {
                path: dir.clone(),
                cause,
            })?;
        }

        let mut summaries = Vec::with_capacity(policies.len());
        for policy in policies {
            let mut run_config = config.clone();
            run_config.market.policy = policy;
            let mut bar = ProgressBar::new(policy);
            let report = simulate(&cluster, &workload, &run_config, |progress| {
                bar.update(progress);
            })
            .map_err(|cause| SimulateError::Simulation { policy, cause });
            bar.finish();
            let report = report?;
            if let Some(dir) = &self.out {
                write_report(dir, policy, &report)?;
            }
            summaries.push(report.summary);
        }

        if let Some(dir) = &self.out {
            write_file(&dir.join("summary.csv"), &summary_csv(&summaries))?;
        }
        let mut stdout = io::stdout().lock();
        stdout
            .write_all(summary_table(&summaries).as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(SimulateError::Stdout)
    }

    /// The simulation's configuration from the flags, each checked.
    fn config(&self) -> Result<SimulationConfig, SimulateError> {
        let flag = |flag, reason: String| SimulateError::Flag { flag, reason };
        let f = self.fairness_knob;
        if !(0.0..1.0).contains(&f) {
            return Err(flag(
                "f",
                format!("the fairness knob must lie in [0, 1), got {}", Shown(f)),
            ));
        }
        let lease = self.lease_minutes;
        if !(lease.is_finite() && lease > 0.0) {
            return Err(flag(
                "lease-minutes",
                format!(
                    "the lease length must be a positive number of minutes, got {}",
                    Shown(lease)
                ),
            ));
        }
        let lease_length = Duration::try_from_secs_f64(lease * 60.0).map_err(|error| {
            flag(
                "lease-minutes",
                format!("invalid lease length {}: {error}", Shown(lease)),
            )
        })?;
        let pause = self.restart_pause_seconds;
        let restart_pause = if pause.is_finite() {
            Duration::try_from_secs_f64(pause).ok()
        } else {
            None
        }
        .ok_or_else(|| {
            flag(
                "restart-pause-seconds",
                format!(
                    "the restart pause must be a finite number of seconds >= 0, got {}",
                    Shown(pause)
                ),
            )
        })?;
        let error = self.estimation_error;
        if !(0.0..1.0).contains(&error) {
            return Err(flag(
                "estimation-error",
                format!(
                    "the estimation error must lie in [0, 1), got {}",
                    Shown(error)
                ),
            ));
        }
        Ok(SimulationConfig {
            market: MarketConfig {
                fairness_knob: f,
                lease_length,
                restart_pause,
                ..MarketConfig::default()
            },
            seed: self.seed,
            estimation_error: error,
            misreport: None,
            speed_changes: match self.speed_changes {
                SpeedChanges::Forecast => SpeedChangeReporting::Forecast,
                SpeedChanges::Reactive => SpeedChangeReporting::Reactive,
            },
        })
    }
}

/// `--speed-changes`: see [`SpeedChangeReporting`].
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SpeedChanges {
    Forecast,
    Reactive,
}

/// Parses `themis,gandiva,...`: known names, none twice, in the order given.
fn parse_policies(list: &str) -> Result<Vec<Policy>, SimulateError> {
    let mut policies = Vec::new();
    for name in list.split(',').map(str::trim) {
        if name.is_empty() {
            return Err(SimulateError::PolicyList(format!(
                "empty policy name in {list:?}; give a comma-separated list such as themis,gandiva"
            )));
        }
        let policy: Policy = name.parse().map_err(SimulateError::UnknownPolicy)?;
        if policies.contains(&policy) {
            return Err(SimulateError::PolicyList(format!(
                "policy {policy} is listed twice"
            )));
        }
        policies.push(policy);
    }
    Ok(policies)
}

/// `workload1` or `workload2`.
type Generator = fn(&GeneratorConfig) -> Result<Workload, GeneratorError>;

/// Loads a workload file (by extension) or generates one from a `workload1`/`workload2` spec;
/// `seed` seeds a generator whose spec sets none.
fn load_workload(source: &str, seed: u64) -> Result<Workload, SimulateError> {
    let (name, params) = match source.split_once(':') {
        Some((name, params)) => (name, Some(params)),
        None => (source, None),
    };
    let generator: Option<Generator> = match name {
        "workload1" => Some(workload1),
        "workload2" => Some(workload2),
        _ => None,
    };
    if let Some(generate) = generator {
        let config = generator_config(source, params.unwrap_or(""), seed)?;
        return generate(&config).map_err(|cause| SimulateError::Generator {
            spec: source.to_owned(),
            cause,
        });
    }
    let path = Path::new(source);
    let extension = path
        .extension()
        .and_then(|extension| extension.to_str())
        .map(str::to_ascii_lowercase);
    match extension.as_deref() {
        Some("json") => Ok(load_workload_json(path)?),
        Some("csv") => Ok(load_tiresias_csv(path)?),
        _ => Err(SimulateError::WorkloadSpec {
            spec: source.to_owned(),
            reason: "expected a .json workload, a .csv Tiresias trace, or a generator \
                     (workload1 or workload2, optionally with :apps=N,seed=S,scale=X,network=F,load=L,dynamic=D)"
                .to_owned(),
        }),
    }
}

/// `apps=N,seed=S,scale=X,network=F,load=L,dynamic=D` (any subset, any order) onto
/// [`GeneratorConfig::philly_like`], then `network_intensive_fraction`, and arrivals `L` times
/// as frequent (L x the offered load).
fn generator_config(spec: &str, params: &str, seed: u64) -> Result<GeneratorConfig, SimulateError> {
    let bad = |reason: String| SimulateError::WorkloadSpec {
        spec: spec.to_owned(),
        reason,
    };
    let mut apps = DEFAULT_APPS;
    let mut seed = seed;
    let mut scale = DEFAULT_DURATION_SCALE;
    let mut network = None;
    let mut load: f64 = 1.0;
    let mut dynamic = 0.0;
    let mut seen: Vec<&str> = Vec::new();
    for param in params.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = param
            .split_once('=')
            .map(|(key, value)| (key.trim(), value.trim()))
            .ok_or_else(|| bad(format!("parameter {param:?} is not key=value")))?;
        if seen.contains(&key) {
            return Err(bad(format!("parameter {key} is given twice")));
        }
        seen.push(key);
        let number_error = |what: &str| bad(format!("{key}={value:?} is not {what}"));
        match key {
            "apps" => apps = value.parse().map_err(|_| number_error("a count of apps"))?,
            "seed" => {
                seed = value
                    .parse()
                    .map_err(|_| number_error("an unsigned integer"))?
            }
            "scale" => scale = value.parse().map_err(|_| number_error("a number"))?,
            "network" => {
                network = Some(value.parse().map_err(|_| number_error("a number"))?);
            }
            "load" => {
                load = value.parse().map_err(|_| number_error("a number"))?;
                if !(load.is_finite() && load > 0.0) {
                    return Err(bad(format!("load={value:?} must be a number > 0")));
                }
            }
            "dynamic" => dynamic = value.parse().map_err(|_| number_error("a number"))?,
            _ => {
                return Err(bad(format!(
                "unknown parameter {key:?}; expected apps, seed, scale, network, load or dynamic"
            )))
            }
        }
    }
    let mut config = GeneratorConfig::philly_like(apps, seed, scale);
    config.network_intensive_fraction = network;
    config.dynamic_fraction = dynamic;
    config.mean_interarrival_seconds /= load;
    config
        .validate()
        .map_err(|cause| SimulateError::Generator {
            spec: spec.to_owned(),
            cause,
        })?;
    Ok(config)
}

fn write_file(path: &Path, contents: &str) -> Result<(), SimulateError> {
    std::fs::write(path, contents).map_err(|cause| SimulateError::Output {
        path: path.to_owned(),
        cause,
    })
}

/// `DIR/<policy>.json` (the whole report) and `DIR/<policy>.csv` (one line per app).
fn write_report(
    dir: &Path,
    policy: Policy,
    report: &SimulationReport,
) -> Result<(), SimulateError> {
    let json_path = dir.join(format!("{policy}.json"));
    let mut json = serde_json::to_string_pretty(report).map_err(|error| SimulateError::Output {
        path: json_path.clone(),
        cause: io::Error::other(error),
    })?;
    json.push('\n');
    write_file(&json_path, &json)?;
    write_file(&dir.join(format!("{policy}.csv")), &report.apps_csv())
}

const HOUR: f64 = 3600.0;

/// One cell of the summary.
enum Cell {
    Text(String),
    Count(u64),
    /// A number, and the decimals it is shown with in the terminal table (`summary.csv` has
    /// full precision).
    Number(f64, usize),
}

/// A column of the summary: its name in `summary.csv`, its header in the terminal table (the
/// table leaves out columns without one) and its value.
struct Column {
    csv: &'static str,
    table: Option<&'static str>,
    value: fn(&RunSummary) -> Cell,
}

const fn column(
    csv: &'static str,
    table: Option<&'static str>,
    value: fn(&RunSummary) -> Cell,
) -> Column {
    Column { csv, table, value }
}

/// The summary's columns, one row per policy.
const COLUMNS: [Column; 26] = [
    column("policy", Some("policy"), |s| {
        Cell::Text(s.policy.to_string())
    }),
    column("apps", None, |s| Cell::Count(s.apps as u64)),
    column("max_rho", Some("max_rho"), |s| Cell::Number(s.max_rho, 3)),
    column("p99_rho", Some("p99"), |s| Cell::Number(s.p99_rho, 3)),
    column("p95_rho", Some("p95"), |s| Cell::Number(s.p95_rho, 3)),
    column("median_rho", Some("median"), |s| {
        Cell::Number(s.median_rho, 3)
    }),
    column("mean_rho", None, |s| Cell::Number(s.mean_rho, 3)),
    column("jains_index", Some("jain"), |s| {
        Cell::Number(s.jains_index, 3)
    }),
    column("apps_rho_above_one", Some("rho>1"), |s| {
        Cell::Count(s.apps_rho_above_one as u64)
    }),
    column("apps_rho_above_two", Some("rho>2"), |s| {
        Cell::Count(s.apps_rho_above_two as u64)
    }),
    column("mean_completion_hours", Some("mean_jct_h"), |s| {
        Cell::Number(s.mean_completion_seconds / HOUR, 2)
    }),
    column("p99_completion_hours", None, |s| {
        Cell::Number(s.p99_completion_seconds / HOUR, 2)
    }),
    column("gpu_hours", Some("gpu_h"), |s| {
        Cell::Number(s.total_gpu_seconds / HOUR, 1)
    }),
    column("restart_gpu_hours", Some("restart_h"), |s| {
        Cell::Number(s.restart_gpu_seconds / HOUR, 1)
    }),
    column("makespan_hours", Some("makespan_h"), |s| {
        Cell::Number(s.makespan_seconds / HOUR, 2)
    }),
    column("reallocations", Some("realloc"), |s| {
        Cell::Count(s.reallocations)
    }),
    column("restarts", Some("restarts"), |s| {
        Cell::Count(s.mechanism.restarts)
    }),
    column("leases", None, |s| Cell::Count(s.mechanism.leases_granted)),
    column("lease_renewals", Some("renewals"), |s| {
        Cell::Count(s.mechanism.lease_renewals)
    }),
    column("mean_offer_gpus", Some("offer"), |s| {
        Cell::Number(s.mechanism.mean_offer_gpus(), 1)
    }),
    column("single_gpu_offers", Some("1gpu_offers"), |s| {
        Cell::Count(s.mechanism.single_gpu_offers)
    }),
    column("bids", None, |s| Cell::Count(s.mechanism.bids)),
    column("empty_bids", Some("empty_bids"), |s| {
        Cell::Count(s.mechanism.empty_bids)
    }),
    column("mean_placement_score", Some("placement"), |s| {
        Cell::Number(s.mean_placement_score, 3)
    }),
    column("rounds", Some("rounds"), |s| Cell::Count(s.rounds)),
    column("unfinished_apps", Some("unfinished"), |s| {
        Cell::Count(s.unfinished_apps as u64)
    }),
];

fn summary_csv(summaries: &[RunSummary]) -> String {
    let header: Vec<&str> = COLUMNS.iter().map(|column| column.csv).collect();
    let mut csv = header.join(",");
    csv.push('\n');
    for summary in summaries {
        let cells: Vec<String> = COLUMNS
            .iter()
            .map(|column| match (column.value)(summary) {
                Cell::Text(text) => text,
                Cell::Count(count) => count.to_string(),
                Cell::Number(value, _) => value.to_string(),
            })
            .collect();
        csv.push_str(&cells.join(","));
        csv.push('\n');
    }
    csv
}

/// The table on standard output: a header, then one right-aligned row per policy.
fn summary_table(summaries: &[RunSummary]) -> String {
    let shown: Vec<&Column> = COLUMNS
        .iter()
        .filter(|column| column.table.is_some())
        .collect();
    let header: Vec<&str> = shown.iter().filter_map(|column| column.table).collect();
    let rows: Vec<Vec<String>> = summaries
        .iter()
        .map(|summary| {
            shown
                .iter()
                .map(|column| match (column.value)(summary) {
                    Cell::Text(text) => text,
                    Cell::Count(count) => count.to_string(),
                    Cell::Number(value, decimals) => format!("{value:.decimals$}"),
                })
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|cell| cell.len()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let mut table = String::new();
    let mut line = |cells: &[&str]| {
        for (position, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if position == 0 {
                let _ = write!(table, "{cell:<width$}");
            } else {
                let _ = write!(table, "  {cell:>width$}");
            }
        }
        table.push('\n');
    };
    line(&header);
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&cells);
    }
    table
}

/// A one-line progress bar over finished apps on standard error, drawn only when standard
/// error is a terminal and only when the count changes.
struct ProgressBar {
    policy: Policy,
    enabled: bool,
    drawn: Option<usize>,
}

impl fmt::Debug for ProgressBar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProgressBar")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl ProgressBar {
    const WIDTH: usize = 30;

    fn new(policy: Policy) -> Self {
        Self {
            policy,
            enabled: io::stderr().is_terminal(),
            drawn: None,
        }
    }

    fn update(&mut self, progress: Progress) {
        if !self.enabled || self.drawn == Some(progress.finished_apps) {
            return;
        }
        self.drawn = Some(progress.finished_apps);
        let filled = (progress.finished_apps * Self::WIDTH)
            .checked_div(progress.total_apps)
            .unwrap_or(Self::WIDTH)
            .min(Self::WIDTH);
        let mut stderr = io::stderr().lock();
        let _ = write!(
            stderr,
            "\r{:<10} [{}{}] {}/{} apps, t = {:.1} h",
            self.policy.name(),
            "#".repeat(filled),
            "-".repeat(Self::WIDTH - filled),
            progress.finished_apps,
            progress.total_apps,
            progress.now.as_secs_f64() / HOUR,
        );
        let _ = stderr.flush();
    }

    /// Clears the bar's line so that what follows starts on a clean line.
    fn finish(&mut self) {
        if self.enabled && self.drawn.is_some() {
            let mut stderr = io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K");
            let _ = stderr.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_specs_map_onto_the_config() {
        let config = generator_config(
            "workload2:apps=4,seed=9,scale=0.5,network=0.25",
            "apps=4,seed=9,scale=0.5,network=0.25",
            1,
        )
        .expect("valid spec");
        assert_eq!(config.apps, 4);
        assert_eq!(config.seed, 9);
        assert_eq!(config.duration_scale, 0.5);
        assert_eq!(config.network_intensive_fraction, Some(0.25));
        let defaults = generator_config("workload1", "", 7).expect("valid spec");
        assert_eq!(
            defaults,
            GeneratorConfig::philly_like(DEFAULT_APPS, 7, DEFAULT_DURATION_SCALE)
        );
        for bad in [
            "apps",
            "apps=x",
            "size=3",
            "apps=1,apps=2",
            "network=2",
            "scale=0",
        ] {
            assert!(generator_config("w", bad, 0).is_err(), "{bad}");
        }
    }

    #[test]
    fn policy_lists_keep_their_order_and_reject_repeats() {
        assert_eq!(
            parse_policies("gandiva, themis").expect("valid"),
            [Policy::Gandiva, Policy::Themis]
        );
        for bad in ["", "themis,", "themis,themis", "fifo"] {
            assert!(parse_policies(bad).is_err(), "{bad}");
        }
    }
}
