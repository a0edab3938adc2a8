//! A workload: apps arriving over time, each with its jobs and the facts the simulator knows
//! but the market does not (how good each job will turn out to be).

use std::collections::BTreeMap;

use agora_market::app::App;
use serde::{Deserialize, Serialize};

/// The project's own workload format (JSON): a list of apps with arrival times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub apps: Vec<WorkloadApp>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadApp {
    /// Seconds since the start of the trace.
    pub arrival_seconds: f64,
    /// The model trained (Table 4 names, e.g. `vgg16`, `transformer`), for reports.
    pub model: String,
    /// The app as its HPO framework describes it to the market: jobs, iterations, serial
    /// iteration times, demands and placement slowdowns (the truth; the simulator can inject
    /// estimation errors into what the market sees).
    pub app: App,
    /// Final quality of each job (higher is better), by job id: successive halving keeps the
    /// better half at each phase end. Jobs not listed count as quality 0.
    #[serde(default)]
    pub job_quality: BTreeMap<String, f64>,
}
