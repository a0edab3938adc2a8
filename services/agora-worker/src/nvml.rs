//! The host's real GPUs, through NVML (`libnvidia-ml.so.1`, installed with the NVIDIA driver).

use std::collections::BTreeMap;

use agora_protocol::{ComputeCapability, GpuMetrics};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    EccCounter, MemoryError, P2pCapabilitiesIndex, P2pStatus, TemperatureSensor, TopologyLevel,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{EventSet, Nvml};

use crate::backend::{
    BackendError, CommonAncestor, Device, GpuBackend, GpuProcess, PairTopology, Sample, XidEvent,
};

/// The most NVLinks a GPU has (NVML's `NVML_NVLINK_MAX_LINKS`, 18 on Hopper).
const MAX_NVLINKS: u32 = 18;

/// NVML could not be started: no driver, or no permission to talk to it.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot use the NVIDIA driver: {cause} (NVML lives in libnvidia-ml.so.1, installed with the \
     NVIDIA driver). Install the driver on this host, or pass `--gpu-backend simulated \
     --topology FILE` to run on a simulated host"
)]
pub struct NvmlUnavailable {
    /// Part of the message rather than a source, so the error reads as one sentence.
    cause: NvmlError,
}

/// NVML on this host.
#[derive(Debug)]
pub struct NvmlBackend {
    nvml: &'static Nvml,
    /// One XID event set per GPU that supports them, by index.
    xid_events: BTreeMap<u32, EventSet<'static>>,
}

impl NvmlBackend {
    /// Loads the driver's library and registers for XID events.
    pub fn init() -> Result<Self, NvmlUnavailable> {
        let nvml = Nvml::init().map_err(|cause| NvmlUnavailable { cause })?;
        // NVML stays loaded for the life of the process; leaking it lets devices and event
        // sets, which borrow it, live in the same struct.
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let mut backend = Self {
            nvml,
            xid_events: BTreeMap::new(),
        };
        backend.register_xid_events();
        Ok(backend)
    }

    fn register_xid_events(&mut self) {
        let count = self.nvml.device_count().unwrap_or(0);
        for index in 0..count {
            let registered = self
                .nvml
                .device_by_index(index)
                .map_err(|error| error.to_string())
                .and_then(|device| {
                    let set = self.nvml.create_event_set().map_err(|e| e.to_string())?;
                    device
                        .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                        .map_err(|error| error.to_string())
                });
            match registered {
                Ok(set) => {
                    self.xid_events.insert(index, set);
                }
                Err(error) => tracing::warn!(
                    gpu = index,
                    %error,
                    "XID events are not available for this GPU; its health rests on the other rules"
                ),
            }
        }
    }

    fn device(&self, index: u32) -> Result<nvml_wrapper::Device<'static>, BackendError> {
        self.nvml
            .device_by_index(index)
            .map_err(|error| BackendError(format!("GPU {index}: {error}")))
    }
}

fn failed(what: &str) -> impl Fn(NvmlError) -> BackendError + '_ {
    move |error| BackendError(format!("{what}: {error}"))
}

/// A reading the GPU may not offer (consumer GPUs have no ECC, some no power sensor): `None`
/// then; any other error means the GPU did not answer.
fn optional<T>(what: &str, reading: Result<T, NvmlError>) -> Result<Option<T>, BackendError> {
    match reading {
        Ok(value) => Ok(Some(value)),
        Err(
            NvmlError::NotSupported
            | NvmlError::NoPermission
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_),
        ) => Ok(None),
        Err(error) => Err(failed(what)(error)),
    }
}

/// The GPU's CUDA compute capability, `None` where NVML does not tell it (NVML answers with
/// C ints; a negative one would be a driver bug, reported as no answer).
fn compute_capability(
    device: &nvml_wrapper::Device<'static>,
    what: &str,
) -> Result<Option<ComputeCapability>, BackendError> {
    let capability = optional(what, device.cuda_compute_capability())?;
    Ok(capability.and_then(|capability| {
        Some(ComputeCapability {
            major: u32::try_from(capability.major).ok()?,
            minor: u32::try_from(capability.minor).ok()?,
        })
    }))
}

fn ancestor(level: TopologyLevel) -> CommonAncestor {
    match level {
        TopologyLevel::Internal => CommonAncestor::Internal,
        TopologyLevel::Single => CommonAncestor::Single,
        TopologyLevel::Multiple => CommonAncestor::Multiple,
        TopologyLevel::HostBridge => CommonAncestor::HostBridge,
        TopologyLevel::Node => CommonAncestor::Node,
        TopologyLevel::System => CommonAncestor::System,
    }
}

