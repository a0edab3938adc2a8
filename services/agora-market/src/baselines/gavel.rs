//! Gavel's heterogeneity-aware finish-time-fairness policy (Narayanan et al., OSDI'20, §4:
//! minimise the maximum finish-time fairness over a time allocation per GPU type), as the
//! modern fairness anchor among the baselines.
//!
//! # Fractions
//!
//! The round's GPUs are grouped into types by the contenders' speeds on them (`gpu_types.rs`;
//! one type on a homogeneous cluster), m_j GPUs of type j (free plus held by contenders).
//! Each contender i (an app with unmet demand) would run on its full demand d_i = held + unmet
//! GPUs of type j for a fraction X_ij of the time, sum_j X_ij <= 1 (Gavel's allocation X).
//! R_ij is the time it needs to finish on d_i GPUs of type j ([`remaining_time`] on the GPUs of
//! that type it holds, padded with copies of the first of them, or of a GPU of that type when
//! it holds none) and R_i = min_j R_ij its time on its best type. Its speed on type j relative
//! to its best is c_ij = R_i / R_ij, so its effective fraction (Gavel's effective throughput
//! sum_j X_ij * throughput_ij, in units of its best type) is y_i = sum_j c_ij X_ij and its
//! projected finish-time fairness is
//!
//! ```text
//! rho_i(X) = (elapsed_i + R_i / y_i) / T_id_i
//! ```
//!
//! with elapsed_i = now - arrival and T_id_i [`independent_finish_time`]. The policy minimises
//! max_i rho_i(X) subject to the capacity of every type, sum_i X_ij d_i <= m_j.
//!
//! rho_i <= t is the linear bound y_i >= lower_i(t) = R_i / (t T_id_i - elapsed_i)
//! (impossible when t T_id_i <= elapsed_i), so "is max rho <= t achievable" is an LP
//! feasibility problem, monotone in t. The minimax t* is found by bisection on t, each step an
//! LP solved by HiGHS: columns X_ij in [0, 1] and y_i in [lower_i(t), 1], rows
//! y_i = sum_j c_ij X_ij, sum_j X_ij <= 1 per app and one capacity row per type. On one type
//! X_i is y_i itself and the only row is the capacity. The bracket starts at
//! t_lo = max_i (elapsed_i + R_i) / T_id_i (everyone on its best type all the time, checked
//! first) and t_hi, the max rho of the always-feasible equal share
//! X_ij = (m_j / C) min(1, C / (n d_i)), C = sum_j m_j (the same number of GPUs to every app,
//! at most its demand, from every type in proportion to its size); it stops when
//! hi - lo <= 1e-6 hi or after 60 steps, and keeps the feasible end. A t whose bound exceeds 1
//! for some app (an empty column box) is infeasible without building an LP.
//!
//! The fractions are the solution of the LP at t*, maximising sum_i w_i d_i y_i with
//! w_i = 1 + 1e-3 k_i / n, k_i the app's rank by rho on its full demand of its best type
//! (worst rank highest, ties by app id): capacity is used fully, each type preferably by the
//! apps it speeds up most, and the spare capacity the minimax leaves (when one app's rho cannot
//! fall below t* even at y = 1) goes to the apps furthest behind first. Apps whose rho does not
//! depend on X (nothing left to run, or no positive finite T_id) get no bound and only share
//! the spare capacity.
//!
//! If HiGHS fails (an error, or a status other than optimal or infeasible), the fractions fall
//! back to the equal share, which is always feasible.
//!
//! # Rounding to typed GPUs, and over time
//!
//! X_ij of the time on d_i GPUs is the GPU time of X_ij d_i GPUs of type j held all the time,
//! so the share s_ij = X_ij d_i is the number of type-j GPUs app i should hold. Shares are
//! rounded as `gpu_types.rs` describes (as for OEF): the GPUs an app holds of a type count
//! against its share of that type; apps furthest below their total share take, type by type,
//! up to ceil(s_ij - held_ij) best-placed free GPUs of that type; what is left goes to anyone
//! with unmet demand, so the policy is work-conserving like every other. Over time the
//! fractions are respected in two ways: a lease outlives its round, so a share met once stays
//! met (and is not granted twice) until the lease ends; and the LP is re-solved every round
//! from each app's progress (elapsed and remaining time), so an app that got less than its
//! fractions in earlier rounds (a share rounded down, or GPUs of a slower type) has a higher
//! rho and a larger X in the next one.
//!
//! # Simplified relative to Gavel
//!
//! - Whole apps, not jobs: an app's X_ij is a fraction of its total demand, and a bundle that
//!   mixes types runs each job at its slowest GPU's speed (the job model), where Gavel runs a
//!   job on one type per round.
//! - Rounding per lease round, as above, where Gavel realises X with priority-based
//!   round-robin (priority X_ij divided by the share of rounds received on type j so far).
//! - No space sharing, and Gavel's finish-time-fairness reference (an isolated 1/n share of
//!   the cluster) is replaced by Themis's T_id = T_cluster * N_avg, so rho is the same quantity
//!   the Themis auction uses.

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use highs::{Col, HighsModelStatus, Model, RowProblem, Sense};

