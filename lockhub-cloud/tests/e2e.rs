//! End to end, as a building runs it: `lockhub-cloud` writes the hub's
//! bundle, `lockhub provision --bundle` turns it into the hub's files, the
//! real daemon runs on a pseudo-terminal board against real Mosquitto, and
//! `serve` carries the events. A PIN issued with `lockhub-cloud issue` opens
//! the door; after `revoke` it is denied; the hub's audit reaches the
//! cloud's records.
//!
//! The daemon is the `lockhub` binary beside this test (testkit's
//! `lockhub_bin`): `cargo test --workspace` (scripts/test) builds it; alone,
//! run `cargo build -p lockhub` first, or the test runs an old one.

mod common;

use common::*;
use firmware_bridge::Downlink;
use lockhub::sim::board::SimEvent;
use std::process::Child;
use testkit::board::pty::Pty;
use testkit::board::{Sim, board, count, relay_opened, until_linked};
use testkit::broker::{BrokerOptions, Mosquitto};
use testkit::daemon::{Daemon, WAIT};

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The hub's `Deny` for `door` reached the board (a relay still open from
/// the grant a moment ago hides the board's own deny feedback).
fn denied(door: u8) -> impl Fn(&SimEvent) -> bool {
    move |e| matches!(e, SimEvent::Received(Downlink::Deny { door: d, .. }) if *d == door)
}

