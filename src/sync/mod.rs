//! The MQTT sync layer: events in, results/audit/alerts/sync out.
//!
//! ## Tasks
//! ```text
//!            +-----------+  Inbound (bounded)  +--------+  store.write  +--------+
//! broker <-> | poll task | ------------------> | ingest | ------------> | writer |
//!            +-----------+                     +--------+               +--------+
//!              |   ^ LinkEvent (Sent/Acked)        | acks via Gate          ^
//!              |   |                               v Decided                |
//!              |   +-------------- publisher <-- outbox rows --------------+
//!              +-- session ------> control (sync planner, cloud_stale) ----+
//! ```
//! - `client`: the poll task, the only one that touches the event loop; it
//!   pauses reading while the hub's receive window (`window`) is full, and
//!   writes the acks the [`client::Gate`] queues; every other task queues
//!   its requests through the gate. Its connection state (epoch, backoffs,
//!   a poisoned session, refusals) is [`client::PollState`], plain data.
//! - `ingest`: step 1, then batched commits, then in-order acks.
//! - `publisher`: outbox rows, signed, out; marked sent after PUBACK.
//! - `plan` / `ratelimit` / `window`: pure rules, unit-tested without a
//!   runtime.
//! - control (here): turns the planner's answers into outbox rows and alerts.
//!
//! ## Broker settings that matter
//! Mosquitto keeps at most `max_queued_messages` (default 1000) queued for
//! a persistent session, dropping the rest silently: the seq bookkeeping
//! notices and the hub asks for them again (`gap`). Its
//! `max_inflight_messages` is not a bound the hub can rely on (2.0.x lets
//! in-order acks exceed it), so the hub keeps its own receive window
//! (`window`) by pausing its reads.
//!
//! One broker serves many hubs: each hub has its own identity and ACL
//! (docs/broker.md), a refused connection or subscription raises
//! `broker_denied` (`client::Access`, the control task here), and
//! reconnects and first sync requests are jittered so a fleet does not
//! stampede after a broker restart (`plan`).

pub mod client;
pub mod decide;
pub mod ingest;
pub mod plan;
pub mod proof;
pub mod publisher;
pub mod ratelimit;
pub mod window;

