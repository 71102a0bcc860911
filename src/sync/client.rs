//! The broker connection: rumqttc options, TLS, the event-loop task and the
//! [`Gate`] every other task talks to the broker through.
//!
//! ## Rules this module keeps (rumqttc 0.25 pitfalls)
//! - **Nobody awaits the client in the poll task.** The event loop only
//!   makes progress while it is polled; a task that polls it and also waits
//!   on the bounded request channel deadlocks once the channel is full. The
//!   poll task only forwards events into bounded channels.
//! - **Acks and publishes belong to a connection.** When a connection drops,
//!   rumqttc drains queued requests into its `pending` list (dropping
//!   PubAcks) and replays them on a resumed session. We clear that list: the
//!   publisher re-publishes from the first unsent outbox row itself, and an
//!   ack is sent only on the connection that delivered the message (the
//!   broker redelivers the rest; dedupe makes that harmless). The [`Gate`]
//!   makes "is this still the connection?" and "queue the request" one
//!   atomic step, so no stale ack or publish can slip into the next
//!   connection, where its packet id could mean another message.
//! - **The hub bounds what it reads.** Mosquitto 2.0's in-flight window
//!   does not hold for a client that acks in order (see [`super::window`]),
//!   so the poll task stops reading the socket while the messages it has not
//!   acked fill the [`ReceiveWindow`]. PUBACKs therefore cannot go through
//!   rumqttc's request channel, which is only served by the same `poll()`
//!   that reads: the [`Gate`] queues their packet ids and the poll task
//!   writes them to the connection itself, paused or not.
//! - **No reconnect storm.** rumqttc reconnects as fast as it is polled; the
//!   poll task sleeps a capped, jittered backoff between attempts.
//! - **Big envelopes.** The default incoming limit (10 KiB) is far below the
//!   1 MiB envelope limit. We accept packets up to [`MAX_INCOMING_PACKET`],
//!   so an envelope a little over 1 MiB still reaches step 1 and gets its
//!   `payload_too_large` result instead of killing the connection (which the
//!   broker would answer by redelivering it forever). Larger ones are the
//!   broker's to refuse: set Mosquitto's `message_size_limit`.

use super::SyncError;
use super::plan::reconnect_backoff;
use super::window::{Outstanding, ReceiveWindow};
use crate::config::MqttConfig;
use rumqttc::{
    AsyncClient, ClientError, ConnectReturnCode, Event, EventLoop, LastWill, MqttOptions, Outgoing,
    Packet, PubAck, Publish, QoS, SubscribeReasonCode, TlsConfiguration, Transport,
};
use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, watch};
use tokio_rustls::rustls;

/// Largest MQTT packet accepted from the broker.
pub const MAX_INCOMING_PACKET: usize = 2 * 1024 * 1024;
/// Largest packet the hub sends (its envelopes are small).
pub const MAX_OUTGOING_PACKET: usize = 256 * 1024;
/// rumqttc's request channel: the hub's own publishes (bounded by the
/// publisher's window), subscriptions and the disconnect. Acks do not use
/// it. If it is full, `try_*` says so and the caller retries.
pub const REQUEST_CAPACITY: usize = 1024;
/// How long writing acks to the socket may take before the connection is
/// considered dead (rumqttc's own flush timeout is its connection timeout).
const ACK_WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Unacked hub publishes rumqttc tracks (packet ids cycle through 1..=this).
/// The publisher keeps fewer than this in flight, so ids never collide.
pub const CLIENT_INFLIGHT: u16 = 100;
pub const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// The retained status payload (plain JSON, not signed: it is a hint).
pub fn status_payload(hub_id: &str, online: bool, at: crate::time::Timestamp) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "state": if online { "online" } else { "offline" },
        "hub_id": hub_id,
        "version": env!("CARGO_PKG_VERSION"),
        "at": at.to_rfc3339(),
    }))
    .unwrap_or_default()
}

