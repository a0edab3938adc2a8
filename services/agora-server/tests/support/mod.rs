//! A real Postgres database per test and the whole service on port 0 with a manual clock.
//! Each test binary uses a part of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agora_market::time::Timestamp;
use agora_server::clock::ManualClock;
use agora_server::config::{GpuSource, ServerConfig};
use agora_server::server::{start, Running};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection};

pub const ADMIN: &str = "test-admin-token";
pub const WORKER_TOKEN: &str = "test-worker-token";

/// The Postgres server tests create their databases on.
fn postgres_url() -> String {
    std::env::var("AGORA_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".to_owned())
}

/// A fresh, empty database.
pub async fn fresh_database() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "agora_test_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    );
    let mut admin = PgConnection::connect(&format!("{}/postgres", postgres_url()))
        .await
        .expect("Postgres must run on 127.0.0.1:5432 (scripts/test starts it)");
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .expect("drop");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .expect("create");
    format!("{}/{name}", postgres_url())
}

/// Four GPUs: two machines of one slot of two. Written once per test process: tests run in
/// parallel, and rewriting the file while another test's service reads it gave an empty file.
pub fn tiny_fleet() -> std::path::PathBuf {
    static FLEET: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    FLEET
        .get_or_init(|| {
            let path =
                std::env::temp_dir().join(format!("agora-fleet-{}.toml", std::process::id()));
            std::fs::write(
                &path,
                "[[racks]]\n[[racks.machines]]\ncount = 2\nslots = 1\ngpus_per_slot = 2\ngpu_type = \"A100\"\n",
            )
            .expect("write fleet");
            path
        })
        .clone()
}

pub fn config(database_url: &str) -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".to_owned(),
        database_url: database_url.to_owned(),
        admin_token: Some(ADMIN.to_owned()),
        fleet: tiny_fleet(),
        lease_seconds: 60,
        round_deadline_ms: 10_000,
        tick_ms: 10,
        ..ServerConfig::default()
    }
}

/// GPUs from hosts that register over HTTP (no fleet file), heartbeating every second.
pub fn workers_config(database_url: &str) -> ServerConfig {
    ServerConfig {
        gpus: GpuSource::Workers,
        worker_token: Some(WORKER_TOKEN.to_owned()),
        heartbeat_interval_ms: 1_000,
        ..config(database_url)
    }
}

#[allow(missing_debug_implementations)] // awc::Client is not Debug
pub struct Service {
    pub running: Running,
    pub clock: ManualClock,
    pub base: String,
    pub client: awc::Client,
}

pub async fn serve(config: &ServerConfig, clock: ManualClock) -> Service {
    let running = start(config, Arc::new(clock.clone()))
        .await
        .expect("service starts");
    Service {
        base: format!("http://{}", running.address),
        running,
        clock,
        client: awc::Client::default(),
    }
}

pub fn start_clock() -> ManualClock {
    ManualClock::starting_at(Timestamp(1_800_000_000_000))
}

