//! The failover scenario's arbiters: two `agora serve` processes on one database, on loopback
//! ports, the leader killed with SIGKILL again and again while the players play. Each takeover
//! is timed from the kill until the survivor answers what only a leader answers; the killed
//! arbiter is then started again, as a standby.

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::api::Api;

/// How long an arbiter may take to start answering, or a standby to take over, before the run
/// gives up (a bound against hanging; takeovers are measured, and checked against 5 s).
const GIVE_UP_AFTER: Duration = Duration::from_secs(60);
/// How often an arbiter is asked again while one is awaited (a takeover is timed to this).
const PROBE_EVERY: Duration = Duration::from_millis(10);

/// How to start one arbiter.
#[derive(Debug, Clone)]
pub struct ServeCommand {
    /// The `agora` binary.
    pub agora: PathBuf,
    /// `agora serve --config`.
    pub config: PathBuf,
    pub database_url: String,
    pub admin_token: String,
    /// Each arbiter's output goes to `<log_dir>/arbiter-<n>.log`.
    pub log_dir: PathBuf,
}

/// The arbiters, by index: the process and the loopback address it listens on.
#[allow(missing_debug_implementations)] // actix_rt::Runtime is not Debug
pub struct Arbiters {
    command: ServeCommand,
    addresses: Vec<String>,
    processes: Vec<Child>,
    /// Runs the probes.
    runtime: actix_rt::Runtime,
}

impl Arbiters {
    /// Starts one arbiter per address (the first to start leads) and waits until each answers.
    pub fn start(command: ServeCommand, addresses: Vec<String>) -> anyhow::Result<Self> {
        let mut arbiters = Self {
            command,
            addresses,
            processes: Vec::new(),
            runtime: actix_rt::Runtime::new()?,
        };
        for index in 0..arbiters.addresses.len() {
            let process = arbiters.spawn(index)?;
            arbiters.processes.push(process);
            arbiters.wait_until_up(index)?;
        }
        Ok(arbiters)
    }

    /// The base URLs, comma-separated, as the players take them.
    pub fn bases(&self) -> String {
        self.addresses
            .iter()
            .map(|address| format!("http://{address}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn(&self, index: usize) -> anyhow::Result<Child> {
        let log = self.command.log_dir.join(format!("arbiter-{index}.log"));
        let output = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("cannot open {}", log.display()))?;
        Command::new(&self.command.agora)
            .arg("serve")
            .arg("--config")
            .arg(&self.command.config)
            .env("AGORA_LISTEN", &self.addresses[index])
            .env("DATABASE_URL", &self.command.database_url)
            .env("AGORA_ADMIN_TOKEN", &self.command.admin_token)
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .spawn()
            .with_context(|| format!("cannot start {}", self.command.agora.display()))
    }

    fn wait_until_up(&self, index: usize) -> anyhow::Result<()> {
        let api = Api::new(&format!("http://{}", self.addresses[index]));
        let token = &self.command.admin_token;
        let deadline = Instant::now() + GIVE_UP_AFTER;
        self.runtime.block_on(async {
            loop {
                match api.call("GET", "/healthz", token, None, &[]).await {
                    Ok(answer) if answer.status == 200 => return Ok(()),
                    _ if Instant::now() > deadline => {
                        bail!(
                            "arbiter {index} did not start within {GIVE_UP_AFTER:?} (see its log)"
                        )
                    }
                    _ => actix_rt::time::sleep(PROBE_EVERY).await,
                }
            }
        })
    }

    /// The first arbiter, other than `except`, that answers what only the leader answers:
    /// waits for one.
    fn leader(&self, except: Option<usize>) -> anyhow::Result<usize> {
        let token = &self.command.admin_token;
        let deadline = Instant::now() + GIVE_UP_AFTER;
        self.runtime.block_on(async {
            let apis: Vec<Api> = self
                .addresses
                .iter()
                .map(|address| Api::new(&format!("http://{address}")))
                .collect();
            loop {
                for (index, api) in apis.iter().enumerate() {
                    if Some(index) == except {
                        continue;
                    }
                    let answer = api
                        .call("GET", "/v1/rounds/current", token, None, &[])
                        .await;
                    if matches!(answer, Ok(answer) if matches!(answer.status, 200 | 404)) {
                        return Ok(index);
                    }
                }
                if Instant::now() > deadline {
                    bail!("no arbiter led within {GIVE_UP_AFTER:?} (see their logs)");
                }
                actix_rt::time::sleep(PROBE_EVERY).await;
            }
        })
    }

    /// Kills the leader with SIGKILL and returns how long until another arbiter led; then
    /// starts the killed one again, as a standby, and waits until it answers.
    pub fn kill_leader(&mut self) -> anyhow::Result<Duration> {
        let leader = self.leader(None)?;
        let killed_at = Instant::now();
        self.processes[leader].kill()?;
        self.processes[leader].wait()?;
        self.leader(Some(leader))?;
        let takeover = killed_at.elapsed();
        self.processes[leader] = self.spawn(leader)?;
        self.wait_until_up(leader)?;
        Ok(takeover)
    }

    /// Stops every arbiter (SIGKILL: what they wrote is all that counts).
    pub fn stop(mut self) {
        for process in &mut self.processes {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}
