//! CPU cores and memory beyond GPUs (Synergy, Mohan et al., OSDI'22).
//!
//! A machine may say how many CPU cores and GiB of memory it has ([`MachineResources`], from
//! cluster files); a resource a machine does not give is not modelled there, and nothing here
//! changes anything. An app may declare a [`Sensitivity`] profile: its relative speed as a
//! function of the CPU cores and of the memory it gets per GPU, two small tables linearly
//! interpolated. Data loading is a pipeline, so the slower of the two sets the pace: the speed
//! is the minimum of the two curves.
//!
//! The auction leases GPUs only. After each round, every machine's CPUs and memory are divided
//! among the apps holding its GPUs ([`split_machine`]): in proportion to their GPUs, or by
//! sensitivity, as a mixed-integer program in HiGHS that maximises the GPU-weighted speed of
//! the machine's apps and keeps every app at least at the speed its GPU-proportional share
//! gives it (Synergy's guarantee, §4.1 Eq. 5). `docs/mechanism.md` has the design.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::num::NonZeroU32;

use highs::{Col, HighsModelStatus, RowProblem, Sense};
use serde::{Deserialize, Serialize};

use crate::shown::Shown;

/// What a machine has besides GPUs; `None`: not modelled on that machine.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct MachineResources {
    pub cpus: Option<f64>,
    pub memory_gib: Option<f64>,
}

impl MachineResources {
    /// Whether the machine models neither resource.
    pub fn is_unmodelled(&self) -> bool {
        self.cpus.is_none() && self.memory_gib.is_none()
    }

    /// One GPU's GPU-proportional share of this machine of `machine_gpus` GPUs.
    pub fn per_gpu(&self, machine_gpus: u32) -> MachineResources {
        proportional_share(self, machine_gpus, 1)
    }

    fn amount(&self, resource: Resource) -> Option<f64> {
        match resource {
            Resource::Cpus => self.cpus,
            Resource::Memory => self.memory_gib,
        }
    }
}

/// How the CPUs and memory of a machine are divided among the apps holding its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResourceAllocation {
    /// By sensitivity (Synergy): the most GPU-weighted speed, nobody below their
    /// GPU-proportional speed.
    #[default]
    SensitivityAware,
    /// In proportion to GPUs: each app gets its GPUs' fraction of the machine.
    GpuProportional,
}

impl ResourceAllocation {
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resource {
    Cpus,
    Memory,
}

const RESOURCES: [Resource; 2] = [Resource::Cpus, Resource::Memory];

/// An app's relative speed by the CPU cores and by the GiB of memory it gets per GPU, as
/// `[amount, speed]` points with increasing amounts and non-decreasing speeds (1.0 is the
/// speed its serial iteration times were measured at). Between points the speed is linear;
/// above the last point it stays at the last speed; below the first point it falls linearly
/// to 0 at 0 (a job without CPUs or memory makes no progress) unless the first point is at 0.
/// An empty table: the app does not depend on that resource.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sensitivity {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpus_per_gpu: Vec<[f64; 2]>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memory_gib_per_gpu: Vec<[f64; 2]>,
}

impl Sensitivity {
    /// Whether the profile says nothing: the app keeps its GPU-proportional share.
    pub fn is_empty(&self) -> bool {
        self.cpus_per_gpu.is_empty() && self.memory_gib_per_gpu.is_empty()
    }

    fn points(&self, resource: Resource) -> &[[f64; 2]] {
        match resource {
            Resource::Cpus => &self.cpus_per_gpu,
            Resource::Memory => &self.memory_gib_per_gpu,
        }
    }

