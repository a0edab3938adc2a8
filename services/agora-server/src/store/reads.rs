//! Reads: what the HTTP API shows, what the arbiter reloads after a restart, and what an audit
//! replays.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::postgres::PgListener;
use utoipa::ToSchema;

use agora_market::app::{App, AppKind, Job, SpeedChange};
use agora_market::topology::GpuId;

use super::{gpu_ids, EventPayload, Store, StoreError};
use crate::ids::{AppKey, BidId, LeaseKey, RoundId, TenantId};
use crate::visibility::Caller;

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AppRow {
    pub id: AppKey,
    pub tenant_id: TenantId,
    pub name: String,
    pub kind: String,
    pub bidding: String,
    pub arrived_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Each job and the phase of its speed it is in, as last reported.
    pub jobs: Vec<JobPhase>,
}

impl AppRecord {
    /// The app as the engine knows it, from its stored state.
    fn app(&self) -> Result<App, StoreError> {
        let kind = AppKind::deserialize(&self.state).map_err(|error| {
            StoreError::Corrupt(format!("the state of app {}: {error}", self.id))
        })?;
        Ok(App {
            id: self.id.into(),
            kind,
        })
    }
}

impl AppRow {
    fn with_state(row: AppRecord) -> Result<Self, StoreError> {
        let app = row.app()?;
        Ok(Self {
            id: row.id,
            tenant_id: row.tenant_id,
            name: row.name,
            kind: row.kind,
            bidding: row.bidding,
            arrived_at: row.arrived_at,
            finished_at: row.finished_at,
            jobs: app.jobs().into_iter().map(JobPhase::of).collect(),
        })
    }
}

/// An app as stored, its state still JSON.
struct AppRecord {
    id: AppKey,
    tenant_id: TenantId,
    name: String,
    kind: String,
    bidding: String,
    arrived_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
    state: Value,
}

/// Where a job stands in its speed schedule (a job that never changes speed has one phase).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[schema(example = json!({"job": "trial-0", "completed_iterations": 1300, "phase": 1,
    "phases": 3, "serial_iteration_time": 0.6,
    "next_change": {"at_iteration": 2000, "serial_iteration_time": 0.4}}))]
pub struct JobPhase {
    pub job: String,
    pub completed_iterations: u64,
    /// 0 before the job's first speed change, `i` from its `i`-th on.
    pub phase: usize,
    /// How many phases its schedule has: 1 + its speed changes, declared or reported.
    pub phases: usize,
    /// Seconds per iteration on one GPU in this phase.
    pub serial_iteration_time: f64,
    /// The change that ends this phase; `null` in the last phase.
    pub next_change: Option<SpeedChange>,
}

impl JobPhase {
    pub fn of(job: &Job) -> Self {
        let done = job.completed_iterations as f64;
        let phase = job.phase_at(done);
        Self {
            job: job.id.clone(),
            completed_iterations: job.completed_iterations,
            phase,
            phases: job.speed_changes.len() + 1,
            serial_iteration_time: job.serial_iteration_time_at(done),
            next_change: job.speed_changes.get(phase).copied(),
        }
    }
}

