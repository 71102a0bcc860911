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

// ---------------------------------------------------------------------------
// Step 2: dedupe
// ---------------------------------------------------------------------------

struct FirstRecord {
    body_sha256: Vec<u8>,
    result: EventResult,
}

fn load_dedupe(
    conn: &Connection,
    ctx: &ApplyContext,
    event_id: &str,
) -> Result<Option<FirstRecord>, StoreError> {
    let row = conn
        .prepare_cached(
            "SELECT body_sha256, result, seq, outcome, reason, received_at
               FROM dedupe WHERE site_id = ?1 AND event_id = ?2",
        )?
        .query_row(params![ctx.site_id.to_string(), event_id], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                r.get::<_, Option<String>>(1)?,
                r.get::<_, Option<i64>>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, Option<String>>(4)?,
                r.get::<_, i64>(5)?,
            ))
        })
        .optional()?;
    let Some((body_sha256, json, seq, outcome, reason, received_at)) = row else {
        return Ok(None);
    };
    let unreadable = || StoreError::Unreadable {
        what: "a stored dedupe result".into(),
    };
    let result = match json {
        Some(json) => result_from_json(&json).ok_or_else(unreadable)?,
        // What the columns say is the whole result ([`store_dedupe`]).
        None => EventResult {
            event_id: Some(Uuid::parse_str(event_id).map_err(|_| unreadable())?),
            seq: seq.map(|s| s as u64),
            outcome: Outcome::parse(&outcome).ok_or_else(unreadable)?,
            reason: match reason {
                Some(r) => Some(Reason::parse(&r).ok_or_else(unreadable)?),
                None => None,
            },
            duplicate: false,
            clamped: false,
            at: Timestamp(received_at),
            valid_until: None,
            item: None,
            items: None,
        },
    };
    Ok(Some(FirstRecord {
        body_sha256,
        result,
    }))
}

/// The same event again: its first result, marked duplicate, re-queued for
/// the cloud (its first copy may be what got lost). Nothing else changes,
/// and it is no sign of life. An erasure whose first result is still held
/// back (its WAL scrub not done) gets no early answer: the held one follows.
fn replay_duplicate(
    conn: &Connection,
    event_id: &str,
    first: EventResult,
    now: Timestamp,
    out: &mut Queued,
) -> Result<Applied, StoreError> {
    let mut result = first;
    result.duplicate = true;
    if !outbox::is_held(conn, event_id)? {
        out.push(Topic::Results, result.to_json(), None, now);
    }
    Applied::answer_only(conn, result)
}

/// The id was claimed by a different body: the first record stands, the
/// `event_id_conflict` alert is raised. The body is still authenticated, so
/// its seq and `issued_at` count; it is no sign of life.
fn answer_conflict(
    conn: &Connection,
    ev: &VerifiedEvent,
    event_id: &str,
    now: Timestamp,
    out: &mut Queued,
) -> Result<Applied, StoreError> {
    // The alert goes on the outbox by its own route: what is queued first.
    out.flush(conn)?;
    alerts::raise(conn, Condition::EventIdConflict, event_id, 1, now)?;
    let before = SeqBefore::load(conn, ev.header.seq)?;
    count_seq_and_time(conn, ev, &before, None)?;
    let result = EventResult {
        event_id: Some(ev.header.event_id),
        seq: ev.header.seq,
        outcome: Outcome::Conflict,
        reason: None,
        duplicate: false,
        clamped: false,
        at: now,
        valid_until: None,
        item: None,
        items: None,
    };
    out.push(Topic::Results, result.to_json(), None, now);
    Applied::answer_only(conn, result)
}

/// Reads back a result body this module wrote (the dedupe table's copy),
/// through the one result type: a stored result always names its event.
fn result_from_json(s: &str) -> Option<EventResult> {
    serde_json::from_str::<EventResult>(s)
        .ok()
        .filter(|r| r.event_id.is_some())
}

/// The dedupe row: the claim on the id, with the first result. Written
/// whatever the outcome (a conflict writes none: the first record stands).
/// The result's JSON is stored only when the row's columns cannot rebuild
/// it ([`load_dedupe`]): it is most of the row, the outbox carries it
/// already, and the smaller rows cost fewer pages written per event.
fn store_dedupe(
    conn: &Connection,
    ctx: &ApplyContext,
    ev: &VerifiedEvent,
    event_id: &str,
    result: &EventResult,
    now: Timestamp,
) -> Result<(), StoreError> {
    let rebuildable = !result.clamped
        && result.item.is_none()
        && result.items.is_none()
        && !result.duplicate
        && result.at == now
        && result.seq == ev.header.seq
        && result.event_id == Some(ev.header.event_id);
    let json = if rebuildable {
        None
    } else {
        Some(
            String::from_utf8(result.to_json()).map_err(|_| StoreError::Unreadable {
                what: format!("the result of {event_id}: not UTF-8"),
            })?,
        )
    };
    conn.prepare_cached(
        "INSERT INTO dedupe (site_id, event_id, body_sha256, seq, outcome, reason, result, received_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        ctx.site_id.to_string(),
        event_id,
        &ev.body_sha256[..],
        ev.header.seq.map(|s| s as i64),
        result.outcome.as_str(),
        result.reason.map(Reason::as_str),
        json,
        now.0
    ])?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Step 3 and the seq bookkeeping
