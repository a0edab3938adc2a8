//! RFC 9457 problem details: every error answer is `application/problem+json` with a stable
//! `code` that clients can branch on (listed in `docs/api.md`).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::ToSchema;

use crate::actors::ArbiterError;
use crate::store::StoreError;

/// Declares [`ErrorCode`]: every stable machine code the API answers with, each with the
/// HTTP statuses it comes with. `docs/api.md`'s table of codes is tested against it
/// (`ErrorCode::ALL`), and the OpenAPI document lists the codes in `Problem`'s schema.
macro_rules! error_codes {
    ($($(#[doc = $doc:literal])* $variant:ident = $code:literal, [$($status:literal),+];)*) => {
        /// A stable, machine-readable error code (`code` and `type` of a problem).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, ToSchema)]
        #[serde(rename_all = "snake_case")]
        pub enum ErrorCode {
            // The variants' comments stay in the source: utoipa would turn documented variants
            // into a `oneOf` instead of a plain list of codes.
            $($variant,)*
        }

        impl ErrorCode {
            /// Every code, in the order of the table in `docs/api.md`.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            /// The HTTP statuses this code is answered with.
            pub fn statuses(self) -> &'static [u16] {
                match self {
                    $(ErrorCode::$variant => &[$($status),+],)*
                }
            }
        }
    };
}

error_codes! {
    /// The body is not JSON (or not sent as JSON), or is over 1 MiB (413).
    MalformedJson = "malformed_json", [400, 413];
    /// A query parameter is missing, unknown, malformed or out of range.
    BadQuery = "bad_query", [400];
    /// `from`/`to` of a time window are out of order or too far apart.
    BadWindow = "bad_window", [400];
    /// `Last-Event-ID` is not an event id (a non-negative integer).
    BadLastEventId = "bad_last_event_id", [400];
    /// `Idempotency-Key` is empty, too long, or not visible ASCII.
    BadIdempotencyKey = "bad_idempotency_key", [400];
    /// The request acts for a tenant; the admin token was sent.
    TenantRequired = "tenant_required", [400];
    /// No token, or an unknown one.
    Unauthorized = "unauthorized", [401];
    /// Only the admin token may do this.
    AdminOnly = "admin_only", [403];
    /// The worker endpoints are closed (a simulated fleet).
    WorkersDisabled = "workers_disabled", [403];
    /// No such thing for this caller (another tenant's app is not found either).
    NotFound = "not_found", [404];
    UnknownRound = "unknown_round", [404];
    UnknownGpu = "unknown_gpu", [404];
    UnknownHost = "unknown_host", [404];
    DuplicateTenant = "duplicate_tenant", [409];
    DuplicateAppName = "duplicate_app_name", [409];
    AppNotActive = "app_not_active", [409];
    RoundClosed = "round_closed", [409];
    NotABidder = "not_a_bidder", [409];
    AlreadyBid = "already_bid", [409];
    LeaseNotActive = "lease_not_active", [409];
    /// Well-formed JSON that is not what the endpoint takes: a missing or unknown field, a
    /// wrong type or variant.
    InvalidBody = "invalid_body", [422];
    /// A string holding a NUL character.
    InvalidText = "invalid_text", [422];
    /// The `Idempotency-Key` was used before with a different request.
    IdempotencyKeyReused = "idempotency_key_reused", [422];
    InvalidTenant = "invalid_tenant", [422];
    InvalidApp = "invalid_app", [422];
    InvalidProgress = "invalid_progress", [422];
    /// A throughput report for a GPU type the cluster does not have, or with a speed that is
    /// not finite and > 0.
    InvalidThroughput = "invalid_throughput", [422];
    /// A speed change for a job the app does not have or that was stopped, at an iteration
    /// behind the job's progress or not below its total, or with a time that is not a finite
    /// number of seconds >= 1e-6.
    InvalidSpeedChange = "invalid_speed_change", [422];
    /// A projected allocation with a GPU that is not in the cluster, or one listed twice.
    InvalidAllocation = "invalid_allocation", [422];
    InvalidRho = "invalid_rho", [422];
    InvalidBid = "invalid_bid", [422];
    BidTableTooLarge = "bid_table_too_large", [422];
    InvalidRegistration = "invalid_registration", [422];
    InvalidHeartbeat = "invalid_heartbeat", [422];
    /// The database did not answer; retry shortly.
    StoreUnavailable = "store_unavailable", [503];
    /// The arbiter did not answer; retry shortly.
    ArbiterUnavailable = "arbiter_unavailable", [503];
    /// The arbiter could not complete the request; retry shortly.
    ArbiterFailure = "arbiter_failure", [503];
    /// This arbiter is a standby: send the request to the leader (`leader`), after
    /// `Retry-After` seconds when it names none yet.
    NotLeader = "not_leader", [503];
    /// The metrics could not be gathered.
    MetricsUnavailable = "metrics_unavailable", [500];
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// An RFC 9457 problem: the body of every error answer (`application/problem+json`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Problem {
    /// `/problems/{code}`.
    #[serde(rename = "type")]
    pub problem_type: String,
    /// The status's reason phrase.
    pub title: String,
    /// The HTTP status.
    pub status: u16,
    /// What was wrong, in words, naming the field or parameter.
    pub detail: String,
    /// Stable machine-readable code.
    pub code: ErrorCode,
    /// With `not_leader` only: the leader's URL (its `advertise_url`), where to send the
    /// request instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

#[derive(Debug, Clone, thiserror::Error)]
#[error("{detail}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub detail: String,
    /// The leader's URL, for `not_leader`.
    pub leader: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: ErrorCode, detail: impl Into<String>) -> Self {
        debug_assert!(
            code.statuses().contains(&status.as_u16()),
            "{code} is not documented with {status}"
        );
        Self {
            status,
            code,
            detail: detail.into(),
            leader: None,
        }
    }

    /// `code` with its (first) status.
    pub fn of(code: ErrorCode, detail: impl Into<String>) -> Self {
        let status =
            StatusCode::from_u16(code.statuses()[0]).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self::new(status, code, detail)
    }

    pub fn unauthorized() -> Self {
        Self::of(
            ErrorCode::Unauthorized,
            "send `Authorization: Bearer <token>` with a tenant token (or the admin token)",
        )
    }

    pub fn admin_only() -> Self {
        Self::of(ErrorCode::AdminOnly, "only the admin token may do this")
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::of(ErrorCode::NotFound, what)
    }

    /// A standby's answer to what only the leader does, naming the leader when one is known.
    pub fn not_leader(leader: Option<String>) -> Self {
        let detail = match &leader {
            Some(url) => {
                format!("this arbiter is a standby; send the request to the leader at {url}")
            }
            None => {
                "this arbiter is a standby and no leader is known yet; retry shortly".to_owned()
            }
        };
        Self {
            leader,
            ..Self::of(ErrorCode::NotLeader, detail)
        }
    }

    pub fn bad_request(code: ErrorCode, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, detail)
    }

    pub fn unprocessable(code: ErrorCode, detail: impl Into<String>) -> Self {
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
            code: self.code,
            leader: self.leader.clone(),
        };
        let mut answer = HttpResponse::build(self.status);
        if self.code == ErrorCode::NotLeader {
            // A takeover takes about a second: long enough for a standby to become the leader.
            answer.insert_header(("Retry-After", "1"));
        }
        answer
            .content_type("application/problem+json")
            .json(problem)
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        tracing::error!(%error, "store error");
        Self::of(
            ErrorCode::StoreUnavailable,
            "the database could not complete the request; retry shortly",
        )
    }
}

