//! Logs, traces and metrics, configured by `RUST_LOG`, `AGORA_LOG_FORMAT` and the standard
//! `OTEL_*` variables (`docs/observability.md`).
//!
//! Logs always go to stderr. Spans go to an OTLP collector over HTTP/protobuf only when an
//! OTLP endpoint is set: without one no exporter is built, so nothing tries to connect and
//! nothing complains. Metrics live in one OpenTelemetry meter provider (`metrics.rs`), read by
//! `GET /metrics` and, when an endpoint is set, by an OTLP exporter. The exporters run on the
//! SDK's own threads with a blocking HTTP client, so they never depend on actix's
//! single-threaded runtimes, and [`Telemetry`] flushes them when dropped.

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::HeaderMap;
use actix_web::middleware::Next;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{MetricExporter, SpanExporter};
use opentelemetry_sdk::metrics::PeriodicReader;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::{Instrument, Level, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::metrics;
use agora_market::live::RoundId;

/// Logged when `RUST_LOG` is unset or invalid.
const DEFAULT_LOG_FILTER: &str = "info,sqlx=warn,actix_server=warn";

/// The exporter's own stack logs through `tracing` too; above `warn` it would flood the log
/// (and each export would log about itself). `RUST_LOG` naming one of them overrides this.
const NOISY_TARGETS: [&str; 6] = ["opentelemetry", "hyper", "h2", "tonic", "reqwest", "tower"];

/// Where telemetry goes besides the log.
#[derive(Debug, Default)]
pub struct Exporters {
    /// Spans; `None`: spans only give context to log lines.
    pub traces: Option<SdkTracerProvider>,
    /// The OTLP metric reader; `None`: metrics are only served on `GET /metrics`.
    pub metrics: Option<PeriodicReader<MetricExporter>>,
    /// Configuration problems, logged once logging is up.
    pub warnings: Vec<String>,
}

impl Exporters {
    /// The OTLP exporters the `OTEL_*` variables ask for (`var` looks one up). A signal gets
    /// one only with an endpoint (`OTEL_EXPORTER_OTLP_ENDPOINT` or its own), and neither does
    /// with `OTEL_SDK_DISABLED=true`; `OTEL_{TRACES,METRICS}_EXPORTER=none` turns one off.
    pub fn from_env(var: &dyn Fn(&str) -> Option<String>) -> Self {
        let set = |name: &str| var(name).filter(|value| !value.trim().is_empty());
        let mut exporters = Self::default();
        if set("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
            return exporters;
        }
        let wanted = |signal: &str| {
            let chosen = set(&format!("OTEL_{signal}_EXPORTER"));
            let endpoint = set(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"))
                .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"));
            let protocol = set(&format!("OTEL_EXPORTER_OTLP_{signal}_PROTOCOL"))
                .or_else(|| set("OTEL_EXPORTER_OTLP_PROTOCOL"));
            match (chosen.as_deref(), endpoint, protocol.as_deref()) {
                (Some("none"), _, _) | (_, None, _) => Ok(false),
                (Some(other), _, _) if other != "otlp" => Err(format!(
                    "OTEL_{signal}_EXPORTER={other} is not supported: use otlp or none"
                )),
                (_, Some(_), None | Some("http/protobuf")) => Ok(true),
                (_, Some(_), Some(other)) => Err(format!(
                    "OTLP protocol {other} is not supported for {signal}: set \
                     OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (collectors listen on port 4318)"
                )),
            }
        };
        let resource = metrics::resource(var);
        match wanted("TRACES").and_then(|on| on.then(build_span_exporter).transpose()) {
            Ok(exporter) => {
                exporters.traces = exporter.map(|exporter| {
                    SdkTracerProvider::builder()
                        .with_batch_exporter(exporter)
                        .with_resource(resource.clone())
                        .build()
                });
            }
            Err(warning) => exporters.warnings.push(warning),
        }
        match wanted("METRICS").and_then(|on| on.then(build_metric_exporter).transpose()) {
            Ok(exporter) => {
                exporters.metrics =
                    exporter.map(|exporter| PeriodicReader::builder(exporter).build());
            }
            Err(warning) => exporters.warnings.push(warning),
        }
        exporters
    }
}

fn build_span_exporter() -> Result<SpanExporter, String> {
    SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|error| format!("traces are not exported: {error}"))
}

fn build_metric_exporter() -> Result<MetricExporter, String> {
    MetricExporter::builder()
        .with_http()
        .build()
        .map_err(|error| format!("metrics are not exported over OTLP: {error}"))
}

/// Installed telemetry. Dropping it exports what is still buffered and stops the exporters;
/// drop it outside any async runtime, as the last thing before the process exits.
#[derive(Debug)]
#[must_use = "telemetry is flushed when this is dropped"]
pub struct Telemetry {
    traces: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(traces) = self.traces.take() {
            if let Err(error) = traces.shutdown() {
                tracing::warn!(%error, "the last spans were not exported");
            }
        }
        metrics::shutdown();
    }
}

