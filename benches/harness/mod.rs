//! The lockhub benchmark harness (see BENCHMARKS.md for what each figure
//! means and how to read it).
//!
//! It is a library (`lockhub-bench`, imported as `harness`) that the
//! `harness = false` bench target `benches/lockhub.rs` runs, not a binary in
//! `src/bin/`: it is built in release by `cargo bench` (the bench profile
//! inherits release), it never ships in the package's binaries, and it runs
//! the real daemon Cargo built beside it with the same profile
//! ([`testkit::lockhub_bin`]). The smoke test (`tests/bench_smoke.rs`) runs
//! this same library with tiny sizes, so the harness cannot rot.
//!
//! Everything runs on this machine: a Mosquitto started here on a free
//! loopback port, pseudo-terminals for serial links. Every phase is bounded
//! by a count and a timeout.

pub mod broker;
pub mod daemon;
pub mod fixture;
pub mod mqtt;
/// The OSDP tests' reader (PyPI `libosdp` on a pty), shared rather than copied.
pub use testkit::osdp_peer;
pub mod pipeline;
/// The serial tests' pseudo-terminal (the hub opens the slave path exactly
/// as it opens `/dev/ttyAMA0`), shared rather than copied.
pub use testkit::board::pty;
pub mod report;
pub mod stats;

mod budget;
mod door;
mod footprint;
mod ingest;
mod osdp;
mod resync;
mod scale;
mod seal;
mod writeamp;

use report::Figure;
use std::path::PathBuf;

/// How big each scenario is.
#[derive(Debug, Clone)]
pub struct Sizes {
    /// Repeats of each timed phase; the figure is the median.
    pub runs: usize,
    pub verify_n: usize,
    pub ingest_n: usize,
    pub resync_keys: usize,
    pub batch_items: usize,
    pub scale_keys: Vec<usize>,
    pub scale_probes: usize,
    pub door_keys: usize,
    pub door_entries: usize,
    pub load_rate: f64,
    /// PINs typed at the OSDP reader, per baud rate.
    pub osdp_entries: usize,
    /// The write-amplification sweep: keys in its mirror, events per commit
    /// size, and the commit sizes.
    pub writeamp_keys: usize,
    pub writeamp_events: usize,
    pub writeamp_groups: Vec<usize>,
}

impl Sizes {
    pub fn full() -> Sizes {
        Sizes {
            runs: 3,
            verify_n: 20_000,
            ingest_n: 100_000,
            resync_keys: 100_000,
            batch_items: 500,
            scale_keys: vec![1_000, 10_000, 100_000, 1_000_000],
            scale_probes: 5_000,
            door_keys: 100_000,
            door_entries: 5_000,
            load_rate: 2_000.0,
            osdp_entries: 50,
            writeamp_keys: 100_000,
            writeamp_events: 20_000,
            writeamp_groups: vec![1, 8, 64, 512, 4096],
        }
    }

    /// A few seconds in all: proves every figure is produced, says nothing
    /// about speed.
    pub fn smoke() -> Sizes {
        Sizes {
            runs: 1,
            verify_n: 100,
            ingest_n: 300,
            resync_keys: 1_000,
            batch_items: 500,
            scale_keys: vec![100, 1_000],
            scale_probes: 100,
            door_keys: 500,
            door_entries: 30,
            load_rate: 200.0,
            osdp_entries: 3,
            writeamp_keys: 1_000,
            writeamp_events: 128,
            writeamp_groups: vec![1, 64],
        }
    }
}

/// Every scenario, in the order a full run takes them.
pub const SCENARIOS: &[&str] = &[
    "door",
    "seal",
    "osdp",
    "ingest",
    "resync",
    "scale",
    "footprint",
    "budget",
    "writeamp",
];

#[derive(Debug, Clone)]
pub struct Options {
    pub sizes: Sizes,
    pub smoke: bool,
    /// Scenarios to run (all when empty).
    pub only: Vec<String>,
    /// Where to write the figures table (BENCHMARKS.md for full runs).
    pub write: Option<PathBuf>,
    /// `--profile-apply N`: only run the store-only pipeline over N events
    /// (for `valgrind --tool=callgrind`); no figures.
    pub profile_apply: Option<usize>,
}

impl Options {
    pub fn smoke() -> Options {
        Options {
            sizes: Sizes::smoke(),
            smoke: true,
            only: vec![],
            write: None,
            profile_apply: None,
        }
    }

