//! The round-by-round mechanism (Themis Pseudocode 1, lines 13-23), the one entry point the
//! simulator and the service drive.
//!
//! On every resource-available event (a lease expiring, a job or app finishing, an app
//! arriving, GPUs added or removed) the caller runs a round: the active apps are sorted by
//! their current rho, the worst ceil((1-f)*N) with unmet demand are offered the free GPUs, they
//! bid, the auction decides, the leftovers go to the other apps, and every allocation becomes a
//! lease of length L. A round is split in two ([`Market::open_round`] and
//! [`Market::close_round`]) so that agents living elsewhere (HPO frameworks over HTTP) can bid
//! in between; [`Market::run_round`] does both with the engine's own agents.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::app::{App, AppId};
use crate::auction::{run_auction, AppBid, AuctionError, AuctionOutcome, Offer, OfferedGpu};
use crate::baselines::{self, Contender, RoundView};
use crate::bids::{generate_bid, BidConfig, PreparedOffer};
use crate::fairness::{rho, ContentionTracker, FairnessContext};
use crate::lease::{Lease, LeaseBook, LeaseError, LeaseId};
use crate::leftover::{hand_out_at_random, hand_out_in_order, LeftoverPolicy, Recipient};
use crate::policy::Policy;
use crate::rho::{rho_old_sort_key, RhoOld};
use crate::time::Timestamp;
use crate::topology::{Cluster, GpuId, GpuIndex, GpuLocation};

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MarketConfig {
    /// Themis's f in (0, 1): the worst (1 - f) fraction of apps by rho bid in each round.
    pub fairness_knob: f64,
    /// L: how long a lease lasts.
    #[serde(with = "crate::time::duration_seconds")]
    pub lease_length: Duration,
    pub bids: BidConfig,
    pub leftover_policy: LeftoverPolicy,
    /// Themis, or a baseline to compare it with.
    #[serde(default)]
    pub policy: Policy,
}