use super::gpu_types::{round, GpuTypes};
use super::RoundView;
use crate::app::AppId;
use crate::fairness::{independent_finish_time, remaining_time};
use crate::topology::{GpuId, GpuLocation};

/// Relative tolerance of the bisection on t.
const RELATIVE_TOLERANCE: f64 = 1e-6;
/// The most bisection steps (LPs) per round.
const MAX_STEPS: usize = 60;
/// A bound this close above 1 is rounding error (t = t_lo exactly) and counts as 1.
const BOUND_SLACK: f64 = 1e-12;

/// The GPUs each contender gets under Gavel-FTF.
pub(super) fn allocate(view: &RoundView) -> BTreeMap<AppId, Vec<GpuId>> {
    let types = GpuTypes::of(view);
    let apps: Vec<FtfApp> = (0..view.contenders.len())
        .map(|index| FtfApp::of(index, view, &types))
        .collect();
    let fractions = match minimax_fractions(&apps, &types.count) {
        Ok(solution) => solution.fractions,
        Err(_) => equal_share(&apps, &types.count),
    };
    let shares: Vec<Vec<f64>> = apps
        .iter()
        .zip(&fractions)
        .map(|(app, row)| row.iter().map(|x| x * app.demand).collect())
        .collect();
    round(view, &types, &shares)
}

/// What the LP needs to know about one contender.
#[derive(Debug, Clone, PartialEq)]
struct FtfApp {
    /// d_i: GPUs held plus unmet demand.
    demand: f64,
    /// R_ij: seconds to finish on the full demand of each type.
    remaining_by_type: Vec<f64>,
    /// Seconds since arrival.
    elapsed: f64,
    /// T_id, seconds.
    independent: f64,
}

impl FtfApp {
    fn of(index: usize, view: &RoundView, types: &GpuTypes) -> Self {
        let contender = &view.contenders[index];
        let demand = contender.holds.len() + contender.unmet_demand;
        let anchor = contender.anchor();
        let anchor_type = types.type_at(view, anchor);
        let remaining_by_type = (0..types.count.len())
            .map(|gpu_type| {
                let mut gpus: Vec<GpuLocation> = contender
                    .holds
                    .iter()
                    .zip(&types.of_held[index])
                    .filter(|(_, &held_type)| held_type == gpu_type)
                    .map(|(&location, _)| location)
                    .collect();
                let padding = gpus
                    .first()
                    .copied()
                    .unwrap_or(if anchor_type == Some(gpu_type) {
                        anchor
                    } else {
                        types.located[gpu_type]
                    });
                gpus.resize(demand.max(gpus.len()), padding);
                remaining_time(
                    contender.app,
                    &gpus,
                    &contender.fairness.speeds,
                    contender.fairness.restart_pause_seconds,
                )
            })
            .collect();
        Self {
            demand: demand as f64,
            remaining_by_type,
            elapsed: view
                .now
                .saturating_since(contender.fairness.arrival)
                .as_secs_f64(),
            independent: independent_finish_time(&contender.fairness),
        }
    }

    /// R_i: seconds to finish on the full demand of the best type.
    fn remaining(&self) -> f64 {
        self.remaining_by_type
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }

    /// c_ij: the speed on `gpu_type` relative to the best type (1 when there is no work left).
    fn relative_speed(&self, gpu_type: usize) -> f64 {
        let ratio = self.remaining() / self.remaining_by_type[gpu_type];
        if ratio.is_nan() {
            1.0
        } else {
            ratio
        }
    }

    /// y_i: the fraction of the time on the full demand of the best type that `fractions`
    /// (one per type) are worth.
    fn effective(&self, fractions: &[f64]) -> f64 {
        fractions
            .iter()
            .enumerate()
            .map(|(gpu_type, x)| self.relative_speed(gpu_type) * x)
            .sum()
    }

