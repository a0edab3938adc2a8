//! Heterogeneous GPUs: how fast an app runs on each GPU type.
//!
//! An app may declare a [`Throughput`] table, its speed on each GPU type relative to the speed
//! its serial iteration times were measured at (1.0). An app without a table runs at 1.0 on
//! every type, which is the engine's behaviour on clusters of one type. [`GpuSpeeds`] resolves
//! a table against a cluster: the app's speed on each GPU, which the job model
//! ([`crate::fairness`]) divides its iteration times by.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::shown::Shown;
use crate::topology::{Cluster, GpuLocation};

/// An app's relative speed per GPU type (by the cluster's `gpu_type` names): 1.0 is the speed
/// its `serial_iteration_time`s were measured at, 2.0 twice as fast. Empty: the same speed on
/// every type.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Throughput(pub BTreeMap<String, f64>);

impl Throughput {
    /// Whether the table says nothing: every type runs at speed 1.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every speed finite and positive, naming the first one that is not.
    pub fn validate(&self) -> Result<(), String> {
        match self
            .0
            .iter()
            .find(|(_, &speed)| !(speed.is_finite() && speed > 0.0))
        {
            Some((gpu_type, speed)) => Err(format!(
                "throughput.{gpu_type} must be a finite speed > 0, got {}",
                Shown(*speed)
            )),
            None => Ok(()),
        }
    }

    /// A table that says anything must give a speed for every GPU type of `cluster`.
    pub fn check_covers(&self, cluster: &Cluster) -> Result<(), String> {
        self.check_covers_types(&gpu_types(cluster))
    }

    /// A table that says anything must give a speed for every one of `types` (sorted).
    pub fn check_covers_types(&self, types: &[&str]) -> Result<(), String> {
        if self.is_empty() {
            return Ok(());
        }
        match types
            .iter()
            .find(|gpu_type| !self.0.contains_key(**gpu_type))
        {
            Some(missing) => Err(format!(
                "throughput has no speed for GPU type `{missing}`, which the cluster has; give \
                 one for every type ({})",
                types.join(", ")
            )),
            None => Ok(()),
        }
    }

    /// The speed on `gpu_type`. A type the table does not list (a host of a new type joined
    /// after the app registered) counts at the table's lowest speed: the estimate errs towards
    /// a later finish, never an earlier one.
    pub fn speed_on(&self, gpu_type: &str) -> f64 {
        self.0
            .get(gpu_type)
            .copied()
            .unwrap_or_else(|| self.0.values().copied().reduce(f64::min).unwrap_or(1.0))
    }
}

/// A framework's measurement: the app runs at `speed` on GPUs of type `gpu_type`, in the
/// table's unit (1.0 is the speed its `serial_iteration_time`s were measured at).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(example = json!({"gpu_type": "v100", "speed": 3.9})))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThroughputReport {
    pub gpu_type: String,
    pub speed: f64,
}

/// A measurement the table cannot take.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ThroughputReportError {
    #[error("gpu_type: the cluster has no GPU of type `{gpu_type}`; its types are {known}")]
    UnknownType { gpu_type: String, known: String },
    #[error("speed must be a finite speed > 0, got {}", Shown(*.0))]
    InvalidSpeed(f64),
}

impl Throughput {
    /// The table after `report` on `cluster`. The measured speed replaces the type's entry, as
    /// an observed iteration time replaces a placement slowdown (`progress.rs`): the app's own
    /// measurement on this hardware beats a published table for a similar model, and the next
    /// report corrects a noisy one. Every other type keeps the speed it had: the cluster's
    /// types the table did not list are written in at their current speed first (1.0 for an
    /// empty table, else the table's lowest), so the report does not move them.
    pub fn reported(
        &self,
        report: &ThroughputReport,
        cluster: &Cluster,
    ) -> Result<Self, ThroughputReportError> {
        let types = gpu_types(cluster);
        if !types.contains(&report.gpu_type.as_str()) {
            return Err(ThroughputReportError::UnknownType {
                gpu_type: report.gpu_type.clone(),
                known: types.join(", "),
            });
        }
        if !(report.speed.is_finite() && report.speed > 0.0) {
            return Err(ThroughputReportError::InvalidSpeed(report.speed));
        }
        let mut table = self.0.clone();
        for gpu_type in types {
            table
                .entry(gpu_type.to_owned())
                .or_insert_with(|| self.speed_on(gpu_type));
        }
        table.insert(report.gpu_type.clone(), report.speed);
        Ok(Self(table))
    }
}

/// The rho of a bundle whose slowest GPU runs the app at `speed`, from its rho at speed 1:
/// the part already spent, `spent` = (now - arrival) / T_id, stays; the rest is remaining time
/// over T_id, which the job model divides by the speed of the bundle's slowest GPU.
pub fn rho_at_speed(rho_at_unit_speed: f64, spent: f64, speed: f64) -> f64 {
    spent + (rho_at_unit_speed - spent) / speed
}

