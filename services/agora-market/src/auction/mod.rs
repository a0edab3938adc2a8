//! The partial-allocation auction (Themis §3.3.1, Pseudocode 1 lines 5-11), run by the arbiter.
//!
//! 1. Proportional-fair (PF) choice: each bidder gets at most one bundle of its table, bundles
//!    disjoint, maximising the product of valuations v = 1/rho (an app that gets nothing is
//!    valued at 1/rho_old). Solved exactly by HiGHS as a binary program, see [`solver`].
//! 2. Hidden payment: bidder i keeps a share c_i in (0, 1] of its PF bundle, where c_i is the
//!    product of the other bidders' valuations with i present over the same product in the PF
//!    solution without i.
//! 3. GPUs are indivisible: i keeps floor or ceil of c_i * k of its k GPUs (ceil with probability
//!    frac(c_i * k), from the seeded RNG), the best-placed subset.
//!
//! The rounding's uniform draws are made before the payments, so a payment is computed only as
//! precisely as its rounding needs: the count of GPUs kept is exact, and c_i is then known
//! exactly or to a certified interval (`c_bounds`) inside which the count does not change.
//!
//! Starving bidders (no GPU held, rho_old infinite) are handled as described in
//! `docs/mechanism.md`: they are served first, and a starving winner keeps at least one GPU.

mod cuts;
mod solver;

pub use solver::{PaymentBudget, PaymentStats, PfBudget, PfStats, ShareBounds};

use std::collections::{BTreeMap, HashMap, HashSet};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::app::AppId;
use crate::rho::{Rho, RhoOld};
use crate::topology::{Cluster, GpuId, GpuIndex, GpuLocation, PlacementIndex};

/// One row of a bid table: a bundle of offered GPUs and the app's rho if it wins it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BidEntry {
    pub gpus: Vec<GpuId>,
    pub rho: Rho,
}

/// An app's bid: its rho if it wins nothing (`None`: it holds no GPU, so it is starving) and
/// its table of bundles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppBid {
    pub app: AppId,
    /// Required in JSON (`null` for starving): a forgotten key must not read as "starving".
    #[serde(deserialize_with = "Option::deserialize")]
    pub rho_old: RhoOld,
    pub bids: Vec<BidEntry>,
}

/// A free GPU offered in an auction, with what placement needs to know about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OfferedGpu {
    pub id: GpuId,
    pub location: GpuLocation,
    /// Offered GPUs with equal classes are interchangeable (same slot, same type).
    pub interchange_class: u32,
}

/// The set of free GPUs an auction allocates.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Offer {
    pub gpus: Vec<OfferedGpu>,
}

impl Offer {
    /// GPUs of a known cluster.
    pub fn from_cluster(cluster: &Cluster, gpus: &[GpuIndex]) -> Self {
        let gpus = gpus
            .iter()
            .map(|&gpu| OfferedGpu {
                id: cluster.gpu(gpu).id.clone(),
                location: cluster.location(gpu),
                interchange_class: cluster.interchange_class(gpu),
            })
            .collect();
        Self { gpus }
    }

    /// GPUs with no topology: each is its own slot, machine, rack and class.
    pub fn without_topology(ids: impl IntoIterator<Item = GpuId>) -> Self {
        let gpus = ids
            .into_iter()
            .enumerate()
            .map(|(n, id)| {
                let n = n as u32;
                OfferedGpu {
                    id,
                    location: GpuLocation {
                        rack: n,
                        machine: n,
                        slot: n,
                    },
                    interchange_class: n,
                }
            })
            .collect();
        Self { gpus }
    }

    pub fn ids(&self) -> impl Iterator<Item = &GpuId> {
        self.gpus.iter().map(|gpu| &gpu.id)
    }
}