/// The remote ends' PCI bus ids of `device`'s active NVLinks.
fn active_nvlink_peers(device: &nvml_wrapper::Device<'static>) -> Vec<String> {
    (0..MAX_NVLINKS)
        .map(|link| device.link_wrapper_for(link))
        .filter(|link| link.is_active().unwrap_or(false))
        .map(|link| {
            link.remote_pci_info()
                .map(|pci| pci.bus_id.to_ascii_uppercase())
                .unwrap_or_default()
        })
        .collect()
}

/// The process's name as the kernel knows it, or `?`.
fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|name| name.trim_end().to_owned())
        .unwrap_or_else(|_| "?".to_owned())
}

impl GpuBackend for NvmlBackend {
    fn devices(&mut self) -> Result<Vec<Device>, BackendError> {
        let count = self.nvml.device_count().map_err(failed("counting GPUs"))?;
        (0..count)
            .map(|index| {
                let device = self.device(index)?;
                let what = format!("GPU {index}");
                Ok(Device {
                    index,
                    uuid: device.uuid().map_err(failed(&what))?,
                    name: device.name().map_err(failed(&what))?,
                    compute_capability: compute_capability(&device, &what)?,
                    memory_total_bytes: device.memory_info().map_err(failed(&what))?.total,
                    pci_bus_id: device.pci_info().map_err(failed(&what))?.bus_id,
                })
            })
            .collect()
    }

    /// NVLink count: active links of `a` whose far end is `b`; on NVSwitch systems, where the
    /// far end is a switch, every active link of `a` when NVML says the pair talks over NVLink.
    fn pair_topology(&mut self, a: u32, b: u32) -> Result<PairTopology, BackendError> {
        let first = self.device(a)?;
        let second = self.device(b)?;
        let what = format!("topology of GPUs {a} and {b}");
        let second_bus = second
            .pci_info()
            .map_err(failed(&what))?
            .bus_id
            .to_ascii_uppercase();
        let peers = active_nvlink_peers(&first);
        let direct = peers.iter().filter(|peer| **peer == second_bus).count();
        let nvlinks = if direct > 0 {
            direct
        } else if first.p2p_status(&second, P2pCapabilitiesIndex::NvLink).ok()
            == Some(P2pStatus::Ok)
        {
            peers.len()
        } else {
            0
        };
        let level = first
            .topology_common_ancestor(second)
            .map_err(failed(&what))?;
        Ok(PairTopology {
            ancestor: ancestor(level),
            nvlinks: u32::try_from(nvlinks).unwrap_or(MAX_NVLINKS),
        })
    }

    fn sample(&mut self, index: u32) -> Result<Sample, BackendError> {
        let device = self.device(index)?;
        let what = format!("GPU {index}");
        // The memory reading is the liveness probe: every GPU NVML manages offers it.
        let memory = device.memory_info().map_err(failed(&what))?;
        let ecc = |kind| device.total_ecc_errors(kind, EccCounter::Volatile);
        let metrics = GpuMetrics {
            gpu_util_percent: optional(&what, device.utilization_rates())?.map(|u| u.gpu),
            fb_used_mib: Some(memory.used >> 20),
            gpu_temp_celsius: optional(&what, device.temperature(TemperatureSensor::Gpu))?,
            power_usage_watts: optional(&what, device.power_usage())?
                .map(|milliwatts| f64::from(milliwatts) / 1000.0),
            ecc_sbe_volatile_total: optional(&what, ecc(MemoryError::Corrected))?,
            ecc_dbe_volatile_total: optional(&what, ecc(MemoryError::Uncorrected))?,
            last_xid: None,
        };
        let processes = optional(&what, device.running_compute_processes())?
            .unwrap_or_default()
            .into_iter()
            .map(|process| GpuProcess {
                pid: process.pid,
                name: process_name(process.pid),
                used_memory_bytes: match process.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                },
            })
            .collect();
        Ok(Sample { metrics, processes })
    }

    fn take_xid_events(&mut self) -> Vec<XidEvent> {
        let mut events = Vec::new();
        for (index, set) in &self.xid_events {
            // A zero timeout returns at once: `Timeout` means no more events.
            while let Ok(event) = set.wait(0) {
                if let Some(XidError::Value(xid)) = event.event_data {
                    events.push(XidEvent {
                        gpu_index: *index,
                        xid,
                    });
                }
            }
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_the_error_names_the_library_and_the_way_out() {
        if std::path::Path::new("/proc/driver/nvidia/version").exists() {
            eprintln!("skipped: this machine has an NVIDIA driver");
            return;
        }
        let message = NvmlBackend::init().expect_err("no driver here").to_string();
        eprintln!("{message}");
        assert!(message.contains("libnvidia-ml.so.1"), "{message}");
        assert!(
            message.contains("--gpu-backend simulated --topology FILE"),
            "{message}"
        );
    }
}
