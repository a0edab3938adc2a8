//! Lease enforcement with real child processes. The lease clock is injected (signals are due
//! when the test says the time has come); only process start-up and exit take real time, and
//! the tests wait for them, never a fixed time: each command writes to a named pipe once it
//! is ready (the test's read returns then), so no signal races its start, and a command's end
//! wakes [`Enforcer::command_ended`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agora_protocol::{Enforcement, HostLease, LeaseExit};
use agora_worker::cgroup::Cgroups;
use agora_worker::enforce::{Enforcer, EXIT_NOT_STARTED};
use chrono::{DateTime, TimeDelta, Utc};

const SIGKILL: i32 = 9;
const SIGTERM: i32 = 15;

/// A directory of its own for one test, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(label: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("agora-worker-test-{}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("the temporary directory is writable");
        Self(path)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// A named pipe: a command writes to it, and [`read_line`] returns what it wrote.
    fn pipe(&self, name: &str) -> PathBuf {
        let pipe = self.file(name);
        let made = std::process::Command::new("mkfifo")
            .arg(&pipe)
            .status()
            .expect("mkfifo runs");
        assert!(made.success(), "mkfifo {}", pipe.display());
        pipe
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start() -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000, 0).expect("valid")
}

/// A lease of ten minutes from [`start`] with a 30 s grace, launching `script` with `sh -c`.
fn launch_lease(lease_id: i64, script: &str) -> HostLease {
    HostLease {
        lease_id,
        app_id: 3,
        gpu_uuids: vec!["GPU-aaaa".to_owned(), "GPU-bbbb".to_owned()],
        start_at: start(),
        end_at: start() + TimeDelta::minutes(10),
        grace_seconds: 30,
        enforcement: Enforcement::Launch {
            command: vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()],
            env: BTreeMap::from([("AGORA_TEST".to_owned(), "hello".to_owned())]),
        },
        cpus: None,
        memory_gib: None,
    }
}

fn path(file: &Path) -> &str {
    file.to_str().expect("temporary paths are UTF-8")
}

/// What a command writes to `pipe`, once it has written and closed it.
async fn read_line(pipe: &Path) -> String {
    let pipe = pipe.to_owned();
    let read = actix_rt::task::spawn_blocking(move || std::fs::read_to_string(pipe));
    tokio::time::timeout(Duration::from_secs(30), read)
        .await
        .expect("the command never wrote to its pipe")
        .expect("the reader ran")
        .expect("the pipe is readable")
        .trim()
        .to_owned()
}

/// Ticks at `now` until a command has ended, and returns its exit.
async fn wait_for_exit(enforcer: &mut Enforcer, now: DateTime<Utc>) -> LeaseExit {
    loop {
        enforcer.tick(now);
        if let Some(exit) = enforcer.undelivered_exits().pop() {
            return exit;
        }
        assert!(enforcer.has_running(), "no command runs and none ended");
        tokio::time::timeout(Duration::from_secs(30), enforcer.command_ended())
            .await
            .expect("the command never ended");
    }
}

#[actix_rt::test]
async fn a_command_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let scratch = Scratch::new("stubborn");
    let (ready, termed) = (scratch.pipe("ready"), scratch.pipe("termed"));
    // SIGTERM ends the background `sleep`; the shell notes it and goes on with another. The
    // first `sleep` starts before the shell is ready: a SIGTERM that arrives while dash forks
    // can be lost, its trap never run.
    let lease = launch_lease(
        7,
        &format!(
            "trap 'echo termed > {}' TERM; sleep 60 & echo ready > {}; wait; sleep 60",
            path(&termed),
            path(&ready)
        ),
    );
    let mut enforcer = Enforcer::default();
    enforcer.apply(std::slice::from_ref(&lease), start());
    assert_eq!(read_line(&ready).await, "ready");

    let grace_starts = lease.end_at - TimeDelta::seconds(30);
    enforcer.tick(grace_starts);
    assert_eq!(read_line(&termed).await, "termed");
    enforcer.tick(grace_starts);
    assert!(enforcer.has_running());
    assert!(enforcer.undelivered_exits().is_empty());

    let exit = wait_for_exit(&mut enforcer, lease.end_at).await;
    assert_eq!(
        exit,
        LeaseExit {
            lease_id: 7,
            code: None,
            signal: Some(SIGKILL),
            killed_after_grace: true
        }
    );
}

#[actix_rt::test]
async fn a_well_behaved_command_ends_on_sigterm() {
    let scratch = Scratch::new("polite");
    let ready = scratch.pipe("ready");
    let lease = launch_lease(8, &format!("echo ready > {}; sleep 60", path(&ready)));
    let mut enforcer = Enforcer::default();
    enforcer.apply(std::slice::from_ref(&lease), start());
    read_line(&ready).await;

    let exit = wait_for_exit(&mut enforcer, lease.end_at - TimeDelta::seconds(30)).await;
    assert_eq!(
        exit,
        LeaseExit {
            lease_id: 8,
            code: None,
            signal: Some(SIGTERM),
            killed_after_grace: false
        }
    );
}

