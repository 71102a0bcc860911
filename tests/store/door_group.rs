//! A door entry that shares the writer's transaction with bulk work: it
//! joins the group in hand and commits with it, and neither side's failure
//! takes the other's work with it.

use lockhub::door::{Decision, pin_tags};
use lockhub::store::door::{DoorEntry, DoorOutcome, door_entry};
use lockhub::store::{Priority, error::StoreError};
use rusqlite::Connection;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use testkit::db::*;

const PIN: &str = "482913";
/// Long enough for a job sent from another thread to be on the writer's
/// channel, on a loaded machine too (the suite runs its tests side by side).
const QUEUED: Duration = Duration::from_millis(200);

fn open_with_key() -> Db {
    let db = Db::open();
    insert(&db, &[K::active("k-1", PIN, &["101"])]);
    db
}

fn entry() -> DoorEntry {
    DoorEntry {
        door: "101".into(),
        door_known: true,
        tags: pin_tags(PIN.as_bytes(), &pin_keys()),
        at: t(0),
    }
}

fn seen(c: &Connection, seq: i64) -> bool {
    c.query_row("SELECT count(*) FROM seq_seen WHERE seq = ?1", [seq], |r| {
        r.get::<_, i64>(0)
    })
    .unwrap()
        == 1
}

/// A bulk job that marks `seq`, holds the writer until a door job waits
/// for it, then ends with `result` (a failure undoes its mark).
fn bulk_until_a_door_waits(
    db: &Db,
    seq: i64,
    result: Result<(), StoreError>,
) -> JoinHandle<Result<(), StoreError>> {
    let (store, doors) = (db.store.clone(), db.store.door_signal());
    std::thread::spawn(move || {
        store.write_blocking(Priority::Bulk, move |c| {
            c.execute("INSERT INTO seq_seen (seq) VALUES (?1)", [seq])?;
            let until = Instant::now() + Duration::from_secs(5);
            while !doors.waiting() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            result
        })
    })
}

/// What the door job saw and decided.
struct DoorRun {
    /// The writer's connection saw the bulk job's `seq` mark...
    writer_saw_bulk: bool,
    /// ...which another connection did not yet: they share a transaction.
    bulk_committed_at_door: bool,
    outcome: Result<DoorOutcome, StoreError>,
}

/// Sends the entry as a door job with `deadline`; it also looks for the
/// bulk job's `seq` mark on the writer and on a reader, and then sleeps
/// `linger` (to run past a deadline).
fn door_job(db: &Db, deadline: Instant, seq: i64, linger: Duration) -> DoorRun {
    let reader = db.reader();
    let policy = db.policy;
    let (tx, rx) = mpsc::channel();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let outcome = rt.block_on(db.store.write_door(deadline, move |c| {
        let _ = tx.send((seen(c, seq), seen(&reader, seq)));
        let outcome = door_entry(c, &entry(), &policy, &jiff::tz::TimeZone::UTC)?;
        std::thread::sleep(linger);
        Ok(outcome)
    }));
    let (writer_saw_bulk, bulk_committed_at_door) = rx.recv().unwrap_or((false, false));
    DoorRun {
        writer_saw_bulk,
        bulk_committed_at_door,
        outcome,
    }
}

/// A bulk job that holds the writer until the sender is used (or 5 s), so
/// jobs sent meanwhile queue behind it and start the next group together.
fn hold_the_writer(db: &Db) -> (mpsc::Sender<()>, JoinHandle<Result<(), StoreError>>) {
    let (release, hold) = mpsc::channel::<()>();
    let store = db.store.clone();
    let blocker = std::thread::spawn(move || {
        store.write_blocking(Priority::Bulk, move |_| {
            let _ = hold.recv_timeout(Duration::from_secs(5));
            Ok(())
        })
    });
    (release, blocker)
}

fn granted(db: &Db) -> i64 {
    db.count("SELECT count(*) FROM audit WHERE kind = 'door.granted' AND key_id = 'k-1'")
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(2)
}

#[test]
fn a_door_entry_arriving_during_a_bulk_job_runs_inside_its_group_and_commits_with_it() {
    let db = open_with_key();
    let bulk = bulk_until_a_door_waits(&db, 7, Ok(()));
    std::thread::sleep(QUEUED);
    let door = door_job(&db, soon(), 7, Duration::ZERO);
    assert!(
        door.writer_saw_bulk && !door.bulk_committed_at_door,
        "the door job ran in a transaction of its own"
    );
    let outcome = door.outcome.expect("the door job commits");
    assert!(matches!(outcome.decision, Decision::Unlock(_)));
    bulk.join().unwrap().unwrap();
    assert!(seen(&db.reader(), 7), "the bulk work committed");
    assert_eq!(granted(&db), 1, "the grant is audited once");
}

