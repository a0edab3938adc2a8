//! `Arbiter`: owns the engine's state and runs live rounds. Every decision is staged on a copy
//! of the engine and applied at once, its [`Commit`] queued to the store's [`Writer`], which
//! writes decisions in order, many per transaction. Whoever asked is answered, and anyone
//! affected (event streams, GPU workers) is told, only once the decision is durable; the
//! mailbox does not wait for the database, so the next decision is staged meanwhile.
//!
//! A decision the database refuses after it was applied leaves the arbiter ahead of the source
//! of truth. The arbiter then stops (see [`Arbiter::lost_commit`]) and the service with it, so
//! that a restart restores the state from Postgres.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use agora_market::app::AppId;
use agora_market::auction::AppBid;
use agora_market::lease::Lease;
use agora_market::market::{DecidedRound, Market, MarketError, RoundOffer, Withdrawal};
use agora_market::time::Timestamp;
use agora_market::topology::{GpuId, GpuIndex};
use agora_protocol::Enforcement;
use tokio::sync::oneshot;
use tracing::Instrument;

use super::agent::{AgentBid, AppAgent, BidRequest, Bidding};
use super::gpu_worker::{GpuCommand, GpuWorker};
use super::lease_manager::{LeaseManager, Schedule, Timer, TimerFired};
use super::records;
use super::ArbiterError;
use crate::clock::Clock;
use crate::metrics::metrics;
use crate::notices::Notices;
use crate::store::{app_id, app_key, Commit, Store, StoreError, Writer};
use crate::telemetry::RoundTrace;

/// A registered app as the arbiter knows it (the engine holds its jobs).
#[derive(Debug)]
pub(super) struct Member {
    pub tenant: i64,
    pub bidding: Bidding,
    pub agent: Addr<AppAgent>,
    /// How GPU hosts enforce its leases.
    pub enforcement: Enforcement,
}

/// A lease on a GPU has been given notice: at `at` the GPU leaves service for `withdrawal` and
/// the lease holding it is revoked.
#[derive(Debug, Clone)]
pub(super) struct Notice {
    pub at: Timestamp,
    pub withdrawal: Withdrawal,
    pub reason: String,
}

/// The round in progress, if any.
#[derive(Debug)]
pub(super) enum RoundState {
    Idle,
    Open(Box<PendingRound>),
    /// Closed to bids; its auction is being decided off the arbiter's thread.
    Deciding,
}

#[derive(Debug)]
pub(super) struct PendingRound {
    pub id: i64,
    pub seed: u64,
    pub deadline: Timestamp,
    pub offer: RoundOffer,
    /// Bids posted by frameworks (stored, or queued in the writer).
    pub framework_bids: BTreeMap<AppId, AppBid>,
    /// Bids of the agents: final for agent-bidding apps, fallbacks for explicit ones.
    pub agent_bids: BTreeMap<AppId, AppBid>,
    pub trace: RoundTrace,
}

impl PendingRound {
    /// Every bidder still in the market has its final bid: no need to wait for the deadline.
    /// A bidder that left is not waited for (its bid is withdrawn).
    fn complete(&self, members: &HashMap<AppId, Member>) -> bool {
        self.offer.bidders.iter().all(|app| {
            let Some(member) = members.get(app) else {
                return true;
            };
            self.framework_bids.contains_key(app)
                || (self.agent_bids.contains_key(app) && member.bidding == Bidding::Agent)
        })
    }
}

/// What the service's parts need to start an arbiter.
#[derive(Debug, Clone)]
pub struct ArbiterSettings {
    pub round_deadline: Duration,
    pub revocation_grace: Duration,
    pub tick: Duration,
    /// How often GPU hosts heartbeat; two silent intervals and a host's leases are revoked.
    pub heartbeat_interval: Duration,
}

pub type Reply<T> = ResponseActFuture<Arbiter, Result<T, ArbiterError>>;

