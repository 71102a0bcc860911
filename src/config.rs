//! The installer's contract: `hub.toml` and `secrets.toml` (config.md).
//!
//! Loading is all-or-nothing: [`load`] reads both files, checks every rule,
//! and either returns a [`Config`] the rest of the daemon can trust without
//! re-checking, or every problem at once, each with file, line and column.
//! Nothing here writes anything.

use crate::crypto;
use crate::time::Timestamp;
use ed25519_dalek::{SigningKey, VerifyingKey};
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};
use toml::Spanned;
use toml::de::{DeTable, DeValue};
use uuid::Uuid;

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

/// A cloud signing key the hub trusts.
#[derive(Debug, Clone)]
pub struct Signer {
    pub id: String,
    /// Checked at load: a valid point, not of small order (weak).
    pub public_key: VerifyingKey,
    pub not_after: Option<Timestamp>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerialConfig {
    pub name: String,
    pub port: PathBuf,
    pub baud: u32,
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
}

/// The baud rates osdp.md allows on a bus.
pub const OSDP_BAUDS: [u32; 6] = [9600, 19200, 38400, 57600, 115200, 230400];

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

impl std::fmt::Debug for ReaderKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReaderKey")
            .field("reader", &self.reader)
            .field("scbk", &"<redacted>")
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
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("hub_key", &"<redacted>")
            .field("pin_keys", &self.pin_keys)
            .field("reader_keys", &self.reader_keys)
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

    pub fn pin_key(&self, id: &str) -> Option<&PinKey> {
        self.secrets.pin_keys.iter().find(|k| k.id == id)
    }

    /// `P/S/H/<leaf>` for this hub.
    pub fn topic(&self, leaf: &str) -> String {
        format!(
            "{}/{}/{}/{}",
            self.mqtt.topic_prefix, self.hub.site_id, self.hub.hub_id, leaf
        )
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

/// The default `mqtt.topic_prefix`.
pub const DEFAULT_TOPIC_PREFIX: &str = "lockhub/v1";
/// The default port of `mqtt://`.
pub const MQTT_PORT: u16 = 1883;
/// The default port of `mqtts://`.
pub const MQTTS_PORT: u16 = 8883;
/// Door indices a board knows (serial.md): 0..=15.
pub const MAX_DOOR_INDEX: u8 = 15;

/// Reads `hub.toml` at `path` and the files it names, and checks every rule
/// of config.md. Reads only; writes and creates nothing (`data_dir` need not
/// exist yet). Relative paths resolve against the folder of `path`.
pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let mut errors = Vec::new();
    let config = load_inner(path, &mut errors);
    match config {
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
    }
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

/// Problems found in one TOML file, positioned in its text.
struct Diag<'t> {
    file: PathBuf,
    text: &'t str,
    /// The secrets file: never echo anything from it that could be a secret.
    secret: bool,
    errors: Vec<ConfigError>,
}

impl<'t> Diag<'t> {
    fn new(file: &Path, text: &'t str, secret: bool) -> Self {
        Diag {
            file: file.to_path_buf(),
            text,
            secret,
            errors: Vec::new(),
        }
    }

    fn at(&mut self, span: Range<usize>, message: impl Into<String>) {
        let (line, column) = line_col(self.text, span.start);
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line: Some(line),
            column: Some(column),
            message: message.into(),
        });
    }

    fn line_of(&self, span: &Range<usize>) -> usize {
        line_col(self.text, span.start).0
    }

    /// A key name fit to print: in the secrets file a long name might be a
    /// secret pasted in the wrong place, so it is not shown.
    fn key_name(&self, key: &str) -> String {
        if self.secret && key.chars().count() > 24 {
            "(name not shown)".to_owned()
        } else {
            format!("`{}`", key.escape_debug())
        }
    }
}

enum ReadError {
    Io(std::io::Error),
    /// Not UTF-8: the position of the first bad byte.
    Utf8 {
        line: usize,
        column: usize,
    },
}

fn read_text(path: &Path) -> Result<String, ReadError> {
    let bytes = std::fs::read(path).map_err(ReadError::Io)?;
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        let prefix = std::str::from_utf8(&e.as_bytes()[..valid]).unwrap_or("");
        let (line, column) = line_col(prefix, valid);
        ReadError::Utf8 { line, column }
    })
}

fn io_message(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "does not exist".to_owned(),
        std::io::ErrorKind::PermissionDenied => "cannot be read: permission denied".to_owned(),
        _ => format!("cannot be read: {e}"),
    }
}

/// Parses TOML, reporting every syntax error; `None` when there was any
/// (rules are not checked on a document the parser had to guess at).
fn parse_toml<'i>(d: &mut Diag<'_>, text: &'i str) -> Option<Spanned<DeTable<'i>>> {
    let (doc, errors) = DeTable::parse_recoverable(text);
    if errors.is_empty() {
        return Some(doc);
    }
    // The parser often reports a cascade after the first mistake on a line;
    // one message per line is the useful part.
    let mut errors: Vec<_> = errors
        .into_iter()
        .map(|e| (e.span().unwrap_or(0..0), e))
        .collect();
    errors.sort_by_key(|(span, _)| span.start);
    let mut last_line = 0;
    for (span, e) in errors {
        let line = d.line_of(&span);
        if line == last_line {
            continue;
        }
        last_line = line;
        let mut message = e.message().to_owned();
        if message == "duplicate key" {
            // The span is the key itself: name it (key names are not secrets,
            // but the secrets file still hides long ones).
            let key = text.get(span.clone()).unwrap_or("");
            if !key.is_empty() && !key.contains('\n') {
                message = format!("duplicate key {}", d.key_name(key.trim_matches('"')));
            }
        }
        d.at(span, format!("TOML syntax error: {message}"));
    }
    None
}

