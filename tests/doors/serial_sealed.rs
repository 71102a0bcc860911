//! The sealed board link against a wire attacker (docs/protocol/serial.md,
//! "Sealed link"): a relay between the hub and the board
//! (testkit::board::relay) reads, drops, replays, flips and injects frames;
//! nothing it does opens a door or reads a PIN, and what it tries is
//! counted and alerted.

use std::os::fd::OwnedFd;
use std::time::Duration;

use firmware_bridge::frame::to_frame;
use firmware_bridge::rng::RandomSource;
use firmware_bridge::sealed::{BoardRx, BoardSeal, HubRx, HubSeal};
use firmware_bridge::{BoardConfig, Downlink, LinkKey, Pin, Uplink};
use lockhub::drivers::serial::SerialHandle;
use lockhub::sim::board::{SimBoard, SimEvent};
use testkit::board::pty::{self, Pty};
use testkit::board::relay::{Dir, Relay, flip, frame_of, payload_of};
use testkit::board::*;
use testkit::db::Db;
use testkit::files::board_key_for;

const PIN: &str = "482913";

/// A hub on a port through the relay, and a board on the relay's far end:
/// sealed (the board holds `board-a`'s key) or plain (both plain).
async fn relayed(db: &Db, sealed: bool) -> (SerialHandle, Sim, Relay, OwnedFd) {
    let (relay, master, keep) = Relay::start();
    let link = db.dir.path().join("board-a");
    pty::point(&link, &relay.hub_path);
    let doors = vec![door("101", 0)];
    let port = if sealed {
        port("board-a", link, doors)
    } else {
        plain_port("board-a", link, doors)
    };
    let hub = start(db, settings(vec![port], db.policy));
    let cfg = BoardConfig::new(1, 2);
    let mut sim = if sealed {
        SimBoard::new_sealed(master, cfg, board_key_for("board-a"))
    } else {
        SimBoard::new(master, cfg)
    };
    until_linked(&mut sim).await;
    (hub, sim, relay, keep)
}

/// Whether `needle` occurs in `hay`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The relay's sealed frames one way whose payload is `len` bytes long.
fn sealed_frames(relay: &Relay, dir: Dir, len: usize) -> Vec<Vec<u8>> {
    relay
        .captured()
        .into_iter()
        .filter(|(d, f)| *d == dir && payload_of(f).is_some_and(|p| p.len() == len && p[0] == 0xA5))
        .map(|(_, f)| f)
        .collect()
}

/// Sealed payload lengths: mark, counter and tag (21) around the message.
/// `Unlock{seq<128, door, ms: 800}` is 5 bytes; `Keypad{seq<128, door,
/// 6 digits}` 10.
const SEALED_UNLOCK: usize = 21 + 5;
const SEALED_KEYPAD: usize = 21 + 10;

