//! The service end to end: real Postgres, the HTTP API on port 0, a manual clock.

mod support;

use std::time::Duration;

use agora_market::time::Timestamp;
use agora_market::topology::{Cluster, ClusterSpec};
use agora_server::audit::replay_round;
use agora_server::ids::{AppKey, LeaseKey, RoundId};
use agora_server::leadership::LeaderLock;
use agora_server::store::{AppEvent, Commit, EventPayload, LeaseEndedEvent, Store, Writer};
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
    // D2: the key reused for a different bid is refused, whatever the first answer was.
    let (status, reused) = service
        .call_with(
            "POST",
            &path,
            &vision,
            Some(bid_for(tuner, &offer, 1)),
            &key,
        )
        .await;
    assert_eq!(
        (status, reused["code"].as_str()),
        (422, Some("idempotency_key_reused")),
        "{reused}"
    );
    assert_eq!(reused["type"], "/problems/idempotency_key_reused");

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
    // The round that re-auctions them is open once the tuner is offered GPUs in it.
    next_offer(&service, &vision, tuner, round).await;
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
    // Every payment here was exact and every PF choice proved: a stored fallback of either
    // kind that the engine does not reproduce is caught.
    for (flag, among) in [
        ("c_fallback", "c IS NOT NULL"),
        ("pf_fallback", "pf_entry IS NOT NULL"),
    ] {
        let differences = replay_after_setting(&service, flag, among).await;
        assert!(
            differences
                .iter()
                .any(|difference| difference.contains(&format!("{flag}: true"))),
            "{flag}: {differences:?}"
        );
    }
    service.running.stop().await;
}

/// Sets `flag` on the first stored allocation row matching `among` and replays its round:
/// the differences replay finds.
async fn replay_after_setting(service: &support::Service, flag: &str, among: &str) -> Vec<String> {
    let (round,): (i64,) = sqlx::query_as(&format!(
        "UPDATE round_allocations SET {flag} = true
          WHERE (round_id, app_id) = (SELECT round_id, app_id FROM round_allocations
                                       WHERE {among} ORDER BY round_id, app_id LIMIT 1)
          RETURNING round_id"
    ))
    .fetch_one(service.running.store.pool())
    .await
    .expect("a row to set");
    let replay = replay_round(&service.running.store, RoundId(round))
        .await
        .expect("replay");
    assert!(!replay.matches, "{flag} set, yet replay matches");
    replay.differences
}