    fn field(resource: Resource) -> &'static str {
        match resource {
            Resource::Cpus => "sensitivity.cpus_per_gpu",
            Resource::Memory => "sensitivity.memory_gib_per_gpu",
        }
    }

    /// Every amount finite and >= 0 and increasing, every speed finite and > 0 and
    /// non-decreasing; the error names the first point that is not.
    pub fn validate(&self) -> Result<(), String> {
        for resource in RESOURCES {
            let field = Self::field(resource);
            let mut previous: Option<[f64; 2]> = None;
            for (index, &[amount, speed]) in self.points(resource).iter().enumerate() {
                if !(amount.is_finite() && amount >= 0.0) {
                    return Err(format!(
                        "{field}[{index}]: the amount must be a finite number >= 0, got {}",
                        Shown(amount)
                    ));
                }
                if !(speed.is_finite() && speed > 0.0) {
                    return Err(format!(
                        "{field}[{index}]: the speed must be a finite number > 0, got {}",
                        Shown(speed)
                    ));
                }
                if let Some([last_amount, last_speed]) = previous {
                    if amount <= last_amount {
                        return Err(format!(
                            "{field}[{index}]: amounts must increase, got {} after {}",
                            Shown(amount),
                            Shown(last_amount)
                        ));
                    }
                    if speed < last_speed {
                        return Err(format!(
                            "{field}[{index}]: speeds must not decrease (more of a resource \
                             never slows a job), got {} after {}",
                            Shown(speed),
                            Shown(last_speed)
                        ));
                    }
                }
                previous = Some([amount, speed]);
            }
        }
        Ok(())
    }

    /// Every point must fit one GPU's job on some machine: an amount per GPU above what the
    /// largest machine has (`largest`) can never be given. Resources no machine models are not
    /// checked.
    pub fn check_fits(&self, largest: &MachineResources) -> Result<(), String> {
        for resource in RESOURCES {
            let Some(most) = largest.amount(resource) else {
                continue;
            };
            let points = self.points(resource);
            if let Some((index, [amount, _])) = points
                .iter()
                .enumerate()
                .find(|(_, [amount, _])| *amount > most)
            {
                return Err(format!(
                    "{}[{index}]: {} per GPU is more than any machine has ({})",
                    Self::field(resource),
                    Shown(*amount),
                    Shown(most)
                ));
            }
        }
        Ok(())
    }

    fn curve(&self, resource: Resource) -> Option<Curve> {
        let points = self.points(resource);
        (!points.is_empty()).then(|| Curve::new(points))
    }

    /// The speed with `cpus_per_gpu` and `memory_gib_per_gpu` (`None`: not modelled): the
    /// slower of the two curves; 1.0 when neither applies.
    pub fn speed_with(&self, cpus_per_gpu: Option<f64>, memory_gib_per_gpu: Option<f64>) -> f64 {
        [
            (Resource::Cpus, cpus_per_gpu),
            (Resource::Memory, memory_gib_per_gpu),
        ]
        .into_iter()
        .filter_map(|(resource, amount)| Some(self.curve(resource)?.at(amount?)))
        .reduce(f64::min)
        .unwrap_or(1.0)
    }

    /// The speed with the GPU-proportional share of `machine` (of `machine_gpus` GPUs).
    pub fn proportional_speed(&self, machine: &MachineResources, machine_gpus: u32) -> f64 {
        let per_gpu = proportional_share(machine, machine_gpus, 1);
        self.speed_with(per_gpu.cpus, per_gpu.memory_gib)
    }

    /// Synergy's best-case demand per GPU on `machine` (of `machine_gpus` GPUs, §3.1): of each
    /// resource the machine models, the least amount at which the profile reaches its best
    /// speed there (the slower curve's last speed); a resource without a curve, its
    /// GPU-proportional amount, which is what the split gives it.
    pub fn demand_per_gpu(
        &self,
        machine: &MachineResources,
        machine_gpus: u32,
    ) -> MachineResources {
        let proportional = proportional_share(machine, machine_gpus, 1);
        let curves: Vec<(Resource, Curve)> = RESOURCES
            .into_iter()
            .filter(|&resource| machine.amount(resource).is_some())
            .filter_map(|resource| Some((resource, self.curve(resource)?)))
            .collect();
        let best = curves
            .iter()
            .map(|(_, curve)| curve.best_speed())
            .fold(f64::INFINITY, f64::min);
        let mut demand = proportional;
        for (resource, curve) in &curves {
            let least = Some(curve.least_amount_for(best));
            match resource {
                Resource::Cpus => demand.cpus = least,
                Resource::Memory => demand.memory_gib = least,
            }
        }
        demand
    }

    /// Orders profiles by their numbers: the tie-break between apps sharing a machine.
    pub fn cmp_content(&self, other: &Self) -> Ordering {
        let numbers = |profile: &Self| -> Vec<f64> {
            RESOURCES
                .iter()
                .flat_map(|&resource| {
                    let points = profile.points(resource);
                    std::iter::once(points.len() as f64).chain(points.iter().flatten().copied())
                })
                .collect()
        };
        let (mine, theirs) = (numbers(self), numbers(other));
        mine.iter()
            .zip(&theirs)
            .map(|(a, b)| a.total_cmp(b))
            .find(|order| order.is_ne())
            .unwrap_or_else(|| mine.len().cmp(&theirs.len()))
    }

    /// Every number of the profile, for [`crate::app::App::cmp_content`].
    pub fn content_numbers(&self) -> impl Iterator<Item = f64> + '_ {
        RESOURCES
            .iter()
            .flat_map(|&resource| self.points(resource).iter().flatten().copied())
    }
}

