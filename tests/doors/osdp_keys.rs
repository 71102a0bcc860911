//! Safe key changes (osdp.md, Secure Channel): `lockhub osdp install`
//! refuses unless it is the only talker on the bus and the reader is the
//! one meant, and `lockhub osdp rekey` changes a reader's key under its
//! current one. Against the PyPI `libosdp` reader, through the real binary.

use std::time::Duration;

use testkit::board::pty::Pty;
use testkit::broker::{BrokerOptions, Mosquitto};
use testkit::daemon::{Daemon, DaemonOptions};
use testkit::osdp_peer::{Peer, key_hex};
use tokio::io::AsyncWriteExt;

use super::osdp::{KEY_1, bus, lockhub, reader, reader_key, relay};

/// A prepared (not running) hub whose bus is `port`, with `readers` as
/// `(name, address)`: r-201 keyed with KEY_1, the others with a key each.
fn prepared(broker: &Mosquitto, port: &std::path::Path, readers: &[(&str, u8)]) -> Daemon {
    let mut hub_extra = bus("bus-a", port, 9600);
    let mut secrets_extra = reader_key("r-201", &KEY_1);
    for (name, address) in readers {
        hub_extra += &reader(name, "bus-a", *address, "");
        if *name != "r-201" {
            secrets_extra += &reader_key(name, &[*address; 16]);
        }
    }
    Daemon::prepare(
        &broker.url(),
        DaemonOptions {
            hub_extra,
            secrets_extra,
            ..DaemonOptions::default()
        },
    )
}

fn refused(out: &std::process::Output, why: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(why), "{err}");
    assert!(!err.contains(&key_hex(&KEY_1)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_refuses_when_another_configured_reader_answers_on_the_bus() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut fresh = Peer::start(&["--key", "none", "--address", "1"]);
    let mut other = Peer::start(&["--key", &key_hex(&[0x77; 16]), "--address", "2"]);
    let path = relay(&[&fresh, &other]);
    let hub = prepared(&broker, &path, &[("r-201", 1), ("r-202", 2)]);
    let out = lockhub(
        &["osdp", "install", "--reader", "r-201"],
        &hub.dir.path().join("hub.toml"),
    );
    refused(&out, "reader `r-202` answers at address 2");
    assert!(
        fresh.commands("keyset").is_empty(),
        "the key was never sent"
    );
    assert!(other.commands("keyset").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_refuses_when_traffic_is_heard_before_it_starts() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let pty = Pty::open();
    let (mut master, _slave, path) = pty.into_parts();
    let hub = prepared(&broker, &path, &[("r-201", 1)]);
    // Another panel polling on the bus.
    let talker = tokio::spawn(async move {
        loop {
            if master
                .write_all(&[0xFF, 0x53, 0x05, 0x08, 0x00])
                .await
                .is_err()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let config = hub.dir.path().join("hub.toml");
    let out = tokio::task::spawn_blocking(move || {
        lockhub(&["osdp", "install", "--reader", "r-201"], &config)
    })
    .await
    .unwrap();
    talker.abort();
    refused(&out, "traffic on the bus before install started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_with_serial_refuses_another_reader_and_never_sends_it_the_key() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", "none", "--address", "1", "--serial", "0x1111"]);
    let hub = prepared(&broker, &peer.port, &[("r-201", 1)]);
    let config = hub.dir.path().join("hub.toml");
    let out = lockhub(
        &["osdp", "install", "--reader", "r-201", "--serial", "2222"],
        &config,
    );
    refused(&out, "serial is 00001111, not 00002222");
    assert!(peer.commands("keyset").is_empty(), "the key was never sent");
    // The right serial installs.
    let out = lockhub(
        &["osdp", "install", "--reader", "r-201", "--serial", "0x1111"],
        &config,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(peer.commands("keyset").len(), 1);
}

const KEY_NEW: [u8; 16] = [
    0x9C, 0x21, 0x5E, 0x07, 0xB3, 0x44, 0xD8, 0x6A, 0x1F, 0xE2, 0x70, 0x35, 0xC9, 0x8B, 0x12, 0x4D,
];

/// `key` in a file of its own at mode 0600, as an installer keeps it.
fn key_file(dir: &std::path::Path, key: &[u8; 16], mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("new.key");
    std::fs::write(&path, lockhub_proto::crypto::b64u_encode(key) + "\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// r-201's key as the secrets file now says, and the file's mode.
fn secrets_key(config: &std::path::Path) -> ([u8; 16], u32) {
    use std::os::unix::fs::PermissionsExt;
    let c = lockhub::config::load(config).unwrap_or_else(|e| panic!("{e}"));
    let mode = std::fs::metadata(&c.secrets_file)
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    (c.reader_key("r-201").unwrap().scbk, mode)
}

fn rekey(config: &std::path::Path, file: &std::path::Path) -> std::process::Output {
    lockhub(
        &[
            "osdp",
            "rekey",
            "--reader",
            "r-201",
            "--new-key-file",
            file.to_str().unwrap(),
        ],
        config,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekey_refuses_a_weak_or_readable_new_key_and_sends_nothing() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let hub = prepared(&broker, &peer.port, &[("r-201", 1)]);
    let config = hub.dir.path().join("hub.toml");
    for (key, mode, why) in [
        (lockhub::config::SCBK_D, 0o600, "SCBK-D or all zero"),
        ([0; 16], 0o600, "SCBK-D or all zero"),
        (KEY_1, 0o600, "the reader's current key"),
        (KEY_NEW, 0o644, "group or others can read it"),
    ] {
        let out = rekey(&config, &key_file(hub.dir.path(), &key, mode));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(why), "{err}");
    }
    assert!(peer.commands("keyset").is_empty());
    assert_eq!(secrets_key(&config).0, KEY_1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rekey_changes_the_key_under_the_current_one_even_when_the_link_drops_before_the_proof() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let mut hub = prepared(&broker, &peer.port, &[("r-201", 1)]);
    let config = hub.dir.path().join("hub.toml");
    let file = key_file(hub.dir.path(), &KEY_NEW, 0o600);
    let running = {
        let (config, file) = (config.clone(), file.clone());
        std::thread::spawn(move || rekey(&config, &file))
    };
    // The reader takes osdp_KEYSET, then its wire is cut for 3 s: the
    // proof has to wait for it, and must not write a key on a guess.
    peer.wait("osdp_KEYSET", Duration::from_secs(20), |v| {
        v["cmd"] == "keyset"
    });
    peer.send(serde_json::json!({"pause": true}));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        secrets_key(&config).0,
        KEY_1,
        "nothing written before the proof"
    );
    peer.send(serde_json::json!({"pause": false}));
    let out = tokio::task::spawn_blocking(move || running.join().unwrap())
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("new key is set and proven"), "{said}");
    assert!(!said.contains(&key_hex(&KEY_NEW)));
    assert_eq!(secrets_key(&config), (KEY_NEW, 0o600));
    assert_eq!(peer.commands("keyset").len(), 1);

    // The hub now runs with the new key, and the old one is gone.
    hub.spawn();
    hub.wait_db("the reader secure with its new key", |db| {
        super::osdp::trusted(db, "r-201")
    })
    .await;
}