/// The next offer for `app` in a round after `after_round`.
async fn next_offer(service: &support::Service, token: &str, app: i64, after_round: i64) -> Value {
    let later_offer = |event: &Value| {
        event["kind"] == "offer" && event["payload"]["round"].as_i64() > Some(after_round)
    };
    service.wait_for_event(token, app, later_offer).await["payload"].clone()
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
    // The first round's key with the second round's bid is not a retry (D2).
    let (status, reused) = service
        .call_with(
            "POST",
            &path,
            &vision,
            Some(bid_for(tuner, &offer, 1)),
            &[("idempotency-key", winner)],
        )
        .await;
    assert_eq!(
        (status, reused["code"].as_str()),
        (422, Some("idempotency_key_reused")),
        "{reused}"
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
    // The writer may commit the registration with the round, in one refused transaction: then
    // the registration is refused too, never stored without its answer.
    let app = |name: &str| {
        json!({ "name": name, "bidding": "explicit",
                "app": { "kind": "single_job", "job": { "id": "j0", "total_iterations": 1_000,
                         "serial_iteration_time": 1.0, "max_gpus": 2 } } })
    };
    let (status, body) = service
        .call("POST", "/v1/apps", &vision, Some(app("tuner")))
        .await;
    assert!(status == 201 || status == 503, "{status}: {body}");
    let reason = tokio::time::timeout(Duration::from_secs(5), service.running.failed())
        .await
        .expect("the arbiter stops");
    assert!(
        reason.contains("rounds are refused for this test"),
        "{reason}"
    );

    // Nothing is decided any more: requests for the arbiter are refused, not lost.
    let (status, problem) = service
        .call("POST", "/v1/apps", &vision, Some(app("later")))
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

    // D7: another tenant can neither bid for the app nor read it, and cannot tell it from an
    // app that does not exist: the answer is the same 404, word for word.
    let missing = 999_999;
    let probes = |app: i64| -> Vec<(&'static str, String, Option<Value>)> {
        vec![
            ("POST", path.clone(), Some(bid_for(app, &offer, 1))),
            ("GET", format!("/v1/apps/{app}"), None),
            ("GET", format!("/v1/apps/{app}/leases"), None),
            ("GET", format!("/v1/apps/{app}/why"), None),
            (
                "GET",
                format!("/v1/apps/{app}/events/poll?timeout_ms=1"),
                None,
            ),
            ("GET", format!("/v1/apps/{app}/rho-history"), None),
            ("POST", format!("/v1/apps/{app}/finish"), None),
            (
                "POST",
                format!("/v1/apps/{app}/progress"),
                Some(json!({ "jobs": [] })),
            ),
        ]
    };
    for ((method, path, body), (_, missing_path, missing_body)) in
        probes(tuner).into_iter().zip(probes(missing))
    {
        let (status, foreign) = service.call(method, &path, &speech, body).await;
        let (missing_status, absent) = service
            .call(method, &missing_path, &speech, missing_body)
            .await;
        assert_eq!((status, missing_status), (404, 404), "{path}: {foreign}");
        let mut anonymous = foreign.clone();
        anonymous["detail"] = json!(foreign["detail"]
            .as_str()
            .expect("detail")
            .replace(&format!("app {tuner} "), &format!("app {missing} ")));
        assert_eq!(anonymous, absent, "{method} {path}");
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

    // D5: the admin lists every tenant's apps; a tenant only its own.
    let (status, all) = service.call("GET", "/v1/apps", ADMIN, None).await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(all[0]["id"], json!(tuner), "{all}");
    let (status, own) = service.call("GET", "/v1/apps", &speech, None).await;
    assert_eq!((status, own), (200, json!([])));
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
    let mut forgetting = service.running.tokens.forgetting();
    sqlx::query(
        "DELETE FROM api_tokens WHERE tenant_id = (SELECT id FROM tenants WHERE name = 'vision')",
    )
    .execute(service.running.store.pool())
    .await
    .expect("delete the token");
    // The deletion reaches the service as a notice (migration 0006), which forgets every
    // remembered token (or the service was not yet listening, and starting to forgets them).
    tokio::time::timeout(Duration::from_secs(30), forgetting.changed())
        .await
        .expect("the service hears of the deletion")
        .expect("the service runs");
    let status = service.call("GET", "/v1/apps", &vision, None).await.0;
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
    service
        .bid(&vision, round, bid_for(bidder, &offer, 1))
        .await;
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

/// The report that finished an app, sent again (a retry after a lost answer, also one that
/// arrives while the first is still being committed), is answered as the first was and stored
/// once; a report the finished app did not take is still refused; finishing it is a no-op.
#[actix_web::test]
async fn the_report_that_finished_an_app_may_be_sent_again() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let app = service.register(&vision, "tuner", "agent", 2, 1_000).await;
    let path = format!("/v1/apps/{app}/progress");
    let last = json!({ "jobs": [{ "job": "j0", "completed_iterations": 1000 },
                                { "job": "j1", "completed_iterations": 600, "stopped": true }] });
    let (first, racing) = tokio::join!(
        service.call("POST", &path, &vision, Some(last.clone())),
        service.call("POST", &path, &vision, Some(last.clone())),
    );
    let later = service.call("POST", &path, &vision, Some(last)).await;
    for (status, body) in [first, racing, later] {
        assert_eq!(
            (status, body["finished"].clone()),
            (200, json!(true)),
            "{body}"
        );
    }
    for not_taken in [
        json!({ "jobs": [{ "job": "j0", "completed_iterations": 999 }] }),
        json!({ "jobs": [{ "job": "j1", "completed_iterations": 700, "stopped": true }] }),
        json!({ "jobs": [{ "job": "j2", "completed_iterations": 1 }] }),
    ] {
        let (status, body) = service.call("POST", &path, &vision, Some(not_taken)).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (409, Some("app_not_active")),
            "{body}"
        );
    }
    let (reports,): (i64,) = sqlx::query_as("SELECT count(*) FROM job_progress WHERE app_id = $1")
        .bind(app)
        .fetch_one(service.running.store.pool())
        .await
        .expect("progress rows");
    assert_eq!(reports, 2, "the finishing report, once");
    let (status, body) = service
        .call("POST", &format!("/v1/apps/{app}/finish"), &vision, None)
        .await;
    assert_eq!(status, 204, "an app that finished stays finished: {body}");
    service.running.stop().await;
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

    // The app's rho as the arbiter computes it: now (its standing, as `why` shows it) and
    // projected onto an allocation, with or without hypothetical progress; nothing changes.
    let path = format!("/v1/apps/{app}/rho");
    let project = |gpus: Vec<String>, progress: Value| {
        let body = json!({ "gpus": gpus, "progress": progress });
        let (service, vision, path) = (&service, &vision, &path);
        async move { service.call("POST", path, vision, Some(body)).await }
    };
    let (status, on_held) = project(held.clone(), json!([])).await;
    assert_eq!(status, 200, "{on_held}");
    let (_, why) = service
        .call("GET", &format!("/v1/apps/{app}/why"), &vision, None)
        .await;
    let now = on_held["rho"]
        .as_f64()
        .expect("it holds GPUs: a finite rho");
    assert_eq!(
        why["now"]["rho"].as_f64(),
        Some(now),
        "the arbiter's own standing"
    );
    assert_eq!(
        on_held["projected_rho"].as_f64(),
        Some(now),
        "on what it holds"
    );
    let (_, on_none) = project(Vec::new(), json!([])).await;
    assert_eq!(
        on_none["projected_rho"],
        Value::Null,
        "holding nothing: unbounded"
    );
    let (_, on_one) = project(held[..1].to_vec(), json!([])).await;
    assert!(
        on_one["projected_rho"].as_f64().expect("finite") > now,
        "{on_one}"
    );
    let progress = json!([{ "job": "j0", "completed_iterations": 50_000 },
                          { "job": "j1", "completed_iterations": 50_000 }]);
    let (_, ahead) = project(held.clone(), progress).await;
    assert!(
        ahead["projected_rho"].as_f64().expect("finite") < now,
        "{ahead}"
    );
    let (_, again) = project(held.clone(), json!([])).await;
    assert_eq!(again["rho"], on_held["rho"], "a projection changes nothing");
    let (status, problem) = project(vec!["no-such-gpu".to_owned()], json!([])).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (422, Some("invalid_allocation"))
    );
    let speech = service.tenant("speech").await;
    let (status, _) = service
        .call("POST", &path, &speech, Some(json!({ "gpus": [] })))
        .await;
    assert_eq!(status, 404, "another tenant's app is not found");
    service.running.stop().await;
}

