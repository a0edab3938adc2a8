//! Every HiGHS run of the engine, with the calling thread held on one CPU while it runs on a
//! host with many CPUs.
//!
//! HiGHS 1.16 counts the physical cores in the calling thread's affinity mask at the start of
//! every run (`Highs::initializeMultiThreading`, and again to log each MIP; the count is only
//! logged), reading two sysfs files per CPU in the mask: about 29 µs per CPU on the machines of
//! BENCHMARKS.md, so about 2 ms a run on a 64-CPU host, more than most of the auction's LP
//! re-solves take. With the mask narrowed to the CPU the thread is on, it reads one CPU's files.
//! The count does not reach the solve (the engine runs HiGHS on one thread), so outcomes are
//! the same.

use highs::{HighsStatus, Model, SolvedModel};

/// Runs `model` as [`Model::try_solve`] does, held on the CPU the calling thread is on when its
/// mask has [`HOLD_FROM_CPUS`] CPUs or more.
pub(crate) fn try_solve(model: Model) -> Result<SolvedModel, HighsStatus> {
    let _held = HeldOnThisCpu::hold_if_worth_it();
    model.try_solve()
}

/// From how many CPUs in a thread's mask it is held while HiGHS runs. With fewer the files cost
/// at most about 90 µs a run, and a held thread cannot move off a CPU that another thread wants:
/// on 2 CPUs holding gained nothing measurable (docs/benchmarks-history.md, "HiGHS runs held on
/// one CPU").
const HOLD_FROM_CPUS: usize = 4;

/// Narrows the calling thread's affinity mask to the CPU it runs on, and restores the mask on
/// drop. Where that cannot be done (another OS, a sandbox that forbids it), nothing changes.
struct HeldOnThisCpu {
    #[cfg(target_os = "linux")]
    allowed: Option<nix::sched::CpuSet>,
}

#[cfg(target_os = "linux")]
impl HeldOnThisCpu {
    fn hold_if_worth_it() -> Self {
        match nix::sched::sched_getaffinity(this_thread()) {
            Ok(allowed) if cpus_in(&allowed).len() >= HOLD_FROM_CPUS => Self::hold(allowed),
            _ => Self { allowed: None },
        }
    }

    /// Holds the thread on its CPU, `allowed` being its mask now.
    fn hold(allowed: nix::sched::CpuSet) -> Self {
        use nix::sched::{sched_getcpu, sched_setaffinity, CpuSet};
        let held = sched_getcpu().is_ok_and(|cpu| {
            let mut one = CpuSet::new();
            one.set(cpu).is_ok() && sched_setaffinity(this_thread(), &one).is_ok()
        });
        Self {
            allowed: held.then_some(allowed),
        }
    }
}

#[cfg(target_os = "linux")]
impl Drop for HeldOnThisCpu {
    fn drop(&mut self) {
        use nix::sched::{sched_setaffinity, CpuSet};
        let Some(allowed) = &self.allowed else {
            return;
        };
        if sched_setaffinity(this_thread(), allowed).is_err() {
            // The thread's cpuset shrank while it ran, leaving none of the CPUs it had: any CPU
            // the cpuset allows will do, and the kernel keeps only those of a full mask.
            let mut every_cpu = CpuSet::new();
            for cpu in 0..CpuSet::count() {
                let _ = every_cpu.set(cpu);
            }
            let _ = sched_setaffinity(this_thread(), &every_cpu);
        }
    }
}

/// The calling thread, as the `sched_*` calls name it.
#[cfg(target_os = "linux")]
fn this_thread() -> nix::unistd::Pid {
    nix::unistd::Pid::from_raw(0)
}

#[cfg(target_os = "linux")]
fn cpus_in(mask: &nix::sched::CpuSet) -> Vec<usize> {
    (0..nix::sched::CpuSet::count())
        .filter(|&cpu| mask.is_set(cpu).unwrap_or(false))
        .collect()
}

#[cfg(not(target_os = "linux"))]
impl HeldOnThisCpu {
    fn hold_if_worth_it() -> Self {
        Self {}
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use nix::sched::{sched_getaffinity, sched_setaffinity};

    use super::*;

    fn mask_now() -> nix::sched::CpuSet {
        sched_getaffinity(this_thread()).expect("a thread may read its own mask")
    }

    #[test]
    fn a_held_thread_runs_on_one_of_its_cpus_and_gets_its_mask_back() {
        let before = mask_now();
        let held = HeldOnThisCpu::hold(before);
        let during = cpus_in(&mask_now());
        assert_eq!(during.len(), 1, "held on one CPU: {during:?}");
        assert!(cpus_in(&before).contains(&during[0]));
        drop(held);
        assert_eq!(cpus_in(&mask_now()), cpus_in(&before));
    }

    #[test]
    fn a_thread_with_few_cpus_is_left_as_it_is() {
        let before = mask_now();
        let mut one = nix::sched::CpuSet::new();
        one.set(cpus_in(&before)[0]).expect("a CPU of the mask");
        sched_setaffinity(this_thread(), &one).expect("a thread may narrow its own mask");
        let held = HeldOnThisCpu::hold_if_worth_it();
        assert!(held.allowed.is_none());
        drop(held);
        assert_eq!(cpus_in(&mask_now()).len(), 1);
        sched_setaffinity(this_thread(), &before).expect("a thread may restore its own mask");
    }
}
