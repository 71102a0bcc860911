//! The mirror proof's arithmetic (mqtt.md 'Mirror proof'): which keys are
//! live as of an instant, each live key's line, its bucket, the bucket
//! digests and the mirror digest. Both sides compute it from their own
//! state, so it must be one function; the hub's proof feature and the
//! cloud's claim both call it.
//!
//! Built for incremental use: a [`BucketDigest`] is a plain value a holder
//! can cache per bucket and recompute only for buckets whose keys changed;
//! [`MirrorDigest::from_buckets`] combines 256 of them.

use crate::event::GrantState;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How many buckets a mirror has: one per value of a key's first SHA-256 byte.
pub const BUCKETS: usize = 256;

/// One key as the proof sees it: the values its line uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorKey {
    pub key_id: String,
    pub version: u64,
    /// The state its last applied grant gave (`pre_issued` or `active`),
    /// whatever its state now (`used_up` and `expired` keys are written so).
    pub granted: GrantState,
    /// After the clamp, at full precision.
    pub valid_until: Timestamp,
}

impl MirrorKey {
    /// The key's line: `key_id 0x00 version 0x00 state 0x00 U 0x0A`, with
    /// `version` in decimal and `U` the Unix seconds of `valid_until`,
    /// fraction dropped.
    pub fn line(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.key_id.len() + 40);
        self.write_line(&mut out);
        out
    }

    /// [`MirrorKey::line`], appended to `out`.
    pub fn write_line(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.key_id.as_bytes());
        out.push(0);
        out.extend_from_slice(self.version.to_string().as_bytes());
        out.push(0);
        out.extend_from_slice(self.granted.as_str().as_bytes());
        out.push(0);
        out.extend_from_slice(unix_seconds(self.valid_until).to_string().as_bytes());
        out.push(b'\n');
    }

    /// Its bucket: [`bucket_of`] its `key_id`.
    pub fn bucket(&self) -> u8 {
        bucket_of(&self.key_id)
    }
}

/// Whole Unix seconds of an instant, the fraction dropped (toward the past:
/// an instant half a second before the epoch is second -1).
pub fn unix_seconds(t: Timestamp) -> i64 {
    t.0.div_euclid(Timestamp::MICROS_PER_SEC)
}

/// Whether a key is in the live set as of `as_of`: not revoked (whatever
/// else its state) and `valid_until`, at full precision, after `as_of`.
/// It depends on nothing else: not the doors, not the hub's clock.
pub fn is_live(revoked: bool, valid_until: Timestamp, as_of: Timestamp) -> bool {
    !revoked && valid_until > as_of
}

/// A key's bucket: the first byte of SHA-256 of its `key_id`.
pub fn bucket_of(key_id: &str) -> u8 {
    Sha256::digest(key_id.as_bytes())[0]
}

/// The digest of one bucket: SHA-256 of its lines in `key_id` byte order
/// (of nothing, for an empty bucket).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketDigest(pub [u8; 32]);

impl std::fmt::Debug for BucketDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BucketDigest({})", crate::crypto::b64u_encode(&self.0))
    }
}

impl BucketDigest {
    /// The digest of an empty bucket: SHA-256 of nothing.
    pub fn empty() -> Self {
        BucketDigest(Sha256::digest([]).into())
    }

    /// The digest of one bucket's keys, in any order: they are sorted by
    /// `key_id` bytes here. Every key must belong to the bucket (the caller
    /// grouped them); a `key_id` twice is the caller's bug, written twice.
    pub fn of<'k>(keys: impl IntoIterator<Item = &'k MirrorKey>) -> Self {
        let mut keys: Vec<&MirrorKey> = keys.into_iter().collect();
        keys.sort_unstable_by(|a, b| a.key_id.as_bytes().cmp(b.key_id.as_bytes()));
        let mut h = Sha256::new();
        let mut line = Vec::with_capacity(128);
        for k in keys {
            debug_assert_eq!(k.bucket(), bucket_of(&k.key_id));
            line.clear();
            k.write_line(&mut line);
            h.update(&line);
        }
        BucketDigest(h.finalize().into())
    }
}

