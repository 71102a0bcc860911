//! Serial link state (`links`, migration 0002), counters
//! (`link_counters`, migration 0011) and sealing (`link_seal`, migration
//! 0016), for `lockhub status`.
//!
//! The serial driver owns these writes; `status` only reads them from another
//! process. They are operational, not invariants, so the helpers upsert.
//!
//! Writes cost an fsync (`synchronous=FULL`) on an SD card: call
//! [`set_state`] on a state change and [`hello`] on a board Hello, and
//! [`frame_seen`] at most every [`FRAME_SEEN_EVERY_S`] seconds, never per frame;
//! [`set_bad_frames`] likewise at most every [`COUNTERS_EVERY_S`].

use super::StoreError;
use lockhub_proto::time::Timestamp;
use rusqlite::{Connection, params};

/// How stale `last_frame_at` may be while a link is up.
pub const FRAME_SEEN_EVERY_S: i64 = 30;

/// How stale `link_counters` may be while bad frames keep coming.
pub const COUNTERS_EVERY_S: i64 = 5;

/// When a driver's counters for `lockhub status` (a serial link's bad
/// frames, an OSDP bus's bad packets) are due to be written: the first
/// time, then while they change at most every [`COUNTERS_EVERY_S`], and at
/// once when `force`d (at stop), since each write costs an fsync.
#[derive(Debug, Clone, Copy)]
pub struct CounterWrites<T> {
    last: Option<(std::time::Instant, T)>,
}

impl<T> Default for CounterWrites<T> {
    fn default() -> Self {
        CounterWrites { last: None }
    }
}

impl<T: PartialEq + Copy> CounterWrites<T> {
    /// Whether `value` is to be written now; if so, it counts as written.
    pub fn due(&mut self, value: T, force: bool) -> bool {
        let every = std::time::Duration::from_secs(COUNTERS_EVERY_S as u64);
        let due = match self.last {
            None => true,
            Some((t, v)) => v != value && (force || t.elapsed() >= every),
        };
        if due {
            self.last = Some((std::time::Instant::now(), value));
        }
        due
    }
}

/// A link's state (the `state` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkState {
    /// Port open, a valid frame within 6 s.
    Up,
    /// Port open, no valid frame for 6 s (`board_offline`).
    Down,
    /// The port cannot be opened.
    Absent,
}

impl LinkState {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Up => "up",
            LinkState::Down => "down",
            LinkState::Absent => "absent",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "up" => LinkState::Up,
            "down" => LinkState::Down,
            "absent" => LinkState::Absent,
            _ => return None,
        })
    }
}

/// One row of `links`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkRow {
    pub serial: String,
    pub state: LinkState,
    pub board_id: Option<u8>,
    pub fw: Option<(u8, u8)>,
    pub since: Timestamp,
    pub last_frame_at: Option<Timestamp>,
}

/// Records `state`; `since` moves only when the state changes. `up` also
/// stamps `last_frame_at` (a state goes up on a valid frame).
pub fn set_state(
    conn: &Connection,
    serial: &str,
    state: LinkState,
    now: Timestamp,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO links (serial, state, since, last_frame_at)
         VALUES (?1, ?2, ?3, CASE WHEN ?2 = 'up' THEN ?3 END)
         ON CONFLICT (serial) DO UPDATE SET
           since = CASE WHEN state = excluded.state THEN since ELSE excluded.since END,
           state = excluded.state,
           last_frame_at = coalesce(excluded.last_frame_at, last_frame_at)",
    )?
    .execute(params![serial, state.as_str(), now.0])?;
    Ok(())
}

/// A board's Hello: its id and firmware version; the link is up.
pub fn hello(
    conn: &Connection,
    serial: &str,
    board_id: u8,
    fw_major: u8,
    fw_minor: u8,
    now: Timestamp,
) -> Result<(), StoreError> {
    set_state(conn, serial, LinkState::Up, now)?;
    conn.prepare_cached(
        "UPDATE links SET board_id = ?2, fw_major = ?3, fw_minor = ?4 WHERE serial = ?1",
    )?
    .execute(params![serial, board_id, fw_major, fw_minor])?;
    Ok(())
}

/// Stamps `last_frame_at` (throttle the calls: see the module docs).
pub fn frame_seen(conn: &Connection, serial: &str, now: Timestamp) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE links SET last_frame_at = ?2 WHERE serial = ?1")?
        .execute(params![serial, now.0])?;
    Ok(())
}

/// Records how many bad frames the link has dropped since the daemon started.
pub fn set_bad_frames(
    conn: &Connection,
    serial: &str,
    bad_frames: u64,
    now: Timestamp,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO link_counters (serial, bad_frames, updated_at) VALUES (?1, ?2, ?3)
         ON CONFLICT (serial) DO UPDATE SET bad_frames = excluded.bad_frames,
           updated_at = excluded.updated_at",
    )?
    .execute(params![
        serial,
        i64::try_from(bad_frames).unwrap_or(i64::MAX),
        now.0
    ])?;
    Ok(())
}

