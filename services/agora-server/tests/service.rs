//! The service end to end: real Postgres, the HTTP API on port 0, a manual clock.

mod support;

use std::time::Duration;

use agora_server::audit::replay_round;
use serde_json::{json, Value};
use support::{active, config, fresh_database, serve, start_clock, ADMIN};

/// An explicit bid for the first `count` GPUs of an offer.
fn bid_for(app: i64, offer: &Value, count: usize) -> Value {
    let gpus: Vec<Value> = offer["gpus"].as_array().expect("gpus")[..count]
        .iter()
        .map(|gpu| gpu["id"].clone())
        .collect();
    json!({ "app": app, "rho_old": offer["rho"], "bids": [{ "gpus": gpus, "rho": 1.5 }] })
}

#[actix_web::test]
async fn full_flow_register_offer_bid_lease_expiry_reauction_finish_and_audit() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;

    let tuner = service
        .register(&vision, "tuner", "explicit", 2, 1_000)
        .await;
    let offer = service.wait_for(&vision, tuner, "offer").await;
    let round = offer["round"].as_i64().expect("round");
    let path = format!("/v1/rounds/{round}/bids");
    let key = [("idempotency-key", "tuner-round-1")];
    let (status, first) = service
        .call_with(
            "POST",
            &path,
            &vision,
            Some(bid_for(tuner, &offer, 2)),
            &key,
        )
        .await;
    assert_eq!(status, 201, "{first}");
    let (status, retry) = service
        .call_with(
            "POST",
            &path,
            &vision,
            Some(bid_for(tuner, &offer, 2)),
            &key,
        )
        .await;
    assert_eq!(
        status, 200,
        "a retry is answered from the first bid: {retry}"
    );
    assert_eq!(retry["bid_id"], first["bid_id"]);

    let leases = service
        .wait_for_leases(&vision, tuner, |leases| active(leases).len() == 1)
        .await;
    let lease = active(&leases)[0].clone();
    assert_eq!(lease["gpus"].as_array().expect("gpus").len(), 2);
    assert!(lease["gpus"][0]["cuda_uuid"]
        .as_str()
        .expect("uuid")
        .starts_with("GPU-"));
    assert!(lease["gpus"][0]["host"]
        .as_str()
        .expect("host")
        .starts_with("sim-host-"));

    let agent_app = service
        .register(&vision, "agent-app", "agent", 2, 1_000)
        .await;
    service
        .wait_for_leases(&vision, agent_app, |leases| active(leases).len() == 1)
        .await;

    // Leases end after 60 s; the freed GPUs are auctioned again. The tuner stays silent, so
    // the round waits for its deadline (10 s) and takes its agent's fallback bid.
    service.clock.advance(Duration::from_secs(61));
    tokio::time::sleep(Duration::from_millis(100)).await;
    service.clock.advance(Duration::from_secs(11));
    let leases = service
        .wait_for_leases(&vision, agent_app, |leases| {
            leases.len() == 2 && active(leases).len() == 1
        })
        .await;
    assert_eq!(leases[0]["state"], "expired");

    let (status, body) = service
        .call(
            "POST",
            &format!("/v1/apps/{agent_app}/progress"),
            &vision,
            Some(
                json!({ "jobs": [{ "job": "j0", "completed_iterations": 1000 },
                                    { "job": "j1", "completed_iterations": 1000 }] }),
            ),
        )
        .await;
    assert_eq!(
        (status, body["finished"].clone()),
        (200, json!(true)),
        "{body}"
    );
    service
        .wait_for_leases(&vision, agent_app, |leases| active(leases).is_empty())
        .await;

    let (status, why) = service
        .call("GET", &format!("/v1/apps/{tuner}/why"), &vision, None)
        .await;
    assert_eq!(status, 200, "{why}");
    assert!(why["explanation"]
        .as_str()
        .is_some_and(|text| !text.is_empty()));

    for round in service
        .running
        .store
        .closed_round_ids()
        .await
        .expect("rounds")
    {
        let replay = replay_round(&service.running.store, round)
            .await
            .expect("replay");
        assert!(replay.matches, "round {round}: {:?}", replay.differences);
    }
    service.running.stop().await;
}

