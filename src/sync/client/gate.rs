//! The [`Gate`]: the only way tasks other than the poll task reach the
//! broker. It makes "is this still the connection?" and "queue the request"
//! one atomic step (see the module docs of [`super`]).

use rumqttc::{AsyncClient, ClientError, Publish, QoS};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// Why a request through the gate was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateRefusal {
    /// Not connected, or the request belongs to an earlier connection.
    Stale,
    /// rumqttc's request channel is full: try again shortly.
    Full,
    /// The event loop is gone (shutting down).
    Closed,
}

#[derive(Debug, Default)]
struct GateState {
    epoch: u64,
    connected: bool,
    /// Packet ids to PUBACK on the current connection, in the order queued.
    /// Bounded by the receive window: only received messages are acked.
    acks: VecDeque<u16>,
}

impl GateState {
    /// Whether connection `epoch` is the one that is up.
    fn is_current(&self, epoch: u64) -> bool {
        self.connected && self.epoch == epoch
    }
}

/// The only way tasks reach the broker. Each connection has an epoch; a
/// request tagged with an older epoch is refused, atomically with respect to
/// the poll task dropping the connection's queued requests.
pub struct Gate {
    client: AsyncClient,
    state: Mutex<GateState>,
    /// PUBACKs queued since start (for diagnosing flow control).
    acks_queued: std::sync::atomic::AtomicU64,
    /// Wakes the poll task when acks are queued.
    pub(super) acks_ready: Notify,
    /// Messages received since start (written by the poll task).
    received: std::sync::atomic::AtomicU64,
    /// The most messages ever outstanding (received, not acked) at once.
    peak_outstanding: std::sync::atomic::AtomicUsize,
    /// The most hub publishes ever in the publisher's window at once.
    peak_publishing: std::sync::atomic::AtomicUsize,
}

/// How the hub's intake (and its publish window) has behaved since start:
/// for diagnosing flow control, and for tests that it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowStats {
    /// Messages received from the broker (redeliveries included).
    pub received: u64,
    /// PUBACKs queued.
    pub acks_queued: u64,
    /// The most messages received and not yet acked at any one time.
    pub peak_outstanding: usize,
    /// The most of the hub's own publishes queued or awaiting their PUBACK
    /// at any one time (the publisher's window in use).
    pub peak_publishing: usize,
}

impl Gate {
    pub fn new(client: AsyncClient) -> Arc<Gate> {
        Arc::new(Gate {
            client,
            state: Mutex::new(GateState::default()),
            acks_queued: std::sync::atomic::AtomicU64::new(0),
            acks_ready: Notify::new(),
            received: std::sync::atomic::AtomicU64::new(0),
            peak_outstanding: std::sync::atomic::AtomicUsize::new(0),
            peak_publishing: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    fn with_epoch(
        &self,
        epoch: u64,
        f: impl FnOnce(&AsyncClient) -> Result<(), ClientError>,
    ) -> Result<(), GateRefusal> {
        let st = self.state.lock().map_err(|_| GateRefusal::Closed)?;
        if !st.is_current(epoch) {
            return Err(GateRefusal::Stale);
        }
        // rumqttc reports a full and a closed channel alike; callers retry
        // a little and give up at shutdown.
        f(&self.client).map_err(|_: ClientError| GateRefusal::Full)
    }

    /// The current connection's epoch, if connected.
    #[cfg(any(test, feature = "testing"))]
    pub fn epoch(&self) -> Option<u64> {
        self.state
            .lock()
            .ok()
            .and_then(|s| s.connected.then_some(s.epoch))
    }

    /// Queues the PUBACK for a message delivered on connection `epoch` (a
    /// QoS 0 message needs none). Never `Full`: the queue is bounded by the
    /// receive window.
    pub fn ack(&self, epoch: u64, publish: &Publish) -> Result<(), GateRefusal> {
        if publish.qos == QoS::AtMostOnce {
            return Ok(());
        }
        {
            let mut st = self.state.lock().map_err(|_| GateRefusal::Closed)?;
            if !st.is_current(epoch) {
                return Err(GateRefusal::Stale);
            }
            st.acks.push_back(publish.pkid);
        }
        self.acks_queued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.acks_ready.notify_one();
        Ok(())
    }

    /// Takes the acks queued for connection `epoch` (none if it is gone).
    pub(super) fn take_acks(&self, epoch: u64) -> Vec<u16> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !st.is_current(epoch) {
            return Vec::new();
        }
        st.acks.drain(..).collect()
    }

    /// The intake counters so far.
    pub fn flow(&self) -> FlowStats {
        use std::sync::atomic::Ordering::Relaxed;
        FlowStats {
            received: self.received.load(Relaxed),
            acks_queued: self.acks_queued.load(Relaxed),
            peak_outstanding: self.peak_outstanding.load(Relaxed),
            peak_publishing: self.peak_publishing.load(Relaxed),
        }
    }

    /// Called by the poll task for each message it takes in.
    pub(super) fn note_received(&self, outstanding: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.received.fetch_add(1, Relaxed);
        self.peak_outstanding.fetch_max(outstanding, Relaxed);
    }

    /// Called by the publisher with how many of its publishes are queued or
    /// await their PUBACK.
    pub fn note_publishing(&self, in_flight: usize) {
        self.peak_publishing
            .fetch_max(in_flight, std::sync::atomic::Ordering::Relaxed);
    }

    /// Queues a QoS 1 publish on connection `epoch`.
    pub fn publish(
        &self,
        epoch: u64,
        topic: &str,
        retain: bool,
        payload: Vec<u8>,
    ) -> Result<(), GateRefusal> {
        self.with_epoch(epoch, |c| {
            c.try_publish(topic, QoS::AtLeastOnce, retain, payload)
        })
    }

    /// Queues the subscription to the events topic on connection `epoch`.
    pub fn subscribe(&self, epoch: u64, topic: &str) -> Result<(), GateRefusal> {
        self.with_epoch(epoch, |c| c.try_subscribe(topic, QoS::AtLeastOnce))
    }

    /// Queues a clean DISCONNECT (the broker then does not send the will).
    pub fn disconnect(&self, epoch: u64) -> Result<(), GateRefusal> {
        self.with_epoch(epoch, |c| c.try_disconnect())
    }

    /// Connection `epoch` (numbered by the poll task's
    /// [`super::PollState`]) is up: requests tagged with it go through.
    pub(super) fn connected(&self, epoch: u64) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.epoch = epoch;
        st.connected = true;
    }

    /// Marks the connection lost and, under the same lock, lets the caller
    /// throw away what was queued for it (its unsent acks go too: the broker
    /// redelivers those messages).
    pub(super) fn lost(&self, forget: impl FnOnce()) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.connected = false;
        st.acks.clear();
        forget();
    }
}
