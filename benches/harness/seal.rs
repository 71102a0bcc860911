//! What the sealed board link costs at the door (issue 29: under 0.5 ms at
//! p99): a Keypad written on the board's side of a pty → the Unlock read
//! back, on a sealed port and a plain port of the same serial driver, in
//! the same run, entries taking turns; and the handshake's time.
//!
//! The hub is the serial driver itself (`lockhub::drivers::serial`, the
//! code `lockhub run` runs for its ports) on a real store file, not the
//! whole daemon: the door scenario measures the daemon, this one the
//! difference sealing makes, with nothing else moving. The boards are
//! played at the frame level (like the door scenario's), so each timestamp
//! is taken at the write and at the read; the sealed board seals its Keypad
//! after the first timestamp and opens the Unlock before the second, so
//! both ends' sealing is inside the figure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use firmware_bridge::frame::{decode_payload, to_frame};
use firmware_bridge::sealed::{BoardRx, BoardSeal, HubRx, HubSeal};
use firmware_bridge::{Downlink, LinkKey, PayloadDecoder, Pin, Uplink};
use lockhub::config::Policy;
use lockhub::drivers::OsRandom;
use lockhub::drivers::serial::{DoorSettings, LinkMode, PortSettings};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{Mutex, mpsc};

use super::Sizes;
use super::pty::{Master, Pty};
use super::report::Figure;
use super::stats::{Summary, micros};

pub const IDS: &[&str] = &[
    "seal.door.plain.median",
    "seal.door.plain.p99",
    "seal.door.sealed.median",
    "seal.door.sealed.p99",
    "seal.door.p99_cost",
    "seal.frames.cpu",
    "seal.handshake.cpu",
    "seal.handshake.first",
];

const S: &str = "seal";
/// Doors per port: entries go round them, so no door sees more than the
/// flood limit (4 a second) with [`GAP`] between entries.
const DOORS: u8 = 16;
/// Pause after each entry; the two ports take turns.
const GAP: Duration = Duration::from_millis(10);
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
const SEALED_PIN: &str = "48291301";
const PLAIN_PIN: &str = "48291302";
static SEALED_DOORS: [&str; DOORS as usize] = [
    "s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "s12", "s13", "s14",
    "s15",
];
static PLAIN_DOORS: [&str; DOORS as usize] = [
    "p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9", "p10", "p11", "p12", "p13", "p14",
    "p15",
];

type Writer = Arc<Mutex<WriteHalf<Master>>>;

/// One board's end: plain, or sealed with its session.
enum End {
    Plain,
    Sealed(Box<BoardSeal>),
}

struct Board {
    end: Mutex<End>,
    w: Writer,
}

impl Board {
    /// Frames `msg` as this board sends it (sealed in its session).
    async fn frame(&self, msg: &Uplink) -> Vec<u8> {
        match &mut *self.end.lock().await {
            End::Plain => to_frame(msg).expect("fits").to_vec(),
            End::Sealed(seal) => seal.seal(msg).map(|f| f.to_vec()).unwrap_or_default(),
        }
    }

    async fn write(&self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.w
                .lock()
                .await
                .write_all(bytes)
                .await
                .expect("pty write");
        }
    }

    async fn send(&self, msg: &Uplink) {
        let f = self.frame(msg).await;
        self.write(&f).await;
    }
}

fn hello() -> Uplink {
    Uplink::Hello {
        board_id: 1,
        fw_major: 1,
        fw_minor: 0,
        door_count: DOORS,
    }
}

/// Reads the hub: answers the handshake, Hello, Ping, Unlock and Deny as
/// the firmware would, and reports each Unlock's door with the moment it
/// was read (opened, on the sealed board) and each session's start.
async fn listen(
    board: Arc<Board>,
    mut r: ReadHalf<Master>,
    unlocks: mpsc::UnboundedSender<(u8, Instant)>,
    sessions: mpsc::UnboundedSender<Instant>,
) {
    let mut dec = PayloadDecoder::new();
    let mut buf = [0u8; 512];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        for &b in &buf[..n] {
            let Some(Ok(p)) = dec.push(b) else { continue };
            let p = p.to_vec();
            let msg = {
                let mut end = board.end.lock().await;
                match &mut *end {
                    End::Plain => decode_payload::<Downlink>(&p).ok(),
                    End::Sealed(seal) => match seal.on_payload(&p, &mut OsRandom) {
                        BoardRx::Message(m) => Some(m),
                        BoardRx::Send(f) => {
                            drop(end);
                            board.write(&f).await;
                            None
                        }
                        BoardRx::SessionStarted { .. } => {
                            let f = seal.seal(&hello()).expect("in session").to_vec();
                            drop(end);
                            board.write(&f).await;
                            let _ = sessions.send(Instant::now());
                            None
                        }
                        BoardRx::Dropped(_) => None,
                    },
                }
            };
            let at = Instant::now();
            match msg {
                Some(Downlink::Hello { .. }) => board.send(&hello()).await,
                Some(Downlink::Ping { nonce }) => board.send(&Uplink::Pong { nonce }).await,
                Some(Downlink::Unlock { seq, door, .. }) => {
                    let _ = unlocks.send((door, at));
                    board.send(&Uplink::Ack { seq }).await;
                }
                Some(Downlink::Deny { seq, .. }) => board.send(&Uplink::Ack { seq }).await,
                _ => {}
            }
        }
    }
}

