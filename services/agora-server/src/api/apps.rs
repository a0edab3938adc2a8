//! Apps: register, report progress, measured throughput and speed changes, finish, leases, and
//! "why did I get what I got".

use actix_web::{get, post, web, HttpResponse};
use agora_market::app::AppKind;
use agora_market::progress::{JobProgress, SpeedChangeReport};
use agora_market::throughput::{Throughput, ThroughputReport};
use agora_market::topology::GpuId;
use agora_protocol::Enforcement;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::body::{check_name, Body};
use crate::ids::{AppKey, RoundId};

/// The longest app name, in characters.
pub const MAX_APP_NAME: usize = 200;
use super::problem::{ApiError, ErrorCode, Problem};
use super::{authorized_app, owned_app, ApiState, Caller};
use crate::actors::agent::Bidding;
use crate::actors::requests::{
    AppStanding, FinishApp, ProgressAck, RegisterApp, ReportProgress, ReportSpeedChange,
    ReportThroughput, RhoOf, RhoView, SpeedChangeAck, StandingOf,
};
use crate::actors::ArbiterError;
use crate::store::{AppRow, LeaseView};
use crate::why::{round_sentence, RoundFacts};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "name": "resnet-sweep",
    "bidding": "agent",
    "app": {"kind": "single_job", "job": {"id": "trial-0", "total_iterations": 1000,
            "serial_iteration_time": 0.5, "max_gpus": 2}},
    "enforcement": {"mode": "launch", "command": ["python", "train.py", "--sweep", "resnet"],
                    "env": {"WANDB_MODE": "offline"}}
}))]
pub struct RegisterBody {
    /// Unique within the tenant.
    pub name: String,
    /// `agent` (default): the arbiter's agent bids from the reported progress. `explicit`: the
    /// framework posts its own bids for each offer.
    #[serde(default = "default_bidding")]
    pub bidding: String,
    /// The search: `single_job`, `successive_halving` or `performance_curve`, with its jobs
    /// (the engine's app format, `docs/simulator-inputs.md`).
    pub app: AppKind,
    /// How GPU hosts enforce the app's leases: `{"mode": "watch"}` (default: the app runs its
    /// jobs; the worker reports foreign processes on leased GPUs) or `{"mode": "launch",
    /// "command": [...], "env": {...}}` (the worker starts the command for each lease with
    /// `CUDA_VISIBLE_DEVICES` set, SIGTERM at the end minus the grace period, SIGKILL at the
    /// end). Ignored by a simulated fleet.
    #[serde(default = "default_enforcement")]
    pub enforcement: Enforcement,
}

fn default_enforcement() -> Enforcement {
    Enforcement::Watch
}

fn default_bidding() -> String {
    "agent".to_owned()
}

/// Register an app (a hyper-parameter search) of the calling tenant.
#[utoipa::path(post, path = "/v1/apps", request_body = RegisterBody,
    responses((status = 201, body = AppRow), (status = 409, body = Problem), (status = 422, body = Problem)))]
#[post("/v1/apps")]
pub async fn register_app(
    state: web::Data<ApiState>,
    caller: Caller,
    body: Body<RegisterBody>,
) -> Result<HttpResponse, ApiError> {
    let tenant = caller.require_tenant()?;
    let body = body.into_inner();
    check_name("name", &body.name, MAX_APP_NAME)
        .map_err(|reason| ApiError::unprocessable(ErrorCode::InvalidApp, reason))?;
    let bidding = Bidding::parse(&body.bidding).ok_or_else(|| {
        ApiError::unprocessable(
            ErrorCode::InvalidApp,
            "bidding must be `agent` or `explicit`",
        )
    })?;
    let id = state
        .arbiter()
        .await?
        .send(RegisterApp {
            tenant,
            name: body.name,
            bidding,
            kind: body.app,
            enforcement: body.enforcement,
            span: tracing::Span::current(),
        })
        .await??;
    let row = authorized_app(&state, caller, id).await?;
    Ok(HttpResponse::Created().json(row))
}

