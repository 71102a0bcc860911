-- lockhub schema: the dedupe row keeps the first result's JSON only where
-- its own columns cannot rebuild it (issue 14, write amplification).
--
-- Why: every authenticated event inserts one dedupe row at a random place
-- (v4 event ids), and the row carried the whole result body (~200 bytes of
-- a ~350-byte row: ~11 rows a page), which the result's outbox row holds
-- too. In the full-mirror ingest that was the largest share of the WAL
-- (2.2 frames per event). The columns already hold the event id, seq,
-- outcome, reason and `received_at` (the result's `at`); the JSON is kept
-- (NOT NULL as before) for a result those do not cover: a batch's items, a
-- clamp, a failing item's index. NULL means "rebuild it from the columns"
-- (store/apply.rs, `load_dedupe`).
--
-- SQLite cannot drop NOT NULL in place: the table is rebuilt; its triggers
-- and index come back from their original SQL (store/migrate.rs,
-- `Dependents`).
CREATE TABLE dedupe_new (
    site_id     TEXT NOT NULL,
    event_id    TEXT NOT NULL CHECK (length(event_id) = 36 AND event_id = lower(event_id)),
    body_sha256 BLOB NOT NULL CHECK (typeof(body_sha256) = 'blob' AND length(body_sha256) = 32),
    seq         INTEGER CHECK (seq IS NULL OR seq BETWEEN 1 AND 9007199254740991),
    outcome     TEXT NOT NULL CHECK (outcome IN ('applied', 'noop', 'rejected')),
    reason      TEXT,
    -- The first result's body (JSON), replayed with "duplicate": true;
    -- NULL when the columns of this row say all it would.
    result      TEXT,
    received_at INTEGER NOT NULL,
    CHECK ((outcome = 'rejected') = (reason IS NOT NULL)),
    PRIMARY KEY (site_id, event_id)
) WITHOUT ROWID;
INSERT INTO dedupe_new (site_id, event_id, body_sha256, seq, outcome, reason, result, received_at)
    SELECT site_id, event_id, body_sha256, seq, outcome, reason, result, received_at FROM dedupe;
DROP TABLE dedupe;
ALTER TABLE dedupe_new RENAME TO dedupe;
