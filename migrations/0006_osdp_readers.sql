-- lockhub schema: OSDP readers (osdp.md).
--
-- `osdp_readers`: each reader's identity from osdp_PDID as recorded by
-- `lockhub osdp install` (or at its first Secure Channel session, when it
-- was keyed by hand). A reader whose PDID serial differs is quarantined by
-- the daemon until it is installed again; this row is what it compares to.
--
-- `osdp_links` and `osdp_buses`: operational state for `lockhub status`
-- (another process, read-only through WAL), written by the bus tasks.
-- Times are INTEGER microseconds since the Unix epoch (UTC).
CREATE TABLE osdp_readers (
    -- The `[[reader]] name` from hub.toml.
    reader        TEXT PRIMARY KEY CHECK (length(reader) BETWEEN 1 AND 64),
    vendor        INTEGER NOT NULL CHECK (vendor BETWEEN 0 AND 16777215),
    model         INTEGER NOT NULL CHECK (model BETWEEN 0 AND 255),
    version       INTEGER NOT NULL CHECK (version BETWEEN 0 AND 255),
    serial        INTEGER NOT NULL CHECK (serial BETWEEN 0 AND 4294967295),
    firmware      INTEGER NOT NULL CHECK (firmware BETWEEN 0 AND 16777215),
    recorded_at   INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE osdp_links (
    reader        TEXT PRIMARY KEY CHECK (length(reader) BETWEEN 1 AND 64),
    bus           TEXT NOT NULL CHECK (length(bus) BETWEEN 1 AND 64),
    address       INTEGER NOT NULL CHECK (address BETWEEN 0 AND 126),
    online        INTEGER NOT NULL CHECK (online IN (0, 1)),
    -- 1 while a Secure Channel is up with it.
    secure        INTEGER NOT NULL CHECK (secure IN (0, 1)),
    -- 1 while its PDID serial differs from `osdp_readers` (reader_replaced).
    quarantined   INTEGER NOT NULL CHECK (quarantined IN (0, 1)),
    -- The serial it reported in its current session; NULL before one.
    seen_serial   INTEGER CHECK (seen_serial IS NULL OR seen_serial BETWEEN 0 AND 4294967295),
    since         INTEGER NOT NULL,
    -- A plaintext reader (insecure_plaintext) can never be secure.
    CHECK (online = 1 OR secure = 0)
) WITHOUT ROWID;

CREATE TABLE osdp_buses (
    bus           TEXT PRIMARY KEY CHECK (length(bus) BETWEEN 1 AND 64),
    -- Candidate packets rejected (length, CRC, security block) and bytes
    -- skipped as noise, since the daemon started.
    bad_packets   INTEGER NOT NULL CHECK (bad_packets >= 0),
    garbage_bytes INTEGER NOT NULL CHECK (garbage_bytes >= 0),
    updated_at    INTEGER NOT NULL
) WITHOUT ROWID;

-- The alert conditions mqtt.md lists today, OSDP's among them
-- (board_mismatch, link_insecure, reader_link_fault, reader_replaced) and
-- the others added with them (keypad_flood, broker_denied). SQLite cannot
-- alter a CHECK, so the table is rebuilt with its rows.
CREATE TABLE alerts_0006 (
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
INSERT INTO alerts_0006 (condition, subject, alert_id, state, count, first_at, last_at, published_at)
    SELECT condition, subject, alert_id, state, count, first_at, last_at, published_at FROM alerts;
DROP TABLE alerts;
ALTER TABLE alerts_0006 RENAME TO alerts;

------------------------------------------------------------------------------
-- Audit: a card read at an OSDP reader is `door.denied` with reason
-- `unsupported_credential` (osdp.md, PIN entry). SQLite cannot change a
-- CHECK in place, so the table is rebuilt; the outbox references it, so it
-- is set aside and rebuilt too (foreign keys stay on inside the migration's
-- transaction). Rows keep their seqno and id, and each AUTOINCREMENT
-- high-water mark is carried over.
------------------------------------------------------------------------------
CREATE TABLE audit_0006 AS SELECT * FROM audit;
CREATE TABLE outbox_0006 AS SELECT * FROM outbox;
CREATE TABLE seq_0006 AS SELECT name, seq FROM sqlite_sequence WHERE name IN ('audit', 'outbox');
DROP TABLE outbox;
DROP TABLE audit;

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
        'pin_ambiguous', 'storage_failure', 'unsupported_credential'))
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
INSERT INTO audit SELECT * FROM audit_0006 ORDER BY seqno;

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
INSERT INTO outbox SELECT * FROM outbox_0006 ORDER BY id;

UPDATE sqlite_sequence
   SET seq = max(seq, (SELECT s.seq FROM seq_0006 s WHERE s.name = sqlite_sequence.name))
 WHERE name IN (SELECT name FROM seq_0006);
INSERT INTO sqlite_sequence (name, seq)
SELECT name, seq FROM seq_0006 WHERE name NOT IN (SELECT name FROM sqlite_sequence);
DROP TABLE seq_0006;
DROP TABLE outbox_0006;
DROP TABLE audit_0006;