/// The calling tenant's apps, finished ones included (the admin sees every tenant's).
#[utoipa::path(get, path = "/v1/apps", responses((status = 200, body = Vec<AppRow>)))]
#[get("/v1/apps")]
pub async fn list_apps(
    state: web::Data<ApiState>,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(state.store.apps_of(caller).await?))
}

#[utoipa::path(get, path = "/v1/apps/{app}", params(("app" = i64, Path)),
    responses((status = 200, body = AppRow), (status = 404, body = Problem)))]
#[get("/v1/apps/{app}")]
pub async fn get_app(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok().json(authorized_app(&state, caller, *app).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"jobs": [{"job": "trial-0", "completed_iterations": 120,
    "observed": {"locality": "same_machine", "gpus": 2, "seconds_per_iteration": 0.27}}]}))]
pub struct ProgressBody {
    pub jobs: Vec<JobProgress>,
}

/// Report job progress: iterations done, jobs stopped early, observed iteration times. An app
/// with nothing left to run finishes; the report that finished it, sent again, is answered as
/// the first time.
#[utoipa::path(post, path = "/v1/apps/{app}/progress", params(("app" = i64, Path)),
    request_body = ProgressBody,
    responses((status = 200, body = ProgressAck), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
#[post("/v1/apps/{app}/progress")]
pub async fn report_progress(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
    body: Body<ProgressBody>,
) -> Result<HttpResponse, ApiError> {
    owned_app(&state, caller, *app).await?;
    let jobs = body.into_inner().jobs;
    let answer = state
        .arbiter()
        .await?
        .send(ReportProgress {
            tenant: caller.tenant(),
            app: *app,
            jobs: jobs.clone(),
            span: tracing::Span::current(),
        })
        .await?;
    let ack = match answer {
        // The arbiter refuses once the app's last state is durable, so the store has it.
        Err(ArbiterError::AppNotActive(_))
            if state
                .store
                .finished_app(*app)
                .await?
                .is_some_and(|finished| finished.already_took(&jobs)) =>
        {
            ProgressAck { finished: true }
        }
        answer => answer?,
    };
    Ok(HttpResponse::Ok().json(ack))
}

/// The app's throughput table after a report.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"throughput": {"k80": 1.0, "v100": 3.9}}))]
pub struct ThroughputAck {
    /// The app's speed per GPU type, which its rho and bids use from now on.
    pub throughput: Throughput,
}

/// Report a measured throughput: the app runs at `speed` on GPUs of type `gpu_type`, relative
/// to the speed its `serial_iteration_time`s were measured at (1.0). It replaces that type's
/// entry of the app's table; the other types keep theirs.
#[utoipa::path(post, path = "/v1/apps/{app}/throughput", params(("app" = i64, Path)),
    request_body = ThroughputReport,
    responses((status = 200, body = ThroughputAck), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
#[post("/v1/apps/{app}/throughput")]
pub async fn report_throughput(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
    body: Body<ThroughputReport>,
) -> Result<HttpResponse, ApiError> {
    owned_app(&state, caller, *app).await?;
    let throughput = state
        .arbiter()
        .await?
        .send(ReportThroughput {
            tenant: caller.tenant(),
            app: *app,
            report: body.into_inner(),
            span: tracing::Span::current(),
        })
        .await??;
    Ok(HttpResponse::Ok().json(ThroughputAck { throughput }))
}

/// Report a change of a job's speed as it happens (its framework scaled the batch size): from
/// iteration `at_iteration` on, an iteration takes `serial_iteration_time` seconds on one GPU.
/// The report replaces the job's schedule from that iteration on (changes declared at or after
/// it are dropped, earlier ones kept); rho and the agent's bids use it from the next round.
#[utoipa::path(post, path = "/v1/apps/{app}/speed-changes", params(("app" = i64, Path)),
    request_body = SpeedChangeReport,
    responses((status = 200, body = SpeedChangeAck), (status = 409, body = Problem),
        (status = 422, body = Problem)))]
