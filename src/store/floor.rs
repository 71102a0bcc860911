//! The durable time floor (mqtt.md 'Time'): the effective clock never goes
//! back across a restart or a power cut.
//!
//! The floor rises with every verified `issued_at` (the event applier calls
//! [`raise_to`] inside the event's transaction), with the runner's reading
//! saved every [`crate::clock::FLOOR_SAVE_INTERVAL`], and with every door
//! decision (so no audit row is ever later than the floor a restart sees).
//! The schema refuses to lower it; [`raise_to`] never tries.

use super::StoreError;
use crate::time::Timestamp;
use rusqlite::Connection;

/// The floor as stored (0 on a fresh database).
pub fn load(conn: &Connection) -> Result<Timestamp, StoreError> {
    let floor: i64 = conn
        .prepare_cached("SELECT floor FROM time_floor WHERE id = 1")?
        .query_row([], |r| r.get(0))?;
    Ok(Timestamp(floor))
}

/// Raises the floor to `t` if it is below; returns whether it rose.
pub fn raise_to(conn: &Connection, t: Timestamp) -> Result<bool, StoreError> {
    let n = conn
        .prepare_cached("UPDATE time_floor SET floor = ?1 WHERE id = 1 AND floor < ?1")?
        .execute([t.0])?;
    Ok(n == 1)
}
