//! What a bus task is given: its readers, their keys and doors, and the
//! OSDP settings of the whole hub.

use super::*;

/// One reader as the bus task needs it.
#[derive(Clone)]
pub struct ReaderSettings {
    pub name: String,
    pub address: u8,
    pub security: Security,
    /// Doors whose strike (and contact) are on the reader.
    pub doors: Vec<ReaderDoorConfig>,
    /// A door whose PIN the reader takes and whose strike and contact are a
    /// lock board's (osdp.md, Opening the door: recommended).
    pub board_door: Option<BoardDoorSettings>,
}

/// A door on a board that takes its PIN from a reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoardDoorSettings {
    pub name: String,
    pub unlock_ms: u16,
}

impl std::fmt::Debug for ReaderSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReaderSettings")
            .field("name", &self.name)
            .field("address", &self.address)
            .field("security", &self.security)
            .finish_non_exhaustive()
    }
}

/// One `[[osdp]]` bus and its readers.
#[derive(Debug, Clone)]
pub struct BusSettings {
    pub name: String,
    pub path: PathBuf,
    pub baud: u32,
    pub readers: Vec<ReaderSettings>,
}

/// Everything the OSDP driver needs from the config.
#[derive(Debug, Clone)]
pub struct OsdpSettings {
    pub buses: Vec<BusSettings>,
    pub policy: Policy,
    pub pin_keys: Arc<[PinKey]>,
    /// `[hub] timezone`: key schedules are read in it.
    pub zone: jiff::tz::TimeZone,
    pub timing: Timing,
    /// Reopen delays: 100 ms doubling to 5 s, as for serial ports.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl OsdpSettings {
    pub fn from_config(config: &Config) -> Self {
        let buses = config
            .osdp
            .iter()
            .map(|b| BusSettings {
                name: b.name.clone(),
                path: b.port.clone(),
                baud: b.baud,
                readers: config
                    .readers
                    .iter()
                    .filter(|r| r.bus == b.name)
                    .map(|r| ReaderSettings {
                        name: r.name.clone(),
                        address: r.address,
                        // A reader with a key always uses it: never plain
                        // text, never SCBK-D (osdp.md).
                        security: match config.reader_key(&r.name) {
                            Some(k) => Security::Secure(k.scbk),
                            None => Security::Plaintext,
                        },
                        doors: config
                            .reader_doors
                            .iter()
                            .filter(|d| d.reader == r.name)
                            .cloned()
                            .collect(),
                        board_door: config
                            .doors
                            .iter()
                            .find(|d| d.reader.as_ref() == Some(&r.name))
                            .map(|d| BoardDoorSettings {
                                name: d.name.clone(),
                                unlock_ms: d.unlock_ms,
                            }),
                    })
                    .collect(),
            })
            .collect();
        OsdpSettings {
            buses,
            policy: config.policy,
            pin_keys: config.secrets.pin_keys.clone().into(),
            zone: config.hub.timezone.clone(),
            timing: Timing::CONTRACT,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
        }
    }
}
