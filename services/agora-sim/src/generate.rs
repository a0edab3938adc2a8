//! Seeded generators of Themis's two evaluation workloads (§6.1, Figure 8), built from the
//! engine's own app types.
//!
//! - [`workload1`]: hyper-parameter searches stopped by performance curves (Hyperdrive) with
//!   1-2 GPUs per job and ~75 jobs per app (§2.2, Figure 2).
//! - [`workload2`]: Hyperband successive halving with the same arrivals, 2-8 GPUs per job.
//!
//! The same [`GeneratorConfig`] gives the same [`Workload`], bit for bit. Each app draws from
//! its own ChaCha8 stream and the arrivals from another, so app `i` of both workloads has the
//! same arrival time ("we use the app arrival times from Workload 1"), model and GPU time, and
//! changing the number of apps does not change the apps that remain.
//!
//! Numbers from the paper: median 75 jobs per app with ~10% single-job apps (Figure 2), median
//! app GPU time 11.5 GPU-days (§2.2, Figure 3), CV/NLP/speech 10/60/30% (Table 4). Arrivals
//! are a Poisson process, Philly-like: §2.2's 85 hyper-parameter apps over Workload 1's
//! two-week snapshot give a mean gap of 14,230 s. Everything else is this module's choice and
//! is documented where it is made (and in `docs/simulator-inputs.md`).

use std::collections::BTreeMap;

use agora_market::app::{
    App, AppId, AppKind, CurveJob, Job, PerformanceCurve, PlacementSlowdown, SpeedChange,
    SuccessiveHalving,
};
use agora_market::shown::Shown;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::models::{self, ModelSpec, Sensitivity, CATEGORY_MIX};
use crate::workload::{Workload, WorkloadApp};

/// Median app GPU time in the trace (§2.2): 11.5 GPU-days, in GPU-seconds.
pub const TRACE_MEDIAN_APP_GPU_SECONDS: f64 = 11.5 * 86_400.0;
/// Spread (sigma of the log) of app GPU times: log-normal around the median, so about 3% of
/// apps are 10x shorter and 3% 10x longer than the median (Figure 3 shows such tails). The
/// mean is e^(sigma^2/2) = 2.05x the median.
pub const APP_GPU_TIME_LOG_SIGMA: f64 = 1.2;
/// Spread of the jobs' shares of their app's GPU time (hyper-parameters differ).
pub const JOB_SHARE_LOG_SIGMA: f64 = 0.5;
/// Mean gap between app arrivals in the trace: 2 weeks / 85 apps (§2.2, §6.1).
pub const PHILLY_MEAN_INTERARRIVAL_SECONDS: f64 = 14.0 * 86_400.0 / 85.0;
/// Default time scale: 1/10 of the trace's GPU times and arrival gaps (median app 1.15
/// GPU-days, mean gap 1,423 s). With [`DEFAULT_APPS`] this is what keeps a simulation of the
/// 256-GPU cluster to seconds; see `docs/simulator-inputs.md` for what scaling changes.
pub const DEFAULT_DURATION_SCALE: f64 = 0.1;
/// Default number of apps: 30, not the trace's 85 (§2.2). Simulation cost grows faster than
/// the number of apps (every job's end is an event and a round, and rounds cost more with
/// more apps): 85 apps take minutes, 30 a few seconds.
pub const DEFAULT_APPS: usize = 30;

/// Workload 1: share of single-job apps (Figure 2: ~10%).
pub const W1_SINGLE_JOB_FRACTION: f64 = 0.10;
/// Workload 1: the other apps' job counts follow a triangular law on [25, 100] rising to 100
/// (density ∝ n - 25), whose 4/9 quantile is 75, so the median over all apps is 75.
pub const W1_MIN_JOBS: u32 = 25;
pub const W1_MAX_JOBS: u32 = 100;
/// Workload 1: GPUs per job, one value per app drawn uniformly (Figure 8: 1-2).
pub const W1_GPUS_PER_JOB: [u32; 2] = [1, 2];
/// Workload 1: each job's predicted stopping point is this fraction or more of its
/// configured iterations (uniform up to 1).
pub const W1_MIN_STOP_FRACTION: f64 = 0.25;

