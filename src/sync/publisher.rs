//! Outbox -> broker: what the hub says, signed, at least once.
//!
//! Rows are published in id order, each signed into a hub envelope at send
//! time (the outbox keeps bodies, so a rotated hub key signs what is still
//! unsent). A row is marked sent only after the broker's PUBACK for it.
//!
//! ## Matching PUBACKs to rows
//! rumqttc assigns packet ids inside its event loop, not in `publish`, and
//! reports each as `Outgoing::Publish(pkid)` when it writes the packet, in
//! the order requests were queued. So each connection keeps a FIFO of what
//! we queued; every `Sent(pkid)` pairs the FIFO's front with its packet id,
//! and `Acked(pkid)` resolves the pair. The [`Gate`] guarantees that the
//! FIFO and rumqttc's queue hold the same requests: on a lost connection the
//! poll task drops rumqttc's queue, and we drop our FIFO and start again
//! from the first unsent row on the next connection (at least once; the
//! cloud dedupes on ids). We keep fewer than [`CLIENT_INFLIGHT`] in flight,
//! so rumqttc never has to hold a publish back for a packet-id collision.
//!
//! The door never waits on this: nothing here holds a lock the door needs,
//! and rows pile up durably while the broker is away (`outbox_backlog` is
//! raised past [`BacklogLimits`]). Sent rows are pruned by the daemon's
//! maintenance task ([`crate::store::sweep::prune`]); unsent rows never (the
//! schema refuses it).
//!
//! ## Marking rows sent
//! Marks are writes, and the writer may be busy for many milliseconds under
//! a flood (behind the ingest jobs) or stalled by another process. So the
//! publisher never waits for one: it keeps publishing while one mark
//! commits, and the PUBACKs that arrive meanwhile go into the next
//! ([`MarkPlan`]: at most one in flight, a failed one retried, at most
//! [`MAX_UNMARKED`] acknowledged rows held before it stops sending). A mark
//! still comes only after its rows' PUBACKs.
//!
//! [`CLIENT_INFLIGHT`]: super::client::CLIENT_INFLIGHT
//! [`MAX_UNMARKED`]: super::plan::MAX_UNMARKED

use super::client::{
    CLIENT_INFLIGHT, Gate, GateRefusal, LinkEvent, REQUEST_CAPACITY, online_status_payload,
    status_payload,
};
use super::plan::{
    BacklogLimits, BacklogMonitor, HEALTH_EVERY, HealthSchedule, MarkPlan, PublishWindow,
};
use crate::clock::SharedClock;
use crate::status::{self, BROKER_LINK, Health, HealthKey};
use crate::store::alerts;
use crate::store::outbox;
use crate::store::{Priority, Store, StoreError};
use ed25519_dalek::SigningKey;
use lockhub_proto::crypto;
use lockhub_proto::outputs::Condition;
use lockhub_proto::topics::{HubTopics, Leaf};
use rusqlite::Connection;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};

