//! A real database in a tempdir, keys inserted with plain SQL that
//! respects the schema's triggers, and the PIN keys those keys are under.

use lockhub::config::{PinKey, Policy};
use lockhub::door::pin_tags;
use lockhub::store::door::{DoorEntry, DoorOutcome, door_entry};
use lockhub::store::{Priority, Store};
use lockhub_proto::crypto::pin_tag;
use lockhub_proto::time::Timestamp;
use rusqlite::{Connection, params};

pub const T0: i64 = 1_800_000_000;

pub fn t(s: i64) -> Timestamp {
    Timestamp::from_secs(T0 + s)
}

/// The hub's PIN keys in these tests (`k1`, `k2`).
pub fn pin_keys() -> Vec<PinKey> {
    vec![
        PinKey {
            id: "k1".into(),
            secret: [1; 32],
        },
        PinKey {
            id: "k2".into(),
            secret: [2; 32],
        },
    ]
}

pub struct Db {
    pub dir: tempfile::TempDir,
    pub store: Store,
    pub policy: Policy,
}

impl Db {
    /// A new store under the default policy.
    pub fn open() -> Db {
        Db::open_with(Policy::default())
    }

    pub fn open_with(policy: Policy) -> Db {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("lockhub.db"), &policy).unwrap();
        Db { dir, store, policy }
    }

    pub fn reopen(self) -> Db {
        let Db { dir, store, policy } = self;
        store.close();
        let store = Store::open(&dir.path().join("lockhub.db"), &policy).unwrap();
        Db { dir, store, policy }
    }

    pub fn reader(&self) -> Connection {
        self.store.reader().unwrap()
    }

    /// Runs `f` on the writer and waits for its commit.
    pub fn write<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, lockhub::store::error::StoreError> + Send + 'static,
    ) -> T {
        self.store.write_blocking(Priority::Bulk, f).unwrap()
    }

    /// A keypad entry at a configured door.
    pub fn enter(&self, door: &str, pin: &str, at: Timestamp) -> DoorOutcome {
        self.enter_raw(door, true, pin.as_bytes(), at)
    }

    pub fn enter_raw(&self, door: &str, known: bool, pin: &[u8], at: Timestamp) -> DoorOutcome {
        self.enter_in(&jiff::tz::TimeZone::UTC, door, known, pin, at)
    }

    /// A keypad entry decided in the hub time zone `zone` (key schedules
    /// are read in it); [`Db::enter`] uses UTC.
    pub fn enter_in(
        &self,
        zone: &jiff::tz::TimeZone,
        door: &str,
        known: bool,
        pin: &[u8],
        at: Timestamp,
    ) -> DoorOutcome {
        let entry = DoorEntry {
            door: door.into(),
            door_known: known,
            tags: pin_tags(pin, &pin_keys()),
            at,
        };
        let (policy, zone) = (self.policy, zone.clone());
        self.store
            .write_blocking(Priority::Door, move |c| {
                door_entry(c, &entry, &policy, &zone)
            })
            .unwrap()
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.reader().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// Audit rows as `kind[/reason]@door`, oldest first.
    pub fn audit(&self) -> Vec<String> {
        let r = self.reader();
        let mut stmt = r
            .prepare("SELECT kind, reason, door FROM audit ORDER BY seqno")
            .unwrap();
        stmt.query_map([], |row| {
            let kind: String = row.get(0)?;
            let reason: Option<String> = row.get(1)?;
            let door: Option<String> = row.get(2)?;
            Ok(match reason {
                Some(r) => format!("{kind}/{r}@{}", door.unwrap_or_default()),
                None => format!("{kind}@{}", door.unwrap_or_default()),
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    }

    /// The `links` row of a port: (state, board_id), as `lockhub status` reads it.
    pub fn link(&self, serial: &str) -> Option<(String, Option<i64>)> {
        self.reader()
            .query_row(
                "SELECT state, board_id FROM links WHERE serial = ?1",
                [serial],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .ok()
    }

    /// Whether (condition, subject) is raised.
    pub fn raised(&self, condition: &str, subject: &str) -> bool {
        raised(&self.reader(), condition, subject)
    }

    /// An active key `id` with `pin` (under `k1`) for `doors`, valid from
    /// an hour ago for a day, inserted on the writer.
    pub async fn add_key(&self, id: &'static str, pin: &'static str, doors: &[&'static str]) {
        let now = Timestamp::now_system();
        let key = K {
            from: now.saturating_add_secs(-3600),
            until: now.saturating_add_secs(86_400),
            ..K::active(id, pin, doors)
        };
        self.store
            .write(Priority::Bulk, move |c| Ok(insert_key(c, &key)?))
            .await
            .unwrap();
    }

    /// Makes every audit insert fail, as a full or failing disk would.
    pub async fn break_audit(&self) {
        self.store
            .write(Priority::Bulk, |c| {
                c.execute_batch(
                    "CREATE TRIGGER test_disk_full BEFORE INSERT ON audit
                     BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
                )?;
                Ok(())
            })
            .await
            .unwrap();
    }

    /// Undoes [`Db::break_audit`]: audit inserts go through again.
    pub async fn mend_audit(&self) {
        self.store
            .write(Priority::Bulk, |c| {
                c.execute_batch("DROP TRIGGER test_disk_full")?;
                Ok(())
            })
            .await
            .unwrap();
    }
}

/// Deletes a key row by hand, as someone with the database file and the
/// sqlite3 shell could: past the guard that keeps live keys
/// (`keys_delete_guard`, put back afterwards), in one transaction on a
/// connection of its own to the file at `path`.
pub fn delete_key_by_hand(path: &std::path::Path, key_id: &str) {
    let w = Connection::open(path).unwrap();
    w.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    let guard: String = w
        .query_row(
            "SELECT sql FROM sqlite_master WHERE name = 'keys_delete_guard'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    w.execute_batch("PRAGMA foreign_keys = ON; BEGIN IMMEDIATE; DROP TRIGGER keys_delete_guard;")
        .unwrap();
    w.execute("DELETE FROM keys WHERE key_id = ?1", [key_id])
        .unwrap();
    w.execute_batch(&guard).unwrap();
    w.execute_batch("COMMIT").unwrap();
}

/// Whether the alert (condition, subject) is raised in the database `c`.
pub fn raised(c: &Connection, condition: &str, subject: &str) -> bool {
    c.query_row(
        "SELECT count(*) FROM alerts WHERE condition = ?1 AND subject = ?2 AND state = 'raised'",
        [condition, subject],
        |r| r.get::<_, i64>(0),
    )
    .unwrap()
        == 1
}

/// A key as the tests insert it.
#[derive(Clone)]
pub struct K {
    pub id: &'static str,
    pub state: &'static str,
    pub pin: &'static str,
    pub pin_key: usize,
    pub doors: Vec<&'static str>,
    pub from: Timestamp,
    pub until: Timestamp,
}

impl K {
    pub fn active(id: &'static str, pin: &'static str, doors: &[&'static str]) -> K {
        K {
            id,
            state: "active",
            pin,
            pin_key: 0,
            doors: doors.to_vec(),
            from: t(-3600),
            until: t(3600),
        }
    }
}

/// One `keys` row and its live `key_doors` rows, as plain SQL writes them
/// (version 1, no event): the one `INSERT INTO keys` of the fixtures.
#[derive(Debug, Clone, Copy)]
pub struct KeyRow<'a> {
    pub id: &'a str,
    /// Inserted as given: `active` or `pre_issued` for a live key (the
    /// schema's triggers decide what else it takes).
    pub state: &'a str,
    pub check_in_id: Option<&'a str>,
    pub reservation_id: Option<&'a str>,
    pub valid_from: Timestamp,
    pub valid_until: Timestamp,
    pub pin_tag: [u8; 32],
    pub pin_key_id: &'a str,
    pub holder_ref: Option<&'a str>,
    pub holder_name: Option<&'a str>,
    pub revoke_reason: Option<&'a str>,
    pub updated_at: Timestamp,
    pub doors: &'a [&'a str],
}

/// Inserts `r` with cached statements, so a bulk load (a benchmark's
/// million keys in one transaction) prepares each statement once.
pub fn insert_row(c: &Connection, r: &KeyRow<'_>) -> rusqlite::Result<()> {
    c.prepare_cached(
        "INSERT INTO keys (key_id, version, state, check_in_id, reservation_id, valid_from,
                           valid_until, pin_tag, pin_key_id, holder_ref, holder_name,
                           revoke_reason, event_id, updated_at)
         VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, NULL, ?12)",
    )?
    .execute(params![
        r.id,
        r.state,
        r.check_in_id,
        r.reservation_id,
        r.valid_from.0,
        r.valid_until.0,
        &r.pin_tag[..],
        r.pin_key_id,
        r.holder_ref,
        r.holder_name,
        r.revoke_reason,
        r.updated_at.0
    ])?;
    let mut door = c.prepare_cached(
        "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES (?1, ?2, ?3, 1)",
    )?;
    for d in r.doors {
        door.execute(params![r.id, d, &r.pin_tag[..]])?;
    }
    Ok(())
}

/// Moves live key `key_id` to its next version with `max_uses` and a
/// `schedule` (the wire's JSON), as a grant carrying them writes the row;
/// the use count stays.
pub fn regrant(
    c: &Connection,
    key_id: &str,
    max_uses: Option<u32>,
    schedule: Option<&str>,
) -> rusqlite::Result<()> {
    c.execute(
        "UPDATE keys SET version = version + 1, max_uses = ?2, schedule = ?3 WHERE key_id = ?1",
        params![key_id, max_uses, schedule],
    )?;
    Ok(())
}

/// Inserts a key and its doors; a final key is inserted live and then moved,
/// as the schema demands of a real key's history.
pub fn insert_key(c: &Connection, k: &K) -> rusqlite::Result<()> {
    let key = &pin_keys()[k.pin_key];
    let live_state = if k.state == "pre_issued" {
        "pre_issued"
    } else {
        "active"
    };
    let (check_in, reservation, holder) = (
        format!("c-{}", k.id),
        format!("r-{}", k.id),
        format!("g-{}", k.id),
    );
    insert_row(
        c,
        &KeyRow {
            id: k.id,
            state: live_state,
            check_in_id: Some(&check_in),
            reservation_id: Some(&reservation),
            valid_from: k.from,
            valid_until: k.until,
            pin_tag: pin_tag(&key.secret, k.pin.as_bytes()),
            pin_key_id: &key.id,
            holder_ref: Some(&holder),
            holder_name: Some("Guest Name"),
            revoke_reason: None,
            updated_at: k.from,
            doors: &k.doors,
        },
    )?;
    match k.state {
        "revoked" => c.execute(
            "UPDATE keys SET state = 'revoked', revoke_reason = 'test' WHERE key_id = ?1",
            [k.id],
        )?,
        "expired" => c.execute(
            "UPDATE keys SET state = 'expired' WHERE key_id = ?1",
            [k.id],
        )?,
        _ => 0,
    };
    Ok(())
}

pub fn insert(db: &Db, keys: &[K]) {
    let keys = keys.to_vec();
    db.write(move |c| {
        for k in &keys {
            insert_key(c, k)?;
        }
        Ok(())
    });
}
