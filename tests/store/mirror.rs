//! `store::mirror` against real SQLite files: the bucket cache agrees with a
//! cold recompute whatever changed, the granted state of an ended key, the
//! clamped result's `valid_until`, and what an event asks of the proof.

use lockhub::store::Priority;
use lockhub::store::mirror::{MirrorCache, ProofAsk, cold_digest, in_snapshot};
use lockhub_proto::event::{EventKind, GrantState};
use lockhub_proto::mirror::{Claim, MirrorDigest};
use lockhub_proto::time::Timestamp;
use testkit::store::*;

use GrantState::{Active, PreIssued};

fn at(s: &str) -> Timestamp {
    Timestamp::parse_rfc3339(s).unwrap()
}

/// A small deterministic generator: the test must be repeatable.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

fn cached(hub: &Hub, cache: &mut MirrorCache, as_of: Timestamp) -> MirrorDigest {
    let r = hub.reader();
    in_snapshot(&r, |c| cache.refresh(c)).unwrap();
    cache.digest(as_of)
}

fn cold(hub: &Hub, as_of: Timestamp) -> MirrorDigest {
    cold_digest(&hub.reader(), as_of).unwrap()
}

#[test]
fn the_bucket_cache_gives_the_cold_digest_after_random_changes_and_moves_of_as_of() {
    let hub = Hub::new();
    let mut rng = Lcg(26);
    let base = at("2099-01-01T00:00:00Z");
    let mut seq = 0u64;
    let mut next = |hub: &Hub, change| {
        seq += 1;
        hub.change(u128::from(seq), seq, change)
    };
    // 300 keys with windows ending over 30 days, so an as_of in between
    // splits them.
    for i in 0..300u64 {
        let mut g = grant(&format!("k-{i}"), 1, Active, &format!("c-{i}"), 0);
        g.pin_tag.0 = [0; 32];
        g.pin_tag.0[..8].copy_from_slice(&i.to_le_bytes());
        g.valid_until = base.saturating_add_secs(3_600 + (i as i64) * 8_640);
        next(&hub, issue(g));
    }
    let mut cache = MirrorCache::default();
    let mut as_of = base.saturating_add_secs(86_400 * 10);
    assert_eq!(cached(&hub, &mut cache, as_of), cold(&hub, as_of));
    assert_eq!(cache.recomputed, 256, "cold: every bucket");
    assert_eq!(cached(&hub, &mut cache, as_of), cold(&hub, as_of));
    assert_eq!(cache.recomputed, 0, "nothing changed: no bucket");

    let mut fresh = 300u64;
    for round in 0..20 {
        for _ in 0..5 {
            let i = rng.next(fresh);
            match rng.next(3) {
                0 => {
                    next(&hub, revoke(&format!("k-{i}"), "checkout"));
                }
                1 => {
                    // An upgrade (noop or refused for a revoked key: fine).
                    let mut g = grant(&format!("k-{i}"), 2 + round, Active, &format!("c-{i}"), 0);
                    g.pin_tag.0 = [0; 32];
                    g.pin_tag.0[..8].copy_from_slice(&i.to_le_bytes());
                    g.valid_until = base.saturating_add_secs(rng.next(30 * 86_400) as i64 + 1);
                    next(&hub, issue(g));
                }
                _ => {
                    let mut g = grant(&format!("k-{fresh}"), 1, PreIssued, "", 0);
                    g.reservation_id = Some(format!("r-{fresh}"));
                    g.pin_tag.0 = [0; 32];
                    g.pin_tag.0[..8].copy_from_slice(&fresh.to_le_bytes());
                    g.valid_until = base.saturating_add_secs(rng.next(30 * 86_400) as i64 + 1);
                    next(&hub, issue(g));
                    fresh += 1;
                }
            }
        }
        // as_of moves forward and, now and then, back.
        as_of = as_of.saturating_add_secs(rng.next(2 * 86_400) as i64 - 40_000);
        let got = cached(&hub, &mut cache, as_of);
        assert_eq!(got, cold(&hub, as_of), "round {round}");
        assert!(cache.recomputed < 256, "round {round}: only what changed");
    }
}

