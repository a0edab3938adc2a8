//! The auction's programs, solved by HiGHS.
//!
//! A naive formulation (one column per bid, one row per GPU, N + 1 full solves) is as slow as
//! the paper. This one exploits the structure:
//! - interchangeable GPUs are aggregated into classes with a capacity, so a row is a class;
//! - a class whose total demand fits its capacity cannot cause a conflict and gets no row;
//! - bidders are split into independent components of the conflict graph (bidders linked by
//!   contested classes); a component of one bidder needs no solver at all;
//! - every program is first solved as its LP relaxation; when the LP optimum is integral it is
//!   the binary program's optimum too, and no branch and bound runs; nor when the LP optimum
//!   rounded and improved by local moves ([`improve`]) attains the LP bound;
//! - the payment of bidder i re-solves only i's component without i, on one LP model per
//!   group of payers that only changes the payer's column bounds between payments, so each
//!   re-solve is a few dual simplex iterations from the previous basis; a winner whose bundle
//!   uses no contested class pays nothing (c_i = 1) without any solve;
//! - a payment is needed only as precisely as its rounding to whole GPUs (the draws are made
//!   first): the PF solution minus the payer (improved by local moves, then also the LP
//!   optimum rounded) below, and above the bound the PF choice's own LP duals give without
//!   the payer ([`DualBound`], no solve) and then, only if needed, the LP re-solved without
//!   it and tightened by zero-half cuts ([`zero_half_cuts`]), bracket c_i; when every share in
//!   the bracket keeps the same GPUs, no binary program runs;
//! - otherwise binary programs decide, one rounding threshold at a time, whether the others'
//!   optimum without the payer exceeds it (a cut-off search that stops at the first better
//!   solution), within a deterministic budget of programs and branch-and-bound nodes, and only
//!   in components up to a fixed size ([`PaymentBudget`]);
//!   past it, the payer pays against the LP relaxation (the LP counterfactual, never less
//!   than the exact payment) and is reported as a fallback (docs/mechanism.md);
//! - a PF program's branch and bound has a deterministic budget of nodes ([`PfBudget`]) that
//!   bids following the topology never reach; a component past it keeps the best choice found
//!   and is reported as a PF fallback, and its payments neither dive nor run binary programs;
//! - the groups of payers, and the components' PF programs, run in parallel, one HiGHS thread
//!   each.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::ops::Range;

use highs::{Col, HighsModelStatus, HighsSolutionStatus, Model, RowProblem, Sense};
use serde::{Deserialize, Serialize};

use super::cuts::{zero_half_cuts, PackingRow};
use super::{AuctionError, Choice, Instance, Rounding};
use crate::parallel::parallel_map;

/// The most payments of one component that share one LP model (and one worker). Fixed, not
/// derived from the number of cores, so that which basis each re-solve starts from, and hence
/// every result, is the same on every machine.
const PAYERS_PER_MODEL: usize = 8;
/// The fewest LP models a component's payments are split over (when it has that many), so
/// that a few open payments still run on two workers. Fixed for the same reason.
const MODELS_PER_COMPONENT: usize = 2;

/// How much branch and bound the payments of one auction may use: how many binary programs in
/// all, how many nodes each, and in components up to which size. Counted in programs, nodes
/// and columns, not seconds, so that a replay of the auction takes the same decisions on any
/// machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaymentBudget {
    /// Binary programs the auction's payments may run together. A program costs about as much
    /// as the PF choice itself, so this bounds the payments' time by a few PF solves.
    pub programs: usize,
    pub branch_and_bound_nodes: u32,
    /// The largest component, in members times columns, whose payments may run programs; the
    /// open payments of larger ones fall back. A program over such a component took 0.2-0.6 s
    /// at 4096 GPUs and decided one payment in a round (BENCHMARKS.md).
    pub largest_component: usize,
}

impl Default for PaymentBudget {
    /// Measured in BENCHMARKS.md: enough for the payments of most rounds of 256 GPUs, and a
    /// bound on the few that would otherwise run dozens of programs.
    fn default() -> Self {
        Self {
            programs: DEFAULT_PAYMENT_PROGRAMS,
            branch_and_bound_nodes: 2_000,
            largest_component: LARGE_COMPONENT,
        }
    }
}

const DEFAULT_PAYMENT_PROGRAMS: usize = 4;

/// How much branch and bound each PF program may use, counted in nodes (not seconds) so that a
/// replay reaches the same choice on any machine. A component whose program runs out keeps the
/// best choice found so far (see [`PfStats::fallbacks`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfBudget {
    pub branch_and_bound_nodes: u32,
}

impl Default for PfBudget {
    fn default() -> Self {
        Self {
            branch_and_bound_nodes: DEFAULT_PF_NODES,
        }
    }
}

/// Nodes per PF program. Every PF program of the round and auction benchmarks ends within 7
/// nodes (BENCHMARKS.md), and the shipped workloads' outcomes are the same with this budget
/// (digests); bundles drawn anywhere (bids a tenant may post) make programs of 20 bidders
/// need thousands, at 5-80 ms each, and would hold a round for minutes.
const DEFAULT_PF_NODES: u32 = 50;

/// How the PF choice was found, per component.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PfStats {
    /// Independent components of the conflict graph.
    pub components: usize,
    /// Components of one bidder, which takes its best option without a solver.
    pub alone: usize,
    /// Components whose LP relaxation proved the optimum: its optimum was integral, or the
    /// LP optimum rounded attained its value.
    pub by_relaxation: usize,
    /// Components that needed branch and bound.
    pub by_branch_and_bound: usize,
    /// Components whose branch and bound ran out of its [`PfBudget`]: their choice is the best
    /// found, not proved optimal, and their payments neither dive nor run binary programs.
    #[serde(default)]
    pub fallbacks: usize,
}

/// How the hidden payments were found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentStats {
    /// PF winners in components of two or more bidders (the others pay nothing by definition).
    pub payers: usize,
    /// Payments settled without branch and bound: the payer's bundle uses no contested class,
    /// the LP relaxation without the payer proves c_i, or its bound brackets c_i tightly
    /// enough for the rounding.
    pub certified: usize,
    /// Payments that needed branch and bound and finished within the budget.
    pub solved: usize,
    /// Payments that did not finish within the budget: c_i against the LP counterfactual.
    pub fallbacks: usize,
    /// Of the settled payments, those known to an interval rather than exactly.
    pub bounded: usize,
    /// Binary programs run to decide payments.
    pub programs: usize,
}

/// A hidden-payment share c_i, known exactly (`low == high`) or to a certified interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ShareBounds {
    pub low: f64,
    pub high: f64,
}

impl ShareBounds {
    fn exact(share: f64) -> Self {
        Self {
            low: share,
            high: share,
        }
    }

    pub fn is_exact(&self) -> bool {
        self.low == self.high
    }
}

/// Every bidder's hidden-payment share c_i.
#[derive(Debug)]
pub(super) struct Shares {
    pub shares: Vec<ShareBounds>,
    /// Bidders whose payment fell back to the LP counterfactual.
    pub fallback: Vec<bool>,
    pub stats: PaymentStats,
}

/// The conflict structure of an instance, known before any program is solved.
#[derive(Debug)]
pub(super) struct Structure {
    /// Classes whose total demand (each bidder's largest count in it) exceeds the capacity.
    /// Only these can make bundles conflict, so only these get rows.
    contested: Vec<bool>,
    /// Bidders that compete, directly or transitively, for a contested class.
    components: Vec<Vec<usize>>,
}

impl Structure {
    pub fn of(instance: &Instance) -> Self {
        let contested = contested_classes(instance);
        let components = conflict_components(instance, &contested);
        Self {
            contested,
            components,
        }
    }
}

/// The PF choice: lexicographic maximum Nash welfare (see [`pf_choice`]), per component.
pub(super) fn proportional_fair(
    instance: &Instance,
    structure: &Structure,
    budget: PfBudget,
) -> Result<Pf, AuctionError> {
    let context = Context {
        instance,
        contested: &structure.contested,
    };
    let components = &structure.components;
    let choices = tracing::info_span!("pf_solve", components = components.len())
        .in_scope(|| parallel_map(components, |members| pf_choice(&context, members, budget)));
    let mut pf = Pf {
        options: vec![None; instance.bidders.len()],
        fell_back: vec![false; components.len()],
        duals: Vec::with_capacity(components.len()),
        stats: PfStats {
            components: components.len(),
            ..PfStats::default()
        },
    };
    for ((members, component), fell_back) in components.iter().zip(choices).zip(&mut pf.fell_back) {
        let PfComponent {
            choice,
            method,
            dual,
        } = component?;
        pf.duals.push(dual);
        let stats = &mut pf.stats;
        match method {
            Method::Alone => stats.alone += 1,
            Method::Relaxation => stats.by_relaxation += 1,
            Method::BranchAndBound => stats.by_branch_and_bound += 1,
            Method::Fallback => {
                stats.fallbacks += 1;
                *fell_back = true;
            }
        }
        for (&member, option) in members.iter().zip(choice) {
            pf.options[member] = option;
        }
    }
    Ok(pf)
}

/// The PF choice of every bidder, and which components' choices are only the best found.
#[derive(Debug, Clone)]
pub(super) struct Pf {
    pub options: Choice,
    /// By component, in [`Structure`] order: whether its branch and bound ran out of budget.
    pub fell_back: Vec<bool>,
    /// By component: its welfare LP's bounds on the program without each member, which the
    /// payments try before re-solving anything (`None` for a bidder alone).
    duals: Vec<Option<DualBound>>,
    pub stats: PfStats,
}

impl Pf {
    /// By bidder: whether its component kept a choice not proved optimal.
    pub fn bidders_fell_back(&self, structure: &Structure) -> Vec<bool> {
        let mut bidders = vec![false; self.options.len()];
        for (members, _) in structure
            .components
            .iter()
            .zip(&self.fell_back)
            .filter(|(_, fell_back)| **fell_back)
        {
            for &member in members {
                bidders[member] = true;
            }
        }
        bidders
    }
}

