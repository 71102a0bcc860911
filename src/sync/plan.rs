//! Pure planners for the sync layer: when to ask the cloud for events, when
//! the cloud looks gone, when the outbox is backing up, when acknowledged
//! outbox rows are marked sent, and how long to wait before reconnecting.
//!
//! Nothing here does I/O or reads a clock: callers pass monotonic time (a
//! [`Duration`] since any fixed origin) and what the store said, and act on
//! what comes back. That keeps every timing rule testable without a runtime.

use crate::backoff::{Backoff, Jitter};
use lockhub_proto::outputs::{SyncReason, SyncRequest};
use std::time::Duration;

/// The durable seq state, as the store reports it after each event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeqView {
    /// Every seq up to here has been seen.
    pub watermark: u64,
    /// Some seq above the watermark has been seen (so there is a hole).
    pub gap: bool,
}

/// The durable seq state at start-up: the planner resumes from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeqStart {
    pub view: SeqView,
    /// The highest `head_seq` a checkpoint has shown (kept durably), so a
    /// restart does not forget that the hub is behind it.
    pub checkpoint_head: u64,
}

/// First repeat of an unanswered sync request.
pub const SYNC_BACKOFF_START: Duration = Duration::from_secs(1);
/// A request for a condition that newly appears waits a random part of
/// this first (uniform in `[0, SYNC_JITTER]`): a broker restart or a
/// checkpoint the cloud sends to every hub at once must not come back as one
/// burst of sync requests. It spreads a fleet's first requests over the
/// first backoff interval, so the cloud sees at most about one request per
/// hub per second; repeats keep each hub's own offset.
pub const SYNC_JITTER: Duration = SYNC_BACKOFF_START;
/// Repeats never wait longer than this.
pub const SYNC_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Decides when to send sync requests, and with which reason.
///
/// Three conditions can hold at once; the request names the most specific
/// (gap, then behind_checkpoint, then fresh_session) and always starts at
/// W+1. A condition that newly appears, or a change of reason, sends at once
/// with the backoff reset; otherwise the request repeats with backoff (1 s
/// doubling to 5 min) until every condition has cleared:
/// - gap: until no seq above W has been seen;
/// - behind_checkpoint: until W reaches the checkpoint's head;
/// - fresh_session: until a checkpoint that arrived on that session (or a
///   later one) shows `head_seq <= W`: one from the connection before says
///   nothing about what the new session lost.
#[derive(Debug, Clone)]
pub struct SyncPlanner {
    view: SeqView,
    /// The connection epoch of a session that started fresh, while no
    /// checkpoint from it has confirmed the hub is not behind.
    fresh: Option<u64>,
    /// The highest checkpoint head above the watermark.
    behind: Option<u64>,
    /// The reason of the last request sent, while conditions hold.
    last_reason: Option<SyncReason>,
    next_at: Option<Duration>,
    backoff: Backoff,
    /// Spread of a first request, and the generator that draws it.
    jitter: Duration,
    rng: Jitter,
}

impl SyncPlanner {
    /// A planner that asks at once (no jitter): for tests of the rules.
    pub fn new(view: SeqView) -> Self {
        Self::with_jitter(view, Duration::ZERO, 0)
    }

    /// A planner whose first request for a new condition waits a random
    /// delay in `[0, jitter]` drawn from `seed` (see [`SYNC_JITTER`]).
    pub fn with_jitter(view: SeqView, jitter: Duration, seed: u64) -> Self {
        SyncPlanner {
            view,
            fresh: None,
            behind: None,
            last_reason: None,
            next_at: None,
            backoff: Backoff::new(SYNC_BACKOFF_START, SYNC_BACKOFF_MAX),
            jitter,
            rng: Jitter::new(seed),
        }
    }

    /// The planner after a restart: still behind the last checkpoint when
    /// its head is above W, so it asks (`behind_checkpoint`) until W
    /// reaches it (mqtt.md 'Seq, gaps, staleness').
    /// Its first requests are jittered as [`SyncPlanner::with_jitter`]'s.
    pub fn resume(start: SeqStart, now: Duration, jitter: Duration, seed: u64) -> Self {
        let mut p = SyncPlanner::with_jitter(start.view, jitter, seed);
        if start.checkpoint_head > start.view.watermark {
            p.behind = Some(start.checkpoint_head);
        }
        p.reschedule(now);
        p
    }

    /// The seq state the planner last heard of.
    pub fn view(&self) -> SeqView {
        self.view
    }

    /// The reason a request would carry now, if one is needed.
    pub fn wanted(&self) -> Option<SyncReason> {
        if self.view.gap {
            Some(SyncReason::Gap)
        } else if self.behind.is_some() {
            Some(SyncReason::BehindCheckpoint)
        } else if self.fresh.is_some() {
            Some(SyncReason::FreshSession)
        } else {
            None
        }
    }

