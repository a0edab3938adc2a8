//! One HPO framework driving one app through the API: it follows its events by long-poll,
//! bids for every offer (explicit bidding), reports progress and releases each lease after
//! holding it for a while, so GPUs come free and new rounds open.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::api::Api;
use crate::stats::{Live, Op, Stats};

/// A bid the arbiter acknowledged (201, or 200 for a replayed retry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckedBid {
    pub bid_id: i64,
    pub app: i64,
    pub round: i64,
}

/// How every player behaves.
#[derive(Debug, Clone, Copy)]
pub struct Behaviour {
    /// How long a lease is held before it is released (zero: at once).
    pub hold: Duration,
    /// Longest long-poll wait.
    pub poll_timeout: Duration,
    /// When to stop.
    pub until: Instant,
}

/// The registration body of a load app: `jobs` one-GPU jobs that never finish during a run.
pub fn registration(name: &str, jobs: u32) -> Value {
    let jobs: Vec<Value> = (0..jobs)
        .map(|job| {
            json!({
                "job": { "id": format!("j{job}"), "total_iterations": 1_000_000_000u64,
                         "serial_iteration_time": 1.0, "max_gpus": 1 },
                "predicted_final_iteration": 1_000_000_000u64,
            })
        })
        .collect();
    json!({ "name": name, "bidding": "explicit",
            "app": { "kind": "performance_curve", "jobs": jobs } })
}

/// Bid entries for an offer: bundles of 1 and 2 GPUs (as far as demand and the offer allow),
/// starting at a place that depends on the app so that players contend for different GPUs.
pub fn bid_for(app: i64, offer: &Value) -> Option<Value> {
    let gpus: Vec<&Value> = offer["gpus"]
        .as_array()?
        .iter()
        .map(|gpu| &gpu["id"])
        .collect();
    let wanted = offer["unmet_demand"].as_u64().unwrap_or(1).clamp(1, 2) as usize;
    if gpus.is_empty() {
        return None;
    }
    let start = (app.unsigned_abs() as usize).wrapping_mul(7) % gpus.len();
    let rho_old = offer["rho"].as_f64();
    let entries: Vec<Value> = (1..=wanted.min(gpus.len()))
        .map(|size| {
            let bundle: Vec<&Value> = (0..size).map(|i| gpus[(start + i) % gpus.len()]).collect();
            let rho = rho_old.map_or(4.0 / size as f64, |rho| rho * 0.9f64.powi(size as i32));
            json!({ "gpus": bundle, "rho": rho })
        })
        .collect();
    Some(json!({ "app": app, "rho_old": rho_old, "bids": entries }))
}

#[allow(missing_debug_implementations)] // holds the API client
pub struct Player {
    pub api: Rc<Api>,
    pub token: Rc<str>,
    pub app: i64,
    pub behaviour: Behaviour,
    pub stats: Rc<RefCell<Stats>>,
    pub live: Arc<Live>,
}

impl Player {
    /// Plays until the deadline; returns the bids the arbiter acknowledged.
    pub async fn run(self) -> Vec<AckedBid> {
        let mut acked = Vec::new();
        let mut held: Vec<(i64, Instant)> = Vec::new();
        let mut after = 0i64;
        let mut iterations = 0u64;
        while Instant::now() < self.behaviour.until && !self.live.stopped() {
            let next_release = held.iter().map(|(_, at)| *at + self.behaviour.hold).min();
            let wait = [Some(self.behaviour.until), next_release]
                .into_iter()
                .flatten()
                .min()
                .map_or(Duration::ZERO, |at| {
                    at.saturating_duration_since(Instant::now())
                })
                .min(self.behaviour.poll_timeout);
            if wait > Duration::ZERO {
                for event in self.poll(&mut after, wait).await {
                    match event["kind"].as_str() {
                        Some("offer") => acked.extend(self.bid(&event["payload"]).await),
                        Some("lease_granted") => {
                            if let Some(lease) = event["payload"]["lease"].as_i64() {
                                held.push((lease, Instant::now()));
                            }
                        }
                        Some("lease_ended") => {
                            let ended = event["payload"]["lease"].as_i64();
                            held.retain(|(lease, _)| Some(*lease) != ended);
                        }
                        _ => {}
                    }
                }
            }
            let due: Vec<i64> = held
                .iter()
                .filter(|(_, at)| at.elapsed() >= self.behaviour.hold)
                .map(|(lease, _)| *lease)
                .collect();
            if !due.is_empty() && Instant::now() < self.behaviour.until {
                iterations += 10;
                self.report_progress(iterations).await;
                for lease in due {
                    self.release(lease).await;
                    held.retain(|(held, _)| *held != lease);
                }
            }
        }
        acked
    }