/// Every bidder's share c_i given the PF choice `pf`, as precisely as each winner's
/// `roundings` needs. Only winners in components of two or more bidders pay anything.
///
/// Every payment is screened first (LP bounds and cheap choices, in parallel per group of
/// payers); the payments whose bracket leaves the GPUs kept open then share the budget's
/// binary programs, most GPUs at stake first, and the others fall back to the LP
/// counterfactual. So do those of a component whose PF choice fell back: its program is one
/// branch and bound cannot finish, and each payment's would be as hard.
pub(super) fn payments(
    instance: &Instance,
    structure: &Structure,
    pf: &Pf,
    roundings: &[Option<Rounding>],
    budget: PaymentBudget,
) -> Result<Shares, AuctionError> {
    let context = Context {
        instance,
        contested: &structure.contested,
    };
    let options = &pf.options;
    let payers: Vec<Payer> = (structure.components.iter())
        .zip(&pf.fell_back)
        .zip(&pf.duals)
        .filter_map(|((members, fell_back), dual)| Some((members, *fell_back, dual.as_ref()?)))
        .enumerate()
        .flat_map(|(component, (members, fell_back, dual))| {
            (0..members.len())
                .filter(|&position| options[members[position]].is_some())
                .map(move |position| Payer {
                    component,
                    members,
                    position,
                    programs_allowed: !fell_back,
                    dual,
                })
        })
        .collect();
    let span = tracing::info_span!("payment_solves", payers = payers.len());
    // Every payment is first bracketed without a solve; only those the bracket leaves open
    // share LP models, so that no model is built and solved cold for payments the bounds
    // settle (a group's first LP solve took about 65% of the payments' LP time at 4096 GPUs).
    let bounded = span.in_scope(|| {
        parallel_map(&payers, |payer| {
            bound_payment(&context, *payer, options, roundings)
        })
    });
    let mut settled: Vec<(usize, Payment)> = Vec::with_capacity(payers.len());
    let mut pending: Vec<PendingPayment> = Vec::new();
    for bounded in bounded {
        match bounded {
            Bounded::Settled(payer, payment) => settled.push((payer, payment)),
            Bounded::Pending(payment) => pending.push(payment),
        }
    }
    let groups: Vec<&[PendingPayment]> = pending
        .chunk_by(|a, b| a.component == b.component)
        .flat_map(model_groups)
        .collect();
    let screened =
        span.in_scope(|| parallel_map(&groups, |group| screen_group(&context, group, &span)));
    let mut open: Vec<OpenPayment> = Vec::new();
    for screens in screened {
        for (payer, screen) in screens? {
            match screen {
                Screen::Settled(payment) => settled.push((payer, payment)),
                Screen::Open(payment) => open.push(payment),
            }
        }
    }
    let allotted = allot_programs(&open, budget);
    let decided = span.in_scope(|| {
        parallel_map(&allotted, |&(index, programs)| {
            let payment = &open[index];
            let decision = if programs > 0 {
                payment.decide(&context, budget)
            } else {
                Ok(payment.bracket.fall_back(0))
            };
            decision.map(|decision| (payment.payer, decision))
        })
    });
    for decision in decided {
        settled.push(decision?);
    }
    Ok(tally(instance.bidders.len(), settled))
}

/// One component's pending payments split, in order, into groups of nearly equal size that
/// each share one LP model: at most [`PAYERS_PER_MODEL`] a group, and at least
/// [`MODELS_PER_COMPONENT`] groups.
fn model_groups<T>(payments: &[T]) -> impl Iterator<Item = &[T]> {
    let groups = payments
        .len()
        .div_ceil(PAYERS_PER_MODEL)
        .max(MODELS_PER_COMPONENT)
        .min(payments.len());
    let (size, larger) = (payments.len() / groups, payments.len() % groups);
    let mut rest = payments;
    (0..groups).map(move |group| {
        let (head, tail) = rest.split_at(size + usize::from(group < larger));
        rest = tail;
        head
    })
}

/// The shares of `settled` payments (by payer) and how they were found.
fn tally(bidders: usize, settled: Vec<(usize, Payment)>) -> Shares {
    let mut shares = Shares {
        shares: vec![ShareBounds::exact(1.0); bidders],
        fallback: vec![false; bidders],
        stats: PaymentStats::default(),
    };
    for (payer, payment) in settled {
        let stats = &mut shares.stats;
        stats.payers += 1;
        stats.programs += payment.programs;
        shares.shares[payer] = payment.share;
        if payment.fell_back {
            stats.fallbacks += 1;
            shares.fallback[payer] = true;
            continue;
        }
        stats.bounded += usize::from(!payment.share.is_exact());
        if payment.programs == 0 {
            stats.certified += 1;
        } else {
            stats.solved += 1;
        }
    }
    shares
}

/// Which open payments may run binary programs within the budget's programs, as (index into
/// `open`, programs allotted): each payment of a component no larger than the budget allows is
/// allotted the most its bisection can take, most GPUs at stake first (ties: the narrower LP
/// bracket, then the payer's place in the content order, never its name), until the budget is
/// spent. Allotting the worst case up front keeps the choice independent of what the programs
/// find, so the payments can run in parallel and a replay takes the same decisions.
fn allot_programs(open: &[OpenPayment], budget: PaymentBudget) -> Vec<(usize, usize)> {
    let mut order: Vec<usize> = (0..open.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&open[a], &open[b]);
        b.at_stake()
            .cmp(&a.at_stake())
            .then(a.bracket.width().total_cmp(&b.bracket.width()))
            .then(a.payer.cmp(&b.payer))
    });
    let mut left = budget.programs;
    order
        .into_iter()
        .map(|index| {
            let payment = &open[index];
            let most = payment.most_programs();
            let fits = payment.component_size <= budget.largest_component;
            let allotted = if fits && most <= left { most } else { 0 };
            left -= allotted;
            (index, allotted)
        })
        .collect()
}

/// The instance and what is known about it before any program is solved.
#[derive(Clone, Copy)]
struct Context<'a, 'i> {
    instance: &'a Instance<'i>,
    contested: &'a [bool],
}

enum Method {
    Alone,
    Relaxation,
    BranchAndBound,
    /// Branch and bound ran out of its [`PfBudget`]: the best choice found.
    Fallback,
}

/// The PF choice within one component, in `members` order: lexicographic maximum Nash
/// welfare, as two programs. The first finds the most starving members that can be served
/// together; the second maximises the sum of log-valuations serving exactly that many. (A
/// single program with a large weight on the first tier mixes magnitudes: branch and bound
/// then has to prove a welfare gap of 1e-9 on objectives in the thousands, and was measured
/// to branch for seconds.) When either program runs out of `budget`, the choice is the best
/// found ([`Method::Fallback`]).
fn pf_choice(
    context: &Context,
    members: &[usize],
    budget: PfBudget,
) -> Result<PfComponent, AuctionError> {
    let instance = context.instance;
    if let [only] = members {
        return Ok(PfComponent {
            choice: vec![best_alone(instance, *only)],
            method: Method::Alone,
            dual: None,
        });
    }
    let starving = |member: usize| instance.bidders[member].is_starving();
    let starving_members: Vec<usize> = members.iter().copied().filter(|&m| starving(m)).collect();
    // The count's choice, in `members` order, serves exactly the count: a choice the second
    // program can always fall back on.
    let mut counted = vec![None; members.len()];
    let (starving_served, first) = if starving_members.is_empty() {
        (None, Method::Relaxation)
    } else {
        // The others serve no starving bidder and can always take nothing: they are left out
        // of the count's program, which is then over the starving alone.
        let nothing = vec![None; starving_members.len()];
        let (choice, method, _) = optimum(
            context,
            &starving_members,
            Tier::StarvingServed,
            None,
            nothing,
            budget,
        )?;
        let mut choice_of_starving = choice.into_iter();
        for (option, &member) in counted.iter_mut().zip(members) {
            if starving(member) {
                *option = choice_of_starving.next().flatten();
            }
        }
        (Some(counted.iter().flatten().count()), method)
    };
    let (choice, second, dual) = optimum(
        context,
        members,
        Tier::Welfare,
        starving_served,
        counted,
        budget,
    )?;
    let method = match (first, second) {
        (Method::Fallback, _) | (_, Method::Fallback) => Method::Fallback,
        (Method::Relaxation, Method::Relaxation) => Method::Relaxation,
        _ => Method::BranchAndBound,
    };
    Ok(PfComponent {
        choice,
        method,
        dual: Some(dual),
    })
}

/// One component's PF choice ([`pf_choice`]), in `members` order.
struct PfComponent {
    choice: Vec<Option<usize>>,
    method: Method,
    /// The welfare LP's bounds on the program without each member; `None` for a bidder alone.
    dual: Option<DualBound>,
}

/// The two programs of the PF choice ([`pf_choice`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    /// The most starving members served together: every column is worth 1.
    StarvingServed,
    /// The sum of log-valuations.
    Welfare,
}

impl Tier {
    fn weight(self, instance: &Instance, member: usize, option: usize) -> f64 {
        match self {
            Self::StarvingServed => 1.0,
            Self::Welfare => instance.gain(member, option),
        }
    }
}

/// An optimal choice of the `tier` program over `members`, serving exactly `starving_served`
/// starving members when given: by its LP relaxation when that is integral, by branch and
/// bound otherwise. When branch and bound runs out of `budget`, the best of its incumbent, the
/// LP optimum rounded, a dive from the LP optimum and `feasible` (a choice the program
/// allows), each improved by local moves. Also what its LP's duals bound of the program
/// without each member.
fn optimum(
    context: &Context,
    members: &[usize],
    tier: Tier,
    starving_served: Option<usize>,
    feasible: Vec<Option<usize>>,
    budget: PfBudget,
) -> Result<(Vec<Option<usize>>, Method, DualBound), AuctionError> {
    let weight = |member, option| tier.weight(context.instance, member, option);
    let mut relaxation = Relaxation::new(context, members, weight, starving_served);
    let screening = relaxation.solve_integral("proportional-fair", None)?;
    let dual = (relaxation.formulation).dual_bound(context, members, &screening.row_duals);
    let (choice, method) = 'chosen: {
        if let Some(choice) = screening.choice {
            break 'chosen (choice, Method::Relaxation);
        }
        // A fractional LP optimum whose value some choice attains (most often in the count of
        // starving served) needs no branch and bound: the LP optimum rounded and improved finds
        // such a choice in 29 of 30 count programs of the round benchmark; a dive found none of
        // the others (BENCHMARKS.md).
        let formulation = &relaxation.formulation;
        let rounded = formulation
            .rounded(context, members, &screening.values, starving_served)
            .map(|start| improve(context, members, start, None, weight));
        if let Some(choice) = rounded
            .as_ref()
            .filter(|choice| formulation.attains(choice, screening.bound))
        {
            break 'chosen (choice.clone(), Method::Relaxation);
        }
        let program = Program::new(context, members, starving_served, weight, |_, _| true);
        match program.solve("proportional-fair", tier, budget.branch_and_bound_nodes)? {
            Solved::Optimal(choice) => (choice, Method::BranchAndBound),
            Solved::OutOfBudget(incumbent) => {
                // Without RINS and RENS (see `Program::model`), HiGHS's incumbent after the
                // budget is often poor; the dive, one chain of LP re-solves, was worth 0.2-4.6
                // more log-welfare on bundles drawn anywhere (BENCHMARKS.md).
                let dived = relaxation.dive("proportional-fair", None, |_, _| false)?;
                let polish = |start| improve(context, members, start, None, weight);
                // The rounding is already improved.
                let candidates = [incumbent.map(polish), rounded, dived.map(polish)];
                let best = candidates
                    .into_iter()
                    .flatten()
                    .chain([polish(feasible)])
                    // The first of equals: the incumbent, then the rounding, then the dive.
                    .reduce(|best, next| {
                        let worth = |choice| relaxation.formulation.worth(choice);
                        if worth(&next) > worth(&best) {
                            next
                        } else {
                            best
                        }
                    })
                    .expect("the feasible choice is a candidate");
                (best, Method::Fallback)
            }
        }
    };
    Ok((choice, method, dual))
}

