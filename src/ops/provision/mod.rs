//! `lockhub provision`: writes a hub's `hub.toml` and `secrets.toml`
//! (config.md) from command-line values or from a provisioning bundle.
//!
//! ## Why it is shaped like this
//! - **No window for the secrets.** The secrets file is created with mode
//!   0600 by `open(2)` itself (never chmod-ed after), in a temporary name in
//!   its own folder, chowned to the daemon's user before a byte is written,
//!   and only then linked into place. A crash leaves the old file or none,
//!   never a half-written or world-readable one.
//! - **Never clobber by accident.** Without `--force` both files are checked
//!   first and the final link uses `link(2)`, which refuses an existing name
//!   atomically; with `--force` they are replaced by `rename(2)`.
//! - **Fresh keys.** The hub's Ed25519 key is generated here from the OS RNG
//!   unless the installer supplies one in a file, and PIN keys that the bundle
//!   or the installer do not supply are generated too. Secrets are never taken
//!   from the command line (other users can read `/proc/*/cmdline`), never
//!   printed, and never logged; what is printed is the hub's *public* key, for
//!   registration with the cloud.
//! - **Valid by construction.** The files are staged beside their final
//!   names and checked by `check-config`'s own loader (`config::load`), the
//!   one home of every rule, before anything is committed; a refusal leaves
//!   no file and no folder behind. So provision accepts exactly what
//!   `check-config` accepts (tested name by name).
//!
//! ## Provisioning bundle
//! What a cloud hands an installer for one hub: its schema and types are
//! `lockhub_proto::bundle`'s (the cloud writes it, this command reads it).

use ed25519_dalek::SigningKey;
use lockhub_proto::bundle::{
    Bundle, DoorSpec, MqttSpec, OsdpSpec, ReaderDoorSpec, ReaderSpec, SerialSpec, TrustSpec,
};
use lockhub_proto::crypto::{b64u_decode_32, b64u_encode};
use rand::TryRng;
use serde::Serialize;
use std::fs::{DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use uuid::Uuid;

pub mod bundle;
pub mod cli;
mod output;
mod staged;

use bundle::*;
use output::*;
use staged::*;

/// Mode of `hub.toml`: it holds no secret, and operators read it.
pub const CONFIG_MODE: u32 = 0o644;
/// Mode of `secrets.toml`: `check-config` refuses anything looser.
pub const SECRETS_MODE: u32 = 0o600;
/// Mode of a config folder this command creates (`/etc/lockhub`).
pub const CONFIG_DIR_MODE: u32 = 0o755;
/// Mode of a secrets or data folder this command creates.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// The PIN key id generated when none is named.
pub const DEFAULT_PIN_KEY_ID: &str = "k1";

/// The provisioning boundary's errors. None of them carries a secret.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("invalid value: {0}")]
    Invalid(String),
    #[error("cannot read the bundle {path}: {source}")]
    BundleRead {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bundle {path}: {message}")]
    Bundle { path: PathBuf, message: String },
    #[error("{path} already exists; pass --force to replace it")]
    Exists { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "unknown user {0:?} (not in /etc/passwd). The .deb creates the user lockhub; \
         without it, create the user first (sudo adduser --system --group --home /var/lib/lockhub \
         --no-create-home {0}; and sudo adduser {0} dialout for serial ports), or leave out --owner"
    )]
    UnknownUser(String),
    #[error(
        "unknown group {0:?} (not in /etc/group): create it first (sudo addgroup --system {0}), \
         or give --owner USER alone for the user's own group"
    )]
    UnknownGroup(String),
    #[error("nothing written: check-config would refuse this config:\n{0}")]
    Check(String),
    #[error("the operating system's random number generator failed: {0}")]
    Random(String),
}

impl ProvisionError {
    /// Whether the installer's input is at fault (exit 2) rather than the
    /// machine (exit 1).
    pub fn is_input_problem(&self) -> bool {
        matches!(
            self,
            ProvisionError::Invalid(_)
                | ProvisionError::Bundle { .. }
                | ProvisionError::Exists { .. }
                | ProvisionError::UnknownUser(_)
                | ProvisionError::UnknownGroup(_)
                | ProvisionError::Check(_)
        )
    }
}

/// Where a PIN key's secret comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum PinKeySource {
    Generate,
    /// Base64url of 32 bytes, as read from a bundle or a file.
    Given(String),
}

