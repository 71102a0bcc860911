//! Alerts: one per (condition, subject) while the condition holds.
//!
//! Raising an alert that is already raised bumps its `count` and `last_at`
//! rather than opening a new one; the cloud hears of the bump at most once a
//! minute (same `alert_id`, newer count). Clearing publishes a final
//! `cleared` message. The row and its outbox message share a transaction.

use super::StoreError;
use super::outbox::{self, Topic};
use crate::time::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use uuid::Uuid;

/// The alert conditions of mqtt.md 'Alerts'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Condition {
    KeypadLockout,
    BoardOffline,
    DoorForced,
    DoorHeldOpen,
    Tamper,
    BadSignature,
    MalformedEvent,
    EventIdConflict,
    PinAmbiguous,
    ClockUntrusted,
    CloudStale,
    OutboxBacklog,
    StorageFailure,
    SignerExpiring,
    BoardMismatch,
    LinkInsecure,
    ReaderLinkFault,
    ReaderReplaced,
}

impl Condition {
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::KeypadLockout => "keypad_lockout",
            Condition::BoardOffline => "board_offline",
            Condition::DoorForced => "door_forced",
            Condition::DoorHeldOpen => "door_held_open",
            Condition::Tamper => "tamper",
            Condition::BadSignature => "bad_signature",
            Condition::MalformedEvent => "malformed_event",
            Condition::EventIdConflict => "event_id_conflict",
            Condition::PinAmbiguous => "pin_ambiguous",
            Condition::ClockUntrusted => "clock_untrusted",
            Condition::CloudStale => "cloud_stale",
            Condition::OutboxBacklog => "outbox_backlog",
            Condition::StorageFailure => "storage_failure",
            Condition::SignerExpiring => "signer_expiring",
            Condition::BoardMismatch => "board_mismatch",
            Condition::LinkInsecure => "link_insecure",
            Condition::ReaderLinkFault => "reader_link_fault",
            Condition::ReaderReplaced => "reader_replaced",
        }
    }
}

/// How often a still-raised alert's growing count is re-published.
const REPUBLISH_AFTER_US: i64 = 60 * 1_000_000;

#[derive(Serialize)]
struct AlertBody<'a> {
    alert_id: &'a str,
    condition: &'static str,
    subject: &'a str,
    state: &'static str,
    count: i64,
    first_at: String,
    last_at: String,
}

/// An open or closed alert as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRow {
    pub condition: String,
    pub subject: String,
    pub alert_id: String,
    pub raised: bool,
    pub count: i64,
    pub first_at: Timestamp,
    pub last_at: Timestamp,
}

fn publish(
    conn: &Connection,
    row: &AlertRow,
    condition: Condition,
    now: Timestamp,
) -> Result<(), StoreError> {
    let body = AlertBody {
        alert_id: &row.alert_id,
        condition: condition.as_str(),
        subject: &row.subject,
        state: if row.raised { "raised" } else { "cleared" },
        count: row.count,
        first_at: row.first_at.to_rfc3339(),
        last_at: row.last_at.to_rfc3339(),
    };
    let json = serde_json::to_vec(&body).map_err(|e| StoreError::Invalid(e.to_string()))?;
    outbox::enqueue(conn, Topic::Alerts, &json, None, now)?;
    Ok(())
}

fn load(
    conn: &Connection,
    condition: Condition,
    subject: &str,
) -> Result<Option<(AlertRow, i64)>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT alert_id, state, count, first_at, last_at, published_at FROM alerts
              WHERE condition = ?1 AND subject = ?2",
        )?
        .query_row(params![condition.as_str(), subject], |r| {
            Ok((
                AlertRow {
                    condition: condition.as_str().to_owned(),
                    subject: subject.to_owned(),
                    alert_id: r.get(0)?,
                    raised: r.get::<_, String>(1)? == "raised",
                    count: r.get(2)?,
                    first_at: Timestamp(r.get(3)?),
                    last_at: Timestamp(r.get(4)?),
                },
                r.get::<_, i64>(5)?,
            ))
        })
        .optional()?)
}

