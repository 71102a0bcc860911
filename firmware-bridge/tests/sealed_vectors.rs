//! The sealed link against the project's vectors, `spec/vectors/serial-sealed.json`
//! (made independently with Python's `cryptography`): the handshake, sealed
//! frames both ways, frames that must be dropped, pairing and rekey. Every
//! byte the crate produces must equal the vector's, and every frame the
//! vectors say must be dropped is dropped, with its cause.

use std::collections::VecDeque;

use firmware_bridge::frame::{MAX_PAYLOAD, decode_payload, to_frame};
use firmware_bridge::pair::{
    BoardPairPhase, BoardPairing, HubPairStep, HubPairing, HubRekey, KeyPair, commit, pairing_key,
    rekey_key,
};
use firmware_bridge::rng::RandomSource;
use firmware_bridge::seal::{
    DropCause, LinkKey, SessionKeys, board_tag, hub_tag, verify_board_tag, verify_hub_tag,
};
use firmware_bridge::sealed::{BoardRx, BoardSeal, HubRx, HubSeal};
use firmware_bridge::{Downlink, Uplink};
use serde_json::Value;

mod common;
use common::payload;

fn vectors() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../spec/vectors/serial-sealed.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    serde_json::from_str(&text).expect("valid JSON")
}

fn hex(v: &Value) -> Vec<u8> {
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("not a hex string: {v}"));
    assert!(s.len().is_multiple_of(2), "odd hex {s:?}");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn hex_n<const N: usize>(v: &Value) -> [u8; N] {
    hex(v)
        .try_into()
        .unwrap_or_else(|b: Vec<u8>| panic!("expected {N} bytes, got {}", b.len()))
}

/// Hands out exactly the bytes it was given, so a state machine that draws
/// a nonce or a private key draws the vector's.
struct Scripted(VecDeque<u8>);

impl Scripted {
    fn new(parts: &[&[u8]]) -> Self {
        Self(parts.iter().flat_map(|p| p.iter().copied()).collect())
    }
}

impl RandomSource for Scripted {
    fn fill_bytes(&mut self, out: &mut [u8]) {
        for b in out {
            *b = self.0.pop_front().expect("the test scripted enough bytes");
        }
    }
}

/// Board and hub after the vector's handshake, driven through the state
/// machines with the vector's nonces.
fn handshaken(v: &Value) -> (BoardSeal, HubSeal) {
    let h = &v["handshake"];
    let lk = LinkKey::from_bytes(hex_n(&h["lk_hex"]));
    let board_id = u8::try_from(h["board_id"].as_u64().unwrap()).unwrap();
    let hub_nonce: [u8; 16] = hex_n(&h["hub_nonce_hex"]);
    let board_nonce: [u8; 16] = hex_n(&h["board_nonce_hex"]);
    let msgs = h["messages"].as_array().unwrap();

    let mut hub = HubSeal::new(lk.clone());
    let mut board = BoardSeal::new(board_id, lk);

    let hello = hub.start(hub_nonce).unwrap();
    assert_eq!(hello.as_slice(), hex(&msgs[0]["wire_hex"]), "hub SealHello");
    assert_eq!(payload(&hello), hex(&msgs[0]["payload_hex"]));

    let mut rng = Scripted::new(&[&board_nonce]);
    let answer = match board.on_payload(&payload(&hello), &mut rng) {
        BoardRx::Send(f) => f,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        answer.as_slice(),
        hex(&msgs[1]["wire_hex"]),
        "board SealHello"
    );
    assert_eq!(payload(&answer), hex(&msgs[1]["payload_hex"]));

    let confirm = match hub.on_payload(&payload(&answer)) {
        HubRx::SessionStarted {
            board_id: id,
            confirm,
        } => {
            assert_eq!(id, board_id);
            confirm
        }
        other => panic!("{other:?}"),
    };
    assert_eq!(confirm.as_slice(), hex(&msgs[2]["wire_hex"]), "SealConfirm");
    assert_eq!(payload(&confirm), hex(&msgs[2]["payload_hex"]));

    match board.on_payload(&payload(&confirm), &mut Scripted::new(&[])) {
        BoardRx::SessionStarted { new_key: None } => {}
        other => panic!("{other:?}"),
    }
    assert!(board.has_session() && hub.has_session());
    (board, hub)
}

