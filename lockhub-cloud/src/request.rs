//! What an operator or a booking system asks for, checked before anything
//! is signed, and its canonical form for idempotency. Pure: plain data in,
//! plain data out.
//!
//! The checks here are the ones whose message must name the operator's
//! mistake (a door the hub does not have, a PIN of the wrong length, a
//! window that ends before it starts). Every rule of the grant itself is
//! `lockhub-proto`'s: [`crate::ops`] runs the hub's own body parser over the
//! body before it is signed, so the cloud never signs what a hub refuses at
//! step 4.

use crate::store::{HubRecord, HubRef, Idempotency, PinKey};
use lockhub_proto::crypto::{b64u_encode, pin_tag, sha256};
use lockhub_proto::event::{MAX_USES, is_key_id};
use lockhub_proto::schedule::{Interval, MAX_INTERVALS, Schedule, ScheduleTextError};
use lockhub_proto::time::Timestamp;
use serde::Serialize;

/// The shortest and longest PIN (digits).
pub const PIN_DIGITS: std::ops::RangeInclusive<usize> = 4..=12;
/// The longest idempotency key.
pub const MAX_IDEMPOTENCY_KEY: usize = 200;

/// A guest's PIN. Never printed: Debug is redacted, and the PIN leaves this
/// type only as its tag under one of the hub's PIN keys.
#[derive(Clone, PartialEq, Eq)]
pub struct Pin(String);

impl Pin {
    /// A PIN of 4..=12 ASCII digits (surrounding whitespace dropped, so a
    /// file or a pipe's newline does not count).
    pub fn parse(s: &str) -> Result<Pin, InputError> {
        let s = s.trim();
        if !PIN_DIGITS.contains(&s.len()) || !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(InputError::BadPin);
        }
        Ok(Pin(s.to_owned()))
    }

    fn tag(&self, key: &PinKey) -> [u8; 32] {
        pin_tag(&key.secret, self.0.as_bytes())
    }
}

impl std::fmt::Debug for Pin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pin(<redacted>)")
    }
}