/// The next offer for `app` in a round after `after_round`.
async fn next_offer(service: &support::Service, token: &str, app: i64, after_round: i64) -> Value {
    let mut after = 0;
    for _ in 0..20 {
        for event in service.events(token, app, after).await {
            after = event["id"].as_i64().expect("id");
            if event["kind"] == "offer" && event["payload"]["round"].as_i64() > Some(after_round) {
                return event["payload"].clone();
            }
        }
    }
    panic!("no offer for app {app} after round {after_round}");
}

#[actix_web::test]
async fn racing_bids_store_one_and_a_key_identifies_a_bid_within_its_round() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let tuner = service
        .register(&vision, "tuner", "explicit", 2, 1_000)
        .await;

    // Two different bids at once: the arbiter counts one, stores one, refuses the other.
    let offer = service.wait_for(&vision, tuner, "offer").await;
    let first_round = offer["round"].as_i64().expect("round");
    let path = format!("/v1/rounds/{first_round}/bids");
    let (one, two) = tokio::join!(
        service.call_with(
            "POST",
            &path,
            &vision,
            Some(bid_for(tuner, &offer, 2)),
            &[("idempotency-key", "sweep")]
        ),
        service.call_with(
            "POST",
            &path,
            &vision,
            Some(bid_for(tuner, &offer, 1)),
            &[("idempotency-key", "other")]
        ),
    );
    let mut statuses = [one.0, two.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 409], "{} / {}", one.1, two.1);
    let stored: Vec<(i64, Option<String>)> =
        sqlx::query_as("SELECT round_id, idempotency_key FROM bids WHERE app_id = $1")
            .bind(tuner)
            .fetch_all(service.running.store.pool())
            .await
            .expect("bids");
    let (winner, winning_bid) = if one.0 == 201 {
        ("sweep", bid_for(tuner, &offer, 2))
    } else {
        ("other", bid_for(tuner, &offer, 1))
    };
    assert_eq!(stored, vec![(first_round, Some(winner.to_owned()))]);

    // Once the lease ends, the next round's bid may use the same key: it is a new bid.
    service
        .wait_for_leases(&vision, tuner, |leases| active(leases).len() == 1)
        .await;
    service.clock.advance(Duration::from_secs(61));
    let offer = next_offer(&service, &vision, tuner, first_round).await;
    let second_round = offer["round"].as_i64().expect("round");
    let (status, second) = service
        .call_with(
            "POST",
            &format!("/v1/rounds/{second_round}/bids"),
            &vision,
            Some(bid_for(tuner, &offer, 1)),
            &[("idempotency-key", winner)],
        )
        .await;
    assert_eq!(
        (status, second["replayed"].clone()),
        (201, json!(false)),
        "{second}"
    );
    assert_eq!(second["round"], second_round);
    let (status, retry) = service
        .call_with(
            "POST",
            &path,
            &vision,
            Some(winning_bid),
            &[("idempotency-key", winner)],
        )
        .await;
    assert_eq!(
        status, 200,
        "a retry for the closed first round is a replay: {retry}"
    );
    assert_ne!(retry["bid_id"], second["bid_id"]);

    // The key of the second round's bid, sent again with another bid: refused, not replayed.
    let second_path = format!("/v1/rounds/{second_round}/bids");
    let (status, problem) = service
        .call_with(
            "POST",
            &second_path,
            &vision,
            Some(bid_for(tuner, &offer, 2)),
            &[("idempotency-key", winner)],
        )
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (422, Some("idempotency_key_reused")),
        "{problem}"
    );
    let (status, same) = service
        .call_with(
            "POST",
            &second_path,
            &vision,
            Some(bid_for(tuner, &offer, 1)),
            &[("idempotency-key", winner)],
        )
        .await;
    assert_eq!(
        (status, same["bid_id"].clone()),
        (200, second["bid_id"].clone())
    );
}