#[test]
fn handshake_tags_and_session_keys_equal_the_vectors() {
    let v = vectors();
    let h = &v["handshake"];
    let lk = LinkKey::from_bytes(hex_n(&h["lk_hex"]));
    let board_id = u8::try_from(h["board_id"].as_u64().unwrap()).unwrap();
    let hub_nonce = hex_n(&h["hub_nonce_hex"]);
    let board_nonce = hex_n(&h["board_nonce_hex"]);
    let btag = board_tag(&lk, &hub_nonce, &board_nonce, board_id);
    let htag = hub_tag(&lk, &hub_nonce, &board_nonce);
    assert_eq!(btag.to_vec(), hex(&h["board_tag_hex"]));
    assert_eq!(htag.to_vec(), hex(&h["hub_tag_hex"]));
    assert!(verify_board_tag(
        &lk,
        &hub_nonce,
        &board_nonce,
        board_id,
        &btag
    ));
    assert!(verify_hub_tag(&lk, &hub_nonce, &board_nonce, &htag));
    assert!(
        !verify_board_tag(&lk, &hub_nonce, &board_nonce, board_id ^ 1, &btag),
        "the board id is bound into the tag"
    );
    let keys = SessionKeys::derive(&lk, &hub_nonce, &board_nonce);
    assert_eq!(
        keys.board_to_hub().to_vec(),
        hex(&h["board_to_hub_key_hex"])
    );
    assert_eq!(
        keys.hub_to_board().to_vec(),
        hex(&h["hub_to_board_key_hex"])
    );
}

#[test]
fn handshake_messages_are_the_vectors_bytes_through_both_state_machines() {
    let _ = handshaken(&vectors());
}

#[test]
fn every_sealed_frame_equals_its_vector_and_opens_at_the_other_end() {
    let v = vectors();
    let (mut board, mut hub) = handshaken(&v);
    let frames = v["frames"].as_array().unwrap();
    assert_eq!(frames.len(), 6);
    for (i, f) in frames.iter().enumerate() {
        let what = f["message"].as_str().unwrap();
        let message = hex(&f["message_hex"]);
        let wire = hex(&f["wire_hex"]);
        assert_eq!(payload(&wire), hex(&f["payload_hex"]), "{what}");
        let ctr = u32::try_from(f["ctr"].as_u64().unwrap()).unwrap();
        assert_eq!(&payload(&wire)[1..5], ctr.to_le_bytes(), "{what}");
        match f["dir"].as_str().unwrap() {
            "board->hub" => {
                let msg: Uplink = decode_payload(&message).unwrap();
                let sealed = board.seal(&msg).unwrap();
                assert_eq!(sealed.as_slice(), wire, "frame {i}: {what}");
                match hub.on_payload(&payload(&wire)) {
                    HubRx::Message(got) => assert_eq!(got, msg, "{what}"),
                    other => panic!("{what}: {other:?}"),
                }
            }
            "hub->board" => {
                let msg: Downlink = decode_payload(&message).unwrap();
                let sealed = hub.seal(&msg).unwrap();
                assert_eq!(sealed.as_slice(), wire, "frame {i}: {what}");
                match board.on_payload(&payload(&wire), &mut Scripted::new(&[])) {
                    BoardRx::Message(got) => assert_eq!(got, msg, "{what}"),
                    other => panic!("{what}: {other:?}"),
                }
            }
            d => panic!("direction {d}"),
        }
    }
    assert_eq!(board.drops().total() + hub.drops().total(), 0);
}

/// The cause a must-drop vector should be dropped for, read from its `why`.
fn expected_cause(why: &str) -> DropCause {
    if why.contains("plain") {
        DropCause::Plain
    } else if why.contains("not above the last accepted") {
        DropCause::Replay
    } else {
        // A flipped bit, another direction's key or nonce byte: the tag.
        DropCause::BadTag
    }
}