/// How logs are written to stderr.
#[derive(Debug, Default)]
pub struct LogSettings {
    /// A `RUST_LOG` filter; `None` (or an invalid one): `info`, quiet database driver.
    pub filter: Option<String>,
    /// One JSON object per line instead of text.
    pub json: bool,
}

impl LogSettings {
    /// `RUST_LOG`, and JSON lines when `AGORA_LOG_FORMAT=json`.
    pub fn from_env() -> Self {
        Self {
            filter: std::env::var("RUST_LOG").ok(),
            json: std::env::var("AGORA_LOG_FORMAT").as_deref() == Ok("json"),
        }
    }
}

/// Logs, traces and metrics as the environment configures them: the entry point of
/// `agora serve`.
pub fn init() -> Telemetry {
    install(
        LogSettings::from_env(),
        Exporters::from_env(&|name| std::env::var(name).ok()),
    )
}

/// Installs the process-wide subscriber and metric exporters.
pub fn install(logs: LogSettings, exporters: Exporters) -> Telemetry {
    let Exporters {
        traces,
        metrics: metric_reader,
        mut warnings,
    } = exporters;
    let filter = log_filter(logs.filter.as_deref());
    let logs = if logs.json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed()
    };
    let spans = traces.as_ref().map(|provider| {
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("agora"))
            .with_threads(false)
            .with_filter(
                Targets::new()
                    .with_target("agora_server", Level::INFO)
                    .with_target("agora_market", Level::INFO),
            )
    });
    let installed = tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(spans)
        .with(metrics::span_durations())
        .try_init();
    if installed.is_err() {
        warnings.push("a tracing subscriber was already installed; telemetry kept it".to_owned());
    }
    if !metrics::install(metric_reader) {
        warnings.push(
            "metrics were recorded before telemetry started; OTLP metrics are off".to_owned(),
        );
    }
    for warning in warnings {
        tracing::warn!("telemetry: {warning}");
    }
    Telemetry { traces }
}

/// `RUST_LOG` (or the default), with the exporter's chatty dependencies held at `warn` unless
/// `RUST_LOG` names them.
fn log_filter(rust_log: Option<&str>) -> EnvFilter {
    let (spec, filter) = match rust_log.map(EnvFilter::try_new) {
        Some(Ok(filter)) => (rust_log.unwrap_or_default(), filter),
        _ => (DEFAULT_LOG_FILTER, EnvFilter::new(DEFAULT_LOG_FILTER)),
    };
    NOISY_TARGETS
        .iter()
        .filter(|target| !spec.contains(**target))
        .filter_map(|target| format!("{target}=warn").parse().ok())
        .fold(filter, EnvFilter::add_directive)
}

