//! Writes: what the writer (`writer.rs`) writes for the arbiter (a decision's [`Commit`], a new
//! app) and the few inserts outside it (tenants, tokens, the fleet).

use agora_market::auction::AppBid;
use agora_market::lease::LeaseState;
use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, GpuId, GpuLocation};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use sqlx::{Postgres, Transaction};
use utoipa::ToSchema;

use super::bid_rows::{insert_bids, BidSource, NewBid};
use super::{gpu_texts, Store, StoreError};
use crate::clock::to_datetime;
use crate::ids::{AppKey, LeaseKey, RoundId, TenantId};

/// A lease as stored: GPU ids instead of engine indices.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRecord {
    pub id: LeaseKey,
    pub app: AppKey,
    pub gpus: Vec<GpuId>,
    pub start: Timestamp,
    pub end: Timestamp,
    pub state: LeaseState,
    pub ended_at: Option<Timestamp>,
}

/// A round as it opens: its inputs and who stands where.
#[derive(Debug, Clone)]
pub struct OpenedRound {
    pub id: RoundId,
    pub opened_at: Timestamp,
    pub deadline: Timestamp,
    pub fairness_knob: f64,
    pub lease_seconds: f64,
    pub leftover_policy: String,
    pub seed: u64,
    pub offer: Value,
    pub standings: Value,
    pub standing_rows: Vec<StandingRow>,
}

#[derive(Debug, Clone)]
pub struct StandingRow {
    pub app: AppKey,
    /// `None`: starving.
    pub rho: Option<f64>,
    pub unmet_demand: i32,
    pub bidder: bool,
}

/// A round as it closes: the agents' bids, where the GPUs went, and the replay inputs known
/// only at close.
#[derive(Debug, Clone)]
pub struct ClosedRound {
    pub id: RoundId,
    pub closed_at: Timestamp,
    pub holds: Value,
    pub claims: Value,
    pub agent_bids: Vec<(AppKey, AppBid)>,
    pub allocations: Vec<AllocationRow>,
    pub unallocated: Vec<GpuId>,
    /// Apps of the standings that left before the round was decided (bids withdrawn).
    pub departed: Vec<AppKey>,
    /// The CPUs and memory of every active lease after the round (on modelled machines).
    pub lease_resources: Vec<LeaseResources>,
    /// What they were divided from (`agora_market::division::DivisionRecord`); `None` on a
    /// cluster that models neither resource.
    pub resource_division: Option<Value>,
}

/// The CPUs and memory a lease has (over all its machines; `None`: not modelled on one of them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LeaseResources {
    pub lease: LeaseKey,
    pub cpus: Option<f64>,
    pub memory_gib: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AllocationRow {
    pub app: AppKey,
    pub pf_entry: Option<i32>,
    pub pf_gpus: Vec<GpuId>,
    pub c: Option<f64>,
    /// c is against the LP counterfactual: the payment's programs did not fit the budget.
    pub c_fallback: bool,
    /// The PF choice of the app's conflict component is the best found within the PF
    /// programs' budget, not a proved optimum.
    pub pf_fallback: bool,
    pub kept_gpus: Vec<GpuId>,
    pub leftover_gpus: Vec<GpuId>,
}

/// Something an app is told (an offer, a round's result, a lease change).
#[derive(Debug, Clone)]
pub struct AppEvent {
    pub app: AppKey,
    pub payload: EventPayload,
}

/// An app event's `payload`; its shape is the event's `kind`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum EventPayload {
    Offer(OfferEvent),
    RoundResult(RoundResultEvent),
    LeaseGranted(LeaseGrantedEvent),
    LeaseEnded(LeaseEndedEvent),
    RevocationNotice(RevocationNoticeEvent),
}

impl EventPayload {
    /// The event's `kind` (the SSE `event:` field).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Offer(_) => "offer",
            Self::RoundResult(_) => "round_result",
            Self::LeaseGranted(_) => "lease_granted",
            Self::LeaseEnded(_) => "lease_ended",
            Self::RevocationNotice(_) => "revocation_notice",
        }
    }
}

