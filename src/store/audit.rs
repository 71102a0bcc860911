//! The audit log: door decisions and key lifecycle, append-only.
//!
//! [`record`] writes the row and its outbox entry together; the caller's
//! transaction decides whether both exist. The published body never carries
//! `holder_name`: personal data stays on the hub, where erasure can reach it.

use super::StoreError;
use super::outbox::{self, Topic};
use lockhub_proto::outputs::{AuditBody, AuditKind, Condition};
use lockhub_proto::time::Timestamp;
use rusqlite::{Connection, params};
use uuid::Uuid;

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
    pub condition: Option<Condition>,
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
        rec.condition.map(Condition::as_str),
        rec.count
    ])?;
    let body = AuditBody {
        audit_id,
        at: rec.at,
        kind: rec.kind,
        door: rec.door.clone(),
        key_id: rec.key_id.clone(),
        check_in_id: rec.check_in_id.clone(),
        holder_ref: rec.holder_ref.clone(),
        reason: rec.reason.clone(),
        event_id: rec.event_id,
        condition: rec.condition,
        count: rec.count,
    };
    let json = serde_json::to_vec(&body).map_err(|source| StoreError::Encode {
        what: "an audit body",
        source,
    })?;
    Ok((audit_id, id, json))
}
