//! The cloud's side of the mirror proof (docs/protocol/mqtt.md 'Mirror
//! proof'), as plain functions over plain data: the live set the cloud
//! claims, which buckets of a diverged proof differ, and what repairs a
//! bucket the hub answered with. The arithmetic (lines, buckets, digests)
//! is `lockhub_proto::mirror`'s, the one the hub uses; nothing here hashes a
//! line of its own. Signing and storing the repairs is `ops`'s; `serve`
//! decides when.

use crate::store::KeyRecord;
use lockhub_proto::crypto::b64u_encode;
use lockhub_proto::event::GrantState;
use lockhub_proto::mirror::{MirrorDigest, MirrorKey, bucket_of, is_live};
use lockhub_proto::outputs::ProofKey;
use lockhub_proto::time::Timestamp;
use std::collections::BTreeMap;

/// The most buckets one `mirror.request` asks for (mqtt.md).
pub const MAX_BUCKETS_PER_REQUEST: usize = lockhub_proto::event::MAX_REQUEST_BUCKETS;

/// The cloud's live set as of `as_of`: the keys the hub should hold (the
/// store's `claim_keys`: not revoked, taken by the hub, the window after
/// the hub's clamp) whose window ends after `as_of`. A key whose record
/// cannot be read (never written so by this crate) is left out, and the
/// proof then shows the difference.
pub fn live_set(keys: &[KeyRecord], as_of: Timestamp) -> Vec<MirrorKey> {
    keys.iter()
        .filter_map(|k| {
            let granted = match k.state.as_str() {
                "active" => GrantState::Active,
                "pre_issued" => GrantState::PreIssued,
                _ => return None,
            };
            let valid_until = Timestamp::parse_rfc3339(&k.valid_until).ok()?;
            is_live(false, valid_until, as_of).then(|| MirrorKey {
                key_id: k.key_id.clone(),
                version: k.version,
                granted,
                valid_until,
            })
        })
        .collect()
}

/// The buckets whose digests differ between the cloud's mirror and a
/// diverged proof's 256 bucket digests (base64url), in bucket order. A
/// proof without exactly 256 is treated as differing everywhere.
pub fn differing_buckets(cloud: &MirrorDigest, hub_buckets: &[String]) -> Vec<u8> {
    if hub_buckets.len() != cloud.buckets.len() {
        return (0..=u8::MAX).collect();
    }
    cloud
        .buckets
        .iter()
        .zip(hub_buckets)
        .enumerate()
        .filter(|(_, (c, h))| b64u_encode(&c.0) != **h)
        .map(|(n, _)| n as u8)
        .collect()
}

/// The live keys of each of `buckets` (every one of them present, empty
/// when the cloud holds none there).
pub fn by_bucket(live: Vec<MirrorKey>, buckets: &[u8]) -> BTreeMap<u8, Vec<MirrorKey>> {
    let mut out: BTreeMap<u8, Vec<MirrorKey>> = buckets.iter().map(|b| (*b, Vec::new())).collect();
    for k in live {
        if let Some(keys) = out.get_mut(&k.bucket()) {
            keys.push(k);
        }
    }
    out
}

/// The `mirror.request`s for `buckets`: at most 16 buckets each.
pub fn requests(buckets: &[u8]) -> Vec<Vec<u8>> {
    buckets
        .chunks(MAX_BUCKETS_PER_REQUEST)
        .map(<[u8]>::to_vec)
        .collect()
}

/// One repair, an ordinary signed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    /// The hub holds a key the cloud does not hold live: `key.revoked`
    /// with reason `reconcile`, at the hub's version.
    Revoke { key_id: String, version: u64 },
    /// The hub lacks a key the cloud holds live (`key.issued` at the
    /// cloud's version: a hub that holds it final or tombstoned refuses it,
    /// and the cloud records it revoked), or holds it on other terms
    /// (`key.issued` at a version above both, with the cloud's terms).
    Issue { key_id: String, version: u64 },
}

/// The reason a repair's revoke carries (mqtt.md).
pub const RECONCILE: &str = "reconcile";

