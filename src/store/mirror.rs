//! The mirror as the proof sees it (docs/protocol/mqtt.md 'Mirror proof'):
//! every key that is not revoked, with the values its proof line uses, read
//! from one snapshot on a read connection, never the writer.
//!
//! Cheap at any size: [`MirrorCache`] keeps every such key in memory, by
//! bucket, and each bucket's digest with the span of `as_of` it holds for.
//! A proof reads only the keys that `mirror_changes` (written by triggers on
//! `keys`, so a hand edit is seen too) lists since the last proof, and
//! recomputes only their buckets and the buckets where a key's
//! `valid_until` lies between the two proofs' `as_of`. The arithmetic is
//! `lockhub_proto::mirror`'s; nothing here hashes a line of its own.

use super::StoreError;
use super::apply::seq::watermark_and_gap;
use lockhub_proto::event::GrantState;
use lockhub_proto::mirror::{BUCKETS, BucketDigest, Claim, MirrorDigest, MirrorKey, bucket_of};
use lockhub_proto::outputs::ProofKey;
use lockhub_proto::time::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};

/// What an event asks the proof to do once it has committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProofAsk {
    /// A checkpoint with a claim: compare, when the seqs seen are exactly
    /// 1..=`head_seq`.
    Claim {
        head_seq: u64,
        claim: Claim,
        /// The seq state right after the checkpoint was counted.
        watermark: u64,
        gap: bool,
    },
    /// A `mirror.request`: the keys of `buckets` as of `as_of`.
    Buckets {
        as_of: Timestamp,
        buckets: Vec<u8>,
        watermark: u64,
        gap: bool,
    },
}

impl ProofAsk {
    /// What a first-seen event asks of the proof, given the seq state right
    /// after it was counted: a checkpoint with a claim, or a request.
    pub fn of(
        kind: Result<lockhub_proto::event::EventKind, lockhub_proto::event::SchemaError>,
        watermark: u64,
        gap: bool,
    ) -> Option<ProofAsk> {
        use lockhub_proto::event::EventKind;
        match kind {
            Ok(EventKind::Checkpoint {
                head_seq,
                mirror: Some(claim),
            }) => Some(ProofAsk::Claim {
                head_seq,
                claim,
                watermark,
                gap,
            }),
            Ok(EventKind::MirrorRequest { as_of, buckets }) => Some(ProofAsk::Buckets {
                as_of,
                buckets,
                watermark,
                gap,
            }),
            _ => None,
        }
    }
}

/// The seq state and the mirror, read in one snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqSnapshot {
    pub watermark: u64,
    pub gap: bool,
}

/// One bucket's digest as of some instant, and the span of instants it
/// holds for: `[from, until)`, between the latest `valid_until` of its keys
/// at or before that instant and the earliest after it.
#[derive(Debug, Clone, Copy)]
struct Cached {
    digest: BucketDigest,
    count: u64,
    from: i64,
    until: i64,
}

impl Cached {
    fn holds_at(&self, t: Timestamp) -> bool {
        self.from <= t.0 && t.0 < self.until
    }
}

/// Every key that is not revoked, by bucket, sorted by `key_id` bytes, and
/// each bucket's last digest. Starts cold; [`MirrorCache::refresh`] warms it.
#[derive(Debug)]
pub struct MirrorCache {
    keys: Vec<Vec<MirrorKey>>,
    digests: Vec<Option<Cached>>,
    /// The last `mirror_changes.seq` read; `None` while cold.
    last_change: Option<i64>,
    /// Buckets recomputed by the last [`MirrorCache::digest`] (for figures).
    pub recomputed: usize,
}

impl Default for MirrorCache {
    fn default() -> Self {
        MirrorCache {
            keys: vec![Vec::new(); BUCKETS],
            digests: vec![None; BUCKETS],
            last_change: None,
            recomputed: 0,
        }
    }
}

/// The line state of a key row: its state while live, else the state its
/// last grant gave (`mirror_granted`). The schema keeps that table; the
/// fallback (an active key always has a check-in) is for a row written by
/// hand without one.
const KEY_COLUMNS: &str = "k.key_id, k.version, k.valid_until,
       CASE WHEN k.state = 'pre_issued' OR k.state = 'active' THEN k.state
            ELSE coalesce(g.state, CASE WHEN k.check_in_id IS NULL THEN 'pre_issued'
                                        ELSE 'active' END) END
  FROM keys k LEFT JOIN mirror_granted g ON g.key_id = k.key_id
 WHERE k.state <> 'revoked'";

