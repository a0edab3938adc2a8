//! A host without NVIDIA hardware: its GPUs, their links and injectable faults come from a
//! topology file (TOML), for CI, demos and tests. `agora worker` uses it only when told to
//! (`--gpu-backend simulated --topology FILE`).
//!
//! ```toml
//! gpus = 8                            # GPUs 0..8 on this host
//! gpu_name = "NVIDIA A100-SXM4-80GB"  # NVML's product name: the arbiter maps it to a type
//! compute_capability = "8.0"          # optional, major.minor
//! memory_gib = 80                     # each GPU's memory
//! cpus = 64                           # optional: the host's CPU cores and memory (RAM), GiB;
//! host_memory_gib = 512               # absent: not modelled (not this machine's)
//! default_ancestor = "system"         # PCIe ancestor of pairs no [[links]] group names
//!
//! [[links]]                           # every pair of these GPUs:
//! gpus = [0, 1, 2, 3]
//! nvlinks = 12                        # active NVLinks between them (default 0)
//! ancestor = "node"                   # their PCIe ancestor (default: default_ancestor)
//!
//! [[faults]]                          # from `at_seconds` after the worker started (default 0):
//! kind = "xid"                        # the driver raises XID `xid` for GPU `gpu`
//! gpu = 5
//! xid = 79
//! at_seconds = 30
//! ```
//!
//! Ancestors are NVML's levels: `internal`, `single`, `multiple`, `host_bridge`, `node`,
//! `system`. Fault kinds: `lost` (the GPU stops answering), `xid` (`xid`), `ecc_dbe` (the
//! volatile double-bit ECC count rises by `errors`), `overheat` (the temperature becomes
//! `celsius`), `stray_process` (a process `pid` named `name` appears on the GPU).
//!
//! GPU UUIDs are derived from the host name and the index, so several workers can share one
//! topology file and still register distinct GPUs.

use std::path::Path;
use std::time::{Duration, Instant};

use agora_protocol::{ComputeCapability, GpuMetrics};
use serde::Deserialize;

use crate::backend::{
    BackendError, CommonAncestor, Device, GpuBackend, GpuProcess, PairTopology, Sample, XidEvent,
};
use crate::host_resources::HostResources;

/// A topology file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    pub gpus: u32,
    pub gpu_name: String,
    #[serde(default)]
    pub compute_capability: Option<ComputeCapability>,
    /// Each GPU's memory, GiB.
    pub memory_gib: u64,
    /// The host's CPU cores; absent: not reported.
    #[serde(default)]
    pub cpus: Option<u32>,
    /// The host's memory (RAM), GiB; absent: not reported.
    #[serde(default)]
    pub host_memory_gib: Option<f64>,
    #[serde(default = "across_sockets")]
    pub default_ancestor: CommonAncestor,
    #[serde(default)]
    pub links: Vec<LinkGroup>,
    #[serde(default)]
    pub faults: Vec<FaultSpec>,
}

fn across_sockets() -> CommonAncestor {
    CommonAncestor::System
}

/// GPUs that are pairwise connected the same way.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkGroup {
    pub gpus: Vec<u32>,
    #[serde(default)]
    pub nvlinks: u32,
    pub ancestor: Option<CommonAncestor>,
}

/// A fault that starts `at_seconds` after the backend is created and lasts. (Unknown keys
/// are caught by [`Fault`], which receives every key but these two.)
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct FaultSpec {
    pub gpu: u32,
    #[serde(default)]
    pub at_seconds: f64,
    #[serde(flatten)]
    pub fault: Fault,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    Lost {},
    Xid { xid: u64 },
    EccDbe { errors: u64 },
    Overheat { celsius: u32 },
    StrayProcess { pid: u32, name: String },
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyFileError {
    #[error("cannot read topology file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid topology file {path}: {message}")]
    Invalid { path: String, message: String },
}

/// The simulated host.
#[derive(Debug, Clone)]
pub struct SimulatedBackend {
    spec: HostSpec,
    devices: Vec<Device>,
    started: Instant,
    /// Faults whose XID has been handed out already.
    xids_reported: Vec<bool>,
}

impl SimulatedBackend {
    /// Reads a topology file for the host named `host`.
    pub fn load(path: &Path, host: &str) -> Result<Self, TopologyFileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| TopologyFileError::Read {
            path: shown.clone(),
            source,
        })?;
        Self::from_toml(&text, host).map_err(|message| TopologyFileError::Invalid {
            path: shown,
            message,
        })
    }

    /// Parses a topology file's text; the error says what is wrong.
    pub fn from_toml(text: &str, host: &str) -> Result<Self, String> {
        let spec: HostSpec = toml::from_str(text).map_err(|error| error.to_string())?;
        Self::new(spec, host)
    }

    pub fn new(spec: HostSpec, host: &str) -> Result<Self, String> {
        validate(&spec)?;
        let devices = (0..spec.gpus)
            .map(|index| Device {
                index,
                uuid: simulated_uuid(host, index),
                name: spec.gpu_name.clone(),
                compute_capability: spec.compute_capability,
                memory_total_bytes: spec.memory_gib << 30,
                pci_bus_id: format!("00000000:{:02X}:00.0", 0x10 + index * 0x10),
            })
            .collect();
        Ok(Self {
            xids_reported: vec![false; spec.faults.len()],
            spec,
            devices,
            started: Instant::now(),
        })
    }

    /// The faults of `gpu` that have started.
    fn active_faults(&self, gpu: u32) -> impl Iterator<Item = &Fault> {
        let elapsed = self.started.elapsed();
        self.spec
            .faults
            .iter()
            .filter(move |fault| fault.gpu == gpu && started(fault, elapsed))
            .map(|fault| &fault.fault)
    }
}

