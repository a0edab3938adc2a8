//! Postgres, the source of truth for apps, leases and history. Every query is checked against
//! the schema at compile time (`sqlx::query!`, with offline data in `.sqlx/`).
//!
//! The arbiter changes state only through [`Writer::commit`]: a decision's [`Commit`] is written
//! in one transaction (with the decisions and bids queued next to it), so a round's outcome,
//! its leases and the events that tell apps about them land together or not at all. The
//! exclusion constraint on `lease_gpus` is the last line of defence against a GPU leased twice.

mod bid_rows;
mod dashboard;
mod history;
mod reads;
mod workers;
mod writer;
mod writes;

pub use bid_rows::{BidSource, NewBid};
pub use dashboard::*;
pub use history::*;
pub use reads::*;
pub use workers::*;
pub use writer::*;
pub use writes::*;

use std::str::FromStr as _;
use std::sync::{Arc, OnceLock};

use agora_market::app::AppId;
use agora_market::topology::GpuId;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres, Transaction};

use crate::ids::AppKey;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "cannot connect to Postgres at {url}: {source}. Is it running? `scripts/run` starts one"
    )]
    Connect {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("cannot apply the database migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("two leases would hold GPU {gpu} at overlapping times; nothing was written")]
    GpuDoubleLeased { gpu: GpuId },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("{0}")]
    Batch(std::sync::Arc<StoreError>),
    #[error("the writer has stopped (the service is shutting down)")]
    WriterStopped,
    #[error("stored data is not valid: {0}")]
    Corrupt(String),
    #[error("this arbiter is a standby: only the leader writes")]
    NotLeader,
    #[error(
        "another arbiter has taken over (fencing epoch {current}; this one led epoch {mine}); \
         nothing was written. This arbiter stops: start it again to rejoin as a standby"
    )]
    Fenced { mine: i64, current: i64 },
}

impl StoreError {
    /// Maps the exclusion-constraint violation on `lease_gpus` to its own variant.
    fn from_write(error: sqlx::Error) -> Self {
        const EXCLUSION_VIOLATION: &str = "23P01";
        if let Some(db) = error.as_database_error() {
            if db.code().as_deref() == Some(EXCLUSION_VIOLATION) {
                let gpu = db
                    .message()
                    .split_once("gpu_id)=(")
                    .and_then(|(_, rest)| rest.split(',').next())
                    .unwrap_or("?");
                return Self::GpuDoubleLeased { gpu: gpu.into() };
            }
        }
        Self::Database(error)
    }
}

/// How every connection of an arbiter connects. A session left in a transaction by an arbiter
/// that stalled, or gone silent with its network, would hold the `leadership` row (or the
/// leader's lock) and keep a successor from taking over: Postgres ends the first after 3 s (the
/// writer never idles inside a transaction) and, with these TCP keepalives, the second within
/// about 3 s instead of the system's two hours.
pub(crate) fn connect_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    let options = PgConnectOptions::from_str(url).map_err(|source| connect_error(url, source))?;
    Ok(options.options([
        ("idle_in_transaction_session_timeout", "3s"),
        ("tcp_keepalives_idle", "1"),
        ("tcp_keepalives_interval", "1"),
        ("tcp_keepalives_count", "2"),
    ]))
}

pub(crate) fn connect_error(url: &str, source: sqlx::Error) -> StoreError {
    StoreError::Connect {
        url: redact_password(url),
        source,
    }
}

/// The database handle shared by the arbiter and the HTTP handlers.
#[derive(Debug, Clone)]
pub struct Store {
    pool: PgPool,
    /// The fencing epoch this arbiter leads with (`leadership.epoch`); unset on a standby.
    /// Shared by every clone: one process leads at most once.
    epoch: Arc<OnceLock<i64>>,
}

impl Store {
    /// Connects and brings the schema up to date (`migrations/`): what the service does.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let store = Self::connect_without_migrating(url).await?;
        sqlx::migrate!("../../migrations").run(&store.pool).await?;
        Ok(store)
    }

    /// Connects to a database the service has set up, changing nothing: for readers such as
    /// `agora audit replay`, which an auditor runs with `SELECT` rights only.
    pub async fn connect_without_migrating(url: &str) -> Result<Self, StoreError> {
        let options = connect_options(url)?;
        let pool = PgPoolOptions::new()
            .max_connections(16)
            .connect_with(options)
            .await
            .map_err(|source| connect_error(url, source))?;
        Ok(Self {
            pool,
            epoch: Arc::default(),
        })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// From now on this store writes as the leader of fencing epoch `epoch`. A process leads
    /// at most once (it stops when it loses the lead), so a second call changes nothing.
    pub fn lead(&self, epoch: i64) {
        let _ = self.epoch.set(epoch);
    }

    /// A transaction that may write: it holds `leadership`'s row FOR SHARE and goes on only
    /// while the epoch is still this arbiter's, so an arbiter that lost the lead writes
    /// nothing, and a successor's takeover waits for it to end.
    pub async fn begin_write(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        let mine = *self.epoch.get().ok_or(StoreError::NotLeader)?;
        let mut tx = self.pool.begin().await?;
        let current = sqlx::query_scalar!("SELECT epoch FROM leadership FOR SHARE")
            .fetch_one(&mut *tx)
            .await?;
        if current != mine {
            return Err(StoreError::Fenced { mine, current });
        }
        Ok(tx)
    }
}

/// The database id of an app from the engine's id (its decimal text).
pub fn app_key(app: &AppId) -> Result<AppKey, StoreError> {
    AppKey::try_from(app).map_err(StoreError::Corrupt)
}

/// GPU ids as the `text[]` columns hold them.
pub(crate) fn gpu_texts(gpus: &[GpuId]) -> Vec<String> {
    gpus.iter().map(|gpu| gpu.0.clone()).collect()
}

/// GPU ids from a `text[]` column.
pub(crate) fn gpu_ids(texts: Vec<String>) -> Vec<GpuId> {
    texts.into_iter().map(GpuId).collect()
}

/// `postgres://user:secret@host/db` -> `postgres://user:***@host/db`, for error messages.
fn redact_password(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let credentials = &url[scheme + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_error_messages() {
        assert_eq!(
            redact_password("postgres://agora:hunter2@db:5432/agora"),
            "postgres://agora:***@db:5432/agora"
        );
        assert_eq!(
            redact_password("postgres://postgres@127.0.0.1/agora"),
            "postgres://postgres@127.0.0.1/agora"
        );
    }

    #[test]
    fn app_ids_are_database_ids() {
        assert_eq!(app_key(&AppId::from("42")).expect("numeric"), AppKey(42));
        assert!(app_key(&AppId::from("vision")).is_err());
    }
}
