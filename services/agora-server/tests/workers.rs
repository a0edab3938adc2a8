//! GPU hosts over HTTP, as `agora worker` drives them (plain requests carrying the protocol's
//! types): registration, heartbeats, unhealthy GPUs, hosts that die and return. Real Postgres,
//! the service on port 0, a manual clock.

mod support;

use std::time::Duration;

use agora_protocol::{
    heartbeat_path, ComputeCapability, Enforcement, GpuDescriptor, GpuHealth, GpuLink, GpuMetrics,
    GpuReport, Heartbeat, HeartbeatReply, HostRegistration, LinkKind, Registered, REGISTER_PATH,
};
use serde_json::{json, Value};
use support::{
    active, config, fresh_database, serve, start_clock, workers_config, Service, ADMIN,
    WORKER_TOKEN,
};

fn registration(host: &str, rack: &str, uuids: &[&str]) -> HostRegistration {
    typed_registration(host, rack, uuids, "NVIDIA H100 80GB HBM3")
}

/// A host of GPUs that NVML calls `product`.
fn typed_registration(host: &str, rack: &str, uuids: &[&str], product: &str) -> HostRegistration {
    HostRegistration {
        host: host.to_owned(),
        rack: rack.to_owned(),
        gpus: uuids
            .iter()
            .enumerate()
            .map(|(index, uuid)| GpuDescriptor {
                uuid: (*uuid).to_owned(),
                name: product.to_owned(),
                memory_total_bytes: 80 << 30,
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x1B + index),
                index: index as u32,
                slot: 0,
                compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
            })
            .collect(),
        links: uuids
            .windows(2)
            .map(|pair| GpuLink {
                a: pair[0].to_owned(),
                b: pair[1].to_owned(),
                kind: LinkKind::Nvlink,
                nvlinks: 18,
            })
            .collect(),
        worker_version: "0.1.0".to_owned(),
        cpus: None,
        memory_gib: None,
    }
}

fn heartbeat(gpus: &[(&str, GpuHealth)]) -> Heartbeat {
    Heartbeat {
        sequence: 1,
        gpus: gpus
            .iter()
            .map(|(uuid, health)| GpuReport {
                uuid: (*uuid).to_owned(),
                health: health.clone(),
                metrics: GpuMetrics {
                    gpu_util_percent: Some(90),
                    gpu_temp_celsius: Some(61),
                    ..GpuMetrics::default()
                },
            })
            .collect(),
        exits: Vec::new(),
        violations: Vec::new(),
    }
}