impl Default for MarketConfig {
    fn default() -> Self {
        Self {
            fairness_knob: 0.8,
            lease_length: Duration::from_secs(600),
            bids: BidConfig::default(),
            leftover_policy: LeftoverPolicy::default(),
            policy: Policy::default(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MarketError {
    #[error("the fairness knob f must lie in [0, 1), got {0}")]
    InvalidFairnessKnob(f64),
    #[error("app {0} is already in the market")]
    DuplicateApp(AppId),
    #[error("app {0} is not in the market")]
    UnknownApp(AppId),
    #[error("app {0} was not offered GPUs in this round, so it cannot bid")]
    NotABidder(AppId),
    #[error("GPU {0} changed hands since the round was opened; open a new round")]
    StaleOffer(GpuId),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Auction(#[from] AuctionError),
}

/// An active app and what fairness needs to remember about it.
#[derive(Debug, Clone)]
struct Participant {
    app: App,
    arrival: Timestamp,
    contention_at_arrival: f64,
    /// GPU-seconds of the app's leases that have ended.
    ended_gpu_seconds: f64,
}

/// The engine's state: the cluster, the active apps and the leases.
#[derive(Debug, Clone)]
pub struct Market {
    config: MarketConfig,
    cluster: Cluster,
    unhealthy: BTreeSet<GpuIndex>,
    participants: BTreeMap<AppId, Participant>,
    leases: LeaseBook,
    contention: ContentionTracker,
}

/// An app's standing when a round opens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Standing {
    pub app: AppId,
    pub rho: RhoOld,
    pub unmet_demand: usize,
}

/// The visibility phase of a round: what is offered, and to whom.
#[derive(Debug, Clone)]
pub struct RoundOffer {
    pub now: Timestamp,
    pub offer: PreparedOffer,
    /// The apps invited to bid, worst rho first.
    pub bidders: Vec<AppId>,
    /// Every active app, worst rho first.
    pub standings: Vec<Standing>,
}

/// Everything a round decided, with the inputs needed to recompute it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundOutcome {
    pub now: Timestamp,
    pub seed: u64,
    pub offer: Offer,
    pub policy: Policy,
    pub standings: Vec<Standing>,
    /// The bids and the auction's decision; `None` under a baseline policy.
    pub auction: Option<AuctionRecord>,
    /// GPUs handed out after the auction, by the leftover policy and then to any app with
    /// unmet demand so that no offered GPU stays idle.
    pub leftover_grants: BTreeMap<AppId, Vec<GpuId>>,
    /// Every allocation of the round, as leases.
    pub leases: Vec<Lease>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuctionRecord {
    pub bids: Vec<AppBid>,
    pub outcome: AuctionOutcome,
}

impl Market {
    pub fn new(
        cluster: Cluster,
        config: MarketConfig,
        now: Timestamp,
    ) -> Result<Self, MarketError> {
        if !(0.0..1.0).contains(&config.fairness_knob) {
            return Err(MarketError::InvalidFairnessKnob(config.fairness_knob));
        }
        Ok(Self {
            config,
            cluster,
            unhealthy: BTreeSet::new(),
            participants: BTreeMap::new(),
            leases: LeaseBook::new(),
            contention: ContentionTracker::new(now),
        })
    }

    pub fn config(&self) -> &MarketConfig {
        &self.config
    }

    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    pub fn leases(&self) -> &LeaseBook {
        &self.leases
    }

    pub fn apps(&self) -> impl Iterator<Item = &App> {
        self.participants
            .values()
            .map(|participant| &participant.app)
    }

    pub fn app(&self, id: &AppId) -> Option<&App> {
        self.participants
            .get(id)
            .map(|participant| &participant.app)
    }

    /// For progress reports: completed iterations, observed slowdowns, jobs stopped, phases.
    pub fn app_mut(&mut self, id: &AppId) -> Option<&mut App> {
        self.participants
            .get_mut(id)
            .map(|participant| &mut participant.app)
    }

    pub fn add_app(&mut self, app: App, now: Timestamp) -> Result<(), MarketError> {
        if self.participants.contains_key(&app.id) {
            return Err(MarketError::DuplicateApp(app.id));
        }
        self.contention
            .set_active_apps(now, self.participants.len() as u32 + 1);
        let contention_at_arrival = self.contention.integral_at(now);
        let participant = Participant {
            app,
            arrival: now,
            contention_at_arrival,
            ended_gpu_seconds: 0.0,
        };
        self.participants
            .insert(participant.app.id.clone(), participant);
        Ok(())
    }

    /// The app is done (or withdrawn): its leases end and it leaves the market.
    pub fn remove_app(&mut self, id: &AppId, now: Timestamp) -> Result<Vec<Lease>, MarketError> {
        self.participants
            .remove(id)
            .ok_or_else(|| MarketError::UnknownApp(id.clone()))?;
        self.contention
            .set_active_apps(now, self.participants.len() as u32);
        let held: Vec<LeaseId> = self.leases.leases_of(id).map(|lease| lease.id).collect();
        Ok(held
            .into_iter()
            .filter_map(|lease| self.leases.release(lease, now).ok())
            .collect())
    }

    pub fn expire_leases(&mut self, now: Timestamp) -> Vec<Lease> {
        let expired = self.leases.expire_due(now);
        self.credit_ended(&expired);
        expired
    }

    pub fn release_lease(&mut self, id: LeaseId, now: Timestamp) -> Result<Lease, MarketError> {
        let released = self.leases.release(id, now)?;
        self.credit_ended(std::slice::from_ref(&released));
        Ok(released)
    }

    /// Marks a GPU healthy or not. Losing a GPU revokes the lease holding it.
    pub fn set_gpu_health(
        &mut self,
        gpu: GpuIndex,
        healthy: bool,
        now: Timestamp,
    ) -> Option<Lease> {
        if healthy {
            self.unhealthy.remove(&gpu);
            return None;
        }
        self.unhealthy.insert(gpu);
        let revoked = self.leases.revoke_gpu(gpu, now)?;
        self.credit_ended(std::slice::from_ref(&revoked));
        Some(revoked)
    }

    /// Healthy GPUs that no active lease holds.
    pub fn free_gpus(&self) -> Vec<GpuIndex> {
        self.cluster
            .gpus()
            .map(|(index, _)| index)
            .filter(|gpu| !self.unhealthy.contains(gpu) && !self.leases.is_leased(*gpu))
            .collect()
    }

    fn held_locations(&self, app: &AppId) -> Vec<GpuLocation> {
        self.leases
            .leases_of(app)
            .flat_map(|lease| lease.gpus.iter().map(|&gpu| self.cluster.location(gpu)))
            .collect()
    }

    fn fairness_context(&self, participant: &Participant, now: Timestamp) -> FairnessContext {
        FairnessContext {
            now,
            arrival: participant.arrival,
            cluster_gpus: self.cluster.len() as u32,
            average_contention: self.contention.average_since(
                participant.arrival,
                participant.contention_at_arrival,
                now,
            ),
        }
    }

    /// The app's current rho: what it will reach holding what it holds now.
    pub fn current_rho(&self, id: &AppId, now: Timestamp) -> Option<RhoOld> {
        let participant = self.participants.get(id)?;
        Some(rho(
            &participant.app,
            &self.held_locations(id),
            &self.fairness_context(participant, now),
        ))
    }

    /// Every active app, worst rho first (starving apps before all others; ties by app id).
    pub fn standings(&self, now: Timestamp) -> Vec<Standing> {
        let mut standings: Vec<Standing> = self
            .participants
            .values()
            .map(|participant| {
                let held = self.held_locations(&participant.app.id);
                Standing {
                    app: participant.app.id.clone(),
                    rho: rho(
                        &participant.app,
                        &held,
                        &self.fairness_context(participant, now),
                    ),
                    unmet_demand: (participant.app.current_demand() as usize)
                        .saturating_sub(held.len()),
                }
            })
            .collect();
        standings.sort_by(|a, b| {
            rho_old_sort_key(b.rho)
                .total_cmp(&rho_old_sort_key(a.rho))
                .then(a.app.cmp(&b.app))
        });
        standings
    }

    /// Opens a round: offers the free GPUs to the worst ceil((1-f)*N) apps (at least one)
    /// that still want GPUs. `None` when there is nothing to offer or nobody to offer it to.
    pub fn open_round(&self, now: Timestamp) -> Option<RoundOffer> {
        let free = self.free_gpus();
        let standings = self.standings(now);
        let bidder_count = ((1.0 - self.config.fairness_knob) * standings.len() as f64)
            .ceil()
            .max(1.0) as usize;
        let bidders: Vec<AppId> = standings
            .iter()
            .filter(|standing| standing.unmet_demand > 0)
            .take(bidder_count)
            .map(|standing| standing.app.clone())
            .collect();
        if free.is_empty() || bidders.is_empty() {
            return None;
        }
        let offer = PreparedOffer::new(Offer::from_cluster(&self.cluster, &free));
        Some(RoundOffer {
            now,
            offer,
            bidders,
            standings,
        })
    }

    /// The engine's agent: the bid `app` makes for `offer` from what its framework reported.
    pub fn agent_bid(&self, offer: &RoundOffer, app: &AppId) -> Result<AppBid, MarketError> {
        let participant = self
            .participants
            .get(app)
            .ok_or_else(|| MarketError::UnknownApp(app.clone()))?;
        let context = self.fairness_context(participant, offer.now);
        Ok(generate_bid(
            &participant.app,
            &self.held_locations(app),
            &offer.offer,
            &context,
            &self.config.bids,
        ))
    }

    /// The allocation phase: runs the auction on `bids`, hands out the leftovers and grants
    /// the leases. Fails, changing nothing, if the bids are invalid or the offer is stale.
    pub fn close_round(
        &mut self,
        round: RoundOffer,
        bids: Vec<AppBid>,
        seed: u64,
    ) -> Result<RoundOutcome, MarketError> {
        if let Some(bid) = bids.iter().find(|bid| !round.bidders.contains(&bid.app)) {
            return Err(MarketError::NotABidder(bid.app.clone()));
        }
        let offered = self.offered_indices(&round.offer.offer)?;
        let auction = run_auction(&round.offer.offer, &bids, seed)?;
        let mut leftover = offered_subset(&round.offer.offer, &auction.unallocated);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ LEFTOVER_STREAM);
        let mut granted: BTreeMap<AppId, Vec<GpuId>> = auction
            .allocation
            .iter()
            .filter(|(_, gpus)| !gpus.is_empty())
            .map(|(a, g)| (a.clone(), g.clone()))
            .collect();
        let mut leftover_grants = BTreeMap::new();
        let non_bidders = self.recipients(&round, &granted, |app| !round.bidders.contains(app));
        let by_policy = match self.config.leftover_policy {
            LeftoverPolicy::RandomToNonBidders => {
                hand_out_at_random(&mut leftover, non_bidders, &mut rng)
            }
            LeftoverPolicy::ReauctionNextWorst => {
                self.reauction(&round, non_bidders, &mut leftover, seed)?
            }
        };
        merge(&mut leftover_grants, by_policy.clone());
        merge(&mut granted, by_policy);
        let anyone = self.recipients(&round, &granted, |_| true);
        let sweep = hand_out_in_order(&mut leftover, &anyone);
        merge(&mut leftover_grants, sweep.clone());
        merge(&mut granted, sweep);
        let leases = self.grant_leases(&granted, &offered, round.now)?;
        Ok(RoundOutcome {
            now: round.now,
            seed,
            offer: round.offer.offer,
            policy: Policy::Themis,
            standings: round.standings,
            auction: Some(AuctionRecord {
                bids,
                outcome: auction,
            }),
            leftover_grants,
            leases,
        })
    }

    /// Runs a whole round under the configured policy: for Themis, opens it, lets the engine's
    /// agent bid for every bidder and closes it; for a baseline, hands the free GPUs out by the
    /// baseline's metric. `None` when there is nothing to offer or nobody wants it.
    pub fn run_round(
        &mut self,
        now: Timestamp,
        seed: u64,
    ) -> Option<Result<RoundOutcome, MarketError>> {
        if self.config.policy != Policy::Themis {
            return self.run_baseline_round(now, seed);
        }
        let round = self.open_round(now)?;
        let bids: Result<Vec<AppBid>, MarketError> = round
            .bidders
            .iter()
            .map(|app| self.agent_bid(&round, app))
            .collect();
        Some(bids.and_then(|bids| self.close_round(round, bids, seed)))
    }

    fn run_baseline_round(
        &mut self,
        now: Timestamp,
        seed: u64,
    ) -> Option<Result<RoundOutcome, MarketError>> {
        let free = self.free_gpus();
        let standings = self.standings(now);
        if free.is_empty() || standings.iter().all(|standing| standing.unmet_demand == 0) {
            return None;
        }
        let offer = Offer::from_cluster(&self.cluster, &free);
        let contenders = standings
            .iter()
            .filter(|standing| standing.unmet_demand > 0)
            .map(|standing| {
                let participant = &self.participants[&standing.app];
                Contender {
                    app: &participant.app,
                    holds: self.held_locations(&standing.app),
                    unmet_demand: standing.unmet_demand,
                    attained_gpu_seconds: self.attained_gpu_seconds(participant, now),
                    fairness: self.fairness_context(participant, now),
                    rho: standing.rho,
                    lease_seconds: self.config.lease_length.as_secs_f64(),
                }
            })
            .collect();
        let view = RoundView {
            now,
            free: &offer.gpus,
            contenders,
        };
        let granted = baselines::allocate(self.config.policy, &view);
        let offered = free
            .iter()
            .map(|&gpu| (self.cluster.gpu(gpu).id.clone(), gpu))
            .collect();
        Some(
            self.grant_leases(&granted, &offered, now)
                .map(|leases| RoundOutcome {
                    now,
                    seed,
                    offer,
                    policy: self.config.policy,
                    standings,
                    auction: None,
                    leftover_grants: BTreeMap::new(),
                    leases,
                }),
        )
    }

    /// GPU-seconds the app has held: ended leases plus the running part of active ones.
    fn attained_gpu_seconds(&self, participant: &Participant, now: Timestamp) -> f64 {
        let running: f64 = self
            .leases
            .leases_of(&participant.app.id)
            .map(|lease| lease.gpus.len() as f64 * now.saturating_since(lease.start).as_secs_f64())
            .sum();
        participant.ended_gpu_seconds + running
    }

    /// Books the GPU time of leases that just ended to their apps.
    fn credit_ended(&mut self, ended: &[Lease]) {
        for lease in ended {
            if let (Some(participant), Some(ended_at)) =
                (self.participants.get_mut(&lease.app), lease.ended_at)
            {
                participant.ended_gpu_seconds +=
                    lease.gpus.len() as f64 * ended_at.saturating_since(lease.start).as_secs_f64();
            }
        }
    }

    /// Maps the offer back to cluster GPUs, checking they are all still free.
    fn offered_indices(&self, offer: &Offer) -> Result<HashMap<GpuId, GpuIndex>, MarketError> {
        offer
            .gpus
            .iter()
            .map(|gpu| {
                let index = self.cluster.index_of(&gpu.id).filter(|index| {
                    !self.leases.is_leased(*index) && !self.unhealthy.contains(index)
                });
                index
                    .map(|index| (gpu.id.clone(), index))
                    .ok_or_else(|| MarketError::StaleOffer(gpu.id.clone()))
            })
            .collect()
    }

    /// Apps chosen by `eligible` that still want GPUs after `granted`, worst rho first.
    fn recipients(
        &self,
        round: &RoundOffer,
        granted: &BTreeMap<AppId, Vec<GpuId>>,
        eligible: impl Fn(&AppId) -> bool,
    ) -> Vec<Recipient> {
        round
            .standings
            .iter()
            .filter(|standing| eligible(&standing.app))
            .filter_map(|standing| {
                let got = granted.get(&standing.app).map_or(0, Vec::len);
                let unmet_demand = standing.unmet_demand.saturating_sub(got);
                (unmet_demand > 0).then(|| Recipient {
                    app: standing.app.clone(),
                    unmet_demand,
                    holds: self.held_locations(&standing.app),
                })
            })
            .collect()
    }

    /// The authors' simulator's leftover rule: auction the leftovers among the next-worst
    /// ceil((1-f)*N) non-bidders, again and again, until nothing or nobody is left.
    fn reauction(
        &self,
        round: &RoundOffer,
        mut candidates: Vec<Recipient>,
        leftover: &mut Vec<OfferedGpu>,
        seed: u64,
    ) -> Result<BTreeMap<AppId, Vec<GpuId>>, MarketError> {
        let batch = ((1.0 - self.config.fairness_knob) * round.standings.len() as f64)
            .ceil()
            .max(1.0) as usize;
        let mut granted = BTreeMap::new();
        let mut pass = 0u64;
        while !leftover.is_empty() && !candidates.is_empty() {
            pass += 1;
            let bidders: Vec<Recipient> = candidates.drain(..batch.min(candidates.len())).collect();
            let sub_round = RoundOffer {
                now: round.now,
                offer: PreparedOffer::new(Offer {
                    gpus: leftover.clone(),
                }),
                bidders: bidders
                    .iter()
                    .map(|recipient| recipient.app.clone())
                    .collect(),
                standings: Vec::new(),
            };
            let bids: Vec<AppBid> = sub_round
                .bidders
                .iter()
                .map(|app| self.agent_bid(&sub_round, app))
                .collect::<Result<_, _>>()?;
            let outcome = run_auction(&sub_round.offer.offer, &bids, seed.wrapping_add(pass))?;
            *leftover = offered_subset(&sub_round.offer.offer, &outcome.unallocated);
            merge(
                &mut granted,
                outcome
                    .allocation
                    .into_iter()
                    .filter(|(_, gpus)| !gpus.is_empty())
                    .collect(),
            );
        }
        Ok(granted)
    }

    /// One lease per app for everything it got this round. All or nothing: the grants were
    /// computed from a consistent state, so a failure here is a bug, reported as an error.
    fn grant_leases(
        &mut self,
        granted: &BTreeMap<AppId, Vec<GpuId>>,
        offered: &HashMap<GpuId, GpuIndex>,
        now: Timestamp,
    ) -> Result<Vec<Lease>, MarketError> {
        let mut book = self.leases.clone();
        let mut ids = Vec::with_capacity(granted.len());
        for (app, gpus) in granted.iter().filter(|(_, gpus)| !gpus.is_empty()) {
            let indices = gpus.iter().map(|gpu| offered[gpu]).collect();
            ids.push(book.grant(app.clone(), indices, now, self.config.lease_length)?);
        }
        self.leases = book;
        Ok(ids
            .into_iter()
            .filter_map(|id| self.leases.get(id).cloned())
            .collect())
    }
}

/// Separates the leftover RNG stream from the auction's, which uses the seed as it is.
const LEFTOVER_STREAM: u64 = 0x9E37_79B9_7F4A_7C15;

/// The GPUs of `offer` named in `ids`, in offer order.
fn offered_subset(offer: &Offer, ids: &[GpuId]) -> Vec<OfferedGpu> {
    let wanted: HashSet<&GpuId> = ids.iter().collect();
    offer
        .gpus
        .iter()
        .filter(|gpu| wanted.contains(&gpu.id))
        .cloned()
        .collect()
}

fn merge(into: &mut BTreeMap<AppId, Vec<GpuId>>, from: BTreeMap<AppId, Vec<GpuId>>) {
    for (app, gpus) in from {
        into.entry(app).or_default().extend(gpus);
    }
}
