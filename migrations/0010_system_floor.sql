-- lockhub schema: the hub keeps its own time floor beside the effective one
-- (mqtt.md 'Time'; src/clock.rs, 'Two floors').
--
-- Why: `floor` rises with every verified `issued_at` and door decision as
-- well as the hub's own readings, so a cloud whose clock runs half a
-- minute ahead left it half a minute past the system clock; after a restart
-- the hub read that as its clock gone back, stayed `clock_untrusted`, and
-- held the expiry sweep for as long as it ran. Trust is now judged against
-- `system_floor`, which only readings of the hub's system clock raise;
-- `floor` still holds every time the hub has used.
--
-- A migrated hub cannot tell which part of its old floor was its own. It
-- starts an hour below it: a trusted cloud runs at most an hour ahead, so a
-- correct clock is never behind that, while a clock reset to 1970 or to a
-- day-old time is. What this misses is the first start after the upgrade
-- with a clock stale by less than an hour.
ALTER TABLE time_floor ADD COLUMN system_floor INTEGER NOT NULL DEFAULT 0
    CHECK (system_floor >= 0);

UPDATE time_floor SET system_floor = max(floor - 3600000000, 0) WHERE id = 1;

CREATE TRIGGER time_floor_system_only_rises BEFORE UPDATE ON time_floor
WHEN NEW.system_floor < OLD.system_floor
BEGIN
    SELECT RAISE(ABORT, 'time floor only rises');
END;
