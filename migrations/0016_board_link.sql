-- lockhub schema: the sealed board link (serial.md, "Sealed link"; issue 29).
--
-- 1. `alerts` accepts `board_link_fault` (faults on a board's sealed link;
--    subject: the serial name). The list is every condition of mqtt.md
--    'Alerts', `mirror_diverged` included, so this step and one that adds
--    that condition on another branch agree whichever runs last. It is
--    written as a chain of equalities, as 0009 explains.
-- 2. `link_seal`: each serial link's sealing, for `lockhub status`: sealed
--    or plain, since when the current session holds, and the frames the
--    sealed link dropped by cause since the daemon started. Operational
--    state, written by the serial driver (rows may be replaced freely),
--    read by `status` from another process.
--
-- SQLite cannot change a CHECK in place, so `alerts` is rebuilt; its
-- triggers and indexes come back from their original SQL
-- (store/migrate.rs, `Dependents`).

CREATE TABLE alerts_new (
    condition TEXT NOT NULL CHECK (
                  condition = 'keypad_lockout' OR condition = 'board_offline'
                  OR condition = 'door_forced' OR condition = 'door_held_open'
                  OR condition = 'tamper' OR condition = 'bad_signature'
                  OR condition = 'malformed_event' OR condition = 'event_id_conflict'
                  OR condition = 'pin_ambiguous' OR condition = 'clock_untrusted'
                  OR condition = 'cloud_stale' OR condition = 'outbox_backlog'
                  OR condition = 'storage_failure' OR condition = 'signer_expiring'
                  OR condition = 'keypad_flood' OR condition = 'board_mismatch'
                  OR condition = 'link_insecure' OR condition = 'reader_link_fault'
                  OR condition = 'reader_replaced' OR condition = 'broker_denied'
                  OR condition = 'mirror_diverged' OR condition = 'board_link_fault'),
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
-- A trigger on `keys` writes `alerts` (pin_ambiguous): a modern RENAME
-- re-checks every trigger and finds it pointing at a table gone for a
-- moment; the legacy one renames just this table, as 0009 does for `keys`.
PRAGMA legacy_alter_table = ON;
ALTER TABLE alerts_new RENAME TO alerts;
PRAGMA legacy_alter_table = OFF;

CREATE TABLE link_seal (
    -- The `[[serial]] name` from hub.toml.
    serial        TEXT PRIMARY KEY CHECK (length(serial) BETWEEN 1 AND 64),
    -- 1: sealed (a `board_key`); 0: plain (`insecure_plaintext = true`).
    sealed        INTEGER NOT NULL CHECK (sealed IN (0, 1)),
    -- When the current sealed session was confirmed; NULL without one.
    session_since INTEGER CHECK (session_since IS NULL OR sealed = 1),
    -- Frames dropped since the daemon started, by cause (firmware-bridge's
    -- `DropCause`): a tag that fails (altered, another key, the other
    -- direction), a counter not above the last (a replay), a plain message
    -- where only sealed ones count (an injected Unlock), a handshake that
    -- fails (a board with another key), a plain Hello that was not the
    -- board's, and the rest (too short, no session, not a message).
    bad_tag       INTEGER NOT NULL DEFAULT 0 CHECK (bad_tag >= 0),
    replayed      INTEGER NOT NULL DEFAULT 0 CHECK (replayed >= 0),
    plain         INTEGER NOT NULL DEFAULT 0 CHECK (plain >= 0),
    bad_handshake INTEGER NOT NULL DEFAULT 0 CHECK (bad_handshake >= 0),
    forged_hello  INTEGER NOT NULL DEFAULT 0 CHECK (forged_hello >= 0),
    other         INTEGER NOT NULL DEFAULT 0 CHECK (other >= 0),
    updated_at    INTEGER NOT NULL
) WITHOUT ROWID;
