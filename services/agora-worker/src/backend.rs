//! What the worker needs from a host's GPUs, behind a trait: NVML on real hosts
//! ([`crate::nvml::NvmlBackend`]), a topology file in CI and demos
//! ([`crate::simulated::SimulatedBackend`]).

use agora_protocol::{ComputeCapability, GpuMetrics};

use crate::host_resources::HostResources;

/// A GPU as discovered on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// NVML's index on the host.
    pub index: u32,
    /// The CUDA UUID (`GPU-…`).
    pub uuid: String,
    /// The product name (`NVIDIA H100 80GB HBM3`), which the arbiter maps to a GPU type.
    pub name: String,
    pub compute_capability: Option<ComputeCapability>,
    pub memory_total_bytes: u64,
    pub pci_bus_id: String,
}

/// The closest common ancestor of two GPUs in the PCIe tree, as NVML reports it
/// (`nvmlGpuTopologyLevel_t`), from closest to farthest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommonAncestor {
    /// Two GPUs on one board (e.g. a Tesla K80).
    Internal,
    /// One PCIe switch.
    Single,
    /// Several PCIe switches, without crossing the host bridge.
    Multiple,
    /// A PCIe host bridge.
    HostBridge,
    /// One CPU socket's interconnect (NUMA node).
    Node,
    /// Across CPU sockets.
    System,
}

/// How two GPUs of the host are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairTopology {
    pub ancestor: CommonAncestor,
    /// Active NVLink links joining them (directly or through NVSwitches); 0 when none.
    pub nvlinks: u32,
}

/// One GPU's readings at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    pub metrics: GpuMetrics,
    /// The compute processes running on the GPU.
    pub processes: Vec<GpuProcess>,
}

/// A compute process NVML sees on a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuProcess {
    pub pid: u32,
    /// The process's name (`/proc/PID/comm`), or `?` when it cannot be read.
    pub name: String,
    pub used_memory_bytes: Option<u64>,
}

/// An XID error the driver raised for a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidEvent {
    pub gpu_index: u32,
    pub xid: u64,
}

/// A GPU query that failed: the GPU (or the driver) did not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

/// The host's GPUs. Calls are short and synchronous (NVML answers from the driver's state);
/// the worker calls them from its single-threaded loop.
pub trait GpuBackend {
    /// Every GPU of the host, by index.
    fn devices(&mut self) -> Result<Vec<Device>, BackendError>;

    /// How GPUs `a` and `b` (indices) are connected.
    fn pair_topology(&mut self, a: u32, b: u32) -> Result<PairTopology, BackendError>;

    /// The current readings of GPU `index`; an error means the GPU stopped answering.
    fn sample(&mut self, index: u32) -> Result<Sample, BackendError>;

    /// XID errors raised since the last call, oldest first. Never blocks.
    fn take_xid_events(&mut self) -> Vec<XidEvent>;

    /// The host's CPU cores and memory: this machine's, unless the backend describes another.
    fn host_resources(&mut self) -> HostResources {
        HostResources::of_this_machine()
    }
}
