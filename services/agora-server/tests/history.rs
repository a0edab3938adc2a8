//! The dashboard's history (downsampled over a range) and the operator's drain from the cluster
//! view (effective at once, audited): real Postgres, the service on port 0, a manual clock.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use sqlx::{Connection as _, PgConnection};
use support::{active, config, fresh_database, serve, start_clock, Service, ADMIN};

/// One round every 36 s over the 30 hours before the clock's time, copied from a real one: in
/// each, `app` stands at position 0 with rho cycling 0.5, 1, 2, and starving every tenth.
async fn synthetic_history(database_url: &str, app: i64) -> i64 {
    let mut database = PgConnection::connect(database_url).await.expect("connect");
    let (template,): (i64,) = sqlx::query_as("SELECT max(id) FROM rounds")
        .fetch_one(&mut database)
        .await
        .expect("a real round");
    // Ids far above the arbiter's own, which stays idle while the clock does not move.
    sqlx::query(
        "INSERT INTO rounds
         SELECT (jsonb_populate_record(NULL::rounds, to_jsonb(r) || jsonb_build_object(
             'id', 100000 + g,
             'opened_at', r.opened_at - g * interval '36 seconds',
             'deadline', r.opened_at - g * interval '36 seconds' + interval '1 second',
             'closed_at', r.opened_at - g * interval '36 seconds' + interval '1 second'))).*
         FROM rounds r, generate_series(1, 3000) g WHERE r.id = $1",
    )
    .bind(template)
    .execute(&mut database)
    .await
    .expect("rounds");
    sqlx::query(
        "INSERT INTO round_standings (round_id, position, app_id, rho, unmet_demand, bidder)
         SELECT 100000 + g, 0, $1,
                CASE WHEN g % 10 = 0 THEN NULL ELSE (ARRAY[0.5, 1.0, 2.0])[g % 3 + 1] END, 1, true
         FROM generate_series(1, 3000) g",
    )
    .bind(app)
    .execute(&mut database)
    .await
    .expect("standings");
    3000
}

/// (status, body, body length in bytes)
async fn sized(service: &Service, path: &str, token: &str) -> (u16, Value, usize) {
    let (status, body) = service.call("GET", path, token, None).await;
    let bytes = serde_json::to_vec(&body).expect("json").len();
    (status, body, bytes)
}

#[actix_web::test]
async fn every_history_range_loads_with_at_most_240_points_in_time_order() {
    let database_url = fresh_database().await;
    let service = serve(&config(&database_url), start_clock()).await;
    let vision = service.tenant("vision").await;
    let speech = service.tenant("speech").await;
    let app = service.register(&vision, "tuner", "agent", 2, 1_000).await;
    service
        .wait_for_leases(&vision, app, |leases| active(leases).len() == 1)
        .await;
    synthetic_history(&database_url, app).await;

    // Rounds every 36 s: 25 in a quarter of an hour, 100 in an hour, 2,400 in a day, 3,001 in all.
    for (range, expected) in [
        ("15m", 25..=26),
        ("1h", 100..=101),
        ("24h", 240..=240),
        ("all", 240..=240),
    ] {
        let (status, history, bytes) = sized(
            &service,
            &format!("/v1/fairness/history?range={range}"),
            &vision,
        )
        .await;
        assert_eq!(status, 200, "{history}");
        assert_eq!(history["range"], range);
        assert_eq!(history["intervals"], 240);
        let points = history["points"].as_array().expect("points");
        assert!(
            expected.contains(&points.len()),
            "{range}: {} points",
            points.len()
        );
        assert!(bytes < 40_000, "{range}: {bytes} bytes");
        let times: Vec<&str> = points
            .iter()
            .map(|p| p["at"].as_str().expect("at"))
            .collect();
        assert!(
            times.windows(2).all(|pair| pair[0] < pair[1]),
            "{range}: oldest first"
        );
        let from = history["from"].as_str().expect("from");
        assert!(
            times.iter().all(|at| *at >= from),
            "{range}: within the range"
        );
        for point in points {
            let starving = point["starving_apps"].as_u64().expect("starving");
            assert_eq!(point["apps"], 1);
            // One app: starving, or the max rho with Jain's index 1.
            if starving == 1 {
                assert_eq!(
                    (point["max_rho"].clone(), point["jains_index"].clone()),
                    (Value::Null, Value::Null)
                );
            } else {
                assert!(
                    [0.5, 1.0, 2.0].contains(&point["max_rho"].as_f64().expect("rho")),
                    "{point}"
                );
                assert_eq!(point["jains_index"].as_f64(), Some(1.0));
            }
        }

        let path = format!("/v1/apps/{app}/rho-history?range={range}");
        let (status, rhos, bytes) = sized(&service, &path, &vision).await;
        assert_eq!(status, 200, "{rhos}");
        let rhos = rhos.as_array().expect("points");
        assert!(
            expected.contains(&rhos.len()),
            "{range}: {} rho points",
            rhos.len()
        );
        assert!(bytes < 40_000, "{range}: {bytes} bytes");
        let (status, _, _) = sized(&service, &path, &speech).await;
        assert_eq!(status, 404, "another tenant's app is not found");
    }
    for (path, detail) in [
        ("/v1/fairness/history?range=2h", "unknown variant `2h`"),
        ("/v1/fairness/history", "missing field `range`"),
        (
            &*format!("/v1/apps/{app}/rho-history?range=1h&limit=5"),
            "not both",
        ),
    ] {
        let (status, body) = service.call("GET", path, &vision, None).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (400, Some("bad_query")),
            "{path}: {body}"
        );
        assert!(
            body["detail"].as_str().expect("detail").contains(detail),
            "{path}: {body}"
        );
    }
    service.running.stop().await;
}

