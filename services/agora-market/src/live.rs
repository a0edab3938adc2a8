//! The live round as a plain state machine (nearcore's actors around plain state, quickwit's
//! pure scheduling logic beside its control plane).
//!
//! [`LiveMarket`] is everything the service's arbiter decides between its messages: when a
//! round opens, which bids count, when the round closes, how its decision is settled, when
//! leases expire, when a notice is served, when a silent host is given up, and what a refused
//! write means. The arbiter feeds it [`Event`]s stamped with the time they happened and carries
//! out the [`Effect`]s it returns (writes, bid requests, timers, decisions to compute off the
//! arbiter's thread). It reads no clock and does no I/O: the seeds of its rounds come from a
//! generator seeded by the caller, so tests drive it on fake time, event by event.
//!
//! Changes the shell stages itself on a copy of [`LiveMarket::market`] (progress reports,
//! releases, drains, hosts' reports) come back as [`Event::MarketChanged`]: the state machine
//! takes the staged market and decides what it means for the round.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::app::{App, AppId};
use crate::auction::{validate_bid, AppBid, AuctionError};
use crate::bids::PreparedOffer;
use crate::lease::Lease;
use crate::market::{
    BidInputs, DecidedRound, Market, MarketError, RoundOffer, RoundOutcome, Withdrawal,
};
use crate::time::Timestamp;
use crate::topology::GpuIndex;

/// A round's number, as the service stores it.
pub type RoundId = i64;

/// How an app bids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bidding {
    /// Its agent bids for it.
    Agent,
    /// Its framework posts its bids; the agent's bid is a fallback.
    Explicit,
}

impl Bidding {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Explicit => "explicit",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "agent" => Some(Self::Agent),
            "explicit" => Some(Self::Explicit),
            _ => None,
        }
    }
}

/// A timer the state machine asks for ([`Effect::SetTimer`]) and is told of
/// ([`Event::TimerFired`]) once due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Timer {
    /// A lease may have reached its end: expire what is due.
    LeaseEnd,
    /// A GPU's notice period is over (drained, or reported unhealthy): revoke its lease.
    Revocation(GpuIndex),
    /// A GPU host may have been silent for two heartbeat intervals: check every host.
    HostLiveness,
    /// Round `id` stops taking bids.
    RoundDeadline(RoundId),
}

/// The service's timing settings that the state machine applies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LiveSettings {
    /// How long a round takes bids.
    pub round_deadline: Duration,
    /// How long a lease given notice runs on before it is revoked.
    pub revocation_grace: Duration,
    /// How often GPU hosts heartbeat; two silent intervals and a host is given up.
    pub heartbeat_interval: Duration,
}

/// A lease on a GPU has been given notice: at `at` the GPU leaves service for `withdrawal` and
/// the lease holding it is revoked.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    pub at: Timestamp,
    pub withdrawal: Withdrawal,
    pub reason: String,
}

/// A round that was open when the arbiter stopped, with the bids frameworks had posted.
#[derive(Debug)]
pub struct ReopenedRound {
    pub id: RoundId,
    pub seed: u64,
    pub deadline: Timestamp,
    pub offer: RoundOffer,
    pub framework_bids: BTreeMap<AppId, AppBid>,
}

/// What the state machine starts from: a fresh market, or one restored from the database.
#[derive(Debug)]
pub struct Recovered {
    pub market: Market,
    /// How each active app bids.
    pub bidding: BTreeMap<AppId, Bidding>,
    pub round: Option<ReopenedRound>,
    pub next_round: RoundId,
}

/// The round collecting bids.
#[derive(Debug)]
pub struct OpenRound {
    pub id: RoundId,
    pub seed: u64,
    pub deadline: Timestamp,
    pub offer: RoundOffer,
    /// Bids posted by frameworks (stored, or queued for storing).
    framework_bids: BTreeMap<AppId, AppBid>,
    /// Bids of the agents: final for agent-bidding apps, fallbacks for explicit ones.
    agent_bids: BTreeMap<AppId, AppBid>,
}

