//! A scripted arbiter over HTTP on loopback, for the worker's loop tests: it records what the
//! worker sends, forgets the host at the first heartbeat (so the worker must register again)
//! and afterwards lists one lease that launches `exit 4` on the host's first GPU.

use std::net::TcpListener;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use agora_protocol::{
    Enforcement, Heartbeat, HeartbeatReply, HostLease, HostRegistration, LeaseExit, Registered,
};
use agora_worker::backend::GpuBackend;
use agora_worker::health::HealthPolicy;
use agora_worker::{Worker, WorkerConfig, WorkerError};
use chrono::{TimeDelta, Utc};

pub const TOKEN: &str = "worker-secret";

/// The lease the arbiter lists from the second heartbeat on.
pub const LEASE_ID: i64 = 5;

/// What the scripted arbiter has seen.
#[derive(Default)]
pub struct Seen {
    pub registrations: Vec<HostRegistration>,
    pub heartbeats: Vec<Heartbeat>,
    pub bad_tokens: usize,
}

impl Seen {
    /// The exit the worker reported for [`LEASE_ID`], once it has.
    pub fn reported_exit(&self) -> Option<LeaseExit> {
        self.heartbeats
            .iter()
            .flat_map(|heartbeat| &heartbeat.exits)
            .find(|exit| exit.lease_id == LEASE_ID)
            .cloned()
    }
}

#[derive(Default)]
struct State {
    seen: Mutex<Seen>,
    heartbeats: tokio::sync::watch::Sender<()>,
}

impl State {
    fn lock(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().expect("lock")
    }
}

type Shared = Arc<State>;

fn authorised(request: &HttpRequest, state: &Shared) -> bool {
    let ok = request
        .headers()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"));
    if !ok {
        state.lock().bad_tokens += 1;
    }
    ok
}

async fn register(
    request: HttpRequest,
    state: web::Data<Shared>,
    body: web::Json<HostRegistration>,
) -> HttpResponse {
    if !authorised(&request, &state) {
        return HttpResponse::Unauthorized().finish();
    }
    let host = body.host.clone();
    state.lock().registrations.push(body.into_inner());
    HttpResponse::Created().json(Registered {
        host,
        heartbeat_interval_ms: 50,
    })
}

async fn heartbeat(
    request: HttpRequest,
    state: web::Data<Shared>,
    body: web::Json<Heartbeat>,
) -> HttpResponse {
    if !authorised(&request, &state) {
        return HttpResponse::Unauthorized().finish();
    }
    let mut seen = state.lock();
    seen.heartbeats.push(body.into_inner());
    state.heartbeats.send_replace(());
    if seen.heartbeats.len() == 1 {
        return HttpResponse::NotFound().finish();
    }
    let now = Utc::now();
    HttpResponse::Ok().json(HeartbeatReply {
        heartbeat_interval_ms: 50,
        leases: vec![HostLease {
            lease_id: LEASE_ID,
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

/// The worker config the tests share: host `gpu-host-1` in `rack-a`, the arbiter's interval,
/// no cgroups.
pub fn worker_config(
    port: u16,
    backend: Box<dyn GpuBackend>,
    host_memory_gib: Option<f64>,
) -> WorkerConfig {
    WorkerConfig {
        arbiter: format!("http://127.0.0.1:{port}/"),
        token: TOKEN.to_owned(),
        host: "gpu-host-1".to_owned(),
        rack: "rack-a".to_owned(),
        heartbeat_interval: None,
        health: HealthPolicy::default(),
        backend,
        cpus: None,
        host_memory_gib,
        cgroup_root: None,
    }
}

/// A running scripted arbiter.
pub struct ScriptedArbiter {
    state: Shared,
    server: ServerHandle,
}

impl ScriptedArbiter {
    /// Serves on `listener` (a loopback port).
    pub fn serve(listener: TcpListener) -> Self {
        let state: Shared = Arc::default();
        let data = web::Data::new(state.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/v1/workers", web::post().to(register))
                .route("/v1/workers/{host}/heartbeat", web::post().to(heartbeat))
        })
        .workers(1)
        .listen(listener)
        .expect("the listener serves")
        .run();
        let handle = server.handle();
        actix_rt::spawn(server);
        Self {
            state,
            server: handle,
        }
    }

    /// Waits until the worker has reported the lease's exit.
    pub async fn wait_for_exit_report(&self) {
        let mut heartbeats = self.state.heartbeats.subscribe();
        while self.state.lock().reported_exit().is_none() {
            tokio::time::timeout(Duration::from_secs(30), heartbeats.changed())
                .await
                .expect("the worker goes on heartbeating")
                .expect("the arbiter lives");
        }
    }

    /// Stops serving and returns what the arbiter saw.
    pub async fn stop(self) -> Seen {
        self.server.stop(true).await;
        std::mem::take(&mut *self.state.lock())
    }
}

/// A worker running on the test's runtime.
pub struct RunningWorker {
    stop: tokio::sync::oneshot::Sender<()>,
    task: actix_rt::task::JoinHandle<Result<(), WorkerError>>,
}

impl RunningWorker {
    pub fn spawn(worker: Worker) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = actix_rt::spawn(worker.run(async {
            let _ = stopped.await;
        }));
        Self { stop, task }
    }

    /// Shuts the worker down and checks that it stopped cleanly.
    pub async fn stop(self) {
        self.stop.send(()).expect("the worker is running");
        self.task
            .await
            .expect("the worker task")
            .expect("the worker stops cleanly");
    }
}
