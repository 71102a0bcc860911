//! Applying one authenticated cloud event to the mirror: mqtt.md 'Deciding
//! an event, in this order', steps 2 to 8.
//!
//! [`apply_event`] runs on the writer thread, inside the savepoint the writer
//! opens for each job, so everything it does (the change, the dedupe row,
//! the seq bookkeeping, the time floor, the result on the outbox, the audit
//! rows) commits together or not at all. The MQTT ack goes out only after
//! that commit, so a crash before it means a redelivery, which the dedupe
//! row then answers with the first result.
//!
//! The decisions of steps 5 and 6 are [`crate::lifecycle`]'s (pure); step 7
//! is SQLite's: the invariant indexes and triggers refuse the write, and
//! [`reason_for_constraint`] turns the refusal into the stable code. Each
//! change runs in its own SAVEPOINT, so a rejected change leaves nothing
//! behind. A batch nests its items inside one more, or, alone in its
//! transaction ([`apply_event_alone`]), starts the transaction over when an
//! item rejects it.
//!
//! Never log a body, a PIN tag or a holder name from here.

use super::alerts;
use super::audit::{self, AuditRecord};
use super::outbox::{self, Queued, Topic};
use super::{Alone, StoreError, floor};
use crate::config::Policy;
use crate::lifecycle::{self, GrantPlan, KeyState, KeyView, Placement, RevokePlan};
use lockhub_proto::event::{
    Change, EventKind, EventResult, Evidence, Grant, ItemResult, Outcome, Reason, SchemaError,
};
use lockhub_proto::outputs::AuditKind;
use lockhub_proto::outputs::Condition;
use lockhub_proto::time::Timestamp;
use lockhub_proto::verify::VerifiedEvent;
use rusqlite::{Connection, OptionalExtension, params};
use uuid::Uuid;

mod batch;
mod dedupe;
mod keys;
pub mod seq;

use batch::*;
use dedupe::*;
use keys::*;
use seq::*;

/// The revoke reason of keys listed in a `key.issued`'s `supersedes`.
pub const REASON_SUPERSEDED: &str = "superseded";
/// The revoke reason of a reservation's pre-issued keys at check-in.
pub const REASON_SUPERSEDED_BY_CHECKIN: &str = "superseded_by_checkin";

/// What applying an event needs to know about this hub.
#[derive(Debug, Clone)]
pub struct ApplyContext {
    /// The dedupe table is keyed by site as well as event id.
    pub site_id: Uuid,
    /// `max_grant_days` (the clamp) and `cloud_stale_s` (checkpoint freshness).
    pub policy: Policy,
}

/// The answer to one event, plus what the sync layer needs to decide on a
/// sync request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The result body that was queued on the results outbox.
    pub result: EventResult,
    /// Every seq up to here has been seen (after this event).
    pub watermark: u64,
    /// Seqs above the watermark have been seen: W+1 is missing.
    pub gap: bool,
    /// The checkpoint's `head_seq`, when this (non-duplicate) event is one.
    pub head_seq: Option<u64>,
    /// A guest erasure: after the commit, run [`super::Store::scrub_wal`] so
    /// no pre-erasure page lingers in the WAL file; its result is held
    /// until then.
    pub erased: bool,
    /// The event was a sign of life for `cloud_stale`
    /// ([`Evidence::is_sign_of_life`]); the durable last sign of life moved.
    pub sign_of_life: bool,
    /// A first-seen checkpoint with a claim, or a `mirror.request`: what the
    /// proof does once this commits (`sync::proof`).
    pub proof: Option<super::mirror::ProofAsk>,
}

impl Applied {
    /// An event answered without applying anything (a duplicate, a
    /// conflict): no checkpoint, no erasure, no sign of life; only the
    /// watermark as it stands after the answer.
    fn answer_only(conn: &Connection, result: EventResult) -> Result<Applied, StoreError> {
        let (watermark, gap) = watermark_and_gap(conn)?;
        Ok(Applied {
            result,
            watermark,
            gap,
            head_seq: None,
            erased: false,
            sign_of_life: false,
            proof: None,
        })
    }
}

/// The durable seq bookkeeping, for sync requests and `cloud_stale`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqStatus {
    pub watermark: u64,
    /// `W + 1` when a later seq was seen or a checkpoint showed a higher head.
    pub first_missing: Option<u64>,
    /// The highest `head_seq` a checkpoint has shown (0 before any).
    pub head_seq: u64,
    pub last_sign_of_life: Option<Timestamp>,
}