/// The distinct GPU types of `cluster`, sorted.
pub fn gpu_types(cluster: &Cluster) -> Vec<&str> {
    let mut types: Vec<&str> = cluster
        .gpus()
        .map(|(_, gpu)| gpu.gpu_type.as_str())
        .collect();
    types.sort_unstable();
    types.dedup();
    types
}

/// One app's speed on each GPU of a cluster, by slot (a slot holding GPUs of several types
/// counts at the slowest of them, since a job spread over it waits for its slowest GPU).
/// Uniform (1.0 everywhere) when the app has no table.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuSpeeds {
    by_slot: Option<Arc<[f64]>>,
}

impl GpuSpeeds {
    /// Speed 1 on every GPU.
    pub const UNIFORM: Self = Self { by_slot: None };

    /// The speeds of an app with `throughput` on `cluster`.
    pub fn of(throughput: &Throughput, cluster: &Cluster) -> Self {
        if throughput.is_empty() {
            return Self::UNIFORM;
        }
        let mut by_slot = unset_slots(cluster);
        for (_, gpu) in cluster.gpus() {
            let slot = &mut by_slot[gpu.location.slot as usize];
            *slot = slot.min(throughput.speed_on(&gpu.gpu_type));
        }
        Self {
            by_slot: Some(by_slot.into()),
        }
    }

    /// These speeds, each multiplied by `factor` of its GPU's machine (the speed an app's CPU
    /// and memory there give it, [`crate::resources`]).
    pub fn scaled_per_machine(&self, cluster: &Cluster, factor: impl Fn(u32) -> f64) -> Self {
        let mut by_slot = unset_slots(cluster);
        let mut factors = BTreeMap::new();
        for (_, gpu) in cluster.gpus() {
            let location = gpu.location;
            let machine_factor = *factors
                .entry(location.machine)
                .or_insert_with(|| factor(location.machine));
            let slot = &mut by_slot[location.slot as usize];
            *slot = slot.min(self.at(location) * machine_factor);
        }
        Self {
            by_slot: Some(by_slot.into()),
        }
    }

    /// How many of the `held` GPUs run slower than the fastest of `offered`: those an app
    /// whose demand is met could still trade up (0 on one type, or with no table).
    pub fn slower_than_best_of(
        &self,
        held: &[GpuLocation],
        offered: impl IntoIterator<Item = GpuLocation>,
    ) -> usize {
        let fastest = offered
            .into_iter()
            .map(|location| self.at(location))
            .fold(f64::NEG_INFINITY, f64::max);
        held.iter()
            .filter(|&&location| self.at(location) < fastest)
            .count()
    }

    /// Whether every GPU runs the app at 1.0 (it has no table).
    pub fn is_uniform(&self) -> bool {
        self.by_slot.is_none()
    }

    /// The speed on the GPU at `location` (1.0 outside the cluster).
    pub fn at(&self, location: GpuLocation) -> f64 {
        self.by_slot
            .as_ref()
            .and_then(|speeds| speeds.get(location.slot as usize))
            .copied()
            .filter(|speed| speed.is_finite())
            .unwrap_or(1.0)
    }

    /// The slowest speed among `gpus` (1.0 for none): a data-parallel job's iterations wait
    /// for its slowest GPU.
    pub fn slowest(&self, gpus: impl IntoIterator<Item = GpuLocation>) -> f64 {
        gpus.into_iter()
            .map(|location| self.at(location))
            .reduce(f64::min)
            .unwrap_or(1.0)
    }

    /// A location on the fastest slot (slot 0 when uniform): where an ideally placed bundle
    /// sits.
    pub fn fastest_location(&self) -> GpuLocation {
        let slot = self.by_slot.as_ref().map_or(0, |speeds| {
            speeds
                .iter()
                .enumerate()
                .filter(|(_, speed)| speed.is_finite())
                .fold(
                    None,
                    |best: Option<(usize, f64)>, (slot, &speed)| match best {
                        Some((_, fastest)) if fastest >= speed => best,
                        _ => Some((slot, speed)),
                    },
                )
                .map_or(0, |(slot, _)| slot as u32)
        });
        GpuLocation {
            rack: 0,
            machine: 0,
            slot,
        }
    }

    /// Orders `gpus` fastest first, then in topology order (only topology order when uniform).
    pub fn sort_fastest_first(&self, gpus: &mut [GpuLocation]) {
        gpus.sort_by(|a, b| self.at(*b).total_cmp(&self.at(*a)).then(a.cmp(b)));
    }
}