/// Databases of one Postgres cluster are migrated at the same time (several arbiters, or these
/// tests in parallel): no migration may update an object the whole cluster shares, such as a
/// role's settings, or two of them fail with "tuple concurrently updated" (CI failed so).
#[actix_web::test]
async fn many_databases_of_one_cluster_migrate_at_once() {
    let mut databases = Vec::new();
    for _ in 0..8 {
        databases.push(fresh_database().await);
    }
    let migrations = databases.iter().map(|database| Store::connect(database));
    for (database, migrated) in databases
        .iter()
        .zip(futures_util::future::join_all(migrations).await)
    {
        migrated.unwrap_or_else(|error| panic!("{database}: {error}"));
    }
}

/// Once a decision cannot be written, no later one is: the database keeps an exact prefix of
/// the arbiter's decisions (a later one was made on the state the failed one left in memory).
/// A flush answers once everything queued before it is done.
#[actix_web::test]
async fn after_a_failed_decision_the_writer_writes_nothing_later() {
    let database = fresh_database().await;
    let store = Store::connect(&database).await.expect("database");
    // Writes as the leader does: holding the lock, under the epoch it claimed.
    let mut lock = LeaderLock::connect(&database).await.expect("lock");
    assert!(lock.try_acquire().await.expect("lock"));
    store.lead(lock.claim("http://writer.test").await.expect("epoch"));
    let cluster = Cluster::from_spec(&ClusterSpec::uniform(1, 1, 1, 1)).expect("cluster");
    store.sync_fleet(&cluster).await.expect("fleet");
    let gpu = cluster.gpus().next().expect("one GPU").1.id.clone();
    let writer = Writer::spawn(store.clone());
    let now = Timestamp(0);
    let refused = Commit {
        events: vec![AppEvent {
            app: AppKey(999_999),
            payload: EventPayload::LeaseEnded(LeaseEndedEvent {
                lease: LeaseKey(1),
                state: "expired".to_owned(),
                gpus: Vec::new(),
                reason: None,
            }),
        }],
        ..Commit::default()
    };
    assert!(
        writer.commit(refused, now).await.is_err(),
        "an event for an app that does not exist is refused"
    );
    let drain = Commit {
        gpu_health: vec![(gpu, false)],
        ..Commit::default()
    };
    assert!(writer.commit(drain, now).await.is_err());
    writer.flush().await;
    assert_eq!(
        store.unhealthy_gpus().await.expect("read"),
        Vec::<agora_market::topology::GpuId>::new(),
        "the later decision is not written"
    );
}