fn healthy(uuids: &[&'static str]) -> Vec<(&'static str, GpuHealth)> {
    uuids
        .iter()
        .map(|uuid| (*uuid, GpuHealth::Healthy))
        .collect()
}

fn unhealthy(reason: &str) -> GpuHealth {
    GpuHealth::Unhealthy {
        reason: reason.to_owned(),
    }
}

async fn register_host(service: &Service, host: &HostRegistration) -> Registered {
    let (status, body) = service
        .call("POST", REGISTER_PATH, WORKER_TOKEN, Some(json!(host)))
        .await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_value(body).expect("a Registered")
}

async fn send_heartbeat(service: &Service, host: &str, beat: &Heartbeat) -> (u16, Value) {
    service
        .call(
            "POST",
            &heartbeat_path(host),
            WORKER_TOKEN,
            Some(json!(beat)),
        )
        .await
}

async fn beat(service: &Service, host: &str, gpus: &[(&str, GpuHealth)]) -> HeartbeatReply {
    let (status, body) = send_heartbeat(service, host, &heartbeat(gpus)).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_value(body).expect("a HeartbeatReply")
}

/// An app of `jobs` one-GPU jobs with the given enforcement.
async fn register_app(
    service: &Service,
    token: &str,
    name: &str,
    jobs: u32,
    enforcement: Value,
) -> i64 {
    let jobs: Vec<Value> = (0..jobs)
        .map(|job| {
            json!({ "job": { "id": format!("j{job}"), "total_iterations": 100_000,
                     "serial_iteration_time": 1.0, "max_gpus": 1 },
                    "predicted_final_iteration": 100_000 })
        })
        .collect();
    let body = json!({ "name": name, "app": { "kind": "performance_curve", "jobs": jobs },
                       "enforcement": enforcement });
    let (status, body) = service.call("POST", "/v1/apps", token, Some(body)).await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_i64().expect("id")
}

fn lease_gpus(lease: &Value) -> Vec<String> {
    let mut gpus: Vec<String> = lease["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|gpu| gpu["cuda_uuid"].as_str().expect("uuid").to_owned())
        .collect();
    gpus.sort();
    gpus
}

/// Whether each GPU of `/v1/cluster` is in service, in the cluster's order.
async fn in_service(service: &Service) -> Vec<bool> {
    let (status, cluster) = service.call("GET", "/v1/cluster", ADMIN, None).await;
    assert_eq!(status, 200, "{cluster}");
    cluster["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|gpu| gpu["healthy"].as_bool().expect("healthy"))
        .collect()
}

async fn count(service: &Service, query: &str) -> i64 {
    sqlx::query_scalar(query)
        .fetch_one(service.running.store.pool())
        .await
        .expect("a count")
}

#[actix_web::test]
async fn hosts_register_and_heartbeats_list_their_leases_also_after_a_restart() {
    let database = fresh_database().await;
    let settings = workers_config(&database);
    let clock = start_clock();
    let service = serve(&settings, clock.clone()).await;
    let registered = register_host(
        &service,
        &registration("node-a", "rack-1", &["GPU-a0", "GPU-a1"]),
    )
    .await;
    assert_eq!(registered.host, "node-a");
    assert_eq!(registered.heartbeat_interval_ms, 1_000);
    register_host(
        &service,
        &registration("node-b", "rack-2", &["GPU-b0", "GPU-b1"]),
    )
    .await;

    let (status, cluster) = service.call("GET", "/v1/cluster", ADMIN, None).await;
    assert_eq!(status, 200, "{cluster}");
    let gpus = cluster["gpus"].as_array().expect("gpus");
    let seen: Vec<(&str, &str, &str)> = gpus
        .iter()
        .map(|gpu| {
            (
                gpu["host"].as_str().expect("host"),
                gpu["cuda_uuid"].as_str().expect("uuid"),
                gpu["id"].as_str().expect("id"),
            )
        })
        .collect();
    assert_eq!(
        seen,
        vec![
            ("node-a", "GPU-a0", "GPU-a0"),
            ("node-a", "GPU-a1", "GPU-a1"),
            ("node-b", "GPU-b0", "GPU-b0"),
            ("node-b", "GPU-b1", "GPU-b1"),
        ]
    );
    assert_ne!(gpus[0]["rack"], gpus[2]["rack"], "racks go by name");

    let vision = service.tenant("vision").await;
    let launch = json!({ "mode": "launch", "command": ["python", "train.py"],
                         "env": { "SWEEP": "lr" } });
    let app = register_app(&service, &vision, "sweep", 4, launch.clone()).await;
    let leases = service
        .wait_for_leases(&vision, app, |leases| active(leases).len() == 1)
        .await;
    assert_eq!(
        lease_gpus(active(&leases)[0]).len(),
        4,
        "one lease across both hosts"
    );

    let reply = beat(&service, "node-a", &healthy(&["GPU-a0", "GPU-a1"])).await;
    assert_eq!(reply.heartbeat_interval_ms, 1_000);
    assert_eq!(reply.leases.len(), 1, "{reply:?}");
    let lease = &reply.leases[0];
    assert_eq!(json!(lease.lease_id), leases[0]["id"]);
    assert_eq!(lease.app_id, app);
    assert_eq!(
        lease.gpu_uuids,
        vec!["GPU-a0", "GPU-a1"],
        "only this host's GPUs"
    );
    assert_eq!(json!(lease.enforcement), launch);
    assert_eq!(lease.grace_seconds, settings.revocation_grace_seconds);
    assert_eq!(json!(lease.end_at), leases[0]["end_at"]);
    let reply = beat(&service, "node-b", &healthy(&["GPU-b0", "GPU-b1"])).await;
    assert_eq!(reply.leases[0].gpu_uuids, vec!["GPU-b0", "GPU-b1"]);

    let (status, body) = send_heartbeat(&service, "node-z", &heartbeat(&[])).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("unknown_host")),
        "{body}"
    );
    let (status, body) =
        send_heartbeat(&service, "node-a", &heartbeat(&healthy(&["GPU-b0"]))).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("invalid_heartbeat")),
        "{body}"
    );
    assert_eq!(
        count(
            &service,
            "SELECT count(*) FROM gpu_metrics WHERE gpu_temp_celsius = 61"
        )
        .await,
        4,
        "the latest metrics of every reported GPU"
    );
    service.running.stop().await;

    let restarted = serve(&settings, clock).await;
    let (_, cluster) = restarted.call("GET", "/v1/cluster", ADMIN, None).await;
    assert_eq!(
        cluster["gpus"].as_array().map(Vec::len),
        Some(4),
        "hosts are reloaded"
    );
    let after = restarted
        .wait_for_leases(&vision, app, |leases| active(leases).len() == 1)
        .await;
    assert_eq!(
        after[0]["id"], leases[0]["id"],
        "the lease survives the restart"
    );
    let reply = beat(&restarted, "node-a", &healthy(&["GPU-a0", "GPU-a1"])).await;
    assert_eq!(
        reply.leases.len(),
        1,
        "the restored host still enforces the lease"
    );
    restarted.running.stop().await;
}

