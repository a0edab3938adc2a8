//! Cluster topology with Themis's four locality levels (a GPU sits in a slot, a slot in a
//! machine, a machine in a rack) and placement: choosing well-placed sets of GPUs.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::resources::MachineResources;

/// A GPU's stable, human-readable identifier (e.g. `m3-g1`, or a CUDA UUID on real hosts).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GpuId(pub String);

impl fmt::Display for GpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for GpuId {
    fn from(id: &str) -> Self {
        Self(id.to_owned())
    }
}

impl From<String> for GpuId {
    fn from(id: String) -> Self {
        Self(id)
    }
}

/// How far apart a set of GPUs is. Ordered from best to worst placement.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Locality {
    SameSlot,
    SameMachine,
    SameRack,
    CrossRack,
}

impl Locality {
    pub const ALL: [Locality; 4] = [
        Locality::SameSlot,
        Locality::SameMachine,
        Locality::SameRack,
        Locality::CrossRack,
    ];

    /// The locality of two GPUs.
    pub fn between(a: GpuLocation, b: GpuLocation) -> Locality {
        if a.slot == b.slot {
            Locality::SameSlot
        } else if a.machine == b.machine {
            Locality::SameMachine
        } else if a.rack == b.rack {
            Locality::SameRack
        } else {
            Locality::CrossRack
        }
    }

    /// The locality of a set: the widest spread between any two of its GPUs. A set of zero or
    /// one GPU is `SameSlot`.
    pub fn of(locations: impl IntoIterator<Item = GpuLocation>) -> Locality {
        let mut locations = locations.into_iter();
        let Some(first) = locations.next() else {
            return Locality::SameSlot;
        };
        locations
            .map(|location| Locality::between(first, location))
            .max()
            .unwrap_or(Locality::SameSlot)
    }
}

/// Where a GPU sits. Slot and machine numbers are unique across the whole cluster, so two GPUs
/// share a slot exactly when their `slot` fields are equal.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GpuLocation {
    pub rack: u32,
    pub machine: u32,
    pub slot: u32,
}

/// Index of a GPU inside a [`Cluster`]; cheap to copy and compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GpuIndex(pub u32);

impl GpuIndex {
    pub fn get(self) -> usize {
        self.0 as usize
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    pub id: GpuId,
    pub gpu_type: String,
    pub location: GpuLocation,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TopologyError {
    #[error("GPU id {0} appears twice in the cluster; GPU ids must be unique")]
    DuplicateGpu(GpuId),
    #[error("slot {slot} holds GPUs on different machines ({first} and {second}); a slot belongs to one machine")]
    SlotOnTwoMachines { slot: u32, first: u32, second: u32 },
    #[error(
        "machine {machine} is listed in racks {first} and {second}; a machine belongs to one rack"
    )]
    MachineInTwoRacks {
        machine: u32,
        first: u32,
        second: u32,
    },
}

/// The GPUs of a cluster, with their topology.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    gpus: Vec<Gpu>,
    by_id: HashMap<GpuId, GpuIndex>,
    /// Interchangeability class of each GPU: GPUs in one slot with one type share a class.
    interchange_class: Vec<u32>,
    /// CPU cores and memory of the machines that give them, by machine number.
    machine_resources: BTreeMap<u32, MachineResources>,
    /// How many GPUs each machine has, by machine number: read for every app's speeds.
    machine_gpus: BTreeMap<u32, u32>,
}