#[actix_web::test]
async fn a_decision_the_database_refuses_stops_the_arbiter_and_says_why() {
    let database = fresh_database().await;
    let mut service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_rounds() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN RAISE EXCEPTION 'rounds are refused for this test'; END $$;
         CREATE TRIGGER refuse_rounds BEFORE INSERT ON rounds
           FOR EACH ROW EXECUTE FUNCTION refuse_rounds();",
    )
    .execute(service.running.store.pool())
    .await
    .expect("trigger");

    // The app's arrival opens a round, which the arbiter applies and the database refuses.
    let tuner = service
        .register(&vision, "tuner", "explicit", 2, 1_000)
        .await;
    let reason = tokio::time::timeout(Duration::from_secs(5), service.running.failed())
        .await
        .expect("the arbiter stops");
    assert!(
        reason.contains("rounds are refused for this test"),
        "{reason}"
    );

    // Nothing is decided any more: requests for the arbiter are refused, not lost.
    let (status, problem) = service
        .call(
            "POST",
            &format!("/v1/apps/{tuner}/progress"),
            &vision,
            Some(json!({ "jobs": [{ "job": "j0", "completed_iterations": 10 }] })),
        )
        .await;
    assert_eq!(
        (status, problem["code"].clone()),
        (503, json!("arbiter_unavailable")),
        "{problem}"
    );
    let rounds: i64 = sqlx::query_scalar("SELECT count(*) FROM rounds")
        .fetch_one(service.running.store.pool())
        .await
        .expect("count");
    assert_eq!(rounds, 0);
}

#[actix_web::test]
async fn bad_input_is_refused_and_nothing_is_stored_and_tenants_are_isolated() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let speech = service.tenant("speech").await;
    let tuner = service
        .register(&vision, "tuner", "explicit", 2, 1_000)
        .await;
    let offer = service.wait_for(&vision, tuner, "offer").await;
    let round = offer["round"].as_i64().expect("round");
    let path = format!("/v1/rounds/{round}/bids");
    let gpu = offer["gpus"][0]["id"].clone();
    let too_many: Vec<Value> = (0..65)
        .map(|_| json!({ "gpus": [gpu], "rho": 1.0 }))
        .collect();
    let bad_bids = [
        (
            json!({ "app": tuner, "rho_old": null, "bids": [{ "gpus": [gpu], "rho": 0.0 }] }),
            422,
            "invalid_rho",
        ),
        (
            json!({ "app": tuner, "rho_old": -1.0, "bids": [] }),
            422,
            "invalid_rho",
        ),
        (
            json!({ "app": tuner, "rho_old": null, "bids": [{ "gpus": ["no-such-gpu"], "rho": 1.0 }] }),
            422,
            "invalid_bid",
        ),
        (
            json!({ "app": tuner, "rho_old": null, "bids": [{ "gpus": [gpu, gpu], "rho": 1.0 }] }),
            422,
            "invalid_bid",
        ),
        (
            json!({ "app": tuner, "rho_old": null, "bids": too_many }),
            422,
            "bid_table_too_large",
        ),
        (json!({ "app": tuner, "bids": [] }), 422, "invalid_body"),
        (
            json!({ "app": 999_999, "rho_old": null, "bids": [] }),
            404,
            "not_found",
        ),
    ];
    for (body, status, code) in bad_bids {
        let (got, problem) = service
            .call("POST", &path, &vision, Some(body.clone()))
            .await;
        assert_eq!(
            (got, problem["code"].as_str()),
            (status, Some(code)),
            "{body} -> {problem}"
        );
    }
    let (status, problem) = service
        .call(
            "POST",
            "/v1/rounds/999/bids",
            &vision,
            Some(bid_for(tuner, &offer, 1)),
        )
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (404, Some("unknown_round"))
    );

    // Another tenant can neither bid for the app nor read it, and cannot tell it from a
    // missing app: both are the same 404.
    let (status, problem) = service
        .call("POST", &path, &speech, Some(bid_for(tuner, &offer, 1)))
        .await;
    assert_eq!((status, problem["code"].as_str()), (404, Some("not_found")));
    let missing = 999_999;
    for (method, suffix) in [
        ("GET", ""),
        ("GET", "/leases"),
        ("GET", "/why"),
        ("POST", "/finish"),
    ] {
        let (status, foreign) = service
            .call(method, &format!("/v1/apps/{tuner}{suffix}"), &speech, None)
            .await;
        let (_, absent) = service
            .call(
                method,
                &format!("/v1/apps/{missing}{suffix}"),
                &speech,
                None,
            )
            .await;
        assert_eq!(status, 404, "{method} {suffix}: {foreign}");
        let anonymised = foreign
            .to_string()
            .replace(&tuner.to_string(), &missing.to_string());
        assert_eq!(anonymised, absent.to_string(), "{method} {suffix}");
    }
    let (status, _) = service
        .call("POST", "/v1/tenants", &vision, Some(json!({ "name": "x" })))
        .await;
    assert_eq!(status, 403, "only the admin creates tenants");
    let (status, _) = service.call("GET", "/v1/apps", "not-a-token", None).await;
    assert_eq!(status, 401);

    let framework_bids: i64 =
        sqlx::query_scalar("SELECT count(*) FROM bids WHERE source = 'framework'")
            .fetch_one(service.running.store.pool())
            .await
            .expect("count");
    assert_eq!(framework_bids, 0, "refused bids store nothing");

    // The deadline passes: the agent's fallback bid stands in, and later bids are refused.
    service.clock.advance(Duration::from_secs(11));
    service
        .wait_for_leases(&vision, tuner, |leases| active(leases).len() == 1)
        .await;
    let (status, problem) = service
        .call("POST", &path, &vision, Some(bid_for(tuner, &offer, 1)))
        .await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("round_closed"))
    );

    // A tenant sees another tenant's bids in a round only anonymised.
    let (_, seen_by_speech) = service
        .call("GET", &format!("/v1/rounds/{round}"), &speech, None)
        .await;
    let bid = &seen_by_speech["bids"][0];
    assert_eq!(
        (bid["app_id"].clone(), bid["entries"].clone()),
        (Value::Null, json!([])),
        "{seen_by_speech}"
    );
    let (_, seen_by_admin) = service
        .call("GET", &format!("/v1/rounds/{round}"), ADMIN, None)
        .await;
    assert_eq!(seen_by_admin["bids"][0]["app_id"], json!(tuner));
    service.running.stop().await;
}