type Value<'i> = Spanned<DeValue<'i>>;

/// A table being read. Unknown keys are reported when it is opened.
struct Table<'a, 'i> {
    /// How messages name it: `[hub]`, `[[door]]`, `the config`.
    what: String,
    span: Range<usize>,
    t: &'a DeTable<'i>,
}

impl<'a, 'i> Table<'a, 'i> {
    fn open(
        d: &mut Diag<'_>,
        v: &'a Value<'i>,
        what: &str,
        allowed: &[&str],
    ) -> Option<Table<'a, 'i>> {
        match v.get_ref() {
            DeValue::Table(t) => {
                let table = Table {
                    what: what.to_owned(),
                    span: v.span(),
                    t,
                };
                table.check_unknown(d, allowed);
                Some(table)
            }
            other => {
                d.at(
                    v.span(),
                    format!("{what} must be a table, found {}", other.type_str()),
                );
                None
            }
        }
    }

    fn check_unknown(&self, d: &mut Diag<'_>, allowed: &[&str]) {
        for (k, _) in self.t.iter() {
            let key: &str = k.get_ref();
            if !allowed.contains(&key) {
                let name = d.key_name(key);
                let hint = allowed
                    .iter()
                    .find(|a| edit_distance(a, key) <= 2)
                    .map(|a| format!(" (did you mean `{a}`?)"))
                    .unwrap_or_default();
                d.at(
                    k.span(),
                    format!("unknown key {name} in {}{hint}", self.what),
                );
            }
        }
    }

    fn get(&self, key: &str) -> Option<&'a Value<'i>> {
        self.t.get(key)
    }

    fn missing(&self, d: &mut Diag<'_>, key: &str) {
        d.at(
            self.span.clone(),
            format!("missing key `{key}` in {}", self.what),
        );
    }

    fn wrong_type(d: &mut Diag<'_>, key: &str, v: &Value<'_>, expected: &str) {
        d.at(
            v.span(),
            format!(
                "`{key}` must be {expected}, found {}",
                v.get_ref().type_str()
            ),
        );
    }

    /// A required or optional sub-table.
    fn table(
        &self,
        d: &mut Diag<'_>,
        key: &str,
        what: &str,
        allowed: &[&str],
        required: bool,
    ) -> Option<Table<'a, 'i>> {
        match self.get(key) {
            None => {
                if required {
                    d.at(self.span.clone(), format!("missing table {what}"));
                }
                None
            }
            Some(v) => Table::open(d, v, what, allowed),
        }
    }

    /// An array of tables (`[[key]]`); absent is empty.
    fn tables(
        &self,
        d: &mut Diag<'_>,
        key: &str,
        what: &str,
        allowed: &[&str],
    ) -> Vec<Table<'a, 'i>> {
        let Some(v) = self.get(key) else {
            return Vec::new();
        };
        match v.get_ref() {
            DeValue::Array(items) => items
                .iter()
                .filter_map(|item| Table::open(d, item, what, allowed))
                .collect(),
            DeValue::Table(_) => {
                d.at(
                    v.span(),
                    format!("`{key}` must be an array of tables: write {what}"),
                );
                Vec::new()
            }
            _ => {
                Self::wrong_type(d, key, v, &format!("an array of tables ({what})"));
                Vec::new()
            }
        }
    }

    fn str(&self, d: &mut Diag<'_>, key: &str, required: bool) -> Option<(&'a str, Range<usize>)> {
        match self.get(key) {
            None => {
                if required {
                    self.missing(d, key);
                }
                None
            }
            Some(v) => match v.get_ref() {
                DeValue::String(s) => Some((s.as_ref(), v.span())),
                _ => {
                    Self::wrong_type(d, key, v, "a string");
                    None
                }
            },
        }
    }

    /// A non-empty string.
    fn text(&self, d: &mut Diag<'_>, key: &str, required: bool) -> Option<(&'a str, Range<usize>)> {
        let (s, span) = self.str(d, key, required)?;
        if s.trim().is_empty() {
            d.at(span, format!("`{key}` must not be empty"));
            return None;
        }
        Some((s, span))
    }

    /// A name or id: 1..=64 characters, no control characters, no
    /// surrounding spaces.
    fn name(&self, d: &mut Diag<'_>, key: &str) -> Option<(&'a str, Range<usize>)> {
        let (s, span) = self.str(d, key, true)?;
        if s.is_empty()
            || s.chars().count() > 64
            || s.chars().any(char::is_control)
            || s.trim() != s
        {
            d.at(
                span,
                format!("`{key}` must be 1..=64 characters without control characters or surrounding spaces"),
            );
            return None;
        }
        Some((s, span))
    }

    /// A path; relative ones resolve against `base` (the config's folder).
    fn path(
        &self,
        d: &mut Diag<'_>,
        key: &str,
        required: bool,
        base: &Path,
    ) -> Option<(PathBuf, Range<usize>)> {
        let (s, span) = self.text(d, key, required)?;
        if s.contains('\0') {
            d.at(span, format!("`{key}` must not contain a NUL character"));
            return None;
        }
        Some((base.join(s), span))
    }

