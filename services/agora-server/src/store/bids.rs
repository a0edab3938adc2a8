//! Bids posted by frameworks, stored by one writer task that commits many at once (group
//! commit): under load, one transaction acknowledges every bid that arrived while the previous
//! one was in flight, instead of one fsync and seven round trips per bid.
//!
//! The writer handles its jobs in order, so a look-up or a flush sees every bid queued before
//! it: a retry finds the bid it repeats, and the arbiter closes a round only after all the
//! round's accepted bids are committed.

use std::future::Future;
use std::sync::Arc;

use agora_market::auction::AppBid;
use agora_market::time::Timestamp;
use sqlx::{Postgres, Transaction};
use tokio::sync::{mpsc, oneshot};

use super::{Store, StoreError};
use crate::clock::to_datetime;

/// Most bids in one transaction: bounds a commit's size when a backlog builds up.
const MAX_BATCH: usize = 512;

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
    pub round: i64,
    pub app: i64,
    pub bid: AppBid,
    pub idempotency_key: Option<String>,
    pub received_at: Timestamp,
}

/// What became of a framework's bid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BidInsert {
    Stored(i64),
    /// A retry: the app's bid in the round has this `Idempotency-Key`; nothing stored, that
    /// bid's id.
    Replayed(i64),
    /// The app already has a bid in the round: nothing stored.
    AlreadyBid,
}

/// A bid the arbiter accepted that did not make it into the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnstoredBid {
    pub round: i64,
    pub app: i64,
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

#[derive(Debug)]
enum Job {
    Insert(NewBid, Reply<BidInsert>),
    Lookup {
        round: i64,
        app: i64,
        key: String,
        reply: Reply<Option<i64>>,
    },
    Flush(oneshot::Sender<Vec<UnstoredBid>>),
}

/// The handle to the bid writer; cheap to clone. The task ends when every handle is dropped.
#[derive(Debug, Clone)]
pub struct BidWriter {
    jobs: mpsc::UnboundedSender<Job>,
}

impl BidWriter {
    /// Starts the writer on the current runtime.
    pub fn spawn(store: Store) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        tokio::spawn(write_bids(store, queue));
        Self { jobs }
    }

    // Each method queues its job before it returns, so jobs keep the order of the calls even
    // when their answers are awaited later.

    // Each method queues its job before it returns, so jobs keep the order of the calls even
    // when their answers are awaited later.

    /// Stores a framework's bid, answering once it is committed.
    pub fn insert(
        &self,
        bid: NewBid,
    ) -> impl Future<Output = Result<BidInsert, StoreError>> + use<> {
        let (reply, answer) = oneshot::channel();
        let queued = self.queue(Job::Insert(bid, reply));
        async move { answered(queued, answer).await? }
    }

    /// The bid `app` posted in `round` with `Idempotency-Key` `key`, including bids queued
    /// before this call.
    pub fn bid_with_key(
        &self,
        round: i64,
        app: i64,
        key: String,
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + use<> {
        let (reply, answer) = oneshot::channel();
        let queued = self.queue(Job::Lookup {
            round,
            app,
            key,
            reply,
        });
        async move { answered(queued, answer).await? }
    }

    /// Waits until every bid queued before this call is committed or has failed, and returns
    /// the ones that were not stored since the last flush.
    pub fn flush(&self) -> impl Future<Output = Result<Vec<UnstoredBid>, StoreError>> + use<> {
        let (reply, answer) = oneshot::channel();
        let queued = self.queue(Job::Flush(reply));
        answered(queued, answer)
    }

    fn queue(&self, job: Job) -> bool {
        self.jobs.send(job).is_ok()
    }
}

async fn answered<T>(queued: bool, answer: oneshot::Receiver<T>) -> Result<T, StoreError> {
    if !queued {
        return Err(StoreError::WriterStopped);
    }
    answer.await.map_err(|_| StoreError::WriterStopped)
}

async fn write_bids(store: Store, mut queue: mpsc::UnboundedReceiver<Job>) {
    let mut unstored = Vec::new();
    while let Some(first) = queue.recv().await {
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        run_batch(&store, jobs, &mut unstored).await;
    }
}

/// Inserts first (one transaction), then look-ups, then flushes: each sees the inserts queued
/// before it.
async fn run_batch(store: &Store, jobs: Vec<Job>, unstored: &mut Vec<UnstoredBid>) {
    let mut inserts = Vec::new();
    let mut lookups = Vec::new();
    let mut flushes = Vec::new();
    for job in jobs {
        match job {
            Job::Insert(bid, reply) => inserts.push((bid, reply)),
            Job::Lookup {
                round,
                app,
                key,
                reply,
            } => lookups.push((round, app, key, reply)),
            Job::Flush(reply) => flushes.push(reply),
        }
    }
    if !inserts.is_empty() {
        store_framework_bids(store, inserts, unstored).await;
    }
    for (round, app, key, reply) in lookups {
        let _ = reply.send(store.bid_with_key(round, app, &key).await);
    }
    for reply in flushes {
        let _ = reply.send(std::mem::take(unstored));
    }
}

