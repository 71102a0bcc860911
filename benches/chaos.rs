//! `cargo bench --bench chaos -- [--secs N] [--seed S]`
//!
//! The chaos run (RELIABILITY.md): the real `lockhub run` binary, a real
//! Mosquitto and a simulated lock board on a pseudo-terminal, while a
//! simulated cloud streams signed events (issues, revokes, guest erasures,
//! replays, checkpoints, answers to sync requests, and silences longer than
//! `cloud_stale_s`) and PINs are typed at the doors. Meanwhile the daemon is
//! SIGKILLed at random moments and the broker is restarted. Then the chaos
//! stops, everything is given time to settle, and the run checks:
//! - every event was applied once and answered, with a consistent result;
//! - every door decision was audited exactly once (and no unknown or
//!   revoked PIN ever opened a door);
//! - every alert ended raised or cleared consistently with the final state,
//!   and the cloud heard that final state;
//! - nothing in the outbox was lost: every audit row reached the cloud's
//!   subscriber at least once, nothing is left unsent;
//! - no erased guest's name is left in the database file, its WAL or a
//!   journal.
//!
//! It prints its figures and every anomaly, and exits 1 if there was one.
//! Not in CI (`cargo test` does not build bench targets): it runs for as
//! long as it is told (default 120 s; the recorded run is 600 s). Loopback
//! only; it stops by itself.

use firmware_bridge::{BoardConfig, Downlink};
use harness::broker::{BrokerSettings, Mosquitto};
use harness::fixture;
use lockhub::sim::board::{SimBoard, SimEvent};
use lockhub_proto::crypto;
use lockhub_proto::sign::{GrantSpec, SignedEvent};
use lockhub_proto::time::Timestamp;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use rusqlite::{Connection, OpenFlags};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::board::pty;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

/// The hub's policy: no lockouts (wrong PINs are typed on purpose), and a
/// short `cloud_stale_s` so the cloud's silences raise and clear it.
const POLICY: &str = "lockout_threshold = 1000000\ncloud_stale_s = 20\n";
const CLOUD_STALE: Duration = Duration::from_secs(20);
/// The cloud's pace.
const EVENT_EVERY: Duration = Duration::from_millis(250);
const CHECKPOINT_EVERY: Duration = Duration::from_secs(5);
/// A silence longer than `cloud_stale_s`, every few minutes.
const SILENCE: Duration = Duration::from_secs(30);
const SILENCE_EVERY: (u64, u64) = (120, 180);
/// Seconds between SIGKILLs of the daemon, and how long it stays dead (ms).
const KILL_EVERY: (u64, u64) = (6, 25);
const DEAD_MS: (u64, u64) = (100, 2000);
/// Seconds between broker restarts, and how long it stays down (ms).
const BROKER_EVERY: (u64, u64) = (45, 90);
const BROKER_DOWN_MS: (u64, u64) = (200, 3000);
/// A typed entry with no answer by then counts as lost (to a kill).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(4);
/// How long the run may take to settle once the chaos stops.
const SETTLE: Duration = Duration::from_secs(240);

struct Options {
    secs: u64,
    seed: u64,
}

impl Options {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
        let mut o = Options {
            secs: 120,
            seed: 0x10c4_40b5,
        };
        while let Some(a) = args.next() {
            let mut num = |name: &str| -> Result<u64, String> {
                args.next()
                    .and_then(|v| v.parse().ok())
                    .ok_or(format!("{name} needs a number"))
            };
            match a.as_str() {
                "--secs" => o.secs = num("--secs")?,
                "--seed" => o.seed = num("--seed")?,
                // `cargo bench` passes `--bench`.
                "--bench" => {}
                other => return Err(format!("unknown argument {other}")),
            }
        }
        Ok(o)
    }
}

/// xorshift64*: deterministic per seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn range(&mut self, (lo, hi): (u64, u64)) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

