//! The real `lockhub` binary on its own folder, for the tests that run
//! the daemon: [`Daemon`] writes a config into a tempdir (secrets at 0600),
//! runs `lockhub run --config` with stderr appended to a log file, and can
//! SIGKILL, SIGTERM and restart it on the same data folder. The database
//! is read with read-only connections while the daemon runs.

use crate::cloud::{SIGNER_ID, cloud_key};
use crate::files::{HUB_ID, HubToml, SECRETS_TOML, SITE_ID, trust_signer};
use rusqlite::{Connection, OpenFlags};
use std::collections::HashSet;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `VmRSS` and `VmHWM` (its peak) of a process, in bytes, from
/// `/proc/<pid>/status`: what the memory targets of issue 14 are stated in.
/// `None` once the process is gone.
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

/// Upper bound for any single wait in these tests: long enough for a debug
/// build on two busy cores, short enough that a hang fails the suite.
pub const WAIT: Duration = Duration::from_secs(60);

/// How the daemon's config differs from the plain one.
#[derive(Debug, Clone, Default)]
pub struct DaemonOptions {
    /// Extra lines for `[mqtt]` (TLS files, username, password_file).
    pub mqtt_extra: String,
    /// Lines for `[policy]` (none: the defaults).
    pub policy: String,
    /// Another site or hub id than the vectors' (a second hub on the broker).
    pub site_id: Option<String>,
    pub hub_id: Option<String>,
    /// Whole sections appended to hub.toml (`[[osdp]]`, `[[reader]]`, doors).
    pub hub_extra: String,
    /// Sections appended to secrets.toml (`[[reader_key]]`).
    pub secrets_extra: String,
}

/// A `lockhub run` process and its data folder.
pub struct Daemon {
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    /// `RUST_LOG` for the process: `LOCKHUB_TEST_LOG`, else `info`.
    log_filter: String,
}

impl Daemon {
    /// Writes the config for a broker at `url` and starts the daemon.
    pub fn start(url: &str, opts: DaemonOptions) -> Daemon {
        let mut d = Daemon::prepare(url, opts);
        d.spawn();
        d
    }

