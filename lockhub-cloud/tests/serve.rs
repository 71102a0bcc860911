//! `serve` against real Mosquitto, with the test playing the hub: stored
//! events go out on start, a sync request is answered with the original
//! envelopes byte for byte and then a checkpoint at the head, and a hub
//! output with a bad signature is refused and reported while good ones are
//! recorded (audit rows once).

mod common;

use common::*;
use ed25519_dalek::SigningKey;
use lockhub_proto::crypto::{b64u_encode, hub_envelope};
use lockhub_proto::time::Timestamp;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use std::time::{Duration, Instant};
use testkit::broker::Mosquitto;
use tokio::sync::mpsc;

const PREFIX: &str = "lockhub/v1";

fn topic(leaf: &str) -> String {
    format!("{PREFIX}/{SITE}/hub-1/{leaf}")
}

/// The test's hub: hears its events topic, publishes signed outputs.
struct Hub {
    client: AsyncClient,
    heard: mpsc::Receiver<Vec<u8>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Hub {
    async fn connect(port: u16) -> Hub {
        let mut o = MqttOptions::new("test-hub", "127.0.0.1", port);
        o.set_max_packet_size(1 << 21, 1 << 21);
        let (client, mut eventloop) = AsyncClient::new(o, 64);
        let (tx, heard) = mpsc::channel(1024);
        let (sub, ready_tx) = (client.clone(), tx.clone());
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = sub.try_subscribe(topic("events"), QoS::AtLeastOnce);
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = ready_tx.send(Vec::new()).await;
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(p.payload.to_vec()).await;
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        let mut hub = Hub {
            client,
            heard,
            _task: task,
        };
        let ready = hub.next().await;
        assert!(ready.is_empty(), "the SUBACK comes first");
        hub
    }

    async fn next(&mut self) -> Vec<u8> {
        tokio::time::timeout(Duration::from_secs(20), self.heard.recv())
            .await
            .expect("an event from serve within 20 s")
            .expect("the hub's task runs")
    }

    /// Signs `body` with the hub's key and publishes it on `leaf`.
    async fn signed(&self, leaf: &str, body: &[u8]) {
        self.send(leaf, hub_envelope("hub-1", &hub_key(), body))
            .await;
    }

    async fn send(&self, leaf: &str, payload: Vec<u8>) {
        self.client
            .publish(topic(leaf), QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }
}

fn hub_key() -> SigningKey {
    SigningKey::from_bytes(&[42; 32])
}

/// `serve` with checkpoints every `checkpoint_every_s`, killed at the end.
fn serve(cloud: &Cloud, url: &str, checkpoint_every_s: &str) -> KillOnDrop {
    KillOnDrop(
        cloud
            .command(&[
                "serve",
                "--broker",
                url,
                "--checkpoint-every-s",
                checkpoint_every_s,
                "--poll-ms",
                "100",
            ])
            .spawn()
            .expect("start serve"),
    )
}

/// `issue` for check-in `c-N` with PIN `pin_base` and N; returns the key ids.
fn issue_n(cloud: &Cloud, n: u32, pin_base: &str) -> Vec<String> {
    (1..=n)
        .map(|k| {
            let pin = cloud.pin_file(&format!("{pin_base}{k}"));
            let args = cloud.issue_args(&format!("c-{k}"), &pin, &[]);
            let issued = json(&cloud.ok(&args.iter().map(String::as_str).collect::<Vec<_>>()));
            issued["key_id"].as_str().unwrap().to_owned()
        })
        .collect()
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_publishes_stored_events_answers_a_sync_request_with_the_original_envelopes_and_refuses_forged_outputs()
 {
    let broker = Mosquitto::start();
    let cloud = Cloud::new();
    let public = b64u_encode(hub_key().verifying_key().as_bytes());
    cloud.ok(&["hub", "set-key", &hub_ref("hub-1"), &public]);
    let pin = cloud.pin_file("482913");
    for n in 1..=3 {
        let args = cloud.issue_args(&format!("c-{n}"), &pin, &[]);
        cloud.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let stored = cloud.events();
    assert!(stored.iter().all(|e| !e.3), "stored, not yet published");

    let mut hub = Hub::connect(broker.port).await;
    let url = broker.url();
    let _serve = serve(&cloud, &url, "3600");

    // On start: the stored events, in seq order, byte for byte.
    for e in &stored {
        let heard = hub.next().await;
        let seq = &verified_body(&cloud, &heard)["seq"];
        assert!(
            heard == e.2,
            "expected seq {} as stored, heard seq {seq}",
            e.0
        );
    }
    wait_for("every event marked published", || {
        cloud.events().iter().all(|e| e.3)
    });

    // A sync request from seq 2: seqs 2 and 3 as stored, then a checkpoint.
    let body = br#"{"from_seq": 2, "reason": "gap"}"#;
    hub.signed("sync", body).await;
    for e in &stored[1..] {
        let heard = hub.next().await;
        let seq = &verified_body(&cloud, &heard)["seq"];
        assert!(
            heard == e.2,
            "expected seq {} as stored, heard seq {seq}",
            e.0
        );
    }
    let cp = verified_body(&cloud, &hub.next().await);
    assert_eq!(cp["type"], "checkpoint");
    assert_eq!(cp["head_seq"], 3);
    assert!(cp.get("seq").is_none(), "a checkpoint has no seq");

    // An audit row signed by another key is refused and counted; the
    // genuine one is recorded once, however often it is delivered.
    let audit = br#"{"audit_id":"0193a5a0-0000-7000-8000-000000000001","at":"2026-12-04T00:00:00Z","kind":"door.granted","door":"101","key_id":"k-1","check_in_id":"c-1","holder_ref":null,"reason":null,"event_id":null}"#;
    let forger = SigningKey::from_bytes(&[7; 32]);
    hub.send("audit", hub_envelope("hub-1", &forger, audit))
        .await;
    hub.signed("audit", audit).await;
    hub.signed("audit", audit).await;
    let status =
        br#"{"state":"online","hub_id":"hub-1","version":"0.1.0","at":"2026-12-04T00:00:00Z"}"#;
    hub.send("status", status.to_vec()).await;
    wait_for("the status recorded", || {
        cloud.sql::<i64>("SELECT count(*) FROM outputs WHERE topic = 'status'") == 1
    });
    assert_eq!(cloud.sql::<i64>("SELECT count(*) FROM refused"), 1);
    assert_eq!(
        cloud.sql::<String>("SELECT reason FROM refused"),
        "the signature does not verify under the hub's key"
    );
    assert_eq!(
        cloud.sql::<i64>("SELECT count(*) FROM outputs WHERE topic = 'audit'"),
        1
    );
    let hubs = json(&cloud.ok(&["--json", "hubs"]));
    assert_eq!(hubs["refused"], 1);
    assert_eq!(hubs["state"], "online");
    assert_eq!(hubs["last_sync_from"], 2);
    assert_eq!(hubs["head_seq"], 3);
    let audit_rows = cloud.ok(&["--json", "audit"]);
    assert_eq!(audit_rows.lines().count(), 1);
    assert_eq!(json(&audit_rows)["body"]["kind"], "door.granted");

    // An alert is open from `raised` until its `cleared`.
    let alert = |state: &str| {
        format!(
            r#"{{"alert_id":"a-1","condition":"board_offline","subject":"board-a","state":"{state}","count":1,"first_at":"2026-12-04T00:00:00Z","last_at":"2026-12-04T00:00:00Z"}}"#
        )
    };
    hub.signed("alerts", alert("raised").as_bytes()).await;
    wait_for("the alert open", || {
        cloud.ok(&["alerts"]).contains("board_offline raised")
    });
    assert_eq!(json(&cloud.ok(&["--json", "hubs"]))["open_alerts"], 1);
    hub.signed("alerts", alert("cleared").as_bytes()).await;
    wait_for("the alert closed", || cloud.ok(&["alerts"]).is_empty());
    assert_eq!(cloud.ok(&["--json", "alerts", "--all"]).lines().count(), 2);

    // A hub ahead of the cloud (a cloud restored from a backup): the counter
    // moves past what the hub has seen, and the next event takes the seq after.
    let ahead = br#"{"head_seq":3,"watermark":10,"match":null}"#;
    hub.signed("proof", ahead).await;
    wait_for("the counter past the hub's watermark", || {
        json(&cloud.ok(&["--json", "hubs"]))["head_seq"] == 10
    });
    let args = cloud.issue_args("c-after", &pin, &[]);
    let next = json(&cloud.ok(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    assert_eq!(next["seq"], 11);

    // `watch` prints what is recorded, as JSON lines.
    let mut watch = KillOnDrop(
        cloud
            .command(&["--json", "watch", "--from-start", "--poll-ms", "50"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines =
        std::io::BufRead::lines(std::io::BufReader::new(watch.0.stdout.take().unwrap()));
    let recorded = cloud.sql::<i64>("SELECT count(*) FROM outputs");
    let topics: Vec<String> = (0..recorded)
        .map(|_| {
            json(&lines.next().unwrap().unwrap())["topic"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert!(
        topics.contains(&"sync".to_owned()) && topics.contains(&"audit".to_owned()),
        "{topics:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_killed_while_publishing_and_restarted_sends_only_the_stored_events_with_no_new_seq()
{
    let broker = Mosquitto::start();
    let cloud = Cloud::new();
    let pin_dir = cloud.dir.path().to_owned();
    for n in 0..40 {
        let pin = pin_dir.join(format!("pin-{n}"));
        std::fs::write(&pin, format!("7{n:05}")).unwrap();
        let args = cloud.issue_args(&format!("c-{n}"), &pin, &[]);
        cloud.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let stored = cloud.events();
    let mut hub = Hub::connect(broker.port).await;
    let url = broker.url();
    let serve_args = ["serve", "--broker", &url, "--poll-ms", "100"];

    let mut first = KillOnDrop(cloud.command(&serve_args).spawn().unwrap());
    let mut heard = vec![hub.next().await];
    first.0.kill().unwrap(); // SIGKILL, mid-stream
    first.0.wait().unwrap();
    let published_before = stored.len() - cloud.events().iter().filter(|e| !e.3).count();
    let _second = KillOnDrop(cloud.command(&serve_args).spawn().unwrap());
    wait_for("every stored event published", || {
        cloud.events().iter().all(|e| e.3)
    });
    // Drain what the hub was sent (the restart re-sends what had no PUBACK
    // recorded, so some may come twice).
    while let Ok(Some(p)) =
        tokio::time::timeout(std::time::Duration::from_millis(500), hub.heard.recv()).await
    {
        heard.push(p);
    }
    let after = cloud.events();
    assert_eq!(
        after.iter().map(|e| (e.0, &e.1, &e.2)).collect::<Vec<_>>(),
        stored.iter().map(|e| (e.0, &e.1, &e.2)).collect::<Vec<_>>(),
        "the same seqs 1..=40, the same ids and envelopes: nothing signed anew"
    );
    let originals: std::collections::HashSet<&Vec<u8>> = stored.iter().map(|e| &e.2).collect();
    let distinct: std::collections::HashSet<&Vec<u8>> = heard.iter().collect();
    assert!(
        distinct.iter().all(|h| originals.contains(h)),
        "the hub heard only stored envelopes, byte for byte"
    );
    assert_eq!(distinct.len(), stored.len(), "and every one of them");
    eprintln!(
        "published before the kill: {published_before} of {}; heard {} messages",
        stored.len(),
        heard.len()
    );
}

/// The test hub's mirror: keys as its proof lines say them.
fn mirror_key(key_id: &str, version: u64) -> lockhub_proto::mirror::MirrorKey {
    lockhub_proto::mirror::MirrorKey {
        key_id: key_id.into(),
        version,
        granted: lockhub_proto::event::GrantState::Active,
        valid_until: Timestamp::parse_rfc3339(UNTIL).unwrap(),
    }
}

fn result_body(seq: i64, event_id: &str) -> Vec<u8> {
    format!(
        r#"{{"event_id":"{event_id}","seq":{seq},"outcome":"applied","reason":null,"duplicate":false,"clamped":false,"at":"2026-12-04T10:00:0{seq}Z"}}"#
    )
    .into_bytes()
}

/// The proof the test hub signs for a claim, from what it holds.
fn proof_body(
    head_seq: u64,
    as_of: &str,
    held: &[lockhub_proto::mirror::MirrorKey],
    claim: &serde_json::Value,
) -> Vec<u8> {
    let m = lockhub_proto::mirror::MirrorDigest::of_live(held);
    let digest = b64u_encode(&m.digest);
    let matches = claim["digest"] == digest.as_str() && claim["count"] == m.count;
    let mut p = serde_json::json!({
        "head_seq": head_seq, "as_of": as_of, "hub_time": as_of,
        "count": m.count, "digest": digest, "match": matches,
    });
    if !matches {
        p["buckets"] = m.buckets.iter().map(|b| b64u_encode(&b.0)).collect();
    }
    serde_json::to_vec(&p).unwrap()
}

/// A bucket answer from what the test hub holds.
fn bucket_body(
    head_seq: u64,
    as_of: &str,
    bucket: u8,
    held: &[lockhub_proto::mirror::MirrorKey],
) -> Vec<u8> {
    let keys: Vec<serde_json::Value> = held
        .iter()
        .filter(|k| k.bucket() == bucket)
        .map(|k| {
            serde_json::json!({"key_id": k.key_id, "version": k.version, "state": "active",
                "valid_until": lockhub_proto::mirror::unix_seconds(k.valid_until)})
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "head_seq": head_seq, "as_of": as_of, "bucket": bucket, "keys": keys,
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_claims_the_live_set_once_results_are_in_and_repairs_the_buckets_a_differing_proof_shows()
 {
    let broker = Mosquitto::start();
    let cloud = Cloud::new();
    let public = b64u_encode(hub_key().verifying_key().as_bytes());
    cloud.ok(&["hub", "set-key", &hub_ref("hub-1"), &public]);
    let key_ids = issue_n(&cloud, 2, "48291");
    let mut hub = Hub::connect(broker.port).await;
    let url = broker.url();
    let _serve = serve(&cloud, &url, "3600");
    for _ in 0..2 {
        hub.next().await;
    }
    let online =
        br#"{"state":"online","hub_id":"hub-1","version":"0.1.0","at":"2026-12-04T00:00:00Z"}"#;
    // Before the results: a checkpoint without a claim.
    hub.send("status", online.to_vec()).await;
    let cp = verified_body(&cloud, &hub.next().await);
    assert_eq!(cp["type"], "checkpoint");
    assert!(
        cp.get("mirror").is_none(),
        "no claim while results are missing: {cp}"
    );
    for e in cloud.events() {
        hub.signed("results", &result_body(e.0, &e.1)).await;
    }
    hub.send("status", online.to_vec()).await;
    let cp = verified_body(&cloud, &hub.next().await);
    let claim = cp["mirror"].clone();
    assert_eq!(claim["count"], 2, "{cp}");
    let as_of = claim["as_of"].as_str().unwrap().to_owned();
    assert!(!as_of.contains('.'), "as_of in whole seconds: {as_of}");
    let expected = lockhub_proto::mirror::MirrorDigest::of_live(&[
        mirror_key(&key_ids[0], 1),
        mirror_key(&key_ids[1], 1),
    ]);
    assert_eq!(claim["digest"], b64u_encode(&expected.digest));

    // A proof signed by another key is refused and reported.
    let held_ok = [mirror_key(&key_ids[0], 1), mirror_key(&key_ids[1], 1)];
    let forger = SigningKey::from_bytes(&[7; 32]);
    hub.send(
        "proof",
        hub_envelope("hub-1", &forger, &proof_body(2, &as_of, &held_ok, &claim)),
    )
    .await;
    wait_for("the forged proof refused", || {
        cloud.sql::<i64>("SELECT count(*) FROM refused WHERE topic = 'proof'") == 1
    });
    assert_eq!(
        cloud.sql::<i64>("SELECT count(*) FROM outputs WHERE topic = 'proof'"),
        0
    );

    // The hub lacks the second key and holds one the cloud never issued.
    let drifted = [mirror_key(&key_ids[0], 1), mirror_key("k-extra", 3)];
    hub.signed("proof", &proof_body(2, &as_of, &drifted, &claim))
        .await;
    let mut want: Vec<u8> = vec![
        lockhub_proto::mirror::bucket_of(&key_ids[1]),
        lockhub_proto::mirror::bucket_of("k-extra"),
    ];
    want.sort_unstable();
    want.dedup();
    let req = verified_body(&cloud, &hub.next().await);
    assert_eq!(req["type"], "mirror.request");
    assert!(req.get("seq").is_none());
    assert_eq!(
        req["as_of"]
            .as_str()
            .map(|s| Timestamp::parse_rfc3339(s).unwrap()),
        Some(Timestamp::parse_rfc3339(&as_of).unwrap())
    );
    let mut asked: Vec<u8> = serde_json::from_value(req["buckets"].clone()).unwrap();
    asked.sort_unstable();
    assert_eq!(asked, want, "exactly the buckets that differ");

    // The hub answers; the cloud repairs with ordinary signed events.
    let answers: Vec<Vec<u8>> = want
        .iter()
        .map(|b| hub_envelope("hub-1", &hub_key(), &bucket_body(2, &as_of, *b, &drifted)))
        .collect();
    for a in &answers {
        hub.send("proof", a.clone()).await;
    }
    let mut repairs = Vec::new();
    for _ in 0..2 {
        repairs.push(verified_body(&cloud, &hub.next().await));
    }
    // One message per bucket: the two repairs come in either order.
    repairs.sort_by_key(|r| r["type"] != "key.revoked");
    assert_eq!(repairs[0]["type"], "key.revoked", "{repairs:?}");
    assert_eq!(repairs[0]["key_id"], "k-extra");
    assert_eq!(repairs[0]["version"], 3);
    assert_eq!(repairs[0]["reason"], "reconcile");
    assert_eq!(repairs[1]["type"], "key.issued");
    assert_eq!(repairs[1]["key"]["key_id"], key_ids[1].as_str());
    assert_eq!(repairs[1]["key"]["version"], 1);
    let original = cloud.events()[1].2.clone();
    let original = verified_body(&cloud, &original);
    assert_eq!(
        repairs[1]["key"]["pin_tag"], original["key"]["pin_tag"],
        "the grant as first signed"
    );
    let mut seqs: Vec<u64> = repairs.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [3, 4]);

    // The same answers again, and a stale proof, change nothing: they were
    // made against head 2 and the head is now 4.
    for a in &answers {
        hub.send("proof", a.clone()).await;
    }
    hub.signed("proof", &proof_body(2, &as_of, &drifted, &claim))
        .await;
    let sync = br#"{"from_seq": 5, "reason": "gap"}"#;
    hub.signed("sync", sync).await;
    let cp = verified_body(&cloud, &hub.next().await);
    assert_eq!(
        cp["type"], "checkpoint",
        "no request, no repair before it: {cp}"
    );
    assert_eq!(cp["head_seq"], 4);
    assert_eq!(cloud.events().len(), 4);

    // Once the repairs' results are in, a checkpoint follows by itself, and
    // its claim is what the repaired hub holds.
    for e in &cloud.events()[2..] {
        hub.signed("results", &result_body(e.0, &e.1)).await;
    }
    let cp = verified_body(&cloud, &hub.next().await);
    assert_eq!(cp["type"], "checkpoint");
    assert_eq!(cp["head_seq"], 4);
    let claim = cp["mirror"].clone();
    let as_of = claim["as_of"].as_str().unwrap().to_owned();
    let proof = proof_body(4, &as_of, &held_ok, &claim);
    assert!(json(std::str::from_utf8(&proof).unwrap())["match"] == true);
    hub.signed("proof", &proof).await;
    wait_for("the matching proof in `hubs`", || {
        json(&cloud.ok(&["--json", "hubs"]))["last_proof"]["match"] == true
    });
    let line = cloud.ok(&["hubs"]);
    assert!(
        line.contains(&format!("proof=match@4 as_of={as_of}")),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoke_wait_proof_prints_the_result_then_the_matching_proof_that_covers_it() {
    let broker = Mosquitto::start();
    let cloud = Cloud::new();
    let public = b64u_encode(hub_key().verifying_key().as_bytes());
    cloud.ok(&["hub", "set-key", &hub_ref("hub-1"), &public]);
    let key_id = issue_n(&cloud, 1, "48291").remove(0);

    // No serve, no hub: nothing comes, and the exit code says so.
    let out = cloud.run(&[
        "revoke",
        &hub_ref("hub-1"),
        "k-nobody",
        "--wait-proof",
        "--timeout",
        "1",
    ]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no result from the hub for seq 2 within 1 s")
    );

    let mut hub = Hub::connect(broker.port).await;
    let url = broker.url();
    let _serve = serve(&cloud, &url, "3600");
    for _ in 0..2 {
        hub.next().await;
    }
    let revoke = cloud
        .command(&[
            "revoke",
            &hub_ref("hub-1"),
            &key_id,
            "--wait-proof",
            "--timeout",
            "20",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let revoke_body = verified_body(&cloud, &hub.next().await);
    assert_eq!(revoke_body["type"], "key.revoked");
    assert_eq!(revoke_body["seq"], 3);
    for e in cloud.events() {
        hub.signed("results", &result_body(e.0, &e.1)).await;
    }
    // The revoke's result brings a checkpoint; the claim holds no key.
    let cp = verified_body(&cloud, &hub.next().await);
    let claim = cp["mirror"].clone();
    assert_eq!(claim["count"], 0, "{cp}");
    let as_of = claim["as_of"].as_str().unwrap().to_owned();
    hub.signed("proof", &proof_body(3, &as_of, &[], &claim))
        .await;
    let out = revoke.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with(&format!("revoked on {}: seq 3", hub_ref("hub-1"))),
        "{text}"
    );
    assert_eq!(lines[1], "result: applied at 2026-12-04T10:00:03Z (seq 3)");
    assert_eq!(
        lines[2],
        format!("revoked at 2026-12-04T10:00:03Z, proven absent at {as_of} (proof at seq 3)")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_whose_result_never_came_is_sent_again_and_the_claim_waits_for_its_result() {
    let broker = Mosquitto::start();
    let cloud = Cloud::new();
    let public = b64u_encode(hub_key().verifying_key().as_bytes());
    cloud.ok(&["hub", "set-key", &hub_ref("hub-1"), &public]);
    issue_n(&cloud, 2, "58291");
    let stored = cloud.events();
    let mut hub = Hub::connect(broker.port).await;
    let url = broker.url();
    let _serve = serve(&cloud, &url, "1");
    for _ in 0..2 {
        hub.next().await;
    }
    // Only seq 1's result reaches the cloud.
    hub.signed("results", &result_body(1, &stored[0].1)).await;
    wait_for("the result of seq 1 recorded", || {
        cloud.sql::<i64>("SELECT count(*) FROM events WHERE result_outcome IS NOT NULL") == 1
    });
    // The next round: seq 2 again, as stored, then a checkpoint without a claim.
    let mut heard = hub.next().await;
    while heard != stored[1].2 {
        assert_ne!(heard, stored[0].2, "seq 1 has its result: not sent again");
        let body = verified_body(&cloud, &heard);
        assert!(body.get("mirror").is_none(), "no claim yet: {body}");
        heard = hub.next().await;
    }
    let cp = verified_body(&cloud, &hub.next().await);
    assert_eq!(cp["type"], "checkpoint");
    assert!(
        cp.get("mirror").is_none(),
        "no claim while seq 2's result is missing"
    );
    hub.signed("results", &result_body(2, &stored[1].1)).await;
    let claim = loop {
        let body = verified_body(&cloud, &hub.next().await);
        if let Some(m) = body.get("mirror") {
            break m.clone();
        }
    };
    assert_eq!(claim["count"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_serve_signs_with_the_new_signer_once_signer_rotate_has_run() {
    let broker = Mosquitto::start();
    let cloud = Cloud::new();
    let public = b64u_encode(hub_key().verifying_key().as_bytes());
    cloud.ok(&["hub", "set-key", &hub_ref("hub-1"), &public]);
    let old = json(&cloud.ok(&["--json", "signer", "list"]))["id"]
        .as_str()
        .unwrap()
        .to_owned();
    issue_n(&cloud, 1, "48291");
    let mut hub = Hub::connect(broker.port).await;
    let url = broker.url();
    let _serve = serve(&cloud, &url, "3600");
    assert_eq!(envelope_signer(&hub.next().await), old, "the stored event");
    let online =
        br#"{"state":"online","hub_id":"hub-1","version":"0.1.0","at":"2026-12-04T00:00:00Z"}"#;
    hub.send("status", online.to_vec()).await;
    assert_eq!(envelope_signer(&hub.next().await), old);

    // The operator rotates; serve keeps running. Its checkpoints must move
    // to the new signer: the old one ends at its not_after, and the hubs
    // refuse what it signs after that.
    cloud.ok(&["signer", "rotate", "--signer-id", "cloud-next"]);
    let mut signers = Vec::new();
    for _ in 0..20 {
        hub.send("status", online.to_vec()).await;
        let cp = hub.next().await;
        signers.push(envelope_signer(&cp));
        if signers.last().unwrap() == "cloud-next" {
            assert_eq!(verified_body(&cloud, &cp)["type"], "checkpoint");
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("serve still signs as {signers:?} after the rotation");
}
