//! The fleet benchmark (BENCHMARKS.md 'A fleet of hubs'; not in CI):
//! N real `lockhub run` processes (release build, each its own config and
//! database) on one Mosquitto on loopback, and a simulated cloud.
//!
//! 1. Every hub comes online and applies 3 events.
//! 2. The broker is restarted (SIGTERM, persistence kept): how long until
//!    every hub is online again, and the peak connects per second the
//!    broker logged.
//! 3. The cloud "loses" 2 events per hub and then sends every hub a
//!    checkpoint at once: each hub asks (`behind_checkpoint`), the cloud
//!    answers each request with the missing events and a checkpoint. How
//!    long until every hub has applied them, and the peak sync requests
//!    per second.
//! 4. Each hub's RSS and CPU time, and the broker's.
//!
//! `cargo bench --bench fleet -- 50` (the argument is N). It stops by
//! itself: every wait has a deadline, and the hubs and broker are ended on
//! the way out.

use lockhub::sim::cloud::Cloud;
use lockhub_proto::crypto;
use lockhub_proto::sign::{GrantSpec, SignedEvent};
use lockhub_proto::topics::{self, Leaf};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};
use testkit::broker::{BrokerOptions, Mosquitto};
use testkit::daemon::Daemon;
use testkit::files::{HubToml, secrets_toml, trust_signer, write_private};
use uuid::Uuid;

const SITE: Uuid = Uuid::from_u128(0x6f1c_1c0e_8a51_4d39_9d2e_6a3c_5a7d_9e10);
const SIGNER: &str = "cloud-fleet";
const CLOUD_SEED: [u8; 32] = [7; 32];
const PIN_KEY: [u8; 32] = [5; 32];
const DEADLINE: Duration = Duration::from_secs(300);
static HOLD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn hub_id(i: usize) -> String {
    format!("hub-{i:04}")
}

/// Connects per whole second (the log's timestamps) since `since` (Unix s).
fn connects_per_second(broker: &Mosquitto, since: u64) -> BTreeMap<u64, usize> {
    let mut m = BTreeMap::new();
    for l in broker
        .log()
        .lines()
        .filter(|l| l.contains("New client connected"))
    {
        if let Some(t) = l
            .split(':')
            .next()
            .and_then(|t| t.trim().parse::<u64>().ok())
            && t >= since
        {
            *m.entry(t).or_insert(0) += 1;
        }
    }
    m
}

/// A hub left running (a failed wait panics) is killed on the way out
/// (testkit's daemon is, on Drop): the benchmark stops by itself, whatever
/// happens.
fn start_hub(i: usize, port: u16) -> Daemon {
    let dir = tempfile::tempdir().unwrap();
    let public = ed25519_dalek::SigningKey::from_bytes(&CLOUD_SEED).verifying_key();
    HubToml {
        site_id: SITE.to_string(),
        hub_id: hub_id(i),
        data_dir: "data".into(),
        mqtt_url: format!("mqtt://127.0.0.1:{port}"),
        mqtt_extra: String::new(),
        trust: trust_signer(SIGNER, &public),
        serial: vec![(
            "board-a".into(),
            format!("{}/no-board", dir.path().display()),
        )],
        insecure_serials: true,
        doors: vec![("d0".into(), "board-a".into(), 0, 3000)],
        policy: String::new(),
        extra: String::new(),
    }
    .write(dir.path());
    let seed = hub_seed(i);
    write_private(
        &dir.path().join("secrets.toml"),
        &secrets_toml(&seed, &[("k1", &PIN_KEY)], ""),
    )
    .unwrap();
    let mut hub = Daemon::at(dir);
    hub.set_log_filter("warn");
    hub.spawn();
    hub
}

/// (RSS bytes, CPU seconds) of a process, from /proc.
fn usage(pid: u32) -> Option<(u64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?
        * 1024;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split(' ').collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some((rss, ticks as f64 / 100.0))
}

fn grant(hub: usize, n: usize) -> GrantSpec {
    let pin = format!("{:06}", 100_000 + n);
    GrantSpec::active(
        &format!("k-{hub}-{n}"),
        &format!("c-{hub}-{n}"),
        "d0",
        &pin,
        ("k1", &PIN_KEY),
    )
}

enum Heard {
    Online(usize),
    Result(usize, String),
    /// (hub, from_seq, reason)
    Sync(usize, u64, String),
}

/// Hub `i`'s key seed (its secrets file).
fn hub_seed(i: usize) -> [u8; 32] {
    let mut seed = [11u8; 32];
    seed[..8].copy_from_slice(&(i as u64).to_le_bytes());
    seed
}