/// Everything `provision` needs, from a bundle or from flags.
#[derive(Clone)]
pub struct Request {
    pub site_id: String,
    pub hub_id: String,
    pub mqtt: MqttSpec,
    pub trust: Vec<TrustSpec>,
    pub serials: Vec<SerialSpec>,
    pub doors: Vec<DoorSpec>,
    pub pin_keys: Vec<(String, PinKeySource)>,
    /// Base64url of the hub key's 32-byte seed; generated when `None`.
    pub hub_key: Option<String>,
    pub osdp: Vec<OsdpSpec>,
    pub readers: Vec<ReaderSpec>,
    pub reader_doors: Vec<ReaderDoorSpec>,
}

/// Where the files go and who owns them.
#[derive(Debug, Clone)]
pub struct Target {
    /// `hub.toml`.
    pub config: PathBuf,
    /// `secrets.toml`; named in `hub.toml` as `[secrets] file`.
    pub secrets: PathBuf,
    /// `[hub] data_dir`; created (0700) when missing.
    pub data_dir: PathBuf,
    /// Replace existing files.
    pub force: bool,
    /// The daemon's user: owns the secrets file and the data folder, so a
    /// daemon that runs as `lockhub` can read the one and write the other.
    pub owner: Option<Owner>,
}

/// A numeric owner (uid, gid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Owner {
    /// Resolves `USER`, `USER:GROUP`, or numeric `UID[:GID]` through
    /// `/etc/passwd` and `/etc/group`. Reading the files directly keeps the
    /// binary free of libc's NSS (and static-friendly); the daemon's user is
    /// a local system user (sysusers.d), which is always there.
    pub fn resolve(spec: &str) -> Result<Owner, ProvisionError> {
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let (uid, primary_gid) = match user.parse::<u32>() {
            Ok(uid) => (uid, uid),
            Err(_) => passwd
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() >= 4 && f[0] == user)
                .and_then(|f| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
                .ok_or_else(|| ProvisionError::UnknownUser(user.to_owned()))?,
        };
        let gid = match group {
            None => primary_gid,
            Some(g) => match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => std::fs::read_to_string("/etc/group")
                    .unwrap_or_default()
                    .lines()
                    .map(|l| l.split(':').collect::<Vec<_>>())
                    .find(|f| f.len() >= 3 && f[0] == g)
                    .and_then(|f| f[2].parse().ok())
                    .ok_or_else(|| ProvisionError::UnknownGroup(g.to_owned()))?,
            },
        };
        Ok(Owner { uid, gid })
    }
}

/// What was written: everything here is safe to print.
#[derive(Debug, Clone, Serialize)]
pub struct Provisioned {
    pub site_id: String,
    pub hub_id: String,
    /// Base64url of the hub's Ed25519 public key: register it with the cloud.
    pub hub_public_key: String,
    pub hub_key_generated: bool,
    pub config: PathBuf,
    pub secrets: PathBuf,
    pub data_dir: PathBuf,
    pub pin_key_ids: Vec<String>,
    /// The PIN keys generated here (the cloud must learn them out of band).
    pub pin_keys_generated: Vec<String>,
    /// The readers given a fresh Secure Channel key (install each one).
    pub reader_keys_generated: Vec<String>,
    /// The boards to pair before the daemon runs (`lockhub board pair`):
    /// every serial that is not `insecure_plaintext` (a board's link key
    /// comes from the board, by pairing, never from here).
    pub boards_to_pair: Vec<String>,
}

/// 16 bytes from the OS RNG: a reader's Secure Channel Base Key.
fn random16() -> Result<[u8; 16], ProvisionError> {
    let mut b = [0u8; 16];
    rand::rngs::SysRng
        .try_fill_bytes(&mut b)
        .map_err(|e| ProvisionError::Random(e.to_string()))?;
    Ok(b)
}

/// 32 bytes from the OS RNG (getrandom), never a userspace PRNG: these are
/// long-lived keys, and a failure is an error, not a panic.
fn random32() -> Result<[u8; 32], ProvisionError> {
    let mut b = [0u8; 32];
    rand::rngs::SysRng
        .try_fill_bytes(&mut b)
        .map_err(|e| ProvisionError::Random(e.to_string()))?;
    Ok(b)
}

fn invalid(msg: impl Into<String>) -> ProvisionError {
    ProvisionError::Invalid(msg.into())
}

fn absolute(p: &Path) -> Result<PathBuf, ProvisionError> {
    std::path::absolute(p).map_err(|source| ProvisionError::Write {
        path: p.to_owned(),
        source,
    })
}

