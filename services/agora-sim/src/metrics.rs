//! What a simulation measured: per app, and summarised per run (Themis §6.1 metrics).

use std::fmt::Write as _;

use agora_market::app::AppId;
use agora_market::policy::Policy;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppReport {
    pub app: AppId,
    pub model: String,
    /// False if the simulation ended (nothing left to happen) before the app completed.
    pub finished: bool,
    pub arrival_seconds: f64,
    /// T_sh: arrival to completion.
    pub completion_seconds: f64,
    /// Finish-time fairness T_sh / T_id, T_id = T_cluster x the app's time-averaged contention.
    pub rho: f64,
    /// GPU-seconds the app held.
    pub gpu_seconds: f64,
    /// Time-averaged 1 / slowdown of its running jobs' placements (1 is perfect).
    pub placement_score: f64,
    /// How often the app's set of GPUs changed while it held some.
    pub reallocations: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub policy: Policy,
    pub apps: usize,
    pub unfinished_apps: usize,
    pub rounds: u64,
    pub max_rho: f64,
    /// Jain's fairness index over rho: (sum x)^2 / (n sum x^2), 1 when all are equal.
    pub jains_index: f64,
    pub fraction_rho_above_one: f64,
    pub total_gpu_seconds: f64,
    pub mean_completion_seconds: f64,
    pub p99_completion_seconds: f64,
    /// First arrival to last completion.
    pub makespan_seconds: f64,
    pub reallocations: u64,
    pub mean_placement_score: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimulationReport {
    pub summary: RunSummary,
    /// Sorted rho values: the empirical CDF (the i-th of n is at (i + 1) / n).
    pub rho_cdf: Vec<f64>,
    pub apps: Vec<AppReport>,
}

impl SimulationReport {
    pub fn new(policy: Policy, apps: Vec<AppReport>, rounds: u64) -> Self {
        let rhos: Vec<f64> = apps.iter().map(|app| app.rho).collect();
        let mut rho_cdf = rhos.clone();
        rho_cdf.sort_by(f64::total_cmp);
        let completions: Vec<f64> = apps.iter().map(|app| app.completion_seconds).collect();
        let first_arrival = apps
            .iter()
            .map(|app| app.arrival_seconds)
            .fold(f64::INFINITY, f64::min);
        let last_finish = apps
            .iter()
            .map(|app| app.arrival_seconds + app.completion_seconds)
            .fold(0.0, f64::max);
        let summary = RunSummary {
            policy,
            apps: apps.len(),
            unfinished_apps: apps.iter().filter(|app| !app.finished).count(),
            rounds,
            max_rho: rho_cdf.last().copied().unwrap_or(0.0),
            jains_index: jains_index(&rhos),
            fraction_rho_above_one: fraction(&rhos, |rho| rho > 1.0),
            total_gpu_seconds: apps.iter().map(|app| app.gpu_seconds).sum(),
            mean_completion_seconds: mean(&completions),
            p99_completion_seconds: percentile(&completions, 0.99),
            makespan_seconds: if apps.is_empty() {
                0.0
            } else {
                last_finish - first_arrival
            },
            reallocations: apps.iter().map(|app| u64::from(app.reallocations)).sum(),
            mean_placement_score: mean(
                &apps
                    .iter()
                    .map(|app| app.placement_score)
                    .collect::<Vec<_>>(),
            ),
        };
        Self {
            summary,
            rho_cdf,
            apps,
        }
    }

    /// One line per app, with a header.
    pub fn apps_csv(&self) -> String {
        let mut csv = String::from(
            "app,model,finished,arrival_seconds,completion_seconds,rho,gpu_seconds,placement_score,reallocations\n",
        );
        for app in &self.apps {
            let _ = writeln!(
                csv,
                "{},{},{},{:.3},{:.3},{:.6},{:.3},{:.6},{}",
                app.app,
                app.model,
                app.finished,
                app.arrival_seconds,
                app.completion_seconds,
                app.rho,
                app.gpu_seconds,
                app.placement_score,
                app.reallocations
            );
        }
        csv
    }
}

/// How rho is spread over the apps at one moment. An app holding no GPU has an unbounded rho:
/// it is counted apart, and the largest rho and Jain's index are over the finite ones (`None`
/// when there are none).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RhoSpread {
    pub starving_apps: usize,
    pub max_rho: Option<f64>,
    pub jains_index: Option<f64>,
}

impl RhoSpread {
    /// From each app's rho (`None`: starving).
    pub fn of(rhos: impl IntoIterator<Item = Option<f64>>) -> Self {
        let (finite, starving): (Vec<_>, Vec<_>) = rhos.into_iter().partition(Option::is_some);
        let finite: Vec<f64> = finite.into_iter().flatten().collect();
        Self {
            starving_apps: starving.len(),
            max_rho: finite.iter().copied().reduce(f64::max),
            jains_index: (!finite.is_empty()).then(|| jains_index(&finite)),
        }
    }
}

/// Jain's index (sum x)^2 / (n sum x^2); 1 for an empty or all-zero set.
pub fn jains_index(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|value| value * value).sum();
    if squares == 0.0 {
        1.0
    } else {
        sum * sum / (values.len() as f64 * squares)
    }
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
    }
}

fn fraction(values: &[f64], predicate: impl Fn(f64) -> bool) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().filter(|&&value| predicate(value)).count() as f64 / values.len() as f64
    }
}

/// Nearest-rank percentile (`quantile` in [0, 1]).
pub fn percentile(values: &[f64], quantile: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (quantile * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starving_apps_are_counted_apart_from_the_rho_spread() {
        let spread = RhoSpread::of([Some(1.0), None, Some(3.0)]);
        assert_eq!(spread.starving_apps, 1);
        assert_eq!(spread.max_rho, Some(3.0));
        assert!((spread.jains_index.expect("two finite rhos") - 0.8).abs() < 1e-12);
        assert_eq!(
            RhoSpread::of([None]),
            RhoSpread {
                starving_apps: 1,
                ..RhoSpread::default()
            }
        );
    }

    #[test]
    fn jains_index_is_one_for_equal_values_and_one_over_n_for_a_single_winner() {
        assert_eq!(jains_index(&[2.0, 2.0, 2.0]), 1.0);
        assert!((jains_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    }

    #[test]
    fn percentile_uses_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 0.99), 99.0);
        assert_eq!(percentile(&values, 0.5), 50.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
    }
}
