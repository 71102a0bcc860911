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
use testkit::board::pty::Pty;
use testkit::board::{Sim, board, count, relay_opened, until_linked};
use testkit::broker::{BrokerOptions, Mosquitto};
use testkit::daemon::{Daemon, WAIT};

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
    serve: KillOnDrop,
    hub: String,
}

impl Building {
    /// `serve` as the building runs it. Checkpoints every 2 s stand for the
    /// 5-minute round: what a small broker queue drops even from a sync
    /// answer, the next checkpoint's head shows the hub, and it asks again;
    /// and each checkpoint's claim gets its proof within seconds.
    fn start_serve(cloud: &Cloud, url: &str) -> KillOnDrop {
        KillOnDrop(
            cloud
                .command(&[
                    "serve",
                    "--broker",
                    url,
                    "--poll-ms",
                    "100",
                    "--checkpoint-every-s",
                    "2",
                ])
                .spawn()
                .unwrap(),
        )
    }

    /// Stops `serve` (SIGKILL: what a crash leaves) and starts it again.
    fn restart_serve(&mut self, between: impl FnOnce(&Cloud)) {
        let _ = self.serve.0.kill();
        let _ = self.serve.0.wait();
        between(&self.cloud);
        self.serve = Building::start_serve(&self.cloud, &self.broker.url());
    }
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
    let out = json(&String::from_utf8(provisioned.stdout).unwrap());
    let public = out["hub_public_key"].as_str().unwrap().to_owned();
    // The board's link key, as `lockhub board pair` would have written it
    // (tests/cli covers pairing itself): the link is sealed, as shipped.
    assert_eq!(out["boards_to_pair"], serde_json::json!(["board-a"]));
    let secrets = std::path::PathBuf::from(out["secrets"].as_str().unwrap());
    let mut text = std::fs::read_to_string(&secrets).unwrap();
    text.push_str(&testkit::files::board_key_toml(
        "board-a",
        &testkit::files::board_key_for("board-a"),
    ));
    testkit::files::write_private(&secrets, &text).unwrap();
    let hub = hub_ref("lobby");
    cloud.ok(&["hub", "set-key", &hub, &public]);

    let mut daemon = Daemon::at(hub_dir);
    daemon.spawn();
    until_linked(&mut sim).await;
    let serve = Building::start_serve(&cloud, &broker.url());

