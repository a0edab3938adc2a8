//! The model catalogue: the models of Themis Table 4 (the mix the generators draw from) and
//! the models of Tiresias traces, each with a serial iteration time range and a placement
//! sensitivity class that gives its placement slowdowns.
//!
//! Sensitivity classes follow Themis §3.1.2 and Table 1: VGG-like models with very many
//! parameters spend long on gradient exchange and lose throughput when spread out (VGG16 runs
//! 22% slower on 4 GPUs across 2 servers than on 1 server: 80.4 vs 103.6 images/s), while
//! Inception-v3 does not care (243 vs 242 images/s). Unknown model names get
//! [`DEFAULT_SLOWDOWN`].

use agora_market::app::PlacementSlowdown;
use agora_market::resources::Sensitivity as ResourceProfile;
use agora_market::throughput::Throughput;
use serde::{Deserialize, Serialize};

/// How a model's iterations slow down when its GPUs are spread out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sensitivity {
    /// Large-parameter models (VGG, AlexNet, LSTM language models, GNMT): slowdowns 1.0 / 1.1 /
    /// 1.5 / 2.0 for same slot / machine / rack / across racks.
    NetworkIntensive,
    /// Compute-bound models (Inception, ResNet, Transformer, speech): 1.0 / 1.0 / 1.05 / 1.1.
    ComputeIntensive,
}

impl Sensitivity {
    pub fn slowdown(self) -> PlacementSlowdown {
        match self {
            Sensitivity::NetworkIntensive => NETWORK_INTENSIVE_SLOWDOWN,
            Sensitivity::ComputeIntensive => COMPUTE_INTENSIVE_SLOWDOWN,
        }
    }
}

pub const NETWORK_INTENSIVE_SLOWDOWN: PlacementSlowdown = PlacementSlowdown {
    same_slot: 1.0,
    same_machine: 1.1,
    same_rack: 1.5,
    cross_rack: 2.0,
};

pub const COMPUTE_INTENSIVE_SLOWDOWN: PlacementSlowdown = PlacementSlowdown {
    same_slot: 1.0,
    same_machine: 1.0,
    same_rack: 1.05,
    cross_rack: 1.1,
};

/// Slowdowns of a model the catalogue does not know: Themis footnote 3's crude estimates
/// (1.0 / 1.0 / 1.1 / 1.3, the engine's `PlacementSlowdown::default()`), between the two
/// classes, rather than guessing a class.
pub const DEFAULT_SLOWDOWN: PlacementSlowdown = PlacementSlowdown {
    same_slot: 1.0,
    same_machine: 1.0,
    same_rack: 1.1,
    cross_rack: 1.3,
};

/// Table 4's three domains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Cv,
    Nlp,
    Speech,
}

/// Table 4's mix of domains: CV 10%, NLP 60%, speech 30%. Within a domain the generators
/// draw each of Table 4's models with equal probability.
pub const CATEGORY_MIX: [(Category, f64); 3] = [
    (Category::Cv, 0.10),
    (Category::Nlp, 0.60),
    (Category::Speech, 0.30),
];

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelSpec {
    /// Canonical name (Table 4's, lower case; Tiresias's for models only Tiresias uses).
    pub name: &'static str,
    /// Other spellings found in traces (matched after normalisation, see [`lookup`]).
    pub aliases: &'static [&'static str],
    pub category: Category,
    pub sensitivity: Sensitivity,
    /// Seconds per iteration on one GPU, (low, high): generated jobs draw theirs uniformly in
    /// this range (hyper-parameters such as batch size move it, Themis footnote 4).
    /// Illustrative K80/P100-class values, not measurements; generated jobs get their GPU
    /// time first, so these only set how many iterations that time is cut into.
    pub serial_iteration_seconds: (f64, f64),
    /// Whether the model is in Table 4, i.e. drawn by the generators.
    pub in_table4: bool,
}