/// How one turn of [`turns_of_a_contested_market`] goes, from the tuner's side.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Turn {
    /// The other tenant's app stands in the round and bids (its agent); the tuner bids for
    /// two GPUs.
    Contested,
    /// As `Contested`, but the other tenant finishes its app while the round collects bids.
    OtherFinishesMidRound,
    /// The tuner bids an empty table (it wants nothing from the auction).
    EmptyTable,
    /// The tuner stays silent; its agent's fallback bid stands in at the deadline.
    Silent,
}

/// A market of four GPUs with f = 0 (every app wanting GPUs bids): tenant `vision`'s tuner
/// (explicit bids, wants all four) holds the GPUs; each turn tenant `speech` registers an app
/// wanting four GPUs while they are leased, the tuner's lease ends (the clock moves on 61 s)
/// and a round offers the GPUs to both. Returns the rounds, one per turn, after checking that
/// each closed.
async fn turns_of_a_contested_market(service: &support::Service, turns: &[Turn]) -> Vec<i64> {
    let vision = service.tenant("vision").await;
    let speech = service.tenant("speech").await;
    let tuner = service
        .register(&vision, "tuner", "explicit", 4, 1_000_000)
        .await;
    let first = service.wait_for(&vision, tuner, "offer").await;
    let mut round = first["round"].as_i64().expect("round");
    service.bid(&vision, round, bid_for(tuner, &first, 4)).await;
    service
        .wait_for_leases(&vision, tuner, |leases| active(leases).len() == 1)
        .await;
    let mut rounds = Vec::new();
    for (index, &turn) in turns.iter().enumerate() {
        let other = service
            .register(&speech, &format!("other-{index}"), "agent", 4, 1_000_000)
            .await;
        // The tuner's lease ends: one round offers the four GPUs to both apps.
        service.clock.advance(Duration::from_secs(61));
        let offer = next_offer(service, &vision, tuner, round).await;
        round = offer["round"].as_i64().expect("round");
        let other_offer = service.wait_for(&speech, other, "offer").await;
        assert_eq!(
            other_offer["round"],
            json!(round),
            "both apps bid in the round"
        );
        if turn == Turn::OtherFinishesMidRound {
            // The other tenant's timer fires while the round collects bids.
            let (status, body) = service
                .call("POST", &format!("/v1/apps/{other}/finish"), &speech, None)
                .await;
            assert_eq!(status, 204, "{body}");
        }
        let bid = match turn {
            Turn::Contested | Turn::OtherFinishesMidRound => Some(bid_for(tuner, &offer, 2)),
            Turn::EmptyTable => Some(json!({ "app": tuner, "rho_old": offer["rho"], "bids": [] })),
            Turn::Silent => None,
        };
        match bid {
            Some(bid) => {
                let path = format!("/v1/rounds/{round}/bids");
                let (status, body) = service.call("POST", &path, &vision, Some(bid)).await;
                assert_eq!(status, 201, "{body}");
            }
            None => service.clock.advance(Duration::from_secs(11)),
        }
        let detail = decided(service, &vision, tuner, round).await;
        assert_eq!(detail["status"], "closed", "{detail}");
        rounds.push(round);
        if turn == Turn::OtherFinishesMidRound {
            let leases = service
                .wait_for_leases(&vision, tuner, |leases| active(leases).len() == 1)
                .await;
            let lease = active(&leases)[0];
            assert_eq!(lease["round_id"], json!(round));
            assert_eq!(
                lease["gpus"].as_array().expect("gpus").len(),
                4,
                "the tuner won its two GPUs and got the departed app's share as leftovers"
            );
            continue;
        }
        // The other app leaves; a round offers what it held to the tuner, which takes it.
        let (status, body) = service
            .call("POST", &format!("/v1/apps/{other}/finish"), &speech, None)
            .await;
        assert_eq!(status, 204, "{body}");
        let (_, cluster) = service.call("GET", "/v1/cluster", &vision, None).await;
        let free = cluster["gpus"]
            .as_array()
            .expect("gpus")
            .iter()
            .filter(|gpu| gpu["lease_id"].is_null())
            .count();
        if free > 0 {
            let offer = next_offer(service, &vision, tuner, round).await;
            round = offer["round"].as_i64().expect("round");
            let path = format!("/v1/rounds/{round}/bids");
            let bid = bid_for(tuner, &offer, free);
            let (status, body) = service.call("POST", &path, &vision, Some(bid)).await;
            assert_eq!(status, 201, "{body}");
            assert_eq!(
                decided(service, &vision, tuner, round).await["status"],
                "closed"
            );
        }
        service
            .wait_for_leases(&vision, tuner, |leases| {
                active(leases)
                    .iter()
                    .map(|lease| lease["gpus"].as_array().map_or(0, Vec::len))
                    .sum::<usize>()
                    == 4
            })
            .await;
    }
    rounds
}