#[test]
fn a_row_deleted_or_changed_by_hand_is_seen_by_the_cache() {
    let hub = Hub::new();
    for i in 0..20u64 {
        let mut g = grant(&format!("k-{i}"), 1, Active, &format!("c-{i}"), i as u8);
        g.valid_until = at("2099-01-31T00:00:00Z");
        hub.change(u128::from(i + 1), i + 1, issue(g));
    }
    let as_of = at("2099-01-10T00:00:00Z");
    let mut cache = MirrorCache::default();
    let before = cached(&hub, &mut cache, as_of);
    assert_eq!(before.count, 20);
    testkit::db::delete_key_by_hand(&hub.db_path(), "k-3");
    let w = rusqlite::Connection::open(hub.db_path()).unwrap();
    w.execute("UPDATE keys SET version = 9 WHERE key_id = 'k-4'", [])
        .unwrap();
    let after = cached(&hub, &mut cache, as_of);
    assert_eq!(after, cold(&hub, as_of));
    assert_eq!(after.count, 19);
    let differ = (0..256)
        .filter(|&b| after.buckets[b] != before.buckets[b])
        .count();
    assert!((1..=2).contains(&differ), "{differ} buckets differ");
}

#[test]
fn an_ended_key_inside_its_window_keeps_the_state_its_grant_gave() {
    let hub = Hub::new();
    let mut g = grant("k-pre", 1, PreIssued, "", 1);
    g.reservation_id = Some("r-1".into());
    hub.change(1, 1, issue(g));
    hub.change(2, 2, issue(grant("k-act", 1, Active, "c-1", 2)));
    let as_of = at("2099-01-10T00:00:00Z");
    let want = |granted_pre: GrantState| {
        let mut cache = MirrorCache::default();
        let r = hub.reader();
        in_snapshot(&r, |c| cache.refresh(c)).unwrap();
        let b = lockhub_proto::mirror::bucket_of("k-pre");
        let keys = cache.bucket_keys(b, as_of);
        assert_eq!(
            keys.iter().find(|k| k.key_id == "k-pre").unwrap().state,
            granted_pre
        );
    };
    want(PreIssued);
    // Both end (the sweep's transition), inside their window as of as_of.
    hub.store
        .write_blocking(Priority::Bulk, |c| {
            c.execute("UPDATE keys SET state = 'expired', updated_at = 1", [])?;
            Ok(())
        })
        .unwrap();
    want(PreIssued);
    let lines = cold(&hub, as_of);
    assert_eq!(
        lines.count, 2,
        "expired keys inside their window are live as of as_of"
    );
    let b = lockhub_proto::mirror::bucket_of("k-act");
    let mut cache = MirrorCache::default();
    let r = hub.reader();
    in_snapshot(&r, |c| cache.refresh(c)).unwrap();
    assert_eq!(cache.bucket_keys(b, as_of)[0].state, Active);
    // Ended before as_of: not in the set.
    assert!(cache.bucket_keys(b, at("2099-02-01T00:00:00Z")).is_empty());
}

#[test]
fn a_clamped_grants_result_carries_the_window_end_after_the_clamp() {
    let hub = Hub::new();
    let mut g = grant("k-1", 1, Active, "c-1", 1);
    g.valid_until = at("2099-12-31T00:00:00Z");
    let a = hub.change(1, 1, issue(g.clone()));
    assert!(a.result.clamped);
    assert_eq!(
        a.result.valid_until,
        Some(g.valid_from.saturating_add_days(60))
    );
    let plain = hub.change(2, 2, issue(grant("k-2", 1, Active, "c-2", 2)));
    assert_eq!(
        (plain.result.clamped, plain.result.valid_until),
        (false, None)
    );
    // The duplicate replays it.
    let again = hub.change(1, 1, issue(g));
    assert!(again.result.duplicate);
    assert_eq!(again.result.valid_until, a.result.valid_until);
}

#[test]
fn a_first_seen_claim_or_request_asks_the_proof_and_its_duplicate_does_not() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    let claim = Claim {
        as_of: at("2099-01-10T00:00:00Z"),
        count: 1,
        digest: [7; 32],
    };
    let cp = || {
        Ok(EventKind::Checkpoint {
            head_seq: 1,
            mirror: Some(claim),
        })
    };
    let a = hub.apply(10, None, cp(), "cp-10");
    assert_eq!(
        a.proof,
        Some(ProofAsk::Claim {
            head_seq: 1,
            claim,
            watermark: 1,
            gap: false
        })
    );
    assert_eq!(hub.apply(10, None, cp(), "cp-10").proof, None);
    let req = || {
        Ok(EventKind::MirrorRequest {
            as_of: claim.as_of,
            buckets: vec![3, 9],
        })
    };
    let r = hub.apply(11, None, req(), "req-11");
    assert_eq!(r.result.outcome, lockhub_proto::event::Outcome::Noop);
    assert!(matches!(r.proof, Some(ProofAsk::Buckets { .. })));
    let dup = hub.apply(11, None, req(), "req-11");
    assert!(dup.result.duplicate);
    assert_eq!(dup.proof, None);
    // A checkpoint without a claim asks nothing.
    let plain = hub.apply(
        12,
        None,
        Ok(EventKind::Checkpoint {
            head_seq: 1,
            mirror: None,
        }),
        "cp-12",
    );
    assert_eq!(plain.proof, None);
}