/// What the auction decided.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AuctionOutcome {
    /// Index into each bidder's table of its PF bundle; `None` if the PF solution gives it
    /// nothing.
    pub pf: BTreeMap<AppId, Option<usize>>,
    /// The concrete GPUs of each PF bundle. Interchangeable GPUs (same slot, same type) may be
    /// swapped for the ones the bid named when two winners named the same ones.
    pub pf_gpus: BTreeMap<AppId, Vec<GpuId>>,
    /// Hidden-payment share c_i in (0, 1] of every bidder (1 for bidders that won nothing):
    /// exact, except for the bidders in `c_bounds`, where it is the interval's upper end.
    pub c: BTreeMap<AppId, f64>,
    /// Payments known only as precisely as their rounding needed: c_i lies in the interval,
    /// and every share in it above its lower end keeps the same number of GPUs with the
    /// round's draw (at the lower end itself, to the solver's tolerance).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub c_bounds: BTreeMap<AppId, ShareBounds>,
    /// The GPUs each bidder keeps: a subset of its PF bundle.
    pub allocation: BTreeMap<AppId, Vec<GpuId>>,
    /// Offered GPUs nobody keeps: hidden payments plus GPUs no PF bundle used. These are the
    /// round's leftovers.
    pub unallocated: Vec<GpuId>,
    /// Winners whose payment could not be decided within the [`PaymentBudget`]: their c is
    /// the LP counterfactual's share (against the LP relaxation of the others' program), never
    /// above the exact share (docs/mechanism.md). The budget counts branch-and-bound nodes,
    /// not seconds, so a replay reaches the same list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub payment_fallbacks: Vec<AppId>,
    /// Bidders whose conflict component's PF choice is the best found within the [`PfBudget`]
    /// of branch-and-bound nodes, not proved optimal; their payments run no dive and no binary
    /// program, so those the LP screening leaves open fall back (docs/mechanism.md). Nodes,
    /// not seconds: a replay reaches the same choice.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pf_fallbacks: Vec<AppId>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AuctionError {
    #[error("GPU {0} is offered twice")]
    DuplicateOfferedGpu(GpuId),
    #[error("app {0} bids twice in one auction; send one bid per app")]
    DuplicateApp(AppId),
    #[error("app {app}, bid {entry}: the bundle is empty; a bid entry must name at least one GPU")]
    EmptyBundle { app: AppId, entry: usize },
    #[error("app {app}, bid {entry}: GPU {gpu} is not in the offer")]
    GpuNotOffered {
        app: AppId,
        entry: usize,
        gpu: GpuId,
    },
    #[error("app {app}, bid {entry}: GPU {gpu} appears twice in the bundle")]
    DuplicateGpuInBundle {
        app: AppId,
        entry: usize,
        gpu: GpuId,
    },
    #[error("the solver failed on the {program} program: {detail}")]
    Solver {
        program: &'static str,
        detail: String,
    },
}

/// Checks one bid against an offer the way [`run_auction`] does (non-empty bundles of offered,
/// distinct GPUs), so a service can refuse a bad bid when it arrives.
pub fn validate_bid(offer: &Offer, bid: &AppBid) -> Result<(), AuctionError> {
    Instance::build(offer, std::slice::from_ref(bid)).map(|_| ())
}

/// Runs the partial-allocation auction. Deterministic: the same offer, bids and seed give the
/// same outcome, whatever order the bids come in.
pub fn run_auction(
    offer: &Offer,
    bids: &[AppBid],
    seed: u64,
) -> Result<AuctionOutcome, AuctionError> {
    let auction = Auction::new(offer, bids)?;
    let pf = auction.proportional_fair()?;
    let payments = auction.payments(&pf, seed)?;
    Ok(auction.settle(&pf, &payments))
}

/// An auction run phase by phase, so that a caller can see where the time goes (`agora auction
/// solve --timings`): [`run_auction`] is `new`, `proportional_fair`, `payments`, `settle`.
#[derive(Debug)]
pub struct Auction<'a> {
    instance: Instance<'a>,
    structure: solver::Structure,
}

/// The PF choice of an [`Auction`].
#[derive(Debug, Clone)]
pub struct PfChoice {
    solved: solver::Pf,
}

