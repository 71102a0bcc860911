//! A door driver's recorder: the audit rows and alerts that nobody waits
//! for, written in the order they happened. Both drivers (serial ports,
//! OSDP buses) hand their records to one of these per port or bus.
//!
//! Why a queue and a task of its own: a driver's loop must never wait on
//! the disk (acks, polls and other doors would stall behind an fsync), yet
//! its records must land in order (an alert raised before it is cleared).
//!
//! Why the queue never turns away an audit row or an alert below
//! [`KEEP_MAX`]: each is the only trace of something at a door (an unlock
//! confirmed, a forced door, a flood, an alert that ends). Past
//! [`RECORD_QUEUE`] records (the store has stopped answering for a while)
//! only bookkeeping for `lockhub status` is dropped, which the next frame
//! or state change writes again. [`KEEP_MAX`] bounds memory if the store
//! never comes back: doors are rate-limited (the flood limit), so it holds
//! minutes of a busy building's records.
//!
//! The door records both drivers make alike ([`DoorRecord`]: an unlock
//! confirmed or not, an entry denied undecided, a door's new sensor state,
//! a flood row) are made here, through [`Recorder::unlock`],
//! [`Recorder::undecided`], [`Recorder::door_state`] and [`Recorder::flood`],
//! so the two drivers cannot drift apart on what a door leaves on record.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::door::sensor::{DoorAlarm, DoorState};
use crate::store::door::{record_flood, record_sensor, record_storage_failure, record_unlock};
use crate::store::{Priority, Store, error::StoreError};
use lockhub_proto::time::Timestamp;

/// Records waiting for the store, per port or bus, past which bookkeeping
/// is dropped.
pub(crate) const RECORD_QUEUE: usize = 64;
/// Records waiting for the store, per port or bus, past which even audit
/// rows and alerts are dropped (logged as errors).
pub(crate) const KEEP_MAX: usize = 4096;

/// What a recorder writes.
pub(crate) trait Recordable: Send + Sync + 'static {
    /// Writes it, inside the writer's transaction. Called again after a
    /// failure, so it must not consume anything.
    fn apply(&self, conn: &rusqlite::Connection) -> Result<(), StoreError>;
    /// What to call it in a log line (no personal data, no secrets).
    fn what(&self) -> String;
    /// Bookkeeping that the next frame or state change writes again.
    fn droppable(&self) -> bool;
}

/// What either driver records at a door, alike for both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DoorRecord {
    /// `door.unlocked` (the door confirmed it) or `door.unlock_unconfirmed`.
    Unlock {
        door: String,
        key_id: String,
        confirmed: bool,
        at: Timestamp,
    },
    /// A keypad entry answered Deny undecided because the door's queue was
    /// full (the store is not keeping up): `door.denied` `storage_failure`
    /// and its alert.
    Undecided { door: String, at: Timestamp },
    /// A door sensor report that changed the door's durable state, and
    /// what it means: the state, its audit row and its alerts land in one
    /// transaction (see [`record_sensor`]; `door_state` keeps it for the
    /// next run).
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
}

impl DoorRecord {
    /// Writes it (see [`Recordable::apply`]).
    pub(crate) fn apply(&self, conn: &rusqlite::Connection) -> Result<(), StoreError> {
        match self {
            DoorRecord::Unlock {
                door,
                key_id,
                confirmed,
                at,
            } => record_unlock(conn, door, key_id, *confirmed, *at).map(drop),
            DoorRecord::Undecided { door, at } => record_storage_failure(conn, door, *at).map(drop),
            DoorRecord::Sensor {
                door,
                state,
                alarm,
                at,
            } => record_sensor(conn, door, state, *alarm, *at),
            DoorRecord::Flood { door, count, at } => {
                record_flood(conn, door, *count, *at).map(drop)
            }
        }
    }

    /// Its name in a log line (see [`Recordable::what`]).
    pub(crate) fn what(&self) -> String {
        match self {
            DoorRecord::Unlock {
                door, confirmed, ..
            } => format!(
                "{} at {door}",
                if *confirmed {
                    "door.unlocked"
                } else {
                    "door.unlock_unconfirmed"
                }
            ),
            DoorRecord::Undecided { door, .. } => {
                format!("door.denied/storage_failure at {door}")
            }
            DoorRecord::Sensor { door, alarm, .. } => format!("door {door} sensor ({alarm:?})"),
            DoorRecord::Flood { door, count, .. } => format!("door.flood x{count} at {door}"),
        }
    }
}

/// A driver's records in order, between its tasks (many pushers) and its
/// recorder (one popper). See the module docs for its bounds.
pub(crate) struct RecordQueue<R> {
    inner: Mutex<Inner<R>>,
    wake: Notify,
}

struct Inner<R> {
    records: VecDeque<R>,
    closed: bool,
}

impl<R> Default for RecordQueue<R> {
    fn default() -> Self {
        RecordQueue {
            inner: Mutex::new(Inner {
                records: VecDeque::new(),
                closed: false,
            }),
            wake: Notify::new(),
        }
    }
}

impl<R: Recordable> RecordQueue<R> {
    /// Queues `rec` without waiting; hands it back if it must be dropped.
    pub(crate) fn push(&self, rec: R) -> Result<(), R> {
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

    /// Whether the last [`Recorder`] is gone (the driver is stopping).
    fn closed(&self) -> bool {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).closed
    }

