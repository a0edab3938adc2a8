//! The arbiter service: actix actors that drive the market engine live, an HTTP API for HPO
//! frameworks and tenants, and Postgres as the source of truth for leases and history.

pub mod actors;
pub mod api;
pub mod audit;
pub mod clock;
pub mod config;
pub mod demo;
pub mod ids;
pub mod leadership;
pub mod metrics;
pub mod notices;
pub mod server;
pub mod store;
pub mod telemetry;
pub mod visibility;
pub mod why;