impl PfChoice {
    pub fn stats(&self) -> PfStats {
        self.solved.stats
    }
}

/// The hidden payments of an [`Auction`], with the rounding draws they were decided for.
#[derive(Debug)]
pub struct Payments {
    shares: solver::Shares,
    draws: Vec<f64>,
}

impl Payments {
    pub fn stats(&self) -> PaymentStats {
        self.shares.stats
    }
}

impl<'a> Auction<'a> {
    /// Validates the bids against the offer (see [`validate_bid`]) and finds the conflict
    /// structure.
    pub fn new(offer: &'a Offer, bids: &'a [AppBid]) -> Result<Self, AuctionError> {
        let instance = Instance::build(offer, bids)?;
        let structure = solver::Structure::of(&instance);
        Ok(Self {
            instance,
            structure,
        })
    }

    /// The proportional-fair choice within the default budget, the one rounds use.
    pub fn proportional_fair(&self) -> Result<PfChoice, AuctionError> {
        self.proportional_fair_within(PfBudget::default())
    }

    /// The proportional-fair choice; a component whose branch and bound needs more than
    /// `budget` keeps the best choice found, listed in [`AuctionOutcome::pf_fallbacks`].
    pub fn proportional_fair_within(&self, budget: PfBudget) -> Result<PfChoice, AuctionError> {
        let solved = solver::proportional_fair(&self.instance, &self.structure, budget)?;
        Ok(PfChoice { solved })
    }

    /// Every bidder's hidden payment within the default budget, the one rounds use, for the
    /// rounding draws of `seed`.
    pub fn payments(&self, pf: &PfChoice, seed: u64) -> Result<Payments, AuctionError> {
        self.payments_within(pf, seed, PaymentBudget::default())
    }

    /// Every bidder's hidden payment; a payment that needs more than `budget` falls back to
    /// the LP counterfactual and is listed in [`AuctionOutcome::payment_fallbacks`].
    pub fn payments_within(
        &self,
        pf: &PfChoice,
        seed: u64,
        budget: PaymentBudget,
    ) -> Result<Payments, AuctionError> {
        let options = &pf.solved.options;
        let draws = rounding_draws(options, seed);
        let roundings = self.instance.roundings(options, &draws);
        let shares = solver::payments(
            &self.instance,
            &self.structure,
            &pf.solved,
            &roundings,
            budget,
        )?;
        Ok(Payments { shares, draws })
    }

    /// Rounds the shares to whole GPUs with the payments' draws and gives each winner concrete
    /// GPUs.
    pub fn settle(&self, pf: &PfChoice, payments: &Payments) -> AuctionOutcome {
        let mut outcome = self.instance.settle(&pf.solved.options, payments);
        let fell_back = pf.solved.bidders_fell_back(&self.structure);
        outcome.pf_fallbacks = (self.instance.bidders.iter().zip(fell_back))
            .filter(|(_, fell_back)| *fell_back)
            .map(|(bidder, _)| bidder.bid.app.clone())
            .collect();
        outcome.pf_fallbacks.sort();
        outcome
    }
}

/// An auction with GPUs aggregated into classes of interchangeable GPUs and bundles into
/// per-class counts, ready for the solver.
#[derive(Debug)]
struct Instance<'a> {
    offer: &'a Offer,
    /// Number of offered GPUs per class.
    capacity: Vec<u32>,
    /// Bidders in the order of [`by_content`].
    bidders: Vec<Bidder<'a>>,
}

#[derive(Debug)]
struct Bidder<'a> {
    bid: &'a AppBid,
    /// Distinct bundles worth bidding on, by per-class counts; see [`Instance::options`].
    options: Vec<BundleOption>,
}

impl Bidder<'_> {
    fn is_starving(&self) -> bool {
        self.bid.rho_old.is_none()
    }
}

#[derive(Debug, Clone)]
struct BundleOption {
    /// (class, count), sorted by class.
    counts: Vec<(usize, u32)>,
    /// Index of the table entry this option stands for (the lowest rho among equal bundles).
    entry: usize,
    /// ln(1/rho) of the bundle.
    log_valuation: f64,
    gpu_count: u32,
}

