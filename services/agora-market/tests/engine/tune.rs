//! Synergy-Tune (`synergy-srtf`, `synergy-ftf`): jobs placed where their CPUs and memory fit,
//! the base policy's GPU counts kept, nobody below its GPU-proportional speed, and nothing
//! changed on clusters without CPUs or memory.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use agora_market::app::AppId;
use agora_market::cluster_file::parse_cluster;
use agora_market::market::{Market, MarketConfig};
use agora_market::policy::Policy;
use agora_market::resources::{MachineResources, Sensitivity};
use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, GpuIndex};
use proptest::prelude::*;

use crate::resources::{cpu_hungry, cpu_light, profile};
use crate::support::{single_job_app, uniform_cluster};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Machines of `gpus` GPUs (one slot) and `cpus` CPUs each, in one rack.
fn cluster_of(machines: usize, gpus: u32, cpus: u32) -> Cluster {
    let machine =
        format!("{{ slots = 1, gpus_per_slot = {gpus}, gpu_type = \"v100\", cpus = {cpus} }}");
    let file = format!(
        "racks = [{{ machines = [{}] }}]",
        vec![machine; machines].join(", ")
    );
    parse_cluster(&file, Path::new("test.toml")).expect("valid cluster")
}

fn market(cluster: Cluster, policy: Policy) -> Market {
    let config = MarketConfig {
        policy,
        lease_length: Duration::from_secs(600),
        restart_pause: Duration::ZERO,
        ..MarketConfig::default()
    };
    Market::new(cluster, config, Timestamp(0)).expect("valid config")
}

fn add(market: &mut Market, id: &str, gpus: u32, sensitivity: Sensitivity) {
    let mut app = single_job_app(id, gpus, 1000, 1.0);
    *app.sensitivity_mut() = sensitivity;
    market.add_app(app, Timestamp(0)).expect("admitted");
}

fn run(market: &mut Market) {
    market
        .run_round(Timestamp(0), 1)
        .expect("something to offer")
        .expect("decided");
}

/// The GPUs `app` holds, by machine.
fn machines_of(market: &Market, app: &str) -> BTreeMap<u32, u32> {
    let mut held = BTreeMap::new();
    for lease in market.leases().leases_of(&AppId::from(app)) {
        for &gpu in &lease.gpus {
            *held
                .entry(market.cluster().location(gpu).machine)
                .or_insert(0) += 1;
        }
    }
    held
}

#[test]
fn demands_are_the_least_amounts_of_the_best_speed() {
    let machine = MachineResources {
        cpus: Some(24.0),
        memory_gib: Some(500.0),
    };
    // The best speed is the slower curve's last, 1.5 (memory): 4.5 CPUs reach it.
    let profile = Sensitivity {
        cpus_per_gpu: vec![[3.0, 1.0], [6.0, 2.0]],
        memory_gib_per_gpu: vec![[62.5, 1.0], [125.0, 1.5]],
    };
    let demand = profile.demand_per_gpu(&machine, 8);
    assert!(
        demand.cpus.is_some_and(|cpus| close(cpus, 4.5)),
        "{demand:?}"
    );
    assert!(
        demand.memory_gib.is_some_and(|gib| close(gib, 125.0)),
        "{demand:?}"
    );
    // No memory curve: the proportional 62.5 GiB, which is what the split gives it.
    let demand = cpu_hungry().demand_per_gpu(&machine, 8);
    assert_eq!((demand.cpus, demand.memory_gib), (Some(6.0), Some(62.5)));
}