// ---------------------------------------------------------------------------

/// The seq bookkeeping as it stands before an event, read in one statement
/// (it was five per event: step 3's check, the highest seq seen, the
/// watermark before marking, and the watermark and gap after). The event's
/// own change never touches `seq_state` or `seq_seen`, so what was read
/// still holds when the event is counted, and the watermark and gap after
/// it follow from it ([`mark_seq_seen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SeqBefore {
    watermark: u64,
    /// The highest seq in `seq_seen`, 0 when it is empty. Every row there
    /// is above the watermark (the schema refuses any other), so a non-zero
    /// value is a gap at W+1.
    highest_seen: u64,
    /// The event's own seq is in `seq_seen` already.
    this_seen: bool,
}

impl SeqBefore {
    fn load(conn: &Connection, seq: Option<u64>) -> Result<SeqBefore, StoreError> {
        let (w, highest, this_seen): (i64, i64, bool) = conn
            .prepare_cached(
                "SELECT watermark, coalesce((SELECT max(seq) FROM seq_seen), 0),
                        EXISTS (SELECT 1 FROM seq_seen WHERE seq = ?1)
                   FROM seq_state WHERE id = 1",
            )?
            .query_row([seq.map(|s| s as i64)], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
        Ok(SeqBefore {
            watermark: w as u64,
            highest_seen: highest as u64,
            this_seen,
        })
    }

    /// Step 3: a new id under a seq already seen. The page names "at or
    /// below the watermark"; a seq seen above the watermark (in `seq_seen`)
    /// is the same replay one gap later, so it is refused the same way.
    fn replays(&self, seq: Option<u64>) -> bool {
        seq.is_some_and(|s| s <= self.watermark || self.this_seen)
    }

    fn gap(&self) -> bool {
        self.highest_seen > 0
    }

    /// The highest seq seen so far: the watermark, or a seq seen above it.
    fn highest(&self) -> u64 {
        self.watermark.max(self.highest_seen)
    }
}

/// What counting an event left: the watermark and gap after it, and
/// whether it was a sign of life.
struct Counted {
    watermark: u64,
    gap: bool,
    sign_of_life: bool,
}

/// Everything an authenticated, first-seen event counts toward: its seq,
/// the time floor, a checkpoint's head, and the sign of life when it is one.
fn count_authenticated(
    conn: &Connection,
    ctx: &ApplyContext,
    ev: &VerifiedEvent,
    before: &SeqBefore,
    head_seq: Option<u64>,
    now: Timestamp,
) -> Result<Counted, StoreError> {
    let evidence = match (head_seq, ev.header.seq) {
        (Some(head), _) => {
            conn.prepare_cached("UPDATE seq_state SET head_seq = max(head_seq, ?1) WHERE id = 1")?
                .execute([head as i64])?;
            Evidence::Checkpoint {
                issued_at: ev.header.issued_at,
            }
        }
        (None, Some(seq)) => Evidence::Event {
            seq,
            highest_before: before.highest(),
        },
        // No seq and no head: a checkpoint whose body failed step 4. It
        // says nothing about the cloud's state now.
        (None, None) => Evidence::SeenBefore,
    };
    let life = evidence
        .is_sign_of_life(now, ctx.policy.cloud_stale_s)
        .then_some(now);
    let (watermark, gap) = count_seq_and_time(conn, ev, before, life)?;
    Ok(Counted {
        watermark,
        gap,
        sign_of_life: life.is_some(),
    })
}

/// An authenticated event's seq (none for a checkpoint), the time floor and,
/// when `life` is given, the last sign of life. Returns the watermark and
/// whether a gap is open after it.
fn count_seq_and_time(
    conn: &Connection,
    ev: &VerifiedEvent,
    before: &SeqBefore,
    life: Option<Timestamp>,
) -> Result<(u64, bool), StoreError> {
    floor::raise_to(conn, ev.header.issued_at)?;
    let after = match ev.header.seq {
        Some(seq) => mark_seq_seen(conn, before, seq, life)?,
        None => {
            if let Some(now) = life {
                note_sign_of_life(conn, now)?;
            }
            (before.watermark, before.gap())
        }
    };
    debug_assert_eq!(Ok(after), watermark_and_gap(conn).map_err(|_| ()));
    Ok(after)
}

/// W advances over contiguous seen seqs; a seq above W+1 waits in
/// `seq_seen` until the gap below it closes. `life` goes into the same
/// write of `seq_state` as the watermark. Returns the watermark and gap
/// after.
fn mark_seq_seen(
    conn: &Connection,
    before: &SeqBefore,
    seq: u64,
    life: Option<Timestamp>,
) -> Result<(u64, bool), StoreError> {
    let w = before.watermark;
    if seq <= w || seq > w + 1 {
        if seq > w + 1 {
            conn.prepare_cached("INSERT OR IGNORE INTO seq_seen (seq) VALUES (?1)")?
                .execute([seq as i64])?;
        }
        if let Some(now) = life {
            note_sign_of_life(conn, now)?;
        }
        return Ok((w, before.gap() || seq > w + 1));
    }
    let mut w = seq;
    // Only a gap leaves rows to walk: without one, `seq_seen` is empty.
    if before.gap() {
        let mut next = conn.prepare_cached("DELETE FROM seq_seen WHERE seq = ?1")?;
        while next.execute([(w + 1) as i64])? == 1 {
            w += 1;
        }
    }
    write_watermark(conn, w, life)?;
    Ok((w, before.highest_seen > w))
}

/// The new watermark, with the last sign of life in the same write when
/// `life` is given (it only ever moves later).
fn write_watermark(conn: &Connection, w: u64, life: Option<Timestamp>) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE seq_state SET watermark = ?1,
                last_sign_of_life = coalesce(max(coalesce(last_sign_of_life, ?2), ?2),
                                             last_sign_of_life)
          WHERE id = 1",
    )?
    .execute(params![w as i64, life.map(|t| t.0)])?;
    Ok(())
}

