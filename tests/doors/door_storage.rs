//! The door answers within 3 s whatever the storage does (serial.md 'Door
//! decisions'), with real faults: another connection holding SQLite's write
//! lock, and a real full disk (a small tmpfs as the data folder). The hub
//! opens a real pty, the test plays the board; the store is a real file.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use firmware_bridge::Downlink;
use lockhub::config::Policy;
use lockhub::sim::board::SimEvent;
use lockhub::store::Store;
use testkit::board::pty::Pty;
use testkit::board::*;
use testkit::db::Db;

/// The contract's bound for the answer at the door.
const ANSWER_BOUND: Duration = Duration::from_secs(3);

/// The hub's `Deny` for `door` reached the board (whatever the board shows:
/// a relay still open from an earlier grant hides the deny feedback).
fn denied(door: u8) -> impl Fn(&SimEvent) -> bool {
    move |e| matches!(e, SimEvent::Received(Downlink::Deny { door: d, .. }) if *d == door)
}

/// The hub on a store at `db` with doors 101 (index 0) and 102 (index 1).
async fn hub_on(db: &Db) -> (lockhub::serial::SerialHandle, Sim, PtyKeep) {
    let pty = Pty::open();
    let s = settings(
        vec![port(
            "board-a",
            by_id(db, "board-a", &pty),
            vec![door("101", 0), door("102", 1)],
        )],
        db.policy,
    );
    let hub = start(db, s);
    let (mut sim, keep) = board(pty, 2);
    until_linked(&mut sim).await;
    (hub, sim, keep)
}

/// Types `pin` at door index 0 and waits for the answer; returns whether
/// the relay opened, and how long the answer took.
async fn type_pin(sim: &mut Sim, pin: &str) -> (bool, Duration) {
    sim.take_events();
    let typed = Instant::now();
    sim.enter_pin(0, pin);
    let answered = sim
        .run_until(WAIT, |s| {
            count(s, relay_opened(0)) + count(s, denied(0)) > 0
        })
        .await
        .unwrap();
    assert!(
        answered,
        "the door never answered (PIN typed {:?} ago): {:?}",
        typed.elapsed(),
        sim.events().collect::<Vec<_>>()
    );
    (count(sim, relay_opened(0)) == 1, typed.elapsed())
}

