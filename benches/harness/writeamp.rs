//! Bytes written against commit size: the floor under issue 14's target of
//! at most 3× the database's growth per ingested event.
//!
//! Every commit in WAL mode appends each page it dirtied to the WAL, and
//! the checkpoint copies each of those pages once more into the database
//! file. A `key.issued` inserts at a random place in B-trees keyed by
//! random values (`dedupe` by event id, `key_doors_one_live_per_tag` by PIN
//! tag); with 100,000 keys those trees have thousands of leaves, so two
//! events of one commit seldom share a leaf and every event costs whole
//! 4 KiB pages for its ~1.4 KiB of growth. The daemon commits what its
//! receive window holds, so how far larger commits could take the ratio is
//! the question this scenario answers, on the store alone (the daemon's
//! apply path through `pipeline`, no broker, no doors):
//!
//! one mirror of `writeamp_keys` keys filled by a resync, copied afresh for each commit size;
//! `writeamp_events` new `key.issued` applied in commits of G events, one
//! job at a time, then the store closed (its last checkpoint counted).
//! Bytes written are this process's `/proc/self/io` `write_bytes` over that
//! (WAL appends and checkpoint copies, counted when pages are dirtied);
//! growth is the database file's.

use super::daemon::{bench_dir, write_bytes};
use super::report::Figure;
use super::stats::{bytes, thousands};
use super::{Sizes, fixture, pipeline};
use std::path::Path;

pub const IDS: &[&str] = &["writeamp.g1.ratio", "writeamp.g64.ratio"];

const S: &str = "writeamp";

/// What one commit size cost.
struct Run {
    group: usize,
    events: usize,
    written: u64,
    grew: u64,
    per_s: f64,
}

impl Run {
    fn ratio(&self) -> f64 {
        self.written as f64 / self.grew.max(1) as f64
    }
}

fn file_len(p: &Path) -> u64 {
    std::fs::metadata(p).map_or(0, |m| m.len())
}

pub async fn run(sizes: &Sizes) -> Vec<Figure> {
    let dir = bench_dir();
    let base = dir.path().join("mirror.db");
    let mut cloud = fixture::cloud();
    let keys = sizes.writeamp_keys;
    // Filled the way a hub fills it, by a resync (`batch` events through
    // the apply path); the store closes after it, checkpointing the WAL
    // away, so each copy starts from one file.
    let resync = fixture::batch_events(&mut cloud, "m", keys, sizes.batch_items);
    pipeline::run(&base, &resync, 1, 2).await;
    drop(resync);
    println!(
        "   mirror: {} keys, {}",
        thousands(keys as f64),
        bytes(file_len(&base) as f64)
    );

    let me = std::process::id();
    let mut runs = vec![];
    for &group in &sizes.writeamp_groups {
        let db = dir.path().join(format!("g{group}.db"));
        std::fs::copy(&base, &db).expect("copy the mirror");
        std::fs::File::open(&db)
            .and_then(|f| f.sync_all())
            .expect("sync the copy");
        let events =
            fixture::issue_events(&mut cloud, &format!("w{group}-"), sizes.writeamp_events);
        let (written0, len0) = (write_bytes(me).unwrap_or(0), file_len(&db));
        let r = pipeline::run(&db, &events, group, 1).await;
        let run = Run {
            group,
            events: events.len(),
            written: write_bytes(me).unwrap_or(0).saturating_sub(written0),
            grew: file_len(&db).saturating_sub(len0),
            per_s: events.len() as f64 / r.total.as_secs_f64(),
        };
        println!(
            "   {:>5} events per commit: wrote {} per event for {} of growth ({:.1}×), {}/s",
            run.group,
            bytes(run.written as f64 / run.events as f64),
            bytes(run.grew as f64 / run.events as f64),
            run.ratio(),
            thousands(run.per_s)
        );
        std::fs::remove_file(&db).ok();
        runs.push(run);
    }

    runs.iter()
        .map(|r| {
            Figure::new(
                &format!("writeamp.g{}.ratio", r.group),
                S,
                &format!(
                    "{} `key.issued` into {} keys in commits of {}: bytes written ÷ database growth (store only)",
                    thousands(r.events as f64),
                    thousands(keys as f64),
                    r.group
                ),
                format!(
                    "{:.1}× ({} ÷ {} per event)",
                    r.ratio(),
                    bytes(r.written as f64 / r.events as f64),
                    bytes(r.grew as f64 / r.events as f64)
                ),
            )
            .target("≤ 3×", r.ratio() <= 3.0)
        })
        .collect()
}