/// Applies one authenticated event (steps 2 to 8). `kind` is the caller's
/// parse of the body (step 4's verdict); `now` is the hub's effective time.
///
/// Returns `Err` only for storage failures: then the writer rolls the job
/// back, nothing is claimed, and the event must not be acked.
#[cfg(any(test, feature = "testing"))]
pub fn apply_event(
    conn: &Connection,
    ctx: &ApplyContext,
    ev: &VerifiedEvent,
    kind: Result<EventKind, SchemaError>,
    now: Timestamp,
) -> Result<Applied, StoreError> {
    Queued::written_after(conn, |out| {
        apply(conn, Scope::Shared, ctx, ev, kind, now, out)
    })
}

/// [`apply_event`] with the event's outbox rows (its result, its audit
/// records) put on `out`, for the caller to write with the rest of its job
/// ([`Queued::flush`], in the same transaction). The event may flush `out`
/// itself (before an alert or a revoke, whose rows reach the outbox by
/// their own route), so on an `Err` the caller rolls back everything `out`
/// served, not just this event: the ingest pipeline rolls back the whole
/// job. It applies a flood this way: one outbox insert a job, not two an
/// event.
pub fn apply_event_queued(
    conn: &Connection,
    ctx: &ApplyContext,
    ev: &VerifiedEvent,
    kind: Result<EventKind, SchemaError>,
    now: Timestamp,
    out: &mut Queued,
) -> Result<Applied, StoreError> {
    apply(conn, Scope::Shared, ctx, ev, kind, now, out)
}

/// [`apply_event`] for an event that has the writer's transaction to itself
/// ([`super::Store::write_alone`]; the ingest pipeline sends every batch
/// so). A batch then needs no savepoint of its own: each item's savepoint
/// is the outermost one, so SQLite's sub-journal holds one item's pages at
/// a time rather than the whole batch's, and an item that rejects the
/// batch undoes it by starting the transaction over.
pub fn apply_event_alone(
    tx: &Alone<'_>,
    ctx: &ApplyContext,
    ev: &VerifiedEvent,
    kind: Result<EventKind, SchemaError>,
    now: Timestamp,
) -> Result<Applied, StoreError> {
    let conn = tx.conn();
    Queued::written_after(conn, |out| {
        apply(conn, Scope::Alone(tx), ctx, ev, kind, now, out)
    })
}

/// How a batch is made atomic.
#[derive(Clone, Copy)]
enum Scope<'a> {
    /// Other work may share the transaction: the batch runs in a savepoint.
    Shared,
    /// Nothing else is in the transaction, and nothing of this event was
    /// written before the batch: a rejected batch starts it over.
    Alone(&'a Alone<'a>),
}

fn apply(
    conn: &Connection,
    scope: Scope<'_>,
    ctx: &ApplyContext,
    ev: &VerifiedEvent,
    kind: Result<EventKind, SchemaError>,
    now: Timestamp,
    out: &mut Queued,
) -> Result<Applied, StoreError> {
    let event_id = ev.header.event_id.to_string();
    if let Some(first) = load_dedupe(conn, ctx, &event_id)? {
        return if first.body_sha256 == ev.body_sha256 {
            replay_duplicate(conn, &event_id, first.result, now, out)
        } else {
            answer_conflict(conn, ev, &event_id, now, out)
        };
    }
    let before = SeqBefore::load(conn, ev.header.seq)?;
    let verdict = if before.replays(ev.header.seq) {
        Verdict::rejected(Reason::StaleSeq)
    } else {
        match &kind {
            Err(e) => Verdict {
                item: e.item,
                ..Verdict::rejected(e.reason)
            },
            Ok(kind) => decide(conn, scope, ctx, &event_id, kind, now, out)?,
        }
    };
    let result = EventResult {
        event_id: Some(ev.header.event_id),
        seq: ev.header.seq,
        outcome: verdict.outcome,
        reason: verdict.reason,
        duplicate: false,
        clamped: verdict.clamped,
        at: now,
        valid_until: verdict.valid_until,
        item: verdict.item,
        items: verdict.items,
    };
    store_dedupe(conn, ctx, ev, &event_id, &result, now)?;
    let head_seq = match kind {
        Ok(EventKind::Checkpoint { head_seq, .. }) => Some(head_seq),
        _ => None,
    };
    let counted = count_authenticated(conn, ctx, ev, &before, head_seq, now)?;
    let proof = super::mirror::ProofAsk::of(kind, counted.watermark, counted.gap);
    if verdict.erased {
        // Published only once no byte of the name remains in a file.
        outbox::hold(conn, &event_id, &result.to_json(), now)?;
    } else {
        out.push(Topic::Results, result.to_json(), None, now);
    }
    let Counted {
        watermark,
        gap,
        sign_of_life,
    } = counted;
    Ok(Applied {
        result,
        watermark,
        gap,
        head_seq,
        erased: verdict.erased,
        sign_of_life,
        proof,
    })
}