    fn reschedule(&mut self, now: Duration) {
        match self.wanted() {
            None => {
                self.last_reason = None;
                self.next_at = None;
                self.backoff.reset();
            }
            Some(r) if Some(r) != self.last_reason => {
                // New condition or a more specific one: ask now, give or
                // take the jitter. A request already due sooner stays.
                let at = now + self.rng.within(self.jitter);
                self.next_at = Some(self.next_at.map_or(at, |t| t.min(at)).max(now));
                self.backoff.reset();
            }
            Some(_) => {}
        }
    }

    /// A broker session started on connection `epoch`. `session_present =
    /// false` means it is new.
    pub fn on_session(&mut self, session_present: bool, epoch: u64, now: Duration) {
        if !session_present {
            self.fresh = Some(epoch);
            // A new session is news even if a fresh_session request was
            // already repeating: ask again now.
            if self.last_reason == Some(SyncReason::FreshSession) {
                self.last_reason = None;
            }
        }
        self.reschedule(now);
    }

    /// An authenticated event was committed and the seq state is now `view`.
    pub fn on_event(&mut self, view: SeqView, now: Duration) {
        self.view = view;
        if self.behind.is_some_and(|head| head <= view.watermark) {
            self.behind = None;
        }
        self.reschedule(now);
    }

    /// A checkpoint that arrived on connection `epoch` was committed:
    /// `head_seq` is the cloud's latest seq.
    pub fn on_checkpoint(&mut self, head_seq: u64, epoch: u64, view: SeqView, now: Duration) {
        self.view = view;
        if head_seq > view.watermark {
            self.behind = Some(self.behind.map_or(head_seq, |h| h.max(head_seq)));
        } else {
            if self.fresh.is_some_and(|fresh| epoch >= fresh) {
                self.fresh = None;
            }
            if self.behind.is_some_and(|head| head <= view.watermark) {
                self.behind = None;
            }
        }
        self.reschedule(now);
    }

    /// The request to send now, if one is due; schedules the next repeat.
    pub fn poll(&mut self, now: Duration) -> Option<SyncRequest> {
        let reason = self.wanted()?;
        let due = self.next_at?;
        if now < due {
            return None;
        }
        self.last_reason = Some(reason);
        self.next_at = Some(now + self.backoff.next_step());
        Some(SyncRequest {
            from_seq: self.view.watermark.saturating_add(1),
            reason,
        })
    }

    /// When [`SyncPlanner::poll`] next has something to say.
    pub fn next_deadline(&self) -> Option<Duration> {
        self.wanted().and(self.next_at)
    }
}

/// What to do about an alert that follows a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlertChange {
    Raise,
    /// The condition still holds: open the alert if it is not raised (an
    /// operator may have cleared it by hand, or its write failed), without
    /// counting a new occurrence ([`crate::store::alerts::hold`]).
    Holds,
    Clear,
}

/// How often a tracker says again that its condition still holds.
pub const HOLDS_AGAIN: Duration = Duration::from_secs(10);

/// `cloud_stale`: raised after `stale_after` without a sign of life,
/// cleared by the next one. A hub that has never heard the cloud starts
/// the clock at start-up (it raises after one full period); a restart
/// carries over the silence since the durable last sign of life, so a hub
/// restarting in a loop cannot hide a silent cloud.
#[derive(Debug, Clone)]
pub struct StaleTracker {
    stale_after: Duration,
    last_life: Duration,
    /// Silence already heard before `last_life` (from before a restart).
    carried: Duration,
    raised: bool,
    /// When to say [`AlertChange::Holds`] next while raised, or the clear
    /// again after its write failed.
    holds_at: Duration,
    /// The last clear was not written ([`StaleTracker::write_failed`]).
    clear_unwritten: bool,
}

impl StaleTracker {
    /// `raised` is what the store says (an alert survives restarts).
    pub fn new(stale_after: Duration, now: Duration, raised: bool) -> Self {
        StaleTracker {
            stale_after,
            last_life: now,
            carried: Duration::ZERO,
            raised,
            holds_at: now,
            clear_unwritten: false,
        }
    }

    /// After a restart: `silent_for` is how long ago the durable last sign
    /// of life was (by the hub's clock).
    pub fn resume(
        stale_after: Duration,
        now: Duration,
        raised: bool,
        silent_for: Duration,
    ) -> Self {
        StaleTracker {
            carried: silent_for.min(stale_after),
            ..StaleTracker::new(stale_after, now, raised)
        }
    }

    /// The cloud showed a sign of life.
    pub fn on_life(&mut self, now: Duration) -> Option<AlertChange> {
        self.last_life = self.last_life.max(now);
        self.carried = Duration::ZERO;
        if self.raised {
            self.raised = false;
            Some(AlertChange::Clear)
        } else {
            None
        }
    }

