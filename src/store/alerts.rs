//! Alerts: one per (condition, subject) while the condition holds.
//!
//! Raising an alert that is already raised bumps its `count` and `last_at`
//! rather than opening a new one; the cloud hears of the bump at most once a
//! minute (same `alert_id`, newer count). Clearing publishes a final
//! `cleared` message. The row and its outbox message share a transaction.

use super::StoreError;
use super::audit::{self, AuditRecord};
use super::outbox::{self, Topic};
use lockhub_proto::outputs::{AlertBody, AlertState, AuditKind, Condition};
use lockhub_proto::time::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

/// How often a still-raised alert's growing count is re-published.
const REPUBLISH_AFTER_US: i64 = 60 * 1_000_000;

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
        alert_id: row.alert_id.clone(),
        condition,
        subject: row.subject.clone(),
        state: if row.raised {
            AlertState::Raised
        } else {
            AlertState::Cleared
        },
        count: row.count,
        first_at: row.first_at,
        last_at: row.last_at,
    };
    let json = serde_json::to_vec(&body).map_err(|source| StoreError::Encode {
        what: "an alert body",
        source,
    })?;
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

/// What a record does to an alert: the one form the serial and OSDP
/// recorders queue, so a link row and the alert it raises or clears can
/// travel (and commit) together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// One more occurrence (opens the alert if it is not raised).
    Raise,
    Clear,
}

impl Change {
    pub fn write(
        self,
        conn: &Connection,
        condition: Condition,
        subject: &str,
        at: Timestamp,
    ) -> Result<(), StoreError> {
        match self {
            Change::Raise => raise(conn, condition, subject, 1, at).map(drop),
            Change::Clear => clear(conn, condition, subject, at).map(drop),
        }
    }

    /// For log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Raise => "raise",
            Change::Clear => "clear",
        }
    }
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
    let loaded = load(conn, condition, subject)?;
    let exists = loaded.is_some();
    match loaded {
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
            // A cleared row opens again as a new alert; the schema refuses
            // an insert over an existing row (`alerts_no_overwrite`).
            let sql = if exists {
                "UPDATE alerts SET alert_id = ?3, state = 'raised', count = ?4,
                   first_at = ?5, last_at = ?5, published_at = ?5
                 WHERE condition = ?1 AND subject = ?2"
            } else {
                "INSERT INTO alerts (condition, subject, alert_id, state, count, first_at, last_at, published_at)
                 VALUES (?1, ?2, ?3, 'raised', ?4, ?5, ?5, ?5)"
            };
            conn.prepare_cached(sql)?.execute(params![
                condition.as_str(),
                subject,
                row.alert_id,
                row.count,
                now.0
            ])?;
            publish(conn, &row, condition, now)?;
            Ok(true)
        }
    }
}

/// The condition is a state that still holds: opens its alert if it is not
/// raised, and leaves a raised one as it is. For what the hub looks at again
/// and again (its clock, the signers, the cloud's silence, the backlog):
/// looking again is not a new occurrence, so `count` does not grow, and an
/// alert an operator cleared by hand while the state lasts is raised again
/// (mqtt.md: one alert per condition and subject while it holds). Returns
/// `true` when this opened it.
pub fn hold(
    conn: &Connection,
    condition: Condition,
    subject: &str,
    now: Timestamp,
) -> Result<bool, StoreError> {
    match load(conn, condition, subject)? {
        Some((row, _)) if row.raised => Ok(false),
        _ => raise(conn, condition, subject, 1, now),
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

/// Clears every raised alert of `condition`, whatever its subject. Returns
/// how many it cleared.
pub fn clear_all(
    conn: &Connection,
    condition: Condition,
    now: Timestamp,
) -> Result<usize, StoreError> {
    let subjects = raised_subjects(conn, condition)?;
    for subject in &subjects {
        clear(conn, condition, subject, now)?;
    }
    Ok(subjects.len())
}

/// Clears every raised alert of `condition` whose subject `keep` does not
/// hold. Returns how many it cleared.
pub fn clear_unless(
    conn: &Connection,
    condition: Condition,
    keep: &std::collections::BTreeSet<String>,
    now: Timestamp,
) -> Result<usize, StoreError> {
    let mut cleared = 0;
    for subject in raised_subjects(conn, condition)? {
        if !keep.contains(&subject) {
            cleared += usize::from(clear(conn, condition, &subject, now)?);
        }
    }
    Ok(cleared)
}

/// The subjects of every raised alert of `condition`.
pub fn raised_subjects(conn: &Connection, condition: Condition) -> Result<Vec<String>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT subject FROM alerts WHERE condition = ?1 AND state = 'raised' ORDER BY subject",
        )?
        .query_map([condition.as_str()], |r| r.get(0))?
        .collect::<Result<_, _>>()?)
}

