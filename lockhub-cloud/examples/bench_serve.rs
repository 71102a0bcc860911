//! What `lockhub-cloud serve` does per second, against a real Mosquitto on
//! loopback (BENCHMARKS.md '`lockhub-cloud serve`'; not in CI).
//!
//! One cloud database (a temporary folder), `--hubs` hubs registered with
//! their public keys, and `serve` run in this process on its own runtime
//! (the CLI's: two workers), with its default settings but for the
//! checkpoint interval (an hour, so no round of checkpoints lands inside a
//! measurement) and the database poll (`--poll-ms`).
//!
//! 1. **sign**: `--behind` `key.issued` events per hub signed and stored
//!    (`ops::grant`, as `lockhub-cloud issue` does: one transaction each),
//!    round robin over the hubs, with `serve` not running.
//! 2. **publish**: `serve` starts and publishes that backlog: start → every
//!    event marked published (only the broker's PUBACK does that). No hub
//!    is connected yet, so the broker drops them: the hubs are now
//!    `--behind` events behind, as after a broker that lost every session.
//! 3. **sync**: `--hubs` light MQTT clients (not daemons) connect with
//!    persistent sessions, each as its hub, and subscribe to their events
//!    topic. Once all are subscribed, each sends a signed sync request from
//!    seq 1 (`fresh_session`, after a delay in `[0, --jitter-ms]`; a real
//!    hub's is 1 s) and repeats it as a hub does (1 s, doubling) until it
//!    has every seq up to its head and a checkpoint at that head. Every
//!    message is verified (lockhub-proto's step 1 and the body parser); a
//!    message that fails stops the run. Figure: start → the last hub caught
//!    up.
//! 4. **live**: with every hub connected and `serve` running, `--live`
//!    more events are signed (round robin) and published: first signature
//!    → every one marked published, and → every hub has verified its own.
//!
//! ```text
//! cargo run --release -p lockhub-cloud --example bench_serve -- \
//!     [--hubs 1000] [--behind 10] [--live 2000] [--jitter-ms 0] \
//!     [--poll-ms 100] [--inflight 20] [--max-queued 100000] [--deadline-s 120]
//! ```
//! Every wait has a deadline; the broker and the hubs end with the run.

use ed25519_dalek::SigningKey;
use lockhub_cloud::mqtt::BrokerSettings;
use lockhub_cloud::ops::{self, NewHub};
use lockhub_cloud::request::{GrantCommand, GrantRequest, Pin};
use lockhub_cloud::serve::{self, Counters, ServeSettings};
use lockhub_cloud::signer;
use lockhub_cloud::store::{HubRef, PinKey, SqliteStore, Store};
use lockhub_proto::crypto::{b64u_encode, hub_envelope};
use lockhub_proto::event::{EventKind, SchemaContext, parse_body};
use lockhub_proto::outputs::{SyncReason, SyncRequest};
use lockhub_proto::time::Timestamp;
use lockhub_proto::topics::{Leaf, topic};
use lockhub_proto::verify::{Signer, VerifyContext, verify_envelope};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use testkit::broker::{BrokerOptions, Mosquitto};
use uuid::Uuid;

const SITE: Uuid = Uuid::from_u128(0x6f1c_1c0e_8a51_4d39_9d2e_6a3c_5a7d_9e10);
const PREFIX: &str = "lockhub/v1";
const DOOR: &str = "101";
const PIN_KEY: &str = "k1";
/// A hub's sync backoff (docs/protocol/mqtt.md 'Seq, gaps, staleness').
const SYNC_BACKOFF_START: Duration = Duration::from_secs(1);
const SYNC_BACKOFF_MAX: Duration = Duration::from_secs(300);

struct Args {
    hubs: usize,
    behind: usize,
    live: usize,
    jitter: Duration,
    poll: Duration,
    inflight: u32,
    max_queued: u32,
    deadline: Duration,
}