/// Publishes awaiting their PUBACK at most, by count and by bytes. Rows
/// drain at about one window per PUBACK delay, and the broker's PUBACK for a
/// row comes back behind every event it wrote to the hub before it, which
/// the hub reads only as fast as it commits. On a broker that holds its
/// in-flight window (Mosquitto 2.0.15 and later) that is at most a receive
/// window's worth of events ([`ReceiveWindow`], 1,024) beside what the
/// sockets hold, and each `key.issued` makes two rows (its result and its
/// `key.activated` record): 4,096 is twice the rows of a full receive
/// window. On Mosquitto 2.0.11 a flood's PUBACKs wait for the whole flood
/// whatever the window; after it, 4,096 drained ~26,000 rows/s where 448
/// drained ~16,000 (BENCHMARKS.md, "The drain"). The bytes: 2 MiB of
/// envelopes and topics, as much as the receive window holds (~4,000 rows
/// of ~500 B); rumqttc keeps a copy of each until its PUBACK.
///
/// [`ReceiveWindow`]: super::window::ReceiveWindow
pub const WINDOW: PublishWindow = PublishWindow {
    messages: 4096,
    bytes: 2 * 1024 * 1024,
};
/// Packet ids left for the status messages beside a full window.
const STATUS_ROOM: usize = 64;
// rumqttc never holds a publish back for a packet-id collision.
const _: () = assert!(WINDOW.messages + STATUS_ROOM <= CLIENT_INFLIGHT as usize);
// A full window always fits rumqttc's request channel.
const _: () = assert!(WINDOW.messages + STATUS_ROOM <= REQUEST_CAPACITY);
/// Rows read and signed per pass before the task yields: a window's worth
/// at once (4,096 signatures, tens of ms) would hold a runtime worker that
/// door tasks may need.
const FILL_BATCH: usize = 256;
/// How often the backlog is measured and anything missed is retried.
const TICK: Duration = Duration::from_secs(1);
const BACKLOG_EVERY_TICKS: u32 = 10;
/// How long a clean shutdown waits for the broker to take the offline status.
pub const OFFLINE_ACK_TIMEOUT: Duration = Duration::from_secs(2);
/// Subject of the `outbox_backlog` alert.
const BACKLOG_SUBJECT: &str = "outbox";

/// What the hub signs and where it goes.
#[derive(Clone)]
pub struct PublisherConfig {
    pub hub_id: String,
    pub hub_key: SigningKey,
    /// `P/S/H/`: this hub's topics.
    pub topics: HubTopics,
    pub limits: BacklogLimits,
}

impl std::fmt::Debug for PublisherConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherConfig")
            .field("hub_id", &self.hub_id)
            .field("topics", &self.topics)
            .finish_non_exhaustive()
    }
}

