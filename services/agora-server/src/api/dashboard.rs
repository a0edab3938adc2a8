//! The web dashboard: its read-only endpoints (who am I, an app's rho history and rounds, the
//! fairness summary, the lease timeline, the live rounds stream) and its page, embedded in the
//! binary from `web/` so `agora serve` needs no extra step, and sent gzipped with an entity
//! tag. `docs/dashboard.md` describes it.

use std::collections::HashMap;
use std::sync::LazyLock;

use actix_web::http::header;
use actix_web::middleware::Compress;
use actix_web::{get, web, HttpRequest, HttpResponse};
use agora_market::rho::RhoSpread;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use utoipa::{IntoParams, ToSchema};

use super::follow::{Feed, Follower};
use super::problem::{ApiError, ErrorCode, Problem};
use super::{owned_app, ApiState, Caller};
use crate::clock::to_datetime;
use crate::ids::{AppKey, RoundId, TenantId};
use crate::notices::Topic;
use crate::store::{
    AppRound, FairnessApp, FairnessHistory, FairnessInputs, GpuCounts, HistoryRange, RhoPoint,
    RoundSummary, Store, StoreError, TimelineLease, VisibleApp,
};

/// The longest lease timeline one request may ask for.
const MAX_WINDOW: chrono::TimeDelta = chrono::TimeDelta::days(7);

/// The dashboard's routes. Registered before `/v1/rounds/{round}`, which would otherwise take
/// `/v1/rounds/events` for a round id.
pub fn routes(config: &mut web::ServiceConfig) {
    config
        .service(dashboard_page)
        .service(dashboard_file)
        .service(me)
        .service(rho_history)
        .service(app_rounds)
        .service(fairness_history)
        .service(fairness)
        .service(lease_timeline)
        .service(round_events);
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Me {
    /// `admin` or `tenant`.
    pub role: String,
    /// The tenant's id and name; `None` for the admin.
    pub tenant_id: Option<TenantId>,
    pub tenant: Option<String>,
    /// The apps the caller may see: the tenant's own, or every app for the admin.
    pub apps: Vec<VisibleApp>,
}

/// Who the token belongs to, and the apps it may see (finished ones included).
#[utoipa::path(get, path = "/v1/me", responses((status = 200, body = Me),
    (status = 401, body = Problem)))]
#[get("/v1/me")]
pub async fn me(state: web::Data<ApiState>, caller: Caller) -> Result<HttpResponse, ApiError> {
    let tenant = match caller.tenant() {
        Some(tenant) => state.store.tenant_name(tenant).await?,
        None => None,
    };
    Ok(HttpResponse::Ok().json(Me {
        role: if caller == Caller::Admin {
            "admin"
        } else {
            "tenant"
        }
        .to_owned(),
        tenant_id: caller.tenant(),
        tenant,
        apps: state.store.visible_apps(caller).await?,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct HistoryQuery {
    /// The last this many rounds (default 500, at most 5000); not with `range`.
    pub limit: Option<i64>,
    /// The rounds of this range ending now (`15m`, `1h`, `24h` or `all`), downsampled to at
    /// most 240 points: the last round of each of 240 equal intervals. Not with `limit`.
    #[param(inline)]
    pub range: Option<HistoryRange>,
}

/// The app's rho at the start of the rounds it was active in, oldest first (`null`: it held
/// no GPU, so its finish time was unbounded): its last rounds, or a range downsampled to at
/// most 240 points.
#[utoipa::path(get, path = "/v1/apps/{app}/rho-history", params(("app" = i64, Path), HistoryQuery),
    responses((status = 200, body = Vec<RhoPoint>), (status = 400, body = Problem),
        (status = 404, body = Problem)))]
#[get("/v1/apps/{app}/rho-history")]
pub async fn rho_history(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
    query: web::Query<HistoryQuery>,
) -> Result<HttpResponse, ApiError> {
    let app = owned_app(&state, caller, *app).await?;
    let points = match (query.range, query.limit) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                ErrorCode::BadQuery,
                "give `range` or `limit`, not both",
            ))
        }
        (Some(range), None) => {
            let now = to_datetime(state.clock.now());
            state.store.rho_history_over(app, range, now).await?
        }
        (None, limit) => {
            let limit = super::bounded_limit(limit, 500, 5000)?;
            state.store.rho_history(app, limit).await?
        }
    };
    Ok(HttpResponse::Ok().json(points))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct FairnessHistoryQuery {
    /// The range ending now: `15m`, `1h`, `24h` or `all` (from the first round).
    #[param(inline)]
    pub range: HistoryRange,
}

