-- lockhub schema: how many bad frames each serial link has dropped
-- (serial.md: a bad frame is "dropped and counted"), so that `lockhub status`
-- shows a noisy wire the way `osdp_buses` shows a noisy OSDP bus.
--
-- Why a table of its own and not a column of `links`: the port task writes
-- it whether or not the link has a state row yet, and a `lockhub status`
-- older than the daemon's schema (or a database not yet migrated) can tell
-- by the table's presence whether the counts exist.
CREATE TABLE link_counters (
    -- The `[[serial]] name` from hub.toml.
    serial     TEXT PRIMARY KEY CHECK (length(serial) BETWEEN 1 AND 64),
    -- Frames dropped since the daemon started: too long or too short,
    -- broken COBS, a bad CRC, not a message, or bytes after the message.
    bad_frames INTEGER NOT NULL CHECK (bad_frames >= 0),
    updated_at INTEGER NOT NULL
) WITHOUT ROWID;