fn started(fault: &FaultSpec, elapsed: Duration) -> bool {
    elapsed.as_secs_f64() >= fault.at_seconds
}

fn validate(spec: &HostSpec) -> Result<(), String> {
    if spec.cpus == Some(0) {
        return Err("cpus: a host has at least 1 CPU core".into());
    }
    if let Some(memory) = spec
        .host_memory_gib
        .filter(|memory| !(memory.is_finite() && *memory > 0.0))
    {
        return Err(format!(
            "host_memory_gib: must be a number of GiB above 0, got {memory:?}"
        ));
    }
    let in_range = |gpu: &u32| *gpu < spec.gpus;
    for group in &spec.links {
        if group.gpus.len() < 2 || !group.gpus.iter().all(in_range) {
            return Err(format!(
                "a [[links]] group needs two or more of the GPUs 0..{}, got {:?}",
                spec.gpus, group.gpus
            ));
        }
    }
    for fault in &spec.faults {
        let valid_start = fault.at_seconds.is_finite() && fault.at_seconds >= 0.0;
        if !in_range(&fault.gpu) || !valid_start {
            return Err(format!(
                "a fault needs a GPU in 0..{} and at_seconds >= 0, got gpu {} at {}",
                spec.gpus, fault.gpu, fault.at_seconds
            ));
        }
    }
    Ok(())
}

/// A UUID-shaped id, stable for a host name and index (FNV-1a with two seeds for 128 bits,
/// each finished with SplitMix64's mixer so that neighbouring GPUs' ids look unrelated).
fn simulated_uuid(host: &str, index: u32) -> String {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let hash = |seed: u64| {
        mix(format!("{host}/{index}").bytes().fold(seed, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
        }))
    };
    let high = hash(0xcbf2_9ce4_8422_2325);
    let low = hash(0x8422_2325_cbf2_9ce4);
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        high >> 32,
        (high >> 16) & 0xffff,
        high & 0xffff,
        low >> 48,
        low & 0xffff_ffff_ffff
    )
}

impl GpuBackend for SimulatedBackend {
    fn devices(&mut self) -> Result<Vec<Device>, BackendError> {
        Ok(self.devices.clone())
    }

    fn pair_topology(&mut self, a: u32, b: u32) -> Result<PairTopology, BackendError> {
        let group = self
            .spec
            .links
            .iter()
            .rev()
            .find(|group| group.gpus.contains(&a) && group.gpus.contains(&b));
        Ok(PairTopology {
            ancestor: group
                .and_then(|group| group.ancestor)
                .unwrap_or(self.spec.default_ancestor),
            nvlinks: group.map_or(0, |group| group.nvlinks),
        })
    }

    fn sample(&mut self, index: u32) -> Result<Sample, BackendError> {
        if index >= self.spec.gpus {
            return Err(BackendError(format!("no simulated GPU {index}")));
        }
        let mut sample = Sample {
            metrics: GpuMetrics {
                gpu_util_percent: Some(0),
                fb_used_mib: Some(0),
                gpu_temp_celsius: Some(40),
                power_usage_watts: Some(70.0),
                ecc_sbe_volatile_total: Some(0),
                ecc_dbe_volatile_total: Some(0),
                last_xid: None,
            },
            processes: Vec::new(),
        };
        for fault in self.active_faults(index) {
            let metrics = &mut sample.metrics;
            match fault {
                Fault::Lost {} => return Err(BackendError("GPU is lost (simulated)".to_owned())),
                // Reported through `take_xid_events`, like NVML's event set.
                Fault::Xid { .. } => {}
                Fault::EccDbe { errors } => {
                    metrics.ecc_dbe_volatile_total =
                        Some(metrics.ecc_dbe_volatile_total.unwrap_or(0) + errors);
                }
                Fault::Overheat { celsius } => metrics.gpu_temp_celsius = Some(*celsius),
                Fault::StrayProcess { pid, name } => sample.processes.push(GpuProcess {
                    pid: *pid,
                    name: name.clone(),
                    used_memory_bytes: Some(1 << 30),
                }),
            }
        }
        Ok(sample)
    }

