//! `lockhub status`: what an operator needs to know about a hub, read from
//! its database while the daemon runs.
//!
//! ## Why it is shaped like this
//! - **Read-only, alongside the daemon.** It opens its own read-only,
//!   `query_only` connection and reads every table in one read transaction:
//!   a consistent snapshot through WAL, which never waits for the daemon's
//!   writer and never blocks it. It never migrates or creates anything; a
//!   database from before migration 0002 just shows links as `unknown`.
//! - **No secrets needed.** It reads only `[hub]`, `[[serial]]` and
//!   `[[reader]]` from `hub.toml`, deliberately not through `config::load`,
//!   which also reads the secrets file: an operator (or a monitoring agent)
//!   may run status without being able to read the hub's keys. The database holds no PIN or
//!   PIN tag that status would print; it reports counts and states only.

use crate::store::alerts::{AlertRow, open_alerts};
use crate::store::health::{Health, age_s, clock_at, has_table, health};
use crate::store::keys::KeyCounts;
use crate::store::links::{self, LinkRow};
use crate::store::runtime;
use crate::store::{MIGRATIONS, outbox, schema_version};
use lockhub_proto::time::Timestamp;
use rusqlite::Connection;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The status boundary's errors.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("cannot read config {path}: {source}")]
    ConfigRead {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Where in the file, as check-config says it (`FILE:LINE:COLUMN`).
    #[error("config {}: {message}", located(path, *at))]
    Config {
        path: PathBuf,
        at: Option<(usize, usize)>,
        message: String,
    },
    #[error("no database at {0} (has the daemon run yet?)")]
    NoDatabase(PathBuf),
    #[error("database {path}: {source}")]
    Database {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("database {path}: {source}")]
    Store {
        path: PathBuf,
        source: crate::store::error::StoreError,
    },
}

impl StatusError {
    /// Whether the config is at fault (exit 2) rather than the database (1).
    pub fn is_config_problem(&self) -> bool {
        matches!(
            self,
            StatusError::ConfigRead { .. } | StatusError::Config { .. }
        )
    }
}

fn located(path: &Path, at: Option<(usize, usize)>) -> String {
    match at {
        Some((line, column)) => format!("{}:{line}:{column}", path.display()),
        None => path.display().to_string(),
    }
}

/// The part of `hub.toml` status needs; everything else is ignored.
#[derive(Deserialize)]
struct PartialConfig {
    hub: PartialHub,
    #[serde(default)]
    serial: Vec<PartialSerial>,
    #[serde(default)]
    reader: Vec<PartialReader>,
    #[serde(default)]
    door: Vec<PartialDoor>,
}

/// A `[[door]]`, for the reader that serves it (if any).
#[derive(Deserialize)]
struct PartialDoor {
    name: String,
    reader: Option<String>,
    serial: Option<String>,
    output: Option<u8>,
}

#[derive(Deserialize)]
struct PartialReader {
    name: String,
    bus: Option<String>,
    address: Option<u8>,
    #[serde(default)]
    insecure_plaintext: bool,
}

#[derive(Deserialize)]
struct PartialHub {
    hub_id: Option<String>,
    data_dir: PathBuf,
    timezone: Option<String>,
}

#[derive(Deserialize)]
struct PartialSerial {
    name: String,
    port: Option<PathBuf>,
}

/// What to look at: the database, the configured serial ports and OSDP
/// readers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub hub_id: Option<String>,
    pub database: PathBuf,
    /// `(name, port)` of each `[[serial]]`, in config order.
    pub serials: Vec<(String, Option<PathBuf>)>,
    /// `(name, bus, address)` of each `[[reader]]`, in config order.
    pub readers: Vec<(String, Option<String>, Option<u8>)>,
    /// `[hub] timezone` as written (default `UTC`).
    pub timezone: String,
    /// Readers configured `insecure_plaintext = true`.
    pub plaintext_readers: Vec<String>,
    /// Readers with a door's strike on one of their outputs.
    pub strike_readers: Vec<String>,
    /// `(door, reader)` of each `[[door]]` wholly on a reader (a door
    /// whose strike and contact are a board's is that board's to report).
    pub reader_doors: Vec<(String, String)>,
}

