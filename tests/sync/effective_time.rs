//! Alert times and outbox marks are the hub's effective time (mqtt.md
//! 'Time', 'Alerts'), not the system clock: a real `lockhub run` whose
//! durable time floor is a month ahead of the system clock (a Pi that booted
//! without its clock), a real Mosquitto, and what the cloud hears.

use lockhub_proto::time::Timestamp;
use testkit::broker::Mosquitto;
use testkit::cloud::CloudClient;
use testkit::daemon::DaemonOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_system_clock_behind_the_floor_alerts_and_outbox_marks_carry_the_effective_time() {
    let broker = Mosquitto::start();
    let (mut cloud, mut hub) = CloudClient::with_online_hub(
        broker.port,
        &broker.url(),
        DaemonOptions {
            policy: "cloud_stale_s = 2".into(),
            ..Default::default()
        },
    )
    .await;
    assert!(hub.sigterm());
    let floor = Timestamp::now_system().saturating_add_days(30);
    {
        let c = rusqlite::Connection::open(hub.db_path()).unwrap();
        c.execute("UPDATE time_floor SET floor = ?1 WHERE id = 1", [floor.0])
            .unwrap();
    }
    let before: i64 = hub.count("SELECT coalesce(max(id), 0) FROM outbox");
    cloud.drain();
    let heard_before = cloud.heard.len();
    hub.spawn();

    // No event comes: cloud_stale rises after 2 s, by the hub's time.
    cloud
        .wait_until("cloud_stale raised", |c| {
            c.heard[heard_before..]
                .iter()
                .any(|h| h.leaf == "alerts" && h.body["condition"] == "cloud_stale")
        })
        .await;
    let floor_text = floor.to_rfc3339();
    let stale = cloud.heard[heard_before..]
        .iter()
        .find(|h| h.leaf == "alerts" && h.body["condition"] == "cloud_stale")
        .unwrap();
    for field in ["first_at", "last_at"] {
        let at = stale.body[field].as_str().unwrap();
        assert!(
            at >= floor_text.as_str(),
            "{field} {at} is before the effective time {floor_text}"
        );
    }
    let online = cloud.heard[heard_before..]
        .iter()
        .rev()
        .find(|h| h.leaf == "status")
        .expect("status after the restart");
    assert!(online.body["at"].as_str().unwrap() >= floor_text.as_str());
    let (first_at, last_at): (i64, i64) = hub
        .db()
        .query_row(
            "SELECT first_at, last_at FROM alerts WHERE condition = 'cloud_stale'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(first_at >= floor.0 && last_at >= floor.0);

    // Every row written since the restart is marked sent at the hub's time.
    hub.wait_db("the outbox drained", |db| {
        db.query_row(
            "SELECT count(*) FROM outbox WHERE id > ?1 AND sent_at IS NULL",
            [before],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == 0
    })
    .await;
    let (sent, early): (i64, i64) = hub
        .db()
        .query_row(
            "SELECT count(*), count(*) FILTER (WHERE sent_at < ?2 OR created_at < ?2)
               FROM outbox WHERE id > ?1",
            [before, floor.0],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(sent > 0, "the restart wrote something");
    assert_eq!(early, 0, "an outbox time is behind the effective time");
    assert!(hub.sigterm());
}

/// A cloud whose clock runs ahead of the hub's (here 40 s, well within the
/// hour mqtt.md allows) lifts the effective floor past the system clock.
/// A restart must judge that as the run before did: the clock is trusted and
/// the expiry sweep runs, by the later time, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_a_cloud_running_ahead_neither_makes_the_clock_untrusted_nor_holds_the_sweep()
 {
    let broker = Mosquitto::start();
    let (mut cloud, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;
    let mut grant = testkit::cloud::grant(1);
    let issued = Timestamp::now_system();
    grant.valid_until = issued.saturating_add_secs(20);
    let ev = testkit::cloud::cloud().key_issued(&grant, &[]);
    cloud.publish(std::slice::from_ref(&ev)).await;
    cloud.wait_results(std::slice::from_ref(&ev)).await;
    assert!(hub.sigterm());
    let state = |hub: &testkit::daemon::Daemon| -> String {
        hub.db()
            .query_row("SELECT state FROM keys WHERE key_id = 'k-1'", [], |r| {
                r.get(0)
            })
            .unwrap()
    };
    assert_eq!(state(&hub), "active", "the run before did not expire it");
    // What applying events signed 40 s ahead leaves behind: the effective
    // floor past the system clock, the hub's own floor at its readings.
    let ahead = issued.saturating_add_secs(40);
    {
        let c = rusqlite::Connection::open(hub.db_path()).unwrap();
        c.execute("UPDATE time_floor SET floor = ?1 WHERE id = 1", [ahead.0])
            .unwrap();
        let system: i64 = c
            .query_row("SELECT system_floor FROM time_floor", [], |r| r.get(0))
            .unwrap();
        assert!(
            system <= Timestamp::now_system().0,
            "no lead in the hub's own floor"
        );
    }
    hub.spawn();
    hub.wait_db("the key expired by the effective time", |db| {
        db.query_row("SELECT state FROM keys WHERE key_id = 'k-1'", [], |r| {
            r.get::<_, String>(0)
        })
        .unwrap()
            == "expired"
    })
    .await;
    assert_eq!(hub.alert_count("clock_untrusted"), 0);
    let status = hub.status_json();
    assert_eq!(status["clock"]["trusted"], true, "{status}");
    assert!(status["clock"]["effective"].as_str().unwrap() >= ahead.to_rfc3339().as_str());
    assert!(hub.sigterm());
}
