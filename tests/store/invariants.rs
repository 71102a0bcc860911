//! Attacks on the schema's invariants with raw SQL, on a database created by
//! `Store::open`. Each attack must be refused by SQLite itself; beside most of
//! them a legal neighbour must succeed, so a test fails if the guard is
//! missing *or* if it refuses everything.

use lockhub::config::Policy;
use lockhub::lifecycle::{KeyState, may_move};
use lockhub::store::Store;
use rusqlite::{Connection, params};

const FAR: i64 = 4_102_444_800_000_000; // 2100-01-01 in microseconds

fn db() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lockhub.db");
    Store::open(&path, &Policy::default()).unwrap().close();
    let c = Connection::open(&path).unwrap();
    (dir, c)
}

/// The statement must fail with a constraint error (a trigger's RAISE, a
/// CHECK or a UNIQUE index), not some other error such as a typo.
#[track_caller]
fn refused(c: &Connection, sql: &str) {
    match c.execute_batch(sql) {
        Ok(()) => panic!("SQLite accepted: {sql}"),
        Err(rusqlite::Error::SqliteFailure(e, _))
            if e.code == rusqlite::ErrorCode::ConstraintViolation => {}
        Err(e) => panic!("failed for another reason ({e}): {sql}"),
    }
}

#[track_caller]
fn accepted(c: &Connection, sql: &str) {
    c.execute_batch(sql)
        .unwrap_or_else(|e| panic!("refused ({e}): {sql}"));
}

fn tag(b: u8) -> Vec<u8> {
    vec![b; 32]
}

/// A key with one door, brought to `state` along legal transitions.
fn key(c: &Connection, id: &str, state: KeyState, check_in: &str, tag_byte: u8) {
    let max_uses = (state == KeyState::UsedUp).then_some(1);
    key_with_uses(c, id, state, check_in, tag_byte, max_uses);
}

/// [`key`] with a `max_uses` (a used-up key takes every use on its way).
fn key_with_uses(
    c: &Connection,
    id: &str,
    state: KeyState,
    check_in: &str,
    tag_byte: u8,
    max_uses: Option<u32>,
) {
    let first = if state == KeyState::Active {
        "active"
    } else {
        "pre_issued"
    };
    c.execute(
        "INSERT INTO keys (key_id, version, state, check_in_id, reservation_id, valid_from, valid_until,
                           pin_tag, pin_key_id, holder_ref, holder_name, revoke_reason, event_id, updated_at,
                           max_uses)
         VALUES (?1, 1, ?2, ?3, 'r-1', 0, ?4, ?5, 'k1', 'g-1', 'Ada Guest', NULL, NULL, 0, ?6)",
        params![id, first, check_in, FAR, tag(tag_byte), max_uses],
    )
    .unwrap();
    c.execute(
        "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES (?1, '101', ?2, 1)",
        params![id, tag(tag_byte)],
    )
    .unwrap();
    match state {
        KeyState::Revoked => {
            c.execute(
                "UPDATE keys SET state = 'revoked', revoke_reason = 'x' WHERE key_id = ?1",
                [id],
            )
            .unwrap();
        }
        KeyState::Expired => {
            c.execute("UPDATE keys SET state = 'expired' WHERE key_id = ?1", [id])
                .unwrap();
        }
        KeyState::UsedUp => {
            let uses: i64 = c
                .query_row("SELECT max_uses FROM keys WHERE key_id = ?1", [id], |r| {
                    r.get(0)
                })
                .unwrap();
            for _ in 1..uses {
                c.execute(
                    "UPDATE keys SET use_count = use_count + 1 WHERE key_id = ?1",
                    [id],
                )
                .unwrap();
            }
            c.execute(&set_state_sql(id, KeyState::UsedUp), []).unwrap();
        }
        _ => {}
    }
}

fn count(c: &Connection, sql: &str) -> i64 {
    c.query_row(sql, [], |r| r.get(0)).unwrap()
}

/// The statement that moves key `id` to `to`; a key becomes used up by
/// taking its last use.
fn set_state_sql(id: &str, to: KeyState) -> String {
    let reason = if to == KeyState::Revoked {
        "'x'"
    } else {
        "NULL"
    };
    let use_taken = if to == KeyState::UsedUp {
        ", use_count = use_count + 1"
    } else {
        ""
    };
    format!(
        "UPDATE keys SET state = '{}', revoke_reason = {reason}{use_taken} WHERE key_id = '{id}'",
        to.as_str()
    )
}

#[test]
fn two_active_keys_for_one_check_in_are_refused_however_they_are_written() {
    let (_d, c) = db();
    key(&c, "k-a", KeyState::Active, "c-1", 1);
    key(&c, "k-b", KeyState::PreIssued, "c-1", 2);
    // Insert, plain and with REPLACE (which would evict k-a).
    for verb in ["INSERT", "INSERT OR REPLACE"] {
        refused(
            &c,
            &format!(
                "{verb} INTO keys (key_id, version, state, check_in_id, valid_from, valid_until,
                                   pin_tag, pin_key_id, updated_at)
                 VALUES ('k-c', 1, 'active', 'c-1', 0, {FAR}, X'{}', 'k1', 0)",
                "03".repeat(32)
            ),
        );
    }
    // Activating the pre-issued one, plain and with REPLACE.
    refused(
        &c,
        "UPDATE keys SET state = 'active', version = 2 WHERE key_id = 'k-b'",
    );
    refused(
        &c,
        "UPDATE OR REPLACE keys SET state = 'active', version = 2 WHERE key_id = 'k-b'",
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM keys WHERE state = 'active'"),
        1
    );
    assert_eq!(count(&c, "SELECT count(*) FROM keys"), 2, "k-a still there");
    // Once k-a is revoked, k-b may become active.
    accepted(&c, &set_state_sql("k-a", KeyState::Revoked));
    accepted(
        &c,
        "UPDATE keys SET state = 'active', version = 2 WHERE key_id = 'k-b'",
    );
}

