//! Builders shared by the engine's tests.

use std::time::Duration;

use agora_market::app::{App, AppId, AppKind, Job, PlacementSlowdown};
use agora_market::hosts::{HostGpu, HostSpec};
use agora_market::leftover::LeftoverPolicy;
use agora_market::market::{Market, MarketConfig};
use agora_market::policy::Policy;
use agora_market::resources::MachineResources;
use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, ClusterSpec, GpuId};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

pub fn single_job_app(id: &str, max_gpus: u32, iterations: u64, serial_seconds: f64) -> App {
    App {
        id: AppId::from(id),
        kind: AppKind::SingleJob {
            job: Job {
                id: format!("{id}-job"),
                total_iterations: iterations,
                completed_iterations: 0,
                serial_iteration_time: serial_seconds,
                max_gpus,
                slowdown: PlacementSlowdown::default(),
                stopped: false,
                speed_changes: Vec::new(),
            },
            throughput: Default::default(),
            sensitivity: Default::default(),
        },
    }
}

pub fn uniform_cluster(
    racks: u32,
    machines_per_rack: u32,
    slots: u32,
    gpus_per_slot: u32,
) -> Cluster {
    Cluster::from_spec(&ClusterSpec::uniform(
        racks,
        machines_per_rack,
        slots,
        gpus_per_slot,
    ))
    .expect("valid spec")
}

pub const LEASE: Duration = Duration::from_secs(600);

/// A random market's life: its cluster, its apps (demand, iterations) and steps that each
/// advance time by some seconds and may bring the next app.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub racks: u32,
    pub machines: u32,
    pub gpus_per_machine: u32,
    pub apps: Vec<(u32, u64)>,
    pub fairness_knob: f64,
    pub leftover_policy: LeftoverPolicy,
    pub policy: Policy,
    pub steps: Vec<(u64, bool)>,
    pub seed: u64,
}

/// Themis markets under either leftover policy.
pub fn scenario() -> impl Strategy<Value = Scenario> {
    (
        1u32..=2,
        1u32..=3,
        1u32..=4,
        prop::collection::vec((1u32..=4, 10u64..200), 1..7),
        prop_oneof![Just(0.0), Just(0.5), Just(0.8)],
        prop_oneof![
            Just(LeftoverPolicy::RandomToNonBidders),
            Just(LeftoverPolicy::ReauctionNextWorst)
        ],
        prop::collection::vec((1u64..900, any::<bool>()), 1..6),
        any::<u64>(),
    )
        .prop_map(
            |(
                racks,
                machines,
                gpus_per_machine,
                apps,
                fairness_knob,
                leftover_policy,
                steps,
                seed,
            )| {
                Scenario {
                    racks,
                    machines,
                    gpus_per_machine,
                    apps,
                    fairness_knob,
                    leftover_policy,
                    policy: Policy::Themis,
                    steps,
                    seed,
                }
            },
        )
}

/// Plays `scenario`: half its apps arrive at the start, then every step advances time, expires
/// the leases due, brings the next app or (every other step without an arrival, while two or
/// more apps are active) lets the app of the lowest id leave, and hands `round` the market,
/// the lifetimes (arrival, departure) of the apps that have left, the time and the seed of the
/// round it should run.
pub fn play(
    scenario: &Scenario,
    mut round: impl FnMut(
        &mut Market,
        &[(Timestamp, Timestamp)],
        Timestamp,
        u64,
    ) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    let cluster = uniform_cluster(
        scenario.racks,
        scenario.machines,
        1,
        scenario.gpus_per_machine,
    );
    let config = MarketConfig {
        fairness_knob: scenario.fairness_knob,
        lease_length: LEASE,
        leftover_policy: scenario.leftover_policy,
        policy: scenario.policy,
        ..MarketConfig::default()
    };
    let mut market = Market::new(cluster, config, Timestamp(0)).expect("valid config");
    let mut now = Timestamp(0);
    let mut departed = Vec::new();
    let mut apps = scenario
        .apps
        .iter()
        .enumerate()
        .map(|(n, &(demand, iterations))| {
            single_job_app(&format!("app{n}"), demand, iterations, 3.0)
        });
    for app in apps.by_ref().take(scenario.apps.len().div_ceil(2)) {
        market.add_app(app, now).expect("new app");
    }
    for (step, &(advance_seconds, arrive)) in scenario.steps.iter().enumerate() {
        now = now.saturating_add(Duration::from_secs(advance_seconds));
        market.expire_leases(now);
        if arrive {
            if let Some(app) = apps.next() {
                market.add_app(app, now).expect("new app");
            }
        } else if step % 2 == 1 && market.apps().count() >= 2 {
            let leaving = market.apps().next().expect("two apps").id.clone();
            let arrival = market.arrival(&leaving).expect("an active app");
            market.remove_app(&leaving, now).expect("an active app");
            departed.push((arrival, now));
        }
        round(
            &mut market,
            &departed,
            now,
            scenario.seed.wrapping_add(step as u64),
        )?;
    }
    Ok(())
}

/// A host of one rack whose GPUs are H100s in slot 0.
pub fn host(name: &str, gpus: &[&str]) -> HostSpec {
    HostSpec {
        name: name.into(),
        rack: "rack-1".into(),
        gpus: gpus
            .iter()
            .map(|&id| HostGpu {
                id: GpuId::from(id),
                gpu_type: "H100".into(),
                slot: 0,
            })
            .collect(),
        resources: MachineResources::default(),
    }
}