/// The last sign of life moves to `now` if that is later.
fn note_sign_of_life(conn: &Connection, now: Timestamp) -> Result<(), StoreError> {
    conn.prepare_cached(
        "UPDATE seq_state
            SET last_sign_of_life = max(coalesce(last_sign_of_life, ?1), ?1)
          WHERE id = 1",
    )?
    .execute([now.0])?;
    Ok(())
}

/// The watermark W, and whether a seq above it was seen (a gap at W+1).
pub fn watermark_and_gap(conn: &Connection) -> Result<(u64, bool), StoreError> {
    let (w, gap): (i64, bool) = conn
        .prepare_cached(
            "SELECT watermark, EXISTS (SELECT 1 FROM seq_seen) FROM seq_state WHERE id = 1",
        )?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok((w as u64, gap))
}

// ---------------------------------------------------------------------------
// Steps 5 to 8
// ---------------------------------------------------------------------------

/// An event's or an item's verdict before it becomes a result.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Verdict {
    outcome: Outcome,
    reason: Option<Reason>,
    clamped: bool,
    /// The window end after the clamp, when a clamped grant was applied.
    valid_until: Option<Timestamp>,
    item: Option<usize>,
    items: Option<Vec<ItemResult>>,
    erased: bool,
}

impl Verdict {
    fn of(outcome: Outcome) -> Self {
        Verdict {
            outcome,
            reason: None,
            clamped: false,
            valid_until: None,
            item: None,
            items: None,
            erased: false,
        }
    }

    fn rejected(reason: Reason) -> Self {
        Verdict {
            reason: Some(reason),
            ..Verdict::of(Outcome::Rejected)
        }
    }

    /// `applied` if the change touched the mirror, `noop` otherwise.
    fn changed(changed: bool) -> Self {
        Verdict::of(if changed {
            Outcome::Applied
        } else {
            Outcome::Noop
        })
    }
}

fn decide(
    conn: &Connection,
    scope: Scope<'_>,
    ctx: &ApplyContext,
    event_id: &str,
    kind: &EventKind,
    now: Timestamp,
    out: &mut Queued,
) -> Result<Verdict, StoreError> {
    match kind {
        EventKind::Change(change) => apply_change(conn, ctx, event_id, change, now, out),
        EventKind::Batch(items) => apply_batch(conn, scope, ctx, event_id, items, None, now, out),
        EventKind::BatchCutShort { items, invalid } => {
            apply_batch(conn, scope, ctx, event_id, items, Some(*invalid), now, out)
        }
        // The head is counted with the seq bookkeeping; nothing to change.
        EventKind::Checkpoint { .. } => Ok(Verdict::of(Outcome::Noop)),
        // Answered after the commit (`sync::proof`); it changes nothing.
        EventKind::MirrorRequest { .. } => Ok(Verdict::of(Outcome::Noop)),
    }
}

