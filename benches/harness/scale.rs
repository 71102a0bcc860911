//! Scale: what one door decision costs as the mirror grows from 1k to 1M
//! keys. Two costs per size:
//! - `decide`: PIN tags, the index probe, the lockout facts and the pure
//!   decision on a read connection (`store::door::evaluate`): what grows, if
//!   anything does, with the number of keys;
//! - `door_entry`: the same plus its audit row, committed on the writer with
//!   `Priority::Door` (one fsync, `synchronous=FULL`): what a door waits for.
//! - `decide_scheduled`: `decide` for a key with a weekly schedule (read in
//!   the hub's zone, Europe/Berlin here). Every other key has one, and the
//!   probes pick keys at random, so both kinds are measured interleaved in
//!   the same run; `scale.schedule.ratio` compares them at the largest size.
//!
//! Keys are bulk-loaded with plain SQL in one transaction (every schema
//! trigger runs). `examples/bench_decision.rs` is the standalone version of
//! this measurement.

use super::report::Figure;
use super::stats::{Summary, median, micros, thousands};
use super::{Sizes, fixture};
use lockhub::config::PinKey;
use lockhub::door::{Decision, pin_tags};
use lockhub::store::door::{DoorEntry, door_entry, evaluate};
use lockhub::store::{Priority, Store};
use lockhub_proto::time::Timestamp;
use std::time::{Duration, Instant};

pub const IDS: &[&str] = &[
    "scale.decide.ratio",
    "scale.door_entry.ratio",
    "scale.schedule.ratio",
    "disk.fsync",
];

/// The schedule every other key gets: three intervals that together cover
/// the whole week, so every probed key opens whenever the bench runs, and
/// the interval that matches on most days is the last one checked.
const SCHEDULE: &str = r#"[{"days":["sat"],"from":"00:00","until":"24:00"},{"days":["sun"],"from":"00:00","until":"24:00"},{"days":["mon","tue","wed","thu","fri"],"from":"00:00","until":"24:00"}]"#;

const S: &str = "scale";
/// `door_entry` commits per size: each is an fsync, so fewer than reads.
const WRITES: usize = 300;

/// The ids for each size, e.g. `scale.decide.1k`.
pub fn size_label(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

fn pin_keys() -> Vec<PinKey> {
    let (id, secret) = fixture::pin_key();
    vec![PinKey {
        id: id.to_owned(),
        secret: *secret,
    }]
}

/// A small deterministic generator, so that runs probe the same keys.
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

/// The floor under every commit: a 4 KiB append and `fdatasync` on the disk
/// the databases live on (SQLite in WAL with `synchronous=FULL` syncs the
/// WAL once per commit).
fn fsync_floor(samples: usize) -> Summary {
    fsync_floor_in(&tempfile::tempdir().expect("tempdir"), samples)
}

/// [`fsync_floor`] in `dir` (the door scenario measures it in the daemon's
/// own folder, in the same run as its entries).
pub fn fsync_floor_in(dir: &tempfile::TempDir, samples: usize) -> Summary {
    use std::io::Write;
    let path = dir.path().join("fsync-probe");
    let mut f = std::fs::File::create(&path).expect("probe file");
    let block = [0x5au8; 4096];
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        f.write_all(&block).expect("write");
        f.sync_data().expect("fdatasync");
        times.push(t.elapsed());
    }
    drop(f);
    let _ = std::fs::remove_file(path);
    Summary::from_durations(&times)
}

