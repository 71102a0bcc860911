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

-- The alert `broker_denied` needs no step here: 0003_alerts_end rebuilds
-- `alerts` with every condition of mqtt.md, broker_denied included, and
-- puts a trigger and a foreign key on it that another rebuild would drop.