use crate::clock::SharedClock;
use crate::config::MqttConfig;
use crate::store::alerts;
use crate::store::outbox::{self, Topic};
use crate::store::runtime::{self, BrokerState};
use crate::store::{Priority, Store, error::StoreError};
use client::{Access, Gate, LinkEvent, LinkNews, PollSettings, PollSinks};
use ed25519_dalek::SigningKey;
use ingest::{Decide, Decided, IngestSinks};
use lockhub_proto::outputs::Condition;
use lockhub_proto::time::Timestamp;
use lockhub_proto::topics::{HubTopics, Leaf};
use plan::{AlertChange, BacklogLimits, SeqStart, StaleTracker, SyncPlanner};
use publisher::{Publisher, PublisherCommand, PublisherConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// The sync boundary's errors (all at start-up; at run time the layer
/// retries and reports through alerts and logs instead).
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    #[error("cannot read {path}: {source}")]
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("TLS setup{}: {detail}", .path.as_ref().map(|p| format!(" ({})", p.display())).unwrap_or_default())]
    Tls {
        path: Option<PathBuf>,
        detail: String,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Subject of the `cloud_stale` alert.
const CLOUD_STALE_SUBJECT: &str = "cloud";
/// Subjects of `broker_denied`: what the broker refused.
const DENIED_CONNECT: &str = "connect";
const DENIED_SUBSCRIBE: &str = "subscribe";
const CHANNEL: usize = 256;

/// Everything the sync layer needs from the config.
#[derive(Clone)]
pub struct SyncSettings {
    pub mqtt: MqttConfig,
    pub hub_id: String,
    /// `P/S/H/`, with the trailing slash.
    pub topics: HubTopics,
    pub hub_key: SigningKey,
    pub cloud_stale: Duration,
    pub backlog: BacklogLimits,
    /// How much the hub takes from the broker before acking.
    pub window: window::ReceiveWindow,
    /// The MQTT keep-alive ([`client::KEEP_ALIVE`]; tests shorten it).
    pub keep_alive: Duration,
}

impl SyncSettings {
    pub fn from_config(config: &crate::config::Config) -> Self {
        SyncSettings {
            mqtt: config.mqtt.clone(),
            hub_id: config.hub.hub_id.clone(),
            topics: config.topics(),
            hub_key: config.secrets.hub_key.clone(),
            cloud_stale: Duration::from_secs(u64::from(config.policy.cloud_stale_s)),
            backlog: BacklogLimits::default(),
            window: window::ReceiveWindow::default(),
            keep_alive: client::KEEP_ALIVE,
        }
    }
}

/// A running sync layer.
pub struct SyncHandle {
    stop: watch::Sender<bool>,
    publisher_cmd: mpsc::Sender<PublisherCommand>,
    outbox_wake: Arc<Notify>,
    poll: JoinHandle<()>,
    others: Vec<JoinHandle<()>>,
    #[cfg(any(test, feature = "testing"))]
    gate: Arc<Gate>,
}

/// Starts the sync tasks on the current runtime. `seq` is the durable seq
/// state at start-up ([`decide::initial_seq`]); `clock` is the hub's
/// effective time, which every time the layer writes (alerts, outbox
/// marks, sync requests) is read from (mqtt.md 'Time').
pub fn start<D: Decide>(
    settings: SyncSettings,
    store: Store,
    decider: Arc<D>,
    seq: SeqStart,
    clock: SharedClock,
) -> Result<SyncHandle, SyncError> {
    let status_topic = settings.topics.topic(Leaf::Status);
    let events_topic = settings.topics.topic(Leaf::Events);
    let offline = client::status_payload(&settings.hub_id, false, clock.now());
    let mut options = client::mqtt_options(&settings.mqtt, &status_topic, offline)?;
    options.set_keep_alive(settings.keep_alive);
    let (mqtt, eventloop) = rumqttc::AsyncClient::new(options, client::REQUEST_CAPACITY);
    let gate = Gate::new(mqtt);

    let (stop_tx, stop_rx) = watch::channel(false);
    let (inbound_tx, inbound_rx) = mpsc::channel(CHANNEL);
    let (link_tx, link_rx) = mpsc::channel(CHANNEL);
    let (session_tx, session_rx) = mpsc::channel(CHANNEL);
    let (access_tx, access_rx) = mpsc::channel(CHANNEL);
    let (decided_tx, decided_rx) = mpsc::channel(CHANNEL);
    let (cmd_tx, cmd_rx) = mpsc::channel(4);
    let outbox_wake = Arc::new(Notify::new());
    let reconnect = Arc::new(Notify::new());

    let publisher = Publisher::new(
        PublisherConfig {
            hub_id: settings.hub_id.clone(),
            hub_key: settings.hub_key.clone(),
            topics: settings.topics.clone(),
            limits: settings.backlog,
        },
        store.clone(),
        gate.clone(),
        clock.clone(),
    )?;
    let reader = store.reader()?;
    let stale_raised = alerts::open_alerts(&reader)?
        .iter()
        .any(|a| a.condition == Condition::CloudStale.as_str());
    // The silence since the durable last sign of life counts after a
    // restart too (none yet: the clock starts now).
    let silent_for = crate::store::apply::seq_status(&reader)?
        .last_sign_of_life
        .map(|t| Duration::from_micros(clock.now().0.saturating_sub(t.0).max(0) as u64))
        .unwrap_or_default();
    drop(reader);

    let poll = tokio::spawn(client::poll_loop(
        eventloop,
        gate.clone(),
        PollSinks {
            inbound: inbound_tx,
            link: link_tx,
            session: session_tx,
            access: access_tx,
        },
        PollSettings {
            events_topic,
            window: settings.window,
            will: {
                let (topic, hub_id, clock) =
                    (status_topic.clone(), settings.hub_id.clone(), clock.clone());
                Box::new(move || {
                    client::offline_will(
                        &topic,
                        client::status_payload(&hub_id, false, clock.now()),
                    )
                })
            },
        },
        reconnect.clone(),
        stop_rx,
    ));
    let others = vec![
        tokio::spawn(ingest::run(
            decider,
            store.clone(),
            gate.clone(),
            inbound_rx,
            IngestSinks {
                decided: decided_tx,
                outbox: outbox_wake.clone(),
                reconnect,
            },
        )),
        tokio::spawn(publisher.run(link_rx, outbox_wake.clone(), cmd_rx)),
        tokio::spawn(control(
            store,
            clock,
            seq,
            // Its clock starts with the control task (Duration::ZERO there).
            StaleTracker::resume(
                settings.cloud_stale,
                Duration::ZERO,
                stale_raised,
                silent_for,
            ),
            ControlInputs {
                session: session_rx,
                decided: decided_rx,
                access: access_rx,
            },
            outbox_wake.clone(),
        )),
    ];
    Ok(SyncHandle {
        stop: stop_tx,
        publisher_cmd: cmd_tx,
        outbox_wake,
        poll,
        others,
        #[cfg(any(test, feature = "testing"))]
        gate,
    })
}

/// How long a clean shutdown may take before tasks are cut off.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

impl SyncHandle {
    /// Wakes the publisher: call after committing outbox rows (audit,
    /// alerts) so they go out at once rather than at the next tick.
    pub fn outbox_notify(&self) -> Arc<Notify> {
        self.outbox_wake.clone()
    }

    /// What the hub has taken in from the broker so far.
    #[cfg(any(test, feature = "testing"))]
    pub fn flow(&self) -> client::FlowStats {
        self.gate.flow()
    }

    /// Publishes the offline status, disconnects cleanly, and stops every
    /// task (bounded by [`SHUTDOWN_TIMEOUT`]). Events not yet committed are
    /// not acked; the broker redelivers them next time.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let (done_tx, done_rx) = oneshot::channel();
        if self
            .publisher_cmd
            .send(PublisherCommand::Shutdown(done_tx))
            .await
            .is_ok()
        {
            let _ = tokio::time::timeout(SHUTDOWN_TIMEOUT, done_rx).await;
        }
        crate::runtime::task::join_or_abort(self.poll, Duration::from_secs(1)).await;
        // The poll task is gone, so the ingest channel is closed: ingest
        // finishes its batch (committed work is kept; its acks are moot).
        for task in self.others {
            crate::runtime::task::join_or_abort(task, SHUTDOWN_TIMEOUT).await;
        }
    }
}

