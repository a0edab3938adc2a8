//! Cluster spec files: clusters in TOML (the simulator's, and the service's simulated fleet),
//! expanded into [`ClusterSpec`] and built with [`Cluster::from_spec`]. Parsing only: the
//! callers read the files.
//!
//! The file format is `ClusterSpec`'s own shape with two shorthands so that a file need not
//! repeat identical machines (`docs/simulator-inputs.md` has the full description):
//!
//! ```toml
//! [[racks]]
//! count = 2                 # optional: this rack, twice (default 1)
//! [[racks.machines]]
//! count = 8                 # optional: this machine, 8 times in the rack (default 1)
//! slots = 4                 # 4 identical slots ...
//! gpus_per_slot = 2         # ... of 2 GPUs ...
//! gpu_type = "V100"         # ... of this type
//! [[racks.machines]]
//! slots = [{ gpus = 2, gpu_type = "K80" }, { gpus = 1, gpu_type = "P100" }]  # or a list
//! cpus = 24                 # optional: CPU cores (absent: CPUs are not modelled)
//! memory_gib = 500          # optional: memory in GiB (absent: not modelled)
//! ```
//!
//! The engine's plain form is a valid file too:
//! `racks = [{ machines = [{ slots = [{ gpus = 2, gpu_type = "K80" }] }] }]`.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::shown::Shown;
use crate::topology::{Cluster, ClusterSpec, MachineSpec, RackSpec, SlotSpec, TopologyError};
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// Why a cluster file could not be loaded. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ClusterFileError {
    #[error("cannot read cluster file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Malformed TOML or a field of the wrong type or name; `message` gives line and column.
    #[error("invalid cluster file {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    /// Well-formed, but describes no usable cluster (a zero count, an empty type, no GPUs).
    #[error("invalid cluster file {}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("invalid cluster in {}: {source}", path.display())]
    Topology {
        path: PathBuf,
        #[source]
        source: TopologyError,
    },
}

/// A cluster file as written (with counts), before expansion.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    pub racks: Vec<RackEntry>,
}

/// One rack, or `count` identical racks.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RackEntry {
    #[serde(default = "one")]
    pub count: u32,
    pub machines: Vec<MachineEntry>,
}

/// One machine, or `count` identical machines in the same rack. `slots` is either a list of
/// slots or a number of identical slots of `gpus_per_slot` GPUs of `gpu_type`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineEntry {
    #[serde(default = "one")]
    pub count: u32,
    pub slots: SlotsEntry,
    #[serde(default)]
    pub gpus_per_slot: Option<u32>,
    #[serde(default)]
    pub gpu_type: Option<String>,
    /// CPU cores of the machine; absent: not modelled.
    #[serde(default)]
    pub cpus: Option<u32>,
    /// Memory of the machine in GiB; absent: not modelled.
    #[serde(default)]
    pub memory_gib: Option<f64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SlotsEntry {
    /// That many identical slots (`gpus_per_slot` and `gpu_type` say what is in each).
    Count(u32),
    List(Vec<SlotEntry>),
}

/// One slot, or `count` identical slots; `gpus` GPUs of `gpu_type` share it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotEntry {
    #[serde(default = "one")]
    pub count: u32,
    pub gpus: u32,
    pub gpu_type: String,
}

fn one() -> u32 {
    1
}

impl<'de> Deserialize<'de> for SlotsEntry {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SlotsVisitor;

        impl<'de> Visitor<'de> for SlotsVisitor {
            type Value = SlotsEntry;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a number of slots or a list of slots")
            }

            fn visit_i64<E: de::Error>(self, value: i64) -> Result<SlotsEntry, E> {
                u32::try_from(value).map(SlotsEntry::Count).map_err(|_| {
                    E::invalid_value(de::Unexpected::Signed(value), &"a slot count >= 0")
                })
            }

            fn visit_u64<E: de::Error>(self, value: u64) -> Result<SlotsEntry, E> {
                u32::try_from(value)
                    .map(SlotsEntry::Count)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(value), &"a slot count"))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SlotsEntry, A::Error> {
                let mut slots = Vec::new();
                while let Some(slot) = seq.next_element::<SlotEntry>()? {
                    slots.push(slot);
                }
                Ok(SlotsEntry::List(slots))
            }
        }

        deserializer.deserialize_any(SlotsVisitor)
    }
}