    /// Writes the config for a broker at `url`; [`Daemon::spawn`] starts it.
    pub fn prepare(url: &str, opts: DaemonOptions) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        HubToml {
            site_id: opts.site_id.unwrap_or_else(|| SITE_ID.into()),
            hub_id: opts.hub_id.unwrap_or_else(|| HUB_ID.into()),
            mqtt_url: url.into(),
            mqtt_extra: opts.mqtt_extra,
            trust: trust_signer(SIGNER_ID, &cloud_key().verifying_key()),
            policy: opts.policy,
            extra: opts.hub_extra,
            ..HubToml::vectors()
        }
        .write(dir.path());
        crate::files::write_private(
            &dir.path().join("secrets.toml"),
            &format!("{}\n{}", &*SECRETS_TOML, opts.secrets_extra),
        )
        .expect("write secrets");
        Daemon::at(dir)
    }

    /// A daemon for a folder whose `hub.toml` the caller wrote (a
    /// benchmark's hub); [`Daemon::spawn`] starts it.
    pub fn at(dir: tempfile::TempDir) -> Daemon {
        Daemon {
            dir,
            child: None,
            // LOCKHUB_TEST_LOG overrides the level when debugging a test.
            log_filter: std::env::var("LOCKHUB_TEST_LOG").unwrap_or_else(|_| "info".into()),
        }
    }

    /// Another log filter than `info` from the next start on (`warn`: a
    /// fleet of daemons whose logs nobody reads).
    pub fn set_log_filter(&mut self, filter: &str) {
        filter.clone_into(&mut self.log_filter);
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("hub.toml")
    }

    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("data/lockhub.db")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("lockhub.log")
    }

    /// The daemon's stderr so far (its log lines carry ids, never bodies).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The last `n` lines of [`Daemon::log`], for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(n).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Starts the process (again), appending to the same log.
    pub fn spawn(&mut self) {
        self.spawn_wrapped(&[]);
    }

    /// [`Daemon::spawn`] under a wrapper command (`heaptrack -o FILE`: a
    /// profiler), the daemon's path and arguments after the wrapper's.
    pub fn spawn_wrapped(&mut self, wrap: &[&str]) {
        assert!(self.child.is_none(), "daemon already running");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open daemon log");
        let mut cmd = match wrap.split_first() {
            Some((tool, args)) => {
                let mut c = Command::new(tool);
                c.args(args).arg(crate::lockhub_bin());
                c
            }
            None => Command::new(crate::lockhub_bin()),
        };
        let child = cmd
            .args(["run", "--config"])
            .arg(self.config_path())
            .env("RUST_LOG", &self.log_filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start lockhub");
        self.child = Some(child);
    }

    /// Whether the process was started and has not been stopped here.
    pub fn is_started(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    /// SIGKILL: no clean shutdown, no offline status from the daemon (the
    /// broker sends the will).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (bounded) for the exit; returns whether it was 0.
    pub fn sigterm(&mut self) -> bool {
        match self.sigterm_within(WAIT) {
            Some(clean) => clean,
            None => panic!("daemon ignored SIGTERM"),
        }
    }

    /// SIGTERM and wait up to `limit` for the exit: whether it exited 0, or
    /// `None` when it had to be killed (or was not running).
    pub fn sigterm_within(&mut self, limit: Duration) -> Option<bool> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + limit;
        loop {
            if let Some(s) = c.try_wait().expect("wait daemon") {
                return Some(s.success());
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process has exited on its own (it is then no longer
    /// held: [`Daemon::spawn`] starts it again).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(Some(_))) => {
                self.child = None;
                true
            }
            _ => false,
        }
    }

    /// Fails the test if the process has exited on its own.
    pub fn assert_running(&mut self) {
        if let Some(c) = self.child.as_mut()
            && let Some(status) = c.try_wait().unwrap()
        {
            panic!("daemon exited ({status}):\n{}", self.log());
        }
    }

    /// A read-only connection to the live database (waits for the file).
    pub fn db(&self) -> Connection {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.db_path().exists()
                && let Ok(c) =
                    Connection::open_with_flags(self.db_path(), OpenFlags::SQLITE_OPEN_READ_ONLY)
            {
                c.busy_timeout(Duration::from_secs(5)).unwrap();
                if c.query_row("SELECT watermark FROM seq_state", [], |_| Ok(()))
                    .is_ok()
                {
                    return c;
                }
            }
            assert!(Instant::now() < deadline, "no database: {}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.db().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    pub fn watermark(&self) -> u64 {
        self.count("SELECT watermark FROM seq_state") as u64
    }

    /// Polls the database until `f` holds (bounded by [`WAIT`]).
    pub async fn wait_db(&mut self, what: &str, f: impl Fn(&Connection) -> bool) {
        let deadline = Instant::now() + WAIT;
        let db = self.db();
        loop {
            if f(&db) {
                return;
            }
            self.assert_running();
            if Instant::now() > deadline {
                std::fs::copy(self.log_path(), "/tmp/lockhub-failed.log").ok();
                let (dedupe, w): (i64, i64) = db
                    .query_row(
                        "SELECT (SELECT count(*) FROM dedupe), (SELECT watermark FROM seq_state)",
                        [],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .unwrap();
                panic!(
                    "timed out waiting for {what} (dedupe {dedupe}, watermark {w}); log tail:\n{}",
                    self.log_tail(15)
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Polls the daemon's log until `f` holds, for at most `within`.
    pub async fn wait_log(&mut self, what: &str, within: Duration, f: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + within;
        while !f(&self.log()) {
            self.assert_running();
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} in the log; log tail:\n{}",
                self.log_tail(20)
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Every row of the tables an event can change (keys, doors, tombstones,
    /// dedupe, seq bookkeeping), as text, for before/after comparisons.
    /// Holds tags as hex only inside the comparison; never printed whole.
    pub fn dump(&self) -> String {
        let db = self.db();
        let mut out = String::new();
        for (table, order) in [
            ("keys", "key_id"),
            ("key_doors", "key_id, door"),
            ("key_tombstones", "key_id"),
            ("reservation_tombstones", "reservation_id"),
            ("dedupe", "event_id"),
            ("seq_state", "id"),
            ("seq_seen", "seq"),
        ] {
            let mut stmt = db
                .prepare(&format!("SELECT * FROM {table} ORDER BY {order}"))
                .unwrap();
            let cols = stmt.column_count();
            let rows = stmt
                .query_map([], |r| {
                    let mut line = String::new();
                    for i in 0..cols {
                        let v: rusqlite::types::Value = r.get(i)?;
                        line.push_str(&format!("{v:?}|"));
                    }
                    Ok(line)
                })
                .unwrap();
            out.push_str(&format!("[{table}]\n"));
            for row in rows {
                out.push_str(&row.unwrap());
                out.push('\n');
            }
        }
        out
    }

    /// The seqs the dedupe table has seen.
    pub fn seen_seqs(&self) -> HashSet<u64> {
        let db = self.db();
        let mut stmt = db
            .prepare("SELECT seq FROM dedupe WHERE seq IS NOT NULL")
            .unwrap();
        stmt.query_map([], |r| r.get::<_, i64>(0))
            .unwrap()
            .map(|s| s.unwrap() as u64)
            .collect()
    }

    /// Whether the alert (condition, subject) is raised now.
    pub fn raised(&self, condition: &str, subject: &str) -> bool {
        crate::db::raised(&self.db(), condition, subject)
    }

    /// `lockhub ARGS --config hub.toml` run to its end beside the daemon
    /// (`status`, `alert clear`, ...).
    pub fn lockhub(&self, args: &[&str]) -> Output {
        Command::new(crate::lockhub_bin())
            .args(args)
            .arg("--config")
            .arg(self.config_path())
            .output()
            .expect("run lockhub")
    }

    /// `lockhub status --json`, which must succeed.
    pub fn status_json(&self) -> serde_json::Value {
        let out = self.lockhub(&["status", "--json"]);
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status --json is JSON")
    }

    /// The `count` of an alert (0 when it never was raised).
    pub fn alert_count(&self, condition: &str) -> i64 {
        self.db()
            .query_row(
                "SELECT coalesce(sum(count), 0) FROM alerts WHERE condition = ?1",
                [condition],
                |r| r.get(0),
            )
            .unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Waits for a path to exist (certificates and such), for clarity in setup.
pub fn must_exist(p: &Path) -> &Path {
    assert!(p.exists(), "missing {}", p.display());
    p
}
