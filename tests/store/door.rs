//! The door decision end to end on a real SQLite file: probe, decide,
//! audit, lockout, alerts; and the `keys` listing.

use lockhub::door::{Decision, DenyReason};
use lockhub::store::alerts::open_alerts;
use lockhub::store::door::{
    CANDIDATES_SQL, DoorEvent, clear_expired_lockouts, record_door_event, record_unlock,
};
use lockhub::store::keys;
use testkit::db::*;

fn denied(o: &lockhub::store::door::DoorOutcome) -> Option<DenyReason> {
    match &o.decision {
        Decision::Deny { reason, .. } => Some(*reason),
        _ => None,
    }
}

fn is_unlock(o: &lockhub::store::door::DoorOutcome) -> bool {
    matches!(o.decision, Decision::Unlock(_))
}

fn is_locked(o: &lockhub::store::door::DoorOutcome) -> bool {
    matches!(o.decision, Decision::LockedOut { .. })
}

fn raised(db: &Db, condition: &str, subject: &str) -> bool {
    open_alerts(&db.reader())
        .unwrap()
        .iter()
        .any(|a| a.condition == condition && a.subject == subject)
}

/// Five wrong PINs at `door` starting at second `s`, one a second.
fn five_wrong(db: &Db, door: &str, s: i64) -> Vec<lockhub::store::door::DoorOutcome> {
    (0..5).map(|i| db.enter(door, "0000", t(s + i))).collect()
}

