-- lockhub schema, version 3: every alert ends (mqtt.md 'Alerts').
--
-- 1. `alerts` accepts every condition of mqtt.md, including those that other
--    parts of the hub raise (keypad_flood, board_mismatch, link_insecure,
--    reader_link_fault, reader_replaced, broker_denied).
-- 2. `audit` accepts every kind of mqtt.md 'Audit' (door.flood and
--    alert.cleared among them), and an `alert.cleared` row names the
--    condition it cleared in `condition` (its subject goes in `door`).
-- 3. `pin_ambiguous` remembers the keys involved (`alert_keys`), and a
--    trigger on `keys` clears the alert, and queues its `cleared` message,
--    the moment one of them stops being live: no code path that revokes or
--    expires a key can forget it.
--
-- SQLite cannot change a CHECK in place, so both tables are rebuilt the way
-- its documentation describes (the migration runs with foreign keys off and
-- checks them before it commits; see migrate.rs).

------------------------------------------------------------------------------
CREATE TABLE alerts_new (
    condition TEXT NOT NULL CHECK (condition IN (
                  'keypad_lockout', 'board_offline', 'door_forced', 'door_held_open',
                  'tamper', 'bad_signature', 'malformed_event', 'event_id_conflict',
                  'pin_ambiguous', 'clock_untrusted', 'cloud_stale', 'outbox_backlog',
                  'storage_failure', 'signer_expiring', 'keypad_flood', 'board_mismatch',
                  'link_insecure', 'reader_link_fault', 'reader_replaced', 'broker_denied')),
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
INSERT INTO alerts_new SELECT condition, subject, alert_id, state, count, first_at, last_at, published_at
  FROM alerts;
DROP TABLE alerts;
ALTER TABLE alerts_new RENAME TO alerts;

------------------------------------------------------------------------------
CREATE TABLE audit_new (
    seqno       INTEGER PRIMARY KEY AUTOINCREMENT,
    audit_id    TEXT NOT NULL UNIQUE CHECK (length(audit_id) = 36),
    at          INTEGER NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN (
                    'door.granted', 'door.unlocked', 'door.unlock_unconfirmed',
                    'door.denied', 'door.locked_out', 'door.forced', 'door.held_open',
                    'board.tamper', 'door.flood', 'alert.cleared',
                    'key.activated', 'key.revoked', 'key.expired')),
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
    CHECK (kind <> 'door.denied' OR reason IN (
        'unknown_pin', 'outside_window', 'bad_format', 'unknown_door',
        'pin_ambiguous', 'storage_failure')),
    CHECK ((kind = 'alert.cleared') = (condition IS NOT NULL)),
    -- An operator's clear always says why.
    CHECK (kind <> 'alert.cleared' OR (reason IS NOT NULL AND door IS NOT NULL))
);
INSERT INTO audit_new (seqno, audit_id, at, kind, door, key_id, check_in_id, holder_ref,
                       holder_name, reason, event_id, acked_at)
  SELECT seqno, audit_id, at, kind, door, key_id, check_in_id, holder_ref,
         holder_name, reason, event_id, acked_at
    FROM audit;
-- AUTOINCREMENT never reuses a seqno, also one whose row was pruned.
INSERT INTO sqlite_sequence (name, seq)
  SELECT 'audit_new', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'audit_new');
UPDATE sqlite_sequence
   SET seq = max(seq, coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'audit'), 0))
 WHERE name = 'audit_new';
DROP TABLE audit;
ALTER TABLE audit_new RENAME TO audit;
CREATE INDEX audit_by_door_kind_at ON audit (door, kind, at);
CREATE INDEX audit_by_holder_ref ON audit (holder_ref) WHERE holder_ref IS NOT NULL;

-- Audit rows are never rewritten: only holder_name erased, and acked_at set once.
CREATE TRIGGER audit_immutable BEFORE UPDATE ON audit
WHEN NOT (NEW.seqno IS OLD.seqno AND NEW.audit_id IS OLD.audit_id AND NEW.at IS OLD.at
          AND NEW.kind IS OLD.kind AND NEW.door IS OLD.door AND NEW.key_id IS OLD.key_id
          AND NEW.check_in_id IS OLD.check_in_id AND NEW.holder_ref IS OLD.holder_ref
          AND NEW.reason IS OLD.reason AND NEW.event_id IS OLD.event_id
          AND NEW.condition IS OLD.condition
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
-- The keys a raised pin_ambiguous alert is about (the live keys that matched
-- the typed PIN at its door). Gone with the alert's end.
CREATE TABLE alert_keys (
    condition TEXT NOT NULL CHECK (condition = 'pin_ambiguous'),
    subject   TEXT NOT NULL,
    key_id    TEXT NOT NULL,
    PRIMARY KEY (condition, subject, key_id),
    FOREIGN KEY (condition, subject) REFERENCES alerts (condition, subject) ON DELETE CASCADE
) WITHOUT ROWID;
CREATE INDEX alert_keys_by_key ON alert_keys (key_id);

-- One of the keys stopped being live: the ambiguity is gone. The cleared
-- message is built here, in the shape of store::alerts (AlertBody), with
-- the key change's time (the hub's effective time) as its last_at.
CREATE TRIGGER keys_end_pin_ambiguous AFTER UPDATE OF state ON keys
WHEN OLD.state IN ('pre_issued', 'active') AND NEW.state IN ('revoked', 'expired')
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

-- An alert that ends, however it ends, forgets its keys.
CREATE TRIGGER alerts_cleared_forget_keys AFTER UPDATE OF state ON alerts
WHEN NEW.state = 'cleared'
BEGIN
    DELETE FROM alert_keys WHERE condition = NEW.condition AND subject = NEW.subject;
END;
