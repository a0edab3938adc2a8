//! What the HTTP API asks of the arbiter. Every request names the tenant asking (`None`: the
//! admin), and the arbiter checks ownership again, whatever the API checked before.

use actix::prelude::*;
use agora_market::app::SpeedChange;
use agora_market::app::{App, AppId, AppKind};
use agora_market::auction::AppBid;
use agora_market::live::{Event, LiveError, Notice};
use agora_market::market::{MarketError, Withdrawal};
use agora_market::progress::{JobProgress, SpeedChangeReport};
use agora_market::throughput::{Throughput, ThroughputReport};
use agora_market::time::Timestamp;
use agora_market::topology::{GpuId, GpuIndex};
use agora_protocol::Enforcement;
use serde::Serialize;
use tracing::Instrument;
use utoipa::ToSchema;

use super::agent::Bidding;
use super::arbiter::{Arbiter, Reply, Staged};
use super::records;
use super::ArbiterError;
use crate::clock::to_datetime;
use crate::ids::{AppKey, BidId, LeaseKey, RoundId, TenantId};
use crate::store::{
    app_key, AppInsert, BidInsert, Commit, EventPayload, JobPhase, NewApp, NewBid, OperatorAction,
    ProgressSample, RevocationNoticeEvent, SpeedChangeSample, ThroughputSample,
};
use crate::visibility::Caller;

fn refuse<T: 'static>(error: ArbiterError) -> Reply<T> {
    Box::pin(actix::fut::ready(Err(error)))
}

impl Arbiter {
    /// The app, if `tenant` may act for it (`None` is the admin).
    fn authorize(&self, tenant: Option<TenantId>, app: AppKey) -> Result<AppId, ArbiterError> {
        let id = AppId::from(app);
        let member = self
            .members
            .get(&id)
            .ok_or(ArbiterError::AppNotActive(app))?;
        if Caller::from_tenant(tenant).sees(member.tenant) {
            Ok(id)
        } else {
            Err(ArbiterError::ForeignApp(app))
        }
    }
}

#[derive(Debug, Message)]
#[rtype(result = "Result<AppKey, ArbiterError>")]
pub struct RegisterApp {
    pub tenant: TenantId,
    pub name: String,
    pub bidding: Bidding,
    pub kind: AppKind,
    pub enforcement: Enforcement,
    /// The caller's span (the HTTP request's), which the arbiter's work joins.
    pub span: tracing::Span,
}

impl Handler<RegisterApp> for Arbiter {
    type Result = Reply<AppKey>;

    fn handle(&mut self, request: RegisterApp, _: &mut Self::Context) -> Self::Result {
        let _span = request.span.clone().entered();
        self.register(request)
    }
}

