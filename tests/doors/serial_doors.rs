//! The serial driver deciding at the door, over real pseudo-terminals: the
//! hub opens the slave path with tokio-serial, the test plays the board
//! (firmware_bridge's `Board`) on the master.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use firmware_bridge::{DenyReason, Downlink, Pin, Uplink};
use lockhub::config::Policy;
use lockhub::sim::board::SimEvent;
use testkit::board::pty::Pty;
use testkit::board::*;
use testkit::db::Db;

fn denied(door: u8, locked_out: bool) -> impl Fn(&SimEvent) -> bool {
    move |e| *e == SimEvent::Denied { door, locked_out }
}

/// Distinct `Deny` commands (by seq) the board received for `door`.
fn denies(sim: &Sim, door: u8, reason: DenyReason) -> usize {
    sim.events()
        .filter_map(|e| match e {
            SimEvent::Received(Downlink::Deny {
                seq,
                door: d,
                reason: r,
            }) if *d == door && *r == reason => Some(*seq),
            _ => None,
        })
        .collect::<std::collections::BTreeSet<u16>>()
        .len()
}

/// One board with doors 101 (index 0) and 102 (index 1), three doors wired.
async fn one_board(policy: Policy) -> (Db, lockhub::drivers::serial::SerialHandle, Sim, PtyKeep) {
    board_on(Db::open_with(policy)).await
}

