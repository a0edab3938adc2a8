//! Gavel's finish-time-fairness policy (Narayanan et al., OSDI'20: minimise the maximum
//! finish-time fairness), as the modern fairness anchor among the baselines.
//!
//! # Fractions
//!
//! Each contender i (an app with unmet demand) would run on its full demand
//! d_i = held + unmet GPUs for a fraction X_i in [0, 1] of the time. Its projected finish-time
//! fairness is
//!
//! ```text
//! rho_i(X) = (elapsed_i + remaining_i / X_i) / T_id_i
//! ```
//!
//! with elapsed_i = now - arrival, remaining_i the time to finish on d_i GPUs
//! ([`remaining_time`] on the app's current locations padded with copies of its first one, or
//! one location repeated when it holds nothing) and T_id_i
//! [`independent_finish_time`]. The policy minimises max_i rho_i(X) subject to
//! sum_i X_i d_i <= C, C the free GPUs plus those the contenders hold.
//!
//! rho_i <= t is the linear bound X_i >= lower_i(t) = remaining_i / (t T_id_i - elapsed_i)
//! (impossible when t T_id_i <= elapsed_i), so "is max rho <= t achievable" is an LP
//! feasibility problem, monotone in t. The minimax t* is found by bisection on t, each step an
//! LP solved by HiGHS (columns X_i in [lower_i(t), 1], one row sum X_i d_i <= C). The bracket
//! starts at t_lo = max_i (elapsed_i + remaining_i) / T_id_i (everyone on full demand, checked
//! first) and t_hi, the max rho of the always-feasible equal share X_i = min(1, C / (n d_i));
//! it stops when hi - lo <= 1e-6 hi or after 60 steps, and keeps the feasible end. A t whose
//! bound exceeds 1 for some app (an empty column box) is infeasible without building an LP.
//!
//! The fractions are the solution of the LP at t*, maximising sum_i w_i d_i X_i with
//! w_i = 1 + 1e-3 k_i / n, k_i the app's rank by rho on its full demand (worst rank highest,
//! ties by app id): capacity is used fully, and the spare capacity the minimax leaves (when
//! one app's rho cannot fall below t* even at X = 1) goes to the apps furthest behind first,
//! so the optimum is unique. Apps whose rho does not depend on X (nothing left to run, or no
//! positive finite T_id) get no bound and only share the spare capacity.
//!
//! If HiGHS fails (an error, or a status other than optimal or infeasible), the fractions fall
//! back to the equal share X_i = min(1, C / (n d_i)), which is always feasible.
//!
//! # Rounding
//!
//! The free GPUs are handed out one app at a time in decreasing order of X_i d_i - held_i (the
//! app furthest below its fair share first; ties by app id), each taking up to
//! min(unmet_i, ceil(X_i d_i) - held_i) best-placed GPUs near what it holds. A second pass in
//! the same order gives what is still free to anyone with unmet demand, so the policy is
//! work-conserving like every other.
//!
//! # Simplified relative to Gavel
//!
//! - One GPU type: Gavel's allocation X is per (job, accelerator type) with heterogeneous
//!   throughputs; here there is one type and throughput is the app's speed on its demand.
//! - Whole apps, not jobs: an app's X_i is a fraction of its total demand.
//! - Rounding per lease round: Gavel realises X over time with priority-based round-robin
//!   (priority = X divided by the share of rounds received so far); here each round rounds X
//!   into leases directly, and held GPUs count against the fair share.
//! - No space sharing, and Gavel's finish-time-fairness reference (an isolated 1/n share of
//!   the cluster) is replaced by Themis's T_id = T_cluster * N_avg, so rho is the same quantity
//!   the Themis auction uses.

use std::collections::BTreeMap;
use std::num::NonZeroU32;

use highs::{Col, HighsModelStatus, Model, RowProblem, Sense};

use super::{Contender, RoundView};
use crate::app::AppId;
use crate::auction::OfferedGpu;
use crate::fairness::{independent_finish_time, remaining_time};
use crate::leftover::{hand_out_in_order, Recipient};
use crate::topology::GpuId;

/// Relative tolerance of the bisection on t.
const RELATIVE_TOLERANCE: f64 = 1e-6;
/// The most bisection steps (LPs) per round.
const MAX_STEPS: usize = 60;
/// A bound this close above 1 is rounding error (t = t_lo exactly) and counts as 1.
const BOUND_SLACK: f64 = 1e-12;
/// Slack below an integer that still rounds down, so 3.0000001 GPUs count as 3.
const ROUNDING_SLACK: f64 = 1e-6;

