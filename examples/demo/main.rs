//! The lockhub demo: the real daemon, deciding at a simulated door, synced
//! with a simulated cloud through a real MQTT broker, all on this machine.
//!
//! ```sh
//! cargo run --release --example demo                 # the story, ~15 s
//! cargo run --release --example demo -- --interactive  # type `101 482913`
//! ```
//!
//! What runs, and why each part is the one it is:
//! - **The daemon** is [`lockhub::runtime::daemon::run`], the same function `lockhub
//!   run` calls, with a config loaded by [`lockhub::config::load`] from a
//!   `hub.toml` this demo writes into a temporary data folder (with
//!   `secrets.toml` and the MQTT password file at mode 0600, every secret
//!   freshly generated). Nothing in the daemon knows it is a demo.
//! - **The broker** is rumqttd, a dev-dependency, so it is never linked into
//!   the `lockhub` binary. It runs in a child process (this same binary with
//!   the hidden `--broker PORT` flag) because `Broker::start` blocks for
//!   good: killing the child is how the demo takes the broker away, and a new
//!   child on the same port brings it back. rumqttd serves the demo only: it
//!   keeps no state on disk (a restart loses every session and queued
//!   message) and it loses messages when a client acks out of order. A
//!   building uses Mosquitto (see `testkit/src/broker/mod.rs`).
//!   Because a restarted rumqttd forgets subscriptions, the child admits only
//!   the cloud until the cloud has subscribed again; otherwise the hub could
//!   deliver its audit into a broker with nobody listening.
//! - **The cloud** is [`lockhub::sim::cloud::Cloud`], which signs events as a
//!   real cloud would; it publishes them with rumqttc, listens on results,
//!   audit, alerts, sync and status, verifies the hub's signature on every
//!   message, and answers sync requests.
//! - **The OSDP reader** (step 8, optional) is the PyPI `libosdp`
//!   PeripheralDevice (`testkit/osdp/peer.py`) on its own pseudo-terminal,
//!   keyed with a fresh Secure Channel key; it needs Python and the package
//!   that `./scripts/test` installs into `target/osdp-venv`. Without it the
//!   step says it is skipped, and the rest of the story is unchanged.
//! - **The board** is [`lockhub::sim::board::SimBoard`] (the firmware's own
//!   state machine) on the master side of a pseudo-terminal; the daemon
//!   opens the slave through a symlink, as it opens `/dev/serial/by-id/...`.
//!
//! Beside this file: `world.rs` (what the demo observes: the board, the
//! cloud's inbox, the waits), `files.rs` (the config files it writes) and
//! `broker.rs` (the broker child). This file is the story and
//! `--interactive`.
//!
//! Every line the story prints is read back from what the daemon did: result
//! and audit and alert messages at the cloud, frames and relay levels at the
//! board. When an expected outcome does not happen within its bound, the demo
//! says what it expected and what it saw, and exits 1.
//!
//! The PINs below are the demo's own made-up data and the story prints them;
//! the daemon never sees a PIN outside a keypad frame and never logs one.
//! Daemon log lines (warnings by default, `RUST_LOG=info` for more) go to
//! stderr. Hidden flag for the test: `--data-dir DIR` uses and keeps `DIR`.

/// The board's pseudo-terminal, the serial tests' own.
use lockhub_proto::topics::Leaf;
use testkit::board::pty;
/// The OSDP reader of step 8: the PyPI `libosdp` PeripheralDevice
/// (testkit/osdp/peer.py), when scripts/test has installed it.
use testkit::osdp_peer;

mod broker;
mod files;
mod world;

use broker::Broker;
use files::*;
use world::*;