/// A choice of at most one option per bidder (indices into `Bidder::options`).
type Choice = Vec<Option<usize>>;

impl<'a> Instance<'a> {
    fn build(offer: &'a Offer, bids: &'a [AppBid]) -> Result<Self, AuctionError> {
        let mut position = HashMap::with_capacity(offer.gpus.len());
        let mut class_numbers: HashMap<u32, usize> = HashMap::new();
        let mut class_of_gpu = Vec::with_capacity(offer.gpus.len());
        for (index, gpu) in offer.gpus.iter().enumerate() {
            if position.insert(&gpu.id, index).is_some() {
                return Err(AuctionError::DuplicateOfferedGpu(gpu.id.clone()));
            }
            let next = class_numbers.len();
            class_of_gpu.push(*class_numbers.entry(gpu.interchange_class).or_insert(next));
        }
        let mut capacity = vec![0u32; class_numbers.len()];
        for &class in &class_of_gpu {
            capacity[class] += 1;
        }
        let mut seen = HashSet::with_capacity(bids.len());
        if let Some(twice) = bids.iter().find(|bid| !seen.insert(&bid.app)) {
            return Err(AuctionError::DuplicateApp(twice.app.clone()));
        }
        let mut sorted: Vec<&AppBid> = bids.iter().collect();
        // Stable: identical bids keep the order they were given in.
        sorted.sort_by(|a, b| by_content(a, b));
        let bidders = sorted
            .into_iter()
            .map(|bid| {
                let options = Self::options(bid, &position, &class_of_gpu)?;
                Ok(Bidder { bid, options })
            })
            .collect::<Result<_, AuctionError>>()?;
        Ok(Self {
            offer,
            capacity,
            bidders,
        })
    }

    /// Validates a bid table and reduces it to the bundles that matter: bundles equal up to
    /// interchangeable GPUs are one option (at its lowest rho), and for a bidder holding GPUs
    /// only bundles that improve on rho_old can raise the PF objective.
    fn options(
        bid: &AppBid,
        position: &HashMap<&GpuId, usize>,
        class_of_gpu: &[usize],
    ) -> Result<Vec<BundleOption>, AuctionError> {
        let mut best: HashMap<Vec<(usize, u32)>, BundleOption> = HashMap::new();
        for (entry, bid_entry) in bid.bids.iter().enumerate() {
            let error_context = |gpu: &GpuId| (bid.app.clone(), entry, gpu.clone());
            if bid_entry.gpus.is_empty() {
                return Err(AuctionError::EmptyBundle {
                    app: bid.app.clone(),
                    entry,
                });
            }
            let mut seen = HashSet::with_capacity(bid_entry.gpus.len());
            let mut counts: BTreeMap<usize, u32> = BTreeMap::new();
            for gpu in &bid_entry.gpus {
                let Some(&index) = position.get(gpu) else {
                    let (app, entry, gpu) = error_context(gpu);
                    return Err(AuctionError::GpuNotOffered { app, entry, gpu });
                };
                if !seen.insert(index) {
                    let (app, entry, gpu) = error_context(gpu);
                    return Err(AuctionError::DuplicateGpuInBundle { app, entry, gpu });
                }
                *counts.entry(class_of_gpu[index]).or_default() += 1;
            }
            let improves = bid
                .rho_old
                .is_none_or(|rho_old| bid_entry.rho.get() < rho_old.get());
            if !improves {
                continue;
            }
            let option = BundleOption {
                counts: counts.into_iter().collect(),
                entry,
                log_valuation: bid_entry.rho.log_valuation(),
                gpu_count: bid_entry.gpus.len() as u32,
            };
            match best.get(&option.counts) {
                Some(kept) if kept.log_valuation >= option.log_valuation => {}
                _ => {
                    best.insert(option.counts.clone(), option);
                }
            }
        }
        let mut options: Vec<BundleOption> = best.into_values().collect();
        options.sort_by_key(|option| option.entry);
        Ok(options)
    }

