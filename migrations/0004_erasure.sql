-- lockhub schema: a guest erasure that sticks (mqtt.md 'Types: guest.erased').
--
-- An erasure can overtake the grant it erases (the grant lost, then re-sent
-- after the gap). The hub remembers every erased holder_ref as long as it
-- keeps tombstones, and the name of an erased holder is never stored again:
-- the triggers below refuse it in keys and audit, whatever the code does.
CREATE TABLE erased_holders (
    holder_ref TEXT PRIMARY KEY CHECK (length(holder_ref) BETWEEN 1 AND 64),
    event_id   TEXT NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TRIGGER erased_holders_immutable BEFORE UPDATE ON erased_holders
BEGIN
    SELECT RAISE(ABORT, 'erased holders are immutable');
END;

-- Kept like tombstones: at least max_grant_days + dedupe_retention_days, so
-- no re-sent grant from before the erasure can outlive the memory of it.
CREATE TRIGGER erased_holders_delete_guard BEFORE DELETE ON erased_holders
WHEN OLD.created_at + ((SELECT max_grant_days + dedupe_retention_days FROM policy WHERE id = 1)
                       * 86400000000)
     > CAST(unixepoch('subsec') * 1000000 AS INTEGER)
BEGIN
    SELECT RAISE(ABORT, 'erasure retention not reached');
END;

CREATE TRIGGER keys_no_name_of_erased_holder_on_insert BEFORE INSERT ON keys
WHEN NEW.holder_name IS NOT NULL
 AND EXISTS (SELECT 1 FROM erased_holders WHERE holder_ref = NEW.holder_ref)
BEGIN
    SELECT RAISE(ABORT, 'erased_holder');
END;

CREATE TRIGGER keys_no_name_of_erased_holder_on_update BEFORE UPDATE OF holder_name, holder_ref ON keys
WHEN NEW.holder_name IS NOT NULL
 AND EXISTS (SELECT 1 FROM erased_holders WHERE holder_ref = NEW.holder_ref)
BEGIN
    SELECT RAISE(ABORT, 'erased_holder');
END;

CREATE TRIGGER audit_no_name_of_erased_holder BEFORE INSERT ON audit
WHEN NEW.holder_name IS NOT NULL
 AND EXISTS (SELECT 1 FROM erased_holders WHERE holder_ref = NEW.holder_ref)
BEGIN
    SELECT RAISE(ABORT, 'erased_holder');
END;

-- The result of an erasure that changed rows waits here, not in the outbox,
-- until the WAL no longer holds a page from before it: the cloud must not
-- hear "erased" while a byte of the name remains in a file. The writer's
-- scrub (a TRUNCATE checkpoint, retried until it succeeds) moves these rows
-- to the end of the outbox; at start-up too, after a crash in between.
CREATE TABLE held_results (
    id         INTEGER PRIMARY KEY,
    event_id   TEXT NOT NULL,
    body       BLOB NOT NULL,
    created_at INTEGER NOT NULL
);
