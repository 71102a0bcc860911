//! The reliability rules of `serial.md` as a clock-free state machine.
//!
//! One [`Link`] per serial port, generic over the direction: the board runs
//! `Link<Uplink, Downlink>` ([`BoardLink`]), the hub runs
//! `Link<Downlink, Uplink>` ([`HubLink`]). The same code therefore enforces
//! the rules on the MCU, in the hub and in tests. It never reads a clock:
//! every call that cares about time takes `now_ms` (any monotonic
//! millisecond counter), so tests can step time exactly.
//!
//! What the link does by itself:
//! - stamps seqs (1, 2, ... 65535, 1, ...) on sequenced messages, keeps them
//!   in a bounded pending table, resends after 250 ms without an Ack, and
//!   reports [`LinkEvent::Failed`] after the 4th unanswered send;
//! - acks every sequenced copy it receives but hands each seq to the caller
//!   once (it remembers the last [`SEEN_WINDOW`] seqs), and forgets them when
//!   the peer says `Hello`; a seq that comes back with *different* content
//!   is not a resend and is delivered (see [`LinkStats::seq_reused`]);
//! - answers `Ping` with `Pong`, sends `Ping` if configured (hub), and tracks
//!   liveness (down after 6 s without a valid frame, up on the next one);
//! - on the hub, refuses `Unlock` until the board has answered the hub's
//!   `Hello` ([`Link::ready`]), resending that `Hello` until it does.
//!
//! How to drive it, in any order per loop iteration: pass each decoded frame
//! to [`Link::on_rx`] and act on what it returns; call [`Link::send`] for
//! new messages; call [`Link::poll`] with the current time; then drain
//! [`Link::pop_event`] and [`Link::pop_tx`] (encode and write each message).

use core::marker::PhantomData;

use heapless::{Deque, Vec};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::frame::{MAX_PAYLOAD, crc32};
use crate::msg::{Downlink, Uplink};

/// How many received seqs a link remembers to spot resent copies
/// (`serial.md`: "at least the last 32").
pub const SEEN_WINDOW: usize = 32;
/// Outgoing sequenced messages that may await an Ack at once. Eight covers a
/// 4-door board with every door busy plus sensors; when it is full,
/// [`Link::send`] says so rather than dropping silently.
pub const PENDING_MAX: usize = 8;
/// Messages waiting to be written to the port.
pub const OUTBOX_MAX: usize = 16;
/// Events waiting for the caller.
pub const EVENTS_MAX: usize = 16;

/// What a message type must tell the link. Implemented for [`Uplink`] and
/// [`Downlink`]; the link is written only against this trait, so one
/// implementation serves both ends.
pub trait Wire: Serialize + DeserializeOwned + Clone {
    /// The seq of a sequenced message (one that must be acked), else `None`.
    fn seq(&self) -> Option<u16>;
    /// The same message carrying `seq` (unchanged if not sequenced).
    fn with_seq(self, seq: u16) -> Self;
    /// `Some(seq)` if this is an `Ack{seq}`.
    fn acked_seq(&self) -> Option<u16>;
    /// An `Ack{seq}` in this direction.
    fn ack(seq: u16) -> Self;
    /// True for `Hello`: the sender (re)started a session.
    fn is_hello(&self) -> bool;
    /// True if this message may only go out once the link is
    /// [`Link::ready`] (the hub's `Unlock`).
    fn needs_ready(&self) -> bool {
        false
    }
    /// `Some(nonce)` if this is a `Ping`.
    fn ping_nonce(&self) -> Option<u32> {
        None
    }
    /// A `Ping` in this direction, if this direction pings.
    fn ping(_nonce: u32) -> Option<Self> {
        None
    }
    /// A `Pong` in this direction, if this direction answers pings.
    fn pong(_nonce: u32) -> Option<Self> {
        None
    }
}

impl Wire for Uplink {
    fn seq(&self) -> Option<u16> {
        match self {
            Uplink::Keypad { seq, .. }
            | Uplink::DoorSensor { seq, .. }
            | Uplink::Tamper { seq } => Some(*seq),
            _ => None,
        }
    }
    fn with_seq(mut self, new: u16) -> Self {
        if let Uplink::Keypad { seq, .. }
        | Uplink::DoorSensor { seq, .. }
        | Uplink::Tamper { seq } = &mut self
        {
            *seq = new;
        }
        self
    }
    fn acked_seq(&self) -> Option<u16> {
        match self {
            Uplink::Ack { seq } => Some(*seq),
            _ => None,
        }
    }
    fn ack(seq: u16) -> Self {
        Uplink::Ack { seq }
    }
    fn is_hello(&self) -> bool {
        matches!(self, Uplink::Hello { .. })
    }
    fn ping_nonce(&self) -> Option<u32> {
        None
    }
    fn pong(nonce: u32) -> Option<Self> {
        Some(Uplink::Pong { nonce })
    }
}

