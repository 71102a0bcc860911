//! The door decision's durable side: gather the facts, call
//! [`crate::door::decide`], and record the outcome in the same transaction.
//!
//! A door driver (a serial port or an OSDP bus) calls [`decide_entry`]: it runs
//! [`door_entry`] as a door job that commits within [`COMMIT_WITHIN`] of the
//! keypad entry or not at all, and answers within [`ANSWER_WITHIN`]. Send
//! `Unlock` only for an `Ok` unlock, after the commit, so no door opens
//! unrecorded (mqtt.md 'Audit'); on any error send `Deny` (reason 1). The
//! denial that could not be written is kept ([`StorageFailures`]) and
//! written with its `storage_failure` alert as soon as storage works; the
//! next decision that commits ends the alert.
//!
//! The lockout needs no state of its own beyond the `lockouts` rows: the
//! denials that count are the `door.denied` audit rows, so a restart or a
//! power cut forgives nothing.

use super::Store;
use super::StoreError;
use super::alerts;
use super::audit::{self, AuditRecord};
use super::floor;
use crate::config::Policy;
use crate::door::sensor::{DoorAlarm, DoorState};
use crate::door::{self, Candidate, Decision, DenyReason, DoorInput, Lockout, LockoutFacts};
use jiff::tz::TimeZone;
use lockhub_proto::outputs::AuditKind;
use lockhub_proto::outputs::Condition;
use lockhub_proto::schedule::Schedule;
use lockhub_proto::time::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use uuid::Uuid;

/// A door decision that has not committed this long after its keypad entry
/// arrived is denied, and never commits later (serial.md 'Door decisions').
pub const COMMIT_WITHIN: Duration = Duration::from_secs(2);
/// The caller stops waiting for the store this long after the entry
/// arrived, whatever the store does (a commit stuck in fsync), and denies:
/// the answer is on the wire within the contract's 3 s.
pub const ANSWER_WITHIN: Duration = Duration::from_millis(2_700);
/// Denials kept in memory while they cannot be written; beyond it only
/// their count is kept (for the alert).
pub const MISSED_MAX: usize = 1024;
/// How often the missed denials are tried again while storage fails.
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// One keypad entry, as the serial driver hands it over.
#[derive(Clone, PartialEq, Eq)]
pub struct DoorEntry {
    /// The configured door name (or the driver's label for an unknown index).
    pub door: String,
    /// The config names this door.
    pub door_known: bool,
    /// `(pin_key_id, tag)` from [`crate::door::pin_tags`]; `None` for bad format.
    pub tags: Option<Vec<(String, [u8; 32])>>,
    /// The effective time.
    pub at: Timestamp,
}

impl fmt::Debug for DoorEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Tags are as good as PINs to anyone holding the PIN key: never shown.
        f.debug_struct("DoorEntry")
            .field("door", &self.door)
            .field("door_known", &self.door_known)
            .field("tags", &self.tags.as_ref().map(|t| t.len()))
            .field("at", &self.at)
            .finish()
    }
}

/// What [`door_entry`] decided and the audit row that records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorOutcome {
    pub decision: Decision,
    pub audit_id: Uuid,
}

/// The denial reasons that count, as SQL (must match
/// [`DenyReason::counts_toward_lockout`]; a test checks).
const COUNTED_REASONS_SQL: &str = "('bad_format', 'unknown_pin')";

/// The probe for one tag (public so a test can check its query plan).
pub const CANDIDATES_SQL: &str =
    "SELECT k.key_id, k.pin_key_id, k.state, k.valid_from, k.valid_until,
        k.check_in_id, k.holder_ref, k.holder_name, k.schedule, k.max_uses, k.use_count
   FROM key_doors d JOIN keys k ON k.key_id = d.key_id
  WHERE d.door = ?1 AND d.pin_tag = ?2 AND d.live = 1 AND k.pin_key_id = ?3";

/// The probe for one tag among ended keys, made only when no live key
/// matched: a `used_up` or `expired` key with the tag explains the denial
/// (mqtt.md 'At the door'). Index `key_doors_ended_by_tag`.
pub const ENDED_CANDIDATES_SQL: &str =
    "SELECT k.key_id, k.pin_key_id, k.state, k.valid_from, k.valid_until,
        k.check_in_id, k.holder_ref, k.holder_name, k.schedule, k.max_uses, k.use_count
   FROM key_doors d JOIN keys k ON k.key_id = d.key_id
  WHERE d.door = ?1 AND d.pin_tag = ?2 AND d.live = 0 AND k.pin_key_id = ?3
    AND k.state IN ('used_up', 'expired')
  LIMIT 4";

