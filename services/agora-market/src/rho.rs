//! Finish-time fairness values and the valuations the auction derives from them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::shown::Shown;

/// A finish-time fairness value rho = T_shared / T_independent: finite and strictly positive.
/// Smaller is better; rho <= 1 means the app has its sharing incentive.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Rho(f64);

#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("rho must be a finite number greater than zero, got {}", Shown(*.0))]
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

/// How rho is spread over the apps at one moment. An app holding no GPU has an unbounded rho:
/// it is counted apart, and the largest rho and Jain's index are over the finite ones (`None`
/// when there are none).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RhoSpread {
    pub starving_apps: usize,
    pub max_rho: Option<f64>,
    pub jains_index: Option<f64>,
}

impl RhoSpread {
    /// From each app's rho (`None`: starving).
    pub fn of(rhos: impl IntoIterator<Item = Option<f64>>) -> Self {
        let (finite, starving): (Vec<_>, Vec<_>) = rhos.into_iter().partition(Option::is_some);
        let finite: Vec<f64> = finite.into_iter().flatten().collect();
        Self {
            starving_apps: starving.len(),
            max_rho: finite.iter().copied().reduce(f64::max),
            jains_index: (!finite.is_empty()).then(|| jains_index(&finite)),
        }
    }
}

/// Jain's index (sum x)^2 / (n sum x^2); 1 for an empty or all-zero set.
pub fn jains_index(values: &[f64]) -> f64 {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|value| value * value).sum();
    if squares == 0.0 {
        1.0
    } else {
        sum * sum / (values.len() as f64 * squares)
    }
}

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

    #[test]
    fn starving_apps_are_counted_apart_from_the_rho_spread() {
        let spread = RhoSpread::of([Some(1.0), None, Some(3.0)]);
        assert_eq!(spread.starving_apps, 1);
        assert_eq!(spread.max_rho, Some(3.0));
        assert!((spread.jains_index.expect("two finite rhos") - 0.8).abs() < 1e-12);
        assert_eq!(
            RhoSpread::of([None]),
            RhoSpread {
                starving_apps: 1,
                ..RhoSpread::default()
            }
        );
    }

    #[test]
    fn jains_index_is_one_for_equal_values_and_one_over_n_for_a_single_winner() {
        assert_eq!(jains_index(&[2.0, 2.0, 2.0]), 1.0);
        assert!((jains_index(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
    }
}
