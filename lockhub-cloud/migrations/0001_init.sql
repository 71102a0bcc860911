-- lockhub-cloud's state (one SQLite file, WAL, synchronous=FULL).
-- Append-only: a released step is never edited; a change is a new file.

-- The signer ring. Secrets are never in this table: each signer's seed is a
-- 0600 file in the folder beside the database (`<db>.signers/<id>.key`).
-- Exactly one signer is active (signs new events); a retired one keeps its
-- row, with the not_after the hubs' trust rings should carry.
CREATE TABLE signers (
    id          TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 64),
    public_key  TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    not_after   TEXT,
    active      INTEGER NOT NULL CHECK (active IN (0, 1))
) STRICT;
CREATE UNIQUE INDEX signers_one_active ON signers (active) WHERE active = 1;

-- One row per hub. next_seq is the durable per-hub counter: it moves only in
-- the transaction that stores the event carrying the seq it hands out.
CREATE TABLE hubs (
    site_id     TEXT NOT NULL,
    hub_id      TEXT NOT NULL CHECK (length(hub_id) BETWEEN 1 AND 64),
    public_key  TEXT,
    next_seq    INTEGER NOT NULL DEFAULT 1 CHECK (next_seq >= 1),
    created_at  TEXT NOT NULL,
    PRIMARY KEY (site_id, hub_id)
) STRICT;

-- The hub's door names (from its bundle or `hub add --door`): a grant for
-- any other door is refused before anything is signed.
CREATE TABLE hub_doors (
    site_id  TEXT NOT NULL,
    hub_id   TEXT NOT NULL,
    name     TEXT NOT NULL,
    PRIMARY KEY (site_id, hub_id, name),
    FOREIGN KEY (site_id, hub_id) REFERENCES hubs (site_id, hub_id) ON DELETE CASCADE
) STRICT;

-- The hub's PIN keys: the cloud needs each secret to compute PIN tags.
-- position orders them; the first one is the default for new grants.
CREATE TABLE pin_keys (
    site_id   TEXT NOT NULL,
    hub_id    TEXT NOT NULL,
    id        TEXT NOT NULL,
    secret    BLOB NOT NULL CHECK (length(secret) = 32),
    position  INTEGER NOT NULL,
    PRIMARY KEY (site_id, hub_id, id),
    FOREIGN KEY (site_id, hub_id) REFERENCES hubs (site_id, hub_id) ON DELETE CASCADE
) STRICT;

-- Every signed event with a seq, as signed: a sync answer re-sends these
-- exact envelopes (original ids and bodies). published_at stays NULL until
-- the broker acknowledged the publish (PUBACK).
CREATE TABLE events (
    site_id       TEXT NOT NULL,
    hub_id        TEXT NOT NULL,
    seq           INTEGER NOT NULL CHECK (seq >= 1),
    event_id      TEXT NOT NULL UNIQUE,
    type          TEXT NOT NULL,
    body          BLOB NOT NULL,
    envelope      BLOB NOT NULL,
    created_at    TEXT NOT NULL,
    published_at  TEXT,
    PRIMARY KEY (site_id, hub_id, seq),
    FOREIGN KEY (site_id, hub_id) REFERENCES hubs (site_id, hub_id)
) STRICT;
CREATE INDEX events_unpublished ON events (site_id, hub_id, seq) WHERE published_at IS NULL;

-- The cloud's view of each key it issued (no PIN, no tag: those are in the
-- signed body only). At most one active key per check-in, held by SQLite
-- itself, so two racing issuers cannot both win.
CREATE TABLE keys (
    site_id         TEXT NOT NULL,
    hub_id          TEXT NOT NULL,
    key_id          TEXT NOT NULL,
    version         INTEGER NOT NULL CHECK (version >= 1),
    state           TEXT NOT NULL CHECK (state IN ('pre_issued', 'active', 'revoked')),
    check_in_id     TEXT,
    reservation_id  TEXT,
    doors           TEXT NOT NULL,
    valid_from      TEXT NOT NULL,
    valid_until     TEXT NOT NULL,
    holder_ref      TEXT,
    seq             INTEGER NOT NULL,
    PRIMARY KEY (site_id, hub_id, key_id),
    CHECK (state <> 'active' OR check_in_id IS NOT NULL),
    FOREIGN KEY (site_id, hub_id) REFERENCES hubs (site_id, hub_id)
) STRICT;
CREATE UNIQUE INDEX keys_one_active_per_check_in
    ON keys (site_id, hub_id, check_in_id) WHERE state = 'active';
CREATE INDEX keys_by_reservation ON keys (site_id, hub_id, reservation_id)
    WHERE reservation_id IS NOT NULL;

-- Idempotency records of issue and checkin, scoped to the hub. Written in
-- the transaction that stores the event (in_progress), done once the event
-- is published. Pruned after the retention (30 days by default).
CREATE TABLE idempotency (
    site_id         TEXT NOT NULL,
    hub_id          TEXT NOT NULL,
    key             TEXT NOT NULL CHECK (length(key) BETWEEN 1 AND 200),
    request_sha256  BLOB NOT NULL CHECK (length(request_sha256) = 32),
    state           TEXT NOT NULL CHECK (state IN ('in_progress', 'done')),
    seq             INTEGER NOT NULL,
    key_id          TEXT,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (site_id, hub_id, key),
    FOREIGN KEY (site_id, hub_id, seq) REFERENCES events (site_id, hub_id, seq)
) STRICT;
CREATE INDEX idempotency_by_age ON idempotency (created_at);

-- Every verified hub output (and the retained status, which is not signed).
-- Audit rows arrive at least once: audit_id keeps one row each.
CREATE TABLE outputs (
    id           INTEGER PRIMARY KEY,
    site_id      TEXT NOT NULL,
    hub_id       TEXT NOT NULL,
    topic        TEXT NOT NULL CHECK (topic IN ('results', 'audit', 'alerts', 'sync', 'status', 'proof')),
    body         TEXT NOT NULL,
    audit_id     TEXT,
    received_at  TEXT NOT NULL
) STRICT;
CREATE UNIQUE INDEX outputs_audit_once ON outputs (site_id, hub_id, audit_id)
    WHERE audit_id IS NOT NULL;
CREATE INDEX outputs_by_hub ON outputs (site_id, hub_id, topic, id);

-- Hub messages refused (bad signature, unknown hub, not an envelope): what
-- was wrong and when, never the payload.
CREATE TABLE refused (
    id           INTEGER PRIMARY KEY,
    site_id      TEXT,
    hub_id       TEXT,
    topic        TEXT NOT NULL,
    reason       TEXT NOT NULL,
    received_at  TEXT NOT NULL
) STRICT;
