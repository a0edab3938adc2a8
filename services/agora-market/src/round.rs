//! A Themis round's decision (the auction and the leftovers) as a pure function of inputs that
//! can be stored: the live service records every round's [`RoundInputs`], and an auditor
//! recomputes ("replays") the decision with [`decide_round`].

use std::collections::{BTreeMap, BTreeSet, HashSet};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::app::AppId;
use crate::auction::{run_auction, AppBid, AuctionOutcome, Offer, OfferedGpu};
use crate::error::MarketError;
use crate::leftover::{hand_out_at_random, hand_out_in_order, LeftoverPolicy, Recipient};
use crate::rho::RhoOld;
use crate::time::Timestamp;
use crate::topology::{GpuId, GpuLocation};

/// GPUs given to each app.
pub type Grants = BTreeMap<AppId, Vec<GpuId>>;

/// An app's standing when a round opens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Standing {
    pub app: AppId,
    pub rho: RhoOld,
    pub unmet_demand: usize,
}

/// Everything a round's decision depends on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundInputs {
    pub now: Timestamp,
    /// Seeds the auction's rounding and the leftover hand-out.
    pub seed: u64,
    pub offer: Offer,
    /// The apps invited to bid, worst rho first.
    pub bidders: Vec<AppId>,
    /// Every active app, worst rho first.
    pub standings: Vec<Standing>,
    /// Where each app's leased GPUs are, so leftovers go near them. Apps holding nothing may
    /// be left out.
    pub holds: BTreeMap<AppId, Vec<GpuLocation>>,
    /// Offered GPUs whose lease each app held until this round (its claim to renew them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<AppId, Vec<GpuId>>,
    pub bids: Vec<AppBid>,
    pub leftover_policy: LeftoverPolicy,
    /// Apps of the standings that left the market (finished or withdrawn) before the round
    /// was decided: their bids are withdrawn and they receive nothing, so what they would
    /// have won goes to the others (as leftovers when no bidder wins it). One app leaving
    /// never stops a round for everyone else.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub departed: BTreeSet<AppId>,
}

/// What a round decided, before any lease is granted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundDecision {
    pub auction: AuctionOutcome,
    /// GPUs handed out after the auction, by the leftover policy and then to any app with
    /// unmet demand so that no offered GPU stays idle.
    pub leftover_grants: Grants,
    /// Everything each app gets this round: what it keeps from the auction plus its leftovers.
    pub grants: Grants,
}

/// Decides a round from its recorded inputs: the same inputs always give the same decision.
/// Fails on a bid from an app that was not invited, on invalid bids, and on the re-auction
/// leftover policy, whose leftover bids come from the engine's agents rather than the inputs.
pub fn decide_round(inputs: &RoundInputs) -> Result<RoundDecision, MarketError> {
    match inputs.leftover_policy {
        LeftoverPolicy::WorstFirst => decide_with(inputs, |leftover, non_bidders| {
            Ok(hand_out_in_order(leftover, &non_bidders))
        }),
        LeftoverPolicy::RandomToNonBidders => decide_with(inputs, |leftover, non_bidders| {
            let mut rng = ChaCha8Rng::seed_from_u64(inputs.seed ^ LEFTOVER_STREAM);
            Ok(hand_out_at_random(leftover, non_bidders, &mut rng))
        }),
        LeftoverPolicy::ReauctionNextWorst => Err(MarketError::ReauctionNotReplayable),
    }
}

/// The decision, with the leftover policy's step (handing `leftover` out to the non-bidders
/// that still want GPUs, worst rho first) supplied by the caller.
pub(crate) fn decide_with(
    inputs: &RoundInputs,
    hand_out_by_policy: impl FnOnce(&mut Vec<OfferedGpu>, Vec<Recipient>) -> Result<Grants, MarketError>,
) -> Result<RoundDecision, MarketError> {
    if let Some(bid) = inputs
        .bids
        .iter()
        .find(|bid| !inputs.bidders.contains(&bid.app))
    {
        return Err(MarketError::NotABidder(bid.app.clone()));
    }
    let present = |app: &AppId| !inputs.departed.contains(app);
    // Identical bids from apps that differ are told apart by the standings (worst off first,
    // then what the apps are), not by their ids.
    let mut bids: Vec<AppBid> = inputs
        .bids
        .iter()
        .filter(|bid| present(&bid.app))
        .cloned()
        .collect();
    bids.sort_by_key(|bid| inputs.bidders.iter().position(|app| *app == bid.app));
    let auction = run_auction(&inputs.offer, &bids, inputs.seed)?;
    let mut leftover = offered_subset(&inputs.offer, &auction.unallocated);
    let mut grants: Grants = auction
        .allocation
        .iter()
        .filter(|(_, gpus)| !gpus.is_empty())
        .map(|(app, gpus)| (app.clone(), gpus.clone()))
        .collect();
    let non_bidders = recipients(inputs, &grants, |app| {
        present(app) && !inputs.bidders.contains(app)
    });
    let mut leftover_grants = hand_out_by_policy(&mut leftover, non_bidders)?;
    merge(&mut grants, leftover_grants.clone());
    let sweep = hand_out_in_order(&mut leftover, &recipients(inputs, &grants, present));
    merge(&mut leftover_grants, sweep.clone());
    merge(&mut grants, sweep);
    Ok(RoundDecision {
        auction,
        leftover_grants,
        grants,
    })
}

