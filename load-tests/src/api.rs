//! A thin HTTP client for the arbiter's API that times every call. Given several arbiters of
//! one database, it follows the leader as documented for clients (`docs/api.md`): a request
//! answered 503 `not_leader` goes to the arbiter it names, one that gets no answer to the next
//! arbiter, until one takes it.

use std::cell::Cell;
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

/// How long a request may go on looking for the leader (a takeover takes well under this).
const FAILOVER_PATIENCE: Duration = Duration::from_secs(15);
/// The pause between two tries while no arbiter takes a request.
const FAILOVER_PAUSE: Duration = Duration::from_millis(25);

/// The arbiters' base URLs (one, or several sharing a database), one connection pool (no limit
/// on connections: every player keeps a long-poll open).
#[allow(missing_debug_implementations)] // awc::Client is not Debug
pub struct Api {
    client: awc::Client,
    bases: Vec<String>,
    /// The base tried first: the last that took a request.
    current: Cell<usize>,
}

impl Api {
    /// `bases`: comma-separated base URLs.
    pub fn new(bases: &str) -> Self {
        let connector = awc::Connector::new().limit(0);
        let client = awc::Client::builder()
            .connector(connector)
            .timeout(Duration::from_secs(90))
            .finish();
        Self {
            client,
            bases: bases
                .split(',')
                .map(|base| base.trim().trim_end_matches('/').to_owned())
                .collect(),
            current: Cell::new(0),
        }
    }

    /// Sends one request, to the leader when there are several arbiters; `Err` only when no
    /// HTTP answer came back (refused, timed out) from any. The latency covers every try.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Answer, String> {
        let started = Instant::now();
        loop {
            let base = &self.bases[self.current.get()];
            let outcome = self.send(base, method, path, token, body, headers).await;
            if self.bases.len() == 1 || started.elapsed() > FAILOVER_PATIENCE {
                return outcome;
            }
            match &outcome {
                Ok(answer) if answer.body["code"] == "not_leader" => {
                    self.follow(answer.body["leader"].as_str())
                }
                Err(_) => self.next(),
                Ok(answer) => {
                    return Ok(Answer {
                        latency: started.elapsed(),
                        ..answer.clone()
                    })
                }
            }
            actix_rt::time::sleep(FAILOVER_PAUSE).await;
        }
    }

    /// Goes to the leader a standby named, or to the next arbiter when it named none.
    fn follow(&self, leader: Option<&str>) {
        match leader.and_then(|leader| self.bases.iter().position(|base| base == leader)) {
            Some(index) => self.current.set(index),
            None => self.next(),
        }
    }

    fn next(&self) {
        self.current
            .set((self.current.get() + 1) % self.bases.len());
    }

    /// One try at `base`.
    async fn send(
        &self,
        base: &str,
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
            .request(method, format!("{base}{path}"))
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
