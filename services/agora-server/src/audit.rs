//! `agora audit replay`: recompute a stored round with the engine from its stored inputs (offer,
//! standings, holdings, every bid row, seed) and compare with the stored outcome, row by row;
//! and divide the machines' CPUs and memory again from the round's record of them and compare
//! with what each lease had after the round.

use std::collections::{BTreeSet, HashMap};

use agora_market::auction::Offer;
use agora_market::division::DivisionRecord;
use agora_market::leftover::LeftoverPolicy;
use agora_market::market::Standing;
use agora_market::round::{decide_round, RoundInputs};
use agora_market::topology::{GpuId, GpuLocation};
use anyhow::{bail, Context as _};
use serde::Serialize;

use crate::actors::records::allocation_rows_of;
use crate::clock::from_datetime;
use crate::ids::{AppKey, LeaseKey, RoundId};
use crate::server::app_bid;
use crate::store::{AllocationRow, Store, StoredRound};

/// The verdict on one round.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replay {
    pub round: RoundId,
    pub matches: bool,
    /// What differs, in words; empty when it matches.
    pub differences: Vec<String>,
}

/// Replays round `round`. Fails if it is not stored or not closed.
pub async fn replay_round(store: &Store, round: RoundId) -> anyhow::Result<Replay> {
    let stored = store
        .stored_round(round)
        .await?
        .with_context(|| format!("round {round} is not in the database"))?;
    if stored.status != "closed" {
        bail!(
            "round {round} is {}; only closed rounds have an outcome to check",
            stored.status
        );
    }
    let mut differences = Vec::new();
    if stored.engine_version != agora_market::ENGINE_VERSION {
        differences.push(format!(
            "decided by engine {}, replayed with engine {}",
            stored.engine_version,
            agora_market::ENGINE_VERSION
        ));
    }
    let inputs = inputs_of(&stored)?;
    let decision = decide_round(&inputs).with_context(|| format!("replaying round {round}"))?;
    let expected = allocation_rows_of(Some(&decision.auction), &decision.leftover_grants)?;
    compare_rows(&expected, &stored.allocations, &mut differences);
    let granted: BTreeSet<&GpuId> = decision.grants.values().flatten().collect();
    let unallocated: Vec<GpuId> = inputs
        .offer
        .ids()
        .filter(|gpu| !granted.contains(gpu))
        .cloned()
        .collect();
    if unallocated != stored.unallocated {
        differences.push(format!(
            "unallocated GPUs: replay {unallocated:?}, stored {:?}",
            stored.unallocated
        ));
    }
    if let Some(division) = &stored.resource_division {
        let record: DivisionRecord = serde_json::from_value(division.clone())
            .context("stored division of CPUs and memory")?;
        let had = store.lease_resources_after(round).await?;
        compare_lease_resources(&record, &had, &mut differences);
    }
    Ok(Replay {
        round,
        matches: differences.is_empty(),
        differences,
    })
}

fn inputs_of(stored: &StoredRound) -> anyhow::Result<RoundInputs> {
    let offer: Offer = serde_json::from_value(stored.offer.clone()).context("stored offer")?;
    let standings: Vec<Standing> =
        serde_json::from_value(stored.standings.clone()).context("stored standings")?;
    let holds: std::collections::BTreeMap<_, Vec<GpuLocation>> =
        serde_json::from_value(stored.holds.clone()).context("stored holdings")?;
    let claims = serde_json::from_value(stored.claims.clone()).context("stored claims")?;
    let leftover_policy: LeftoverPolicy =
        serde_json::from_value(serde_json::Value::String(stored.leftover_policy.clone()))
            .context("stored leftover policy")?;
    Ok(RoundInputs {
        now: from_datetime(stored.opened_at),
        seed: stored.seed.parse().context("stored seed")?,
        offer,
        bidders: stored.bidders.iter().map(|&app| app.into()).collect(),
        standings,
        holds,
        claims,
        bids: stored
            .bids
            .iter()
            .map(app_bid)
            .collect::<anyhow::Result<_>>()?,
        leftover_policy,
        departed: stored.departed.iter().map(|&app| app.into()).collect(),
    })
}

/// Each lease's CPUs and memory divided again from `record`, against what it `had` after the
/// round.
fn compare_lease_resources(
    record: &DivisionRecord,
    had: &HashMap<LeaseKey, (Option<f64>, Option<f64>)>,
    differences: &mut Vec<String>,
) {
    for (lease, amounts) in record.lease_resources() {
        let lease = LeaseKey::from(lease);
        let replayed = (amounts.cpus, amounts.memory_gib);
        match had.get(&lease) {
            Some(&stored) if stored == replayed => {}
            Some(&(cpus, memory_gib)) => differences.push(format!(
                "lease {lease}: replay {:?} CPUs and {:?} GiB, stored {cpus:?} and {memory_gib:?}",
                replayed.0, replayed.1
            )),
            None => differences.push(format!(
                "lease {lease}: replay {:?} CPUs and {:?} GiB, stored none",
                replayed.0, replayed.1
            )),
        }
    }
}

fn compare_rows(
    expected: &[AllocationRow],
    stored: &[AllocationRow],
    differences: &mut Vec<String>,
) {
    if expected == stored {
        return;
    }
    let apps: BTreeSet<AppKey> = expected.iter().chain(stored).map(|row| row.app).collect();
    for app in apps {
        let replayed = expected.iter().find(|row| row.app == app);
        let recorded = stored.iter().find(|row| row.app == app);
        if replayed != recorded {
            differences.push(format!(
                "app {app}: replay {replayed:?}, stored {recorded:?}"
            ));
        }
    }
}
