//! CPUs and memory beyond GPUs: the per-machine split (Synergy's guarantee), its effect on
//! rho, and the validation of profiles and cluster files.

use std::path::Path;

use agora_market::cluster_file::parse_cluster;
use agora_market::division::DivisionRecord;
use agora_market::market::{Market, MarketConfig, MarketError};
use agora_market::resources::{
    split_machine, total, MachineResources, ResourceAllocation, Sensitivity, Share, Tenant,
};
use agora_market::time::Timestamp;
use proptest::prelude::*;

use crate::support::single_job_app;

/// Twice as fast with 6 CPUs per GPU as with its proportional 3: demands 6 per GPU.
pub fn cpu_hungry() -> Sensitivity {
    Sensitivity {
        cpus_per_gpu: vec![[3.0, 1.0], [6.0, 2.0]],
        memory_gib_per_gpu: Vec::new(),
    }
}

/// Full speed with 1 CPU per GPU: demands 1 per GPU.
pub fn cpu_light() -> Sensitivity {
    Sensitivity {
        cpus_per_gpu: vec![[1.0, 1.0]],
        memory_gib_per_gpu: Vec::new(),
    }
}

const TWELVE_CPUS: MachineResources = MachineResources {
    cpus: Some(12.0),
    memory_gib: None,
};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// A machine of 4 GPUs and 12 CPUs, two apps of 2 GPUs each. GPU-proportional: 6 CPUs each
/// (3 per GPU), both at speed 1. By sensitivity: the light app needs 1 CPU per GPU for its
/// speed 1, so it gets 2 CPUs; the hungry one the other 10, 5 per GPU, speed
/// 1 + (5 - 3) / 3 = 5/3. GPU-weighted speed 2 x 5/3 + 2 x 1 = 16/3 against 4.
#[test]
fn two_apps_share_one_machines_cpus_hand_checked() {
    let (hungry, light) = (cpu_hungry(), cpu_light());
    let tenants = [
        Tenant {
            gpus: 2,
            sensitivity: &hungry,
        },
        Tenant {
            gpus: 2,
            sensitivity: &light,
        },
    ];
    let share = |cpus: f64, speed: f64| Share {
        cpus: Some(cpus),
        memory_gib: None,
        speed,
    };
    let proportional = split_machine(
        &TWELVE_CPUS,
        4,
        &tenants,
        ResourceAllocation::GpuProportional,
    );
    assert_eq!(proportional, vec![share(6.0, 1.0), share(6.0, 1.0)]);
    let aware = split_machine(
        &TWELVE_CPUS,
        4,
        &tenants,
        ResourceAllocation::SensitivityAware,
    );
    let expected = [share(10.0, 5.0 / 3.0), share(2.0, 1.0)];
    for (got, want) in aware.iter().zip(expected) {
        assert!(
            got.cpus
                .zip(want.cpus)
                .is_some_and(|(got, want)| close(got, want))
                && close(got.speed, want.speed),
            "{aware:?}"
        );
    }
}

/// The hungry and the light app of 2 GPUs each, 1000 iterations of 1 s, on one machine of 4
/// GPUs and 12 CPUs, after the first round (each holds 2 GPUs).
fn hungry_and_light_after_a_round(config: MarketConfig) -> Market {
    let cluster = parse_cluster(
        "racks = [{ machines = [{ slots = 1, gpus_per_slot = 4, gpu_type = \"v100\", cpus = 12 }] }]",
        Path::new("test.toml"),
    )
    .expect("valid cluster");
    let mut market = Market::new(cluster, config, Timestamp(0)).expect("market");
    let mut hungry = single_job_app("hungry", 2, 1000, 1.0);
    *hungry.sensitivity_mut() = cpu_hungry();
    let mut light = single_job_app("light", 2, 1000, 1.0);
    *light.sensitivity_mut() = cpu_light();
    market.add_app(hungry, Timestamp(0)).expect("admitted");
    market.add_app(light, Timestamp(0)).expect("admitted");
    market
        .run_round(Timestamp(0), 1)
        .expect("a round")
        .expect("decided");
    market
}

/// The same two apps in a market on that machine, 1000 iterations of 1 s each, up to 2 GPUs,
/// no restart pause. Each holds 2 GPUs after the first round. T_cluster (arrival, at the
/// guaranteed GPU-proportional speed 1): 1000 / 2 = 500 s; N_avg = 2, T_id = 1000 s. The light
/// app: 500 s left, rho 0.5 either way. The hungry app: at 5/3 it needs 1000 / (2 x 5/3) =
/// 300 s, rho 0.3 by sensitivity; 0.5 with GPU-proportional CPUs.
#[test]
fn rho_uses_the_speed_the_split_gives() {
    for (allocation, hungry_rho) in [
        (ResourceAllocation::SensitivityAware, 0.3),
        (ResourceAllocation::GpuProportional, 0.5),
    ] {
        let market = hungry_and_light_after_a_round(MarketConfig {
            restart_pause: std::time::Duration::ZERO,
            resource_allocation: allocation,
            ..MarketConfig::default()
        });
        let rho_of = |id: &str| {
            market
                .current_rho(&id.into(), Timestamp(0))
                .flatten()
                .expect("holds GPUs")
                .get()
        };
        assert!(close(rho_of("hungry"), hungry_rho), "{allocation:?}");
        assert!(close(rho_of("light"), 0.5), "{allocation:?}");
    }
}