/// One speed per slot of `cluster`, each unset (infinite) until a GPU of the slot lowers it.
fn unset_slots(cluster: &Cluster) -> Vec<f64> {
    let slots = cluster
        .gpus()
        .map(|(_, gpu)| gpu.location.slot as usize + 1)
        .max()
        .unwrap_or(0);
    vec![f64::INFINITY; slots]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{Gpu, GpuId};

    fn typed_cluster() -> Cluster {
        let gpu = |id: &str, gpu_type: &str, slot| Gpu {
            id: GpuId::from(id),
            gpu_type: gpu_type.to_owned(),
            location: GpuLocation {
                rack: 0,
                machine: slot,
                slot,
            },
        };
        Cluster::new(vec![gpu("a", "k80", 0), gpu("b", "v100", 1)]).expect("valid")
    }

    fn table(entries: &[(&str, f64)]) -> Throughput {
        Throughput(
            entries
                .iter()
                .map(|&(gpu_type, speed)| (gpu_type.to_owned(), speed))
                .collect(),
        )
    }

    #[test]
    fn bad_speeds_are_errors_naming_the_type() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let error = table(&[("k80", 1.0), ("v100", bad)])
                .validate()
                .expect_err("not a speed");
            assert!(error.starts_with("throughput.v100 must be"), "{error}");
        }
        assert_eq!(table(&[("k80", 0.5)]).validate(), Ok(()));
    }

    #[test]
    fn a_table_missing_a_type_of_the_cluster_is_an_error() {
        let error = table(&[("k80", 1.0)])
            .check_covers(&typed_cluster())
            .expect_err("no v100");
        assert!(error.contains("`v100`"), "{error}");
        assert_eq!(Throughput::default().check_covers(&typed_cluster()), Ok(()));
    }

    fn report(gpu_type: &str, speed: f64) -> ThroughputReport {
        ThroughputReport {
            gpu_type: gpu_type.to_owned(),
            speed,
        }
    }

    #[test]
    fn a_report_replaces_its_type_and_leaves_the_others() {
        let table = table(&[("k80", 1.0), ("v100", 4.0)]);
        let updated = table
            .reported(&report("v100", 3.5), &typed_cluster())
            .expect("valid");
        assert_eq!(updated, self::table(&[("k80", 1.0), ("v100", 3.5)]));
        let again = updated
            .reported(&report("v100", 3.8), &typed_cluster())
            .expect("valid");
        assert_eq!(again.speed_on("v100"), 3.8, "the latest measurement counts");
    }

    #[test]
    fn a_report_on_an_empty_table_keeps_the_other_types_at_one() {
        let updated = Throughput::default()
            .reported(&report("v100", 2.5), &typed_cluster())
            .expect("valid");
        assert_eq!(updated, table(&[("k80", 1.0), ("v100", 2.5)]));
    }

    #[test]
    fn a_report_writes_in_unlisted_types_at_their_speed_before_it() {
        // The k80 was missing (it joined after the app registered) and counted at the lowest
        // speed, 2.0; a slower v100 measurement must not drag it down.
        let updated = table(&[("v100", 2.0)])
            .reported(&report("v100", 0.5), &typed_cluster())
            .expect("valid");
        assert_eq!(updated, table(&[("k80", 2.0), ("v100", 0.5)]));
    }

    #[test]
    fn bad_reports_are_errors_naming_the_field() {
        let cluster = typed_cluster();
        let unknown = Throughput::default()
            .reported(&report("h100", 2.0), &cluster)
            .expect_err("no h100 in the cluster");
        assert_eq!(
            unknown.to_string(),
            "gpu_type: the cluster has no GPU of type `h100`; its types are k80, v100"
        );
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let error = Throughput::default()
                .reported(&report("k80", bad), &cluster)
                .expect_err("not a speed");
            assert!(error.to_string().starts_with("speed must be"), "{error}");
        }
    }

    #[test]
    fn speeds_resolve_per_slot_and_default_to_one() {
        let speeds = GpuSpeeds::of(&table(&[("k80", 0.25), ("v100", 1.0)]), &typed_cluster());
        let slot = |slot| GpuLocation {
            rack: 0,
            machine: slot,
            slot,
        };
        assert_eq!(speeds.at(slot(0)), 0.25);
        assert_eq!(speeds.at(slot(1)), 1.0);
        assert_eq!(speeds.slowest([slot(0), slot(1)]), 0.25);
        assert_eq!(speeds.fastest_location().slot, 1);
        assert_eq!(GpuSpeeds::UNIFORM.at(slot(0)), 1.0);
        assert_eq!(table(&[("k80", 0.25)]).speed_on("a100"), 0.25);
    }

    #[test]
    fn a_bundle_speeds_up_only_the_remaining_part_of_rho() {
        // The engine's worked example (docs/mechanism.md): A's rho on one K80 (speed 1) is
        // 8/3 at t = 0, and 2/3 on one V100 (speed 4).
        assert!((rho_at_speed(8.0 / 3.0, 0.0, 4.0) - 2.0 / 3.0).abs() < 1e-15);
        // Half its time already spent: only the other half runs 4x faster.
        assert_eq!(rho_at_speed(2.0, 1.0, 4.0), 1.25);
        assert_eq!(rho_at_speed(2.0, 1.0, 1.0), 2.0);
    }
}