/// A mark being committed (the publisher's one write in flight).
type MarkWrite = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// Requests to the publisher task.
#[derive(Debug)]
pub enum PublisherCommand {
    /// Publish the offline status, wait (bounded) for its PUBACK, then
    /// disconnect cleanly and stop.
    Shutdown(oneshot::Sender<()>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Item {
    Row(i64),
    Online,
    Offline,
}

/// The publisher task's state for one connection.
struct Link {
    epoch: u64,
    /// Highest outbox id queued on this connection.
    after_id: i64,
    status_due: bool,
    /// Queued, packet id not yet known (in queue order), with its bytes.
    queued: VecDeque<(Item, usize)>,
    /// Written, awaiting PUBACK, with its bytes.
    by_pkid: HashMap<u16, (Item, usize)>,
    /// Envelope and topic bytes of everything queued or awaiting PUBACK.
    bytes: usize,
}

impl Link {
    fn new(epoch: u64) -> Self {
        Link {
            epoch,
            after_id: 0,
            status_due: true,
            queued: VecDeque::new(),
            by_pkid: HashMap::new(),
            bytes: 0,
        }
    }

    fn in_flight(&self) -> usize {
        self.queued.len() + self.by_pkid.len()
    }

    fn queue(&mut self, item: Item, bytes: usize) {
        self.queued.push_back((item, bytes));
        self.bytes += bytes;
    }
}

pub struct Publisher {
    cfg: PublisherConfig,
    store: Store,
    /// The hub's effective time: outbox marks, alert times, status `at`.
    clock: SharedClock,
    reader: Connection,
    gate: Arc<Gate>,
    link: Option<Link>,
    /// Acknowledged rows and their marks.
    marks: MarkPlan,
    backlog: BacklogMonitor,
    offline_acked: bool,
    retry_soon: bool,
    /// The last pass filled a whole [`FILL_BATCH`]: pass again after a yield.
    more: bool,
    /// When the retained status (with health) goes out again.
    health: HealthSchedule<HealthKey>,
    origin: std::time::Instant,
}

impl Publisher {
    pub fn new(
        cfg: PublisherConfig,
        store: Store,
        gate: Arc<Gate>,
        clock: SharedClock,
    ) -> Result<Self, StoreError> {
        let reader = store.reader()?;
        let raised = alerts::open_alerts(&reader)?
            .iter()
            .any(|a| a.condition == Condition::OutboxBacklog.as_str());
        Ok(Publisher {
            backlog: BacklogMonitor::new(cfg.limits, raised),
            cfg,
            store,
            clock,
            reader,
            gate,
            link: None,
            marks: MarkPlan::default(),
            offline_acked: false,
            retry_soon: false,
            more: false,
            health: HealthSchedule::new(HEALTH_EVERY),
            origin: std::time::Instant::now(),
        })
    }

    fn topic(&self, leaf: Leaf) -> String {
        self.cfg.topics.topic(leaf)
    }

    /// Runs until shut down (or until every input is gone).
    pub async fn run(
        mut self,
        mut link_rx: mpsc::Receiver<LinkEvent>,
        wake: Arc<Notify>,
        mut cmd_rx: mpsc::Receiver<PublisherCommand>,
    ) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u32 = 0;
        let mut marking: Option<MarkWrite> = None;
        loop {
            if marking.is_none() {
                marking = self.start_mark();
            }
            self.fill();
            let wait = if self.retry_soon {
                Duration::from_millis(20)
            } else {
                // The retry after a failed mark (the rows stay acked in
                // memory meanwhile).
                match self.marks.due_at() {
                    Some(at) if marking.is_none() => at.saturating_sub(self.origin.elapsed()),
                    _ => Duration::from_secs(3600),
                }
            };
            tokio::select! {
                res = async { marking.as_mut().expect("guarded").await }, if marking.is_some() => {
                    marking = None;
                    self.mark_done(res);
                }
                ev = link_rx.recv() => match ev {
                    Some(LinkEvent::Closed) | None => break,
                    Some(ev) => {
                        self.on_link(ev);
                        // Take every event already waiting: the PUBACKs of a
                        // whole window free it at once for the next rows.
                        let mut closed = false;
                        while let Ok(ev) = link_rx.try_recv() {
                            if matches!(ev, LinkEvent::Closed) {
                                closed = true;
                                break;
                            }
                            self.on_link(ev);
                        }
                        if closed {
                            break;
                        }
                    }
                },
                _ = wake.notified() => {}
                _ = tokio::task::yield_now(), if self.more => {}
                _ = tokio::time::sleep(wait) => {}
                _ = tick.tick() => {
                    self.check_health();
                    ticks = ticks.wrapping_add(1);
                    if ticks.is_multiple_of(BACKLOG_EVERY_TICKS) {
                        self.check_backlog().await;
                    }
                }
                cmd = cmd_rx.recv() => {
                    if let Some(PublisherCommand::Shutdown(done)) = cmd {
                        self.shutdown(&mut link_rx).await;
                        self.finish_marks(marking.take()).await;
                        let _ = done.send(());
                    }
                    break;
                }
            }
        }
        self.finish_marks(marking.take()).await;
    }

    fn on_link(&mut self, ev: LinkEvent) {
        match ev {
            LinkEvent::Connected { epoch, .. } => {
                self.link = Some(Link::new(epoch));
            }
            LinkEvent::Lost { epoch } => {
                if self.link.as_ref().is_some_and(|l| l.epoch == epoch) {
                    self.link = None;
                }
            }
            LinkEvent::Sent { epoch, pkid } => {
                let Some(link) = self.link.as_mut().filter(|l| l.epoch == epoch) else {
                    return;
                };
                match link.queued.pop_front() {
                    Some(entry) => {
                        link.by_pkid.insert(pkid, entry);
                    }
                    None => {
                        tracing::warn!(pkid, "publish written that the publisher did not queue")
                    }
                }
            }
            LinkEvent::Acked { epoch, pkid } => {
                let Some(link) = self.link.as_mut().filter(|l| l.epoch == epoch) else {
                    return;
                };
                let Some((item, bytes)) = link.by_pkid.remove(&pkid) else {
                    tracing::warn!(pkid, "PUBACK for no publish of ours");
                    return;
                };
                link.bytes -= bytes;
                match item {
                    Item::Row(id) => self.marks.acked(id),
                    Item::Offline => self.offline_acked = true,
                    Item::Online => {}
                }
            }
            LinkEvent::Closed => {}
        }
    }

    /// The health figures now; the broker link is up, since this is what
    /// goes out over it (the recorded state may lag by a write).
    fn health_now(&self) -> Option<Health> {
        let mut h = status::health(&self.reader, self.store.path(), self.clock.now())
            .map_err(|e| tracing::warn!(error = %e, "cannot read the health figures"))
            .ok()?;
        h.links.insert(BROKER_LINK.to_owned(), "up".to_owned());
        Some(h)
    }

    /// Marks the status due when the minute is up or what the cloud
    /// watches changed (mqtt.md 'Status'). Reads only the cheap key.
    fn check_health(&mut self) {
        if self.link.as_ref().is_none_or(|l| l.status_due) {
            return;
        }
        let Ok(mut key) = status::health_key(&self.reader, self.clock.now()) else {
            return;
        };
        key.0.insert(BROKER_LINK.to_owned(), "up".to_owned());
        if self.health.due(&key, self.origin.elapsed())
            && let Some(link) = self.link.as_mut()
        {
            link.status_due = true;
        }
    }

    /// Queues status and rows up to the window.
    fn fill(&mut self) {
        self.retry_soon = false;
        self.more = false;
        if self.link.as_ref().is_some_and(|l| l.status_due) {
            let health = self.health_now();
            let payload =
                online_status_payload(&self.cfg.hub_id, self.clock.now(), health.as_ref());
            let topic = self.topic(Leaf::Status);
            let bytes = topic.len() + payload.len();
            let link = self.link.as_mut().expect("checked above");
            match self.gate.publish(link.epoch, &topic, true, payload) {
                Ok(()) => {
                    link.status_due = false;
                    link.queue(Item::Online, bytes);
                    if let Some(h) = health {
                        self.health.sent(h.key(), self.origin.elapsed());
                    }
                }
                Err(r) => return self.refused(r),
            }
        }
        if self.marks.full() {
            // Sending resumes once a mark commits (`MAX_UNMARKED`).
            return;
        }
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let epoch = link.epoch;
        let room = WINDOW.room(link.in_flight()).min(FILL_BATCH);
        if room == 0 || !WINDOW.admits(link.in_flight(), link.bytes, 0) {
            return;
        }
        let rows = match outbox::unsent(&self.reader, link.after_id, room) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the outbox");
                self.retry_soon = true;
                return;
            }
        };
        let full_batch = rows.len() == room;
        for row in rows {
            let envelope = crypto::hub_envelope(&self.cfg.hub_id, &self.cfg.hub_key, &row.body);
            let topic = self.topic(row.topic.leaf());
            let bytes = topic.len() + envelope.len();
            let link = self.link.as_mut().expect("link checked above");
            if !WINDOW.admits(link.in_flight(), link.bytes, bytes) {
                // The byte bound: this row goes once PUBACKs free room (it is
                // read again then; `after_id` stays before it).
                self.gate.note_publishing(link.in_flight());
                return;
            }
            match self.gate.publish(epoch, &topic, false, envelope) {
                Ok(()) => {
                    link.after_id = row.id;
                    link.queue(Item::Row(row.id), bytes);
                    tracing::debug!(outbox_id = row.id, topic = row.topic.as_str(), "published");
                }
                Err(r) => return self.refused(r),
            }
        }
        // More rows may wait and the window has room: the next pass comes
        // after a yield.
        self.more = full_batch;
        if let Some(link) = &self.link {
            self.gate.note_publishing(link.in_flight());
        }
    }

    fn refused(&mut self, r: GateRefusal) {
        match r {
            GateRefusal::Stale => self.link = None,
            GateRefusal::Full => self.retry_soon = true,
            GateRefusal::Closed => {}
        }
    }

    /// Starts marking the acknowledged rows sent if a mark is due
    /// ([`MarkPlan::take`]); the caller awaits it without holding anything
    /// else up.
    fn start_mark(&mut self) -> Option<MarkWrite> {
        let ids = self.marks.take(self.origin.elapsed())?;
        let store = self.store.clone();
        let now = self.clock.now();
        Some(Box::pin(async move {
            let n = ids.len();
            store
                .write(Priority::Bulk, move |c| outbox::mark_sent(c, &ids, now))
                .await
                .inspect(|()| tracing::trace!(rows = n, "outbox rows acknowledged"))
        }))
    }

    fn mark_done(&mut self, res: Result<(), StoreError>) {
        match res {
            Ok(()) => self.marks.committed(),
            // This connection will not queue them again (they are behind
            // `after_id`), so keep them and retry (`MARK_RETRY`) rather than
            // leave them unsent until a reconnect. A crash meanwhile only
            // sends them again: at least once.
            Err(e) => {
                tracing::error!(
                    error = %e,
                    rows = self.marks.unmarked(),
                    "cannot mark outbox rows sent; will retry"
                );
                self.marks.failed(self.origin.elapsed());
            }
        }
    }

    /// At the end: the mark in flight, then one for every row acknowledged
    /// since. What fails is sent again next time.
    async fn finish_marks(&mut self, marking: Option<MarkWrite>) {
        if let Some(m) = marking {
            let res = m.await;
            self.mark_done(res);
        }
        if let Some(m) = self.start_mark() {
            let res = m.await;
            self.mark_done(res);
        }
    }

    async fn check_backlog(&mut self) {
        let depth = outbox::depth(&self.reader);
        let oldest = outbox::oldest_unsent(&self.reader);
        let (Ok(depth), Ok(oldest)) = (depth, oldest) else {
            return;
        };
        let now = self.clock.now();
        let age = oldest.map(|t| Duration::from_micros(now.0.saturating_sub(t.0).max(0) as u64));
        let change = self.backlog.observe(depth, age);
        let Some(change) = change else { return };
        tracing::warn!(depth, ?change, "outbox backlog");
        let written = super::write_alert(
            &self.store,
            Condition::OutboxBacklog,
            BACKLOG_SUBJECT,
            change,
            None,
            now,
        )
        .await;
        if !written {
            self.backlog.write_failed(change);
        }
    }

    /// The offline status, then a clean DISCONNECT; bounded in time.
    async fn shutdown(&mut self, link_rx: &mut mpsc::Receiver<LinkEvent>) {
        let Some(epoch) = self.link.as_ref().map(|l| l.epoch) else {
            return;
        };
        let payload = status_payload(&self.cfg.hub_id, false, self.clock.now());
        let topic = self.topic(Leaf::Status);
        let deadline = tokio::time::Instant::now() + OFFLINE_ACK_TIMEOUT;
        loop {
            match self.gate.publish(epoch, &topic, true, payload.clone()) {
                Ok(()) => break,
                Err(GateRefusal::Full) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                Err(_) => return,
            }
        }
        if let Some(link) = self.link.as_mut() {
            link.queue(Item::Offline, topic.len() + payload.len());
        }
        while !self.offline_acked {
            match tokio::time::timeout_at(deadline, link_rx.recv()).await {
                Ok(Some(LinkEvent::Closed)) | Ok(None) | Err(_) => break,
                Ok(Some(ev)) => self.on_link(ev),
            }
        }
        let _ = self.gate.disconnect(epoch);
        // Let the poll task write the DISCONNECT and stop.
        let _ = tokio::time::timeout_at(deadline + Duration::from_secs(1), async {
            while let Some(ev) = link_rx.recv().await {
                if ev == LinkEvent::Closed {
                    break;
                }
            }
        })
        .await;
    }
}
