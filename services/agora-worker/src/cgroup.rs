//! CPU and memory limits of launched lease commands, through cgroup v2.
//!
//! A lease names the CPU cores and memory that come with it on this host
//! ([`agora_protocol::HostLease`]). For `launch` leases the worker puts the command in a cgroup
//! of its own under a root it manages (`/sys/fs/cgroup/agora` by default): `cpu.max` is the
//! lease's CPUs times [`CPU_PERIOD_MICROS`] per period, `memory.max` its memory in bytes, and
//! both follow the lease as later rounds change them. The command is moved in right after it
//! starts, so a child it forks in that instant stays outside. Where the cgroup filesystem is not
//! v2 or not writable (no root, no delegation), nothing is limited and the worker says so once.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The `cpu.max` period: 100 ms, the kernel's default.
pub const CPU_PERIOD_MICROS: u64 = 100_000;

/// The kernel refuses a `cpu.max` quota below 1 ms.
const MIN_CPU_QUOTA_MICROS: u64 = 1_000;

/// The root the worker manages by default.
pub const DEFAULT_ROOT: &str = "/sys/fs/cgroup/agora";

/// What a lease may use on this host; `None`: not limited.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Limits {
    pub cpus: Option<f64>,
    pub memory_gib: Option<f64>,
}

impl Limits {
    pub fn is_unlimited(&self) -> bool {
        self.cpus.is_none() && self.memory_gib.is_none()
    }
}

/// A cgroup v2 subtree the worker may write: one child cgroup per launched lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroups {
    root: PathBuf,
}

impl Cgroups {
    /// Takes `root` (a directory of a cgroup v2 file system, or any directory in tests): creates
    /// it and enables the `cpu` and `memory` controllers for its parent's children and its own.
    /// The error says why limits cannot be enforced.
    pub fn prepare(root: &Path) -> Result<Self, String> {
        let parent = root
            .parent()
            .ok_or_else(|| format!("{} has no parent cgroup", root.display()))?;
        let enable = |directory: &Path| {
            let control = directory.join("cgroup.subtree_control");
            fs::write(&control, "+cpu +memory")
                .map_err(|error| format!("cannot write {}: {error}", control.display()))
        };
        enable(parent)?;
        fs::create_dir_all(root)
            .map_err(|error| format!("cannot create {}: {error}", root.display()))?;
        enable(root)?;
        Ok(Self {
            root: root.to_owned(),
        })
    }

    /// [`Self::prepare`] on a real cgroup v2 mount: refused at once where `root`'s parent is
    /// not one (no `cgroup.controllers` file: cgroup v1, or no cgroup file system).
    pub fn on_host(root: &Path) -> Result<Self, String> {
        let controllers = root
            .parent()
            .map(|parent| parent.join("cgroup.controllers"));
        if !controllers.as_deref().is_some_and(Path::exists) {
            return Err(format!(
                "{} is not under a cgroup v2 file system",
                root.display()
            ));
        }
        Self::prepare(root)
    }

    fn lease_dir(&self, lease_id: i64) -> PathBuf {
        self.root.join(format!("lease-{lease_id}"))
    }

    /// Creates lease `lease_id`'s cgroup with `limits` and moves process `pid` into it.
    pub fn confine(&self, lease_id: i64, limits: Limits, pid: u32) -> io::Result<()> {
        let directory = self.lease_dir(lease_id);
        fs::create_dir_all(&directory)?;
        self.set_limits(lease_id, limits)?;
        fs::write(directory.join("cgroup.procs"), pid.to_string())
    }

    /// Sets lease `lease_id`'s limits (a later round changed its share).
    pub fn set_limits(&self, lease_id: i64, limits: Limits) -> io::Result<()> {
        let directory = self.lease_dir(lease_id);
        fs::write(directory.join("cpu.max"), cpu_max(limits.cpus))?;
        fs::write(directory.join("memory.max"), memory_max(limits.memory_gib))
    }

    /// Removes lease `lease_id`'s cgroup once its processes are gone.
    pub fn remove(&self, lease_id: i64) {
        let directory = self.lease_dir(lease_id);
        if let Err(error) = fs::remove_dir(&directory) {
            tracing::debug!(lease_id, %error, "cannot remove the lease's cgroup");
        }
    }
}

/// `cpu.max`: `QUOTA PERIOD` in microseconds, or `max PERIOD` without a limit.
pub fn cpu_max(cpus: Option<f64>) -> String {
    match cpus {
        Some(cpus) => {
            let quota = (cpus * CPU_PERIOD_MICROS as f64).ceil() as u64;
            format!("{} {CPU_PERIOD_MICROS}", quota.max(MIN_CPU_QUOTA_MICROS))
        }
        None => format!("max {CPU_PERIOD_MICROS}"),
    }
}

/// `memory.max`: bytes, or `max` without a limit.
pub fn memory_max(memory_gib: Option<f64>) -> String {
    match memory_gib {
        Some(memory) => ((memory * f64::from(1u32 << 30)).floor() as u64).to_string(),
        None => "max".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let directory =
            std::env::temp_dir().join(format!("agora-cgroup-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&directory);
        fs::create_dir_all(&directory).expect("a temp directory");
        directory
    }

    fn read(path: &Path) -> String {
        fs::read_to_string(path).expect("written")
    }

    #[test]
    fn limits_are_written_in_the_kernels_units() {
        assert_eq!(cpu_max(Some(2.5)), "250000 100000");
        assert_eq!(cpu_max(Some(0.001)), "1000 100000");
        assert_eq!(cpu_max(None), "max 100000");
        assert_eq!(memory_max(Some(1.5)), "1610612736");
        assert_eq!(memory_max(None), "max");
    }

    #[test]
    fn a_lease_gets_its_own_cgroup_with_its_limits_and_process() {
        let sys = temp_dir("confine");
        let root = sys.join("agora");
        let cgroups = Cgroups::prepare(&root).expect("a writable stand-in");
        assert_eq!(read(&sys.join("cgroup.subtree_control")), "+cpu +memory");
        assert_eq!(read(&root.join("cgroup.subtree_control")), "+cpu +memory");
        let limits = Limits {
            cpus: Some(3.0),
            memory_gib: Some(16.0),
        };
        cgroups.confine(7, limits, 4242).expect("confined");
        let lease = root.join("lease-7");
        assert_eq!(read(&lease.join("cpu.max")), "300000 100000");
        assert_eq!(read(&lease.join("memory.max")), (16u64 << 30).to_string());
        assert_eq!(read(&lease.join("cgroup.procs")), "4242");
        let changed = Limits {
            cpus: Some(1.5),
            memory_gib: None,
        };
        cgroups.set_limits(7, changed).expect("changed");
        assert_eq!(read(&lease.join("cpu.max")), "150000 100000");
        assert_eq!(read(&lease.join("memory.max")), "max");
        fs::remove_dir_all(&sys).expect("cleaned up");
    }

    #[test]
    fn a_directory_that_is_no_cgroup_v2_mount_is_refused() {
        let sys = temp_dir("not-v2");
        let error = Cgroups::on_host(&sys.join("agora")).expect_err("no cgroup.controllers");
        assert!(error.contains("cgroup v2"), "{error}");
        fs::remove_dir_all(&sys).expect("cleaned up");
    }
}
