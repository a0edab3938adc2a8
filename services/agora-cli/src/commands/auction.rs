//! `agora auction solve [FILE|-] [--timings]`: runs one partial-allocation auction on a JSON
//! instance and prints its outcome as JSON (and, with `--timings`, where the time went).

use std::collections::HashMap;
use std::fmt;
use std::io::{self, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agora_market::app::AppId;
use agora_market::auction::{
    AppBid, Auction, AuctionError, AuctionOutcome, BidEntry, Offer, PaymentStats, PfStats,
};
use agora_market::rho::{Rho, RhoOld};
use agora_market::shown::Shown;
use agora_market::throughput::{rho_at_speed, Throughput};
use agora_market::topology::GpuId;
use clap::{Args, Subcommand};
use serde::Deserialize;

use super::{EXIT_FAILURE, EXIT_INVALID_INPUT};

#[derive(Debug, Subcommand)]
pub enum AuctionCommand {
    /// Solve one auction instance and print its outcome as JSON.
    ///
    /// Reads {"gpus": [...], "apps": [...], "seed": N} from FILE, or from standard input when
    /// FILE is `-` or absent; `seed` is optional and defaults to 0. GPUs may have types
    /// ({"id", "type"}) and apps throughput tables, which price each bid at its bundle's
    /// slowest GPU. Prints {"pf", "pf_gpus",
    /// "c", "allocation", "unallocated"} on standard output. Invalid input prints one
    /// `error: ...` line on standard error and exits with code 2. README.md documents both
    /// formats. With --timings, the time of each phase goes to standard error.
    Solve(SolveArgs),
}

#[derive(Debug, Args)]
pub struct SolveArgs {
    /// The auction instance as JSON; `-` or nothing reads standard input.
    #[arg(value_name = "FILE|-")]
    input: Option<PathBuf>,
    /// Print the time of each phase (validation, PF solve, payments certified vs solved,
    /// rounding) on standard error.
    #[arg(long)]
    timings: bool,
}

impl AuctionCommand {
    pub fn run(self) -> Result<(), SolveError> {
        match self {
            Self::Solve(args) => solve(&args),
        }
    }
}

/// An auction instance as the command reads it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuctionInstance {
    /// The offered GPUs. Without topology, each is its own slot, machine, rack and class.
    gpus: Vec<OfferedGpuSpec>,
    apps: Vec<AppSpec>,
    /// Seeds the random rounding of fractional GPU shares; the same instance and seed always
    /// give the same outcome.
    #[serde(default)]
    seed: u64,
}

/// An offered GPU: its id, or its id and type.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OfferedGpuSpec {
    Untyped(GpuId),
    Typed(TypedGpu),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TypedGpu {
    id: GpuId,
    #[serde(rename = "type")]
    gpu_type: String,
}

impl OfferedGpuSpec {
    fn id(&self) -> &GpuId {
        match self {
            Self::Untyped(id) | Self::Typed(TypedGpu { id, .. }) => id,
        }
    }

    fn gpu_type(&self) -> Option<&str> {
        match self {
            Self::Untyped(_) => None,
            Self::Typed(gpu) => Some(&gpu.gpu_type),
        }
    }
}

/// An app's bid as the command reads it: the engine's bid, plus what prices it on typed GPUs.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppSpec {
    app: AppId,
    /// Required (`null` for starving): a forgotten key must not read as "starving".
    #[serde(deserialize_with = "Option::deserialize")]
    rho_old: RhoOld,
    /// Each entry's rho at speed 1 (on typed GPUs; as given otherwise).
    bids: Vec<BidEntry>,
    /// The app's speed per GPU type; empty: speed 1 on every type.
    #[serde(default)]
    throughput: Throughput,
    /// The part of every rho already spent, (now - arrival) / T_id, which no speed shortens.
    #[serde(default)]
    rho_elapsed: f64,
}

/// Where the instance comes from, for reading it and for naming it in errors.
#[derive(Debug, Clone)]
pub enum Source {
    Stdin,
    File(PathBuf),
}

