//! What a door driver watches besides the PIN decision, as pure state
//! machines both drivers share (serial lock boards and OSDP readers): the
//! door sensor (forced, held open) and the keypad flood limit.
//!
//! Nothing here does I/O or reads a clock. Times are the driver's monotonic
//! milliseconds, so tests step time exactly and a wall-clock jump can fake
//! neither a forced door nor a flood; the effective time appears only in
//! [`DoorState`], the part kept durably, which must outlive the process.
//! Doors are keyed by whatever the driver numbers them with (a board's door
//! index, a reader's address): nothing here knows a wire type.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

use lockhub_proto::time::Timestamp;

/// After an `Unlock` is sent, a door may open for its `unlock_ms` plus this
/// long without counting as forced. It covers the link's resends (up to
/// 750 ms before the board acts), a person pulling the door just as the
/// relay drops, and a slow sensor.
pub const UNLOCK_GRACE_MS: u64 = 3_000;

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

/// A door's last reported state, as kept durably (`door_state`): what a
/// restarted hub needs so that the next "closed" still ends the alerts the
/// opening raised, although the board reports levels only on change.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DoorState {
    /// When the current opening began (effective time); `None` while closed.
    pub opened_at: Option<Timestamp>,
    /// This opening raised `door_forced`.
    pub forced: bool,
    /// This opening raised `door_held_open`.
    pub held_open: bool,
}

impl DoorState {
    pub fn is_open(&self) -> bool {
        self.opened_at.is_some()
    }
}

fn mono(ms: u64) -> i64 {
    i64::try_from(ms).unwrap_or(i64::MAX)
}

/// One door's sensor and relay window.
///
/// Why the hub keeps the window itself: the board reports only "open" and
/// "closed". Whether an opening was allowed depends on whether the hub
/// recently told the board to unlock, which only the hub knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DoorWatch {
    /// When the door opened (monotonic ms), if it is open. Signed: a door
    /// restored open opened before this run's clock began.
    opened_ms: Option<i64>,
    /// Openings before this instant are allowed.
    window_until: Option<u64>,
    state: DoorState,
}

impl DoorWatch {
    pub fn new() -> Self {
        Self::default()
    }

    /// The watch of a door whose durable state is `state`, at `now_ms` and
    /// effective time `now`. An open door keeps its age, so held-open is
    /// not restarted by a hub restart; no unlock window survives.
    pub fn restore(state: DoorState, now_ms: u64, now: Timestamp) -> Self {
        let opened_ms = state.opened_at.map(|at| {
            let age_ms = now.0.saturating_sub(at.0).max(0) / 1_000;
            mono(now_ms).saturating_sub(age_ms)
        });
        Self {
            opened_ms,
            window_until: None,
            state,
        }
    }

    /// The part to keep durably; changed by [`sensor`](Self::sensor) and
    /// [`poll`](Self::poll) exactly when they return an alarm or the door
    /// opened within its window.
    pub fn state(&self) -> DoorState {
        self.state
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
        self.state.is_open()
    }

    /// The board reported the sensor at `now` (effective time `at`).
    /// Repeated reports of the same state (a board re-reporting after a
    /// Hello) change nothing.
    pub fn sensor(&mut self, open: bool, now: u64, at: Timestamp) -> Option<DoorAlarm> {
        match (open, self.is_open()) {
            (true, false) => {
                self.opened_ms = Some(mono(now));
                self.state.opened_at = Some(at);
                if self.in_window(now) {
                    None
                } else {
                    self.state.forced = true;
                    Some(DoorAlarm::Forced)
                }
            }
            (false, true) => {
                let alarm = DoorAlarm::Closed {
                    forced: self.state.forced,
                    held_open: self.state.held_open,
                };
                self.opened_ms = None;
                self.state = DoorState::default();
                Some(alarm)
            }
            _ => None,
        }
    }

    /// A sensor report as a door driver records it: the door's state after
    /// it and the alarm it means, or `None` when there is nothing to record.
    /// A closed report for a door the hub already holds closed still gives
    /// `Closed` with both flags set: every driver's session starts with a
    /// full report (the board's after each Hello, the reader's input
    /// status), so it clears any door alert left over from a state the hub
    /// never saw end (one kept across a restart, say).
    pub fn report(
        &mut self,
        open: bool,
        now: u64,
        at: Timestamp,
    ) -> Option<(DoorState, Option<DoorAlarm>)> {
        let before = self.state();
        let alarm = self.sensor(open, now, at);
        let state = self.state();
        match alarm {
            None if !open => Some((
                state,
                Some(DoorAlarm::Closed {
                    forced: true,
                    held_open: true,
                }),
            )),
            None if state == before => None,
            alarm => Some((state, alarm)),
        }
    }