#[test]
fn two_live_keys_on_one_door_and_pin_tag_are_refused_however_they_are_written() {
    let (_d, c) = db();
    key(&c, "k-a", KeyState::Active, "c-1", 7);
    key(&c, "k-b", KeyState::Active, "c-2", 8);
    let t7 = "07".repeat(32);
    for verb in ["INSERT", "INSERT OR REPLACE"] {
        refused(
            &c,
            &format!(
                "{verb} INTO key_doors (key_id, door, pin_tag, live) VALUES ('k-b', '101', X'{t7}', 1)"
            ),
        );
    }
    // Moving k-b's tag onto k-a's (at a higher version), plain and with REPLACE.
    refused(
        &c,
        &format!("UPDATE keys SET pin_tag = X'{t7}', version = 2 WHERE key_id = 'k-b'"),
    );
    refused(
        &c,
        &format!("UPDATE OR REPLACE keys SET pin_tag = X'{t7}', version = 2 WHERE key_id = 'k-b'"),
    );
    assert_eq!(count(&c, "SELECT count(*) FROM key_doors"), 2);
    // The same tag on another door is fine; after k-a is revoked, so is the same door.
    accepted(
        &c,
        &format!(
            "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES ('k-a', '102', X'{t7}', 1)"
        ),
    );
    accepted(&c, &set_state_sql("k-a", KeyState::Revoked));
    accepted(
        &c,
        &format!("UPDATE keys SET pin_tag = X'{t7}', version = 2 WHERE key_id = 'k-b'"),
    );
}

#[test]
fn every_state_change_outside_the_whitelist_is_refused_and_every_one_inside_is_allowed() {
    let (_d, c) = db();
    let mut n = 0;
    for from in KeyState::ALL {
        for to in KeyState::ALL {
            if from == to {
                continue;
            }
            n += 1;
            let id = format!("k-{n}");
            // One use: a live key's next entry is its last.
            key_with_uses(&c, &id, from, &format!("c-{n}"), n as u8, Some(1));
            let sql = set_state_sql(&id, to);
            if may_move(from, to) {
                // Activation is a new version of the grant; leaving the live
                // states is not.
                let sql = if to == KeyState::Active {
                    sql.replace("SET ", "SET version = version + 1, ")
                } else {
                    sql
                };
                accepted(&c, &sql);
            } else {
                refused(&c, &sql);
                // Not even with a higher version.
                refused(&c, &sql.replace("SET ", "SET version = version + 1, "));
            }
        }
    }
    assert_eq!(n, 20);
}

#[test]
fn a_final_key_changes_in_nothing_but_the_erasure_of_its_holder_name() {
    let (_d, c) = db();
    let edits = [
        "version = 2",
        "check_in_id = 'c-9'",
        "reservation_id = 'r-9'",
        "valid_from = 1",
        "valid_until = valid_until + 1",
        "pin_tag = zeroblob(32)",
        "pin_key_id = 'k2'",
        "holder_ref = 'g-9'",
        "holder_name = 'Someone Else'",
        "event_id = 'e'",
        "updated_at = 5",
        "key_id = 'k-new'",
        r#"schedule = '[{"days":["mon"],"from":"09:00","until":"10:00"}]'"#,
        "max_uses = 7",
        "use_count = use_count + 1",
    ];
    for (i, state) in [KeyState::Revoked, KeyState::Expired, KeyState::UsedUp]
        .into_iter()
        .enumerate()
    {
        let id = format!("k-final-{i}");
        key(&c, &id, state, &format!("c-{i}"), i as u8);
        for e in edits {
            refused(&c, &format!("UPDATE keys SET {e} WHERE key_id = '{id}'"));
        }
        if state == KeyState::Revoked {
            refused(
                &c,
                &format!("UPDATE keys SET revoke_reason = 'y' WHERE key_id = '{id}'"),
            );
        }
        // Its doors are frozen too.
        refused(
            &c,
            &format!("UPDATE key_doors SET door = '102' WHERE key_id = '{id}'"),
        );
        refused(
            &c,
            &format!(
                "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES ('{id}', '103', X'{}', 0)",
                format!("{i:02}").repeat(32)
            ),
        );
        refused(&c, &format!("DELETE FROM key_doors WHERE key_id = '{id}'"));
        accepted(
            &c,
            &format!("UPDATE keys SET holder_name = NULL WHERE key_id = '{id}'"),
        );
    }
}

#[test]
fn a_revoked_key_cannot_be_resurrected_by_insert_or_replace() {
    let (_d, c) = db();
    key(&c, "k-1", KeyState::Revoked, "c-1", 1);
    refused(
        &c,
        &format!(
            "INSERT OR REPLACE INTO keys (key_id, version, state, check_in_id, valid_from, valid_until,
                                          pin_tag, pin_key_id, updated_at)
             VALUES ('k-1', 9, 'active', 'c-1', 0, {FAR}, X'{}', 'k1', 0)",
            "01".repeat(32)
        ),
    );
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM keys WHERE key_id = 'k-1' AND state = 'revoked'"
        ),
        1
    );
}