impl Target {
    /// Reads `[hub] data_dir`, `hub_id` and `[[serial]]` from `hub.toml`.
    /// A relative `data_dir` resolves against the config's folder.
    pub fn from_config(path: &Path) -> Result<Target, StatusError> {
        let text = std::fs::read_to_string(path).map_err(|source| StatusError::ConfigRead {
            path: path.to_owned(),
            source,
        })?;
        let c: PartialConfig = toml::from_str(&text).map_err(|e| StatusError::Config {
            path: path.to_owned(),
            at: e
                .span()
                .map(|span| crate::config::line_col(&text, span.start)),
            message: e.message().to_owned(),
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let plaintext_readers = c
            .reader
            .iter()
            .filter(|r| r.insecure_plaintext)
            .map(|r| r.name.clone())
            .collect();
        let strike_readers = c
            .door
            .iter()
            .filter(|d| d.output.is_some())
            .filter_map(|d| d.reader.clone())
            .collect();
        Ok(Target {
            plaintext_readers,
            strike_readers,
            hub_id: c.hub.hub_id,
            database: base.join(c.hub.data_dir).join(crate::config::DATABASE_FILE),
            serials: c.serial.into_iter().map(|s| (s.name, s.port)).collect(),
            readers: c
                .reader
                .into_iter()
                .map(|r| (r.name, r.bus, r.address))
                .collect(),
            timezone: c.hub.timezone.unwrap_or_else(|| "UTC".to_owned()),
            reader_doors: c
                .door
                .into_iter()
                .filter(|d| d.serial.is_none())
                .filter_map(|d| Some((d.name, d.reader?)))
                .collect(),
        })
    }
}

/// Why `link_insecure` is raised for a reader, from the config: plain text
/// by config, or a reader that took the plaintext no-op osdp_OUT (osdp.md,
/// Opening the door).
fn reason(target: &Target, condition: &str, subject: &str) -> Option<String> {
    if condition != "link_insecure" {
        return None;
    }
    let named = |list: &[String]| list.iter().any(|r| r == subject);
    if named(&target.plaintext_readers) {
        Some(
            "insecure_plaintext = true: no Secure Channel; only for a reader on the secured side"
                .to_owned(),
        )
    } else if named(&target.strike_readers) {
        Some("the reader takes osdp_OUT in plain text, so anyone on the wire could open its door: turn on its secure-channel-only setting or move the strike to a board".to_owned())
    } else {
        None
    }
}

/// Sync progress (`seq_state`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SyncStatus {
    /// Every seq up to here has been applied (or answered).
    pub watermark: i64,
    /// The highest `head_seq` a checkpoint showed.
    pub head_seq: i64,
    /// Seqs seen above the watermark (each gap below them is being asked for).
    pub seen_above_watermark: i64,
    /// The last event or fresh checkpoint from the cloud.
    pub last_sign_of_life: Option<String>,
    pub last_sign_of_life_age_s: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OutboxStatus {
    pub depth: u64,
    pub oldest_unsent: Option<String>,
    pub oldest_unsent_age_s: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AlertStatus {
    pub condition: String,
    pub subject: String,
    pub count: i64,
    pub first_at: String,
    pub last_at: String,
    /// Why it is raised and what to do, where the condition has several
    /// causes (`link_insecure`: docs/alerts.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl From<AlertRow> for AlertStatus {
    fn from(a: AlertRow) -> Self {
        AlertStatus {
            condition: a.condition,
            subject: a.subject,
            count: a.count,
            first_at: a.first_at.to_rfc3339(),
            last_at: a.last_at.to_rfc3339(),
            reason: None,
        }
    }
}

/// One serial port: config joined with the `links` row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LinkStatus {
    pub serial: String,
    pub port: Option<PathBuf>,
    /// `up`, `down`, `absent`, or `unknown` (the daemon has not reported it).
    pub state: String,
    pub board_id: Option<u8>,
    /// `major.minor` from the board's Hello.
    pub firmware: Option<String>,
    pub since: Option<String>,
    pub last_frame_at: Option<String>,
    /// Bad frames the daemon dropped on this link since it started (`None`
    /// before it reported any count).
    pub bad_frames: Option<i64>,
    /// The link's sealing (docs/protocol/serial.md, "Sealed link"); `None`
    /// before the daemon reported it.
    pub seal: Option<SealStatus>,
    /// `false` for a row about a serial that hub.toml no longer names.
    pub configured: bool,
}

/// A serial link's sealing, from `link_seal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SealStatus {
    /// `false`: a plain board (`insecure_plaintext = true`).
    pub sealed: bool,
    /// When the current sealed session was confirmed (`None`: no session).
    pub session_since: Option<String>,
    pub session_age_s: Option<i64>,
    /// Frames the sealed link dropped since the daemon started, by cause
    /// (only causes that happened): `bad_tag`, `replayed`, `plain`,
    /// `bad_handshake`, `forged_hello`, `other`.
    pub dropped: std::collections::BTreeMap<String, i64>,
}

impl SealStatus {
    fn of(row: &links::SealRow, now: Timestamp) -> Self {
        let dropped = [
            ("bad_tag", row.bad_tag),
            ("replayed", row.replayed),
            ("plain", row.plain),
            ("bad_handshake", row.bad_handshake),
            ("forged_hello", row.forged_hello),
            ("other", row.other),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(k, n)| (k.to_owned(), i64::from(n)))
        .collect();
        SealStatus {
            sealed: row.sealed,
            session_since: row.session_since.map(Timestamp::to_rfc3339),
            session_age_s: row.session_since.map(|t| age_s(now, t)),
            dropped,
        }
    }