/// The input boundary's errors: each one is the caller's mistake (exit 2),
/// and none quotes a PIN or a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("{0:?} is not SITE/HUB (a site UUID, a slash, a hub id)")]
    BadHubRef(String),
    #[error("hub {hub} has no door {door:?} (its doors: {known})")]
    UnknownDoor {
        hub: HubRef,
        door: String,
        known: String,
    },
    #[error("a grant needs at least one --door")]
    NoDoor,
    #[error("the PIN must be 4 to 12 digits")]
    BadPin,
    #[error("hub {hub} has no PIN key {id:?}")]
    UnknownPinKey { hub: HubRef, id: String },
    #[error("hub {0} has no PIN key: add one with `hub add --pin-key`")]
    NoPinKey(HubRef),
    #[error("{field} {value:?} is not an RFC 3339 instant")]
    BadTime { field: &'static str, value: String },
    #[error("the window ends ({until}) before it starts ({from})")]
    WindowEndsBeforeStart { from: String, until: String },
    #[error("the window already ended ({0})")]
    WindowOver(String),
    #[error("{what} {value:?}: use 1..=64 of [A-Za-z0-9._-]")]
    BadId { what: &'static str, value: String },
    #[error("the idempotency key must be 1..={MAX_IDEMPOTENCY_KEY} characters")]
    BadIdempotencyKey,
    #[error("--schedule {text:?}: {reason}")]
    BadSchedule {
        text: String,
        reason: ScheduleTextError,
    },
    #[error("a schedule has at most {MAX_INTERVALS} intervals")]
    TooManyIntervals,
    #[error("--uses {0}: use 1..={MAX_USES}")]
    BadMaxUses(u32),
    #[error("{0}")]
    Invalid(String),
    #[error("the hub would refuse this event ({0}); nothing was signed")]
    HubWouldRefuse(String),
}

/// The `--schedule` intervals as one schedule; none given is none.
fn parse_schedule(texts: &[String]) -> Result<Option<Schedule>, InputError> {
    if texts.is_empty() {
        return Ok(None);
    }
    let intervals = texts
        .iter()
        .map(|t| {
            Interval::parse_text(t).map_err(|reason| InputError::BadSchedule {
                text: t.clone(),
                reason,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Schedule::new(intervals)
        .map(Some)
        .ok_or(InputError::TooManyIntervals)
}

/// Parses `SITE/HUB`: the site is a UUID (written lowercase), the hub a
/// name of the contract's alphabet.
pub fn parse_hub_ref(s: &str) -> Result<HubRef, InputError> {
    let bad = || InputError::BadHubRef(s.to_owned());
    let (site, hub) = s.split_once('/').ok_or_else(bad)?;
    let site = uuid::Uuid::parse_str(site).map_err(|_| bad())?;
    if !is_key_id(hub) {
        return Err(bad());
    }
    Ok(HubRef {
        site_id: site.hyphenated().to_string(),
        hub_id: hub.to_owned(),
    })
}

/// Checks an id against the contract's alphabet (key, check-in,
/// reservation and holder ids use the key id rule).
pub fn check_id(what: &'static str, value: &str) -> Result<(), InputError> {
    if is_key_id(value) {
        Ok(())
    } else {
        Err(InputError::BadId {
            what,
            value: value.to_owned(),
        })
    }
}

fn parse_time(field: &'static str, value: &str) -> Result<Timestamp, InputError> {
    Timestamp::parse_rfc3339(value.trim()).map_err(|_| InputError::BadTime {
        field,
        value: value.to_owned(),
    })
}

/// Which command mints the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantCommand {
    /// `issue`: a `key.issued` (active with a check-in, pre-issued with a
    /// reservation).
    Issue,
    /// `checkin`: a `checkin.completed`.
    CheckIn,
}

/// A grant as asked for.
#[derive(Debug, Clone)]
pub struct GrantRequest {
    pub command: GrantCommand,
    pub hub: HubRef,
    pub check_in_id: Option<String>,
    pub reservation_id: Option<String>,
    pub key_id: Option<String>,
    pub doors: Vec<String>,
    pub pin: Pin,
    pub pin_key_id: Option<String>,
    pub valid_from: Option<String>,
    pub valid_until: String,
    pub holder_ref: Option<String>,
    pub idempotency_key: Option<String>,
    /// Weekly hours in the form for people (`mon-fri 09:00-17:30`), one
    /// interval each; none means at any hour of the window.
    pub schedule: Vec<String>,
    /// How many entries the key grants in all; none means no limit.
    pub max_uses: Option<u32>,
}

/// A checked grant, ready to sign.
#[derive(Clone)]
pub struct Grant {
    pub command: GrantCommand,
    pub key_id: String,
    /// `active` or `pre_issued`.
    pub state: &'static str,
    pub check_in_id: Option<String>,
    pub reservation_id: Option<String>,
    pub doors: Vec<String>,
    pub valid_from: Timestamp,
    pub valid_until: Timestamp,
    pub pin_key_id: String,
    pub pin_tag: [u8; 32],
    pub holder_ref: Option<String>,
    pub schedule: Option<Schedule>,
    pub max_uses: Option<u32>,
    pub idempotency: Idempotency,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("key_id", &self.key_id)
            .field("state", &self.state)
            .field("doors", &self.doors)
            .finish_non_exhaustive()
    }
}

/// The request as the idempotency record fingerprints it: what the caller
/// gave (defaults it left out stay out, so a retry that leaves `valid_from`
/// to "now" is the same request), with the PIN as its tag.
#[derive(Serialize)]
struct Canonical<'a> {
    v: u32,
    command: GrantCommand,
    check_in_id: Option<&'a str>,
    reservation_id: Option<&'a str>,
    key_id: Option<&'a str>,
    doors: &'a [String],
    valid_from: Option<String>,
    valid_until: String,
    pin_key_id: &'a str,
    pin_tag: String,
    holder_ref: Option<&'a str>,
    /// Left out when absent, so a request made before schedules existed
    /// keeps its fingerprint.
    #[serde(skip_serializing_if = "Option::is_none")]
    schedule: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_uses: Option<u32>,
}

/// The default idempotency key: the check-in, or the reservation for a
/// pre-issued key (both scoped to the hub by the store).
pub fn default_idempotency_key(req: &GrantRequest) -> Option<String> {
    match (&req.check_in_id, &req.reservation_id) {
        (Some(c), _) => Some(format!("check-in:{c}")),
        (None, Some(r)) => Some(format!("reservation:{r}")),
        (None, None) => None,
    }
}

/// Checks `req` against the hub's doors and PIN keys at `now`; `new_key_id`
/// names the key when the caller did not.
pub fn check_grant(
    req: &GrantRequest,
    hub: &HubRecord,
    now: Timestamp,
    new_key_id: impl FnOnce() -> String,
) -> Result<Grant, InputError> {
    let (state, check_in_id, reservation_id) =
        match (req.command, &req.check_in_id, &req.reservation_id) {
            (GrantCommand::Issue, Some(c), r) => ("active", Some(c), r.as_ref()),
            (GrantCommand::Issue, None, Some(r)) => ("pre_issued", None, Some(r)),
            (GrantCommand::Issue, None, None) => {
                return Err(InputError::Invalid(
                    "issue needs --check-in (an active key) or --reservation (a pre-issued key)"
                        .into(),
                ));
            }
            (GrantCommand::CheckIn, Some(c), Some(r)) => ("active", Some(c), Some(r)),
            (GrantCommand::CheckIn, _, _) => {
                return Err(InputError::Invalid(
                    "checkin needs --reservation and --check-in".into(),
                ));
            }
        };
    if let Some(c) = check_in_id {
        check_id("check-in id", c)?;
    }
    if let Some(r) = reservation_id {
        check_id("reservation id", r)?;
    }
    if let Some(k) = &req.key_id {
        check_id("key id", k)?;
    }
    if let Some(h) = &req.holder_ref {
        check_id("holder ref", h)?;
    }
    if req.doors.is_empty() {
        return Err(InputError::NoDoor);
    }
    let mut doors = req.doors.clone();
    doors.sort();
    doors.dedup();
    for d in &doors {
        if !hub.doors.contains(d) {
            return Err(InputError::UnknownDoor {
                hub: hub.hub.clone(),
                door: d.clone(),
                known: if hub.doors.is_empty() {
                    "none".into()
                } else {
                    hub.doors.join(", ")
                },
            });
        }
    }
    let pin_key =
        match &req.pin_key_id {
            Some(id) => hub.pin_keys.iter().find(|k| &k.id == id).ok_or_else(|| {
                InputError::UnknownPinKey {
                    hub: hub.hub.clone(),
                    id: id.clone(),
                }
            })?,
            None => hub
                .pin_keys
                .first()
                .ok_or_else(|| InputError::NoPinKey(hub.hub.clone()))?,
        };
    let from_given = req
        .valid_from
        .as_deref()
        .map(|v| parse_time("--valid-from", v))
        .transpose()?;
    let valid_until = parse_time("--valid-until", &req.valid_until)?;
    let valid_from = from_given.unwrap_or(now);
    if valid_until <= valid_from {
        return Err(InputError::WindowEndsBeforeStart {
            from: valid_from.to_rfc3339(),
            until: valid_until.to_rfc3339(),
        });
    }
    if valid_until <= now {
        return Err(InputError::WindowOver(valid_until.to_rfc3339()));
    }
    let schedule = parse_schedule(&req.schedule)?;
    if let Some(n) = req.max_uses
        && !(1..=MAX_USES).contains(&n)
    {
        return Err(InputError::BadMaxUses(n));
    }
    let tag = req.pin.tag(pin_key);
    let idem_key = req
        .idempotency_key
        .clone()
        .or_else(|| default_idempotency_key(req))
        .unwrap_or_default();
    if idem_key.is_empty() || idem_key.len() > MAX_IDEMPOTENCY_KEY {
        return Err(InputError::BadIdempotencyKey);
    }
    let canonical = Canonical {
        v: 1,
        command: req.command,
        check_in_id: check_in_id.map(String::as_str),
        reservation_id: reservation_id.map(String::as_str),
        key_id: req.key_id.as_deref(),
        doors: &doors,
        valid_from: from_given.map(Timestamp::to_rfc3339),
        valid_until: valid_until.to_rfc3339(),
        pin_key_id: &pin_key.id,
        pin_tag: b64u_encode(&tag),
        holder_ref: req.holder_ref.as_deref(),
        schedule: schedule.as_ref().map(Schedule::to_json),
        max_uses: req.max_uses,
    };
    let request_sha256 = sha256(&serde_json::to_vec(&canonical).unwrap_or_default());
    Ok(Grant {
        command: req.command,
        key_id: req.key_id.clone().unwrap_or_else(new_key_id),
        state,
        check_in_id: check_in_id.cloned(),
        reservation_id: reservation_id.cloned(),
        doors,
        valid_from,
        valid_until,
        pin_key_id: pin_key.id.clone(),
        pin_tag: tag,
        holder_ref: req.holder_ref.clone(),
        schedule,
        max_uses: req.max_uses,
        idempotency: Idempotency {
            key: idem_key,
            request_sha256,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub() -> HubRecord {
        HubRecord {
            hub: parse_hub_ref("6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10/hub-1").unwrap(),
            public_key: None,
            doors: vec!["101".into(), "102".into()],
            pin_keys: vec![PinKey {
                id: "k1".into(),
                secret: [3; 32],
            }],
            next_seq: 1,
        }
    }

    fn req(pin: &str) -> GrantRequest {
        GrantRequest {
            command: GrantCommand::Issue,
            hub: hub().hub,
            check_in_id: Some("c-1".into()),
            reservation_id: None,
            key_id: None,
            doors: vec!["101".into()],
            pin: Pin::parse(pin).unwrap(),
            pin_key_id: None,
            valid_from: None,
            valid_until: "2099-01-01T00:00:00Z".into(),
            holder_ref: None,
            idempotency_key: None,
            schedule: Vec::new(),
            max_uses: None,
        }
    }

    fn now() -> Timestamp {
        Timestamp::parse_rfc3339("2026-12-01T00:00:00Z").unwrap()
    }

    #[test]
    fn a_retry_left_to_default_now_is_the_same_request_and_another_pin_is_not() {
        let a = check_grant(&req("482913"), &hub(), now(), || "k-a".into()).unwrap();
        let later = now().saturating_add_secs(3600);
        let b = check_grant(&req("482913"), &hub(), later, || "k-b".into()).unwrap();
        assert_eq!(a.idempotency, b.idempotency);
        assert_eq!(a.idempotency.key, "check-in:c-1");
        let c = check_grant(&req("482914"), &hub(), now(), || "k-c".into()).unwrap();
        assert_eq!(c.idempotency.key, a.idempotency.key);
        assert_ne!(c.idempotency.request_sha256, a.idempotency.request_sha256);
        let mut r = req("482913");
        r.valid_until = "2099-01-02T00:00:00Z".into();
        let d = check_grant(&r, &hub(), now(), || "k-d".into()).unwrap();
        assert_ne!(d.idempotency.request_sha256, a.idempotency.request_sha256);
    }

    #[test]
    fn each_operator_mistake_is_named() {
        for bad in ["123", "1234567890123", "12a4", ""] {
            assert_eq!(Pin::parse(bad), Err(InputError::BadPin), "{bad:?}");
        }
        let mut r = req("1234");
        r.doors = vec!["999".into()];
        assert!(matches!(
            check_grant(&r, &hub(), now(), String::new),
            Err(InputError::UnknownDoor { door, .. }) if door == "999"
        ));
        let mut r = req("1234");
        r.valid_from = Some("2099-01-02T00:00:00Z".into());
        assert!(matches!(
            check_grant(&r, &hub(), now(), String::new),
            Err(InputError::WindowEndsBeforeStart { .. })
        ));
        let mut r = req("1234");
        r.valid_until = "tomorrow".into();
        assert!(matches!(
            check_grant(&r, &hub(), now(), String::new),
            Err(InputError::BadTime { .. })
        ));
        let mut r = req("1234");
        r.pin_key_id = Some("k9".into());
        assert!(matches!(
            check_grant(&r, &hub(), now(), String::new),
            Err(InputError::UnknownPinKey { .. })
        ));
        assert!(parse_hub_ref("not-a-uuid/hub").is_err());
        assert!(parse_hub_ref("6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10").is_err());
        assert!(format!("{:?}", Pin::parse("482913").unwrap()).contains("redacted"));
    }

    #[test]
    fn a_schedule_and_a_use_limit_are_checked_and_change_the_fingerprint() {
        let plain = check_grant(&req("482913"), &hub(), now(), || "k".into()).unwrap();
        assert_eq!((plain.schedule.as_ref(), plain.max_uses), (None, None));
        let mut r = req("482913");
        r.schedule = vec!["mon-fri 09:00-17:30".into(), "sat 10:00-12:00".into()];
        r.max_uses = Some(3);
        let g = check_grant(&r, &hub(), now(), || "k".into()).unwrap();
        let s = g.schedule.as_ref().unwrap();
        assert_eq!(s.intervals().len(), 2);
        assert_eq!(s.intervals()[0].from_minute(), 9 * 60);
        assert_eq!(g.max_uses, Some(3));
        assert_ne!(
            g.idempotency.request_sha256,
            plain.idempotency.request_sha256
        );

        let mut r = req("482913");
        r.schedule = vec!["monday 09:00-17:30".into()];
        let e = check_grant(&r, &hub(), now(), String::new).err().unwrap();
        assert!(matches!(e, InputError::BadSchedule { .. }), "{e:?}");
        assert!(e.to_string().contains("mon tue wed"), "{e}");
        let mut r = req("482913");
        r.schedule = vec!["mon 09:00-10:00".into(); MAX_INTERVALS + 1];
        assert_eq!(
            check_grant(&r, &hub(), now(), String::new).err(),
            Some(InputError::TooManyIntervals)
        );
        for bad in [0, MAX_USES + 1] {
            let mut r = req("482913");
            r.max_uses = Some(bad);
            assert_eq!(
                check_grant(&r, &hub(), now(), String::new).err(),
                Some(InputError::BadMaxUses(bad))
            );
        }
    }
}
