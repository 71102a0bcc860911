//! The hub's health figures: what the retained status message carries
//! (mqtt.md 'Status', as extra fields) and `lockhub status` shows under
//! `health`. One home for both, below the sync layer that publishes them
//! and the operator command that prints them, so the two cannot disagree.
//!
//! Read-only: every function here takes a reader connection, and each
//! tolerates a database of any schema (status may read one the daemon has
//! not migrated yet).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;
use serde::Serialize;

use super::alerts::open_alerts;
use super::{StoreError, floor, links, outbox, runtime};
use crate::clock::{Clock, Floors};
use lockhub_proto::time::Timestamp;

/// The hub's health as the cloud sees it in the retained status message
/// (mqtt.md 'Status', as extra fields) and `lockhub status --json` shows it
/// under `health`: both come from [`health`], so they cannot disagree.
/// Counts and states only: nothing here names a key, a guest or a PIN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    /// Seconds since the daemon started (None before it ever ran on this
    /// schema). After a crash it keeps counting until the next start.
    pub uptime_s: Option<i64>,
    pub started_at: Option<String>,
    /// The version of the daemon that last started on this database.
    pub daemon_version: Option<String>,
    pub watermark: i64,
    pub head_seq: i64,
    pub outbox_depth: u64,
    pub outbox_oldest_age_s: Option<i64>,
    /// Open (raised) alerts, counted by condition.
    pub alerts: BTreeMap<String, u64>,
    /// Each link's state: every serial link the daemon has reported, by
    /// name, and `broker` (connecting, up, down, denied; `unknown` before
    /// the daemon ran on this schema).
    pub links: BTreeMap<String, String>,
    pub clock_trusted: bool,
    pub db_bytes: u64,
    pub wal_bytes: u64,
    /// Free space for the hub in `data_dir` (what an unprivileged writer
    /// may use); None where the file system cannot say.
    pub disk_free_bytes: Option<u64>,
}

/// What the cloud watches for changes (a change republishes the status at
/// once, [`crate::sync::plan::HealthSchedule`]): link states, open alerts
/// by condition, clock trust. Counters that move all the time (outbox
/// depth, seqs, sizes) wait for the minute.
pub type HealthKey = (BTreeMap<String, String>, BTreeMap<String, u64>, bool);

/// The name of the broker link among [`Health::links`].
pub const BROKER_LINK: &str = "broker";

impl Health {
    pub fn key(&self) -> HealthKey {
        (self.links.clone(), self.alerts.clone(), self.clock_trusted)
    }
}

/// Only what [`HealthKey`] holds, cheaply (no counts over the outbox, no
/// file sizes): the publisher looks at it every second to see whether the
/// status must go out at once. [`health`] builds its figures from it, so
/// the two cannot disagree.
pub fn health_key(conn: &Connection, now: Timestamp) -> Result<HealthKey, StoreError> {
    let run = runtime::read(conn)?;
    let open = open_alerts(conn)?;
    let mut alerts = BTreeMap::new();
    for a in &open {
        *alerts.entry(a.condition.clone()).or_insert(0) += 1;
    }
    let mut links: BTreeMap<String, String> = if has_table(conn, "links")? {
        links::all(conn)?
            .into_iter()
            .map(|l| (l.serial, l.state.as_str().to_owned()))
            .collect()
    } else {
        BTreeMap::new()
    };
    // A serial called "broker" would be shadowed: the broker link wins.
    links.insert(
        BROKER_LINK.to_owned(),
        run.as_ref()
            .map_or("unknown".to_owned(), |r| r.broker.clone()),
    );
    let clock_trusted = clock_at(conn, now)?.trusted && !alerts.contains_key("clock_untrusted");
    Ok((links, alerts, clock_trusted))
}

/// Whether the database has `table`: status reads a database of any
/// schema, also one the daemon has not migrated yet.
pub(crate) fn has_table(conn: &Connection, table: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
        [table],
        |r| r.get(0),
    )
}

/// The clock as a daemon starting from the durable floors now would see
/// it, with the system clock reading `now` (crate::clock, 'Trust').
pub(crate) struct ClockAt {
    pub(crate) floors: Floors,
    pub(crate) effective: Timestamp,
    pub(crate) trusted: bool,
}

pub(crate) fn clock_at(conn: &Connection, now: Timestamp) -> Result<ClockAt, StoreError> {
    let floors = floor::load_any_schema(conn)?;
    let clock = Clock::start(floors);
    Ok(ClockAt {
        floors,
        effective: clock.peek(now, Duration::ZERO),
        trusted: clock.trusted(now, Duration::ZERO),
    })
}

/// Computes the health figures from `conn` (a reader of the database at
/// `database`) at `now`, the system clock. Called by the publisher for
/// the retained status and by [`crate::ops::status::gather`] for `lockhub status`.
pub fn health(conn: &Connection, database: &Path, now: Timestamp) -> Result<Health, StoreError> {
    let run = runtime::read(conn)?;
    let (watermark, head_seq): (i64, i64) = conn.query_row(
        "SELECT watermark, head_seq FROM seq_state WHERE id = 1",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let oldest = outbox::oldest_unsent(conn)?;
    let (links, alerts, clock_trusted) = health_key(conn, now)?;
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let mut wal = database.as_os_str().to_owned();
    wal.push("-wal");
    let data_dir = database.parent().unwrap_or(Path::new("."));
    let disk_free_bytes = rustix::fs::statvfs(data_dir)
        .ok()
        .map(|v| v.f_bavail.saturating_mul(v.f_frsize));
    Ok(Health {
        uptime_s: run.as_ref().map(|r| age_s(now, r.started_at).max(0)),
        started_at: run.as_ref().map(|r| r.started_at.to_rfc3339()),
        daemon_version: run.map(|r| r.version),
        watermark,
        head_seq,
        outbox_depth: outbox::depth(conn)?,
        outbox_oldest_age_s: oldest.map(|t| age_s(now, t)),
        clock_trusted,
        alerts,
        links,
        db_bytes: size(database),
        wal_bytes: size(Path::new(&wal)),
        disk_free_bytes,
    })
}

/// Whole seconds from `t` to `now` (negative if `t` is later).
pub(crate) fn age_s(now: Timestamp, t: Timestamp) -> i64 {
    (now.0 - t.0).div_euclid(Timestamp::MICROS_PER_SEC)
}
