-- lockhub schema: the CHECKs that list a column's allowed values say it as
-- a chain of equalities instead of `IN (...)` (issue 14, the writer's cost
-- per event). Same constraints, same rows, same triggers and indexes.
--
-- Why: SQLite tests `x IN (a, b, c, ...)` against three or more constants by
-- building an ephemeral index of the list every time the statement runs, and
-- a single-row INSERT runs once per row. Under a flood of `key.issued` each
-- event inserts a key (`state`, 4 values), an audit row (`kind`, 13) and a
-- dedupe row (`outcome`, 3): opening, filling and closing those temporary
-- B-trees was ~7 % of the writer thread's time (perf, BENCHMARKS.md "The
-- hub's CPU per event"). `x = a OR x = b OR ...` is the same test, NULL
-- included (NULL either way, which a CHECK lets through, as before), done
-- with a few comparisons. Lists of two are left alone: SQLite already
-- compares those one by one. The outbox's `topic` list stays: under a flood
-- its rows go in by multi-row inserts (`outbox::Queued`), which build the
-- list once a statement, and a door's commit writes one row; its body-sized
-- rows would make the rebuild the slowest of all.
--
-- SQLite cannot change a CHECK in place, so each table is rebuilt; the
-- triggers and indexes on it come back from their original SQL
-- (store/migrate.rs, `Dependents`). Foreign keys are off while the steps
-- run and checked whole before the commit.

CREATE TABLE keys_new (
    key_id         TEXT PRIMARY KEY
                   CHECK (length(key_id) BETWEEN 1 AND 64
                          AND key_id NOT GLOB '*[^A-Za-z0-9._-]*'),
    version        INTEGER NOT NULL CHECK (version BETWEEN 1 AND 9007199254740991),
    state          TEXT NOT NULL
                   CHECK ((state = 'pre_issued' OR state = 'active'
                           OR state = 'revoked' OR state = 'expired')),
    check_in_id    TEXT,
    reservation_id TEXT,
    valid_from     INTEGER NOT NULL,
    valid_until    INTEGER NOT NULL,
    pin_tag        BLOB NOT NULL CHECK (typeof(pin_tag) = 'blob' AND length(pin_tag) = 32),
    pin_key_id     TEXT NOT NULL CHECK (length(pin_key_id) BETWEEN 1 AND 64),
    holder_ref     TEXT,
    holder_name    TEXT,
    -- Why a revoked key was revoked; NULL for every other state.
    revoke_reason  TEXT,
    -- The event that last changed this row (NULL only for the expiry sweep).
    event_id       TEXT,
    updated_at     INTEGER NOT NULL,
    CHECK (valid_from < valid_until),
    -- An active key always belongs to a check-in.
    CHECK (state <> 'active' OR check_in_id IS NOT NULL),
    CHECK ((state = 'revoked') = (revoke_reason IS NOT NULL))
) WITHOUT ROWID;
INSERT INTO keys_new (key_id, version, state, check_in_id, reservation_id, valid_from, valid_until,
                      pin_tag, pin_key_id, holder_ref, holder_name, revoke_reason, event_id, updated_at)
  SELECT key_id, version, state, check_in_id, reservation_id, valid_from, valid_until,
         pin_tag, pin_key_id, holder_ref, holder_name, revoke_reason, event_id, updated_at
    FROM keys;