/// Raises (or bumps by `by`) an alert. Returns `true` when this opened a new alert.
pub fn raise(
    conn: &Connection,
    condition: Condition,
    subject: &str,
    by: i64,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let by = by.max(1);
    match load(conn, condition, subject)? {
        Some((mut row, published_at)) if row.raised => {
            row.count += by;
            row.last_at = row.last_at.max(now);
            let republish = now.0.saturating_sub(published_at) >= REPUBLISH_AFTER_US;
            conn.prepare_cached(
                "UPDATE alerts SET count = ?3, last_at = ?4, published_at = ?5 WHERE condition = ?1 AND subject = ?2",
            )?
            .execute(params![
                condition.as_str(),
                subject,
                row.count,
                row.last_at.0,
                if republish { now.0 } else { published_at }
            ])?;
            if republish {
                publish(conn, &row, condition, now)?;
            }
            Ok(false)
        }
        _ => {
            let row = AlertRow {
                condition: condition.as_str().to_owned(),
                subject: subject.to_owned(),
                alert_id: Uuid::new_v4().to_string(),
                raised: true,
                count: by,
                first_at: now,
                last_at: now,
            };
            conn.prepare_cached(
                "INSERT INTO alerts (condition, subject, alert_id, state, count, first_at, last_at, published_at)
                 VALUES (?1, ?2, ?3, 'raised', ?4, ?5, ?5, ?5)
                 ON CONFLICT (condition, subject) DO UPDATE SET
                   alert_id = excluded.alert_id, state = 'raised', count = excluded.count,
                   first_at = excluded.first_at, last_at = excluded.last_at, published_at = excluded.published_at",
            )?
            .execute(params![condition.as_str(), subject, row.alert_id, row.count, now.0])?;
            publish(conn, &row, condition, now)?;
            Ok(true)
        }
    }
}

/// Clears an alert if it is raised. Returns `true` when it was.
pub fn clear(
    conn: &Connection,
    condition: Condition,
    subject: &str,
    now: Timestamp,
) -> Result<bool, StoreError> {
    match load(conn, condition, subject)? {
        Some((mut row, _)) if row.raised => {
            row.raised = false;
            row.last_at = row.last_at.max(now);
            conn.prepare_cached(
                "UPDATE alerts SET state = 'cleared', last_at = ?3, published_at = ?3 WHERE condition = ?1 AND subject = ?2",
            )?
            .execute(params![condition.as_str(), subject, row.last_at.0])?;
            publish(conn, &row, condition, now)?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Every raised alert.
pub fn open_alerts(conn: &Connection) -> Result<Vec<AlertRow>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT condition, subject, alert_id, count, first_at, last_at FROM alerts
          WHERE state = 'raised' ORDER BY first_at",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(AlertRow {
            condition: r.get(0)?,
            subject: r.get(1)?,
            alert_id: r.get(2)?,
            raised: true,
            count: r.get(3)?,
            first_at: Timestamp(r.get(4)?),
            last_at: Timestamp(r.get(5)?),
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;
    use crate::store::{Priority, Store};

    #[test]
    fn repeats_bump_one_alert_and_clearing_publishes_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db"), &Policy::default()).unwrap();
        let t = Timestamp::from_secs(1_800_000_000);
        let (first, again, cleared, cleared_again) = store
            .write_blocking(Priority::Bulk, move |c| {
                let a = raise(c, Condition::KeypadLockout, "101", 1, t)?;
                let b = raise(
                    c,
                    Condition::KeypadLockout,
                    "101",
                    1,
                    t.saturating_add_secs(1),
                )?;
                let x = clear(c, Condition::KeypadLockout, "101", t.saturating_add_secs(2))?;
                let y = clear(c, Condition::KeypadLockout, "101", t.saturating_add_secs(3))?;
                Ok((a, b, x, y))
            })
            .unwrap();
        assert!(first && !again && cleared && !cleared_again);
        let r = store.reader().unwrap();
        let bodies: Vec<String> = r
            .prepare("SELECT CAST(body AS TEXT) FROM outbox WHERE topic = 'alerts' ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            bodies.len(),
            2,
            "raised once (the bump within a minute is not re-sent), cleared once"
        );
        assert!(bodies[0].contains(r#""state":"raised""#) && bodies[0].contains(r#""count":1"#));
        assert!(bodies[1].contains(r#""state":"cleared""#) && bodies[1].contains(r#""count":2"#));
        assert!(open_alerts(&r).unwrap().is_empty());
    }
}