/// A named SAVEPOINT's statements, each run through the connection's
/// statement cache: `execute_batch` parsed them afresh at every change
/// (~1.5 % of the writer under a flood, with the ingest job's own).
#[derive(Debug, Clone, Copy)]
struct Savepoint {
    begin: &'static str,
    release: &'static str,
    rollback_to: &'static str,
}

impl Savepoint {
    const APPLY_BATCH: Savepoint = Savepoint {
        begin: "SAVEPOINT apply_batch",
        release: "RELEASE apply_batch",
        rollback_to: "ROLLBACK TO apply_batch",
    };
    const APPLY_CHANGE: Savepoint = Savepoint {
        begin: "SAVEPOINT apply_change",
        release: "RELEASE apply_change",
        rollback_to: "ROLLBACK TO apply_change",
    };

    fn begin(self, conn: &Connection) -> Result<(), StoreError> {
        conn.prepare_cached(self.begin)?.execute([])?;
        Ok(())
    }

    /// Keeps what was written since [`Savepoint::begin`].
    fn release(self, conn: &Connection) -> Result<(), StoreError> {
        conn.prepare_cached(self.release)?.execute([])?;
        Ok(())
    }

    /// Undoes what was written since [`Savepoint::begin`] and ends the
    /// savepoint.
    fn undo(self, conn: &Connection) -> Result<(), StoreError> {
        conn.prepare_cached(self.rollback_to)?.execute([])?;
        self.release(conn)
    }
}

/// Runs `f` inside a SAVEPOINT, kept only when `keep` says so (or rolled
/// back on an error, the outbox rows it queued with it), so a refused
/// change leaves nothing behind.
fn in_savepoint<T>(
    conn: &Connection,
    sp: Savepoint,
    out: &mut Queued,
    f: impl FnOnce(&mut Queued) -> Result<T, StoreError>,
    keep: impl FnOnce(&T) -> bool,
) -> Result<T, StoreError> {
    sp.begin(conn)?;
    let mark = out.mark();
    let done = f(out);
    match &done {
        Ok(v) if keep(v) => sp.release(conn)?,
        _ => {
            sp.undo(conn)?;
            out.truncate(mark);
        }
    }
    done
}

/// A batch: every item in its own savepoint, decided in order. Items that
/// come out noop, `revoked` or `illegal_transition` are recorded and
/// skipped; any other rejection rolls every item back and rejects the batch
/// at that index. `invalid` is the item after `items` that failed step 4: it
/// is reported only if no earlier item failed first. The items are rolled
/// back by one more savepoint around them, or, when the event is alone in
/// its transaction, by starting the transaction over.
#[allow(clippy::too_many_arguments)] // each is the batch's own, as in `decide`
fn apply_batch(
    conn: &Connection,
    scope: Scope<'_>,
    ctx: &ApplyContext,
    event_id: &str,
    items: &[Change],
    invalid: Option<SchemaError>,
    now: Timestamp,
    queued: &mut Queued,
) -> Result<Verdict, StoreError> {
    let run = |queued: &mut Queued| {
        let mut out = Vec::with_capacity(items.len());
        let (mut clamped, mut erased) = (false, false);
        for (i, change) in items.iter().enumerate() {
            let v = apply_change(conn, ctx, event_id, change, now, queued)?;
            if let Some(r) = v.reason.filter(|r| !r.skippable_in_batch()) {
                return Ok(Verdict {
                    item: Some(i),
                    clamped: v.clamped,
                    ..Verdict::rejected(r)
                });
            }
            clamped |= v.clamped && v.outcome == Outcome::Applied;
            erased |= v.erased;
            out.push(ItemResult {
                outcome: v.outcome,
                reason: v.reason,
                valid_until: v.valid_until,
            });
        }
        if let Some(e) = invalid {
            return Ok(Verdict {
                item: e.item,
                ..Verdict::rejected(e.reason)
            });
        }
        let any = out.iter().any(|i| i.outcome == Outcome::Applied);
        Ok(Verdict {
            clamped,
            erased,
            items: Some(out),
            ..Verdict::changed(any)
        })
    };
    match scope {
        Scope::Shared => {
            // An item may flush the queue (a revoke): what was queued before
            // the batch must not be written inside its savepoint.
            queued.flush(conn)?;
            in_savepoint(conn, Savepoint::APPLY_BATCH, queued, run, |v: &Verdict| {
                v.outcome != Outcome::Rejected
            })
        }
        Scope::Alone(tx) => {
            let mark = queued.mark();
            let verdict = run(queued)?;
            if verdict.outcome == Outcome::Rejected {
                tx.start_over()?;
                queued.truncate(mark);
            }
            Ok(verdict)
        }
    }
}