fn args() -> Args {
    let mut a = Args {
        hubs: 1000,
        behind: 10,
        live: 2000,
        jitter: Duration::ZERO,
        poll: Duration::from_millis(100),
        inflight: 20,
        max_queued: 100_000,
        deadline: Duration::from_secs(120),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || -> u64 {
            it.next()
                .and_then(|v| v.replace('_', "").parse().ok())
                .unwrap_or_else(|| panic!("{flag} takes a number"))
        };
        match flag.as_str() {
            "--hubs" => a.hubs = value() as usize,
            "--behind" => a.behind = value() as usize,
            "--live" => a.live = value() as usize,
            "--jitter-ms" => a.jitter = Duration::from_millis(value()),
            "--poll-ms" => a.poll = Duration::from_millis(value().max(10)),
            "--inflight" => a.inflight = value() as u32,
            "--max-queued" => a.max_queued = value() as u32,
            "--deadline-s" => a.deadline = Duration::from_secs(value()),
            other => panic!("unknown argument {other:?} (see the example's header)"),
        }
    }
    assert!(
        a.hubs >= 1 && a.behind >= 1,
        "--hubs and --behind are at least 1"
    );
    a
}

fn hub_id(i: usize) -> String {
    format!("hub-{i:04}")
}

fn hub_ref(i: usize) -> HubRef {
    HubRef {
        site_id: SITE.to_string(),
        hub_id: hub_id(i),
    }
}

fn hub_key(i: usize) -> SigningKey {
    let mut seed = [0u8; 32];
    seed[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
    seed[31] = 0x5a;
    SigningKey::from_bytes(&seed)
}

/// CPU seconds (user + system) of this process's threads whose name starts
/// with `prefix`, or of process `pid` when `prefix` is `None`.
fn cpu_secs(pid: u32, prefix: Option<&str>) -> f64 {
    fn ticks(stat: &str) -> u64 {
        // Fields after the parenthesised name: utime and stime are the
        // 12th and 13th.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    }
    let total = match prefix {
        None => ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default()),
        Some(p) => std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|dir| {
                dir.flatten()
                    .filter(|t| {
                        std::fs::read_to_string(t.path().join("comm"))
                            .is_ok_and(|c| c.starts_with(p))
                    })
                    .map(|t| {
                        ticks(&std::fs::read_to_string(t.path().join("stat")).unwrap_or_default())
                    })
                    .sum()
            })
            .unwrap_or(0),
    };
    total as f64 / 100.0 // USER_HZ
}

/// CPU of the three parties, for "what bounds it".
#[derive(Clone, Copy)]
struct Cpu {
    serve: f64,
    hubs: f64,
    main: f64,
    broker: f64,
}

impl Cpu {
    fn now(broker: u32) -> Cpu {
        let me = std::process::id();
        Cpu {
            serve: cpu_secs(me, Some("serve")),
            hubs: cpu_secs(me, Some("hubs")),
            main: cpu_secs(me, Some("bench_serve")),
            broker: cpu_secs(broker, None),
        }
    }

    fn since(self, before: Cpu, wall: Duration) -> String {
        let w = wall.as_secs_f64().max(1e-9);
        format!(
            "CPU (share of one core): serve {:.0} %, hubs {:.0} %, signing and polling (main thread) {:.0} %, Mosquitto {:.0} %",
            100.0 * (self.serve - before.serve) / w,
            100.0 * (self.hubs - before.hubs) / w,
            100.0 * (self.main - before.main) / w,
            100.0 * (self.broker - before.broker) / w,
        )
    }
}

