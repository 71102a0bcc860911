//! The real `lockhub run` process, as an installer would start it: a
//! config folder, a database in `data/`, logs to a file. The harness reads
//! its memory from `/proc/<pid>/status` and its progress from the database
//! (read-only; WAL readers never block the writer).

use super::fixture;
use lockhub::store::{Priority, Store};
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// testkit's one `lockhub run` wrapper, plus what a run measures by.
pub struct Daemon {
    pub inner: testkit::daemon::Daemon,
    pub started: Instant,
}

impl std::ops::Deref for Daemon {
    type Target = testkit::daemon::Daemon;
    fn deref(&self) -> &Self::Target {
        &self.inner
    }
}

/// A temporary folder for a daemon's config and data: under
/// `LOCKHUB_BENCH_DIR` when set (a slow disk, scripts/slow-disk), else in
/// the system's temp folder.
pub fn bench_dir() -> tempfile::TempDir {
    match std::env::var_os("LOCKHUB_BENCH_DIR") {
        Some(d) => tempfile::tempdir_in(d).expect("tempdir in LOCKHUB_BENCH_DIR"),
        None => tempfile::tempdir().expect("tempdir"),
    }
}

/// Whether the daemons' data goes to a slow disk (`LOCKHUB_BENCH_DIR`).
pub fn slow_disk() -> bool {
    std::env::var_os("LOCKHUB_BENCH_DIR").is_some()
}

/// Copies the files of `from` (a daemon's folder, its database closed)
/// into `to`, folders included.
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read the daemon's folder") {
        let entry = entry.expect("folder entry");
        let dest = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            std::fs::create_dir_all(&dest).expect("make folder");
            copy_tree(&entry.path(), &dest);
        } else {
            std::fs::copy(entry.path(), &dest).expect("copy file");
        }
    }
}

pub use testkit::daemon::memory;

impl Daemon {
    /// Writes the config, optionally pre-fills the mirror with `prefill`
    /// keys (plain SQL, one transaction), and starts `lockhub run`.
    pub async fn start(mqtt_url: &str, serial_port: &Path, policy: &str, prefill: usize) -> Daemon {
        Self::start_with(mqtt_url, serial_port, policy, prefill, |_| {}).await
    }

    /// [`Daemon::start`], with `extra` run on the folder after the config is
    /// written and before the daemon starts (more sections, more rows).
    pub async fn start_with(
        mqtt_url: &str,
        serial_port: &Path,
        policy: &str,
        prefill: usize,
        extra: impl FnOnce(&Path),
    ) -> Daemon {
        let dir = bench_dir();
        fixture::write_config(dir.path(), mqtt_url, serial_port, policy);
        extra(dir.path());
        if prefill > 0 {
            let store = Store::open(
                &dir.path().join("data/lockhub.db"),
                &fixture::default_policy(),
            )
            .expect("open store");
            store
                .write(Priority::Bulk, move |c| {
                    fixture::bulk_load_keys(c, "p", prefill).map_err(Into::into)
                })
                .await
                .expect("prefill");
            store.close();
        }
        Self::spawn(dir, true)
    }

