//! The mirror proof end to end (docs/protocol/mqtt.md 'Mirror proof'): the
//! real `lockhub run` with a real Mosquitto and the test cloud, which signs
//! its claims with `lockhub_proto::sign` and computes them with
//! `lockhub_proto::mirror`, as a real cloud would.

use lockhub::sim::cloud::Cloud;
use lockhub_proto::event::GrantState;
use lockhub_proto::mirror::{Claim, MirrorDigest, MirrorKey, bucket_of, unix_seconds};
use lockhub_proto::sign::{GrantSpec, SignedEvent, fields};
use lockhub_proto::time::Timestamp;
use serde_json::Value;
use std::time::Duration;
use testkit::broker::{BrokerOptions, Mosquitto};
use testkit::cloud::{CloudClient, cloud, grant};
use testkit::daemon::DaemonOptions;
use testkit::files::HUB_ID;

/// The cloud's claim of `grants` as of `as_of` (every one live, not clamped).
fn claim_of(grants: &[&GrantSpec], as_of: Timestamp) -> Claim {
    let keys: Vec<MirrorKey> = grants
        .iter()
        .filter(|g| g.valid_until > as_of)
        .map(|g| MirrorKey {
            key_id: g.key_id.clone(),
            version: g.version,
            granted: GrantState::Active,
            valid_until: g.valid_until,
        })
        .collect();
    Claim::of(&MirrorDigest::of_live(&keys), as_of)
}

fn whole_now() -> Timestamp {
    Timestamp::from_secs(unix_seconds(Timestamp::now_system()))
}

fn checkpoint(c: &Cloud, head: u64, claim: &Claim) -> SignedEvent {
    c.sign(
        "checkpoint",
        None,
        fields::checkpoint_with_claim(head, claim),
    )
}

fn proofs(c: &CloudClient) -> Vec<Value> {
    c.on("proof").cloned().collect()
}

