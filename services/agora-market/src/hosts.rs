//! GPU hosts as their workers describe them: a host (one machine) by name, in a rack by name,
//! with its GPUs in slots numbered per host. The directory maps those names onto the cluster's
//! numbers so that the cluster can grow as hosts register: a new host's GPUs are appended
//! (existing GPUs keep their indices), and a host that registers again gets its machine, rack
//! and slots back.

use std::collections::{BTreeMap, BTreeSet};

use crate::resources::MachineResources;
use crate::topology::{Cluster, Gpu, GpuId, GpuLocation};

/// One GPU of a registering host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGpu {
    /// The CUDA UUID on real hosts.
    pub id: GpuId,
    pub gpu_type: String,
    /// The host's own slot number (GPUs joined by NVLink or one PCIe switch share one).
    pub slot: u32,
}

/// A host registering: its name, its rack's name, its GPUs, and the CPU cores and memory it
/// has (each `None` where the host does not say: not modelled on its machine).
#[derive(Debug, Clone, PartialEq)]
pub struct HostSpec {
    pub name: String,
    pub rack: String,
    pub gpus: Vec<HostGpu>,
    pub resources: MachineResources,
}

/// A registered host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    pub name: String,
    pub rack: String,
    pub machine: u32,
    /// False once the host stopped heartbeating, until it returns.
    pub up: bool,
    /// The host's slot numbers mapped onto the cluster's.
    slots: BTreeMap<u32, u32>,
}

impl Host {
    /// A host as the service recorded it: machine `machine`, with `slots` mapping its slot
    /// numbers onto the cluster's.
    pub fn restored(
        name: String,
        rack: String,
        machine: u32,
        slots: BTreeMap<u32, u32>,
        up: bool,
    ) -> Self {
        Self {
            name,
            rack,
            machine,
            up,
            slots,
        }
    }

    /// The cluster's slot number of the host's slot `slot`, if the host has reported it.
    pub fn cluster_slot(&self, slot: u32) -> Option<u32> {
        self.slots.get(&slot).copied()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("host {host} is registered in rack {registered:?}, not {requested:?}; a host stays in its rack (register a moved machine under a new host name)")]
    MovedRack {
        host: String,
        registered: String,
        requested: String,
    },
    #[error("GPU {gpu} belongs to another host ({owner}); GPU ids (CUDA UUIDs) must be unique in the cluster")]
    GpuOnAnotherHost { gpu: GpuId, owner: String },
    #[error("GPU {0} appears twice in the registration")]
    DuplicateGpu(GpuId),
    #[error("host {0} reports no GPUs")]
    NoGpus(String),
    #[error("host {0} is not registered")]
    UnknownHost(String),
    #[error("machine {0} of a restored host has no GPU in the cluster")]
    NoSuchMachine(u32),
}

/// Where a registration puts a host's GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// The host as the directory will hold it.
    pub host: Host,
    /// GPUs the cluster does not have yet, with their locations.
    pub new_gpus: Vec<Gpu>,
}

/// Every registered host, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostDirectory {
    hosts: BTreeMap<String, Host>,
    racks: BTreeMap<String, u32>,
}

impl HostDirectory {
    pub fn get(&self, name: &str) -> Option<&Host> {
        self.hosts.get(name)
    }

    pub fn hosts(&self) -> impl Iterator<Item = &Host> {
        self.hosts.values()
    }

    /// The host that is machine `machine`, if a host registered it.
    pub fn on_machine(&self, machine: u32) -> Option<&Host> {
        self.hosts.values().find(|host| host.machine == machine)
    }