    /// The write of `change` failed. A failed raise is mended by the next
    /// [`AlertChange::Holds`]; a failed clear is said again after
    /// [`HOLDS_AGAIN`] while the cloud stays alive, so the alert cannot
    /// stay raised for good behind one failed write.
    pub fn write_failed(&mut self, change: AlertChange, now: Duration) {
        if change == AlertChange::Clear {
            self.clear_unwritten = true;
            self.holds_at = now + HOLDS_AGAIN;
        }
    }

    /// Whether the alert must be raised now, or said again to hold (every
    /// [`HOLDS_AGAIN`] while the silence lasts), or cleared again.
    pub fn poll(&mut self, now: Duration) -> Option<AlertChange> {
        if now.saturating_sub(self.last_life) + self.carried < self.stale_after {
            if self.clear_unwritten && now >= self.holds_at {
                self.clear_unwritten = false;
                return Some(AlertChange::Clear);
            }
            return None;
        }
        self.clear_unwritten = false;
        let change = if !self.raised {
            AlertChange::Raise
        } else if now >= self.holds_at {
            AlertChange::Holds
        } else {
            return None;
        };
        self.raised = true;
        self.holds_at = now + HOLDS_AGAIN;
        Some(change)
    }

    /// When [`StaleTracker::poll`] may next raise or hold.
    pub fn next_deadline(&self) -> Option<Duration> {
        let stale_at = self.last_life + self.stale_after.saturating_sub(self.carried);
        Some(if self.raised {
            self.holds_at
        } else if self.clear_unwritten {
            self.holds_at.min(stale_at)
        } else {
            stale_at
        })
    }
}

/// `outbox_backlog` thresholds: too many unsent rows, or the oldest too old.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BacklogLimits {
    pub max_rows: u64,
    pub max_age: Duration,
}

impl Default for BacklogLimits {
    fn default() -> Self {
        BacklogLimits {
            max_rows: 10_000,
            max_age: Duration::from_secs(3600),
        }
    }
}

/// Follows the outbox depth; raises once above a limit (and says it still
/// holds at every look while above), clears once below.
#[derive(Debug, Clone)]
pub struct BacklogMonitor {
    limits: BacklogLimits,
    raised: bool,
}

impl BacklogMonitor {
    pub fn new(limits: BacklogLimits, raised: bool) -> Self {
        BacklogMonitor { limits, raised }
    }

    /// `oldest_age` is the age of the oldest unsent row (None when empty).
    pub fn observe(&mut self, depth: u64, oldest_age: Option<Duration>) -> Option<AlertChange> {
        let over =
            depth > self.limits.max_rows || oldest_age.is_some_and(|a| a > self.limits.max_age);
        match (over, self.raised) {
            (true, false) => {
                self.raised = true;
                Some(AlertChange::Raise)
            }
            (true, true) => Some(AlertChange::Holds),
            (false, true) => {
                self.raised = false;
                Some(AlertChange::Clear)
            }
            _ => None,
        }
    }

    /// The write of `change` failed: a clear is said again at the next
    /// look under the limits (a failed raise is mended by the next
    /// [`AlertChange::Holds`]).
    pub fn write_failed(&mut self, change: AlertChange) {
        if change == AlertChange::Clear {
            self.raised = true;
        }
    }
}

/// Acknowledged outbox rows waiting to be marked sent, and when to mark
/// them. The publisher keeps publishing while a mark commits (the writer
/// may be busy for many milliseconds under a flood, or stalled by another
/// process), so at most one mark is in flight and the acks that arrive
/// meanwhile go into the next one. A row joins a mark only once its PUBACK
/// arrived; a mark that fails goes back and is tried again after
/// [`MARK_RETRY`] (a crash meanwhile only sends those rows again: at least
/// once).
///
/// A mark starts as soon as the last one is done, without waiting for more
/// acks to share it: a 100 ms linger cut the bytes written per door entry
/// by a fifth but made the door's p99 two to five times worse (the delayed
/// marks landed beside the entries; BENCHMARKS.md, "The drain").
#[derive(Debug, Clone, Default)]
pub struct MarkPlan {
    /// Acknowledged, in no mark yet.
    waiting: Vec<i64>,
    /// The mark being committed.
    in_flight: Vec<i64>,
    /// No mark starts before this (the last one failed).
    retry_at: Option<Duration>,
}

/// How soon a failed mark is tried again.
pub const MARK_RETRY: Duration = Duration::from_millis(250);
/// Acknowledged rows not yet marked (waiting and in flight) past which the
/// publisher sends nothing new until a mark commits: bounds this memory and
/// what a crash sends again while the store refuses writes.
pub const MAX_UNMARKED: usize = 8192;