/// A profile's curve for one resource, with (0, 0) added in front unless it starts at 0.
#[derive(Debug, Clone, PartialEq)]
struct Curve(Vec<(f64, f64)>);

impl Curve {
    fn new(points: &[[f64; 2]]) -> Self {
        let mut curve = Vec::with_capacity(points.len() + 1);
        if points.first().is_some_and(|&[amount, _]| amount > 0.0) {
            curve.push((0.0, 0.0));
        }
        curve.extend(points.iter().map(|&[amount, speed]| (amount, speed)));
        Self(curve)
    }

    fn at(&self, amount: f64) -> f64 {
        let points = &self.0;
        let last = points[points.len() - 1];
        if amount >= last.0 {
            return last.1;
        }
        let above = points.partition_point(|&(x, _)| x <= amount).max(1);
        let ((x0, y0), (x1, y1)) = (points[above - 1], points[above]);
        y0 + (y1 - y0) * (amount - x0) / (x1 - x0)
    }

    /// The speed of its last point, which more of the resource does not raise.
    fn best_speed(&self) -> f64 {
        self.0[self.0.len() - 1].1
    }

    /// The least amount at which the curve reaches `speed` (its last amount if it never does).
    fn least_amount_for(&self, speed: f64) -> f64 {
        let points = &self.0;
        match points.iter().position(|&(_, y)| y >= speed) {
            None => points[points.len() - 1].0,
            Some(0) => points[0].0,
            Some(above) => {
                let ((x0, y0), (x1, y1)) = (points[above - 1], points[above]);
                x0 + (x1 - x0) * (speed - y0) / (y1 - y0)
            }
        }
    }

    /// The curve's points up to `cap`, the curve's value at `cap` last: what the program may
    /// choose between.
    fn up_to(&self, cap: f64) -> Vec<(f64, f64)> {
        let mut points: Vec<(f64, f64)> =
            self.0.iter().copied().filter(|&(x, _)| x < cap).collect();
        points.push((cap, self.at(cap)));
        points
    }
}

/// Whether no segment of `points` is steeper than the one before it: then the program needs
/// no binaries (the best convex combination of points lies on the curve).
fn is_concave(points: &[(f64, f64)]) -> bool {
    let slopes: Vec<f64> = points
        .windows(2)
        .map(|pair| (pair[1].1 - pair[0].1) / (pair[1].0 - pair[0].0))
        .collect();
    slopes.windows(2).all(|pair| pair[1] <= pair[0])
}

