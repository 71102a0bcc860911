//! lockhub's test fixtures, in one place for the tests (`tests/*/`), the
//! benchmarks (`benches/`) and the demo (`examples/demo/`). Real parts
//! only: a Mosquitto each test starts on a free loopback port, the real
//! `lockhub` binary, SQLite files in temporary folders, pseudo-terminals.
//!
//! | module | what lives there |
//! |---|---|
//! | [`ports`] | [`ports::free_port`]: a loopback port never handed out twice in a process |
//! | [`broker`] | Mosquitto (restart, reload, TLS PKI, passwords, ACLs) and rumqttd |
//! | [`files`] | the vectors' `hub.toml` and `secrets.toml`, written at the modes an installer uses |
//! | [`daemon`] | a `lockhub run` process on its own folder: start, kill, restart, read its database; a process's memory |
//! | [`cloud`] | the test cloud: its signer, the hub-envelope opener, an MQTT 5 client that hears the hub |
//! | [`board`] | pseudo-terminals and the serial driver on a real store, with a simulated board (sealed under the test key of its serial by default); `board::relay`, a wire attacker between hub and board |
//! | [`osdp_peer`] | the PyPI `libosdp` reader on a pty, driven line by line |
//! | [`osdp_relay`] | a man in the middle on an OSDP bus: forwards, injects, drops and alters packets |
//! | [`db`] | a store in a tempdir, keys inserted with plain SQL, the PIN keys |
//! | [`store`] | events built by hand for the store's writer, and a dump of every table |
//!
//! Nothing here prints a PIN, a tag, a secret or a body: failures name ids,
//! seqs, outcomes and counts.

pub mod board;
pub mod broker;
pub mod cloud;
pub mod daemon;
pub mod db;
pub mod files;
pub mod osdp_peer;
pub mod osdp_relay;
pub mod ports;
pub mod store;

use std::path::{Path, PathBuf};

/// The repository's root (the `lockhub` package), for files that ship.
pub fn repo_root() -> &'static Path {
    // The parent, not `testkit/..`: paths built on it are shown to people
    // (the demo names the OSDP venv it looks for).
    let testkit = Path::new(env!("CARGO_MANIFEST_DIR"));
    testkit.parent().unwrap_or(testkit)
}

/// The `lockhub` binary Cargo built beside the running test, bench or
/// example (same profile), or `LOCKHUB_BENCH_BIN` when set (another build
/// to compare with, measured by the same benchmark harness).
///
/// Cargo hands `CARGO_BIN_EXE_lockhub` only to the main crate's own test
/// and bench targets at compile time; a library cannot read it. They all
/// run from `target/PROFILE/deps/` (tests, benches) or
/// `target/PROFILE/examples/`, with the binary in `target/PROFILE/`.
pub fn lockhub_bin() -> &'static Path {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("LOCKHUB_BENCH_BIN") {
            return p.into();
        }
        let exe = std::env::current_exe().expect("the running executable's path");
        let mut dir = exe.parent().expect("a folder").to_path_buf();
        if dir.ends_with("deps") || dir.ends_with("examples") {
            dir.pop();
        }
        let bin = dir.join("lockhub");
        assert!(
            bin.exists(),
            "no lockhub binary at {} (cargo builds it for tests and benches; \
             `cargo build` first for an example, or set LOCKHUB_BENCH_BIN)",
            bin.display()
        );
        bin
    })
}
