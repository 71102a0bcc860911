//! Someone on the RS-485 wire in the wall (osdp.md, Supervision): a man in
//! the middle ([`testkit::osdp_relay`]) between the hub and the PyPI
//! `libosdp` reader injects, drops and alters packets. Each attack ends in
//! the alert the page names, within its bound; every grant is settled on
//! record; and once the relay only forwards, the door opens as usual.

use std::time::{Duration, Instant};

use testkit::broker::{BrokerOptions, Mosquitto};
use testkit::daemon::{Daemon, DaemonOptions};
use testkit::osdp_peer::{Peer, key_hex};
use testkit::osdp_relay::{Attack, Relay};

use super::osdp::{
    KEY_1, PIN, alert_open, audit_rows, bus, issue, lockhub, reader, reader_door, reader_key,
    trusted, typed,
};

/// A hub whose reader r-201 (door 201, strike on output 1) is on `port`,
/// its Secure Channel up and a key for PIN issued.
async fn hub_on(broker: &Mosquitto, port: &std::path::Path) -> Daemon {
    let mut hub = Daemon::start(
        &broker.url(),
        DaemonOptions {
            hub_extra: format!(
                "{}{}{}",
                bus("bus-a", port, 9600),
                reader("r-201", "bus-a", 1, ""),
                reader_door("201", "r-201", 1, ""),
            ),
            secrets_extra: reader_key("r-201", &KEY_1),
            ..DaemonOptions::default()
        },
    );
    hub.wait_db("the reader secure", |db| trusted(db, "r-201"))
        .await;
    issue(broker, &mut hub, "201", PIN).await;
    hub
}

/// [`hub_on`] with the reader reached through a relay.
async fn relayed(broker: &Mosquitto) -> (Daemon, Peer, Relay) {
    let peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let relay = Relay::start(&peer.port);
    let hub = hub_on(broker, &relay.path).await;
    (hub, peer, relay)
}

/// Waits for `condition` on r-201 and returns how long it took.
async fn raised(hub: &mut Daemon, condition: &str) -> Duration {
    let t0 = Instant::now();
    hub.wait_db(condition, |db| alert_open(db, condition, "r-201"))
        .await;
    t0.elapsed()
}

/// The relay stops attacking: the reader is trusted again and a PIN opens
/// the door (osdp_ACK, `door.unlocked`), and every grant before it was
/// settled.
async fn door_opens_once_the_relay_stops(hub: &mut Daemon, peer: &mut Peer, relay: &Relay) {
    relay.set(Attack::None);
    hub.wait_db("the reader trusted again", |db| trusted(db, "r-201"))
        .await;
    let before = audit_rows(&hub.db(), "201").len();
    peer.forget();
    peer.keys(&typed(PIN));
    peer.wait("osdp_OUT", Duration::from_secs(5), |v| v["cmd"] == "output");
    hub.wait_db("door.unlocked", |db| {
        audit_rows(db, "201")[before..] == ["door.granted:k-1", "door.unlocked:k-1"]
    })
    .await;
    every_grant_settled(&audit_rows(&hub.db(), "201"));
}

