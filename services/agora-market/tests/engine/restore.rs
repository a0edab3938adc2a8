//! Restoring a market after a restart from what the service records: every app with its
//! arrival and ended GPU time, and the active leases.

use agora_market::lease::{Lease, LeaseId, LeaseState};
use agora_market::market::{Market, MarketConfig, MarketError};
use agora_market::policy::Policy;
use agora_market::time::Timestamp;
use agora_market::topology::GpuIndex;
use proptest::prelude::*;

use crate::support::{play, scenario, single_job_app, uniform_cluster, Scenario};

/// A market rebuilt at `now` from `market`'s records.
fn restored(market: &Market, now: Timestamp, next_lease: LeaseId) -> Market {
    let mut restored =
        Market::new(market.cluster().clone(), *market.config(), now).expect("valid config");
    for app in market.apps() {
        let arrival = market.arrival(&app.id).expect("an active app");
        let ended = market.ended_gpu_seconds(&app.id).expect("an active app");
        restored
            .restore_app(app.clone(), arrival, ended, now)
            .expect("apps are unique");
    }
    for lease in market.leases().active() {
        restored
            .restore_lease(lease.clone())
            .expect("active leases are disjoint");
    }
    restored.issue_lease_ids_from(next_lease);
    restored
}

fn active_leases(market: &Market) -> Vec<Lease> {
    market.leases().active().cloned().collect()
}

/// Themis, and a baseline that ranks apps by the GPU time they attained.
fn any_policy() -> impl Strategy<Value = Scenario> {
    (
        scenario(),
        prop_oneof![Just(Policy::Themis), Just(Policy::Tiresias)],
    )
        .prop_map(|(scenario, policy)| Scenario { policy, ..scenario })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// No app leaves in these scenarios, so the rebuilt contention history is exact and the
    /// restored market decides the next round exactly as the original.
    #[test]
    fn a_restored_market_runs_the_same_next_round(scenario in any_policy()) {
        let mut next_lease = LeaseId(0);
        play(&scenario, |market, now, seed| {
            let mut restored = restored(market, now, next_lease);
            prop_assert_eq!(restored.free_gpus(), market.free_gpus());
            prop_assert_eq!(active_leases(&restored), active_leases(market));
            let outcome = market.run_round(now, seed);
            prop_assert_eq!(&restored.run_round(now, seed), &outcome);
            let granted = outcome.iter().flatten().flat_map(|outcome| &outcome.leases);
            if let Some(last) = granted.map(|lease| lease.id).max() {
                next_lease = LeaseId(last.0 + 1);
            }
            Ok(())
        })?;
    }
}

#[test]
fn restoring_rejects_what_the_market_cannot_hold() {
    let mut market = Market::new(
        uniform_cluster(1, 1, 1, 2),
        MarketConfig::default(),
        Timestamp(0),
    )
    .expect("valid config");
    let app = single_job_app("a", 2, 100, 1.0);
    market
        .restore_app(app.clone(), Timestamp(0), 0.0, Timestamp(5))
        .expect("a new app");
    assert_eq!(
        market.restore_app(app.clone(), Timestamp(0), 0.0, Timestamp(5)),
        Err(MarketError::DuplicateApp(app.id.clone()))
    );
    let lease = |app: &str, gpus: Vec<u32>| Lease {
        id: LeaseId(7),
        app: app.into(),
        gpus: gpus.into_iter().map(GpuIndex).collect(),
        start: Timestamp(0),
        end: Timestamp(600_000),
        state: LeaseState::Active,
        ended_at: None,
    };
    assert_eq!(
        market.restore_lease(lease("b", vec![0])),
        Err(MarketError::UnknownApp("b".into()))
    );
    assert_eq!(
        market.restore_lease(lease("a", vec![0, 2])),
        Err(MarketError::GpuOutsideCluster(GpuIndex(2)))
    );
    market
        .restore_lease(lease("a", vec![1]))
        .expect("a free GPU of the cluster");
    assert_eq!(market.free_gpus(), vec![GpuIndex(0)]);
    assert_eq!(market.arrival(&app.id), Some(Timestamp(0)));
}
