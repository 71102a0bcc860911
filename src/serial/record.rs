//! The port's recorder: audit rows and alerts that nobody waits for.
//!
//! Why a queue and a task of its own: the port loop must never wait on the
//! disk (acks, pings and other doors would stall behind an fsync), yet
//! these records must land in the order they happened (an alert raised
//! before it is cleared). One task per port drains a [`RecordQueue`] in
//! order.
//!
//! Why the queue never turns away an audit row or an alert below
//! [`KEEP_MAX`]: each is the only trace of something at a door (an Unlock
//! the board confirmed, a forced door, a flood). Past [`RECORD_QUEUE`]
//! records (the store has stopped answering for a while) only the link
//! bookkeeping for `lockhub status` is dropped, which the next frame or
//! state change writes again. [`KEEP_MAX`] bounds memory if the store never
//! comes back: doors are rate-limited (serial.md's flood limit), so it holds
//! minutes of a busy building's records.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::store::alerts::{Change, Condition};
use crate::store::door::{
    DoorEvent, record_door_event, record_flood, record_sensor, record_storage_failure,
    record_unlock,
};
use crate::store::links::{self, LinkState};
use crate::store::{Priority, Store};
use crate::time::Timestamp;
use crate::watch::{DoorAlarm, DoorState};

/// Records waiting for the store, per port, past which link bookkeeping is
/// dropped.
pub(crate) const RECORD_QUEUE: usize = 64;
/// Records waiting for the store, per port, past which even audit rows and
/// alerts are dropped (logged as errors).
pub(crate) const KEEP_MAX: usize = 4096;

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
    /// A door sensor report that changed the door's durable state, and
    /// what it means (see [`record_sensor`]).
    Sensor {
        door: String,
        state: DoorState,
        alarm: Option<DoorAlarm>,
        at: Timestamp,
    },
    /// `door.flood` with its count, and `keypad_flood`.
    Flood {
        door: String,
        count: u64,
        at: Timestamp,
    },
    /// A keypad entry answered `Deny` undecided because the door's queue
    /// was full (the store is not keeping up): `door.denied`
    /// `storage_failure` and its alert.
    Undecided { door: String, at: Timestamp },
    /// `board.tamper` with its alert.
    DoorEvent {
        kind: DoorEvent,
        door: String,
        at: Timestamp,
    },
    Alert {
        change: Change,
        condition: Condition,
        subject: String,
        at: Timestamp,
    },
    /// The port's link state for `lockhub status` (`links` table), with the
    /// `board_offline` change it brings in the same transaction: the row
    /// and the alert never disagree in the database.
    Link {
        serial: String,
        state: LinkState,
        board_offline: Option<Change>,
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
    /// Bad frames dropped since the daemon started (sent at most every
    /// `COUNTERS_EVERY_S` while they change).
    BadFrames {
        serial: String,
        count: u64,
        at: Timestamp,
    },
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
            Record::Sensor {
                door,
                state,
                alarm,
                at,
            } => record_sensor(conn, &door, &state, alarm, at),
            Record::Flood { door, count, at } => record_flood(conn, &door, count, at).map(drop),
            Record::Undecided { door, at } => record_storage_failure(conn, &door, at).map(drop),
            Record::DoorEvent { kind, door, at } => {
                record_door_event(conn, kind, &door, at).map(drop)
            }
            Record::Alert {
                change,
                condition,
                subject,
                at,
            } => change.write(conn, condition, &subject, at),
            Record::Link {
                serial,
                state,
                board_offline,
                at,
            } => {
                if let Some(change) = board_offline {
                    change.write(conn, Condition::BoardOffline, &serial, at)?;
                }
                links::set_state(conn, &serial, state, at)
            }
            Record::Hello {
                serial,
                board_id,
                fw,
                at,
            } => links::hello(conn, &serial, board_id, fw.0, fw.1, at),
            Record::FrameSeen { serial, at } => links::frame_seen(conn, &serial, at),
            Record::BadFrames { serial, count, at } => {
                links::set_bad_frames(conn, &serial, count, at)
            }
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
            Record::Sensor { door, alarm, .. } => format!("door {door} sensor ({alarm:?})"),
            Record::Flood { door, count, .. } => format!("door.flood x{count} at {door}"),
            Record::Undecided { door, .. } => format!("undecided entry at {door}"),
            Record::DoorEvent { kind, door, .. } => format!("{kind:?} at {door}"),
            Record::Alert {
                change,
                condition,
                subject,
                ..
            } => format!("{} {} for {subject}", change.as_str(), condition.as_str()),
            Record::Link {
                serial,
                state,
                board_offline,
                ..
            } => match board_offline {
                Some(change) => format!(
                    "link {serial} {} ({} board_offline)",
                    state.as_str(),
                    change.as_str()
                ),
                None => format!("link {serial} {}", state.as_str()),
            },
            Record::Hello { serial, .. } => format!("board hello on {serial}"),
            Record::FrameSeen { serial, .. } => format!("frame seen on {serial}"),
            Record::BadFrames { serial, count, .. } => format!("{count} bad frames on {serial}"),
        }
    }

    /// Link bookkeeping that the next frame or state change writes again;
    /// a link row that carries an alert is kept for the alert's sake.
    fn droppable(&self) -> bool {
        matches!(
            self,
            Record::Link {
                board_offline: None,
                ..
            } | Record::Hello { .. }
                | Record::FrameSeen { .. }
                | Record::BadFrames { .. }
        )
    }
}

