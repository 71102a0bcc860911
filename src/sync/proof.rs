//! The hub's side of the mirror proof (docs/protocol/mqtt.md 'Mirror
//! proof'): what to publish for a checkpoint's claim or a `mirror.request`,
//! decided after the event committed, from one snapshot on a read
//! connection ([`crate::store::mirror`]), then queued on the outbox in one
//! short writer job. A door never waits for it: the snapshot is a WAL
//! reader, and the job holds the writer for a few inserts.
//!
//! [`answer`] is the decision, pure; [`Prover`] runs it.

use crate::clock::SharedClock;
use crate::store::mirror::{self, LastProof, MirrorCache, ProofAsk, SeqSnapshot};
use crate::store::outbox::{self, Topic};
use crate::store::error::StoreError;
use crate::store::{Priority, Store, alerts};
use lockhub_proto::crypto::b64u_encode;
use lockhub_proto::mirror::MirrorDigest;
use lockhub_proto::outputs::{Condition, Proof, ProofAhead, ProofBucket, to_body};
use lockhub_proto::time::Timestamp;
use rusqlite::Connection;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Where the hub stands against a checkpoint's `head_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Seqs are missing: its sync settles it; nothing is published.
    Behind,
    /// The seqs seen are exactly 1..=`head_seq`: compare.
    Exact,
    /// It has seen a seq the cloud says it never sent.
    Ahead { watermark: u64 },
}

/// The hub's standing from its seq state.
pub fn standing(head_seq: u64, watermark: u64, gap: bool) -> Standing {
    if watermark > head_seq {
        Standing::Ahead { watermark }
    } else if watermark == head_seq && !gap {
        Standing::Exact
    } else {
        Standing::Behind
    }
}

/// What the proof publishes for one ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Nothing: behind, or the mirror moved on between the event's commit
    /// and the snapshot (the next checkpoint proves it).
    Nothing,
    Ahead(ProofAhead),
    Compared(Proof),
    Buckets(Vec<ProofBucket>),
}

/// Decides the answer to `ask`. `seen` is the seq state in the snapshot the
/// cache was refreshed to; `hub_time` the effective time.
pub fn answer(
    ask: &ProofAsk,
    seen: SeqSnapshot,
    cache: &mut MirrorCache,
    hub_time: Timestamp,
) -> Answer {
    match ask {
        ProofAsk::Claim {
            head_seq,
            claim,
            watermark,
            gap,
        } => match standing(*head_seq, *watermark, *gap) {
            Standing::Behind => Answer::Nothing,
            Standing::Ahead { watermark } => Answer::Ahead(ProofAhead {
                head_seq: *head_seq,
                watermark,
                matches: (),
            }),
            // Later events committed before the snapshot: this digest would
            // not be the one for `head_seq`.
            Standing::Exact if seen.watermark != *watermark || seen.gap => Answer::Nothing,
            Standing::Exact => {
                let m = cache.digest(claim.as_of);
                Answer::Compared(proof_of(*head_seq, claim, &m, hub_time))
            }
        },
        ProofAsk::Buckets { as_of, buckets, .. } => {
            // Only a hub that has seen exactly 1..=W answers, for W as of
            // the snapshot (the answer names it).
            if seen.gap {
                return Answer::Nothing;
            }
            Answer::Buckets(
                buckets
                    .iter()
                    .map(|&b| ProofBucket {
                        head_seq: seen.watermark,
                        as_of: *as_of,
                        bucket: b,
                        keys: cache.bucket_keys(b, *as_of),
                    })
                    .collect(),
            )
        }
    }
}

fn proof_of(
    head_seq: u64,
    claim: &lockhub_proto::mirror::Claim,
    m: &MirrorDigest,
    hub_time: Timestamp,
) -> Proof {
    let matches = claim.matches(m);
    Proof {
        head_seq,
        as_of: claim.as_of,
        hub_time,
        count: m.count,
        digest: b64u_encode(&m.digest),
        matches,
        buckets: (!matches).then(|| m.buckets.iter().map(|b| b64u_encode(&b.0)).collect()),
    }
}

/// How many asks may wait for the prover; beyond it an ask is dropped with a
/// warning (the cloud asks again at the next checkpoint).
const QUEUE: usize = 16;

/// Runs proofs one at a time, off the writer, keeping the bucket cache.
pub struct Prover {
    tx: mpsc::Sender<ProofAsk>,
}

