-- lockhub schema, version 1.
--
-- The invariants of mqtt.md live here, so that no bug in the daemon can
-- break them: SQLite refuses the statement. Times are INTEGER microseconds
-- since the Unix epoch (UTC). Append-only: never edit a released migration;
-- add a new file instead.

-- Policy values the triggers need (retention), written by the daemon at
-- start from the config. One row.
CREATE TABLE policy (
    id                    INTEGER PRIMARY KEY CHECK (id = 1),
    dedupe_retention_days INTEGER NOT NULL CHECK (dedupe_retention_days > 0),
    audit_retention_days  INTEGER NOT NULL CHECK (audit_retention_days > 0),
    max_grant_days        INTEGER NOT NULL CHECK (max_grant_days > 0)
);
INSERT INTO policy (id, dedupe_retention_days, audit_retention_days, max_grant_days)
VALUES (1, 14, 90, 60);

-- The retention guards compare against the wall clock, in microseconds.
-- (unixepoch('subsec') is in SQLite >= 3.42; the bundled build is newer.)

------------------------------------------------------------------------------
-- Keys
------------------------------------------------------------------------------
CREATE TABLE keys (
    key_id         TEXT PRIMARY KEY
                   CHECK (length(key_id) BETWEEN 1 AND 64
                          AND key_id NOT GLOB '*[^A-Za-z0-9._-]*'),
    version        INTEGER NOT NULL CHECK (version BETWEEN 1 AND 9007199254740991),
    state          TEXT NOT NULL
                   CHECK (state IN ('pre_issued', 'active', 'revoked', 'expired')),
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

-- Invariant: at most one active key per check-in.
CREATE UNIQUE INDEX keys_one_active_per_check_in ON keys (check_in_id) WHERE state = 'active';
CREATE INDEX keys_by_reservation ON keys (reservation_id) WHERE reservation_id IS NOT NULL;
CREATE INDEX keys_by_holder_ref ON keys (holder_ref) WHERE holder_ref IS NOT NULL;
CREATE INDEX keys_live_by_until ON keys (valid_until) WHERE state IN ('pre_issued', 'active');

-- Which doors a key opens. `pin_tag` and `live` copy the key's row so that a
-- partial unique index can hold the (door, pin_tag) invariant; triggers keep
-- the copies honest and refuse any row that disagrees with its key.
CREATE TABLE key_doors (
    key_id  TEXT NOT NULL REFERENCES keys (key_id) ON DELETE CASCADE,
    door    TEXT NOT NULL CHECK (length(door) BETWEEN 1 AND 64),
    pin_tag BLOB NOT NULL,
    live    INTEGER NOT NULL CHECK (live IN (0, 1)),
    PRIMARY KEY (key_id, door)
) WITHOUT ROWID;

-- Invariant: at most one live key per (door, pin_tag). Also the door
-- decision's index probe: its cost does not grow with the number of keys.
CREATE UNIQUE INDEX key_doors_one_live_per_tag ON key_doors (door, pin_tag) WHERE live = 1;

CREATE TRIGGER key_doors_match_key_on_insert BEFORE INSERT ON key_doors
WHEN NOT EXISTS (
    SELECT 1 FROM keys k
    WHERE k.key_id = NEW.key_id
      AND k.pin_tag = NEW.pin_tag
      AND (k.state IN ('pre_issued', 'active')) = (NEW.live = 1)
)
BEGIN
    SELECT RAISE(ABORT, 'key_doors row disagrees with its key');
END;

CREATE TRIGGER key_doors_match_key_on_update BEFORE UPDATE ON key_doors
WHEN NOT EXISTS (
    SELECT 1 FROM keys k
    WHERE k.key_id = NEW.key_id
      AND k.pin_tag = NEW.pin_tag
      AND (k.state IN ('pre_issued', 'active')) = (NEW.live = 1)
)
BEGIN
    SELECT RAISE(ABORT, 'key_doors row disagrees with its key');
END;

-- A final key's doors are part of its final row: they never change.
CREATE TRIGGER key_doors_frozen_when_final_insert BEFORE INSERT ON key_doors
WHEN (SELECT state FROM keys WHERE key_id = NEW.key_id) IN ('revoked', 'expired')
BEGIN
    SELECT RAISE(ABORT, 'final key is immutable');
END;

CREATE TRIGGER key_doors_frozen_when_final_delete BEFORE DELETE ON key_doors
WHEN EXISTS (
    SELECT 1 FROM keys k
    WHERE k.key_id = OLD.key_id AND k.state IN ('revoked', 'expired')
      AND k.valid_until + (SELECT dedupe_retention_days FROM policy WHERE id = 1) * 86400000000
          > CAST(unixepoch('subsec') * 1000000 AS INTEGER))
BEGIN
    SELECT RAISE(ABORT, 'final key is immutable');
END;

-- The (door, pin_tag) invariant ahead of the unique index (see the REPLACE
-- note at keys_no_overwrite): a REPLACE must not evict another key's door.
CREATE TRIGGER key_doors_one_live_per_tag_on_insert BEFORE INSERT ON key_doors
WHEN NEW.live = 1
 AND EXISTS (SELECT 1 FROM key_doors WHERE door = NEW.door AND pin_tag = NEW.pin_tag
                                       AND live = 1 AND key_id <> NEW.key_id)
BEGIN
    SELECT RAISE(ABORT, 'pin_collision');
END;

CREATE TRIGGER key_doors_one_live_per_tag_on_update BEFORE UPDATE ON key_doors
WHEN NEW.live = 1
 AND EXISTS (SELECT 1 FROM key_doors WHERE door = NEW.door AND pin_tag = NEW.pin_tag
                                       AND live = 1 AND key_id <> OLD.key_id)
BEGIN
    SELECT RAISE(ABORT, 'pin_collision');
END;

CREATE TRIGGER key_doors_no_overwrite BEFORE INSERT ON key_doors
WHEN EXISTS (SELECT 1 FROM key_doors WHERE key_id = NEW.key_id AND door = NEW.door)
BEGIN
    SELECT RAISE(ABORT, 'key_doors row exists');
END;

-- A key's doors change only with a new version, which deletes and
-- re-inserts them; a row is never re-pointed at another door or key.
CREATE TRIGGER key_doors_door_is_fixed BEFORE UPDATE ON key_doors
WHEN NEW.door IS NOT OLD.door OR NEW.key_id IS NOT OLD.key_id
BEGIN
    SELECT RAISE(ABORT, 'key_doors rows are replaced, not edited');
END;

-- Invariant: key states move only along the whitelist
--   pre_issued -> active | revoked | expired,  active -> revoked | expired.
CREATE TRIGGER keys_state_whitelist BEFORE UPDATE OF state ON keys
WHEN NEW.state <> OLD.state
 AND NOT ((OLD.state = 'pre_issued' AND NEW.state IN ('active', 'revoked', 'expired'))
       OR (OLD.state = 'active' AND NEW.state IN ('revoked', 'expired')))
BEGIN
    SELECT RAISE(ABORT, 'illegal_transition');
END;

-- Invariant: a final (revoked or expired) row never changes again, except
-- that holder_name may be erased.
CREATE TRIGGER keys_final_is_immutable BEFORE UPDATE ON keys
WHEN OLD.state IN ('revoked', 'expired')
 AND NOT (NEW.holder_name IS NULL
      AND NEW.key_id IS OLD.key_id AND NEW.version IS OLD.version
      AND NEW.state IS OLD.state AND NEW.check_in_id IS OLD.check_in_id
      AND NEW.reservation_id IS OLD.reservation_id
      AND NEW.valid_from IS OLD.valid_from AND NEW.valid_until IS OLD.valid_until
      AND NEW.pin_tag IS OLD.pin_tag AND NEW.pin_key_id IS OLD.pin_key_id
      AND NEW.holder_ref IS OLD.holder_ref AND NEW.revoke_reason IS OLD.revoke_reason
      AND NEW.event_id IS OLD.event_id AND NEW.updated_at IS OLD.updated_at)
BEGIN
    SELECT RAISE(ABORT, 'final key is immutable');
END;

-- A live key changes only by moving to a higher version (an upgrade) or by
-- leaving the live states (revoke, expire) at the same version; the key id
-- never changes.
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
                   AND NEW.holder_ref IS OLD.holder_ref)))
