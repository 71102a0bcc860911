//! Per-door state of one port, as plain state machines: which keypad entry
//! is being decided, and what the door sensor means.
//!
//! Nothing here does I/O or reads a clock. Times are the port's monotonic
//! milliseconds (the same counter the [`firmware_bridge::HubLink`] uses), so
//! tests step time exactly and a wall-clock jump cannot fake a forced door.

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

/// After an `Unlock` is sent, a door may open for its `unlock_ms` plus this
/// long without counting as forced. It covers the link's resends (up to
/// 750 ms before the board acts), a person pulling the door just as the
/// relay drops, and a slow sensor.
pub const UNLOCK_GRACE_MS: u64 = 3_000;

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

    /// Whether a decision is in flight at `door`.
    pub fn busy(&self, door: u8) -> bool {
        self.doors.get(&door).is_some_and(|s| s.busy)
    }
}

/// What the door sensor state means, for the audit log and the alerts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorAlarm {
    /// Opened outside any unlock window: `door.forced` + `door_forced`.
    Forced,
    /// Open for `held_open_s`: `door.held_open` + `door_held_open`.
    HeldOpen,
    /// Closed again: clear the alerts this opening raised.
    Closed { forced: bool, held_open: bool },
}

/// One door's sensor and relay window.
///
/// Why the hub keeps the window itself: the board reports only "open" and
/// "closed". Whether an opening was allowed depends on whether the hub
/// recently told the board to unlock, which only the hub knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DoorWatch {
    /// When the door opened, if it is open.
    opened_at: Option<u64>,
    /// Openings before this instant are allowed.
    window_until: Option<u64>,
    forced: bool,
    held_open: bool,
}

impl DoorWatch {
    pub fn new() -> Self {
        Self::default()
    }

    /// An `Unlock` for `unlock_ms` went to the board at `now`.
    pub fn unlock_sent(&mut self, now: u64, unlock_ms: u16) {
        let until = now
            .saturating_add(u64::from(unlock_ms))
            .saturating_add(UNLOCK_GRACE_MS);
        self.window_until = Some(self.window_until.map_or(until, |u| u.max(until)));
    }

    /// Whether an opening at `now` would be allowed.
    pub fn in_window(&self, now: u64) -> bool {
        self.window_until.is_some_and(|u| now < u)
    }

    /// Whether the door is open as last reported.
    pub fn is_open(&self) -> bool {
        self.opened_at.is_some()
    }

    /// The board reported the sensor. Repeated reports of the same state
    /// (a board restarting) change nothing.
    pub fn sensor(&mut self, open: bool, now: u64) -> Option<DoorAlarm> {
        match (open, self.opened_at) {
            (true, None) => {
                self.opened_at = Some(now);
                if self.in_window(now) {
                    None
                } else {
                    self.forced = true;
                    Some(DoorAlarm::Forced)
                }
            }
            (false, Some(_)) => {
                let alarm = DoorAlarm::Closed {
                    forced: self.forced,
                    held_open: self.held_open,
                };
                self.opened_at = None;
                self.forced = false;
                self.held_open = false;
                Some(alarm)
            }
            _ => None,
        }
    }

    /// Advance to `now`: `HeldOpen` once, when the door has been open for
    /// `held_open_ms`.
    pub fn poll(&mut self, now: u64, held_open_ms: u64) -> Option<DoorAlarm> {
        let opened = self.opened_at?;
        if !self.held_open && now.saturating_sub(opened) >= held_open_ms {
            self.held_open = true;
            return Some(DoorAlarm::HeldOpen);
        }
        None
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
/// send the command; within [`door::ANSWER_WITHIN`] of now in any case. If
/// the store cannot commit in time, the answer is `Deny`, and the denial is
/// kept and written with its `storage_failure` alert once storage works
/// ([`storage_failure`]): no door opens unrecorded.
///
/// [`door::ANSWER_WITHIN`]: crate::store::door::ANSWER_WITHIN
pub(crate) async fn decide(shared: &PortShared, target: &DoorTarget, pin: Pin) -> Reply {
    // The 2 s count from here: the entry was acked just now.
    let received = std::time::Instant::now();
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
    fn opening_without_an_unlock_is_forced() {
        let mut w = DoorWatch::new();
        assert_eq!(w.sensor(true, 1_000), Some(DoorAlarm::Forced));
    }

    #[test]
    fn opening_within_the_unlock_window_is_not_forced() {
        let mut w = DoorWatch::new();
        w.unlock_sent(1_000, 5_000);
        assert_eq!(w.sensor(true, 2_000), None);
        assert_eq!(
            w.sensor(false, 3_000),
            Some(DoorAlarm::Closed {
                forced: false,
                held_open: false
            })
        );
    }

    #[test]
    fn opening_just_inside_the_grace_is_allowed_and_just_after_is_forced() {
        let mut w = DoorWatch::new();
        w.unlock_sent(0, 5_000);
        assert!(w.in_window(5_000 + UNLOCK_GRACE_MS - 1));
        assert!(!w.in_window(5_000 + UNLOCK_GRACE_MS));
        assert_eq!(
            w.sensor(true, 5_000 + UNLOCK_GRACE_MS),
            Some(DoorAlarm::Forced)
        );
    }

    #[test]
    fn a_shorter_later_unlock_does_not_shorten_the_window() {
        let mut w = DoorWatch::new();
        w.unlock_sent(0, 10_000);
        w.unlock_sent(100, 1_000);
        assert!(w.in_window(10_000));
    }

    #[test]
    fn a_door_open_too_long_is_held_open_once() {
        let mut w = DoorWatch::new();
        w.unlock_sent(0, 5_000);
        w.sensor(true, 1_000);
        assert_eq!(w.poll(60_999, 60_000), None);
        assert_eq!(w.poll(61_000, 60_000), Some(DoorAlarm::HeldOpen));
        assert_eq!(w.poll(90_000, 60_000), None);
    }

    #[test]
    fn closing_reports_which_alerts_to_clear() {
        let mut w = DoorWatch::new();
        w.sensor(true, 0);
        w.poll(60_000, 60_000);
        assert_eq!(
            w.sensor(false, 61_000),
            Some(DoorAlarm::Closed {
                forced: true,
                held_open: true
            })
        );
        // The next opening starts afresh.
        assert_eq!(w.sensor(true, 62_000), Some(DoorAlarm::Forced));
    }

    #[test]
    fn repeated_reports_of_the_same_state_change_nothing() {
        let mut w = DoorWatch::new();
        assert_eq!(w.sensor(false, 0), None);
        w.sensor(true, 10);
        assert_eq!(w.sensor(true, 20), None);
        assert!(w.is_open());
    }

    #[test]
    fn a_closed_door_is_never_held_open() {
        let mut w = DoorWatch::new();
        assert_eq!(w.poll(1_000_000, 60_000), None);
    }
}