/// A PF winner in a component of two or more bidders.
#[derive(Clone, Copy)]
struct Payer<'a> {
    /// Its component's index, in the order of the components.
    component: usize,
    members: &'a [usize],
    /// Its position in `members`.
    position: usize,
    /// Whether payments the screening leaves open may dive and run binary programs: not when
    /// the PF choice fell back, so they fall back at once.
    programs_allowed: bool,
    /// The component's bounds from its PF choice's LP.
    dual: &'a DualBound,
}

/// A payment: its share, the binary programs it took, and whether it fell back to the LP
/// counterfactual (see [`Bracket::fall_back`]).
struct Payment {
    share: ShareBounds,
    programs: usize,
    fell_back: bool,
}

impl Payment {
    fn certified(share: ShareBounds) -> Self {
        Self {
            share,
            programs: 0,
            fell_back: false,
        }
    }
}

/// A payment after screening.
enum Screen<'a> {
    Settled(Payment),
    /// Its bracket leaves the GPUs the payer keeps open: binary programs must decide.
    Open(OpenPayment<'a>),
}

/// What the binary programs deciding one payment need.
struct OpenPayment<'a> {
    /// The payer, as a bidder index.
    payer: usize,
    members: &'a [usize],
    /// The payer's position in `members`.
    position: usize,
    /// The component's size, in members times columns ([`Relaxation::size`]).
    component_size: usize,
    starving_served: usize,
    rounding: Rounding,
    bracket: Bracket,
    reach: Vec<Vec<f64>>,
}

impl OpenPayment<'_> {
    /// How many more GPUs the payer keeps at the top of its bracket than at the bottom.
    fn at_stake(&self) -> usize {
        let shares = self.bracket.shares();
        self.rounding.kept(shares.high) - self.rounding.kept(shares.low)
    }

    /// The most programs [`Bracket::settle`] can run: one per halving of the GPUs at stake.
    fn most_programs(&self) -> usize {
        (usize::BITS - self.at_stake().leading_zeros()) as usize
    }

    /// Settles the payment with binary programs, one rounding threshold at a time; only
    /// columns that some choice above the threshold could take enter a program.
    fn decide(&self, context: &Context, budget: PaymentBudget) -> Result<Payment, AuctionError> {
        let instance = context.instance;
        let app = &instance.bidders[self.payer].bid.app;
        let _solve = tracing::info_span!("payment_programs", %app).entered();
        let gain = |member, option| instance.gain(member, option);
        let decide = |threshold: f64| {
            let margin = tolerance(threshold);
            let keep = |at: usize, option: usize| {
                at != self.position && self.reach[at][option] > threshold - margin
            };
            let starving_served = Some(self.starving_served);
            let program = Program::new(context, self.members, starving_served, gain, keep);
            program.exceeds("payment", threshold, budget)
        };
        self.bracket.settle(self.rounding, decide)
    }
}

/// What bounds without any solve tell of one payment ([`bound_payment`]).
enum Bounded<'c, 'a, 'i> {
    /// Settled, for the payer (a bidder index).
    Settled(usize, Payment),
    /// Left open: the LP relaxation without the payer must be re-solved.
    Pending(PendingPayment<'c, 'a, 'i>),
}

/// A payment whose bracket without a solve leaves the GPUs the payer keeps open.
struct PendingPayment<'c, 'a, 'i> {
    /// The payer's component and whether its payments may dive ([`Payer`]).
    component: usize,
    programs_allowed: bool,
    screen: PayerScreen<'c, 'a, 'i>,
    /// The best choice without the payer known so far.
    polished: Vec<Option<usize>>,
    bracket: Bracket,
}

/// Brackets one payment without any solve ([`PayerScreen::bound`]). A payer whose bundle
/// takes no contested class pays nothing: the others' constraints are the same with and
/// without it, so x* minus the payer stays their optimum.
fn bound_payment<'c, 'a, 'i>(
    context: &'c Context<'a, 'i>,
    payer: Payer<'a>,
    options: &Choice,
    roundings: &[Option<Rounding>],
) -> Bounded<'c, 'a, 'i> {
    let instance = context.instance;
    let members = payer.members;
    let bidder = members[payer.position];
    if !uses_contested_class(context, bidder, options) {
        return Bounded::Settled(bidder, Payment::certified(ShareBounds::exact(1.0)));
    }
    let starving_served = members
        .iter()
        .filter(|&&m| m != bidder && instance.bidders[m].is_starving() && options[m].is_some())
        .count();
    let pf_without_payer: Vec<Option<usize>> = members
        .iter()
        .map(|&m| if m == bidder { None } else { options[m] })
        .collect();
    let screen = PayerScreen {
        context,
        members,
        position: payer.position,
        starving_served,
        with_payer: worth_in_member_order(instance, members, &pf_without_payer),
        rounding: roundings[bidder].expect("a payer won a bundle"),
    };
    let (bracket, polished) = screen.bound(payer.dual, pf_without_payer);
    if bracket.decides(screen.rounding) {
        return Bounded::Settled(bidder, Payment::certified(bracket.shares()));
    }
    Bounded::Pending(PendingPayment {
        component: payer.component,
        programs_allowed: payer.programs_allowed,
        screen,
        polished,
        bracket,
    })
}

/// Screens one group of a component's pending payments on one LP model, in order
/// ([`PayerScreen::screen_by_relaxation`]): proved by the LP relaxation without the payer or
/// by the bounds it gives, or bracketed for binary programs to decide. Each result is for its
/// payer (a bidder index).
fn screen_group<'c, 'a, 'i>(
    context: &Context,
    group: &[PendingPayment<'c, 'a, 'i>],
    span: &tracing::Span,
) -> Result<Vec<(usize, Screen<'a>)>, AuctionError> {
    let first = group.first().expect("a group has a payment");
    let gain = |member, option| context.instance.gain(member, option);
    let (members, starving_served) = (first.screen.members, first.screen.starving_served);
    let mut relaxation = Relaxation::new(context, members, gain, Some(starving_served));
    relaxation.dives = first.programs_allowed;
    let mut screens = Vec::with_capacity(group.len());
    for pending in group {
        let screen = &pending.screen;
        let bidder = screen.members[screen.position];
        // Workers run the solves, so the span names its parent explicitly.
        let app = &context.instance.bidders[bidder].bid.app;
        let _solve = tracing::info_span!(parent: span, "payment_solve", %app).entered();
        relaxation.exclude(screen.position, screen.starving_served);
        let screened =
            screen.screen_by_relaxation(&mut relaxation, &pending.polished, pending.bracket);
        relaxation.restore(screen.position);
        screens.push((
            bidder,
            match screened? {
                Screened::Exact(without_payer) => {
                    let share = ShareBounds::exact(share(screen.with_payer, without_payer));
                    Screen::Settled(Payment::certified(share))
                }
                Screened::Decided(bracket) => Screen::Settled(Payment::certified(bracket.shares())),
                Screened::Bracketed(bracket, _) if !pending.programs_allowed => {
                    Screen::Settled(bracket.fall_back(0))
                }
                Screened::Bracketed(bracket, reach) => Screen::Open(OpenPayment {
                    payer: bidder,
                    members: screen.members,
                    position: screen.position,
                    component_size: relaxation.size(),
                    starving_served: screen.starving_served,
                    rounding: screen.rounding,
                    bracket,
                    reach,
                }),
            },
        ));
    }
    Ok(screens)
}

/// What the screening tells of the others' optimum without the payer.
enum Screened {
    /// The optimum's worth, proved by the LP.
    Exact(f64),
    /// Bounds on it that decide the GPUs the payer keeps.
    Decided(Bracket),
    /// Bounds on it that leave the GPUs kept open, and each column's reach (see
    /// [`Screening::reach`]).
    Bracketed(Bracket, Vec<Vec<f64>>),
}

/// One payment under screening: the payer at `position` of its group's component, whose
/// others serve exactly `starving_served` starving members and are worth `with_payer` in x*.
struct PayerScreen<'c, 'a, 'i> {
    context: &'c Context<'a, 'i>,
    members: &'a [usize],
    position: usize,
    starving_served: usize,
    with_payer: f64,
    rounding: Rounding,
}

impl PayerScreen<'_, '_, '_> {
    /// The welfare of a choice in member order.
    fn worth(&self, choice: &[Option<usize>]) -> f64 {
        worth_in_member_order(self.context.instance, self.members, choice)
    }

    /// Brackets the others' optimum without the payer with no solve: x* without the payer
    /// improved by local moves below, the PF choice's duals ([`DualBound`]) above. Also the
    /// best choice found.
    fn bound(
        &self,
        dual: &DualBound,
        pf_without_payer: Vec<Option<usize>>,
    ) -> (Bracket, Vec<Option<usize>>) {
        let context = self.context;
        let gain = |member, option| context.instance.gain(member, option);
        // Single moves first: they settle many payments, and ejections cost about ten times
        // as much (a millisecond a pass at 4096 GPUs), so they run only where needed.
        let mut polished = LocalSearch::new(
            context,
            self.members,
            pf_without_payer,
            Some(self.position),
            gain,
        );
        while polished.single_moves() {}
        let upper = dual.without(self.position, self.starving_served);
        let mut optimum = Bracket {
            with_payer: self.with_payer,
            lower: self.worth(&polished.choice).max(self.with_payer),
            upper,
            relaxed: upper,
        };
        if !optimum.decides(self.rounding) {
            polished.settle();
            optimum.lower = optimum.lower.max(self.worth(&polished.choice));
        }
        (optimum, polished.choice)
    }

    /// Narrows [`Self::bound`]'s bracket on the LP relaxation without the payer (excluded by
    /// the caller): the LP optimum, zero-half cuts, the LP optimum rounded and, where the
    /// relaxation may dive ([`Relaxation::may_dive`]), a dive. `polished` is the best choice
    /// known and `optimum` the bracket so far. A dive is a chain of LP re-solves, most of a
    /// payment's time.
    fn screen_by_relaxation(
        &self,
        relaxation: &mut Relaxation,
        polished: &[Option<usize>],
        mut optimum: Bracket,
    ) -> Result<Screened, AuctionError> {
        let (context, members) = (self.context, self.members);
        let mut screened = relaxation.solve_integral("payment", Some(polished))?;
        if let Some(choice) = screened.choice {
            return Ok(Screened::Exact(self.worth(&choice)));
        }
        optimum.relaxed = screened.bound + tolerance(screened.bound);
        optimum.upper = optimum.upper.min(optimum.relaxed);
        // Zero-half cuts tighten the bound where the dives would otherwise work for it; they
        // stay in the group's model for its later payers.
        for _ in 0..CUT_ROUNDS {
            let cut = !optimum.decides(self.rounding)
                && relaxation.may_dive()
                && relaxation.add_cuts(context, members, &screened.values) > 0;
            if !cut {
                break;
            }
            screened = relaxation.solve_integral("payment", Some(polished))?;
            if let Some(choice) = screened.choice {
                return Ok(Screened::Exact(self.worth(&choice)));
            }
            optimum.upper = optimum
                .upper
                .min(screened.bound + tolerance(screened.bound));
        }
        let gain = |member, option| context.instance.gain(member, option);
        let improved = |start: Vec<Option<usize>>| {
            self.worth(&improve(context, members, start, Some(self.position), gain))
        };
        let starving_served = Some(self.starving_served);
        if !optimum.decides(self.rounding) {
            let rounded = (relaxation.formulation).rounded(
                context,
                members,
                &screened.values,
                starving_served,
            );
            if let Some(rounded) = rounded {
                optimum.lower = optimum.lower.max(improved(rounded));
            }
        }
        if !optimum.decides(self.rounding) && relaxation.may_dive() {
            // Each step's LP optimum, rounded and improved, is a choice too, at times better
            // than the dive's end; once one decides the payment, the rest of the dive is not
            // needed.
            let mut lower = optimum.lower;
            let dived = relaxation.dive("payment", Some(polished), |formulation, values| {
                let rounded = formulation.rounded(context, members, values, starving_served);
                if let Some(rounded) = rounded {
                    lower = lower.max(improved(rounded));
                }
                Bracket { lower, ..optimum }.decides(self.rounding)
            })?;
            optimum.lower = lower;
            if let Some(dived) = dived {
                optimum.lower = optimum.lower.max(improved(dived));
            }
        }
        if optimum.decides(self.rounding) {
            return Ok(Screened::Decided(optimum));
        }
        if relaxation.has_cuts() {
            let relaxed = relaxation.bound_without_cuts("payment")?;
            optimum.relaxed = relaxed + tolerance(relaxed);
        }
        Ok(Screened::Bracketed(optimum, screened.reach))
    }
}

