//! The hub's serial driver: one task per configured `[[serial]]` port,
//! speaking `serial.md` with the lock board on it.
//!
//! - [`port`]: open and reopen the port with backoff; the read/write loop
//!   around a fresh [`firmware_bridge::HubLink`] per opening (and per
//!   sealed session: `port::sealing` runs the hub's end of the sealed link).
//! - [`doors`]: a decided keypad entry -> `Unlock`/`Deny`. Which entry is
//!   decided when, and deciding it, are [`crate::door::entry`]'s, shared with the
//!   OSDP driver. The door sensor (forced, held open, kept durably) and
//!   the keypad flood limit are [`crate::door::sensor`]'s, shared with other door
//!   drivers; the port applies them to its board's door indexes.
//! - `record`: audit rows and alerts nobody waits for, written in order by
//!   one task per port so the loop never waits on the disk.
//!
//! The wire types, framing and link rules are `firmware_bridge`'s; nothing
//! here redefines them. Decisions and lockouts are the store's
//! ([`crate::store::door`]); this module makes sure each distinct Keypad is
//! decided exactly once, that the decision is committed before the board
//! hears it, and that one port, door or slow write never holds up another.
//!
//! Logs carry the serial name, door names and key ids; never a PIN, a PIN
//! tag or a secret.

pub mod doors;
pub mod port;
mod record;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use firmware_bridge::LinkConfig;
use tokio::sync::{Notify, mpsc, watch};

use crate::drivers::BoardUnlocks;

use crate::config::{Config, PinKey, Policy};
use crate::door::recorder::Recorder;
use crate::store::Store;
use lockhub_proto::time::Timestamp;
use port::DoorTarget;
use record::Record;

pub use crate::drivers::TimeSource;

/// The serial boundary's errors: why a port session ended.
#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    #[error("read failed: {0}")]
    Read(std::io::Error),
    #[error("the port reads end-of-file: the device is gone")]
    Eof,
    #[error("write failed: {0}")]
    Write(std::io::Error),
    #[error("write timed out")]
    WriteTimeout,
}

/// One `[[door]]` on a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoorSettings {
    pub name: String,
    pub index: u8,
    pub unlock_ms: u16,
}

/// How a port talks to its board (docs/protocol/serial.md, "Sealed link").
#[derive(Clone, PartialEq, Eq)]
pub enum LinkMode {
    /// Sealed sessions under the board's link key (`[[board_key]]`).
    Sealed([u8; 32]),
    /// `insecure_plaintext = true`: the plain messages, and `link_insecure`
    /// raised while the port is in use.
    Plain,
}

impl std::fmt::Debug for LinkMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkMode::Sealed(_) => f.write_str("Sealed(<redacted>)"),
            LinkMode::Plain => f.write_str("Plain"),
        }
    }
}

/// One `[[serial]]` port and its doors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSettings {
    pub name: String,
    pub path: PathBuf,
    pub baud: u32,
    pub doors: Vec<DoorSettings>,
    pub link_mode: LinkMode,
}

/// Everything the serial driver needs from the config.
#[derive(Debug, Clone)]
pub struct SerialSettings {
    pub ports: Vec<PortSettings>,
    pub policy: Policy,
    pub pin_keys: Arc<[PinKey]>,
    /// `[hub] timezone`: key schedules are read in it.
    pub zone: jiff::tz::TimeZone,
    /// The contract's timings ([`LinkConfig::hub`]); tests may shorten them.
    pub link: LinkConfig,
    /// Reopen delays: 100 ms doubling to 5 s.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
}

