//! GPU hosts running `agora worker`: registrations and heartbeats as arbiter decisions, and
//! the GPU mirrors. Each goes through the engine (`Market::register_host`, `host_up`,
//! withdrawals), staged on a copy of the market, is committed to Postgres, and only then told,
//! like every other decision. A GPU reported unhealthy leaves service at once and its lease
//! gets the same notice and grace as a drain; a host that returns puts its healthy GPUs back.
//! A host silent for two heartbeat intervals is given up by the live state machine
//! (`agora_market::live`), which these heartbeats keep informed.

use std::collections::BTreeSet;

use actix::prelude::*;
use agora_market::gpu_models::gpu_type_of;
use agora_market::hosts::{Host, HostGpu, HostSpec};
use agora_market::live::{Event, Notice};
use agora_market::market::{HostJoined, Market, Withdrawal};
use agora_market::resources::MachineResources;
use agora_market::shown::Shown;
use agora_market::time::Timestamp;
use agora_market::topology::{GpuId, GpuIndex};
use agora_protocol::{
    Enforcement, GpuHealth, Heartbeat, HeartbeatReply, HostLease, HostRegistration, Registered,
};

use super::arbiter::{Arbiter, Reply, Staged};
use super::gpu_worker::{GpuCommand, GpuWorker};
use super::records;
use super::ArbiterError;
use crate::clock::to_datetime;
use crate::ids::LeaseKey;
use crate::metrics::metrics;
use crate::store::{
    app_key, simulated_cuda_uuid, Commit, GpuHealthChange, HeartbeatRecord, HostRecord,
    HostStatusChange, WorkerGpuRecord,
};

/// A host registers, or registers again after a restart or an outage.
#[derive(Debug, Message)]
#[rtype(result = "Result<Registered, ArbiterError>")]
pub struct RegisterHost {
    pub registration: HostRegistration,
}

/// A host's periodic report; the answer lists the leases it must enforce.
#[derive(Debug, Message)]
#[rtype(result = "Result<HeartbeatReply, ArbiterError>")]
pub struct HostHeartbeat {
    pub host: String,
    pub heartbeat: Heartbeat,
}

fn refuse<T: 'static>(error: ArbiterError) -> Reply<T> {
    Box::pin(actix::fut::ready(Err(error)))
}

fn internal(error: impl std::fmt::Display) -> ArbiterError {
    ArbiterError::Internal(error.to_string())
}

impl Handler<RegisterHost> for Arbiter {
    type Result = Reply<Registered>;

    fn handle(&mut self, request: RegisterHost, ctx: &mut Self::Context) -> Self::Result {
        self.register_host(request.registration, ctx)
    }
}

impl Handler<HostHeartbeat> for Arbiter {
    type Result = Reply<HeartbeatReply>;

    fn handle(&mut self, request: HostHeartbeat, ctx: &mut Self::Context) -> Self::Result {
        self.heartbeat(request, ctx)
    }
}

/// The host as the engine sees it: each GPU of the type its NVML product name maps to
/// (`agora_market::gpu_models`); a name that maps to no type refuses the registration.
fn host_spec(registration: &HostRegistration) -> Result<HostSpec, ArbiterError> {
    let gpus = registration
        .gpus
        .iter()
        .enumerate()
        .map(|(position, gpu)| {
            let gpu_type = gpu_type_of(&gpu.name).map_err(|error| {
                ArbiterError::InvalidRegistration(format!("gpus[{position}].name: {error}"))
            })?;
            Ok(HostGpu {
                id: GpuId(gpu.uuid.clone()),
                gpu_type: gpu_type.to_owned(),
                slot: gpu.slot,
            })
        })
        .collect::<Result<_, ArbiterError>>()?;
    Ok(HostSpec {
        name: registration.host.clone(),
        rack: registration.rack.clone(),
        gpus,
        resources: host_resources(registration)?,
    })
}

