//! Door latency: a Keypad frame written on the board's side of a pty →
//! the Unlock frame read back, against the real `lockhub run` with a
//! pre-filled mirror, (a) idle and (b) while signed events are ingested at a
//! steady rate, in the same run against the same daemon.
//!
//! The board is played here at the frame level (not with `sim::board`,
//! which polls every 5 ms) so that both timestamps are taken right at the
//! write and the read. It answers the hub's Hello, Pings and Unlocks as the
//! firmware would. Only correct PINs are typed and the lockout threshold is
//! out of reach, so lockouts never interfere. Every 100th unlock, the
//! harness checks that its `door.granted` audit row was already committed.

use super::broker::{BrokerSettings, Mosquitto};
use super::daemon::{Daemon, Sampler, db_bytes, slow_disk, write_bytes};
use super::pty::{Master, Pty};
use super::report::Figure;
use super::stats::{Summary, micros, thousands};
use super::{Sizes, fixture, mqtt};
use firmware_bridge::{Downlink, FrameDecoder, MAX_FRAME, Pin, Uplink, encode_frame};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{Mutex, mpsc};

pub const IDS: &[&str] = &[
    "door.idle.median",
    "door.idle.p99",
    "door.idle.max",
    "door.load.median",
    "door.load.p99",
    "door.load.max",
    "door.load.ratio",
    "door.load.ingest_rate",
    "door.audit_before_unlock",
    "door.floor.pty",
    "door.floor.fsync",
    "door.idle.write_amp",
];

const S: &str = "door";
/// Pause between entries, which go to the doors in turn: back-to-back
/// entries would measure queueing behind our own previous entry, and each
/// door sees one entry every `DOORS × GAP` = 256 ms, within serial.md's
/// flood limit (4 a second per door; past it entries are denied unread).
const GAP: Duration = Duration::from_millis(16);

/// [`GAP`], or `LOCKHUB_BENCH_DOOR_GAP_MS`: on a slow disk one entry every
/// 16 ms writes more random pages than a card takes (see docs/performance-notes.md, "A slow disk").
fn gap() -> Duration {
    std::env::var("LOCKHUB_BENCH_DOOR_GAP_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(GAP, Duration::from_millis)
}
/// An entry with no answer by then is a failure of the run, not a sample.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// What the board read from the hub that the measurement cares about.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Unlock { door: u8, at: Instant },
    Deny { door: u8, at: Instant },
}

type Writer = Arc<Mutex<WriteHalf<Master>>>;

async fn send(w: &Writer, msg: &Uplink) -> Instant {
    let mut buf = [0u8; MAX_FRAME];
    let frame = encode_frame(msg, &mut buf).expect("uplink fits a frame");
    let mut w = w.lock().await;
    let at = Instant::now();
    w.write_all(frame).await.expect("pty write");
    at
}

/// The board's side: answers Hello, Ping, Unlock and Deny like the firmware
/// and reports each new Unlock or Deny (resends have a seq it has seen).
async fn board(
    mut r: ReadHalf<Master>,
    w: Writer,
    answers: mpsc::UnboundedSender<Answer>,
    hello: mpsc::UnboundedSender<()>,
) {
    let mut dec = FrameDecoder::<Downlink>::new();
    let mut buf = [0u8; 512];
    let mut seen: std::collections::VecDeque<u16> = std::collections::VecDeque::new();
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let at = Instant::now();
        for &b in &buf[..n] {
            let Some(Ok(msg)) = dec.push(b) else { continue };
            match msg {
                Downlink::Hello { .. } => {
                    send(
                        &w,
                        &Uplink::Hello {
                            board_id: 1,
                            fw_major: 1,
                            fw_minor: 0,
                            door_count: fixture::DOORS as u8,
                        },
                    )
                    .await;
                    let _ = hello.send(());
                }
                Downlink::Ping { nonce } => {
                    send(&w, &Uplink::Pong { nonce }).await;
                }
                Downlink::Unlock { seq, door, .. } | Downlink::Deny { seq, door, .. } => {
                    let fresh = !seen.contains(&seq);
                    if fresh {
                        seen.push_back(seq);
                        if seen.len() > 64 {
                            seen.pop_front();
                        }
                        let answer = match msg {
                            Downlink::Unlock { .. } => Answer::Unlock { door, at },
                            _ => Answer::Deny { door, at },
                        };
                        let _ = answers.send(answer);
                    }
                    send(&w, &Uplink::Ack { seq }).await;
                }
                // The plain link's bench board: the sealed link's
                // handshake, pairing and rekey messages are not for it.
                Downlink::Ack { .. }
                | Downlink::SealHello { .. }
                | Downlink::SealConfirm { .. }
                | Downlink::PairStart { .. }
                | Downlink::PairReveal { .. }
                | Downlink::RekeyStart { .. } => {}
            }
        }
    }
}