impl Wire for Downlink {
    fn seq(&self) -> Option<u16> {
        match self {
            Downlink::Unlock { seq, .. } | Downlink::Deny { seq, .. } => Some(*seq),
            _ => None,
        }
    }
    fn with_seq(mut self, new: u16) -> Self {
        if let Downlink::Unlock { seq, .. } | Downlink::Deny { seq, .. } = &mut self {
            *seq = new;
        }
        self
    }
    fn acked_seq(&self) -> Option<u16> {
        match self {
            Downlink::Ack { seq } => Some(*seq),
            _ => None,
        }
    }
    fn ack(seq: u16) -> Self {
        Downlink::Ack { seq }
    }
    fn is_hello(&self) -> bool {
        matches!(self, Downlink::Hello { .. })
    }
    fn needs_ready(&self) -> bool {
        matches!(self, Downlink::Unlock { .. })
    }
    fn ping_nonce(&self) -> Option<u32> {
        match self {
            Downlink::Ping { nonce } => Some(*nonce),
            _ => None,
        }
    }
    fn ping(nonce: u32) -> Option<Self> {
        Some(Downlink::Ping { nonce })
    }
}

/// The board's end of a port.
pub type BoardLink = Link<Uplink, Downlink>;
/// The hub's end of a port.
pub type HubLink = Link<Downlink, Uplink>;

/// Timings. [`LinkConfig::board`] and [`LinkConfig::hub`] are the contract's
/// values; tests and odd deployments may change them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkConfig {
    /// Resend a sequenced message after this long without its Ack (250).
    pub resend_after_ms: u64,
    /// Sends in all, first one included, before giving up (4).
    pub max_sends: u8,
    /// No valid frame for this long means the link is down (6000).
    pub down_after_ms: u64,
    /// Send `Ping` this often (hub: 2000; board: never).
    pub ping_every_ms: Option<u64>,
    /// Resend our `Hello` this often until the peer answers (see
    /// [`Link::open_session`]). Not in the contract, which has no Ack for
    /// `Hello`; without it one lost frame would block Unlocks forever.
    pub hello_retry_ms: u64,
}

impl LinkConfig {
    /// The board's side: no pings.
    pub const fn board() -> Self {
        Self {
            resend_after_ms: 250,
            max_sends: 4,
            down_after_ms: 6000,
            ping_every_ms: None,
            hello_retry_ms: 1000,
        }
    }
    /// The hub's side: pings every 2 s.
    pub const fn hub() -> Self {
        Self {
            ping_every_ms: Some(2000),
            ..Self::board()
        }
    }
}

/// Something the caller should know about (drain with [`Link::pop_event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkEvent<Tx> {
    /// The peer acked this message (hub: `door.unlocked` for an Unlock).
    Acked(Tx),
    /// This message was sent `max_sends` times and never acked
    /// (hub: `door.unlock_unconfirmed` for an Unlock).
    Failed(Tx),
    /// A valid frame arrived while the link was not up (at start, or after
    /// it went down: clears `board_offline`).
    Up,
    /// No valid frame for `down_after_ms` (`board_offline`).
    Down,
}

/// Why [`Link::send`] refused a message. Nothing was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkError {
    /// The pending table is full of unacked messages.
    PendingFull,
    /// An `Unlock` before the board answered the hub's `Hello`.
    NotReady,
    /// The outbox is full: the caller is not draining [`Link::pop_tx`].
    OutboxFull,
}

impl core::fmt::Display for LinkError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            LinkError::PendingFull => "too many unacknowledged messages",
            LinkError::NotReady => "peer has not answered our Hello yet",
            LinkError::OutboxFull => "outbox full",
        })
    }
}

#[cfg(feature = "std")]
impl std::error::Error for LinkError {}

/// Liveness of the link as last seen by [`Link::poll`] / [`Link::on_rx`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// No valid frame yet since the link was created.
    Starting,
    /// A valid frame arrived within `down_after_ms`.
    Up,
    /// Silent for `down_after_ms` or more.
    Down,
}

/// Counters of things the link had to give up on (saturating).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Resent copies received (acked again, not delivered).
    pub duplicates: u32,
    /// Seqs received again with different content, so treated as new:
    /// the peer restarted without its `Hello` reaching us.
    pub seq_reused: u32,
    /// Acks for nothing pending (late, or for a message already failed).
    pub stale_acks: u32,
    /// Messages dropped because the outbox was full.
    pub outbox_overflow: u32,
    /// Events dropped because the caller did not drain them.
    pub event_overflow: u32,
    /// Sequenced messages that arrived between our `Hello` and the peer's
    /// answer: sent before the peer saw our `Hello`, so dropped by it.
    pub before_hello: u32,
}

