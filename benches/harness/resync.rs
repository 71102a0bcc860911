//! Resync: 100,000 keys delivered as `batch` events of 500 items, the shape
//! of the cloud's answer to a sync request after a long outage.

use super::broker::BrokerSettings;
use super::daemon::{Daemon, Flood, flood};
use super::report::Figure;
use super::stats::{median, thousands};
use super::{Sizes, fixture, mqtt, pipeline};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const IDS: &[&str] = &["resync.store_only", "resync.daemon"];

const S: &str = "resync";

pub async fn run(sizes: &Sizes) -> Vec<Figure> {
    let mut cloud = fixture::cloud();
    let t = Instant::now();
    let events = fixture::batch_events(&mut cloud, "r", sizes.resync_keys, sizes.batch_items);
    println!(
        "   pre-signed {} batch events of {} keys in {:.1} s (not timed)",
        events.len(),
        sizes.batch_items,
        t.elapsed().as_secs_f64()
    );
    let mut secs = vec![];
    for _ in 0..sizes.runs {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = pipeline::run(&dir.path().join("lockhub.db"), &events, 1, 2).await;
        secs.push(r.total.as_secs_f64());
    }
    let s = median(&secs);
    let payloads: Arc<Vec<Vec<u8>>> = Arc::new(events.iter().map(|e| e.envelope.clone()).collect());
    let mut dsecs = vec![];
    for _ in 0..sizes.runs {
        dsecs.push(daemon_resync(&payloads).await);
    }
    let d = median(&dsecs);
    vec![
        Figure::new(
            "resync.daemon",
            S,
            &format!(
                "`lockhub run`: {} keys as {} `batch` events of {} through Mosquitto (`max_inflight_messages 20`), first publish → all committed",
                thousands(sizes.resync_keys as f64),
                events.len(),
                sizes.batch_items
            ),
            format!("{d:.2} s ({} keys/s)", thousands(sizes.resync_keys as f64 / d)),
        )
        .target("< 30 s", d < 30.0),
        Figure::new(
            "resync.store_only",
            S,
            &format!(
                "{} keys as {} `batch` events of {}: verify + parse + apply + commit, one event per job, no broker",
                thousands(sizes.resync_keys as f64),
                events.len(),
                sizes.batch_items
            ),
            format!("{s:.2} s ({} keys/s)", thousands(sizes.resync_keys as f64 / s)),
        )
        .target("< 30 s", s < 30.0),
    ]
}

/// Seconds from the first publish until the daemon's watermark covers every
/// batch event.
async fn daemon_resync(payloads: &Arc<Vec<Vec<u8>>>) -> f64 {
    let Flood {
        broker: _broker,
        mut daemon,
        reader,
        started,
        publisher,
    } = flood(
        BrokerSettings::default_window(payloads.len() as u32 + 100),
        payloads,
    )
    .await;
    let n = payloads.len() as u64;
    while Daemon::watermark(&reader) < n {
        assert!(
            started.elapsed() < mqtt::PHASE_TIMEOUT,
            "resync stalled at watermark {}: {}",
            Daemon::watermark(&reader),
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = started.elapsed().as_secs_f64();
    let _ = publisher.await;
    drop(reader);
    daemon.stop();
    took
}
