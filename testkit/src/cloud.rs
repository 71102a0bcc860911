//! The test cloud: its signing key and events, the hub's public key and
//! the envelope opener, and [`CloudClient`], what the cloud sees and sends
//! over the broker.
//!
//! [`CloudClient`] speaks MQTT 5 with a large Receive Maximum on purpose:
//! Mosquitto then never has to queue what the hub says to it, so a broker
//! with a tiny `max_queued_messages` drops only what the test means it to
//! drop (events for the offline hub). Every hub envelope is checked against
//! the hub's public key, derived from the secrets file, before a test sees
//! its body.
//!
//! Bodies, PINs, tags and secrets are never printed: failures name event
//! ids, seqs, outcomes and counts.

use crate::daemon::WAIT;
use crate::files::{HUB_ID, SECRETS_TOML, SITE_ID};
use ed25519_dalek::{SigningKey, VerifyingKey};
use lockhub::sim::cloud::Cloud;
use lockhub_proto::crypto;
use lockhub_proto::event::Reason;
use lockhub_proto::sign::{GrantSpec, SignedEvent};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use uuid::Uuid;

/// The trust-ring id the test cloud signs as.
pub const SIGNER_ID: &str = "test-cloud";

pub fn topic(leaf: &str) -> String {
    format!("lockhub/v1/{SITE_ID}/{HUB_ID}/{leaf}")
}

/// The test cloud's signing key (in the daemon's trust ring).
pub fn cloud_key() -> SigningKey {
    SigningKey::from_bytes(&[42; 32])
}

/// A key outside the trust ring: what a forger has.
pub fn rogue_key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

pub fn cloud() -> Cloud {
    Cloud::new(cloud_key(), SIGNER_ID, SITE_ID.parse().unwrap(), HUB_ID)
}

fn secret(path: &[&str]) -> [u8; 32] {
    let v: toml::Value = toml::from_str(&SECRETS_TOML).unwrap();
    let mut cur = &v;
    for p in path {
        cur = match p.parse::<usize>() {
            Ok(i) => &cur[i],
            Err(_) => &cur[*p],
        };
    }
    crypto::b64u_decode_32(cur.as_str().unwrap()).unwrap()
}

/// The hub's signing key, from the secrets file the daemon uses (for a
/// test that runs the sync layer in process).
pub fn hub_key() -> SigningKey {
    SigningKey::from_bytes(&secret(&["hub_key", "secret"]))
}

/// The hub's public key, derived from the secrets file the daemon uses.
pub fn hub_public_key() -> VerifyingKey {
    hub_key().verifying_key()
}

/// The PIN key `k1` of the secrets file.
pub fn pin_key() -> [u8; 32] {
    secret(&["pin_key", "0", "secret"])
}

/// An active grant for door 101 with a PIN unique to `n` (no pin_collision,
/// no one_active_conflict between grants with different `n`).
pub fn grant(n: usize) -> GrantSpec {
    let pin = format!("{:06}", 100_000 + n);
    GrantSpec::active(
        &format!("k-{n}"),
        &format!("c-{n}"),
        "101",
        &pin,
        ("k1", &pin_key()),
    )
}

/// `count` key.issued events, seqs following on from the cloud's counter.
pub fn issue_many(cloud: &mut Cloud, from: usize, count: usize) -> Vec<SignedEvent> {
    (from..from + count)
        .map(|n| cloud.key_issued(&grant(n), &[]))
        .collect()
}

/// Opens a hub envelope of the vectors' hub ([`crypto::open_hub_envelope`]:
/// shape, hub id, signature by the hub key from the secrets file) and
/// returns its body. Panics naming only what failed.
pub fn open_hub_envelope(payload: &[u8]) -> Value {
    let body = crypto::open_hub_envelope(payload, HUB_ID, &hub_public_key())
        .unwrap_or_else(|e| panic!("hub envelope refused: {e}"));
    serde_json::from_slice(&body).expect("hub body is JSON")
}