fn key_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<MirrorKey> {
    let granted: String = r.get(3)?;
    Ok(MirrorKey {
        key_id: r.get(0)?,
        version: r.get::<_, i64>(1)? as u64,
        valid_until: Timestamp(r.get(2)?),
        granted: if granted == "active" {
            GrantState::Active
        } else {
            GrantState::PreIssued
        },
    })
}

impl MirrorCache {
    /// Brings the cache to the snapshot of `conn`'s read transaction (the
    /// caller holds one open) and returns the seq state of that snapshot.
    pub fn refresh(&mut self, conn: &Connection) -> Result<SeqSnapshot, StoreError> {
        let (watermark, gap) = watermark_and_gap(conn)?;
        let (oldest, newest): (Option<i64>, Option<i64>) = conn
            .prepare_cached("SELECT min(seq), max(seq) FROM mirror_changes")?
            .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        let newest = newest.unwrap_or(0);
        match self.last_change {
            // Rows it has not read were pruned (the table is bounded): cold.
            Some(last) if oldest.is_some_and(|o| o > last + 1) => self.load_all(conn, newest)?,
            Some(last) => self.apply_changes(conn, last)?,
            None => self.load_all(conn, newest)?,
        }
        Ok(SeqSnapshot { watermark, gap })
    }

    /// The last change read: proofs that used it may let the schema forget
    /// the rows up to it ([`forget_changes`]).
    pub fn last_change(&self) -> Option<i64> {
        self.last_change
    }

    fn load_all(&mut self, conn: &Connection, newest: i64) -> Result<(), StoreError> {
        let mut keys: Vec<Vec<MirrorKey>> = vec![Vec::new(); BUCKETS];
        let mut stmt = conn.prepare(&format!("SELECT {KEY_COLUMNS}"))?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let k = key_from_row(r)?;
            keys[usize::from(k.bucket())].push(k);
        }
        for b in &mut keys {
            b.sort_unstable_by(|x, y| x.key_id.as_bytes().cmp(y.key_id.as_bytes()));
        }
        self.keys = keys;
        self.digests = vec![None; BUCKETS];
        self.last_change = Some(newest);
        Ok(())
    }

    fn apply_changes(&mut self, conn: &Connection, last: i64) -> Result<(), StoreError> {
        let changed: Vec<(i64, String)> = conn
            .prepare_cached("SELECT seq, key_id FROM mirror_changes WHERE seq > ?1 ORDER BY seq")?
            .query_map([last], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let mut one = conn.prepare_cached(&format!("SELECT {KEY_COLUMNS} AND k.key_id = ?1"))?;
        let mut done = std::collections::HashSet::new();
        for (seq, key_id) in &changed {
            self.last_change = Some(*seq);
            if !done.insert(key_id.as_str()) {
                continue;
            }
            let row = one.query_row([key_id], key_from_row).optional()?;
            let b = usize::from(bucket_of(key_id));
            let list = &mut self.keys[b];
            let at = list.binary_search_by(|k| k.key_id.as_bytes().cmp(key_id.as_bytes()));
            match (at, row) {
                (Ok(i), Some(k)) => list[i] = k,
                (Err(i), Some(k)) => list.insert(i, k),
                (Ok(i), None) => {
                    list.remove(i);
                }
                (Err(_), None) => {}
            }
            self.digests[b] = None;
        }
        Ok(())
    }

    /// The mirror digest as of `as_of`, recomputing only the buckets whose
    /// keys changed since they were computed or whose cached span does not
    /// hold `as_of`.
    pub fn digest(&mut self, as_of: Timestamp) -> MirrorDigest {
        let mut buckets = Box::new([BucketDigest::empty(); BUCKETS]);
        let mut count = 0;
        self.recomputed = 0;
        for (b, keys) in self.keys.iter().enumerate() {
            let cached = match self.digests[b] {
                Some(c) if c.holds_at(as_of) => c,
                _ => {
                    self.recomputed += 1;
                    let c = bucket_digest(keys, as_of);
                    self.digests[b] = Some(c);
                    c
                }
            };
            buckets[b] = cached.digest;
            count += cached.count;
        }
        MirrorDigest::from_buckets(buckets, count)
    }

    /// The live keys of one bucket as of `as_of`, in `key_id` order, as a
    /// bucket answer lists them.
    pub fn bucket_keys(&self, bucket: u8, as_of: Timestamp) -> Vec<ProofKey> {
        self.keys[usize::from(bucket)]
            .iter()
            .filter(|k| k.valid_until > as_of)
            .map(|k| ProofKey {
                key_id: k.key_id.clone(),
                version: k.version,
                state: k.granted,
                valid_until: lockhub_proto::mirror::unix_seconds(k.valid_until),
            })
            .collect()
    }
}

