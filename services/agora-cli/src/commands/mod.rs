//! The command tree. A new command (`agora simulate`, `agora serve`, ...) is a new module here
//! plus one variant of [`Command`].

pub mod auction;
pub mod audit;
pub mod experiment;
pub mod serve;
pub mod simulate;
pub mod worker;

use clap::{Parser, Subcommand};

/// Exit code of a run that failed because of its input (unreadable or invalid), the same code
/// clap uses for command-line usage errors.
pub const EXIT_INVALID_INPUT: u8 = 2;

/// Exit code of any other failure.
pub const EXIT_FAILURE: u8 = 1;

/// Agora: a fair GPU marketplace (Themis finish-time fairness, partial-allocation auction).
#[derive(Debug, Parser)]
#[command(name = "agora", version, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the partial-allocation auction.
    #[command(subcommand)]
    Auction(auction::AuctionCommand),
    /// Replay a workload on a simulated cluster under one or more policies.
    Simulate(simulate::SimulateArgs),
    /// Regenerate one of the Themis paper's evaluation experiments.
    Experiment(experiment::ExperimentArgs),
    /// Run the arbiter service (HTTP API, live rounds, Postgres history).
    Serve(serve::ServeArgs),
    /// Check stored history against the engine.
    #[command(subcommand)]
    Audit(audit::AuditCommand),
    /// Run the agent of a GPU host: report its GPUs to the arbiter and enforce leases.
    Worker(worker::WorkerArgs),
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Auction(command) => command.run()?,
            Command::Simulate(args) => args.run()?,
            Command::Experiment(args) => args.run()?,
            Command::Serve(args) => args.run()?,
            Command::Audit(command) => command.run()?,
            Command::Worker(args) => args.run()?,
        }
        Ok(())
    }
}

/// The exit code for a failed command: [`EXIT_INVALID_INPUT`] when its input was at fault,
/// [`EXIT_FAILURE`] otherwise.
pub fn exit_code(error: &anyhow::Error) -> u8 {
    if let Some(error) = error.downcast_ref::<auction::SolveError>() {
        return error.exit_code();
    }
    if let Some(error) = error.downcast_ref::<simulate::SimulateError>() {
        return error.exit_code();
    }
    if let Some(error) = error.downcast_ref::<experiment::ExperimentCommandError>() {
        return error.exit_code();
    }
    EXIT_FAILURE
}

/// `error` and its causes on one line, joined by ": ". A cause whose words its error already
/// says (an error that writes its source into its own message) is not said twice.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = cause.to_string().replace('\n', " ");
        if message.is_empty() {
            message = text;
        } else if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect: {source}. Is it running?")]
    struct Embeds {
        source: std::io::Error,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read the file")]
    struct Wraps {
        source: std::io::Error,
    }

    fn timed_out() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::TimedOut, "pool timed out")
    }

    #[test]
    fn a_cause_is_said_once() {
        let embeds = anyhow::Error::new(Embeds {
            source: timed_out(),
        });
        assert_eq!(
            one_line(&embeds),
            "cannot connect: pool timed out. Is it running?"
        );
        let wraps = anyhow::Error::new(Wraps {
            source: timed_out(),
        });
        assert_eq!(one_line(&wraps), "cannot read the file: pool timed out");
        let context = anyhow::Error::new(timed_out()).context("opening\nthe pool");
        assert_eq!(one_line(&context), "opening the pool: pool timed out");
    }
}