/// The CPUs and memory an app gets on one machine (for all its GPUs there; `None`: not
/// modelled), and the speed they give it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Share {
    pub cpus: Option<f64>,
    pub memory_gib: Option<f64>,
    pub speed: f64,
}

/// `gpus` GPUs' fraction of `machine` (of `machine_gpus` GPUs).
pub fn proportional_share(
    machine: &MachineResources,
    machine_gpus: u32,
    gpus: u32,
) -> MachineResources {
    let fraction = f64::from(gpus) / f64::from(machine_gpus.max(1));
    MachineResources {
        cpus: machine.cpus.map(|cpus| cpus * fraction),
        memory_gib: machine.memory_gib.map(|memory| memory * fraction),
    }
}

/// Parts on several machines summed; a resource some machine does not model is `None`.
pub fn total(parts: &BTreeMap<u32, MachineResources>) -> MachineResources {
    let sum = |amount: fn(&MachineResources) -> Option<f64>| parts.values().map(amount).sum();
    MachineResources {
        cpus: sum(|part| part.cpus),
        memory_gib: sum(|part| part.memory_gib),
    }
}

/// An app holding `gpus` GPUs of a machine, with its profile.
#[derive(Debug, Clone, Copy)]
pub struct Tenant<'a> {
    pub gpus: u32,
    pub sensitivity: &'a Sensitivity,
}

impl Tenant<'_> {
    fn share_with(&self, total: MachineResources) -> Share {
        let per_gpu = |amount: Option<f64>| amount.map(|amount| amount / f64::from(self.gpus));
        Share {
            cpus: total.cpus,
            memory_gib: total.memory_gib,
            speed: self
                .sensitivity
                .speed_with(per_gpu(total.cpus), per_gpu(total.memory_gib)),
        }
    }
}

/// Divides the CPUs and memory of `machine` (of `machine_gpus` GPUs) among `tenants`, one
/// share per tenant in their order. Every tenant holds at least one GPU, and together no more
/// than the machine has.
///
/// `GpuProportional`: each tenant its GPUs' fraction. `SensitivityAware`: tenants without a
/// profile keep that fraction; the rest of the machine (idle GPUs' shares included) goes to the
/// others by [`sensitive_amounts`], the least resources that give the most GPU-weighted speed,
/// none below its GPU-proportional speed. Tenants with equal content are told apart only by
/// their order here.
pub fn split_machine(
    machine: &MachineResources,
    machine_gpus: u32,
    tenants: &[Tenant],
    allocation: ResourceAllocation,
) -> Vec<Share> {
    let proportional: Vec<Share> = tenants
        .iter()
        .map(|tenant| tenant.share_with(proportional_share(machine, machine_gpus, tenant.gpus)))
        .collect();
    if allocation == ResourceAllocation::GpuProportional || machine.is_unmodelled() {
        return proportional;
    }
    let mut order: Vec<usize> = (0..tenants.len()).collect();
    order.sort_by(|&a, &b| {
        tenants[a]
            .sensitivity
            .cmp_content(tenants[b].sensitivity)
            .then(tenants[a].gpus.cmp(&tenants[b].gpus))
            .then(a.cmp(&b))
    });
    let ordered: Vec<Tenant> = order.iter().map(|&index| tenants[index]).collect();
    let Some(amounts) = sensitive_amounts(machine, machine_gpus, &ordered) else {
        return proportional;
    };
    let mut shares = proportional;
    for (&index, total) in order.iter().zip(amounts) {
        shares[index] = tenants[index].share_with(total);
    }
    shares
}

/// One tenant's part in the program: its curve per modelled resource it depends on.
struct Flexible {
    tenant: usize,
    gpus: f64,
    /// Its GPU-proportional speed: the least it may get.
    guaranteed: f64,
    curves: Vec<(Resource, Curve)>,
}