impl Arbiter {
    /// Checks the app, then has the writer store it like any other write; once it is durable
    /// (its id is the database's) the app joins the market, and the answer comes once its
    /// arrival is durable too. The mailbox goes on meanwhile.
    fn register(&mut self, request: RegisterApp) -> Reply<AppKey> {
        if request.name.trim().is_empty() || request.name.chars().count() > 200 {
            return refuse(ArbiterError::InvalidApp(
                "name must be 1 to 200 characters".to_owned(),
            ));
        }
        let probe = App {
            id: AppId::from("new"),
            kind: request.kind.clone(),
        };
        if let Err(reason) = probe
            .validate()
            .and(check_enforcement(&request.enforcement))
            .and(probe.throughput().check_covers(self.market().cluster()))
            .and(
                probe
                    .sensitivity()
                    .check_fits(&self.market().cluster().largest_machine()),
            )
        {
            return refuse(ArbiterError::InvalidApp(reason));
        }
        let now = self.now();
        // Fixed now, stored with the app and restored as it is, so a restart or a cluster that
        // grows later leaves the app's rho where it was.
        let cluster_seconds = self.market().cluster_time(&probe);
        let stored = (|| {
            let json = |value: serde_json::Result<serde_json::Value>| {
                value.map_err(|error| ArbiterError::Internal(error.to_string()))
            };
            Ok(NewApp {
                tenant: request.tenant,
                name: request.name.clone(),
                kind: kind_name(&request.kind),
                bidding: request.bidding.as_str(),
                state: json(serde_json::to_value(&request.kind))?,
                enforcement: json(serde_json::to_value(&request.enforcement))?,
                jobs: probe.jobs().into_iter().cloned().collect(),
                arrived_at: now,
                cluster_seconds,
            })
        })();
        let stored = match stored {
            Ok(new_app) => self.writer.insert_app(new_app),
            Err(error) => return refuse(error),
        };
        let persisted = stored.instrument(tracing::info_span!("persistence"));
        Box::pin(
            persisted
                .into_actor(self)
                .then(move |stored, arbiter, ctx| {
                    let id = match stored {
                        Ok(AppInsert::Stored(id)) => id,
                        Ok(AppInsert::DuplicateName) => {
                            return refuse(ArbiterError::DuplicateAppName(request.name));
                        }
                        Err(error) => return refuse(error.into()),
                    };
                    // The app arrives now, in the order of the arbiter's other decisions (others may
                    // have come while it was stored), so that a restart replays its arrival exactly.
                    let arrived_at = arbiter.now();
                    let arrival = Commit {
                        arrivals: vec![(id, arrived_at)],
                        ..Commit::default()
                    };
                    let durable = arbiter.writer.commit(arrival, arrived_at);
                    // The agent first: the round the arrival opens asks it for a bid.
                    arbiter.join(
                        AppId::from(id),
                        request.tenant,
                        request.bidding,
                        request.enforcement,
                        ctx,
                    );
                    let registered = Event::AppRegistered {
                        app: App {
                            id: AppId::from(id),
                            kind: request.kind,
                        },
                        bidding: request.bidding,
                        arrived_at,
                        cluster_seconds,
                    };
                    let began = std::time::Instant::now();
                    match arbiter.live.handle(arrived_at, registered) {
                        Ok(effects) => arbiter.carry_out(effects, began, ctx),
                        Err(error) => {
                            arbiter.members.remove(&AppId::from(id));
                            return refuse(ArbiterError::Internal(error.to_string()));
                        }
                    }
                    arbiter.when_durable(durable, id)
                }),
        )
    }
}

/// A launch needs a program to run and environment variables a shell can set.
fn check_enforcement(enforcement: &Enforcement) -> Result<(), String> {
    let Enforcement::Launch { command, env } = enforcement else {
        return Ok(());
    };
    if command
        .first()
        .is_none_or(|program| program.trim().is_empty())
    {
        return Err("enforcement.command must name the program to launch".to_owned());
    }
    match env
        .keys()
        .find(|name| name.is_empty() || name.contains(['=', '\0']))
    {
        Some(name) => Err(format!(
            "enforcement.env: {name:?} is not a valid environment variable name"
        )),
        None => Ok(()),
    }
}

fn kind_name(kind: &AppKind) -> &'static str {
    match kind {
        AppKind::SingleJob { .. } => "single_job",
        AppKind::SuccessiveHalving(_) => "successive_halving",
        AppKind::PerformanceCurve(_) => "performance_curve",
    }
}

/// The answer to a progress report.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProgressAck {
    /// The app has nothing left to run: it left the market and its leases were released.
    pub finished: bool,
}

#[derive(Debug, Message)]
#[rtype(result = "Result<ProgressAck, ArbiterError>")]
pub struct ReportProgress {
    pub tenant: Option<TenantId>,
    pub app: AppKey,
    pub jobs: Vec<JobProgress>,
    /// The caller's span (the HTTP request's), which the arbiter's work joins.
    pub span: tracing::Span,
}

impl Handler<ReportProgress> for Arbiter {
    type Result = Reply<ProgressAck>;

    fn handle(&mut self, request: ReportProgress, ctx: &mut Self::Context) -> Self::Result {
        let _span = request.span.clone().entered();
        self.report_progress(request, ctx)
    }
}

