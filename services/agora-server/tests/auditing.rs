//! What auditors rely on: the queries of docs/auditing.md run as `agora_auditor` on a real
//! history, the role can read no secret and write nothing, and stored rounds replay exactly —
//! including every round of a demo run, replayed with only the auditor's rights.

mod support;

use std::time::Duration;

use agora_server::audit::replay_round;
use agora_server::clock::Clock as _;
use agora_server::demo::{Demo, DemoOptions};
use agora_server::store::Store;
use serde_json::json;
use sqlx::postgres::PgRow;
use sqlx::{Connection, PgConnection, Row};
use support::{active, config, fresh_database, serve, start_clock, Changes, Service};

/// The ```sql blocks of docs/auditing.md.
fn documented_queries() -> Vec<String> {
    let doc = include_str!("../../../docs/auditing.md");
    doc.split("```sql")
        .skip(1)
        .map(|block| {
            block
                .split("```")
                .next()
                .expect("a closed block")
                .trim()
                .to_owned()
        })
        .collect()
}

/// Two tenants' apps through two rounds of leases, a release and a finish: a history with
/// every kind of row the documented queries read.
async fn history(service: &Service) {
    let vision = service.tenant("vision").await;
    let speech = service.tenant("speech").await;
    let resnet = service
        .register(&vision, "resnet-sweep", "agent", 2, 1_000)
        .await;
    let wav2vec = service
        .register(&speech, "wav2vec", "agent", 2, 1_000)
        .await;
    for (token, app) in [(&vision, resnet), (&speech, wav2vec)] {
        service
            .wait_for_leases(token, app, |leases| active(leases).len() == 1)
            .await;
    }
    // A framework scaled a job's batch size: the next round ranks its app by the new speed.
    let change = json!({ "job": "j0", "at_iteration": 500, "serial_iteration_time": 0.5 });
    let (status, body) = service
        .call(
            "POST",
            &format!("/v1/apps/{resnet}/speed-changes"),
            &vision,
            Some(change),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // The first leases expire and the GPUs are auctioned again, now with every app holding
    // GPUs (so with a finite rho).
    service.clock.advance(Duration::from_secs(61));
    for (token, app) in [(&vision, resnet), (&speech, wav2vec)] {
        service
            .wait_for_leases(token, app, |leases| {
                leases.len() >= 2 && active(leases).len() == 1
            })
            .await;
    }
    let (_, leases) = service
        .call("GET", &format!("/v1/apps/{wav2vec}/leases"), &speech, None)
        .await;
    let lease = active(leases.as_array().expect("leases"))[0]["id"].clone();
    let (status, body) = service
        .call(
            "POST",
            &format!("/v1/leases/{lease}/release"),
            &speech,
            None,
        )
        .await;
    assert_eq!(status, 204, "{body}");
}

/// Runs `query` as `agora_auditor` (read only, in a transaction that is rolled back).
async fn as_auditor(connection: &mut PgConnection, query: &str) -> Result<Vec<PgRow>, sqlx::Error> {
    let mut transaction = connection.begin().await?;
    sqlx::query("SET LOCAL ROLE agora_auditor")
        .execute(&mut *transaction)
        .await?;
    let rows = sqlx::query(query).fetch_all(&mut *transaction).await;
    transaction.rollback().await?;
    rows
}

fn sqlstate(error: &sqlx::Error) -> Option<String> {
    error
        .as_database_error()
        .and_then(|db| db.code())
        .map(|code| code.into_owned())
}

#[actix_web::test]
async fn the_documented_queries_run_as_the_auditor_and_the_role_is_read_only() {
    let database = fresh_database().await;
    let service = serve(&with_resources(config(&database), "queries"), start_clock()).await;
    history(&service).await;
    let mut connection = PgConnection::connect(&database).await.expect("connect");

    let queries = documented_queries();
    assert!(queries.len() >= 6, "docs/auditing.md lost its examples");
    for query in &queries {
        let rows = as_auditor(&mut connection, query)
            .await
            .unwrap_or_else(|error| panic!("{error}\nin the documented query:\n{query}"));
        assert!(
            !rows.is_empty(),
            "the documented query returns nothing on a real history:\n{query}"
        );
        if query.contains("overlapping_leases") {
            let overlapping: i64 = rows[0].get("overlapping_leases");
            assert_eq!(overlapping, 0, "a GPU was leased twice");
        }
    }

    assert_denied_to_the_auditor(
        &mut connection,
        &[
            "SELECT * FROM api_tokens",
            "DELETE FROM round_allocations",
            "UPDATE leases SET state = 'revoked'",
            "INSERT INTO tenants (name) VALUES ('mallory')",
        ],
    )
    .await;
    service.running.stop().await;
}

/// Two machines of 2 GPUs with CPUs and memory, so that leases have a `lease_resources`
/// history; `name` keeps each test's fleet file its own.
fn with_resources(
    mut settings: agora_server::config::ServerConfig,
    name: &str,
) -> agora_server::config::ServerConfig {
    settings.fleet = std::env::temp_dir().join(format!(
        "agora-fleet-resources-{name}-{}.toml",
        std::process::id()
    ));
    std::fs::write(
        &settings.fleet,
        "[[racks]]\n[[racks.machines]]\ncount = 2\nslots = 1\ngpus_per_slot = 2\ngpu_type = \"A100\"\ncpus = 16\nmemory_gib = 64\n",
    )
    .expect("write fleet");
    settings
}

/// Every round of a history on machines with CPUs and memory replays its division of them:
/// each lease's CPUs and memory after the round, divided again from the round's record. A
/// changed `lease_resources` row is found, naming the lease.
#[actix_web::test]
async fn rounds_replay_their_division_of_cpus_and_memory_and_a_changed_row_is_found() {
    let database = fresh_database().await;
    let service = serve(&with_resources(config(&database), "replay"), start_clock()).await;
    history(&service).await;
    let store = &service.running.store;
    let rounds = store.closed_round_ids().await.expect("rounds");
    assert!(rounds.len() >= 2, "{rounds:?}");
    for &round in &rounds {
        let stored = store
            .stored_round(round)
            .await
            .expect("read")
            .expect("stored");
        assert!(
            stored.resource_division.is_some(),
            "round {round} recorded its division"
        );
        let replay = replay_round(store, round).await.expect("replay");
        assert!(replay.matches, "round {round}: {:?}", replay.differences);
    }
    let (lease, round): (i64, i64) = sqlx::query_as(
        "UPDATE lease_resources SET cpus = cpus + 1
         WHERE (lease_id, round_id) = (SELECT lease_id, round_id FROM lease_resources
                                       ORDER BY round_id DESC, lease_id LIMIT 1)
         RETURNING lease_id, round_id",
    )
    .fetch_one(store.pool())
    .await
    .expect("a lease with CPUs");
    let replay = replay_round(store, agora_server::ids::RoundId(round))
        .await
        .expect("replay");
    assert!(!replay.matches);
    assert!(
        replay
            .differences
            .iter()
            .any(|difference| difference.starts_with(&format!("lease {lease}: "))),
        "{:?}",
        replay.differences
    );
    service.running.stop().await;
}

/// A login role with the auditor's rights only, and its connection URL.
/// Roles are global to the Postgres server: each test names its own.
async fn auditor_login(database: &str, test: &str) -> (String, String) {
    let role = format!("agora_audit_{test}_{}", std::process::id());
    let mut admin = PgConnection::connect(database).await.expect("connect");
    sqlx::query(&format!("DROP ROLE IF EXISTS {role}"))
        .execute(&mut admin)
        .await
        .expect("drop role");
    sqlx::query(&format!("CREATE ROLE {role} LOGIN IN ROLE agora_auditor"))
        .execute(&mut admin)
        .await
        .expect("create role");
    let url = database.replacen("postgres@", &format!("{role}@"), 1);
    assert_ne!(
        url, database,
        "the test Postgres URL names the postgres user"
    );
    (role, url)
}

#[actix_web::test]
async fn every_round_of_a_demo_run_replays_exactly_with_only_the_auditors_rights() {
    let database = fresh_database().await;
    let mut settings = config(&database);
    agora_server::demo::adjust(&mut settings).expect("demo settings");
    let service = serve(&settings, start_clock()).await;
    let clock = std::sync::Arc::new(service.clock.clone());
    let mut demo = Demo::new(
        service.base.clone(),
        support::ADMIN.to_owned(),
        clock,
        DemoOptions::default(),
        None,
    )
    .await
    .expect("the demo starts");

    // The demo's apps bid and report progress over HTTP; leases expiring (on the manual
    // clock) start round after round.
    let store = &service.running.store;
    let mut changes = Changes::watch(&database).await;
    let mut rounds = Vec::new();
    for _ in 0..120 {
        rounds = store.closed_round_ids().await.expect("rounds");
        if rounds.len() >= 6 {
            break;
        }
        demo.step().await;
        service.clock.advance(Duration::from_secs(15));
        changes.settled(service.clock.now()).await;
    }
    assert!(
        rounds.len() >= 6,
        "the demo closed only {} rounds",
        rounds.len()
    );

    let (role, auditor_url) = auditor_login(&database, "replay").await;
    let auditor = Store::connect_without_migrating(&auditor_url)
        .await
        .expect("the auditor connects");
    for round in rounds {
        let replay = replay_round(&auditor, round).await.expect("replay");
        assert!(replay.matches, "round {round}: {:?}", replay.differences);
    }
    auditor.pool().close().await;
    service.running.stop().await;
    let mut admin = PgConnection::connect(&database).await.expect("connect");
    sqlx::query(&format!("DROP ROLE {role}"))
        .execute(&mut admin)
        .await
        .expect("drop role");
}

/// D9: an auditor reads history and nothing else. It cannot create temporary tables, cannot
/// notify the arbiter's token channel, and cannot lift its statement timeout: setting its own
/// `statement_timeout` to 0 does not keep a statement alive past the arbiter's limit.
#[actix_web::test]
async fn the_auditor_cannot_create_temp_tables_notify_or_outrun_its_statement_timeout() {
    let database = fresh_database().await;
    let settings = agora_server::config::ServerConfig {
        auditor_statement_timeout_ms: 300,
        ..config(&database)
    };
    let service = serve(&settings, start_clock()).await;
    let mut connection = PgConnection::connect(&database).await.expect("connect");
    assert_denied_to_the_auditor(
        &mut connection,
        &[
            "CREATE TEMP TABLE scratch (x int)",
            "CREATE TEMPORARY TABLE scratch AS SELECT 1",
            "SELECT pg_notify('agora_token_changes', '')",
        ],
    )
    .await;

    let (role, auditor_url) = auditor_login(&database, "limits").await;
    let mut auditor = PgConnection::connect(&auditor_url)
        .await
        .expect("the auditor connects");
    sqlx::query("SET statement_timeout = 0")
        .execute(&mut auditor)
        .await
        .expect("Postgres lets any role set its timeout");
    let started = std::time::Instant::now();
    let error = sqlx::query("SELECT pg_sleep(60)")
        .execute(&mut auditor)
        .await
        .expect_err("cancelled by the arbiter");
    assert_eq!(sqlstate(&error).as_deref(), Some("57014"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "cancelled after {:?}",
        started.elapsed()
    );
    let rows = sqlx::query("SELECT count(*) FROM round_summary")
        .fetch_all(&mut auditor)
        .await
        .expect("a short read still works");
    assert_eq!(rows.len(), 1);
    auditor.close().await.expect("close");
    service.running.stop().await;
    sqlx::query(&format!("DROP ROLE {role}"))
        .execute(&mut connection)
        .await
        .expect("drop role");
}

/// Each statement, run as the auditor, fails for want of privilege (SQLSTATE 42501).
async fn assert_denied_to_the_auditor(connection: &mut PgConnection, statements: &[&str]) {
    for &forbidden in statements {
        let error = as_auditor(connection, forbidden)
            .await
            .expect_err(forbidden);
        assert_eq!(
            sqlstate(&error).as_deref(),
            Some("42501"),
            "{forbidden}: {error}"
        );
    }
}
