//! The host's CPU cores and memory, which the worker registers beside its GPUs so the arbiter
//! can divide them among the apps holding the host's GPUs (`docs/gpu-hosts.md`). Read with
//! `sysinfo` on real hosts, from the topology file on simulated ones, and overridable by the
//! operator (`agora worker --cpus N --host-memory-gib G`).

use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};

/// CPU cores (logical CPUs) and memory (RAM, GiB); `None`: not reported, so not modelled.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostResources {
    pub cpus: Option<u32>,
    pub memory_gib: Option<f64>,
}

impl HostResources {
    /// This machine's logical CPUs and total memory; a value the system does not give is left
    /// out.
    pub fn of_this_machine() -> Self {
        let system = System::new_with_specifics(
            RefreshKind::nothing()
                .with_cpu(CpuRefreshKind::nothing())
                .with_memory(MemoryRefreshKind::nothing().with_ram()),
        );
        let cpus = u32::try_from(system.cpus().len())
            .ok()
            .filter(|&cpus| cpus > 0);
        let memory_gib = Some(system.total_memory() as f64 / f64::from(1u32 << 30))
            .filter(|&memory| memory > 0.0);
        Self { cpus, memory_gib }
    }

    /// These resources with the operator's values where given.
    pub fn overridden_by(self, cpus: Option<u32>, memory_gib: Option<f64>) -> Self {
        Self {
            cpus: cpus.or(self.cpus),
            memory_gib: memory_gib.or(self.memory_gib),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_machine_has_cpus_and_memory() {
        let host = HostResources::of_this_machine();
        assert!(host.cpus.is_some_and(|cpus| cpus >= 1), "{host:?}");
        assert!(
            host.memory_gib.is_some_and(|memory| memory > 0.0),
            "{host:?}"
        );
    }

    #[test]
    fn the_operator_overrides_what_is_given() {
        let found = HostResources {
            cpus: Some(64),
            memory_gib: Some(512.0),
        };
        assert_eq!(
            found.overridden_by(Some(32), None),
            HostResources {
                cpus: Some(32),
                memory_gib: Some(512.0)
            }
        );
    }
}