/// A small deterministic generator, so runs probe the same keys.
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

struct Phase {
    latencies: Summary,
    audit_checks: usize,
}

/// Types `entries` correct PINs of random pre-filled keys, one at a time.
/// A `Deny` for one of them stops the run, except on a slow disk
/// (`LOCKHUB_BENCH_DIR`), where it is what is being measured: there it is
/// counted, its reason printed, and the phase goes on; the phase's line on
/// stderr says how many were granted and denied, and by when.
#[allow(clippy::too_many_arguments)]
async fn phase(
    entries: usize,
    keys: usize,
    seq: &mut u16,
    rng: &mut Lcg,
    w: &Writer,
    answers: &mut mpsc::UnboundedReceiver<Answer>,
    reader: &rusqlite::Connection,
    granted_before: &mut i64,
    daemon: &Daemon,
) -> Phase {
    let mut lat = Vec::with_capacity(entries);
    let mut denied: Vec<Duration> = Vec::new();
    let mut audit_checks = 0;
    let keep_going = slow_disk();
    for k in 0..entries {
        *seq = if *seq == u16::MAX { 1 } else { *seq + 1 };
        // Doors in turn across phases (by seq), a random key of that door
        // (key `i` opens door `i % DOORS`).
        let d = usize::from(*seq) % fixture::DOORS;
        let i = d + fixture::DOORS * rng.next((keys / fixture::DOORS).max(1));
        let door = d as u8;
        let pin = Pin::from_digits(&fixture::pin_for("p", i)).expect("bench PINs are 8 digits");
        let t0 = send(
            w,
            &Uplink::Keypad {
                seq: *seq,
                door,
                pin,
            },
        )
        .await;
        let answer = tokio::time::timeout(ANSWER_TIMEOUT, answers.recv())
            .await
            .ok()
            .flatten()
            .expect("the hub answers every entry");
        match answer {
            Answer::Unlock { door: d, at } if d == door => lat.push(at - t0),
            Answer::Deny { door: d, at } if d == door && keep_going => {
                denied.push(at - t0);
                let reason: Option<String> = reader
                    .query_row(
                        "SELECT reason FROM audit WHERE kind = 'door.denied' ORDER BY seqno DESC LIMIT 1",
                        [],
                        |r| r.get(0),
                    )
                    .ok();
                eprintln!(
                    "door: entry {k} denied after {:.0} ms (last audited denial: {reason:?})",
                    (at - t0).as_secs_f64() * 1e3
                );
            }
            other => {
                // Why, from the audit (the reason only: never a PIN) and the
                // daemon's log; a denial the store could not write in time
                // is audited (`storage_failure`) only once it can be.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let reason: Option<String> = reader
                    .query_row(
                        "SELECT reason FROM audit WHERE kind = 'door.denied' ORDER BY seqno DESC LIMIT 1",
                        [],
                        |r| r.get(0),
                    )
                    .ok();
                panic!(
                    "entry {k} at door {door}: expected an Unlock, got {other:?} (last denial: {reason:?}); the daemon's log ends:\n{}",
                    daemon.log()
                )
            }
        }
        let this_granted = matches!(answer, Answer::Unlock { .. });
        if k % 100 == 0 && this_granted {
            // The Unlock has been read: its door.granted row must be committed.
            let granted: i64 = reader
                .query_row(
                    "SELECT count(*) FROM audit WHERE kind = 'door.granted'",
                    [],
                    |r| r.get(0),
                )
                .expect("count audit");
            assert!(
                granted >= *granted_before + lat.len() as i64,
                "an Unlock arrived before its audit row was committed"
            );
            audit_checks += 1;
        }
        tokio::time::sleep(gap()).await;
    }
    *granted_before += lat.len() as i64;
    let summary = Summary::from_durations(&lat);
    let ms = |us: f64| us / 1e3;
    eprintln!(
        "door phase: {} granted, {} denied (at {:?} ms); granted p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        lat.len(),
        denied.len(),
        denied.iter().map(|d| d.as_millis()).collect::<Vec<_>>(),
        ms(summary.median()),
        ms(summary.p99()),
        ms(summary.max()),
    );
    Phase {
        latencies: summary,
        audit_checks,
    }
}

