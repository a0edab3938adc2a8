//! GPU hosts in Postgres: what the arbiter writes when hosts register, heartbeat, go down and
//! return (inside the decision's [`super::Commit`]), and what it reloads after a restart.

use agora_market::time::Timestamp;
use agora_market::topology::GpuId;
use agora_protocol::{GpuLink, GpuMetrics, LeaseExit, Violation};
use sqlx::{Postgres, Transaction};

use super::{Store, StoreError};
use crate::clock::to_datetime;

/// What one decision changes about GPU hosts.
#[derive(Debug, Clone, Default)]
pub struct WorkerChanges {
    pub registration: Option<HostRecord>,
    pub heartbeat: Option<HeartbeatRecord>,
    pub host_status: Vec<HostStatusChange>,
    pub gpu_health: Vec<GpuHealthChange>,
    /// GPUs joined or came back into service: a round may have something new to offer.
    pub returns_capacity: bool,
}

/// A host as it registered, with the cluster numbers the engine gave it.
#[derive(Debug, Clone)]
pub struct HostRecord {
    pub machine: i32,
    pub rack: i32,
    pub name: String,
    pub rack_name: String,
    pub worker_version: String,
    /// CPU cores and memory (GiB) the host reported; `None`: not modelled.
    pub cpus: Option<i32>,
    pub memory_gib: Option<f64>,
    pub links: Vec<GpuLink>,
    pub gpus: Vec<WorkerGpuRecord>,
}

#[derive(Debug, Clone)]
pub struct WorkerGpuRecord {
    pub uuid: String,
    /// NVML's product name, as reported.
    pub name: String,
    /// The engine's GPU type, which the product name maps to.
    pub gpu_type: String,
    /// `major.minor`, when the worker reported it.
    pub compute_capability: Option<String>,
    pub memory_total_bytes: u64,
    pub pci_bus_id: String,
    pub nvml_index: u32,
    pub host_slot: u32,
    /// The cluster's slot number.
    pub slot: i32,
}

#[derive(Debug, Clone)]
pub struct HeartbeatRecord {
    pub machine: i32,
    pub metrics: Vec<(String, GpuMetrics)>,
    pub exits: Vec<LeaseExit>,
    pub violations: Vec<Violation>,
}