    Building {
        broker,
        cloud,
        sim,
        _keep: keep,
        daemon,
        serve,
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
    issue_on(&b.cloud, &b.hub, check_in, pin, &[])
}

/// [`issue`] with the cloud and hub given apart (while `serve` is down),
/// and `extra` flags.
fn issue_on(
    cloud: &Cloud,
    hub: &str,
    check_in: &str,
    pin: &str,
    extra: &[&str],
) -> serde_json::Value {
    let pin = cloud.pin_file(pin);
    let args = cloud.issue_args(check_in, &pin, extra);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args[2] = hub;
    json(&cloud.ok(&args))
}

/// Waits (stepping the board) until `f` holds for the hub's daemon.
async fn until_hub(sim: &mut Sim, daemon: &Daemon, what: &str, f: impl Fn(&Daemon) -> bool) {
    let ok = sim.run_until(WAIT, |_| f(daemon)).await.unwrap();
    assert!(ok, "{what}; the hub's log ends:\n{}", daemon.log_tail(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_killed_while_publishing_and_restarted_leaves_no_seq_gap_and_no_seq_used_twice() {
    let mut b = building(BrokerOptions::default()).await;
    let first = issue(&b, "c-0", "600000");
    until_cloud(&mut b.sim, &b.cloud, "the first result", |c| {
        applied(c, &first["seq"])
    })
    .await;
    // 30 events while serve publishes them; SIGKILL right after the last
    // is stored (some published, some not), 10 more while it is down.
    for n in 1..=30 {
        issue(&b, &format!("c-{n}"), &format!("6{n:05}"));
    }
    let hub = b.hub.clone();
    b.restart_serve(|cloud| {
        for n in 31..=40 {
            issue_on(cloud, &hub, &format!("c-{n}"), &format!("6{n:05}"), &[]);
        }
        assert!(
            cloud.sql::<i64>("SELECT count(*) FROM events WHERE published_at IS NULL") >= 10,
            "events stored and not published when serve starts again"
        );
    });
    let (sim, daemon) = (&mut b.sim, &b.daemon);
    until_hub(sim, daemon, "the hub saw every seq to 41", |d| {
        d.watermark() == 41
    })
    .await;
    let cloud = &b.cloud;
    assert_eq!(
        cloud.sql::<String>(
            "SELECT count(*) || ' ' || count(DISTINCT seq) || ' ' || min(seq) || ' ' || max(seq) \
             || ' ' || count(DISTINCT event_id) FROM events"
        ),
        "41 41 1 41 41",
        "seqs 1..=41, each once, each one event"
    );
    let hub_db = rusqlite::Connection::open(b.daemon.db_path()).unwrap();
    let active: i64 = hub_db
        .query_row(
            "SELECT count(*) FROM keys WHERE state = 'active'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(active, 41, "every event applied once on the hub");
    assert_eq!(lobby(cloud)["head_seq"], 41);
    // Every event marked published in the end (its PUBACK may come after
    // the hub has it, and the marks are committed in batches).
    until_cloud(&mut b.sim, &b.cloud, "every event marked published", |c| {
        lobby(c)["unpublished"] == 0
    })
    .await;
    b.daemon.sigterm();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_output_whose_signature_fails_is_refused_and_reported_and_nothing_of_it_recorded() {
    let mut b = building(BrokerOptions::default()).await;
    let first = issue(&b, "c-0", "700000");
    until_cloud(&mut b.sim, &b.cloud, "the first result", |c| {
        applied(c, &first["seq"])
    })
    .await;
    let real_key = b
        .cloud
        .sql::<String>("SELECT public_key FROM hubs WHERE hub_id = 'lobby'");
    // The cloud now holds another key for the hub (a hub re-provisioned
    // without telling the cloud, or someone signing as it): every output
    // the real hub signs fails verification.
    let other = lockhub_proto::crypto::b64u_encode(
        ed25519_dalek::SigningKey::from_bytes(&[9; 32])
            .verifying_key()
            .as_bytes(),
    );
    b.cloud.ok(&["hub", "set-key", &b.hub, &other]);
    let second = issue(&b, "c-1", "700001");
    until_cloud(&mut b.sim, &b.cloud, "the hub's result refused", |c| {
        lobby(c)["refused"].as_u64().unwrap_or(0) > 0
    })
    .await;
    let cloud = &b.cloud;
    assert!(
        cloud.sql::<i64>("SELECT count(*) FROM refused WHERE topic = 'results'") > 0,
        "the refusal is recorded with its topic"
    );
    assert!(!applied(cloud, &second["seq"]), "nothing of it recorded");
    assert_eq!(
        cloud.sql::<i64>(
            "SELECT count(*) FROM refused \
             WHERE reason <> 'the signature does not verify under the hub''s key'"
        ),
        0,
        "every refusal says the signature failed"
    );
    // The key set right again: the result the cloud refused comes again
    // (serve re-sends an event whose result never came) and is recorded.
    b.cloud.ok(&["hub", "set-key", &b.hub, &real_key]);
    until_cloud(&mut b.sim, &b.cloud, "the result recorded at last", |c| {
        c.sql::<i64>(&format!(
            "SELECT count(*) FROM outputs WHERE topic = 'results' AND json_extract(body, '$.seq') = {}",
            second["seq"]
        )) > 0
    })
    .await;
    b.daemon.sigterm();
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
    let issued = issue_on(cloud, hub, "c-1", "482913", &[]);
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
    let issued = issue_on(
        cloud,
        hub,
        "c-once",
        "705318",
        &[
            "--uses",
            "1",
            // Every hour of every day: the schedule travels and is kept, and
            // this test does not depend on the hour it runs at.
            "--schedule",
            "mon-sun 00:00-24:00",
        ],
    );
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

// The drift cases (docs/protocol/mqtt.md 'Mirror proof'): a hub restored
// from an old copy, a cloud restored from an old backup, a key row changed
// by hand, and mirror requests repeated or reordered. `serve`'s checkpoints
// every 2 s carry its claim, so each case converges in seconds.

/// The newest recorded output's id: what is recorded later is above it.
fn mark(cloud: &Cloud) -> i64 {
    cloud.sql("SELECT coalesce(max(id), 0) FROM outputs")
}

/// The last seq the cloud signed for the lobby hub.
fn head(cloud: &Cloud) -> i64 {
    cloud.sql("SELECT next_seq - 1 FROM hubs WHERE hub_id = 'lobby'")
}

/// Whether a matching proof covering `head` was recorded after `after`.
fn proven(cloud: &Cloud, head: i64, after: i64) -> bool {
    cloud.sql::<i64>(&format!(
        "SELECT count(*) FROM outputs WHERE id > {after} AND topic = 'proof' \
         AND json_type(body, '$.match') = 'true' AND json_extract(body, '$.head_seq') >= {head}"
    )) > 0
}

/// Whether the hub's `mirror_diverged` alert was recorded in `state` after `after`.
fn diverged(cloud: &Cloud, state: &str, after: i64) -> bool {
    cloud.sql::<i64>(&format!(
        "SELECT count(*) FROM outputs WHERE id > {after} AND topic = 'alerts' \
         AND json_extract(body, '$.condition') = 'mirror_diverged' \
         AND json_extract(body, '$.state') = '{state}'"
    )) > 0
}

/// Waits until every stored event has the hub's result.
async fn settle(b: &mut Building) {
    until_cloud(&mut b.sim, &b.cloud, "every result in", |c| {
        c.sql::<i64>("SELECT count(*) FROM events WHERE result_outcome IS NULL") == 0
    })
    .await;
}

/// A building whose hub holds three keys (PINs `pin_base` 1..=3), once a
/// proof of them matched.
async fn proven_building(pin_base: &str) -> (Building, Vec<String>) {
    let mut b = building(BrokerOptions::default()).await;
    let keys: Vec<String> = (1..=3)
        .map(|n| key_id(&issue(&b, &format!("c-{n}"), &format!("{pin_base}{n}"))))
        .collect();
    settle(&mut b).await;
    until_cloud(&mut b.sim, &b.cloud, "a first matching proof", |c| {
        proven(c, 3, 0)
    })
    .await;
    (b, keys)
}

/// Types `pin` at door 101; whether the relay opened (else the hub denied).
async fn opens(sim: &mut Sim, pin: &str) -> bool {
    sim.take_events();
    sim.enter_pin(0, pin);
    let answered = sim
        .run_until(WAIT, |s| {
            count(s, relay_opened(0)) == 1 || count(s, denied(0)) == 1
        })
        .await
        .unwrap();
    assert!(answered, "the hub answers the keypad");
    count(sim, relay_opened(0)) == 1
}

/// `issue` or `checkin` on the lobby hub for door 101 until `UNTIL`, with
/// `ids` (`--reservation R`, `--check-in C`) and the PIN in a file.
fn grant(b: &Building, command: &str, ids: &[&str], pin: &str) -> serde_json::Value {
    let pin = b.cloud.pin_file(pin);
    let mut args = vec!["--json", command, &b.hub];
    args.extend_from_slice(ids);
    args.extend_from_slice(&["--door", "101", "--pin-file", pin.to_str().unwrap()]);
    args.extend_from_slice(&["--valid-until", UNTIL]);
    json(&b.cloud.ok(&args))
}

/// A pre-issued key for a reservation.
fn reserve(b: &Building, reservation: &str, pin: &str) -> serde_json::Value {
    grant(b, "issue", &["--reservation", reservation], pin)
}

/// The check-in of a reservation: its pre-issued keys give way.
fn check_in(b: &Building, reservation: &str, check_in: &str, pin: &str) -> serde_json::Value {
    grant(
        b,
        "checkin",
        &["--reservation", reservation, "--check-in", check_in],
        pin,
    )
}

/// A consistent copy of a live SQLite file (what a backup tool takes).
fn snapshot(db: &std::path::Path, to: &std::path::Path) {
    let c = rusqlite::Connection::open(db).unwrap();
    c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    c.execute("VACUUM INTO ?1", [to.to_str().unwrap()]).unwrap();
}

/// Puts `copy` where the database `db` was (its WAL and shared memory gone).
fn restore(db: &std::path::Path, copy: &std::path::Path) {
    for ext in ["", "-wal", "-shm"] {
        let mut p = db.as_os_str().to_owned();
        p.push(ext);
        let _ = std::fs::remove_file(p);
    }
    std::fs::copy(copy, db).unwrap();
}

/// The state of a key in the hub's database, with its revoke reason.
fn hub_key_state(daemon: &Daemon, key_id: &str) -> (String, Option<String>) {
    daemon
        .db()
        .query_row(
            "SELECT state, revoke_reason FROM keys WHERE key_id = ?1",
            [key_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
}

fn key_id(v: &serde_json::Value) -> String {
    v["key_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_restored_from_a_copy_20_events_old_asks_for_sync_converges_and_its_proof_matches() {
    let mut b = building(BrokerOptions::default()).await;
    let a = issue(&b, "c-a", "600001");
    let pre = reserve(&b, "r-1", "600002");
    settle(&mut b).await;
    let copy = b.cloud.dir.path().join("hub-copy.db");
    snapshot(&b.daemon.db_path(), &copy);

    // 20 events after the copy: a revoke, a check-in, 18 new keys.
    b.cloud.ok(&["revoke", &b.hub, &key_id(&a)]);
    let checked_in = check_in(&b, "r-1", "c-r1", "600003");
    for n in 0..18 {
        issue(&b, &format!("c-{n}"), &format!("61{n:04}"));
    }
    settle(&mut b).await;
    assert_eq!(head(&b.cloud), 22);
    assert_eq!(b.daemon.watermark(), 22);

    // The hub's disk is replaced by the copy: it has seen seqs 1..=2 only.
    assert!(b.daemon.sigterm(), "the hub stops cleanly");
    restore(&b.daemon.db_path(), &copy);
    assert_eq!(b.daemon.watermark(), 2, "the copy's watermark");
    let before = mark(&b.cloud);
    b.daemon.spawn();
    until_cloud(&mut b.sim, &b.cloud, "a matching proof at head 22", |c| {
        proven(c, 22, before)
    })
    .await;
    assert_eq!(b.daemon.watermark(), 22, "converged");
    assert!(
        b.cloud.sql::<i64>(&format!(
            "SELECT count(*) FROM outputs WHERE id > {before} AND topic = 'sync'"
        )) > 0,
        "the hub asked for what its copy lacked"
    );
    assert_eq!(head(&b.cloud), 22, "nothing needed repairing");
    assert_eq!(hub_key_state(&b.daemon, &key_id(&a)).0, "revoked");
    assert_eq!(hub_key_state(&b.daemon, &key_id(&pre)).0, "revoked");
    assert_eq!(hub_key_state(&b.daemon, &key_id(&checked_in)).0, "active");
    assert!(
        !opens(&mut b.sim, "600001").await,
        "the revoked key stays denied"
    );
    assert!(
        opens(&mut b.sim, "600003").await,
        "the check-in's key opens"
    );
    b.daemon.sigterm();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_restored_from_a_backup_20_events_old_moves_its_counter_past_the_hub_and_repairs_until_the_proof_matches()
 {
    let mut b = building(BrokerOptions::default()).await;
    let a = issue(&b, "c-a", "700001");
    let pre = reserve(&b, "r-1", "700002");
    settle(&mut b).await;
    let backup = b.cloud.dir.path().join("cloud-backup.db");
    snapshot(&b.cloud.db(), &backup);

    // 20 events the backup does not hold: a revoke, a check-in, 18 keys.
    b.cloud.ok(&["revoke", &b.hub, &key_id(&a)]);
    let checked_in = check_in(&b, "r-1", "c-r1", "700003");
    let mut later = Vec::new();
    for n in 0..18 {
        later.push(key_id(&issue(&b, &format!("c-{n}"), &format!("71{n:04}"))));
    }
    settle(&mut b).await;
    assert_eq!(b.daemon.watermark(), 22);
    assert!(
        !opens(&mut b.sim, "700001").await,
        "revoked before the restore"
    );

    // The cloud's database comes back from the backup: it believes seq 2 is
    // its head, and that the revoked key and the pre-issued one are live.
    let mut before = 0;
    b.restart_serve(|c| {
        restore(&c.db(), &backup);
        assert_eq!(head(c), 2);
        before = mark(c);
    });
    assert!(
        !opens(&mut b.sim, "700001").await,
        "still denied after the restore"
    );
    until_cloud(&mut b.sim, &b.cloud, "a matching proof past head 22", |c| {
        proven(c, 23, before)
    })
    .await;

    // The hub said it was ahead (once per checkpoint at the old head it
    // got); the counter moved past its watermark.
    assert!(
        b.cloud.sql::<i64>(&format!(
            "SELECT count(*) FROM outputs WHERE id > {before} AND topic = 'proof' \
             AND json_type(body, '$.match') = 'null' AND json_extract(body, '$.watermark') = 22"
        )) >= 1
    );
    let c = rusqlite::Connection::open(b.cloud.db()).unwrap();
    let seqs: Vec<(i64, String)> = c
        .prepare("SELECT seq, type FROM events WHERE seq > 2 ORDER BY seq")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        seqs[0].0, 23,
        "the first new seq is past the hub's watermark"
    );
    assert_eq!(
        b.cloud.sql::<i64>(&format!(
            "SELECT count(*) FROM outputs WHERE id > {before} AND topic = 'results' \
             AND json_extract(body, '$.reason') = 'stale_seq'"
        )),
        0,
        "no seq the hub had seen was signed again"
    );
    // The repairs: the keys the backup never knew are revoked (reconcile);
    // the revoked and the superseded key were offered again, refused by
    // the hub, and are recorded as revoked here.
    for k in later.iter().chain([&key_id(&checked_in)]) {
        assert_eq!(
            hub_key_state(&b.daemon, k),
            ("revoked".into(), Some("reconcile".into())),
            "{k}"
        );
    }
    for k in [key_id(&a), key_id(&pre)] {
        let state: String = c
            .query_row("SELECT state FROM keys WHERE key_id = ?1", [&k], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(state, "revoked", "the cloud records {k} revoked");
        assert_eq!(hub_key_state(&b.daemon, &k).0, "revoked");
    }
    assert!(diverged(&b.cloud, "raised", before));
    until_cloud(&mut b.sim, &b.cloud, "mirror_diverged cleared", |c| {
        diverged(c, "cleared", before)
    })
    .await;
    assert!(
        !opens(&mut b.sim, "700001").await,
        "the revoked key never opened"
    );
    assert!(!opens(&mut b.sim, "700002").await, "nor the superseded one");
    b.daemon.sigterm();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_row_deleted_or_changed_by_hand_on_the_hub_is_found_by_the_next_proof_and_repaired() {
    let (mut b, keys) = proven_building("80000").await;

    // Deleted: the cloud issues it again, as first signed.
    let before = mark(&b.cloud);
    testkit::db::delete_key_by_hand(&b.daemon.db_path(), &keys[1]);
    until_cloud(&mut b.sim, &b.cloud, "the repair proven", |c| {
        proven(c, 4, before)
    })
    .await;
    assert!(
        diverged(&b.cloud, "raised", before),
        "mirror_diverged raised"
    );
    until_cloud(&mut b.sim, &b.cloud, "mirror_diverged cleared", |c| {
        diverged(c, "cleared", before)
    })
    .await;
    let repair: (String, Vec<u8>) = rusqlite::Connection::open(b.cloud.db())
        .unwrap()
        .query_row("SELECT type, body FROM events WHERE seq = 4", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(repair.0, "key.issued");
    let body: serde_json::Value = serde_json::from_slice(&repair.1).unwrap();
    assert_eq!(body["key"]["key_id"], keys[1].as_str());
    assert_eq!(body["key"]["version"], 1);
    assert!(opens(&mut b.sim, "800002").await, "the key is back");

    // Changed: a window stretched by a day (the schema wants a higher
    // version for that, so the hand edit raises it too). The cloud's terms
    // come back at a version above both.
    let before = mark(&b.cloud);
    let w = rusqlite::Connection::open(b.daemon.db_path()).unwrap();
    w.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    w.execute(
        "UPDATE keys SET valid_until = valid_until + 86400000000, version = version + 1 \
         WHERE key_id = ?1",
        [&keys[2]],
    )
    .unwrap();
    drop(w);
    until_cloud(&mut b.sim, &b.cloud, "the second repair proven", |c| {
        proven(c, 5, before)
    })
    .await;
    let version: i64 = b
        .daemon
        .db()
        .query_row(
            "SELECT version FROM keys WHERE key_id = ?1",
            [&keys[2]],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, 3);
    assert!(diverged(&b.cloud, "raised", before));
    until_cloud(&mut b.sim, &b.cloud, "mirror_diverged cleared again", |c| {
        diverged(c, "cleared", before)
    })
    .await;
    b.daemon.sigterm();
}

/// Publishes `payloads` on the lobby hub's events topic, as the cloud
/// would, and waits for each PUBACK.
async fn publish_events(b: &Building, payloads: Vec<Vec<u8>>) {
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
    let mut o = MqttOptions::new("test-replayer", "127.0.0.1", b.broker.port);
    o.set_max_packet_size(1 << 21, 1 << 21);
    let (client, mut eventloop) = AsyncClient::new(o, 16);
    let topic = format!("lockhub/v1/{}/events", b.hub);
    let n = payloads.len();
    for p in payloads {
        client
            .publish(&topic, QoS::AtLeastOnce, false, p)
            .await
            .unwrap();
    }
    let mut acked = 0;
    while acked < n {
        match tokio::time::timeout(WAIT, eventloop.poll()).await {
            Ok(Ok(Event::Incoming(Packet::PubAck(_)))) => acked += 1,
            Ok(Ok(_)) => {}
            other => panic!("publishing the replayed requests: {other:?}"),
        }
    }
    client.disconnect().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_request_repeated_or_reordered_changes_nothing() {
    let (mut b, keys) = proven_building("90000").await;
    let as_of: String = b.cloud.sql(
        "SELECT json_extract(body, '$.as_of') FROM outputs WHERE topic = 'proof' \
         AND json_type(body, '$.match') = 'true' ORDER BY id DESC LIMIT 1",
    );
    let as_of = lockhub_proto::time::Timestamp::parse_rfc3339(&as_of).unwrap();
    let hub_keys = |d: &Daemon| -> Vec<(String, i64, String, i64)> {
        d.db()
            .prepare("SELECT key_id, version, state, valid_until FROM keys ORDER BY key_id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let keys_before = hub_keys(&b.daemon);

    // Two requests signed by the cloud's signer, the later one sent first,
    // and the first one sent twice.
    let store = lockhub_cloud::store::SqliteStore::open(&b.cloud.db(), false).unwrap();
    let active = lockhub_cloud::signer::load_active(&store, &b.cloud.db()).unwrap();
    let hub = lockhub_cloud::request::parse_hub_ref(&b.hub).unwrap();
    let b1 = lockhub_proto::mirror::bucket_of(&keys[0]);
    let b2 = lockhub_proto::mirror::bucket_of(&keys[1]);
    let first = lockhub_cloud::ops::mirror_request(&active, &hub, as_of, &[b1]);
    let second =
        lockhub_cloud::ops::mirror_request(&active, &hub, as_of, &[b2, b2.wrapping_add(1)]);
    let before = mark(&b.cloud);
    let head_before = head(&b.cloud);
    publish_events(
        &b,
        vec![second.envelope, first.envelope.clone(), first.envelope],
    )
    .await;
    let answers = |c: &Cloud| -> i64 {
        c.sql(&format!(
            "SELECT count(*) FROM outputs WHERE id > {before} AND topic = 'proof' \
             AND json_extract(body, '$.bucket') IS NOT NULL"
        ))
    };
    until_cloud(&mut b.sim, &b.cloud, "the hub's bucket answers", |c| {
        answers(c) >= 3
    })
    .await;
    let after_answers = mark(&b.cloud);
    until_cloud(&mut b.sim, &b.cloud, "the next matching proof", |c| {
        proven(c, head_before, after_answers)
    })
    .await;
    assert_eq!(
        answers(&b.cloud),
        3,
        "one answer per bucket asked for, none for the repeat"
    );
    assert_eq!(head(&b.cloud), head_before, "no repair signed");
    assert_eq!(
        hub_keys(&b.daemon),
        keys_before,
        "the hub's keys are as they were"
    );
    assert!(!diverged(&b.cloud, "raised", before));
    b.daemon.sigterm();
}