/// Signs and stores one `key.issued` for hub `i`, as `issue` does.
fn issue(store: &dyn Store, active: &signer::ActiveSigner, i: usize, n: usize) {
    let req = GrantRequest {
        command: GrantCommand::Issue,
        hub: hub_ref(i),
        check_in_id: Some(format!("c-{n}")),
        reservation_id: None,
        key_id: None,
        doors: vec![DOOR.into()],
        pin: Pin::parse(&format!("{:08}", (n as u64 * 7919) % 100_000_000)).expect("a PIN"),
        pin_key_id: None,
        valid_from: None,
        valid_until: "2099-01-01T00:00:00Z".into(),
        holder_ref: None,
        idempotency_key: None,
        schedule: Vec::new(),
        max_uses: None,
    };
    ops::grant(store, active, &req, Timestamp::now_system()).expect("issue");
}

/// Events not yet marked published (a partial index holds exactly these).
fn unpublished(c: &rusqlite::Connection) -> u64 {
    c.query_row(
        "SELECT count(*) FROM events WHERE published_at IS NULL",
        [],
        |r| r.get::<_, i64>(0),
    )
    .expect("count") as u64
}

/// Waits until `done` holds (checked every 20 ms), or panics at `deadline`.
fn wait(what: &str, deadline: Instant, mut done: impl FnMut() -> bool) -> Instant {
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Instant::now()
}

/// What one simulated hub has seen, read by the main thread.
#[derive(Default)]
struct HubStat {
    subscribed: AtomicBool,
    /// Every seq up to here verified.
    watermark: AtomicU64,
    /// Microseconds after the start at which it had every seq up to its
    /// head and a checkpoint at that head (0: not yet).
    caught_up_us: AtomicU64,
    sync_requests: AtomicU64,
    messages: AtomicU64,
    duplicates: AtomicU64,
    checkpoints: AtomicU64,
    /// Messages that failed verification or parsing (must stay 0).
    refused: AtomicU64,
}

