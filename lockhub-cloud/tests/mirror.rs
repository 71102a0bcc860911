//! The cloud's mirror claim on a real SQLite file (docs/protocol/mqtt.md
//! 'Mirror proof'): it passes the project's vector byte for byte, it
//! follows the hub's results (a clamp, a refusal, a tombstone, a repair the
//! hub holds final), ignores what says nothing about a key (a replay, a
//! result for an event this cloud does not hold), and is not made while a
//! result is missing.

use lockhub_cloud::ops;
use lockhub_cloud::store::*;
use lockhub_proto::crypto::b64u_encode;
use lockhub_proto::event::{EventResult, ItemResult, Outcome, Reason};
use lockhub_proto::time::Timestamp;
use serde_json::Value;

fn hub() -> HubRef {
    HubRef {
        site_id: "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10".into(),
        hub_id: "h".into(),
    }
}

fn store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&dir.path().join("c.db"), true).unwrap();
    s.add_hub(
        &HubRecord {
            hub: hub(),
            public_key: None,
            doors: vec!["101".into()],
            pin_keys: vec![PinKey {
                id: "k1".into(),
                secret: [7; 32],
            }],
            next_seq: 1,
        },
        "2026-12-01T00:00:00Z",
    )
    .unwrap();
    (dir, s)
}

fn key(key_id: &str, version: u64, state: &str, until: &str) -> KeyRecord {
    KeyRecord {
        key_id: key_id.into(),
        version,
        state: state.into(),
        check_in_id: (state == "active").then(|| format!("c-{key_id}")),
        reservation_id: None,
        doors: vec!["101".into()],
        valid_from: "2026-11-01T00:00:00Z".into(),
        valid_until: until.into(),
        holder_ref: None,
        seq: 0,
    }
}

/// Stores an event making `change` (the signed bytes are opaque to the
/// store; `body` is what a repair would read back). Returns (seq, event_id).
fn mint(s: &SqliteStore, kind: &str, body: Value, change: KeyChange) -> (u64, uuid::Uuid) {
    let id = uuid::Uuid::new_v4();
    let m = Mint {
        hub: hub(),
        idempotency: None,
        change,
        key_id: None,
        now: "2026-12-01T00:00:00Z".into(),
        now_unix: 1_764_547_200,
    };
    let minted = s
        .mint(&m, &mut |_| Signed {
            event_id: id.to_string(),
            kind: kind.into(),
            body: serde_json::to_vec(&body).unwrap(),
            envelope: b"opaque".to_vec(),
        })
        .unwrap();
    (minted.seq, id)
}

fn result(seq: u64, id: uuid::Uuid, outcome: Outcome, reason: Option<Reason>) -> EventResult {
    EventResult {
        event_id: Some(id),
        seq: Some(seq),
        outcome,
        reason,
        duplicate: false,
        clamped: false,
        at: Timestamp::parse_rfc3339("2026-12-01T00:00:01Z").unwrap(),
        valid_until: None,
        item: None,
        items: None,
    }
}

fn issue(s: &SqliteStore, k: KeyRecord) -> (u64, uuid::Uuid) {
    let body = serde_json::json!({"type": "key.issued", "key": {"key_id": k.key_id, "version": k.version}});
    mint(s, "key.issued", body, KeyChange::Insert(k))
}

fn at(t: &str) -> Timestamp {
    Timestamp::parse_rfc3339(t).unwrap()
}