/// actix-web middleware: one span per request, named after its route, that continues the
/// caller's trace when the request carries a W3C `traceparent` header. Scrapes and health
/// checks are left out: they would only bury the traces that matter.
pub async fn trace_request(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let route = request.match_pattern();
    if matches!(route.as_deref(), Some("/metrics" | "/healthz")) {
        return next.call(request).await;
    }
    let route = route.unwrap_or_else(|| "unmatched".to_owned());
    let span = tracing::info_span!(
        "http_request",
        otel.name = %format_args!("{} {route}", request.method()),
        otel.kind = "server",
        http.request.method = %request.method(),
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if request.headers().contains_key("traceparent") {
        let caller = TraceContextPropagator::new().extract(&Headers(request.headers()));
        // Fails only when no OpenTelemetry layer is installed: then there is no trace to join.
        let _ = span.set_parent(caller);
    }
    let response = next.call(request).instrument(span.clone()).await;
    let status = match &response {
        Ok(response) => response.status(),
        Err(error) => error.as_response_error().status_code(),
    };
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "ERROR");
    }
    response
}

/// The spans of a round that takes bids: the root of its trace, and the bid collection under
/// it, which agents' bids join.
#[derive(Debug)]
pub struct RoundTrace {
    pub round: RoundId,
    pub span: Span,
    /// Open until the round closes to bids.
    collecting: Option<Span>,
    /// When the round began (its rho collection), for its duration.
    began: Instant,
}

impl RoundTrace {
    pub fn collecting_bids(round: RoundId, span: Span, began: Instant) -> Self {
        let collecting = tracing::info_span!(parent: &span, "bid_collection");
        Self {
            round,
            span,
            collecting: Some(collecting),
            began,
        }
    }

    /// The bid collection's span while it lasts, then the round's.
    pub fn bid_collection(&self) -> &Span {
        self.collecting.as_ref().unwrap_or(&self.span)
    }

    /// Ends the bid collection.
    pub fn bids_collected(&mut self) {
        self.collecting = None;
    }

    pub fn began(&self) -> Instant {
        self.began
    }
}

/// Request headers as OpenTelemetry's propagators read them.
struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|name| name.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn exporters(vars: &[(&str, &str)]) -> Exporters {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        Exporters::from_env(&|name| vars.get(name).cloned())
    }

    #[test]
    fn without_otel_variables_no_exporter_is_installed() {
        let none = exporters(&[]);
        assert!(none.traces.is_none() && none.metrics.is_none());
        assert!(none.warnings.is_empty(), "{:?}", none.warnings);
    }

    #[test]
    fn an_endpoint_installs_both_exporters_unless_turned_off() {
        let endpoint = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9");
        let both = exporters(&[endpoint]);
        assert!(both.traces.is_some() && both.metrics.is_some());

        let metrics_only = exporters(&[endpoint, ("OTEL_TRACES_EXPORTER", "none")]);
        assert!(metrics_only.traces.is_none() && metrics_only.metrics.is_some());

        let traces_only = exporters(&[(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "http://127.0.0.1:9/v1/traces",
        )]);
        assert!(traces_only.traces.is_some() && traces_only.metrics.is_none());

        let disabled = exporters(&[endpoint, ("OTEL_SDK_DISABLED", "true")]);
        assert!(disabled.traces.is_none() && disabled.metrics.is_none());
    }

    #[test]
    fn grpc_is_refused_with_a_way_out_instead_of_failing_every_export() {
        let grpc = exporters(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]);
        assert!(grpc.traces.is_none() && grpc.metrics.is_none());
        assert_eq!(grpc.warnings.len(), 2);
        assert!(
            grpc.warnings[0].contains("http/protobuf"),
            "{}",
            grpc.warnings[0]
        );
    }

    #[test]
    fn the_exporters_dependencies_stay_at_warn_unless_named() {
        let filter = log_filter(Some("debug")).to_string();
        assert!(
            filter.contains("hyper=warn") && filter.contains("opentelemetry=warn"),
            "{filter}"
        );
        let named = log_filter(Some("debug,hyper=trace")).to_string();
        assert!(!named.contains("hyper=warn"), "{named}");
        assert!(log_filter(Some("not a [filter"))
            .to_string()
            .contains("sqlx=warn"));
    }
}
