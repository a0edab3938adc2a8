//! The living demo's arrivals, decided by a seed alone: when each app arrives (demo time since
//! the demo started), for which tenant, its shape (one training job, or a successive-halving
//! search that halves its trials phase by phase) and whether its framework bids itself. No
//! clock and no I/O: the same seed and rate give the same stream, whatever the machine.

use agora_market::shown::Shown;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

/// The demo's tenants; the first two are the ones docs/dashboard.md and the browser tests use.
pub const TENANTS: [&str; 4] = ["demo-vision", "demo-speech", "demo-nlp", "demo-rl"];

/// Demo work runs this many times faster than the clock, so apps finish within minutes.
pub const SPEEDUP: f64 = 20.0;

/// Apps that arrive at once when the demo starts, one per tenant in turn, so every tenant has
/// apps and the market is contended from the first round.
const OPENING_WAVE: u64 = 8;

const MODELS: [&str; 8] = [
    "resnet",
    "bert",
    "vit",
    "wav2vec",
    "gpt-small",
    "deepspeech",
    "t5",
    "ppo",
];

/// How the demo's apps arrive: a seed and a mean rate (Poisson arrivals after the opening
/// wave).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DemoOptions {
    pub seed: u64,
    /// Mean arrivals per minute of demo time, in (0, 600].
    pub rate_per_minute: f64,
}

impl DemoOptions {
    pub const DEFAULT_SEED: u64 = 1;
    pub const DEFAULT_RATE: f64 = 12.0;
    pub const MAX_RATE: f64 = 600.0;

    /// Checks the rate; the message says what `--demo-rate` takes.
    pub fn new(seed: u64, rate_per_minute: f64) -> Result<Self, String> {
        if !(rate_per_minute.is_finite()
            && rate_per_minute > 0.0
            && rate_per_minute <= Self::MAX_RATE)
        {
            return Err(format!(
                "--demo-rate must be a number of arrivals per minute in (0, {}], got {}",
                Self::MAX_RATE,
                Shown(rate_per_minute)
            ));
        }
        Ok(Self {
            seed,
            rate_per_minute,
        })
    }
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            seed: Self::DEFAULT_SEED,
            rate_per_minute: Self::DEFAULT_RATE,
        }
    }
}

/// What an app does; the registration and the driver's own model of its jobs follow from it.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// One training job on up to `max_gpus` GPUs.
    SingleJob {
        iterations: u64,
        serial_iteration_time: f64,
        max_gpus: u32,
    },
    /// `jobs_per_phase[p]` trials run `phase_iterations[p]` more iterations each on up to
    /// `max_gpus_per_phase[p]` GPUs; the rest stop at each phase's end.
    Search {
        phase_iterations: Vec<u64>,
        jobs_per_phase: Vec<u32>,
        max_gpus_per_phase: Vec<u32>,
        serial_iteration_time: f64,
    },
}

impl Shape {
    /// The engine's app, as `POST /v1/apps` takes it.
    pub fn app(&self) -> Value {
        match self {
            Self::SingleJob {
                iterations,
                serial_iteration_time,
                max_gpus,
            } => json!({ "kind": "single_job", "job": {
                "id": "train", "total_iterations": iterations,
                "serial_iteration_time": serial_iteration_time, "max_gpus": max_gpus } }),
            Self::Search {
                phase_iterations,
                jobs_per_phase,
                max_gpus_per_phase,
                serial_iteration_time,
            } => {
                let total: u64 = phase_iterations.iter().sum();
                let budget: f64 = phase_iterations
                    .iter()
                    .zip(jobs_per_phase)
                    .map(|(&iterations, &jobs)| iterations as f64 * f64::from(jobs))
                    .sum::<f64>()
                    * serial_iteration_time;
                let last = *max_gpus_per_phase.last().unwrap_or(&1);
                let jobs: Vec<Value> = (0..jobs_per_phase[0])
                    .map(|trial| {
                        json!({ "id": format!("trial-{trial}"), "total_iterations": total,
                        "serial_iteration_time": serial_iteration_time, "max_gpus": last })
                    })
                    .collect();
                json!({ "kind": "successive_halving", "budget_gpu_seconds": budget,
                    "phase_iterations": phase_iterations, "jobs_per_phase": jobs_per_phase,
                    "max_gpus_per_phase": max_gpus_per_phase, "jobs": jobs })
            }
        }
    }
}

/// One app arriving.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// Demo time since the demo started, in milliseconds.
    pub at_ms: u64,
    /// Index into [`TENANTS`].
    pub tenant: usize,
    pub name: String,
    /// Its framework bids over HTTP (`explicit`); otherwise the arbiter's agent bids for it.
    pub explicit: bool,
    pub shape: Shape,
}

/// The stream of arrivals: an endless iterator.
#[derive(Debug)]
pub struct Plan {
    rng: ChaCha8Rng,
    mean_gap_ms: f64,
    at_ms: f64,
    count: u64,
}

