//! Ingest: signed `key.issued` events per second, and in the same run the
//! two limits it is judged against: `verify_strict` per second on one core
//! and Mosquitto's QoS 1 delivery rate to a subscriber that only acks.

use super::broker::{BrokerSettings, Mosquitto};
use super::report::Figure;
use super::stats::{median, thousands};
use super::{Sizes, fixture, mqtt, pipeline};
use lockhub::config::Signer;
use lockhub::crypto::{self, EVENT_CONTEXT};
use lockhub::sim::cloud::SignedEvent;
use lockhub::verify::verify_envelope;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const IDS: &[&str] = &[
    "ingest.limit.verify_strict",
    "ingest.limit.step1",
    "ingest.limit.broker_w20",
    "ingest.limit.broker_w1000",
    "ingest.store_only.b20",
    "ingest.store_only.b256",
    "ingest.store_only.verify_share",
];

const S: &str = "ingest";

pub async fn run(sizes: &Sizes) -> Vec<Figure> {
    let mut cloud = fixture::cloud();
    let t = Instant::now();
    let events = fixture::issue_events(&mut cloud, "k", sizes.ingest_n);
    println!(
        "   pre-signed {} key.issued events in {:.1} s (not timed)",
        events.len(),
        t.elapsed().as_secs_f64()
    );
    let ring = fixture::ring();
    let mut figures = vec![];

    let (strict, step1) = verify_rates(&ring, &events[..sizes.verify_n.min(events.len())], sizes.runs.max(5));
    figures.push(Figure::new(
        "ingest.limit.verify_strict",
        S,
        "`verify_strict` per second, one core (limit)",
        format!("{}/s", thousands(strict)),
    ));
    figures.push(Figure::new(
        "ingest.limit.step1",
        S,
        "step 1 (`verify_envelope`: JSON, base64, `verify_strict`, ids) per second, one core",
        format!("{}/s", thousands(step1)),
    ));

    let payloads: Arc<Vec<Vec<u8>>> = Arc::new(events.iter().map(|e| e.envelope.clone()).collect());
    for window in [20u32, 1000] {
        let mut rates = vec![];
        for _ in 0..sizes.runs {
            rates.push(broker_ack_only_rate(&payloads, window).await);
        }
        figures.push(Figure::new(
            &format!("ingest.limit.broker_w{window}"),
            S,
            &format!(
                "Mosquitto QoS 1 delivery to an ack-only subscriber, {} events, `max_inflight_messages {window}` (limit)",
                thousands(payloads.len() as f64)
            ),
            format!("{}/s", thousands(median(&rates))),
        ));
    }

    let mut verify_share = vec![];
    for batch in [20usize, 256] {
        let mut rates = vec![];
        for _ in 0..sizes.runs {
            let dir = tempfile::tempdir().expect("tempdir");
            let r = pipeline::run(&dir.path().join("lockhub.db"), &events, batch).await;
            rates.push(events.len() as f64 / r.total.as_secs_f64());
            verify_share.push(r.verify.as_secs_f64() / r.total.as_secs_f64() * 100.0);
        }
        figures.push(Figure::new(
            &format!("ingest.store_only.b{batch}"),
            S,
            &format!(
                "verify + parse + apply + commit without the broker, {batch} events per transaction, {} events",
                thousands(events.len() as f64)
            ),
            format!("{}/s", thousands(median(&rates))),
        ));
    }
    figures.push(Figure::new(
        "ingest.store_only.verify_share",
        S,
        "share of the store-only pipeline's time spent in step 1 + parse (the rest is waiting on the writer)",
        format!("{:.0} %", median(&verify_share)),
    ));
    figures
}

/// `verify_strict` alone, and the whole of step 1, over distinct events on
/// this thread (one core); the median of `runs` passes, in events/s.
pub fn verify_rates(ring: &[Signer], events: &[SignedEvent], runs: usize) -> (f64, f64) {
    let key = ring[0].public_key;
    let signed: Vec<(Vec<u8>, [u8; 64])> = events
        .iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_slice(&e.envelope).expect("envelope");
            let sig = crypto::b64u_decode(v["sig"].as_str().unwrap_or_default()).expect("sig");
            (e.body.clone(), sig.try_into().expect("64 bytes"))
        })
        .collect();
    let (mut strict, mut step1) = (vec![], vec![]);
    for _ in 0..runs {
        let t = Instant::now();
        let ok = signed
            .iter()
            .filter(|(body, sig)| crypto::verify(EVENT_CONTEXT, &key, body, sig))
            .count();
        assert_eq!(ok, signed.len(), "every bench signature verifies");
        strict.push(signed.len() as f64 / t.elapsed().as_secs_f64());

        let ctx = fixture::verify_ctx(ring);
        let t = Instant::now();
        let ok = events
            .iter()
            .filter(|e| verify_envelope(&e.envelope, &ctx).is_ok())
            .count();
        assert_eq!(ok, events.len(), "every bench envelope passes step 1");
        step1.push(events.len() as f64 / t.elapsed().as_secs_f64());
    }
    (median(&strict), median(&step1))
}

/// One broker, one ack-only subscriber, one flood of `payloads`: delivered
/// events per second from the first publish to the last delivery.
pub async fn broker_ack_only_rate(payloads: &Arc<Vec<Vec<u8>>>, window: u32) -> f64 {
    let broker = Mosquitto::start(BrokerSettings {
        max_inflight_messages: window,
        max_queued_messages: payloads.len() as u32 + 1000,
    });
    let n = payloads.len();
    let mut sub = mqtt::AckOnly::start(broker.port, mqtt::events_topic(), n);
    sub.ready().await;
    let started = Instant::now();
    let publisher = tokio::spawn(mqtt::publish_all(
        broker.port,
        mqtt::events_topic(),
        payloads.clone(),
        mqtt::Pace::Flood,
    ));
    let (got, last) = sub.finish().await;
    let _ = publisher.await;
    assert_eq!(got, n, "the broker delivered every event: {}", broker.log());
    let took = last.map_or(Duration::MAX, |l| l - started);
    n as f64 / took.as_secs_f64()
}