/// The retained online status with the hub's health (mqtt.md 'Status':
/// the contract's four fields, and `health` as an extra one; the last will
/// stays [`status_payload`]'s offline form).
pub fn online_status_payload(
    hub_id: &str,
    at: crate::time::Timestamp,
    health: Option<&crate::status::Health>,
) -> Vec<u8> {
    let mut v = serde_json::json!({
        "state": "online",
        "hub_id": hub_id,
        "version": env!("CARGO_PKG_VERSION"),
        "at": at.to_rfc3339(),
    });
    if let Some(h) = health {
        v["health"] = serde_json::to_value(h).unwrap_or_default();
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Builds the connection options: persistent session under a stable client
/// id, manual acks, offline last will, TLS and credentials from the config.
pub fn mqtt_options(
    cfg: &MqttConfig,
    status_topic: &str,
    offline_status: Vec<u8>,
) -> Result<MqttOptions, SyncError> {
    let mut o = MqttOptions::new(cfg.client_id.clone(), cfg.host.clone(), cfg.port);
    o.set_clean_session(false)
        .set_manual_acks(true)
        .set_keep_alive(KEEP_ALIVE)
        .set_inflight(CLIENT_INFLIGHT)
        .set_request_channel_capacity(REQUEST_CAPACITY)
        .set_max_packet_size(MAX_INCOMING_PACKET, MAX_OUTGOING_PACKET)
        .set_last_will(LastWill::new(
            status_topic,
            offline_status,
            QoS::AtLeastOnce,
            true,
        ));
    if let Some(user) = &cfg.username {
        let password = match &cfg.password_file {
            Some(p) => read_password(p)?,
            None => String::new(),
        };
        o.set_credentials(user.clone(), password);
    }
    if cfg.tls {
        o.set_transport(Transport::Tls(TlsConfiguration::Rustls(Arc::new(
            tls_config(cfg)?,
        ))));
    }
    Ok(o)
}

fn read_password(path: &Path) -> Result<String, SyncError> {
    let raw = std::fs::read_to_string(path).map_err(|source| SyncError::File {
        path: path.to_owned(),
        source,
    })?;
    // One line; the trailing newline editors add is not part of it.
    Ok(raw.trim_end_matches(['\r', '\n']).to_owned())
}

fn read_file(path: &Path) -> Result<Vec<u8>, SyncError> {
    std::fs::read(path).map_err(|source| SyncError::File {
        path: path.to_owned(),
        source,
    })
}

fn tls_err(path: Option<&Path>, detail: impl std::fmt::Display) -> SyncError {
    SyncError::Tls {
        path: path.map(Path::to_owned),
        detail: detail.to_string(),
    }
}

/// rustls with the `ring` provider (no OpenSSL, no aws-lc): the CA from
/// `ca_file` only (a hub trusts its own broker, not the web PKI), and the
/// client certificate when both `cert_file` and `key_file` are set.
pub fn tls_config(cfg: &MqttConfig) -> Result<rustls::ClientConfig, SyncError> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(None, e))?;

    let ca_path = cfg
        .ca_file
        .as_deref()
        .ok_or_else(|| tls_err(None, "mqtts needs mqtt.ca_file"))?;
    let mut roots = rustls::RootCertStore::empty();
    let ca_pem = read_file(ca_path)?;
    let mut n = 0;
    for cert in rustls_pemfile::certs(&mut ca_pem.as_slice()) {
        let cert: CertificateDer<'static> = cert.map_err(|e| tls_err(Some(ca_path), e))?;
        roots.add(cert).map_err(|e| tls_err(Some(ca_path), e))?;
        n += 1;
    }
    if n == 0 {
        return Err(tls_err(Some(ca_path), "no PEM certificate in it"));
    }
    let builder = builder.with_root_certificates(roots);

    match (&cfg.cert_file, &cfg.key_file) {
        (Some(cert_path), Some(key_path)) => {
            let pem = read_file(cert_path)?;
            let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut pem.as_slice())
                .collect::<Result<_, _>>()
                .map_err(|e| tls_err(Some(cert_path), e))?;
            if chain.is_empty() {
                return Err(tls_err(Some(cert_path), "no PEM certificate in it"));
            }
            let key_pem = read_file(key_path)?;
            let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key_pem.as_slice())
                .map_err(|e| tls_err(Some(key_path), e))?
                .ok_or_else(|| tls_err(Some(key_path), "no PEM private key in it"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_err(Some(key_path), e))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(tls_err(
            None,
            "mqtt.cert_file and mqtt.key_file go together",
        )),
    }
}

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
    acks_ready: Notify,
    /// Messages received since start (written by the poll task).
    received: std::sync::atomic::AtomicU64,
    /// The most messages ever outstanding (received, not acked) at once.
    peak_outstanding: std::sync::atomic::AtomicUsize,
}

