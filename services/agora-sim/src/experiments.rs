//! Experiments reproducing Themis (NSDI'20) §6, Figures 9-19, on the simulator. Each writes
//! CSV data and SVG charts into an output directory and returns a short text summary.
//!
//! Everything is deterministic: the workloads come from fixed generator seeds and every
//! simulation has a fixed seed. Independent simulations run on parallel threads.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use agora_market::app::{App, AppId, AppKind, Job};
use agora_market::market::MarketConfig;
use agora_market::policy::Policy;
use agora_market::resources::ResourceAllocation;
use agora_market::topology::{Cluster, ClusterSpec, MachineSpec, RackSpec, SlotSpec};

use crate::charts::{self, LineChart, Series};
use crate::clusters::{self, shipped};
use crate::generate::{self, GeneratorConfig};
use crate::metrics::{AppReport, RunSummary, SimulationReport};
use crate::models::NETWORK_INTENSIVE_SLOWDOWN;
use crate::simulator::{
    simulate, Misreport, SimulationConfig, SimulationError, SpeedChangeReporting,
};
use crate::workload::{Workload, WorkloadApp};

/// Every experiment: name and one-line description.
pub const EXPERIMENTS: &[(&str, &str)] = &[
    (
        "fig9-10-rho-cdf",
        "CDF of finish-time fairness rho per policy, Workload 1 and Workload 2",
    ),
    (
        "fig11-12-gpu-time",
        "total GPU time per policy, Workload 1 and Workload 2",
    ),
    (
        "fig13-placement",
        "CDF of per-app placement scores per policy, Workload 1 and Workload 2",
    ),
    (
        "fig14-contention",
        "max rho per policy on the cluster scaled to 1, 1/2 and 1/4 (Workload 1)",
    ),
    (
        "fig15-16-network",
        "max rho and GPU time per policy as the network-intensive share goes 0..1 (Workload 2)",
    ),
    (
        "fig17-estimation-error",
        "Themis's max rho with estimation errors of 0, 10, 20, 50% (Workload 2)",
    ),
    (
        "fig18-liar",
        "64 GPUs, 8 identical apps, one exaggerates its slowdown by 0..100%: liar vs others",
    ),
    (
        "fig19-sensitivity",
        "Themis's max rho and GPU time for fairness knob f x lease length (Workload 2)",
    ),
    (
        "heterogeneous",
        "max rho, Jain's index, mean JCT and makespan per policy on mixed K80/P100/V100 \
         clusters at 1x-4x contention (Workload 1)",
    ),
    (
        "heterogeneous-seeds",
        "the heterogeneous experiment's max rho on other draws: Workload 1 seeds 1-2 and \
         Workload 2 seeds 0-2, every policy, and Themis's rank at each point",
    ),
    (
        "adaptation",
        "static vs dynamic (batch-size scaling) jobs: max rho, share with rho > 1, makespan \
         and mean JCT per policy, Themis told the schedule or only the current speed",
    ),
    (
        "synergy",
        "mean JCT, makespan and max rho of Themis, SRTF and Gavel-FTF with GPU-proportional vs \
         sensitivity-aware CPUs and memory, and of Synergy-Tune, Synergy's 128-GPU cluster and \
         derived trace at rising load",
    ),
    (
        "synergy-steady",
        "the synergy experiment in Synergy's steady state: 1000 jobs measured at loads the \
         cluster keeps up with",
    ),
];

/// How big the experiments are.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExperimentScale {
    /// Apps per generated workload.
    pub apps: usize,
    /// The generators' `duration_scale` (GPU times and arrival gaps).
    pub duration_scale: f64,
    /// Independent seeds for experiments with random errors (Fig 17).
    pub error_seeds: u64,
    /// Workload draws of `heterogeneous-seeds` (at most five).
    pub workload_draws: usize,
    /// Jobs measured in the steady state of `synergy-steady`.
    pub steady_state_jobs: usize,
    /// Worker threads (0: all available cores).
    pub threads: usize,
}

impl ExperimentScale {
    /// The documented size: the generators' defaults (30 apps, duration scale 0.1).
    pub fn full() -> Self {
        Self {
            apps: generate::DEFAULT_APPS,
            duration_scale: generate::DEFAULT_DURATION_SCALE,
            error_seeds: 3,
            workload_draws: 5,
            steady_state_jobs: 1000,
            threads: 0,
        }
    }

    /// A tiny version for tests: 2 apps, 1/100 of the trace's durations.
    pub fn tiny() -> Self {
        Self {
            apps: 2,
            duration_scale: 0.01,
            error_seeds: 1,
            workload_draws: 1,
            steady_state_jobs: 8,
            threads: 0,
        }
    }

    fn generator(&self) -> GeneratorConfig {
        self.generator_with_seed(0)
    }

    fn generator_with_seed(&self, seed: u64) -> GeneratorConfig {
        GeneratorConfig::philly_like(self.apps, seed, self.duration_scale)
    }
}

impl Default for ExperimentScale {
    fn default() -> Self {
        Self::full()
    }
}

/// What an experiment produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ExperimentOutput {
    pub name: String,
    /// CSV and SVG files written, in the output directory.
    pub files: Vec<PathBuf>,
    /// A few lines of headline numbers.
    pub summary: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    #[error("unknown experiment {0:?}; choose one of {known}", known = names())]
    Unknown(String),
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Cluster(#[from] agora_market::cluster_file::ClusterFileError),
    #[error(transparent)]
    Scale(#[from] clusters::InvalidScale),
    #[error("invalid cluster: {0}")]
    Topology(#[from] agora_market::topology::TopologyError),
    #[error(transparent)]
    Generator(#[from] generate::GeneratorError),
    #[error("simulation {label} failed: {source}")]
    Simulation {
        label: String,
        source: SimulationError,
    },
    #[error(transparent)]
    Chart(#[from] charts::ChartError),
}

fn names() -> String {
    EXPERIMENTS
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs experiment `name`, writing its CSV and SVG files into `out_dir` (created if needed).
pub fn run_experiment(
    name: &str,
    out_dir: &Path,
    scale: ExperimentScale,
) -> Result<ExperimentOutput, ExperimentError> {
    if !EXPERIMENTS.iter().any(|(known, _)| *known == name) {
        return Err(ExperimentError::Unknown(name.to_owned()));
    }
    std::fs::create_dir_all(out_dir).map_err(|source| ExperimentError::Io {
        path: out_dir.to_owned(),
        source,
    })?;
    let mut out = Output {
        dir: out_dir.to_owned(),
        files: Vec::new(),
    };
    let summary = match name {
        "fig9-10-rho-cdf" => rho_cdf(&mut out, scale)?,
        "fig11-12-gpu-time" => gpu_time(&mut out, scale)?,
        "fig13-placement" => placement(&mut out, scale)?,
        "fig14-contention" => contention(&mut out, scale)?,
        "fig15-16-network" => network(&mut out, scale)?,
        "fig17-estimation-error" => estimation_error(&mut out, scale)?,
        "fig18-liar" => liar(&mut out, scale)?,
        "fig19-sensitivity" => sensitivity(&mut out, scale)?,
        "heterogeneous" => heterogeneous(&mut out, scale)?,
        "heterogeneous-seeds" => heterogeneous_seeds(&mut out, scale)?,
        "adaptation" => adaptation(&mut out, scale)?,
        "synergy" => synergy(&mut out, scale)?,
        "synergy-steady" => synergy_steady(&mut out, scale)?,
        _ => return Err(ExperimentError::Unknown(name.to_owned())),
    };
    Ok(ExperimentOutput {
        name: name.to_owned(),
        files: out.files,
        summary,
    })
}

struct Output {
    dir: PathBuf,
    files: Vec<PathBuf>,
}

impl Output {
    fn csv(&mut self, file: &str, text: &str) -> Result<(), ExperimentError> {
        let path = self.dir.join(file);
        std::fs::write(&path, text).map_err(|source| ExperimentError::Io {
            path: path.clone(),
            source,
        })?;
        self.files.push(path);
        Ok(())
    }

    fn lines(
        &mut self,
        file: &str,
        chart: &LineChart<'_>,
        series: &[Series],
    ) -> Result<(), ExperimentError> {
        let path = self.dir.join(file);
        charts::line_chart(&path, chart, series)?;
        self.files.push(path);
        Ok(())
    }

    fn bars(
        &mut self,
        file: &str,
        title: &str,
        y_label: &str,
        categories: &[String],
        series: &[(String, Vec<f64>)],
    ) -> Result<(), ExperimentError> {
        let path = self.dir.join(file);
        charts::bar_chart(&path, title, y_label, categories, series)?;
        self.files.push(path);
        Ok(())
    }
}

/// One simulation to run.
struct Run<'a> {
    label: String,
    cluster: &'a Cluster,
    workload: &'a Workload,
    config: SimulationConfig,
}

/// Runs simulations on parallel threads; reports in the order of `runs`.
fn simulate_all(
    runs: &[Run<'_>],
    threads: usize,
) -> Result<Vec<SimulationReport>, ExperimentError> {
    let threads = if threads == 0 {
        std::thread::available_parallelism().map_or(1, usize::from)
    } else {
        threads
    }
    .clamp(1, runs.len().max(1));
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<SimulationReport, SimulationError>>>> =
        Mutex::new((0..runs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(run) = runs.get(index) else { break };
                let started = Instant::now();
                let result = simulate(run.cluster, run.workload, &run.config, |_| {});
                // Progress on standard error: the larger experiments run for many minutes.
                eprintln!(
                    "run {}/{} done: {} ({:.1} s)",
                    done.fetch_add(1, Ordering::Relaxed) + 1,
                    runs.len(),
                    run.label,
                    started.elapsed().as_secs_f64()
                );
                if let Ok(mut results) = results.lock() {
                    results[index] = Some(result);
                }
            });
        }
    });
    let results = results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    runs.iter()
        .zip(results)
        .map(|(run, result)| match result {
            Some(Ok(report)) => Ok(report),
            Some(Err(source)) => Err(ExperimentError::Simulation {
                label: run.label.clone(),
                source,
            }),
            None => Err(ExperimentError::Simulation {
                label: run.label.clone(),
                source: SimulationError::InvalidArrival(AppId("worker panicked".to_owned())),
            }),
        })
        .collect()
}

/// One run per policy for each (label, cluster, workload), labelled `label/policy`.
fn every_policy<'a>(
    points: impl Iterator<Item = (String, &'a Cluster, &'a Workload)>,
) -> Vec<Run<'a>> {
    points
        .flat_map(|(label, cluster, workload)| {
            Policy::ALL.into_iter().map(move |policy| Run {
                label: format!("{label}/{policy}"),
                cluster,
                workload,
                config: config(policy),
            })
        })
        .collect()
}

