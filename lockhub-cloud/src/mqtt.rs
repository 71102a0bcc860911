//! The broker connections: options, one [`Link`] per broker identity, and
//! the reconnect backoff.
//!
//! ## Why it is shaped like this
//! - **One identity per connection.** mqtt.md: brokers that use the user
//!   name as the client id drop the older of two connections with one name,
//!   so the publisher and the subscriber are `NAME-pub` and `NAME-sub`
//!   (client id, and user name when one is given). A one-shot command
//!   logs in as the publisher under the client id `NAME-cmd-PID`, so it
//!   does not take `serve`'s connection away (a broker that makes the user
//!   name the client id needs the command to use another `--identity`).
//! - **A link is one connection, never reconnected in place.** rumqttc
//!   re-sends or drops its own pending requests across a reconnect, and
//!   manual acks of the old session are lost. Instead a [`Link`] whose
//!   connection fails is dropped whole; the owner waits its [`Backoff`] and
//!   starts a new one, then re-sends everything the database still holds as
//!   unpublished (the hub dedupes on `event_id`), and the broker redelivers
//!   what the subscriber had not acked (the recorder dedupes audit rows).
//! - **The task that polls never awaits the client**: it only forwards
//!   what happens into a bounded channel; the owner publishes and acks.
//! - **Bounded**: the request channel, the in-flight window, the event
//!   channel and the packet sizes (rumqttc's default 10 KiB is too small
//!   for a batch of 500 grants).

use rumqttc::{
    AsyncClient, ConnectionError, Event, MqttOptions, Outgoing, Packet, Publish, QoS,
    TlsConfiguration, Transport,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_rustls::rustls;

/// Largest packet either way: a cloud envelope is at most 1 MiB
/// (mqtt.md), and a hub's proof with 256 bucket digests is far smaller.
pub const MAX_PACKET: usize = 2 * 1024 * 1024;
/// Publishes in flight (sent, not yet acked) per connection.
pub const WINDOW: usize = 256;
/// rumqttc's request channel: the window, plus acks and subscriptions.
pub const REQUEST_CAPACITY: usize = WINDOW + 64;
/// What the polling task may have queued for its owner.
pub const EVENT_CAPACITY: usize = 1024;
pub const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// The MQTT boundary's errors. None carries a password or a payload.
#[derive(Debug, thiserror::Error)]
pub enum MqttError {
    #[error("broker URL {0:?}: use mqtt://host[:port] or mqtts://host[:port]")]
    Url(String),
    #[error("{path}: {detail}")]
    File { path: PathBuf, detail: String },
    #[error("mqtts needs --ca-file (the CA that signed the broker's certificate)")]
    NoCa,
    #[error("TLS: {0}")]
    Tls(String),
    #[error("the broker refused or dropped the connection: {0}")]
    Connection(String),
    #[error("timed out: {0}")]
    Timeout(String),
}

/// How to reach the broker (the `--broker` family of options).
#[derive(Debug, Clone)]
pub struct BrokerSettings {
    pub url: String,
    pub topic_prefix: String,
    /// The base of both identities: `NAME-pub` and `NAME-sub`.
    pub identity: String,
    /// Log in as `USER-pub` / `USER-sub` with the password in the file.
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// Which of the cloud's two connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Publishes events; a clean session (the database is the queue).
    Publisher,
    /// Hears the hubs; a persistent session, so what they send while the
    /// cloud is down waits at the broker.
    Subscriber,
    /// A one-shot command's publisher: logs in as the publisher, under a
    /// client id of its own, so it does not take `serve`'s connection away.
    Command,
}

impl Role {
    fn client_id(self, identity: &str) -> String {
        match self {
            Role::Publisher => format!("{identity}-pub"),
            Role::Subscriber => format!("{identity}-sub"),
            Role::Command => format!("{identity}-cmd-{}", std::process::id()),
        }
    }

    fn user_suffix(self) -> &'static str {
        match self {
            Role::Publisher | Role::Command => "pub",
            Role::Subscriber => "sub",
        }
    }
}

fn parse_url(url: &str) -> Result<(bool, String, u16), MqttError> {
    let bad = || MqttError::Url(url.to_owned());
    let (tls, rest) = if let Some(r) = url.strip_prefix("mqtts://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("mqtt://") {
        (false, r)
    } else {
        return Err(bad());
    };
    let rest = rest.trim_end_matches('/');
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().map_err(|_| bad())?),
        None => (rest, if tls { 8883 } else { 1883 }),
    };
    if host.is_empty() || host.contains('/') {
        return Err(bad());
    }
    Ok((tls, host.to_owned(), port))
}

fn read_file(path: &Path) -> Result<Vec<u8>, MqttError> {
    std::fs::read(path).map_err(|e| MqttError::File {
        path: path.to_owned(),
        detail: e.to_string(),
    })
}

