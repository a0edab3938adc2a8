//! Telemetry of the live service: `GET /metrics` after real rounds, and the spans the rounds
//! and requests produce. Metrics and the tracing subscriber are process-wide, so one scenario
//! runs once per process and each test checks what it observed.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::Duration;

use agora_server::telemetry::{install, Exporters, LogSettings, Telemetry};
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry::Value;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData, SpanExporter};
use serde_json::{json, Value as Json};
use support::{active, config, fresh_database, serve, start_clock, Service};
use tokio::sync::watch;

/// The caller's trace context sent with a progress report (W3C's example ids).
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

struct Observed {
    _telemetry: Telemetry,
    /// `/metrics` after round 3, and what the API says about the same moment.
    metrics_after_round_3: Scrape,
    active_leases: usize,
    leased_gpus: usize,
    /// rho of apps A and B as `/why` reports them (the clock has not moved since round 3).
    rho_now: BTreeMap<String, f64>,
    closed_rounds: usize,
    /// `/metrics` at the end: after round 4 and a revocation.
    metrics_at_end: Scrape,
    closed_rounds_at_end: usize,
    /// Round 4: A, B and C all starving and bidding for the same GPUs.
    contested_round: i64,
    /// The apps that won a PF bundle in round 4, as the round's record says.
    contested_winners: BTreeSet<String>,
    apps: BTreeMap<&'static str, i64>,
    spans: Vec<SpanData>,
}

struct Scrape {
    content_type: String,
    samples: BTreeMap<String, f64>,
}

impl Scrape {
    fn value(&self, series: &str) -> f64 {
        *self
            .samples
            .get(series)
            .unwrap_or_else(|| panic!("{series} is not exported; got {:?}", self.samples.keys()))
    }

    /// Every series of metric `name` with its labels, e.g. `agora_app_rho{app="3"}`.
    fn series_of(&self, name: &str) -> BTreeMap<&str, f64> {
        self.samples
            .iter()
            .filter(|(series, _)| series.split('{').next() == Some(name))
            .map(|(series, value)| (series.as_str(), *value))
            .collect()
    }
}

fn observed() -> &'static Observed {
    static OBSERVED: OnceLock<Observed> = OnceLock::new();
    OBSERVED.get_or_init(|| actix_web::rt::System::new().block_on(scenario()))
}

/// The finished spans, kept in memory, and a signal each time some are exported.
#[derive(Debug, Clone, Default)]
struct Spans {
    finished: InMemorySpanExporter,
    exported: watch::Sender<()>,
}

impl SpanExporter for Spans {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let result = self.finished.export(batch).await;
        self.exported.send_replace(());
        result
    }
}

impl Spans {
    /// The finished spans once round `round`'s trace has ended: its root span closes after
    /// the arbiter has done everything the round's commit entails, metrics included.
    async fn after_round(&self, round: i64) -> Vec<SpanData> {
        let mut exported = self.exported.subscribe();
        loop {
            let spans = self.finished.get_finished_spans().expect("spans");
            if spans.iter().any(|span| {
                span.name == "auction_round" && attribute(span, "round") == Some(round.into())
            }) {
                return spans;
            }
            tokio::time::timeout(Duration::from_secs(30), exported.changed())
                .await
                .unwrap_or_else(|_| panic!("round {round}'s trace never ended"))
                .expect("the exporter lives");
        }
    }
}

