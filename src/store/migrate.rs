//! Schema migrations: an append-only list of SQL files, tracked by SQLite's
//! `user_version` (the count of steps applied).
//!
//! All pending steps run in one transaction: a hub that loses power halfway
//! through an upgrade comes back at the old version, never in between. A
//! database whose version is above the list was written by a newer lockhub
//! and is refused rather than guessed at.

use super::StoreError;
use rusqlite::{Connection, OptionalExtension};
use std::path::Path;

/// Every migration, in order. Append only: a released step is never edited.
pub const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_init", include_str!("../../migrations/0001_init.sql")),
    (
        "0002_link_state",
        include_str!("../../migrations/0002_link_state.sql"),
    ),
    (
        "0003_alerts_end",
        include_str!("../../migrations/0003_alerts_end.sql"),
    ),
    (
        "0004_erasure",
        include_str!("../../migrations/0004_erasure.sql"),
    ),
    (
        "0005_door_state_and_flood",
        include_str!("../../migrations/0005_door_state_and_flood.sql"),
    ),
    (
        "0006_osdp_readers",
        include_str!("../../migrations/0006_osdp_readers.sql"),
    ),
    (
        "0007_hub_runtime",
        include_str!("../../migrations/0007_hub_runtime.sql"),
    ),
    (
        "0008_dedupe_result_optional",
        include_str!("../../migrations/0008_dedupe_result_optional.sql"),
    ),
    (
        "0009_checks_without_in_lists",
        include_str!("../../migrations/0009_checks_without_in_lists.sql"),
    ),
    (
        "0010_system_floor",
        include_str!("../../migrations/0010_system_floor.sql"),
    ),
    (
        "0011_link_counters",
        include_str!("../../migrations/0011_link_counters.sql"),
    ),
    (
        "0012_more_guards",
        include_str!("../../migrations/0012_more_guards.sql"),
    ),
    (
        "0013_broker_error",
        include_str!("../../migrations/0013_broker_error.sql"),
    ),
    (
        "0014_schedules_and_uses",
        include_str!("../../migrations/0014_schedules_and_uses.sql"),
    ),
    (
        "0015_mirror_proof",
        include_str!("../../migrations/0015_mirror_proof.sql"),
    ),
    (
        "0016_board_link",
        include_str!("../../migrations/0016_board_link.sql"),
    ),
];

/// The schema version a database is at.
pub fn schema_version(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn.pragma_query_value(None, "user_version", |r| r.get(0))?)
}

/// Whether the database at `path` exists at an older schema than this
/// binary's, so that opening it will run migrations first. Anything else
/// (no file, unreadable, current, too new) is `false`: opening it says what
/// is wrong, or has nothing to migrate.
pub fn pending(path: &Path) -> bool {
    path.exists()
        && Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .ok()
            .and_then(|c| schema_version(&c).ok())
            .is_some_and(|found| found < MIGRATIONS.len() as i64)
}

pub(super) fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let known = MIGRATIONS.len() as i64;
    let found = schema_version(conn)?;
    if found > known {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found,
            known,
        });
    }
    if found == known {
        return Ok(());
    }
    // Foreign keys are off while the steps run, as SQLite's procedure for
    // rebuilding a table asks (a referenced table is dropped and renamed
    // back into place), and checked whole before the commit. The pragma is a
    // no-op inside a transaction, so it is set around it.
    conn.pragma_update(None, "foreign_keys", false)?;
    let started = std::time::Instant::now();
    tracing::info!(
        from = found,
        to = known,
        "migrating the database; doors are served once it commits"
    );
    let result = run_steps(conn, found, known);
    conn.pragma_update(None, "foreign_keys", true)?;
    if result.is_ok() {
        tracing::info!(
            version = known,
            took_ms = started.elapsed().as_millis() as u64,
            "database migrated"
        );
    }
    result
}

fn run_steps(conn: &mut Connection, found: i64, known: i64) -> Result<(), StoreError> {
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    for (name, sql) in &MIGRATIONS[found as usize..known as usize] {
        let before = Dependents::read(&tx)?;
        tx.execute_batch(sql)
            .map_err(|source| StoreError::Migration { name, source })?;
        before
            .restore(&tx)
            .map_err(|source| StoreError::Migration { name, source })?;
    }
    let broken: i64 = tx.query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
        r.get(0)
    })?;
    if broken > 0 {
        return Err(StoreError::BrokenForeignKeys { rows: broken });
    }
    tx.pragma_update(None, "user_version", known)?;
    tx.commit()?;
    Ok(())
}

