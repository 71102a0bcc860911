//! The board state machine on a sealed link and in pairing mode, driven
//! byte for byte by the hub's ends of the crate (`HubSeal`, `HubLink`,
//! `HubPairing`): what goes on the wire, what opens a relay, and what is
//! dropped.

use firmware_bridge::board::{Board, BoardConfig};
use firmware_bridge::frame::{decode_frame, to_frame};
use firmware_bridge::link::{HubLink, LinkConfig};
use firmware_bridge::pair::{BoardPairPhase, HubPairStep, HubPairing};
use firmware_bridge::rng::Rng;
use firmware_bridge::seal::{LinkKey, SEAL_MARK};
use firmware_bridge::sealed::{HubRx, HubSeal};
use firmware_bridge::{Downlink, Uplink};

mod common;
use common::{Counting, payloads, rng};

const T0: u64 = 1_000;
const LK: [u8; 32] = [0x42; 32];

type SealedBoard = Board<Rng<Counting>>;

/// The hub's side: the seal, the link rules over it, and the wire bytes
/// the board wrote.
struct Hub {
    seal: HubSeal,
    link: HubLink,
    rng: Rng<Counting>,
    heard: Vec<Uplink>,
    plain_hellos: u32,
    wire: Vec<u8>,
}

impl Hub {
    fn new(key: [u8; 32]) -> Self {
        Self {
            seal: HubSeal::new(LinkKey::from_bytes(key)),
            link: HubLink::new(LinkConfig::hub(), T0),
            rng: rng(99),
            heard: Vec::new(),
            plain_hellos: 0,
            wire: Vec::new(),
        }
    }

    /// Reads everything the board wrote; answers a board SealHello.
    fn read(&mut self, board: &mut SealedBoard, now: u64) {
        let mut out = Vec::new();
        for f in board.poll(now) {
            out.extend_from_slice(&f);
        }
        self.wire.extend_from_slice(&out);
        for p in payloads(&out) {
            match self.seal.on_payload(&p) {
                HubRx::Message(m) => {
                    if let Some(m) = self.link.on_rx(m, now) {
                        self.heard.push(m);
                    }
                }
                HubRx::PlainHello => self.plain_hellos += 1,
                HubRx::SessionStarted { confirm, .. } => board.on_frame_bytes(&confirm, now),
                HubRx::Dropped(_) => {}
            }
        }
    }

    fn start(&mut self, board: &mut SealedBoard, now: u64) {
        let hello = self.seal.start_with(&mut self.rng).unwrap();
        board.on_frame_bytes(&hello, now);
        self.read(board, now);
    }

    /// Sends what the hub link queued, sealed; returns the frames.
    fn send(&mut self, board: &mut SealedBoard, now: u64) -> Vec<Vec<u8>> {
        let mut sent = Vec::new();
        while let Some(m) = self.link.pop_tx() {
            let f = self.seal.seal(&m).unwrap();
            board.on_frame_bytes(&f, now);
            sent.push(f.to_vec());
        }
        sent
    }
}

fn sealed_board(doors: u8) -> SealedBoard {
    Board::new_sealed(
        BoardConfig::new(1, doors),
        LinkKey::from_bytes(LK),
        rng(1),
        T0,
    )
}

