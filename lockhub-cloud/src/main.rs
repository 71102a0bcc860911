//! `lockhub-cloud`: parse, run, map the outcome to an exit code
//! (0 done, 2 the caller's input, 3 no proof within `--wait-proof`'s
//! timeout, 1 anything else). Everything else is the
//! library's (`cli::run`).

use clap::Parser;
use lockhub_cloud::cli::{Cli, run};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run(cli, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockhub-cloud: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