impl Service {
    /// (status, JSON body or Null) of a request.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.call_with(method, path, token, body, &[]).await
    }

    /// Posts each bad body and checks it is refused with 422, the given problem code and a
    /// detail that names the field.
    pub async fn assert_refused(&self, path: &str, token: &str, bad: &[(Value, &str, &str)]) {
        for (body, code, field) in bad {
            let (status, answer) = self.call("POST", path, token, Some(body.clone())).await;
            assert_eq!(
                (status, answer["code"].as_str()),
                (422, Some(*code)),
                "{body}: {answer}"
            );
            let detail = answer["detail"].as_str().expect("detail");
            assert!(detail.contains(field), "{body}: {detail}");
        }
    }

    pub async fn call_with(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut request = self
            .client
            .request(
                method.parse().expect("method"),
                format!("{}{path}", self.base),
            )
            .bearer_auth(token)
            .timeout(Duration::from_secs(30));
        for (name, value) in headers {
            request = request.insert_header((*name, *value));
        }
        let mut response = match body {
            Some(body) => request.send_json(&body).await,
            None => request.send().await,
        }
        .expect("request sent");
        let bytes = response.body().limit(8 << 20).await.expect("body");
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (response.status().as_u16(), value)
    }

    pub async fn tenant(&self, name: &str) -> String {
        let (status, body) = self
            .call("POST", "/v1/tenants", ADMIN, Some(json!({ "name": name })))
            .await;
        assert_eq!(status, 201, "{body}");
        body["token"].as_str().expect("token").to_owned()
    }

    pub async fn register(
        &self,
        token: &str,
        name: &str,
        bidding: &str,
        jobs: u32,
        iterations: u64,
    ) -> i64 {
        let jobs: Vec<Value> = (0..jobs)
            .map(|job| {
                json!({ "job": { "id": format!("j{job}"), "total_iterations": iterations,
                         "serial_iteration_time": 1.0, "max_gpus": 1 },
                        "predicted_final_iteration": iterations })
            })
            .collect();
        let body = json!({ "name": name, "bidding": bidding,
                           "app": { "kind": "performance_curve", "jobs": jobs } });
        let (status, body) = self.call("POST", "/v1/apps", token, Some(body)).await;
        assert_eq!(status, 201, "{body}");
        body["id"].as_i64().expect("id")
    }

    /// Posts `bid` in `round`, which must be acknowledged (201); returns the acknowledgement.
    pub async fn bid(&self, token: &str, round: i64, bid: Value) -> Value {
        let path = format!("/v1/rounds/{round}/bids");
        let (status, ack) = self.call("POST", &path, token, Some(bid)).await;
        assert_eq!(status, 201, "{ack}");
        ack
    }

    /// The app's events after `after`, waiting up to 5 s for the first.
    pub async fn events(&self, token: &str, app: i64, after: i64) -> Vec<Value> {
        let path = format!("/v1/apps/{app}/events/poll?after={after}&timeout_ms=5000");
        let (status, body) = self.call("GET", &path, token, None).await;
        assert_eq!(status, 200, "{body}");
        body["events"].as_array().cloned().unwrap_or_default()
    }

    /// Waits for an event of `kind` for `app`, returning its payload.
    pub async fn wait_for(&self, token: &str, app: i64, kind: &str) -> Value {
        self.wait_for_event(token, app, |event| event["kind"] == kind)
            .await["payload"]
            .clone()
    }

    /// Waits for the first event of `app` that `matches`, and returns it. Long-polls the app's
    /// events, so it wakes as soon as the service writes one: no sleeping, no polling.
    pub async fn wait_for_event(
        &self,
        token: &str,
        app: i64,
        matches: impl Fn(&Value) -> bool,
    ) -> Value {
        let mut after = 0;
        // Each poll waits up to 5 s for a new event.
        for _ in 0..20 {
            for event in self.events(token, app, after).await {
                after = event["id"].as_i64().expect("id");
                if matches(&event) {
                    return event;
                }
            }
        }
        panic!("no matching event for app {app}");
    }

    /// Waits until `check` holds on the app's leases. Every change of a lease is an event of
    /// its app (`lease_granted`, `lease_ended`) written with it, so the leases are read again
    /// only when one arrives.
    pub async fn wait_for_leases(
        &self,
        token: &str,
        app: i64,
        check: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let mut after = 0;
        for _ in 0..20 {
            let (_, leases) = self
                .call("GET", &format!("/v1/apps/{app}/leases"), token, None)
                .await;
            let leases = leases.as_array().cloned().unwrap_or_default();
            if check(&leases) {
                return leases;
            }
            if let Some(last) = self.events(token, app, after).await.last() {
                after = last["id"].as_i64().expect("id");
            }
        }
        panic!("the leases of app {app} never reached the expected state");
    }
}

pub fn active(leases: &[Value]) -> Vec<&Value> {
    leases
        .iter()
        .filter(|lease| lease["state"] == "active")
        .collect()
}

/// The service's commits to `leases` and `rounds`, as a test hears them: a statement trigger
/// the test installs in the service's database notifies `agora_test_changes`, which Postgres
/// delivers when the writing transaction commits. Tests wait for this real signal instead of
/// sleeping and checking again.
pub struct Changes {
    listener: sqlx::postgres::PgListener,
    database: PgConnection,
}

impl Changes {
    /// Starts listening; the service must have migrated the database (it has once it serves).
    pub async fn watch(database_url: &str) -> Self {
        let mut database = PgConnection::connect(database_url).await.expect("connect");
        sqlx::raw_sql(
            "CREATE FUNCTION agora_test_changed() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_notify('agora_test_changes', TG_TABLE_NAME); RETURN NULL; END $$;
             CREATE TRIGGER agora_test_leases AFTER INSERT OR UPDATE ON leases
                 FOR EACH STATEMENT EXECUTE FUNCTION agora_test_changed();
             CREATE TRIGGER agora_test_rounds AFTER INSERT OR UPDATE ON rounds
                 FOR EACH STATEMENT EXECUTE FUNCTION agora_test_changed();",
        )
        .execute(&mut database)
        .await
        .expect("install the triggers");
        let mut listener = sqlx::postgres::PgListener::connect(database_url)
            .await
            .expect("connect");
        listener.listen("agora_test_changes").await.expect("listen");
        Self { listener, database }
    }

    /// Waits until the service has acted on everything due at `now`: no active lease past its
    /// end, no round still open past its deadline. Checks again at each commit to leases or
    /// rounds; panics after a minute without one.
    pub async fn settled(&mut self, now: Timestamp) {
        let now = agora_server::clock::to_datetime(now);
        loop {
            // Whatever was committed before this point, the check below sees.
            while self.listener.next_buffered().is_some() {}
            let (behind,): (bool,) = sqlx::query_as(
                "SELECT EXISTS (SELECT 1 FROM leases WHERE state = 'active' AND end_at <= $1)
                     OR EXISTS (SELECT 1 FROM rounds WHERE status = 'open' AND deadline <= $1)",
            )
            .bind(now)
            .fetch_one(&mut self.database)
            .await
            .expect("query");
            if !behind {
                return;
            }
            tokio::time::timeout(Duration::from_secs(60), self.listener.recv())
                .await
                .unwrap_or_else(|_| panic!("the service never caught up with the clock at {now}"))
                .expect("listening");
        }
    }
}