impl Arbiter {
    fn report_progress(
        &mut self,
        request: ReportProgress,
        ctx: &mut Context<Self>,
    ) -> Reply<ProgressAck> {
        let staged = (|| {
            let id = self.authorize(request.tenant, request.app)?;
            let mut next = self.market().clone();
            let app = next
                .app_mut(&id)
                .ok_or(ArbiterError::AppNotActive(request.app))?;
            let slowdowns = app.apply_progress(&request.jobs)?;
            let finished = app.is_finished();
            let state = stored_state(app)?;
            let mut commit = if finished {
                self.stage_departure(&mut next, &id, request.app)?
            } else {
                Commit::default()
            };
            commit.app_states.push((request.app, state));
            let mut observed = slowdowns.into_iter();
            commit.progress = request
                .jobs
                .iter()
                .map(|report| ProgressSample {
                    app: request.app,
                    job: report.job.clone(),
                    completed_iterations: report.completed_iterations as i64,
                    stopped: report.stopped,
                    observed: report.observed.map(|observation| {
                        let locality = serde_json::to_value(observation.locality)
                            .ok()
                            .and_then(|name| name.as_str().map(str::to_owned))
                            .unwrap_or_default();
                        (locality, observed.next().unwrap_or(f64::NAN))
                    }),
                })
                .collect();
            let departed = if finished { vec![id] } else { Vec::new() };
            Ok((
                Staged {
                    market: next,
                    departed,
                },
                commit,
                finished,
            ))
        })();
        let (staged, commit, finished) = match staged {
            Ok(staged) => staged,
            Err(error @ ArbiterError::AppNotActive(_)) => return self.refuse_once_written(error),
            Err(error) => return refuse(error),
        };
        self.commit(commit, staged, ctx, move |_, _| ProgressAck { finished })
    }

    /// Refuses once every write queued before is durable: an app may have left the market in a
    /// commit still on its way, and the caller then reads how it finished.
    fn refuse_once_written<T: 'static>(&self, error: ArbiterError) -> Reply<T> {
        Box::pin(
            self.writer
                .flush()
                .into_actor(self)
                .map(move |(), _, _| Err(error)),
        )
    }
}

/// A framework's measured throughput of an app on one GPU type; the answer is the app's table
/// after it.
#[derive(Debug, Message)]
#[rtype(result = "Result<Throughput, ArbiterError>")]
pub struct ReportThroughput {
    pub tenant: Option<TenantId>,
    pub app: AppKey,
    pub report: ThroughputReport,
    /// The caller's span (the HTTP request's), which the arbiter's work joins.
    pub span: tracing::Span,
}

impl Handler<ReportThroughput> for Arbiter {
    type Result = Reply<Throughput>;

    fn handle(&mut self, request: ReportThroughput, ctx: &mut Self::Context) -> Self::Result {
        let _span = request.span.clone().entered();
        match self.stage_throughput(&request) {
            Ok((staged, commit, table)) => self.commit(commit, staged, ctx, move |_, _| table),
            Err(error) => refuse(error),
        }
    }
}

/// The answer to a speed change: the job's schedule after it, and where the job stands in it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"speed_changes": [{"at_iteration": 1200, "serial_iteration_time": 0.4}],
    "phase": {"job": "trial-0", "completed_iterations": 1200, "phase": 1, "phases": 2,
              "serial_iteration_time": 0.4, "next_change": null}}))]
pub struct SpeedChangeAck {
    /// Every change of the job's speed, declared or reported, which its rho and its agent's
    /// bids use from the next round on.
    pub speed_changes: Vec<SpeedChange>,
    pub phase: JobPhase,
}

/// A framework's report that a job's speed changes (it scaled the batch size).
#[derive(Debug, Message)]
#[rtype(result = "Result<SpeedChangeAck, ArbiterError>")]
pub struct ReportSpeedChange {
    pub tenant: Option<TenantId>,
    pub app: AppKey,
    pub report: SpeedChangeReport,
    /// The caller's span (the HTTP request's), which the arbiter's work joins.
    pub span: tracing::Span,
}

impl Handler<ReportSpeedChange> for Arbiter {
    type Result = Reply<SpeedChangeAck>;

    fn handle(&mut self, request: ReportSpeedChange, ctx: &mut Self::Context) -> Self::Result {
        let _span = request.span.clone().entered();
        match self.stage_speed_change(&request) {
            Ok((staged, commit, ack)) => self.commit(commit, staged, ctx, move |_, _| ack),
            Err(error) => refuse(error),
        }
    }
}

/// The app as its `apps.state` column holds it: the search with every job's schedule and
/// throughput table, what a restart restores.
fn stored_state(app: &App) -> Result<serde_json::Value, ArbiterError> {
    serde_json::to_value(&app.kind).map_err(|error| ArbiterError::Internal(error.to_string()))
}

