//! The `lockhub` command: a thin shell over the library. Every subcommand
//! parses its arguments, calls one library function, and maps errors to exit
//! codes (2 for a configuration problem, 1 for anything else).

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Where every command looks for the hub's config unless told otherwise.
const DEFAULT_CONFIG: &str = "/etc/lockhub/hub.toml";

/// The heading the global flags are listed under, once, in every help.
const GLOBAL: &str = "Global options";

#[derive(Parser)]
#[command(name = "lockhub", version, about = "Offline-first door access hub")]
struct Cli {
    /// Log line format on stderr: `text` for people, `json` for collectors.
    #[arg(long, global = true, value_enum, default_value_t = lockhub::runtime::logging::LogFormat::Text, help_heading = GLOBAL)]
    log_format: lockhub::runtime::logging::LogFormat,
    /// Log filter (`info`, `lockhub=debug,rumqttc=warn`, ...); overrides RUST_LOG.
    #[arg(long, global = true, value_name = "FILTER", help_heading = GLOBAL)]
    log_level: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// `--config FILE`, the same for every command that reads a hub's config.
#[derive(Args)]
struct ConfigArg {
    /// Path to hub.toml.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_CONFIG)]
    config: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a config and the files it names; exit 0 when valid, 2 when not.
    CheckConfig {
        /// Path to hub.toml (the same as --config; kept for scripts).
        #[arg(value_name = "FILE", conflicts_with = "config")]
        file: Option<PathBuf>,
        #[command(flatten)]
        config: ConfigArg,
    },
    /// List the local key mirror (key, state, doors, window); never PIN tags.
    Keys {
        #[command(flatten)]
        config: ConfigArg,
        /// Print JSON instead of a table (stable fields: docs/protocol/config.md).
        #[arg(long)]
        json: bool,
    },
    /// Write hub.toml and secrets.toml for a new hub; print its public key.
    Provision(Box<ProvisionArgs>),
    /// Show the hub's state (keys, sync, outbox, alerts, links, clock, broker); read-only.
    Status {
        #[command(flatten)]
        config: ConfigArg,
        /// Print JSON instead of text (stable fields: docs/protocol/config.md).
        #[arg(long)]
        json: bool,
    },
    /// Operator actions on the hub's alerts.
    Alert {
        #[command(subcommand)]
        command: AlertCommand,
    },
    /// Run the daemon until SIGTERM or SIGINT.
    Run {
        #[command(flatten)]
        config: ConfigArg,
    },
    /// OSDP readers (osdp.md).
    Osdp {
        #[command(subcommand)]
        command: OsdpCommand,
    },
    /// Lock boards' link keys (serial.md, "Sealed link"). Stop the daemon
    /// first: it owns the boards' ports.
    Board {
        #[command(subcommand)]
        command: BoardCommand,
    },
    /// A simulated lock board on a serial device, for tests, the demo and
    /// checking wiring: type `DOOR KEYS` (e.g. `0 1234#`), `open DOOR`,
    /// `close DOOR` or `tamper`; relay and deny feedback is printed.
    SimBoard {
        /// The serial device the board talks on (the hub is at the other end).
        #[arg(long, value_name = "PATH")]
        port: String,
        /// Line speed; the hub's `[[serial]] baud` for this board.
        #[arg(long, default_value_t = 115_200)]
        baud: u32,
        /// The id the board reports in its Hello (0..=255; `lockhub status` shows it).
        #[arg(long, default_value_t = 1)]
        board_id: u8,
        /// Doors wired to the board (1..=16).
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=16))]
        doors: u8,
        /// Name doors as the hub's config does: `--door-name 101=0` (repeat per door).
        #[arg(long = "door-name", value_name = "NAME=INDEX", value_parser = parse_door_name)]
        door_names: Vec<(String, u8)>,
        /// The board's link key (base64url of 32 bytes, as in the hub's
        /// `[[board_key]]`): the board talks sealed. Without it, plain.
        #[arg(long, value_name = "FILE")]
        key_file: Option<std::path::PathBuf>,
        /// Start in pairing mode (`lockhub board pair`): type the code the
        /// hub prints as `0 CODE#`; a matching code writes the new key to
        /// `--key-file` (if given) and the board goes on sealed.
        #[arg(long)]
        pair: bool,
    },
}