/// What is known of the others' optimum without the payer (the PF objective over the payer's
/// component, serving as many starving bidders as x*), as an interval.
#[derive(Clone, Copy)]
struct Bracket {
    /// The others' welfare in x*.
    with_payer: f64,
    lower: f64,
    upper: f64,
    /// The LP relaxation's optimum without the payer, kept for the fallback (until that LP is
    /// re-solved, the duals' bound: a bracket that decides before it needs no fallback).
    relaxed: f64,
}

/// The answer of a program asked whether the optimum exceeds a threshold.
enum Exceeds {
    /// A choice worth `found` (above the threshold) exists; the optimum is at most `bound`.
    Yes {
        found: f64,
        bound: f64,
    },
    No,
}

impl Bracket {
    /// Whether every share in the bracket keeps the same number of GPUs.
    fn decides(&self, rounding: Rounding) -> bool {
        let shares = self.shares();
        rounding.kept(shares.low) == rounding.kept(shares.high)
    }

    /// The payment against the LP relaxation's optimum, the LP counterfactual, after
    /// `programs` that did not decide it. That share is never above the exact c_i, and its
    /// denominator does not depend on the payer's bid values, so reporting them truthfully
    /// still maximises the payer's utility (docs/mechanism.md).
    fn fall_back(&self, programs: usize) -> Payment {
        Payment {
            share: ShareBounds::exact(share(self.with_payer, self.relaxed)),
            programs,
            fell_back: true,
        }
    }

    /// How far apart the bounds on the optimum are.
    fn width(&self) -> f64 {
        self.upper - self.lower
    }

    /// c_i's interval: a better optimum without the payer means a smaller share.
    fn shares(&self) -> ShareBounds {
        ShareBounds {
            low: share(self.with_payer, self.upper),
            high: share(self.with_payer, self.lower),
        }
    }

    /// Narrows the bracket until the number of GPUs the payer keeps is known, asking `decide`
    /// about one rounding threshold at a time (bisecting the counts still possible). `decide`
    /// returns `None` when its budget ran out: the payment then falls back (see
    /// [`Self::fall_back`]).
    fn settle(
        mut self,
        rounding: Rounding,
        mut decide: impl FnMut(f64) -> Result<Option<Exceeds>, AuctionError>,
    ) -> Result<Payment, AuctionError> {
        let mut programs = 0;
        let mut fewest = rounding.kept(self.shares().low);
        let mut most = rounding.kept(self.shares().high);
        while fewest < most {
            // Keeping at most `kept` GPUs means a share at or below the threshold, i.e. an
            // optimum without the payer of at least `with_payer - ln(threshold)`.
            let kept = (fewest + most) / 2;
            let threshold = self.with_payer - rounding.threshold(kept).ln();
            programs += 1;
            match decide(threshold)? {
                None => return Ok(self.fall_back(programs)),
                Some(Exceeds::Yes { found, bound }) => {
                    self.lower = self.lower.max(found);
                    self.upper = self.upper.min(bound).max(self.lower);
                    most = most.min(kept).min(rounding.kept(self.shares().high));
                    fewest = fewest.max(rounding.kept(self.shares().low));
                }
                // No choice is worth more than the threshold, to the solver's tolerance: the
                // share is above the rounding threshold, so the payer keeps more.
                Some(Exceeds::No) => {
                    self.upper = self.upper.min(threshold).max(self.lower);
                    fewest = (kept + 1).max(rounding.kept(self.shares().low));
                }
            }
        }
        Ok(Payment {
            share: self.shares(),
            programs,
            fell_back: false,
        })
    }
}

/// GPUs taken per class, against the capacities of the contested classes (the others cannot
/// run out).
struct Usage<'c> {
    context: &'c Context<'c, 'c>,
    used: Vec<u32>,
}

impl<'c> Usage<'c> {
    fn new(context: &'c Context<'c, 'c>) -> Self {
        Self {
            context,
            used: vec![0; context.instance.capacity.len()],
        }
    }

    /// The first contested class that `counts` would take past its capacity.
    fn overfull(&self, counts: &[(usize, u32)]) -> Option<usize> {
        let capacity = &self.context.instance.capacity;
        counts
            .iter()
            .find(|&&(class, count)| {
                self.context.contested[class] && self.used[class] + count > capacity[class]
            })
            .map(|&(class, _)| class)
    }

    fn fits(&self, counts: &[(usize, u32)]) -> bool {
        self.overfull(counts).is_none()
    }

    fn take(&mut self, counts: &[(usize, u32)]) {
        for &(class, count) in counts {
            self.used[class] += count;
        }
    }

    fn free(&mut self, counts: &[(usize, u32)]) {
        for &(class, count) in counts {
            self.used[class] -= count;
        }
    }
}

/// `choice` (in member order) improved by local moves until none improves: a good choice,
/// found in well under a millisecond, whose worth bounds the optimum below. It is a
/// certificate, not an optimiser: HiGHS's programs decide whatever it leaves open. The member
/// at `excluded` (a payer) takes nothing, and no move changes how many starving members are
/// served, which a program may hold fixed.
fn improve<W: Fn(usize, usize) -> f64>(
    context: &Context,
    members: &[usize],
    choice: Vec<Option<usize>>,
    excluded: Option<usize>,
    weight: W,
) -> Vec<Option<usize>> {
    let mut search = LocalSearch::new(context, members, choice, excluded, weight);
    search.settle();
    search.choice
}

/// A choice over a component's members and the GPUs it uses per class, changed by two kinds
/// of move: a member switching to a better option that fits in the GPUs free, and (once no
/// such switch is left) a member taking a better option that collides with one other member
/// only, who gives way and takes its best option among the GPUs then free.
struct LocalSearch<'s, W> {
    context: &'s Context<'s, 's>,
    members: &'s [usize],
    excluded: Option<usize>,
    /// A column's weight, by member and option.
    weight: W,
    choice: Vec<Option<usize>>,
    usage: Usage<'s>,
    /// The positions whose option takes GPUs of each class: the only members an ejection
    /// for that class can move (scanning every member made ejections the bulk of a 4096-GPU
    /// round's payments).
    holders: Vec<Vec<usize>>,
    /// Each position's best weight over all its options, free or not, and taking nothing
    /// (0): what it could at most get back after giving way.
    best_gain: Vec<f64>,
}

impl<'s, W: Fn(usize, usize) -> f64> LocalSearch<'s, W> {
    fn new(
        context: &'s Context<'s, 's>,
        members: &'s [usize],
        choice: Vec<Option<usize>>,
        excluded: Option<usize>,
        weight: W,
    ) -> Self {
        let best_gain = members
            .iter()
            .map(|&member| {
                let options = context.instance.bidders[member].options.len();
                (0..options).map(|o| weight(member, o)).fold(0.0, f64::max)
            })
            .collect();
        let mut search = Self {
            context,
            members,
            excluded,
            weight,
            choice: vec![None; members.len()],
            usage: Usage::new(context),
            holders: vec![Vec::new(); context.instance.capacity.len()],
            best_gain,
        };
        for (position, option) in choice.into_iter().enumerate() {
            search.hold(position, option);
        }
        search
    }

    fn counts(&self, position: usize, option: Option<usize>) -> &'s [(usize, u32)] {
        let bidder = &self.context.instance.bidders[self.members[position]];
        option.map_or(&[], |o| &bidder.options[o].counts)
    }

    fn gain(&self, position: usize, option: Option<usize>) -> f64 {
        option.map_or(0.0, |o| (self.weight)(self.members[position], o))
    }

    fn option_count(&self, position: usize) -> usize {
        self.context.instance.bidders[self.members[position]]
            .options
            .len()
    }

    fn is_starving(&self, position: usize) -> bool {
        self.context.instance.bidders[self.members[position]].is_starving()
    }

    /// The excluded member takes nothing, and a starving member served by nothing stays so.
    fn movable(&self, position: usize) -> bool {
        self.excluded != Some(position)
            && (self.choice[position].is_some() || !self.is_starving(position))
    }

    /// Frees the GPUs of `position`'s option (its choice is left for the caller to set).
    fn release(&mut self, position: usize) {
        let counts = self.counts(position, self.choice[position]);
        self.usage.free(counts);
        for &(class, _) in counts {
            self.holders[class].retain(|&holder| holder != position);
        }
    }

    /// Sets `position`'s option, whose GPUs must be free.
    fn hold(&mut self, position: usize, option: Option<usize>) {
        self.choice[position] = option;
        let counts = self.counts(position, option);
        self.usage.take(counts);
        for &(class, _) in counts {
            self.holders[class].push(position);
        }
    }

    /// The best of `position`'s options that fits in the GPUs free (the last of equals).
    fn best_fitting(&self, position: usize) -> Option<usize> {
        (0..self.option_count(position))
            .filter(|&option| self.usage.fits(self.counts(position, Some(option))))
            .max_by(|&a, &b| {
                self.gain(position, Some(a))
                    .total_cmp(&self.gain(position, Some(b)))
            })
    }

    /// Makes moves of both kinds until none improves.
    fn settle(&mut self) {
        while self.single_moves() || self.ejections() {}
    }

    /// One pass over the movable members: each is released and offered to `make_move`, which
    /// holds it again (in its option or a better one) and says whether it moved.
    fn pass(&mut self, make_move: fn(&mut Self, usize, Option<usize>) -> bool) -> bool {
        let mut moved = false;
        for position in 0..self.members.len() {
            if self.movable(position) {
                let current = self.choice[position];
                self.release(position);
                moved |= make_move(self, position, current);
            }
        }
        moved
    }

    /// One pass of single moves; whether any member moved.
    fn single_moves(&mut self) -> bool {
        self.pass(Self::single_move)
    }

    fn single_move(&mut self, position: usize, current: Option<usize>) -> bool {
        let better = self
            .best_fitting(position)
            .filter(|&best| self.gain(position, Some(best)) > self.gain(position, current));
        self.hold(position, better.or(current));
        better.is_some()
    }

    /// One pass of ejections, each improving the choice's worth by more than the programs'
    /// tolerance (so that no sequence of moves cycles); whether any was made.
    fn ejections(&mut self) -> bool {
        self.pass(Self::ejection)
    }

    fn ejection(&mut self, position: usize, current: Option<usize>) -> bool {
        let Some((option, other, replacement)) = self.ejection_for(position, current) else {
            self.hold(position, current);
            return false;
        };
        self.release(other);
        self.hold(position, Some(option));
        self.hold(other, replacement);
        true
    }

    /// For `position` (released, formerly holding `current`): a better option, the one member
    /// in its way, and that member's best option once it gives way, when the two together gain.
    fn ejection_for(
        &mut self,
        position: usize,
        current: Option<usize>,
    ) -> Option<(usize, usize, Option<usize>)> {
        let current_gain = self.gain(position, current);
        for option in 0..self.option_count(position) {
            let option_gain = self.gain(position, Some(option));
            if option_gain <= current_gain {
                continue;
            }
            let wanted = self.counts(position, Some(option));
            let Some(first_overfull) = self.usage.overfull(wanted) else {
                continue;
            };
            let mut in_the_way = self.holders[first_overfull].clone();
            // In position order, whatever order the moves left them in.
            in_the_way.sort_unstable();
            for other in in_the_way {
                let held = self.choice[other];
                let held_gain = self.gain(other, held);
                // Not even `other`'s best option could make up for what it gives up.
                if option_gain - current_gain + self.best_gain[other] - held_gain
                    <= OBJECTIVE_TOLERANCE
                {
                    continue;
                }
                let held_counts = self.counts(other, held);
                self.usage.free(held_counts);
                let makes_room = self.usage.fits(wanted);
                let mut replacement = None;
                if makes_room {
                    self.usage.take(wanted);
                    replacement = self.best_fitting(other);
                    self.usage.free(wanted);
                }
                self.usage.take(held_counts);
                let gives_way = replacement.is_some() || !self.is_starving(other);
                let gain = option_gain - current_gain + self.gain(other, replacement) - held_gain;
                if makes_room && gives_way && gain > OBJECTIVE_TOLERANCE {
                    return Some((option, other, replacement));
                }
            }
        }
        None
    }
}