/// The GPUs each contender gets under Gavel-FTF.
pub(super) fn allocate(view: &RoundView) -> BTreeMap<AppId, Vec<GpuId>> {
    let apps: Vec<FtfApp> = view
        .contenders
        .iter()
        .map(|contender| FtfApp::of(contender, view))
        .collect();
    let held: usize = view.contenders.iter().map(|c| c.holds.len()).sum();
    let capacity = (view.free.len() + held) as f64;
    let fractions = match minimax_fractions(&apps, capacity) {
        Ok(solution) => solution.fractions,
        Err(_) => equal_share(&apps, capacity),
    };
    round(view, &apps, &fractions)
}

/// What the LP needs to know about one contender.
#[derive(Debug, Clone, Copy, PartialEq)]
struct FtfApp {
    /// d_i: GPUs held plus unmet demand.
    demand: f64,
    /// Seconds to finish on the full demand.
    remaining: f64,
    /// Seconds since arrival.
    elapsed: f64,
    /// T_id, seconds.
    independent: f64,
}

impl FtfApp {
    fn of(contender: &Contender, view: &RoundView) -> Self {
        let demand = contender.holds.len() + contender.unmet_demand;
        let mut gpus = contender.holds.clone();
        gpus.resize(demand.max(gpus.len()), contender.anchor());
        Self {
            demand: demand as f64,
            remaining: remaining_time(
                contender.app,
                &gpus,
                &contender.fairness.speeds,
                contender.fairness.restart_pause_seconds,
            ),
            elapsed: view
                .now
                .saturating_since(contender.fairness.arrival)
                .as_secs_f64(),
            independent: independent_finish_time(&contender.fairness),
        }
    }

    /// Whether X affects rho at all; those that do not get no bound.
    fn is_bounded(&self) -> bool {
        self.demand > 0.0
            && self.remaining > 0.0
            && self.remaining.is_finite()
            && self.independent > 0.0
            && self.independent.is_finite()
            && self.elapsed.is_finite()
    }

    /// rho when running a fraction `x` of the time on the full demand.
    fn rho(&self, x: f64) -> f64 {
        if !self.is_bounded() {
            return 0.0;
        }
        if x <= 0.0 {
            return f64::INFINITY;
        }
        (self.elapsed + self.remaining / x) / self.independent
    }