/// The hand-checked machine above in a market: after a round, the division's record gives
/// each lease what the market gives it (10 CPUs to the hungry app's, 2 to the light one's, by
/// sensitivity), divided again from the record alone, through JSON as the round stores it;
/// and a record whose profile was changed divides to something else.
#[test]
fn a_division_record_divides_again_to_what_each_lease_got() {
    let market = hungry_and_light_after_a_round(MarketConfig::default());
    let record = market.division_record().expect("the machine models CPUs");
    let stored: DivisionRecord =
        serde_json::from_value(serde_json::to_value(&record).expect("json")).expect("parses");
    assert_eq!(stored, record);
    let replayed = stored.lease_resources();
    assert_eq!(replayed.len(), 2, "{replayed:?}");
    for lease in market.leases().active() {
        let live = total(&market.lease_resources(lease));
        let (_, again) = replayed
            .iter()
            .find(|(id, _)| *id == lease.id)
            .expect("every lease replayed");
        assert_eq!(*again, live);
        let expected = if lease.app.0 == "hungry" { 10.0 } else { 2.0 };
        assert!(close(live.cpus.expect("modelled"), expected), "{live:?}");
        assert_eq!(live.memory_gib, None);
    }
    let mut tampered = record.clone();
    for holder in &mut tampered.machines[0].holders {
        holder.sensitivity = Sensitivity::default();
    }
    assert_ne!(tampered.lease_resources(), replayed);
}

#[test]
fn bad_profiles_are_refused_naming_the_field() {
    let refusal = |profile: Sensitivity| profile.validate().expect_err("refused");
    let negative = refusal(Sensitivity {
        cpus_per_gpu: vec![[-1.0, 1.0]],
        memory_gib_per_gpu: Vec::new(),
    });
    assert!(
        negative.contains("sensitivity.cpus_per_gpu[0]"),
        "{negative}"
    );
    let not_a_number = refusal(Sensitivity {
        cpus_per_gpu: vec![[1.0, 1.0], [2.0, f64::NAN]],
        memory_gib_per_gpu: Vec::new(),
    });
    assert!(
        not_a_number.contains("sensitivity.cpus_per_gpu[1]"),
        "{not_a_number}"
    );
    let falling = refusal(Sensitivity {
        cpus_per_gpu: Vec::new(),
        memory_gib_per_gpu: vec![[10.0, 2.0], [20.0, 1.0]],
    });
    assert!(
        falling.contains("sensitivity.memory_gib_per_gpu[1]"),
        "{falling}"
    );

    let cluster = parse_cluster(
        "racks = [{ machines = [{ slots = 1, gpus_per_slot = 4, gpu_type = \"v100\", memory_gib = 500 }] }]",
        Path::new("test.toml"),
    )
    .expect("valid cluster");
    let mut market = Market::new(cluster, MarketConfig::default(), Timestamp(0)).expect("market");
    let mut greedy = single_job_app("greedy", 1, 10, 1.0);
    *greedy.sensitivity_mut() = Sensitivity {
        cpus_per_gpu: Vec::new(),
        memory_gib_per_gpu: vec![[62.5, 1.0], [600.0, 2.0]],
    };
    let Err(MarketError::Throughput(_, reason)) = market.add_app(greedy, Timestamp(0)) else {
        panic!("an app asking more memory than any machine has must be refused");
    };
    assert!(
        reason.contains("sensitivity.memory_gib_per_gpu[1]"),
        "{reason}"
    );
    assert!(
        reason.contains("more than any machine has (500)"),
        "{reason}"
    );
}

#[test]
fn cluster_files_give_cpus_and_memory_or_a_clear_error() {
    let file = |machine: &str| {
        format!("racks = [{{ machines = [{{ slots = 2, gpus_per_slot = 4, gpu_type = \"v100\"{machine} }}] }}]")
    };
    let cluster =
        parse_cluster(&file(", cpus = 24, memory_gib = 500"), Path::new("c.toml")).expect("valid");
    assert_eq!(
        cluster.machine_resources(0),
        MachineResources {
            cpus: Some(24.0),
            memory_gib: Some(500.0)
        }
    );
    let plain = parse_cluster(&file(""), Path::new("c.toml")).expect("valid");
    assert!(!plain.models_resources());
    let zero = parse_cluster(&file(", cpus = 0"), Path::new("c.toml")).expect_err("refused");
    assert!(zero.to_string().contains("machines[0].cpus"), "{zero}");
    let negative =
        parse_cluster(&file(", memory_gib = -1.0"), Path::new("c.toml")).expect_err("refused");
    assert!(
        negative.to_string().contains("machines[0].memory_gib"),
        "{negative}"
    );
}

