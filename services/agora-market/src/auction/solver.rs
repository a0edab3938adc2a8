//! The auction's binary programs, solved by HiGHS.
//!
//! A naive formulation (one column per bid, one row per GPU, N + 1 full solves) is as slow as
//! the paper. This one exploits the structure:
//! - interchangeable GPUs are aggregated into classes with a capacity, so a row is a class;
//! - a class whose total demand fits its capacity cannot cause a conflict and gets no row;
//! - bidders are split into independent components of the conflict graph (bidders linked by
//!   contested classes); a component of one bidder needs no solver at all;
//! - the payment of bidder i re-solves only i's component without i. (Passing x* minus i to
//!   HiGHS as a MIP start was measured to make these solves slower, so none is passed; see
//!   BENCHMARKS.md.)
//! - all programs of a stage run in parallel, one HiGHS thread each.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use highs::{HighsModelStatus, RowProblem, Sense};

use super::{AuctionError, Choice, Instance};

/// The PF choice and every bidder's hidden-payment share c_i.
#[derive(Debug)]
pub(super) struct Solution {
    pub options: Choice,
    pub shares: Vec<f64>,
}

pub(super) fn solve(instance: &Instance) -> Result<Solution, AuctionError> {
    let contested = contested_classes(instance);
    let components = conflict_components(instance, &contested);
    let context = Context {
        instance,
        contested: &contested,
    };
    let pf_choices = tracing::info_span!("pf_solve", components = components.len())
        .in_scope(|| parallel_map(&components, |members| pf_choice(&context, members)));
    let mut options: Choice = vec![None; instance.bidders.len()];
    for (members, choice) in components.iter().zip(pf_choices) {
        for (&member, option) in members.iter().zip(choice?) {
            options[member] = option;
        }
    }
    // Only winners in components of two or more bidders pay anything.
    let payers: Vec<(usize, &Vec<usize>)> = components
        .iter()
        .filter(|members| members.len() > 1)
        .flat_map(|members| {
            members
                .iter()
                .filter(|&&m| options[m].is_some())
                .map(move |&m| (m, members))
        })
        .collect();
    // The solves run on worker threads, so each names its parent span explicitly.
    let payments = tracing::info_span!("payment_solves", payers = payers.len());
    let payer_shares = payments.in_scope(|| {
        parallel_map(&payers, |&(payer, members)| {
            let app = &instance.bidders[payer].bid.app;
            tracing::info_span!(parent: &payments, "payment_solve", %app)
                .in_scope(|| payment_share(&context, members, payer, &options))
        })
    });
    let mut shares = vec![1.0; instance.bidders.len()];
    for (&(payer, _), share) in payers.iter().zip(payer_shares) {
        shares[payer] = share?;
    }
    Ok(Solution { options, shares })
}

/// The instance and what is known about it before any program is solved.
#[derive(Clone, Copy)]
struct Context<'a, 'i> {
    instance: &'a Instance<'i>,
    /// Classes whose total demand (each bidder's largest count in it) exceeds the capacity.
    /// Only these can make bundles conflict, so only these get rows.
    contested: &'a [bool],
}

fn contested_classes(instance: &Instance) -> Vec<bool> {
    let classes = instance.capacity.len();
    let mut peak_demand = vec![0u32; classes];
    for bidder in &instance.bidders {
        let mut bidder_peak = vec![0u32; classes];
        for option in &bidder.options {
            for &(class, count) in &option.counts {
                bidder_peak[class] = bidder_peak[class].max(count);
            }
        }
        for (total, peak) in peak_demand.iter_mut().zip(bidder_peak) {
            *total += peak;
        }
    }
    peak_demand
        .iter()
        .zip(&instance.capacity)
        .map(|(demand, capacity)| demand > capacity)
        .collect()
}

/// Groups bidders that compete, directly or transitively, for a contested class.
fn conflict_components(instance: &Instance, contested: &[bool]) -> Vec<Vec<usize>> {
    let classes = instance.capacity.len();
    let mut parent: Vec<usize> = (0..instance.bidders.len()).collect();
    let mut first_bidder_of_class: Vec<Option<usize>> = vec![None; classes];
    for (index, bidder) in instance.bidders.iter().enumerate() {
        for option in &bidder.options {
            for &(class, _) in option.counts.iter().filter(|(class, _)| contested[*class]) {
                match first_bidder_of_class[class] {
                    Some(first) => union(&mut parent, first, index),
                    None => first_bidder_of_class[class] = Some(index),
                }
            }
        }
    }
    let mut components: Vec<Vec<usize>> = Vec::new();
    let mut component_of_root = vec![usize::MAX; parent.len()];
    for index in 0..parent.len() {
        let root = find(&mut parent, index);
        if component_of_root[root] == usize::MAX {
            component_of_root[root] = components.len();
            components.push(Vec::new());
        }
        components[component_of_root[root]].push(index);
    }
    components
}

