//! RFC 9457 problem details: every error answer is `application/problem+json` with a stable
//! `code` that clients can branch on (listed in `docs/api.md`).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::actors::ArbiterError;
use crate::store::StoreError;

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// `/problems/{code}`.
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Stable machine-readable code.
    pub code: String,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{detail}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            status,
            code,
            detail: detail.into(),
        }
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "send `Authorization: Bearer <token>` with a tenant token (or the admin token)",
        )
    }

    pub fn admin_only() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "admin_only",
            "only the admin token may do this",
        )
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", what)
    }

    pub fn bad_request(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, detail)
    }

    pub fn unprocessable(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, detail)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let problem = Problem {
            problem_type: format!("/problems/{}", self.code),
            title: self.status.canonical_reason().unwrap_or("Error").to_owned(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            code: self.code.to_owned(),
        };
        HttpResponse::build(self.status)
            .content_type("application/problem+json")
            .json(problem)
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        tracing::error!(%error, "store error");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the database could not complete the request; retry shortly",
        )
    }
}

impl From<actix::MailboxError> for ApiError {
    fn from(error: actix::MailboxError) -> Self {
        tracing::error!(%error, "arbiter unreachable");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "arbiter_unavailable",
            "the arbiter is not answering; retry shortly",
        )
    }
}

impl From<ArbiterError> for ApiError {
    fn from(error: ArbiterError) -> Self {
        use ArbiterError as E;
        let (status, code) = match &error {
            E::AppNotActive(_) => (StatusCode::CONFLICT, "app_not_active"),
            E::ForeignApp(_) => (StatusCode::FORBIDDEN, "foreign_app"),
            E::DuplicateAppName(_) => (StatusCode::CONFLICT, "duplicate_app_name"),
            E::InvalidApp(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_app"),
            E::Progress(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_progress"),
            E::UnknownRound(_) => (StatusCode::NOT_FOUND, "unknown_round"),
            E::RoundClosed(_) => (StatusCode::CONFLICT, "round_closed"),
            E::NotABidder { .. } => (StatusCode::CONFLICT, "not_a_bidder"),
            E::TableTooLarge { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "bid_table_too_large"),
            E::InvalidBid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_bid"),
            E::AlreadyBid { .. } => (StatusCode::CONFLICT, "already_bid"),
            E::LeaseNotActive(_) => (StatusCode::CONFLICT, "lease_not_active"),
            E::UnknownGpu(_) => (StatusCode::NOT_FOUND, "unknown_gpu"),
            E::UnknownHost(_) => (StatusCode::NOT_FOUND, "unknown_host"),
            E::InvalidRegistration(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_registration"),
            E::InvalidHeartbeat(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_heartbeat"),
            E::Store(_) | E::Internal(_) => {
                tracing::error!(%error, "arbiter failure");
                (StatusCode::SERVICE_UNAVAILABLE, "arbiter_failure")
            }
        };
        Self::new(status, code, error.to_string())
    }
}