/// The `storage_failure` alert messages queued for the cloud, as
/// (subject, state), oldest first.
fn storage_alerts(db: &Db) -> Vec<(String, String)> {
    db.reader()
        .prepare(
            "SELECT CAST(body AS TEXT) FROM outbox WHERE topic = 'alerts'
              AND CAST(body AS TEXT) LIKE '%\"storage_failure\"%' ORDER BY id",
        )
        .unwrap()
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|b| {
            let v: serde_json::Value = serde_json::from_str(&b.unwrap()).unwrap();
            (
                v["subject"].as_str().unwrap().to_owned(),
                v["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn raised_then_cleared() -> Vec<(String, String)> {
    vec![
        ("101".to_owned(), "raised".to_owned()),
        ("101".to_owned(), "cleared".to_owned()),
    ]
}

/// SQLite's write lock, taken and held by a second connection on its own
/// thread, as another process would (`BEGIN IMMEDIATE`), until released.
struct WriteLock {
    release: std::sync::mpsc::Sender<()>,
    holder: std::thread::JoinHandle<()>,
}

impl WriteLock {
    fn take(path: &Path) -> WriteLock {
        let path = path.to_owned();
        let (locked_tx, locked_rx) = std::sync::mpsc::channel::<()>();
        let (release, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let c = rusqlite::Connection::open(&path).unwrap();
            c.execute_batch("BEGIN IMMEDIATE").unwrap();
            locked_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            c.execute_batch("ROLLBACK").unwrap();
        });
        locked_rx.recv().unwrap();
        WriteLock { release, holder }
    }

    fn release(self) {
        self.release.send(()).unwrap();
        self.holder.join().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_door_is_denied_within_3_s_while_another_connection_holds_the_write_lock_and_the_alert_follows()
 {
    let db = Db::open();
    let (hub, mut sim, _keep) = hub_on(&db).await;
    db.add_key("k-1", "482913", &["101"]).await;

    // A second connection, as another process would, takes the write lock
    // and keeps it.
    let lock = WriteLock::take(db.store.path());

    let (opened, took) = type_pin(&mut sim, "482913").await;
    assert!(!opened, "no door opens unrecorded");
    assert!(took < ANSWER_BOUND, "the Deny took {took:?}");
    eprintln!("figure: write lock held elsewhere: PIN typed -> Deny read in {took:?}");
    // Still stalled: the alert waits in memory, nothing is written.
    assert!(!db.raised("storage_failure", "101"));

    lock.release();
    assert!(
        until_db(&mut sim, &db, |db| db.raised("storage_failure", "101")).await,
        "storage_failure is raised once the lock is released"
    );
    assert_eq!(db.audit(), ["door.denied/storage_failure@101"]);

    // The next decision commits: the door opens and the alert ends.
    let (opened, _) = type_pin(&mut sim, "482913").await;
    assert!(opened);
    assert!(until_db(&mut sim, &db, |db| !db.raised("storage_failure", "101")).await);
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE kind = 'door.granted'"),
        1,
        "only the decision that committed left a grant"
    );
    assert_eq!(storage_alerts(&db), raised_then_cleared());
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_waiting_behind_another_at_a_stalled_door_is_still_answered_within_3_s_of_its_typing()
 {
    let db = Db::open();
    let (hub, mut sim, _keep) = hub_on(&db).await;
    db.add_key("k-1", "482913", &["101"]).await;

    let lock = WriteLock::take(db.store.path());

    // Two entries at one door: the second waits for the first's decision,
    // which waits for the lock. Its bound counts from its own typing.
    sim.take_events();
    sim.enter_pin(0, "482913");
    sim.run_until(WAIT, |s| {
        s.events()
            .any(|e| matches!(e, SimEvent::Sent(firmware_bridge::Uplink::Keypad { .. })))
    })
    .await
    .unwrap();
    let second = Instant::now();
    sim.enter_pin(0, "482913");
    let answered = sim
        .run_until(WAIT, |s| count(s, denied(0)) >= 2)
        .await
        .unwrap();
    let took = second.elapsed();
    assert!(
        answered,
        "both entries are answered: {:?}",
        sim.events().collect::<Vec<_>>()
    );
    assert_eq!(count(&sim, relay_opened(0)), 0, "no door opens unrecorded");
    assert!(
        took < ANSWER_BOUND,
        "the waiting entry's Deny took {took:?}"
    );
    eprintln!("figure: second entry behind a stalled one -> Deny read in {took:?}");

    lock.release();
    assert!(
        until_db(&mut sim, &db, |db| db.count("SELECT count(*) FROM audit")
            == 2)
        .await,
        "each acked entry ends in one audit row once storage works: {:?}",
        db.audit()
    );
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE kind = 'door.granted'"),
        0
    );
    hub.shutdown().await;
}

/// A tmpfs mounted on a folder for as long as it lives (lazy unmount, so a
/// failing test cannot leave it busy).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Result<Tmpfs, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
        }
        Ok(Tmpfs(at.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes `path` until the filesystem has no room left.
fn fill(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0x55u8; 16 * 1024];
    loop {
        match f.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc_enospc()) => break,
            Err(e) => panic!("filling the disk: {e}"),
        }
    }
    // What is left is smaller than a chunk: take it too.
    for _ in 0..4096 {
        if f.write(&[0x55]).is_err() {
            break;
        }
    }
    let _ = f.sync_all();
}

fn libc_enospc() -> i32 {
    28
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_full_disk_doors_deny_fast_nothing_committed_is_lost_and_the_hub_recovers_when_space_returns()
 {
    let dir = tempfile::tempdir().unwrap();
    let mount = match Tmpfs::mount(dir.path(), "4m") {
        Ok(m) => m,
        Err(e) => {
            eprintln!(
                "SKIPPED: this test needs to mount a small tmpfs (root or CAP_SYS_ADMIN): {e}"
            );
            return;
        }
    };
    let policy = Policy::default();
    let store = Store::open(&mount.0.join("lockhub.db"), &policy).unwrap();
    let db = Db { dir, store, policy };
    let (hub, mut sim, _keep) = hub_on(&db).await;
    db.add_key("k-1", "482913", &["101"]).await;
    let (opened, _) = type_pin(&mut sim, "482913").await;
    assert!(opened, "the door opens while there is room");
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 2).await);
    let before = db.audit();

    // Move every committed page into the database file and empty the WAL,
    // so the next commit needs new space; then take all of it.
    let mut scrubbed = false;
    for _ in 0..50 {
        if db.store.scrub_wal().await.is_ok() {
            scrubbed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(scrubbed, "the WAL could not be emptied");
    let filler = mount.0.join("filler");
    fill(&filler);

    for _ in 0..3 {
        let (opened, took) = type_pin(&mut sim, "482913").await;
        assert!(!opened, "no door opens unrecorded");
        assert!(took < ANSWER_BOUND, "the Deny took {took:?}");
        eprintln!("figure: disk full: PIN typed -> Deny read in {took:?}");
        sim.run_for(Duration::from_millis(300)).await.unwrap();
    }
    assert_eq!(db.audit(), before, "what was committed is all still there");
    assert!(!db.raised("storage_failure", "101"));

    // Space again: the hub recovers by itself, without a restart.
    std::fs::remove_file(&filler).unwrap();
    assert!(
        until_db(&mut sim, &db, |db| db.raised("storage_failure", "101")).await,
        "storage_failure is raised once storage takes writes"
    );
    let (opened, _) = type_pin(&mut sim, "482913").await;
    assert!(opened, "the door opens again");
    assert!(until_db(&mut sim, &db, |db| !db.raised("storage_failure", "101")).await);
    let after = db.audit();
    assert_eq!(&after[..before.len()], &before[..]);
    assert_eq!(
        &after[before.len()..before.len() + 3],
        ["door.denied/storage_failure@101"; 3],
        "each denial on the full disk is audited once space returns"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM audit WHERE kind = 'door.granted'"),
        2
    );
    assert_eq!(storage_alerts(&db), raised_then_cleared());
    let alert_count: i64 = db
        .reader()
        .query_row(
            "SELECT count FROM alerts WHERE condition = 'storage_failure' AND subject = '101'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(alert_count, 3);
    hub.shutdown().await;
    let last = db.audit();
    assert_eq!(&last[..after.len()], &after[..]);

    // The file is sound: it opens (quick_check) with everything in it.
    let path = db.store.path().to_owned();
    db.store.clone().close();
    let reopened = Store::open(&path, &policy).unwrap();
    let n: i64 = reopened
        .reader()
        .unwrap()
        .query_row("SELECT count(*) FROM audit", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n as usize, last.len());
    reopened.close();
    drop(db);
    drop(mount);
}

/// A run that crashed between a grant's commit and the board's answer
/// left `door.granted` with no outcome: the next start records it
/// unconfirmed, before it serves a door, and the cloud hears of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_left_open_by_a_crash_is_recorded_unconfirmed_at_the_next_start() {
    use lockhub::store::audit::{AuditRecord, record};
    use lockhub_proto::outputs::AuditKind;
    let broker = testkit::broker::Mosquitto::start();
    let mut hub =
        testkit::daemon::Daemon::prepare(&broker.url(), testkit::daemon::DaemonOptions::default());
    std::fs::create_dir_all(hub.db_path().parent().unwrap()).unwrap();
    let store = Store::open(&hub.db_path(), &Policy::default()).unwrap();
    store
        .write(lockhub::store::Priority::Bulk, |c| {
            let mut rec = AuditRecord::new(
                AuditKind::DoorGranted,
                lockhub_proto::time::Timestamp::now_system(),
            );
            rec.door = Some("101".into());
            rec.key_id = Some("k-1".into());
            record(c, &rec).map(drop)
        })
        .await
        .unwrap();
    store.close();
    hub.spawn();
    hub.wait_db("the open grant settled", |db| {
        db.query_row(
            "SELECT count(*) FROM audit WHERE kind = 'door.unlock_unconfirmed' AND door = '101' AND key_id = 'k-1'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == 1
    })
    .await;
    assert!(hub.log().contains("grants left without an outcome"));
}