impl Source {
    fn from_arg(input: Option<&PathBuf>) -> Self {
        match input {
            Some(path) if path.as_os_str() != "-" => Self::File(path.clone()),
            _ => Self::Stdin,
        }
    }

    fn read(&self) -> io::Result<Vec<u8>> {
        match self {
            Self::Stdin => {
                let mut bytes = Vec::new();
                io::stdin().lock().read_to_end(&mut bytes)?;
                Ok(bytes)
            }
            Self::File(path) => std::fs::read(path),
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stdin => f.write_str("<stdin>"),
            Self::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Typed GPUs and throughput tables that do not fit together; the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TypeError(String);

/// What can go wrong in `agora auction solve`. Each message names the input; the cause (which
/// carries the line and column, or the app and bid entry) follows it as the error's source.
#[derive(Debug, thiserror::Error)]
pub enum SolveError {
    #[error("no input: give a FILE, or pipe the instance into standard input (`-`)")]
    NoInput,
    #[error("{source_name}: the input is empty; expected an auction instance (JSON)")]
    Empty { source_name: Source },
    #[error("cannot read {source_name}")]
    Read {
        source_name: Source,
        #[source]
        cause: io::Error,
    },
    /// Not JSON at all (syntax error, truncated input, NaN, ...).
    #[error("{source_name}: invalid JSON")]
    Syntax {
        source_name: Source,
        #[source]
        cause: serde_json::Error,
    },
    /// JSON that is not an auction instance (wrong or missing field, rho <= 0, ...).
    #[error("{source_name}: invalid auction instance{at}")]
    Instance {
        source_name: Source,
        /// ` at `apps[0].rho_old`` for a bad value inside the instance, empty at its top.
        at: FieldPath,
        #[source]
        cause: serde_json::Error,
    },
    /// GPU types or throughput tables that cannot price the bids (a type missing from a
    /// table, a speed <= 0, some GPUs typed and others not, ...).
    #[error("{source_name}: invalid GPU types")]
    Types {
        source_name: Source,
        #[source]
        cause: TypeError,
    },
    /// A well-formed instance that the engine rejects (unknown GPU in a bundle, duplicate
    /// app, ...).
    #[error("{source_name}: invalid auction")]
    Auction {
        source_name: Source,
        #[source]
        cause: AuctionError,
    },
    /// The engine could not solve a valid instance.
    #[error("{source_name}: the auction could not be solved")]
    Solver {
        source_name: Source,
        #[source]
        cause: AuctionError,
    },
    #[error("cannot write the outcome")]
    Write(#[source] io::Error),
}

impl SolveError {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::NoInput
            | Self::Read { .. }
            | Self::Empty { .. }
            | Self::Syntax { .. }
            | Self::Instance { .. }
            | Self::Types { .. }
            | Self::Auction { .. } => EXIT_INVALID_INPUT,
            Self::Solver { .. } | Self::Write(_) => EXIT_FAILURE,
        }
    }
}

fn solve(args: &SolveArgs) -> Result<(), SolveError> {
    let source = Source::from_arg(args.input.as_ref());
    if args.input.is_none() && io::stdin().is_terminal() {
        return Err(SolveError::NoInput);
    }
    let instance = read_instance(&source)?;
    let (offer, bids) = priced_auction(&instance).map_err(|cause| SolveError::Types {
        source_name: source.clone(),
        cause,
    })?;
    let (outcome, timings) =
        solve_instance(&offer, &bids, instance.seed).map_err(|cause| match cause {
            AuctionError::Solver { .. } => SolveError::Solver {
                source_name: source.clone(),
                cause,
            },
            _ => SolveError::Auction {
                source_name: source.clone(),
                cause,
            },
        })?;
    if args.timings {
        eprint!("{timings}");
    }
    write_outcome(&outcome)
}

fn read_instance(source: &Source) -> Result<AuctionInstance, SolveError> {
    let bytes = source.read().map_err(|cause| SolveError::Read {
        source_name: source.clone(),
        cause,
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(SolveError::Empty {
            source_name: source.clone(),
        });
    }
    let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(&mut deserializer)
        .map_err(|error| (FieldPath::of(error.path()), error.into_inner()))
        .and_then(|instance| {
            // Nothing but whitespace may follow the instance.
            deserializer
                .end()
                .map(|()| instance)
                .map_err(|cause| (FieldPath(None), cause))
        })
        .map_err(|(at, cause)| {
            let source_name = source.clone();
            if cause.is_data() {
                SolveError::Instance {
                    source_name,
                    at,
                    cause,
                }
            } else {
                SolveError::Syntax { source_name, cause }
            }
        })
}

/// Where in the instance a bad value is (`apps[0].rho_old`); `None` for the instance itself.
#[derive(Debug)]
pub struct FieldPath(Option<String>);

impl FieldPath {
    /// serde_path_to_error writes the instance itself as `.`.
    fn of(path: &serde_path_to_error::Path) -> Self {
        let path = path.to_string();
        Self((path != ".").then_some(path))
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(path) => write!(f, " at `{path}`"),
            None => Ok(()),
        }
    }
}

/// The offer and the bids the auction sees. On typed GPUs each entry is priced as the engine's
/// job model does: the app runs a bundle at the speed of its slowest GPU, so the remaining part
/// of the entry's rho (at speed 1) is divided by that speed. Untyped instances pass unchanged.
fn priced_auction(instance: &AuctionInstance) -> Result<(Offer, Vec<AppBid>), TypeError> {
    let offer = Offer::without_topology(instance.gpus.iter().map(|gpu| gpu.id().clone()));
    let type_of = gpu_types(&instance.gpus)?;
    let mut types: Vec<&str> = type_of.values().copied().collect();
    types.sort_unstable();
    types.dedup();
    let bids = instance
        .apps
        .iter()
        .enumerate()
        .map(|(index, app)| {
            let field = format!("apps[{index}]");
            if type_of.is_empty() && (!app.throughput.is_empty() || app.rho_elapsed != 0.0) {
                return Err(TypeError(format!(
                    "{field}: `throughput` and `rho_elapsed` price typed GPUs, and no GPU has \
                     a type"
                )));
            }
            app.throughput
                .validate()
                .and_then(|()| app.throughput.check_covers_types(&types))
                .map_err(|reason| TypeError(format!("{field}.{reason}")))?;
            priced_bid(app, &field, &type_of)
        })
        .collect::<Result<_, _>>()?;
    Ok((offer, bids))
}

/// Each GPU's type; empty when no GPU has one. Either every GPU has a non-empty type or none.
fn gpu_types(gpus: &[OfferedGpuSpec]) -> Result<HashMap<&GpuId, &str>, TypeError> {
    if gpus.iter().all(|gpu| gpu.gpu_type().is_none()) {
        return Ok(HashMap::new());
    }
    gpus.iter()
        .enumerate()
        .map(|(index, gpu)| match gpu.gpu_type() {
            Some(gpu_type) if !gpu_type.trim().is_empty() => Ok((gpu.id(), gpu_type)),
            Some(_) => Err(TypeError(format!("gpus[{index}].type must not be empty"))),
            None => Err(TypeError(format!(
                "gpus[{index}] has no type; when one GPU has a type, give every GPU one \
                 ({{\"id\": ..., \"type\": ...}})"
            ))),
        })
        .collect()
}

/// `app`'s bid with each entry priced at its bundle's slowest GPU (speed 1 on untyped GPUs
/// and for GPUs the offer does not have, which the auction then refuses by name).
fn priced_bid(
    app: &AppSpec,
    field: &str,
    type_of: &HashMap<&GpuId, &str>,
) -> Result<AppBid, TypeError> {
    let spent = app.rho_elapsed;
    if !(spent.is_finite() && spent >= 0.0) {
        return Err(TypeError(format!(
            "{field}.rho_elapsed must be a finite number >= 0, got {}",
            Shown(spent)
        )));
    }
    let bids = app
        .bids
        .iter()
        .enumerate()
        .map(|(entry, bid)| {
            let at_unit_speed = bid.rho.get();
            if spent >= at_unit_speed {
                return Err(TypeError(format!(
                    "{field}.bids[{entry}].rho ({at_unit_speed}) must exceed \
                     {field}.rho_elapsed ({spent}): the bundle has time left to run"
                )));
            }
            let slowest = bid
                .gpus
                .iter()
                .filter_map(|gpu| type_of.get(gpu))
                .map(|gpu_type| app.throughput.speed_on(gpu_type))
                .reduce(f64::min)
                .unwrap_or(1.0);
            let rho = Rho::new(rho_at_speed(at_unit_speed, spent, slowest)).map_err(|_| {
                TypeError(format!(
                    "{field}.bids[{entry}]: no finite rho > 0 at speed {slowest}"
                ))
            })?;
            Ok(BidEntry {
                gpus: bid.gpus.clone(),
                rho,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(AppBid {
        app: app.app.clone(),
        rho_old: app.rho_old,
        bids,
    })
}

fn solve_instance(
    offer: &Offer,
    bids: &[AppBid],
    seed: u64,
) -> Result<(AuctionOutcome, Timings), AuctionError> {
    let started = Instant::now();
    let auction = Auction::new(offer, bids)?;
    let validation = started.elapsed();
    let started = Instant::now();
    let pf = auction.proportional_fair()?;
    let pf_solve = started.elapsed();
    let started = Instant::now();
    let payments = auction.payments(&pf, seed)?;
    let payment_solves = started.elapsed();
    let started = Instant::now();
    let outcome = auction.settle(&pf, &payments);
    let rounding = started.elapsed();
    let timings = Timings {
        validation,
        pf_solve,
        pf: pf.stats(),
        payment_solves,
        payments: payments.stats(),
        rounding,
    };
    Ok((outcome, timings))
}

/// Where one solve's time went, phase by phase.
struct Timings {
    validation: Duration,
    pf_solve: Duration,
    pf: PfStats,
    payment_solves: Duration,
    payments: PaymentStats,
    rounding: Duration,
}

impl fmt::Display for Timings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = |duration: Duration| duration.as_secs_f64() * 1e3;
        let (pf, payments) = (&self.pf, &self.payments);
        let total = self.validation + self.pf_solve + self.payment_solves + self.rounding;
        writeln!(f, "timings (ms):")?;
        writeln!(
            f,
            "  validation  {:>10.3}  ({} conflict components)",
            millis(self.validation),
            pf.components
        )?;
        writeln!(
            f,
            "  pf solve    {:>10.3}  ({} alone, {} by LP relaxation, {} by branch and bound, \
             {} best found within the node budget)",
            millis(self.pf_solve),
            pf.alone,
            pf.by_relaxation,
            pf.by_branch_and_bound,
            pf.fallbacks
        )?;
        writeln!(
            f,
            "  payments    {:>10.3}  ({} payers: {} certified, {} solved, {} fallbacks; \
             {} known to an interval; {} branch-and-bound programs)",
            millis(self.payment_solves),
            payments.payers,
            payments.certified,
            payments.solved,
            payments.fallbacks,
            payments.bounded,
            payments.programs
        )?;
        writeln!(f, "  rounding    {:>10.3}", millis(self.rounding))?;
        writeln!(f, "  total       {:>10.3}", millis(total))
    }
}

fn write_outcome(outcome: &AuctionOutcome) -> Result<(), SolveError> {
    let mut stdout = io::stdout().lock();
    let written = serde_json::to_writer_pretty(&mut stdout, outcome)
        .map_err(io::Error::from)
        .and_then(|()| writeln!(stdout))
        .and_then(|()| stdout.flush());
    match written {
        // A reader that stops early (`agora ... | head`) is not an error.
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(SolveError::Write),
    }
}
