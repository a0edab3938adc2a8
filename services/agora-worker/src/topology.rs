//! From what NVML says about pairs of GPUs to Agora's locality levels.
//!
//! Themis's best locality level is the *slot*: GPUs that exchange data without crossing the
//! CPU's host bridge. Two GPUs share a slot when they are joined by NVLink or sit behind a
//! common PCIe switch (NVML `SINGLE` or `MULTIPLE`); slots are the connected components of
//! that relation, so three GPUs chained by NVLink form one slot even if the outer two are not
//! directly linked. Everything else on the host is "same machine"; racks come from the operator.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use agora_protocol::{GpuDescriptor, GpuLink, HostRegistration, LinkKind};

use crate::backend::{BackendError, CommonAncestor, Device, GpuBackend, PairTopology};

/// Asks the backend for the host's GPUs and every pair between them. A pair whose topology
/// NVML cannot tell (some virtual machines) counts as across sockets: separate slots.
pub fn discover(backend: &mut dyn GpuBackend) -> Result<HostTopology, BackendError> {
    let mut devices = backend.devices()?;
    devices.sort_by_key(|device| device.index);
    let mut pairs = BTreeMap::new();
    for (position, first) in devices.iter().enumerate() {
        for second in &devices[position + 1..] {
            let pair = backend
                .pair_topology(first.index, second.index)
                .unwrap_or_else(|error| {
                    tracing::warn!(
                        a = first.index,
                        b = second.index,
                        %error,
                        "unknown topology between two GPUs; treating them as across sockets"
                    );
                    PairTopology {
                        ancestor: CommonAncestor::System,
                        nvlinks: 0,
                    }
                });
            pairs.insert((first.index, second.index), pair);
        }
    }
    Ok(HostTopology { devices, pairs })
}

/// The protocol's link kind for a pair: any active NVLink wins, otherwise the PCIe ancestor.
pub fn link_kind(pair: PairTopology) -> LinkKind {
    if pair.nvlinks > 0 {
        return LinkKind::Nvlink;
    }
    match pair.ancestor {
        // Two GPUs on one board talk through the board's own PCIe switch.
        CommonAncestor::Internal | CommonAncestor::Single => LinkKind::PcieSwitch,
        CommonAncestor::Multiple => LinkKind::PcieSwitches,
        CommonAncestor::HostBridge => LinkKind::HostBridge,
        CommonAncestor::Node => LinkKind::SameNumaNode,
        CommonAncestor::System => LinkKind::CrossSocket,
    }
}

/// Whether a link keeps two GPUs in one slot.
pub fn shares_slot(kind: LinkKind) -> bool {
    matches!(
        kind,
        LinkKind::Nvlink | LinkKind::PcieSwitch | LinkKind::PcieSwitches
    )
}

/// The raw topology of one host: its GPUs (sorted by index) and every pair between them.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTopology {
    pub devices: Vec<Device>,
    /// Keyed by (lower index, higher index).
    pub pairs: BTreeMap<(u32, u32), PairTopology>,
}

impl HostTopology {
    pub fn pair(&self, a: u32, b: u32) -> Option<PairTopology> {
        self.pairs.get(&(a.min(b), a.max(b))).copied()
    }

    /// The slot of each GPU, by index. Slots are numbered from 0 in the order of their
    /// lowest GPU index, so the same hardware always gets the same numbers.
    pub fn slots(&self) -> BTreeMap<u32, u32> {
        let mut slot_of: BTreeMap<u32, u32> = BTreeMap::new();
        let mut next_slot = 0;
        for device in &self.devices {
            if slot_of.contains_key(&device.index) {
                continue;
            }
            // Flood the new slot from its lowest-indexed GPU.
            let mut frontier = vec![device.index];
            slot_of.insert(device.index, next_slot);
            while let Some(current) = frontier.pop() {
                for other in &self.devices {
                    let joined = self
                        .pair(current, other.index)
                        .is_some_and(|pair| shares_slot(link_kind(pair)));
                    if joined && !slot_of.contains_key(&other.index) {
                        slot_of.insert(other.index, next_slot);
                        frontier.push(other.index);
                    }
                }
            }
            next_slot += 1;
        }
        slot_of
    }

