//! Helpers shared by the integration tests: a real database in a tempdir,
//! and keys inserted with plain SQL that respects the schema's triggers.

use lockhub::config::{PinKey, Policy};
use lockhub::crypto::pin_tag;
use lockhub::door::pin_tags;
use lockhub::store::door::{DoorEntry, DoorOutcome, door_entry};
use lockhub::store::{Priority, Store};
use lockhub::time::Timestamp;
use rusqlite::{Connection, params};

pub const T0: i64 = 1_800_000_000;

pub fn t(s: i64) -> Timestamp {
    Timestamp::from_secs(T0 + s)
}

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
    pub fn open() -> Db {
        let dir = tempfile::tempdir().unwrap();
        let policy = Policy::default();
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
        f: impl FnOnce(&Connection) -> Result<T, lockhub::store::StoreError> + Send + 'static,
    ) -> T {
        self.store.write_blocking(Priority::Bulk, f).unwrap()
    }

    /// A keypad entry at a configured door.
    pub fn enter(&self, door: &str, pin: &str, at: Timestamp) -> DoorOutcome {
        self.enter_raw(door, true, pin.as_bytes(), at)
    }

    pub fn enter_raw(&self, door: &str, known: bool, pin: &[u8], at: Timestamp) -> DoorOutcome {
        let entry = DoorEntry {
            door: door.into(),
            door_known: known,
            tags: pin_tags(pin, &pin_keys()),
            at,
        };
        let policy = self.policy;
        self.store
            .write_blocking(Priority::Door, move |c| door_entry(c, &entry, &policy))
            .unwrap()
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.reader().query_row(sql, [], |r| r.get(0)).unwrap()
    }
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

/// Inserts a key and its doors; a final key is inserted live and then moved,
/// as the schema demands of a real key's history.
pub fn insert_key(c: &Connection, k: &K) -> rusqlite::Result<()> {
    let key = &pin_keys()[k.pin_key];
    let tag = pin_tag(&key.secret, k.pin.as_bytes());
    let live_state = if k.state == "pre_issued" {
        "pre_issued"
    } else {
        "active"
    };
    c.execute(
        "INSERT INTO keys (key_id, version, state, check_in_id, reservation_id, valid_from,
                           valid_until, pin_tag, pin_key_id, holder_ref, holder_name,
                           revoke_reason, event_id, updated_at)
         VALUES (?1, 1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'Guest Name', NULL, NULL, ?5)",
        params![
            k.id,
            live_state,
            format!("c-{}", k.id),
            format!("r-{}", k.id),
            k.from.0,
            k.until.0,
            &tag[..],
            key.id,
            format!("g-{}", k.id)
        ],
    )?;
    for door in &k.doors {
        c.execute(
            "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES (?1, ?2, ?3, 1)",
            params![k.id, door, &tag[..]],
        )?;
    }
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
