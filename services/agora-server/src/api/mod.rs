//! The HTTP API (actix-web): translation between HTTP and the arbiter or the store, nothing
//! else. `/openapi.json` is generated from these handlers; `docs/api.md` walks through it.

mod apps;
pub mod body;
mod dashboard;
mod events;
mod follow;
mod market;
mod metrics;
pub mod problem;
mod tokens;
mod workers;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use actix::Addr;
use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::{PathError, QueryPayloadError};
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use sha2::{Digest, Sha256};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::actors::arbiter::Arbiter;
use crate::ids::{AppKey, TenantId};
use crate::leadership::Leadership;
use crate::notices::Notices;
use crate::store::{AppRow, Store};
pub use crate::visibility::Caller;
use problem::ApiError;
use tokens::Lookup;
pub use tokens::Tokens;

/// What every handler can reach.
#[derive(Debug, Clone)]
pub struct ApiState {
    pub store: Store,
    /// The arbiter actor, while this arbiter leads.
    pub leadership: Leadership,
    pub admin_token_sha256: Option<[u8; 32]>,
    /// The worker token GPU hosts present; `None` with a simulated fleet (no hosts).
    pub worker_token_sha256: Option<[u8; 32]>,
    /// Which apps have new events (see `app_events`).
    pub notices: Arc<Notices>,
    /// App owners already looked up.
    pub owners: Arc<Owners>,
    /// Bearer tokens already looked up.
    pub tokens: Arc<Tokens>,
    /// The service's clock: "now" for the history's ranges.
    pub clock: Arc<dyn crate::clock::Clock>,
}

impl ApiState {
    /// The arbiter actor; on a standby, 503 `not_leader` naming the leader.
    async fn arbiter(&self) -> Result<Addr<Arbiter>, ApiError> {
        match self.leadership.arbiter() {
            Some(arbiter) => Ok(arbiter),
            None => Err(self.not_leader().await),
        }
    }

    /// For what only the leader knows live (its notices of new events): 503 `not_leader` on
    /// a standby.
    async fn require_leader(&self) -> Result<(), ApiError> {
        self.arbiter().await.map(drop)
    }

    /// The answer a standby gives: where the leader is, as it recorded itself.
    async fn not_leader(&self) -> ApiError {
        let leader = self.store.leader_url().await.unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot read the leader's URL");
            None
        });
        ApiError::not_leader(leader)
    }
}

/// On a standby, answers every request that may write (any method but GET and HEAD) with 503
/// `not_leader` naming the leader, before it reaches a handler: only the leader writes.
pub async fn turn_writes_away(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let reads = matches!(request.method().as_str(), "GET" | "HEAD");
    let standby = request
        .app_data::<web::Data<ApiState>>()
        .filter(|state| !reads && state.leadership.arbiter().is_none())
        .cloned();
    match standby {
        Some(state) => {
            let answer = actix_web::ResponseError::error_response(&state.not_leader().await);
            Ok(request.into_response(answer).map_into_right_body())
        }
        None => Ok(next.call(request).await?.map_into_left_body()),
    }
}

/// App owners already looked up, so that a busy framework's requests do not each cost an app
/// query. An app never changes tenant, so an owner found in the database stays true (and the
/// map is bounded by the apps table).
#[derive(Debug, Default)]
pub struct Owners {
    apps: RwLock<HashMap<AppKey, TenantId>>,
}

impl Owners {
    fn remember_app(&self, app: AppKey, tenant: TenantId) {
        self.apps
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(app, tenant);
    }

    fn app_owner(&self, app: AppKey) -> Option<TenantId> {
        self.apps
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&app)
            .copied()
    }
}

impl Caller {
    pub fn require_tenant(self) -> Result<TenantId, ApiError> {
        self.tenant().ok_or_else(|| {
            ApiError::bad_request(
                problem::ErrorCode::TenantRequired,
                "this acts for a tenant: use a tenant's token, not the admin token",
            )
        })
    }

    pub fn require_admin(self) -> Result<(), ApiError> {
        match self {
            Self::Admin => Ok(()),
            Self::Tenant(_) => Err(ApiError::admin_only()),
        }
    }
}

