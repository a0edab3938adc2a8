//! What a simulation measured: per app, and summarised per run (Themis §6.1 metrics).

use std::fmt::Write as _;

use std::collections::{BTreeMap, BTreeSet};

use agora_market::app::AppId;
use agora_market::market::RoundOutcome;
use agora_market::policy::Policy;
use agora_market::rho::jains_index;
use agora_market::topology::GpuIndex;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppReport {
    pub app: AppId,
    pub model: String,
    /// False if the simulation ended (nothing left to happen) before the app completed.
    pub finished: bool,
    pub arrival_seconds: f64,
    /// T_sh: arrival to completion (to the end of the run for an unfinished app).
    pub completion_seconds: f64,
    /// T_cluster: the app's finish time alone on the whole cluster, under the engine's job model
    /// with the phases it actually ran (`simulator::hindsight_cluster_time`).
    pub t_cluster_seconds: f64,
    /// N_avg: the time-averaged number of active apps over the app's own lifetime.
    pub n_avg: f64,
    /// Finish-time fairness: completion_seconds / (t_cluster_seconds x n_avg), computed from
    /// the two fields above and nothing else.
    pub rho: f64,
    /// GPU-seconds the app held.
    pub gpu_seconds: f64,
    /// Time-averaged 1 / slowdown of its running jobs' placements (1 is perfect).
    pub placement_score: f64,
    /// How often the app's set of GPUs changed while it held some.
    pub reallocations: u32,
    /// How often one of its jobs paused to checkpoint and restore on other GPUs.
    pub restarts: u32,
    /// A full restart pause on the GPUs a job restarts on, charged at each restart. This is
    /// the GPU time those pauses idled only when each pause runs to its end: a pause cut short
    /// (the job moves again, or the app loses the GPUs, before it ends) is charged in full, so
    /// the figure can exceed the idle time, and under much churn even `gpu_seconds`.
    pub restart_gpu_seconds: f64,
}

impl AppReport {
    /// An app's fairness: rho is derived from `completion_seconds`, `t_cluster_seconds` and
    /// `n_avg`, so anyone can recompute it from the report.
    pub fn new(
        app: AppId,
        model: String,
        finished: bool,
        arrival_seconds: f64,
        completion_seconds: f64,
        t_cluster_seconds: f64,
        n_avg: f64,
    ) -> Self {
        Self {
            app,
            model,
            finished,
            arrival_seconds,
            completion_seconds,
            t_cluster_seconds,
            n_avg,
            rho: completion_seconds / (t_cluster_seconds * n_avg),
            gpu_seconds: 0.0,
            placement_score: 1.0,
            reallocations: 0,
            restarts: 0,
            restart_gpu_seconds: 0.0,
        }
    }

    /// What the app used: GPU time, placement, reallocations and restarts.
    pub fn with_usage(
        self,
        gpu_seconds: f64,
        placement_score: f64,
        reallocations: u32,
        restarts: u32,
        restart_gpu_seconds: f64,
    ) -> Self {
        Self {
            gpu_seconds,
            placement_score,
            reallocations,
            restarts,
            restart_gpu_seconds,
            ..self
        }
    }
}

/// How the mechanism behaved over a run: what it offered, what agents bid, how leases and
/// jobs moved.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MechanismStats {
    /// Rounds that allocated anything.
    pub rounds_with_offers: u64,
    /// GPUs offered, summed over those rounds.
    pub offered_gpus: u64,
    /// Rounds whose offer was a single GPU.
    pub single_gpu_offers: u64,
    /// Bids made, and bids with no bundle at all (nothing offered would improve the app).
    pub bids: u64,
    pub empty_bids: u64,
    pub leases_granted: u64,
    /// Leases granted to an app on GPUs all of which its own lease had just expired on.
    pub lease_renewals: u64,
    /// Jobs that paused to checkpoint and restore on other GPUs.
    pub restarts: u64,
}