fn candidate(r: &rusqlite::Row<'_>) -> rusqlite::Result<Candidate> {
    let key_id: String = r.get(0)?;
    let schedule = match r.get::<_, Option<String>>(8)? {
        None => None,
        // The schema keeps it a JSON list; one this lockhub cannot read is
        // a damaged row, and the door stays shut (a storage error denies).
        Some(text) => Some(Schedule::from_json_str(&text).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                8,
                rusqlite::types::Type::Text,
                format!("unreadable schedule of key {key_id}").into(),
            )
        })?),
    };
    Ok(Candidate {
        key_id,
        pin_key_id: r.get(1)?,
        state: r.get(2)?,
        valid_from: Timestamp(r.get(3)?),
        valid_until: Timestamp(r.get(4)?),
        check_in_id: r.get(5)?,
        holder_ref: r.get(6)?,
        holder_name: r.get(7)?,
        schedule,
        max_uses: r.get(9)?,
        use_count: r.get(10)?,
    })
}

/// The live keys holding one of `tags` at `door`: one index probe per tag on
/// `key_doors (door, pin_tag) WHERE live = 1`, so the cost does not grow
/// with the number of keys. When none is live, the ended (`used_up`,
/// `expired`) keys with those tags, one more probe per tag.
pub fn candidates(
    conn: &Connection,
    door: &str,
    tags: &[(String, [u8; 32])],
) -> Result<Vec<Candidate>, StoreError> {
    let mut out = probe(conn, CANDIDATES_SQL, door, tags)?;
    if out.is_empty() {
        out = probe(conn, ENDED_CANDIDATES_SQL, door, tags)?;
    }
    Ok(out)
}

fn probe(
    conn: &Connection,
    sql: &str,
    door: &str,
    tags: &[(String, [u8; 32])],
) -> Result<Vec<Candidate>, StoreError> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut out = Vec::new();
    for (pin_key_id, tag) in tags {
        for c in stmt.query_map(params![door, &tag[..], pin_key_id], candidate)? {
            out.push(c?);
        }
    }
    Ok(out)
}

/// The door's most recent lockout.
pub fn last_lockout(conn: &Connection, door: &str) -> Result<Option<Lockout>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT started_at, until, level FROM lockouts WHERE door = ?1
              ORDER BY started_at DESC LIMIT 1",
        )?
        .query_row([door], |r| {
            Ok(Lockout {
                started_at: Timestamp(r.get(0)?),
                until: Timestamp(r.get(1)?),
                level: r.get(2)?,
            })
        })
        .optional()?)
}