/// One change, in its own savepoint: rolled back if rejected.
fn apply_change(
    conn: &Connection,
    ctx: &ApplyContext,
    event_id: &str,
    change: &Change,
    now: Timestamp,
    queued: &mut Queued,
) -> Result<Verdict, StoreError> {
    let run = |queued: &mut Queued| match change {
        Change::KeyIssued { key, supersedes } => {
            issue_key(conn, ctx, event_id, key, supersedes, now, queued)
        }
        Change::KeyRevoked {
            key_id,
            version: _,
            reason,
        } => revoke(conn, event_id, key_id, reason, now, queued).map(Verdict::changed),
        Change::CheckinCompleted {
            reservation_id,
            check_in_id: _,
            key,
        } => check_in(conn, ctx, event_id, reservation_id, key, now, queued),
        Change::GuestErased { holder_ref } => erase_guest(conn, event_id, holder_ref, now),
    };
    // A change that may revoke flushes the queue inside (`revoke_key`):
    // what was queued before it must not be written inside its savepoint.
    if may_revoke(change) {
        queued.flush(conn)?;
    }
    in_savepoint(conn, Savepoint::APPLY_CHANGE, queued, run, |v: &Verdict| {
        v.outcome != Outcome::Rejected
    })
}

/// Whether applying `change` may revoke a key ([`revoke_key`]).
fn may_revoke(change: &Change) -> bool {
    match change {
        Change::KeyIssued { supersedes, .. } => !supersedes.is_empty(),
        Change::KeyRevoked { .. } | Change::CheckinCompleted { .. } => true,
        Change::GuestErased { .. } => false,
    }
}

/// `key.issued`: the superseded keys are revoked (or tombstoned) first, so
/// that the invariants of step 7 see the mirror without them.
fn issue_key(
    conn: &Connection,
    ctx: &ApplyContext,
    event_id: &str,
    key: &Grant,
    supersedes: &[String],
    now: Timestamp,
    queued: &mut Queued,
) -> Result<Verdict, StoreError> {
    let mut changed = false;
    for old in supersedes {
        changed |= revoke(conn, event_id, old, REASON_SUPERSEDED, now, queued)?;
    }
    let plan = plan_for(conn, ctx, key, now)?;
    write_grant(conn, event_id, key, plan, changed, now, queued)
}

