//! Latencies per operation, errors by kind, and live counters for the progress lines.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::api::Answer;

/// The API calls a framework makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Tenant,
    Register,
    /// Long-poll for events: its latency is mostly waiting, by design.
    Poll,
    Bid,
    Progress,
    Release,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Tenant,
        Op::Register,
        Op::Poll,
        Op::Bid,
        Op::Progress,
        Op::Release,
    ];

    fn index(self) -> usize {
        self as usize
    }

    pub fn name(self) -> &'static str {
        match self {
            Op::Tenant => "tenant",
            Op::Register => "register",
            Op::Poll => "poll (long)",
            Op::Bid => "bid",
            Op::Progress => "progress",
            Op::Release => "release",
        }
    }
}

/// Counters shared by every thread, read by the progress lines while the load runs.
#[derive(Debug, Default)]
pub struct Live {
    pub bids: AtomicU64,
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    /// Set to end the play before its duration (the failover scenario, once its kills are done).
    stopped: AtomicBool,
}

impl Live {
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.bids.load(Ordering::Relaxed),
            self.requests.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }
}

/// Successful-call latencies (microseconds) per operation and failed calls by label.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    latencies: [Vec<u32>; 6],
    pub errors: BTreeMap<String, u64>,
}

impl Stats {
    /// Records a call's outcome; returns the answer when it succeeded (2xx).
    pub fn record<'a>(
        &mut self,
        live: &Live,
        op: Op,
        outcome: &'a Result<Answer, String>,
    ) -> Option<&'a Answer> {
        live.requests.fetch_add(1, Ordering::Relaxed);
        let label = match outcome {
            Ok(answer) if answer.is_success() => {
                let micros = answer.latency.as_micros().min(u32::MAX as u128) as u32;
                self.latencies[op.index()].push(micros);
                if op == Op::Bid {
                    live.bids.fetch_add(1, Ordering::Relaxed);
                }
                return Some(answer);
            }
            Ok(answer) => answer.error_label(),
            Err(_) => "no answer".to_owned(),
        };
        live.errors.fetch_add(1, Ordering::Relaxed);
        *self
            .errors
            .entry(format!("{} {label}", op.name()))
            .or_default() += 1;
        None
    }

    pub fn merge(&mut self, other: Stats) {
        for (mine, theirs) in self.latencies.iter_mut().zip(other.latencies) {
            mine.extend(theirs);
        }
        for (label, count) in other.errors {
            *self.errors.entry(label).or_default() += count;
        }
    }

    pub fn count(&self, op: Op) -> usize {
        self.latencies[op.index()].len()
    }

    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// The `q` quantile (0..=1) of an operation's latencies, nearest rank.
    pub fn quantile(&self, op: Op, q: f64) -> Option<Duration> {
        let mut sorted = self.latencies[op.index()].clone();
        sorted.sort_unstable();
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len().max(1));
        sorted
            .get(rank - 1)
            .map(|&micros| Duration::from_micros(micros.into()))
    }

    /// A Markdown table: per operation, count, rate over `elapsed`, and latency percentiles.
    pub fn table(&self, elapsed: Duration) -> String {
        let ms = |value: Option<Duration>| {
            value.map_or("-".to_owned(), |value| {
                format!("{:.2}", value.as_secs_f64() * 1e3)
            })
        };
        let mut out = String::from(
            "| operation | ok | per second | p50 ms | p90 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|---:|\n",
        );
        for op in Op::ALL {
            let count = self.count(op);
            if count == 0 {
                continue;
            }
            let _ = writeln!(
                out,
                "| {} | {count} | {:.0} | {} | {} | {} | {} |",
                op.name(),
                count as f64 / elapsed.as_secs_f64().max(1e-9),
                ms(self.quantile(op, 0.5)),
                ms(self.quantile(op, 0.9)),
                ms(self.quantile(op, 0.99)),
                ms(self.quantile(op, 1.0)),
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, millis: u64) -> Result<Answer, String> {
        Ok(Answer {
            status,
            body: serde_json::json!({ "code": "round_closed" }),
            latency: Duration::from_millis(millis),
        })
    }

    #[test]
    fn quantiles_use_the_nearest_rank_and_errors_are_labelled() {
        let live = Live::default();
        let mut stats = Stats::default();
        for millis in 1..=100 {
            stats.record(&live, Op::Bid, &answer(201, millis));
        }
        assert!(stats.record(&live, Op::Bid, &answer(409, 1)).is_none());
        assert_eq!(
            stats.quantile(Op::Bid, 0.99),
            Some(Duration::from_millis(99))
        );
        assert_eq!(
            stats.quantile(Op::Bid, 0.5),
            Some(Duration::from_millis(50))
        );
        assert_eq!(stats.quantile(Op::Poll, 0.5), None);
        assert_eq!(stats.errors.get("bid 409 round_closed"), Some(&1));
        assert_eq!(live.snapshot(), (100, 101, 1));
    }
}
