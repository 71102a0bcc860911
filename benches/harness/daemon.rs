//! The real `lockhub run` process, as an installer would start it: a
//! config folder, a database in `data/`, logs to a file. The harness reads
//! its memory from `/proc/<pid>/status` and its progress from the database
//! (read-only; WAL readers never block the writer).

use super::fixture;
use super::footprint::lockhub_bin;
use lockhub::store::{Priority, Store};
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Daemon {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    pub started: Instant,
}

/// `VmRSS` and `VmHWM` (peak) of a process, in bytes.
pub fn memory(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

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
        let dir = tempfile::tempdir().expect("tempdir");
        let config = fixture::write_config(dir.path(), mqtt_url, serial_port, policy);
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
        let log = std::fs::File::create(dir.path().join("lockhub.log")).expect("log file");
        let started = Instant::now();
        let child = Command::new(lockhub_bin())
            .arg("run")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start lockhub run");
        Daemon {
            dir,
            child: Some(child),
            started,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("data/lockhub.db")
    }

    /// A read-only connection to the daemon's database, once it exists.
    pub fn reader(&self) -> Connection {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Connection::open_with_flags(self.db_path(), OpenFlags::SQLITE_OPEN_READ_ONLY) {
                Ok(c)
                    if c.query_row("SELECT 1 FROM seq_state", [], |_| Ok(()))
                        .is_ok() =>
                {
                    let _ = c.busy_timeout(Duration::from_secs(5));
                    return c;
                }
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => panic!("the daemon made no database: {}", self.log()),
            }
        }
    }

    /// Every seq up to this one is committed (and, by then, acked).
    pub fn watermark(conn: &Connection) -> u64 {
        conn.query_row("SELECT watermark FROM seq_state", [], |r| {
            r.get::<_, i64>(0)
        })
        .map_or(0, |w| w as u64)
    }

    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("lockhub.log")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(20).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    pub fn memory(&self) -> Option<(u64, u64)> {
        memory(self.pid())
    }

    /// SIGTERM (a clean shutdown), then a kill after 10 s.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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
    let broker = super::broker::Mosquitto::start(settings);
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
