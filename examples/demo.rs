//! The lockhub demo: the real daemon, deciding at a simulated door, synced
//! with a simulated cloud through a real MQTT broker, all on this machine.
//!
//! ```sh
//! cargo run --release --example demo                 # the story, ~15 s
//! cargo run --release --example demo -- --interactive  # type `101 482913`
//! ```
//!
//! What runs, and why each part is the one it is:
//! - **The daemon** is [`lockhub::daemon::run`], the same function `lockhub
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
//!   building uses Mosquitto (see `tests/common/mosquitto.rs`).
//!   Because a restarted rumqttd forgets subscriptions, the child admits only
//!   the cloud until the cloud has subscribed again; otherwise the hub could
//!   deliver its audit into a broker with nobody listening.
//! - **The cloud** is [`lockhub::sim::cloud::Cloud`], which signs events as a
//!   real cloud would; it publishes them with rumqttc, listens on results,
//!   audit, alerts, sync and status, verifies the hub's signature on every
//!   message, and answers sync requests.
//! - **The OSDP reader** (step 8, optional) is the PyPI `libosdp`
//!   PeripheralDevice (`tests/osdp/peer.py`) on its own pseudo-terminal,
//!   keyed with a fresh Secure Channel key; it needs Python and the package
//!   that `./scripts/test` installs into `target/osdp-venv`. Without it the
//!   step says it is skipped, and the rest of the story is unchanged.
//! - **The board** is [`lockhub::sim::board::SimBoard`] (the firmware's own
//!   state machine) on the master side of a pseudo-terminal; the daemon
//!   opens the slave through a symlink, as it opens `/dev/serial/by-id/...`.
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

/// The OSDP reader of step 8: the PyPI `libosdp` PeripheralDevice
/// (tests/osdp/peer.py), when scripts/test has installed it.
#[path = "../tests/common/osdp_peer.rs"]
#[allow(dead_code)]
mod osdp_peer;
#[path = "../tests/common/pty.rs"]
mod pty;