#[actix_rt::test]
async fn the_command_sees_the_lease_gpus_and_env_and_its_exit_is_reported_once() {
    let scratch = Scratch::new("env");
    let out = scratch.file("out");
    let lease = launch_lease(
        9,
        &format!(
            "echo \"$CUDA_VISIBLE_DEVICES $AGORA_TEST\" > {}; exit 3",
            path(&out)
        ),
    );
    let mut enforcer = Enforcer::default();
    enforcer.apply(std::slice::from_ref(&lease), start());
    let exit = wait_for_exit(&mut enforcer, start()).await;
    assert_eq!(
        exit,
        LeaseExit {
            lease_id: 9,
            code: Some(3),
            signal: None,
            killed_after_grace: false
        }
    );
    let seen = std::fs::read_to_string(&out).expect("the command wrote its environment");
    assert_eq!(seen.trim(), "GPU-aaaa,GPU-bbbb hello");

    // Delivered: gone from the next heartbeat, and the lease is not launched again.
    enforcer.exits_delivered(1);
    enforcer.apply(
        std::slice::from_ref(&lease),
        start() + TimeDelta::seconds(1),
    );
    assert!(!enforcer.has_running());
    assert!(enforcer.undelivered_exits().is_empty());
}

#[actix_rt::test]
async fn a_revoked_lease_is_ended_at_its_new_end() {
    let scratch = Scratch::new("revoked");
    let ready = scratch.pipe("ready");
    let mut lease = launch_lease(10, &format!("echo ready > {}; sleep 60", path(&ready)));
    let mut enforcer = Enforcer::default();
    enforcer.apply(std::slice::from_ref(&lease), start());
    read_line(&ready).await;

    // The arbiter moves the end to one minute in: SIGTERM is due 30 s before that.
    lease.end_at = start() + TimeDelta::minutes(1);
    let now = start() + TimeDelta::seconds(31);
    enforcer.apply(std::slice::from_ref(&lease), now);
    let exit = wait_for_exit(&mut enforcer, now).await;
    assert_eq!(exit.signal, Some(SIGTERM));
}

#[actix_rt::test]
async fn a_lease_missing_from_the_reply_is_over_now() {
    let scratch = Scratch::new("vanished");
    let ready = scratch.pipe("ready");
    let lease = launch_lease(11, &format!("echo ready > {}; sleep 60", path(&ready)));
    let mut enforcer = Enforcer::default();
    enforcer.apply(std::slice::from_ref(&lease), start());
    read_line(&ready).await;

    let now = start() + TimeDelta::seconds(5);
    enforcer.apply(&[], now);
    let exit = wait_for_exit(&mut enforcer, now).await;
    assert_eq!((exit.lease_id, exit.signal), (11, Some(SIGTERM)));
}

#[actix_rt::test]
async fn a_command_that_cannot_start_is_reported_as_not_found() {
    let mut lease = launch_lease(12, "");
    lease.enforcement = Enforcement::Launch {
        command: vec!["/nonexistent/agora-test-command".to_owned()],
        env: BTreeMap::new(),
    };
    let mut enforcer = Enforcer::default();
    enforcer.apply(&[lease], start());
    assert!(!enforcer.has_running());
    assert_eq!(
        enforcer.undelivered_exits(),
        vec![LeaseExit {
            lease_id: 12,
            code: Some(EXIT_NOT_STARTED),
            signal: None,
            killed_after_grace: false
        }]
    );
}

#[actix_rt::test]
async fn watch_leases_and_leases_not_yet_started_launch_nothing() {
    let mut watched = launch_lease(13, "exit 0");
    watched.enforcement = Enforcement::Watch;
    let future = launch_lease(14, "exit 0");
    let mut enforcer = Enforcer::default();
    enforcer.apply(&[watched, future], start() - TimeDelta::seconds(1));
    assert!(!enforcer.has_running());
    assert!(enforcer.undelivered_exits().is_empty());
}

/// A launched command goes into its lease's cgroup with the lease's CPUs and memory, and the
/// limits follow the arbiter's later word; a temporary directory stands in for the cgroup file
/// system.
#[actix_rt::test]
async fn a_launched_command_is_confined_to_its_leases_cpus_and_memory() {
    let scratch = Scratch::new("cgroup");
    let ready = scratch.pipe("ready");
    let root = scratch.file("agora");
    let cgroups = Cgroups::prepare(&root).expect("a writable stand-in");
    let mut lease = launch_lease(11, &format!("echo $$ > {}; sleep 60", path(&ready)));
    lease.cpus = Some(2.5);
    lease.memory_gib = Some(4.0);
    let mut enforcer = Enforcer::with_cgroups(Some(cgroups));
    enforcer.apply(std::slice::from_ref(&lease), start());
    let pid = read_line(&ready).await;
    let cgroup = root.join("lease-11");
    let read = |file: &str| std::fs::read_to_string(cgroup.join(file)).expect("written");
    assert_eq!(read("cgroup.procs"), pid.trim());
    assert_eq!(read("cpu.max"), "250000 100000");
    assert_eq!(read("memory.max"), (4u64 << 30).to_string());

    lease.cpus = Some(1.0);
    enforcer.apply(std::slice::from_ref(&lease), start());
    assert_eq!(read("cpu.max"), "100000 100000");

    let exit = wait_for_exit(&mut enforcer, lease.end_at).await;
    assert_eq!(exit.lease_id, 11);
}