fn bucket_digest(keys: &[MirrorKey], as_of: Timestamp) -> Cached {
    let (mut from, mut until) = (i64::MIN, i64::MAX);
    for k in keys {
        let vu = k.valid_until.0;
        if vu > as_of.0 {
            until = until.min(vu);
        } else {
            from = from.max(vu);
        }
    }
    let live: Vec<&MirrorKey> = keys.iter().filter(|k| k.valid_until > as_of).collect();
    Cached {
        digest: BucketDigest::of(live.iter().copied()),
        count: live.len() as u64,
        from,
        until,
    }
}

/// The mirror digest as of `as_of`, computed from nothing: every key read
/// and hashed. What the cache must always agree with (its tests and the
/// proof benchmark check it; the daemon itself never needs it).
#[cfg(any(test, feature = "testing"))]
pub fn cold_digest(conn: &Connection, as_of: Timestamp) -> Result<MirrorDigest, StoreError> {
    let mut stmt = conn.prepare(&format!("SELECT {KEY_COLUMNS} AND k.valid_until > ?1"))?;
    let keys: Vec<MirrorKey> = stmt
        .query_map([as_of.0], key_from_row)?
        .collect::<Result<_, _>>()?;
    Ok(MirrorDigest::of_live(&keys))
}

/// Runs `f` inside one read transaction on `conn` (a reader): everything it
/// reads comes from one snapshot.
pub fn in_snapshot<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    conn.prepare_cached("BEGIN")?.execute([])?;
    let out = f(conn);
    conn.prepare_cached("COMMIT")?.execute([])?;
    out
}

/// The schema may forget the changes up to `last`: a proof has read them.
pub fn forget_changes(conn: &Connection, last: i64) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM mirror_changes WHERE seq <= ?1")?
        .execute([last])?;
    Ok(())
}

/// The last proof the hub published, for `lockhub status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LastProof {
    pub head_seq: u64,
    /// `None` for a hub that said it was ahead.
    pub as_of: Option<Timestamp>,
    pub hub_time: Option<Timestamp>,
    pub count: Option<u64>,
    /// base64url of the mirror digest.
    pub digest: Option<String>,
    /// `None`: the hub was ahead (its watermark is set).
    #[serde(rename = "match")]
    pub matches: Option<bool>,
    pub watermark: Option<u64>,
    pub at: Timestamp,
}

/// Records the last proof (one row, replaced).
pub fn record_proof(conn: &Connection, p: &LastProof) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO mirror_proof (id, head_seq, as_of, hub_time, count, digest, matched, watermark, at)
         VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (id) DO UPDATE SET head_seq = excluded.head_seq, as_of = excluded.as_of,
             hub_time = excluded.hub_time, count = excluded.count, digest = excluded.digest,
             matched = excluded.matched, watermark = excluded.watermark, at = excluded.at",
    )?
    .execute(params![
        p.head_seq as i64,
        p.as_of.map(|t| t.0),
        p.hub_time.map(|t| t.0),
        p.count.map(|c| c as i64),
        p.digest,
        p.matches,
        p.watermark.map(|w| w as i64),
        p.at.0
    ])?;
    Ok(())
}

/// The last proof, if the hub published one (none on a database older than
/// the mirror proof's migration).
pub fn last_proof(conn: &Connection) -> Result<Option<LastProof>, StoreError> {
    let has_table: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'mirror_proof')",
        [],
        |r| r.get(0),
    )?;
    if !has_table {
        return Ok(None);
    }
    Ok(conn
        .prepare_cached(
            "SELECT head_seq, as_of, hub_time, count, digest, matched, watermark, at
               FROM mirror_proof WHERE id = 1",
        )?
        .query_row([], |r| {
            Ok(LastProof {
                head_seq: r.get::<_, i64>(0)? as u64,
                as_of: r.get::<_, Option<i64>>(1)?.map(Timestamp),
                hub_time: r.get::<_, Option<i64>>(2)?.map(Timestamp),
                count: r.get::<_, Option<i64>>(3)?.map(|c| c as u64),
                digest: r.get(4)?,
                matches: r.get(5)?,
                watermark: r.get::<_, Option<i64>>(6)?.map(|w| w as u64),
                at: Timestamp(r.get(7)?),
            })
        })
        .optional()?)
}
