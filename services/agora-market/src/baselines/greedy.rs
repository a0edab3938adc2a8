//! Greedy allocation by a metric: the shape shared by every §6.1 baseline.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

use super::{Contender, RoundView};
use crate::app::AppId;
use crate::auction::OfferedGpu;
use crate::fairness::remaining_time;
use crate::leftover::{hand_out_in_order, Recipient};
use crate::topology::{GpuId, GpuLocation, Locality};

/// Apps by decreasing `priority` (ties in the round's standings order: worst off first, never
/// by name), each taking up to its unmet demand of the best-placed free GPUs near what it
/// holds.
pub(super) fn by_bundle(
    view: &RoundView,
    priority: impl Fn(&Contender) -> f64,
) -> BTreeMap<AppId, Vec<GpuId>> {
    let mut ranked: Vec<(f64, &Contender)> =
        view.contenders.iter().map(|c| (priority(c), c)).collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    let recipients: Vec<Recipient> = ranked
        .into_iter()
        .map(|(_, contender)| Recipient {
            app: contender.app.id.clone(),
            unmet_demand: contender.unmet_demand,
            holds: contender.holds.clone(),
            claimed: Vec::new(),
        })
        .collect();
    let mut pool = view.free.to_vec();
    hand_out_in_order(&mut pool, &recipients)
}

/// One GPU at a time to the app with the highest `marginal` value of its next GPU, the
/// best-placed one for it. Values are re-evaluated lazily: a popped app whose value dropped
/// (its best GPU went to someone else) goes back into the heap.
pub(super) fn one_gpu_at_a_time(
    view: &RoundView,
    marginal: impl Fn(&Contender, &[GpuLocation], GpuLocation) -> f64,
) -> BTreeMap<AppId, Vec<GpuId>> {
    let mut pool: Vec<OfferedGpu> = view.free.to_vec();
    let mut placed: Vec<Vec<GpuLocation>> =
        view.contenders.iter().map(|c| c.holds.clone()).collect();
    let mut granted: Vec<Vec<GpuId>> = vec![Vec::new(); view.contenders.len()];
    let value_of = |index: usize, placed: &[GpuLocation], pool: &[OfferedGpu]| {
        nearest(pool, placed)
            .map(|(_, location)| marginal(&view.contenders[index], placed, location))
    };
    let mut heap: BinaryHeap<Candidate> = (0..view.contenders.len())
        .filter(|&index| view.contenders[index].unmet_demand > 0)
        .filter_map(|index| {
            value_of(index, &placed[index], &pool).map(|value| Candidate { value, index })
        })
        .collect();
    while let Some(Candidate { value, index }) = heap.pop() {
        let Some(current) = value_of(index, &placed[index], &pool) else {
            break;
        };
        if current < value && heap.peek().is_some_and(|next| current < next.value) {
            heap.push(Candidate {
                value: current,
                index,
            });
            continue;
        }
        let (position, location) = nearest(&pool, &placed[index]).expect("pool is not empty");
        granted[index].push(pool.remove(position).id);
        placed[index].push(location);
        if granted[index].len() < view.contenders[index].unmet_demand {
            if let Some(value) = value_of(index, &placed[index], &pool) {
                heap.push(Candidate { value, index });
            }
        }
    }
    view.contenders
        .iter()
        .zip(granted)
        .filter(|(_, gpus)| !gpus.is_empty())
        .map(|(contender, gpus)| (contender.app.id.clone(), gpus))
        .collect()
}

/// The free GPU that keeps `placed` tightest (first in offer order among equals).
fn nearest(pool: &[OfferedGpu], placed: &[GpuLocation]) -> Option<(usize, GpuLocation)> {
    let spread = |location: GpuLocation| {
        placed
            .iter()
            .map(|&held| Locality::between(held, location))
            .max()
            .unwrap_or(Locality::SameSlot)
    };
    pool.iter()
        .enumerate()
        .map(|(position, gpu)| (position, gpu.location))
        .min_by_key(|&(_, location)| spread(location))
}

#[derive(Debug, PartialEq)]
struct Candidate {
    value: f64,
    index: usize,
}

impl Eq for Candidate {}

impl Ord for Candidate {
    /// Highest value first; among equal values the lowest index (the standings order).
    fn cmp(&self, other: &Self) -> Ordering {
        self.value
            .total_cmp(&other.value)
            .then_with(|| other.index.cmp(&self.index))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Gandiva: how much the app's jobs gain from good placement (cross-rack over same-slot
/// slowdown of its most sensitive running job).
pub(super) fn placement_sensitivity(contender: &Contender) -> f64 {
    contender
        .app
        .running_jobs()
        .iter()
        .map(|job| job.slowdown.at(Locality::CrossRack) / job.slowdown.at(Locality::SameSlot))
        .fold(1.0, f64::max)
}

/// SRTF: minus the remaining time if the app got its whole demand, ideally placed (packing is
/// secondary for SRTF, §6.1).
pub(super) fn negative_remaining_time_with_demand(contender: &Contender) -> f64 {
    let gpus = contender.holds.len() + contender.unmet_demand;
    -remaining_time(
        contender.app,
        &vec![contender.anchor(); gpus],
        &contender.fairness.speeds,
        contender.fairness.restart_pause_seconds,
    )
}

/// SRSF: minus the remaining GPU-time (service) of the app.
pub(super) fn negative_remaining_service(contender: &Contender) -> f64 {
    -contender.app.remaining_work_gpu_seconds()
}

/// Optimus: the throughput scaling of one more GPU, the ratio of the app's speed with it to
/// its speed without (remaining time without over remaining time with). An app with no GPU
/// gains infinitely.
pub(super) fn throughput_scaling(
    contender: &Contender,
    placed: &[GpuLocation],
    next: GpuLocation,
) -> f64 {
    let mut with_next = placed.to_vec();
    with_next.push(next);
    let pause = contender.fairness.restart_pause_seconds;
    let speeds = &contender.fairness.speeds;
    let after = remaining_time(contender.app, &with_next, speeds, pause);
    let before = remaining_time(contender.app, placed, speeds, pause);
    if before.is_infinite() {
        f64::MAX
    } else {
        before / after
    }
}

/// SLAQ: how much one more GPU lowers the app's (synthetic) loss by the end of a lease.
///
/// The loss of an app that has done a fraction p of its work is 1 / (1 + 10 p): steep early in
/// training, flat near the end, as typical training curves are. Over a lease of length L the
/// app does a fraction min(1, L / remaining_time) of what is left.
pub(super) fn loss_reduction(
    contender: &Contender,
    placed: &[GpuLocation],
    next: GpuLocation,
) -> f64 {
    let app = contender.app;
    let total = app.total_work_gpu_seconds().max(f64::MIN_POSITIVE);
    let done = (1.0 - app.remaining_work_gpu_seconds() / total).clamp(0.0, 1.0);
    let lease = contender.lease_seconds;
    let loss_after = |gpus: &[GpuLocation]| {
        let fairness = &contender.fairness;
        let remaining = remaining_time(app, gpus, &fairness.speeds, fairness.restart_pause_seconds);
        let fraction_of_rest = (lease / remaining).min(1.0);
        let progress = done + (1.0 - done) * fraction_of_rest;
        1.0 / (1.0 + 10.0 * progress)
    };
    let mut with_next = placed.to_vec();
    with_next.push(next);
    loss_after(placed) - loss_after(&with_next)
}