    /// One line of text: sealed with its session and drops, or plain.
    fn line(&self) -> String {
        if !self.sealed {
            return "PLAIN (insecure_plaintext: not sealed)".to_owned();
        }
        let session = match self.session_age_s {
            Some(age) => format!("sealed, session for {age} s"),
            None => "sealed, NO SESSION".to_owned(),
        };
        if self.dropped.is_empty() {
            return format!("{session}, nothing dropped");
        }
        let dropped: Vec<String> = self
            .dropped
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        format!("{session}, dropped: {}", dropped.join(", "))
    }
}

/// One OSDP reader: config joined with `osdp_links` and `osdp_readers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReaderStatus {
    pub reader: String,
    pub bus: Option<String>,
    pub address: Option<u8>,
    /// `None` until the daemon has reported it.
    pub online: Option<bool>,
    /// A Secure Channel is up with it.
    pub secure: bool,
    /// Its serial differs from the recorded one (`reader_replaced`).
    pub quarantined: bool,
    /// The recorded identity from osdp_PDID (hex, as readers print them).
    pub vendor: Option<String>,
    pub model: Option<u8>,
    pub serial: Option<String>,
    pub firmware: Option<String>,
    pub since: Option<String>,
    /// The doors it serves (strike or contact on the reader).
    pub doors: Vec<String>,
    /// Offline: what its doors report (contact, tamper, key presses) is
    /// unknown until it answers again (osdp.md, Supervision).
    pub doors_state_unknown: bool,
}

/// One OSDP bus's counters of rejected input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BusStatus {
    pub bus: String,
    pub bad_packets: i64,
    pub garbage_bytes: i64,
}

/// The effective clock (mqtt.md 'Time').
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClockStatus {
    pub system: String,
    pub floor: String,
    /// The later of the two: what decisions use.
    pub effective: String,
    /// The daemon's trust rules hold for the system clock against the
    /// floors (crate::clock, 'Trust') and no `clock_untrusted` alert is
    /// raised (expiry sweeps run only while trusted).
    pub trusted: bool,
    /// `[hub] timezone`: the wall clock key schedules are read in.
    pub timezone: String,
    /// The effective time on that wall clock (RFC 3339 with its offset);
    /// null when the zone is not one the time zone database knows.
    pub local: Option<String>,
}

