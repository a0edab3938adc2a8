//! Lease enforcement on the host, as each lease's app chose ([`Enforcement`]).
//!
//! `Launch`: the worker starts the lease's command in a process group of its own, with
//! `CUDA_VISIBLE_DEVICES` set to the lease's GPU UUIDs, sends SIGTERM to the group
//! `grace_seconds` before the lease ends and SIGKILL when it ends, and reports how the command
//! ended in the next heartbeat. The whole group is signalled so that the command's own
//! children (launchers such as `torchrun` start several) end with it. The arbiter's latest
//! word on a lease wins: an end moved earlier (a revocation) is followed, and a lease that
//! disappears from the arbiter's reply is over now (SIGTERM now, SIGKILL after its grace).
//!
//! `Watch`: the app runs its jobs itself; [`violations`] names processes the lease does not
//! cover. The rule is the same for every GPU of the host, whatever the lease's mode.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future as _;
use std::os::unix::process::ExitStatusExt as _;
use std::pin::pin;
use std::process::{ExitStatus, Stdio};
use std::task::Poll;

use agora_protocol::{Enforcement, HostLease, LeaseExit, Violation};
use chrono::{DateTime, TimeDelta, Utc};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::backend::GpuProcess;
use crate::cgroup::{Cgroups, Limits};

/// The exit code reported for a command that could not be started (the shell's code for
/// "command not found").
pub const EXIT_NOT_STARTED: i32 = 127;

/// The commands launched for leases on this host and how they ended.
#[derive(Debug, Default)]
pub struct Enforcer {
    /// The arbiter's latest word on each lease it still lists.
    leases: BTreeMap<i64, HostLease>,
    running: BTreeMap<i64, Launched>,
    /// Leases whose command has already run (or could not start): never launched again.
    done: BTreeSet<i64>,
    /// Ends not yet delivered to the arbiter, oldest first.
    exits: Vec<LeaseExit>,
    /// Where launched commands get their CPU and memory limits; `None`: not enforced.
    cgroups: Option<Cgroups>,
}

#[derive(Debug)]
struct Launched {
    child: tokio::process::Child,
    /// The process group, whose id is the command's pid.
    group: Pid,
    end_at: DateTime<Utc>,
    grace: TimeDelta,
    terminated: bool,
    killed: bool,
    /// The CPU and memory limits its cgroup has; `None`: it runs in none.
    limits: Option<Limits>,
}

impl Enforcer {
    /// An enforcer that limits launched commands' CPUs and memory in `cgroups`, if given.
    pub fn with_cgroups(cgroups: Option<Cgroups>) -> Self {
        Self {
            cgroups,
            ..Self::default()
        }
    }

    /// Takes the arbiter's current list of leases on this host, then does what is due.
    pub fn apply(&mut self, leases: &[HostLease], now: DateTime<Utc>) {
        let listed: BTreeSet<i64> = leases.iter().map(|lease| lease.lease_id).collect();
        for (lease_id, launched) in &mut self.running {
            match leases.iter().find(|lease| lease.lease_id == *lease_id) {
                Some(lease) => {
                    launched.end_at = lease.end_at;
                    follow_limits(self.cgroups.as_ref(), lease, launched);
                }
                None => launched.end_at = launched.end_at.min(now + launched.grace),
            }
        }
        self.leases = leases
            .iter()
            .map(|lease| (lease.lease_id, lease.clone()))
            .collect();
        self.done.retain(|lease_id| listed.contains(lease_id));
        self.tick(now);
    }

    /// Launches commands whose lease has started, signals those whose time is up and collects
    /// the ones that ended.
    pub fn tick(&mut self, now: DateTime<Utc>) {
        self.reap();
        self.launch_due(now);
        for (lease_id, launched) in &mut self.running {
            if now >= launched.end_at && !launched.killed {
                tracing::warn!(lease_id, "lease over: SIGKILL to its command");
                signal_group(launched.group, Signal::SIGKILL);
                launched.killed = true;
            } else if now >= launched.end_at - launched.grace && !launched.terminated {
                tracing::info!(lease_id, "lease ends soon: SIGTERM to its command");
                signal_group(launched.group, Signal::SIGTERM);
                launched.terminated = true;
            }
        }
    }

    /// Whether any launched command is still running.
    pub fn has_running(&self) -> bool {
        !self.running.is_empty()
    }

    /// Ends every launched command as if its lease were over now: SIGTERM, then SIGKILL after
    /// the lease's grace. Call [`Enforcer::tick`] until [`Enforcer::has_running`] is false.
    pub fn end_all(&mut self, now: DateTime<Utc>) {
        self.apply(&[], now);
    }

