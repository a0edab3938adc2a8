//! `AppAgent`: one per registered app, the Themis agent. On an offer it computes the app's bid
//! from the job information the framework reported (Figure 7), with the engine's bid
//! generator. For an app that bids explicitly, that bid is only the fallback the arbiter uses
//! if the framework's own bid does not arrive before the round's deadline.

use std::sync::Arc;

use actix::prelude::*;
use agora_market::app::AppId;
use agora_market::auction::AppBid;
use agora_market::bids::PreparedOffer;
pub use agora_market::live::Bidding;
use agora_market::live::RoundId;
use agora_market::market::BidInputs;

/// An offer to bid on, with the app's job information as the arbiter knows it now.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct BidRequest {
    pub round: RoundId,
    pub offer: Arc<PreparedOffer>,
    pub inputs: BidInputs,
    /// The round's bid collection, which the agent's work joins.
    pub span: tracing::Span,
}

/// The agent's answer to a [`BidRequest`].
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct AgentBid {
    pub round: RoundId,
    pub bid: AppBid,
    /// True when the framework bids itself and this bid only stands in for it.
    pub fallback: bool,
}

#[derive(Debug)]
pub struct AppAgent {
    app: AppId,
    bidding: Bidding,
    arbiter: Recipient<AgentBid>,
}

impl AppAgent {
    pub fn new(app: AppId, bidding: Bidding, arbiter: Recipient<AgentBid>) -> Self {
        Self {
            app,
            bidding,
            arbiter,
        }
    }
}

impl Actor for AppAgent {
    type Context = Context<Self>;
}

impl Handler<BidRequest> for AppAgent {
    type Result = ();

    fn handle(&mut self, request: BidRequest, _: &mut Self::Context) {
        let _span =
            tracing::info_span!(parent: &request.span, "agent_bid", app = %self.app).entered();
        let bid = request.inputs.bid(&request.offer);
        debug_assert_eq!(bid.app, self.app);
        self.arbiter.do_send(AgentBid {
            round: request.round,
            bid,
            fallback: self.bidding == Bidding::Explicit,
        });
    }
}
