//! High availability: arbiters sharing one database elect one leader (the advisory lock), the
//! others stand by (reads served, writes turned away naming the leader), a standby takes over
//! when the leader's session ends, with every open lease and round, and the old leader's writes
//! are refused by the fencing epoch.

mod support;

use std::time::Duration;

use agora_server::store::StoreError;
use serde_json::json;
use support::{active, config, fresh_database, serve, start_clock, Service, ADMIN};

/// How long a test waits for what must happen promptly (a takeover, a lost lock noticed);
/// a bound against hanging, not a measurement (the load test measures takeovers).
const PROMPTLY: Duration = Duration::from_secs(30);

#[actix_web::test]
async fn a_standby_serves_reads_turns_writes_away_and_takes_over_every_lease_and_round() {
    let database = fresh_database().await;
    let settings = config(&database);
    let clock = start_clock();
    let mut leader = serve(&settings, clock.clone()).await;
    let standby = serve(&settings, clock).await;
    assert!(
        leader.running.leadership.arbiter().is_some(),
        "the first leads"
    );
    assert!(
        standby.running.leadership.arbiter().is_none(),
        "the second stands by"
    );

    // A lease held, and a round open with an acknowledged bid.
    let vision = leader.tenant("vision").await;
    let holder = leader.register(&vision, "holder", "agent", 2, 1_000).await;
    let held = leader
        .wait_for_leases(&vision, holder, |leases| active(leases).len() == 1)
        .await;
    let bidder = leader
        .register(&vision, "bidder", "explicit", 2, 1_000)
        .await;
    let offer = leader.wait_for(&vision, bidder, "offer").await;
    let round = offer["round"].as_i64().expect("round");
    let gpu = offer["gpus"][0]["id"].clone();
    let bid = json!({ "app": bidder, "rho_old": offer["rho"],
                      "bids": [{ "gpus": [gpu], "rho": 1.5 }] });
    leader.bid(&vision, round, bid).await;

    // The standby reads from the database...
    let (status, leases) = standby
        .call("GET", &format!("/v1/apps/{holder}/leases"), &vision, None)
        .await;
    assert_eq!(
        (status, leases[0]["id"].clone()),
        (200, held[0]["id"].clone())
    );
    // ...and sends every write, and what only the leader knows live, to the leader.
    let progress = json!({ "jobs": [{ "job": "j0", "completed_iterations": 10 }] });
    for (method, path, body) in [
        (
            "POST",
            format!("/v1/apps/{bidder}/progress"),
            Some(progress),
        ),
        ("GET", "/v1/rounds/current".to_owned(), None),
        ("GET", format!("/v1/apps/{bidder}/events/poll"), None),
    ] {
        let (status, problem) = standby.call(method, &path, &vision, body).await;
        assert_eq!(
            (status, &problem["code"], &problem["leader"]),
            (503, &json!("not_leader"), &json!(leader.base)),
            "{method} {path}: {problem}"
        );
    }

    // The leader loses its database session (a crash, a network cut): Postgres frees its lock.
    crash_leaders_session(&standby).await;
    tokio::time::timeout(PROMPTLY, standby.running.leadership.leading())
        .await
        .expect("the standby takes over");
    let reason = tokio::time::timeout(PROMPTLY, leader.running.failed())
        .await
        .expect("the old leader notices it lost the lock");
    assert!(reason.contains("lock"), "{reason}");

    // The new leader holds the lease and decides the open round with the acknowledged bid.
    let (status, why) = standby
        .call("GET", &format!("/v1/apps/{holder}/why"), &vision, None)
        .await;
    // Its one lease, of two GPUs.
    assert_eq!(
        (status, why["now"]["gpus_held"].clone()),
        (200, json!(2)),
        "{why}"
    );
    standby.clock.advance(Duration::from_secs(11));
    let won = standby
        .wait_for_leases(&vision, bidder, |leases| active(leases).len() == 1)
        .await;
    assert_eq!(won[0]["round_id"], json!(round));

    // The old leader can never write again: the fencing epoch refuses it...
    let refused = leader.running.store.create_tenant("stale", &[7; 32]).await;
    assert!(
        matches!(
            refused,
            Err(StoreError::Fenced {
                mine: 1,
                current: 2
            })
        ),
        "{refused:?}"
    );
    // ...whichever way a request reaches it.
    let (status, _) = leader
        .call(
            "POST",
            "/v1/tenants",
            ADMIN,
            Some(json!({ "name": "stale" })),
        )
        .await;
    assert_eq!(status, 503);
    let stale: i64 = sqlx::query_scalar("SELECT count(*) FROM tenants WHERE name = 'stale'")
        .fetch_one(standby.running.store.pool())
        .await
        .expect("count");
    assert_eq!(stale, 0);
    leader.running.stop().await;
    standby.running.stop().await;
}

#[actix_web::test]
async fn a_leader_that_stops_hands_over_to_the_standby() {
    let database = fresh_database().await;
    let settings = config(&database);
    let clock = start_clock();
    let leader = serve(&settings, clock.clone()).await;
    let standby = serve(&settings, clock).await;
    let vision = leader.tenant("vision").await;
    leader.running.stop().await;
    tokio::time::timeout(PROMPTLY, standby.running.leadership.leading())
        .await
        .expect("the standby takes over");
    let app = standby.register(&vision, "tuner", "agent", 1, 1_000).await;
    assert!(app > 0);
    let epoch: i64 = sqlx::query_scalar("SELECT epoch FROM leadership")
        .fetch_one(standby.running.store.pool())
        .await
        .expect("epoch");
    assert_eq!(epoch, 2, "each takeover is a new fencing epoch");
    standby.running.stop().await;
}

/// Ends the session holding the leader's advisory lock, as Postgres does when the leader's
/// process dies or its connection is lost.
async fn crash_leaders_session(other: &Service) {
    let ended: bool = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND database =
               (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(other.running.store.pool())
    .await
    .expect("the leader's lock session");
    assert!(ended);
}