impl Cluster {
    pub fn new(gpus: Vec<Gpu>) -> Result<Self, TopologyError> {
        let mut by_id = HashMap::with_capacity(gpus.len());
        let mut slot_machine = HashMap::new();
        let mut machine_rack = HashMap::new();
        let mut classes: HashMap<(u32, &str), u32> = HashMap::new();
        let mut interchange_class = Vec::with_capacity(gpus.len());
        let mut machine_gpus = BTreeMap::new();
        for (index, gpu) in gpus.iter().enumerate() {
            let location = gpu.location;
            *machine_gpus.entry(location.machine).or_insert(0) += 1;
            if by_id
                .insert(gpu.id.clone(), GpuIndex(index as u32))
                .is_some()
            {
                return Err(TopologyError::DuplicateGpu(gpu.id.clone()));
            }
            let machine = *slot_machine
                .entry(location.slot)
                .or_insert(location.machine);
            if machine != location.machine {
                return Err(TopologyError::SlotOnTwoMachines {
                    slot: location.slot,
                    first: machine,
                    second: location.machine,
                });
            }
            let rack = *machine_rack
                .entry(location.machine)
                .or_insert(location.rack);
            if rack != location.rack {
                return Err(TopologyError::MachineInTwoRacks {
                    machine: location.machine,
                    first: rack,
                    second: location.rack,
                });
            }
            let next_class = classes.len() as u32;
            let class = *classes
                .entry((location.slot, gpu.gpu_type.as_str()))
                .or_insert(next_class);
            interchange_class.push(class);
        }
        Ok(Self {
            gpus,
            by_id,
            interchange_class,
            machine_resources: BTreeMap::new(),
            machine_gpus,
        })
    }

    /// Builds a cluster from a nested description, numbering machines and slots in order and
    /// naming GPUs `m{machine}-g{n}`.
    pub fn from_spec(spec: &ClusterSpec) -> Result<Self, TopologyError> {
        let mut gpus = Vec::new();
        let mut machine_resources = BTreeMap::new();
        let (mut machine_number, mut slot_number) = (0u32, 0u32);
        for (rack_number, rack) in spec.racks.iter().enumerate() {
            for machine in &rack.machines {
                let resources = MachineResources {
                    cpus: machine.cpus.map(f64::from),
                    memory_gib: machine.memory_gib,
                };
                if !resources.is_unmodelled() {
                    machine_resources.insert(machine_number, resources);
                }
                let mut gpu_in_machine = 0;
                for slot in &machine.slots {
                    for _ in 0..slot.gpus {
                        let id = format!("m{machine_number}-g{gpu_in_machine}");
                        gpus.push(Gpu {
                            id: GpuId(id),
                            gpu_type: slot.gpu_type.clone(),
                            location: GpuLocation {
                                rack: rack_number as u32,
                                machine: machine_number,
                                slot: slot_number,
                            },
                        });
                        gpu_in_machine += 1;
                    }
                    slot_number += 1;
                }
                machine_number += 1;
            }
        }
        let mut cluster = Self::new(gpus)?;
        cluster.machine_resources = machine_resources;
        Ok(cluster)
    }

    /// Appends `gpus` (a host joining); every existing GPU keeps its index and class. Fails,
    /// changing nothing, if the grown cluster would be inconsistent.
    pub fn extend(&mut self, gpus: Vec<Gpu>) -> Result<Vec<GpuIndex>, TopologyError> {
        let first = self.gpus.len();
        let mut all = self.gpus.clone();
        all.extend(gpus);
        let mut grown = Self::new(all)?;
        grown.machine_resources = std::mem::take(&mut self.machine_resources);
        *self = grown;
        Ok((first..self.gpus.len())
            .map(|index| GpuIndex(index as u32))
            .collect())
    }

    /// The smallest rack, machine and slot numbers above every number in use (all 0 when the
    /// cluster is empty): where a new host's GPUs go.
    pub fn next_free_numbers(&self) -> GpuLocation {
        let above = |number: fn(&GpuLocation) -> u32| {
            self.gpus
                .iter()
                .map(|gpu| number(&gpu.location) + 1)
                .max()
                .unwrap_or(0)
        };
        GpuLocation {
            rack: above(|location| location.rack),
            machine: above(|location| location.machine),
            slot: above(|location| location.slot),
        }
    }

