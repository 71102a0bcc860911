//! The real `lockhub` binary and a cloud peer, for fault-injection tests.
//!
//! - [`Daemon`]: writes a config into a tempdir (secrets at 0600), runs
//!   `lockhub run --config` with stderr appended to a log file, and can
//!   SIGKILL, SIGTERM and restart it on the same data folder. The database
//!   is read with read-only connections while the daemon runs.
//! - [`CloudClient`]: what the cloud sees and sends. It speaks MQTT 5 with a
//!   large Receive Maximum on purpose: Mosquitto then never has to queue
//!   what the hub says to it, so a broker with a tiny `max_queued_messages`
//!   drops only what the test means it to drop (events for the offline hub).
//!   Every hub envelope is checked against the hub's public key, derived
//!   from the secrets file, before a test sees its body.
//!
//! Bodies, PINs, tags and secrets are never printed: failures name event
//! ids, seqs, outcomes and counts.
#![allow(dead_code)]

use super::{HUB_ID, SECRETS_TOML, SITE_ID};
use ed25519_dalek::{SigningKey, VerifyingKey};
use lockhub::crypto;
use lockhub::event::Reason;
use lockhub::sim::cloud::{Cloud, GrantSpec, SignedEvent};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use rusqlite::{Connection, OpenFlags};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::OpenOptions;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use uuid::Uuid;

/// Upper bound for any single wait in these tests: long enough for a debug
/// build on two busy cores, short enough that a hang fails the suite.
pub const WAIT: Duration = Duration::from_secs(60);
/// The trust-ring id the test cloud signs as.
pub const SIGNER_ID: &str = "test-cloud";

pub fn topic(leaf: &str) -> String {
    format!("lockhub/v1/{SITE_ID}/{HUB_ID}/{leaf}")
}

/// The test cloud's signing key (in the daemon's trust ring).
pub fn cloud_key() -> SigningKey {
    SigningKey::from_bytes(&[42; 32])
}

/// A key outside the trust ring: what a forger has.
pub fn rogue_key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

pub fn cloud() -> Cloud {
    Cloud::new(cloud_key(), SIGNER_ID, SITE_ID.parse().unwrap(), HUB_ID)
}

fn secret(path: &[&str]) -> [u8; 32] {
    let v: toml::Value = toml::from_str(&SECRETS_TOML).unwrap();
    let mut cur = &v;
    for p in path {
        cur = match p.parse::<usize>() {
            Ok(i) => &cur[i],
            Err(_) => &cur[*p],
        };
    }
    crypto::b64u_decode_32(cur.as_str().unwrap()).unwrap()
}

/// The hub's public key, derived from the secrets file the daemon uses.
pub fn hub_public_key() -> VerifyingKey {
    SigningKey::from_bytes(&secret(&["hub_key", "secret"])).verifying_key()
}

/// The PIN key `k1` of the secrets file.
pub fn pin_key() -> [u8; 32] {
    secret(&["pin_key", "0", "secret"])
}

/// An active grant for door 101 with a PIN unique to `n` (no pin_collision,
/// no one_active_conflict between grants with different `n`).
pub fn grant(n: usize) -> GrantSpec {
    let pin = format!("{:06}", 100_000 + n);
    GrantSpec::active(
        &format!("k-{n}"),
        &format!("c-{n}"),
        "101",
        &pin,
        ("k1", &pin_key()),
    )
}