impl MarkPlan {
    /// The broker acknowledged row `id`.
    pub fn acked(&mut self, id: i64) {
        self.waiting.push(id);
    }

    /// The rows to mark now, if a mark is due: some wait, none is in
    /// flight, and the last failure is [`MARK_RETRY`] old. They are in
    /// flight until [`MarkPlan::committed`] or [`MarkPlan::failed`].
    pub fn take(&mut self, now: Duration) -> Option<Vec<i64>> {
        if now < self.due_at()? {
            return None;
        }
        self.in_flight = std::mem::take(&mut self.waiting);
        Some(self.in_flight.clone())
    }

    /// When [`MarkPlan::take`] will give a mark, if anything waits and no
    /// mark is in flight.
    pub fn due_at(&self) -> Option<Duration> {
        if !self.in_flight.is_empty() || self.waiting.is_empty() {
            return None;
        }
        Some(self.retry_at.unwrap_or_default())
    }

    /// The mark in flight committed.
    pub fn committed(&mut self) {
        self.in_flight.clear();
        self.retry_at = None;
    }

    /// The mark in flight failed at `now`: its rows wait again, first in
    /// line, and are tried after [`MARK_RETRY`].
    pub fn failed(&mut self, now: Duration) {
        if self.in_flight.is_empty() {
            return;
        }
        let mut rows = std::mem::take(&mut self.in_flight);
        rows.append(&mut self.waiting);
        self.waiting = rows;
        self.retry_at = Some(now + MARK_RETRY);
    }

    /// Acknowledged rows not yet marked sent.
    pub fn unmarked(&self) -> usize {
        self.waiting.len() + self.in_flight.len()
    }

    /// Whether the publisher should hold new rows back ([`MAX_UNMARKED`]).
    pub fn full(&self) -> bool {
        self.unmarked() >= MAX_UNMARKED
    }
}

/// The publisher's window: its publishes awaiting their PUBACK, bounded by
/// count and by bytes (what rumqttc and the publisher hold for each until it
/// is acknowledged: the signed envelope and its topic). Rows drain at about
/// a window per PUBACK delay, so the count must cover what the hub produces
/// while a PUBACK is on its way (see [`crate::sync::publisher::WINDOW`]);
/// the bytes keep a window of large rows (alerts, erasure results) from
/// costing more memory than the hub's own receive window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishWindow {
    /// Publishes awaiting their PUBACK at most.
    pub messages: usize,
    /// Their envelope and topic bytes at most (one publish larger than this
    /// still goes, alone).
    pub bytes: usize,
}

impl PublishWindow {
    /// How many more publishes the count leaves room for, with `in_flight`
    /// awaiting their PUBACK: the most rows worth reading from the outbox.
    pub fn room(&self, in_flight: usize) -> usize {
        self.messages.saturating_sub(in_flight)
    }

    /// Whether one more publish of `len` bytes may go while `in_flight`
    /// publishes of `in_flight_bytes` in all await their PUBACK.
    pub fn admits(&self, in_flight: usize, in_flight_bytes: usize, len: usize) -> bool {
        in_flight == 0
            || (in_flight < self.messages && in_flight_bytes.saturating_add(len) <= self.bytes)
    }
}

/// Reconnect delays: a [`Backoff`] from [`RECONNECT_START`] to
/// [`RECONNECT_MAX`], each delay a full-jitter draw
/// ([`Backoff::next_delay`]).
///
/// rumqttc reconnects as fast as it is polled; without this a down broker
/// would be hammered in a tight loop, and a fleet of hubs would reconnect in
/// lockstep after a broker restart. "Full jitter": each delay is uniform in
/// `[0, step]`, the step doubling from [`RECONNECT_START`] to
/// [`RECONNECT_MAX`]. So when a broker restart drops every hub at once,
/// their first attempts are spread evenly over the first interval (1 s):
/// the broker sees about N connects in that second rather than N at once,
/// and each later round is spread over a window twice as long. A single
/// hub on a flaky link is back within 0.5 s on average.
pub fn reconnect_backoff() -> Backoff {
    Backoff::new(RECONNECT_START, RECONNECT_MAX)
}

pub const RECONNECT_START: Duration = Duration::from_secs(1);
pub const RECONNECT_MAX: Duration = Duration::from_secs(30);

/// When the retained status must be published again (mqtt.md 'Status'):
/// at least every [`HEALTH_EVERY`], and at once when what the cloud
/// watches changes (`key`: link states, open alerts, clock trust).
#[derive(Debug, Clone)]
pub struct HealthSchedule<K> {
    every: Duration,
    last: Option<(Duration, K)>,
}

/// The retained status is refreshed at least this often.
pub const HEALTH_EVERY: Duration = Duration::from_secs(60);