    /// Whether X affects rho at all; those that do not get no bound.
    fn is_bounded(&self) -> bool {
        let remaining = self.remaining();
        self.demand > 0.0
            && remaining > 0.0
            && remaining.is_finite()
            && self.independent > 0.0
            && self.independent.is_finite()
            && self.elapsed.is_finite()
    }

    /// rho when running an effective fraction `y` of the time on the full demand.
    fn rho(&self, y: f64) -> f64 {
        if !self.is_bounded() {
            return 0.0;
        }
        if y <= 0.0 {
            return f64::INFINITY;
        }
        (self.elapsed + self.remaining() / y) / self.independent
    }

    /// The least effective fraction y with rho <= t (infinite when no y achieves it).
    fn lower_bound(&self, t: f64) -> f64 {
        if !self.is_bounded() {
            return 0.0;
        }
        let slack = t * self.independent - self.elapsed;
        if slack > 0.0 {
            self.remaining() / slack
        } else {
            f64::INFINITY
        }
    }
}

/// The minimax value and the fractions that achieve it.
#[derive(Debug, Clone, PartialEq)]
struct Fractions {
    /// t*: the least achievable max rho over bounded apps (0 when none is bounded).
    max_rho: f64,
    /// X_ij, in the contenders' order, one per type.
    fractions: Vec<Vec<f64>>,
}

/// HiGHS did not give a usable answer.
#[derive(Debug, Clone, PartialEq)]
struct SolverFailure(String);

/// Minimises max_i rho_i(X) subject to sum_i X_ij d_i <= capacity_j, sum_j X_ij <= 1,
/// X >= 0.
fn minimax_fractions(apps: &[FtfApp], capacity: &[f64]) -> Result<Fractions, SolverFailure> {
    if apps.is_empty() {
        return Ok(Fractions {
            max_rho: 0.0,
            fractions: Vec::new(),
        });
    }
    let mut program = FeasibilityProgram::new(apps, capacity)?;
    let bounded = || apps.iter().filter(|app| app.is_bounded());
    let Some(lowest) = bounded().map(|app| app.rho(1.0)).reduce(f64::max) else {
        let fractions = program
            .solve_at(0.0)?
            .ok_or_else(|| SolverFailure("infeasible with no lower bounds at all".to_owned()))?;
        return Ok(Fractions {
            max_rho: 0.0,
            fractions,
        });
    };
    if let Some(fractions) = program.solve_at(lowest)? {
        return Ok(Fractions {
            max_rho: lowest,
            fractions,
        });
    }
    let equal = equal_share(apps, capacity);
    let mut high = apps
        .iter()
        .zip(&equal)
        .map(|(app, row)| app.rho(app.effective(row)))
        .fold(lowest, f64::max);
    if !high.is_finite() {
        return Err(SolverFailure(format!(
            "no finite rho with capacity {capacity:?}"
        )));
    }
    let mut low = lowest;
    for _ in 0..MAX_STEPS {
        if high - low <= RELATIVE_TOLERANCE * high {
            break;
        }
        let middle = 0.5 * (low + high);
        if program.is_feasible(middle)? {
            high = middle;
        } else {
            low = middle;
        }
    }
    let fractions = program
        .solve_at(high)?
        .ok_or_else(|| SolverFailure(format!("upper end t = {high} is infeasible")))?;
    Ok(Fractions {
        max_rho: high,
        fractions,
    })
}

/// X_ij = (m_j / C) min(1, C / (n d_i)): every app gets the same number of GPUs, at most its
/// demand, from each type in proportion to the type's size. Always feasible; the fallback
/// when HiGHS fails.
fn equal_share(apps: &[FtfApp], capacity: &[f64]) -> Vec<Vec<f64>> {
    let total: f64 = capacity.iter().map(|m| m.max(0.0)).sum();
    let each = total / apps.len().max(1) as f64;
    let portion: Vec<f64> = capacity
        .iter()
        .map(|m| if total > 0.0 { m.max(0.0) / total } else { 0.0 })
        .collect();
    apps.iter()
        .map(|app| {
            let time = if app.demand > 0.0 {
                (each / app.demand).min(1.0)
            } else {
                1.0
            };
            portion.iter().map(|p| time * p).collect()
        })
        .collect()
}

