//! The worker's loop: register, heartbeat, enforce.
//!
//! The worker pulls; the arbiter never connects to a host. Until the arbiter accepts the
//! registration the worker retries with backoff (0.5 s doubling to 30 s), logging each
//! failure. Then it heartbeats at the interval the arbiter returns; an arbiter that answers
//! 404 has forgotten the host (a restart, or it declared the host dead), so the worker
//! registers again. Between heartbeats it ticks lease enforcement every
//! [`ENFORCEMENT_TICK`]. Commands keep being enforced while the arbiter is unreachable: the
//! leases it last listed end on their own schedule.
//!
//! Given several arbiters of one database (`--arbiter` URLs, comma-separated), the worker
//! talks to the leader: a standby's 503 `not_leader` names it, and an arbiter that does not
//! answer is left for the next; the exchange is retried as any other failed one.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agora_protocol::{
    GpuReport, Heartbeat, HeartbeatReply, HostLease, HostRegistration, Registered, REGISTER_PATH,
};
use chrono::Utc;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::backend::{BackendError, GpuBackend, GpuProcess};
use crate::cgroup::Cgroups;
use crate::enforce::{violations, Enforcer};
use crate::health::{HealthPolicy, HealthTracker};
use crate::host_resources::HostResources;
use crate::topology::{discover, HostTopology};

/// How often launched commands are checked and signalled between heartbeats.
pub const ENFORCEMENT_TICK: Duration = Duration::from_millis(100);

const FIRST_RETRY: Duration = Duration::from_millis(500);
const LAST_RETRY: Duration = Duration::from_secs(30);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The cgroups that limit launched commands' CPUs and memory, or `None` with a warning (once,
/// at start) saying why they are not limited.
fn limit_resources(root: Option<&Path>) -> Option<Cgroups> {
    let prepared = root
        .ok_or_else(|| "no cgroup root given".to_owned())
        .and_then(Cgroups::on_host);
    match prepared {
        Ok(cgroups) => Some(cgroups),
        Err(reason) => {
            tracing::warn!(%reason, "CPU and memory limits of launched commands are not enforced");
            None
        }
    }
}

/// Everything a worker needs.
pub struct WorkerConfig {
    /// The arbiter's base URL, e.g. `http://arbiter.example:8080`, or several arbiters' of one
    /// database, comma-separated.
    pub arbiter: String,
    /// The worker token (`Authorization: Bearer`).
    pub token: String,
    /// This host's name in the cluster.
    pub host: String,
    /// The rack the host sits in.
    pub rack: String,
    /// Heartbeat at this interval instead of the arbiter's.
    pub heartbeat_interval: Option<Duration>,
    pub health: HealthPolicy,
    pub backend: Box<dyn GpuBackend>,
    /// The operator's CPU count and memory (GiB) for this host, over what the backend finds.
    pub cpus: Option<u32>,
    pub host_memory_gib: Option<f64>,
    /// Where launched commands get cgroups with their leases' CPU and memory limits
    /// ([`crate::cgroup`]); `None`: limits are not enforced.
    pub cgroup_root: Option<PathBuf>,
}

/// Leaves the token (and the backend) out, so the config can be logged.
impl std::fmt::Debug for WorkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerConfig")
            .field("arbiter", &self.arbiter)
            .field("host", &self.host)
            .field("rack", &self.rack)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("health", &self.health)
            .field("cpus", &self.cpus)
            .field("host_memory_gib", &self.host_memory_gib)
            .field("cgroup_root", &self.cgroup_root)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot discover this host's GPUs: {0}")]
    Discovery(#[from] BackendError),
    /// The arbiter refused the worker for good (a bad token, a registration it rejects);
    /// retrying would not help.
    #[error("the arbiter at {arbiter} refused this worker ({status}): {body}{hint}")]
    Refused {
        arbiter: String,
        status: u16,
        body: String,
        hint: &'static str,
    },
}

