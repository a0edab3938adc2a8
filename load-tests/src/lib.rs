//! `agora-load`: plays many HPO frameworks against a running arbiter at once (register apps,
//! follow offers by long-poll, bid, report progress, release leases), measures throughput and
//! latency, samples the server's memory, and checks the outcome against Postgres: every
//! acknowledged bid is stored and no GPU was ever leased twice at once.

pub mod api;
pub mod failover;
pub mod player;
pub mod rss;
pub mod run;
pub mod stats;
pub mod verify;
