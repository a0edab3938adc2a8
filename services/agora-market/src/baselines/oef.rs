//! OEF, non-cooperative (Middleware'24, Eq. 9), as a round's policy: the GPUs of every type
//! are shared so that every app gets the same normalised throughput, the most in total, an LP
//! solved by HiGHS; the LP's GPU counts per type are then rounded into this round's grants.
//!
//! - **Types.** GPUs are grouped by what the apps make of them (`gpu_types.rs`): on a cluster
//!   of one type there is one group and OEF shares GPUs equally.
//! - **Speedups.** App i's speedup on type j, w_ij, is its speed there over its speed on its
//!   slowest type (OEF's speedup vector, 1 on the lowest-end GPU).
//! - **The LP.** x_ij >= 0 GPUs of type j for app i (those it holds and those offered):
//!   maximise sum_ij w_ij x_ij subject to sum_i x_ij <= m_j (the type's GPUs this round),
//!   sum_j w_ij x_ij = e for every app (Eq. 9c: equal normalised throughput, which makes it
//!   strategy-proof) and, which OEF leaves out, sum_j x_ij <= d_i (held plus unmet demand):
//!   an app is never given more GPUs than it can use.
//! - **Rounding.** The per-type GPU counts x_ij are rounded as `gpu_types.rs` describes: apps
//!   furthest below their share take, type by type, the best-placed free GPUs of that type up
//!   to the share rounded up; the GPUs the LP leaves (the equality stops at the app that can
//!   use least) then go to apps with unmet demand in the same order.

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use highs::{HighsModelStatus, RowProblem, Sense};

use super::gpu_types::{round, GpuTypes};
use super::RoundView;
use crate::app::AppId;
use crate::topology::GpuId;

/// The GPUs each contender gets under OEF.
pub(super) fn allocate(view: &RoundView) -> BTreeMap<AppId, Vec<GpuId>> {
    let types = GpuTypes::of(view);
    let shares = equal_throughput_shares(view, &types).unwrap_or_default();
    round(view, &types, &shares)
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
    let solved = crate::highs_run::try_solve(model).ok()?;
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
