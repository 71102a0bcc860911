//! A wire attacker between the hub and a board: a relay task on two
//! pseudo-terminals that sees every frame, and can keep a copy, drop,
//! change, replay or inject frames in either direction.
//!
//! ```text
//! hub ── pty A (the hub opens its slave) ── relay ── pty B ── SimBoard (its master)
//! ```
//!
//! Frames are cut at each 0x00, as on the wire; bytes the relay does not
//! touch pass as they came. What it does with each frame is the test's
//! [`Tamper`] rule; [`Relay::inject`] writes any bytes toward either end.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::pty::{Master, Pty};

/// Which way a frame travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    HubToBoard,
    BoardToHub,
}

/// What the relay does with a frame: the frames to send in its place, each
/// with its direction (none: dropped; a changed copy: flipped; two:
/// replayed at once; one the other way: an answer the relay makes up, as a
/// device in the middle does).
pub type Tamper = Box<dyn FnMut(Dir, &[u8]) -> Vec<(Dir, Vec<u8>)> + Send>;

#[derive(Default)]
struct State {
    /// Every frame seen, in order, with its direction (as it came, before
    /// any rule).
    captured: Vec<(Dir, Vec<u8>)>,
    rule: Option<Tamper>,
}

/// The running relay. Dropping it stops the task.
pub struct Relay {
    state: Arc<Mutex<State>>,
    inject: mpsc::Sender<(Dir, Vec<u8>)>,
    task: tokio::task::JoinHandle<()>,
    /// The hub's end of pty A: the path the hub opens.
    pub hub_path: PathBuf,
    _hub_slave: OwnedFd,
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Relay {
    /// Starts a relay; returns it and the board's end (pty B's master, for
    /// a [`lockhub::sim::board::SimBoard`]) with the descriptor to keep.
    pub fn start() -> (Relay, Master, OwnedFd) {
        let (hub_master, hub_slave, hub_path) = Pty::open().into_parts();
        let (board_master, board_slave, _) = Pty::open().into_parts();
        // The relay holds pty B's slave; the board its master. The slave
        // must stay open for the board's side, so a second descriptor
        // of it is what the relay reads and writes.
        let relay_end = Master::wrap(board_slave.try_clone().expect("dup pty slave"));
        let state = Arc::new(Mutex::new(State::default()));
        let (inject, inject_rx) = mpsc::channel(64);
        let task = tokio::spawn(run(hub_master, relay_end, state.clone(), inject_rx));
        (
            Relay {
                state,
                inject,
                task,
                hub_path,
                _hub_slave: hub_slave,
            },
            board_master,
            board_slave,
        )
    }

    /// [`Relay::start`] for a board that opens a tty path itself (a
    /// `lockhub sim-board` process): returns the path it opens, and that
    /// pty's slave to keep open while the board runs.
    pub fn start_for_path() -> (Relay, PathBuf, OwnedFd) {
        let (hub_master, hub_slave, hub_path) = Pty::open().into_parts();
        let (board_master, board_slave, board_path) = Pty::open().into_parts();
        let state = Arc::new(Mutex::new(State::default()));
        let (inject, inject_rx) = mpsc::channel(64);
        let task = tokio::spawn(run(hub_master, board_master, state.clone(), inject_rx));
        (
            Relay {
                state,
                inject,
                task,
                hub_path,
                _hub_slave: hub_slave,
            },
            board_path,
            board_slave,
        )
    }

    /// From now on every frame goes through `rule` (replacing any before).
    pub fn tamper(&self, rule: impl FnMut(Dir, &[u8]) -> Vec<(Dir, Vec<u8>)> + Send + 'static) {
        self.state.lock().unwrap().rule = Some(Box::new(rule));
    }

    /// Frames pass untouched again.
    pub fn pass(&self) {
        self.state.lock().unwrap().rule = None;
    }

    /// Writes `bytes` toward the hub or the board, as they are.
    pub async fn inject(&self, dir: Dir, bytes: Vec<u8>) {
        self.inject.send((dir, bytes)).await.expect("relay running");
    }

    /// Every frame seen so far, in order.
    pub fn captured(&self) -> Vec<(Dir, Vec<u8>)> {
        self.state.lock().unwrap().captured.clone()
    }

    /// Every byte seen so far, both ways, one after the other.
    pub fn captured_bytes(&self) -> Vec<u8> {
        self.captured().into_iter().flat_map(|(_, f)| f).collect()
    }
}

async fn run(
    mut hub: Master,
    mut board: Master,
    state: Arc<Mutex<State>>,
    mut inject: mpsc::Receiver<(Dir, Vec<u8>)>,
) {
    let mut from_hub = Vec::new();
    let mut from_board = Vec::new();
    let mut a = [0u8; 512];
    let mut b = [0u8; 512];
    loop {
        tokio::select! {
            r = hub.read(&mut a) => {
                let Ok(n) = r else { return };
                if n == 0 { return; }
                let (to_board, to_hub) = cut(&mut from_hub, &a[..n], Dir::HubToBoard, &state);
                if board.write_all(&to_board).await.is_err() { return; }
                if hub.write_all(&to_hub).await.is_err() { return; }
            }
            r = board.read(&mut b) => {
                let Ok(n) = r else { return };
                if n == 0 { return; }
                let (to_board, to_hub) = cut(&mut from_board, &b[..n], Dir::BoardToHub, &state);
                if hub.write_all(&to_hub).await.is_err() { return; }
                if board.write_all(&to_board).await.is_err() { return; }
            }
            Some((dir, bytes)) = inject.recv() => {
                let end = match dir {
                    Dir::HubToBoard => &mut board,
                    Dir::BoardToHub => &mut hub,
                };
                if end.write_all(&bytes).await.is_err() { return; }
            }
        }
    }
}

/// Cuts whole frames (ending in 0x00) out of `pending + bytes`, captures
/// each and applies the rule; returns the bytes to write toward the board
/// and toward the hub.
fn cut(pending: &mut Vec<u8>, bytes: &[u8], dir: Dir, state: &Mutex<State>) -> (Vec<u8>, Vec<u8>) {
    let (mut to_board, mut to_hub) = (Vec::new(), Vec::new());
    let mut st = state.lock().unwrap();
    for &byte in bytes {
        pending.push(byte);
        if byte != 0 {
            continue;
        }
        let frame = std::mem::take(pending);
        st.captured.push((dir, frame.clone()));
        let out = match st.rule.as_mut() {
            Some(rule) => rule(dir, &frame),
            None => vec![(dir, frame)],
        };
        for (d, f) in out {
            match d {
                Dir::HubToBoard => to_board.extend_from_slice(&f),
                Dir::BoardToHub => to_hub.extend_from_slice(&f),
            }
        }
    }
    (to_board, to_hub)
}

/// A frame's payload (COBS undone, CRC checked and removed), if it is one.
pub fn payload_of(frame: &[u8]) -> Option<Vec<u8>> {
    let mut d = firmware_bridge::PayloadDecoder::new();
    for b in frame {
        if let Some(r) = d.push(*b) {
            return r.ok().map(<[u8]>::to_vec);
        }
    }
    None
}

/// `payload` framed again (CRC and COBS redone): what an attacker who
/// changed a payload puts on the wire, so the frame passes the CRC.
pub fn frame_of(payload: &[u8]) -> Vec<u8> {
    let mut out = [0u8; firmware_bridge::MAX_SEALED_FRAME];
    firmware_bridge::frame::frame_payload(payload, &mut out)
        .expect("a payload that fits")
        .to_vec()
}

/// `frame` with bit 0 of its byte at `at` (counted in the payload)
/// flipped, and framed again so only the seal can tell.
pub fn flip(frame: &[u8], at: usize) -> Vec<u8> {
    let mut p = payload_of(frame).expect("a valid frame");
    let i = at.min(p.len() - 1);
    p[i] ^= 0x01;
    frame_of(&p)
}
