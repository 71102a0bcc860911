//! Hostile and broken envelopes against the running daemon: each gets its
//! `rejected` result with the contract's reason, within the step-1 rate
//! limit (a burst of 10, then one a second; past it only the alert counts),
//! and none of them changes the key, dedupe or seq tables. A forged event
//! carrying a genuine event id does not block the genuine event.

use lockhub::sim::cloud::Cloud;
use lockhub_proto::crypto;
use lockhub_proto::sign::cloud_envelope;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use testkit::broker::Mosquitto;
use testkit::cloud::{CloudClient, SIGNER_ID, cloud, cloud_key, grant, issue_many, rogue_key};
use testkit::daemon::DaemonOptions;
use testkit::files::{HUB_ID, SITE_ID};
use uuid::Uuid;

/// One malformed envelope and the answer it must get.
struct Case {
    what: &'static str,
    payload: Vec<u8>,
    reason: &'static str,
    /// The result's `event_id`: the envelope's id when it is a UUID (a hint
    /// for correlation only), else null.
    hint: Option<Uuid>,
}

/// An envelope from arbitrary field values (serde_json sorts the keys).
fn envelope(fields: Value) -> Vec<u8> {
    serde_json::to_vec(&fields).unwrap()
}

/// The five fields of a well-formed envelope over `body` signed by `key`
/// (the cloud's own envelope maker), to change one at a time.
fn fields(event_id: Uuid, body: &[u8], key: &ed25519_dalek::SigningKey) -> Value {
    serde_json::from_slice(&cloud_envelope(SIGNER_ID, key, event_id, body)).unwrap()
}

fn with(mut v: Value, key: &str, value: Value) -> Value {
    v[key] = value;
    v
}

fn std_b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
}