async fn store_framework_bids(
    store: &Store,
    inserts: Vec<(NewBid, Reply<BidInsert>)>,
    unstored: &mut Vec<UnstoredBid>,
) {
    let bids: Vec<&NewBid> = inserts.iter().map(|(bid, _)| bid).collect();
    let results = match store.insert_framework_bids(&bids).await {
        Ok(results) => results.into_iter().map(Ok).collect(),
        Err(error) => {
            let error = Arc::new(error);
            vec![Err(error); inserts.len()]
        }
    };
    for ((bid, reply), result) in inserts.into_iter().zip(results) {
        let result = result.map_err(StoreError::Batch);
        if !matches!(result, Ok(BidInsert::Stored(_))) {
            unstored.push(UnstoredBid {
                round: bid.round,
                app: bid.app,
            });
        }
        let _ = reply.send(result);
    }
}

impl Store {
    /// Stores framework bids in one transaction; a bid whose app already bid in the round is
    /// skipped (the others are stored).
    async fn insert_framework_bids(&self, bids: &[&NewBid]) -> Result<Vec<BidInsert>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let ids = insert_bids(&mut tx, bids, BidSource::Framework).await?;
        let mut results = Vec::with_capacity(bids.len());
        for (bid, id) in bids.iter().zip(ids) {
            results.push(match (id, &bid.idempotency_key) {
                (Some(id), _) => BidInsert::Stored(id),
                (None, Some(key)) => match bid_with_key(&mut tx, bid.round, bid.app, key).await? {
                    Some(id) => BidInsert::Replayed(id),
                    None => BidInsert::AlreadyBid,
                },
                (None, None) => BidInsert::AlreadyBid,
            });
        }
        tx.commit().await?;
        Ok(results)
    }

    /// The bid `app` posted in `round` with `Idempotency-Key` `key`, if any.
    async fn bid_with_key(
        &self,
        round: i64,
        app: i64,
        key: &str,
    ) -> Result<Option<i64>, StoreError> {
        let mut connection = self.pool.acquire().await?;
        Ok(bid_with_key(&mut connection, round, app, key).await?)
    }
}

async fn bid_with_key(
    connection: &mut sqlx::PgConnection,
    round: i64,
    app: i64,
    key: &str,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        "SELECT id FROM bids WHERE round_id = $1 AND app_id = $2 AND idempotency_key = $3",
        round,
        app,
        key
    )
    .fetch_optional(connection)
    .await
}

/// Inserts `bids` and their entries with one statement each; returns each bid's id, `None`
/// where the app already had a bid in the round.
pub(super) async fn insert_bids(
    tx: &mut Transaction<'_, Postgres>,
    bids: &[&NewBid],
    source: BidSource,
) -> Result<Vec<Option<i64>>, sqlx::Error> {
    let rounds: Vec<i64> = bids.iter().map(|bid| bid.round).collect();
    let apps: Vec<i64> = bids.iter().map(|bid| bid.app).collect();
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
        "INSERT INTO bids (round_id, app_id, source, rho_old, idempotency_key, received_at)
         SELECT round_id, app_id, $3, rho_old, idempotency_key, received_at
         FROM unnest($1::bigint[], $2::bigint[], $4::float8[], $5::text[], $6::timestamptz[])
              AS new (round_id, app_id, rho_old, idempotency_key, received_at)
         ON CONFLICT (round_id, app_id) DO NOTHING
         RETURNING id, round_id, app_id",
        &rounds,
        &apps,
        source.as_str(),
        &rho_old as &[Option<f64>],
        &keys as &[Option<String>],
        &received
    )
    .fetch_all(&mut **tx)
    .await?;
    let ids: Vec<Option<i64>> = bids
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
    bids: &[&NewBid],
    ids: &[Option<i64>],
) -> Result<(), sqlx::Error> {
    let (mut bid_ids, mut entries, mut positions, mut gpus, mut rhos) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (bid, id) in bids.iter().zip(ids) {
        let Some(id) = id else { continue };
        for (entry, row) in bid.bid.bids.iter().enumerate() {
            for (position, gpu) in row.gpus.iter().enumerate() {
                bid_ids.push(*id);
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