#[actix_web::test]
async fn a_gpu_reported_unhealthy_is_withdrawn_and_its_lease_revoked_after_notice() {
    let database = fresh_database().await;
    let settings = agora_server::config::ServerConfig {
        heartbeat_interval_ms: 3_600_000,
        revocation_grace_seconds: 30,
        ..workers_config(&database)
    };
    let service = serve(&settings, start_clock()).await;
    register_host(
        &service,
        &registration("node-a", "rack-1", &["GPU-0", "GPU-1", "GPU-2"]),
    )
    .await;
    beat(
        &service,
        "node-a",
        &[
            ("GPU-0", GpuHealth::Healthy),
            ("GPU-1", GpuHealth::Healthy),
            ("GPU-2", unhealthy("XID 79: fell off the bus")),
        ],
    )
    .await;

    let vision = service.tenant("vision").await;
    let app = service
        .register(&vision, "sweep", "agent", 3, 100_000)
        .await;
    let leases = service
        .wait_for_leases(&vision, app, |leases| active(leases).len() == 1)
        .await;
    assert_eq!(
        lease_gpus(active(&leases)[0]),
        vec!["GPU-0", "GPU-1"],
        "the unhealthy GPU is not offered"
    );

    let reply = beat(
        &service,
        "node-a",
        &[
            ("GPU-0", unhealthy("double-bit ECC error")),
            ("GPU-1", GpuHealth::Healthy),
            ("GPU-2", unhealthy("XID 79: fell off the bus")),
        ],
    )
    .await;
    let notice = service.wait_for(&vision, app, "revocation_notice").await;
    let reason = notice["reason"].as_str().expect("reason");
    assert!(
        reason.contains("GPU-0") && reason.contains("double-bit ECC error"),
        "{reason}"
    );
    let revoke_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(notice["revoke_at"].clone()).expect("a time");
    assert_eq!(
        reply.leases[0].end_at, revoke_at,
        "the host enforces the earlier end"
    );
    assert_eq!(
        reply.leases[0].enforcement,
        Enforcement::Watch,
        "the default"
    );

    service.clock.advance(Duration::from_secs(31));
    let ended = service.wait_for(&vision, app, "lease_ended").await;
    assert_eq!(ended["state"], "revoked");
    assert_eq!(ended["reason"].as_str(), Some(reason));
    let leases = service
        .wait_for_leases(&vision, app, |leases| {
            active(leases).len() == 1 && leases.len() == 2
        })
        .await;
    assert_eq!(
        lease_gpus(active(&leases)[0]),
        vec!["GPU-1"],
        "re-auctioned without the sick GPUs"
    );

    beat(&service, "node-a", &healthy(&["GPU-0", "GPU-1", "GPU-2"])).await;
    let leases = service
        .wait_for_leases(&vision, app, |leases| active(leases).len() == 2)
        .await;
    let mut held: Vec<String> = active(&leases).into_iter().flat_map(lease_gpus).collect();
    held.sort();
    assert_eq!(
        held,
        vec!["GPU-0", "GPU-1", "GPU-2"],
        "recovered GPUs go back into service"
    );
    assert_eq!(
        count(&service, "SELECT count(*) FROM gpu_health_events").await,
        4,
        "two GPUs fell ill and recovered"
    );
    service.running.stop().await;
}