impl Arbiter {
    /// The engine updates the app's table on a copy of the market; the commit stores the new
    /// table with the app's state and the report in `throughput_reports`.
    fn stage_throughput(
        &self,
        request: &ReportThroughput,
    ) -> Result<(Staged, Commit, Throughput), ArbiterError> {
        let id = self.authorize(request.tenant, request.app)?;
        let mut next = self.market().clone();
        let table = next
            .report_throughput(&id, &request.report)
            .map_err(|error| match error {
                MarketError::ThroughputReport(invalid) => ArbiterError::Throughput(invalid),
                MarketError::UnknownApp(_) => ArbiterError::AppNotActive(request.app),
                other => ArbiterError::Internal(other.to_string()),
            })?
            .clone();
        let app = next
            .app_mut(&id)
            .ok_or(ArbiterError::AppNotActive(request.app))?;
        let internal = |error: serde_json::Error| ArbiterError::Internal(error.to_string());
        let state = stored_state(app)?;
        let mut commit = Commit::default();
        commit.app_states.push((request.app, state));
        commit.throughput_reports.push(ThroughputSample {
            app: request.app,
            gpu_type: request.report.gpu_type.clone(),
            speed: request.report.speed,
            throughput: serde_json::to_value(&table).map_err(internal)?,
        });
        Ok((Staged::market(next), commit, table))
    }

    /// The job takes the change on a copy of the market; the commit stores the app's state
    /// and the report in `speed_change_reports`, with the first round that uses it: the next
    /// to open (a round open now ranked the apps and asked for bids before it).
    fn stage_speed_change(
        &self,
        request: &ReportSpeedChange,
    ) -> Result<(Staged, Commit, SpeedChangeAck), ArbiterError> {
        let id = self.authorize(request.tenant, request.app)?;
        let mut next = self.market().clone();
        let app = next
            .app_mut(&id)
            .ok_or(ArbiterError::AppNotActive(request.app))?;
        let job = app.report_speed_change(&request.report)?;
        let ack = SpeedChangeAck {
            speed_changes: job.speed_changes.clone(),
            phase: JobPhase::of(job),
        };
        let internal = |error: serde_json::Error| ArbiterError::Internal(error.to_string());
        let state = stored_state(app)?;
        let mut commit = Commit::default();
        commit.app_states.push((request.app, state));
        commit.speed_change_reports.push(SpeedChangeSample {
            app: request.app,
            job: request.report.job.clone(),
            first_round: RoundId(self.live.next_round()),
            // Below the job's total_iterations, which the jobs table holds as a bigint.
            at_iteration: request.report.at_iteration as i64,
            serial_iteration_time: request.report.serial_iteration_time,
            speed_changes: serde_json::to_value(&ack.speed_changes).map_err(internal)?,
        });
        Ok((Staged::market(next), commit, ack))
    }

    /// The app leaves `next` (the staged market): its leases are released and it is recorded
    /// as finished.
    fn stage_departure(
        &self,
        next: &mut agora_market::market::Market,
        id: &AppId,
        key: AppKey,
    ) -> Result<Commit, ArbiterError> {
        let released = next
            .remove_app(id, self.now())
            .map_err(|error| ArbiterError::Internal(error.to_string()))?;
        let mut commit = records::ended_leases(self.market(), &released, Some("the app finished"))?;
        commit.finished_apps.push(key);
        Ok(commit)
    }
}

#[derive(Debug, Message)]
#[rtype(result = "Result<(), ArbiterError>")]
pub struct FinishApp {
    pub tenant: Option<TenantId>,
    pub app: AppKey,
    /// The caller's span (the HTTP request's), which the arbiter's work joins.
    pub span: tracing::Span,
}

impl Handler<FinishApp> for Arbiter {
    type Result = Reply<()>;

    fn handle(&mut self, request: FinishApp, ctx: &mut Self::Context) -> Self::Result {
        let _span = request.span.clone().entered();
        let staged = (|| {
            let id = self.authorize(request.tenant, request.app)?;
            let mut next = self.market().clone();
            let commit = self.stage_departure(&mut next, &id, request.app)?;
            let staged = Staged {
                market: next,
                departed: vec![id],
            };
            Ok((staged, commit))
        })();
        match staged {
            Ok((staged, commit)) => self.commit(commit, staged, ctx, |_, _| ()),
            Err(error @ ArbiterError::AppNotActive(_)) => self.refuse_once_written(error),
            Err(error) => refuse(error),
        }
    }
}

/// The answer to a bid: stored, with the id auditors find it under.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BidAck {
    pub bid_id: BidId,
    pub round: RoundId,
    /// True when this is a retry with an `Idempotency-Key` seen before: nothing new was stored.
    pub replayed: bool,
}