/// The program's answer: each tenant's amounts (totals for its GPUs), or `None` if HiGHS gives
/// no optimum or its answer, raised to meet every guarantee exactly, exceeds the machine beyond
/// rounding (1e-9 of it).
fn sensitive_amounts(
    machine: &MachineResources,
    machine_gpus: u32,
    tenants: &[Tenant],
) -> Option<Vec<MachineResources>> {
    let mut totals: Vec<MachineResources> = tenants
        .iter()
        .map(|tenant| proportional_share(machine, machine_gpus, tenant.gpus))
        .collect();
    let per_gpu = proportional_share(machine, machine_gpus, 1);
    let flexible: Vec<Flexible> = tenants
        .iter()
        .enumerate()
        .filter_map(|(index, tenant)| {
            let curves: Vec<(Resource, Curve)> = RESOURCES
                .into_iter()
                .filter(|&resource| machine.amount(resource).is_some())
                .filter_map(|resource| Some((resource, tenant.sensitivity.curve(resource)?)))
                .collect();
            (!curves.is_empty()).then(|| Flexible {
                tenant: index,
                gpus: f64::from(tenant.gpus),
                guaranteed: tenant
                    .sensitivity
                    .speed_with(per_gpu.cpus, per_gpu.memory_gib),
                curves,
            })
        })
        .collect();
    if flexible.is_empty() {
        return Some(totals);
    }
    let solved = solve_split(machine, &totals, &flexible)?;
    for (one, (speed, amounts)) in flexible.iter().zip(solved) {
        // The least of each resource that gives the program's speed (more would be idle), and
        // never less than the guarantee needs: HiGHS meets bounds only to its tolerance.
        let reached = one
            .curves
            .iter()
            .zip(&amounts)
            .map(|((_, curve), &amount)| curve.at(amount))
            .fold(speed, f64::min)
            .max(one.guaranteed);
        for (resource, curve) in &one.curves {
            let total = curve.least_amount_for(reached) * one.gpus;
            match resource {
                Resource::Cpus => totals[one.tenant].cpus = Some(total),
                Resource::Memory => totals[one.tenant].memory_gib = Some(total),
            }
        }
    }
    let fits = RESOURCES.iter().all(|&resource| {
        machine.amount(resource).is_none_or(|capacity| {
            totals
                .iter()
                .filter_map(|total| total.amount(resource))
                .sum::<f64>()
                <= capacity * (1.0 + 1e-9)
        })
    });
    fits.then_some(totals)
}

/// What the tenants that keep their GPU-proportional amount of `resource` leave of it.
fn free_for_flexible(
    machine: &MachineResources,
    totals: &[MachineResources],
    flexible: &[Flexible],
    resource: Resource,
) -> f64 {
    let capacity = machine.amount(resource).unwrap_or(0.0);
    let fixed: f64 = totals
        .iter()
        .enumerate()
        .filter(|(index, _)| {
            !flexible
                .iter()
                .any(|one| one.tenant == *index && one.curves.iter().any(|(r, _)| *r == resource))
        })
        .filter_map(|(_, total)| total.amount(resource))
        .sum();
    (capacity - fixed).max(0.0)
}