#[test]
fn the_right_pin_unlocks_and_the_grant_is_committed_with_the_key_and_holder() {
    let db = Db::open();
    insert(&db, &[K::active("k-1", "482913", &["101"])]);
    let o = db.enter("101", "482913", t(0));
    assert!(is_unlock(&o));
    assert_eq!(o.decision.wire_deny_reason(), None);
    let r = db.reader();
    let (kind, key, check_in, holder_ref, name): (String, String, String, String, String) = r
        .query_row(
            "SELECT kind, key_id, check_in_id, holder_ref, holder_name FROM audit WHERE audit_id = ?1",
            [o.audit_id.to_string()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
        )
        .unwrap();
    assert_eq!(
        (
            kind.as_str(),
            key.as_str(),
            check_in.as_str(),
            holder_ref.as_str()
        ),
        ("door.granted", "k-1", "c-k-1", "g-k-1")
    );
    assert_eq!(name, "Guest Name", "kept locally for the operator");
    let body: String = r
        .query_row(
            "SELECT CAST(body AS TEXT) FROM outbox WHERE audit_id = ?1",
            [o.audit_id.to_string()],
            |r| r.get(0),
        )
        .unwrap();
    assert!(body.contains(r#""kind":"door.granted""#));
    assert!(!body.contains("Guest Name"), "never published: {body}");
}

#[test]
fn a_wrong_pin_is_denied_as_unknown_pin() {
    let db = Db::open();
    insert(&db, &[K::active("k-1", "482913", &["101"])]);
    let o = db.enter("101", "482914", t(0));
    assert_eq!(denied(&o), Some(DenyReason::UnknownPin));
    assert_eq!(o.decision.wire_deny_reason(), Some(1));
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE kind = 'door.denied' AND reason = 'unknown_pin' AND door = '101' AND key_id IS NULL"),
        1
    );
}

#[test]
fn a_pin_for_another_door_is_denied() {
    let db = Db::open();
    insert(&db, &[K::active("k-1", "482913", &["101", "lobby"])]);
    assert!(is_unlock(&db.enter("lobby", "482913", t(0))));
    assert_eq!(
        denied(&db.enter("102", "482913", t(0))),
        Some(DenyReason::UnknownPin)
    );
}

#[test]
fn a_pre_issued_key_opens_inside_its_window_and_not_outside() {
    let db = Db::open();
    let mut k = K::active("k-1", "482913", &["101"]);
    k.state = "pre_issued";
    k.from = t(0);
    k.until = t(100);
    insert(&db, &[k]);
    assert_eq!(
        denied(&db.enter("101", "482913", t(-1))),
        Some(DenyReason::OutsideWindow)
    );
    assert!(is_unlock(&db.enter("101", "482913", t(0))));
    assert!(is_unlock(&db.enter("101", "482913", t(99))));
    assert_eq!(
        denied(&db.enter("101", "482913", t(100))),
        Some(DenyReason::OutsideWindow),
        "valid_until itself is outside"
    );
}

#[test]
fn revoked_and_expired_keys_never_open() {
    let db = Db::open();
    let mut revoked = K::active("k-r", "111111", &["101"]);
    revoked.state = "revoked";
    let mut expired = K::active("k-e", "222222", &["101"]);
    expired.state = "expired";
    insert(&db, &[revoked, expired]);
    for pin in ["111111", "222222"] {
        assert_eq!(
            denied(&db.enter("101", pin, t(0))),
            Some(DenyReason::UnknownPin)
        );
    }
}

#[test]
fn two_live_keys_matching_under_two_pin_keys_are_ambiguous_and_alerted() {
    let db = Db::open();
    let a = K::active("k-a", "482913", &["101"]);
    let mut b = K::active("k-b", "482913", &["101"]);
    b.pin_key = 1;
    insert(&db, &[a, b]);
    let o = db.enter("101", "482913", t(0));
    assert_eq!(denied(&o), Some(DenyReason::PinAmbiguous));
    assert!(raised(&db, "pin_ambiguous", "101"));
}

#[test]
fn a_bad_format_pin_is_denied_and_counts() {
    let db = Db::open();
    insert(&db, &[K::active("k-1", "482913", &["101"])]);
    for i in 0..4 {
        let o = db.enter_raw("101", true, b"12\xff4", t(i));
        assert_eq!(denied(&o), Some(DenyReason::BadFormat));
    }
    // A fifth bad format is the fifth counting denial: it locks.
    let fifth = db.enter_raw("101", true, b"12", t(4));
    assert_eq!(fifth.decision.wire_deny_reason(), Some(2));
    assert!(is_locked(&db.enter("101", "482913", t(5))));
}

#[test]
fn an_unknown_door_is_denied_audited_and_never_locks_anything() {
    let db = Db::open();
    insert(&db, &[K::active("k-1", "482913", &["101"])]);
    for i in 0..10 {
        let o = db.enter_raw("board-a:9", false, b"0000", t(i));
        assert_eq!(denied(&o), Some(DenyReason::UnknownDoor));
        assert_eq!(o.decision.wire_deny_reason(), Some(1));
    }
    assert_eq!(db.count("SELECT count(*) FROM lockouts"), 0);
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE reason = 'unknown_door' AND door = 'board-a:9'"),
        10
    );
    assert!(is_unlock(&db.enter("101", "482913", t(11))));
}

#[test]
fn the_threshold_locks_even_a_correct_pin_and_the_lockout_ends_on_time() {
    let db = Db::open();
    insert(&db, &[K::active("k-1", "482913", &["101"])]);
    let outs = five_wrong(&db, "101", 0);
    assert!(
        outs[..4]
            .iter()
            .all(|o| o.decision.wire_deny_reason() == Some(1))
    );
    assert_eq!(
        outs[4].decision.wire_deny_reason(),
        Some(2),
        "the fifth locks"
    );
    assert!(raised(&db, "keypad_lockout", "101"));

    let locked = db.enter("101", "482913", t(10));
    assert_eq!(locked.decision, Decision::LockedOut { until: t(4 + 60) });
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE kind = 'door.locked_out'"),
        1
    );
    assert!(is_locked(&db.enter("101", "482913", t(63))));
    assert!(is_unlock(&db.enter("101", "482913", t(64))));
    assert!(
        !raised(&db, "keypad_lockout", "101"),
        "cleared by the next entry"
    );
}