/// Steps the board (it must keep answering the hub) until the cloud's
/// records satisfy `f`.
async fn until_cloud(sim: &mut Sim, cloud: &Cloud, what: &str, f: impl Fn(&Cloud) -> bool) {
    let ok = sim.run_until(WAIT, |_| f(cloud)).await.unwrap();
    if !ok {
        let c = rusqlite::Connection::open(cloud.db()).unwrap();
        let mut st = c
            .prepare("SELECT topic, body FROM outputs ORDER BY id DESC LIMIT 15")
            .unwrap();
        let last: Vec<String> = st
            .query_map([], |r| {
                Ok(format!(
                    "{}: {}",
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?
                ))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        panic!(
            "timed out waiting for {what}; the cloud's view:\n{}\nits last records, newest first:\n{}",
            cloud.ok(&["hubs"]),
            last.join("\n")
        );
    }
}

/// Whether the hub's result for `seq` says `applied` (a re-sent event's
/// result comes again, marked duplicate: counting rows would count it twice).
fn applied(cloud: &Cloud, seq: &serde_json::Value) -> bool {
    cloud.sql::<i64>(&format!(
        "SELECT count(*) FROM outputs WHERE topic = 'results' \
         AND json_extract(body, '$.seq') = {seq} AND json_extract(body, '$.outcome') = 'applied'"
    )) > 0
}

/// A building: Mosquitto, the cloud with `serve` running, and one hub
/// (`lobby`, door 101 on a pty board) provisioned from the cloud's bundle.
struct Building {
    broker: Mosquitto,
    cloud: Cloud,
    sim: Sim,
    _keep: testkit::board::PtyKeep,
    daemon: Daemon,
    _serve: KillOnDrop,
    hub: String,
}

async fn building(opts: BrokerOptions) -> Building {
    let broker = Mosquitto::start_with(opts);
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
    let serve = KillOnDrop(
        cloud
            // Checkpoints every 2 s stand for the 5-minute round: what
            // a small broker queue drops even from a sync answer, the next
            // checkpoint's head shows the hub, and it asks again.
            .command(&[
                "serve",
                "--broker",
                &url,
                "--poll-ms",
                "100",
                "--checkpoint-every-s",
                "2",
            ])
            .spawn()
            .unwrap(),
    );

    Building {
        broker,
        cloud,
        sim,
        _keep: keep,
        daemon,
        _serve: serve,
        hub,
    }
}

/// The `hubs` line of the lobby hub.
fn lobby(cloud: &Cloud) -> serde_json::Value {
    let all = cloud.ok(&["--json", "hubs"]);
    json(
        all.lines()
            .find(|l| l.contains("/lobby"))
            .expect("the lobby hub"),
    )
}

/// Issues a key for `check_in` with its own PIN (two live keys may not
/// share a PIN on a door).
fn issue(b: &Building, check_in: &str, pin: &str) -> serde_json::Value {
    let pin = b.cloud.pin_file(pin);
    let args = b.cloud.issue_args(check_in, &pin, &[]);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args[2] = &b.hub;
    json(&b.cloud.ok(&args))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_issued_by_the_cloud_opens_the_door_and_after_revoke_it_is_denied() {
    let mut b = building(BrokerOptions::default()).await;
    let Building {
        cloud,
        sim,
        hub,
        daemon,
        ..
    } = &mut b;
    let (cloud, hub) = (&*cloud, hub.as_str());
    let pin = cloud.pin_file("482913");
    let issued = json(&cloud.ok(&[
        "--json",
        "issue",
        hub,
        "--check-in",
        "c-1",
        "--door",
        "101",
        "--pin-file",
        pin.to_str().unwrap(),
        "--valid-until",
        UNTIL,
    ]));
    until_cloud(sim, cloud, "the hub's applied result", |c| {
        applied(c, &issued["seq"])
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
    until_cloud(sim, cloud, "the grant in the cloud's audit", |c| {
        c.sql::<i64>(
            "SELECT count(*) FROM outputs WHERE topic = 'audit' \
             AND json_extract(body, '$.kind') = 'door.granted'",
        ) == 1
    })
    .await;
    let key_id = issued["key_id"].as_str().unwrap();
    let audit = cloud.ok(&["--json", "audit", "--hub", hub]);
    assert!(audit.lines().any(|l| json(l)["body"]["key_id"] == key_id));

    let revoked = json(&cloud.ok(&["--json", "revoke", hub, key_id]));
    until_cloud(sim, cloud, "the revoke applied", |c| {
        applied(c, &revoked["seq"])
    })
    .await;
    sim.take_events();
    sim.enter_pin(0, "482913");
    let answered = sim
        .run_until(WAIT, |s| count(s, denied(0)) == 1)
        .await
        .unwrap();
    assert!(
        answered,
        "the revoked PIN is denied; the board saw {:?}; the hub's log ends:\n{}",
        sim.events().collect::<Vec<_>>(),
        daemon.log_tail(30)
    );
    assert_eq!(count(sim, relay_opened(0)), 0);
    let hubs = lobby(cloud);
    assert_eq!(hubs["state"], "online");
    assert_eq!(hubs["last_result_seq"], 2);
    assert_eq!(hubs["refused"], 0);
    daemon.sigterm();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_offline_past_the_brokers_queue_limit_converges_through_serves_sync_answer() {
    let mut b = building(BrokerOptions {
        max_queued_messages: Some(5),
        ..BrokerOptions::default()
    })
    .await;
    let first = issue(&b, "c-0", "500000");
    until_cloud(&mut b.sim, &b.cloud, "the first result", |c| {
        applied(c, &first["seq"])
    })
    .await;
    assert!(b.daemon.sigterm(), "the hub stops cleanly");

    // 20 events while the hub is away: the broker keeps 5 of them.
    for n in 1..=20 {
        issue(&b, &format!("c-{n}"), &format!("5{n:05}"));
    }
    let cloud = &b.cloud;
    let deadline = std::time::Instant::now() + WAIT;
    while cloud.sql::<i64>("SELECT count(*) FROM events WHERE published_at IS NULL") > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "serve published all 21"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(b.broker.is_running());

    b.daemon.spawn();
    // Converged: the hub has seen every seq up to the head. (The cloud's own
    // record of the results may miss some: the same small queue drops what
    // the hub sends in a burst to a slow subscriber.)
    let (sim, daemon) = (&mut b.sim, &b.daemon);
    let converged = sim
        .run_until(WAIT, |_| daemon.watermark() == 21)
        .await
        .unwrap();
    assert!(converged, "the hub's watermark is {}", daemon.watermark());
    let hubs = lobby(&b.cloud);
    assert!(
        hubs["last_sync_from"].as_u64().is_some_and(|f| f > 1),
        "the hub asked for what the broker dropped: {hubs}"
    );
    let applied: i64 = rusqlite::Connection::open(b.daemon.db_path())
        .unwrap()
        .query_row(
            "SELECT count(*) FROM keys WHERE state = 'active'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        applied, 21,
        "every key the cloud issued is active on the hub"
    );
    assert_eq!(
        b.cloud
            .sql::<i64>("SELECT count(DISTINCT event_id) FROM events"),
        21,
        "every re-sent event was an original, none signed twice"
    );
    b.daemon.sigterm();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_time_code_issued_with_uses_1_opens_once_and_the_hub_reports_it_used_up() {
    let mut b = building(BrokerOptions::default()).await;
    let Building {
        cloud,
        sim,
        hub,
        daemon,
        ..
    } = &mut b;
    let (cloud, hub) = (&*cloud, hub.as_str());
    let pin = cloud.pin_file("705318");
    let issued = json(&cloud.ok(&[
        "--json",
        "issue",
        hub,
        "--check-in",
        "c-once",
        "--door",
        "101",
        "--pin-file",
        pin.to_str().unwrap(),
        "--valid-until",
        UNTIL,
        "--uses",
        "1",
        // Every hour of every day: the schedule travels and is kept, and
        // this test does not depend on the hour it runs at.
        "--schedule",
        "mon-sun 00:00-24:00",
    ]));
    until_cloud(sim, cloud, "the hub's applied result", |c| {
        applied(c, &issued["seq"])
    })
    .await;
    sim.take_events();
    sim.enter_pin(0, "705318");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap(),
        "the one-time code opens door 101 once"
    );
    until_cloud(sim, cloud, "key.used_up in the cloud's audit", |c| {
        c.sql::<i64>(
            "SELECT count(*) FROM outputs WHERE topic = 'audit' \
             AND json_extract(body, '$.kind') = 'key.used_up'",
        ) == 1
    })
    .await;
    sim.take_events();
    sim.enter_pin(0, "705318");
    let answered = sim
        .run_until(WAIT, |s| count(s, denied(0)) == 1)
        .await
        .unwrap();
    assert!(
        answered,
        "the used code is denied; the hub's log ends:\n{}",
        daemon.log_tail(30)
    );
    assert_eq!(count(sim, relay_opened(0)), 0);
    daemon.sigterm();
}