#[derive(Debug)]
pub struct Arbiter {
    pub(super) market: Market,
    pub(super) store: Store,
    /// Writes decisions and bids in order, many per transaction.
    pub(super) writer: Writer,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) settings: ArbiterSettings,
    pub(super) members: HashMap<AppId, Member>,
    pub(super) round: RoundState,
    round_wanted: bool,
    pub(super) next_round: i64,
    /// GPUs whose lease has been given notice.
    pub(super) draining: BTreeMap<GpuIndex, Notice>,
    timers: Option<Addr<LeaseManager>>,
    /// One mirror per GPU, by index.
    pub(super) gpus: Vec<Addr<GpuWorker>>,
    /// When each registered host last registered or heartbeat.
    pub(super) last_seen: BTreeMap<String, Timestamp>,
    pub(super) notices: Arc<Notices>,
    /// Restored from the database, waiting for the actors to start.
    restored_members: Vec<(AppId, i64, Bidding, Enforcement)>,
    restored_round: Option<Box<PendingRound>>,
    /// Told why, if the arbiter stops because a decision was not committed.
    failed: Option<oneshot::Sender<String>>,
}

/// A round that was open when the arbiter stopped, with the bids frameworks had posted.
#[derive(Debug)]
pub struct ReopenedRound {
    pub id: i64,
    pub seed: u64,
    pub deadline: Timestamp,
    pub offer: RoundOffer,
    pub framework_bids: BTreeMap<AppId, AppBid>,
}

/// The arbiter's state as reloaded from the database.
#[derive(Debug)]
pub struct Restored {
    pub market: Market,
    pub members: Vec<(AppId, i64, Bidding, Enforcement)>,
    pub round: Option<ReopenedRound>,
    pub next_round: i64,
}

impl Arbiter {
    pub fn new(
        restored: Restored,
        store: Store,
        clock: Arc<dyn Clock>,
        settings: ArbiterSettings,
        notices: Arc<Notices>,
    ) -> Self {
        let restored_round = restored.round.map(|round| {
            Box::new(PendingRound {
                id: round.id,
                seed: round.seed,
                deadline: round.deadline,
                offer: round.offer,
                framework_bids: round.framework_bids,
                agent_bids: BTreeMap::new(),
                trace: RoundTrace::collecting_bids(
                    tracing::info_span!(parent: None, "auction_round", round = round.id),
                    Instant::now(),
                ),
            })
        });
        Self {
            market: restored.market,
            writer: Writer::spawn(store.clone()),
            store,
            clock,
            settings,
            members: HashMap::new(),
            round: RoundState::Idle,
            round_wanted: false,
            next_round: restored.next_round,
            draining: BTreeMap::new(),
            timers: None,
            gpus: Vec::new(),
            last_seen: BTreeMap::new(),
            notices,
            restored_members: restored.members,
            restored_round,
            failed: None,
        }
    }

    /// Answers with the reason if the arbiter stops because a decision was not committed.
    pub fn failure(&mut self) -> oneshot::Receiver<String> {
        let (failed, failure) = oneshot::channel();
        self.failed = Some(failed);
        failure
    }

    pub(super) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    pub(super) fn schedule(&self, at: Timestamp, timer: Timer) {
        if let Some(timers) = &self.timers {
            timers.do_send(Schedule { at, timer });
        }
    }

    pub(super) fn join(
        &mut self,
        app: AppId,
        tenant: i64,
        bidding: Bidding,
        enforcement: Enforcement,
        ctx: &mut Context<Self>,
    ) {
        let agent = AppAgent::new(app.clone(), bidding, ctx.address().recipient()).start();
        self.members.insert(
            app,
            Member {
                tenant,
                bidding,
                agent,
                enforcement,
            },
        );
    }

