//! The sealed link's rules as behaviour, both ends driven frame by frame:
//! counters and replays, handshakes that must not verify, rekey with its
//! fallback to the old key, pairing against a device in the middle, and
//! the boot counter that keeps nonces from repeating after a reboot.

use firmware_bridge::pair::{
    BoardPairPhase, BoardPairing, HubPairStep, HubPairing, HubRekey, PairError,
};
use firmware_bridge::rng::{EntropySource, RandomSource, Rng};
use firmware_bridge::seal::{DropCause, LinkKey};
use firmware_bridge::sealed::{BoardRx, BoardSeal, HubRx, HubSeal};
use firmware_bridge::{Downlink, Uplink};

mod common;
use common::{payload, rng};

/// A broken hardware source that gives the same bytes after every reset.
struct Stuck;

impl EntropySource for Stuck {
    fn fill_entropy(&mut self, out: &mut [u8]) {
        out.fill(0x5a);
    }
}

fn key(b: u8) -> LinkKey {
    LinkKey::from_bytes([b; 32])
}

/// Runs a handshake to the end; panics if it does not verify.
fn handshake(board: &mut BoardSeal, hub: &mut HubSeal, r: &mut impl RandomSource) -> BoardRx {
    let hello = hub.start_with(r).unwrap();
    let BoardRx::Send(answer) = board.on_payload(&payload(&hello), r) else {
        panic!("the board did not answer")
    };
    let HubRx::SessionStarted { confirm, .. } = hub.on_payload(&payload(&answer)) else {
        panic!("the hub did not verify the board")
    };
    board.on_payload(&payload(&confirm), r)
}

fn paired(lk: u8, r: &mut impl RandomSource) -> (BoardSeal, HubSeal) {
    let mut board = BoardSeal::new(1, key(lk));
    let mut hub = HubSeal::new(key(lk));
    assert!(matches!(
        handshake(&mut board, &mut hub, r),
        BoardRx::SessionStarted { new_key: None }
    ));
    (board, hub)
}

fn unlock(seq: u16) -> Downlink {
    Downlink::Unlock {
        seq,
        door: 0,
        ms: 3000,
    }
}

fn to_board(board: &mut BoardSeal, frame: &[u8], r: &mut impl RandomSource) -> BoardRx {
    board.on_payload(&payload(frame), r)
}

#[test]
fn a_replayed_sealed_unlock_is_dropped_as_a_replay_and_counted() {
    let mut r = rng(1);
    let (mut board, mut hub) = paired(7, &mut r);
    let f = hub.seal(&unlock(1)).unwrap();
    assert!(matches!(
        to_board(&mut board, &f, &mut r),
        BoardRx::Message(Downlink::Unlock { .. })
    ));
    for _ in 0..3 {
        assert!(matches!(
            to_board(&mut board, &f, &mut r),
            BoardRx::Dropped(DropCause::Replay)
        ));
    }
    assert_eq!(board.drops().replay, 3);
}

#[test]
fn counters_start_at_1_and_rise_by_one_per_frame_and_a_resend_gets_a_new_one() {
    let mut r = rng(2);
    let (mut board, mut hub) = paired(7, &mut r);
    let ctr = |f: &[u8]| u32::from_le_bytes(payload(f)[1..5].try_into().unwrap());
    let a = hub.seal(&unlock(1)).unwrap();
    let resend = hub.seal(&unlock(1)).unwrap();
    assert_eq!((ctr(&a), ctr(&resend)), (1, 2));
    assert_ne!(a, resend, "a resend is a new frame");
    let up = board.seal(&Uplink::Ack { seq: 1 }).unwrap();
    assert_eq!(ctr(&up), 1, "each direction counts on its own");
    // Both copies open: the seq inside makes them the same message.
    assert!(matches!(
        to_board(&mut board, &a, &mut r),
        BoardRx::Message(_)
    ));
    assert!(matches!(
        to_board(&mut board, &resend, &mut r),
        BoardRx::Message(_)
    ));
}

