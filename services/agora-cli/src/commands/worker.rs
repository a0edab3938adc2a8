//! `agora worker`: the agent on a GPU host (see `docs/gpu-hosts.md`).

use std::path::PathBuf;
use std::time::Duration;

use agora_worker::backend::GpuBackend;
use agora_worker::health::HealthPolicy;
use agora_worker::nvml::NvmlBackend;
use agora_worker::simulated::SimulatedBackend;
use agora_worker::{Worker, WorkerConfig};
use anyhow::{bail, Context as _};
use clap::{Args, ValueEnum};

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Print this host's GPUs, their topology matrix and Agora's slots, then exit (no arbiter
    /// needed).
    #[arg(long)]
    discover: bool,
    /// The arbiter's URL, or several arbiters' of one database, comma-separated (the worker
    /// follows the leader).
    #[arg(long, env = "AGORA_ARBITER", default_value = "http://127.0.0.1:8080")]
    arbiter: String,
    /// The worker token the arbiter's operator issued.
    #[arg(
        long,
        env = "AGORA_WORKER_TOKEN",
        hide_env_values = true,
        required_unless_present = "discover"
    )]
    token: Option<String>,
    /// This host's name in the cluster (default: the machine's host name).
    #[arg(long, env = "AGORA_HOST")]
    host: Option<String>,
    /// The rack this host sits in.
    #[arg(long, env = "AGORA_RACK", default_value = "default")]
    rack: String,
    /// Where GPUs come from: the NVIDIA driver, or a topology file (`--topology`).
    #[arg(long, value_enum, default_value_t = BackendKind::Nvml)]
    gpu_backend: BackendKind,
    /// The simulated host's topology file (with `--gpu-backend simulated`).
    #[arg(long, value_name = "FILE")]
    topology: Option<PathBuf>,
    /// Heartbeat every MS milliseconds instead of the arbiter's interval.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    heartbeat_ms: Option<u64>,
    /// The host's CPU cores to report, instead of what the system says (or the topology file).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    cpus: Option<u32>,
    /// The host's memory (RAM) in GiB to report, instead of what the system says.
    #[arg(long, value_name = "GIB", value_parser = positive_gib)]
    host_memory_gib: Option<f64>,
    /// The cgroup v2 directory under which launched commands get their leases' CPU and memory
    /// limits; where it cannot be written, limits are not enforced (logged once).
    #[arg(long, value_name = "DIR", default_value = agora_worker::cgroup::DEFAULT_ROOT)]
    cgroup_root: PathBuf,
    /// A GPU at or above this temperature (°C) is reported unhealthy.
    #[arg(long, value_name = "CELSIUS", default_value_t = HealthPolicy::default().temperature_limit_celsius)]
    max_temperature: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendKind {
    /// NVML (`libnvidia-ml.so.1`, from the NVIDIA driver).
    Nvml,
    /// A host described by a topology file; never chosen unless asked for.
    Simulated,
}

impl WorkerArgs {
    pub fn run(self) -> anyhow::Result<()> {
        // Dropped after the runtime stops, so what the exporters still hold is sent.
        let _telemetry = agora_server::telemetry::init();
        let host = match &self.host {
            Some(host) => host.clone(),
            None => agora_worker::local_host_name()
                .context("cannot read this machine's host name; pass --host NAME")?,
        };
        let mut backend = self.backend(&host)?;
        if self.discover {
            let topology = agora_worker::topology::discover(backend.as_mut())
                .context("cannot discover this host's GPUs")?;
            print!("{}", topology.render());
            return Ok(());
        }
        let config = WorkerConfig {
            arbiter: self.arbiter,
            token: self.token.unwrap_or_default(),
            host,
            rack: self.rack,
            heartbeat_interval: self.heartbeat_ms.map(Duration::from_millis),
            health: HealthPolicy {
                temperature_limit_celsius: self.max_temperature,
            },
            backend,
            cpus: self.cpus,
            host_memory_gib: self.host_memory_gib,
            cgroup_root: Some(self.cgroup_root),
        };
        actix_web::rt::System::new().block_on(async move {
            let worker = Worker::new(config)?;
            worker
                .run(async {
                    if let Err(error) = super::serve::shutdown_signal().await {
                        tracing::error!(%error, "stopping");
                    }
                })
                .await?;
            Ok(())
        })
    }

    fn backend(&self, host: &str) -> anyhow::Result<Box<dyn GpuBackend>> {
        match (self.gpu_backend, &self.topology) {
            (BackendKind::Nvml, None) => Ok(Box::new(NvmlBackend::init()?)),
            (BackendKind::Nvml, Some(_)) => {
                bail!("--topology describes a simulated host: add --gpu-backend simulated")
            }
            (BackendKind::Simulated, Some(path)) => {
                Ok(Box::new(SimulatedBackend::load(path, host)?))
            }
            (BackendKind::Simulated, None) => bail!(
                "--gpu-backend simulated needs --topology FILE (an example: \
                 services/agora-worker/examples/dgx-like.toml)"
            ),
        }
    }
}

/// A finite number of GiB above 0.
fn positive_gib(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|gib| gib.is_finite() && *gib > 0.0)
        .ok_or_else(|| format!("expected a number of GiB above 0, got {text:?}"))
}