fn find(parent: &mut [usize], mut node: usize) -> usize {
    while parent[node] != node {
        parent[node] = parent[parent[node]];
        node = parent[node];
    }
    node
}

fn union(parent: &mut [usize], a: usize, b: usize) {
    let (root_a, root_b) = (find(parent, a), find(parent, b));
    if root_a != root_b {
        parent[root_a.max(root_b)] = root_a.min(root_b);
    }
}

/// The PF choice within one component, in `members` order: lexicographic maximum Nash
/// welfare (see [`tiered_weight`]).
fn pf_choice(context: &Context, members: &[usize]) -> Result<Vec<Option<usize>>, AuctionError> {
    if let [only] = members {
        return Ok(vec![best_alone(context.instance, *only)]);
    }
    let weight = tiered_weight(context.instance, members);
    Program::new(context, members, None, weight).solve("proportional-fair")
}

/// Column weights of the lexicographic objective over `members`: first serve as many starving
/// bidders as possible, then maximise the sum of log-valuations. The first tier is a weight on
/// each starving bidder's columns larger than any difference the second tier can make.
fn tiered_weight<'a>(
    instance: &'a Instance,
    members: &[usize],
) -> impl Fn(usize, usize) -> f64 + 'a {
    let largest_gain = |&member: &usize| {
        let options = 0..instance.bidders[member].options.len();
        options
            .map(|option| instance.gain(member, option).abs())
            .fold(0.0, f64::max)
    };
    let tier = 2.0 * members.iter().map(largest_gain).sum::<f64>() + 1.0;
    move |member, option| {
        let starving_bonus = if instance.bidders[member].is_starving() {
            tier
        } else {
            0.0
        };
        starving_bonus + instance.gain(member, option)
    }
}

/// A bidder alone in its component takes its best option (the starving take any).
fn best_alone(instance: &Instance, member: usize) -> Option<usize> {
    let options = &instance.bidders[member].options;
    (0..options.len()).max_by(|&a, &b| {
        instance
            .gain(member, a)
            .total_cmp(&instance.gain(member, b))
            .then(b.cmp(&a))
    })
}

/// c_i = prod_{j != i} v_j(x*) / prod_{j != i} v_j(x*_{-i}), computed in logs over i's
/// component (the other components are the same in both solutions and cancel). x*_{-i} serves
/// as many starving bidders as x* does, so the comparison stays within one tier of the
/// lexicographic objective and c_i stays in (0, 1] (docs/mechanism.md).
///
/// x*_{-i} is the others' lexicographic optimum. When i is not starving it serves that many
/// starving bidders by itself (if the others could serve more without i, x* could too, by giving
/// i nothing); when i is starving, an upper bound on the count keeps it there.
fn payment_share(
    context: &Context,
    members: &[usize],
    payer: usize,
    options: &Choice,
) -> Result<f64, AuctionError> {
    let instance = context.instance;
    let others: Vec<usize> = members.iter().copied().filter(|&m| m != payer).collect();
    let welfare = |choice: &mut dyn Iterator<Item = (usize, Option<usize>)>| -> f64 {
        choice
            .map(|(member, option)| option.map_or(0.0, |o| instance.gain(member, o)))
            .sum()
    };
    let with_payer = welfare(&mut others.iter().map(|&m| (m, options[m])));
    let starving_served = others
        .iter()
        .filter(|&&m| instance.bidders[m].is_starving() && options[m].is_some())
        .count();
    let starving_cap = instance.bidders[payer]
        .is_starving()
        .then_some(starving_served);
    let program = Program::new(
        context,
        &others,
        starving_cap,
        tiered_weight(instance, &others),
    );
    let without_payer_choice = program.solve("payment")?;
    let without_payer = welfare(&mut others.iter().copied().zip(without_payer_choice));
    // The PF solution minus the payer is feasible without the payer, so the optimum is at least
    // as good; a smaller value can only be solver tolerance.
    Ok((with_payer - without_payer).min(0.0).exp())
}