impl OpenRound {
    /// Every bidder still in the market has its final bid: no need to wait for the deadline.
    /// A bidder that left is not waited for (its bid is withdrawn).
    fn complete(&self, bidding: &BTreeMap<AppId, Bidding>) -> bool {
        self.offer.bidders.iter().all(|app| match bidding.get(app) {
            None => true,
            Some(mode) => {
                self.framework_bids.contains_key(app)
                    || (*mode == Bidding::Agent && self.agent_bids.contains_key(app))
            }
        })
    }
}

#[derive(Debug)]
enum Phase {
    Idle,
    Open(Box<OpenRound>),
    /// Closed to bids; its decision is computed elsewhere ([`Effect::Decide`]).
    Deciding {
        id: RoundId,
        agent_bids_used: Vec<AppBid>,
    },
}

/// What happens to the state machine, stamped with when it happened.
#[derive(Debug)]
pub enum Event {
    /// The arbiter starts (afresh or taking over): timers for the restored leases, hosts and
    /// notices, bids for the reopened round, and a round if there is something to offer.
    Started,
    /// An app registered (durably): it joins the market as recorded, with its arrival and
    /// T_cluster.
    AppRegistered {
        app: App,
        bidding: Bidding,
        arrived_at: Timestamp,
        cluster_seconds: f64,
    },
    /// The shell staged a change on a copy of [`LiveMarket::market`] and queued its record:
    /// `departed` left the market in it, and `capacity_freed` says GPUs came free or back.
    MarketChanged {
        market: Box<Market>,
        departed: Vec<AppId>,
        capacity_freed: bool,
    },
    /// A framework posted a bid; the shell stores it before the round's outcome.
    FrameworkBid { round: RoundId, bid: AppBid },
    /// A framework's bid that was counted was not stored: it no longer counts.
    BidNotStored { round: RoundId, app: AppId },
    /// An app's agent answered a bid request.
    AgentBid {
        round: RoundId,
        bid: AppBid,
        /// The framework bids itself; this bid only stands in for it.
        fallback: bool,
    },
    /// A timer asked for with [`Effect::SetTimer`] fell due.
    TimerFired(Timer),
    /// A [`DecideJob`] finished, or failed for the reason given.
    Decided {
        round: RoundId,
        decided: Result<Box<DecidedRound>, String>,
    },
    /// The lease on `gpu` was given notice (its record queued): it is revoked when due.
    NoticeGiven { gpu: GpuIndex, notice: Notice },
    /// `gpu` is back in service for `withdrawal`'s reason: a notice for that reason lapses.
    NoticeCancelled {
        gpu: GpuIndex,
        withdrawal: Withdrawal,
    },
    /// A host registered or heartbeat: it has two heartbeat intervals until the next sign.
    HostSeen { host: String },
    /// The database refused a record: memory is ahead of the source of truth, so the state
    /// machine stops deciding.
    CommitRefused { reason: String },
}

/// What the shell must do, in this order.
#[derive(Debug)]
pub enum Effect {
    /// Write the record after everything queued before it; once durable, tell whom it concerns.
    Record(Box<Record>),
    /// Ask these apps' agents to bid on round `round`'s offer ([`Event::AgentBid`]).
    RequestBids {
        round: RoundId,
        offer: Arc<PreparedOffer>,
        bidders: Vec<(AppId, BidInputs)>,
    },
    /// Fire [`Event::TimerFired`] at `at`.
    SetTimer { at: Timestamp, timer: Timer },
    /// Run the job off the arbiter's thread (the solver may take long) and feed back
    /// [`Event::Decided`].
    Decide(Box<DecideJob>),
    /// Stop: a record was refused; a restart restores the state from the database.
    Halt { reason: String },
}

/// A decision to write, already applied to the state machine's market.
#[derive(Debug)]
pub enum Record {
    RoundOpened {
        id: RoundId,
        seed: u64,
        deadline: Timestamp,
        offer: RoundOffer,
        /// The round's trace, opened with its rho collection.
        span: tracing::Span,
    },
    RoundClosed {
        id: RoundId,
        outcome: RoundOutcome,
        /// The agents' bids that counted (the frameworks' are stored as they arrive).
        agent_bids_used: Vec<AppBid>,
    },
    /// The round could not be decided, or the market changed under its decision.
    RoundAbandoned { id: RoundId, reason: String },
    /// Leases that reached their end.
    LeasesExpired { leases: Vec<Lease> },
    /// A notice fell due: the GPU left service and the lease holding it, if any, was revoked.
    NoticeServed {
        gpu: GpuIndex,
        notice: Notice,
        revoked: Option<Lease>,
    },
    /// Hosts silent for two heartbeat intervals went down and lost their leases.
    HostsDown { hosts: Vec<HostDown> },
}