#[test]
fn a_version_never_goes_down_and_a_live_key_changes_only_with_a_higher_one() {
    let (_d, c) = db();
    key(&c, "k-1", KeyState::Active, "c-1", 1);
    accepted(&c, "UPDATE keys SET version = 3 WHERE key_id = 'k-1'");
    refused(&c, "UPDATE keys SET version = 2 WHERE key_id = 'k-1'");
    // Erasing the holder's name needs no new version...
    accepted(
        &c,
        "UPDATE keys SET holder_name = NULL WHERE key_id = 'k-1'",
    );
    // ...but nothing may ride along with an erasure at the same version: the
    // same tag under another PIN key is another PIN.
    for e in [
        "valid_until = valid_until - 1",
        "pin_key_id = 'k2'",
        "check_in_id = 'c-2'",
        "reservation_id = 'r-2'",
        "holder_ref = 'g-2'",
    ] {
        refused(&c, &format!("UPDATE keys SET {e} WHERE key_id = 'k-1'"));
        accepted(
            &c,
            &format!(
                "SAVEPOINT s; UPDATE keys SET {e}, version = version + 1 WHERE key_id = 'k-1'; ROLLBACK TO s; RELEASE s"
            ),
        );
    }
}

#[test]
fn a_key_doors_row_that_disagrees_with_its_key_is_refused() {
    let (_d, c) = db();
    key(&c, "k-1", KeyState::Active, "c-1", 1);
    key(&c, "k-2", KeyState::Revoked, "c-2", 2);
    let other = "09".repeat(32);
    let own = "01".repeat(32);
    refused(
        &c,
        &format!(
            "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES ('k-1', '102', X'{other}', 1)"
        ),
    );
    refused(
        &c,
        &format!(
            "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES ('k-1', '102', X'{own}', 0)"
        ),
    );
    refused(
        &c,
        &format!("UPDATE key_doors SET pin_tag = X'{other}' WHERE key_id = 'k-1'"),
    );
    refused(&c, "UPDATE key_doors SET live = 0 WHERE key_id = 'k-1'");
    refused(&c, "UPDATE key_doors SET live = 1 WHERE key_id = 'k-2'");
    accepted(
        &c,
        &format!(
            "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES ('k-1', '102', X'{own}', 1)"
        ),
    );
}

#[test]
fn a_tombstoned_key_id_never_comes_back_and_never_coexists_with_a_key() {
    let (_d, c) = db();
    accepted(
        &c,
        "INSERT INTO key_tombstones (key_id, reason, event_id, created_at) VALUES ('k-ghost', 'x', 'e', CAST(unixepoch('subsec') * 1000000 AS INTEGER))",
    );
    let insert = format!(
        "INSERT INTO keys (key_id, version, state, check_in_id, valid_from, valid_until, pin_tag, pin_key_id, updated_at)
         VALUES ('k-ghost', 1, 'active', 'c-1', 0, {FAR}, X'{}', 'k1', 0)",
        "05".repeat(32)
    );
    refused(&c, &insert);
    refused(&c, &insert.replace("INSERT", "INSERT OR REPLACE"));
    key(&c, "k-1", KeyState::Active, "c-1", 1);
    refused(
        &c,
        "INSERT INTO key_tombstones (key_id, reason, event_id, created_at) VALUES ('k-1', 'x', 'e', 0)",
    );
    refused(&c, "UPDATE key_tombstones SET key_id = 'k-other'");
    refused(&c, "DELETE FROM key_tombstones");
    refused(
        &c,
        "INSERT OR REPLACE INTO key_tombstones (key_id, reason, event_id, created_at) VALUES ('k-ghost', 'y', 'e2', 0)",
    );
}

#[test]
fn a_pre_issued_key_for_a_checked_in_reservation_is_refused() {
    let (_d, c) = db();
    key(&c, "k-pre", KeyState::PreIssued, "c-0", 1);
    accepted(
        &c,
        "UPDATE keys SET reservation_id = 'r-2', version = 2 WHERE key_id = 'k-pre'",
    );
    accepted(
        &c,
        "INSERT INTO reservation_tombstones (reservation_id, check_in_id, event_id, created_at)
         VALUES ('r-1', 'c-1', 'e', CAST(unixepoch('subsec') * 1000000 AS INTEGER))",
    );
    let insert = format!(
        "INSERT INTO keys (key_id, version, state, reservation_id, valid_from, valid_until, pin_tag, pin_key_id, updated_at)
         VALUES ('k-late', 1, 'pre_issued', 'r-1', 0, {FAR}, X'{}', 'k1', 0)",
        "06".repeat(32)
    );
    refused(&c, &insert);
    // Nor can a pre-issued key be moved into the closed reservation.
    refused(
        &c,
        "UPDATE keys SET reservation_id = 'r-1', version = 3 WHERE key_id = 'k-pre'",
    );
    refused(&c, "DELETE FROM reservation_tombstones");
    refused(&c, "UPDATE reservation_tombstones SET check_in_id = 'c-x'");
    // A pre-issued key of another reservation is fine.
    accepted(&c, &insert.replace("'r-1'", "'r-3'"));
}

