-- lockhub schema, version 2: the state of each serial link, for `lockhub status`.
--
-- Written by the serial driver, read by `status` (another process, read-only,
-- through WAL). One row per configured serial port, keyed by its config name.
-- Times are INTEGER microseconds since the Unix epoch (UTC), like everywhere.
-- This is operational state, not an invariant: rows may be replaced freely.
CREATE TABLE links (
    -- The `[[serial]] name` from hub.toml.
    serial        TEXT PRIMARY KEY CHECK (length(serial) BETWEEN 1 AND 64),
    -- up:     the port is open and a valid frame arrived within 6 s (serial.md);
    -- down:   the port is open but no valid frame for 6 s (alert board_offline);
    -- absent: the port cannot be opened (unplugged USB board, wrong path).
    state         TEXT NOT NULL CHECK (state IN ('up', 'down', 'absent')),
    -- From the board's last Hello; NULL until one arrives.
    board_id      INTEGER CHECK (board_id IS NULL OR board_id BETWEEN 0 AND 255),
    fw_major      INTEGER CHECK (fw_major IS NULL OR fw_major BETWEEN 0 AND 255),
    fw_minor      INTEGER CHECK (fw_minor IS NULL OR fw_minor BETWEEN 0 AND 255),
    -- When `state` last changed.
    since         INTEGER NOT NULL,
    -- The last valid frame (coarse: the driver need not write on every frame).
    last_frame_at INTEGER,
    CHECK ((fw_major IS NULL) = (fw_minor IS NULL))
) WITHOUT ROWID;
