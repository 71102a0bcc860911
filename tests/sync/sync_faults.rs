//! Fault injection against the real daemon binary and a real Mosquitto:
//! SIGKILL mid-flood, the hub offline while events queue up, a broker
//! restart under a running hub, a broker that drops queued events (gap and
//! behind-checkpoint sync requests answered by the test as the cloud), and
//! the outbox holding records while the broker is away.
//!
//! Every wait is a poll with a deadline ([`testkit::daemon::WAIT`]); the few
//! fixed pauses are windows in which something must *not* happen.

use lockhub::config::{PinKey, Policy};
use lockhub::door::pin_tags;
use lockhub::store::door::{DoorEntry, door_entry};
use lockhub::store::{Priority, Store};
use lockhub_proto::sign::SignedEvent;
use lockhub_proto::time::Timestamp;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use testkit::broker::{AnyBroker, Rumqttd};
use testkit::broker::{BrokerOptions, Mosquitto};
use testkit::cloud::{CloudClient, assert_answered_once, cloud, issue_many, pin_key};
use testkit::daemon::{Daemon, DaemonOptions};

fn seqs_applied(n: i64) -> impl Fn(&rusqlite::Connection) -> bool {
    move |db| {
        let (dedupe, w): (i64, i64) = db
            .query_row(
                "SELECT (SELECT count(*) FROM dedupe), (SELECT watermark FROM seq_state)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        dedupe >= n && w >= n
    }
}

fn active_keys(hub: &Daemon) -> i64 {
    hub.count("SELECT count(*) FROM keys WHERE state = 'active'")
}

/// Asserts that no sync request arrives during `window` (after letting
/// anything already queued drain for a moment).
async fn assert_no_more_sync_requests(cloud: &mut CloudClient, window: Duration) {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cloud.drain();
    let before = cloud.sync_requests().len();
    tokio::time::sleep(window).await;
    cloud.drain();
    let after: Vec<_> = cloud.sync_requests()[before..]
        .iter()
        .map(|r| r.to_string())
        .collect();
    assert!(
        after.is_empty(),
        "sync requests went on after catching up: {after:?}"
    );
}

/// SIGKILL mid-flood, then a restart: every event applied once and answered.
/// (This test found a deadlock: the poll task awaited a full channel while
/// ingest waited for rumqttc to take its acks, which it could not while the
/// poll task was not polling. The poll task now parks instead of waiting.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_in_the_middle_of_a_flood_loses_nothing_and_applies_each_event_once() {
    // Room for the whole flood while the hub is dead: this test is about the
    // crash, not about the broker dropping (that is the gap test).
    sigkill_mid_flood(AnyBroker::Mosquitto(Mosquitto::start_with(BrokerOptions {
        max_inflight_messages: Some(100),
        max_queued_messages: Some(10_000),
        ..Default::default()
    })))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_in_the_middle_of_a_flood_loses_nothing_through_rumqttd_either() {
    sigkill_mid_flood(AnyBroker::Rumqttd(Rumqttd::start())).await;
}

async fn sigkill_mid_flood(broker: AnyBroker) {
    let t0 = Instant::now();
    let (mut cloud_client, mut hub) =
        CloudClient::with_online_hub(broker.cloud_port(), &broker.url(), DaemonOptions::default())
            .await;

    let mut c = cloud();
    let events = issue_many(&mut c, 0, 2000);
    cloud_client.publish(&events).await;
    hub.wait_db("a few hundred events committed", |db| {
        db.query_row("SELECT count(*) FROM dedupe", [], |r| r.get::<_, i64>(0))
            .unwrap()
            >= 300
    })
    .await;
    hub.kill9();
    let at_kill = hub.count("SELECT count(*) FROM dedupe");
    assert!(
        (300..2000).contains(&at_kill),
        "the kill must land mid-flood ({at_kill} committed)"
    );

    hub.spawn();
    hub.wait_db("all 2000 applied", seqs_applied(2000)).await;
    cloud_client.wait_results(&events).await;

    assert_eq!(hub.count("SELECT count(*) FROM dedupe"), 2000);
    assert_eq!(hub.watermark(), 2000);
    assert_eq!(hub.count("SELECT count(*) FROM seq_seen"), 0);
    assert_eq!(active_keys(&hub), 2000);
    assert_answered_once(&cloud_client, &events, "applied");
    let dups = cloud_client
        .results()
        .iter()
        .filter(|r| r["duplicate"] == true)
        .count();
    eprintln!(
        "sigkill flood: {at_kill} committed at the kill, {dups} duplicate answers after, {:.1?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_published_while_the_hub_is_offline_are_all_applied_when_it_returns() {
    offline_then_back(AnyBroker::Mosquitto(Mosquitto::start_with(BrokerOptions {
        max_inflight_messages: Some(100),
        ..Default::default()
    })))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_published_while_the_hub_is_offline_reach_it_through_rumqttd_too() {
    offline_then_back(AnyBroker::Rumqttd(Rumqttd::start())).await;
}

async fn offline_then_back(broker: AnyBroker) {
    let mut cloud_client = CloudClient::plain(broker.cloud_port()).await;
    let mut hub = Daemon::start(&broker.url(), DaemonOptions::default());
    // Online is published after the subscription on the same connection,
    // so the broker knows the session's subscription from here on.
    cloud_client.wait_online().await;
    assert!(hub.sigterm(), "clean exit on SIGTERM");
    cloud_client
        .wait_until("the offline status", |c| !c.is_online())
        .await;

    let mut c = cloud();
    let events = issue_many(&mut c, 0, 500);
    cloud_client.publish(&events).await;
    cloud_client.wait_acked(500).await;

    hub.spawn();
    hub.wait_db("all 500 applied", seqs_applied(500)).await;
    cloud_client.wait_results(&events).await;
    assert_eq!(hub.count("SELECT count(*) FROM dedupe"), 500);
    assert_eq!(hub.watermark(), 500);
    assert_eq!(active_keys(&hub), 500);
    assert_answered_once(&cloud_client, &events, "applied");
    assert!(
        cloud_client
            .sync_requests()
            .iter()
            .all(|r| r["reason"] == "fresh_session"),
        "a resumed session with everything delivered asks for nothing but the first start's fresh_session"
    );
}

/// Mosquitto only: rumqttd keeps its sessions in memory, so a restarted
/// rumqttd has forgotten the hub's session (and the fixture cannot restart
/// an in-process rumqttd at all). A hub behind such a broker recovers
/// through `fresh_session` sync requests instead, which the vectors test
/// shows against rumqttd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_restart_under_a_running_hub_is_survived_without_help() {
    let mut broker = Mosquitto::start_with(BrokerOptions {
        max_inflight_messages: Some(100),
        ..Default::default()
    });
    let (mut cloud_client, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;

    let mut c = cloud();
    let before = issue_many(&mut c, 0, 100);
    cloud_client.publish(&before).await;
    cloud_client.wait_results(&before).await;

    broker.restart();
    cloud_client
        .wait_until("the cloud reconnected", |c| c.connects >= 2)
        .await;
    let after = issue_many(&mut c, 100, 100);
    cloud_client.publish(&after).await;
    hub.wait_db("all 200 applied", seqs_applied(200)).await;
    cloud_client.wait_results(&after).await;
    hub.assert_running();
    assert_eq!(hub.watermark(), 200);
    assert_eq!(active_keys(&hub), 200);
    let all: Vec<SignedEvent> = before.into_iter().chain(after).collect();
    assert_answered_once(&cloud_client, &all, "applied");
}

fn status_at(s: &serde_json::Value) -> Timestamp {
    Timestamp::parse_rfc3339(s["at"].as_str().expect("a status has `at`")).expect("RFC 3339")
}

/// mqtt.md 'Status': the last will is the offline form of the status. A
/// will is fixed when its connection is made, so after a reconnect it
/// carries that connection's time, not the time the daemon started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reconnect_the_last_will_carries_that_connections_time_not_the_start() {
    let mut broker = Mosquitto::start();
    let (mut cloud_client, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;
    let first = status_at(cloud_client.on("status").last().unwrap());
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Stamped before the restart: the hub makes the will of its next
    // connection when it starts to dial, which may be while the broker is
    // still coming back.
    let restarted = Timestamp::now_system();
    broker.restart();
    // (The restarted broker itself may publish the will it kept with the
    // hub's session: that one is from the first connection.)
    cloud_client
        .wait_until("the hub online on a new connection", |c| {
            c.is_online()
                && c.on("status")
                    .last()
                    .is_some_and(|s| status_at(s).0 > restarted.0)
        })
        .await;
    hub.kill9();
    cloud_client
        .wait_until("the offline will", |c| !c.is_online())
        .await;
    let will = status_at(cloud_client.on("status").last().unwrap());
    assert!(
        will.0 > restarted.0,
        "the will says {} but the connection it ended was dialled after {} (first online {})",
        will.to_rfc3339(),
        restarted.to_rfc3339(),
        first.to_rfc3339()
    );
}

/// Re-sends events the way a careful cloud must behind a broker with a
/// tiny `max_queued_messages`: Mosquitto drops whatever exceeds in-flight
/// (20) plus queued (10) for a client even while it is connected, so the
/// answer goes out in chunks, each after the last one was answered.
async fn resend(cc: &mut CloudClient, events: &[SignedEvent]) {
    for chunk in events.chunks(20) {
        cc.publish(chunk).await;
        cc.wait_results(chunk).await;
    }
}

/// Mosquitto only: the test needs a broker that silently drops what is
/// queued beyond a small limit (`max_queued_messages 10`). rumqttd has no
/// such per-client limit; it keeps what is queued up to its segment sizes.
/// The gap logic itself does not depend on the broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_dropped_by_the_broker_are_asked_for_again_and_the_gap_closes() {
    // Mosquitto keeps only a handful of events for the offline hub and
    // drops the rest without telling anyone.
    let broker = Mosquitto::start_with(BrokerOptions {
        max_queued_messages: Some(10),
        ..Default::default()
    });
    let (mut cc, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;
    cc.wait_until("the first start's fresh_session request", |c| {
        c.sync_requests()
            .iter()
            .any(|r| r["reason"] == "fresh_session" && r["from_seq"] == 1)
    })
    .await;

    let mut c = cloud();
    let first = issue_many(&mut c, 0, 5);
    cc.publish(&first).await;
    let cp = c.checkpoint();
    cc.publish(std::slice::from_ref(&cp)).await;
    cc.wait_results(&[first.clone(), vec![cp]].concat()).await;
    assert!(hub.sigterm());

    let offline = issue_many(&mut c, 5, 100);
    cc.publish(&offline).await;
    cc.wait_acked(5 + 1 + 100).await;
    hub.spawn();
    cc.wait_until("the hub back online", |c| c.is_online())
        .await;

    // The next live event lands above the hole.
    let live = issue_many(&mut c, 105, 1);
    cc.publish(&live).await;
    cc.wait_results(&live).await;
    let seen = hub.seen_seqs();
    let first_missing = (1..=106u64)
        .find(|s| !seen.contains(s))
        .expect("the broker must have dropped events");
    assert!(first_missing > 5, "{first_missing}");
    cc.wait_until("a gap request from the first missing seq", |c| {
        c.sync_requests()
            .iter()
            .any(|r| r["reason"] == "gap" && r["from_seq"] == first_missing)
    })
    .await;

    // As the cloud: re-send what is missing, original ids and bodies, then
    // a checkpoint.
    let all: Vec<SignedEvent> = [first, offline, live].concat();
    let missing: Vec<SignedEvent> = all
        .iter()
        .filter(|e| !seen.contains(&e.seq.unwrap()))
        .cloned()
        .collect();
    eprintln!(
        "gap: broker delivered {} of 100 queued events; re-sending {}",
        seen.len() - 6,
        missing.len()
    );
    resend(&mut cc, &missing).await;
    let cp = c.checkpoint();
    cc.publish(std::slice::from_ref(&cp)).await;
    cc.wait_results(std::slice::from_ref(&cp)).await;
    assert_answered_once(&cc, &missing, "applied");
    assert_eq!(hub.watermark(), 106);
    assert_eq!(hub.count("SELECT count(*) FROM seq_seen"), 0);
    assert_eq!(active_keys(&hub), 106);
    assert_no_more_sync_requests(&mut cc, Duration::from_secs(3)).await;

    // The last event is lost; only the checkpoint tells.
    let lost = issue_many(&mut c, 106, 1);
    let cp = c.checkpoint();
    cc.publish(std::slice::from_ref(&cp)).await;
    cc.wait_until("a behind_checkpoint request", |c| {
        c.sync_requests()
            .iter()
            .any(|r| r["reason"] == "behind_checkpoint" && r["from_seq"] == 107)
    })
    .await;
    cc.publish(&lost).await;
    let cp = c.checkpoint();
    cc.publish(std::slice::from_ref(&cp)).await;
    cc.wait_results(&[lost.clone(), vec![cp]].concat()).await;
    assert_answered_once(&cc, &lost, "applied");
    assert_eq!(hub.watermark(), 107);
    assert_no_more_sync_requests(&mut cc, Duration::from_secs(3)).await;
}

/// Door entries as the serial driver would make them (until it is wired
/// into the daemon): a second store handle on the daemon's database, so
/// audit rows are written while the daemon runs and the broker is down.
async fn door_entries(hub: &Daemon, pins: &[&str]) {
    let store = Store::open(&hub.db_path(), &Policy::default()).expect("open the hub's store");
    let keys = [PinKey {
        id: "k1".into(),
        secret: pin_key(),
    }];
    for pin in pins {
        let entry = DoorEntry {
            door: "101".into(),
            door_known: true,
            tags: pin_tags(pin.as_bytes(), &keys),
            at: Timestamp::now_system(),
        };
        let policy = Policy::default();
        store
            .write(Priority::Door, move |c| {
                door_entry(c, &entry, &policy, &jiff::tz::TimeZone::UTC)
            })
            .await
            .expect("door entry");
    }
    store.close();
}

/// Mosquitto only: the broker is stopped and started again, which the
/// in-process rumqttd cannot do (its `start` never returns).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_keeps_what_happens_while_the_broker_is_down_and_delivers_it_after() {
    let mut broker = Mosquitto::start();
    let mut cc = CloudClient::plain(broker.port).await;
    // A short cloud_stale period, so the daemon itself has something to say
    // while it cannot reach anyone.
    let mut hub = Daemon::start(
        &broker.url(),
        DaemonOptions {
            policy: "cloud_stale_s = 2".into(),
            ..Default::default()
        },
    );
    cc.wait_online().await;
    let mut c = cloud();
    let events = issue_many(&mut c, 0, 3);
    cc.publish(&events).await;
    cc.wait_results(&events).await;
    hub.wait_db("the outbox drained", |db| {
        db.query_row(
            "SELECT count(*) FROM outbox WHERE sent_at IS NULL",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == 0
    })
    .await;

    broker.stop();
    let unsent_ids = |hub: &Daemon| -> Vec<(i64, String)> {
        let db = hub.db();
        let mut s = db
            .prepare("SELECT id, topic FROM outbox WHERE sent_at IS NULL ORDER BY id")
            .unwrap();
        s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    // k-0's PIN opens door 101; two wrong PINs are denied.
    door_entries(&hub, &["100000", "999999", "100001", "100000", "000000"]).await;
    hub.wait_db("cloud_stale raised offline", |db| {
        db.query_row(
            "SELECT count(*) FROM alerts WHERE condition = 'cloud_stale' AND state = 'raised'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == 1
    })
    .await;
    let pending = unsent_ids(&hub);
    let audit_ids: HashSet<String> = {
        let db = hub.db();
        let mut s = db
            .prepare("SELECT audit_id FROM outbox WHERE sent_at IS NULL AND audit_id IS NOT NULL")
            .unwrap();
        s.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(audit_ids.len(), 5, "one audit row per door entry, unsent");
    assert!(
        pending.iter().any(|(_, t)| t == "alerts"),
        "the cloud_stale alert waits in the outbox"
    );
    let heard_before = cc.heard.len();

    broker.start_again();
    hub.wait_db("the outbox drained after the broker came back", |db| {
        db.query_row(
            "SELECT count(*) FROM outbox WHERE sent_at IS NULL",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == 0
    })
    .await;
    cc.wait_until("every audit row heard", |c| {
        let heard: HashSet<&str> = c
            .on("audit")
            .filter_map(|a| a["audit_id"].as_str())
            .collect();
        audit_ids.iter().all(|id| heard.contains(id.as_str()))
    })
    .await;
    cc.wait_until("the cloud_stale alert heard", |c| {
        c.heard[heard_before..]
            .iter()
            .any(|h| h.leaf == "alerts" && h.body["condition"] == "cloud_stale")
    })
    .await;
    // Exactly once, or repeats the cloud can drop: one body per audit id.
    let mut by_id: HashMap<String, HashSet<String>> = HashMap::new();
    for a in cc.on("audit") {
        by_id
            .entry(a["audit_id"].as_str().unwrap().to_owned())
            .or_default()
            .insert(a.to_string());
    }
    assert!(by_id.values().all(|bodies| bodies.len() == 1));
    let kinds: Vec<(String, String)> = cc
        .on("audit")
        .filter(|a| audit_ids.contains(a["audit_id"].as_str().unwrap()))
        .map(|a| {
            (
                a["kind"].as_str().unwrap().to_owned(),
                a["key_id"].as_str().unwrap_or("-").to_owned(),
            )
        })
        .collect();
    let granted = kinds.iter().filter(|(k, _)| k == "door.granted").count();
    assert_eq!(granted, 3, "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|(k, _)| k == "door.denied").count(),
        2,
        "{kinds:?}"
    );
    hub.assert_running();
}

/// A broker that keeps re-publishing old events (the same envelope, and a
/// new id under an old seq) while dropping everything new must not keep
/// `cloud_stale` down: replays are no sign of life. The next new event is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_replaying_old_events_does_not_hide_a_silent_cloud() {
    let broker = Mosquitto::start();
    let (mut cc, mut hub) = CloudClient::with_online_hub(
        broker.port,
        &broker.url(),
        DaemonOptions {
            policy: "cloud_stale_s = 3".into(),
            ..Default::default()
        },
    )
    .await;
    let mut c = cloud();
    let first = issue_many(&mut c, 0, 1);
    cc.publish(&first).await;
    cc.wait_results(&first).await;
    let replayed_seq = c.sign(
        "key.revoked",
        first[0].seq,
        serde_json::json!({"key_id": "k-x", "version": 1, "reason": "r"}),
    );
    let raised = |db: &rusqlite::Connection| {
        db.query_row(
            "SELECT count(*) FROM alerts WHERE condition = 'cloud_stale' AND state = 'raised'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == 1
    };
    // Replays twice a second, for well over the stale period.
    let t0 = Instant::now();
    while !raised(&hub.db()) && t0.elapsed() < Duration::from_secs(12) {
        cc.publish(&first).await;
        cc.publish(std::slice::from_ref(&replayed_seq)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        cc.drain();
    }
    assert!(raised(&hub.db()), "cloud_stale stayed down under replays");
    let answered = cc.results();
    assert!(
        answered.iter().any(|r| r["duplicate"] == true)
            && answered.iter().any(|r| r["reason"] == "stale_seq"),
        "the replays reached the hub and were answered"
    );
    // A new event is a sign of life.
    let next = issue_many(&mut c, 1, 1);
    cc.publish(&next).await;
    hub.wait_db("cloud_stale cleared by a new event", |db| {
        db.query_row(
            "SELECT count(*) FROM alerts WHERE condition = 'cloud_stale' AND state = 'cleared'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == 1
    })
    .await;
    hub.assert_running();
}

fn files_holding(db: &std::path::Path, needle: &[u8]) -> Vec<String> {
    ["", "-wal", "-journal"]
        .iter()
        .filter(|suffix| {
            let mut p = db.as_os_str().to_owned();
            p.push(suffix);
            std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
        })
        .map(|s| format!("lockhub.db{s}"))
        .collect()
}

/// A guest erasure sticks in the running daemon: its result is heard only
/// after a WAL scrub that succeeded (a reader holding the WAL makes the
/// first attempts fail; they are retried), and then no file holds the name;
/// an erasure that overtakes its grant keeps the name out of every file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_erasure_is_published_only_once_no_file_holds_the_name() {
    let broker = Mosquitto::start();
    let (mut cc, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;
    let mut c = cloud();
    let named = |n: usize, holder: &str, name: &str| {
        let mut g = testkit::cloud::grant(n);
        g.holder_ref = Some(holder.into());
        g.holder_name = Some(name.into());
        g
    };
    let ada = c.key_issued(&named(0, "g-ada", "Ada Guest"), &[]);
    cc.publish(std::slice::from_ref(&ada)).await;
    cc.wait_results(std::slice::from_ref(&ada)).await;
    assert!(!files_holding(&hub.db_path(), b"Ada Guest").is_empty());

    // A reader holds the WAL: the scrub cannot truncate it.
    let reader = hub.db();
    reader.execute_batch("BEGIN").unwrap();
    reader
        .query_row("SELECT count(*) FROM keys", [], |r| r.get::<_, i64>(0))
        .unwrap();
    let erase = c.guest_erased("g-ada");
    cc.publish(std::slice::from_ref(&erase)).await;
    let id = erase.event_id.to_string();
    hub.wait_db("the erasure committed", |db| {
        db.query_row(
            "SELECT count(*) FROM dedupe WHERE event_id = ?1",
            [&id],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cc.drain();
    assert!(
        !cc.results_by_id().contains_key(&erase.event_id),
        "the erasure's result went out while the WAL could hold the name"
    );
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    cc.wait_results(std::slice::from_ref(&erase)).await;
    assert_eq!(cc.results_by_id()[&erase.event_id][0]["outcome"], "applied");
    assert_eq!(
        files_holding(&hub.db_path(), b"Ada Guest"),
        Vec::<String>::new()
    );

    // Overtaking: the erasure (the later seq) arrives before its grant.
    let bob_grant = c.key_issued(&named(1, "g-bob", "Bob Overtaken"), &[]);
    let bob_erase = c.guest_erased("g-bob");
    cc.publish(std::slice::from_ref(&bob_erase)).await;
    cc.wait_results(std::slice::from_ref(&bob_erase)).await;
    cc.publish(std::slice::from_ref(&bob_grant)).await;
    cc.wait_results(std::slice::from_ref(&bob_grant)).await;
    assert_eq!(
        cc.results_by_id()[&bob_grant.event_id][0]["outcome"],
        "applied"
    );
    assert_eq!(
        hub.count("SELECT count(*) FROM keys WHERE holder_ref = 'g-bob' AND holder_name IS NULL"),
        1
    );
    assert_eq!(
        files_holding(&hub.db_path(), b"Bob Overtaken"),
        Vec::<String>::new()
    );
    hub.assert_running();
}

/// A restart does not forget that a checkpoint showed the hub behind: the
/// last checkpoint's head is durable, and the hub keeps asking
/// (`behind_checkpoint`) after the restart until W reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_hub_still_asks_until_it_reaches_the_last_checkpoint() {
    let broker = Mosquitto::start();
    let (mut cc, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;
    let mut c = cloud();
    let first = issue_many(&mut c, 0, 2);
    cc.publish(&first).await;
    // Event 3 is lost; only the checkpoint tells.
    let lost = issue_many(&mut c, 2, 1);
    let cp = c.checkpoint();
    cc.publish(std::slice::from_ref(&cp)).await;
    cc.wait_results(&[first, vec![cp]].concat()).await;
    cc.wait_until("a behind_checkpoint request", |c| {
        c.sync_requests()
            .iter()
            .any(|r| r["reason"] == "behind_checkpoint" && r["from_seq"] == 3)
    })
    .await;

    hub.kill9();
    cc.drain();
    let before = cc.sync_requests().len();
    hub.spawn();
    // Asked again after the restart, and repeated (backoff 1 s, 2 s).
    cc.wait_until("two behind_checkpoint requests after the restart", |c| {
        c.sync_requests()[before..]
            .iter()
            .filter(|r| r["reason"] == "behind_checkpoint" && r["from_seq"] == 3)
            .count()
            >= 2
    })
    .await;
    cc.publish(&lost).await;
    cc.wait_results(&lost).await;
    assert_eq!(hub.watermark(), 3);
    assert_no_more_sync_requests(&mut cc, Duration::from_secs(3)).await;
}

/// A hub restarting in a loop does not hide a silent cloud: the silence
/// since the durable last sign of life carries over a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_restarting_in_a_loop_still_raises_cloud_stale() {
    let broker = Mosquitto::start();
    let (mut cc, mut hub) = CloudClient::with_online_hub(
        broker.port,
        &broker.url(),
        DaemonOptions {
            policy: "cloud_stale_s = 3".into(),
            ..Default::default()
        },
    )
    .await;
    let mut c = cloud();
    let first = issue_many(&mut c, 0, 1);
    cc.publish(&first).await;
    cc.wait_results(&first).await;
    let raised = |hub: &Daemon| hub.alert_count("cloud_stale") > 0;
    // Restarts every 1.5 s: shorter than the period each time.
    let t0 = Instant::now();
    while !raised(&hub) && t0.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        hub.kill9();
        hub.spawn();
    }
    assert!(raised(&hub), "restarts kept cloud_stale down");
    hub.assert_running();
}

/// The daemon decides a batch's items in order: an earlier item failing at
/// step 7 is reported, not a later item failing step 4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_reports_the_first_failing_batch_item_at_any_step() {
    let broker = Mosquitto::start();
    let (mut cc, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;
    let mut c = cloud();
    let first = issue_many(&mut c, 0, 1);
    cc.publish(&first).await;
    cc.wait_results(&first).await;
    let item = |key_id: &str, door: &str| {
        serde_json::json!({"type": "key.issued", "key": {
            "key_id": key_id, "version": 1, "state": "active", "check_in_id": format!("c-{key_id}"),
            "doors": [door],
            "valid_from": Timestamp::now_system().saturating_add_secs(-3600).to_rfc3339(),
            "valid_until": Timestamp::now_system().saturating_add_days(7).to_rfc3339(),
            // k-0's PIN on k-0's door: a pin_collision (step 7).
            "pin_tag": lockhub_proto::crypto::b64u_encode(&lockhub_proto::crypto::pin_tag(&pin_key(), b"100000")),
            "pin_key_id": "k1"}})
    };
    let batch = c.event(
        "batch",
        serde_json::json!({"items": [item("k-dup", "101"), item("k-far", "999")]}),
    );
    cc.publish(std::slice::from_ref(&batch)).await;
    cc.wait_results(std::slice::from_ref(&batch)).await;
    let r = &cc.results_by_id()[&batch.event_id][0];
    assert_eq!(
        (&r["outcome"], &r["reason"], &r["item"]),
        (
            &serde_json::json!("rejected"),
            &serde_json::json!("pin_collision"),
            &serde_json::json!(0)
        ),
        "{r}"
    );
    hub.assert_running();
}