/// Everything `status` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    pub hub_id: Option<String>,
    pub database: PathBuf,
    pub schema_version: i64,
    /// The schema version this lockhub writes.
    pub schema_known: i64,
    pub at: String,
    pub keys: KeyCounts,
    pub sync: SyncStatus,
    pub outbox: OutboxStatus,
    pub alerts: Vec<AlertStatus>,
    pub links: Vec<LinkStatus>,
    pub readers: Vec<ReaderStatus>,
    pub buses: Vec<BusStatus>,
    pub clock: ClockStatus,
    /// The figures the retained status message carries
    /// ([`crate::store::health`]).
    pub health: Health,
    /// The broker link: its state, since when, and its last error.
    pub broker: BrokerStatus,
    /// The last mirror proof the hub published (docs/protocol/mqtt.md
    /// 'Mirror proof'): its head_seq, as_of, match and the mirror digest.
    pub mirror_proof: Option<crate::store::mirror::LastProof>,
}

/// The broker link as the daemon last recorded it (`hub_runtime`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BrokerStatus {
    /// connecting, up, down, denied; `unknown` before a daemon ran.
    pub state: String,
    pub since: Option<String>,
    /// Why the last attempt failed (or what the broker refused, or why
    /// the hub does not trust it); None once connected.
    pub last_error: Option<String>,
    /// When that error was first seen, in a row of the same error.
    pub last_error_since: Option<String>,
    pub last_error_age_s: Option<i64>,
}

/// Opens the database read-only (never creating or migrating it).
pub fn open_read_only(path: &Path) -> Result<Connection, StatusError> {
    crate::store::open::open_read_only(path).map_err(|e| match e {
        crate::store::error::StoreError::NoDatabase(p) => StatusError::NoDatabase(p),
        source => StatusError::Store {
            path: path.to_owned(),
            source,
        },
    })
}

