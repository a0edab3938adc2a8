//! RFC 9457 problem details: every error answer is `application/problem+json` with a stable
//! `code` that clients can branch on. [`ErrorCode`] is the one list of codes, each with its
//! HTTP status; `docs/api.md`'s table is tested against it.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::actors::ArbiterError;
use crate::store::StoreError;

/// Declares [`ErrorCode`]: each code with its status and what it means.
macro_rules! error_codes {
    ($($code:ident = $status:ident, $name:literal: $meaning:literal;)*) => {
        /// Every machine-readable error code of the API.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode {
            $(#[doc = $meaning] $code,)*
        }

        impl ErrorCode {
            pub const ALL: &[ErrorCode] = &[$(ErrorCode::$code,)*];

            pub fn status(self) -> StatusCode {
                match self {
                    $(ErrorCode::$code => StatusCode::$status,)*
                }
            }

            /// The code as clients see it.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$code => $name,)*
                }
            }
        }
    };
}

error_codes! {
    MalformedJson = BAD_REQUEST, "malformed_json": "The body is not JSON (or not sent as `application/json`).";
    BadQuery = BAD_REQUEST, "bad_query": "A query parameter is missing, unknown or out of range.";
    BadWindow = BAD_REQUEST, "bad_window": "`to` is not after `from`, or the window is over 7 days.";
    BadIdempotencyKey = BAD_REQUEST, "bad_idempotency_key": "`Idempotency-Key` is not 1 to 200 visible ASCII characters.";
    BadLastEventId = BAD_REQUEST, "bad_last_event_id": "`Last-Event-ID` is not an event id.";
    TenantRequired = BAD_REQUEST, "tenant_required": "The admin token was sent where a tenant acts.";
    Unauthorized = UNAUTHORIZED, "unauthorized": "No token, or an unknown one.";
    AdminOnly = FORBIDDEN, "admin_only": "Only the admin token may do this.";
    WorkersDisabled = FORBIDDEN, "workers_disabled": "This arbiter takes no GPU hosts.";
    NotFound = NOT_FOUND, "not_found": "No such endpoint, or no such resource visible to the caller (another tenant's app is not found either).";
    UnknownRound = NOT_FOUND, "unknown_round": "The round does not exist yet.";
    UnknownGpu = NOT_FOUND, "unknown_gpu": "The GPU is not in the cluster.";
    UnknownHost = NOT_FOUND, "unknown_host": "The GPU host is not registered.";
    DuplicateTenant = CONFLICT, "duplicate_tenant": "A tenant with this name exists.";
    DuplicateAppName = CONFLICT, "duplicate_app_name": "The tenant has an app with this name.";
    AppNotActive = CONFLICT, "app_not_active": "The app finished.";
    RoundClosed = CONFLICT, "round_closed": "The round no longer takes bids.";
    NotABidder = CONFLICT, "not_a_bidder": "The app was not offered GPUs in this round.";
    AlreadyBid = CONFLICT, "already_bid": "The app already bid in this round.";
    LeaseNotActive = CONFLICT, "lease_not_active": "The lease ended, or the caller has no such lease.";
    PayloadTooLarge = PAYLOAD_TOO_LARGE, "payload_too_large": "The body is over 1 MiB.";
    InvalidBody = UNPROCESSABLE_ENTITY, "invalid_body": "Well-formed JSON that does not fit the request's schema (the detail names the field).";
    InvalidTenant = UNPROCESSABLE_ENTITY, "invalid_tenant": "The tenant's name is empty, too long or holds control or bidirectional-override characters.";
    InvalidApp = UNPROCESSABLE_ENTITY, "invalid_app": "The app, its jobs or its enforcement are invalid.";
    InvalidProgress = UNPROCESSABLE_ENTITY, "invalid_progress": "The progress report does not fit the app.";
    InvalidRho = UNPROCESSABLE_ENTITY, "invalid_rho": "A rho is not finite and positive.";
    InvalidBid = UNPROCESSABLE_ENTITY, "invalid_bid": "The bid does not fit the offer.";
    BidTableTooLarge = UNPROCESSABLE_ENTITY, "bid_table_too_large": "The bid table has too many entries.";
    IdempotencyKeyReused = UNPROCESSABLE_ENTITY, "idempotency_key_reused": "The `Idempotency-Key` was used for a different bid.";
    InvalidProjection = UNPROCESSABLE_ENTITY, "invalid_projection": "The GPUs of a rho projection are not the cluster's, or named twice.";
    InvalidRegistration = UNPROCESSABLE_ENTITY, "invalid_registration": "The GPU host's registration is invalid.";
    InvalidHeartbeat = UNPROCESSABLE_ENTITY, "invalid_heartbeat": "The GPU host's heartbeat is invalid.";
    MetricsUnavailable = INTERNAL_SERVER_ERROR, "metrics_unavailable": "The metrics could not be encoded.";
    StoreUnavailable = SERVICE_UNAVAILABLE, "store_unavailable": "The database did not answer; retry shortly.";
    ArbiterUnavailable = SERVICE_UNAVAILABLE, "arbiter_unavailable": "The arbiter did not answer; retry shortly.";
    ArbiterFailure = SERVICE_UNAVAILABLE, "arbiter_failure": "The arbiter could not complete the request; retry shortly.";
}

