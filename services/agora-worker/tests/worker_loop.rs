//! The worker's loop against a scripted arbiter over HTTP on loopback: it retries while the
//! arbiter is down, registers, heartbeats with health and metrics, registers again when the
//! arbiter forgets the host, launches a lease's command and reports its exit. (The real
//! arbiter is exercised by services/agora-cli/tests/workers.rs.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use agora_protocol::{
    Enforcement, GpuHealth, Heartbeat, HeartbeatReply, HostLease, HostRegistration, Registered,
};
use agora_worker::health::HealthPolicy;
use agora_worker::simulated::SimulatedBackend;
use agora_worker::{Worker, WorkerConfig};
use chrono::{TimeDelta, Utc};

const TOKEN: &str = "worker-secret";

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

/// What the scripted arbiter has seen.
#[derive(Default)]
struct Seen {
    registrations: Vec<HostRegistration>,
    heartbeats: Vec<Heartbeat>,
    bad_tokens: usize,
}

/// What the scripted arbiter has seen, and a signal at each heartbeat.
#[derive(Default)]
struct Arbiter {
    seen: Mutex<Seen>,
    heartbeats: tokio::sync::watch::Sender<()>,
}

impl Arbiter {
    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().expect("lock")
    }
}

type Shared = Arc<Arbiter>;

fn authorised(request: &HttpRequest, seen: &Shared) -> bool {
    let ok = request
        .headers()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"));
    if !ok {
        seen.lock().bad_tokens += 1;
    }
    ok
}

async fn register(
    request: HttpRequest,
    seen: web::Data<Shared>,
    body: web::Json<HostRegistration>,
) -> HttpResponse {
    if !authorised(&request, &seen) {
        return HttpResponse::Unauthorized().finish();
    }
    let host = body.host.clone();
    seen.lock().registrations.push(body.into_inner());
    HttpResponse::Created().json(Registered {
        host,
        heartbeat_interval_ms: 50,
    })
}

/// Forgets the host at the first heartbeat; afterwards lists one lease launching `exit 4`.
async fn heartbeat(
    request: HttpRequest,
    seen: web::Data<Shared>,
    body: web::Json<Heartbeat>,
) -> HttpResponse {
    if !authorised(&request, &seen) {
        return HttpResponse::Unauthorized().finish();
    }
    let arbiter = seen;
    let mut seen = arbiter.lock();
    seen.heartbeats.push(body.into_inner());
    arbiter.heartbeats.send_replace(());
    if seen.heartbeats.len() == 1 {
        return HttpResponse::NotFound().finish();
    }
    let now = Utc::now();
    HttpResponse::Ok().json(HeartbeatReply {
        heartbeat_interval_ms: 50,
        leases: vec![HostLease {
            lease_id: 5,
            app_id: 1,
            gpu_uuids: vec![seen.registrations[0].gpus[0].uuid.clone()],
            start_at: now - TimeDelta::seconds(1),
            end_at: now + TimeDelta::minutes(5),
            grace_seconds: 10,
            enforcement: Enforcement::Launch {
                command: vec!["sh".to_owned(), "-c".to_owned(), "exit 4".to_owned()],
                env: Default::default(),
            },
            cpus: None,
            memory_gib: None,
        }],
    })
}

#[actix_rt::test]
async fn the_worker_registers_heartbeats_re_registers_and_reports_exits() {
    // The arbiter is down at first: the worker's first attempt finds the connection closed,
    // and it tries again.
    let down = actix_rt::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let port = down.local_addr().expect("bound").port();
    let backend = SimulatedBackend::from_toml(HOST, "gpu-host-1").expect("valid topology");
    let worker = Worker::new(WorkerConfig {
        arbiter: format!("http://127.0.0.1:{port}/"),
        token: TOKEN.to_owned(),
        host: "gpu-host-1".to_owned(),
        rack: "rack-a".to_owned(),
        heartbeat_interval: None,
        health: HealthPolicy::default(),
        backend: Box::new(backend),
        cpus: None,
        host_memory_gib: Some(256.0),
        cgroup_root: None,
    })
    .expect("discovery");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = actix_rt::spawn(worker.run(async {
        let _ = stopped.await;
    }));

    let (refused, _) = tokio::time::timeout(Duration::from_secs(30), down.accept())
        .await
        .expect("the worker tries to register")
        .expect("a connection");
    drop((refused, down));
    let seen: Shared = Arc::default();
    let data = web::Data::new(seen.clone());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/v1/workers", web::post().to(register))
            .route("/v1/workers/{host}/heartbeat", web::post().to(heartbeat))
    })
    .workers(1)
    .bind(("127.0.0.1", port))
    .expect("the port is still free")
    .run();
    let server_handle = server.handle();
    actix_rt::spawn(server);

    let reported_exit = |seen: &Seen| {
        seen.heartbeats
            .iter()
            .flat_map(|heartbeat| &heartbeat.exits)
            .find(|exit| exit.lease_id == 5)
            .cloned()
    };
    let mut heartbeats = seen.heartbeats.subscribe();
    while reported_exit(&seen.lock()).is_none() {
        tokio::time::timeout(Duration::from_secs(30), heartbeats.changed())
            .await
            .expect("the worker goes on heartbeating")
            .expect("the arbiter lives");
    }
    stop.send(()).expect("the worker is running");
    running
        .await
        .expect("the worker task")
        .expect("the worker stops cleanly");
    server_handle.stop(true).await;

    let seen = seen.lock();
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
    let exit = reported_exit(&seen).expect("the lease's exit was reported");
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
