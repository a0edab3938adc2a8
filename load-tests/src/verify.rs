//! After a run: is everything the arbiter acknowledged in Postgres, and was any GPU ever in two
//! leases at overlapping times? Read straight from the tables, independent of the API.

use std::collections::HashSet;

use sqlx::{Connection, PgConnection};

use crate::player::AckedBid;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verification {
    pub acked_bids: usize,
    /// Acknowledged bids with no matching framework bid row (same id, app and round).
    pub missing_bids: Vec<AckedBid>,
    pub leases: i64,
    /// Pairs of leases that held one GPU at overlapping times.
    pub overlapping_leases: i64,
    /// GPUs in more than one active lease now.
    pub doubly_active_gpus: i64,
}

impl Verification {
    pub fn passed(&self) -> bool {
        self.missing_bids.is_empty() && self.overlapping_leases == 0 && self.doubly_active_gpus == 0
    }

    pub fn summary(&self) -> String {
        format!(
            "{} acknowledged bids, {} missing from the bids table; {} leases, {} overlapping lease pairs on one GPU, {} GPUs in two active leases",
            self.acked_bids,
            self.missing_bids.len(),
            self.leases,
            self.overlapping_leases,
            self.doubly_active_gpus
        )
    }
}

pub async fn verify(database_url: &str, acked: &[AckedBid]) -> anyhow::Result<Verification> {
    let mut db = PgConnection::connect(database_url).await?;
    let ids: Vec<i64> = acked.iter().map(|bid| bid.bid_id).collect();
    let stored: HashSet<(i64, i64, i64)> = sqlx::query!(
        "SELECT id, app_id, round_id FROM bids WHERE id = ANY($1) AND source = 'framework'",
        &ids
    )
    .fetch_all(&mut db)
    .await?
    .into_iter()
    .map(|row| (row.id, row.app_id, row.round_id))
    .collect();
    let missing_bids = acked
        .iter()
        .filter(|bid| !stored.contains(&(bid.bid_id, bid.app, bid.round)))
        .copied()
        .collect();
    let leases = sqlx::query_scalar!(r#"SELECT count(*) AS "count!" FROM leases"#)
        .fetch_one(&mut db)
        .await?;
    let overlapping_leases = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM lease_gpus a JOIN lease_gpus b
           ON a.gpu_id = b.gpu_id AND a.lease_id < b.lease_id AND a.held && b.held"#
    )
    .fetch_one(&mut db)
    .await?;
    let doubly_active_gpus = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM (
             SELECT g.gpu_id FROM lease_gpus g JOIN leases l ON l.id = g.lease_id
             WHERE l.state = 'active' GROUP BY g.gpu_id HAVING count(*) > 1) AS doubled"#
    )
    .fetch_one(&mut db)
    .await?;
    Ok(Verification {
        acked_bids: acked.len(),
        missing_bids,
        leases,
        overlapping_leases,
        doubly_active_gpus,
    })
}