/// Records the answer to an event rejected at step 1 (not authenticated):
/// the result goes on the outbox and the `bad_signature` (forged-looking)
/// or `malformed_event` alert for subject `cloud` is bumped. Nothing is
/// claimed or counted. The caller applies the rate limit: beyond it, call
/// [`count_step1_rejection`] instead.
pub fn record_step1_rejection(
    conn: &Connection,
    result: &EventResult,
    now: Timestamp,
) -> Result<(), StoreError> {
    outbox::enqueue(conn, Topic::Results, &result.to_json(), None, now)?;
    count_step1_rejection(conn, result.reason, now)
}

/// Bumps the step-1 alert without publishing a result (over the rate limit).
pub fn count_step1_rejection(
    conn: &Connection,
    reason: Option<Reason>,
    now: Timestamp,
) -> Result<(), StoreError> {
    let condition = match reason {
        Some(Reason::BadSignature | Reason::UnknownSigner) => Condition::BadSignature,
        _ => Condition::MalformedEvent,
    };
    alerts::raise(conn, condition, "cloud", 1, now)?;
    Ok(())
}

/// The watermark, the first missing seq, the highest checkpoint head and the
/// last sign of life, as stored.
pub fn seq_status(conn: &Connection) -> Result<SeqStatus, StoreError> {
    let (w, head, life): (i64, i64, Option<i64>) = conn
        .prepare_cached(
            "SELECT watermark, head_seq, last_sign_of_life FROM seq_state WHERE id = 1",
        )?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    let (watermark, gap) = watermark_and_gap(conn)?;
    debug_assert_eq!(watermark, w as u64);
    let head_seq = head as u64;
    Ok(SeqStatus {
        watermark,
        first_missing: (gap || head_seq > watermark).then_some(watermark + 1),
        head_seq,
        last_sign_of_life: life.map(Timestamp),
    })
}

/// Maps a write that SQLite refused to the stable code for it, when the
/// refusal is one of the invariants (step 7) or a tombstone / whitelist
/// trigger (the last line behind steps 5). Anything else is a real failure.
pub fn reason_for_constraint(err: &StoreError) -> Option<Reason> {
    let msg = err.constraint_message()?;
    if msg == "one_active_conflict" || msg.contains("keys.check_in_id") {
        Some(Reason::OneActiveConflict)
    } else if msg == "pin_collision" || msg.contains("key_doors.door, key_doors.pin_tag") {
        Some(Reason::PinCollision)
    } else if msg == "revoked" {
        Some(Reason::Revoked)
    } else if msg == "illegal_transition" {
        Some(Reason::IllegalTransition)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::dedupe::*;
    use super::*;

    #[test]
    fn a_stored_result_reads_back_as_the_same_result() {
        let r = EventResult {
            event_id: Some(Uuid::from_u128(7)),
            seq: Some(10),
            outcome: Outcome::Applied,
            reason: None,
            duplicate: false,
            clamped: true,
            at: Timestamp::from_secs(1_795_953_600),
            valid_until: None,
            item: None,
            items: Some(vec![
                ItemResult {
                    outcome: Outcome::Rejected,
                    reason: Some(Reason::Revoked),
                    valid_until: None,
                },
                ItemResult {
                    outcome: Outcome::Noop,
                    reason: None,
                    valid_until: Some(Timestamp::from_secs(1_796_000_000)),
                },
            ]),
        };
        let json = String::from_utf8(r.to_json()).unwrap();
        assert_eq!(result_from_json(&json), Some(r));
    }

    #[test]
    fn a_rejected_batch_result_keeps_its_item_index() {
        let r = EventResult {
            event_id: Some(Uuid::from_u128(8)),
            seq: None,
            outcome: Outcome::Rejected,
            reason: Some(Reason::UnknownDoor),
            duplicate: false,
            clamped: false,
            at: Timestamp::from_secs(1),
            valid_until: None,
            item: Some(1),
            items: None,
        };
        let json = String::from_utf8(r.to_json()).unwrap();
        assert_eq!(result_from_json(&json), Some(r));
    }
}
