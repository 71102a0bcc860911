//! What each change kind writes: issuing, upgrading and revoking keys,
//! check-in, erasing a guest, and the audit rows of each.

use super::*;

/// `key.issued`: the superseded keys are revoked (or tombstoned) first, so
/// that the invariants of step 7 see the mirror without them.
pub(super) fn issue_key(
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
pub(super) fn revoke(
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
pub(super) fn check_in(
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
/// [`crate::store::Store::scrub_wal`] clears the WAL after the commit, and only then
/// is the result published (`erased`: it is held until then).
///
/// `applied` when a name was erased or the holder newly remembered (an
/// erasure that overtook its grant changes the mirror too); `noop` when it
/// was already remembered and no name was left.
pub(super) fn erase_guest(
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

pub(super) fn is_holder_erased(
    conn: &Connection,
    holder_ref: Option<&str>,
) -> Result<bool, StoreError> {
    let Some(holder_ref) = holder_ref else {
        return Ok(false);
    };
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM erased_holders WHERE holder_ref = ?1)")?
        .query_row([holder_ref], |r| r.get(0))?)
}

/// Steps 5 and 6 for a grant, from what the mirror holds now.
pub(super) fn plan_for(
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
pub(super) fn write_grant(
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
    if was.is_some() {
        end_if_used_up(conn, event_id, key, now, queued)?;
    }
    Ok(Verdict {
        clamped: placement.clamped,
        valid_until: placement.clamped.then_some(placement.valid_until),
        ..Verdict::of(Outcome::Applied)
    })
}

/// A higher version whose `max_uses` is at or below the uses already taken
/// leaves the key `used_up` at once (mqtt.md '`max_uses`'), audited
/// `key.used_up` like the entry that takes a last use. The move is made at
/// the new version, once its row and doors are written, as the schema asks
/// of a key that ends.
fn end_if_used_up(
    conn: &Connection,
    event_id: &str,
    key: &Grant,
    now: Timestamp,
    queued: &mut Queued,
) -> Result<(), StoreError> {
    let Some(max) = key.max_uses else {
        return Ok(());
    };
    queued.flush(conn)?;
    let ended = conn
        .prepare_cached(
            "UPDATE keys SET state = 'used_up', updated_at = ?3
              WHERE key_id = ?1 AND use_count >= ?2 AND state IN ('pre_issued', 'active')",
        )?
        .execute(params![key.key_id, max, now.0])?;
    if ended == 1 {
        let refs = KeyRefs {
            check_in_id: key.check_in_id.clone(),
            holder_ref: key.holder_ref.clone(),
            holder_name: key.holder_name.clone(),
        };
        write_key_audit(
            conn,
            AuditKind::KeyUsedUp,
            event_id,
            &key.key_id,
            refs,
            None,
            now,
            queued,
        )?;
    }
    Ok(())
}

/// A grant's column values, in the `?1`..`?15` order both the insert and the
/// upgrade statement use.
pub(super) struct GrantRow<'a> {
    pub(super) key: &'a Grant,
    pub(super) version: i64,
    pub(super) state: &'static str,
    pub(super) valid_until: i64,
    pub(super) event_id: &'a str,
    pub(super) now: i64,
    /// The schedule as the wire's JSON, the form the row keeps.
    pub(super) schedule: Option<String>,
}

pub(super) fn grant_row<'a>(
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
        schedule: key.schedule.as_ref().map(|s| s.to_json_string()),
    }
}

impl GrantRow<'_> {
    pub(super) fn as_params(&self) -> [&dyn rusqlite::ToSql; 15] {
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
            &self.schedule,
            &k.max_uses,
        ]
    }
}

pub(super) fn insert_key(
    conn: &Connection,
    event_id: &str,
    key: &Grant,
    placement: Placement,
    now: Timestamp,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO keys (key_id, version, state, check_in_id, reservation_id, valid_from,
                           valid_until, pin_tag, pin_key_id, holder_ref, holder_name,
                           revoke_reason, event_id, updated_at, schedule, max_uses)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, NULL, ?12, ?13, ?14, ?15)",
    )?
    .execute(grant_row(key, &placement, event_id, now).as_params())?;
    insert_doors(conn, key)
}

/// Moves a live key to the grant's higher version. The old doors go first,
/// so that the new PIN tag is checked against other keys only on the new
/// doors. The use count stays: uses are counted per key id, and the new
/// version's `max_uses` (or none) applies to them.
pub(super) fn upgrade_key(
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
                         holder_ref = ?10, holder_name = ?11, event_id = ?12, updated_at = ?13,
                         schedule = ?14, max_uses = ?15
          WHERE key_id = ?1",
    )?
    .execute(grant_row(key, &placement, event_id, now).as_params())?;
    insert_doors(conn, key)
}

pub(super) fn insert_doors(conn: &Connection, key: &Grant) -> Result<(), StoreError> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES (?1, ?2, ?3, 1)",
    )?;
    for door in &key.doors {
        stmt.execute(params![key.key_id, door, &key.pin_tag.0[..]])?;
    }
    Ok(())
}

/// A live or used-up key becomes `revoked`, with its reason and a
/// `key.revoked` audit row. (The `keys_sync_doors` trigger takes its doors
/// out of service.)
pub(super) fn revoke_key(
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
          WHERE key_id = ?1 AND state IN ('pre_issued', 'active', 'used_up')",
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
pub(super) struct KeyRefs {
    pub(super) check_in_id: Option<String>,
    pub(super) holder_ref: Option<String>,
    /// Local only, where erasure can reach it.
    pub(super) holder_name: Option<String>,
}

/// A key lifecycle audit row, carrying the key's references (and its
/// holder name, locally, where erasure can reach it); its outbox row goes
/// on `queued`.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_key_audit(
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
pub(super) fn tombstone_reservation(
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

pub(super) fn load_key(conn: &Connection, key_id: &str) -> Result<Option<KeyView>, StoreError> {
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

pub(super) fn pre_issued_of_reservation(
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
pub(super) fn is_pre_issued_of(
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

pub(super) fn is_key_tombstoned(conn: &Connection, key_id: &str) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM key_tombstones WHERE key_id = ?1)")?
        .query_row([key_id], |r| r.get(0))?)
}

pub(super) fn is_reservation_tombstoned(
    conn: &Connection,
    reservation_id: &str,
) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM reservation_tombstones WHERE reservation_id = ?1)",
        )?
        .query_row([reservation_id], |r| r.get(0))?)
}