/// One thing the hub said, signature checked.
#[derive(Debug, Clone)]
pub struct Heard {
    /// `results`, `audit`, `alerts`, `sync` or `status`.
    pub leaf: String,
    /// The verified body (plain JSON for `status`).
    pub body: Value,
}

enum Raw {
    Connected,
    Message(String, Vec<u8>),
}

/// The cloud's side of the broker: hears everything under the hub's
/// topics, publishes events.
pub struct CloudClient {
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Raw>,
    task: tokio::task::JoinHandle<()>,
    /// Broker PUBACKs for our publishes (the broker holds them from then on).
    acked: Arc<AtomicUsize>,
    pub connects: usize,
    pub heard: Vec<Heard>,
}

impl CloudClient {
    pub async fn plain(port: u16) -> Self {
        Self::connect(MqttOptions::new(
            format!("test-cloud-{}", Uuid::new_v4()),
            "127.0.0.1",
            port,
        ))
        .await
    }

    /// Connects with `o` (plus a persistent session and a large Receive
    /// Maximum), subscribes to `P/S/H/#` on every connection, and waits for
    /// the first SUBACK.
    pub async fn connect(mut o: MqttOptions) -> Self {
        o.set_clean_start(false)
            .set_session_expiry_interval(Some(3600))
            .set_receive_maximum(Some(u16::MAX))
            .set_max_packet_size(Some(8 << 20))
            .set_outgoing_inflight_upper_limit(200)
            .set_keep_alive(Duration::from_secs(30));
        let (client, mut eventloop) = AsyncClient::new(o, 4096);
        let (tx, rx) = mpsc::unbounded_channel();
        let acked = Arc::new(AtomicUsize::new(0));
        let (sub, acks) = (client.clone(), acked.clone());
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = sub.try_subscribe(topic("#"), QoS::AtLeastOnce);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = tx.send(Raw::Connected);
                    }
                    Ok(Event::Incoming(Packet::PubAck(_))) => {
                        acks.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let t = String::from_utf8_lossy(&p.topic).into_owned();
                        let _ = tx.send(Raw::Message(t, p.payload.to_vec()));
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        let mut c = CloudClient {
            client,
            rx,
            task,
            acked,
            connects: 0,
            heard: Vec::new(),
        };
        c.wait_until("the cloud's subscription", |c| c.connects >= 1)
            .await;
        c
    }

    fn take(&mut self, raw: Raw) {
        match raw {
            Raw::Connected => self.connects += 1,
            Raw::Message(t, p) => {
                let prefix = topic("");
                let Some(leaf) = t.strip_prefix(&prefix) else {
                    return;
                };
                let body = match leaf {
                    "events" => return,
                    "status" => serde_json::from_slice(&p).expect("status JSON"),
                    _ => open_hub_envelope(&p),
                };
                self.heard.push(Heard {
                    leaf: leaf.to_owned(),
                    body,
                });
            }
        }
    }

    /// Takes in whatever has arrived, without waiting.
    pub fn drain(&mut self) {
        while let Ok(raw) = self.rx.try_recv() {
            self.take(raw);
        }
    }