/// The lockout facts at `door` for an entry at `now`: the last lockout and
/// the counting denials in the window since it ended (a range scan of
/// `audit (door, kind, at)`).
pub fn lockout_facts(
    conn: &Connection,
    door: &str,
    now: Timestamp,
    policy: &Policy,
) -> Result<LockoutFacts, StoreError> {
    let last = last_lockout(conn, door)?;
    let window_start = door::lockout_window_start(now, policy);
    let since = last.map_or(i64::MIN, |l| l.until.0);
    let sql = format!(
        "SELECT at FROM audit
          WHERE door = ?1 AND kind = 'door.denied' AND at > ?2 AND at >= ?3
            AND reason IN {COUNTED_REASONS_SQL}"
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let denials = stmt
        .query_map(params![door, window_start.0, since], |r| {
            r.get(0).map(Timestamp)
        })?
        .collect::<Result<_, _>>()?;
    Ok(LockoutFacts { last, denials })
}

/// Gathers the facts and decides, without writing anything (the read side
/// of [`door_entry`]; also what the benchmark times). `zone` is the hub's
/// time zone, in which schedules are read.
pub fn evaluate(
    conn: &Connection,
    entry: &DoorEntry,
    policy: &Policy,
    zone: &TimeZone,
) -> Result<(Decision, LockoutFacts), StoreError> {
    let (facts, found) = if entry.door_known {
        let facts = lockout_facts(conn, &entry.door, entry.at, policy)?;
        let found = match &entry.tags {
            Some(tags) => candidates(conn, &entry.door, tags)?,
            None => Vec::new(),
        };
        (facts, found)
    } else {
        (LockoutFacts::default(), Vec::new())
    };
    let decision = door::decide(&DoorInput {
        door_known: entry.door_known,
        well_formed: entry.tags.is_some(),
        candidates: &found,
        now: entry.at,
        zone,
        lockout: &facts,
        policy,
    });
    Ok((decision, facts))
}

/// Decides one keypad entry and records it: the audit row, the use a grant
/// takes (and `key.used_up` when it was the last), a new lockout and its
/// alert, the `pin_ambiguous` alert, and the end of a finished lockout's
/// alert. Run it with `Priority::Door`; act on the decision only once the
/// write has committed: the use is taken in the same transaction as the
/// `door.granted` row, so a crash loses it or keeps it with its row, never
/// one without the other (mqtt.md '`max_uses`').
pub fn door_entry(
    conn: &Connection,
    entry: &DoorEntry,
    policy: &Policy,
    zone: &TimeZone,
) -> Result<DoorOutcome, StoreError> {
    let (decision, facts) = evaluate(conn, entry, policy, zone)?;
    let audit_id = audit::record(conn, &audit_record(entry, &decision))?;
    if let Decision::Unlock(key) = &decision {
        take_use(conn, key, entry.at)?;
    }
    let locked = matches!(decision, Decision::LockedOut { .. });
    if entry.door_known && !locked {
        // Before a new lockout, so that each episode is its own alert.
        clear_if_ended(conn, &entry.door, &facts, entry.at)?;
    }
    if let Decision::Deny { reason, lockout } = &decision {
        if *reason == DenyReason::PinAmbiguous {
            alerts::raise(conn, Condition::PinAmbiguous, &entry.door, 1, entry.at)?;
            // The alert ends when one of these keys stops being live (a
            // trigger on `keys` does it).
            let found = match &entry.tags {
                Some(tags) => candidates(conn, &entry.door, tags)?,
                None => Vec::new(),
            };
            let ids: Vec<&str> = found.iter().map(|c| c.key_id.as_str()).collect();
            alerts::remember_keys(conn, Condition::PinAmbiguous, &entry.door, &ids)?;
        }
        if let Some(l) = lockout {
            start_lockout(conn, &entry.door, l)?;
        }
    }
    floor::raise_to(conn, entry.at)?;
    Ok(DoorOutcome { decision, audit_id })
}

/// The grant takes one of the key's uses; the last one moves it to
/// `used_up` and writes `key.used_up` (the schema refuses a use past the
/// limit, or a last one that leaves the key live).
fn take_use(conn: &Connection, key: &Candidate, at: Timestamp) -> Result<(), StoreError> {
    let last = key.takes_last_use();
    let changed = conn
        .prepare_cached(
            "UPDATE keys SET use_count = use_count + 1, updated_at = ?2,
                             state = CASE WHEN ?3 THEN 'used_up' ELSE state END
              WHERE key_id = ?1 AND use_count = ?4",
        )?
        .execute(params![key.key_id, at.0, last, key.use_count])?;
    if changed != 1 {
        // The row moved under the decision (it cannot in the one writer):
        // refuse rather than open on a stale count.
        return Err(StoreError::Unreadable {
            what: format!("the use count of key {}", key.key_id),
        });
    }
    if last {
        let mut rec = AuditRecord::new(AuditKind::KeyUsedUp, at);
        rec.key_id = Some(key.key_id.clone());
        rec.check_in_id = key.check_in_id.clone();
        rec.holder_ref = key.holder_ref.clone();
        audit::record(conn, &rec)?;
    }
    Ok(())
}

fn audit_record(entry: &DoorEntry, decision: &Decision) -> AuditRecord {
    let (kind, reason) = match decision {
        Decision::Unlock(_) => (AuditKind::DoorGranted, None),
        Decision::Deny { reason, .. } => (AuditKind::DoorDenied, Some(reason.as_str().to_owned())),
        Decision::LockedOut { .. } => (AuditKind::DoorLockedOut, None),
    };
    let mut rec = AuditRecord::new(kind, entry.at);
    rec.door = Some(entry.door.clone());
    rec.reason = reason;
    if let Decision::Unlock(key) = decision {
        rec.key_id = Some(key.key_id.clone());
        rec.check_in_id = key.check_in_id.clone();
        rec.holder_ref = key.holder_ref.clone();
        rec.holder_name = key.holder_name.clone();
    }
    rec
}

/// Stores a new lockout and raises `keypad_lockout` for the door: one alert
/// per episode, since the previous episode's alert was cleared just before.
fn start_lockout(conn: &Connection, door: &str, l: &Lockout) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO lockouts (door, started_at, until, level) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![door, l.started_at.0, l.until.0, l.level])?;
    alerts::raise(conn, Condition::KeypadLockout, door, 1, l.started_at)?;
    Ok(())
}

