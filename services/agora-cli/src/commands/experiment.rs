//! `agora experiment NAME --out DIR`: regenerates one of the paper's evaluation experiments
//! (data as CSV, charts as SVG). `agora experiment --list` names them.

use std::path::PathBuf;

use agora_sim::experiments::{run_experiment, ExperimentError, ExperimentScale, EXPERIMENTS};
use clap::Args;

use super::{EXIT_FAILURE, EXIT_INVALID_INPUT};

#[derive(Debug, Args)]
pub struct ExperimentArgs {
    /// The experiment to run (see --list), e.g. fig18-liar.
    #[arg(required_unless_present = "list")]
    name: Option<String>,
    /// Directory for the experiment's CSV data and SVG charts (created if missing).
    #[arg(long, required_unless_present = "list")]
    out: Option<PathBuf>,
    /// List the experiments and what each reproduces.
    #[arg(long)]
    list: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ExperimentCommandError {
    #[error(transparent)]
    Experiment(#[from] ExperimentError),
}

impl ExperimentCommandError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ExperimentCommandError::Experiment(ExperimentError::Unknown(_)) => EXIT_INVALID_INPUT,
            ExperimentCommandError::Experiment(_) => EXIT_FAILURE,
        }
    }
}

impl ExperimentArgs {
    pub fn run(self) -> Result<(), ExperimentCommandError> {
        let (Some(name), Some(out), false) = (self.name, self.out, self.list) else {
            for (name, description) in EXPERIMENTS {
                println!("{name:<24} {description}");
            }
            return Ok(());
        };
        let output = run_experiment(&name, &out, ExperimentScale::full())?;
        println!("{}", output.summary.trim_end());
        for file in &output.files {
            println!("wrote {}", file.display());
        }
        Ok(())
    }
}