/// The host's CPU cores and memory, if it reports them: at least one core, and a finite
/// amount of memory above 0.
fn host_resources(registration: &HostRegistration) -> Result<MachineResources, ArbiterError> {
    if registration.cpus == Some(0) {
        return Err(ArbiterError::InvalidRegistration(
            "cpus: a host has at least 1 CPU core (leave cpus out if it is not modelled)".into(),
        ));
    }
    if let Some(memory) = registration
        .memory_gib
        .filter(|memory| !(memory.is_finite() && *memory > 0.0))
    {
        return Err(ArbiterError::InvalidRegistration(format!(
            "memory_gib: the host's memory must be a finite number of GiB above 0, got {}",
            Shown(memory)
        )));
    }
    Ok(MachineResources {
        cpus: registration.cpus.map(f64::from),
        memory_gib: registration.memory_gib,
    })
}

/// What a heartbeat changes, staged on a copy of the market.
struct StagedHeartbeat {
    next: Market,
    commit: Commit,
    notices: Vec<(GpuIndex, Notice)>,
    recovered: Vec<GpuIndex>,
    reports: Vec<(GpuIndex, GpuCommand)>,
}

impl Arbiter {
    fn register_host(
        &mut self,
        registration: HostRegistration,
        ctx: &mut Context<Self>,
    ) -> Reply<Registered> {
        let now = self.now();
        let spec = match host_spec(&registration) {
            Ok(spec) => spec,
            Err(error) => return refuse(error),
        };
        let mut next = self.market().clone();
        let joined = match next.register_host(&spec, now) {
            Ok(joined) => joined,
            Err(error) => return refuse(ArbiterError::InvalidRegistration(error.to_string())),
        };
        let reason = format!(
            "host {} registered again without the lease's GPU",
            spec.name
        );
        let mut commit = match records::ended_leases(&next, &joined.revoked, Some(&reason)) {
            Ok(commit) => commit,
            Err(error) => return refuse(error),
        };
        commit.workers.registration = Some(host_record(&next, &joined, registration));
        commit.workers.returns_capacity = true;
        let interval = self.settings.heartbeat_interval;
        let revocations = joined.revoked.len();
        self.commit(commit, Staged::market(next), ctx, move |arbiter, ctx| {
            metrics().leases_revoked(revocations);
            for &gpu in &joined.added {
                debug_assert_eq!(gpu.get(), arbiter.gpus.len(), "GPUs are appended");
                let mirror = arbiter.gpu_worker(gpu).start();
                arbiter.gpus.push(mirror);
            }
            let host = spec.name.clone();
            arbiter.feed(Event::HostSeen { host }, ctx);
            arbiter.mirror_service(&spec.name);
            tracing::info!(host = %spec.name, gpus = spec.gpus.len(), "GPU host registered");
            Registered {
                host: spec.name,
                heartbeat_interval_ms: interval.as_millis() as u64,
            }
        })
    }

    fn heartbeat(
        &mut self,
        request: HostHeartbeat,
        ctx: &mut Context<Self>,
    ) -> Reply<HeartbeatReply> {
        let staged = match self.stage_heartbeat(&request) {
            Ok(staged) => staged,
            Err(error) => return refuse(error),
        };
        let StagedHeartbeat {
            next,
            commit,
            notices,
            recovered,
            reports,
        } = staged;
        let host = request.host;
        self.commit(commit, Staged::market(next), ctx, move |arbiter, ctx| {
            for (gpu, notice) in notices {
                arbiter.feed(Event::NoticeGiven { gpu, notice }, ctx);
            }
            for gpu in recovered {
                let withdrawal = Withdrawal::Unhealthy;
                arbiter.feed(Event::NoticeCancelled { gpu, withdrawal }, ctx);
            }
            for (gpu, report) in reports {
                arbiter.gpus[gpu.get()].do_send(report);
            }
            arbiter.feed(Event::HostSeen { host: host.clone() }, ctx);
            arbiter.mirror_service(&host);
            arbiter.host_leases(&host)
        })
    }

