//! Synergy-Tune (Mohan et al., OSDI'22, §4.2): a base policy picks the jobs and their GPUs,
//! and Tune places them where their CPUs and memory fit.
//!
//! # Demands
//!
//! A job's demand per GPU on a machine is its profile's best case (Synergy §3.1: the least CPUs
//! and memory at which its speed saturates, [`Sensitivity::demand_per_gpu`]); its downgraded
//! demand, the lesser of that and the machine's GPU-proportional share, resource by resource
//! (Synergy switches the whole vector to the proportional share; taking the lesser of the two
//! fits at least as often and gives the same speed, the best one of each curve below it).
//!
//! # Placement
//!
//! The base policy's grants fix how many GPUs each app gets this round; Tune only chooses
//! which. Free CPUs and memory of a machine are its own less what its holders demand: the apps
//! holding its GPUs, at their full demand, and the jobs placed there this round, at the demand
//! they were placed with. Jobs are placed in Synergy's order, by GPUs, then CPUs, then memory
//! (the demands on the lowest-numbered machine: Synergy's clusters are homogeneous), most
//! first, equal ones in the round's standings order. Each job goes, at its full demand, then at
//! its downgraded demand, then at no demand (the GPUs only), to
//!
//! - the machine with the least free GPUs, then CPUs, then memory that fits all of it;
//! - else the fewest machines that fit it together, those that fit the most of its GPUs first;
//!
//! and takes the best-placed free GPUs there ([`hand_out_in_order`]). At no demand, the job's
//! machine is left with less than its holders demand: Synergy then switches some of them to
//! their GPU-proportional share, which is what the split after the round does (§"The split" of
//! `docs/mechanism.md`): the sensitivity-aware split gives every app of a machine at least its
//! GPU-proportional speed, and, where the demands placed on a machine fit, each its best speed.
//!
//! # Simplified relative to Synergy
//!
//! - Leases outlive rounds, so only this round's GPUs are placed; Synergy re-places every
//!   runnable job each round.
//! - A job spread over machines gets its shares machine by machine, not in proportion to its
//!   GPUs on each (as the split does for every policy).
//!
//! On a cluster that models no CPUs or memory the round's view has no machines, and the base
//! policy's grants are returned as they are.

use std::collections::BTreeMap;

use super::{Contender, RoundView};
use crate::app::AppId;
use crate::auction::OfferedGpu;
use crate::leftover::{hand_out_in_order, Recipient};
use crate::resources::{MachineResources, Sensitivity};
use crate::topology::{GpuId, GpuLocation};

/// What sums of demands may exceed a machine by, relative to it: rounding.
const ROUNDING: f64 = 1e-9;

/// The base policy's `grants`, each app's GPUs re-chosen by Synergy-Tune.
pub(super) fn place(
    view: &RoundView,
    grants: BTreeMap<AppId, Vec<GpuId>>,
) -> BTreeMap<AppId, Vec<GpuId>> {
    let Some(reference) = view.machines.values().next() else {
        return grants;
    };
    let mut jobs: Vec<(usize, usize, MachineResources)> = view
        .contenders
        .iter()
        .enumerate()
        .filter_map(|(rank, contender)| {
            let gpus = grants.get(&contender.app.id).map_or(0, Vec::len);
            let demand = contender
                .app
                .sensitivity()
                .demand_per_gpu(&reference.resources, reference.gpus);
            (gpus > 0).then_some((rank, gpus, demand))
        })
        .collect();
    jobs.sort_by(|(rank_a, gpus_a, a), (rank_b, gpus_b, b)| {
        let total = |gpus: usize, amount: Option<f64>| gpus as f64 * amount.unwrap_or(0.0);
        gpus_b
            .cmp(gpus_a)
            .then(total(*gpus_b, b.cpus).total_cmp(&total(*gpus_a, a.cpus)))
            .then(total(*gpus_b, b.memory_gib).total_cmp(&total(*gpus_a, a.memory_gib)))
            .then(rank_a.cmp(rank_b))
    });
    let mut servers = Server::all(view);
    jobs.into_iter()
        .map(|(rank, gpus, _)| {
            let contender = &view.contenders[rank];
            (
                contender.app.id.clone(),
                place_job(&mut servers, contender, gpus),
            )
        })
        .collect()
}

/// How much of its demand a job is placed with.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Level {
    Full,
    Downgraded,
    /// The GPUs only; the job still counts its downgraded demand against the machine.
    GpusOnly,
}

/// A machine with offered GPUs, as the round's placements fill it.
struct Server {
    machine: u32,
    resources: MachineResources,
    gpus: u32,
    free: Vec<OfferedGpu>,
    /// CPUs and memory its holders demand (`None`: not modelled).
    committed: MachineResources,
}

impl Server {
    /// The machines of the offered GPUs, in machine order, each with its holders' demands.
    fn all(view: &RoundView) -> Vec<Server> {
        let mut free: BTreeMap<u32, Vec<OfferedGpu>> = BTreeMap::new();
        for gpu in view.free {
            free.entry(gpu.location.machine)
                .or_default()
                .push(gpu.clone());
        }
        free.into_iter()
            .map(|(machine, free)| {
                let (resources, gpus, holders) = view.machines.get(&machine).map_or_else(
                    || (MachineResources::default(), 1, &[][..]),
                    |tenants| (tenants.resources, tenants.gpus, &tenants.tenants[..]),
                );
                let mut server = Server {
                    machine,
                    resources,
                    gpus,
                    free,
                    committed: MachineResources {
                        cpus: resources.cpus.map(|_| 0.0),
                        memory_gib: resources.memory_gib.map(|_| 0.0),
                    },
                };
                for (_, held, sensitivity) in holders {
                    server.commit(*held as usize, server.demand(sensitivity, Level::Full));
                }
                server
            })
            .collect()
    }

