//! [`Store`] on one SQLite file: WAL, `synchronous=FULL` (a committed event
//! survives power loss), foreign keys on, and every write in `BEGIN
//! IMMEDIATE`, so two processes that mint at once queue on SQLite's write
//! lock instead of both reading the same `next_seq`. The file is created
//! with mode 0600: it holds the hubs' PIN keys.

use super::*;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// Every migration, in order. Append only: a released step is never edited.
const MIGRATIONS: &[(&str, &str)] = &[
    ("0001_init", include_str!("../../migrations/0001_init.sql")),
    (
        "0002_mirror_claim",
        include_str!("../../migrations/0002_mirror_claim.sql"),
    ),
];

/// How long a writer waits for another process's transaction (a hundred
/// concurrent `issue` runs queue here).
const BUSY_TIMEOUT: Duration = Duration::from_secs(120);

pub struct SqliteStore {
    conn: Mutex<Connection>,
}

fn b(v: bool) -> i64 {
    i64::from(v)
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn constraint(e: &rusqlite::Error) -> Option<String> {
    match e {
        rusqlite::Error::SqliteFailure(f, msg)
            if f.code == rusqlite::ErrorCode::ConstraintViolation =>
        {
            Some(msg.clone().unwrap_or_default())
        }
        _ => None,
    }
}

impl SqliteStore {
    /// Opens (creating when `create`) the database at `path` and brings its
    /// schema up to date. Without `create`, a missing file is
    /// [`StoreError::NotInitialised`].
    pub fn open(path: &Path, create: bool) -> Result<Self, StoreError> {
        let io = |source| StoreError::Io {
            path: path.to_owned(),
            source,
        };
        if !path.exists() {
            if !create {
                return Err(StoreError::NotInitialised);
            }
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(io)?;
            }
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                .map_err(io)?;
        }
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", true)?;
        migrate(&mut conn, path)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        // A panic while holding the lock leaves a connection whose
        // transaction rusqlite rolled back on drop: still usable.
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut conn)
    }

    fn write<T>(
        &self,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        self.with(|conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        })
    }
}

fn migrate(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let known = MIGRATIONS.len() as i64;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if found > known {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found,
            known,
        });
    }
    for (name, sql) in &MIGRATIONS[found as usize..] {
        tx.execute_batch(sql)
            .map_err(|source| StoreError::Migration { name, source })?;
    }
    tx.pragma_update(None, "user_version", known)?;
    tx.commit()?;
    Ok(())
}