    /// Where `spec`'s GPUs go in `cluster`: a known host keeps its machine, rack and slots; a
    /// new host, rack or slot takes the next free number. GPUs the cluster already has keep
    /// their place. Changes nothing; [`Self::insert`] records the result.
    pub fn place(&self, cluster: &Cluster, spec: &HostSpec) -> Result<Placement, HostError> {
        if spec.gpus.is_empty() {
            return Err(HostError::NoGpus(spec.name.clone()));
        }
        let mut seen = BTreeSet::new();
        if let Some(gpu) = spec.gpus.iter().find(|gpu| !seen.insert(&gpu.id)) {
            return Err(HostError::DuplicateGpu(gpu.id.clone()));
        }
        let next = cluster.next_free_numbers();
        let mut host = match self.hosts.get(&spec.name) {
            Some(known) if known.rack != spec.rack => {
                return Err(HostError::MovedRack {
                    host: spec.name.clone(),
                    registered: known.rack.clone(),
                    requested: spec.rack.clone(),
                })
            }
            Some(known) => known.clone(),
            None => Host {
                name: spec.name.clone(),
                rack: spec.rack.clone(),
                machine: next.machine,
                up: true,
                slots: BTreeMap::new(),
            },
        };
        host.up = true;
        let rack = self.rack_number(&spec.rack, next.rack);
        let mut next_slot = next.slot;
        let mut new_gpus = Vec::new();
        for gpu in &spec.gpus {
            if let Some(index) = cluster.index_of(&gpu.id) {
                let machine = cluster.location(index).machine;
                if machine != host.machine {
                    let owner = self
                        .on_machine(machine)
                        .map_or_else(|| format!("machine {machine}"), |host| host.name.clone());
                    return Err(HostError::GpuOnAnotherHost {
                        gpu: gpu.id.clone(),
                        owner,
                    });
                }
                continue;
            }
            let slot = *host.slots.entry(gpu.slot).or_insert_with(|| {
                next_slot += 1;
                next_slot - 1
            });
            new_gpus.push(Gpu {
                id: gpu.id.clone(),
                gpu_type: gpu.gpu_type.clone(),
                location: GpuLocation {
                    rack,
                    machine: host.machine,
                    slot,
                },
            });
        }
        Ok(Placement { host, new_gpus })
    }

    /// The number of rack `name`: its own if known, else the first one no rack uses.
    fn rack_number(&self, name: &str, next_in_cluster: u32) -> u32 {
        self.racks.get(name).copied().unwrap_or_else(|| {
            let next_in_directory = self.racks.values().map(|rack| rack + 1).max();
            next_in_directory.unwrap_or(0).max(next_in_cluster)
        })
    }

    /// Records a placed (or restored) host whose GPUs are in `cluster`.
    pub fn insert(&mut self, host: Host, cluster: &Cluster) -> Result<(), HostError> {
        let rack = cluster
            .gpus()
            .find(|(_, gpu)| gpu.location.machine == host.machine)
            .map(|(_, gpu)| gpu.location.rack)
            .ok_or(HostError::NoSuchMachine(host.machine))?;
        self.racks.insert(host.rack.clone(), rack);
        self.hosts.insert(host.name.clone(), host);
        Ok(())
    }