/// Every link's bad frames since the daemon started: (serial, count).
pub fn bad_frames(conn: &Connection) -> Result<Vec<(String, i64)>, StoreError> {
    let mut stmt =
        conn.prepare_cached("SELECT serial, bad_frames FROM link_counters ORDER BY serial")?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// One row of `link_seal` (migration 0016): a link's sealing and the
/// frames its sealed link dropped, by cause, since the daemon started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealRow {
    pub serial: String,
    pub sealed: bool,
    /// When the current sealed session was confirmed; `None` without one.
    pub session_since: Option<Timestamp>,
    pub bad_tag: u32,
    pub replayed: u32,
    pub plain: u32,
    pub bad_handshake: u32,
    pub forged_hello: u32,
    pub other: u32,
}

/// Records a link's sealing (throttle the calls like [`set_bad_frames`]).
pub fn set_seal(conn: &Connection, row: &SealRow, now: Timestamp) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO link_seal (serial, sealed, session_since, bad_tag, replayed, plain,
                                bad_handshake, forged_hello, other, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (serial) DO UPDATE SET sealed = excluded.sealed,
           session_since = excluded.session_since, bad_tag = excluded.bad_tag,
           replayed = excluded.replayed, plain = excluded.plain,
           bad_handshake = excluded.bad_handshake, forged_hello = excluded.forged_hello,
           other = excluded.other, updated_at = excluded.updated_at",
    )?
    .execute(params![
        row.serial,
        row.sealed,
        row.session_since.map(|t| t.0),
        row.bad_tag,
        row.replayed,
        row.plain,
        row.bad_handshake,
        row.forged_hello,
        row.other,
        now.0
    ])?;
    Ok(())
}

/// Every link's sealing, by name.
pub fn seals(conn: &Connection) -> Result<Vec<SealRow>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT serial, sealed, session_since, bad_tag, replayed, plain, bad_handshake,
                forged_hello, other
           FROM link_seal ORDER BY serial",
    )?;
    let rows = stmt
        .query_map([], |r| {
            Ok(SealRow {
                serial: r.get(0)?,
                sealed: r.get(1)?,
                session_since: r.get::<_, Option<i64>>(2)?.map(Timestamp),
                bad_tag: r.get(3)?,
                replayed: r.get(4)?,
                plain: r.get(5)?,
                bad_handshake: r.get(6)?,
                forged_hello: r.get(7)?,
                other: r.get(8)?,
            })
        })?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// Every row, by name.
pub fn all(conn: &Connection) -> Result<Vec<LinkRow>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT serial, state, board_id, fw_major, fw_minor, since, last_frame_at
           FROM links ORDER BY serial",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Option<u8>>(2)?,
            r.get::<_, Option<u8>>(3)?,
            r.get::<_, Option<u8>>(4)?,
            r.get::<_, i64>(5)?,
            r.get::<_, Option<i64>>(6)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (serial, state, board_id, fw_major, fw_minor, since, last) = row?;
        let state = LinkState::parse(&state).ok_or_else(|| StoreError::Unreadable {
            what: format!("links row {serial}: state {state}"),
        })?;
        out.push(LinkRow {
            serial,
            state,
            board_id,
            fw: fw_major.zip(fw_minor),
            since: Timestamp(since),
            last_frame_at: last.map(Timestamp),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;
    use crate::store::{Priority, Store};

    #[test]
    fn since_moves_only_on_a_change_and_hello_records_the_board() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("db"), &Policy::default()).unwrap();
        let t = Timestamp::from_secs(1_800_000_000);
        store
            .write_blocking(Priority::Bulk, move |c| {
                set_state(c, "a", LinkState::Absent, t)?;
                hello(c, "a", 3, 1, 2, t.saturating_add_secs(1))?;
                set_state(c, "a", LinkState::Up, t.saturating_add_secs(5))?;
                set_state(c, "b", LinkState::Down, t)?;
                Ok(())
            })
            .unwrap();
        let rows = all(&store.reader().unwrap()).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].state, LinkState::Up);
        assert_eq!(rows[0].since, t.saturating_add_secs(1));
        assert_eq!(rows[0].last_frame_at, Some(t.saturating_add_secs(5)));
        assert_eq!((rows[0].board_id, rows[0].fw), (Some(3), Some((1, 2))));
        assert_eq!(
            (rows[1].state, rows[1].last_frame_at),
            (LinkState::Down, None)
        );
    }

    #[test]
    fn counters_are_written_first_then_at_most_every_5_s_while_they_change_and_at_once_at_stop() {
        let mut w = CounterWrites::default();
        assert!(w.due(0u64, false), "the first value");
        assert!(!w.due(0, false), "unchanged");
        assert!(!w.due(3, false), "changed, but written moments ago");
        assert!(w.due(3, true), "changed, at stop");
        assert!(!w.due(3, true), "unchanged, even at stop");
    }
}