    /// Parses the command line (`--smoke`, `--only a,b`, `--write PATH`,
    /// `--no-write`); `--bench`, which cargo adds, is ignored.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Options, String> {
        let mut smoke = false;
        let mut only = vec![];
        let mut write = Some(testkit::repo_root().join("BENCHMARKS.md"));
        let mut explicit_write = false;
        let mut profile_apply = None;
        let mut runs = None;
        let mut args = args.into_iter();
        while let Some(a) = args.next() {
            match a.as_str() {
                "--bench" => {}
                "--smoke" => smoke = true,
                "--only" => {
                    let v = args.next().ok_or("--only needs a list")?;
                    for s in v.split(',').filter(|s| !s.is_empty()) {
                        if !SCENARIOS.contains(&s) {
                            return Err(format!(
                                "unknown scenario {s}; known: {}",
                                SCENARIOS.join(", ")
                            ));
                        }
                        only.push(s.to_owned());
                    }
                }
                "--write" => {
                    write = Some(args.next().ok_or("--write needs a path")?.into());
                    explicit_write = true;
                }
                "--no-write" => write = None,
                "--runs" => {
                    let n = args.next().ok_or("--runs needs a count")?;
                    runs = Some(
                        n.parse::<usize>()
                            .map_err(|_| "--runs needs a count")?
                            .max(1),
                    );
                }
                "--profile-apply" => {
                    let n = args.next().ok_or("--profile-apply needs a count")?;
                    profile_apply = Some(n.parse().map_err(|_| "--profile-apply needs a count")?);
                    write = None;
                }
                other => return Err(format!("unknown argument {other}")),
            }
        }
        if smoke && !explicit_write {
            // Smoke figures say nothing about speed: keep them out of BENCHMARKS.md.
            write = None;
        }
        let mut sizes = if smoke { Sizes::smoke() } else { Sizes::full() };
        if let Some(r) = runs {
            // Fewer repeats for a quick look; the figure is still a median.
            sizes.runs = r;
        }
        Ok(Options {
            sizes,
            smoke,
            only,
            write,
            profile_apply,
        })
    }

    fn wants(&self, scenario: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == scenario)
    }
}

/// A multi-threaded runtime sized like the hub's machine (2 cores).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs the chosen scenarios and returns their figures (printed as they come).
pub fn run(opts: &Options) -> Vec<Figure> {
    let rt = runtime();
    if let Some(n) = opts.profile_apply {
        let mut cloud = fixture::cloud();
        let events = fixture::issue_events(&mut cloud, "k", n);
        let dir = tempfile::tempdir().expect("tempdir");
        let r = rt.block_on(pipeline::run(
            &dir.path().join("lockhub.db"),
            &events,
            256,
            2,
        ));
        println!(
            "profile-apply: {n} events in {:.2} s ({:?})",
            r.total.as_secs_f64(),
            r
        );
        return vec![];
    }
    let mut all = vec![];
    for &scenario in SCENARIOS {
        if !opts.wants(scenario) {
            continue;
        }
        println!("== {scenario}");
        let started = std::time::Instant::now();
        let figures = match scenario {
            "door" => rt.block_on(door::run(&opts.sizes)),
            "seal" => rt.block_on(seal::run(&opts.sizes)),
            "osdp" => rt.block_on(osdp::run(&opts.sizes)),
            "ingest" => rt.block_on(ingest::run(&opts.sizes)),
            "resync" => rt.block_on(resync::run(&opts.sizes)),
            "scale" => rt.block_on(scale::run(&opts.sizes)),
            "footprint" => rt.block_on(footprint::run(&opts.sizes)),
            "budget" => rt.block_on(budget::run(&opts.sizes)),
            "writeamp" => rt.block_on(writeamp::run(&opts.sizes)),
            _ => unreachable!("SCENARIOS lists only these"),
        };
        report::print(&figures);
        println!(
            "   ({scenario} took {:.1} s)",
            started.elapsed().as_secs_f64()
        );
        all.extend(figures);
    }
    all
}

/// The ids a full or smoke run of `scenario` must produce.
pub fn expected_ids(scenario: &str) -> &'static [&'static str] {
    match scenario {
        "door" => door::IDS,
        "seal" => seal::IDS,
        "osdp" => osdp::IDS,
        "ingest" => ingest::IDS,
        "resync" => resync::IDS,
        "scale" => scale::IDS,
        "footprint" => footprint::IDS,
        "budget" => budget::IDS,
        "writeamp" => writeamp::IDS,
        _ => &[],
    }
}

/// `machine, commit, date` for the table's last column.
pub fn stamp() -> String {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(testkit::repo_root())
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let date = lockhub_proto::time::Timestamp::now_system().to_rfc3339();
    // Other work on the machine skews every figure: say how much there was.
    let load = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_default();
    format!(
        "{cores} cores, load {load}, {commit}, {}",
        &date[..10.min(date.len())]
    )
}

pub const SKELETON: &str = include_str!("skeleton.md");
