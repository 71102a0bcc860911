//! The files a hub reads: a valid hub config built from the spec's MQTT
//! vectors, written into a temporary folder with the secrets file at mode
//! 0600; and the writers every fixture uses for hub.toml and secrets.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The project's MQTT vectors (`spec/vectors/mqtt` from the project root).
pub const VECTORS_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../spec/vectors/mqtt");

fn read_vector(name: &str) -> String {
    std::fs::read_to_string(format!("{VECTORS_DIR}/{name}"))
        .unwrap_or_else(|e| panic!("cannot read the vector {name}: {e}"))
}

/// `spec/vectors/mqtt/trust.toml`, read from the project's vectors.
pub static TRUST_TOML: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| read_vector("trust.toml"));

/// `spec/vectors/mqtt/secrets.toml`, read from the project's vectors, with
/// the link key of the fixtures' board `board-a` ([`board_key_for`]) after
/// it: every `[[serial]]` has a `[[board_key]]` (serial.md, "Keys").
pub static SECRETS_TOML: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    read_vector("secrets.toml") + &board_key_toml("board-a", &board_key_for("board-a"))
});

/// `spec/vectors/mqtt/secrets.toml` as it is (no `[[board_key]]`).
pub fn read_secrets_vector() -> String {
    read_vector("secrets.toml")
}

/// The vectors' secrets.toml with `extra` (more tables, or lines of its
/// last table) right after the vector's own text, then `board-a`'s link
/// key: [`SECRETS_TOML`] with `extra` where appending it would land.
pub fn secrets_with(extra: &str) -> String {
    read_vector("secrets.toml") + extra + &board_key_toml("board-a", &board_key_for("board-a"))
}

/// A test board's link key for serial `name` (never a real board's):
/// distinct per name, the same in every run, so the hub's secrets and the
/// simulated board both take it from here.
pub fn board_key_for(name: &str) -> [u8; 32] {
    let seed = format!("lockhub test link key of {name}/");
    let mut key = [0u8; 32];
    for (k, b) in key.iter_mut().zip(seed.bytes().cycle()) {
        *k = b;
    }
    key
}

/// One `[[board_key]]` table for secrets.toml.
pub fn board_key_toml(serial: &str, key: &[u8; 32]) -> String {
    format!(
        "\n[[board_key]]\nserial = \"{serial}\"\nkey = \"{}\"\n",
        lockhub_proto::crypto::b64u_encode(key)
    )
}

/// The vectors' trust ring (`trust.toml`), as the config loader would build it.
pub fn vectors_trust_ring() -> Vec<lockhub_proto::verify::Signer> {
    let doc: toml::Table = toml::from_str(&TRUST_TOML).expect("trust.toml parses");
    doc["trust"]["signer"]
        .as_array()
        .expect("[[trust.signer]]")
        .iter()
        .map(|s| lockhub_proto::verify::Signer {
            id: s["id"].as_str().unwrap().to_owned(),
            public_key: lockhub_proto::crypto::parse_public_key(s["public_key"].as_str().unwrap())
                .unwrap(),
            not_after: s.get("not_after").map(|t| {
                lockhub_proto::time::Timestamp::parse_rfc3339(t.as_str().unwrap()).unwrap()
            }),
        })
        .collect()
}

/// The vectors' hub public key (spec/vectors/mqtt/README.md).
pub const HUB_PUBLIC_KEY: &str = "hnxZGkSHul8kFkNda3meL_Y5hD-IGBBTJ6T2hvrbnJI";
pub const SITE_ID: &str = "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10";
pub const HUB_ID: &str = "hub-lobby-1";

/// A valid hub.toml for the vectors' hub (site, hub, door `101`, default
/// policy). Line numbers matter: tests point at them.
///
/// ```text
///  1 [hub]                 13 [secrets]
///  2 site_id = ...         14 file = "secrets.toml"
///  3 hub_id = ...          15
///  4 data_dir = "data"     16 [[serial]]
///  5                       17 name = "board-a"
///  6 [mqtt]                18 port = "/dev/ttyAMA0"
///  7 url = ...             19 baud = 115200
///  8                       20
///  9 [[trust.signer]]      21 [[door]]
/// 10 id = ...              22 name = "101"
/// 11 public_key = ...      23 serial = "board-a"
/// 12                       24 index = 0
///                          25 unlock_ms = 5000
/// ```
pub fn hub_toml() -> String {
    HubToml::vectors().render()
}

/// A hub.toml: what differs between the fixtures' hubs, rendered in one
/// layout (the one [`hub_toml`] documents line by line).
#[derive(Debug, Clone)]
pub struct HubToml {
    pub site_id: String,
    pub hub_id: String,
    /// Relative to the config's folder, or absolute.
    pub data_dir: String,
    pub mqtt_url: String,
    /// More `[mqtt]` lines (TLS files, username, password_file).
    pub mqtt_extra: String,
    /// The `[[trust.signer]]` tables (see [`trust_signer`]).
    pub trust: String,
    /// `[[serial]]` ports: (name, device path).
    pub serial: Vec<(String, String)>,
    /// Every `[[serial]]` says `insecure_plaintext = true` (a plain board,
    /// no `[[board_key]]`); the line goes after `baud`, so the layout
    /// [`hub_toml`] documents holds without it.
    pub insecure_serials: bool,
    /// `[[door]]`s on a serial port: (name, serial, index, unlock_ms).
    pub doors: Vec<(String, String, usize, u32)>,
    /// `[policy]` lines (none: the section is left out, the defaults hold).
    pub policy: String,
    /// Whole sections appended at the end (`[[osdp]]`, `[[reader]]`, doors).
    pub extra: String,
}

