-- lockhub schema: each door's last reported sensor state, and the `count`
-- of a `door.flood` audit row (0003 already admits the kind and every
-- alert condition of today's mqtt.md).
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
-- Audit: a `door.flood` row counts the keypad entries past the flood limit
-- (serial.md 'Door decisions'); no other kind has a count. A column added
-- by ALTER TABLE may carry CHECKs, and SQLite checks them against the rows
-- already there, so no rebuild is needed.
------------------------------------------------------------------------------
ALTER TABLE audit ADD COLUMN count INTEGER
    CHECK (count IS NULL OR count >= 1)
    CHECK ((kind = 'door.flood') = (count IS NOT NULL))
    CHECK (kind <> 'door.flood' OR door IS NOT NULL);

-- Audit rows are never rewritten: only holder_name erased, and acked_at set
-- once. The guard now covers the new column too.
DROP TRIGGER audit_immutable;
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
