//! Jobs whose speed changes as they train (batch-size scaling, Shockwave NSDI'23): rho uses
//! the forecast of the whole schedule, each change charged its checkpoint-restart pause.

use agora_market::app::{App, AppId, AppKind, Job, PlacementSlowdown, SpeedChange};
use agora_market::fairness::{cluster_time, rho, FairnessContext};
use agora_market::throughput::GpuSpeeds;
use agora_market::time::Timestamp;
use agora_market::topology::GpuLocation;

use crate::support::uniform_cluster;

const PAUSE: f64 = 35.0;

/// 1,000 iterations of 1 s on one GPU; from iteration 500 the job doubles its batch size and
/// runs an iteration (of its first batch size's samples) in 0.6 s.
fn doubling_job(completed: u64) -> Job {
    Job {
        id: "doubling".to_owned(),
        total_iterations: 1_000,
        completed_iterations: completed,
        serial_iteration_time: 1.0,
        max_gpus: 2,
        slowdown: PlacementSlowdown::NONE,
        stopped: false,
        speed_changes: vec![SpeedChange {
            at_iteration: 500,
            serial_iteration_time: 0.6,
        }],
    }
}

fn app(job: Job) -> App {
    App {
        id: AppId::from("adaptive"),
        kind: AppKind::SingleJob {
            job,
            throughput: Default::default(),
            sensitivity: Default::default(),
        },
    }
}

fn gpus(count: u32) -> Vec<GpuLocation> {
    let cluster = uniform_cluster(1, 1, 1, count);
    cluster
        .gpus()
        .map(|(index, _)| cluster.location(index))
        .collect()
}

#[test]
fn a_job_that_doubles_its_batch_size_is_forecast_over_its_whole_schedule() {
    let job = doubling_job(0);
    // 500 x 1 s + 500 x 0.6 s.
    assert_eq!(job.serial_seconds(0.0, 1_000.0), 800.0);
    assert_eq!(job.serial_iteration_time_at(499.0), 1.0);
    assert_eq!(job.serial_iteration_time_at(500.0), 0.6);
    assert_eq!(job.next_speed_change(0.0), Some(500));
    assert_eq!(job.next_speed_change(500.0), None);

    let fresh = app(job);
    let [info] = fresh.running_jobs()[..] else {
        panic!("one running job")
    };
    assert_eq!(info.iterations_remaining, 1_000.0);
    assert_eq!(
        info.serial_iteration_time, 0.8,
        "the mean over the schedule"
    );
    assert_eq!(info.speed_changes_ahead, 1);
    assert_eq!(fresh.total_work_gpu_seconds(), 800.0);

    let past = app(doubling_job(600));
    let [info] = past.running_jobs()[..] else {
        panic!("one running job")
    };
    assert_eq!(
        (info.iterations_remaining, info.serial_iteration_time),
        (400.0, 0.6)
    );
    assert_eq!(info.speed_changes_ahead, 0);
}

#[test]
fn rho_of_an_adapting_job_counts_its_speed_up_and_its_restart() {
    // Alone on the two GPUs: 800 s of work on 2 GPUs plus one 35 s pause.
    let fresh = app(doubling_job(0));
    let cluster_seconds = cluster_time(&fresh, &gpus(2), &GpuSpeeds::UNIFORM, PAUSE);
    assert!((cluster_seconds - 435.0).abs() < 1e-9, "{cluster_seconds}");

    // 200 s after arriving with 200 iterations done (on one GPU), contention 2 on average:
    // T_id = 2 x 435 = 870. On one GPU: 300 x 1 s + 35 s + 500 x 0.6 s = 635 s to go,
    // T_sh = 835, rho = 0.9598. On two: (300 + 35 x 2 + 300) / 2 = 335 s, rho = 535 / 870.
    let context = FairnessContext {
        now: Timestamp::from_secs_f64(200.0),
        arrival: Timestamp::from_secs_f64(0.0),
        cluster_seconds,
        average_contention: 2.0,
        restart_pause_seconds: PAUSE,
        speeds: GpuSpeeds::UNIFORM,
    };
    let running = app(doubling_job(200));
    let on = |count| {
        rho(&running, &gpus(count), &context)
            .expect("it holds GPUs")
            .get()
    };
    assert!((on(1) - 835.0 / 870.0).abs() < 1e-9, "{}", on(1));
    assert!((on(2) - 535.0 / 870.0).abs() < 1e-9, "{}", on(2));
}

#[test]
fn a_schedule_out_of_order_or_out_of_range_is_refused_naming_the_change() {
    let refusal = |changes: Vec<SpeedChange>| {
        let mut job = doubling_job(0);
        job.speed_changes = changes;
        app(job).validate().expect_err("an invalid schedule")
    };
    let at = |at_iteration, serial_iteration_time| SpeedChange {
        at_iteration,
        serial_iteration_time,
    };
    let late = refusal(vec![at(1_000, 0.5)]);
    assert!(late.contains("speed_changes[0].at_iteration"), "{late}");
    let backwards = refusal(vec![at(600, 0.5), at(400, 0.4)]);
    assert!(
        backwards.contains("speed_changes[1].at_iteration"),
        "{backwards}"
    );
    let at_start = refusal(vec![at(0, 0.5)]);
    assert!(
        at_start.contains("speed_changes[0].at_iteration"),
        "{at_start}"
    );
    let not_a_number = refusal(vec![at(500, f64::NAN)]);
    assert!(
        not_a_number.contains("speed_changes[0].serial_iteration_time"),
        "{not_a_number}"
    );
    let negative = refusal(vec![at(500, -1.0)]);
    assert!(
        negative.contains("speed_changes[0].serial_iteration_time"),
        "{negative}"
    );
}
