//! Which of the arbiters sharing one database leads. The leader holds a session-level
//! advisory lock on a connection of its own, which Postgres releases when that session ends
//! (the process killed, its connection lost), and leads under a fencing epoch: taking over
//! increments `leadership.epoch`, and every write transaction checks that the epoch is still
//! its own ([`crate::store::Store::begin_write`]). The others wait on the lock as standbys.

use std::time::Duration;

use actix::Addr;
use sqlx::{ConnectOptions as _, Connection, PgConnection};
use tokio::sync::watch;

use crate::actors::arbiter::Arbiter;
use crate::store::{connect_error, connect_options, StoreError};

/// The advisory lock the leader holds: "agora" in ASCII. Advisory locks are per database, so
/// arbiters of different databases on one server do not meet.
const LEADER_LOCK: i64 = 0x61_67_6f_72_61;

/// How often the leader checks that its lock's session is alive, and how long a check may take
/// before the leader counts the lock as lost.
const LOCK_CHECK_PERIOD: Duration = Duration::from_millis(500);
const LOCK_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Whether this arbiter leads (and then its arbiter actor), shared by the HTTP handlers and
/// the start-up; cheap to clone.
#[derive(Debug, Clone)]
pub struct Leadership {
    arbiter: watch::Sender<Option<Addr<Arbiter>>>,
}

impl Default for Leadership {
    fn default() -> Self {
        Self {
            arbiter: watch::Sender::new(None),
        }
    }
}

impl Leadership {
    /// The arbiter actor when this arbiter leads; `None` on a standby.
    pub fn arbiter(&self) -> Option<Addr<Arbiter>> {
        self.arbiter.borrow().clone()
    }

    /// Waits until this arbiter leads.
    pub async fn leading(&self) -> Addr<Arbiter> {
        let mut changes = self.arbiter.subscribe();
        let arbiter = changes
            .wait_for(Option::is_some)
            .await
            .expect("the sender lives in self");
        arbiter.clone().expect("waited for Some")
    }

    pub(crate) fn lead(&self, arbiter: Addr<Arbiter>) {
        self.arbiter.send_replace(Some(arbiter));
    }
}

/// The connection that holds (or waits for) the leader's lock. Dropping it ends the session,
/// which releases the lock.
#[derive(Debug)]
pub struct LeaderLock {
    connection: PgConnection,
}

impl LeaderLock {
    /// Connects as the pool does (`store::connect_options`: a leader gone silent loses its
    /// session, and so the lock, within about 3 s).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        // Waiting for the lock is what a standby does: not a slow statement to warn about.
        let options = connect_options(url)?.disable_statement_logging();
        let connection = PgConnection::connect_with(&options)
            .await
            .map_err(|source| connect_error(url, source))?;
        Ok(Self { connection })
    }

    /// Takes the lock if no one holds it.
    pub async fn try_acquire(&mut self) -> Result<bool, StoreError> {
        let taken = sqlx::query_scalar!(
            r#"SELECT pg_try_advisory_lock($1) AS "taken!""#,
            LEADER_LOCK
        )
        .fetch_one(&mut self.connection)
        .await?;
        Ok(taken)
    }

    /// Waits until the lock is free and takes it: Postgres grants it the moment the holder's
    /// session ends.
    pub async fn acquire(&mut self) -> Result<(), StoreError> {
        // `pg_advisory_lock` returns `void`, which the checked macros cannot type.
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(LEADER_LOCK)
            .execute(&mut self.connection)
            .await?;
        Ok(())
    }

    /// With the lock held: the next fencing epoch, recorded with the URL standbys send
    /// writers to. Waits for write transactions of the previous leader still in flight.
    pub async fn claim(&mut self, url: &str) -> Result<i64, StoreError> {
        let epoch = sqlx::query_scalar!(
            "UPDATE leadership SET epoch = epoch + 1, leader_url = $1, since = now()
             RETURNING epoch",
            url
        )
        .fetch_one(&mut self.connection)
        .await?;
        Ok(epoch)
    }

    /// Returns (with the reason) once the lock's session is no longer known to be alive.
    pub async fn lost(&mut self) -> String {
        let mut checks = tokio::time::interval(LOCK_CHECK_PERIOD);
        loop {
            checks.tick().await;
            match tokio::time::timeout(LOCK_CHECK_TIMEOUT, self.connection.ping()).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return format!("lost the leader's lock connection: {error}"),
                Err(_) => {
                    return format!(
                        "the leader's lock connection did not answer within {LOCK_CHECK_TIMEOUT:?}"
                    )
                }
            }
        }
    }
}