#[derive(Debug, Message)]
#[rtype(result = "Result<BidAck, ArbiterError>")]
pub struct SubmitBid {
    pub tenant: Option<TenantId>,
    pub round: RoundId,
    /// The bidding app; `bid.app` is its engine id.
    pub app: AppKey,
    pub bid: AppBid,
    pub idempotency_key: Option<String>,
    /// The caller's span (the HTTP request's), which the arbiter's work joins.
    pub span: tracing::Span,
}

impl Handler<SubmitBid> for Arbiter {
    type Result = ResponseFuture<Result<BidAck, ArbiterError>>;

    /// The bid is checked and counted here; the writer stores it (with others, in order) and
    /// the answer comes once it is committed.
    fn handle(&mut self, request: SubmitBid, ctx: &mut Self::Context) -> Self::Result {
        let span = request.span.clone();
        let _span = span.clone().entered();
        let (round, app) = (request.round, request.app);
        let (writer, store) = (self.writer.clone(), self.store.clone());
        let began = std::time::Instant::now();
        let effects = match self.count_bid(&request) {
            Ok(effects) => effects,
            // A retry (the app's bid in this round has the same `Idempotency-Key`) gets the
            // first answer, even after the round closed; the writer sees bids queued before it.
            Err(refusal) => {
                return Box::pin(
                    async move {
                        let Some(key) = request.idempotency_key else {
                            return Err(refusal);
                        };
                        match writer.bid_with_key(round, app, key.clone()).await? {
                            Some(bid_id) => {
                                let retry = Retry { key, app, round };
                                retry.answer(&store, bid_id, &request.bid).await
                            }
                            None => Err(refusal),
                        }
                    }
                    .instrument(span),
                )
            }
        };
        crate::metrics::metrics().bid_received("framework");
        let arbiter = ctx.address();
        let retry = request
            .idempotency_key
            .clone()
            .map(|key| Retry { key, app, round });
        let bid = request.bid.clone();
        // Queued before the round can close, so stored no later than its outcome.
        let stored = writer.insert_bid(NewBid {
            round,
            app,
            bid: request.bid,
            idempotency_key: request.idempotency_key,
            received_at: self.now(),
        });
        self.carry_out(effects, began, ctx);
        Box::pin(
            async move {
                let stored = stored.await;
                if !matches!(stored, Ok(BidInsert::Stored(_))) {
                    arbiter.do_send(ForgetBid { round, app });
                }
                match stored? {
                    BidInsert::Stored(bid_id) => Ok(BidAck {
                        bid_id,
                        round,
                        replayed: false,
                    }),
                    BidInsert::Replayed(bid_id) => match retry {
                        Some(retry) => retry.answer(&store, bid_id, &bid).await,
                        None => Ok(BidAck::replayed(bid_id, round)),
                    },
                    BidInsert::AlreadyBid => Err(ArbiterError::AlreadyBid { app, round }),
                }
            }
            .instrument(tracing::info_span!(parent: &span, "persistence")),
        )
    }
}

/// A bid sent with an `Idempotency-Key` that the app's bid in the round already has.
struct Retry {
    key: String,
    app: AppKey,
    round: RoundId,
}

impl Retry {
    /// The first answer if `bid` is the bid stored under the key (a true retry); a refusal if
    /// the key is being reused for a different bid (IETF Idempotency-Key draft, section 2.7).
    async fn answer(
        self,
        store: &crate::store::Store,
        bid_id: BidId,
        bid: &AppBid,
    ) -> Result<BidAck, ArbiterError> {
        let stored = store.bid(bid_id).await?;
        let same = stored
            .as_ref()
            .and_then(|stored| crate::server::app_bid(stored).ok())
            .is_some_and(|stored| stored == *bid);
        if same {
            Ok(BidAck::replayed(bid_id, self.round))
        } else {
            Err(ArbiterError::IdempotencyKeyReused {
                key: self.key,
                app: self.app,
                round: self.round,
            })
        }
    }
}

impl BidAck {
    fn replayed(bid_id: BidId, round: RoundId) -> Self {
        Self {
            bid_id,
            round,
            replayed: true,
        }
    }
}

/// A bid the arbiter counted was not stored (the database failed, or it was already there):
/// it must not count, so the app may bid again.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct ForgetBid {
    round: RoundId,
    app: AppKey,
}

impl Handler<ForgetBid> for Arbiter {
    type Result = ();

