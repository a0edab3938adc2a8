//! A Shockwave-style windowed market (Zheng et al., NSDI'23): plan the next few rounds at once,
//! with each app's utility following its forecast speed-ups, and apply the first round.
//!
//! # The program
//!
//! Over a window of [`WINDOW_ROUNDS`] rounds of one lease each, x_it is the number of GPUs app
//! i holds in round t (an integer, 0 to its demand d_i = held + unmet; at least what it holds
//! in the first round, since a lease is not taken back before it ends). Per round, the apps
//! hold at most C GPUs (the free ones plus those the contenders hold). App i's progress over
//! the window is y_i = sum_t u_it x_it in GPU-rounds at its mean forecast speed, where u_it
//! is its speed in round t relative to that mean ([`speed_profile`]): an app about to double
//! its batch size is worth more GPUs later. The market maximises
//!
//! ```text
//! sum_i w_i ln(1 + y_i)
//! ```
//!
//! (Nash social welfare over the window, with 1 + y_i so that an app left out is finite),
//! with w_i the app's finish-time fairness on an equal share of the cluster (Shockwave's
//! regulariser: the apps furthest behind their egalitarian finish weigh most). The logarithm
//! is the minimum of its tangents at 0, 1, 2, 4, ... up to the most progress possible, so the
//! program is a mixed-integer linear program, solved by HiGHS within a node budget (the best
//! solution found counts; HiGHS is deterministic at a node limit, unlike a time limit). Plans
//! worth the same over the window can differ in their first round (with one speed, 3 + 1 GPUs
//! now and 1 + 3 later is worth 2 + 2 twice): the first round's own welfare, at a weight of
//! 1e-3, breaks that tie towards the fairest first round.
//!
//! # Applying it
//!
//! Each app is granted x_i1 - held_i free GPUs, the apps with the largest weight first, each
//! from the best-placed GPUs near what it holds; what is left goes to the apps with unmet
//! demand in the same order (work conservation, as every baseline does). If HiGHS fails, every
//! app's x_i1 is its equal share.

use std::collections::BTreeMap;

use highs::{Col, HighsModelStatus, RowProblem, Sense};

use super::{hand_out_the_rest, Contender, RoundView};
use crate::app::{AppId, Job};
use crate::fairness::rho;
use crate::leftover::{hand_out_in_order, Recipient};
use crate::topology::{GpuId, GpuLocation};

/// Rounds planned at once (Shockwave plans over a window of future rounds; ours is three
/// leases).
pub const WINDOW_ROUNDS: usize = 3;

/// The weight of the first round's own welfare, relative to the window's: a tie-break.
const FIRST_ROUND_WEIGHT: f64 = 1e-3;

/// Branch-and-bound nodes HiGHS may explore; its best solution then counts.
const NODE_BUDGET: i32 = 5_000;

pub(super) fn allocate(view: &RoundView) -> BTreeMap<AppId, Vec<GpuId>> {
    let contenders = &view.contenders;
    if contenders.is_empty() || view.free.is_empty() {
        return BTreeMap::new();
    }
    let held: usize = contenders.iter().map(|c| c.holds.len()).sum();
    let capacity = view.free.len() + held;
    let equal = (capacity / contenders.len()).max(1);
    let apps: Vec<WindowApp> = contenders
        .iter()
        .map(|contender| WindowApp::of(contender, equal))
        .collect();
    let first_round = plan(&apps, capacity).unwrap_or_else(|| {
        apps.iter()
            .map(|app| app.held.max(app.demand.min(equal)))
            .collect()
    });
    grant(view, &apps, &first_round)
}

/// What the program needs to know about one contender.
#[derive(Debug, Clone, PartialEq)]
struct WindowApp {
    held: usize,
    demand: usize,
    /// w_i: finish-time fairness on an equal share.
    weight: f64,
    /// u_it for t in the window.
    speeds: Vec<f64>,
}

impl WindowApp {
    fn of(contender: &Contender, equal: usize) -> Self {
        let held = contender.holds.len();
        let demand = held + contender.unmet_demand;
        let share = demand.min(equal).max(1);
        let mut gpus: Vec<GpuLocation> = contender.holds.iter().copied().take(share).collect();
        gpus.resize(share, contender.anchor());
        let weight = rho(contender.app, &gpus, &contender.fairness)
            .map_or(1.0, |rho| rho.get())
            .clamp(1e-3, 1e3);
        let lease = contender.lease_seconds;
        let speeds = speed_profile(contender, share as f64 * lease);
        Self {
            held,
            demand,
            weight,
            speeds,
        }
    }
}

/// u_it: the app's speed in each round of the window relative to its mean over the rest of
/// its work, if it advanced `per_round` GPU-seconds each round: the speed of its job with the
/// most work left, at the iteration that job would reach (the app's GPU time spread over its
/// jobs in proportion to their work). 1 in every round for an app whose jobs keep one speed.
fn speed_profile(contender: &Contender, per_round: f64) -> Vec<f64> {
    let app = contender.app;
    let total_work = app.remaining_work_gpu_seconds();
    let jobs = app.jobs();
    let representative = jobs
        .iter()
        .filter(|job| job.is_active() && !job.speed_changes.is_empty())
        .max_by(|a, b| {
            let left = |job: &Job| {
                job.serial_seconds(job.completed_iterations as f64, job.total_iterations as f64)
            };
            left(a).total_cmp(&left(b))
        });
    let Some(job) = representative.filter(|_| total_work > 0.0) else {
        return vec![1.0; WINDOW_ROUNDS];
    };
    let from = job.completed_iterations as f64;
    let to = job.total_iterations as f64;
    let mean = job.serial_seconds(from, to) / (to - from);
    let job_work = job.serial_seconds(from, to);
    (0..WINDOW_ROUNDS)
        .map(|round| {
            // The share of the app's work done before this round, applied to this job.
            let done = (round as f64 * per_round / total_work).min(1.0) * job_work;
            mean / job.serial_iteration_time_at(iteration_after(job, from, done))
        })
        .collect()
}

