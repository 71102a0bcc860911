-- lockhub schema: weekly schedules and use-limited keys (mqtt.md 'Grant':
-- `schedule`, `max_uses`; 'Invariants').
--
-- 1. `keys` gains `schedule` (the grant's intervals, as the wire's JSON),
--    `max_uses` and `use_count`, and the final state `used_up`. Uses are
--    counted per key_id, for every key (a limit set by a later version
--    applies to the uses already taken); a key without `max_uses` has no
--    limit.
-- 2. `audit` gains the kind `key.used_up` and the denial reasons
--    `outside_schedule` and `used_up`.
--
-- The rules, in SQL as everywhere else:
-- - A use is taken one at a time, from a live key, at its version, and never
--   past `max_uses`; the use that takes the last one moves the key to
--   `used_up` in the same statement. A key is inserted with no use taken
--   (so never used up), and the count never goes back: a higher version
--   keeps it.
-- - `used_up` is reached only with every use taken, and it is final but for
--   a revoke: the row never changes again except a move to `revoked` (and
--   `holder_name` set to NULL). Its doors are frozen like any final key's.
-- - A live key's `schedule` and `max_uses` change only with a higher
--   version, like the rest of its grant; a key ends as it was granted.
--
-- SQLite cannot change a CHECK in place, so both tables are rebuilt as 0009
-- did; every trigger or index this step does not create again comes back
-- from its original SQL (store/migrate.rs, `Dependents`). The triggers that
-- name the final states are created again below with `used_up` among them.

CREATE TABLE keys_new (
    key_id         TEXT PRIMARY KEY
                   CHECK (length(key_id) BETWEEN 1 AND 64
                          AND key_id NOT GLOB '*[^A-Za-z0-9._-]*'),
    version        INTEGER NOT NULL CHECK (version BETWEEN 1 AND 9007199254740991),
    state          TEXT NOT NULL
                   CHECK ((state = 'pre_issued' OR state = 'active'
                           OR state = 'revoked' OR state = 'expired' OR state = 'used_up')),
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
    -- The event that last changed this row (NULL only for the expiry sweep
    -- and the door entry that took the last use).
    event_id       TEXT,
    updated_at     INTEGER NOT NULL,
    -- The grant's weekly intervals, the wire's JSON (lockhub_proto::schedule);
    -- NULL: any hour of the window.
    schedule       TEXT
                   CHECK (schedule IS NULL
                          OR (json_valid(schedule) AND json_type(schedule) = 'array'
                              AND json_array_length(schedule) BETWEEN 1 AND 28)),
    -- How many entries the key grants in all; NULL: no limit.
    max_uses       INTEGER CHECK (max_uses IS NULL OR max_uses BETWEEN 1 AND 100000),
    -- Entries granted so far, across the key's versions.
    use_count      INTEGER NOT NULL DEFAULT 0 CHECK (use_count >= 0),
    CHECK (valid_from < valid_until),
    -- An active key always belongs to a check-in.
    CHECK (state <> 'active' OR check_in_id IS NOT NULL),
    CHECK ((state = 'revoked') = (revoke_reason IS NOT NULL)),
    -- A key is used up only when its uses are.
    CHECK (state <> 'used_up' OR (max_uses IS NOT NULL AND use_count >= max_uses))
) WITHOUT ROWID;
INSERT INTO keys_new (key_id, version, state, check_in_id, reservation_id, valid_from, valid_until,
                      pin_tag, pin_key_id, holder_ref, holder_name, revoke_reason, event_id, updated_at)
  SELECT key_id, version, state, check_in_id, reservation_id, valid_from, valid_until,
         pin_tag, pin_key_id, holder_ref, holder_name, revoke_reason, event_id, updated_at
    FROM keys;
DROP TABLE keys;
-- As in 0009: the legacy rename leaves the triggers on other tables that
-- read `keys` pointing at it again.
PRAGMA legacy_alter_table = ON;
ALTER TABLE keys_new RENAME TO keys;
PRAGMA legacy_alter_table = OFF;

-- Invariant: key states move only along the whitelist
--   pre_issued -> active | revoked | expired | used_up,
--   active -> revoked | expired | used_up,  used_up -> revoked.
CREATE TRIGGER keys_state_whitelist BEFORE UPDATE OF state ON keys
WHEN NEW.state <> OLD.state
 AND NOT ((OLD.state = 'pre_issued'
           AND (NEW.state = 'active' OR NEW.state = 'revoked' OR NEW.state = 'expired'
                OR NEW.state = 'used_up'))
       OR (OLD.state = 'active'
           AND (NEW.state = 'revoked' OR NEW.state = 'expired' OR NEW.state = 'used_up'))
       OR (OLD.state = 'used_up' AND NEW.state = 'revoked'))
BEGIN
    SELECT RAISE(ABORT, 'illegal_transition');
END;

