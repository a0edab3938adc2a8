//! The wire protocol between `agora worker` (one per GPU host) and the arbiter.
//!
//! Workers pull; the arbiter never connects to a host. A worker registers its GPUs and their
//! topology (`POST /v1/workers`, bearer worker token), then heartbeats
//! (`POST /v1/workers/{host}/heartbeat`) with each GPU's health and metrics; every reply lists
//! the leases on the host's GPUs, which the worker enforces. A host whose heartbeats stop has
//! its leases revoked by the arbiter; registering again brings it back.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Where a worker registers.
pub const REGISTER_PATH: &str = "/v1/workers";

/// Where a worker heartbeats.
pub fn heartbeat_path(host: &str) -> String {
    format!("/v1/workers/{host}/heartbeat")
}

/// A host introducing itself: its GPUs and how they are connected. Registering again (after a
/// restart or an outage) replaces the previous registration of the same host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HostRegistration {
    /// Unique in the cluster; the machine's hostname unless the operator sets another.
    pub host: String,
    /// The rack the host sits in (Themis's third locality level), set by the operator.
    pub rack: String,
    pub gpus: Vec<GpuDescriptor>,
    /// The raw topology between every pair of the host's GPUs, as NVML reports it.
    pub links: Vec<GpuLink>,
    /// `agora worker`'s version, for operators.
    pub worker_version: String,
    /// The host's CPU cores (logical CPUs), which the arbiter divides among the apps holding
    /// its GPUs; absent: CPUs are not modelled on this host (and from older workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// The host's memory (RAM, not GPU memory) in GiB, divided like its CPUs; absent: not
    /// modelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<f64>,
}

/// One GPU as NVML describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuDescriptor {
    /// The CUDA UUID (`GPU-…`): what `CUDA_VISIBLE_DEVICES` takes and the GPU's id in Agora.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    pub memory_total_bytes: u64,
    /// PCI bus id, e.g. `00000000:1B:00.0`.
    pub pci_bus_id: String,
    /// NVML's index on the host.
    pub index: u32,
    /// The slot the worker placed it in: GPUs joined by NVLink or a common PCIe switch share a
    /// slot (Themis's best locality level); slots are numbered from 0 on each host.
    pub slot: u32,
    /// The CUDA compute capability, `major.minor` (`9.0` for an H100); absent when NVML does
    /// not tell it, and from workers older than this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "9.0")]
    pub compute_capability: Option<ComputeCapability>,
}

/// A CUDA compute capability (`nvmlDeviceGetCudaComputeCapability`), written `major.minor`
/// (`8.0`, `9.0`) in JSON and in topology files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for ComputeCapability {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}.{}", self.major, self.minor)
    }
}

impl std::str::FromStr for ComputeCapability {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let number = |part: &str| {
            (!part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit()))
                .then(|| part.parse::<u32>().ok())
                .flatten()
        };
        text.split_once('.')
            .and_then(|(major, minor)| Some((number(major)?, number(minor)?)))
            .map(|(major, minor)| Self { major, minor })
            .ok_or_else(|| {
                format!("compute capability must be `major.minor` (e.g. `9.0`), got {text:?}")
            })
    }
}

impl TryFrom<String> for ComputeCapability {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse()
    }
}

impl From<ComputeCapability> for String {
    fn from(capability: ComputeCapability) -> Self {
        capability.to_string()
    }
}

/// How two GPUs of one host are connected, from closest to farthest (NVML's
/// `nvmlGpuTopologyLevel_t`, with NVLink on top).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    /// At least one active NVLink between them.
    Nvlink,
    /// Behind one PCIe switch (NVML `SINGLE`).
    PcieSwitch,
    /// Behind several PCIe switches, without crossing the host bridge (NVML `MULTIPLE`).
    PcieSwitches,
    /// Through a PCIe host bridge (NVML `HOSTBRIDGE`).
    HostBridge,
    /// Through one CPU socket's interconnect (NVML `NODE`).
    SameNumaNode,
    /// Across CPU sockets (NVML `SYSTEM`).
    CrossSocket,
}

/// The connection between two GPUs (by UUID) of one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuLink {
    pub a: String,
    pub b: String,
    pub kind: LinkKind,
    /// Active NVLink links between them (0 when none).
    pub nvlinks: u32,
}

/// The arbiter's answer to a registration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Registered {
    pub host: String,
    /// How often to heartbeat; a host silent for two intervals loses its leases.
    pub heartbeat_interval_ms: u64,
}

/// A worker's periodic report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    /// Increases by one per heartbeat since the worker started.
    pub sequence: u64,
    pub gpus: Vec<GpuReport>,
    /// Leases whose launched command exited since the last heartbeat.
    #[serde(default)]
    pub exits: Vec<LeaseExit>,
    /// Processes seen on leased GPUs that do not belong to the lease.
    #[serde(default)]
    pub violations: Vec<Violation>,
}

/// One GPU's state in a heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuReport {
    pub uuid: String,
    pub health: GpuHealth,
    pub metrics: GpuMetrics,
}

/// The worker's verdict on a GPU. An unhealthy GPU is withdrawn from offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum GpuHealth {
    Healthy,
    Unhealthy { reason: String },
}