struct Pending<Tx> {
    msg: Tx,
    seq: u16,
    sends: u8,
    last_sent_ms: u64,
}

/// Ring of recently received seqs, each with a fingerprint of the message.
///
/// Why the fingerprint: a resent copy is byte-identical to the original, so
/// "same seq, different content" cannot be a resend. It happens when the
/// peer restarted and its `Hello` was lost (the contract has no ack for
/// `Hello`); without this, the restarted board's first 32 entries would be
/// acked and silently ignored as duplicates.
struct SeqWindow {
    seqs: [(u16, u32); SEEN_WINDOW],
    len: usize,
    next: usize,
}

/// What the window says about a received seq.
enum Seen {
    New,
    Duplicate,
    /// Seq seen before with other content: the peer reused it.
    Reused,
}

impl SeqWindow {
    const fn new() -> Self {
        Self {
            seqs: [(0, 0); SEEN_WINDOW],
            len: 0,
            next: 0,
        }
    }
    /// Look `seq` up and remember it with `fp`.
    fn check_and_insert(&mut self, seq: u16, fp: u32) -> Seen {
        let found = self.seqs.iter_mut().take(self.len).find(|(s, _)| *s == seq);
        match found {
            Some((_, old)) if *old == fp => Seen::Duplicate,
            Some((_, old)) => {
                *old = fp;
                Seen::Reused
            }
            None => {
                if let Some(slot) = self.seqs.get_mut(self.next) {
                    *slot = (seq, fp);
                }
                self.next = (self.next + 1) % SEEN_WINDOW;
                self.len = (self.len + 1).min(SEEN_WINDOW);
                Seen::New
            }
        }
    }
    fn clear(&mut self) {
        self.len = 0;
        self.next = 0;
    }
}

/// CRC-32 of the message's postcard encoding; identical for resent copies.
fn fingerprint<M: Serialize>(msg: &M) -> u32 {
    let mut buf = [0u8; MAX_PAYLOAD];
    postcard::to_slice(msg, &mut buf).map_or(0, |b| crc32(b))
}

/// One end of one serial link. See the module docs for the driving loop.
pub struct Link<Tx, Rx> {
    cfg: LinkConfig,
    next_seq: u16,
    pending: Vec<Pending<Tx>, PENDING_MAX>,
    seen: SeqWindow,
    outbox: Deque<Tx, OUTBOX_MAX>,
    events: Deque<LinkEvent<Tx>, EVENTS_MAX>,
    liveness: Liveness,
    last_valid_ms: u64,
    ready: bool,
    hello: Option<(Tx, u64)>,
    next_ping_ms: u64,
    next_nonce: u32,
    stats: LinkStats,
    _rx: PhantomData<fn(Rx)>,
}

impl<Tx: Wire, Rx: Wire> Link<Tx, Rx> {
    /// A fresh link at `now_ms`: no seqs used or seen, liveness
    /// [`Liveness::Starting`] (down after `down_after_ms` of silence), not
    /// [`ready`](Self::ready).
    pub fn new(cfg: LinkConfig, now_ms: u64) -> Self {
        Self {
            cfg,
            next_seq: 1,
            pending: Vec::new(),
            seen: SeqWindow::new(),
            outbox: Deque::new(),
            events: Deque::new(),
            liveness: Liveness::Starting,
            last_valid_ms: now_ms,
            ready: false,
            hello: None,
            next_ping_ms: now_ms,
            next_nonce: 1,
            stats: LinkStats::default(),
            _rx: PhantomData,
        }
    }

    /// Start a session by sending our `hello` (hub: `Hello{session}` each
    /// time it opens the port). Until the peer's `Hello` arrives the link is
    /// not [`ready`](Self::ready), and `hello` is resent every
    /// `hello_retry_ms`.
    pub fn open_session(&mut self, hello: Tx, now_ms: u64) {
        self.ready = false;
        self.push_out(hello.clone());
        self.hello = Some((hello, now_ms));
    }

