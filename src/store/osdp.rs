//! OSDP readers' identities and link state (migration 0006).
//!
//! `osdp_readers` is the reference a reader's PDID is checked against
//! (`reader_replaced`); the bus tasks and `lockhub osdp install` write it.
//! `osdp_links` and `osdp_buses` are operational state for `lockhub status`,
//! upserted freely; write them on a change, never per packet.

use super::StoreError;
use lockhub_proto::time::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};

/// A reader's identity (osdp_PDID).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReaderIdentity {
    pub vendor: u32,
    pub model: u8,
    pub version: u8,
    pub serial: u32,
    pub firmware: u32,
}

/// Records a reader's first identity, if none is recorded: what `lockhub
/// run` does for a reader keyed by hand. Never replaces one: only `lockhub
/// osdp install` ([`record_identity`]) may, so a run that could not read
/// the reference cannot overwrite it with a stranger's. Returns whether it
/// was recorded.
pub fn adopt_identity(
    conn: &Connection,
    reader: &str,
    id: &ReaderIdentity,
    now: Timestamp,
) -> Result<bool, StoreError> {
    insert_identity(conn, reader, id, now, "DO NOTHING").map(|n| n == 1)
}

/// Records (or replaces) a reader's identity (`lockhub osdp install`).
pub fn record_identity(
    conn: &Connection,
    reader: &str,
    id: &ReaderIdentity,
    now: Timestamp,
) -> Result<(), StoreError> {
    insert_identity(
        conn,
        reader,
        id,
        now,
        "DO UPDATE SET vendor = excluded.vendor, model = excluded.model,
           version = excluded.version, serial = excluded.serial,
           firmware = excluded.firmware, recorded_at = excluded.recorded_at",
    )
    .map(drop)
}

/// The identity row, with `on_conflict` deciding what a recorded one gets.
fn insert_identity(
    conn: &Connection,
    reader: &str,
    id: &ReaderIdentity,
    now: Timestamp,
    on_conflict: &str,
) -> Result<usize, StoreError> {
    Ok(conn
        .prepare_cached(&format!(
            "INSERT INTO osdp_readers (reader, vendor, model, version, serial, firmware, recorded_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (reader) {on_conflict}"
        ))?
        .execute(params![
            reader,
            id.vendor,
            id.model,
            id.version,
            id.serial,
            id.firmware,
            now.0
        ])?)
}

/// The recorded identity of a reader, if any.
pub fn identity(conn: &Connection, reader: &str) -> Result<Option<ReaderIdentity>, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT vendor, model, version, serial, firmware FROM osdp_readers WHERE reader = ?1",
        )?
        .query_row([reader], |r| {
            Ok(ReaderIdentity {
                vendor: r.get(0)?,
                model: r.get(1)?,
                version: r.get(2)?,
                serial: r.get(3)?,
                firmware: r.get(4)?,
            })
        })
        .optional()?)
}

/// One reader's live state, as the bus task last wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderLink {
    pub reader: String,
    pub bus: String,
    pub address: u8,
    pub online: bool,
    pub secure: bool,
    pub quarantined: bool,
    pub seen_serial: Option<u32>,
    pub since: Timestamp,
}

/// Upserts a reader's link row; `since` moves when `online` changes.
pub fn set_link(conn: &Connection, l: &ReaderLink) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO osdp_links (reader, bus, address, online, secure, quarantined, seen_serial, since)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (reader) DO UPDATE SET
           since = CASE WHEN online = excluded.online THEN since ELSE excluded.since END,
           bus = excluded.bus, address = excluded.address, online = excluded.online,
           secure = excluded.secure, quarantined = excluded.quarantined,
           seen_serial = coalesce(excluded.seen_serial, seen_serial)",
    )?
    .execute(params![
        l.reader,
        l.bus,
        l.address,
        l.online,
        l.secure && l.online,
        l.quarantined,
        l.seen_serial,
        l.since.0
    ])?;
    Ok(())
}

/// Every reader's link row.
pub fn links(conn: &Connection) -> Result<Vec<ReaderLink>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT reader, bus, address, online, secure, quarantined, seen_serial, since
           FROM osdp_links ORDER BY bus, address",
    )?;
    let rows = stmt
        .query_map([], |r| {
            Ok(ReaderLink {
                reader: r.get(0)?,
                bus: r.get(1)?,
                address: r.get(2)?,
                online: r.get(3)?,
                secure: r.get(4)?,
                quarantined: r.get(5)?,
                seen_serial: r.get(6)?,
                since: Timestamp(r.get(7)?),
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// A bus's counters of rejected packets and noise.
pub fn set_bus_counters(
    conn: &Connection,
    bus: &str,
    bad_packets: u64,
    garbage_bytes: u64,
    now: Timestamp,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO osdp_buses (bus, bad_packets, garbage_bytes, updated_at) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (bus) DO UPDATE SET bad_packets = excluded.bad_packets,
           garbage_bytes = excluded.garbage_bytes, updated_at = excluded.updated_at",
    )?
    .execute(params![
        bus,
        i64::try_from(bad_packets).unwrap_or(i64::MAX),
        i64::try_from(garbage_bytes).unwrap_or(i64::MAX),
        now.0
    ])?;
    Ok(())
}

/// Every bus's counters: (bus, bad packets, garbage bytes).
pub fn bus_counters(conn: &Connection) -> Result<Vec<(String, i64, i64)>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT bus, bad_packets, garbage_bytes FROM osdp_buses ORDER BY bus")?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;
    use crate::store::Store;

    fn id(serial: u32) -> ReaderIdentity {
        ReaderIdentity {
            vendor: 0x00_0a_0b,
            model: 1,
            version: 2,
            serial,
            firmware: 3,
        }
    }

    #[test]
    fn a_run_adopts_a_first_identity_but_never_replaces_one_and_install_does() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("lockhub.db"), &Policy::default()).unwrap();
        let at = Timestamp::from_secs(1_800_000_000);
        let adopt = |serial| {
            store
                .write_blocking(crate::store::Priority::Bulk, move |c| {
                    adopt_identity(c, "r-1", &id(serial), at)
                })
                .unwrap()
        };
        assert!(adopt(0x1111));
        assert!(!adopt(0x2222), "a run never replaces the reference");
        let read = || identity(&store.reader().unwrap(), "r-1").unwrap();
        assert_eq!(read(), Some(id(0x1111)));
        store
            .write_blocking(crate::store::Priority::Bulk, move |c| {
                record_identity(c, "r-1", &id(0x2222), at)
            })
            .unwrap();
        assert_eq!(read(), Some(id(0x2222)), "install does");
    }
}
