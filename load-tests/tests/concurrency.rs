//! A short load run against the service in-process (real Postgres, real HTTP): many frameworks
//! register, bid, report progress and release leases at once; afterwards every acknowledged
//! bid is in the database and no GPU was ever in two leases at overlapping times. No timing
//! assertions: speed is measured by the `agora-load` binary (`load-tests/RESULTS.md`).

// agora-server's own test helpers: a fresh database, the config, the service on port 0.
#[path = "../../services/agora-server/tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::Duration;

use agora_load::player::AckedBid;
use agora_load::run::{run_local, Plan};
use agora_load::stats::{Live, Op};
use agora_load::verify::verify;
use agora_server::clock::SystemClock;
use agora_server::server::start;

/// 16 GPUs: two racks of two machines with two slots of two GPUs.
fn fleet() -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("agora-load-fleet-{}.toml", std::process::id()));
    std::fs::write(
        &path,
        "[[racks]]\ncount = 2\n[[racks.machines]]\ncount = 2\nslots = 2\ngpus_per_slot = 2\ngpu_type = \"A100\"\n",
    )
    .expect("write fleet");
    path
}

#[actix_web::test]
async fn concurrent_frameworks_leave_every_acked_bid_stored_and_no_gpu_double_leased() {
    let database = support::fresh_database().await;
    let mut config = support::config(&database);
    config.fleet = fleet();
    config.fairness_knob = 0.5;
    config.round_deadline_ms = 5_000;
    let running = start(&config, Arc::new(SystemClock))
        .await
        .expect("service starts");
    let plan = Plan {
        base: format!("http://{}", running.address),
        admin_token: support::ADMIN.to_owned(),
        label: "concurrency".to_owned(),
        tenants: 3,
        apps: 24,
        jobs_per_app: 2,
        register_concurrency: 24,
        duration: Duration::from_secs(4),
        hold: Duration::from_millis(50),
        poll_timeout: Duration::from_secs(1),
        threads: 1,
    };
    let outcome = run_local(&plan, Arc::new(Live::default()))
        .await
        .expect("load runs");
    running.stop().await;

    assert!(
        outcome.stats.errors.is_empty(),
        "failed requests: {:?}",
        outcome.stats.errors
    );
    assert_eq!(outcome.registered, 24);
    assert!(
        outcome.stats.count(Op::Bid) > 24,
        "bids were posted in several rounds"
    );
    assert!(outcome.stats.count(Op::Release) > 0, "leases were released");
    assert!(
        outcome.stats.count(Op::Progress) > 0,
        "progress was reported"
    );

    let verification = verify(&database, &outcome.acked).await.expect("verify");
    assert!(verification.passed(), "{}", verification.summary());
    assert_eq!(verification.acked_bids, outcome.stats.count(Op::Bid));
    assert!(verification.leases > 0);

    // The check itself can fail: a bid the database never stored is reported missing.
    let invented = AckedBid {
        bid_id: -1,
        app: 1,
        round: 1,
    };
    let verification = verify(&database, &[invented]).await.expect("verify");
    assert_eq!(verification.missing_bids, vec![invented]);
    assert!(!verification.passed());
}