/// A monotone curve of up to four points (maybe not concave), or none.
fn curve() -> impl Strategy<Value = Vec<[f64; 2]>> {
    prop::collection::vec((0.5f64..8.0, 0.0f64..1.5), 0..=4).prop_map(|steps| {
        let (mut amount, mut speed) = (0.0, 0.2);
        steps
            .into_iter()
            .map(|(more, faster)| {
                amount += more;
                speed += faster;
                [amount, speed]
            })
            .collect()
    })
}

pub fn profile() -> impl Strategy<Value = Sensitivity> {
    (curve(), curve()).prop_map(|(cpus, memory)| Sensitivity {
        cpus_per_gpu: cpus,
        memory_gib_per_gpu: memory
            .into_iter()
            .map(|[gib, speed]| [gib * 16.0, speed])
            .collect(),
    })
}

/// A machine of 1-8 GPUs with CPUs and maybe memory, and tenants holding some of its GPUs.
fn instance() -> impl Strategy<Value = (MachineResources, u32, Vec<(u32, Sensitivity)>)> {
    (1u32..=8, 1u32..=64, prop::option::of(16.0f64..1024.0)).prop_flat_map(
        |(gpus, cpus, memory)| {
            let machine = MachineResources {
                cpus: Some(f64::from(cpus)),
                memory_gib: memory,
            };
            let tenants = prop::collection::vec((1u32..=gpus, profile()), 1..=gpus as usize)
                .prop_map(move |tenants| {
                    let mut left = gpus;
                    tenants
                        .into_iter()
                        .filter_map(|(want, profile)| {
                            let got = want.min(left);
                            left -= got;
                            (got > 0).then_some((got, profile))
                        })
                        .collect::<Vec<_>>()
                });
            (Just(machine), Just(gpus), tenants)
        },
    )
}

fn split(machine: &MachineResources, gpus: u32, tenants: &[(u32, Sensitivity)]) -> Vec<Share> {
    let tenants: Vec<Tenant> = tenants
        .iter()
        .map(|(gpus, sensitivity)| Tenant {
            gpus: *gpus,
            sensitivity,
        })
        .collect();
    split_machine(
        machine,
        gpus,
        &tenants,
        ResourceAllocation::SensitivityAware,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Synergy's guarantee: no tenant runs slower than with its GPU-proportional share, and
    /// the machine gives no more than it has.
    #[test]
    fn nobody_below_proportional_and_no_machine_overcommitted(
        (machine, gpus, tenants) in instance()
    ) {
        let shares = split(&machine, gpus, &tenants);
        for ((_, sensitivity), share) in tenants.iter().zip(&shares) {
            let guaranteed = sensitivity.proportional_speed(&machine, gpus);
            prop_assert!(share.speed >= guaranteed * (1.0 - 1e-9), "{share:?} below {guaranteed}");
        }
        let cpus: f64 = shares.iter().filter_map(|share| share.cpus).sum();
        prop_assert!(cpus <= machine.cpus.unwrap_or_default() * (1.0 + 1e-9), "{cpus} CPUs given");
        if let Some(memory) = machine.memory_gib {
            let given: f64 = shares.iter().filter_map(|share| share.memory_gib).sum();
            prop_assert!(given <= memory * (1.0 + 1e-9), "{given} GiB given");
        }
    }

    /// Renaming and reordering tenants reorders the split and changes nothing else (tenants of
    /// different contents; identical ones are told apart only by order, the last tie-break).
    #[test]
    fn reordering_tenants_permutes_the_split(
        (machine, gpus, tenants) in instance(),
        seed in any::<u64>(),
    ) {
        let distinct = tenants.iter().enumerate().all(|(i, a)| {
            tenants[..i].iter().all(|b| a.0 != b.0 || a.1.cmp_content(&b.1).is_ne())
        });
        prop_assume!(distinct);
        let shares = split(&machine, gpus, &tenants);
        let mut order: Vec<usize> = (0..tenants.len()).collect();
        let mut state = seed;
        for i in (1..order.len()).rev() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            order.swap(i, (state >> 33) as usize % (i + 1));
        }
        let reordered: Vec<(u32, Sensitivity)> =
            order.iter().map(|&i| tenants[i].clone()).collect();
        let again = split(&machine, gpus, &reordered);
        for (position, &original) in order.iter().enumerate() {
            prop_assert_eq!(again[position], shares[original]);
        }
    }
}