/// The cluster's max rho, Jain's index and starving apps over a range, at most 240 points:
/// the range is cut into 240 equal intervals, each shown by its last round.
#[utoipa::path(get, path = "/v1/fairness/history", params(FairnessHistoryQuery),
    responses((status = 200, body = FairnessHistory), (status = 400, body = Problem)))]
#[get("/v1/fairness/history")]
pub async fn fairness_history(
    state: web::Data<ApiState>,
    _caller: Caller,
    query: web::Query<FairnessHistoryQuery>,
) -> Result<HttpResponse, ApiError> {
    let now = to_datetime(state.clock.now());
    let history = state.store.fairness_history(query.range, now).await?;
    Ok(HttpResponse::Ok().json(history))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AppRoundsQuery {
    /// Only rounds with a smaller id (the next page).
    pub before: Option<RoundId>,
    /// Only rounds with a larger id (what is new since a round already read).
    pub after: Option<RoundId>,
    /// At most this many (default 50, at most 500).
    pub limit: Option<i64>,
}

/// The rounds in which the app wanted GPUs (it had unmet demand), was offered some, or received
/// leftovers, newest first: its bid table, the proportional-fair choice, its hidden payment c_i,
/// the GPUs it got, and the round in one sentence (including why it was not offered GPUs).
#[utoipa::path(get, path = "/v1/apps/{app}/rounds", params(("app" = i64, Path), AppRoundsQuery),
    responses((status = 200, body = Vec<AppRound>), (status = 404, body = Problem)))]
#[get("/v1/apps/{app}/rounds")]
pub async fn app_rounds(
    state: web::Data<ApiState>,
    caller: Caller,
    app: web::Path<AppKey>,
    query: web::Query<AppRoundsQuery>,
) -> Result<HttpResponse, ApiError> {
    let app = owned_app(&state, caller, *app).await?;
    let limit = super::bounded_limit(query.limit, 50, 500)?;
    Ok(HttpResponse::Ok().json(
        state
            .store
            .app_rounds(app, query.before, query.after, limit)
            .await?,
    ))
}

/// How fair the market is now, from the latest round's standings of the apps still active.
#[derive(Debug, Serialize, ToSchema)]
pub struct FairnessSummary {
    /// The round the standings come from; `None` before the first round.
    pub round_id: Option<RoundId>,
    pub at: Option<DateTime<Utc>>,
    /// Worst rho first; other tenants' apps without id or name.
    pub apps: Vec<FairnessApp>,
    /// Apps holding no GPU: their rho is unbounded and left out of `max_rho` and `jains_index`.
    pub starving_apps: usize,
    /// The largest finite rho; `None` when no app has one.
    pub max_rho: Option<f64>,
    /// Jain's index over the finite rhos: 1 when all are equal, 1/n when one app has it all.
    pub jains_index: Option<f64>,
    pub gpus: GpuCounts,
    /// Held GPUs over all GPUs.
    pub utilisation: f64,
}

impl FairnessSummary {
    fn new(inputs: FairnessInputs) -> Self {
        let spread = RhoSpread::of(inputs.apps.iter().map(|app| app.rho));
        Self {
            round_id: inputs.round.map(|(id, _)| id),
            at: inputs.round.map(|(_, at)| at),
            starving_apps: spread.starving_apps,
            max_rho: spread.max_rho,
            jains_index: spread.jains_index,
            utilisation: if inputs.gpus.total == 0 {
                0.0
            } else {
                inputs.gpus.held as f64 / inputs.gpus.total as f64
            },
            gpus: inputs.gpus,
            apps: inputs.apps,
        }
    }
}

