//! The door decision and the keypad lockout, as pure functions.
//!
//! Nothing here reads a clock, a file or the database: the store gathers the
//! facts (the keys the mirror holds for a typed PIN's tags at that door, the
//! door's recent denials and its last lockout, the effective time) and this
//! module answers. That keeps every rule of serial.md 'Door decisions' and
//! 'Lockout' testable as plain data, and lets the store replay the same facts
//! after a restart and reach the same answer.
//!
//! ## Order of the rules
//! 1. Unknown door: deny `unknown_door`. No lockout is consulted or counted:
//!    a door the config does not name has no keypad state to protect.
//! 2. Locked out: [`Decision::LockedOut`], even for a correct PIN; not counted.
//! 3. PIN bytes not 4..=12 ASCII digits: deny `bad_format`.
//! 4. No live key for the PIN's tags: an ended key explains it (mqtt.md 'At
//!    the door'): a `used_up` key with that tag denies `used_up`, an
//!    `expired` one `outside_window`; otherwise deny `unknown_pin`. Live keys
//!    come first, so a new guest who reuses an old guest's PIN gets in.
//! 5. Two or more live keys match: deny `pin_ambiguous` (+ alert). Checked
//!    before the windows, as mqtt.md words it ("matches two live keys"): the
//!    hub cannot tell whose PIN was typed, so it cannot attribute the entry.
//! 6. For the one live key, in this order: outside `[valid_from,
//!    valid_until)` by the effective time: deny `outside_window`; its local
//!    wall time then (in the hub's zone) outside its schedule: deny
//!    `outside_schedule`; no use left: deny `used_up`.
//! 7. Otherwise unlock (the store takes the use with the audit row).
//!
//! ## Which denials count toward a lockout
//! Only `bad_format` and `unknown_pin` (serial.md 'Lockout'): a PIN that
//! matches no key is what guessing looks like. A real guest's PIN at the
//! wrong hour, after its window or uses, or one shared by two keys is
//! denied but not counted: it must not lock the door for everyone.
//! `unknown_door` (no such keypad) and `storage_failure` (the hub's fault,
//! not the typist's) do not count either.

use crate::config::{LOCKOUT_MAX_S, PinKey, Policy};
use jiff::tz::TimeZone;
use lockhub_proto::crypto::pin_tag;
use lockhub_proto::schedule::Schedule;
use lockhub_proto::time::Timestamp;
use std::fmt;

pub mod entry;
pub(crate) mod recorder;
pub mod sensor;

/// Shortest and longest PIN the board sends (serial.md 'Keypad').
pub const PIN_DIGITS: std::ops::RangeInclusive<usize> = 4..=12;

/// How long after a lockout ends the next one still doubles (serial.md:
/// "the doubling resets after 24 h without one").
pub const LOCKOUT_RESET_S: i64 = 24 * 3600;

/// Tags of a typed PIN under every PIN key, as `(pin_key_id, tag)`; `None`
/// when the bytes are not 4..=12 ASCII digits (`bad_format`).
///
/// The bytes are taken raw, so invalid UTF-8 is simply a bad format. Every
/// configured key is tried because grants made before a PIN-key rotation
/// carry the old key's tag.
pub fn pin_tags(pin: &[u8], keys: &[PinKey]) -> Option<Vec<(String, [u8; 32])>> {
    if !PIN_DIGITS.contains(&pin.len()) || !pin.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        keys.iter()
            .map(|k| (k.id.clone(), pin_tag(&k.secret, pin)))
            .collect(),
    )
}

/// Why a door stayed shut. The strings are the audit contract (mqtt.md
/// 'Audit'): never rename one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DenyReason {
    UnknownDoor,
    BadFormat,
    UnknownPin,
    OutsideWindow,
    /// Inside the window, but not inside the key's weekly schedule.
    OutsideSchedule,
    /// Every one of the key's `max_uses` is taken.
    UsedUp,
    PinAmbiguous,
    StorageFailure,
    /// A card at an OSDP reader: the hub knows PINs only (osdp.md).
    UnsupportedCredential,
}