/// `key.revoked` or a `supersedes` entry: a live key is revoked whatever
/// the version; an unknown id gets a tombstone; otherwise nothing. Returns
/// whether the mirror changed.
fn revoke(
    conn: &Connection,
    event_id: &str,
    key_id: &str,
    reason: &str,
    now: Timestamp,
    queued: &mut Queued,
) -> Result<bool, StoreError> {
    let existing = load_key(conn, key_id)?.map(|k| k.state);
    match lifecycle::plan_revoke(existing, is_key_tombstoned(conn, key_id)?) {
        RevokePlan::Revoke => {
            revoke_key(conn, event_id, key_id, reason, now, queued)?;
            Ok(true)
        }
        RevokePlan::Tombstone => {
            conn.prepare_cached(
                "INSERT INTO key_tombstones (key_id, reason, event_id, created_at) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![key_id, reason, event_id, now.0])?;
            Ok(true)
        }
        RevokePlan::Noop => Ok(false),
    }
}

/// `checkin.completed`: the reservation's other pre-issued keys are revoked
/// (`superseded_by_checkin`), the key is activated, and the reservation is
/// tombstoned against late pre-issued keys.
///
/// The check-in's own key is never among the keys revoked: it may be the
/// reservation's pre-issued key moving to `active` at a higher version. If
/// it is one of the reservation's pre-issued keys and the grant does not
/// raise its version, the check-in would leave a pre-issued key behind its
/// own reservation's tombstone: that is refused as `illegal_transition`
/// (mqtt.md step 5: the move to `active` needs a higher version), and
/// nothing of the check-in is applied. Any other live key at or above the
/// version is step 5's plain `noop`.
fn check_in(
    conn: &Connection,
    ctx: &ApplyContext,
    event_id: &str,
    reservation_id: &str,
    key: &Grant,
    now: Timestamp,
    queued: &mut Queued,
) -> Result<Verdict, StoreError> {
    let plan = plan_for(conn, ctx, key, now)?;
    if plan == GrantPlan::Noop && is_pre_issued_of(conn, &key.key_id, reservation_id)? {
        return Ok(Verdict::rejected(Reason::IllegalTransition));
    }
    if let GrantPlan::Reject { reason, clamped } = plan {
        return Ok(Verdict {
            clamped,
            ..Verdict::rejected(reason)
        });
    }
    let mut changed = false;
    for other in pre_issued_of_reservation(conn, reservation_id, &key.key_id)? {
        revoke_key(
            conn,
            event_id,
            &other,
            REASON_SUPERSEDED_BY_CHECKIN,
            now,
            queued,
        )?;
        changed = true;
    }
    let verdict = write_grant(conn, event_id, key, plan, changed, now, queued)?;
    if verdict.outcome == Outcome::Rejected {
        return Ok(verdict);
    }
    let tombstoned = tombstone_reservation(conn, reservation_id, key, event_id, now)?;
    Ok(Verdict {
        outcome: if tombstoned {
            Outcome::Applied
        } else {
            verdict.outcome
        },
        ..verdict
    })
}

/// `guest.erased`: `holder_name` set NULL in every key (final ones
/// included; the schema allows exactly this change) and audit row of the
/// holder. The rows stay. The holder_ref is remembered (`erased_holders`),
/// so a grant for it that arrives later is stored without its name
/// ([`write_grant`]). `secure_delete` on the writer zeroes the freed bytes;
/// [`super::Store::scrub_wal`] clears the WAL after the commit, and only then
/// is the result published (`erased`: it is held until then).
///
/// `applied` when a name was erased or the holder newly remembered (an
/// erasure that overtook its grant changes the mirror too); `noop` when it
/// was already remembered and no name was left.
fn erase_guest(
    conn: &Connection,
    event_id: &str,
    holder_ref: &str,
    now: Timestamp,
) -> Result<Verdict, StoreError> {
    // A later erasure renews the memory: it must last as long as a grant
    // from before this erasure can still be re-sent.
    let renewed = conn
        .prepare_cached(
            "UPDATE erased_holders SET event_id = ?2, created_at = max(created_at, ?3)
             WHERE holder_ref = ?1",
        )?
        .execute(params![holder_ref, event_id, now.0])?;
    let remembered = if renewed == 0 {
        conn.prepare_cached(
            "INSERT INTO erased_holders (holder_ref, event_id, created_at) VALUES (?1, ?2, ?3)",
        )?
        .execute(params![holder_ref, event_id, now.0])?
    } else {
        0
    };
    let keys = conn
        .prepare_cached(
            "UPDATE keys SET holder_name = NULL WHERE holder_ref = ?1 AND holder_name IS NOT NULL",
        )?
        .execute([holder_ref])?;
    let rows = conn
        .prepare_cached(
            "UPDATE audit SET holder_name = NULL WHERE holder_ref = ?1 AND holder_name IS NOT NULL",
        )?
        .execute([holder_ref])?;
    // Every erasure's result waits for a WAL scrub that starts after this
    // commit, also one that found no name left: an earlier erasure of the
    // same guest may still be waiting for its scrub, or the name may live
    // on only in WAL frames of rows rewritten since; "noop" must not be
    // heard before "gone from every file".
    Ok(Verdict {
        erased: true,
        ..Verdict::changed(keys + rows > 0 || remembered > 0)
    })
}

fn is_holder_erased(conn: &Connection, holder_ref: Option<&str>) -> Result<bool, StoreError> {
    let Some(holder_ref) = holder_ref else {
        return Ok(false);
    };
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM erased_holders WHERE holder_ref = ?1)")?
        .query_row([holder_ref], |r| r.get(0))?)
}

/// Steps 5 and 6 for a grant, from what the mirror holds now.
fn plan_for(
    conn: &Connection,
    ctx: &ApplyContext,
    key: &Grant,
    now: Timestamp,
) -> Result<GrantPlan, StoreError> {
    let existing = load_key(conn, &key.key_id)?;
    let reservation_tombstoned = match &key.reservation_id {
        Some(r) => is_reservation_tombstoned(conn, r)?,
        None => false,
    };
    Ok(lifecycle::plan_grant(
        existing.as_ref(),
        is_key_tombstoned(conn, &key.key_id)?,
        reservation_tombstoned,
        key,
        now,
        ctx.policy.max_grant_days,
    ))
}