    pub fn len(&self) -> usize {
        self.gpus.len()
    }

    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty()
    }

    pub fn gpu(&self, index: GpuIndex) -> &Gpu {
        &self.gpus[index.get()]
    }

    pub fn gpus(&self) -> impl ExactSizeIterator<Item = (GpuIndex, &Gpu)> {
        self.gpus
            .iter()
            .enumerate()
            .map(|(i, gpu)| (GpuIndex(i as u32), gpu))
    }

    pub fn index_of(&self, id: &GpuId) -> Option<GpuIndex> {
        self.by_id.get(id).copied()
    }

    pub fn location(&self, index: GpuIndex) -> GpuLocation {
        self.gpus[index.get()].location
    }

    /// GPUs with equal classes are interchangeable for placement (same slot, same type).
    pub fn interchange_class(&self, index: GpuIndex) -> u32 {
        self.interchange_class[index.get()]
    }

    pub fn locality(&self, gpus: &[GpuIndex]) -> Locality {
        Locality::of(gpus.iter().map(|&gpu| self.location(gpu)))
    }

    /// The CPU cores and memory of `machine` (`None` each where the machine does not say).
    pub fn machine_resources(&self, machine: u32) -> MachineResources {
        self.machine_resources
            .get(&machine)
            .copied()
            .unwrap_or_default()
    }

    /// Sets what `machine` has besides GPUs (a host reporting it); an unmodelled value makes the
    /// machine unmodelled again.
    pub fn set_machine_resources(&mut self, machine: u32, resources: MachineResources) {
        if resources.is_unmodelled() {
            self.machine_resources.remove(&machine);
        } else {
            self.machine_resources.insert(machine, resources);
        }
    }

    /// Whether any machine gives its CPU cores or memory.
    pub fn models_resources(&self) -> bool {
        !self.machine_resources.is_empty()
    }

    /// The most CPU cores and the most memory any one machine has.
    pub fn largest_machine(&self) -> MachineResources {
        let most = |amount: fn(&MachineResources) -> Option<f64>| {
            self.machine_resources
                .values()
                .filter_map(amount)
                .reduce(f64::max)
        };
        MachineResources {
            cpus: most(|machine| machine.cpus),
            memory_gib: most(|machine| machine.memory_gib),
        }
    }

    /// How many GPUs each machine has, by machine number.
    pub fn gpus_per_machine(&self) -> &BTreeMap<u32, u32> {
        &self.machine_gpus
    }
}