impl SerialSettings {
    pub fn from_config(config: &Config) -> Self {
        let ports = config
            .serials
            .iter()
            .map(|s| PortSettings {
                name: s.name.clone(),
                path: s.port.clone(),
                baud: s.baud,
                doors: config
                    .doors
                    .iter()
                    .filter(|d| d.serial == s.name)
                    .map(|d| DoorSettings {
                        name: d.name.clone(),
                        index: d.index,
                        unlock_ms: d.unlock_ms,
                    })
                    .collect(),
                // A loaded config has a key for every serial that is not
                // `insecure_plaintext` (config::doors::check_board_keys).
                link_mode: match config.board_key(&s.name) {
                    Some(k) => LinkMode::Sealed(k.key),
                    None => LinkMode::Plain,
                },
            })
            .collect();
        SerialSettings {
            ports,
            policy: config.policy,
            pin_keys: config.secrets.pin_keys.clone().into(),
            zone: config.hub.timezone.clone(),
            link: LinkConfig::hub(),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
        }
    }
}

/// What every task of one port shares.
pub(crate) struct PortShared {
    pub port: PortSettings,
    pub policy: Policy,
    pub pin_keys: Arc<[PinKey]>,
    pub zone: jiff::tz::TimeZone,
    pub link: LinkConfig,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub store: Store,
    now: TimeSource,
    outbox_wake: Option<Arc<Notify>>,
    recorder: Recorder<Record>,
}

impl PortShared {
    pub fn now(&self) -> Timestamp {
        (self.now)()
    }

    pub fn door(&self, index: u8) -> DoorTarget {
        DoorTarget::for_index(&self.port.name, &self.port.doors, index)
    }

    /// Queues a record without waiting (see `record` for what a full queue
    /// drops).
    pub fn record(&self, rec: Record) {
        self.recorder.push(rec);
    }

    pub fn wake_outbox(&self) {
        if let Some(w) = &self.outbox_wake {
            w.notify_one();
        }
    }
}

/// The running serial driver. Drop it or call [`DriverHandle::shutdown`].
pub type SerialHandle = crate::drivers::DriverHandle;

/// Board grants waiting for their port, per port: one door decides at a
/// time, so a few at most.
const BOARD_UNLOCK_QUEUE: usize = 16;

/// Starts one task per port and its recorder. (The `keypad_lockout` alert
/// of a lockout that ended is cleared by [`crate::runtime::maintenance`].)
/// `outbox_wake` is notified after audit rows and alerts commit, so
/// the publisher sends them at once. (The daemon uses
/// [`spawn_with_unlocks`]; this is for test fixtures.)
#[cfg(any(test, feature = "testing"))]
pub fn spawn(
    settings: SerialSettings,
    store: Store,
    now: TimeSource,
    outbox_wake: Option<Arc<Notify>>,
) -> SerialHandle {
    spawn_with_unlocks(settings, store, now, outbox_wake).0
}

/// [`spawn`], and the queues through which another driver's grants drive
/// this driver's relays ([`BoardUnlock`]), for every configured door.
pub fn spawn_with_unlocks(
    settings: SerialSettings,
    store: Store,
    now: TimeSource,
    outbox_wake: Option<Arc<Notify>>,
) -> (SerialHandle, BoardUnlocks) {
    let (stop, stop_rx) = watch::channel(false);
    let mut ports = Vec::new();
    let mut recorders = Vec::new();
    let mut unlocks = BoardUnlocks::new();
    for port in settings.ports {
        let (unlock_tx, unlock_rx) = mpsc::channel(BOARD_UNLOCK_QUEUE);
        for d in &port.doors {
            unlocks.insert(d.name.clone(), (unlock_tx.clone(), d.index));
        }
        let (recorder, queue) = Recorder::new(&port.name);
        recorders.push(tokio::spawn(crate::door::recorder::run(
            store.clone(),
            queue,
            outbox_wake.clone(),
        )));
        let shared = Arc::new(PortShared {
            port,
            policy: settings.policy,
            pin_keys: settings.pin_keys.clone(),
            zone: settings.zone.clone(),
            link: settings.link,
            backoff_initial: settings.backoff_initial,
            backoff_max: settings.backoff_max,
            store: store.clone(),
            now: now.clone(),
            outbox_wake: outbox_wake.clone(),
            recorder,
        });
        ports.push(tokio::spawn(port::run_port(
            shared,
            stop_rx.clone(),
            unlock_rx,
        )));
    }
    (SerialHandle::new(stop, ports, recorders), unlocks)
}