/// What the control task listens to.
struct ControlInputs {
    session: mpsc::Receiver<LinkEvent>,
    decided: mpsc::Receiver<(u64, Decided)>,
    access: mpsc::Receiver<LinkNews>,
}

/// The control task: sync requests, `cloud_stale`, `broker_denied` and the
/// broker link's recorded state.
async fn control(
    store: Store,
    clock: SharedClock,
    seq: SeqStart,
    mut stale: StaleTracker,
    inputs: ControlInputs,
    outbox_wake: Arc<Notify>,
) {
    let ControlInputs {
        session: mut session_rx,
        decided: mut decided_rx,
        access: mut access_rx,
    } = inputs;
    let origin = Instant::now();
    let now = || origin.elapsed();
    // Jittered: a fleet of hubs that all lose their session, or all get the
    // same checkpoint, must not ask the cloud in one burst (plan::SYNC_JITTER).
    let mut planner = SyncPlanner::resume(seq, now(), plan::SYNC_JITTER, rand::random());
    let mut connected = false;
    let mut broker = BrokerLink::new(&store, clock.clone()).await;
    let (mut session_open, mut decided_open, mut access_open) = (true, true, true);
    while session_open || decided_open {
        // Requests are only worth writing while connected: the planner keeps
        // its schedule meanwhile, and a reconnect asks again when needed.
        if connected {
            while let Some(req) = planner.poll(now()) {
                tracing::info!(
                    from_seq = req.from_seq,
                    reason = req.reason.as_str(),
                    "sync request"
                );
                let body = req.to_json();
                let at = clock.now();
                let res = store
                    .write(Priority::Bulk, move |c| {
                        outbox::enqueue(c, Topic::Sync, &body, None, at)
                    })
                    .await;
                match res {
                    Ok(_) => outbox_wake.notify_one(),
                    Err(e) => tracing::error!(error = %e, "cannot queue a sync request"),
                }
            }
        }
        if let Some(change) = stale.poll(now())
            && !stale_alert(&store, change, &outbox_wake, clock.now()).await
        {
            stale.write_failed(change, now());
        }
        broker.clear_again(&store, &outbox_wake, now()).await;
        let deadline = [
            connected.then(|| planner.next_deadline()).flatten(),
            stale.next_deadline(),
            broker.next_deadline(),
        ]
        .into_iter()
        .flatten()
        .min()
        .map(|d| d.saturating_sub(now()))
        .unwrap_or(Duration::from_secs(3600));
        tokio::select! {
            ev = session_rx.recv(), if session_open => match ev {
                Some(LinkEvent::Connected { epoch, session_present }) => {
                    connected = true;
                    planner.on_session(session_present, epoch, now());
                    broker.connected(&store, &outbox_wake).await;
                }
                Some(LinkEvent::Lost { .. }) => {
                    connected = false;
                    broker.set(&store, BrokerState::Down).await;
                }
                Some(_) => {}
                None => session_open = false,
            },
            a = access_rx.recv(), if access_open => match a {
                Some(LinkNews::Access(a)) => broker.access(&store, a, &outbox_wake).await,
                Some(LinkNews::Failed(error)) => broker.failed(&store, error).await,
                None => access_open = false,
            },
            d = decided_rx.recv(), if decided_open => match d {
                Some((epoch, d)) => {
                    if let Some(view) = d.seq {
                        match d.checkpoint_head {
                            Some(head) => planner.on_checkpoint(head, epoch, view, now()),
                            None => planner.on_event(view, now()),
                        }
                    }
                    if d.sign_of_life
                        && let Some(change) = stale.on_life(now())
                        && !stale_alert(&store, change, &outbox_wake, clock.now()).await
                    {
                        stale.write_failed(change, now());
                    }
                }
                None => decided_open = false,
            },
            _ = tokio::time::sleep(deadline) => {}
        }
    }
}