/// Publishes the raised alerts bumped since their last message once that
/// message is [`REPUBLISH_AFTER_US`] old. A bump within that time is kept
/// back ([`raise`]), so a burst costs one message a minute; without this
/// a bump followed by silence would reach the cloud only with the clear,
/// maybe days later. Returns how many it published.
pub fn publish_bumps(conn: &Connection, now: Timestamp) -> Result<usize, StoreError> {
    let due: Vec<(String, String)> = conn
        .prepare_cached(
            "SELECT condition, subject FROM alerts
              WHERE state = 'raised' AND last_at > published_at AND published_at <= ?1
              ORDER BY condition, subject",
        )?
        .query_map([now.0.saturating_sub(REPUBLISH_AFTER_US)], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut published = 0;
    for (name, subject) in &due {
        let Some(condition) = Condition::parse(name) else {
            continue;
        };
        if let Some((row, _)) = load(conn, condition, subject)? {
            conn.prepare_cached(
                "UPDATE alerts SET published_at = ?3 WHERE condition = ?1 AND subject = ?2",
            )?
            .execute(params![name, subject, now.0])?;
            publish(conn, &row, condition, now)?;
            published += 1;
        }
    }
    Ok(published)
}

/// Clears the alerts of [`Condition::ends_when_quiet`] conditions whose last
/// occurrence is `quiet_s` or more before `now`. Returns how many it cleared.
pub fn clear_quiet(conn: &Connection, quiet_s: u32, now: Timestamp) -> Result<usize, StoreError> {
    let before = now.saturating_add_secs(-i64::from(quiet_s));
    let mut cleared = 0;
    for condition in Condition::ALL.into_iter().filter(|c| c.ends_when_quiet()) {
        let subjects: Vec<String> = conn
            .prepare_cached(
                "SELECT subject FROM alerts
                  WHERE condition = ?1 AND state = 'raised' AND last_at <= ?2 ORDER BY subject",
            )?
            .query_map(params![condition.as_str(), before.0], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        for subject in &subjects {
            clear(conn, condition, subject, now)?;
        }
        cleared += subjects.len();
    }
    Ok(cleared)
}

/// Remembers which keys a raised alert is about, so that the schema ends it
/// when one of them stops being live (`pin_ambiguous`; migration 0003).
pub fn remember_keys(
    conn: &Connection,
    condition: Condition,
    subject: &str,
    key_ids: &[&str],
) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(
        "INSERT OR IGNORE INTO alert_keys (condition, subject, key_id) VALUES (?1, ?2, ?3)",
    )?;
    for key_id in key_ids {
        stmt.execute(params![condition.as_str(), subject, key_id])?;
    }
    Ok(())
}

/// An operator cleared an alert by hand: clears it and writes the
/// `alert.cleared` audit row with their reason, in one transaction. Returns
/// `false`, changing nothing, when the alert is not raised.
pub fn clear_by_hand(
    conn: &Connection,
    condition: Condition,
    subject: &str,
    reason: &str,
    now: Timestamp,
) -> Result<bool, StoreError> {
    if !clear(conn, condition, subject, now)? {
        return Ok(false);
    }
    let mut rec = AuditRecord::new(AuditKind::AlertCleared, now);
    rec.door = Some(subject.to_owned());
    rec.reason = Some(reason.to_owned());
    rec.condition = Some(condition);
    audit::record(conn, &rec)?;
    Ok(true)
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

    fn open_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db"), &Policy::default()).unwrap();
        (dir, store)
    }

    /// Every alert message the outbox holds, oldest first.
    fn alert_bodies(store: &Store) -> Vec<String> {
        store
            .reader()
            .unwrap()
            .prepare("SELECT CAST(body AS TEXT) FROM outbox WHERE topic = 'alerts' ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_state_that_holds_opens_its_alert_once_never_bumps_it_and_opens_it_again_after_a_clear() {
        let (_dir, store) = open_store();
        let t = Timestamp::from_secs(1_800_000_000);
        let (opened, again, reopened) = store
            .write_blocking(Priority::Bulk, move |c| {
                let a = hold(c, Condition::ClockUntrusted, "hub", t)?;
                let b = hold(
                    c,
                    Condition::ClockUntrusted,
                    "hub",
                    t.saturating_add_secs(10),
                )?;
                clear(
                    c,
                    Condition::ClockUntrusted,
                    "hub",
                    t.saturating_add_secs(20),
                )?;
                let r = hold(
                    c,
                    Condition::ClockUntrusted,
                    "hub",
                    t.saturating_add_secs(30),
                )?;
                Ok((a, b, r))
            })
            .unwrap();
        assert_eq!((opened, again, reopened), (true, false, true));
        let reader = store.reader().unwrap();
        let row = open_alerts(&reader).unwrap().pop().unwrap();
        assert_eq!(row.count, 1, "asking again is not an occurrence");
        assert_eq!(row.first_at, t.saturating_add_secs(30), "a new alert");
        let published = alert_bodies(&store).len();
        assert_eq!(
            published, 3,
            "raised, cleared, raised: the held look published nothing"
        );
    }

    #[test]
    fn a_bump_held_back_within_the_minute_is_sent_once_the_minute_is_over() {
        let (_dir, store) = open_store();
        let t = Timestamp::from_secs(1_800_000_000);
        let (early, due, again) = store
            .write_blocking(Priority::Bulk, move |c| {
                raise(c, Condition::Tamper, "board-a", 1, t)?;
                raise(c, Condition::Tamper, "board-a", 1, t.saturating_add_secs(5))?;
                let early = publish_bumps(c, t.saturating_add_secs(59))?;
                let due = publish_bumps(c, t.saturating_add_secs(60))?;
                let again = publish_bumps(c, t.saturating_add_secs(600))?;
                Ok((early, due, again))
            })
            .unwrap();
        assert_eq!(
            (early, due, again),
            (0, 1, 0),
            "once, a minute after the last message"
        );
        let bodies = alert_bodies(&store);
        assert_eq!(bodies.len(), 2);
        assert!(bodies[1].contains(r#""state":"raised""#) && bodies[1].contains(r#""count":2"#));
    }

    #[test]
    fn repeats_bump_one_alert_and_clearing_publishes_once() {
        let (_dir, store) = open_store();
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
        let bodies = alert_bodies(&store);
        assert_eq!(
            bodies.len(),
            2,
            "raised once (the bump within a minute is not re-sent), cleared once"
        );
        assert!(bodies[0].contains(r#""state":"raised""#) && bodies[0].contains(r#""count":1"#));
        assert!(bodies[1].contains(r#""state":"cleared""#) && bodies[1].contains(r#""count":2"#));
        assert!(open_alerts(&r).unwrap().is_empty());
    }

    /// ARCHITECTURE.md's "Alerts: where each starts and ends" is the one
    /// place that says, per condition, where it is raised and where it
    /// ends: every condition has its row, and every file a row names exists.
    #[test]
    fn every_condition_has_its_row_in_the_map_of_where_alerts_start_and_end() {
        let doc = include_str!("../../ARCHITECTURE.md");
        let section = doc
            .split("### Alerts: where each starts and ends")
            .nth(1)
            .and_then(|rest| rest.split("\n## ").next())
            .expect("the section is in ARCHITECTURE.md");
        let rows: Vec<&str> = section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .collect();
        for c in Condition::ALL {
            let name = format!("`{}`", c.as_str());
            let row = rows
                .iter()
                .find(|r| r.split('|').nth(1).is_some_and(|first| first.contains(&name)));
            assert!(row.is_some(), "{name} has no row in ARCHITECTURE.md's alert map");
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        for row in &rows {
            for path in row
                .split('`')
                .filter(|p| p.starts_with("src/") || p.starts_with("migrations/"))
            {
                assert!(root.join(path).exists(), "{path} (named in the alert map) exists");
            }
        }
    }
}