/// [`one_board`] on a store prepared beforehand (as an earlier run left it).
async fn board_on(db: Db) -> (Db, lockhub::drivers::serial::SerialHandle, Sim, PtyKeep) {
    let policy = db.policy;
    let pty = Pty::open();
    let s = settings(
        vec![port(
            "board-a",
            by_id(&db, "board-a", &pty),
            vec![door("101", 0), door("102", 1)],
        )],
        policy,
    );
    let hub = start(&db, s);
    let (mut sim, keep) = board(pty, 3);
    until_linked(&mut sim).await;
    (db, hub, sim, keep)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_right_pin_unlocks_a_wrong_one_denies_and_a_pin_for_another_door_denies() {
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    db.add_key("k-1", "482913", &["101"]).await;

    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 2).await);
    assert_eq!(db.audit(), ["door.granted@101", "door.unlocked@101"]);
    let key: String = db
        .reader()
        .query_row(
            "SELECT key_id FROM audit WHERE kind = 'door.unlocked'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(key, "k-1");

    sim.enter_pin(0, "111111");
    assert!(
        sim.run_until(WAIT, |s| count(s, denied(0, false)) == 1)
            .await
            .unwrap()
    );

    sim.enter_pin(1, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, denied(1, false)) == 1)
            .await
            .unwrap()
    );
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 4).await);
    assert_eq!(
        db.audit()[2..],
        ["door.denied/unknown_pin@101", "door.denied/unknown_pin@102"]
    );
    assert_eq!(count(&sim, relay_opened(1)), 0);
    assert_eq!(count(&sim, relay_opened(0)), 1);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_door_and_a_malformed_pin_are_acked_denied_and_audited() {
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    db.add_key("k-1", "482913", &["101"]).await;
    // Door index 2 is wired on the board but named by no [[door]].
    sim.enter_pin(2, "482913");
    // Too short, too long: the board sends what was typed.
    sim.enter_pin(0, "12");
    sim.enter_pin(1, "1234567890123");
    // The longest pin field a frame can carry (a one-byte seq leaves 60).
    let longest = Uplink::Keypad {
        seq: 100,
        door: 1,
        pin: Pin::from_wire_bytes(&[b'9'; 60]).unwrap(),
    };
    let longest = sim.frame_msg(&longest);
    sim.write_raw(&longest).await.unwrap();
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 4).await);
    let mut audit = db.audit();
    audit.sort();
    assert_eq!(
        audit,
        [
            "door.denied/bad_format@101",
            "door.denied/bad_format@102",
            "door.denied/bad_format@102",
            "door.denied/unknown_door@board-a:2"
        ]
    );
    assert!(
        sim.run_until(WAIT, |s| count(s, |e| {
            *e == SimEvent::Received(Downlink::Ack { seq: 100 })
        }) == 1)
            .await
            .unwrap()
    );
    assert!(
        sim.run_until(WAIT, |s| [0, 1, 2]
            .iter()
            .all(|d| count(s, denied(*d, false)) == 1))
            .await
            .unwrap()
    );
    assert!(
        sim.run_until(WAIT, |s| denies(s, 1, DenyReason::DENIED) == 2)
            .await
            .unwrap(),
        "the longest pin is denied too"
    );
    // Every Keypad was acked: nothing failed on the board's side.
    assert_eq!(sim.board().stats().uplinks_failed, 0);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grant_is_committed_before_the_unlock_is_on_the_wire() {
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    db.add_key("k-1", "482913", &["101"]).await;
    let reader = Mutex::new(db.reader());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    // Look at the audit table the moment each Unlock frame arrives.
    sim.lose_downlinks(move |m| {
        if matches!(m, Downlink::Unlock { .. }) {
            let n: i64 = reader
                .lock()
                .unwrap()
                .query_row(
                    "SELECT count(*) FROM audit WHERE kind = 'door.granted'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            seen2.lock().unwrap().push(n);
        }
        false
    });
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );
    assert_eq!(*seen.lock().unwrap(), [1]);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_copies_of_one_keypad_are_acked_thrice_decided_once_and_counted_once() {
    let policy = Policy {
        lockout_threshold: 2,
        ..Policy::default()
    };
    let (db, hub, mut sim, _keep) = one_board(policy).await;
    // A seq far from the board's own, sent three times as a resend would be.
    let keypad = Uplink::Keypad {
        seq: 40_000,
        door: 0,
        pin: Pin::from_digits("999999").unwrap(),
    };
    for _ in 0..3 {
        // Each copy a frame of its own, as a resend is (on a sealed link,
        // with a new counter; the seq inside makes it the same message).
        let frame = sim.frame_msg(&keypad);
        sim.write_raw(&frame).await.unwrap();
        sim.run_for(Duration::from_millis(30)).await.unwrap();
    }
    let acks = |s: &Sim| {
        count(s, |e| {
            *e == SimEvent::Received(Downlink::Ack { seq: 40_000 })
        })
    };
    assert!(sim.run_until(WAIT, |s| acks(s) == 3).await.unwrap());
    assert!(until_db(&mut sim, &db, |db| !db.audit().is_empty()).await);
    sim.run_for(Duration::from_millis(500)).await.unwrap();
    assert_eq!(db.audit(), ["door.denied/unknown_pin@101"]);
    assert_eq!(
        denies(&sim, 0, DenyReason::DENIED),
        1,
        "one decision, one Deny"
    );
    // Threshold 2: had the copies counted, the keypad would now be locked.
    assert_eq!(db.count("SELECT count(*) FROM lockouts"), 0);
    sim.enter_pin(0, "888888");
    assert!(
        until_db(&mut sim, &db, |db| db
            .count("SELECT count(*) FROM lockouts")
            == 1)
        .await
    );
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_ack_makes_the_hub_resend_the_unlock_and_the_board_acts_once() {
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    db.add_key("k-1", "482913", &["101"]).await;
    // The board's first Ack of an Unlock is lost on the line. Hub seqs
    // count from 1; the board acks them, so lose the Ack for the first
    // Unlock the board received.
    let first_unlock_seq = Arc::new(Mutex::new(None::<u16>));
    let lost = Arc::new(Mutex::new(false));
    let (f2, l2) = (first_unlock_seq.clone(), lost.clone());
    sim.lose_downlinks(move |m| {
        if let Downlink::Unlock { seq, .. } = m {
            f2.lock().unwrap().get_or_insert(*seq);
        }
        false
    });
    sim.lose_uplinks(move |m| {
        let target = *first_unlock_seq.lock().unwrap();
        let mut lost = l2.lock().unwrap();
        if !*lost
            && target.is_some()
            && *m
                == (Uplink::Ack {
                    seq: target.unwrap(),
                })
        {
            *lost = true;
            return true;
        }
        false
    });
    sim.enter_pin(0, "482913");
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 2).await);
    assert!(*lost.lock().unwrap(), "the first Ack was lost");
    let unlocks = count(&sim, |e| {
        matches!(e, SimEvent::Received(Downlink::Unlock { .. }))
    });
    assert!(unlocks >= 2, "the Unlock was resent ({unlocks} copies)");
    assert_eq!(count(&sim, relay_opened(0)), 1, "the board acted once");
    assert_eq!(db.audit(), ["door.granted@101", "door.unlocked@101"]);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_the_board_never_acks_is_recorded_unconfirmed() {
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    db.add_key("k-1", "482913", &["101"]).await;
    sim.lose_downlinks(|m| matches!(m, Downlink::Unlock { .. }));
    sim.enter_pin(0, "482913");
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 2).await);
    assert_eq!(
        db.audit(),
        ["door.granted@101", "door.unlock_unconfirmed@101"]
    );
    assert_eq!(count(&sim, relay_opened(0)), 0);
    assert_eq!(
        count(&sim, |e| matches!(
            e,
            SimEvent::LostDown(Downlink::Unlock { .. })
        )),
        4
    );
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_truncated_and_corrupted_frames_between_valid_ones_change_nothing() {
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    db.add_key("k-1", "482913", &["101"]).await;
    let keypad = Uplink::Keypad {
        seq: 50_000,
        door: 0,
        pin: Pin::from_digits("482913").unwrap(),
    };
    let valid = sim.frame_msg(&keypad);
    let mut corrupted = valid.to_vec();
    corrupted[3] ^= 0x40;
    let truncated = &valid[..valid.len() / 2];
    sim.write_raw(&[0xff, 0x13, 0x37, 0x00, 0x00, 0x01, 0x02])
        .await
        .unwrap();
    sim.write_raw(truncated).await.unwrap();
    sim.write_raw(&[0x00]).await.unwrap();
    sim.write_raw(&corrupted).await.unwrap();
    sim.write_raw(&[0x42; 300]).await.unwrap();
    sim.write_raw(&[0x00]).await.unwrap();
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );
    sim.write_raw(&corrupted).await.unwrap();
    // Framed now: on a sealed link an older frame would be a replay.
    let valid = sim.frame_msg(&keypad);
    sim.write_raw(&valid).await.unwrap();
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 4).await);
    sim.run_for(Duration::from_millis(300)).await.unwrap();
    // Two entries (the board's and the raw valid frame); the unlocked rows
    // of one may land after the other's grant.
    let mut audit = db.audit();
    audit.sort();
    assert_eq!(
        audit,
        [
            "door.granted@101",
            "door.granted@101",
            "door.unlocked@101",
            "door.unlocked@101"
        ]
    );
    assert!(sim.board().link_up(sim.now_ms()));
    // Dropped, and counted where `lockhub status` reads it (at most every
    // few seconds: each write costs an fsync). At least the garbage, the
    // truncated, the two corrupted and the overlong frames.
    let bad = |db: &Db| db.count("SELECT coalesce(sum(bad_frames), 0) FROM link_counters");
    assert!(
        until_db(&mut sim, &db, |db| bad(db) >= 4).await,
        "{}",
        bad(&db)
    );
    hub.shutdown().await;
    assert!(bad(&db) >= 5, "{}", bad(&db));
}