#[actix_web::test]
async fn a_host_that_stops_heartbeating_loses_its_leases_and_a_round_runs_when_it_returns() {
    let database = fresh_database().await;
    let service = serve(&workers_config(&database), start_clock()).await;
    register_host(
        &service,
        &registration("node-a", "rack-1", &["GPU-a0", "GPU-a1"]),
    )
    .await;
    register_host(
        &service,
        &registration("node-b", "rack-1", &["GPU-b0", "GPU-b1"]),
    )
    .await;
    let vision = service.tenant("vision").await;
    let app = service
        .register(&vision, "sweep", "agent", 4, 100_000)
        .await;
    let leases = service
        .wait_for_leases(&vision, app, |leases| active(leases).len() == 1)
        .await;
    assert_eq!(lease_gpus(active(&leases)[0]).len(), 4);

    // node-b heartbeats at 1.5 s; node-a stays silent past two intervals (2 s).
    service.clock.advance(Duration::from_millis(1_500));
    beat(&service, "node-b", &healthy(&["GPU-b0", "GPU-b1"])).await;
    service.clock.advance(Duration::from_millis(600));
    let ended = service.wait_for(&vision, app, "lease_ended").await;
    assert_eq!(ended["state"], "revoked");
    assert_eq!(ended["reason"], "host node-a stopped heartbeating");
    let leases = service
        .wait_for_leases(&vision, app, |leases| {
            leases.len() == 2 && active(leases).len() == 1
        })
        .await;
    assert_eq!(
        lease_gpus(active(&leases)[0]),
        vec!["GPU-b0", "GPU-b1"],
        "the remaining capacity was auctioned again"
    );
    assert_eq!(
        count(
            &service,
            "SELECT count(*) FROM hosts WHERE status = 'down' AND name = 'node-a'"
        )
        .await,
        1
    );
    assert_eq!(
        count(&service, "SELECT count(*) FROM host_events WHERE kind = 'down' AND reason = 'host node-a stopped heartbeating'").await,
        1
    );

    assert_eq!(
        in_service(&service).await,
        vec![false, false, true, true],
        "the cluster shows the silent host's GPUs out of service"
    );

    let reply = beat(&service, "node-a", &healthy(&["GPU-a0", "GPU-a1"])).await;
    assert!(
        reply.leases.is_empty(),
        "its old leases are gone: {reply:?}"
    );
    assert_eq!(in_service(&service).await, vec![true; 4]);
    let leases = service
        .wait_for_leases(&vision, app, |leases| {
            active(leases).into_iter().flat_map(lease_gpus).count() == 4
        })
        .await;
    assert_eq!(
        lease_gpus(active(&leases)[1]),
        vec!["GPU-a0", "GPU-a1"],
        "a round gave the returning host's GPUs out again"
    );
    service.running.stop().await;
}