#[derive(Debug, Clone)]
pub struct HostStatusChange {
    pub machine: i32,
    pub up: bool,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub struct GpuHealthChange {
    pub gpu: GpuId,
    pub healthy: bool,
    pub reason: Option<String>,
}

/// A registered host as stored.
#[derive(Debug, Clone)]
pub struct StoredHost {
    pub machine_id: i32,
    pub name: String,
    pub rack_name: String,
    pub status: String,
    pub cpus: Option<i32>,
    pub memory_gib: Option<f64>,
}

/// A host's GPU as stored, with its place in the cluster.
#[derive(Debug, Clone)]
pub struct StoredWorkerGpu {
    pub gpu_id: GpuId,
    pub gpu_type: String,
    pub machine_id: i32,
    pub rack: i32,
    pub slot: i32,
    pub host_slot: i32,
    pub reported: bool,
    pub healthy: bool,
}

impl Store {
    pub async fn worker_hosts(&self) -> Result<Vec<StoredHost>, StoreError> {
        Ok(sqlx::query_as!(
            StoredHost,
            "SELECT machine_id, name, rack_name, status, cpus, memory_gib FROM hosts
             ORDER BY machine_id"
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Every host's GPUs in cluster order (machine, slot, NVML index).
    pub async fn worker_gpus(&self) -> Result<Vec<StoredWorkerGpu>, StoreError> {
        Ok(sqlx::query_as!(
            StoredWorkerGpu,
            "SELECT w.gpu_id, g.gpu_type, g.machine_id, m.rack, g.slot, w.host_slot, w.reported,
                    w.healthy
             FROM worker_gpus w
             JOIN gpus g ON g.id = w.gpu_id
             JOIN machines m ON m.id = g.machine_id
             ORDER BY g.machine_id, g.slot, w.nvml_index, w.gpu_id"
        )
        .fetch_all(&self.pool)
        .await?)
    }
}

/// Writes `changes` inside the decision's transaction, before anything that refers to GPUs.
pub(super) async fn write_worker_changes(
    tx: &mut Transaction<'_, Postgres>,
    changes: &WorkerChanges,
    now: Timestamp,
) -> Result<(), sqlx::Error> {
    if let Some(host) = &changes.registration {
        write_registration(tx, host, now).await?;
    }
    if let Some(heartbeat) = &changes.heartbeat {
        write_heartbeat(tx, heartbeat, now).await?;
    }
    for change in &changes.host_status {
        sqlx::query!(
            "UPDATE hosts SET status = $2 WHERE machine_id = $1",
            change.machine,
            if change.up { "up" } else { "down" }
        )
        .execute(&mut **tx)
        .await?;
        write_host_event(tx, change.machine, now, change.up, Some(&change.reason)).await?;
    }
    for change in &changes.gpu_health {
        sqlx::query!(
            "UPDATE worker_gpus SET healthy = $2, health_reason = $3 WHERE gpu_id = $1",
            change.gpu.0,
            change.healthy,
            change.reason
        )
        .execute(&mut **tx)
        .await?;
        sqlx::query!(
            "INSERT INTO gpu_health_events (gpu_id, at, healthy, reason) VALUES ($1, $2, $3, $4)",
            change.gpu.0,
            to_datetime(now),
            change.healthy,
            change.reason
        )
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

async fn write_registration(
    tx: &mut Transaction<'_, Postgres>,
    host: &HostRecord,
    now: Timestamp,
) -> Result<(), sqlx::Error> {
    let links = serde_json::to_value(&host.links).unwrap_or_default();
    sqlx::query!(
        "INSERT INTO machines (id, rack, host) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO UPDATE SET rack = excluded.rack, host = excluded.host",
        host.machine,
        host.rack,
        host.name
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query!(
        "INSERT INTO hosts (machine_id, name, rack_name, worker_version, links, registered_at,
                            status, cpus, memory_gib)
         VALUES ($1, $2, $3, $4, $5, $6, 'up', $7, $8)
         ON CONFLICT (machine_id) DO UPDATE
         SET worker_version = excluded.worker_version, links = excluded.links,
             registered_at = excluded.registered_at, status = 'up', cpus = excluded.cpus,
             memory_gib = excluded.memory_gib",
        host.machine,
        host.name,
        host.rack_name,
        host.worker_version,
        links,
        to_datetime(now),
        host.cpus,
        host.memory_gib
    )
    .execute(&mut **tx)
    .await?;
    for gpu in &host.gpus {
        sqlx::query!(
            "INSERT INTO gpus (id, machine_id, slot, gpu_type, cuda_uuid) VALUES ($1, $2, $3, $4, $1)
             ON CONFLICT (id) DO NOTHING",
            gpu.uuid,
            host.machine,
            gpu.slot,
            gpu.gpu_type
        )
        .execute(&mut **tx)
        .await?;
        sqlx::query!(
            "INSERT INTO worker_gpus (gpu_id, machine_id, name, memory_total_bytes, pci_bus_id,
                                      nvml_index, host_slot, compute_capability)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (gpu_id) DO UPDATE
             SET name = excluded.name, memory_total_bytes = excluded.memory_total_bytes,
                 pci_bus_id = excluded.pci_bus_id, nvml_index = excluded.nvml_index,
                 host_slot = excluded.host_slot, compute_capability = excluded.compute_capability,
                 reported = true",
            gpu.uuid,
            host.machine,
            gpu.name,
            gpu.memory_total_bytes as i64,
            gpu.pci_bus_id,
            gpu.nvml_index as i32,
            gpu.host_slot as i32,
            gpu.compute_capability
        )
        .execute(&mut **tx)
        .await?;
    }
    let reported: Vec<String> = host.gpus.iter().map(|gpu| gpu.uuid.clone()).collect();
    sqlx::query!(
        "UPDATE worker_gpus SET reported = false WHERE machine_id = $1 AND gpu_id <> ALL ($2)",
        host.machine,
        &reported
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query!(
        "INSERT INTO host_events (machine_id, at, kind) VALUES ($1, $2, 'registered')",
        host.machine,
        to_datetime(now)
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn write_heartbeat(
    tx: &mut Transaction<'_, Postgres>,
    heartbeat: &HeartbeatRecord,
    now: Timestamp,
) -> Result<(), sqlx::Error> {
    let at = to_datetime(now);
    sqlx::query!(
        "UPDATE hosts SET last_heartbeat_at = $2 WHERE machine_id = $1",
        heartbeat.machine,
        at
    )
    .execute(&mut **tx)
    .await?;
    for (gpu, metrics) in &heartbeat.metrics {
        sqlx::query!(
            "INSERT INTO gpu_metrics (gpu_id, reported_at, gpu_util_percent, fb_used_mib,
                                      gpu_temp_celsius, power_usage_watts, ecc_sbe_volatile_total,
                                      ecc_dbe_volatile_total, last_xid)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (gpu_id) DO UPDATE
             SET reported_at = excluded.reported_at, gpu_util_percent = excluded.gpu_util_percent,
                 fb_used_mib = excluded.fb_used_mib, gpu_temp_celsius = excluded.gpu_temp_celsius,
                 power_usage_watts = excluded.power_usage_watts,
                 ecc_sbe_volatile_total = excluded.ecc_sbe_volatile_total,
                 ecc_dbe_volatile_total = excluded.ecc_dbe_volatile_total,
                 last_xid = excluded.last_xid",
            gpu,
            at,
            metrics.gpu_util_percent.map(saturating_i32),
            metrics.fb_used_mib.map(saturating_i64),
            metrics.gpu_temp_celsius.map(saturating_i32),
            metrics.power_usage_watts,
            metrics.ecc_sbe_volatile_total.map(saturating_i64),
            metrics.ecc_dbe_volatile_total.map(saturating_i64),
            metrics.last_xid.map(saturating_i64)
        )
        .execute(&mut **tx)
        .await?;
    }
    for exit in &heartbeat.exits {
        sqlx::query!(
            "INSERT INTO lease_exits (machine_id, at, lease_id, exit_code, signal, killed_after_grace)
             VALUES ($1, $2, $3, $4, $5, $6)",
            heartbeat.machine,
            at,
            exit.lease_id,
            exit.code,
            exit.signal,
            exit.killed_after_grace
        )
        .execute(&mut **tx)
        .await?;
    }
    for violation in &heartbeat.violations {
        sqlx::query!(
            "INSERT INTO lease_violations (machine_id, at, gpu_id, lease_id, pid, process_name,
                                           used_memory_bytes)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            heartbeat.machine,
            at,
            violation.gpu_uuid,
            violation.lease_id,
            i64::from(violation.pid),
            violation.process_name,
            violation.used_memory_bytes.map(saturating_i64)
        )
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

async fn write_host_event(
    tx: &mut Transaction<'_, Postgres>,
    machine: i32,
    at: Timestamp,
    up: bool,
    reason: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO host_events (machine_id, at, kind, reason) VALUES ($1, $2, $3, $4)",
        machine,
        to_datetime(at),
        if up { "up" } else { "down" },
        reason
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

fn saturating_i32(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