pub fn token_sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The SHA-256 of the request's `Authorization: Bearer` token, if it sent one.
fn bearer_sha256(request: &HttpRequest) -> Option<[u8; 32]> {
    request
        .headers()
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(|token| token_sha256(token.trim()))
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = request.app_data::<web::Data<ApiState>>().cloned();
        let token = bearer_sha256(request);
        Box::pin(async move {
            let (Some(state), Some(hash)) = (state, token) else {
                return Err(ApiError::unauthorized());
            };
            if state.admin_token_sha256 == Some(hash) {
                return Ok(Self::Admin);
            }
            let generation = match state.tokens.lookup(&hash) {
                Lookup::Tenant(tenant) => return Ok(Self::Tenant(tenant)),
                Lookup::Unknown { generation } => generation,
            };
            let tenant = state
                .store
                .tenant_for_token(&hash)
                .await?
                .ok_or_else(ApiError::unauthorized)?;
            state.tokens.remember(hash, tenant, generation);
            Ok(Self::Tenant(tenant))
        })
    }
}

/// The app, if it exists and `caller` may see it.
async fn authorized_app(state: &ApiState, caller: Caller, app: AppKey) -> Result<AppRow, ApiError> {
    let row = state
        .store
        .app(app)
        .await?
        .ok_or_else(|| no_such_app(app))?;
    state.owners.remember_app(app, row.tenant_id);
    check_owner(caller, app, row.tenant_id)?;
    Ok(row)
}

/// `app`, if it exists and `caller` may act for it; answered from memory once seen.
async fn owned_app(state: &ApiState, caller: Caller, app: AppKey) -> Result<AppKey, ApiError> {
    match state.owners.app_owner(app) {
        Some(owner) => check_owner(caller, app, owner).map(|()| app),
        None => authorized_app(state, caller, app).await.map(|row| row.id),
    }
}

fn no_such_app(app: AppKey) -> ApiError {
    ApiError::not_found(format!("app {app} does not exist"))
}

fn check_owner(caller: Caller, app: AppKey, owner: TenantId) -> Result<(), ApiError> {
    if caller.sees(owner) {
        Ok(())
    } else {
        // The same answer as for an app that does not exist: ids cannot be probed.
        Err(no_such_app(app))
    }
}

/// Routes and extractor settings of the whole API.
pub fn configure(config: &mut web::ServiceConfig) {
    config
        .app_data(web::PayloadConfig::new(body::BODY_LIMIT))
        .app_data(web::PathConfig::default().error_handler(path_error))
        .app_data(web::QueryConfig::default().error_handler(query_error))
        .route(
            "/healthz",
            web::get().to(|| async { HttpResponse::Ok().body("ok") }),
        )
        .route("/openapi.json", web::get().to(openapi))
        .route("/metrics", web::get().to(metrics::prometheus))
        .configure(dashboard::routes)
        .service(market::create_tenant)
        .service(apps::register_app)
        .service(apps::list_apps)
        .service(apps::get_app)
        .service(apps::report_progress)
        .service(apps::report_throughput)
        .service(apps::report_speed_change)
        .service(apps::finish_app)
        .service(apps::app_leases)
        .service(apps::why)
        .service(apps::rho)
        .service(events::stream)
        .service(events::poll)
        .service(market::submit_bid)
        .service(market::list_rounds)
        .service(market::current_round)
        .service(market::get_round)
        .service(market::release_lease)
        .service(market::cluster)
        .service(market::drain_gpu)
        .service(market::restore_gpu)
        .service(market::operator_actions)
        .service(workers::register)
        .service(workers::heartbeat)
        .default_service(web::to(|| async {
            Err::<HttpResponse, _>(ApiError::not_found("no such endpoint; see /openapi.json"))
        }));
}

/// A `limit` query parameter: `default` when absent, else 1 to `max` (400 `bad_query`
/// otherwise; a limit is never silently changed).
fn bounded_limit(limit: Option<i64>, default: i64, max: i64) -> Result<i64, ApiError> {
    match limit {
        None => Ok(default),
        Some(limit) if (1..=max).contains(&limit) => Ok(limit),
        Some(limit) => Err(ApiError::bad_request(
            problem::ErrorCode::BadQuery,
            format!("limit must be 1 to {max}, got {limit}"),
        )),
    }
}