/// The floor under every door figure: a Keypad-sized frame written on a
/// pty's master, read on its slave by a thread that writes it straight
/// back, and read again on the master. No hub, no decision, no disk.
async fn pty_floor(n: usize) -> Summary {
    use std::io::{Read, Write};
    let (master, slave, _path) = Pty::open().into_parts();
    let (mut r, mut w) = tokio::io::split(master);
    let echo = std::thread::spawn(move || {
        let mut f = std::fs::File::from(slave);
        let mut buf = [0u8; 64];
        while let Ok(k) = f.read(&mut buf) {
            if k == 0 || f.write_all(&buf[..k]).is_err() || buf[..k].contains(&0xff) {
                return;
            }
        }
    });
    let mut buf = [0u8; MAX_FRAME];
    let frame = encode_frame(
        &Uplink::Keypad {
            seq: 1,
            door: 0,
            pin: Pin::from_digits("12345678").expect("8 digits"),
        },
        &mut buf,
    )
    .expect("fits")
    .to_vec();
    let mut lat = Vec::with_capacity(n);
    let mut back = vec![0u8; frame.len()];
    for _ in 0..n {
        let t0 = Instant::now();
        w.write_all(&frame).await.expect("pty write");
        r.read_exact(&mut back).await.expect("pty echo");
        lat.push(t0.elapsed());
        tokio::time::sleep(GAP).await;
    }
    // A byte no frame holds (frames are COBS, zero-delimited) stops the echo.
    let _ = w.write_all(&[0xff]).await;
    let _ = echo.join();
    Summary::from_durations(&lat)
}

