//! A man in the middle on an OSDP bus: the hub opens [`Relay::path`], the
//! relay forwards whole packets between it and a peer reader's pty, and,
//! when told to, attacks the way a tap on the RS-485 wire in the wall can
//! ([`Attack`]): it injects, drops and alters packets (fixing their CRC, as
//! an attacker would), but it has no key, so it can forge nothing a MAC
//! covers.
//!
//! Packets are forwarded whole, so an injected one never lands inside
//! another. Bytes between packets (the 0xFF mark, noise) are dropped; each
//! forwarded packet gets its mark again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lockhub::drivers::osdp::cp::codec::{cmd, reply};
use lockhub::drivers::osdp::packet::{self, scs};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::task::JoinHandle;

use crate::board::pty::{Master, Pty};

/// What the relay does to the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    /// Forwards everything as it is.
    None,
    /// After each reply, the hub's next secured command is answered at
    /// once by a plaintext osdp_NAK(6) ("Secure Channel error") with its
    /// sequence number, ahead of the reader (whose reply then comes late).
    NakAfterReply,
    /// After each secured reply, a plaintext osdp_POLL with sequence 0 goes
    /// to the reader (which makes a libosdp reader drop its channel); the
    /// reader's answer to it is swallowed.
    Seq0ToReader,
    /// Every reply longer than [`LONG_REPLY`] bytes is dropped (an ACK or
    /// a NAK under a MAC is shorter; handshake replies, key presses and
    /// reports are longer).
    DropLongReplies,
    /// The reply to each osdp_OUT reaches the hub with one bit of its MAC
    /// flipped and its CRC fixed up.
    FlipOutReply,
}

/// Replies longer than this are "long" for [`Attack::DropLongReplies`]: an
/// ACK under a MAC is 14 bytes.
pub const LONG_REPLY: usize = 16;

/// A running relay; dropping it stops it.
pub struct Relay {
    /// The pty the hub opens (as its bus's `port`).
    pub path: PathBuf,
    attack: Arc<Mutex<Attack>>,
    /// Packets injected, dropped or altered so far.
    touched: Arc<AtomicU64>,
    tasks: Vec<JoinHandle<()>>,
    _slave: std::os::fd::OwnedFd,
}

type Writer = Arc<tokio::sync::Mutex<WriteHalf<Master>>>;

/// What the two directions share.
struct Shared {
    attack: Arc<Mutex<Attack>>,
    touched: Arc<AtomicU64>,
    /// A reply went to the hub since the last injected NAK.
    armed: AtomicBool,
    /// The reader's next reply answers an injected packet: swallow it.
    swallow: AtomicBool,
    /// The code of the hub's last command.
    last_command: AtomicU8,
    to_hub: Writer,
    to_reader: Writer,
}

impl Relay {
    /// Sits between a new pty (for the hub) and the peer reader's pty.
    pub fn start(reader_pty: &Path) -> Relay {
        let (hub, slave, path) = Pty::open().into_parts();
        let reader = Master::open_tty(reader_pty);
        let (from_hub, to_hub) = tokio::io::split(hub);
        let (from_reader, to_reader) = tokio::io::split(reader);
        let attack = Arc::new(Mutex::new(Attack::None));
        let touched = Arc::new(AtomicU64::new(0));
        let shared = Arc::new(Shared {
            attack: attack.clone(),
            touched: touched.clone(),
            armed: AtomicBool::new(false),
            swallow: AtomicBool::new(false),
            last_command: AtomicU8::new(0),
            to_hub: Arc::new(tokio::sync::Mutex::new(to_hub)),
            to_reader: Arc::new(tokio::sync::Mutex::new(to_reader)),
        });
        let tasks = vec![
            tokio::spawn(commands(from_hub, shared.clone())),
            tokio::spawn(replies(from_reader, shared)),
        ];
        Relay {
            path,
            attack,
            touched,
            tasks,
            _slave: slave,
        }
    }

    /// Starts an attack, or stops one ([`Attack::None`]).
    pub fn set(&self, attack: Attack) {
        *self.attack.lock().unwrap() = attack;
    }