/// The triggers and indexes on each table, and where each table lives.
///
/// Why: a step that rebuilds a table (SQLite cannot change a CHECK in
/// place) drops every trigger and index on it, also those that steps
/// written on other branches added since; a trigger lost that way is an
/// invariant gone without a word. So every trigger or index that was on a
/// table the step rebuilt (its root page moved) and that the step did not
/// create again is re-created from its original SQL. A step that rebuilds
/// a table and means to lose one of them must drop it in a step of its own.
struct Dependents {
    roots: Vec<(String, i64)>,
    sql: Vec<(String, String, String)>,
}

impl Dependents {
    fn read(conn: &Connection) -> Result<Self, StoreError> {
        let roots = conn
            .prepare("SELECT name, rootpage FROM sqlite_master WHERE type = 'table'")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let sql = conn
            .prepare(
                "SELECT name, tbl_name, sql FROM sqlite_master
                  WHERE type IN ('trigger', 'index') AND sql IS NOT NULL",
            )?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?;
        Ok(Dependents { roots, sql })
    }

    fn restore(&self, conn: &Connection) -> rusqlite::Result<()> {
        let root = |table: &str| -> rusqlite::Result<Option<i64>> {
            conn.query_row(
                "SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [table],
                |r| r.get(0),
            )
            .optional()
        };
        for (name, table, sql) in &self.sql {
            let was = self.roots.iter().find(|(t, _)| t == table).map(|(_, r)| *r);
            let rebuilt = match (was, root(table)?) {
                (Some(a), Some(b)) => a != b,
                _ => false,
            };
            let exists: bool = conn.query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE name = ?1)",
                [name],
                |r| r.get(0),
            )?;
            if rebuilt && !exists {
                conn.execute_batch(sql)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_rebuilt_by_a_step_keeps_the_triggers_and_indexes_the_step_does_not_recreate() {
        let mut c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE t (a INTEGER CHECK (a < 10));
             CREATE INDEX t_a ON t (a);
             CREATE TRIGGER t_guard BEFORE INSERT ON t WHEN NEW.a = 5
             BEGIN SELECT RAISE(ABORT, 'five'); END;
             CREATE TRIGGER t_mine BEFORE INSERT ON t WHEN NEW.a = 6
             BEGIN SELECT RAISE(ABORT, 'six'); END;
             CREATE TABLE other (x);
             CREATE TRIGGER other_gone BEFORE INSERT ON other BEGIN SELECT 1; END;",
        )
        .unwrap();
        let tx = c.transaction().unwrap();
        let before = Dependents::read(&tx).unwrap();
        // A rebuild that widens the CHECK and re-creates only its own trigger;
        // and a deliberate drop on a table that is not rebuilt.
        tx.execute_batch(
            "CREATE TABLE t_new (a INTEGER CHECK (a < 100));
             INSERT INTO t_new SELECT a FROM t;
             DROP TABLE t;
             ALTER TABLE t_new RENAME TO t;
             CREATE TRIGGER t_mine BEFORE INSERT ON t WHEN NEW.a = 7
             BEGIN SELECT RAISE(ABORT, 'seven'); END;
             DROP TRIGGER other_gone;",
        )
        .unwrap();
        before.restore(&tx).unwrap();
        let names: Vec<String> = tx
            .prepare(
                "SELECT name FROM sqlite_master WHERE type IN ('trigger', 'index') ORDER BY name",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(names, ["t_a", "t_guard", "t_mine"]);
        assert!(
            tx.execute("INSERT INTO t VALUES (5)", []).is_err(),
            "the lost guard is back"
        );
        tx.execute("INSERT INTO t VALUES (6)", []).unwrap();
        assert!(
            tx.execute("INSERT INTO t VALUES (7)", []).is_err(),
            "the step's own trigger stands"
        );
        tx.execute("INSERT INTO t VALUES (50)", []).unwrap();
    }

    #[test]
    fn migrations_are_numbered_in_order_and_match_their_files() {
        // The schema version is the count of steps run, so the numbers run
        // 1, 2, 3, ... with no gap: file N is step N.
        for (i, (name, _)) in MIGRATIONS.iter().enumerate() {
            assert!(name.starts_with(&format!("{:04}_", i + 1)), "{name}");
        }
        let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
            .unwrap()
            .count();
        assert_eq!(
            files,
            MIGRATIONS.len(),
            "every file in migrations/ is listed"
        );
    }

    #[test]
    fn a_version_2_database_keeps_its_audit_outbox_and_alerts_through_the_rebuild_of_0003() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let mut c = Connection::open(&path).unwrap();
        c.pragma_update(None, "foreign_keys", true).unwrap();
        migrate_through(&mut c, "0002_link_state");
        let id = "0190f000-0000-7000-8000-000000000001";
        c.execute_batch(&format!(
            "INSERT INTO audit (audit_id, at, kind, door, reason) VALUES ('{id}', 5, 'door.denied', '101', 'unknown_pin');
             INSERT INTO outbox (topic, body, audit_id, created_at) VALUES ('audit', x'7b7d', '{id}', 5);
             INSERT INTO alerts VALUES ('tamper', 'board-a', '{id}', 'raised', 1, 5, 5, 5);
             UPDATE sqlite_sequence SET seq = 41 WHERE name = 'audit';"
        ))
        .unwrap();
        migrate(&mut c, &path).unwrap();
        assert_eq!(schema_version(&c).unwrap(), MIGRATIONS.len() as i64);
        let fk: bool = c
            .pragma_query_value(None, "foreign_keys", |r| r.get(0))
            .unwrap();
        assert!(fk, "foreign keys are back on");
        let kept: (i64, i64, i64) = c
            .query_row(
                "SELECT (SELECT count(*) FROM audit WHERE audit_id = ?1 AND reason = 'unknown_pin'),
                        (SELECT count(*) FROM outbox WHERE audit_id = ?1),
                        (SELECT count(*) FROM alerts WHERE condition = 'tamper' AND state = 'raised')",
                [id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .unwrap();
        assert_eq!(kept, (1, 1, 1));
        // The new kinds and conditions fit; seqnos are never reused.
        c.execute(
            "INSERT INTO audit (audit_id, at, kind, door, reason, condition)
             VALUES ('0190f000-0000-7000-8000-000000000002', 6, 'alert.cleared', 'board-a', 'fixed', 'tamper')",
            [],
        )
        .unwrap();
        let seqno: i64 = c
            .query_row("SELECT max(seqno) FROM audit", [], |r| r.get(0))
            .unwrap();
        assert_eq!(seqno, 42);
        c.execute(
            "INSERT INTO alerts VALUES ('keypad_flood', '101', ?1, 'raised', 1, 5, 5, 5)",
            [id],
        )
        .unwrap();
        // The rebuilt audit table is as immutable as before.
        assert!(c.execute("UPDATE audit SET reason = 'x'", []).is_err());
        assert!(
            c.execute("INSERT INTO outbox (topic, body, audit_id, created_at) VALUES ('audit', x'00', 'nope', 1)", [])
                .is_err(),
            "the outbox still refers to the audit table"
        );
    }

    #[test]
    fn a_failing_step_leaves_the_database_at_its_old_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let mut c = Connection::open(&path).unwrap();
        // A table the first migration also creates makes it fail halfway.
        c.execute_batch("CREATE TABLE audit (x)").unwrap();
        assert!(migrate(&mut c, &path).is_err());
        assert_eq!(schema_version(&c).unwrap(), 0);
        let policy: i64 = c
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'policy'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(policy, 0, "nothing of the failed step stays");
    }

    #[test]
    fn rebuilding_audit_and_outbox_keeps_every_row_its_ids_and_the_id_high_water_mark() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let mut c = Connection::open(&path).unwrap();
        c.pragma_update(None, "foreign_keys", true).unwrap();
        // A hub at version 2 with an audit row, its outbox entry, a pruned
        // newer outbox entry and a raised alert.
        migrate_through(&mut c, "0002_link_state");
        c.execute_batch(
            "INSERT INTO audit (audit_id, at, kind, door) VALUES ('00000000-0000-7000-8000-000000000001', 1, 'door.forced', '101');
             INSERT INTO outbox (topic, body, audit_id, created_at) VALUES ('audit', x'7b7d', '00000000-0000-7000-8000-000000000001', 1);
             INSERT INTO outbox (topic, body, created_at, sent_at) VALUES ('alerts', x'7b7d', 2, 3);
             DELETE FROM outbox WHERE id = 2;
             INSERT INTO alerts VALUES ('door_forced', '101', '00000000-0000-4000-8000-000000000001', 'raised', 1, 1, 1, 1);",
        )
        .unwrap();
        migrate(&mut c, &path).unwrap();
        let n = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
        assert_eq!(
            n("SELECT count(*) FROM audit WHERE seqno = 1 AND kind = 'door.forced'"),
            1
        );
        assert_eq!(
            n("SELECT count(*) FROM outbox WHERE id = 1 AND audit_id IS NOT NULL"),
            1
        );
        assert_eq!(n("SELECT count(*) FROM alerts WHERE state = 'raised'"), 1);
        assert_eq!(
            n("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'"),
            2
        );
        assert_eq!(
            n("SELECT count(*) FROM pragma_foreign_key_check"),
            0,
            "no dangling reference"
        );
        // The rules came back with the tables.
        assert!(c.execute("UPDATE audit SET door = 'x'", []).is_err());
        assert!(c.execute("DELETE FROM outbox WHERE id = 1", []).is_err());
        assert!(
            c.execute(
                "INSERT INTO outbox (topic, body, audit_id, created_at) VALUES ('audit', x'00', 'nope', 1)",
                []
            )
            .is_err(),
            "the foreign key holds"
        );
        c.execute(
            "INSERT INTO outbox (topic, body, created_at) VALUES ('alerts', x'00', 4)",
            [],
        )
        .unwrap();
        assert_eq!(
            n("SELECT max(id) FROM outbox"),
            3,
            "a pruned id is never reused"
        );
        // The new kind carries its count, and only it.
        c.execute_batch(
            "INSERT INTO audit (audit_id, at, kind, door, count) VALUES ('00000000-0000-7000-8000-000000000002', 2, 'door.flood', '101', 9);",
        )
        .unwrap();
        assert!(
            c.execute(
                "INSERT INTO audit (audit_id, at, kind, door) VALUES ('00000000-0000-7000-8000-000000000003', 2, 'door.flood', '101')",
                []
            )
            .is_err()
        );
        c.execute(
            "INSERT INTO alerts VALUES ('keypad_flood', '101', '00000000-0000-4000-8000-000000000002', 'raised', 9, 1, 1, 1)",
            [],
        )
        .unwrap();
    }