fn cases(c: &mut Cloud) -> (Vec<Case>, lockhub_proto::sign::SignedEvent) {
    // A genuine event whose id the cases borrow; published only at the end.
    let g = c.key_issued(&grant(50), &[]);
    let id = g.event_id;
    let good = fields(id, &g.body, &cloud_key());
    let sig = crypto::sign(crypto::EVENT_CONTEXT, &cloud_key(), &g.body);
    let mut cases = vec![
        Case {
            what: "truncated JSON",
            payload: g.envelope[..g.envelope.len() / 2].to_vec(),
            reason: "bad_envelope",
            hint: None,
        },
        Case {
            what: "empty payload",
            payload: vec![],
            reason: "bad_envelope",
            hint: None,
        },
        Case {
            what: "not UTF-8",
            payload: vec![0xff, 0xfe, b'{', 0x80],
            reason: "bad_envelope",
            hint: None,
        },
        Case {
            what: "an array, not an object",
            payload: b"[1, 2, 3]".to_vec(),
            reason: "bad_envelope",
            hint: None,
        },
        Case {
            what: "v as a string",
            payload: envelope(with(good.clone(), "v", json!("1"))),
            reason: "bad_envelope",
            hint: Some(id),
        },
        Case {
            what: "body as a number",
            payload: envelope(with(good.clone(), "body", json!(12345))),
            reason: "bad_envelope",
            hint: Some(id),
        },
        Case {
            what: "event_id not a UUID",
            payload: envelope(with(good.clone(), "event_id", json!("not-a-uuid"))),
            reason: "bad_envelope",
            hint: None,
        },
        Case {
            what: "body not base64url",
            payload: envelope(with(good.clone(), "body", json!("***not base64***"))),
            reason: "bad_envelope",
            hint: Some(id),
        },
        Case {
            what: "63-byte signature",
            payload: envelope(with(
                good.clone(),
                "sig",
                json!(crypto::b64u_encode(&sig[..63])),
            )),
            reason: "bad_envelope",
            hint: Some(id),
        },
        Case {
            what: "65-byte signature",
            payload: envelope(with(
                good.clone(),
                "sig",
                json!(crypto::b64u_encode(&[&sig[..], &[0]].concat())),
            )),
            reason: "bad_envelope",
            hint: Some(id),
        },
        Case {
            what: "v as a huge integer literal",
            payload: String::from_utf8(envelope(good.clone()))
                .unwrap()
                .replacen("\"v\":1", "\"v\":100000000000000000000000000001", 1)
                .into_bytes(),
            reason: "bad_envelope",
            hint: Some(id),
        },
        Case {
            what: "v = 2",
            payload: envelope(with(good.clone(), "v", json!(2))),
            reason: "unsupported_version",
            hint: Some(id),
        },
        Case {
            what: "duplicate keys in the envelope",
            payload: String::from_utf8(envelope(good.clone()))
                .unwrap()
                .replacen("{", "{\"v\":1,", 1)
                .into_bytes(),
            reason: "bad_envelope",
            hint: None,
        },
        Case {
            what: "just over 1 MiB",
            payload: envelope(with(
                good.clone(),
                "padding",
                json!("x".repeat(1024 * 1024)),
            )),
            reason: "payload_too_large",
            hint: None,
        },
        Case {
            what: "unknown signer",
            payload: envelope(with(good.clone(), "signer", json!("cloud-1999-01"))),
            reason: "unknown_signer",
            hint: Some(id),
        },
        Case {
            what: "signed outside the ring, genuine id and body",
            payload: envelope(fields(id, &g.body, &rogue_key())),
            reason: "bad_signature",
            hint: Some(id),
        },
    ];

    // Standard-alphabet base64 of the signature: retry bodies until the
    // standard encoding really differs (holds a '+' or '/').
    let std_sig = (0..)
        .map(|i| {
            let e = c.sign("checkpoint", None, json!({"head_seq": 0, "n": i}));
            let s = crypto::sign(crypto::EVENT_CONTEXT, &cloud_key(), &e.body);
            (e, std_b64(&s))
        })
        .find(|(_, s)| s.contains('+') || s.contains('/'))
        .unwrap();
    cases.push(Case {
        what: "signature in the standard base64 alphabet",
        payload: envelope(with(
            fields(std_sig.0.event_id, &std_sig.0.body, &cloud_key()),
            "sig",
            json!(std_sig.1),
        )),
        reason: "bad_envelope",
        hint: Some(std_sig.0.event_id),
    });

    // Signed, well-formed envelopes whose bodies are wrong.
    let signed = |id: Uuid, body: Vec<u8>| envelope(fields(id, &body, &cloud_key()));
    let huge = c.sign(
        "key.revoked",
        Some(1 << 53),
        json!({"key_id": "k-x", "version": 1, "reason": "x"}),
    );
    cases.push(Case {
        what: "seq = 2^53 (above 2^53-1)",
        payload: huge.envelope.clone(),
        reason: "bad_envelope",
        hint: Some(huge.event_id),
    });
    let dup_body = [b"{\"type\":\"key.revoked\",".as_slice(), &g.body[1..]].concat();
    cases.push(Case {
        what: "duplicate keys in the signed body",
        payload: signed(id, dup_body),
        reason: "bad_envelope",
        hint: Some(id),
    });
    cases.push(Case {
        what: "signed body that is not JSON",
        payload: signed(id, b"not json at all".to_vec()),
        reason: "bad_envelope",
        hint: Some(id),
    });
    let other = Uuid::new_v4();
    cases.push(Case {
        what: "envelope id differs from the body's",
        payload: signed(other, g.body.clone()),
        reason: "event_id_mismatch",
        hint: Some(other),
    });
    let elsewhere = Cloud::new(cloud_key(), SIGNER_ID, Uuid::new_v4(), HUB_ID).sign(
        "key.revoked",
        Some(4),
        json!({"key_id": "k-0", "version": 1, "reason": "x"}),
    );
    cases.push(Case {
        what: "another site",
        payload: elsewhere.envelope.clone(),
        reason: "wrong_site",
        hint: Some(elsewhere.event_id),
    });
    let other_hub = Cloud::new(
        cloud_key(),
        SIGNER_ID,
        SITE_ID.parse().unwrap(),
        "hub-lobby-2",
    )
    .sign(
        "key.revoked",
        Some(4),
        json!({"key_id": "k-0", "version": 1, "reason": "x"}),
    );
    cases.push(Case {
        what: "another hub",
        payload: other_hub.envelope.clone(),
        reason: "wrong_hub",
        hint: Some(other_hub.event_id),
    });
    (cases, g)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_envelope_is_rejected_with_its_reason_and_changes_nothing() {
    let t0 = Instant::now();
    let broker = Mosquitto::start();
    let (mut cc, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;

    let mut c = cloud();
    let setup = issue_many(&mut c, 0, 3);
    cc.publish(&setup).await;
    cc.wait_results(&setup).await;
    let before = hub.dump();

    let (cases, genuine) = cases(&mut c);
    assert!(cases.len() >= 20);
    // Results are published in commit order, which is arrival order: the
    // k-th result after `base` answers the k-th case.
    let base = cc.results().len();
    let mut last_send: Option<Instant> = None;
    for (i, case) in cases.iter().enumerate() {
        if i >= ratelimit_burst() {
            // Past the burst: one result a second.
            let due = last_send.unwrap() + Duration::from_millis(1050);
            tokio::time::sleep_until(due.into()).await;
        }
        last_send = Some(Instant::now());
        cc.publish_raw(case.payload.clone()).await;
        cc.wait_until(&format!("the result for {:?}", case.what), |c| {
            c.results().len() > base + i
        })
        .await;
        let r = cc.results()[base + i].clone();
        assert_eq!(r["outcome"], "rejected", "{}", case.what);
        assert_eq!(r["reason"], case.reason, "{}", case.what);
        assert_eq!(r["duplicate"], false, "{}", case.what);
        assert_eq!(r["seq"], Value::Null, "{}: nothing counted", case.what);
        let want_id = case.hint.map_or(Value::Null, |u| json!(u.to_string()));
        assert_eq!(r["event_id"], want_id, "{}", case.what);
    }

    // A burst past the limit: the alerts count every one, results stop.
    let flood = 8;
    for _ in 0..flood {
        cc.publish_raw(b"{\"v\":1".to_vec()).await;
    }
    let expected = (cases.len() + flood) as i64;
    hub.wait_db("every rejection counted in its alert", |db| {
        db.query_row(
            "SELECT coalesce(sum(count), 0) FROM alerts
             WHERE condition IN ('malformed_event', 'bad_signature')",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == expected
    })
    .await;
    assert_eq!(
        hub.alert_count("bad_signature"),
        2,
        "unknown_signer and bad_signature count as bad_signature"
    );
    // Compared, never printed: the dump holds PIN tags.
    assert!(
        before == hub.dump(),
        "a rejected envelope changed the key/dedupe/seq tables"
    );

    // The genuine event whose id the cases borrowed was never claimed; its
    // result also closes the window in which flood results could arrive.
    cc.publish(std::slice::from_ref(&genuine)).await;
    cc.wait_results(std::slice::from_ref(&genuine)).await;
    let flood_results = cc.results().len() - base - cases.len() - 1;
    assert!(
        flood_results <= 1,
        "{flood_results} of {flood} results past the rate limit"
    );
    let r = &cc.results_by_id()[&genuine.event_id];
    assert_eq!(r.len(), 1);
    assert_eq!(r[0]["outcome"], "applied");
    assert_eq!(r[0]["duplicate"], false);
    assert_eq!(hub.watermark(), 4);
    hub.assert_running();
    eprintln!("malformed: {} cases in {:.1?}", cases.len(), t0.elapsed());
}

fn ratelimit_burst() -> usize {
    lockhub::sync::ratelimit::BURST as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_event_with_a_genuine_id_does_not_block_the_genuine_event() {
    let broker = Mosquitto::start();
    let (mut cc, hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;

    let mut c = cloud();
    let genuine = c.key_issued(&grant(1), &[]);
    // The forger knows the id (it crossed the broker) but not the key: once
    // with the genuine body, once with a body of its own choosing.
    let forged_same = envelope(fields(genuine.event_id, &genuine.body, &rogue_key()));
    let mut evil = grant(2);
    evil.valid_until = evil.valid_until.saturating_add_days(30);
    let forged_other = {
        let mut body: Value = serde_json::from_slice(&genuine.body).unwrap();
        body["key"]["valid_until"] = json!(evil.valid_until.to_rfc3339());
        let body = serde_json::to_vec(&body).unwrap();
        envelope(fields(genuine.event_id, &body, &rogue_key()))
    };
    for forged in [forged_same, forged_other] {
        cc.publish_raw(forged).await;
    }
    cc.wait_until("two rejections", |c| c.results().len() >= 2)
        .await;
    for r in cc.results() {
        assert_eq!(r["outcome"], "rejected");
        assert_eq!(r["reason"], "bad_signature");
        assert_eq!(r["event_id"], genuine.event_id.to_string());
    }
    assert_eq!(hub.count("SELECT count(*) FROM dedupe"), 0);

    cc.publish(std::slice::from_ref(&genuine)).await;
    cc.wait_results(std::slice::from_ref(&genuine)).await;
    let results = cc.results();
    let r = results.last().unwrap();
    assert_eq!(r["event_id"], genuine.event_id.to_string());
    assert_eq!(r["outcome"], "applied");
    assert_eq!(r["duplicate"], false);
    assert_eq!(hub.count("SELECT count(*) FROM dedupe"), 1);
    assert_eq!(
        hub.count("SELECT count(*) FROM keys WHERE key_id = 'k-1' AND state = 'active'"),
        1
    );
}

/// Over the hub's MQTT packet limit (2 MiB) the envelope cannot even be
/// read, so it cannot be acked either, and the broker redelivers it on every
/// reconnect. Found by this test: the hub was wedged in a reconnect loop for
/// good (hundreds of reconnects a minute, no event ever applied again). Now
/// it drops the poisoned session once and asks the cloud to re-send
/// (`fresh_session`); the cloud answers as the contract says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_envelope_above_the_mqtt_packet_limit_does_not_wedge_the_hub() {
    let broker = Mosquitto::start();
    let (mut cc, mut hub) =
        CloudClient::with_online_hub(broker.port, &broker.url(), DaemonOptions::default()).await;
    let mut c = cloud();
    let before = issue_many(&mut c, 0, 2);
    cc.publish(&before).await;
    cc.wait_results(&before).await;
    let cp = c.checkpoint();
    cc.publish(std::slice::from_ref(&cp)).await;
    cc.wait_results(std::slice::from_ref(&cp)).await;
    let syncs = cc.sync_requests().len();

    cc.publish_raw(vec![b'x'; 3 * 1024 * 1024]).await;
    let after = issue_many(&mut c, 2, 1);
    cc.publish(&after).await;
    cc.wait_until("a fresh_session request after the poisoned session", |c| {
        c.sync_requests()[syncs..]
            .iter()
            .any(|r| r["reason"] == "fresh_session" && r["from_seq"] == 3)
    })
    .await;
    // As the cloud: re-send from 3 (it may have arrived already), then a
    // checkpoint.
    cc.publish(&after).await;
    let cp = c.checkpoint();
    cc.publish(std::slice::from_ref(&cp)).await;
    cc.wait_results(&[after.clone(), vec![cp]].concat()).await;
    assert_eq!(
        cc.results_by_id()[&after[0].event_id][0]["outcome"],
        "applied"
    );
    assert_eq!(hub.watermark(), 3);
    hub.assert_running();
    let connects = hub.log().matches("mqtt connected").count();
    assert!(connects <= 3, "{connects} connections: a reconnect loop");
}