/// One machine of 4 GPUs and 12 CPUs; a CPU-hungry and a CPU-light app of 2 GPUs each. Both
/// demand 2 GPUs, so the hungry one (12 CPUs) is placed first, at its full demand; the light one
/// (2 CPUs at full demand, 2 downgraded) finds no CPU left and goes by its GPUs only. The split
/// then gives the light app the 2 CPUs its speed 1 needs and the hungry one the other 10: 5 per
/// GPU, speed 1 + 2/3. Nobody is below its GPU-proportional speed 1.
#[test]
fn two_jobs_share_one_machine_hand_checked() {
    for policy in [Policy::SynergySrtf, Policy::SynergyFtf] {
        let mut market = market(cluster_of(1, 4, 12), policy);
        add(&mut market, "hungry", 2, cpu_hungry());
        add(&mut market, "light", 2, cpu_light());
        run(&mut market);
        assert_eq!(machines_of(&market, "hungry"), BTreeMap::from([(0, 2)]));
        assert_eq!(machines_of(&market, "light"), BTreeMap::from([(0, 2)]));
        let share = |app: &str| {
            market
                .resource_split()
                .share(&AppId::from(app), 0)
                .expect("holds GPUs there")
        };
        let (hungry, light) = (share("hungry"), share("light"));
        assert!(
            hungry.cpus.is_some_and(|cpus| close(cpus, 10.0)) && close(hungry.speed, 5.0 / 3.0),
            "{policy}: {hungry:?}"
        );
        assert!(
            light.cpus.is_some_and(|cpus| close(cpus, 2.0)) && close(light.speed, 1.0),
            "{policy}: {light:?}"
        );
    }
}

/// Two machines of 2 GPUs and 6 CPUs. A light app (1 GPU, demands 1 CPU) is placed first, on
/// the fullest machine that fits it: both are empty, so machine 0. A CPU-hungry app (1 GPU,
/// demands 6 CPUs) then does not fit machine 0 (5 CPUs left) and goes to machine 1, where it
/// gets all 6 CPUs: speed 2. SRTF takes the best-placed free GPU, the lone one on machine 0,
/// where the hungry app gets the 5 CPUs the light one leaves: speed 1 + 2/3.
#[test]
fn a_hungry_job_goes_where_its_cpus_are_free() {
    for (policy, machine, speed) in [(Policy::SynergySrtf, 1, 2.0), (Policy::Srtf, 0, 5.0 / 3.0)] {
        let mut market = market(cluster_of(2, 2, 6), policy);
        add(&mut market, "light", 1, cpu_light());
        run(&mut market);
        assert_eq!(
            machines_of(&market, "light"),
            BTreeMap::from([(0, 1)]),
            "{policy}"
        );
        add(&mut market, "hungry", 1, cpu_hungry());
        run(&mut market);
        assert_eq!(
            machines_of(&market, "hungry"),
            BTreeMap::from([(machine, 1)]),
            "{policy}"
        );
        let share = market
            .resource_split()
            .share(&AppId::from("hungry"), machine)
            .expect("holds GPUs there");
        assert!(close(share.speed, speed), "{policy}: {share:?}");
    }
}

