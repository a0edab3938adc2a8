//! The service's only source of time. The engine never reads a clock; the arbiter and the lease
//! manager read this one, so tests drive rounds and lease expiry by moving a manual clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agora_market::time::Timestamp;
use chrono::{DateTime, Utc};

/// Milliseconds since the Unix epoch, as the engine's [`Timestamp`].
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Timestamp;
}

#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp(since_epoch.as_millis() as u64)
    }
}

/// A clock that moves only when told to; shared by clones.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    pub fn starting_at(start: Timestamp) -> Self {
        Self(Arc::new(AtomicU64::new(start.0)))
    }

    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }
}

/// Postgres `timestamptz` of an engine time (exact: both have at least millisecond resolution).
pub fn to_datetime(at: Timestamp) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.0 as i64).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

pub fn from_datetime(at: DateTime<Utc>) -> Timestamp {
    Timestamp(at.timestamp_millis().max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datetimes_round_trip_engine_times_exactly() {
        for millis in [0, 1, 1_732_000_000_123, 4_102_444_800_999] {
            assert_eq!(
                from_datetime(to_datetime(Timestamp(millis))),
                Timestamp(millis)
            );
        }
    }

    #[test]
    fn a_manual_clock_moves_only_when_advanced_and_clones_share_it() {
        let clock = ManualClock::starting_at(Timestamp(1_000));
        let shared = clock.clone();
        assert_eq!(clock.now(), Timestamp(1_000));
        shared.advance(Duration::from_millis(250));
        assert_eq!(clock.now(), Timestamp(1_250));
    }
}