impl DenyReason {
    #[cfg(any(test, feature = "testing"))]
    pub const ALL: [DenyReason; 9] = [
        DenyReason::UnknownDoor,
        DenyReason::BadFormat,
        DenyReason::UnknownPin,
        DenyReason::OutsideWindow,
        DenyReason::OutsideSchedule,
        DenyReason::UsedUp,
        DenyReason::PinAmbiguous,
        DenyReason::StorageFailure,
        DenyReason::UnsupportedCredential,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::UnknownDoor => "unknown_door",
            DenyReason::BadFormat => "bad_format",
            DenyReason::UnknownPin => "unknown_pin",
            DenyReason::OutsideWindow => "outside_window",
            DenyReason::OutsideSchedule => "outside_schedule",
            DenyReason::UsedUp => "used_up",
            DenyReason::PinAmbiguous => "pin_ambiguous",
            DenyReason::StorageFailure => "storage_failure",
            DenyReason::UnsupportedCredential => "unsupported_credential",
        }
    }

    /// Whether this denial counts toward the door's lockout (module docs).
    pub fn counts_toward_lockout(self) -> bool {
        matches!(self, DenyReason::BadFormat | DenyReason::UnknownPin)
    }
}

/// A key the mirror holds for one of the typed PIN's tags at this door.
#[derive(Clone, PartialEq, Eq)]
pub struct Candidate {
    pub key_id: String,
    pub pin_key_id: String,
    /// The `keys.state` column: `pre_issued`, `active`, `revoked`,
    /// `expired`, `used_up`.
    pub state: String,
    pub valid_from: Timestamp,
    pub valid_until: Timestamp,
    pub check_in_id: Option<String>,
    pub holder_ref: Option<String>,
    /// Personal data: goes into the local audit row, never into a log.
    pub holder_name: Option<String>,
    /// The weekly hours it opens, in the hub's wall time; `None`: any hour.
    pub schedule: Option<Schedule>,
    /// `None`: no limit.
    pub max_uses: Option<u32>,
    /// Entries granted so far, across the key's versions.
    pub use_count: u32,
}

impl Candidate {
    /// `pre_issued` and `active` keys may open; `revoked`, `expired` and
    /// `used_up` never.
    pub fn is_live(&self) -> bool {
        matches!(self.state.as_str(), "pre_issued" | "active")
    }

    /// The window is half-open: `valid_until` itself is already outside.
    pub fn in_window(&self, now: Timestamp) -> bool {
        self.valid_from <= now && now < self.valid_until
    }

    /// Inside its schedule at `now`, read in `zone` (always, without one).
    pub fn in_schedule(&self, now: Timestamp, zone: &TimeZone) -> bool {
        self.schedule.as_ref().is_none_or(|s| s.contains(now, zone))
    }

    /// Whether an entry may still take a use.
    pub fn has_use_left(&self) -> bool {
        self.max_uses.is_none_or(|max| self.use_count < max)
    }

    /// Whether the use an entry takes now is the key's last.
    pub fn takes_last_use(&self) -> bool {
        self.max_uses == Some(self.use_count.saturating_add(1))
    }
}

impl fmt::Debug for Candidate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Candidate")
            .field("key_id", &self.key_id)
            .field("pin_key_id", &self.pin_key_id)
            .field("state", &self.state)
            .field("valid_from", &self.valid_from)
            .field("valid_until", &self.valid_until)
            .field("check_in_id", &self.check_in_id)
            .field("holder_ref", &self.holder_ref)
            .field(
                "holder_name",
                &self.holder_name.as_ref().map(|_| "<redacted>"),
            )
            .field("schedule", &self.schedule)
            .field("max_uses", &self.max_uses)
            .field("use_count", &self.use_count)
            .finish()
    }
}

/// One lockout episode at a door (a `lockouts` row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lockout {
    pub started_at: Timestamp,
    /// The keypad is locked while `now < until`.
    pub until: Timestamp,
    /// 0 for the first lockout after a quiet day; +1 for each further one.
    pub level: u32,
}

