//! A hub's serial driver on a real store file, for the serial tests; and
//! helpers to play the board with `lockhub::sim::board::SimBoard` on a pty.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use firmware_bridge::BoardConfig;
use lockhub::config::{PinKey, Policy};
use lockhub::serial::{DoorSettings, PortSettings, SerialHandle, SerialSettings};
use lockhub::sim::board::{SimBoard, SimEvent};
use lockhub::store::{Priority, Store};
use lockhub::time::Timestamp;
use rusqlite::{Connection, params};

use super::pty::{Master, Pty};

/// Every wait in these tests ends by this (or a shorter, named bound).
pub const WAIT: Duration = Duration::from_secs(10);

pub const PIN_KEY: [u8; 32] = [7; 32];

pub fn pin_keys() -> Vec<PinKey> {
    vec![PinKey {
        id: "k1".into(),
        secret: PIN_KEY,
    }]
}

pub fn door(name: &str, index: u8) -> DoorSettings {
    DoorSettings {
        name: name.into(),
        index,
        unlock_ms: 800,
    }
}

pub fn port(name: &str, path: PathBuf, doors: Vec<DoorSettings>) -> PortSettings {
    PortSettings {
        name: name.into(),
        path,
        baud: 115_200,
        doors,
    }
}

/// A store in a temporary folder.
pub struct Db {
    pub dir: tempfile::TempDir,
    pub store: Store,
    pub policy: Policy,
}

impl Db {
    pub fn open(policy: Policy) -> Db {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("lockhub.db"), &policy).unwrap();
        Db { dir, store, policy }
    }

    pub fn reader(&self) -> Connection {
        self.store.reader().unwrap()
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.reader().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// Audit rows as `kind[/reason]@door`, oldest first.
    pub fn audit(&self) -> Vec<String> {
        let r = self.reader();
        let mut stmt = r
            .prepare("SELECT kind, reason, door FROM audit ORDER BY seqno")
            .unwrap();
        stmt.query_map([], |row| {
            let kind: String = row.get(0)?;
            let reason: Option<String> = row.get(1)?;
            let door: Option<String> = row.get(2)?;
            Ok(match reason {
                Some(r) => format!("{kind}/{r}@{}", door.unwrap_or_default()),
                None => format!("{kind}@{}", door.unwrap_or_default()),
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    }

    /// Whether (condition, subject) is raised.
    /// The `links` row of a port: (state, board_id), as `lockhub status` reads it.
    pub fn link(&self, serial: &str) -> Option<(String, Option<i64>)> {
        self.reader()
            .query_row(
                "SELECT state, board_id FROM links WHERE serial = ?1",
                [serial],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .ok()
    }

    pub fn raised(&self, condition: &str, subject: &str) -> bool {
        self.reader()
            .query_row(
                "SELECT count(*) FROM alerts WHERE condition = ?1 AND subject = ?2 AND state = 'raised'",
                [condition, subject],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
            == 1
    }

    /// An active key `id` with `pin` for `doors`, valid from an hour ago for a day.
    pub async fn add_key(&self, id: &'static str, pin: &'static str, doors: &[&'static str]) {
        let doors: Vec<&'static str> = doors.to_vec();
        self.store
            .write(Priority::Bulk, move |c| {
                let tag = lockhub::crypto::pin_tag(&PIN_KEY, pin.as_bytes());
                let now = Timestamp::now_system();
                c.execute(
                    "INSERT INTO keys (key_id, version, state, check_in_id, reservation_id, valid_from,
                                       valid_until, pin_tag, pin_key_id, holder_ref, holder_name,
                                       revoke_reason, event_id, updated_at)
                     VALUES (?1, 1, 'active', ?2, NULL, ?3, ?4, ?5, 'k1', ?6, NULL, NULL, NULL, ?3)",
                    params![
                        id,
                        format!("c-{id}"),
                        now.saturating_add_secs(-3600).0,
                        now.saturating_add_secs(86_400).0,
                        &tag[..],
                        format!("g-{id}")
                    ],
                )?;
                for d in &doors {
                    c.execute(
                        "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES (?1, ?2, ?3, 1)",
                        params![id, d, &tag[..]],
                    )?;
                }
                Ok(())
            })
            .await
            .unwrap();
    }

    /// Makes every audit insert fail, as a full or failing disk would.
    pub async fn break_audit(&self) {
        self.store
            .write(Priority::Bulk, |c| {
                c.execute_batch(
                    "CREATE TRIGGER test_disk_full BEFORE INSERT ON audit
                     BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
                )?;
                Ok(())
            })
            .await
            .unwrap();
    }
}

/// A path in the test's own folder for the hub to open, a symlink to the
/// pty (like `/dev/serial/by-id/...`). Why not the pty's own path: once a
/// pty closes, the kernel hands its number to the next pty opened, maybe
/// by a test running beside this one, and a hub still retrying the old path
/// would talk to that test's board.
pub fn by_id(db: &Db, name: &str, pty: &Pty) -> PathBuf {
    let link = db.dir.path().join(name);
    super::pty::point(&link, &pty.path);
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
        link: firmware_bridge::LinkConfig::hub(),
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(400),
    }
}

pub fn start(db: &Db, settings: SerialSettings) -> SerialHandle {
    lockhub::serial::spawn(
        settings,
        db.store.clone(),
        Arc::new(Timestamp::now_system),
        None,
    )
}

pub type Sim = SimBoard<Master>;

/// A board with `doors` doors on the pty's master.
pub fn board(pty: Pty, doors: u8) -> (Sim, PtyKeep) {
    let (master, slave, path) = pty.into_parts();
    (
        SimBoard::new(master, BoardConfig::new(1, doors)),
        PtyKeep {
            _slave: slave,
            path,
        },
    )
}

/// Keeps the slave side open while the board lives (see [`Pty`]).
pub struct PtyKeep {
    _slave: std::os::fd::OwnedFd,
    pub path: PathBuf,
}

/// Steps `sim` until the hub answered its Hello (the link is up both ways).
pub async fn until_linked(sim: &mut Sim) {
    let ok = sim
        .run_until(WAIT, |s| {
            s.events().any(|e| {
                matches!(
                    e,
                    SimEvent::Received(firmware_bridge::Downlink::Hello { .. })
                )
            }) && s.board().link_up(s.now_ms())
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
