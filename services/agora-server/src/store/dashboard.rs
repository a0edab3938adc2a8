//! Reads for the web dashboard: an app's rho over time and the rounds it took part in, the
//! fairness of the market now, leases over a time window, and the rounds stream. Anything of
//! another tenant is shown without ids, names or bid tables, as in [`Store::round_detail`].

use std::collections::HashMap;

use agora_market::topology::GpuId;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::{gpu_ids, BidEntryView, RoundSummary, Store, StoreError};
use crate::ids::{AppKey, LeaseKey, RoundId, TenantId};
use crate::visibility::Caller;
use crate::why::{round_sentence, RoundFacts};

/// An app as the dashboard lists it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VisibleApp {
    pub id: AppKey,
    pub tenant_id: TenantId,
    pub tenant: String,
    pub name: String,
    pub bidding: String,
    pub arrived_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// The app's rho at the start of one round (`None`: starving, it held no GPU).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RhoPoint {
    pub round_id: RoundId,
    pub at: DateTime<Utc>,
    pub rho: Option<f64>,
    /// 0 is the worst rho, the first offered GPUs.
    pub position: i32,
    pub bidder: bool,
}

/// The app's own bid in a round.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OwnBid {
    /// `framework` (posted over HTTP) or `agent` (computed by the arbiter).
    pub source: String,
    pub rho_old: Option<f64>,
    pub received_at: DateTime<Utc>,
    pub entries: Vec<BidEntryView>,
}

/// One round the app took part in: as a bidder, or by receiving leftover GPUs.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AppRound {
    pub round_id: RoundId,
    pub opened_at: DateTime<Utc>,
    pub status: String,
    pub position: i32,
    /// rho at the round's start.
    pub rho: Option<f64>,
    pub bidder: bool,
    pub bid: Option<OwnBid>,
    /// Index into the bid table picked by the proportional-fair choice.
    pub pf_entry: Option<i32>,
    /// The hidden-payment share c_i: the app keeps this fraction of its PF bundle.
    pub c: Option<f64>,
    /// GPUs kept from the auction.
    pub won_gpus: Vec<GpuId>,
    /// GPUs handed out after the auction.
    pub leftover_gpus: Vec<GpuId>,
    /// Whether it won any GPU in the auction.
    pub won: bool,
    /// The round for this app in one sentence (see [`crate::why::round_sentence`]).
    pub why: String,
}

/// One active app in the latest round's standings.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FairnessApp {
    /// `None` (and no name) when the app belongs to another tenant.
    pub app_id: Option<AppKey>,
    pub name: Option<String>,
    pub rho: Option<f64>,
    pub position: i32,
}

/// Where the GPUs are: how many exist, are in service, and are held by a lease.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct GpuCounts {
    pub total: i64,
    pub healthy: i64,
    pub held: i64,
}

/// The latest round's standings of still-active apps, and the GPU counts now.
#[derive(Debug, Clone)]
pub struct FairnessInputs {
    pub round: Option<(RoundId, DateTime<Utc>)>,
    pub apps: Vec<FairnessApp>,
    pub gpus: GpuCounts,
}

/// A lease on the timeline; another tenant's lease shows only its GPUs and times.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TimelineLease {
    /// `None` (with `app_id`) when the lease belongs to another tenant.
    pub lease_id: Option<LeaseKey>,
    pub app_id: Option<AppKey>,
    pub gpus: Vec<GpuId>,
    pub start_at: DateTime<Utc>,
    /// When it ended, or when it is due to end while active.
    pub end_at: DateTime<Utc>,
    /// `active`, `expired`, `released` or `revoked`.
    pub state: String,
}

