//! Progress reports as an asynchronous successive-halving framework (ASHA, Optuna's pruners)
//! sends them, seen through the market: the app keeps bidding for the phase its survivors are
//! really in.

use agora_market::app::{App, AppId, AppKind, Job, PlacementSlowdown, SuccessiveHalving};
use agora_market::market::{Market, MarketConfig};
use agora_market::progress::JobProgress;
use agora_market::time::Timestamp;

use crate::support::{uniform_cluster, LEASE};

fn job(id: &str, total_iterations: u64) -> Job {
    Job {
        id: id.to_owned(),
        total_iterations,
        completed_iterations: 0,
        serial_iteration_time: 1.0,
        max_gpus: 1,
        slowdown: PlacementSlowdown::default(),
        stopped: false,
        speed_changes: Vec::new(),
    }
}

fn report(job: &str, completed_iterations: u64, stopped: bool) -> JobProgress {
    JobProgress {
        job: job.to_owned(),
        completed_iterations,
        stopped,
        observed: None,
    }
}

#[test]
fn a_survivor_past_several_rungs_keeps_its_app_bidding_once_the_last_loser_stops() {
    // Rungs at 1, 3 and 9 iterations (phases of 1, 2 and 6), two trials. Trial a runs past the
    // first two rungs (to 5) before trial b is stopped at the first: the app must be in its
    // last phase, where a still runs, and want a GPU for it. (It used to stop one phase short,
    // in a phase where no job ran: no demand, no bid, and a waited forever.)
    let app_id = AppId::from("asha");
    let app = App {
        id: app_id.clone(),
        kind: AppKind::SuccessiveHalving(SuccessiveHalving {
            budget_gpu_seconds: 1_000.0,
            phase_iterations: vec![1, 2, 6],
            jobs_per_phase: vec![2, 1, 1],
            max_gpus_per_phase: Vec::new(),
            current_phase: 0,
            jobs: vec![job("a", 9), job("b", 9)],
            throughput: Default::default(),
            sensitivity: Default::default(),
        }),
    };
    let config = MarketConfig {
        lease_length: LEASE,
        ..MarketConfig::default()
    };
    let mut market =
        Market::new(uniform_cluster(1, 1, 1, 2), config, Timestamp(0)).expect("valid config");
    market.add_app(app, Timestamp(0)).expect("new app");

    let reported = market.app_mut(&app_id).expect("registered");
    reported
        .apply_progress(&[report("a", 5, false)])
        .expect("valid");
    reported
        .apply_progress(&[report("b", 1, true)])
        .expect("valid");

    let app = market.app(&app_id).expect("registered");
    let AppKind::SuccessiveHalving(search) = &app.kind else {
        unreachable!("built as successive halving")
    };
    assert_eq!(search.current_phase, 2, "a is in the last phase");
    assert_eq!(app.current_demand(), 1, "a still runs, to iteration 9");
    assert!(!app.is_finished());

    let round = market
        .open_round(Timestamp(10))
        .expect("the app wants a GPU");
    assert_eq!(round.bidders, vec![app_id.clone()]);
    market
        .run_round(Timestamp(10), 1)
        .expect("something to offer")
        .expect("valid round");
    assert_eq!(
        market.leases().leases_of(&app_id).count(),
        1,
        "a's app holds a GPU again"
    );
}
