//! Budget: what a Raspberry Pi lives with. One `lockhub run`, one broker, one
//! C consumer (`mosquitto_sub`) draining every output, in one run:
//! 1. a resync of 100,000 keys (200 `batch` events of 500) into an empty
//!    mirror: committed and drained, the WAL's and RSS's peaks, the bytes
//!    written per byte the database grew;
//! 2. a minute of idle: how far the WAL and RSS come back;
//! 3. 20,000 and then 100,000 `key.issued` into that full mirror:
//!    committed and drained rates, WAL and RSS peaks, write amplification;
//!
//! next to the two limits measured in the same run (`verify_strict` on one
//! core, Mosquitto's delivery to an ack-only subscriber).

use super::broker::{BrokerSettings, Mosquitto};
use super::daemon::{Consumer, Daemon, Sampler, db_bytes, outbox_rows, write_bytes};
use super::report::Figure;
use super::stats::{bytes, mib, thousands};
use super::{Sizes, fixture, ingest, mqtt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const IDS: &[&str] = &[
    "budget.limit.verify_strict",
    "budget.limit.broker",
    "budget.resync.committed",
    "budget.resync.drained",
    "budget.resync.wal_peak",
    "budget.resync.rss_peak",
    "budget.resync.write_amp",
    "budget.db_per_key",
    "budget.idle.wal",
    "budget.idle.rss",
    "budget.full20k.committed",
    "budget.full20k.drained",
    "budget.full20k.write_amp",
    "budget.full100k.committed",
    "budget.full100k.drained",
    "budget.full100k.write_amp",
    "budget.full.wal_peak",
    "budget.full.rss_peak",
];

const S: &str = "budget";

/// How long the idle phase watches the WAL and RSS come back.
fn idle_watch(sizes: &Sizes) -> Duration {
    if sizes.runs == 1 && sizes.ingest_n < 1000 {
        Duration::from_secs(4)
    } else {
        Duration::from_secs(60)
    }
}

/// What one phase measured.
struct Phase {
    committed: Duration,
    drained: Option<Duration>,
    wal_peak: u64,
    rss_peak: u64,
    /// Bytes written from the phase's start until the WAL settled after it.
    written: u64,
    /// How much the database grew.
    grew: u64,
}

impl Phase {
    fn amp(&self) -> f64 {
        self.written as f64 / self.grew.max(1) as f64
    }
}

/// Publishes `payloads` as fast as the broker takes them and waits until
/// the watermark reaches `target` (committed) and the consumer has every
/// output the phase queued (drained); then waits for the WAL to settle
/// (the idle checkpoint) before reading the bytes written.
async fn phase(
    broker: &Mosquitto,
    daemon: &Daemon,
    reader: &rusqlite::Connection,
    consumer: &Consumer,
    sampler: &Sampler,
    payloads: &Arc<Vec<Vec<u8>>>,
    target: u64,
) -> Phase {
    let pid = daemon.pid();
    sampler.reset();
    let (rows0, got0) = (outbox_rows(reader), consumer.count());
    let (bytes0, db0) = (write_bytes(pid).unwrap_or(0), db_bytes(reader));
    // LOCKHUB_BENCH_PAGES=1: hold a read snapshot from the start, so no
    // checkpoint can restart the WAL and every frame of the phase stays in
    // it to be counted (a profile: it stalls the checkpointer, so the
    // phase's own figures are not representative).
    let hold = std::env::var_os("LOCKHUB_BENCH_PAGES").map(|_| {
        let c = daemon.reader();
        c.execute_batch("BEGIN").expect("begin");
        c.query_row("SELECT count(*) FROM seq_state", [], |_| Ok(()))
            .expect("snapshot");
        c
    });
    let started = Instant::now();
    let publisher = tokio::spawn(mqtt::publish_all(
        broker.port,
        mqtt::events_topic(),
        payloads.clone(),
        mqtt::Pace::Flood,
    ));
    while Daemon::watermark(reader) < target {
        assert!(
            started.elapsed() < mqtt::PHASE_TIMEOUT,
            "stalled at watermark {}: {}",
            Daemon::watermark(reader),
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let committed = started.elapsed();
    let _ = publisher.await;
    let rows = outbox_rows(reader) - rows0;
    let drained = loop {
        if consumer.count() - got0 >= rows {
            break Some(started.elapsed());
        }
        if started.elapsed() > mqtt::PHASE_TIMEOUT {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    if let Some(c) = hold {
        print_wal_pages(&daemon.db_path(), payloads.len() as u64);
        drop(c);
    }
    let seen = sampler.seen();
    // The bytes a phase costs include its checkpoint: wait for the idle
    // TRUNCATE (the WAL file gone to zero), at most 30 s.
    let settle = Instant::now();
    while sampler.seen().wal_now > 0 && settle.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Phase {
        committed,
        drained,
        wal_peak: seen.wal_peak,
        rss_peak: seen.rss_peak,
        written: write_bytes(pid).unwrap_or(0) - bytes0,
        grew: db_bytes(reader).saturating_sub(db0),
    }
}

pub async fn run(sizes: &Sizes) -> Vec<Figure> {
    let mut cloud = fixture::cloud();
    let t = Instant::now();
    let batches = fixture::batch_events(&mut cloud, "r", sizes.resync_keys, sizes.batch_items);
    let small = (sizes.ingest_n / 5).max(1);
    let issued = fixture::issue_events(&mut cloud, "k", small + sizes.ingest_n);
    println!(
        "   pre-signed {} batch events and {} key.issued in {:.1} s (not timed)",
        batches.len(),
        issued.len(),
        t.elapsed().as_secs_f64()
    );
    let envelopes = |e: &[lockhub_proto::sign::SignedEvent]| -> Arc<Vec<Vec<u8>>> {
        Arc::new(e.iter().map(|e| e.envelope.clone()).collect())
    };
    let resync = envelopes(&batches);
    let (first, second) = issued.split_at(small);
    let (first, second) = (envelopes(first), envelopes(second));

    // The limits, in this run.
    let ring = fixture::ring();
    let (strict, _) = ingest::verify_rates(&ring, &issued[..sizes.verify_n.min(small)], 3);
    let broker_rate = ingest::broker_ack_only_rate(&first, 20).await;

    let total = (resync.len() + first.len() + second.len()) as u32;
    // LOCKHUB_BENCH_BROKER_INFLIGHT: another `max_inflight_messages` (with
    // LOCKHUB_MOSQUITTO, a broker that holds it; BENCHMARKS.md "The drain").
    let mut settings = BrokerSettings::default_window(total + 1000);
    if let Some(n) = std::env::var("LOCKHUB_BENCH_BROKER_INFLIGHT")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        settings.max_inflight_messages = n;
    }
    let broker = Mosquitto::start_with(settings);
    let daemon = Daemon::start(
        &broker.url(),
        Path::new("/dev/null"),
        fixture::NO_LOCKOUT_POLICY,
        0,
    )
    .await;
    mqtt::wait_online(broker.port, Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("the daemon never came online: {}", daemon.log()));
    let consumer = Consumer::start(broker.port);
    // The SUBSCRIBEs went out before the status; leave them time to land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reader = daemon.reader();
    let sampler = Sampler::start(daemon.pid(), &daemon.db_path());

    let mut w = resync.len() as u64;
    let r = phase(&broker, &daemon, &reader, &consumer, &sampler, &resync, w).await;
    println!("   resync: {}", describe(&r));

    // Idle: the WAL's and RSS's way back, read at the end of the watch.
    sampler.reset();
    tokio::time::sleep(idle_watch(sizes)).await;
    let idle = sampler.seen();
    let per_key = db_bytes(&reader) as f64 / sizes.resync_keys as f64;

    w += first.len() as u64;
    let f1 = phase(&broker, &daemon, &reader, &consumer, &sampler, &first, w).await;
    println!("   full mirror, {}: {}", first.len(), describe(&f1));
    w += second.len() as u64;
    let f2 = phase(&broker, &daemon, &reader, &consumer, &sampler, &second, w).await;
    println!("   full mirror, {}: {}", second.len(), describe(&f2));
    drop(sampler);
    drop(reader);
    let mut daemon = daemon;
    daemon.stop();

    let keys = thousands(sizes.resync_keys as f64);
    let rate = |n: usize, d: Duration| format!("{}/s", thousands(n as f64 / d.as_secs_f64()));
    let drained = |n: usize, d: Option<Duration>| d.map_or("not reached".into(), |d| rate(n, d));
    let meets =
        |n: usize, d: Option<Duration>| d.is_some_and(|d| n as f64 / d.as_secs_f64() >= 5_000.0);
    let mut figures = vec![
        Figure::new(
            "budget.limit.verify_strict",
            S,
            "`verify_strict` per second, one core, in this run (limit)",
            format!("{}/s", thousands(strict)),
        ),
        Figure::new(
            "budget.limit.broker",
            S,
            &format!(
                "Mosquitto QoS 1 delivery to an ack-only subscriber, {} events, in this run (limit)",
                thousands(first.len() as f64)
            ),
            format!("{}/s", thousands(broker_rate)),
        ),
        Figure::new(
            "budget.resync.committed",
            S,
            &format!(
                "resync of {keys} keys as {} `batch` events into an empty mirror: first publish → all committed",
                resync.len()
            ),
            format!("{:.1} s", r.committed.as_secs_f64()),
        ),
        Figure::new(
            "budget.resync.drained",
            S,
            "the same resync: first publish → every output received by a C consumer (`mosquitto_sub`)",
            r.drained
                .map_or("not reached".into(), |d| format!("{:.1} s", d.as_secs_f64())),
        ),
        Figure::new(
            "budget.resync.wal_peak",
            S,
            "WAL file's peak during the resync (sampled every 20 ms)",
            mib(r.wal_peak as f64),
        )
        .target("≤ 64 MiB", r.wal_peak <= 64 << 20),
        Figure::new(
            "budget.resync.rss_peak",
            S,
            "`lockhub run` RSS peak during the resync (sampled every 20 ms)",
            mib(r.rss_peak as f64),
        )
        .target("< 40 MiB", r.rss_peak < 40 << 20),
        Figure::new(
            "budget.resync.write_amp",
            S,
            "resync: bytes the daemon wrote (`/proc/PID/io` write_bytes, WAL and checkpoints) / bytes the database grew",
            format!("{:.1}×", r.amp()),
        )
        .target("≤ 3×", r.amp() <= 3.0),
        Figure::new(
            "budget.db_per_key",
            S,
            &format!("database bytes per key after the resync of {keys} keys"),
            bytes(per_key),
        ),
        Figure::new(
            "budget.idle.wal",
            S,
            &format!(
                "WAL file after {} s idle following the resync",
                idle_watch(sizes).as_secs()
            ),
            mib(idle.wal_now as f64),
        )
        .target("≤ 4 MiB", idle.wal_now <= 4 << 20),
        Figure::new(
            "budget.idle.rss",
            S,
            &format!(
                "`lockhub run` RSS after {} s idle following the resync",
                idle_watch(sizes).as_secs()
            ),
            mib(idle.rss_now as f64),
        )
        .target("< 30 MiB", idle.rss_now < 30 << 20),
    ];
    for (label, n, p) in [
        ("full20k", first.len(), &f1),
        ("full100k", second.len(), &f2),
    ] {
        let what = format!(
            "{} `key.issued` into a mirror already holding ≥ {keys} keys",
            thousands(n as f64)
        );
        figures.push(
            Figure::new(
                &format!("budget.{label}.committed"),
                S,
                &format!("{what}: first publish → all committed"),
                rate(n, p.committed),
            )
            .target("≥ 5,000/s", meets(n, Some(p.committed))),
        );
        figures.push(
            Figure::new(
                &format!("budget.{label}.drained"),
                S,
                &format!("{what}: first publish → every output received by the C consumer"),
                drained(n, p.drained),
            )
            .target("≥ 5,000/s", meets(n, p.drained)),
        );
        figures.push(
            Figure::new(
                &format!("budget.{label}.write_amp"),
                S,
                &format!("{what}: bytes written / bytes the database grew (per event)"),
                format!(
                    "{:.1}× ({} / {})",
                    p.amp(),
                    bytes(p.written as f64 / n as f64),
                    bytes(p.grew as f64 / n as f64)
                ),
            )
            .target("≤ 3×", p.amp() <= 3.0),
        );
    }
    let (wal, rss) = (f1.wal_peak.max(f2.wal_peak), f1.rss_peak.max(f2.rss_peak));
    figures.push(
        Figure::new(
            "budget.full.wal_peak",
            S,
            "WAL file's peak during the full-mirror ingests",
            mib(wal as f64),
        )
        .target("≤ 64 MiB", wal <= 64 << 20),
    );
    figures.push(
        Figure::new(
            "budget.full.rss_peak",
            S,
            "`lockhub run` RSS peak during the full-mirror ingests",
            mib(rss as f64),
        )
        .target("< 40 MiB", rss < 40 << 20),
    );
    figures
}

fn describe(p: &Phase) -> String {
    format!(
        "committed {:.1} s, drained {}, WAL peak {}, RSS peak {}, wrote {} for +{} ({:.1}×)",
        p.committed.as_secs_f64(),
        p.drained
            .map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64())),
        mib(p.wal_peak as f64),
        mib(p.rss_peak as f64),
        mib(p.written as f64),
        mib(p.grew as f64),
        p.amp()
    )
}

/// Where the pages go: the frames in the WAL file, by the table or index
/// each page belongs to (`dbstat`), with how many distinct pages they are.
/// Frames / distinct is how often the same page was rewritten before a
/// checkpoint. Only frames of the WAL's current generation count (their
/// salts match the header's).
pub fn wal_pages(db: &Path) -> Vec<(String, u64, u64)> {
    let wal = std::fs::read(db.with_extension("db-wal")).unwrap_or_default();
    if wal.len() < 32 {
        return vec![];
    }
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    let page = be(&wal[8..12]) as usize;
    let salts = &wal[16..24];
    let mut frames: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
    let mut at = 32;
    while at + 24 + page <= wal.len() && &wal[at + 8..at + 16] == salts {
        *frames.entry(be(&wal[at..at + 4])).or_default() += 1;
        at += 24 + page;
    }
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open for dbstat");
    let mut names: std::collections::HashMap<u32, String> = std::collections::HashMap::new();
    let mut stmt = conn
        .prepare("SELECT name, pageno FROM dbstat")
        .expect("dbstat (SQLITE_ENABLE_DBSTAT_VTAB)");
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .expect("dbstat rows");
    for (name, pgno) in rows.flatten() {
        names.insert(pgno as u32, name);
    }
    let mut by: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for (pgno, n) in frames {
        let name = names
            .get(&pgno)
            .cloned()
            .unwrap_or_else(|| "(free or header)".into());
        let e = by.entry(name).or_default();
        e.0 += n;
        e.1 += 1;
    }
    let mut out: Vec<(String, u64, u64)> = by.into_iter().map(|(k, (f, d))| (k, f, d)).collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.1));
    out
}

/// Prints [`wal_pages`] per event.
pub fn print_wal_pages(db: &Path, events: u64) {
    let pages = wal_pages(db);
    let total: u64 = pages.iter().map(|p| p.1).sum();
    println!(
        "   WAL frames: {total} for {events} events ({:.2} per event); by table or index (frames, distinct pages, frames per event):",
        total as f64 / events.max(1) as f64
    );
    for (name, f, d) in pages.iter().take(24) {
        println!(
            "     {name:<36} {f:>8} {d:>8} {:>7.3}",
            *f as f64 / events.max(1) as f64
        );
    }
}