BEGIN
    SELECT RAISE(ABORT, 'key changes need a higher version');
END;

-- Keep key_doors' copies in step with the key (runs after the checks above).
CREATE TRIGGER keys_sync_doors AFTER UPDATE OF state, pin_tag ON keys
BEGIN
    UPDATE key_doors
       SET pin_tag = NEW.pin_tag,
           live = (NEW.state IN ('pre_issued', 'active'))
     WHERE key_id = NEW.key_id;
END;

-- A tombstoned key id can never come back as a key.
CREATE TRIGGER keys_refuse_tombstoned BEFORE INSERT ON keys
WHEN EXISTS (SELECT 1 FROM key_tombstones WHERE key_id = NEW.key_id)
BEGIN
    SELECT RAISE(ABORT, 'revoked');
END;

-- A pre-issued key of a reservation that has checked in is refused.
CREATE TRIGGER keys_refuse_pre_issued_after_check_in BEFORE INSERT ON keys
WHEN NEW.state = 'pre_issued' AND NEW.reservation_id IS NOT NULL
 AND EXISTS (SELECT 1 FROM reservation_tombstones WHERE reservation_id = NEW.reservation_id)
BEGIN
    SELECT RAISE(ABORT, 'revoked');
END;

CREATE TRIGGER keys_refuse_pre_issued_upgrade_after_check_in BEFORE UPDATE ON keys
WHEN NEW.state = 'pre_issued' AND NEW.reservation_id IS NOT NULL
 AND EXISTS (SELECT 1 FROM reservation_tombstones WHERE reservation_id = NEW.reservation_id)
