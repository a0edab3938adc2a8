//! A cluster that grows as GPU hosts register, and hosts that leave and return.

use std::collections::BTreeMap;

use agora_market::lease::LeaseState;
use agora_market::market::{Market, MarketConfig, Withdrawal};
use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, GpuId, GpuIndex};
use proptest::prelude::*;

use crate::support::{host, single_job_app, LEASE};

fn empty_market() -> Market {
    let config = MarketConfig {
        fairness_knob: 0.0,
        lease_length: LEASE,
        ..MarketConfig::default()
    };
    Market::new(
        Cluster::new(Vec::new()).expect("empty"),
        config,
        Timestamp(0),
    )
    .expect("valid")
}

fn index(market: &Market, id: &str) -> GpuIndex {
    market
        .cluster()
        .index_of(&GpuId::from(id))
        .expect("a registered GPU")
}

#[test]
fn an_empty_cluster_grows_as_hosts_register_and_rounds_use_the_new_gpus() {
    let mut market = empty_market();
    market
        .add_app(single_job_app("a", 4, 100, 1.0), Timestamp(0))
        .expect("new app");
    assert!(market.open_round(Timestamp(0)).is_none(), "no GPUs yet");
    let joined = market
        .register_host(&host("h1", &["GPU-1", "GPU-2"]), Timestamp(0))
        .expect("valid host");
    assert_eq!(joined.added, vec![GpuIndex(0), GpuIndex(1)]);
    market
        .register_host(&host("h2", &["GPU-3", "GPU-4"]), Timestamp(0))
        .expect("valid host");
    let outcome = market
        .run_round(Timestamp(1), 7)
        .expect("an offer")
        .expect("a round");
    assert_eq!(outcome.leases[0].gpus.len(), 4);
    assert_eq!(market.host_gpus("h2"), vec![GpuIndex(2), GpuIndex(3)]);
    assert_eq!(
        market.host_of(GpuIndex(3)).map(|host| host.name.as_str()),
        Some("h2")
    );
}

#[test]
fn a_host_that_goes_down_loses_its_leases_and_returns_to_service_when_it_comes_back() {
    let mut market = empty_market();
    market
        .register_host(&host("h1", &["GPU-1", "GPU-2"]), Timestamp(0))
        .expect("valid host");
    market
        .register_host(&host("h2", &["GPU-3"]), Timestamp(0))
        .expect("valid host");
    market
        .add_app(single_job_app("a", 3, 100, 1.0), Timestamp(0))
        .expect("new app");
    market
        .run_round(Timestamp(0), 1)
        .expect("offer")
        .expect("round");

    let revoked = market.host_down("h1", Timestamp(10)).expect("known host");
    assert_eq!(revoked.len(), 1);
    assert_eq!(revoked[0].state, LeaseState::Revoked);
    assert_eq!(market.free_gpus(), vec![index(&market, "GPU-3")]);
    assert!(!market.hosts().get("h1").expect("kept").up);
    assert_eq!(
        market.cluster().len(),
        3,
        "a host that leaves keeps its GPUs"
    );

    market.set_withdrawn(index(&market, "GPU-2"), Withdrawal::Unhealthy, true);
    market.host_up("h1").expect("known host");
    assert_eq!(
        market.free_gpus(),
        vec![index(&market, "GPU-1"), index(&market, "GPU-3")],
        "back in service, except the GPU withheld for another reason"
    );
    assert!(market.host_down("nobody", Timestamp(20)).is_err());
}

#[test]
fn registering_again_keeps_indices_and_withdraws_gpus_no_longer_reported() {
    let mut market = empty_market();
    market
        .register_host(&host("h1", &["GPU-1", "GPU-2"]), Timestamp(0))
        .expect("valid host");
    market
        .add_app(single_job_app("a", 2, 100, 1.0), Timestamp(0))
        .expect("new app");
    market
        .run_round(Timestamp(0), 1)
        .expect("offer")
        .expect("round");
    market.host_down("h1", Timestamp(5)).expect("known");

    let joined = market
        .register_host(&host("h1", &["GPU-2", "GPU-9"]), Timestamp(10))
        .expect("same host, one GPU swapped");
    assert_eq!(joined.added, vec![GpuIndex(2)]);
    assert_eq!(joined.unreported, vec![GpuIndex(0)]);
    assert!(
        joined.revoked.is_empty(),
        "the host's leases ended when it went down"
    );
    assert_eq!(index(&market, "GPU-2"), GpuIndex(1));
    assert!(market.is_withdrawn_for(GpuIndex(0), Withdrawal::Unreported));
    assert_eq!(market.free_gpus(), vec![GpuIndex(1), GpuIndex(2)]);
}

#[test]
fn a_refused_registration_changes_nothing() {
    let mut market = empty_market();
    market
        .register_host(&host("h1", &["GPU-1"]), Timestamp(0))
        .expect("valid host");
    let before = (market.cluster().clone(), market.hosts().clone());
    assert!(market
        .register_host(&host("h2", &["GPU-5", "GPU-1"]), Timestamp(0))
        .is_err());
    assert_eq!((market.cluster().clone(), market.hosts().clone()), before);
}

#[derive(Debug, Clone)]
enum Step {
    Register { host: usize, gpus: Vec<usize> },
    Down(usize),
    Up(usize),
    Round,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0..3usize, proptest::collection::vec(0..4usize, 1..4))
            .prop_map(|(host, gpus)| Step::Register { host, gpus }),
        (0..3usize).prop_map(Step::Down),
        (0..3usize).prop_map(Step::Up),
        Just(Step::Round),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Whatever hosts do, a GPU keeps its index once it joined, and no GPU of a host that is
    /// down is free or leased.
    #[test]
    fn indices_are_stable_and_down_hosts_hold_nothing(steps in proptest::collection::vec(step(), 1..30)) {
        let mut market = empty_market();
        market.add_app(single_job_app("a", 6, 1_000, 1.0), Timestamp(0)).expect("new app");
        market.add_app(single_job_app("b", 3, 1_000, 1.0), Timestamp(0)).expect("new app");
        let mut indices: BTreeMap<GpuId, GpuIndex> = BTreeMap::new();
        for (at, step) in steps.into_iter().enumerate() {
            let now = Timestamp(at as u64 * 1_000);
            let name = |host: usize| format!("h{host}");
            match step {
                Step::Register { host, gpus } => {
                    let ids: Vec<String> = gpus.iter().map(|gpu| format!("GPU-{host}-{gpu}")).collect();
                    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                    let mut unique = ids.clone();
                    unique.sort_unstable();
                    unique.dedup();
                    let result = market.register_host(&self::host(&name(host), &ids), now);
                    prop_assert_eq!(result.is_ok(), unique.len() == ids.len());
                }
                Step::Down(host) => { let _ = market.host_down(&name(host), now); }
                Step::Up(host) => { let _ = market.host_up(&name(host)); }
                Step::Round => { let _ = market.run_round(now, at as u64); }
            }
            for (index, gpu) in market.cluster().gpus() {
                let known = *indices.entry(gpu.id.clone()).or_insert(index);
                prop_assert_eq!(known, index);
            }
            for host in market.hosts().hosts().filter(|host| !host.up) {
                for gpu in market.host_gpus(&host.name) {
                    prop_assert!(!market.free_gpus().contains(&gpu));
                    prop_assert!(!market.leases().is_leased(gpu));
                }
            }
        }
    }
}
