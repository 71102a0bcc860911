//! A keypad entry at a door, whatever drives the door (a lock board over
//! serial, an OSDP reader): one decision at a time per door, in the order
//! typed, each decided by the store's door decision and committed (audit row
//! first) before the driver answers. The wire answers are the drivers'; the
//! decision, the lockout, the audit and the 2 s bound are all here and in
//! [`crate::store::door`]. The flood limit and the door sensor, which the
//! drivers share too, are [`crate::door::sensor`]'s.
//!
//! Logs carry the driver's label (serial or bus name), the door and key id;
//! never a PIN or a PIN tag.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use tokio::sync::Notify;

use crate::config::{PinKey, Policy};
use crate::door::{Decision, pin_tags};
use crate::store::Store;
use crate::store::door::{DoorEntry, decide_entry};
use jiff::tz::TimeZone;
use lockhub_proto::time::Timestamp;

/// Keypad entries that may wait behind the one being decided, per door.
///
/// Why a queue at all: each distinct Keypad must be decided exactly once and
/// in the order typed, because the lockout counts denials in order; two
/// decisions for one door running at once could swap which one is "the
/// fifth". A person needs seconds per entry and a decision takes
/// milliseconds, so anything deeper than a few entries is a stuck store, and
/// waiting longer would only answer a person long gone.
pub const DOOR_QUEUE_MAX: usize = 4;

/// One keypad entry queue per door: at most one decision in flight per
/// door, the next one starting when it finishes. Doors never wait on each
/// other.
#[derive(Debug)]
pub struct DecisionQueue<T> {
    doors: HashMap<u8, DoorSlot<T>>,
}

#[derive(Debug)]
struct DoorSlot<T> {
    busy: bool,
    waiting: VecDeque<T>,
}

/// What to do with an entry handed to [`DecisionQueue::push`].
#[derive(Debug, PartialEq, Eq)]
pub enum Queued<T> {
    /// The door was idle: decide this entry now.
    Start(T),
    /// Another entry at this door is being decided; this one waits.
    Waiting,
    /// The door's queue is full; the entry is handed back, undecided.
    Full(T),
}

impl<T> Default for DecisionQueue<T> {
    fn default() -> Self {
        Self {
            doors: HashMap::new(),
        }
    }
}

impl<T> DecisionQueue<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Offers a new entry for `door`.
    pub fn push(&mut self, door: u8, entry: T) -> Queued<T> {
        let slot = self.doors.entry(door).or_insert_with(|| DoorSlot {
            busy: false,
            waiting: VecDeque::new(),
        });
        if !slot.busy {
            slot.busy = true;
            Queued::Start(entry)
        } else if slot.waiting.len() < DOOR_QUEUE_MAX {
            slot.waiting.push_back(entry);
            Queued::Waiting
        } else {
            Queued::Full(entry)
        }
    }

    /// The decision at `door` finished: the next entry to decide, if any.
    pub fn done(&mut self, door: u8) -> Option<T> {
        let slot = self.doors.get_mut(&door)?;
        let next = slot.waiting.pop_front();
        slot.busy = next.is_some();
        if !slot.busy {
            self.doors.remove(&door);
        }
        next
    }

    /// Every entry still waiting, per door in the order typed, leaving the
    /// queue empty: the port is closing, and each must still be decided.
    pub fn take_waiting(&mut self) -> Vec<(u8, VecDeque<T>)> {
        self.doors
            .drain()
            .map(|(door, slot)| (door, slot.waiting))
            .filter(|(_, w)| !w.is_empty())
            .collect()
    }

    /// Whether a decision is in flight at `door`.
    #[cfg(any(test, feature = "testing"))]
    pub fn busy(&self, door: u8) -> bool {
        self.doors.get(&door).is_some_and(|s| s.busy)
    }
}

/// How a decided entry is answered, in any driver's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Open with this key (`door.granted` is committed).
    Unlock { key_id: String },
    /// Stay shut.
    Deny,
    /// Stay shut: the keypad is locked out (also the denial that starts it).
    LockedOut,
}

