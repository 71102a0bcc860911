//! Resync: 100,000 keys delivered as `batch` events of 500 items, the shape
//! of the cloud's answer to a sync request after a long outage.

use super::report::Figure;
use super::stats::{median, thousands};
use super::{Sizes, fixture, pipeline};
use std::time::Instant;

pub const IDS: &[&str] = &["resync.store_only"];

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
        let r = pipeline::run(&dir.path().join("lockhub.db"), &events, 1).await;
        secs.push(r.total.as_secs_f64());
    }
    let s = median(&secs);
    vec![
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
