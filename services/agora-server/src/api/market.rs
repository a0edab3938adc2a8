//! Tenants, bids, rounds, leases and the cluster.

use actix_web::{get, post, web, HttpRequest, HttpResponse};
use agora_market::auction::{AppBid, BidEntry};
use agora_market::rho::Rho;
use agora_market::topology::GpuId;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::body::{check_name, Body};
use crate::ids::{AppKey, LeaseKey, RoundId, TenantId};

/// The longest tenant name, in characters.
pub const MAX_TENANT_NAME: usize = 100;
use super::problem::{ApiError, ErrorCode, Problem};
use super::{owned_app, ApiState, Caller};
use crate::actors::requests::{
    BidAck, CurrentRound, CurrentRoundOf, DrainAck, ReleaseLease, SetGpuService, SubmitBid,
};
use crate::store::{GpuView, OperatorActionView, RoundDetail, RoundSummary};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "vision-team"}))]
pub struct TenantBody {
    /// 1 to 100 characters, without control or bidirectional formatting characters.
    #[schema(min_length = 1, max_length = 100)]
    pub name: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantCreated {
    pub id: TenantId,
    pub name: String,
    /// The tenant's API token. Shown once: only its hash is stored.
    pub token: String,
}

/// Create a tenant and its first API token (admin only).
#[utoipa::path(post, path = "/v1/tenants", request_body = TenantBody,
    responses((status = 201, body = TenantCreated), (status = 403, body = Problem)))]
#[post("/v1/tenants")]
pub async fn create_tenant(
    state: web::Data<ApiState>,
    caller: Caller,
    body: Body<TenantBody>,
) -> Result<HttpResponse, ApiError> {
    caller.require_admin()?;
    let name = body.into_inner().name;
    check_name("name", &name, MAX_TENANT_NAME)
        .map_err(|reason| ApiError::unprocessable(ErrorCode::InvalidTenant, reason))?;
    let token = new_token();
    let id = state
        .store
        .create_tenant(&name, &super::token_sha256(&token))
        .await
        .map_err(|error| match error {
            crate::store::StoreError::Database(ref db)
                if db
                    .as_database_error()
                    .is_some_and(|db| db.is_unique_violation()) =>
            {
                ApiError::new(
                    actix_web::http::StatusCode::CONFLICT,
                    ErrorCode::DuplicateTenant,
                    format!("a tenant named {name:?} exists"),
                )
            }
            other => other.into(),
        })?;
    Ok(HttpResponse::Created().json(TenantCreated { id, name, token }))
}

/// A random bearer token: `agora_` and 64 hex digits (256 bits).
fn new_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system provides randomness");
    format!("agora_{}", hex::encode(bytes))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BidEntryBody {
    pub gpus: Vec<GpuId>,
    /// The app's rho if it wins this bundle: finite and > 0.
    pub rho: f64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"app": 7, "rho_old": 2.4,
    "bids": [{"gpus": ["m3-g0", "m3-g1"], "rho": 1.3}, {"gpus": ["m3-g0"], "rho": 1.8}]}))]
pub struct BidBody {
    pub app: AppKey,
    /// rho if the app wins nothing; `null` when it holds no GPU (starving). Required.
    #[serde(deserialize_with = "Option::deserialize")]
    #[schema(required = true)]
    pub rho_old: Option<f64>,
    pub bids: Vec<BidEntryBody>,
}

impl BidBody {
    fn into_bid(self) -> Result<AppBid, ApiError> {
        let rho = |value: f64| {
            Rho::new(value)
                .map_err(|error| ApiError::unprocessable(ErrorCode::InvalidRho, error.to_string()))
        };
        Ok(AppBid {
            app: self.app.into(),
            rho_old: self.rho_old.map(rho).transpose()?,
            bids: self
                .bids
                .into_iter()
                .map(|entry| {
                    Ok(BidEntry {
                        gpus: entry.gpus,
                        rho: rho(entry.rho)?,
                    })
                })
                .collect::<Result<_, ApiError>>()?,
        })
    }
}

/// Bid for an offer. Send an `Idempotency-Key` header to make retries safe: a key the app's
/// bid in this round already has returns the first answer and stores nothing.
#[utoipa::path(post, path = "/v1/rounds/{round}/bids", params(("round" = i64, Path),
    ("Idempotency-Key" = Option<String>, Header)), request_body = BidBody,
    responses((status = 201, body = BidAck), (status = 200, body = BidAck, description = "a retry"),
              (status = 409, body = Problem), (status = 422, body = Problem)))]
#[post("/v1/rounds/{round}/bids")]
pub async fn submit_bid(
    state: web::Data<ApiState>,
    caller: Caller,
    round: web::Path<RoundId>,
    request: HttpRequest,
    body: Body<BidBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    owned_app(&state, caller, body.app).await?;
    let idempotency_key = request
        .headers()
        .get("idempotency-key")
        .map(|value| {
            value
                .to_str()
                .ok()
                .filter(|key| !key.is_empty() && key.len() <= 200)
                .map(str::to_owned)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        ErrorCode::BadIdempotencyKey,
                        "Idempotency-Key must be 1 to 200 visible ASCII characters",
                    )
                })
        })
        .transpose()?;
    let ack = state
        .arbiter()
        .await?
        .send(SubmitBid {
            tenant: caller.tenant(),
            round: *round,
            app: body.app,
            bid: body.into_bid()?,
            idempotency_key,
            span: tracing::Span::current(),
        })
        .await??;
    Ok(if ack.replayed {
        HttpResponse::Ok().json(ack)
    } else {
        HttpResponse::Created().json(ack)
    })
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct RoundsQuery {
    /// Only rounds with a smaller id (the next page).
    pub before: Option<RoundId>,
    /// At most this many (default 50, at most 500).
    pub limit: Option<i64>,
}

