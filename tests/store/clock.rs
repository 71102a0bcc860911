//! The effective clock's durable side (the floor), the expiry sweep, and
//! retention pruning against the schema's guards, on real SQLite files.

use lockhub::clock::{Clock, Floors, Trust};
use lockhub::door::{Decision, DenyReason};
use lockhub::store::audit::{self, AuditRecord};
use lockhub::store::sweep::{EXPIRE_BATCH, expire_due, prune};
use lockhub::store::{Priority, floor, outbox};
use lockhub_proto::outputs::AuditKind;
use lockhub_proto::time::Timestamp;
use rusqlite::params;
use std::time::Duration;
use testkit::db::*;

const DAY: i64 = 86_400;

#[test]
fn the_floor_only_rises_and_the_schema_refuses_to_lower_it() {
    let db = Db::open();
    assert_eq!(floor::load(&db.reader()).unwrap(), Floors::default());
    assert!(db.write(|c| floor::raise_to(c, t(100))));
    assert!(!db.write(|c| floor::raise_to(c, t(50))), "lower is ignored");
    assert!(!db.write(|c| floor::raise_to(c, t(100))));
    assert_eq!(
        floor::load(&db.reader()).unwrap(),
        Floors {
            effective: t(100),
            system: Timestamp(0)
        },
        "a door decision or an issued_at is not the hub's own reading"
    );
    assert!(db.write(|c| floor::save(c, floors(90, 90))));
    assert!(
        !db.write(|c| floor::save(c, floors(80, 80))),
        "lower is ignored"
    );
    assert_eq!(floor::load(&db.reader()).unwrap(), floors(100, 90));
    for sql in [
        "UPDATE time_floor SET floor = 1 WHERE id = 1",
        "UPDATE time_floor SET system_floor = 1 WHERE id = 1",
    ] {
        let direct = db
            .store
            .write_blocking(Priority::Bulk, move |c| Ok(c.execute(sql, [])?));
        assert!(
            direct
                .unwrap_err()
                .to_string()
                .contains("time floor only rises"),
            "{sql}"
        );
    }
}

fn floors(effective: i64, system: i64) -> Floors {
    Floors {
        effective: t(effective),
        system: t(system),
    }
}

#[test]
fn the_floor_survives_a_restart_and_a_clock_reset_to_1970_cannot_go_behind_it() {
    let db = Db::open();
    db.write(|c| floor::save(c, floors(1000, 1000)));
    let db = db.reopen();
    let mut clock = Clock::start(floor::load(&db.reader()).unwrap());
    let epoch = Timestamp::from_secs(0);
    assert_eq!(clock.effective(epoch, Duration::ZERO), t(1000));
    assert_eq!(clock.effective(epoch, Duration::from_secs(60)), t(1060));
    assert!(matches!(
        clock.trust(epoch, Duration::from_secs(60)),
        Trust::SystemBehindFloor { .. }
    ));
}

#[test]
fn a_cloud_running_ahead_leaves_a_restarted_hub_trusting_its_clock() {
    // The run before: the system clock read t(1000) while events came
    // signed 40 s ahead of it; one of them was decided at a door.
    let db = Db::open();
    db.write(|c| floor::raise_to(c, t(1040)));
    db.write(|c| floor::save(c, floors(1040, 1000)));
    let db = db.reopen();
    let clock = Clock::start(floor::load(&db.reader()).unwrap());
    // Restarted 10 s later: decisions still use the later time, and the
    // sweep may run.
    assert_eq!(clock.peek(t(1010), Duration::ZERO), t(1040));
    assert_eq!(clock.trust(t(1010), Duration::ZERO), Trust::Trusted);
}

#[test]
fn a_door_decision_raises_the_floor_to_its_time() {
    let db = Db::open();
    db.enter("101", "0000", t(42));
    assert_eq!(floor::load(&db.reader()).unwrap().effective, t(42));
}

#[test]
fn past_valid_until_by_the_effective_time_the_door_denies_even_with_a_clock_behind() {
    let db = Db::open();
    let mut k = K::active("k-1", "482913", &["101"]);
    k.until = t(100);
    insert(&db, &[k]);
    // The system clock says t(50) but the floor (say, from an issued_at) is t(200).
    db.write(|c| floor::raise_to(c, t(200)));
    let mut clock = Clock::start(floor::load(&db.reader()).unwrap());
    let now = clock.effective(t(50), Duration::ZERO);
    let o = db.enter("101", "482913", now);
    assert_eq!(
        o.decision,
        Decision::Deny {
            reason: DenyReason::OutsideWindow,
            lockout: None
        }
    );
}

