-- lockhub schema: the daemon's own run state, for `lockhub status` and the
-- health in the retained status message (mqtt.md 'Status').
--
-- Written by the daemon (at start, and by the sync layer when the broker
-- link changes), read by `status` from another process. Operational state,
-- not an invariant: the one row is replaced freely. Times are INTEGER
-- microseconds since the Unix epoch (UTC), like everywhere.
CREATE TABLE hub_runtime (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    -- When the running (or last) daemon started, and its version.
    started_at   INTEGER NOT NULL,
    version      TEXT NOT NULL CHECK (length(version) BETWEEN 1 AND 64),
    -- connecting: started, no CONNACK yet;
    -- up:         connected and subscribed (or subscribing);
    -- down:       the connection is lost, the hub retries with backoff;
    -- denied:     the broker refused the connection or the subscription
    --             (alert broker_denied).
    broker       TEXT NOT NULL CHECK (broker IN ('connecting', 'up', 'down', 'denied')),
    -- When `broker` last changed.
    broker_since INTEGER NOT NULL
);

-- The alert `broker_denied` (mqtt.md 'Broker access'). SQLite cannot alter
-- a CHECK, so the table is rebuilt with the same columns and rows. The list
-- is every condition mqtt.md names, so that this step and the other steps
-- that add conditions of that list agree whichever of them runs last.
CREATE TABLE alerts_v7 (
    condition TEXT NOT NULL CHECK (condition IN (
                  'keypad_lockout', 'board_offline', 'door_forced', 'door_held_open',
                  'tamper', 'bad_signature', 'malformed_event', 'event_id_conflict',
                  'pin_ambiguous', 'clock_untrusted', 'cloud_stale', 'outbox_backlog',
                  'storage_failure', 'signer_expiring', 'keypad_flood', 'board_mismatch',
                  'link_insecure', 'reader_link_fault', 'reader_replaced',
                  'broker_denied')),
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
INSERT INTO alerts_v7 SELECT condition, subject, alert_id, state, count, first_at, last_at,
    published_at FROM alerts;
DROP TABLE alerts;
ALTER TABLE alerts_v7 RENAME TO alerts;