impl ModelSpec {
    pub fn slowdown(&self) -> PlacementSlowdown {
        self.sensitivity.slowdown()
    }
}

/// The model families whose single-GPU throughput Gavel measured on K80, P100 and V100 GPUs
/// (Narayanan et al., OSDI'20): `scheduler/simulation_throughputs.json` of
/// stanford-futuredata/gavel at commit c4fa40097339e9608ab71fd64c8bdea96a5e4a4c, the
/// isolated (`null`) throughput of one worker. Each catalogue model takes the family nearest
/// to its architecture ([`measured_family`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MeasuredFamily {
    /// ResNet-50 on ImageNet, batch size 64: 0.619 / 2.619 / 4.395 iterations/s.
    ResNet50,
    /// ResNet-18 on CIFAR-10, batch size 64: 7.052 / 22.305 / 24.093 iterations/s.
    ResNet18,
    /// LSTM language model on Wikitext-2, batch size 20: 17.142 / 58.173 / 64.742 iterations/s.
    LanguageModel,
    /// Transformer on Multi30k, batch size 64: 1.752 / 5.092 / 8.618 iterations/s.
    Transformer,
    /// CycleGAN on monet2photo: 0.505 / 2.403 / 4.426 iterations/s.
    CycleGan,
}

impl MeasuredFamily {
    /// Iterations per second on one K80, P100 and V100 (Gavel's measurements, rounded to
    /// three decimals).
    pub fn iterations_per_second(self) -> [(&'static str, f64); 3] {
        let [k80, p100, v100] = match self {
            Self::ResNet50 => [0.619, 2.619, 4.395],
            Self::ResNet18 => [7.052, 22.305, 24.093],
            Self::LanguageModel => [17.142, 58.173, 64.742],
            Self::Transformer => [1.752, 5.092, 8.618],
            Self::CycleGan => [0.505, 2.403, 4.426],
        };
        [("k80", k80), ("p100", p100), ("v100", v100)]
    }

    /// Speeds relative to the K80 (1.0): the catalogue's serial iteration times are
    /// K80-class.
    pub fn throughput(self) -> Throughput {
        let measured = self.iterations_per_second();
        let k80 = measured[0].1;
        Throughput(
            measured
                .into_iter()
                .map(|(gpu_type, rate)| (gpu_type.to_owned(), rate / k80))
                .collect(),
        )
    }
}

/// The measured family nearest a catalogue model: convolutional image models with ResNet-50
/// (ResNets, Inceptions, GoogLeNet) or, for the plain stacks of AlexNet and VGG, ResNet-18;
/// recurrent models (LSTM language models, GNMT, BiDAF, DeepSpeech2) with the LSTM language
/// model; the Transformer with itself; WaveNet, a convolutional generative model, with
/// CycleGAN. Unknown models take ResNet-50, the middle of the measured spread.
pub fn measured_family(model: &str) -> MeasuredFamily {
    let Some(spec) = lookup(model) else {
        return MeasuredFamily::ResNet50;
    };
    match spec.name {
        "alexnet" | "vgg11" | "vgg16" | "vgg19" => MeasuredFamily::ResNet18,
        "bi-att-flow" | "langmodel" | "gnmt" | "deepspeech" => MeasuredFamily::LanguageModel,
        "transformer" => MeasuredFamily::Transformer,
        "wavenet" => MeasuredFamily::CycleGan,
        _ => MeasuredFamily::ResNet50,
    }
}

/// The default CPU and memory profile of `model`, by Synergy's task categories (Mohan et al.,
/// OSDI'22, Figure 2a and §2.1), with speed 1.0 at Synergy's GPU-proportional share (3 CPU
/// cores and 62.5 GiB per GPU), where its derived traces' durations are defined
/// (`docs/mechanism.md` has the table and what in it is measured and what is ours).
pub fn resource_profile_of(model: &str) -> ResourceProfile {
    let (cpus, memory): (&[[f64; 2]], &[[f64; 2]]) = match lookup(model).map(|spec| spec.name) {
        Some("alexnet") => (
            &[[1.0, 0.33], [3.0, 1.0], [6.0, 1.9], [9.0, 2.6], [12.0, 3.1]],
            DATA_HUNGRY_MEMORY,
        ),
        Some("wavenet" | "deepspeech") => (
            &[[1.0, 0.4], [3.0, 1.0], [6.0, 1.8], [9.0, 2.3]],
            DATA_HUNGRY_MEMORY,
        ),
        Some("bi-att-flow" | "langmodel" | "gnmt" | "transformer") => {
            (&[[1.0, 1.0]], &[[20.0, 1.0]])
        }
        _ => (
            &[[1.0, 0.5], [3.0, 1.0], [6.0, 1.4], [9.0, 1.5]],
            DATA_HUNGRY_MEMORY,
        ),
    };
    ResourceProfile {
        cpus_per_gpu: cpus.to_vec(),
        memory_gib_per_gpu: memory.to_vec(),
    }
}

/// Image and speech models' speed by cache memory per GPU: twice as fast with the whole
/// server's 500 GB as with 62.5 GB (ResNet-18, §2.1), never the bottleneck at 3 CPUs.
const DATA_HUNGRY_MEMORY: &[[f64; 2]] = &[[20.0, 0.5], [62.5, 1.5], [500.0, 3.0]];

/// The default throughput table of `model` (Gavel's measurements, [`MeasuredFamily`]).
pub fn throughput_of(model: &str) -> Throughput {
    measured_family(model).throughput()
}

const fn model(
    name: &'static str,
    aliases: &'static [&'static str],
    category: Category,
    sensitivity: Sensitivity,
    serial_iteration_seconds: (f64, f64),
    in_table4: bool,
) -> ModelSpec {
    ModelSpec {
        name,
        aliases,
        category,
        sensitivity,
        serial_iteration_seconds,
        in_table4,
    }
}

