//! Translation of the engine's decisions into what the store writes and what apps are told.
//! No decisions here: every function maps an engine value onto records.

use std::collections::{BTreeMap, BTreeSet};

use agora_market::app::AppId;
use agora_market::auction::{AppBid, AuctionOutcome};
use agora_market::lease::Lease;
use agora_market::live::{HostDown, Record};
use agora_market::market::{Market, RoundOffer, RoundOutcome, Withdrawal};
use agora_market::resources::total;
use agora_market::time::Timestamp;
use agora_market::topology::GpuId;
use serde_json::Value;

use super::ArbiterError;
use crate::clock::to_datetime;
use crate::ids::{AppKey, RoundId};
use crate::store::{
    app_key, AllocationRow, AppEvent, ClosedRound, Commit, EventPayload, HostStatusChange,
    LeaseEndedEvent, LeaseGrantedEvent, LeaseRecord, LeaseResources, OfferEvent, OfferedGpu,
    OpenedRound, RoundResultEvent, StandingRow,
};

pub fn lease_record(market: &Market, lease: &Lease) -> Result<LeaseRecord, ArbiterError> {
    Ok(LeaseRecord {
        id: lease.id.into(),
        app: app_key(&lease.app)?,
        gpus: lease
            .gpus
            .iter()
            .map(|&gpu| market.cluster().gpu(gpu).id.clone())
            .collect(),
        start: lease.start,
        end: lease.end,
        state: lease.state,
        ended_at: lease.ended_at,
    })
}

/// The opening of round `id`: its inputs, the standings, and an offer event for each bidder.
pub fn opened_round(
    market: &Market,
    id: RoundId,
    seed: u64,
    deadline: Timestamp,
    offer: &RoundOffer,
) -> Result<Commit, ArbiterError> {
    let bidders: BTreeSet<_> = offer.bidders.iter().collect();
    let standing_rows = offer
        .standings
        .iter()
        .map(|standing| {
            Ok(StandingRow {
                app: app_key(&standing.app)?,
                rho: standing.rho.map(f64::from),
                unmet_demand: standing.unmet_demand as i32,
                bidder: bidders.contains(&standing.app),
            })
        })
        .collect::<Result<Vec<_>, ArbiterError>>()?;
    let offered: Vec<OfferedGpu> = offer
        .offer
        .offer
        .gpus
        .iter()
        .map(|gpu| OfferedGpu {
            id: gpu.id.clone(),
            location: gpu.location,
        })
        .collect();
    let events = standing_rows
        .iter()
        .filter(|row| row.bidder)
        .map(|row| AppEvent {
            app: row.app,
            payload: EventPayload::Offer(OfferEvent {
                round: id,
                deadline: to_datetime(deadline),
                rho: row.rho,
                unmet_demand: row.unmet_demand,
                gpus: offered.clone(),
            }),
        })
        .collect();
    let config = market.config();
    Ok(Commit {
        opened_round: Some(OpenedRound {
            id,
            opened_at: offer.now,
            deadline,
            fairness_knob: config.fairness_knob,
            lease_seconds: config.lease_length.as_secs_f64(),
            leftover_policy: json_name(&config.leftover_policy)?,
            seed,
            offer: to_json(&offer.offer.offer)?,
            standings: to_json(&offer.standings)?,
            standing_rows,
        }),
        events,
        ..Commit::default()
    })
}