#[test]
fn audit_rows_are_never_rewritten_or_deleted_early_but_names_can_be_erased() {
    let (_d, c) = db();
    accepted(
        &c,
        "INSERT INTO audit (audit_id, at, kind, key_id, holder_ref, holder_name, reason)
         VALUES ('00000000-0000-7000-8000-000000000001', 0, 'key.revoked', 'k-1', 'g-1', 'Ada Guest', 'x')",
    );
    for e in [
        "kind = 'key.activated'",
        "at = 1",
        "key_id = 'k-2'",
        "reason = 'y'",
        "holder_ref = 'g-2'",
        "holder_name = 'Someone'",
        "audit_id = '00000000-0000-7000-8000-000000000002'",
    ] {
        refused(&c, &format!("UPDATE audit SET {e}"));
    }
    refused(
        &c,
        "INSERT OR REPLACE INTO audit (audit_id, at, kind) VALUES ('00000000-0000-7000-8000-000000000001', 5, 'key.expired')",
    );
    // Unacked: never deleted.
    refused(&c, "DELETE FROM audit");
    accepted(&c, "UPDATE audit SET holder_name = NULL");
    accepted(&c, "UPDATE audit SET acked_at = 10");
    refused(&c, "UPDATE audit SET acked_at = 11");
    // Never written acknowledged: only the broker's PUBACK acknowledges.
    refused(
        &c,
        &format!(
            "INSERT INTO audit (audit_id, at, kind, acked_at) VALUES ('00000000-0000-7000-8000-000000000004', {FAR}, 'key.expired', 1)"
        ),
    );
    // Acked but young (the row is from 1970 by `at`, so make a young one).
    accepted(
        &c,
        &format!(
            "INSERT INTO audit (audit_id, at, kind) VALUES ('00000000-0000-7000-8000-000000000003', {FAR}, 'key.expired');
             UPDATE audit SET acked_at = 1 WHERE audit_id = '00000000-0000-7000-8000-000000000003'"
        ),
    );
    refused(
        &c,
        "DELETE FROM audit WHERE audit_id = '00000000-0000-7000-8000-000000000003'",
    );
    // Acked and old: may go.
    accepted(
        &c,
        "DELETE FROM audit WHERE audit_id = '00000000-0000-7000-8000-000000000001'",
    );
}

#[test]
fn dedupe_rows_are_immutable() {
    let (_d, c) = db();
    let now = lockhub_proto::time::Timestamp::now_system().0;
    accepted(
        &c,
        &format!(
            "INSERT INTO dedupe (site_id, event_id, body_sha256, seq, outcome, reason, result, received_at)
             VALUES ('s', '00000001-94a1-4c39-8f5e-6b1e2d3c4a01', zeroblob(32), 1, 'applied', NULL, '{{}}', {now})"
        ),
    );
    for e in [
        "outcome = 'noop'",
        "result = '{\"x\":1}'",
        "body_sha256 = randomblob(32)",
        "seq = 2",
    ] {
        refused(&c, &format!("UPDATE dedupe SET {e}"));
    }
    refused(
        &c,
        &format!(
            "INSERT OR REPLACE INTO dedupe (site_id, event_id, body_sha256, seq, outcome, reason, result, received_at)
             VALUES ('s', '00000001-94a1-4c39-8f5e-6b1e2d3c4a01', randomblob(32), 1, 'noop', NULL, '{{}}', {now})"
        ),
    );
    refused(&c, "DELETE FROM dedupe");
    // An upper-case id is not the same id written another way: refused.
    refused(
        &c,
        &format!(
            "INSERT INTO dedupe (site_id, event_id, body_sha256, seq, outcome, reason, result, received_at)
             VALUES ('s', '0000000A-94A1-4C39-8F5E-6B1E2D3C4A01', zeroblob(32), 1, 'applied', NULL, '{{}}', {now})"
        ),
    );
    assert_eq!(
        count(&c, "SELECT count(*) FROM dedupe WHERE outcome = 'applied'"),
        1
    );
}

#[test]
fn the_watermark_never_goes_down() {
    let (_d, c) = db();
    accepted(&c, "UPDATE seq_state SET watermark = 12");
    refused(&c, "UPDATE seq_state SET watermark = 11");
    refused(
        &c,
        "INSERT OR REPLACE INTO seq_state (id, watermark) VALUES (1, 0)",
    );
    refused(&c, "DELETE FROM seq_state");
    refused(&c, "INSERT INTO seq_seen (seq) VALUES (12)");
    accepted(&c, "INSERT INTO seq_seen (seq) VALUES (14)");
    assert_eq!(count(&c, "SELECT watermark FROM seq_state"), 12);
}

#[test]
fn the_time_floor_never_goes_down() {
    let (_d, c) = db();
    accepted(&c, "UPDATE time_floor SET floor = 1000");
    refused(&c, "UPDATE time_floor SET floor = 999");
    refused(
        &c,
        "INSERT OR REPLACE INTO time_floor (id, floor) VALUES (1, 0)",
    );
    refused(&c, "DELETE FROM time_floor");
    assert_eq!(count(&c, "SELECT floor FROM time_floor"), 1000);
    accepted(&c, "UPDATE time_floor SET system_floor = 500");
    refused(&c, "UPDATE time_floor SET system_floor = 499");
    refused(&c, "UPDATE time_floor SET system_floor = NULL");
    refused(&c, "UPDATE time_floor SET floor = 2000, system_floor = 0");
    assert_eq!(
        count(&c, "SELECT floor * 10000 + system_floor FROM time_floor"),
        1000 * 10000 + 500
    );
}

#[test]
fn an_unsent_outbox_row_is_never_deleted_or_rewritten() {
    let (_d, c) = db();
    accepted(
        &c,
        "INSERT INTO outbox (id, topic, body, created_at) VALUES (1, 'results', X'7B7D', 0)",
    );
    refused(&c, "DELETE FROM outbox WHERE id = 1");
    refused(&c, "UPDATE outbox SET body = X'00' WHERE id = 1");
    refused(
        &c,
        "INSERT OR REPLACE INTO outbox (id, topic, body, created_at) VALUES (1, 'results', X'00', 0)",
    );
    accepted(&c, "UPDATE outbox SET sent_at = 5 WHERE id = 1");
    refused(&c, "UPDATE outbox SET sent_at = 6 WHERE id = 1");
    accepted(&c, "DELETE FROM outbox WHERE id = 1");
}