/// Each `door.granted` is followed by its `door.unlocked` or
/// `door.unlock_unconfirmed` before the next grant: no outcome lost.
fn every_grant_settled(rows: &[String]) {
    let mut open = false;
    for r in rows {
        if r.starts_with("door.granted") {
            assert!(!open, "a grant without its outcome: {rows:?}");
            open = true;
        } else if r.starts_with("door.unlocked") || r.starts_with("door.unlock_unconfirmed") {
            assert!(open, "an outcome without its grant: {rows:?}");
            open = false;
        }
    }
    assert!(!open, "the last grant has no outcome: {rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_nak_after_every_reply_raises_reader_link_fault_within_seconds() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let (mut hub, mut peer, relay) = relayed(&broker).await;
    relay.set(Attack::NakAfterReply);
    // Three early ends in a minute; with the backoff (1 s, 2 s) and the
    // handshakes between them, a few seconds.
    let took = raised(&mut hub, "reader_link_fault").await;
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(relay.touched() >= 3, "{} NAKs injected", relay.touched());
    assert!(!alert_open(&hub.db(), "board_offline", "r-201"));
    door_opens_once_the_relay_stops(&mut hub, &mut peer, &relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequence_0_packet_injected_to_the_reader_raises_reader_link_fault_within_seconds() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let (mut hub, mut peer, relay) = relayed(&broker).await;
    relay.set(Attack::Seq0ToReader);
    let took = raised(&mut hub, "reader_link_fault").await;
    assert!(took < Duration::from_secs(15), "took {took:?}");
    door_opens_once_the_relay_stops(&mut hub, &mut peer, &relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_long_reply_dropped_raises_board_offline_after_8_s_and_the_door_state_is_unknown() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let (mut hub, mut peer, relay) = relayed(&broker).await;
    relay.set(Attack::DropLongReplies);
    // Short ACKs to polls still verify; the reader's next report (a long
    // reply) is dropped, so is every osdp_CCRYPT after it.
    peer.send(serde_json::json!({"status": "input", "mask": 2, "n": 2}));
    let took = raised(&mut hub, "board_offline").await;
    assert!(
        took >= Duration::from_secs(7) && took < Duration::from_secs(11),
        "8 s without an authenticated reply; took {took:?}"
    );
    let out = lockhub(&["status"], &hub.dir.path().join("hub.toml"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("r-201 on bus-a address 1: OFFLINE")
            && text.contains("door 201: state unknown"),
        "{text}"
    );
    door_opens_once_the_relay_stops(&mut hub, &mut peer, &relay).await;
    assert!(!alert_open(&hub.db(), "board_offline", "r-201"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_reply_with_a_flipped_bit_is_unconfirmed_at_once_and_three_raise_reader_link_fault()
{
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let (mut hub, mut peer, relay) = relayed(&broker).await;
    relay.set(Attack::FlipOutReply);
    for round in 1..=3 {
        hub.wait_db("the reader trusted", |db| trusted(db, "r-201"))
            .await;
        peer.forget();
        peer.keys(&typed(PIN));
        peer.wait("osdp_OUT", Duration::from_secs(5), |v| v["cmd"] == "output");
        let t0 = Instant::now();
        hub.wait_db("door.unlock_unconfirmed", |db| {
            audit_rows(db, "201")
                .iter()
                .filter(|r| r.starts_with("door.unlock_unconfirmed"))
                .count()
                == round
        })
        .await;
        // At once: not after resends, not at the next start.
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        every_grant_settled(&audit_rows(&hub.db(), "201"));
        if round < 3 {
            assert!(
                !alert_open(&hub.db(), "reader_link_fault", "r-201"),
                "a bad MAC is counted first"
            );
        }
    }
    let took = raised(&mut hub, "reader_link_fault").await;
    assert!(
        took < Duration::from_secs(2),
        "the third raises it: {took:?}"
    );
    assert_eq!(relay.touched(), 3);
    door_opens_once_the_relay_stops(&mut hub, &mut peer, &relay).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_acks_a_plaintext_no_op_output_raises_link_insecure_and_its_door_still_works()
{
    let broker = Mosquitto::start_with(BrokerOptions::default());
    // libosdp without EnforceSecure takes commands outside the channel.
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1", "--no-enforce"]);
    let mut hub = hub_on(&broker, &peer.port).await;
    hub.wait_db("link_insecure", |db| {
        alert_open(db, "link_insecure", "r-201")
    })
    .await;
    // The probe is a no-op: control code 0x00 for the strike's output.
    let probes = peer.commands("output");
    assert!(!probes.is_empty());
    assert!(
        probes
            .iter()
            .all(|o| o["control_code"] == 0 && o["output_no"] == 1),
        "{probes:?}"
    );
    let out = lockhub(&["status"], &hub.dir.path().join("hub.toml"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("link_insecure r-201") && text.contains("takes osdp_OUT in plain text"),
        "{text}"
    );
    peer.forget();
    peer.keys(&typed(PIN));
    hub.wait_db("door.unlocked", |db| {
        audit_rows(db, "201") == ["door.granted:k-1", "door.unlocked:k-1"]
    })
    .await;
    assert!(
        alert_open(&hub.db(), "link_insecure", "r-201"),
        "while it is in use"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_enforces_the_secure_channel_passes_the_plaintext_probe() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let hub = hub_on(&broker, &peer.port).await;
    // A few sessions' worth: the probe goes before each handshake.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!alert_open(&hub.db(), "link_insecure", "r-201"));
    assert!(peer.commands("output").is_empty(), "the reader refused it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_typed_pin_does_not_outlive_its_session() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let (mut hub, mut peer, relay) = relayed(&broker).await;
    let (head, tail) = PIN.split_at(3);
    peer.keys(head.as_bytes());
    // Polled up by the hub, then the session is ended from the wire.
    tokio::time::sleep(Duration::from_millis(500)).await;
    relay.set(Attack::NakAfterReply);
    let t0 = Instant::now();
    while relay.touched() == 0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "no NAK injected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.set(Attack::None);
    hub.wait_db("the reader trusted again", |db| trusted(db, "r-201"))
        .await;
    // The rest of the PIN alone is three digits: bad_format, not a grant.
    peer.keys(&typed(tail));
    hub.wait_db("the entry decided", |db| !audit_rows(db, "201").is_empty())
        .await;
    assert_eq!(audit_rows(&hub.db(), "201"), ["door.denied/bad_format"]);
    door_opens_once_the_relay_stops(&mut hub, &mut peer, &relay).await;
}

/// osdp.md, Opening the door (recommended): door 201 takes its PIN from
/// reader r-201 and its strike is relay 1 of the lock board `board-a` on
/// the secured side. The grant drives the board's relay, the board records
/// the outcome, the reader shows the feedback, and no reader output moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_on_the_reader_opens_the_strike_on_the_boards_relay() {
    use testkit::board::{board, pty::Pty, relay_opened};
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let (mut sim, keep) = board(Pty::open(), 2);
    let mut hub = Daemon::prepare(
        &broker.url(),
        DaemonOptions {
            hub_extra: format!(
                "{}{}[[door]]\nname = \"201\"\nreader = \"r-201\"\nserial = \"board-a\"\nindex = 1\nunlock_ms = 5000\n\n",
                bus("bus-a", &peer.port, 9600),
                reader("r-201", "bus-a", 1, ""),
            ),
            secrets_extra: reader_key("r-201", &KEY_1),
            ..DaemonOptions::default()
        },
    );
    let config = hub.dir.path().join("hub.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("/dev/ttyAMA0", &keep.path.display().to_string()),
    )
    .unwrap();
    hub.spawn();
    issue(&broker, &mut hub, "201", PIN).await;
    let db = hub.db();
    let up = sim
        .run_until(Duration::from_secs(30), |s| {
            s.board().link_up(s.now_ms()) && trusted(&db, "r-201")
        })
        .await
        .unwrap();
    assert!(up, "the board linked and the reader trusted");
    sim.take_events();
    peer.forget();
    peer.keys(&typed(PIN));
    let opened = sim
        .run_until(Duration::from_secs(5), |s| s.events().any(relay_opened(1)))
        .await
        .unwrap();
    assert!(opened, "the board's relay 1 opened");
    let recorded = sim
        .run_until(Duration::from_secs(10), |_| {
            audit_rows(&db, "201") == ["door.granted:k-1", "door.unlocked:k-1"]
        })
        .await
        .unwrap();
    assert!(recorded, "{:?}", audit_rows(&db, "201"));
    peer.wait("the green LED", Duration::from_secs(3), |v| {
        v["cmd"] == "led" && v["on_color"] == 2
    });
    assert!(peer.commands("output").is_empty(), "no reader output moved");
    assert!(
        !alert_open(&db, "link_insecure", "r-201"),
        "no output: no probe"
    );
}
