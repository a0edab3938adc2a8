//! Engine time. The engine never reads a clock: every entry point takes `now` as an argument,
//! so the simulator can drive it on simulated time and the service on the wall clock.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A point in time, in milliseconds since an epoch chosen by the caller (the Unix epoch in the
/// service, the start of the trace in the simulator).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    pub fn from_secs_f64(seconds: f64) -> Self {
        Self((seconds.max(0.0) * 1000.0).round() as u64)
    }

    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// Time elapsed since `earlier`, zero if `earlier` is in the future.
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    pub fn saturating_add(self, duration: Duration) -> Self {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Self(self.0.saturating_add(millis))
    }
}