    /// [`Daemon::start`] on the system's temp folder, whatever
    /// `LOCKHUB_BENCH_DIR` says, and outside `LOCKHUB_BENCH_CGROUP`: for
    /// filling a mirror that [`Daemon::move_to_bench_dir`] then takes to the
    /// slow disk.
    pub async fn start_on_fast_disk(mqtt_url: &str, serial_port: &Path, policy: &str) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        fixture::write_config(dir.path(), mqtt_url, serial_port, policy);
        Self::spawn(dir, false)
    }

    /// Stops the daemon cleanly (its database closed, the WAL checkpointed
    /// away), copies its folder to [`bench_dir`] and starts `lockhub run`
    /// there, as a hub restarted on that disk would be.
    pub fn move_to_bench_dir(mut self) -> Daemon {
        self.stop();
        let dir = bench_dir();
        copy_tree(self.inner.dir.path(), dir.path());
        // The copy's ~100 MiB would otherwise still be in the page cache:
        // ext4's journal commits (which every fsync of the daemon waits
        // for) would flush it behind the daemon's first commits, which
        // took seconds, and denied door entries (their 2 s bound), that a
        // hub whose database was written long ago never sees.
        let synced = Command::new("sync")
            .arg("-f")
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(synced, "sync the copied folder");
        Self::spawn(dir, true)
    }

    /// `lockhub run` on the folder's `hub.toml` (testkit's wrapper, logging
    /// to `lockhub.log`); moved into `LOCKHUB_BENCH_CGROUP` if `throttled`.
    fn spawn(dir: tempfile::TempDir, throttled: bool) -> Daemon {
        let mut inner = testkit::daemon::Daemon::at(dir);
        let started = Instant::now();
        // LOCKHUB_BENCH_WRAP="heaptrack -o /tmp/lockhub": run the daemon under
        // a profiler (its figures then measure the profiler too).
        let wrap = std::env::var("LOCKHUB_BENCH_WRAP").unwrap_or_default();
        inner.spawn_wrapped(&wrap.split_whitespace().collect::<Vec<_>>());
        // LOCKHUB_BENCH_CGROUP=/sys/fs/cgroup/blkio/NAME: the daemon's I/O is
        // throttled there (scripts/slow-disk sets one up).
        if let Ok(group) = std::env::var("LOCKHUB_BENCH_CGROUP")
            && throttled
        {
            std::fs::write(
                Path::new(&group).join("cgroup.procs"),
                inner.pid().to_string(),
            )
            .expect("move the daemon into LOCKHUB_BENCH_CGROUP");
        }
        Daemon { inner, started }
    }

    pub fn pid(&self) -> u32 {
        if self.inner.is_started() {
            self.inner.pid()
        } else {
            0
        }
    }

    pub fn db_path(&self) -> PathBuf {
        self.inner.db_path()
    }

    /// A read-only connection to the daemon's database, once it exists.
    pub fn reader(&self) -> Connection {
        self.inner.db()
    }

    /// Every seq up to this one is committed (and, by then, acked).
    pub fn watermark(conn: &Connection) -> u64 {
        conn.query_row("SELECT watermark FROM seq_state", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_or(0, |w| w as u64)
    }

    /// The log's last lines, for failure messages.
    pub fn log(&self) -> String {
        self.inner.log_tail(20)
    }

    pub fn memory(&self) -> Option<(u64, u64)> {
        memory(self.pid())
    }

    /// SIGTERM (a clean shutdown), then a kill after 10 s.
    pub fn stop(&mut self) {
        self.inner.sigterm_within(Duration::from_secs(10));
    }
}

/// A broker, a `lockhub run` online on it, and a publisher flooding it with
/// pre-signed events: the common start of the ingest and resync scenarios.
/// The clock (`started`) starts with the first publish.
pub struct Flood {
    pub broker: super::broker::Mosquitto,
    pub daemon: Daemon,
    pub reader: Connection,
    pub started: Instant,
    pub publisher: tokio::task::JoinHandle<(Duration, usize)>,
}

pub async fn flood(
    settings: super::broker::BrokerSettings,
    payloads: &std::sync::Arc<Vec<Vec<u8>>>,
) -> Flood {
    let broker = super::broker::Mosquitto::start_with(settings);
    let daemon = Daemon::start(
        &broker.url(),
        Path::new("/dev/null"),
        fixture::NO_LOCKOUT_POLICY,
        0,
    )
    .await;
    super::mqtt::wait_online(broker.port, Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("the daemon never came online: {}", daemon.log()));
    // The SUBSCRIBE went out before the status; leave it time to land.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let reader = daemon.reader();
    let started = Instant::now();
    let publisher = tokio::spawn(super::mqtt::publish_all(
        broker.port,
        super::mqtt::events_topic(),
        payloads.clone(),
        super::mqtt::Pace::Flood,
    ));
    Flood {
        broker,
        daemon,
        reader,
        started,
        publisher,
    }
}