/// The `Last-Event-ID` header, if sent: an event id (a non-negative integer); anything else is
/// 400 `bad_last_event_id` rather than a replay from the start.
fn last_event_id(request: &HttpRequest) -> Result<Option<i64>, ApiError> {
    let Some(value) = request.headers().get("last-event-id") else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse::<i64>().ok())
        .filter(|id| *id >= 0)
        .map(Some)
        .ok_or_else(|| {
            ApiError::bad_request(
                problem::ErrorCode::BadLastEventId,
                "Last-Event-ID must be the id of an event received (a non-negative integer)",
            )
        })
}

fn path_error(error: PathError, _: &HttpRequest) -> actix_web::Error {
    ApiError::not_found(format!("bad path: {error}")).into()
}

fn query_error(error: QueryPayloadError, _: &HttpRequest) -> actix_web::Error {
    ApiError::bad_request(problem::ErrorCode::BadQuery, error.to_string()).into()
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Agora arbiter API",
        description = "A fair GPU marketplace (Themis): register apps, report progress, follow offers, bid, hold leases, audit rounds."
    ),
    paths(
        market::create_tenant,
        apps::register_app,
        apps::list_apps,
        apps::get_app,
        apps::report_progress,
        apps::report_throughput,
        apps::report_speed_change,
        apps::finish_app,
        apps::app_leases,
        apps::why,
        apps::rho,
        events::stream,
        events::poll,
        market::submit_bid,
        market::list_rounds,
        market::current_round,
        market::get_round,
        market::release_lease,
        market::cluster,
        market::drain_gpu,
        market::restore_gpu,
        market::operator_actions,
        workers::register,
        workers::heartbeat,
        dashboard::me,
        dashboard::rho_history,
        dashboard::app_rounds,
        dashboard::fairness,
        dashboard::fairness_history,
        dashboard::lease_timeline,
        dashboard::round_events,
    ),
    modifiers(&BearerAuth, &ProblemAnswers),
    security(("bearer" = []))
)]
#[derive(Debug)]
pub struct ApiDoc;

#[derive(Debug)]
struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Completes every operation's answers with the problems any request of its shape can get
/// (401 without a valid token and 503 while the database or the arbiter is away or on a
/// standby, everywhere;
/// 400 with query parameters, headers or a body; 404 with a path parameter; 413 and 422 with
/// a body), and gives every error answer its media type, `application/problem+json`, with
/// the `Problem` schema.
#[derive(Debug)]
struct ProblemAnswers;

impl Modify for ProblemAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::ParameterIn;
        use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
        const PROBLEM: &str = "application/problem+json";
        for (path, item) in openapi.paths.paths.iter_mut() {
            let operations = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for operation in operations.into_iter().flatten() {
                let takes_query = operation.parameters.iter().flatten().any(|parameter| {
                    matches!(
                        parameter.parameter_in,
                        ParameterIn::Query | ParameterIn::Header
                    )
                });
                let takes_body = operation.request_body.is_some();
                let mut problems = vec![
                    ("401", "no token, or one this endpoint does not take"),
                    (
                        "503",
                        "the database or the arbiter is unavailable, or this arbiter is a \
                         standby (`not_leader`, naming the leader); retry after `Retry-After`",
                    ),
                ];
                if takes_query || takes_body {
                    problems.push((
                        "400",
                        "a body that is not JSON, or a bad query parameter or header",
                    ));
                }
                if path.contains('{') {
                    problems.push(("404", "no such thing for this caller"));
                }
                if takes_body {
                    problems.push(("413", "a body over 1 MiB"));
                    problems.push(("422", "a well-formed body that is not valid"));
                }
                for (status, description) in problems {
                    operation
                        .responses
                        .responses
                        .entry(status.to_owned())
                        .or_insert_with(|| {
                            let content = ContentBuilder::new()
                                .schema(Some(Ref::from_schema_name("Problem")))
                                .build();
                            RefOr::T(
                                ResponseBuilder::new()
                                    .description(description)
                                    .content(PROBLEM, content)
                                    .build(),
                            )
                        });
                }
                for (status, response) in operation.responses.responses.iter_mut() {
                    let RefOr::T(response) = response else {
                        continue;
                    };
                    if status.starts_with('4') || status.starts_with('5') {
                        if let Some(content) = response.content.shift_remove("application/json") {
                            response.content.insert(PROBLEM.to_owned(), content);
                        }
                    }
                }
            }
        }
    }
}

async fn openapi() -> HttpResponse {
    HttpResponse::Ok().json(ApiDoc::openapi())
}
