//! The audit log: door decisions and key lifecycle, append-only.
//!
//! [`record`] writes the row and its outbox entry together; the caller's
//! transaction decides whether both exist. The published body never carries
//! `holder_name`: personal data stays on the hub, where erasure can reach it.

use super::StoreError;
use super::outbox::{self, Topic};
use lockhub_proto::time::Timestamp;
use rusqlite::{Connection, params};
use serde::Serialize;
use uuid::Uuid;

/// What an audit row records (mqtt.md 'Audit').
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuditKind {
    DoorGranted,
    DoorUnlocked,
    DoorUnlockUnconfirmed,
    DoorDenied,
    DoorLockedOut,
    DoorForced,
    DoorHeldOpen,
    BoardTamper,
    /// An operator cleared an alert by hand (`lockhub alert clear`).
    AlertCleared,
    /// Keypad entries past the flood limit, one row per door per minute
    /// with their `count` (serial.md 'Door decisions').
    DoorFlood,
    KeyActivated,
    KeyRevoked,
    KeyExpired,
}

impl AuditKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AuditKind::DoorGranted => "door.granted",
            AuditKind::DoorUnlocked => "door.unlocked",
            AuditKind::DoorUnlockUnconfirmed => "door.unlock_unconfirmed",
            AuditKind::DoorDenied => "door.denied",
            AuditKind::DoorLockedOut => "door.locked_out",
            AuditKind::DoorForced => "door.forced",
            AuditKind::DoorHeldOpen => "door.held_open",
            AuditKind::BoardTamper => "board.tamper",
            AuditKind::AlertCleared => "alert.cleared",
            AuditKind::DoorFlood => "door.flood",
            AuditKind::KeyActivated => "key.activated",
            AuditKind::KeyRevoked => "key.revoked",
            AuditKind::KeyExpired => "key.expired",
        }
    }
}

/// One audit record before it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRecord {
    pub kind: AuditKind,
    pub at: Timestamp,
    pub door: Option<String>,
    pub key_id: Option<String>,
    pub check_in_id: Option<String>,
    pub holder_ref: Option<String>,
    /// Stored locally (erasable), never published.
    pub holder_name: Option<String>,
    pub reason: Option<String>,
    pub event_id: Option<Uuid>,
    /// The condition of an `alert.cleared` row (its subject is in `door`).
    pub condition: Option<&'static str>,
    /// `door.flood` only: how many entries the row counts.
    pub count: Option<i64>,
}

impl AuditRecord {
    /// A record of `kind` at `at` with every optional field empty.
    pub fn new(kind: AuditKind, at: Timestamp) -> Self {
        AuditRecord {
            kind,
            at,
            door: None,
            key_id: None,
            check_in_id: None,
            holder_ref: None,
            holder_name: None,
            reason: None,
            event_id: None,
            condition: None,
            count: None,
        }
    }
}

#[derive(Serialize)]
struct AuditBody<'a> {
    audit_id: &'a str,
    at: String,
    kind: &'static str,
    door: Option<&'a str>,
    key_id: Option<&'a str>,
    check_in_id: Option<&'a str>,
    holder_ref: Option<&'a str>,
    reason: Option<&'a str>,
    event_id: Option<String>,
    /// Only on `alert.cleared` (mqtt.md is silent on where the condition
    /// goes; receivers ignore fields they do not know).
    #[serde(skip_serializing_if = "Option::is_none")]
    condition: Option<&'static str>,
    // Only `door.flood` has one; other bodies stay as mqtt.md shows them.
    #[serde(skip_serializing_if = "Option::is_none")]
    count: Option<i64>,
}

/// Writes an audit row and queues it for the cloud; returns its `audit_id`
/// (a UUIDv7, so ids sort by time).
pub fn record(conn: &Connection, rec: &AuditRecord) -> Result<Uuid, StoreError> {
    let (audit_id, id, json) = insert(conn, rec)?;
    outbox::enqueue(conn, Topic::Audit, &json, Some(&id), rec.at)?;
    Ok(audit_id)
}

/// [`record`] with the outbox row put on `out` (written by its
/// [`outbox::Queued::flush`], in the same transaction) instead of at once.
pub fn record_queued(
    conn: &Connection,
    rec: &AuditRecord,
    out: &mut outbox::Queued,
) -> Result<Uuid, StoreError> {
    let (audit_id, id, json) = insert(conn, rec)?;
    out.push(Topic::Audit, json, Some(id), rec.at);
    Ok(audit_id)
}

/// The audit row itself; returns its id (as a UUID and as stored) and the
/// body to publish.
fn insert(conn: &Connection, rec: &AuditRecord) -> Result<(Uuid, String, Vec<u8>), StoreError> {
    let audit_id = Uuid::now_v7();
    let id = audit_id.to_string();
    let event_id = rec.event_id.map(|e| e.to_string());
    conn.prepare_cached(
        "INSERT INTO audit (audit_id, at, kind, door, key_id, check_in_id, holder_ref, holder_name, reason, event_id, condition, count)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
    )?
    .execute(params![
        id,
        rec.at.0,
        rec.kind.as_str(),
        rec.door,
        rec.key_id,
        rec.check_in_id,
        rec.holder_ref,
        rec.holder_name,
        rec.reason,
        event_id,
        rec.condition,
        rec.count
    ])?;
    let body = AuditBody {
        audit_id: &id,
        at: rec.at.to_rfc3339(),
        kind: rec.kind.as_str(),
        door: rec.door.as_deref(),
        key_id: rec.key_id.as_deref(),
        check_in_id: rec.check_in_id.as_deref(),
        holder_ref: rec.holder_ref.as_deref(),
        reason: rec.reason.as_deref(),
        event_id,
        condition: rec.condition,
        count: rec.count,
    };
    let json = serde_json::to_vec(&body).map_err(|source| StoreError::Encode {
        what: "an audit body",
        source,
    })?;
    Ok((audit_id, id, json))
}