    fn take_xid_events(&mut self) -> Vec<XidEvent> {
        let elapsed = self.started.elapsed();
        let mut events = Vec::new();
        for (fault, reported) in self.spec.faults.iter().zip(&mut self.xids_reported) {
            if let (Fault::Xid { xid }, false) = (&fault.fault, *reported) {
                if started(fault, elapsed) {
                    *reported = true;
                    events.push(XidEvent {
                        gpu_index: fault.gpu,
                        xid: *xid,
                    });
                }
            }
        }
        events
    }

    /// What the topology file says, not this machine's: a simulated host without `cpus` or
    /// `host_memory_gib` does not model them.
    fn host_resources(&mut self) -> HostResources {
        HostResources {
            cpus: self.spec.cpus,
            memory_gib: self.spec.host_memory_gib,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../examples/dgx-like.toml");

    #[test]
    fn the_example_file_describes_two_nvlink_islands() {
        let mut backend = SimulatedBackend::from_toml(EXAMPLE, "host-a").expect("valid example");
        let devices = backend.devices().expect("devices");
        assert_eq!(devices.len(), 8);
        let a100 = Some(ComputeCapability { major: 8, minor: 0 });
        assert!(devices
            .iter()
            .all(|gpu| gpu.name == "NVIDIA A100-SXM4-80GB" && gpu.compute_capability == a100));
        let island = backend.pair_topology(0, 3).expect("pair");
        assert!(island.nvlinks > 0);
        let across = backend.pair_topology(3, 4).expect("pair");
        assert_eq!(across.nvlinks, 0);
    }

    #[test]
    fn uuids_differ_between_hosts_and_are_stable() {
        let a = simulated_uuid("host-a", 0);
        assert_eq!(a, simulated_uuid("host-a", 0));
        assert_ne!(a, simulated_uuid("host-b", 0));
        assert_ne!(a, simulated_uuid("host-a", 1));
        assert_eq!(a.len(), "GPU-".len() + 36);
    }

    #[test]
    fn later_groups_override_earlier_ones_and_the_rest_is_the_default() {
        let text = r#"
            gpus = 3
            gpu_name = "T4"
            memory_gib = 16
            default_ancestor = "node"
            [[links]]
            gpus = [0, 1, 2]
            ancestor = "host_bridge"
            [[links]]
            gpus = [0, 1]
            nvlinks = 2
        "#;
        let mut backend = SimulatedBackend::from_toml(text, "h").expect("valid");
        assert_eq!(
            backend.pair_topology(0, 1).expect("pair"),
            PairTopology {
                ancestor: CommonAncestor::Node,
                nvlinks: 2
            }
        );
        assert_eq!(
            backend.pair_topology(1, 2).expect("pair").ancestor,
            CommonAncestor::HostBridge
        );
    }

    #[test]
    fn faults_apply_from_their_start_and_xids_are_reported_once() {
        let text = r#"
            gpus = 3
            gpu_name = "T4"
            memory_gib = 16
            [[faults]]
            kind = "lost"
            gpu = 0
            [[faults]]
            kind = "xid"
            gpu = 1
            xid = 79
            [[faults]]
            kind = "overheat"
            gpu = 2
            celsius = 97
            at_seconds = 3600
        "#;
        let mut backend = SimulatedBackend::from_toml(text, "h").expect("valid");
        assert!(backend.sample(0).is_err());
        assert!(backend.sample(1).is_ok());
        assert_eq!(
            backend.take_xid_events(),
            vec![XidEvent {
                gpu_index: 1,
                xid: 79
            }]
        );
        assert_eq!(backend.take_xid_events(), vec![]);
        // The overheat starts in an hour.
        assert_eq!(
            backend.sample(2).expect("answers").metrics.gpu_temp_celsius,
            Some(40)
        );
    }

    #[test]
    fn mistakes_in_the_file_are_named() {
        let unknown_gpu =
            "gpus = 2\ngpu_name = \"T4\"\nmemory_gib = 16\n[[faults]]\nkind = \"lost\"\ngpu = 2\n";
        let error = SimulatedBackend::from_toml(unknown_gpu, "h").expect_err("GPU 2 of 2");
        assert!(error.contains("GPU in 0..2"), "{error}");
        let typo = "gpus = 2\ngpu_name = \"T4\"\nmemory_gb = 16\n";
        let error = SimulatedBackend::from_toml(typo, "h").expect_err("unknown field");
        assert!(error.contains("memory_gb"), "{error}");
        let fault_typo = "gpus = 2\ngpu_name = \"T4\"\nmemory_gib = 16\n[[faults]]\nkind = \"lost\"\ngpu = 1\nat_second = 5\n";
        let error = SimulatedBackend::from_toml(fault_typo, "h").expect_err("unknown field");
        assert!(error.contains("at_second"), "{error}");
        let capability =
            "gpus = 2\ngpu_name = \"T4\"\nmemory_gib = 16\ncompute_capability = \"7\"\n";
        let error = SimulatedBackend::from_toml(capability, "h").expect_err("no minor");
        assert!(error.contains("major.minor"), "{error}");
    }
}
