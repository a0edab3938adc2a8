//! `GpuWorker`: one per GPU, mirroring what the GPU's host runs. In a simulated fleet (`--demo`,
//! tests) the mirror is the whole worker: it starts and stops leases instantly. On a GPU host
//! running `agora worker`, the mirror also holds what the host's last heartbeat said about the
//! GPU (its health and metrics); the worker itself enforces the leases.

use actix::prelude::*;
use agora_market::topology::GpuId;
use agora_protocol::{GpuHealth, GpuMetrics};

use crate::ids::{AppKey, LeaseKey};

/// The worker's view of its GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuState {
    pub gpu: GpuId,
    pub cuda_uuid: String,
    /// The host running `agora worker`; `None` in a simulated fleet.
    pub host: Option<String>,
    /// In service (offered in rounds).
    pub healthy: bool,
    /// The host's last report: health and metrics.
    pub reported: Option<(GpuHealth, GpuMetrics)>,
    /// The active lease on this GPU and its app.
    pub running: Option<(LeaseKey, AppKey)>,
}

#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum GpuCommand {
    /// Start running `app` under `lease`.
    Run {
        lease: LeaseKey,
        app: AppKey,
    },
    /// The lease ended: stop whatever it ran.
    Stop {
        lease: LeaseKey,
    },
    SetHealth(bool),
    /// The host's heartbeat reported on the GPU.
    Report {
        health: GpuHealth,
        metrics: GpuMetrics,
    },
}

#[derive(Debug, Message)]
#[rtype(result = "GpuState")]
pub struct GetGpuState;

#[derive(Debug)]
pub struct GpuWorker {
    state: GpuState,
}

impl GpuWorker {
    pub fn simulated(gpu: GpuId, cuda_uuid: String, healthy: bool) -> Self {
        Self {
            state: GpuState {
                gpu,
                cuda_uuid,
                host: None,
                healthy,
                reported: None,
                running: None,
            },
        }
    }

    /// A GPU of a host running `agora worker`; its id is its CUDA UUID.
    pub fn on_host(uuid: GpuId, host: String, healthy: bool) -> Self {
        Self {
            state: GpuState {
                cuda_uuid: uuid.0.clone(),
                gpu: uuid,
                host: Some(host),
                healthy,
                reported: None,
                running: None,
            },
        }
    }
}

impl Actor for GpuWorker {
    type Context = Context<Self>;
}

impl Handler<GpuCommand> for GpuWorker {
    type Result = ();

    fn handle(&mut self, command: GpuCommand, _: &mut Self::Context) {
        match command {
            GpuCommand::Run { lease, app } => self.state.running = Some((lease, app)),
            GpuCommand::Stop { lease } => {
                if self
                    .state
                    .running
                    .is_some_and(|(running, _)| running == lease)
                {
                    self.state.running = None;
                }
            }
            GpuCommand::SetHealth(healthy) => self.state.healthy = healthy,
            GpuCommand::Report { health, metrics } => {
                self.state.reported = Some((health, metrics));
            }
        }
    }
}

impl Handler<GetGpuState> for GpuWorker {
    type Result = MessageResult<GetGpuState>;

    fn handle(&mut self, _: GetGpuState, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.state.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix::test]
    async fn a_worker_runs_one_lease_and_ignores_stale_stops() {
        let worker = GpuWorker::simulated("m0-g0".into(), "GPU-x".into(), true).start();
        worker
            .send(GpuCommand::Run {
                lease: LeaseKey(1),
                app: AppKey(9),
            })
            .await
            .expect("running");
        worker
            .send(GpuCommand::Stop { lease: LeaseKey(0) })
            .await
            .expect("running");
        let state = worker.send(GetGpuState).await.expect("running");
        assert_eq!(
            state.running,
            Some((LeaseKey(1), AppKey(9))),
            "a stop for another lease changes nothing"
        );
        worker
            .send(GpuCommand::Stop { lease: LeaseKey(1) })
            .await
            .expect("running");
        let state = worker.send(GetGpuState).await.expect("running");
        assert_eq!(state.running, None);
    }

    #[actix::test]
    async fn a_host_gpu_mirrors_its_last_report() {
        let worker = GpuWorker::on_host("GPU-1".into(), "node-1".into(), true).start();
        let health = GpuHealth::Unhealthy {
            reason: "XID 79".into(),
        };
        let metrics = GpuMetrics {
            last_xid: Some(79),
            ..GpuMetrics::default()
        };
        worker
            .send(GpuCommand::Report {
                health: health.clone(),
                metrics: metrics.clone(),
            })
            .await
            .expect("running");
        let state = worker.send(GetGpuState).await.expect("running");
        assert_eq!(state.host.as_deref(), Some("node-1"));
        assert_eq!(state.reported, Some((health, metrics)));
    }
}
