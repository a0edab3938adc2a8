//! Builders shared by the engine's tests.

use agora_market::app::{App, AppId, AppKind, Job, PlacementSlowdown};
use agora_market::topology::{Cluster, ClusterSpec};

pub fn single_job_app(id: &str, max_gpus: u32, iterations: u64, serial_seconds: f64) -> App {
    App {
        id: AppId::from(id),
        kind: AppKind::SingleJob {
            job: Job {
                id: format!("{id}-job"),
                total_iterations: iterations,
                completed_iterations: 0,
                serial_iteration_time: serial_seconds,
                max_gpus,
                slowdown: PlacementSlowdown::default(),
                stopped: false,
            },
        },
    }
}

pub fn uniform_cluster(
    racks: u32,
    machines_per_rack: u32,
    slots: u32,
    gpus_per_slot: u32,
) -> Cluster {
    Cluster::from_spec(&ClusterSpec::uniform(
        racks,
        machines_per_rack,
        slots,
        gpus_per_slot,
    ))
    .expect("valid spec")
}