    /// What `sensitivity` demands per GPU here at `level`.
    fn demand(&self, sensitivity: &Sensitivity, level: Level) -> MachineResources {
        let full = sensitivity.demand_per_gpu(&self.resources, self.gpus);
        if level == Level::Full {
            return full;
        }
        let proportional = self.resources.per_gpu(self.gpus);
        let lesser = |a: Option<f64>, b: Option<f64>| Some(a?.min(b?));
        MachineResources {
            cpus: lesser(full.cpus, proportional.cpus),
            memory_gib: lesser(full.memory_gib, proportional.memory_gib),
        }
    }

    fn commit(&mut self, gpus: usize, per_gpu: MachineResources) {
        let add = |committed: &mut Option<f64>, amount: Option<f64>| {
            if let (Some(committed), Some(amount)) = (committed.as_mut(), amount) {
                *committed += gpus as f64 * amount;
            }
        };
        add(&mut self.committed.cpus, per_gpu.cpus);
        add(&mut self.committed.memory_gib, per_gpu.memory_gib);
    }

    /// Free CPUs and memory (infinite where not modelled).
    fn spare(&self) -> (f64, f64) {
        let spare = |capacity: Option<f64>, committed: Option<f64>| {
            capacity.map_or(f64::INFINITY, |capacity| {
                capacity - committed.unwrap_or(0.0)
            })
        };
        (
            spare(self.resources.cpus, self.committed.cpus),
            spare(self.resources.memory_gib, self.committed.memory_gib),
        )
    }

    /// How many GPUs of a job demanding `per_gpu` (`None`: the GPUs only) fit here.
    fn fits(&self, per_gpu: Option<MachineResources>) -> usize {
        let Some(per_gpu) = per_gpu else {
            return self.free.len();
        };
        let (cpus, memory) = self.spare();
        let by = |spare: f64, capacity: Option<f64>, need: Option<f64>| match (capacity, need) {
            (Some(capacity), Some(need)) if need > 0.0 => {
                ((spare + ROUNDING * capacity) / need).floor().max(0.0) as usize
            }
            _ => usize::MAX,
        };
        self.free
            .len()
            .min(by(cpus, self.resources.cpus, per_gpu.cpus))
            .min(by(memory, self.resources.memory_gib, per_gpu.memory_gib))
    }

    /// Best fit: the fullest machine first (free GPUs, CPUs, memory), then machine order.
    fn fullness(&self) -> (usize, f64, f64, u32) {
        let (cpus, memory) = self.spare();
        (self.free.len(), cpus, memory, self.machine)
    }
}

fn by_fullness(a: &Server, b: &Server) -> std::cmp::Ordering {
    let (a, b) = (a.fullness(), b.fullness());
    a.0.cmp(&b.0)
        .then(a.1.total_cmp(&b.1))
        .then(a.2.total_cmp(&b.2))
        .then(a.3.cmp(&b.3))
}

/// Places `gpus` GPUs of `contender` (Synergy's steps: full demand, downgraded, GPUs only) and
/// returns them.
fn place_job(servers: &mut [Server], contender: &Contender, gpus: usize) -> Vec<GpuId> {
    let sensitivity = contender.app.sensitivity();
    let chosen = [Level::Full, Level::Downgraded, Level::GpusOnly]
        .into_iter()
        .find_map(|level| {
            let demand = |server: &Server| {
                (level != Level::GpusOnly).then(|| server.demand(sensitivity, level))
            };
            Some((level, plan(servers, gpus, demand)?))
        });
    let Some((level, counts)) = chosen else {
        return Vec::new();
    };
    let mut holds: Vec<GpuLocation> = contender.holds.clone();
    let mut placed = Vec::with_capacity(gpus);
    for (index, count) in counts {
        let server = &mut servers[index];
        let offered = server.free.clone();
        let recipient = Recipient {
            app: contender.app.id.clone(),
            unmet_demand: count,
            holds: holds.clone(),
            claimed: Vec::new(),
        };
        let got = hand_out_in_order(&mut server.free, &[recipient])
            .remove(&contender.app.id)
            .unwrap_or_default();
        let charged = if level == Level::GpusOnly {
            Level::Downgraded
        } else {
            level
        };
        server.commit(got.len(), server.demand(sensitivity, charged));
        holds.extend(
            offered
                .iter()
                .filter(|gpu| got.contains(&gpu.id))
                .map(|gpu| gpu.location),
        );
        placed.extend(got);
    }
    placed
}

/// Which servers take how many of `gpus` GPUs demanding `demand` each (by server), or `None`
/// if they do not fit: one server if one fits them all, else the fewest that fit them
/// together.
fn plan(
    servers: &[Server],
    gpus: usize,
    demand: impl Fn(&Server) -> Option<MachineResources>,
) -> Option<Vec<(usize, usize)>> {
    let fitting: Vec<(usize, usize)> = servers
        .iter()
        .enumerate()
        .map(|(index, server)| (index, server.fits(demand(server))))
        .filter(|&(_, fit)| fit > 0)
        .collect();
    if let Some(&(index, _)) = fitting
        .iter()
        .filter(|&&(_, fit)| fit >= gpus)
        .min_by(|a, b| by_fullness(&servers[a.0], &servers[b.0]))
    {
        return Some(vec![(index, gpus)]);
    }
    let mut most_first = fitting;
    most_first.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then(by_fullness(&servers[a.0], &servers[b.0]))
    });
    let mut left = gpus;
    let mut chosen = Vec::new();
    for (index, fit) in most_first {
        if left == 0 {
            break;
        }
        let take = fit.min(left);
        chosen.push((index, take));
        left -= take;
    }
    (left == 0).then_some(chosen)
}