/// The durable facts the lockout rules need at one door.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LockoutFacts {
    /// The door's most recent lockout, if any.
    pub last: Option<Lockout>,
    /// Times of the door's counting denials. The store pre-filters to the
    /// window and to after `last.until`; [`counted_denials`] filters again,
    /// so a wider list gives the same answer.
    pub denials: Vec<Timestamp>,
}

/// When the keypad unlocks again, if it is locked at `now`.
pub fn locked_until(facts: &LockoutFacts, now: Timestamp) -> Option<Timestamp> {
    facts.last.filter(|l| now < l.until).map(|l| l.until)
}

/// The open start of the lockout window at `now`: a denial counts only if
/// it is later than this (the store's range scan and [`counted_denials`]
/// both use it).
pub fn lockout_window_start(now: Timestamp, policy: &Policy) -> Timestamp {
    now.saturating_add_secs(-i64::from(policy.lockout_window_s))
}

/// How many earlier denials count at `now`: those in the window
/// `(now - lockout_window_s, ..]` and not before the last lockout ended.
///
/// A denial exactly `lockout_window_s` old has left the window. A denial
/// timestamped after `now` (the effective time fell back by less than a
/// floor reading across a restart) still counts: a power cut must never
/// forgive attempts.
pub fn counted_denials(facts: &LockoutFacts, now: Timestamp, policy: &Policy) -> usize {
    let window_start = lockout_window_start(now, policy);
    let since = facts.last.map(|l| l.until);
    facts
        .denials
        .iter()
        .filter(|&&t| t > window_start && since.is_none_or(|s| t >= s))
        .count()
}

/// The level of a lockout starting at `now`: one more than the last, unless
/// 24 h have passed since the last one ended.
pub fn next_level(last: Option<&Lockout>, now: Timestamp) -> u32 {
    match last {
        Some(l) if now < l.until.saturating_add_secs(LOCKOUT_RESET_S) => l.level.saturating_add(1),
        _ => 0,
    }
}

/// `lockout_base_s` doubled `level` times, at most [`LOCKOUT_MAX_S`].
pub fn lockout_duration_s(level: u32, policy: &Policy) -> u32 {
    let factor = 1u64 << level.min(32);
    let s = u64::from(policy.lockout_base_s).saturating_mul(factor);
    s.min(u64::from(LOCKOUT_MAX_S)) as u32
}

/// The lockout that a counting denial at `now` starts, if it reaches the
/// threshold. Call only when the door is not locked at `now`.
pub fn lockout_after_denial(
    facts: &LockoutFacts,
    now: Timestamp,
    policy: &Policy,
) -> Option<Lockout> {
    let total = counted_denials(facts, now, policy) + 1;
    if total < policy.lockout_threshold as usize {
        return None;
    }
    let level = next_level(facts.last.as_ref(), now);
    let until = now.saturating_add_secs(i64::from(lockout_duration_s(level, policy)));
    Some(Lockout {
        started_at: now,
        until,
        level,
    })
}

/// Everything one keypad entry is decided on.
#[derive(Debug, Clone, Copy)]
pub struct DoorInput<'a> {
    /// The config names this door.
    pub door_known: bool,
    /// The PIN bytes were 4..=12 ASCII digits (see [`pin_tags`]).
    pub well_formed: bool,
    /// Keys the mirror returned for the PIN's tags at this door: the live
    /// ones, and the ended ones (`used_up`, `expired`) that explain a
    /// denial when no live key matches.
    pub candidates: &'a [Candidate],
    /// The effective time (never the raw system clock).
    pub now: Timestamp,
    /// The hub's time zone (`[hub] timezone`): schedules are read in it.
    pub zone: &'a TimeZone,
    pub lockout: &'a LockoutFacts,
    pub policy: &'a Policy,
}

/// What to do with one keypad entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Open with this key (audit `door.granted` first).
    Unlock(Candidate),
    /// Stay shut (audit `door.denied`); `lockout` is set when this denial
    /// reached the threshold and locks the keypad from now on.
    Deny {
        reason: DenyReason,
        lockout: Option<Lockout>,
    },
    /// The keypad is locked until `until` (audit `door.locked_out`).
    LockedOut { until: Timestamp },
}