#[test]
fn a_frame_below_the_last_accepted_counter_is_dropped_even_if_never_seen() {
    let mut r = rng(3);
    let (mut board, mut hub) = paired(7, &mut r);
    let first = hub.seal(&Downlink::Ping { nonce: 1 }).unwrap();
    let second = hub.seal(&Downlink::Ping { nonce: 2 }).unwrap();
    assert!(matches!(
        to_board(&mut board, &second, &mut r),
        BoardRx::Message(_)
    ));
    assert!(matches!(
        to_board(&mut board, &first, &mut r),
        BoardRx::Dropped(DropCause::Replay)
    ));
}

#[test]
fn a_board_with_another_key_gets_no_session_and_the_hub_can_seal_no_unlock() {
    let mut r = rng(4);
    let mut board = BoardSeal::new(1, key(1));
    let mut hub = HubSeal::new(key(2));
    let hello = hub.start_with(&mut r).unwrap();
    let BoardRx::Send(answer) = to_board(&mut board, &hello, &mut r) else {
        panic!("no answer")
    };
    assert!(matches!(
        hub.on_payload(&payload(&answer)),
        HubRx::Dropped(DropCause::BadHandshake)
    ));
    assert!(!hub.has_session() && !board.has_session());
    assert!(hub.seal(&unlock(1)).is_err(), "no Unlock outside a session");
    assert_eq!(hub.drops().bad_handshake, 1);
}

#[test]
fn frames_sealed_under_another_boards_session_are_dropped_as_bad_tags() {
    let mut r = rng(5);
    let (mut board_a, _hub_a) = paired(1, &mut r);
    let (_board_b, mut hub_b) = paired(2, &mut r);
    let f = hub_b.seal(&unlock(1)).unwrap();
    assert!(matches!(
        to_board(&mut board_a, &f, &mut r),
        BoardRx::Dropped(DropCause::BadTag)
    ));
}

#[test]
fn a_plain_unlock_on_a_sealed_link_is_dropped_as_plain() {
    let mut r = rng(6);
    let (mut board, _hub) = paired(7, &mut r);
    let plain = firmware_bridge::to_frame(&unlock(1)).unwrap();
    assert!(matches!(
        to_board(&mut board, &plain, &mut r),
        BoardRx::Dropped(DropCause::Plain)
    ));
    assert_eq!(board.drops().plain, 1);
}

#[test]
fn a_recorded_handshake_replayed_later_starts_no_session_on_either_side() {
    let mut r = rng(7);
    let mut board = BoardSeal::new(1, key(7));
    let mut hub = HubSeal::new(key(7));
    let hello = hub.start_with(&mut r).unwrap();
    let BoardRx::Send(answer) = to_board(&mut board, &hello, &mut r) else {
        panic!()
    };
    let HubRx::SessionStarted { confirm, .. } = hub.on_payload(&payload(&answer)) else {
        panic!()
    };
    assert!(matches!(
        to_board(&mut board, &confirm, &mut r),
        BoardRx::SessionStarted { .. }
    ));
    let live = hub.seal(&Downlink::Ping { nonce: 1 }).unwrap();
    assert!(matches!(
        to_board(&mut board, &live, &mut r),
        BoardRx::Message(_)
    ));
    // The board's answer again: the hub's nonce was used up.
    assert!(matches!(
        hub.on_payload(&payload(&answer)),
        HubRx::Dropped(DropCause::BadHandshake)
    ));
    // The hub's confirm again: the board's offer was used up.
    assert!(matches!(
        to_board(&mut board, &confirm, &mut r),
        BoardRx::Dropped(DropCause::BadHandshake)
    ));
    // Neither reset the counters: the live frame is still a replay.
    assert!(matches!(
        to_board(&mut board, &live, &mut r),
        BoardRx::Dropped(DropCause::Replay)
    ));
}