/// Round `round` once it is decided: `bidder`, offered GPUs in it, is told its result.
async fn decided(service: &support::Service, token: &str, bidder: i64, round: i64) -> Value {
    let result_of_round = |event: &Value| {
        event["kind"] == "round_result" && event["payload"]["round"].as_i64() == Some(round)
    };
    service.wait_for_event(token, bidder, result_of_round).await;
    let (status, detail) = service
        .call("GET", &format!("/v1/rounds/{round}"), ADMIN, None)
        .await;
    assert_eq!(status, 200, "{detail}");
    detail
}

/// D1: a tenant finishing its apps on a timer, each time while a round collects bids, never
/// stops another tenant's rounds: each round goes on without the departed app (its bid
/// withdrawn, its share handed out as leftovers) and the other tenant's bids keep winning.
/// Time moves only by the manual clock.
#[actix_web::test]
async fn a_tenant_finishing_apps_mid_round_never_stops_another_tenants_rounds() {
    let service = every_app_bids().await;
    let turns = [Turn::OtherFinishesMidRound; 3];
    let rounds = turns_of_a_contested_market(&service, &turns).await;
    assert_eq!(rounds.len(), 3);
    let abandoned: i64 =
        sqlx::query_scalar("SELECT count(*) FROM rounds WHERE status = 'abandoned'")
            .fetch_one(service.running.store.pool())
            .await
            .expect("count");
    assert_eq!(abandoned, 0, "no round was abandoned");
    assert_replay_exactly(&service, rounds.into_iter().map(RoundId).collect()).await;
    service.running.stop().await;
}

/// The service with f = 0: every app wanting GPUs bids in every round.
async fn every_app_bids() -> support::Service {
    let database = fresh_database().await;
    let config = agora_server::config::ServerConfig {
        fairness_knob: 0.0,
        ..config(&database)
    };
    serve(&config, start_clock()).await
}

async fn assert_replay_exactly(service: &support::Service, rounds: Vec<RoundId>) {
    for round in rounds {
        let replay = replay_round(&service.running.store, round)
            .await
            .expect("replay");
        assert!(replay.matches, "round {round}: {:?}", replay.differences);
    }
}

/// D3: every kind of round replays exactly, with zero false mismatches: an explicit bid that
/// wins, a contest with another tenant's agent, an empty bid table, a silent explicit bidder
/// (the agent's fallback), a bidder that left mid-round.
#[actix_web::test]
async fn a_history_with_every_kind_of_round_replays_without_a_mismatch() {
    let service = every_app_bids().await;
    let turns = [
        Turn::Contested,
        Turn::EmptyTable,
        Turn::Silent,
        Turn::OtherFinishesMidRound,
    ];
    turns_of_a_contested_market(&service, &turns).await;
    let rounds = service
        .running
        .store
        .closed_round_ids()
        .await
        .expect("rounds");
    assert!(rounds.len() > turns.len(), "{rounds:?}");
    let empty_tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM bids b WHERE NOT EXISTS
           (SELECT FROM bid_entries e WHERE e.bid_id = b.id)",
    )
    .fetch_one(service.running.store.pool())
    .await
    .expect("count");
    assert!(
        empty_tables >= 1,
        "the history has a bid with an empty table"
    );
    assert_replay_exactly(&service, rounds).await;
    service.running.stop().await;
}

