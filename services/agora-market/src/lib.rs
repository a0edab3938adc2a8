//! Agora's market engine: everything that decides who gets which GPU, and nothing else.
//!
//! It implements Themis (NSDI'20): finish-time fairness ([`fairness`]), the agent's bids
//! ([`bids`]), the arbiter's partial-allocation auction ([`auction`]), leftovers
//! ([`leftover`]), leases ([`lease`]) and the round-by-round mechanism ([`market`]), whose
//! decision ([`round`]) can be replayed from the inputs each round records.
//!
//! The engine does no I/O and reads no clock: time (`now`) and randomness (`seed`) are inputs,
//! so the same inputs give the same outputs. The simulator and the live service drive this same
//! engine.

pub mod app;
pub mod auction;
pub mod baselines;
pub mod bids;
pub mod cluster_file;
pub mod division;
pub mod error;
pub mod fairness;
pub mod gpu_models;
mod highs_run;
pub mod hosts;
pub mod lease;
pub mod leftover;
pub mod live;
pub mod market;
mod parallel;
pub mod policy;
pub mod progress;
pub mod resources;
pub mod rho;
pub mod round;
pub mod shown;
pub mod throughput;
pub mod time;
pub mod topology;

/// Version of the decision logic, recorded with every round so audits replay a round with the
/// engine that decided it.
pub const ENGINE_VERSION: &str = env!("CARGO_PKG_VERSION");