/// The fairness summary: rho of every active app (as of the latest round), max rho, Jain's
/// index, GPU utilisation.
#[utoipa::path(get, path = "/v1/fairness", responses((status = 200, body = FairnessSummary)))]
#[get("/v1/fairness")]
pub async fn fairness(
    state: web::Data<ApiState>,
    caller: Caller,
) -> Result<HttpResponse, ApiError> {
    let inputs = state.store.fairness_inputs(caller).await?;
    Ok(HttpResponse::Ok().json(FairnessSummary::new(inputs)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct TimelineQuery {
    /// Start of the window (RFC 3339).
    pub from: DateTime<Utc>,
    /// End of the window (RFC 3339), after `from` and at most 7 days later.
    pub to: DateTime<Utc>,
    /// At most this many leases (default 2000, at most 10000).
    pub limit: Option<i64>,
}

/// Every lease held at some time in the window, for a timeline over GPUs. Other tenants'
/// leases appear without lease or app id.
#[utoipa::path(get, path = "/v1/leases", params(TimelineQuery),
    responses((status = 200, body = Vec<TimelineLease>), (status = 400, body = Problem)))]
#[get("/v1/leases")]
pub async fn lease_timeline(
    state: web::Data<ApiState>,
    caller: Caller,
    query: web::Query<TimelineQuery>,
) -> Result<HttpResponse, ApiError> {
    if query.to <= query.from || query.to - query.from > MAX_WINDOW {
        return Err(ApiError::bad_request(
            ErrorCode::BadWindow,
            "`to` must be after `from` and at most 7 days later",
        ));
    }
    let limit = super::bounded_limit(query.limit, 2000, 10_000)?;
    let leases = state
        .store
        .lease_timeline(query.from, query.to, limit, caller)
        .await?;
    Ok(HttpResponse::Ok().json(leases))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct RoundStreamQuery {
    /// Resume after this round id (the `Last-Event-ID` header wins when both are sent).
    pub after: Option<i64>,
}

/// Server-sent events, one per decided round (closed or abandoned), oldest first: `event:
/// round`, `id:` the round id, `data:` its summary as in `/v1/rounds`.
#[utoipa::path(get, path = "/v1/rounds/events", params(RoundStreamQuery,
    ("Last-Event-ID" = Option<i64>, Header)),
    responses((status = 200, content_type = "text/event-stream", body = String,
        example = json!("id: 42\nevent: round\ndata: {\"round_id\":42,\"status\":\"closed\",...}\n\n"))))]
#[get("/v1/rounds/events")]
pub async fn round_events(
    state: web::Data<ApiState>,
    _caller: Caller,
    query: web::Query<RoundStreamQuery>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let last_event_id = super::last_event_id(&request)?;
    // Only the leader's notices tell a follower of new rounds.
    state.require_leader().await?;
    let after = last_event_id.or(query.after).unwrap_or(0);
    let feed = DecidedRounds(state.store.clone());
    Ok(Follower::new(feed, state.notices.follow(Topic::Rounds), after).into_event_stream())
}

/// Decided rounds, from the `round_summary` view.
struct DecidedRounds(Store);

impl Feed for DecidedRounds {
    type Item = RoundSummary;

    async fn after(&self, cursor: i64, limit: i64) -> Result<Vec<RoundSummary>, StoreError> {
        self.0.decided_rounds_after(RoundId(cursor), limit).await
    }

    fn id(round: &RoundSummary) -> i64 {
        round.round_id.0
    }

    fn frame(round: &RoundSummary) -> String {
        let data = serde_json::to_string(round).unwrap_or_default();
        format!("event: round\ndata: {data}")
    }
}

/// One file of `web/`, compiled into the binary.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! web_file {
    ($path:literal, $content_type:literal) => {
        Asset {
            path: $path,
            content_type: $content_type,
            body: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../web/", $path)),
        }
    };
}