impl Decision {
    /// The `Deny.reason` byte for the board, or `None` to send `Unlock`.
    ///
    /// A denial that starts a lockout already answers 2 (locked out): from
    /// that moment every entry is refused, and the person at the door should
    /// learn it now rather than on the next try.
    #[cfg(any(test, feature = "testing"))]
    pub fn wire_deny_reason(&self) -> Option<u8> {
        match self {
            Decision::Unlock(_) => None,
            Decision::Deny { lockout: None, .. } => Some(1),
            Decision::Deny {
                lockout: Some(_), ..
            }
            | Decision::LockedOut { .. } => Some(2),
        }
    }
}

/// Decides one keypad entry (module docs give the order of the rules).
pub fn decide(input: &DoorInput<'_>) -> Decision {
    if !input.door_known {
        return Decision::Deny {
            reason: DenyReason::UnknownDoor,
            lockout: None,
        };
    }
    if let Some(until) = locked_until(input.lockout, input.now) {
        return Decision::LockedOut { until };
    }
    match match_key(input) {
        Ok(key) => Decision::Unlock(key.clone()),
        Err(reason) => Decision::Deny {
            reason,
            lockout: reason
                .counts_toward_lockout()
                .then(|| lockout_after_denial(input.lockout, input.now, input.policy))
                .flatten(),
        },
    }
}

/// The one live key that opens, or why none does (rules 3 to 6).
fn match_key<'a>(input: &DoorInput<'a>) -> Result<&'a Candidate, DenyReason> {
    if !input.well_formed {
        return Err(DenyReason::BadFormat);
    }
    let mut live = input.candidates.iter().filter(|c| c.is_live());
    let Some(key) = live.next() else {
        return Err(ended_reason(input.candidates));
    };
    if live.next().is_some() {
        return Err(DenyReason::PinAmbiguous);
    }
    if !key.in_window(input.now) {
        return Err(DenyReason::OutsideWindow);
    }
    if !key.in_schedule(input.now, input.zone) {
        return Err(DenyReason::OutsideSchedule);
    }
    if !key.has_use_left() {
        return Err(DenyReason::UsedUp);
    }
    Ok(key)
}