/// A PIN key about to be written: id, secret, generated here.
type NewPinKey = (String, [u8; 32], bool);

/// Normalises a request (lowercase site id, trimmed URL) and decodes or
/// makes its keys. Returns the hub key seed and the PIN keys.
///
/// Every rule of config.md is `config::load`'s: [`provision`] runs it on the
/// staged files before anything is committed, so provision refuses exactly
/// what check-config refuses (names, ids, URLs, signers, doors, readers),
/// with the same messages. Here is only what `load` cannot see: the input
/// before it is written (a site id to normalise, secrets to decode).
fn validate(req: &mut Request) -> Result<([u8; 32], Vec<NewPinKey>), ProvisionError> {
    let site = Uuid::parse_str(req.site_id.trim())
        .map_err(|_| invalid(format!("site id {:?} is not a UUID", req.site_id)))?;
    req.site_id = site.hyphenated().to_string();
    req.mqtt.url = req.mqtt.url.trim().to_owned();

    let hub_seed = match &req.hub_key {
        Some(b) => b64u_decode_32(b.trim())
            .ok_or_else(|| invalid("the supplied hub key is not base64url of 32 bytes"))?,
        None => random32()?,
    };
    if req.pin_keys.is_empty() {
        req.pin_keys
            .push((DEFAULT_PIN_KEY_ID.to_owned(), PinKeySource::Generate));
    }
    let mut pins = Vec::new();
    for (id, source) in &req.pin_keys {
        let (secret, generated) = match source {
            PinKeySource::Generate => (random32()?, true),
            PinKeySource::Given(s) => (
                b64u_decode_32(s.trim()).ok_or_else(|| {
                    invalid(format!(
                        "PIN key {id:?}: secret is not base64url of 32 bytes"
                    ))
                })?,
                false,
            ),
        };
        pins.push((id.clone(), secret, generated));
    }
    Ok((hub_seed, pins))
}

/// The request's field that line `line` of the hub.toml that provision
/// renders came from: the bundle's name for it (`doors[1].index`), and the
/// flag that sets it when there is one. `board_doors` is how many of the
/// `[[door]]` tables are the bundle's `doors` (the rest are its
/// `reader_doors`). None for a line that is no field of the request.
fn field_at(text: &str, line: usize, board_doors: usize) -> Option<String> {
    let mut table: Option<(String, Option<usize>)> = None;
    let mut counts: std::collections::HashMap<String, usize> = Default::default();
    let lines: Vec<&str> = text.lines().collect();
    for l in lines.iter().take(line) {
        let t = l.trim();
        if let Some(name) = t.strip_prefix("[[").and_then(|r| r.strip_suffix("]]")) {
            let n = counts.entry(name.to_owned()).or_default();
            table = Some((name.to_owned(), Some(*n)));
            *n += 1;
        } else if let Some(name) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
            table = Some((name.to_owned(), None));
        }
    }
    let (table, index) = table?;
    let key = lines
        .get(line.checked_sub(1)?)
        .and_then(|l| l.split_once('='))
        .map(|(k, _)| k.trim().trim_matches('"').to_owned());
    let dotted = |base: String| match &key {
        Some(k) => format!("`{base}.{k}`"),
        None => format!("`{base}`"),
    };
    let flag = |k: &str| -> Option<&'static str> {
        Some(match (table.as_str(), k) {
            ("hub", "site_id") => "--site-id",
            ("hub", "hub_id") => "--hub-id",
            ("hub", "data_dir") => "--data-dir",
            ("mqtt", "url") => "--mqtt-url",
            ("mqtt", "ca_file") => "--ca-file",
            ("mqtt", "cert_file") => "--cert-file",
            ("mqtt", "key_file") => "--key-file",
            ("mqtt", "username") => "--username",
            ("mqtt", "password_file") => "--password-file",
            ("trust.signer", _) => "--trust",
            _ => return None,
        })
    };
    let field = match (table.as_str(), index) {
        ("hub", None) => format!("`{}`", key.clone()?),
        ("mqtt", None) => dotted("mqtt".to_owned()),
        ("trust.signer", Some(i)) => dotted(format!("trust[{i}]")),
        ("serial", Some(i)) => dotted(format!("serials[{i}]")),
        ("osdp", Some(i)) => dotted(format!("osdp[{i}]")),
        ("reader", Some(i)) => dotted(format!("readers[{i}]")),
        ("door", Some(i)) if i < board_doors => dotted(format!("doors[{i}]")),
        ("door", Some(i)) => dotted(format!("reader_doors[{}]", i - board_doors)),
        _ => return None,
    };
    let flag = match key.as_deref() {
        Some(k) => flag(k),
        None if table == "mqtt" => Some("--mqtt-url and the TLS flags"),
        None => None,
    };
    Some(match flag {
        Some(f) => format!("bundle field {field} ({f})"),
        None => format!("bundle field {field}"),
    })
}

