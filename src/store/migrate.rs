//! Schema migrations: an append-only list of SQL files, tracked by SQLite's
//! `user_version` (the count of steps applied).
//!
//! All pending steps run in one transaction: a hub that loses power halfway
//! through an upgrade comes back at the old version, never in between. A
//! database whose version is above the list was written by a newer lockhub
//! and is refused rather than guessed at.

use super::StoreError;
use rusqlite::Connection;
use std::path::Path;

/// Every migration, in order. Append only: a released step is never edited.
pub const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_init", include_str!("../../migrations/0001_init.sql")),
    (
        "0002_link_state",
        include_str!("../../migrations/0002_link_state.sql"),
    ),
    (
        "0004_erasure",
        include_str!("../../migrations/0004_erasure.sql"),
    ),
];

/// The schema version a database is at.
pub fn schema_version(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn.pragma_query_value(None, "user_version", |r| r.get(0))?)
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
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    for (name, sql) in &MIGRATIONS[found as usize..] {
        tx.execute_batch(sql)
            .map_err(|source| StoreError::Migration { name, source })?;
    }
    tx.pragma_update(None, "user_version", known)?;
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order_and_match_their_files() {
        // Strictly increasing; numbers are handed out per change in
        // parallel work, so a branch may skip one another branch holds.
        let numbers: Vec<u32> = MIGRATIONS
            .iter()
            .map(|(name, _)| name.get(..4).and_then(|n| n.parse().ok()).expect(name))
            .collect();
        assert_eq!(numbers.first(), Some(&1));
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
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
}