/// How the hub's intake has behaved since start: for diagnosing flow
/// control, and for tests that it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowStats {
    /// Messages received from the broker (redeliveries included).
    pub received: u64,
    /// PUBACKs queued.
    pub acks_queued: u64,
    /// The most messages received and not yet acked at any one time.
    pub peak_outstanding: usize,
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
    fn take_acks(&self, epoch: u64) -> Vec<u16> {
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
        }
    }

    /// Called by the poll task for each message it takes in.
    fn note_received(&self, outstanding: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.received.fetch_add(1, Relaxed);
        self.peak_outstanding.fetch_max(outstanding, Relaxed);
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

    fn connected(&self) -> u64 {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.epoch += 1;
        st.connected = true;
        st.epoch
    }

    /// Marks the connection lost and, under the same lock, lets the caller
    /// throw away what was queued for it (its unsent acks go too: the broker
    /// redelivers those messages).
    fn lost(&self, forget: impl FnOnce()) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.connected = false;
        st.acks.clear();
        forget();
    }
}

/// An incoming event message, tagged with the connection that delivered it.
#[derive(Debug)]
pub struct Inbound {
    pub epoch: u64,
    pub publish: Publish,
}

/// What the publisher needs to hear from the event loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkEvent {
    /// CONNACK: a new connection `epoch`; `session_present` as the broker said.
    Connected { epoch: u64, session_present: bool },
    /// The connection `epoch` is gone; nothing queued for it will be sent.
    Lost { epoch: u64 },
    /// rumqttc wrote a publish of ours with this packet id (in request order).
    Sent { epoch: u64, pkid: u16 },
    /// The broker acknowledged our publish with this packet id.
    Acked { epoch: u64, pkid: u16 },
    /// The event loop ended (shutdown).
    Closed,
}

/// What the broker said about the hub's right to be there (mqtt.md
/// 'Broker access'): the control task turns refusals into `broker_denied`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The broker refused the connection (CONNACK with this code).
    ConnectRefused(ConnectReturnCode),
    /// The broker refused the subscription to the events topic (SUBACK 0x80).
    SubscribeRefused,
    /// The subscription to the events topic was granted.
    Granted,
}

impl Access {
    /// What a failed connection attempt says about access, if anything: a
    /// CONNACK refusal is the broker's word, every other failure (TCP, TLS,
    /// timeouts) is the network's.
    pub fn of_connection_error(e: &rumqttc::ConnectionError) -> Option<Access> {
        match e {
            rumqttc::ConnectionError::ConnectionRefused(code) => {
                Some(Access::ConnectRefused(*code))
            }
            _ => None,
        }
    }

    /// What the SUBACK for the events topic (the only topic the hub
    /// subscribes to) says.
    pub fn of_suback(codes: &[SubscribeReasonCode]) -> Access {
        if !codes.is_empty()
            && codes
                .iter()
                .all(|c| matches!(c, SubscribeReasonCode::Success(_)))
        {
            Access::Granted
        } else {
            Access::SubscribeRefused
        }
    }

