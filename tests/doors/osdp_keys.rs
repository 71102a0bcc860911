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