/// Workload 2: initial jobs per app, 2^k with k uniform in this range (4 to 64 jobs), halved
/// each phase down to 1: k + 1 phases.
pub const W2_LOG2_JOBS: std::ops::RangeInclusive<u32> = 2..=6;
/// Workload 2: GPUs per job, one value per app drawn uniformly (Figure 8: more tasks per job
/// than Workload 1).
pub const W2_GPUS_PER_JOB: [u32; 3] = [2, 4, 8];

/// Knobs of both generators. `Default` is [`GeneratorConfig::philly_like`] at
/// [`DEFAULT_DURATION_SCALE`] with [`DEFAULT_APPS`] apps and seed 0.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratorConfig {
    /// Number of apps.
    pub apps: usize,
    pub seed: u64,
    /// Mean gap between arrivals (exponential gaps; the first app arrives at 0), in the
    /// generated workload's seconds (not scaled by `duration_scale`).
    pub mean_interarrival_seconds: f64,
    /// Multiplies every app's GPU time (1 = the trace's, median 11.5 GPU-days). Shrinking it
    /// alone lowers the load; [`GeneratorConfig::philly_like`] shrinks the gaps with it.
    pub duration_scale: f64,
    /// Share of apps with network-intensive models (Themis Figs. 15/16). `None`: whatever
    /// Table 4's mix gives (36%). `Some(p)`: each app is network-intensive with probability
    /// `p` and its model is drawn from Table 4's mix among the models of that class.
    pub network_intensive_fraction: Option<f64>,
    /// Share of apps whose jobs adapt as they train ([`make_dynamic`]); 0: every job keeps a
    /// fixed speed.
    #[serde(default)]
    pub dynamic_fraction: f64,
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        Self::philly_like(DEFAULT_APPS, 0, DEFAULT_DURATION_SCALE)
    }
}

impl GeneratorConfig {
    /// The trace's load, time-scaled: GPU times and arrival gaps both multiplied by `scale`,
    /// so the offered load (GPU-seconds of work per second) is the trace's: mean app GPU time
    /// 23.6 GPU-days / 14,230 s ≈ 143 GPUs busy on average, 0.56 of 256 GPUs.
    pub fn philly_like(apps: usize, seed: u64, scale: f64) -> Self {
        Self {
            apps,
            seed,
            mean_interarrival_seconds: PHILLY_MEAN_INTERARRIVAL_SECONDS * scale,
            duration_scale: scale,
            network_intensive_fraction: None,
            dynamic_fraction: 0.0,
        }
    }

    pub fn validate(&self) -> Result<(), GeneratorError> {
        let positive = |value: f64| value.is_finite() && value > 0.0;
        if self.apps == 0 {
            return Err(GeneratorError::NoApps);
        }
        if !positive(self.duration_scale) {
            return Err(GeneratorError::DurationScale(self.duration_scale));
        }
        if !(self.mean_interarrival_seconds.is_finite() && self.mean_interarrival_seconds >= 0.0) {
            return Err(GeneratorError::MeanInterarrival(
                self.mean_interarrival_seconds,
            ));
        }
        if let Some(fraction) = self.network_intensive_fraction {
            if !(0.0..=1.0).contains(&fraction) {
                return Err(GeneratorError::NetworkIntensiveFraction(fraction));
            }
        }
        if !(0.0..=1.0).contains(&self.dynamic_fraction) {
            return Err(GeneratorError::DynamicFraction(self.dynamic_fraction));
        }
        Ok(())
    }