use std::collections::{BTreeSet, HashSet};
use std::io::{BufRead, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use ed25519_dalek::{SigningKey, VerifyingKey};
use firmware_bridge::{BoardConfig, Downlink};
use lockhub::sim::board::{SimBoard, SimEvent};
use lockhub::sim::cloud::Cloud;
use lockhub_proto::crypto;
use lockhub_proto::sign::{GrantSpec, SignedEvent};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::Value;
use tokio::sync::mpsc;

/// The demo's doors: (name, board-local index). One board, three doors.
const DOORS: [(&str, u8); 3] = [("101", 0), ("102", 1), ("lobby", 2)];
const HUB_ID: &str = "demo-hub";
const SIGNER_ID: &str = "demo-cloud";
const CLOUD_CLIENT_ID: &str = "demo-cloud";
const PIN_KEY_ID: &str = "k1";
/// How long the relay stays energised: short, so entries do not overlap.
const UNLOCK_MS: u16 = 1500;
/// A small lockout policy so the story is quick.
const LOCKOUT_THRESHOLD: u32 = 3;
const LOCKOUT_BASE_S: u32 = 10;

/// Made-up PINs: demo data, printed in the story on purpose.
const PIN_ANNA: &str = "482913";
const PIN_BEN_PRE: &str = "517204";
const PIN_BEN: &str = "735046";
const PIN_WRONG: &str = "111111";
/// Step 8's PIN, typed at the OSDP reader (when there is one).
const PIN_OLGA: &str = "605318";
const PINS_LOCKOUT: [&str; 3] = ["222222", "333333", "444444"];

/// Bounds on every wait. Generous: CI machines are slow, the story is not.
const STEP_WAIT: Duration = Duration::from_secs(15);
/// The hub's reconnect backoff grows while the broker is away; after its
/// return the hub may take a few seconds to try again.
const RECONNECT_WAIT: Duration = Duration::from_secs(40);
const BROKER_START_WAIT: Duration = Duration::from_secs(10);
const PUBLISH_WAIT: Duration = Duration::from_secs(5);
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, port] = args.as_slice()
        && flag == "--broker"
    {
        return broker::run(port);
    }
    let mut opts = Options::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--interactive" => opts.interactive = true,
            "--data-dir" => match it.next() {
                Some(d) => opts.data_dir = Some(PathBuf::from(d)),
                None => return usage("--data-dir needs a folder"),
            },
            "-h" | "--help" => {
                println!("usage: demo [--interactive]");
                return ExitCode::SUCCESS;
            }
            other => return usage(&format!("unknown argument {other:?}")),
        }
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("demo: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    match runtime.block_on(demo(opts)) {
        Ok(()) => {
            println!("done in {:.1} s", started.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(Failure(why)) => {
            println!("FAILED: {why}");
            ExitCode::FAILURE
        }
    }
}

fn usage(why: &str) -> ExitCode {
    eprintln!("demo: {why}\nusage: demo [--interactive]");
    ExitCode::from(2)
}

#[derive(Default)]
struct Options {
    interactive: bool,
    data_dir: Option<PathBuf>,
}

/// Why the demo stopped short: what was expected and what happened instead.
#[derive(Debug)]
struct Failure(String);

fn fail<T>(why: impl Into<String>) -> Result<T, Failure> {
    Err(Failure(why.into()))
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure(format!("I/O: {e}"))
    }
}

/// One story line: who said it, and what.
fn say(who: &str, what: impl std::fmt::Display) {
    println!("  {who:<13} {what}");
}

fn heading(n: &str, title: &str) {
    println!("\n{n} {title}");
}

/// The step's verdict line: what the daemon did, as the test checks it.
fn ok(what: impl std::fmt::Display) {
    println!("  ok: {what}");
}