fn parse(topic: &str, payload: &[u8]) -> Option<Heard> {
    let t = topics::parse_topic(topics::DEFAULT_PREFIX, topic).ok()?;
    let i: usize = t.hub_id.strip_prefix("hub-")?.parse().ok()?;
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    // What the cloud does with every hub message: the signature first.
    let body = || -> Option<serde_json::Value> {
        let key = ed25519_dalek::SigningKey::from_bytes(&hub_seed(i)).verifying_key();
        let b = crypto::open_hub_envelope(payload, t.hub_id, &key).ok()?;
        serde_json::from_slice(&b).ok()
    };
    match t.leaf {
        Leaf::Status if v["state"] == "online" => Some(Heard::Online(i)),
        Leaf::Results => Some(Heard::Result(i, body()?["event_id"].as_str()?.to_owned())),
        Leaf::Sync => {
            let b = body()?;
            Some(Heard::Sync(
                i,
                b["from_seq"].as_u64()?,
                b["reason"].as_str()?.to_owned(),
            ))
        }
        _ => None,
    }
}

fn peak(bins: &BTreeMap<u64, usize>) -> usize {
    bins.values().copied().max().unwrap_or(0)
}

fn main() {
    // `N` hubs; `--hold S` keeps the fleet up S more seconds at the end (at
    // most 600) for looking at it by hand, e.g. with docs/fleet-status.py.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(50);
    let hold = args
        .iter()
        .position(|a| a == "--hold")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(0, |s| s.min(600));
    HOLD.store(hold, std::sync::atomic::Ordering::Relaxed);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(n));
}

type Rx = tokio::sync::mpsc::UnboundedReceiver<(Instant, Heard)>;

/// Feeds what the cloud hears to `on` until it says done; publishes what
/// it returns (the cloud's answers). Bounded by [`DEADLINE`].
async fn until(
    what: &str,
    rx: &mut Rx,
    client: &AsyncClient,
    mut on: impl FnMut(Instant, Heard) -> (bool, Vec<(usize, SignedEvent)>),
) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let Ok(Some((t, h))) = tokio::time::timeout_at(deadline, rx.recv()).await else {
            panic!("fleet: timed out waiting for {what}");
        };
        let (done, answers) = on(t, h);
        for (i, e) in answers {
            publish(client, i, &e).await;
        }
        if done {
            return;
        }
    }
}

async fn publish(c: &AsyncClient, i: usize, e: &SignedEvent) {
    c.publish(
        topics::topic(topics::DEFAULT_PREFIX, SITE, &hub_id(i), Leaf::Events),
        QoS::AtLeastOnce,
        false,
        e.envelope.clone(),
    )
    .await
    .unwrap()
}

