//! Whether a GPU is fit to be offered. The worker only reports the verdict; the arbiter
//! withdraws unhealthy GPUs from offers.
//!
//! A GPU is unhealthy while
//! - NVML does not answer for it (the reading failed): healthy again once it answers;
//! - it is at or above the temperature limit: healthy again once it has cooled
//!   [`COOLING_MARGIN_CELSIUS`] below the limit, so a GPU hovering at the limit does not flap;
//!
//! and from then on, until the worker restarts, once
//! - its volatile double-bit (uncorrectable) ECC error count rises above what it was when the
//!   worker started, or
//! - the driver raises a critical XID for it (see [`CRITICAL_XIDS`]).
//!
//! Those two stick because their remedy is a GPU reset or a driver reload (retired pages and
//! row remaps take effect only then, and NVIDIA's guidance for each of these XIDs is a reset or
//! a node drain), which an operator does with the worker stopped. The volatile ECC counters
//! restart at zero with the driver, so the restarted worker takes a fresh baseline.

use agora_protocol::{GpuHealth, GpuMetrics};

use crate::backend::BackendError;

/// XIDs after which the GPU is not trusted until it has been reset (NVIDIA's XID catalogue):
/// - 48: double-bit ECC error (uncorrectable memory error);
/// - 63: ECC page retirement or row remapping recorded (takes effect at the next reset);
/// - 64: ECC page retirement or row remapping failed;
/// - 74: NVLink error (the link is down or degraded until a reset);
/// - 79: the GPU has fallen off the bus;
/// - 92: high single-bit ECC error rate;
/// - 94: contained ECC error (a row remap is pending a reset);
/// - 95: uncontained ECC error (the GPU must be reset).
///
/// XIDs that usually mean a faulty application rather than a faulty GPU (13 graphics engine
/// exception, 31 MMU fault, 43 GPU stopped processing, 45 preemptive cleanup) are recorded in
/// the metrics but do not make the GPU unhealthy.
pub const CRITICAL_XIDS: [u64; 8] = [48, 63, 64, 74, 79, 92, 94, 95];

/// Degrees below the limit a hot GPU must reach to count as healthy again.
pub const COOLING_MARGIN_CELSIUS: u32 = 5;

/// The operator's health settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthPolicy {
    /// A GPU at or above this temperature is unhealthy.
    pub temperature_limit_celsius: u32,
}

impl Default for HealthPolicy {
    /// 90 °C: above the usual sustained operating range of datacenter GPUs, near the point
    /// where they throttle.
    fn default() -> Self {
        Self {
            temperature_limit_celsius: 90,
        }
    }
}

/// One GPU's health over time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthTracker {
    /// The double-bit ECC count at the first reading that had one.
    dbe_baseline: Option<u64>,
    /// Why the GPU is unhealthy until the worker restarts, once it is.
    sticky: Option<String>,
    overheated: bool,
}

impl HealthTracker {
    /// Takes one reading of the GPU (or the error NVML gave instead) and the XIDs raised for it
    /// since the last reading, and gives the verdict.
    pub fn assess(
        &mut self,
        policy: &HealthPolicy,
        reading: Result<&GpuMetrics, &BackendError>,
        xids: &[u64],
    ) -> GpuHealth {
        if let Some(xid) = xids.iter().find(|xid| CRITICAL_XIDS.contains(xid)) {
            self.stick(format!("critical XID {xid} raised by the driver"));
        }
        let present_fault = match reading {
            Ok(metrics) => {
                self.check_ecc(metrics);
                self.check_temperature(policy, metrics)
            }
            Err(error) => Some(format!("NVML stopped answering for this GPU: {error}")),
        };
        match self.sticky.clone().or(present_fault) {
            Some(reason) => GpuHealth::Unhealthy { reason },
            None => GpuHealth::Healthy,
        }
    }

    fn check_ecc(&mut self, metrics: &GpuMetrics) {
        let Some(dbe) = metrics.ecc_dbe_volatile_total else {
            return;
        };
        let baseline = *self.dbe_baseline.get_or_insert(dbe);
        if dbe > baseline {
            self.stick(format!(
                "volatile double-bit ECC errors rose from {baseline} to {dbe}"
            ));
        }
    }

