//! Replaying rounds: the inputs a round records, written as JSON and read back, give exactly
//! the decision the market made; tampered inputs do not.

use agora_market::leftover::LeftoverPolicy;
use agora_market::market::{Market, MarketError, RoundOutcome};
use agora_market::round::{decide_round, Grants, RoundInputs};
use proptest::prelude::*;

use crate::support::{play, scenario, Scenario};

/// What an auditor reads back from storage.
fn stored(inputs: &RoundInputs) -> RoundInputs {
    let json = serde_json::to_string(inputs).expect("round inputs serialise");
    serde_json::from_str(&json).expect("stored round inputs read back")
}

/// The GPUs of the round's leases, by app.
fn leased(market: &Market, outcome: &RoundOutcome) -> Grants {
    outcome
        .leases
        .iter()
        .map(|lease| {
            let gpus = lease.gpus.iter();
            let ids = gpus.map(|&gpu| market.cluster().gpu(gpu).id.clone());
            (lease.app.clone(), ids.collect())
        })
        .collect()
}

fn random_leftovers() -> impl Strategy<Value = Scenario> {
    scenario().prop_map(|scenario| Scenario {
        leftover_policy: LeftoverPolicy::RandomToNonBidders,
        ..scenario
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random leftovers replay exactly; re-auctioned ones are refused, not replayed wrongly.
    #[test]
    fn stored_inputs_replay_the_round(scenario in scenario()) {
        play(&scenario, |market, _departed, now, seed| {
            let Some(outcome) = market.run_round(now, seed) else { return Ok(()) };
            let outcome = outcome.expect("valid round");
            let recorded = outcome.inputs().expect("a Themis round records its inputs");
            let inputs = stored(&recorded);
            prop_assert_eq!(&inputs, &recorded);
            let replayed = decide_round(&inputs);
            if scenario.leftover_policy == LeftoverPolicy::ReauctionNextWorst {
                prop_assert_eq!(replayed, Err(MarketError::ReauctionNotReplayable));
                return Ok(());
            }
            let decision = replayed.expect("recorded inputs are valid");
            let auction = outcome.auction.as_ref().map(|record| &record.outcome);
            prop_assert_eq!(Some(&decision.auction), auction);
            prop_assert_eq!(&decision.leftover_grants, &outcome.leftover_grants);
            prop_assert_eq!(&decision.grants, &leased(market, &outcome));
            Ok(())
        })?;
    }

    /// Emptying the bid table of a bidder that kept GPUs changes the replayed decision.
    #[test]
    fn a_tampered_bid_changes_the_replay(scenario in random_leftovers()) {
        play(&scenario, |market, _departed, now, seed| {
            let Some(outcome) = market.run_round(now, seed) else { return Ok(()) };
            let inputs = outcome.expect("valid round").inputs().expect("a Themis round");
            let decision = decide_round(&inputs).expect("recorded inputs are valid");
            let allocation = &decision.auction.allocation;
            let Some(winner) = allocation.iter().find(|(_, gpus)| !gpus.is_empty()).map(|(app, _)| app) else {
                return Ok(());
            };
            let mut tampered = inputs.clone();
            for bid in tampered.bids.iter_mut().filter(|bid| &bid.app == winner) {
                bid.bids.clear();
            }
            prop_assert_ne!(decide_round(&tampered), Ok(decision));
            Ok(())
        })?;
    }
}