/// Door index 2 is wired on the board but named by no [[door]]: an unused
/// contact input reading open is no door forced, now or ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contact_of_an_unnamed_door_index_raises_nothing() {
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    sim.set_door(2, true);
    sim.run_for(Duration::from_millis(300)).await.unwrap();
    sim.set_door(0, true);
    assert!(until_db(&mut sim, &db, |db| db.raised("door_forced", "101")).await);
    sim.run_for(Duration::from_millis(300)).await.unwrap();
    assert_eq!(db.audit(), ["door.forced@101"]);
    assert!(!db.raised("door_forced", "board-a:2"));
    assert_eq!(
        db.count("SELECT count(*) FROM door_state WHERE door = 'board-a:2'"),
        0
    );
    hub.shutdown().await;
}

/// While storage refuses writes (here a trigger in the way, as a full disk
/// would), a forced door is not forgotten: its row
/// and alert land, in order before the door's closing, once writes go
/// through again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_door_is_recorded_once_storage_takes_writes_again() {
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    db.break_audit().await;
    sim.set_door(0, true);
    sim.run_for(Duration::from_millis(300)).await.unwrap();
    sim.set_door(0, false);
    sim.run_for(Duration::from_millis(700)).await.unwrap();
    assert!(db.audit().is_empty(), "nothing went through");
    db.mend_audit().await;
    assert!(until_db(&mut sim, &db, |db| db.audit() == ["door.forced@101"]).await);
    assert!(
        until_db(&mut sim, &db, |db| db.count(
            "SELECT count(*) FROM alerts WHERE condition = 'door_forced' AND subject = '101' AND state = 'cleared'"
        ) == 1)
        .await,
        "raised, then cleared by the closing that queued behind it"
    );
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_door_opened_without_an_unlock_is_forced_and_closing_it_clears_the_alert() {
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    sim.set_door(0, true);
    assert!(until_db(&mut sim, &db, |db| db.raised("door_forced", "101")).await);
    assert_eq!(db.audit(), ["door.forced@101"]);
    sim.set_door(0, false);
    assert!(until_db(&mut sim, &db, |db| !db.raised("door_forced", "101")).await);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_door_opened_after_an_unlock_is_not_forced_but_held_open_too_long_is() {
    let policy = Policy {
        held_open_s: 1,
        ..Policy::default()
    };
    let (db, hub, mut sim, _keep) = one_board(policy).await;
    db.add_key("k-1", "482913", &["101"]).await;
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );
    sim.set_door(0, true);
    assert!(until_db(&mut sim, &db, |db| db.raised("door_held_open", "101")).await);
    assert!(!db.raised("door_forced", "101"));
    assert_eq!(
        db.audit(),
        [
            "door.granted@101",
            "door.unlocked@101",
            "door.held_open@101"
        ]
    );
    sim.set_door(0, false);
    assert!(until_db(&mut sim, &db, |db| !db.raised("door_held_open", "101")).await);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tamper_is_audited_and_alerted_for_the_board() {
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    sim.tamper();
    assert!(until_db(&mut sim, &db, |db| db.raised("tamper", "board-a")).await);
    assert_eq!(db.audit(), ["board.tamper@board-a"]);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_keypad_denies_even_the_right_pin_alerts_once_and_leaves_other_doors_alone() {
    let policy = Policy {
        lockout_threshold: 3,
        ..Policy::default()
    };
    let (db, hub, mut sim, _keep) = one_board(policy).await;
    db.add_key("k-1", "482913", &["101", "102"]).await;
    for wrong in ["111111", "222222"] {
        sim.enter_pin(0, wrong);
    }
    assert!(
        sim.run_until(WAIT, |s| denies(s, 0, DenyReason::DENIED) == 2)
            .await
            .unwrap()
    );
    // The third denial starts the lockout and already answers "locked out".
    sim.enter_pin(0, "333333");
    assert!(
        sim.run_until(WAIT, |s| denies(s, 0, DenyReason::LOCKED_OUT) == 1)
            .await
            .unwrap()
    );
    assert!(until_db(&mut sim, &db, |db| db.raised("keypad_lockout", "101")).await);
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| denies(s, 0, DenyReason::LOCKED_OUT) == 2)
            .await
            .unwrap()
    );
    assert_eq!(
        count(&sim, denied(0, true)),
        1,
        "the board shows the lockout"
    );
    assert_eq!(count(&sim, relay_opened(0)), 0);
    // The other door still opens.
    sim.enter_pin(1, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(1)) == 1)
            .await
            .unwrap()
    );
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 6).await);
    assert_eq!(
        db.audit(),
        [
            "door.denied/unknown_pin@101",
            "door.denied/unknown_pin@101",
            "door.denied/unknown_pin@101",
            "door.locked_out@101",
            "door.granted@102",
            "door.unlocked@102",
        ]
    );
    assert_eq!(
        db.count("SELECT count(*) FROM outbox WHERE topic = 'alerts' AND CAST(body AS TEXT) LIKE '%keypad_lockout%'"),
        1,
        "one alert per episode"
    );
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_audit_row_cannot_be_written_the_door_is_denied_and_storage_failure_raised() {
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    db.add_key("k-1", "482913", &["101"]).await;
    db.break_audit().await;
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, denied(0, false)) == 1)
            .await
            .unwrap()
    );
    assert!(until_db(&mut sim, &db, |db| db.raised("storage_failure", "101")).await);
    assert_eq!(count(&sim, relay_opened(0)), 0);
    assert!(db.audit().is_empty());
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_board_without_a_configured_door_raises_board_mismatch_and_never_confirms_its_unlock() {
    let db = Db::open();
    db.add_key("k-2", "482913", &["102"]).await;
    let pty = Pty::open();
    let s = settings(
        vec![port(
            "board-a",
            by_id(&db, "board-a", &pty),
            vec![door("101", 0), door("102", 1)],
        )],
        db.policy,
    );
    let hub = start(&db, s);
    // The board says it has one door: 102 (index 1) is not on it.
    let (mut sim, _keep) = board(pty, 1);
    until_linked(&mut sim).await;
    assert!(until_db(&mut sim, &db, |db| db.raised("board_mismatch", "102")).await);
    assert!(!db.raised("board_mismatch", "101"));

    // A Keypad for index 1, written by hand (the board has no such
    // keypad): decided, granted, and the board acks the Unlock as it acks
    // every command; that Ack confirms nothing.
    let pin = Pin::from_digits("482913").unwrap();
    let frame = sim.frame_msg(&Uplink::Keypad {
        seq: 900,
        door: 1,
        pin,
    });
    sim.write_raw(&frame).await.unwrap();
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 2).await);
    assert_eq!(
        db.audit(),
        ["door.granted@102", "door.unlock_unconfirmed@102"]
    );
    assert!(
        sim.events()
            .any(|e| matches!(e, SimEvent::Received(Downlink::Unlock { door: 1, .. }))),
        "the Unlock went out and was acked"
    );

    // The board is replaced by one with three doors: its Hello covers 102.
    let io = sim.into_inner();
    let mut sim = lockhub::sim::board::SimBoard::new_sealed(
        io,
        firmware_bridge::BoardConfig::new(2, 3),
        testkit::files::board_key_for("board-a"),
    );
    assert!(until_db(&mut sim, &db, |db| !db.raised("board_mismatch", "102")).await);
    hub.shutdown().await;
}