    /// For logs: what the broker refused, in the broker's words.
    pub fn describe(self) -> String {
        match self {
            Access::ConnectRefused(ConnectReturnCode::BadUserNamePassword) => {
                "connection refused: bad user name or password".to_owned()
            }
            Access::ConnectRefused(ConnectReturnCode::NotAuthorized) => {
                "connection refused: not authorised".to_owned()
            }
            Access::ConnectRefused(code) => format!("connection refused: {code:?}"),
            Access::SubscribeRefused => "subscription to the events topic refused".to_owned(),
            Access::Granted => "subscription granted".to_owned(),
        }
    }
}

/// Where the poll task forwards what it sees.
pub struct PollSinks {
    pub inbound: mpsc::Sender<Inbound>,
    /// Publisher: Sent / Acked / Connected / Lost.
    pub link: mpsc::Sender<LinkEvent>,
    /// Everyone else who cares about Connected / Lost (sync planner).
    pub session: mpsc::Sender<LinkEvent>,
    /// The control task: refusals and grants (`broker_denied`).
    pub access: mpsc::Sender<Access>,
}

/// Messages the poll task has taken from the event loop but not yet handed
/// on. The poll task must never wait on a full channel: if it did, rumqttc
/// would stop reading the socket, PUBACKs would stop arriving, the
/// publisher's window and rumqttc's in-flight slots would stay full, the
/// ingest task's acks could not be queued, and ingest would stop draining
/// the channel the poll task waits on — a deadlock. So it parks what does
/// not fit here and hands it on as capacity frees, while it keeps polling.
///
/// The backlog is bounded by the hub's [`ReceiveWindow`] (reading pauses
/// while it is full); past [`MAX_PARKED`], which the window keeps out of
/// reach, the connection is dropped and the broker redelivers what was
/// unacked.
struct Parked<T> {
    tx: mpsc::Sender<T>,
    queue: VecDeque<T>,
}

/// Beyond this many parked messages the connection is recycled.
const MAX_PARKED: usize = 8192;

impl<T> Parked<T> {
    fn new(tx: mpsc::Sender<T>) -> Self {
        Parked {
            tx,
            queue: VecDeque::new(),
        }
    }

    /// Hands `item` on now if there is room, otherwise parks it (behind
    /// anything parked earlier, so order is kept). `false` when the receiver
    /// is gone.
    fn push(&mut self, item: T) -> bool {
        if self.queue.is_empty() {
            match self.tx.try_send(item) {
                Ok(()) => return true,
                Err(mpsc::error::TrySendError::Full(item)) => self.queue.push_back(item),
                Err(mpsc::error::TrySendError::Closed(_)) => return false,
            }
        } else {
            self.queue.push_back(item);
        }
        true
    }

    fn overflowing(&self) -> bool {
        self.queue.len() > MAX_PARKED
    }

    /// Waits for room for the oldest parked item and sends it. Only polled
    /// while something is parked.
    async fn drain_one(&mut self) -> bool {
        match self.tx.reserve().await {
            Ok(permit) => {
                if let Some(item) = self.queue.pop_front() {
                    permit.send(item);
                }
                true
            }
            Err(_) => false,
        }
    }
}

/// Whether the connection died on an incoming packet over
/// [`MAX_INCOMING_PACKET`]. With Mosquitto's `message_size_limit` set (as
/// it should be) this never happens; without it, one oversized publish on
/// the events topic would otherwise wedge the hub in a reconnect loop.
fn poisoned_session(e: &rumqttc::ConnectionError) -> bool {
    matches!(
        e,
        rumqttc::ConnectionError::MqttState(rumqttc::StateError::Deserialization(
            rumqttc::mqttbytes::Error::PayloadSizeLimitExceeded(_)
        ))
    )
}

