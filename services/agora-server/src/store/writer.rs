//! The one writer of the arbiter's decisions, the apps that register and the frameworks' bids. Jobs are written in the
//! order they were queued, many to a transaction (group commit): under load, one commit makes
//! durable everything that arrived while the previous one was in flight, instead of one fsync
//! and a handful of round trips per decision.
//!
//! The order is what makes this safe. The arbiter applies a decision to its memory when it
//! queues the decision's [`Commit`], and answers (and tells anyone) only once the writer says
//! it is durable; a bid queued before a round's outcome is in the database no later than that
//! outcome; a look-up sees every bid queued before it.

use std::future::Future;
use std::sync::Arc;

use agora_market::time::Timestamp;
use sqlx::{Postgres, Transaction};
use tokio::sync::{mpsc, oneshot};

use super::bid_rows::{insert_bids, BidSource, NewBid};
use super::writes::{insert_app, write_commit, NewApp};
use super::{Commit, Store, StoreError};
use crate::ids::{AppKey, BidId, RoundId};

/// Most jobs in one transaction: bounds a commit's size when a backlog builds up.
const MAX_BATCH: usize = 512;

/// What became of an app's registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppInsert {
    Stored(AppKey),
    /// The tenant already has an app of that name: nothing stored.
    DuplicateName,
}

/// What became of a framework's bid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BidInsert {
    Stored(BidId),
    /// A retry: the app's bid in the round has this `Idempotency-Key`; nothing stored, that
    /// bid's id.
    Replayed(BidId),
    /// The app already has a bid in the round: nothing stored.
    AlreadyBid,
}

type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

#[derive(Debug)]
enum Job {
    App(Box<NewApp>, Reply<AppInsert>),
    Bid(NewBid, Reply<BidInsert>),
    Lookup {
        round: RoundId,
        app: AppKey,
        key: String,
        reply: Reply<Option<BidId>>,
    },
    /// A decision, stamped `now`; handed back once durable.
    Decision(Box<Commit>, Timestamp, Reply<Box<Commit>>),
    /// Answered once every job queued before it has been written (or has failed).
    Flush(oneshot::Sender<()>),
}

/// The handle to the writer; cheap to clone. The task ends when every handle is dropped.
#[derive(Debug, Clone)]
pub struct Writer {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Writer {
    /// Starts the writer on a thread of its own: talking to Postgres costs CPU (the loopback's
    /// network stack included) that the arbiter's thread needs for deciding.
    pub fn spawn(store: Store) -> Self {
        let (jobs, queue) = mpsc::unbounded_channel();
        actix::Arbiter::new().spawn(write_jobs(store, queue));
        Self { jobs }
    }

    // Each method queues its job before it returns, so jobs keep the order of the calls even
    // when their answers are awaited later.

    /// Stores a new app and its jobs, answering once they are committed.
    pub fn insert_app(
        &self,
        app: NewApp,
    ) -> impl Future<Output = Result<AppInsert, StoreError>> + use<> {
        let (reply, answer) = oneshot::channel();
        let queued = self.queue(Job::App(Box::new(app), reply));
        async move { answered(queued, answer).await? }
    }

    /// Stores a framework's bid, answering once it is committed.
    pub fn insert_bid(
        &self,
        bid: NewBid,
    ) -> impl Future<Output = Result<BidInsert, StoreError>> + use<> {
        let (reply, answer) = oneshot::channel();
        let queued = self.queue(Job::Bid(bid, reply));
        async move { answered(queued, answer).await? }
    }

    /// The bid `app` posted in `round` with `Idempotency-Key` `key`, including bids queued
    /// before this call.
    pub fn bid_with_key(
        &self,
        round: RoundId,
        app: AppKey,
        key: String,
    ) -> impl Future<Output = Result<Option<BidId>, StoreError>> + use<> {
        let (reply, answer) = oneshot::channel();
        let queued = self.queue(Job::Lookup {
            round,
            app,
            key,
            reply,
        });
        async move { answered(queued, answer).await? }
    }