    /// The objective term of bidder `bidder` taking `option`, relative to winning nothing:
    /// ln(rho_old / rho) for bidders holding GPUs, ln(1/rho) for starving ones (whose
    /// "nothing" is handled by the serve-the-starving-first tier instead).
    fn gain(&self, bidder: usize, option: usize) -> f64 {
        let bidder = &self.bidders[bidder];
        let log_valuation = bidder.options[option].log_valuation;
        match bidder.bid.rho_old {
            Some(rho_old) => log_valuation - rho_old.log_valuation(),
            None => log_valuation,
        }
    }

    /// How each bidder's share turns into whole GPUs: its PF bundle's size and its draw
    /// (`None` for bidders that won nothing).
    fn roundings(&self, options: &Choice, draws: &[f64]) -> Vec<Option<Rounding>> {
        self.bidders
            .iter()
            .zip(options)
            .zip(draws)
            .map(|((bidder, option), &draw)| {
                option.map(|option| Rounding {
                    size: bidder.options[option].gpu_count as usize,
                    starving: bidder.is_starving(),
                    draw,
                })
            })
            .collect()
    }

    /// Turns the solver's choice and payments into allocations of concrete GPUs.
    fn settle(&self, options: &Choice, payments: &Payments) -> AuctionOutcome {
        let shares = &payments.shares;
        let pf_gpus = self.assign_concrete_gpus(options);
        let locations: HashMap<&GpuId, GpuLocation> = self
            .offer
            .gpus
            .iter()
            .map(|gpu| (&gpu.id, gpu.location))
            .collect();
        let mut outcome = AuctionOutcome::default();
        let mut kept_anywhere = HashSet::new();
        for (index, bidder) in self.bidders.iter().enumerate() {
            let app = &bidder.bid.app;
            let share = shares.shares[index];
            if shares.fallback[index] {
                outcome.payment_fallbacks.push(app.clone());
            }
            if !share.is_exact() {
                outcome.c_bounds.insert(app.clone(), share);
            }
            let chosen = options[index].map(|option| bidder.options[option].entry);
            let bundle = &pf_gpus[index];
            let rounding = Rounding {
                size: bundle.len(),
                starving: bidder.is_starving(),
                draw: payments.draws[index],
            };
            let keep = rounding.kept(share.high);
            let kept = best_placed(bundle, keep, &locations);
            kept_anywhere.extend(kept.iter().cloned());
            outcome.pf.insert(app.clone(), chosen);
            outcome.c.insert(app.clone(), share.high);
            outcome.pf_gpus.insert(app.clone(), bundle.clone());
            outcome.allocation.insert(app.clone(), kept);
        }
        outcome.payment_fallbacks.sort();
        outcome.unallocated = self
            .offer
            .ids()
            .filter(|id| !kept_anywhere.contains(*id))
            .cloned()
            .collect();
        outcome
    }

    /// Gives each winner concrete GPUs for its per-class counts, preferring the GPUs its bid
    /// named, then the other GPUs of the class in offer order.
    fn assign_concrete_gpus(&self, options: &Choice) -> Vec<Vec<GpuId>> {
        let mut free_by_class: Vec<Vec<&GpuId>> = vec![Vec::new(); self.capacity.len()];
        let class_numbers: HashMap<&GpuId, usize> = self.class_numbers();
        for gpu in &self.offer.gpus {
            free_by_class[class_numbers[&gpu.id]].push(&gpu.id);
        }
        let mut taken: HashSet<&GpuId> = HashSet::new();
        self.bidders
            .iter()
            .zip(options)
            .map(|(bidder, option)| {
                let Some(option) = option else {
                    return Vec::new();
                };
                let option = &bidder.options[*option];
                let named = &bidder.bid.bids[option.entry].gpus;
                let mut bundle = Vec::with_capacity(option.gpu_count as usize);
                for &(class, count) in &option.counts {
                    let preferred = named.iter().filter(|gpu| class_numbers[gpu] == class);
                    let candidates = preferred.chain(free_by_class[class].iter().copied());
                    let mut picked = 0;
                    for gpu in candidates {
                        if picked == count {
                            break;
                        }
                        if taken.insert(gpu) {
                            bundle.push(gpu.clone());
                            picked += 1;
                        }
                    }
                    debug_assert_eq!(picked, count, "the solver respects class capacities");
                }
                bundle
            })
            .collect()
    }