#[post("/v1/apps/{app}/speed-changes")]
pub async fn report_speed_change(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
    body: Body<SpeedChangeReport>,
) -> Result<HttpResponse, ApiError> {
    owned_app(&state, caller, *app).await?;
    let ack = state
        .arbiter()
        .await?
        .send(ReportSpeedChange {
            tenant: caller.tenant(),
            app: *app,
            report: body.into_inner(),
            span: tracing::Span::current(),
        })
        .await??;
    Ok(HttpResponse::Ok().json(ack))
}

/// The search is over: the app leaves the market and its leases are released. An app that
/// finished already (its last job ended, or this request's first attempt) stays finished.
#[utoipa::path(post, path = "/v1/apps/{app}/finish", params(("app" = i64, Path)),
    responses((status = 204), (status = 409, body = Problem)))]
#[post("/v1/apps/{app}/finish")]
pub async fn finish_app(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
) -> Result<HttpResponse, ApiError> {
    owned_app(&state, caller, *app).await?;
    let answer = state
        .arbiter()
        .await?
        .send(FinishApp {
            tenant: caller.tenant(),
            app: *app,
            span: tracing::Span::current(),
        })
        .await?;
    match answer {
        // The arbiter refuses once the app's last state is durable, so the store has it.
        Err(ArbiterError::AppNotActive(_)) if state.store.finished_app(*app).await?.is_some() => {}
        answer => answer?,
    }
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"gpus": ["m0-g0", "m0-g1"],
    "progress": [{"job": "trial-0", "completed_iterations": 600}]}))]
pub struct RhoBody {
    /// The GPUs the app would hold (their ids, as in `/v1/cluster`); none: the projection is
    /// for holding nothing.
    #[serde(default)]
    pub gpus: Vec<GpuId>,
    /// Hypothetical progress (as in `POST /v1/apps/{app}/progress`), applied to a copy of the
    /// app before projecting; nothing is stored.
    #[serde(default)]
    pub progress: Vec<JobProgress>,
}

/// The app's rho now and projected: with a hypothetical allocation (and progress), computed
/// by the arbiter's own engine functions, exactly as it ranks apps and its agent bids.
#[utoipa::path(post, path = "/v1/apps/{app}/rho", params(("app" = i64, Path)),
    request_body = RhoBody,
    responses((status = 200, body = RhoView), (status = 404, body = Problem),
              (status = 409, body = Problem), (status = 422, body = Problem)))]
#[post("/v1/apps/{app}/rho")]
pub async fn rho(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
    body: Body<RhoBody>,
) -> Result<HttpResponse, ApiError> {
    owned_app(&state, caller, *app).await?;
    let body = body.into_inner();
    let view = state
        .arbiter()
        .await?
        .send(RhoOf {
            tenant: caller.tenant(),
            app: *app,
            gpus: body.gpus,
            progress: body.progress,
        })
        .await??;
    Ok(HttpResponse::Ok().json(view))
}

/// Every lease of the app, with each GPU's host and CUDA UUID.
#[utoipa::path(get, path = "/v1/apps/{app}/leases", params(("app" = i64, Path)),
    responses((status = 200, body = Vec<LeaseView>)))]
#[get("/v1/apps/{app}/leases")]
pub async fn app_leases(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
) -> Result<HttpResponse, ApiError> {
    owned_app(&state, caller, *app).await?;
    Ok(HttpResponse::Ok().json(state.store.leases_of(*app).await?))
}

