//! The files a hub reads: a valid hub config built from the spec's MQTT
//! vectors, written into a temporary folder with the secrets file at mode
//! 0600; and the writers every fixture uses for hub.toml and secrets.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The shared vectors folder (`../shared/spec/vectors/mqtt` from the project root).
pub const VECTORS_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/spec/vectors/mqtt"
);

fn read_vector(name: &str) -> String {
    std::fs::read_to_string(format!("{VECTORS_DIR}/{name}"))
        .unwrap_or_else(|e| panic!("cannot read the shared vector {name}: {e}"))
}

/// `spec/vectors/mqtt/trust.toml`, read from the shared folder.
pub static TRUST_TOML: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| read_vector("trust.toml"));

/// `spec/vectors/mqtt/secrets.toml`, read from the shared folder.
pub static SECRETS_TOML: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| read_vector("secrets.toml"));

/// The vectors' trust ring (`trust.toml`), as the config loader would build it.
pub fn vectors_trust_ring() -> Vec<lockhub::config::Signer> {
    let doc: toml::Table = toml::from_str(&TRUST_TOML).expect("trust.toml parses");
    doc["trust"]["signer"]
        .as_array()
        .expect("[[trust.signer]]")
        .iter()
        .map(|s| lockhub::config::Signer {
            id: s["id"].as_str().unwrap().to_owned(),
            public_key: lockhub::crypto::parse_public_key(s["public_key"].as_str().unwrap())
                .unwrap(),
            not_after: s
                .get("not_after")
                .map(|t| lockhub::time::Timestamp::parse_rfc3339(t.as_str().unwrap()).unwrap()),
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
    format!(
        "[hub]
site_id = \"{SITE_ID}\"
hub_id = \"{HUB_ID}\"
data_dir = \"data\"

[mqtt]
url = \"mqtt://127.0.0.1:1883\"

{trust}
[secrets]
file = \"secrets.toml\"

[[serial]]
name = \"board-a\"
port = \"/dev/ttyAMA0\"
baud = 115200

[[door]]
name = \"101\"
serial = \"board-a\"
index = 0
unlock_ms = 5000
",
        trust = &*TRUST_TOML
    )
}

/// A temporary folder holding `hub.toml` and `secrets.toml` (mode 0600).
pub struct Fixture {
    pub dir: tempfile::TempDir,
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
