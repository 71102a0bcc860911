//! The installer's contract: `hub.toml` and `secrets.toml` (config.md).
//!
//! Loading is all-or-nothing: [`load`] reads both files, checks every rule,
//! and either returns a [`Config`] the rest of the daemon can trust without
//! re-checking, or every problem at once, each with file, line and column.
//! Nothing here writes anything.
//!
//! Layout: this file holds the types, the errors and [`load`]; `diag` the
//! positioned diagnostics and file checks; `table` the typed TOML reader and
//! the name rules; one file per section (`hub`, `mqtt`, `trust`, `doors` for
//! `[[serial]]` and `[[door]]`, `osdp` for `[[osdp]]` and `[[reader]]`,
//! `policy`); `secrets` the secrets file.

use ed25519_dalek::SigningKey;
use lockhub_proto::crypto;
use lockhub_proto::event::SchemaContext;
use lockhub_proto::time::Timestamp;
use lockhub_proto::topics::{HubTopics, Leaf};
use lockhub_proto::verify::Signer;
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;
use toml::de::{DeTable, DeValue};
use uuid::Uuid;

mod diag;
mod doors;
mod hub;
mod mqtt;
mod osdp;
mod policy;
mod secrets;
mod table;
mod trust;

use diag::*;
use doors::*;
use hub::*;
use mqtt::*;
use osdp::*;
use policy::*;
use secrets::*;
use table::*;
use trust::*;

pub use hub::time_zone;
pub use mqtt::{IdentityError, MqttUrl, parse_mqtt_url, read_client_identity, read_roots};
pub use osdp::SCBK_D;
pub use secrets::with_board_key;
pub use secrets::with_reader_key;

/// The SQLite file's name inside `data_dir`.
pub const DATABASE_FILE: &str = "lockhub.db";

/// A loaded, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where `hub.toml` was read from (relative paths in it resolve from its folder).
    pub path: PathBuf,
    pub hub: HubConfig,
    pub mqtt: MqttConfig,
    pub trust: Vec<Signer>,
    pub serials: Vec<SerialConfig>,
    /// Doors on a lock board (`serial` + `index`).
    pub doors: Vec<DoorConfig>,
    /// `[[osdp]]`: buses of OSDP readers.
    pub osdp: Vec<OsdpBusConfig>,
    /// `[[reader]]`: OSDP readers.
    pub readers: Vec<ReaderConfig>,
    /// Doors on an OSDP reader (`reader` + `output`).
    pub reader_doors: Vec<ReaderDoorConfig>,
    pub policy: Policy,
    pub secrets_file: PathBuf,
    pub secrets: Secrets,
}

#[derive(Debug, Clone)]
pub struct HubConfig {
    pub site_id: Uuid,
    /// 1..=64 of `[A-Za-z0-9._-]`.
    pub hub_id: String,
    pub data_dir: PathBuf,
    /// `timezone` (default UTC): the wall clock key schedules are read in
    /// (mqtt.md 'Grant').
    pub timezone: jiff::tz::TimeZone,
}

impl HubConfig {
    /// The zone's IANA name, as `lockhub status` and `lockhub keys` show it.
    pub fn timezone_name(&self) -> &str {
        self.timezone.iana_name().unwrap_or("UTC")
    }
}