#[derive(Subcommand)]
enum BoardCommand {
    /// Pair a board in pairing mode: prints a six-digit code to type on the
    /// board's keypad (door 0, then #), and writes the board's new link key
    /// into the secrets file once a sealed session under it verifies.
    Pair {
        #[command(flatten)]
        config: ConfigArg,
        /// The `[[serial]] name`.
        #[arg(long)]
        serial: String,
    },
    /// Give a paired board a new link key, agreed inside a sealed session
    /// under its current one; written once a session under it verifies.
    Rekey {
        #[command(flatten)]
        config: ConfigArg,
        /// The `[[serial]] name`.
        #[arg(long)]
        serial: String,
    },
}

fn board_command(command: BoardCommand) -> ExitCode {
    let rt = match runtime(Threads::One) {
        Ok(rt) => rt,
        Err(exit) => return exit,
    };
    let (what, done) = match command {
        BoardCommand::Pair { config, serial } => {
            println!("pairing the board on {serial}: put it in pairing mode");
            let mut show = |code: &str| {
                println!("pairing code: {code}");
                println!("type it on the board's keypad at door 0, then #");
            };
            (
                "pair",
                rt.block_on(lockhub::ops::board::pair(
                    &config.config,
                    &serial,
                    &mut show,
                )),
            )
        }
        BoardCommand::Rekey { config, serial } => (
            "rekey",
            rt.block_on(lockhub::ops::board::rekey(&config.config, &serial)),
        ),
    };
    match done {
        Ok(k) => {
            println!(
                "{}: a sealed session under the new link key verified; the key is in {}",
                k.serial,
                k.secrets.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("lockhub board {what}: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[derive(Subcommand)]
enum OsdpCommand {
    /// Put a reader's key from the secrets file into the reader (it must be
    /// in install mode, fresh from the factory) and record its identity.
    /// Stop the daemon first: it owns the bus.
    Install {
        #[command(flatten)]
        config: ConfigArg,
        /// The `[[reader]] name`.
        #[arg(long)]
        reader: String,
        /// The osdp_PDID serial the reader must report (hex, as `lockhub
        /// status` prints it) before its key is sent.
        #[arg(long, value_parser = parse_hex_serial)]
        serial: Option<u32>,
    },
    /// Change a reader's key under its current one: osdp_KEYSET inside its
    /// Secure Channel, a proof with the new key, then the secrets file
    /// rewritten (mode 0600). Stop the daemon first: it owns the bus.
    Rekey {
        #[command(flatten)]
        config: ConfigArg,
        /// The `[[reader]] name`.
        #[arg(long)]
        reader: String,
        /// A file (mode 0600) holding the new key: base64url of 16 random
        /// bytes, as `scbk` is written.
        #[arg(long, value_name = "FILE")]
        new_key_file: std::path::PathBuf,
    },
}

/// A reader serial in hex (`0B ADCAFE`-style, with or without `0x`).
fn parse_hex_serial(s: &str) -> Result<u32, String> {
    let hex = s.trim_start_matches("0x").trim_start_matches("0X");
    u32::from_str_radix(hex, 16)
        .map_err(|_| format!("`{s}` is not a hex serial of at most 8 digits"))
}

/// The config at `path`, or exit 2 after printing every problem, one per
/// line as `FILE:LINE:COL: message` (never a secret): what every command
/// that reads the config answers an installer's mistake with.
fn load_config(path: &std::path::Path) -> Result<lockhub::config::Config, ExitCode> {
    lockhub::config::load(path).map_err(|errors| {
        eprintln!("{errors}");
        ExitCode::from(2)
    })
}

/// `lockhub check-config`: every problem (exit 2), or `FILE: ok` (exit
/// 0); warnings (a device absent now) go to stderr either way, as
/// `FILE:LINE:COL: warning: message`.
fn check_config(path: &std::path::Path) -> ExitCode {
    let (config, warnings) = lockhub::config::load_with_warnings(path);
    for w in &warnings {
        let mut w = w.clone();
        w.message = format!("warning: {}", w.message);
        eprintln!("{w}");
    }
    match config {
        Ok(_) => {
            println!("{}: ok", path.display());
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::from(2)
        }
    }
}

/// Which tokio runtime a command needs: the daemon runs its tasks on
/// every core; the one-shot commands drive a single future.
enum Threads {
    One,
    Many,
}

/// A tokio runtime, or exit 1 (the machine, not the input, is at fault).
fn runtime(threads: Threads) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = match threads {
        Threads::One => tokio::runtime::Builder::new_current_thread(),
        Threads::Many => tokio::runtime::Builder::new_multi_thread(),
    };
    builder.enable_all().build().map_err(|e| {
        eprintln!("lockhub: cannot start the async runtime: {e}");
        ExitCode::from(1)
    })
}

/// The config and a one-thread runtime, for the one-shot commands that
/// talk to a device.
fn config_and_runtime(
    path: &std::path::Path,
) -> Result<(lockhub::config::Config, tokio::runtime::Runtime), ExitCode> {
    Ok((load_config(path)?, runtime(Threads::One)?))
}

/// `lockhub osdp install`: exit 2 for a config problem, 1 for a reader or
/// bus that would not do it.
fn osdp_install(path: &std::path::Path, reader: &str, serial: Option<u32>) -> ExitCode {
    let (config, rt) = match config_and_runtime(path) {
        Ok(both) => both,
        Err(exit) => return exit,
    };
    let now = lockhub_proto::time::Timestamp::now_system();
    match rt.block_on(lockhub::drivers::osdp::install::install(
        &config, reader, serial, now,
    )) {
        Ok(done) => {
            let id = done.identity;
            println!(
                "reader {reader}: {}; vendor {:06x}, model {}, version {}, serial {:08x}, firmware {:06x} recorded",
                if done.key_changed {
                    "its key is installed and proven"
                } else {
                    "it already had its key"
                },
                id.vendor,
                id.model,
                id.version,
                id.serial,
                id.firmware
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("lockhub osdp install: {e}");
            use lockhub::drivers::osdp::install::InstallError as E;
            ExitCode::from(if matches!(e, E::UnknownReader(_) | E::NoKey(_)) {
                2
            } else {
                1
            })
        }
    }
}

/// `lockhub osdp rekey`: exit 2 for a config or key-file problem, 1 for a
/// reader or bus that would not do it.
fn osdp_rekey(path: &std::path::Path, reader: &str, new_key_file: &std::path::Path) -> ExitCode {
    let (config, rt) = match config_and_runtime(path) {
        Ok(both) => both,
        Err(exit) => return exit,
    };
    use lockhub::drivers::osdp::install::{InstallError as E, Rekeyed, rekey};
    match rt.block_on(rekey(&config, reader, new_key_file)) {
        Ok(done) => {
            println!(
                "reader {reader}: {}; the secrets file {} holds it",
                match done {
                    Rekeyed::Changed => "its new key is set and proven",
                    Rekeyed::AlreadyNew => "it already had the new key (an earlier rekey); proven",
                },
                config.secrets_file.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("lockhub osdp rekey: {e}");
            ExitCode::from(
                if matches!(e, E::UnknownReader(_) | E::NoKey(_) | E::NewKeyFile { .. }) {
                    2
                } else {
                    1
                },
            )
        }
    }
}

#[derive(Subcommand)]
enum AlertCommand {
    /// Clear a raised alert by hand (how `tamper` ends), audited as
    /// `alert.cleared` with your reason; safe while the daemon runs.
    Clear {
        /// The alert's condition, e.g. `tamper`.
        condition: String,
        /// The alert's subject, as `lockhub status` shows it (e.g. `board-a`).
        subject: String,
        #[command(flatten)]
        config: ConfigArg,
        /// Why it is cleared (published in the audit record; no personal data).
        #[arg(long)]
        reason: String,
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

#[derive(Args)]
struct ProvisionArgs {
    /// A provisioning bundle (JSON) from the cloud; `-` reads stdin.
    #[arg(long, conflicts_with_all = ["site_id", "hub_id", "mqtt_url", "trust", "ca_file", "cert_file", "username"])]
    bundle: Option<PathBuf>,
    /// Site (tenant) UUID.
    #[arg(long, required_unless_present = "bundle")]
    site_id: Option<String>,
    /// Hub id: 1..=64 of [A-Za-z0-9._-].
    #[arg(long, required_unless_present = "bundle")]
    hub_id: Option<String>,
    /// Broker URL: mqtt://host[:port] or mqtts://host[:port].
    #[arg(long, required_unless_present = "bundle")]
    mqtt_url: Option<String>,
    /// mqtts: the CA that signed the broker's certificate (PEM).
    #[arg(long)]
    ca_file: Option<PathBuf>,
    /// mqtts: this hub's client certificate and its key (PEM).
    #[arg(long, requires = "key_file")]
    cert_file: Option<PathBuf>,
    /// mqtts: the key of --cert-file (PEM; keep it 0600).
    #[arg(long, requires = "cert_file")]
    key_file: Option<PathBuf>,
    /// Broker user name; the password is read from --password-file.
    #[arg(long)]
    username: Option<String>,
    /// A file holding the broker password (never the password itself).
    #[arg(long)]
    password_file: Option<PathBuf>,
    /// A trusted cloud signer: ID=PUBLIC_KEY[,NOT_AFTER] (repeat for several).
    #[arg(long, value_name = "ID=KEY[,NOT_AFTER]")]
    trust: Vec<lockhub_proto::bundle::TrustSpec>,
    /// A PIN key: ID (generated) or ID=@FILE (base64url secret read from FILE).
    #[arg(long, value_name = "ID[=@FILE]")]
    pin_key: Vec<String>,
    /// Use this hub key (file with the base64url seed) instead of a fresh one.
    #[arg(long)]
    hub_key_file: Option<PathBuf>,
    /// Where to write hub.toml.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    /// Where to write the secrets file (default: secrets.toml beside the config).
    #[arg(long)]
    secrets: Option<PathBuf>,
    /// The daemon's data folder.
    #[arg(long, default_value = "/var/lib/lockhub")]
    data_dir: PathBuf,
    /// Owner (USER[:GROUP]) of the secrets file and a new data folder.
    #[arg(long)]
    owner: Option<String>,
    /// Replace existing files.
    #[arg(long)]
    force: bool,
    /// Print the result as JSON (public values only).
    #[arg(long)]
    json: bool,
}

/// `lockhub keys`: read-only, safe while the daemon runs.
fn keys(path: &std::path::Path, json: bool) -> ExitCode {
    let config = match load_config(path) {
        Ok(c) => c,
        Err(exit) => return exit,
    };
    let out = &mut std::io::stdout().lock();
    let listed = lockhub::store::open::open_read_only(&config.database_path()).and_then(|conn| {
        if json {
            lockhub::store::keys::print_keys_json(&conn, config.hub.timezone_name(), out)
        } else {
            lockhub::store::keys::print_keys(&conn, config.hub.timezone_name(), out)
        }
    });
    match listed {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lockhub keys: {e}");
            ExitCode::from(1)
        }
    }
}

/// `lockhub run`: logs to stderr; a config problem is exit 2, anything
/// else that stops the daemon exit 1.
fn run(path: &std::path::Path) -> ExitCode {
    // Logging is already set up by main (--log-format, --log-level; src/runtime/logging.rs).
    let config = match load_config(path) {
        Ok(c) => c,
        Err(exit) => return exit,
    };
    let rt = match runtime(Threads::Many) {
        Ok(rt) => rt,
        Err(exit) => return exit,
    };
    let result: anyhow::Result<()> = rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        lockhub::runtime::daemon::run(config, shutdown).await?;
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
    // Before any thread allocates (see lockhub::runtime::alloc for why).
    lockhub::runtime::alloc::tune();
    let cli = Cli::parse();
    if let Err(e) = lockhub::runtime::logging::init(cli.log_format, cli.log_level.as_deref()) {
        eprintln!("lockhub: {e}");
        return ExitCode::from(2);
    }
    match cli.command {
        Command::Run { config } => run(&config.config),
        Command::Keys { config, json } => keys(&config.config, json),
        Command::Board { command } => board_command(command),
        Command::Osdp {
            command:
                OsdpCommand::Install {
                    config,
                    reader,
                    serial,
                },
        } => osdp_install(&config.config, &reader, serial),
        Command::Osdp {
            command:
                OsdpCommand::Rekey {
                    config,
                    reader,
                    new_key_file,
                },
        } => osdp_rekey(&config.config, &reader, &new_key_file),
        Command::Alert {
            command:
                AlertCommand::Clear {
                    condition,
                    subject,
                    config,
                    reason,
                },
        } => {
            match lockhub::ops::alert_clear::clear(&config.config, &condition, &subject, &reason) {
                Ok(c) => {
                    println!(
                        "cleared {} {} at {}",
                        c.condition.as_str(),
                        c.subject,
                        c.at.to_rfc3339()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("lockhub alert clear: {e}");
                    ExitCode::from(e.exit_code())
                }
            }
        }
        Command::CheckConfig { file, config } => {
            let file = file.unwrap_or(config.config);
            check_config(&file)
        }
        Command::SimBoard {
            port,
            baud,
            board_id,
            doors,
            door_names,
            key_file,
            pair,
        } => {
            use lockhub::sim::board::SimMode;
            let mode = match (pair, key_file) {
                (true, save) => SimMode::Pairing { save },
                (false, Some(path)) => match lockhub::sim::board::read_key_file(&path) {
                    Ok(key) => SimMode::Sealed(key),
                    Err(e) => {
                        eprintln!("sim-board: {e}");
                        return ExitCode::from(2);
                    }
                },
                (false, None) => SimMode::Plain,
            };
            let rt = match runtime(Threads::One) {
                Ok(rt) => rt,
                Err(exit) => return exit,
            };
            let cfg = firmware_bridge::BoardConfig::new(board_id, doors);
            let run = lockhub::sim::board::run_interactive(
                &port,
                baud,
                cfg,
                mode,
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
        Command::Provision(args) => match provision(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lockhub provision: {e}");
                ExitCode::from(if e.is_input_problem() { 2 } else { 1 })
            }
        },
        Command::Status { config, json } => match lockhub::ops::status::status(&config.config) {
            Ok(s) => {
                if json {
                    println!("{}", s.to_json());
                } else {
                    print!("{}", s.to_text());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("lockhub status: {e}");
                ExitCode::from(if e.is_config_problem() { 2 } else { 1 })
            }
        },
    }
}

fn provision(a: ProvisionArgs) -> Result<(), lockhub::ops::provision::ProvisionError> {
    use lockhub::ops::provision::{self as p, Request};
    use lockhub_proto::bundle::MqttSpec;
    let mut req = match &a.bundle {
        Some(path) => Request::from(p::bundle::read_bundle(path)?),
        None => Request {
            site_id: a.site_id.unwrap_or_default(),
            hub_id: a.hub_id.unwrap_or_default(),
            mqtt: MqttSpec {
                url: a.mqtt_url.unwrap_or_default(),
                ca_file: a.ca_file,
                cert_file: a.cert_file,
                key_file: a.key_file,
                username: a.username,
                password_file: a.password_file,
                ..Default::default()
            },
            trust: a.trust,
            serials: vec![],
            doors: vec![],
            pin_keys: vec![],
            hub_key: None,
            osdp: vec![],
            readers: vec![],
            reader_doors: vec![],
        },
    };
    for k in &a.pin_key {
        req.pin_keys.push(p::cli::parse_pin_key_arg(k)?);
    }
    if let Some(f) = &a.hub_key_file {
        req.hub_key = Some(p::cli::read_secret_file(f)?);
    }
    let secrets = a.secrets.unwrap_or_else(|| {
        a.config
            .parent()
            .unwrap_or(std::path::Path::new("."))
            .join("secrets.toml")
    });
    let owner = a.owner.as_deref().map(p::Owner::resolve).transpose()?;
    let target = p::Target {
        config: a.config,
        secrets,
        data_dir: a.data_dir,
        force: a.force,
        owner,
    };
    let done = p::provision(req, &target)?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&done).unwrap_or_default()
        );
    } else {
        print!("{}", p::cli::summary(&done));
    }
    Ok(())
}