fn main() -> std::process::ExitCode {
    let opts = match Options::parse(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("chaos: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let anomalies = rt.block_on(run(opts));
    if anomalies == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

// ---------------------------------------------------------------------------
// What the cloud did and heard
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Issue,
    Revoke,
    Erase,
    Checkpoint,
}

struct KeyModel {
    key_id: String,
    door: u8,
    pin: String,
    holder: String,
    name: String,
    /// The revoke was published (typing its PIN may still open until the
    /// hub has applied it).
    revoke: Option<Uuid>,
    erase: Option<Uuid>,
}

#[derive(Default)]
struct World {
    /// Every seq'd event, by seq - 1 (for re-sending).
    events: Vec<SignedEvent>,
    kinds: HashMap<Uuid, Kind>,
    /// Index into `keys` for issue and revoke events.
    key_of: HashMap<Uuid, usize>,
    keys: Vec<KeyModel>,
    checkpoints: usize,
    replays: usize,
    resent: usize,
    // Heard from the hub (signatures checked).
    results: HashMap<Uuid, Vec<Value>>,
    audit: HashMap<String, HashSet<String>>,
    alerts: Vec<Value>,
    sync_requests: usize,
    bad_envelopes: usize,
}

impl World {
    fn result_heard(&self, id: &Uuid) -> Option<&Value> {
        self.results
            .get(id)
            .and_then(|r| r.iter().find(|b| b["duplicate"] == false))
    }

    /// Whether the hub has applied the event (its first result says so).
    fn applied(&self, id: &Uuid) -> bool {
        self.result_heard(id)
            .is_some_and(|r| r["outcome"] == "applied")
    }
}

type Shared = Arc<Mutex<World>>;

fn topic(leaf: &str) -> String {
    format!("lockhub/v1/{}/{}/{leaf}", fixture::SITE_ID, fixture::HUB_ID)
}

/// A verified hub envelope's body (the hub's key is known to its cloud).
fn open_envelope(payload: &[u8]) -> Option<Value> {
    let body =
        crypto::open_hub_envelope(payload, fixture::HUB_ID, &fixture::hub_public_key()).ok()?;
    serde_json::from_slice(&body).ok()
}

/// The cloud's MQTT side: a persistent session that hears everything the
/// hub says and publishes events; sync requests go to `sync_tx`.
fn cloud_client(port: u16, world: Shared, sync_tx: mpsc::UnboundedSender<u64>) -> AsyncClient {
    let mut o = MqttOptions::new("chaos-cloud", "127.0.0.1", port);
    o.set_clean_session(false)
        .set_keep_alive(Duration::from_secs(5))
        .set_max_packet_size(2 << 20, 2 << 20);
    let (client, mut eventloop) = AsyncClient::new(o, 100_000);
    let sub = client.clone();
    tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = sub
                        .subscribe(
                            format!("lockhub/v1/{}/{}/+", fixture::SITE_ID, fixture::HUB_ID),
                            QoS::AtLeastOnce,
                        )
                        .await;
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let leaf = p.topic.rsplit('/').next().unwrap_or_default().to_owned();
                    if leaf == "events" || leaf == "status" {
                        continue;
                    }
                    let mut w = world.lock().unwrap();
                    let Some(body) = open_envelope(&p.payload) else {
                        w.bad_envelopes += 1;
                        continue;
                    };
                    match leaf.as_str() {
                        "results" => {
                            if let Some(id) = body["event_id"].as_str().and_then(|s| s.parse().ok())
                            {
                                w.results.entry(id).or_default().push(body);
                            }
                        }
                        "audit" => {
                            let id = body["audit_id"].as_str().unwrap_or_default().to_owned();
                            w.audit.entry(id).or_default().insert(body.to_string());
                        }
                        "alerts" => w.alerts.push(body),
                        "sync" => {
                            w.sync_requests += 1;
                            if let Some(from) = body["from_seq"].as_u64() {
                                let _ = sync_tx.send(from);
                            }
                        }
                        _ => {}
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    });
    client
}

async fn publish(client: &AsyncClient, e: &SignedEvent) {
    let _ = client
        .publish(topic("events"), QoS::AtLeastOnce, false, e.envelope.clone())
        .await;
}

// ---------------------------------------------------------------------------
// The board and the typist
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Unlock,
    Deny,
    None,
}

struct Enter {
    door: u8,
    pin: String,
    reply: oneshot::Sender<Answer>,
}

