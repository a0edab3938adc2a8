//! A thin HTTP client for the arbiter's API that times every call.

use std::time::{Duration, Instant};

use serde_json::Value;

/// What a call answered: the status and the JSON body (`Null` when there is none).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    pub latency: Duration,
}

impl Answer {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// `409 round_closed`-style label of a failed call, for the error breakdown.
    pub fn error_label(&self) -> String {
        let code = self.body["code"].as_str().unwrap_or("-");
        format!("{} {code}", self.status)
    }
}

/// One base URL, one connection pool (no limit on connections: every player keeps a
/// long-poll open).
#[allow(missing_debug_implementations)] // awc::Client is not Debug
pub struct Api {
    client: awc::Client,
    base: String,
}

impl Api {
    pub fn new(base: &str) -> Self {
        let connector = awc::Connector::new().limit(0);
        let client = awc::Client::builder()
            .connector(connector)
            .timeout(Duration::from_secs(90))
            .finish();
        Self {
            client,
            base: base.trim_end_matches('/').to_owned(),
        }
    }

    /// Sends one request; `Err` only when no HTTP answer came back (refused, timed out).
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Answer, String> {
        let method = method
            .parse()
            .map_err(|_| format!("bad HTTP method {method}"))?;
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token);
        for (name, value) in headers {
            request = request.insert_header((*name, *value));
        }
        let started = Instant::now();
        let sent = match body {
            Some(body) => request.send_json(body).await,
            None => request.send().await,
        };
        let mut response =
            sent.map_err(|error| format!("{method_path}: {error}", method_path = path))?;
        let bytes = response
            .body()
            .limit(8 << 20)
            .await
            .map_err(|error| format!("{path}: reading the answer: {error}"))?;
        Ok(Answer {
            status: response.status().as_u16(),
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            latency: started.elapsed(),
        })
    }
}