DROP TABLE keys;
-- Triggers on other tables read `keys` (key_doors' rules): a modern RENAME
-- re-checks every trigger and finds them pointing at a table that is gone
-- for a moment; the legacy one renames just this table, and they point at
-- it again.
PRAGMA legacy_alter_table = ON;
ALTER TABLE keys_new RENAME TO keys;
PRAGMA legacy_alter_table = OFF;

CREATE TABLE audit_new (
    seqno       INTEGER PRIMARY KEY AUTOINCREMENT,
    audit_id    TEXT NOT NULL UNIQUE CHECK (length(audit_id) = 36),
    at          INTEGER NOT NULL,
    kind        TEXT NOT NULL CHECK ((kind = 'door.granted' OR kind = 'door.unlocked'
                                      OR kind = 'door.unlock_unconfirmed' OR kind = 'door.denied'
                                      OR kind = 'door.locked_out' OR kind = 'door.forced'
                                      OR kind = 'door.held_open' OR kind = 'board.tamper'
                                      OR kind = 'door.flood' OR kind = 'alert.cleared'
                                      OR kind = 'key.activated' OR kind = 'key.revoked'
                                      OR kind = 'key.expired')),
    door        TEXT,
    key_id      TEXT,
    check_in_id TEXT,
    holder_ref  TEXT,
    -- Personal data kept for the operator's local view; erasable.
    holder_name TEXT,
    reason      TEXT,
    event_id    TEXT,
    -- Set once, when the broker acknowledged the audit record.
    acked_at    INTEGER,
    -- The condition an operator cleared (`alert.cleared` only, and always there).
    condition   TEXT,
    -- `door.flood` only: the entries past the flood limit this row counts.
    count       INTEGER CHECK (count IS NULL OR count >= 1),
    CHECK (kind <> 'door.denied' OR (reason = 'unknown_pin' OR reason = 'outside_window'
                                     OR reason = 'bad_format' OR reason = 'unknown_door'
                                     OR reason = 'pin_ambiguous' OR reason = 'storage_failure'
                                     OR reason = 'unsupported_credential')),
    CHECK ((kind = 'alert.cleared') = (condition IS NOT NULL)),
    -- An operator's clear always says why.
    CHECK (kind <> 'alert.cleared' OR (reason IS NOT NULL AND door IS NOT NULL)),
    CHECK ((kind = 'door.flood') = (count IS NOT NULL)),
    CHECK (kind <> 'door.flood' OR door IS NOT NULL)
);
INSERT INTO audit_new (seqno, audit_id, at, kind, door, key_id, check_in_id, holder_ref,
                       holder_name, reason, event_id, acked_at, condition, count)
  SELECT seqno, audit_id, at, kind, door, key_id, check_in_id, holder_ref,
         holder_name, reason, event_id, acked_at, condition, count
    FROM audit;
-- AUTOINCREMENT never reuses a seqno, also one whose row was pruned.
INSERT INTO sqlite_sequence (name, seq)
  SELECT 'audit_new', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'audit_new');
UPDATE sqlite_sequence
   SET seq = max(seq, coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'audit'), 0))
 WHERE name = 'audit_new';
DROP TABLE audit;
ALTER TABLE audit_new RENAME TO audit;

CREATE TABLE dedupe_new (
    site_id     TEXT NOT NULL,
    event_id    TEXT NOT NULL CHECK (length(event_id) = 36 AND event_id = lower(event_id)),
    body_sha256 BLOB NOT NULL CHECK (typeof(body_sha256) = 'blob' AND length(body_sha256) = 32),
    seq         INTEGER CHECK (seq IS NULL OR seq BETWEEN 1 AND 9007199254740991),
    outcome     TEXT NOT NULL CHECK ((outcome = 'applied' OR outcome = 'noop'
                                      OR outcome = 'rejected')),
    reason      TEXT,
    -- The first result's body (JSON), replayed with "duplicate": true;
    -- NULL when the columns of this row say all it would.
    result      TEXT,
    received_at INTEGER NOT NULL,
    CHECK ((outcome = 'rejected') = (reason IS NOT NULL)),
    PRIMARY KEY (site_id, event_id)
) WITHOUT ROWID;
INSERT INTO dedupe_new (site_id, event_id, body_sha256, seq, outcome, reason, result, received_at)
  SELECT site_id, event_id, body_sha256, seq, outcome, reason, result, received_at
    FROM dedupe;
DROP TABLE dedupe;
ALTER TABLE dedupe_new RENAME TO dedupe;