async fn scenario() -> Observed {
    let spans = Spans::default();
    let traces = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let telemetry = install(
        LogSettings {
            filter: Some("warn".to_owned()),
            json: false,
        },
        Exporters {
            traces: Some(traces),
            ..Exporters::default()
        },
    );
    let database = fresh_database().await;
    let mut settings = config(&database);
    // Every app with unmet demand is offered GPUs, so round 4 has three rivals.
    settings.fairness_knob = 0.0;
    let service = serve(&settings, start_clock()).await;
    let token = service.tenant("observers").await;

    // Rounds 1 and 2: agents bid for A, then B; one GPU each (tiny fleet: 4 GPUs).
    let a = service.register(&token, "a", "agent", 1, 1_000).await;
    service.wait_for_leases(&token, a, one_active).await;
    let b = service.register(&token, "b", "agent", 1, 1_000).await;
    service.wait_for_leases(&token, b, one_active).await;
    // Round 3: C bids over HTTP for the two free GPUs while A and B hold theirs.
    let c = service.register(&token, "c", "explicit", 3, 1_000).await;
    let offer = service.wait_for(&token, c, "offer").await;
    post_bid(&service, &token, c, &offer).await;
    service.wait_for_leases(&token, c, one_active).await;
    let closed_rounds = count_closed_rounds(&service, &token).await;
    let mut active_leases = 0;
    let mut leased_gpus = 0;
    for app in [a, b, c] {
        let leases = service.wait_for_leases(&token, app, |_| true).await;
        for lease in active(&leases) {
            active_leases += 1;
            leased_gpus += lease["gpus"].as_array().map_or(0, Vec::len);
        }
    }
    let mut rho_now = BTreeMap::new();
    for app in [a, b] {
        let (_, why) = service
            .call("GET", &format!("/v1/apps/{app}/why"), &token, None)
            .await;
        rho_now.insert(
            app.to_string(),
            why["now"]["rho"].as_f64().expect("A and B hold GPUs"),
        );
    }

    spans
        .after_round(offer["round"].as_i64().expect("round 3"))
        .await;
    let metrics_after_round_3 = scrape(&service).await;

    // A progress report joins the caller's trace, through the arbiter's commit.
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (status, body) = service
        .call_with(
            "POST",
            &format!("/v1/apps/{a}/progress"),
            &token,
            Some(json!({ "jobs": [{ "job": "j0", "completed_iterations": 10 }] })),
            &[("traceparent", traceparent.as_str())],
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Round 4: every lease expires; A, B (agents) and C (over HTTP) bid for the same GPUs.
    service.clock.advance(Duration::from_secs(61));
    let offer = next_offer(&service, &token, c, offer["round"].as_i64().expect("round")).await;
    let contested_round = offer["round"].as_i64().expect("round");
    post_bid(&service, &token, c, &offer).await;
    let leases = service
        .wait_for_leases(&token, c, |leases| leases.len() == 2 && one_active(leases))
        .await;
    // A drained GPU's lease is revoked once its notice (30 s) is over.
    let gpu = active(&leases)[0]["gpus"][0]["id"]
        .as_str()
        .expect("gpu id")
        .to_owned();
    let (status, body) = service
        .call(
            "POST",
            &format!("/v1/cluster/gpus/{gpu}/drain"),
            support::ADMIN,
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let lease = active(&leases)[0]["id"].clone();
    service.clock.advance(Duration::from_secs(31));
    // The arbiter counts a revocation as it decides it, before the commit that tells C.
    service
        .wait_for_event(&token, c, |event| {
            event["kind"] == "lease_ended" && event["payload"]["lease"] == lease
        })
        .await;
    let metrics_at_end = scrape(&service).await;
    let closed_rounds_at_end = count_closed_rounds(&service, &token).await;
    let (status, detail) = service
        .call(
            "GET",
            &format!("/v1/rounds/{contested_round}"),
            &token,
            None,
        )
        .await;
    assert_eq!(status, 200, "{detail}");
    let contested_winners = detail["allocations"]
        .as_array()
        .expect("allocations")
        .iter()
        .filter(|allocation| {
            allocation["pf_gpus"]
                .as_array()
                .is_some_and(|gpus| !gpus.is_empty())
        })
        .map(|allocation| allocation["app_id"].to_string())
        .collect();
    let spans = spans.after_round(contested_round).await;
    service.running.stop().await;
    Observed {
        _telemetry: telemetry,
        metrics_after_round_3,
        active_leases,
        leased_gpus,
        rho_now,
        closed_rounds,
        metrics_at_end,
        closed_rounds_at_end,
        contested_round,
        contested_winners,
        apps: BTreeMap::from([("a", a), ("b", b), ("c", c)]),
        spans,
    }
}

fn one_active(leases: &[Json]) -> bool {
    active(leases).len() == 1
}

/// The app's first offer of a round after `after`.
async fn next_offer(service: &Service, token: &str, app: i64, after: i64) -> Json {
    let mut seen = 0;
    for _ in 0..40 {
        for event in service.events(token, app, seen).await {
            seen = event["id"].as_i64().expect("id");
            if event["kind"] == "offer" && event["payload"]["round"].as_i64() > Some(after) {
                return event["payload"].clone();
            }
        }
    }
    panic!("no offer after round {after} for app {app}");
}

/// A bid for every GPU of `offer`.
async fn post_bid(service: &Service, token: &str, app: i64, offer: &Json) {
    let gpus: Vec<Json> = offer["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|gpu| gpu["id"].clone())
        .collect();
    let bid =
        json!({ "app": app, "rho_old": offer["rho"], "bids": [{ "gpus": gpus, "rho": 1.5 }] });
    let path = format!("/v1/rounds/{}/bids", offer["round"]);
    let (status, body) = service.call("POST", &path, token, Some(bid)).await;
    assert_eq!(status, 201, "{body}");
}

async fn count_closed_rounds(service: &Service, token: &str) -> usize {
    let (status, rounds) = service.call("GET", "/v1/rounds", token, None).await;
    assert_eq!(status, 200, "{rounds}");
    rounds
        .as_array()
        .expect("rounds")
        .iter()
        .filter(|round| round["status"] == "closed")
        .count()
}

async fn scrape(service: &Service) -> Scrape {
    let mut response = service
        .client
        .get(format!("{}/metrics", service.base))
        .send()
        .await
        .expect("scrape");
    assert_eq!(response.status().as_u16(), 200);
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.body().await.expect("body");
    let text = String::from_utf8(body.to_vec()).expect("utf-8");
    let samples = text
        .lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("`series value`");
            (series.to_owned(), value.parse().expect("a number"))
        })
        .collect();
    Scrape {
        content_type,
        samples,
    }
}

fn attribute(span: &SpanData, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|attribute| attribute.key.as_str() == key)
        .map(|attribute| attribute.value.clone())
}