/// Whether the payer's PF bundle takes any GPU of a contested class.
fn uses_contested_class(context: &Context, payer: usize, options: &Choice) -> bool {
    let bidder = &context.instance.bidders[payer];
    options[payer].is_some_and(|option| {
        bidder.options[option]
            .counts
            .iter()
            .any(|&(class, _)| context.contested[class])
    })
}

/// The welfare of `choice`, one option (or none) per member of `members`, in their order.
fn worth_in_member_order(instance: &Instance, members: &[usize], choice: &[Option<usize>]) -> f64 {
    welfare(
        instance,
        members.iter().copied().zip(choice.iter().copied()),
    )
}

/// Sum of the gains of a choice.
fn welfare(instance: &Instance, choice: impl Iterator<Item = (usize, Option<usize>)>) -> f64 {
    choice
        .map(|(member, option)| option.map_or(0.0, |o| instance.gain(member, o)))
        .sum()
}

/// c_i = prod_{j != i} v_j(x*) / prod_{j != i} v_j(x*_{-i}), in logs over i's component (the
/// other components are the same in both solutions and cancel). x*_{-i} is the others' best
/// choice serving exactly as many starving bidders as x* does, so the comparison stays within
/// one tier of the lexicographic objective and c_i stays in (0, 1] (docs/mechanism.md).
///
/// The count is a constraint rather than a tier weight in the objective: payment programs then
/// compare welfare alone, of magnitude 1 rather than of the tier, so branch and bound proves
/// the gap `mip_abs_gap` on the quantity it measures (with the tier weight it had to prove
/// 1e-9 on objectives in the thousands, and branched for seconds).
fn share(with_payer: f64, without_payer: f64) -> f64 {
    // The PF solution minus the payer is feasible without the payer, so the optimum is at
    // least as good; a smaller value can only be solver tolerance.
    (with_payer - without_payer).min(0.0).exp()
}

/// The rows and columns of one program over `members`, or of its LP relaxation: a column per
/// (member, option), at most one option per member, class capacities on contested classes and,
/// when `starving_served` is given and some member starves, exactly that many starving members
/// served. That count is a row against a slack column fixed to it, so that a relaxation can
/// change it by changing a column bound.
struct Formulation {
    problem: RowProblem,
    /// (member position, option) of each column, in column order.
    columns: Vec<(usize, usize)>,
    handles: Vec<Col>,
    costs: Vec<f64>,
    /// The columns of each member position.
    columns_of: Vec<Range<usize>>,
    starving_slack: Option<Col>,
    /// The row of each member position with more than one column (one column is bounded by
    /// its own upper bound), of each contested class, and the count's: what a dual solution
    /// is read against ([`Formulation::dual_bound`]).
    member_rows: Vec<Option<usize>>,
    class_rows: Vec<Option<usize>>,
    count_row: Option<usize>,
}

impl Formulation {
    fn new(
        context: &Context,
        members: &[usize],
        weight: impl Fn(usize, usize) -> f64,
        integer: bool,
        starving_served: Option<usize>,
        keep: impl Fn(usize, usize) -> bool,
    ) -> Self {
        let instance = context.instance;
        let mut problem = RowProblem::default();
        let mut columns = Vec::new();
        let mut handles = Vec::new();
        let mut costs = Vec::new();
        let mut columns_of = Vec::with_capacity(members.len());
        let mut per_member: Vec<Vec<(Col, f64)>> = Vec::with_capacity(members.len());
        let mut per_class: Vec<Vec<(Col, f64)>> = vec![Vec::new(); instance.capacity.len()];
        let mut starving: Vec<(Col, f64)> = Vec::new();
        for (position, &member) in members.iter().enumerate() {
            let bidder = &instance.bidders[member];
            let first = columns.len();
            let mut row = Vec::with_capacity(bidder.options.len());
            for (index, option) in bidder.options.iter().enumerate() {
                if !keep(position, index) {
                    continue;
                }
                let cost = weight(member, index);
                let column = if integer {
                    problem.add_integer_column(cost, 0..=1)
                } else {
                    problem.add_column(cost, 0..=1)
                };
                columns.push((position, index));
                handles.push(column);
                costs.push(cost);
                row.push((column, 1.0));
                for &(class, count) in &option.counts {
                    per_class[class].push((column, f64::from(count)));
                }
                if bidder.is_starving() {
                    starving.push((column, 1.0));
                }
            }
            columns_of.push(first..columns.len());
            per_member.push(row);
        }
        let mut rows = 0..;
        let mut member_rows = vec![None; per_member.len()];
        for (position, row) in per_member
            .iter()
            .enumerate()
            .filter(|(_, row)| row.len() > 1)
        {
            problem.add_row(..=1.0, row);
            member_rows[position] = rows.next();
        }
        let mut class_rows = vec![None; per_class.len()];
        for (class, row) in per_class
            .iter()
            .enumerate()
            .filter(|(class, row)| context.contested[*class] && !row.is_empty())
        {
            problem.add_row(..=f64::from(instance.capacity[class]), row);
            class_rows[class] = rows.next();
        }
        // A relaxation changes the count through a slack column's bounds; a binary program
        // keeps the count in the row's bounds, since a continuous column was measured to make
        // HiGHS's branch and bound several times slower.
        let mut starving_slack = None;
        let mut count_row = None;
        if let Some(served) = starving_served.filter(|_| !starving.is_empty()) {
            let served = served as f64;
            if integer {
                problem.add_row(served..=served, &starving);
            } else {
                let slack = problem.add_column(0.0, served..=served);
                starving.push((slack, -1.0));
                problem.add_row(0.0..=0.0, &starving);
                starving_slack = Some(slack);
            }
            count_row = rows.next();
        }
        Self {
            problem,
            columns,
            handles,
            costs,
            columns_of,
            starving_slack,
            member_rows,
            class_rows,
            count_row,
        }
    }

    /// Bounds, from the row duals of one LP optimum over every member, on the LP optimum of the
    /// same program without each member (see [`DualBound`]).
    fn dual_bound(&self, context: &Context, members: &[usize], row_duals: &[f64]) -> DualBound {
        let instance = context.instance;
        // A packing row's activity is never negative, so a dual of either sign bounds its term
        // by max(0, dual) times its capacity; clamping here, and pricing the columns with the
        // clamped duals below, keeps the bound valid whatever the solver's rounding.
        let packing = |row: Option<usize>| row.map_or(0.0, |row| row_duals[row].max(0.0));
        let count = self.count_row.map_or(0.0, |row| row_duals[row]);
        let mut member_terms: Vec<f64> = (self.member_rows.iter().copied()).map(packing).collect();
        for (&(position, option), &cost) in self.columns.iter().zip(&self.costs) {
            let bidder = &instance.bidders[members[position]];
            let classes: f64 = (bidder.options[option].counts.iter())
                .map(|&(class, used)| packing(self.class_rows[class]) * f64::from(used))
                .sum();
            let starving = if bidder.is_starving() { count } else { 0.0 };
            let reduced = cost - packing(self.member_rows[position]) - classes - starving;
            member_terms[position] += reduced.max(0.0);
        }
        let capacities: f64 = (self.class_rows.iter().enumerate())
            .map(|(class, &row)| packing(row) * f64::from(instance.capacity[class]))
            .sum();
        DualBound {
            with_everyone: capacities + member_terms.iter().sum::<f64>(),
            member_terms,
            count,
        }
    }

    /// The choice (in member order) of an optimal solution whose values are all 0 or 1, and
    /// whose objective is the solver's; `None` when the solution is fractional.
    fn integral_choice(&self, values: &[f64], objective: f64) -> Option<Vec<Option<usize>>> {
        let mut choice = vec![None; self.columns_of.len()];
        for (&(position, option), &x) in self.columns.iter().zip(values) {
            if x > 1.0 - INTEGRALITY {
                if choice[position].replace(option).is_some() {
                    return None;
                }
            } else if x > INTEGRALITY {
                return None;
            }
        }
        // Rounding must not lose objective: then the choice is optimal to the tolerance that
        // branch and bound would prove (`mip_abs_gap`).
        self.attains(&choice, objective).then_some(choice)
    }

    /// The LP optimum `values` rounded to a choice: columns in decreasing value, each taken
    /// when its member has none yet and its GPUs are free, up to `starving_served` starving
    /// members; `None` when fewer starving members are then served. The dive's poor cousin:
    /// no LP re-solve, so it is tried first, and in components too large to dive.
    fn rounded(
        &self,
        context: &Context,
        members: &[usize],
        values: &[f64],
        starving_served: Option<usize>,
    ) -> Option<Vec<Option<usize>>> {
        let instance = context.instance;
        let mut order: Vec<usize> = (0..self.columns.len())
            .filter(|&column| values[column] > INTEGRALITY)
            .collect();
        order.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
        let mut usage = Usage::new(context);
        let mut choice = vec![None; members.len()];
        let mut served = 0;
        for column in order {
            let (position, option) = self.columns[column];
            let bidder = &instance.bidders[members[position]];
            let counts = &bidder.options[option].counts;
            let full = bidder.is_starving() && Some(served) == starving_served;
            if choice[position].is_some() || full || !usage.fits(counts) {
                continue;
            }
            usage.take(counts);
            choice[position] = Some(option);
            served += usize::from(bidder.is_starving());
        }
        starving_served
            .is_none_or(|needed| served == needed)
            .then_some(choice)
    }