pub async fn run(sizes: &Sizes) -> Vec<Figure> {
    // LOCKHUB_BENCH_DOOR_ENTRIES=N: fewer entries per phase (a slow disk's
    // entries take several times longer).
    let mut sizes = sizes.clone();
    if let Some(n) = std::env::var("LOCKHUB_BENCH_DOOR_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        sizes.door_entries = n;
    }
    let sizes = &sizes;
    let floor = pty_floor(sizes.door_entries.min(1000)).await;
    let mut cloud = fixture::cloud();
    // The mirror is filled the way a hub's is, by a resync through the
    // daemon, before the load's events are signed (their seqs follow).
    let batches: Arc<Vec<Vec<u8>>> = Arc::new(
        fixture::batch_events(&mut cloud, "p", sizes.door_keys, sizes.batch_items)
            .into_iter()
            .map(|e| e.envelope)
            .collect(),
    );
    // Enough signed events to keep the load going for the whole loaded phase,
    // with a margin: the phase's entries take longer under load. (Until this
    // was sized from the phase alone, the 100,000 events of `ingest_n` ran
    // out halfway through a 5,000-entry phase, and its second half was
    // measured without load.) The check after the phase says if it happens.
    let expected_s = sizes.door_entries as f64 * (gap().as_secs_f64() + 0.002) + 5.0;
    let n_events = ((sizes.load_rate * expected_s * 1.3) as usize).max(1000);
    let payloads: Arc<Vec<Vec<u8>>> = Arc::new(
        fixture::issue_events(&mut cloud, "k", n_events)
            .into_iter()
            .map(|e| e.envelope)
            .collect(),
    );

    let broker = Mosquitto::start_with(BrokerSettings::default_window(
        (n_events + batches.len()) as u32 + 1000,
    ));
    let pty = Pty::open();
    let (master, _slave, path) = pty.into_parts();
    let (r, w) = tokio::io::split(master);
    let w: Writer = Arc::new(Mutex::new(w));
    let (atx, mut answers) = mpsc::unbounded_channel();
    let (htx, mut hello) = mpsc::unbounded_channel();
    let board_task = tokio::spawn(board(r, w.clone(), atx, htx));

    // On a slow disk (scripts/slow-disk) a resync of 100,000 keys takes
    // longer than the harness allows (~225 keys/s): the mirror is filled
    // by the same resync through the daemon on the system's disk, and the
    // daemon, stopped cleanly, is moved with its closed database onto the
    // slow disk before the door phases.
    let slow = slow_disk();
    let mut daemon = if slow {
        Daemon::start_on_fast_disk(&broker.url(), &path, fixture::NO_LOCKOUT_POLICY).await
    } else {
        Daemon::start(&broker.url(), &path, fixture::NO_LOCKOUT_POLICY, 0).await
    };
    mqtt::wait_online(broker.port, Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("the daemon never came online: {}", daemon.log()));
    tokio::time::timeout(Duration::from_secs(10), hello.recv())
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("the hub never said Hello on the pty: {}", daemon.log()));
    // Let the hub see our Hello answer before the first entry.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut reader = daemon.reader();
    let mut sampler = Sampler::start(daemon.pid(), &daemon.db_path());
    let filled = Instant::now();
    let _ = mqtt::publish_all(
        broker.port,
        mqtt::events_topic(),
        batches.clone(),
        mqtt::Pace::Flood,
    )
    .await;
    while Daemon::watermark(&reader) < batches.len() as u64 {
        assert!(
            filled.elapsed() < mqtt::PHASE_TIMEOUT,
            "the resync stalled: {}",
            daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    settle(&sampler).await;
    if slow {
        drop((reader, sampler));
        daemon = daemon.move_to_bench_dir();
        while hello.try_recv().is_ok() {}
        tokio::time::timeout(Duration::from_secs(30), hello.recv())
            .await
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("the moved hub never said Hello: {}", daemon.log()));
        mqtt::wait_online(broker.port, Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("the moved daemon never came online: {}", daemon.log()));
        tokio::time::sleep(Duration::from_millis(300)).await;
        reader = daemon.reader();
        sampler = Sampler::start(daemon.pid(), &daemon.db_path());
        settle(&sampler).await;
    }
    let mut granted = 0i64;
    let (mut seq, mut rng) = (0u16, Lcg(7));

    // Warm-up: the first entries pay for cold pages and prepared statements.
    let _ = phase(
        sizes.door_entries.min(200) / 4,
        sizes.door_keys,
        &mut seq,
        &mut rng,
        &w,
        &mut answers,
        &reader,
        &mut granted,
        &daemon,
    )
    .await;

    // The disk's floor in the daemon's own folder, just before the idle
    // phase (every entry waits for at least one such sync).
    let fsync = super::scale::fsync_floor_in(&daemon.dir, 500);
    let (bytes0, db0) = (write_bytes(daemon.pid()).unwrap_or(0), db_bytes(&reader));
    let idle = phase(
        sizes.door_entries,
        sizes.door_keys,
        &mut seq,
        &mut rng,
        &w,
        &mut answers,
        &reader,
        &mut granted,
        &daemon,
    )
    .await;

    // What the idle entries cost the disk, their checkpoint included.
    settle(&sampler).await;
    let written = write_bytes(daemon.pid())
        .unwrap_or(0)
        .saturating_sub(bytes0) as f64;
    let grew = db_bytes(&reader).saturating_sub(db0).max(1) as f64;
    let entries = idle.latencies.len().max(1) as f64;
    let w0 = Daemon::watermark(&reader);
    let load_started = Instant::now();
    let publisher = tokio::spawn(mqtt::publish_all(
        broker.port,
        mqtt::events_topic(),
        payloads.clone(),
        mqtt::Pace::PerSecond(sizes.load_rate),
    ));
    // Let the ingest reach its steady rate before measuring.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let w1 = Daemon::watermark(&reader);
    let t1 = Instant::now();
    let loaded = phase(
        sizes.door_entries,
        sizes.door_keys,
        &mut seq,
        &mut rng,
        &w,
        &mut answers,
        &reader,
        &mut granted,
        &daemon,
    )
    .await;
    let w_end = Daemon::watermark(&reader);
    let ingest_rate = (w_end - w1) as f64 / t1.elapsed().as_secs_f64();
    let load_ran = load_started.elapsed();
    // The load ran out if the hub had committed every event before the
    // phase ended. (All of them published is not enough: on a slow disk the
    // broker holds a backlog the hub is still working through.)
    let load_ran_out = publisher.is_finished() && w_end >= w0 + n_events as u64;
    if load_ran_out {
        eprintln!(
            "   [LOAD RAN OUT: the hub had committed all {n_events} events before the loaded \
             phase ended; its figures are partly unloaded]"
        );
    }
    publisher.abort();
    drop(reader);
    daemon.stop();
    board_task.abort();

    let (i, l) = (&idle.latencies, &loaded.latencies);
    let ratio = l.p99() / i.p99();
    let what = |which: &str, stat: &str| {
        format!(
            "Keypad written → Unlock read over a pty, {which}, {} keys (filled by a resync), {} entries: {stat}",
            thousands(sizes.door_keys as f64),
            thousands(i.len() as f64)
        )
    };
    let load_desc = format!(
        "while ~{} signed events/s are ingested{}",
        thousands(sizes.load_rate),
        if load_ran_out {
            " (LOAD RAN OUT before the phase ended)"
        } else {
            ""
        }
    );
    vec![
        Figure::new(
            "door.idle.median",
            S,
            &what("idle", "median"),
            micros(i.median()),
        ),
        Figure::new("door.idle.p99", S, &what("idle", "p99"), micros(i.p99()))
            .target("< 5 ms", i.p99() < 5000.0),
        Figure::new("door.idle.max", S, &what("idle", "max"), micros(i.max())),
        Figure::new(
            "door.load.median",
            S,
            &what(&load_desc, "median"),
            micros(l.median()),
        ),
        Figure::new(
            "door.load.p99",
            S,
            &what(&load_desc, "p99"),
            micros(l.p99()),
        )
        .target("< 5 ms", l.p99() < 5000.0),
        Figure::new(
            "door.load.max",
            S,
            &what(&load_desc, "max"),
            micros(l.max()),
        ),
        Figure::new(
            "door.load.ratio",
            S,
            "loaded p99 / idle p99 (same run, same daemon)",
            format!("{ratio:.2}×"),
        )
        .target("≤ 3×", ratio <= 3.0),
        Figure::new(
            "door.load.ingest_rate",
            S,
            &format!(
                "events/s the daemon actually committed during the loaded phase ({:.0} s of load)",
                load_ran.as_secs_f64()
            ),
            format!("{}/s", thousands(ingest_rate)),
        ),
        Figure::new(
            "door.floor.pty",
            S,
            "the floor: a Keypad frame written on a pty and echoed back by a thread, no hub: median (p99)",
            format!(
                "{} ({})",
                micros(floor.median()),
                micros(floor.p99())
            ),
        ),
        Figure::new(
            "door.floor.fsync",
            S,
            "the disk's floor in the daemon's folder, this run: 4 KiB append + `fdatasync` (the harness's own, outside any I/O throttle): median (p99)",
            format!("{} ({})", micros(fsync.median()), micros(fsync.p99())),
        ),
        Figure::new(
            "door.idle.write_amp",
            S,
            "idle entries: bytes the daemon wrote (WAL and checkpoints) / bytes the database grew (per entry)",
            format!(
                "{:.1}× ({:.1} KiB / {:.1} KiB)",
                written / grew,
                written / entries / 1024.0,
                grew / entries / 1024.0
            ),
        )
        .target("≤ 3×", written / grew <= 3.0),
        Figure::new(
            "door.audit_before_unlock",
            S,
            "spot checks: `door.granted` row already committed when its Unlock was read",
            format!(
                "{} of {}",
                idle.audit_checks + loaded.audit_checks,
                idle.audit_checks + loaded.audit_checks
            ),
        ),
    ]
}

/// Waits until the checkpointer has truncated the WAL after the last
/// commit (the hub is idle), at most 30 s.
async fn settle(sampler: &Sampler) {
    let t = Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    while sampler.seen().wal_now > 0 && t.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