const INDEX: Asset = web_file!("index.html", "text/html; charset=utf-8");
const ASSETS: &[Asset] = &[
    web_file!("app.css", "text/css; charset=utf-8"),
    web_file!("js/main.js", "text/javascript; charset=utf-8"),
    web_file!("js/api.js", "text/javascript; charset=utf-8"),
    web_file!("js/ui.js", "text/javascript; charset=utf-8"),
    web_file!("js/charts.js", "text/javascript; charset=utf-8"),
    web_file!("js/apps.js", "text/javascript; charset=utf-8"),
    web_file!("js/cluster.js", "text/javascript; charset=utf-8"),
    web_file!("js/rounds.js", "text/javascript; charset=utf-8"),
    web_file!("js/fairness.js", "text/javascript; charset=utf-8"),
    web_file!("js/history.js", "text/javascript; charset=utf-8"),
    web_file!("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    web_file!("vendor/uPlot.min.css", "text/css; charset=utf-8"),
];

/// Scripts and styles only from this server; the page reads the API with `fetch` only.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' data:; \
     style-src 'self' 'unsafe-inline'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'";

/// Each file's entity tag, a digest of its bytes: weak, because the same file also goes out
/// gzipped.
static ETAGS: LazyLock<HashMap<&'static str, String>> = LazyLock::new(|| {
    std::iter::once(&INDEX)
        .chain(ASSETS)
        .map(|file| {
            let digest = Sha256::digest(file.body);
            (file.path, format!("W/\"{}\"", hex::encode(&digest[..16])))
        })
        .collect()
});

/// The file, or 304 Not Modified when the browser's copy has its entity tag. `no-cache`: the
/// browser asks again each time (file names carry no version), and a 304 costs no body.
fn serve(file: &Asset, request: &HttpRequest) -> HttpResponse {
    let etag = ETAGS.get(file.path).map_or("", String::as_str);
    let unchanged = request
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|tags| {
            tags.split(',')
                .any(|tag| tag.trim().trim_start_matches("W/") == etag.trim_start_matches("W/"))
        });
    let mut response = if unchanged {
        HttpResponse::NotModified()
    } else {
        HttpResponse::Ok()
    };
    response
        .insert_header((header::ETAG, etag))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY));
    if unchanged {
        response.finish()
    } else {
        response.content_type(file.content_type).body(file.body)
    }
}

/// The dashboard page.
#[get("/", wrap = "Compress::default()")]
async fn dashboard_page(request: HttpRequest) -> HttpResponse {
    serve(&INDEX, &request)
}

/// The dashboard's scripts and styles.
#[get("/static/{path:.*}", wrap = "Compress::default()")]
async fn dashboard_file(
    path: web::Path<String>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    ASSETS
        .iter()
        .find(|file| file.path == path.as_str())
        .map(|file| serve(file, &request))
        .ok_or_else(|| ApiError::not_found(format!("no dashboard file {path}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn standing(rho: Option<f64>, position: i32) -> FairnessApp {
        FairnessApp {
            app_id: Some(AppKey(i64::from(position))),
            name: None,
            rho,
            position,
        }
    }

    #[test]
    fn starving_apps_are_counted_but_left_out_of_max_rho_and_jains_index() {
        let summary = FairnessSummary::new(FairnessInputs {
            round: None,
            apps: vec![
                standing(None, 0),
                standing(Some(3.0), 1),
                standing(Some(1.0), 2),
            ],
            gpus: GpuCounts {
                total: 8,
                healthy: 7,
                held: 6,
            },
        });
        assert_eq!(summary.starving_apps, 1);
        assert_eq!(summary.max_rho, Some(3.0));
        // (1 + 3)^2 / (2 (1^2 + 3^2)) = 0.8
        let jain = summary.jains_index.expect("two finite rhos");
        assert!((jain - 0.8).abs() < 1e-12, "{jain}");
        assert_eq!(summary.utilisation, 0.75);
    }

    #[test]
    fn an_empty_market_has_no_max_rho_nor_index() {
        let summary = FairnessSummary::new(FairnessInputs {
            round: None,
            apps: vec![standing(None, 0)],
            gpus: GpuCounts {
                total: 0,
                healthy: 0,
                held: 0,
            },
        });
        assert_eq!((summary.max_rho, summary.jains_index), (None, None));
        assert_eq!(summary.utilisation, 0.0);
    }
}