/// A board on a fresh pty: the board, the path the hub opens, the pty's
/// slave to keep open, the Unlocks it reads and its sessions' starts.
struct OnPty {
    board: Arc<Board>,
    path: std::path::PathBuf,
    _slave: std::os::fd::OwnedFd,
    unlocks: mpsc::UnboundedReceiver<(u8, Instant)>,
    sessions: mpsc::UnboundedReceiver<Instant>,
}

fn board(end: End) -> OnPty {
    let (master, slave, path) = Pty::open().into_parts();
    let (r, w) = tokio::io::split(master);
    let board = Arc::new(Board {
        end: Mutex::new(end),
        w: Arc::new(Mutex::new(w)),
    });
    let (utx, urx) = mpsc::unbounded_channel();
    let (stx, srx) = mpsc::unbounded_channel();
    tokio::spawn(listen(board.clone(), r, utx, stx));
    OnPty {
        board,
        path,
        _slave: slave,
        unlocks: urx,
        sessions: srx,
    }
}

fn port(name: &str, path: std::path::PathBuf, doors: &[&str], mode: LinkMode) -> PortSettings {
    PortSettings {
        name: name.into(),
        path,
        baud: 115_200,
        doors: doors
            .iter()
            .zip(0u8..)
            .map(|(d, index)| DoorSettings {
                name: (*d).into(),
                index,
                unlock_ms: 800,
            })
            .collect(),
        link_mode: mode,
    }
}

/// One entry: the Keypad written (sealed after `t0`), the Unlock read.
async fn entry(
    board: &Board,
    unlocks: &mut mpsc::UnboundedReceiver<(u8, Instant)>,
    seq: u16,
    door: u8,
    pin: &str,
) -> Duration {
    let msg = Uplink::Keypad {
        seq,
        door,
        pin: Pin::from_digits(pin).expect("bench PINs are digits"),
    };
    let t0 = Instant::now();
    board.send(&msg).await;
    let (d, at) = tokio::time::timeout(ANSWER_TIMEOUT, unlocks.recv())
        .await
        .ok()
        .flatten()
        .expect("the hub answers every entry with an Unlock");
    assert_eq!(d, door, "the Unlock is for the door typed at");
    at - t0
}

/// The payload of one frame.
fn payload(frame: &[u8]) -> Vec<u8> {
    let mut dec = PayloadDecoder::new();
    for b in frame {
        if let Some(r) = dec.push(*b) {
            return r.expect("a valid frame").to_vec();
        }
    }
    panic!("no frame")
}

/// One door's frames sealed and opened in memory, `n` times: the Keypad
/// (board seals, hub opens) and the Unlock (hub seals, board opens), the
/// cryptography sealing adds to an entry with nothing else around it.
fn frames_cpu(n: usize) -> Summary {
    let key = LinkKey::from_bytes([0x5a; 32]);
    let mut rng = OsRandom;
    let mut hub = HubSeal::new(key.clone());
    let mut board = BoardSeal::new(1, key);
    let hello = hub.start_with(&mut rng).expect("SealHello");
    let BoardRx::Send(answer) = board.on_payload(&payload(&hello), &mut rng) else {
        panic!("the board answers")
    };
    let HubRx::SessionStarted { confirm, .. } = hub.on_payload(&payload(&answer)) else {
        panic!("the hub confirms")
    };
    board.on_payload(&payload(&confirm), &mut rng);
    let pin = Pin::from_digits(SEALED_PIN).expect("digits");
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let seq = u16::try_from(i % 60_000 + 1).unwrap_or(1);
        let t0 = Instant::now();
        let up = board
            .seal(&Uplink::Keypad {
                seq,
                door: 0,
                pin: pin.clone(),
            })
            .expect("sealed");
        assert!(matches!(
            hub.on_payload(&payload(&up)),
            HubRx::Message(Uplink::Keypad { .. })
        ));
        let down = hub
            .seal(&Downlink::Unlock {
                seq,
                door: 0,
                ms: 800,
            })
            .expect("sealed");
        assert!(matches!(
            board.on_payload(&payload(&down), &mut rng),
            BoardRx::Message(Downlink::Unlock { .. })
        ));
        lat.push(t0.elapsed());
    }
    Summary::from_durations(&lat)
}

