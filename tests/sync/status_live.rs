//! `lockhub status` against a live daemon: the real binary running with a
//! real Mosquitto, events applied, a serial port that is not there. Status
//! reads the database the daemon is writing, without stopping it.

use std::time::{Duration, Instant};
use testkit::broker::{BrokerOptions, Mosquitto};
use testkit::cloud::{CloudClient, cloud, issue_many};
use testkit::daemon::DaemonOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_a_running_daemon_without_disturbing_it() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let (cloud_client, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;

    let mut c = cloud();
    let events = issue_many(&mut c, 0, 5);
    cloud_client.publish(&events).await;
    hub.wait_db("five events applied", |db| {
        db.query_row("SELECT watermark FROM seq_state", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap_or(0)
            == 5
    })
    .await;

    // The port in the config (/dev/ttyAMA0) does not exist here: the daemon
    // reports it absent once it has tried to open it.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let s = hub.status_json();
        let absent = s["links"].as_array().is_some_and(|l| {
            l.iter()
                .any(|p| p["serial"] == "board-a" && p["state"] == "absent")
        });
        if absent || Instant::now() > deadline {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status["keys"]["active"], 5, "{status}");
    assert_eq!(status["sync"]["watermark"], 5, "{status}");
    assert!(
        status["links"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["serial"] == "board-a" && p["state"] == "absent"),
        "{status}"
    );
    assert_eq!(status["clock"]["trusted"], true, "{status}");

    // Status took no lock the daemon needed: it still applies events.
    let more = issue_many(&mut c, 5, 1);
    cloud_client.publish(&more).await;
    hub.wait_db("the sixth event applied", |db| {
        db.query_row("SELECT watermark FROM seq_state", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap_or(0)
            == 6
    })
    .await;
    hub.assert_running();
}