/// Reads the status of `target` at `now` (the system clock).
pub fn gather(target: &Target, now: Timestamp) -> Result<Status, StatusError> {
    let path = &target.database;
    let conn = open_read_only(path)?;
    let db = |source| StatusError::Database {
        path: path.to_owned(),
        source,
    };
    let store = |source| StatusError::Store {
        path: path.to_owned(),
        source,
    };
    // One read transaction: every number below is from the same snapshot.
    conn.execute_batch("BEGIN DEFERRED").map_err(db)?;
    let version = schema_version(&conn).map_err(store)?;

    let keys = crate::store::keys::counts(&conn).map_err(store)?;

    let (watermark, head_seq, last_life): (i64, i64, Option<i64>) = conn
        .query_row(
            "SELECT watermark, head_seq, last_sign_of_life FROM seq_state WHERE id = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .map_err(db)?;
    let seen: i64 = conn
        .query_row("SELECT count(*) FROM seq_seen", [], |r| r.get(0))
        .map_err(db)?;
    let last_life = last_life.map(Timestamp);
    let sync = SyncStatus {
        watermark,
        head_seq,
        seen_above_watermark: seen,
        last_sign_of_life: last_life.map(Timestamp::to_rfc3339),
        last_sign_of_life_age_s: last_life.map(|t| age_s(now, t)),
    };

    let oldest = outbox::oldest_unsent(&conn).map_err(store)?;
    let outbox = OutboxStatus {
        depth: outbox::depth(&conn).map_err(store)?,
        oldest_unsent: oldest.map(Timestamp::to_rfc3339),
        oldest_unsent_age_s: oldest.map(|t| age_s(now, t)),
    };

    let alerts: Vec<AlertStatus> = open_alerts(&conn)
        .map_err(store)?
        .into_iter()
        .map(AlertStatus::from)
        .map(|mut a| {
            a.reason = reason(target, &a.condition, &a.subject);
            a
        })
        .collect();

    let rows: Vec<LinkRow> = if has_table(&conn, "links").map_err(db)? {
        links::all(&conn).map_err(store)?
    } else {
        Vec::new()
    };
    let counters = if has_table(&conn, "link_counters").map_err(db)? {
        links::bad_frames(&conn).map_err(store)?
    } else {
        Vec::new()
    };
    let seals = if has_table(&conn, "link_seal").map_err(db)? {
        links::seals(&conn).map_err(store)?
    } else {
        Vec::new()
    };
    let link_status =
        |row: Option<&LinkRow>, serial: &str, port: Option<PathBuf>, configured| LinkStatus {
            serial: serial.to_owned(),
            port,
            state: row.map_or("unknown", |r| r.state.as_str()).to_owned(),
            board_id: row.and_then(|r| r.board_id),
            firmware: row.and_then(|r| r.fw).map(|(a, b)| format!("{a}.{b}")),
            since: row.map(|r| r.since.to_rfc3339()),
            last_frame_at: row.and_then(|r| r.last_frame_at).map(Timestamp::to_rfc3339),
            bad_frames: counters
                .iter()
                .find(|(name, _)| name == serial)
                .map(|(_, n)| *n),
            seal: seals
                .iter()
                .find(|r| r.serial == serial)
                .map(|r| SealStatus::of(r, now)),
            configured,
        };
    let mut link_list: Vec<LinkStatus> = target
        .serials
        .iter()
        .map(|(name, port)| {
            let row = rows.iter().find(|r| &r.serial == name);
            link_status(row, name, port.clone(), true)
        })
        .collect();
    for row in rows
        .iter()
        .filter(|r| !target.serials.iter().any(|(n, _)| n == &r.serial))
    {
        link_list.push(link_status(Some(row), &row.serial, None, false));
    }

    let has_osdp = has_table(&conn, "osdp_links").map_err(db)?;
    let mut readers = Vec::new();
    let mut buses = Vec::new();
    if has_osdp || !target.readers.is_empty() {
        let live = if has_osdp {
            crate::store::osdp::links(&conn).map_err(store)?
        } else {
            Vec::new()
        };
        for (name, bus, address) in &target.readers {
            let row = live.iter().find(|l| &l.reader == name);
            let id = if has_osdp {
                crate::store::osdp::identity(&conn, name).map_err(store)?
            } else {
                None
            };
            readers.push(ReaderStatus {
                reader: name.clone(),
                bus: bus.clone(),
                address: *address,
                online: row.map(|r| r.online),
                secure: row.is_some_and(|r| r.secure),
                quarantined: row.is_some_and(|r| r.quarantined),
                vendor: id.map(|i| format!("{:06x}", i.vendor)),
                model: id.map(|i| i.model),
                serial: id.map(|i| format!("{:08x}", i.serial)),
                firmware: id.map(|i| format!("{:06x}", i.firmware)),
                since: row.map(|r| r.since.to_rfc3339()),
                doors: target
                    .reader_doors
                    .iter()
                    .filter(|(_, r)| r == name)
                    .map(|(d, _)| d.clone())
                    .collect(),
                doors_state_unknown: row.is_some_and(|r| !r.online),
            });
        }
        if has_osdp {
            buses = crate::store::osdp::bus_counters(&conn)
                .map_err(store)?
                .into_iter()
                .map(|(bus, bad_packets, garbage_bytes)| BusStatus {
                    bus,
                    bad_packets,
                    garbage_bytes,
                })
                .collect();
        }
    }

    let at = clock_at(&conn, now).map_err(store)?;
    let health = health(&conn, path, now).map_err(store)?;
    let run = runtime::read(&conn).map_err(store)?;
    let error = runtime::read_broker_error(&conn).map_err(store)?;
    let mirror_proof = crate::store::mirror::last_proof(&conn).map_err(store)?;
    conn.execute_batch("COMMIT").map_err(db)?;
    let broker = BrokerStatus {
        state: run
            .as_ref()
            .map_or("unknown".to_owned(), |r| r.broker.clone()),
        since: run.as_ref().map(|r| r.broker_since.to_rfc3339()),
        last_error: error.as_ref().map(|(e, _)| e.clone()),
        last_error_since: error.as_ref().map(|(_, t)| t.to_rfc3339()),
        last_error_age_s: error.as_ref().map(|(_, t)| age_s(now, *t)),
    };

    let untrusted_alert = alerts.iter().any(|a| a.condition == "clock_untrusted");
    let clock = ClockStatus {
        system: now.to_rfc3339(),
        floor: at.floors.effective.to_rfc3339(),
        effective: at.effective.to_rfc3339(),
        trusted: at.trusted && !untrusted_alert,
        timezone: target.timezone.clone(),
        local: local_time(at.effective, &target.timezone),
    };

    Ok(Status {
        hub_id: target.hub_id.clone(),
        database: path.clone(),
        schema_version: version,
        schema_known: MIGRATIONS.len() as i64,
        at: now.to_rfc3339(),
        keys,
        sync,
        outbox,
        alerts,
        links: link_list,
        readers,
        buses,
        clock,
        health,
        broker,
        mirror_proof,
    })
}

/// `at` on the wall clock of the zone named `zone`, as schedules read it.
fn local_time(at: Timestamp, zone: &str) -> Option<String> {
    let tz = crate::config::time_zone(zone)?;
    let ts = jiff::Timestamp::from_microsecond(at.0).ok()?;
    Some(
        ts.to_zoned_datetime(tz)
            .strftime("%Y-%m-%dT%H:%M:%S%:z")
            .to_string(),
    )
}

/// `lockhub status --config FILE`: the status now.
pub fn status(config: &Path) -> Result<Status, StatusError> {
    gather(&Target::from_config(config)?, Timestamp::now_system())
}

/// A non-negative number of seconds, in the unit a person reads best.
fn span(s: i64) -> String {
    match s {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3600),
        s => format!("{} days", s / 86_400),
    }
}