/// D4 and D6: bad input is a precise 4xx naming what is wrong (422 for a well-formed but
/// invalid body), never a 5xx, and no database text ever reaches a client. Nothing is stored.
#[actix_web::test]
async fn bad_input_is_a_precise_4xx_naming_the_field_and_never_database_text() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let app = service.register(&vision, "tuner", "agent", 1, 1_000).await;
    let job = |id: &str| {
        json!({ "job": { "id": id, "total_iterations": 100, "serial_iteration_time": 1.0,
                         "max_gpus": 1 }, "predicted_final_iteration": 100 })
    };
    let curve = |name: &str, id: &str| json!({ "name": name, "app": { "kind": "performance_curve", "jobs": [job(id)] } });
    let halving = json!({ "name": "grows", "app": { "kind": "successive_halving",
        "budget_gpu_seconds": 100.0, "phase_iterations": [10, 10, 10], "jobs_per_phase": [4, 8, 1],
        "jobs": (0..8).map(|index| job(&format!("j{index}"))["job"].clone()).collect::<Vec<_>>() } });
    let adapting = |seconds: f64| {
        let mut app = curve("adapting", "j0");
        app["app"]["jobs"][0]["job"]["speed_changes"] =
            json!([{ "at_iteration": 50, "serial_iteration_time": seconds }]);
        app
    };
    // (method, path, token, body, status, code, what the detail names)
    type Case<'a> = (
        &'a str,
        String,
        &'a str,
        Option<Value>,
        u16,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/tenants".into(),
            ADMIN,
            Some(json!({ "name": "a\u{0}b" })),
            422,
            "invalid_text",
            "/name",
        ),
        (
            "POST",
            "/v1/tenants".into(),
            ADMIN,
            Some(json!({ "name": "x".repeat(101) })),
            422,
            "invalid_tenant",
            "name",
        ),
        (
            "POST",
            "/v1/tenants".into(),
            ADMIN,
            Some(json!({ "name": "evil\u{202E}gnp" })),
            422,
            "invalid_tenant",
            "name",
        ),
        (
            "POST",
            "/v1/tenants".into(),
            ADMIN,
            Some(json!({ "name": 7 })),
            422,
            "invalid_body",
            "string",
        ),
        (
            "POST",
            "/v1/apps".into(),
            &vision,
            Some(curve("a\u{0}", "j0")),
            422,
            "invalid_text",
            "/name",
        ),
        (
            "POST",
            "/v1/apps".into(),
            &vision,
            Some(curve("ok", "j\u{0}")),
            422,
            "invalid_text",
            "/app/jobs/0/job/id",
        ),
        (
            "POST",
            "/v1/apps".into(),
            &vision,
            Some(curve("tab\there", "j0")),
            422,
            "invalid_app",
            "name",
        ),
        (
            "POST",
            "/v1/apps".into(),
            &vision,
            Some(halving),
            422,
            "invalid_app",
            "jobs_per_phase",
        ),
        (
            "POST",
            "/v1/apps".into(),
            &vision,
            Some(adapting(-1.0)),
            422,
            "invalid_app",
            "speed_changes[0].serial_iteration_time",
        ),
        (
            "POST",
            "/v1/apps".into(),
            &vision,
            Some(json!({ "name": "x", "app": { "kind": "nope" } })),
            422,
            "invalid_body",
            "nope",
        ),
        (
            "POST",
            "/v1/apps".into(),
            &vision,
            Some(
                json!({ "name": "x", "app": { "job": { "id": "j", "total_iterations": 10,
                "serial_iteration_time": 1.0, "max_gpus": 1 },
                "throughput": { "v100": "fast" }, "kind": "single_job" } }),
            ),
            422,
            "invalid_body",
            "app: throughput.v100: invalid type: string \"fast\", expected f64",
        ),
        (
            "POST",
            "/v1/apps".into(),
            &vision,
            Some(json!({ "app": curve("x", "j0")["app"] })),
            422,
            "invalid_body",
            "name",
        ),
        (
            "POST",
            format!("/v1/apps/{app}/progress"),
            &vision,
            Some(json!({ "jobs": [{ "job": "j\u{0}", "completed_iterations": 1 }] })),
            422,
            "invalid_text",
            "/jobs/0/job",
        ),
        (
            "GET",
            "/v1/rounds?limit=0".into(),
            &vision,
            None,
            400,
            "bad_query",
            "limit",
        ),
        (
            "GET",
            "/v1/rounds?limit=501".into(),
            &vision,
            None,
            400,
            "bad_query",
            "limit",
        ),
        (
            "GET",
            format!("/v1/apps/{app}/rho-history?limit=0"),
            &vision,
            None,
            400,
            "bad_query",
            "limit",
        ),
        (
            "GET",
            format!("/v1/apps/{app}/events/poll?timeout_ms=60001"),
            &vision,
            None,
            400,
            "bad_query",
            "timeout_ms",
        ),
    ];
    for (method, path, token, body, status, code, named) in cases {
        let (got, problem) = service.call(method, &path, token, body.clone()).await;
        assert_eq!(
            (got, problem["code"].as_str()),
            (status, Some(code)),
            "{method} {path} {body:?} -> {problem}"
        );
        let detail = problem["detail"].as_str().expect("detail");
        assert!(detail.contains(named), "{path}: {detail:?} names {named:?}");
        for database_text in ["SQL", "sql", "database", "0x00", "UTF8", "byte sequence"] {
            assert!(!detail.contains(database_text), "{path}: {detail:?}");
        }
    }
    for path in [
        format!("/v1/apps/{app}/events"),
        "/v1/rounds/events".to_owned(),
    ] {
        for bad in ["abc", "-1", "1.5"] {
            let (status, problem) = service
                .call_with("GET", &path, &vision, None, &[("last-event-id", bad)])
                .await;
            assert_eq!(
                (status, problem["code"].as_str()),
                (400, Some("bad_last_event_id")),
                "{path} Last-Event-ID {bad:?}: a bad id replays nothing"
            );
        }
    }
    let tenants: i64 = sqlx::query_scalar("SELECT count(*) FROM tenants")
        .fetch_one(service.running.store.pool())
        .await
        .expect("count");
    let apps: i64 = sqlx::query_scalar("SELECT count(*) FROM apps")
        .fetch_one(service.running.store.pool())
        .await
        .expect("count");
    assert_eq!((tenants, apps), (1, 1), "nothing refused was stored");
    service.running.stop().await;
}

