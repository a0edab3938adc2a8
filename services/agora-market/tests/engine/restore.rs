//! Restoring a market after a restart from what the service records: every app with its
//! arrival and ended GPU time, and the active leases.

use agora_market::lease::{Lease, LeaseId, LeaseState};
use agora_market::market::{Market, MarketConfig, MarketError, RecordedApp};
use agora_market::policy::Policy;
use agora_market::time::Timestamp;
use agora_market::topology::GpuIndex;
use proptest::prelude::*;

use crate::support::{play, scenario, single_job_app, uniform_cluster, Scenario};

/// A market rebuilt at `now` from `market`'s records and the lifetimes of the apps that left.
fn restored(
    market: &Market,
    departed: &[(Timestamp, Timestamp)],
    now: Timestamp,
    next_lease: LeaseId,
) -> Market {
    let mut restored =
        Market::new(market.cluster().clone(), *market.config(), now).expect("valid config");
    let apps = market
        .apps()
        .map(|app| {
            let recorded = RecordedApp {
                arrival: market.arrival(&app.id).expect("an active app"),
                cluster_seconds: market.cluster_seconds(&app.id).expect("an active app"),
                ended_gpu_seconds: market.ended_gpu_seconds(&app.id).expect("an active app"),
            };
            (app.clone(), recorded)
        })
        .collect();
    restored
        .restore_apps(apps, departed, now)
        .expect("apps are unique");
    for lease in market.leases().active() {
        restored
            .restore_lease(lease.clone())
            .expect("active leases are disjoint");
    }
    for (app, gpus) in market.claims() {
        restored
            .restore_claim(app.clone(), gpus.clone())
            .expect("claims of active apps");
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

    /// The contention history is rebuilt from every app's arrival and departure, so every
    /// app's rho is the same, bit for bit, before and after a restart, and the restored market
    /// decides the next round exactly as the original.
    #[test]
    fn a_restored_market_runs_the_same_next_round(scenario in any_policy()) {
        let mut next_lease = LeaseId(0);
        play(&scenario, |market, departed, now, seed| {
            let mut restored = restored(market, departed, now, next_lease);
            prop_assert_eq!(restored.free_gpus(), market.free_gpus());
            prop_assert_eq!(active_leases(&restored), active_leases(market));
            for app in market.apps() {
                prop_assert_eq!(restored.current_rho(&app.id, now), market.current_rho(&app.id, now));
            }
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
    let recorded = RecordedApp {
        arrival: Timestamp(0),
        cluster_seconds: 50.0,
        ended_gpu_seconds: 0.0,
    };
    assert_eq!(
        market.restore_apps(
            vec![(app.clone(), recorded), (app.clone(), recorded)],
            &[],
            Timestamp(5)
        ),
        Err(MarketError::DuplicateApp(app.id.clone()))
    );
    market
        .restore_apps(vec![(app.clone(), recorded)], &[], Timestamp(5))
        .expect("a new app");
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
