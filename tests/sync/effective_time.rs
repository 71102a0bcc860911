//! Alert times and outbox marks are the hub's effective time (mqtt.md
//! 'Time', 'Alerts'), not the system clock: a real `lockhub run` whose
//! durable time floor is a month ahead of the system clock (a Pi that booted
//! without its clock), a real Mosquitto, and what the cloud hears.

use lockhub::time::Timestamp;
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