impl Plan {
    pub fn new(options: DemoOptions) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(options.seed),
            mean_gap_ms: 60_000.0 / options.rate_per_minute,
            at_ms: 0.0,
            count: 0,
        }
    }

    fn shape(&mut self) -> Shape {
        let serial_iteration_time = self.rng.random_range(0.3..1.2);
        // Iterations that keep `gpus` GPUs busy for `seconds` of demo time.
        let iterations = |seconds: f64, gpus: u32| {
            (seconds * f64::from(gpus) * SPEEDUP / serial_iteration_time).ceil() as u64
        };
        if self.rng.random_bool(0.5) {
            let max_gpus = [2, 4, 8][self.rng.random_range(0..3)];
            let seconds = self.rng.random_range(40.0..120.0);
            return Shape::SingleJob {
                iterations: iterations(seconds, max_gpus),
                serial_iteration_time,
                max_gpus,
            };
        }
        // 4 or 8 trials on one GPU each, halving every phase down to one on 4 or 8 GPUs.
        let trials: u32 = if self.rng.random_bool(0.5) { 4 } else { 8 };
        let phases = trials.trailing_zeros() as usize + 1;
        let jobs_per_phase: Vec<u32> = (0..phases).map(|phase| trials >> phase).collect();
        let max_gpus_per_phase: Vec<u32> = (0..phases).map(|phase| 1 << phase).collect();
        let phase_iterations = max_gpus_per_phase
            .iter()
            .map(|&gpus| iterations(self.rng.random_range(15.0..40.0), gpus))
            .collect();
        Shape::Search {
            phase_iterations,
            jobs_per_phase,
            max_gpus_per_phase,
            serial_iteration_time,
        }
    }
}

impl Iterator for Plan {
    type Item = Arrival;

    fn next(&mut self) -> Option<Arrival> {
        let count = self.count;
        self.count += 1;
        let tenant = if count < OPENING_WAVE {
            (count as usize) % TENANTS.len()
        } else {
            // Exponential gaps: a Poisson stream at the chosen rate.
            let uniform: f64 = self.rng.random_range(0.0..1.0);
            self.at_ms += -(1.0 - uniform).ln() * self.mean_gap_ms;
            self.rng.random_range(0..TENANTS.len())
        };
        let explicit = self.rng.random_bool(0.25);
        let shape = self.shape();
        let kind = match shape {
            Shape::SingleJob { .. } => "train",
            Shape::Search { .. } => "search",
        };
        let model = MODELS[self.rng.random_range(0..MODELS.len())];
        Some(Arrival {
            at_ms: self.at_ms as u64,
            tenant,
            name: format!("{model}-{kind}-{}", count + 1),
            explicit,
            shape,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrivals(seed: u64, rate: f64, count: usize) -> Vec<Arrival> {
        Plan::new(DemoOptions::new(seed, rate).expect("valid"))
            .take(count)
            .collect()
    }

    #[test]
    fn the_same_seed_gives_the_same_arrivals_and_another_seed_others() {
        assert_eq!(arrivals(7, 6.0, 50), arrivals(7, 6.0, 50));
        assert_ne!(arrivals(7, 6.0, 50), arrivals(8, 6.0, 50));
    }

    #[test]
    fn an_opening_wave_for_every_tenant_then_a_stream_at_the_chosen_rate() {
        let stream = arrivals(3, 12.0, 2_008);
        assert!(stream[..8].iter().all(|arrival| arrival.at_ms == 0));
        for tenant in 0..TENANTS.len() {
            assert!(stream[..8].iter().any(|arrival| arrival.tenant == tenant));
        }
        // 2,000 gaps at 12 a minute: about 10,000 s; within 10 %.
        let seconds = stream.last().expect("arrivals").at_ms as f64 / 1_000.0;
        assert!((9_000.0..11_000.0).contains(&seconds), "{seconds} s");
        assert!(stream.windows(2).all(|pair| pair[0].at_ms <= pair[1].at_ms));
    }

    #[test]
    fn arrivals_mix_single_jobs_and_searches_explicit_and_agent_bidders_over_all_tenants() {
        let stream = arrivals(11, 6.0, 400);
        let searches = stream
            .iter()
            .filter(|arrival| matches!(arrival.shape, Shape::Search { .. }))
            .count();
        let explicit = stream.iter().filter(|arrival| arrival.explicit).count();
        assert!((120..280).contains(&searches), "{searches} searches");
        assert!((50..150).contains(&explicit), "{explicit} explicit bidders");
        for tenant in 0..TENANTS.len() {
            assert!(stream.iter().filter(|a| a.tenant == tenant).count() > 50);
        }
        let names: std::collections::BTreeSet<&str> =
            stream.iter().map(|arrival| arrival.name.as_str()).collect();
        assert_eq!(names.len(), stream.len(), "names are unique");
    }

    #[test]
    fn a_search_halves_its_trials_and_doubles_their_width_each_phase() {
        let search = arrivals(5, 6.0, 100)
            .into_iter()
            .find_map(|arrival| match arrival.shape {
                shape @ Shape::Search { .. } => Some(shape),
                Shape::SingleJob { .. } => None,
            })
            .expect("a search");
        let app = search.app();
        let jobs = app["jobs_per_phase"].as_array().expect("phases");
        let widths = app["max_gpus_per_phase"].as_array().expect("widths");
        let width =
            |phase: usize| jobs[phase].as_u64().expect("n") * widths[phase].as_u64().expect("w");
        for phase in 0..jobs.len() {
            assert_eq!(
                width(phase),
                width(0),
                "phase {phase} keeps the search's width"
            );
        }
        assert_eq!(jobs.last(), Some(&json!(1)));
    }

    #[test]
    fn the_rate_must_be_a_positive_number_of_arrivals_per_minute() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 601.0] {
            let error = DemoOptions::new(1, bad).expect_err("refused");
            assert!(error.starts_with("--demo-rate must be"), "{error}");
        }
        assert!(DemoOptions::new(1, 600.0).is_ok());
    }
}