#[test]
fn a_live_key_is_never_deleted() {
    let (_d, c) = db();
    key(&c, "k-1", KeyState::Active, "c-1", 1);
    key(&c, "k-2", KeyState::PreIssued, "c-2", 2);
    refused(&c, "DELETE FROM keys WHERE key_id = 'k-1'");
    refused(&c, "DELETE FROM keys WHERE key_id = 'k-2'");
    // A final key within its retention is kept too.
    key(&c, "k-3", KeyState::Revoked, "c-3", 3);
    refused(&c, "DELETE FROM keys WHERE key_id = 'k-3'");
    assert_eq!(count(&c, "SELECT count(*) FROM keys"), 3);
    // An old final key past valid_until + retention may go.
    c.execute(
        "INSERT INTO keys (key_id, version, state, check_in_id, valid_from, valid_until, pin_tag,
                           pin_key_id, revoke_reason, updated_at)
         VALUES ('k-old', 1, 'revoked', 'c-4', 0, 1, ?1, 'k1', 'x', 0)",
        [tag(4)],
    )
    .unwrap();
    accepted(&c, "DELETE FROM keys WHERE key_id = 'k-old'");
}

#[test]
fn lockouts_are_never_overwritten() {
    let (_d, c) = db();
    accepted(
        &c,
        "INSERT INTO lockouts (door, started_at, until, level) VALUES ('101', 1, 100, 0)",
    );
    refused(
        &c,
        "INSERT OR REPLACE INTO lockouts (door, started_at, until, level) VALUES ('101', 1, 2, 0)",
    );
    refused(&c, "UPDATE lockouts SET until = 2");
}

#[test]
fn a_running_lockout_is_never_deleted_and_an_ended_one_may_be() {
    let (_d, c) = db();
    accepted(
        &c,
        &format!(
            "INSERT INTO lockouts (door, started_at, until, level) VALUES ('101', 1, {FAR}, 0);
             INSERT INTO lockouts (door, started_at, until, level) VALUES ('102', 1, 100, 0)"
        ),
    );
    refused(&c, "DELETE FROM lockouts WHERE door = '101'");
    accepted(&c, "DELETE FROM lockouts WHERE door = '102'");
}

#[test]
fn a_raised_alert_keeps_its_identity_is_never_deleted_or_replaced_and_ends_by_being_cleared() {
    let (_d, c) = db();
    accepted(
        &c,
        "INSERT INTO alerts VALUES ('tamper', 'b', '00000000-0000-7000-8000-000000000001', 'raised', 3, 1, 1, 1)",
    );
    for e in [
        "alert_id = '00000000-0000-7000-8000-000000000002'",
        "first_at = 0",
        "count = 2",
        "subject = 'c'",
    ] {
        refused(&c, &format!("UPDATE alerts SET {e}"));
    }
    refused(&c, "DELETE FROM alerts");
    refused(
        &c,
        "INSERT OR REPLACE INTO alerts VALUES ('tamper', 'b', '00000000-0000-7000-8000-000000000003', 'raised', 1, 1, 1, 1)",
    );
    accepted(&c, "UPDATE alerts SET count = 4, last_at = 2");
    accepted(&c, "UPDATE alerts SET state = 'cleared', last_at = 3");
    // Cleared, it may open again as a new alert.
    accepted(
        &c,
        "UPDATE alerts SET alert_id = '00000000-0000-7000-8000-000000000004', state = 'raised', count = 1, first_at = 4, last_at = 4",
    );
}

#[test]
fn an_erasure_is_renewed_by_a_later_one_never_forgotten_early_or_replaced() {
    let (_d, c) = db();
    let now = lockhub_proto::time::Timestamp::now_system().0;
    accepted(
        &c,
        &format!("INSERT INTO erased_holders VALUES ('g-1', 'e-1', {now})"),
    );
    // Renewed by a later erasure: its time rises.
    accepted(
        &c,
        &format!(
            "UPDATE erased_holders SET event_id = 'e-2', created_at = {} WHERE holder_ref = 'g-1'",
            now + 1
        ),
    );
    refused(&c, "UPDATE erased_holders SET created_at = 0");
    refused(&c, "UPDATE erased_holders SET holder_ref = 'g-2'");
    refused(
        &c,
        "INSERT OR REPLACE INTO erased_holders VALUES ('g-1', 'e-3', 0)",
    );
    refused(&c, "DELETE FROM erased_holders");
}

#[test]
fn a_key_ends_as_it_was_granted() {
    let (_d, c) = db();
    key(&c, "k-1", KeyState::Active, "c-1", 1);
    for e in [
        "valid_until = 2",
        "pin_tag = x'2222222222222222222222222222222222222222222222222222222222222222'",
        "holder_ref = 'g-9'",
        "check_in_id = 'c-7'",
        "version = 99",
        "holder_name = 'Someone Else'",
    ] {
        refused(
            &c,
            &format!(
                "UPDATE keys SET state = 'revoked', revoke_reason = 'x', {e} WHERE key_id = 'k-1'"
            ),
        );
    }
    accepted(
        &c,
        "UPDATE keys SET state = 'revoked', revoke_reason = 'checkout', event_id = 'e-9', updated_at = 5, holder_name = NULL WHERE key_id = 'k-1'",
    );
}