#[test]
fn a_forged_seal_hello_during_a_session_keeps_the_session_until_a_confirm_verifies() {
    let mut r = rng(8);
    let (mut board, mut hub) = paired(7, &mut r);
    // Anyone can send a plain SealHello; the board answers it...
    let forged = firmware_bridge::to_frame(&Downlink::SealHello { hub_nonce: [9; 16] }).unwrap();
    assert!(matches!(
        to_board(&mut board, &forged, &mut r),
        BoardRx::Send(_)
    ));
    // ...but no one without LK can confirm it.
    let confirm = firmware_bridge::to_frame(&Downlink::SealConfirm { tag: [0; 16] }).unwrap();
    assert!(matches!(
        to_board(&mut board, &confirm, &mut r),
        BoardRx::Dropped(DropCause::BadHandshake)
    ));
    assert!(board.has_session());
    let f = hub.seal(&unlock(4)).unwrap();
    assert!(matches!(
        to_board(&mut board, &f, &mut r),
        BoardRx::Message(_)
    ));
    let up = board.seal(&Uplink::Ack { seq: 4 }).unwrap();
    assert!(matches!(hub.on_payload(&payload(&up)), HubRx::Message(_)));
}

#[test]
fn a_new_session_replaces_the_old_one_and_its_frames_no_longer_open() {
    let mut r = rng(9);
    let (mut board, mut hub) = paired(7, &mut r);
    let old = hub.seal(&unlock(1)).unwrap();
    assert!(matches!(
        handshake(&mut board, &mut hub, &mut r),
        BoardRx::SessionStarted { new_key: None }
    ));
    assert!(matches!(
        to_board(&mut board, &old, &mut r),
        BoardRx::Dropped(DropCause::BadTag)
    ));
    let new = hub.seal(&unlock(1)).unwrap();
    assert!(matches!(
        to_board(&mut board, &new, &mut r),
        BoardRx::Message(_)
    ));
}

/// Hub and board after a rekey exchange inside a session; returns the new
/// key the hub derived (if `reply_reaches_hub`).
fn rekeyed(
    board: &mut BoardSeal,
    hub: &mut HubSeal,
    r: &mut impl RandomSource,
    old: &LinkKey,
    reply_reaches_hub: bool,
) -> Option<LinkKey> {
    let rekey = HubRekey::new(r);
    let start = hub.seal(&rekey.start_msg()).unwrap();
    let BoardRx::Send(reply) = to_board(board, &start, r) else {
        panic!("no RekeyReply")
    };
    assert!(board.rekey_pending());
    if !reply_reaches_hub {
        return None;
    }
    let HubRx::Message(Uplink::RekeyReply { board_pub }) = hub.on_payload(&payload(&reply)) else {
        panic!("RekeyReply does not open")
    };
    Some(rekey.finish(&board_pub, old).unwrap())
}

#[test]
fn while_a_rekey_is_pending_the_board_answers_under_the_new_and_the_old_key_in_turn() {
    let mut r = rng(10);
    let (mut board, mut hub) = paired(7, &mut r);
    let new = rekeyed(&mut board, &mut hub, &mut r, &key(7), true).unwrap();
    let mut under_new = HubSeal::new(new.clone());
    let mut under_old = HubSeal::new(key(7));
    let mut verified = Vec::new();
    for _ in 0..4 {
        let hello = under_old.start_with(&mut r).unwrap();
        under_new
            .start(payload(&hello)[1..17].try_into().unwrap())
            .unwrap();
        let BoardRx::Send(answer) = to_board(&mut board, &hello, &mut r) else {
            panic!()
        };
        let p = payload(&answer);
        let new_ok = matches!(under_new.on_payload(&p), HubRx::SessionStarted { .. });
        let old_ok = matches!(under_old.on_payload(&p), HubRx::SessionStarted { .. });
        assert!(new_ok != old_ok, "each answer is under exactly one key");
        verified.push(if new_ok { "new" } else { "old" });
    }
    assert_eq!(verified, ["new", "old", "new", "old"]);
    assert!(board.rekey_pending(), "nothing confirmed yet");
    assert!(board.has_session(), "the old session still holds");
}

