//! GPU hosts report each GPU's product name as NVML gives it (`NVIDIA H100 80GB HBM3`,
//! `Tesla V100-SXM2-16GB`); throughput tables, cluster files and the baselines speak of GPU
//! types (`h100`, `v100`). This is the one mapping from the first to the second.
//!
//! A name maps to the type that appears in it as a word of its own (letters and digits between
//! separators, case ignored), so `NVIDIA A100-SXM4-80GB` is `a100` while `NVIDIA A10` is `a10`:
//! memory size, form factor and board revision do not change a GPU's type. A name naming no
//! known type is refused rather than guessed, since a guessed type would silently take another
//! type's speeds in every app's table; a new model is one line in [`GPU_TYPES`].

/// The GPU types hosts may report, as the words their product names carry (data-centre GPUs
/// from Kepler to Blackwell, and the workstation Ampere boards).
pub const GPU_TYPES: &[&str] = &[
    "k80", "m60", "p4", "p40", "p100", "v100", "t4", "a2", "a10", "a10g", "a16", "a30", "a40",
    "a100", "a800", "a4000", "a5000", "a6000", "l4", "l40", "l40s", "h100", "h800", "h200",
    "gh200", "b100", "b200", "gb200",
];

/// A product name that names none of [`GPU_TYPES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "GPU name {name:?} names no GPU type Agora knows ({}); add the model to \
     agora_market::gpu_models::GPU_TYPES",
    GPU_TYPES.join(", ")
)]
pub struct UnknownGpuModel {
    pub name: String,
}

/// The GPU type of the product NVML calls `name`.
pub fn gpu_type_of(name: &str) -> Result<&'static str, UnknownGpuModel> {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .find_map(|word| {
            GPU_TYPES
                .iter()
                .find(|gpu_type| gpu_type.eq_ignore_ascii_case(word))
        })
        .copied()
        .ok_or_else(|| UnknownGpuModel {
            name: name.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_product_names_map_to_their_types() {
        let names = [
            ("NVIDIA H100 80GB HBM3", "h100"),
            ("NVIDIA H100 PCIe", "h100"),
            ("NVIDIA H200", "h200"),
            ("NVIDIA GH200 480GB", "gh200"),
            ("NVIDIA A100-SXM4-80GB", "a100"),
            ("NVIDIA A100-PCIE-40GB", "a100"),
            ("NVIDIA A10", "a10"),
            ("NVIDIA A10G", "a10g"),
            ("NVIDIA L40S", "l40s"),
            ("NVIDIA RTX A6000", "a6000"),
            ("Tesla V100-SXM2-16GB", "v100"),
            ("Tesla P100-PCIE-16GB", "p100"),
            ("Tesla K80", "k80"),
            ("Tesla T4", "t4"),
        ];
        for (name, gpu_type) in names {
            assert_eq!(gpu_type_of(name), Ok(gpu_type), "{name}");
        }
    }

    #[test]
    fn a_name_naming_no_known_type_is_refused_with_the_name() {
        for name in ["NVIDIA GeForce RTX 4090", "", "A1000", "NVIDIA"] {
            let error = gpu_type_of(name).expect_err("unknown");
            assert_eq!(error.name, name);
            assert!(error.to_string().contains("h100"), "{error}");
        }
    }

    #[test]
    fn types_are_lower_case_words_listed_once() {
        let mut seen = std::collections::BTreeSet::new();
        for gpu_type in GPU_TYPES {
            assert!(gpu_type
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()));
            assert!(seen.insert(gpu_type), "{gpu_type} twice");
        }
    }
}
