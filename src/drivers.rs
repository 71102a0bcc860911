//! What the two door drivers ([`crate::serial`] for lock boards,
//! [`crate::osdp`] for readers) share below their protocols: the time
//! source their audit rows are stamped with, and opening the serial device
//! each one's wire runs on.
//!
//! Why a module of its own: the drivers sit side by side in one layer and
//! never use each other (ARCHITECTURE.md, Layers), so a piece both need
//! lives here, above them. Their other shared parts have homes of their
//! own: which keypad entry is decided when ([`crate::entry`]), the records
//! nobody waits for ([`crate::recorder`]), the door sensor and the flood
//! limit ([`crate::watch`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_serial::{SerialPortBuilderExt, SerialStream};

use crate::time::Timestamp;

/// The effective time for audit rows and decisions (mqtt.md 'Time'): the
/// daemon passes its clock here, tests a plain function.
pub type TimeSource = Arc<dyn Fn() -> Timestamp + Send + Sync>;

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