/// Why the app has what it has.
#[derive(Debug, Serialize, ToSchema)]
pub struct Why {
    pub app: AppKey,
    /// Where it stands now; `None` once it finished.
    pub now: Option<AppStanding>,
    pub last_round: Option<LastRoundWhy>,
    /// The answer in words.
    pub explanation: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct LastRoundWhy {
    pub round: RoundId,
    pub bidder: bool,
    /// 0 is the worst rho.
    pub position: i32,
    pub rho: Option<f64>,
    pub bid_entries: usize,
    pub pf_entry: Option<i32>,
    pub c: Option<f64>,
    pub won_gpus: Vec<GpuId>,
    pub leftover_gpus: Vec<GpuId>,
}

#[utoipa::path(get, path = "/v1/apps/{app}/why", params(("app" = i64, Path)),
    responses((status = 200, body = Why)))]
#[get("/v1/apps/{app}/why")]
pub async fn why(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
) -> Result<HttpResponse, ApiError> {
    let row = authorized_app(&state, caller, *app).await?;
    let now = match row.finished_at {
        Some(_) => None,
        None => state
            .arbiter()
            .await?
            .send(StandingOf {
                tenant: caller.tenant(),
                app: row.id,
            })
            .await?
            .ok(),
    };
    let last_round = last_round_why(&state, row.id).await?;
    let explanation = explain(&row, now.as_ref(), last_round.as_ref());
    Ok(HttpResponse::Ok().json(Why {
        app: row.id,
        now,
        last_round: last_round.map(|(why, _)| why),
        explanation,
    }))
}

/// The app's last round, and that round in words.
async fn last_round_why(
    state: &ApiState,
    app: AppKey,
) -> Result<Option<(LastRoundWhy, String)>, ApiError> {
    let Some(last) = state.store.last_round_of(app).await? else {
        return Ok(None);
    };
    let Some(round) = state.store.stored_round(last.round_id).await? else {
        return Ok(None);
    };
    let bid = round.bids.iter().find(|bid| bid.app_id == app);
    let allocation = round.allocations.into_iter().find(|row| row.app == app);
    let pf_entry = allocation.as_ref().and_then(|row| row.pf_entry);
    let c = allocation.as_ref().and_then(|row| row.c);
    let (won_gpus, leftover_gpus, pf_gpus) = allocation
        .map(|row| (row.kept_gpus, row.leftover_gpus, row.pf_gpus))
        .unwrap_or_default();
    let sentence = round_sentence(&RoundFacts {
        round: last.round_id,
        position: last.position,
        rho: last.rho,
        offered_apps: round.bidders.len(),
        offered: last.bidder,
        bid_gpus: bid.map(|bid| {
            bid.entries
                .iter()
                .map(|(gpus, _)| gpus.len())
                .max()
                .unwrap_or(0)
        }),
        pf_gpus: pf_entry.map(|_| pf_gpus.len()),
        c,
        kept_gpus: won_gpus.len(),
        leftover_gpus: leftover_gpus.len(),
    });
    let last_round = LastRoundWhy {
        round: last.round_id,
        bidder: last.bidder,
        position: last.position,
        rho: last.rho,
        bid_entries: bid.map_or(0, |bid| bid.entries.len()),
        pf_entry,
        c,
        won_gpus,
        leftover_gpus,
    };
    Ok(Some((last_round, sentence)))
}

/// The app's situation in words: finished, holding all it can use, waiting for its first
/// round, or else its last round as [`round_sentence`] tells it.
fn explain(
    row: &AppRow,
    now: Option<&AppStanding>,
    last: Option<&(LastRoundWhy, String)>,
) -> String {
    if row.finished_at.is_some() {
        return "the app has finished and holds no GPUs".to_owned();
    }
    if let Some(now) = now.filter(|now| now.unmet_demand == 0) {
        return format!(
            "it holds {} GPUs, all its running jobs can use, so it is not offered more",
            now.gpus_held
        );
    }
    match last {
        Some((_, sentence)) => sentence.clone(),
        None => "no round has run since it arrived; the next free GPUs are offered to it if its rho is among the worst".to_owned(),
    }
}
