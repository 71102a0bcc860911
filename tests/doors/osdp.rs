//! OSDP readers against a reader no one here wrote: the PyPI `libosdp`
//! PeripheralDevice (testkit/osdp/peer.py) on a pseudo-terminal, the real
//! `lockhub run` binary, a real Mosquitto and SQLite file.

use lockhub_proto::crypto::b64u_encode;
use rusqlite::Connection;
use std::path::Path;
use std::time::Duration;
use testkit::broker::{BrokerOptions, Mosquitto};
use testkit::daemon::{Daemon, DaemonOptions};
use testkit::osdp_peer::{Peer, key_hex};

pub(crate) const KEY_1: [u8; 16] = [
    0x10, 0x21, 0x32, 0x43, 0x54, 0x65, 0x76, 0x87, 0x98, 0xA9, 0xBA, 0xCB, 0xDC, 0xED, 0xFE, 0x0F,
];
const KEY_2: [u8; 16] = [0x5A; 16];

pub(crate) fn bus(name: &str, port: &Path, baud: u32) -> String {
    format!(
        "[[osdp]]\nname = \"{name}\"\nport = \"{}\"\nbaud = {baud}\n\n",
        port.display()
    )
}

pub(crate) fn reader(name: &str, bus: &str, address: u8, extra: &str) -> String {
    format!("[[reader]]\nname = \"{name}\"\nbus = \"{bus}\"\naddress = {address}\n{extra}\n\n")
}

pub(crate) fn reader_door(name: &str, reader: &str, output: u8, extra: &str) -> String {
    format!(
        "[[door]]\nname = \"{name}\"\nreader = \"{reader}\"\noutput = {output}\nunlock_ms = 5000\n{extra}\n\n"
    )
}

pub(crate) fn reader_key(reader: &str, key: &[u8; 16]) -> String {
    format!(
        "[[reader_key]]\nreader = \"{reader}\"\nscbk = \"{}\"\n\n",
        b64u_encode(key)
    )
}

pub(crate) fn alert_open(db: &Connection, condition: &str, subject: &str) -> bool {
    db.query_row(
        "SELECT count(*) FROM alerts WHERE condition = ?1 AND subject = ?2 AND state = 'raised'",
        [condition, subject],
        |r| r.get::<_, i64>(0),
    )
    .unwrap_or(0)
        > 0
}

/// Online over a Secure Channel and not quarantined: a reader the hub trusts.
pub(crate) fn trusted(db: &Connection, reader: &str) -> bool {
    link(db, reader) == Some((true, true, false))
}

/// The serial number the hub recorded from the reader's osdp_PDID.
fn reader_serial(db: &Connection, reader: &str) -> Option<i64> {
    db.query_row(
        "SELECT serial FROM osdp_readers WHERE reader = ?1",
        [reader],
        |r| r.get(0),
    )
    .ok()
}

pub(crate) fn link(db: &Connection, reader: &str) -> Option<(bool, bool, bool)> {
    db.query_row(
        "SELECT online, secure, quarantined FROM osdp_links WHERE reader = ?1",
        [reader],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
    )
    .ok()
}

