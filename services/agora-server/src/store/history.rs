//! The fairness history over a time range, downsampled: the range is cut into
//! [`HISTORY_POINTS`] equal intervals and each interval is shown by its last round, so a day or
//! the whole history costs no more than a quarter of an hour. The values are exact (each point
//! is a real round's standings), only rounds between the points are left out.

use agora_market::rho::RhoSpread;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{RhoPoint, Store, StoreError};
use crate::ids::{AppKey, RoundId};

/// The most points one history answer holds, whatever its range.
pub const HISTORY_POINTS: i64 = 240;

/// A time range of the history, ending now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum HistoryRange {
    #[serde(rename = "15m")]
    QuarterHour,
    #[serde(rename = "1h")]
    Hour,
    #[serde(rename = "24h")]
    Day,
    /// From the first round on.
    #[serde(rename = "all")]
    All,
}

impl HistoryRange {
    /// How far back the range reaches; `None` for [`Self::All`].
    fn span(self) -> Option<chrono::TimeDelta> {
        match self {
            Self::QuarterHour => Some(chrono::TimeDelta::minutes(15)),
            Self::Hour => Some(chrono::TimeDelta::hours(1)),
            Self::Day => Some(chrono::TimeDelta::hours(24)),
            Self::All => None,
        }
    }
}

/// The market at one round of the history: its standings' spread of rho.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FairnessPoint {
    pub round_id: RoundId,
    pub at: DateTime<Utc>,
    /// Apps in the round's standings.
    pub apps: usize,
    /// Apps holding no GPU (rho unbounded), left out of `max_rho` and `jains_index`.
    pub starving_apps: usize,
    pub max_rho: Option<f64>,
    pub jains_index: Option<f64>,
}

/// The cluster's fairness over a range: at most [`HISTORY_POINTS`] points, oldest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FairnessHistory {
    pub range: HistoryRange,
    /// Where the range starts: `to` minus the range, or the first round for `all` (`None`
    /// before any round).
    pub from: Option<DateTime<Utc>>,
    pub to: DateTime<Utc>,
    /// Each point is the last round of one of this many equal intervals of [`from`, `to`].
    pub intervals: i64,
    pub points: Vec<FairnessPoint>,
}

impl Store {
    /// Where `range` starts when it ends at `to`: the first round (of `app`, if given) for
    /// `all`.
    async fn range_start(
        &self,
        range: HistoryRange,
        to: DateTime<Utc>,
        app: Option<AppKey>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        if let Some(span) = range.span() {
            return Ok(Some(to - span));
        }
        Ok(sqlx::query_scalar!(
            "SELECT min(r.opened_at) FROM rounds r
             WHERE $1::bigint IS NULL
                OR EXISTS (SELECT FROM round_standings s WHERE s.round_id = r.id AND s.app_id = $1)",
            app.map(|app| app.0)
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// The cluster's max rho, Jain's index and starving apps over `range` ending at `to`.
    pub async fn fairness_history(
        &self,
        range: HistoryRange,
        to: DateTime<Utc>,
    ) -> Result<FairnessHistory, StoreError> {
        let from = self.range_start(range, to, None).await?;
        let mut points = Vec::new();
        if let Some(from) = from.filter(|from| *from < to) {
            let rounds = sqlx::query!(
                r#"SELECT DISTINCT ON (bucket) id AS "id!: RoundId", opened_at AS "at!"
                   FROM (SELECT id, opened_at,
                                least(floor(extract(epoch FROM opened_at - $1) * $3
                                            / extract(epoch FROM $2::timestamptz - $1)), $3 - 1)
                                    AS bucket
                         FROM rounds WHERE opened_at >= $1 AND opened_at <= $2) sampled
                   ORDER BY bucket, opened_at DESC, id DESC"#,
                from,
                to,
                HISTORY_POINTS as f64
            )
            .fetch_all(&self.pool)
            .await?;
            let ids: Vec<i64> = rounds.iter().map(|round| round.id.0).collect();
            let standings = sqlx::query!(
                r#"SELECT round_id AS "round_id: RoundId", rho FROM round_standings
                   WHERE round_id = ANY ($1)"#,
                &ids
            )
            .fetch_all(&self.pool)
            .await?;
            points = rounds
                .into_iter()
                .map(|round| {
                    let rhos: Vec<Option<f64>> = standings
                        .iter()
                        .filter(|standing| standing.round_id == round.id)
                        .map(|standing| standing.rho)
                        .collect();
                    let spread = RhoSpread::of(rhos.iter().copied());
                    FairnessPoint {
                        round_id: round.id,
                        at: round.at,
                        apps: rhos.len(),
                        starving_apps: spread.starving_apps,
                        max_rho: spread.max_rho,
                        jains_index: spread.jains_index,
                    }
                })
                .collect();
        }
        Ok(FairnessHistory {
            range,
            from,
            to,
            intervals: HISTORY_POINTS,
            points,
        })
    }

    /// The app's rho over `range` ending at `to`: the last round it stood in of each of
    /// [`HISTORY_POINTS`] equal intervals, oldest first.
    pub async fn rho_history_over(
        &self,
        app: AppKey,
        range: HistoryRange,
        to: DateTime<Utc>,
    ) -> Result<Vec<RhoPoint>, StoreError> {
        let Some(from) = self
            .range_start(range, to, Some(app))
            .await?
            .filter(|from| *from < to)
        else {
            return Ok(Vec::new());
        };
        Ok(sqlx::query_as!(
            RhoPoint,
            r#"SELECT DISTINCT ON (bucket) round_id AS "round_id!: _", at AS "at!", rho,
                      position AS "position!", bidder AS "bidder!"
               FROM (SELECT s.round_id, r.opened_at AS at, s.rho, s.position, s.bidder,
                            least(floor(extract(epoch FROM r.opened_at - $2) * $4
                                        / extract(epoch FROM $3::timestamptz - $2)), $4 - 1)
                                AS bucket
                     FROM round_standings s JOIN rounds r ON r.id = s.round_id
                     WHERE s.app_id = $1 AND r.opened_at >= $2 AND r.opened_at <= $3) sampled
               ORDER BY bucket, at DESC, round_id DESC"#,
            app.0,
            from,
            to,
            HISTORY_POINTS as f64
        )
        .fetch_all(&self.pool)
        .await?)
    }
}