/// The simulated board on the pty's master: types what it is told and
/// reports the hub's first Unlock or Deny at that door.
async fn board(master: pty::Master, mut rx: mpsc::Receiver<Enter>, stop: Arc<AtomicBool>) {
    let mut sim = SimBoard::new(master, BoardConfig::new(1, fixture::DOORS as u8));
    let mut pending: Option<(u8, oneshot::Sender<Answer>, Instant)> = None;
    while !stop.load(Ordering::Relaxed) {
        if pending.is_none()
            && let Ok(e) = rx.try_recv()
        {
            sim.take_events();
            sim.enter_pin(e.door, &e.pin);
            pending = Some((e.door, e.reply, Instant::now() + ANSWER_TIMEOUT));
        }
        if sim.step().await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let events = sim.take_events();
        if let Some((door, _, deadline)) = &pending {
            let answer = events.iter().find_map(|e| match e {
                SimEvent::Received(Downlink::Unlock { door: d, .. }) if d == door => {
                    Some(Answer::Unlock)
                }
                SimEvent::Received(Downlink::Deny { door: d, .. }) if d == door => {
                    Some(Answer::Deny)
                }
                _ => None,
            });
            let answer = answer.or((Instant::now() > *deadline).then_some(Answer::None));
            if let Some(a) = answer
                && let Some((_, reply, _)) = pending.take()
            {
                let _ = reply.send(a);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A live key's PIN (its issue applied, no revoke published).
    Open,
    /// A PIN no key ever had.
    Unknown,
    /// A key whose revoke the hub had applied before the PIN was typed.
    Revoked,
}

struct Entry {
    door: u8,
    at: Timestamp,
    expect: Expect,
    answer: Answer,
}

async fn typist(
    world: Shared,
    tx: mpsc::Sender<Enter>,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> Vec<Entry> {
    let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::new();
    let mut unknown = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(Duration::from_millis(rng.range((150, 450)))).await;
        let pick = {
            let w = world.lock().unwrap();
            let open: Vec<&KeyModel> = w
                .keys
                .iter()
                .filter(|k| k.revoke.is_none())
                .filter(|k| {
                    w.key_of.iter().any(|(id, i)| {
                        w.keys[*i].key_id == k.key_id && w.kinds[id] == Kind::Issue && w.applied(id)
                    })
                })
                .collect();
            let revoked: Vec<&KeyModel> = w
                .keys
                .iter()
                .filter(|k| k.revoke.is_some_and(|id| w.applied(&id)))
                .collect();
            let roll = rng.below(100);
            if roll < 50 && !open.is_empty() {
                let k = open[rng.below(open.len() as u64) as usize];
                Some((k.door, k.pin.clone(), Expect::Open))
            } else if roll < 75 && !revoked.is_empty() {
                let k = revoked[rng.below(revoked.len() as u64) as usize];
                Some((k.door, k.pin.clone(), Expect::Revoked))
            } else {
                unknown += 1;
                Some((
                    rng.below(fixture::DOORS as u64) as u8,
                    format!("{:08}", 90_000_000 + unknown),
                    Expect::Unknown,
                ))
            }
        };
        let Some((door, pin, expect)) = pick else {
            continue;
        };
        let (reply, answer) = oneshot::channel();
        let at = Timestamp::now_system();
        if tx.send(Enter { door, pin, reply }).await.is_err() {
            break;
        }
        let answer = answer.await.unwrap_or(Answer::None);
        out.push(Entry {
            door,
            at,
            expect,
            answer,
        });
    }
    out
}

// ---------------------------------------------------------------------------
// The daemon
// ---------------------------------------------------------------------------

struct Hub {
    daemon: testkit::daemon::Daemon,
    /// When each process started, to place anomalies next to restarts.
    spawns: Vec<Timestamp>,
}

impl Hub {
    fn spawn(&mut self) {
        self.spawns.push(Timestamp::now_system());
        self.daemon.spawn();
    }

    fn kill9(&mut self) {
        self.daemon.kill9();
    }

    fn sigterm(&mut self) -> bool {
        self.daemon.sigterm_within(Duration::from_secs(15)) == Some(true)
    }

    /// Whether the process exited by itself (a crash is an anomaly).
    fn exited(&mut self) -> bool {
        self.daemon.exited()
    }

    fn db_path(&self) -> PathBuf {
        self.daemon.db_path()
    }

    fn reader(&self) -> Option<Connection> {
        let c =
            Connection::open_with_flags(self.db_path(), OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
        c.busy_timeout(Duration::from_secs(5)).ok()?;
        c.query_row("SELECT watermark FROM seq_state", [], |_| Ok(()))
            .ok()?;
        Some(c)
    }
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

fn grant_for(i: usize) -> (GrantSpec, KeyModel) {
    let key_id = format!("x{i}");
    let door = (i % fixture::DOORS) as u8;
    let pin = format!("{:08}", 40_000_000 + i);
    let mut g = GrantSpec::active(
        &key_id,
        &format!("c-x{i}"),
        &fixture::door_name(i),
        &pin,
        fixture::pin_key(),
    );
    let holder = format!("g-x{i}");
    let name = format!("Chaos Guest {i:06}");
    g.holder_ref = Some(holder.clone());
    g.holder_name = Some(name.clone());
    (
        g,
        KeyModel {
            key_id,
            door,
            pin,
            holder,
            name,
            revoke: None,
            erase: None,
        },
    )
}

#[derive(Default)]
struct Figures {
    kills: usize,
    broker_restarts: usize,
    silences: usize,
    crashes: usize,
}

async fn run(opts: Options) -> usize {
    let t0 = Instant::now();
    let mut rng = Rng(opts.seed | 1);
    let mut broker = Mosquitto::start_with(BrokerSettings {
        max_inflight_messages: 20,
        max_queued_messages: 100_000,
    });
    let pty = pty::Pty::open();
    let (master, _slave, pty_path) = pty.into_parts();
    let dir = tempfile::tempdir().expect("tempdir");
    fixture::write_config(dir.path(), &broker.url(), &pty_path, POLICY);
    let mut hub = Hub {
        daemon: testkit::daemon::Daemon::at(dir),
        spawns: Vec::new(),
    };
    hub.spawn();
    println!(
        "chaos: {} s, seed {}, hub folder {}",
        opts.secs,
        opts.seed,
        hub.daemon.dir.path().display()
    );

    let world: Shared = Arc::new(Mutex::new(World::default()));
    let (sync_tx, mut sync_rx) = mpsc::unbounded_channel();
    let cloud = cloud_client(broker.port, world.clone(), sync_tx);
    let mut signer = fixture::cloud();

    let stop_typing = Arc::new(AtomicBool::new(false));
    let stop_board = Arc::new(AtomicBool::new(false));
    let (enter_tx, enter_rx) = mpsc::channel(1);
    let board_task = tokio::spawn(board(master, enter_rx, stop_board.clone()));
    let typist_task = tokio::spawn(typist(
        world.clone(),
        enter_tx,
        stop_typing.clone(),
        opts.seed,
    ));

    let mut figures = Figures::default();
    let chaos_end = t0 + Duration::from_secs(opts.secs);
    let at = |s: u64| Instant::now() + Duration::from_secs(s);
    let mut next_event = Instant::now();
    let mut next_checkpoint = Instant::now() + CHECKPOINT_EVERY;
    let mut next_kill = at(rng.range(KILL_EVERY));
    let mut next_broker = at(rng.range(BROKER_EVERY));
    let mut next_silence = at(rng.range(SILENCE_EVERY));
    let mut silent_until = Instant::now();
    let mut last_resend = Instant::now() - Duration::from_secs(10);
    let mut want_resend: Option<u64> = None;

    while Instant::now() < chaos_end {
        let now = Instant::now();
        let silent = now < silent_until;
        if now >= next_silence {
            silent_until = now + SILENCE;
            next_silence = now + SILENCE + Duration::from_secs(rng.range(SILENCE_EVERY));
            figures.silences += 1;
        }
        if !silent && now >= next_event {
            next_event = now + EVENT_EVERY;
            let ev = next_cloud_event(&mut rng, &mut signer, &world);
            if let Some(ev) = ev {
                publish(&cloud, &ev).await;
            }
        }
        if !silent && now >= next_checkpoint {
            next_checkpoint = now + CHECKPOINT_EVERY;
            let cp = signer.checkpoint();
            {
                let mut w = world.lock().unwrap();
                w.kinds.insert(cp.event_id, Kind::Checkpoint);
                w.checkpoints += 1;
            }
            publish(&cloud, &cp).await;
        }
        while let Ok(from) = sync_rx.try_recv() {
            want_resend = Some(want_resend.map_or(from, |f| f.min(from)));
        }
        if !silent
            && let Some(from) = want_resend
            && now.duration_since(last_resend) > Duration::from_secs(2)
        {
            want_resend = None;
            last_resend = now;
            resend(&cloud, &world, from, &mut signer).await;
        }
        if now >= next_kill {
            hub.kill9();
            figures.kills += 1;
            tokio::time::sleep(Duration::from_millis(rng.range(DEAD_MS))).await;
            hub.spawn();
            next_kill = at(rng.range(KILL_EVERY));
        }
        if now >= next_broker {
            let down = Duration::from_millis(rng.range(BROKER_DOWN_MS));
            tokio::task::block_in_place(|| broker.restart_after(down));
            figures.broker_restarts += 1;
            next_broker = at(rng.range(BROKER_EVERY));
        }
        if hub.exited() {
            figures.crashes += 1;
            eprintln!("chaos: the daemon exited by itself; restarting it");
            hub.spawn();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Settle: no more chaos; the cloud keeps checkpointing and answering.
    stop_typing.store(true, Ordering::Relaxed);
    let entries = typist_task.await.unwrap_or_default();
    let chaos_secs = t0.elapsed().as_secs();
    let settle_start = Instant::now();
    let mut settled = false;
    while settle_start.elapsed() < SETTLE {
        while let Ok(from) = sync_rx.try_recv() {
            want_resend = Some(want_resend.map_or(from, |f| f.min(from)));
        }
        if let Some(from) = want_resend.take() {
            resend(&cloud, &world, from, &mut signer).await;
        }
        let cp = signer.checkpoint();
        {
            let mut w = world.lock().unwrap();
            w.kinds.insert(cp.event_id, Kind::Checkpoint);
            w.checkpoints += 1;
        }
        publish(&cloud, &cp).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        if hub.exited() {
            figures.crashes += 1;
            hub.spawn();
        }
        // Past the last silence: long enough for cloud_stale to clear.
        if settle_start.elapsed() > CLOUD_STALE && converged(&hub, &world, signer.head_seq()) {
            settled = true;
            break;
        }
    }
    let settle_secs = settle_start.elapsed().as_secs();

    let mut anomalies: Vec<String> = Vec::new();
    if !settled {
        anomalies.push(format!(
            "the hub did not settle within {} s",
            SETTLE.as_secs()
        ));
    }
    if figures.crashes > 0 {
        anomalies.push(format!(
            "the daemon exited by itself {} times",
            figures.crashes
        ));
    }
    let db = hub.reader().expect("the hub's database");
    // What the cloud did and heard, taken out (nothing more counts now).
    let w = std::mem::take(&mut *world.lock().unwrap());
    check_events(&db, &w, signer.head_seq(), &mut anomalies);
    let doors = check_doors(&db, &entries, &hub.spawns, &mut anomalies);
    let alerts = check_alerts(&db, &w, &mut anomalies);
    let audit_rows = check_outbox(&db, &w, &mut anomalies);
    let erased = check_erased(&hub.db_path(), &w, &mut anomalies);
    drop(db);
    let clean_exit = hub.sigterm();
    if !clean_exit {
        anomalies.push("the daemon did not stop cleanly on SIGTERM".into());
    }
    stop_board.store(true, Ordering::Relaxed);
    let _ = board_task.await;

    let issued = w.kinds.values().filter(|k| **k == Kind::Issue).count();
    let revoked = w.kinds.values().filter(|k| **k == Kind::Revoke).count();
    let erasures = w.kinds.values().filter(|k| **k == Kind::Erase).count();
    let answered = entries.iter().filter(|e| e.answer != Answer::None).count();
    println!("chaos figures (seed {}):", opts.seed);
    println!("  chaos duration        {chaos_secs} s, then settled in {settle_secs} s");
    println!("  daemon SIGKILLs       {}", figures.kills);
    println!("  broker restarts       {}", figures.broker_restarts);
    println!(
        "  cloud silences        {} (of {} s each)",
        figures.silences,
        SILENCE.as_secs()
    );
    println!(
        "  events                {} seq'd ({issued} issues, {revoked} revokes, {erasures} erasures), {} checkpoints, {} replays, {} re-sent on {} sync requests",
        w.events.len(),
        w.checkpoints,
        w.replays,
        w.resent,
        w.sync_requests
    );
    println!(
        "  door entries          {} typed, {answered} answered ({} opened, {} denied), {} lost to kills",
        entries.len(),
        doors.opened,
        doors.denied,
        entries.len() - answered
    );
    println!("  decisions audited     {} rows", doors.rows);
    println!("  audit rows            {audit_rows}, each heard by the cloud");
    println!(
        "  alerts                {} raised/cleared messages heard; final: {}",
        w.alerts.len(),
        alerts
    );
    println!("  erased names checked  {erased} (db, WAL, journal)");
    println!("  anomalies             {}", anomalies.len());
    for a in anomalies.iter().take(50) {
        println!("    - {a}");
    }
    if !anomalies.is_empty() {
        println!(
            "  hub log: {}",
            hub.daemon.dir.path().join("lockhub.log").display()
        );
        // Keep the folder for a look.
        hub.daemon.dir.disable_cleanup(true);
    }
    anomalies.len()
}

/// The next live event: mostly new keys, some revokes and erasures, and a
/// few replays of old events (the hub must answer them `duplicate`).
fn next_cloud_event(
    rng: &mut Rng,
    signer: &mut lockhub::sim::cloud::Cloud,
    world: &Shared,
) -> Option<SignedEvent> {
    let mut w = world.lock().unwrap();
    let roll = rng.below(100);
    let live: Vec<usize> = (0..w.keys.len())
        .filter(|i| w.keys[*i].revoke.is_none())
        .collect();
    let named: Vec<usize> = (0..w.keys.len())
        .filter(|i| w.keys[*i].erase.is_none())
        .collect();
    if roll < 8 && !w.events.is_empty() {
        w.replays += 1;
        let i = rng.below(w.events.len() as u64) as usize;
        return Some(w.events[i].clone());
    }
    let (ev, kind, key) = if roll < 28 && live.len() > 4 {
        let i = live[rng.below(live.len() as u64) as usize];
        let ev = signer.key_revoked(&w.keys[i].key_id, 1, "checkout");
        w.keys[i].revoke = Some(ev.event_id);
        (ev, Kind::Revoke, Some(i))
    } else if roll < 33 && !named.is_empty() {
        let i = named[rng.below(named.len() as u64) as usize];
        let ev = signer.guest_erased(&w.keys[i].holder);
        w.keys[i].erase = Some(ev.event_id);
        (ev, Kind::Erase, Some(i))
    } else {
        let n = w.keys.len();
        let (grant, model) = grant_for(n);
        let ev = signer.key_issued(&grant, &[]);
        w.keys.push(model);
        (ev, Kind::Issue, Some(n))
    };
    w.kinds.insert(ev.event_id, kind);
    if let Some(i) = key {
        w.key_of.insert(ev.event_id, i);
    }
    w.events.push(ev.clone());
    Some(ev)
}

/// As the cloud answers a sync request: every event from `from` on, with
/// its original id and body, then a checkpoint.
async fn resend(
    cloud: &AsyncClient,
    world: &Shared,
    from: u64,
    signer: &mut lockhub::sim::cloud::Cloud,
) {
    let events: Vec<SignedEvent> = {
        let mut w = world.lock().unwrap();
        let skip = (from.saturating_sub(1) as usize).min(w.events.len());
        let out: Vec<SignedEvent> = w.events[skip..].to_vec();
        w.resent += out.len();
        out
    };
    for e in &events {
        publish(cloud, e).await;
    }
    let cp = signer.checkpoint();
    {
        let mut w = world.lock().unwrap();
        w.kinds.insert(cp.event_id, Kind::Checkpoint);
        w.checkpoints += 1;
    }
    publish(cloud, &cp).await;
}

/// Everything the checks look at has come to rest.
fn converged(hub: &Hub, world: &Shared, head: u64) -> bool {
    let Some(db) = hub.reader() else {
        return false;
    };
    let q = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap_or(-1);
    if q("SELECT watermark FROM seq_state") != head as i64
        || q("SELECT count(*) FROM outbox WHERE sent_at IS NULL") != 0
        || q("SELECT count(*) FROM held_results") != 0
    {
        return false;
    }
    let w = world.lock().unwrap();
    let all_answered = w
        .kinds
        .iter()
        .filter(|(_, k)| **k != Kind::Checkpoint)
        .all(|(id, _)| w.result_heard(id).is_some());
    let audit_ids: Vec<String> = db
        .prepare("SELECT audit_id FROM audit")
        .and_then(|mut s| {
            s.query_map([], |r| r.get(0))?
                .collect::<Result<Vec<String>, _>>()
        })
        .unwrap_or_default();
    let alerts_told = alert_rows(&db)
        .iter()
        .all(|(id, _, _, state)| last_alert_state(&w, id).as_deref() == Some(state.as_str()));
    let stale_clear = q("SELECT count(*) FROM alerts WHERE state = 'raised'") == 0;
    all_answered
        && audit_ids.iter().all(|id| w.audit.contains_key(id))
        && alerts_told
        && stale_clear
}

fn alert_rows(db: &Connection) -> Vec<(String, String, String, String)> {
    db.prepare("SELECT alert_id, condition, subject, state FROM alerts ORDER BY condition, subject")
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap_or_default()
}

fn last_alert_state(w: &World, alert_id: &str) -> Option<String> {
    w.alerts
        .iter()
        .rev()
        .find(|a| a["alert_id"] == alert_id)
        .and_then(|a| a["state"].as_str().map(str::to_owned))
}

/// Every event applied once and answered consistently; W reached the head;
/// each key activated once, revoked at most once.
fn check_events(db: &Connection, w: &World, head: u64, out: &mut Vec<String>) {
    let q = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap_or(-1);
    let w_db = q("SELECT watermark FROM seq_state");
    if w_db != head as i64 {
        out.push(format!("watermark {w_db}, cloud head {head}"));
    }
    if w.bad_envelopes > 0 {
        out.push(format!(
            "{} hub messages failed their signature check",
            w.bad_envelopes
        ));
    }
    let dedupe: HashSet<String> = db
        .prepare("SELECT event_id FROM dedupe")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .unwrap_or_default();
    for (id, kind) in &w.kinds {
        if !dedupe.contains(&id.to_string()) && *kind != Kind::Checkpoint {
            out.push(format!("event {id} ({kind:?}) has no dedupe row"));
            continue;
        }
        if *kind == Kind::Checkpoint {
            continue;
        }
        let Some(first) = w.result_heard(id) else {
            out.push(format!("event {id} ({kind:?}) was never answered"));
            continue;
        };
        let firsts: HashSet<(String, String)> = w.results[id]
            .iter()
            .filter(|r| r["duplicate"] == false)
            .map(|r| (r["outcome"].to_string(), r["reason"].to_string()))
            .collect();
        if firsts.len() > 1 {
            out.push(format!(
                "event {id} got different first answers: {firsts:?}"
            ));
        }
        let outcome = first["outcome"].as_str().unwrap_or_default();
        let reason = first["reason"].as_str().unwrap_or_default();
        let fine = match kind {
            Kind::Issue => outcome == "applied" || (outcome == "rejected" && reason == "revoked"),
            Kind::Revoke => outcome == "applied",
            Kind::Erase => outcome == "applied" || outcome == "noop",
            Kind::Checkpoint => true,
        };
        if !fine {
            out.push(format!("event {id} ({kind:?}): {outcome} {reason}"));
        }
    }
    let mut activated: HashMap<String, i64> = HashMap::new();
    let mut revoked: HashMap<String, i64> = HashMap::new();
    if let Ok(mut s) =
        db.prepare("SELECT key_id, kind FROM audit WHERE kind IN ('key.activated', 'key.revoked')")
    {
        let rows = s
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map(|it| it.filter_map(Result::ok).collect::<Vec<_>>())
            .unwrap_or_default();
        for (key, kind) in rows {
            *if kind == "key.activated" {
                activated.entry(key)
            } else {
                revoked.entry(key)
            }
            .or_default() += 1;
        }
    }
    for (id, i) in &w.key_of {
        let key = &w.keys[*i].key_id;
        match w.kinds[id] {
            Kind::Issue if w.applied(id) => {
                let n = activated.get(key).copied().unwrap_or(0);
                if n != 1 {
                    out.push(format!("key {key} activated {n} times"));
                }
            }
            Kind::Revoke => {
                let n = revoked.get(key).copied().unwrap_or(0);
                if n > 1 {
                    out.push(format!("key {key} revoked {n} times"));
                }
            }
            _ => {}
        }
    }
}

struct DoorFigures {
    rows: usize,
    opened: usize,
    denied: usize,
}

/// Every answered entry has exactly one decision row at its door in its
/// time window, of the matching kind; an unanswered one at most one; no
/// decision row outside every entry's window; no unknown or revoked PIN
/// ever opened a door, and every live key's PIN did.
fn check_doors(
    db: &Connection,
    entries: &[Entry],
    spawns: &[Timestamp],
    out: &mut Vec<String>,
) -> DoorFigures {
    // How long after the daemon's last (re)start an entry was typed.
    let since_spawn = |at: Timestamp| {
        spawns
            .iter()
            .rev()
            .find(|s| s.0 <= at.0)
            .map_or(-1, |s| (at.0 - s.0) / 1000)
    };
    let rows: Vec<(i64, String, String)> = db
        .prepare(
            "SELECT at, door, kind FROM audit
              WHERE kind IN ('door.granted', 'door.denied', 'door.locked_out') ORDER BY at",
        )
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap_or_default();
    let mut used = vec![false; rows.len()];
    let mut figures = DoorFigures {
        rows: rows.len(),
        opened: 0,
        denied: 0,
    };
    for (n, e) in entries.iter().enumerate() {
        let from = e.at.0;
        let to = entries.get(n + 1).map_or(i64::MAX, |next| next.at.0);
        let door = fixture::door_name(usize::from(e.door));
        let mine: Vec<usize> = (0..rows.len())
            .filter(|i| rows[*i].0 >= from && rows[*i].0 < to && rows[*i].1 == door)
            .collect();
        for i in &mine {
            used[*i] = true;
        }
        let want_kind = match e.answer {
            Answer::Unlock => Some("door.granted"),
            Answer::Deny => Some("door.denied"),
            Answer::None => None,
        };
        match (want_kind, mine.len()) {
            (Some(k), 1) if rows[mine[0]].2 == k => {}
            (None, 0 | 1) => {}
            (_, count) => out.push(format!(
                "entry {n} at door {door} ({:?}, answered {:?}): {count} decision rows ({} ms after the daemon's last start)",
                e.expect,
                e.answer,
                since_spawn(e.at)
            )),
        }
        match (e.expect, e.answer) {
            (Expect::Unknown | Expect::Revoked, Answer::Unlock) => out.push(format!(
                "entry {n}: a {:?} PIN opened door {door}",
                e.expect
            )),
            (Expect::Open, Answer::Deny) => out.push(format!(
                "entry {n}: a live key's PIN was denied at door {door}"
            )),
            _ => {}
        }
        match e.answer {
            Answer::Unlock => figures.opened += 1,
            Answer::Deny => figures.denied += 1,
            Answer::None => {}
        }
    }
    let first_entry = entries.first().map_or(i64::MAX, |e| e.at.0);
    let stray = (0..rows.len())
        .filter(|i| !used[*i] && rows[*i].0 >= first_entry)
        .count();
    if stray > 0 {
        out.push(format!("{stray} decision rows match no typed entry"));
    }
    figures
}

/// Alerts: the last state the cloud heard for each alert is the state in the
/// database, and nothing is left raised once every condition has ended.
fn check_alerts(db: &Connection, w: &World, out: &mut Vec<String>) -> String {
    let mut summary = BTreeMap::new();
    for (id, condition, subject, state) in alert_rows(db) {
        match last_alert_state(w, &id) {
            Some(s) if s == state => {}
            heard => out.push(format!(
                "alert {condition}/{subject} is {state} but the cloud last heard {heard:?}"
            )),
        }
        if state == "raised" {
            out.push(format!(
                "alert {condition}/{subject} still raised after its condition ended"
            ));
        }
        *summary.entry(format!("{condition} {state}")).or_insert(0) += 1;
    }
    let raised_heard: BTreeMap<String, usize> = w
        .alerts
        .iter()
        .filter(|a| a["state"] == "raised")
        .fold(BTreeMap::new(), |mut m, a| {
            *m.entry(a["condition"].as_str().unwrap_or("?").to_owned())
                .or_insert(0) += 1;
            m
        });
    format!("{summary:?}; raised messages by condition {raised_heard:?}")
}

/// Nothing unsent or held; every audit row heard by the cloud, with one
/// body per audit id.
fn check_outbox(db: &Connection, w: &World, out: &mut Vec<String>) -> usize {
    let q = |sql: &str| db.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap_or(-1);
    let unsent = q("SELECT count(*) FROM outbox WHERE sent_at IS NULL");
    if unsent != 0 {
        out.push(format!("{unsent} outbox rows left unsent"));
    }
    let held = q("SELECT count(*) FROM held_results");
    if held != 0 {
        out.push(format!("{held} erasure results still held"));
    }
    let ids: Vec<String> = db
        .prepare("SELECT audit_id FROM audit")
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .unwrap_or_default();
    let missing = ids.iter().filter(|id| !w.audit.contains_key(*id)).count();
    if missing > 0 {
        out.push(format!(
            "{missing} of {} audit rows never reached the cloud",
            ids.len()
        ));
    }
    let rewritten = w.audit.values().filter(|b| b.len() > 1).count();
    if rewritten > 0 {
        out.push(format!(
            "{rewritten} audit ids arrived with different bodies"
        ));
    }
    ids.len()
}

/// No byte of an erased guest's name in the database file, WAL or journal.
fn check_erased(db: &Path, w: &World, out: &mut Vec<String>) -> usize {
    let files: Vec<Vec<u8>> = ["", "-wal", "-journal"]
        .iter()
        .filter_map(|s| {
            let mut p = db.as_os_str().to_owned();
            p.push(s);
            std::fs::read(PathBuf::from(p)).ok()
        })
        .collect();
    let mut n = 0;
    for k in w.keys.iter().filter(|k| k.erase.is_some()) {
        n += 1;
        let needle = k.name.as_bytes();
        if files
            .iter()
            .any(|f| f.windows(needle.len()).any(|win| win == needle))
        {
            out.push(format!(
                "the erased name of {} is still in a file",
                k.holder
            ));
        }
    }
    n
}