/// The LP "max sum w_i d_i y_i s.t. the capacity rows, y_i = sum_j c_ij X_ij,
/// sum_j X_ij <= 1, lower_i(t) <= y_i <= 1", kept between bisection steps so each step only
/// changes column bounds (and HiGHS starts from the last basis).
struct FeasibilityProgram<'a> {
    apps: &'a [FtfApp],
    /// X_ij's column, per app and type.
    fractions: Vec<Vec<Col>>,
    /// y_i's column: the app's only X on one type.
    effective: Vec<Col>,
    /// `None` only while a solve is running.
    model: Option<Model>,
}

impl<'a> FeasibilityProgram<'a> {
    fn new(apps: &'a [FtfApp], capacity: &[f64]) -> Result<Self, SolverFailure> {
        let weight = objective_weights(apps);
        let mut problem = RowProblem::default();
        let (fractions, effective) = if let [single] = capacity {
            one_type_columns(&mut problem, apps, &weight, *single)
        } else {
            typed_columns(&mut problem, apps, &weight, capacity)
        };
        let mut model = problem
            .try_optimise(Sense::Maximise)
            .map_err(|status| SolverFailure(format!("HiGHS rejected the model: {status:?}")))?;
        model.make_quiet();
        model.set_threads(NonZeroU32::MIN);
        Ok(Self {
            apps,
            fractions,
            effective,
            model: Some(model),
        })
    }

    fn is_feasible(&mut self, t: f64) -> Result<bool, SolverFailure> {
        self.solve_at(t).map(|fractions| fractions.is_some())
    }

    /// The LP's solution with every app's rho <= t, or `None` when that is infeasible.
    fn solve_at(&mut self, t: f64) -> Result<Option<Vec<Vec<f64>>>, SolverFailure> {
        let lower: Vec<f64> = self
            .apps
            .iter()
            .map(|app| app.lower_bound(t))
            .map(|bound| {
                if bound <= 1.0 + BOUND_SLACK {
                    bound.min(1.0)
                } else {
                    bound
                }
            })
            .collect();
        if lower.iter().any(|&bound| bound.is_nan() || bound > 1.0) {
            return Ok(None);
        }
        let mut model = self
            .model
            .take()
            .ok_or_else(|| SolverFailure("model lost by an earlier failure".to_owned()))?;
        for (&column, &bound) in self.effective.iter().zip(&lower) {
            model.change_column_bounds(column, bound..=1.0);
        }
        let solved = crate::highs_run::try_solve(model)
            .map_err(|status| SolverFailure(format!("HiGHS error {status:?} at t = {t}")))?;
        let answer = match solved.status() {
            HighsModelStatus::Optimal => {
                Some(self.fractions_of(solved.get_solution().columns(), &lower))
            }
            HighsModelStatus::Infeasible | HighsModelStatus::UnboundedOrInfeasible => None,
            other => {
                return Err(SolverFailure(format!(
                    "HiGHS ended with {other:?} at t = {t}"
                )))
            }
        };
        self.model = Some(solved.into());
        Ok(answer)
    }

    /// X from the LP's column values, each within its column's box.
    fn fractions_of(&self, values: &[f64], lower: &[f64]) -> Vec<Vec<f64>> {
        self.fractions
            .iter()
            .zip(&self.effective)
            .zip(lower)
            .map(|((row, &effective), &bound)| {
                row.iter()
                    .map(|&column| {
                        let floor = if column == effective { bound } else { 0.0 };
                        values[column.index()].clamp(floor, 1.0)
                    })
                    .collect()
            })
            .collect()
    }
}

/// w_i = 1 + 1e-3 k_i / n (see the module documentation).
fn objective_weights(apps: &[FtfApp]) -> Vec<f64> {
    let n = apps.len() as f64;
    let mut by_full_demand_rho: Vec<usize> = (0..apps.len()).collect();
    // Best first, so the app furthest behind gets the highest rank (ties: lower index, i.e.
    // earlier in the round's standings, ranks higher).
    by_full_demand_rho.sort_by(|&a, &b| {
        apps[a]
            .rho(1.0)
            .total_cmp(&apps[b].rho(1.0))
            .then_with(|| b.cmp(&a))
    });
    let mut weight = vec![1.0; apps.len()];
    for (rank, &index) in by_full_demand_rho.iter().enumerate() {
        weight[index] = 1.0 + 1e-3 * (rank + 1) as f64 / n;
    }
    weight
}