impl HubToml {
    /// The vectors' hub: site, hub, door `101` on `board-a`, the vectors'
    /// trust ring, `data/` beside the config.
    pub fn vectors() -> HubToml {
        HubToml {
            site_id: SITE_ID.into(),
            hub_id: HUB_ID.into(),
            data_dir: "data".into(),
            mqtt_url: "mqtt://127.0.0.1:1883".into(),
            mqtt_extra: String::new(),
            trust: TRUST_TOML.clone(),
            serial: vec![("board-a".into(), "/dev/ttyAMA0".into())],
            insecure_serials: false,
            doors: vec![("101".into(), "board-a".into(), 0, 5000)],
            policy: String::new(),
            extra: String::new(),
        }
    }

    pub fn render(&self) -> String {
        let mut s = format!(
            "[hub]\nsite_id = \"{}\"\nhub_id = \"{}\"\ndata_dir = \"{}\"\n\n\
             [mqtt]\nurl = \"{}\"\n{}\n{}\n[secrets]\nfile = \"secrets.toml\"\n",
            self.site_id, self.hub_id, self.data_dir, self.mqtt_url, self.mqtt_extra, self.trust
        );
        for (name, port) in &self.serial {
            s.push_str(&format!(
                "\n[[serial]]\nname = \"{name}\"\nport = \"{port}\"\nbaud = 115200\n"
            ));
            if self.insecure_serials {
                s.push_str("insecure_plaintext = true\n");
            }
        }
        for (name, serial, index, unlock_ms) in &self.doors {
            s.push_str(&format!(
                "\n[[door]]\nname = \"{name}\"\nserial = \"{serial}\"\nindex = {index}\nunlock_ms = {unlock_ms}\n"
            ));
        }
        if !self.policy.is_empty() {
            s.push_str(&format!("\n[policy]\n{}\n", self.policy));
        }
        if !self.extra.is_empty() {
            s.push('\n');
            s.push_str(&self.extra);
        }
        s
    }

    /// Renders into `dir/hub.toml`; returns its path.
    pub fn write(&self, dir: &Path) -> PathBuf {
        let p = dir.join("hub.toml");
        std::fs::write(&p, self.render()).expect("write hub.toml");
        p
    }
}

/// One `[[trust.signer]]` table for [`HubToml::trust`].
pub fn trust_signer(id: &str, public_key: &ed25519_dalek::VerifyingKey) -> String {
    format!(
        "[[trust.signer]]\nid = \"{id}\"\npublic_key = \"{}\"\n",
        lockhub_proto::crypto::b64u_encode(public_key.as_bytes())
    )
}

/// A secrets.toml: the hub key's seed and the PIN keys (id, secret), then
/// `extra` (`[[reader_key]]` tables).
pub fn secrets_toml(hub_key: &[u8; 32], pin_keys: &[(&str, &[u8; 32])], extra: &str) -> String {
    let b64 = lockhub_proto::crypto::b64u_encode;
    let mut s = format!("[hub_key]\nsecret = \"{}\"\n", b64(hub_key));
    for (id, secret) in pin_keys {
        s.push_str(&format!(
            "\n[[pin_key]]\nid = \"{id}\"\nsecret = \"{}\"\n",
            b64(*secret)
        ));
    }
    s.push_str(extra);
    s
}

/// A temporary folder holding `hub.toml` and `secrets.toml` (mode 0600).
pub struct Fixture {
    pub dir: tempfile::TempDir,
}

impl Default for Fixture {
    fn default() -> Self {
        Fixture::new()
    }
}

impl Fixture {
    /// The valid config and the vectors' secrets.
    pub fn new() -> Self {
        let fx = Fixture {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        fx.write_hub(&hub_toml());
        fx.write_secrets(&SECRETS_TOML);
        fx
    }

    /// The valid config with each `(from, to)` replaced once (each `from`
    /// must occur).
    pub fn with_hub_edits(edits: &[(&str, &str)]) -> Self {
        let fx = Fixture::new();
        fx.write_hub(&edit(&hub_toml(), edits));
        fx
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn hub(&self) -> PathBuf {
        self.path("hub.toml")
    }

    pub fn secrets(&self) -> PathBuf {
        self.path("secrets.toml")
    }

    /// Writes a file (mode 0644) and returns its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let p = self.path(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&p, contents).expect("write");
        set_mode(&p, 0o644);
        p
    }

    /// Writes a file with mode 0600.
    pub fn write_private(&self, name: &str, contents: &str) -> PathBuf {
        let p = self.path(name);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        write_private(&p, contents).expect("write");
        p
    }

    pub fn write_hub(&self, contents: &str) -> PathBuf {
        self.write("hub.toml", contents)
    }

    pub fn write_secrets(&self, contents: &str) -> PathBuf {
        self.write_private("secrets.toml", contents)
    }
}

/// Writes a secret file the way an installer does: created 0600 before
/// anything is written, so no secret is ever readable by others.
pub fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(contents.as_bytes())?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

pub fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Replaces each `from` once; panics if one is missing (a broken test).
pub fn edit(text: &str, edits: &[(&str, &str)]) -> String {
    let mut s = text.to_owned();
    for (from, to) in edits {
        assert!(s.contains(from), "fixture has no {from:?}");
        s = s.replacen(from, to, 1);
    }
    s
}
