//! Numbers as error messages show them.

use std::fmt;

/// A number as a message shows it: as Rust writes it (`-1`, `0.5`, `NaN`) in the range people
/// type, and in scientific notation (`1e300`, `-2.5e-12`) outside it, where Rust's plain form
/// runs to hundreds of digits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shown(pub f64);

impl fmt::Display for Shown {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let magnitude = self.0.abs();
        if magnitude == 0.0 || !magnitude.is_finite() || (1e-6..1e16).contains(&magnitude) {
            write!(formatter, "{}", self.0)
        } else {
            write!(formatter, "{:e}", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Shown;

    #[test]
    fn writes_typed_numbers_as_typed() {
        for (value, shown) in [
            (-1.0, "-1"),
            (0.0, "0"),
            (0.5, "0.5"),
            (1e-6, "0.000001"),
            (123_456.75, "123456.75"),
            (9e15, "9000000000000000"),
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(Shown(value).to_string(), shown, "{value:?}");
        }
    }

    #[test]
    fn writes_extreme_magnitudes_in_scientific_notation() {
        for (value, shown) in [
            (1e300, "1e300"),
            (-1e16, "-1e16"),
            (f64::MAX, "1.7976931348623157e308"),
            (2.5e-12, "2.5e-12"),
            (-5e-324, "-5e-324"),
        ] {
            assert_eq!(Shown(value).to_string(), shown, "{value:?}");
        }
    }
}