impl Prover {
    /// Starts the prover task on the current runtime.
    pub fn start(store: Store, clock: SharedClock, hub_id: String) -> Prover {
        let (tx, mut rx) = mpsc::channel::<ProofAsk>(QUEUE);
        let cache = Arc::new(Mutex::new(MirrorCache::default()));
        tokio::spawn(async move {
            let mut reader: Option<Connection> = None;
            while let Some(ask) = rx.recv().await {
                let conn = match reader.take() {
                    Some(c) => c,
                    None => match store.reader() {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::warn!(error = %e, "mirror proof: no read connection");
                            continue;
                        }
                    },
                };
                let (cache2, clock2) = (cache.clone(), clock.clone());
                let worked = tokio::task::spawn_blocking(move || {
                    let out = compute(&conn, &cache2, &clock2, &ask);
                    (conn, out)
                })
                .await;
                let Ok((conn, out)) = worked else { continue };
                reader = Some(conn);
                match out {
                    Ok((answer, last_change, hub_time)) => {
                        if let Err(e) =
                            publish(&store, &hub_id, answer, last_change, hub_time).await
                        {
                            tracing::warn!(error = %e, "mirror proof: cannot queue the answer");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "mirror proof: cannot read the mirror"),
                }
            }
        });
        Prover { tx }
    }

    /// Hands an ask to the prover (never waits).
    pub fn ask(&self, ask: ProofAsk) {
        if self.tx.try_send(ask).is_err() {
            tracing::warn!("mirror proof: too many waiting; one dropped");
        }
    }
}

type Computed = (Answer, Option<i64>, Timestamp);

fn compute(
    conn: &Connection,
    cache: &Mutex<MirrorCache>,
    clock: &SharedClock,
    ask: &ProofAsk,
) -> Result<Computed, StoreError> {
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    let started = std::time::Instant::now();
    let seen = mirror::in_snapshot(conn, |c| cache.refresh(c))?;
    let hub_time = clock.now();
    let a = answer(ask, seen, &mut cache, hub_time);
    tracing::info!(
        took_us = started.elapsed().as_micros() as u64,
        buckets_recomputed = cache.recomputed,
        "mirror proof computed"
    );
    Ok((a, cache.last_change(), hub_time))
}

/// Queues the answer on the outbox in one writer job, with the alert, the
/// status row and the pruning of the changes read.
async fn publish(
    store: &Store,
    hub_id: &str,
    answer: Answer,
    last_change: Option<i64>,
    now: Timestamp,
) -> Result<(), StoreError> {
    let hub_id = hub_id.to_owned();
    store
        .write(Priority::Bulk, move |conn| {
            match &answer {
                Answer::Nothing => {}
                Answer::Ahead(a) => {
                    outbox::enqueue(conn, Topic::Proof, &to_body(a), None, now)?;
                    mirror::record_proof(
                        conn,
                        &LastProof {
                            head_seq: a.head_seq,
                            as_of: None,
                            hub_time: Some(now),
                            count: None,
                            digest: None,
                            matches: None,
                            watermark: Some(a.watermark),
                            at: now,
                        },
                    )?;
                }
                Answer::Compared(p) => {
                    outbox::enqueue(conn, Topic::Proof, &to_body(p), None, now)?;
                    if p.matches {
                        alerts::clear(conn, Condition::MirrorDiverged, &hub_id, now)?;
                    } else {
                        alerts::raise(conn, Condition::MirrorDiverged, &hub_id, 1, now)?;
                    }
                    mirror::record_proof(
                        conn,
                        &LastProof {
                            head_seq: p.head_seq,
                            as_of: Some(p.as_of),
                            hub_time: Some(p.hub_time),
                            count: Some(p.count),
                            digest: Some(p.digest.clone()),
                            matches: Some(p.matches),
                            watermark: None,
                            at: now,
                        },
                    )?;
                }
                Answer::Buckets(list) => {
                    for b in list {
                        outbox::enqueue(conn, Topic::Proof, &to_body(b), None, now)?;
                    }
                }
            }
            if let Some(last) = last_change {
                mirror::forget_changes(conn, last)?;
            }
            Ok(())
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_is_exact_only_with_every_seq_to_the_head_and_none_above() {
        assert_eq!(standing(5, 5, false), Standing::Exact);
        assert_eq!(standing(0, 0, false), Standing::Exact);
        assert_eq!(standing(5, 4, false), Standing::Behind);
        assert_eq!(standing(5, 5, true), Standing::Behind);
        assert_eq!(standing(5, 3, true), Standing::Behind);
        assert_eq!(standing(5, 7, false), Standing::Ahead { watermark: 7 });
        assert_eq!(standing(5, 7, true), Standing::Ahead { watermark: 7 });
    }
}