/// The broker link as the control task records it: `hub_runtime.broker`
/// and the `broker_denied` alert (mqtt.md 'Broker access'). A refusal is
/// raised (a repeat bumps its count); it is cleared by what proves the
/// broker lets the hub in: a CONNACK for `connect`, a granted SUBACK for
/// `subscribe`. Alerts go through the outbox, so a refusal is kept locally
/// and published once the broker lets the hub publish.
struct BrokerLink {
    /// Alert times are the hub's effective time (mqtt.md 'Alerts').
    clock: SharedClock,
    state: BrokerState,
    denied_connect: bool,
    denied_subscribe: bool,
    /// Clears whose write failed, said again at this time (on the control
    /// task's clock) until written: the broker lets the hub in, so nothing
    /// else would end the alert.
    clear_again: Vec<&'static str>,
    clear_again_at: Option<Duration>,
    /// The last error recorded for `lockhub status` (written on a change).
    last_error: Option<String>,
}

impl BrokerLink {
    async fn new(store: &Store, clock: SharedClock) -> Self {
        let (denied_connect, denied_subscribe) = match store.reader() {
            Ok(r) => match alerts::open_alerts(&r) {
                Ok(open) => {
                    let is = |subject: &str| {
                        open.iter().any(|a| {
                            a.condition == Condition::BrokerDenied.as_str() && a.subject == subject
                        })
                    };
                    (is(DENIED_CONNECT), is(DENIED_SUBSCRIBE))
                }
                Err(_) => (false, false),
            },
            Err(_) => (false, false),
        };
        let now = Timestamp::now_system();
        if let Err(e) = store
            .write(Priority::Bulk, move |c| runtime::record_start(c, now))
            .await
        {
            tracing::error!(error = %e, "cannot record the daemon's start");
        }
        BrokerLink {
            clock,
            state: BrokerState::Connecting,
            denied_connect,
            denied_subscribe,
            clear_again: Vec::new(),
            clear_again_at: None,
            last_error: None,
        }
    }

    /// A connection attempt failed or the connection was lost with `error`:
    /// recorded for `lockhub status` when it changes, and a hub that never
    /// got in is `down`, not `connecting`, from its first failure.
    async fn failed(&mut self, store: &Store, error: String) {
        if self.state == BrokerState::Connecting {
            self.set(store, BrokerState::Down).await;
        }
        if self.last_error.as_deref() != Some(error.as_str()) {
            self.record_error(store, Some(error)).await;
        }
    }

    async fn record_error(&mut self, store: &Store, error: Option<String>) {
        let now = Timestamp::now_system();
        let text = error.clone();
        match store
            .write(Priority::Bulk, move |c| {
                runtime::record_broker_error(c, text.as_deref(), now)
            })
            .await
        {
            Ok(()) => self.last_error = error,
            Err(e) => tracing::error!(error = %e, "cannot record the broker link's error"),
        }
    }

    /// Clears `subject`'s alert, or keeps it to say again after
    /// [`plan::HOLDS_AGAIN`] if the write fails.
    async fn clear(&mut self, store: &Store, subject: &'static str, outbox_wake: &Notify) {
        if !self
            .alert(store, AlertChange::Clear, subject, outbox_wake)
            .await
            && !self.clear_again.contains(&subject)
        {
            self.clear_again.push(subject);
        }
    }

