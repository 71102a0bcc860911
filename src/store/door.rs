//! The door decision's durable side: gather the facts, call
//! [`crate::door::decide`], and record the outcome in the same transaction.
//!
//! Run [`door_entry`] on the writer with [`super::Priority::Door`]; send the
//! board `Unlock` or `Deny` only after the write has committed, so no door
//! opens unrecorded (mqtt.md 'Audit'). If the write fails, deny (reason 1)
//! and call [`record_storage_failure`] (which may fail too; then log it).
//!
//! The lockout needs no state of its own beyond the `lockouts` rows: the
//! denials that count are the `door.denied` audit rows, so a restart or a
//! power cut forgives nothing.

use super::StoreError;
use super::alerts::{self, Condition};
use super::audit::{self, AuditKind, AuditRecord};
use super::floor;
use crate::config::Policy;
use crate::door::{self, Candidate, Decision, DenyReason, DoorInput, Lockout, LockoutFacts};
use crate::time::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};
use std::fmt;
use uuid::Uuid;

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
const COUNTED_REASONS_SQL: &str =
    "('bad_format', 'unknown_pin', 'outside_window', 'pin_ambiguous')";

/// The probe for one tag (public so a test can check its query plan).
pub const CANDIDATES_SQL: &str =
    "SELECT k.key_id, k.pin_key_id, k.state, k.valid_from, k.valid_until,
        k.check_in_id, k.holder_ref, k.holder_name
   FROM key_doors d JOIN keys k ON k.key_id = d.key_id
  WHERE d.door = ?1 AND d.pin_tag = ?2 AND d.live = 1 AND k.pin_key_id = ?3";

/// The live keys holding one of `tags` at `door`: one index probe per tag on
/// `key_doors (door, pin_tag) WHERE live = 1`, so the cost does not grow
/// with the number of keys.
pub fn candidates(
    conn: &Connection,
    door: &str,
    tags: &[(String, [u8; 32])],
) -> Result<Vec<Candidate>, StoreError> {
    let mut stmt = conn.prepare_cached(CANDIDATES_SQL)?;
    let mut out = Vec::new();
    for (pin_key_id, tag) in tags {
        let rows = stmt.query_map(params![door, &tag[..], pin_key_id], |r| {
            Ok(Candidate {
                key_id: r.get(0)?,
                pin_key_id: r.get(1)?,
                state: r.get(2)?,
                valid_from: Timestamp(r.get(3)?),
                valid_until: Timestamp(r.get(4)?),
                check_in_id: r.get(5)?,
                holder_ref: r.get(6)?,
                holder_name: r.get(7)?,
            })
        })?;
        for c in rows {
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
    let window_start = now.saturating_add_secs(-i64::from(policy.lockout_window_s));
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
/// of [`door_entry`]; also what the benchmark times).
pub fn evaluate(
    conn: &Connection,
    entry: &DoorEntry,
    policy: &Policy,
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
        lockout: &facts,
        policy,
    });
    Ok((decision, facts))
}

/// Decides one keypad entry and records it: the audit row, a new lockout
/// and its alert, the `pin_ambiguous` alert, and the end of a finished
/// lockout's alert. Run it with `Priority::Door`; act on the decision only
/// once the write has committed.
pub fn door_entry(
    conn: &Connection,
    entry: &DoorEntry,
    policy: &Policy,
) -> Result<DoorOutcome, StoreError> {
    let (decision, facts) = evaluate(conn, entry, policy)?;
    let audit_id = audit::record(conn, &audit_record(entry, &decision))?;
    let locked = matches!(decision, Decision::LockedOut { .. });
    if entry.door_known && !locked {
        // Before a new lockout, so that each episode is its own alert.
        clear_if_ended(conn, &entry.door, &facts, entry.at)?;
    }
    if let Decision::Deny { reason, lockout } = &decision {
        if *reason == DenyReason::PinAmbiguous {
            alerts::raise(conn, Condition::PinAmbiguous, &entry.door, 1, entry.at)?;
        }
        if let Some(l) = lockout {
            start_lockout(conn, &entry.door, l)?;
        }
    }
    floor::raise_to(conn, entry.at)?;
    Ok(DoorOutcome { decision, audit_id })
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

/// Records a door-sensor or board event (`door.forced`, `door.held_open`,
/// `board.tamper`) and raises its alert (`door_forced`, `door_held_open`,
/// `tamper`) for `door`; the driver clears the alert when the condition ends.
/// Any other kind is refused: decisions go through [`door_entry`].
pub fn record_door_event(
    conn: &Connection,
    kind: AuditKind,
    door: &str,
    at: Timestamp,
) -> Result<Uuid, StoreError> {
    let condition = match kind {
        AuditKind::DoorForced => Condition::DoorForced,
        AuditKind::DoorHeldOpen => Condition::DoorHeldOpen,
        AuditKind::BoardTamper => Condition::Tamper,
        other => {
            return Err(StoreError::Invalid(format!(
                "{} is not a door event",
                other.as_str()
            )));
        }
    };
    let mut rec = AuditRecord::new(kind, at);
    rec.door = Some(door.to_owned());
    let id = audit::record(conn, &rec)?;
    alerts::raise(conn, condition, door, 1, at)?;
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
}
