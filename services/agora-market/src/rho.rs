//! Finish-time fairness values and the valuations the auction derives from them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A finish-time fairness value rho = T_shared / T_independent: finite and strictly positive.
/// Smaller is better; rho <= 1 means the app has its sharing incentive.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Rho(f64);

#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("rho must be a finite number greater than zero, got {0}")]
pub struct InvalidRho(pub f64);

impl Rho {
    pub fn new(value: f64) -> Result<Self, InvalidRho> {
        if value.is_finite() && value > 0.0 {
            Ok(Self(value))
        } else {
            Err(InvalidRho(value))
        }
    }

    pub fn get(self) -> f64 {
        self.0
    }

    /// ln(1/rho): the log-valuation the proportional-fair objective sums.
    pub fn log_valuation(self) -> f64 {
        -self.0.ln()
    }
}

impl TryFrom<f64> for Rho {
    type Error = InvalidRho;
    fn try_from(value: f64) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<Rho> for f64 {
    fn from(rho: Rho) -> f64 {
        rho.0
    }
}

impl fmt::Display for Rho {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.4}", self.0)
    }
}

/// rho of an app if it gets nothing new this round. `Starving` (an app that holds no GPU has
/// an unbounded finish time) is written `null` in JSON.
pub type RhoOld = Option<Rho>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_non_finite_and_non_positive_values() {
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert!(Rho::new(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(Rho::new(2.5).map(Rho::get), Ok(2.5));
    }

    #[test]
    fn deserialisation_validates() {
        assert!(serde_json::from_str::<Rho>("-3").is_err());
        assert_eq!(
            serde_json::from_str::<Rho>("0.5").map(Rho::get).ok(),
            Some(0.5)
        );
    }
}