    /// Applies a staged decision with `apply` and queues its `commit`; the reply (`apply`'s
    /// value) comes, and everyone affected is told, once the commit is durable.
    pub(super) fn commit<T: 'static>(
        &mut self,
        commit: Commit,
        ctx: &mut Context<Self>,
        apply: impl FnOnce(&mut Self, &mut Context<Self>) -> T,
    ) -> Reply<T> {
        // GPUs freed (or a round wanted while this one ran): the next round opens now, on the
        // applied state; its own commit is queued after this one.
        let capacity_changed = !commit.ended.is_empty()
            || !commit.finished_apps.is_empty()
            || commit.gpu_health.iter().any(|(_, healthy)| *healthy)
            || commit.workers.returns_capacity;
        let closes_round = commit.closed_round.is_some();
        let durable = self.writer.commit(commit, self.now());
        let value = apply(self, ctx);
        if capacity_changed || (closes_round && self.round_wanted) {
            self.open_round_if_idle(ctx);
        }
        // The decision's span (a request's, a round's) follows it through the commit.
        let caller = tracing::Span::current();
        Box::pin(
            durable
                .instrument(tracing::info_span!("persistence"))
                .into_actor(self)
                .map(move |result, arbiter, ctx| {
                    let _caller = caller.enter();
                    match result {
                        Ok(commit) => {
                            tracing::info_span!("notification")
                                .in_scope(|| arbiter.after_commit(&commit));
                            Ok(value)
                        }
                        Err(error) => {
                            arbiter.lost_commit(&error, ctx);
                            Err(error.into())
                        }
                    }
                }),
        )
    }

    /// The database refused a decision the arbiter had already applied: its memory is ahead
    /// of the source of truth, and only a restart (which restores from Postgres) is safe.
    fn lost_commit(&mut self, error: &StoreError, ctx: &mut Context<Self>) {
        tracing::error!(%error, "a decision was not committed; the arbiter stops so that a restart restores its state from Postgres");
        if let Some(failed) = self.failed.take() {
            let _ = failed.send(error.to_string());
        }
        ctx.stop();
    }

    /// Lets an internal decision (no one waits for its reply) finish in the background.
    pub(super) fn run_internal(&mut self, reply: Reply<()>, ctx: &mut Context<Self>) {
        ctx.spawn(reply.map(|_, _, _| ()));
    }

    fn after_commit(&mut self, commit: &Commit) {
        metrics().observe_capacity(&self.market);
        self.notices.announce_commit(commit);
        for granted in &commit.granted {
            self.schedule(granted.end, Timer::LeaseEnd);
            for gpu in &granted.gpus {
                let (lease, app) = (granted.id, granted.app);
                self.tell_gpu(gpu, GpuCommand::Run { lease, app });
            }
        }
        for ended in &commit.ended {
            for gpu in &ended.gpus {
                self.tell_gpu(gpu, GpuCommand::Stop { lease: ended.id });
            }
        }
        for (gpu, healthy) in &commit.gpu_health {
            self.tell_gpu(gpu, GpuCommand::SetHealth(*healthy));
        }
    }

    pub(super) fn tell_gpu(&self, gpu: &str, command: GpuCommand) {
        if let Some(index) = self.market.cluster().index_of(&GpuId(gpu.to_owned())) {
            self.gpus[index.get()].do_send(command);
        }
    }

    /// A resource-available event: opens a round unless one is already under way (then
    /// another follows it).
    pub(super) fn open_round_if_idle(&mut self, ctx: &mut Context<Self>) {
        if !matches!(self.round, RoundState::Idle) {
            self.round_wanted = true;
            return;
        }
        self.round_wanted = false;
        let now = self.now();
        // Each round is a trace of its own, linked to what opened it.
        let opened = Instant::now();
        let round_span =
            tracing::info_span!(parent: None, "auction_round", round = tracing::field::Empty);
        round_span.follows_from(tracing::Span::current());
        let Some(offer) = tracing::info_span!(parent: &round_span, "rho_collection")
            .in_scope(|| self.market.open_round(now))
        else {
            return;
        };
        metrics().observe_standings(&offer.standings);
        let id = self.next_round;
        round_span.record("round", id);
        let offering = tracing::info_span!(
            parent: &round_span,
            "offer",
            gpus = offer.offer.offer.gpus.len(),
            bidders = offer.bidders.len()
        );
        let _offering = offering.enter();
        let seed = random_seed();
        let deadline = now.saturating_add(self.settings.round_deadline);
        let commit = match records::opened_round(&self.market, id, seed, deadline, &offer) {
            Ok(commit) => commit,
            Err(error) => {
                tracing::error!(%error, "cannot record a round's opening");
                return;
            }
        };
        let reply = self.commit(commit, ctx, move |arbiter, _| {
            arbiter.next_round = id + 1;
            arbiter.schedule(deadline, Timer::RoundDeadline(id));
            arbiter.round = RoundState::Open(Box::new(PendingRound {
                id,
                seed,
                deadline,
                offer,
                framework_bids: BTreeMap::new(),
                agent_bids: BTreeMap::new(),
                trace: RoundTrace::collecting_bids(round_span, opened),
            }));
            arbiter.request_agent_bids();
        });
        self.run_internal(reply, ctx);
    }

    fn request_agent_bids(&self) {
        let RoundState::Open(round) = &self.round else {
            return;
        };
        let offer = Arc::new(round.offer.offer.clone());
        for app in &round.offer.bidders {
            let (Some(member), Ok(inputs)) = (
                self.members.get(app),
                self.market.bid_inputs(&round.offer, app),
            ) else {
                continue;
            };
            member.agent.do_send(BidRequest {
                round: round.id,
                offer: offer.clone(),
                inputs,
                span: round.trace.bid_collection().clone(),
            });
        }
    }

    /// Closes the open round if it is complete or past its deadline.
    pub(super) fn close_round_if_due(&mut self, ctx: &mut Context<Self>) {
        let due = match &self.round {
            RoundState::Open(round) => {
                round.complete(&self.members) || self.now() >= round.deadline
            }
            _ => false,
        };
        if !due {
            return;
        }
        let RoundState::Open(round) = std::mem::replace(&mut self.round, RoundState::Deciding)
        else {
            return;
        };
        // The round's bids were queued to the writer before its outcome will be.
        self.decide_round(*round, ctx);
    }

    /// A bid that was counted but not stored no longer counts: the app may bid again.
    pub(super) fn forget_bid(&mut self, round: i64, app: i64) {
        if let RoundState::Open(pending) = &mut self.round {
            if pending.id == round {
                pending.framework_bids.remove(&app_id(app));
            }
        }
    }

    /// Decides the round on a snapshot of the market, on a blocking thread: the solver may take
    /// long, and meanwhile the mailbox goes on serving releases, progress and registrations.
    /// The decision is then applied to the market as it is by then. Bidders that left the
    /// market meanwhile are withdrawn (the engine hands their share to the others).
    fn decide_round(&mut self, round: PendingRound, ctx: &mut Context<Self>) {
        let PendingRound {
            id,
            seed,
            offer,
            framework_bids,
            agent_bids,
            trace,
            ..
        } = round;
        let round_span = trace.span.clone();
        let opened = trace.bids_collected();
        let present: Vec<AppId> = offer
            .bidders
            .iter()
            .filter(|app| self.members.contains_key(*app))
            .cloned()
            .collect();
        let (bids, agent_bids_used) = final_bids(&present, framework_bids, agent_bids);
        let snapshot = self.market.clone();
        let decide = Box::new(move || snapshot.decide_round(offer, bids, seed));
        self.await_decision(id, round_span, opened, agent_bids_used, decide, ctx);
    }

    /// Runs `decide` on a blocking thread, then settles the round. If an app the decision
    /// gives GPUs to left the market meanwhile, the round is decided again without it (on a
    /// new snapshot): one tenant's app leaving never abandons everyone's round.
    fn await_decision(
        &mut self,
        id: i64,
        round_span: tracing::Span,
        opened: Instant,
        agent_bids_used: Vec<AppBid>,
        decide: Box<dyn FnOnce() -> Result<DecidedRound, MarketError> + Send>,
        ctx: &mut Context<Self>,
    ) {
        let solver_span = round_span.clone();
        let decided = actix_web::rt::task::spawn_blocking(move || solver_span.in_scope(decide));
        let settle = decided.into_actor(self).map(move |decided, arbiter, ctx| {
            let decided = match decided {
                Ok(decided) => decided.map_err(|error| error.to_string()),
                Err(panic) => Err(format!("the auction failed: {panic}")),
            };
            match decided {
                Ok(decided) if arbiter.market.outdated_by_departure(&decided) => {
                    round_span.in_scope(|| {
                        tracing::info!(
                            round = id,
                            "an app left while the round was decided; deciding it again without it"
                        );
                    });
                    let snapshot = arbiter.market.clone();
                    let decide = Box::new(move || snapshot.redecide(decided));
                    arbiter.await_decision(id, round_span, opened, agent_bids_used, decide, ctx);
                }
                decided => {
                    let _round = round_span.enter();
                    arbiter.round = RoundState::Idle;
                    let reply = arbiter.settle_round(id, decided, opened, agent_bids_used, ctx);
                    arbiter.run_internal(reply, ctx);
                }
            }
        });
        ctx.spawn(settle);
    }

    /// Grants a decided round's leases, or abandons the round (and opens a new one) if it
    /// could not be decided or the market changed under it.
    fn settle_round(
        &mut self,
        id: i64,
        decided: Result<DecidedRound, String>,
        opened: Instant,
        agent_bids_used: Vec<AppBid>,
        ctx: &mut Context<Self>,
    ) -> Reply<()> {
        let mut next = self.market.clone();
        let applied = decided
            .and_then(|decided| next.apply_round(decided).map_err(|error| error.to_string()));
        let outcome = match applied {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::warn!(round = id, %error, "round abandoned; a new one opens");
                let commit = Commit {
                    abandoned_rounds: vec![id],
                    ..Commit::default()
                };
                return self.commit(commit, ctx, |arbiter, ctx| {
                    arbiter.open_round_if_idle(ctx);
                });
            }
        };
        let commit = match records::closed_round(&next, id, self.now(), &outcome, &agent_bids_used)
        {
            Ok(commit) => commit,
            Err(error) => return Box::pin(actix::fut::ready(Err(error))),
        };
        tracing::info!(
            round = id,
            bidders = outcome.bidders.len(),
            leases = outcome.leases.len(),
            "round closed"
        );
        self.commit(commit, ctx, move |arbiter, _| {
            arbiter.market = next;
            metrics().round_closed(opened.elapsed());
        })
    }

    /// Expires the leases that are due, freeing their GPUs for the next round.
    fn expire_due_leases(&mut self, ctx: &mut Context<Self>) {
        let now = self.now();
        let mut next = self.market.clone();
        let expired = next.expire_leases(now);
        if expired.is_empty() {
            return;
        }
        let commit = match records::ended_leases(&next, &expired, None) {
            Ok(commit) => commit,
            Err(error) => {
                tracing::error!(%error, "cannot record expired leases");
                return;
            }
        };
        let reply = self.commit(commit, ctx, move |arbiter, _| arbiter.market = next);
        self.run_internal(reply, ctx);
    }

    /// A GPU's notice is over (an operator drained it, or its host reported it unhealthy): it
    /// leaves service and the lease holding it is revoked.
    fn revoke_after_notice(&mut self, gpu: GpuIndex, ctx: &mut Context<Self>) {
        let now = self.now();
        // A notice given again later (after a cancelled one) waits for its own timer.
        if self.draining.get(&gpu).is_none_or(|notice| notice.at > now) {
            return;
        }
        let Some(notice) = self.draining.remove(&gpu) else {
            return;
        };
        let mut next = self.market.clone();
        next.set_withdrawn(gpu, notice.withdrawal, true);
        let revoked: Vec<Lease> = next.revoke_gpu(gpu, now).into_iter().collect();
        let mut commit = match records::ended_leases(&next, &revoked, Some(&notice.reason)) {
            Ok(commit) => commit,
            Err(error) => {
                tracing::error!(%error, "cannot record a revocation");
                return;
            }
        };
        if notice.withdrawal == Withdrawal::Drained {
            commit
                .gpu_health
                .push((next.cluster().gpu(gpu).id.0.clone(), false));
        }
        let revocations = revoked.len();
        let reply = self.commit(commit, ctx, move |arbiter, _| {
            arbiter.market = next;
            metrics().leases_revoked(revocations);
        });
        self.run_internal(reply, ctx);
    }

    fn start_gpu_workers(&mut self) {
        self.gpus = self
            .market
            .cluster()
            .gpus()
            .map(|(index, _)| self.gpu_worker(index).start())
            .collect();
        for lease in self.market.leases().active() {
            let (lease_id, app) = (lease.id.0 as i64, app_key(&lease.app).unwrap_or_default());
            for &gpu in &lease.gpus {
                self.gpus[gpu.get()].do_send(GpuCommand::Run {
                    lease: lease_id,
                    app,
                });
            }
        }
    }
}