/// The close of round `id` as `market` (after the round) sees it: the agents' bids, where every
/// GPU went, the leases, and a result event for every app that bid or got GPUs.
pub fn closed_round(
    market: &Market,
    id: RoundId,
    now: Timestamp,
    outcome: &RoundOutcome,
    agent_bids: &[AppBid],
) -> Result<Commit, ArbiterError> {
    let allocations = allocation_rows_of(
        outcome.auction.as_ref().map(|auction| &auction.outcome),
        &outcome.leftover_grants,
    )?;
    let granted: Vec<LeaseRecord> = outcome
        .leases
        .iter()
        .map(|lease| lease_record(market, lease))
        .collect::<Result<_, _>>()?;
    let handed_out: BTreeSet<&GpuId> = granted.iter().flat_map(|lease| &lease.gpus).collect();
    let unallocated = outcome
        .offer
        .ids()
        .filter(|gpu| !handed_out.contains(gpu))
        .cloned()
        .collect();
    let mut events: Vec<AppEvent> = allocations
        .iter()
        .map(|row| AppEvent {
            app: row.app,
            payload: EventPayload::RoundResult(RoundResultEvent {
                round: id,
                pf_entry: row.pf_entry,
                c: row.c,
                kept_gpus: row.kept_gpus.clone(),
                leftover_gpus: row.leftover_gpus.clone(),
            }),
        })
        .collect();
    events.extend(granted.iter().map(|lease| AppEvent {
        app: lease.app,
        payload: EventPayload::LeaseGranted(LeaseGrantedEvent {
            lease: lease.id,
            round: id,
            gpus: lease.gpus.clone(),
            start: to_datetime(lease.start),
            end: to_datetime(lease.end),
        }),
    }));
    let agent_bids = agent_bids
        .iter()
        .map(|bid| Ok((app_key(&bid.app)?, bid.clone())))
        .collect::<Result<_, ArbiterError>>()?;
    Ok(Commit {
        closed_round: Some(ClosedRound {
            id,
            closed_at: now,
            holds: to_json(&outcome.holds)?,
            claims: to_json(&outcome.claims)?,
            agent_bids,
            allocations,
            unallocated,
            departed: outcome
                .departed
                .iter()
                .map(app_key)
                .collect::<Result<_, _>>()?,
            lease_resources: market
                .leases()
                .active()
                .filter_map(|lease| lease_resources(market, lease))
                .collect(),
            resource_division: market.division_record().as_ref().map(to_json).transpose()?,
        }),
        granted,
        events,
        ..Commit::default()
    })
}

/// The CPUs and memory of `lease` over its machines (a resource some machine of the lease does
/// not model: `None`); `None` when none of its machines models either.
pub fn lease_resources(market: &Market, lease: &Lease) -> Option<LeaseResources> {
    let amounts = total(&market.lease_resources(lease));
    (!amounts.is_unmodelled()).then_some(LeaseResources {
        lease: lease.id.into(),
        cpus: amounts.cpus,
        memory_gib: amounts.memory_gib,
    })
}

/// One row per app that bid or received GPUs: its PF choice and payment, what it kept and its
/// leftovers. Shared by the arbiter (to store a round) and the audit (to check it).
pub fn allocation_rows_of(
    auction: Option<&AuctionOutcome>,
    leftover_grants: &BTreeMap<AppId, Vec<GpuId>>,
) -> Result<Vec<AllocationRow>, ArbiterError> {
    let mut rows: BTreeMap<AppKey, AllocationRow> = BTreeMap::new();
    let empty = |app: AppKey| AllocationRow {
        app,
        pf_entry: None,
        pf_gpus: Vec::new(),
        c: None,
        c_fallback: false,
        pf_fallback: false,
        kept_gpus: Vec::new(),
        leftover_gpus: Vec::new(),
    };
    if let Some(decided) = auction {
        for (app, entry) in &decided.pf {
            let key = app_key(app)?;
            let row = rows.entry(key).or_insert_with(|| empty(key));
            row.pf_entry = entry.map(|entry| entry as i32);
            row.pf_gpus = decided.pf_gpus.get(app).cloned().unwrap_or_default();
            row.c = decided.c.get(app).copied();
            row.c_fallback = decided.payment_fallbacks.contains(app);
            row.pf_fallback = decided.pf_fallbacks.contains(app);
            row.kept_gpus = decided.allocation.get(app).cloned().unwrap_or_default();
        }
    }
    for (app, gpus) in leftover_grants {
        let key = app_key(app)?;
        rows.entry(key).or_insert_with(|| empty(key)).leftover_gpus = gpus.clone();
    }
    Ok(rows.into_values().collect())
}

