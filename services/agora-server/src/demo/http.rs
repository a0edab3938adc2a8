//! The demo's HTTP calls: JSON in and out, a non-2xx answer as an error "STATUS: detail".

use std::time::Duration;

use anyhow::{anyhow, Context as _};
use serde_json::Value;

pub async fn post(
    client: &awc::Client,
    base: &str,
    token: &str,
    path: &str,
    body: Value,
) -> anyhow::Result<Value> {
    let request = client.post(format!("{base}{path}")).bearer_auth(token);
    answer(
        request
            .send_json(&body)
            .await
            .map_err(|error| anyhow!("POST {path}: {error}"))?,
    )
    .await
}

pub async fn get(
    client: &awc::Client,
    base: &str,
    token: &str,
    path: &str,
) -> anyhow::Result<Value> {
    let request = client
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .timeout(Duration::from_secs(10));
    answer(
        request
            .send()
            .await
            .map_err(|error| anyhow!("GET {path}: {error}"))?,
    )
    .await
}

async fn answer<S>(mut response: awc::ClientResponse<S>) -> anyhow::Result<Value>
where
    S: futures_util::Stream<Item = Result<actix_web::web::Bytes, actix_web::error::PayloadError>>
        + Unpin,
{
    let status = response.status();
    let body = response
        .body()
        .limit(4 << 20)
        .await
        .context("reading the answer")?;
    let value: Value = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body)?
    };
    if status.is_success() {
        Ok(value)
    } else {
        Err(anyhow!(
            "{status}: {}",
            value["detail"].as_str().unwrap_or_default()
        ))
    }
}