    fn handle(&mut self, ForgetBid { round, app }: ForgetBid, ctx: &mut Self::Context) {
        let app = AppId::from(app);
        self.feed(
            Event::BidNotStored {
                round: round.0,
                app,
            },
            ctx,
        );
    }
}

impl Arbiter {
    /// Checks the bid (the tenant here, the rest in the state machine) and counts it;
    /// returns what counting it calls for (the round may close).
    fn count_bid(
        &mut self,
        request: &SubmitBid,
    ) -> Result<Vec<agora_market::live::Effect>, ArbiterError> {
        let app = request.app;
        self.authorize(request.tenant, app)?;
        let counted = Event::FrameworkBid {
            round: request.round.0,
            bid: request.bid.clone(),
        };
        self.live
            .handle(self.now(), counted)
            .map_err(|refusal| match refusal {
                LiveError::UnknownRound(round) => ArbiterError::UnknownRound(RoundId(round)),
                LiveError::RoundClosed(round) => ArbiterError::RoundClosed(RoundId(round)),
                LiveError::NotABidder { round, .. } => ArbiterError::NotABidder {
                    app,
                    round: RoundId(round),
                },
                LiveError::AlreadyBid { round, .. } => ArbiterError::AlreadyBid {
                    app,
                    round: RoundId(round),
                },
                LiveError::TableTooLarge { entries, limit } => {
                    ArbiterError::TableTooLarge { entries, limit }
                }
                LiveError::InvalidBid(error) => ArbiterError::InvalidBid(error),
                error @ (LiveError::Market(_) | LiveError::Halted(_)) => {
                    ArbiterError::Internal(error.to_string())
                }
            })
    }
}

#[derive(Debug, Message)]
#[rtype(result = "Result<(), ArbiterError>")]
pub struct ReleaseLease {
    pub tenant: Option<TenantId>,
    pub lease: LeaseKey,
    /// The caller's span (the HTTP request's), which the arbiter's work joins.
    pub span: tracing::Span,
}

impl Handler<ReleaseLease> for Arbiter {
    type Result = Reply<()>;

    fn handle(&mut self, request: ReleaseLease, ctx: &mut Self::Context) -> Self::Result {
        let _span = request.span.clone().entered();
        let staged = (|| {
            let not_active = ArbiterError::LeaseNotActive(request.lease);
            let id = request.lease.lease_id().ok_or(not_active)?;
            let lease = self
                .market()
                .leases()
                .get(id)
                .ok_or(ArbiterError::LeaseNotActive(request.lease))?;
            // Another tenant's lease is answered as one that does not exist.
            self.authorize(request.tenant, app_key(&lease.app)?)
                .map_err(|_| ArbiterError::LeaseNotActive(request.lease))?;
            let mut next = self.market().clone();
            let released = next
                .release_lease(id, self.now())
                .map_err(|_| ArbiterError::LeaseNotActive(request.lease))?;
            let commit = records::ended_leases(&next, &[released], Some("released by the app"))?;
            Ok((next, commit))
        })();
        match staged {
            Ok((next, commit)) => self.commit(commit, Staged::market(next), ctx, |_, _| ()),
            Err(error) => refuse(error),
        }
    }
}

/// The answer to a drain: the lease given notice, if the GPU was leased.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DrainAck {
    pub gpu: GpuId,
    pub lease: Option<LeaseKey>,
    /// When the lease is revoked and the GPU leaves service.
    pub revoke_at: chrono::DateTime<chrono::Utc>,
}

/// Operator request: take a GPU out of service after a notice period (to be repaired), or put
/// it back (`healthy: true`).
#[derive(Debug, Message)]
#[rtype(result = "Result<DrainAck, ArbiterError>")]
pub struct SetGpuService {
    pub gpu: GpuId,
    pub healthy: bool,
    /// The caller's span (the HTTP request's), which the arbiter's work joins.
    pub span: tracing::Span,
}

impl Handler<SetGpuService> for Arbiter {
    type Result = Reply<DrainAck>;

