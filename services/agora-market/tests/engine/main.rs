//! The engine's integration tests, in one binary for link time.

mod adaptation;
mod auction;
mod baselines;
mod bids;
mod heterogeneous;
mod hosts;
mod live;
mod market;
mod progress;
mod replay;
mod resources;
mod restore;
mod support;
mod tune;
