//! `GpuWorker`: one per GPU, mirroring what the GPU's host runs. In a simulated fleet (`--demo`,
//! tests) the mirror is the whole worker: it starts and stops leases instantly. Real hosts
//! attach through `agora worker` (NVML).

use actix::prelude::*;

/// The worker's view of its GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuState {
    pub gpu: String,
    pub cuda_uuid: String,
    pub healthy: bool,
    /// The active lease on this GPU and its app.
    pub running: Option<(i64, i64)>,
}

#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum GpuCommand {
    /// Start running `app` under `lease`.
    Run {
        lease: i64,
        app: i64,
    },
    /// The lease ended: stop whatever it ran.
    Stop {
        lease: i64,
    },
    SetHealth(bool),
}

#[derive(Debug, Message)]
#[rtype(result = "GpuState")]
pub struct GetGpuState;

#[derive(Debug)]
pub struct GpuWorker {
    state: GpuState,
}

impl GpuWorker {
    pub fn simulated(gpu: String, cuda_uuid: String, healthy: bool) -> Self {
        Self {
            state: GpuState {
                gpu,
                cuda_uuid,
                healthy,
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
            .send(GpuCommand::Run { lease: 1, app: 9 })
            .await
            .expect("running");
        worker
            .send(GpuCommand::Stop { lease: 0 })
            .await
            .expect("running");
        let state = worker.send(GetGpuState).await.expect("running");
        assert_eq!(
            state.running,
            Some((1, 9)),
            "a stop for another lease changes nothing"
        );
        worker
            .send(GpuCommand::Stop { lease: 1 })
            .await
            .expect("running");
        let state = worker.send(GetGpuState).await.expect("running");
        assert_eq!(state.running, None);
    }
}