/// One entry to decide at a door.
pub struct Entry<'a> {
    /// The driver's label for logs: its serial port or OSDP bus.
    pub driver: &'a str,
    pub door: &'a str,
    /// The config names this door.
    pub known: bool,
    /// The bytes typed; anything but 4..=12 ASCII digits is `bad_format`.
    pub pin: &'a [u8],
    /// The effective time.
    pub at: Timestamp,
    /// When the entry reached the hub: the answer bound counts from here.
    pub received: Instant,
}

/// Decides one keypad entry and commits it: the PIN's tags under every PIN
/// key, then [`decide_entry`] (the store's door decision). Returns only
/// after the audit row is committed, so the driver may then drive the door;
/// within [`ANSWER_WITHIN`] of `received` in any case. If the store cannot
/// commit in time, the answer is `Deny`, and the denial is kept and written
/// with its `storage_failure` alert once storage works: no door opens
/// unrecorded. `wake` is notified after the commit (the outbox publisher).
///
/// [`ANSWER_WITHIN`]: crate::store::door::ANSWER_WITHIN
pub async fn decide(
    store: &Store,
    pin_keys: &[PinKey],
    policy: Policy,
    zone: &TimeZone,
    e: Entry<'_>,
    wake: Option<&Notify>,
) -> Answer {
    // The PIN goes no further than its tags.
    let tags = pin_tags(e.pin, pin_keys);
    let (driver, door) = (e.driver, e.door);
    let entry = DoorEntry {
        door: door.to_owned(),
        door_known: e.known,
        tags,
        at: e.at,
    };
    let result = decide_entry(store, entry, policy, zone.clone(), e.received).await;
    if let Some(w) = wake {
        w.notify_one();
    }
    match result {
        Ok(outcome) => match outcome.decision {
            Decision::Unlock(key) => {
                tracing::info!(driver = %driver, door = %door, key_id = %key.key_id, "granted");
                Answer::Unlock { key_id: key.key_id }
            }
            Decision::Deny { reason, lockout } => {
                tracing::info!(
                    driver = %driver, door = %door, reason = reason.as_str(),
                    lockout_started = lockout.is_some(), "denied"
                );
                if lockout.is_some() {
                    Answer::LockedOut
                } else {
                    Answer::Deny
                }
            }
            Decision::LockedOut { .. } => {
                tracing::info!(driver = %driver, door = %door, "locked out");
                Answer::LockedOut
            }
        },
        Err(e) => {
            // The denial is kept by decide_entry and written, with its
            // storage_failure alert, as soon as storage takes writes again;
            // no second write is tried, so the person is answered now.
            tracing::error!(driver = %driver, door = %door, error = %e, "cannot record the decision; denied");
            Answer::Deny
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_door_starts_its_entry_at_once() {
        let mut q = DecisionQueue::new();
        assert_eq!(q.push(0, "a"), Queued::Start("a"));
        assert!(q.busy(0));
    }

    #[test]
    fn a_second_entry_at_a_busy_door_waits_for_the_first() {
        let mut q = DecisionQueue::new();
        q.push(0, "a");
        assert_eq!(q.push(0, "b"), Queued::Waiting);
        assert_eq!(q.done(0), Some("b"));
        assert!(q.busy(0));
        assert_eq!(q.done(0), None);
        assert!(!q.busy(0));
    }

    #[test]
    fn doors_never_wait_on_each_other() {
        let mut q = DecisionQueue::new();
        q.push(0, "a");
        assert_eq!(q.push(1, "b"), Queued::Start("b"));
    }

    #[test]
    fn a_full_door_queue_hands_the_entry_back() {
        let mut q = DecisionQueue::new();
        q.push(0, 0);
        for i in 1..=DOOR_QUEUE_MAX {
            assert_eq!(q.push(0, i), Queued::Waiting);
        }
        assert_eq!(q.push(0, 99), Queued::Full(99));
        // Entries come out in the order typed.
        for i in 1..=DOOR_QUEUE_MAX {
            assert_eq!(q.done(0), Some(i));
        }
    }

    #[test]
    fn the_waiting_entries_are_handed_over_in_order_when_the_port_closes() {
        let mut q = DecisionQueue::new();
        q.push(0, "a");
        q.push(0, "b");
        q.push(0, "c");
        q.push(1, "x");
        let waiting = q.take_waiting();
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].0, 0);
        assert_eq!(Vec::from(waiting[0].1.clone()), ["b", "c"]);
        assert!(!q.busy(0) && !q.busy(1));
    }
}
