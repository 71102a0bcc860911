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
