//! OSDP door latency: the reader's '#' (the PyPI `libosdp` PeripheralDevice,
//! testkit/osdp/peer.py) → the osdp_OUT it receives, against the real
//! `lockhub run`, idle, over a Secure Channel, at 9600 and 115200 baud.
//!
//! A pty has no baud rate, so the bus between hub and reader is a relay
//! that holds each chunk for its time on the wire at the configured speed
//! (10 bits a byte, 8N1). Both timestamps come from the reader's process
//! (its monotonic clock): when the key presses were handed to it and when
//! the output command reached it. The peer polls its side every 20 ms
//! (libosdp's Python loop), which is part of every figure.
//!
//! The limit is the wire time of what must cross after '#': the reply that
//! carries the key presses (30 bytes with MAC and encrypted data) and the
//! osdp_OUT (31 bytes with the mark): 61 bytes.

use super::broker::{BrokerSettings, Mosquitto};
use super::daemon::Daemon;
use super::osdp_peer::{Peer, key_hex};
use super::pty::Pty;
use super::report::Figure;
use super::stats::{Summary, micros};
use super::{Sizes, fixture, mqtt};
use lockhub::store::{Priority, Store};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const IDS: &[&str] = &[
    "osdp.door.9600.median",
    "osdp.door.9600.p99",
    "osdp.door.9600.wire",
    "osdp.door.115200.median",
    "osdp.door.115200.p99",
    "osdp.door.115200.wire",
];

const S: &str = "osdp";
const KEY: [u8; 16] = [0x3C; 16];
const DOOR: &str = "o1";
/// The bytes that must cross the bus after '#' (module docs).
const WIRE_BYTES: f64 = 61.0;

fn wire_ms(baud: u32) -> f64 {
    WIRE_BYTES * 10.0 / f64::from(baud) * 1_000.0
}

/// Copies `from` to `to`, holding each chunk for its time on the wire.
async fn pump(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin, baud: u32) {
    let mut buf = [0u8; 256];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs_f64(n as f64 * 10.0 / f64::from(baud))).await;
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}

/// The hub's end of a bus at `baud` joined to the peer's pty.
/// The relay's tasks and the hub pty's slave, kept for the run.
struct Wire {
    relays: [tokio::task::JoinHandle<()>; 2],
    _slave: std::os::fd::OwnedFd,
}

impl Drop for Wire {
    fn drop(&mut self) {
        for r in &self.relays {
            r.abort();
        }
    }
}

fn wire(peer: &Peer, baud: u32) -> (std::path::PathBuf, Wire) {
    use tokio_serial::SerialPortBuilderExt;
    let pty = Pty::open();
    let (master, slave, path) = pty.into_parts();
    let stream = tokio_serial::new(peer.port.to_string_lossy(), baud)
        .open_native_async()
        .expect("open the peer's pty");
    let (hr, hw) = tokio::io::split(master);
    let (pr, pw) = tokio::io::split(stream);
    let a = tokio::spawn(pump(hr, pw, baud));
    let b = tokio::spawn(pump(pr, hw, baud));
    (
        path,
        Wire {
            relays: [a, b],
            _slave: slave,
        },
    )
}

fn add_reader(dir: &Path, bus: &Path, baud: u32) {
    use std::io::Write;
    let mut hub = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("hub.toml"))
        .unwrap();
    write!(
        hub,
        "\n[[osdp]]\nname = \"bus-a\"\nport = \"{}\"\nbaud = {baud}\n\n\
         [[reader]]\nname = \"r-1\"\nbus = \"bus-a\"\naddress = 1\n\n\
         [[door]]\nname = \"{DOOR}\"\nreader = \"r-1\"\noutput = 0\nunlock_ms = 3000\n",
        bus.display()
    )
    .unwrap();
    let mut sec = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("secrets.toml"))
        .unwrap();
    write!(
        sec,
        "\n[[reader_key]]\nreader = \"r-1\"\nscbk = \"{}\"\n",
        lockhub_proto::crypto::b64u_encode(&KEY)
    )
    .unwrap();
    // One key for the reader's door, PIN 20000000 (fixture::pin_for("p", 0)).
    // (On a thread of its own: this runs inside the harness's runtime.)
    let db = dir.join("data/lockhub.db");
    std::thread::spawn(move || {
        let store = Store::open(&db, &fixture::default_policy()).unwrap();
        store
            .write_blocking(Priority::Bulk, |c| {
                fixture::bulk_load_keys(c, "p", 1)?;
                // key_doors rows are replaced, not edited.
                c.execute(
                    "INSERT INTO key_doors (key_id, door, pin_tag, live)
                     SELECT key_id, ?1, pin_tag, 1 FROM key_doors WHERE key_id = 'p0'",
                    [DOOR],
                )?;
                Ok(())
            })
            .expect("the reader door's key");
        store.close();
    })
    .join()
    .expect("prefill thread");
}

async fn one_baud(sizes: &Sizes, baud: u32) -> Summary {
    let broker = Mosquitto::start_with(BrokerSettings::default_window(1000));
    let mut peer = Peer::start(&["--key", &key_hex(&KEY), "--address", "1"]);
    let (bus, _keep) = wire(&peer, baud);
    let mut daemon = Daemon::start_with(
        &broker.url(),
        Path::new("/nonexistent/board"),
        fixture::NO_LOCKOUT_POLICY,
        0,
        |dir| add_reader(dir, &bus, baud),
    )
    .await;
    mqtt::wait_online(broker.port, Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("the daemon never came online: {}", daemon.log()));
    peer.wait_sc();
    // The session's introduction (PDID, PDCAP, LSTAT, ISTAT) after the channel.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut keys = fixture::pin_for("p", 0).into_bytes();
    keys.push(0x0D);
    let mut lat = Vec::new();
    for k in 0..sizes.osdp_entries {
        peer.forget();
        peer.keys(&keys);
        let sent = peer.wait("the keys taken", Duration::from_secs(5), |v| {
            v["ok"] == true
        });
        let out = peer.wait("osdp_OUT", Duration::from_secs(5), |v| v["cmd"] == "output");
        let dt = out["t"].as_f64().unwrap() - sent["t"].as_f64().unwrap();
        assert!(dt >= 0.0, "entry {k}: the output came before the keys");
        lat.push(Duration::from_secs_f64(dt));
        // Let the LED and buzzer go out before the next entry.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    daemon.stop();
    Summary::from_durations(&lat)
}

pub async fn run(sizes: &Sizes) -> Vec<Figure> {
    let mut figures = Vec::new();
    for baud in [9600u32, 115_200] {
        let s = one_baud(sizes, baud).await;
        let what = |stat: &str| {
            format!(
                "'#' on the reader → osdp_OUT at the reader, Secure Channel, {baud} baud, idle, {} entries: {stat}",
                s.len()
            )
        };
        let wire = wire_ms(baud);
        figures.push(Figure::new(
            &format!("osdp.door.{baud}.median"),
            S,
            &what("median"),
            micros(s.median()),
        ));
        figures.push(Figure::new(
            &format!("osdp.door.{baud}.p99"),
            S,
            &what("p99"),
            micros(s.p99()),
        ));
        figures.push(Figure::new(
            &format!("osdp.door.{baud}.wire"),
            S,
            &format!(
                "the limit: 61 bytes on the wire at {baud} baud (the key reply and the osdp_OUT)"
            ),
            micros(wire * 1_000.0),
        ));
    }
    figures
}
