//! What the two door drivers ([`crate::drivers::serial`] for lock boards,
//! [`crate::drivers::osdp`] for readers) share below their protocols: the time
//! source their audit rows are stamped with, opening the serial device
//! each one's wire runs on, the handle that stops a running driver, and the
//! queue through which a reader's grant drives a board's relay.
//!
//! Why a module of its own: the drivers sit side by side in one layer and
//! never use each other (ARCHITECTURE.md, Layers), so a piece both need
//! lives here, above them. Their other shared parts have homes of their
//! own: which keypad entry is decided when ([`crate::door::entry`]), the records
//! nobody waits for ([`crate::door::recorder`]), the door sensor and the flood
//! limit ([`crate::door::sensor`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_serial::{SerialPortBuilderExt, SerialStream};

use lockhub_proto::time::Timestamp;

pub mod osdp;
internal! {
    mod serial;
}

/// A grant committed elsewhere for a door on a board: its PIN was typed on
/// an OSDP reader (the door's `reader` plus `serial` and `index`, osdp.md
/// 'Opening the door'). The port drives the relay exactly as for its own
/// keypad's grant, and records `door.unlocked` or `door.unlock_unconfirmed`.
#[derive(Debug)]
pub struct BoardUnlock {
    pub door: u8,
    pub key_id: String,
    /// When the entry was submitted: the unlock is due by the same bound.
    pub received: std::time::Instant,
}

/// Where a door's board grants go: door name -> (its port's queue, index).
pub type BoardUnlocks = std::collections::HashMap<String, (mpsc::Sender<BoardUnlock>, u8)>;

/// Random bytes from the operating system, for the sealed board link's
/// nonces and key pairs (`firmware_bridge::rng`): the hub's end, and the
/// simulated board, which runs on a PC and so has the same source.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsRandom;

impl firmware_bridge::rng::RandomSource for OsRandom {
    fn fill_bytes(&mut self, out: &mut [u8]) {
        rand::fill(out);
    }
}

/// The effective time for audit rows and decisions (mqtt.md 'Time'): the
/// daemon passes its clock here, tests a plain function.
pub type TimeSource = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// How long [`DriverHandle::shutdown`] waits for each task.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(3);

/// A running driver: its line tasks (one per serial port or OSDP bus) and
/// their recorders. Drop it or call [`DriverHandle::shutdown`].
pub struct DriverHandle {
    stop: watch::Sender<bool>,
    lines: Vec<JoinHandle<()>>,
    recorders: Vec<JoinHandle<()>>,
}

impl DriverHandle {
    /// `stop` is what every line task watches.
    pub(crate) fn new(
        stop: watch::Sender<bool>,
        lines: Vec<JoinHandle<()>>,
        recorders: Vec<JoinHandle<()>>,
    ) -> Self {
        DriverHandle {
            stop,
            lines,
            recorders,
        }
    }

    /// Stops every port or bus (each closes its device) and waits for them,
    /// bounded; then for their recorders, which end once a line and its
    /// decisions are done and what they recorded is written.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.lines.into_iter().chain(self.recorders) {
            crate::runtime::task::join_or_abort(task, SHUTDOWN_TIMEOUT).await;
        }
    }
}

/// A serial device that cannot be opened (absent, busy, not a tty).
#[derive(Debug, thiserror::Error)]
#[error("cannot open {path}: {source}")]
pub struct OpenError {
    pub path: PathBuf,
    pub source: tokio_serial::Error,
}

/// Opens a port the way production opens `/dev/ttyAMA0`: 8N1 at `baud`,
/// exclusive, no flow control. Both wires (serial.md, osdp.md) use it.
pub fn open(path: &Path, baud: u32) -> Result<SerialStream, OpenError> {
    tokio_serial::new(path.to_string_lossy(), baud)
        .data_bits(tokio_serial::DataBits::Eight)
        .parity(tokio_serial::Parity::None)
        .stop_bits(tokio_serial::StopBits::One)
        .flow_control(tokio_serial::FlowControl::None)
        .open_native_async()
        .map_err(|source| OpenError {
            path: path.to_owned(),
            source,
        })
}