/// GPU telemetry, named after the DCGM exporter's fields. `None` where NVML did not answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GpuMetrics {
    /// GPU utilisation, percent.
    #[serde(rename = "DCGM_FI_DEV_GPU_UTIL")]
    pub gpu_util_percent: Option<u32>,
    /// Framebuffer memory used, MiB.
    #[serde(rename = "DCGM_FI_DEV_FB_USED")]
    pub fb_used_mib: Option<u64>,
    /// GPU temperature, degrees Celsius.
    #[serde(rename = "DCGM_FI_DEV_GPU_TEMP")]
    pub gpu_temp_celsius: Option<u32>,
    /// Power draw, watts.
    #[serde(rename = "DCGM_FI_DEV_POWER_USAGE")]
    pub power_usage_watts: Option<f64>,
    /// Volatile single-bit ECC errors since the driver loaded.
    #[serde(rename = "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")]
    pub ecc_sbe_volatile_total: Option<u64>,
    /// Volatile double-bit ECC errors since the driver loaded.
    #[serde(rename = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")]
    pub ecc_dbe_volatile_total: Option<u64>,
    /// The last XID error the driver raised for this GPU.
    #[serde(rename = "DCGM_FI_DEV_XID_ERRORS")]
    pub last_xid: Option<u64>,
}

/// A launched command's end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseExit {
    pub lease_id: i64,
    /// The exit code, when the command exited by itself.
    pub code: Option<i32>,
    /// The signal that ended it (15 = SIGTERM, 9 = SIGKILL), when one did.
    pub signal: Option<i32>,
    /// Whether the worker had to SIGKILL it after the grace period.
    pub killed_after_grace: bool,
}

/// A process on a leased GPU that is not the lease's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Violation {
    pub gpu_uuid: String,
    /// The lease holding the GPU, or `None` if the GPU is not leased at all.
    pub lease_id: Option<i64>,
    pub pid: u32,
    pub process_name: String,
    pub used_memory_bytes: Option<u64>,
}

/// The arbiter's answer to a heartbeat: what the host must enforce now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatReply {
    pub heartbeat_interval_ms: u64,
    /// Every active lease on this host's GPUs.
    pub leases: Vec<HostLease>,
}

/// A lease as the host enforces it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HostLease {
    pub lease_id: i64,
    pub app_id: i64,
    /// The CUDA UUIDs of the lease's GPUs on this host.
    pub gpu_uuids: Vec<String>,
    pub start_at: DateTime<Utc>,
    /// When the lease ends (earlier than first granted if it was revoked).
    pub end_at: DateTime<Utc>,
    /// SIGTERM goes out this long before `end_at`, SIGKILL at `end_at`.
    pub grace_seconds: u64,
    pub enforcement: Enforcement,
    /// The CPU cores that come with the lease on this host (its app's share of the host,
    /// divided among its leases there by GPUs; fractional); `None` where the host's CPUs are
    /// not modelled. May change from one round to the next.
    #[serde(default)]
    pub cpus: Option<f64>,
    /// The host memory in GiB that comes with the lease on this host, like `cpus`.
    #[serde(default)]
    pub memory_gib: Option<f64>,
}

/// How the host enforces a lease; the app chooses when it registers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Enforcement {
    /// The worker launches `command` with `CUDA_VISIBLE_DEVICES` set to the lease's GPUs.
    Launch {
        command: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    /// The app runs its jobs itself; the worker reports processes outside the lease.
    Watch,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_use_the_dcgm_exporter_names() {
        let metrics = GpuMetrics {
            gpu_util_percent: Some(87),
            last_xid: Some(79),
            ..GpuMetrics::default()
        };
        let json = serde_json::to_value(&metrics).expect("serialisable");
        assert_eq!(json["DCGM_FI_DEV_GPU_UTIL"], 87);
        assert_eq!(json["DCGM_FI_DEV_XID_ERRORS"], 79);
        assert!(json["DCGM_FI_DEV_FB_USED"].is_null());
    }

    #[test]
    fn enforcement_and_health_are_tagged() {
        let launch: Enforcement =
            serde_json::from_str(r#"{"mode": "launch", "command": ["python", "train.py"]}"#)
                .expect("valid");
        assert_eq!(
            launch,
            Enforcement::Launch {
                command: vec!["python".into(), "train.py".into()],
                env: BTreeMap::new()
            }
        );
        let health: GpuHealth =
            serde_json::from_str(r#"{"status": "unhealthy", "reason": "XID 79"}"#).expect("valid");
        assert_eq!(
            health,
            GpuHealth::Unhealthy {
                reason: "XID 79".into()
            }
        );
    }

    #[test]
    fn compute_capabilities_are_major_dot_minor() {
        let capability: ComputeCapability = serde_json::from_str(r#""9.0""#).expect("valid");
        assert_eq!(capability, ComputeCapability { major: 9, minor: 0 });
        assert_eq!(serde_json::to_string(&capability).expect("ok"), r#""9.0""#);
        for bad in ["9", "9.", ".0", "9.0.1", "x.0", "-1.0", "9.0 ", ""] {
            let error = bad.parse::<ComputeCapability>().expect_err(bad);
            assert!(error.contains("major.minor"), "{error}");
        }
    }

    #[test]
    fn a_descriptor_without_compute_capability_still_parses() {
        let json = r#"{"uuid": "GPU-1", "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": 1, "pci_bus_id": "0", "index": 0, "slot": 0}"#;
        let gpu: GpuDescriptor = serde_json::from_str(json).expect("an older worker's GPU");
        assert_eq!(gpu.compute_capability, None);
    }

    #[test]
    fn link_kinds_order_from_closest_to_farthest() {
        assert!(LinkKind::Nvlink < LinkKind::PcieSwitch);
        assert!(LinkKind::HostBridge < LinkKind::CrossSocket);
    }
}