/// `offer`: the app is a bidder of round `round`, open until `deadline`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OfferEvent {
    pub round: RoundId,
    pub deadline: DateTime<Utc>,
    /// The app's rho when the round opened; `null` while it is starving.
    pub rho: Option<f64>,
    /// GPUs its running jobs could still use.
    pub unmet_demand: i32,
    /// The GPUs offered.
    pub gpus: Vec<OfferedGpu>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OfferedGpu {
    pub id: GpuId,
    pub location: GpuLocation,
}

/// `round_result`: what the app got in round `round`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RoundResultEvent {
    pub round: RoundId,
    /// The index of the bid entry the proportional-fair choice gave it; `null`: none.
    pub pf_entry: Option<i32>,
    /// Its hidden-payment share c; `null` if it did not bid.
    pub c: Option<f64>,
    pub kept_gpus: Vec<GpuId>,
    pub leftover_gpus: Vec<GpuId>,
}

/// `lease_granted`: a lease on `gpus` from `start` to `end`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LeaseGrantedEvent {
    pub lease: LeaseKey,
    pub round: RoundId,
    pub gpus: Vec<GpuId>,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
}

/// `lease_ended`: the lease expired, was released or was revoked (`state`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LeaseEndedEvent {
    pub lease: LeaseKey,
    pub state: String,
    pub gpus: Vec<GpuId>,
    /// Why it was revoked; `null` for a lease that expired or was released.
    pub reason: Option<String>,
}

/// `revocation_notice`: the lease's GPU `gpu` leaves service; the lease ends at `revoke_at`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RevocationNoticeEvent {
    pub lease: LeaseKey,
    pub gpu: GpuId,
    pub revoke_at: DateTime<Utc>,
    pub reason: String,
}

#[derive(Debug, Clone)]
pub struct ProgressSample {
    pub app: AppKey,
    pub job: String,
    pub completed_iterations: i64,
    pub stopped: bool,
    pub observed: Option<(String, f64)>,
}

/// A framework's throughput measurement, and the app's table after it.
#[derive(Debug, Clone, PartialEq)]
pub struct ThroughputSample {
    pub app: AppKey,
    pub gpu_type: String,
    pub speed: f64,
    pub throughput: Value,
}

/// A framework's report of a job's speed change, and the job's schedule after it.
#[derive(Debug, Clone, PartialEq)]
pub struct SpeedChangeSample {
    pub app: AppKey,
    pub job: String,
    /// The first round whose rho and agent bids use it.
    pub first_round: RoundId,
    pub at_iteration: i64,
    pub serial_iteration_time: f64,
    pub speed_changes: Value,
}

/// An operator's drain or restore of a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorAction {
    /// `drain` or `restore`.
    pub action: &'static str,
    pub gpu: GpuId,
    /// The lease a drain gave notice to.
    pub lease: Option<LeaseKey>,
}

/// Everything one arbiter decision changes, written in one transaction.
#[derive(Debug, Clone, Default)]
pub struct Commit {
    pub opened_round: Option<OpenedRound>,
    pub closed_round: Option<ClosedRound>,
    pub abandoned_rounds: Vec<RoundId>,
    /// Leases granted by the closed round.
    pub granted: Vec<LeaseRecord>,
    /// Leases that stopped being active (expired, released or revoked).
    pub ended: Vec<LeaseRecord>,
    /// Revocation notices: lease, reason.
    pub notices: Vec<(LeaseKey, String)>,
    pub app_states: Vec<(AppKey, Value)>,
    pub progress: Vec<ProgressSample>,
    pub throughput_reports: Vec<ThroughputSample>,
    pub speed_change_reports: Vec<SpeedChangeSample>,
    pub finished_apps: Vec<AppKey>,
    /// Apps that joined the market, with the arrival it counts them from (their registration
    /// was stored a moment before, with the time it was asked for).
    pub arrivals: Vec<(AppKey, Timestamp)>,
    pub gpu_health: Vec<(GpuId, bool)>,
    /// Drains and restores by an operator, audited in `operator_actions`.
    pub operator_actions: Vec<OperatorAction>,
    pub events: Vec<AppEvent>,
    /// GPU hosts registering, heartbeating, going down and returning.
    pub workers: super::WorkerChanges,
}

impl Commit {
    /// Whether the commit frees GPUs or brings some back into service: a round may follow.
    pub fn frees_capacity(&self) -> bool {
        !self.ended.is_empty()
            || !self.finished_apps.is_empty()
            || self.gpu_health.iter().any(|(_, healthy)| *healthy)
            || self.workers.returns_capacity
    }
}

