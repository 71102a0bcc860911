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
    /// List the local key mirror (key, state, doors, window); never PIN tags.
    Keys {
        /// Path to hub.toml.
        #[arg(long)]
        config: PathBuf,
    },
    /// Run the daemon until SIGTERM or SIGINT.
    Run {
        /// Path to hub.toml.
        #[arg(long)]
        config: PathBuf,
    },
    /// A simulated lock board on a serial device, for tests, the demo and
    /// checking wiring: type `DOOR KEYS` (e.g. `0 1234#`), `open DOOR`,
    /// `close DOOR` or `tamper`; relay and deny feedback is printed.
    SimBoard {
        /// The serial device the board talks on (the hub is at the other end).
        #[arg(long)]
        port: String,
        #[arg(long, default_value_t = 115_200)]
        baud: u32,
        #[arg(long, default_value_t = 1)]
        board_id: u8,
        /// Doors wired to the board (1..=16).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=16))]
        doors: u8,
        /// Name doors as the hub's config does: `--door-name 101=0`.
        #[arg(long = "door-name", value_parser = parse_door_name)]
        door_names: Vec<(String, u8)>,
    },
}

fn parse_door_name(s: &str) -> Result<(String, u8), String> {
    let (name, index) = s
        .rsplit_once('=')
        .ok_or_else(|| "expected NAME=INDEX".to_owned())?;
    let index = index
        .parse::<u8>()
        .ok()
        .filter(|i| *i <= 15)
        .ok_or_else(|| "INDEX must be 0..=15".to_owned())?;
    Ok((name.to_owned(), index))
}

/// `lockhub run`: logs to stderr; a config problem is exit 2, anything
/// else that stops the daemon exit 1.
/// `lockhub keys`: read-only, safe while the daemon runs.
fn keys(path: &std::path::Path) -> ExitCode {
    let config = match lockhub::config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    let listed = lockhub::store::open_read_only(&config.database_path())
        .and_then(|conn| lockhub::store::keys::print_keys(&conn, &mut std::io::stdout().lock()));
    match listed {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockhub keys: {e}");
            ExitCode::from(1)
        }
    }
}

fn run(path: &std::path::Path) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let config = match lockhub::config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("lockhub: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result: anyhow::Result<()> = runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        lockhub::daemon::run(config, shutdown).await?;
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockhub: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run { config } => run(&config),
        Command::Keys { config } => keys(&config),
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
        Command::SimBoard {
            port,
            baud,
            board_id,
            doors,
            door_names,
        } => {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("cannot start the runtime: {e}");
                    return ExitCode::from(1);
                }
            };
            let cfg = firmware_bridge::BoardConfig::new(board_id, doors);
            let run = lockhub::sim::board::run_interactive(
                &port,
                baud,
                cfg,
                door_names,
                std::time::Duration::from_secs(2),
            );
            match rt.block_on(run) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("sim-board: {e}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