/// One program over the flexible tenants (Synergy-Opt's per-job choice, §4.1, on one machine):
/// each tenant's amount per GPU of each resource is a convex combination of its curve's points
/// (of adjacent points only, by binaries, where the curve is not concave), its speed at most
/// each curve's value there and at least its guaranteed speed, the machine's free amounts
/// shared; the objective is the most GPU-weighted speed. Returns each tenant's speed and its
/// amounts per GPU, in its curves' order.
fn solve_split(
    machine: &MachineResources,
    totals: &[MachineResources],
    flexible: &[Flexible],
) -> Option<Vec<(f64, Vec<f64>)>> {
    let mut problem = RowProblem::default();
    let mut use_of: Vec<(Resource, Vec<(Col, f64)>)> = RESOURCES
        .into_iter()
        .filter(|&resource| machine.amount(resource).is_some())
        .map(|resource| (resource, Vec::new()))
        .collect();
    let mut speeds = Vec::with_capacity(flexible.len());
    let mut amounts: Vec<Vec<Vec<(Col, f64)>>> = Vec::with_capacity(flexible.len());
    for one in flexible {
        let speed = problem.add_column(one.gpus, one.guaranteed..);
        speeds.push(speed);
        let mut tenant_amounts = Vec::with_capacity(one.curves.len());
        for (resource, curve) in &one.curves {
            let capacity = machine.amount(*resource).unwrap_or(0.0);
            let points = curve.up_to(capacity / one.gpus);
            let weights: Vec<(Col, f64)> = points
                .iter()
                .map(|&(amount, _)| (problem.add_column(0.0, 0.0..=1.0), amount))
                .collect();
            problem.add_row(1.0..=1.0, weights.iter().map(|&(weight, _)| (weight, 1.0)));
            let mut below_curve = vec![(speed, 1.0)];
            below_curve.extend(
                weights
                    .iter()
                    .zip(&points)
                    .map(|(&(weight, _), &(_, value))| (weight, -value)),
            );
            problem.add_row(..=0.0, below_curve);
            if !is_concave(&points) {
                adjacent_points_only(&mut problem, &weights);
            }
            let row = use_of
                .iter_mut()
                .find(|(modelled, _)| modelled == resource)
                .map(|(_, row)| row)?;
            row.extend(
                weights
                    .iter()
                    .map(|&(weight, amount)| (weight, amount * one.gpus)),
            );
            tenant_amounts.push(weights);
        }
        amounts.push(tenant_amounts);
    }
    for (resource, row) in &use_of {
        let free = free_for_flexible(machine, totals, flexible, *resource);
        problem.add_row(..=free, row.iter().copied());
    }
    let mut model = problem.try_optimise(Sense::Maximise).ok()?;
    model.make_quiet();
    model.set_threads(NonZeroU32::MIN);
    model.set_option("primal_feasibility_tolerance", 1e-9);
    model.set_option("mip_feasibility_tolerance", 1e-9);
    model.set_option("mip_rel_gap", 0.0);
    let solved = crate::highs_run::try_solve(model).ok()?;
    if solved.status() != HighsModelStatus::Optimal {
        return None;
    }
    let solution = solved.get_solution();
    let value = |column: Col| solution[column];
    let amount_of = |weights: &Vec<(Col, f64)>| -> f64 {
        weights
            .iter()
            .map(|&(weight, amount)| value(weight).max(0.0) * amount)
            .sum()
    };
    Some(
        speeds
            .iter()
            .zip(&amounts)
            .map(|(&speed, tenant)| (value(speed), tenant.iter().map(amount_of).collect()))
            .collect(),
    )
}

/// SOS2 by binaries: one segment is chosen, and only its two end points may carry weight.
fn adjacent_points_only(problem: &mut RowProblem, weights: &[(Col, f64)]) {
    let segments: Vec<Col> = (1..weights.len())
        .map(|_| problem.add_integer_column(0.0, 0..=1))
        .collect();
    problem.add_row(1.0..=1.0, segments.iter().map(|&segment| (segment, 1.0)));
    for (point, &(weight, _)) in weights.iter().enumerate() {
        let mut row = vec![(weight, 1.0)];
        if point > 0 {
            row.push((segments[point - 1], -1.0));
        }
        if point < segments.len() {
            row.push((segments[point], -1.0));
        }
        problem.add_row(..=0.0, row);
    }
}

/// Every modelled machine's CPUs and memory as divided among the apps (or jobs: `K`) holding
/// its GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceSplit<K> {
    machines: BTreeMap<u32, MachineSplit<K>>,
}