#[test]
fn a_reservation_is_not_tombstoned_while_one_of_its_pre_issued_keys_is_live() {
    let (_d, c) = db();
    key(&c, "k-1", KeyState::PreIssued, "c-1", 1);
    refused(
        &c,
        "INSERT INTO reservation_tombstones VALUES ('r-1', 'c-5', 'e', 1)",
    );
    accepted(
        &c,
        "UPDATE keys SET state = 'revoked', revoke_reason = 'checked_in' WHERE key_id = 'k-1';
         INSERT INTO reservation_tombstones VALUES ('r-1', 'c-5', 'e', 1)",
    );
}

#[test]
fn an_alert_cleared_audit_row_always_names_its_condition_subject_and_reason_and_keeps_them() {
    let (_dir, c) = db();
    let row = |n: u8, cols: &str, vals: &str| {
        format!(
            "INSERT INTO audit (audit_id, at, kind{cols}) VALUES ('00000000-0000-7000-8000-0000000000{n:02}', 5, 'alert.cleared'{vals})"
        )
    };
    refused(&c, &row(1, "", ""));
    refused(&c, &row(2, ", door, reason", ", 'board-a', 'fixed'"));
    refused(&c, &row(3, ", door, condition", ", 'board-a', 'tamper'"));
    refused(&c, &row(4, ", reason, condition", ", 'fixed', 'tamper'"));
    accepted(
        &c,
        &row(
            5,
            ", door, reason, condition",
            ", 'board-a', 'fixed', 'tamper'",
        ),
    );
    refused(&c, "UPDATE audit SET condition = 'door_forced'");
    // Only an operator's clear carries a condition.
    refused(
        &c,
        "INSERT INTO audit (audit_id, at, kind, door, condition)
         VALUES ('00000000-0000-7000-8000-000000000006', 5, 'board.tamper', 'board-a', 'tamper')",
    );
}

#[test]
fn every_alert_condition_of_the_contract_is_accepted_and_no_other() {
    let (_dir, c) = db();
    for (i, cond) in lockhub_proto::outputs::Condition::ALL.iter().enumerate() {
        accepted(
            &c,
            &format!(
                "INSERT INTO alerts VALUES ('{}', 's', '00000000-0000-7000-8000-0000000000{i:02}', 'raised', 1, 1, 1, 1)",
                cond.as_str()
            ),
        );
    }
    refused(
        &c,
        "INSERT INTO alerts VALUES ('door_sad', 's', '00000000-0000-7000-8000-000000000099', 'raised', 1, 1, 1, 1)",
    );
}

#[test]
fn a_door_flood_row_has_a_door_and_a_count_and_no_other_row_has_a_count() {
    let (_d, c) = db();
    let id = |n: u8| format!("00000000-0000-7000-8000-0000000000{n:02}");
    accepted(
        &c,
        &format!(
            "INSERT INTO audit (audit_id, at, kind, door, count) VALUES ('{}', 1, 'door.flood', '101', 40)",
            id(1)
        ),
    );
    for (n, sql) in [
        (2, "'door.flood', '101', NULL"),
        (3, "'door.flood', NULL, 5"),
        (4, "'door.flood', '101', 0"),
        (5, "'door.forced', '101', 1"),
    ] {
        refused(
            &c,
            &format!(
                "INSERT INTO audit (audit_id, at, kind, door, count) VALUES ('{}', 1, {sql})",
                id(n)
            ),
        );
    }
    // The count is part of the row, which is never rewritten.
    refused(&c, "UPDATE audit SET count = 1 WHERE kind = 'door.flood'");
}

#[test]
fn a_door_state_row_is_open_with_its_opening_time_or_closed_without_alerts() {
    let (_d, c) = db();
    accepted(
        &c,
        "INSERT INTO door_state VALUES ('101', 1, 5, 1, 1, 5);
         INSERT INTO door_state VALUES ('102', 0, NULL, 0, 0, 5);",
    );
    refused(
        &c,
        "INSERT INTO door_state VALUES ('103', 1, NULL, 0, 0, 5)",
    );
    refused(&c, "INSERT INTO door_state VALUES ('104', 0, 5, 0, 0, 5)");
    refused(
        &c,
        "INSERT INTO door_state VALUES ('105', 0, NULL, 1, 0, 5)",
    );
    refused(&c, "INSERT INTO door_state VALUES ('106', 2, 5, 0, 0, 5)");
}

#[test]
fn every_denial_reason_fits_the_audit_table_and_nothing_else_does() {
    let (_d, c) = db();
    for (i, r) in lockhub::door::DenyReason::ALL.iter().enumerate() {
        accepted(
            &c,
            &format!(
                "INSERT INTO audit (audit_id, at, kind, door, reason)
                 VALUES ('00000000-0000-7000-8000-0000000001{i:02}', 0, 'door.denied', '201', '{}')",
                r.as_str()
            ),
        );
    }
    refused(
        &c,
        "INSERT INTO audit (audit_id, at, kind, door, reason)
         VALUES ('00000000-0000-7000-8000-000000000199', 0, 'door.denied', '201', 'card_ok')",
    );
    // A denial always says why.
    refused(
        &c,
        "INSERT INTO audit (audit_id, at, kind, door, reason)
         VALUES ('00000000-0000-7000-8000-000000000198', 0, 'door.denied', '201', NULL)",
    );
    // The rebuild in 0006 kept 0005's guard on `count` and 0003's on `condition`.
    refused(&c, "UPDATE audit SET count = 2");
    refused(&c, "UPDATE audit SET condition = 'tamper'");
}