/// The iteration `job` reaches from `from` after `seconds` of serial work.
fn iteration_after(job: &Job, from: f64, seconds: f64) -> f64 {
    let mut iteration = from;
    let mut left = seconds;
    while left > 0.0 && iteration < job.total_iterations as f64 {
        let end = job
            .next_speed_change(iteration)
            .map_or(job.total_iterations as f64, |at| at as f64);
        let phase = job.serial_seconds(iteration, end);
        if phase >= left {
            return iteration + left / job.serial_iteration_time_at(iteration);
        }
        left -= phase;
        iteration = end;
    }
    iteration
}

/// x_i1 for every app, from the windowed program; `None` when HiGHS gives no solution.
fn plan(apps: &[WindowApp], capacity: usize) -> Option<Vec<usize>> {
    let mut problem = RowProblem::default();
    let mut x = Vec::with_capacity(apps.len());
    for app in apps {
        let columns: Vec<_> = (0..WINDOW_ROUNDS)
            .map(|round| {
                let low = if round == 0 { app.held } else { 0 };
                problem.add_integer_column(0.0, low as f64..=app.demand as f64)
            })
            .collect();
        let window: Vec<_> = columns
            .iter()
            .copied()
            .zip(app.speeds.iter().copied())
            .collect();
        let most =
            |terms: &[(Col, f64)]| terms.iter().map(|(_, u)| u).sum::<f64>() * app.demand as f64;
        add_log(&mut problem, app.weight, &window, most(&window));
        // Plans worth the same over the window may differ in their first round, the one
        // applied: among them, the one whose first round is itself the fairest.
        let first = &window[..1];
        add_log(
            &mut problem,
            FIRST_ROUND_WEIGHT * app.weight,
            first,
            most(first),
        );
        x.push(columns);
    }
    for round in 0..WINDOW_ROUNDS {
        let row: Vec<_> = x.iter().map(|columns| (columns[round], 1.0)).collect();
        problem.add_row(..=capacity as f64, row);
    }
    let mut model = problem.optimise(Sense::Maximise);
    model.make_quiet();
    model.set_threads(std::num::NonZeroU32::MIN);
    model.set_option("mip_max_nodes", NODE_BUDGET);
    model.set_option("mip_rel_gap", 1e-6);
    let solved = crate::highs_run::try_solve(model).ok()?;
    // Past its node budget HiGHS stops at a limit with its best solution so far.
    let usable = matches!(
        solved.status(),
        HighsModelStatus::Optimal
            | HighsModelStatus::ReachedSolutionLimit
            | HighsModelStatus::ReachedIterationLimit
    );
    if !usable || !solved.objective_value().is_finite() {
        return None;
    }
    let values = solved.get_solution().columns().to_vec();
    // Each app's columns are its x_it for the window, then its two z.
    let per_app = WINDOW_ROUNDS + 2;
    (0..apps.len())
        .map(|i| values.get(i * per_app).map(|x| x.round().max(0.0) as usize))
        .collect()
}

/// A column z worth `weight` in the objective with z <= ln(1 + y), y = sum of `terms`
/// (column, coefficient): the minimum of the logarithm's tangents at 0, 1, 2, 4, ... up to
/// `most`, the largest y possible.
fn add_log(problem: &mut RowProblem, weight: f64, terms: &[(Col, f64)], most: f64) {
    let z = problem.add_column(weight, f64::NEG_INFINITY..=f64::INFINITY);
    let mut point = 0.0_f64;
    loop {
        let slope = 1.0 / (1.0 + point);
        let mut row: Vec<_> = vec![(z, 1.0)];
        row.extend(terms.iter().map(|&(column, u)| (column, -slope * u)));
        problem.add_row(..=(1.0 + point).ln() - slope * point, row);
        if point >= most {
            break;
        }
        point = if point == 0.0 { 1.0 } else { point * 2.0 };
    }
}

/// Grants each app `first_round - held` free GPUs, heaviest first, then what is left to apps
/// with unmet demand in the same order.
fn grant(
    view: &RoundView,
    apps: &[WindowApp],
    first_round: &[usize],
) -> BTreeMap<AppId, Vec<GpuId>> {
    let contenders = &view.contenders;
    let mut order: Vec<usize> = (0..contenders.len()).collect();
    order.sort_by(|&a, &b| apps[b].weight.total_cmp(&apps[a].weight).then(a.cmp(&b)));
    let mut pool = view.free.to_vec();
    let planned: Vec<Recipient> = order
        .iter()
        .map(|&i| {
            let contender = &contenders[i];
            Recipient {
                app: contender.app.id.clone(),
                unmet_demand: first_round[i]
                    .saturating_sub(apps[i].held)
                    .min(contender.unmet_demand),
                holds: contender.holds.clone(),
                claimed: Vec::new(),
            }
        })
        .collect();
    let granted = hand_out_in_order(&mut pool, &planned);
    hand_out_the_rest(view, &order, &mut pool, granted)
}