impl<K> Default for ResourceSplit<K> {
    fn default() -> Self {
        Self {
            machines: BTreeMap::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct MachineSplit<K> {
    resources: MachineResources,
    tenants: Vec<(K, u32, Sensitivity)>,
    shares: Vec<Share>,
}

/// A machine to divide: its resources, its GPUs, and who holds how many of them.
#[derive(Debug, Clone)]
pub struct MachineTenants<'a, K> {
    pub resources: MachineResources,
    pub gpus: u32,
    pub tenants: Vec<(K, u32, &'a Sensitivity)>,
}

impl<K: Ord + Clone> ResourceSplit<K> {
    /// Divides each machine among its tenants ([`split_machine`]). A machine whose resources,
    /// tenants, their GPUs and profiles are those of `previous` keeps its split: the programs
    /// run only where something changed.
    pub fn divide(
        machines: BTreeMap<u32, MachineTenants<'_, K>>,
        allocation: ResourceAllocation,
        previous: &Self,
    ) -> Self {
        let machines = machines
            .into_iter()
            .filter(|(_, machine)| !machine.tenants.is_empty())
            .map(|(number, machine)| {
                let tenants: Vec<(K, u32, Sensitivity)> = machine
                    .tenants
                    .iter()
                    .map(|(key, gpus, profile)| (key.clone(), *gpus, (*profile).clone()))
                    .collect();
                let kept = previous.machines.get(&number).filter(|split| {
                    split.resources == machine.resources && split.tenants == tenants
                });
                let split = kept.cloned().unwrap_or_else(|| {
                    let holders: Vec<Tenant> = machine
                        .tenants
                        .iter()
                        .map(|&(_, gpus, sensitivity)| Tenant { gpus, sensitivity })
                        .collect();
                    MachineSplit {
                        resources: machine.resources,
                        shares: split_machine(
                            &machine.resources,
                            machine.gpus,
                            &holders,
                            allocation,
                        ),
                        tenants,
                    }
                });
                (number, split)
            })
            .collect();
        Self { machines }
    }

    /// What `key` got on `machine`, if it holds GPUs there.
    pub fn share(&self, key: &K, machine: u32) -> Option<Share> {
        let split = self.machines.get(&machine)?;
        let position = split
            .tenants
            .iter()
            .position(|(tenant, ..)| tenant == key)?;
        Some(split.shares[position])
    }

    /// The CPUs and memory that go with `key`'s GPUs on each machine (`gpus_on`: how many on
    /// which): its share there divided by GPUs ([`Self::part_for_gpus`]) or, where no division
    /// gave it a share (a host that started reporting its resources since), the GPUs' fraction
    /// of the machine. `machine` gives a machine's resources and GPUs.
    pub fn parts_for(
        &self,
        key: &K,
        gpus_on: &BTreeMap<u32, u32>,
        machine: impl Fn(u32) -> (MachineResources, u32),
    ) -> BTreeMap<u32, MachineResources> {
        gpus_on
            .iter()
            .map(|(&number, &gpus)| {
                let part = self.part_for_gpus(key, number, gpus).unwrap_or_else(|| {
                    let (resources, machine_gpus) = machine(number);
                    proportional_share(&resources, machine_gpus, gpus)
                });
                (number, part)
            })
            .collect()
    }

    /// Each divided machine: its resources and who held how many GPUs, with their profiles,
    /// in the order they were divided in.
    pub fn divided(
        &self,
    ) -> impl Iterator<Item = (u32, &MachineResources, &[(K, u32, Sensitivity)])> {
        self.machines
            .iter()
            .map(|(&number, split)| (number, &split.resources, split.tenants.as_slice()))
    }

    /// The part of `key`'s share on `machine` that goes with `gpus` of the GPUs it held there
    /// when the machine was divided: in proportion to GPUs (how a holder's share is divided
    /// among its leases).
    pub fn part_for_gpus(&self, key: &K, machine: u32, gpus: u32) -> Option<MachineResources> {
        let split = self.machines.get(&machine)?;
        let position = split
            .tenants
            .iter()
            .position(|(tenant, ..)| tenant == key)?;
        let fraction = f64::from(gpus) / f64::from(split.tenants[position].1);
        let share = split.shares[position];
        Some(MachineResources {
            cpus: share.cpus.map(|cpus| cpus * fraction),
            memory_gib: share.memory_gib.map(|memory| memory * fraction),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curves_interpolate_start_at_zero_and_stay_flat() {
        let curve = Curve::new(&[[2.0, 1.0], [4.0, 3.0]]);
        assert_eq!(curve.at(0.0), 0.0);
        assert_eq!(curve.at(1.0), 0.5);
        assert_eq!(curve.at(3.0), 2.0);
        assert_eq!(curve.at(9.0), 3.0);
        assert_eq!(curve.least_amount_for(2.0), 3.0);
        assert_eq!(curve.least_amount_for(5.0), 4.0);
        let from_zero = Curve::new(&[[0.0, 0.5], [10.0, 1.0]]);
        assert_eq!(from_zero.at(0.0), 0.5);
        assert_eq!(from_zero.least_amount_for(0.2), 0.0);
    }

    #[test]
    fn concavity_decides_whether_binaries_are_needed() {
        // (0, 0), (2, 1), (4, 3): the slope rises, so not concave.
        assert!(!is_concave(&Curve::new(&[[2.0, 1.0], [4.0, 3.0]]).0));
        assert!(is_concave(
            &Curve::new(&[[3.0, 1.0], [6.0, 2.0], [9.0, 2.5]]).0
        ));
    }

    #[test]
    fn the_speed_is_the_slower_curve_and_unmodelled_resources_do_not_count() {
        let profile = Sensitivity {
            cpus_per_gpu: vec![[3.0, 1.0], [6.0, 2.0]],
            memory_gib_per_gpu: vec![[50.0, 1.5]],
        };
        assert_eq!(profile.speed_with(Some(6.0), Some(50.0)), 1.5);
        assert_eq!(profile.speed_with(Some(6.0), None), 2.0);
        assert_eq!(profile.speed_with(None, None), 1.0);
    }

    /// A non-concave curve, (0, 0) -> (2, 0.2) -> (4, 2), on a machine of 2 GPUs and 4 CPUs
    /// beside a light tenant that needs 1 CPU for its speed 1: the hungry tenant gets the other
    /// 3 CPUs and runs at 0.2 + 1.8 x 1/2 = 1.1, on the curve (the concave hull would say 1.5).
    #[test]
    fn non_concave_curves_are_solved_exactly() {
        let hungry = Sensitivity {
            cpus_per_gpu: vec![[2.0, 0.2], [4.0, 2.0]],
            memory_gib_per_gpu: Vec::new(),
        };
        let light = Sensitivity {
            cpus_per_gpu: vec![[1.0, 1.0]],
            memory_gib_per_gpu: Vec::new(),
        };
        let machine = MachineResources {
            cpus: Some(4.0),
            memory_gib: None,
        };
        let shares = split_machine(
            &machine,
            2,
            &[
                Tenant {
                    gpus: 1,
                    sensitivity: &hungry,
                },
                Tenant {
                    gpus: 1,
                    sensitivity: &light,
                },
            ],
            ResourceAllocation::SensitivityAware,
        );
        assert!((shares[0].speed - 1.1).abs() < 1e-9, "{shares:?}");
        assert!(
            (shares[0].cpus.unwrap_or_default() - 3.0).abs() < 1e-9,
            "{shares:?}"
        );
        assert!(
            (shares[1].cpus.unwrap_or_default() - 1.0).abs() < 1e-9,
            "{shares:?}"
        );
    }
}