/// A cluster described as racks of machines of slots, as in cluster spec files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterSpec {
    pub racks: Vec<RackSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RackSpec {
    pub machines: Vec<MachineSpec>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineSpec {
    pub slots: Vec<SlotSpec>,
    /// CPU cores; absent: CPUs are not modelled on this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// Memory in GiB; absent: memory is not modelled on this machine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotSpec {
    pub gpus: u32,
    pub gpu_type: String,
}

impl MachineSpec {
    /// A machine of `slots` that does not give its CPU cores or memory.
    pub fn new(slots: Vec<SlotSpec>) -> Self {
        Self {
            slots,
            cpus: None,
            memory_gib: None,
        }
    }
}

impl ClusterSpec {
    /// `racks` racks of `machines_per_rack` identical machines with `slots` slots of
    /// `gpus_per_slot` GPUs each.
    pub fn uniform(racks: u32, machines_per_rack: u32, slots: u32, gpus_per_slot: u32) -> Self {
        let slot = SlotSpec {
            gpus: gpus_per_slot,
            gpu_type: "gpu".to_owned(),
        };
        let machine = MachineSpec::new(vec![slot; slots as usize]);
        let rack = RackSpec {
            machines: vec![machine; machines_per_rack as usize],
        };
        Self {
            racks: vec![rack; racks as usize],
        }
    }
}

/// Placement over a pool of free GPUs: finds well-placed subsets of a given size, near the GPUs
/// an app already holds (its anchors). Built once per pool, queried per app and size.
#[derive(Debug, Clone)]
pub struct PlacementIndex {
    locations: Vec<GpuLocation>,
    /// Pool items grouped per container, for each level (slot, machine, rack), keyed by the
    /// container's number.
    containers: [BTreeMap<u32, Vec<usize>>; 3],
    /// Container numbers of each level sorted by (size, number), for best-fit look-ups.
    by_size: [Vec<(usize, u32)>; 3],
    /// The size of each item's slot, machine and rack in the pool: `fill` ranks items by them
    /// for every bundle an agent prices, so they are looked up once.
    container_sizes: Vec<[usize; 3]>,
}

/// How `fill` ranks an item at one level: containers near the anchors first, then the fullest,
/// then by number.
type LevelRank = (bool, std::cmp::Reverse<usize>, u32);

pub(crate) const SLOT: usize = 0;
const MACHINE: usize = 1;
const RACK: usize = 2;

/// The number of the container holding `location` at `level` (0 slot, 1 machine, 2 rack).
pub(crate) fn container_of(location: GpuLocation, level: usize) -> u32 {
    match level {
        SLOT => location.slot,
        MACHINE => location.machine,
        _ => location.rack,
    }
}

impl PlacementIndex {
    pub fn new(locations: Vec<GpuLocation>) -> Self {
        let mut containers: [BTreeMap<u32, Vec<usize>>; 3] = Default::default();
        for (item, &location) in locations.iter().enumerate() {
            for (level, map) in containers.iter_mut().enumerate() {
                map.entry(container_of(location, level))
                    .or_default()
                    .push(item);
            }
        }
        let by_size = std::array::from_fn(|level| {
            let mut sizes: Vec<(usize, u32)> = containers[level]
                .iter()
                .map(|(&number, items)| (items.len(), number))
                .collect();
            sizes.sort_unstable();
            sizes
        });
        let container_sizes = locations
            .iter()
            .map(|&location| {
                std::array::from_fn(|level| containers[level][&container_of(location, level)].len())
            })
            .collect();
        Self {
            locations,
            containers,
            by_size,
            container_sizes,
        }
    }

    pub fn len(&self) -> usize {
        self.locations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.locations.is_empty()
    }

    pub fn location(&self, item: usize) -> GpuLocation {
        self.locations[item]
    }

    /// The single best-placed subset of `count` items near `anchors`.
    pub fn best_subset(&self, count: usize, anchors: &[GpuLocation]) -> Vec<usize> {
        self.candidate_subsets(count, anchors, 1)
            .into_iter()
            .next()
            .unwrap_or_default()
    }

    /// Up to `per_level` alternative subsets of `count` items for each locality level, best
    /// placed first: subsets inside one slot, then one machine, then one rack, then across
    /// racks. Containers near the anchors come first, then best fit (the smallest container
    /// that is large enough, which leaves big containers whole for big requests).
    pub fn candidate_subsets(
        &self,
        count: usize,
        anchors: &[GpuLocation],
        per_level: usize,
    ) -> Vec<Vec<usize>> {
        if count == 0 || count > self.locations.len() || per_level == 0 {
            return Vec::new();
        }
        let anchored = AnchoredContainers::new(anchors);
        let mut subsets = Vec::new();
        for level in [SLOT, MACHINE, RACK] {
            for container in self.fitting_containers(level, count, anchors, per_level) {
                subsets.push(self.fill(&self.containers[level][&container], count, &anchored));
            }
        }
        if subsets.is_empty() {
            let everything: Vec<usize> = (0..self.locations.len()).collect();
            subsets.push(self.fill(&everything, count, &anchored));
        }
        subsets
    }

    /// Containers of `level` with at least `count` items: anchored ones first, then best fit.
    fn fitting_containers(
        &self,
        level: usize,
        count: usize,
        anchors: &[GpuLocation],
        limit: usize,
    ) -> Vec<u32> {
        let mut chosen: Vec<u32> = Vec::with_capacity(limit);
        for &anchor in anchors {
            let number = container_of(anchor, level);
            let fits = self.containers[level]
                .get(&number)
                .is_some_and(|items| items.len() >= count);
            if fits && !chosen.contains(&number) && chosen.len() < limit {
                chosen.push(number);
            }
        }
        let sizes = &self.by_size[level];
        let first_fit = sizes.partition_point(|&(size, _)| size < count);
        for &(_, number) in &sizes[first_fit..] {
            if chosen.len() >= limit {
                break;
            }
            if !chosen.contains(&number) {
                chosen.push(number);
            }
        }
        chosen
    }

    /// Takes `count` of `items`, keeping them together: racks, machines and slots nearest the
    /// anchors first, then the fullest, so the result spans as few containers as possible.
    fn fill(&self, items: &[usize], count: usize, anchored: &AnchoredContainers) -> Vec<usize> {
        let rank = |item: usize, level: usize| -> LevelRank {
            let number = container_of(self.locations[item], level);
            (
                !anchored.contains(level, number),
                std::cmp::Reverse(self.container_sizes[item][level]),
                number,
            )
        };
        let mut ranked: Vec<(LevelRank, LevelRank, LevelRank, usize)> = items
            .iter()
            .map(|&item| {
                (
                    rank(item, RACK),
                    rank(item, MACHINE),
                    rank(item, SLOT),
                    item,
                )
            })
            .collect();
        // Every key ends with its item, so the `count` smallest are the same set whichever
        // way they are found: select them, then sort only those.
        if count < ranked.len() {
            ranked.select_nth_unstable(count);
            ranked.truncate(count);
        }
        ranked.sort_unstable();
        ranked.into_iter().map(|(.., item)| item).collect()
    }
}

/// The slots, machines and racks that hold an app's anchors, each level's numbers sorted.
struct AnchoredContainers([Vec<u32>; 3]);

impl AnchoredContainers {
    fn new(anchors: &[GpuLocation]) -> Self {
        Self(std::array::from_fn(|level| {
            let mut numbers: Vec<u32> = anchors
                .iter()
                .map(|&anchor| container_of(anchor, level))
                .collect();
            numbers.sort_unstable();
            numbers.dedup();
            numbers
        }))
    }

    fn contains(&self, level: usize, number: u32) -> bool {
        self.0[level].binary_search(&number).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location(rack: u32, machine: u32, slot: u32) -> GpuLocation {
        GpuLocation {
            rack,
            machine,
            slot,
        }
    }

    #[test]
    fn locality_is_the_widest_spread() {
        let a = location(0, 0, 0);
        assert_eq!(Locality::of([a, a]), Locality::SameSlot);
        assert_eq!(Locality::of([a, location(0, 0, 1)]), Locality::SameMachine);
        assert_eq!(
            Locality::of([a, location(0, 1, 2), location(0, 0, 1)]),
            Locality::SameRack
        );
        assert_eq!(Locality::of([a, location(1, 2, 3)]), Locality::CrossRack);
        assert_eq!(Locality::of([]), Locality::SameSlot);
    }

    #[test]
    fn spec_numbers_machines_and_slots_across_the_cluster() {
        let cluster = Cluster::from_spec(&ClusterSpec::uniform(2, 2, 2, 2)).expect("valid spec");
        assert_eq!(cluster.len(), 16);
        let last = cluster.index_of(&GpuId::from("m3-g3")).expect("named gpu");
        assert_eq!(cluster.location(last), location(1, 3, 7));
        let same_slot = [GpuIndex(0), GpuIndex(1)];
        assert_eq!(
            cluster.interchange_class(same_slot[0]),
            cluster.interchange_class(same_slot[1])
        );
        assert_ne!(
            cluster.interchange_class(GpuIndex(1)),
            cluster.interchange_class(GpuIndex(2))
        );
    }

    #[test]
    fn rejects_inconsistent_topologies() {
        let gpu = |id: &str, location| Gpu {
            id: GpuId::from(id),
            gpu_type: "a".into(),
            location,
        };
        let duplicate = Cluster::new(vec![
            gpu("x", location(0, 0, 0)),
            gpu("x", location(0, 0, 1)),
        ]);
        assert!(matches!(duplicate, Err(TopologyError::DuplicateGpu(_))));
        let split_slot = Cluster::new(vec![
            gpu("x", location(0, 0, 0)),
            gpu("y", location(0, 1, 0)),
        ]);
        assert!(matches!(
            split_slot,
            Err(TopologyError::SlotOnTwoMachines { .. })
        ));
        let split_machine = Cluster::new(vec![
            gpu("x", location(0, 0, 0)),
            gpu("y", location(1, 0, 1)),
        ]);
        assert!(matches!(
            split_machine,
            Err(TopologyError::MachineInTwoRacks { .. })
        ));
    }

    #[test]
    fn extending_keeps_indices_and_refuses_inconsistent_gpus() {
        let mut spec = ClusterSpec::uniform(1, 1, 1, 2);
        spec.racks[0].machines[0].cpus = Some(16);
        let mut cluster = Cluster::from_spec(&spec).expect("valid spec");
        let before: Vec<Gpu> = cluster.gpus().map(|(_, gpu)| gpu.clone()).collect();
        assert_eq!(cluster.next_free_numbers(), location(1, 1, 1));
        let new = Gpu {
            id: GpuId::from("GPU-new"),
            gpu_type: "gpu".into(),
            location: location(0, 1, 1),
        };
        let added = cluster.extend(vec![new.clone()]).expect("consistent");
        assert_eq!(added, vec![GpuIndex(2)]);
        assert_eq!(
            cluster.gpus_per_machine(),
            &BTreeMap::from([(0, 2), (1, 1)])
        );
        assert_eq!(cluster.machine_resources(0).cpus, Some(16.0));
        assert_eq!(cluster.index_of(&new.id), Some(GpuIndex(2)));
        for (index, gpu) in before.iter().enumerate() {
            assert_eq!(
                cluster.gpu(GpuIndex(index as u32)),
                gpu,
                "old GPUs keep their index"
            );
        }
        let snapshot = cluster.clone();
        let duplicate = cluster.extend(vec![new]);
        assert!(matches!(duplicate, Err(TopologyError::DuplicateGpu(_))));
        assert_eq!(cluster, snapshot, "a refused extension changes nothing");
        let empty = Cluster::new(Vec::new()).expect("empty");
        assert_eq!(empty.next_free_numbers(), location(0, 0, 0));
    }

    #[test]
    fn best_subset_prefers_best_fit_then_anchors() {
        // slot 0: 4 free GPUs, slot 1: 2 free GPUs, both on machine 0; slot 2: 2 on machine 1.
        let locations = vec![
            location(0, 0, 0),
            location(0, 0, 0),
            location(0, 0, 0),
            location(0, 0, 0),
            location(0, 0, 1),
            location(0, 0, 1),
            location(0, 1, 2),
            location(0, 1, 2),
        ];
        let index = PlacementIndex::new(locations);
        let pair = index.best_subset(2, &[]);
        assert_eq!(
            Locality::of(pair.iter().map(|&i| index.location(i))),
            Locality::SameSlot
        );
        assert_ne!(
            index.location(pair[0]).slot,
            0,
            "best fit keeps the 4-GPU slot whole"
        );
        let near_anchor = index.best_subset(2, &[location(0, 1, 2)]);
        assert_eq!(index.location(near_anchor[0]).slot, 2);
        let six = index.best_subset(6, &[]);
        assert_eq!(
            Locality::of(six.iter().map(|&i| index.location(i))),
            Locality::SameMachine
        );
        let all = index.best_subset(8, &[]);
        assert_eq!(all.len(), 8);
        assert!(index.best_subset(9, &[]).is_empty());
    }

    #[test]
    fn candidates_cover_every_level_that_fits() {
        let cluster = Cluster::from_spec(&ClusterSpec::uniform(2, 2, 2, 2)).expect("valid spec");
        let index = PlacementIndex::new(cluster.gpus().map(|(_, gpu)| gpu.location).collect());
        let subsets = index.candidate_subsets(2, &[], 2);
        let localities: Vec<Locality> = subsets
            .iter()
            .map(|subset| Locality::of(subset.iter().map(|&i| index.location(i))))
            .collect();
        assert_eq!(&localities[..2], &[Locality::SameSlot, Locality::SameSlot]);
        assert!(subsets.iter().all(|subset| subset.len() == 2));
        let across = index.candidate_subsets(10, &[], 2);
        assert_eq!(across.len(), 1);
        assert_eq!(
            Locality::of(across[0].iter().map(|&i| index.location(i))),
            Locality::CrossRack
        );
    }
}