#[test]
fn a_session_under_the_new_key_makes_it_the_link_key_to_store() {
    let mut r = rng(11);
    let (mut board, mut hub) = paired(7, &mut r);
    let new = rekeyed(&mut board, &mut hub, &mut r, &key(7), true).unwrap();
    let mut hub = HubSeal::new(new.clone());
    match handshake(&mut board, &mut hub, &mut r) {
        BoardRx::SessionStarted { new_key: Some(k) } => assert!(k.ct_eq(&new)),
        other => panic!("{other:?}"),
    }
    assert!(!board.rekey_pending());
    assert!(board.key().ct_eq(&new));
    // The old key no longer gets a session.
    let mut old_hub = HubSeal::new(key(7));
    let hello = old_hub.start_with(&mut r).unwrap();
    let BoardRx::Send(answer) = to_board(&mut board, &hello, &mut r) else {
        panic!()
    };
    assert!(matches!(
        old_hub.on_payload(&payload(&answer)),
        HubRx::Dropped(DropCause::BadHandshake)
    ));
}

#[test]
fn rekey_survives_a_link_dropped_between_the_reply_and_the_proof() {
    let mut r = rng(12);
    // The reply never reached the hub: it still holds only the old key.
    let (mut board, mut hub) = paired(7, &mut r);
    rekeyed(&mut board, &mut hub, &mut r, &key(7), false);
    let mut hub = HubSeal::new(key(7));
    // First answer is under the new key: the hub cannot verify it and asks
    // again; the second is under the old key and verifies.
    let hello = hub.start_with(&mut r).unwrap();
    let BoardRx::Send(answer) = to_board(&mut board, &hello, &mut r) else {
        panic!()
    };
    assert!(matches!(
        hub.on_payload(&payload(&answer)),
        HubRx::Dropped(DropCause::BadHandshake)
    ));
    assert!(matches!(
        handshake(&mut board, &mut hub, &mut r),
        BoardRx::SessionStarted { new_key: None }
    ));
    assert!(!board.rekey_pending(), "the unproven key is dropped");
    assert!(board.key().ct_eq(&key(7)));

    // The reply reached the hub but the link dropped before its proof:
    // the hub proves the new key on its next try, whichever answer comes.
    let new = rekeyed(&mut board, &mut hub, &mut r, &key(7), true).unwrap();
    let stray = firmware_bridge::to_frame(&Downlink::SealHello { hub_nonce: [1; 16] }).unwrap();
    assert!(matches!(
        to_board(&mut board, &stray, &mut r),
        BoardRx::Send(_)
    ));
    let mut hub = HubSeal::new(new.clone());
    let mut started = None;
    for _ in 0..2 {
        let hello = hub.start_with(&mut r).unwrap();
        let BoardRx::Send(answer) = to_board(&mut board, &hello, &mut r) else {
            panic!()
        };
        if let HubRx::SessionStarted { confirm, .. } = hub.on_payload(&payload(&answer)) {
            started = Some(to_board(&mut board, &confirm, &mut r));
            break;
        }
    }
    match started {
        Some(BoardRx::SessionStarted { new_key: Some(k) }) => assert!(k.ct_eq(&new)),
        other => panic!("{other:?}"),
    }
}

/// Pairing's messages between two parties, with fresh keys.
fn start_pairing(r: &mut impl RandomSource) -> HubPairing {
    HubPairing::new(r, 0)
}