    /// See [`Screening::reach`]. For an LP optimum z, every feasible x is worth at most
    /// z + sum_j d_j (x_j - x*_j) with the reduced costs d_j (<= 0 at a lower bound of a
    /// maximum), so a column at 0 taken at 1 costs at least |d_j|.
    fn reach(&self, solution: &highs::Solution, bound: f64) -> Vec<Vec<f64>> {
        let mut reach: Vec<Vec<f64>> = self
            .columns_of
            .iter()
            .map(|columns| vec![bound; columns.len()])
            .collect();
        let columns = self
            .columns
            .iter()
            .zip(solution.columns())
            .zip(solution.dual_columns());
        for ((&(position, option), &value), &reduced_cost) in columns {
            if value <= INTEGRALITY {
                reach[position][option] = bound - reduced_cost.abs();
            }
        }
        reach
    }

    /// The packing rows of the program in column indices: one per member (at most one option)
    /// and one per contested class (its capacity); what the zero-half cuts are made of.
    fn packing_rows(&self, context: &Context, members: &[usize]) -> Vec<PackingRow> {
        let instance = context.instance;
        let mut rows: Vec<PackingRow> = (self.columns_of.iter())
            .map(|columns| PackingRow {
                bound: 1,
                terms: columns.clone().map(|column| (column, 1)).collect(),
            })
            .collect();
        let mut by_class: Vec<Vec<(usize, u32)>> = vec![Vec::new(); instance.capacity.len()];
        for (column, &(position, option)) in self.columns.iter().enumerate() {
            for &(class, count) in &instance.bidders[members[position]].options[option].counts {
                if context.contested[class] {
                    by_class[class].push((column, count));
                }
            }
        }
        let classes = (by_class.into_iter().zip(&instance.capacity))
            .filter(|(terms, _)| !terms.is_empty())
            .map(|(terms, &bound)| PackingRow { bound, terms });
        rows.extend(classes);
        rows
    }

    /// Sets the upper bound of every column of member `position`.
    fn bound_member(&self, model: &mut Model, position: usize, upper: f64) {
        for &column in &self.handles[self.columns_of[position].clone()] {
            model.change_column_bounds(column, 0.0..=upper);
        }
    }

    /// Whether `choice` (in member order) is worth `bound` or more, to the tolerance.
    fn attains(&self, choice: &[Option<usize>], bound: f64) -> bool {
        self.worth(choice) >= bound - tolerance(bound)
    }

    /// The objective's value at `choice` (every column kept).
    fn worth(&self, choice: &[Option<usize>]) -> f64 {
        choice
            .iter()
            .zip(&self.columns_of)
            .filter_map(|(option, columns)| option.map(|option| self.costs[columns.start + option]))
            .sum()
    }
}

/// The largest component, in members times columns, whose open payments dive and, under the
/// default [`PaymentBudget`], run binary programs; larger ones are settled by the LP screening
/// alone, and the payments it leaves open fall back. A dive re-solves the LP about once per
/// member it settles, each re-solve over every column, and in large components it almost
/// never decides a payment: measured on the round benchmark (BENCHMARKS.md), dives decided
/// 29% of the payments they tried at 256 GPUs (20 bidders, 200-420 columns: 4,000-8,400),
/// 7% at 1024 GPUs (80 bidders, ~1,900 columns: ~150,000) and 6 of 1,525 at 4096 GPUs
/// (200 bidders, ~5,400 columns: ~1,000,000), where they were 94% of the screening's time.
/// The limit lies between the sizes where they pay and where they do not; no auction of the
/// simulator's tests (the shipped workloads, the experiments at test scale) comes near it.
/// Counted in the component's size, not in seconds, so that a replay takes the same decisions
/// on any machine.
const LARGE_COMPONENT: usize = 100_000;

/// Rounds of zero-half cuts a payment's LP relaxation may get before its dive, at most
/// [`CUTS_PER_ROUND`] cuts a round and [`CUTS_PER_MODEL`] in a group's model, and only where
/// the payments may dive ([`Relaxation::may_dive`]). On the auction benchmark's families at
/// 40-70 apps, they left 82 payments falling back where there had been 185, in 10% less time;
/// in components past [`LARGE_COMPONENT`] they decided nothing at 1024 and 4096 GPUs and cost
/// the 4096-GPU rounds 45 ms of payments at the median (BENCHMARKS.md).
const CUT_ROUNDS: usize = 3;
const CUTS_PER_ROUND: usize = 20;
const CUTS_PER_MODEL: usize = 100;

/// How far from 0 or 1 an LP value may be and still count as integral.
const INTEGRALITY: f64 = 1e-6;

/// The absolute optimality tolerance of every program, relative to objectives of magnitude 1.
const OBJECTIVE_TOLERANCE: f64 = 1e-9;

/// [`OBJECTIVE_TOLERANCE`] scaled to an objective value of that size.
fn tolerance(value: f64) -> f64 {
    OBJECTIVE_TOLERANCE * value.abs().max(1.0)
}

fn quiet_single_thread(model: &mut Model) {
    model.make_quiet();
    model.set_threads(NonZeroU32::MIN);
    // Profiled (BENCHMARKS.md): on these small packing programs presolve costs more than it
    // saves; a relaxation is also re-solved from its previous basis, which presolve would drop.
    model.set_option("presolve", "off");
}

fn solved_optimal(model: Model, program: &'static str) -> Result<highs::SolvedModel, AuctionError> {
    let solved = solve_status(model, program)?;
    match solved.status() {
        HighsModelStatus::Optimal => Ok(solved),
        status => Err(AuctionError::Solver {
            program,
            detail: format!("ended with status {status:?}"),
        }),
    }
}

/// What an LP relaxation says of its binary program.
struct Screening {
    /// An optimal choice of the binary program, when the LP proves one.
    choice: Option<Vec<Option<usize>>>,
    /// The LP optimum: an upper bound on the binary program's.
    bound: f64,
    /// For each column (by member position, then option), an upper bound on every choice that
    /// takes it: the LP optimum less the column's reduced cost when the LP leaves it at 0.
    reach: Vec<Vec<f64>>,
    /// The LP optimum's column values.
    values: Vec<f64>,
    /// The LP optimum's row duals, in the formulation's row order.
    row_duals: Vec<f64>,
}

/// Upper bounds on the LP relaxation of a component's welfare program without each member, from
/// one dual solution of the program with every member, with no LP re-solve. By weak duality,
/// any nonnegative duals of the packing rows (and any dual of the count row), with each column
/// priced by them, bound every choice that leaves a member out by the dual objective less that
/// member's terms. Read off the PF choice's own LP, it lets the screening settle a payment
/// before re-solving anything: in the 256-GPU rounds it decides about two payments in three
/// (BENCHMARKS.md).
#[derive(Debug, Clone)]
pub(super) struct DualBound {
    /// The dual objective with every member, less the count row's term.
    with_everyone: f64,
    /// By member position: its row's dual and its columns' positive reduced costs.
    member_terms: Vec<f64>,
    /// The count row's dual: its term is this times the starving members served.
    count: f64,
}

impl DualBound {
    /// An upper bound, to the programs' tolerance, on the LP optimum without the member at
    /// `position` that serves exactly `starving_served` starving members.
    fn without(&self, position: usize, starving_served: usize) -> f64 {
        let bound =
            self.with_everyone - self.member_terms[position] + self.count * starving_served as f64;
        bound + tolerance(bound)
    }
}

/// The LP relaxation of a component's program, kept between solves: a payment excludes the
/// payer by bounding its columns to 0 (and sets the starving served) and re-solves from the
/// previous optimal basis.
struct Relaxation {
    /// `None` only while a solve holds it.
    model: Option<Model>,
    formulation: Formulation,
    /// Whether payments may dive here: not when the component's PF choice fell back.
    dives: bool,
    /// The zero-half cuts added ([`Self::add_cuts`]), each with its slack column: fixed at 0
    /// while the cut holds, unbounded while it is switched off.
    cuts: HashMap<PackingRow, Col>,
    /// The formulation's packing rows, the cuts' material; built at the first cut round.
    packing_rows: Option<Vec<PackingRow>>,
}

impl Relaxation {
    fn new(
        context: &Context,
        members: &[usize],
        weight: impl Fn(usize, usize) -> f64,
        starving_served: Option<usize>,
    ) -> Self {
        let keep_all = |_, _| true;
        let mut formulation =
            Formulation::new(context, members, weight, false, starving_served, keep_all);
        let problem = std::mem::take(&mut formulation.problem);
        let mut model = problem.optimise(Sense::Maximise);
        quiet_single_thread(&mut model);
        model.set_option("solver", "simplex");
        model.set_option("primal_feasibility_tolerance", 1e-9);
        model.set_option("dual_feasibility_tolerance", 1e-9);
        Self {
            model: Some(model),
            formulation,
            dives: true,
            cuts: HashMap::new(),
            packing_rows: None,
        }
    }

    /// Adds the zero-half cuts ([`zero_half_cuts`]) that the LP optimum `values` violates, up
    /// to [`CUTS_PER_MODEL`] in all; returns how many were added.
    fn add_cuts(&mut self, context: &Context, members: &[usize], values: &[f64]) -> usize {
        let room = CUTS_PER_MODEL - self.cuts.len();
        let formulation = &self.formulation;
        let rows =
            (self.packing_rows).get_or_insert_with(|| formulation.packing_rows(context, members));
        let model = self.model.as_mut().expect("not solving");
        let mut added = 0;
        for cut in zero_half_cuts(rows, values, room.min(CUTS_PER_ROUND)) {
            if self.cuts.contains_key(&cut) {
                continue;
            }
            let handles = &self.formulation.handles;
            let terms = (cut.terms.iter()).map(|&(column, k)| (handles[column], f64::from(k)));
            let row = model.add_row(..=f64::from(cut.bound), terms);
            let slack = model.add_col(0.0, 0.0..=0.0, [(row, -1.0)]);
            self.cuts.insert(cut, slack);
            added += 1;
        }
        added
    }

    fn has_cuts(&self) -> bool {
        !self.cuts.is_empty()
    }

    /// The LP optimum with every cut switched off: the LP counterfactual a payment falls back
    /// to, whose value depends on the other bidders alone (the cuts were found from LP optima
    /// with the payer in them).
    fn bound_without_cuts(&mut self, program: &'static str) -> Result<f64, AuctionError> {
        self.switch_cuts(f64::INFINITY);
        let bound = self.solve(program, |_, solved| solved.objective_value())?;
        self.switch_cuts(0.0);
        Ok(bound)
    }