/// What a mirror proves: the number of live keys and the digest of its 256
/// bucket digests, and those (a diverged proof sends them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorDigest {
    pub count: u64,
    /// SHA-256 of the 256 bucket digests in bucket order.
    pub digest: [u8; 32],
    pub buckets: Box<[BucketDigest; BUCKETS]>,
}

impl MirrorDigest {
    /// From cached bucket digests and the total count of live keys.
    pub fn from_buckets(buckets: Box<[BucketDigest; BUCKETS]>, count: u64) -> Self {
        let mut h = Sha256::new();
        for b in buckets.iter() {
            h.update(b.0);
        }
        MirrorDigest {
            count,
            digest: h.finalize().into(),
            buckets,
        }
    }

    /// From every live key, in any order (filter with [`is_live`] first).
    pub fn of_live(keys: &[MirrorKey]) -> Self {
        let mut grouped: Vec<Vec<&MirrorKey>> = vec![Vec::new(); BUCKETS];
        for k in keys {
            grouped[usize::from(k.bucket())].push(k);
        }
        let mut buckets = Box::new([BucketDigest::empty(); BUCKETS]);
        for (i, g) in grouped.into_iter().enumerate() {
            if !g.is_empty() {
                buckets[i] = BucketDigest::of(g);
            }
        }
        Self::from_buckets(buckets, keys.len() as u64)
    }
}

/// The cloud's claim in a checkpoint: `"mirror": {"as_of", "count",
/// "digest"}`, `as_of` in whole seconds, `digest` base64url.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorClaim {
    pub as_of: String,
    pub count: u64,
    pub digest: String,
}

/// A checkpoint's claim, read and checked: `as_of` an instant in whole
/// seconds, `digest` 32 bytes. What the hub compares its own digest with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim {
    pub as_of: Timestamp,
    pub count: u64,
    pub digest: [u8; 32],
}

impl Claim {
    /// The checkpoint's `mirror` object, or `None` when it breaks a rule:
    /// `as_of` RFC 3339 with no fraction of a second, `count` an integer
    /// 0..=2^53-1, `digest` base64url of 32 bytes.
    pub fn from_json(v: &serde_json::Value) -> Option<Claim> {
        let o = v.as_object()?;
        let as_of = Timestamp::parse_rfc3339(o.get("as_of")?.as_str()?).ok()?;
        if as_of.0.rem_euclid(Timestamp::MICROS_PER_SEC) != 0 {
            return None;
        }
        let count = crate::event::json_int_in(o.get("count")?, 0, crate::event::MAX_SEQ)?;
        let digest = crate::crypto::b64u_decode_32(o.get("digest")?.as_str()?)?;
        Some(Claim {
            as_of,
            count,
            digest,
        })
    }

    /// The claim a mirror digest makes as of `as_of` (the cloud's side; the
    /// fraction of `as_of` is dropped, as the wire has none).
    pub fn of(m: &MirrorDigest, as_of: Timestamp) -> Claim {
        Claim {
            as_of: Timestamp::from_secs(unix_seconds(as_of)),
            count: m.count,
            digest: m.digest,
        }
    }

    /// The wire form, `as_of` in whole seconds.
    pub fn to_wire(&self) -> MirrorClaim {
        let text = self.as_of.to_rfc3339();
        // `YYYY-MM-DDTHH:MM:SS.ffffffZ`: the fraction is zero; drop it.
        let as_of = match text.split_once('.') {
            Some((whole, _)) => format!("{whole}Z"),
            None => text,
        };
        MirrorClaim {
            as_of,
            count: self.count,
            digest: crate::crypto::b64u_encode(&self.digest),
        }
    }