impl<K: PartialEq> HealthSchedule<K> {
    pub fn new(every: Duration) -> Self {
        HealthSchedule { every, last: None }
    }

    /// Whether a status with `key` must go out now.
    pub fn due(&self, key: &K, now: Duration) -> bool {
        match &self.last {
            None => true,
            Some((at, last)) => last != key || now.saturating_sub(*at) >= self.every,
        }
    }

    /// A status with `key` went out at `now`.
    pub fn sent(&mut self, key: K, now: Duration) {
        self.last = Some((now, key));
    }

    /// Forget the last one (a new connection publishes at once).
    pub fn reset(&mut self) {
        self.last = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL_WINDOW: PublishWindow = PublishWindow {
        messages: 3,
        bytes: 1000,
    };

    #[test]
    fn the_publish_window_admits_a_row_only_while_count_and_bytes_both_leave_room() {
        let w = SMALL_WINDOW;
        assert!(w.admits(0, 0, 400));
        assert!(w.admits(1, 400, 400));
        assert!(w.admits(2, 800, 200), "exactly the byte bound");
        assert!(!w.admits(2, 800, 201), "one byte past it");
        assert!(!w.admits(3, 30, 10), "the count is full");
        assert_eq!(w.room(1), 2);
        assert_eq!(w.room(3), 0);
        assert_eq!(w.room(7), 0, "never negative");
    }

    #[test]
    fn a_publish_larger_than_the_byte_bound_still_goes_alone() {
        let w = SMALL_WINDOW;
        assert!(w.admits(0, 0, 5000));
        assert!(!w.admits(1, 10, 5000), "but not beside another");
    }

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }
    fn view(watermark: u64, gap: bool) -> SeqView {
        SeqView { watermark, gap }
    }

    #[test]
    fn a_fresh_session_asks_from_the_watermark_plus_one_at_once() {
        let mut p = SyncPlanner::new(view(0, false));
        p.on_session(false, 1, s(0));
        assert_eq!(
            p.poll(s(0)),
            Some(SyncRequest {
                from_seq: 1,
                reason: SyncReason::FreshSession
            })
        );
        assert_eq!(p.poll(s(0)), None);
    }

    #[test]
    fn a_resumed_session_asks_for_nothing() {
        let mut p = SyncPlanner::new(view(7, false));
        p.on_session(true, 1, s(0));
        assert_eq!(p.poll(s(100)), None);
        assert_eq!(p.next_deadline(), None);
    }

    #[test]
    fn an_unanswered_request_repeats_with_doubling_backoff_capped_at_five_minutes() {
        let mut p = SyncPlanner::new(view(3, false));
        p.on_session(false, 1, s(0));
        let mut sent_at = vec![];
        let mut t = s(0);
        while t < s(2000) {
            if p.poll(t).is_some() {
                sent_at.push(t.as_secs());
            }
            t += Duration::from_millis(500);
        }
        assert_eq!(&sent_at[..10], &[0, 1, 3, 7, 15, 31, 63, 127, 255, 511]);
        assert_eq!(sent_at[10] - sent_at[9], 300);
        assert_eq!(sent_at[11] - sent_at[10], 300);
    }

    #[test]
    fn a_fresh_session_request_stops_once_a_checkpoint_is_at_or_below_the_watermark() {
        let mut p = SyncPlanner::new(view(0, false));
        p.on_session(false, 1, s(0));
        assert!(p.poll(s(0)).is_some());
        // Events alone do not end it: the hub cannot know nothing else was lost.
        p.on_event(view(12, false), s(1));
        assert_eq!(p.poll(s(1)).map(|r| r.from_seq), Some(13));
        p.on_checkpoint(12, 1, view(12, false), s(2));
        assert_eq!(p.poll(s(1000)), None);
        assert_eq!(p.next_deadline(), None);
    }

    #[test]
    fn a_checkpoint_that_came_on_the_connection_before_does_not_end_a_fresh_session() {
        let mut p = SyncPlanner::new(view(12, false));
        // Connection 3 starts fresh; a checkpoint taken in on connection 2
        // commits after that.
        p.on_session(false, 3, s(0));
        assert!(p.poll(s(0)).is_some());
        p.on_checkpoint(12, 2, view(12, false), s(1));
        assert_eq!(
            p.poll(s(1)).map(|r| r.reason),
            Some(SyncReason::FreshSession),
            "still asking"
        );
        p.on_checkpoint(12, 3, view(12, false), s(2));
        assert_eq!(p.poll(s(1000)), None);
    }