/// Lets the fleet go quiet for `d`, answering any sync request with a
/// checkpoint as the cloud would (so no hub is left repeating one into the
/// next phase's counts).
async fn settle(rx: &mut Rx, client: &AsyncClient, clouds: &mut [Cloud], d: Duration) {
    let end = tokio::time::Instant::now() + d;
    while let Ok(Some((_, h))) = tokio::time::timeout_at(end, rx.recv()).await {
        if let Heard::Sync(i, ..) = h {
            publish(client, i, &clouds[i].checkpoint()).await;
        }
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Sync requests per second and per 100 ms, counted from `from`, and by reason.
fn sync_figures(prefix: &str, at: &[(Instant, String)], from: Instant) {
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, r) in at {
        *reasons.entry(r.as_str()).or_insert(0) += 1;
    }
    println!("{prefix}.sync_reasons {reasons:?}");
    let at: Vec<Instant> = at.iter().map(|(t, _)| *t).collect();
    let mut per_s: BTreeMap<u64, usize> = BTreeMap::new();
    let mut per_100ms: BTreeMap<u64, usize> = BTreeMap::new();
    for t in &at {
        let d = t.saturating_duration_since(from);
        *per_s.entry(d.as_secs()).or_insert(0) += 1;
        *per_100ms.entry(d.as_millis() as u64 / 100).or_insert(0) += 1;
    }
    println!("{prefix}.sync_requests {}", at.len());
    println!("{prefix}.peak_sync_per_s {}", peak(&per_s));
    println!("{prefix}.peak_sync_per_100ms {}", peak(&per_100ms));
    println!(
        "{prefix}.sync_by_second {:?}",
        (0..=per_s.keys().max().copied().unwrap_or(0))
            .map(|k| per_s.get(&k).copied().unwrap_or(0))
            .collect::<Vec<_>>()
    );
}

/// Restarts the broker (`lose_sessions`: its persistence file removed
/// while it is down, as after a broker that keeps none) and reports how
/// the fleet comes back: every hub online again, connects per second, and
/// the sync requests (answered with a checkpoint, as the cloud does).
async fn restart(
    name: &str,
    n: usize,
    broker: &mut Mosquitto,
    rx: &mut Rx,
    client: &AsyncClient,
    clouds: &mut [Cloud],
    lose_sessions: bool,
) {
    settle(rx, client, clouds, Duration::from_secs(5)).await;
    broker.stop();
    if lose_sessions {
        let _ = std::fs::remove_file(broker.folder().join("data/mosquitto.db"));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let since = unix_now();
    let t0 = Instant::now();
    broker.start_again();
    let mut back: HashMap<usize, Instant> = HashMap::new();
    let mut asked: HashSet<usize> = HashSet::new();
    let mut sync_at: Vec<(Instant, String)> = Vec::new();
    until(&format!("{name}: every hub back"), rx, client, |t, h| {
        let mut answers = vec![];
        match h {
            Heard::Online(i) => {
                back.entry(i).or_insert(t);
            }
            Heard::Sync(i, _, reason) => {
                sync_at.push((t, reason));
                asked.insert(i);
                answers.push((i, clouds[i].checkpoint()));
            }
            Heard::Result(..) => {}
        }
        // With sessions lost, "back" means asked and answered too.
        let done = back.len() == n && (!lose_sessions || asked.len() == n);
        (done, answers)
    })
    .await;
    let all_back = back.values().max().unwrap().duration_since(t0);
    // Late requests (repeats before the checkpoint landed) still count.
    let t_end = Instant::now() + Duration::from_secs(3);
    while let Ok(Some((t, h))) = tokio::time::timeout_at(t_end.into(), rx.recv()).await {
        if let Heard::Sync(i, _, reason) = h {
            sync_at.push((t, reason));
            publish(client, i, &clouds[i].checkpoint()).await;
        }
    }
    let connects = connects_per_second(broker, since);
    println!("fleet.{name}.all_online_s {:.2}", all_back.as_secs_f64());
    println!(
        "fleet.{name}.connects_total {}",
        connects.values().sum::<usize>()
    );
    println!("fleet.{name}.peak_connects_per_s {}", peak(&connects));
    println!(
        "fleet.{name}.connects_by_second {:?}",
        connects.values().collect::<Vec<_>>()
    );
    sync_figures(&format!("fleet.{name}"), &sync_at, t0);
}

async fn run(n: usize) {
    let mut broker = Mosquitto::start_with(BrokerOptions {
        max_queued_messages: Some(10_000),
        default_autosave: true,
        ..BrokerOptions::default()
    });
    let key = ed25519_dalek::SigningKey::from_bytes(&CLOUD_SEED);
    let mut clouds: Vec<Cloud> = (0..n)
        .map(|i| Cloud::new(key.clone(), SIGNER, SITE, &hub_id(i)))
        .collect();

    let mut o = MqttOptions::new("fleet-cloud", "127.0.0.1", broker.port);
    o.set_clean_session(false)
        .set_keep_alive(Duration::from_secs(30))
        .set_inflight(1000)
        .set_max_packet_size(1 << 20, 1 << 20);
    let (client, mut el) = AsyncClient::new(o, 10_000);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Heard)>();
    let sub = client.clone();
    let poller = tokio::spawn(async move {
        loop {
            match el.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    let _ = sub.try_subscribe(format!("lockhub/v1/{SITE}/+/+"), QoS::AtLeastOnce);
                }
                // A redelivery (DUP) after the broker restart is the
                // broker's replay of something already counted.
                Ok(Event::Incoming(Packet::Publish(p))) if !p.dup => {
                    if let Some(h) = parse(&p.topic, &p.payload) {
                        let _ = tx.send((Instant::now(), h));
                    }
                }
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    // 1. Online (each first start asks fresh_session: answered), 3 events each.
    let t_spawn = Instant::now();
    let mut hubs: Vec<Daemon> = (0..n).map(|i| start_hub(i, broker.port)).collect();
    let mut online: HashSet<usize> = HashSet::new();
    until("every hub online", &mut rx, &client, |_, h| match h {
        Heard::Online(i) => {
            online.insert(i);
            (online.len() == n, vec![])
        }
        Heard::Sync(i, ..) => (false, vec![(i, clouds[i].checkpoint())]),
        Heard::Result(..) => (false, vec![]),
    })
    .await;
    println!("fleet.hubs {n}");
    println!(
        "fleet.start.all_online_s {:.2}",
        t_spawn.elapsed().as_secs_f64()
    );
    let mut want: HashSet<(usize, String)> = HashSet::new();
    for (i, c) in clouds.iter_mut().enumerate() {
        for k in 0..3 {
            let e = c.key_issued(&grant(i, k), &[]);
            want.insert((i, e.event_id.to_string()));
            publish(&client, i, &e).await;
        }
    }
    until("the first results", &mut rx, &client, |_, h| match h {
        Heard::Result(i, id) => {
            want.remove(&(i, id));
            (want.is_empty(), vec![])
        }
        Heard::Sync(i, ..) => (false, vec![(i, clouds[i].checkpoint())]),
        Heard::Online(_) => (false, vec![]),
    })
    .await;

    // 2. Broker restarts: sessions kept, then sessions lost.
    restart(
        "restart",
        n,
        &mut broker,
        &mut rx,
        &client,
        &mut clouds,
        false,
    )
    .await;
    restart(
        "restart_fresh",
        n,
        &mut broker,
        &mut rx,
        &client,
        &mut clouds,
        true,
    )
    .await;

    // 3. Lost events, then a checkpoint to every hub at once.
    settle(&mut rx, &client, &mut clouds, Duration::from_secs(5)).await;
    let mut missing: Vec<Vec<SignedEvent>> = Vec::new();
    let mut want: HashSet<(usize, String)> = HashSet::new();
    for (i, c) in clouds.iter_mut().enumerate() {
        let lost: Vec<SignedEvent> = (3..5).map(|k| c.key_issued(&grant(i, k), &[])).collect();
        for e in &lost {
            want.insert((i, e.event_id.to_string()));
        }
        missing.push(lost);
    }
    let t_cp = Instant::now();
    for (i, c) in clouds.iter_mut().enumerate() {
        let cp = c.checkpoint();
        publish(&client, i, &cp).await;
    }
    let mut sync_at: Vec<(Instant, String)> = Vec::new();
    until("every hub caught up", &mut rx, &client, |t, h| match h {
        Heard::Result(i, id) => {
            want.remove(&(i, id));
            (want.is_empty(), vec![])
        }
        Heard::Sync(i, from, reason) => {
            sync_at.push((t, reason));
            let mut answers: Vec<(usize, SignedEvent)> = missing[i]
                .iter()
                .filter(|e| e.seq.is_some_and(|q| q >= from))
                .map(|e| (i, e.clone()))
                .collect();
            answers.push((i, clouds[i].checkpoint()));
            (false, answers)
        }
        Heard::Online(_) => (false, vec![]),
    })
    .await;
    println!(
        "fleet.checkpoint.caught_up_s {:.2}",
        t_cp.elapsed().as_secs_f64()
    );
    sync_figures("fleet.checkpoint", &sync_at, t_cp);
    // 4. Resources.
    let mut rss: Vec<u64> = vec![];
    let mut cpu: Vec<f64> = vec![];
    for h in &hubs {
        if let Some((r, c)) = usage(h.pid()) {
            rss.push(r);
            cpu.push(c);
        }
    }
    rss.sort_unstable();
    cpu.sort_by(|a, b| a.total_cmp(b));
    let wall = t_spawn.elapsed().as_secs_f64();
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!(
        "fleet.hub.rss_mib min {:.1} median {:.1} max {:.1}",
        mib(rss[0]),
        mib(rss[rss.len() / 2]),
        mib(*rss.last().unwrap())
    );
    println!(
        "fleet.hub.cpu_s min {:.2} median {:.2} max {:.2} (over {wall:.0} s wall)",
        cpu[0],
        cpu[cpu.len() / 2],
        cpu.last().unwrap()
    );
    if let Some((r, c)) = broker.pid().and_then(usage) {
        println!(
            "fleet.broker rss_mib {:.1} cpu_s {c:.2} (since its restart)",
            mib(r)
        );
    }
    let hold = HOLD.load(std::sync::atomic::Ordering::Relaxed);
    if hold > 0 {
        println!(
            "fleet: holding {hold} s; broker on 127.0.0.1:{}",
            broker.port
        );
        tokio::time::sleep(Duration::from_secs(hold)).await;
    }
    poller.abort();
    for h in &mut hubs {
        h.sigterm_within(Duration::from_secs(10));
    }
}