#[test]
fn a_device_in_the_middle_answering_the_commit_with_its_own_keys_gets_a_different_code() {
    let mut r = rng(13);
    let mut hub = start_pairing(&mut r);
    let mut board = BoardPairing::new();
    // The device in the middle plays board to the hub and hub to the board.
    let mut mitm_as_board = BoardPairing::new();
    let mut mitm_as_hub = start_pairing(&mut r);

    let reply_to_hub = mitm_as_board.on_msg(&hub.start_msg(), &mut r).unwrap();
    let reply_to_mitm = board.on_msg(&mitm_as_hub.start_msg(), &mut r).unwrap();
    let HubPairStep::Reveal(reveal, hub_code) = hub.on_msg(&reply_to_hub, 1).unwrap() else {
        panic!()
    };
    let HubPairStep::Reveal(mitm_reveal, mitm_code) =
        mitm_as_hub.on_msg(&reply_to_mitm, 1).unwrap()
    else {
        panic!()
    };
    assert!(mitm_as_board.on_msg(&reveal, &mut r).is_none());
    assert!(board.on_msg(&mitm_reveal, &mut r).is_none());
    assert_eq!(board.phase(), BoardPairPhase::AwaitCode);
    assert_ne!(
        hub_code.digits(),
        mitm_code.digits(),
        "the two halves disagree"
    );

    // The installer types the code the hub shows: the board refuses it and
    // stores no key.
    let (done, stored) = board.enter_code(hub_code.digits()).unwrap();
    assert_eq!(done, Uplink::PairDone { ok: false });
    assert!(stored.is_none());
    assert_eq!(
        board.phase(),
        BoardPairPhase::Failed(PairError::CodeMismatch)
    );
    // Relayed to the hub, the refusal ends the command without a key.
    assert_eq!(hub.on_msg(&done, 2).unwrap_err(), PairError::Refused);
}

#[test]
fn a_device_in_the_middle_that_relays_the_commit_cannot_reveal_its_own_key() {
    let mut r = rng(14);
    let hub = start_pairing(&mut r);
    let mut board = BoardPairing::new();
    // It passes the hub's commit on, then must reveal a key of its own
    // (it has not the hub's private key): that key does not match.
    board.on_msg(&hub.start_msg(), &mut r).unwrap();
    let mut mitm_hub = start_pairing(&mut r);
    let HubPairStep::Reveal(its_reveal, _) = mitm_hub
        .on_msg(&Uplink::PairReply { board_pub: [9; 32] }, 0)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(
        board.on_msg(&its_reveal, &mut r),
        Some(Uplink::PairDone { ok: false })
    );
    assert_eq!(
        board.phase(),
        BoardPairPhase::Failed(PairError::CommitMismatch)
    );
    assert!(board.enter_code(b"000000").is_none(), "no code is awaited");
}

#[test]
fn honest_pairing_gives_both_sides_the_same_key_and_code() {
    let mut r = rng(15);
    let mut hub = start_pairing(&mut r);
    let mut board = BoardPairing::new();
    let reply = board.on_msg(&hub.start_msg(), &mut r).unwrap();
    let HubPairStep::Reveal(reveal, code) = hub.on_msg(&reply, 5).unwrap() else {
        panic!()
    };
    assert!(
        matches!(hub.on_msg(&reply, 6), Ok(HubPairStep::Ignored)),
        "a second reply changes nothing"
    );
    assert!(board.on_msg(&reveal, &mut r).is_none());
    let (done, stored) = board.enter_code(code.digits()).unwrap();
    let HubPairStep::Paired(lk) = hub.on_msg(&done, 7).unwrap() else {
        panic!()
    };
    assert!(lk.ct_eq(&stored.unwrap()));
}

#[test]
fn a_low_order_public_key_is_refused_at_both_ends() {
    let mut r = rng(16);
    let mut hub = start_pairing(&mut r);
    assert_eq!(
        hub.on_msg(&Uplink::PairReply { board_pub: [0; 32] }, 0)
            .unwrap_err(),
        PairError::LowOrderKey
    );
    // A board whose hub reveals the zero point (committed to honestly).
    let mut board = BoardPairing::new();
    let commit = firmware_bridge::pair::commit(&[0; 32]);
    board
        .on_msg(&Downlink::PairStart { commit }, &mut r)
        .unwrap();
    assert_eq!(
        board.on_msg(&Downlink::PairReveal { hub_pub: [0; 32] }, &mut r),
        Some(Uplink::PairDone { ok: false })
    );
    assert_eq!(
        board.phase(),
        BoardPairPhase::Failed(PairError::LowOrderKey)
    );
}