/// The byte size of the database's content (pages in use, WAL included),
/// as SQLite counts it.
fn db_bytes(db: &Db) -> i64 {
    db.count("SELECT page_count * page_size FROM pragma_page_count, pragma_page_size")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_ten_thousand_keypads_writes_a_few_rows_and_the_right_pin_elsewhere_still_opens()
{
    let (db, hub, mut sim, _keep) = one_board(Policy::default()).await;
    db.add_key("k-2", "482913", &["102"]).await;
    // Let the Hello's bookkeeping land before measuring.
    sim.run_for(Duration::from_millis(300)).await.unwrap();
    let before = db_bytes(&db);
    let rows_before = db.count("SELECT count(*) FROM audit");

    // 10,000 distinct Keypads, half at door 101 (known), half at index 9
    // (no such door), as fast as the line takes them.
    const FLOOD: u16 = 10_000;
    const FIRST_SEQ: u16 = 1000;
    // The hub reads the line in order and acks each Keypad once it has
    // taken it, so the last one's Ack says every one was taken (and must end
    // in a row): shutting down before it would leave the tail unread, not
    // unrecorded.
    const LAST_SEQ: u16 = FIRST_SEQ + FLOOD - 1;
    let mut seq = FIRST_SEQ;
    let mut sent = 0u16;
    let mut typed = false;
    let mut opened = false;
    let mut all_acked = false;
    let absorb = |events: Vec<SimEvent>, opened: &mut bool, all_acked: &mut bool| {
        for e in events {
            match e {
                SimEvent::RelayOpened { door: 1 } => *opened = true,
                SimEvent::Received(Downlink::Ack { seq: LAST_SEQ }) => *all_acked = true,
                _ => {}
            }
        }
    };
    while sent < FLOOD {
        let mut chunk = Vec::new();
        for _ in 0..8 {
            if sent == FLOOD {
                break;
            }
            let door = if sent.is_multiple_of(2) { 0 } else { 9 };
            let pin = Pin::from_digits("111111").unwrap();
            chunk.extend_from_slice(&sim.frame_msg(&Uplink::Keypad { seq, door, pin }));
            seq = seq.wrapping_add(1).max(1);
            sent += 1;
        }
        sim.write_raw(&chunk).await.unwrap();
        sim.step().await.unwrap();
        absorb(sim.take_events(), &mut opened, &mut all_acked);
        if !typed && sent >= FLOOD / 2 {
            // A guest at door 102 in the middle of it.
            sim.enter_pin(1, "482913");
            typed = true;
        }
    }
    // The flood's own events would push the relay's out of the board's
    // bounded event log: watch for it as it happens.
    let end = tokio::time::Instant::now() + WAIT;
    while !(opened && all_acked) && tokio::time::Instant::now() < end {
        sim.step().await.unwrap();
        absorb(sim.take_events(), &mut opened, &mut all_acked);
    }
    assert!(
        opened,
        "the right PIN at another door opens during the flood"
    );
    assert!(all_acked, "the hub acks the flood's last Keypad");
    assert!(
        until_db(&mut sim, &db, |db| db
            .audit()
            .contains(&"door.unlocked@102".to_owned()))
        .await
    );
    assert!(
        until_db(&mut sim, &db, |db| db.raised("keypad_flood", "101")
            && db.raised("keypad_flood", "board-a:9"))
        .await
    );
    hub.shutdown().await;

    let grown = db_bytes(&db) - before;
    let rows = db.count("SELECT count(*) FROM audit") - rows_before;
    println!("flood of {FLOOD} keypads: {rows} audit rows, database grew by {grown} bytes");
    // Every acked Keypad ends in a row: decided ones in their own, the rest
    // counted in door.flood rows (one at the start, the rest at shutdown).
    let decided = db.count(
        "SELECT count(*) FROM audit WHERE kind <> 'door.flood' AND door IN ('101', 'board-a:9')",
    );
    let flooded = db.count("SELECT coalesce(sum(count), 0) FROM audit WHERE kind = 'door.flood'");
    assert_eq!(decided + flooded, i64::from(FLOOD));
    assert!(decided <= 16, "{decided} entries decided during the flood");
    assert!(
        db.count("SELECT count(*) FROM audit WHERE kind = 'door.flood'") <= 4,
        "one row per door per minute, and one at shutdown"
    );
    assert!(rows <= 24, "{rows} audit rows");
    assert!(
        grown <= 32 * 1024,
        "the flood grew the database by {grown} bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_storage_stalled_every_acked_keypad_ends_in_an_audit_row_even_when_the_hub_stops() {
    let policy = Policy {
        lockout_threshold: 100,
        ..Policy::default()
    };
    let (db, hub, mut sim, _keep) = one_board(policy).await;
    db.add_key("k-1", "482913", &["101"]).await;
    sim.run_for(Duration::from_millis(300)).await.unwrap();
    let rows_before = db.count("SELECT count(*) FROM audit WHERE door = '101'");
    // Another process holds SQLite's write lock: decisions wait.
    let blocker = rusqlite::Connection::open(db.dir.path().join("lockhub.db")).unwrap();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    // Six entries at door 101, 250 ms apart (just within the flood limit):
    // one in flight, four waiting behind it, the sixth finds the queue
    // full. All of it well within the 2 s a decision may take. The third
    // is the right PIN: granted once the lock goes, after the port closed.
    for i in 0..6 {
        sim.enter_pin(0, if i == 2 { "482913" } else { "111111" });
        sim.run_for(Duration::from_millis(250)).await.unwrap();
    }
    assert_eq!(
        denies(&sim, 0, DenyReason::DENIED),
        1,
        "the full queue's entry is denied at once"
    );
    // The hub stops while they wait; then the lock is released.
    let stopping = tokio::spawn(hub.shutdown());
    sim.run_for(Duration::from_millis(150)).await.unwrap();
    blocker.execute_batch("COMMIT").unwrap();
    stopping.await.unwrap();
    let rows = db.count(
        "SELECT count(*) FROM audit WHERE door = '101' AND kind IN ('door.granted', 'door.denied')",
    ) - rows_before;
    assert_eq!(rows, 6, "one row per acked entry: {:?}", db.audit());
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE door = '101' AND reason = 'storage_failure'"),
        1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE door = '101' AND kind = 'door.granted'"),
        1
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM audit WHERE door = '101' AND kind = 'door.unlock_unconfirmed'"
        ),
        1,
        "the grant that could not reach the board is on record as unconfirmed"
    );
    assert_eq!(count(&sim, relay_opened(0)), 0);
}