/// One audited operator action.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OperatorActionView {
    pub at: DateTime<Utc>,
    /// `drain` or `restore`.
    pub action: String,
    pub gpu: GpuId,
    /// The lease a drain gave notice to.
    pub lease_id: Option<LeaseKey>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LeasedGpu {
    pub id: GpuId,
    pub host: String,
    pub cuda_uuid: String,
    /// The GPU's type (`h100`, `v100`): what the app's throughput table prices.
    pub gpu_type: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LeaseView {
    pub id: LeaseKey,
    pub app_id: AppKey,
    pub round_id: RoundId,
    pub gpus: Vec<LeasedGpu>,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
    /// `active`, `expired`, `released` or `revoked`.
    pub state: String,
    pub ended_at: Option<DateTime<Utc>>,
    /// The CPU cores that come with the lease (fractional; summed over its machines), as the
    /// latest round set them; `null` where a machine of the lease does not model CPUs.
    pub cpus: Option<f64>,
    /// The host memory in GiB that comes with the lease, like `cpus`.
    pub memory_gib: Option<f64>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RoundSummary {
    pub round_id: RoundId,
    pub opened_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    pub status: String,
    pub offered_gpus: i32,
    pub bidders: i64,
    pub bids: i64,
    pub gpus_won_in_auction: i64,
    pub gpus_as_leftovers: i64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StandingView {
    pub position: i32,
    /// `None` when the app belongs to another tenant.
    pub app_id: Option<AppKey>,
    pub rho: Option<f64>,
    pub unmet_demand: i32,
    pub bidder: bool,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BidEntryView {
    pub gpus: Vec<GpuId>,
    pub rho: f64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BidView {
    /// `None` (and no entries) when the bid belongs to another tenant.
    pub app_id: Option<AppKey>,
    pub source: String,
    pub rho_old: Option<f64>,
    pub entries: Vec<BidEntryView>,
    pub received_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AllocationView {
    /// `None` when the app belongs to another tenant.
    pub app_id: Option<AppKey>,
    pub pf_entry: Option<i32>,
    pub pf_gpus: Vec<GpuId>,
    pub c: Option<f64>,
    pub kept_gpus: Vec<GpuId>,
    pub leftover_gpus: Vec<GpuId>,
}

/// One round in full. Other tenants' apps appear without ids or bid tables.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RoundDetail {
    pub round_id: RoundId,
    pub opened_at: DateTime<Utc>,
    pub deadline: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
    pub status: String,
    pub fairness_knob: f64,
    pub seed: String,
    pub engine_version: String,
    pub offered_gpus: Vec<GpuId>,
    pub standings: Vec<StandingView>,
    pub bids: Vec<BidView>,
    pub allocations: Vec<AllocationView>,
    pub unallocated: Vec<GpuId>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AppEventRow {
    pub id: i64,
    pub at: DateTime<Utc>,
    /// `offer`, `round_result`, `lease_granted`, `lease_ended` or `revocation_notice`.
    pub kind: String,
    /// The kind's payload.
    #[schema(value_type = EventPayload)]
    pub payload: Value,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GpuView {
    pub id: GpuId,
    pub machine: i32,
    pub rack: i32,
    pub host: String,
    pub slot: i32,
    /// The engine's GPU type (`h100`): on a GPU host, what its NVML product name maps to.
    pub gpu_type: String,
    /// On a GPU host: the product name NVML reported (`NVIDIA H100 80GB HBM3`).
    pub product_name: Option<String>,
    /// On a GPU host: the CUDA compute capability it reported (`9.0`), if it did.
    pub compute_capability: Option<String>,
    pub cuda_uuid: String,
    /// In service: not drained and, on a GPU host, reported healthy by a host that is up.
    pub healthy: bool,
    /// The active lease holding it and its app (`None` for another tenant's app).
    pub lease_id: Option<LeaseKey>,
    pub app_id: Option<AppKey>,
}

/// An app's place in the last round it stood in, for the "why" view.
#[derive(Debug, Clone)]
pub struct LastRound {
    pub round_id: RoundId,
    pub position: i32,
    pub bidder: bool,
    pub rho: Option<f64>,
}

/// What the arbiter reloads after a restart.
#[derive(Debug, Clone)]
pub struct ActiveApp {
    pub id: AppKey,
    pub tenant_id: TenantId,
    pub bidding: String,
    pub state: Value,
    pub arrived_at: DateTime<Utc>,
    pub ended_gpu_seconds: f64,
    pub enforcement: Value,
    /// T_cluster as computed on arrival; `None` for apps registered before it was recorded.
    pub cluster_seconds: Option<f64>,
}

/// When an app that has left arrived and left: the contention history a restart rebuilds.
#[derive(Debug, Clone)]
pub struct DepartedApp {
    pub arrived_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct StoredLease {
    pub id: LeaseKey,
    pub app_id: AppKey,
    pub gpus: Vec<GpuId>,
    pub start_at: DateTime<Utc>,
    pub end_at: DateTime<Utc>,
}

/// A lease's row; its GPUs as the column holds them.
struct LeaseRow {
    id: LeaseKey,
    app_id: AppKey,
    gpus: Vec<String>,
    start_at: DateTime<Utc>,
    end_at: DateTime<Utc>,
}

impl LeaseRow {
    fn stored(self) -> StoredLease {
        StoredLease {
            id: self.id,
            app_id: self.app_id,
            gpus: gpu_ids(self.gpus),
            start_at: self.start_at,
            end_at: self.end_at,
        }
    }
}

/// A round's replay inputs and stored outcome.
#[derive(Debug, Clone)]
pub struct StoredRound {
    pub id: RoundId,
    pub status: String,
    pub opened_at: DateTime<Utc>,
    pub deadline: DateTime<Utc>,
    pub seed: String,
    pub engine_version: String,
    pub leftover_policy: String,
    pub offer: Value,
    pub standings: Value,
    pub holds: Value,
    pub claims: Value,
    pub bidders: Vec<AppKey>,
    pub bids: Vec<StoredBid>,
    pub allocations: Vec<super::AllocationRow>,
    pub unallocated: Vec<GpuId>,
    /// Apps of the standings that left before the round was decided (bids withdrawn).
    pub departed: Vec<AppKey>,
    /// What the machines' CPUs and memory were divided from after it, if recorded.
    pub resource_division: Option<Value>,
}

#[derive(Debug, Clone)]
pub struct StoredBid {
    pub app_id: AppKey,
    pub rho_old: Option<f64>,
    pub entries: Vec<(Vec<GpuId>, f64)>,
}

impl Store {
    pub async fn tenant_for_token(
        &self,
        token_sha256: &[u8],
    ) -> Result<Option<TenantId>, StoreError> {
        Ok(sqlx::query_scalar!(
            r#"SELECT tenant_id AS "tenant_id: TenantId" FROM api_tokens WHERE token_sha256 = $1"#,
            token_sha256
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// A connection listening to changes of `api_tokens` (migration 0006).
    pub async fn token_changes(&self) -> Result<PgListener, StoreError> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen("agora_token_changes").await?;
        Ok(listener)
    }

    pub async fn app(&self, id: AppKey) -> Result<Option<AppRow>, StoreError> {
        self.app_record(id)
            .await?
            .map(AppRow::with_state)
            .transpose()
    }

    /// The app as it finished (its jobs' last progress), if it has finished.
    pub async fn finished_app(&self, id: AppKey) -> Result<Option<App>, StoreError> {
        self.app_record(id)
            .await?
            .filter(|record| record.finished_at.is_some())
            .map(|record| record.app())
            .transpose()
    }

    async fn app_record(&self, id: AppKey) -> Result<Option<AppRecord>, StoreError> {
        Ok(sqlx::query_as!(
            AppRecord,
            r#"SELECT id AS "id: _", tenant_id AS "tenant_id: _", name, kind, bidding, arrived_at,
                      finished_at, state
               FROM apps WHERE id = $1"#,
            id.0
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The apps `viewer` sees (a tenant its own, the admin every tenant's), finished ones
    /// included, by id.
    pub async fn apps_of(&self, viewer: Caller) -> Result<Vec<AppRow>, StoreError> {
        sqlx::query_as!(
            AppRecord,
            r#"SELECT id AS "id: _", tenant_id AS "tenant_id: _", name, kind, bidding, arrived_at,
                      finished_at, state
               FROM apps WHERE $1::bigint IS NULL OR tenant_id = $1 ORDER BY id"#,
            viewer.tenant().map(|tenant| tenant.0)
        )
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .map(AppRow::with_state)
        .collect()
    }

    pub async fn leases_of(&self, app: AppKey) -> Result<Vec<LeaseView>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT l.id AS "id: LeaseKey", l.round_id AS "round_id: RoundId", l.gpus,
                      l.start_at, l.end_at, l.state, l.ended_at, latest.cpus, latest.memory_gib
               FROM leases l
               LEFT JOIN LATERAL (
                   SELECT cpus, memory_gib FROM lease_resources r WHERE r.lease_id = l.id
                   ORDER BY r.round_id DESC LIMIT 1
               ) latest ON true
               WHERE l.app_id = $1 ORDER BY l.id"#,
            app.0
        )
        .fetch_all(&self.pool)
        .await?;
        let gpus = self.gpu_hosts().await?;
        Ok(rows
            .into_iter()
            .map(|row| LeaseView {
                id: row.id,
                app_id: app,
                round_id: row.round_id,
                gpus: row
                    .gpus
                    .into_iter()
                    .map(|id| {
                        gpus.get(&id).cloned().unwrap_or(LeasedGpu {
                            id: GpuId(id),
                            host: String::new(),
                            cuda_uuid: String::new(),
                            gpu_type: String::new(),
                        })
                    })
                    .collect(),
                start_at: row.start_at,
                end_at: row.end_at,
                state: row.state,
                ended_at: row.ended_at,
                cpus: row.cpus,
                memory_gib: row.memory_gib,
            })
            .collect())
    }

    async fn gpu_hosts(&self) -> Result<HashMap<String, LeasedGpu>, StoreError> {
        let rows = sqlx::query!(
            "SELECT g.id, m.host, g.cuda_uuid, g.gpu_type FROM gpus g
             JOIN machines m ON m.id = g.machine_id"
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let gpu = LeasedGpu {
                    id: GpuId(row.id.clone()),
                    host: row.host,
                    cuda_uuid: row.cuda_uuid,
                    gpu_type: row.gpu_type,
                };
                (row.id, gpu)
            })
            .collect())
    }

    /// Rounds newest first, before round `before` (exclusive) when given.
    pub async fn rounds(
        &self,
        before: Option<RoundId>,
        limit: i64,
    ) -> Result<Vec<RoundSummary>, StoreError> {
        Ok(sqlx::query_as!(
            RoundSummary,
            r#"SELECT round_id AS "round_id!: _", opened_at AS "opened_at!", closed_at,
                      status AS "status!", offered_gpus AS "offered_gpus!", bidders AS "bidders!",
                      bids AS "bids!", gpus_won_in_auction::bigint AS "gpus_won_in_auction!",
                      gpus_as_leftovers::bigint AS "gpus_as_leftovers!"
               FROM round_summary
               WHERE round_id < coalesce($1, 9223372036854775807)
               ORDER BY round_id DESC LIMIT $2"#,
            before.map(|round| round.0),
            limit
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Round `id` as `viewer` may see it.
    pub async fn round_detail(
        &self,
        id: RoundId,
        viewer: Caller,
    ) -> Result<Option<RoundDetail>, StoreError> {
        let Some(stored) = self.stored_round(id).await? else {
            return Ok(None);
        };
        let round = sqlx::query!(
            "SELECT closed_at, fairness_knob FROM rounds WHERE id = $1",
            id.0
        )
        .fetch_one(&self.pool)
        .await?;
        let owners = self.round_app_owners(id).await?;
        // Every app of the round stands in it, so every app here has an owner.
        let visible = |app: AppKey| owners.get(&app).is_some_and(|&owner| viewer.sees(owner));
        let shown = |app: AppKey| visible(app).then_some(app);
        let standings = sqlx::query!(
            r#"SELECT position, app_id AS "app_id: AppKey", rho, unmet_demand, bidder
               FROM round_standings WHERE round_id = $1 ORDER BY position"#,
            id.0
        )
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .map(|row| StandingView {
            position: row.position,
            app_id: shown(row.app_id),
            rho: row.rho,
            unmet_demand: row.unmet_demand,
            bidder: row.bidder,
        })
        .collect();
        let received = self.bid_times(id).await?;
        let bids = stored
            .bids
            .iter()
            .map(|bid| {
                let (source, received_at) = received[&bid.app_id].clone();
                let mine = visible(bid.app_id);
                BidView {
                    app_id: shown(bid.app_id),
                    source,
                    rho_old: if mine { bid.rho_old } else { None },
                    entries: if mine {
                        bid.entries
                            .iter()
                            .map(|(gpus, rho)| BidEntryView {
                                gpus: gpus.clone(),
                                rho: *rho,
                            })
                            .collect()
                    } else {
                        Vec::new()
                    },
                    received_at,
                }
            })
            .collect();
        let allocations = stored
            .allocations
            .iter()
            .map(|row| AllocationView {
                app_id: shown(row.app),
                pf_entry: row.pf_entry.filter(|_| visible(row.app)),
                pf_gpus: row.pf_gpus.clone(),
                c: row.c.filter(|_| visible(row.app)),
                kept_gpus: row.kept_gpus.clone(),
                leftover_gpus: row.leftover_gpus.clone(),
            })
            .collect();
        Ok(Some(RoundDetail {
            round_id: id,
            opened_at: stored.opened_at,
            deadline: stored.deadline,
            closed_at: round.closed_at,
            status: stored.status,
            fairness_knob: round.fairness_knob,
            seed: stored.seed,
            engine_version: stored.engine_version,
            offered_gpus: offered_gpu_ids(&stored.offer),
            standings,
            bids,
            allocations,
            unallocated: stored.unallocated,
        }))
    }

    async fn round_app_owners(
        &self,
        round: RoundId,
    ) -> Result<HashMap<AppKey, TenantId>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT a.id AS "id: AppKey", a.tenant_id AS "tenant_id: TenantId"
               FROM round_standings s JOIN apps a ON a.id = s.app_id
               WHERE s.round_id = $1"#,
            round.0
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| (row.id, row.tenant_id))
            .collect())
    }

    async fn bid_times(
        &self,
        round: RoundId,
    ) -> Result<HashMap<AppKey, (String, DateTime<Utc>)>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT app_id AS "app_id: AppKey", source, received_at FROM bids
               WHERE round_id = $1"#,
            round.0
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| (row.app_id, (row.source, row.received_at)))
            .collect())
    }

    /// Everything stored about round `id`: its replay inputs and its outcome.
    pub async fn stored_round(&self, id: RoundId) -> Result<Option<StoredRound>, StoreError> {
        let Some(round) = sqlx::query!(
            r#"SELECT status, opened_at, deadline, seed::text AS "seed!", engine_version,
                      leftover_policy, offer, standings, holds, claims, unallocated,
                      departed AS "departed: Vec<AppKey>", resource_division
               FROM rounds WHERE id = $1"#,
            id.0
        )
        .fetch_optional(&self.pool)
        .await?
        else {
            return Ok(None);
        };
        let bidders = sqlx::query_scalar!(
            r#"SELECT app_id AS "app_id: AppKey" FROM round_standings
               WHERE round_id = $1 AND bidder ORDER BY position"#,
            id.0
        )
        .fetch_all(&self.pool)
        .await?;
        let allocations = sqlx::query!(
            r#"SELECT app_id AS "app_id: AppKey", pf_entry, pf_gpus, c, c_fallback, pf_fallback,
                      kept_gpus, leftover_gpus
               FROM round_allocations WHERE round_id = $1 ORDER BY app_id"#,
            id.0
        )
        .fetch_all(&self.pool)
        .await?
        .into_iter()
        .map(|row| super::AllocationRow {
            app: row.app_id,
            pf_entry: row.pf_entry,
            pf_gpus: gpu_ids(row.pf_gpus),
            c: row.c,
            c_fallback: row.c_fallback,
            pf_fallback: row.pf_fallback,
            kept_gpus: gpu_ids(row.kept_gpus),
            leftover_gpus: gpu_ids(row.leftover_gpus),
        })
        .collect();
        Ok(Some(StoredRound {
            id,
            status: round.status,
            opened_at: round.opened_at,
            deadline: round.deadline,
            seed: round.seed,
            engine_version: round.engine_version,
            leftover_policy: round.leftover_policy,
            offer: round.offer,
            standings: round.standings,
            holds: round.holds,
            claims: round.claims,
            bidders,
            bids: self.bids_of_round(id).await?,
            allocations,
            unallocated: gpu_ids(round.unallocated.unwrap_or_default()),
            departed: round.departed,
            resource_division: round.resource_division,
        }))
    }

    /// The CPUs and memory each lease had after round `round`: its latest `lease_resources`
    /// row up to that round.
    pub async fn lease_resources_after(
        &self,
        round: RoundId,
    ) -> Result<HashMap<LeaseKey, (Option<f64>, Option<f64>)>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT DISTINCT ON (lease_id) lease_id AS "lease_id: LeaseKey", cpus, memory_gib
               FROM lease_resources WHERE round_id <= $1
               ORDER BY lease_id, round_id DESC"#,
            round.0
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| (row.lease_id, (row.cpus, row.memory_gib)))
            .collect())
    }

    /// Cancels every statement of an auditor (a member of `agora_auditor`, not a superuser)
    /// that has run longer than `limit`; returns how many. An auditor can set its own
    /// `statement_timeout` (Postgres lets any role), so the limit is enforced from here.
    pub async fn cancel_overlong_auditor_statements(
        &self,
        limit: std::time::Duration,
    ) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar!(
            r#"SELECT count(*) FILTER (WHERE pg_cancel_backend(a.pid)) AS "cancelled!"
               FROM pg_stat_activity a JOIN pg_roles r ON r.oid = a.usesysid
               WHERE a.state = 'active' AND NOT r.rolsuper AND a.pid <> pg_backend_pid()
                 AND pg_has_role(a.usesysid, 'agora_auditor', 'MEMBER')
                 AND clock_timestamp() - a.query_start > make_interval(secs => $1)"#,
            limit.as_secs_f64()
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// Bid `id` as stored (its table possibly empty).
    pub async fn bid(&self, id: BidId) -> Result<Option<StoredBid>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT b.app_id AS "app_id: AppKey", b.rho_old, e.gpus AS "gpus?", e.rho AS "rho?"
               FROM bids b LEFT JOIN bid_entries e ON e.bid_id = b.id
               WHERE b.id = $1 ORDER BY e.entry"#,
            id.0
        )
        .fetch_all(&self.pool)
        .await?;
        let mut bid: Option<StoredBid> = None;
        for row in rows {
            let bid = bid.get_or_insert_with(|| StoredBid {
                app_id: row.app_id,
                rho_old: row.rho_old,
                entries: Vec::new(),
            });
            if let (Some(gpus), Some(rho)) = (row.gpus, row.rho) {
                bid.entries.push((gpu_ids(gpus), rho));
            }
        }
        Ok(bid)
    }

    /// Every bid of the round, by app, those with an empty table included.
    pub async fn bids_of_round(&self, round: RoundId) -> Result<Vec<StoredBid>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT b.app_id AS "app_id: AppKey", b.rho_old, e.gpus AS "gpus?", e.rho AS "rho?"
               FROM bids b LEFT JOIN bid_entries e ON e.bid_id = b.id
               WHERE b.round_id = $1 ORDER BY b.app_id, e.entry"#,
            round.0
        )
        .fetch_all(&self.pool)
        .await?;
        let mut bids: Vec<StoredBid> = Vec::new();
        for row in rows {
            if bids.last().map(|bid| bid.app_id) != Some(row.app_id) {
                bids.push(StoredBid {
                    app_id: row.app_id,
                    rho_old: row.rho_old,
                    entries: Vec::new(),
                });
            }
            // A bid with an empty table is a row of its own: it counts in the round.
            if let (Some(bid), Some(gpus), Some(rho)) = (bids.last_mut(), row.gpus, row.rho) {
                bid.entries.push((gpu_ids(gpus), rho));
            }
        }
        Ok(bids)
    }

    pub async fn events_after(
        &self,
        app: AppKey,
        after: i64,
        limit: i64,
    ) -> Result<Vec<AppEventRow>, StoreError> {
        Ok(sqlx::query_as!(
            AppEventRow,
            "SELECT id, at, kind, payload FROM app_events WHERE app_id = $1 AND id > $2
             ORDER BY id LIMIT $3",
            app.0,
            after,
            limit
        )
        .fetch_all(&self.pool)
        .await?)
    }

    pub async fn last_round_of(&self, app: AppKey) -> Result<Option<LastRound>, StoreError> {
        Ok(sqlx::query_as!(
            LastRound,
            r#"SELECT round_id AS "round_id: _", position, bidder, rho FROM round_standings
               WHERE app_id = $1 ORDER BY round_id DESC LIMIT 1"#,
            app.0
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// The last `limit` operator actions, newest first.
    pub async fn operator_actions(
        &self,
        limit: i64,
    ) -> Result<Vec<OperatorActionView>, StoreError> {
        Ok(sqlx::query_as!(
            OperatorActionView,
            r#"SELECT at, action, gpu_id AS gpu, lease_id AS "lease_id: _" FROM operator_actions
               ORDER BY id DESC LIMIT $1"#,
            limit
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Every GPU with its host, health and holder; holders of other tenants hidden.
    pub async fn cluster(&self, viewer: Caller) -> Result<Vec<GpuView>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT g.id, g.machine_id, m.rack, m.host, g.slot, g.gpu_type, g.cuda_uuid,
                      w.name AS "product_name?", w.compute_capability AS "compute_capability?",
                      g.healthy AND coalesce(w.healthy AND w.reported, true)
                          AND coalesce(h.status = 'up', true) AS "healthy!",
                      l.id AS "lease_id?: LeaseKey", l.app_id AS "app_id?: AppKey",
                      a.tenant_id AS "tenant_id?: TenantId"
               FROM gpus g
               JOIN machines m ON m.id = g.machine_id
               LEFT JOIN worker_gpus w ON w.gpu_id = g.id
               LEFT JOIN hosts h ON h.machine_id = g.machine_id
               LEFT JOIN leases l ON l.state = 'active' AND g.id = ANY (l.gpus)
               LEFT JOIN apps a ON a.id = l.app_id
               ORDER BY m.id, g.slot, g.id"#
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                // A free GPU has no holder to hide.
                let visible = row.tenant_id.is_some_and(|owner| viewer.sees(owner));
                GpuView {
                    id: GpuId(row.id),
                    machine: row.machine_id,
                    rack: row.rack,
                    host: row.host,
                    slot: row.slot,
                    gpu_type: row.gpu_type,
                    product_name: row.product_name,
                    compute_capability: row.compute_capability,
                    cuda_uuid: row.cuda_uuid,
                    healthy: row.healthy,
                    lease_id: row.lease_id.filter(|_| visible),
                    app_id: row.app_id.filter(|_| visible),
                }
            })
            .collect())
    }

    pub async fn active_apps(&self) -> Result<Vec<ActiveApp>, StoreError> {
        Ok(sqlx::query_as!(
            ActiveApp,
            r#"SELECT a.id AS "id: _", a.tenant_id AS "tenant_id: _", a.bidding, a.state,
                      a.arrived_at, a.enforcement,
                      a.cluster_seconds,
                      coalesce((SELECT sum(extract(epoch FROM l.ended_at - l.start_at)
                                           * cardinality(l.gpus))
                                FROM leases l WHERE l.app_id = a.id AND l.state <> 'active'),
                               0)::float8 AS "ended_gpu_seconds!"
               FROM apps a WHERE a.finished_at IS NULL ORDER BY a.id"#
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Every app that has left, with its arrival and departure.
    pub async fn departed_apps(&self) -> Result<Vec<DepartedApp>, StoreError> {
        Ok(sqlx::query_as!(
            DepartedApp,
            r#"SELECT arrived_at, finished_at AS "finished_at!" FROM apps
               WHERE finished_at IS NOT NULL ORDER BY id"#
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Leases of active apps that expired after the last round closed: their apps' claims to
    /// renew onto those GPUs in the next round.
    pub async fn claimed_leases(&self) -> Result<Vec<StoredLease>, StoreError> {
        let rows = sqlx::query_as!(
            LeaseRow,
            r#"SELECT l.id AS "id: _", l.app_id AS "app_id: _", l.gpus, l.start_at, l.end_at
               FROM leases l
               JOIN apps a ON a.id = l.app_id
               WHERE l.state = 'expired' AND a.finished_at IS NULL
                 AND l.ended_at >= coalesce(
                     (SELECT max(closed_at) FROM rounds WHERE status = 'closed'), '-infinity')
               ORDER BY l.id"#
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(LeaseRow::stored).collect())
    }

    pub async fn active_leases(&self) -> Result<Vec<StoredLease>, StoreError> {
        let rows = sqlx::query_as!(
            LeaseRow,
            r#"SELECT id AS "id: _", app_id AS "app_id: _", gpus, start_at, end_at FROM leases
               WHERE state = 'active' ORDER BY id"#
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(LeaseRow::stored).collect())
    }

    pub async fn unhealthy_gpus(&self) -> Result<Vec<GpuId>, StoreError> {
        let ids = sqlx::query_scalar!("SELECT id FROM gpus WHERE NOT healthy ORDER BY id")
            .fetch_all(&self.pool)
            .await?;
        Ok(gpu_ids(ids))
    }

    /// The URL of the arbiter that leads now (or led last), as it advertised itself.
    pub async fn leader_url(&self) -> Result<Option<String>, StoreError> {
        Ok(sqlx::query_scalar!("SELECT leader_url FROM leadership")
            .fetch_one(&self.pool)
            .await?)
    }

    /// The next unused round and lease ids.
    pub async fn next_ids(&self) -> Result<(RoundId, LeaseKey), StoreError> {
        let row = sqlx::query!(
            r#"SELECT coalesce((SELECT max(id) FROM rounds), 0) + 1 AS "round!: RoundId",
                      coalesce((SELECT max(id) FROM leases), -1) + 1 AS "lease!: LeaseKey""#
        )
        .fetch_one(&self.pool)
        .await?;
        Ok((row.round, row.lease))
    }

    pub async fn open_round_id(&self) -> Result<Option<RoundId>, StoreError> {
        Ok(sqlx::query_scalar!(
            r#"SELECT id AS "id: RoundId" FROM rounds WHERE status = 'open'
               ORDER BY id DESC LIMIT 1"#
        )
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Ids of every closed round, oldest first (for audits).
    pub async fn closed_round_ids(&self) -> Result<Vec<RoundId>, StoreError> {
        Ok(sqlx::query_scalar!(
            r#"SELECT id AS "id: RoundId" FROM rounds WHERE status = 'closed' ORDER BY id"#
        )
        .fetch_all(&self.pool)
        .await?)
    }
}

fn offered_gpu_ids(offer: &Value) -> Vec<GpuId> {
    offer["gpus"]
        .as_array()
        .map(|gpus| {
            gpus.iter()
                .filter_map(|gpu| gpu["id"].as_str().map(GpuId::from))
                .collect()
        })
        .unwrap_or_default()
}