/// The port's records in order, between the port's tasks (many pushers)
/// and its recorder (one popper). See the module docs for its bounds.
#[derive(Default)]
pub(crate) struct RecordQueue {
    inner: Mutex<Inner>,
    wake: Notify,
}

#[derive(Default)]
struct Inner {
    records: VecDeque<Record>,
    closed: bool,
}

impl RecordQueue {
    /// Queues `rec` without waiting; hands it back if it must be dropped.
    pub(crate) fn push(&self, rec: Record) -> Result<(), Record> {
        {
            let mut q = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let len = q.records.len();
            if len >= KEEP_MAX || (len >= RECORD_QUEUE && rec.droppable()) {
                return Err(rec);
            }
            q.records.push_back(rec);
        }
        self.wake.notify_one();
        Ok(())
    }

    /// Whether [`RecordQueue::close`] was called (the port is stopping).
    fn closed(&self) -> bool {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).closed
    }

    /// No more records will come: the recorder ends once it wrote the rest.
    pub(crate) fn close(&self) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
        self.wake.notify_one();
    }

    async fn pop(&self) -> Option<Record> {
        loop {
            {
                let mut q = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(r) = q.records.pop_front() {
                    return Some(r);
                }
                if q.closed {
                    return None;
                }
            }
            // A push between the unlock and here left a permit: no wake is lost.
            self.wake.notified().await;
        }
    }
}

/// Writes records in order until the queue is closed and empty. A record
/// that is the only trace of something at a door is tried again until it
/// is written ([`Store::write_until_written`]); link bookkeeping, which the
/// next frame or change writes anyway, is tried once.
pub(crate) async fn run(store: Store, queue: Arc<RecordQueue>, outbox_wake: Option<Arc<Notify>>) {
    while let Some(rec) = queue.pop().await {
        let what = rec.what();
        let written = if rec.droppable() {
            match store.write(Priority::Bulk, move |c| rec.apply(c)).await {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(record = %what, error = %e, "cannot record");
                    false
                }
            }
        } else {
            store
                .write_until_written(&what, move |c| rec.clone().apply(c), || queue.closed())
                .await
        };
        if written && let Some(w) = &outbox_wake {
            w.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_seen() -> Record {
        Record::FrameSeen {
            serial: "a".into(),
            at: Timestamp(0),
        }
    }

    fn unlock() -> Record {
        Record::Unlock {
            door: "101".into(),
            key_id: "k".into(),
            confirmed: true,
            at: Timestamp(0),
        }
    }

    /// A queue holding as much droppable link bookkeeping as it takes.
    fn full_of_bookkeeping() -> RecordQueue {
        let q = RecordQueue::default();
        for _ in 0..RECORD_QUEUE {
            q.push(frame_seen()).unwrap();
        }
        q
    }

    #[test]
    fn a_full_queue_drops_link_bookkeeping_but_keeps_audit_rows() {
        let q = full_of_bookkeeping();
        assert!(q.push(frame_seen()).is_err());
        assert!(q.push(unlock()).is_ok());
        for _ in RECORD_QUEUE + 1..KEEP_MAX {
            q.push(unlock()).unwrap();
        }
        assert!(q.push(unlock()).is_err(), "memory stays bounded");
    }

    fn link(state: LinkState, board_offline: Option<Change>) -> Record {
        Record::Link {
            serial: "a".into(),
            state,
            board_offline,
            at: Timestamp(0),
        }
    }

    #[test]
    fn a_full_queue_drops_a_bare_link_row_but_keeps_one_that_carries_an_alert() {
        let q = full_of_bookkeeping();
        assert!(q.push(link(LinkState::Down, None)).is_err());
        assert!(q.push(link(LinkState::Down, Some(Change::Raise))).is_ok());
        assert!(q.push(link(LinkState::Up, Some(Change::Clear))).is_ok());
    }

    #[test]
    fn a_link_row_and_the_board_offline_change_it_carries_land_in_one_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(
            &dir.path().join("lockhub.db"),
            &crate::config::Policy::default(),
        )
        .unwrap();
        let seen = |store: &Store| {
            let conn = store.reader().unwrap();
            let state = links::all(&conn).unwrap().first().map(|r| r.state);
            let offline =
                crate::store::alerts::raised_subjects(&conn, Condition::BoardOffline).unwrap();
            (state, offline)
        };
        let write = |rec: Record| {
            store
                .write_blocking(Priority::Bulk, move |c| rec.apply(c))
                .unwrap()
        };
        write(link(LinkState::Down, Some(Change::Raise)));
        assert_eq!(seen(&store), (Some(LinkState::Down), vec!["a".to_owned()]));
        write(link(LinkState::Up, Some(Change::Clear)));
        assert_eq!(seen(&store), (Some(LinkState::Up), vec![]));
        // Link bookkeeping alone leaves the alert as it is.
        write(link(LinkState::Down, None));
        assert_eq!(seen(&store), (Some(LinkState::Down), vec![]));
        store.close();
    }

    #[tokio::test]
    async fn records_come_out_in_order_and_the_end_after_the_last() {
        let q = RecordQueue::default();
        q.push(frame_seen()).unwrap();
        q.push(unlock()).unwrap();
        q.close();
        assert_eq!(q.pop().await, Some(frame_seen()));
        assert_eq!(q.pop().await, Some(unlock()));
        assert_eq!(q.pop().await, None);
    }
}
