//! `agora worker`: the agent on each GPU host.
//!
//! It discovers the host's GPUs and how they are connected ([`backend`], [`topology`]),
//! registers them with the arbiter, heartbeats each GPU's metrics and health ([`health`]),
//! and enforces the leases the arbiter lists for the host ([`enforce`]), their CPUs and memory
//! in cgroups where it may ([`cgroup`]). It reports the host's CPU cores and memory too
//! ([`host_resources`]). It reports and enforces; the arbiter decides. The wire format is [`agora_protocol`].

pub mod backend;
pub mod cgroup;
pub mod enforce;
pub mod health;
pub mod host_resources;
pub mod nvml;
pub mod simulated;
pub mod topology;
mod worker;

pub use worker::{Worker, WorkerConfig, WorkerError, ENFORCEMENT_TICK};

/// This machine's host name: the name its worker registers under unless told otherwise.
pub fn local_host_name() -> Option<String> {
    nix::unistd::gethostname().ok()?.into_string().ok()
}