#[test]
fn a_schedule_is_read_at_the_effective_time_even_with_the_clock_behind() {
    let at = |s: &str| Timestamp::parse_rfc3339(s).unwrap();
    let db = Db::open();
    let mut k = K::active("k-1", "482913", &["101"]);
    k.from = at("2026-11-01T00:00:00Z");
    k.until = at("2026-12-31T00:00:00Z");
    insert(&db, &[k]);
    db.write(|c| {
        Ok(regrant(
            c,
            "k-1",
            None,
            Some(r#"[{"days":["mon","tue","wed","thu","fri"],"from":"09:00","until":"17:30"}]"#),
        )?)
    });
    let berlin = jiff::tz::TimeZone::get("Europe/Berlin").unwrap();
    // The floor (say, from an issued_at) is Saturday 11:00 in Berlin; the
    // system clock, behind, says Friday 11:00, inside the hours.
    let floor_at = at("2026-12-05T10:00:00Z");
    db.write(move |c| floor::raise_to(c, floor_at));
    let mut clock = Clock::start(floor::load(&db.reader()).unwrap());
    let now = clock.effective(at("2026-12-04T10:00:00Z"), Duration::ZERO);
    assert_eq!(now, at("2026-12-05T10:00:00Z"));
    let o = db.enter_in(&berlin, "101", true, b"482913", now);
    assert_eq!(
        o.decision,
        Decision::Deny {
            reason: DenyReason::OutsideSchedule,
            lockout: None
        }
    );
}

#[test]
fn the_sweep_expires_due_keys_only_while_the_clock_is_trusted() {
    let db = Db::open();
    let mut due = K::active("k-due", "111111", &["101"]);
    due.until = t(100);
    let mut later = K::active("k-later", "222222", &["101"]);
    later.until = t(1000);
    insert(&db, &[due, later]);

    assert_eq!(db.write(|c| expire_due(c, t(100), false)), 0);
    assert_eq!(
        db.count("SELECT count(*) FROM keys WHERE state = 'active'"),
        2
    );

    assert_eq!(db.write(|c| expire_due(c, t(100), true)), 1);
    let r = db.reader();
    let state: String = r
        .query_row("SELECT state FROM keys WHERE key_id = 'k-due'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(state, "expired");
    assert_eq!(
        db.count("SELECT live FROM key_doors WHERE key_id = 'k-due'"),
        0,
        "its doors follow"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE kind = 'key.expired' AND key_id = 'k-due' AND check_in_id = 'c-k-due'"),
        1
    );
    assert_eq!(db.write(|c| expire_due(c, t(100), true)), 0, "once only");
}

#[test]
fn the_sweep_works_in_batches() {
    let db = Db::open();
    let n = EXPIRE_BATCH + 5;
    db.write(move |c| {
        for i in 0..n {
            let id: &'static str = Box::leak(format!("k-{i}").into_boxed_str());
            let pin: &'static str = Box::leak(format!("{:06}", i).into_boxed_str());
            let mut k = K::active(id, pin, &["101"]);
            k.until = t(10);
            insert_key(c, &k)?;
        }
        Ok(())
    });
    assert_eq!(db.write(|c| expire_due(c, t(10), true)), EXPIRE_BATCH);
    assert_eq!(db.write(|c| expire_due(c, t(10), true)), 5);
    assert_eq!(db.write(|c| expire_due(c, t(10), true)), 0);
}

/// Wall-clock time: the retention triggers compare against SQLite's clock.
fn ago(days: i64) -> Timestamp {
    Timestamp::now_system().saturating_add_secs(-days * DAY)
}

fn insert_dedupe(c: &rusqlite::Connection, n: u8, received: Timestamp) -> rusqlite::Result<()> {
    c.execute(
        "INSERT INTO dedupe (site_id, event_id, body_sha256, seq, outcome, reason, result, received_at)
         VALUES ('s', ?1, ?2, NULL, 'applied', NULL, '{}', ?3)",
        params![
            format!("00000000-0000-4000-8000-0000000000{n:02}"),
            &[n; 32][..],
            received.0
        ],
    )?;
    Ok(())
}

fn insert_final_key(
    c: &rusqlite::Connection,
    id: &'static str,
    until: Timestamp,
) -> rusqlite::Result<()> {
    let mut k = K::active(id, "333333", &["101"]);
    k.from = until.saturating_add_secs(-DAY);
    k.until = until;
    insert_key(c, &k)?;
    c.execute("UPDATE keys SET state = 'expired' WHERE key_id = ?1", [id])?;
    Ok(())
}

fn refused(db: &Db, sql: &'static str) -> String {
    db.store
        .write_blocking(Priority::Bulk, move |c| Ok(c.execute(sql, [])?))
        .expect_err(sql)
        .to_string()
}

/// A key that took its one use and ended `used_up`, its window ending `until`.
fn insert_used_up_key(
    c: &rusqlite::Connection,
    id: &'static str,
    until: Timestamp,
) -> rusqlite::Result<()> {
    let mut k = K::active(id, "333333", &["101"]);
    k.from = until.saturating_add_secs(-DAY);
    k.until = until;
    insert_key(c, &k)?;
    regrant(c, id, Some(1), None)?;
    c.execute(
        "UPDATE keys SET use_count = 1, state = 'used_up' WHERE key_id = ?1",
        [id],
    )?;
    Ok(())
}

#[test]
fn a_used_up_key_is_pruned_like_any_final_key_once_its_retention_is_over() {
    let db = Db::open();
    let p = db.policy; // 14 days dedupe
    db.write(|c| {
        insert_used_up_key(c, "k-used-old", ago(15))?;
        insert_used_up_key(c, "k-used-recent", ago(13))?;
        Ok(())
    });
    assert!(
        refused(&db, "DELETE FROM keys WHERE key_id = 'k-used-recent'")
            .contains("key retention not reached")
    );
    let now = Timestamp::now_system();
    let pruned = db.write(move |c| prune(c, now, &p));
    assert_eq!(pruned.keys, 1);
    assert_eq!(
        db.count("SELECT count(*) FROM keys WHERE key_id = 'k-used-recent' AND state = 'used_up'"),
        1
    );
    assert_eq!(
        db.count("SELECT count(*) FROM key_doors WHERE key_id = 'k-used-old'"),
        0
    );
}

#[test]
fn prune_deletes_only_what_retention_allows_and_the_triggers_refuse_anything_earlier() {
    let db = Db::open();
    let p = db.policy; // 14 days dedupe, 60 max grant, 90 audit
    db.write(|c| {
        insert_dedupe(c, 1, ago(15))?;
        insert_dedupe(c, 2, ago(13))?;
        insert_final_key(c, "k-old", ago(15))?;
        insert_final_key(c, "k-recent", ago(13))?;
        let mut live = K::active("k-live", "444444", &["101"]);
        live.from = ago(400);
        live.until = ago(300);
        insert_key(c, &live)?;
        for (id, days) in [("tomb-old", 75), ("tomb-recent", 73)] {
            c.execute(
                "INSERT INTO key_tombstones (key_id, reason, event_id, created_at) VALUES (?1, 'x', 'e', ?2)",
                params![id, ago(days).0],
            )?;
            c.execute(
                "INSERT INTO reservation_tombstones (reservation_id, check_in_id, event_id, created_at)
                 VALUES (?1, 'c', 'e', ?2)",
                params![id, ago(days).0],
            )?;
            c.execute(
                "INSERT INTO erased_holders (holder_ref, event_id, created_at) VALUES (?1, 'e', ?2)",
                params![id, ago(days).0],
            )?;
        }
        Ok(())
    });
    // Outbox rows sent 8 and 6 days ago, one never sent.
    db.write(|c| {
        let old = outbox::enqueue(c, outbox::Topic::Results, b"{}", None, ago(30))?;
        let recent = outbox::enqueue(c, outbox::Topic::Results, b"{}", None, ago(30))?;
        outbox::enqueue(c, outbox::Topic::Results, b"{\"unsent\":1}", None, ago(300))?;
        outbox::mark_sent(c, &[old], ago(8))?;
        outbox::mark_sent(c, &[recent], ago(6))?;
        Ok(())
    });
    // Audit rows: acked 91 days old, acked 89 days old, never acked 200 days old.
    db.write(|c| {
        let mut ids = Vec::new();
        for days in [91, 89, 200] {
            let mut rec = AuditRecord::new(AuditKind::DoorForced, ago(days));
            rec.door = Some(format!("d{days}"));
            audit::record(c, &rec)?;
            ids.push(c.last_insert_rowid());
        }
        // Acknowledge the first two (their outbox rows are sent now).
        outbox::mark_sent(c, &ids[..2], Timestamp::now_system())?;
        Ok(())
    });

    // What the triggers refuse, whoever asks.
    assert!(refused(&db, "DELETE FROM dedupe WHERE result = '{}' AND body_sha256 = x'0202020202020202020202020202020202020202020202020202020202020202'").contains("dedupe retention not reached"));
    assert!(
        refused(&db, "DELETE FROM keys WHERE key_id = 'k-recent'")
            .contains("key retention not reached")
    );
    assert!(
        refused(&db, "DELETE FROM keys WHERE key_id = 'k-live'")
            .contains("key retention not reached")
    );
    assert!(
        refused(
            &db,
            "DELETE FROM key_tombstones WHERE key_id = 'tomb-recent'"
        )
        .contains("tombstone retention")
    );
    assert!(
        refused(
            &db,
            "DELETE FROM reservation_tombstones WHERE reservation_id = 'tomb-recent'"
        )
        .contains("tombstone retention")
    );
    assert!(
        refused(
            &db,
            "DELETE FROM erased_holders WHERE holder_ref = 'tomb-recent'"
        )
        .contains("erasure retention")
    );
    assert!(refused(&db, "DELETE FROM outbox WHERE sent_at IS NULL").contains("not yet sent"));
    assert!(refused(&db, "DELETE FROM audit WHERE door = 'd89'").contains("audit retention"));
    assert!(refused(&db, "DELETE FROM audit WHERE door = 'd200'").contains("audit retention"));

    let now = Timestamp::now_system();
    let pruned = db.write(move |c| prune(c, now, &p));
    assert_eq!(pruned.dedupe, 1);
    assert_eq!(pruned.keys, 1);
    assert_eq!(pruned.key_tombstones, 1);
    assert_eq!(pruned.reservation_tombstones, 1);
    assert_eq!(pruned.erased_holders, 1, "kept as long as tombstones");
    assert_eq!(pruned.audit, 1);
    assert_eq!(
        pruned.outbox, 2,
        "the 8-day-old sent row and the pruned audit row's"
    );
    assert!(!pruned.more());

    assert_eq!(db.count("SELECT count(*) FROM dedupe"), 1);
    assert_eq!(
        db.count("SELECT count(*) FROM keys WHERE key_id IN ('k-recent', 'k-live')"),
        2
    );
    assert_eq!(db.count("SELECT count(*) FROM keys"), 2);
    assert_eq!(
        db.count("SELECT count(*) FROM key_doors WHERE key_id = 'k-old'"),
        0,
        "a pruned key's doors go with it"
    );
    assert_eq!(db.count("SELECT count(*) FROM key_tombstones"), 1);
    assert_eq!(db.count("SELECT count(*) FROM audit WHERE door = 'd91'"), 0);
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE door IN ('d89', 'd200')"),
        2
    );
    assert_eq!(
        db.count("SELECT count(*) FROM outbox WHERE sent_at IS NULL"),
        2
    );

    let again = db.write(move |c| prune(c, now, &p));
    assert_eq!(again, Default::default(), "nothing more is old enough");
}

#[test]
fn prune_with_an_effective_time_ahead_of_the_wall_clock_still_never_trips_a_guard() {
    let db = Db::open();
    db.write(|c| {
        insert_dedupe(c, 1, ago(13))?;
        Ok(())
    });
    let p = db.policy;
    let ahead = Timestamp::now_system().saturating_add_secs(30 * DAY);
    let pruned = db.write(move |c| prune(c, ahead, &p));
    assert_eq!(pruned.dedupe, 0, "the wall clock bounds what may go");
    assert_eq!(db.count("SELECT count(*) FROM dedupe"), 1);
}

/// The publisher marks whole runs of acknowledged rows at once: exactly the
/// rows named are marked (a row between two runs stays unsent, and its
/// audit row unacknowledged, so retention still waits for it), and marking
/// a row again, as after a resend, changes nothing.
#[test]
fn marking_rows_sent_marks_exactly_those_rows_and_their_audit_rows() {
    let db = Db::open();
    let ids: Vec<i64> = db.write(|c| {
        let mut ids = Vec::new();
        for days in 1..=4 {
            let mut rec = AuditRecord::new(AuditKind::DoorForced, ago(days));
            rec.door = Some(format!("d{days}"));
            audit::record(c, &rec)?;
            ids.push(c.last_insert_rowid());
            ids.push(outbox::enqueue(
                c,
                outbox::Topic::Results,
                b"{}",
                None,
                ago(days),
            )?);
        }
        Ok(ids)
    });
    // Audit rows d1, d2 and d4 with their results; d3's audit row not.
    let (first, second) = (ago(1), ago(0));
    let marked = [ids[0], ids[1], ids[2], ids[3], ids[5], ids[6], ids[7]];
    db.write(move |c| outbox::mark_sent(c, &marked, first));
    let sent = |db: &Db| {
        let r = db.reader();
        let mut s = r
            .prepare("SELECT id, sent_at FROM outbox WHERE sent_at IS NOT NULL ORDER BY id")
            .unwrap();
        s.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        sent(&db),
        marked.iter().map(|&id| (id, first.0)).collect::<Vec<_>>()
    );
    let acked: String = db
        .reader()
        .query_row(
            "SELECT group_concat(door) FROM (SELECT door FROM audit WHERE acked_at IS NOT NULL ORDER BY door)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(acked, "d1,d2,d4", "d3's audit row waits for its ack");
    // Everything again (a resend acknowledged twice) and d3's row.
    let all = ids.clone();
    db.write(move |c| outbox::mark_sent(c, &all, second));
    let mut expect: Vec<(i64, i64)> = marked.iter().map(|&id| (id, first.0)).collect();
    expect.push((ids[4], second.0));
    expect.sort();
    assert_eq!(sent(&db), expect, "a mark never moves");
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE acked_at IS NULL"),
        0
    );
}