/// One `link_seal` counter of `board-a`.
fn seal_count(db: &Db, column: &str) -> i64 {
    db.count(&format!(
        "SELECT coalesce(sum({column}), 0) FROM link_seal WHERE serial = 'board-a'"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wire_tap_reads_no_pin_on_a_sealed_link_and_every_digit_on_a_plain_one() {
    for sealed in [true, false] {
        let db = Db::open();
        db.add_key("k-1", PIN, &["101"]).await;
        let (hub, mut sim, relay, _keep) = relayed(&db, sealed).await;
        sim.enter_pin(0, PIN);
        assert!(
            sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
                .await
                .unwrap()
        );
        assert!(until_db(&mut sim, &db, |db| db.audit().len() == 2).await);
        let tapped = relay.captured_bytes();
        assert!(tapped.len() > 100, "the tap saw the traffic");
        let pin = PIN.as_bytes();
        let readable = contains(&tapped, pin) || pin.windows(4).any(|w| contains(&tapped, w));
        assert_eq!(readable, !sealed, "sealed: {sealed}");
        // The plain link raises link_insecure while in use; the sealed one
        // shows its session.
        assert_eq!(db.raised("link_insecure", "board-a"), !sealed);
        if sealed {
            assert!(until_db(&mut sim, &db, |db| seal_count(db, "sealed") == 1).await);
            assert_eq!(
                db.count("SELECT count(*) FROM link_seal WHERE session_since IS NOT NULL"),
                1
            );
        }
        hub.shutdown().await;
    }
}

/// A session under another key (`board-z`'s), as a second board or an
/// attacker with a board of its own holds it.
fn other_session() -> BoardSeal {
    struct Fixed(u8);
    impl RandomSource for Fixed {
        fn fill_bytes(&mut self, out: &mut [u8]) {
            for b in out {
                self.0 = self.0.wrapping_mul(31).wrapping_add(7);
                *b = self.0;
            }
        }
    }
    let key = LinkKey::from_bytes(board_key_for("board-z"));
    let mut hub = HubSeal::new(key.clone());
    let mut board = BoardSeal::new(1, key);
    let mut rng = Fixed(3);
    let hello = hub.start_with(&mut rng).unwrap();
    let BoardRx::Send(answer) = board.on_payload(&payload_of(&hello).unwrap(), &mut rng) else {
        panic!("the board answers")
    };
    let HubRx::SessionStarted { confirm, .. } = hub.on_payload(&payload_of(&answer).unwrap())
    else {
        panic!("the hub confirms")
    };
    board.on_payload(&payload_of(&confirm).unwrap(), &mut rng);
    assert!(board.has_session());
    board
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_replayed_flipped_and_foreign_frames_open_nothing_are_counted_and_raise_board_link_fault()
 {
    let db = Db::open();
    db.add_key("k-1", PIN, &["101"]).await;
    let (hub, mut sim, relay, _keep) = relayed(&db, true).await;
    sim.enter_pin(0, PIN);
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );
    let closed = |s: &Sim| count(s, |e| *e == SimEvent::RelayClosed { door: 0 });
    assert!(sim.run_until(WAIT, |s| closed(s) == 1).await.unwrap());
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 2).await);
    let unlock = sealed_frames(&relay, Dir::HubToBoard, SEALED_UNLOCK)
        .pop()
        .expect("the tap saw the sealed Unlock");
    let keypad = sealed_frames(&relay, Dir::BoardToHub, SEALED_KEYPAD)
        .pop()
        .expect("the tap saw the sealed Keypad");

    // Toward the board: a plain Unlock, the sealed Unlock again, and the
    // sealed Unlock with one ciphertext bit flipped (CRC redone).
    let plain_unlock = to_frame(&Downlink::Unlock {
        seq: 77,
        door: 0,
        ms: 800,
    })
    .unwrap()
    .to_vec();
    for f in [plain_unlock, unlock.clone(), flip(&unlock, 7)] {
        relay.inject(Dir::HubToBoard, f).await;
    }
    sim.run_for(Duration::from_millis(600)).await.unwrap();
    assert_eq!(count(&sim, relay_opened(0)), 1, "nothing opened the door");
    let drops = sim.board().seal_drops().unwrap();
    assert_eq!(
        (drops.plain, drops.replay, drops.bad_tag),
        (1, 1, 1),
        "{drops:?}"
    );
    assert!(sim.board().has_session(), "the board keeps its session");

    // Toward the hub: a plain Keypad with the right PIN, the sealed Keypad
    // again, a flipped copy, and a Keypad sealed under another board's key.
    let pin = Pin::from_digits(PIN).unwrap();
    let plain_keypad = to_frame(&Uplink::Keypad {
        seq: 90,
        door: 0,
        pin: pin.clone(),
    })
    .unwrap()
    .to_vec();
    let foreign = other_session()
        .seal(&Uplink::Keypad {
            seq: 91,
            door: 0,
            pin,
        })
        .unwrap()
        .to_vec();
    for f in [plain_keypad, keypad.clone(), flip(&keypad, 9), foreign] {
        relay.inject(Dir::BoardToHub, f).await;
    }
    assert!(until_db(&mut sim, &db, |db| db.raised("board_link_fault", "board-a")).await);
    assert!(
        until_db(&mut sim, &db, |db| seal_count(db, "plain") == 1
            && seal_count(db, "replayed") == 1
            && seal_count(db, "bad_tag") == 2)
        .await,
        "plain {}, replayed {}, bad_tag {}",
        seal_count(&db, "plain"),
        seal_count(&db, "replayed"),
        seal_count(&db, "bad_tag")
    );
    sim.run_for(Duration::from_millis(300)).await.unwrap();
    assert_eq!(
        db.audit(),
        ["door.granted@101", "door.unlocked@101"],
        "no injected Keypad was decided"
    );

    // A plain Hello toward the hub, as if the board had restarted: the
    // hub checks it with a sealed Ping, the board's sealed Pong shows it was
    // not the board's, and the session holds (no new SealHello).
    let hello = to_frame(&Uplink::Hello {
        board_id: 1,
        fw_major: 1,
        fw_minor: 0,
        door_count: 2,
    })
    .unwrap()
    .to_vec();
    relay.inject(Dir::BoardToHub, hello).await;
    assert!(until_db(&mut sim, &db, |db| seal_count(db, "forged_hello") == 1).await);
    assert_eq!(hub_hellos(&sim), 1, "no new session");
    assert!(sim.board().has_session());

    // The real board still opens its door.
    sim.enter_pin(0, PIN);
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 2)
            .await
            .unwrap()
    );
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_board_gets_a_new_session_and_a_resent_keypad_is_decided_once() {
    let db = Db::open();
    db.add_key("k-1", PIN, &["101"]).await;
    let pty = Pty::open();
    let s = one_door(&db, by_id(&db, "board-a", &pty));
    let hub = start(&db, s);
    let (sim, _keep) = board(pty, 1);
    let mut sim = sim;
    until_linked(&mut sim).await;

    // Power cycle: the same wire, a board with no session.
    let io = sim.into_inner();
    let mut sim = SimBoard::new_sealed(io, BoardConfig::new(1, 1), board_key_for("board-a"));
    until_linked(&mut sim).await;
    assert!(sim.board().has_session());
    sim.run_for(Duration::from_millis(300)).await.unwrap();

    // The first Ack of the Keypad is lost: the board sends it again.
    let mut lost = false;
    sim.lose_downlinks(move |m| {
        let lose = !lost && matches!(m, Downlink::Ack { .. });
        lost |= lose;
        lose
    });
    sim.enter_pin(0, PIN);
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 2).await);
    sim.run_for(Duration::from_millis(600)).await.unwrap();
    let sent = count(&sim, |e| matches!(e, SimEvent::Sent(Uplink::Keypad { .. })));
    assert_eq!(sent, 2, "the Keypad went out twice");
    assert_eq!(db.audit(), ["door.granted@101", "door.unlocked@101"]);
    assert_eq!(count(&sim, relay_opened(0)), 1);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_board_with_another_key_gets_no_session_no_unlock_and_board_link_fault() {
    let db = Db::open();
    db.add_key("k-1", PIN, &["101"]).await;
    let pty = Pty::open();
    let s = one_door(&db, by_id(&db, "board-a", &pty));
    let hub = start(&db, s);
    // The secrets name board-a's key; the board holds another.
    let (mut sim, _keep) = board_keyed(pty, 1, board_key_for("board-z"));
    assert!(until_db(&mut sim, &db, |db| db.raised("board_link_fault", "board-a")).await);
    sim.enter_pin(0, PIN);
    sim.run_for(Duration::from_secs(1)).await.unwrap();
    assert!(!sim.board().has_session());
    assert_eq!(count(&sim, relay_opened(0)), 0);
    assert!(
        !sim.events()
            .any(|e| matches!(e, SimEvent::Received(Downlink::Unlock { .. })))
    );
    assert!(db.audit().is_empty(), "{:?}", db.audit());
    assert!(until_db(&mut sim, &db, |db| seal_count(db, "bad_handshake") >= 3).await);
    assert_eq!(
        db.count("SELECT count(*) FROM link_seal WHERE session_since IS NOT NULL"),
        0
    );
    hub.shutdown().await;
}