impl Actor for Arbiter {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.timers = Some(LeaseManager::start_on_own_thread(
            self.clock.clone(),
            self.settings.tick,
            ctx.address().recipient(),
        ));
        self.start_gpu_workers();
        metrics().observe_capacity(&self.market);
        for (app, tenant, bidding, enforcement) in std::mem::take(&mut self.restored_members) {
            self.join(app, tenant, bidding, enforcement, ctx);
        }
        self.watch_restored_hosts();
        for lease in self.market.leases().active() {
            self.schedule(lease.end, Timer::LeaseEnd);
        }
        if let Some(round) = self.restored_round.take() {
            self.schedule(round.deadline, Timer::RoundDeadline(round.id));
            self.round = RoundState::Open(round);
            self.request_agent_bids();
        }
        self.open_round_if_idle(ctx);
    }
}

impl Handler<TimerFired> for Arbiter {
    type Result = ();

    fn handle(&mut self, fired: TimerFired, ctx: &mut Self::Context) {
        match fired.timer {
            Timer::LeaseEnd => tracing::info_span!(parent: None, "lease_expiry")
                .in_scope(|| self.expire_due_leases(ctx)),
            Timer::Revocation(gpu) => tracing::info_span!(parent: None, "revocation")
                .in_scope(|| self.revoke_after_notice(gpu, ctx)),
            Timer::HostLiveness => self.stop_silent_hosts(ctx),
            Timer::RoundDeadline(id) => {
                if matches!(&self.round, RoundState::Open(round) if round.id == id) {
                    self.close_round_if_due(ctx);
                }
            }
        }
    }
}

impl Handler<AgentBid> for Arbiter {
    type Result = ();

    fn handle(&mut self, answer: AgentBid, ctx: &mut Self::Context) {
        let RoundState::Open(round) = &mut self.round else {
            return;
        };
        if round.id != answer.round {
            return;
        }
        if !answer.fallback {
            metrics().bid_received("agent");
        }
        round.agent_bids.insert(answer.bid.app.clone(), answer.bid);
        self.close_round_if_due(ctx);
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

/// Fresh randomness for a round's seed (recorded, so the round replays exactly).
fn random_seed() -> u64 {
    let mut bytes = [0u8; 8];
    // Without OS randomness a fixed seed is still a valid, recorded seed.
    let _ = getrandom::fill(&mut bytes);
    u64::from_le_bytes(bytes)
}

/// Stops deciding, then answers once every decision already made is durable, so that a
/// service started next on the same database restores all of them and races none.
impl Handler<super::Shutdown> for Arbiter {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: super::Shutdown, ctx: &mut Self::Context) -> Self::Result {
        if let Some(timers) = self.timers.take() {
            timers.do_send(super::Shutdown);
        }
        ctx.stop();
        Box::pin(self.writer.flush())
    }
}
