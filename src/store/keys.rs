//! The local mirror as an operator sees it (`lockhub keys`): every key with
//! its state, doors, window, uses and schedule, and counts by state.
//! Schedules are wall times in the hub's zone (`[hub] timezone`), which the
//! listing names.
//!
//! Never the PIN tag (as good as the PIN to anyone holding the PIN key) and
//! never the holder's name (personal data stays out of terminals and logs).

use super::StoreError;
use lockhub_proto::schedule::Schedule;
use lockhub_proto::time::Timestamp;
use rusqlite::Connection;
use std::fmt::Write as _;

/// One key as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyListing {
    pub key_id: String,
    pub version: i64,
    pub state: String,
    /// Sorted door names.
    pub doors: Vec<String>,
    pub valid_from: Timestamp,
    pub valid_until: Timestamp,
    pub check_in_id: Option<String>,
    pub reservation_id: Option<String>,
    /// The weekly hours it opens, in the hub's wall time; `None`: any hour.
    pub schedule: Option<Schedule>,
    /// `None`: no limit.
    pub max_uses: Option<u32>,
    /// Entries granted so far, across its versions.
    pub use_count: u32,
}

impl KeyListing {
    /// `3 of 5`, or the count alone for a key without a limit.
    pub fn uses(&self) -> String {
        match self.max_uses {
            Some(max) => format!("{} of {max}", self.use_count),
            None => self.use_count.to_string(),
        }
    }
}

/// How many keys are in each state, plus tombstones (`lockhub keys` and
/// `lockhub status` both show these).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct KeyCounts {
    pub pre_issued: u64,
    pub active: u64,
    pub revoked: u64,
    pub expired: u64,
    pub used_up: u64,
    pub tombstones: u64,
}

/// Every key, by key id, with its doors.
pub fn list(conn: &Connection) -> Result<Vec<KeyListing>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT k.key_id, k.version, k.state, k.valid_from, k.valid_until,
                k.check_in_id, k.reservation_id, d.door, k.schedule, k.max_uses, k.use_count
           FROM keys k LEFT JOIN key_doors d ON d.key_id = k.key_id
          ORDER BY k.key_id, d.door",
    )?;
    let mut rows = stmt.query([])?;
    let mut out: Vec<KeyListing> = Vec::new();
    while let Some(r) = rows.next()? {
        let key_id: String = r.get(0)?;
        let door: Option<String> = r.get(7)?;
        if out.last().is_none_or(|k| k.key_id != key_id) {
            let schedule =
                match r.get::<_, Option<String>>(8)? {
                    None => None,
                    Some(text) => Some(Schedule::from_json_str(&text).ok_or_else(|| {
                        StoreError::Unreadable {
                            what: format!("the schedule of key {key_id}"),
                        }
                    })?),
                };
            out.push(KeyListing {
                key_id,
                version: r.get(1)?,
                state: r.get(2)?,
                doors: Vec::new(),
                valid_from: Timestamp(r.get(3)?),
                valid_until: Timestamp(r.get(4)?),
                check_in_id: r.get(5)?,
                reservation_id: r.get(6)?,
                schedule,
                max_uses: r.get(9)?,
                use_count: r.get(10)?,
            });
        }
        if let (Some(door), Some(k)) = (door, out.last_mut()) {
            k.doors.push(door);
        }
    }
    Ok(out)
}

/// Key counts by state, and tombstones.
pub fn counts(conn: &Connection) -> Result<KeyCounts, StoreError> {
    let mut c = KeyCounts::default();
    let mut stmt = conn.prepare_cached("SELECT state, count(*) FROM keys GROUP BY state")?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let n = r.get::<_, i64>(1)? as u64;
        match r.get::<_, String>(0)?.as_str() {
            "pre_issued" => c.pre_issued = n,
            "active" => c.active = n,
            "revoked" => c.revoked = n,
            "expired" => c.expired = n,
            "used_up" => c.used_up = n,
            _ => {}
        }
    }
    c.tombstones = conn
        .prepare_cached("SELECT count(*) FROM key_tombstones")?
        .query_row([], |r| r.get::<_, i64>(0))? as u64;
    Ok(c)
}