    pub fn set_up(&mut self, name: &str, up: bool) -> Result<&Host, HostError> {
        let host = self
            .hosts
            .get_mut(name)
            .ok_or_else(|| HostError::UnknownHost(name.to_owned()))?;
        host.up = up;
        Ok(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{ClusterSpec, GpuIndex};

    fn spec(name: &str, rack: &str, gpus: &[(&str, u32)]) -> HostSpec {
        HostSpec {
            name: name.into(),
            rack: rack.into(),
            gpus: gpus
                .iter()
                .map(|&(id, slot)| HostGpu {
                    id: GpuId::from(id),
                    gpu_type: "H100".into(),
                    slot,
                })
                .collect(),
            resources: MachineResources::default(),
        }
    }

    fn join(directory: &mut HostDirectory, cluster: &mut Cluster, spec: &HostSpec) -> Host {
        let placement = directory.place(cluster, spec).expect("valid host");
        cluster.extend(placement.new_gpus).expect("consistent");
        directory
            .insert(placement.host.clone(), cluster)
            .expect("placed");
        placement.host
    }

    #[test]
    fn hosts_get_their_own_machines_racks_by_name_and_slots_per_host() {
        let (mut directory, mut cluster) = (
            HostDirectory::default(),
            Cluster::new(vec![]).expect("empty"),
        );
        join(
            &mut directory,
            &mut cluster,
            &spec("a", "r1", &[("GPU-a0", 0), ("GPU-a1", 0), ("GPU-a2", 1)]),
        );
        join(
            &mut directory,
            &mut cluster,
            &spec("b", "r1", &[("GPU-b0", 0)]),
        );
        join(
            &mut directory,
            &mut cluster,
            &spec("c", "r2", &[("GPU-c0", 0)]),
        );
        let at = |id: &str| cluster.location(cluster.index_of(&GpuId::from(id)).expect("known"));
        assert_eq!(
            at("GPU-a0").slot,
            at("GPU-a1").slot,
            "one host slot is one cluster slot"
        );
        assert_ne!(at("GPU-a0").slot, at("GPU-a2").slot);
        assert_ne!(
            at("GPU-a0").slot,
            at("GPU-b0").slot,
            "slot 0 of two hosts differ"
        );
        assert_ne!(at("GPU-a0").machine, at("GPU-b0").machine);
        assert_eq!(at("GPU-a0").rack, at("GPU-b0").rack, "racks go by name");
        assert_ne!(at("GPU-a0").rack, at("GPU-c0").rack);
    }

    #[test]
    fn a_returning_host_keeps_its_place_and_new_gpus_join_its_slots() {
        let (mut directory, mut cluster) = (
            HostDirectory::default(),
            Cluster::new(vec![]).expect("empty"),
        );
        let first = join(
            &mut directory,
            &mut cluster,
            &spec("a", "r1", &[("GPU-a0", 0)]),
        );
        join(
            &mut directory,
            &mut cluster,
            &spec("b", "r1", &[("GPU-b0", 0)]),
        );
        let again = directory
            .place(&cluster, &spec("a", "r1", &[("GPU-a0", 0), ("GPU-a1", 0)]))
            .expect("valid");
        assert_eq!(again.host.machine, first.machine);
        assert_eq!(again.new_gpus.len(), 1, "only the new GPU is appended");
        assert_eq!(again.new_gpus[0].location, cluster.location(GpuIndex(0)));
    }

    #[test]
    fn inconsistent_registrations_are_refused() {
        let (mut directory, mut cluster) = (
            HostDirectory::default(),
            Cluster::new(vec![]).expect("empty"),
        );
        join(
            &mut directory,
            &mut cluster,
            &spec("a", "r1", &[("GPU-a0", 0)]),
        );
        let refused = [
            (spec("a", "r2", &[("GPU-a0", 0)]), "moved rack"),
            (spec("b", "r1", &[("GPU-a0", 0)]), "another host's GPU"),
            (spec("b", "r1", &[("GPU-x", 0), ("GPU-x", 1)]), "duplicate"),
            (spec("b", "r1", &[]), "no GPUs"),
        ];
        for (spec, why) in refused {
            assert!(directory.place(&cluster, &spec).is_err(), "{why}");
        }
        assert!(matches!(
            directory.set_up("nobody", false),
            Err(HostError::UnknownHost(_))
        ));
    }

    #[test]
    fn hosts_join_a_simulated_fleet_above_its_numbers() {
        let mut cluster = Cluster::from_spec(&ClusterSpec::uniform(2, 1, 2, 1)).expect("valid");
        let mut directory = HostDirectory::default();
        join(
            &mut directory,
            &mut cluster,
            &spec("a", "r1", &[("GPU-a0", 0)]),
        );
        let location = cluster.location(GpuIndex(4));
        assert_eq!((location.rack, location.machine, location.slot), (2, 2, 4));
    }
}
