//! The living demo at fast demo speed: a manual clock moves one second per step, so ten minutes
//! of demo take as long as the service needs to decide them, not ten minutes.

mod support;

use std::sync::Arc;
use std::time::Duration;

use agora_server::clock::{to_datetime, Clock as _};
use agora_server::config::ServerConfig;
use agora_server::demo::{adjust_with, Demo, DemoOptions};
use sqlx::{Connection as _, PgConnection};
use support::*;

/// The demo's default fleet: the Themis testbed's 64 GPUs on Azure machines with 6 CPU cores
/// and 56 GiB per GPU.
const TESTBED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../agora-sim/clusters/themis-testbed-azure.toml"
);
const GPUS: i64 = 64;
const CPUS_PER_GPU: f64 = 6.0;
const MEMORY_GIB_PER_GPU: f64 = 56.0;

#[actix_web::test]
async fn after_ten_minutes_of_demo_rounds_still_come_every_few_seconds_with_several_bidders() {
    let database_url = fresh_database().await;
    // The demo's own settings (short leases and bid windows) on its default fleet.
    let mut config = ServerConfig {
        fleet: TESTBED.into(),
        lease_seconds: ServerConfig::default().lease_seconds,
        round_deadline_ms: ServerConfig::default().round_deadline_ms,
        tick_ms: 2,
        ..config(&database_url)
    };
    let token_file = std::env::temp_dir().join("agora-demo-test-unused-token");
    adjust_with(&mut config, &token_file).expect("demo settings");
    let clock = start_clock();
    let service = serve(&config, clock.clone()).await;
    let start = to_datetime(clock.now());
    let options = DemoOptions::new(7, DemoOptions::DEFAULT_RATE).expect("valid");
    let mut demo = Demo::new(
        service.base.clone(),
        ADMIN.to_owned(),
        Arc::new(clock.clone()),
        options,
        None,
    )
    .await
    .expect("demo starts");
    let mut database = PgConnection::connect(&database_url).await.expect("connect");
    let mut changes = Changes::watch(&database_url).await;
    for _ in 0..600 {
        demo.step().await;
        clock.advance(Duration::from_secs(1));
        changes.settled(clock.now()).await;
    }
    let end = to_datetime(clock.now());
    let last_minute = end - chrono::Duration::seconds(60);

    // (opened_at, bidders, unmet demand of all standing apps, starving apps)
    let rounds: Vec<(chrono::DateTime<chrono::Utc>, i64, i64, i64)> = sqlx::query_as(
        "SELECT r.opened_at, count(*) FILTER (WHERE s.bidder),
                sum(s.unmet_demand)::bigint, count(*) FILTER (WHERE s.rho IS NULL)
         FROM rounds r JOIN round_standings s ON s.round_id = r.id
         WHERE r.opened_at >= $1 AND r.status = 'closed'
         GROUP BY r.id ORDER BY r.opened_at",
    )
    .bind(last_minute)
    .fetch_all(&mut database)
    .await
    .expect("rounds");
    assert!(
        rounds.len() >= 12,
        "{} rounds in the tenth minute",
        rounds.len()
    );
    let mut previous = last_minute;
    for &(opened_at, bidders, unmet, _) in &rounds {
        assert!(
            opened_at - previous <= chrono::Duration::seconds(5),
            "no round between {previous} and {opened_at}"
        );
        assert!(bidders >= 3, "round at {opened_at} had {bidders} bidders");
        assert!(
            unmet >= GPUS,
            "demand at {opened_at} is held + {unmet}: not 2x the {GPUS} GPUs"
        );
        previous = opened_at;
    }
    assert!(
        end - previous <= chrono::Duration::seconds(5),
        "rounds stopped at {previous}"
    );

    // The market lived: apps of both kinds and several tenants arrived all along, some
    // finished, some starved for a while.
    let (tenants, searches, singles, finished, late, starving): (i64, i64, i64, i64, i64, i64) =
        sqlx::query_as(
            "SELECT count(DISTINCT tenant_id),
                count(*) FILTER (WHERE kind = 'successive_halving'),
                count(*) FILTER (WHERE kind = 'single_job'),
                count(*) FILTER (WHERE finished_at IS NOT NULL),
                count(*) FILTER (WHERE arrived_at >= $1),
                (SELECT count(DISTINCT app_id) FROM round_standings WHERE rho IS NULL)
         FROM apps",
        )
        .bind(start + chrono::Duration::seconds(300))
        .fetch_one(&mut database)
        .await
        .expect("apps");
    assert_eq!(tenants, 4);
    assert!(
        searches >= 3 && singles >= 3,
        "{searches} searches, {singles} single jobs"
    );
    assert!(finished >= 3, "{finished} apps finished");
    assert!(late >= 3, "{late} apps arrived after minute 5");
    assert!(starving >= 3, "{starving} apps starved for a while");

    // Every lease came with CPUs and memory; the demo's apps have no profile, so each got its
    // GPUs' share of its machines.
    let shares: Vec<(i64, i32, Option<f64>, Option<f64>)> = sqlx::query_as(
        "SELECT r.lease_id, cardinality(l.gpus), r.cpus, r.memory_gib
         FROM lease_resources r JOIN leases l ON l.id = r.lease_id",
    )
    .fetch_all(&mut database)
    .await
    .expect("lease resources");
    let (leases,): (i64,) = sqlx::query_as("SELECT count(*) FROM leases")
        .fetch_one(&mut database)
        .await
        .expect("leases");
    let leases_with_resources: std::collections::BTreeSet<i64> =
        shares.iter().map(|&(lease, ..)| lease).collect();
    assert_eq!(leases_with_resources.len() as i64, leases);
    for (lease, gpus, cpus, memory_gib) in shares {
        let gpus = f64::from(gpus);
        assert_eq!(cpus, Some(CPUS_PER_GPU * gpus), "lease {lease}");
        assert_eq!(memory_gib, Some(MEMORY_GIB_PER_GPU * gpus), "lease {lease}");
    }
    service.running.stop().await;
}

#[actix_web::test]
async fn a_restarted_demo_goes_on_as_the_same_tenants_with_new_apps() {
    let database_url = fresh_database().await;
    let config = config(&database_url);
    let tokens = std::env::temp_dir().join(format!("agora-demo-restart-{}", std::process::id()));
    let clock = start_clock();
    let mut live = Vec::new();
    for _run in 0..2 {
        let service = serve(&config, clock.clone()).await;
        let mut demo = Demo::new(
            service.base.clone(),
            ADMIN.to_owned(),
            Arc::new(clock.clone()),
            DemoOptions::default(),
            Some(&tokens),
        )
        .await
        .expect("demo starts");
        demo.step().await;
        live.push(demo.live_apps());
        let (_, me) = service.call("GET", "/v1/me", ADMIN, None).await;
        let unfinished = me["apps"]
            .as_array()
            .expect("apps")
            .iter()
            .filter(|app| app["finished_at"].is_null())
            .count();
        assert_eq!(
            unfinished,
            demo.live_apps(),
            "only this run's apps are active: {me}"
        );
        service.running.stop().await;
        clock.advance(Duration::from_secs(60));
    }
    assert!(
        live.iter().all(|&apps| apps > 0),
        "apps in both runs: {live:?}"
    );
    std::fs::remove_file(&tokens).expect("the tokens were kept");
}