fn live_ids(s: &SqliteStore, as_of: &str) -> Vec<(String, u64, String)> {
    let (live, _) = ops::mirror_digest(s, &hub(), at(as_of)).unwrap();
    live.into_iter()
        .map(|k| {
            (
                k.key_id,
                k.version,
                k.valid_until.to_rfc3339()[..19].to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_clouds_claim_from_its_own_records_is_the_vectors_count_and_digest() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../spec/vectors/mqtt/mirror.json"
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let (_dir, s) = store();
    for k in v["keys"].as_array().unwrap() {
        // The cloud's view: the state its grant gave; a revoke marks it.
        let state = k["state"].as_str().unwrap();
        let granted = k["granted_state"].as_str().unwrap_or(match state {
            "pre_issued" => "pre_issued",
            _ => "active",
        });
        let id = k["key_id"].as_str().unwrap();
        let (seq, eid) = issue(
            &s,
            key(
                id,
                k["version"].as_u64().unwrap(),
                granted,
                k["valid_until"].as_str().unwrap(),
            ),
        );
        s.record_result(&hub(), &result(seq, eid, Outcome::Applied, None))
            .unwrap();
        if state == "revoked" {
            let (seq, eid) = mint(
                &s,
                "key.revoked",
                Value::Null,
                KeyChange::Revoke { key_id: id.into() },
            );
            s.record_result(&hub(), &result(seq, eid, Outcome::Applied, None))
                .unwrap();
        }
    }
    let as_of = at(v["as_of"].as_str().unwrap());
    let head = s.head_seq(&hub()).unwrap();
    let claim = ops::claim(&s, &hub(), head, as_of)
        .unwrap()
        .expect("every result is in");
    assert_eq!(claim.count, v["count"].as_u64().unwrap());
    assert_eq!(b64u_encode(&claim.digest), v["digest"].as_str().unwrap());
    assert_eq!(claim.to_wire().as_of, v["as_of"].as_str().unwrap());
    let (_, digest) = ops::mirror_digest(&s, &hub(), as_of).unwrap();
    for (bucket, want) in v["bucket_digests"].as_object().unwrap() {
        let b: usize = bucket.parse().unwrap();
        assert_eq!(
            b64u_encode(&digest.buckets[b].0),
            want.as_str().unwrap(),
            "bucket {b}"
        );
    }
}

#[test]
fn no_claim_is_made_while_a_result_is_missing() {
    let (_dir, s) = store();
    let (seq, eid) = issue(&s, key("k-1", 1, "active", "2099-01-01T00:00:00Z"));
    let now = at("2026-12-04T12:00:00.7Z");
    assert_eq!(ops::claim(&s, &hub(), seq, now).unwrap(), None);
    s.record_result(&hub(), &result(seq, eid, Outcome::Applied, None))
        .unwrap();
    let claim = ops::claim(&s, &hub(), seq, now).unwrap().unwrap();
    assert_eq!(claim.count, 1);
    assert_eq!(
        claim.to_wire().as_of,
        "2026-12-04T12:00:00Z",
        "whole seconds"
    );
    assert_eq!(
        ops::claim(&s, &hub(), seq + 1, now).unwrap(),
        None,
        "a claim is for the head it was read at"
    );
}

#[test]
fn the_claim_follows_clamps_refusals_and_tombstones_and_ignores_what_says_nothing() {
    let (_dir, s) = store();
    let as_of = "2026-12-04T12:00:00Z";
    // A grant the hub clamped: the claim uses the hub's end of the window.
    let (seq, eid) = issue(&s, key("k-clamped", 1, "active", "2099-01-01T00:00:00Z"));
    let mut r = result(seq, eid, Outcome::Applied, None);
    r.clamped = true;
    r.valid_until = Some(at("2026-12-31T00:00:00.5Z"));
    s.record_result(&hub(), &r).unwrap();
    // A grant the hub refused as expired: not in the hub's set.
    let (seq, eid) = issue(&s, key("k-late", 1, "active", "2099-01-01T00:00:00Z"));
    s.record_result(
        &hub(),
        &result(seq, eid, Outcome::Rejected, Some(Reason::Expired)),
    )
    .unwrap();
    // A grant refused for a tombstone: recorded as revoked.
    let (seq, eid) = issue(&s, key("k-tomb", 1, "active", "2099-01-01T00:00:00Z"));
    s.record_result(
        &hub(),
        &result(seq, eid, Outcome::Rejected, Some(Reason::Revoked)),
    )
    .unwrap();
    assert_eq!(s.key(&hub(), "k-tomb").unwrap().unwrap().state, "revoked");
    // A replay's result and one for an event this cloud does not hold
    // change nothing.
    let (seq, eid) = issue(&s, key("k-kept", 1, "active", "2099-01-01T00:00:00Z"));
    s.record_result(&hub(), &result(seq, eid, Outcome::Applied, None))
        .unwrap();
    let replay = result(seq, eid, Outcome::Rejected, Some(Reason::StaleSeq));
    assert!(s.record_result(&hub(), &replay).unwrap().is_some());
    let stranger = result(seq, uuid::Uuid::new_v4(), Outcome::Rejected, None);
    assert_eq!(s.record_result(&hub(), &stranger).unwrap(), None);
    // A batch: item 0 applied (clamped), item 1 rejected.
    let batch = KeyChange::Batch(vec![
        KeyChange::Insert(key("k-b0", 1, "pre_issued", "2099-01-01T00:00:00Z")),
        KeyChange::Insert(key("k-b1", 1, "pre_issued", "2099-01-01T00:00:00Z")),
    ]);
    let (seq, eid) = mint(&s, "batch", Value::Null, batch);
    let mut r = result(seq, eid, Outcome::Applied, None);
    r.items = Some(vec![
        ItemResult {
            outcome: Outcome::Applied,
            reason: None,
            valid_until: Some(at("2027-01-01T00:00:00Z")),
        },
        ItemResult {
            outcome: Outcome::Rejected,
            reason: Some(Reason::PinCollision),
            valid_until: None,
        },
    ]);
    s.record_result(&hub(), &r).unwrap();
    assert_eq!(s.results_pending(&hub()).unwrap(), 0);
    assert_eq!(
        live_ids(&s, as_of),
        [
            ("k-b0".to_owned(), 1, "2027-01-01T00:00:00".to_owned()),
            ("k-clamped".into(), 1, "2026-12-31T00:00:00".into()),
            ("k-kept".into(), 1, "2099-01-01T00:00:00".into()),
        ]
    );
}

#[test]
fn a_repair_the_hub_answers_noop_finds_the_key_final_there_and_records_it_revoked() {
    let (_dir, s) = store();
    let (seq, eid) = issue(&s, key("k-1", 1, "active", "2099-01-01T00:00:00Z"));
    s.record_result(&hub(), &result(seq, eid, Outcome::Applied, None))
        .unwrap();
    // A duplicate of a first `noop` is not a repair's answer.
    let (seq2, eid2) = issue(&s, key("k-2", 1, "active", "2099-01-01T00:00:00Z"));
    for _ in 0..2 {
        s.record_result(&hub(), &result(seq2, eid2, Outcome::Noop, None))
            .unwrap();
    }
    assert_eq!(s.key(&hub(), "k-2").unwrap().unwrap().state, "active");
    let body = s.grant_body(&hub(), "k-1").unwrap().unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["key"]["key_id"],
        "k-1"
    );
    let (rseq, reid) = mint(
        &s,
        "key.issued",
        Value::Null,
        KeyChange::Reissue {
            key_id: "k-1".into(),
            version: 1,
        },
    );
    assert_eq!(s.results_pending(&hub()).unwrap(), 1);
    let applied = s
        .record_result(&hub(), &result(rseq, reid, Outcome::Noop, None))
        .unwrap()
        .unwrap();
    assert_eq!(applied.revoked, ["k-1"]);
    assert_eq!(s.key(&hub(), "k-1").unwrap().unwrap().state, "revoked");
    assert_eq!(
        live_ids(&s, "2026-12-04T12:00:00Z"),
        [("k-2".to_owned(), 1, "2099-01-01T00:00:00".to_owned())]
    );
}