/// Clears `keypad_lockout` when an entry arrives after the last lockout ended.
fn clear_if_ended(
    conn: &Connection,
    door: &str,
    facts: &LockoutFacts,
    now: Timestamp,
) -> Result<(), StoreError> {
    if facts.last.is_some_and(|l| l.until <= now) {
        alerts::clear(conn, Condition::KeypadLockout, door, now)?;
    }
    Ok(())
}

/// Clears every `keypad_lockout` alert whose door is no longer locked at
/// `now`. The serial driver may call it on a timer, so the alert ends when
/// the lockout does, not at the next keypad entry. Returns how many cleared.
pub fn clear_expired_lockouts(conn: &Connection, now: Timestamp) -> Result<usize, StoreError> {
    let doors: Vec<String> = conn
        .prepare_cached(
            "SELECT a.subject FROM alerts a
              WHERE a.condition = 'keypad_lockout' AND a.state = 'raised'
                AND NOT EXISTS (SELECT 1 FROM lockouts l WHERE l.door = a.subject AND l.until > ?1)",
        )?
        .query_map([now.0], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for door in &doors {
        alerts::clear(conn, Condition::KeypadLockout, door, now)?;
    }
    Ok(doors.len())
}

/// How far back [`settle_open_grants`] looks, in audit rows.
const OPEN_GRANTS_LOOKBACK: i64 = 10_000;

/// At start, before any door is served: a `door.granted` with no outcome
/// after it (no `door.unlocked`, no `door.unlock_unconfirmed` for that door
/// and key) was left by a run that stopped between the grant's commit and
/// the board's answer: a crash or a power cut, since a clean stop records
/// every outcome. Nobody can say now whether the door opened, so each is
/// recorded `door.unlock_unconfirmed` (mqtt.md: no acknowledgement came).
/// Looks at the last [`OPEN_GRANTS_LOOKBACK`] audit rows. Returns how many
/// it recorded.
pub fn settle_open_grants(conn: &Connection, now: Timestamp) -> Result<usize, StoreError> {
    let rows: Vec<(String, String, String)> = conn
        .prepare(
            "SELECT kind, door, key_id FROM audit
             WHERE seqno > (SELECT coalesce(max(seqno), 0) FROM audit) - ?1
               AND kind IN ('door.granted', 'door.unlocked', 'door.unlock_unconfirmed')
               AND door IS NOT NULL AND key_id IS NOT NULL
             ORDER BY seqno",
        )?
        .query_map([OPEN_GRANTS_LOOKBACK], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut open: std::collections::BTreeMap<(String, String), usize> = Default::default();
    for (kind, door, key_id) in rows {
        let n = open.entry((door, key_id)).or_default();
        if kind == AuditKind::DoorGranted.as_str() {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
        }
    }
    let mut settled = 0;
    for ((door, key_id), n) in open {
        for _ in 0..n {
            record_unlock(conn, &door, &key_id, false, now)?;
            settled += 1;
        }
    }
    Ok(settled)
}

/// Records whether the board acknowledged an Unlock: `door.unlocked`, or
/// `door.unlock_unconfirmed` after every resend went unanswered. The key's
/// check-in and holder reference are copied from the mirror when it still
/// has the key.
pub fn record_unlock(
    conn: &Connection,
    door: &str,
    key_id: &str,
    confirmed: bool,
    at: Timestamp,
) -> Result<Uuid, StoreError> {
    let kind = if confirmed {
        AuditKind::DoorUnlocked
    } else {
        AuditKind::DoorUnlockUnconfirmed
    };
    let mut rec = AuditRecord::new(kind, at);
    rec.door = Some(door.to_owned());
    rec.key_id = Some(key_id.to_owned());
    if let Some((check_in_id, holder_ref)) = conn
        .prepare_cached("SELECT check_in_id, holder_ref FROM keys WHERE key_id = ?1")?
        .query_row([key_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?
    {
        rec.check_in_id = check_in_id;
        rec.holder_ref = holder_ref;
    }
    audit::record(conn, &rec)
}

/// A door happening that is audited and raises its alert without any
/// decision behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorEvent {
    /// `door.forced`, alert `door_forced`.
    Forced,
    /// `door.held_open`, alert `door_held_open`.
    HeldOpen,
    /// `board.tamper`, alert `tamper`.
    Tamper,
}

/// Records a door-sensor or board event (`door.forced`, `door.held_open`,
/// `board.tamper`) and raises its alert (`door_forced`, `door_held_open`,
/// `tamper`) for `door`; the driver clears the alert when the condition ends.
/// Only these three can be recorded this way: a grant or a denial is the
/// outcome of a decision and goes through [`door_entry`].
pub fn record_door_event(
    conn: &Connection,
    event: DoorEvent,
    door: &str,
    at: Timestamp,
) -> Result<Uuid, StoreError> {
    let (kind, condition) = match event {
        DoorEvent::Forced => (AuditKind::DoorForced, Condition::DoorForced),
        DoorEvent::HeldOpen => (AuditKind::DoorHeldOpen, Condition::DoorHeldOpen),
        DoorEvent::Tamper => (AuditKind::BoardTamper, Condition::Tamper),
    };
    let mut rec = AuditRecord::new(kind, at);
    rec.door = Some(door.to_owned());
    let id = audit::record(conn, &rec)?;
    alerts::raise(conn, condition, door, 1, at)?;
    Ok(id)
}

/// A door's sensor report changed what the hub knows of it: keeps the new
/// [`DoorState`] and records what the change means (the `door.forced` or
/// `door.held_open` row with its alert, or the end of those alerts) in one
/// transaction, so a restart finds the state and the alerts agreeing. A
/// report that changes nothing (a closed door re-reported after a Hello,
/// no alert left to clear) writes nothing, so it costs no fsync.
pub fn record_sensor(
    conn: &Connection,
    door: &str,
    state: &DoorState,
    alarm: Option<DoorAlarm>,
    at: Timestamp,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO door_state (door, open, opened_at, forced, held_open, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (door) DO UPDATE SET open = excluded.open, opened_at = excluded.opened_at,
           forced = excluded.forced, held_open = excluded.held_open, updated_at = excluded.updated_at
         WHERE (open, opened_at, forced, held_open)
               IS NOT (excluded.open, excluded.opened_at, excluded.forced, excluded.held_open)",
    )?
    .execute(params![
        door,
        state.is_open(),
        state.opened_at.map(|t| t.0),
        state.forced,
        state.held_open,
        at.0
    ])?;
    match alarm {
        Some(DoorAlarm::Forced) => {
            record_door_event(conn, DoorEvent::Forced, door, at)?;
        }
        Some(DoorAlarm::HeldOpen) => {
            record_door_event(conn, DoorEvent::HeldOpen, door, at)?;
        }
        Some(DoorAlarm::Closed { forced, held_open }) => {
            if forced {
                alerts::clear(conn, Condition::DoorForced, door, at)?;
            }
            if held_open {
                alerts::clear(conn, Condition::DoorHeldOpen, door, at)?;
            }
        }
        None => {}
    }
    Ok(())
}

/// The last reported state of each of `doors` that has one.
pub fn door_states(
    conn: &Connection,
    doors: &[String],
) -> Result<Vec<(String, DoorState)>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT opened_at, forced, held_open FROM door_state WHERE door = ?1")?;
    let mut out = Vec::new();
    for door in doors {
        if let Some(state) = stmt
            .query_row([door], |r| {
                Ok(DoorState {
                    opened_at: r.get::<_, Option<i64>>(0)?.map(Timestamp),
                    forced: r.get(1)?,
                    held_open: r.get(2)?,
                })
            })
            .optional()?
        {
            out.push((door.clone(), state));
        }
    }
    Ok(out)
}

/// Forgets the last reported state of every door `keep` does not name (a
/// door removed or renamed in the config): nothing reports it any more,
/// and a door added later under that name must start unknown, not open.
/// Returns how many it forgot.
pub fn forget_doors_except(
    conn: &Connection,
    keep: &std::collections::BTreeSet<String>,
) -> Result<usize, StoreError> {
    let doors: Vec<String> = conn
        .prepare_cached("SELECT door FROM door_state")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut delete = conn.prepare_cached("DELETE FROM door_state WHERE door = ?1")?;
    let mut forgotten = 0;
    for door in doors.iter().filter(|d| !keep.contains(*d)) {
        forgotten += delete.execute([door])?;
    }
    Ok(forgotten)
}

/// Keypad entries past the flood limit at `door` (serial.md): one
/// `door.flood` row with their `count`, and `keypad_flood` raised (bumped)
/// by as many.
pub fn record_flood(
    conn: &Connection,
    door: &str,
    count: u64,
    at: Timestamp,
) -> Result<Uuid, StoreError> {
    let count = i64::try_from(count).unwrap_or(i64::MAX).max(1);
    let mut rec = AuditRecord::new(AuditKind::DoorFlood, at);
    rec.door = Some(door.to_owned());
    rec.count = Some(count);
    let id = audit::record(conn, &rec)?;
    alerts::raise(conn, Condition::KeypadFlood, door, count, at)?;
    Ok(id)
}

/// A card read at an OSDP reader's door: `door.denied` with reason
/// `unsupported_credential`. Not a decision (the hub knows PINs only) and
/// not counted toward a lockout.
pub fn record_card_denied(
    conn: &Connection,
    door: &str,
    at: Timestamp,
) -> Result<Uuid, StoreError> {
    let mut rec = AuditRecord::new(AuditKind::DoorDenied, at);
    rec.door = Some(door.to_owned());
    rec.reason = Some(DenyReason::UnsupportedCredential.as_str().to_owned());
    audit::record(conn, &rec)
}

/// After [`door_entry`] failed: a `door.denied` `storage_failure` row and
/// the `storage_failure` alert, best effort (the same disk may refuse this).
/// Not counted toward a lockout: the hub failed, not the person at the door.
pub fn record_storage_failure(
    conn: &Connection,
    door: &str,
    at: Timestamp,
) -> Result<Uuid, StoreError> {
    let mut rec = AuditRecord::new(AuditKind::DoorDenied, at);
    rec.door = Some(door.to_owned());
    rec.reason = Some(DenyReason::StorageFailure.as_str().to_owned());
    let id = audit::record(conn, &rec)?;
    alerts::raise(conn, Condition::StorageFailure, door, 1, at)?;
    Ok(id)
}

/// Keypad entries denied because the store failed, kept in memory until they
/// can be written: each becomes its `door.denied` (`storage_failure`) audit
/// row and counts in the door's `storage_failure` alert, as soon as storage
/// takes writes again (mqtt.md 'Alerts'). One per [`Store`].
#[derive(Debug, Default)]
pub struct StorageFailures {
    missed: Mutex<Missed>,
    retrying: AtomicBool,
}

#[derive(Debug, Clone, Default)]
struct Missed {
    /// (door, effective time of the entry), oldest first.
    entries: VecDeque<(String, Timestamp)>,
    /// Denials past [`MISSED_MAX`], per door: counted, not audited.
    overflow: BTreeMap<String, (i64, Timestamp)>,
}

impl Missed {
    fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.overflow.is_empty()
    }
}

impl StorageFailures {
    fn lock(&self) -> std::sync::MutexGuard<'_, Missed> {
        self.missed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A denial at `door` at `at` could not be recorded.
    pub fn note(&self, door: &str, at: Timestamp) {
        let mut m = self.lock();
        if m.entries.len() < MISSED_MAX {
            m.entries.push_back((door.to_owned(), at));
        } else {
            let e = m.overflow.entry(door.to_owned()).or_insert((0, at));
            e.0 += 1;
            e.1 = e.1.max(at);
        }
    }

    /// How many denials wait to be written.
    pub fn pending(&self) -> usize {
        let m = self.lock();
        m.entries.len() + m.overflow.values().map(|(n, _)| *n as usize).sum::<usize>()
    }

    fn take(&self) -> Missed {
        std::mem::take(&mut *self.lock())
    }

    /// Puts back what a failed write took, ahead of what was noted since.
    fn restore(&self, mut taken: Missed) {
        let mut m = self.lock();
        let newer = std::mem::take(&mut m.entries);
        taken.entries.extend(newer);
        while taken.entries.len() > MISSED_MAX {
            if let Some((door, at)) = taken.entries.pop_back() {
                let e = taken.overflow.entry(door).or_insert((0, at));
                e.0 += 1;
                e.1 = e.1.max(at);
            }
        }
        for (door, (n, at)) in std::mem::take(&mut m.overflow) {
            let e = taken.overflow.entry(door).or_insert((0, at));
            e.0 += n;
            e.1 = e.1.max(at);
        }
        *m = taken;
    }
}

/// Writes the missed denials: each its audit row and a bump of its door's
/// `storage_failure` alert. A row the audit table refuses (while the alerts
/// table still takes writes) is counted in the alert alone.
fn write_missed(conn: &Connection, missed: &Missed) -> Result<(), StoreError> {
    for (door, at) in &missed.entries {
        conn.execute_batch("SAVEPOINT missed")?;
        match record_storage_failure(conn, door, *at) {
            Ok(_) => conn.execute_batch("RELEASE missed")?,
            Err(e) => {
                conn.execute_batch("ROLLBACK TO missed; RELEASE missed")?;
                tracing::error!(door = %door, error = %e, "a missed denial cannot be audited; counted in its alert alone");
                alerts::raise(conn, Condition::StorageFailure, door, 1, *at)?;
            }
        }
    }
    for (door, (n, at)) in &missed.overflow {
        alerts::raise(conn, Condition::StorageFailure, door, *n, *at)?;
    }
    Ok(())
}

/// The door decision for either driver (serial ports, OSDP buses): decides
/// `entry`, which arrived at `received`, and commits it with the missed
/// denials before it, within [`COMMIT_WITHIN`] of `received` or not at all.
/// A decision that commits ends every `storage_failure` alert: storage
/// works again.
///
/// On any error the caller answers Deny (reason 1): the entry is kept as a
/// missed denial and written, with its alert, as soon as the store takes
/// writes ([`StorageFailures`]); nothing of the failed decision was or will
/// be committed.
///
/// The one exception is a commit already under way at [`ANSWER_WITHIN`]
/// (a slow fsync: a commit that has begun cannot be stopped). The person
/// is answered Deny then, and the job's fate is settled when the writer
/// answers ([`settle_late`]): a grant that did commit is followed by
/// `door.unlock_unconfirmed` (the door never opened), a denial that did
/// is on record already, and one that did not is kept as a missed denial.
/// So every entry is on record once, as what happened at the door; and
/// either way `storage_failure` is raised (serial.md: a decision not
/// committed within 2 s is answered Deny and raises it).
pub async fn decide_entry(
    store: &Store,
    entry: DoorEntry,
    policy: Policy,
    zone: TimeZone,
    received: Instant,
) -> Result<DoorOutcome, StoreError> {
    let failures = store.storage_failures();
    let (door, at) = (entry.door.clone(), entry.at);
    let missed = failures.take();
    let job_missed = missed.clone();
    let writer = store.clone();
    let mut write = tokio::spawn(async move {
        writer
            .write_door(received + COMMIT_WITHIN, move |c| {
                write_missed(c, &job_missed)?;
                let outcome = door_entry(c, &entry, &policy, &zone)?;
                alerts::clear_all(c, Condition::StorageFailure, entry.at)?;
                Ok(outcome)
            })
            .await
    });
    let result = match tokio::time::timeout_at((received + ANSWER_WITHIN).into(), &mut write).await
    {
        Ok(joined) => joined.unwrap_or(Err(StoreError::Closed)),
        Err(_) => {
            tokio::spawn(settle_late(store.clone(), write, missed, door, at));
            return Err(StoreError::Deadline);
        }
    };
    if result.is_err() {
        failures.restore(missed);
        failures.note(&door, at);
        retry_missed(store);
    }
    result
}

/// A door job still in the writer's hands when its entry was answered
/// Deny: waits for the writer's answer and makes the record match what
/// happened at the door (see [`decide_entry`]).
async fn settle_late(
    store: Store,
    write: tokio::task::JoinHandle<Result<DoorOutcome, StoreError>>,
    missed: Missed,
    door: String,
    at: Timestamp,
) {
    match write.await.unwrap_or(Err(StoreError::Closed)) {
        Ok(DoorOutcome {
            decision: Decision::Unlock(key),
            ..
        }) => {
            tracing::error!(door = %door, key_id = %key.key_id, "the grant committed after its entry was denied; recorded unconfirmed");
            let key_id = key.key_id;
            store
                .write_until_written(
                    "door.unlock_unconfirmed",
                    move |c| {
                        record_unlock(c, &door, &key_id, false, at)?;
                        alerts::raise(c, Condition::StorageFailure, &door, 1, at).map(drop)
                    },
                    || false,
                )
                .await;
        }
        // A denial committed late is on record as it was answered.
        Ok(_) => {
            store
                .write_until_written(
                    "storage_failure",
                    move |c| alerts::raise(c, Condition::StorageFailure, &door, 1, at).map(drop),
                    || false,
                )
                .await;
        }
        Err(_) => {
            let failures = store.storage_failures();
            failures.restore(missed);
            failures.note(&door, at);
            retry_missed(&store);
        }
    }
}

/// Tries the missed denials again every [`RETRY_EVERY`] until they are
/// written (one task per store at a time; a door decision that commits
/// writes them too).
fn retry_missed(store: &Store) {
    let failures = store.storage_failures();
    if failures.retrying.swap(true, Ordering::AcqRel) {
        return;
    }
    let store = store.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(RETRY_EVERY).await;
            let missed = failures.take();
            if missed.is_empty() {
                break;
            }
            let job_missed = missed.clone();
            match store
                .write(super::Priority::Bulk, move |c| write_missed(c, &job_missed))
                .await
            {
                Ok(()) => {
                    tracing::warn!(
                        denials = missed.entries.len(),
                        "storage takes writes again; missed denials recorded"
                    );
                }
                Err(StoreError::Closed) => {
                    failures.restore(missed);
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "missed denials still cannot be written");
                    failures.restore(missed);
                }
            }
        }
        failures.retrying.store(false, Ordering::Release);
        // A denial noted between the last take and the flag going down
        // starts its own retry.
        if failures.pending() > 0 {
            retry_missed(&store);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sql_list_of_counted_reasons_matches_the_pure_rule() {
        for r in DenyReason::ALL {
            let quoted = format!("'{}'", r.as_str());
            assert_eq!(
                COUNTED_REASONS_SQL.contains(&quoted),
                r.counts_toward_lockout(),
                "{quoted}"
            );
        }
    }

    #[test]
    fn missed_denials_past_the_limit_are_counted_and_a_restore_keeps_the_order() {
        let f = StorageFailures::default();
        for i in 0..MISSED_MAX + 3 {
            f.note("101", Timestamp(i as i64));
        }
        assert_eq!(f.pending(), MISSED_MAX + 3);
        let taken = f.take();
        assert_eq!(f.pending(), 0);
        f.note("102", Timestamp(9_999));
        f.restore(taken);
        let m = f.take();
        assert_eq!(m.entries.len(), MISSED_MAX);
        assert_eq!(m.entries[0], ("101".to_owned(), Timestamp(0)));
        // The newest entry did not fit behind the restored ones: counted.
        assert_eq!(m.overflow["101"].0, 3);
        assert_eq!(m.overflow["102"].0, 1);
    }

    #[test]
    fn a_door_entry_debug_never_shows_tags() {
        let e = DoorEntry {
            door: "101".into(),
            door_known: true,
            tags: Some(vec![("k1".into(), [0xAB; 32])]),
            at: Timestamp(0),
        };
        let s = format!("{e:?}");
        assert!(
            !s.contains("171") && !s.to_lowercase().contains("ab, "),
            "{s}"
        );
    }

    #[test]
    fn a_sensor_record_keeps_the_door_state_and_its_alerts_agreeing() {
        use crate::store::{Priority, Store};
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db"), &Policy::default()).unwrap();
        let t = Timestamp::from_secs(1_800_000_000);
        let open = DoorState {
            opened_at: Some(t),
            forced: true,
            held_open: false,
        };
        let (states, raised, cleared, unchanged) = store
            .write_blocking(Priority::Bulk, move |c| {
                record_sensor(c, "101", &open, Some(DoorAlarm::Forced), t)?;
                let states = door_states(c, &["101".into(), "102".into()])?;
                let raised: i64 = c.query_row(
                    "SELECT count(*) FROM alerts WHERE condition = 'door_forced' AND state = 'raised'",
                    [],
                    |r| r.get(0),
                )?;
                let closed = DoorAlarm::Closed {
                    forced: true,
                    held_open: true,
                };
                record_sensor(c, "101", &DoorState::default(), Some(closed), t)?;
                let cleared: i64 = c.query_row(
                    "SELECT count(*) FROM alerts WHERE condition = 'door_forced' AND state = 'cleared'",
                    [],
                    |r| r.get(0),
                )?;
                let before = c.total_changes();
                record_sensor(c, "101", &DoorState::default(), Some(closed), t)?;
                Ok((states, raised, cleared, c.total_changes() - before))
            })
            .unwrap();
        assert_eq!(states, [("101".to_owned(), open)]);
        assert_eq!((raised, cleared), (1, 1));
        assert_eq!(unchanged, 0, "a report that changes nothing writes nothing");
    }
}
