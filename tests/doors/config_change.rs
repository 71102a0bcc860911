//! What an earlier run raised about a door, board or reader that the config
//! no longer has (removed or renamed between runs): nothing watches it any
//! more, so its alerts end at start (mqtt.md: every alert ends), except a
//! tamper, which is evidence and is an operator's to clear.

use lockhub::store::alerts;
use lockhub::store::{Priority, Store};
use lockhub::watch::{DoorAlarm, DoorState};
use lockhub_proto::outputs::Condition;
use lockhub_proto::time::Timestamp;
use rusqlite::Connection;
use testkit::broker::Mosquitto;
use testkit::daemon::{Daemon, DaemonOptions};

fn raised(db: &Connection, condition: &str, subject: &str) -> bool {
    db.query_row(
        "SELECT count(*) FROM alerts WHERE condition = ?1 AND subject = ?2 AND state = 'raised'",
        [condition, subject],
        |r| r.get::<_, i64>(0),
    )
    .unwrap()
        > 0
}

fn door_state_rows(db: &Connection, door: &str) -> i64 {
    db.query_row(
        "SELECT count(*) FROM door_state WHERE door = ?1",
        [door],
        |r| r.get(0),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alerts_about_doors_boards_and_readers_the_config_no_longer_has_end_at_start() {
    let broker = Mosquitto::start();
    // This run's config: board-a with door 101 (the fixture's), and a bus
    // whose reader r-1 is now on the secured side without a key, and whose
    // reader r-3 has a key now (its `insecure_plaintext` left on: a key is
    // always used).
    let mut hub = Daemon::prepare(
        &broker.url(),
        DaemonOptions {
            hub_extra: "[[osdp]]\nname = \"bus-a\"\nport = \"/nonexistent/osdp-bus-a\"\n\n\
                        [[reader]]\nname = \"r-1\"\nbus = \"bus-a\"\naddress = 1\n\
                        insecure_plaintext = true\n\n\
                        [[reader]]\nname = \"r-3\"\nbus = \"bus-a\"\naddress = 3\n\
                        insecure_plaintext = true\n"
                .to_owned(),
            secrets_extra: "[[reader_key]]\nreader = \"r-3\"\nscbk = \"QkJCQkJCQkJCQkJCQkJCQg\"\n"
                .to_owned(),
            ..DaemonOptions::default()
        },
    );
    // What an earlier run with another config left.
    std::fs::create_dir_all(hub.db_path().parent().unwrap()).unwrap();
    let store = Store::open(&hub.db_path(), &lockhub::config::Policy::default()).unwrap();
    let at = Timestamp::now_system();
    store
        .write(Priority::Bulk, move |c| {
            let open = DoorState {
                opened_at: Some(at),
                forced: true,
                held_open: true,
            };
            // A door renamed since, and an index an older run watched.
            for door in ["old-door", "board-a:2"] {
                lockhub::store::door::record_sensor(c, door, &open, Some(DoorAlarm::Forced), at)?;
                lockhub::store::door::record_sensor(c, door, &open, Some(DoorAlarm::HeldOpen), at)?;
            }
            for (condition, subject) in [
                (Condition::DoorForced, "101"),
                (Condition::BoardMismatch, "old-door"),
                (Condition::BoardOffline, "board-old"),
                (Condition::BoardOffline, "board-a"),
                (Condition::Tamper, "board-old"),
                (Condition::BoardOffline, "r-9"),
                (Condition::ReaderReplaced, "r-9"),
                (Condition::ReaderLinkFault, "r-1"),
                (Condition::LinkInsecure, "r-2"),
                (Condition::LinkInsecure, "r-1"),
                (Condition::LinkInsecure, "r-3"),
                (Condition::ReaderLinkFault, "r-3"),
            ] {
                alerts::raise(c, condition, subject, 1, at)?;
            }
            Ok(())
        })
        .await
        .unwrap();
    store.close();

    hub.spawn();
    let ended = [
        ("door_forced", "old-door"),
        ("door_held_open", "old-door"),
        ("door_forced", "board-a:2"),
        ("door_held_open", "board-a:2"),
        ("board_mismatch", "old-door"),
        ("board_offline", "board-old"),
        ("board_offline", "r-9"),
        ("reader_replaced", "r-9"),
        ("reader_link_fault", "r-1"),
        ("link_insecure", "r-2"),
        ("link_insecure", "r-3"),
    ];
    hub.wait_db("the alerts of what the config no longer has ended", |db| {
        ended.iter().all(|(c, s)| !raised(db, c, s))
    })
    .await;
    let db = hub.db();
    assert_eq!(
        door_state_rows(&db, "old-door"),
        0,
        "its state is forgotten"
    );
    assert_eq!(door_state_rows(&db, "board-a:2"), 0);
    // What the config still has, and a tamper, stay as they were.
    for (condition, subject) in [
        ("door_forced", "101"),
        ("board_offline", "board-a"),
        ("tamper", "board-old"),
        ("link_insecure", "r-1"),
        ("reader_link_fault", "r-3"),
    ] {
        assert!(
            raised(&db, condition, subject),
            "{condition} {subject} ended"
        );
    }
    hub.assert_running();
}