    /// Checks the heartbeat against the host's registration and stages what it changes: the
    /// host back up, GPUs leaving or returning to service, notices for leases on GPUs that
    /// turned unhealthy, and the report itself.
    fn stage_heartbeat(&self, request: &HostHeartbeat) -> Result<StagedHeartbeat, ArbiterError> {
        let host = self
            .market()
            .hosts()
            .get(&request.host)
            .ok_or_else(|| ArbiterError::UnknownHost(request.host.clone()))?;
        let on_host: BTreeSet<GpuIndex> = self.market().host_gpus(&host.name).into_iter().collect();
        let machine = host.machine as i32;
        let mut staged = StagedHeartbeat {
            next: self.market().clone(),
            commit: Commit::default(),
            notices: Vec::new(),
            recovered: Vec::new(),
            reports: Vec::new(),
        };
        if !host.up {
            staged.next.host_up(&host.name).map_err(internal)?;
            staged.commit.workers.host_status.push(HostStatusChange {
                machine,
                up: true,
                reason: format!("host {} heartbeats again", host.name),
            });
            staged.commit.workers.returns_capacity = true;
        }
        let mut metrics = Vec::new();
        for report in &request.heartbeat.gpus {
            let index = self
                .market()
                .cluster()
                .index_of(&GpuId(report.uuid.clone()))
                .filter(|index| on_host.contains(index))
                .ok_or_else(|| {
                    ArbiterError::InvalidHeartbeat(format!(
                        "GPU {} is not one of host {}'s registered GPUs; register the host again to change its GPUs",
                        report.uuid, host.name
                    ))
                })?;
            metrics.push((report.uuid.clone(), report.metrics.clone()));
            self.stage_health(host, index, &report.health, &mut staged)?;
            staged.reports.push((
                index,
                GpuCommand::Report {
                    health: report.health.clone(),
                    metrics: report.metrics.clone(),
                },
            ));
        }
        staged.commit.workers.heartbeat = Some(HeartbeatRecord {
            machine,
            metrics,
            exits: request.heartbeat.exits.clone(),
            violations: request.heartbeat.violations.clone(),
        });
        Ok(staged)
    }

    /// A GPU's reported health, if it changed: it leaves service (its lease, if any, is given
    /// notice, like a drain) or returns to it.
    fn stage_health(
        &self,
        host: &Host,
        gpu: GpuIndex,
        health: &GpuHealth,
        staged: &mut StagedHeartbeat,
    ) -> Result<(), ArbiterError> {
        let why = match health {
            GpuHealth::Healthy => None,
            GpuHealth::Unhealthy { reason } => Some(reason),
        };
        if why.is_some() == self.market().is_withdrawn_for(gpu, Withdrawal::Unhealthy) {
            return Ok(());
        }
        let uuid = &self.market().cluster().gpu(gpu).id;
        staged
            .next
            .set_withdrawn(gpu, Withdrawal::Unhealthy, why.is_some());
        staged.commit.workers.gpu_health.push(GpuHealthChange {
            gpu: uuid.clone(),
            healthy: why.is_none(),
            reason: why.cloned(),
        });
        match why {
            None => {
                staged.recovered.push(gpu);
                staged.commit.workers.returns_capacity = true;
            }
            Some(why) if self.market().leases().is_leased(gpu) => {
                let reason = format!("GPU {uuid} on host {} reported unhealthy: {why}", host.name);
                let (notice, _) =
                    self.stage_notice(gpu, Withdrawal::Unhealthy, reason, &mut staged.commit)?;
                staged.notices.push((gpu, notice));
            }
            Some(_) => {}
        }
        Ok(())
    }

    pub(super) fn tell_gpu(&self, gpu: &GpuId, command: GpuCommand) {
        if let Some(index) = self.market().cluster().index_of(gpu) {
            self.gpus[index.get()].do_send(command);
        }
    }

    /// A mirror for every GPU, each told of the lease it runs.
    pub(super) fn start_gpu_workers(&mut self) {
        self.gpus = self
            .market()
            .cluster()
            .gpus()
            .map(|(index, _)| self.gpu_worker(index).start())
            .collect();
        for lease in self.market().leases().active() {
            // Every app of the service is named by its database id.
            let Ok(app) = app_key(&lease.app) else {
                continue;
            };
            for &gpu in &lease.gpus {
                self.gpus[gpu.get()].do_send(GpuCommand::Run {
                    lease: lease.id.into(),
                    app,
                });
            }
        }
    }

    /// Tells the host's GPU mirrors whether they are in service.
    pub(super) fn mirror_service(&self, host: &str) {
        for gpu in self.market().host_gpus(host) {
            self.gpus[gpu.get()].do_send(GpuCommand::SetHealth(self.market().is_healthy(gpu)));
        }
    }

