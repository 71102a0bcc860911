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
fn revoked_and_expired_keys_never_open_and_an_expired_one_is_told_outside_window() {
    let db = Db::open();
    let mut revoked = K::active("k-r", "111111", &["101"]);
    revoked.state = "revoked";
    let mut expired = K::active("k-e", "222222", &["101"]);
    expired.state = "expired";
    insert(&db, &[revoked, expired]);
    // mqtt.md 'At the door': with no live key for the PIN, an ended key
    // explains the denial; a revoked one says nothing.
    for (pin, reason) in [
        ("111111", DenyReason::UnknownPin),
        ("222222", DenyReason::OutsideWindow),
    ] {
        assert_eq!(denied(&db.enter("101", pin, t(0))), Some(reason), "{pin}");
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

/// A later version of `key_id` with `max_uses` and a schedule (the wire's
/// JSON), as a grant would write it.
fn regrant_key(
    db: &Db,
    key_id: &'static str,
    max_uses: Option<u32>,
    schedule: Option<&'static str>,
) {
    db.write(move |c| Ok(regrant(c, key_id, max_uses, schedule)?));
}

fn key_state(db: &Db, key_id: &str) -> (String, i64) {
    db.reader()
        .query_row(
            "SELECT state, use_count FROM keys WHERE key_id = ?1",
            [key_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
}

#[test]
fn a_two_use_key_opens_twice_then_is_denied_used_up_with_key_used_up_audited_once() {
    let db = Db::open();
    insert(&db, &[K::active("k-1", "482913", &["101"])]);
    regrant_key(&db, "k-1", Some(2), None);
    let first = db.enter("101", "482913", t(0));
    assert!(is_unlock(&first));
    assert_eq!(key_state(&db, "k-1"), ("active".to_owned(), 1));
    assert!(is_unlock(&db.enter("101", "482913", t(1))));
    assert_eq!(key_state(&db, "k-1"), ("used_up".to_owned(), 2));
    // Denied, and never counted: more than the threshold of tries locks nothing.
    for s in 2..10 {
        let o = db.enter("101", "482913", t(s));
        assert_eq!(denied(&o), Some(DenyReason::UsedUp), "at {s}");
        assert_eq!(o.decision.wire_deny_reason(), Some(1));
    }
    assert!(!raised(&db, "keypad_lockout", "101"));
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE kind = 'door.granted' AND key_id = 'k-1'"),
        2
    );
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE kind = 'key.used_up' AND key_id = 'k-1' AND check_in_id = 'c-k-1'"),
        1
    );
    // The cloud hears it: the audit row is on the outbox, without the name.
    let body: String = db
        .reader()
        .query_row(
            "SELECT CAST(o.body AS TEXT) FROM outbox o JOIN audit a ON a.audit_id = o.audit_id
              WHERE a.kind = 'key.used_up'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(body.contains(r#""kind":"key.used_up""#) && body.contains(r#""key_id":"k-1""#));
    assert!(!body.contains("Guest Name"), "{body}");
    // The use is taken in the grant's own transaction: one row each.
    assert_eq!(
        db.count("SELECT use_count FROM keys WHERE key_id = 'k-1'"),
        db.count("SELECT count(*) FROM audit WHERE kind = 'door.granted' AND key_id = 'k-1'")
    );
}

#[test]
fn a_new_guest_who_reuses_a_used_up_pin_gets_in() {
    let db = Db::open();
    insert(&db, &[K::active("k-old", "482913", &["101"])]);
    regrant_key(&db, "k-old", Some(1), None);
    assert!(is_unlock(&db.enter("101", "482913", t(0))));
    assert_eq!(
        denied(&db.enter("101", "482913", t(1))),
        Some(DenyReason::UsedUp)
    );
    insert(&db, &[K::active("k-new", "482913", &["101"])]);
    match db.enter("101", "482913", t(2)).decision {
        lockhub::door::Decision::Unlock(k) => assert_eq!(k.key_id, "k-new"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn keys_without_a_limit_count_their_uses_and_never_run_out() {
    let db = Db::open();
    insert(&db, &[K::active("k-1", "482913", &["101"])]);
    for s in 0..5 {
        assert!(is_unlock(&db.enter("101", "482913", t(s))));
    }
    assert_eq!(key_state(&db, "k-1"), ("active".to_owned(), 5));
    // A later version with a limit at the count leaves no use to take.
    regrant_key(&db, "k-1", Some(5), None);
    assert_eq!(
        denied(&db.enter("101", "482913", t(6))),
        Some(DenyReason::UsedUp)
    );
    assert_eq!(key_state(&db, "k-1").1, 5);
}

const OFFICE: &str = r#"[{"days":["mon","tue","wed","thu","fri"],"from":"09:00","until":"17:30"}]"#;

/// An instant given in RFC 3339.
fn at(s: &str) -> lockhub_proto::time::Timestamp {
    lockhub_proto::time::Timestamp::parse_rfc3339(s).unwrap()
}

#[test]
fn a_scheduled_key_opens_inside_its_hours_and_is_denied_outside_by_the_time_given() {
    let db = Db::open();
    let mut k = K::active("k-1", "482913", &["101"]);
    k.from = at("2026-11-01T00:00:00Z");
    k.until = at("2026-12-31T00:00:00Z");
    insert(&db, &[k]);
    regrant_key(&db, "k-1", None, Some(OFFICE));
    let berlin = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
    let enter =
        |zone: &jiff::tz::TimeZone, when: &str| db.enter_in(zone, "101", true, b"482913", at(when));
    // Friday 2026-12-04 in Berlin (UTC+1): 08:00Z is 09:00, 16:29Z is 17:29.
    assert!(is_unlock(&enter(&berlin, "2026-12-04T08:00:00Z")));
    assert!(is_unlock(&enter(&berlin, "2026-12-04T16:29:59Z")));
    for when in [
        "2026-12-04T07:59:59Z", // 08:59:59
        "2026-12-04T16:30:00Z", // 17:30
        "2026-12-05T10:00:00Z", // Saturday
    ] {
        assert_eq!(
            denied(&enter(&berlin, when)),
            Some(DenyReason::OutsideSchedule),
            "{when}"
        );
    }
    // The same instant in another hub zone: 08:00 UTC is before opening.
    assert_eq!(
        denied(&enter(&jiff::tz::TimeZone::UTC, "2026-12-04T08:00:00Z")),
        Some(DenyReason::OutsideSchedule)
    );
    // Outside the window, the window speaks first.
    assert_eq!(
        denied(&enter(&berlin, "2027-01-08T10:00:00Z")),
        Some(DenyReason::OutsideWindow)
    );
    // Six denials of a real PIN at the wrong hour lock nothing.
    for s in 0..6 {
        let when = format!("2026-12-05T10:00:0{s}Z");
        assert_eq!(
            denied(&enter(&berlin, &when)),
            Some(DenyReason::OutsideSchedule)
        );
    }
    assert!(!raised(&db, "keypad_lockout", "101"));
    assert!(
        is_unlock(&enter(&berlin, "2026-12-07T12:00:00Z")),
        "Monday noon"
    );
    assert_eq!(
        db.count(
            "SELECT count(*) FROM audit WHERE kind = 'door.denied' AND reason = 'outside_schedule'"
        ),
        10
    );
}

#[test]
fn a_scheduled_key_with_uses_is_checked_window_then_schedule_then_uses() {
    let db = Db::open();
    let mut k = K::active("k-1", "482913", &["101"]);
    k.from = at("2026-11-01T00:00:00Z");
    k.until = at("2026-12-31T00:00:00Z");
    insert(&db, &[k]);
    regrant_key(&db, "k-1", Some(1), Some(OFFICE));
    let utc = jiff::tz::TimeZone::UTC;
    let enter = |when: &str| db.enter_in(&utc, "101", true, b"482913", at(when));
    // Outside the hours the use is not taken.
    assert_eq!(
        denied(&enter("2026-12-05T10:00:00Z")),
        Some(DenyReason::OutsideSchedule)
    );
    assert_eq!(key_state(&db, "k-1"), ("active".to_owned(), 0));
    assert!(is_unlock(&enter("2026-12-04T10:00:00Z")));
    assert_eq!(key_state(&db, "k-1"), ("used_up".to_owned(), 1));
    // A used-up key is not live: any hour is `used_up` now.
    assert_eq!(
        denied(&enter("2026-12-05T10:00:00Z")),
        Some(DenyReason::UsedUp)
    );
}
