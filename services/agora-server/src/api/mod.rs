//! The HTTP API (actix-web): translation between HTTP and the arbiter or the store, nothing
//! else. `/openapi.json` is generated from these handlers; `docs/api.md` walks through it.

mod apps;
mod dashboard;
mod events;
mod market;
mod metrics;
pub mod problem;
mod schemas;
mod tokens;
mod workers;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};

use actix::Addr;
use actix_web::dev::Payload;
use actix_web::error::{PathError, QueryPayloadError};
use actix_web::{web, FromRequest, HttpMessage, HttpRequest, HttpResponse};
use serde::de::DeserializeOwned;
use serde_json::Value;
use sha2::{Digest, Sha256};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::actors::arbiter::Arbiter;
use crate::notices::Notices;
use crate::store::{AppRow, Store};
use problem::{ApiError, ErrorCode};
pub use schemas::EventPayloadSchema;
use tokens::Lookup;
pub use tokens::Tokens;

/// What every handler can reach.
#[derive(Debug, Clone)]
pub struct ApiState {
    pub store: Store,
    pub arbiter: Addr<Arbiter>,
    pub admin_token_sha256: Option<[u8; 32]>,
    /// The worker token GPU hosts present; `None` with a simulated fleet (no hosts).
    pub worker_token_sha256: Option<[u8; 32]>,
    /// Which apps have new events (see `app_events`).
    pub notices: Arc<Notices>,
    /// App owners already looked up.
    pub owners: Arc<Owners>,
    /// Bearer tokens already looked up.
    pub tokens: Arc<Tokens>,
}

/// App owners already looked up, so that a busy framework's requests do not each cost an app
/// query. An app never changes tenant, so an owner found in the database stays true (and the
/// map is bounded by the apps table).
#[derive(Debug, Default)]
pub struct Owners {
    apps: RwLock<HashMap<i64, i64>>,
}

impl Owners {
    fn remember_app(&self, app: i64, tenant: i64) {
        self.apps
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(app, tenant);
    }

    fn app_owner(&self, app: i64) -> Option<i64> {
        self.apps
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(&app)
            .copied()
    }
}

/// Who is calling: a tenant, or the admin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    Admin,
    Tenant(i64),
}

impl Caller {
    /// The tenant to restrict to; `None` for the admin, who sees everything.
    pub fn tenant(self) -> Option<i64> {
        match self {
            Self::Admin => None,
            Self::Tenant(tenant) => Some(tenant),
        }
    }

    pub fn require_tenant(self) -> Result<i64, ApiError> {
        self.tenant().ok_or_else(|| {
            ApiError::new(
                ErrorCode::TenantRequired,
                "this acts for a tenant: use a tenant's token, not the admin token",
            )
        })
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
async fn authorized_app(state: &ApiState, caller: Caller, app: i64) -> Result<AppRow, ApiError> {
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
async fn owned_app(state: &ApiState, caller: Caller, app: i64) -> Result<i64, ApiError> {
    match state.owners.app_owner(app) {
        Some(owner) => check_owner(caller, app, owner).map(|()| app),
        None => authorized_app(state, caller, app).await.map(|row| row.id),
    }
}

fn no_such_app(app: i64) -> ApiError {
    ApiError::not_found(format!("app {app} does not exist"))
}

/// Another tenant's app is answered exactly as a missing one, so ids cannot be probed.
fn check_owner(caller: Caller, app: i64, owner: i64) -> Result<(), ApiError> {
    match caller.tenant() {
        Some(tenant) if tenant != owner => Err(no_such_app(app)),
        _ => Ok(()),
    }
}

/// Routes and extractor settings of the whole API.
pub fn configure(config: &mut web::ServiceConfig) {
    config
        .app_data(web::PayloadConfig::new(MAX_BODY_BYTES))
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
        .service(apps::finish_app)
        .service(apps::app_leases)
        .service(apps::why)
        .service(apps::project_rho)
        .service(events::stream)
        .service(events::poll)
        .service(market::submit_bid)
        .service(market::list_rounds)
        // Before `/v1/rounds/{round}`, which would take `current` for a round id.
        .service(market::current_round)
        .service(market::get_round)
        .service(market::release_lease)
        .service(market::cluster)
        .service(market::drain_gpu)
        .service(market::restore_gpu)
        .service(workers::register)
        .service(workers::heartbeat)
        .default_service(web::to(|| async {
            Err::<HttpResponse, _>(ApiError::not_found("no such endpoint; see /openapi.json"))
        }));
}

/// The largest request body taken.
const MAX_BODY_BYTES: usize = 1 << 20;

/// A JSON request body. Not JSON: 400 `malformed_json`. JSON that does not fit the schema, or a
/// string holding a NUL (which no stored text may hold): 422 `invalid_body`, naming the field.
#[derive(Debug)]
pub struct Json<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for Json<T> {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(request: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let content_type = request.content_type().to_ascii_lowercase();
        let is_json = content_type == "application/json" || content_type.ends_with("+json");
        let body = web::Bytes::from_request(request, payload);
        Box::pin(async move {
            if !is_json {
                return Err(ApiError::new(
                    ErrorCode::MalformedJson,
                    "send the body as JSON with `Content-Type: application/json`",
                ));
            }
            let bytes = body.await.map_err(|error| {
                let status = error.as_response_error().status_code();
                if status == actix_web::http::StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::new(ErrorCode::PayloadTooLarge, "the body is over 1 MiB")
                } else {
                    ApiError::new(ErrorCode::MalformedJson, error.to_string())
                }
            })?;
            let value: Value = serde_json::from_slice(&bytes).map_err(|error| {
                ApiError::new(ErrorCode::MalformedJson, format!("not JSON: {error}"))
            })?;
            if let Some(field) = field_with_nul(&value, "body") {
                return Err(ApiError::invalid_body(format!(
                    "{field} holds a NUL character (\\u0000); remove it"
                )));
            }
            serde_json::from_value(value)
                .map(Json)
                .map_err(|error| ApiError::invalid_body(format!("body: {error}")))
        })
    }
}

/// The path of the first string (or key) under `value` holding a NUL.
fn field_with_nul(value: &Value, path: &str) -> Option<String> {
    match value {
        Value::String(text) => text.contains('\0').then(|| path.to_owned()),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(index, item)| field_with_nul(item, &format!("{path}[{index}]"))),
        Value::Object(fields) => fields.iter().find_map(|(key, item)| {
            let field = format!("{path}.{key}");
            if key.contains('\0') {
                Some(field)
            } else {
                field_with_nul(item, &field)
            }
        }),
        _ => None,
    }
}

/// A page size: `given`, or `default` when absent; outside 1..=`max` it is refused.
fn page_limit(given: Option<i64>, default: i64, max: i64) -> Result<i64, ApiError> {
    match given.unwrap_or(default) {
        limit @ 1.. if limit <= max => Ok(limit),
        limit => Err(ApiError::new(
            ErrorCode::BadQuery,
            format!("limit must lie in 1..={max}, got {limit}"),
        )),
    }
}

/// The `Last-Event-ID` header (an event id to resume after), if sent.
fn last_event_id(request: &HttpRequest) -> Result<Option<i64>, ApiError> {
    let Some(value) = request.headers().get("last-event-id") else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|value| value.trim().parse::<i64>().ok())
        .filter(|id| *id >= 0)
        .map(Some)
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::BadLastEventId,
                "Last-Event-ID must be the id of an event received (a non-negative integer)",
            )
        })
}

