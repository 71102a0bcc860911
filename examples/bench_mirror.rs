//! How long a mirror proof takes as the mirror grows (docs/protocol/mqtt.md
//! 'Mirror proof'; the hub's side is `store::mirror` and `sync::proof`).
//!
//! For each size, fills a fresh database in a temporary folder (one bulk
//! transaction; windows ending over the next 30 days), then times what the
//! prover does for one checkpoint: open one read snapshot, bring the bucket
//! cache to it, and compute the mirror digest as of `as_of`:
//! - `cold`: the first proof (every key read, every bucket hashed);
//! - `same`: a second proof at the same `as_of`, nothing changed;
//! - `100 changes`: after 100 keys moved to a higher version and `as_of`
//!   moved 5 minutes on (the checkpoint interval), so the buckets of the
//!   keys whose windows ended in between are recomputed too.
//!
//! Every warm digest is checked against a cold recompute from the database.
//! Then the door: its read decision (what a door waits for before it
//! writes) timed over and over on another thread while a cold proof runs on
//! a reader of its own, against the same number of decisions without one.
//!
//! ```text
//! cargo run --release --example bench_mirror [SIZE ...] [--dir PATH]
//! ```
//! Sizes default to 1000 100000.

use lockhub::config::Policy;
use lockhub::door::{Decision, pin_tags};
use lockhub::store::door::{DoorEntry, evaluate};
use lockhub::store::error::StoreError;
use lockhub::store::mirror::{MirrorCache, cold_digest, in_snapshot};
use lockhub::store::{Priority, Store};
use lockhub_proto::crypto::pin_tag;
use lockhub_proto::time::Timestamp;
use rusqlite::Connection;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use testkit::db::{KeyRow, insert_row, pin_keys};

const CHANGES: usize = 100;

/// A small deterministic generator, so runs are comparable.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

/// Key `i`'s PIN: 8 digits, distinct for every i below 10^8.
fn pin(i: usize) -> String {
    format!("{:08}", (i as u64 * 7919) % 100_000_000)
}

fn fill(conn: &Connection, n: usize, now: Timestamp) -> Result<(), StoreError> {
    let mut rng = Lcg(7);
    let key = &pin_keys()[0];
    for i in 0..n {
        let (id, check_in) = (format!("k-{i}"), format!("c-{i}"));
        let tag = pin_tag(&key.secret, pin(i).as_bytes());
        insert_row(
            conn,
            &KeyRow {
                id: &id,
                state: "active",
                check_in_id: Some(&check_in),
                reservation_id: None,
                valid_from: now.saturating_add_days(-1),
                // From 10 minutes on, so the door's keys are all open now.
                valid_until: now.saturating_add_secs(600 + rng.next(30 * 86_400) as i64),
                pin_tag: tag,
                pin_key_id: "k1",
                holder_ref: None,
                holder_name: None,
                revoke_reason: None,
                updated_at: now,
                doors: &["101"],
            },
        )?;
    }
    Ok(())
}