    async fn pop(&self) -> Option<R> {
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

/// The pushing end of a [`RecordQueue`], shared by a driver's tasks: when
/// the last of them drops it, the queue is closed, so the recorder writes
/// what is left and ends.
pub(crate) struct Recorder<R> {
    queue: Arc<RecordQueue<R>>,
    /// The port or bus, for the log line of a dropped record.
    driver: String,
}

impl<R: Recordable> Recorder<R> {
    /// A recorder for `driver` (a port or bus name) and the queue that
    /// [`run`] drains.
    pub(crate) fn new(driver: &str) -> (Self, Arc<RecordQueue<R>>) {
        let queue = Arc::new(RecordQueue::default());
        let recorder = Recorder {
            queue: queue.clone(),
            driver: driver.to_owned(),
        };
        (recorder, queue)
    }

    /// Queues `rec` without waiting; a record the queue must drop (see the
    /// module docs) is logged as an error.
    pub(crate) fn push(&self, rec: R) {
        if let Err(rec) = self.queue.push(rec) {
            tracing::error!(driver = %self.driver, record = %rec.what(), "record queue full; dropped");
        }
    }
}

impl<R: Recordable + From<DoorRecord>> Recorder<R> {
    /// `door.unlocked` for an unlock the door confirmed, else
    /// `door.unlock_unconfirmed` (the grant is on record, the door may not
    /// have opened).
    pub(crate) fn unlock(&self, door: &str, key_id: String, confirmed: bool, at: Timestamp) {
        self.push(R::from(DoorRecord::Unlock {
            door: door.to_owned(),
            key_id,
            confirmed,
            at,
        }));
    }

    /// A keypad entry denied without a decision (the door's queue is full):
    /// on record as the storage failure it is, with its alert.
    pub(crate) fn undecided(&self, door: &str, at: Timestamp) {
        self.push(R::from(DoorRecord::Undecided {
            door: door.to_owned(),
            at,
        }));
    }

    /// A door's new state, with what it means: a forced or held-open door
    /// is logged, and the state goes on record with its audit row and
    /// alerts in one transaction.
    pub(crate) fn door_state(
        &self,
        door: &str,
        state: DoorState,
        alarm: Option<DoorAlarm>,
        at: Timestamp,
    ) {
        match alarm {
            Some(DoorAlarm::Forced) => {
                tracing::warn!(driver = %self.driver, door = %door, "door forced")
            }
            Some(DoorAlarm::HeldOpen) => {
                tracing::warn!(driver = %self.driver, door = %door, "door held open")
            }
            _ => {}
        }
        self.push(R::from(DoorRecord::Sensor {
            door: door.to_owned(),
            state,
            alarm,
            at,
        }));
    }

    /// The `door.flood` row for `count` keypad entries turned away at
    /// `door` since its last one.
    pub(crate) fn flood(&self, door: &str, count: u64, at: Timestamp) {
        self.push(R::from(DoorRecord::Flood {
            door: door.to_owned(),
            count,
            at,
        }));
    }
}

impl<R> Drop for Recorder<R> {
    fn drop(&mut self) {
        self.queue
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .closed = true;
        self.queue.wake.notify_one();
    }
}

/// Writes records in order until the queue is closed and empty. A record
/// that is the only trace of something at a door is tried again until it
/// is written ([`Store::write_until_written`]); bookkeeping, which the
/// next frame or change writes anyway, is tried once.
pub(crate) async fn run<R: Recordable>(
    store: Store,
    queue: Arc<RecordQueue<R>>,
    outbox_wake: Option<Arc<Notify>>,
) {
    while let Some(rec) = queue.pop().await {
        let what = rec.what();
        let rec = Arc::new(rec);
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
                .write_until_written(&what, move |c| rec.apply(c), || queue.closed())
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

    #[derive(Debug, PartialEq)]
    struct Rec(&'static str, bool);

    impl Recordable for Rec {
        fn apply(&self, _: &rusqlite::Connection) -> Result<(), StoreError> {
            Ok(())
        }
        fn what(&self) -> String {
            self.0.to_owned()
        }
        fn droppable(&self) -> bool {
            self.1
        }
    }

    /// A queue holding as much droppable bookkeeping as it takes.
    fn full_of_bookkeeping() -> RecordQueue<Rec> {
        let q = RecordQueue::default();
        for _ in 0..RECORD_QUEUE {
            q.push(Rec("seen", true)).unwrap();
        }
        q
    }

    #[test]
    fn a_full_queue_drops_bookkeeping_but_keeps_audit_rows_up_to_its_bound() {
        let q = full_of_bookkeeping();
        assert!(q.push(Rec("seen", true)).is_err());
        assert!(q.push(Rec("unlock", false)).is_ok());
        for _ in RECORD_QUEUE + 1..KEEP_MAX {
            q.push(Rec("unlock", false)).unwrap();
        }
        assert!(
            q.push(Rec("unlock", false)).is_err(),
            "memory stays bounded"
        );
    }

    #[tokio::test]
    async fn records_come_out_in_order_and_the_end_after_the_last() {
        let (rec, q) = Recorder::new("a port");
        rec.push(Rec("a", true));
        rec.push(Rec("b", false));
        drop(rec);
        assert_eq!(q.pop().await, Some(Rec("a", true)));
        assert_eq!(q.pop().await, Some(Rec("b", false)));
        assert_eq!(q.pop().await, None);
    }
}
