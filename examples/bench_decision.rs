//! How long a door decision takes as the mirror grows.
//!
//! For each size, fills a fresh database in a temporary folder (one bulk
//! transaction), then times:
//! - `read`: PIN tags under two PIN keys, the index probe, the lockout facts
//!   and the pure decision, on a read connection (what the door waits for
//!   before anything is written);
//! - `write`: the full `door_entry` on the writer with `Priority::Door`,
//!   up to the commit of its audit row (`synchronous=FULL`: one fsync).
//!
//! ```text
//! cargo run --release --example bench_decision [SIZE ...] [--dir PATH]
//! ```
//! Sizes default to 1000 10000 100000. `--dir` puts the databases on a
//! given disk (the write figures are mostly that disk's fsync).

use lockhub::config::Policy;
use lockhub::door::{Decision, pin_tags};
use lockhub::store::door::{DoorEntry, door_entry, evaluate};
use lockhub::store::{Priority, Store, error::StoreError};
use lockhub_proto::crypto::pin_tag;
use lockhub_proto::time::Timestamp;
use rusqlite::Connection;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use testkit::db::{KeyRow, insert_row, pin_keys};

const DOORS: usize = 50;
const READS: usize = 5000;
const WRITES: usize = 500;

/// Key `i`'s PIN: 8 digits, distinct for every i below 10^8.
fn pin(i: usize) -> String {
    format!("{:08}", (i as u64 * 7919) % 100_000_000)
}

fn door(i: usize) -> String {
    format!("d{}", i % DOORS)
}

fn fill(conn: &Connection, n: usize, now: Timestamp) -> Result<(), StoreError> {
    let keys = pin_keys();
    for i in 0..n {
        let pk = &keys[i % 2];
        let (id, check_in, holder, door) = (
            format!("k-{i}"),
            format!("c-{i}"),
            format!("g-{i}"),
            door(i),
        );
        insert_row(
            conn,
            &KeyRow {
                id: &id,
                state: "active",
                check_in_id: Some(&check_in),
                reservation_id: None,
                valid_from: now.saturating_add_days(-1),
                valid_until: now.saturating_add_days(30),
                pin_tag: pin_tag(&pk.secret, pin(i).as_bytes()),
                pin_key_id: &pk.id,
                holder_ref: Some(&holder),
                holder_name: None,
                revoke_reason: None,
                updated_at: now.saturating_add_days(-1),
                doors: &[&door],
            },
        )?;
    }
    Ok(())
}

fn stats(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    let p = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
    (p(0.5), p(0.99))
}

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

fn entry(i: usize, at: Timestamp) -> DoorEntry {
    DoorEntry {
        door: door(i),
        door_known: true,
        tags: pin_tags(pin(i).as_bytes(), &pin_keys()),
        at,
    }
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
    let mut rng = Lcg(n as u64);
    let mut reads = Vec::with_capacity(READS);
    for _ in 0..READS {
        let i = rng.next(n);
        let t = Instant::now();
        let e = entry(i, now);
        let (d, _) = evaluate(&reader, &e, &policy, &jiff::tz::TimeZone::UTC)?;
        reads.push(t.elapsed());
        assert!(matches!(d, Decision::Unlock(_)), "key {i} must open");
    }

    let mut writes = Vec::with_capacity(WRITES);
    for k in 0..WRITES {
        let i = rng.next(n);
        let e = entry(i, now.saturating_add_micros(k as i64));
        let t = Instant::now();
        let out = store.write_blocking(Priority::Door, move |c| {
            door_entry(c, &e, &policy, &jiff::tz::TimeZone::UTC)
        })?;
        writes.push(t.elapsed());
        assert!(matches!(out.decision, Decision::Unlock(_)));
    }
    let (rm, r99) = stats(reads);
    let (wm, w99) = stats(writes);
    println!(
        "{n:>9} keys | fill {:>7.2} s | read median {:>7.1} µs  p99 {:>7.1} µs | write median {:>7.1} µs  p99 {:>7.1} µs",
        fill_time.as_secs_f64(),
        rm.as_secs_f64() * 1e6,
        r99.as_secs_f64() * 1e6,
        wm.as_secs_f64() * 1e6,
        w99.as_secs_f64() * 1e6,
    );
    store.close();
    Ok(())
}

fn main() -> Result<(), StoreError> {
    let mut sizes = Vec::new();
    let mut base = std::env::temp_dir();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--dir" {
            base = PathBuf::from(args.next().expect("--dir needs a path"));
        } else {
            sizes.push(a.parse::<usize>().expect("sizes are numbers"));
        }
    }
    if sizes.is_empty() {
        sizes = vec![1_000, 10_000, 100_000];
    }
    println!(
        "door decision: {READS} reads, {WRITES} writes per size, {DOORS} doors, 2 PIN keys, databases under {}",
        base.display()
    );
    for n in sizes {
        run(n, &base)?;
    }
    Ok(())
}