    /// Why the GPU is too hot, if it is.
    fn check_temperature(&mut self, policy: &HealthPolicy, metrics: &GpuMetrics) -> Option<String> {
        let temperature = metrics.gpu_temp_celsius?;
        let limit = policy.temperature_limit_celsius;
        let cool_enough = limit.saturating_sub(COOLING_MARGIN_CELSIUS);
        self.overheated = if self.overheated {
            temperature > cool_enough
        } else {
            temperature >= limit
        };
        self.overheated.then(|| {
            format!(
                "temperature {temperature} °C (limit {limit} °C; healthy again at {cool_enough} °C)"
            )
        })
    }

    /// Keeps the first sticky reason: it names the original fault.
    fn stick(&mut self, reason: String) {
        self.sticky.get_or_insert(reason);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(temperature: u32, dbe: u64) -> GpuMetrics {
        GpuMetrics {
            gpu_temp_celsius: Some(temperature),
            ecc_dbe_volatile_total: Some(dbe),
            ..GpuMetrics::default()
        }
    }

    fn reason(health: &GpuHealth) -> &str {
        match health {
            GpuHealth::Healthy => "",
            GpuHealth::Unhealthy { reason } => reason,
        }
    }

    const POLICY: HealthPolicy = HealthPolicy {
        temperature_limit_celsius: 85,
    };

    #[test]
    fn a_cool_answering_gpu_is_healthy() {
        let mut tracker = HealthTracker::default();
        assert_eq!(
            tracker.assess(&POLICY, Ok(&metrics(60, 0)), &[]),
            GpuHealth::Healthy
        );
    }

    #[test]
    fn a_silent_gpu_is_unhealthy_until_it_answers_again() {
        let mut tracker = HealthTracker::default();
        let lost = BackendError("GPU is lost".to_owned());
        let health = tracker.assess(&POLICY, Err(&lost), &[]);
        assert!(
            reason(&health).contains("NVML stopped answering"),
            "{health:?}"
        );
        assert!(reason(&health).contains("GPU is lost"), "{health:?}");
        assert_eq!(
            tracker.assess(&POLICY, Ok(&metrics(60, 0)), &[]),
            GpuHealth::Healthy
        );
    }

    #[test]
    fn double_bit_errors_present_at_start_are_the_baseline_and_new_ones_stick() {
        let mut tracker = HealthTracker::default();
        assert_eq!(
            tracker.assess(&POLICY, Ok(&metrics(60, 2)), &[]),
            GpuHealth::Healthy
        );
        let health = tracker.assess(&POLICY, Ok(&metrics(60, 3)), &[]);
        assert_eq!(
            reason(&health),
            "volatile double-bit ECC errors rose from 2 to 3"
        );
        // Still unhealthy on the next, unchanged reading.
        assert_eq!(tracker.assess(&POLICY, Ok(&metrics(60, 3)), &[]), health);
    }

    #[test]
    fn a_critical_xid_sticks_and_an_application_xid_does_not_count() {
        let mut tracker = HealthTracker::default();
        assert_eq!(
            tracker.assess(&POLICY, Ok(&metrics(60, 0)), &[13, 31, 43]),
            GpuHealth::Healthy
        );
        let health = tracker.assess(&POLICY, Ok(&metrics(60, 0)), &[79]);
        assert_eq!(reason(&health), "critical XID 79 raised by the driver");
        // A later fault does not hide the original one.
        let later = tracker.assess(&POLICY, Ok(&metrics(99, 0)), &[]);
        assert_eq!(reason(&later), "critical XID 79 raised by the driver");
    }

    #[test]
    fn every_listed_xid_is_critical() {
        for xid in CRITICAL_XIDS {
            let mut tracker = HealthTracker::default();
            let health = tracker.assess(&POLICY, Ok(&metrics(60, 0)), &[xid]);
            assert!(matches!(health, GpuHealth::Unhealthy { .. }), "XID {xid}");
        }
    }

    #[test]
    fn a_hot_gpu_recovers_only_once_it_has_cooled_by_the_margin() {
        let mut tracker = HealthTracker::default();
        assert_eq!(
            tracker.assess(&POLICY, Ok(&metrics(84, 0)), &[]),
            GpuHealth::Healthy
        );
        let hot = tracker.assess(&POLICY, Ok(&metrics(85, 0)), &[]);
        assert_eq!(
            reason(&hot),
            "temperature 85 °C (limit 85 °C; healthy again at 80 °C)"
        );
        // 81 °C is below the limit but within the margin: still unhealthy.
        assert!(matches!(
            tracker.assess(&POLICY, Ok(&metrics(81, 0)), &[]),
            GpuHealth::Unhealthy { .. }
        ));
        assert_eq!(
            tracker.assess(&POLICY, Ok(&metrics(80, 0)), &[]),
            GpuHealth::Healthy
        );
    }
}