    /// The least X with rho <= t (infinite when no X achieves it).
    fn lower_bound(&self, t: f64) -> f64 {
        if !self.is_bounded() {
            return 0.0;
        }
        let slack = t * self.independent - self.elapsed;
        if slack > 0.0 {
            self.remaining / slack
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
    /// X_i, in the contenders' order.
    fractions: Vec<f64>,
}

/// HiGHS did not give a usable answer.
#[derive(Debug, Clone, PartialEq)]
struct SolverFailure(String);

/// Minimises max_i rho_i(X) subject to sum_i X_i d_i <= capacity, X in [0, 1]^n.
fn minimax_fractions(apps: &[FtfApp], capacity: f64) -> Result<Fractions, SolverFailure> {
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
        .map(|(app, &x)| app.rho(x))
        .fold(lowest, f64::max);
    if !high.is_finite() {
        return Err(SolverFailure(format!(
            "no finite rho with capacity {capacity}"
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

/// X_i = min(1, capacity / (n d_i)): every app gets the same number of GPUs, at most its
/// demand. Always feasible; the fallback when HiGHS fails.
fn equal_share(apps: &[FtfApp], capacity: f64) -> Vec<f64> {
    let each = capacity.max(0.0) / apps.len().max(1) as f64;
    apps.iter()
        .map(|app| {
            if app.demand > 0.0 {
                (each / app.demand).min(1.0)
            } else {
                1.0
            }
        })
        .collect()
}

/// The LP "max sum w_i d_i X_i s.t. sum d_i X_i <= C, lower_i(t) <= X_i <= 1", kept between
/// bisection steps so each step only changes column bounds (and HiGHS starts from the last
/// basis).
struct FeasibilityProgram<'a> {
    apps: &'a [FtfApp],
    columns: Vec<Col>,
    /// `None` only while a solve is running.
    model: Option<Model>,
}

impl<'a> FeasibilityProgram<'a> {
    fn new(apps: &'a [FtfApp], capacity: f64) -> Result<Self, SolverFailure> {
        let n = apps.len() as f64;
        let mut by_full_demand_rho: Vec<usize> = (0..apps.len()).collect();
        // Best first, so the app furthest behind gets the highest rank (ties: lower index,
        // i.e. earlier in the round's standings, ranks higher).
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
        let mut problem = RowProblem::default();
        let columns: Vec<Col> = apps
            .iter()
            .zip(&weight)
            .map(|(app, &w)| problem.add_column(w * app.demand, 0.0..=1.0))
            .collect();
        let row: Vec<(Col, f64)> = columns
            .iter()
            .zip(apps)
            .map(|(&column, app)| (column, app.demand))
            .collect();
        problem.add_row(..=capacity.max(0.0), &row);
        let mut model = problem
            .try_optimise(Sense::Maximise)
            .map_err(|status| SolverFailure(format!("HiGHS rejected the model: {status:?}")))?;
        model.make_quiet();
        model.set_threads(NonZeroU32::MIN);
        Ok(Self {
            apps,
            columns,
            model: Some(model),
        })
    }

    fn is_feasible(&mut self, t: f64) -> Result<bool, SolverFailure> {
        self.solve_at(t).map(|fractions| fractions.is_some())
    }

    /// The LP's solution with every app's rho <= t, or `None` when that is infeasible.
    fn solve_at(&mut self, t: f64) -> Result<Option<Vec<f64>>, SolverFailure> {
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
        for (&column, &bound) in self.columns.iter().zip(&lower) {
            model.change_column_bounds(column, bound..=1.0);
        }
        let solved = model
            .try_solve()
            .map_err(|status| SolverFailure(format!("HiGHS error {status:?} at t = {t}")))?;
        let status = solved.status();
        let answer = match status {
            HighsModelStatus::Optimal => Some(
                solved
                    .get_solution()
                    .columns()
                    .iter()
                    .zip(&lower)
                    .map(|(&x, &bound)| x.clamp(bound, 1.0))
                    .collect(),
            ),
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
}

/// Rounds the fractions into this round's grants (see the module documentation).
fn round(view: &RoundView, apps: &[FtfApp], fractions: &[f64]) -> BTreeMap<AppId, Vec<GpuId>> {
    let contenders = &view.contenders;
    let share = |index: usize| fractions[index] * apps[index].demand;
    let mut order: Vec<usize> = (0..contenders.len()).collect();
    order.sort_by(|&a, &b| {
        let below = |index: usize| share(index) - contenders[index].holds.len() as f64;
        below(b).total_cmp(&below(a)).then_with(|| a.cmp(&b))
    });
    let mut pool: Vec<OfferedGpu> = view.free.to_vec();
    let first: Vec<Recipient> = order
        .iter()
        .map(|&index| {
            let contender = &contenders[index];
            let fair = (share(index) - ROUNDING_SLACK).ceil().max(0.0) as usize;
            Recipient {
                app: contender.app.id.clone(),
                unmet_demand: contender
                    .unmet_demand
                    .min(fair.saturating_sub(contender.holds.len())),
                holds: contender.holds.clone(),
                claimed: Vec::new(),
            }
        })
        .collect();
    let mut granted = hand_out_in_order(&mut pool, &first);
    if pool.is_empty() {
        return granted;
    }
    let location_of = |gpu: &GpuId| {
        view.free
            .iter()
            .find(|offered| &offered.id == gpu)
            .map(|offered| offered.location)
    };
    let second: Vec<Recipient> = order
        .iter()
        .map(|&index| {
            let contender = &contenders[index];
            let got = granted
                .get(&contender.app.id)
                .map_or(&[][..], Vec::as_slice);
            contender.recipient_after(got, location_of)
        })
        .collect();
    for (app, gpus) in hand_out_in_order(&mut pool, &second) {
        granted.entry(app).or_default().extend(gpus);
    }
    granted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(demand: f64, remaining: f64, elapsed: f64, independent: f64) -> FtfApp {
        FtfApp {
            demand,
            remaining,
            elapsed,
            independent,
        }
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
        let solution = minimax_fractions(apps, capacity).expect("HiGHS solves it");
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
        let solution = minimax_fractions(&apps, 4.0).expect("solved");
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
        let solution = minimax_fractions(&apps, 8.0).expect("solved");
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
        let solution = minimax_fractions(&apps, 5.0).expect("solved");
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
            let solution = minimax_fractions(&apps, capacity).expect("solved");
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
        let x = equal_share(&apps, 6.0);
        assert_eq!(x, vec![1.0, 3.0 / 8.0]);
        assert!(used(&apps, &x) <= 6.0);
    }
}