    #[test]
    fn a_gap_asks_at_once_from_the_first_missing_seq_and_stops_when_it_closes() {
        let mut p = SyncPlanner::new(view(5, false));
        p.on_event(view(5, true), s(10));
        assert_eq!(
            p.poll(s(10)),
            Some(SyncRequest {
                from_seq: 6,
                reason: SyncReason::Gap
            })
        );
        assert_eq!(p.poll(s(10)), None);
        assert!(p.poll(s(11)).is_some(), "repeats after 1 s");
        p.on_event(view(9, false), s(12));
        assert_eq!(p.poll(s(1000)), None);
    }

    #[test]
    fn a_gap_during_a_fresh_session_request_is_sent_at_once_with_reason_gap() {
        let mut p = SyncPlanner::new(view(0, false));
        p.on_session(false, 1, s(0));
        assert!(p.poll(s(0)).is_some());
        p.on_event(view(0, true), s(0));
        assert_eq!(p.poll(s(0)).map(|r| r.reason), Some(SyncReason::Gap));
        // Gap closed, the fresh session is still unconfirmed: back to it.
        p.on_event(view(4, false), s(0));
        assert_eq!(
            p.poll(s(0)).map(|r| r.reason),
            Some(SyncReason::FreshSession)
        );
    }

    #[test]
    fn a_checkpoint_above_the_watermark_asks_behind_checkpoint_until_caught_up() {
        let mut p = SyncPlanner::new(view(10, false));
        p.on_checkpoint(11, 1, view(10, false), s(0));
        assert_eq!(
            p.poll(s(0)),
            Some(SyncRequest {
                from_seq: 11,
                reason: SyncReason::BehindCheckpoint
            })
        );
        p.on_event(view(11, false), s(1));
        assert_eq!(p.poll(s(100)), None);
    }

    #[test]
    fn after_a_restart_the_hub_still_asks_until_the_watermark_reaches_the_last_checkpoint() {
        let start = SeqStart {
            view: view(10, false),
            checkpoint_head: 14,
        };
        let mut p = SyncPlanner::resume(start, s(0), Duration::ZERO, 0);
        // Nothing is sent before the session is up; then at once.
        p.on_session(true, 1, s(1));
        assert_eq!(
            p.poll(s(1)),
            Some(SyncRequest {
                from_seq: 11,
                reason: SyncReason::BehindCheckpoint
            })
        );
        // An event that does not reach the head does not end it.
        p.on_event(view(12, false), s(2));
        assert_eq!(p.poll(s(2)).map(|r| r.from_seq), Some(13));
        p.on_event(view(14, false), s(3));
        assert_eq!(p.poll(s(1000)), None);
        assert_eq!(p.next_deadline(), None);
        // Caught up before the restart: nothing to ask.
        let caught_up = SeqStart {
            view: view(14, false),
            checkpoint_head: 14,
        };
        let mut p = SyncPlanner::resume(caught_up, s(0), Duration::ZERO, 0);
        p.on_session(true, 1, s(0));
        assert_eq!(p.poll(s(0)), None);
    }

    #[test]
    fn a_checkpoint_at_the_watermark_asks_for_nothing() {
        let mut p = SyncPlanner::new(view(12, false));
        p.on_checkpoint(12, 1, view(12, false), s(0));
        assert_eq!(p.poll(s(0)), None);
    }

