-- lockhub schema: each door's last reported sensor state; `door.flood` audit
-- rows with their count; the alert conditions of today's mqtt.md.
--
-- Times are INTEGER microseconds since the Unix epoch (UTC), like everywhere.

------------------------------------------------------------------------------
-- Each door's last reported sensor state (mqtt.md 'Alerts': `door_forced`
-- and `door_held_open` end when the door is reported closed, also after a
-- restart or a port reopen). Written by the door driver in the same
-- transaction as the audit row or alert the change causes; read once when a
-- port starts. Keyed by door name, so any driver (serial board, OSDP
-- reader) keeps its doors here. Operational state: rows are replaced freely.
------------------------------------------------------------------------------
CREATE TABLE door_state (
    door       TEXT PRIMARY KEY CHECK (length(door) BETWEEN 1 AND 64),
    open       INTEGER NOT NULL CHECK (open IN (0, 1)),
    -- When the current opening began; NULL while closed.
    opened_at  INTEGER,
    -- Alerts this opening raised and that closing it must clear.
    forced     INTEGER NOT NULL CHECK (forced IN (0, 1)),
    held_open  INTEGER NOT NULL CHECK (held_open IN (0, 1)),
    updated_at INTEGER NOT NULL,
    CHECK ((open = 1) = (opened_at IS NOT NULL)),
    CHECK (open = 1 OR (forced = 0 AND held_open = 0))
) WITHOUT ROWID;

------------------------------------------------------------------------------
-- Audit: new kinds `door.flood` (with its `count`) and `alert.cleared`.
--
-- SQLite cannot change a CHECK in place, so the table is rebuilt. The outbox
-- references audit (audit_id); it is set aside first and rebuilt after, so
-- dropping audit never meets a child row (foreign keys are on here and
-- cannot be turned off inside the migration's transaction). Rows keep their
-- seqno and id; each table's AUTOINCREMENT high-water mark is carried over,
-- so no id is ever handed out twice. The copies back are by position
-- (`SELECT *`) on purpose: had an earlier step added a column this file does
-- not know, the column counts differ and the migration fails, rather than
-- dropping that column's data.
------------------------------------------------------------------------------
CREATE TABLE audit_0005 AS SELECT * FROM audit;
CREATE TABLE outbox_0005 AS SELECT * FROM outbox;
CREATE TABLE seq_0005 AS SELECT name, seq FROM sqlite_sequence WHERE name IN ('audit', 'outbox');
DROP TABLE outbox;
DROP TABLE audit;

CREATE TABLE audit (
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
    -- `door.flood` only: the entries past the flood limit this row counts.
    count       INTEGER CHECK (count IS NULL OR count >= 1),
    CHECK (kind <> 'door.denied' OR reason IN (
        'unknown_pin', 'outside_window', 'bad_format', 'unknown_door',
        'pin_ambiguous', 'storage_failure')),
    CHECK ((kind = 'door.flood') = (count IS NOT NULL)),
    CHECK (kind <> 'door.flood' OR door IS NOT NULL)
);
INSERT INTO audit SELECT *, NULL FROM audit_0005 ORDER BY seqno;
CREATE INDEX audit_by_door_kind_at ON audit (door, kind, at);
CREATE INDEX audit_by_holder_ref ON audit (holder_ref) WHERE holder_ref IS NOT NULL;

-- Audit rows are never rewritten: only holder_name erased, and acked_at set once.
CREATE TRIGGER audit_immutable BEFORE UPDATE ON audit
WHEN NOT (NEW.seqno IS OLD.seqno AND NEW.audit_id IS OLD.audit_id AND NEW.at IS OLD.at
          AND NEW.kind IS OLD.kind AND NEW.door IS OLD.door AND NEW.key_id IS OLD.key_id
          AND NEW.check_in_id IS OLD.check_in_id AND NEW.holder_ref IS OLD.holder_ref
          AND NEW.reason IS OLD.reason AND NEW.event_id IS OLD.event_id
          AND NEW.count IS OLD.count
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

CREATE TABLE outbox (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    topic      TEXT NOT NULL CHECK (topic IN ('results', 'audit', 'alerts', 'sync')),
    -- The body to sign and publish (UTF-8 JSON).
    body       BLOB NOT NULL,
    audit_id   TEXT REFERENCES audit (audit_id),
    created_at INTEGER NOT NULL,
    sent_at    INTEGER
);
INSERT INTO outbox SELECT * FROM outbox_0005 ORDER BY id;
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

-- The high-water marks: the inserts above set them to the largest id kept,
-- which is lower than the old mark if the newest rows were pruned.
UPDATE sqlite_sequence
   SET seq = max(seq, (SELECT s.seq FROM seq_0005 s WHERE s.name = sqlite_sequence.name))
 WHERE name IN (SELECT name FROM seq_0005);
INSERT INTO sqlite_sequence (name, seq)
SELECT name, seq FROM seq_0005 WHERE name NOT IN (SELECT name FROM sqlite_sequence);
DROP TABLE seq_0005;
DROP TABLE outbox_0005;
DROP TABLE audit_0005;

------------------------------------------------------------------------------
-- Alerts: every condition of today's mqtt.md 'Alerts' (new: keypad_flood,
-- board_mismatch, link_insecure, reader_link_fault, reader_replaced,
-- broker_denied). Rebuilt for the same reason as audit; nothing references it.
------------------------------------------------------------------------------
CREATE TABLE alerts_0005 AS SELECT * FROM alerts;
DROP TABLE alerts;
CREATE TABLE alerts (
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
INSERT INTO alerts SELECT * FROM alerts_0005;
DROP TABLE alerts_0005;
