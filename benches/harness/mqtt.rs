//! MQTT clients for the benchmarks (rumqttc, the same library the hub uses):
//! a fast publisher of pre-signed envelopes, and an ack-only subscriber that
//! stands for "the best any hub could do" on the same broker.

use lockhub_proto::topics::{self, Leaf};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Envelopes up to a 500-item batch fit easily.
const MAX_PACKET: usize = 4 * 1024 * 1024;
/// Unacked publishes the publisher keeps open: enough that it never waits
/// on the broker's PUBACKs at the rates measured here.
const PUBLISHER_INFLIGHT: u16 = 1000;
/// How long any one benchmark phase may wait for messages, whatever happens.
pub const PHASE_TIMEOUT: Duration = Duration::from_secs(300);

pub fn events_topic() -> String {
    bench_topic(Leaf::Events)
}

pub fn status_topic() -> String {
    bench_topic(Leaf::Status)
}

fn bench_topic(leaf: Leaf) -> String {
    topics::topic(
        topics::DEFAULT_PREFIX,
        super::fixture::SITE_ID,
        super::fixture::HUB_ID,
        leaf,
    )
}

fn options(id: &str, port: u16) -> MqttOptions {
    let mut o = MqttOptions::new(id, "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(MAX_PACKET, MAX_PACKET)
        .set_request_channel_capacity(PUBLISHER_INFLIGHT as usize)
        .set_inflight(PUBLISHER_INFLIGHT);
    o
}

/// How fast to publish.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// As fast as the client and broker allow.
    Flood,
    /// This many messages per second, spread evenly (checked every ms).
    PerSecond(f64),
}

/// Publishes every payload at QoS 1 on `topic` and returns once the broker
/// has acked them all (or [`PHASE_TIMEOUT`] passed): the time publishing
/// took and how many were acked.
pub async fn publish_all(
    port: u16,
    topic: String,
    payloads: Arc<Vec<Vec<u8>>>,
    pace: Pace,
) -> (Duration, usize) {
    let (client, mut eventloop) = AsyncClient::new(
        options(&format!("bench-pub-{}", uuid::Uuid::new_v4()), port),
        PUBLISHER_INFLIGHT as usize,
    );
    let n = payloads.len();
    let poller = tokio::spawn(async move {
        let mut acked = 0usize;
        let deadline = Instant::now() + PHASE_TIMEOUT;
        while acked < n && Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_secs(5), eventloop.poll()).await {
                Ok(Ok(Event::Incoming(Packet::PubAck(_)))) => acked += 1,
                Ok(Ok(_)) => {}
                Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(_) => {}
            }
        }
        acked
    });
    let started = Instant::now();
    for (i, p) in payloads.iter().enumerate() {
        if let Pace::PerSecond(rate) = pace {
            // Bounded: each wait is at most one message interval.
            while (i as f64) > started.elapsed().as_secs_f64() * rate {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        if client
            .publish(topic.clone(), QoS::AtLeastOnce, false, p.clone())
            .await
            .is_err()
        {
            break;
        }
    }
    let acked = poller.await.unwrap_or(0);
    let took = started.elapsed();
    let _ = client.disconnect().await;
    (took, acked)
}

/// A subscriber that does nothing but receive and ack (QoS 1, persistent
/// session, like the hub). Call [`AckOnly::ready`] before publishing.
pub struct AckOnly {
    task: tokio::task::JoinHandle<(usize, Option<Instant>, Option<Instant>)>,
    ready: tokio::sync::oneshot::Receiver<()>,
}

impl AckOnly {
    pub fn start(port: u16, topic: String, expect: usize) -> AckOnly {
        let mut o = options(&format!("bench-sub-{}", uuid::Uuid::new_v4()), port);
        o.set_clean_session(false);
        let (client, mut eventloop) = AsyncClient::new(o, 16);
        let (ready_tx, ready) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let (mut got, mut first, mut last) = (0usize, None, None);
            let deadline = Instant::now() + PHASE_TIMEOUT;
            let _ = client.subscribe(topic, QoS::AtLeastOnce).await;
            while got < expect && Instant::now() < deadline {
                match tokio::time::timeout(Duration::from_secs(5), eventloop.poll()).await {
                    Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(Ok(Event::Incoming(Packet::Publish(_)))) => {
                        let now = Instant::now();
                        first.get_or_insert(now);
                        last = Some(now);
                        got += 1;
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
                    Err(_) => {}
                }
            }
            // Let the last PUBACKs go out before the connection closes.
            let _ = client.disconnect().await;
            for _ in 0..100 {
                if tokio::time::timeout(Duration::from_millis(50), eventloop.poll())
                    .await
                    .map_or(true, |r| r.is_err())
                {
                    break;
                }
            }
            (got, first, last)
        });
        AckOnly { task, ready }
    }

    pub async fn ready(&mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.ready).await;
    }

    /// How many arrived, and when the last did.
    pub async fn finish(self) -> (usize, Option<Instant>) {
        let (got, _first, last) = self.task.await.unwrap_or((0, None, None));
        (got, last)
    }
}

/// Waits for the retained `online` status on the hub's status topic; the
/// instant it arrived, or `None` after `timeout`.
pub async fn wait_online(port: u16, timeout: Duration) -> Option<Instant> {
    let (client, mut eventloop) = AsyncClient::new(
        options(&format!("bench-status-{}", uuid::Uuid::new_v4()), port),
        16,
    );
    let _ = client.subscribe(status_topic(), QoS::AtLeastOnce).await;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(200), eventloop.poll()).await {
            Ok(Ok(Event::Incoming(Packet::Publish(p)))) => {
                let v: serde_json::Value = serde_json::from_slice(&p.payload).unwrap_or_default();
                if v["state"] == "online" {
                    let at = Instant::now();
                    let _ = client.disconnect().await;
                    return Some(at);
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(_)) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(_) => {}
        }
    }
    None
}
