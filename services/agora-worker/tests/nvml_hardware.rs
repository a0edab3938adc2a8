//! The worker on this host's real GPUs, through NVML. Ignored by default: CI has no GPU. On a
//! GPU host with the NVIDIA driver, run
//! `cargo test -p agora-worker --test nvml_hardware -- --ignored --nocapture`; each test fails
//! (rather than skips) when NVML cannot start, so a run on the wrong machine says so.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use agora_protocol::{GpuHealth, Heartbeat};
use agora_worker::backend::GpuBackend;
use agora_worker::health::{HealthPolicy, HealthTracker};
use agora_worker::nvml::NvmlBackend;
use agora_worker::topology::discover;
use agora_worker::Worker;
use support::{worker_config, RunningWorker, ScriptedArbiter};

const NEEDS_A_GPU: &str = "needs an NVIDIA GPU and its driver";

fn nvml() -> NvmlBackend {
    NvmlBackend::init().unwrap_or_else(|error| panic!("{error}"))
}

#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn nvml_describes_every_gpu_of_the_host() {
    let mut backend = nvml();
    let topology = discover(&mut backend).expect("NVML lists the GPUs");
    assert!(
        !topology.devices.is_empty(),
        "{NEEDS_A_GPU}: NVML found none"
    );
    for device in &topology.devices {
        eprintln!("{device:?}");
        assert!(device.uuid.starts_with("GPU-"), "{device:?}");
        assert!(!device.name.is_empty(), "{device:?}");
        assert!(device.memory_total_bytes > 1 << 30, "{device:?}");
        assert!(!device.pci_bus_id.is_empty(), "{device:?}");
        let capability = device
            .compute_capability
            .expect("every CUDA GPU has a compute capability");
        if device.name.contains("H100") || device.name.contains("H200") {
            assert_eq!((capability.major, capability.minor), (9, 0), "{device:?}");
        }
    }
    let registration = topology.registration("gpu-host-1", "rack-a");
    assert_eq!(registration.gpus.len(), topology.devices.len());
    let resources = backend.host_resources();
    eprintln!("{resources:?}");
    assert!(resources.cpus.is_some_and(|cpus| cpus > 0));
    assert!(resources.memory_gib.is_some_and(|gib| gib > 0.0));
}

#[test]
#[ignore = "needs an NVIDIA GPU and its driver"]
fn every_gpu_answers_with_plausible_readings_and_is_healthy_when_idle() {
    let mut backend = nvml();
    let topology = discover(&mut backend).expect("NVML lists the GPUs");
    for device in &topology.devices {
        let sample = backend.sample(device.index).expect("the GPU answers");
        eprintln!("GPU {}: {sample:?}", device.index);
        let metrics = &sample.metrics;
        let memory_mib = device.memory_total_bytes >> 20;
        assert!(metrics.fb_used_mib.is_some_and(|used| used <= memory_mib));
        assert!(metrics
            .gpu_util_percent
            .is_some_and(|percent| percent <= 100));
        // Datacenter GPUs report both; a consumer GPU may not, and then this says which.
        let celsius = metrics.gpu_temp_celsius.expect("a temperature reading");
        assert!((1..120).contains(&celsius), "{celsius} °C");
        let watts = metrics.power_usage_watts.expect("a power reading");
        assert!(watts > 0.0 && watts < 2000.0, "{watts} W");
        let health = HealthTracker::default().assess(&HealthPolicy::default(), Ok(metrics), &[]);
        assert_eq!(health, GpuHealth::Healthy, "GPU {}", device.index);
    }
    // A healthy host raises no XIDs, and reading the event sets must not invent any.
    assert_eq!(backend.take_xid_events(), Vec::new());
}

/// The pids of the compute processes NVML lists on each GPU, by UUID.
fn processes_by_gpu() -> BTreeMap<String, BTreeSet<u32>> {
    let mut backend = nvml();
    let topology = discover(&mut backend).expect("NVML lists the GPUs");
    topology
        .devices
        .iter()
        .map(|device| {
            let sample = backend.sample(device.index).expect("the GPU answers");
            let pids = sample.processes.iter().map(|process| process.pid).collect();
            (device.uuid.clone(), pids)
        })
        .collect()
}

/// Processes running on the first GPU alone, before and after the worker ran (the device
/// check starts one, so that the violation rule is exercised on real readings).
fn processes_only_on(uuid: &str, before: &BTreeMap<String, BTreeSet<u32>>) -> BTreeSet<u32> {
    let after = processes_by_gpu();
    let elsewhere: BTreeSet<u32> = before
        .iter()
        .chain(&after)
        .filter(|(gpu, _)| gpu.as_str() != uuid)
        .flat_map(|(_, pids)| pids.iter().copied())
        .collect();
    before[uuid]
        .intersection(&after[uuid])
        .filter(|pid| !elsewhere.contains(pid))
        .copied()
        .collect()
}

/// The worker loop on real GPUs. A compute process already on the first GPU is a violation
/// while that GPU is not leased (the first heartbeat) and is not one once a lease holds only
/// that GPU (the last heartbeat): the lease's holder may run what it likes on it.
#[actix_rt::test]
#[ignore = "needs an NVIDIA GPU and its driver"]
async fn the_worker_registers_the_real_gpus_heartbeats_their_readings_and_runs_a_lease() {
    let before = processes_by_gpu();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().expect("bound").port();
    let worker = Worker::new(worker_config(port, Box::new(nvml()), None)).expect("discovery");
    let expected = worker.registration();
    let worker = RunningWorker::spawn(worker);
    let arbiter = ScriptedArbiter::serve(listener);
    arbiter.wait_for_exit_report().await;
    worker.stop().await;
    let seen = arbiter.stop().await;

    assert_eq!(seen.bad_tokens, 0);
    assert_eq!(seen.registrations, vec![expected.clone(), expected.clone()]);
    let uuids: Vec<&str> = expected.gpus.iter().map(|gpu| gpu.uuid.as_str()).collect();
    for heartbeat in &seen.heartbeats {
        let reported: Vec<&str> = heartbeat.gpus.iter().map(|gpu| gpu.uuid.as_str()).collect();
        assert_eq!(reported, uuids);
        for gpu in &heartbeat.gpus {
            assert_eq!(gpu.health, GpuHealth::Healthy, "{gpu:?}");
            assert!(gpu.metrics.gpu_temp_celsius.is_some(), "{gpu:?}");
        }
    }
    let exit = seen.reported_exit().expect("the lease's exit was reported");
    assert_eq!((exit.code, exit.signal), (Some(4), None));

    let leased = uuids[0];
    let foreign = processes_only_on(leased, &before);
    eprintln!("processes on the leased GPU throughout: {foreign:?}");
    let violators = |heartbeat: &Heartbeat| -> BTreeSet<u32> {
        heartbeat
            .violations
            .iter()
            .filter(|violation| violation.gpu_uuid == leased)
            .map(|violation| violation.pid)
            .collect()
    };
    let first = &seen.heartbeats[0];
    let last = seen.heartbeats.last().expect("heartbeats");
    eprintln!("first heartbeat's violations: {:?}", first.violations);
    eprintln!("last heartbeat's violations: {:?}", last.violations);
    assert!(violators(first).is_superset(&foreign));
    assert!(first
        .violations
        .iter()
        .all(|violation| violation.lease_id.is_none()));
    assert!(violators(last).is_disjoint(&foreign));
}