    fn int(&self, d: &mut Diag<'_>, key: &str, required: bool) -> Option<(i128, Range<usize>)> {
        let v = match self.get(key) {
            None => {
                if required {
                    self.missing(d, key);
                }
                return None;
            }
            Some(v) => v,
        };
        match v.get_ref() {
            DeValue::Integer(i) => match i128::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) => Some((n, v.span())),
                Err(_) => {
                    d.at(v.span(), format!("`{key}` is out of range"));
                    None
                }
            },
            _ => {
                Self::wrong_type(d, key, v, "an integer");
                None
            }
        }
    }

    /// An optional boolean, false when absent.
    fn bool(&self, d: &mut Diag<'_>, key: &str) -> Option<bool> {
        match self.get(key) {
            None => Some(false),
            Some(v) => match v.get_ref() {
                DeValue::Boolean(b) => Some(*b),
                _ => {
                    Self::wrong_type(d, key, v, "a boolean");
                    None
                }
            },
        }
    }

    /// An integer in `lo..=hi`, converted.
    fn int_in<T: TryFrom<i128>>(
        &self,
        d: &mut Diag<'_>,
        key: &str,
        required: bool,
        lo: i128,
        hi: i128,
    ) -> Option<(T, Range<usize>)> {
        let (n, span) = self.int(d, key, required)?;
        match T::try_from(n) {
            Ok(v) if (lo..=hi).contains(&n) => Some((v, span)),
            _ => {
                d.at(span, format!("`{key}` must be in {lo}..={hi}, found {n}"));
                None
            }
        }
    }
}

/// Levenshtein distance, for "did you mean" on unknown keys.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// 1..=64 of `[A-Za-z0-9._-]` (hub ids; mqtt.md key ids).
pub fn is_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Reports every second and later use of a name.
fn check_unique(d: &mut Diag<'_>, what: &str, items: &[(&str, Range<usize>)]) {
    let mut seen: HashMap<&str, Range<usize>> = HashMap::new();
    for (name, span) in items {
        if let Some(first) = seen.get(name) {
            let line = d.line_of(first);
            d.at(
                span.clone(),
                format!("duplicate {what} `{name}` (first on line {line})"),
            );
        } else {
            seen.insert(name, span.clone());
        }
    }
}

/// Group and others get no access at all (config.md: not readable by them;
/// writable or executable would be as wrong for a secret).
#[cfg(unix)]
fn loose_mode(meta: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o7777;
    (mode & 0o077 != 0).then_some(mode)
}

#[cfg(not(unix))]
fn loose_mode(_meta: &std::fs::Metadata) -> Option<u32> {
    None
}

/// Checks that a file named by `key` exists and is a regular file;
/// reports at the value in hub.toml otherwise.
fn check_file(
    d: &mut Diag<'_>,
    key: &str,
    path: &Path,
    span: &Range<usize>,
) -> Option<std::fs::Metadata> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => Some(m),
        Ok(_) => {
            d.at(
                span.clone(),
                format!("`{key}` {} is not a regular file", path.display()),
            );
            None
        }
        Err(e) => {
            d.at(
                span.clone(),
                format!("`{key}` {} {}", path.display(), io_message(&e)),
            );
            None
        }
    }
}

/// A file that holds a secret: group and others must have no access.
fn check_private(d: &mut Diag<'_>, what: &str, path: &Path, meta: &std::fs::Metadata) {
    if let Some(mode) = loose_mode(meta) {
        d.errors.push(file_error(
            path,
            format!(
                "{what} is accessible by group or others (mode {mode:04o}); it must be 0600 or stricter (chmod 600)"
            ),
        ));
    }
}

fn load_inner(path: &Path, errors: &mut Vec<ConfigError>) -> Option<Config> {
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
    let (serials, serial_names) = read_serials(&mut d, &root, &base);
    let (buses, bus_names) = read_osdp_buses(&mut d, &root, &base);
    let (readers, reader_spans) = read_readers(&mut d, &root, &bus_names);
    let reader_names = readers
        .as_ref()
        .map(|rs| rs.iter().map(|r| r.name.clone()).collect::<Vec<_>>());
    let doors = read_doors(&mut d, &root, &serial_names, &reader_names);
    let policy = read_policy(&mut d, &root);
    let secrets_ref = root
        .table(&mut d, "secrets", "[secrets]", &["file"], true)
        .and_then(|t| t.path(&mut d, "file", true, &base));
    let secrets = secrets_ref
        .as_ref()
        .and_then(|(file, span)| read_secrets(&mut d, errors, file, span));

    if let Some(sec) = &secrets {
        for (name, span, insecure) in &reader_spans {
            if !insecure && !sec.reader_keys.iter().any(|k| &k.reader == name) {
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

fn read_hub(d: &mut Diag<'_>, root: &Table<'_, '_>, base: &Path) -> Option<HubConfig> {
    let t = root.table(d, "hub", "[hub]", &["site_id", "hub_id", "data_dir"], true)?;
    let site_id = t.str(d, "site_id", true).and_then(|(s, span)| {
        // The hyphenated form only: it is what topics and the cloud use.
        match Uuid::try_parse(s) {
            Ok(u) if s.len() == 36 => Some(u),
            _ => {
                d.at(
                    span,
                    "`site_id` must be a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                );
                None
            }
        }
    });
    let hub_id = t.str(d, "hub_id", true).and_then(|(s, span)| {
        if is_id(s) {
            Some(s.to_owned())
        } else {
            d.at(
                span,
                "`hub_id` must be 1..=64 characters of A-Z a-z 0-9 . _ -",
            );
            None
        }
    });
    let data_dir = t.path(d, "data_dir", true, base).and_then(|(p, span)| {
        // It need not exist yet (the daemon creates it), but if it does it
        // must be a directory.
        match std::fs::metadata(&p) {
            Ok(m) if !m.is_dir() => {
                d.at(
                    span,
                    format!("`data_dir` {} exists and is not a directory", p.display()),
                );
                None
            }
            _ => Some(p),
        }
    });
    Some(HubConfig {
        site_id: site_id?,
        hub_id: hub_id?,
        data_dir: data_dir?,
    })
}

/// Parses `mqtt://host[:port]` or `mqtts://host[:port]` into (tls, host,
/// port). Messages never repeat the url (it might hold a password).
pub fn parse_mqtt_url(url: &str) -> Result<(bool, String, u16), String> {
    let (tls, rest) = if let Some(rest) = url.strip_prefix("mqtts://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("mqtt://") {
        (false, rest)
    } else {
        return Err("`url` must start with mqtt:// or mqtts://".to_owned());
    };
    if rest.contains('@') {
        return Err(
            "`url` must not hold credentials: use `username` and `password_file`".to_owned(),
        );
    }
    if rest.contains(['/', '?', '#']) {
        return Err("`url` must be mqtt(s)://host[:port], with no path or query".to_owned());
    }
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return Err("`url` has an unclosed [ in its host".to_owned());
        };
        if addr.parse::<std::net::Ipv6Addr>().is_err() {
            return Err("`url` host in [ ] is not an IPv6 address".to_owned());
        }
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(p),
                None => return Err("`url` has text after its host".to_owned()),
            },
        };
        (addr.to_owned(), port)
    } else {
        match rest.split_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (rest.to_owned(), None),
        }
    };
    if !rest.starts_with('[')
        && (host.is_empty()
            || !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')))
    {
        return Err("`url` needs a host name or address (A-Z a-z 0-9 . - _)".to_owned());
    }
    let port = match port {
        None => {
            if tls {
                MQTTS_PORT
            } else {
                MQTT_PORT
            }
        }
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err("`url` port must be 1..=65535".to_owned()),
        },
    };
    Ok((tls, host, port))
}

