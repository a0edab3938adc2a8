//! `GET /metrics`: every metric in the Prometheus text exposition format, for scrapers (no
//! token, like `/healthz`; it reveals counts and app ids, not tenants' data).

use actix_web::HttpResponse;

use super::problem::ApiError;
use crate::metrics::metrics;

pub async fn prometheus() -> Result<HttpResponse, ApiError> {
    let text = metrics().prometheus_text().map_err(|error| {
        ApiError::new(
            actix_web::http::StatusCode::INTERNAL_SERVER_ERROR,
            super::problem::ErrorCode::MetricsUnavailable,
            format!("the metrics could not be encoded: {error}"),
        )
    })?;
    Ok(HttpResponse::Ok()
        .content_type(prometheus::TEXT_FORMAT)
        .body(text))
}