/// Why a PIN that matches no live key is denied: a used-up key with its
/// tag says `used_up`, an expired one `outside_window`; a revoked key says
/// nothing (`unknown_pin`, as for a PIN nobody holds).
fn ended_reason(candidates: &[Candidate]) -> DenyReason {
    let has = |state: &str| candidates.iter().any(|c| c.state == state);
    if has("used_up") {
        DenyReason::UsedUp
    } else if has("expired") {
        DenyReason::OutsideWindow
    } else {
        DenyReason::UnknownPin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_secs(T0 + s)
    }

    fn policy() -> Policy {
        Policy::default()
    }

    fn key(id: &str, state: &str, from: i64, until: i64) -> Candidate {
        Candidate {
            key_id: id.into(),
            pin_key_id: "k1".into(),
            state: state.into(),
            valid_from: t(from),
            valid_until: t(until),
            check_in_id: Some("c-1".into()),
            holder_ref: Some("g-1".into()),
            holder_name: Some("Ada".into()),
            schedule: None,
            max_uses: None,
            use_count: 0,
        }
    }

    fn decide_at(now: i64, candidates: &[Candidate], facts: &LockoutFacts) -> Decision {
        decide(&DoorInput {
            door_known: true,
            well_formed: true,
            candidates,
            now: t(now),
            zone: &TimeZone::UTC,
            lockout: facts,
            policy: &policy(),
        })
    }

    fn deny(reason: DenyReason) -> Decision {
        Decision::Deny {
            reason,
            lockout: None,
        }
    }

    fn denials(at: &[i64]) -> LockoutFacts {
        LockoutFacts {
            last: None,
            denials: at.iter().map(|&s| t(s)).collect(),
        }
    }

    #[test]
    fn pins_of_four_to_twelve_ascii_digits_get_one_tag_per_pin_key() {
        let keys = [
            PinKey {
                id: "k1".into(),
                secret: [1; 32],
            },
            PinKey {
                id: "k2".into(),
                secret: [2; 32],
            },
        ];
        let tags = pin_tags(b"1234", &keys).unwrap();
        assert_eq!(tags.len(), 2);
        assert_eq!(tags[0], ("k1".to_owned(), pin_tag(&[1; 32], b"1234")));
        assert_ne!(tags[0].1, tags[1].1);
        assert!(pin_tags(b"123456789012", &keys).is_some());
    }

    #[test]
    fn pins_too_short_too_long_or_not_digits_are_bad_format() {
        let keys = [PinKey {
            id: "k1".into(),
            secret: [1; 32],
        }];
        for pin in [
            &b""[..],
            b"123",
            b"1234567890123",
            b"12a4",
            b"12 4",
            b"\xff\xfe12",
            "١٢٣٤".as_bytes(),
        ] {
            assert!(pin_tags(pin, &keys).is_none(), "{pin:?}");
        }
    }

    #[test]
    fn an_unknown_door_is_denied_even_when_locked_and_never_starts_a_lockout() {
        let facts = LockoutFacts {
            last: Some(Lockout {
                started_at: t(0),
                until: t(100),
                level: 0,
            }),
            denials: vec![t(1); 10],
        };
        let d = decide(&DoorInput {
            door_known: false,
            well_formed: true,
            candidates: &[key("k", "active", -10, 10)],
            now: t(5),
            zone: &TimeZone::UTC,
            lockout: &facts,
            policy: &policy(),
        });
        assert_eq!(d, deny(DenyReason::UnknownDoor));
        assert_eq!(d.wire_deny_reason(), Some(1));
    }

    #[test]
    fn an_active_key_opens_inside_its_window() {
        let k = key("k", "active", -10, 10);
        let d = decide_at(0, std::slice::from_ref(&k), &LockoutFacts::default());
        assert_eq!(d, Decision::Unlock(k));
        assert_eq!(d.wire_deny_reason(), None);
    }

    #[test]
    fn a_pre_issued_key_opens_inside_its_window() {
        let k = key("k", "pre_issued", 0, 10);
        assert_eq!(
            decide_at(0, std::slice::from_ref(&k), &LockoutFacts::default()),
            Decision::Unlock(k)
        );
    }

    #[test]
    fn the_window_includes_valid_from_and_excludes_valid_until() {
        let k = [key("k", "active", 0, 10)];
        let none = LockoutFacts::default();
        assert!(matches!(decide_at(0, &k, &none), Decision::Unlock(_)));
        assert!(matches!(decide_at(9, &k, &none), Decision::Unlock(_)));
        assert_eq!(decide_at(10, &k, &none), deny(DenyReason::OutsideWindow));
        assert_eq!(decide_at(-1, &k, &none), deny(DenyReason::OutsideWindow));
    }

    #[test]
    fn revoked_expired_and_used_up_keys_never_open_and_only_a_revoked_one_is_an_unknown_pin() {
        for (state, reason) in [
            ("revoked", DenyReason::UnknownPin),
            ("expired", DenyReason::OutsideWindow),
            ("used_up", DenyReason::UsedUp),
        ] {
            let k = [key("k", state, -10, 10)];
            assert_eq!(
                decide_at(0, &k, &LockoutFacts::default()),
                deny(reason),
                "{state}"
            );
        }
        // Used up beats expired when both hold the tag.
        let both = [key("a", "expired", -10, 10), key("b", "used_up", -10, 10)];
        assert_eq!(
            decide_at(0, &both, &LockoutFacts::default()),
            deny(DenyReason::UsedUp)
        );
    }

    #[test]
    fn a_live_key_is_matched_before_an_ended_one_with_the_same_pin() {
        let new_guest = key("new", "active", -10, 10);
        for old in ["used_up", "expired", "revoked"] {
            let d = decide_at(
                0,
                &[key("old", old, -100, 100), new_guest.clone()],
                &LockoutFacts::default(),
            );
            assert_eq!(d, Decision::Unlock(new_guest.clone()), "{old}");
        }
        // The live key's own denial is what the door says, not the ended one's.
        let outside = key("new", "active", 20, 30);
        assert_eq!(
            decide_at(
                0,
                &[key("old", "used_up", -100, 100), outside],
                &LockoutFacts::default()
            ),
            deny(DenyReason::OutsideWindow)
        );
    }

    fn office() -> Schedule {
        Schedule::new(vec![
            lockhub_proto::schedule::Interval::parse_text("mon-fri 09:00-17:30").unwrap(),
        ])
        .unwrap()
    }

    fn decide_in(zone: &TimeZone, at: &str, k: &Candidate) -> Decision {
        decide(&DoorInput {
            door_known: true,
            well_formed: true,
            candidates: std::slice::from_ref(k),
            now: Timestamp::parse_rfc3339(at).unwrap(),
            zone,
            lockout: &LockoutFacts::default(),
            policy: &policy(),
        })
    }

    fn wide(state: &str) -> Candidate {
        let mut k = key("k", state, 0, 0);
        k.valid_from = Timestamp::parse_rfc3339("2026-01-01T00:00:00Z").unwrap();
        k.valid_until = Timestamp::parse_rfc3339("2027-01-01T00:00:00Z").unwrap();
        k
    }

    #[test]
    fn a_scheduled_key_opens_inside_its_hours_in_the_hubs_zone_and_is_denied_outside() {
        let mut k = wide("active");
        k.schedule = Some(office());
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        // Friday 2026-12-04: 08:30 UTC is 09:30 in Berlin, 08:30 in UTC.
        assert_eq!(
            decide_in(&berlin, "2026-12-04T08:30:00Z", &k),
            Decision::Unlock(k.clone())
        );
        assert_eq!(
            decide_in(&TimeZone::UTC, "2026-12-04T08:30:00Z", &k),
            deny(DenyReason::OutsideSchedule)
        );
        // Saturday, and Friday at 17:30 sharp: outside.
        for at in ["2026-12-05T10:00:00Z", "2026-12-04T16:30:00Z"] {
            assert_eq!(
                decide_in(&berlin, at, &k),
                deny(DenyReason::OutsideSchedule),
                "{at}"
            );
        }
    }

    #[test]
    fn a_key_opens_while_it_has_uses_left_and_is_used_up_after() {
        let mut k = wide("active");
        k.max_uses = Some(2);
        assert!(!k.takes_last_use());
        assert!(matches!(
            decide_in(&TimeZone::UTC, "2026-12-04T08:30:00Z", &k),
            Decision::Unlock(_)
        ));
        k.use_count = 1;
        assert!(k.takes_last_use());
        assert!(matches!(
            decide_in(&TimeZone::UTC, "2026-12-04T08:30:00Z", &k),
            Decision::Unlock(_)
        ));
        // A live key with no use left (a later version lowered the limit).
        k.use_count = 2;
        assert_eq!(
            decide_in(&TimeZone::UTC, "2026-12-04T08:30:00Z", &k),
            deny(DenyReason::UsedUp)
        );
        let unlimited = wide("active");
        assert!(unlimited.has_use_left() && !unlimited.takes_last_use());
    }

    #[test]
    fn the_checks_of_the_matched_key_run_window_then_schedule_then_uses() {
        let mut k = wide("active");
        k.schedule = Some(office());
        k.max_uses = Some(1);
        k.use_count = 1;
        let utc = TimeZone::UTC;
        // Past the window, outside the hours, out of uses: the window says it.
        assert_eq!(
            decide_in(&utc, "2027-06-05T03:00:00Z", &k),
            deny(DenyReason::OutsideWindow)
        );
        // In the window, outside the hours, out of uses: the schedule.
        assert_eq!(
            decide_in(&utc, "2026-12-05T03:00:00Z", &k),
            deny(DenyReason::OutsideSchedule)
        );
        // In the hours: the uses.
        assert_eq!(
            decide_in(&utc, "2026-12-04T10:00:00Z", &k),
            deny(DenyReason::UsedUp)
        );
    }

    #[test]
    fn a_real_pin_denied_for_its_hours_window_or_uses_never_starts_a_lockout() {
        // Four counted denials: the fifth counted one would lock the keypad.
        let four = denials(&[0, 10, 20, 30]);
        let mut k = key("k", "active", -100, 100);
        k.schedule = Some(office());
        let cases: [(Vec<Candidate>, DenyReason); 5] = [
            (vec![key("k", "active", 50, 100)], DenyReason::OutsideWindow),
            (vec![k], DenyReason::OutsideSchedule),
            (vec![key("k", "used_up", -100, 100)], DenyReason::UsedUp),
            (
                vec![key("k", "expired", -100, 0)],
                DenyReason::OutsideWindow,
            ),
            (
                vec![key("a", "active", -100, 100), key("b", "active", -100, 100)],
                DenyReason::PinAmbiguous,
            ),
        ];
        for (candidates, reason) in cases {
            // t(40) is Friday 2027-01-15 08:00:40 UTC, before the office opens.
            assert_eq!(
                decide_at(40, &candidates, &four),
                deny(reason),
                "{reason:?}"
            );
        }
        // An unknown PIN at the same moment does start it.
        assert!(matches!(
            decide_at(40, &[], &four),
            Decision::Deny {
                lockout: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn no_candidate_is_an_unknown_pin_and_bad_bytes_are_bad_format() {
        assert_eq!(
            decide_at(0, &[], &LockoutFacts::default()),
            deny(DenyReason::UnknownPin)
        );
        let d = decide(&DoorInput {
            door_known: true,
            well_formed: false,
            candidates: &[],
            now: t(0),
            zone: &TimeZone::UTC,
            lockout: &LockoutFacts::default(),
            policy: &policy(),
        });
        assert_eq!(d, deny(DenyReason::BadFormat));
    }

    #[test]
    fn two_live_keys_for_one_pin_are_ambiguous_even_if_only_one_is_in_window() {
        let both = [key("a", "active", -10, 10), key("b", "pre_issued", -10, 10)];
        assert_eq!(
            decide_at(0, &both, &LockoutFacts::default()),
            deny(DenyReason::PinAmbiguous)
        );
        let one_in = [key("a", "active", -10, 10), key("b", "pre_issued", 20, 30)];
        assert_eq!(
            decide_at(0, &one_in, &LockoutFacts::default()),
            deny(DenyReason::PinAmbiguous)
        );
    }

    #[test]
    fn a_final_key_beside_a_live_one_is_not_ambiguous() {
        let k = key("a", "active", -10, 10);
        let d = decide_at(
            0,
            &[key("old", "revoked", -10, 10), k.clone()],
            &LockoutFacts::default(),
        );
        assert_eq!(d, Decision::Unlock(k));
    }

    #[test]
    fn only_bad_pins_at_known_doors_count_toward_a_lockout() {
        let counted: Vec<_> = DenyReason::ALL
            .into_iter()
            .filter(|r| r.counts_toward_lockout())
            .collect();
        assert_eq!(counted, [DenyReason::BadFormat, DenyReason::UnknownPin]);
    }

    #[test]
    fn the_threshold_th_denial_in_the_window_starts_a_lockout() {
        let p = policy();
        let four = denials(&[0, 10, 20, 30]);
        let d = decide_at(40, &[], &four);
        let expected = Lockout {
            started_at: t(40),
            until: t(40 + 60),
            level: 0,
        };
        assert_eq!(
            d,
            Decision::Deny {
                reason: DenyReason::UnknownPin,
                lockout: Some(expected)
            }
        );
        assert_eq!(d.wire_deny_reason(), Some(2));
        let three = denials(&[0, 10, 20]);
        assert_eq!(lockout_after_denial(&three, t(40), &p), None);
    }

    #[test]
    fn a_denial_exactly_one_window_old_no_longer_counts() {
        let p = policy();
        let w = i64::from(p.lockout_window_s);
        let facts = denials(&[0, 1, 2, 3]);
        assert_eq!(counted_denials(&facts, t(w - 1), &p), 4);
        assert_eq!(counted_denials(&facts, t(w), &p), 3);
        assert!(lockout_after_denial(&facts, t(w - 1), &p).is_some());
        assert!(lockout_after_denial(&facts, t(w), &p).is_none());
    }

    #[test]
    fn a_locked_keypad_refuses_even_a_correct_pin_until_the_lockout_ends() {
        let facts = LockoutFacts {
            last: Some(Lockout {
                started_at: t(0),
                until: t(60),
                level: 0,
            }),
            denials: vec![],
        };
        let k = [key("k", "active", -100, 1000)];
        assert_eq!(
            decide_at(0, &k, &facts),
            Decision::LockedOut { until: t(60) }
        );
        assert_eq!(
            decide_at(59, &k, &facts),
            Decision::LockedOut { until: t(60) }
        );
        assert_eq!(
            decide_at(59, &k, &facts).wire_deny_reason(),
            Some(2),
            "locked out is reason 2"
        );
        assert!(matches!(decide_at(60, &k, &facts), Decision::Unlock(_)));
    }

    #[test]
    fn denials_before_a_lockout_ended_do_not_count_toward_the_next() {
        let p = policy();
        let facts = LockoutFacts {
            last: Some(Lockout {
                started_at: t(40),
                until: t(100),
                level: 0,
            }),
            denials: [0, 10, 20, 30, 40, 99].map(t).to_vec(),
        };
        assert_eq!(counted_denials(&facts, t(100), &p), 0);
        let after = LockoutFacts {
            denials: [0, 10, 20, 30, 40, 100, 101].map(t).to_vec(),
            ..facts
        };
        assert_eq!(counted_denials(&after, t(102), &p), 2);
    }

    #[test]
    fn each_further_lockout_doubles_up_to_an_hour() {
        let p = policy();
        let secs: Vec<u32> = (0..10).map(|l| lockout_duration_s(l, &p)).collect();
        assert_eq!(secs, [60, 120, 240, 480, 960, 1920, 3600, 3600, 3600, 3600]);
        assert_eq!(lockout_duration_s(u32::MAX, &p), LOCKOUT_MAX_S);
        let huge = Policy {
            lockout_base_s: 10_000,
            ..p
        };
        assert_eq!(lockout_duration_s(0, &huge), LOCKOUT_MAX_S);
    }

    #[test]
    fn a_lockout_within_a_day_of_the_last_one_ending_goes_up_a_level() {
        let last = Lockout {
            started_at: t(0),
            until: t(60),
            level: 2,
        };
        assert_eq!(next_level(Some(&last), t(61)), 3);
        assert_eq!(next_level(Some(&last), t(60 + LOCKOUT_RESET_S - 1)), 3);
        assert_eq!(next_level(Some(&last), t(60 + LOCKOUT_RESET_S)), 0);
        assert_eq!(next_level(None, t(61)), 0);
    }

    #[test]
    fn the_second_lockout_lasts_twice_as_long_and_a_quiet_day_resets_it() {
        let p = policy();
        let last = Lockout {
            started_at: t(0),
            until: t(60),
            level: 0,
        };
        let facts = LockoutFacts {
            last: Some(last),
            denials: [60, 61, 62, 63].map(t).to_vec(),
        };
        let second = lockout_after_denial(&facts, t(64), &p).unwrap();
        assert_eq!((second.level, second.until), (1, t(64 + 120)));

        let day = 60 + LOCKOUT_RESET_S;
        let later = LockoutFacts {
            last: Some(last),
            denials: [day, day + 1, day + 2, day + 3].map(t).to_vec(),
        };
        let reset = lockout_after_denial(&later, t(day + 4), &p).unwrap();
        assert_eq!((reset.level, reset.until), (0, t(day + 4 + 60)));
    }

    #[test]
    fn a_threshold_of_one_locks_on_the_first_counting_denial() {
        let p = Policy {
            lockout_threshold: 1,
            ..policy()
        };
        assert!(lockout_after_denial(&LockoutFacts::default(), t(0), &p).is_some());
    }

    #[test]
    fn debug_output_never_shows_a_holder_name() {
        let s = format!("{:?}", key("k", "active", 0, 1));
        assert!(!s.contains("Ada") && s.contains("<redacted>"), "{s}");
    }
}