    /// Advance to `now`: `HeldOpen` once, when the door has been open for
    /// `held_open_ms`.
    pub fn poll(&mut self, now: u64, held_open_ms: u64) -> Option<DoorAlarm> {
        let opened = self.opened_ms?;
        if !self.state.held_open && mono(now).saturating_sub(opened) >= mono(held_open_ms) {
            self.state.held_open = true;
            return Some(DoorAlarm::HeldOpen);
        }
        None
    }
}

/// Keypad entries a door may take per [`FLOOD_WINDOW_MS`] before the rest
/// are flood (serial.md: "beyond 4 per second per door index").
pub const FLOOD_ENTRIES: usize = 4;
/// The flood limit's sliding window.
pub const FLOOD_WINDOW_MS: u64 = 1_000;
/// At most one `door.flood` row per door this often (serial.md: "one
/// `door.flood` audit row per door per minute").
pub const FLOOD_ROW_EVERY_MS: u64 = 60_000;

/// What to do with one keypad entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Within the limit: decide it as usual.
    Decide,
    /// Past the limit: deny it without a lookup. `row` is `Some(count)`
    /// when a `door.flood` row counting `count` entries is due now (the
    /// first flood entry after a quiet minute, so the alert is raised at
    /// once); otherwise the entry is counted toward the next row.
    Flood { row: Option<u64> },
}

/// The keypad flood limit of one port (or reader bus), per door.
///
/// Every entry counts toward the window, flood ones included, so a
/// continuous flood stays denied: otherwise four of every second's frames
/// would still be decided and written, which is what fills a disk and
/// speeds up guessing. A person types at most one PIN every second or two
/// and never meets the limit. Memory stays bounded by the number of door
/// keys the driver can name (a `u8` index: 256), and idle doors are
/// forgotten by [`poll`](Self::poll).
#[derive(Debug, Clone)]
pub struct FloodLimit<K> {
    doors: HashMap<K, FloodDoor>,
}

#[derive(Debug, Clone, Default)]
struct FloodDoor {
    /// The times of the last [`FLOOD_ENTRIES`] entries.
    recent: VecDeque<u64>,
    /// Flood entries not yet in a row.
    pending: u64,
    last_row_ms: Option<u64>,
}

impl<K> Default for FloodLimit<K> {
    fn default() -> Self {
        Self {
            doors: HashMap::new(),
        }
    }
}

impl<K: Copy + Eq + Hash> FloodLimit<K> {
    pub fn new() -> Self {
        Self::default()
    }

    /// One keypad entry at `door` at `now`.
    pub fn admit(&mut self, door: K, now: u64) -> Admit {
        let d = self.doors.entry(door).or_default();
        let full = d.recent.len() >= FLOOD_ENTRIES
            && d.recent
                .front()
                .is_some_and(|&t| now.saturating_sub(t) < FLOOD_WINDOW_MS);
        if d.recent.len() >= FLOOD_ENTRIES {
            d.recent.pop_front();
        }
        d.recent.push_back(now);
        if !full {
            return Admit::Decide;
        }
        d.pending = d.pending.saturating_add(1);
        let due = d
            .last_row_ms
            .is_none_or(|t| now.saturating_sub(t) >= FLOOD_ROW_EVERY_MS);
        if !due {
            return Admit::Flood { row: None };
        }
        let count = std::mem::take(&mut d.pending);
        d.last_row_ms = Some(now);
        Admit::Flood { row: Some(count) }
    }

    /// Advance to `now`: the `(door, count)` rows now due, a minute after
    /// each door's last row. Forgets doors quiet for a minute.
    pub fn poll(&mut self, now: u64) -> Vec<(K, u64)> {
        let mut rows = Vec::new();
        self.doors.retain(|door, d| {
            let since_row = d.last_row_ms.map(|t| now.saturating_sub(t));
            if d.pending > 0 && since_row.is_none_or(|s| s >= FLOOD_ROW_EVERY_MS) {
                rows.push((*door, std::mem::take(&mut d.pending)));
                d.last_row_ms = Some(now);
                return true;
            }
            let quiet = d
                .recent
                .back()
                .is_none_or(|&t| now.saturating_sub(t) >= FLOOD_ROW_EVERY_MS);
            d.pending > 0 || !quiet || since_row.is_some_and(|s| s < FLOOD_ROW_EVERY_MS)
        });
        rows
    }

