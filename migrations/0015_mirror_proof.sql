-- lockhub schema: the mirror proof (docs/protocol/mqtt.md 'Mirror proof').
--
-- 1. `alerts` accepts `mirror_diverged` (and `board_link_fault`, the other
--    condition of mqtt.md the list lacked), `outbox` the `proof` topic.
--    SQLite cannot change a CHECK in place, so both are rebuilt as 0003
--    and 0009 did; their triggers and indexes come back (migrate.rs).
-- 2. `mirror_granted`: the state each key's last applied grant gave
--    (`pre_issued` or `active`). A proof line carries it for keys that are
--    no longer live but still inside their window (expired, used up), and
--    `keys.state` no longer says it once the key ended. Kept by triggers, so
--    no code path that writes a key can forget it.
-- 3. `mirror_changes`: which keys changed what their proof line says (or
--    whether they have one), in order. The proof keeps each bucket's digest
--    between proofs and recomputes only the buckets of keys listed here
--    since the last one (store/mirror.rs). Triggers write it, so a row
--    changed or deleted by hand is seen too.
-- 4. `mirror_proof`: the last proof the hub published, for `lockhub status`.

------------------------------------------------------------------------------
CREATE TABLE alerts_new (
    condition TEXT NOT NULL CHECK (condition IN (
                  'keypad_lockout', 'board_offline', 'door_forced', 'door_held_open',
                  'tamper', 'bad_signature', 'malformed_event', 'event_id_conflict',
                  'pin_ambiguous', 'clock_untrusted', 'cloud_stale', 'outbox_backlog',
                  'storage_failure', 'signer_expiring', 'keypad_flood', 'board_mismatch',
                  'link_insecure', 'reader_link_fault', 'reader_replaced', 'broker_denied',
                  'mirror_diverged', 'board_link_fault')),
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
PRAGMA legacy_alter_table = ON;
ALTER TABLE alerts_new RENAME TO alerts;
PRAGMA legacy_alter_table = OFF;

------------------------------------------------------------------------------
CREATE TABLE outbox_new (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    topic      TEXT NOT NULL CHECK (topic IN ('results', 'audit', 'alerts', 'sync', 'proof')),
    -- The body to sign and publish (UTF-8 JSON).
    body       BLOB NOT NULL,
    audit_id   TEXT REFERENCES audit (audit_id),
    created_at INTEGER NOT NULL,
    sent_at    INTEGER
);
INSERT INTO outbox_new (id, topic, body, audit_id, created_at, sent_at)
  SELECT id, topic, body, audit_id, created_at, sent_at FROM outbox;
-- AUTOINCREMENT never reuses an id, also one whose row was pruned.
INSERT INTO sqlite_sequence (name, seq)
  SELECT 'outbox_new', 0 WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'outbox_new');
UPDATE sqlite_sequence
   SET seq = max(seq, coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'outbox'), 0))
 WHERE name = 'outbox_new';
DROP TABLE outbox;
PRAGMA legacy_alter_table = ON;
ALTER TABLE outbox_new RENAME TO outbox;
PRAGMA legacy_alter_table = OFF;

------------------------------------------------------------------------------
CREATE TABLE mirror_granted (
    key_id TEXT PRIMARY KEY,
    state  TEXT NOT NULL CHECK (state IN ('pre_issued', 'active'))
) WITHOUT ROWID;
-- Keys that ended before this step: their granted state is no longer
-- written anywhere. An active key always has a check-in and a pre-issued
-- grant always a reservation; a key with both ended as active unless it
-- was never checked in, which the row cannot tell: such a key may prove
-- as `active` where the cloud says `pre_issued`, and the repair (a revoke
-- of an already ended key) changes nothing at the door.
INSERT INTO mirror_granted (key_id, state)
  SELECT key_id,
         CASE WHEN state = 'pre_issued' OR state = 'active' THEN state
              WHEN check_in_id IS NOT NULL THEN 'active'
              ELSE 'pre_issued' END
    FROM keys;

CREATE TRIGGER keys_mirror_granted_on_insert AFTER INSERT ON keys
WHEN NEW.state = 'pre_issued' OR NEW.state = 'active'
BEGIN
    INSERT INTO mirror_granted (key_id, state) VALUES (NEW.key_id, NEW.state)
        ON CONFLICT (key_id) DO UPDATE SET state = excluded.state;
END;

CREATE TRIGGER keys_mirror_granted_on_update AFTER UPDATE OF state, version ON keys
WHEN (NEW.state = 'pre_issued' OR NEW.state = 'active')
BEGIN
    INSERT INTO mirror_granted (key_id, state) VALUES (NEW.key_id, NEW.state)
        ON CONFLICT (key_id) DO UPDATE SET state = excluded.state;
END;

CREATE TRIGGER keys_mirror_granted_on_delete AFTER DELETE ON keys
BEGIN
    DELETE FROM mirror_granted WHERE key_id = OLD.key_id;
END;

------------------------------------------------------------------------------
CREATE TABLE mirror_changes (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    key_id TEXT NOT NULL
);

CREATE TRIGGER keys_mirror_change_on_insert AFTER INSERT ON keys
BEGIN
    INSERT INTO mirror_changes (key_id) VALUES (NEW.key_id);
END;

-- Only what a proof line says: the version, the window's end, the granted
-- state, and whether the key is revoked. A key that expires or is used up
-- keeps its line, and a door's use of a key writes nothing here.
CREATE TRIGGER keys_mirror_change_on_update AFTER UPDATE ON keys
WHEN NEW.key_id IS NOT OLD.key_id OR NEW.version IS NOT OLD.version
  OR NEW.valid_until IS NOT OLD.valid_until
  OR (NEW.state = 'revoked') IS NOT (OLD.state = 'revoked')
  OR ((NEW.state = 'pre_issued' OR NEW.state = 'active') AND NEW.state IS NOT OLD.state)
BEGIN
    INSERT INTO mirror_changes (key_id) VALUES (OLD.key_id);
    INSERT INTO mirror_changes (key_id) SELECT NEW.key_id WHERE NEW.key_id IS NOT OLD.key_id;
END;

CREATE TRIGGER keys_mirror_change_on_delete AFTER DELETE ON keys
BEGIN
    INSERT INTO mirror_changes (key_id) VALUES (OLD.key_id);
END;

-- Bounded: a hub that never gets a claim keeps the last 65,536 changes. A
-- proof that finds rows it has not read pruned starts cold.
CREATE TRIGGER mirror_changes_bounded AFTER INSERT ON mirror_changes
WHEN NEW.seq > 65536
BEGIN
    DELETE FROM mirror_changes WHERE seq <= NEW.seq - 65536;
END;

------------------------------------------------------------------------------
CREATE TABLE mirror_proof (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    head_seq  INTEGER NOT NULL,
    -- NULL for a hub that was ahead (then `watermark` is set).
    as_of     INTEGER,
    hub_time  INTEGER,
    count     INTEGER,
    digest    TEXT,
    -- 1 match, 0 diverged, NULL ahead.
    matched   INTEGER CHECK (matched IS NULL OR matched IN (0, 1)),
    watermark INTEGER,
    at        INTEGER NOT NULL
);