    #[test]
    fn the_request_body_is_the_contracts_json() {
        let r = SyncRequest {
            from_seq: 13,
            reason: SyncReason::BehindCheckpoint,
        };
        let v: serde_json::Value = serde_json::from_slice(&r.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"from_seq": 13, "reason": "behind_checkpoint"})
        );
    }

    #[test]
    fn cloud_stale_is_raised_after_the_period_without_life_and_cleared_by_the_next() {
        let mut t = StaleTracker::new(s(900), s(0), false);
        assert_eq!(t.poll(s(899)), None);
        assert_eq!(t.poll(s(900)), Some(AlertChange::Raise));
        assert_eq!(t.poll(s(909)), None, "raised once");
        assert_eq!(t.next_deadline(), Some(s(910)));
        assert_eq!(t.poll(s(910)), Some(AlertChange::Holds), "said again");
        assert_eq!(t.poll(s(915)), None);
        assert_eq!(t.on_life(s(2001)), Some(AlertChange::Clear));
        assert_eq!(t.on_life(s(2002)), None);
        assert_eq!(t.poll(s(2002 + 899)), None);
        assert_eq!(t.poll(s(2002 + 900)), Some(AlertChange::Raise));
    }

    #[test]
    fn a_restart_carries_over_the_silence_since_the_last_sign_of_life() {
        // 600 s of silence before the restart: 300 s more raise it.
        let mut t = StaleTracker::resume(s(900), s(0), false, s(600));
        assert_eq!(t.next_deadline(), Some(s(300)));
        assert_eq!(t.poll(s(299)), None);
        assert_eq!(t.poll(s(300)), Some(AlertChange::Raise));
        // Silent for longer than the period: raised at once.
        let mut t = StaleTracker::resume(s(900), s(0), false, s(5000));
        assert_eq!(t.poll(s(0)), Some(AlertChange::Raise));
        // A sign of life starts a full period again.
        let mut t = StaleTracker::resume(s(900), s(0), false, s(600));
        assert_eq!(t.on_life(s(10)), None);
        assert_eq!(t.poll(s(909)), None);
        assert_eq!(t.poll(s(910)), Some(AlertChange::Raise));
    }

    #[test]
    fn a_stale_alert_left_raised_by_the_last_run_is_cleared_by_the_first_sign_of_life() {
        let mut t = StaleTracker::new(s(900), s(0), true);
        assert_eq!(t.poll(s(100)), None, "not silent long enough in this run");
        assert_eq!(
            t.poll(s(5000)),
            Some(AlertChange::Holds),
            "silent: it holds, no new occurrence"
        );
        assert_eq!(t.on_life(s(5000)), Some(AlertChange::Clear));
    }

    #[test]
    fn the_backlog_alert_follows_depth_and_age_both_ways() {
        let mut m = BacklogMonitor::new(BacklogLimits::default(), false);
        assert_eq!(m.observe(10_000, Some(s(10))), None);
        assert_eq!(m.observe(10_001, Some(s(10))), Some(AlertChange::Raise));
        assert_eq!(m.observe(20_000, Some(s(10))), Some(AlertChange::Holds));
        assert_eq!(m.observe(5, Some(s(10))), Some(AlertChange::Clear));
        assert_eq!(m.observe(5, Some(s(3601))), Some(AlertChange::Raise));
        assert_eq!(m.observe(0, None), Some(AlertChange::Clear));
    }

    #[test]
    fn a_cloud_stale_clear_whose_write_failed_is_said_again_while_the_cloud_stays_alive() {
        let mut t = StaleTracker::new(s(900), s(0), true);
        assert_eq!(t.on_life(s(10)), Some(AlertChange::Clear));
        t.write_failed(AlertChange::Clear, s(10));
        assert_eq!(t.next_deadline(), Some(s(20)));
        assert_eq!(t.poll(s(19)), None);
        assert_eq!(t.poll(s(20)), Some(AlertChange::Clear), "said again");
        t.write_failed(AlertChange::Clear, s(20));
        assert_eq!(t.poll(s(30)), Some(AlertChange::Clear), "and again");
        assert_eq!(t.poll(s(40)), None, "written: nothing more to say");
        assert_eq!(t.next_deadline(), Some(s(910)));
        // A silence that comes back first raises it as usual.
        t.write_failed(AlertChange::Clear, s(40));
        assert_eq!(t.poll(s(910)), Some(AlertChange::Raise));
        assert_eq!(t.poll(s(911)), None, "no clear left over");
    }

    #[test]
    fn a_backlog_clear_whose_write_failed_is_said_again_at_the_next_look() {
        let mut m = BacklogMonitor::new(BacklogLimits::default(), true);
        assert_eq!(m.observe(5, None), Some(AlertChange::Clear));
        m.write_failed(AlertChange::Clear);
        assert_eq!(m.observe(5, None), Some(AlertChange::Clear), "said again");
        assert_eq!(m.observe(5, None), None, "written");
        // A failed raise is mended by the next look's Holds.
        assert_eq!(m.observe(10_001, None), Some(AlertChange::Raise));
        m.write_failed(AlertChange::Raise);
        assert_eq!(m.observe(10_001, None), Some(AlertChange::Holds));
    }

    #[test]
    fn reconnect_delays_are_uniform_up_to_a_step_that_doubles_from_1_s_to_30_s() {
        let mut b = reconnect_backoff();
        assert_eq!(b.next_delay(0), Duration::ZERO, "full jitter starts at 0");
        let mut steps = vec![];
        for _ in 0..8 {
            steps.push(b.peek());
            // u64::MAX % (span + 1) is the largest a draw can give here only
            // when span + 1 divides 2^64; take the step itself as the bound.
            let d = b.next_delay(u64::MAX);
            assert!(d <= *steps.last().unwrap());
        }
        assert_eq!(
            steps,
            [2, 4, 8, 16, 30, 30, 30, 30]
                .map(Duration::from_secs)
                .to_vec()
        );
        b.reset();
        assert_eq!(b.peek(), RECONNECT_START);
        assert!(b.next_delay(u64::MAX) <= RECONNECT_START);
    }

    /// The fleet property: N hubs dropped at once by a broker restart.
    #[test]
    fn a_fleet_dropped_at_once_reconnects_spread_over_the_first_second() {
        let n = 1000;
        let mut rng = Jitter::new(12345);
        let mut per_100ms = [0usize; 10];
        for _ in 0..n {
            let mut b = reconnect_backoff();
            let d = b.next_delay(rng.next_u64());
            assert!(d <= RECONNECT_START);
            per_100ms[(d.as_millis() as usize / 100).min(9)] += 1;
        }
        // Uniform: 100 per bucket expected; no bucket near the whole fleet.
        for (i, c) in per_100ms.iter().enumerate() {
            assert!((50..=150).contains(c), "bucket {i}: {c} of {n}");
        }
    }

    #[test]
    fn a_jittered_planner_sends_its_first_request_within_the_jitter_and_repeats_on_schedule() {
        let mut first = vec![];
        for seed in 0..200 {
            let mut p = SyncPlanner::with_jitter(view(4, false), SYNC_JITTER, seed);
            p.on_checkpoint(9, 1, view(4, false), s(10));
            let due = p.next_deadline().expect("a request is planned");
            assert!(due >= s(10) && due <= s(10) + SYNC_JITTER, "seed {seed}");
            assert_eq!(p.poll(due).map(|r| r.from_seq), Some(5));
            // Repeats follow the backoff from the hub's own first send.
            assert_eq!(p.next_deadline(), Some(due + SYNC_BACKOFF_START));
            first.push(due - s(10));
        }
        let spread = first
            .iter()
            .max()
            .unwrap()
            .saturating_sub(*first.iter().min().unwrap());
        assert!(spread > SYNC_JITTER / 2, "200 hubs spread over {spread:?}");
    }

    #[test]
    fn jitter_never_delays_a_request_that_was_already_due() {
        let mut p = SyncPlanner::with_jitter(view(0, false), SYNC_JITTER, 99);
        p.on_session(false, 1, s(0));
        let due = p.next_deadline().unwrap();
        // A more specific reason arrives before the first request went out.
        p.on_event(view(0, true), s(0));
        assert!(p.next_deadline().unwrap() <= due);
        assert_eq!(p.poll(due).map(|r| r.reason), Some(SyncReason::Gap));
    }

    #[test]
    fn the_status_is_republished_every_minute_and_at_once_when_its_key_changes() {
        let mut h = HealthSchedule::new(HEALTH_EVERY);
        assert!(h.due(&1, s(0)), "the first one goes out at once");
        h.sent(1, s(0));
        assert!(!h.due(&1, s(59)));
        assert!(h.due(&1, s(60)));
        assert!(h.due(&2, s(5)), "a change goes out at once");
        h.sent(2, s(5));
        assert!(!h.due(&2, s(6)));
        h.reset();
        assert!(h.due(&2, s(6)));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn acknowledged_rows_are_marked_at_once_when_no_mark_is_in_flight() {
        let mut m = MarkPlan::default();
        assert_eq!(m.take(ms(0)), None, "nothing to mark");
        m.acked(1);
        m.acked(2);
        assert_eq!(m.due_at(), Some(ms(0)));
        assert_eq!(m.take(ms(10)), Some(vec![1, 2]));
    }

    #[test]
    fn only_one_mark_is_in_flight_and_acks_meanwhile_go_into_the_next() {
        let mut m = MarkPlan::default();
        m.acked(1);
        assert_eq!(m.take(ms(0)), Some(vec![1]));
        m.acked(2);
        m.acked(3);
        assert_eq!(m.take(ms(500)), None, "the first is still in flight");
        assert_eq!(m.due_at(), None);
        assert_eq!(m.unmarked(), 3);
        m.committed();
        assert_eq!(m.take(ms(500)), Some(vec![2, 3]));
        m.committed();
        assert_eq!(m.unmarked(), 0);
    }

    #[test]
    fn a_failed_mark_is_tried_again_after_the_retry_delay_with_the_acks_behind_it() {
        let mut m = MarkPlan::default();
        m.acked(1);
        m.acked(2);
        assert_eq!(m.take(ms(0)), Some(vec![1, 2]));
        m.acked(3);
        m.failed(ms(10));
        assert_eq!(m.unmarked(), 3, "nothing acknowledged is forgotten");
        assert_eq!(m.take(ms(10) + MARK_RETRY - ms(1)), None);
        assert_eq!(m.take(ms(10) + MARK_RETRY), Some(vec![1, 2, 3]));
        m.committed();
        m.acked(4);
        assert_eq!(m.due_at(), Some(ms(0)), "a commit ends the retry delay");
    }

    #[test]
    fn the_publisher_holds_new_rows_back_once_too_many_acks_are_unmarked() {
        let mut m = MarkPlan::default();
        for id in 0..MAX_UNMARKED as i64 - 1 {
            m.acked(id);
        }
        assert!(!m.full());
        assert!(m.take(ms(0)).is_some());
        m.acked(MAX_UNMARKED as i64);
        assert!(m.full(), "rows in flight count too");
        m.committed();
        assert!(!m.full());
    }
}
