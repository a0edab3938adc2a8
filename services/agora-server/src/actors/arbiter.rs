//! `Arbiter`: the actor around the engine's live state machine ([`LiveMarket`]). It feeds the
//! state machine events (messages, timers, decisions computed off its thread, the writer's
//! answers) and carries out the effects it returns: records queued to the store's [`Writer`],
//! bid requests to the app agents, timers, decisions on a blocking thread. Requests that
//! change the market are staged on a copy, committed, and handed to the state machine as
//! [`Event::MarketChanged`].
//!
//! Whoever asked is answered, and anyone affected (event streams, GPU workers) is told, only
//! once the decision is durable; the mailbox does not wait for the database. A decision the
//! database refuses after it was applied leaves the arbiter ahead of the source of truth: the
//! state machine halts, the arbiter stops and the service with it, so that a restart restores
//! the state from Postgres.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use agora_market::app::AppId;
pub use agora_market::live::ReopenedRound;
use agora_market::live::{Effect, Event, LiveMarket, LiveSettings, Recovered};
use agora_market::market::Market;
use agora_market::time::Timestamp;
use agora_protocol::Enforcement;
use tokio::sync::oneshot;
use tracing::Instrument;

use super::agent::{AgentBid, AppAgent, BidRequest, Bidding};
use super::gpu_worker::{GpuCommand, GpuWorker};
use super::lease_manager::{LeaseManager, Schedule, Timer, TimerFired};
use super::ArbiterError;
use crate::clock::Clock;
use crate::ids::TenantId;
use crate::metrics::metrics;
use crate::notices::Notices;
use crate::store::{Commit, Store, StoreError, Writer};
use crate::telemetry::RoundTrace;

/// A registered app as the arbiter knows it (the engine holds its jobs, the state machine
/// how it bids).
#[derive(Debug)]
pub(super) struct Member {
    pub tenant: TenantId,
    pub agent: Addr<AppAgent>,
    /// How GPU hosts enforce its leases.
    pub enforcement: Enforcement,
}

/// A change a request staged on a copy of the market.
pub(super) struct Staged {
    pub market: Market,
    /// Apps that left the market in it.
    pub departed: Vec<AppId>,
}

impl Staged {
    pub fn market(market: Market) -> Self {
        Self {
            market,
            departed: Vec::new(),
        }
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
    pub(super) live: LiveMarket,
    pub(super) store: Store,
    /// Writes decisions and bids in order, many per transaction.
    pub(super) writer: Writer,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) settings: ArbiterSettings,
    pub(super) members: HashMap<AppId, Member>,
    timers: Option<Addr<LeaseManager>>,
    /// One mirror per GPU, by index.
    pub(super) gpus: Vec<Addr<GpuWorker>>,
    pub(super) notices: Arc<Notices>,
    /// Restored from the database, waiting for the actors to start.
    restored_members: Vec<(AppId, TenantId, Bidding, Enforcement)>,
    /// The trace of the round in progress.
    pub(super) round_trace: Option<RoundTrace>,
    /// Told why, if the arbiter stops because a decision was not committed.
    failed: Option<oneshot::Sender<String>>,
}

