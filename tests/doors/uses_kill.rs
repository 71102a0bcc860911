//! A use-limited key across SIGKILLs of the real daemon (mqtt.md
//! '`max_uses`'): the use is taken in the transaction that writes the
//! `door.granted` row, so a kill before the commit takes no use and opens
//! nothing, and a kill after it leaves both. The count never runs past the
//! limit, no use is lost or counted twice on a restart, and the key ends
//! `used_up` with one `key.used_up` row.

use std::time::Duration;

use lockhub::config::Policy;
use lockhub::store::{Priority, Store};
use lockhub_proto::time::Timestamp;
use testkit::board::pty::Pty;
use testkit::board::*;
use testkit::broker::Mosquitto;
use testkit::daemon::Daemon;
use testkit::db::{K, insert_key, regrant};
use testkit::files::{HubToml, board_key_for, board_key_toml, secrets_toml, write_private};

const MAX_USES: i64 = 8;
const ROUNDS: u64 = 14;

/// A small deterministic generator: the kill points are the same each run.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_use_limited_key_grants_at_most_its_uses_across_sigkills_and_each_use_is_on_record_once()
{
    let broker = Mosquitto::start();
    let dir = tempfile::tempdir().unwrap();
    let (mut sim, keep) = board(Pty::open(), 1);
    HubToml {
        mqtt_url: broker.url(),
        serial: vec![("board-a".into(), keep.path.display().to_string())],
        ..HubToml::vectors()
    }
    .write(dir.path());
    // The PIN keys the key rows below are tagged with (testkit::db), and
    // the sealed board's link key.
    write_private(
        &dir.path().join("secrets.toml"),
        &secrets_toml(
            &[7; 32],
            &[("k1", &[1; 32]), ("k2", &[2; 32])],
            &board_key_toml("board-a", &board_key_for("board-a")),
        ),
    )
    .unwrap();

    // PIN 482913 at door 101 (index 0), for today, with MAX_USES uses.
    let db_path = dir.path().join("data/lockhub.db");
    let now = Timestamp::now_system();
    let key = K {
        from: now.saturating_add_secs(-3600),
        until: now.saturating_add_days(1),
        ..K::active("k-1", "482913", &["101"])
    };
    let store = Store::open(&db_path, &Policy::default()).unwrap();
    store
        .write(Priority::Bulk, move |c| {
            insert_key(c, &key)?;
            regrant(c, "k-1", Some(MAX_USES as u32), None)?;
            Ok(())
        })
        .await
        .unwrap();
    store.close();

    let mut daemon = Daemon::at(dir);
    let mut rng = Lcg(27);
    let mut opened = 0;
    for _ in 0..ROUNDS {
        sim.take_events();
        daemon.spawn();
        until_linked(&mut sim).await;
        sim.enter_pin(0, "482913");
        // Killed before, during or after the decision's commit (a decision
        // takes a few milliseconds here).
        sim.run_for(Duration::from_millis(rng.below(40)))
            .await
            .unwrap();
        daemon.kill9();
        opened += count(&sim, relay_opened(0));
    }

    // Up once more: every remaining use is taken, then the key is used up.
    sim.take_events();
    daemon.spawn();
    until_linked(&mut sim).await;
    let reader = daemon.db();
    let uses = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT use_count FROM keys WHERE key_id = 'k-1'", [], |r| {
            r.get(0)
        })
        .unwrap()
    };
    while uses(&reader) < MAX_USES {
        sim.take_events();
        sim.enter_pin(0, "482913");
        assert!(
            sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
                .await
                .unwrap(),
            "a key with uses left opens; the hub's log ends:\n{}",
            daemon.log_tail(20)
        );
        opened += 1;
        // A person's pace: the flood limit is 4 entries a second.
        sim.run_for(Duration::from_millis(400)).await.unwrap();
    }
    sim.take_events();
    sim.enter_pin(0, "482913");
    assert!(
        // The hub's Deny (a relay still open from the last use hides the
        // board's deny feedback).
        sim.run_until(WAIT, |s| s.events().any(|e| matches!(
            e,
            lockhub::sim::board::SimEvent::Received(firmware_bridge::Downlink::Deny {
                door: 0,
                ..
            })
        )))
        .await
        .unwrap(),
        "the used-up key is denied"
    );
    daemon
        .wait_db("the used_up denial on record", |c| {
            c.query_row(
                "SELECT count(*) FROM audit WHERE kind = 'door.denied' AND reason = 'used_up'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
                >= 1
        })
        .await;
    assert_eq!(count(&sim, relay_opened(0)), 0);
    daemon.sigterm();

    let c = daemon.db();
    let one = |sql: &str| c.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    let granted = one("SELECT count(*) FROM audit WHERE kind = 'door.granted' AND key_id = 'k-1'");
    println!(
        "{ROUNDS} kills: {granted} grants on record, {opened} relay openings seen by the board"
    );
    assert_eq!(granted, MAX_USES, "one grant row per use, never more");
    assert_eq!(uses(&c), MAX_USES);
    // No door opens unrecorded: every opening the board saw has its grant.
    assert!(
        opened <= granted as usize,
        "{opened} openings, {granted} grants"
    );
    // Each grant has its outcome: confirmed by the board, or (killed
    // before the Unlock went out or was acked) settled unconfirmed at the
    // next start.
    let outcomes = one(
        "SELECT count(*) FROM audit WHERE kind IN ('door.unlocked', 'door.unlock_unconfirmed') \
         AND key_id = 'k-1'",
    );
    assert_eq!(outcomes, granted, "one outcome per grant");
    let state: String = c
        .query_row("SELECT state FROM keys WHERE key_id = 'k-1'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(state, "used_up");
    assert_eq!(
        one("SELECT count(*) FROM audit WHERE kind = 'key.used_up' AND key_id = 'k-1'"),
        1
    );
}