    fn handle(&mut self, request: SetGpuService, ctx: &mut Self::Context) -> Self::Result {
        let _span = request.span.clone().entered();
        let Some(index) = self.market().cluster().index_of(&request.gpu) else {
            return refuse(ArbiterError::UnknownGpu(request.gpu.0));
        };
        let now = self.now();
        if request.healthy {
            let cancelled = Event::NoticeCancelled {
                gpu: index,
                withdrawal: Withdrawal::Drained,
            };
            self.feed(cancelled, ctx);
            let mut next = self.market().clone();
            next.set_gpu_health(index, true, now);
            let commit = Commit {
                gpu_health: vec![(request.gpu.clone(), true)],
                operator_actions: vec![OperatorAction {
                    action: "restore",
                    gpu: request.gpu.clone(),
                    lease: None,
                }],
                ..Commit::default()
            };
            return self.commit(commit, Staged::market(next), ctx, move |_, _| DrainAck {
                gpu: request.gpu,
                lease: None,
                revoke_at: to_datetime(now),
            });
        }
        // Out of service at once: no round offers it again, while the lease holding it, if
        // any, runs to the end of its notice.
        let mut next = self.market().clone();
        next.set_withdrawn(index, Withdrawal::Drained, true);
        let mut commit = Commit {
            gpu_health: vec![(request.gpu.clone(), false)],
            ..Commit::default()
        };
        let reason = format!("GPU {} is being drained by an operator", request.gpu);
        let (notice, lease) =
            match self.stage_notice(index, Withdrawal::Drained, reason, &mut commit) {
                Ok(staged) => staged,
                Err(error) => return refuse(error),
            };
        commit.operator_actions.push(OperatorAction {
            action: "drain",
            gpu: request.gpu.clone(),
            lease,
        });
        let revoke_at = to_datetime(notice.at);
        self.commit(commit, Staged::market(next), ctx, move |arbiter, ctx| {
            arbiter.feed(Event::NoticeGiven { gpu: index, notice }, ctx);
            DrainAck {
                gpu: request.gpu,
                lease,
                revoke_at,
            }
        })
    }
}

impl Arbiter {
    /// Stages a revocation notice for the lease holding `gpu`, if any: it ends after the grace
    /// period (at once when the GPU is free). Returns the notice to give once committed
    /// ([`Event::NoticeGiven`]), and the lease.
    pub(super) fn stage_notice(
        &self,
        gpu: GpuIndex,
        withdrawal: Withdrawal,
        reason: String,
        commit: &mut Commit,
    ) -> Result<(Notice, Option<LeaseKey>), ArbiterError> {
        let notice = self.live.notice_now(gpu, withdrawal, reason, self.now());
        let holder = self.market().leases().holder_of(gpu);
        if let Some(lease) = holder {
            commit
                .notices
                .push((lease.id.into(), notice.reason.clone()));
            commit.events.push(crate::store::AppEvent {
                app: app_key(&lease.app)?,
                payload: EventPayload::RevocationNotice(RevocationNoticeEvent {
                    lease: lease.id.into(),
                    gpu: self.market().cluster().gpu(gpu).id.clone(),
                    revoke_at: to_datetime(notice.at),
                    reason: notice.reason.clone(),
                }),
            });
        }
        Ok((notice, holder.map(|lease| lease.id.into())))
    }
}

/// An app's position now, for the "why" view.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AppStanding {
    /// rho as the app stands now: with the GPUs it holds and those its lease just ended on (its
    /// claim to renew them); `None` while it holds and claims none (starving).
    pub rho: Option<f64>,
    pub gpus_held: usize,
    pub unmet_demand: usize,
    /// 0 is the worst rho, the first to be offered GPUs.
    pub position: usize,
    pub active_apps: usize,
    /// How many of the worst apps are offered GPUs in a round, ceil((1 - f) N).
    pub bidders_per_round: usize,
}

#[derive(Debug, Message)]
#[rtype(result = "Result<AppStanding, ArbiterError>")]
pub struct StandingOf {
    pub tenant: Option<TenantId>,
    pub app: AppKey,
}

impl Handler<StandingOf> for Arbiter {
    type Result = Result<AppStanding, ArbiterError>;

    fn handle(&mut self, request: StandingOf, _: &mut Self::Context) -> Self::Result {
        let id = self.authorize(request.tenant, request.app)?;
        let now: Timestamp = self.now();
        let standings = self.market().standings(now);
        let position = standings
            .iter()
            .position(|standing| standing.app == id)
            .ok_or(ArbiterError::AppNotActive(request.app))?;
        let standing = &standings[position];
        Ok(AppStanding {
            rho: standing.rho.map(f64::from),
            gpus_held: self
                .market()
                .leases()
                .leases_of(&id)
                .map(|lease| lease.gpus.len())
                .sum(),
            unmet_demand: standing.unmet_demand,
            position,
            active_apps: standings.len(),
            bidders_per_round: self.market().config().bidders_per_round(standings.len()),
        })
    }
}