fn hub_exists(tx: &Connection, hub: &HubRef) -> Result<bool, StoreError> {
    Ok(tx
        .query_row(
            "SELECT 1 FROM hubs WHERE site_id = ?1 AND hub_id = ?2",
            params![hub.site_id, hub.hub_id],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

fn read_hub(conn: &Connection, hub: &HubRef) -> Result<Option<HubRecord>, StoreError> {
    let Some((public_key, next_seq)) = conn
        .query_row(
            "SELECT public_key, next_seq FROM hubs WHERE site_id = ?1 AND hub_id = ?2",
            params![hub.site_id, hub.hub_id],
            |r| Ok((r.get::<_, Option<String>>(0)?, r.get::<_, i64>(1)?)),
        )
        .optional()?
    else {
        return Ok(None);
    };
    let mut st = conn.prepare_cached(
        "SELECT name FROM hub_doors WHERE site_id = ?1 AND hub_id = ?2 ORDER BY name",
    )?;
    let doors = st
        .query_map(params![hub.site_id, hub.hub_id], |r| r.get(0))?
        .collect::<Result<Vec<String>, _>>()?;
    let mut st = conn.prepare_cached(
        "SELECT id, secret FROM pin_keys WHERE site_id = ?1 AND hub_id = ?2 ORDER BY position",
    )?;
    let pin_keys = st
        .query_map(params![hub.site_id, hub.hub_id], |r| {
            let secret: Vec<u8> = r.get(1)?;
            Ok(PinKey {
                id: r.get(0)?,
                secret: secret.try_into().unwrap_or([0; 32]),
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(HubRecord {
        hub: hub.clone(),
        public_key,
        doors,
        pin_keys,
        next_seq: u(next_seq),
    }))
}

const KEY_COLUMNS: &str = "key_id, version, state, check_in_id, reservation_id, doors, \
                           valid_from, valid_until, holder_ref, seq";

fn key_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<KeyRecord> {
    let doors: String = r.get(5)?;
    Ok(KeyRecord {
        key_id: r.get(0)?,
        version: u(r.get(1)?),
        state: r.get(2)?,
        check_in_id: r.get(3)?,
        reservation_id: r.get(4)?,
        doors: serde_json::from_str(&doors).unwrap_or_default(),
        valid_from: r.get(6)?,
        valid_until: r.get(7)?,
        holder_ref: r.get(8)?,
        seq: u(r.get(9)?),
    })
}

fn insert_key(
    tx: &Connection,
    hub: &HubRef,
    key: &KeyRecord,
    seq: u64,
    item: Option<usize>,
) -> Result<(), StoreError> {
    let doors = serde_json::to_string(&key.doors).unwrap_or_else(|_| "[]".into());
    tx.execute(
        "INSERT INTO keys (site_id, hub_id, key_id, version, state, check_in_id, \
         reservation_id, doors, valid_from, valid_until, holder_ref, seq, grant_seq, grant_item) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?12, ?13)",
        params![
            hub.site_id,
            hub.hub_id,
            key.key_id,
            i(key.version),
            key.state,
            key.check_in_id,
            key.reservation_id,
            doors,
            key.valid_from,
            key.valid_until,
            key.holder_ref,
            i(seq),
            item.map(|n| n as i64)
        ],
    )
    .map_err(|e| match constraint(&e) {
        Some(m) if m.contains("keys.key_id") => StoreError::KeyExists(key.key_id.clone()),
        Some(m) if m.contains("keys.check_in_id") => {
            StoreError::ActiveKeyExists(key.check_in_id.clone().unwrap_or_default())
        }
        _ => StoreError::Sqlite(e),
    })?;
    Ok(())
}

fn apply_change(
    tx: &Connection,
    hub: &HubRef,
    change: &KeyChange,
    seq: u64,
    item: Option<usize>,
) -> Result<(), StoreError> {
    match change {
        KeyChange::None => {}
        KeyChange::Insert(key) => insert_key(tx, hub, key, seq, item)?,
        KeyChange::Reissue { key_id, version } => {
            // Marked until its result comes: a repair's `noop` means the
            // hub holds the key final (grant_outcome).
            tx.execute(
                "UPDATE keys SET version = ?4, seq = ?5, grant_seq = ?5, grant_item = ?6, \
                 hub_outcome = 'reissued', hub_valid_until = NULL \
                 WHERE site_id = ?1 AND hub_id = ?2 AND key_id = ?3 AND state <> 'revoked'",
                params![
                    hub.site_id,
                    hub.hub_id,
                    key_id,
                    i(*version),
                    i(seq),
                    item.map(|n| n as i64)
                ],
            )?;
        }
        KeyChange::Revoke { key_id } => {
            tx.execute(
                "UPDATE keys SET state = 'revoked', seq = ?4 \
                 WHERE site_id = ?1 AND hub_id = ?2 AND key_id = ?3 AND state <> 'revoked'",
                params![hub.site_id, hub.hub_id, key_id, i(seq)],
            )?;
        }
        KeyChange::CheckIn {
            reservation_id,
            key,
        } => {
            tx.execute(
                "UPDATE keys SET state = 'revoked', seq = ?4 WHERE site_id = ?1 AND hub_id = ?2 \
                 AND reservation_id = ?3 AND state = 'pre_issued'",
                params![hub.site_id, hub.hub_id, reservation_id, i(seq)],
            )?;
            insert_key(tx, hub, key, seq, item)?;
        }
        KeyChange::Batch(items) => {
            for (n, change) in items.iter().enumerate() {
                apply_change(tx, hub, change, seq, Some(n))?;
            }
        }
    }
    Ok(())
}

fn event_row(hub: &HubRef, r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredEvent> {
    Ok(StoredEvent {
        hub: hub.clone(),
        seq: u(r.get(0)?),
        event_id: r.get(1)?,
        kind: r.get(2)?,
        envelope: r.get(3)?,
        published: r.get::<_, Option<String>>(4)?.is_some(),
    })
}

fn output_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<OutputRow> {
    Ok(OutputRow {
        id: r.get(0)?,
        hub: HubRef {
            site_id: r.get(1)?,
            hub_id: r.get(2)?,
        },
        topic: r.get(3)?,
        body: r.get(4)?,
        received_at: r.get(5)?,
    })
}

/// What one grant's outcome (an event's, or a batch item's) says about the
/// keys it made.
#[allow(clippy::too_many_arguments)]
fn grant_outcome(
    tx: &Connection,
    hub: &HubRef,
    seq: u64,
    item: Option<usize>,
    outcome: lockhub_proto::event::Outcome,
    reason: Option<lockhub_proto::event::Reason>,
    valid_until: Option<lockhub_proto::time::Timestamp>,
    revoked: &mut Vec<String>,
) -> Result<(), StoreError> {
    use lockhub_proto::event::{Outcome, Reason};
    let item = item.map(|n| n as i64);
    let mut st = tx.prepare_cached(
        "SELECT key_id, hub_outcome FROM keys WHERE site_id = ?1 AND hub_id = ?2 \
         AND grant_seq = ?3 AND grant_item IS ?4 AND state <> 'revoked'",
    )?;
    let keys = st
        .query_map(params![hub.site_id, hub.hub_id, i(seq), item], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    for (key_id, before) in keys {
        // A tombstone refuses the grant; a repair's grant that comes back
        // `noop` finds the key final on the hub (it was in no live bucket).
        let gone = (outcome == Outcome::Rejected && reason == Some(Reason::Revoked))
            || (outcome == Outcome::Noop && before.as_deref() == Some("reissued"));
        let state_sql = if gone { "'revoked'" } else { "state" };
        let took = match outcome {
            Outcome::Applied => "applied",
            Outcome::Noop => "noop",
            _ => "rejected",
        };
        tx.execute(
            &format!(
                "UPDATE keys SET state = {state_sql}, hub_outcome = ?4, hub_valid_until = ?5 \
                 WHERE site_id = ?1 AND hub_id = ?2 AND key_id = ?3"
            ),
            params![
                hub.site_id,
                hub.hub_id,
                key_id,
                took,
                valid_until.map(|t| t.to_rfc3339())
            ],
        )?;
        if gone {
            revoked.push(key_id);
        }
    }
    Ok(())
}

impl Store for SqliteStore {
    fn add_signer(
        &self,
        signer: &SignerRecord,
        retire_others_at: Option<&str>,
    ) -> Result<(), StoreError> {
        self.write(|tx| {
            if let Some(not_after) = retire_others_at {
                tx.execute(
                    "UPDATE signers SET active = 0, not_after = ?1 WHERE active = 1",
                    params![not_after],
                )?;
            }
            tx.execute(
                "INSERT INTO signers (id, public_key, created_at, not_after, active) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    signer.id,
                    signer.public_key,
                    signer.created_at,
                    signer.not_after,
                    b(signer.active)
                ],
            )
            .map_err(|e| match constraint(&e) {
                Some(m) if m.contains("signers.id") => StoreError::SignerExists(signer.id.clone()),
                _ => StoreError::Sqlite(e),
            })?;
            Ok(())
        })
    }

    fn signers(&self) -> Result<Vec<SignerRecord>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT id, public_key, created_at, not_after, active FROM signers \
                 ORDER BY created_at, id",
            )?;
            let rows = st
                .query_map([], |r| {
                    Ok(SignerRecord {
                        id: r.get(0)?,
                        public_key: r.get(1)?,
                        created_at: r.get(2)?,
                        not_after: r.get(3)?,
                        active: r.get::<_, i64>(4)? == 1,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
    }

    fn add_hub(&self, hub: &HubRecord, now: &str) -> Result<(), StoreError> {
        let h = &hub.hub;
        self.write(|tx| {
            if hub_exists(tx, h)? {
                return Err(StoreError::HubExists(h.clone()));
            }
            tx.execute(
                "INSERT INTO hubs (site_id, hub_id, public_key, next_seq, created_at) \
                 VALUES (?1, ?2, ?3, 1, ?4)",
                params![h.site_id, h.hub_id, hub.public_key, now],
            )?;
            for door in &hub.doors {
                tx.execute(
                    "INSERT OR IGNORE INTO hub_doors (site_id, hub_id, name) VALUES (?1, ?2, ?3)",
                    params![h.site_id, h.hub_id, door],
                )?;
            }
            for (n, k) in hub.pin_keys.iter().enumerate() {
                tx.execute(
                    "INSERT INTO pin_keys (site_id, hub_id, id, secret, position) \
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![h.site_id, h.hub_id, k.id, k.secret.as_slice(), n as i64],
                )?;
            }
            Ok(())
        })
    }

    fn set_hub_key(&self, hub: &HubRef, public_key: &str) -> Result<(), StoreError> {
        self.write(|tx| {
            let n = tx.execute(
                "UPDATE hubs SET public_key = ?3 WHERE site_id = ?1 AND hub_id = ?2",
                params![hub.site_id, hub.hub_id, public_key],
            )?;
            if n == 0 {
                return Err(StoreError::UnknownHub(hub.clone()));
            }
            Ok(())
        })
    }

    fn hub(&self, hub: &HubRef) -> Result<Option<HubRecord>, StoreError> {
        self.with(|c| read_hub(c, hub))
    }

    fn hubs(&self) -> Result<Vec<HubRecord>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare("SELECT site_id, hub_id FROM hubs ORDER BY site_id, hub_id")?;
            let refs = st
                .query_map([], |r| {
                    Ok(HubRef {
                        site_id: r.get(0)?,
                        hub_id: r.get(1)?,
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            drop(st);
            let mut out = Vec::with_capacity(refs.len());
            for h in &refs {
                out.extend(read_hub(c, h)?);
            }
            Ok(out)
        })
    }

    fn key(&self, hub: &HubRef, key_id: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.with(|c| {
            Ok(c.query_row(
                &format!(
                    "SELECT {KEY_COLUMNS} FROM keys WHERE site_id = ?1 AND hub_id = ?2 AND key_id = ?3"
                ),
                params![hub.site_id, hub.hub_id, key_id],
                key_row,
            )
            .optional()?)
        })
    }

    fn mint(&self, mint: &Mint, sign: &mut dyn FnMut(u64) -> Signed) -> Result<Minted, StoreError> {
        let h = &mint.hub;
        self.write(|tx| {
            if let Some(idem) = &mint.idempotency {
                let found = tx
                    .query_row(
                        "SELECT i.request_sha256, i.seq, i.key_id, e.event_id, e.published_at \
                         FROM idempotency i JOIN events e \
                           ON e.site_id = i.site_id AND e.hub_id = i.hub_id AND e.seq = i.seq \
                         WHERE i.site_id = ?1 AND i.hub_id = ?2 AND i.key = ?3",
                        params![h.site_id, h.hub_id, idem.key],
                        |r| {
                            Ok((
                                r.get::<_, Vec<u8>>(0)?,
                                r.get::<_, i64>(1)?,
                                r.get::<_, Option<String>>(2)?,
                                r.get::<_, String>(3)?,
                                r.get::<_, Option<String>>(4)?,
                            ))
                        },
                    )
                    .optional()?;
                if let Some((sha, seq, key_id, event_id, published_at)) = found {
                    if sha != idem.request_sha256 {
                        return Err(StoreError::IdempotencyConflict(idem.key.clone()));
                    }
                    return Ok(Minted {
                        seq: u(seq),
                        event_id,
                        key_id,
                        replayed: true,
                        published: published_at.is_some(),
                    });
                }
            }
            let seq: i64 = tx
                .query_row(
                    "SELECT next_seq FROM hubs WHERE site_id = ?1 AND hub_id = ?2",
                    params![h.site_id, h.hub_id],
                    |r| r.get(0),
                )
                .optional()?
                .ok_or_else(|| StoreError::UnknownHub(h.clone()))?;
            let seq = u(seq);
            // The key change first: a refused change (a second active key
            // for the check-in) signs nothing.
            apply_change(tx, h, &mint.change, seq, None)?;
            let signed = sign(seq);
            tx.execute(
                "INSERT INTO events (site_id, hub_id, seq, event_id, type, body, envelope, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    h.site_id,
                    h.hub_id,
                    i(seq),
                    signed.event_id,
                    signed.kind,
                    signed.body,
                    signed.envelope,
                    mint.now
                ],
            )?;
            tx.execute(
                "UPDATE hubs SET next_seq = ?3 WHERE site_id = ?1 AND hub_id = ?2",
                params![h.site_id, h.hub_id, i(seq + 1)],
            )?;
            if let Some(idem) = &mint.idempotency {
                tx.execute(
                    "INSERT INTO idempotency (site_id, hub_id, key, request_sha256, state, seq, key_id, created_at) \
                     VALUES (?1, ?2, ?3, ?4, 'in_progress', ?5, ?6, ?7)",
                    params![
                        h.site_id,
                        h.hub_id,
                        idem.key,
                        idem.request_sha256.as_slice(),
                        i(seq),
                        mint.key_id,
                        mint.now_unix
                    ],
                )?;
            }
            Ok(Minted {
                seq,
                event_id: signed.event_id,
                key_id: mint.key_id.clone(),
                replayed: false,
                published: false,
            })
        })
    }

    fn unpublished(
        &self,
        hub: Option<&HubRef>,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare_cached(
                "SELECT seq, event_id, type, envelope, published_at, site_id, hub_id FROM events \
                 WHERE published_at IS NULL \
                   AND (?1 IS NULL OR (site_id = ?1 AND hub_id = ?2)) \
                 ORDER BY site_id, hub_id, seq LIMIT ?3",
            )?;
            let rows = st
                .query_map(
                    params![
                        hub.map(|h| &h.site_id),
                        hub.map(|h| &h.hub_id),
                        i64::from(limit)
                    ],
                    |r| {
                        let h = HubRef {
                            site_id: r.get(5)?,
                            hub_id: r.get(6)?,
                        };
                        event_row(&h, r)
                    },
                )?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
    }

    fn mark_published(&self, events: &[(HubRef, u64)], now: &str) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            let mut event = tx.prepare_cached(
                "UPDATE events SET published_at = ?4 \
                 WHERE site_id = ?1 AND hub_id = ?2 AND seq = ?3 AND published_at IS NULL",
            )?;
            let mut idempotency = tx.prepare_cached(
                "UPDATE idempotency SET state = 'done' \
                 WHERE site_id = ?1 AND hub_id = ?2 AND seq = ?3",
            )?;
            for (hub, seq) in events {
                event.execute(params![hub.site_id, hub.hub_id, i(*seq), now])?;
                idempotency.execute(params![hub.site_id, hub.hub_id, i(*seq)])?;
            }
            Ok(())
        })
    }

    fn events_from(
        &self,
        hub: &HubRef,
        from_seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare_cached(
                "SELECT seq, event_id, type, envelope, published_at FROM events \
                 WHERE site_id = ?1 AND hub_id = ?2 AND seq >= ?3 ORDER BY seq LIMIT ?4",
            )?;
            let rows = st
                .query_map(
                    params![hub.site_id, hub.hub_id, i(from_seq), i64::from(limit)],
                    |r| event_row(hub, r),
                )?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
    }

    fn advance_seq(&self, hub: &HubRef, watermark: u64) -> Result<bool, StoreError> {
        self.write(|tx| {
            let n = tx.execute(
                "UPDATE hubs SET next_seq = ?3 WHERE site_id = ?1 AND hub_id = ?2 AND next_seq < ?3",
                params![hub.site_id, hub.hub_id, i(watermark.saturating_add(1))],
            )?;
            Ok(n == 1)
        })
    }

    fn head_seq(&self, hub: &HubRef) -> Result<u64, StoreError> {
        self.with(|c| {
            let next: i64 = c
                .query_row(
                    "SELECT next_seq FROM hubs WHERE site_id = ?1 AND hub_id = ?2",
                    params![hub.site_id, hub.hub_id],
                    |r| r.get(0),
                )
                .optional()?
                .ok_or_else(|| StoreError::UnknownHub(hub.clone()))?;
            Ok(u(next).saturating_sub(1))
        })
    }

    fn record_result(
        &self,
        hub: &HubRef,
        result: &lockhub_proto::event::EventResult,
    ) -> Result<Option<ResultApplied>, StoreError> {
        use lockhub_proto::event::{Outcome, Reason};
        let (Some(seq), Some(event_id)) = (result.seq, result.event_id) else {
            return Ok(None);
        };
        self.write(|tx| {
            let Some((kind, stored_id)) = tx
                .query_row(
                    "SELECT type, event_id FROM events WHERE site_id = ?1 AND hub_id = ?2 AND seq = ?3",
                    params![hub.site_id, hub.hub_id, i(seq)],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
                )
                .optional()?
            else {
                return Ok(None);
            };
            if !stored_id.eq_ignore_ascii_case(&event_id.to_string()) {
                return Ok(None);
            }
            let mut applied = ResultApplied {
                kind: kind.clone(),
                revoked: Vec::new(),
            };
            // A replay's or a conflict's result says nothing about what the
            // event did; the first result stands.
            let says_nothing =
                result.outcome == Outcome::Conflict || result.reason == Some(Reason::StaleSeq);
            tx.execute(
                "UPDATE events SET result_outcome = ?4 WHERE site_id = ?1 AND hub_id = ?2 AND seq = ?3 \
                 AND (?5 = 0 OR result_outcome IS NULL)",
                params![
                    hub.site_id,
                    hub.hub_id,
                    i(seq),
                    result.outcome.as_str(),
                    b(says_nothing)
                ],
            )?;
            if says_nothing {
                return Ok(Some(applied));
            }
            match (kind.as_str(), &result.items) {
                ("key.issued" | "checkin.completed", _) => grant_outcome(
                    tx,
                    hub,
                    seq,
                    None,
                    result.outcome,
                    result.reason,
                    result.valid_until,
                    &mut applied.revoked,
                )?,
                ("batch", Some(items)) => {
                    for (n, it) in items.iter().enumerate() {
                        grant_outcome(
                            tx,
                            hub,
                            seq,
                            Some(n),
                            it.outcome,
                            it.reason,
                            it.valid_until,
                            &mut applied.revoked,
                        )?;
                    }
                }
                // A batch rejected whole: none of its grants was taken.
                ("batch", None) if result.outcome == Outcome::Rejected => {
                    tx.execute(
                        "UPDATE keys SET hub_outcome = 'rejected' \
                         WHERE site_id = ?1 AND hub_id = ?2 AND grant_seq = ?3",
                        params![hub.site_id, hub.hub_id, i(seq)],
                    )?;
                }
                _ => {}
            }
            Ok(Some(applied))
        })
    }

    fn results_pending(&self, hub: &HubRef) -> Result<u64, StoreError> {
        self.with(|c| {
            let n: i64 = c.query_row(
                "SELECT count(*) FROM events \
                 WHERE site_id = ?1 AND hub_id = ?2 AND result_outcome IS NULL",
                params![hub.site_id, hub.hub_id],
                |r| r.get(0),
            )?;
            Ok(u(n))
        })
    }

    fn without_result(&self, hub: &HubRef, limit: u32) -> Result<Vec<StoredEvent>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare_cached(
                "SELECT seq, event_id, type, envelope, published_at FROM events \
                 WHERE site_id = ?1 AND hub_id = ?2 AND result_outcome IS NULL \
                   AND published_at IS NOT NULL ORDER BY seq LIMIT ?3",
            )?;
            let rows = st
                .query_map(params![hub.site_id, hub.hub_id, i64::from(limit)], |r| {
                    event_row(hub, r)
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
    }

    fn claim_keys(&self, hub: &HubRef) -> Result<Vec<KeyRecord>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare_cached(
                "SELECT key_id, version, state, check_in_id, reservation_id, doors, valid_from, \
                 coalesce(hub_valid_until, valid_until), holder_ref, seq FROM keys \
                 WHERE site_id = ?1 AND hub_id = ?2 AND state <> 'revoked' \
                   AND (hub_outcome IS NULL OR hub_outcome IN ('applied', 'noop')) \
                 ORDER BY key_id",
            )?;
            let rows = st
                .query_map(params![hub.site_id, hub.hub_id], key_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
    }

    fn grant_body(&self, hub: &HubRef, key_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.with(|c| {
            Ok(c.query_row(
                "SELECT e.body FROM keys k JOIN events e ON e.site_id = k.site_id \
                   AND e.hub_id = k.hub_id AND e.seq = coalesce(k.grant_seq, k.seq) \
                 WHERE k.site_id = ?1 AND k.hub_id = ?2 AND k.key_id = ?3",
                params![hub.site_id, hub.hub_id, key_id],
                |r| r.get(0),
            )
            .optional()?)
        })
    }

    fn prune_idempotency(&self, before_unix: i64) -> Result<usize, StoreError> {
        self.write(|tx| {
            Ok(tx.execute(
                "DELETE FROM idempotency WHERE created_at < ?1 AND state = 'done'",
                params![before_unix],
            )?)
        })
    }

    fn record_outputs(&self, outs: &[OutputRecord]) -> Result<usize, StoreError> {
        if outs.is_empty() {
            return Ok(0);
        }
        self.write(|tx| {
            let mut insert = tx.prepare_cached(
                "INSERT INTO outputs (site_id, hub_id, topic, body, audit_id, received_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) \
                 ON CONFLICT (site_id, hub_id, audit_id) WHERE audit_id IS NOT NULL DO NOTHING",
            )?;
            let mut new = 0;
            for out in outs {
                new += insert.execute(params![
                    out.hub.site_id,
                    out.hub.hub_id,
                    out.topic,
                    out.body,
                    out.audit_id,
                    out.received_at
                ])?;
            }
            Ok(new)
        })
    }

    fn record_refused(
        &self,
        hub: Option<&HubRef>,
        topic: &str,
        reason: &str,
        at: &str,
    ) -> Result<(), StoreError> {
        self.write(|tx| {
            tx.execute(
                "INSERT INTO refused (site_id, hub_id, topic, reason, received_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    hub.map(|h| &h.site_id),
                    hub.map(|h| &h.hub_id),
                    topic,
                    reason,
                    at
                ],
            )?;
            Ok(())
        })
    }

    fn outputs(&self, f: &OutputFilter) -> Result<Vec<OutputRow>, StoreError> {
        self.with(|c| {
            let topics = serde_json::to_string(&f.topics).unwrap_or_else(|_| "[]".into());
            let order = if f.newest { "DESC" } else { "ASC" };
            let mut st = c.prepare(&format!(
                "SELECT id, site_id, hub_id, topic, body, received_at FROM outputs \
                 WHERE id > ?1 \
                   AND (?2 IS NULL OR (site_id = ?2 AND hub_id = ?3)) \
                   AND (?4 = '[]' OR topic IN (SELECT value FROM json_each(?4))) \
                 ORDER BY id {order} LIMIT ?5"
            ))?;
            let mut rows = st
                .query_map(
                    params![
                        f.after_id,
                        f.hub.as_ref().map(|h| &h.site_id),
                        f.hub.as_ref().map(|h| &h.hub_id),
                        topics,
                        i64::from(f.limit)
                    ],
                    output_row,
                )?
                .collect::<Result<Vec<_>, _>>()?;
            if f.newest {
                rows.reverse();
            }
            Ok(rows)
        })
    }

    fn open_alerts(&self, hub: Option<&HubRef>) -> Result<Vec<OutputRow>, StoreError> {
        self.with(|c| {
            // The latest message per (hub, condition, subject) decides.
            let mut st = c.prepare(
                "WITH latest AS ( \
                   SELECT max(id) AS id FROM outputs WHERE topic = 'alerts' \
                     AND (?1 IS NULL OR (site_id = ?1 AND hub_id = ?2)) \
                   GROUP BY site_id, hub_id, json_extract(body, '$.condition'), \
                            json_extract(body, '$.subject')) \
                 SELECT o.id, o.site_id, o.hub_id, o.topic, o.body, o.received_at \
                 FROM outputs o JOIN latest l ON l.id = o.id \
                 WHERE json_extract(o.body, '$.state') = 'raised' ORDER BY o.id",
            )?;
            let rows = st
                .query_map(
                    params![hub.map(|h| &h.site_id), hub.map(|h| &h.hub_id)],
                    output_row,
                )?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
    }

    fn result_for(&self, hub: &HubRef, seq: u64) -> Result<Option<OutputRow>, StoreError> {
        self.with(|c| {
            Ok(c.query_row(
                "SELECT o.id, o.site_id, o.hub_id, o.topic, o.body, o.received_at FROM outputs o \
                 JOIN events e ON e.site_id = o.site_id AND e.hub_id = o.hub_id AND e.seq = ?3 \
                 WHERE o.site_id = ?1 AND o.hub_id = ?2 AND o.topic = 'results' \
                   AND json_extract(o.body, '$.seq') = ?3 \
                   AND json_extract(o.body, '$.event_id') = e.event_id \
                 ORDER BY o.id DESC LIMIT 1",
                params![hub.site_id, hub.hub_id, i(seq)],
                output_row,
            )
            .optional()?)
        })
    }

    fn first_matching_proof(
        &self,
        hub: &HubRef,
        seq: u64,
    ) -> Result<Option<OutputRow>, StoreError> {
        self.with(|c| {
            Ok(c.query_row(
                "SELECT id, site_id, hub_id, topic, body, received_at FROM outputs \
                 WHERE site_id = ?1 AND hub_id = ?2 AND topic = 'proof' \
                   AND json_type(body, '$.match') = 'true' \
                   AND json_extract(body, '$.head_seq') >= ?3 ORDER BY id LIMIT 1",
                params![hub.site_id, hub.hub_id, i(seq)],
                output_row,
            )
            .optional()?)
        })
    }

    fn hub_summaries(&self) -> Result<Vec<HubSummary>, StoreError> {
        let hubs = self.hubs()?;
        let open = self.open_alerts(None)?;
        self.with(|c| {
            let mut out = Vec::with_capacity(hubs.len());
            for h in hubs {
                let r = &h.hub;
                let p = params![r.site_id, r.hub_id];
                let status: Option<(String, String)> = c
                    .query_row(
                        "SELECT json_extract(body, '$.state'), received_at FROM outputs \
                         WHERE site_id = ?1 AND hub_id = ?2 AND topic = 'status' \
                         ORDER BY id DESC LIMIT 1",
                        p,
                        |row| Ok((row.get(0)?, row.get(1)?)),
                    )
                    .optional()?;
                let last_result_seq: Option<i64> = c.query_row(
                    "SELECT max(json_extract(body, '$.seq')) FROM outputs \
                     WHERE site_id = ?1 AND hub_id = ?2 AND topic = 'results'",
                    p,
                    |row| row.get(0),
                )?;
                let last_sync_from: Option<i64> = c
                    .query_row(
                        "SELECT json_extract(body, '$.from_seq') FROM outputs \
                         WHERE site_id = ?1 AND hub_id = ?2 AND topic = 'sync' \
                         ORDER BY id DESC LIMIT 1",
                        p,
                        |row| row.get(0),
                    )
                    .optional()?
                    .flatten();
                let last_audit_at: Option<String> = c
                    .query_row(
                        "SELECT json_extract(body, '$.at') FROM outputs \
                         WHERE site_id = ?1 AND hub_id = ?2 AND topic = 'audit' \
                         ORDER BY id DESC LIMIT 1",
                        p,
                        |row| row.get(0),
                    )
                    .optional()?
                    .flatten();
                let unpublished: i64 = c.query_row(
                    "SELECT count(*) FROM events \
                     WHERE site_id = ?1 AND hub_id = ?2 AND published_at IS NULL",
                    p,
                    |row| row.get(0),
                )?;
                let refused: i64 = c.query_row(
                    "SELECT count(*) FROM refused WHERE site_id = ?1 AND hub_id = ?2",
                    p,
                    |row| row.get(0),
                )?;
                // A proof for a checkpoint has `match` (null when the hub
                // is ahead); a bucket answer has none.
                let last_proof = c
                    .query_row(
                        "SELECT json_extract(body, '$.head_seq'), json_extract(body, '$.as_of'), \
                         json_extract(body, '$.match'), json_extract(body, '$.watermark'), received_at \
                         FROM outputs WHERE site_id = ?1 AND hub_id = ?2 AND topic = 'proof' \
                           AND json_type(body, '$.match') IS NOT NULL \
                         ORDER BY id DESC LIMIT 1",
                        p,
                        |row| {
                            Ok(ProofSummary {
                                head_seq: u(row.get(0)?),
                                as_of: row.get(1)?,
                                matches: row.get::<_, Option<i64>>(2)?.map(|m| m == 1),
                                watermark: row.get::<_, Option<i64>>(3)?.map(u),
                                received_at: row.get(4)?,
                            })
                        },
                    )
                    .optional()?;
                out.push(HubSummary {
                    registered: h.public_key.is_some(),
                    state: status.as_ref().map(|s| s.0.clone()),
                    state_at: status.map(|s| s.1),
                    head_seq: h.next_seq.saturating_sub(1),
                    unpublished: u(unpublished),
                    last_result_seq: last_result_seq.map(u),
                    last_sync_from: last_sync_from.map(u),
                    open_alerts: open.iter().filter(|a| &a.hub == r).count() as u64,
                    last_audit_at,
                    refused: u(refused),
                    last_proof,
                    hub: h.hub,
                });
            }
            Ok(out)
        })
    }
}
