//! The port's recorder: audit rows and alerts that nobody waits for.
//!
//! Why a queue and a task of its own: the port loop must never wait on the
//! disk (acks, pings and other doors would stall behind an fsync), yet
//! these records must land in the order they happened (an alert raised
//! before it is cleared). One task per port drains a bounded queue in
//! order; when the queue is full the loop drops the record with an error
//! log rather than block (only a store that has stopped answering gets
//! there).

use std::sync::Arc;

use tokio::sync::{Notify, mpsc};

use crate::store::alerts::{self, Condition};
use crate::store::audit::AuditKind;
use crate::store::door::{record_door_event, record_unlock};
use crate::store::links::{self, LinkState};
use crate::store::{Priority, Store};
use crate::time::Timestamp;

/// Records waiting for the store, per port.
pub(crate) const RECORD_QUEUE: usize = 64;

/// Something to write, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Record {
    /// `door.unlocked` (the board acked) or `door.unlock_unconfirmed`.
    Unlock {
        door: String,
        key_id: String,
        confirmed: bool,
        at: Timestamp,
    },
    /// `door.forced`, `door.held_open` or `board.tamper`, with its alert.
    DoorEvent {
        kind: AuditKind,
        door: String,
        at: Timestamp,
    },
    RaiseAlert {
        condition: Condition,
        subject: String,
        at: Timestamp,
    },
    ClearAlert {
        condition: Condition,
        subject: String,
        at: Timestamp,
    },
    /// The port's link state for `lockhub status` (`links` table).
    Link {
        serial: String,
        state: LinkState,
        at: Timestamp,
    },
    /// The board's Hello: who it is; the link is up.
    Hello {
        serial: String,
        board_id: u8,
        fw: (u8, u8),
        at: Timestamp,
    },
    /// A valid frame arrived (sent at most every `FRAME_SEEN_EVERY_S`).
    FrameSeen { serial: String, at: Timestamp },
}

impl Record {
    fn apply(self, conn: &rusqlite::Connection) -> Result<(), crate::store::StoreError> {
        match self {
            Record::Unlock {
                door,
                key_id,
                confirmed,
                at,
            } => record_unlock(conn, &door, &key_id, confirmed, at).map(drop),
            Record::DoorEvent { kind, door, at } => {
                record_door_event(conn, kind, &door, at).map(drop)
            }
            Record::RaiseAlert {
                condition,
                subject,
                at,
            } => alerts::raise(conn, condition, &subject, 1, at).map(drop),
            Record::ClearAlert {
                condition,
                subject,
                at,
            } => alerts::clear(conn, condition, &subject, at).map(drop),
            Record::Link { serial, state, at } => links::set_state(conn, &serial, state, at),
            Record::Hello {
                serial,
                board_id,
                fw,
                at,
            } => links::hello(conn, &serial, board_id, fw.0, fw.1, at),
            Record::FrameSeen { serial, at } => links::frame_seen(conn, &serial, at),
        }
    }

    /// What to call it in a log line (no personal data, no secrets).
    fn what(&self) -> String {
        match self {
            Record::Unlock {
                door, confirmed, ..
            } => format!(
                "{} at door {door}",
                if *confirmed {
                    "door.unlocked"
                } else {
                    "door.unlock_unconfirmed"
                }
            ),
            Record::DoorEvent { kind, door, .. } => format!("{} at {door}", kind.as_str()),
            Record::RaiseAlert {
                condition, subject, ..
            } => format!("raise {} for {subject}", condition.as_str()),
            Record::ClearAlert {
                condition, subject, ..
            } => format!("clear {} for {subject}", condition.as_str()),
            Record::Link { serial, state, .. } => format!("link {serial} {}", state.as_str()),
            Record::Hello { serial, .. } => format!("board hello on {serial}"),
            Record::FrameSeen { serial, .. } => format!("frame seen on {serial}"),
        }
    }
}

/// Writes records in order until every sender is gone.
pub(crate) async fn run(
    store: Store,
    mut rx: mpsc::Receiver<Record>,
    outbox_wake: Option<Arc<Notify>>,
) {
    while let Some(rec) = rx.recv().await {
        let what = rec.what();
        match store.write(Priority::Bulk, move |c| rec.apply(c)).await {
            Ok(()) => {
                if let Some(w) = &outbox_wake {
                    w.notify_one();
                }
            }
            Err(e) => tracing::error!(record = %what, error = %e, "cannot record"),
        }
    }
}