fn read_mqtt(
    d: &mut Diag<'_>,
    root: &Table<'_, '_>,
    base: &Path,
    hub_id: &str,
) -> Option<MqttConfig> {
    let t = root.table(
        d,
        "mqtt",
        "[mqtt]",
        &[
            "url",
            "client_id",
            "topic_prefix",
            "ca_file",
            "cert_file",
            "key_file",
            "username",
            "password_file",
        ],
        true,
    )?;
    let mut ok = true;
    let url = t
        .str(d, "url", true)
        .and_then(|(s, span)| match parse_mqtt_url(s) {
            Ok((tls, host, port)) => Some((s.to_owned(), tls, host, port)),
            Err(m) => {
                d.at(span, m);
                None
            }
        });
    let tls = url.as_ref().map(|u| u.1);

    let client_id = match t.get("client_id") {
        None => Some(hub_id.to_owned()),
        Some(_) => t.str(d, "client_id", false).and_then(|(s, span)| {
            if s.is_empty() || s.len() > 65535 || s.chars().any(char::is_control) {
                d.at(
                    span,
                    "`client_id` must be a non-empty string without control characters",
                );
                None
            } else {
                Some(s.to_owned())
            }
        }),
    };
    let topic_prefix = match t.get("topic_prefix") {
        None => Some(DEFAULT_TOPIC_PREFIX.to_owned()),
        Some(_) => t.str(d, "topic_prefix", false).and_then(|(s, span)| {
            let bad = s.is_empty()
                || s.starts_with('/')
                || s.ends_with('/')
                || s.contains("//")
                || s.contains(['+', '#', '\0']);
            if bad {
                d.at(
                    span,
                    "`topic_prefix` must be topic levels joined by / (no wildcards, no empty level, no leading or trailing /)",
                );
                None
            } else {
                Some(s.to_owned())
            }
        }),
    };

    // TLS files: only with mqtts://, and then the CA is required (the hub
    // bundles no root store) and a client certificate comes with its key.
    let mut file = |d: &mut Diag<'_>, key: &str| -> Option<(PathBuf, Range<usize>)> {
        let before = d.errors.len();
        let r = t.path(d, key, false, base);
        if d.errors.len() != before {
            ok = false;
        }
        r
    };
    let ca = file(d, "ca_file");
    let cert = file(d, "cert_file");
    let key = file(d, "key_file");
    let password = file(d, "password_file");
    let username = t.text(d, "username", false);
    if t.get("username").is_some() && username.is_none() {
        ok = false;
    }

    if tls == Some(false) {
        for (name, f) in [("ca_file", &ca), ("cert_file", &cert), ("key_file", &key)] {
            if let Some((_, span)) = f {
                d.at(
                    span.clone(),
                    format!("`{name}` is only used with mqtts:// (the url is mqtt://)"),
                );
                ok = false;
            }
        }
    }
    if tls == Some(true) && ca.is_none() && t.get("ca_file").is_none() {
        d.at(
            t.span.clone(),
            "mqtts:// needs `ca_file` (the CA that signed the broker's certificate)",
        );
        ok = false;
    }
    match (&cert, &key) {
        (Some((_, span)), None) if t.get("key_file").is_none() => {
            d.at(span.clone(), "`cert_file` needs `key_file`");
            ok = false;
        }
        (None, Some((_, span))) if t.get("cert_file").is_none() => {
            d.at(span.clone(), "`key_file` needs `cert_file`");
            ok = false;
        }
        _ => {}
    }
    if let Some((_, span)) = &password
        && t.get("username").is_none()
    {
        d.at(span.clone(), "`password_file` needs `username`");
        ok = false;
    }

    if tls == Some(true) {
        for (name, f) in [("ca_file", &ca), ("cert_file", &cert)] {
            if let Some((p, span)) = f {
                if check_file(d, name, p, span).is_none() {
                    ok = false;
                } else if !has_pem_certificate(p) {
                    d.at(
                        span.clone(),
                        format!("`{name}` {} holds no PEM certificate", p.display()),
                    );
                    ok = false;
                }
            }
        }
        if let Some((p, span)) = &key {
            match check_file(d, "key_file", p, span) {
                None => ok = false,
                Some(meta) => {
                    let before = d.errors.len();
                    check_private(d, "the MQTT client key", p, &meta);
                    if !has_pem_private_key(p) {
                        d.at(
                            span.clone(),
                            format!("`key_file` {} holds no PEM private key", p.display()),
                        );
                    }
                    ok &= d.errors.len() == before;
                }
            }
        }
    }
    if let Some((p, span)) = &password {
        match check_file(d, "password_file", p, span) {
            None => ok = false,
            Some(meta) => {
                let before = d.errors.len();
                check_private(d, "the MQTT password file", p, &meta);
                match std::fs::read(p) {
                    Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => {
                        d.at(
                            span.clone(),
                            format!("`password_file` {} is empty", p.display()),
                        );
                    }
                    Ok(_) => {}
                    Err(e) => d.at(
                        span.clone(),
                        format!("`password_file` {} {}", p.display(), io_message(&e)),
                    ),
                }
                ok &= d.errors.len() == before;
            }
        }
    }

    let (url, tls, host, port) = url?;
    if !ok {
        return None;
    }
    Some(MqttConfig {
        url,
        tls,
        host,
        port,
        client_id: client_id?,
        topic_prefix: topic_prefix?,
        ca_file: ca.map(|f| f.0),
        cert_file: cert.map(|f| f.0),
        key_file: key.map(|f| f.0),
        username: username.map(|u| u.0.to_owned()),
        password_file: password.map(|f| f.0),
    })
}