/// One type: X_i is y_i, one column per app, and the capacity is the only row.
fn one_type_columns(
    problem: &mut RowProblem,
    apps: &[FtfApp],
    weight: &[f64],
    capacity: f64,
) -> (Vec<Vec<Col>>, Vec<Col>) {
    let columns: Vec<Col> = apps
        .iter()
        .zip(weight)
        .map(|(app, &w)| problem.add_column(w * app.demand, 0.0..=1.0))
        .collect();
    let row: Vec<(Col, f64)> = columns
        .iter()
        .zip(apps)
        .map(|(&column, app)| (column, app.demand))
        .collect();
    problem.add_row(..=capacity.max(0.0), &row);
    (
        columns.iter().map(|&column| vec![column]).collect(),
        columns,
    )
}

/// Several types: X_ij and y_i columns, a capacity row per type, and per app
/// y_i = sum_j c_ij X_ij and sum_j X_ij <= 1.
fn typed_columns(
    problem: &mut RowProblem,
    apps: &[FtfApp],
    weight: &[f64],
    capacity: &[f64],
) -> (Vec<Vec<Col>>, Vec<Col>) {
    let fractions: Vec<Vec<Col>> = apps
        .iter()
        .map(|_| {
            capacity
                .iter()
                .map(|_| problem.add_column(0.0, 0.0..=1.0))
                .collect()
        })
        .collect();
    let effective: Vec<Col> = apps
        .iter()
        .zip(weight)
        .map(|(app, &w)| problem.add_column(w * app.demand, 0.0..=1.0))
        .collect();
    for (gpu_type, &count) in capacity.iter().enumerate() {
        let row: Vec<(Col, f64)> = fractions
            .iter()
            .zip(apps)
            .map(|(row, app)| (row[gpu_type], app.demand))
            .collect();
        problem.add_row(..=count.max(0.0), &row);
    }
    for ((row, &y), app) in fractions.iter().zip(&effective).zip(apps) {
        let mut worth: Vec<(Col, f64)> = row
            .iter()
            .enumerate()
            .map(|(gpu_type, &column)| (column, app.relative_speed(gpu_type)))
            .collect();
        worth.push((y, -1.0));
        problem.add_row(0.0..=0.0, &worth);
        let time: Vec<(Col, f64)> = row.iter().map(|&column| (column, 1.0)).collect();
        problem.add_row(..=1.0, &time);
    }
    (fractions, effective)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(demand: f64, remaining: f64, elapsed: f64, independent: f64) -> FtfApp {
        typed_app(demand, &[remaining], elapsed, independent)
    }

    fn typed_app(demand: f64, remaining_by_type: &[f64], elapsed: f64, independent: f64) -> FtfApp {
        FtfApp {
            demand,
            remaining_by_type: remaining_by_type.to_vec(),
            elapsed,
            independent,
        }
    }

    /// The minimax on one type, with each app's only fraction.
    #[derive(Debug)]
    struct OneType {
        max_rho: f64,
        fractions: Vec<f64>,
    }

    fn one_type(apps: &[FtfApp], capacity: f64) -> Result<OneType, SolverFailure> {
        let solution = minimax_fractions(apps, &[capacity])?;
        Ok(OneType {
            max_rho: solution.max_rho,
            fractions: solution.fractions.iter().map(|row| row[0]).collect(),
        })
    }

    fn max_rho(apps: &[FtfApp], fractions: &[f64]) -> f64 {
        apps.iter()
            .zip(fractions)
            .map(|(app, &x)| app.rho(x))
            .fold(0.0, f64::max)
    }

    fn used(apps: &[FtfApp], fractions: &[f64]) -> f64 {
        apps.iter()
            .zip(fractions)
            .map(|(app, x)| app.demand * x)
            .sum()
    }

    /// The least max rho over a grid on the first apps' fractions; the last app takes what
    /// capacity is left (rho falls as X grows, so that is its best).
    fn grid_minimum(apps: &[FtfApp], capacity: f64, steps: usize) -> f64 {
        let grid: Vec<f64> = (1..=steps).map(|k| k as f64 / steps as f64).collect();
        let mut best = f64::INFINITY;
        let mut fractions = vec![0.0; apps.len()];
        let mut visit = |prefix: &[f64]| {
            let spent: f64 = apps.iter().zip(prefix).map(|(a, x)| a.demand * x).sum();
            let last = apps.last().expect("apps");
            let rest = ((capacity - spent) / last.demand).min(1.0);
            if rest <= 0.0 {
                return;
            }
            fractions[..prefix.len()].copy_from_slice(prefix);
            fractions[prefix.len()] = rest;
            best = best.min(max_rho(apps, &fractions));
        };
        match apps.len() {
            2 => grid.iter().for_each(|&x| visit(&[x])),
            3 => {
                for &x in &grid {
                    for &y in &grid {
                        visit(&[x, y]);
                    }
                }
            }
            _ => unreachable!("2 or 3 apps"),
        }
        best
    }

    fn assert_minimax_matches_grid(apps: &[FtfApp], capacity: f64, steps: usize) {
        let solution = one_type(apps, capacity).expect("HiGHS solves it");
        let x = &solution.fractions;
        assert!(x.iter().all(|&f| (0.0..=1.0).contains(&f)), "{x:?}");
        assert!(
            used(apps, x) <= capacity + 1e-6,
            "{x:?} overuses {capacity}"
        );
        let achieved = max_rho(apps, x);
        assert!(
            (achieved - solution.max_rho).abs() <= 1e-5 * solution.max_rho,
            "fractions {x:?} give max rho {achieved}, reported {}",
            solution.max_rho
        );
        let grid = grid_minimum(apps, capacity, steps);
        assert!(
            solution.max_rho <= grid * (1.0 + 1e-6),
            "LP {} worse than grid {grid}",
            solution.max_rho
        );
        assert!(
            grid <= solution.max_rho * 1.01,
            "grid {grid} far above LP {}: grid too coarse or LP wrong",
            solution.max_rho
        );
    }

    #[test]
    fn minimax_matches_a_grid_search_on_two_apps() {
        // The engine test's case: an old app (rho 3 + 1/X) against a fresh one (0.5 / X), 4 GPUs
        // each, 4 in all. Closed form: X_new solves 3x^2 - 4.5x + 0.5 = 0.
        let apps = [
            app(4.0, 1000.0, 3000.0, 1000.0),
            app(4.0, 1000.0, 0.0, 2000.0),
        ];
        assert_minimax_matches_grid(&apps, 4.0, 20_000);
        let x_new = (4.5 - 14.25_f64.sqrt()) / 6.0;
        let solution = one_type(&apps, 4.0).expect("solved");
        assert!((solution.fractions[1] - x_new).abs() < 1e-5, "{solution:?}");
        assert!((solution.fractions[0] - (1.0 - x_new)).abs() < 1e-5);
        assert!((solution.max_rho - 0.5 / x_new).abs() < 1e-5 * solution.max_rho);
    }

    #[test]
    fn minimax_matches_a_grid_search_on_three_apps() {
        let apps = [
            app(2.0, 500.0, 100.0, 800.0),
            app(4.0, 300.0, 0.0, 1200.0),
            app(3.0, 900.0, 2000.0, 1500.0),
        ];
        for capacity in [3.0, 5.0, 7.0] {
            assert_minimax_matches_grid(&apps, capacity, 600);
        }
    }

    #[test]
    fn everyone_runs_all_the_time_when_demand_fits() {
        let apps = [app(2.0, 100.0, 0.0, 100.0), app(3.0, 100.0, 50.0, 100.0)];
        let solution = one_type(&apps, 8.0).expect("solved");
        assert_eq!(solution.fractions, vec![1.0, 1.0]);
        assert_eq!(solution.max_rho, 1.5);
    }

    #[test]
    fn spare_capacity_goes_to_the_app_furthest_behind() {
        // a waited so long that even X = 1 leaves it at rho 11; b and c reach that with little
        // (X >= 1/11 and X >= 0.1). The 2.6 GPUs spare go to c (rho 2 on its full demand)
        // before b (rho 1): c runs all the time, b half of it.
        let apps = [
            app(2.0, 100.0, 1000.0, 100.0),
            app(2.0, 100.0, 0.0, 100.0),
            app(2.0, 100.0, 100.0, 100.0),
        ];
        let solution = one_type(&apps, 5.0).expect("solved");
        assert!((solution.max_rho - 11.0).abs() < 1e-9, "{solution:?}");
        let [a, b, c] = solution.fractions[..] else {
            unreachable!()
        };
        assert_eq!(a, 1.0);
        assert_eq!(c, 1.0);
        assert!((b - 0.5).abs() < 1e-9, "{solution:?}");
    }

    /// The same minimax by arithmetic: max rho <= t is feasible iff every bound is at most 1
    /// and sum d_i lower_i(t) <= C.
    fn reference_minimax(apps: &[FtfApp], capacity: f64) -> f64 {
        let feasible = |t: f64| {
            let lower: Vec<f64> = apps.iter().map(|app| app.lower_bound(t)).collect();
            let needed: f64 = apps.iter().zip(&lower).map(|(a, l)| a.demand * l).sum();
            lower.iter().all(|&bound| bound <= 1.0 + 1e-12) && needed <= capacity
        };
        let lowest = apps.iter().map(|app| app.rho(1.0)).fold(0.0, f64::max);
        if feasible(lowest) {
            return lowest;
        }
        let (mut low, mut high) = (lowest, lowest.max(1.0));
        while !feasible(high) {
            high *= 2.0;
        }
        for _ in 0..200 {
            let middle = 0.5 * (low + high);
            if feasible(middle) {
                high = middle;
            } else {
                low = middle;
            }
        }
        high
    }

    #[test]
    fn minimax_agrees_with_arithmetic_on_random_rounds() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for _ in 0..200 {
            let n = rng.random_range(1..=20);
            let apps: Vec<FtfApp> = (0..n)
                .map(|_| {
                    app(
                        f64::from(rng.random_range(1..=16_u32)),
                        rng.random_range(10.0..10_000.0),
                        if rng.random_bool(0.3) {
                            0.0
                        } else {
                            rng.random_range(0.0..50_000.0)
                        },
                        rng.random_range(100.0..20_000.0),
                    )
                })
                .collect();
            let total: f64 = apps.iter().map(|a| a.demand).sum();
            let capacity = (total * rng.random_range(0.05..1.2)).round().max(1.0);
            let solution = one_type(&apps, capacity).expect("solved");
            let expected = reference_minimax(&apps, capacity);
            assert!(
                (solution.max_rho - expected).abs() <= 2e-6 * expected,
                "{} vs {expected} on {apps:?} with {capacity}",
                solution.max_rho
            );
            let x = &solution.fractions;
            assert!(used(&apps, x) <= capacity * (1.0 + 1e-9) + 1e-6);
            assert!(max_rho(&apps, x) <= solution.max_rho * (1.0 + 1e-6));
            assert!(
                used(&apps, x) >= capacity.min(total) * (1.0 - 1e-9) - 1e-6,
                "capacity left unused: {x:?}"
            );
        }
    }

    #[test]
    fn equal_share_is_feasible() {
        let apps = [app(1.0, 1.0, 0.0, 1.0), app(8.0, 1.0, 0.0, 1.0)];
        let x: Vec<f64> = equal_share(&apps, &[6.0])
            .iter()
            .map(|row| row[0])
            .collect();
        assert_eq!(x, vec![1.0, 3.0 / 8.0]);
        assert!(used(&apps, &x) <= 6.0);
    }

    /// Two types, fast (V, one GPU) and slow (K, two GPUs), three fresh apps of one GPU each
    /// with T_id = 100 s, so rho = 1 / y. All finish in 100 s on a V; on a K, A takes 400 s,
    /// B 200 s and C 100 s, so c_K = 1/4, 1/2 and 1.
    ///
    /// By hand: C is as fast on a K as on the V, so it runs on a K all the time (y_C = 1, one
    /// of the two Ks). A and B share the V (A a fraction a, B at most 1 - a) and fill their
    /// time with the other K: y_A <= a + (1 - a) / 4 and y_B <= (1 - a) + a / 2. The least
    /// max rho maximises min(y_A, y_B): (1 + 3a) / 4 = (2 - a) / 2 at a = 3/5, y = 0.7, so
    /// t* = 1 / 0.7 = 10/7 and X_A = (0.6, 0.4), X_B = (0.4, 0.6), X_C = (0, 1), which fills
    /// both types exactly (V 0.6 + 0.4 = 1, K 0.4 + 0.6 + 1 = 2).
    #[test]
    fn two_types_three_apps_hand_checked() {
        let apps = [
            typed_app(1.0, &[100.0, 400.0], 0.0, 100.0),
            typed_app(1.0, &[100.0, 200.0], 0.0, 100.0),
            typed_app(1.0, &[100.0, 100.0], 0.0, 100.0),
        ];
        let solution = minimax_fractions(&apps, &[1.0, 2.0]).expect("solved");
        assert!((solution.max_rho - 10.0 / 7.0).abs() < 1e-5, "{solution:?}");
        let expected = [[0.6, 0.4], [0.4, 0.6], [0.0, 1.0]];
        for (got, want) in solution.fractions.iter().zip(expected) {
            for (x, y) in got.iter().zip(want) {
                assert!((x - y).abs() < 1e-5, "{solution:?}");
            }
        }
    }

    /// Random typed instances: 1-20 apps, 2-4 types, each app fastest on a random type.
    fn random_typed_instance(rng: &mut rand_chacha::ChaCha8Rng) -> (Vec<FtfApp>, Vec<f64>) {
        use rand::RngExt;
        let types = rng.random_range(2..=4);
        let n = rng.random_range(1..=20);
        let apps: Vec<FtfApp> = (0..n)
            .map(|_| {
                let best = rng.random_range(10.0..10_000.0);
                let remaining: Vec<f64> = (0..types)
                    .map(|_| best * rng.random_range(1.0..10.0))
                    .collect();
                typed_app(
                    f64::from(rng.random_range(1..=16_u32)),
                    &remaining,
                    if rng.random_bool(0.3) {
                        0.0
                    } else {
                        rng.random_range(0.0..50_000.0)
                    },
                    rng.random_range(100.0..20_000.0),
                )
            })
            .collect();
        let total: f64 = apps.iter().map(|a| a.demand).sum();
        let capacity = (0..types)
            .map(|_| (total * rng.random_range(0.02..0.5)).round())
            .collect();
        (apps, capacity)
    }

    #[test]
    fn no_type_is_given_more_than_it_has() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(21);
        for _ in 0..200 {
            let (apps, capacity) = random_typed_instance(&mut rng);
            let solution = minimax_fractions(&apps, &capacity).expect("solved");
            for (gpu_type, &count) in capacity.iter().enumerate() {
                let used: f64 = apps
                    .iter()
                    .zip(&solution.fractions)
                    .map(|(app, row)| app.demand * row[gpu_type])
                    .sum();
                assert!(used <= count + 1e-6, "type {gpu_type}: {used} of {count}");
            }
            for (app, row) in apps.iter().zip(&solution.fractions) {
                assert!(row.iter().all(|x| (0.0..=1.0).contains(x)), "{row:?}");
                assert!(row.iter().sum::<f64>() <= 1.0 + 1e-9, "{row:?}");
                assert!(
                    app.rho(app.effective(row)) <= solution.max_rho * (1.0 + 1e-6),
                    "{row:?} above the reported max rho {}",
                    solution.max_rho
                );
            }
        }
    }

    /// Renaming apps reorders the contenders; the fractions move with their apps.
    #[test]
    fn permuting_the_apps_permutes_the_fractions() {
        use rand::seq::SliceRandom;
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for _ in 0..100 {
            let (apps, capacity) = random_typed_instance(&mut rng);
            let mut order: Vec<usize> = (0..apps.len()).collect();
            order.shuffle(&mut rng);
            let permuted: Vec<FtfApp> = order.iter().map(|&i| apps[i].clone()).collect();
            let original = minimax_fractions(&apps, &capacity).expect("solved");
            let renamed = minimax_fractions(&permuted, &capacity).expect("solved");
            assert!(
                (original.max_rho - renamed.max_rho).abs() <= 1e-6 * original.max_rho,
                "{} vs {}",
                original.max_rho,
                renamed.max_rho
            );
            for (position, &i) in order.iter().enumerate() {
                for (x, y) in original.fractions[i]
                    .iter()
                    .zip(&renamed.fractions[position])
                {
                    assert!((x - y).abs() < 1e-4, "app {i}: {x} vs {y}");
                }
            }
        }
    }

    #[test]
    fn typed_equal_share_splits_every_type_in_proportion() {
        // 6 GPUs, 2 of type 0 and 4 of type 1; demands 1 and 8 get 1 and 3 GPUs.
        let apps = [
            typed_app(1.0, &[1.0, 1.0], 0.0, 1.0),
            typed_app(8.0, &[1.0, 1.0], 0.0, 1.0),
        ];
        let x = equal_share(&apps, &[2.0, 4.0]);
        let gpus: Vec<Vec<f64>> = apps
            .iter()
            .zip(&x)
            .map(|(app, row)| row.iter().map(|f| f * app.demand).collect())
            .collect();
        let expected = [[1.0 / 3.0, 2.0 / 3.0], [1.0, 2.0]];
        for (got, want) in gpus.iter().zip(expected) {
            for (x, y) in got.iter().zip(want) {
                assert!((x - y).abs() < 1e-12, "{gpus:?}");
            }
        }
    }
}