    /// True once the peer has said `Hello` since the link was created or
    /// [`open_session`](Self::open_session) was last called. The hub sends
    /// no `Unlock` before that ([`Link::send`] refuses it).
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// Queue a message. A sequenced one gets the next seq, returned, and is
    /// kept until acked or failed; the caller's seq field is overwritten.
    pub fn send(&mut self, msg: Tx, now_ms: u64) -> Result<Option<u16>, LinkError> {
        if msg.needs_ready() && !self.ready {
            return Err(LinkError::NotReady);
        }
        if self.outbox.is_full() {
            return Err(LinkError::OutboxFull);
        }
        if msg.seq().is_none() {
            self.push_out(msg);
            return Ok(None);
        }
        if self.pending.is_full() {
            return Err(LinkError::PendingFull);
        }
        let seq = self.take_seq();
        let msg = msg.with_seq(seq);
        self.push_out(msg.clone());
        // Cannot fail: checked `is_full` above.
        let _ = self.pending.push(Pending {
            msg,
            seq,
            sends: 1,
            last_sent_ms: now_ms,
        });
        Ok(Some(seq))
    }

    /// Handle one valid received message. Returns it if the caller should
    /// act on it: not for Acks (they become [`LinkEvent::Acked`]) nor for
    /// resent copies of a seq already delivered. Acks and Pongs owed to the
    /// peer are queued here. `Hello` and `Ping` are returned too, for the
    /// caller's information (the board answers `Hello` with its own).
    pub fn on_rx(&mut self, msg: Rx, now_ms: u64) -> Option<Rx> {
        self.last_valid_ms = now_ms;
        if self.liveness != Liveness::Up {
            self.liveness = Liveness::Up;
            self.push_event(LinkEvent::Up);
        }

        if let Some(seq) = msg.acked_seq() {
            match self.pending.iter().position(|p| p.seq == seq) {
                Some(i) => {
                    let p = self.pending.remove(i);
                    self.push_event(LinkEvent::Acked(p.msg));
                }
                None => self.stats.stale_acks = self.stats.stale_acks.saturating_add(1),
            }
            return None;
        }

        if msg.is_hello() {
            // The peer (re)started a session: its seqs start again at 1.
            self.seen.clear();
            self.ready = true;
            self.hello = None;
        }

        if let Some(nonce) = msg.ping_nonce()
            && let Some(pong) = Tx::pong(nonce)
        {
            self.push_out(pong);
        }

        if let Some(seq) = msg.seq() {
            // Between our `Hello` and the peer's answer, a sequenced message
            // was sent before the peer saw our `Hello` (the line keeps
            // order), and the peer has dropped it: a Keypad from before the
            // hub's `Hello` is never decided after it (serial.md
            // 'Reliability rules'). Not acked either: every acked Keypad
            // ends in an audit row, and this one the guest types again.
            if self.hello.is_some() {
                self.stats.before_hello = self.stats.before_hello.saturating_add(1);
                return None;
            }
            self.push_out(Tx::ack(seq));
            match self.seen.check_and_insert(seq, fingerprint(&msg)) {
                Seen::New => {}
                Seen::Duplicate => {
                    self.stats.duplicates = self.stats.duplicates.saturating_add(1);
                    return None;
                }
                Seen::Reused => {
                    self.stats.seq_reused = self.stats.seq_reused.saturating_add(1);
                }
            }
        }
        Some(msg)
    }

    /// Advance timers to `now_ms`: resends, failures, liveness, pings and
    /// Hello retries. Cheap; call it every loop iteration.
    pub fn poll(&mut self, now_ms: u64) {
        if self.liveness != Liveness::Down
            && now_ms.saturating_sub(self.last_valid_ms) >= self.cfg.down_after_ms
        {
            self.liveness = Liveness::Down;
            self.push_event(LinkEvent::Down);
        }

        let mut i = 0;
        while i < self.pending.len() {
            let Some(p) = self.pending.get_mut(i) else {
                break;
            };
            if now_ms.saturating_sub(p.last_sent_ms) < self.cfg.resend_after_ms {
                i += 1;
                continue;
            }
            if p.sends >= self.cfg.max_sends {
                let p = self.pending.remove(i);
                self.push_event(LinkEvent::Failed(p.msg));
                continue;
            }
            p.sends = p.sends.saturating_add(1);
            p.last_sent_ms = now_ms;
            let copy = p.msg.clone();
            self.push_out(copy);
            i += 1;
        }

        if let Some((hello, last)) = &mut self.hello
            && now_ms.saturating_sub(*last) >= self.cfg.hello_retry_ms
        {
            *last = now_ms;
            let copy = hello.clone();
            self.push_out(copy);
        }

        if let Some(every) = self.cfg.ping_every_ms
            && now_ms >= self.next_ping_ms
        {
            if let Some(ping) = Tx::ping(self.next_nonce) {
                self.next_nonce = self.next_nonce.wrapping_add(1);
                self.push_out(ping);
            }
            self.next_ping_ms = now_ms.saturating_add(every);
        }
    }

    /// Next message to encode and write, oldest first.
    pub fn pop_tx(&mut self) -> Option<Tx> {
        self.outbox.pop_front()
    }