-- Invariant: a final row never changes again, except that holder_name may
-- be erased, and a used-up key may be revoked (its grant, count and name
-- stay; it gains the revoke's reason, event and time).
CREATE TRIGGER keys_final_is_immutable BEFORE UPDATE ON keys
WHEN (OLD.state = 'revoked' OR OLD.state = 'expired' OR OLD.state = 'used_up')
 AND NOT (NEW.key_id IS OLD.key_id AND NEW.version IS OLD.version
      AND NEW.check_in_id IS OLD.check_in_id AND NEW.reservation_id IS OLD.reservation_id
      AND NEW.valid_from IS OLD.valid_from AND NEW.valid_until IS OLD.valid_until
      AND NEW.pin_tag IS OLD.pin_tag AND NEW.pin_key_id IS OLD.pin_key_id
      AND NEW.holder_ref IS OLD.holder_ref AND NEW.schedule IS OLD.schedule
      AND NEW.max_uses IS OLD.max_uses AND NEW.use_count IS OLD.use_count
      AND ((NEW.holder_name IS NULL
            AND NEW.state IS OLD.state AND NEW.revoke_reason IS OLD.revoke_reason
            AND NEW.event_id IS OLD.event_id AND NEW.updated_at IS OLD.updated_at)
        OR (OLD.state = 'used_up' AND NEW.state = 'revoked'
            AND (NEW.holder_name IS OLD.holder_name OR NEW.holder_name IS NULL))))
BEGIN
    SELECT RAISE(ABORT, 'final key is immutable');
END;

-- A live key changes only by moving to a higher version (an upgrade), by
-- taking a use, or by leaving the live states at the same version; the key
-- id never changes. (0001's rule, with the new grant fields.)
CREATE TRIGGER keys_versions_only_rise BEFORE UPDATE ON keys
WHEN OLD.state IN ('pre_issued', 'active')
 AND (NEW.key_id IS NOT OLD.key_id OR NEW.version < OLD.version
      OR (NEW.version = OLD.version AND NEW.state IN ('pre_issued', 'active')
          AND NOT (NEW.holder_name IS NULL AND NEW.state IS OLD.state
                   AND NEW.valid_from IS OLD.valid_from AND NEW.valid_until IS OLD.valid_until
                   AND NEW.pin_tag IS OLD.pin_tag AND NEW.check_in_id IS OLD.check_in_id
                   -- the same tag under another PIN key is another PIN
                   AND NEW.pin_key_id IS OLD.pin_key_id
                   AND NEW.reservation_id IS OLD.reservation_id
                   AND NEW.holder_ref IS OLD.holder_ref
                   AND NEW.schedule IS OLD.schedule AND NEW.max_uses IS OLD.max_uses)
          -- taking a use changes only the count (and the row's time)
          AND NOT (NEW.use_count = OLD.use_count + 1 AND NEW.state IS OLD.state
                   AND (NEW.holder_name IS OLD.holder_name)
                   AND NEW.valid_from IS OLD.valid_from AND NEW.valid_until IS OLD.valid_until
                   AND NEW.pin_tag IS OLD.pin_tag AND NEW.check_in_id IS OLD.check_in_id
                   AND NEW.pin_key_id IS OLD.pin_key_id
                   AND NEW.reservation_id IS OLD.reservation_id
                   AND NEW.holder_ref IS OLD.holder_ref
                   AND NEW.schedule IS OLD.schedule AND NEW.max_uses IS OLD.max_uses)))
BEGIN
    SELECT RAISE(ABORT, 'key changes need a higher version');
END;

-- A key that ends (revoked, expired, used up) keeps the grant it ended as,
-- at its version (0012's rule, with `used_up` and the new grant fields).
-- Only the use that ends it may change the count, by one (the next trigger).
CREATE TRIGGER keys_end_as_granted BEFORE UPDATE ON keys
WHEN (OLD.state = 'pre_issued' OR OLD.state = 'active')
 AND (NEW.state = 'revoked' OR NEW.state = 'expired' OR NEW.state = 'used_up')
 AND (NEW.key_id IS NOT OLD.key_id OR NEW.version IS NOT OLD.version
      OR NEW.check_in_id IS NOT OLD.check_in_id OR NEW.reservation_id IS NOT OLD.reservation_id
      OR NEW.valid_from IS NOT OLD.valid_from OR NEW.valid_until IS NOT OLD.valid_until
      OR NEW.pin_tag IS NOT OLD.pin_tag OR NEW.pin_key_id IS NOT OLD.pin_key_id
      OR NEW.holder_ref IS NOT OLD.holder_ref
      OR NEW.schedule IS NOT OLD.schedule OR NEW.max_uses IS NOT OLD.max_uses
      OR (NEW.holder_name IS NOT NULL AND NEW.holder_name IS NOT OLD.holder_name))
BEGIN
    SELECT RAISE(ABORT, 'a key ends as it was granted');
END;

-- Invariant: a key's uses never exceed its max_uses. A use is taken one at
-- a time, from a live key, at its version and limit, never past the limit;
-- the count never goes back, and a higher version keeps it. (A higher
-- version may set a limit at or below the uses already taken: the key is
-- then used up at once, with its true count.)
CREATE TRIGGER keys_uses_taken_one_at_a_time BEFORE UPDATE ON keys
WHEN NEW.use_count IS NOT OLD.use_count
 AND NOT ((OLD.state = 'pre_issued' OR OLD.state = 'active')
          AND NEW.use_count = OLD.use_count + 1
          AND NEW.version = OLD.version AND NEW.max_uses IS OLD.max_uses
          AND (NEW.state = OLD.state OR NEW.state = 'used_up')
          AND (NEW.max_uses IS NULL OR NEW.use_count <= NEW.max_uses))
BEGIN
    SELECT RAISE(ABORT, 'uses are taken one at a time, up to max_uses');
END;

-- The use that takes the last one ends the key in the same statement: a
-- live key with no use left would be a key that opens nothing yet looks
-- live to the mirror proof and to `lockhub keys`.
CREATE TRIGGER keys_last_use_ends_the_key BEFORE UPDATE ON keys
WHEN NEW.use_count > OLD.use_count AND NEW.max_uses IS NOT NULL
 AND NEW.use_count >= NEW.max_uses AND NEW.state <> 'used_up'
BEGIN
    SELECT RAISE(ABORT, 'the last use moves the key to used_up');
END;

-- A key starts with no use taken, so it is not inserted used up: uses are
-- taken only by door entries, one at a time.
CREATE TRIGGER keys_start_unused BEFORE INSERT ON keys
WHEN NEW.use_count <> 0 OR NEW.state = 'used_up'
BEGIN
    SELECT RAISE(ABORT, 'a key starts with no use taken');
END;

-- A final key's doors are part of its final row: they never change. (On
-- key_doors, which is not rebuilt: the old ones go first.)
DROP TRIGGER key_doors_frozen_when_final_insert;
DROP TRIGGER key_doors_frozen_when_final_delete;
CREATE TRIGGER key_doors_frozen_when_final_insert BEFORE INSERT ON key_doors
WHEN (SELECT state FROM keys WHERE key_id = NEW.key_id) IN ('revoked', 'expired', 'used_up')
BEGIN
    SELECT RAISE(ABORT, 'final key is immutable');
END;

CREATE TRIGGER key_doors_frozen_when_final_delete BEFORE DELETE ON key_doors
WHEN EXISTS (
    SELECT 1 FROM keys k
    WHERE k.key_id = OLD.key_id AND k.state IN ('revoked', 'expired', 'used_up')
      AND k.valid_until + (SELECT dedupe_retention_days FROM policy WHERE id = 1) * 86400000000
          > CAST(unixepoch('subsec') * 1000000 AS INTEGER))
BEGIN
    SELECT RAISE(ABORT, 'final key is immutable');
END;

-- One of the keys of a pin_ambiguous alert stopped being live (0003's
-- trigger; a key that is used up stops being live too).
CREATE TRIGGER keys_end_pin_ambiguous AFTER UPDATE OF state ON keys
WHEN OLD.state IN ('pre_issued', 'active') AND NEW.state IN ('revoked', 'expired', 'used_up')
 AND EXISTS (SELECT 1 FROM alert_keys WHERE key_id = NEW.key_id)
BEGIN
    INSERT INTO outbox (topic, body, audit_id, created_at)
    SELECT 'alerts',
           CAST(json_object(
               'alert_id', a.alert_id, 'condition', a.condition, 'subject', a.subject,
               'state', 'cleared', 'count', a.count,
               'first_at', printf('%s.%06dZ',
                   strftime('%Y-%m-%dT%H:%M:%S', a.first_at / 1000000, 'unixepoch'),
                   a.first_at % 1000000),
               'last_at', printf('%s.%06dZ',
                   strftime('%Y-%m-%dT%H:%M:%S', max(a.last_at, NEW.updated_at) / 1000000, 'unixepoch'),
                   max(a.last_at, NEW.updated_at) % 1000000)) AS BLOB),
           NULL, NEW.updated_at
      FROM alerts a
     WHERE a.condition = 'pin_ambiguous' AND a.state = 'raised'
       AND a.subject IN (SELECT subject FROM alert_keys
                          WHERE condition = 'pin_ambiguous' AND key_id = NEW.key_id)
     ORDER BY a.subject;
    UPDATE alerts
       SET state = 'cleared', last_at = max(last_at, NEW.updated_at),
           published_at = max(last_at, NEW.updated_at)
     WHERE condition = 'pin_ambiguous' AND state = 'raised'
       AND subject IN (SELECT subject FROM alert_keys
                        WHERE condition = 'pin_ambiguous' AND key_id = NEW.key_id);
    DELETE FROM alert_keys
     WHERE condition = 'pin_ambiguous'
       AND subject IN (SELECT subject FROM alert_keys WHERE key_id = NEW.key_id);
END;

-- A used-up key's doors stay (live = 0, as keys_sync_doors leaves them), so
-- that its PIN is told `used_up`, not `unknown_pin`, while no live key has
-- it: the door looks it up by (door, pin_tag) among the keys no longer live.
CREATE INDEX key_doors_ended_by_tag ON key_doors (door, pin_tag) WHERE live = 0;

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
                                      OR kind = 'key.expired' OR kind = 'key.used_up')),
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
                                     OR reason = 'outside_schedule' OR reason = 'used_up'
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