/// `count` key.issued events, seqs following on from the cloud's counter.
pub fn issue_many(cloud: &mut Cloud, from: usize, count: usize) -> Vec<SignedEvent> {
    (from..from + count)
        .map(|n| cloud.key_issued(&grant(n), &[]))
        .collect()
}

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
        let policy = if opts.policy.is_empty() {
            String::new()
        } else {
            format!("[policy]\n{}\n", opts.policy)
        };
        let hub = format!(
            "[hub]
site_id = \"{site_id}\"
hub_id = \"{hub_id}\"
data_dir = \"data\"

[mqtt]
url = \"{url}\"
{mqtt_extra}

[[trust.signer]]
id = \"{SIGNER_ID}\"
public_key = \"{cloud_pub}\"

[secrets]
file = \"secrets.toml\"

[[serial]]
name = \"board-a\"
port = \"/dev/ttyAMA0\"
baud = 115200

[[door]]
name = \"101\"
serial = \"board-a\"
index = 0
unlock_ms = 5000

{policy}
{hub_extra}",
            hub_extra = opts.hub_extra,
            mqtt_extra = opts.mqtt_extra,
            site_id = opts.site_id.as_deref().unwrap_or(SITE_ID),
            hub_id = opts.hub_id.as_deref().unwrap_or(HUB_ID),
            cloud_pub = crypto::b64u_encode(cloud_key().verifying_key().as_bytes()),
        );
        std::fs::write(dir.path().join("hub.toml"), hub).expect("write hub.toml");
        let secrets = dir.path().join("secrets.toml");
        std::fs::write(
            &secrets,
            format!("{}\n{}", &*SECRETS_TOML, opts.secrets_extra),
        )
        .expect("write secrets");
        std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
        Daemon { dir, child: None }
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

    /// Starts the process (again), appending to the same log.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "daemon already running");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("open daemon log");
        let child = Command::new(env!("CARGO_BIN_EXE_lockhub"))
            .args(["run", "--config"])
            .arg(self.dir.path().join("hub.toml"))
            // LOCKHUB_TEST_LOG overrides the level when debugging a test.
            .env(
                "RUST_LOG",
                std::env::var("LOCKHUB_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start lockhub");
        self.child = Some(child);
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
        let Some(mut c) = self.child.take() else {
            return false;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(s) = c.try_wait().expect("wait daemon") {
                return s.success();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!("daemon ignored SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
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
                let log = self.log();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                panic!(
                    "timed out waiting for {what} (dedupe {dedupe}, watermark {w}); log tail:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
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

/// Checks a hub envelope (shape, hub id, signature by the hub key) and
/// returns its body. Panics naming only what failed.
pub fn open_hub_envelope(payload: &[u8]) -> Value {
    let env: Value = serde_json::from_slice(payload).expect("hub envelope is JSON");
    assert_eq!(env["v"], 1, "hub envelope version");
    assert_eq!(env["hub_id"], HUB_ID, "hub envelope hub_id");
    let body = crypto::b64u_decode(env["body"].as_str().expect("body")).expect("body b64u");
    let sig: [u8; 64] = crypto::b64u_decode(env["sig"].as_str().expect("sig"))
        .expect("sig b64u")
        .try_into()
        .expect("64-byte sig");
    assert!(
        crypto::verify(crypto::HUB_CONTEXT, &hub_public_key(), &body, &sig),
        "hub signature must verify"
    );
    serde_json::from_slice(&body).expect("hub body is JSON")
}

/// One thing the hub said, signature checked.
#[derive(Debug, Clone)]
pub struct Heard {
    /// `results`, `audit`, `alerts`, `sync` or `status`.
    pub leaf: String,
    /// The verified body (plain JSON for `status`).
    pub body: Value,
}

enum Raw {
    Connected,
    Message(String, Vec<u8>),
}

/// The cloud's side of the broker: hears everything under the hub's
/// topics, publishes events.
pub struct CloudClient {
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Raw>,
    task: tokio::task::JoinHandle<()>,
    /// Broker PUBACKs for our publishes (the broker holds them from then on).
    acked: Arc<AtomicUsize>,
    pub connects: usize,
    pub heard: Vec<Heard>,
}

impl CloudClient {
    pub async fn plain(port: u16) -> Self {
        Self::connect(MqttOptions::new(
            format!("test-cloud-{}", Uuid::new_v4()),
            "127.0.0.1",
            port,
        ))
        .await
    }

    /// Connects with `o` (plus a persistent session and a large Receive
    /// Maximum), subscribes to `P/S/H/#` on every connection, and waits for
    /// the first SUBACK.
    pub async fn connect(mut o: MqttOptions) -> Self {
        o.set_clean_start(false)
            .set_session_expiry_interval(Some(3600))
            .set_receive_maximum(Some(u16::MAX))
            .set_max_packet_size(Some(8 << 20))
            .set_outgoing_inflight_upper_limit(200)
            .set_keep_alive(Duration::from_secs(30));
        let (client, mut eventloop) = AsyncClient::new(o, 4096);
        let (tx, rx) = mpsc::unbounded_channel();
        let acked = Arc::new(AtomicUsize::new(0));
        let (sub, acks) = (client.clone(), acked.clone());
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = sub.try_subscribe(topic("#"), QoS::AtLeastOnce);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = tx.send(Raw::Connected);
                    }
                    Ok(Event::Incoming(Packet::PubAck(_))) => {
                        acks.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let t = String::from_utf8_lossy(&p.topic).into_owned();
                        let _ = tx.send(Raw::Message(t, p.payload.to_vec()));
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        let mut c = CloudClient {
            client,
            rx,
            task,
            acked,
            connects: 0,
            heard: Vec::new(),
        };
        c.wait_until("the cloud's subscription", |c| c.connects >= 1)
            .await;
        c
    }

    fn take(&mut self, raw: Raw) {
        match raw {
            Raw::Connected => self.connects += 1,
            Raw::Message(t, p) => {
                let prefix = topic("");
                let Some(leaf) = t.strip_prefix(&prefix) else {
                    return;
                };
                let body = match leaf {
                    "events" => return,
                    "status" => serde_json::from_slice(&p).expect("status JSON"),
                    _ => open_hub_envelope(&p),
                };
                self.heard.push(Heard {
                    leaf: leaf.to_owned(),
                    body,
                });
            }
        }
    }

    /// Takes in whatever has arrived, without waiting.
    pub fn drain(&mut self) {
        while let Ok(raw) = self.rx.try_recv() {
            self.take(raw);
        }
    }

    /// Waits until `f` holds over what was heard (bounded by [`WAIT`]).
    pub async fn wait_until(&mut self, what: &str, mut f: impl FnMut(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        self.drain();
        while !f(self) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(raw)) => self.take(raw),
                Ok(None) => panic!("cloud client gone"),
                Err(_) => panic!(
                    "timed out waiting for {what}; heard {} messages ({:?})",
                    self.heard.len(),
                    self.summary()
                ),
            }
        }
    }

    /// Counts per leaf, for failure messages.
    pub fn summary(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for h in &self.heard {
            *m.entry(h.leaf.clone()).or_default() += 1;
        }
        m
    }

    pub fn on(&self, leaf: &str) -> impl Iterator<Item = &Value> {
        let leaf = leaf.to_owned();
        self.heard
            .iter()
            .filter(move |h| h.leaf == leaf)
            .map(|h| &h.body)
    }

    pub fn results(&self) -> Vec<&Value> {
        self.on("results").collect()
    }

    pub fn sync_requests(&self) -> Vec<&Value> {
        self.on("sync").collect()
    }

    /// Every answer to an authenticated event, by event id. A step-1
    /// rejection's `event_id` is only the unsigned envelope's hint (a forger
    /// can put any id there), so it answers nothing and is left out.
    pub fn results_by_id(&self) -> HashMap<Uuid, Vec<&Value>> {
        let mut m: HashMap<Uuid, Vec<&Value>> = HashMap::new();
        for r in self.on("results") {
            let step1 = r["reason"]
                .as_str()
                .and_then(Reason::parse)
                .is_some_and(Reason::is_step1);
            if step1 {
                continue;
            }
            if let Some(id) = r["event_id"].as_str() {
                m.entry(id.parse().unwrap()).or_default().push(r);
            }
        }
        m
    }

    /// Waits until every event in `events` has at least one result.
    pub async fn wait_results(&mut self, events: &[SignedEvent]) {
        let want: HashSet<Uuid> = events.iter().map(|e| e.event_id).collect();
        self.wait_until(&format!("results for {} events", want.len()), |c| {
            let got = c.results_by_id();
            want.iter().all(|id| got.contains_key(id))
        })
        .await;
    }

    /// Whether the hub's last status says online.
    pub fn is_online(&self) -> bool {
        self.on("status")
            .last()
            .is_some_and(|s| s["state"] == "online")
    }

    pub async fn wait_online(&mut self) {
        self.wait_until("the hub's online status", |c| c.is_online())
            .await;
    }

    /// Publishes raw bytes on the events topic (QoS 1).
    pub async fn publish_raw(&self, payload: Vec<u8>) {
        self.client
            .publish(topic("events"), QoS::AtLeastOnce, false, payload)
            .await
            .expect("queue publish");
    }

    pub async fn publish(&self, events: &[SignedEvent]) {
        for e in events {
            self.publish_raw(e.envelope.clone()).await;
        }
    }

    /// Waits until the broker has acknowledged `n` of our publishes in all.
    pub async fn wait_acked(&mut self, n: usize) {
        let acked = self.acked.clone();
        let deadline = tokio::time::Instant::now() + WAIT;
        while acked.load(Ordering::SeqCst) < n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "broker acked {} of {n} publishes",
                acked.load(Ordering::SeqCst)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for CloudClient {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Asserts each event was answered, and answered once: every result for an
/// id is either the first answer (re-sent byte-identical after a crash
/// between PUBACK and marking it sent: the cloud dedupes such repeats) or a
/// later `duplicate: true` replay of it. `outcome` is what the first says.
pub fn assert_answered_once(cloud: &CloudClient, events: &[SignedEvent], outcome: &str) {
    let by_id = cloud.results_by_id();
    for e in events {
        let rs = by_id
            .get(&e.event_id)
            .unwrap_or_else(|| panic!("no result for seq {:?}", e.seq));
        let firsts: HashSet<String> = rs
            .iter()
            .filter(|r| r["duplicate"] != true)
            .map(|r| r.to_string())
            .collect();
        assert_eq!(
            firsts.len(),
            1,
            "seq {:?}: {} distinct first answers",
            e.seq,
            firsts.len()
        );
        for r in rs {
            assert_eq!(r["outcome"], outcome, "seq {:?}", e.seq);
            assert_eq!(r["seq"], serde_json::json!(e.seq), "seq {:?}", e.seq);
        }
    }
}

/// Waits for a path to exist (certificates and such), for clarity in setup.
pub fn must_exist(p: &Path) -> &Path {
    assert!(p.exists(), "missing {}", p.display());
    p
}