use Category::{Cv, Nlp, Speech};
use Sensitivity::{ComputeIntensive, NetworkIntensive};

/// Every model the catalogue knows: Table 4's eleven first, then the other models of
/// Tiresias traces.
pub const CATALOGUE: &[ModelSpec] = &[
    // Table 4, CV (10%).
    model(
        "inception-v3",
        &["inception3", "inceptionv3"],
        Cv,
        ComputeIntensive,
        (0.4, 0.9),
        true,
    ),
    model("alexnet", &[], Cv, NetworkIntensive, (0.1, 0.3), true),
    model(
        "resnet50",
        &["resnet-50"],
        Cv,
        ComputeIntensive,
        (0.3, 0.7),
        true,
    ),
    model("vgg16", &[], Cv, NetworkIntensive, (0.5, 1.1), true),
    model("vgg19", &[], Cv, NetworkIntensive, (0.6, 1.3), true),
    // Table 4, NLP (60%).
    model(
        "bi-att-flow",
        &["bidaf"],
        Nlp,
        ComputeIntensive,
        (0.5, 1.5),
        true,
    ),
    model(
        "langmodel",
        &["lm", "lstm"],
        Nlp,
        NetworkIntensive,
        (0.1, 0.4),
        true,
    ),
    model("gnmt", &[], Nlp, NetworkIntensive, (0.4, 1.0), true),
    model("transformer", &[], Nlp, ComputeIntensive, (0.3, 0.8), true),
    // Table 4, speech (30%).
    model("wavenet", &[], Speech, ComputeIntensive, (1.0, 3.0), true),
    model(
        "deepspeech",
        &["deepspeech2"],
        Speech,
        ComputeIntensive,
        (0.5, 1.5),
        true,
    ),
    // Other models of Tiresias traces (CV), same rule: VGGs are network-intensive, the
    // Inception / ResNet / GoogLeNet families compute-intensive.
    model("vgg11", &[], Cv, NetworkIntensive, (0.4, 0.9), false),
    model(
        "inception-v4",
        &["inception4", "inceptionv4"],
        Cv,
        ComputeIntensive,
        (0.6, 1.3),
        false,
    ),
    model(
        "resnet101",
        &["resnet-101"],
        Cv,
        ComputeIntensive,
        (0.5, 1.1),
        false,
    ),
    model(
        "resnet152",
        &["resnet-152"],
        Cv,
        ComputeIntensive,
        (0.7, 1.5),
        false,
    ),
    model(
        "googlenet",
        &["inception-v1", "inception1"],
        Cv,
        ComputeIntensive,
        (0.2, 0.5),
        false,
    ),
];

