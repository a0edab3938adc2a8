//! `agora`: the command-line front of the Agora GPU marketplace.
//!
//! Each command lives in its own module under [`commands`]; this file only parses the command
//! line, runs the command and turns its error into one `error: ...` line and an exit code.

mod commands;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = commands::Cli::parse();
    match cli.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {}", commands::one_line(&error));
            ExitCode::from(commands::exit_code(&error))
        }
    }
}