/// What repairs one bucket: the cloud's live keys in it against the keys
/// the hub answered with. Lines are compared as the proof compares them.
/// Keys of other buckets, on either side, are ignored.
pub fn repairs(bucket: u8, cloud: &[MirrorKey], hub: &[ProofKey]) -> Vec<Repair> {
    let cloud: BTreeMap<&str, &MirrorKey> = cloud
        .iter()
        .filter(|k| k.bucket() == bucket)
        .map(|k| (k.key_id.as_str(), k))
        .collect();
    let hub: BTreeMap<&str, MirrorKey> = hub
        .iter()
        .filter(|k| bucket_of(&k.key_id) == bucket)
        .map(|k| {
            (
                k.key_id.as_str(),
                MirrorKey {
                    key_id: k.key_id.clone(),
                    version: k.version,
                    granted: k.state,
                    valid_until: Timestamp::from_secs(k.valid_until),
                },
            )
        })
        .collect();
    let mut out = Vec::new();
    for (id, h) in &hub {
        match cloud.get(id) {
            None => out.push(Repair::Revoke {
                key_id: (*id).to_owned(),
                version: h.version,
            }),
            Some(c) if c.line() != h.line() => out.push(Repair::Issue {
                key_id: (*id).to_owned(),
                version: c.version.max(h.version) + 1,
            }),
            Some(_) => {}
        }
    }
    for (id, c) in &cloud {
        if !hub.contains_key(id) {
            out.push(Repair::Issue {
                key_id: (*id).to_owned(),
                version: c.version,
            });
        }
    }
    // Revokes first: a key issued again must not meet, on the hub, a key
    // that is about to go (one active key per check-in).
    out.sort_by_key(|r| matches!(r, Repair::Issue { .. }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, version: u64, state: &str, until: &str) -> KeyRecord {
        KeyRecord {
            key_id: id.into(),
            version,
            state: state.into(),
            check_in_id: None,
            reservation_id: None,
            doors: vec!["101".into()],
            valid_from: "2026-12-01T00:00:00Z".into(),
            valid_until: until.into(),
            holder_ref: None,
            seq: 1,
        }
    }

    fn at(s: &str) -> Timestamp {
        Timestamp::parse_rfc3339(s).unwrap()
    }

    fn proof_key(k: &MirrorKey) -> ProofKey {
        ProofKey {
            key_id: k.key_id.clone(),
            version: k.version,
            state: k.granted,
            valid_until: lockhub_proto::mirror::unix_seconds(k.valid_until),
        }
    }

    #[test]
    fn the_live_set_holds_keys_whose_window_ends_after_as_of_and_no_revoked_one() {
        let keys = [
            key("k-a", 1, "active", "2026-12-10T00:00:00Z"),
            key("k-b", 1, "pre_issued", "2026-12-04T12:00:00.5Z"),
            key("k-c", 1, "active", "2026-12-04T12:00:00Z"),
            key("k-d", 1, "revoked", "2026-12-10T00:00:00Z"),
        ];
        let live = live_set(&keys, at("2026-12-04T12:00:00Z"));
        let ids: Vec<&str> = live.iter().map(|k| k.key_id.as_str()).collect();
        assert_eq!(ids, ["k-a", "k-b"], "an end at as_of is not after it");
        assert_eq!(live[1].granted, GrantState::PreIssued);
    }

    #[test]
    fn only_the_buckets_whose_digests_differ_are_asked_for_sixteen_at_a_time() {
        let as_of = at("2026-12-04T12:00:00Z");
        let cloud = live_set(
            &[
                key("k-a", 1, "active", "2026-12-10T00:00:00Z"),
                key("k-b", 1, "active", "2026-12-10T00:00:00Z"),
            ],
            as_of,
        );
        let hub = live_set(&[key("k-a", 1, "active", "2026-12-10T00:00:00Z")], as_of);
        let hub_buckets: Vec<String> = MirrorDigest::of_live(&hub)
            .buckets
            .iter()
            .map(|b| b64u_encode(&b.0))
            .collect();
        let differ = differing_buckets(&MirrorDigest::of_live(&cloud), &hub_buckets);
        assert_eq!(differ, [bucket_of("k-b")]);
        let kept = by_bucket(cloud.clone(), &differ);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[&bucket_of("k-b")][0].key_id, "k-b");
        assert!(differing_buckets(&MirrorDigest::of_live(&hub), &hub_buckets).is_empty());
        let all: Vec<u8> = (0..=255).collect();
        let reqs = requests(&all);
        assert_eq!(reqs.len(), 16);
        assert!(reqs.iter().all(|r| r.len() == 16));
    }

    #[test]
    fn a_bucket_is_repaired_by_revoking_extra_keys_and_issuing_missing_or_changed_ones() {
        let as_of = at("2026-12-04T12:00:00Z");
        // Keys of one bucket: find ids that share a bucket with "k-0".
        let b = bucket_of("k-0");
        let ids: Vec<String> = (0..5000)
            .map(|n| format!("k-{n}"))
            .filter(|id| bucket_of(id) == b)
            .take(4)
            .collect();
        assert_eq!(ids.len(), 4);
        let cloud = live_set(
            &[
                key(&ids[0], 1, "active", "2026-12-10T00:00:00Z"), // same on both
                key(&ids[1], 1, "active", "2026-12-10T00:00:00Z"), // the hub lacks it
                key(&ids[2], 2, "active", "2026-12-10T00:00:00Z"), // the hub's differs
            ],
            as_of,
        );
        let mut changed = proof_key(&cloud[2]);
        changed.valid_until += 86_400;
        changed.version = 3;
        let extra = ProofKey {
            key_id: ids[3].clone(),
            version: 4,
            state: GrantState::Active,
            valid_until: changed.valid_until,
        };
        let hub = [proof_key(&cloud[0]), changed, extra];
        let mut got = repairs(b, &cloud, &hub);
        got.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        let mut want = vec![
            Repair::Issue {
                key_id: ids[1].clone(),
                version: 1,
            },
            Repair::Issue {
                key_id: ids[2].clone(),
                version: 4,
            },
            Repair::Revoke {
                key_id: ids[3].clone(),
                version: 4,
            },
        ];
        want.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        assert_eq!(got, want);
        assert!(repairs(b, &cloud[..1], &hub[..1]).is_empty());
    }
}