    /// Sets every cut's slack to at most `upper`: 0 switches the cuts on, infinity off.
    fn switch_cuts(&mut self, upper: f64) {
        let model = self.model.as_mut().expect("not solving");
        for &slack in self.cuts.values() {
            model.change_column_bounds(slack, 0.0..=upper);
        }
    }

    /// Solves the relaxation and returns an optimal choice of the binary program when the LP
    /// proves one: the LP's own optimum when it is integral, or `known` (a feasible choice)
    /// when the LP bound does not exceed its value.
    fn solve_integral(
        &mut self,
        program: &'static str,
        known: Option<&[Option<usize>]>,
    ) -> Result<Screening, AuctionError> {
        self.solve(program, |formulation, solved| {
            let bound = solved.objective_value();
            // `get_solution` copies every vector of the solution: once per solve.
            let solution = solved.get_solution();
            let choice = formulation
                .integral_choice(solution.columns(), bound)
                .or_else(|| {
                    known
                        .filter(|known| formulation.attains(known, bound))
                        .map(<[Option<usize>]>::to_vec)
                });
            Screening {
                choice,
                bound,
                reach: formulation.reach(&solution, bound),
                values: solution.columns().to_vec(),
                row_duals: solution.dual_rows().to_vec(),
            }
        })
    }

    /// Solves the relaxation to optimality and reads what `read` needs of the optimum; the
    /// model stays, with its basis, for the next solve.
    fn solve<T>(
        &mut self,
        program: &'static str,
        read: impl FnOnce(&Formulation, &highs::SolvedModel) -> T,
    ) -> Result<T, AuctionError> {
        let model = self
            .model
            .take()
            .expect("the model is back after every solve");
        let solved = solved_optimal(model, program)?;
        let read = read(&self.formulation, &solved);
        self.model = Some(Model::from(solved));
        Ok(read)
    }

    /// The component's size as its members times its columns: about the work of a dive, one
    /// LP re-solve over every column per member it settles.
    fn size(&self) -> usize {
        self.formulation.columns_of.len() * self.formulation.columns.len()
    }

    /// Whether a payment may dive: not in a component larger than [`LARGE_COMPONENT`], nor in
    /// one whose PF choice fell back (with bundles drawn anywhere, 50 bidders, their dives
    /// alone took 30-60 s).
    fn may_dive(&self) -> bool {
        self.dives && self.size() <= LARGE_COMPONENT
    }

    /// A choice of the binary program found by diving from the last LP optimum: the column
    /// with the largest fractional value is fixed to 1 (to 0 when that leaves the LP
    /// infeasible) and the LP re-solved from its basis, until the LP optimum is integral.
    /// Given a `guide` (a choice, in member order), fractional columns it takes are fixed
    /// first (a guided dive: it searches near that choice, which payments' dives decided
    /// more often, BENCHMARKS.md). `None` when the dive ends infeasible, or when `enough`,
    /// shown each step's LP optimum, stops it first. The fixed columns are released
    /// afterwards.
    fn dive(
        &mut self,
        program: &'static str,
        guide: Option<&[Option<usize>]>,
        mut enough: impl FnMut(&Formulation, &[f64]) -> bool,
    ) -> Result<Option<Vec<Option<usize>>>, AuctionError> {
        let columns = &self.formulation.columns;
        let guided: Vec<bool> = match guide {
            Some(guide) => (columns.iter())
                .map(|&(position, option)| guide[position] == Some(option))
                .collect(),
            None => vec![false; columns.len()],
        };
        let mut fixed: Vec<Col> = Vec::new();
        // Whether the last column fixed is still at 1, so that an infeasible LP can undo it.
        let mut last_at_one = false;
        let mut found = None;
        let mut model = self
            .model
            .take()
            .expect("the model is back after every solve");
        // Each step fixes a column for good or moves the last one from 1 to 0, so the dive
        // ends within two steps per column.
        for _ in 0..=2 * self.formulation.columns.len() {
            let solved = solve_status(model, program)?;
            let optimal = solved.status() == HighsModelStatus::Optimal;
            let values = solved.get_solution().columns().to_vec();
            model = Model::from(solved);
            if !optimal {
                match fixed.last() {
                    Some(&handle) if last_at_one => {
                        model.change_column_bounds(handle, 0.0..=0.0);
                        last_at_one = false;
                        continue;
                    }
                    _ => break,
                }
            }
            if enough(&self.formulation, &values) {
                break;
            }
            // The guide's columns first, then the largest value, then the first column; the
            // cuts' slack columns, past the program's own, are never fixed.
            let fractional = (values.iter().enumerate())
                .take(guided.len())
                .filter(|&(_, &x)| x > INTEGRALITY && x < 1.0 - INTEGRALITY)
                .max_by(|a, b| {
                    (guided[a.0].cmp(&guided[b.0]))
                        .then(a.1.total_cmp(b.1))
                        .then(b.0.cmp(&a.0))
                });
            let Some((column, _)) = fractional else {
                found = self.formulation.integral_choice(&values, f64::NEG_INFINITY);
                break;
            };
            let handle = self.formulation.handles[column];
            model.change_column_bounds(handle, 1.0..=1.0);
            fixed.push(handle);
            last_at_one = true;
        }
        for handle in fixed {
            model.change_column_bounds(handle, 0.0..=1.0);
        }
        self.model = Some(model);
        Ok(found)
    }

    /// Leaves member `position` out and serves exactly `starving_served` starving members.
    fn exclude(&mut self, position: usize, starving_served: usize) {
        let model = self.model.as_mut().expect("not solving");
        self.formulation.bound_member(model, position, 0.0);
        if let Some(slack) = self.formulation.starving_slack {
            let served = starving_served as f64;
            model.change_column_bounds(slack, served..=served);
        }
    }

    /// Undoes [`Self::exclude`] for the member (the starving count is set by every exclusion).
    fn restore(&mut self, position: usize) {
        let model = self.model.as_mut().expect("not solving");
        self.formulation.bound_member(model, position, 1.0);
    }
}

/// One binary program over a set of bidders, for branch and bound.
struct Program {
    formulation: Formulation,
    /// Whether choosing nothing meets the starving count.
    serves_nobody: bool,
}

impl Program {
    /// The program over `members` with the columns `keep` accepts (by member position and
    /// option).
    fn new(
        context: &Context,
        members: &[usize],
        starving_served: Option<usize>,
        weight: impl Fn(usize, usize) -> f64,
        keep: impl Fn(usize, usize) -> bool,
    ) -> Self {
        let formulation = Formulation::new(context, members, weight, true, starving_served, keep);
        let serves_nobody = starving_served.is_none_or(|served| served == 0);
        Self {
            formulation,
            serves_nobody,
        }
    }

    /// The branch-and-bound model of the program.
    fn model(&mut self) -> Model {
        let problem = std::mem::take(&mut self.formulation.problem);
        let mut model = problem.optimise(Sense::Maximise);
        quiet_single_thread(&mut model);
        model.set_option("mip_rel_gap", 0.0);
        model.set_option("mip_abs_gap", OBJECTIVE_TOLERANCE);
        // Profiled (BENCHMARKS.md): two root heuristics cost more than they save here;
        // feasibility jump has a fixed effort floor.
        model.set_option("mip_heuristic_run_feasibility_jump", false);
        model.set_option("mip_heuristic_run_root_reduced_cost", false);
        // So do the RINS and RENS sub-MIPs (BENCHMARKS.md): off, the PF programs took 42% less
        // time in all on the auction benchmark's `starving` and 22% less on `aligned`, and no
        // more on the round benchmark's; the decision programs (without restarts, see
        // `exceeds`) 35% less on the auction benchmark's families and 10% less on a 256-GPU
        // round's.
        model.set_option("mip_heuristic_run_rins", false);
        model.set_option("mip_heuristic_run_rens", false);
        model
    }

    /// Whether some choice is worth more than `threshold`: a search that prunes every node
    /// whose bound is not above the threshold, so that the first solution it accepts answers
    /// yes and it stops there. `None` when `budget` ran out first.
    fn exceeds(
        mut self,
        program: &'static str,
        threshold: f64,
        budget: PaymentBudget,
    ) -> Result<Option<Exceeds>, AuctionError> {
        if self.formulation.columns.is_empty() {
            // Choosing nothing, worth 0, is the only choice left (if it serves enough).
            let nothing_exceeds = self.serves_nobody && threshold < 0.0;
            return Ok(Some(if nothing_exceeds {
                Exceeds::Yes {
                    found: 0.0,
                    bound: 0.0,
                }
            } else {
                Exceeds::No
            }));
        }
        if budget.branch_and_bound_nodes == 0 {
            return Ok(None);
        }
        let mut model = self.model();
        // HiGHS minimises internally: a maximum's cut-off is the negated threshold.
        model.set_option("objective_bound", -threshold);
        model.set_option("mip_max_improving_sols", 1);
        model.set_option("presolve", "on");
        // A restart re-presolves and re-separates the root once the cut-off has fixed enough
        // columns; a search for one choice above the threshold throws that work away. Off,
        // the auction benchmark's slowest decision program (1,018 columns) took 77 ms instead
        // of 814, and the 256-GPU round's (135 columns) took about as long (BENCHMARKS.md).
        model.set_option("mip_allow_restart", false);
        let nodes = i32::try_from(budget.branch_and_bound_nodes).unwrap_or(i32::MAX);
        model.set_option("mip_max_nodes", nodes);
        let solved = solve_status(model, program)?;
        let found = solved.objective_value();
        match solved.status() {
            HighsModelStatus::Infeasible => Ok(Some(Exceeds::No)),
            // The solution limit ends both a search that found a solution (above the cut-off)
            // and one that ran out of nodes.
            HighsModelStatus::Optimal | HighsModelStatus::ReachedSolutionLimit
                if found.is_finite() && found > threshold =>
            {
                let bound = solved
                    .double_info_value(c"mip_dual_bound")
                    .unwrap_or(f64::INFINITY);
                let bound = bound + tolerance(bound);
                Ok(Some(Exceeds::Yes { found, bound }))
            }
            HighsModelStatus::Optimal => Ok(Some(Exceeds::No)),
            HighsModelStatus::ReachedSolutionLimit | HighsModelStatus::ReachedIterationLimit => {
                Ok(None)
            }
            status => Err(AuctionError::Solver {
                program,
                detail: format!("ended with status {status:?}"),
            }),
        }
    }