/// Lower case without `-`, `_`, `.` or spaces: `Inception_V3` and `inception-v3` match.
fn normalise(name: &str) -> String {
    name.chars()
        .filter(|c| !matches!(c, '-' | '_' | '.' | ' '))
        .flat_map(char::to_lowercase)
        .collect()
}

/// The catalogue entry for a model name or alias, ignoring case, `-`, `_`, `.` and spaces.
pub fn lookup(name: &str) -> Option<&'static ModelSpec> {
    let wanted = normalise(name);
    CATALOGUE.iter().find(|spec| {
        normalise(spec.name) == wanted
            || spec.aliases.iter().any(|alias| normalise(alias) == wanted)
    })
}

/// Placement slowdowns of a model: its class's, or [`DEFAULT_SLOWDOWN`] if it is unknown.
pub fn slowdown_of(name: &str) -> PlacementSlowdown {
    lookup(name).map_or(DEFAULT_SLOWDOWN, ModelSpec::slowdown)
}

/// Table 4's models of one domain, in catalogue order.
pub fn table4_models(category: Category) -> impl Iterator<Item = &'static ModelSpec> {
    CATALOGUE
        .iter()
        .filter(move |spec| spec.in_table4 && spec.category == category)
}

/// Probability that an app drawn from Table 4's mix trains a network-intensive model
/// (CV 0.1 x 3/5 + NLP 0.6 x 2/4 + speech 0 = 0.36).
pub fn table4_network_intensive_fraction() -> f64 {
    CATEGORY_MIX
        .iter()
        .map(|&(category, share)| {
            let models: Vec<_> = table4_models(category).collect();
            let network = models
                .iter()
                .filter(|spec| spec.sensitivity == Sensitivity::NetworkIntensive)
                .count();
            share * network as f64 / models.len() as f64
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_aliases_resolve() {
        assert_eq!(
            lookup("Inception_V3").map(|spec| spec.name),
            Some("inception-v3")
        );
        assert_eq!(
            lookup("inception3").map(|spec| spec.name),
            Some("inception-v3")
        );
        assert_eq!(
            lookup("inception4").map(|spec| spec.name),
            Some("inception-v4")
        );
        assert!(lookup("no-such-model").is_none());
        assert_eq!(slowdown_of("no-such-model"), PlacementSlowdown::default());
    }

    #[test]
    fn table4_has_eleven_models_and_a_36_percent_network_share() {
        assert_eq!(CATALOGUE.iter().filter(|spec| spec.in_table4).count(), 11);
        assert!((table4_network_intensive_fraction() - 0.36).abs() < 1e-12);
        let shares: f64 = CATEGORY_MIX.iter().map(|&(_, share)| share).sum();
        assert!((shares - 1.0).abs() < 1e-12);
    }

    #[test]
    fn catalogue_values_are_sane() {
        for spec in CATALOGUE {
            let (low, high) = spec.serial_iteration_seconds;
            assert!(low > 0.0 && low <= high, "{}", spec.name);
            let slowdown = spec.slowdown();
            assert!(slowdown.same_slot >= 1.0 && slowdown.cross_rack >= slowdown.same_rack);
        }
    }
}