impl From<actix::MailboxError> for ApiError {
    fn from(error: actix::MailboxError) -> Self {
        tracing::error!(%error, "arbiter unreachable");
        Self::of(
            ErrorCode::ArbiterUnavailable,
            "the arbiter is not answering; retry shortly",
        )
    }
}

impl From<ArbiterError> for ApiError {
    fn from(error: ArbiterError) -> Self {
        use ArbiterError as E;
        use ErrorCode as C;
        let code = match &error {
            E::AppNotActive(_) => C::AppNotActive,
            // Another tenant's app is answered as if it did not exist: ids cannot be probed.
            E::ForeignApp(app) => return Self::not_found(format!("app {app} does not exist")),
            E::DuplicateAppName(_) => C::DuplicateAppName,
            E::InvalidApp(_) => C::InvalidApp,
            E::Progress(_) => C::InvalidProgress,
            E::Throughput(_) => C::InvalidThroughput,
            E::SpeedChange(_) => C::InvalidSpeedChange,
            E::InvalidAllocation(_) => C::InvalidAllocation,
            E::UnknownRound(_) => C::UnknownRound,
            E::RoundClosed(_) => C::RoundClosed,
            E::NotABidder { .. } => C::NotABidder,
            E::TableTooLarge { .. } => C::BidTableTooLarge,
            E::InvalidBid(_) => C::InvalidBid,
            E::AlreadyBid { .. } => C::AlreadyBid,
            E::IdempotencyKeyReused { .. } => C::IdempotencyKeyReused,
            E::LeaseNotActive(_) => C::LeaseNotActive,
            E::UnknownGpu(_) => C::UnknownGpu,
            E::UnknownHost(_) => C::UnknownHost,
            E::InvalidRegistration(_) => C::InvalidRegistration,
            E::InvalidHeartbeat(_) => C::InvalidHeartbeat,
            E::Store(_) | E::Internal(_) => {
                // The reason stays in the log: no database or internal text reaches a client.
                tracing::error!(%error, "arbiter failure");
                return Self::of(
                    C::ArbiterFailure,
                    "the arbiter could not complete the request; retry shortly",
                );
            }
        };
        Self::of(code, error.to_string())
    }
}