#[actix_web::test]
async fn bad_registrations_and_wrong_tokens_are_refused_and_nothing_is_stored() {
    let database = fresh_database().await;
    let service = serve(&workers_config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let good = registration("node-a", "rack-1", &["GPU-a0", "GPU-a1"]);

    for token in ["wrong", &vision, ADMIN] {
        let (status, body) = service
            .call("POST", REGISTER_PATH, token, Some(json!(good)))
            .await;
        assert_eq!(
            (status, body["code"].as_str()),
            (401, Some("unauthorized")),
            "{body}"
        );
    }

    let mut bad = Vec::new();
    let mut nameless = good.clone();
    nameless.host = String::new();
    bad.push((json!(nameless), "invalid_registration"));
    let mut slashed = good.clone();
    slashed.host = "node/a".to_owned();
    bad.push((json!(slashed), "invalid_registration"));
    let mut twice = good.clone();
    twice.gpus[1].uuid = "GPU-a0".to_owned();
    bad.push((json!(twice), "invalid_registration"));
    let mut stray_link = good.clone();
    stray_link.links[0].b = "GPU-elsewhere".to_owned();
    bad.push((json!(stray_link), "invalid_registration"));
    let mut empty = good.clone();
    empty.gpus.clear();
    empty.links.clear();
    bad.push((json!(empty), "invalid_registration"));
    let mut consumer = good.clone();
    consumer.gpus[1].name = "NVIDIA GeForce RTX 4090".to_owned();
    bad.push((json!(consumer), "invalid_registration"));
    let mut unknown_field = json!(good);
    unknown_field["gpu_count"] = json!(2);
    bad.push((unknown_field, "invalid_body"));
    let mut coreless = good.clone();
    coreless.cpus = Some(0);
    bad.push((json!(coreless), "invalid_registration"));
    let mut memoryless = good.clone();
    memoryless.memory_gib = Some(-1.0);
    bad.push((json!(memoryless), "invalid_registration"));
    for (body, code) in bad {
        let (status, answer) = service
            .call("POST", REGISTER_PATH, WORKER_TOKEN, Some(body.clone()))
            .await;
        assert!((400..500).contains(&status), "{body} -> {status} {answer}");
        assert_eq!(answer["code"].as_str(), Some(code), "{body} -> {answer}");
        for field in ["cpus", "memory_gib"] {
            if body[field].is_number() {
                let detail = answer["detail"].as_str().unwrap_or_default();
                assert!(detail.contains(&format!(": {field}:")), "{answer}");
            }
        }
    }
    let stored = "SELECT (SELECT count(*) FROM hosts) + (SELECT count(*) FROM gpus) + (SELECT count(*) FROM machines)";
    assert_eq!(count(&service, stored).await, 0, "nothing stored");

    register_host(&service, &good).await;
    let moved = registration("node-a", "rack-2", &["GPU-a0", "GPU-a1"]);
    let stolen = registration("node-b", "rack-1", &["GPU-a1", "GPU-b0"]);
    for body in [moved, stolen] {
        let (status, answer) = service
            .call("POST", REGISTER_PATH, WORKER_TOKEN, Some(json!(body)))
            .await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (422, Some("invalid_registration")),
            "{answer}"
        );
    }
    assert_eq!(
        count(&service, stored).await,
        1 + 2 + 1,
        "only the good host"
    );
    let (status, answer) = service
        .call(
            "POST",
            &heartbeat_path("node-a"),
            "wrong",
            Some(json!(heartbeat(&[]))),
        )
        .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (401, Some("unauthorized")),
        "{answer}"
    );

    let no_command = json!({ "mode": "launch", "command": [] });
    let body = json!({ "name": "x", "app": { "kind": "single_job", "job": { "id": "j",
        "total_iterations": 10, "serial_iteration_time": 1.0, "max_gpus": 1 } },
        "enforcement": no_command });
    let (status, answer) = service.call("POST", "/v1/apps", &vision, Some(body)).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (422, Some("invalid_app")),
        "{answer}"
    );
    assert_eq!(count(&service, "SELECT count(*) FROM apps").await, 0);
    service.running.stop().await;

    let simulated = serve(&config(&fresh_database().await), start_clock()).await;
    let (status, answer) = simulated
        .call("POST", REGISTER_PATH, WORKER_TOKEN, Some(json!(good)))
        .await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (403, Some("workers_disabled")),
        "{answer}"
    );
    simulated.running.stop().await;
}