impl MechanismStats {
    /// Counts one round; `just_expired` holds, per app, the GPUs whose leases ended in this
    /// instant.
    pub fn count_round(
        &mut self,
        outcome: &RoundOutcome,
        just_expired: &BTreeMap<AppId, BTreeSet<GpuIndex>>,
    ) {
        self.rounds_with_offers += 1;
        self.offered_gpus += outcome.offer.gpus.len() as u64;
        self.single_gpu_offers += u64::from(outcome.offer.gpus.len() == 1);
        if let Some(auction) = &outcome.auction {
            self.bids += auction.bids.len() as u64;
            self.empty_bids += auction
                .bids
                .iter()
                .filter(|bid| bid.bids.is_empty())
                .count() as u64;
        }
        self.leases_granted += outcome.leases.len() as u64;
        self.lease_renewals += outcome
            .leases
            .iter()
            .filter(|lease| {
                just_expired
                    .get(&lease.app)
                    .is_some_and(|expired| lease.gpus.iter().all(|gpu| expired.contains(gpu)))
            })
            .count() as u64;
    }

    /// Mean GPUs per offer.
    pub fn mean_offer_gpus(&self) -> f64 {
        if self.rounds_with_offers == 0 {
            0.0
        } else {
            self.offered_gpus as f64 / self.rounds_with_offers as f64
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub policy: Policy,
    pub apps: usize,
    pub unfinished_apps: usize,
    pub rounds: u64,
    pub max_rho: f64,
    pub p99_rho: f64,
    pub p95_rho: f64,
    pub median_rho: f64,
    pub mean_rho: f64,
    /// Jain's fairness index over rho: (sum x)^2 / (n sum x^2), 1 when all are equal.
    pub jains_index: f64,
    pub apps_rho_above_one: usize,
    pub apps_rho_above_two: usize,
    pub total_gpu_seconds: f64,
    /// Restart pauses charged, summed over apps ([`AppReport::restart_gpu_seconds`]: an upper
    /// bound of the GPU time they idled).
    pub restart_gpu_seconds: f64,
    pub mean_completion_seconds: f64,
    pub p99_completion_seconds: f64,
    /// First arrival to last completion.
    pub makespan_seconds: f64,
    pub reallocations: u64,
    pub mean_placement_score: f64,
    pub mechanism: MechanismStats,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimulationReport {
    pub summary: RunSummary,
    /// Sorted rho values: the empirical CDF (the i-th of n is at (i + 1) / n).
    pub rho_cdf: Vec<f64>,
    pub apps: Vec<AppReport>,
}

impl SimulationReport {
    pub fn new(
        policy: Policy,
        apps: Vec<AppReport>,
        rounds: u64,
        mechanism: MechanismStats,
    ) -> Self {
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
            p99_rho: percentile(&rhos, 0.99),
            p95_rho: percentile(&rhos, 0.95),
            median_rho: percentile(&rhos, 0.5),
            mean_rho: mean(&rhos),
            jains_index: jains_index(&rhos),
            apps_rho_above_one: rhos.iter().filter(|&&rho| rho > 1.0).count(),
            apps_rho_above_two: rhos.iter().filter(|&&rho| rho > 2.0).count(),
            total_gpu_seconds: apps.iter().map(|app| app.gpu_seconds).sum(),
            restart_gpu_seconds: apps.iter().map(|app| app.restart_gpu_seconds).sum(),
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
            mechanism,
        };
        Self {
            summary,
            rho_cdf,
            apps,
        }
    }

    /// One line per app, with a header; enough to recompute each rho.
    pub fn apps_csv(&self) -> String {
        let mut csv = String::from(
            "app,model,finished,arrival_seconds,completion_seconds,t_cluster_seconds,n_avg,rho,gpu_seconds,placement_score,reallocations,restarts,restart_gpu_seconds\n",
        );
        for app in &self.apps {
            let _ = writeln!(
                csv,
                "{},{},{},{},{},{},{},{},{},{},{},{},{}",
                app.app,
                app.model,
                app.finished,
                app.arrival_seconds,
                app.completion_seconds,
                app.t_cluster_seconds,
                app.n_avg,
                app.rho,
                app.gpu_seconds,
                app.placement_score,
                app.reallocations,
                app.restarts,
                app.restart_gpu_seconds
            );
        }
        csv
    }
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values.iter().sum::<f64>() / values.len() as f64
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
    fn percentile_uses_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&values, 0.99), 99.0);
        assert_eq!(percentile(&values, 0.5), 50.0);
        assert_eq!(percentile(&[7.0], 0.99), 7.0);
    }
}