    /// Whether a mirror digest is what this claim says.
    pub fn matches(&self, m: &MirrorDigest) -> bool {
        self.count == m.count && self.digest == m.digest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{b64u_decode_32, b64u_encode};
    use serde_json::Value;
    use std::collections::BTreeMap;

    fn vector() -> Value {
        let path = format!(
            "{}/../spec/vectors/mqtt/mirror.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        serde_json::from_str(&text).unwrap()
    }

    fn ts(v: &Value) -> Timestamp {
        Timestamp::parse_rfc3339(v.as_str().unwrap()).unwrap()
    }

    fn granted(s: &str) -> GrantState {
        match s {
            "active" => GrantState::Active,
            "pre_issued" => GrantState::PreIssued,
            other => panic!("not a granted state: {other}"),
        }
    }

    /// The vector's keys through the live filter, as the hub would hold them.
    fn live_keys(v: &Value) -> Vec<MirrorKey> {
        let as_of = ts(&v["as_of"]);
        v["keys"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|k| is_live(k["state"] == "revoked", ts(&k["valid_until"]), as_of))
            .map(|k| MirrorKey {
                key_id: k["key_id"].as_str().unwrap().to_owned(),
                version: k["version"].as_u64().unwrap(),
                granted: granted(
                    k.get("granted_state")
                        .unwrap_or(&k["state"])
                        .as_str()
                        .unwrap(),
                ),
                valid_until: ts(&k["valid_until"]),
            })
            .collect()
    }

    #[test]
    fn the_live_filter_keeps_exactly_the_vectors_live_keys() {
        let v = vector();
        let mut got: Vec<String> = live_keys(&v).into_iter().map(|k| k.key_id).collect();
        got.sort();
        let mut want: Vec<String> = v["live"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k.as_str().unwrap().to_owned())
            .collect();
        want.sort();
        assert_eq!(got, want);
    }

    #[test]
    fn every_keys_bucket_is_the_vectors() {
        let v = vector();
        for (id, b) in v["bucket_of"].as_object().unwrap() {
            assert_eq!(u64::from(bucket_of(id)), b.as_u64().unwrap(), "{id}");
        }
    }

    #[test]
    fn every_buckets_lines_are_the_vectors_byte_for_byte() {
        let v = vector();
        let mut lines: BTreeMap<u8, Vec<&MirrorKey>> = BTreeMap::new();
        let keys = live_keys(&v);
        for k in &keys {
            lines.entry(k.bucket()).or_default().push(k);
        }
        let want = v["lines_hex"].as_object().unwrap();
        assert_eq!(lines.len(), want.len());
        for (b, mut ks) in lines {
            ks.sort_by(|a, b| a.key_id.as_bytes().cmp(b.key_id.as_bytes()));
            let got: Vec<String> = ks
                .iter()
                .map(|k| k.line().iter().map(|x| format!("{x:02x}")).collect())
                .collect();
            let want: Vec<&str> = want[&b.to_string()]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_str().unwrap())
                .collect();
            assert_eq!(got, want, "bucket {b}");
        }
    }

    #[test]
    fn the_bucket_digests_count_and_mirror_digest_are_the_vectors() {
        let v = vector();
        let m = MirrorDigest::of_live(&live_keys(&v));
        assert_eq!(m.count, v["count"].as_u64().unwrap());
        assert_eq!(b64u_encode(&m.digest), v["digest"].as_str().unwrap());
        let named = v["bucket_digests"].as_object().unwrap();
        let empty = v["empty_bucket_digest"].as_str().unwrap();
        assert_eq!(b64u_encode(&BucketDigest::empty().0), empty);
        for (i, d) in m.buckets.iter().enumerate() {
            let want = named
                .get(&i.to_string())
                .map_or(empty, |d| d.as_str().unwrap());
            assert_eq!(b64u_encode(&d.0), want, "bucket {i}");
        }
    }

    #[test]
    fn an_empty_mirror_has_the_vectors_empty_digest_and_no_keys() {
        let v = vector();
        let m = MirrorDigest::of_live(&[]);
        assert_eq!(m.count, 0);
        assert_eq!(
            b64u_encode(&m.digest),
            v["empty_mirror_digest"].as_str().unwrap()
        );
    }

    #[test]
    fn cached_bucket_digests_combine_to_the_same_mirror_digest() {
        let v = vector();
        let keys = live_keys(&v);
        let whole = MirrorDigest::of_live(&keys);
        // A holder that keeps each bucket's digest and recomputes only one.
        let mut cached = whole.buckets.clone();
        let b = keys[0].bucket();
        let in_b: Vec<&MirrorKey> = keys.iter().filter(|k| k.bucket() == b).collect();
        cached[usize::from(b)] = BucketDigest::of(in_b.iter().rev().copied());
        assert_eq!(MirrorDigest::from_buckets(cached, whole.count), whole);
        // A key's changed version changes its bucket's digest and the mirror's.
        let mut changed = keys.clone();
        changed[0].version += 1;
        let m = MirrorDigest::of_live(&changed);
        assert_ne!(m.digest, whole.digest);
        assert_ne!(m.buckets[usize::from(b)], whole.buckets[usize::from(b)]);
        assert_eq!(
            m.buckets
                .iter()
                .filter(|d| whole.buckets.contains(d))
                .count(),
            BUCKETS - 1
        );
    }

    #[test]
    fn a_key_ending_exactly_at_as_of_is_out_and_half_a_second_later_is_in_written_in_whole_seconds()
    {
        let as_of = Timestamp::parse_rfc3339("2026-12-04T12:00:00Z").unwrap();
        assert!(!is_live(false, as_of, as_of));
        let half = as_of.saturating_add_micros(500_000);
        assert!(is_live(false, half, as_of));
        assert!(!is_live(true, half, as_of));
        let k = MirrorKey {
            key_id: "k".into(),
            version: 10,
            granted: GrantState::PreIssued,
            valid_until: half,
        };
        assert_eq!(k.line(), b"k\x0010\x00pre_issued\x001796385600\n");
        assert_eq!(unix_seconds(Timestamp(-1)), -1);
    }

    #[test]
    fn a_checked_claim_needs_whole_seconds_an_integer_count_and_a_32_byte_digest() {
        let v = vector();
        let m = MirrorDigest::of_live(&live_keys(&v));
        let c = Claim::of(&m, ts(&v["as_of"]));
        let wire = serde_json::to_value(c.to_wire()).unwrap();
        assert_eq!(wire["as_of"], v["as_of"]);
        assert_eq!(Claim::from_json(&wire), Some(c));
        assert!(c.matches(&m));
        assert!(!c.matches(&MirrorDigest::of_live(&[])));
        for (k, bad) in [
            ("as_of", serde_json::json!("2026-12-04T12:00:00.5Z")),
            ("as_of", serde_json::json!("yesterday")),
            ("count", serde_json::json!(-1)),
            ("count", serde_json::json!(1.5)),
            ("digest", serde_json::json!("AAAA")),
            ("digest", serde_json::json!(7)),
        ] {
            let mut w = wire.clone();
            w[k] = bad.clone();
            assert_eq!(Claim::from_json(&w), None, "{k} = {bad}");
        }
        let mut w = wire.clone();
        w.as_object_mut().unwrap().remove("count");
        assert_eq!(Claim::from_json(&w), None);
    }

    #[test]
    fn a_claim_reads_and_writes_the_checkpoints_mirror_object() {
        let text = r#"{"as_of":"2026-12-04T12:00:00Z","count":51,"digest":"k9qDvy-4VLGaYbKz2gSJrRW7-eyIlf55eANq-XSx_R0"}"#;
        let c: MirrorClaim = serde_json::from_str(text).unwrap();
        assert_eq!(c.count, 51);
        assert!(b64u_decode_32(&c.digest).is_some());
        assert_eq!(serde_json::to_string(&c).unwrap(), text);
    }
}