fn has_pem_certificate(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    let mut rd = bytes.as_slice();
    rustls_pemfile::certs(&mut rd).any(|c| c.is_ok())
}

fn has_pem_private_key(path: &Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    let mut rd = bytes.as_slice();
    matches!(rustls_pemfile::private_key(&mut rd), Ok(Some(_)))
}

fn read_trust(d: &mut Diag<'_>, root: &Table<'_, '_>) -> Option<Vec<Signer>> {
    let t = root.table(d, "trust", "[trust]", &["signer"], true)?;
    let tables = t.tables(
        d,
        "signer",
        "[[trust.signer]]",
        &["id", "public_key", "not_after"],
    );
    if tables.is_empty() && t.get("signer").is_none() {
        d.at(t.span.clone(), "no signer: add a [[trust.signer]]");
        return None;
    }
    let mut ids = Vec::new();
    let mut signers = Vec::new();
    for s in &tables {
        let id = s.name(d, "id");
        if let Some((id, span)) = &id {
            ids.push((*id, span.clone()));
        }
        let key =
            s.str(d, "public_key", true)
                .and_then(|(k, span)| match crypto::parse_public_key(k) {
                    Ok(key) => Some(key),
                    Err(e) => {
                        d.at(span, format!("`public_key` is {e}"));
                        None
                    }
                });
        let not_after = match s.get("not_after") {
            None => Some(None),
            Some(v) => {
                let text = match v.get_ref() {
                    DeValue::String(s) => Some(s.to_string()),
                    // A bare TOML date-time is the same instant when it has an offset.
                    DeValue::Datetime(dt) => Some(dt.to_string()),
                    _ => None,
                };
                match text.as_deref().map(Timestamp::parse_rfc3339) {
                    Some(Ok(ts)) => Some(Some(ts)),
                    Some(Err(_)) => {
                        d.at(
                            v.span(),
                            "`not_after` must be an RFC 3339 date-time with Z or an offset, like 2027-06-01T00:00:00Z",
                        );
                        None
                    }
                    None => {
                        Table::wrong_type(d, "not_after", v, "an RFC 3339 date-time string");
                        None
                    }
                }
            }
        };
        signers.push((|| {
            Some(Signer {
                id: id?.0.to_owned(),
                public_key: key?,
                not_after: not_after?,
            })
        })());
    }
    check_unique(d, "signer id", &ids);
    if tables.is_empty() {
        if let Some(v) = t.get("signer")
            && matches!(v.get_ref(), DeValue::Array(a) if a.is_empty())
        {
            d.at(v.span(), "no signer: add a [[trust.signer]]");
        }
        return None;
    }
    signers.into_iter().collect()
}

fn read_serials(
    d: &mut Diag<'_>,
    root: &Table<'_, '_>,
    base: &Path,
) -> (Option<Vec<SerialConfig>>, Option<Vec<String>>) {
    let tables = root.tables(d, "serial", "[[serial]]", &["name", "port", "baud"]);
    let mut names = Vec::new();
    let mut ports = Vec::new();
    let mut serials = Vec::new();
    for s in &tables {
        let name = s.name(d, "name");
        if let Some((n, span)) = &name {
            names.push((*n, span.clone()));
        }
        let port = s.path(d, "port", true, base);
        let baud = s.int_in::<u32>(d, "baud", true, 1, u32::MAX.into());
        serials.push((|| {
            Some(SerialConfig {
                name: name?.0.to_owned(),
                port: port.clone()?.0,
                baud: baud?.0,
            })
        })());
        if let Some((p, span)) = port {
            ports.push((p, span));
        }
    }
    check_unique(d, "serial name", &names);
    let port_names: Vec<(String, Range<usize>)> = ports
        .iter()
        .map(|(p, span)| (p.display().to_string(), span.clone()))
        .collect();
    let port_refs: Vec<(&str, Range<usize>)> = port_names
        .iter()
        .map(|(p, span)| (p.as_str(), span.clone()))
        .collect();
    check_unique(d, "serial port", &port_refs);
    // Doors are checked against these names only when every [[serial]] was
    // readable with a name: otherwise "not configured" would be a cascade.
    let readable = match root.get("serial") {
        None => true,
        Some(v) => matches!(v.get_ref(), DeValue::Array(a) if a.len() == tables.len()),
    };
    let all_names = (readable && names.len() == tables.len())
        .then(|| names.iter().map(|(n, _)| (*n).to_owned()).collect());
    (serials.into_iter().collect(), all_names)
}