#[actix_web::test]
async fn a_duplicate_app_name_is_refused_and_registrations_go_on_through_the_writer() {
    let database = fresh_database().await;
    let service = serve(&config(&database), start_clock()).await;
    let vision = service.tenant("vision").await;
    let speech = service.tenant("speech").await;
    let tuner = service.register(&vision, "tuner", "agent", 1, 1_000).await;
    let again = json!({ "name": "tuner", "bidding": "agent",
                        "app": { "kind": "single_job", "job": { "id": "j", "total_iterations": 10,
                                 "serial_iteration_time": 1.0, "max_gpus": 1 } } });
    let (status, problem) = service.call("POST", "/v1/apps", &vision, Some(again)).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (409, Some("duplicate_app_name")),
        "{problem}"
    );
    // The refusal failed no write: another tenant takes the name, the tenant another name,
    // and the first app's round goes on.
    let theirs = service.register(&speech, "tuner", "agent", 1, 1_000).await;
    let second = service
        .register(&vision, "tuner-2", "agent", 1, 1_000)
        .await;
    assert!(tuner < theirs && theirs < second);
    service
        .wait_for_leases(&vision, tuner, |leases| active(leases).len() == 1)
        .await;
    let apps: i64 = sqlx::query_scalar("SELECT count(*) FROM apps")
        .fetch_one(service.running.store.pool())
        .await
        .expect("count");
    assert_eq!(apps, 3);
    service.running.stop().await;
}