fn ago(age: Option<i64>) -> String {
    match age {
        Some(s) if s < 0 => " (in the future)".to_owned(),
        Some(s) => format!(" ({} ago)", span(s)),
        None => String::new(),
    }
}

impl Status {
    /// One JSON document (stable field names; times RFC 3339 UTC).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The human view.
    pub fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "hub      {}  (database {}, schema {}{})",
            self.hub_id.as_deref().unwrap_or("?"),
            self.database.display(),
            self.schema_version,
            if self.schema_version != self.schema_known {
                format!(", this lockhub knows {}", self.schema_known)
            } else {
                String::new()
            }
        );
        let k = &self.keys;
        let _ = writeln!(
            s,
            "keys     active {}, pre_issued {}, revoked {}, expired {}, used_up {}, tombstones {}",
            k.active, k.pre_issued, k.revoked, k.expired, k.used_up, k.tombstones
        );
        let y = &self.sync;
        let _ = writeln!(
            s,
            "sync     watermark {}, {}{}, last sign of life {}{}",
            y.watermark,
            // 0: the cloud has sent no checkpoint (some never do), which is
            // not the same as being behind.
            if y.head_seq == 0 {
                "no checkpoint yet".to_owned()
            } else {
                format!("cloud head {}", y.head_seq)
            },
            if y.seen_above_watermark > 0 {
                format!(" ({} seen above a gap)", y.seen_above_watermark)
            } else {
                String::new()
            },
            y.last_sign_of_life.as_deref().unwrap_or("never"),
            ago(y.last_sign_of_life_age_s)
        );
        if let Some(p) = &self.mirror_proof {
            let _ = writeln!(s, "proof    {}", proof_line(p));
        }
        let o = &self.outbox;
        let _ = writeln!(
            s,
            "outbox   {} unsent{}",
            o.depth,
            o.oldest_unsent
                .as_deref()
                .map(|t| format!(", oldest {t}{}", ago(o.oldest_unsent_age_s)))
                .unwrap_or_default()
        );
        let c = &self.clock;
        let _ = writeln!(
            s,
            "clock    {}; system {}, floor {}",
            if c.trusted { "trusted" } else { "UNTRUSTED" },
            c.system,
            c.floor
        );
        let _ = writeln!(
            s,
            "zone     {}: {}",
            c.timezone,
            c.local
                .as_deref()
                .unwrap_or("not a zone this hub's time zone database knows")
        );
        let h = &self.health;
        let _ = writeln!(
            s,
            "daemon   {}; broker {}",
            match (&h.started_at, h.uptime_s) {
                (Some(t), Some(up)) => format!(
                    "started {t} (up {}){}",
                    span(up),
                    h.daemon_version
                        .as_deref()
                        .map(|v| format!(", version {v}"))
                        .unwrap_or_default()
                ),
                _ => "never started on this schema".to_owned(),
            },
            h.links.get("broker").map_or("unknown", String::as_str)
        );
        if let Some(e) = &self.broker.last_error {
            let _ = writeln!(
                s,
                "broker   {} since {}; last error since {}{}: {e}",
                self.broker.state,
                self.broker.since.as_deref().unwrap_or("?"),
                self.broker.last_error_since.as_deref().unwrap_or("?"),
                ago(self.broker.last_error_age_s)
            );
        }
        let _ = writeln!(
            s,
            "storage  database {} KiB, WAL {} KiB, free in data_dir {}",
            h.db_bytes / 1024,
            h.wal_bytes / 1024,
            h.disk_free_bytes
                .map(|b| format!("{} MiB", b / (1024 * 1024)))
                .unwrap_or_else(|| "unknown".to_owned())
        );
        if self.links.is_empty() {
            let _ = writeln!(s, "links    none configured");
        }
        for (i, l) in self.links.iter().enumerate() {
            let _ = writeln!(
                s,
                "{}{} {}{}{}{}{}{}",
                if i == 0 { "links    " } else { "         " },
                l.serial,
                l.state,
                l.port
                    .as_ref()
                    .map(|p| format!(" on {}", p.display()))
                    .unwrap_or_default(),
                l.board_id
                    .map(|b| format!(", board {b}"))
                    .unwrap_or_default(),
                l.firmware
                    .as_deref()
                    .map(|f| format!(", firmware {f}"))
                    .unwrap_or_default(),
                l.since
                    .as_deref()
                    .map(|t| format!(", since {t}"))
                    .unwrap_or_default(),
                if l.configured {
                    ""
                } else {
                    " (not in hub.toml)"
                }
            );
        }
        for (i, r) in self.readers.iter().enumerate() {
            let _ = writeln!(
                s,
                "{}{} on {} address {}: {}{}{}{}{}",
                if i == 0 { "readers  " } else { "         " },
                r.reader,
                r.bus.as_deref().unwrap_or("?"),
                r.address.map_or("?".to_owned(), |a| a.to_string()),
                match r.online {
                    None => "unknown",
                    Some(true) => "online",
                    Some(false) => "OFFLINE",
                },
                if r.secure {
                    ", secure channel up"
                } else {
                    ", no secure channel"
                },
                if r.quarantined { ", QUARANTINED" } else { "" },
                match (&r.vendor, r.model, &r.serial, &r.firmware) {
                    (Some(v), Some(m), Some(n), Some(f)) =>
                        format!(", vendor {v} model {m} serial {n} firmware {f}"),
                    _ => ", identity not recorded".to_owned(),
                },
                if r.doors_state_unknown && !r.doors.is_empty() {
                    format!("; door {}: state unknown", r.doors.join(", "))
                } else {
                    String::new()
                }
            );
        }
        for l in &self.links {
            if let Some(seal) = &l.seal {
                let _ = writeln!(s, "link     {}: {}", l.serial, seal.line());
            }
        }
        for l in &self.links {
            if let Some(n) = l.bad_frames.filter(|n| *n > 0) {
                let _ = writeln!(s, "link     {}: {n} bad frames dropped", l.serial);
            }
        }
        for b in &self.buses {
            if b.bad_packets > 0 || b.garbage_bytes > 0 {
                let _ = writeln!(
                    s,
                    "bus      {}: {} bad packets, {} bytes of noise",
                    b.bus, b.bad_packets, b.garbage_bytes
                );
            }
        }
        if self.alerts.is_empty() {
            let _ = writeln!(s, "alerts   none");
        }
        for (i, a) in self.alerts.iter().enumerate() {
            let _ = writeln!(
                s,
                "{}{} {} x{} since {}{}",
                if i == 0 { "alerts   " } else { "         " },
                a.condition,
                a.subject,
                a.count,
                a.first_at,
                a.reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            );
        }
        s
    }
}

/// The last proof in one line: what it compared and how it came out.
fn proof_line(p: &crate::store::mirror::LastProof) -> String {
    match (p.matches, p.watermark) {
        (None, w) => format!(
            "head_seq {}: ahead (watermark {}), at {}",
            p.head_seq,
            w.unwrap_or_default(),
            p.at.to_rfc3339()
        ),
        (Some(m), _) => format!(
            "head_seq {}, as_of {}: {}, {} keys, digest {}",
            p.head_seq,
            p.as_of.map(Timestamp::to_rfc3339).unwrap_or_default(),
            if m { "match" } else { "DIVERGED" },
            p.count.unwrap_or_default(),
            p.digest.as_deref().unwrap_or("?")
        ),
    }
}