    /// Waits until a launched command ends (at once when none runs); the next
    /// [`Enforcer::tick`] collects how it ended.
    pub async fn command_ended(&mut self) {
        std::future::poll_fn(|context| {
            let ended = self.running.is_empty()
                || self
                    .running
                    .values_mut()
                    .any(|launched| pin!(launched.child.wait()).poll(context).is_ready());
            if ended {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// Exits not yet delivered, to put in the next heartbeat.
    pub fn undelivered_exits(&self) -> Vec<LeaseExit> {
        self.exits.clone()
    }

    /// The arbiter accepted a heartbeat carrying the first `count` undelivered exits.
    pub fn exits_delivered(&mut self, count: usize) {
        self.exits.drain(..count.min(self.exits.len()));
    }

    fn reap(&mut self) {
        let mut ended = Vec::new();
        for (lease_id, launched) in &mut self.running {
            match launched.child.try_wait() {
                Ok(Some(status)) => ended.push((*lease_id, Ok(status))),
                Ok(None) => {}
                Err(error) => ended.push((*lease_id, Err(error))),
            }
        }
        for (lease_id, status) in ended {
            let Some(launched) = self.running.remove(&lease_id) else {
                continue;
            };
            let exit = match status {
                Ok(status) => exit_of(lease_id, status, launched.killed),
                Err(error) => {
                    tracing::error!(lease_id, %error, "cannot wait for the lease's command");
                    LeaseExit {
                        lease_id,
                        code: None,
                        signal: None,
                        killed_after_grace: launched.killed,
                    }
                }
            };
            tracing::info!(?exit, "lease command ended");
            if let (Some(cgroups), Some(_)) = (&self.cgroups, launched.limits) {
                cgroups.remove(lease_id);
            }
            self.exits.push(exit);
            self.done.insert(lease_id);
        }
    }

    fn launch_due(&mut self, now: DateTime<Utc>) {
        let due: Vec<HostLease> = self
            .leases
            .values()
            .filter(|lease| {
                !self.running.contains_key(&lease.lease_id)
                    && !self.done.contains(&lease.lease_id)
                    && lease.start_at <= now
                    && now < lease.end_at - grace_of(lease)
            })
            .cloned()
            .collect();
        for lease in due {
            let Enforcement::Launch { command, env } = &lease.enforcement else {
                continue;
            };
            match launch(&lease, command, env) {
                Ok(mut launched) => {
                    launched.limits = confine(self.cgroups.as_ref(), &lease, &launched);
                    tracing::info!(
                        lease_id = lease.lease_id,
                        ?command,
                        "launched the lease's command"
                    );
                    self.running.insert(lease.lease_id, launched);
                }
                Err(error) => {
                    tracing::error!(lease_id = lease.lease_id, ?command, %error, "cannot launch the lease's command");
                    self.exits.push(LeaseExit {
                        lease_id: lease.lease_id,
                        code: Some(EXIT_NOT_STARTED),
                        signal: None,
                        killed_after_grace: false,
                    });
                    self.done.insert(lease.lease_id);
                }
            }
        }
    }
}

/// Longer grace periods are cut to this (a week), which keeps date arithmetic in range.
const MAX_GRACE_SECONDS: u64 = 7 * 24 * 3600;

fn grace_of(lease: &HostLease) -> TimeDelta {
    TimeDelta::seconds(lease.grace_seconds.min(MAX_GRACE_SECONDS) as i64)
}

fn launch(
    lease: &HostLease,
    command: &[String],
    env: &BTreeMap<String, String>,
) -> std::io::Result<Launched> {
    let (program, args) = command.split_first().ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "the command is empty")
    })?;
    let child = tokio::process::Command::new(program)
        .args(args)
        .envs(env)
        .env("CUDA_VISIBLE_DEVICES", lease.gpu_uuids.join(","))
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()?;
    let pid = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .ok_or_else(|| std::io::Error::other("the command exited before its pid was known"))?;
    Ok(Launched {
        child,
        group: Pid::from_raw(pid),
        end_at: lease.end_at,
        grace: grace_of(lease),
        terminated: false,
        killed: false,
        limits: None,
    })
}

fn limits_of(lease: &HostLease) -> Limits {
    Limits {
        cpus: lease.cpus,
        memory_gib: lease.memory_gib,
    }
}

/// Puts a launched command in its lease's cgroup, if limits are enforced and the lease has any;
/// gives the limits set. A failure is logged and leaves the command unconfined.
fn confine(cgroups: Option<&Cgroups>, lease: &HostLease, launched: &Launched) -> Option<Limits> {
    let limits = limits_of(lease);
    let cgroups = cgroups.filter(|_| !limits.is_unlimited())?;
    let pid = launched.child.id()?;
    match cgroups.confine(lease.lease_id, limits, pid) {
        Ok(()) => Some(limits),
        Err(error) => {
            tracing::warn!(lease_id = lease.lease_id, %error, "cannot limit the lease's CPUs and memory");
            None
        }
    }
}

/// Applies the lease's current limits to its cgroup when a round changed them.
fn follow_limits(cgroups: Option<&Cgroups>, lease: &HostLease, launched: &mut Launched) {
    let (Some(cgroups), Some(current)) = (cgroups, launched.limits) else {
        return;
    };
    let wanted = limits_of(lease);
    if wanted == current {
        return;
    }
    match cgroups.set_limits(lease.lease_id, wanted) {
        Ok(()) => launched.limits = Some(wanted),
        Err(error) => {
            tracing::warn!(lease_id = lease.lease_id, %error, "cannot change the lease's CPU and memory limits");
        }
    }
}

fn signal_group(group: Pid, signal: Signal) {
    // The group may have just ended; the next reap reports it.
    if let Err(error) = killpg(group, signal) {
        tracing::debug!(%group, %error, "cannot signal the lease's process group");
    }
}

fn exit_of(lease_id: i64, status: ExitStatus, killed: bool) -> LeaseExit {
    LeaseExit {
        lease_id,
        code: status.code(),
        signal: status.signal(),
        killed_after_grace: killed,
    }
}

/// The processes on the host's GPUs that their leases do not cover. A process may use a GPU
/// only if a lease holds it and every GPU the process uses belongs to that same lease: one on
/// a GPU no lease holds is reported (`lease_id: None`), and one that spans a lease's GPUs and
/// others is reported on each of its GPUs.
pub fn violations(
    leases: &[HostLease],
    processes_by_gpu: &BTreeMap<String, Vec<GpuProcess>>,
) -> Vec<Violation> {
    let holder: BTreeMap<&str, i64> = leases
        .iter()
        .flat_map(|lease| {
            lease
                .gpu_uuids
                .iter()
                .map(|uuid| (uuid.as_str(), lease.lease_id))
        })
        .collect();
    let mut gpus_of_pid: BTreeMap<u32, BTreeSet<&str>> = BTreeMap::new();
    for (uuid, processes) in processes_by_gpu {
        for process in processes {
            gpus_of_pid.entry(process.pid).or_default().insert(uuid);
        }
    }
    let mut found = Vec::new();
    for (uuid, processes) in processes_by_gpu {
        let lease_id = holder.get(uuid.as_str()).copied();
        for process in processes {
            let confined = lease_id.is_some_and(|lease_id| {
                gpus_of_pid[&process.pid]
                    .iter()
                    .all(|gpu| holder.get(gpu) == Some(&lease_id))
            });
            if !confined {
                found.push(Violation {
                    gpu_uuid: uuid.clone(),
                    lease_id,
                    pid: process.pid,
                    process_name: process.name.clone(),
                    used_memory_bytes: process.used_memory_bytes,
                });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(lease_id: i64, gpus: &[&str]) -> HostLease {
        let start = DateTime::from_timestamp(1_800_000_000, 0).expect("valid");
        HostLease {
            lease_id,
            app_id: 1,
            gpu_uuids: gpus.iter().map(|gpu| (*gpu).to_owned()).collect(),
            start_at: start,
            end_at: start + TimeDelta::minutes(10),
            grace_seconds: 30,
            enforcement: Enforcement::Watch,
            cpus: None,
            memory_gib: None,
        }
    }

    fn process(pid: u32) -> GpuProcess {
        GpuProcess {
            pid,
            name: format!("proc-{pid}"),
            used_memory_bytes: Some(1 << 30),
        }
    }

    fn on_gpus(placements: &[(&str, &[u32])]) -> BTreeMap<String, Vec<GpuProcess>> {
        placements
            .iter()
            .map(|(gpu, pids)| {
                (
                    (*gpu).to_owned(),
                    pids.iter().map(|pid| process(*pid)).collect(),
                )
            })
            .collect()
    }

    fn found(violations: &[Violation]) -> Vec<(&str, Option<i64>, u32)> {
        violations
            .iter()
            .map(|v| (v.gpu_uuid.as_str(), v.lease_id, v.pid))
            .collect()
    }

    #[test]
    fn processes_inside_their_lease_are_fine() {
        let leases = [lease(1, &["g0", "g1"]), lease(2, &["g2"])];
        let processes = on_gpus(&[("g0", &[100]), ("g1", &[100, 101]), ("g2", &[200])]);
        assert_eq!(violations(&leases, &processes), vec![]);
    }

    #[test]
    fn a_process_on_an_unleased_gpu_is_reported() {
        let leases = [lease(1, &["g0"])];
        let processes = on_gpus(&[("g0", &[]), ("g3", &[300])]);
        let report = violations(&leases, &processes);
        assert_eq!(found(&report), vec![("g3", None, 300)]);
        assert_eq!(report[0].process_name, "proc-300");
        assert_eq!(report[0].used_memory_bytes, Some(1 << 30));
    }

    #[test]
    fn a_process_spanning_two_leases_is_reported_on_each_gpu() {
        let leases = [lease(1, &["g0"]), lease(2, &["g1"])];
        let processes = on_gpus(&[("g0", &[100]), ("g1", &[100])]);
        assert_eq!(
            found(&violations(&leases, &processes)),
            vec![("g0", Some(1), 100), ("g1", Some(2), 100)]
        );
    }

    #[test]
    fn a_process_reaching_past_its_lease_to_a_free_gpu_is_reported() {
        let leases = [lease(1, &["g0"])];
        let processes = on_gpus(&[("g0", &[100]), ("g5", &[100])]);
        assert_eq!(
            found(&violations(&leases, &processes)),
            vec![("g0", Some(1), 100), ("g5", None, 100)]
        );
    }
}
