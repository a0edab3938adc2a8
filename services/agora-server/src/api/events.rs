//! What an app is told (offers, round results, lease changes, revocation notices), from the
//! `app_events` table: as a server-sent event stream that resumes from `Last-Event-ID`, or by
//! long-polling. Both read the database, so nothing is missed across reconnects or restarts.

use std::time::Duration;

use actix_web::web::Bytes;
use actix_web::{get, web, HttpRequest, HttpResponse};
use futures_util::stream as streams;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use utoipa::{IntoParams, ToSchema};

use super::problem::ApiError;
use super::{owned_app, ApiState, Caller};
use crate::store::{AppEventRow, Store};

const PAGE: i64 = 100;
const KEEPALIVE: Duration = Duration::from_secs(15);

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
    app: web::Path<i64>,
    query: web::Query<StreamQuery>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let app = owned_app(&state, caller, *app).await?;
    // Only the leader's notices tell a follower of new events.
    state.require_leader().await?;
    let last_event_id = super::last_event_id(&request)?;
    let after = last_event_id.or(query.after).unwrap_or(0);
    let follower = Follower {
        store: state.store.clone(),
        notices: state.notices.follow(app),
        app,
        after,
    };
    let events = streams::unfold(follower, |mut follower| async move {
        let chunk = follower.next_chunk().await;
        Some((chunk, follower))
    });
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .streaming(events))
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
    app: web::Path<i64>,
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
    let mut follower = Follower {
        store: state.store.clone(),
        notices: state.notices.follow(app),
        app,
        after,
    };
    let events = follower.wait_for_events(timeout).await?;
    Ok(HttpResponse::Ok().json(EventPage {
        last_id: events.last().map_or(after, |event| event.id),
        events,
    }))
}

/// Follows one app's events: reads the table, and waits on the arbiter's notices in between.
struct Follower {
    store: Store,
    notices: watch::Receiver<()>,
    app: i64,
    after: i64,
}

impl Follower {
    /// Events after the cursor, waiting up to `timeout` for the first. The follower was
    /// subscribed before the first read, so an event committed in between still wakes the wait.
    async fn wait_for_events(&mut self, timeout: Duration) -> Result<Vec<AppEventRow>, ApiError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let events = self.store.events_after(self.app, self.after, PAGE).await?;
            if let Some(last) = events.last() {
                self.after = last.id;
                return Ok(events);
            }
            if !self.wait_for_notice(deadline).await {
                return Ok(Vec::new());
            }
        }
    }

    /// False when the deadline passed without a notice for this app.
    async fn wait_for_notice(&mut self, deadline: tokio::time::Instant) -> bool {
        match tokio::time::timeout_at(deadline, self.notices.changed()).await {
            Ok(Ok(())) => true,
            Err(_) => false,
            // The announcer is gone (the service is stopping): nothing more will come.
            Ok(Err(_)) => {
                tokio::time::sleep_until(deadline).await;
                false
            }
        }
    }

    /// The next SSE chunk: events, a keep-alive comment, or an error comment.
    async fn next_chunk(&mut self) -> Result<Bytes, actix_web::Error> {
        match self.wait_for_events(KEEPALIVE).await {
            Ok(events) if events.is_empty() => Ok(Bytes::from_static(b": keep-alive\n\n")),
            Ok(events) => Ok(Bytes::from(
                events.iter().map(sse_frame).collect::<String>(),
            )),
            Err(error) => Ok(Bytes::from(format!(": {error}\n\n"))),
        }
    }
}

fn sse_frame(event: &AppEventRow) -> String {
    format!(
        "id: {}\nevent: {}\ndata: {}\n\n",
        event.id, event.kind, event.payload
    )
}
