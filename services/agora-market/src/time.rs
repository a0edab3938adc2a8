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

/// Serialises a `Duration` as a number of seconds (`#[serde(with = "...")]`), the unit
/// configuration files and reports use.
pub mod duration_seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(duration.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        Duration::try_from_secs_f64(f64::deserialize(deserializer)?)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Config {
        #[serde(with = "duration_seconds")]
        lease: Duration,
    }

    #[test]
    fn durations_read_and_write_as_seconds() {
        let config = Config {
            lease: Duration::from_millis(1500),
        };
        assert_eq!(
            serde_json::to_string(&config).expect("serialisable"),
            r#"{"lease":1.5}"#
        );
        assert_eq!(
            serde_json::from_str::<Config>(r#"{"lease":600}"#).ok(),
            Some(Config {
                lease: Duration::from_secs(600)
            })
        );
        assert!(serde_json::from_str::<Config>(r#"{"lease":-1}"#).is_err());
    }

    #[test]
    fn timestamps_convert_and_saturate() {
        assert_eq!(Timestamp::from_secs_f64(1.2345), Timestamp(1235));
        assert_eq!(
            Timestamp(5000).saturating_since(Timestamp(7000)),
            Duration::ZERO
        );
        assert_eq!(
            Timestamp(u64::MAX - 1).saturating_add(Duration::from_secs(1)),
            Timestamp(u64::MAX)
        );
    }
}