    /// The mirror of GPU `index`: of a registered host, or of the simulated fleet.
    pub(super) fn gpu_worker(&self, index: GpuIndex) -> GpuWorker {
        let id = self.market().cluster().gpu(index).id.clone();
        let healthy = self.market().is_healthy(index);
        match self.market().host_of(index) {
            Some(host) => GpuWorker::on_host(id, host.name.clone(), healthy),
            None => {
                let cuda_uuid = simulated_cuda_uuid(&id.0);
                GpuWorker::simulated(id, cuda_uuid, healthy)
            }
        }
    }

    /// Every active lease on the host's GPUs, as the host enforces it: a lease given notice
    /// ends when its revocation is due.
    fn host_leases(&self, host: &str) -> HeartbeatReply {
        let on_host: BTreeSet<GpuIndex> = self.market().host_gpus(host).into_iter().collect();
        let cluster = self.market().cluster();
        let machine = self.market().hosts().get(host).map(|host| host.machine);
        let leases = self
            .market()
            .leases()
            .active()
            .filter_map(|lease| {
                let here: Vec<String> = lease
                    .gpus
                    .iter()
                    .filter(|gpu| on_host.contains(gpu))
                    .map(|&gpu| cluster.gpu(gpu).id.0.clone())
                    .collect();
                if here.is_empty() {
                    return None;
                }
                let end = lease
                    .gpus
                    .iter()
                    .filter_map(|&gpu| self.live.notice(gpu))
                    .map(|notice| notice.at)
                    .fold(lease.end, Timestamp::min);
                let on_this_host = machine
                    .and_then(|machine| self.market().lease_resources(lease).remove(&machine))
                    .unwrap_or_default();
                Some(HostLease {
                    lease_id: LeaseKey::from(lease.id).0,
                    app_id: app_key(&lease.app).ok()?.0,
                    gpu_uuids: here,
                    start_at: to_datetime(lease.start),
                    end_at: to_datetime(end),
                    grace_seconds: self.settings.revocation_grace.as_secs(),
                    enforcement: self
                        .members
                        .get(&lease.app)
                        .map_or(Enforcement::Watch, |member| member.enforcement.clone()),
                    cpus: on_this_host.cpus,
                    memory_gib: on_this_host.memory_gib,
                })
            })
            .collect();
        HeartbeatReply {
            heartbeat_interval_ms: self.settings.heartbeat_interval.as_millis() as u64,
            leases,
        }
    }
}

/// The registration as stored, with the cluster numbers the engine gave the host's GPUs.
fn host_record(next: &Market, joined: &HostJoined, registration: HostRegistration) -> HostRecord {
    let cluster = next.cluster();
    let gpu = |uuid: &str| {
        cluster
            .index_of(&GpuId(uuid.to_owned()))
            .map(|index| cluster.gpu(index))
    };
    let location = |uuid: &str| gpu(uuid).map(|gpu| gpu.location);
    let rack = registration
        .gpus
        .first()
        .and_then(|gpu| location(&gpu.uuid))
        .map_or(0, |location| location.rack as i32);
    HostRecord {
        machine: joined.host.machine as i32,
        rack,
        name: registration.host,
        rack_name: registration.rack,
        worker_version: registration.worker_version,
        cpus: registration
            .cpus
            .map(|cpus| i32::try_from(cpus).unwrap_or(i32::MAX)),
        memory_gib: registration.memory_gib,
        links: registration.links,
        gpus: registration
            .gpus
            .into_iter()
            .map(|reported| WorkerGpuRecord {
                slot: location(&reported.uuid).map_or(0, |location| location.slot as i32),
                gpu_type: gpu(&reported.uuid)
                    .map(|gpu| gpu.gpu_type.clone())
                    .unwrap_or_default(),
                compute_capability: reported.compute_capability.map(|cc| cc.to_string()),
                uuid: reported.uuid,
                name: reported.name,
                memory_total_bytes: reported.memory_total_bytes,
                pci_bus_id: reported.pci_bus_id,
                nvml_index: reported.index,
                host_slot: reported.slot,
            })
            .collect(),
    }
}
