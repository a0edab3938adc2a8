//! What the LP baselines (`oef.rs`, `gavel.rs`) share on a cluster of several GPU types: the
//! round's GPUs grouped into types, and the rounding of per-type GPU shares into grants.
//!
//! - **Types.** GPUs are grouped by what the apps make of them: two GPUs are of one type when
//!   every contender runs at the same speed on both (no type names enter the decision). On a
//!   cluster of one type there is one group.
//! - **Rounding.** A share s_ij is the number of type-j GPUs app i should hold. The GPUs an app
//!   already holds count against it (leases run on across rounds, so a share is met by what
//!   was granted earlier as well as now). Apps furthest below their total share take, type by
//!   type, the best-placed free GPUs of that type up to ceil(s_ij - held_ij); the GPUs this
//!   leaves then go to apps with unmet demand in the same order, so no offered GPU stays
//!   idle, as in every policy of the market.

use std::collections::BTreeMap;

use super::{hand_out_the_rest, RoundView};
use crate::app::AppId;
use crate::auction::OfferedGpu;
use crate::leftover::{hand_out_in_order, Recipient};
use crate::topology::{GpuId, GpuLocation};

/// Slack below an integer that still rounds down, so 3.0000001 GPUs count as 3.
const ROUNDING_SLACK: f64 = 1e-6;

/// Each contender's speed on the GPU at `location`, in the view's order.
fn speeds_at(view: &RoundView, location: GpuLocation) -> Vec<f64> {
    view.contenders
        .iter()
        .map(|contender| contender.fairness.speeds.at(location))
        .collect()
}

/// The round's GPUs grouped into types by the contenders' speeds on them.
pub(super) struct GpuTypes {
    /// Each type's speeds, one per contender (in the view's order).
    pub speeds: Vec<Vec<f64>>,
    /// The type of each free GPU, in `view.free`'s order.
    pub of_free: Vec<usize>,
    /// GPUs of each type: free and held by a contender.
    pub count: Vec<f64>,
    /// GPUs each contender holds, per type.
    pub held: Vec<Vec<f64>>,
    /// The type of each GPU each contender holds, in its `holds` order.
    pub of_held: Vec<Vec<usize>>,
    /// A location of each type: the first free GPU of it, else the first held one.
    pub located: Vec<GpuLocation>,
}

impl GpuTypes {
    pub fn of(view: &RoundView) -> Self {
        let mut speeds: Vec<Vec<f64>> = Vec::new();
        let mut located: Vec<GpuLocation> = Vec::new();
        let mut type_of = |location: GpuLocation| -> usize {
            let key = speeds_at(view, location);
            match speeds.iter().position(|known| *known == key) {
                Some(index) => index,
                None => {
                    speeds.push(key);
                    located.push(location);
                    speeds.len() - 1
                }
            }
        };
        let of_free: Vec<usize> = view.free.iter().map(|gpu| type_of(gpu.location)).collect();
        let of_held: Vec<Vec<usize>> = view
            .contenders
            .iter()
            .map(|contender| contender.holds.iter().map(|&at| type_of(at)).collect())
            .collect();
        let types = speeds.len();
        let mut count = vec![0.0; types];
        for &index in &of_free {
            count[index] += 1.0;
        }
        let held = of_held
            .iter()
            .map(|indices| {
                let mut per_type = vec![0.0; types];
                for &index in indices {
                    per_type[index] += 1.0;
                    count[index] += 1.0;
                }
                per_type
            })
            .collect();
        Self {
            speeds,
            of_free,
            count,
            held,
            of_held,
            located,
        }
    }

    /// The type of the GPU at `location`, if the round has GPUs of its type.
    pub fn type_at(&self, view: &RoundView, location: GpuLocation) -> Option<usize> {
        let key = speeds_at(view, location);
        self.speeds.iter().position(|known| *known == key)
    }

    /// w_ij: contender i's speed on type j over its speed on its slowest type.
    pub fn speedup(&self, contender: usize, gpu_type: usize) -> f64 {
        let slowest = self
            .speeds
            .iter()
            .map(|speeds| speeds[contender])
            .fold(f64::INFINITY, f64::min);
        self.speeds[gpu_type][contender] / slowest
    }
}

/// Rounds `shares` (GPUs per contender and type) into grants (see the module documentation).
pub(super) fn round(
    view: &RoundView,
    types: &GpuTypes,
    shares: &[Vec<f64>],
) -> BTreeMap<AppId, Vec<GpuId>> {
    let contenders = &view.contenders;
    let share = |i: usize, j: usize| shares.get(i).map_or(0.0, |row| row[j]);
    let below = |i: usize| -> f64 {
        (0..types.count.len())
            .map(|j| share(i, j) - types.held[i][j])
            .sum()
    };
    let mut order: Vec<usize> = (0..contenders.len()).collect();
    order.sort_by(|&a, &b| below(b).total_cmp(&below(a)).then_with(|| a.cmp(&b)));
    let mut granted: BTreeMap<AppId, Vec<GpuId>> = BTreeMap::new();
    let mut left: Vec<OfferedGpu> = Vec::new();
    for j in 0..types.count.len() {
        let mut pool: Vec<OfferedGpu> = view
            .free
            .iter()
            .zip(&types.of_free)
            .filter(|(_, &gpu_type)| gpu_type == j)
            .map(|(gpu, _)| gpu.clone())
            .collect();
        let recipients: Vec<Recipient> = order
            .iter()
            .map(|&i| {
                let contender = &contenders[i];
                let got = granted.get(&contender.app.id).map_or(0, Vec::len);
                let fair = (share(i, j) - types.held[i][j] - ROUNDING_SLACK)
                    .ceil()
                    .max(0.0) as usize;
                Recipient {
                    app: contender.app.id.clone(),
                    unmet_demand: fair.min(contender.unmet_demand.saturating_sub(got)),
                    holds: contender.holds.clone(),
                    claimed: Vec::new(),
                }
            })
            .collect();
        for (app, gpus) in hand_out_in_order(&mut pool, &recipients) {
            granted.entry(app).or_default().extend(gpus);
        }
        left.extend(pool);
    }
    hand_out_the_rest(view, &order, &mut left, granted)
}