BEGIN
    SELECT RAISE(ABORT, 'revoked');
END;

-- Live keys are never deleted; final keys only after valid_until + retention.
CREATE TRIGGER keys_delete_guard BEFORE DELETE ON keys
WHEN OLD.state IN ('pre_issued', 'active')
  OR OLD.valid_until + (SELECT dedupe_retention_days FROM policy WHERE id = 1) * 86400000000
     > CAST(unixepoch('subsec') * 1000000 AS INTEGER)
BEGIN
    SELECT RAISE(ABORT, 'key retention not reached');
END;

-- `INSERT OR REPLACE` / `UPDATE OR REPLACE` delete the conflicting rows
-- without firing delete triggers (recursive_triggers is off by default), so
-- a REPLACE could resurrect a revoked key or delete a live one past every
-- guard above. These BEFORE triggers run ahead of conflict resolution and
-- refuse the statement instead. The same pattern guards every table below
-- whose rows must not be overwritten.
CREATE TRIGGER keys_no_overwrite BEFORE INSERT ON keys
WHEN EXISTS (SELECT 1 FROM keys WHERE key_id = NEW.key_id)
BEGIN
    SELECT RAISE(ABORT, 'key exists');
END;

-- The one-active invariant, ahead of the unique index so that REPLACE
-- cannot satisfy the index by deleting the other key.
CREATE TRIGGER keys_one_active_on_insert BEFORE INSERT ON keys
WHEN NEW.state = 'active'
 AND EXISTS (SELECT 1 FROM keys WHERE state = 'active' AND check_in_id = NEW.check_in_id
                                  AND key_id <> NEW.key_id)
BEGIN
    SELECT RAISE(ABORT, 'one_active_conflict');
END;

CREATE TRIGGER keys_one_active_on_update BEFORE UPDATE ON keys
WHEN NEW.state = 'active'
 AND EXISTS (SELECT 1 FROM keys WHERE state = 'active' AND check_in_id = NEW.check_in_id
                                  AND key_id <> OLD.key_id)
BEGIN
    SELECT RAISE(ABORT, 'one_active_conflict');
END;