/// One binary program over a set of bidders: a column per (bidder, option), at most one option
/// per bidder, class capacities on contested classes.
struct Program<'a, 'i> {
    instance: &'a Instance<'i>,
    contested: &'a [bool],
    members: &'a [usize],
    /// (member position, option) of each column.
    columns: Vec<(usize, usize)>,
    costs: Vec<f64>,
    /// When set, at most this many starving members may be served.
    starving_cap: Option<usize>,
}

impl<'a, 'i> Program<'a, 'i> {
    fn new(
        context: &Context<'a, 'i>,
        members: &'a [usize],
        starving_cap: Option<usize>,
        weight: impl Fn(usize, usize) -> f64,
    ) -> Self {
        let instance = context.instance;
        let mut columns = Vec::new();
        let mut costs = Vec::new();
        for (position, &member) in members.iter().enumerate() {
            for option in 0..instance.bidders[member].options.len() {
                columns.push((position, option));
                costs.push(weight(member, option));
            }
        }
        Self {
            instance,
            contested: context.contested,
            members,
            columns,
            costs,
            starving_cap,
        }
    }

    fn solve(&self, program: &'static str) -> Result<Vec<Option<usize>>, AuctionError> {
        let mut choice = vec![None; self.members.len()];
        if self.columns.is_empty() {
            return Ok(choice);
        }
        let mut problem = RowProblem::default();
        let columns: Vec<highs::Col> = self
            .costs
            .iter()
            .map(|&cost| problem.add_integer_column(cost, 0..=1))
            .collect();
        let mut per_member: Vec<Vec<(highs::Col, f64)>> = vec![Vec::new(); self.members.len()];
        let mut per_class: Vec<Vec<(highs::Col, f64)>> =
            vec![Vec::new(); self.instance.capacity.len()];
        let mut starving: Vec<(highs::Col, f64)> = Vec::new();
        for (&column, &(position, option)) in columns.iter().zip(&self.columns) {
            let bidder = &self.instance.bidders[self.members[position]];
            per_member[position].push((column, 1.0));
            for &(class, count) in &bidder.options[option].counts {
                per_class[class].push((column, f64::from(count)));
            }
            if bidder.is_starving() {
                starving.push((column, 1.0));
            }
        }
        for row in per_member.iter().filter(|row| row.len() > 1) {
            problem.add_row(..=1.0, row);
        }
        for (class, row) in per_class
            .iter()
            .enumerate()
            .filter(|(class, _)| self.contested[*class])
        {
            problem.add_row(..=f64::from(self.instance.capacity[class]), row);
        }
        if let Some(cap) = self.starving_cap.filter(|_| !starving.is_empty()) {
            problem.add_row(..=cap as f64, &starving);
        }
        let mut model = problem.optimise(Sense::Maximise);
        model.make_quiet();
        model.set_threads(NonZeroU32::MIN);
        model.set_option("mip_rel_gap", 0.0);
        model.set_option("mip_abs_gap", 1e-9);
        // Profiled (BENCHMARKS.md): on these small packing programs presolve and two root
        // heuristics cost more than they save; feasibility jump has a fixed effort floor.
        model.set_option("presolve", "off");
        model.set_option("mip_heuristic_run_feasibility_jump", false);
        model.set_option("mip_heuristic_run_root_reduced_cost", false);
        let solved = model.try_solve().map_err(|status| AuctionError::Solver {
            program,
            detail: format!("{status:?}"),
        })?;
        if solved.status() != HighsModelStatus::Optimal {
            return Err(AuctionError::Solver {
                program,
                detail: format!("ended with status {:?}", solved.status()),
            });
        }
        let solution = solved.get_solution();
        for (&value, &(position, option)) in solution.columns().iter().zip(&self.columns) {
            if value > 0.5 {
                choice[position] = Some(option);
            }
        }
        Ok(choice)
    }
}

/// Maps `f` over `items` on all available cores, keeping order. Each call is independent, so
/// the results do not depend on scheduling.
fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(items.len());
    if workers <= 1 {
        return items.iter().map(f).collect();
    }
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(item) = items.get(index) else { break };
                let result = f(item);
                *results[index]
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(result);
            });
        }
    });
    results
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .expect("every item is mapped")
        })
        .collect()
}
