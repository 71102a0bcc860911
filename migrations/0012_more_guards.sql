-- lockhub schema: rules the code kept and the schema did not, now the
-- schema's too. Triggers only: no table is rebuilt, so the step is quick on
-- any mirror.

-- Erasure memory (mqtt.md 'guest.erased'). Each erasure of a holder renews
-- it: the hub must remember an erasure as long as a grant from before the
-- latest one can be re-sent. So a row may be renewed (its time only rises,
-- the holder stays), never rewritten otherwise, and never replaced (an
-- `INSERT OR REPLACE` would delete it past its retention guard).
DROP TRIGGER erased_holders_immutable;

CREATE TRIGGER erased_holders_only_renewed BEFORE UPDATE ON erased_holders
WHEN NEW.holder_ref IS NOT OLD.holder_ref OR NEW.created_at < OLD.created_at
BEGIN
    SELECT RAISE(ABORT, 'erased holders are only renewed');
END;

CREATE TRIGGER erased_holders_no_overwrite BEFORE INSERT ON erased_holders
WHEN EXISTS (SELECT 1 FROM erased_holders WHERE holder_ref = NEW.holder_ref)
BEGIN
    SELECT RAISE(ABORT, 'erased holders are only renewed');
END;

-- A key that ends (revoked, expired) keeps the grant it ended as: only its
-- state, the revoke reason, the event and the time change (and the name
-- may go). A key whose window or PIN moved as it ended would no longer be
-- what was revoked, and an earlier `valid_until` would shorten how long
-- its row is kept.
CREATE TRIGGER keys_end_as_granted BEFORE UPDATE ON keys
WHEN (OLD.state = 'pre_issued' OR OLD.state = 'active')
 AND (NEW.state = 'revoked' OR NEW.state = 'expired')
 AND (NEW.key_id IS NOT OLD.key_id OR NEW.version IS NOT OLD.version
      OR NEW.check_in_id IS NOT OLD.check_in_id OR NEW.reservation_id IS NOT OLD.reservation_id
      OR NEW.valid_from IS NOT OLD.valid_from OR NEW.valid_until IS NOT OLD.valid_until
      OR NEW.pin_tag IS NOT OLD.pin_tag OR NEW.pin_key_id IS NOT OLD.pin_key_id
      OR NEW.holder_ref IS NOT OLD.holder_ref
      OR (NEW.holder_name IS NOT NULL AND NEW.holder_name IS NOT OLD.holder_name))
BEGIN
    SELECT RAISE(ABORT, 'a key ends as it was granted');
END;

-- A check-in revokes every pre-issued key of its reservation before the
-- reservation is tombstoned (mqtt.md 'checkin.started'): a tombstone beside
-- a live pre-issued key would leave that PIN opening the door.
CREATE TRIGGER reservation_tombstones_after_pre_issued_keys BEFORE INSERT ON reservation_tombstones
WHEN EXISTS (SELECT 1 FROM keys
             WHERE reservation_id = NEW.reservation_id AND state = 'pre_issued')
BEGIN
    SELECT RAISE(ABORT, 'a pre-issued key of the reservation is still live');
END;

-- A denial always says why (mqtt.md 'Audit'): a reason-less one would not
-- count toward a lockout. An audit row is acknowledged only once the broker
-- has it, so none is written acknowledged.
CREATE TRIGGER audit_denial_says_why BEFORE INSERT ON audit
WHEN NEW.kind = 'door.denied' AND NEW.reason IS NULL
BEGIN
    SELECT RAISE(ABORT, 'a denial says why');
END;

CREATE TRIGGER audit_acked_only_after_it_was_sent BEFORE INSERT ON audit
WHEN NEW.acked_at IS NOT NULL
BEGIN
    SELECT RAISE(ABORT, 'an audit row is acknowledged only after it was sent');
END;

-- One alert per (condition, subject) while it holds, and the cloud hears
-- it end (mqtt.md 'Alerts'): while raised, an alert keeps its id and first
-- time, its count only grows, and it is not deleted or replaced.
CREATE TRIGGER alerts_raised_keep_their_identity BEFORE UPDATE ON alerts
WHEN OLD.state = 'raised'
 AND (NEW.condition IS NOT OLD.condition OR NEW.subject IS NOT OLD.subject
      OR NEW.alert_id IS NOT OLD.alert_id OR NEW.first_at IS NOT OLD.first_at
      OR NEW.count < OLD.count)
BEGIN
    SELECT RAISE(ABORT, 'a raised alert keeps its identity');
END;

CREATE TRIGGER alerts_raised_are_not_deleted BEFORE DELETE ON alerts
WHEN OLD.state = 'raised'
BEGIN
    SELECT RAISE(ABORT, 'a raised alert ends by being cleared');
END;

CREATE TRIGGER alerts_no_overwrite BEFORE INSERT ON alerts
WHEN EXISTS (SELECT 1 FROM alerts WHERE condition = NEW.condition AND subject = NEW.subject)
BEGIN
    SELECT RAISE(ABORT, 'an alert row is updated, not overwritten');
END;

-- A lockout that is still running survives (serial.md: across a restart or
-- a power cut); only ended ones are pruned.
CREATE TRIGGER lockouts_running_are_kept BEFORE DELETE ON lockouts
WHEN OLD.until > CAST(unixepoch('subsec') * 1000000 AS INTEGER)
BEGIN
    SELECT RAISE(ABORT, 'a running lockout is kept');
END;