async fn demo(opts: Options) -> Result<(), Failure> {
    // --- the data folder and its secrets -------------------------------
    let (_temp, dir) = match &opts.data_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            (None, d.canonicalize()?)
        }
        None => {
            let t = tempfile::Builder::new().prefix("lockhub-demo-").tempdir()?;
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    };
    let port = testkit::ports::free_port();
    let site_id = uuid::Uuid::new_v4();
    let cloud_key = SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let pin_key: [u8; 32] = rand::random();
    let cloud = Cloud::new(cloud_key.clone(), SIGNER_ID, site_id, HUB_ID);

    // --- the board on a pseudo-terminal ----------------------------------
    let pty = pty::Pty::open();
    let (master, slave, pty_path) = pty.into_parts();
    let link = dir.join("board-a.tty");
    pty::point(&link, &pty_path);
    // Step 8's OSDP reader, if the PyPI libosdp peer is installed: it needs
    // Python, which nothing else in the demo does.
    let reader_key: [u8; 16] = rand::random();
    let reader = osdp_peer::python_path().exists().then(|| {
        let hex: String = reader_key.iter().map(|b| format!("{b:02x}")).collect();
        // libosdp's own log lines are not the demo's story: its stderr is
        // lockhub's lines only.
        osdp_peer::Peer::start(&["--key", &hex, "--address", "1", "--log-level", "emergency"])
    });
    // The board's link key, from its label: the board holds it, the
    // secrets file gets it, and the link runs sealed.
    let board_key: [u8; 32] = rand::random();
    let hub_toml = write_files(
        &dir,
        port,
        site_id,
        &cloud_key,
        &pin_key,
        Wiring {
            serial: &link,
            board_key: &board_key,
            reader: reader.as_ref().map(|r| (r.port.as_path(), &reader_key)),
        },
    )?;
    let config = lockhub::config::load(&hub_toml)
        .map_err(|e| Failure(format!("the demo's own config does not load:\n{e}")))?;
    let hub_public = config.secrets.hub_key.verifying_key();

    println!(
        "lockhub demo: the real daemon, a simulated cloud and lock board, a local MQTT broker"
    );
    heading("0.", "setup");
    say(
        "data folder",
        format!(
            "{} (hub.toml; secrets.toml, mqtt-password at 0600; lockhub.db)",
            dir.display()
        ),
    );

    // --- broker, then the cloud, then the daemon -------------------------
    let mut broker = Broker::start(port)?;
    say(
        "broker",
        format!(
            "rumqttd on 127.0.0.1:{port} (child process {})",
            broker.pid()
        ),
    );
    let (client, inbound, cloud_poll) = cloud_client(port, &config.topics().all());
    let mut w = World {
        sim: SimBoard::new_sealed(master, BoardConfig::new(1, DOORS.len() as u8), board_key),
        _slave: slave,
        board_events: Vec::new(),
        inbound,
        client,
        events_topic: config.topic(Leaf::Events),
        cloud,
        sent: Vec::new(),
        hub_public,
        results: Vec::new(),
        audit: Vec::new(),
        alerts: Vec::new(),
        syncs: Vec::new(),
        online: Vec::new(),
        subscribed: 0,
        verified: 0,
        forged: 0,
        offline: false,
        reader,
    };
    w.wait("the cloud subscribed to the hub's topics", STEP_WAIT, |w| {
        (w.subscribed > 0).then_some(())
    })
    .await?;
    broker.admit_all()?;

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let daemon = tokio::spawn(lockhub::runtime::daemon::run(config, async {
        let _ = stop_rx.await;
    }));
    say(
        "board",
        format!(
            "board-a on {} (via {}), doors {}",
            pty_path.display(),
            link.display(),
            DOORS
                .iter()
                .map(|(n, i)| format!("{n}={i}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    );
    w.wait("a sealed session with the board", STEP_WAIT, |w| {
        (w.sim.board().has_session() && w.sim.board().link_up(w.sim.now_ms())).then_some(())
    })
    .await?;
    say(
        "board",
        "link up, sealed: a session under the board's link key (a tap on the wire reads no PIN)",
    );
    let online = w
        .wait("the hub's online status", STEP_WAIT, |w| {
            w.online.last().cloned()
        })
        .await?;
    say("hub -> cloud", format!("status {online}"));
    let sync = w
        .wait("the hub's first sync request", STEP_WAIT, |w| {
            w.syncs.first().cloned()
        })
        .await?;
    say(
        "hub -> cloud",
        format!(
            "sync request from seq {} ({}); the cloud answers with a checkpoint",
            sync["from_seq"],
            sync["reason"].as_str().unwrap_or("?")
        ),
    );

    let story = if opts.interactive {
        interactive(&mut w, &pin_key).await
    } else {
        story(&mut w, &mut broker, &pin_key).await
    };

    // --- stop: daemon, cloud, broker --------------------------------------
    let _ = stop_tx.send(());
    let stopped = tokio::time::timeout(SHUTDOWN_WAIT, async {
        // Keep the board answering while the daemon closes its port.
        let mut daemon = daemon;
        loop {
            tokio::select! {
                r = &mut daemon => return r,
                _ = w.sim.step() => {}
            }
        }
    })
    .await;
    cloud_poll.abort();
    broker.stop();
    story?;
    match stopped {
        Err(_) => fail("the daemon did not stop within 10 s"),
        Ok(Err(e)) => fail(format!("the daemon task failed: {e}")),
        Ok(Ok(Err(e))) => fail(format!("the daemon stopped with an error: {e}")),
        Ok(Ok(Ok(()))) => {
            if w.forged > 0 {
                return fail(format!(
                    "{} hub messages failed signature verification",
                    w.forged
                ));
            }
            println!(
                "\nthe daemon stopped cleanly; the cloud verified the hub's signature on all {} messages it received",
                w.verified
            );
            Ok(())
        }
    }
}

/// The seven steps. Each ends in an `ok:` line built from what was observed.
async fn story(w: &mut World, broker: &mut Broker, pin_key: &[u8; 32]) -> Result<(), Failure> {
    let pk = (PIN_KEY_ID, pin_key);

    heading("1.", "a key is issued (cloud -> hub)");
    let anna = GrantSpec::active("k-anna", "c-anna", "101", PIN_ANNA, pk);
    let ev = w.cloud.key_issued(&anna, &[]);
    say(
        "cloud -> hub",
        format!(
            "key.issued k-anna for door 101 (PIN {PIN_ANNA}), seq {}",
            ev.seq.unwrap_or(0)
        ),
    );
    let r = w.send(ev).await?;
    expect_outcome(&r, "applied")?;
    w.audit_of("key.activated", None, Some("k-anna")).await?;
    ok("key issued: result applied");

    heading("2.", "the PIN opens door 101");
    let e = w.enter("101", PIN_ANNA).await?;
    e.expect_opened()?;
    ok(format!(
        "door 101 opened: relay opened, audit {} + {}",
        e.audit_kind(0),
        e.audit_kind(1)
    ));

    heading("3.", "a wrong PIN is denied");
    let e = w.enter("101", PIN_WRONG).await?;
    e.expect_denied(1, "door.denied", Some("unknown_pin"))?;
    ok("wrong PIN denied: door.denied unknown_pin");

    heading("4.", "check-in hands off the pre-issued key");
    let pre = GrantSpec::pre_issued("k-ben-pre", "r-ben", "102", PIN_BEN_PRE, pk);
    let ev = w.cloud.key_issued(&pre, &[]);
    say(
        "cloud -> hub",
        format!(
            "key.issued k-ben-pre (pre_issued, reservation r-ben) for door 102 (PIN {PIN_BEN_PRE}), seq {}",
            ev.seq.unwrap_or(0)
        ),
    );
    expect_outcome(&w.send(ev).await?, "applied")?;
    let mut ben = GrantSpec::active("k-ben", "c-ben", "102", PIN_BEN, pk);
    ben.doors = vec!["102".to_owned(), "lobby".to_owned()];
    let ev = w.cloud.checkin("r-ben", "c-ben", &ben);
    say(
        "cloud -> hub",
        format!(
            "checkin.completed r-ben -> k-ben for doors 102 and lobby (PIN {PIN_BEN}), seq {}",
            ev.seq.unwrap_or(0)
        ),
    );
    expect_outcome(&w.send(ev).await?, "applied")?;
    let revoked = w.audit_of("key.revoked", None, Some("k-ben-pre")).await?;
    if revoked["reason"] != "superseded_by_checkin" {
        return fail(format!(
            "expected k-ben-pre revoked as superseded_by_checkin, the audit says {}",
            revoked["reason"]
        ));
    }
    w.audit_of("key.activated", None, Some("k-ben")).await?;
    let old = w.enter("102", PIN_BEN_PRE).await?;
    old.expect_denied(1, "door.denied", Some("unknown_pin"))?;
    let new = w.enter("102", PIN_BEN).await?;
    new.expect_opened()?;
    ok("hand-off: checkin.completed applied, pre-issued PIN denied, new PIN opened door 102");

    heading("5.", "a revoked key is denied");
    let ev = w.cloud.key_revoked("k-anna", 1, "guest_checked_out");
    say(
        "cloud -> hub",
        format!(
            "key.revoked k-anna (guest_checked_out), seq {}",
            ev.seq.unwrap_or(0)
        ),
    );
    expect_outcome(&w.send(ev).await?, "applied")?;
    w.audit_of("key.revoked", None, Some("k-anna")).await?;
    let e = w.enter("101", PIN_ANNA).await?;
    e.expect_denied(1, "door.denied", Some("unknown_pin"))?;
    ok("revoked key denied: door.denied unknown_pin");

    heading(
        "6.",
        &format!("lockout: {LOCKOUT_THRESHOLD} wrong PINs at the lobby keypad"),
    );
    let alerts_before = w.alerts.len();
    for (i, pin) in PINS_LOCKOUT.iter().enumerate() {
        let e = w.enter("lobby", pin).await?;
        // The denial that reaches the threshold already answers "locked out".
        let want = if i + 1 == PINS_LOCKOUT.len() { 2 } else { 1 };
        e.expect_denied(want, "door.denied", Some("unknown_pin"))?;
    }
    let alert = w
        .wait("alert keypad_lockout raised for lobby", STEP_WAIT, |w| {
            w.alerts[alerts_before..]
                .iter()
                .find(|a| {
                    a["condition"] == "keypad_lockout"
                        && a["subject"] == "lobby"
                        && a["state"] == "raised"
                })
                .cloned()
        })
        .await?;
    say(
        "hub -> cloud",
        format!(
            "alert {} {} {} (count {})",
            alert["condition"].as_str().unwrap_or("?"),
            alert["subject"].as_str().unwrap_or("?"),
            alert["state"].as_str().unwrap_or("?"),
            alert["count"]
        ),
    );
    let e = w.enter("lobby", PIN_BEN).await?;
    e.expect_denied(2, "door.locked_out", None)?;
    ok(format!(
        "locked out: keypad_lockout alert raised, even the right PIN got Deny reason 2 (for {LOCKOUT_BASE_S} s)"
    ));

    heading(
        "7.",
        "the broker goes away; the door still works; the audit follows when it returns",
    );
    // Said on stderr too, where the daemon's warning about it will appear.
    eprintln!(
        "demo: step 7 stops the broker on purpose; the daemon's `mqtt connection lost` warning that follows is expected"
    );
    broker.kill();
    w.offline = true;
    say(
        "broker",
        "stopped (child process killed; rumqttd loses every session)",
    );
    let mark = w.mark();
    let e = w.enter("102", PIN_BEN).await?;
    e.expect_opened()?;
    // Give a connected hub every chance to deliver: nothing may arrive.
    w.run_for(Duration::from_millis(500)).await?;
    let during = w.audit.len() - mark.audit;
    say(
        "cloud",
        format!("received {during} audit records while the broker was down"),
    );
    ok("offline open: door 102 opened with the broker down");

    // Counted before the restart: the cloud may well subscribe while the
    // loop below is still waiting for the port.
    let subs = w.subscribed;
    broker.restart()?;
    let end = Instant::now() + BROKER_START_WAIT;
    while !broker.accepting()? {
        if Instant::now() >= end {
            return fail(format!(
                "the broker did not come back within {} s",
                BROKER_START_WAIT.as_secs()
            ));
        }
        w.run_for(Duration::from_millis(20)).await?;
    }
    say(
        "broker",
        format!(
            "back on 127.0.0.1:{} (child process {})",
            broker.port,
            broker.pid()
        ),
    );
    w.wait("the cloud to subscribe again", RECONNECT_WAIT, |w| {
        (w.subscribed > subs).then_some(())
    })
    .await?;
    broker.admit_all()?;
    w.offline = false;
    let sync = w
        .wait(
            "the hub's sync request after reconnecting",
            RECONNECT_WAIT,
            |w| w.syncs.get(mark.syncs).cloned(),
        )
        .await?;
    say(
        "hub -> cloud",
        format!(
            "reconnected; sync request from seq {} ({}); the cloud answers",
            sync["from_seq"],
            sync["reason"].as_str().unwrap_or("?")
        ),
    );
    let seen_before: HashSet<String> = w.audit[..mark.audit]
        .iter()
        .filter_map(|a| a["audit_id"].as_str().map(str::to_owned))
        .collect();
    let offline_ids = |w: &World| -> Vec<Value> {
        let mut ids = BTreeSet::new();
        w.audit[mark.audit..]
            .iter()
            .filter(|a| {
                a["audit_id"]
                    .as_str()
                    .is_some_and(|id| !seen_before.contains(id) && ids.insert(id.to_owned()))
            })
            .cloned()
            .collect()
    };
    w.wait(
        "the offline door.granted and door.unlocked at the cloud",
        RECONNECT_WAIT,
        |w| {
            let got = offline_ids(w);
            let has = |kind: &str| {
                got.iter()
                    .any(|a| a["kind"] == kind && a["door"] == "102" && a["key_id"] == "k-ben")
            };
            (has("door.granted") && has("door.unlocked")).then_some(())
        },
    )
    .await?;
    // Whatever else was waiting in the outbox arrives in the same burst.
    w.run_for(Duration::from_millis(500)).await?;
    let delivered = offline_ids(w);
    for a in &delivered {
        say("hub -> cloud", format!("audit {}", describe_audit(a)));
    }
    ok(format!(
        "audit delivered after reconnect: {} records the cloud had not seen",
        delivered.len()
    ));
    osdp_door(w, pin_key).await
}

/// Step 8: a door on an OSDP reader (the PyPI `libosdp` PeripheralDevice
/// on a pseudo-terminal) over a Secure Channel; skipped, and said so, when
/// that peer is not installed.
async fn osdp_door(w: &mut World, pin_key: &[u8; 32]) -> Result<(), Failure> {
    heading("8.", "a door on an OSDP reader (Secure Channel)");
    if w.reader.is_none() {
        say(
            "reader",
            format!(
                "skipped: this part needs Python and the PyPI libosdp package in {} \
                 (./scripts/test installs it there)",
                osdp_peer::python_path().display()
            ),
        );
        return Ok(());
    }
    wait_reader(w, "the reader's Secure Channel", |v| v["sc"] == true).await?;
    say(
        "reader",
        "r-201 (libosdp PeripheralDevice, address 1): Secure Channel up",
    );
    let olga = GrantSpec::active("k-olga", "c-olga", "201", PIN_OLGA, (PIN_KEY_ID, pin_key));
    let ev = w.cloud.key_issued(&olga, &[]);
    say(
        "cloud -> hub",
        format!(
            "key.issued k-olga for door 201 (PIN {PIN_OLGA}), seq {}",
            ev.seq.unwrap_or(0)
        ),
    );
    expect_outcome(&w.send(ev).await?, "applied")?;
    let mut keys = PIN_OLGA.as_bytes().to_vec();
    keys.push(0x0D);
    if let Some(r) = w.reader.as_mut() {
        r.forget();
        r.keys(&keys);
    }
    say("reader", format!("typed {PIN_OLGA}#"));
    let out = wait_reader(w, "the reader's osdp_OUT", |v| v["cmd"] == "output").await?;
    say(
        "reader",
        format!(
            "osdp_OUT output {} control 0x{:02x} for {} x 100 ms",
            out["output_no"],
            out["control_code"].as_u64().unwrap_or(0),
            out["timer_count"]
        ),
    );
    w.audit_of("door.granted", Some("201"), Some("k-olga"))
        .await?;
    w.audit_of("door.unlocked", Some("201"), Some("k-olga"))
        .await?;
    ok("door 201 opened at the OSDP reader: audit door.granted + door.unlocked");
    Ok(())
}

/// Pumps the world until the reader has printed a line that satisfies `f`.
async fn wait_reader(
    w: &mut World,
    what: &str,
    f: impl Fn(&Value) -> bool,
) -> Result<Value, Failure> {
    let end = Instant::now() + STEP_WAIT;
    loop {
        if let Some(r) = w.reader.as_mut() {
            r.drain();
            if let Some(v) = r.seen.iter().find(|v| f(v)) {
                return Ok(v.clone());
            }
        }
        if Instant::now() >= end {
            return fail(format!(
                "expected {what} within {} s; it did not happen",
                STEP_WAIT.as_secs()
            ));
        }
        w.pump().await?;
    }
}

/// `--interactive`: keys for Anna and Ben, then `DOOR PIN` lines from stdin.
async fn interactive(w: &mut World, pin_key: &[u8; 32]) -> Result<(), Failure> {
    let pk = (PIN_KEY_ID, pin_key);
    heading("1.", "keys issued (cloud -> hub)");
    let anna = GrantSpec::active("k-anna", "c-anna", "101", PIN_ANNA, pk);
    let mut ben = GrantSpec::active("k-ben", "c-ben", "102", PIN_BEN, pk);
    ben.doors = vec!["102".to_owned(), "lobby".to_owned()];
    for (g, what) in [
        (&anna, format!("k-anna for door 101 (PIN {PIN_ANNA})")),
        (
            &ben,
            format!("k-ben for doors 102 and lobby (PIN {PIN_BEN})"),
        ),
    ] {
        let ev = w.cloud.key_issued(g, &[]);
        say("cloud -> hub", format!("key.issued {what}"));
        expect_outcome(&w.send(ev).await?, "applied")?;
    }
    println!(
        "\nType a door and a PIN, e.g. `101 {PIN_ANNA}` (doors: 101, 102, lobby); `quit` ends.\n\
         {LOCKOUT_THRESHOLD} wrong PINs at one door lock its keypad for {LOCKOUT_BASE_S} s."
    );
    let (tx, mut lines) = mpsc::channel::<String>(16);
    // A thread: the runtime has no async stdin, and a blocking read must not
    // stall the board's timers.
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    loop {
        print!("> ");
        let _ = std::io::stdout().flush();
        let line = loop {
            match lines.try_recv() {
                Ok(l) => break Some(l),
                Err(mpsc::error::TryRecvError::Empty) => w.pump().await?,
                Err(mpsc::error::TryRecvError::Disconnected) => break None,
            }
        };
        let Some(line) = line else {
            println!();
            return Ok(());
        };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [] => {}
            ["quit"] | ["exit"] => return Ok(()),
            [door, pin] if door_index(door).is_some() => {
                if pin.is_empty() || !pin.chars().all(|c| c.is_ascii_digit()) {
                    println!("a PIN is digits");
                    continue;
                }
                match w.enter(door, pin).await {
                    Ok(_) => {}
                    Err(Failure(why)) => println!("  ? {why}"),
                }
            }
            _ => println!("type DOOR PIN (doors: 101, 102, lobby), or quit"),
        }
    }
}

fn expect_outcome(result: &Value, want: &str) -> Result<(), Failure> {
    let got = result["outcome"].as_str().unwrap_or("?");
    if got == want {
        Ok(())
    } else {
        fail(format!(
            "expected result {want}, the hub answered {got} (reason {})",
            result["reason"]
        ))
    }
}

fn door_index(name: &str) -> Option<u8> {
    DOORS.iter().find(|(n, _)| *n == name).map(|(_, i)| *i)
}

fn describe_audit(a: &Value) -> String {
    let mut s = a["kind"].as_str().unwrap_or("?").to_owned();
    for (field, label) in [("door", "door"), ("key_id", "key"), ("reason", "reason")] {
        if let Some(v) = a[field].as_str() {
            s.push_str(&format!(" {label} {v}"));
        }
    }
    s
}