    /// Waits until `f` holds over what was heard (bounded by [`WAIT`]).
    pub async fn wait_until(&mut self, what: &str, mut f: impl FnMut(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        self.drain();
        while !f(self) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(raw)) => self.take(raw),
                Ok(None) => panic!("cloud client gone"),
                Err(_) => panic!(
                    "timed out waiting for {what}; heard {} messages ({:?})",
                    self.heard.len(),
                    self.summary()
                ),
            }
        }
    }

    /// Counts per leaf, for failure messages.
    pub fn summary(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for h in &self.heard {
            *m.entry(h.leaf.clone()).or_default() += 1;
        }
        m
    }

    pub fn on(&self, leaf: &str) -> impl Iterator<Item = &Value> {
        let leaf = leaf.to_owned();
        self.heard
            .iter()
            .filter(move |h| h.leaf == leaf)
            .map(|h| &h.body)
    }

    pub fn results(&self) -> Vec<&Value> {
        self.on("results").collect()
    }

    pub fn sync_requests(&self) -> Vec<&Value> {
        self.on("sync").collect()
    }

    /// Every answer to an authenticated event, by event id. A step-1
    /// rejection's `event_id` is only the unsigned envelope's hint (a forger
    /// can put any id there), so it answers nothing and is left out.
    pub fn results_by_id(&self) -> HashMap<Uuid, Vec<&Value>> {
        let mut m: HashMap<Uuid, Vec<&Value>> = HashMap::new();
        for r in self.on("results") {
            let step1 = r["reason"]
                .as_str()
                .and_then(Reason::parse)
                .is_some_and(Reason::is_step1);
            if step1 {
                continue;
            }
            if let Some(id) = r["event_id"].as_str() {
                m.entry(id.parse().unwrap()).or_default().push(r);
            }
        }
        m
    }

    /// Waits until every event in `events` has at least one result.
    pub async fn wait_results(&mut self, events: &[SignedEvent]) {
        let want: HashSet<Uuid> = events.iter().map(|e| e.event_id).collect();
        self.wait_until(&format!("results for {} events", want.len()), |c| {
            let got = c.results_by_id();
            want.iter().all(|id| got.contains_key(id))
        })
        .await;
    }

    /// Whether the hub's last status says online.
    pub fn is_online(&self) -> bool {
        self.on("status")
            .last()
            .is_some_and(|s| s["state"] == "online")
    }

    pub async fn wait_online(&mut self) {
        self.wait_until("the hub's online status", |c| c.is_online())
            .await;
    }

    /// The opening of most sync tests: the cloud subscribes on `port`
    /// first (so it hears everything from the hub's first message), then a
    /// daemon starts on the broker at `url`, and both are returned once the
    /// hub is online.
    pub async fn with_online_hub(
        port: u16,
        url: &str,
        opts: crate::daemon::DaemonOptions,
    ) -> (Self, crate::daemon::Daemon) {
        let mut cloud = Self::plain(port).await;
        let hub = crate::daemon::Daemon::start(url, opts);
        cloud.wait_online().await;
        (cloud, hub)
    }

    /// Publishes raw bytes on the events topic (QoS 1).
    pub async fn publish_raw(&self, payload: Vec<u8>) {
        self.client
            .publish(topic("events"), QoS::AtLeastOnce, false, payload)
            .await
            .expect("queue publish");
    }

    pub async fn publish(&self, events: &[SignedEvent]) {
        for e in events {
            self.publish_raw(e.envelope.clone()).await;
        }
    }

    /// Waits until the broker has acknowledged `n` of our publishes in all.
    pub async fn wait_acked(&mut self, n: usize) {
        let acked = self.acked.clone();
        let deadline = tokio::time::Instant::now() + WAIT;
        while acked.load(Ordering::SeqCst) < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "broker acked {} of {n} publishes",
                acked.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for CloudClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Asserts each event was answered, and answered once: every result for an
/// id is either the first answer (re-sent byte-identical after a crash
/// between PUBACK and marking it sent: the cloud dedupes such repeats) or a
/// later `duplicate: true` replay of it. `outcome` is what the first says.
pub fn assert_answered_once(cloud: &CloudClient, events: &[SignedEvent], outcome: &str) {
    let by_id = cloud.results_by_id();
    for e in events {
        let rs = by_id
            .get(&e.event_id)
            .unwrap_or_else(|| panic!("no result for seq {:?}", e.seq));
        let firsts: HashSet<String> = rs
            .iter()
            .filter(|r| r["duplicate"] != true)
            .map(|r| r.to_string())
            .collect();
        assert_eq!(
            firsts.len(),
            1,
            "seq {:?}: {} distinct first answers",
            e.seq,
            firsts.len()
        );
        for r in rs {
            assert_eq!(r["outcome"], outcome, "seq {:?}", e.seq);
            assert_eq!(r["seq"], serde_json::json!(e.seq), "seq {:?}", e.seq);
        }
    }
}
