//! Agora's simulator: replays a workload on a simulated cluster through the very engine the
//! service runs (`agora_market::market::Market::run_round`), on simulated time.

pub mod charts;
pub mod clusters;
pub mod experiments;
pub mod generate;
pub mod metrics;
pub mod models;
pub mod simulator;
pub mod trace;
pub mod workload;