fn read_doors(
    d: &mut Diag<'_>,
    root: &Table<'_, '_>,
    serial_names: &Option<Vec<String>>,
    reader_names: &Option<Vec<String>>,
) -> Option<(Vec<DoorConfig>, Vec<ReaderDoorConfig>)> {
    let tables = root.tables(
        d,
        "door",
        "[[door]]",
        &[
            "name",
            "serial",
            "index",
            "unlock_ms",
            "reader",
            "output",
            "contact_input",
            "contact_inverted",
        ],
    );
    let mut names = Vec::new();
    let mut places: HashMap<(String, u8), (String, Range<usize>)> = HashMap::new();
    let mut outputs: HashMap<(String, u8), (String, Range<usize>)> = HashMap::new();
    let mut doors = Vec::new();
    let mut reader_doors = Vec::new();
    let mut ok = true;
    for t in &tables {
        let name = t.name(d, "name");
        if let Some((n, span)) = &name {
            names.push((*n, span.clone()));
        }
        let this = name.as_ref().map_or("?", |n| n.0).to_owned();
        let on_board = t.get("serial").is_some() || t.get("index").is_some();
        let on_reader = t.get("reader").is_some();
        if on_board == on_reader {
            d.at(
                t.span.clone(),
                format!(
                    "door `{}` must name either `serial` and `index` (a lock board) or `reader` (an OSDP reader){}",
                    this.escape_debug(),
                    if on_board { ", not both" } else { "" }
                ),
            );
            ok = false;
            continue;
        }
        let unlock_ms = t.int_in::<u16>(d, "unlock_ms", true, 1, u16::MAX.into());
        if on_reader {
            for key in ["serial", "index"] {
                if let Some(v) = t.get(key) {
                    d.at(
                        v.span(),
                        format!("`{key}` is for a door on a lock board, not on a reader"),
                    );
                }
            }
            let reader = t
                .str(d, "reader", true)
                .and_then(|(s, span)| match reader_names {
                    Some(names) if !names.iter().any(|n| n == s) => {
                        d.at(
                            span,
                            format!(
                                "door reader `{}` is not configured in a [[reader]]",
                                s.escape_debug()
                            ),
                        );
                        None
                    }
                    _ => Some(s.to_owned()),
                });
            let output = t.int_in::<u8>(d, "output", true, 0, u8::MAX.into());
            let contact_input = t.int_in::<u8>(d, "contact_input", false, 0, u8::MAX.into());
            let contact_inverted = t.bool(d, "contact_inverted");
            if let (Some(r), Some((o, span))) = (&reader, &output) {
                match outputs.get(&(r.clone(), *o)) {
                    Some((other, first)) => {
                        let line = d.line_of(first);
                        d.at(
                            span.clone(),
                            format!(
                                "door `{this}` uses output {o} of reader `{r}`, already used by door `{other}` (line {line})"
                            ),
                        );
                    }
                    None => {
                        outputs.insert((r.clone(), *o), (this.clone(), span.clone()));
                    }
                }
            }
            reader_doors.push((|| {
                Some(ReaderDoorConfig {
                    name: name?.0.to_owned(),
                    reader: reader?,
                    output: output?.0,
                    contact_input: contact_input.map(|c| c.0),
                    contact_inverted: contact_inverted?,
                    unlock_ms: unlock_ms?.0,
                })
            })());
            continue;
        }
        for key in ["output", "contact_input", "contact_inverted"] {
            if let Some(v) = t.get(key) {
                d.at(
                    v.span(),
                    format!("`{key}` is for a door on an OSDP reader, not on a lock board"),
                );
            }
        }
        let serial = t
            .str(d, "serial", true)
            .and_then(|(s, span)| match serial_names {
                Some(names) if !names.iter().any(|n| n == s) => {
                    d.at(
                        span,
                        format!(
                            "door serial `{}` is not configured in a [[serial]]",
                            s.escape_debug()
                        ),
                    );
                    None
                }
                _ => Some(s.to_owned()),
            });
        let index = t.int_in::<u8>(d, "index", true, 0, MAX_DOOR_INDEX.into());
        if let (Some(s), Some((i, span))) = (&serial, &index) {
            match places.get(&(s.clone(), *i)) {
                Some((other, first)) => {
                    let line = d.line_of(first);
                    d.at(
                        span.clone(),
                        format!(
                            "door `{this}` has index {i} on serial `{s}`, already used by door `{other}` (line {line})"
                        ),
                    );
                }
                None => {
                    places.insert((s.clone(), *i), (this, span.clone()));
                }
            }
        }
        doors.push((|| {
            Some(DoorConfig {
                name: name?.0.to_owned(),
                serial: serial?,
                index: index?.0,
                unlock_ms: unlock_ms?.0,
            })
        })());
    }
    check_unique(d, "door name", &names);
    let doors: Option<Vec<DoorConfig>> = doors.into_iter().collect();
    let reader_doors: Option<Vec<ReaderDoorConfig>> = reader_doors.into_iter().collect();
    if !ok {
        return None;
    }
    Some((doors?, reader_doors?))
}