pub async fn run(sizes: &Sizes) -> Vec<Figure> {
    let mut figures = vec![];
    let fs = fsync_floor(if sizes.scale_probes < 1000 { 20 } else { 500 });
    figures.push(Figure::new(
        "disk.fsync",
        S,
        "the disk's floor: 4 KiB append + `fdatasync` in the temp folder the databases use: median (p99)",
        format!("{} ({})", micros(fs.median()), micros(fs.p99())),
    ));
    let mut decide_medians = vec![];
    let mut scheduled_medians = vec![];
    let mut write_medians = vec![];
    let policy = fixture::default_policy();
    let keys = pin_keys();
    for &n in &sizes.scale_keys {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("lockhub.db"), &policy).expect("open store");
        let t = Instant::now();
        store
            .write(Priority::Bulk, move |c| {
                fixture::bulk_load_keys(c, "k", n).map_err(Into::into)
            })
            .await
            .expect("bulk load");
        // Odd keys get a schedule, as a later version of their grant would.
        store
            .write(Priority::Bulk, move |c| {
                c.execute(
                    "UPDATE keys SET version = version + 1, schedule = ?1
                      WHERE CAST(substr(key_id, 2) AS INTEGER) % 2 = 1",
                    [SCHEDULE],
                )?;
                Ok(())
            })
            .await
            .expect("schedules");
        println!(
            "   loaded {} keys in {:.1} s (not timed)",
            thousands(n as f64),
            t.elapsed().as_secs_f64()
        );
        let reader = store.reader().expect("reader");
        let now = Timestamp::now_system();
        let zone = lockhub::config::time_zone("Europe/Berlin").expect("a zone the database knows");
        let mut rng = Lcg(42);
        // Warm the page cache the way a running hub's would be.
        for _ in 0..sizes.scale_probes.min(500) {
            let i = rng.next(n);
            let e = DoorEntry {
                door: fixture::door_name(i),
                door_known: true,
                tags: pin_tags(fixture::pin(i).as_bytes(), &keys),
                at: now,
            };
            evaluate(&reader, &e, &policy, &zone).expect("evaluate");
        }
        let mut run_medians = vec![];
        let mut scheduled_runs = vec![];
        let mut all = vec![];
        for _ in 0..sizes.runs.max(3) {
            let mut samples = Vec::with_capacity(sizes.scale_probes);
            let mut scheduled = Vec::with_capacity(sizes.scale_probes);
            for _ in 0..sizes.scale_probes {
                let i = rng.next(n);
                let t = Instant::now();
                let e = DoorEntry {
                    door: fixture::door_name(i),
                    door_known: true,
                    tags: pin_tags(fixture::pin(i).as_bytes(), &keys),
                    at: now,
                };
                let (d, _) = evaluate(&reader, &e, &policy, &zone).expect("evaluate");
                if i % 2 == 1 {
                    scheduled.push(t.elapsed());
                } else {
                    samples.push(t.elapsed());
                }
                assert!(matches!(d, Decision::Unlock(_)), "every probed key opens");
            }
            run_medians.push(Summary::from_durations(&samples).median());
            scheduled_runs.push(Summary::from_durations(&scheduled).median());
            all.extend(samples);
        }
        scheduled_medians.push(median(&scheduled_runs));
        let decide = median(&run_medians);
        let p99 = Summary::from_durations(&all).p99();
        decide_medians.push(decide);

        let mut writes: Vec<Duration> = Vec::with_capacity(WRITES);
        let count = if sizes.scale_probes < 1000 {
            20
        } else {
            WRITES
        };
        for k in 0..count {
            // An unscheduled key, so the figure stays the one it always was.
            let i = rng.next(n) & !1;
            let e = DoorEntry {
                door: fixture::door_name(i),
                door_known: true,
                tags: pin_tags(fixture::pin(i).as_bytes(), &keys),
                at: now.saturating_add_micros(k as i64),
            };
            let t = Instant::now();
            let zone = zone.clone();
            let out = store
                .write(Priority::Door, move |c| door_entry(c, &e, &policy, &zone))
                .await
                .expect("door_entry");
            writes.push(t.elapsed());
            assert!(matches!(out.decision, Decision::Unlock(_)));
        }
        let w = Summary::from_durations(&writes);
        write_medians.push(w.median());
        let label = size_label(n);
        figures.push(Figure::new(
            &format!("scale.decide.{label}"),
            S,
            &format!(
                "decision at {} keys (tags + probe + lockout facts + decide, read side): median (p99)",
                thousands(n as f64)
            ),
            format!("{} ({})", micros(decide), micros(p99)),
        ));
        figures.push(Figure::new(
            &format!("scale.decide_scheduled.{label}"),
            S,
            &format!(
                "decision at {} keys for a key with a weekly schedule (3 intervals, Europe/Berlin), same run: median of run medians",
                thousands(n as f64)
            ),
            micros(*scheduled_medians.last().expect("this size")),
        ));
        figures.push(Figure::new(
            &format!("scale.door_entry.{label}"),
            S,
            &format!(
                "`door_entry` at {} keys, committed with its audit row (one fsync): median (p99)",
                thousands(n as f64)
            ),
            format!("{} ({})", micros(w.median()), micros(w.p99())),
        ));
        drop(reader);
        store.close();
    }
    let ratio = |v: &[f64]| v.last().copied().unwrap_or(f64::NAN) / v[0];
    let (first, last) = (
        size_label(sizes.scale_keys[0]),
        size_label(*sizes.scale_keys.last().expect("sizes")),
    );
    let r = ratio(&decide_medians);
    figures.push(
        Figure::new(
            "scale.decide.ratio",
            S,
            &format!("decision cost at {last} keys / at {first} keys"),
            format!("{r:.2}×"),
        )
        .target("≤ 2×", r <= 2.0),
    );
    let r = scheduled_medians.last().copied().unwrap_or(f64::NAN)
        / decide_medians.last().copied().unwrap_or(f64::NAN);
    figures.push(
        Figure::new(
            "scale.schedule.ratio",
            S,
            &format!("decision with a schedule / without, at {last} keys, same run"),
            format!("{r:.2}×"),
        )
        .target("≤ 1.10×", r <= 1.10),
    );
    let r = ratio(&write_medians);
    figures.push(Figure::new(
        "scale.door_entry.ratio",
        S,
        &format!("`door_entry` (committed) at {last} keys / at {first} keys"),
        format!("{r:.2}×"),
    ));
    figures
}
