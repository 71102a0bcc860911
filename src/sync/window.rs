//! The hub's own receive window: how much it takes from the broker before
//! it has acked.
//!
//! ## Why the hub keeps one
//! MQTT 3.1.1 leaves flow control to the broker, and Mosquitto's
//! `max_inflight_messages` is meant to be it. On Mosquitto 2.0.x (Debian
//! 12 ships 2.0.11) it does not hold for a client that acks in order, as
//! MQTT requires: a PUBACK for the oldest message in flight lets the broker
//! move up to a whole window of queued messages into flight, so every ack
//! adds about 19 more. Measured here with a paho subscriber acking one
//! message every 5 ms: 2,850 unacked messages outstanding against a window
//! of 20. Under a flood the hub would otherwise take messages far faster
//! than it can commit them.
//!
//! So the poll task stops reading the socket while the messages it has
//! received and not yet acked reach [`ReceiveWindow`] (by count or bytes).
//! TCP does the rest: the broker's writes block and it keeps the messages
//! in its own queue, where they were anyway. Acks still go out while
//! reading is paused (the poll task writes them itself), which is what
//! reopens the window.
//!
//! ## Keeping the connection alive while reading is paused
//! The keep-alive is read from the same socket: with reading paused, the
//! broker's PINGRESP waits behind the messages it queued for the hub, and
//! while the writer is stalled (a slow SD card, another process holding
//! the write lock) no acks go out either. Left to rumqttc, a pause longer
//! than the keep-alive cost the connection: the broker drops a client it
//! hears nothing from for 1.5 keep-alives, and rumqttc gives up on its
//! next ping ("Last pingreq isn't acked") when the answer to the last one
//! has not been read yet, though it was not read only because the hub chose
//! not to read. Every reconnect redelivers the whole window. So while
//! reading is paused the poll task writes a PINGREQ itself every third of
//! the keep-alive after its last write ([`PausedPings`]), and the broker's
//! silence is judged only while the hub reads: any packet read from the
//! broker answers an outstanding ping, and a ping left unanswered across a
//! pause is forgiven when reading resumes (rumqttc's own keep-alive then
//! starts over). Nothing more is read while paused, so memory stays
//! bounded, and acks still go out only as commits allow, in arrival order.
//!
//! This is plain state, no I/O: [`Outstanding`] is fed "received" and
//! "acked" and answers whether the window is full; [`PausedPings`] is told
//! when reading pauses and resumes and when the hub wrote, and says when
//! the next ping is due.

use std::collections::VecDeque;
use std::time::Duration;
use tokio::time::Instant;

/// How much may be received and not yet acked before reading pauses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiveWindow {
    /// Messages.
    pub messages: usize,
    /// Payload bytes (one message larger than this still gets through
    /// alone: the window is checked before reading, not per message).
    pub bytes: usize,
}

impl Default for ReceiveWindow {
    /// 1,024 messages (four ingest batches: the writer never waits for the
    /// socket) or 2 MiB of payload, whichever comes first. 2 MiB is a dozen
    /// 500-key resync batches, over half a second of the writer's work;
    /// 8 MiB (~50 batches, each parsed in turn) made most of a resync's RSS.
    fn default() -> Self {
        ReceiveWindow {
            messages: 1024,
            bytes: 2 * 1024 * 1024,
        }
    }
}

/// The QoS 1 messages received on the current connection and not yet
/// acked, in arrival order.
#[derive(Debug, Default)]
pub struct Outstanding {
    /// (packet id, payload length), oldest first.
    queue: VecDeque<(u16, usize)>,
    bytes: usize,
}

impl Outstanding {
    /// A message that needs an ack arrived.
    pub fn received(&mut self, pkid: u16, len: usize) {
        self.queue.push_back((pkid, len));
        self.bytes += len;
    }

    /// The ack for `pkid` was written. Acks go in arrival order, so this is
    /// the oldest entry; a packet id not outstanding changes nothing.
    pub fn acked(&mut self, pkid: u16) {
        let at = if self.queue.front().is_some_and(|(p, _)| *p == pkid) {
            Some(0)
        } else {
            self.queue.iter().position(|(p, _)| *p == pkid)
        };
        if let Some((_, len)) = at.and_then(|i| self.queue.remove(i)) {
            self.bytes -= len;
        }
    }

    /// A new connection: the broker redelivers whatever was outstanding.
    pub fn reset(&mut self) {
        self.queue.clear();
        self.bytes = 0;
    }

    /// Whether reading must pause.
    pub fn full(&self, window: &ReceiveWindow) -> bool {
        self.queue.len() >= window.messages || self.bytes >= window.bytes
    }

    /// Messages outstanding.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is outstanding.
    #[cfg(any(test, feature = "testing"))]
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

/// When the hub pings the broker itself: only while reading is paused
/// (see the module docs), every third of the keep-alive after its last
/// write, so the broker (which allows 1.5 keep-alives of silence) always
/// hears from the hub in time, whatever rumqttc last wrote before the pause.
#[derive(Debug, Clone)]
pub struct PausedPings {
    every: Duration,
    /// `Some` while paused: when the next ping is due.
    next: Option<Instant>,
}

impl PausedPings {
    /// For a connection with this keep-alive (zero: the keep-alive is off,
    /// and so are these pings).
    pub fn new(keep_alive: Duration) -> Self {
        PausedPings {
            every: keep_alive / 3,
            next: None,
        }
    }