/// Where the worker stands with the arbiter.
#[derive(Debug, Default)]
struct Link {
    registered: bool,
    /// Registration attempts that failed in a row.
    failed_registrations: u32,
}

/// A failed exchange with the arbiter.
#[derive(Debug)]
enum Exchange {
    /// Network trouble or a server error: try again later.
    Retry(String),
    /// 404: the arbiter does not know this host.
    UnknownHost,
    Refused(WorkerError),
}

/// One host's agent.
#[allow(missing_debug_implementations)] // awc::Client is not Debug
pub struct Worker {
    config: WorkerConfig,
    topology: HostTopology,
    resources: HostResources,
    trackers: Vec<HealthTracker>,
    /// The last XID raised for each GPU, by position in `topology.devices`.
    last_xid: Vec<Option<u64>>,
    enforcer: Enforcer,
    leases: Vec<HostLease>,
    sequence: u64,
    /// The interval the arbiter last asked for.
    arbiter_interval: Duration,
    /// The arbiters' base URLs, and the one tried first: the leader, as far as known.
    arbiters: Vec<String>,
    leader: Cell<usize>,
    client: awc::Client,
}

impl Worker {
    /// Discovers the host's GPUs and their topology.
    pub fn new(mut config: WorkerConfig) -> Result<Self, WorkerError> {
        let topology = discover(config.backend.as_mut())?;
        let resources = config
            .backend
            .host_resources()
            .overridden_by(config.cpus, config.host_memory_gib);
        let gpus = topology.devices.len();
        let arbiters = config
            .arbiter
            .split(',')
            .map(|url| url.trim().trim_end_matches('/').to_owned())
            .collect();
        Ok(Self {
            enforcer: Enforcer::with_cgroups(limit_resources(config.cgroup_root.as_deref())),
            config,
            topology,
            resources,
            trackers: vec![HealthTracker::default(); gpus],
            last_xid: vec![None; gpus],
            leases: Vec::new(),
            sequence: 0,
            arbiter_interval: Duration::from_secs(5),
            arbiters,
            leader: Cell::new(0),
            client: awc::Client::builder().timeout(REQUEST_TIMEOUT).finish(),
        })
    }

    /// What the worker registers.
    pub fn registration(&self) -> HostRegistration {
        HostRegistration {
            cpus: self.resources.cpus,
            memory_gib: self.resources.memory_gib,
            ..self
                .topology
                .registration(&self.config.host, &self.config.rack)
        }
    }