    /// Next event for the caller, oldest first.
    pub fn pop_event(&mut self) -> Option<LinkEvent<Tx>> {
        self.events.pop_front()
    }

    /// Drop every sequenced message of ours still waiting for an Ack, and
    /// any copy of one not yet written (serial.md: on the hub's `Hello` the
    /// board drops them, so a Keypad from before it is never decided after
    /// it). No [`LinkEvent::Failed`] is reported for them. Unsequenced
    /// messages already queued (Acks, Pongs) still go out.
    pub fn drop_unacked(&mut self) {
        self.pending.clear();
        let queued = self.outbox.len();
        for _ in 0..queued {
            if let Some(m) = self.outbox.pop_front()
                && m.seq().is_none()
            {
                // Cannot fail: one was just taken out.
                let _ = self.outbox.push_back(m);
            }
        }
    }

    /// Forget the peer's seqs (done automatically on the peer's `Hello`).
    pub fn forget_peer_seqs(&mut self) {
        self.seen.clear();
    }

    /// Liveness as of the last `on_rx`/`poll`.
    pub fn liveness(&self) -> Liveness {
        self.liveness
    }

    /// True if a valid frame arrived less than `down_after_ms` before
    /// `now_ms`. Unlike [`liveness`](Self::liveness) this does not wait for
    /// the next `poll`, so a board can lock its relays the instant the
    /// link goes quiet.
    pub fn alive_at(&self, now_ms: u64) -> bool {
        self.liveness == Liveness::Up
            && now_ms.saturating_sub(self.last_valid_ms) < self.cfg.down_after_ms
    }

    /// Number of sequenced messages awaiting an Ack.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// The seq the next sequenced message will get.
    pub fn next_seq(&self) -> u16 {
        self.next_seq
    }

    /// Counters.
    pub fn stats(&self) -> LinkStats {
        self.stats
    }

    /// The timings in force.
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    fn take_seq(&mut self) -> u16 {
        let seq = self.next_seq;
        self.next_seq = if seq == u16::MAX { 1 } else { seq + 1 };
        seq
    }

    fn push_out(&mut self, msg: Tx) {
        if self.outbox.push_back(msg).is_err() {
            self.stats.outbox_overflow = self.stats.outbox_overflow.saturating_add(1);
        }
    }