    /// Writes a decision after everything queued before it; answers with the decision once it
    /// is durable. `now` stamps its lease and app events.
    pub fn commit(
        &self,
        commit: Commit,
        now: Timestamp,
    ) -> impl Future<Output = Result<Commit, StoreError>> + use<> {
        let (reply, answer) = oneshot::channel();
        let queued = self.queue(Job::Decision(Box::new(commit), now, reply));
        async move { answered(queued, answer).await?.map(|commit| *commit) }
    }

    /// Resolves once every job queued before this call has been written or has failed: after
    /// it, nothing queued earlier can still reach the database.
    pub fn flush(&self) -> impl Future<Output = ()> + use<> {
        let (done, flushed) = oneshot::channel();
        let queued = self.queue(Job::Flush(done));
        async move {
            if queued {
                // A writer that stopped has nothing left to write either.
                let _ = flushed.await;
            }
        }
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

/// Writes the jobs in batches, in order. Once a batch fails, every later job fails with its
/// error unwritten: later decisions were made on the state the failed one left in memory, so
/// the database keeps an exact prefix of the decisions (the arbiter stops on the failure and a
/// restart restores that prefix).
async fn write_jobs(store: Store, mut queue: mpsc::UnboundedReceiver<Job>) {
    let mut failed: Option<Arc<StoreError>> = None;
    while let Some(first) = queue.recv().await {
        if let Some(error) = &failed {
            first.fail(error);
            continue;
        }
        let mut jobs = vec![first];
        while jobs.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        failed = write_batch(&store, jobs).await.err();
    }
}

/// A job taken into the batch: where its answer goes, and the answer once known.
enum Taken {
    App(Reply<AppInsert>, Option<AppInsert>),
    Bid(Reply<BidInsert>, Option<BidInsert>),
    Lookup(Reply<Option<BidId>>, Option<Option<BidId>>),
    Decision(Reply<Box<Commit>>, Box<Commit>),
    Flush(oneshot::Sender<()>),
}

/// Writes `jobs` in order in one transaction and answers each once it is committed; if any
/// fails, nothing is written and every job gets the error, which is returned.
async fn write_batch(store: &Store, jobs: Vec<Job>) -> Result<(), Arc<StoreError>> {
    let mut taken = Vec::with_capacity(jobs.len());
    let mut pending = jobs.into_iter().peekable();
    match write_in_order(store, &mut pending, &mut taken).await {
        Ok(()) => {
            taken.into_iter().for_each(Taken::succeed);
            Ok(())
        }
        Err(error) => {
            let error = Arc::new(error);
            taken.into_iter().for_each(|job| job.fail(&error));
            // Jobs not reached when the batch failed.
            pending.for_each(|job| job.fail(&error));
            Err(error)
        }
    }
}

impl Taken {
    fn succeed(self) {
        match self {
            Self::App(reply, Some(result)) => drop(reply.send(Ok(result))),
            Self::Bid(reply, Some(result)) => drop(reply.send(Ok(result))),
            Self::Lookup(reply, Some(result)) => drop(reply.send(Ok(result))),
            Self::Decision(reply, commit) => drop(reply.send(Ok(commit))),
            Self::Flush(done) => drop(done.send(())),
            // Only a failed statement leaves an answer unknown, and then the batch failed.
            Self::App(reply, None) => drop(reply.send(Err(StoreError::WriterStopped))),
            Self::Bid(reply, None) => drop(reply.send(Err(StoreError::WriterStopped))),
            Self::Lookup(reply, None) => drop(reply.send(Err(StoreError::WriterStopped))),
        }
    }

    fn fail(self, error: &Arc<StoreError>) {
        match self {
            Self::App(reply, _) => send_failure(reply, error),
            Self::Bid(reply, _) => send_failure(reply, error),
            Self::Lookup(reply, _) => send_failure(reply, error),
            Self::Decision(reply, _) => send_failure(reply, error),
            Self::Flush(done) => drop(done.send(())),
        }
    }
}

impl Job {
    fn fail(self, error: &Arc<StoreError>) {
        match self {
            Self::App(_, reply) => send_failure(reply, error),
            Self::Bid(_, reply) => send_failure(reply, error),
            Self::Lookup { reply, .. } => send_failure(reply, error),
            Self::Decision(_, _, reply) => send_failure(reply, error),
            Self::Flush(done) => drop(done.send(())),
        }
    }
}

fn send_failure<T>(reply: Reply<T>, error: &Arc<StoreError>) {
    let _ = reply.send(Err(StoreError::Batch(error.clone())));
}

async fn write_in_order(
    store: &Store,
    pending: &mut std::iter::Peekable<std::vec::IntoIter<Job>>,
    taken: &mut Vec<Taken>,
) -> Result<(), StoreError> {
    let mut tx = store.begin_write().await?;
    while let Some(job) = pending.next() {
        match job {
            Job::App(app, reply) => {
                let inserted = insert_app(&mut tx, &app).await;
                let answer = inserted.as_ref().ok().map(|id| match id {
                    Some(id) => AppInsert::Stored(*id),
                    None => AppInsert::DuplicateName,
                });
                taken.push(Taken::App(reply, answer));
                inserted.map_err(StoreError::from_write)?;
            }
            Job::Bid(bid, reply) => {
                // Consecutive bids go in together: one statement for all their rows.
                let mut bids = vec![bid];
                let mut replies = vec![reply];
                while let Some(Job::Bid(..)) = pending.peek() {
                    if let Some(Job::Bid(bid, reply)) = pending.next() {
                        bids.push(bid);
                        replies.push(reply);
                    }
                }
                match insert_framework_bids(&mut tx, &bids).await {
                    Ok(results) => taken.extend(
                        replies
                            .into_iter()
                            .zip(results)
                            .map(|(reply, result)| Taken::Bid(reply, Some(result))),
                    ),
                    Err(error) => {
                        taken.extend(replies.into_iter().map(|reply| Taken::Bid(reply, None)));
                        return Err(error);
                    }
                }
            }
            Job::Lookup {
                round,
                app,
                key,
                reply,
            } => {
                let found = bid_with_key(&mut tx, round, app, &key).await;
                taken.push(Taken::Lookup(reply, found.as_ref().ok().copied()));
                found?;
            }
            Job::Decision(commit, now, reply) => {
                let written = write_commit(&mut tx, &commit, now).await;
                taken.push(Taken::Decision(reply, commit));
                written.map_err(StoreError::from_write)?;
            }
            // Answered with the batch: when it commits or fails, all before it has.
            Job::Flush(done) => taken.push(Taken::Flush(done)),
        }
    }
    tx.commit().await.map_err(StoreError::from_write)
}

/// Stores framework bids; a bid whose app already has one in the round is skipped and
/// answered as a retry (same key) or a second bid.
async fn insert_framework_bids(
    tx: &mut Transaction<'_, Postgres>,
    bids: &[NewBid],
) -> Result<Vec<BidInsert>, StoreError> {
    let ids = insert_bids(tx, bids, BidSource::Framework).await?;
    let mut results = Vec::with_capacity(bids.len());
    for (bid, id) in bids.iter().zip(ids) {
        results.push(match (id, &bid.idempotency_key) {
            (Some(id), _) => BidInsert::Stored(id),
            (None, Some(key)) => match bid_with_key(tx, bid.round, bid.app, key).await? {
                Some(id) => BidInsert::Replayed(id),
                None => BidInsert::AlreadyBid,
            },
            (None, None) => BidInsert::AlreadyBid,
        });
    }
    Ok(results)
}

async fn bid_with_key(
    tx: &mut Transaction<'_, Postgres>,
    round: RoundId,
    app: AppKey,
    key: &str,
) -> Result<Option<BidId>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT id AS "id: BidId" FROM bids
           WHERE round_id = $1 AND app_id = $2 AND idempotency_key = $3"#,
        round.0,
        app.0,
        key
    )
    .fetch_optional(&mut **tx)
    .await
}