#[derive(Debug, Clone)]
pub struct MqttConfig {
    /// `mqtt://host:port` or `mqtts://host:port`.
    pub url: String,
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Defaults to the hub id.
    pub client_id: String,
    /// Defaults to `lockhub/v1`.
    pub topic_prefix: String,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerialConfig {
    pub name: String,
    pub port: PathBuf,
    pub baud: u32,
    /// The plain link, no `board_key` (only for a board and wiring on the
    /// secured side; raises `link_insecure` while in use).
    pub insecure_plaintext: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorConfig {
    /// The name grants use.
    pub name: String,
    /// Names a `[[serial]]`.
    pub serial: String,
    /// Board-local door number, 0..=15, unique per serial.
    pub index: u8,
    /// 1..=65535.
    pub unlock_ms: u16,
    /// Names a `[[reader]]` that takes this door's PIN; the strike and the
    /// contact stay the board's (osdp.md, Opening the door: recommended).
    pub reader: Option<String>,
}

/// A `[[serial]]` without `baud` (serial.md 'Physical'); a bundle's too.
pub const DEFAULT_SERIAL_BAUD: u32 = lockhub_proto::bundle::DEFAULT_SERIAL_BAUD;
/// An `[[osdp]]` bus without `baud` (osdp.md 'Physical and addressing').
pub const DEFAULT_OSDP_BAUD: u32 = lockhub_proto::bundle::DEFAULT_OSDP_BAUD;

/// The baud rates osdp.md allows on a bus, and the standard rates a
/// `[[serial]]` may use (11520 is a typo of 115200, not a speed).
pub const OSDP_BAUDS: [u32; 6] = [9600, 19200, 38400, 57600, 115200, 230400];

/// `baud` of `t`: `default` when absent; one of [`OSDP_BAUDS`], or a
/// problem at the value.
fn read_baud(d: &mut Diag<'_>, t: &Table<'_, '_>, default: u32) -> Option<u32> {
    if t.get("baud").is_none() {
        return Some(default);
    }
    let (b, span) = t.int_in::<u32>(d, "baud", true, 1, u32::MAX.into())?;
    if OSDP_BAUDS.contains(&b) {
        return Some(b);
    }
    let list: Vec<String> = OSDP_BAUDS.iter().map(u32::to_string).collect();
    d.at(
        span,
        format!("`baud` must be one of {}; found {b}", list.join(", ")),
    );
    None
}

/// A device named by `port` that is not there now: a warning, not a
/// problem (a USB adapter may be plugged in later; the daemon retries).
fn warn_if_absent(d: &mut Diag<'_>, what: &str, port: &Path, span: Range<usize>) {
    if !port.exists() {
        d.warn_at(
            span,
            format!(
                "{what} `port` {} does not exist now; the daemon retries until it appears (a USB adapter plugged in later is fine)",
                port.display()
            ),
        );
    }
}

/// The highest reader address (0x7F is broadcast).
pub const MAX_READER_ADDRESS: u8 = 126;

/// `[[osdp]]`: one RS-485 bus of readers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OsdpBusConfig {
    pub name: String,
    pub port: PathBuf,
    /// One of [`OSDP_BAUDS`].
    pub baud: u32,
}

/// `[[reader]]`: one OSDP reader on a bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderConfig {
    pub name: String,
    /// Names an `[[osdp]]` bus.
    pub bus: String,
    /// 0..=126, unique per bus.
    pub address: u8,
    /// No Secure Channel (only for a reader on the secured side).
    pub insecure_plaintext: bool,
}

/// A `[[door]]` served by an OSDP reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderDoorConfig {
    pub name: String,
    /// Names a `[[reader]]`.
    pub reader: String,
    /// The reader's output that drives the strike.
    pub output: u8,
    /// The reader's input wired to the door contact.
    pub contact_input: Option<u8>,
    /// The input is active when the door is closed.
    pub contact_inverted: bool,
    /// 1..=65535.
    pub unlock_ms: u16,
}

/// `[[reader_key]]`: a reader's Secure Channel Base Key. Debug redacts it.
#[derive(Clone, PartialEq, Eq)]
pub struct ReaderKey {
    pub reader: String,
    pub scbk: [u8; 16],
}

impl Drop for ReaderKey {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.scbk);
    }
}

impl std::fmt::Debug for ReaderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReaderKey")
            .field("reader", &self.reader)
            .field("scbk", &"<redacted>")
            .finish()
    }
}

/// `[[board_key]]`: a lock board's 32-byte link key LK (serial.md,
/// "Sealed link"). Debug redacts it.
#[derive(Clone, PartialEq, Eq)]
pub struct BoardKey {
    /// Names a `[[serial]]`.
    pub serial: String,
    pub key: [u8; 32],
}

impl std::fmt::Debug for BoardKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoardKey")
            .field("serial", &self.serial)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// `[policy]`: every value positive; defaults from config.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub lockout_threshold: u32,
    pub lockout_window_s: u32,
    pub lockout_base_s: u32,
    pub held_open_s: u32,
    pub max_grant_days: u32,
    pub dedupe_retention_days: u32,
    pub audit_retention_days: u32,
    pub cloud_stale_s: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            lockout_threshold: 5,
            lockout_window_s: 300,
            lockout_base_s: 60,
            held_open_s: 60,
            max_grant_days: 60,
            dedupe_retention_days: 14,
            audit_retention_days: 90,
            cloud_stale_s: 900,
        }
    }
}

/// The longest a lockout lasts, whatever the doubling says (serial.md).
pub const LOCKOUT_MAX_S: u32 = 3600;

/// A PIN key: typed PINs are matched by their HMAC-SHA256 tag under it.
#[derive(Clone)]
pub struct PinKey {
    pub id: String,
    pub secret: [u8; 32],
}