impl Store {
    pub async fn create_tenant(
        &self,
        name: &str,
        token_sha256: &[u8],
    ) -> Result<TenantId, StoreError> {
        let mut tx = self.begin_write().await?;
        let id = sqlx::query_scalar!(
            r#"INSERT INTO tenants (name) VALUES ($1) RETURNING id AS "id: TenantId""#,
            name
        )
        .fetch_one(&mut *tx)
        .await?;
        sqlx::query!(
            "INSERT INTO api_tokens (token_sha256, tenant_id) VALUES ($1, $2)",
            token_sha256,
            id.0
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Records the simulated fleet's machines and GPUs (idempotent; health is kept).
    pub async fn sync_fleet(&self, cluster: &Cluster) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        for (_, gpu) in cluster.gpus() {
            let machine = gpu.location.machine as i32;
            sqlx::query!(
                "INSERT INTO machines (id, rack, host) VALUES ($1, $2, $3)
                 ON CONFLICT (id) DO UPDATE SET rack = excluded.rack, host = excluded.host",
                machine,
                gpu.location.rack as i32,
                simulated_host(machine)
            )
            .execute(&mut *tx)
            .await?;
            sqlx::query!(
                "INSERT INTO gpus (id, machine_id, slot, gpu_type, cuda_uuid) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (id) DO UPDATE
                 SET machine_id = excluded.machine_id, slot = excluded.slot, gpu_type = excluded.gpu_type",
                gpu.id.0,
                machine,
                gpu.location.slot as i32,
                gpu.gpu_type,
                simulated_cuda_uuid(&gpu.id.0)
            )
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

/// An app to insert.
#[derive(Debug)]
pub struct NewApp {
    pub tenant: TenantId,
    pub name: String,
    pub kind: &'static str,
    pub bidding: &'static str,
    pub state: Value,
    /// How hosts enforce its leases (`agora_protocol::Enforcement` as JSON).
    pub enforcement: Value,
    pub jobs: Vec<agora_market::app::Job>,
    pub arrived_at: Timestamp,
    /// T_cluster, fixed on arrival (`Market::cluster_time`).
    pub cluster_seconds: f64,
}

/// Inserts an app and its jobs; its id, or `None` if the tenant already has an app of that
/// name (nothing inserted, and the transaction goes on).
pub(super) async fn insert_app(
    tx: &mut Transaction<'_, Postgres>,
    app: &NewApp,
) -> Result<Option<AppKey>, sqlx::Error> {
    let id = sqlx::query_scalar!(
        r#"INSERT INTO apps (tenant_id, name, kind, bidding, state, arrived_at, enforcement,
                             cluster_seconds)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
           ON CONFLICT (tenant_id, name) DO NOTHING RETURNING id AS "id: AppKey""#,
        app.tenant.0,
        app.name,
        app.kind,
        app.bidding,
        app.state,
        to_datetime(app.arrived_at),
        app.enforcement,
        app.cluster_seconds
    )
    .fetch_optional(&mut **tx)
    .await?;
    let Some(id) = id else {
        return Ok(None);
    };
    for job in &app.jobs {
        sqlx::query!(
            "INSERT INTO jobs (app_id, name, total_iterations, serial_iteration_time, max_gpus,
                                   completed_iterations, stopped)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            id.0,
            job.id,
            job.total_iterations as i64,
            job.serial_iteration_time,
            job.max_gpus as i32,
            job.completed_iterations as i64,
            job.stopped
        )
        .execute(&mut **tx)
        .await?;
    }
    Ok(Some(id))
}

pub fn simulated_host(machine: i32) -> String {
    format!("sim-host-{machine}")
}

/// A stable UUID-shaped id for a simulated GPU, like NVML's `GPU-xxxxxxxx-...`.
pub fn simulated_cuda_uuid(gpu: &str) -> String {
    use sha2::{Digest, Sha256};
    let hex = hex::encode(Sha256::digest(gpu.as_bytes()));
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

pub(super) async fn write_commit(
    tx: &mut Transaction<'_, Postgres>,
    commit: &Commit,
    now: Timestamp,
) -> Result<(), sqlx::Error> {
    super::workers::write_worker_changes(tx, &commit.workers, now).await?;
    if let Some(round) = &commit.opened_round {
        write_opened_round(tx, round).await?;
    }
    for &round in &commit.abandoned_rounds {
        sqlx::query!(
            "UPDATE rounds SET status = 'abandoned', closed_at = $2 WHERE id = $1",
            round.0,
            to_datetime(now)
        )
        .execute(&mut **tx)
        .await?;
    }
    for lease in &commit.ended {
        write_lease_end(tx, lease).await?;
    }
    if let Some(round) = &commit.closed_round {
        write_closed_round(tx, round).await?;
        for lease in &commit.granted {
            write_lease_grant(tx, round.id, lease).await?;
        }
        for resources in &round.lease_resources {
            write_lease_resources(tx, round, resources).await?;
        }
    }
    for (lease, reason) in &commit.notices {
        write_lease_event(tx, *lease, now, "revocation_notice", Some(reason)).await?;
    }
    write_app_changes(tx, commit, now).await?;
    for &(app, arrived_at) in &commit.arrivals {
        sqlx::query!(
            "UPDATE apps SET arrived_at = $2 WHERE id = $1",
            app.0,
            to_datetime(arrived_at)
        )
        .execute(&mut **tx)
        .await?;
    }
    for (gpu, healthy) in &commit.gpu_health {
        sqlx::query!("UPDATE gpus SET healthy = $2 WHERE id = $1", gpu.0, healthy)
            .execute(&mut **tx)
            .await?;
    }
    for action in &commit.operator_actions {
        sqlx::query!(
            "INSERT INTO operator_actions (at, action, gpu_id, lease_id) VALUES ($1, $2, $3, $4)",
            to_datetime(now),
            action.action,
            action.gpu.0,
            action.lease.map(|lease| lease.0)
        )
        .execute(&mut **tx)
        .await?;
    }
    if commit.events.is_empty() {
        return Ok(());
    }
    let apps: Vec<i64> = commit.events.iter().map(|event| event.app.0).collect();
    let kinds: Vec<&str> = commit
        .events
        .iter()
        .map(|event| event.payload.kind())
        .collect();
    let payloads: Vec<Value> = commit
        .events
        .iter()
        .map(|event| serde_json::to_value(&event.payload))
        .collect::<Result<_, _>>()
        .map_err(|error| sqlx::Error::Encode(Box::new(error)))?;
    sqlx::query!(
        "INSERT INTO app_events (app_id, at, kind, payload)
         SELECT app_id, $2, kind, payload FROM unnest($1::bigint[], $3::text[], $4::jsonb[])
              WITH ORDINALITY AS event (app_id, kind, payload, position)
         ORDER BY position",
        &apps,
        to_datetime(now),
        &kinds as &[&str],
        &payloads
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn write_opened_round(
    tx: &mut Transaction<'_, Postgres>,
    round: &OpenedRound,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO rounds (id, opened_at, deadline, status, policy, fairness_knob, lease_seconds,
                             leftover_policy, seed, engine_version, offer, standings, holds)
         VALUES ($1, $2, $3, 'open', 'themis', $4, $5, $6, $7::text::numeric, $8, $9, $10, '{}')",
        round.id.0,
        to_datetime(round.opened_at),
        to_datetime(round.deadline),
        round.fairness_knob,
        round.lease_seconds,
        round.leftover_policy,
        round.seed.to_string(),
        agora_market::ENGINE_VERSION,
        round.offer,
        round.standings
    )
    .execute(&mut **tx)
    .await?;
    // One statement for every active app's standing: a round opening is on the critical path.
    let rows = &round.standing_rows;
    let positions: Vec<i32> = (0..rows.len() as i32).collect();
    let apps: Vec<i64> = rows.iter().map(|row| row.app.0).collect();
    let rhos: Vec<Option<f64>> = rows.iter().map(|row| row.rho).collect();
    let unmet: Vec<i32> = rows.iter().map(|row| row.unmet_demand).collect();
    let bidders: Vec<bool> = rows.iter().map(|row| row.bidder).collect();
    sqlx::query!(
        "INSERT INTO round_standings (round_id, position, app_id, rho, unmet_demand, bidder)
         SELECT $1, * FROM unnest($2::int[], $3::bigint[], $4::float8[], $5::int[], $6::bool[])",
        round.id.0,
        &positions,
        &apps,
        &rhos as &[Option<f64>],
        &unmet,
        &bidders
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A lease's CPUs and memory after round `round`, unless its latest row says the same.
async fn write_lease_resources(
    tx: &mut Transaction<'_, Postgres>,
    round: &ClosedRound,
    resources: &LeaseResources,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO lease_resources (lease_id, round_id, at, cpus, memory_gib)
         SELECT $1, $2, $3, $4, $5
         WHERE NOT EXISTS (
             SELECT 1 FROM (SELECT cpus, memory_gib FROM lease_resources WHERE lease_id = $1
                            ORDER BY round_id DESC LIMIT 1) latest
             WHERE latest.cpus IS NOT DISTINCT FROM $4
               AND latest.memory_gib IS NOT DISTINCT FROM $5)",
        resources.lease.0,
        round.id.0,
        to_datetime(round.closed_at),
        resources.cpus,
        resources.memory_gib
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn write_closed_round(
    tx: &mut Transaction<'_, Postgres>,
    round: &ClosedRound,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE rounds SET status = 'closed', closed_at = $2, holds = $3, unallocated = $4,
                           claims = $5, departed = $6, resource_division = $7
         WHERE id = $1",
        round.id.0,
        to_datetime(round.closed_at),
        round.holds,
        &gpu_texts(&round.unallocated),
        round.claims,
        &round.departed.iter().map(|app| app.0).collect::<Vec<_>>(),
        round.resource_division
    )
    .execute(&mut **tx)
    .await?;
    let agent_bids: Vec<NewBid> = round
        .agent_bids
        .iter()
        .map(|(app, bid)| NewBid {
            round: round.id,
            app: *app,
            bid: bid.clone(),
            idempotency_key: None,
            received_at: round.closed_at,
        })
        .collect();
    let stored = insert_bids(tx, &agent_bids, BidSource::Agent).await?;
    if stored.contains(&None) {
        // The arbiter uses an agent's bid only for an app without a bid of its own.
        return Err(sqlx::Error::Protocol(format!(
            "round {}: an app with an agent's bid already has a bid",
            round.id
        )));
    }
    for row in &round.allocations {
        sqlx::query!(
            "INSERT INTO round_allocations (round_id, app_id, pf_entry, pf_gpus, c, c_fallback,
                                            pf_fallback, kept_gpus, leftover_gpus)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            round.id.0,
            row.app.0,
            row.pf_entry,
            &gpu_texts(&row.pf_gpus),
            row.c,
            row.c_fallback,
            row.pf_fallback,
            &gpu_texts(&row.kept_gpus),
            &gpu_texts(&row.leftover_gpus)
        )
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

async fn write_lease_grant(
    tx: &mut Transaction<'_, Postgres>,
    round: RoundId,
    lease: &LeaseRecord,
) -> Result<(), sqlx::Error> {
    let (start, end) = (to_datetime(lease.start), to_datetime(lease.end));
    let gpus = gpu_texts(&lease.gpus);
    sqlx::query!(
        "INSERT INTO leases (id, app_id, round_id, gpus, start_at, end_at, state)
         VALUES ($1, $2, $3, $4, $5, $6, 'active')",
        lease.id.0,
        lease.app.0,
        round.0,
        &gpus,
        start,
        end
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query!(
        "INSERT INTO lease_gpus (lease_id, gpu_id, held)
         SELECT $1, gpu, tstzrange($3, $4) FROM unnest($2::text[]) AS gpu",
        lease.id.0,
        &gpus,
        start,
        end
    )
    .execute(&mut **tx)
    .await?;
    write_lease_event(tx, lease.id, lease.start, "granted", None).await
}

async fn write_lease_end(
    tx: &mut Transaction<'_, Postgres>,
    lease: &LeaseRecord,
) -> Result<(), sqlx::Error> {
    let ended_at = to_datetime(lease.ended_at.unwrap_or(lease.end));
    let state = lease_state_name(lease.state);
    sqlx::query!(
        "UPDATE leases SET state = $2, ended_at = $3 WHERE id = $1 AND state = 'active'",
        lease.id.0,
        state,
        ended_at
    )
    .execute(&mut **tx)
    .await?;
    // The GPUs are free from the end on: shrink the held range so a new lease may start there.
    sqlx::query!(
        "UPDATE lease_gpus SET held = tstzrange(lower(held), greatest(lower(held), $2))
         WHERE lease_id = $1",
        lease.id.0,
        ended_at
    )
    .execute(&mut **tx)
    .await?;
    let at = lease.ended_at.unwrap_or(lease.end);
    write_lease_event(tx, lease.id, at, state, None).await
}

async fn write_lease_event(
    tx: &mut Transaction<'_, Postgres>,
    lease: LeaseKey,
    at: Timestamp,
    kind: &str,
    reason: Option<&str>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "INSERT INTO lease_events (lease_id, at, kind, reason) VALUES ($1, $2, $3, $4)",
        lease.0,
        to_datetime(at),
        kind,
        reason
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn write_app_changes(
    tx: &mut Transaction<'_, Postgres>,
    commit: &Commit,
    now: Timestamp,
) -> Result<(), sqlx::Error> {
    for (app, state) in &commit.app_states {
        sqlx::query!("UPDATE apps SET state = $2 WHERE id = $1", app.0, state)
            .execute(&mut **tx)
            .await?;
    }
    write_progress(tx, &commit.progress, now).await?;
    for report in &commit.throughput_reports {
        sqlx::query!(
            "INSERT INTO throughput_reports (app_id, reported_at, gpu_type, speed, throughput)
             VALUES ($1, $2, $3, $4, $5)",
            report.app.0,
            to_datetime(now),
            report.gpu_type,
            report.speed,
            report.throughput
        )
        .execute(&mut **tx)
        .await?;
    }
    for report in &commit.speed_change_reports {
        sqlx::query!(
            "INSERT INTO speed_change_reports (app_id, job, reported_at, first_round, at_iteration,
                                               serial_iteration_time, speed_changes)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            report.app.0,
            report.job,
            to_datetime(now),
            report.first_round.0,
            report.at_iteration,
            report.serial_iteration_time,
            report.speed_changes
        )
        .execute(&mut **tx)
        .await?;
    }
    for app in &commit.finished_apps {
        sqlx::query!(
            "UPDATE apps SET finished_at = $2 WHERE id = $1 AND finished_at IS NULL",
            app.0,
            to_datetime(now)
        )
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Progress samples and the jobs they advance, with one statement each.
async fn write_progress(
    tx: &mut Transaction<'_, Postgres>,
    samples: &[ProgressSample],
    now: Timestamp,
) -> Result<(), sqlx::Error> {
    if samples.is_empty() {
        return Ok(());
    }
    let apps: Vec<i64> = samples.iter().map(|sample| sample.app.0).collect();
    let jobs: Vec<&str> = samples.iter().map(|sample| sample.job.as_str()).collect();
    let done: Vec<i64> = samples
        .iter()
        .map(|sample| sample.completed_iterations)
        .collect();
    let stopped: Vec<bool> = samples.iter().map(|sample| sample.stopped).collect();
    let (localities, slowdowns): (Vec<Option<String>>, Vec<Option<f64>>) = samples
        .iter()
        .map(|sample| sample.observed.clone().unzip())
        .unzip();
    sqlx::query!(
        "INSERT INTO job_progress (app_id, job, reported_at, completed_iterations, stopped,
                                   observed_locality, observed_slowdown)
         SELECT app_id, job, $3, done, stopped, locality, slowdown
         FROM unnest($1::bigint[], $2::text[], $4::bigint[], $5::bool[], $6::text[], $7::float8[])
              AS sample (app_id, job, done, stopped, locality, slowdown)",
        &apps,
        &jobs as &[&str],
        to_datetime(now),
        &done,
        &stopped,
        &localities as &[Option<String>],
        &slowdowns as &[Option<f64>]
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query!(
        "UPDATE jobs SET completed_iterations = sample.done, stopped = sample.stopped
         FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bool[])
              AS sample (app_id, job, done, stopped)
         WHERE jobs.app_id = sample.app_id AND jobs.name = sample.job",
        &apps,
        &jobs as &[&str],
        &done,
        &stopped
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub fn lease_state_name(state: LeaseState) -> &'static str {
    match state {
        LeaseState::Active => "active",
        LeaseState::Expired => "expired",
        LeaseState::Released => "released",
        LeaseState::Revoked => "revoked",
    }
}
