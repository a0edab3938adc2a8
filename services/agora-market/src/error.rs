//! The errors of the round-by-round mechanism ([`crate::market`]) and of the round's pure
//! decision ([`crate::round`]), in one place so that neither module depends on the other's.

use crate::app::AppId;
use crate::auction::AuctionError;
use crate::hosts::HostError;
use crate::lease::LeaseError;
use crate::shown::Shown;
use crate::topology::{GpuId, GpuIndex};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MarketError {
    #[error("the fairness knob f must lie in [0, 1), got {}", Shown(*.0))]
    InvalidFairnessKnob(f64),
    #[error("app {0} is already in the market")]
    DuplicateApp(AppId),
    /// The app's throughput table or sensitivity profile does not fit the cluster.
    #[error("app {0}: {1}")]
    Throughput(AppId, String),
    #[error(transparent)]
    ThroughputReport(#[from] crate::throughput::ThroughputReportError),
    #[error("app {0} is not in the market")]
    UnknownApp(AppId),
    #[error("app {0} was not offered GPUs in this round, so it cannot bid")]
    NotABidder(AppId),
    #[error("GPU {0} changed hands since the round was opened; open a new round")]
    StaleOffer(GpuId),
    #[error(
        "the reauction-next-worst leftover policy is only available to the simulator: its \
         leftover bids come from the engine's agents, not from the recorded round inputs; use \
         random-to-non-bidders for rounds that must be replayed"
    )]
    ReauctionNotReplayable,
    #[error(
        "GPU index {} is outside the cluster; restore leases onto the cluster that granted them",
        .0.0
    )]
    GpuOutsideCluster(GpuIndex),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Topology(#[from] crate::topology::TopologyError),
    #[error(transparent)]
    Auction(#[from] AuctionError),
}
