//! The provisioning bundle (the JSON format in [`super`]'s docs) and the
//! specs it and the command line give: what to provision, before any
//! check.

use super::*;

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

pub(super) fn default_baud() -> u32 {
    crate::config::DEFAULT_SERIAL_BAUD
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

pub(super) fn default_osdp_baud() -> u32 {
    crate::config::DEFAULT_OSDP_BAUD
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

/// One `[[door]]` as written: on a board or on a reader.
#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum DoorEntry<'a> {
    Board(&'a DoorSpec),
    Reader(&'a ReaderDoorSpec),
}

pub(super) fn default_unlock_ms() -> u16 {
    DEFAULT_UNLOCK_MS
}

/// A PIN key in a bundle. Debug never shows the secret.
#[derive(Clone, PartialEq, Eq, Deserialize)]
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
#[derive(Debug, Clone, Deserialize)]
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
    /// Reads a bundle file; `-` reads standard input.
    pub fn read(path: &Path) -> Result<Bundle, ProvisionError> {
        let text = if path == Path::new("-") {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map(|_| s)
        } else {
            std::fs::read_to_string(path)
        }
        .map_err(|source| ProvisionError::BundleRead {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|message| ProvisionError::Bundle {
            path: path.to_owned(),
            message,
        })
    }

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
}

impl From<Bundle> for Request {
    fn from(b: Bundle) -> Self {
        Request {
            site_id: b.site_id,
            hub_id: b.hub_id,
            mqtt: b.mqtt,
            trust: b.trust,
            serials: b.serials,
            doors: b.doors,
            pin_keys: b
                .pin_keys
                .into_iter()
                .map(|k| (k.id, PinKeySource::Given(k.secret)))
                .collect(),
            hub_key: None,
            osdp: b.osdp,
            readers: b.readers,
            reader_doors: b.reader_doors,
        }
    }
}

/// serde_json's message for `e` without the values it quotes: a string
/// found where something else was expected is echoed whole, and a
/// bundle's strings are PIN-key and reader secrets. Every double-quoted
/// part becomes `"…"`; the position is left to the caller.
pub(super) fn without_values(e: &serde_json::Error) -> String {
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
