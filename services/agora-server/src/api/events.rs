//! What an app is told (offers, round results, lease changes, revocation notices), from the
//! `app_events` table: as a server-sent event stream that resumes from `Last-Event-ID`, or by
//! long-polling. Both read the database, so nothing is missed across reconnects or restarts.

use std::time::Duration;

use actix_web::{get, web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::follow::{Feed, Follower};
use super::problem::ApiError;
use super::{owned_app, ApiState, Caller};
use crate::ids::AppKey;
use crate::notices::Topic;
use crate::store::{AppEventRow, Store, StoreError};

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct StreamQuery {
    /// Resume after this event id (the `Last-Event-ID` header wins when both are sent).
    pub after: Option<i64>,
}

/// Server-sent events for one app: `event:` is the kind (`offer`, `round_result`,
/// `lease_granted`, `lease_ended`, `revocation_notice`), `data:` its JSON, `id:` the event id.
#[utoipa::path(get, path = "/v1/apps/{app}/events", params(("app" = i64, Path), StreamQuery,
    ("Last-Event-ID" = Option<i64>, Header)),
    responses((status = 200, content_type = "text/event-stream", body = String,
        example = json!("id: 12\nevent: offer\ndata: {\"round\":4,\"gpus\":[...]}\n\n"))))]
#[get("/v1/apps/{app}/events")]
pub async fn stream(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
    query: web::Query<StreamQuery>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let app = owned_app(&state, caller, *app).await?;
    // Only the leader's notices tell a follower of new events.
    state.require_leader().await?;
    let last_event_id = super::last_event_id(&request)?;
    let after = last_event_id.or(query.after).unwrap_or(0);
    Ok(follow_app(&state, app, after).into_event_stream())
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct PollQuery {
    /// Events after this id.
    pub after: Option<i64>,
    /// How long to wait for a new event, in milliseconds (default 25000, at most 60000).
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EventPage {
    pub events: Vec<AppEventRow>,
    /// Pass as `after` next time.
    pub last_id: i64,
}

/// Long-poll for an app's events: answers at once if there are events after `after`, otherwise
/// when one arrives or the timeout passes (with an empty list).
#[utoipa::path(get, path = "/v1/apps/{app}/events/poll", params(("app" = i64, Path), PollQuery),
    responses((status = 200, body = EventPage)))]
#[get("/v1/apps/{app}/events/poll")]
pub async fn poll(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
    query: web::Query<PollQuery>,
) -> Result<HttpResponse, ApiError> {
    let app = owned_app(&state, caller, *app).await?;
    // Only the leader's notices tell a follower of new events.
    state.require_leader().await?;
    let after = query.after.unwrap_or(0);
    let timeout_ms = match query.timeout_ms {
        None => 25_000,
        Some(timeout_ms) if timeout_ms <= 60_000 => timeout_ms,
        Some(timeout_ms) => {
            return Err(ApiError::bad_request(
                super::problem::ErrorCode::BadQuery,
                format!("timeout_ms must be at most 60000, got {timeout_ms}"),
            ))
        }
    };
    let timeout = Duration::from_millis(timeout_ms);
    let events = follow_app(&state, app, after).wait(timeout).await?;
    Ok(HttpResponse::Ok().json(EventPage {
        last_id: events.last().map_or(after, |event| event.id),
        events,
    }))
}

/// Follows `app`'s events from after event `after`.
fn follow_app(state: &ApiState, app: AppKey, after: i64) -> Follower<AppEvents> {
    let feed = AppEvents {
        store: state.store.clone(),
        app,
    };
    Follower::new(feed, state.notices.follow(Topic::App(app)), after)
}

/// One app's events, from `app_events`.
struct AppEvents {
    store: Store,
    app: AppKey,
}

impl Feed for AppEvents {
    type Item = AppEventRow;

    async fn after(&self, cursor: i64, limit: i64) -> Result<Vec<AppEventRow>, StoreError> {
        self.store.events_after(self.app, cursor, limit).await
    }

    fn id(event: &AppEventRow) -> i64 {
        event.id
    }

    fn frame(event: &AppEventRow) -> String {
        format!("event: {}\ndata: {}", event.kind, event.payload)
    }
}
