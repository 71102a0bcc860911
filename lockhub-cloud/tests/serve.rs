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
use lockhub_proto::verify::{Signer, VerifyContext, verify_envelope};
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

/// Checks a cloud envelope the way the hub does (step 1) and returns its
/// body as JSON.
fn verified_body(cloud: &Cloud, envelope: &[u8]) -> serde_json::Value {
    let c = rusqlite::Connection::open(cloud.db()).unwrap();
    let (id, key): (String, String) = c
        .query_row(
            "SELECT id, public_key FROM signers WHERE active = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let ring = [Signer {
        id,
        public_key: lockhub_proto::crypto::parse_public_key(&key).unwrap(),
        not_after: None,
    }];
    let ctx = VerifyContext {
        ring: &ring,
        site_id: SITE.parse().unwrap(),
        hub_id: "hub-1",
        now: Timestamp::now_system(),
    };
    let v = verify_envelope(envelope, &ctx).expect("the hub accepts what serve sends");
    serde_json::from_slice(&v.body).unwrap()
}

/// A child process killed when the test ends, also when it fails (else its
/// inherited stderr would keep the test harness waiting).
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
    let _serve = KillOnDrop(
        cloud
            .command(&[
                "serve",
                "--broker",
                &url,
                "--checkpoint-every-s",
                "3600",
                "--poll-ms",
                "100",
            ])
            .spawn()
            .expect("start serve"),
    );

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
    hub.send("sync", hub_envelope("hub-1", &hub_key(), body))
        .await;
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
    hub.send("audit", hub_envelope("hub-1", &hub_key(), audit))
        .await;
    hub.send("audit", hub_envelope("hub-1", &hub_key(), audit))
        .await;
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
    hub.send(
        "alerts",
        hub_envelope("hub-1", &hub_key(), alert("raised").as_bytes()),
    )
    .await;
    wait_for("the alert open", || {
        cloud.ok(&["alerts"]).contains("board_offline raised")
    });
    assert_eq!(json(&cloud.ok(&["--json", "hubs"]))["open_alerts"], 1);
    hub.send(
        "alerts",
        hub_envelope("hub-1", &hub_key(), alert("cleared").as_bytes()),
    )
    .await;
    wait_for("the alert closed", || cloud.ok(&["alerts"]).is_empty());
    assert_eq!(cloud.ok(&["--json", "alerts", "--all"]).lines().count(), 2);

    // A hub ahead of the cloud (a cloud restored from a backup): the counter
    // moves past what the hub has seen, and the next event takes the seq after.
    let ahead = br#"{"head_seq":3,"watermark":10,"match":null}"#;
    hub.send("proof", hub_envelope("hub-1", &hub_key(), ahead))
        .await;
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