    /// The optimal choice in member order, or the best found within `nodes` of branch and
    /// bound (`None` when none was found).
    fn solve(
        mut self,
        program: &'static str,
        tier: Tier,
        nodes: u32,
    ) -> Result<Solved, AuctionError> {
        let choice = vec![None; self.formulation.columns_of.len()];
        if self.formulation.columns.is_empty() {
            return Ok(Solved::Optimal(choice));
        }
        let mut model = self.model();
        if tier == Tier::StarvingServed {
            // A count's LP bound is almost always its optimum (an integral objective over
            // packing rows); what a count program that gets here lacks is a choice attaining
            // it. Feasibility jump finds one at once, where HiGHS otherwise separated about
            // 1,200 cuts over 7 nodes, 70 ms, in a 256-GPU round; its fixed effort costs a few
            // milliseconds, paid only here (BENCHMARKS.md).
            model.set_option("mip_heuristic_run_feasibility_jump", true);
        }
        model.set_option("mip_max_nodes", i32::try_from(nodes).unwrap_or(i32::MAX));
        let solved = solve_status(model, program)?;
        let chosen = |solved: &highs::SolvedModel| {
            let mut choice = choice.clone();
            for (&value, &(position, option)) in solved
                .get_solution()
                .columns()
                .iter()
                .zip(&self.formulation.columns)
            {
                if value > 0.5 {
                    choice[position] = Some(option);
                }
            }
            choice
        };
        match solved.status() {
            HighsModelStatus::Optimal => Ok(Solved::Optimal(chosen(&solved))),
            // HiGHS ends a search stopped by the node limit with either status.
            HighsModelStatus::ReachedSolutionLimit | HighsModelStatus::ReachedIterationLimit => {
                let found = solved.primal_solution_status() == HighsSolutionStatus::Feasible;
                Ok(Solved::OutOfBudget(found.then(|| chosen(&solved))))
            }
            status => Err(AuctionError::Solver {
                program,
                detail: format!("ended with status {status:?}"),
            }),
        }
    }
}

/// What branch and bound found within its nodes.
enum Solved {
    Optimal(Vec<Option<usize>>),
    /// The budget ran out: the best choice found, if any.
    OutOfBudget(Option<Vec<Option<usize>>>),
}

fn solve_status(model: Model, program: &'static str) -> Result<highs::SolvedModel, AuctionError> {
    crate::highs_run::try_solve(model).map_err(|status| AuctionError::Solver {
        program,
        detail: format!("{status:?}"),
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::AppId;
    use crate::auction::{AppBid, BidEntry, Offer};
    use crate::rho::Rho;
    use crate::topology::GpuId;

    fn bid(app: &str, table: &[(&str, f64)]) -> AppBid {
        AppBid {
            app: AppId::from(app),
            rho_old: Some(Rho::new(1.0).expect("valid")),
            bids: table
                .iter()
                .map(|&(gpu, rho)| BidEntry {
                    gpus: vec![GpuId::from(gpu)],
                    rho: Rho::new(rho).expect("valid"),
                })
                .collect(),
        }
    }

    /// GPUs x, y and z. `a` holds y and would gain more on x; `b` holds x and could move to z
    /// at a smaller loss. Neither gains by moving alone; `a` taking x while `b` gives way to z
    /// gains ln 2 - ln 1.25 - (ln 2 - ln(1/0.6)) = 0.288.
    #[test]
    fn an_ejection_finds_what_single_moves_cannot() {
        let offer = Offer::without_topology(["x", "y", "z"].map(GpuId::from).to_vec());
        let bids = [
            bid("a", &[("x", 0.5), ("y", 0.8)]),
            bid("b", &[("x", 0.5), ("z", 0.6)]),
        ];
        let instance = Instance::build(&offer, &bids).expect("valid");
        let contested = contested_classes(&instance);
        let context = Context {
            instance: &instance,
            contested: &contested,
        };
        let position = |app: &str| {
            let bidders = &instance.bidders;
            bidders.iter().position(|b| b.bid.app == AppId::from(app))
        };
        let (a, b) = (
            position("a").expect("a bids"),
            position("b").expect("b bids"),
        );
        // The option standing for table entry `entry` of bidder `at`.
        let option = |at: usize, entry: usize| {
            let options = &instance.bidders[at].options;
            options.iter().position(|option| option.entry == entry)
        };
        let members = [0, 1];
        let mut start = vec![None; 2];
        start[a] = option(a, 1);
        start[b] = option(b, 0);
        let gain = |member, option| instance.gain(member, option);
        let worth = |choice: &[Option<usize>]| {
            welfare(&instance, members.into_iter().zip(choice.iter().copied()))
        };

        let mut search = LocalSearch::new(&context, &members, start.clone(), None, gain);
        assert!(!search.single_moves(), "no single move gains");
        let improved = improve(&context, &members, start.clone(), None, gain);

        let mut expected = vec![None; 2];
        expected[a] = option(a, 0);
        expected[b] = option(b, 1);
        assert_eq!(improved, expected);
        let gained = worth(&improved) - worth(&start);
        assert!(
            (gained - (2f64.ln() - 1.25f64.ln() - 2f64.ln() + (1.0f64 / 0.6).ln())).abs() < 1e-12
        );
        // With `a` excluded (a payer), nothing moves it onto x.
        let mut without_a = start.clone();
        without_a[a] = None;
        assert_eq!(
            improve(&context, &members, without_a.clone(), Some(a), gain),
            without_a
        );
    }

    /// Three bidders each want two of the GPUs x, y and z (an odd cycle), so the LP optimum
    /// takes every bundle by half. A dive fixes one bundle and ends integral, the guide's when
    /// given one; a dive told to stop at its first step finds nothing and leaves the
    /// relaxation as it was.
    #[test]
    fn a_dive_stops_when_told_releases_what_it_fixed_and_follows_its_guide() {
        let offer = Offer::without_topology(["x", "y", "z"].map(GpuId::from).to_vec());
        let pair = |app: &str, first: &str, second: &str| AppBid {
            app: AppId::from(app),
            rho_old: Some(Rho::new(1.0).expect("valid")),
            bids: vec![BidEntry {
                gpus: vec![GpuId::from(first), GpuId::from(second)],
                rho: Rho::new(0.5).expect("valid"),
            }],
        };
        let bids = [
            pair("a", "x", "y"),
            pair("b", "y", "z"),
            pair("c", "x", "z"),
        ];
        let instance = Instance::build(&offer, &bids).expect("valid");
        let contested = contested_classes(&instance);
        let context = Context {
            instance: &instance,
            contested: &contested,
        };
        let members = [0, 1, 2];
        let gain = |member, option| instance.gain(member, option);
        let mut relaxation = Relaxation::new(&context, &members, gain, None);
        let relaxed = relaxation.solve_integral("test", None).expect("solved");
        assert!(relaxed.choice.is_none(), "the LP optimum is fractional");
        assert!((relaxed.bound - 1.5 * 2f64.ln()).abs() < 1e-9);

        let mut steps = 0;
        let stopped = relaxation.dive("test", None, |_, _| {
            steps += 1;
            true
        });
        assert_eq!(stopped.expect("solved"), None);
        assert_eq!(steps, 1);
        let again = relaxation.solve_integral("test", None).expect("solved");
        assert!(
            (again.bound - relaxed.bound).abs() < 1e-9,
            "the stopped dive released what it fixed"
        );

        let mut seen: Vec<Vec<f64>> = Vec::new();
        let dived = relaxation.dive("test", None, |_, values| {
            seen.push(values.to_vec());
            false
        });
        let dived = dived.expect("solved").expect("an integral choice");
        assert_eq!(dived.iter().flatten().count(), 1, "one bundle of the three");
        assert_eq!(
            seen.len(),
            2,
            "the fractional optimum, then the integral one"
        );
        assert!(seen[0].iter().all(|&x| (x - 0.5).abs() < 1e-9));
        assert_eq!(
            dived,
            [Some(0), None, None],
            "unguided, the first of equal columns"
        );

        for guided in 0..3 {
            let mut guide = [None; 3];
            guide[guided] = Some(0);
            let dived = relaxation.dive("test", Some(&guide), |_, _| false);
            assert_eq!(
                dived.expect("solved").expect("integral"),
                guide,
                "the guide's bundle"
            );
        }
    }

    /// The duals' bound, read off the LP with every member, is that LP's optimum with every
    /// member, and never below the LP re-solved without a member (whatever the starving count
    /// then served), on random small instances with starving and holding bidders.
    #[test]
    fn the_duals_bound_every_lp_without_a_member() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(16);
        let gpus: Vec<GpuId> = (0..6)
            .map(|n| GpuId::from(format!("g{n}").as_str()))
            .collect();
        let offer = Offer::without_topology(gpus.clone());
        let mut checked = 0;
        for round in 0..60 {
            let bids: Vec<AppBid> = (0..rng.random_range(2..6))
                .map(|n| AppBid {
                    app: AppId::from(format!("app{round}-{n}").as_str()),
                    rho_old: rng
                        .random_bool(0.5)
                        .then(|| Rho::new(rng.random_range(1.0..4.0)).expect("valid")),
                    bids: (0..rng.random_range(1..5))
                        .map(|_| {
                            let mut bundle: Vec<GpuId> = (0..rng.random_range(1..4))
                                .map(|_| gpus[rng.random_range(0..gpus.len())].clone())
                                .collect();
                            bundle.sort();
                            bundle.dedup();
                            BidEntry {
                                gpus: bundle,
                                rho: Rho::new(rng.random_range(0.2..2.0)).expect("valid"),
                            }
                        })
                        .collect(),
                })
                .collect();
            let instance = Instance::build(&offer, &bids).expect("valid");
            let contested = contested_classes(&instance);
            let context = Context {
                instance: &instance,
                contested: &contested,
            };
            let members: Vec<usize> = (0..instance.bidders.len()).collect();
            let starving = |m: usize| instance.bidders[m].is_starving();
            let served = usize::from(members.iter().any(|&m| starving(m)));
            let gain = |member, option| instance.gain(member, option);
            let mut relaxation = Relaxation::new(&context, &members, gain, Some(served));
            let everyone = relaxation.solve_integral("test", None).expect("solved");
            let formulation = &relaxation.formulation;
            let dual = formulation.dual_bound(&context, &members, &everyone.row_duals);
            let strong = dual.with_everyone + dual.count * served as f64;
            assert!(
                (strong - everyone.bound).abs() < 1e-7,
                "{strong} vs {}",
                everyone.bound
            );
            for position in 0..members.len() {
                // Serving one starving member needs another starving one to serve.
                let others_starve = members.iter().any(|&m| m != position && starving(m));
                for served in 0..=usize::from(others_starve).min(served) {
                    relaxation.exclude(position, served);
                    let without = relaxation.solve_integral("test", None).expect("solved");
                    let bound = dual.without(position, served);
                    assert!(bound >= without.bound, "{bound} < {}", without.bound);
                    relaxation.restore(position);
                    checked += 1;
                }
            }
        }
        assert!(
            checked > 200,
            "only {checked} LPs without a member were compared"
        );
    }

    /// Groups of nearly equal size, in order, never more than `PAYERS_PER_MODEL` and at least
    /// two where there are two payments to split.
    #[test]
    fn pending_payments_split_into_balanced_model_groups() {
        let sizes = |count: usize| -> Vec<usize> {
            let payments: Vec<usize> = (0..count).collect();
            let groups: Vec<&[usize]> = model_groups(&payments).collect();
            assert_eq!(groups.concat(), payments, "every payment once, in order");
            groups.iter().map(|group| group.len()).collect()
        };
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(2), [1, 1]);
        assert_eq!(sizes(5), [3, 2]);
        assert_eq!(sizes(16), [8, 8]);
        assert_eq!(sizes(17), [6, 6, 5]);
        assert_eq!(sizes(52), [8, 8, 8, 7, 7, 7, 7]);
    }
}
