//! The simulator's cluster files: reading them (the format and its parsing are the engine's,
//! [`agora_market::cluster_file`]), the files shipped with this crate, and scaling a cluster
//! down for contention experiments.

use std::path::Path;

use agora_market::cluster_file::{parse_cluster, parse_cluster_spec, ClusterFileError};
use agora_market::shown::Shown;
use agora_market::topology::{Cluster, ClusterSpec, MachineSpec, RackSpec};

/// Reads and expands a cluster file, without building the cluster.
pub fn load_cluster_spec(path: impl AsRef<Path>) -> Result<ClusterSpec, ClusterFileError> {
    let path = path.as_ref();
    parse_cluster_spec(&read(path)?, path)
}

/// Loads a cluster file into the engine's [`Cluster`].
pub fn load_cluster(path: impl AsRef<Path>) -> Result<Cluster, ClusterFileError> {
    let path = path.as_ref();
    parse_cluster(&read(path)?, path)
}

fn read(path: &Path) -> Result<String, ClusterFileError> {
    std::fs::read_to_string(path).map_err(|source| ClusterFileError::Io {
        path: path.to_owned(),
        source,
    })
}

/// The cluster files shipped with the crate (`services/agora-sim/clusters/`).
pub mod shipped {
    use std::path::PathBuf;

    /// Themis's 64-GPU Azure testbed (§6.1).
    pub const THEMIS_TESTBED: &str = "themis-testbed.toml";
    /// Footnote 6's heterogeneous cluster as stated: 168 GPUs (not the 256 of the text).
    pub const THEMIS_SIM_168: &str = "themis-sim-168.toml";
    /// Footnote 6's machine mix scaled up to the 256 GPUs the text reports.
    pub const THEMIS_SIM_256: &str = "themis-sim-256.toml";
    /// Gavel's heterogeneous cluster: 36 K80, 36 P100 and 36 V100 GPUs.
    pub const GAVEL_108: &str = "gavel-108.toml";
    /// `THEMIS_SIM_256` with K80, P100 and V100 racks.
    pub const THEMIS_SIM_256_MIXED: &str = "themis-sim-256-mixed.toml";
    /// Synergy's 128 GPUs on 16 servers of 8 GPUs, 24 CPU cores and 500 GB (§5.1).
    pub const SYNERGY_128: &str = "synergy-128.toml";

    /// Path of a shipped cluster file in this source tree.
    pub fn path(file_name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("clusters")
            .join(file_name)
    }
}

/// Number of machines a spec describes.
pub fn machine_count(spec: &ClusterSpec) -> usize {
    spec.racks.iter().map(|rack| rack.machines.len()).sum()
}

/// A smaller cluster of the same make-up, for contention experiments (Themis Fig. 14: the same
/// workload on 1/2 and 1/4 of the cluster): keeps `round(fraction x machines)` machines (at
/// least one), shared out over the groups of identical machines of each rack in proportion to
/// their sizes (largest remainders first, earlier groups on ties), so every rack and machine
/// kind shrinks alike. The first machines of each group are kept; racks left empty vanish.
/// The machine count is exact; the GPU count is close to `fraction` of the original.
pub fn scale_cluster(spec: &ClusterSpec, fraction: f64) -> Result<ClusterSpec, InvalidScale> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(InvalidScale(fraction));
    }
    // Groups: runs of identical machines inside a rack, in file order.
    let mut groups: Vec<(usize, &MachineSpec, usize)> = Vec::new();
    for (rack_number, rack) in spec.racks.iter().enumerate() {
        for machine in &rack.machines {
            match groups.last_mut() {
                Some((rack, kind, size)) if *rack == rack_number && *kind == machine => *size += 1,
                _ => groups.push((rack_number, machine, 1)),
            }
        }
    }
    let total = machine_count(spec);
    let target = ((total as f64 * fraction).round() as usize).clamp(1, total);
    let quotas: Vec<f64> = groups
        .iter()
        .map(|&(_, _, size)| size as f64 * target as f64 / total as f64)
        .collect();
    let mut kept: Vec<usize> = quotas.iter().map(|quota| quota.floor() as usize).collect();
    let mut by_remainder: Vec<usize> = (0..groups.len()).collect();
    by_remainder.sort_by(|&a, &b| {
        let remainder = |i: usize| quotas[i] - quotas[i].floor();
        remainder(b).total_cmp(&remainder(a)).then(a.cmp(&b))
    });
    let short = target - kept.iter().sum::<usize>();
    for &group in by_remainder.iter().take(short) {
        kept[group] += 1;
    }
    let mut racks: Vec<RackSpec> = Vec::new();
    let mut current_rack = None;
    for (&(rack_number, machine, _), &keep) in groups.iter().zip(&kept) {
        if keep == 0 {
            continue;
        }
        if current_rack != Some(rack_number) {
            racks.push(RackSpec {
                machines: Vec::new(),
            });
            current_rack = Some(rack_number);
        }
        if let Some(rack) = racks.last_mut() {
            rack.machines
                .extend(std::iter::repeat_n(machine.clone(), keep));
        }
    }
    Ok(ClusterSpec { racks })
}

/// A cluster scale fraction outside (0, 1].
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("cluster scale fraction must be in (0, 1], got {}", Shown(*.0))]
pub struct InvalidScale(pub f64);