    async fn poll(&self, after: &mut i64, wait: Duration) -> Vec<Value> {
        let path = format!(
            "/v1/apps/{}/events/poll?after={after}&timeout_ms={}",
            self.app,
            wait.as_millis().max(1)
        );
        let outcome = self.api.call("GET", &path, &self.token, None, &[]).await;
        let Some(page) = self
            .stats
            .borrow_mut()
            .record(&self.live, Op::Poll, &outcome)
            .cloned()
        else {
            // Do not spin against a failing server.
            actix_rt::time::sleep(Duration::from_millis(100)).await;
            return Vec::new();
        };
        *after = page.body["last_id"].as_i64().unwrap_or(*after);
        page.body["events"].as_array().cloned().unwrap_or_default()
    }

    async fn bid(&self, offer: &Value) -> Option<AckedBid> {
        let round = offer["round"].as_i64()?;
        let body = bid_for(self.app, offer)?;
        let key = format!("load-{}-{round}", self.app);
        let path = format!("/v1/rounds/{round}/bids");
        let outcome = self
            .api
            .call(
                "POST",
                &path,
                &self.token,
                Some(&body),
                &[("idempotency-key", &key)],
            )
            .await;
        let mut stats = self.stats.borrow_mut();
        let answer = stats.record(&self.live, Op::Bid, &outcome)?;
        Some(AckedBid {
            bid_id: answer.body["bid_id"].as_i64()?,
            app: self.app,
            round,
        })
    }

    async fn report_progress(&self, iterations: u64) {
        let body = json!({ "jobs": [{ "job": "j0", "completed_iterations": iterations }] });
        let path = format!("/v1/apps/{}/progress", self.app);
        let outcome = self
            .api
            .call("POST", &path, &self.token, Some(&body), &[])
            .await;
        self.stats
            .borrow_mut()
            .record(&self.live, Op::Progress, &outcome);
    }

    async fn release(&self, lease: i64) {
        let path = format!("/v1/leases/{lease}/release");
        let outcome = self.api.call("POST", &path, &self.token, None, &[]).await;
        self.stats
            .borrow_mut()
            .record(&self.live, Op::Release, &outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bids_name_only_offered_gpus_and_no_more_than_the_unmet_demand() {
        let offer = json!({ "round": 3, "rho": 2.0, "unmet_demand": 5,
                            "gpus": [{ "id": "a" }, { "id": "b" }, { "id": "c" }] });
        let bid = bid_for(4, &offer).expect("a bid");
        let entries = bid["bids"].as_array().expect("entries");
        assert_eq!(entries.len(), 2);
        for entry in entries {
            for gpu in entry["gpus"].as_array().expect("gpus") {
                assert!(["a", "b", "c"].contains(&gpu.as_str().expect("id")));
            }
            assert!(entry["rho"].as_f64().expect("rho") < 2.0);
        }
        let starving =
            json!({ "round": 3, "rho": null, "unmet_demand": 1, "gpus": [{ "id": "a" }] });
        let bid = bid_for(4, &starving).expect("a bid");
        assert_eq!(bid["rho_old"], Value::Null);
        assert_eq!(bid["bids"].as_array().expect("entries").len(), 1);
        assert!(bid_for(4, &json!({ "round": 3, "gpus": [] })).is_none());
    }
}