/// `[[osdp]]`: the buses, and their names when every one was readable.
fn read_osdp_buses(
    d: &mut Diag<'_>,
    root: &Table<'_, '_>,
    base: &Path,
) -> (Option<Vec<OsdpBusConfig>>, Option<Vec<String>>) {
    let tables = root.tables(d, "osdp", "[[osdp]]", &["name", "port", "baud"]);
    let mut names = Vec::new();
    let mut buses = Vec::new();
    for t in &tables {
        let name = t.name(d, "name");
        if let Some((n, span)) = &name {
            names.push((*n, span.clone()));
        }
        let port = t.path(d, "port", true, base);
        let baud = t.int_in::<u32>(d, "baud", true, 1, u32::MAX.into()).and_then(|(b, span)| {
            if OSDP_BAUDS.contains(&b) {
                Some(b)
            } else {
                d.at(
                    span,
                    format!("`baud` must be one of 9600, 19200, 38400, 57600, 115200, 230400; found {b}"),
                );
                None
            }
        });
        buses.push((|| {
            Some(OsdpBusConfig {
                name: name?.0.to_owned(),
                port: port?.0,
                baud: baud?,
            })
        })());
    }
    check_unique(d, "osdp bus name", &names);
    let readable = match root.get("osdp") {
        None => true,
        Some(v) => matches!(v.get_ref(), DeValue::Array(a) if a.len() == tables.len()),
    };
    let all_names = (readable && names.len() == tables.len())
        .then(|| names.iter().map(|(n, _)| (*n).to_owned()).collect());
    (buses.into_iter().collect(), all_names)
}

/// A reader's name, its span and `insecure_plaintext`, for the key check.
type NamedReader = (String, Range<usize>, bool);

/// `[[reader]]`: the readers and the span of each one's name.
fn read_readers(
    d: &mut Diag<'_>,
    root: &Table<'_, '_>,
    bus_names: &Option<Vec<String>>,
) -> (Option<Vec<ReaderConfig>>, Vec<NamedReader>) {
    let tables = root.tables(
        d,
        "reader",
        "[[reader]]",
        &["name", "bus", "address", "insecure_plaintext"],
    );
    let mut names = Vec::new();
    let mut spans = Vec::new();
    let mut places: HashMap<(String, u8), (String, Range<usize>)> = HashMap::new();
    let mut readers = Vec::new();
    for t in &tables {
        let name = t.name(d, "name");
        if let Some((n, span)) = &name {
            names.push((*n, span.clone()));
        }
        let this = name.as_ref().map_or("?", |n| n.0).to_owned();
        let bus = t.str(d, "bus", true).and_then(|(s, span)| match bus_names {
            Some(names) if !names.iter().any(|n| n == s) => {
                d.at(
                    span,
                    format!(
                        "reader bus `{}` is not configured in an [[osdp]]",
                        s.escape_debug()
                    ),
                );
                None
            }
            _ => Some(s.to_owned()),
        });
        let address = t.int_in::<u8>(d, "address", true, 0, MAX_READER_ADDRESS.into());
        if let (Some(b), Some((a, span))) = (&bus, &address) {
            match places.get(&(b.clone(), *a)) {
                Some((other, first)) => {
                    let line = d.line_of(first);
                    d.at(
                        span.clone(),
                        format!(
                            "reader `{this}` has address {a} on bus `{b}`, already used by reader `{other}` (line {line})"
                        ),
                    );
                }
                None => {
                    places.insert((b.clone(), *a), (this, span.clone()));
                }
            }
        }
        let insecure = t.bool(d, "insecure_plaintext");
        if let (Some((n, span)), Some(i)) = (&name, insecure) {
            spans.push(((*n).to_owned(), span.clone(), i));
        }
        readers.push((|| {
            Some(ReaderConfig {
                name: name?.0.to_owned(),
                bus: bus?,
                address: address?.0,
                insecure_plaintext: insecure?,
            })
        })());
    }
    check_unique(d, "reader name", &names);
    (readers.into_iter().collect(), spans)
}

fn read_policy(d: &mut Diag<'_>, root: &Table<'_, '_>) -> Option<Policy> {
    const KEYS: [&str; 8] = [
        "lockout_threshold",
        "lockout_window_s",
        "lockout_base_s",
        "held_open_s",
        "max_grant_days",
        "dedupe_retention_days",
        "audit_retention_days",
        "cloud_stale_s",
    ];
    let mut p = Policy::default();
    let Some(t) = root.table(d, "policy", "[policy]", &KEYS, false) else {
        // Absent is all defaults; present but not a table was reported.
        return (root.get("policy").is_none()).then_some(p);
    };
    let mut ok = true;
    for key in KEYS {
        if t.get(key).is_none() {
            continue;
        }
        let Some((n, span)) = t.int(d, key, false) else {
            ok = false;
            continue;
        };
        let Some(v) = u32::try_from(n).ok().filter(|v| *v > 0) else {
            d.at(
                span,
                format!(
                    "`{key}` must be a positive integer (1..={}), found {n}",
                    u32::MAX
                ),
            );
            ok = false;
            continue;
        };
        match key {
            "lockout_threshold" => p.lockout_threshold = v,
            "lockout_window_s" => p.lockout_window_s = v,
            "lockout_base_s" => p.lockout_base_s = v,
            "held_open_s" => p.held_open_s = v,
            "max_grant_days" => p.max_grant_days = v,
            "dedupe_retention_days" => p.dedupe_retention_days = v,
            "audit_retention_days" => p.audit_retention_days = v,
            _ => p.cloud_stale_s = v,
        }
    }
    ok.then_some(p)
}

