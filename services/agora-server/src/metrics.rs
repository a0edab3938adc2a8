//! The service's metrics (names, units and meaning in `docs/observability.md`).
//!
//! Every value is recorded once, in one OpenTelemetry meter provider with two readers: the
//! Prometheus exporter behind `GET /metrics`, and the OTLP exporter when telemetry configures
//! one. Why the OTel SDK with `opentelemetry-prometheus` rather than `prometheus-client`: the
//! OTel SDK is in the build anyway for OTLP, and `opentelemetry-prometheus` (maintained on the
//! same release train, un-deprecated in 0.32) is only another reader of the same aggregations,
//! whereas `prometheus-client` would need a second registry and a bridge to OTLP.
//!
//! The arbiter records what happens (rounds, bids, revocations) and what the market looks
//! like after each change; the engine's solver stages are timed from their spans here, since
//! the engine never reads a clock.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use agora_market::market::{Market, Standing};
use agora_market::rho::RhoSpread;
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _};
use opentelemetry::KeyValue;
use opentelemetry_otlp::MetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::Resource;
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The engine's spans timed as solver stages, and the `stage` label each one gets.
const SOLVER_STAGES: [(&str, &str); 2] = [("pf_solve", "pf"), ("payment_solves", "payments")];

/// Seconds; rounds wait for bids up to their deadline (2 s by default).
const ROUND_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Seconds; a solver stage takes from microseconds (one bidder) to seconds (large rounds).
const SOLVER_BUCKETS: [f64; 13] = [
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

#[derive(Debug)]
pub struct Metrics {
    provider: SdkMeterProvider,
    registry: prometheus::Registry,
    round_duration: Histogram<f64>,
    solver_duration: Histogram<f64>,
    bids: Counter<u64>,
    revocations: Counter<u64>,
    market: Arc<Mutex<MarketView>>,
}

/// The market as last observed, read by the gauges when an exporter collects.
#[derive(Debug, Default)]
struct MarketView {
    active_leases: u64,
    free_gpus: u64,
    /// (app, rho) of each app holding GPUs, at the last rho collection.
    rho: Vec<(String, f64)>,
    spread: RhoSpread,
}

static METRICS: OnceLock<Metrics> = OnceLock::new();

/// The process's metrics. Built on first use, without OTLP unless [`install`] came first.
pub fn metrics() -> &'static Metrics {
    METRICS.get_or_init(|| Metrics::new(None))
}

/// Builds the metrics with `otlp` as a second reader. False when they were already built
/// without it (the reader is then dropped).
pub(crate) fn install(otlp: Option<PeriodicReader<MetricExporter>>) -> bool {
    let mut otlp = otlp;
    let wanted = otlp.is_some();
    METRICS.get_or_init(|| Metrics::new(otlp.take()));
    !wanted || otlp.is_none()
}

/// Exports what the OTLP reader still holds and stops it.
pub(crate) fn shutdown() {
    if let Some(metrics) = METRICS.get() {
        // An unreachable collector was already reported by the exporter itself.
        let _ = metrics.provider.shutdown();
    }
}

/// The service's identity in telemetry: `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`,
/// with `agora` as the service name when neither names one.
pub(crate) fn resource(var: &dyn Fn(&str) -> Option<String>) -> Resource {
    let named = var("OTEL_SERVICE_NAME").is_some()
        || var("OTEL_RESOURCE_ATTRIBUTES")
            .is_some_and(|attributes| attributes.contains("service.name"));
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name("agora").build()
    }
}