/// One simulated hub: a persistent session on its own client id, its
/// events topic, and the sync requests a hub sends (docs/protocol/mqtt.md
/// 'Seq, gaps, staleness'), signed with its own key.
async fn run_hub(
    i: usize,
    port: u16,
    ring: Arc<Vec<Signer>>,
    head: u64,
    jitter: Duration,
    start: tokio::sync::watch::Receiver<Option<Instant>>,
    stat: Arc<HubStat>,
) {
    let id = hub_id(i);
    let key = hub_key(i);
    let mut o = MqttOptions::new(id.clone(), "127.0.0.1", port);
    o.set_clean_session(false)
        .set_keep_alive(Duration::from_secs(60))
        .set_max_packet_size(2 << 20, 2 << 20);
    let (client, mut eventloop) = AsyncClient::new(o, 16);
    let events = topic(PREFIX, SITE, &id, Leaf::Events);
    let sync = topic(PREFIX, SITE, &id, Leaf::Sync);
    let ctx = SchemaContext::new([DOOR], [PIN_KEY]);
    let mut watermark = 0u64;
    let mut above = BTreeSet::new();
    let mut checkpoint_head: Option<u64> = None;
    let mut confirmed = false;
    let mut started: Option<Instant> = None;
    let mut next_request: Option<tokio::time::Instant> = None;
    let mut backoff = SYNC_BACKOFF_START;
    // Each hub's own offset in [0, jitter], the same on every run.
    let offset = jitter.mul_f64(((i as u64).wrapping_mul(2654435761) % 1000) as f64 / 1000.0);
    let mut start = start;
    loop {
        let due = next_request;
        tokio::select! {
            ev = eventloop.poll() => match ev {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = client.try_subscribe(events.clone(), QoS::AtLeastOnce);
                }
                Ok(Event::Incoming(Packet::SubAck(_))) => stat.subscribed.store(true, Ordering::Relaxed),
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    stat.messages.fetch_add(1, Ordering::Relaxed);
                    let ctx1 = VerifyContext { ring: &ring, site_id: SITE, hub_id: &id, now: Timestamp::now_system() };
                    let Ok(v) = verify_envelope(&p.payload, &ctx1) else {
                        stat.refused.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    match (v.header.seq, parse_body(&v.body, &ctx)) {
                        (None, Ok(EventKind::Checkpoint { head_seq, .. })) => {
                            stat.checkpoints.fetch_add(1, Ordering::Relaxed);
                            checkpoint_head = Some(checkpoint_head.map_or(head_seq, |h| h.max(head_seq)));
                            if head_seq <= watermark {
                                confirmed = true;
                            }
                        }
                        (Some(seq), Ok(_)) => {
                            if seq <= watermark || !above.insert(seq) {
                                stat.duplicates.fetch_add(1, Ordering::Relaxed);
                            }
                            while above.remove(&(watermark + 1)) {
                                watermark += 1;
                            }
                            stat.watermark.store(watermark, Ordering::Relaxed);
                        }
                        _ => {
                            stat.refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if let Some(t0) = started
                        && confirmed
                        && watermark >= head
                        && above.is_empty()
                        && stat.caught_up_us.load(Ordering::Relaxed) == 0
                    {
                        let us = (t0.elapsed().as_micros() as u64).max(1);
                        stat.caught_up_us.store(us, Ordering::Relaxed);
                        next_request = None;
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            },
            changed = start.changed(), if started.is_none() => {
                if changed.is_err() {
                    return;
                }
                if let Some(t0) = *start.borrow() {
                    started = Some(t0);
                    next_request = Some(tokio::time::Instant::from_std(t0) + offset);
                }
            },
            _ = async { tokio::time::sleep_until(due.unwrap()).await }, if due.is_some() => {
                if stat.caught_up_us.load(Ordering::Relaxed) != 0 {
                    next_request = None;
                    continue;
                }
                // The most specific reason, from W+1 (the hub's planner).
                let reason = if !above.is_empty() {
                    SyncReason::Gap
                } else if checkpoint_head.is_some_and(|h| h > watermark) {
                    SyncReason::BehindCheckpoint
                } else {
                    SyncReason::FreshSession
                };
                let body = SyncRequest { from_seq: watermark + 1, reason }.to_json();
                if client.try_publish(sync.clone(), QoS::AtLeastOnce, false, hub_envelope(&id, &key, &body)).is_ok() {
                    stat.sync_requests.fetch_add(1, Ordering::Relaxed);
                }
                next_request = Some(tokio::time::Instant::now() + backoff);
                backoff = (backoff * 2).min(SYNC_BACKOFF_MAX);
            },
        }
    }
}

/// The disk's floor in the database's folder: 4 KiB append + `fdatasync`,
/// median and p99, in µs (each signed event and each PUBACK marked is one
/// SQLite commit, `synchronous=FULL`).
fn fsync_floor(dir: &Path) -> (f64, f64) {
    use std::io::Write;
    let path = dir.join("fsync-probe");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("probe file");
    let mut times: Vec<f64> = (0..200)
        .map(|_| {
            let t = Instant::now();
            f.write_all(&[0u8; 4096]).expect("write");
            f.sync_data().expect("fdatasync");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    drop(f);
    let _ = std::fs::remove_file(path);
    times.sort_by(f64::total_cmp);
    (percentile(&times, 0.5), percentile(&times, 0.99))
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 * q) as usize).min(sorted.len() - 1)]
}

fn main() {
    let a = args();
    let broker = Mosquitto::start_with(BrokerOptions {
        max_queued_messages: Some(a.max_queued),
        max_inflight_messages: Some(a.inflight),
        default_autosave: true,
        ..BrokerOptions::default()
    });
    let broker_pid = broker.pid().expect("the broker runs");
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("cloud.db");
    let store = SqliteStore::open(&db, true).expect("create the database");
    ops::init(&store, &db, Some("cloud-bench"), Timestamp::now_system()).expect("init");
    let active = signer::load_active(&store, &db).expect("the signer");
    for i in 0..a.hubs {
        let new = NewHub {
            hub: hub_ref(i),
            public_key: Some(b64u_encode(hub_key(i).verifying_key().as_bytes())),
            doors: vec![DOOR.into()],
            pin_keys: vec![PinKey {
                id: PIN_KEY.into(),
                secret: [i as u8; 32],
            }],
        };
        ops::add_hub(&store, &new, Timestamp::now_system()).expect("hub add");
    }
    let ring = Arc::new(vec![Signer {
        id: active.id.clone(),
        public_key: active.key.verifying_key(),
        not_after: None,
    }]);
    println!(
        "lockhub-cloud serve: {} hubs, {} events behind each, {} live events; Mosquitto on loopback \
         with max_inflight_messages {}, max_queued_messages {}; serve polls the database every {} ms; \
         sync jitter [0, {} ms]; cores: {}",
        a.hubs,
        a.behind,
        a.live,
        a.inflight,
        a.max_queued,
        a.poll.as_millis(),
        a.jitter.as_millis(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );

    let (f50, f99) = fsync_floor(dir.path());
    println!(
        "floor:   4 KiB append + fdatasync in the database's folder: median {f50:.0} µs, p99 {f99:.0} µs"
    );

    // 1. sign: the backlog, with serve stopped.
    let total = a.hubs * a.behind;
    let cpu0 = Cpu::now(broker_pid);
    let t = Instant::now();
    for n in 0..total {
        issue(&store, &active, n % a.hubs, n);
    }
    let sign = t.elapsed();
    println!(
        "sign:    {total} key.issued signed and stored (one transaction each) in {:.2} s: {:.0}/s | {}",
        sign.as_secs_f64(),
        total as f64 / sign.as_secs_f64(),
        Cpu::now(broker_pid).since(cpu0, sign)
    );

    // 2. publish: serve starts and publishes the backlog.
    let settings = ServeSettings {
        broker: BrokerSettings {
            url: broker.url(),
            topic_prefix: PREFIX.into(),
            identity: "bench-cloud".into(),
            username: None,
            password_file: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
        },
        checkpoint_every: Duration::from_secs(3600),
        poll_every: a.poll,
        idempotency_retention_days: 30,
        signer_db: None,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serve_db = db.clone();
    let cpu0 = Cpu::now(broker_pid);
    let t = Instant::now();
    // serve's loop runs on this thread (block_on, as the CLI's does), its
    // connections' tasks on the runtime's two workers: all named "serve".
    let serve_thread = std::thread::Builder::new()
        .name("serve-loop".into())
        .spawn(move || -> Counters {
            let store = SqliteStore::open(&serve_db, false).expect("open for serve");
            let active = signer::load_active(&store, &serve_db).expect("the signer");
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("serve")
                .enable_all()
                .build()
                .expect("serve's runtime");
            rt.block_on(serve::serve(&store, &active, &settings, async {
                let _ = stop_rx.await;
            }))
            .expect("serve")
        })
        .expect("serve's thread");
    let deadline = Instant::now() + a.deadline;
    let reader =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open the database read-only");
    let done = wait("the backlog published", deadline, || {
        unpublished(&reader) == 0
    });
    let publish = done - t;
    println!(
        "publish: {total} stored events published by serve (start → every PUBACK marked in the store) in {:.2} s: {:.0}/s | {}",
        publish.as_secs_f64(),
        total as f64 / publish.as_secs_f64(),
        Cpu::now(broker_pid).since(cpu0, publish)
    );

    // 3. sync: the hubs connect, subscribe, and ask.
    let hubs_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("hubs")
        .enable_all()
        .build()
        .expect("the hubs' runtime");
    let (start_tx, start_rx) = tokio::sync::watch::channel(None);
    let stats: Vec<Arc<HubStat>> = (0..a.hubs).map(|_| Arc::default()).collect();
    let heads: Vec<u64> = (0..a.hubs)
        .map(|i| store.head_seq(&hub_ref(i)).expect("head"))
        .collect();
    let t = Instant::now();
    for (i, stat) in stats.iter().enumerate() {
        hubs_rt.spawn(run_hub(
            i,
            broker.port,
            ring.clone(),
            heads[i],
            a.jitter,
            start_rx.clone(),
            stat.clone(),
        ));
    }
    let deadline = Instant::now() + a.deadline;
    let subscribed = wait("every hub subscribed", deadline, || {
        stats.iter().all(|s| s.subscribed.load(Ordering::Relaxed))
    }) - t;
    println!(
        "connect: {} hubs connected and subscribed in {:.2} s",
        a.hubs,
        subscribed.as_secs_f64()
    );
    let cpu0 = Cpu::now(broker_pid);
    let t0 = Instant::now();
    start_tx.send_replace(Some(t0));
    let deadline = Instant::now() + a.deadline;
    let done = wait("every hub caught up", deadline, || {
        stats
            .iter()
            .all(|s| s.caught_up_us.load(Ordering::Relaxed) != 0)
    });
    let sync = done - t0;
    let mut times: Vec<f64> = stats
        .iter()
        .map(|s| s.caught_up_us.load(Ordering::Relaxed) as f64 / 1e6)
        .collect();
    times.sort_by(f64::total_cmp);
    let sum = |f: fn(&HubStat) -> &AtomicU64| -> u64 {
        stats.iter().map(|s| f(s).load(Ordering::Relaxed)).sum()
    };
    let messages = sum(|s| &s.messages);
    println!(
        "sync:    {} hubs {} events behind: every hub had every event and the checkpoint {:.2} s after the start \
         (per hub: median {:.2} s, p99 {:.2} s); {} sync requests, {} messages verified ({:.0}/s, {} duplicates, {} checkpoints) | {}",
        a.hubs,
        a.behind,
        sync.as_secs_f64(),
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        sum(|s| &s.sync_requests),
        messages,
        messages as f64 / sync.as_secs_f64(),
        sum(|s| &s.duplicates),
        sum(|s| &s.checkpoints),
        Cpu::now(broker_pid).since(cpu0, sync)
    );

    // 4. live: sign while serve publishes to the connected hubs.
    if a.live > 0 {
        let cpu0 = Cpu::now(broker_pid);
        let t = Instant::now();
        for n in 0..a.live {
            issue(&store, &active, n % a.hubs, total + n);
        }
        let signed = t.elapsed();
        let deadline = Instant::now() + a.deadline;
        let published = wait("the live events published", deadline, || {
            unpublished(&reader) == 0
        }) - t;
        let heads: Vec<u64> = (0..a.hubs)
            .map(|i| store.head_seq(&hub_ref(i)).expect("head"))
            .collect();
        let received = wait("every hub verified its live events", deadline, || {
            stats
                .iter()
                .zip(&heads)
                .all(|(s, h)| s.watermark.load(Ordering::Relaxed) >= *h)
        }) - t;
        println!(
            "live:    {} key.issued signed and published while serve runs: signed in {:.2} s ({:.0}/s); \
             first signature → every PUBACK marked {:.2} s: {:.0}/s; → every hub verified its own {:.2} s | {}",
            a.live,
            signed.as_secs_f64(),
            a.live as f64 / signed.as_secs_f64(),
            published.as_secs_f64(),
            a.live as f64 / published.as_secs_f64(),
            received.as_secs_f64(),
            Cpu::now(broker_pid).since(cpu0, published)
        );
    }

    let (f50, f99) = fsync_floor(dir.path());
    println!("floor:   again, after the run: median {f50:.0} µs, p99 {f99:.0} µs");
    let refused = sum(|s| &s.refused);
    let _ = stop_tx.send(());
    let counters = serve_thread.join().expect("serve's thread");
    println!(
        "serve counted: {} published, {} sync answers, {} checkpoints, {} hub messages recorded, {} refused; hubs refused {refused}",
        counters.published,
        counters.sync_answers,
        counters.checkpoints,
        counters.recorded,
        counters.refused
    );
    hubs_rt.shutdown_timeout(Duration::from_secs(1));
    assert_eq!(refused, 0, "every message a hub received must verify");
}