fn path_error(error: PathError, _: &HttpRequest) -> actix_web::Error {
    ApiError::not_found(format!("bad path: {error}")).into()
}

fn query_error(error: QueryPayloadError, _: &HttpRequest) -> actix_web::Error {
    ApiError::new(ErrorCode::BadQuery, error.to_string()).into()
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
        apps::finish_app,
        apps::app_leases,
        apps::why,
        apps::project_rho,
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
        workers::register,
        workers::heartbeat,
        dashboard::me,
        dashboard::rho_history,
        dashboard::app_rounds,
        dashboard::fairness,
        dashboard::lease_timeline,
        dashboard::round_events,
    ),
    modifiers(&BearerAuth, &ErrorAnswers),
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

/// Documents every error answer an operation can give, as problem+json: what any caller can
/// meet (401; 503 when the database or the arbiter does not answer), what its path parameters
/// (404), query or header parameters (400) and body (400, 413, 422) can meet, and the
/// statuses its own handler declared.
#[derive(Debug)]
struct ErrorAnswers;

impl Modify for ErrorAnswers {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::ParameterIn;
        for item in openapi.paths.paths.values_mut() {
            let operations = [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.delete,
            ];
            for operation in operations.into_iter().flatten() {
                let parameters = operation.parameters.iter().flatten();
                let located = |place: ParameterIn| {
                    parameters
                        .clone()
                        .any(|parameter| parameter.parameter_in == place)
                };
                let body = operation.request_body.is_some();
                let mut statuses = vec![401, 503];
                if located(ParameterIn::Path) {
                    statuses.push(404);
                }
                if body || located(ParameterIn::Query) || located(ParameterIn::Header) {
                    statuses.push(400);
                }
                if body {
                    statuses.extend([413, 422]);
                }
                let responses = &mut operation.responses.responses;
                for status in statuses {
                    responses
                        .entry(status.to_string())
                        .or_insert_with(|| problem_response(status).into());
                }
                for (status, response) in responses.iter_mut() {
                    if let (utoipa::openapi::RefOr::T(response), Ok(400..)) =
                        (response, status.parse::<u16>())
                    {
                        *response = problem_response(status.parse().unwrap_or(500));
                    }
                }
            }
        }
    }
}

/// An error answer: problem+json, with the codes its status can carry.
fn problem_response(status: u16) -> utoipa::openapi::Response {
    let codes: Vec<String> = ErrorCode::ALL
        .iter()
        .filter(|code| code.status().as_u16() == status)
        .map(|code| format!("`{}`", code.as_str()))
        .collect();
    let content = utoipa::openapi::ContentBuilder::new()
        .schema(Some(utoipa::openapi::Ref::from_schema_name("Problem")))
        .build();
    utoipa::openapi::ResponseBuilder::new()
        .description(format!("A problem; `code` is one of {}", codes.join(", ")))
        .content("application/problem+json", content)
        .build()
}

async fn openapi() -> HttpResponse {
    HttpResponse::Ok().json(ApiDoc::openapi())
}
