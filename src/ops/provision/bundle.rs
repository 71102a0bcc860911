//! The hub's side of the provisioning bundle: reading the file, and turning
//! a bundle into a [`Request`]. The bundle's schema and types are
//! `lockhub_proto::bundle`'s, since the cloud writes what this reads.

use super::*;

/// One `[[door]]` as written: on a board or on a reader.
#[derive(Serialize)]
#[serde(untagged)]
pub(super) enum DoorEntry<'a> {
    Board(&'a DoorSpec),
    Reader(&'a ReaderDoorSpec),
}

/// Reads a bundle file; `-` reads standard input.
pub fn read_bundle(path: &Path) -> Result<Bundle, ProvisionError> {
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
    Bundle::parse(&text).map_err(|message| ProvisionError::Bundle {
        path: path.to_owned(),
        message,
    })
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