#[actix_web::test]
async fn a_token_deleted_from_the_database_stops_working() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let speech = service.tenant("speech").await;
    for _ in 0..2 {
        let (status, _) = service.call("GET", "/v1/apps", &vision, None).await;
        assert_eq!(status, 200, "a fresh token works, looked up or remembered");
    }
    sqlx::query(
        "DELETE FROM api_tokens WHERE tenant_id = (SELECT id FROM tenants WHERE name = 'vision')",
    )
    .execute(service.running.store.pool())
    .await
    .expect("delete the token");
    // The deletion reaches the service as a notice (migration 0006), within moments.
    let mut status = 200;
    for _ in 0..100 {
        status = service.call("GET", "/v1/apps", &vision, None).await.0;
        if status == 401 {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 401, "the deleted token is refused");
    let (status, _) = service.call("GET", "/v1/apps", &speech, None).await;
    assert_eq!(status, 200, "other tokens go on working");
}

#[actix_web::test]
async fn the_database_refuses_a_gpu_leased_twice() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let app = service.register(&vision, "tuner", "agent", 2, 1_000).await;
    let leases = service
        .wait_for_leases(&vision, app, |leases| active(leases).len() == 1)
        .await;
    let lease = active(&leases)[0];
    let gpu = lease["gpus"][0]["id"].as_str().expect("gpu");
    let round = lease["round_id"].as_i64().expect("round");
    let pool = service.running.store.pool();
    let (start, end) = (
        lease["start_at"].as_str().expect("start"),
        lease["end_at"].as_str().expect("end"),
    );
    sqlx::query("INSERT INTO leases (id, app_id, round_id, gpus, start_at, end_at, state) VALUES (999, $1, $2, ARRAY[$3], $4::timestamptz, $5::timestamptz, 'active')")
        .bind(app).bind(round).bind(gpu).bind(start).bind(end)
        .execute(pool).await.expect("a lease row alone is fine");
    let clash = sqlx::query("INSERT INTO lease_gpus (lease_id, gpu_id, held) SELECT 999, $1, tstzrange($2::timestamptz, $3::timestamptz)")
        .bind(gpu).bind(start).bind(end)
        .execute(pool)
        .await
        .expect_err("overlapping hold of one GPU");
    let code = clash
        .as_database_error()
        .and_then(|error| error.code())
        .map(|code| code.into_owned());
    assert_eq!(code.as_deref(), Some("23P01"), "{clash}");
    service.running.stop().await;
}