/// Control characters (from ids the cloud chose) could rewrite a terminal:
/// show them escaped.
fn clean(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// To the second, in UTC: enough for a person reading a window.
fn short_time(t: Timestamp) -> String {
    let s = t.to_rfc3339();
    match s.get(..19) {
        Some(head) if s.len() > 19 => format!("{head}Z"),
        _ => s,
    }
}

/// A table for humans: one line per key, then the counts and the zone the
/// schedules are read in (`zone`, the hub's).
pub fn format_keys(keys: &[KeyListing], counts: &KeyCounts, zone: &str) -> String {
    let header = [
        "KEY",
        "VERSION",
        "STATE",
        "DOORS",
        "VALID FROM",
        "VALID UNTIL",
        "CHECK-IN",
        "RESERVATION",
        "USES",
        "SCHEDULE",
    ];
    let rows: Vec<[String; 10]> = keys
        .iter()
        .map(|k| {
            [
                clean(&k.key_id),
                k.version.to_string(),
                k.state.clone(),
                clean(&k.doors.join(",")),
                short_time(k.valid_from),
                short_time(k.valid_until),
                clean(k.check_in_id.as_deref().unwrap_or("-")),
                clean(k.reservation_id.as_deref().unwrap_or("-")),
                k.uses(),
                k.schedule
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), ToString::to_string),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(&header);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    let _ = writeln!(
        out,
        "{} keys: {} pre_issued, {} active, {} revoked, {} expired, {} used_up",
        keys.len(),
        counts.pre_issued,
        counts.active,
        counts.revoked,
        counts.expired,
        counts.used_up
    );
    let _ = writeln!(out, "schedules are wall times in {}", clean(zone));
    out
}

/// One key in `lockhub keys --json` (stable field names, times RFC 3339
/// UTC; docs/protocol/config.md).
#[derive(Debug, serde::Serialize)]
struct KeyJson<'a> {
    key_id: &'a str,
    version: i64,
    state: &'a str,
    doors: &'a [String],
    valid_from: String,
    valid_until: String,
    check_in_id: Option<&'a str>,
    reservation_id: Option<&'a str>,
    /// The wire's intervals, read in `timezone`; null: any hour.
    schedule: Option<serde_json::Value>,
    max_uses: Option<u32>,
    use_count: u32,
}

/// `lockhub keys --json`: `{"keys": [...], "counts": {...}, "timezone": zone}`.
pub fn keys_json(keys: &[KeyListing], counts: &KeyCounts, zone: &str) -> String {
    let keys: Vec<KeyJson<'_>> = keys
        .iter()
        .map(|k| KeyJson {
            key_id: &k.key_id,
            version: k.version,
            state: &k.state,
            doors: &k.doors,
            valid_from: k.valid_from.to_rfc3339(),
            valid_until: k.valid_until.to_rfc3339(),
            check_in_id: k.check_in_id.as_deref(),
            reservation_id: k.reservation_id.as_deref(),
            schedule: k.schedule.as_ref().map(Schedule::to_json),
            max_uses: k.max_uses,
            use_count: k.use_count,
        })
        .collect();
    let doc = serde_json::json!({ "keys": keys, "counts": counts, "timezone": zone });
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}

/// [`keys_json`] of the mirror to `out` (`lockhub keys --json`); `zone` is
/// the hub's time zone name.
pub fn print_keys_json(
    conn: &Connection,
    zone: &str,
    out: &mut dyn std::io::Write,
) -> Result<(), StoreError> {
    let text = keys_json(&list(conn)?, &counts(conn)?, zone);
    out.write_all(text.as_bytes())
        .map_err(|source| StoreError::Output {
            what: "the key list",
            source,
        })
}

/// Lists the mirror to `out` (the `lockhub keys` command); `zone` is the
/// hub's time zone name.
pub fn print_keys(
    conn: &Connection,
    zone: &str,
    out: &mut dyn std::io::Write,
) -> Result<(), StoreError> {
    let text = format_keys(&list(conn)?, &counts(conn)?, zone);
    out.write_all(text.as_bytes())
        .map_err(|source| StoreError::Output {
            what: "the key list",
            source,
        })
}