fn tls(s: &BrokerSettings) -> Result<rustls::ClientConfig, MqttError> {
    let file_err = |path: &Path, detail: &str| MqttError::File {
        path: path.to_owned(),
        detail: detail.to_owned(),
    };
    let ca = s.ca_file.as_deref().ok_or(MqttError::NoCa)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut read_file(ca)?.as_slice()) {
        let cert = cert.map_err(|_| file_err(ca, "holds a PEM block that does not parse"))?;
        roots
            .add(cert)
            .map_err(|_| file_err(ca, "holds a certificate that is not usable as a CA"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| MqttError::Tls(e.to_string()))?
        .with_root_certificates(roots);
    match (&s.cert_file, &s.key_file) {
        (Some(cert), Some(key)) => {
            let chain = rustls_pemfile::certs(&mut read_file(cert)?.as_slice())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| file_err(cert, "holds a PEM block that does not parse"))?;
            let private = rustls_pemfile::private_key(&mut read_file(key)?.as_slice())
                .ok()
                .flatten()
                .ok_or_else(|| file_err(key, "holds no usable PEM private key"))?;
            builder
                .with_client_auth_cert(chain, private)
                .map_err(|e| MqttError::Tls(e.to_string()))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// The options of one connection.
pub fn options(s: &BrokerSettings, role: Role) -> Result<MqttOptions, MqttError> {
    let (is_tls, host, port) = parse_url(s.url.trim())?;
    let mut o = MqttOptions::new(role.client_id(&s.identity), host, port);
    o.set_clean_session(role != Role::Subscriber)
        .set_manual_acks(true)
        .set_keep_alive(KEEP_ALIVE)
        .set_inflight(WINDOW as u16)
        .set_request_channel_capacity(REQUEST_CAPACITY)
        .set_max_packet_size(MAX_PACKET, MAX_PACKET);
    if let Some(user) = &s.username {
        let password = match &s.password_file {
            Some(p) => String::from_utf8_lossy(&read_file(p)?)
                .trim_end_matches(['\r', '\n'])
                .to_owned(),
            None => String::new(),
        };
        o.set_credentials(format!("{user}-{}", role.user_suffix()), password);
    }
    if is_tls {
        o.set_transport(Transport::Tls(TlsConfiguration::Rustls(Arc::new(tls(s)?))));
    }
    Ok(o)
}

/// What a connection reports to its owner.
#[derive(Debug)]
pub enum LinkEvent {
    /// CONNACK accepted.
    Up { session_present: bool },
    /// SUBACK: whether every filter was granted.
    Subscribed { granted: bool },
    /// A publish from the broker (ack it with [`Link::ack`] once handled).
    Message(Publish),
    /// Our publish went out with this packet id (in request order).
    Sent(u16),
    /// The broker acknowledged our publish with this packet id.
    Acked(u16),
    /// The connection failed; the link is finished.
    Down(String),
}

/// One connection: the client, and the task that polls its event loop.
pub struct Link {
    client: AsyncClient,
    pub events: mpsc::Receiver<LinkEvent>,
    task: tokio::task::JoinHandle<()>,
}

impl Link {
    /// Connects with `options`, subscribing to `filters` (QoS 1) after
    /// every CONNACK.
    pub fn start(options: MqttOptions, filters: Vec<String>) -> Link {
        let (client, mut eventloop) = AsyncClient::new(options, REQUEST_CAPACITY);
        let (tx, events) = mpsc::channel(EVENT_CAPACITY);
        let sub = client.clone();
        let task = tokio::spawn(async move {
            loop {
                let ev = match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(c))) => {
                        if !filters.is_empty() {
                            let many = filters.iter().map(|f| {
                                rumqttc::SubscribeFilter::new(f.clone(), QoS::AtLeastOnce)
                            });
                            // try_: this task must never wait on the client.
                            let _ = sub.try_subscribe_many(many);
                        }
                        LinkEvent::Up {
                            session_present: c.session_present,
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(s))) => LinkEvent::Subscribed {
                        granted: s
                            .return_codes
                            .iter()
                            .all(|c| !matches!(c, rumqttc::SubscribeReasonCode::Failure)),
                    },
                    Ok(Event::Incoming(Packet::Publish(p))) => LinkEvent::Message(p),
                    Ok(Event::Incoming(Packet::PubAck(a))) => LinkEvent::Acked(a.pkid),
                    Ok(Event::Outgoing(Outgoing::Publish(pkid))) => LinkEvent::Sent(pkid),
                    Ok(_) => continue,
                    Err(e) => {
                        let _ = tx.send(LinkEvent::Down(describe(&e))).await;
                        return;
                    }
                };
                if tx.send(ev).await.is_err() {
                    return;
                }
            }
        });
        Link {
            client,
            events,
            task,
        }
    }

    /// Queues a QoS 1 publish; `false` when the request channel is full
    /// (the caller keeps it and tries again after the next event).
    pub fn try_publish(&self, topic: &str, payload: Vec<u8>) -> bool {
        self.client
            .try_publish(topic, QoS::AtLeastOnce, false, payload)
            .is_ok()
    }

    /// Acknowledges a handled message (lost if the connection has gone:
    /// the broker then redelivers it).
    pub fn ack(&self, publish: &Publish) {
        let _ = self.client.try_ack(publish);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn describe(e: &ConnectionError) -> String {
    match e {
        ConnectionError::ConnectionRefused(code) => format!("connection refused: {code:?}"),
        other => other.to_string(),
    }
}

/// Reconnect delays: from `start`, doubling up to `max`, reset once a
/// connection is up. (The hub's own backoff lives in the hub crate; the
/// cloud needs only this much of it.)
#[derive(Debug, Clone)]
pub struct Backoff {
    start: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    pub fn new(start: Duration, max: Duration) -> Self {
        Backoff {
            start,
            max,
            step: start,
        }
    }

    pub fn next_delay(&mut self) -> Duration {
        let d = self.step;
        self.step = (self.step * 2).min(self.max);
        d
    }

    pub fn reset(&mut self) {
        self.step = self.start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_scheme_host_and_port() {
        assert_eq!(
            parse_url("mqtt://127.0.0.1:1884").unwrap(),
            (false, "127.0.0.1".into(), 1884)
        );
        assert_eq!(
            parse_url("mqtts://broker.example.net").unwrap(),
            (true, "broker.example.net".into(), 8883)
        );
        for bad in ["tcp://h", "mqtt://", "mqtt://h:x", "h:1883"] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let d: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(d, vec![100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay().as_millis(), 100);
    }
}