    /// What the worker registers with the arbiter about its GPUs (the host's CPUs and memory
    /// are the worker's to add).
    pub fn registration(&self, host: &str, rack: &str) -> HostRegistration {
        let slots = self.slots();
        let gpus = self
            .devices
            .iter()
            .map(|device| GpuDescriptor {
                uuid: device.uuid.clone(),
                name: device.name.clone(),
                memory_total_bytes: device.memory_total_bytes,
                pci_bus_id: device.pci_bus_id.clone(),
                index: device.index,
                slot: slots[&device.index],
                compute_capability: device.compute_capability,
            })
            .collect();
        let uuid_of: BTreeMap<u32, &str> = self
            .devices
            .iter()
            .map(|device| (device.index, device.uuid.as_str()))
            .collect();
        let links = self
            .pairs
            .iter()
            .map(|(&(a, b), &pair)| GpuLink {
                a: uuid_of[&a].to_owned(),
                b: uuid_of[&b].to_owned(),
                kind: link_kind(pair),
                nvlinks: pair.nvlinks,
            })
            .collect();
        HostRegistration {
            host: host.to_owned(),
            rack: rack.to_owned(),
            gpus,
            links,
            worker_version: env!("CARGO_PKG_VERSION").to_owned(),
            cpus: None,
            memory_gib: None,
        }
    }

    /// The GPUs, the matrix `nvidia-smi topo -m` would print, and Agora's slots.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let slots = self.slots();
        for device in &self.devices {
            let _ = writeln!(
                out,
                "GPU{}  {}  {}  compute {}  {} MiB  {}  slot {}",
                device.index,
                device.uuid,
                device.name,
                device
                    .compute_capability
                    .map_or_else(|| "?".to_owned(), |capability| capability.to_string()),
                device.memory_total_bytes >> 20,
                device.pci_bus_id,
                slots[&device.index]
            );
        }
        out.push('\n');
        out.push_str(&self.matrix());
        out.push_str(
            "\nLegend: X = self, NV# = # active NVLinks, PIX = one PCIe switch, \
             PXB = several PCIe switches, PHB = PCIe host bridge, NODE = same NUMA node, \
             SYS = across CPU sockets\n",
        );
        out.push_str("\nAgora slots (NVLink or a common PCIe switch):\n");
        let mut members: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        for (index, slot) in &slots {
            members
                .entry(*slot)
                .or_default()
                .push(format!("GPU{index}"));
        }
        for (slot, gpus) in members {
            let _ = writeln!(out, "  slot {slot}: {}", gpus.join(" "));
        }
        out
    }

    fn matrix(&self) -> String {
        let mut out = String::from("      ");
        for device in &self.devices {
            let _ = write!(out, "{:>6}", format!("GPU{}", device.index));
        }
        out.push('\n');
        for row in &self.devices {
            let _ = write!(out, "{:<6}", format!("GPU{}", row.index));
            for column in &self.devices {
                let cell = match self.pair(row.index, column.index) {
                    _ if row.index == column.index => "X".to_owned(),
                    Some(pair) => matrix_code(pair),
                    None => "?".to_owned(),
                };
                let _ = write!(out, "{cell:>6}");
            }
            out.push('\n');
        }
        out
    }
}