    /// Packets injected, dropped or altered so far.
    pub fn touched(&self) -> u64 {
        self.touched.load(Ordering::SeqCst)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Shared {
    fn attack(&self) -> Attack {
        *self.attack.lock().unwrap()
    }

    fn touch(&self) {
        self.touched.fetch_add(1, Ordering::SeqCst);
    }
}

async fn send(to: &Writer, frame: &[u8]) -> bool {
    let mut w = to.lock().await;
    w.write_all(&[packet::MARK]).await.is_ok() && w.write_all(frame).await.is_ok()
}

/// The hub's commands, on their way to the reader.
async fn commands(mut from_hub: ReadHalf<Master>, s: Arc<Shared>) {
    let mut frames = Frames::default();
    let mut buf = [0u8; 512];
    while let Ok(n) = from_hub.read(&mut buf).await {
        if n == 0 {
            break;
        }
        for f in frames.push(&buf[..n]) {
            s.last_command.store(code(&f), Ordering::SeqCst);
            if s.attack() == Attack::NakAfterReply
                && secured(&f)
                && s.armed.swap(false, Ordering::SeqCst)
            {
                let nak = packet::encode(f[1] | 0x80, seq(&f), &[], reply::NAK, &[6], None);
                send(&s.to_hub, &nak[1..]).await;
                s.touch();
            }
            if !send(&s.to_reader, &f).await {
                return;
            }
        }
    }
}

/// The reader's replies, on their way to the hub.
async fn replies(mut from_reader: ReadHalf<Master>, s: Arc<Shared>) {
    let mut frames = Frames::default();
    let mut buf = [0u8; 512];
    while let Ok(n) = from_reader.read(&mut buf).await {
        if n == 0 {
            break;
        }
        for mut f in frames.push(&buf[..n]) {
            if s.swallow.swap(false, Ordering::SeqCst) {
                continue;
            }
            match s.attack() {
                Attack::DropLongReplies if f.len() > LONG_REPLY => {
                    s.touch();
                    continue;
                }
                Attack::FlipOutReply
                    if s.last_command.load(Ordering::SeqCst) == cmd::OUT && secured(&f) =>
                {
                    // The MAC's last byte, then the CRC over everything before it.
                    let len = f.len();
                    f[len - 3] ^= 0x01;
                    let crc = packet::crc16(&f[..len - 2]);
                    f[len - 2..].copy_from_slice(&crc.to_le_bytes());
                    s.touch();
                }
                _ => {}
            }
            let reader_addr = f[1] & 0x7F;
            let was_secured = secured(&f);
            if !send(&s.to_hub, &f).await {
                return;
            }
            s.armed.store(true, Ordering::SeqCst);
            if s.attack() == Attack::Seq0ToReader && was_secured {
                // Right after the reply, while the hub has not yet sent its
                // next command: the reader is idle and takes it.
                let poll = packet::encode(reader_addr, 0, &[], cmd::POLL, &[], None);
                s.swallow.store(true, Ordering::SeqCst);
                send(&s.to_reader, &poll[1..]).await;
                s.touch();
            }
        }
    }
}

fn seq(f: &[u8]) -> u8 {
    f[4] & 0x03
}

fn scb_len(f: &[u8]) -> usize {
    if f[4] & 0x08 != 0 {
        usize::from(f[5])
    } else {
        0
    }
}

fn code(f: &[u8]) -> u8 {
    f.get(5 + scb_len(f)).copied().unwrap_or(0)
}

/// Under a MAC: a command or reply of an established Secure Channel.
fn secured(f: &[u8]) -> bool {
    scb_len(f) >= 2 && scs::has_mac(f[6])
}

/// Splits a byte stream into whole OSDP packets (SOM to CRC), by their
/// length field; anything else is skipped.
#[derive(Default)]
struct Frames {
    buf: Vec<u8>,
}

impl Frames {
    fn push(&mut self, bytes: &[u8]) -> Vec<Vec<u8>> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        loop {
            match self.buf.iter().position(|&b| b == packet::SOM) {
                Some(at) => {
                    self.buf.drain(..at);
                }
                None => {
                    self.buf.clear();
                    return out;
                }
            }
            if self.buf.len() < 4 {
                return out;
            }
            // SOM, address, then the length (LSB first) of the whole packet.
            let len = usize::from(u16::from_le_bytes([self.buf[2], self.buf[3]]));
            if !(packet::MIN_PACKET..=packet::MAX_PACKET).contains(&len) {
                self.buf.remove(0);
                continue;
            }
            if self.buf.len() < len {
                return out;
            }
            out.push(self.buf.drain(..len).collect());
        }
    }
}