/// Both ends of a handshake in memory, `n` times: the cryptography alone.
fn handshake_cpu(n: usize) -> Summary {
    let key = LinkKey::from_bytes([0x5a; 32]);
    let mut rng = OsRandom;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let mut hub = HubSeal::new(key.clone());
        let mut board = BoardSeal::new(1, key.clone());
        let t0 = Instant::now();
        let hello = hub.start_with(&mut rng).expect("SealHello");
        let BoardRx::Send(answer) = board.on_payload(&payload(&hello), &mut rng) else {
            panic!("the board answers")
        };
        let HubRx::SessionStarted { confirm, .. } = hub.on_payload(&payload(&answer)) else {
            panic!("the hub confirms")
        };
        assert!(matches!(
            board.on_payload(&payload(&confirm), &mut rng),
            BoardRx::SessionStarted { .. }
        ));
        lat.push(t0.elapsed());
    }
    Summary::from_durations(&lat)
}

pub async fn run(sizes: &Sizes) -> Vec<Figure> {
    let entries = sizes.door_entries.clamp(20, 2000);
    let cpu = handshake_cpu(entries.min(500));
    let frames = frames_cpu(entries.max(1000));
    let policy = Policy {
        lockout_threshold: 1_000_000,
        ..Policy::default()
    };
    let db = testkit::db::Db::open_with(policy);
    db.add_key("k-sealed", SEALED_PIN, &SEALED_DOORS).await;
    db.add_key("k-plain", PLAIN_PIN, &PLAIN_DOORS).await;
    let key = testkit::files::board_key_for("sealed");
    let mut sealed = board(End::Sealed(Box::new(BoardSeal::new(
        1,
        LinkKey::from_bytes(key),
    ))));
    let mut plain = board(End::Plain);
    let opened = Instant::now();
    let hub = testkit::board::start(
        &db,
        testkit::board::settings(
            vec![
                port(
                    "sealed",
                    sealed.path.clone(),
                    &SEALED_DOORS,
                    LinkMode::Sealed(key),
                ),
                port("plain", plain.path.clone(), &PLAIN_DOORS, LinkMode::Plain),
            ],
            policy,
        ),
    );
    let first = tokio::time::timeout(Duration::from_secs(10), sealed.sessions.recv())
        .await
        .ok()
        .flatten()
        .expect("a sealed session")
        - opened;
    // Both links ready (the board's Hello answered, acks flowing).
    tokio::time::sleep(Duration::from_millis(500)).await;

    let (mut sealed_lat, mut plain_lat) = (Vec::new(), Vec::new());
    let warmup = 20;
    for k in 0..entries + warmup {
        let seq = u16::try_from(k % 60_000 + 1).unwrap_or(1);
        let door = u8::try_from(k % usize::from(DOORS)).unwrap_or(0);
        // Turns, and which goes first alternates: neither port always
        // follows the other's entry.
        let order = if k % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for is_sealed in order {
            let d = if is_sealed {
                entry(&sealed.board, &mut sealed.unlocks, seq, door, SEALED_PIN).await
            } else {
                entry(&plain.board, &mut plain.unlocks, seq, door, PLAIN_PIN).await
            };
            if k >= warmup {
                if is_sealed {
                    sealed_lat.push(d);
                } else {
                    plain_lat.push(d);
                }
            }
            tokio::time::sleep(GAP).await;
        }
    }
    hub.shutdown().await;
    let sealed_s = Summary::from_durations(&sealed_lat);
    let plain_s = Summary::from_durations(&plain_lat);
    let cost = sealed_s.p99() - plain_s.p99();
    let n = sealed_lat.len();
    vec![
        Figure::new(
            "seal.door.plain.median",
            S,
            &format!("door latency, plain port (median of {n})"),
            micros(plain_s.median()),
        ),
        Figure::new(
            "seal.door.plain.p99",
            S,
            "door latency, plain port (p99)",
            micros(plain_s.p99()),
        ),
        Figure::new(
            "seal.door.sealed.median",
            S,
            &format!("door latency, sealed port, same run (median of {n})"),
            micros(sealed_s.median()),
        ),
        Figure::new(
            "seal.door.sealed.p99",
            S,
            "door latency, sealed port, same run (p99)",
            micros(sealed_s.p99()),
        ),
        Figure::new(
            "seal.door.p99_cost",
            S,
            "what sealing adds at p99 (sealed p99 - plain p99)",
            if cost < 0.0 {
                format!("-{}", micros(-cost))
            } else {
                micros(cost)
            },
        )
        .target("< 0.5 ms", cost < 500.0),
        Figure::new(
            "seal.frames.cpu",
            S,
            "sealing and opening one entry's Keypad and Unlock, in memory (p99)",
            micros(frames.p99()),
        )
        .target("< 0.5 ms", frames.p99() < 500.0),
        Figure::new(
            "seal.handshake.cpu",
            S,
            "handshake, both ends' cryptography in memory (median)",
            micros(cpu.median()),
        ),
        Figure::new(
            "seal.handshake.first",
            S,
            "port opened → sealed session confirmed at the board (one sample)",
            micros(first.as_secs_f64() * 1e6),
        ),
    ]
}