/// Hosts report NVML product names, which the arbiter maps to GPU types: the cluster, the
/// leases and the engine speak of `h100` and `v100`. A framework then reports a measured
/// speed: the answer is the app's table after it, the report is kept in the SQL history, the
/// app's state carries the table across a restart, and bad reports are 422 naming the field.
#[actix_web::test]
async fn gpu_types_come_from_product_names_and_throughput_reports_update_the_table() {
    let database = fresh_database().await;
    let settings = workers_config(&database);
    let clock = start_clock();
    let service = serve(&settings, clock.clone()).await;
    register_host(&service, &registration("node-h", "rack-1", &["GPU-h0"])).await;
    let v100 = typed_registration("node-v", "rack-1", &["GPU-v0"], "Tesla V100-SXM2-16GB");
    register_host(&service, &v100).await;
    let refused = typed_registration("node-x", "rack-1", &["GPU-x0"], "NVIDIA GeForce RTX 4090");
    let (status, answer) = service
        .call("POST", REGISTER_PATH, WORKER_TOKEN, Some(json!(refused)))
        .await;
    assert_eq!(status, 422, "{answer}");
    let detail = answer["detail"].as_str().expect("detail");
    assert!(
        detail.contains("gpus[0].name") && detail.contains("RTX 4090"),
        "{detail}"
    );

    let (_, cluster) = service.call("GET", "/v1/cluster", ADMIN, None).await;
    let described: Vec<(&str, &str, &str, &str)> = cluster["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|gpu| {
            let field = |name: &str| gpu[name].as_str().expect(name);
            (
                field("id"),
                field("gpu_type"),
                field("product_name"),
                field("compute_capability"),
            )
        })
        .collect();
    assert_eq!(
        described,
        vec![
            ("GPU-h0", "h100", "NVIDIA H100 80GB HBM3", "9.0"),
            ("GPU-v0", "v100", "Tesla V100-SXM2-16GB", "9.0"),
        ]
    );

    let vision = service.tenant("vision").await;
    let body = json!({ "name": "typed", "app": { "kind": "single_job",
        "job": { "id": "j", "total_iterations": 100_000, "serial_iteration_time": 1.0,
                 "max_gpus": 2 },
        "throughput": { "h100": 2.0, "v100": 1.0 } } });
    let (status, answer) = service.call("POST", "/v1/apps", &vision, Some(body)).await;
    assert_eq!(status, 201, "{answer}");
    let app = answer["id"].as_i64().expect("id");
    let leases = service
        .wait_for_leases(&vision, app, |leases| active(leases).len() == 1)
        .await;
    let mut leased: Vec<(&str, &str)> = active(&leases)[0]["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|gpu| {
            (
                gpu["id"].as_str().expect("id"),
                gpu["gpu_type"].as_str().expect("type"),
            )
        })
        .collect();
    leased.sort_unstable();
    assert_eq!(leased, vec![("GPU-h0", "h100"), ("GPU-v0", "v100")]);

    let path = format!("/v1/apps/{app}/throughput");
    let report = |gpu_type: &str, speed: f64| json!({ "gpu_type": gpu_type, "speed": speed });
    let (status, answer) = service
        .call("POST", &path, &vision, Some(report("v100", 1.5)))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({ "throughput": { "h100": 2.0, "v100": 1.5 } })
    );
    let bad = [
        (report("k80", 1.0), "invalid_throughput", "gpu_type"),
        (report("v100", 0.0), "invalid_throughput", "speed"),
        (report("v100", -2.0), "invalid_throughput", "speed"),
        (json!({ "gpu_type": "v100" }), "invalid_body", "speed"),
    ];
    service.assert_refused(&path, &vision, &bad).await;
    let other = service.tenant("other").await;
    let (status, answer) = service
        .call("POST", &path, &other, Some(report("v100", 9.0)))
        .await;
    assert_eq!(status, 404, "another tenant's app is not found: {answer}");
    assert_eq!(
        count(&service, "SELECT count(*) FROM throughput_reports").await,
        1,
        "only the accepted report is kept"
    );
    service.running.stop().await;

    let restarted = serve(&settings, clock).await;
    let (status, answer) = restarted
        .call("POST", &path, &vision, Some(report("h100", 2.5)))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({ "throughput": { "h100": 2.5, "v100": 1.5 } }),
        "the report before the restart was restored with the app"
    );
    let history: Vec<(String, f64)> = sqlx::query_as(
        "SELECT gpu_type, speed FROM throughput_reports WHERE app_id = $1 ORDER BY id",
    )
    .bind(app)
    .fetch_all(restarted.running.store.pool())
    .await
    .expect("the history");
    assert_eq!(
        history,
        vec![("v100".to_owned(), 1.5), ("h100".to_owned(), 2.5)]
    );
    restarted.running.stop().await;
}