#[test]
fn every_frame_that_must_be_dropped_is_dropped_and_counted_by_cause() {
    let v = vectors();
    let (mut board, mut hub) = handshaken(&v);
    // The session as the vectors leave it: every frame sent and accepted.
    for f in v["frames"].as_array().unwrap() {
        let message = hex(&f["message_hex"]);
        match f["dir"].as_str().unwrap() {
            "board->hub" => {
                let sealed = board.seal(&decode_payload::<Uplink>(&message).unwrap());
                let p = payload(&sealed.unwrap());
                assert!(matches!(hub.on_payload(&p), HubRx::Message(_)));
            }
            _ => {
                let sealed = hub.seal(&decode_payload::<Downlink>(&message).unwrap());
                let p = payload(&sealed.unwrap());
                assert!(matches!(
                    board.on_payload(&p, &mut Scripted::new(&[])),
                    BoardRx::Message(_)
                ));
            }
        }
    }
    let drops = v["must_drop_after_frames"].as_array().unwrap();
    assert_eq!(drops.len(), 5);
    for d in drops {
        let why = d["why"].as_str().unwrap();
        assert_eq!(d["dir"].as_str(), Some("hub->board"), "{why}");
        let wire = hex(&d["wire_hex"]);
        let p = payload(&wire);
        assert_eq!(p, hex(&d["payload_hex"]), "{why}");
        let before = board.drops().total();
        match board.on_payload(&p, &mut Scripted::new(&[])) {
            BoardRx::Dropped(cause) => assert_eq!(cause, expected_cause(why), "{why}"),
            other => panic!("{why}: not dropped: {other:?}"),
        }
        assert_eq!(board.drops().total(), before + 1, "{why}: counted");
    }
    let s = board.drops();
    assert_eq!((s.bad_tag, s.replay, s.plain), (3, 1, 1));
    assert!(board.has_session(), "the drops end no session");
    // The session still works after the attempts: the hub's next frame
    // (ctr 3) opens.
    let next = hub.seal(&Downlink::Ping { nonce: 9 }).unwrap();
    match board.on_payload(&payload(&next), &mut Scripted::new(&[])) {
        BoardRx::Message(Downlink::Ping { nonce: 9 }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn pairing_keys_commit_secret_link_key_and_code_equal_the_vectors() {
    let v = vectors();
    let p = &v["pairing"];
    let hub = KeyPair::from_secret_bytes(hex_n(&p["hub_private_hex"]));
    let board = KeyPair::from_secret_bytes(hex_n(&p["board_private_hex"]));
    assert_eq!(hub.public().to_vec(), hex(&p["hub_pub_hex"]));
    assert_eq!(board.public().to_vec(), hex(&p["board_pub_hex"]));
    assert_eq!(commit(&hub.public()).to_vec(), hex(&p["commit_hex"]));
    let z = hub.agree(&board.public()).unwrap();
    assert_eq!(z.as_bytes().to_vec(), hex(&p["z_hex"]));
    assert_eq!(board.agree(&hub.public()).unwrap().as_bytes(), z.as_bytes());
    let (lk, code) = pairing_key(&z, &hub.public(), &board.public());
    assert_eq!(lk.as_bytes().to_vec(), hex(&p["lk_hex"]));
    assert_eq!(
        code.digits().as_slice(),
        p["code"].as_str().unwrap().as_bytes()
    );
}

fn postcard_of(msg: &impl serde::Serialize) -> Vec<u8> {
    let mut buf = [0u8; MAX_PAYLOAD];
    postcard::to_slice(msg, &mut buf).unwrap().to_vec()
}

#[test]
fn pairing_messages_equal_the_vectors_through_both_state_machines() {
    let v = vectors();
    let p = &v["pairing"];
    let msgs = p["messages"].as_array().unwrap();
    let code = p["code"].as_str().unwrap();
    let mut hub =
        HubPairing::with_keys(KeyPair::from_secret_bytes(hex_n(&p["hub_private_hex"])), 0);
    let mut board = BoardPairing::new();
    let board_private: [u8; 32] = hex_n(&p["board_private_hex"]);
    let mut board_rng = Scripted::new(&[&board_private]);

    let start = hub.start_msg();
    assert_eq!(
        postcard_of(&start),
        hex(&msgs[0]["payload_hex"]),
        "PairStart"
    );
    let reply = board.on_msg(&start, &mut board_rng).expect("PairReply");
    assert_eq!(
        postcard_of(&reply),
        hex(&msgs[1]["payload_hex"]),
        "PairReply"
    );

    let (reveal, shown) = match hub.on_msg(&reply, 100).unwrap() {
        HubPairStep::Reveal(reveal, shown) => (reveal, shown),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        postcard_of(&reveal),
        hex(&msgs[2]["payload_hex"]),
        "PairReveal"
    );
    assert_eq!(shown.digits().as_slice(), code.as_bytes(), "the code shown");
    assert!(
        board.on_msg(&reveal, &mut board_rng).is_none(),
        "no reply yet"
    );
    assert_eq!(board.phase(), BoardPairPhase::AwaitCode);

    let (done, stored) = board.enter_code(code.as_bytes()).unwrap();
    assert_eq!(postcard_of(&done), hex(&msgs[3]["payload_hex"]), "PairDone");
    let stored = stored.expect("the board stores the key");
    assert_eq!(stored.as_bytes().to_vec(), hex(&p["lk_hex"]));
    match hub.on_msg(&done, 200).unwrap() {
        HubPairStep::Paired(lk) => assert!(lk.ct_eq(&stored)),
        other => panic!("{other:?}"),
    }
    // And both frame as plain messages.
    assert!(to_frame(&start).is_ok() && to_frame(&reply).is_ok());
}

#[test]
fn rekey_inside_the_vector_session_gives_the_vector_key_and_messages() {
    let v = vectors();
    let r = &v["rekey"];
    let old = LinkKey::from_bytes(hex_n(&r["old_lk_hex"]));
    let msgs = r["messages (sealed inside the session)"]
        .as_array()
        .unwrap();
    let hub_keys = KeyPair::from_secret_bytes(hex_n(&r["hub_private_hex"]));
    assert_eq!(hub_keys.public().to_vec(), hex(&r["hub_pub_hex"]));
    let rekey = HubRekey::with_keys(hub_keys);
    let start = rekey.start_msg();
    assert_eq!(
        postcard_of(&start),
        hex(&msgs[0]["message_hex"]),
        "RekeyStart"
    );

    // Pure derivation first.
    let board_keys = KeyPair::from_secret_bytes(hex_n(&r["board_private_hex"]));
    assert_eq!(board_keys.public().to_vec(), hex(&r["board_pub_hex"]));
    let z = board_keys.agree(&hex_n(&r["hub_pub_hex"])).unwrap();
    assert_eq!(z.as_bytes().to_vec(), hex(&r["z_hex"]));
    assert_eq!(
        rekey_key(&z, &old).as_bytes().to_vec(),
        hex(&r["new_lk_hex"])
    );

    // Then through a session under the old key.
    let mut hub = HubSeal::new(old.clone());
    let mut board = BoardSeal::new(1, old.clone());
    let mut board_rng = Scripted::new(&[&[7u8; 16], &hex(&r["board_private_hex"])]);
    let hello = hub.start([3; 16]).unwrap();
    let BoardRx::Send(answer) = board.on_payload(&payload(&hello), &mut board_rng) else {
        panic!("no answer")
    };
    let HubRx::SessionStarted { confirm, .. } = hub.on_payload(&payload(&answer)) else {
        panic!("no session")
    };
    board.on_payload(&payload(&confirm), &mut board_rng);
    let sealed = hub.seal(&start).unwrap();
    let BoardRx::Send(reply) = board.on_payload(&payload(&sealed), &mut board_rng) else {
        panic!("no RekeyReply")
    };
    assert!(board.rekey_pending());
    let HubRx::Message(reply) = hub.on_payload(&payload(&reply)) else {
        panic!("RekeyReply does not open")
    };
    assert_eq!(
        postcard_of(&reply),
        hex(&msgs[1]["message_hex"]),
        "RekeyReply"
    );
    let Uplink::RekeyReply { board_pub } = reply else {
        panic!("{reply:?}")
    };
    let new = rekey.finish(&board_pub, &old).unwrap();
    assert_eq!(new.as_bytes().to_vec(), hex(&r["new_lk_hex"]));
}

#[test]
fn a_flipped_frame_ahead_of_the_window_is_dropped_and_does_not_move_it() {
    let v = vectors();
    let (mut board, _hub) = handshaken(&v);
    let frames = v["frames"].as_array().unwrap();
    let down: Vec<&Value> = frames
        .iter()
        .filter(|f| f["dir"].as_str() == Some("hub->board"))
        .collect();
    let flipped = &v["must_drop_after_frames"][0];
    // Only the Ack (ctr 1) so far: the flipped Unlock's ctr 2 is new.
    let ack = payload(&hex(&down[0]["wire_hex"]));
    assert!(matches!(
        board.on_payload(&ack, &mut Scripted::new(&[])),
        BoardRx::Message(Downlink::Ack { seq: 1 })
    ));
    let bad = payload(&hex(&flipped["wire_hex"]));
    assert!(matches!(
        board.on_payload(&bad, &mut Scripted::new(&[])),
        BoardRx::Dropped(DropCause::BadTag)
    ));
    // The genuine Unlock with the same ctr still opens.
    let unlock = payload(&hex(&down[1]["wire_hex"]));
    match board.on_payload(&unlock, &mut Scripted::new(&[])) {
        BoardRx::Message(Downlink::Unlock { seq, door, ms }) => {
            assert_eq!((seq, door, ms), (1, 0, 5000))
        }
        other => panic!("{other:?}"),
    }
}
