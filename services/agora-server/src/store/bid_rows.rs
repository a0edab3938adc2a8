//! Bid rows: the one way bids reach the `bids` and `bid_entries` tables, whether a framework
//! posted them (the writer's group commits) or the arbiter's agents made them (a round's
//! commit).

use agora_market::auction::AppBid;
use agora_market::time::Timestamp;
use sqlx::{Postgres, Transaction};

use crate::clock::to_datetime;
use crate::ids::{AppKey, BidId, RoundId};

/// Where a stored bid came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BidSource {
    /// Posted over HTTP.
    Framework,
    /// Computed by the arbiter's agent for the app.
    Agent,
}

impl BidSource {
    fn as_str(self) -> &'static str {
        match self {
            Self::Framework => "framework",
            Self::Agent => "agent",
        }
    }
}

/// A bid to store.
#[derive(Debug, Clone)]
pub struct NewBid {
    pub round: RoundId,
    pub app: AppKey,
    pub bid: AppBid,
    pub idempotency_key: Option<String>,
    pub received_at: Timestamp,
}

/// Inserts `bids` and their entries with one statement each; returns each bid's id, `None`
/// where the app already had a bid in the round.
pub(super) async fn insert_bids(
    tx: &mut Transaction<'_, Postgres>,
    bids: &[NewBid],
    source: BidSource,
) -> Result<Vec<Option<BidId>>, sqlx::Error> {
    let rounds: Vec<i64> = bids.iter().map(|bid| bid.round.0).collect();
    let apps: Vec<i64> = bids.iter().map(|bid| bid.app.0).collect();
    let rho_old: Vec<Option<f64>> = bids
        .iter()
        .map(|bid| bid.bid.rho_old.map(f64::from))
        .collect();
    let keys: Vec<Option<String>> = bids.iter().map(|bid| bid.idempotency_key.clone()).collect();
    let received: Vec<_> = bids
        .iter()
        .map(|bid| to_datetime(bid.received_at))
        .collect();
    let stored = sqlx::query!(
        r#"INSERT INTO bids (round_id, app_id, source, rho_old, idempotency_key, received_at)
           SELECT round_id, app_id, $3, rho_old, idempotency_key, received_at
           FROM unnest($1::bigint[], $2::bigint[], $4::float8[], $5::text[], $6::timestamptz[])
                AS new (round_id, app_id, rho_old, idempotency_key, received_at)
           ON CONFLICT (round_id, app_id) DO NOTHING
           RETURNING id AS "id: BidId", round_id AS "round_id: RoundId", app_id AS "app_id: AppKey""#,
        &rounds,
        &apps,
        source.as_str(),
        &rho_old as &[Option<f64>],
        &keys as &[Option<String>],
        &received
    )
    .fetch_all(&mut **tx)
    .await?;
    let ids: Vec<Option<BidId>> = bids
        .iter()
        .map(|bid| {
            stored
                .iter()
                .find(|row| row.round_id == bid.round && row.app_id == bid.app)
                .map(|row| row.id)
        })
        .collect();
    insert_entries(tx, bids, &ids).await?;
    Ok(ids)
}

/// One row per GPU of each entry, folded back into `gpus` arrays: Postgres arrays must be
/// rectangular, and bundles differ in size.
async fn insert_entries(
    tx: &mut Transaction<'_, Postgres>,
    bids: &[NewBid],
    ids: &[Option<BidId>],
) -> Result<(), sqlx::Error> {
    let (mut bid_ids, mut entries, mut positions, mut gpus, mut rhos) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (bid, id) in bids.iter().zip(ids) {
        let Some(id) = id else { continue };
        for (entry, row) in bid.bid.bids.iter().enumerate() {
            for (position, gpu) in row.gpus.iter().enumerate() {
                bid_ids.push(id.0);
                entries.push(entry as i32);
                positions.push(position as i32);
                gpus.push(gpu.0.clone());
                rhos.push(f64::from(row.rho));
            }
        }
    }
    if bid_ids.is_empty() {
        return Ok(());
    }
    sqlx::query!(
        "INSERT INTO bid_entries (bid_id, entry, gpus, rho)
         SELECT bid_id, entry, array_agg(gpu ORDER BY position), min(rho)
         FROM unnest($1::bigint[], $2::int[], $3::int[], $4::text[], $5::float8[])
              AS row (bid_id, entry, position, gpu, rho)
         GROUP BY bid_id, entry",
        &bid_ids,
        &entries,
        &positions,
        &gpus,
        &rhos
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}
