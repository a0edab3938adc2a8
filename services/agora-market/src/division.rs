//! The division of the machines' CPUs and memory after a round, as the round records it: every
//! divided machine with its holders and their profiles, and every active lease's GPUs per
//! machine. Enough to divide again from the record alone and recompute what each lease was
//! given, which is what `agora audit replay` checks against the stored `lease_resources`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::app::AppId;
use crate::lease::LeaseId;
use crate::resources::{
    total, MachineResources, MachineTenants, ResourceAllocation, ResourceSplit, Sensitivity,
};

/// The division after a round ([`crate::market::Market::division_record`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DivisionRecord {
    pub allocation: ResourceAllocation,
    /// Every machine divided, or holding a lease's GPUs, by number.
    pub machines: Vec<RecordedMachine>,
    /// Every active lease.
    pub leases: Vec<RecordedLease>,
}

/// A machine as it was divided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedMachine {
    pub machine: u32,
    pub resources: MachineResources,
    /// All its GPUs, held or not.
    pub gpus: u32,
    /// Who held how many of its GPUs, in the order divided (the last tie-break between equal
    /// profiles); empty for a machine no division covered.
    pub holders: Vec<Holder>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub app: AppId,
    pub gpus: u32,
    pub sensitivity: Sensitivity,
}

/// A lease and how many of its GPUs each machine has.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedLease {
    pub lease: LeaseId,
    pub app: AppId,
    pub gpus_on: BTreeMap<u32, u32>,
}

impl DivisionRecord {
    /// Divides the recorded machines again and gives each lease its CPUs and memory, summed
    /// over its machines, as the service does ([`crate::market::Market::lease_resources`]).
    /// Leases on machines that model neither resource are left out: they have no amounts.
    pub fn lease_resources(&self) -> Vec<(LeaseId, MachineResources)> {
        let machines: BTreeMap<u32, MachineTenants<AppId>> = self
            .machines
            .iter()
            .map(|machine| {
                let tenants = machine
                    .holders
                    .iter()
                    .map(|holder| (holder.app.clone(), holder.gpus, &holder.sensitivity))
                    .collect();
                let divided = MachineTenants {
                    resources: machine.resources,
                    gpus: machine.gpus,
                    tenants,
                };
                (machine.machine, divided)
            })
            .collect();
        let split = ResourceSplit::divide(machines, self.allocation, &ResourceSplit::default());
        let machine = |number: u32| {
            self.machines
                .iter()
                .find(|machine| machine.machine == number)
                .map_or((MachineResources::default(), 1), |machine| {
                    (machine.resources, machine.gpus)
                })
        };
        self.leases
            .iter()
            .filter_map(|lease| {
                let amounts = total(&split.parts_for(&lease.app, &lease.gpus_on, machine));
                (!amounts.is_unmodelled()).then_some((lease.lease, amounts))
            })
            .collect()
    }
}
