//! Which policy decides a round: Themis's auction, or one of the baselines the paper compares
//! against (§6.1). Every policy allocates through the same rounds and leases.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// The partial-allocation auction among the worst (1 - f) apps by rho.
    #[default]
    Themis,
    /// Ideal efficiency: the most placement-sensitive apps first, best-placed GPUs.
    Gandiva,
    /// Ideal fairness in service: least attained GPU service first (LAS).
    Tiresias,
    /// Ideal throughput: one GPU at a time to the app whose throughput grows most from it.
    Optimus,
    /// Ideal model quality: one GPU at a time to the app whose loss drops most from it.
    Slaq,
    /// Shortest remaining time first.
    Srtf,
    /// Shortest remaining service (GPU-time) first.
    Srsf,
    /// Gavel's finish-time fairness (OSDI'20): LP time fractions minimising the maximum
    /// projected rho, rounded into leases each round.
    GavelFtf,
    /// OEF, non-cooperative (Middleware'24): every app the same normalised throughput over the
    /// GPU types, the most in total (an LP), rounded into leases each round.
    Oef,
    /// Shockwave (NSDI'23): a market over a window of rounds, each app's utility following its
    /// forecast speed-ups, weighted by finish-time fairness; the first round applied.
    Shockwave,
    /// Synergy-Tune (OSDI'22) on SRTF: SRTF's GPUs, placed where each job's best-case CPUs and
    /// memory fit (`baselines/tune.rs`).
    SynergySrtf,
    /// Synergy-Tune on finish-time fairness: Gavel-FTF's GPUs, placed the same way.
    SynergyFtf,
}

impl Policy {
    pub const ALL: [Policy; 12] = [
        Policy::Themis,
        Policy::Gandiva,
        Policy::Tiresias,
        Policy::Optimus,
        Policy::Slaq,
        Policy::Srtf,
        Policy::Srsf,
        Policy::GavelFtf,
        Policy::Oef,
        Policy::Shockwave,
        Policy::SynergySrtf,
        Policy::SynergyFtf,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::Themis => "themis",
            Policy::Gandiva => "gandiva",
            Policy::Tiresias => "tiresias",
            Policy::Optimus => "optimus",
            Policy::Slaq => "slaq",
            Policy::Srtf => "srtf",
            Policy::Srsf => "srsf",
            Policy::GavelFtf => "gavel-ftf",
            Policy::Oef => "oef",
            Policy::Shockwave => "shockwave",
            Policy::SynergySrtf => "synergy-srtf",
            Policy::SynergyFtf => "synergy-ftf",
        }
    }

    /// Whether the policy places jobs by their CPU and memory demands (Synergy-Tune), and so
    /// needs each machine's resources and holders in its round.
    pub fn packs_cpus_and_memory(self) -> bool {
        matches!(self, Policy::SynergySrtf | Policy::SynergyFtf)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy {given:?}; choose one of {known}")]
pub struct UnknownPolicy {
    pub given: String,
    pub known: String,
}

impl FromStr for Policy {
    type Err = UnknownPolicy;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|policy| policy.name() == name)
            .ok_or_else(|| UnknownPolicy {
                given: name.to_owned(),
                known: Policy::ALL.map(Policy::name).join(", "),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_choices() {
        for policy in Policy::ALL {
            assert_eq!(policy.name().parse::<Policy>(), Ok(policy));
            let json = serde_json::to_string(&policy).expect("serialisable");
            assert_eq!(json, format!("\"{}\"", policy.name()));
        }
        let error = "fifo".parse::<Policy>().expect_err("not a policy");
        assert!(error.to_string().contains("themis, gandiva"), "{error}");
    }
}