#[test]
fn a_bulk_job_that_fails_in_the_doors_group_rolls_back_alone_and_the_grant_commits() {
    let db = open_with_key();
    // A blocker holds the writer while the two bulk jobs queue behind it,
    // so both start the next group together.
    let (release, blocker) = hold_the_writer(&db);
    std::thread::sleep(QUEUED);
    // The group's first job succeeds...
    let first = {
        let store = db.store.clone();
        std::thread::spawn(move || {
            store.write_blocking(Priority::Bulk, move |c| {
                c.execute("INSERT INTO seq_seen (seq) VALUES (1)", [])?;
                Ok(())
            })
        })
    };
    std::thread::sleep(QUEUED);
    // ...the second, in its savepoint, fails once the door job waits.
    let (started_tx, started) = mpsc::channel::<()>();
    let failing = {
        let (store, doors) = (db.store.clone(), db.store.door_signal());
        std::thread::spawn(move || {
            store.write_blocking(Priority::Bulk, move |c| {
                c.execute("INSERT INTO seq_seen (seq) VALUES (2)", [])?;
                let _ = started_tx.send(());
                let until = Instant::now() + Duration::from_secs(5);
                while !doors.waiting() && Instant::now() < until {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err::<(), _>(StoreError::Closed)
            })
        })
    };
    std::thread::sleep(QUEUED);
    release.send(()).unwrap();
    started.recv_timeout(Duration::from_secs(5)).unwrap();
    let door = door_job(&db, soon(), 1, Duration::ZERO);
    assert!(
        door.writer_saw_bulk && !door.bulk_committed_at_door,
        "the door job ran in a transaction of its own"
    );
    assert!(matches!(
        door.outcome.expect("the door job commits").decision,
        Decision::Unlock(_)
    ));
    blocker.join().unwrap().unwrap();
    first.join().unwrap().unwrap();
    assert!(failing.join().unwrap().is_err());
    let r = db.reader();
    assert!(seen(&r, 1) && !seen(&r, 2));
    assert_eq!(granted(&db), 1);
}

#[test]
fn a_failed_first_bulk_job_leaves_the_waiting_door_job_to_commit_on_its_own() {
    let db = open_with_key();
    // The first job of a group has no savepoint: its failure rolls the
    // transaction back before the door job has run in it.
    let failing = bulk_until_a_door_waits(&db, 3, Err(StoreError::Closed));
    std::thread::sleep(QUEUED);
    let door = door_job(&db, soon(), 3, Duration::ZERO);
    assert!(
        !door.writer_saw_bulk,
        "the failed job's work was undone first"
    );
    assert!(matches!(
        door.outcome.expect("the door job commits").decision,
        Decision::Unlock(_)
    ));
    assert!(failing.join().unwrap().is_err());
    assert!(!seen(&db.reader(), 3));
    assert_eq!(granted(&db), 1);
}

#[test]
fn a_door_job_past_its_deadline_in_a_bulk_group_is_undone_and_the_bulk_work_still_commits() {
    let db = open_with_key();
    let bulk = bulk_until_a_door_waits(&db, 4, Ok(()));
    std::thread::sleep(QUEUED);
    let deadline = Instant::now() + Duration::from_millis(200);
    let door = door_job(&db, deadline, 4, Duration::from_millis(300));
    assert!(door.writer_saw_bulk && !door.bulk_committed_at_door);
    assert!(
        matches!(door.outcome, Err(StoreError::Deadline)),
        "{:?}",
        door.outcome.as_ref().err()
    );
    bulk.join().unwrap().unwrap();
    assert!(seen(&db.reader(), 4), "the bulk work committed");
    assert_eq!(granted(&db), 0, "a late grant is never committed");
    assert_eq!(db.count("SELECT count(*) FROM audit"), 0);
}

#[test]
fn a_door_job_that_fails_in_a_bulk_group_loses_none_of_the_bulk_work() {
    let db = open_with_key();
    let bulk = bulk_until_a_door_waits(&db, 5, Ok(()));
    std::thread::sleep(QUEUED);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let policy = db.policy;
    let res = rt.block_on(db.store.write_door(soon(), move |c| {
        door_entry(c, &entry(), &policy, &jiff::tz::TimeZone::UTC)?;
        Err::<(), _>(StoreError::Closed)
    }));
    assert!(matches!(res, Err(StoreError::Closed)), "{res:?}");
    bulk.join().unwrap().unwrap();
    assert!(seen(&db.reader(), 5));
    assert_eq!(db.count("SELECT count(*) FROM audit"), 0);
}

/// A grant whose commit is still under way when the person must be
/// answered (another door job in its group runs long, as a slow fsync
/// would): the entry is answered Deny, and since the grant did commit, the
/// record says so and that the door never opened (`door.unlock_unconfirmed`),
/// not a second, contradicting `storage_failure` denial; the slow storage
/// raises `storage_failure` all the same.
#[test]
fn a_grant_that_commits_after_its_entry_was_answered_deny_is_recorded_unconfirmed() {
    let db = open_with_key();
    let (release, blocker) = hold_the_writer(&db);
    std::thread::sleep(QUEUED);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let (store, policy) = (db.store.clone(), db.policy);
    let decided = rt.spawn(async move {
        lockhub::store::door::decide_entry(
            &store,
            entry(),
            policy,
            jiff::tz::TimeZone::UTC,
            tokio::time::Instant::now().into_std(),
        )
        .await
    });
    std::thread::sleep(QUEUED);
    // A second door job behind it joins its group and holds the commit
    // past the first one's answer.
    let long = {
        let store = db.store.clone();
        rt.spawn(async move {
            store
                .write_door(Instant::now() + Duration::from_secs(10), |_| {
                    std::thread::sleep(Duration::from_secs(3));
                    Ok(())
                })
                .await
        })
    };
    std::thread::sleep(QUEUED);
    release.send(()).unwrap();
    blocker.join().unwrap().unwrap();
    let answered = rt.block_on(decided).unwrap();
    assert!(
        matches!(answered, Err(StoreError::Deadline)),
        "answered within the bound: {answered:?}"
    );
    rt.block_on(long).unwrap().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !db
        .audit()
        .iter()
        .any(|a| a.starts_with("door.unlock_unconfirmed"))
    {
        assert!(Instant::now() < deadline, "{:?}", db.audit());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Past the missed denials' retry: nothing else is written for it.
    std::thread::sleep(Duration::from_millis(1200));
    let audit = db.audit();
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert!(audit[0].starts_with("door.granted"), "{audit:?}");
    assert!(
        db.raised("storage_failure", "101"),
        "a decision not committed within its bound raises storage_failure"
    );
}