/// An error answer (RFC 9457), served as `application/problem+json`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// `/problems/{code}`.
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Stable machine-readable code.
    pub code: ErrorCode,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{detail}")]
pub struct ApiError {
    pub code: ErrorCode,
    pub detail: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self {
            code,
            detail: detail.into(),
        }
    }

    pub fn unauthorized() -> Self {
        Self::new(
            ErrorCode::Unauthorized,
            "send `Authorization: Bearer <token>` with a tenant token (or the admin token)",
        )
    }

    pub fn admin_only() -> Self {
        Self::new(ErrorCode::AdminOnly, "only the admin token may do this")
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, what)
    }

    /// A body field that does not fit its schema.
    pub fn invalid_body(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidBody, detail)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.code.status()
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.code.status();
        let problem = Problem {
            problem_type: format!("/problems/{}", self.code.as_str()),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: self.detail.clone(),
            code: self.code,
        };
        HttpResponse::build(status)
            .content_type("application/problem+json")
            .json(problem)
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        tracing::error!(%error, "store error");
        Self::new(
            ErrorCode::StoreUnavailable,
            "the database could not complete the request; retry shortly",
        )
    }
}

impl From<actix::MailboxError> for ApiError {
    fn from(error: actix::MailboxError) -> Self {
        tracing::error!(%error, "arbiter unreachable");
        Self::new(
            ErrorCode::ArbiterUnavailable,
            "the arbiter is not answering; retry shortly",
        )
    }
}

impl From<ArbiterError> for ApiError {
    fn from(error: ArbiterError) -> Self {
        use ArbiterError as E;
        let code = match &error {
            E::AppNotActive(_) => ErrorCode::AppNotActive,
            // Another tenant's app is as invisible as a missing one.
            E::ForeignApp(app) => return ApiError::not_found(format!("app {app} does not exist")),
            E::DuplicateAppName(_) => ErrorCode::DuplicateAppName,
            E::InvalidApp(_) => ErrorCode::InvalidApp,
            E::Progress(_) => ErrorCode::InvalidProgress,
            E::UnknownRound(_) => ErrorCode::UnknownRound,
            E::RoundClosed(_) => ErrorCode::RoundClosed,
            E::NotABidder { .. } => ErrorCode::NotABidder,
            E::TableTooLarge { .. } => ErrorCode::BidTableTooLarge,
            E::InvalidBid(_) => ErrorCode::InvalidBid,
            E::AlreadyBid { .. } => ErrorCode::AlreadyBid,
            E::IdempotencyKeyReused { .. } => ErrorCode::IdempotencyKeyReused,
            E::LeaseNotActive(_) => ErrorCode::LeaseNotActive,
            E::UnknownGpu(_) => ErrorCode::UnknownGpu,
            E::UnknownHost(_) => ErrorCode::UnknownHost,
            E::InvalidRegistration(_) => ErrorCode::InvalidRegistration,
            E::InvalidHeartbeat(_) => ErrorCode::InvalidHeartbeat,
            E::InvalidProjection(_) => ErrorCode::InvalidProjection,
            // The cause (maybe the database's own text) goes to the log, never to the client.
            E::Store(_) | E::Internal(_) => {
                tracing::error!(%error, "arbiter failure");
                return Self::new(
                    ErrorCode::ArbiterFailure,
                    "the arbiter could not complete the request; retry shortly",
                );
            }
        };
        Self::new(code, error.to_string())
    }
}