/// Writes `hub.toml` and `secrets.toml` for `req` at `target`.
pub fn provision(mut req: Request, target: &Target) -> Result<Provisioned, ProvisionError> {
    let (hub_seed, pins) = validate(&mut req)?;
    let config = absolute(&target.config)?;
    let secrets = absolute(&target.secrets)?;
    let data_dir = absolute(&target.data_dir)?;
    if config == secrets {
        return Err(invalid(
            "the config and the secrets file must be different files",
        ));
    }
    if !target.force {
        for p in [&config, &secrets] {
            if p.symlink_metadata().is_ok() {
                return Err(ProvisionError::Exists { path: p.clone() });
            }
        }
    }

    let hub_key = SigningKey::from_bytes(&hub_seed);
    let hub_public_key = b64u_encode(hub_key.verifying_key().as_bytes());

    let render_config = |secrets_file: &Path| -> Result<String, ProvisionError> {
        let hub_toml = HubToml {
            hub: HubSection {
                site_id: req.site_id.clone(),
                hub_id: &req.hub_id,
                data_dir: &data_dir,
            },
            mqtt: &req.mqtt,
            trust: TrustSection { signer: &req.trust },
            secrets: SecretsSection { file: secrets_file },
            serial: &req.serials,
            osdp: &req.osdp,
            reader: &req.readers,
            door: req
                .doors
                .iter()
                .map(DoorEntry::Board)
                .chain(req.reader_doors.iter().map(DoorEntry::Reader))
                .collect(),
        };
        Ok(format!(
            "# lockhub hub config (config.md), written by `lockhub provision`.\n\
             # Hub public key (registered with the cloud): {hub_public_key}\n\n{}",
            toml::to_string(&hub_toml).map_err(|e| invalid(e.to_string()))?
        ))
    };
    // A fresh key per reader that will use a Secure Channel; the rules on
    // readers are check-config's, run below on the staged files.
    let mut reader_keys = Vec::new();
    for r in req.readers.iter().filter(|r| !r.insecure_plaintext) {
        reader_keys.push(ReaderKeyEntry {
            reader: r.name.clone(),
            scbk: b64u_encode(&random16()?),
        });
    }
    let reader_keys_generated: Vec<String> = reader_keys.iter().map(|k| k.reader.clone()).collect();
    let secrets_text = format!(
        "# lockhub secrets for hub {}: keep 0600, owned by the daemon's user.\n\
         # If this file leaks, rotate the hub key, the PIN keys and broker credentials.\n\n{}",
        req.hub_id,
        toml::to_string(&SecretsToml {
            hub_key: SecretEntry {
                secret: b64u_encode(&hub_seed),
            },
            pin_key: pins
                .iter()
                .map(|(id, s, _)| PinKeyEntry {
                    id: id.clone(),
                    secret: b64u_encode(s),
                })
                .collect(),
            reader_key: reader_keys,
        })
        .map_err(|e| invalid(e.to_string()))?
    );

    // Folders first: the config's may be world-readable, the secrets' only
    // when it already is. Folders made here go again if provision fails.
    let mut staged = Staged::default();
    staged.make_dir(parent(&config), CONFIG_DIR_MODE, None)?;
    staged.make_dir(parent(&secrets), PRIVATE_DIR_MODE, None)?;

    // Stage both files beside their final names, then run check-config's own
    // loader on the staged pair: a config it would refuse (a door name, an
    // index, an mqtts URL without its `ca_file`, ...) is reported and nothing
    // is left behind.
    let secrets_tmp = staged.stage(
        &secrets,
        secrets_text.as_bytes(),
        SECRETS_MODE,
        target.owner,
    )?;
    let check_tmp = staged.stage(
        &config,
        render_config(&secrets_tmp)?.as_bytes(),
        CONFIG_MODE,
        None,
    )?;
    // The staged hub.toml is never written: a problem in it is said as
    // the request's field (the bundle's, and its flag), not as a line of
    // that file.
    let staged_text = render_config(&secrets_tmp)?;
    // Every rule, except that the keyed serials have no key yet: pairing
    // writes each one (serial.md, "Pairing").
    crate::config::load_unkeyed(&check_tmp, &crate::config::Unkeyed::All).map_err(|errors| {
        let said: Vec<String> = errors
            .errors
            .iter()
            .map(|e| {
                let field = (e.file == check_tmp)
                    .then(|| {
                        e.line
                            .and_then(|l| field_at(&staged_text, l, req.doors.len()))
                    })
                    .flatten();
                match field {
                    Some(field) => format!("{field}: {}", e.message),
                    None => e
                        .to_string()
                        .replace(&*check_tmp.to_string_lossy(), &config.to_string_lossy())
                        .replace(&*secrets_tmp.to_string_lossy(), &secrets.to_string_lossy()),
                }
            })
            .collect();
        ProvisionError::Check(said.join("\n"))
    })?;
    let config_tmp = staged.stage(
        &config,
        render_config(&secrets)?.as_bytes(),
        CONFIG_MODE,
        None,
    )?;

    staged.make_dir(&data_dir, PRIVATE_DIR_MODE, target.owner)?;
    // Secrets first: a config never names a secrets file that is not there.
    commit(&secrets_tmp, &secrets, target.force)?;
    commit(&config_tmp, &config, target.force)?;
    staged.committed = true;
    drop(staged);

    Ok(Provisioned {
        site_id: req.site_id,
        hub_id: req.hub_id,
        hub_public_key,
        hub_key_generated: req.hub_key.is_none(),
        config,
        secrets,
        data_dir,
        pin_key_ids: pins.iter().map(|(id, _, _)| id.clone()).collect(),
        pin_keys_generated: pins
            .iter()
            .filter(|(_, _, g)| *g)
            .map(|(id, _, _)| id.clone())
            .collect(),
        reader_keys_generated,
        boards_to_pair: req
            .serials
            .iter()
            .filter(|s| !s.insecure_plaintext)
            .map(|s| s.name.clone())
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::cli::parse_pin_key_arg;
    use super::*;
    use lockhub_proto::bundle::{DEFAULT_SERIAL_BAUD, DEFAULT_UNLOCK_MS};

    const KEY: &str = "vpDAfBqmiMog0GAAR6GMchsmx2iCa19aGlMs764g2M0";

    fn request() -> Request {
        Request {
            site_id: "6F1C1C0E-8A51-4D39-9D2E-6A3C5A7D9E10".into(),
            hub_id: "hub-1".into(),
            mqtt: MqttSpec {
                url: "mqtt://127.0.0.1:1883".into(),
                ..Default::default()
            },
            trust: vec![
                "cloud-1=vpDAfBqmiMog0GAAR6GMchsmx2iCa19aGlMs764g2M0,2027-06-01T00:00:00Z"
                    .parse()
                    .unwrap(),
            ],
            serials: vec![],
            doors: vec![],
            pin_keys: vec![],
            hub_key: None,
            osdp: vec![],
            readers: vec![],
            reader_doors: vec![],
        }
    }

    #[test]
    fn trust_syntax_parses() {
        let t: TrustSpec = format!("c={KEY}").parse().unwrap();
        assert_eq!((t.id.as_str(), t.not_after), ("c", None));
        assert!("no-equals".parse::<TrustSpec>().is_err());
    }

    #[test]
    fn bad_values_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target {
            config: dir.path().join("etc/hub.toml"),
            secrets: dir.path().join("etc/secrets.toml"),
            data_dir: dir.path().join("data"),
            force: false,
            owner: None,
        };
        let cases: &[fn(&mut Request)] = &[
            |r| r.site_id = "nope".into(),
            |r| r.hub_id = "has space".into(),
            |r| r.mqtt.url = "http://x".into(),
            |r| r.trust[0].public_key = "AAAA".into(),
            |r| r.trust[0].not_after = Some("tomorrow".into()),
            |r| r.trust.clear(),
            |r| r.hub_key = Some("short".into()),
            |r| {
                r.doors.push(DoorSpec {
                    name: "101".into(),
                    serial: "nowhere".into(),
                    index: 0,
                    unlock_ms: 1,
                })
            },
            |r| {
                r.serials.push(SerialSpec {
                    name: "board-a".into(),
                    port: "/dev/ttyAMA0".into(),
                    baud: DEFAULT_SERIAL_BAUD,
                    insecure_plaintext: true,
                });
                r.doors.push(DoorSpec {
                    name: "101".into(),
                    serial: "board-a".into(),
                    index: crate::config::MAX_DOOR_INDEX + 1,
                    unlock_ms: 1,
                })
            },
        ];
        for (i, f) in cases.iter().enumerate() {
            let mut r = request();
            f(&mut r);
            let e = provision(r, &target)
                .err()
                .unwrap_or_else(|| panic!("case {i}"));
            assert!(e.is_input_problem(), "case {i}: {e}");
        }
        assert!(!dir.path().join("etc").exists(), "nothing written");
    }

    /// One name rule: whatever check-config accepts as a door, serial,
    /// signer or PIN key name, provision writes; whatever it refuses,
    /// provision refuses, before anything is left on disk.
    #[test]
    fn provision_accepts_every_name_check_config_accepts_and_no_other() {
        let names = [
            "101",
            "Room 101",
            "Tür 3 (Hof)",
            "a\"quote\" and \\ back # not a comment",
            "dot.dash-under_score",
            &"é".repeat(64),
            "",
            " leading",
            "trailing ",
            "tab\there",
            "new\nline",
            &"a".repeat(65),
        ];
        for name in names {
            let dir = tempfile::tempdir().unwrap();
            let target = Target {
                config: dir.path().join("etc/hub.toml"),
                secrets: dir.path().join("etc/secrets.toml"),
                data_dir: dir.path().join("data"),
                force: false,
                owner: None,
            };
            let mut r = request();
            r.trust[0].id = name.into();
            r.serials.push(SerialSpec {
                name: name.into(),
                port: "/dev/ttyAMA0".into(),
                baud: DEFAULT_SERIAL_BAUD,
                insecure_plaintext: true,
            });
            r.doors.push(DoorSpec {
                name: name.into(),
                serial: name.into(),
                index: crate::config::MAX_DOOR_INDEX,
                unlock_ms: DEFAULT_UNLOCK_MS,
            });
            r.pin_keys.push((name.into(), PinKeySource::Generate));
            let got = provision(r, &target);
            if lockhub_proto::event::is_name(name) {
                let done = got.unwrap_or_else(|e| panic!("{name:?}: {e}"));
                let c = crate::config::load(&done.config).expect("check-config accepts it");
                assert_eq!(c.doors[0].name, name);
                assert_eq!(c.serials[0].name, name);
                assert_eq!(c.trust[0].id, name);
                assert_eq!(c.secrets.pin_keys[0].id, name);
            } else {
                let e = got.err().unwrap_or_else(|| panic!("{name:?} accepted"));
                assert!(e.is_input_problem(), "{name:?}: {e}");
                assert!(!dir.path().join("etc").exists(), "{name:?}: left files");
            }
        }
    }

    #[test]
    fn inline_pin_secrets_are_refused() {
        assert!(parse_pin_key_arg(&format!("k1={KEY}")).is_err());
        assert!(matches!(
            parse_pin_key_arg("k2").unwrap().1,
            PinKeySource::Generate
        ));
    }

    #[test]
    fn bundle_rejects_unknown_fields_and_versions() {
        let ok = format!(
            r#"{{"v":1,"site_id":"6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10","hub_id":"h",
                "mqtt":{{"url":"mqtt://b"}},"trust":[{{"id":"c","public_key":"{KEY}"}}]}}"#
        );
        assert!(Bundle::parse(&ok).is_ok());
        assert!(Bundle::parse(&ok.replace("\"v\":1", "\"v\":2")).is_err());
        assert!(Bundle::parse(&ok.replace("\"hub_id\"", "\"hubid\"")).is_err());
    }

    #[test]
    fn a_bundle_error_names_the_place_but_never_a_value_it_holds() {
        let secret = "vpDAfBqmiMog0GAAR6GMchsmx2iCa19aGlMs\\\"764g2M0";
        let text = format!(
            r#"{{"v":1,"site_id":"6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10","hub_id":"h",
                "mqtt":{{"url":"mqtt://b"}},"trust":[{{"id":"c","public_key":"{KEY}"}}],
                "pin_keys":["k1={secret}"]}}"#
        );
        let err = Bundle::parse(&text).unwrap_err();
        assert!(!err.contains("vpDAf") && !err.contains("764g2M0"), "{err}");
        assert!(err.contains("invalid type: string \"…\""), "{err}");
        assert!(err.ends_with("(line 3, column 78)"), "{err}");
    }
}