#[test]
fn an_osdp_reader_link_is_on_a_real_address_and_secure_only_while_online() {
    let (_d, c) = db();
    let row = |address: u8, online: u8, secure: u8| {
        format!(
            "INSERT OR REPLACE INTO osdp_links (reader, bus, address, online, secure, quarantined, since)
             VALUES ('r-1', 'bus-a', {address}, {online}, {secure}, 0, 0)"
        )
    };
    accepted(&c, &row(126, 1, 1));
    accepted(&c, &row(0, 0, 0));
    refused(&c, &row(127, 1, 0));
    refused(&c, &row(1, 0, 1));
    refused(
        &c,
        "INSERT INTO osdp_readers (reader, vendor, model, version, serial, firmware, recorded_at)
         VALUES ('r-1', 16777216, 0, 0, 0, 0, 0)",
    );
}

const SCHEDULE: &str = r#"'[{"days":["mon"],"from":"09:00","until":"10:00"}]'"#;

fn state_of(c: &Connection, id: &str) -> String {
    c.query_row("SELECT state FROM keys WHERE key_id = ?1", [id], |r| {
        r.get(0)
    })
    .unwrap()
}

#[test]
fn a_use_is_taken_one_at_a_time_from_a_live_key_and_never_past_max_uses() {
    let (_d, c) = db();
    key_with_uses(&c, "k-1", KeyState::Active, "c-1", 1, Some(3));
    let take = "UPDATE keys SET use_count = use_count + 1 WHERE key_id = 'k-1'";
    // Two at once, back to zero, below zero, or riding on a new version.
    refused(
        &c,
        "UPDATE keys SET use_count = use_count + 2 WHERE key_id = 'k-1'",
    );
    refused(&c, "UPDATE keys SET use_count = -1 WHERE key_id = 'k-1'");
    refused(
        &c,
        "UPDATE keys SET use_count = use_count + 1, version = 2 WHERE key_id = 'k-1'",
    );
    refused(
        &c,
        "UPDATE keys SET use_count = use_count + 1, max_uses = 9 WHERE key_id = 'k-1'",
    );
    accepted(&c, take);
    refused(&c, "UPDATE keys SET use_count = 0 WHERE key_id = 'k-1'");
    refused(
        &c,
        "UPDATE keys SET use_count = 0, version = 2 WHERE key_id = 'k-1'",
    );
    accepted(&c, take);
    // The last use cannot leave the key live...
    refused(&c, take);
    refused(
        &c,
        "UPDATE OR REPLACE keys SET use_count = use_count + 1 WHERE key_id = 'k-1'",
    );
    // ...nor go past the limit on its way out.
    refused(
        &c,
        "UPDATE keys SET use_count = use_count + 2, state = 'used_up' WHERE key_id = 'k-1'",
    );
    accepted(
        &c,
        "UPDATE keys SET use_count = use_count + 1, state = 'used_up' WHERE key_id = 'k-1'",
    );
    assert_eq!(state_of(&c, "k-1"), "used_up");
    assert_eq!(
        count(&c, "SELECT use_count FROM keys WHERE key_id = 'k-1'"),
        3
    );
    refused(&c, take);
    // A key without a limit counts its uses too; a final one takes none.
    key(&c, "k-2", KeyState::Active, "c-2", 2);
    for _ in 0..3 {
        accepted(
            &c,
            "UPDATE keys SET use_count = use_count + 1 WHERE key_id = 'k-2'",
        );
    }
    key(&c, "k-3", KeyState::Revoked, "c-3", 3);
    refused(
        &c,
        "UPDATE keys SET use_count = use_count + 1 WHERE key_id = 'k-3'",
    );
}

#[test]
fn a_key_is_used_up_only_once_every_use_is_taken_and_never_starts_used() {
    let (_d, c) = db();
    key_with_uses(&c, "k-1", KeyState::Active, "c-1", 1, Some(2));
    key(&c, "k-2", KeyState::Active, "c-2", 2);
    // Uses left, or no limit at all: not used up.
    refused(&c, "UPDATE keys SET state = 'used_up' WHERE key_id = 'k-1'");
    refused(
        &c,
        "UPDATE keys SET state = 'used_up', use_count = use_count + 1 WHERE key_id = 'k-1'",
    );
    refused(&c, "UPDATE keys SET state = 'used_up' WHERE key_id = 'k-2'");
    refused(
        &c,
        "UPDATE keys SET state = 'used_up', use_count = use_count + 1 WHERE key_id = 'k-2'",
    );
    // A key is inserted with no use taken, so never used up.
    let insert = |state: &str, uses: u32| {
        format!(
            "INSERT INTO keys (key_id, version, state, check_in_id, valid_from, valid_until, pin_tag,
                               pin_key_id, updated_at, max_uses, use_count)
             VALUES ('k-new', 1, '{state}', 'c-9', 0, {FAR}, X'{}', 'k1', 0, 1, {uses})",
            "09".repeat(32)
        )
    };
    refused(&c, &insert("used_up", 1));
    refused(&c, &insert("active", 1));
    refused(&c, &insert("active", 0).replace(", 1, 0)", ", 0, 0)"));
    refused(&c, &insert("active", 0).replace(", 1, 0)", ", 100001, 0)"));
    accepted(&c, &insert("active", 0));
}