    /// Runs until `shutdown` completes (then ends the commands it launched, each after its
    /// lease's grace) or the arbiter refuses the worker.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), WorkerError> {
        let mut shutdown = std::pin::pin!(shutdown);
        let registration = self.registration();
        let mut link = Link::default();
        let outcome = loop {
            let wait = match self.exchange(&registration, &mut link).await {
                Ok(wait) => wait,
                Err(error) => break Err(error),
            };
            if !self.enforce_for(wait, shutdown.as_mut()).await {
                break Ok(());
            }
        };
        self.end_launched_commands().await;
        outcome
    }

    /// Registers or heartbeats, as the link needs; gives the wait until the next exchange.
    async fn exchange(
        &mut self,
        registration: &HostRegistration,
        link: &mut Link,
    ) -> Result<Duration, WorkerError> {
        if link.registered {
            return match self.heartbeat().await {
                Ok(()) => Ok(self.interval()),
                Err(Exchange::UnknownHost) => {
                    tracing::warn!(
                        "the arbiter does not know this host any more: registering again"
                    );
                    link.registered = false;
                    Ok(Duration::ZERO)
                }
                Err(Exchange::Retry(error)) => {
                    tracing::warn!(%error, "heartbeat failed; the leases already known stay enforced");
                    Ok(self.interval())
                }
                // A bad token ends the worker; any other rejection is logged and the
                // worker keeps enforcing what it knows.
                Err(Exchange::Refused(
                    error @ WorkerError::Refused {
                        status: 401 | 403, ..
                    },
                )) => Err(error),
                Err(Exchange::Refused(error)) => {
                    tracing::error!(%error, "the arbiter rejected a heartbeat");
                    Ok(self.interval())
                }
            };
        }
        let problem = match self.register(registration).await {
            Ok(()) => {
                tracing::info!(host = %self.config.host, gpus = registration.gpus.len(), "registered with the arbiter");
                *link = Link {
                    registered: true,
                    failed_registrations: 0,
                };
                // Heartbeat at once, so the arbiter learns the GPUs' health without delay.
                return Ok(Duration::ZERO);
            }
            Err(Exchange::Refused(error)) => return Err(error),
            Err(Exchange::Retry(error)) => error,
            Err(Exchange::UnknownHost) => "it has no worker endpoint (HTTP 404)".to_owned(),
        };
        let delay = backoff(link.failed_registrations);
        link.failed_registrations += 1;
        tracing::warn!(arbiter = %self.config.arbiter, error = %problem, "cannot register with the arbiter; retrying in {delay:?}");
        Ok(delay)
    }

    /// The heartbeat interval: the operator's override, else the arbiter's latest word.
    fn interval(&self) -> Duration {
        self.config
            .heartbeat_interval
            .unwrap_or(self.arbiter_interval)
    }

    async fn register(&mut self, registration: &HostRegistration) -> Result<(), Exchange> {
        let registered: Registered = self.post(REGISTER_PATH, registration).await?;
        self.arbiter_interval = Duration::from_millis(registered.heartbeat_interval_ms);
        Ok(())
    }

    /// Sends one heartbeat and applies the reply.
    async fn heartbeat(&mut self) -> Result<(), Exchange> {
        self.sequence += 1;
        let heartbeat = self.report();
        let path = agora_protocol::heartbeat_path(&self.config.host);
        let reply: HeartbeatReply = self.post(&path, &heartbeat).await?;
        self.enforcer.exits_delivered(heartbeat.exits.len());
        self.enforcer.apply(&reply.leases, Utc::now());
        self.leases = reply.leases;
        self.arbiter_interval = Duration::from_millis(reply.heartbeat_interval_ms);
        Ok(())
    }

    /// Reads every GPU and judges its health.
    fn report(&mut self) -> Heartbeat {
        let xids = self.config.backend.take_xid_events();
        let mut gpus = Vec::with_capacity(self.topology.devices.len());
        let mut processes_by_gpu: BTreeMap<String, Vec<GpuProcess>> = BTreeMap::new();
        for (position, device) in self.topology.devices.iter().enumerate() {
            let raised: Vec<u64> = xids
                .iter()
                .filter(|event| event.gpu_index == device.index)
                .map(|event| event.xid)
                .collect();
            if let Some(last) = raised.last() {
                self.last_xid[position] = Some(*last);
            }
            let sample = self.config.backend.sample(device.index);
            let health = self.trackers[position].assess(
                &self.config.health,
                sample.as_ref().map(|sample| &sample.metrics),
                &raised,
            );
            let (mut metrics, processes) = match sample {
                Ok(sample) => (sample.metrics, sample.processes),
                Err(_) => Default::default(),
            };
            metrics.last_xid = self.last_xid[position];
            processes_by_gpu.insert(device.uuid.clone(), processes);
            gpus.push(GpuReport {
                uuid: device.uuid.clone(),
                health,
                metrics,
            });
        }
        Heartbeat {
            sequence: self.sequence,
            gpus,
            exits: self.enforcer.undelivered_exits(),
            violations: violations(&self.leases, &processes_by_gpu),
        }
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, Exchange> {
        let url = format!("{}{path}", self.arbiters[self.leader.get()]);
        let mut response = self
            .client
            .post(&url)
            .bearer_auth(&self.config.token)
            .send_json(body)
            .await
            .map_err(|error| {
                self.follow(None);
                Exchange::Retry(format!("POST {url}: {error}"))
            })?;
        let status = response.status().as_u16();
        let bytes =
            response.body().limit(16 << 20).await.map_err(|error| {
                Exchange::Retry(format!("POST {url}: reading the reply: {error}"))
            })?;
        match status {
            200..=299 => serde_json::from_slice(&bytes)
                .map_err(|error| Exchange::Retry(format!("POST {url}: unexpected reply: {error}"))),
            404 => Err(Exchange::UnknownHost),
            503 if not_leader(&bytes).is_some() => {
                self.follow(not_leader(&bytes).flatten().as_deref());
                Err(Exchange::Retry(format!(
                    "POST {url}: a standby, not the leader"
                )))
            }
            408 | 429 | 500..=599 => Err(Exchange::Retry(format!(
                "POST {url}: HTTP {status}: {}",
                String::from_utf8_lossy(&bytes)
            ))),
            _ => Err(Exchange::Refused(WorkerError::Refused {
                arbiter: self.config.arbiter.clone(),
                status,
                body: String::from_utf8_lossy(&bytes).into_owned(),
                hint: if matches!(status, 401 | 403) {
                    " (check the worker token: --token or AGORA_WORKER_TOKEN)"
                } else {
                    ""
                },
            })),
        }
    }

    /// Tries `leader` next when it is one of the arbiters, else the next arbiter.
    fn follow(&self, leader: Option<&str>) {
        let next = leader
            .and_then(|leader| self.arbiters.iter().position(|url| url == leader))
            .unwrap_or((self.leader.get() + 1) % self.arbiters.len());
        self.leader.set(next);
    }

    /// Ticks enforcement for `wait`; false if `shutdown` completed meanwhile.
    async fn enforce_for(
        &mut self,
        wait: Duration,
        mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> bool {
        let until = tokio::time::Instant::now() + wait;
        loop {
            self.enforcer.tick(Utc::now());
            let now = tokio::time::Instant::now();
            if now >= until {
                return true;
            }
            tokio::select! {
                () = shutdown.as_mut() => return false,
                () = tokio::time::sleep((until - now).min(ENFORCEMENT_TICK)) => {}
            }
        }
    }

    async fn end_launched_commands(&mut self) {
        if !self.enforcer.has_running() {
            return;
        }
        tracing::info!("stopping: ending the commands launched for leases");
        self.enforcer.end_all(Utc::now());
        while self.enforcer.has_running() {
            tokio::time::sleep(ENFORCEMENT_TICK).await;
            self.enforcer.tick(Utc::now());
        }
    }
}

/// The wait before registration attempt `failures + 1`.
fn backoff(failures: u32) -> Duration {
    FIRST_RETRY
        .saturating_mul(2_u32.saturating_pow(failures.min(16)))
        .min(LAST_RETRY)
}

/// For a standby's `not_leader` answer, the leader it names (if it knows one).
fn not_leader(problem: &[u8]) -> Option<Option<String>> {
    let problem: serde_json::Value = serde_json::from_slice(problem).ok()?;
    (problem["code"] == "not_leader").then(|| problem["leader"].as_str().map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standbys_answer_names_the_leader_to_follow() {
        let named = br#"{"code": "not_leader", "leader": "http://arbiter-2:8080"}"#;
        assert_eq!(
            not_leader(named),
            Some(Some("http://arbiter-2:8080".to_owned()))
        );
        assert_eq!(not_leader(br#"{"code": "not_leader"}"#), Some(None));
        assert_eq!(not_leader(br#"{"code": "store_unavailable"}"#), None);
        assert_eq!(not_leader(b"Service Unavailable"), None);
    }

    #[test]
    fn registration_retries_back_off_to_half_a_minute() {
        assert_eq!(backoff(0), Duration::from_millis(500));
        assert_eq!(backoff(1), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(4));
        assert_eq!(backoff(6), Duration::from_secs(30));
        assert_eq!(backoff(u32::MAX), Duration::from_secs(30));
    }
}
