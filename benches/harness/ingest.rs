//! Ingest: signed `key.issued` events per second, and in the same run the
//! two limits it is judged against: `verify_strict` per second on one core
//! and Mosquitto's QoS 1 delivery rate to a subscriber that only acks.

use super::broker::{BrokerSettings, Mosquitto};
use super::daemon::{Daemon, Flood, flood};
use super::report::Figure;
use super::stats::mib;
use super::stats::{median, thousands};
use super::{Sizes, fixture, mqtt, pipeline};
use lockhub::store::outbox;
use lockhub_proto::crypto::{self, EVENT_CONTEXT};
use lockhub_proto::sign::SignedEvent;
use lockhub_proto::verify::Signer;
use lockhub_proto::verify::verify_envelope;
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
    "ingest.daemon.w20",
    "ingest.daemon.w1000",
    "ingest.daemon.vs_limit",
    "ingest.daemon.results_out",
    "footprint.rss_ingest",
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

    let (strict, step1) = verify_rates(
        &ring,
        &events[..sizes.verify_n.min(events.len())],
        sizes.runs.max(5),
    );
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
            let r = pipeline::run(&dir.path().join("lockhub.db"), &events, batch, 2).await;
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

    let mut best = (0.0f64, 0u32);
    let mut peak_rss = 0u64;
    let mut results_out = vec![];
    for window in [20u32, 1000] {
        let mut rates = vec![];
        let mut stalled = None;
        for _ in 0..sizes.runs {
            match daemon_ingest(&payloads, window).await {
                Ok(run) => {
                    rates.push(run.rate);
                    peak_rss = peak_rss.max(run.hwm);
                    results_out.extend(run.results_out);
                }
                Err((at, hwm)) => {
                    peak_rss = peak_rss.max(hwm);
                    stalled = Some(at);
                    break;
                }
            }
        }
        let id = format!("ingest.daemon.w{window}");
        let what = format!(
            "`lockhub run`: {} signed key.issued events from first publish to all committed (watermark), `max_inflight_messages {window}`",
            thousands(payloads.len() as f64)
        );
        if let Some(at) = stalled {
            figures.push(
                Figure::new(
                    &id,
                    S,
                    &what,
                    format!("stalled at {} events", thousands(at as f64)),
                )
                .target("≥ 10,000/s", false),
            );
            continue;
        }
        let rate = median(&rates);
        if rate > best.0 {
            best = (rate, window);
        }
        figures.push(
            Figure::new(&id, S, &what, format!("{}/s", thousands(rate)))
                .target("≥ 10,000/s", rate >= 10_000.0),
        );
    }
    // The lower of the two limits, for the window that did best.
    let broker_limit = figures
        .iter()
        .find(|f| f.id == format!("ingest.limit.broker_w{}", best.1))
        .and_then(|f| {
            f.value
                .trim_end_matches("/s")
                .replace(',', "")
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(f64::NAN);
    let lower = strict.min(broker_limit);
    let share = if best.0 > 0.0 {
        best.0 / lower * 100.0
    } else {
        0.0
    };
    figures.push(
        Figure::new(
            "ingest.daemon.vs_limit",
            S,
            &format!(
                "best daemon rate (window {}) / lower limit (min of `verify_strict` one core, broker same window)",
                best.1
            ),
            format!("{share:.0} %"),
        )
        .target("≥ 50 %", share >= 50.0),
    );
    figures.push(Figure::new(
        "ingest.daemon.results_out",
        S,
        &format!(
            "`lockhub run`: first publish → every result and audit record of the {} events acknowledged by the broker (outbox empty); while intake fills the hub's receive window these wait",
            thousands(payloads.len() as f64)
        ),
        if results_out.is_empty() {
            "not reached".to_owned()
        } else {
            format!("{:.1} s", median(&results_out))
        },
    ));
    figures.push(
        Figure::new(
            "footprint.rss_ingest",
            S,
            "`lockhub run` peak RSS (VmHWM) during the ingest runs",
            mib(peak_rss as f64),
        )
        .target("< 30 MiB", (peak_rss as f64) < 30.0 * 1024.0 * 1024.0),
    );
    figures
}

/// No progress for this long means the daemon stalled: the run is reported
/// as stalled (with where), not waited out.
const STALL: Duration = Duration::from_secs(20);

/// What one daemon flood measured.
pub struct DaemonIngest {
    /// Events/s from the first publish until all were committed.
    pub rate: f64,
    /// The daemon's VmHWM, bytes.
    pub hwm: u64,
    /// Seconds from the first publish until the outbox was empty, if it
    /// emptied within [`RESULTS_TIMEOUT`].
    pub results_out: Option<f64>,
}

/// How long to wait for the outbox to empty after the last commit.
const RESULTS_TIMEOUT: Duration = Duration::from_secs(180);

/// One broker with `window`, one real daemon, one flood: events/s from the
/// first publish until the watermark covers every seq (each is committed,
/// and the daemon acks right after its commit), the daemon's VmHWM, and when
/// its results were all out; or the watermark where it stalled.
pub async fn daemon_ingest(
    payloads: &Arc<Vec<Vec<u8>>>,
    window: u32,
) -> Result<DaemonIngest, (u64, u64)> {
    let n = payloads.len() as u64;
    let Flood {
        broker: _broker,
        mut daemon,
        reader,
        started,
        publisher,
    } = flood(
        BrokerSettings {
            max_inflight_messages: window,
            max_queued_messages: payloads.len() as u32 + 1000,
        },
        payloads,
    )
    .await;
    let (mut last, mut progressed) = (0u64, Instant::now());
    loop {
        let w = Daemon::watermark(&reader);
        if w >= n {
            break;
        }
        if w > last {
            (last, progressed) = (w, Instant::now());
        } else if progressed.elapsed() > STALL || started.elapsed() > mqtt::PHASE_TIMEOUT {
            let hwm = daemon.memory().map_or(0, |(_, hwm)| hwm);
            // Keep the log past the temporary folder: a stall is a bug to chase.
            let kept = std::env::temp_dir().join(format!("lockhub-stall-w{window}.log"));
            let _ = std::fs::copy(daemon.dir.path().join("lockhub.log"), &kept);
            eprintln!(
                "   daemon stalled at watermark {w} (window {window}); its log is kept at {}; last lines:\n{}",
                kept.display(),
                daemon.log()
            );
            publisher.abort();
            drop(reader);
            daemon.stop();
            return Err((w, hwm));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed();
    let _ = publisher.await;
    let drained = Instant::now();
    let results_out = loop {
        // Rows the broker has not acknowledged yet (results, audit, alerts).
        if outbox::depth(&reader).is_ok_and(|n| n == 0) {
            break Some(started.elapsed().as_secs_f64());
        }
        if drained.elapsed() > RESULTS_TIMEOUT {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let hwm = daemon.memory().map_or(0, |(_, hwm)| hwm);
    drop(reader);
    daemon.stop();
    Ok(DaemonIngest {
        rate: n as f64 / took.as_secs_f64(),
        hwm,
        results_out,
    })
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
    let broker = Mosquitto::start_with(BrokerSettings {
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