#[test]
fn a_used_up_key_is_only_revoked_and_its_doors_stay_out_of_service() {
    let (_d, c) = db();
    key_with_uses(&c, "k-1", KeyState::UsedUp, "c-1", 1, Some(2));
    assert_eq!(
        count(
            &c,
            "SELECT count(*) FROM key_doors WHERE key_id = 'k-1' AND live = 0"
        ),
        1
    );
    for to in ["active", "pre_issued", "expired"] {
        refused(
            &c,
            &format!("UPDATE keys SET state = '{to}' WHERE key_id = 'k-1'"),
        );
        refused(
            &c,
            &format!("UPDATE keys SET state = '{to}', version = 2 WHERE key_id = 'k-1'"),
        );
    }
    // A higher version for it, however it is written.
    refused(&c, "UPDATE keys SET version = 2 WHERE key_id = 'k-1'");
    refused(
        &c,
        &format!(
            "INSERT OR REPLACE INTO keys (key_id, version, state, check_in_id, valid_from, valid_until,
                                          pin_tag, pin_key_id, updated_at)
             VALUES ('k-1', 2, 'active', 'c-1', 0, {FAR}, X'{}', 'k1', 0)",
            "01".repeat(32)
        ),
    );
    refused(&c, "UPDATE key_doors SET live = 1 WHERE key_id = 'k-1'");
    refused(&c, "DELETE FROM keys WHERE key_id = 'k-1'");
    // A revoke may not carry anything else along...
    for e in [
        "version = 2",
        "max_uses = 5",
        "use_count = 1",
        "valid_until = 1",
    ] {
        refused(
            &c,
            &format!(
                "UPDATE keys SET state = 'revoked', revoke_reason = 'x', {e} WHERE key_id = 'k-1'"
            ),
        );
    }
    // ...and then the revoked key is final like any other.
    accepted(
        &c,
        "UPDATE keys SET state = 'revoked', revoke_reason = 'checkout', event_id = 'e-9',
                         updated_at = 9, holder_name = NULL WHERE key_id = 'k-1'",
    );
    assert_eq!(state_of(&c, "k-1"), "revoked");
    assert_eq!(
        count(&c, "SELECT use_count FROM keys WHERE key_id = 'k-1'"),
        2
    );
    refused(
        &c,
        "UPDATE keys SET revoke_reason = 'y' WHERE key_id = 'k-1'",
    );
    refused(
        &c,
        "UPDATE keys SET state = 'used_up', revoke_reason = NULL WHERE key_id = 'k-1'",
    );
}

#[test]
fn a_live_keys_schedule_and_limit_change_only_with_a_higher_version_which_keeps_the_count() {
    let (_d, c) = db();
    key_with_uses(&c, "k-1", KeyState::Active, "c-1", 1, Some(5));
    accepted(
        &c,
        "UPDATE keys SET use_count = use_count + 1 WHERE key_id = 'k-1'",
    );
    for e in [format!("schedule = {SCHEDULE}"), "max_uses = 9".to_owned()] {
        refused(&c, &format!("UPDATE keys SET {e} WHERE key_id = 'k-1'"));
        accepted(
            &c,
            &format!(
                "SAVEPOINT s; UPDATE keys SET {e}, version = version + 1 WHERE key_id = 'k-1'; ROLLBACK TO s; RELEASE s"
            ),
        );
    }
    refused(
        &c,
        "UPDATE keys SET version = 2, use_count = 0 WHERE key_id = 'k-1'",
    );
    // A key ends as it was granted: no new schedule or limit on the way out.
    refused(
        &c,
        &format!(
            "UPDATE keys SET state = 'revoked', revoke_reason = 'x', schedule = {SCHEDULE} WHERE key_id = 'k-1'"
        ),
    );
    refused(
        &c,
        "UPDATE keys SET state = 'expired', max_uses = NULL WHERE key_id = 'k-1'",
    );
    // A version that lowers the limit to the count leaves the key with no
    // use to take; it ends by moving to used_up at that version.
    accepted(
        &c,
        "UPDATE keys SET version = 2, max_uses = 1 WHERE key_id = 'k-1'",
    );
    refused(
        &c,
        "UPDATE keys SET use_count = use_count + 1, state = 'used_up' WHERE key_id = 'k-1'",
    );
    accepted(&c, "UPDATE keys SET state = 'used_up' WHERE key_id = 'k-1'");
}

#[test]
fn a_schedule_is_stored_as_a_list_of_one_to_28_intervals() {
    let (_d, c) = db();
    key(&c, "k-1", KeyState::Active, "c-1", 1);
    let one = r#"{"days":["mon"],"from":"09:00","until":"10:00"}"#;
    let many = |n: usize| format!("'[{}]'", vec![one; n].join(","));
    for bad in [
        "'x'".to_owned(),
        "'[]'".to_owned(),
        format!("'{one}'"),
        "'42'".to_owned(),
        many(29),
    ] {
        refused(
            &c,
            &format!(
                "UPDATE keys SET schedule = {bad}, version = version + 1 WHERE key_id = 'k-1'"
            ),
        );
    }
    accepted(
        &c,
        &format!(
            "UPDATE keys SET schedule = {}, version = version + 1 WHERE key_id = 'k-1'",
            many(28)
        ),
    );
}

#[test]
fn denials_outside_the_schedule_or_out_of_uses_and_used_up_keys_are_audited() {
    let (_d, c) = db();
    let row = |n: u32, kind: &str, reason: &str| {
        format!(
            "INSERT INTO audit (audit_id, at, kind, door, key_id, reason)
             VALUES ('00000000-0000-7000-8000-{n:012}', 1, '{kind}', '101', 'k-1', {reason})"
        )
    };
    accepted(&c, &row(1, "door.denied", "'outside_schedule'"));
    accepted(&c, &row(2, "door.denied", "'used_up'"));
    accepted(&c, &row(3, "key.used_up", "NULL"));
    refused(&c, &row(4, "door.denied", "'out_of_uses'"));
    refused(&c, &row(5, "key.exhausted", "NULL"));
}