#[actix_web::test]
async fn a_drained_gpu_leaves_the_next_offer_at_once_and_the_drain_is_audited() {
    let database_url = fresh_database().await;
    let service = serve(&config(&database_url), start_clock()).await;
    let vision = service.tenant("vision").await;
    let app = service
        .register(&vision, "tuner", "agent", 4, 1_000_000)
        .await;
    let leases = service
        .wait_for_leases(&vision, app, |leases| active(leases).len() == 1)
        .await;
    let lease = active(&leases)[0]["id"].as_i64().expect("lease");
    let gpu = active(&leases)[0]["gpus"][0]["id"]
        .as_str()
        .expect("gpu")
        .to_owned();
    let drain = format!("/v1/cluster/gpus/{gpu}/drain");

    let (status, body) = service.call("POST", &drain, &vision, None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("admin_only")),
        "{body}"
    );
    let (status, ack) = service.call("POST", &drain, ADMIN, None).await;
    assert_eq!(status, 200, "{ack}");
    assert_eq!(ack["lease"], lease, "the lease holding it gets notice");
    let (_, cluster) = service.call("GET", "/v1/cluster", ADMIN, None).await;
    let drained = |cluster: &Value| {
        cluster["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .find(|g| g["id"] == gpu.as_str())
            .expect("gpu")["healthy"]
            == false
    };
    assert!(drained(&cluster), "out of service at once: {cluster}");

    // The lease ends (60 s) before its notice (30 s after the drain, but the GPU may not come
    // back anyway): the next round offers the other GPUs only.
    let seen = service.events(&vision, app, 0).await;
    let mut after = seen
        .last()
        .and_then(|event| event["id"].as_i64())
        .unwrap_or(0);
    service.clock.advance(Duration::from_secs(61));
    let offer = loop {
        let events = service.events(&vision, app, after).await;
        assert!(!events.is_empty(), "no offer after the lease ended");
        after = events
            .last()
            .and_then(|event| event["id"].as_i64())
            .unwrap_or(after);
        if let Some(offer) = events.iter().find(|event| event["kind"] == "offer") {
            break offer["payload"].clone();
        }
    };
    let offered: Vec<&str> = offer["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g["id"].as_str().expect("id"))
        .collect();
    assert_eq!(offered.len(), 3, "{offer}");
    assert!(!offered.contains(&gpu.as_str()), "{offer}");

    let (status, _) = service
        .call(
            "POST",
            &format!("/v1/cluster/gpus/{gpu}/restore"),
            ADMIN,
            None,
        )
        .await;
    assert_eq!(status, 200);
    let (_, cluster) = service.call("GET", "/v1/cluster", ADMIN, None).await;
    assert!(!drained(&cluster), "back in service: {cluster}");
    let (status, body) = service
        .call("GET", "/v1/cluster/actions", &vision, None)
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("admin_only")),
        "{body}"
    );
    let (status, actions) = service
        .call("GET", "/v1/cluster/actions", ADMIN, None)
        .await;
    assert_eq!(status, 200, "{actions}");
    let actions: Vec<(Value, Value, Value)> = actions
        .as_array()
        .expect("actions")
        .iter()
        .map(|action| {
            (
                action["action"].clone(),
                action["gpu"].clone(),
                action["lease_id"].clone(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        vec![
            (json!("restore"), json!(gpu), Value::Null),
            (json!("drain"), json!(gpu), json!(lease))
        ],
        "newest first"
    );
    service.running.stop().await;
}