    /// Reading is paused at `now` (again: nothing changes).
    pub fn paused(&mut self, now: Instant) {
        if self.next.is_none() && !self.every.is_zero() {
            self.next = Some(now + self.every);
        }
    }

    /// The hub wrote to the broker at `now` (acks, a ping): the next ping
    /// counts from there.
    pub fn wrote(&mut self, now: Instant) {
        if let Some(next) = &mut self.next {
            *next = now + self.every;
        }
    }

    /// Reading resumes (or the connection is gone). `true` if it had been
    /// paused: a ping unanswered across the pause is then forgiven.
    pub fn resumed(&mut self) -> bool {
        self.next.take().is_some()
    }

    /// When the next ping is due, while paused.
    pub fn due(&self) -> Option<Instant> {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn while_paused_a_ping_is_due_every_third_of_the_keep_alive_after_the_last_write() {
        let t0 = Instant::now();
        let mut p = PausedPings::new(Duration::from_secs(30));
        assert_eq!(p.due(), None, "no pings while reading");
        p.paused(t0);
        assert_eq!(p.due(), Some(t0 + Duration::from_secs(10)));
        p.paused(t0 + Duration::from_secs(5));
        assert_eq!(
            p.due(),
            Some(t0 + Duration::from_secs(10)),
            "still the same pause"
        );
        p.wrote(t0 + Duration::from_secs(7));
        assert_eq!(p.due(), Some(t0 + Duration::from_secs(17)));
        assert!(p.resumed());
        assert_eq!(p.due(), None);
        assert!(!p.resumed(), "it was not paused");
        p.wrote(t0 + Duration::from_secs(20));
        assert_eq!(p.due(), None, "a write while reading schedules nothing");
    }

    #[test]
    fn with_the_keep_alive_off_the_hub_never_pings() {
        let mut p = PausedPings::new(Duration::ZERO);
        p.paused(Instant::now());
        assert_eq!(p.due(), None);
        assert!(!p.resumed());
    }

    const SMALL: ReceiveWindow = ReceiveWindow {
        messages: 3,
        bytes: 1000,
    };

    #[test]
    fn the_window_fills_by_count() {
        let mut o = Outstanding::default();
        o.received(1, 10);
        o.received(2, 10);
        assert!(!o.full(&SMALL));
        o.received(3, 10);
        assert!(o.full(&SMALL));
    }

    #[test]
    fn the_window_fills_by_bytes() {
        let mut o = Outstanding::default();
        o.received(1, 999);
        assert!(!o.full(&SMALL));
        o.received(2, 1);
        assert!(o.full(&SMALL));
    }

    #[test]
    fn an_ack_reopens_the_window_and_gives_back_its_bytes() {
        let mut o = Outstanding::default();
        o.received(1, 600);
        o.received(2, 600);
        assert!(o.full(&SMALL));
        o.acked(1);
        assert!(!o.full(&SMALL));
        assert_eq!(o.len(), 1);
        o.acked(2);
        assert!(o.is_empty());
        o.received(3, 1000);
        assert!(o.full(&SMALL), "bytes were given back exactly");
    }

    #[test]
    fn an_ack_for_an_unknown_packet_id_changes_nothing() {
        let mut o = Outstanding::default();
        o.received(7, 10);
        o.acked(8);
        assert_eq!(o.len(), 1);
        o.acked(7);
        o.acked(7);
        assert!(o.is_empty());
    }

    #[test]
    fn an_out_of_order_ack_removes_only_its_message() {
        let mut o = Outstanding::default();
        o.received(1, 100);
        o.received(2, 200);
        o.received(3, 300);
        o.acked(2);
        assert_eq!(o.len(), 2);
        o.acked(1);
        o.acked(3);
        assert!(o.is_empty());
        o.received(4, 999);
        assert!(!o.full(&SMALL));
    }

    #[test]
    fn a_reused_packet_id_is_acked_oldest_first() {
        // Packet ids cycle; after 65,535 the same id can be outstanding twice
        // only in theory, but the oldest must go first if it is.
        let mut o = Outstanding::default();
        o.received(5, 100);
        o.received(6, 1);
        o.received(5, 300);
        o.acked(5);
        o.acked(6);
        assert_eq!(o.len(), 1);
        o.received(9, 700);
        assert!(o.full(&SMALL), "the 300-byte message is the one left");
    }

    #[test]
    fn a_new_connection_empties_the_window() {
        let mut o = Outstanding::default();
        for p in 1..=3 {
            o.received(p, 10);
        }
        assert!(o.full(&SMALL));
        o.reset();
        assert!(o.is_empty() && !o.full(&SMALL));
    }
}