/// Apps chosen by `eligible` that still want GPUs after `grants`, worst rho first.
fn recipients(
    inputs: &RoundInputs,
    grants: &Grants,
    eligible: impl Fn(&AppId) -> bool,
) -> Vec<Recipient> {
    inputs
        .standings
        .iter()
        .filter(|standing| eligible(&standing.app))
        .filter_map(|standing| {
            let got = grants.get(&standing.app).map_or(0, Vec::len);
            let unmet_demand = standing.unmet_demand.saturating_sub(got);
            (unmet_demand > 0).then(|| {
                let claimed = inputs
                    .claims
                    .get(&standing.app)
                    .cloned()
                    .unwrap_or_default();
                let granted = grants.get(&standing.app).map_or(&[][..], Vec::as_slice);
                // Near what it holds, what it claims and what it got earlier in this round.
                let mut holds = inputs.holds.get(&standing.app).cloned().unwrap_or_default();
                holds.extend(
                    inputs
                        .offer
                        .gpus
                        .iter()
                        .filter(|gpu| claimed.contains(&gpu.id) || granted.contains(&gpu.id))
                        .map(|gpu| gpu.location),
                );
                Recipient {
                    app: standing.app.clone(),
                    unmet_demand,
                    holds,
                    claimed,
                }
            })
        })
        .collect()
}

/// Separates the leftover RNG stream from the auction's, which uses the seed as it is.
const LEFTOVER_STREAM: u64 = 0x9E37_79B9_7F4A_7C15;

/// The GPUs of `offer` named in `ids`, in offer order.
pub(crate) fn offered_subset(offer: &Offer, ids: &[GpuId]) -> Vec<OfferedGpu> {
    let wanted: HashSet<&GpuId> = ids.iter().collect();
    offer
        .gpus
        .iter()
        .filter(|gpu| wanted.contains(&gpu.id))
        .cloned()
        .collect()
}

pub(crate) fn merge(into: &mut Grants, from: Grants) {
    for (app, gpus) in from {
        into.entry(app).or_default().extend(gpus);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auction::BidEntry;
    use crate::rho::Rho;

    fn rho(value: f64) -> Rho {
        Rho::new(value).expect("a valid rho")
    }

    fn bid(app: &str, rho_with_gpu: f64) -> AppBid {
        AppBid {
            app: AppId::from(app),
            rho_old: Some(rho(2.0)),
            bids: vec![BidEntry {
                gpus: vec![GpuId::from("g0")],
                rho: rho(rho_with_gpu),
            }],
        }
    }

    /// Two apps bid for one GPU; `a` gains more from it.
    fn contest() -> RoundInputs {
        let standing = |app: &str| Standing {
            app: AppId::from(app),
            rho: Some(rho(2.0)),
            unmet_demand: 1,
        };
        RoundInputs {
            now: Timestamp(0),
            seed: 3,
            offer: Offer::without_topology([GpuId::from("g0")]),
            bidders: vec![AppId::from("a"), AppId::from("b")],
            standings: vec![standing("a"), standing("b")],
            holds: BTreeMap::new(),
            claims: BTreeMap::new(),
            bids: vec![bid("a", 1.0), bid("b", 1.5)],
            leftover_policy: LeftoverPolicy::RandomToNonBidders,
            departed: BTreeSet::new(),
        }
    }

    #[test]
    fn a_departed_bidder_is_withdrawn_and_its_share_goes_to_the_others() {
        let mut inputs = contest();
        let decision = decide_round(&inputs).expect("valid inputs");
        assert!(decision.grants.contains_key(&AppId::from("a")));
        inputs.departed.insert(AppId::from("a"));
        let decision = decide_round(&inputs).expect("a departed app does not stop the round");
        assert_eq!(
            decision.grants,
            Grants::from([(AppId::from("b"), vec![GpuId::from("g0")])]),
            "the departed app gets nothing, the one left gets what it would have won"
        );
        assert!(!decision.auction.pf.contains_key(&AppId::from("a")));
    }

    #[test]
    fn a_departed_app_gets_no_leftovers() {
        let mut inputs = contest();
        inputs.bids.clear();
        inputs.bidders.clear();
        inputs.departed.insert(AppId::from("a"));
        let decision = decide_round(&inputs).expect("valid inputs");
        assert_eq!(
            decision.grants,
            Grants::from([(AppId::from("b"), vec![GpuId::from("g0")])])
        );
    }

    #[test]
    fn a_changed_rho_changes_the_decision() {
        let pf_winner = |inputs: &RoundInputs| {
            let decision = decide_round(inputs).expect("valid inputs");
            let pf = decision.auction.pf;
            pf.into_iter().find_map(|(app, bundle)| bundle.map(|_| app))
        };
        let mut inputs = contest();
        assert_eq!(pf_winner(&inputs), Some(AppId::from("a")));
        inputs.bids[1] = bid("b", 0.5);
        assert_eq!(pf_winner(&inputs), Some(AppId::from("b")));
    }

    #[test]
    fn only_invited_apps_may_bid() {
        let mut inputs = contest();
        inputs.bidders.pop();
        assert_eq!(
            decide_round(&inputs),
            Err(MarketError::NotABidder(AppId::from("b")))
        );
    }

    #[test]
    fn reauctioned_leftovers_are_not_replayed() {
        let inputs = RoundInputs {
            leftover_policy: LeftoverPolicy::ReauctionNextWorst,
            ..contest()
        };
        assert_eq!(
            decide_round(&inputs),
            Err(MarketError::ReauctionNotReplayable)
        );
    }
}
