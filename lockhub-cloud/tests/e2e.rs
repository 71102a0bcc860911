//! End to end, as a building runs it: `lockhub-cloud` writes the hub's
//! bundle, `lockhub provision --bundle` turns it into the hub's files, the
//! real daemon runs on a pseudo-terminal board against real Mosquitto, and
//! `serve` carries the events. A PIN issued with `lockhub-cloud issue` opens
//! the door; after `revoke` it is denied; the hub's audit reaches the
//! cloud's records.

mod common;

use common::*;
use lockhub::sim::board::SimEvent;
use std::process::Child;
use testkit::board::pty::Pty;
use testkit::board::{Sim, board, count, relay_opened, until_linked};
use testkit::broker::Mosquitto;
use testkit::daemon::{Daemon, WAIT};

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn denied(door: u8) -> impl Fn(&SimEvent) -> bool {
    move |e| matches!(e, SimEvent::Denied { door: d, .. } if *d == door)
}

/// Steps the board (it must keep answering the hub) until the cloud's
/// records satisfy `f`.
async fn until_cloud(sim: &mut Sim, cloud: &Cloud, what: &str, f: impl Fn(&Cloud) -> bool) {
    let ok = sim.run_until(WAIT, |_| f(cloud)).await.unwrap();
    assert!(ok, "timed out waiting for {what}");
}

fn results(cloud: &Cloud, outcome: &str) -> i64 {
    cloud.sql(&format!(
        "SELECT count(*) FROM outputs WHERE topic = 'results' \
         AND json_extract(body, '$.outcome') = '{outcome}'"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_issued_by_the_cloud_opens_the_door_and_after_revoke_it_is_denied() {
    let broker = Mosquitto::start();
    let cloud = Cloud::new();
    let (mut sim, keep) = board(Pty::open(), 1);

    // The cloud writes the hub's bundle from the installer's template.
    let template = cloud.dir.path().join("template.json");
    std::fs::write(
        &template,
        format!(
            r#"{{"v":1,"site_id":"{SITE}","hub_id":"lobby","mqtt":{{"url":"{}"}},"trust":[],
               "serials":[{{"name":"board-a","port":"{}"}}],
               "doors":[{{"name":"101","serial":"board-a","index":0}}]}}"#,
            broker.url(),
            keep.path.display()
        ),
    )
    .unwrap();
    let bundle = cloud.dir.path().join("lobby.json");
    cloud.ok(&[
        "hub",
        "add",
        "--bundle",
        template.to_str().unwrap(),
        "--write-bundle",
        bundle.to_str().unwrap(),
    ]);

    // The installer provisions the hub from it and registers its key.
    let hub_dir = tempfile::tempdir().unwrap();
    let provisioned = std::process::Command::new(testkit::lockhub_bin())
        .args(["provision", "--json", "--bundle"])
        .arg(&bundle)
        .arg("--config")
        .arg(hub_dir.path().join("hub.toml"))
        .arg("--data-dir")
        .arg(hub_dir.path().join("data"))
        .output()
        .unwrap();
    assert!(
        provisioned.status.success(),
        "lockhub provision refused the cloud's bundle: {}",
        String::from_utf8_lossy(&provisioned.stderr)
    );
    let public = json(&String::from_utf8(provisioned.stdout).unwrap())["hub_public_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let hub = hub_ref("lobby");
    cloud.ok(&["hub", "set-key", &hub, &public]);

    let mut daemon = Daemon::at(hub_dir);
    daemon.spawn();
    until_linked(&mut sim).await;
    let url = broker.url();
    let _serve = KillOnDrop(
        cloud
            .command(&["serve", "--broker", &url, "--poll-ms", "100"])
            .spawn()
            .unwrap(),
    );

    let pin = cloud.pin_file("482913");
    let issued = json(&cloud.ok(&[
        "--json",
        "issue",
        &hub,
        "--check-in",
        "c-1",
        "--door",
        "101",
        "--pin-file",
        pin.to_str().unwrap(),
        "--valid-until",
        UNTIL,
    ]));
    until_cloud(&mut sim, &cloud, "the hub's applied result", |c| {
        results(c, "applied") == 1
    })
    .await;
    sim.take_events();
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap(),
        "the issued PIN opens door 101"
    );
    until_cloud(&mut sim, &cloud, "the grant in the cloud's audit", |c| {
        c.sql::<i64>(
            "SELECT count(*) FROM outputs WHERE topic = 'audit' \
             AND json_extract(body, '$.kind') = 'door.granted'",
        ) == 1
    })
    .await;
    let key_id = issued["key_id"].as_str().unwrap();
    let audit = cloud.ok(&["--json", "audit", "--hub", &hub]);
    assert!(audit.lines().any(|l| json(l)["body"]["key_id"] == key_id));

    cloud.ok(&["revoke", &hub, key_id]);
    until_cloud(&mut sim, &cloud, "the revoke applied", |c| {
        results(c, "applied") == 2
    })
    .await;
    sim.take_events();
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, denied(0)) == 1)
            .await
            .unwrap(),
        "the revoked PIN is denied"
    );
    assert_eq!(count(&sim, relay_opened(0)), 0);
    let hubs = json(
        &cloud
            .ok(&["--json", "hubs"])
            .lines()
            .find(|l| l.contains("lobby"))
            .unwrap()
            .to_owned(),
    );
    assert_eq!(hubs["state"], "online");
    assert_eq!(hubs["last_result_seq"], 2);
    assert_eq!(hubs["refused"], 0);
    daemon.sigterm();
}
