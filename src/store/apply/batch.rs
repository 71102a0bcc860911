//! Steps 5 to 8 for one change or a batch of them: the verdict, the
//! savepoint each change runs in, and which kinds may revoke.

use super::*;

// Steps 5 to 8

/// An event's or an item's verdict before it becomes a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Verdict {
    pub(super) outcome: Outcome,
    pub(super) reason: Option<Reason>,
    pub(super) clamped: bool,
    /// The window end after the clamp, when a clamped grant was applied.
    pub(super) valid_until: Option<Timestamp>,
    pub(super) item: Option<usize>,
    pub(super) items: Option<Vec<ItemResult>>,
    pub(super) erased: bool,
}

impl Verdict {
    pub(super) fn of(outcome: Outcome) -> Self {
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

    pub(super) fn rejected(reason: Reason) -> Self {
        Verdict {
            reason: Some(reason),
            ..Verdict::of(Outcome::Rejected)
        }
    }

    /// `applied` if the change touched the mirror, `noop` otherwise.
    pub(super) fn changed(changed: bool) -> Self {
        Verdict::of(if changed {
            Outcome::Applied
        } else {
            Outcome::Noop
        })
    }
}

pub(super) fn decide(
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
pub(super) struct Savepoint {
    pub(super) begin: &'static str,
    pub(super) release: &'static str,
    pub(super) rollback_to: &'static str,
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

    pub(super) fn begin(self, conn: &Connection) -> Result<(), StoreError> {
        conn.prepare_cached(self.begin)?.execute([])?;
        Ok(())
    }

    /// Keeps what was written since [`Savepoint::begin`].
    pub(super) fn release(self, conn: &Connection) -> Result<(), StoreError> {
        conn.prepare_cached(self.release)?.execute([])?;
        Ok(())
    }

    /// Undoes what was written since [`Savepoint::begin`] and ends the
    /// savepoint.
    pub(super) fn undo(self, conn: &Connection) -> Result<(), StoreError> {
        conn.prepare_cached(self.rollback_to)?.execute([])?;
        self.release(conn)
    }
}

/// Runs `f` inside a SAVEPOINT, kept only when `keep` says so (or rolled
/// back on an error, the outbox rows it queued with it), so a refused
/// change leaves nothing behind.
pub(super) fn in_savepoint<T>(
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
pub(super) fn apply_batch(
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
pub(super) fn apply_change(
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
pub(super) fn may_revoke(change: &Change) -> bool {
    match change {
        Change::KeyIssued { supersedes, .. } => !supersedes.is_empty(),
        Change::KeyRevoked { .. } | Change::CheckinCompleted { .. } => true,
        Change::GuestErased { .. } => false,
    }
}