/// Leases that ended (expired, released, revoked), with an event for each app.
pub fn ended_leases(
    market: &Market,
    leases: &[Lease],
    reason: Option<&str>,
) -> Result<Commit, ArbiterError> {
    let ended: Vec<LeaseRecord> = leases
        .iter()
        .map(|lease| lease_record(market, lease))
        .collect::<Result<_, _>>()?;
    let events = ended
        .iter()
        .map(|lease| AppEvent {
            app: lease.app,
            payload: EventPayload::LeaseEnded(LeaseEndedEvent {
                lease: lease.id,
                state: crate::store::lease_state_name(lease.state).to_owned(),
                gpus: lease.gpus.clone(),
                reason: reason.map(str::to_owned),
            }),
        })
        .collect();
    Ok(Commit {
        ended,
        events,
        ..Commit::default()
    })
}

/// What the store writes for a record of the live state machine; `market` is the market after
/// it.
pub fn of_record(market: &Market, now: Timestamp, record: &Record) -> Result<Commit, ArbiterError> {
    match record {
        Record::RoundOpened {
            id,
            seed,
            deadline,
            offer,
            ..
        } => opened_round(market, RoundId(*id), *seed, *deadline, offer),
        Record::RoundClosed {
            id,
            outcome,
            agent_bids_used,
        } => closed_round(market, RoundId(*id), now, outcome, agent_bids_used),
        Record::RoundAbandoned { id, .. } => Ok(Commit {
            abandoned_rounds: vec![RoundId(*id)],
            ..Commit::default()
        }),
        Record::LeasesExpired { leases } => ended_leases(market, leases, None),
        Record::NoticeServed {
            gpu,
            notice,
            revoked,
        } => {
            let revoked: Vec<Lease> = revoked.iter().cloned().collect();
            let mut commit = ended_leases(market, &revoked, Some(&notice.reason))?;
            if notice.withdrawal == Withdrawal::Drained {
                let id = market.cluster().gpu(*gpu).id.clone();
                commit.gpu_health.push((id, false));
            }
            Ok(commit)
        }
        Record::HostsDown { hosts } => hosts_down(market, hosts),
    }
}

/// Hosts given up for silence: each is marked down and its leases end with the reason.
fn hosts_down(market: &Market, hosts: &[HostDown]) -> Result<Commit, ArbiterError> {
    let mut commit = Commit::default();
    for host in hosts {
        let ended = ended_leases(market, &host.revoked, Some(&host.reason))?;
        commit.ended.extend(ended.ended);
        commit.events.extend(ended.events);
        commit.workers.host_status.push(HostStatusChange {
            machine: host.machine as i32,
            up: false,
            reason: host.reason.clone(),
        });
    }
    Ok(commit)
}

fn to_json(value: &impl serde::Serialize) -> Result<Value, ArbiterError> {
    serde_json::to_value(value).map_err(|error| ArbiterError::Internal(error.to_string()))
}

/// The serde name of a unit enum variant (`random-to-non-bidders`).
fn json_name(value: &impl serde::Serialize) -> Result<String, ArbiterError> {
    match to_json(value)? {
        Value::String(name) => Ok(name),
        other => Ok(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each fallback flag marks exactly the apps the auction's outcome lists.
    #[test]
    fn allocation_rows_carry_both_fallbacks_of_the_outcome() {
        let (proved, found) = (AppId::from("1"), AppId::from("2"));
        let gpu = GpuId("m0-g0".to_owned());
        let outcome = AuctionOutcome {
            pf: BTreeMap::from([(proved.clone(), None), (found.clone(), Some(0))]),
            pf_gpus: BTreeMap::from([(found.clone(), vec![gpu.clone()])]),
            c: BTreeMap::from([(proved.clone(), 1.0), (found.clone(), 0.5)]),
            allocation: BTreeMap::from([(found.clone(), vec![gpu])]),
            payment_fallbacks: vec![found.clone()],
            pf_fallbacks: vec![found],
            ..AuctionOutcome::default()
        };
        let rows = allocation_rows_of(Some(&outcome), &BTreeMap::new()).expect("rows");
        let flags: Vec<(AppKey, bool, bool)> = rows
            .iter()
            .map(|row| (row.app, row.c_fallback, row.pf_fallback))
            .collect();
        assert_eq!(
            flags,
            vec![(AppKey(1), false, false), (AppKey(2), true, true)]
        );
    }
}