impl std::fmt::Debug for PinKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinKey")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// The secrets file. Its Debug output never shows a secret.
#[derive(Clone)]
pub struct Secrets {
    pub hub_key: SigningKey,
    pub pin_keys: Vec<PinKey>,
    pub reader_keys: Vec<ReaderKey>,
    pub board_keys: Vec<BoardKey>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("hub_key", &"<redacted>")
            .field("pin_keys", &self.pin_keys)
            .field("reader_keys", &self.reader_keys)
            .field("board_keys", &self.board_keys)
            .finish()
    }
}

impl Config {
    pub fn door(&self, name: &str) -> Option<&DoorConfig> {
        self.doors.iter().find(|d| d.name == name)
    }

    /// Every door name, whatever drives it.
    pub fn door_names(&self) -> impl Iterator<Item = &str> {
        self.doors
            .iter()
            .map(|d| d.name.as_str())
            .chain(self.reader_doors.iter().map(|d| d.name.as_str()))
    }

    pub fn reader(&self, name: &str) -> Option<&ReaderConfig> {
        self.readers.iter().find(|r| r.name == name)
    }

    /// A reader's SCBK from the secrets file.
    pub fn reader_key(&self, reader: &str) -> Option<&ReaderKey> {
        self.secrets.reader_keys.iter().find(|k| k.reader == reader)
    }

    /// A board's link key from the secrets file.
    pub fn board_key(&self, serial: &str) -> Option<&BoardKey> {
        self.secrets.board_keys.iter().find(|k| k.serial == serial)
    }

    pub fn pin_key(&self, id: &str) -> Option<&PinKey> {
        self.secrets.pin_keys.iter().find(|k| k.id == id)
    }

    /// What step 4 of an event needs from this config: its door names and
    /// PIN key ids (never the keys themselves).
    pub fn schema_context(&self) -> SchemaContext {
        SchemaContext::new(
            self.door_names().map(str::to_owned),
            self.secrets.pin_keys.iter().map(|k| k.id.clone()),
        )
    }

    /// This hub's topics, `P/S/H/<leaf>`.
    pub fn topics(&self) -> HubTopics {
        HubTopics::new(&self.mqtt.topic_prefix, self.hub.site_id, &self.hub.hub_id)
    }

    /// `P/S/H/<leaf>` for this hub.
    pub fn topic(&self, leaf: Leaf) -> String {
        self.topics().topic(leaf)
    }

    /// The SQLite file inside `data_dir`.
    pub fn database_path(&self) -> PathBuf {
        self.hub.data_dir.join(DATABASE_FILE)
    }
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// One problem in `hub.toml` or in a file it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file the problem is in (the secrets file's own path for its problems).
    pub file: PathBuf,
    /// 1-based; `None` only for a problem with a file as a whole (mode, unreadable).
    pub line: Option<usize>,
    /// 1-based, counted in characters; `None` exactly when `line` is.
    pub column: Option<usize>,
    /// What is wrong. Never contains a secret value.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{}:{l}:{c}: {}", self.file.display(), self.message),
            _ => write!(f, "{}: {}", self.file.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Every problem [`load`] found, in file order then line and column order.
/// Display prints one problem per line (`FILE:LINE:COL: message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors {
    pub errors: Vec<ConfigError>,
}

impl ConfigErrors {
    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.errors.iter()
    }

    pub fn len(&self) -> usize {
        self.errors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.errors.iter()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// 1-based (line, column) of byte `offset` in `text`. Columns count
/// characters, so a multi-byte character is one column. An offset past the
/// end, or inside a character, is moved back to the nearest boundary.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
    (line, before[line_start..].chars().count() + 1)
}

// ---------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------

/// The default port of `mqtt://`.
pub const MQTT_PORT: u16 = 1883;
/// The default port of `mqtts://`.
pub const MQTTS_PORT: u16 = 8883;
/// Door indices a board knows (serial.md): 0..=15, from the wire
/// contract's own count of doors.
pub const MAX_DOOR_INDEX: u8 = (firmware_bridge::board::MAX_DOORS - 1) as u8;

/// Reads `hub.toml` at `path` and the files it names, and checks every rule
/// of config.md. Reads only; writes and creates nothing (`data_dir` need not
/// exist yet). Relative paths resolve against the folder of `path`.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    load_with_warnings(path).0
}

/// Which `[[serial]]`s may lack their `[[board_key]]` for now: those a
/// command is about to key (`lockhub board pair`, serial.md "Pairing":
/// it accepts a config whose only problem is that serial's key), or every
/// keyed serial of a config just provisioned, whose boards are paired next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unkeyed {
    One(String),
    All,
}

impl Unkeyed {
    fn allows(&self, serial: &str) -> bool {
        match self {
            Unkeyed::One(s) => s == serial,
            Unkeyed::All => true,
        }
    }
}