fn one_reader_hub(broker: &Mosquitto, peer: &Peer, key: Option<&[u8; 16]>, extra: &str) -> Daemon {
    Daemon::start(
        &broker.url(),
        DaemonOptions {
            hub_extra: format!(
                "{}{}{}",
                bus("bus-a", &peer.port, 9600),
                reader("r-201", "bus-a", 1, extra),
                reader_door("201", "r-201", 0, ""),
            ),
            secrets_extra: key.map(|k| reader_key("r-201", k)).unwrap_or_default(),
            ..DaemonOptions::default()
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_with_the_right_key_gets_a_secure_channel_and_its_identity_is_recorded() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&[
        "--key",
        &key_hex(&KEY_1),
        "--address",
        "1",
        "--serial",
        "0x11223344",
    ]);
    let mut hub = one_reader_hub(&broker, &peer, Some(&KEY_1), "");
    peer.wait_sc();
    hub.wait_db("the reader online over a secure channel", |db| {
        trusted(db, "r-201")
    })
    .await;
    let serial = reader_serial(&hub.db(), "r-201").expect("the reader's serial recorded");
    assert_eq!(serial, 0x11223344);
    let db = hub.db();
    assert!(!alert_open(&db, "reader_link_fault", "r-201"));
    assert!(!alert_open(&db, "link_insecure", "r-201"));

    // `lockhub status` shows it: bus, address, online, secure, identity.
    let out = lockhub(&["status", "--json"], &hub.dir.path().join("hub.toml"));
    assert!(out.status.success());
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &status["readers"][0];
    assert_eq!(r["reader"], "r-201", "{status}");
    assert_eq!(r["bus"], "bus-a");
    assert_eq!(r["address"], 1);
    assert_eq!(r["online"], true);
    assert_eq!(r["secure"], true);
    assert_eq!(r["quarantined"], false);
    assert_eq!(r["serial"], "11223344");
    assert_eq!(r["vendor"], "0a0b0c");
    let out = lockhub(&["status"], &hub.dir.path().join("hub.toml"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("r-201 on bus-a address 1: online, secure channel up, vendor 0a0b0c model 7 serial 11223344"),
        "{text}"
    );
}

/// Waits `secs` in real time (for "nothing happens" checks that the
/// contract bounds, e.g. board_offline after 8 s of silence).
async fn idle(secs: u64) {
    tokio::time::sleep(Duration::from_secs(secs)).await;
}

pub(crate) fn lockhub(args: &[&str], config: &Path) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_lockhub"))
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("run lockhub")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_with_another_key_is_never_trusted_and_raises_reader_link_fault() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_2), "--address", "1"]);
    let mut hub = one_reader_hub(&broker, &peer, Some(&KEY_1), "");
    hub.wait_db("reader_link_fault for r-201", |db| {
        alert_open(db, "reader_link_fault", "r-201")
    })
    .await;
    peer.keys(&[0x31, 0x32, 0x33, 0x34, 0x0D]);
    // Past the 8 s of silence that would make it offline: it answers, so
    // it is a link fault, not board_offline.
    idle(9).await;
    let db = hub.db();
    assert!(!alert_open(&db, "board_offline", "r-201"));
    let (online, secure, _) = link(&db, "r-201").expect("a link row");
    assert!(online && !secure);
    let faults: i64 = db
        .query_row(
            "SELECT count FROM alerts WHERE condition = 'reader_link_fault' AND subject = 'r-201'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        faults >= 2,
        "the hub keeps trying with its own key ({faults})"
    );
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE door = '201'"),
        0
    );
    peer.drain();
    assert!(
        !peer.seen.iter().any(|v| v["sc"] == true),
        "{:?}",
        peer.seen
    );
    assert!(peer.commands("output").is_empty());
    assert!(peer.commands("led").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_never_uses_the_install_key_with_a_reader_fresh_from_the_factory() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", "none", "--address", "1"]);
    let mut hub = one_reader_hub(&broker, &peer, Some(&KEY_1), "");
    hub.wait_db("reader_link_fault for r-201", |db| {
        alert_open(db, "reader_link_fault", "r-201")
    })
    .await;
    idle(2).await;
    peer.drain();
    assert!(
        !peer.seen.iter().any(|v| v["sc"] == true),
        "{:?}",
        peer.seen
    );
    assert!(peer.commands("keyset").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_reader_is_refused_for_a_keyed_reader_and_accepted_only_with_insecure_plaintext()
 {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    // Keyed in the config, but the reader offers no Secure Channel.
    let plain = Peer::start(&["--no-sc", "--address", "1"]);
    let mut hub = one_reader_hub(&broker, &plain, Some(&KEY_1), "");
    hub.wait_db("reader_link_fault for the keyed reader", |db| {
        alert_open(db, "reader_link_fault", "r-201")
    })
    .await;
    idle(1).await;
    assert_eq!(link(&hub.db(), "r-201").map(|l| l.1), Some(false));
    // It is never used in plain text. But the door's strike is on its
    // output, and it takes the plaintext no-op osdp_OUT the hub sends
    // before each handshake: that, not plain text by config, is the
    // `link_insecure` status reports.
    hub.wait_db("link_insecure from the probe", |db| {
        alert_open(db, "link_insecure", "r-201")
    })
    .await;
    let out = lockhub(&["status"], &hub.dir.path().join("hub.toml"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("link_insecure r-201") && text.contains("takes osdp_OUT in plain text"),
        "{text}"
    );
    drop(hub);
    drop(plain);

    // The same reader, declared insecure_plaintext and without a key.
    let plain = Peer::start(&["--no-sc", "--address", "1"]);
    let mut hub = one_reader_hub(&broker, &plain, None, "insecure_plaintext = true");
    hub.wait_db("link_insecure for the plaintext reader", |db| {
        alert_open(db, "link_insecure", "r-201") && link(db, "r-201") == Some((true, false, false))
    })
    .await;
    assert!(!alert_open(&hub.db(), "reader_link_fault", "r-201"));
}

/// Stops `hub` and starts it again on the same folder with reader r-201
/// on `peer`'s port, keyed with `key` now (as after `lockhub osdp
/// install` and a config change), and without `insecure_plaintext`.
fn restart_keyed(hub: &mut Daemon, old: &Peer, peer: &Peer, key: &[u8; 16]) {
    assert!(hub.sigterm(), "a clean stop");
    let config = hub.config_path();
    let toml = std::fs::read_to_string(&config).unwrap();
    let toml = toml
        .replace(
            &old.port.display().to_string(),
            &peer.port.display().to_string(),
        )
        .replace("insecure_plaintext = true", "");
    std::fs::write(&config, toml).unwrap();
    let secrets = hub.dir.path().join("secrets.toml");
    let mut text = std::fs::read_to_string(&secrets).unwrap();
    if !text.contains("[[reader_key]]") {
        text.push_str(&reader_key("r-201", key));
    }
    std::fs::write(&secrets, text).unwrap();
    hub.spawn();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn link_insecure_ends_once_the_reader_is_keyed_and_its_secure_channel_is_up() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let plain = Peer::start(&["--no-sc", "--address", "1"]);
    let mut hub = one_reader_hub(&broker, &plain, None, "insecure_plaintext = true");
    hub.wait_db("link_insecure for the plaintext reader", |db| {
        alert_open(db, "link_insecure", "r-201")
    })
    .await;
    let mut keyed = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    restart_keyed(&mut hub, &plain, &keyed, &KEY_1);
    keyed.wait_sc();
    hub.wait_db("link_insecure cleared, the reader trusted", |db| {
        !alert_open(db, "link_insecure", "r-201") && trusted(db, "r-201")
    })
    .await;
    assert_eq!(
        hub.count(
            "SELECT count(*) FROM outbox WHERE topic = 'alerts'
              AND CAST(body AS TEXT) LIKE '%\"link_insecure\"%\"cleared\"%'"
        ),
        1,
        "the cloud hears it end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_link_fault_from_an_earlier_run_ends_after_a_minute_of_secure_channel() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let wrong = Peer::start(&["--key", &key_hex(&KEY_2), "--address", "1"]);
    let mut hub = one_reader_hub(&broker, &wrong, Some(&KEY_1), "");
    hub.wait_db("reader_link_fault for r-201", |db| {
        alert_open(db, "reader_link_fault", "r-201")
    })
    .await;
    // The installer puts the hub's key into the reader and starts the hub again.
    let mut right = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    restart_keyed(&mut hub, &wrong, &right, &KEY_1);
    right.wait_sc();
    hub.wait_db("the reader trusted", |db| trusted(db, "r-201"))
        .await;
    assert!(
        alert_open(&hub.db(), "reader_link_fault", "r-201"),
        "not before the channel has held"
    );
    // mqtt.md: it ends once a Secure Channel has held for a minute.
    idle(62).await;
    assert!(
        !alert_open(&hub.db(), "reader_link_fault", "r-201"),
        "{}",
        hub.log_tail(20)
    );
}

#[test]
fn check_config_refuses_a_keyless_reader_and_the_other_osdp_mistakes_with_line_and_column() {
    let broker_url = "mqtt://127.0.0.1:1";
    let hub = Daemon::prepare(
        broker_url,
        DaemonOptions {
            hub_extra: format!(
                "{}{}{}{}{}{}{}",
                bus("bus-a", Path::new("/dev/null"), 9601),
                reader("r-1", "bus-a", 1, ""),
                reader("r-2", "bus-b", 127, ""),
                reader("r-3", "bus-a", 1, "insecure_plaintext = true"),
                "[[door]]\nname = \"301\"\nreader = \"r-1\"\nserial = \"board-a\"\nindex = 3\noutput = 0\nunlock_ms = 5000\n\n",
                // A reader's keypad cannot say which of two doors it is for.
                reader_door("302", "r-3", 0, ""),
                reader_door("303", "r-3", 1, ""),
            ),
            secrets_extra: reader_key("r-3", &KEY_2),
            ..DaemonOptions::default()
        },
    );
    let check = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lockhub"))
            .arg("check-config")
            .arg(hub.dir.path().join("hub.toml"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let mut err = check();
    // A key of the wrong length (the secrets file then fails as a whole).
    let secrets = hub.dir.path().join("secrets.toml");
    let text = std::fs::read_to_string(&secrets).unwrap();
    std::fs::write(&secrets, text.replace(&b64u_encode(&KEY_2), "AAAA")).unwrap();
    err.push_str(&check());
    for want in [
        "`baud` must be one of 9600",
        "reader bus `bus-b` is not configured",
        "`address` must be in 0..=126, found 127",
        "reader `r-3` has address 1 on bus `bus-a`, already used by reader `r-1`",
        "reader `r-1` has no [[reader_key]]",
        "`scbk` must be 16 bytes",
        // The strike is a reader output or a board relay, not both.
        "door `301` has its strike and contact on its board (`serial`, `index`): `output` is a reader's",
        "door `303` is on reader `r-3`, which already serves door `302`",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    // Every line carries FILE:LINE:COL.
    for line in err.lines() {
        let mut parts = line.splitn(4, ':');
        let (_file, l, c) = (parts.next(), parts.next(), parts.next());
        assert!(
            l.is_some_and(|l| l.parse::<usize>().is_ok())
                && c.is_some_and(|c| c.parse::<usize>().is_ok()),
            "no line and column: {line}"
        );
    }
    assert!(!err.contains("AAAA"), "a secret was echoed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn osdp_install_moves_a_factory_reader_to_its_own_key_and_run_then_works() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", "none", "--address", "3", "--serial", "0x0BADCAFE"]);
    let mut hub = Daemon::prepare(
        &broker.url(),
        DaemonOptions {
            hub_extra: format!(
                "{}{}",
                bus("bus-a", &peer.port, 9600),
                reader("r-201", "bus-a", 3, ""),
            ),
            secrets_extra: reader_key("r-201", &KEY_1),
            ..DaemonOptions::default()
        },
    );
    let config = hub.dir.path().join("hub.toml");
    let out = lockhub(&["osdp", "install", "--reader", "r-201"], &config);
    assert!(
        out.status.success(),
        "install failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("installed and proven"), "{said}");
    assert!(!said.contains(&key_hex(&KEY_1)));
    assert_eq!(peer.commands("keyset").len(), 1);
    // Run again: the reader already has its key.
    let out = lockhub(&["osdp", "install", "--reader", "r-201"], &config);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("already had its key"));

    hub.spawn();
    hub.wait_db("the installed reader over a secure channel", |db| {
        trusted(db, "r-201")
    })
    .await;
    let serial = reader_serial(&hub.db(), "r-201").expect("the reader's serial recorded");
    assert_eq!(serial, 0x0BADCAFE);
    assert!(!alert_open(&hub.db(), "reader_link_fault", "r-201"));
    // An unknown reader is a config problem.
    hub.sigterm();
    let out = lockhub(&["osdp", "install", "--reader", "nope"], &config);
    assert_eq!(out.status.code(), Some(2));
}

use testkit::board::pty;

/// Joins peers onto one pty, as an RS-485 pair joins readers: what the hub
/// writes reaches every peer, what any peer writes reaches the hub.
pub(crate) fn relay(peers: &[&Peer]) -> std::path::PathBuf {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let hub_side = pty::Pty::open();
    let (master, slave, path) = hub_side.into_parts();
    let (mut from_hub, to_hub) = tokio::io::split(master);
    let to_hub = std::sync::Arc::new(tokio::sync::Mutex::new(to_hub));
    let mut writers = Vec::new();
    for p in peers {
        use tokio_serial::SerialPortBuilderExt;
        let stream = tokio_serial::new(p.port.to_string_lossy(), 9600)
            .open_native_async()
            .expect("open the peer's pty");
        let (mut r, w) = tokio::io::split(stream);
        writers.push(w);
        let to_hub = to_hub.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 256];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 || to_hub.lock().await.write_all(&buf[..n]).await.is_err() {
                    break;
                }
            }
        });
    }
    tokio::spawn(async move {
        let _slave = slave;
        let mut buf = [0u8; 256];
        while let Ok(n) = from_hub.read(&mut buf).await {
            if n == 0 {
                break;
            }
            for w in &mut writers {
                let _ = w.write_all(&buf[..n]).await;
            }
        }
    });
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_readers_share_a_bus_and_one_stopping_does_not_stop_the_other() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut a = Peer::start(&[
        "--key",
        &key_hex(&KEY_1),
        "--address",
        "1",
        "--serial",
        "0xA1",
    ]);
    let mut b = Peer::start(&[
        "--key",
        &key_hex(&KEY_2),
        "--address",
        "2",
        "--serial",
        "0xB2",
    ]);
    let bus_path = relay(&[&a, &b]);
    let mut hub = Daemon::start(
        &broker.url(),
        DaemonOptions {
            hub_extra: format!(
                "{}{}{}{}{}",
                bus("bus-a", &bus_path, 9600),
                reader("r-201", "bus-a", 1, ""),
                reader("r-202", "bus-a", 2, ""),
                reader_door("201", "r-201", 0, ""),
                reader_door("202", "r-202", 0, ""),
            ),
            secrets_extra: format!(
                "{}{}",
                reader_key("r-201", &KEY_1),
                reader_key("r-202", &KEY_2)
            ),
            ..DaemonOptions::default()
        },
    );
    a.wait_sc();
    b.wait_sc();
    hub.wait_db("both readers secure", |db| {
        trusted(db, "r-201") && trusted(db, "r-202")
    })
    .await;

    // Cut r-202's wire.
    b.send(serde_json::json!({"pause": true}));
    hub.wait_db("board_offline for r-202", |db| {
        alert_open(db, "board_offline", "r-202")
    })
    .await;
    let db = hub.db();
    assert!(!alert_open(&db, "board_offline", "r-201"));
    assert_eq!(link(&db, "r-201"), Some((true, true, false)));
    assert_eq!(link(&db, "r-202").map(|l| l.0), Some(false));
    // r-201 keeps opening while r-202 is away.
    issue(&broker, &mut hub, "201", PIN).await;
    a.forget();
    a.keys(&typed(PIN));
    let out = a.wait("osdp_OUT at r-201", Duration::from_secs(3), |v| {
        v["cmd"] == "output"
    });
    assert_eq!(out["output_no"], 0);
    hub.wait_db("door.unlocked at 201", |db| {
        audit_rows(db, "201") == ["door.granted:k-1", "door.unlocked:k-1"]
    })
    .await;
    assert!(b.commands("output").is_empty());
    a.send(serde_json::json!({"status": "local", "mask": 1, "n": 2}));
    hub.wait_db("r-201's tamper, reported while r-202 is away", |db| {
        alert_open(db, "tamper", "r-201")
    })
    .await;
    assert!(a.seen.iter().all(|v| v["sc"] != false), "{:?}", a.seen);
    // Its tamper input back to normal ends the alert (mqtt.md 'Alerts').
    a.send(serde_json::json!({"status": "local", "mask": 0, "n": 2}));
    hub.wait_db("r-201's tamper cleared", |db| {
        !alert_open(db, "tamper", "r-201")
    })
    .await;
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE kind = 'board.tamper' AND door = 'r-201'"),
        1
    );

    // Back: cleared, after a fresh handshake (the hub ended the session
    // when the reader went offline; the reader's own view of its channel
    // may not have timed out, so the hub's log is the witness).
    let ups = |hub: &Daemon| {
        hub.log()
            .lines()
            .filter(|l| l.contains("secure channel up") && l.contains("r-202"))
            .count()
    };
    let before = ups(&hub);
    b.send(serde_json::json!({"pause": false}));
    hub.wait_db("board_offline for r-202 cleared", |db| {
        !alert_open(db, "board_offline", "r-202") && trusted(db, "r-202")
    })
    .await;
    assert!(
        ups(&hub) > before,
        "r-202 came back without a new handshake"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_truncated_packets_on_the_bus_are_counted_and_change_nothing() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let mut hub = one_reader_hub(&broker, &peer, Some(&KEY_1), "");
    hub.wait_db("the reader secure", |db| trusted(db, "r-201"))
        .await;
    // Noise, a truncated reply, a reply with a bad CRC, a huge length, and
    // a well-framed plaintext KEYPAD reply that no MAC vouches for.
    for raw in [
        "00112233445566778899",
        "538108",
        "53810a00054012",
        "5381ffff0540",
        "538108000553ffff",
    ] {
        peer.send(serde_json::json!({ "raw": raw }));
    }
    hub.wait_db("bad packets counted", |db| {
        db.query_row(
            "SELECT bad_packets + garbage_bytes FROM osdp_buses WHERE bus = 'bus-a'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap_or(0)
            > 0
    })
    .await;
    idle(1).await;
    hub.assert_running();
    let db = hub.db();
    assert_eq!(link(&db, "r-201"), Some((true, true, false)));
    assert!(!alert_open(&db, "board_offline", "r-201"));
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE door = '201'"),
        0
    );
}

/// A reader holding KEY_1 at address 1 with this PDID serial.
fn keyed_peer(serial: &str) -> Peer {
    Peer::start(&[
        "--key",
        &key_hex(&KEY_1),
        "--address",
        "1",
        "--serial",
        serial,
    ])
}

/// A hub whose bus `bus-a` is a link that can be pointed at another peer,
/// with reader r-201 (0x1111) trusted and recorded.
async fn hub_with_a_recorded_reader(
    broker: &Mosquitto,
) -> (Daemon, Peer, tempfile::TempDir, std::path::PathBuf) {
    let first = keyed_peer("0x1111");
    let dir = tempfile::tempdir().unwrap();
    let link_path = dir.path().join("bus-a");
    pty::point(&link_path, &first.port);
    let mut hub = Daemon::start(
        &broker.url(),
        DaemonOptions {
            hub_extra: format!(
                "{}{}",
                bus("bus-a", &link_path, 9600),
                reader("r-201", "bus-a", 1, "")
            ),
            secrets_extra: reader_key("r-201", &KEY_1),
            ..DaemonOptions::default()
        },
    );
    hub.wait_db("the first reader recorded", |db| {
        trusted(db, "r-201") && reader_serial(db, "r-201") == Some(0x1111)
    })
    .await;
    (hub, first, dir, link_path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_reader_is_quarantined_until_it_is_installed_again() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let (mut hub, first, _dir, link_path) = hub_with_a_recorded_reader(&broker).await;

    // Someone swaps the reader for another one that holds the same key.
    let second = keyed_peer("0x2222");
    pty::point(&link_path, &second.port);
    drop(first);
    hub.wait_db("reader_replaced and quarantine", |db| {
        alert_open(db, "reader_replaced", "r-201") && link(db, "r-201") == Some((true, true, true))
    })
    .await;

    // The recorded reader put back is still quarantined until install, in
    // this run and the next: the alert and the quarantine never disagree.
    let back = keyed_peer("0x1111");
    pty::point(&link_path, &back.port);
    drop(second);
    let seen = |db: &Connection| -> Option<i64> {
        db.query_row(
            "SELECT seen_serial FROM osdp_links WHERE reader = 'r-201'",
            [],
            |r| r.get(0),
        )
        .ok()
        .flatten()
    };
    hub.wait_db("the recorded reader back, still quarantined", |db| {
        seen(db) == Some(0x1111) && link(db, "r-201") == Some((true, true, true))
    })
    .await;
    assert!(alert_open(&hub.db(), "reader_replaced", "r-201"));
    hub.sigterm();
    let before = hub.log().len();
    hub.spawn();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let ready = loop {
        let log = hub.log();
        if let Some(line) = log[before.min(log.len())..]
            .lines()
            .find(|l| l.contains("reader ready"))
        {
            break line.to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no session after the restart"
        );
        idle(1).await;
    };
    assert!(ready.contains("quarantined=true"), "{ready}");
    hub.sigterm();

    let config = hub.dir.path().join("hub.toml");
    let out = lockhub(&["osdp", "install", "--reader", "r-201"], &config);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!alert_open(&hub.db(), "reader_replaced", "r-201"));
    hub.spawn();
    hub.wait_db("the new reader trusted", |db| trusted(db, "r-201"))
        .await;
    assert!(!alert_open(&hub.db(), "reader_replaced", "r-201"));
}

/// A run that cannot read a reader's recorded identity at start must not
/// take the reader it finds for the reference: that is how a swap would go
/// unseen for ever. The reader stays quarantined until the read succeeds
/// (asked again at its next session), and then it is compared as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_whose_recorded_identity_cannot_be_read_is_quarantined_not_adopted() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let (mut hub, first, _dir, link_path) = hub_with_a_recorded_reader(&broker).await;
    hub.sigterm();

    // The identities cannot be read at start, and the reader was swapped.
    let db_path = hub.db_path();
    let rename = |from: &str, to: &str| {
        rusqlite::Connection::open(&db_path)
            .unwrap()
            .execute_batch(&format!("ALTER TABLE {from} RENAME TO {to}"))
            .unwrap();
    };
    rename("osdp_readers", "osdp_readers_away");
    let second = keyed_peer("0x2222");
    pty::point(&link_path, &second.port);
    drop(first);
    hub.spawn();
    hub.wait_db("the unread reader quarantined", |db| {
        link(db, "r-201") == Some((true, true, true))
    })
    .await;
    assert!(
        hub.log()
            .contains("cannot read the reader's recorded identity")
    );

    // The table is back; the reader's next session reads it, and the swap
    // is seen. The reference was never overwritten.
    rename("osdp_readers_away", "osdp_readers");
    let third = keyed_peer("0x2222");
    pty::point(&link_path, &third.port);
    drop(second);
    hub.wait_db("reader_replaced", |db| {
        alert_open(db, "reader_replaced", "r-201") && link(db, "r-201") == Some((true, true, true))
    })
    .await;
    assert_eq!(reader_serial(&hub.db(), "r-201"), Some(0x1111));
    hub.sigterm();
}

// ---------------------------------------------------------------------------
// Doors on readers (phase 2): PIN entry, osdp_OUT, feedback, contact, cards.
// ---------------------------------------------------------------------------

use lockhub_proto::sign::GrantSpec;
use testkit::cloud::{CloudClient, cloud, pin_key};

pub(crate) const PIN: &str = "482913";

/// Issues an active key for `door` with `pin` and waits until it is applied.
pub(crate) async fn issue(broker: &Mosquitto, hub: &mut Daemon, door: &str, pin: &str) {
    let grant = GrantSpec::active("k-1", "c-1", door, pin, ("k1", &pin_key()));
    issue_grant(broker, hub, &grant).await;
}

/// Issues `grant` (key `k-1`) from the cloud and waits until it is applied.
async fn issue_grant(broker: &Mosquitto, hub: &mut Daemon, grant: &GrantSpec) {
    let mut c = cloud();
    let mut client = CloudClient::plain(broker.port).await;
    client.wait_online().await;
    let ev = c.key_issued(grant, &[]);
    client.publish(std::slice::from_ref(&ev)).await;
    hub.wait_db("the key applied", |db| {
        db.query_row("SELECT count(*) FROM keys WHERE key_id = 'k-1'", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap_or(0)
            == 1
    })
    .await;
}

/// Key presses as the peer sends them: ASCII digits, then 0x0D.
pub(crate) fn typed(pin: &str) -> Vec<u8> {
    let mut k = pin.as_bytes().to_vec();
    k.push(0x0D);
    k
}

pub(crate) fn audit_rows(db: &Connection, door: &str) -> Vec<String> {
    let mut stmt = db
        .prepare("SELECT kind, coalesce(reason, ''), coalesce(key_id, '') FROM audit WHERE door = ?1 ORDER BY seqno")
        .unwrap();
    stmt.query_map([door], |r| {
        let (k, reason, key): (String, String, String) = (r.get(0)?, r.get(1)?, r.get(2)?);
        Ok(match (reason.is_empty(), key.is_empty()) {
            (false, _) => format!("{k}/{reason}"),
            (true, false) => format!("{k}:{key}"),
            _ => k,
        })
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

async fn secure_hub(broker: &Mosquitto, peer: &mut Peer, door_extra: &str, policy: &str) -> Daemon {
    let mut hub = Daemon::start(
        &broker.url(),
        DaemonOptions {
            hub_extra: format!(
                "{}{}{}",
                bus("bus-a", &peer.port, 9600),
                reader("r-201", "bus-a", 1, ""),
                reader_door("201", "r-201", 1, door_extra),
            ),
            secrets_extra: reader_key("r-201", &KEY_1),
            policy: policy.to_owned(),
            ..DaemonOptions::default()
        },
    );
    hub.wait_db("the reader secure", |db| trusted(db, "r-201"))
        .await;
    hub
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_pin_and_hash_open_the_door_with_its_output_and_timer() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let mut hub = secure_hub(&broker, &mut peer, "", "").await;
    issue(&broker, &mut hub, "201", PIN).await;

    peer.forget();
    peer.keys(&typed(PIN));
    let out = peer.wait("osdp_OUT", Duration::from_secs(3), |v| v["cmd"] == "output");
    // The grant is on record before the output reached the reader.
    assert!(audit_rows(&hub.db(), "201").contains(&"door.granted:k-1".to_owned()));
    assert_eq!(out["output_no"], 1);
    assert_eq!(out["control_code"], 5);
    assert_eq!(out["timer_count"], 50);
    let led = peer.wait("the green LED", Duration::from_secs(3), |v| {
        v["cmd"] == "led"
    });
    assert_eq!(led["on_color"], 2, "{led}");
    peer.wait("one beep", Duration::from_secs(3), |v| {
        v["cmd"] == "buzzer" && v["rep_count"] == 1
    });
    hub.wait_db("door.unlocked", |db| {
        audit_rows(db, "201") == ["door.granted:k-1", "door.unlocked:k-1"]
    })
    .await;
    assert_eq!(peer.commands("output").len(), 1);
    let log = hub.log();
    assert!(!log.contains(PIN), "a PIN in the log");
}

/// The store is slow (another process holds the write lock) and the bus is
/// lost while a grant is being committed: the grant can no longer reach
/// the reader, and is on record unconfirmed at once, not when (or if) the
/// bus comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_committed_while_the_bus_is_away_is_recorded_unconfirmed_at_once() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let mut hub = secure_hub(&broker, &mut peer, "", "").await;
    issue(&broker, &mut hub, "201", PIN).await;
    let lock = rusqlite::Connection::open(hub.db_path()).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    peer.keys(&typed(PIN));
    // Well inside the 2 s a commit may take before the door is denied.
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(peer);
    tokio::time::sleep(Duration::from_millis(300)).await;
    lock.execute_batch("COMMIT").unwrap();
    hub.wait_db("the grant, then unconfirmed", |db| {
        audit_rows(db, "201") == ["door.granted:k-1", "door.unlock_unconfirmed:k-1"]
    })
    .await;
}

/// The store stops taking writes (another process holds the write lock)
/// while a reader reports more than the bus's 64 queued records: every
/// audit row is kept and lands once storage takes writes again (only
/// status bookkeeping may be dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_past_the_first_64_waiting_for_storage_are_kept_not_dropped() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let mut hub = secure_hub(&broker, &mut peer, "", "").await;
    let lock = rusqlite::Connection::open(hub.db_path()).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    const CARDS: usize = 80;
    for _ in 0..CARDS {
        peer.send(serde_json::json!({"card": true}));
    }
    hub.wait_log("every card read", Duration::from_secs(30), |log| {
        log.matches("card read: denied").count() >= CARDS
    })
    .await;
    lock.execute_batch("COMMIT").unwrap();
    drop(lock);
    hub.wait_db("every card on record", |db| {
        audit_rows(db, "201").len() == CARDS
    })
    .await;
    assert!(!hub.log().contains("dropped"), "a record was dropped");
}

/// A one-use key sent by the cloud: the reader opens once, then shows red
/// (like any denial) for the used-up key, through the same decision path
/// as a lock board.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_use_key_from_the_cloud_opens_once_then_the_reader_shows_red_for_used_up() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let mut hub = secure_hub(&broker, &mut peer, "", "").await;
    let mut grant = GrantSpec::active("k-1", "c-1", "201", PIN, ("k1", &pin_key()));
    grant.max_uses = Some(1);
    issue_grant(&broker, &mut hub, &grant).await;

    peer.forget();
    peer.keys(&typed(PIN));
    peer.wait("osdp_OUT", Duration::from_secs(3), |v| v["cmd"] == "output");
    hub.wait_db("the grant and its unlock", |db| {
        audit_rows(db, "201") == ["door.granted:k-1", "door.unlocked:k-1"]
    })
    .await;

    idle(1).await;
    peer.forget();
    peer.keys(&typed(PIN));
    let led = peer.wait("the red LED", Duration::from_secs(3), |v| v["cmd"] == "led");
    assert_eq!(led["on_color"], 1, "{led}");
    hub.wait_db("the used_up denial", |db| {
        audit_rows(db, "201")
            == [
                "door.granted:k-1",
                "door.unlocked:k-1",
                "door.denied/used_up",
            ]
    })
    .await;
    let db = hub.db();
    let used_up: i64 = db
        .query_row(
            "SELECT count(*) FROM audit WHERE kind = 'key.used_up' AND key_id = 'k-1'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(used_up, 1);
    let state: String = db
        .query_row("SELECT state FROM keys WHERE key_id = 'k-1'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(state, "used_up");
    assert!(peer.commands("output").is_empty(), "no second opening");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_pin_drives_no_output_shows_red_and_is_audited() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let mut hub = secure_hub(&broker, &mut peer, "", "").await;
    issue(&broker, &mut hub, "201", PIN).await;
    peer.forget();
    peer.keys(&typed("111111"));
    let led = peer.wait("the red LED", Duration::from_secs(3), |v| v["cmd"] == "led");
    assert_eq!(led["on_color"], 1, "{led}");
    peer.wait("two beeps", Duration::from_secs(3), |v| {
        v["cmd"] == "buzzer" && v["rep_count"] == 2
    });
    hub.wait_db("the denial", |db| {
        audit_rows(db, "201") == ["door.denied/unknown_pin"]
    })
    .await;
    // '*' clears, digits past 12 are bad_format; a card is not a PIN.
    peer.keys(b"99*12");
    peer.keys(&typed("1234567890123"));
    peer.send(serde_json::json!({"card": true}));
    hub.wait_db("bad_format and the card", |db| {
        audit_rows(db, "201")
            == [
                "door.denied/unknown_pin",
                "door.denied/bad_format",
                "door.denied/unsupported_credential",
            ]
    })
    .await;
    idle(1).await;
    assert!(peer.commands("output").is_empty());
}

/// A reader configured on a bus but serving no door yet: its PINs are
/// decided like a serial Keypad for a door index no door has (serial.md):
/// denied, shown red, audited `unknown_door` at the reader's place on the
/// bus, and never counted toward a lockout. A card there is on record too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_at_a_reader_that_serves_no_door_is_denied_and_audited_unknown_door() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let mut hub = Daemon::start(
        &broker.url(),
        DaemonOptions {
            hub_extra: format!(
                "{}{}",
                bus("bus-a", &peer.port, 9600),
                reader("r-201", "bus-a", 1, ""),
            ),
            secrets_extra: reader_key("r-201", &KEY_1),
            policy: "lockout_threshold = 2".to_owned(),
            ..DaemonOptions::default()
        },
    );
    hub.wait_db("the reader secure", |db| trusted(db, "r-201"))
        .await;
    peer.forget();
    peer.keys(&typed("111111"));
    let led = peer.wait("the red LED", Duration::from_secs(3), |v| v["cmd"] == "led");
    assert_eq!(led["on_color"], 1, "{led}");
    peer.keys(&typed("222222"));
    peer.keys(&typed("12"));
    peer.send(serde_json::json!({"card": true}));
    hub.wait_db("three denials and the card", |db| {
        audit_rows(db, "bus-a:1")
            == [
                "door.denied/unknown_door",
                "door.denied/unknown_door",
                "door.denied/unknown_door",
                "door.denied/unsupported_credential",
            ]
    })
    .await;
    assert_eq!(hub.count("SELECT count(*) FROM lockouts"), 0);
    assert!(peer.commands("output").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_out_reader_stays_locked_out_across_a_hub_restart() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let mut hub = secure_hub(&broker, &mut peer, "", "lockout_threshold = 3").await;
    issue(&broker, &mut hub, "201", PIN).await;
    for (i, wrong) in ["111111", "222222", "333333"].iter().enumerate() {
        peer.keys(&typed(wrong));
        hub.wait_db("a denial", |db| audit_rows(db, "201").len() == i + 1)
            .await;
    }
    hub.wait_db("keypad_lockout", |db| {
        alert_open(db, "keypad_lockout", "201")
    })
    .await;
    hub.sigterm();
    hub.spawn();
    hub.wait_db("the reader secure again", |db| trusted(db, "r-201"))
        .await;
    // Give the new session its introduction before typing.
    idle(1).await;
    peer.forget();
    peer.keys(&typed(PIN));
    hub.wait_db("door.locked_out", |db| {
        audit_rows(db, "201").last().map(String::as_str) == Some("door.locked_out")
    })
    .await;
    let led = peer.wait("the red flashing LED", Duration::from_secs(3), |v| {
        v["cmd"] == "led"
    });
    assert_eq!(
        (led["on_color"].as_i64(), led["off_color"].as_i64()),
        (Some(1), Some(0)),
        "{led}"
    );
    idle(1).await;
    assert!(peer.commands("output").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_door_contact_and_tamper_come_from_the_readers_own_reports() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1", "--inputs", "2"]);
    let mut hub = secure_hub(&broker, &mut peer, "contact_input = 1", "").await;
    // Input 1 active: the door opened with no grant.
    peer.send(serde_json::json!({"status": "input", "mask": 2, "n": 2}));
    hub.wait_db("door_forced", |db| alert_open(db, "door_forced", "201"))
        .await;
    peer.send(serde_json::json!({"status": "input", "mask": 0, "n": 2}));
    hub.wait_db("door_forced cleared on closing", |db| {
        !alert_open(db, "door_forced", "201")
    })
    .await;
    peer.send(serde_json::json!({"status": "local", "mask": 1, "n": 2}));
    hub.wait_db("tamper", |db| alert_open(db, "tamper", "r-201"))
        .await;
    assert_eq!(audit_rows(&hub.db(), "201"), ["door.forced"]);
    assert_eq!(audit_rows(&hub.db(), "r-201"), ["board.tamper"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_without_the_output_or_input_a_door_needs_raises_board_mismatch() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    // The door drives output 1 and reads input 1; this reader has one of each.
    let mut peer = Peer::start(&[
        "--key",
        &key_hex(&KEY_1),
        "--address",
        "1",
        "--outputs",
        "1",
        "--inputs",
        "1",
    ]);
    let mut hub = secure_hub(&broker, &mut peer, "contact_input = 1", "").await;
    hub.wait_db("board_mismatch", |db| {
        alert_open(db, "board_mismatch", "r-201")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_the_reader_refuses_is_recorded_unconfirmed() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1", "--nak-output"]);
    let mut hub = secure_hub(&broker, &mut peer, "", "").await;
    issue(&broker, &mut hub, "201", PIN).await;
    peer.keys(&typed(PIN));
    hub.wait_db("door.unlock_unconfirmed", |db| {
        audit_rows(db, "201") == ["door.granted:k-1", "door.unlock_unconfirmed:k-1"]
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_entries_past_the_flood_limit_is_denied_undecided_and_counted() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let mut hub = secure_hub(&broker, &mut peer, "", "lockout_threshold = 100").await;
    // Six entries in one burst: four are decided, the rest are flood.
    let mut burst = Vec::new();
    for p in ["111111", "222222", "333333", "444444", "555555", "666666"] {
        burst.extend(typed(p));
    }
    peer.keys(&burst);
    let denied = |db: &Connection| {
        audit_rows(db, "201")
            .iter()
            .filter(|r| r.starts_with("door.denied"))
            .count()
    };
    hub.wait_db(
        "keypad_flood, its door.flood row and four decisions",
        |db| {
            alert_open(db, "keypad_flood", "201")
                && audit_rows(db, "201").iter().any(|r| r == "door.flood")
                && denied(db) >= 4
        },
    )
    .await;
    idle(1).await;
    let rows = audit_rows(&hub.db(), "201");
    let decided = rows.iter().filter(|r| r.starts_with("door.denied")).count();
    assert_eq!(decided, 4, "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_door_is_remembered_across_a_restart_and_cleared_when_it_closes() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let mut hub = secure_hub(&broker, &mut peer, "contact_input = 0", "").await;
    peer.send(serde_json::json!({"status": "input", "mask": 1, "n": 2}));
    hub.wait_db("door_forced", |db| alert_open(db, "door_forced", "201"))
        .await;
    hub.sigterm();
    let open: i64 = hub
        .db()
        .query_row("SELECT open FROM door_state WHERE door = '201'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(open, 1, "the open door is kept durably");
    hub.spawn();
    hub.wait_db("the reader secure again", |db| trusted(db, "r-201"))
        .await;
    assert!(alert_open(&hub.db(), "door_forced", "201"));
    peer.send(serde_json::json!({"status": "input", "mask": 0, "n": 2}));
    hub.wait_db("door_forced cleared", |db| {
        !alert_open(db, "door_forced", "201")
    })
    .await;
    assert_eq!(audit_rows(&hub.db(), "201"), ["door.forced"]);
}

/// osdp.md, a replaced reader: vendor, model and serial are all compared,
/// and a quarantined reader's authenticated input reports still count, so
/// the door contact stays supervised while its keypad is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_with_another_vendor_is_quarantined_and_its_door_contact_stays_supervised() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let first = keyed_peer("0x1111");
    let dir = tempfile::tempdir().unwrap();
    let link_path = dir.path().join("bus-a");
    pty::point(&link_path, &first.port);
    let mut hub = Daemon::start(
        &broker.url(),
        DaemonOptions {
            hub_extra: format!(
                "{}{}{}",
                bus("bus-a", &link_path, 9600),
                reader("r-201", "bus-a", 1, ""),
                reader_door("201", "r-201", 1, "contact_input = 1"),
            ),
            secrets_extra: reader_key("r-201", &KEY_1),
            ..DaemonOptions::default()
        },
    );
    hub.wait_db("the first reader recorded", |db| {
        trusted(db, "r-201") && reader_serial(db, "r-201") == Some(0x1111)
    })
    .await;
    issue(&broker, &mut hub, "201", PIN).await;

    // Same serial, same key, another vendor.
    let mut second = Peer::start(&[
        "--key",
        &key_hex(&KEY_1),
        "--address",
        "1",
        "--serial",
        "0x1111",
        "--vendor",
        "0x0D0E0F",
    ]);
    pty::point(&link_path, &second.port);
    drop(first);
    hub.wait_db("reader_replaced and quarantine", |db| {
        alert_open(db, "reader_replaced", "r-201") && link(db, "r-201") == Some((true, true, true))
    })
    .await;
    second.send(serde_json::json!({"status": "input", "mask": 2, "n": 2}));
    hub.wait_db("door_forced from the quarantined reader's contact", |db| {
        alert_open(db, "door_forced", "201")
    })
    .await;
    second.keys(&typed(PIN));
    idle(2).await;
    assert_eq!(
        audit_rows(&hub.db(), "201"),
        ["door.forced"],
        "its keypad is ignored"
    );
    assert!(second.commands("output").is_empty());
}