/// A frame the relay made up from a payload: framed right, so only the
/// seal refuses it.
#[test]
fn a_reframed_payload_passes_the_crc_and_reads_back() {
    let f = to_frame(&Uplink::Heartbeat { uptime_s: 7 }).unwrap();
    let p = payload_of(&f).unwrap();
    assert_eq!(frame_of(&p), f.to_vec());
    assert_ne!(payload_of(&flip(&f, 1)).unwrap(), p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_sealhello_toward_the_board_leaves_its_session_and_its_reports() {
    let db = Db::open();
    db.add_key("k-1", PIN, &["101"]).await;
    let (hub, mut sim, relay, _keep) = relayed(&db, true).await;
    // A door held open, its report on record.
    sim.set_door(0, true);
    assert!(until_db(&mut sim, &db, |db| db.raised("door_forced", "101")).await);
    // Someone asks the board for a new session; its answer reaches the hub,
    // which asked for nothing: a failed handshake, counted.
    let forged = to_frame(&Downlink::SealHello {
        hub_nonce: [0x42; 16],
    })
    .unwrap()
    .to_vec();
    relay.inject(Dir::HubToBoard, forged).await;
    assert!(until_db(&mut sim, &db, |db| seal_count(db, "bad_handshake") == 1).await);
    assert!(sim.board().has_session(), "no SealConfirm, no new session");
    assert_eq!(
        hub_hellos(&sim),
        2,
        "the hub's first SealHello and the forged one: the hub asked for no other"
    );
    // The session still carries doors both ways.
    sim.set_door(0, false);
    assert!(until_db(&mut sim, &db, |db| !db.raised("door_forced", "101")).await);
    sim.enter_pin(0, PIN);
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );
    hub.shutdown().await;
}