impl ClusterFile {
    /// Parses a cluster file's text; `path` is only used to name the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ClusterFileError> {
        toml::from_str(text).map_err(|error| ClusterFileError::Parse {
            path: path.to_owned(),
            message: error.to_string().trim_end().to_owned(),
        })
    }

    /// Expands the counts into the engine's nested description, checking every count, GPU
    /// number and type.
    pub fn to_spec(&self, path: &Path) -> Result<ClusterSpec, ClusterFileError> {
        let invalid = |reason: String| ClusterFileError::Invalid {
            path: path.to_owned(),
            reason,
        };
        let mut racks = Vec::new();
        for (rack_number, rack) in self.racks.iter().enumerate() {
            let rack_name = format!("racks[{rack_number}]");
            if rack.count == 0 {
                return Err(invalid(format!("{rack_name}: count must be at least 1")));
            }
            let mut machines = Vec::new();
            for (machine_number, machine) in rack.machines.iter().enumerate() {
                let name = format!("{rack_name}.machines[{machine_number}]");
                let spec = machine.to_spec(&name).map_err(&invalid)?;
                machines.extend(std::iter::repeat_n(spec, machine.count as usize));
            }
            if machines.is_empty() {
                return Err(invalid(format!("{rack_name} has no machines")));
            }
            racks.extend(std::iter::repeat_n(
                RackSpec { machines },
                rack.count as usize,
            ));
        }
        let spec = ClusterSpec { racks };
        if gpu_count(&spec) == 0 {
            return Err(invalid("the cluster has no GPUs".to_owned()));
        }
        Ok(spec)
    }
}

impl MachineEntry {
    fn to_spec(&self, name: &str) -> Result<MachineSpec, String> {
        if self.count == 0 {
            return Err(format!("{name}: count must be at least 1"));
        }
        let slot = |gpus: u32, gpu_type: &str, slot_name: &str| -> Result<SlotSpec, String> {
            if gpus == 0 {
                return Err(format!("{slot_name}: a slot needs at least 1 GPU"));
            }
            if gpu_type.trim().is_empty() {
                return Err(format!("{slot_name}: gpu_type must not be empty"));
            }
            Ok(SlotSpec {
                gpus,
                gpu_type: gpu_type.to_owned(),
            })
        };
        let slots = match &self.slots {
            SlotsEntry::Count(count) => {
                let (Some(gpus), Some(gpu_type)) = (self.gpus_per_slot, self.gpu_type.as_deref())
                else {
                    return Err(format!(
                        "{name}: `slots = {count}` needs `gpus_per_slot` and `gpu_type`"
                    ));
                };
                if *count == 0 {
                    return Err(format!("{name}: a machine needs at least 1 slot"));
                }
                vec![slot(gpus, gpu_type, name)?; *count as usize]
            }
            SlotsEntry::List(list) => {
                if self.gpus_per_slot.is_some() || self.gpu_type.is_some() {
                    return Err(format!(
                        "{name}: `gpus_per_slot` and `gpu_type` go with a slot count, not a slot list"
                    ));
                }
                let mut slots = Vec::new();
                for (number, entry) in list.iter().enumerate() {
                    let slot_name = format!("{name}.slots[{number}]");
                    if entry.count == 0 {
                        return Err(format!("{slot_name}: count must be at least 1"));
                    }
                    let spec = slot(entry.gpus, &entry.gpu_type, &slot_name)?;
                    slots.extend(std::iter::repeat_n(spec, entry.count as usize));
                }
                if slots.is_empty() {
                    return Err(format!("{name}: a machine needs at least 1 slot"));
                }
                slots
            }
        };
        if self.cpus == Some(0) {
            return Err(format!("{name}.cpus must be at least 1, got 0"));
        }
        if let Some(memory) = self
            .memory_gib
            .filter(|memory| !(memory.is_finite() && *memory > 0.0))
        {
            return Err(format!(
                "{name}.memory_gib must be a finite number of GiB > 0, got {}",
                Shown(memory)
            ));
        }
        Ok(MachineSpec {
            slots,
            cpus: self.cpus,
            memory_gib: self.memory_gib,
        })
    }
}

/// Parses and expands a cluster file's text; `path` names it in errors.
pub fn parse_cluster_spec(text: &str, path: &Path) -> Result<ClusterSpec, ClusterFileError> {
    ClusterFile::parse(text, path)?.to_spec(path)
}

/// Parses a cluster file's text and builds the engine's [`Cluster`]; `path` names it in errors.
pub fn parse_cluster(text: &str, path: &Path) -> Result<Cluster, ClusterFileError> {
    let spec = parse_cluster_spec(text, path)?;
    Cluster::from_spec(&spec).map_err(|source| ClusterFileError::Topology {
        path: path.to_owned(),
        source,
    })
}

/// Number of GPUs a spec describes.
pub fn gpu_count(spec: &ClusterSpec) -> u32 {
    spec.racks
        .iter()
        .flat_map(|rack| &rack.machines)
        .flat_map(|machine| &machine.slots)
        .map(|slot| slot.gpus)
        .sum()
}