------------------------------------------------------------------------------
-- Tombstones: a revoke for a key the hub never saw, and check-ins that
-- closed a reservation to pre-issued keys.
------------------------------------------------------------------------------
CREATE TABLE key_tombstones (
    key_id     TEXT PRIMARY KEY CHECK (length(key_id) BETWEEN 1 AND 64),
    reason     TEXT NOT NULL,
    event_id   TEXT NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;

-- A tombstone and a key row for the same id never coexist.
CREATE TRIGGER key_tombstones_not_for_existing_keys BEFORE INSERT ON key_tombstones
WHEN EXISTS (SELECT 1 FROM keys WHERE key_id = NEW.key_id)
BEGIN
    SELECT RAISE(ABORT, 'key exists');
END;

CREATE TRIGGER key_tombstones_immutable BEFORE UPDATE ON key_tombstones
BEGIN
    SELECT RAISE(ABORT, 'tombstones are immutable');
END;

CREATE TRIGGER key_tombstones_no_overwrite BEFORE INSERT ON key_tombstones
WHEN EXISTS (SELECT 1 FROM key_tombstones WHERE key_id = NEW.key_id)
BEGIN
    SELECT RAISE(ABORT, 'tombstones are immutable');
END;

CREATE TRIGGER key_tombstones_delete_guard BEFORE DELETE ON key_tombstones
WHEN OLD.created_at + ((SELECT max_grant_days + dedupe_retention_days FROM policy WHERE id = 1)
                       * 86400000000)
     > CAST(unixepoch('subsec') * 1000000 AS INTEGER)
BEGIN
    SELECT RAISE(ABORT, 'tombstone retention not reached');
END;

CREATE TABLE reservation_tombstones (
    reservation_id TEXT PRIMARY KEY,
    check_in_id    TEXT NOT NULL,
    event_id       TEXT NOT NULL,
    created_at     INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TRIGGER reservation_tombstones_immutable BEFORE UPDATE ON reservation_tombstones
BEGIN
    SELECT RAISE(ABORT, 'tombstones are immutable');
END;

CREATE TRIGGER reservation_tombstones_no_overwrite BEFORE INSERT ON reservation_tombstones
WHEN EXISTS (SELECT 1 FROM reservation_tombstones WHERE reservation_id = NEW.reservation_id)
BEGIN
    SELECT RAISE(ABORT, 'tombstones are immutable');
END;

CREATE TRIGGER reservation_tombstones_delete_guard BEFORE DELETE ON reservation_tombstones
WHEN OLD.created_at + ((SELECT max_grant_days + dedupe_retention_days FROM policy WHERE id = 1)
                       * 86400000000)
     > CAST(unixepoch('subsec') * 1000000 AS INTEGER)
BEGIN
    SELECT RAISE(ABORT, 'tombstone retention not reached');
END;

------------------------------------------------------------------------------
-- Dedupe and seq bookkeeping
------------------------------------------------------------------------------
-- One row per authenticated event: the first result stands forever (until
-- pruned after retention).
CREATE TABLE dedupe (
    site_id     TEXT NOT NULL,
    event_id    TEXT NOT NULL CHECK (length(event_id) = 36 AND event_id = lower(event_id)),
    body_sha256 BLOB NOT NULL CHECK (typeof(body_sha256) = 'blob' AND length(body_sha256) = 32),
    seq         INTEGER CHECK (seq IS NULL OR seq BETWEEN 1 AND 9007199254740991),
    outcome     TEXT NOT NULL CHECK (outcome IN ('applied', 'noop', 'rejected')),
    reason      TEXT,
    -- The first result's body (JSON), replayed with "duplicate": true.
    result      TEXT NOT NULL,
    received_at INTEGER NOT NULL,
    CHECK ((outcome = 'rejected') = (reason IS NOT NULL)),
    PRIMARY KEY (site_id, event_id)
) WITHOUT ROWID;
CREATE INDEX dedupe_by_received ON dedupe (received_at);

CREATE TRIGGER dedupe_immutable BEFORE UPDATE ON dedupe
BEGIN
    SELECT RAISE(ABORT, 'dedupe rows are immutable');
END;

CREATE TRIGGER dedupe_no_overwrite BEFORE INSERT ON dedupe
WHEN EXISTS (SELECT 1 FROM dedupe WHERE site_id = NEW.site_id AND event_id = NEW.event_id)
BEGIN
    SELECT RAISE(ABORT, 'dedupe rows are immutable');
END;

CREATE TRIGGER dedupe_delete_guard BEFORE DELETE ON dedupe
WHEN OLD.received_at + (SELECT dedupe_retention_days FROM policy WHERE id = 1) * 86400000000
     > CAST(unixepoch('subsec') * 1000000 AS INTEGER)
BEGIN
    SELECT RAISE(ABORT, 'dedupe retention not reached');
END;

-- The watermark W: every seq up to W has been seen. One row; only rises.
CREATE TABLE seq_state (
    id             INTEGER PRIMARY KEY CHECK (id = 1),
    watermark      INTEGER NOT NULL CHECK (watermark BETWEEN 0 AND 9007199254740991),
    -- Last time an event or a fresh checkpoint arrived (for cloud_stale).
    last_sign_of_life INTEGER,
    -- The highest head_seq a checkpoint has shown.
    head_seq       INTEGER NOT NULL DEFAULT 0 CHECK (head_seq >= 0)
);
INSERT INTO seq_state (id, watermark) VALUES (1, 0);

CREATE TRIGGER seq_state_watermark_only_rises BEFORE UPDATE OF watermark ON seq_state
WHEN NEW.watermark < OLD.watermark
BEGIN
    SELECT RAISE(ABORT, 'watermark only rises');
END;

CREATE TRIGGER seq_state_single_row BEFORE DELETE ON seq_state
BEGIN
    SELECT RAISE(ABORT, 'seq_state is one row');
END;

CREATE TRIGGER seq_state_no_overwrite BEFORE INSERT ON seq_state
WHEN EXISTS (SELECT 1 FROM seq_state)
BEGIN
    SELECT RAISE(ABORT, 'seq_state is one row');
END;

-- Seqs seen above the watermark (the holes between them are the gaps).
CREATE TABLE seq_seen (
    seq INTEGER PRIMARY KEY CHECK (seq BETWEEN 1 AND 9007199254740991)
);

CREATE TRIGGER seq_seen_above_watermark BEFORE INSERT ON seq_seen
WHEN NEW.seq <= (SELECT watermark FROM seq_state WHERE id = 1)
BEGIN
    SELECT RAISE(ABORT, 'seq at or below the watermark');
END;

------------------------------------------------------------------------------
-- Time floor: the effective clock never goes back across restarts.
------------------------------------------------------------------------------
CREATE TABLE time_floor (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    floor INTEGER NOT NULL
);
INSERT INTO time_floor (id, floor) VALUES (1, 0);

CREATE TRIGGER time_floor_only_rises BEFORE UPDATE ON time_floor
WHEN NEW.floor < OLD.floor
BEGIN
    SELECT RAISE(ABORT, 'time floor only rises');
END;

CREATE TRIGGER time_floor_single_row BEFORE DELETE ON time_floor
BEGIN
    SELECT RAISE(ABORT, 'time_floor is one row');
END;

CREATE TRIGGER time_floor_no_overwrite BEFORE INSERT ON time_floor
WHEN EXISTS (SELECT 1 FROM time_floor)
BEGIN
    SELECT RAISE(ABORT, 'time_floor is one row');
END;

------------------------------------------------------------------------------
-- Audit log
------------------------------------------------------------------------------
CREATE TABLE audit (
    seqno       INTEGER PRIMARY KEY AUTOINCREMENT,
    audit_id    TEXT NOT NULL UNIQUE CHECK (length(audit_id) = 36),
    at          INTEGER NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN (
                    'door.granted', 'door.unlocked', 'door.unlock_unconfirmed',
                    'door.denied', 'door.locked_out', 'door.forced', 'door.held_open',
                    'board.tamper', 'key.activated', 'key.revoked', 'key.expired')),
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
    CHECK (kind <> 'door.denied' OR reason IN (
        'unknown_pin', 'outside_window', 'bad_format', 'unknown_door',
        'pin_ambiguous', 'storage_failure'))
);
CREATE INDEX audit_by_door_kind_at ON audit (door, kind, at);
CREATE INDEX audit_by_holder_ref ON audit (holder_ref) WHERE holder_ref IS NOT NULL;

-- Audit rows are never rewritten: only holder_name erased, and acked_at set once.
CREATE TRIGGER audit_immutable BEFORE UPDATE ON audit
WHEN NOT (NEW.seqno IS OLD.seqno AND NEW.audit_id IS OLD.audit_id AND NEW.at IS OLD.at
          AND NEW.kind IS OLD.kind AND NEW.door IS OLD.door AND NEW.key_id IS OLD.key_id
          AND NEW.check_in_id IS OLD.check_in_id AND NEW.holder_ref IS OLD.holder_ref
          AND NEW.reason IS OLD.reason AND NEW.event_id IS OLD.event_id
          AND (NEW.holder_name IS OLD.holder_name OR NEW.holder_name IS NULL)
          AND (NEW.acked_at IS OLD.acked_at OR (OLD.acked_at IS NULL AND NEW.acked_at IS NOT NULL)))
BEGIN
    SELECT RAISE(ABORT, 'audit rows are immutable');
END;

-- ...and deleted only once acknowledged and older than the retention.
CREATE TRIGGER audit_delete_guard BEFORE DELETE ON audit
WHEN OLD.acked_at IS NULL
  OR OLD.at + (SELECT audit_retention_days FROM policy WHERE id = 1) * 86400000000
     > CAST(unixepoch('subsec') * 1000000 AS INTEGER)
BEGIN
    SELECT RAISE(ABORT, 'audit retention not reached');
END;

CREATE TRIGGER audit_no_overwrite BEFORE INSERT ON audit
WHEN EXISTS (SELECT 1 FROM audit WHERE audit_id = NEW.audit_id OR seqno = NEW.seqno)
BEGIN
    SELECT RAISE(ABORT, 'audit rows are immutable');
END;

------------------------------------------------------------------------------
-- Lockout episodes per door (serial.md 'Lockout'); the denials themselves are
-- the door.denied audit rows, so a power cut resets nothing.
------------------------------------------------------------------------------
CREATE TABLE lockouts (
    door       TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    until      INTEGER NOT NULL CHECK (until > started_at),
    -- 0 for the first lockout in 24 h, +1 for each further one (duration doubles).
    level      INTEGER NOT NULL CHECK (level >= 0),
    PRIMARY KEY (door, started_at)
) WITHOUT ROWID;

CREATE TRIGGER lockouts_immutable BEFORE UPDATE ON lockouts
BEGIN
    SELECT RAISE(ABORT, 'lockouts are immutable');
END;

CREATE TRIGGER lockouts_no_overwrite BEFORE INSERT ON lockouts
WHEN EXISTS (SELECT 1 FROM lockouts WHERE door = NEW.door AND started_at = NEW.started_at)
BEGIN
    SELECT RAISE(ABORT, 'lockouts are immutable');
END;

------------------------------------------------------------------------------
-- Alerts: one row per (condition, subject); raised once while it holds.
------------------------------------------------------------------------------
CREATE TABLE alerts (
    condition TEXT NOT NULL CHECK (condition IN (
                  'keypad_lockout', 'board_offline', 'door_forced', 'door_held_open',
                  'tamper', 'bad_signature', 'malformed_event', 'event_id_conflict',
                  'pin_ambiguous', 'clock_untrusted', 'cloud_stale', 'outbox_backlog',
                  'storage_failure', 'signer_expiring')),
    subject   TEXT NOT NULL,
    alert_id  TEXT NOT NULL CHECK (length(alert_id) = 36),
    state     TEXT NOT NULL CHECK (state IN ('raised', 'cleared')),
    count     INTEGER NOT NULL CHECK (count >= 1),
    first_at  INTEGER NOT NULL,
    last_at   INTEGER NOT NULL CHECK (last_at >= first_at),
    -- When the cloud was last told (repeats are re-published at most once a minute).
    published_at INTEGER NOT NULL,
    PRIMARY KEY (condition, subject)
) WITHOUT ROWID;

------------------------------------------------------------------------------
-- Outbox: what the hub must tell the cloud, written in the same transaction
-- as what caused it, published in order, marked sent only after PUBACK.
------------------------------------------------------------------------------
CREATE TABLE outbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    topic      TEXT NOT NULL CHECK (topic IN ('results', 'audit', 'alerts', 'sync')),
    -- The body to sign and publish (UTF-8 JSON).
    body       BLOB NOT NULL,
    audit_id   TEXT REFERENCES audit (audit_id),
    created_at INTEGER NOT NULL,
    sent_at    INTEGER
);
CREATE INDEX outbox_unsent ON outbox (id) WHERE sent_at IS NULL;
-- The foreign key's child index: without it every audit delete (retention)
-- scans the whole outbox once per row.
CREATE INDEX outbox_by_audit_id ON outbox (audit_id);

CREATE TRIGGER outbox_body_immutable BEFORE UPDATE ON outbox
WHEN NEW.body IS NOT OLD.body OR NEW.topic IS NOT OLD.topic OR NEW.id IS NOT OLD.id
  OR NEW.audit_id IS NOT OLD.audit_id OR NEW.created_at IS NOT OLD.created_at
  OR (OLD.sent_at IS NOT NULL AND NEW.sent_at IS NOT OLD.sent_at)
BEGIN
    SELECT RAISE(ABORT, 'outbox rows are immutable once written');
END;

-- Unsent rows are never pruned.
CREATE TRIGGER outbox_keep_unsent BEFORE DELETE ON outbox
WHEN OLD.sent_at IS NULL
BEGIN
    SELECT RAISE(ABORT, 'outbox row not yet sent');
END;

CREATE TRIGGER outbox_no_overwrite BEFORE INSERT ON outbox
WHEN EXISTS (SELECT 1 FROM outbox WHERE id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'outbox rows are immutable once written');
END;
