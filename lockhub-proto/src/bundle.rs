//! The provisioning bundle: what a cloud hands an installer for one hub,
//! and what `lockhub provision --bundle` reads (its hub.toml and
//! secrets.toml are written from it). The cloud writes it
//! (`lockhub-cloud hub add --write-bundle`), the hub reads it: one set of
//! types for both.
//!
//! ## Schema (JSON, version 1)
//! What a cloud hands an installer for one hub. Unknown fields are refused so
//! a typo is not silently dropped.
//! ```json
//! {
//!   "v": 1,
//!   "site_id": "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10",
//!   "hub_id": "hub-lobby-1",
//!   "mqtt": {"url": "mqtts://broker.example.net:8883",
//!            "client_id": null, "topic_prefix": null,
//!            "ca_file": "/etc/lockhub/ca.pem", "cert_file": null, "key_file": null,
//!            "username": null, "password_file": null},
//!   "trust": [{"id": "cloud-2026-11", "public_key": "B64U", "not_after": "2027-06-01T00:00:00Z"}],
//!   "serials": [{"name": "board-a", "port": "/dev/ttyAMA0", "baud": 115200}],
//!   "doors": [{"name": "101", "serial": "board-a", "index": 0, "unlock_ms": 5000}],
//!   "pin_keys": [{"id": "k1", "secret": "B64U of 32 bytes"}],
//!   "osdp": [{"name": "bus-a", "port": "/dev/ttyUSB0", "baud": 9600}],
//!   "readers": [{"name": "r-201", "bus": "bus-a", "address": 1}],
//!   "reader_doors": [{"name": "201", "reader": "r-201", "output": 0,
//!                     "contact_input": 0, "unlock_ms": 5000}]
//! }
//! ```
//! `mqtt` fields other than `url`, each `not_after`, `serials`, `doors`,
//! `pin_keys`, `osdp`, `readers` and `reader_doors` are optional. Every
//! reader that is not `insecure_plaintext` gets a fresh random 16-byte
//! Secure Channel key in the secrets file; `lockhub osdp install` then puts
//! it into the reader. A bundle with `pin_keys` holds secrets: treat it
//! like the secrets file (delete it after provisioning).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The serial baud rate when a bundle (or a config) gives none.
pub const DEFAULT_SERIAL_BAUD: u32 = 115_200;
/// The OSDP bus baud rate when a bundle (or a config) gives none.
pub const DEFAULT_OSDP_BAUD: u32 = 9600;
/// The relay time when none is given (config.md example).
pub const DEFAULT_UNLOCK_MS: u16 = 5000;

/// The bundle's `mqtt` object (and the values the command line gives).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MqttSpec {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
}

/// A trusted cloud signer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustSpec {
    pub id: String,
    pub public_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_after: Option<String>,
}

impl std::str::FromStr for TrustSpec {
    type Err = String;
    /// `ID=PUBLIC_KEY[,NOT_AFTER]`, the `--trust` syntax.
    fn from_str(s: &str) -> Result<Self, String> {
        let (id, rest) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected ID=PUBLIC_KEY[,NOT_AFTER]"))?;
        let (key, not_after) = match rest.split_once(',') {
            Some((k, n)) => (k, Some(n.trim().to_owned())),
            None => (rest, None),
        };
        Ok(TrustSpec {
            id: id.trim().to_owned(),
            public_key: key.trim().to_owned(),
            not_after,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SerialSpec {
    pub name: String,
    pub port: PathBuf,
    #[serde(default = "default_baud")]
    pub baud: u32,
    /// A plain board (serial.md, "Sealed link"); the others are paired
    /// after provisioning (`lockhub board pair`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_plaintext: bool,
}

fn default_baud() -> u32 {
    DEFAULT_SERIAL_BAUD
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoorSpec {
    pub name: String,
    pub serial: String,
    pub index: u8,
    #[serde(default = "default_unlock_ms")]
    pub unlock_ms: u16,
}

/// An `[[osdp]]` bus in a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OsdpSpec {
    pub name: String,
    pub port: PathBuf,
    #[serde(default = "default_osdp_baud")]
    pub baud: u32,
}

fn default_osdp_baud() -> u32 {
    DEFAULT_OSDP_BAUD
}

/// A `[[reader]]` in a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReaderSpec {
    pub name: String,
    pub bus: String,
    pub address: u8,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure_plaintext: bool,
}

/// A door on an OSDP reader in a bundle (a `[[door]]` with `reader`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReaderDoorSpec {
    pub name: String,
    pub reader: String,
    pub output: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contact_input: Option<u8>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub contact_inverted: bool,
    #[serde(default = "default_unlock_ms")]
    pub unlock_ms: u16,
}

fn default_unlock_ms() -> u16 {
    DEFAULT_UNLOCK_MS
}

/// A PIN key in a bundle. Debug never shows the secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinKeySpec {
    pub id: String,
    pub secret: String,
}

impl std::fmt::Debug for PinKeySpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinKeySpec")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// A provisioning bundle (see the module docs for the schema).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    pub v: u32,
    pub site_id: String,
    pub hub_id: String,
    pub mqtt: MqttSpec,
    pub trust: Vec<TrustSpec>,
    #[serde(default)]
    pub serials: Vec<SerialSpec>,
    #[serde(default)]
    pub doors: Vec<DoorSpec>,
    #[serde(default)]
    pub pin_keys: Vec<PinKeySpec>,
    #[serde(default)]
    pub osdp: Vec<OsdpSpec>,
    #[serde(default)]
    pub readers: Vec<ReaderSpec>,
    #[serde(default)]
    pub reader_doors: Vec<ReaderDoorSpec>,
}

/// The only bundle version this lockhub understands.
pub const BUNDLE_VERSION: u32 = 1;

impl Bundle {
    /// Parses bundle JSON. The error names the line and column, never a value.
    pub fn parse(text: &str) -> Result<Bundle, String> {
        let b: Bundle = serde_json::from_str(text).map_err(|e| {
            format!(
                "{} (line {}, column {})",
                without_values(&e),
                e.line(),
                e.column()
            )
        })?;
        if b.v != BUNDLE_VERSION {
            return Err(format!(
                "bundle version {} is not supported (this lockhub reads version {BUNDLE_VERSION})",
                b.v
            ));
        }
        Ok(b)
    }

    /// The bundle as JSON (pretty, for people to read before they hand it on).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }
}

/// serde_json's message for `e` without the values it quotes: a string
/// found where something else was expected is echoed whole, and a
/// bundle's strings are PIN-key and reader secrets. Every double-quoted
/// part becomes `"…"`; the position is left to the caller.
fn without_values(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let message = match full.rfind(" at line ") {
        Some(i) if e.line() > 0 => &full[..i],
        _ => full.as_str(),
    };
    let mut out = String::with_capacity(message.len());
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '"' {
            out.push('…');
            let mut escaped = false;
            for q in chars.by_ref() {
                match (escaped, q) {
                    (false, '\\') => escaped = true,
                    (false, '"') => break,
                    _ => escaped = false,
                }
            }
            out.push('"');
        }
    }
    out
}
