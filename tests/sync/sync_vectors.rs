//! The daemon binary against a real Mosquitto, and against rumqttd, fed
//! the shared MQTT vectors in order: every result as the vectors say,
//! hub-signed; the first sync request is `from_seq` 1 `fresh_session`;
//! SIGTERM publishes the offline status and exits 0.

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use std::time::Duration;
use testkit::broker::Mosquitto;
use testkit::broker::Rumqttd;
use testkit::cloud::open_hub_envelope;
use testkit::daemon::Daemon;
use testkit::files::{Fixture, HUB_ID, SITE_ID, VECTORS_DIR};
use tokio::sync::mpsc;

const TIMEOUT: Duration = Duration::from_secs(30);

fn topic(leaf: &str) -> String {
    format!("lockhub/v1/{SITE_ID}/{HUB_ID}/{leaf}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vector_gets_its_result_from_the_running_daemon() {
    let broker = Mosquitto::start();
    vectors_through(broker.port).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_vector_gets_its_result_through_rumqttd_too() {
    let broker = Rumqttd::start();
    vectors_through(broker.port).await;
}

/// The whole story through the MQTT 3.1.1 broker on `port`.
async fn vectors_through(port: u16) {
    let fx =
        Fixture::with_hub_edits(&[("mqtt://127.0.0.1:1883", &format!("mqtt://127.0.0.1:{port}"))]);

    // A client id of its own: the two tests of this binary run side by side.
    let mut o = MqttOptions::new(format!("test-cloud-{port}"), "127.0.0.1", port);
    o.set_max_packet_size(4 << 20, 4 << 20);
    let (client, mut eventloop) = AsyncClient::new(o, 256);
    client
        .subscribe(topic("#"), QoS::AtLeastOnce)
        .await
        .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, Vec<u8>)>();
    let poll = tokio::spawn(async move {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let _ = tx.send((p.topic.clone(), p.payload.to_vec()));
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("the test cloud's connection ended: {e}");
                    return;
                }
            }
        }
    });
    let mut next = async |want: &str| -> (String, Vec<u8>) {
        tokio::time::timeout(TIMEOUT, async {
            loop {
                let (t, p) = rx
                    .recv()
                    .await
                    .expect("the test cloud's connection ended (see stderr)");
                if t.ends_with(want) {
                    return (t, p);
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no message on {want}"))
    };

    let mut daemon = Daemon::at(fx.dir);
    daemon.spawn();
    let (_, sync) = next("/sync").await;
    let sync = open_hub_envelope(&sync);
    assert_eq!(
        sync,
        serde_json::json!({"from_seq": 1, "reason": "fresh_session"})
    );

    let cases = std::fs::read_to_string(format!("{VECTORS_DIR}/cases.jsonl")).unwrap();
    let cases: Vec<serde_json::Value> = cases
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for c in &cases {
        let env = c["envelope"].as_str().unwrap().as_bytes().to_vec();
        client
            .publish(topic("events"), QoS::AtLeastOnce, false, env)
            .await
            .unwrap();
    }
    // Results are matched by event id, in order among those of one id: an
    // erasure's result (case 19) is held until its WAL scrub succeeds, so it
    // may come after later ones (mqtt.md 'Types: guest.erased').
    let mut heard = Vec::with_capacity(cases.len());
    for _ in &cases {
        let (_, p) = next("/results").await;
        heard.push(Some(open_hub_envelope(&p)));
    }
    for c in &cases {
        let envelope: serde_json::Value =
            serde_json::from_str(c["envelope"].as_str().unwrap()).unwrap();
        let id = envelope["event_id"].as_str().unwrap().to_lowercase();
        let n = &c["n"];
        let r = heard
            .iter_mut()
            .find(|r| r.as_ref().is_some_and(|r| r["event_id"] == id.as_str()))
            .and_then(Option::take)
            .unwrap_or_else(|| panic!("case {n}: no result for {id}"));
        assert_eq!(r["outcome"], c["outcome"], "case {n}");
        assert_eq!(r["reason"], c["reason"], "case {n}");
        assert_eq!(r["duplicate"], c["duplicate"], "case {n}");
        if let Some(item) = c.get("item") {
            assert_eq!(&r["item"], item, "case {n}");
        }
        if let Some(items) = c.get("items").and_then(|i| i.as_array()) {
            let got: Vec<serde_json::Value> = r["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| serde_json::json!([i["outcome"], i["reason"]]))
                .collect();
            assert_eq!(&got, items, "case {n}");
        }
    }

    // SIGTERM: a clean exit, and the offline status (heard meanwhile).
    let clean = tokio::task::block_in_place(|| daemon.sigterm_within(TIMEOUT));
    assert_eq!(clean, Some(true), "exit status 0 within {TIMEOUT:?}");
    let (_, status) = next("/status").await;
    let mut status: serde_json::Value = serde_json::from_slice(&status).unwrap();
    while status["state"] != "offline" {
        status = serde_json::from_slice(&next("/status").await.1).unwrap();
    }
    poll.abort();
}