fn children<'a>(spans: &'a [SpanData], parent: &SpanData) -> Vec<&'a SpanData> {
    spans
        .iter()
        .filter(|span| span.parent_span_id == parent.span_context.span_id())
        .collect()
}

fn names(spans: &[&SpanData]) -> BTreeSet<String> {
    spans.iter().map(|span| span.name.to_string()).collect()
}

#[test]
fn metrics_endpoint_serves_the_markets_state_after_live_rounds() {
    let observed = observed();
    let scrape = &observed.metrics_after_round_3;
    assert!(
        scrape.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        scrape.content_type
    );
    let rounds = observed.closed_rounds as f64;
    assert_eq!(scrape.value("agora_round_duration_seconds_count"), rounds);
    assert!(scrape.value("agora_round_duration_seconds_sum") > 0.0);
    for stage in ["pf", "payments"] {
        let series = format!("agora_solver_duration_seconds_count{{stage=\"{stage}\"}}");
        assert_eq!(scrape.value(&series), rounds, "one {stage} stage per round");
    }
    // Agents bid for A and B (rounds 1 and 2), C's framework over HTTP (round 3); C's agent
    // only stood in, which is not a bid.
    assert_eq!(scrape.value("agora_bids_total{source=\"agent\"}"), 2.0);
    assert_eq!(scrape.value("agora_bids_total{source=\"framework\"}"), 1.0);
    assert_eq!(
        scrape.value("agora_leases_active"),
        observed.active_leases as f64
    );
    assert_eq!(
        scrape.value("agora_gpus_free"),
        (4 - observed.leased_gpus) as f64
    );

    // Round 3's rho collection: A and B held GPUs, C was starving.
    assert_eq!(scrape.value("agora_apps_starving"), 1.0);
    let rho: BTreeMap<String, f64> = scrape
        .series_of("agora_app_rho")
        .into_iter()
        .map(|(series, value)| {
            let app = series
                .trim_start_matches("agora_app_rho{app=\"")
                .trim_end_matches("\"}");
            (app.to_owned(), value)
        })
        .collect();
    assert_eq!(rho, observed.rho_now, "the gauge and /why agree on rho");
    let values: Vec<f64> = rho.values().copied().collect();
    assert_eq!(
        scrape.value("agora_rho_max"),
        values.iter().copied().fold(0.0, f64::max)
    );
    let jain = agora_market::rho::jains_index(&values);
    assert!((scrape.value("agora_rho_jain_index") - jain).abs() < 1e-9);
}