    /// Brings a database to the version after `step`, step by step as a
    /// hub of that version was migrated.
    fn migrate_through(c: &mut Connection, step: &str) {
        let version = MIGRATIONS.iter().position(|(n, _)| *n == step).unwrap() + 1;
        let found = schema_version(c).unwrap();
        c.pragma_update(None, "foreign_keys", false).unwrap();
        run_steps(c, found, version as i64).unwrap();
        c.pragma_update(None, "foreign_keys", true).unwrap();
    }

    /// Every trigger's and index's (name, SQL), by name.
    fn triggers_and_indexes(c: &Connection) -> Vec<(String, String)> {
        c.prepare(
            "SELECT name, sql FROM sqlite_master
              WHERE type IN ('trigger', 'index') AND sql IS NOT NULL ORDER BY name",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
    }

    /// The opcodes of a statement's main program (not its triggers').
    fn opcodes(c: &Connection, sql: &str) -> Vec<String> {
        let mut stmt = c.prepare(&format!("EXPLAIN {sql}")).unwrap();
        let mut rows = stmt.raw_query();
        let mut ops = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            ops.push(row.get(1).unwrap());
        }
        ops
    }

    #[test]
    fn the_checks_said_without_in_lists_keep_every_row_rule_and_id_and_build_no_temporary_index() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let mut c = Connection::open(&path).unwrap();
        c.pragma_update(None, "foreign_keys", true).unwrap();
        migrate_through(&mut c, "0008_dedupe_result_optional");
        let key = "INSERT INTO keys (key_id, version, state, check_in_id, valid_from, valid_until,
                                     pin_tag, pin_key_id, updated_at)
                   VALUES (?1, 1, ?2, 'c-1', 1, 2, zeroblob(32), 'k1', 1)";
        let audit =
            "INSERT INTO audit (audit_id, at, kind, door, reason) VALUES (?1, 5, ?2, '101', ?3)";
        let dedupe =
            "INSERT INTO dedupe (site_id, event_id, body_sha256, outcome, reason, received_at)
                      VALUES ('s', ?1, zeroblob(32), ?2, ?3, 1)";
        let before = triggers_and_indexes(&c);
        for sql in [key, audit, dedupe] {
            assert!(
                opcodes(&c, sql).iter().any(|op| op == "OpenEphemeral"),
                "before 0009 each insert builds its CHECK's list"
            );
        }
        c.execute(key, ["k-1", "active"]).unwrap();
        c.execute(
            "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES ('k-1', '101', zeroblob(32), 1)",
            [],
        )
        .unwrap();
        let id = |n: u32| format!("00000000-0000-7000-8000-{n:012}");
        c.execute(
            audit,
            rusqlite::params![id(1), "door.denied", "unknown_pin"],
        )
        .unwrap();
        c.execute_batch("UPDATE sqlite_sequence SET seq = 41 WHERE name = 'audit'")
            .unwrap();
        c.execute(dedupe, rusqlite::params![id(2), "rejected", "bad_seq"])
            .unwrap();

        migrate_through(&mut c, "0009_checks_without_in_lists");
        let after = triggers_and_indexes(&c);
        assert_eq!(
            after, before,
            "every trigger and index is back, word for word"
        );
        let n = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
        assert_eq!(
            n("SELECT count(*) FROM keys WHERE key_id = 'k-1' AND state = 'active'"),
            1
        );
        assert_eq!(
            n("SELECT count(*) FROM key_doors WHERE key_id = 'k-1' AND live = 1"),
            1
        );
        assert_eq!(
            n("SELECT count(*) FROM audit WHERE seqno = 1 AND reason = 'unknown_pin'"),
            1
        );
        assert_eq!(
            n("SELECT count(*) FROM dedupe WHERE outcome = 'rejected'"),
            1
        );
        assert_eq!(n("SELECT count(*) FROM pragma_foreign_key_check"), 0);

        for sql in [key, audit, dedupe] {
            let ops = opcodes(&c, sql);
            assert!(
                !ops.iter().any(|op| op == "OpenEphemeral"),
                "{sql}: {ops:?}"
            );
        }
        // The same values pass and fail as before.
        c.execute(key, ["k-2", "pre_issued"]).unwrap();
        assert!(c.execute(key, ["k-3", "Active"]).is_err());
        assert!(c.execute(key, ["k-3", "lost"]).is_err());
        c.execute(
            audit,
            rusqlite::params![id(3), "key.expired", None::<String>],
        )
        .unwrap();
        assert!(
            c.execute(
                audit,
                rusqlite::params![id(4), "door.opened", None::<String>]
            )
            .is_err()
        );
        assert!(
            c.execute(audit, rusqlite::params![id(4), "door.denied", "no_reason"])
                .is_err()
        );
        c.execute(
            audit,
            rusqlite::params![id(4), "door.denied", "storage_failure"],
        )
        .unwrap();
        assert_eq!(
            n("SELECT max(seqno) FROM audit"),
            43,
            "seqnos go on from the high-water mark"
        );
        assert!(
            c.execute(dedupe, rusqlite::params![id(5), "maybe", None::<String>])
                .is_err()
        );
        c.execute(dedupe, rusqlite::params![id(5), "noop", None::<String>])
            .unwrap();
        // And the rules on the rebuilt tables hold.
        assert!(c.execute("UPDATE audit SET door = 'x'", []).is_err());
        assert!(
            c.execute(
                "UPDATE keys SET state = 'pre_issued' WHERE key_id = 'k-1'",
                []
            )
            .is_err()
        );
        assert!(
            c.execute("UPDATE dedupe SET outcome = 'applied', reason = NULL", [])
                .is_err()
        );
    }

    #[test]
    fn the_system_floor_of_a_migrated_hub_starts_an_hour_below_its_old_floor() {
        use crate::clock::{Clock, Trust};
        use lockhub_proto::time::Timestamp;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let mut c = Connection::open(&path).unwrap();
        migrate_through(&mut c, "0009_checks_without_in_lists");
        // The old floor holds the cloud's lead of 40 s over the hub's clock.
        let old = Timestamp::from_secs(1_800_000_040);
        c.execute("UPDATE time_floor SET floor = ?1", [old.0])
            .unwrap();
        migrate(&mut c, &path).unwrap();
        let floors = crate::store::floor::load(&c).unwrap();
        assert_eq!(floors.effective, old, "the effective floor is kept");
        assert_eq!(floors.system, old.saturating_add_secs(-3600));
        let clock = Clock::start(floors);
        let system = Timestamp::from_secs(1_800_000_010);
        assert_eq!(
            clock.trust(system, std::time::Duration::ZERO),
            Trust::Trusted
        );
        assert_eq!(clock.peek(system, std::time::Duration::ZERO), old);
        // A clock a day stale is not.
        assert!(matches!(
            clock.trust(old.saturating_add_days(-1), std::time::Duration::ZERO),
            Trust::SystemBehindFloor { .. }
        ));
        // A fresh database's floors stay at zero.
        let fresh = dir.path().join("fresh.db");
        let mut f = Connection::open(&fresh).unwrap();
        migrate(&mut f, &fresh).unwrap();
        assert_eq!(
            crate::store::floor::load(&f).unwrap(),
            crate::clock::Floors::default()
        );
    }
}