    /// Writes a `broker_denied` change; returns whether it was written.
    async fn alert(
        &self,
        store: &Store,
        change: AlertChange,
        subject: &'static str,
        wake: &Notify,
    ) -> bool {
        let now = self.clock.now();
        write_alert(
            store,
            Condition::BrokerDenied,
            subject,
            change,
            Some(wake),
            now,
        )
        .await
    }

    /// Says the failed clears again, when due ([`BrokerLink::next_deadline`]).
    async fn clear_again(&mut self, store: &Store, outbox_wake: &Notify, now: Duration) {
        if self.clear_again.is_empty() {
            self.clear_again_at = None;
            return;
        }
        let due = *self.clear_again_at.get_or_insert(now + plan::HOLDS_AGAIN);
        if now < due {
            return;
        }
        self.clear_again_at = None;
        for subject in std::mem::take(&mut self.clear_again) {
            // A refusal since then raised it again: nothing to clear.
            let denied = match subject {
                DENIED_CONNECT => self.denied_connect,
                _ => self.denied_subscribe,
            };
            if !denied {
                self.clear(store, subject, outbox_wake).await;
            }
        }
    }

    fn next_deadline(&self) -> Option<Duration> {
        self.clear_again_at
    }

    async fn set(&mut self, store: &Store, state: BrokerState) {
        if self.state == state {
            return;
        }
        self.state = state;
        let now = Timestamp::now_system();
        if let Err(e) = store
            .write(Priority::Bulk, move |c| {
                runtime::record_broker(c, state, now)
            })
            .await
        {
            tracing::error!(error = %e, "cannot record the broker link state");
        }
    }

    async fn connected(&mut self, store: &Store, outbox_wake: &Notify) {
        self.set(store, BrokerState::Up).await;
        if self.last_error.is_some() {
            self.record_error(store, None).await;
        }
        if self.denied_connect {
            self.denied_connect = false;
            self.clear(store, DENIED_CONNECT, outbox_wake).await;
        }
    }

    async fn access(&mut self, store: &Store, access: Access, outbox_wake: &Notify) {
        match access {
            Access::ConnectRefused(_)
            | Access::CertificateRefused(_)
            | Access::BrokerUntrusted(_) => {
                self.denied_connect = true;
                self.set(store, BrokerState::Denied).await;
                self.alert(store, AlertChange::Raise, DENIED_CONNECT, outbox_wake)
                    .await;
            }
            Access::SubscribeRefused | Access::SubscribeDowngraded => {
                self.denied_subscribe = true;
                if access == Access::SubscribeRefused {
                    self.set(store, BrokerState::Denied).await;
                } else {
                    // Connected, and events flow (at QoS 0).
                    self.set(store, BrokerState::Up).await;
                }
                self.alert(store, AlertChange::Raise, DENIED_SUBSCRIBE, outbox_wake)
                    .await;
            }
            Access::Granted => {
                self.set(store, BrokerState::Up).await;
                if self.denied_subscribe {
                    self.denied_subscribe = false;
                    self.clear(store, DENIED_SUBSCRIBE, outbox_wake).await;
                }
            }
        }
    }
}

/// Raises, holds or clears one alert of the sync layer, at `now` (the
/// hub's effective time), for the three conditions it watches
/// (`cloud_stale`, `broker_denied`, `outbox_backlog`); wakes the publisher
/// when it is written. Returns whether it was: the caller says a failed
/// change again.
async fn write_alert(
    store: &Store,
    condition: Condition,
    subject: &'static str,
    change: AlertChange,
    wake: Option<&Notify>,
    now: Timestamp,
) -> bool {
    let written = store
        .write(Priority::Bulk, move |c| match change {
            AlertChange::Raise => alerts::raise(c, condition, subject, 1, now).map(|_| ()),
            AlertChange::Holds => alerts::hold(c, condition, subject, now).map(|_| ()),
            AlertChange::Clear => alerts::clear(c, condition, subject, now).map(|_| ()),
        })
        .await;
    match written {
        Ok(()) => {
            if let Some(w) = wake {
                w.notify_one();
            }
            true
        }
        Err(e) => {
            tracing::error!(condition = condition.as_str(), error = %e, "cannot record the alert");
            false
        }
    }
}

/// A `cloud_stale` change, said in the log too.
async fn stale_alert(store: &Store, change: AlertChange, wake: &Notify, now: Timestamp) -> bool {
    tracing::warn!(?change, "cloud_stale");
    write_alert(
        store,
        Condition::CloudStale,
        CLOUD_STALE_SUBJECT,
        change,
        Some(wake),
        now,
    )
    .await
}