/// Proofs that compare (not bucket answers, not ahead).
fn compared(c: &CloudClient) -> Vec<Value> {
    proofs(c)
        .into_iter()
        .filter(|p| p.get("digest").is_some())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proof_matches_then_finds_a_hand_deleted_key_answers_its_bucket_and_clears_after_the_repair()
 {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let (mut cloud_client, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;
    let mut c = cloud();
    let mut grants: Vec<GrantSpec> = (0..8).map(grant).collect();
    let events: Vec<SignedEvent> = grants.iter().map(|g| c.key_issued(g, &[])).collect();
    cloud_client.publish(&events).await;
    cloud_client.wait_results(&events).await;

    // 1. A matching proof.
    let as_of = whole_now();
    let claim = claim_of(&grants.iter().collect::<Vec<_>>(), as_of);
    cloud_client.publish(&[checkpoint(&c, 8, &claim)]).await;
    cloud_client
        .wait_until("a first proof", |cc| !compared(cc).is_empty())
        .await;
    let p = compared(&cloud_client).pop().unwrap();
    assert_eq!(p["match"], true, "{p}");
    assert_eq!(p["head_seq"], 8);
    assert_eq!(p["count"], 8);
    assert!(p.get("buckets").is_none());
    assert!(p["hub_time"].is_string());
    let status = hub.status_json();
    assert_eq!(status["mirror_proof"]["match"], true, "{status}");
    assert_eq!(status["mirror_proof"]["digest"], p["digest"]);

    // 2. A key row deleted by hand, past the schema's guard.
    testkit::db::delete_key_by_hand(&hub.db_path(), "k-3");
    let as_of = whole_now().saturating_add_secs(1);
    let claim = claim_of(&grants.iter().collect::<Vec<_>>(), as_of);
    cloud_client.publish(&[checkpoint(&c, 8, &claim)]).await;
    cloud_client
        .wait_until("a second proof", |cc| compared(cc).len() >= 2)
        .await;
    let p = compared(&cloud_client).pop().unwrap();
    assert_eq!(p["match"], false, "{p}");
    assert_eq!(p["count"], 7);
    let buckets = p["buckets"]
        .as_array()
        .expect("a diverged proof has its buckets");
    assert_eq!(buckets.len(), 256);
    hub.wait_db("mirror_diverged raised", |db| {
        testkit::db::raised(db, "mirror_diverged", HUB_ID)
    })
    .await;
    cloud_client
        .wait_until("the alert on the alerts topic", |cc| {
            cc.on("alerts")
                .any(|a| a["condition"] == "mirror_diverged" && a["state"] == "raised")
        })
        .await;

    // 3. The cloud asks for the bucket that differs, twice (the same event).
    let b = bucket_of("k-3");
    let req = c.sign(
        "mirror.request",
        None,
        fields::mirror_request(as_of, &[b, b.wrapping_add(1)]),
    );
    cloud_client.publish(std::slice::from_ref(&req)).await;
    let answers = |cc: &CloudClient| -> Vec<Value> {
        proofs(cc)
            .into_iter()
            .filter(|p| p.get("bucket").is_some())
            .collect()
    };
    cloud_client
        .wait_until("two bucket answers", |cc| answers(cc).len() >= 2)
        .await;
    let got = answers(&cloud_client);
    let mine = got.iter().find(|a| a["bucket"] == u64::from(b)).unwrap();
    assert_eq!(mine["head_seq"], 8);
    let ids: Vec<&str> = mine["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key_id"].as_str().unwrap())
        .collect();
    assert!(!ids.contains(&"k-3"), "{ids:?}");
    for k in mine["keys"].as_array().unwrap() {
        assert_eq!(k["state"], "active");
        assert_eq!(k["version"], 1);
    }
    let result = cloud_client.results_by_id()[&req.event_id][0].clone();
    assert_eq!(result["outcome"], "noop", "{result}");
    cloud_client.publish(std::slice::from_ref(&req)).await;
    cloud_client
        .wait_until("the duplicate's result", |cc| {
            cc.results_by_id()
                .get(&req.event_id)
                .is_some_and(|r| r.iter().any(|x| x["duplicate"] == true))
        })
        .await;
    // The outbox would have published a second answer with the result.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    cloud_client.drain();
    assert_eq!(
        answers(&cloud_client).len(),
        2,
        "a duplicate is not answered again"
    );

    // 4. The repair: the cloud issues the key again, at a higher version.
    grants[3].version = 2;
    let reissue = c.key_issued(&grants[3], &[]);
    cloud_client.publish(std::slice::from_ref(&reissue)).await;
    cloud_client
        .wait_results(std::slice::from_ref(&reissue))
        .await;
    let as_of = whole_now().saturating_add_secs(2);
    let claim = claim_of(&grants.iter().collect::<Vec<_>>(), as_of);
    cloud_client.publish(&[checkpoint(&c, 9, &claim)]).await;
    cloud_client
        .wait_until("a third proof", |cc| compared(cc).len() >= 3)
        .await;
    let p = compared(&cloud_client).pop().unwrap();
    assert_eq!(p["match"], true, "{p}");
    assert_eq!(p["head_seq"], 9);
    hub.wait_db("mirror_diverged cleared", |db| {
        !testkit::db::raised(db, "mirror_diverged", HUB_ID)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_ahead_says_so_and_a_hub_behind_publishes_nothing() {
    let broker = Mosquitto::start_with(BrokerOptions::default());
    let (mut cloud_client, _hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;
    let mut c = cloud();
    let grants: Vec<GrantSpec> = (0..3).map(grant).collect();
    let events: Vec<SignedEvent> = grants.iter().map(|g| c.key_issued(g, &[])).collect();
    cloud_client.publish(&events).await;
    cloud_client.wait_results(&events).await;

    // A cloud restored from a backup believes it sent two.
    let as_of = whole_now();
    let two = claim_of(&grants[..2].iter().collect::<Vec<_>>(), as_of);
    cloud_client.publish(&[checkpoint(&c, 2, &two)]).await;
    cloud_client
        .wait_until("the ahead proof", |cc| !proofs(cc).is_empty())
        .await;
    let p = proofs(&cloud_client).pop().unwrap();
    assert_eq!(
        p,
        serde_json::json!({"head_seq": 2, "watermark": 3, "match": null})
    );

    // A checkpoint past what the hub has: behind, nothing on proof.
    let five = claim_of(&grants.iter().collect::<Vec<_>>(), as_of);
    let cp = checkpoint(&c, 5, &five);
    cloud_client.publish(std::slice::from_ref(&cp)).await;
    cloud_client.wait_results(std::slice::from_ref(&cp)).await;
    cloud_client
        .wait_until("the sync request it makes instead", |cc| {
            cc.sync_requests()
                .iter()
                .any(|r| r["reason"] == "behind_checkpoint")
        })
        .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    cloud_client.drain();
    assert_eq!(proofs(&cloud_client).len(), 1, "behind: no proof");
}