/// Round history, newest first.
#[utoipa::path(get, path = "/v1/rounds", params(RoundsQuery),
    responses((status = 200, body = Vec<RoundSummary>)))]
#[get("/v1/rounds")]
pub async fn list_rounds(
    state: web::Data<ApiState>,
    _caller: Caller,
    query: web::Query<RoundsQuery>,
) -> Result<HttpResponse, ApiError> {
    let limit = super::bounded_limit(query.limit, 50, 500)?;
    Ok(HttpResponse::Ok().json(state.store.rounds(query.before, limit).await?))
}

/// The round collecting bids now: its deadline and the configured bid window. 404 when no
/// round is open (the next opens when GPUs are free and an app wants them).
#[utoipa::path(get, path = "/v1/rounds/current",
    responses((status = 200, body = CurrentRound), (status = 404, body = Problem)))]
#[get("/v1/rounds/current")]
pub async fn current_round(
    state: web::Data<ApiState>,
    _caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let current = state
        .arbiter()
        .await?
        .send(CurrentRoundOf)
        .await?
        .ok_or_else(|| ApiError::not_found("no round is collecting bids now"))?;
    Ok(HttpResponse::Ok().json(current))
}

/// One round in full: offer, standings, bids, PF choice, payments, allocations, leftovers.
/// Other tenants' apps appear without ids or bid tables.
#[utoipa::path(get, path = "/v1/rounds/{round}", params(("round" = i64, Path)),
    responses((status = 200, body = RoundDetail), (status = 404, body = Problem)))]
#[get("/v1/rounds/{round}")]
pub async fn get_round(
    state: web::Data<ApiState>,
    caller: Caller,
    round: web::Path<RoundId>,
) -> Result<HttpResponse, ApiError> {
    let detail = state
        .store
        .round_detail(*round, caller)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("round {round} does not exist")))?;
    Ok(HttpResponse::Ok().json(detail))
}

/// Give a lease back before its end.
#[utoipa::path(post, path = "/v1/leases/{lease}/release", params(("lease" = i64, Path)),
    responses((status = 204), (status = 409, body = Problem)))]
#[post("/v1/leases/{lease}/release")]
pub async fn release_lease(
    state: web::Data<ApiState>,
    caller: Caller,
    lease: web::Path<LeaseKey>,
) -> Result<HttpResponse, ApiError> {
    state
        .arbiter()
        .await?
        .send(ReleaseLease {
            tenant: caller.tenant(),
            lease: *lease,
            span: tracing::Span::current(),
        })
        .await??;
    Ok(HttpResponse::NoContent().finish())
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClusterView {
    pub gpus: Vec<GpuView>,
}

/// Machines and GPUs, their health, and who holds what (other tenants' holders hidden).
#[utoipa::path(get, path = "/v1/cluster", responses((status = 200, body = ClusterView)))]
#[get("/v1/cluster")]
pub async fn cluster(state: web::Data<ApiState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let gpus = state.store.cluster(caller).await?;
    Ok(HttpResponse::Ok().json(ClusterView { gpus }))
}

/// Take a GPU out of service (admin). Its lease, if any, gets a revocation notice and is
/// revoked after the grace period.
#[utoipa::path(post, path = "/v1/cluster/gpus/{gpu}/drain", params(("gpu" = String, Path)),
    responses((status = 200, body = DrainAck), (status = 403, body = Problem)))]
#[post("/v1/cluster/gpus/{gpu}/drain")]
pub async fn drain_gpu(
    state: web::Data<ApiState>,
    caller: Caller,
    gpu: web::Path<GpuId>,
) -> Result<HttpResponse, ApiError> {
    set_service(state, caller, gpu.into_inner(), false).await
}

/// Put a drained GPU back into service (admin).
#[utoipa::path(post, path = "/v1/cluster/gpus/{gpu}/restore", params(("gpu" = String, Path)),
    responses((status = 200, body = DrainAck), (status = 403, body = Problem)))]
#[post("/v1/cluster/gpus/{gpu}/restore")]
pub async fn restore_gpu(
    state: web::Data<ApiState>,
    caller: Caller,
    gpu: web::Path<GpuId>,
) -> Result<HttpResponse, ApiError> {
    set_service(state, caller, gpu.into_inner(), true).await
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ActionsQuery {
    /// At most this many (default 50, at most 500).
    pub limit: Option<i64>,
}

/// The audit log of operator actions (admin), newest first: every drain and restore, when,
/// and the lease a drain gave notice to.
#[utoipa::path(get, path = "/v1/cluster/actions", params(ActionsQuery),
    responses((status = 200, body = Vec<OperatorActionView>), (status = 403, body = Problem)))]
#[get("/v1/cluster/actions")]
pub async fn operator_actions(
    state: web::Data<ApiState>,
    caller: Caller,
    query: web::Query<ActionsQuery>,
) -> Result<HttpResponse, ApiError> {
    caller.require_admin()?;
    let limit = super::bounded_limit(query.limit, 50, 500)?;
    Ok(HttpResponse::Ok().json(state.store.operator_actions(limit).await?))
}

async fn set_service(
    state: web::Data<ApiState>,
    caller: Caller,
    gpu: GpuId,
    healthy: bool,
) -> Result<HttpResponse, ApiError> {
    caller.require_admin()?;
    let service = SetGpuService {
        gpu,
        healthy,
        span: tracing::Span::current(),
    };
    let ack = state.arbiter().await?.send(service).await??;
    Ok(HttpResponse::Ok().json(ack))
}