fn type_keys(b: &mut SealedBoard, door: u8, keys: &str, now: u64) {
    for k in keys.chars() {
        b.on_key(door, k, now);
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn a_sealed_board_asks_for_a_session_with_a_plain_hello_and_sends_nothing_else_without_one() {
    let mut b = sealed_board(2);
    b.on_door_sensor(0, true, T0);
    let frames: Vec<_> = b.poll(T0).collect();
    assert_eq!(frames.len(), 1, "only the Hello");
    assert_eq!(frames[0][0], 0x00, "after a lone 0x00");
    assert!(matches!(
        decode_frame::<Uplink>(&frames[0][1..]),
        Ok(Uplink::Hello { board_id: 1, .. })
    ));
    type_keys(&mut b, 0, "1234#", T0 + 10);
    assert_eq!(b.poll(T0 + 10).count(), 0, "no Keypad outside a session");
    // Still no session 6 s on: it asks again.
    assert_eq!(b.poll(T0 + 5_999).count(), 0);
    let again: Vec<_> = b.poll(T0 + 6_000).collect();
    assert!(again.iter().any(|f| f[0] == 0x00));
}

#[test]
fn after_the_handshake_every_report_is_sealed_and_no_pin_digit_crosses_the_wire() {
    let mut b = sealed_board(2);
    b.on_door_sensor(0, true, T0);
    b.on_door_sensor(1, false, T0);
    let mut hub = Hub::new(LK);
    hub.read(&mut b, T0);
    assert_eq!(hub.plain_hellos, 1);
    hub.start(&mut b, T0 + 10);
    assert!(b.has_session() && hub.seal.has_session());
    hub.read(&mut b, T0 + 20);
    assert!(matches!(hub.heard[0], Uplink::Hello { board_id: 1, .. }));
    let doors: Vec<(u8, bool)> = hub
        .heard
        .iter()
        .filter_map(|m| match m {
            Uplink::DoorSensor { door, open, .. } => Some((*door, *open)),
            _ => None,
        })
        .collect();
    assert_eq!(doors, [(0, true), (1, false)]);

    let before = hub.wire.len();
    type_keys(&mut b, 0, "739182#", T0 + 30);
    hub.read(&mut b, T0 + 30);
    let keypad = hub.heard.iter().find_map(|m| match m {
        Uplink::Keypad { pin, .. } => Some(pin.clone()),
        _ => None,
    });
    assert_eq!(keypad.unwrap().as_digits(), Some("739182"));
    let after = &hub.wire[before..];
    assert!(!contains(after, b"739182") && !contains(after, b"7391"));
    // Every frame of the session is sealed: after COBS its first data byte
    // is the seal mark.
    assert_eq!(after[1], SEAL_MARK);
}

#[test]
fn only_a_sealed_unlock_in_the_session_opens_the_relay_and_its_replay_opens_nothing() {
    let mut b = sealed_board(1);
    let mut hub = Hub::new(LK);
    hub.start(&mut b, T0);
    hub.read(&mut b, T0);
    let unlock = Downlink::Unlock {
        seq: 1,
        door: 0,
        ms: 500,
    };
    // Injected plain: nothing.
    b.on_frame_bytes(&to_frame(&unlock).unwrap(), T0 + 10);
    assert!(!b.relay_open(0, T0 + 10));
    // Sealed by the hub: open for its time.
    hub.link.send(unlock, T0 + 20).unwrap();
    let sent = hub.send(&mut b, T0 + 20);
    assert!(b.relay_open(0, T0 + 20));
    assert!(!b.relay_open(0, T0 + 520));
    // The same sealed frame again, later: nothing.
    let unlock_frame = sent
        .iter()
        .find(|f| f.len() > 20)
        .expect("the Unlock frame")
        .clone();
    b.on_frame_bytes(&unlock_frame, T0 + 1_000);
    assert!(!b.relay_open(0, T0 + 1_000));
    let drops = b.seal_drops().unwrap();
    assert_eq!((drops.plain, drops.replay), (1, 1));
}

#[test]
fn a_forged_seal_hello_during_a_session_erases_no_unacked_report() {
    let mut b = sealed_board(1);
    let mut hub = Hub::new(LK);
    hub.start(&mut b, T0);
    hub.read(&mut b, T0);
    b.on_tamper(T0 + 10).unwrap();
    let forged = to_frame(&Downlink::SealHello { hub_nonce: [7; 16] }).unwrap();
    b.on_frame_bytes(&forged, T0 + 20);
    assert!(b.has_session(), "kept until a new SealConfirm verifies");
    // The tamper's resend still goes out, sealed, and reaches the hub.
    hub.read(&mut b, T0 + 300);
    assert!(hub.heard.iter().any(|m| matches!(m, Uplink::Tamper { .. })));
}

#[test]
fn a_new_session_reports_the_doors_and_an_unacked_tamper_again() {
    let mut b = sealed_board(1);
    b.on_door_sensor(0, false, T0);
    let mut hub = Hub::new(LK);
    hub.start(&mut b, T0);
    hub.read(&mut b, T0);
    b.on_tamper(T0 + 10).unwrap();
    // The hub restarts: a new session, the old one's reports lost.
    let mut hub = Hub::new(LK);
    hub.start(&mut b, T0 + 50);
    hub.read(&mut b, T0 + 50);
    assert!(matches!(hub.heard[0], Uplink::Hello { .. }));
    assert!(hub.heard.iter().any(|m| matches!(
        m,
        Uplink::DoorSensor {
            door: 0,
            open: false,
            ..
        }
    )));
    assert!(hub.heard.iter().any(|m| matches!(m, Uplink::Tamper { .. })));
}

#[test]
fn a_board_with_another_key_never_opens_its_relay() {
    let mut b = sealed_board(1);
    let mut hub = Hub::new([0x43; 32]);
    hub.start(&mut b, T0);
    assert!(!b.has_session() && !hub.seal.has_session());
    assert!(hub.seal.seal(&Downlink::Ping { nonce: 1 }).is_err());
    assert!(!b.relay_open(0, T0));
}

#[test]
fn a_board_in_pairing_mode_takes_the_code_on_door_0_then_a_session_under_the_new_key() {
    let mut b: SealedBoard = Board::new_pairing(BoardConfig::new(1, 2), rng(5), T0);
    assert_eq!(b.pairing_phase(), Some(BoardPairPhase::AwaitStart));
    assert_eq!(b.poll(T0).count(), 0, "pairing mode says nothing unasked");
    let mut hub_rng = rng(6);
    let mut pairing = HubPairing::new(&mut hub_rng, T0);
    let up = |b: &mut SealedBoard, now| -> Vec<Uplink> {
        b.poll(now)
            .map(|f| decode_frame::<Uplink>(&f).unwrap())
            .collect()
    };
    b.on_frame_bytes(&to_frame(&pairing.start_msg()).unwrap(), T0);
    let reply = up(&mut b, T0);
    assert!(matches!(reply.as_slice(), [Uplink::PairReply { .. }]));
    let HubPairStep::Reveal(reveal, code) = pairing.on_msg(&reply[0], T0).unwrap() else {
        panic!()
    };
    b.on_frame_bytes(&to_frame(&reveal).unwrap(), T0 + 1);
    assert_eq!(b.pairing_phase(), Some(BoardPairPhase::AwaitCode));
    let typed: String = code.digits().iter().map(|&d| d as char).collect();
    type_keys(&mut b, 1, &typed, T0 + 2);
    type_keys(&mut b, 1, "#", T0 + 2);
    assert!(
        up(&mut b, T0 + 2).is_empty(),
        "door 1's keypad is not the code's"
    );
    type_keys(&mut b, 0, &typed, T0 + 3);
    assert_eq!(
        b.on_key(0, '#', T0 + 3),
        firmware_bridge::board::KeyAction::CodeChecked
    );
    assert_eq!(b.pairing_phase(), None, "now a sealed board");
    let stored = b.take_new_key().expect("the key to write to flash");
    let done = up(&mut b, T0 + 3);
    assert_eq!(done[0], Uplink::PairDone { ok: true });
    // Then, a sealed board under the new key, it asks for a session.
    assert!(matches!(done[1..], [Uplink::Hello { .. }]), "{done:?}");
    let HubPairStep::Paired(lk) = pairing.on_msg(&done[0], T0 + 3).unwrap() else {
        panic!()
    };
    assert!(lk.ct_eq(&stored));
    // The hub proves the key with a session before writing it.
    let mut hub = Hub::new(*lk.as_bytes());
    hub.start(&mut b, T0 + 10);
    assert!(b.has_session() && hub.seal.has_session());
}

#[test]
fn a_wrong_code_in_pairing_mode_stores_no_key_and_refuses() {
    let mut b: SealedBoard = Board::new_pairing(BoardConfig::new(1, 1), rng(7), T0);
    let mut hub_rng = rng(8);
    let mut pairing = HubPairing::new(&mut hub_rng, T0);
    b.on_frame_bytes(&to_frame(&pairing.start_msg()).unwrap(), T0);
    let reply: Vec<_> = b.poll(T0).collect();
    let reply = decode_frame::<Uplink>(&reply[0]).unwrap();
    let HubPairStep::Reveal(reveal, code) = pairing.on_msg(&reply, T0).unwrap() else {
        panic!()
    };
    b.on_frame_bytes(&to_frame(&reveal).unwrap(), T0);
    let wrong: String = code
        .digits()
        .iter()
        .map(|&d| (b'0' + (d - b'0' + 1) % 10) as char)
        .collect();
    type_keys(&mut b, 0, &wrong, T0);
    type_keys(&mut b, 0, "#", T0);
    assert!(b.take_new_key().is_none());
    let done: Vec<_> = b.poll(T0).collect();
    assert_eq!(
        decode_frame::<Uplink>(&done[0]),
        Ok(Uplink::PairDone { ok: false })
    );
    assert!(matches!(b.pairing_phase(), Some(BoardPairPhase::Failed(_))));
}

#[test]
fn a_rekeyed_board_hands_out_the_new_key_only_once_a_session_under_it_verifies() {
    let mut b = sealed_board(1);
    let mut hub = Hub::new(LK);
    hub.start(&mut b, T0);
    hub.read(&mut b, T0);
    let mut hub_rng = rng(42);
    let rekey = firmware_bridge::pair::HubRekey::new(&mut hub_rng);
    let start = hub.seal.seal(&rekey.start_msg()).unwrap();
    b.on_frame_bytes(&start, T0 + 10);
    hub.read(&mut b, T0 + 10);
    let board_pub = hub
        .heard
        .iter()
        .find_map(|m| match m {
            Uplink::RekeyReply { board_pub } => Some(*board_pub),
            _ => None,
        })
        .expect("a sealed RekeyReply");
    let new = rekey.finish(&board_pub, &LinkKey::from_bytes(LK)).unwrap();
    assert!(b.take_new_key().is_none(), "not before its proof");
    // The proof: a session under the new key (the board answers under the
    // new key first).
    let mut proof = Hub::new(*new.as_bytes());
    proof.start(&mut b, T0 + 20);
    assert!(proof.seal.has_session());
    let stored = b.take_new_key().expect("the key to write to flash");
    assert!(stored.ct_eq(&new));
    assert!(b.take_new_key().is_none(), "handed out once");
}
