//! The installer's contract: `hub.toml` and `secrets.toml` (config.md).
//!
//! Loading is all-or-nothing: [`load`] reads both files, checks every rule,
//! and either returns a [`Config`] the rest of the daemon can trust without
//! re-checking, or every problem at once, each with file, line and column.
//! Nothing here writes anything.

use crate::time::Timestamp;
use ed25519_dalek::{SigningKey, VerifyingKey};
use std::path::PathBuf;
use uuid::Uuid;

/// A loaded, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where `hub.toml` was read from (relative paths in it resolve from its folder).
    pub path: PathBuf,
    pub hub: HubConfig,
    pub mqtt: MqttConfig,
    pub trust: Vec<Signer>,
    pub serials: Vec<SerialConfig>,
    pub doors: Vec<DoorConfig>,
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
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secrets")
            .field("hub_key", &"<redacted>")
            .field("pin_keys", &self.pin_keys)
            .finish()
    }
}

impl Config {
    pub fn door(&self, name: &str) -> Option<&DoorConfig> {
        self.doors.iter().find(|d| d.name == name)
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
        self.hub.data_dir.join("lockhub.db")
    }
}
