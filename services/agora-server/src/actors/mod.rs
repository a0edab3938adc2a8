//! The actors of the arbiter service, thin over the engine: the [`arbiter::Arbiter`] wraps the
//! engine's live state machine (`agora_market::live`) and commits what it decides,
//! [`agent::AppAgent`]s bid, the [`lease_manager::LeaseManager`] keeps time,
//! [`gpu_worker::GpuWorker`]s mirror GPU hosts, whose registrations and heartbeats [`hosts`]
//! handles.

pub mod agent;
pub mod arbiter;
pub mod gpu_worker;
pub mod hosts;
pub mod lease_manager;
pub(crate) mod records;
pub mod requests;
mod rounds;

use agora_market::auction::AuctionError;
use agora_market::progress::{ProgressError, SpeedChangeError};
use agora_market::throughput::ThroughputReportError;

use crate::ids::{AppKey, LeaseKey, RoundId};
use crate::store::StoreError;

/// Asks the arbiter to stop (and its lease manager with it).
#[derive(Debug, actix::Message)]
#[rtype(result = "()")]
pub struct Shutdown;

/// Why the arbiter refused a request. Each maps to one HTTP problem type (`api::problem`).
#[derive(Debug, thiserror::Error)]
pub enum ArbiterError {
    #[error("app {0} is not active: it finished, or it does not exist")]
    AppNotActive(AppKey),
    #[error("app {0} belongs to another tenant")]
    ForeignApp(AppKey),
    #[error("this tenant already has an app named {0:?}; pick another name")]
    DuplicateAppName(String),
    #[error("invalid app: {0}")]
    InvalidApp(String),
    #[error("invalid allocation: {0}")]
    InvalidAllocation(String),
    #[error("invalid progress report: {0}")]
    Progress(#[from] ProgressError),
    #[error("invalid throughput report: {0}")]
    Throughput(#[from] ThroughputReportError),
    #[error("invalid speed change: {0}")]
    SpeedChange(#[from] SpeedChangeError),
    #[error("round {0} does not exist")]
    UnknownRound(RoundId),
    #[error("round {0} no longer takes bids (its deadline passed); wait for the next offer")]
    RoundClosed(RoundId),
    #[error("app {app} was not offered GPUs in round {round}, so it cannot bid in it")]
    NotABidder { app: AppKey, round: RoundId },
    #[error("the bid table has {entries} entries; at most {limit} are allowed")]
    TableTooLarge { entries: usize, limit: usize },
    #[error("invalid bid: {0}")]
    InvalidBid(#[from] AuctionError),
    #[error("app {app} already bid in round {round}; a bid cannot be replaced (a retry with the same Idempotency-Key returns the first answer)")]
    AlreadyBid { app: AppKey, round: RoundId },
    #[error("Idempotency-Key {key:?} was used for app {app}'s bid in round {round} with a different bid; a retry must send the same request (use a new key for a different bid)")]
    IdempotencyKeyReused {
        key: String,
        app: AppKey,
        round: RoundId,
    },
    #[error("lease {0} is not active (it ended, or it does not exist)")]
    LeaseNotActive(LeaseKey),
    #[error("GPU {0:?} is not in the cluster")]
    UnknownGpu(String),
    #[error("host {0:?} is not registered; register it again (POST /v1/workers)")]
    UnknownHost(String),
    #[error("invalid registration: {0}")]
    InvalidRegistration(String),
    #[error("invalid heartbeat: {0}")]
    InvalidHeartbeat(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("internal error: {0}")]
    Internal(String),
}
