//! The durable time floors (mqtt.md 'Time'; [`crate::clock`], 'Two
//! floors'): the effective clock never goes back across a restart or a
//! power cut, and a restart judges the system clock as the run before did.
//!
//! The effective floor rises with every verified `issued_at` (the event
//! applier calls [`raise_to`] inside the event's transaction), with every
//! door decision (so no audit row is ever later than the floor a restart
//! sees), and with the runner's [`save`] every
//! [`crate::clock::FLOOR_SAVE_INTERVAL`]; the system floor only with that
//! save. The schema refuses to lower either; nothing here tries.

use super::StoreError;
use crate::clock::Floors;
use lockhub_proto::time::Timestamp;
use rusqlite::Connection;

/// The floors as stored (both 0 on a fresh database).
pub fn load(conn: &Connection) -> Result<Floors, StoreError> {
    let (effective, system) = conn
        .prepare_cached("SELECT floor, system_floor FROM time_floor WHERE id = 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(Floors {
        effective: Timestamp(effective),
        system: Timestamp(system),
    })
}

/// The floors of a database that may not be migrated yet (`lockhub status`
/// reads a database the daemon has not opened since an upgrade): before
/// migration 0010 one floor was both.
pub fn load_any_schema(conn: &Connection) -> Result<Floors, StoreError> {
    let split: bool = conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_info('time_floor') WHERE name = 'system_floor')",
        )?
        .query_row([], |r| r.get(0))?;
    if split {
        return load(conn);
    }
    let floor = conn
        .prepare_cached("SELECT floor FROM time_floor WHERE id = 1")?
        .query_row([], |r| r.get(0))?;
    Ok(Floors {
        effective: Timestamp(floor),
        system: Timestamp(floor),
    })
}

/// Raises the effective floor to `t` if it is below; returns whether it rose.
pub fn raise_to(conn: &Connection, t: Timestamp) -> Result<bool, StoreError> {
    save(
        conn,
        Floors {
            effective: t,
            system: Timestamp(0),
        },
    )
}

/// Raises each floor to the runner's reading where it is below; returns
/// whether one rose.
pub fn save(conn: &Connection, to: Floors) -> Result<bool, StoreError> {
    let n = conn
        .prepare_cached(
            "UPDATE time_floor SET floor = max(floor, ?1), system_floor = max(system_floor, ?2)
              WHERE id = 1 AND (floor < ?1 OR system_floor < ?2)",
        )?
        .execute([to.effective.0, to.system.0])?;
    Ok(n == 1)
}
