//! `agora auction solve [FILE|-] [--timings]`: runs one partial-allocation auction on a JSON
//! instance and prints its outcome as JSON (and, with `--timings`, where the time went).

use std::fmt;
use std::io::{self, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use agora_market::auction::{
    AppBid, Auction, AuctionError, AuctionOutcome, Offer, PaymentStats, PfStats,
};
use agora_market::topology::GpuId;
use clap::{Args, Subcommand};
use serde::Deserialize;

use super::{EXIT_FAILURE, EXIT_INVALID_INPUT};

#[derive(Debug, Subcommand)]
pub enum AuctionCommand {
    /// Solve one auction instance and print its outcome as JSON.
    ///
    /// Reads {"gpus": [...], "apps": [...], "seed": N} from FILE, or from standard input when
    /// FILE is `-` or absent; `seed` is optional and defaults to 0. Prints {"pf", "pf_gpus",
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
    gpus: Vec<GpuId>,
    apps: Vec<AppBid>,
    /// Seeds the random rounding of fractional GPU shares; the same instance and seed always
    /// give the same outcome.
    #[serde(default)]
    seed: u64,
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
    #[error("{source_name}: invalid auction instance")]
    Instance {
        source_name: Source,
        #[source]
        cause: serde_json::Error,
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
    let (outcome, timings) = solve_instance(&instance).map_err(|cause| match cause {
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
    serde_json::from_slice(&bytes).map_err(|cause| {
        let source_name = source.clone();
        if cause.is_data() {
            SolveError::Instance { source_name, cause }
        } else {
            SolveError::Syntax { source_name, cause }
        }
    })
}

fn solve_instance(instance: &AuctionInstance) -> Result<(AuctionOutcome, Timings), AuctionError> {
    let offer = Offer::without_topology(instance.gpus.iter().cloned());
    let started = Instant::now();
    let auction = Auction::new(&offer, &instance.apps)?;
    let validation = started.elapsed();
    let started = Instant::now();
    let pf = auction.proportional_fair()?;
    let pf_solve = started.elapsed();
    let started = Instant::now();
    let payments = auction.payments(&pf, instance.seed)?;
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
            "  pf solve    {:>10.3}  ({} alone, {} by LP relaxation, {} by branch and bound)",
            millis(self.pf_solve),
            pf.alone,
            pf.by_relaxation,
            pf.by_branch_and_bound
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
