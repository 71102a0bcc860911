//! A hub's serial driver on a real store file, for the serial tests; and
//! helpers to play the board with `lockhub::sim::board::SimBoard` on a
//! pseudo-terminal ([`pty`]).

pub mod pty;
pub mod relay;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use firmware_bridge::BoardConfig;
use lockhub::config::Policy;
use lockhub::drivers::serial::{
    DoorSettings, LinkMode, PortSettings, SerialHandle, SerialSettings,
};
use lockhub::sim::board::{SimBoard, SimEvent};
use lockhub_proto::time::Timestamp;

use self::pty::{Master, Pty};
use crate::db::{Db, pin_keys};

/// Every wait in these tests ends by this (or a shorter, named bound).
pub const WAIT: Duration = Duration::from_secs(10);

pub fn door(name: &str, index: u8) -> DoorSettings {
    DoorSettings {
        name: name.into(),
        index,
        unlock_ms: 800,
    }
}

/// A sealed port under the test key of `name`
/// ([`crate::files::board_key_for`]), as a board made by [`board`] (for
/// `board-a`) or [`board_named`] holds it.
pub fn port(name: &str, path: PathBuf, doors: Vec<DoorSettings>) -> PortSettings {
    PortSettings {
        name: name.into(),
        path,
        baud: 115_200,
        doors,
        link_mode: LinkMode::Sealed(crate::files::board_key_for(name)),
    }
}

/// A plain port (`insecure_plaintext = true`), for a board made by
/// [`plain_board`].
pub fn plain_port(name: &str, path: PathBuf, doors: Vec<DoorSettings>) -> PortSettings {
    PortSettings {
        link_mode: LinkMode::Plain,
        ..port(name, path, doors)
    }
}

/// A path in the test's own folder for the hub to open, a symlink to the
/// pty (like `/dev/serial/by-id/...`). Why not the pty's own path: once a
/// pty closes, the kernel hands its number to the next pty opened, maybe
/// by a test running beside this one, and a hub still retrying the old path
/// would talk to that test's board.
pub fn by_id(db: &Db, name: &str, pty: &Pty) -> PathBuf {
    let link = db.dir.path().join(name);
    pty::point(&link, &pty.path);
    link
}

/// Unplugged: the board's side closes and its by-id link goes, as udev
/// removes it.
pub fn unplug(link: &std::path::Path, sim: Sim, keep: PtyKeep) {
    std::fs::remove_file(link).unwrap();
    drop(sim);
    drop(keep);
}

/// Settings with the contract's timings and a short backoff.
pub fn settings(ports: Vec<PortSettings>, policy: Policy) -> SerialSettings {
    SerialSettings {
        ports,
        policy,
        pin_keys: pin_keys().into(),
        zone: jiff::tz::TimeZone::UTC,
        link: firmware_bridge::LinkConfig::hub(),
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(400),
    }
}

/// The usual one-door hub: serial `board-a` at `path`, door `101` at
/// index 0, the store's policy.
pub fn one_door(db: &Db, path: PathBuf) -> SerialSettings {
    settings(vec![port("board-a", path, vec![door("101", 0)])], db.policy)
}

pub fn start(db: &Db, settings: SerialSettings) -> SerialHandle {
    start_with_clock(db, settings, Arc::new(Timestamp::now_system))
}

/// [`start`] with the hub's effective time taken from `now` (a test's own
/// clock: hours pass without a sleep).
pub fn start_with_clock(
    db: &Db,
    settings: SerialSettings,
    now: lockhub::drivers::TimeSource,
) -> SerialHandle {
    lockhub::drivers::serial::spawn(settings, db.store.clone(), now, None)
}

pub type Sim = SimBoard<Master>;

/// A sealed board with `doors` doors on the pty's master, holding the
/// test key of `board-a` (the serial [`port`] names it for).
pub fn board(pty: Pty, doors: u8) -> (Sim, PtyKeep) {
    board_named(pty, doors, "board-a")
}

/// [`board`] holding the test key of serial `name`.
pub fn board_named(pty: Pty, doors: u8, name: &str) -> (Sim, PtyKeep) {
    board_keyed(pty, doors, crate::files::board_key_for(name))
}

/// [`board`] holding link key `key`.
pub fn board_keyed(pty: Pty, doors: u8, key: [u8; 32]) -> (Sim, PtyKeep) {
    let (master, slave, path) = pty.into_parts();
    (
        SimBoard::new_sealed(master, BoardConfig::new(1, doors), key),
        PtyKeep {
            _slave: slave,
            path,
        },
    )
}

/// A plain board (no link key), for a [`plain_port`].
pub fn plain_board(pty: Pty, doors: u8) -> (Sim, PtyKeep) {
    let (master, slave, path) = pty.into_parts();
    (
        SimBoard::new(master, BoardConfig::new(1, doors)),
        PtyKeep {
            _slave: slave,
            path,
        },
    )
}

/// How many times the hub started a session, as the board saw it: each
/// plain `Hello` of a plain port, each `SealHello` nonce of a sealed one
/// (a resent `SealHello` carries the same nonce: the same start).
pub fn hub_hellos(sim: &Sim) -> usize {
    use firmware_bridge::Downlink;
    let mut nonces = Vec::new();
    let mut plain = 0;
    for e in sim.events() {
        match e {
            SimEvent::Received(Downlink::Hello { .. }) => plain += 1,
            SimEvent::Received(Downlink::SealHello { hub_nonce })
                if !nonces.contains(hub_nonce) =>
            {
                nonces.push(*hub_nonce);
            }
            _ => {}
        }
    }
    plain + nonces.len()
}

/// Keeps the slave side open while the board lives (see [`Pty`]).
pub struct PtyKeep {
    _slave: std::os::fd::OwnedFd,
    pub path: PathBuf,
}

/// Steps `sim` until the hub answered its Hello (the link is up both
/// ways; on a sealed board, in a confirmed session).
pub async fn until_linked(sim: &mut Sim) {
    let ok = sim
        .run_until(WAIT, |s| {
            let started = s.board().has_session()
                || s.events().any(|e| {
                    matches!(
                        e,
                        SimEvent::Received(firmware_bridge::Downlink::Hello { .. })
                    )
                });
            started && s.board().link_up(s.now_ms())
        })
        .await
        .unwrap();
    assert!(ok, "the hub never said Hello");
    // Let the hub see our Hello answer.
    sim.run_for(Duration::from_millis(100)).await.unwrap();
}

/// Matches the relay at `door` opening.
pub fn relay_opened(door: u8) -> impl Fn(&SimEvent) -> bool {
    move |e| *e == SimEvent::RelayOpened { door }
}

/// Counts events matching `f` among those not yet taken.
pub fn count(sim: &Sim, f: impl Fn(&SimEvent) -> bool) -> usize {
    sim.events().filter(|e| f(e)).count()
}

/// Steps `sim` until the store satisfies `f` (true) or `WAIT` passes.
pub async fn until_db(sim: &mut Sim, db: &Db, f: impl Fn(&Db) -> bool) -> bool {
    let end = tokio::time::Instant::now() + WAIT;
    loop {
        if f(db) {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        sim.run_for(Duration::from_millis(20)).await.unwrap();
    }
}