/// Every lease's app and GPUs, in lease order.
fn leases(market: &Market) -> Vec<(AppId, Vec<GpuIndex>)> {
    market
        .apps()
        .flat_map(|app| {
            market
                .leases()
                .leases_of(&app.id)
                .map(|lease| (app.id.clone(), lease.gpus.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// On a cluster without CPUs or memory, Synergy-Tune is its base policy: the same GPUs to the
/// same apps, round after round (profiles or not).
#[test]
fn without_cpus_or_memory_tune_is_its_base_policy() {
    for (tune, base) in [
        (Policy::SynergySrtf, Policy::Srtf),
        (Policy::SynergyFtf, Policy::GavelFtf),
    ] {
        let mut markets = [tune, base].map(|policy| market(uniform_cluster(2, 2, 2, 2), policy));
        for market in &mut markets {
            for (n, demand) in [3, 5, 2, 7, 1].into_iter().enumerate() {
                let mut app = single_job_app(&format!("app{n}"), demand, 300 * (n as u64 + 1), 1.0);
                if n % 2 == 0 {
                    *app.sensitivity_mut() = cpu_hungry();
                }
                market.add_app(app, Timestamp(0)).expect("admitted");
            }
        }
        for step in 0..4 {
            let now = Timestamp::from_secs_f64(600.0 * f64::from(step));
            let outcomes = markets
                .each_mut()
                .map(|market| market.run_round(now, 7).is_some());
            assert_eq!(outcomes[0], outcomes[1], "{tune} at step {step}");
            assert_eq!(
                leases(&markets[0]),
                leases(&markets[1]),
                "{tune} at step {step}"
            );
        }
    }
}

/// A random cluster of 1-3 machines with CPUs (and maybe memory) and apps with random profiles.
fn instance() -> impl Strategy<Value = (u32, u32, u32, Option<f64>, Vec<(u32, Sensitivity)>)> {
    (
        1u32..=3,
        1u32..=8,
        4u32..=64,
        prop::option::of(64.0f64..1024.0),
        prop::collection::vec((1u32..=6, profile()), 1..=6),
    )
}

fn random_cluster(machines: u32, gpus: u32, cpus: u32, memory: Option<f64>) -> Cluster {
    let memory = memory.map_or(String::new(), |gib| format!(", memory_gib = {gib}"));
    let machine = format!(
        "{{ slots = 1, gpus_per_slot = {gpus}, gpu_type = \"v100\", cpus = {cpus}{memory} }}"
    );
    let file = format!(
        "racks = [{{ machines = [{}] }}]",
        vec![machine; machines as usize].join(", ")
    );
    parse_cluster(&file, Path::new("random.toml")).expect("valid cluster")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Synergy's guarantee under Tune: every app runs at least at its GPU-proportional speed on
    /// every machine where it holds GPUs, and each gets as many GPUs as the base policy gives
    /// it (Tune chooses where, not how many).
    #[test]
    fn nobody_below_proportional_and_the_base_policys_gpu_counts(
        (machines, gpus, cpus, memory, apps) in instance(),
        ftf in any::<bool>(),
    ) {
        let (tune, base) = if ftf {
            (Policy::SynergyFtf, Policy::GavelFtf)
        } else {
            (Policy::SynergySrtf, Policy::Srtf)
        };
        let cluster = random_cluster(machines, gpus, cpus, memory);
        let mut markets = [tune, base].map(|policy| market(cluster.clone(), policy));
        let half = apps.len().div_ceil(2);
        for (first, wave) in [(0, &apps[..half]), (half, &apps[half..])] {
            for market in &mut markets {
                for (n, (demand, sensitivity)) in wave.iter().enumerate() {
                    let mut app = single_job_app(&format!("app{}", first + n), *demand, 500, 1.0);
                    *app.sensitivity_mut() = sensitivity.clone();
                    // A profile asking more than a machine has is refused, in both markets.
                    let _ = market.add_app(app, Timestamp(0));
                }
                if let Some(outcome) = market.run_round(Timestamp(0), 3) {
                    outcome.expect("decided");
                }
            }
            let counts = |market: &Market| -> Vec<(AppId, usize)> {
                market.apps().map(|app| {
                    (app.id.clone(), market.leases().leases_of(&app.id).map(|l| l.gpus.len()).sum())
                }).collect()
            };
            prop_assert_eq!(counts(&markets[0]), counts(&markets[1]));
        }
        let tuned = &markets[0];
        let resources = tuned.cluster().machine_resources(0);
        for app in tuned.apps() {
            for machine in machines_of(tuned, &app.id.0).keys() {
                let share = tuned.resource_split().share(&app.id, *machine).expect("holds GPUs");
                let guaranteed = app.sensitivity().proportional_speed(&resources, gpus);
                prop_assert!(
                    share.speed >= guaranteed * (1.0 - 1e-9),
                    "{}: {:?} below {}", app.id.0, share, guaranteed
                );
            }
        }
    }
}
