-- lockhub schema: the broker link's last error, for `lockhub status`
-- (mqtt.md 'Broker access': a broker the hub cannot reach or trust is
-- never silent; status shows the last error and since when).
--
-- Written by the sync layer when the error changes (not on every retry:
-- each write is an fsync), cleared when the hub connects. NULL: none since
-- the last connection (or before any attempt).
ALTER TABLE hub_runtime ADD COLUMN broker_error TEXT
    CHECK (broker_error IS NULL OR length(broker_error) BETWEEN 1 AND 512);
-- When this error was first seen, in a row of the same error.
ALTER TABLE hub_runtime ADD COLUMN broker_error_since INTEGER;