/// The arbiter's state as reloaded from the database.
#[derive(Debug)]
pub struct Restored {
    pub market: Market,
    pub members: Vec<(AppId, TenantId, Bidding, Enforcement)>,
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
        let recovered = Recovered {
            market: restored.market,
            bidding: restored
                .members
                .iter()
                .map(|(app, _, bidding, _)| (app.clone(), *bidding))
                .collect(),
            round: restored.round,
            next_round: restored.next_round,
        };
        let live_settings = LiveSettings {
            round_deadline: settings.round_deadline,
            revocation_grace: settings.revocation_grace,
            heartbeat_interval: settings.heartbeat_interval,
        };
        Self {
            live: LiveMarket::new(recovered, live_settings, random_seed()),
            writer: Writer::spawn(store.clone()),
            store,
            clock,
            settings,
            members: HashMap::new(),
            timers: None,
            gpus: Vec::new(),
            notices,
            restored_members: restored.members,
            round_trace: None,
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

    pub(super) fn market(&self) -> &Market {
        self.live.market()
    }

    pub(super) fn join(
        &mut self,
        app: AppId,
        tenant: TenantId,
        bidding: Bidding,
        enforcement: Enforcement,
        ctx: &mut Context<Self>,
    ) {
        let agent = AppAgent::new(app.clone(), bidding, ctx.address().recipient()).start();
        self.members.insert(
            app,
            Member {
                tenant,
                agent,
                enforcement,
            },
        );
    }

    /// Feeds the state machine one event and carries out its effects. Only requests are
    /// refused (they check first); any other refusal means the state machine halted.
    pub(super) fn feed(&mut self, event: Event, ctx: &mut Context<Self>) {
        let began = Instant::now();
        match self.live.handle(self.now(), event) {
            Ok(effects) => self.carry_out(effects, began, ctx),
            Err(error) => tracing::debug!(%error, "event not taken"),
        }
    }

    pub(super) fn carry_out(
        &mut self,
        effects: Vec<Effect>,
        began: Instant,
        ctx: &mut Context<Self>,
    ) {
        for effect in effects {
            match effect {
                Effect::Record(record) => self.write(*record, began, ctx),
                Effect::RequestBids {
                    round,
                    offer,
                    bidders,
                } => {
                    let span = self.trace_of(round).bid_collection().clone();
                    for (app, inputs) in bidders {
                        if let Some(member) = self.members.get(&app) {
                            member.agent.do_send(BidRequest {
                                round,
                                offer: offer.clone(),
                                inputs,
                                span: span.clone(),
                            });
                        }
                    }
                }
                Effect::SetTimer { at, timer } => {
                    if let Some(timers) = &self.timers {
                        timers.do_send(Schedule { at, timer });
                    }
                }
                Effect::Decide(job) => self.decide(job, ctx),
                Effect::Halt { reason } => {
                    tracing::error!(%reason, "a decision was not committed; the arbiter stops so that a restart restores its state from Postgres");
                    if let Some(failed) = self.failed.take() {
                        let _ = failed.send(reason);
                    }
                    ctx.stop();
                }
            }
        }
    }

    /// Queues a request's `commit`, hands its staged change to the state machine and applies
    /// the rest with `apply`; the reply (`apply`'s value) comes, and everyone affected is told,
    /// once the commit is durable.
    pub(super) fn commit<T: 'static>(
        &mut self,
        commit: Commit,
        staged: Staged,
        ctx: &mut Context<Self>,
        apply: impl FnOnce(&mut Self, &mut Context<Self>) -> T,
    ) -> Reply<T> {
        let capacity_freed = commit.frees_capacity();
        let durable = self.writer.commit(commit, self.now());
        for app in &staged.departed {
            self.members.remove(app);
        }
        let event = Event::MarketChanged {
            market: Box::new(staged.market),
            departed: staged.departed,
            capacity_freed,
        };
        self.feed(event, ctx);
        let value = apply(self, ctx);
        self.when_durable(durable, value)
    }

    /// Answers `value` once `durable` resolves and tells whom the commit concerns; a refused
    /// commit halts the state machine.
    pub(super) fn when_durable<T: 'static>(
        &self,
        durable: impl Future<Output = Result<Commit, StoreError>> + 'static,
        value: T,
    ) -> Reply<T> {
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
                            let reason = error.to_string();
                            arbiter.feed(Event::CommitRefused { reason }, ctx);
                            Err(error.into())
                        }
                    }
                }),
        )
    }

    /// Queues a record of the state machine's, in the background.
    pub(super) fn queue(&mut self, commit: Result<Commit, ArbiterError>, ctx: &mut Context<Self>) {
        match commit {
            Ok(commit) => {
                let durable = self.writer.commit(commit, self.now());
                let reply = self.when_durable(durable, ());
                ctx.spawn(reply.map(|_, _, _| ()));
            }
            // Already applied, yet not recordable: as good as refused.
            Err(error) => self.feed(
                Event::CommitRefused {
                    reason: error.to_string(),
                },
                ctx,
            ),
        }
    }

    fn after_commit(&mut self, commit: &Commit) {
        metrics().observe_capacity(self.market());
        self.notices.announce_commit(commit);
        for granted in &commit.granted {
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
        metrics().observe_capacity(self.market());
        for (app, tenant, bidding, enforcement) in std::mem::take(&mut self.restored_members) {
            self.join(app, tenant, bidding, enforcement, ctx);
        }
        self.feed(Event::Started, ctx);
    }
}

impl Handler<TimerFired> for Arbiter {
    type Result = ();

    fn handle(&mut self, fired: TimerFired, ctx: &mut Self::Context) {
        let span = match fired.timer {
            Timer::LeaseEnd => tracing::info_span!(parent: None, "lease_expiry"),
            Timer::Revocation(_) => tracing::info_span!(parent: None, "revocation"),
            Timer::HostLiveness | Timer::RoundDeadline(_) => tracing::Span::none(),
        };
        span.in_scope(|| self.feed(Event::TimerFired(fired.timer), ctx));
    }
}

impl Handler<AgentBid> for Arbiter {
    type Result = ();

    fn handle(&mut self, answer: AgentBid, ctx: &mut Self::Context) {
        let open = self.live.open_round().map(|round| round.id);
        if !answer.fallback && open == Some(answer.round) {
            metrics().bid_received("agent");
        }
        let event = Event::AgentBid {
            round: answer.round,
            bid: answer.bid,
            fallback: answer.fallback,
        };
        self.feed(event, ctx);
    }
}

/// Fresh randomness for the rounds' seeds (each recorded, so every round replays exactly).
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
