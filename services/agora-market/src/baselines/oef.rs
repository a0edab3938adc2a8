//! OEF, non-cooperative (Middleware'24, Eq. 9), as a round's policy: the GPUs of every type
//! are shared so that every app gets the same normalised throughput, the most in total, an LP
//! solved by HiGHS; the LP's GPU counts per type are then rounded into this round's grants.
//!
//! - **Types.** GPUs are grouped by what the apps make of them: two GPUs are of one type when
//!   every contender runs at the same speed on both (no type names enter the decision). On a
//!   cluster of one type there is one group and OEF shares GPUs equally.
//! - **Speedups.** App i's speedup on type j, w_ij, is its speed there over its speed on its
//!   slowest type (OEF's speedup vector, 1 on the lowest-end GPU).
//! - **The LP.** x_ij >= 0 GPUs of type j for app i (those it holds and those offered):
//!   maximise sum_ij w_ij x_ij subject to sum_i x_ij <= m_j (the type's GPUs this round),
//!   sum_j w_ij x_ij = e for every app (Eq. 9c: equal normalised throughput, which makes it
//!   strategy-proof) and, which OEF leaves out, sum_j x_ij <= d_i (held plus unmet demand):
//!   an app is never given more GPUs than it can use.
//! - **Rounding.** Apps furthest below their share take, type by type, the best-placed free
//!   GPUs of that type up to the share rounded up; the GPUs the LP leaves (the equality stops
//!   at the app that can use least) then go to apps with unmet demand in the same order, so no
//!   offered GPU stays idle, as in every policy of the market.

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use highs::{HighsModelStatus, RowProblem, Sense};

use super::RoundView;
use crate::app::AppId;
use crate::auction::OfferedGpu;
use crate::leftover::{hand_out_in_order, Recipient};
use crate::topology::{GpuId, GpuLocation};

/// Slack below an integer that still rounds down, so 3.0000001 GPUs count as 3.
const ROUNDING_SLACK: f64 = 1e-6;

/// The GPUs each contender gets under OEF.
pub(super) fn allocate(view: &RoundView) -> BTreeMap<AppId, Vec<GpuId>> {
    let types = GpuTypes::of(view);
    let shares = equal_throughput_shares(view, &types).unwrap_or_default();
    round(view, &types, &shares)
}

/// The round's GPUs grouped into types by the contenders' speeds on them.
struct GpuTypes {
    /// Each type's speeds, one per contender (in the view's order).
    speeds: Vec<Vec<f64>>,
    /// The type of each free GPU, in `view.free`'s order.
    of_free: Vec<usize>,
    /// GPUs of each type: free and held by a contender.
    count: Vec<f64>,
    /// GPUs each contender holds, per type.
    held: Vec<Vec<f64>>,
}

impl GpuTypes {
    fn of(view: &RoundView) -> Self {
        let speeds_at = |location: GpuLocation| -> Vec<f64> {
            view.contenders
                .iter()
                .map(|contender| contender.fairness.speeds.at(location))
                .collect()
        };
        let mut speeds: Vec<Vec<f64>> = Vec::new();
        let mut type_of = |location: GpuLocation| -> usize {
            let key = speeds_at(location);
            match speeds.iter().position(|known| *known == key) {
                Some(index) => index,
                None => {
                    speeds.push(key);
                    speeds.len() - 1
                }
            }
        };
        let of_free: Vec<usize> = view.free.iter().map(|gpu| type_of(gpu.location)).collect();
        let held_types: Vec<Vec<usize>> = view
            .contenders
            .iter()
            .map(|contender| contender.holds.iter().map(|&at| type_of(at)).collect())
            .collect();
        let types = speeds.len();
        let mut count = vec![0.0; types];
        for &index in &of_free {
            count[index] += 1.0;
        }
        let held = held_types
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
        }
    }

    /// w_ij: contender i's speed on type j over its speed on its slowest type.
    fn speedup(&self, contender: usize, gpu_type: usize) -> f64 {
        let slowest = self
            .speeds
            .iter()
            .map(|speeds| speeds[contender])
            .fold(f64::INFINITY, f64::min);
        self.speeds[gpu_type][contender] / slowest
    }
}

/// x_ij of Eq. 9 with demand caps, per contender and type; `None` if HiGHS gives no optimum.
fn equal_throughput_shares(view: &RoundView, types: &GpuTypes) -> Option<Vec<Vec<f64>>> {
    let contenders = view.contenders.len();
    let type_count = types.count.len();
    if contenders == 0 || type_count == 0 {
        return None;
    }
    let mut problem = RowProblem::default();
    let columns: Vec<Vec<_>> = (0..contenders)
        .map(|i| {
            (0..type_count)
                .map(|j| problem.add_column(types.speedup(i, j), 0.0..))
                .collect()
        })
        .collect();
    let efficiency = problem.add_column(0.0, 0.0..);
    for (j, &count) in types.count.iter().enumerate() {
        let row: Vec<_> = columns.iter().map(|app| (app[j], 1.0)).collect();
        problem.add_row(..=count, &row);
    }
    for (i, contender) in view.contenders.iter().enumerate() {
        let demand = (contender.holds.len() + contender.unmet_demand) as f64;
        let gpus: Vec<_> = columns[i].iter().map(|&column| (column, 1.0)).collect();
        problem.add_row(..=demand, &gpus);
        let mut throughput: Vec<_> = columns[i]
            .iter()
            .enumerate()
            .map(|(j, &column)| (column, types.speedup(i, j)))
            .collect();
        throughput.push((efficiency, -1.0));
        problem.add_row(0.0..=0.0, &throughput);
    }
    let mut model = problem.try_optimise(Sense::Maximise).ok()?;
    model.make_quiet();
    model.set_threads(NonZeroU32::MIN);
    let solved = model.try_solve().ok()?;
    if solved.status() != HighsModelStatus::Optimal {
        return None;
    }
    let values = solved.get_solution().columns().to_vec();
    Some(
        (0..contenders)
            .map(|i| {
                (0..type_count)
                    .map(|j| values[i * type_count + j].max(0.0))
                    .collect()
            })
            .collect(),
    )
}

/// Rounds the shares into grants (see the module documentation).
fn round(view: &RoundView, types: &GpuTypes, shares: &[Vec<f64>]) -> BTreeMap<AppId, Vec<GpuId>> {
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
    let location_of = |gpu: &GpuId| {
        view.free
            .iter()
            .find(|offered| &offered.id == gpu)
            .map(|offered| offered.location)
    };
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
    let rest: Vec<Recipient> = order
        .iter()
        .map(|&i| {
            let contender = &contenders[i];
            let got = granted
                .get(&contender.app.id)
                .map_or(&[][..], Vec::as_slice);
            contender.recipient_after(got, location_of)
        })
        .collect();
    for (app, gpus) in hand_out_in_order(&mut left, &rest) {
        granted.entry(app).or_default().extend(gpus);
    }
    granted
}