#[test]
fn metrics_count_every_round_and_revocation() {
    let observed = observed();
    let scrape = &observed.metrics_at_end;
    let rounds = observed.closed_rounds_at_end as f64;
    assert!(rounds >= 4.0, "{rounds} rounds");
    assert_eq!(scrape.value("agora_round_duration_seconds_count"), rounds);
    assert_eq!(
        scrape.value("agora_solver_duration_seconds_count{stage=\"payments\"}"),
        rounds
    );
    assert_eq!(scrape.value("agora_revocations_total"), 1.0);
    assert_eq!(
        scrape.value("agora_bids_total{source=\"framework\"}"),
        2.0,
        "C bid over HTTP in rounds 3 and 4"
    );
    assert_eq!(
        scrape.value("agora_bids_total{source=\"agent\"}"),
        4.0,
        "A and B bid again"
    );
}

#[test]
fn a_round_is_one_trace_from_rho_collection_to_notification() {
    let observed = observed();
    let spans = &observed.spans;
    let round = observed.contested_round;
    let root = spans
        .iter()
        .find(|span| span.name == "auction_round" && attribute(span, "round") == Some(round.into()))
        .expect("the round's root span");
    assert_eq!(
        root.parent_span_id,
        SpanId::INVALID,
        "a round starts its own trace"
    );
    let trace = root.span_context.trace_id();
    let stages = children(spans, root);
    assert!(stages
        .iter()
        .all(|span| span.span_context.trace_id() == trace));
    let expected: BTreeSet<String> = [
        "rho_collection",
        "offer",
        "bid_collection",
        "pf_solve",
        "payment_solves",
        "persistence",
        "notification",
    ]
    .map(String::from)
    .into();
    assert_eq!(names(&stages), expected);
    let stage = |name: &str| {
        *stages
            .iter()
            .find(|span| span.name == name)
            .unwrap_or_else(|| panic!("no {name} span"))
    };

    // The opening is committed and announced within the offer.
    assert_eq!(
        names(&children(spans, stage("offer"))),
        ["notification", "persistence"].map(String::from).into()
    );
    // Every bidder's agent (C's only as a fallback) bid within the bid collection, reached
    // through the BidRequest message.
    let app_of = |span: &&SpanData| attribute(span, "app").map(|app| app.as_str().into_owned());
    let agent_bids: BTreeSet<String> = children(spans, stage("bid_collection"))
        .iter()
        .filter(|span| span.name == "agent_bid")
        .filter_map(app_of)
        .collect();
    let bidders = ["a", "b", "c"].map(|name| observed.apps[name].to_string());
    assert_eq!(agent_bids, bidders.into());
    // Payments are solved within the payment stage, one span per winner whose bundle someone
    // else wanted too (A and B bid to renew their own GPUs, so only what C contests is solved).
    let payments = children(spans, stage("payment_solves"));
    assert!(payments.iter().all(|span| span.name == "payment_solve"));
    assert!(!observed.contested_winners.is_empty());
    assert!(payments
        .iter()
        .filter_map(app_of)
        .all(|app| observed.contested_winners.contains(&app)));
}

#[test]
fn requests_continue_the_callers_trace_into_the_arbiters_commit() {
    let observed = observed();
    let spans = &observed.spans;
    let caller_trace = TraceId::from_hex(CALLER_TRACE).expect("trace id");
    let request = spans
        .iter()
        .find(|span| {
            span.span_context.trace_id() == caller_trace
                && span.name == "POST /v1/apps/{app}/progress"
        })
        .expect("the request's span, in the caller's trace");
    assert_eq!(
        request.parent_span_id,
        SpanId::from_hex(CALLER_SPAN).expect("span id")
    );
    assert_eq!(
        attribute(request, "http.response.status_code"),
        Some(Value::I64(200))
    );
    // The arbiter handled the message inside the request's span.
    assert_eq!(
        names(&children(spans, request)),
        ["notification", "persistence"].map(String::from).into()
    );
}
