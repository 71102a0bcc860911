//! The `lockhub` command: a thin shell over the library. Every subcommand
//! parses its arguments, calls one library function, and maps errors to exit
//! codes (2 for a configuration problem, 1 for anything else).

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "lockhub", version, about = "Offline-first door access hub")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a config and the files it names; exit 0 when valid, 2 when not.
    CheckConfig {
        /// Path to hub.toml.
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { file } => match lockhub::config::load(&file) {
            Ok(_) => {
                println!("{}: ok", file.display());
                ExitCode::SUCCESS
            }
            Err(errors) => {
                // One problem per line, FILE:LINE:COL: message; never a secret.
                eprintln!("{errors}");
                ExitCode::from(2)
            }
        },
    }
}