    fn push_event(&mut self, ev: LinkEvent<Tx>) {
        if self.events.push_back(ev).is_err() {
            self.stats.event_overflow = self.stats.event_overflow.saturating_add(1);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::msg::{DenyReason, Pin};

    fn keypad(pin: &str) -> Uplink {
        Uplink::Keypad {
            seq: 0,
            door: 0,
            pin: Pin::from_digits(pin).unwrap(),
        }
    }

    fn unlock(door: u8) -> Downlink {
        Downlink::Unlock {
            seq: 0,
            door,
            ms: 3000,
        }
    }

    fn board_hello() -> Uplink {
        Uplink::Hello {
            board_id: 1,
            fw_major: 1,
            fw_minor: 0,
            door_count: 1,
        }
    }

    fn drain_tx<Tx: Wire, Rx: Wire>(l: &mut Link<Tx, Rx>) -> heapless::Vec<Tx, 32> {
        let mut v = heapless::Vec::new();
        while let Some(m) = l.pop_tx() {
            v.push(m).ok().unwrap();
        }
        v
    }

    fn drain_events<Tx: Wire, Rx: Wire>(l: &mut Link<Tx, Rx>) -> heapless::Vec<LinkEvent<Tx>, 32> {
        let mut v = heapless::Vec::new();
        while let Some(e) = l.pop_event() {
            v.push(e).ok().unwrap();
        }
        v
    }

    fn ready_hub(now: u64) -> HubLink {
        let mut hub = HubLink::new(LinkConfig::hub(), now);
        hub.open_session(Downlink::Hello { session: 7 }, now);
        hub.on_rx(
            Uplink::Hello {
                board_id: 1,
                fw_major: 1,
                fw_minor: 0,
                door_count: 2,
            },
            now,
        );
        drain_tx(&mut hub);
        drain_events(&mut hub);
        hub
    }

    #[test]
    fn seq_counts_from_1() {
        let mut b = BoardLink::new(LinkConfig::board(), 0);
        assert_eq!(b.send(keypad("1234"), 0), Ok(Some(1)));
        assert_eq!(b.send(Uplink::Tamper { seq: 99 }, 0), Ok(Some(2)));
        assert_eq!(drain_tx(&mut b)[1], Uplink::Tamper { seq: 2 });
    }

    #[test]
    fn seq_wraps_from_65535_to_1() {
        let mut b = BoardLink::new(LinkConfig::board(), 0);
        b.next_seq = 65535;
        assert_eq!(b.send(Uplink::Tamper { seq: 0 }, 0), Ok(Some(65535)));
        assert_eq!(b.send(Uplink::Tamper { seq: 0 }, 0), Ok(Some(1)));
    }

    #[test]
    fn unsequenced_messages_get_no_seq_and_no_pending_entry() {
        let mut b = BoardLink::new(LinkConfig::board(), 0);
        assert_eq!(b.send(Uplink::Heartbeat { uptime_s: 1 }, 0), Ok(None));
        assert_eq!(b.pending_len(), 0);
        assert_eq!(b.next_seq(), 1);
    }

    #[test]
    fn unacked_message_is_resent_every_250_ms_and_fails_after_4_sends() {
        let mut b = BoardLink::new(LinkConfig::board(), 0);
        b.send(keypad("1234"), 0).unwrap();
        assert_eq!(drain_tx(&mut b).len(), 1);
        b.poll(249);
        assert_eq!(drain_tx(&mut b).len(), 0, "no resend before 250 ms");
        for t in [250, 500, 750] {
            b.poll(t);
            let tx = drain_tx(&mut b);
            assert_eq!(tx.len(), 1, "resend at {t}");
            assert_eq!(tx[0].seq(), Some(1));
        }
        b.poll(999);
        assert!(drain_events(&mut b).is_empty());
        b.poll(1000);
        assert_eq!(drain_tx(&mut b).len(), 0, "no fifth send");
        let ev = drain_events(&mut b);
        assert!(matches!(
            ev.last(),
            Some(LinkEvent::Failed(Uplink::Keypad { seq: 1, .. }))
        ));
        assert_eq!(b.pending_len(), 0);
    }

    #[test]
    fn ack_stops_resends_and_reports_the_acked_message() {
        let mut hub = ready_hub(0);
        hub.send(unlock(1), 0).unwrap();
        drain_tx(&mut hub);
        hub.on_rx(Uplink::Ack { seq: 1 }, 100);
        let ev = drain_events(&mut hub);
        assert!(ev.contains(&LinkEvent::Acked(Downlink::Unlock {
            seq: 1,
            door: 1,
            ms: 3000
        })));
        hub.poll(5000 - 1);
        assert!(
            drain_tx(&mut hub)
                .iter()
                .all(|m| !matches!(m, Downlink::Unlock { .. }))
        );
    }

    #[test]
    fn unanswered_unlock_is_reported_failed_for_unlock_unconfirmed() {
        let mut hub = ready_hub(0);
        hub.send(unlock(0), 0).unwrap();
        for t in (0..=1000).step_by(50) {
            hub.poll(t);
        }
        let sends = drain_tx(&mut hub)
            .iter()
            .filter(|m| matches!(m, Downlink::Unlock { .. }))
            .count();
        assert_eq!(sends, 4);
        assert!(
            drain_events(&mut hub)
                .iter()
                .any(|e| matches!(e, LinkEvent::Failed(Downlink::Unlock { seq: 1, .. })))
        );
    }

    #[test]
    fn stale_ack_is_counted_and_ignored() {
        let mut b = BoardLink::new(LinkConfig::board(), 0);
        assert_eq!(b.on_rx(Downlink::Ack { seq: 42 }, 0), None);
        assert_eq!(b.stats().stale_acks, 1);
    }

    #[test]
    fn resent_keypad_is_acked_but_acted_on_once() {
        let mut hub = ready_hub(0);
        let k = Uplink::Keypad {
            seq: 5,
            door: 0,
            pin: Pin::from_digits("1234").unwrap(),
        };
        assert_eq!(hub.on_rx(k.clone(), 10), Some(k.clone()));
        assert_eq!(hub.on_rx(k.clone(), 260), None);
        assert_eq!(hub.on_rx(k.clone(), 510), None);
        let acks = drain_tx(&mut hub)
            .iter()
            .filter(|m| **m == Downlink::Ack { seq: 5 })
            .count();
        assert_eq!(acks, 3, "every copy is acked");
        assert_eq!(hub.stats().duplicates, 2);
    }

    #[test]
    fn link_remembers_at_least_the_last_32_seqs() {
        let mut b = BoardLink::new(LinkConfig::board(), 0);
        for seq in 1..=32u16 {
            assert!(
                b.on_rx(
                    Downlink::Deny {
                        seq,
                        door: 0,
                        reason: DenyReason::DENIED
                    },
                    0
                )
                .is_some()
            );
        }
        for seq in 1..=32u16 {
            let again = Downlink::Deny {
                seq,
                door: 0,
                reason: DenyReason::DENIED,
            };
            assert_eq!(b.on_rx(again, 0), None, "seq {seq} forgotten");
        }
    }

    #[test]
    fn board_hello_makes_the_hub_forget_board_seqs() {
        let mut hub = ready_hub(0);
        let t = Uplink::Tamper { seq: 1 };
        assert!(hub.on_rx(t.clone(), 0).is_some());
        hub.on_rx(
            Uplink::Hello {
                board_id: 1,
                fw_major: 1,
                fw_minor: 0,
                door_count: 2,
            },
            1,
        );
        assert!(hub.on_rx(t, 2).is_some(), "restarted board's seq 1 is new");
    }

    #[test]
    fn restarted_board_whose_hello_was_lost_is_not_ignored_as_duplicates() {
        let mut hub = ready_hub(0);
        let before = Uplink::Keypad {
            seq: 1,
            door: 0,
            pin: Pin::from_digits("1111").unwrap(),
        };
        let after = Uplink::Keypad {
            seq: 1,
            door: 0,
            pin: Pin::from_digits("2222").unwrap(),
        };
        assert!(hub.on_rx(before.clone(), 0).is_some());
        assert!(hub.on_rx(before, 10).is_none(), "a true resend");
        // Board rebooted, its Hello got lost, it counts from 1 again.
        assert_eq!(hub.on_rx(after.clone(), 5000), Some(after.clone()));
        assert_eq!(hub.stats().seq_reused, 1);
        assert!(
            hub.on_rx(after, 5250).is_none(),
            "its resend is a duplicate"
        );
    }

    #[test]
    fn hub_hello_clears_board_memory_of_hub_seqs() {
        let mut b = BoardLink::new(LinkConfig::board(), 0);
        let u = Downlink::Unlock {
            seq: 1,
            door: 0,
            ms: 10,
        };
        assert!(b.on_rx(u.clone(), 0).is_some());
        assert!(b.on_rx(u.clone(), 1).is_none());
        assert!(b.on_rx(Downlink::Hello { session: 9 }, 2).is_some());
        assert!(b.on_rx(u, 3).is_some(), "new hub session's seq 1 is new");
    }

    #[test]
    fn dropping_unacked_messages_stops_their_resends_and_unsent_copies_but_keeps_acks() {
        let mut b = BoardLink::new(LinkConfig::board(), 0);
        b.send(keypad("1234"), 0).unwrap();
        b.on_rx(
            Downlink::Deny {
                seq: 5,
                door: 0,
                reason: DenyReason::DENIED,
            },
            0,
        );
        b.drop_unacked();
        assert_eq!(b.pending_len(), 0);
        assert_eq!(drain_tx(&mut b).as_slice(), [Uplink::Ack { seq: 5 }]);
        b.poll(10_000);
        assert!(
            drain_tx(&mut b).iter().all(|m| m.seq().is_none()),
            "no resend"
        );
        assert!(
            !drain_events(&mut b)
                .iter()
                .any(|e| matches!(e, LinkEvent::Failed(_)))
        );
    }

    #[test]
    fn hub_is_not_ready_and_refuses_unlock_until_the_board_answers_hello() {
        let mut hub = HubLink::new(LinkConfig::hub(), 0);
        hub.open_session(Downlink::Hello { session: 1 }, 0);
        assert!(!hub.ready());
        assert_eq!(hub.send(unlock(0), 0), Err(LinkError::NotReady));
        // Deny is not gated by the contract.
        let deny = Downlink::Deny {
            seq: 0,
            door: 0,
            reason: DenyReason::DENIED,
        };
        assert_eq!(hub.send(deny, 0), Ok(Some(1)));
        hub.on_rx(
            Uplink::Hello {
                board_id: 1,
                fw_major: 1,
                fw_minor: 0,
                door_count: 1,
            },
            5,
        );
        assert!(hub.ready());
        assert_eq!(hub.send(unlock(0), 5), Ok(Some(2)));
    }

    #[test]
    fn a_keypad_the_board_sent_before_it_saw_our_hello_is_neither_acked_nor_acted_on() {
        let keypad = |seq| Uplink::Keypad {
            seq,
            door: 0,
            pin: Pin::from_wire_bytes(b"1234").unwrap(),
        };
        // The previous session delivered seq 5; its Ack may never have
        // reached the board before the port was reopened.
        let mut hub = HubLink::new(LinkConfig::hub(), 0);
        hub.open_session(Downlink::Hello { session: 1 }, 0);
        hub.on_rx(board_hello(), 1);
        assert!(hub.on_rx(keypad(5), 2).is_some());
        let _ = drain_tx(&mut hub);

        let mut hub = HubLink::new(LinkConfig::hub(), 10);
        hub.open_session(Downlink::Hello { session: 2 }, 10);
        let _ = drain_tx(&mut hub);
        assert_eq!(hub.on_rx(keypad(5), 11), None, "the board dropped it");
        assert!(drain_tx(&mut hub).is_empty(), "no Ack for it");
        assert_eq!(hub.stats().before_hello, 1);

        hub.on_rx(board_hello(), 12);
        assert_eq!(
            hub.on_rx(keypad(1), 13),
            Some(keypad(1)),
            "after the answer, as usual"
        );
        assert_eq!(drain_tx(&mut hub).as_slice(), &[Downlink::Ack { seq: 1 }]);
    }

    #[test]
    fn hub_resends_its_hello_until_the_board_answers() {
        let mut hub = HubLink::new(LinkConfig::hub(), 0);
        hub.open_session(Downlink::Hello { session: 3 }, 0);
        let hellos = |v: &heapless::Vec<Downlink, 32>| {
            v.iter()
                .filter(|m| **m == Downlink::Hello { session: 3 })
                .count()
        };
        assert_eq!(hellos(&drain_tx(&mut hub)), 1);
        hub.poll(999);
        assert_eq!(hellos(&drain_tx(&mut hub)), 0);
        hub.poll(1000);
        assert_eq!(hellos(&drain_tx(&mut hub)), 1);
        hub.on_rx(
            Uplink::Hello {
                board_id: 1,
                fw_major: 1,
                fw_minor: 0,
                door_count: 1,
            },
            1100,
        );
        hub.poll(5000);
        assert_eq!(hellos(&drain_tx(&mut hub)), 0);
    }

    #[test]
    fn hub_pings_every_2_s_and_board_link_answers_with_pong() {
        let mut hub = HubLink::new(LinkConfig::hub(), 0);
        let mut board = BoardLink::new(LinkConfig::board(), 0);
        let mut pings = heapless::Vec::<Downlink, 8>::new();
        for t in (0..=4000).step_by(100) {
            hub.poll(t);
            for m in drain_tx(&mut hub) {
                pings.push(m).unwrap();
            }
        }
        assert_eq!(pings.len(), 3, "{pings:?}"); // t = 0, 2000, 4000
        board.on_rx(pings[1].clone(), 0);
        assert_eq!(
            drain_tx(&mut board).as_slice(),
            &[Uplink::Pong { nonce: 2 }]
        );
        // The board never pings.
        board.poll(100_000);
        assert!(drain_tx(&mut board).is_empty());
    }

    #[test]
    fn link_goes_down_after_6_s_of_silence_and_up_on_the_next_valid_frame() {
        let mut hub = HubLink::new(LinkConfig::hub(), 0);
        assert_eq!(hub.liveness(), Liveness::Starting);
        hub.on_rx(Uplink::Heartbeat { uptime_s: 1 }, 1000);
        assert_eq!(drain_events(&mut hub).as_slice(), &[LinkEvent::Up]);
        hub.poll(6999);
        assert_eq!(hub.liveness(), Liveness::Up);
        assert!(hub.alive_at(6999));
        assert!(!hub.alive_at(7000));
        hub.poll(7000);
        assert_eq!(hub.liveness(), Liveness::Down);
        hub.poll(9000);
        assert_eq!(drain_events(&mut hub).as_slice(), &[LinkEvent::Down]);
        hub.on_rx(Uplink::Pong { nonce: 1 }, 9500);
        assert_eq!(drain_events(&mut hub).as_slice(), &[LinkEvent::Up]);
    }

    #[test]
    fn silent_link_goes_down_6_s_after_start() {
        let mut b = BoardLink::new(LinkConfig::board(), 100);
        b.poll(6099);
        assert!(drain_events(&mut b).is_empty());
        b.poll(6100);
        assert_eq!(drain_events(&mut b).as_slice(), &[LinkEvent::Down]);
    }

    #[test]
    fn pending_table_is_bounded_and_says_so() {
        let mut b = BoardLink::new(LinkConfig::board(), 0);
        for _ in 0..PENDING_MAX {
            b.send(Uplink::Tamper { seq: 0 }, 0).unwrap();
        }
        assert_eq!(
            b.send(Uplink::Tamper { seq: 0 }, 0),
            Err(LinkError::PendingFull)
        );
        // Unsequenced traffic still flows.
        assert_eq!(b.send(Uplink::Heartbeat { uptime_s: 0 }, 0), Ok(None));
    }

    #[test]
    fn time_going_backwards_does_not_panic_or_resend() {
        let mut b = BoardLink::new(LinkConfig::board(), 10_000);
        b.send(Uplink::Tamper { seq: 0 }, 10_000).unwrap();
        drain_tx(&mut b);
        b.poll(0);
        assert!(drain_tx(&mut b).is_empty());
    }
}