/// `nvidia-smi topo -m`'s code for a pair.
fn matrix_code(pair: PairTopology) -> String {
    match link_kind(pair) {
        LinkKind::Nvlink => format!("NV{}", pair.nvlinks),
        LinkKind::PcieSwitch => "PIX".to_owned(),
        LinkKind::PcieSwitches => "PXB".to_owned(),
        LinkKind::HostBridge => "PHB".to_owned(),
        LinkKind::SameNumaNode => "NODE".to_owned(),
        LinkKind::CrossSocket => "SYS".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use agora_protocol::ComputeCapability;

    use super::*;

    fn device(index: u32) -> Device {
        Device {
            index,
            uuid: format!("GPU-{index}"),
            name: "NVIDIA H100 80GB HBM3".to_owned(),
            compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
            memory_total_bytes: 80 << 30,
            pci_bus_id: format!("00000000:{index:02X}:00.0"),
        }
    }

    /// `count` GPUs; listed pairs get `pair`, every other pair is across sockets.
    fn host(count: u32, joined: &[(u32, u32, PairTopology)]) -> HostTopology {
        let mut pairs = BTreeMap::new();
        for a in 0..count {
            for b in a + 1..count {
                pairs.insert((a, b), pcie(CommonAncestor::System));
            }
        }
        for &(a, b, pair) in joined {
            pairs.insert((a, b), pair);
        }
        HostTopology {
            devices: (0..count).map(device).collect(),
            pairs,
        }
    }

    fn pcie(ancestor: CommonAncestor) -> PairTopology {
        PairTopology {
            ancestor,
            nvlinks: 0,
        }
    }

    fn nvlink(count: u32) -> PairTopology {
        PairTopology {
            ancestor: CommonAncestor::System,
            nvlinks: count,
        }
    }

    #[test]
    fn nvlink_wins_over_any_pcie_ancestor() {
        assert_eq!(link_kind(nvlink(12)), LinkKind::Nvlink);
        assert_eq!(
            link_kind(pcie(CommonAncestor::Single)),
            LinkKind::PcieSwitch
        );
        assert_eq!(
            link_kind(pcie(CommonAncestor::Internal)),
            LinkKind::PcieSwitch
        );
        assert_eq!(
            link_kind(pcie(CommonAncestor::Multiple)),
            LinkKind::PcieSwitches
        );
        assert_eq!(
            link_kind(pcie(CommonAncestor::HostBridge)),
            LinkKind::HostBridge
        );
        assert_eq!(
            link_kind(pcie(CommonAncestor::Node)),
            LinkKind::SameNumaNode
        );
        assert_eq!(
            link_kind(pcie(CommonAncestor::System)),
            LinkKind::CrossSocket
        );
    }

    #[test]
    fn only_nvlink_and_pcie_switches_share_a_slot() {
        assert!(shares_slot(LinkKind::Nvlink));
        assert!(shares_slot(LinkKind::PcieSwitch));
        assert!(shares_slot(LinkKind::PcieSwitches));
        assert!(!shares_slot(LinkKind::HostBridge));
        assert!(!shares_slot(LinkKind::SameNumaNode));
        assert!(!shares_slot(LinkKind::CrossSocket));
    }

    #[test]
    fn slots_are_connected_components_numbered_by_lowest_gpu() {
        // GPU 3-1 by NVLink, 1-5 by a PCIe switch (so 1, 3, 5 chain into one slot although 3
        // and 5 are not directly joined); 0-4 behind several switches; 2 alone; 4-2 only
        // through the host bridge, which does not join slots.
        let topology = host(
            6,
            &[
                (1, 3, nvlink(4)),
                (1, 5, pcie(CommonAncestor::Single)),
                (0, 4, pcie(CommonAncestor::Multiple)),
                (2, 4, pcie(CommonAncestor::HostBridge)),
            ],
        );
        let slots = topology.slots();
        assert_eq!(
            slots.into_iter().collect::<Vec<_>>(),
            vec![(0, 0), (1, 1), (2, 2), (3, 1), (4, 0), (5, 1)]
        );
    }

    #[test]
    fn the_registration_carries_slots_and_every_pair() {
        let topology = host(3, &[(0, 2, nvlink(2))]);
        let registration = topology.registration("gpu-host-7", "rack-b");
        assert_eq!(registration.host, "gpu-host-7");
        assert_eq!(registration.rack, "rack-b");
        let slots: Vec<(String, u32)> = registration
            .gpus
            .iter()
            .map(|gpu| (gpu.uuid.clone(), gpu.slot))
            .collect();
        assert_eq!(
            slots,
            vec![
                ("GPU-0".to_owned(), 0),
                ("GPU-1".to_owned(), 1),
                ("GPU-2".to_owned(), 0)
            ]
        );
        assert_eq!(registration.links.len(), 3);
        let nvlinked = registration
            .links
            .iter()
            .find(|link| link.kind == LinkKind::Nvlink)
            .expect("the NVLink pair is listed");
        assert_eq!(
            (nvlinked.a.as_str(), nvlinked.b.as_str(), nvlinked.nvlinks),
            ("GPU-0", "GPU-2", 2)
        );
    }

    #[test]
    fn the_rendering_shows_the_matrix_and_the_slots() {
        let topology = host(3, &[(0, 1, nvlink(12)), (1, 2, pcie(CommonAncestor::Node))]);
        let text = topology.render();
        assert!(
            text.contains("GPU0  GPU-0  NVIDIA H100 80GB HBM3  compute 9.0  81920 MiB"),
            "{text}"
        );
        let matrix = topology.matrix();
        let row_of_gpu1 = matrix
            .lines()
            .find(|line| line.starts_with("GPU1 "))
            .expect("a matrix row for GPU1");
        let cells: Vec<&str> = row_of_gpu1.split_whitespace().collect();
        assert_eq!(cells, vec!["GPU1", "NV12", "X", "NODE"]);
        assert!(text.contains("slot 0: GPU0 GPU1"), "{text}");
        assert!(text.contains("slot 1: GPU2"), "{text}");
    }
}