/// A framework reports a job's speed change as it happens. The answer is the job's schedule
/// after it; the app's rho moves with it at once; the app's JSON shows the job's phase; the SQL
/// history keeps the report with its time and the first round that uses it, and that round
/// replays exactly; the app's state carries the change across a restart; bad reports are 422
/// naming the field, and another tenant's app is not found.
#[actix_web::test]
async fn a_reported_speed_change_is_used_from_the_next_round_and_survives_a_restart() {
    let database = fresh_database().await;
    let settings = config(&database);
    let clock = start_clock();
    let service = serve(&settings, clock.clone()).await;
    let vision = service.tenant("vision").await;
    // Declared: from iteration 5,000 the job doubles its batch size, 0.6 s an iteration.
    let body = json!({ "name": "adaptive", "app": { "kind": "single_job", "job": {
        "id": "j", "total_iterations": 10_000, "serial_iteration_time": 1.0, "max_gpus": 2,
        "speed_changes": [{ "at_iteration": 5_000, "serial_iteration_time": 0.6 }] } } });
    let (status, answer) = service.call("POST", "/v1/apps", &vision, Some(body)).await;
    assert_eq!(status, 201, "{answer}");
    let app = answer["id"].as_i64().expect("id");
    assert_eq!(
        answer["jobs"],
        json!([{ "job": "j", "completed_iterations": 0, "phase": 0, "phases": 2,
                 "serial_iteration_time": 1.0,
                 "next_change": { "at_iteration": 5_000, "serial_iteration_time": 0.6 } }])
    );
    service
        .wait_for_leases(&vision, app, |leases| active(leases).len() == 1)
        .await;
    let (status, body) = service
        .call(
            "POST",
            &format!("/v1/apps/{app}/progress"),
            &vision,
            Some(json!({ "jobs": [{ "job": "j", "completed_iterations": 1_000 }] })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let rho_now = || async {
        let path = format!("/v1/apps/{app}/rho");
        let (status, view) = service.call("POST", &path, &vision, Some(json!({}))).await;
        assert_eq!(status, 200, "{view}");
        view["rho"].as_f64().expect("it holds GPUs")
    };
    let forecast = rho_now().await;
    let opened: i64 = sqlx::query_scalar("SELECT max(id) FROM rounds")
        .fetch_one(service.running.store.pool())
        .await
        .expect("rounds");

    // It doubled at iteration 1,000 instead, and runs at 0.5 s: the declared change is dropped.
    let path = format!("/v1/apps/{app}/speed-changes");
    let change = |job: &str, at: u64, seconds: f64| json!({ "job": job, "at_iteration": at, "serial_iteration_time": seconds });
    let (status, answer) = service
        .call("POST", &path, &vision, Some(change("j", 1_000, 0.5)))
        .await;
    assert_eq!(status, 200, "{answer}");
    let phase = json!({ "job": "j", "completed_iterations": 1_000, "phase": 1, "phases": 2,
                        "serial_iteration_time": 0.5, "next_change": null });
    assert_eq!(
        answer,
        json!({ "speed_changes": [{ "at_iteration": 1_000, "serial_iteration_time": 0.5 }],
                "phase": phase })
    );
    let (_, shown) = service
        .call("GET", &format!("/v1/apps/{app}"), &vision, None)
        .await;
    assert_eq!(shown["jobs"], json!([phase]));
    let reported = rho_now().await;
    assert!(
        reported < forecast,
        "9,000 iterations of 0.5 s instead of 4,000 of 1 s, a restart and 5,000 of 0.6 s: \
         {reported} < {forecast}"
    );

    let bad = [
        (change("nope", 2_000, 0.5), "invalid_speed_change", "job"),
        (
            change("j", 999, 0.5),
            "invalid_speed_change",
            "at_iteration",
        ),
        (
            change("j", 10_000, 0.5),
            "invalid_speed_change",
            "at_iteration",
        ),
        (
            change("j", 2_000, 0.0),
            "invalid_speed_change",
            "serial_iteration_time",
        ),
        (
            change("j", 2_000, -1.0),
            "invalid_speed_change",
            "serial_iteration_time",
        ),
        (
            json!({ "job": "j", "at_iteration": 2_000 }),
            "invalid_body",
            "serial_iteration_time",
        ),
        (
            json!({ "job": "j", "at_iteration": -5, "serial_iteration_time": 0.5 }),
            "invalid_body",
            "`-5`, expected u64",
        ),
    ];
    service.assert_refused(&path, &vision, &bad).await;
    let other = service.tenant("other").await;
    let (status, answer) = service
        .call("POST", &path, &other, Some(change("j", 2_000, 0.4)))
        .await;
    assert_eq!(status, 404, "another tenant's app is not found: {answer}");

    let history: Vec<(String, i64, f64, i64, Value)> = sqlx::query_as(
        "SELECT job, at_iteration, serial_iteration_time, first_round, speed_changes
         FROM speed_change_reports WHERE app_id = $1 ORDER BY id",
    )
    .bind(app)
    .fetch_all(service.running.store.pool())
    .await
    .expect("the history");
    assert_eq!(
        history,
        vec![(
            "j".to_owned(),
            1_000,
            0.5,
            opened + 1,
            json!([{ "at_iteration": 1_000, "serial_iteration_time": 0.5 }])
        )],
        "only the accepted report, with the next round to open"
    );

    // Leases last 60 s: the round that re-auctions the GPUs ranks the app by the reported
    // speed, and replays exactly from what it stored.
    clock.advance(Duration::from_secs(61));
    service
        .wait_for_leases(&vision, app, |leases| {
            leases.len() == 2 && active(leases).len() == 1
        })
        .await;
    let rounds: Vec<RoundId> =
        sqlx::query_scalar("SELECT id FROM rounds WHERE id > $1 AND status = 'closed' ORDER BY id")
            .bind(opened)
            .fetch_all(service.running.store.pool())
            .await
            .expect("rounds");
    assert!(!rounds.is_empty(), "a round after the report");
    assert_replay_exactly(&service, rounds).await;
    service.running.stop().await;

    let restarted = serve(&settings, clock).await;
    let (_, shown) = restarted
        .call("GET", &format!("/v1/apps/{app}"), &vision, None)
        .await;
    assert_eq!(
        shown["jobs"],
        json!([phase]),
        "the report was restored with the app"
    );
    let (status, answer) = restarted
        .call("POST", &path, &vision, Some(change("j", 2_000, 0.4)))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer["speed_changes"],
        json!([{ "at_iteration": 1_000, "serial_iteration_time": 0.5 },
               { "at_iteration": 2_000, "serial_iteration_time": 0.4 }])
    );
    restarted.running.stop().await;
}