    /// Every flood entry not yet in a row, as `(door, count)`, at `now`
    /// (the driver is closing: each counted entry still ends in a row).
    pub fn drain(&mut self, now: u64) -> Vec<(K, u64)> {
        let mut rows = Vec::new();
        for (door, d) in &mut self.doors {
            if d.pending > 0 {
                rows.push((*door, std::mem::take(&mut d.pending)));
                d.last_row_ms = Some(now);
            }
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timestamp = Timestamp(1_800_000_000_000_000);

    #[test]
    fn opening_without_an_unlock_is_forced() {
        let mut w = DoorWatch::new();
        assert_eq!(w.sensor(true, 1_000, T), Some(DoorAlarm::Forced));
        assert!(w.state().forced && w.state().opened_at == Some(T));
    }

    #[test]
    fn opening_within_the_unlock_window_is_not_forced() {
        let mut w = DoorWatch::new();
        w.unlock_sent(1_000, 5_000);
        assert_eq!(w.sensor(true, 2_000, T), None);
        assert!(w.state().is_open() && !w.state().forced);
        assert_eq!(
            w.sensor(false, 3_000, T),
            Some(DoorAlarm::Closed {
                forced: false,
                held_open: false
            })
        );
        assert_eq!(w.state(), DoorState::default());
    }

    #[test]
    fn opening_just_inside_the_grace_is_allowed_and_just_after_is_forced() {
        let mut w = DoorWatch::new();
        w.unlock_sent(0, 5_000);
        assert!(w.in_window(5_000 + UNLOCK_GRACE_MS - 1));
        assert!(!w.in_window(5_000 + UNLOCK_GRACE_MS));
        assert_eq!(
            w.sensor(true, 5_000 + UNLOCK_GRACE_MS, T),
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
        w.sensor(true, 1_000, T);
        assert_eq!(w.poll(60_999, 60_000), None);
        assert_eq!(w.poll(61_000, 60_000), Some(DoorAlarm::HeldOpen));
        assert_eq!(w.poll(90_000, 60_000), None);
        assert!(w.state().held_open);
    }

    #[test]
    fn closing_reports_which_alerts_to_clear() {
        let mut w = DoorWatch::new();
        w.sensor(true, 0, T);
        w.poll(60_000, 60_000);
        assert_eq!(
            w.sensor(false, 61_000, T),
            Some(DoorAlarm::Closed {
                forced: true,
                held_open: true
            })
        );
        // The next opening starts afresh.
        assert_eq!(w.sensor(true, 62_000, T), Some(DoorAlarm::Forced));
    }

    #[test]
    fn repeated_reports_of_the_same_state_change_nothing() {
        let mut w = DoorWatch::new();
        assert_eq!(w.sensor(false, 0, T), None);
        w.sensor(true, 10, T);
        let before = w.state();
        assert_eq!(w.sensor(true, 20, T), None);
        assert!(w.is_open());
        assert_eq!(w.state(), before);
    }

    #[test]
    fn a_report_records_changes_and_every_closed_report_but_not_a_repeated_opening() {
        let mut w = DoorWatch::new();
        let all_clear = Some(DoorAlarm::Closed {
            forced: true,
            held_open: true,
        });
        // Closed while already closed: still recorded, clearing leftovers.
        assert_eq!(w.report(false, 0, T), Some((w.state(), all_clear)));
        // Opening without an unlock is forced; the same opening again is nothing.
        let (state, alarm) = w.report(true, 10, T).unwrap();
        assert_eq!(alarm, Some(DoorAlarm::Forced));
        assert!(state.is_open());
        assert_eq!(w.report(true, 20, T), None);
        // Opening inside the unlock window changes the state without an alarm.
        let mut w = DoorWatch::new();
        w.unlock_sent(0, 5_000);
        let (state, alarm) = w.report(true, 100, T).unwrap();
        assert_eq!(alarm, None);
        assert!(state.is_open());
        // Closing it reports what the opening raised (nothing here).
        assert_eq!(
            w.report(false, 200, T).map(|(_, a)| a),
            Some(Some(DoorAlarm::Closed {
                forced: false,
                held_open: false
            }))
        );
    }

    #[test]
    fn a_closed_door_is_never_held_open() {
        let mut w = DoorWatch::new();
        assert_eq!(w.poll(1_000_000, 60_000), None);
    }

    #[test]
    fn a_restored_forced_door_that_closes_clears_its_alert() {
        let mut w = DoorWatch::new();
        w.sensor(true, 0, T);
        // The hub restarts: a new process, a new monotonic clock.
        let mut w = DoorWatch::restore(w.state(), 5, T.saturating_add_secs(30));
        assert!(w.is_open());
        // The board re-reports after the Hello: still open, nothing new.
        assert_eq!(w.sensor(true, 6, T.saturating_add_secs(30)), None);
        assert_eq!(
            w.sensor(false, 7, T.saturating_add_secs(31)),
            Some(DoorAlarm::Closed {
                forced: true,
                held_open: false
            })
        );
    }

    #[test]
    fn a_restored_open_door_keeps_its_age_for_held_open() {
        let mut w = DoorWatch::new();
        w.sensor(true, 0, T);
        let mut w = DoorWatch::restore(w.state(), 100_000, T.saturating_add_secs(50));
        assert_eq!(w.poll(100_000 + 9_999, 60_000), None);
        assert_eq!(w.poll(100_000 + 10_000, 60_000), Some(DoorAlarm::HeldOpen));
        // A restored door already held open is not alerted twice.
        let mut w = DoorWatch::restore(w.state(), 0, T.saturating_add_secs(500));
        assert_eq!(w.poll(1, 60_000), None);
    }

    #[test]
    fn a_door_open_before_the_ports_clock_began_keeps_its_age() {
        // A driver's monotonic clock starts at 0 when it loads the states.
        let mut w = DoorWatch::new();
        w.sensor(true, 0, T);
        let mut w = DoorWatch::restore(w.state(), 0, T.saturating_add_secs(50));
        assert_eq!(w.poll(9_999, 60_000), None);
        assert_eq!(w.poll(10_000, 60_000), Some(DoorAlarm::HeldOpen));
        // Open for longer than held-open while the hub was down: at once.
        let mut w = DoorWatch::new();
        w.sensor(true, 0, T);
        let mut w = DoorWatch::restore(w.state(), 0, T.saturating_add_secs(3600));
        assert_eq!(w.poll(0, 60_000), Some(DoorAlarm::HeldOpen));
    }

    #[test]
    fn four_entries_a_second_are_decided_and_the_fifth_is_flood() {
        let mut f = FloodLimit::new();
        for t in [0, 100, 200, 300] {
            assert_eq!(f.admit(0u8, t), Admit::Decide, "{t}");
        }
        assert_eq!(f.admit(0, 400), Admit::Flood { row: Some(1) });
        // Another door is not affected.
        assert_eq!(f.admit(1, 400), Admit::Decide);
    }

    #[test]
    fn a_person_typing_every_second_never_meets_the_limit() {
        let mut f = FloodLimit::new();
        for i in 0..100u64 {
            assert_eq!(f.admit(0u8, i * 1_000), Admit::Decide);
        }
        let mut f = FloodLimit::new();
        for i in 0..100u64 {
            assert_eq!(
                f.admit(0u8, i * 250),
                Admit::Decide,
                "every 250 ms is 4 a second"
            );
        }
    }

    #[test]
    fn a_continuous_flood_stays_denied_and_makes_one_row_a_minute() {
        let mut f = FloodLimit::new();
        let mut decided = 0;
        let mut rows = Vec::new();
        // 1,000 entries a second for three minutes.
        for t in 0..180_000u64 {
            match f.admit(7u8, t) {
                Admit::Decide => decided += 1,
                Admit::Flood { row: Some(n) } => rows.push((t, n)),
                Admit::Flood { row: None } => {}
            }
            rows.extend(f.poll(t).into_iter().map(|(_, n)| (t, n)));
        }
        assert_eq!(decided, FLOOD_ENTRIES, "only the first four are decided");
        assert_eq!(
            rows.iter().map(|r| r.0).collect::<Vec<_>>(),
            [4, 60_004, 120_004]
        );
        let counted: u64 = rows.iter().map(|r| r.1).sum::<u64>() + f.drain(180_000)[0].1;
        assert_eq!(
            counted,
            180_000 - FLOOD_ENTRIES as u64,
            "every flood entry is counted once"
        );
    }

    #[test]
    fn after_a_quiet_second_entries_are_decided_again() {
        let mut f = FloodLimit::new();
        for t in 0..10u64 {
            f.admit(0u8, t);
        }
        assert_eq!(f.admit(0, 1_009), Admit::Decide);
    }

    #[test]
    fn the_last_flood_entries_end_in_a_row_when_drained() {
        let mut f = FloodLimit::new();
        for t in 0..10u64 {
            f.admit(0u8, t);
        }
        // The first flood entry made a row at once; five more wait.
        assert_eq!(f.poll(30_000), []);
        assert_eq!(f.drain(30_000), [(0, 5)]);
        assert_eq!(f.drain(30_001), []);
    }

    #[test]
    fn quiet_doors_are_forgotten() {
        let mut f = FloodLimit::new();
        for t in 0..10u64 {
            f.admit(3u8, t);
        }
        assert_eq!(f.poll(60_004), [(3, 5)]);
        assert_eq!(f.poll(200_000), []);
        assert!(f.doors.is_empty());
    }
}
