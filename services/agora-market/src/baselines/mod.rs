//! The baseline policies of Themis §6.1. Each sees the same round as Themis (the free GPUs and
//! every active app with unmet demand) and hands the free GPUs out greedily by its own metric,
//! taking best-placed GPUs near what each app holds. Gavel's finish-time fairness, a later
//! fairness policy added as a modern anchor, rounds LP time fractions per GPU type instead
//! (`gavel.rs`), and OEF, for clusters of several GPU types, rounds an LP's GPU counts per type
//! (`oef.rs`); the two share the grouping of GPUs into types and the rounding (`gpu_types.rs`).
//! Shockwave plans a window of rounds with a mixed-integer program (`shockwave.rs`).
//! Synergy-Tune places the GPUs SRTF or Gavel-FTF grant where the jobs' CPUs and memory fit
//! (`tune.rs`).

mod gavel;
mod gpu_types;
mod greedy;
mod oef;
mod shockwave;
mod tune;

use crate::app::{App, AppId};
use crate::auction::OfferedGpu;
use crate::fairness::FairnessContext;
use crate::leftover::{hand_out_in_order, Recipient};
use crate::policy::Policy;
use crate::resources::MachineTenants;
use crate::rho::RhoOld;
use crate::time::Timestamp;
use crate::topology::{GpuId, GpuLocation};
use std::collections::BTreeMap;

/// An app as a baseline sees it in a round.
#[derive(Debug, Clone)]
pub struct Contender<'a> {
    pub app: &'a App,
    pub holds: Vec<GpuLocation>,
    pub unmet_demand: usize,
    /// GPU-seconds the app has held so far (ended and running leases).
    pub attained_gpu_seconds: f64,
    pub fairness: FairnessContext,
    pub rho: RhoOld,
    /// The round's lease length, in seconds: how far ahead greedy metrics look.
    pub lease_seconds: f64,
}

impl Contender<'_> {
    /// Where a baseline imagines the app's next GPUs: next to the first it holds, or on the
    /// cluster's fastest GPUs for the app.
    fn anchor(&self) -> GpuLocation {
        self.holds
            .first()
            .copied()
            .unwrap_or_else(|| self.fairness.speeds.fastest_location())
    }

    /// The app as a recipient of what a first pass left, after that pass gave it `got`
    /// (located by `location_of`).
    fn recipient_after(
        &self,
        got: &[GpuId],
        location_of: impl Fn(&GpuId) -> Option<GpuLocation>,
    ) -> Recipient {
        let mut holds = self.holds.clone();
        holds.extend(got.iter().filter_map(location_of));
        Recipient {
            app: self.app.id.clone(),
            unmet_demand: self.unmet_demand.saturating_sub(got.len()),
            holds,
            claimed: Vec::new(),
        }
    }
}

/// After a first pass that `granted` GPUs, hands what it left in `pool` to the contenders with
/// unmet demand, in `order` (indices into `view.contenders`): no offered GPU stays idle while
/// an app wants one. Returns the grants of both passes.
fn hand_out_the_rest(
    view: &RoundView,
    order: &[usize],
    pool: &mut Vec<OfferedGpu>,
    mut granted: BTreeMap<AppId, Vec<GpuId>>,
) -> BTreeMap<AppId, Vec<GpuId>> {
    let location_of = |gpu: &GpuId| {
        view.free
            .iter()
            .find(|offered| &offered.id == gpu)
            .map(|offered| offered.location)
    };
    let rest: Vec<Recipient> = order
        .iter()
        .map(|&i| {
            let contender = &view.contenders[i];
            let got = granted
                .get(&contender.app.id)
                .map_or(&[][..], Vec::as_slice);
            contender.recipient_after(got, location_of)
        })
        .collect();
    for (app, gpus) in hand_out_in_order(pool, &rest) {
        granted.entry(app).or_default().extend(gpus);
    }
    granted
}

/// What a baseline decides from.
#[derive(Debug, Clone)]
pub struct RoundView<'a> {
    pub now: Timestamp,
    pub free: &'a [OfferedGpu],
    /// Apps with unmet demand, in the round's standings order (worst off first).
    pub contenders: Vec<Contender<'a>>,
    /// Each machine's CPUs and memory and the apps holding its GPUs, for the policies that
    /// place by them ([`Policy::packs_cpus_and_memory`]); empty for the others and on clusters
    /// that model neither resource.
    pub machines: BTreeMap<u32, MachineTenants<'a, AppId>>,
}

/// The GPUs each app gets under `policy` (any policy but Themis, which runs the auction).
pub fn allocate(policy: Policy, view: &RoundView) -> BTreeMap<AppId, Vec<GpuId>> {
    match policy {
        Policy::Themis => BTreeMap::new(),
        Policy::Gandiva => greedy::by_bundle(view, greedy::placement_sensitivity),
        Policy::Tiresias => greedy::by_bundle(view, |contender| -contender.attained_gpu_seconds),
        Policy::Srtf => greedy::by_bundle(view, greedy::negative_remaining_time_with_demand),
        Policy::Srsf => greedy::by_bundle(view, greedy::negative_remaining_service),
        Policy::Optimus => greedy::one_gpu_at_a_time(view, greedy::throughput_scaling),
        Policy::Slaq => greedy::one_gpu_at_a_time(view, greedy::loss_reduction),
        Policy::GavelFtf => gavel::allocate(view),
        Policy::Oef => oef::allocate(view),
        Policy::Shockwave => shockwave::allocate(view),
        Policy::SynergySrtf => tune::place(
            view,
            greedy::by_bundle(view, greedy::negative_remaining_time_with_demand),
        ),
        Policy::SynergyFtf => tune::place(view, gavel::allocate(view)),
    }
}