/// spec/vectors/mqtt/mirror.json through the hub's own path: each key
/// stored as the hub stores it (issued by an event, then revoked by one,
/// or ended, swept or used up by the transitions the schema allows), and
/// the proof read from the database, cold and through the cache, gives
/// the vector's count, digest and every bucket's digest. The arithmetic is
/// lockhub-proto's (tested there on the same file); this shows the hub's
/// rows map to the vector's lines: the granted state of an ended key, the
/// version, `valid_until` at full precision, revoked keys left out.
#[test]
fn the_mirror_vector_stored_as_the_hub_stores_keys_gives_its_count_digest_and_buckets() {
    use lockhub_proto::crypto::b64u_encode;
    use lockhub_proto::event::Change;
    let path = format!("{}/mirror.json", testkit::files::VECTORS_DIR);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let as_of = at(v["as_of"].as_str().unwrap());
    let before = at("2026-11-01T00:00:00Z");
    let hub = Hub::new();
    let mut seq = 0u64;
    let mut next = |change| {
        seq += 1;
        hub.apply_at(
            u128::from(seq),
            Some(seq),
            Ok(EventKind::Change(change)),
            &format!("body-{seq}"),
            before,
            before,
        )
    };
    let keys = v["keys"].as_array().unwrap();
    for (i, k) in keys.iter().enumerate() {
        let id = k["key_id"].as_str().unwrap();
        let state = k["state"].as_str().unwrap();
        let granted = match k
            .get("granted_state")
            .map_or(state, |g| g.as_str().unwrap())
        {
            "pre_issued" => PreIssued,
            // A revoked key's grant does not matter: it is not in the set.
            _ => Active,
        };
        let version = k["version"].as_u64().unwrap();
        let mut g = grant(id, version, granted, &format!("c-{i}"), 0);
        if granted == PreIssued {
            g.reservation_id = Some(format!("r-{i}"));
        }
        g.pin_tag.0[..8].copy_from_slice(&(i as u64).to_le_bytes());
        // Windows of 30 days, inside the hub's longest (it would clamp one
        // longer, and the line would carry the clamped end).
        g.valid_until = at(k["valid_until"].as_str().unwrap());
        g.valid_from = g.valid_until.saturating_add_secs(-30 * 86_400);
        if state == "used_up" {
            g.max_uses = Some(1);
        }
        next(issue(g));
        let set = match state {
            "revoked" => {
                next(Change::KeyRevoked {
                    key_id: id.into(),
                    version,
                    reason: "checked_out".into(),
                });
                continue;
            }
            "expired" => "state = 'expired'",
            "used_up" => "use_count = 1, state = 'used_up'",
            _ => continue,
        };
        let (sql, id) = (
            format!("UPDATE keys SET {set} WHERE key_id = ?1"),
            id.to_owned(),
        );
        hub.store
            .write_blocking(Priority::Bulk, move |c| {
                assert_eq!(c.execute(&sql, [&id])?, 1);
                Ok(())
            })
            .unwrap();
    }
    for k in keys {
        let id = k["key_id"].as_str().unwrap();
        assert_eq!(hub.state(id).as_deref(), k["state"].as_str(), "{id}");
    }

    let cold = cold(&hub, as_of);
    let mut cache = MirrorCache::default();
    assert_eq!(cached(&hub, &mut cache, as_of), cold);
    assert_eq!(cold.count, v["count"].as_u64().unwrap());
    assert_eq!(b64u_encode(&cold.digest), v["digest"].as_str().unwrap());
    let empty = v["empty_bucket_digest"].as_str().unwrap();
    let buckets = v["bucket_digests"].as_object().unwrap();
    for b in 0..256usize {
        let want = buckets
            .get(&b.to_string())
            .map_or(empty, |d| d.as_str().unwrap());
        assert_eq!(b64u_encode(&cold.buckets[b].0), want, "bucket {b}");
    }
}