#[actix_web::test]
async fn a_restart_keeps_leases_history_and_acknowledged_bids() {
    let database = fresh_database().await;
    let settings = config(&database);
    let clock = start_clock();
    let service = serve(&settings, clock.clone()).await;
    let vision = service.tenant("vision").await;
    let holder = service.register(&vision, "holder", "agent", 2, 1_000).await;
    let before = service
        .wait_for_leases(&vision, holder, |leases| active(leases).len() == 1)
        .await;
    let bidder = service
        .register(&vision, "bidder", "explicit", 2, 1_000)
        .await;
    let offer = service.wait_for(&vision, bidder, "offer").await;
    let round = offer["round"].as_i64().expect("round");
    let (status, ack) = service
        .call(
            "POST",
            &format!("/v1/rounds/{round}/bids"),
            &vision,
            Some(bid_for(bidder, &offer, 1)),
        )
        .await;
    assert_eq!(status, 201, "{ack}");
    service.running.stop().await;

    let restarted = serve(&settings, clock).await;
    let after = restarted
        .wait_for_leases(&vision, holder, |leases| active(leases).len() == 1)
        .await;
    assert_eq!(
        after[0]["id"], before[0]["id"],
        "the lease survives the restart"
    );
    let won = restarted
        .wait_for_leases(&vision, bidder, |leases| active(leases).len() == 1)
        .await;
    assert_eq!(won[0]["round_id"], json!(round));
    let source: String =
        sqlx::query_scalar("SELECT source FROM bids WHERE round_id = $1 AND app_id = $2")
            .bind(round)
            .bind(bidder)
            .fetch_one(restarted.running.store.pool())
            .await
            .expect("the acknowledged bid is stored");
    assert_eq!(source, "framework");
    restarted.running.stop().await;
}

/// N_avg is rebuilt from every app's recorded arrival and departure, and T_cluster is stored
/// with the app: an app's rho is the same, bit for bit, before and after a restart, also when
/// apps have left before it.
#[actix_web::test]
async fn a_restart_leaves_every_apps_rho_as_it_was() {
    let database = fresh_database().await;
    let settings = config(&database);
    let clock = start_clock();
    let service = serve(&settings, clock.clone()).await;
    let vision = service.tenant("vision").await;
    let early = service.register(&vision, "early", "agent", 1, 1_000).await;
    service
        .wait_for_leases(&vision, early, |leases| active(leases).len() == 1)
        .await;
    clock.advance(Duration::from_secs(30));
    let later = service.register(&vision, "later", "agent", 2, 5_000).await;
    service
        .wait_for_leases(&vision, later, |leases| active(leases).len() == 1)
        .await;
    clock.advance(Duration::from_secs(40));
    let (status, body) = service
        .call(
            "POST",
            &format!("/v1/apps/{early}/progress"),
            &vision,
            Some(json!({ "jobs": [{ "job": "j0", "completed_iterations": 1000 }] })),
        )
        .await;
    assert_eq!(
        (status, body["finished"].clone()),
        (200, json!(true)),
        "{body}"
    );
    clock.advance(Duration::from_secs(50));
    let rho_of = |body: Value| body["now"]["rho"].as_f64();
    let (status, why) = service
        .call("GET", &format!("/v1/apps/{later}/why"), &vision, None)
        .await;
    assert_eq!(status, 200, "{why}");
    let before = rho_of(why);
    assert!(before.is_some(), "the later app holds GPUs");
    service.running.stop().await;

    let restarted = serve(&settings, clock).await;
    let (status, why) = restarted
        .call("GET", &format!("/v1/apps/{later}/why"), &vision, None)
        .await;
    assert_eq!(status, 200, "{why}");
    assert_eq!(rho_of(why), before, "rho after the restart");
    restarted.running.stop().await;
}

/// When a lease ends and nobody worse off wants its GPUs, its app renews onto the same GPUs:
/// its jobs keep running where they run.
#[actix_web::test]
async fn a_renewed_lease_keeps_its_gpus() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let app = service
        .register(&vision, "tuner", "agent", 2, 100_000)
        .await;
    let first = service
        .wait_for_leases(&vision, app, |leases| active(leases).len() == 1)
        .await;
    let gpus = |lease: &Value| -> Vec<String> {
        let mut ids: Vec<String> = lease["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .map(|gpu| gpu["id"].as_str().expect("id").to_owned())
            .collect();
        ids.sort();
        ids
    };
    let held = gpus(active(&first)[0]);
    // Leases last 60 s.
    service.clock.advance(Duration::from_secs(61));
    let renewed = service
        .wait_for_leases(&vision, app, |leases| {
            leases.len() == 2 && active(leases).len() == 1
        })
        .await;
    let renewal = active(&renewed)[0];
    assert_ne!(renewal["id"], active(&first)[0]["id"], "a new lease");
    assert_eq!(gpus(renewal), held, "on the same GPUs");
    service.running.stop().await;
}

