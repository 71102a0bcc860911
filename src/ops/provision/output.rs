//! The files as written: `hub.toml` and `secrets.toml` as serde shapes, so
//! what provisioning writes is exactly what the config parser reads.

use super::*;

#[derive(Serialize)]
pub(super) struct HubToml<'a> {
    pub(super) hub: HubSection<'a>,
    pub(super) mqtt: &'a MqttSpec,
    pub(super) trust: TrustSection<'a>,
    pub(super) secrets: SecretsSection<'a>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub(super) serial: &'a [SerialSpec],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub(super) osdp: &'a [OsdpSpec],
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub(super) reader: &'a [ReaderSpec],
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) door: Vec<DoorEntry<'a>>,
}

#[derive(Serialize)]
pub(super) struct HubSection<'a> {
    pub(super) site_id: String,
    pub(super) hub_id: &'a str,
    pub(super) data_dir: &'a Path,
}

#[derive(Serialize)]
pub(super) struct TrustSection<'a> {
    pub(super) signer: &'a [TrustSpec],
}

#[derive(Serialize)]
pub(super) struct SecretsSection<'a> {
    pub(super) file: &'a Path,
}

#[derive(Serialize)]
pub(super) struct SecretsToml {
    pub(super) hub_key: SecretEntry,
    pub(super) pin_key: Vec<PinKeyEntry>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) reader_key: Vec<ReaderKeyEntry>,
}

#[derive(Serialize)]
pub(super) struct ReaderKeyEntry {
    pub(super) reader: String,
    pub(super) scbk: String,
}

#[derive(Serialize)]
pub(super) struct SecretEntry {
    pub(super) secret: String,
}

#[derive(Serialize)]
pub(super) struct PinKeyEntry {
    pub(super) id: String,
    pub(super) secret: String,
}