/// Carries out a grant plan (step 7 is the database's: a refused write
/// becomes its reason). `changed_before` says whether the same change
/// already touched the mirror (revocations), which makes a noop grant an
/// applied change.
fn write_grant(
    conn: &Connection,
    event_id: &str,
    key: &Grant,
    plan: GrantPlan,
    changed_before: bool,
    now: Timestamp,
    queued: &mut Queued,
) -> Result<Verdict, StoreError> {
    let (placement, was) = match plan {
        GrantPlan::Reject { reason, clamped } => {
            return Ok(Verdict {
                clamped,
                ..Verdict::rejected(reason)
            });
        }
        GrantPlan::Noop => return Ok(Verdict::changed(changed_before)),
        GrantPlan::Insert(p) => (p, None),
        GrantPlan::Upgrade(p) => (p, load_key(conn, &key.key_id)?.map(|k| k.state)),
    };
    // A grant sent before its holder's erasure (re-sent after a gap) keeps
    // everything but the name.
    let unnamed;
    let key = if key.holder_name.is_some() && is_holder_erased(conn, key.holder_ref.as_deref())? {
        unnamed = Grant {
            holder_name: None,
            ..key.clone()
        };
        &unnamed
    } else {
        key
    };
    let written = match was {
        None => insert_key(conn, event_id, key, placement, now),
        Some(_) => upgrade_key(conn, event_id, key, placement, now),
    };
    if let Err(e) = written {
        return match reason_for_constraint(&e) {
            Some(reason) => Ok(Verdict {
                clamped: placement.clamped,
                ..Verdict::rejected(reason)
            }),
            None => Err(e),
        };
    }
    let becomes_active = KeyState::from(key.state) == KeyState::Active;
    if becomes_active && was != Some(KeyState::Active) {
        // The references are the row just written: no need to read it back.
        let refs = KeyRefs {
            check_in_id: key.check_in_id.clone(),
            holder_ref: key.holder_ref.clone(),
            holder_name: key.holder_name.clone(),
        };
        write_key_audit(
            conn,
            AuditKind::KeyActivated,
            event_id,
            &key.key_id,
            refs,
            None,
            now,
            queued,
        )?;
    }
    Ok(Verdict {
        clamped: placement.clamped,
        valid_until: placement.clamped.then_some(placement.valid_until),
        ..Verdict::of(Outcome::Applied)
    })
}

/// A grant's column values, in the `?1`..`?13` order both the insert and the
/// upgrade statement use.
struct GrantRow<'a> {
    key: &'a Grant,
    version: i64,
    state: &'static str,
    valid_until: i64,
    event_id: &'a str,
    now: i64,
}

fn grant_row<'a>(
    key: &'a Grant,
    placement: &Placement,
    event_id: &'a str,
    now: Timestamp,
) -> GrantRow<'a> {
    GrantRow {
        key,
        version: key.version as i64,
        state: KeyState::from(key.state).as_str(),
        valid_until: placement.valid_until.0,
        event_id,
        now: now.0,
    }
}

impl GrantRow<'_> {
    fn as_params(&self) -> [&dyn rusqlite::ToSql; 13] {
        let k = self.key;
        [
            &k.key_id,
            &self.version,
            &self.state,
            &k.check_in_id,
            &k.reservation_id,
            &k.valid_from.0,
            &self.valid_until,
            &k.pin_tag.0,
            &k.pin_key_id,
            &k.holder_ref,
            &k.holder_name,
            &self.event_id,
            &self.now,
        ]
    }
}

fn insert_key(
    conn: &Connection,
    event_id: &str,
    key: &Grant,
    placement: Placement,
    now: Timestamp,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO keys (key_id, version, state, check_in_id, reservation_id, valid_from,
                           valid_until, pin_tag, pin_key_id, holder_ref, holder_name,
                           revoke_reason, event_id, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, NULL, ?12, ?13)",
    )?
    .execute(grant_row(key, &placement, event_id, now).as_params())?;
    insert_doors(conn, key)
}

/// Moves a live key to the grant's higher version. The old doors go first,
/// so that the new PIN tag is checked against other keys only on the new
/// doors.
fn upgrade_key(
    conn: &Connection,
    event_id: &str,
    key: &Grant,
    placement: Placement,
    now: Timestamp,
) -> Result<(), StoreError> {
    conn.prepare_cached("DELETE FROM key_doors WHERE key_id = ?1")?
        .execute([&key.key_id])?;
    conn.prepare_cached(
        "UPDATE keys SET version = ?2, state = ?3, check_in_id = ?4, reservation_id = ?5,
                         valid_from = ?6, valid_until = ?7, pin_tag = ?8, pin_key_id = ?9,
                         holder_ref = ?10, holder_name = ?11, event_id = ?12, updated_at = ?13
          WHERE key_id = ?1",
    )?
    .execute(grant_row(key, &placement, event_id, now).as_params())?;
    insert_doors(conn, key)
}

fn insert_doors(conn: &Connection, key: &Grant) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES (?1, ?2, ?3, 1)",
    )?;
    for door in &key.doors {
        stmt.execute(params![key.key_id, door, &key.pin_tag.0[..]])?;
    }
    Ok(())
}