impl Store {
    pub async fn tenant_name(&self, tenant: TenantId) -> Result<Option<String>, StoreError> {
        Ok(
            sqlx::query_scalar!("SELECT name FROM tenants WHERE id = $1", tenant.0)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Apps `viewer` sees, finished ones included.
    pub async fn visible_apps(&self, viewer: Caller) -> Result<Vec<VisibleApp>, StoreError> {
        Ok(sqlx::query_as!(
            VisibleApp,
            r#"SELECT a.id AS "id: _", a.tenant_id AS "tenant_id: _", t.name AS tenant, a.name,
                      a.bidding, a.arrived_at, a.finished_at
               FROM apps a JOIN tenants t ON t.id = a.tenant_id
               WHERE $1::bigint IS NULL OR a.tenant_id = $1
               ORDER BY a.id"#,
            viewer.tenant().map(|tenant| tenant.0)
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// The app's rho in its last `limit` rounds, oldest first.
    pub async fn rho_history(&self, app: AppKey, limit: i64) -> Result<Vec<RhoPoint>, StoreError> {
        let mut points = sqlx::query_as!(
            RhoPoint,
            r#"SELECT s.round_id AS "round_id: _", r.opened_at AS at, s.rho, s.position, s.bidder
               FROM round_standings s JOIN rounds r ON r.id = s.round_id
               WHERE s.app_id = $1 ORDER BY s.round_id DESC LIMIT $2"#,
            app.0,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        points.reverse();
        Ok(points)
    }

    /// Rounds the app bid in or got leftovers from, newest first, before `before` and after
    /// `after` if given.
    pub async fn app_rounds(
        &self,
        app: AppKey,
        before: Option<RoundId>,
        after: Option<RoundId>,
        limit: i64,
    ) -> Result<Vec<AppRound>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT s.round_id AS "round_id: RoundId", r.opened_at, r.status, s.position, s.rho, s.bidder,
                      b.source AS "source?", b.rho_old, b.received_at AS "received_at?",
                      al.pf_entry AS "pf_entry?", al.c AS "c?",
                      coalesce(al.kept_gpus, '{}') AS "won_gpus!",
                      coalesce(al.leftover_gpus, '{}') AS "leftover_gpus!",
                      cardinality(al.pf_gpus) AS pf_gpus,
                      (SELECT count(*) FROM round_standings o
                       WHERE o.round_id = s.round_id AND o.bidder) AS "offered_apps!"
               FROM round_standings s
               JOIN rounds r ON r.id = s.round_id
               LEFT JOIN bids b ON b.round_id = s.round_id AND b.app_id = s.app_id
               LEFT JOIN round_allocations al ON al.round_id = s.round_id AND al.app_id = s.app_id
               WHERE s.app_id = $1 AND s.round_id < coalesce($2, 9223372036854775807)
                 AND s.round_id > coalesce($4::bigint, 0)
                 AND (s.bidder OR s.unmet_demand > 0 OR cardinality(al.leftover_gpus) > 0)
               ORDER BY s.round_id DESC LIMIT $3"#,
            app.0,
            before.map(|round| round.0),
            limit,
            after.map(|round| round.0)
        )
        .fetch_all(&self.pool)
        .await?;
        let rounds: Vec<RoundId> = rows.iter().map(|row| row.round_id).collect();
        let mut entries = self.bid_entries_of(app, &rounds).await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let entries = entries.remove(&row.round_id).unwrap_or_default();
                let why = round_sentence(&RoundFacts {
                    round: row.round_id,
                    position: row.position,
                    rho: row.rho,
                    offered_apps: usize::try_from(row.offered_apps).unwrap_or_default(),
                    offered: row.bidder,
                    bid_gpus: row.source.as_ref().map(|_| {
                        entries
                            .iter()
                            .map(|entry| entry.gpus.len())
                            .max()
                            .unwrap_or(0)
                    }),
                    pf_gpus: row
                        .pf_entry
                        .and(row.pf_gpus)
                        .map(|count| usize::try_from(count).unwrap_or_default()),
                    c: row.c,
                    kept_gpus: row.won_gpus.len(),
                    leftover_gpus: row.leftover_gpus.len(),
                });
                AppRound {
                    round_id: row.round_id,
                    opened_at: row.opened_at,
                    status: row.status,
                    position: row.position,
                    rho: row.rho,
                    bidder: row.bidder,
                    bid: row
                        .source
                        .zip(row.received_at)
                        .map(|(source, received_at)| OwnBid {
                            source,
                            rho_old: row.rho_old,
                            received_at,
                            entries,
                        }),
                    pf_entry: row.pf_entry,
                    c: row.c,
                    won: !row.won_gpus.is_empty(),
                    won_gpus: gpu_ids(row.won_gpus),
                    leftover_gpus: gpu_ids(row.leftover_gpus),
                    why,
                }
            })
            .collect())
    }

    /// The app's bid tables in `rounds`, by round.
    async fn bid_entries_of(
        &self,
        app: AppKey,
        rounds: &[RoundId],
    ) -> Result<HashMap<RoundId, Vec<BidEntryView>>, StoreError> {
        let rounds: Vec<i64> = rounds.iter().map(|round| round.0).collect();
        let rows = sqlx::query!(
            r#"SELECT b.round_id AS "round_id: RoundId", e.gpus, e.rho
               FROM bids b JOIN bid_entries e ON e.bid_id = b.id
               WHERE b.app_id = $1 AND b.round_id = ANY ($2) ORDER BY b.round_id, e.entry"#,
            app.0,
            &rounds
        )
        .fetch_all(&self.pool)
        .await?;
        let mut tables: HashMap<RoundId, Vec<BidEntryView>> = HashMap::new();
        for row in rows {
            tables.entry(row.round_id).or_default().push(BidEntryView {
                gpus: gpu_ids(row.gpus),
                rho: row.rho,
            });
        }
        Ok(tables)
    }

    /// What the fairness summary is computed from, as `viewer` may see it.
    pub async fn fairness_inputs(&self, viewer: Caller) -> Result<FairnessInputs, StoreError> {
        let round = sqlx::query!(
            r#"SELECT id AS "id: RoundId", opened_at FROM rounds ORDER BY id DESC LIMIT 1"#
        )
        .fetch_optional(&self.pool)
        .await?
        .map(|row| (row.id, row.opened_at));
        let standings = sqlx::query!(
            r#"SELECT s.app_id AS "app_id: AppKey", a.tenant_id AS "tenant_id: TenantId", a.name,
                      s.rho, s.position
               FROM round_standings s JOIN apps a ON a.id = s.app_id
               WHERE s.round_id = $1 AND a.finished_at IS NULL ORDER BY s.position"#,
            round.map(|(id, _)| id.0)
        )
        .fetch_all(&self.pool)
        .await?;
        let apps = standings
            .into_iter()
            .map(|row| FairnessApp {
                app_id: viewer.reveal(row.tenant_id, row.app_id),
                name: viewer.reveal(row.tenant_id, row.name),
                rho: row.rho,
                position: row.position,
            })
            .collect();
        let gpus = sqlx::query_as!(
            GpuCounts,
            r#"SELECT count(*) AS "total!",
                      count(*) FILTER (WHERE healthy) AS "healthy!",
                      count(*) FILTER (WHERE EXISTS (
                          SELECT FROM leases l WHERE l.state = 'active' AND g.id = ANY (l.gpus)
                      )) AS "held!"
               FROM gpus g"#
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(FairnessInputs { round, apps, gpus })
    }

    /// Leases held at some time in [`from`, `to`), oldest first, at most `limit`.
    pub async fn lease_timeline(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        limit: i64,
        viewer: Caller,
    ) -> Result<Vec<TimelineLease>, StoreError> {
        let rows = sqlx::query!(
            r#"SELECT l.id AS "id: LeaseKey", l.app_id AS "app_id: AppKey",
                      a.tenant_id AS "tenant_id: TenantId", l.gpus, l.start_at,
                      coalesce(l.ended_at, l.end_at) AS "end_at!", l.state
               FROM leases l JOIN apps a ON a.id = l.app_id
               WHERE l.start_at < $2 AND coalesce(l.ended_at, l.end_at) > $1
               ORDER BY l.start_at, l.id LIMIT $3"#,
            from,
            to,
            limit
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|row| TimelineLease {
                lease_id: viewer.reveal(row.tenant_id, row.id),
                app_id: viewer.reveal(row.tenant_id, row.app_id),
                gpus: gpu_ids(row.gpus),
                start_at: row.start_at,
                end_at: row.end_at,
                state: row.state,
            })
            .collect())
    }

    /// Rounds decided after round `after`, oldest first. Stops before the first round still
    /// open, so a reader that resumes after the last id it saw never skips one.
    pub async fn decided_rounds_after(
        &self,
        after: RoundId,
        limit: i64,
    ) -> Result<Vec<RoundSummary>, StoreError> {
        Ok(sqlx::query_as!(
            RoundSummary,
            r#"SELECT round_id AS "round_id!: _", opened_at AS "opened_at!", closed_at,
                      status AS "status!", offered_gpus AS "offered_gpus!", bidders AS "bidders!",
                      bids AS "bids!", gpus_won_in_auction::bigint AS "gpus_won_in_auction!",
                      gpus_as_leftovers::bigint AS "gpus_as_leftovers!"
               FROM round_summary
               WHERE round_id > $1
                 AND round_id < coalesce(
                     (SELECT min(id) FROM rounds WHERE status = 'open' AND id > $1),
                     9223372036854775807)
               ORDER BY round_id LIMIT $2"#,
            after.0,
            limit
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