/// The round collecting bids now.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CurrentRound {
    pub round_id: RoundId,
    pub opened_at: chrono::DateTime<chrono::Utc>,
    /// Bids are taken until then: `round_deadline_ms` (the bid window) after the opening. The
    /// round may close earlier, once every bidder has bid.
    pub deadline: chrono::DateTime<chrono::Utc>,
    /// The configured bid window (`round_deadline_ms`).
    pub bid_window_ms: u64,
    /// How many apps were offered GPUs in it.
    pub bidders: usize,
    /// How many GPUs it offers.
    pub offered_gpus: usize,
}

/// The round collecting bids now, if one is.
#[derive(Debug, Message)]
#[rtype(result = "Option<CurrentRound>")]
pub struct CurrentRoundOf;

impl Handler<CurrentRoundOf> for Arbiter {
    type Result = Option<CurrentRound>;

    fn handle(&mut self, _: CurrentRoundOf, _: &mut Self::Context) -> Self::Result {
        let round = self.live.open_round()?;
        Some(CurrentRound {
            round_id: RoundId(round.id),
            opened_at: to_datetime(round.offer.now),
            deadline: to_datetime(round.deadline),
            bid_window_ms: self.settings.round_deadline.as_millis() as u64,
            bidders: round.offer.bidders.len(),
            offered_gpus: round.offer.offer.offer.gpus.len(),
        })
    }
}

/// An app's rho as the arbiter computes it, now and projected.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RhoView {
    pub app: AppKey,
    /// When it was computed (the arbiter's clock).
    pub at: chrono::DateTime<chrono::Utc>,
    /// rho now, standing on the GPUs the app holds and claims: the value the arbiter ranks it
    /// by and offers in its `offer` events; `null` while it holds and claims none (starving).
    pub rho: Option<f64>,
    /// The GPUs of the projection: exactly what the app would hold.
    pub projected_gpus: Vec<GpuId>,
    /// rho holding exactly `projected_gpus`, after the hypothetical progress if one was sent;
    /// `null` for no GPU (unbounded).
    pub projected_rho: Option<f64>,
}

/// An app's rho now, and with a hypothetical allocation (and progress).
#[derive(Debug, Message)]
#[rtype(result = "Result<RhoView, ArbiterError>")]
pub struct RhoOf {
    pub tenant: Option<TenantId>,
    pub app: AppKey,
    /// GPU ids the app would hold.
    pub gpus: Vec<GpuId>,
    /// Progress applied (to a copy) before projecting; nothing is changed.
    pub progress: Vec<JobProgress>,
}

impl Handler<RhoOf> for Arbiter {
    type Result = Result<RhoView, ArbiterError>;

    fn handle(&mut self, request: RhoOf, _: &mut Self::Context) -> Self::Result {
        let id = self.authorize(request.tenant, request.app)?;
        let now = self.now();
        let mut indices: Vec<GpuIndex> = Vec::with_capacity(request.gpus.len());
        for gpu in &request.gpus {
            let index = self.market().cluster().index_of(gpu).ok_or_else(|| {
                ArbiterError::InvalidAllocation(format!("gpus: {:?} is not in the cluster", gpu.0))
            })?;
            if indices.contains(&index) {
                return Err(ArbiterError::InvalidAllocation(format!(
                    "gpus: {:?} is listed twice",
                    gpu.0
                )));
            }
            indices.push(index);
        }
        let current = self
            .market()
            .rho_projection(&id, &indices, now)
            .map_err(|error| ArbiterError::Internal(error.to_string()))?;
        let projected = if request.progress.is_empty() {
            current.projected
        } else {
            let mut staged = self.market().clone();
            staged
                .app_mut(&id)
                .ok_or(ArbiterError::AppNotActive(request.app))?
                .apply_progress(&request.progress)?;
            staged
                .rho_projection(&id, &indices, now)
                .map_err(|error| ArbiterError::Internal(error.to_string()))?
                .projected
        };
        Ok(RhoView {
            app: request.app,
            at: to_datetime(now),
            rho: current.current.map(f64::from),
            projected_gpus: request.gpus,
            projected_rho: projected.map(f64::from),
        })
    }
}
