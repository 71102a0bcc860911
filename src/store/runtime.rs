//! The daemon's run state (`hub_runtime`, migration 0007): when it started,
//! which version, and the broker link's state. For `lockhub status` and the
//! health in the retained status message, which both read it through
//! [`super::health`].
//!
//! Operational, not an invariant: the one row is upserted. The broker state
//! is written only when it changes (each write is an fsync).

use super::StoreError;
use lockhub_proto::time::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};

/// The broker link's state (the `broker` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BrokerState {
    Connecting,
    Up,
    Down,
    Denied,
}

impl BrokerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BrokerState::Connecting => "connecting",
            BrokerState::Up => "up",
            BrokerState::Down => "down",
            BrokerState::Denied => "denied",
        }
    }
}

/// The `hub_runtime` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeRow {
    pub started_at: Timestamp,
    pub version: String,
    pub broker: String,
    pub broker_since: Timestamp,
}

/// A daemon started now: its version, broker `connecting`.
pub fn record_start(conn: &Connection, now: Timestamp) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO hub_runtime (id, started_at, version, broker, broker_since)
         VALUES (1, ?1, ?2, 'connecting', ?1)
         ON CONFLICT (id) DO UPDATE SET started_at = ?1, version = ?2,
             broker = 'connecting', broker_since = ?1,
             broker_error = NULL, broker_error_since = NULL",
        params![now.0, env!("CARGO_PKG_VERSION")],
    )?;
    Ok(())
}

/// The broker link is now `state` (`broker_since` moves only on a change).
pub fn record_broker(
    conn: &Connection,
    state: BrokerState,
    now: Timestamp,
) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE hub_runtime SET broker_since = CASE WHEN broker = ?1 THEN broker_since ELSE ?2 END,
             broker = ?1 WHERE id = 1",
        params![state.as_str(), now.0],
    )?;
    Ok(())
}

/// Longest error text kept (the column's CHECK); longer ones are cut.
pub const MAX_ERROR_LEN: usize = 512;

/// The broker link's last error is now `error` (None: connected, no error
/// since). `broker_error_since` moves only when the text changes.
pub fn record_broker_error(
    conn: &Connection,
    error: Option<&str>,
    now: Timestamp,
) -> Result<(), StoreError> {
    let error = error.map(|e| {
        let mut end = e.len().min(MAX_ERROR_LEN);
        while !e.is_char_boundary(end) {
            end -= 1;
        }
        &e[..end]
    });
    conn.execute(
        "UPDATE hub_runtime SET
             broker_error_since = CASE WHEN ?1 IS NULL THEN NULL
                 WHEN broker_error IS ?1 THEN broker_error_since ELSE ?2 END,
             broker_error = ?1 WHERE id = 1",
        params![error, now.0],
    )?;
    Ok(())
}

/// The broker link's last error and since when, if any (None also on a
/// database older than migration 0013).
pub fn read_broker_error(conn: &Connection) -> Result<Option<(String, Timestamp)>, StoreError> {
    let has_column: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM pragma_table_info('hub_runtime') WHERE name = 'broker_error')",
        [],
        |r| r.get(0),
    )?;
    if !has_column {
        return Ok(None);
    }
    Ok(conn
        .query_row(
            "SELECT broker_error, broker_error_since FROM hub_runtime
             WHERE id = 1 AND broker_error IS NOT NULL",
            [],
            |r| Ok((r.get(0)?, Timestamp(r.get(1)?))),
        )
        .optional()?)
}

/// The row, if a daemon of this schema has started (None before that, and
/// on a database older than migration 0007).
pub fn read(conn: &Connection) -> Result<Option<RuntimeRow>, StoreError> {
    let has_table: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'hub_runtime')",
        [],
        |r| r.get(0),
    )?;
    if !has_table {
        return Ok(None);
    }
    Ok(conn
        .query_row(
            "SELECT started_at, version, broker, broker_since FROM hub_runtime WHERE id = 1",
            [],
            |r| {
                Ok(RuntimeRow {
                    started_at: Timestamp(r.get(0)?),
                    version: r.get(1)?,
                    broker: r.get(2)?,
                    broker_since: Timestamp(r.get(3)?),
                })
            },
        )
        .optional()?)
}