#[test]
fn entries_while_locked_do_not_count_toward_the_next_lockout() {
    let db = Db::open();
    five_wrong(&db, "101", 0);
    for i in 0..20 {
        assert!(is_locked(&db.enter("101", "0000", t(5 + i))));
    }
    // Lockout ended at 64: four more wrong PINs are not enough.
    for i in 0..4 {
        assert_eq!(
            db.enter("101", "0000", t(64 + i))
                .decision
                .wire_deny_reason(),
            Some(1)
        );
    }
    assert_eq!(db.count("SELECT count(*) FROM lockouts"), 1);
}

#[test]
fn each_further_lockout_doubles_up_to_an_hour() {
    let db = Db::open();
    let mut s = 0;
    let mut lengths = Vec::new();
    for _ in 0..9 {
        let last = five_wrong(&db, "101", s).pop().unwrap();
        let Decision::Deny {
            lockout: Some(l), ..
        } = last.decision
        else {
            panic!("expected a lockout at {s}");
        };
        lengths.push((l.until.0 - l.started_at.0) / 1_000_000);
        s = (l.until.0 / 1_000_000) - testkit::db::T0;
    }
    assert_eq!(lengths, [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600]);
}

#[test]
fn a_day_without_a_lockout_resets_the_doubling() {
    let db = Db::open();
    five_wrong(&db, "101", 0); // 60 s, ends at 64
    let second = five_wrong(&db, "101", 64).pop().unwrap();
    let Decision::Deny {
        lockout: Some(l2), ..
    } = second.decision
    else {
        panic!()
    };
    assert_eq!(l2.level, 1);
    let quiet = (l2.until.0 / 1_000_000 - testkit::db::T0) + 24 * 3600;
    let third = five_wrong(&db, "101", quiet).pop().unwrap();
    let Decision::Deny {
        lockout: Some(l3), ..
    } = third.decision
    else {
        panic!()
    };
    assert_eq!(
        (l3.level, (l3.until.0 - l3.started_at.0) / 1_000_000),
        (0, 60)
    );
}

#[test]
fn a_lockout_survives_closing_and_reopening_the_database() {
    let db = Db::open();
    insert(&db, &[K::active("k-1", "482913", &["101"])]);
    five_wrong(&db, "101", 0);
    let db = db.reopen();
    assert!(is_locked(&db.enter("101", "482913", t(30))));
    assert!(is_unlock(&db.enter("101", "482913", t(64))));
}

#[test]
fn counted_denials_survive_a_restart_too() {
    let db = Db::open();
    for i in 0..4 {
        db.enter("101", "0000", t(i));
    }
    let db = db.reopen();
    assert_eq!(
        db.enter("101", "0000", t(10)).decision.wire_deny_reason(),
        Some(2)
    );
}

#[test]
fn denials_at_one_door_do_not_lock_another() {
    let db = Db::open();
    insert(&db, &[K::active("k-1", "482913", &["101", "102"])]);
    five_wrong(&db, "101", 0);
    assert!(is_locked(&db.enter("101", "482913", t(10))));
    assert!(is_unlock(&db.enter("102", "482913", t(10))));
    assert!(!raised(&db, "keypad_lockout", "102"));
}

#[test]
fn clear_expired_lockouts_ends_the_alert_when_the_lockout_ends() {
    let db = Db::open();
    five_wrong(&db, "101", 0);
    assert_eq!(db.write(|c| clear_expired_lockouts(c, t(63))), 0);
    assert!(raised(&db, "keypad_lockout", "101"));
    assert_eq!(db.write(|c| clear_expired_lockouts(c, t(64))), 1);
    assert!(!raised(&db, "keypad_lockout", "101"));
}

#[test]
fn each_lockout_episode_is_its_own_alert() {
    let db = Db::open();
    five_wrong(&db, "101", 0);
    five_wrong(&db, "101", 64);
    let bodies: Vec<String> = db
        .reader()
        .prepare("SELECT CAST(body AS TEXT) FROM outbox WHERE topic = 'alerts' ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let states: Vec<bool> = bodies.iter().map(|b| b.contains("\"raised\"")).collect();
    assert_eq!(states, [true, false, true], "raised, cleared, raised again");
}