/// What became of `app`'s bid in `round`: `true` when a lease of that round was granted, `false`
/// when an offer of a later round came first (the round was abandoned).
async fn won_in_round(service: &support::Service, token: &str, app: i64, round: i64) -> bool {
    let mut after = 0;
    for _ in 0..20 {
        for event in service.events(token, app, after).await {
            after = event["id"].as_i64().expect("id");
            let event_round = event["payload"]["round"].as_i64();
            if event["kind"] == "lease_granted" && event_round == Some(round) {
                return true;
            }
            if event["kind"] == "offer" && event_round > Some(round) {
                return false;
            }
        }
    }
    panic!("round {round} never ended for app {app}");
}

/// One tenant registers an app and finishes it while each round collects bids, round after
/// round; the other tenant's bids keep winning those rounds. The departed bidder is withdrawn
/// and its share re-offered as leftovers, and every round of the history (an empty bid table,
/// agent and explicit bids, leftovers, departed bidders) replays exactly.
#[actix_web::test]
async fn a_tenant_finishing_apps_while_rounds_collect_bids_never_stops_another_tenants_round() {
    let database = fresh_database().await;
    let settings = agora_server::config::ServerConfig {
        fairness_knob: 0.0,
        ..config(&database)
    };
    let service = serve(&settings, start_clock()).await;
    let steady = service.tenant("steady").await;
    let churner = service.tenant("churner").await;
    let sweep = service
        .register(&steady, "steady-sweep", "explicit", 2, 1_000_000)
        .await;
    // An empty bid table: the sweep still gets its two GPUs as leftovers.
    let offer = next_offer(&service, &steady, sweep, 0).await;
    let mut round = offer["round"].as_i64().expect("round");
    let empty = json!({ "app": sweep, "rho_old": offer["rho"], "bids": [] });
    let (status, body) = service
        .call(
            "POST",
            &format!("/v1/rounds/{round}/bids"),
            &steady,
            Some(empty),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert!(won_in_round(&service, &steady, sweep, round).await);

    for cycle in 0..3 {
        // The churner's app takes the two free GPUs, then every lease ends and both bid.
        let churn = service
            .register(&churner, &format!("churn-{cycle}"), "agent", 2, 1_000_000)
            .await;
        service.wait_for(&churner, churn, "lease_granted").await;
        service.clock.advance(Duration::from_secs(61));
        let offer = next_offer(&service, &steady, sweep, round).await;
        round = offer["round"].as_i64().expect("round");
        // The churner's timer fires while the round waits for the sweep's bid.
        let (status, body) = service
            .call("POST", &format!("/v1/apps/{churn}/finish"), &churner, None)
            .await;
        assert_eq!(status, 204, "{body}");
        let (status, body) = service
            .call(
                "POST",
                &format!("/v1/rounds/{round}/bids"),
                &steady,
                Some(bid_for(sweep, &offer, 2)),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        assert!(
            won_in_round(&service, &steady, sweep, round).await,
            "cycle {cycle}: round {round} was abandoned when another tenant's app finished"
        );
        let (_, detail) = service
            .call("GET", &format!("/v1/rounds/{round}"), &steady, None)
            .await;
        assert_eq!(detail["status"], "closed", "{detail}");
    }

    let store = &service.running.store;
    let rounds = store.closed_round_ids().await.expect("rounds");
    assert!(rounds.len() >= 7, "{rounds:?}");
    for round in rounds {
        let replay = replay_round(store, round).await.expect("replay");
        assert!(replay.matches, "round {round}: {:?}", replay.differences);
    }
    service.running.stop().await;
}

/// (status, code, detail) of a problem answer.
fn problem(answer: &(u16, Value)) -> (u16, &str, &str) {
    let (status, body) = answer;
    (
        *status,
        body["code"].as_str().unwrap_or_default(),
        body["detail"].as_str().unwrap_or_default(),
    )
}

/// Input a hostile or careless client sends: each gets a precise 4xx naming what is wrong
/// (422 for well-formed JSON that is invalid), never a 5xx or the database's text.
#[actix_web::test]
async fn hostile_and_malformed_input_gets_a_precise_4xx_naming_the_field() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let speech = service.tenant("speech").await;
    let tuner = service.register(&vision, "tuner", "agent", 1, 1_000).await;
    let talker = service.register(&speech, "talker", "agent", 1, 1_000).await;

    let tenant =
        |name: Value| service.call("POST", "/v1/tenants", ADMIN, Some(json!({ "name": name })));
    let answer = tenant(json!("a\u{0}b")).await;
    assert_eq!(problem(&answer).0, 422, "{answer:?}");
    assert_eq!(problem(&answer).1, "invalid_body");
    assert!(problem(&answer).2.contains("body.name"), "{answer:?}");
    for name in [
        "x".repeat(201),
        "evil\u{202E}gnp".to_owned(),
        "tab\tbed".to_owned(),
    ] {
        let answer = tenant(json!(name)).await;
        assert_eq!(problem(&answer).0, 422, "{name:?}: {answer:?}");
        assert_eq!(problem(&answer).1, "invalid_tenant");
        assert!(problem(&answer).2.starts_with("name "), "{answer:?}");
    }

    let job = |id: &str| {
        json!({ "job": { "id": id, "total_iterations": 10, "serial_iteration_time": 1.0,
                         "max_gpus": 1 }, "predicted_final_iteration": 10 })
    };
    let app = |name: &str, app: Value| json!({ "name": name, "app": app });
    let halving = json!({ "kind": "successive_halving", "budget_gpu_seconds": 100.0,
        "phase_iterations": [1, 2, 3], "jobs_per_phase": [4, 8, 1],
        "jobs": (0..8).map(|job| json!({ "id": format!("j{job}"), "total_iterations": 6,
            "serial_iteration_time": 1.0, "max_gpus": 1 })).collect::<Vec<_>>() });
    let registrations = [
        (
            app(
                "nul",
                json!({ "kind": "performance_curve", "jobs": [job("j\u{0}")] }),
            ),
            422,
            "invalid_body",
            "body.app.jobs[0].job.id",
        ),
        (
            app("growing", halving),
            422,
            "invalid_app",
            "jobs_per_phase",
        ),
        (json!({ "name": "no-app" }), 422, "invalid_body", "app"),
        (
            app(
                "\u{2067}mirrored",
                json!({ "kind": "performance_curve", "jobs": [job("j")] }),
            ),
            422,
            "invalid_app",
            "name",
        ),
    ];
    for (body, status, code, names) in registrations {
        let answer = service
            .call("POST", "/v1/apps", &vision, Some(body.clone()))
            .await;
        let (got_status, got_code, detail) = problem(&answer);
        assert_eq!((got_status, got_code), (status, code), "{body}: {detail}");
        assert!(detail.contains(names), "{body}: {detail}");
    }
    let not_json = service
        .client
        .post(format!("{}/v1/apps", service.base))
        .bearer_auth(&vision)
        .content_type("application/json")
        .send_body("{\"name\":")
        .await
        .expect("sent");
    assert_eq!(not_json.status().as_u16(), 400);

    // Pages are 1 to their maximum; a long-poll waits at most 60 s; a resumed stream names an
    // event it received.
    for path in [
        "/v1/rounds?limit=0".to_owned(),
        "/v1/rounds?limit=501".to_owned(),
        format!("/v1/apps/{tuner}/events/poll?timeout_ms=60001"),
        format!("/v1/apps/{tuner}/rounds?limit=0"),
    ] {
        let answer = service.call("GET", &path, &vision, None).await;
        assert_eq!(
            (problem(&answer).0, problem(&answer).1),
            (400, "bad_query"),
            "{path}"
        );
    }
    let answer = service
        .call_with(
            "GET",
            &format!("/v1/apps/{tuner}/events"),
            &vision,
            None,
            &[("last-event-id", "the-last-one")],
        )
        .await;
    assert_eq!(
        (problem(&answer).0, problem(&answer).1),
        (400, "bad_last_event_id")
    );

    // The admin lists every tenant's apps (docs/api.md).
    let (status, apps) = service.call("GET", "/v1/apps", ADMIN, None).await;
    assert_eq!(status, 200, "{apps}");
    let ids: Vec<i64> = apps
        .as_array()
        .expect("apps")
        .iter()
        .filter_map(|app| app["id"].as_i64())
        .collect();
    assert_eq!(ids, [tuner, talker]);
    let (_, own) = service.call("GET", "/v1/apps", &speech, None).await;
    assert_eq!(own.as_array().map(Vec::len), Some(1), "{own}");
    service.running.stop().await;
}

/// The bid window is a setting a client can read, with the open round's deadline; and an app's
/// rho, current and projected, is the arbiter's own.
#[actix_web::test]
async fn clients_read_the_round_deadline_and_the_arbiters_rho_of_their_app() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let speech = service.tenant("speech").await;
    let tuner = service
        .register(&vision, "tuner", "explicit", 2, 1_000)
        .await;
    let offer = service.wait_for(&vision, tuner, "offer").await;
    let (status, current) = service
        .call("GET", "/v1/rounds/current", &vision, None)
        .await;
    assert_eq!(status, 200, "{current}");
    assert_eq!(current["round"], offer["round"]);
    assert_eq!(current["phase"], "collecting_bids");
    assert_eq!(current["deadline"], offer["deadline"]);
    assert_eq!(current["bid_window_ms"], 10_000);

    let rho_path = format!("/v1/apps/{tuner}/rho");
    let rho = |body: Value| service.call("POST", &rho_path, &vision, Some(body));
    let (status, starving) = rho(json!({})).await;
    assert_eq!(status, 200, "{starving}");
    assert_eq!(
        (starving["current"].clone(), starving["projected"].clone()),
        (Value::Null, Value::Null)
    );
    let round = offer["round"].as_i64().expect("round");
    let (status, body) = service
        .call(
            "POST",
            &format!("/v1/rounds/{round}/bids"),
            &vision,
            Some(bid_for(tuner, &offer, 2)),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert!(won_in_round(&service, &vision, tuner, round).await);

    // Holding two GPUs: the projection without changes is the standing the arbiter ranks by.
    let (_, why) = service
        .call("GET", &format!("/v1/apps/{tuner}/why"), &vision, None)
        .await;
    let (_, holding) = rho(json!({})).await;
    assert!(holding["current"].as_f64().is_some(), "{holding}");
    assert_eq!(holding["current"], why["now"]["rho"], "{why}");
    assert_eq!(holding["projected"], holding["current"]);
    let progress = json!({ "progress": [{ "job": "j0", "completed_iterations": 500 },
                                        { "job": "j1", "completed_iterations": 500 }] });
    let (_, ahead) = rho(progress).await;
    assert!(
        ahead["projected"].as_f64() < holding["current"].as_f64(),
        "{ahead}"
    );
    let one_gpu = offer["gpus"][0]["id"].clone();
    let (_, narrower) = rho(json!({ "gpus": [one_gpu] })).await;
    assert!(
        narrower["projected"].as_f64() > holding["current"].as_f64(),
        "{narrower}"
    );
    assert_eq!(
        problem(&rho(json!({ "gpus": ["no-such-gpu"] })).await).1,
        "invalid_projection"
    );
    assert_eq!(
        problem(&rho(json!({ "progress": [{ "job": "nope", "completed_iterations": 1 }] })).await)
            .1,
        "invalid_progress"
    );
    let (status, _) = service
        .call(
            "POST",
            &format!("/v1/apps/{tuner}/rho"),
            &speech,
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 404, "another tenant's app is not found");
    service.running.stop().await;
}

/// `--demo` restarted on its database keeps the configured admin token and says what it
/// reuses: its tenants and their apps, with nothing added twice.
#[actix_web::test]
async fn a_restarted_demo_reuses_its_tenants_and_keeps_the_configured_admin_token() {
    let database = fresh_database().await;
    let mut settings = config(&database);
    agora_server::demo::adjust(&mut settings);
    assert_eq!(settings.admin_token.as_deref(), Some(ADMIN));
    let first = serve(&settings, start_clock()).await;
    let started = agora_server::demo::start(&first.running, &settings)
        .await
        .expect("the demo starts");
    assert_eq!(started.created_tenants, ["demo-vision", "demo-speech"]);
    assert_eq!(started.apps_added, 6);
    first.running.stop().await;

    let second = serve(&settings, start_clock()).await;
    let restarted = agora_server::demo::start(&second.running, &settings)
        .await
        .expect("the demo restarts on its database");
    assert_eq!(restarted.created_tenants, Vec::<&str>::new());
    assert_eq!(restarted.reused_tenants, ["demo-vision", "demo-speech"]);
    assert_eq!(restarted.apps_added, 0);
    let (status, apps) = second.call("GET", "/v1/apps", ADMIN, None).await;
    assert_eq!(
        status, 200,
        "the configured admin token still works: {apps}"
    );
    assert_eq!(apps.as_array().map(Vec::len), Some(6), "no app added twice");
    second.running.stop().await;
}