#[test]
fn the_hub_gives_up_after_10_s_without_a_reply_and_60_s_without_the_code() {
    let mut r = rng(17);
    let mut hub = HubPairing::new(&mut r, 1000);
    assert_eq!(hub.poll(10_999), Ok(()));
    assert_eq!(hub.poll(11_000), Err(PairError::Timeout));
    let mut board = BoardPairing::new();
    let reply = board.on_msg(&hub.start_msg(), &mut r).unwrap();
    hub.on_msg(&reply, 5_000).unwrap();
    assert_eq!(hub.poll(64_999), Ok(()));
    assert_eq!(hub.poll(65_000), Err(PairError::Timeout));
}

#[test]
fn nonces_never_repeat_across_reboots_even_when_the_hardware_source_repeats() {
    let mut seen = std::collections::HashSet::new();
    for boot in 1..=20u32 {
        let mut r = Rng::new(Stuck, boot);
        for _ in 0..50 {
            let mut n = [0u8; 16];
            r.fill_bytes(&mut n);
            assert!(seen.insert(n), "boot {boot} repeated a nonce");
        }
    }
    assert_eq!(seen.len(), 1000);
}

#[test]
fn the_same_boot_counter_with_a_stuck_source_repeats_which_is_why_it_is_raised_every_boot() {
    let draw = |boot| {
        let mut r = Rng::new(Stuck, boot);
        let mut n = [0u8; 16];
        r.fill_bytes(&mut n);
        n
    };
    assert_eq!(draw(5), draw(5));
    assert_ne!(draw(5), draw(6));
}

#[test]
fn a_board_answering_the_same_seal_hello_after_a_reboot_uses_a_new_nonce() {
    let hello = firmware_bridge::to_frame(&Downlink::SealHello { hub_nonce: [4; 16] }).unwrap();
    let answer = |boot| {
        let mut board = BoardSeal::new(1, key(7));
        let mut r = Rng::new(Stuck, boot);
        let BoardRx::Send(f) = to_board(&mut board, &hello, &mut r) else {
            panic!()
        };
        f
    };
    assert_ne!(answer(1), answer(2));
}

#[test]
fn a_seal_hello_resent_across_the_answer_still_gets_a_session() {
    let mut r = rng(18);
    let mut board = BoardSeal::new(1, key(7));
    let mut hub = HubSeal::new(key(7));
    let hello = hub.start_with(&mut r).unwrap();
    let BoardRx::Send(first) = to_board(&mut board, &hello, &mut r) else {
        panic!()
    };
    // The hub resent its SealHello before the first answer arrived.
    let BoardRx::Send(second) = to_board(&mut board, &hello, &mut r) else {
        panic!()
    };
    assert_eq!(first, second, "the same question gets the same answer");
    let HubRx::SessionStarted { confirm, .. } = hub.on_payload(&payload(&first)) else {
        panic!()
    };
    assert!(matches!(
        to_board(&mut board, &confirm, &mut r),
        BoardRx::SessionStarted { .. }
    ));
    // Once confirmed, the same SealHello gets a fresh nonce: no second
    // session under the same keys.
    let BoardRx::Send(third) = to_board(&mut board, &hello, &mut r) else {
        panic!()
    };
    assert_ne!(third, first);
}

#[test]
fn a_resent_pair_start_gets_the_same_key_so_either_reply_pairs() {
    let mut r = rng(19);
    let mut hub = start_pairing(&mut r);
    let mut board = BoardPairing::new();
    let first = board.on_msg(&hub.start_msg(), &mut r).unwrap();
    let again = board.on_msg(&hub.start_msg(), &mut r).unwrap();
    assert_eq!(first, again);
    let HubPairStep::Reveal(reveal, code) = hub.on_msg(&again, 1).unwrap() else {
        panic!()
    };
    board.on_msg(&reveal, &mut r);
    let (done, stored) = board.enter_code(code.digits()).unwrap();
    assert_eq!(done, Uplink::PairDone { ok: true });
    assert!(stored.is_some());
}