/// Bytes the process has caused to be written to storage so far
/// (`/proc/<pid>/io` `write_bytes`: WAL appends, checkpoints, everything,
/// counted when the pages are dirtied).
pub fn write_bytes(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// What a [`Sampler`] saw since it was last reset.
#[derive(Debug, Clone, Copy, Default)]
pub struct Seen {
    /// Largest WAL file size, bytes.
    pub wal_peak: u64,
    /// Largest VmRSS, bytes.
    pub rss_peak: u64,
    /// The last WAL size and VmRSS read.
    pub wal_now: u64,
    pub rss_now: u64,
}

/// Reads the daemon's WAL size and RSS every [`SAMPLE_EVERY`] on its own
/// thread, so a peak between two looks of the scenario is not missed.
pub struct Sampler {
    seen: std::sync::Arc<std::sync::Mutex<Seen>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

pub const SAMPLE_EVERY: Duration = Duration::from_millis(20);

impl Sampler {
    pub fn start(pid: u32, db: &Path) -> Sampler {
        let wal = db.with_extension("db-wal");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::default()));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, halt) = (seen.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !halt.load(std::sync::atomic::Ordering::Relaxed) {
                let w = std::fs::metadata(&wal).map_or(0, |m| m.len());
                let rss = memory(pid).map_or(0, |(rss, _)| rss);
                if let Ok(mut seen) = s.lock() {
                    seen.wal_peak = seen.wal_peak.max(w);
                    seen.rss_peak = seen.rss_peak.max(rss);
                    (seen.wal_now, seen.rss_now) = (w, rss);
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
        });
        Sampler {
            seen,
            stop,
            thread: Some(thread),
        }
    }

    pub fn seen(&self) -> Seen {
        self.seen.lock().map(|s| *s).unwrap_or_default()
    }

    /// Starts a new phase: the peaks restart from the current values.
    pub fn reset(&self) -> Seen {
        let mut s = self.seen.lock().expect("sampler");
        let before = *s;
        (s.wal_peak, s.rss_peak) = (s.wal_now, s.rss_now);
        before
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The database's size in bytes as a reader sees it (committed pages,
/// whether or not they have been checkpointed yet).
pub fn db_bytes(conn: &Connection) -> u64 {
    let pages: i64 = conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap_or(0);
    let size: i64 = conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap_or(0);
    (pages * size) as u64
}

/// A C MQTT consumer (`mosquitto_sub`, QoS 1) on every topic the hub
/// publishes from its outbox, counting what arrives: it stands for the
/// cloud draining the hub's outputs, and is never the slow side.
pub struct Consumer {
    child: Child,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Consumer {
    pub fn start(port: u16) -> Consumer {
        let base = format!("lockhub/v1/{}/{}", fixture::SITE_ID, fixture::HUB_ID);
        let mut cmd = Command::new("stdbuf");
        cmd.args(["-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .args(["-q", "1", "-F", "%t", "-i"])
            .arg(format!("bench-sub-{}", uuid::Uuid::new_v4().simple()));
        for t in ["results", "audit", "alerts", "sync"] {
            cmd.arg("-t").arg(format!("{base}/{t}"));
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mosquitto_sub (apt-get install mosquitto-clients)");
        let out = child.stdout.take().expect("piped stdout");
        let count = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let c = count.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for _ in std::io::BufReader::new(out).lines() {
                c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        Consumer { child, count }
    }

    pub fn count(&self) -> u64 {
        self.count.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The outbox's highest row id so far (rows ever written, pruned or not).
pub fn outbox_rows(conn: &Connection) -> u64 {
    conn.query_row(
        "SELECT coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0)",
        [],
        |r| r.get::<_, i64>(0),
    )
    .map_or(0, |n| n as u64)
}
