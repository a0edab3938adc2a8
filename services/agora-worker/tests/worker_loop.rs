//! The worker's loop against a scripted arbiter over HTTP on loopback: it retries while the
//! arbiter is down, registers, heartbeats with health and metrics, registers again when the
//! arbiter forgets the host, launches a lease's command and reports its exit. (The real
//! arbiter is exercised by services/agora-cli/tests/workers.rs; the same loop on real GPUs by
//! tests/nvml_hardware.rs.)

mod support;

use std::time::Duration;

use agora_protocol::GpuHealth;
use agora_worker::simulated::SimulatedBackend;
use agora_worker::Worker;
use support::{worker_config, RunningWorker, ScriptedArbiter};

/// Two GPUs on one NVLink; GPU 1 raises XID 79 from the start.
const HOST: &str = r#"
gpus = 2
gpu_name = "NVIDIA H100 80GB HBM3"
compute_capability = "9.0"
memory_gib = 80
cpus = 32
host_memory_gib = 512
[[links]]
gpus = [0, 1]
nvlinks = 18
[[faults]]
kind = "xid"
gpu = 1
xid = 79
"#;

#[actix_rt::test]
async fn the_worker_registers_heartbeats_re_registers_and_reports_exits() {
    // The arbiter is down at first: the worker's first attempt finds the connection closed,
    // and it tries again.
    let down = actix_rt::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let port = down.local_addr().expect("bound").port();
    let backend = SimulatedBackend::from_toml(HOST, "gpu-host-1").expect("valid topology");
    let worker =
        Worker::new(worker_config(port, Box::new(backend), Some(256.0))).expect("discovery");
    let worker = RunningWorker::spawn(worker);

    let (refused, _) = tokio::time::timeout(Duration::from_secs(30), down.accept())
        .await
        .expect("the worker tries to register")
        .expect("a connection");
    drop((refused, down));
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port is still free");
    let arbiter = ScriptedArbiter::serve(listener);
    arbiter.wait_for_exit_report().await;
    worker.stop().await;
    let seen = arbiter.stop().await;

    assert_eq!(seen.bad_tokens, 0);
    // Registered, forgotten at the first heartbeat, registered again.
    assert_eq!(seen.registrations.len(), 2);
    let registration = &seen.registrations[0];
    assert_eq!(
        (registration.host.as_str(), registration.rack.as_str()),
        ("gpu-host-1", "rack-a")
    );
    assert_eq!(
        (registration.cpus, registration.memory_gib),
        (Some(32), Some(256.0)),
        "the topology file's CPUs, the operator's memory"
    );
    assert_eq!(
        registration
            .gpus
            .iter()
            .map(|gpu| gpu.slot)
            .collect::<Vec<_>>(),
        vec![0, 0]
    );
    let exit = seen.reported_exit().expect("the lease's exit was reported");
    assert_eq!((exit.code, exit.signal), (Some(4), None));

    let first = &seen.heartbeats[0];
    assert_eq!(first.sequence, 1);
    assert_eq!(first.gpus[0].health, GpuHealth::Healthy);
    assert_eq!(first.gpus[0].metrics.gpu_temp_celsius, Some(40));
    assert_eq!(
        first.gpus[1].health,
        GpuHealth::Unhealthy {
            reason: "critical XID 79 raised by the driver".to_owned()
        }
    );
    assert_eq!(first.gpus[1].metrics.last_xid, Some(79));
    // Sequence numbers count every heartbeat.
    let sequences: Vec<u64> = seen.heartbeats.iter().map(|h| h.sequence).collect();
    assert_eq!(sequences, (1..=sequences.len() as u64).collect::<Vec<_>>());
}