#[test]
fn unlock_confirmations_and_door_events_are_audited() {
    let db = Db::open();
    insert(&db, &[K::active("k-1", "482913", &["101"])]);
    db.write(|c| {
        record_unlock(c, "101", "k-1", true, t(1))?;
        record_unlock(c, "101", "k-1", false, t(2))?;
        record_door_event(c, DoorEvent::Forced, "101", t(3))?;
        record_door_event(c, DoorEvent::HeldOpen, "101", t(4))?;
        record_door_event(c, DoorEvent::Tamper, "101", t(5))
    });
    assert_eq!(
        db.count(
            "SELECT count(*) FROM audit WHERE kind = 'door.unlocked' AND check_in_id = 'c-k-1'"
        ),
        1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE kind = 'door.unlock_unconfirmed'"),
        1
    );
    for cond in ["door_forced", "door_held_open", "tamper"] {
        assert!(raised(&db, cond, "101"), "{cond}");
    }
}

#[test]
fn the_probe_is_an_index_lookup_not_a_scan() {
    let db = Db::open();
    let plan: Vec<String> = db
        .reader()
        .prepare(&format!("EXPLAIN QUERY PLAN {CANDIDATES_SQL}"))
        .unwrap()
        .query_map(["101", "x", "k1"], |r| r.get::<_, String>(3))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let plan = plan.join(" | ");
    assert!(plan.contains("key_doors_one_live_per_tag"), "{plan}");
    assert!(!plan.contains("SCAN"), "{plan}");
}

#[test]
fn the_key_listing_shows_doors_and_windows_but_never_tags_or_names() {
    let db = Db::open();
    let mut revoked = K::active("k-2", "111111", &["102"]);
    revoked.state = "revoked";
    insert(
        &db,
        &[K::active("k-1", "482913", &["lobby", "101"]), revoked],
    );
    let r = db.reader();
    let list = keys::list(&r).unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0].key_id, "k-1");
    assert_eq!(list[0].doors, ["101", "lobby"]);
    assert_eq!(list[0].check_in_id.as_deref(), Some("c-k-1"));
    assert_eq!(list[1].state, "revoked");
    let counts = keys::counts(&r).unwrap();
    assert_eq!((counts.active, counts.revoked), (1, 1));

    let mut out = Vec::new();
    keys::print_keys(&r, "UTC", &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("KEY"), "{text}");
    assert!(text.contains("k-1") && text.contains("101,lobby"), "{text}");
    assert!(text.contains("2 keys: 0 pre_issued, 1 active, 1 revoked, 0 expired"));
    assert!(!text.contains("Guest Name"), "{text}");
    let tag =
        lockhub_proto::crypto::b64u_encode(&lockhub_proto::crypto::pin_tag(&[1; 32], b"482913"));
    assert!(!text.contains(&tag) && !text.contains(&tag[..8]), "{text}");
}

/// The `pin_ambiguous` alert messages queued for the cloud, oldest first.
fn pin_ambiguous_messages(db: &Db) -> Vec<serde_json::Value> {
    db.reader()
        .prepare(
            "SELECT CAST(body AS TEXT) FROM outbox WHERE topic = 'alerts'
              AND CAST(body AS TEXT) LIKE '%\"pin_ambiguous\"%' ORDER BY id",
        )
        .unwrap()
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|b| serde_json::from_str(&b.unwrap()).unwrap())
        .collect()
}