    fn class_numbers(&self) -> HashMap<&GpuId, usize> {
        let mut numbers: HashMap<u32, usize> = HashMap::new();
        self.offer
            .gpus
            .iter()
            .map(|gpu| {
                let next = numbers.len();
                (
                    &gpu.id,
                    *numbers.entry(gpu.interchange_class).or_insert(next),
                )
            })
            .collect()
    }
}

/// The best-placed `count` GPUs of `bundle`.
fn best_placed(
    bundle: &[GpuId],
    count: usize,
    locations: &HashMap<&GpuId, GpuLocation>,
) -> Vec<GpuId> {
    if count >= bundle.len() {
        return bundle.to_vec();
    }
    let index = PlacementIndex::new(bundle.iter().map(|gpu| locations[gpu]).collect());
    let mut chosen = index.best_subset(count, &[]);
    chosen.sort_unstable();
    chosen
        .into_iter()
        .map(|item| bundle[item].clone())
        .collect()
}

/// Orders bids by what they say, not by who says it: rho_old (starving first), then the table
/// entry by entry. Bidders are solved and their rounding drawn in this order, so renaming an
/// app changes nothing; identical bids keep the order given (a round gives them worst off
/// first, [`crate::round::decide_round`]).
fn by_content(a: &AppBid, b: &AppBid) -> std::cmp::Ordering {
    let rho_old = |bid: &AppBid| bid.rho_old.map_or(f64::INFINITY, |rho| rho.get());
    rho_old(b)
        .total_cmp(&rho_old(a))
        .then(a.bids.len().cmp(&b.bids.len()))
        .then_with(|| {
            a.bids
                .iter()
                .zip(&b.bids)
                .map(|(x, y)| {
                    x.rho
                        .get()
                        .total_cmp(&y.rho.get())
                        .then(x.gpus.cmp(&y.gpus))
                })
                .find(|order| order.is_ne())
                .unwrap_or(std::cmp::Ordering::Equal)
        })
}

/// One uniform draw in [0, 1) per PF winner, in bidder order, from the round's seed: the draw
/// that rounds its share (see [`Rounding`]). Bidders that won nothing draw nothing.
fn rounding_draws(options: &Choice, seed: u64) -> Vec<f64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    options
        .iter()
        .map(|option| option.map_or(0.0, |_| rng.random::<f64>()))
        .collect()
}

/// How a winner's share becomes whole GPUs of its PF bundle.
#[derive(Debug, Clone, Copy)]
struct Rounding {
    /// GPUs in the PF bundle (0 for a bidder that won nothing).
    size: usize,
    starving: bool,
    /// The winner's uniform draw in [0, 1).
    draw: f64,
}

impl Rounding {
    /// How many GPUs the winner keeps with share `share`: c*k rounded up when the draw is below
    /// frac(c*k), i.e. with that probability. Non-decreasing in the share. A starving winner
    /// keeps at least one (see docs/mechanism.md).
    fn kept(&self, share: f64) -> usize {
        if self.size == 0 {
            return 0;
        }
        let exact = share * self.size as f64;
        let floor = exact.floor();
        let round_up = self.draw < exact - floor;
        let kept = (floor as usize + usize::from(round_up)).min(self.size);
        if self.starving {
            kept.max(1)
        } else {
            kept
        }
    }

    /// The share above which the winner keeps more than `kept` GPUs (and at or below which it
    /// keeps at most `kept`), for `kept` below the bundle's size.
    fn threshold(&self, kept: usize) -> f64 {
        (kept as f64 + self.draw) / self.size as f64
    }
}
