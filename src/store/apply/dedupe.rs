//! Step 2: the dedupe row. An event seen before is answered with its first
//! result; the same id with another body is a conflict.

use super::*;

// Step 2: dedupe

pub(super) struct FirstRecord {
    pub(super) body_sha256: Vec<u8>,
    pub(super) result: EventResult,
}

pub(super) fn load_dedupe(
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
pub(super) fn replay_duplicate(
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
pub(super) fn answer_conflict(
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
pub(super) fn result_from_json(s: &str) -> Option<EventResult> {
    serde_json::from_str::<EventResult>(s)
        .ok()
        .filter(|r| r.event_id.is_some())
}

/// The dedupe row: the claim on the id, with the first result. Written
/// whatever the outcome (a conflict writes none: the first record stands).
/// The result's JSON is stored only when the row's columns cannot rebuild
/// it ([`load_dedupe`]): it is most of the row, the outbox carries it
/// already, and the smaller rows cost fewer pages written per event.
pub(super) fn store_dedupe(
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