/// A live key becomes `revoked`, with its reason and a `key.revoked` audit
/// row. (The `keys_sync_doors` trigger takes its doors out of service.)
fn revoke_key(
    conn: &Connection,
    event_id: &str,
    key_id: &str,
    reason: &str,
    now: Timestamp,
    queued: &mut Queued,
) -> Result<(), StoreError> {
    // The key leaving the live states may end a `pin_ambiguous` alert,
    // whose message a trigger puts on the outbox: what is queued goes first.
    queued.flush(conn)?;
    conn.prepare_cached(
        "UPDATE keys SET state = 'revoked', revoke_reason = ?2, event_id = ?3, updated_at = ?4
          WHERE key_id = ?1 AND state IN ('pre_issued', 'active')",
    )?
    .execute(params![key_id, reason, event_id, now.0])?;
    let refs = conn
        .prepare_cached("SELECT check_in_id, holder_ref, holder_name FROM keys WHERE key_id = ?1")?
        .query_row([key_id], |r| {
            Ok(KeyRefs {
                check_in_id: r.get(0)?,
                holder_ref: r.get(1)?,
                holder_name: r.get(2)?,
            })
        })?;
    write_key_audit(
        conn,
        AuditKind::KeyRevoked,
        event_id,
        key_id,
        refs,
        Some(reason),
        now,
        queued,
    )
}

/// What a key lifecycle audit row carries of its key.
struct KeyRefs {
    check_in_id: Option<String>,
    holder_ref: Option<String>,
    /// Local only, where erasure can reach it.
    holder_name: Option<String>,
}

/// A key lifecycle audit row, carrying the key's references (and its
/// holder name, locally, where erasure can reach it); its outbox row goes
/// on `queued`.
#[allow(clippy::too_many_arguments)]
fn write_key_audit(
    conn: &Connection,
    kind: AuditKind,
    event_id: &str,
    key_id: &str,
    refs: KeyRefs,
    reason: Option<&str>,
    now: Timestamp,
    queued: &mut Queued,
) -> Result<(), StoreError> {
    audit::record_queued(
        conn,
        &AuditRecord {
            kind,
            at: now,
            door: None,
            key_id: Some(key_id.to_owned()),
            check_in_id: refs.check_in_id,
            holder_ref: refs.holder_ref,
            holder_name: refs.holder_name,
            reason: reason.map(str::to_owned),
            event_id: Uuid::parse_str(event_id).ok(),
            condition: None,
            count: None,
        },
        queued,
    )?;
    Ok(())
}

/// Leaves the reservation's tombstone unless one exists (a repeated
/// check-in). Returns whether it was new.
fn tombstone_reservation(
    conn: &Connection,
    reservation_id: &str,
    key: &Grant,
    event_id: &str,
    now: Timestamp,
) -> Result<bool, StoreError> {
    if is_reservation_tombstoned(conn, reservation_id)? {
        return Ok(false);
    }
    conn.prepare_cached(
        "INSERT INTO reservation_tombstones (reservation_id, check_in_id, event_id, created_at)
         VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![
        reservation_id,
        key.check_in_id.as_deref().unwrap_or_default(),
        event_id,
        now.0
    ])?;
    Ok(true)
}

fn load_key(conn: &Connection, key_id: &str) -> Result<Option<KeyView>, StoreError> {
    let row: Option<(i64, String)> = conn
        .prepare_cached("SELECT version, state FROM keys WHERE key_id = ?1")?
        .query_row([key_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    row.map(|(version, state)| {
        let state = KeyState::parse(&state).ok_or_else(|| StoreError::Unreadable {
            what: format!("key {key_id}: state"),
        })?;
        Ok(KeyView {
            version: version as u64,
            state,
        })
    })
    .transpose()
}

fn pre_issued_of_reservation(
    conn: &Connection,
    reservation_id: &str,
    except_key_id: &str,
) -> Result<Vec<String>, StoreError> {
    let mut stmt = conn.prepare_cached(
        "SELECT key_id FROM keys
          WHERE reservation_id = ?1 AND state = 'pre_issued' AND key_id <> ?2
          ORDER BY key_id",
    )?;
    let ids = stmt.query_map([reservation_id, except_key_id], |r| r.get(0))?;
    Ok(ids.collect::<Result<_, _>>()?)
}

/// Whether the key is one of the reservation's `pre_issued` keys.
fn is_pre_issued_of(
    conn: &Connection,
    key_id: &str,
    reservation_id: &str,
) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM keys
              WHERE key_id = ?1 AND reservation_id = ?2 AND state = 'pre_issued')",
        )?
        .query_row([key_id, reservation_id], |r| r.get(0))?)
}

fn is_key_tombstoned(conn: &Connection, key_id: &str) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM key_tombstones WHERE key_id = ?1)")?
        .query_row([key_id], |r| r.get(0))?)
}

fn is_reservation_tombstoned(conn: &Connection, reservation_id: &str) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM reservation_tombstones WHERE reservation_id = ?1)",
        )?
        .query_row([reservation_id], |r| r.get(0))?)
}

#[cfg(test)]
mod tests {
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