/// Writes PUBACKs straight to the connection, bypassing rumqttc's request
/// channel (see the module docs). rumqttc keeps no state for an incoming
/// QoS 1 message under manual acks, so there is nothing to update there.
/// `Framed` encodes each packet whole into its write buffer, so these never
/// interleave with rumqttc's own packets, even when a `poll()` was dropped
/// mid-flush: the next flush sends both, in order.
async fn write_acks(eventloop: &mut EventLoop, pkids: &[u16]) -> Result<(), String> {
    let Some(network) = eventloop.network.as_mut() else {
        return Err("no connection to ack on".to_owned());
    };
    let io = async {
        for &pkid in pkids {
            network.write(Packet::PubAck(PubAck::new(pkid))).await?;
        }
        network.flush().await
    };
    match tokio::time::timeout(ACK_WRITE_TIMEOUT, io).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("cannot write acks: {e}")),
        Err(_) => Err("timed out writing acks".to_owned()),
    }
}

/// Sleeps until `at` (never returns for `None`; the select guards it).
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Logs a refusal by the broker: at warn the first time (and whenever what
/// is refused changes), at debug while the same refusal repeats, so a hub
/// retrying for days does not flood its log.
fn note_refusal(last: &mut Option<Access>, refusal: Access, topic: &str, retry_in: Duration) {
    let what = refusal.describe();
    if *last == Some(refusal) {
        tracing::debug!(refused = %what, topic, ?retry_in, "the broker still refuses");
    } else {
        tracing::warn!(
            refused = %what,
            topic,
            ?retry_in,
            "the broker refused the hub (broker_denied); check its ACL and credentials for this hub's identity"
        );
    }
    *last = Some(refusal);
}

/// Polls the event loop until `stop` turns true and the connection is
/// closed (cleanly by the publisher, or lost). Only forwards; never awaits
/// the client. Stops reading while `window` is full, and writes the acks the
/// [`Gate`] queues. `reconnect` drops the current connection on purpose
/// (the ingest pipeline asks for it after a storage failure, to get the
/// unacked messages redelivered).
pub async fn poll_loop(
    mut eventloop: EventLoop,
    gate: Arc<Gate>,
    sinks: PollSinks,
    events_topic: String,
    window: ReceiveWindow,
    reconnect: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    enum Step {
        Event(Result<Event, rumqttc::ConnectionError>),
        Kick,
        Stop,
        /// Acks are queued for this connection.
        Acks,
        /// A parked message was handed on (or its receiver is gone).
        Drained(bool),
        /// Time to ask again for the subscription the broker refused.
        Resubscribe,
    }
    let PollSinks {
        inbound,
        link,
        session,
        access,
    } = sinks;
    let mut inbound = Parked::new(inbound);
    let mut link = Parked::new(link);
    let mut session = Parked::new(session);
    let mut access = Parked::new(access);
    let mut outstanding = Outstanding::default();
    let mut backoff = reconnect_backoff();
    // A refused subscription is asked for again on the same connection
    // (what the hub publishes may still be allowed), with its own backoff.
    let mut subscribe_backoff = reconnect_backoff();
    let mut resubscribe_at: Option<tokio::time::Instant> = None;
    // The last refusal logged at warn level (repeats go to debug).
    let mut last_refusal: Option<Access> = None;
    let mut epoch = 0u64;
    let mut up = false;
    // A message bigger than MAX_INCOMING_PACKET stays at the head of our
    // persistent session: rumqttc cannot read (or ack) it, so every
    // reconnect gets it again and the hub would never see another event.
    // When that happens we drop the session once (see `poisoned_session`).
    let mut drop_session = false;
    loop {
        // While connected, `acks_ready` is always armed, so the select never
        // runs out of branches even with reading paused.
        let reading = !up || !outstanding.full(&window);
        let step = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s), if !up => Step::Stop,
            _ = reconnect.notified(), if up => Step::Kick,
            _ = gate.acks_ready.notified(), if up => Step::Acks,
            ok = inbound.drain_one(), if !inbound.queue.is_empty() => Step::Drained(ok),
            ok = link.drain_one(), if !link.queue.is_empty() => Step::Drained(ok),
            ok = session.drain_one(), if !session.queue.is_empty() => Step::Drained(ok),
            ok = access.drain_one(), if !access.queue.is_empty() => Step::Drained(ok),
            _ = sleep_until_some(resubscribe_at), if up && resubscribe_at.is_some() => Step::Resubscribe,
            ev = eventloop.poll(), if reading => Step::Event(ev),
        };
        let failure = match step {
            Step::Stop => break,
            Step::Drained(true) => continue,
            Step::Drained(false) => break,
            Step::Resubscribe => {
                resubscribe_at = None;
                tracing::debug!("asking again for the refused subscription");
                let _ = gate.subscribe(epoch, &events_topic);
                continue;
            }
            Step::Acks => {
                let pkids = gate.take_acks(epoch);
                if pkids.is_empty() {
                    continue;
                }
                match write_acks(&mut eventloop, &pkids).await {
                    Ok(()) => {
                        for pkid in pkids {
                            outstanding.acked(pkid);
                        }
                        continue;
                    }
                    Err(e) => e,
                }
            }
            Step::Event(Ok(_)) if inbound.overflowing() || link.overflowing() => {
                let flow = gate.flow();
                format!(
                    "too many messages waiting for the hub's own tasks ({} events, {} link events; \
                     {} events received and {} acks queued since start)",
                    inbound.queue.len(),
                    link.queue.len(),
                    flow.received,
                    flow.acks_queued
                )
            }
            Step::Kick => "reconnecting to get unacked events redelivered".to_owned(),
            Step::Event(Ok(ev)) => {
                match ev {
                    Event::Incoming(Packet::ConnAck(_)) if drop_session => {
                        // This clean connection has discarded the broker's
                        // session and the oversized message with it. Go back
                        // to a persistent session at once, without
                        // subscribing here: the next CONNACK says the session
                        // is new, and the sync planner asks the cloud for
                        // everything from W+1 (`fresh_session`), which covers
                        // whatever the discarded session still held.
                        drop_session = false;
                        eventloop.mqtt_options.set_clean_session(false);
                        tracing::warn!("discarded the broker session holding an oversized message");
                        gate.lost(|| {
                            eventloop.clean();
                            eventloop.pending.clear();
                        });
                        continue;
                    }
                    Event::Incoming(Packet::ConnAck(ack)) => {
                        epoch = gate.connected();
                        up = true;
                        outstanding.reset();
                        backoff.reset();
                        resubscribe_at = None;
                        tracing::info!(
                            epoch,
                            session_present = ack.session_present,
                            "mqtt connected"
                        );
                        // Subscribing again on a resumed session is harmless,
                        // and a broker that lost the session needs it.
                        let _ = gate.subscribe(epoch, &events_topic);
                        let ev = LinkEvent::Connected {
                            epoch,
                            session_present: ack.session_present,
                        };
                        link.push(ev);
                        session.push(ev);
                    }
                    Event::Incoming(Packet::Publish(publish)) => {
                        if publish.qos != QoS::AtMostOnce {
                            outstanding.received(publish.pkid, publish.payload.len());
                        }
                        gate.note_received(outstanding.len());
                        // `false`: the ingest task is gone; so is the daemon.
                        let handed_on = inbound.push(Inbound { epoch, publish });
                        if !handed_on {
                            break;
                        }
                    }
                    Event::Incoming(Packet::PubAck(ack)) => {
                        let ev = LinkEvent::Acked {
                            epoch,
                            pkid: ack.pkid,
                        };
                        link.push(ev);
                    }
                    Event::Incoming(Packet::SubAck(ack)) => {
                        let verdict = Access::of_suback(&ack.return_codes);
                        if verdict == Access::Granted {
                            tracing::debug!(codes = ?ack.return_codes, "subscribed");
                            subscribe_backoff.reset();
                            if last_refusal.take().is_some() {
                                tracing::info!(topic = %events_topic, "the broker now grants the subscription");
                            }
                        } else {
                            let delay = subscribe_backoff.next_delay(rand::random());
                            note_refusal(&mut last_refusal, verdict, &events_topic, delay);
                            resubscribe_at = Some(tokio::time::Instant::now() + delay);
                        }
                        access.push(verdict);
                    }
                    Event::Outgoing(Outgoing::Publish(pkid)) => {
                        link.push(LinkEvent::Sent { epoch, pkid });
                    }
                    Event::Outgoing(Outgoing::Disconnect) => {
                        // Our own clean disconnect (shutdown): stop here, so
                        // rumqttc does not reconnect.
                        gate.lost(|| {});
                        break;
                    }
                    _ => {}
                }
                continue;
            }
            Step::Event(Err(e)) => {
                if poisoned_session(&e) {
                    drop_session = true;
                    eventloop.mqtt_options.set_clean_session(true);
                }
                if let Some(refusal) = Access::of_connection_error(&e) {
                    // The delay is only for the log line; the backoff below
                    // is the same one every failed attempt takes.
                    note_refusal(&mut last_refusal, refusal, &events_topic, backoff.peek());
                    access.push(refusal);
                }
                e.to_string()
            }
        };
        let was_up = up;
        up = false;
        gate.lost(|| {
            eventloop.clean();
            eventloop.pending.clear();
        });
        if was_up {
            tracing::warn!(epoch, error = %failure, "mqtt connection lost");
            link.push(LinkEvent::Lost { epoch });
            session.push(LinkEvent::Lost { epoch });
        } else {
            tracing::debug!(error = %failure, "mqtt connect failed");
        }
        if *stop.borrow() {
            break;
        }
        let delay = backoff.next_delay(rand::random());
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        // Anything queued while we slept belonged to no connection.
        gate.lost(|| {
            eventloop.clean();
            eventloop.pending.clear();
        });
    }
    // The end is told after everything parked: nothing is lost on the way out.
    while !link.queue.is_empty() && link.drain_one().await {}
    let _ = link.tx.send(LinkEvent::Closed).await;
    while !session.queue.is_empty() && session.drain_one().await {}
    while !inbound.queue.is_empty() && inbound.drain_one().await {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connack_refusal_is_the_brokers_word_and_a_network_failure_is_not() {
        let refused = rumqttc::ConnectionError::ConnectionRefused(ConnectReturnCode::NotAuthorized);
        assert_eq!(
            Access::of_connection_error(&refused),
            Some(Access::ConnectRefused(ConnectReturnCode::NotAuthorized))
        );
        let io = rumqttc::ConnectionError::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        ));
        assert_eq!(Access::of_connection_error(&io), None);
        assert_eq!(
            Access::of_connection_error(&rumqttc::ConnectionError::NetworkTimeout),
            None
        );
    }

    #[test]
    fn a_suback_with_0x80_is_a_refusal_and_a_granted_qos_is_not() {
        assert_eq!(
            Access::of_suback(&[SubscribeReasonCode::Success(QoS::AtLeastOnce)]),
            Access::Granted
        );
        // Granted at a lower QoS is still granted (the broker's choice).
        assert_eq!(
            Access::of_suback(&[SubscribeReasonCode::Success(QoS::AtMostOnce)]),
            Access::Granted
        );
        assert_eq!(
            Access::of_suback(&[SubscribeReasonCode::Failure]),
            Access::SubscribeRefused
        );
        assert_eq!(Access::of_suback(&[]), Access::SubscribeRefused);
    }

    #[test]
    fn what_was_refused_is_said_in_the_log_line_without_secrets() {
        let s = Access::ConnectRefused(ConnectReturnCode::BadUserNamePassword).describe();
        assert_eq!(s, "connection refused: bad user name or password");
        assert!(Access::SubscribeRefused.describe().contains("events topic"));
    }
}