use std::collections::{BTreeSet, HashSet};
use std::io::{BufRead, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use ed25519_dalek::{SigningKey, VerifyingKey};
use firmware_bridge::{BoardConfig, Downlink};
use lockhub::crypto;
use lockhub::sim::board::{SimBoard, SimEvent};
use lockhub::sim::cloud::{Cloud, GrantSpec, SignedEvent};
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
    let port = free_port()?;
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
        osdp_peer::Peer::start(&["--key", &hex, "--address", "1"])
    });
    let hub_toml = write_files(
        &dir,
        port,
        site_id,
        &cloud,
        &cloud_key,
        &pin_key,
        Wiring {
            serial: &link,
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
    let (client, inbound, cloud_poll) = cloud_client(port, &config.topic("#"));
    let mut w = World {
        sim: SimBoard::new(master, BoardConfig::new(1, DOORS.len() as u8)),
        _slave: slave,
        board_events: Vec::new(),
        inbound,
        client,
        events_topic: config.topic("events"),
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
    let daemon = tokio::spawn(lockhub::daemon::run(config, async {
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
    w.wait("the hub to say Hello to the board", STEP_WAIT, |w| {
        (w.board_events
            .iter()
            .any(|e| matches!(e, SimEvent::Received(Downlink::Hello { .. })))
            && w.sim.board().link_up(w.sim.now_ms()))
        .then_some(())
    })
    .await?;
    say("board", "link up: the hub said Hello");
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

// ---------------------------------------------------------------------------
// What the demo sees
// ---------------------------------------------------------------------------

/// Everything the demo observes, owned by one task: the board is stepped
/// and the cloud's inbox drained in the same loop that waits, so no lock
/// is needed and nothing is missed between a check and a wait.
struct World {
    sim: SimBoard<pty::Master>,
    /// Held so the pty stays up while the daemon closes and reopens it.
    _slave: std::os::fd::OwnedFd,
    board_events: Vec<SimEvent>,
    inbound: mpsc::Receiver<Inbound>,
    client: AsyncClient,
    events_topic: String,
    cloud: Cloud,
    /// Every event the cloud sent, to answer sync requests.
    sent: Vec<SignedEvent>,
    hub_public: VerifyingKey,
    results: Vec<Value>,
    audit: Vec<Value>,
    alerts: Vec<Value>,
    syncs: Vec<Value>,
    online: Vec<String>,
    /// SubAcks the cloud received (one per connection).
    subscribed: usize,
    verified: usize,
    forged: usize,
    /// The broker is down: nothing can reach the cloud.
    offline: bool,
    /// Step 8's OSDP reader, when the PyPI libosdp peer is installed.
    reader: Option<osdp_peer::Peer>,
}

/// Positions in the observed lists, to look only at what came after.
#[derive(Clone, Copy)]
struct Mark {
    board: usize,
    audit: usize,
    syncs: usize,
}

/// What the daemon did with one keypad entry.
struct Entry {
    door: String,
    /// `Ok(ms)` for an Unlock whose relay opened, `Err(reason)` for a Deny.
    decision: Result<u16, u8>,
    /// The entry's audit records at the cloud (empty while offline).
    audit: Vec<Value>,
}

impl Entry {
    fn audit_kind(&self, i: usize) -> &str {
        self.audit
            .get(i)
            .and_then(|a| a["kind"].as_str())
            .unwrap_or("(none)")
    }

    fn expect_opened(&self) -> Result<(), Failure> {
        match self.decision {
            Ok(_) => Ok(()),
            Err(r) => fail(format!(
                "expected door {} to open, the hub sent Deny reason {r}",
                self.door
            )),
        }
    }

    fn expect_denied(&self, reason: u8, kind: &str, why: Option<&str>) -> Result<(), Failure> {
        match self.decision {
            Ok(_) => {
                return fail(format!(
                    "expected door {} to stay shut, the relay opened",
                    self.door
                ));
            }
            Err(r) if r != reason => {
                return fail(format!(
                    "expected Deny reason {reason} at door {}, got reason {r}",
                    self.door
                ));
            }
            Err(_) => {}
        }
        let a = self.audit.first().cloned().unwrap_or(Value::Null);
        if a["kind"] != kind || why.is_some_and(|w| a["reason"] != w) {
            return fail(format!(
                "expected audit {kind} {} at door {}, got {}",
                why.unwrap_or(""),
                self.door,
                describe_audit(&a)
            ));
        }
        Ok(())
    }
}

impl World {
    fn mark(&self) -> Mark {
        Mark {
            board: self.board_events.len(),
            audit: self.audit.len(),
            syncs: self.syncs.len(),
        }
    }

    /// One turn: step the board (waits at most a few ms for bytes), then
    /// take in whatever reached the cloud.
    async fn pump(&mut self) -> Result<(), Failure> {
        self.sim
            .step()
            .await
            .map_err(|e| Failure(format!("the simulated board stopped: {e}")))?;
        self.board_events.extend(self.sim.take_events());
        while let Ok(msg) = self.inbound.try_recv() {
            self.on_inbound(msg).await?;
        }
        Ok(())
    }

    async fn run_for(&mut self, d: Duration) -> Result<(), Failure> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.pump().await?;
        }
        Ok(())
    }

    /// Pumps until `f` gives a value, or fails naming `what` after `limit`.
    async fn wait<T>(
        &mut self,
        what: &str,
        limit: Duration,
        mut f: impl FnMut(&World) -> Option<T>,
    ) -> Result<T, Failure> {
        let end = Instant::now() + limit;
        loop {
            if let Some(v) = f(self) {
                return Ok(v);
            }
            if Instant::now() >= end {
                return fail(format!(
                    "expected {what} within {} s; it did not happen",
                    limit.as_secs()
                ));
            }
            self.pump().await?;
        }
    }

    async fn on_inbound(&mut self, msg: Inbound) -> Result<(), Failure> {
        let (topic, payload) = match msg {
            Inbound::Subscribed => {
                self.subscribed += 1;
                return Ok(());
            }
            Inbound::Publish { topic, payload } => (topic, payload),
        };
        let leaf = topic.rsplit('/').next().unwrap_or("");
        if leaf == "status" {
            // Plain JSON, unsigned by contract: a hint, not a record.
            let v: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
            if let Some(s) = v["state"].as_str() {
                self.online.push(s.to_owned());
            }
            return Ok(());
        }
        if leaf == "events" {
            return Ok(()); // our own publishes, echoed by the wildcard
        }
        let Some(body) = self.open_envelope(&payload) else {
            self.forged += 1;
            say(
                "cloud",
                format!("REFUSED a message on {leaf}: the hub's signature does not verify"),
            );
            return Ok(());
        };
        self.verified += 1;
        match leaf {
            "results" => self.results.push(body),
            "audit" => self.audit.push(body),
            "alerts" => self.alerts.push(body),
            "sync" => {
                self.answer_sync(&body).await?;
                self.syncs.push(body);
            }
            _ => {}
        }
        Ok(())
    }

    /// Verifies a hub envelope with the hub's public key (the key the cloud
    /// registered at provisioning) over the exact body bytes, then parses.
    fn open_envelope(&self, payload: &[u8]) -> Option<Value> {
        let env: Value = serde_json::from_slice(payload).ok()?;
        if env["v"] != 1 || env["hub_id"] != HUB_ID {
            return None;
        }
        let body = crypto::b64u_decode(env["body"].as_str()?)?;
        let sig: [u8; 64] = crypto::b64u_decode(env["sig"].as_str()?)?.try_into().ok()?;
        crypto::verify(crypto::HUB_CONTEXT, &self.hub_public, &body, &sig)
            .then(|| serde_json::from_slice(&body).ok())
            .flatten()
    }

    /// A sync request: re-send the events from `from_seq` with their
    /// original ids and bodies, then a checkpoint (mqtt.md 'Seq, gaps').
    async fn answer_sync(&mut self, req: &Value) -> Result<(), Failure> {
        let from = req["from_seq"].as_u64().unwrap_or(1);
        let resend: Vec<Vec<u8>> = self
            .sent
            .iter()
            .filter(|e| e.seq.is_some_and(|s| s >= from))
            .map(|e| e.envelope.clone())
            .collect();
        for env in resend {
            self.publish(env).await?;
        }
        let cp = self.cloud.checkpoint();
        self.publish(cp.envelope).await
    }

    async fn publish(&self, envelope: Vec<u8>) -> Result<(), Failure> {
        match tokio::time::timeout(
            PUBLISH_WAIT,
            self.client
                .publish(&self.events_topic, QoS::AtLeastOnce, false, envelope),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => fail(format!("the cloud cannot publish: {e}")),
            Err(_) => fail("the cloud's publish queue stayed full for 5 s"),
        }
    }

    /// Publishes a signed event and waits for the hub's result for it.
    async fn send(&mut self, ev: SignedEvent) -> Result<Value, Failure> {
        self.publish(ev.envelope.clone()).await?;
        let id = ev.event_id.to_string();
        self.sent.push(ev);
        let r = self
            .wait("the hub's result for the event", STEP_WAIT, |w| {
                w.results
                    .iter()
                    .find(|r| r["event_id"] == id.as_str())
                    .cloned()
            })
            .await?;
        let mut line = format!(
            "result {} (seq {})",
            r["outcome"].as_str().unwrap_or("?"),
            r["seq"]
        );
        if let Some(reason) = r["reason"].as_str() {
            line.push_str(&format!(", reason {reason}"));
        }
        say("hub -> cloud", line);
        Ok(r)
    }

    /// Waits for an audit record of `kind` (for `door` / `key`, if given)
    /// among all received so far, and prints it.
    async fn audit_of(
        &mut self,
        kind: &str,
        door: Option<&str>,
        key: Option<&str>,
    ) -> Result<Value, Failure> {
        let a = self
            .wait(&format!("audit {kind}"), STEP_WAIT, |w| {
                w.audit
                    .iter()
                    .find(|a| {
                        a["kind"] == kind
                            && door.is_none_or(|d| a["door"] == d)
                            && key.is_none_or(|k| a["key_id"] == k)
                    })
                    .cloned()
            })
            .await?;
        say("hub -> cloud", format!("audit {}", describe_audit(&a)));
        Ok(a)
    }

    /// Types `pin` and `#` at `door`, then reports what the board got back
    /// (Unlock and the relay, or Deny and its reason) and, while the broker
    /// is up, the entry's audit records at the cloud.
    async fn enter(&mut self, door: &str, pin: &str) -> Result<Entry, Failure> {
        let Some(index) = door_index(door) else {
            return fail(format!("no door {door}"));
        };
        // As a person would: wait for the door to lock again first, so the
        // relay opening below is this entry's and not the last one's.
        self.wait(
            &format!("the relay at door {door} to close"),
            STEP_WAIT,
            |w| (!w.sim.relay_open(index)).then_some(()),
        )
        .await?;
        let m = self.mark();
        self.sim.enter_pin(index, pin);
        say("board", format!("typed {pin}# at door {door}"));
        let answer = self
            .wait(&format!("Unlock or Deny at door {door}"), STEP_WAIT, |w| {
                w.board_events[m.board..].iter().find_map(|e| match e {
                    SimEvent::Received(Downlink::Unlock { door: d, ms, .. }) if *d == index => {
                        Some(Ok(*ms))
                    }
                    SimEvent::Received(Downlink::Deny {
                        door: d, reason, ..
                    }) if *d == index => Some(Err(reason.0)),
                    _ => None,
                })
            })
            .await?;
        let decision = match answer {
            Ok(ms) => {
                self.wait(
                    &format!("the relay at door {door} to open"),
                    STEP_WAIT,
                    |w| {
                        w.board_events[m.board..]
                            .contains(&SimEvent::RelayOpened { door: index })
                            .then_some(())
                    },
                )
                .await?;
                say(
                    "board",
                    format!("Unlock for {ms} ms: relay at door {door} opened"),
                );
                Ok(ms)
            }
            Err(reason) => {
                let what = match reason {
                    1 => "denied",
                    2 => "locked out",
                    _ => "unknown reason",
                };
                say("board", format!("Deny reason {reason} ({what})"));
                Err(reason)
            }
        };
        let mut audit = Vec::new();
        if !self.offline {
            let kinds: &[&str] = match decision {
                Ok(_) => &["door.granted", "door.unlocked"],
                Err(_) => &["door.denied"],
            };
            for (i, kind) in kinds.iter().enumerate() {
                let a = self
                    .wait(&format!("audit {kind} for door {door}"), STEP_WAIT, |w| {
                        w.audit[m.audit..]
                            .iter()
                            .filter(|a| {
                                a["door"] == door
                                    && a["kind"].as_str().is_some_and(|k| k.starts_with("door."))
                            })
                            .nth(i)
                            .cloned()
                    })
                    .await?;
                say("hub -> cloud", format!("audit {}", describe_audit(&a)));
                audit.push(a);
            }
        }
        Ok(Entry {
            door: door.to_owned(),
            decision,
            audit,
        })
    }
}

// ---------------------------------------------------------------------------
// The cloud's MQTT client
// ---------------------------------------------------------------------------

enum Inbound {
    Subscribed,
    Publish { topic: String, payload: Vec<u8> },
}

/// The cloud's connection: subscribes to everything under the hub on every
/// connection (a restarted rumqttd has forgotten it), and forwards what
/// arrives. It reconnects after a short pause whenever the broker is away.
fn cloud_client(
    port: u16,
    filter: &str,
) -> (
    AsyncClient,
    mpsc::Receiver<Inbound>,
    tokio::task::JoinHandle<()>,
) {
    let mut o = MqttOptions::new(CLOUD_CLIENT_ID, "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(10))
        .set_clean_session(true)
        .set_credentials(CLOUD_CLIENT_ID, "demo")
        .set_max_packet_size(4 << 20, 4 << 20);
    let (client, mut eventloop) = AsyncClient::new(o, 64);
    let (tx, rx) = mpsc::channel(1024);
    let sub = client.clone();
    let filter = filter.to_owned();
    let task = tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    // try_: the poll task must never wait on its own queue.
                    let _ = sub.try_subscribe(filter.clone(), QoS::AtLeastOnce);
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => {
                    if tx.send(Inbound::Subscribed).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let msg = Inbound::Publish {
                        topic: p.topic.clone(),
                        payload: p.payload.to_vec(),
                    };
                    if tx.send(msg).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    (client, rx, task)
}

// ---------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------

fn free_port() -> Result<u16, Failure> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn write_private(path: &Path, contents: &str) -> Result<(), Failure> {
    // Created 0600 before anything is written, so no secret is ever readable.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(contents.as_bytes())?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// Writes hub.toml, secrets.toml, the MQTT password and the simulated
/// cloud's signing key; returns hub.toml's path.
/// Where the doors are: the board's pty link and, for step 8, the OSDP
/// reader's pty and its Secure Channel key.
struct Wiring<'a> {
    serial: &'a Path,
    reader: Option<(&'a Path, &'a [u8; 16])>,
}

fn write_files(
    dir: &Path,
    port: u16,
    site_id: uuid::Uuid,
    cloud: &Cloud,
    cloud_key: &SigningKey,
    pin_key: &[u8; 32],
    doors: Wiring<'_>,
) -> Result<PathBuf, Failure> {
    let Wiring { serial, reader } = doors;
    let hub_key: [u8; 32] = rand::random();
    let password = crypto::b64u_encode(&rand::random::<[u8; 18]>());
    write_private(
        &dir.join("secrets.toml"),
        &format!(
            "[hub_key]\nsecret = \"{}\"\n\n[[pin_key]]\nid = \"{PIN_KEY_ID}\"\nsecret = \"{}\"\n{}",
            crypto::b64u_encode(&hub_key),
            crypto::b64u_encode(pin_key),
            reader
                .map(|(_, k)| format!(
                    "\n[[reader_key]]\nreader = \"r-201\"\nscbk = \"{}\"\n",
                    crypto::b64u_encode(k)
                ))
                .unwrap_or_default()
        ),
    )?;
    write_private(&dir.join("mqtt-password"), &format!("{password}\n"))?;
    // Not the hub's: the simulated cloud's key, kept beside the rest so the
    // folder tells the whole story (and the test can check nothing leaks).
    write_private(
        &dir.join("cloud-signer.key"),
        &format!("{}\n", crypto::b64u_encode(&cloud_key.to_bytes())),
    )?;
    let mut doors = String::new();
    for (name, index) in DOORS {
        doors.push_str(&format!(
            "\n[[door]]\nname = \"{name}\"\nserial = \"board-a\"\nindex = {index}\nunlock_ms = {UNLOCK_MS}\n"
        ));
    }
    if let Some((port, _)) = reader {
        doors.push_str(&format!(
            "\n[[osdp]]\nname = \"bus-a\"\nport = \"{}\"\nbaud = 9600\n\n\
             [[reader]]\nname = \"r-201\"\nbus = \"bus-a\"\naddress = 1\n\n\
             [[door]]\nname = \"201\"\nreader = \"r-201\"\noutput = 0\nunlock_ms = {UNLOCK_MS}\n",
            port.display()
        ));
    }
    let hub = format!(
        "# Written by the lockhub demo: a hub on loopback with a simulated board.
[hub]
site_id = \"{site_id}\"
hub_id = \"{HUB_ID}\"
data_dir = \"{dir}\"

[mqtt]
url = \"mqtt://127.0.0.1:{port}\"
username = \"{HUB_ID}\"
password_file = \"mqtt-password\"

[[trust.signer]]
id = \"{SIGNER_ID}\"
public_key = \"{cloud_pub}\"

[secrets]
file = \"secrets.toml\"

[[serial]]
name = \"board-a\"
# A symlink to the pseudo-terminal, as /dev/serial/by-id/... is to a tty.
port = \"{serial}\"
baud = 115200
{doors}
[policy]
lockout_threshold = {LOCKOUT_THRESHOLD}
lockout_window_s = 300
lockout_base_s = {LOCKOUT_BASE_S}
",
        dir = dir.display(),
        cloud_pub = cloud.public_key_b64u(),
        serial = serial.display(),
    );
    let path = dir.join("hub.toml");
    std::fs::write(&path, hub)?;
    Ok(path)
}

// ---------------------------------------------------------------------------
// The broker, in a child process
// ---------------------------------------------------------------------------

/// The broker child: this binary run with `--broker PORT`. Its stdin is a
/// pipe from the demo: a line `open` admits every client; end of input (the
/// demo exited, however it exited) ends the broker, so none is left behind.
struct Broker {
    port: u16,
    child: Option<(Child, ChildStdin)>,
}

impl Broker {
    fn start(port: u16) -> Result<Broker, Failure> {
        let mut b = Broker { port, child: None };
        b.restart()?;
        let end = Instant::now() + BROKER_START_WAIT;
        while !b.accepting()? {
            if Instant::now() >= end {
                return fail(format!(
                    "the broker did not accept on port {port} within {} s",
                    BROKER_START_WAIT.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(b)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |(c, _)| c.id())
    }

    /// Starts a new child on the same port. Returns at once: callers wait
    /// for [`Broker::accepting`] while they keep the board stepping.
    fn restart(&mut self) -> Result<(), Failure> {
        self.kill();
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(["--broker", &self.port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        let Some(stdin) = child.stdin.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return fail("the broker child has no stdin");
        };
        self.child = Some((child, stdin));
        Ok(())
    }

    /// Whether the child accepts connections yet; an error once it exited.
    fn accepting(&mut self) -> Result<bool, Failure> {
        if let Some((c, _)) = self.child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            return fail(format!("the broker exited at start ({status})"));
        }
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        // Loopback: refused at once while nothing listens.
        Ok(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok())
    }

    /// Lets every client in (until now only the cloud was admitted).
    fn admit_all(&mut self) -> Result<(), Failure> {
        match self.child.as_mut() {
            Some((_, stdin)) => {
                stdin.write_all(b"open\n")?;
                stdin.flush()?;
                Ok(())
            }
            None => fail("no broker is running"),
        }
    }

    /// Kills the child: every connection drops at once, as when a broker
    /// host loses power.
    fn kill(&mut self) {
        if let Some((mut child, stdin)) = self.child.take() {
            drop(stdin);
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn stop(&mut self) {
        self.kill();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

mod broker {
    //! The child side: rumqttd on one loopback port, v4 only, no console
    //! and no metrics listener.

    use std::collections::HashMap;
    use std::io::BufRead;
    use std::process::ExitCode;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use rumqttd::{Broker, Config, ConnectionSettings, RouterConfig, ServerSettings};

    pub fn run(port: &str) -> ExitCode {
        let Ok(port) = port.parse::<u16>() else {
            eprintln!("demo broker: bad port {port:?}");
            return ExitCode::from(2);
        };
        let open = Arc::new(AtomicBool::new(false));
        let open2 = open.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line {
                    Ok(l) if l.trim() == "open" => open2.store(true, Ordering::SeqCst),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            // The demo is gone: so is its broker.
            std::process::exit(0);
        });
        let mut connections = ConnectionSettings {
            connection_timeout_ms: 5000,
            // The hub accepts envelopes a little over 1 MiB.
            max_payload_size: 2 << 20,
            max_inflight_count: 100,
            auth: None,
            external_auth: None,
            dynamic_filters: true,
        };
        // A gate, not a lock: loopback only, and passwords are not checked.
        // It holds the hub back until the cloud has subscribed.
        connections.set_auth_handler(move |client_id: String, _user, _pass| {
            let open = open.clone();
            async move { open.load(Ordering::SeqCst) || client_id == super::CLOUD_CLIENT_ID }
        });
        let server = ServerSettings {
            name: "demo".to_owned(),
            listen: ([127, 0, 0, 1], port).into(),
            tls: None,
            next_connection_delay_ms: 1,
            connections,
        };
        let config = Config {
            id: 0,
            router: RouterConfig {
                max_connections: 16,
                max_outgoing_packet_count: 200,
                max_segment_size: 8 << 20,
                max_segment_count: 10,
                ..RouterConfig::default()
            },
            v4: Some(HashMap::from([("1".to_owned(), server)])),
            ..Config::default()
        };
        match Broker::new(config).start() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("demo broker: {e}");
                ExitCode::FAILURE
            }
        }
    }
}