impl Metrics {
    fn new(otlp: Option<PeriodicReader<MetricExporter>>) -> Self {
        let registry = prometheus::Registry::new();
        let prometheus = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            .scope_info_enabled(false)
            .build()
            .expect("a new registry has room for the exporter");
        let mut provider = SdkMeterProvider::builder()
            .with_reader(prometheus)
            .with_resource(resource(&|name| std::env::var(name).ok()));
        if let Some(otlp) = otlp {
            provider = provider.with_reader(otlp);
        }
        let provider = provider.build();
        let meter = provider.meter("agora");
        let market = Arc::new(Mutex::new(MarketView::default()));
        market_gauges(&meter, &market);
        Self {
            round_duration: meter
                .f64_histogram("agora.round.duration")
                .with_description("Wall time of an auction round, from its opening to its commit")
                .with_unit("s")
                .with_boundaries(ROUND_BUCKETS.to_vec())
                .build(),
            solver_duration: meter
                .f64_histogram("agora.solver.duration")
                .with_description(
                    "Wall time of a solver stage of a round: the PF solve, or all payment solves",
                )
                .with_unit("s")
                .with_boundaries(SOLVER_BUCKETS.to_vec())
                .build(),
            bids: meter
                .u64_counter("agora.bids")
                .with_description("Bids received, by source (framework: posted over HTTP; agent)")
                .build(),
            revocations: meter
                .u64_counter("agora.revocations")
                .with_description("Leases revoked before their end (GPU drained)")
                .build(),
            provider,
            registry,
            market,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn prometheus_text(&self) -> Result<String, prometheus::Error> {
        let mut text = String::new();
        prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut text)?;
        Ok(text)
    }

    pub fn round_closed(&self, duration: Duration) {
        self.round_duration.record(duration.as_secs_f64(), &[]);
    }

    /// `source`: `framework` or `agent`.
    pub fn bid_received(&self, source: &'static str) {
        self.bids.add(1, &[KeyValue::new("source", source)]);
    }

    pub fn leases_revoked(&self, count: usize) {
        self.revocations.add(count as u64, &[]);
    }

    /// Active leases and free GPUs, after a change to the market.
    pub fn observe_capacity(&self, market: &Market) {
        let mut view = self.view();
        view.active_leases = market.leases().active().count() as u64;
        view.free_gpus = market.free_gpus().len() as u64;
    }

    /// rho per app, its maximum and Jain's index over the apps holding GPUs (a starving app's
    /// rho is unbounded: it is counted apart), from a round's rho collection.
    pub fn observe_standings(&self, standings: &[Standing]) {
        let rho: Vec<(String, f64)> = standings
            .iter()
            .filter_map(|standing| Some((standing.app.0.clone(), f64::from(standing.rho?))))
            .collect();
        let mut view = self.view();
        view.spread = RhoSpread::of(standings.iter().map(|standing| standing.rho.map(f64::from)));
        view.rho = rho;
    }

    fn solver_stage(&self, stage: &'static str, duration: Duration) {
        self.solver_duration
            .record(duration.as_secs_f64(), &[KeyValue::new("stage", stage)]);
    }

    fn view(&self) -> std::sync::MutexGuard<'_, MarketView> {
        self.market.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Reports one gauge's values from the market view.
type Observe = fn(&MarketView, &mut dyn FnMut(f64, &[KeyValue]));

/// Gauges that read the market view when an exporter collects them.
fn market_gauges(meter: &Meter, market: &Arc<Mutex<MarketView>>) {
    let gauges: [(&'static str, &'static str, Observe); 6] = [
        (
            "agora.leases.active",
            "Leases active now",
            |view, observe| observe(view.active_leases as f64, &[]),
        ),
        (
            "agora.gpus.free",
            "Healthy GPUs that no lease holds",
            |view, observe| observe(view.free_gpus as f64, &[]),
        ),
        (
            "agora.app.rho",
            "Finish-time fairness rho of each app holding GPUs, at the last round's rho collection",
            |view, observe| {
                for (app, rho) in &view.rho {
                    observe(*rho, &[KeyValue::new("app", app.clone())]);
                }
            },
        ),
        (
            "agora.apps.starving",
            "Apps holding no GPU (unbounded rho), at the last round's rho collection",
            |view, observe| observe(view.spread.starving_apps as f64, &[]),
        ),
        (
            "agora.rho.max",
            "The largest rho among apps holding GPUs, at the last round's rho collection",
            |view, observe| {
                if let Some(max) = view.spread.max_rho {
                    observe(max, &[]);
                }
            },
        ),
        (
            "agora.rho.jain_index",
            "Jain's fairness index of the rho of apps holding GPUs (1: all equal)",
            |view, observe| {
                if let Some(index) = view.spread.jains_index {
                    observe(index, &[]);
                }
            },
        ),
    ];
    for (name, description, observe) in gauges {
        let market = market.clone();
        meter
            .f64_observable_gauge(name)
            .with_description(description)
            .with_callback(move |gauge| {
                let view = market.lock().unwrap_or_else(PoisonError::into_inner);
                observe(&view, &mut |value, labels| gauge.observe(value, labels));
            })
            .build();
    }
}

/// A layer that times the engine's solver stages from their spans.
pub(crate) fn span_durations<S>() -> impl Layer<S>
where
    S: Subscriber + for<'lookup> LookupSpan<'lookup>,
{
    SolverTimings.with_filter(tracing_subscriber::filter::filter_fn(|metadata| {
        metadata.is_span()
            && metadata.target().starts_with("agora_market")
            && SOLVER_STAGES
                .iter()
                .any(|(name, _)| *name == metadata.name())
    }))
}

#[derive(Debug)]
struct SolverTimings;

/// When a timed span began.
#[derive(Debug)]
struct Began(Instant);

impl<S> Layer<S> for SolverTimings
where
    S: Subscriber + for<'lookup> LookupSpan<'lookup>,
{
    fn on_new_span(&self, _: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Began(Instant::now()));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let stage = SOLVER_STAGES
            .iter()
            .find(|(name, _)| *name == span.name())
            .map(|(_, stage)| *stage);
        let began = span.extensions().get::<Began>().map(|began| began.0);
        if let (Some(stage), Some(began)) = (stage, began) {
            metrics().solver_stage(stage, began.elapsed());
        }
    }
}
