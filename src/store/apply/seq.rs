//! Step 3 and the seq bookkeeping: which seqs were seen, the watermark,
//! the gap, and the last sign of life from the cloud.

use super::*;

// Step 3 and the seq bookkeeping

/// The seq bookkeeping as it stands before an event, read in one statement
/// (it was five per event: step 3's check, the highest seq seen, the
/// watermark before marking, and the watermark and gap after). The event's
/// own change never touches `seq_state` or `seq_seen`, so what was read
/// still holds when the event is counted, and the watermark and gap after
/// it follow from it ([`mark_seq_seen`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SeqBefore {
    pub(super) watermark: u64,
    /// The highest seq in `seq_seen`, 0 when it is empty. Every row there
    /// is above the watermark (the schema refuses any other), so a non-zero
    /// value is a gap at W+1.
    pub(super) highest_seen: u64,
    /// The event's own seq is in `seq_seen` already.
    pub(super) this_seen: bool,
}

impl SeqBefore {
    pub(super) fn load(conn: &Connection, seq: Option<u64>) -> Result<SeqBefore, StoreError> {
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
    pub(super) fn replays(&self, seq: Option<u64>) -> bool {
        seq.is_some_and(|s| s <= self.watermark || self.this_seen)
    }

    pub(super) fn gap(&self) -> bool {
        self.highest_seen > 0
    }

    /// The highest seq seen so far: the watermark, or a seq seen above it.
    pub(super) fn highest(&self) -> u64 {
        self.watermark.max(self.highest_seen)
    }
}

/// What counting an event left: the watermark and gap after it, and
/// whether it was a sign of life.
pub(super) struct Counted {
    pub(super) watermark: u64,
    pub(super) gap: bool,
    pub(super) sign_of_life: bool,
}

/// Everything an authenticated, first-seen event counts toward: its seq,
/// the time floor, a checkpoint's head, and the sign of life when it is one.
pub(super) fn count_authenticated(
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
pub(super) fn count_seq_and_time(
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
pub(super) fn mark_seq_seen(
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
pub(super) fn write_watermark(
    conn: &Connection,
    w: u64,
    life: Option<Timestamp>,
) -> Result<(), StoreError> {
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
pub(super) fn note_sign_of_life(conn: &Connection, now: Timestamp) -> Result<(), StoreError> {
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
