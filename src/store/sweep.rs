//! Time-driven upkeep: the expiry sweep and retention pruning.
//!
//! Both work in small batches so that one call is one short transaction on
//! the writer and a door entry never waits long behind it; the caller loops
//! while a batch came back full ([`EXPIRE_BATCH`], [`Pruned::more`]).

use super::StoreError;
use super::audit::{self, AuditRecord};
use crate::config::Policy;
use lockhub_proto::outputs::AuditKind;
use lockhub_proto::time::Timestamp;
use rusqlite::{Connection, params};

/// Keys made final per [`expire_due`] call.
pub const EXPIRE_BATCH: usize = 200;
/// Rows deleted per table per [`prune`] call.
pub const PRUNE_BATCH: usize = 1000;
/// How long a sent outbox row is kept (for diagnosis) before it is pruned.
pub const OUTBOX_SENT_RETENTION_DAYS: i64 = 7;

/// Makes live keys past `valid_until` (by the effective time `now`)
/// `expired`, each with a `key.expired` audit row, at most
/// [`EXPIRE_BATCH`] per call, oldest first. Returns how many.
///
/// Does nothing while the clock is untrusted: expiring is final, and a
/// clock running ahead would end stays for good. The door decision already
/// denies past `valid_until` by itself, so waiting costs no safety.
pub fn expire_due(
    conn: &Connection,
    now: Timestamp,
    clock_trusted: bool,
) -> Result<usize, StoreError> {
    if !clock_trusted {
        return Ok(0);
    }
    // `LIMIT +?2`: see `STATEMENT_CACHE` (store/mod.rs).
    let due: Vec<(String, Option<String>, Option<String>)> = conn
        .prepare_cached(
            "SELECT key_id, check_in_id, holder_ref FROM keys
              WHERE state IN ('pre_issued', 'active') AND valid_until <= ?1
              ORDER BY valid_until LIMIT +?2",
        )?
        .query_map(params![now.0, EXPIRE_BATCH as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<_, _>>()?;
    let mut expire = conn.prepare_cached(
        "UPDATE keys SET state = 'expired', event_id = NULL, updated_at = ?2
          WHERE key_id = ?1 AND state IN ('pre_issued', 'active')",
    )?;
    for (key_id, check_in_id, holder_ref) in &due {
        expire.execute(params![key_id, now.0])?;
        let mut rec = AuditRecord::new(AuditKind::KeyExpired, now);
        rec.key_id = Some(key_id.clone());
        rec.check_in_id = check_in_id.clone();
        rec.holder_ref = holder_ref.clone();
        audit::record(conn, &rec)?;
    }
    Ok(due.len())
}

/// How many rows one [`prune`] call deleted, per table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub dedupe: usize,
    pub keys: usize,
    pub key_tombstones: usize,
    pub reservation_tombstones: usize,
    pub erased_holders: usize,
    pub outbox: usize,
    pub audit: usize,
    pub lockouts: usize,
}

impl Pruned {
    /// Some table had a full batch: call again.
    pub fn more(&self) -> bool {
        [
            self.dedupe,
            self.keys,
            self.key_tombstones,
            self.reservation_tombstones,
            self.erased_holders,
            self.outbox,
            self.audit,
            self.lockouts,
        ]
        .iter()
        .any(|&n| n >= PRUNE_BATCH)
    }
}

/// The cutoff instant: the earlier of `now` and SQLite's own wall clock,
/// which the schema's retention triggers use. Deleting only what is old by
/// both means a trigger can never abort the statement (and with it the
/// whole batch) over a row this code thought was old enough.
const CUTOFF: &str = "min(?1, CAST(unixepoch('subsec') * 1000000 AS INTEGER))";

/// A retention in days, in microseconds: the longer of the config's and the
/// one the triggers read from the `policy` table.
fn days_us(days: u32, column: &str) -> String {
    format!(
        "(max({days}, (SELECT {column} FROM policy WHERE id = 1)) * {})",
        Timestamp::MICROS_PER_DAY
    )
}

/// Deletes what retention allows (mqtt.md 'Invariants'), a batch per table:
/// - dedupe rows received more than `dedupe_retention_days` ago;
/// - final keys (and their doors) past `valid_until + dedupe_retention_days`;
/// - tombstones and erased holder_refs older than `max_grant_days +
///   dedupe_retention_days`;
/// - sent outbox rows older than [`OUTBOX_SENT_RETENTION_DAYS`];
/// - audit rows acknowledged by the broker and older than `audit_retention_days`;
/// - lockout episodes that ended more than `audit_retention_days` ago.
///
/// Unsent outbox rows, unacknowledged audit rows and live keys are never
/// touched; the schema's triggers refuse them even if this code were wrong.
pub fn prune(conn: &Connection, now: Timestamp, policy: &Policy) -> Result<Pruned, StoreError> {
    let dedupe = days_us(policy.dedupe_retention_days, "dedupe_retention_days");
    let tomb = format!(
        "({} + {})",
        days_us(policy.max_grant_days, "max_grant_days"),
        dedupe
    );
    let audit_days = days_us(policy.audit_retention_days, "audit_retention_days");
    let outbox_us = OUTBOX_SENT_RETENTION_DAYS * Timestamp::MICROS_PER_DAY;
    let n = PRUNE_BATCH;
    let run = |sql: String| -> Result<usize, StoreError> {
        Ok(conn.prepare_cached(&sql)?.execute([now.0])?)
    };
    Ok(Pruned {
        dedupe: run(format!(
            "DELETE FROM dedupe WHERE (site_id, event_id) IN (SELECT site_id, event_id FROM dedupe
               WHERE received_at <= {CUTOFF} - {dedupe} LIMIT {n})"
        ))?,
        keys: run(format!(
            "DELETE FROM keys WHERE key_id IN (SELECT key_id FROM keys
               WHERE state IN ('revoked', 'expired', 'used_up') AND valid_until <= {CUTOFF} - {dedupe} LIMIT {n})"
        ))?,
        key_tombstones: run(format!(
            "DELETE FROM key_tombstones WHERE key_id IN (SELECT key_id FROM key_tombstones
               WHERE created_at <= {CUTOFF} - {tomb} LIMIT {n})"
        ))?,
        reservation_tombstones: run(format!(
            "DELETE FROM reservation_tombstones WHERE reservation_id IN (
               SELECT reservation_id FROM reservation_tombstones
               WHERE created_at <= {CUTOFF} - {tomb} LIMIT {n})"
        ))?,
        erased_holders: run(format!(
            "DELETE FROM erased_holders WHERE holder_ref IN (SELECT holder_ref FROM erased_holders
               WHERE created_at <= {CUTOFF} - {tomb} LIMIT {n})"
        ))?,
        outbox: run(format!(
            "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox
               WHERE sent_at IS NOT NULL AND sent_at <= ?1 - {outbox_us} LIMIT {n})"
        ))? + run(format!(
            // The sent outbox rows of audit rows about to go: the foreign key
            // would refuse the audit delete while they exist.
            "DELETE FROM outbox WHERE sent_at IS NOT NULL AND audit_id IN (
               SELECT audit_id FROM audit WHERE acked_at IS NOT NULL
               AND at <= {CUTOFF} - {audit_days} LIMIT {n})"
        ))?,
        audit: run(format!(
            "DELETE FROM audit WHERE seqno IN (SELECT seqno FROM audit a
               WHERE acked_at IS NOT NULL AND at <= {CUTOFF} - {audit_days}
                 AND NOT EXISTS (SELECT 1 FROM outbox o WHERE o.audit_id = a.audit_id)
               LIMIT {n})"
        ))?,
        lockouts: run(format!(
            "DELETE FROM lockouts WHERE (door, started_at) IN (SELECT door, started_at FROM lockouts
               WHERE until <= ?1 - {audit_days} LIMIT {n})"
        ))?,
    })
}
