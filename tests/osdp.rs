//! OSDP readers against a reader no one here wrote: the PyPI `libosdp`
//! PeripheralDevice (tests/osdp/peer.py) on a pseudo-terminal, the real
//! `lockhub run` binary, a real Mosquitto and SQLite file.

mod common;

use common::daemon::{Daemon, DaemonOptions};
use common::mosquitto::{BrokerOptions, Mosquitto};
use common::osdp_peer::{Peer, key_hex};
use lockhub::crypto::b64u_encode;
use rusqlite::Connection;
use std::path::Path;
use std::time::Duration;

const KEY_1: [u8; 16] = [
    0x10, 0x21, 0x32, 0x43, 0x54, 0x65, 0x76, 0x87, 0x98, 0xA9, 0xBA, 0xCB, 0xDC, 0xED, 0xFE, 0x0F,
];
const KEY_2: [u8; 16] = [0x5A; 16];

fn bus(name: &str, port: &Path, baud: u32) -> String {
    format!(
        "[[osdp]]\nname = \"{name}\"\nport = \"{}\"\nbaud = {baud}\n\n",
        port.display()
    )
}

fn reader(name: &str, bus: &str, address: u8, extra: &str) -> String {
    format!("[[reader]]\nname = \"{name}\"\nbus = \"{bus}\"\naddress = {address}\n{extra}\n\n")
}

fn reader_door(name: &str, reader: &str, output: u8, extra: &str) -> String {
    format!(
        "[[door]]\nname = \"{name}\"\nreader = \"{reader}\"\noutput = {output}\nunlock_ms = 5000\n{extra}\n\n"
    )
}

fn reader_key(reader: &str, key: &[u8; 16]) -> String {
    format!(
        "[[reader_key]]\nreader = \"{reader}\"\nscbk = \"{}\"\n\n",
        b64u_encode(key)
    )
}

fn alert_open(db: &Connection, condition: &str, subject: &str) -> bool {
    db.query_row(
        "SELECT count(*) FROM alerts WHERE condition = ?1 AND subject = ?2 AND state = 'raised'",
        [condition, subject],
        |r| r.get::<_, i64>(0),
    )
    .unwrap_or(0)
        > 0
}

fn link(db: &Connection, reader: &str) -> Option<(bool, bool, bool)> {
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
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1", "--serial", "0x11223344"]);
    let mut hub = one_reader_hub(&broker, &peer, Some(&KEY_1), "");
    peer.wait_sc();
    hub.wait_db("the reader online over a secure channel", |db| {
        link(db, "r-201") == Some((true, true, false))
    })
    .await;
    let serial: i64 = hub.db().query_row(
        "SELECT serial FROM osdp_readers WHERE reader = 'r-201'",
        [],
        |r| r.get(0),
    ).unwrap();
    assert_eq!(serial, 0x11223344);
    let db = hub.db();
    assert!(!alert_open(&db, "reader_link_fault", "r-201"));
    assert!(!alert_open(&db, "link_insecure", "r-201"));
}