/// One proof's reading and hashing, as the prover does it.
fn proof(
    reader: &Connection,
    cache: &mut MirrorCache,
    as_of: Timestamp,
) -> Result<(Duration, lockhub_proto::mirror::MirrorDigest), StoreError> {
    let t = Instant::now();
    in_snapshot(reader, |c| cache.refresh(c))?;
    let m = cache.digest(as_of);
    Ok((t.elapsed(), m))
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn run(n: usize, base: &std::path::Path) -> Result<(), StoreError> {
    let dir = tempfile::tempdir_in(base).map_err(|source| StoreError::DataDir {
        path: base.to_owned(),
        source,
    })?;
    let policy = Policy::default();
    let store = Store::open(&dir.path().join("bench.db"), &policy)?;
    let now = Timestamp::now_system();
    let started = Instant::now();
    store.write_blocking(Priority::Bulk, move |c| fill(c, n, now))?;
    let fill_time = started.elapsed();

    let reader = store.reader()?;
    let mut cache = MirrorCache::default();
    let as_of = Timestamp::from_secs(now.0 / 1_000_000);
    let (cold, m) = proof(&reader, &mut cache, as_of)?;
    let cold_buckets = cache.recomputed;
    let (same, m2) = proof(&reader, &mut cache, as_of)?;
    assert_eq!(m, m2);

    let mut rng = Lcg(n as u64);
    let picks: Vec<usize> = (0..CHANGES).map(|_| rng.next(n)).collect();
    store.write_blocking(Priority::Bulk, move |c| {
        for i in &picks {
            c.execute(
                "UPDATE keys SET version = version + 1 WHERE key_id = ?1",
                [format!("k-{i}")],
            )?;
        }
        Ok(())
    })?;
    let later = as_of.saturating_add_secs(300);
    let (changed, m3) = proof(&reader, &mut cache, later)?;
    let changed_buckets = cache.recomputed;
    let t = Instant::now();
    let cold_again = cold_digest(&reader, later)?;
    let recompute = t.elapsed();
    assert_eq!(m3, cold_again, "the cache must give the cold digest");

    println!(
        "{n:>8} keys: fill {:>7.1} s | cold {:>9} ({cold_buckets} buckets) | same as_of {:>8} | \
         {CHANGES} changes + 5 min {:>8} ({changed_buckets} buckets) | cold recompute then {:>9} | live {}",
        fill_time.as_secs_f64(),
        ms(cold),
        ms(same),
        ms(changed),
        ms(recompute),
        m3.count
    );

    // The door beside a cold proof, then alone, the same number of times.
    let door = |stop: Arc<AtomicBool>, min: usize| -> Result<Vec<Duration>, StoreError> {
        let r = store.reader()?;
        let policy = Policy::default();
        let mut rng = Lcg(3);
        let mut times = Vec::new();
        while times.len() < min || !stop.load(Ordering::Relaxed) {
            let i = rng.next(n);
            let e = DoorEntry {
                door: "101".into(),
                door_known: true,
                tags: pin_tags(pin(i).as_bytes(), &pin_keys()),
                at: now,
            };
            let t = Instant::now();
            let (d, _) = evaluate(&r, &e, &policy, &jiff::tz::TimeZone::UTC)?;
            times.push(t.elapsed());
            assert!(matches!(d, Decision::Unlock(_)), "key {i} must open");
        }
        Ok(times)
    };
    let stop = Arc::new(AtomicBool::new(false));
    let beside = std::thread::scope(|s| {
        let h = s.spawn(|| door(stop.clone(), 100));
        let mut fresh = MirrorCache::default();
        let r = proof(&reader, &mut fresh, later);
        stop.store(true, Ordering::Relaxed);
        r.map(|_| ()).and_then(|()| h.join().expect("door thread"))
    })?;
    let alone = door(Arc::new(AtomicBool::new(true)), beside.len())?;
    let (b50, b99) = stats(beside);
    let (a50, a99) = stats(alone);
    println!(
        "{:>8}       door read decision: alone median {:.0} µs p99 {:.0} µs | beside a cold proof median {:.0} µs p99 {:.0} µs",
        "",
        a50.as_secs_f64() * 1e6,
        a99.as_secs_f64() * 1e6,
        b50.as_secs_f64() * 1e6,
        b99.as_secs_f64() * 1e6,
    );
    drop(reader);
    store.close();
    Ok(())
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    let p = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    (p(0.5), p(0.99))
}

fn main() -> Result<(), StoreError> {
    let mut sizes = Vec::new();
    let mut dir = std::env::temp_dir();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--dir" {
            dir = PathBuf::from(args.next().expect("--dir PATH"));
        } else {
            sizes.push(a.parse::<usize>().expect("a size"));
        }
    }
    if sizes.is_empty() {
        sizes = vec![1_000, 100_000];
    }
    for n in sizes {
        run(n, &dir)?;
    }
    Ok(())
}