/// A host given up for silence.
#[derive(Debug, Clone, PartialEq)]
pub struct HostDown {
    pub host: String,
    pub machine: u32,
    pub reason: String,
    pub revoked: Vec<Lease>,
}

/// A round's decision, to compute on any thread: [`DecideJob::run`].
#[derive(Debug)]
pub struct DecideJob {
    pub round: RoundId,
    /// The market as it was when the job was made.
    snapshot: Market,
    task: DecideTask,
}

#[derive(Debug)]
enum DecideTask {
    First {
        offer: RoundOffer,
        bids: Vec<AppBid>,
        seed: u64,
    },
    /// The same round again, without apps that left since it was first decided.
    Again(DecidedRound),
}

impl DecideJob {
    pub fn run(self) -> Result<DecidedRound, MarketError> {
        match self.task {
            DecideTask::First { offer, bids, seed } => {
                self.snapshot.decide_round(offer, bids, seed)
            }
            DecideTask::Again(decided) => self.snapshot.redecide(decided),
        }
    }
}

/// Why an event was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LiveError {
    #[error("round {0} does not exist")]
    UnknownRound(RoundId),
    #[error("round {0} no longer takes bids")]
    RoundClosed(RoundId),
    #[error("app {app} was not offered GPUs in round {round}")]
    NotABidder { app: AppId, round: RoundId },
    #[error("app {app} already bid in round {round}")]
    AlreadyBid { app: AppId, round: RoundId },
    #[error("the bid table has {entries} entries; at most {limit} are allowed")]
    TableTooLarge { entries: usize, limit: usize },
    #[error("invalid bid: {0}")]
    InvalidBid(#[from] AuctionError),
    #[error(transparent)]
    Market(#[from] MarketError),
    #[error("the arbiter stopped: {0}")]
    Halted(String),
}

/// The live market: the engine's [`Market`] with the round in progress, the notices given and
/// the hosts' last signs of life.
#[derive(Debug)]
pub struct LiveMarket {
    market: Market,
    settings: LiveSettings,
    bidding: BTreeMap<AppId, Bidding>,
    phase: Phase,
    /// Something changed while a round was under way: another opens after it.
    round_wanted: bool,
    next_round: RoundId,
    /// The round restored with the market, until [`Event::Started`] reopens it.
    reopened: Option<ReopenedRound>,
    /// GPUs whose lease has been given notice.
    notices: BTreeMap<GpuIndex, Notice>,
    /// When each host last registered or heartbeat.
    last_seen: BTreeMap<String, Timestamp>,
    seeds: ChaCha8Rng,
    /// Why the state machine stopped, once a record was refused.
    halted: Option<String>,
}

impl LiveMarket {
    /// `seed` seeds the rounds' seeds (each is recorded, so every round replays exactly).
    pub fn new(recovered: Recovered, settings: LiveSettings, seed: u64) -> Self {
        Self {
            market: recovered.market,
            settings,
            bidding: recovered.bidding,
            phase: Phase::Idle,
            round_wanted: false,
            next_round: recovered.next_round,
            reopened: recovered.round,
            notices: BTreeMap::new(),
            last_seen: BTreeMap::new(),
            seeds: ChaCha8Rng::seed_from_u64(seed),
            halted: None,
        }
    }

    pub fn market(&self) -> &Market {
        &self.market
    }

    /// The round collecting bids, if one is.
    pub fn open_round(&self) -> Option<&OpenRound> {
        match &self.phase {
            Phase::Open(round) => Some(round),
            _ => None,
        }
    }

    /// The number the next round will have: every lower one has opened.
    pub fn next_round(&self) -> RoundId {
        self.next_round
    }

    pub fn bidding(&self, app: &AppId) -> Option<Bidding> {
        self.bidding.get(app).copied()
    }

    /// The notice the lease on `gpu` is under, if any.
    pub fn notice(&self, gpu: GpuIndex) -> Option<&Notice> {
        self.notices.get(&gpu)
    }

    /// The notice `gpu`'s lease would get now: the grace period if the GPU is leased, none
    /// if it is free.
    pub fn notice_now(
        &self,
        gpu: GpuIndex,
        withdrawal: Withdrawal,
        reason: String,
        now: Timestamp,
    ) -> Notice {
        let grace = if self.market.leases().is_leased(gpu) {
            self.settings.revocation_grace
        } else {
            Duration::ZERO
        };
        Notice {
            at: now.saturating_add(grace),
            withdrawal,
            reason,
        }
    }

    /// Whether a record was refused and the state machine stopped.
    pub fn is_halted(&self) -> bool {
        self.halted.is_some()
    }

    /// Takes one event, returns what the shell must do. A refused event changes nothing.
    pub fn handle(&mut self, now: Timestamp, event: Event) -> Result<Vec<Effect>, LiveError> {
        if let Some(reason) = &self.halted {
            return Err(LiveError::Halted(reason.clone()));
        }
        let mut effects = Vec::new();
        match event {
            Event::Started => self.start(now, &mut effects),
            Event::AppRegistered {
                app,
                bidding,
                arrived_at,
                cluster_seconds,
            } => {
                let id = app.id.clone();
                self.market.admit(app, arrived_at, cluster_seconds)?;
                self.bidding.insert(id, bidding);
                self.open_round_if_idle(now, &mut effects);
            }
            Event::MarketChanged {
                market,
                departed,
                capacity_freed,
            } => {
                self.market = *market;
                if !departed.is_empty() {
                    for app in &departed {
                        self.bidding.remove(app);
                    }
                    // The round may have waited only for their bids.
                    self.close_round_if_due(now, &mut effects);
                }
                if capacity_freed {
                    self.open_round_if_idle(now, &mut effects);
                }
            }
            Event::FrameworkBid { round, bid } => {
                self.check_framework_bid(now, round, &bid)?;
                if let Phase::Open(open) = &mut self.phase {
                    open.framework_bids.insert(bid.app.clone(), bid);
                }
                self.close_round_if_due(now, &mut effects);
            }
            Event::BidNotStored { round, app } => {
                if let Phase::Open(open) = &mut self.phase {
                    if open.id == round {
                        open.framework_bids.remove(&app);
                    }
                }
            }
            Event::AgentBid { round, bid, .. } => {
                if let Phase::Open(open) = &mut self.phase {
                    if open.id == round {
                        open.agent_bids.insert(bid.app.clone(), bid);
                        self.close_round_if_due(now, &mut effects);
                    }
                }
            }
            Event::TimerFired(timer) => self.timer_fired(now, timer, &mut effects),
            Event::Decided { round, decided } => self.decided(now, round, decided, &mut effects),
            Event::NoticeGiven { gpu, notice } => self.remember_notice(gpu, notice, &mut effects),
            Event::NoticeCancelled { gpu, withdrawal } => {
                if self
                    .notices
                    .get(&gpu)
                    .is_some_and(|notice| notice.withdrawal == withdrawal)
                {
                    self.notices.remove(&gpu);
                }
            }
            Event::HostSeen { host } => self.saw_host(host, now, &mut effects),
            Event::CommitRefused { reason } => {
                self.halted = Some(reason.clone());
                effects.push(Effect::Halt { reason });
            }
        }
        Ok(effects)
    }

    fn start(&mut self, now: Timestamp, effects: &mut Vec<Effect>) {
        let up: Vec<String> = self
            .market
            .hosts()
            .hosts()
            .filter(|host| host.up)
            .map(|host| host.name.clone())
            .collect();
        for host in up {
            self.saw_host(host, now, effects);
        }
        // Leases on GPUs reported unhealthy before the restart had their notice already.
        let unhealthy: BTreeSet<GpuIndex> = self
            .market
            .leases()
            .active()
            .flat_map(|lease| lease.gpus.iter().copied())
            .filter(|&gpu| self.market.is_withdrawn_for(gpu, Withdrawal::Unhealthy))
            .collect();
        for gpu in unhealthy {
            let reason = format!(
                "GPU {} was reported unhealthy before the arbiter restarted",
                self.market.cluster().gpu(gpu).id
            );
            let notice = Notice {
                at: now,
                withdrawal: Withdrawal::Unhealthy,
                reason,
            };
            self.remember_notice(gpu, notice, effects);
        }
        let ends: BTreeSet<Timestamp> = self
            .market
            .leases()
            .active()
            .map(|lease| lease.end)
            .collect();
        effects.extend(ends.into_iter().map(|at| Effect::SetTimer {
            at,
            timer: Timer::LeaseEnd,
        }));
        if let Some(round) = self.reopened.take() {
            effects.push(Effect::SetTimer {
                at: round.deadline,
                timer: Timer::RoundDeadline(round.id),
            });
            self.phase = Phase::Open(Box::new(OpenRound {
                id: round.id,
                seed: round.seed,
                deadline: round.deadline,
                offer: round.offer,
                framework_bids: round.framework_bids,
                agent_bids: BTreeMap::new(),
            }));
            self.request_bids(effects);
        }
        self.open_round_if_idle(now, effects);
    }

    fn timer_fired(&mut self, now: Timestamp, timer: Timer, effects: &mut Vec<Effect>) {
        match timer {
            Timer::LeaseEnd => {
                let leases = self.market.expire_leases(now);
                if !leases.is_empty() {
                    effects.push(Effect::Record(Box::new(Record::LeasesExpired { leases })));
                    self.open_round_if_idle(now, effects);
                }
            }
            Timer::Revocation(gpu) => self.serve_notice(now, gpu, effects),
            Timer::HostLiveness => self.give_up_silent_hosts(now, effects),
            Timer::RoundDeadline(id) => {
                if matches!(&self.phase, Phase::Open(round) if round.id == id) {
                    self.close_round_if_due(now, effects);
                }
            }
        }
    }

    /// A resource-available event: opens a round unless one is under way (then another
    /// follows it).
    fn open_round_if_idle(&mut self, now: Timestamp, effects: &mut Vec<Effect>) {
        if !matches!(self.phase, Phase::Idle) {
            self.round_wanted = true;
            return;
        }
        self.round_wanted = false;
        // Each round is a trace of its own, linked to what opened it.
        let span =
            tracing::info_span!(parent: None, "auction_round", round = tracing::field::Empty);
        span.follows_from(tracing::Span::current());
        let Some(offer) = tracing::info_span!(parent: &span, "rho_collection")
            .in_scope(|| self.market.open_round(now))
        else {
            return;
        };
        let id = self.next_round;
        self.next_round += 1;
        span.record("round", id);
        let seed = self.seeds.random::<u64>();
        let deadline = now.saturating_add(self.settings.round_deadline);
        effects.push(Effect::Record(Box::new(Record::RoundOpened {
            id,
            seed,
            deadline,
            offer: offer.clone(),
            span,
        })));
        effects.push(Effect::SetTimer {
            at: deadline,
            timer: Timer::RoundDeadline(id),
        });
        self.phase = Phase::Open(Box::new(OpenRound {
            id,
            seed,
            deadline,
            offer,
            framework_bids: BTreeMap::new(),
            agent_bids: BTreeMap::new(),
        }));
        self.request_bids(effects);
    }

    /// Asks the agent of every bidder still in the market for its bid.
    fn request_bids(&self, effects: &mut Vec<Effect>) {
        let Phase::Open(round) = &self.phase else {
            return;
        };
        let bidders: Vec<(AppId, BidInputs)> = round
            .offer
            .bidders
            .iter()
            .filter(|app| self.bidding.contains_key(*app))
            .filter_map(|app| {
                let inputs = self.market.bid_inputs(&round.offer, app).ok()?;
                Some((app.clone(), inputs))
            })
            .collect();
        effects.push(Effect::RequestBids {
            round: round.id,
            offer: Arc::new(round.offer.offer.clone()),
            bidders,
        });
    }

    /// Everything that can be checked before a framework's bid is counted.
    fn check_framework_bid(
        &self,
        now: Timestamp,
        round: RoundId,
        bid: &AppBid,
    ) -> Result<(), LiveError> {
        let missing = || {
            if round < self.next_round {
                LiveError::RoundClosed(round)
            } else {
                LiveError::UnknownRound(round)
            }
        };
        let Phase::Open(open) = &self.phase else {
            return Err(missing());
        };
        if open.id != round {
            return Err(missing());
        }
        if now > open.deadline {
            return Err(LiveError::RoundClosed(round));
        }
        let app = bid.app.clone();
        if open.framework_bids.contains_key(&app) {
            return Err(LiveError::AlreadyBid { app, round });
        }
        if !open.offer.bidders.contains(&app) || !self.bidding.contains_key(&app) {
            return Err(LiveError::NotABidder { app, round });
        }
        let limit = self.market.config().bids.max_entries;
        if bid.bids.len() > limit {
            return Err(LiveError::TableTooLarge {
                entries: bid.bids.len(),
                limit,
            });
        }
        validate_bid(&open.offer.offer.offer, bid)?;
        Ok(())
    }

    /// Closes the open round if every bidder has bid or its deadline passed, and hands its
    /// decision out to be computed.
    fn close_round_if_due(&mut self, now: Timestamp, effects: &mut Vec<Effect>) {
        let due = match &self.phase {
            Phase::Open(round) => round.complete(&self.bidding) || now >= round.deadline,
            _ => false,
        };
        if !due {
            return;
        }
        let Phase::Open(round) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return;
        };
        let OpenRound {
            id,
            seed,
            offer,
            framework_bids,
            agent_bids,
            ..
        } = *round;
        let present: Vec<AppId> = offer
            .bidders
            .iter()
            .filter(|app| self.bidding.contains_key(*app))
            .cloned()
            .collect();
        let (bids, agent_bids_used) = final_bids(&present, framework_bids, agent_bids);
        self.phase = Phase::Deciding {
            id,
            agent_bids_used,
        };
        effects.push(Effect::Decide(Box::new(DecideJob {
            round: id,
            snapshot: self.market.clone(),
            task: DecideTask::First { offer, bids, seed },
        })));
    }

    /// A decision came back. If an app it gives GPUs to left meanwhile, the round is decided
    /// again without it (one tenant's app leaving never abandons everyone's round); otherwise
    /// it is settled.
    fn decided(
        &mut self,
        now: Timestamp,
        round: RoundId,
        decided: Result<Box<DecidedRound>, String>,
        effects: &mut Vec<Effect>,
    ) {
        if !matches!(&self.phase, Phase::Deciding { id, .. } if *id == round) {
            return;
        }
        let decided = match decided {
            Ok(decided) if self.market.outdated_by_departure(&decided) => {
                tracing::info!(
                    round,
                    "an app left while the round was decided; deciding it again without it"
                );
                effects.push(Effect::Decide(Box::new(DecideJob {
                    round,
                    snapshot: self.market.clone(),
                    task: DecideTask::Again(*decided),
                })));
                return;
            }
            decided => decided,
        };
        let Phase::Deciding {
            agent_bids_used, ..
        } = std::mem::replace(&mut self.phase, Phase::Idle)
        else {
            return;
        };
        self.settle(now, round, decided, agent_bids_used, effects);
    }

    /// Grants a decided round's leases, or abandons the round (and opens a new one) if it
    /// could not be decided or the market changed under it.
    fn settle(
        &mut self,
        now: Timestamp,
        id: RoundId,
        decided: Result<Box<DecidedRound>, String>,
        agent_bids_used: Vec<AppBid>,
        effects: &mut Vec<Effect>,
    ) {
        let mut next = self.market.clone();
        let applied = decided.and_then(|decided| {
            next.apply_round(*decided)
                .map_err(|error| error.to_string())
        });
        match applied {
            Err(reason) => {
                tracing::warn!(round = id, %reason, "round abandoned; a new one opens");
                effects.push(Effect::Record(Box::new(Record::RoundAbandoned {
                    id,
                    reason,
                })));
                self.open_round_if_idle(now, effects);
            }
            Ok(outcome) => {
                self.market = next;
                let ends: BTreeSet<Timestamp> =
                    outcome.leases.iter().map(|lease| lease.end).collect();
                effects.push(Effect::Record(Box::new(Record::RoundClosed {
                    id,
                    outcome,
                    agent_bids_used,
                })));
                effects.extend(ends.into_iter().map(|at| Effect::SetTimer {
                    at,
                    timer: Timer::LeaseEnd,
                }));
                if self.round_wanted {
                    self.open_round_if_idle(now, effects);
                }
            }
        }
    }

    fn remember_notice(&mut self, gpu: GpuIndex, notice: Notice, effects: &mut Vec<Effect>) {
        effects.push(Effect::SetTimer {
            at: notice.at,
            timer: Timer::Revocation(gpu),
        });
        self.notices.insert(gpu, notice);
    }

    /// A GPU's notice is over: it leaves service and the lease holding it is revoked.
    fn serve_notice(&mut self, now: Timestamp, gpu: GpuIndex, effects: &mut Vec<Effect>) {
        // A notice given again later (after a cancelled one) waits for its own timer.
        if self.notices.get(&gpu).is_none_or(|notice| notice.at > now) {
            return;
        }
        let Some(notice) = self.notices.remove(&gpu) else {
            return;
        };
        self.market.set_withdrawn(gpu, notice.withdrawal, true);
        let revoked = self.market.revoke_gpu(gpu, now);
        let freed = revoked.is_some();
        effects.push(Effect::Record(Box::new(Record::NoticeServed {
            gpu,
            notice,
            revoked,
        })));
        if freed {
            self.open_round_if_idle(now, effects);
        }
    }

    /// The host gave a sign of life: it is given up if silent for two intervals from now.
    fn saw_host(&mut self, host: String, now: Timestamp, effects: &mut Vec<Effect>) {
        self.last_seen.insert(host, now);
        effects.push(Effect::SetTimer {
            at: now.saturating_add(self.settings.heartbeat_interval * 2),
            timer: Timer::HostLiveness,
        });
    }

    /// Every host silent for two heartbeat intervals goes down and the leases on its GPUs are
    /// revoked (its worker can no longer enforce them); the freed capacity elsewhere is
    /// auctioned again.
    fn give_up_silent_hosts(&mut self, now: Timestamp, effects: &mut Vec<Effect>) {
        let silence = self.settings.heartbeat_interval * 2;
        let silent: Vec<(String, u32)> = self
            .market
            .hosts()
            .hosts()
            .filter(|host| host.up)
            .filter(|host| {
                self.last_seen
                    .get(&host.name)
                    .is_none_or(|&seen| now >= seen.saturating_add(silence))
            })
            .map(|host| (host.name.clone(), host.machine))
            .collect();
        if silent.is_empty() {
            return;
        }
        let mut next = self.market.clone();
        let mut hosts = Vec::new();
        for (host, machine) in silent {
            let revoked = match next.host_down(&host, now) {
                Ok(revoked) => revoked,
                Err(error) => {
                    tracing::error!(%error, %host, "cannot take a silent host down");
                    return;
                }
            };
            hosts.push(HostDown {
                reason: format!("host {host} stopped heartbeating"),
                host,
                machine,
                revoked,
            });
        }
        self.market = next;
        let freed = hosts.iter().any(|host| !host.revoked.is_empty());
        effects.push(Effect::Record(Box::new(Record::HostsDown { hosts })));
        if freed {
            self.open_round_if_idle(now, effects);
        }
    }
}

/// Each bidder's final bid, in bidding order: the framework's if it posted one, else its
/// agent's; and the agents' bids that were used.
fn final_bids(
    bidders: &[AppId],
    mut framework_bids: BTreeMap<AppId, AppBid>,
    agent_bids: BTreeMap<AppId, AppBid>,
) -> (Vec<AppBid>, Vec<AppBid>) {
    let mut agent_bids_used = Vec::new();
    let bids = bidders
        .iter()
        .filter_map(|app| match framework_bids.remove(app) {
            Some(bid) => Some(bid),
            None => {
                let bid = agent_bids.get(app).cloned()?;
                agent_bids_used.push(bid.clone());
                Some(bid)
            }
        })
        .collect();
    (bids, agent_bids_used)
}
