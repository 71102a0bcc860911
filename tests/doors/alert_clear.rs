//! `lockhub alert clear` beside the running daemon: a real `lockhub run`
//! process, a real Mosquitto, a board on a real pty that trips its tamper
//! switch, and the command run as its own process while the daemon runs.
//! The cleared alert and its `alert.cleared` audit record must reach the
//! cloud through the running daemon's outbox.

use testkit::board::pty;

use std::process::Output;
use std::time::{Duration, Instant};
use testkit::broker::Mosquitto;
use testkit::cloud::CloudClient;
use testkit::daemon::{Daemon, DaemonOptions, WAIT};

fn alert_clear(hub: &Daemon, args: &[&str]) -> Output {
    hub.lockhub(&[&["alert", "clear"], args].concat())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_clears_tamper_while_the_daemon_runs_and_the_cloud_hears_it_with_the_audit() {
    let broker = Mosquitto::start();
    let (mut cloud, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;
    // Point the daemon's board at a pty the test plays.
    assert!(hub.sigterm());
    let pty = pty::Pty::open();
    let link = hub.dir.path().join("board-a");
    pty::point(&link, &pty.path);
    let toml_path = hub.dir.path().join("hub.toml");
    let toml = std::fs::read_to_string(&toml_path).unwrap();
    assert!(toml.contains("port = \"/dev/ttyAMA0\""));
    let toml = toml.replace(
        "port = \"/dev/ttyAMA0\"",
        &format!("port = \"{}\"", link.display()),
    );
    std::fs::write(&toml_path, toml).unwrap();
    hub.spawn();
    let (mut sim, _keep) = testkit::board::board(pty, 1);
    testkit::board::until_linked(&mut sim).await;

    sim.tamper();
    let deadline = Instant::now() + WAIT;
    while !hub.raised("tamper", "board-a") {
        assert!(Instant::now() < deadline, "tamper was never raised");
        sim.run_for(Duration::from_millis(50)).await.unwrap();
    }

    // Errors first: they change nothing.
    let unknown = alert_clear(&hub, &["tampered", "board-a", "--reason", "x"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown condition"));
    let not_raised = alert_clear(&hub, &["tamper", "board-b", "--reason", "x"]);
    assert_eq!(not_raised.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&not_raised.stderr).contains("no raised tamper alert"));
    let blank = alert_clear(&hub, &["tamper", "board-a", "--reason", "  "]);
    assert_eq!(blank.status.code(), Some(2));
    assert!(hub.raised("tamper", "board-a"));

    let ok = alert_clear(
        &hub,
        &["tamper", "board-a", "--reason", "cover refitted by J."],
    );
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(!hub.raised("tamper", "board-a"));
    let again = alert_clear(&hub, &["tamper", "board-a", "--reason", "twice"]);
    assert_eq!(again.status.code(), Some(2), "it is no longer raised");

    // The running daemon publishes what the command wrote, signed.
    cloud
        .wait_until("the cleared tamper alert and its audit record", |c| {
            c.on("alerts")
                .any(|a| a["condition"] == "tamper" && a["state"] == "cleared")
                && c.on("audit").any(|a| a["kind"] == "alert.cleared")
        })
        .await;
    let raised_msg = cloud
        .on("alerts")
        .find(|a| a["condition"] == "tamper" && a["state"] == "raised")
        .expect("the raise was published")
        .clone();
    let cleared = cloud
        .on("alerts")
        .find(|a| a["condition"] == "tamper" && a["state"] == "cleared")
        .unwrap();
    assert_eq!(cleared["alert_id"], raised_msg["alert_id"]);
    assert_eq!(cleared["subject"], "board-a");
    let audit = cloud
        .on("audit")
        .find(|a| a["kind"] == "alert.cleared")
        .unwrap();
    assert_eq!(audit["reason"], "cover refitted by J.");
    assert_eq!(audit["condition"], "tamper");
    assert_eq!(audit["door"], "board-a");
    assert_eq!(
        cloud
            .on("audit")
            .filter(|a| a["kind"] == "alert.cleared")
            .count(),
        1,
        "the failed attempts wrote nothing"
    );

    // A new tamper is a new alert.
    sim.tamper();
    let deadline = Instant::now() + WAIT;
    while !hub.raised("tamper", "board-a") {
        assert!(Instant::now() < deadline, "tamper was never raised again");
        sim.run_for(Duration::from_millis(50)).await.unwrap();
    }
    hub.assert_running();
    assert!(hub.sigterm());
}

/// mqtt.md: one alert per condition and subject while it holds. An
/// operator may clear `cloud_stale` by hand while the cloud is still
/// silent; the daemon raises it again (as a new alert, not as a bump of
/// the cleared one), and says so to the cloud.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_stale_cleared_by_hand_while_the_cloud_is_still_silent_is_raised_again() {
    let broker = Mosquitto::start();
    let (mut cloud, mut hub) = CloudClient::with_online_hub(
        broker.port,
        &broker.url(),
        DaemonOptions {
            policy: "cloud_stale_s = 2".into(),
            ..DaemonOptions::default()
        },
    )
    .await;
    hub.wait_db("cloud_stale raised", |db| {
        testkit::db::raised(db, "cloud_stale", "cloud")
    })
    .await;
    let first: String = hub
        .db()
        .query_row(
            "SELECT alert_id FROM alerts WHERE condition = 'cloud_stale'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let ok = alert_clear(&hub, &["cloud_stale", "cloud", "--reason", "known outage"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(!hub.raised("cloud_stale", "cloud"));
    hub.wait_db("cloud_stale raised again", |db| {
        testkit::db::raised(db, "cloud_stale", "cloud")
    })
    .await;
    let (again, count): (String, i64) = hub
        .db()
        .query_row(
            "SELECT alert_id, count FROM alerts WHERE condition = 'cloud_stale'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_ne!(again, first, "a new alert");
    assert_eq!(count, 1, "looking again is not an occurrence");
    cloud
        .wait_until("the cloud hears it raised again", |c| {
            c.on("alerts")
                .any(|a| a["condition"] == "cloud_stale" && a["alert_id"] == again.as_str())
        })
        .await;
}
