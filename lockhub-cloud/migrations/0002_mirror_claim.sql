-- The mirror claim (docs/protocol/mqtt.md 'Mirror proof'): the cloud's live
-- set follows the events' results, not only what it signed, and a claim is
-- sent only once the results for every stored seq are in.

-- The outcome of the hub's (latest) result for each stored event; NULL until
-- one is recorded. A checkpoint carries a claim only when no event of the
-- hub is without one.
ALTER TABLE events ADD COLUMN result_outcome TEXT;
CREATE INDEX events_without_result ON events (site_id, hub_id, seq)
    WHERE result_outcome IS NULL;

-- Results recorded before this step: the latest one for each event.
UPDATE events SET result_outcome = (
    SELECT json_extract(o.body, '$.outcome') FROM outputs o
    WHERE o.site_id = events.site_id AND o.hub_id = events.hub_id
      AND o.topic = 'results'
      AND json_extract(o.body, '$.event_id') = events.event_id
    ORDER BY o.id DESC LIMIT 1);

-- Which grant made each key's current terms: the event's seq, and its index
-- when that event is a batch. A result for that seq (and item) says whether
-- the hub took it (`hub_outcome`: applied, noop or rejected) and, when it
-- clamped the window, where the window ends (`hub_valid_until`). Keys from
-- before this step have NULL here and count as the cloud signed them.
ALTER TABLE keys ADD COLUMN grant_seq INTEGER;
ALTER TABLE keys ADD COLUMN grant_item INTEGER;
ALTER TABLE keys ADD COLUMN hub_outcome TEXT;
ALTER TABLE keys ADD COLUMN hub_valid_until TEXT;
CREATE INDEX keys_by_grant ON keys (site_id, hub_id, grant_seq) WHERE grant_seq IS NOT NULL;
