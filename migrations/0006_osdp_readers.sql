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


------------------------------------------------------------------------------
-- Audit: a card read at an OSDP reader is `door.denied` with reason
-- `unsupported_credential` (osdp.md, PIN entry). SQLite cannot change a
-- CHECK in place, so the table is rebuilt as 0003 did (foreign keys are off
-- while migrations run and checked before the commit; see migrate.rs),
-- with 0003's `condition` and 0005's `count` and their rules, and every
-- index and trigger recreated as 0005 left them.
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
    -- `door.flood` only: the entries past the flood limit this row counts.
    count       INTEGER CHECK (count IS NULL OR count >= 1),
    CHECK (kind <> 'door.denied' OR reason IN (
        'unknown_pin', 'outside_window', 'bad_format', 'unknown_door',
        'pin_ambiguous', 'storage_failure', 'unsupported_credential')),
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
CREATE INDEX audit_by_door_kind_at ON audit (door, kind, at);
CREATE INDEX audit_by_holder_ref ON audit (holder_ref) WHERE holder_ref IS NOT NULL;

-- Audit rows are never rewritten: only holder_name erased, and acked_at set once.
CREATE TRIGGER audit_immutable BEFORE UPDATE ON audit
WHEN NOT (NEW.seqno IS OLD.seqno AND NEW.audit_id IS OLD.audit_id AND NEW.at IS OLD.at
          AND NEW.kind IS OLD.kind AND NEW.door IS OLD.door AND NEW.key_id IS OLD.key_id
          AND NEW.check_in_id IS OLD.check_in_id AND NEW.holder_ref IS OLD.holder_ref
          AND NEW.reason IS OLD.reason AND NEW.event_id IS OLD.event_id
          AND NEW.condition IS OLD.condition AND NEW.count IS OLD.count
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