/// [`load`], except that the serials `unkeyed` names may have no
/// `[[board_key]]` (they load without one; the driver would refuse to run
/// them). Every other rule holds.
pub fn load_unkeyed(path: &Path, unkeyed: &Unkeyed) -> Result<Config, ConfigErrors> {
    load_checked(path, Some(unkeyed)).0
}

/// [`load`], and the warnings it found besides the problems (a device
/// absent now), in file order: what check-config prints.
pub fn load_with_warnings(path: &Path) -> (Result<Config, ConfigErrors>, Vec<ConfigError>) {
    load_checked(path, None)
}

fn load_checked(
    path: &Path,
    unkeyed: Option<&Unkeyed>,
) -> (Result<Config, ConfigErrors>, Vec<ConfigError>) {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let config = load_inner(path, &mut errors, &mut warnings, unkeyed);
    let warnings = ordered(warnings, path);
    let config = match config {
        Some(config) if errors.is_empty() => Ok(config),
        _ => {
            if errors.is_empty() {
                // Every path that yields no config reports why; keep that true.
                errors.push(file_error(path, "could not be loaded"));
            }
            Err(ConfigErrors {
                errors: ordered(errors, path),
            })
        }
    };
    (config, warnings)
}

fn file_error(file: &Path, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: file.to_path_buf(),
        line: None,
        column: None,
        message: message.into(),
    }
}

/// The config file first, then other files in the order they came up; within
/// a file, by line and column (file-level problems first).
fn ordered(mut errors: Vec<ConfigError>, first: &Path) -> Vec<ConfigError> {
    let mut files: Vec<PathBuf> = vec![first.to_path_buf()];
    for e in &errors {
        if !files.contains(&e.file) {
            files.push(e.file.clone());
        }
    }
    errors.sort_by_key(|e| {
        (
            files.iter().position(|f| *f == e.file),
            e.line.unwrap_or(0),
            e.column.unwrap_or(0),
        )
    });
    errors.dedup();
    errors
}