/// An app of one one-GPU job with the given sensitivity profile; the answer as given.
async fn try_profiled_app(
    service: &Service,
    token: &str,
    name: &str,
    sensitivity: Value,
) -> (u16, Value) {
    let body = json!({ "name": name, "app": { "kind": "performance_curve",
        "jobs": [{ "job": { "id": "j0", "total_iterations": 100_000,
                            "serial_iteration_time": 1.0, "max_gpus": 1 },
                   "predicted_final_iteration": 100_000 }],
        "sensitivity": sensitivity } });
    service.call("POST", "/v1/apps", token, Some(body)).await
}

fn close_to(value: &Value, expected: f64) -> bool {
    value
        .as_f64()
        .is_some_and(|found| (found - expected).abs() < 1e-6)
}

/// A host of 2 GPUs, 16 CPU cores and 64 GiB. `hungry` (one GPU, 1x at 4 CPUs per GPU, 2x at
/// 12) arrives alone: the idle GPU's share is free, so its lease gets the 12 CPUs its top speed
/// needs and its GPU-proportional 32 GiB (it has no memory curve). `plain` (no profile) takes
/// the other GPU and keeps its proportional 8 CPUs, leaving `hungry` 8 (speed 1.5, its
/// guarantee). Each change is a `lease_resources` row of its round; the host enforces the
/// current values, also after a restart. Bad profiles are 422 naming the field.
#[actix_web::test]
async fn a_hosts_cpus_and_memory_go_with_its_leases_and_their_history_is_kept() {
    let database = fresh_database().await;
    let settings = workers_config(&database);
    let clock = start_clock();
    let service = serve(&settings, clock.clone()).await;
    let mut host = registration("node-a", "rack-1", &["GPU-a0", "GPU-a1"]);
    host.cpus = Some(16);
    host.memory_gib = Some(64.0);
    register_host(&service, &host).await;
    let vision = service.tenant("vision").await;

    for (profile, field) in [
        (
            json!({ "cpus_per_gpu": [[-4.0, 1.0]] }),
            "sensitivity.cpus_per_gpu[0]",
        ),
        // Not a number: the path in the app, then what serde expected and where.
        (
            json!({ "cpus_per_gpu": [[4.0, "fast"]] }),
            "app: sensitivity.cpus_per_gpu[0]",
        ),
        (
            json!({ "memory_gib_per_gpu": [[100.0, 1.0]] }),
            "sensitivity.memory_gib_per_gpu[0]",
        ),
    ] {
        let (status, answer) = try_profiled_app(&service, &vision, "bad", profile.clone()).await;
        assert_eq!(status, 422, "{profile} -> {answer}");
        let detail = answer["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(field), "{profile} -> {answer}");
    }
    assert_eq!(count(&service, "SELECT count(*) FROM apps").await, 0);

    let profile = json!({ "cpus_per_gpu": [[4.0, 1.0], [12.0, 2.0]] });
    let (status, answer) = try_profiled_app(&service, &vision, "hungry", profile).await;
    assert_eq!(status, 201, "{answer}");
    let hungry = answer["id"].as_i64().expect("id");
    let leases = service
        .wait_for_leases(&vision, hungry, |leases| active(leases).len() == 1)
        .await;
    let lease = active(&leases)[0].clone();
    assert!(close_to(&lease["cpus"], 12.0), "{lease}");
    assert!(close_to(&lease["memory_gib"], 32.0), "{lease}");
    let reply = beat(&service, "node-a", &healthy(&["GPU-a0", "GPU-a1"])).await;
    assert!(close_to(&json!(reply.leases[0].cpus), 12.0), "{reply:?}");
    assert!(
        close_to(&json!(reply.leases[0].memory_gib), 32.0),
        "{reply:?}"
    );

    let plain = register_app(&service, &vision, "plain", 1, json!({ "mode": "watch" })).await;
    let plain_leases = service
        .wait_for_leases(&vision, plain, |leases| active(leases).len() == 1)
        .await;
    assert!(
        close_to(&active(&plain_leases)[0]["cpus"], 8.0),
        "{plain_leases:?}"
    );
    let (_, leases) = service
        .call("GET", &format!("/v1/apps/{hungry}/leases"), &vision, None)
        .await;
    assert_eq!(leases[0]["id"], lease["id"], "the same lease, changed");
    assert!(close_to(&leases[0]["cpus"], 8.0), "{leases}");
    assert!(close_to(&leases[0]["memory_gib"], 32.0), "{leases}");

    let history: Vec<(i64, f64)> = sqlx::query_as(
        "SELECT round_id, cpus FROM lease_resources WHERE lease_id = $1 ORDER BY round_id",
    )
    .bind(lease["id"].as_i64().expect("lease id"))
    .fetch_all(service.running.store.pool())
    .await
    .expect("the lease's history");
    assert_eq!(history.len(), 2, "granted, then changed: {history:?}");
    assert_eq!(json!(history[0].0), lease["round_id"]);
    assert_eq!(json!(history[1].0), active(&plain_leases)[0]["round_id"]);
    assert!((history[0].1 - 12.0).abs() < 1e-6 && (history[1].1 - 8.0).abs() < 1e-6);
    let stored = "SELECT count(*) FROM hosts WHERE cpus = 16 AND memory_gib = 64";
    assert_eq!(count(&service, stored).await, 1);
    service.running.stop().await;

    let restarted = serve(&settings, clock).await;
    let reply = beat(&restarted, "node-a", &healthy(&["GPU-a0", "GPU-a1"])).await;
    let enforced: Vec<(i64, Option<f64>)> = reply
        .leases
        .iter()
        .map(|lease| (lease.app_id, lease.cpus))
        .collect();
    assert_eq!(enforced.len(), 2, "{reply:?}");
    for (app, cpus) in enforced {
        assert!(close_to(&json!(cpus), 8.0), "app {app}: {reply:?}");
    }
    restarted.running.stop().await;
}