#[test]
fn pin_ambiguous_ends_when_one_of_its_keys_expires_and_the_cleared_message_matches_the_raised_one()
{
    let db = Db::open();
    let a = K::active("k-a", "482913", &["101"]);
    let mut b = K::active("k-b", "482913", &["101"]);
    b.pin_key = 1;
    b.until = t(1800);
    // A key the alert is not about.
    let c = K::active("k-c", "111111", &["101"]);
    insert(&db, &[a, b, c]);
    let o = db.enter("101", "482913", t(0));
    assert_eq!(denied(&o), Some(DenyReason::PinAmbiguous));
    db.enter("101", "482913", t(10));
    db.write(|c| {
        c.execute(
            "UPDATE keys SET state = 'revoked', revoke_reason = 'test', updated_at = ?1
              WHERE key_id = 'k-c'",
            [t(20).0],
        )?;
        Ok(())
    });
    assert!(
        raised(&db, "pin_ambiguous", "101"),
        "an unrelated key changes nothing"
    );
    // The real expiry sweep makes k-b final.
    let expired = db.write(|c| lockhub::store::sweep::expire_due(c, t(2000), true));
    assert_eq!(expired, 1);
    assert!(!raised(&db, "pin_ambiguous", "101"));
    let msgs = pin_ambiguous_messages(&db);
    assert_eq!(msgs.len(), 2, "raised once, cleared once: {msgs:?}");
    let (up, down) = (&msgs[0], &msgs[1]);
    assert_eq!(up["state"], "raised");
    assert_eq!(down["state"], "cleared");
    assert_eq!(down["alert_id"], up["alert_id"]);
    assert_eq!(down["subject"], "101");
    assert_eq!(down["count"], 2);
    assert_eq!(down["first_at"], t(0).to_rfc3339());
    assert_eq!(down["last_at"], t(2000).to_rfc3339());
    assert_eq!(
        db.count("SELECT count(*) FROM alert_keys"),
        0,
        "the ended alert forgets its keys"
    );
    // A new ambiguity later is a new alert.
    let mut d = K::active("k-d", "482913", &["101"]);
    d.pin_key = 1;
    insert(&db, &[d]);
    db.enter("101", "482913", t(2100));
    assert!(raised(&db, "pin_ambiguous", "101"));
    let msgs = pin_ambiguous_messages(&db);
    assert_ne!(msgs[2]["alert_id"], msgs[0]["alert_id"]);
    // Revoking one of them (by any path: here plain SQL) ends it too.
    db.write(|c| {
        c.execute(
            "UPDATE keys SET state = 'revoked', revoke_reason = 'test', updated_at = ?1
              WHERE key_id = 'k-a'",
            [t(2200).0],
        )?;
        Ok(())
    });
    assert!(!raised(&db, "pin_ambiguous", "101"));
    assert_eq!(pin_ambiguous_messages(&db)[3]["state"], "cleared");
}

#[test]
fn a_grant_a_crash_left_without_an_outcome_is_recorded_unconfirmed_once_at_start() {
    let db = Db::open();
    insert(
        &db,
        &[
            K::active("k-1", "482913", &["101", "102"]),
            K::active("k-2", "551234", &["101"]),
        ],
    );
    // 101/k-1 twice, the first answered; 102/k-1 answered unconfirmed;
    // 101/k-2 never answered.
    assert!(is_unlock(&db.enter("101", "482913", t(10))));
    db.write(|c| record_unlock(c, "101", "k-1", true, t(11)).map(drop));
    assert!(is_unlock(&db.enter("101", "482913", t(20))));
    assert!(is_unlock(&db.enter("102", "482913", t(21))));
    db.write(|c| record_unlock(c, "102", "k-1", false, t(22)).map(drop));
    assert!(is_unlock(&db.enter("101", "551234", t(23))));
    let settled = db.write(|c| lockhub::store::door::settle_open_grants(c, t(30)));
    assert_eq!(settled, 2, "{:?}", db.audit());
    let unconfirmed = |key: &str| {
        db.count(&format!(
            "SELECT count(*) FROM audit WHERE kind = 'door.unlock_unconfirmed' AND door = '101' AND key_id = '{key}'"
        ))
    };
    assert_eq!((unconfirmed("k-1"), unconfirmed("k-2")), (1, 1));
    // Settled: a second start finds nothing left open.
    assert_eq!(
        db.write(|c| lockhub::store::door::settle_open_grants(c, t(40))),
        0
    );
}