fn load_inner(
    path: &Path,
    errors: &mut Vec<ConfigError>,
    warnings: &mut Vec<ConfigError>,
    unkeyed: Option<&Unkeyed>,
) -> Option<Config> {
    let text = match read_text(path) {
        Ok(t) => t,
        Err(ReadError::Io(e)) => {
            errors.push(file_error(path, io_message(&e)));
            return None;
        }
        Err(ReadError::Utf8 { line, column }) => {
            errors.push(ConfigError {
                file: path.to_path_buf(),
                line: Some(line),
                column: Some(column),
                message: "not valid UTF-8".to_owned(),
            });
            return None;
        }
    };
    let base = match std::path::absolute(path) {
        Ok(p) => p.parent().map(Path::to_path_buf).unwrap_or_default(),
        Err(e) => {
            errors.push(file_error(path, format!("cannot resolve its folder: {e}")));
            return None;
        }
    };
    let mut d = Diag::new(path, &text, false);
    let Some(doc) = parse_toml(&mut d, &text) else {
        errors.append(&mut d.errors);
        return None;
    };
    let root = Table {
        what: "the config".to_owned(),
        span: doc.span(),
        t: doc.get_ref(),
    };
    root.check_unknown(
        &mut d,
        &[
            "hub", "mqtt", "trust", "secrets", "serial", "door", "policy", "osdp", "reader",
        ],
    );

    let hub = read_hub(&mut d, &root, &base);
    let hub_id = hub.as_ref().map_or("", |h| h.hub_id.as_str());
    let mqtt = read_mqtt(&mut d, &root, &base, hub_id);
    let trust = read_trust(&mut d, &root);
    let mut ports = Vec::new();
    let (serials, serial_names, serial_spans) = read_serials(&mut d, &root, &base, &mut ports);
    let (buses, bus_names) = read_osdp_buses(&mut d, &root, &base, &mut ports);
    check_ports(&mut d, &ports);
    let (readers, reader_spans) = read_readers(&mut d, &root, &bus_names);
    let reader_names = readers
        .as_ref()
        .map(|rs| rs.iter().map(|r| r.name.clone()).collect::<Vec<_>>());
    let doors = read_doors(&mut d, &root, &serial_names, &reader_names);
    let policy = read_policy(&mut d, &root);
    let secrets_ref = root
        .table(&mut d, "secrets", "[secrets]", &["file"], true)
        .and_then(|t| t.path(&mut d, "file", true, &base));
    let read = secrets_ref
        .as_ref()
        .map(|(file, span)| read_secrets(&mut d, errors, file, span, &serial_names));
    let (secrets, keyed_readers, keyed_boards) = match read {
        Some(r) => (r.secrets, r.keyed_readers, r.keyed_boards),
        None => (None, None, None),
    };
    if let Some(keyed) = &keyed_boards {
        let missing_ok = |serial: &str| unkeyed.is_some_and(|u| u.allows(serial));
        check_board_keys(&mut d, &serial_spans, keyed, &missing_ok);
    }

    if let Some(keyed) = &keyed_readers {
        for (name, span, insecure) in &reader_spans {
            if !insecure && !keyed.contains(name) {
                d.at(
                    span.clone(),
                    format!(
                        "reader `{}` has no [[reader_key]] in the secrets file (a reader without a Secure Channel key needs `insecure_plaintext = true`)",
                        name.escape_debug()
                    ),
                );
            }
        }
    }

    errors.append(&mut d.errors);
    warnings.append(&mut d.warnings);
    let (secrets_file, _) = secrets_ref?;
    let (doors, reader_doors) = doors?;
    Some(Config {
        path: path.to_path_buf(),
        hub: hub?,
        mqtt: mqtt?,
        trust: trust?,
        serials: serials?,
        doors,
        osdp: buses?,
        readers: readers?,
        reader_doors,
        policy: policy?,
        secrets_file,
        secrets: secrets?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_is_one_based_and_counts_characters() {
        let text = "ab\ncdé f\n\nx";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 1), (1, 2));
        assert_eq!(line_col(text, 2), (1, 3)); // the newline itself
        assert_eq!(line_col(text, 3), (2, 1));
        assert_eq!(line_col(text, 8), (2, 5)); // after the two-byte é
        assert_eq!(line_col(text, 6), (2, 3)); // inside é: its start
        assert_eq!(line_col(text, 9), (2, 6));
        assert_eq!(line_col(text, 10), (3, 1));
        assert_eq!(line_col(text, 11), (4, 1));
        assert_eq!(line_col(text, 12), (4, 2));
        assert_eq!(line_col(text, 999), (4, 2)); // clamped to the end
        assert_eq!(line_col("", 5), (1, 1));
    }

    #[test]
    fn mqtt_urls() {
        let ok = |u: &str| {
            let p = parse_mqtt_url(u).unwrap();
            (p.tls, p.host, p.port)
        };
        assert_eq!(
            ok("mqtt://127.0.0.1:1883"),
            (false, "127.0.0.1".into(), 1883)
        );
        assert_eq!(ok("mqtt://broker"), (false, "broker".into(), 1883));
        assert_eq!(
            ok("mqtts://broker.example"),
            (true, "broker.example".into(), 8883)
        );
        assert_eq!(ok("mqtts://b:443"), (true, "b".into(), 443));
        assert_eq!(ok("mqtt://[::1]:1884"), (false, "::1".into(), 1884));
        assert_eq!(ok("mqtts://[fe80::1]"), (true, "fe80::1".into(), 8883));
        for bad in [
            "",
            "tcp://b",
            "MQTT://b",
            "mqtt://",
            "mqtt://:1883",
            "mqtt://b:",
            "mqtt://b:0",
            "mqtt://b:+1",
            "mqtt://b:65536",
            "mqtt://b:1:2",
            "mqtt://b/",
            "mqtt://b?x",
            "mqtt://u:p@b",
            "mqtt://[::1",
            "mqtt://[nope]",
            "mqtt://[::1]x",
            "mqtt://b c",
        ] {
            assert!(parse_mqtt_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ids() {
        // The hub id is the mqtt.md id alphabet, checked by event's rule.
        use lockhub_proto::event::is_key_id;
        assert!(is_key_id("hub-lobby-1"));
        assert!(is_key_id(&"a".repeat(64)));
        assert!(!is_key_id(&"a".repeat(65)));
        assert!(!is_key_id(""));
        assert!(!is_key_id("a b"));
        assert!(!is_key_id("é"));
    }

    #[test]
    fn the_door_index_limit_is_the_wire_contracts() {
        assert_eq!(
            usize::from(MAX_DOOR_INDEX) + 1,
            firmware_bridge::board::MAX_DOORS
        );
    }

    #[test]
    fn errors_display_one_per_line() {
        let e = |line: Option<usize>, msg: &str| ConfigError {
            file: PathBuf::from("/etc/lockhub/hub.toml"),
            line,
            column: line.map(|_| 3),
            message: msg.into(),
        };
        let all = ConfigErrors {
            errors: vec![e(Some(2), "one"), e(None, "two")],
        };
        assert_eq!(
            all.to_string(),
            "/etc/lockhub/hub.toml:2:3: one\n/etc/lockhub/hub.toml: two"
        );
    }
}