    /// Offered load: mean GPUs kept busy by the arrivals' work, by the distribution (not by
    /// a draw). Divide by a cluster's GPU count for its utilisation demand.
    pub fn mean_offered_gpus(&self) -> f64 {
        let mean_app = TRACE_MEDIAN_APP_GPU_SECONDS
            * (APP_GPU_TIME_LOG_SIGMA * APP_GPU_TIME_LOG_SIGMA / 2.0).exp()
            * self.duration_scale;
        mean_app / self.mean_interarrival_seconds
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GeneratorError {
    #[error("apps must be at least 1: a workload of no apps has nothing to simulate")]
    NoApps,
    #[error("duration_scale must be positive and finite, got {}", Shown(*.0))]
    DurationScale(f64),
    #[error("mean_interarrival_seconds must be finite and >= 0, got {}", Shown(*.0))]
    MeanInterarrival(f64),
    #[error("network_intensive_fraction must be in [0, 1], got {}", Shown(*.0))]
    NetworkIntensiveFraction(f64),
    #[error("dynamic_fraction must be in [0, 1], got {}", Shown(*.0))]
    DynamicFraction(f64),
}

/// Themis Workload 1: performance-curve (Hyperdrive) apps of 1-2 GPU jobs; single-job apps are
/// `SingleJob`. Ids `w1-app-0007`, jobs `w1-app-0007-j012`. `job_quality` is each job's
/// predicted stopping point as a fraction of its configured iterations (Hyperdrive runs the
/// promising jobs longer).
pub fn workload1(config: &GeneratorConfig) -> Result<Workload, GeneratorError> {
    generate(config, "w1", workload1_app)
}

/// Themis Workload 2: Hyperband successive-halving apps, the same arrivals (and models and
/// GPU times) as Workload 1 with the same config. The app's GPU time is its budget B, split
/// evenly over the phases as in §4.3.3. `job_quality` is uniform in [0, 1): the simulator keeps
/// the better half at each phase end. Ids `w2-app-0007`, jobs `w2-app-0007-j012`.
pub fn workload2(config: &GeneratorConfig) -> Result<Workload, GeneratorError> {
    generate(config, "w2", workload2_app)
}

/// What both workloads draw first for app `i`, in this order, from the app's stream.
struct AppBasics {
    model: &'static ModelSpec,
    slowdown: PlacementSlowdown,
    gpu_seconds: f64,
}

/// [`workload1`] or [`workload2`].
pub type Generator = fn(&GeneratorConfig) -> Result<Workload, GeneratorError>;

type AppBuilder = fn(&str, AppBasics, &mut ChaCha8Rng) -> (AppKind, BTreeMap<String, f64>);

fn generate(
    config: &GeneratorConfig,
    prefix: &str,
    build: AppBuilder,
) -> Result<Workload, GeneratorError> {
    config.validate()?;
    let mut arrivals = stream(config.seed, 0);
    let mut now = 0.0;
    let mut apps = Vec::with_capacity(config.apps);
    for index in 0..config.apps {
        if index > 0 {
            now += exponential(&mut arrivals, config.mean_interarrival_seconds);
        }
        let mut rng = stream(config.seed, index as u64 + 1);
        let basics = draw_basics(config, &mut rng);
        let model = basics.model.name.to_owned();
        let id = format!("{prefix}-app-{index:04}");
        let (mut kind, job_quality) = build(&id, basics, &mut rng);
        // Its own stream, so that the static apps' draws do not depend on the fraction.
        let mut adaptation = stream(config.seed ^ DYNAMIC_STREAM_SALT, index as u64 + 1);
        if adaptation.random_bool(config.dynamic_fraction) {
            make_dynamic(&mut kind, &mut adaptation);
        }
        apps.push(WorkloadApp {
            arrival_seconds: now,
            model,
            app: App {
                id: AppId(id),
                kind,
            },
            job_quality,
        });
    }
    Ok(Workload { apps })
}

/// Seeds the streams that choose dynamic apps and their speed-ups.
const DYNAMIC_STREAM_SALT: u64 = 0x5348_4F43_4B57_4156;

/// Dynamic adaptation as in Shockwave (NSDI'23, §2.2 and Figure 2a): a job doubles its batch
/// size three times, at these fractions of its iterations (our choice; the paper's example
/// scales over its first epochs and its expert heuristic at the 30th, 60th and 80th)...
pub const DYNAMIC_CHANGE_FRACTIONS: [f64; 3] = [0.2, 0.4, 0.6];
/// ...and ends up this much faster per sample, uniform in the range (Figure 2a: "gradually
/// boosts training speed by up to 1.7x"), the same factor at each change.
pub const DYNAMIC_TOTAL_SPEEDUP: std::ops::RangeInclusive<f64> = 1.3..=1.7;

/// Gives every job of the app Shockwave's batch-size schedule: one speed-up per app, drawn
/// from [`DYNAMIC_TOTAL_SPEEDUP`], reached in [`DYNAMIC_CHANGE_FRACTIONS`] equal steps.
pub fn make_dynamic(kind: &mut AppKind, rng: &mut ChaCha8Rng) {
    let speedup = rng.random_range(DYNAMIC_TOTAL_SPEEDUP);
    let step = speedup.powf(1.0 / DYNAMIC_CHANGE_FRACTIONS.len() as f64);
    let jobs: Vec<&mut Job> = match kind {
        AppKind::SingleJob { job, .. } => vec![job],
        AppKind::SuccessiveHalving(search) => search.jobs.iter_mut().collect(),
        AppKind::PerformanceCurve(search) => {
            search.jobs.iter_mut().map(|curve| &mut curve.job).collect()
        }
    };
    for job in jobs {
        let mut time = job.serial_iteration_time;
        let mut after = 0;
        job.speed_changes.clear();
        for fraction in DYNAMIC_CHANGE_FRACTIONS {
            let at_iteration = (job.total_iterations as f64 * fraction).round() as u64;
            if at_iteration <= after || at_iteration >= job.total_iterations {
                continue;
            }
            time /= step;
            job.speed_changes.push(SpeedChange {
                at_iteration,
                serial_iteration_time: time,
            });
            after = at_iteration;
        }
    }
}

/// Stream 0 of a seed draws the arrivals, stream `i + 1` app `i`.
fn stream(seed: u64, number: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(number);
    rng
}

fn draw_basics(config: &GeneratorConfig, rng: &mut ChaCha8Rng) -> AppBasics {
    let model = match config.network_intensive_fraction {
        None => draw_model(rng, |_| true),
        Some(fraction) => {
            let wanted = if rng.random_bool(fraction) {
                Sensitivity::NetworkIntensive
            } else {
                Sensitivity::ComputeIntensive
            };
            draw_model(rng, |spec| spec.sensitivity == wanted)
        }
    };
    let gpu_seconds = TRACE_MEDIAN_APP_GPU_SECONDS
        * (APP_GPU_TIME_LOG_SIGMA * standard_normal(rng)).exp()
        * config.duration_scale;
    AppBasics {
        model,
        slowdown: model.slowdown(),
        gpu_seconds,
    }
}

/// A Table 4 model: domain by CATEGORY_MIX, model uniform within it, among those `keep`
/// admits (weights renormalised).
fn draw_model(rng: &mut ChaCha8Rng, keep: impl Fn(&ModelSpec) -> bool) -> &'static ModelSpec {
    let weighted: Vec<(&'static ModelSpec, f64)> = CATEGORY_MIX
        .iter()
        .flat_map(|&(category, share)| {
            let models: Vec<&'static ModelSpec> = models::table4_models(category).collect();
            let each = share / models.len() as f64;
            models.into_iter().map(move |spec| (spec, each))
        })
        .filter(|(spec, _)| keep(spec))
        .collect();
    let total: f64 = weighted.iter().map(|(_, weight)| weight).sum();
    let mut point = rng.random::<f64>() * total;
    for &(spec, weight) in &weighted {
        if point < weight {
            return spec;
        }
        point -= weight;
    }
    weighted[weighted.len() - 1].0
}

fn workload1_app(
    id: &str,
    basics: AppBasics,
    rng: &mut ChaCha8Rng,
) -> (AppKind, BTreeMap<String, f64>) {
    let job_count = if rng.random_bool(W1_SINGLE_JOB_FRACTION) {
        1
    } else {
        let span = f64::from(W1_MAX_JOBS - W1_MIN_JOBS);
        (f64::from(W1_MIN_JOBS) + span * rng.random::<f64>().sqrt()).round() as u32
    };
    let max_gpus = W1_GPUS_PER_JOB[rng.random_range(0..W1_GPUS_PER_JOB.len())];
    let shares = job_shares(rng, job_count);
    let mut quality = BTreeMap::new();
    let mut jobs = Vec::with_capacity(job_count as usize);
    for (number, share) in shares.into_iter().enumerate() {
        let serial_iteration_time = serial_iteration_time(rng, basics.model);
        let work = basics.gpu_seconds * share;
        let predicted = ((work / serial_iteration_time).round() as u64).max(1);
        let stop_fraction = rng.random_range(W1_MIN_STOP_FRACTION..=1.0);
        let total_iterations = if job_count == 1 {
            predicted
        } else {
            ((predicted as f64 / stop_fraction).ceil() as u64).max(predicted)
        };
        let job = Job {
            id: format!("{id}-j{number:03}"),
            total_iterations,
            completed_iterations: 0,
            serial_iteration_time,
            max_gpus,
            slowdown: basics.slowdown,
            stopped: false,
            speed_changes: Vec::new(),
        };
        quality.insert(job.id.clone(), predicted as f64 / total_iterations as f64);
        jobs.push(CurveJob {
            job,
            predicted_final_iteration: predicted,
        });
    }
    let kind = if job_count == 1 {
        let job = jobs.remove(0).job;
        AppKind::SingleJob {
            job,
            throughput: Default::default(),
            sensitivity: Default::default(),
        }
    } else {
        AppKind::PerformanceCurve(PerformanceCurve {
            jobs,
            throughput: Default::default(),
            sensitivity: Default::default(),
        })
    };
    (kind, quality)
}

fn workload2_app(
    id: &str,
    basics: AppBasics,
    rng: &mut ChaCha8Rng,
) -> (AppKind, BTreeMap<String, f64>) {
    let log2_jobs = rng.random_range(W2_LOG2_JOBS);
    let job_count = 1u32 << log2_jobs;
    let jobs_per_phase: Vec<u32> = (0..=log2_jobs).map(|phase| job_count >> phase).collect();
    let max_gpus = W2_GPUS_PER_JOB[rng.random_range(0..W2_GPUS_PER_JOB.len())];
    let times: Vec<f64> = (0..job_count)
        .map(|_| serial_iteration_time(rng, basics.model))
        .collect();
    // The engine estimates phases to come with the upper median job (§4.3.3); plan with it.
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let phase_iterations = split_budget(basics.gpu_seconds, &jobs_per_phase, median);
    let planned: f64 = jobs_per_phase
        .iter()
        .zip(&phase_iterations)
        .map(|(&jobs, &iterations)| f64::from(jobs) * iterations as f64 * median)
        .sum();
    let total_iterations: u64 = phase_iterations.iter().sum();
    let mut quality = BTreeMap::new();
    let jobs = times
        .into_iter()
        .enumerate()
        .map(|(number, serial_iteration_time)| {
            let job_id = format!("{id}-j{number:03}");
            quality.insert(job_id.clone(), rng.random::<f64>());
            Job {
                id: job_id,
                total_iterations,
                completed_iterations: 0,
                serial_iteration_time,
                max_gpus,
                slowdown: basics.slowdown,
                stopped: false,
                speed_changes: Vec::new(),
            }
        })
        .collect();
    let search = SuccessiveHalving {
        // Phases of at least one iteration can plan more than a tiny budget.
        budget_gpu_seconds: basics.gpu_seconds.max(planned),
        phase_iterations,
        // Figure 8: each halving doubles what a surviving job may use, so the search keeps
        // its width (jobs x GPUs per job) through its phases.
        max_gpus_per_phase: (0..=log2_jobs).map(|phase| max_gpus << phase).collect(),
        jobs_per_phase,
        current_phase: 0,
        jobs,
        throughput: Default::default(),
        sensitivity: Default::default(),
    };
    (AppKind::SuccessiveHalving(search), quality)
}

/// §4.3.3's split of a budget B over P phases: phase p of n_p jobs gets
/// floor(B / P / (n_p x t)) iterations, the last phase what is left of B (at least 1 each).
/// B = 10,000, t = 100 and 4, 2, 1 jobs give the paper's 8, 16, 36.
pub fn split_budget(budget: f64, jobs_per_phase: &[u32], serial_iteration_time: f64) -> Vec<u64> {
    let phases = jobs_per_phase.len();
    let mut left = budget;
    jobs_per_phase
        .iter()
        .enumerate()
        .map(|(phase, &jobs)| {
            let per_job_iteration = f64::from(jobs) * serial_iteration_time;
            let share = if phase + 1 == phases {
                left
            } else {
                budget / phases as f64
            };
            let iterations = ((share / per_job_iteration + 1e-9).floor() as u64).max(1);
            left -= iterations as f64 * per_job_iteration;
            iterations
        })
        .collect()
}

/// Shares of the app's GPU time per job: log-normal weights, normalised.
fn job_shares(rng: &mut ChaCha8Rng, jobs: u32) -> Vec<f64> {
    let weights: Vec<f64> = (0..jobs)
        .map(|_| (JOB_SHARE_LOG_SIGMA * standard_normal(rng)).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    weights.into_iter().map(|weight| weight / total).collect()
}

fn serial_iteration_time(rng: &mut ChaCha8Rng, model: &ModelSpec) -> f64 {
    let (low, high) = model.serial_iteration_seconds;
    if high > low {
        rng.random_range(low..high)
    } else {
        low
    }
}

fn exponential(rng: &mut ChaCha8Rng, mean: f64) -> f64 {
    // 1 - u is in (0, 1], so the log is finite.
    -mean * (1.0 - rng.random::<f64>()).ln()
}

/// Box-Muller.
fn standard_normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1 = 1.0 - rng.random::<f64>();
    let u2 = rng.random::<f64>();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Synergy's production-derived trace (OSDI'22 §5.1), as single-job apps: the model by its
/// workload split (image, language, speech: 20/70/10%), GPUs per job from the Philly shares
/// [`SYNERGY_GPU_DEMAND`], a duration at the GPU-proportional share of 10^x minutes with x
/// uniform in [1.5, 3] (80%) or [3, 4] (20%), and Poisson arrivals at `jobs_per_hour`.
/// Iterations take 1 s on one GPU and jobs scale linearly (Synergy models no placement), so
/// a job of duration D on g GPUs has D x g iterations.
pub fn synergy_trace(jobs: usize, jobs_per_hour: f64, seed: u64) -> Workload {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut arrival = 0.0;
    let apps = (0..jobs)
        .map(|number| {
            let model = pick(&mut rng, &SYNERGY_MODELS);
            let gpus = pick(&mut rng, &SYNERGY_GPU_DEMAND);
            let exponent = if rng.random::<f64>() < 0.8 {
                rng.random_range(1.5..3.0)
            } else {
                rng.random_range(3.0..4.0)
            };
            let seconds = 60.0 * 10f64.powf(exponent);
            let id = format!("synergy-{number:04}");
            let job = Job {
                id: format!("{id}-job"),
                total_iterations: (seconds * f64::from(gpus)).round().max(1.0) as u64,
                completed_iterations: 0,
                serial_iteration_time: 1.0,
                max_gpus: gpus,
                slowdown: PlacementSlowdown::NONE,
                stopped: false,
                speed_changes: Vec::new(),
            };
            let app = WorkloadApp {
                arrival_seconds: arrival,
                model: model.to_owned(),
                app: App {
                    id: AppId::from(id.as_str()),
                    kind: AppKind::SingleJob {
                        job,
                        throughput: Default::default(),
                        sensitivity: Default::default(),
                    },
                },
                job_quality: BTreeMap::new(),
            };
            arrival += -(1.0 - rng.random::<f64>()).ln() * 3600.0 / jobs_per_hour;
            app
        })
        .collect();
    Workload { apps }
}

/// Synergy's models by its (20, 70, 10) split, with the catalogue's nearest names: image
/// (AlexNet and ResNet-50 for its CPU-hungry and its moderate models), language (GNMT, LSTM,
/// Transformer), speech (DeepSpeech).
pub const SYNERGY_MODELS: [(&str, f64); 6] = [
    ("alexnet", 0.10),
    ("resnet50", 0.10),
    ("gnmt", 0.25),
    ("langmodel", 0.20),
    ("transformer", 0.25),
    ("deepspeech", 0.10),
];

/// GPUs per job (Synergy's multi-GPU trace takes them from Philly, up to 16): our rounding of
/// the Philly shares Jeon et al. report (most jobs use one GPU).
pub const SYNERGY_GPU_DEMAND: [(u32, f64); 5] =
    [(1, 0.7), (2, 0.1), (4, 0.1), (8, 0.08), (16, 0.02)];

/// Draws from a table of (value, probability) whose probabilities add up to 1.
fn pick<T: Copy>(rng: &mut ChaCha8Rng, table: &[(T, f64)]) -> T {
    let mut draw = rng.random::<f64>();
    for &(value, probability) in table {
        if draw < probability {
            return value;
        }
        draw -= probability;
    }
    table[table.len() - 1].0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_split_reproduces_the_papers_example() {
        assert_eq!(split_budget(10_000.0, &[4, 2, 1], 100.0), vec![8, 16, 36]);
    }

    #[test]
    fn tiny_budgets_still_get_an_iteration_per_phase() {
        assert_eq!(split_budget(1.0, &[4, 2, 1], 100.0), vec![1, 1, 1]);
    }
}