/// Reads the secrets file named at `span` in hub.toml. Its own problems are
/// reported with its own path; a file that cannot be opened at all is
/// reported at `span`. No message ever holds a secret value.
fn read_secrets(
    hub: &mut Diag<'_>,
    errors: &mut Vec<ConfigError>,
    file: &Path,
    span: &Range<usize>,
) -> Option<Secrets> {
    let meta = check_file(hub, "file", file, span)?;
    let mode_before = hub.errors.len();
    check_private(hub, "the secrets file", file, &meta);
    let mode_ok = hub.errors.len() == mode_before;
    let text = match read_text(file) {
        Ok(t) => t,
        Err(ReadError::Io(e)) => {
            hub.at(
                span.clone(),
                format!("secrets file {} {}", file.display(), io_message(&e)),
            );
            return None;
        }
        Err(ReadError::Utf8 { line, column }) => {
            errors.push(ConfigError {
                file: file.to_path_buf(),
                line: Some(line),
                column: Some(column),
                message: "not valid UTF-8".to_owned(),
            });
            return None;
        }
    };
    let mut d = Diag::new(file, &text, true);
    let secrets = parse_secrets(&mut d, &text);
    errors.append(&mut d.errors);
    secrets.filter(|_| mode_ok)
}

fn parse_secrets(d: &mut Diag<'_>, text: &str) -> Option<Secrets> {
    let doc = parse_toml(d, text)?;
    let root = Table {
        what: "the secrets file".to_owned(),
        span: doc.span(),
        t: doc.get_ref(),
    };
    root.check_unknown(d, &["hub_key", "pin_key", "reader_key"]);
    let hub_key = root
        .table(d, "hub_key", "[hub_key]", &["secret"], true)
        .and_then(|t| secret_32(d, &t))
        .map(|seed| SigningKey::from_bytes(&seed));
    let tables = root.tables(d, "pin_key", "[[pin_key]]", &["id", "secret"]);
    if tables.is_empty() && root.get("pin_key").is_none() {
        d.at(
            root.span.clone(),
            "missing [[pin_key]]: the hub needs at least one PIN key",
        );
    }
    let mut ids = Vec::new();
    let mut pin_keys = Vec::new();
    for t in &tables {
        let id = t.name(d, "id");
        if let Some((id, span)) = &id {
            ids.push((*id, span.clone()));
        }
        let secret = secret_32(d, t);
        pin_keys.push((|| {
            Some(PinKey {
                id: id?.0.to_owned(),
                secret: secret?,
            })
        })());
    }
    check_unique(d, "pin key id", &ids);
    let mut readers = Vec::new();
    let mut reader_keys = Vec::new();
    for t in &root.tables(d, "reader_key", "[[reader_key]]", &["reader", "scbk"]) {
        let reader = t.name(d, "reader");
        if let Some((r, span)) = &reader {
            readers.push((*r, span.clone()));
        }
        let scbk = scbk_16(d, t);
        reader_keys.push((|| {
            Some(ReaderKey {
                reader: reader?.0.to_owned(),
                scbk: scbk?,
            })
        })());
    }
    check_unique(d, "reader_key reader", &readers);
    let reader_keys: Option<Vec<ReaderKey>> = reader_keys.into_iter().collect();
    let pin_keys: Option<Vec<PinKey>> = pin_keys.into_iter().collect();
    let pin_keys = pin_keys.filter(|k| !k.is_empty())?;
    Some(Secrets {
        hub_key: hub_key?,
        pin_keys,
        reader_keys: reader_keys?,
    })
}

/// `secret`: base64url of exactly 32 bytes. Messages say what is wrong with
/// it without showing it.
fn secret_32(d: &mut Diag<'_>, t: &Table<'_, '_>) -> Option<[u8; 32]> {
    let (s, span) = t.str(d, "secret", true)?;
    if let Some(bytes) = crypto::b64u_decode_32(s) {
        return Some(bytes);
    }
    let message = match crypto::b64u_decode(s) {
        Some(b) => format!(
            "`secret` must be 32 bytes (base64url, 43 characters); it decodes to {} bytes",
            b.len()
        ),
        None => "`secret` is not base64url; it must be 32 bytes (43 characters)".to_owned(),
    };
    d.at(span, message);
    None
}

/// `scbk`: base64url of exactly 16 bytes, never shown.
fn scbk_16(d: &mut Diag<'_>, t: &Table<'_, '_>) -> Option<[u8; 16]> {
    let (s, span) = t.str(d, "scbk", true)?;
    let message = match crypto::b64u_decode(s) {
        Some(b) => match <[u8; 16]>::try_from(b.as_slice()) {
            Ok(k) => return Some(k),
            Err(_) => format!(
                "`scbk` must be 16 bytes (base64url, 22 characters); it decodes to {} bytes",
                b.len()
            ),
        },
        None => "`scbk` is not base64url; it must be 16 bytes (22 characters)".to_owned(),
    };
    d.at(span, message);
    None
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
        let ok = |u: &str| parse_mqtt_url(u).unwrap();
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
        assert!(is_id("hub-lobby-1"));
        assert!(is_id(&"a".repeat(64)));
        assert!(!is_id(&"a".repeat(65)));
        assert!(!is_id(""));
        assert!(!is_id("a b"));
        assert!(!is_id("é"));
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
