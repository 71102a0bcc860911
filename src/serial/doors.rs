//! Per-door keypad entries of one port: which entry is being decided (a
//! plain state machine), and deciding one. The door sensor and the flood
//! limit, which every door driver shares, are [`crate::watch`]'s.

use std::collections::{HashMap, VecDeque};

use firmware_bridge::{DenyReason as WireDeny, Pin};

use super::PortShared;
use super::port::DoorTarget;
use crate::door::{Decision, pin_tags};
use crate::store::StoreError;
use crate::store::door::{DoorEntry, decide_entry};

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
    pub fn busy(&self, door: u8) -> bool {
        self.doors.get(&door).is_some_and(|s| s.busy)
    }
}

/// What to answer a decided keypad entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Unlock { key_id: String },
    Deny { reason: WireDeny },
}

/// Decides one keypad entry and commits it: the PIN's tags under every PIN
/// key, then [`decide_entry`] (the door decision every driver shares).
/// Returns only after the audit row is committed, so the caller may then
/// send the command; within [`door::ANSWER_WITHIN`] of `received` (when the
/// entry was acked, also for one that waited behind another) in any case. If
/// the store cannot commit in time, the answer is `Deny`, and the denial is
/// kept and written with its `storage_failure` alert once storage works
/// ([`storage_failure`]): no door opens unrecorded.
///
/// [`door::ANSWER_WITHIN`]: crate::store::door::ANSWER_WITHIN
pub(crate) async fn decide(
    shared: &PortShared,
    target: &DoorTarget,
    pin: Pin,
    received: std::time::Instant,
) -> Reply {
    // The PIN is dropped here; only its tags go further.
    let tags = pin_tags(pin.as_bytes(), &shared.pin_keys);
    drop(pin);
    let at = shared.now();
    let entry = DoorEntry {
        door: target.name.clone(),
        door_known: target.known,
        tags,
        at,
    };
    let serial = &shared.port.name;
    let result = decide_entry(&shared.store, entry, shared.policy, received).await;
    shared.wake_outbox();
    match result {
        Ok(outcome) => match outcome.decision {
            Decision::Unlock(key) => {
                tracing::info!(serial = %serial, door = %target.name, key_id = %key.key_id, "granted");
                Reply::Unlock { key_id: key.key_id }
            }
            other => {
                let reason = match other.wire_deny_reason() {
                    Some(2) => WireDeny::LOCKED_OUT,
                    _ => WireDeny::DENIED,
                };
                match &other {
                    Decision::Deny { reason, lockout } => tracing::info!(
                        serial = %serial, door = %target.name, reason = reason.as_str(),
                        lockout_started = lockout.is_some(), "denied"
                    ),
                    _ => tracing::info!(serial = %serial, door = %target.name, "locked out"),
                }
                Reply::Deny { reason }
            }
        },
        Err(e) => storage_failure(serial, &target.name, &e),
    }
}

/// The store could not commit the decision in time: deny. The denial itself
/// is already kept by [`decide_entry`] and is written, with its
/// `storage_failure` alert, as soon as storage takes writes again; no
/// second write is tried here, so the person at the door is answered now.
fn storage_failure(serial: &str, door: &str, e: &StoreError) -> Reply {
    tracing::error!(serial = %serial, door = %door, error = %e, "cannot record the decision; denied");
    Reply::Deny {
        reason: WireDeny::DENIED,
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