fn config(policy: Policy) -> SimulationConfig {
    SimulationConfig {
        market: MarketConfig {
            policy,
            ..MarketConfig::default()
        },
        ..SimulationConfig::default()
    }
}

fn cluster_256_spec() -> Result<ClusterSpec, ExperimentError> {
    Ok(clusters::load_cluster_spec(shipped::path(
        shipped::THEMIS_SIM_256,
    ))?)
}

fn cluster_256() -> Result<Cluster, ExperimentError> {
    Ok(Cluster::from_spec(&cluster_256_spec()?)?)
}

const HOURS: f64 = 3600.0;

/// Both workloads x all policies on the 256-GPU cluster: the runs behind Figs 9-13.
#[derive(Debug, Clone)]
struct Macro {
    /// (workload label, one report per `Policy::ALL`).
    workloads: Vec<(&'static str, Vec<SimulationReport>)>,
}

/// Figs 9-13 share their runs: the last scale's are kept for the process's lifetime.
static MACRO_CACHE: Mutex<Option<(ExperimentScale, Macro)>> = Mutex::new(None);

fn macrobenchmarks(scale: ExperimentScale) -> Result<Macro, ExperimentError> {
    let mut cache = MACRO_CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = ExperimentScale {
        threads: 0,
        ..scale
    };
    if let Some((cached, runs)) = cache.as_ref() {
        if *cached == key {
            return Ok(runs.clone());
        }
    }
    let runs = run_macrobenchmarks(scale)?;
    *cache = Some((key, runs.clone()));
    Ok(runs)
}

fn run_macrobenchmarks(scale: ExperimentScale) -> Result<Macro, ExperimentError> {
    let cluster = cluster_256()?;
    let generator = scale.generator();
    let workloads = [
        ("workload1", generate::workload1(&generator)?),
        ("workload2", generate::workload2(&generator)?),
    ];
    let runs = every_policy(
        workloads
            .iter()
            .map(|(label, workload)| (label.to_string(), &cluster, workload)),
    );
    let mut reports = simulate_all(&runs, scale.threads)?.into_iter();
    Ok(Macro {
        workloads: workloads
            .iter()
            .map(|(label, _)| (*label, reports.by_ref().take(Policy::ALL.len()).collect()))
            .collect(),
    })
}

fn cdf_points(sorted: &[f64]) -> Vec<(f64, f64)> {
    let n = sorted.len() as f64;
    sorted
        .iter()
        .enumerate()
        .map(|(i, &value)| (value, (i + 1) as f64 / n))
        .collect()
}

fn themis_vs_best_baseline(values: &[(Policy, f64)]) -> (f64, Policy, f64) {
    let themis = values
        .iter()
        .find(|(policy, _)| *policy == Policy::Themis)
        .map_or(f64::NAN, |(_, value)| *value);
    let (best, value) = values
        .iter()
        .filter(|(policy, _)| *policy != Policy::Themis)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .copied()
        .unwrap_or((Policy::Themis, f64::NAN));
    (themis, best, value)
}

fn rho_cdf(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    let runs = macrobenchmarks(scale)?;
    let mut csv = String::from("workload,policy,rank,cdf,rho\n");
    let mut summary_csv = String::from(
        "workload,policy,apps,unfinished_apps,max_rho,p95_rho,median_rho,jains_index,apps_rho_above_one,apps_rho_above_two\n",
    );
    let mut summary = String::new();
    for (figure, (workload, reports)) in ["fig9", "fig10"].iter().zip(&runs.workloads) {
        let mut series = Vec::new();
        for report in reports {
            let policy = report.summary.policy;
            for (rank, (rho, cdf)) in cdf_points(&report.rho_cdf).into_iter().enumerate() {
                let _ = writeln!(csv, "{workload},{policy},{rank},{cdf:.6},{rho:.6}");
            }
            let s = &report.summary;
            let _ = writeln!(
                summary_csv,
                "{workload},{policy},{},{},{:.6},{:.6},{:.6},{:.6},{},{}",
                s.apps,
                s.unfinished_apps,
                s.max_rho,
                s.p95_rho,
                s.median_rho,
                s.jains_index,
                s.apps_rho_above_one,
                s.apps_rho_above_two
            );
            series.push(Series::new(policy.name(), cdf_points(&report.rho_cdf)));
        }
        out.lines(
            &format!("{figure}-{workload}-rho-cdf.svg"),
            &LineChart {
                title: &format!("Finish-time fairness, {workload} (256 GPUs)"),
                x_label: "rho",
                y_label: "fraction of apps",
                markers: false,
                steps: true,
            },
            &series,
        )?;
        let max: Vec<(Policy, f64)> = reports
            .iter()
            .map(|r| (r.summary.policy, r.summary.max_rho))
            .collect();
        let (themis, best, value) = themis_vs_best_baseline(&max);
        let worst = max.iter().map(|m| m.1).fold(f64::NEG_INFINITY, f64::max);
        let _ = writeln!(
            summary,
            "{workload}: max rho themis {themis:.2}; best baseline {best} {value:.2} ({:.2}x themis); worst baseline {worst:.2} ({:.2}x)",
            value / themis,
            worst / themis
        );
        let _ = writeln!(
            summary,
            "  max rho by policy: {}",
            max.iter()
                .map(|(p, v)| format!("{p} {v:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    out.csv("rho-cdf.csv", &csv)?;
    out.csv("summary.csv", &summary_csv)?;
    Ok(summary)
}

fn gpu_time(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    let runs = macrobenchmarks(scale)?;
    let mut csv = String::from("workload,policy,total_gpu_hours,relative_to_themis\n");
    let mut summary = String::new();
    let categories: Vec<String> = Policy::ALL.iter().map(|p| p.name().to_owned()).collect();
    let mut series = Vec::new();
    for (workload, reports) in &runs.workloads {
        let hours: Vec<(Policy, f64)> = reports
            .iter()
            .map(|r| (r.summary.policy, r.summary.total_gpu_seconds / HOURS))
            .collect();
        let (themis, best, value) = themis_vs_best_baseline(&hours);
        for (policy, gpu_hours) in &hours {
            let _ = writeln!(
                csv,
                "{workload},{policy},{gpu_hours:.3},{:.4}",
                gpu_hours / themis
            );
        }
        let _ = writeln!(
            summary,
            "{workload}: GPU hours themis {themis:.1}; best baseline {best} {value:.1} (themis {:+.1}%); {}",
            (themis / value - 1.0) * 100.0,
            hours
                .iter()
                .map(|(p, v)| format!("{p} {v:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        series.push((
            (*workload).to_owned(),
            hours.iter().map(|h| h.1).collect::<Vec<_>>(),
        ));
    }
    out.csv("gpu-time.csv", &csv)?;
    out.bars(
        "fig11-12-gpu-time.svg",
        "Total GPU time per policy (256 GPUs)",
        "GPU hours",
        &categories,
        &series,
    )?;
    Ok(summary)
}

fn placement(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    let runs = macrobenchmarks(scale)?;
    let mut csv = String::from("workload,policy,rank,cdf,placement_score\n");
    let mut summary = String::new();
    for (workload, reports) in &runs.workloads {
        let mut series = Vec::new();
        let mut means = Vec::new();
        for report in reports {
            let policy = report.summary.policy;
            let mut scores: Vec<f64> = report.apps.iter().map(|a| a.placement_score).collect();
            scores.sort_by(f64::total_cmp);
            for (rank, (score, cdf)) in cdf_points(&scores).into_iter().enumerate() {
                let _ = writeln!(csv, "{workload},{policy},{rank},{cdf:.6},{score:.6}");
            }
            means.push(format!(
                "{policy} {:.3}",
                report.summary.mean_placement_score
            ));
            series.push(Series::new(policy.name(), cdf_points(&scores)));
        }
        out.lines(
            &format!("fig13-{workload}-placement-cdf.svg"),
            &LineChart {
                title: &format!("Placement scores, {workload} (256 GPUs)"),
                x_label: "placement score (1 is best)",
                y_label: "fraction of apps",
                markers: false,
                steps: true,
            },
            &series,
        )?;
        let _ = writeln!(
            summary,
            "{workload}: mean placement score {}",
            means.join(", ")
        );
    }
    out.csv("placement.csv", &csv)?;
    Ok(summary)
}

/// A sweep: for each x, one report per policy in `policies`.
fn sweep_csv_and_charts(
    header_x: &str,
    xs: &[f64],
    policies: &[Policy],
    reports: &[SimulationReport],
) -> (String, Vec<Series>, Vec<Series>) {
    let mut csv = format!("{header_x},policy,max_rho,total_gpu_hours,unfinished_apps\n");
    let mut rho_series: Vec<Series> = policies
        .iter()
        .map(|p| Series::new(p.name(), Vec::new()))
        .collect();
    let mut gpu_series = rho_series.clone();
    for (i, &x) in xs.iter().enumerate() {
        for (j, policy) in policies.iter().enumerate() {
            let s = &reports[i * policies.len() + j].summary;
            let hours = s.total_gpu_seconds / HOURS;
            let _ = writeln!(
                csv,
                "{x},{policy},{:.6},{hours:.3},{}",
                s.max_rho, s.unfinished_apps
            );
            rho_series[j].points.push((x, s.max_rho));
            gpu_series[j].points.push((x, hours));
        }
    }
    (csv, rho_series, gpu_series)
}

fn contention(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    let spec = cluster_256_spec()?;
    let workload = generate::workload1(&scale.generator())?;
    let fractions = [1.0, 0.5, 0.25];
    let clusters: Vec<Cluster> = fractions
        .iter()
        .map(|&f| Ok(Cluster::from_spec(&clusters::scale_cluster(&spec, f)?)?))
        .collect::<Result<_, ExperimentError>>()?;
    let runs = every_policy(
        clusters
            .iter()
            .zip(fractions)
            .map(|(cluster, fraction)| (format!("cluster x{fraction}"), cluster, &workload)),
    );
    let reports = simulate_all(&runs, scale.threads)?;
    let contention: Vec<f64> = fractions.iter().map(|f| 1.0 / f).collect();
    let (csv, rho, _) = sweep_csv_and_charts("contention", &contention, &Policy::ALL, &reports);
    let gpus: Vec<usize> = clusters.iter().map(Cluster::len).collect();
    out.csv("contention.csv", &csv)?;
    out.lines(
        "fig14-contention.svg",
        &LineChart {
            title: &format!("Max rho vs contention, workload1 (cluster GPUs {gpus:?})"),
            x_label: "contention (1 / cluster fraction)",
            y_label: "max rho",
            markers: true,
            steps: false,
        },
        &rho,
    )?;
    let mut summary = format!("cluster GPUs {gpus:?}\n");
    for series in &rho {
        let _ = writeln!(
            summary,
            "  {}: max rho {}",
            series.name,
            series
                .points
                .iter()
                .map(|(x, y)| format!("{x}x {y:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(summary)
}

/// The contention levels of the heterogeneous experiments: the cluster cut to 1, 1/2, 1/3 and
/// 1/4 of its machines.
const MIXED_CONTENTION: [f64; 4] = [1.0, 2.0, 3.0, 4.0];

/// Gavel's 108-GPU cluster and the mixed 256-GPU cluster, each at every [`MIXED_CONTENTION`].
fn mixed_clusters() -> Result<Vec<(&'static str, Vec<Cluster>)>, ExperimentError> {
    [
        ("gavel108", shipped::GAVEL_108),
        ("mixed256", shipped::THEMIS_SIM_256_MIXED),
    ]
    .into_iter()
    .map(|(name, file)| {
        let spec = clusters::load_cluster_spec(shipped::path(file))?;
        let clusters = MIXED_CONTENTION
            .iter()
            .map(|&c| {
                Ok(Cluster::from_spec(&clusters::scale_cluster(
                    &spec,
                    1.0 / c,
                )?)?)
            })
            .collect::<Result<_, ExperimentError>>()?;
        Ok((name, clusters))
    })
    .collect()
}

/// The heterogeneous experiment on draws it was not looked at with: Workload 1 with seeds 1
/// and 2 and Workload 2 with seeds 0-2, both mixed clusters at 1x-4x, every policy. Reports
/// each point's lowest max rho and Themis's rank, and charts Themis's max rho over the lowest
/// of the other policies (at or below 1: Themis is the fairest there).
fn heterogeneous_seeds(
    out: &mut Output,
    scale: ExperimentScale,
) -> Result<String, ExperimentError> {
    let draws: [(&str, generate::Generator, u64); 5] = [
        ("workload1", generate::workload1, 1),
        ("workload1", generate::workload1, 2),
        ("workload2", generate::workload2, 0),
        ("workload2", generate::workload2, 1),
        ("workload2", generate::workload2, 2),
    ];
    let draws = &draws[..scale.workload_draws.clamp(1, draws.len())];
    let workloads: Vec<Workload> = draws
        .iter()
        .map(|(_, generator, seed)| generator(&scale.generator_with_seed(*seed)))
        .collect::<Result<_, _>>()?;
    let clusters = mixed_clusters()?;
    let mut points = Vec::new();
    for ((workload_name, _, seed), workload) in draws.iter().zip(&workloads) {
        for (cluster_name, scaled) in &clusters {
            for (cluster, c) in scaled.iter().zip(MIXED_CONTENTION) {
                points.push((
                    format!("{workload_name} s{seed} {cluster_name} x{c}"),
                    cluster,
                    workload,
                ));
            }
        }
    }
    let reports = simulate_all(&every_policy(points.into_iter()), scale.threads)?;
    let mut csv = String::from(
        "workload,seed,cluster,contention,policy,unfinished_apps,max_rho,jains_index,mean_jct_hours\n",
    );
    let mut losses = format!("workload,seed,cluster,contention,{LOSS_COLUMNS}");
    let mut series: Vec<Series> = Vec::new();
    let (mut lowest_count, mut total) = (0, 0);
    let mut summary = String::new();
    let mut at_point = reports.chunks(Policy::ALL.len());
    for (workload_name, _, seed) in draws {
        for (cluster_name, _) in &clusters {
            let mut ratios = Vec::new();
            for c in MIXED_CONTENTION {
                let at = at_point.next().expect("a report per point and policy");
                for (policy, report) in Policy::ALL.iter().zip(at) {
                    let s = &report.summary;
                    let _ = writeln!(
                        csv,
                        "{workload_name},{seed},{cluster_name},{c},{policy},{},{:.6},{:.6},{:.6}",
                        s.unfinished_apps,
                        s.max_rho,
                        s.jains_index,
                        s.mean_completion_seconds / HOURS
                    );
                }
                let themis = at[0].summary.max_rho;
                let best_other = at[1..]
                    .iter()
                    .map(|report| report.summary.max_rho)
                    .fold(f64::INFINITY, f64::min);
                let rank = 1 + at[1..]
                    .iter()
                    .filter(|r| r.summary.max_rho < themis)
                    .count();
                total += 1;
                lowest_count += usize::from(rank == 1);
                ratios.push((c, themis / best_other));
                if rank > 1 {
                    let loss = Loss::of(at);
                    let _ = writeln!(
                        summary,
                        "  {workload_name} seed {seed} {cluster_name} {c}x: themis {themis:.3}, rank {rank} of {}; lowest {best_other:.3}; {}",
                        Policy::ALL.len(),
                        loss.cause()
                    );
                    let _ = writeln!(
                        losses,
                        "{workload_name},{seed},{cluster_name},{c},{}",
                        loss.csv_row()
                    );
                }
            }
            series.push(Series::new(
                format!("{workload_name} s{seed} {cluster_name}"),
                ratios,
            ));
        }
    }
    out.csv("heterogeneous-seeds.csv", &csv)?;
    out.csv("heterogeneous-seeds-losses.csv", &losses)?;
    out.lines(
        "heterogeneous-seeds-themis-vs-lowest.svg",
        &LineChart {
            title: "Themis's max rho / the lowest other policy's, per draw and cluster",
            x_label: "contention (1 / cluster fraction)",
            y_label: "max rho ratio (<= 1: Themis the fairest)",
            markers: true,
            steps: false,
        },
        &series,
    )?;
    Ok(format!(
        "themis has the lowest max rho (ties included) at {lowest_count} of {total} points; elsewhere:\n{summary}"
    ))
}

/// The columns of a loss after the point's own ([`Loss::csv_row`]).
const LOSS_COLUMNS: &str = "themis_max_rho,lowest_policy,lowest_max_rho,app,model,t_cluster_s,themis_completion_s,lowest_completion_s,themis_n_avg,\
lowest_n_avg,themis_rho,lowest_rho,themis_mean_gpus,lowest_mean_gpus,themis_restarts,\
lowest_restarts,cause\n";

/// Where Themis is not the fairest: its worst app, and the same app under the policy with the
/// lowest max rho. An app's rho is T_sh / (T_cluster x N_avg), so its ratio between the two
/// runs is the ratio of its finish times over the ratio of its N_avg (T_cluster, the app alone
/// on the cluster, barely moves): either it finishes later under Themis, or it finishes as
/// early but fewer apps were active around it (the others finished sooner).
struct Loss<'a> {
    themis: &'a AppReport,
    lowest_policy: Policy,
    lowest_max_rho: f64,
    /// The same app under the lowest policy.
    lowest: &'a AppReport,
    themis_max_rho: f64,
}

impl<'a> Loss<'a> {
    /// `at`: one point's reports, Themis's first (`Policy::ALL`'s order).
    fn of(at: &'a [SimulationReport]) -> Self {
        let worst = |report: &'a SimulationReport| {
            report
                .apps
                .iter()
                .max_by(|a, b| a.rho.total_cmp(&b.rho).then_with(|| b.app.cmp(&a.app)))
                .expect("a point has apps")
        };
        let themis = worst(&at[0]);
        let lowest_run = at[1..]
            .iter()
            .min_by(|a, b| a.summary.max_rho.total_cmp(&b.summary.max_rho))
            .expect("other policies");
        let lowest = lowest_run
            .apps
            .iter()
            .find(|app| app.app == themis.app)
            .expect("every policy runs the same apps");
        Self {
            themis,
            lowest_policy: lowest_run.summary.policy,
            lowest_max_rho: lowest_run.summary.max_rho,
            lowest,
            themis_max_rho: at[0].summary.max_rho,
        }
    }

    /// The loss in words: which of the two factors of rho makes it.
    fn cause(&self) -> String {
        let (t, l) = (self.themis, self.lowest);
        let later = t.completion_seconds / l.completion_seconds;
        let fewer_apps = l.n_avg / t.n_avg;
        if later <= 1.01 && fewer_apps <= 1.01 {
            format!(
                "level: {} finishes {later:.3}x as late under themis with N_avg {:.3} against {:.3} under {}",
                t.app, t.n_avg, l.n_avg, self.lowest_policy
            )
        } else if later >= fewer_apps {
            format!(
                "{} finishes {later:.2}x later under themis (mean GPUs held {:.2} against {:.2}; {} restarts against {})",
                t.app,
                mean_gpus(t),
                mean_gpus(l),
                t.restarts,
                l.restarts
            )
        } else {
            format!(
                "{} finishes {later:.2}x as late under themis, but its N_avg is {:.2} against {:.2} under {}",
                t.app, t.n_avg, l.n_avg, self.lowest_policy
            )
        }
    }

    fn csv_row(&self) -> String {
        let (t, l) = (self.themis, self.lowest);
        format!(
            "{:.6},{},{:.6},{},{},{:.3},{:.3},{:.3},{:.6},{:.6},{:.6},{:.6},{:.3},{:.3},{},{},\"{}\"",
            self.themis_max_rho,
            self.lowest_policy,
            self.lowest_max_rho,
            t.app,
            t.model,
            t.t_cluster_seconds,
            t.completion_seconds,
            l.completion_seconds,
            t.n_avg,
            l.n_avg,
            t.rho,
            l.rho,
            mean_gpus(t),
            mean_gpus(l),
            t.restarts,
            l.restarts,
            self.cause()
        )
    }
}

/// GPUs an app held on average over its lifetime.
fn mean_gpus(app: &AppReport) -> f64 {
    app.gpu_seconds / app.completion_seconds
}

/// A column of the heterogeneous experiment: CSV name, chart label, value of a run.
type Metric = (&'static str, &'static str, fn(&RunSummary) -> f64);

const HETEROGENEOUS_METRICS: [Metric; 4] = [
    ("max_rho", "max rho", |s| s.max_rho),
    ("jains_index", "Jain's index of rho", |s| s.jains_index),
    ("mean_jct_hours", "mean JCT (hours)", |s| {
        s.mean_completion_seconds / HOURS
    }),
    ("makespan_hours", "makespan (hours)", |s| {
        s.makespan_seconds / HOURS
    }),
];

/// Workload 1 on Gavel's 108-GPU cluster and the mixed 256-GPU cluster, each scaled to 1,
/// 1/2, 1/3 and 1/4 of its machines (contention 1x-4x), every policy; apps run at their
/// models' measured speeds per type (`models::throughput_of`).
fn heterogeneous(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    let workload = generate::workload1(&scale.generator())?;
    let contention = MIXED_CONTENTION;
    let mut summary = String::new();
    let mut losses = format!("cluster,contention,{LOSS_COLUMNS}");
    for (name, clusters) in mixed_clusters()? {
        let runs = every_policy(
            clusters
                .iter()
                .zip(contention)
                .map(|(cluster, c)| (format!("{name} x{c}"), cluster, &workload)),
        );
        let reports = simulate_all(&runs, scale.threads)?;
        let gpus: Vec<usize> = clusters.iter().map(Cluster::len).collect();
        let metrics = &HETEROGENEOUS_METRICS;
        let mut csv = String::from("contention,gpus,policy,unfinished_apps");
        for (column, ..) in metrics {
            csv.push(',');
            csv.push_str(column);
        }
        csv.push('\n');
        for (i, &c) in contention.iter().enumerate() {
            for (j, policy) in Policy::ALL.iter().enumerate() {
                let s = &reports[i * Policy::ALL.len() + j].summary;
                let _ = write!(csv, "{c},{},{policy},{}", gpus[i], s.unfinished_apps);
                for (_, _, value) in metrics {
                    let _ = write!(csv, ",{:.6}", value(s));
                }
                csv.push('\n');
            }
        }
        out.csv(&format!("heterogeneous-{name}.csv"), &csv)?;
        for (column, label, value) in metrics {
            let series: Vec<Series> = Policy::ALL
                .iter()
                .enumerate()
                .map(|(j, policy)| {
                    let points = contention
                        .iter()
                        .enumerate()
                        .map(|(i, &c)| (c, value(&reports[i * Policy::ALL.len() + j].summary)))
                        .collect();
                    Series::new(policy.name(), points)
                })
                .collect();
            out.lines(
                &format!("heterogeneous-{name}-{column}.svg"),
                &LineChart {
                    title: &format!("{label} vs contention, workload1, {name} (GPUs {gpus:?})"),
                    x_label: "contention (1 / cluster fraction)",
                    y_label: label,
                    markers: true,
                    steps: false,
                },
                &series,
            )?;
        }
        let _ = writeln!(summary, "{name}: cluster GPUs {gpus:?}");
        for (i, &c) in contention.iter().enumerate() {
            let at = &reports[i * Policy::ALL.len()..(i + 1) * Policy::ALL.len()];
            let best = at
                .iter()
                .min_by(|a, b| a.summary.max_rho.total_cmp(&b.summary.max_rho))
                .expect("every policy ran");
            let _ = writeln!(
                summary,
                "  {c}x: lowest max rho {} {:.2} (themis {:.2})",
                best.summary.policy, best.summary.max_rho, at[0].summary.max_rho
            );
            if best.summary.max_rho < at[0].summary.max_rho {
                let loss = Loss::of(at);
                let _ = writeln!(summary, "    {}", loss.cause());
                let _ = writeln!(losses, "{name},{c},{}", loss.csv_row());
            }
        }
    }
    out.csv("heterogeneous-losses.csv", &losses)?;
    Ok(summary)
}

/// Shockwave's setting (NSDI'23 §6): the same arrivals with every job static, and with half
/// the apps scaling their batch size as they train (`generate::make_dynamic`), both
/// workloads, on the 256-GPU cluster scaled to a quarter (4x contention: at the trace's load
/// the whole cluster leaves every app at rho 1); every policy, plus Themis told only each
/// phase's speed as it comes (`SpeedChangeReporting::Reactive`).
fn adaptation(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    const DYNAMIC_FRACTION: f64 = 0.5;
    const CLUSTER_FRACTION: f64 = 0.25;
    let cluster = Cluster::from_spec(&clusters::scale_cluster(
        &cluster_256_spec()?,
        CLUSTER_FRACTION,
    )?)?;
    let mut points = Vec::new();
    for (name, generator) in [
        ("workload1", generate::workload1 as generate::Generator),
        ("workload2", generate::workload2),
    ] {
        for (jobs, fraction) in [("static", 0.0), ("dynamic", DYNAMIC_FRACTION)] {
            let config = GeneratorConfig {
                dynamic_fraction: fraction,
                ..scale.generator()
            };
            points.push((format!("{name} {jobs}"), generator(&config)?));
        }
    }
    let mut runs = every_policy(
        points
            .iter()
            .map(|(label, workload)| (label.clone(), &cluster, workload)),
    );
    for (label, workload) in points
        .iter()
        .filter(|(label, _)| label.ends_with("dynamic"))
    {
        runs.push(Run {
            label: format!("{label}/themis-reactive"),
            cluster: &cluster,
            workload,
            config: SimulationConfig {
                speed_changes: SpeedChangeReporting::Reactive,
                ..config(Policy::Themis)
            },
        });
    }
    let reports = simulate_all(&runs, scale.threads)?;
    let mut csv = String::from(
        "workload,jobs,policy,max_rho,share_rho_above_one,makespan_hours,mean_jct_hours,\
         unfinished_apps\n",
    );
    let mut summary = String::new();
    for (run, report) in runs.iter().zip(&reports) {
        let s = &report.summary;
        let (point, policy) = run.label.rsplit_once('/').expect("label/policy");
        let (workload, jobs) = point.split_once(' ').expect("workload jobs");
        let _ = writeln!(
            csv,
            "{workload},{jobs},{policy},{:.6},{:.6},{:.6},{:.6},{}",
            s.max_rho,
            s.apps_rho_above_one as f64 / s.apps.max(1) as f64,
            s.makespan_seconds / HOURS,
            s.mean_completion_seconds / HOURS,
            s.unfinished_apps
        );
    }
    out.csv("adaptation.csv", &csv)?;
    for (point, _) in &points {
        let at: Vec<(&Run, &SimulationReport)> = runs
            .iter()
            .zip(&reports)
            .filter(|(run, _)| run.label.rsplit_once('/').is_some_and(|(p, _)| p == point))
            .collect();
        let categories: Vec<String> = at
            .iter()
            .map(|(run, _)| run.label.rsplit_once('/').expect("label").1.to_owned())
            .collect();
        let max_rho: Vec<f64> = at.iter().map(|(_, r)| r.summary.max_rho).collect();
        out.bars(
            &format!("adaptation-{}-max-rho.svg", point.replace(' ', "-")),
            &format!("max rho per policy, {point} jobs, {} GPUs", cluster.len()),
            "max rho",
            &categories,
            &[("max rho".to_owned(), max_rho)],
        )?;
        let (best, themis) = (
            at.iter()
                .filter(|(run, _)| !run.label.ends_with("/themis"))
                .min_by(|a, b| a.1.summary.max_rho.total_cmp(&b.1.summary.max_rho))
                .expect("baselines ran"),
            at.iter()
                .find(|(run, _)| run.label.ends_with("/themis"))
                .expect("themis ran"),
        );
        let _ = writeln!(
            summary,
            "{point}: themis max rho {:.2}, best other {} {:.2}",
            themis.1.summary.max_rho,
            best.0.label.rsplit_once('/').expect("label").1,
            best.1.summary.max_rho
        );
    }
    Ok(summary)
}

fn network(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    let cluster = cluster_256()?;
    let fractions = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0];
    let workloads: Vec<Workload> = fractions
        .iter()
        .map(|&fraction| {
            generate::workload2(&GeneratorConfig {
                network_intensive_fraction: Some(fraction),
                ..scale.generator()
            })
        })
        .collect::<Result<_, _>>()?;
    let runs = every_policy(
        workloads
            .iter()
            .zip(fractions)
            .map(|(workload, fraction)| (format!("network {fraction}"), &cluster, workload)),
    );
    let reports = simulate_all(&runs, scale.threads)?;
    let (csv, rho, gpu) = sweep_csv_and_charts(
        "network_intensive_fraction",
        &fractions,
        &Policy::ALL,
        &reports,
    );
    out.csv("network.csv", &csv)?;
    out.lines(
        "fig15-network-max-rho.svg",
        &LineChart {
            title: "Max rho vs share of network-intensive apps, workload2",
            x_label: "fraction of network-intensive apps",
            y_label: "max rho",
            markers: true,
            steps: false,
        },
        &rho,
    )?;
    out.lines(
        "fig16-network-gpu-time.svg",
        &LineChart {
            title: "GPU time vs share of network-intensive apps, workload2",
            x_label: "fraction of network-intensive apps",
            y_label: "GPU hours",
            markers: true,
            steps: false,
        },
        &gpu,
    )?;
    let mut summary = String::new();
    for (i, fraction) in fractions.iter().enumerate() {
        let at = |series: &[Series]| -> Vec<(Policy, f64)> {
            Policy::ALL
                .iter()
                .zip(series)
                .map(|(p, s)| (*p, s.points[i].1))
                .collect()
        };
        let (themis_rho, best_rho, best_rho_value) = themis_vs_best_baseline(&at(&rho));
        let (themis_gpu, best_gpu, best_gpu_value) = themis_vs_best_baseline(&at(&gpu));
        let _ = writeln!(
            summary,
            "network {fraction}: max rho themis {themis_rho:.2} vs best {best_rho} {best_rho_value:.2}; GPU h themis {themis_gpu:.1} vs best {best_gpu} {best_gpu_value:.1}"
        );
    }
    Ok(summary)
}

fn estimation_error(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    let cluster = cluster_256()?;
    let workload = generate::workload2(&scale.generator())?;
    let errors = [0.0, 0.1, 0.2, 0.5];
    let seeds: Vec<u64> = (0..scale.error_seeds.max(1)).collect();
    let runs: Vec<Run<'_>> = errors
        .iter()
        .flat_map(|&error| {
            let (cluster, workload) = (&cluster, &workload);
            seeds.iter().map(move |&seed| Run {
                label: format!("error {error}/seed {seed}"),
                cluster,
                workload,
                config: SimulationConfig {
                    estimation_error: error,
                    seed,
                    ..config(Policy::Themis)
                },
            })
        })
        .collect();
    let reports = simulate_all(&runs, scale.threads)?;
    let mut csv = String::from("estimation_error,seed,max_rho,total_gpu_hours,unfinished_apps\n");
    let mut mean = Series::new("themis (mean over seeds)", Vec::new());
    let mut worst = Series::new("themis (worst seed)", Vec::new());
    for (i, &error) in errors.iter().enumerate() {
        let chunk = &reports[i * seeds.len()..(i + 1) * seeds.len()];
        for (seed, report) in seeds.iter().zip(chunk) {
            let s = &report.summary;
            let _ = writeln!(
                csv,
                "{error},{seed},{:.6},{:.3},{}",
                s.max_rho,
                s.total_gpu_seconds / HOURS,
                s.unfinished_apps
            );
        }
        let rhos: Vec<f64> = chunk.iter().map(|r| r.summary.max_rho).collect();
        mean.points
            .push((error * 100.0, rhos.iter().sum::<f64>() / rhos.len() as f64));
        worst
            .points
            .push((error * 100.0, rhos.iter().copied().fold(0.0, f64::max)));
    }
    out.csv("estimation-error.csv", &csv)?;
    let base = mean.points[0].1;
    let summary = mean
        .points
        .iter()
        .map(|(x, y)| {
            format!(
                "error {x}%: mean max rho {y:.3} ({:+.1}%)",
                (y / base - 1.0) * 100.0
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    let series = vec![mean, worst];
    out.lines(
        "fig17-estimation-error.svg",
        &LineChart {
            title: "Themis: max rho vs estimation error, workload2",
            x_label: "estimation error X (% either way)",
            y_label: "max rho",
            markers: true,
            steps: false,
        },
        &series,
    )?;
    Ok(summary + "\n")
}

/// Fig 18's cluster: 64 GPUs, one 8-GPU machine (4 slots x 2 GPUs) and 28 2-GPU machines (one
/// slot of 2), in 4 racks of 7 2-GPU machines, the 8-GPU machine in the first rack.
pub fn liar_cluster_spec() -> ClusterSpec {
    let slot = |gpus| SlotSpec {
        gpus,
        gpu_type: "gpu".to_owned(),
    };
    let big = MachineSpec::new(vec![slot(2); 4]);
    let small = MachineSpec::new(vec![slot(2)]);
    let racks = (0..4)
        .map(|rack| {
            let mut machines = vec![small.clone(); 7];
            if rack == 0 {
                machines.insert(0, big.clone());
            }
            RackSpec { machines }
        })
        .collect();
    ClusterSpec { racks }
}

/// Fig 18's workload: 8 identical network-intensive single-job apps of 8 GPUs, all arriving at
/// time 0; the job's ideal run on 8 GPUs lasts 40 hours x `duration_scale`.
pub fn liar_workload(scale: ExperimentScale) -> Workload {
    let serial_iteration_time = 1.0;
    let total_iterations = (40.0 * HOURS * 8.0 * scale.duration_scale).round().max(1.0) as u64;
    let apps = (0..8)
        .map(|index| {
            let id = format!("liar-app-{index}");
            WorkloadApp {
                arrival_seconds: 0.0,
                model: "vgg16".to_owned(),
                app: App {
                    id: AppId(id.clone()),
                    kind: AppKind::SingleJob {
                        job: Job {
                            id: format!("{id}-j000"),
                            total_iterations,
                            completed_iterations: 0,
                            serial_iteration_time,
                            max_gpus: 8,
                            slowdown: NETWORK_INTENSIVE_SLOWDOWN,
                            stopped: false,
                            speed_changes: Vec::new(),
                        },
                        throughput: Default::default(),
                        sensitivity: Default::default(),
                    },
                },
                job_quality: Default::default(),
            }
        })
        .collect();
    Workload { apps }
}

/// The lying app of Fig 18.
pub const LIAR: &str = "liar-app-0";

fn liar(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    let cluster = Cluster::from_spec(&liar_cluster_spec())?;
    let workload = liar_workload(scale);
    let lies = [0.0, 25.0, 50.0, 75.0, 100.0];
    let runs: Vec<Run<'_>> = lies
        .iter()
        .map(|&x| Run {
            label: format!("liar {x}%"),
            cluster: &cluster,
            workload: &workload,
            config: SimulationConfig {
                misreport: Some(Misreport {
                    app: AppId(LIAR.to_owned()),
                    exaggeration: x / 100.0,
                }),
                ..config(Policy::Themis)
            },
        })
        .collect();
    let reports = simulate_all(&runs, scale.threads)?;
    let mut csv = String::from(
        "exaggeration_percent,liar_completion_hours,others_mean_completion_hours,liar_rho,others_mean_rho,liar_gpu_hours,others_mean_gpu_hours,liar_placement_score,others_mean_placement_score\n",
    );
    let mut liar_series = Series::new("liar", Vec::new());
    let mut others_series = Series::new("truthful apps (mean)", Vec::new());
    let mut summary = String::new();
    for (&x, report) in lies.iter().zip(&reports) {
        let (liars, others): (Vec<_>, Vec<_>) =
            report.apps.iter().partition(|app| app.app.0 == LIAR);
        let mean = |values: Vec<f64>| values.iter().sum::<f64>() / values.len().max(1) as f64;
        let liar = liars.first().copied();
        let get = |f: fn(&crate::metrics::AppReport) -> f64| liar.map_or(f64::NAN, f);
        let liar_completion = get(|a| a.completion_seconds) / HOURS;
        let others_completion = mean(others.iter().map(|a| a.completion_seconds).collect()) / HOURS;
        let liar_rho = get(|a| a.rho);
        let others_rho = mean(others.iter().map(|a| a.rho).collect());
        let _ = writeln!(
            csv,
            "{x},{liar_completion:.4},{others_completion:.4},{liar_rho:.6},{others_rho:.6},{:.4},{:.4},{:.6},{:.6}",
            get(|a| a.gpu_seconds) / HOURS,
            mean(others.iter().map(|a| a.gpu_seconds).collect()) / HOURS,
            get(|a| a.placement_score),
            mean(others.iter().map(|a| a.placement_score).collect()),
        );
        liar_series.points.push((x, liar_completion));
        others_series.points.push((x, others_completion));
        let _ = writeln!(
            summary,
            "lie {x}%: liar completion {liar_completion:.3} h (rho {liar_rho:.3}), truthful mean {others_completion:.3} h (rho {others_rho:.3})"
        );
    }
    out.csv("liar.csv", &csv)?;
    out.lines(
        "fig18-liar.svg",
        &LineChart {
            title: "Strategic lying: completion time (64 GPUs, 8 apps)",
            x_label: "slowdown exaggeration X (%)",
            y_label: "app completion time (hours)",
            markers: true,
            steps: false,
        },
        &[liar_series, others_series],
    )?;
    Ok(summary)
}

fn sensitivity(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    let cluster = cluster_256()?;
    let workload = generate::workload2(&scale.generator())?;
    let knobs = [0.2, 0.5, 0.8, 0.95];
    let leases = [5u64, 10, 20];
    let runs: Vec<Run<'_>> = leases
        .iter()
        .flat_map(|&lease| {
            let (cluster, workload) = (&cluster, &workload);
            knobs.iter().map(move |&f| {
                let mut config = config(Policy::Themis);
                config.market.fairness_knob = f;
                config.market.lease_length = Duration::from_secs(lease * 60);
                Run {
                    label: format!("f {f}/lease {lease} min"),
                    cluster,
                    workload,
                    config,
                }
            })
        })
        .collect();
    let reports = simulate_all(&runs, scale.threads)?;
    let mut csv =
        String::from("fairness_knob,lease_minutes,max_rho,total_gpu_hours,unfinished_apps\n");
    let mut rho = Vec::new();
    let mut gpu = Vec::new();
    let mut summary = String::new();
    for (i, lease) in leases.iter().enumerate() {
        let mut rho_line = Series::new(format!("lease {lease} min"), Vec::new());
        let mut gpu_line = rho_line.clone();
        for (j, f) in knobs.iter().enumerate() {
            let s = &reports[i * knobs.len() + j].summary;
            let hours = s.total_gpu_seconds / HOURS;
            let _ = writeln!(
                csv,
                "{f},{lease},{:.6},{hours:.3},{}",
                s.max_rho, s.unfinished_apps
            );
            rho_line.points.push((*f, s.max_rho));
            gpu_line.points.push((*f, hours));
        }
        let _ = writeln!(
            summary,
            "lease {lease} min: {}",
            rho_line
                .points
                .iter()
                .zip(&gpu_line.points)
                .map(|((f, r), (_, g))| format!("f {f}: max rho {r:.2}, {g:.1} GPU h"))
                .collect::<Vec<_>>()
                .join("; ")
        );
        rho.push(rho_line);
        gpu.push(gpu_line);
    }
    out.csv("sensitivity.csv", &csv)?;
    out.lines(
        "fig19a-sensitivity-max-rho.svg",
        &LineChart {
            title: "Themis: max rho vs fairness knob f, workload2",
            x_label: "fairness knob f",
            y_label: "max rho",
            markers: true,
            steps: false,
        },
        &rho,
    )?;
    out.lines(
        "fig19b-sensitivity-gpu-time.svg",
        &LineChart {
            title: "Themis: GPU time vs fairness knob f, workload2",
            x_label: "fairness knob f",
            y_label: "GPU hours",
            markers: true,
            steps: false,
        },
        &gpu,
    )?;
    Ok(summary)
}

/// Jobs per hour of the Synergy experiment's loads. The trace's mean job asks about 38
/// GPU-hours, so 3.4 jobs an hour would fill the 128 GPUs in a steady state; up to 4 jobs an
/// hour the trace's 120 jobs hardly wait, from 8 queues form (EVALUATION.md, part 3c).
pub const SYNERGY_LOADS: [f64; 4] = [4.0, 8.0, 12.0, 16.0];

/// One run of the Synergy experiment at each load.
struct SynergyRun {
    policy: Policy,
    allocation: ResourceAllocation,
    /// The run (index into [`SYNERGY_RUNS`]) with the same base policy and GPU-proportional
    /// CPUs and memory, whose jobs this run's are compared with.
    reference: usize,
}

const fn synergy_run(
    policy: Policy,
    allocation: ResourceAllocation,
    reference: usize,
) -> SynergyRun {
    SynergyRun {
        policy,
        allocation,
        reference,
    }
}

/// Themis, SRTF and Gavel-FTF each with GPU-proportional and sensitivity-aware CPUs and
/// memory, and Synergy-Tune on SRTF and on Gavel-FTF (sensitivity-aware: Tune places by the
/// demands the split then gives).
const SYNERGY_RUNS: [SynergyRun; 8] = [
    synergy_run(Policy::Themis, ResourceAllocation::GpuProportional, 0),
    synergy_run(Policy::Themis, ResourceAllocation::SensitivityAware, 0),
    synergy_run(Policy::Srtf, ResourceAllocation::GpuProportional, 2),
    synergy_run(Policy::Srtf, ResourceAllocation::SensitivityAware, 2),
    synergy_run(Policy::SynergySrtf, ResourceAllocation::SensitivityAware, 2),
    synergy_run(Policy::GavelFtf, ResourceAllocation::GpuProportional, 5),
    synergy_run(Policy::GavelFtf, ResourceAllocation::SensitivityAware, 5),
    synergy_run(Policy::SynergyFtf, ResourceAllocation::SensitivityAware, 5),
];

fn allocation_name(allocation: ResourceAllocation) -> &'static str {
    match allocation {
        ResourceAllocation::GpuProportional => "gpu-proportional",
        ResourceAllocation::SensitivityAware => "sensitivity-aware",
    }
}

/// A job finishing this much later than in the reference run counts as later (the
/// simulator's events land on whole milliseconds).
const LATER_SLACK_SECONDS: f64 = 1.0;

/// How `report`'s apps finished against the same apps in `reference`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Lateness {
    /// Apps that finished later (by more than [`LATER_SLACK_SECONDS`]).
    later: usize,
    /// Of those, the apps whose jobs restarted on other GPUs more often than in `reference`,
    /// each move costing a restart pause.
    later_and_moved: usize,
    /// The largest ratio of an app's completion time to its reference's.
    worst_ratio: f64,
}

/// `report`'s apps against the same apps in `reference` (apps missing there are left out).
fn later_than(report: &SimulationReport, reference: &SimulationReport) -> Lateness {
    let reference: std::collections::BTreeMap<&AppId, &AppReport> =
        reference.apps.iter().map(|app| (&app.app, app)).collect();
    let mut lateness = Lateness {
        later: 0,
        later_and_moved: 0,
        worst_ratio: 0.0,
    };
    for (app, before) in report
        .apps
        .iter()
        .filter_map(|app| Some((app, *reference.get(&app.app)?)))
    {
        let seconds = app.completion_seconds;
        lateness.worst_ratio = lateness
            .worst_ratio
            .max(seconds / before.completion_seconds);
        if seconds > before.completion_seconds + LATER_SLACK_SECONDS {
            lateness.later += 1;
            lateness.later_and_moved += usize::from(app.restarts > before.restarts);
        }
    }
    lateness
}

/// Synergy's setting (OSDI'22 §5.3.2): its 128-GPU cluster, its derived trace at rising load
/// ([`generate::synergy_trace`], `scale.apps` x 4 jobs), the runs of [`SYNERGY_RUNS`].
fn synergy(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    synergy_setting(
        out,
        scale,
        &SynergySetting {
            name: "synergy",
            title: "Synergy's trace",
            loads: &SYNERGY_LOADS,
            warm_up: 0,
            measured: scale.apps * 4,
        },
    )
}

/// Jobs per hour of the steady-state Synergy experiment: 59%, 76% and 94% of the 3.4 jobs an
/// hour that keep the 128 GPUs busy under GPU-proportional CPUs and memory, so queues settle
/// instead of growing without end.
pub const SYNERGY_STEADY_LOADS: [f64; 3] = [2.0, 2.6, 3.2];

/// Synergy's steady state (§5.1: "the average metrics such as JCT across a set of 1000 jobs in
/// steady state"): the same trace, longer, at loads the cluster can keep up with; only the
/// `scale.steady_state_jobs` jobs that arrive after a quarter as many more (the cluster fills
/// up) and before another quarter (it stays loaded while they finish) are measured.
fn synergy_steady(out: &mut Output, scale: ExperimentScale) -> Result<String, ExperimentError> {
    let measured = scale.steady_state_jobs;
    synergy_setting(
        out,
        scale,
        &SynergySetting {
            name: "synergy-steady",
            title: &format!("Synergy's steady state ({measured} jobs measured)"),
            loads: &SYNERGY_STEADY_LOADS,
            warm_up: measured / 4,
            measured,
        },
    )
}

/// One setting of the Synergy experiments: the trace's length and loads and which of its jobs
/// are measured.
struct SynergySetting<'a> {
    /// The outputs' file prefix.
    name: &'a str,
    /// What the charts' titles call the workload.
    title: &'a str,
    loads: &'a [f64],
    /// Jobs arriving before the measured ones, and as many after them.
    warm_up: usize,
    /// Jobs measured, in the order they arrive.
    measured: usize,
}

impl SynergySetting<'_> {
    /// `report` with only the measured apps, summarised again.
    fn measured(&self, workload: &Workload, report: &SimulationReport) -> SimulationReport {
        let measured: std::collections::BTreeSet<&AppId> = workload.apps
            [self.warm_up..self.warm_up + self.measured]
            .iter()
            .map(|app| &app.app.id)
            .collect();
        SimulationReport::new(
            report.summary.policy,
            report
                .apps
                .iter()
                .filter(|app| measured.contains(&app.app))
                .cloned()
                .collect(),
            report.summary.rounds,
            report.summary.mechanism.clone(),
        )
    }
}

/// The runs of [`SYNERGY_RUNS`] at every load of `setting`: a CSV row each, charts of mean JCT,
/// makespan and max rho against load.
fn synergy_setting(
    out: &mut Output,
    scale: ExperimentScale,
    setting: &SynergySetting,
) -> Result<String, ExperimentError> {
    let cluster = Cluster::from_spec(&clusters::load_cluster_spec(shipped::path(
        shipped::SYNERGY_128,
    ))?)?;
    let jobs = setting.measured + 2 * setting.warm_up;
    let workloads: Vec<Workload> = setting
        .loads
        .iter()
        .map(|&load| generate::synergy_trace(jobs, load, 0))
        .collect();
    let mut runs = Vec::new();
    for (workload, load) in workloads.iter().zip(setting.loads) {
        for run in &SYNERGY_RUNS {
            let mut config = config(run.policy);
            config.market.resource_allocation = run.allocation;
            runs.push(Run {
                label: format!(
                    "{} {load}/h/{}/{}",
                    setting.name,
                    run.policy,
                    allocation_name(run.allocation)
                ),
                cluster: &cluster,
                workload,
                config,
            });
        }
    }
    let per_load = SYNERGY_RUNS.len();
    let reports: Vec<SimulationReport> = simulate_all(&runs, scale.threads)?
        .iter()
        .enumerate()
        .map(|(i, report)| setting.measured(&workloads[i / per_load], report))
        .collect();
    let mut csv = String::from(
        "jobs_per_hour,policy,allocation,unfinished_apps,mean_jct_hours,makespan_hours,max_rho,\
         jobs_later_than_gpu_proportional,worst_jct_ratio\n",
    );
    let mut summary = String::new();
    for (i, load) in setting.loads.iter().enumerate() {
        let at = |k: usize| &reports[i * per_load + k];
        for (k, run) in SYNERGY_RUNS.iter().enumerate() {
            let s = &at(k).summary;
            let Lateness {
                later,
                later_and_moved,
                worst_ratio: worst,
            } = later_than(at(k), at(run.reference));
            let _ = writeln!(
                csv,
                "{load},{},{},{},{:.4},{:.4},{:.4},{later},{worst:.4}",
                run.policy,
                allocation_name(run.allocation),
                s.unfinished_apps,
                s.mean_completion_seconds / 3600.0,
                s.makespan_seconds / 3600.0,
                s.max_rho
            );
            if k != run.reference {
                let base = &at(run.reference).summary;
                let _ = writeln!(
                    summary,
                    "{load}/h {} {}: mean JCT {:.2} h -> {:.2} h ({:.2}x), makespan {:.1} h -> \
                     {:.1} h, {later} jobs later ({later_and_moved} of them moved more often; \
                     worst {worst:.3}x)",
                    run.policy,
                    allocation_name(run.allocation),
                    base.mean_completion_seconds / 3600.0,
                    s.mean_completion_seconds / 3600.0,
                    base.mean_completion_seconds / s.mean_completion_seconds,
                    base.makespan_seconds / 3600.0,
                    s.makespan_seconds / 3600.0,
                );
            }
        }
    }
    out.csv(&format!("{}.csv", setting.name), &csv)?;
    for (column, label, value) in [
        (
            "mean_jct",
            "mean JCT (hours)",
            (|s: &RunSummary| s.mean_completion_seconds / 3600.0) as fn(&RunSummary) -> f64,
        ),
        ("makespan", "makespan (hours)", |s: &RunSummary| {
            s.makespan_seconds / 3600.0
        }),
        ("max_rho", "max rho", |s: &RunSummary| s.max_rho),
    ] {
        let series: Vec<Series> = SYNERGY_RUNS
            .iter()
            .enumerate()
            .map(|(k, run)| {
                let points = setting
                    .loads
                    .iter()
                    .enumerate()
                    .map(|(i, &load)| (load, value(&reports[i * per_load + k].summary)))
                    .collect();
                Series::new(
                    format!("{} {}", run.policy, allocation_name(run.allocation)),
                    points,
                )
            })
            .collect();
        out.lines(
            &format!("{}-{column}.svg", setting.name),
            &LineChart {
                title: &format!("{label} vs load, {} on 128 GPUs", setting.title),
                x_label: "load (jobs per hour)",
                y_label: label,
                markers: true,
                steps: false,
            },
            &series,
        )?;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MechanismStats;

    #[test]
    fn later_jobs_are_counted_against_the_same_apps_and_those_moved_more_often_told_apart() {
        // (completion seconds, restarts) per app: under the reference, then under the run.
        let apps = |jobs: &[(f64, u32)]| -> Vec<AppReport> {
            jobs.iter()
                .enumerate()
                .map(|(i, &(seconds, restarts))| AppReport {
                    restarts,
                    ..AppReport::new(
                        AppId(format!("app-{i}")),
                        "resnet50".into(),
                        true,
                        0.0,
                        seconds,
                        seconds,
                        1.0,
                    )
                })
                .collect()
        };
        let report = |jobs: &[(f64, u32)]| {
            SimulationReport::new(Policy::Themis, apps(jobs), 1, MechanismStats::default())
        };
        let reference = report(&[(1000.0, 0), (1000.0, 1), (1000.0, 0), (1000.0, 0)]);
        // Later and moved once more; later with as many moves; earlier though moved; later
        // by no more than the slack.
        let run = report(&[(1035.0, 1), (1100.0, 1), (800.0, 2), (1000.5, 0)]);
        assert_eq!(
            later_than(&run, &reference),
            Lateness {
                later: 2,
                later_and_moved: 1,
                worst_ratio: 1.1,
            }
        );
        assert_eq!(later_than(&reference, &reference).later, 0);
    }

    #[test]
    fn a_steady_state_is_measured_on_the_jobs_between_its_warm_up_and_cool_down_alone() {
        let workload = generate::synergy_trace(6, 2.0, 0);
        // Job i takes i + 1 hours.
        let apps = workload
            .apps
            .iter()
            .zip(1..)
            .map(|(app, hours)| {
                let seconds = 3600.0 * f64::from(hours);
                AppReport::new(
                    app.app.id.clone(),
                    app.model.clone(),
                    true,
                    app.arrival_seconds,
                    seconds,
                    seconds,
                    1.0,
                )
            })
            .collect();
        let report = SimulationReport::new(Policy::Themis, apps, 10, MechanismStats::default());
        let steady = SynergySetting {
            name: "steady",
            title: "steady",
            loads: &[2.0],
            warm_up: 1,
            measured: 3,
        };
        let measured = steady.measured(&workload, &report);
        let ids: Vec<&AppId> = measured.apps.iter().map(|app| &app.app).collect();
        let expected: Vec<&AppId> = workload.apps[1..4].iter().map(|app| &app.app.id).collect();
        assert_eq!(ids, expected);
        // The jobs of 2, 3 and 4 hours: 3 hours on average (all six: 3.5).
        assert_eq!(measured.summary.apps, 3);
        assert_eq!(measured.summary.mean_completion_seconds, 3.0 * 3600.0);
        assert_eq!(measured.summary.rounds, 10);

        // Without a warm-up every job is measured: the report as it was, summarised again.
        let whole = SynergySetting {
            warm_up: 0,
            measured: 6,
            ..steady
        };
        assert_eq!(whole.measured(&workload, &report), report);
    }
}
