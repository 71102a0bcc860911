//! The cloud's key events as plain data, and what the hub answers.
//!
//! An event arrives as a signed envelope ([`crate::verify`] checks it); once
//! its signature holds, its body is parsed here into an [`EventKind`]. Nothing in
//! this module touches the database: the store turns an [`EventKind`] into
//! changes, and every answer it gives is an [`EventResult`] built from the
//! stable codes below. Those codes are a contract with the cloud team
//! (mqtt.md 'Deciding an event'): never rename one.

use crate::schedule::Schedule;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use uuid::Uuid;

/// What happened to an event (mqtt.md 'Results').
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The event changed the mirror.
    Applied,
    /// Valid, nothing to change.
    Noop,
    /// Not applied; the reason says why.
    Rejected,
    /// The id was seen before with a different body.
    Conflict,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Noop => "noop",
            Outcome::Rejected => "rejected",
            Outcome::Conflict => "conflict",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "applied" => Outcome::Applied,
            "noop" => Outcome::Noop,
            "rejected" => Outcome::Rejected,
            "conflict" => Outcome::Conflict,
            _ => return None,
        })
    }
}

/// The stable rejection codes, in the order mqtt.md decides them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    // Step 1: envelope and authentication. Nothing is claimed or counted.
    PayloadTooLarge,
    BadEnvelope,
    UnsupportedVersion,
    UnknownSigner,
    BadSignature,
    EventIdMismatch,
    WrongSite,
    WrongHub,
    // Step 3: replay.
    StaleSeq,
    // Step 4: schema.
    UnsupportedType,
    InvalidGrant,
    UnknownDoor,
    UnknownPinKey,
    // Step 5: key state.
    Revoked,
    IllegalTransition,
    // Step 6: time.
    Expired,
    // Step 7: invariants.
    OneActiveConflict,
    PinCollision,
}

impl Reason {
    pub const ALL: [Reason; 18] = [
        Reason::PayloadTooLarge,
        Reason::BadEnvelope,
        Reason::UnsupportedVersion,
        Reason::UnknownSigner,
        Reason::BadSignature,
        Reason::EventIdMismatch,
        Reason::WrongSite,
        Reason::WrongHub,
        Reason::StaleSeq,
        Reason::UnsupportedType,
        Reason::InvalidGrant,
        Reason::UnknownDoor,
        Reason::UnknownPinKey,
        Reason::Revoked,
        Reason::IllegalTransition,
        Reason::Expired,
        Reason::OneActiveConflict,
        Reason::PinCollision,
    ];

    /// The stable wire code.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::PayloadTooLarge => "payload_too_large",
            Reason::BadEnvelope => "bad_envelope",
            Reason::UnsupportedVersion => "unsupported_version",
            Reason::UnknownSigner => "unknown_signer",
            Reason::BadSignature => "bad_signature",
            Reason::EventIdMismatch => "event_id_mismatch",
            Reason::WrongSite => "wrong_site",
            Reason::WrongHub => "wrong_hub",
            Reason::StaleSeq => "stale_seq",
            Reason::UnsupportedType => "unsupported_type",
            Reason::InvalidGrant => "invalid_grant",
            Reason::UnknownDoor => "unknown_door",
            Reason::UnknownPinKey => "unknown_pin_key",
            Reason::Revoked => "revoked",
            Reason::IllegalTransition => "illegal_transition",
            Reason::Expired => "expired",
            Reason::OneActiveConflict => "one_active_conflict",
            Reason::PinCollision => "pin_collision",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Step-1 reasons: the message is not authenticated, so it claims no id
    /// and counts toward no seq.
    pub fn is_step1(self) -> bool {
        matches!(
            self,
            Reason::PayloadTooLarge
                | Reason::BadEnvelope
                | Reason::UnsupportedVersion
                | Reason::UnknownSigner
                | Reason::BadSignature
                | Reason::EventIdMismatch
                | Reason::WrongSite
                | Reason::WrongHub
        )
    }

    /// Batch items with these outcomes are recorded and skipped; any other
    /// rejection rejects the whole batch.
    pub fn skippable_in_batch(self) -> bool {
        matches!(self, Reason::Revoked | Reason::IllegalTransition)
    }
}

/// The state a grant asks for. Final states never arrive in a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantState {
    PreIssued,
    Active,
}

impl GrantState {
    /// The wire spelling (a grant's `state`, a mirror proof line's).
    pub fn as_str(self) -> &'static str {
        match self {
            GrantState::PreIssued => "pre_issued",
            GrantState::Active => "active",
        }
    }
}

/// A 32-byte HMAC-SHA256 PIN tag. Its Debug output is redacted: a tag is as
/// good as a PIN to anyone who can brute-force a 4-digit space offline.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PinTag(pub [u8; 32]);

impl std::fmt::Debug for PinTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PinTag(<redacted>)")
    }
}

/// A door key as the cloud grants it (mqtt.md 'Grant').
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub key_id: String,
    pub version: u64,
    pub state: GrantState,
    pub check_in_id: Option<String>,
    pub reservation_id: Option<String>,
    /// Door names, non-empty, each named in the config, without duplicates.
    pub doors: Vec<String>,
    pub valid_from: Timestamp,
    /// As sent; the store clamps it to `valid_from + max_grant_days`.
    pub valid_until: Timestamp,
    pub pin_tag: PinTag,
    pub pin_key_id: String,
    pub holder_ref: Option<String>,
    pub holder_name: Option<String>,
    /// The weekly hours it opens, in the hub's time zone; `None`: any hour
    /// of its window.
    pub schedule: Option<Schedule>,
    /// How many entries it grants in all, 1..=[`MAX_USES`]; `None`: no limit.
    pub max_uses: Option<u32>,
}

/// The largest `max_uses` a grant may carry (mqtt.md 'Grant').
pub const MAX_USES: u32 = 100_000;

/// One change a batch may carry (no nested batch, no checkpoint).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    KeyIssued {
        key: Grant,
        supersedes: Vec<String>,
    },
    KeyRevoked {
        key_id: String,
        version: u64,
        reason: String,
    },
    CheckinCompleted {
        reservation_id: String,
        check_in_id: String,
        key: Grant,
    },
    GuestErased {
        holder_ref: String,
    },
}

/// What a verified body asks for.
// A single grant inline is a few hundred bytes, moved once per event: boxing
// it would buy nothing measurable and cost an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    Change(Change),
    /// Up to [`MAX_BATCH_ITEMS`] changes in one transaction.
    Batch(Vec<Change>),
    /// A batch whose item `invalid.item` fails step 4: the items before it,
    /// which the store decides first, in order (mqtt.md 'Types: batch': the
    /// first item that fails at any step is the one reported). Only
    /// [`parse_body_in_order`] returns it.
    BatchCutShort {
        items: Vec<Change>,
        invalid: SchemaError,
    },
    Checkpoint {
        head_seq: u64,
        /// The cloud's claim of the live set (mqtt.md 'Mirror proof').
        mirror: Option<crate::mirror::Claim>,
    },
    /// `mirror.request`: the keys of up to 16 buckets, as of `as_of`. It
    /// changes nothing; the hub answers on the proof topic.
    MirrorRequest {
        as_of: Timestamp,
        /// 1..=[`MAX_REQUEST_BUCKETS`] distinct buckets, in the order asked.
        buckets: Vec<u8>,
    },
}

/// The most buckets one `mirror.request` may ask for.
pub const MAX_REQUEST_BUCKETS: usize = 16;

/// The types that carry no `seq` of their own (mqtt.md 'Types'): they
/// state or ask, and never move the watermark.
pub fn has_no_seq(ty: &str) -> bool {
    matches!(ty, "checkpoint" | "mirror.request")
}

pub const MAX_BATCH_ITEMS: usize = 500;
/// The largest seq the cloud may use: 2^53 - 1, so JSON numbers stay exact.
pub const MAX_SEQ: u64 = (1 << 53) - 1;

/// The header every body carries; verified before the body is trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventHeader {
    /// Lowercase on the wire back and in the store.
    pub event_id: Uuid,
    /// `None` only on `checkpoint`.
    pub seq: Option<u64>,
    pub issued_at: Timestamp,
}

/// One item's outcome in a batch result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemResult {
    pub outcome: Outcome,
    pub reason: Option<Reason>,
    /// A clamped grant's window end after the clamp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<Timestamp>,
}

/// The body of a result message (mqtt.md 'Results').
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventResult {
    /// `None` when a step-1 rejection could not read an id.
    pub event_id: Option<Uuid>,
    pub seq: Option<u64>,
    pub outcome: Outcome,
    pub reason: Option<Reason>,
    pub duplicate: bool,
    pub clamped: bool,
    pub at: Timestamp,
    /// A clamped grant's window end after the clamp (only when `clamped`):
    /// the cloud's mirror claim uses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<ItemResult>>,
}

impl EventResult {
    /// The exact JSON body published on the results topic.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain data with no maps of non-string keys cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Why a verified body failed the schema (step 4). `item` is the index of the
/// failing batch item, when the event is a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaError {
    pub reason: Reason,
    pub item: Option<usize>,
}

/// What one authenticated event shows about the cloud (mqtt.md 'Seq, gaps,
/// staleness'), as the store saw it before counting the event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// A duplicate or a conflict: the id was seen before. A broker can
    /// replay these forever while dropping everything new. (Also what a
    /// checkpoint whose body failed step 4 shows: nothing.)
    SeenBefore,
    /// A first-seen event with a seq. `highest_before` is the highest seq
    /// seen before it (the watermark, or above it across a gap).
    Event { seq: u64, highest_before: u64 },
    /// A first-seen checkpoint, issued at `issued_at`.
    Checkpoint { issued_at: Timestamp },
}

impl Evidence {
    /// Whether it is a sign of life for `cloud_stale`: a first-seen event
    /// above every seq seen before (a `stale_seq` replay or a re-sent event
    /// filling a gap is not: an old event says nothing about the cloud now),
    /// or a checkpoint issued within `stale_s` of the effective time `now`
    /// (an old one may have sat in a broker queue for hours).
    pub fn is_sign_of_life(self, now: Timestamp, stale_s: u32) -> bool {
        match self {
            Evidence::SeenBefore => false,
            Evidence::Event {
                seq,
                highest_before,
            } => seq > highest_before,
            Evidence::Checkpoint { issued_at } => {
                now.0.abs_diff(issued_at.0) <= u64::from(stale_s) * Timestamp::MICROS_PER_SEC as u64
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Parsing (step 4 of mqtt.md 'Deciding an event').
//
// Everything below is pure: bytes and a [`SchemaContext`] in, an
// [`EventKind`] or a stable [`Reason`] out. It runs only on bodies that
// [`crate::verify::verify_envelope`] has authenticated and bound to this hub,
// so a failure here is answered with a step-4 code and the event still claims
// its id and counts toward the watermark.
// ---------------------------------------------------------------------------

/// The longest id the hub accepts for `key_id`, `check_in_id`,
/// `reservation_id`, `holder_ref` and `supersedes` entries.
pub const MAX_ID_CHARS: usize = 64;
/// The longest free text the hub accepts (`holder_name`, a revoke `reason`).
/// Generous for a name or a reason code, small enough that a hostile body
/// cannot park megabytes in every key row and audit line.
pub const MAX_TEXT_CHARS: usize = 256;

/// What step 4 needs from the configuration: which door names and which PIN
/// key ids exist on this hub. Built once from the loaded config; owning sets
/// keeps lookups cheap and the type free of borrowed lifetimes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchemaContext {
    pub doors: BTreeSet<String>,
    pub pin_key_ids: BTreeSet<String>,
}

impl SchemaContext {
    pub fn new<D, P>(doors: D, pin_key_ids: P) -> Self
    where
        D: IntoIterator,
        D::Item: Into<String>,
        P: IntoIterator,
        P::Item: Into<String>,
    {
        SchemaContext {
            doors: doors.into_iter().map(Into::into).collect(),
            pin_key_ids: pin_key_ids.into_iter().map(Into::into).collect(),
        }
    }
}

/// Parses JSON refusing duplicate object keys anywhere in the document.
///
/// `serde_json` keeps the last of two equal keys; another parser (the cloud's
/// own tests, an auditor's tool) may keep the first. A signed body that two
/// honest parsers read differently is not a statement the cloud made, so the
/// hub refuses it rather than pick a meaning. Keys are compared after
/// unescaping, so `"a"` and `"\u0061"` collide. Nesting is bounded by
/// serde_json's recursion limit (128), so deep input is an error, not a
/// stack overflow. Numbers keep serde_json's rules: an integer literal
/// that does not fit 64 bits becomes a float, which every integer field then
/// refuses; a float that overflows (`1e400`) is a parse error.
pub fn parse_json_strict(bytes: &[u8]) -> Option<Value> {
    serde_json::from_slice::<NoDup>(bytes).ok().map(|v| v.0)
}

struct NoDup(Value);

impl<'de> serde::Deserialize<'de> for NoDup {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDupVisitor)
    }
}

struct NoDupVisitor;

impl<'de> serde::de::Visitor<'de> for NoDupVisitor {
    type Value = NoDup;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JSON without duplicate object keys")
    }

    fn visit_bool<E>(self, v: bool) -> Result<NoDup, E> {
        Ok(NoDup(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<NoDup, E> {
        Ok(NoDup(Value::Number(v.into())))
    }

    fn visit_u64<E>(self, v: u64) -> Result<NoDup, E> {
        Ok(NoDup(Value::Number(v.into())))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<NoDup, E> {
        serde_json::Number::from_f64(v)
            .map(|n| NoDup(Value::Number(n)))
            .ok_or_else(|| E::custom("non-finite number"))
    }

    fn visit_str<E>(self, v: &str) -> Result<NoDup, E> {
        Ok(NoDup(Value::String(v.to_owned())))
    }

    fn visit_string<E>(self, v: String) -> Result<NoDup, E> {
        Ok(NoDup(Value::String(v)))
    }

    fn visit_unit<E>(self) -> Result<NoDup, E> {
        Ok(NoDup(Value::Null))
    }

    fn visit_none<E>(self) -> Result<NoDup, E> {
        Ok(NoDup(Value::Null))
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<NoDup, D::Error> {
        serde::Deserialize::deserialize(d)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<NoDup, A::Error> {
        let mut out = Vec::new();
        while let Some(NoDup(v)) = seq.next_element()? {
            out.push(v);
        }
        Ok(NoDup(Value::Array(out)))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<NoDup, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let NoDup(v) = map.next_value()?;
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom("duplicate object key"));
            }
            out.insert(key, v);
        }
        Ok(NoDup(Value::Object(out)))
    }
}

/// A UUID in the one form the contract writes: 36 characters, hyphenated,
/// either case. `uuid` alone would also take the braced, URN and
/// 32-digit forms; accepting several spellings of one id invites two
/// components to disagree about whether ids are equal.
pub fn parse_uuid_strict(s: &str) -> Option<Uuid> {
    let b = s.as_bytes();
    if b.len() != 36 {
        return None;
    }
    for (i, c) in b.iter().enumerate() {
        let ok = match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        };
        if !ok {
            return None;
        }
    }
    Uuid::try_parse(s).ok()
}

/// An integer JSON number in `lo..=hi`. Floats (`1.0`, `1e2`), negatives and
/// integers past 64 bits (which serde_json reads as floats) are refused.
pub fn json_int_in(v: &Value, lo: u64, hi: u64) -> Option<u64> {
    v.as_u64().filter(|n| (lo..=hi).contains(n))
}

/// `key_id` (mqtt.md 'Grant'): 1..=64 of `[A-Za-z0-9._-]`.
pub fn is_key_id(s: &str) -> bool {
    (1..=MAX_ID_CHARS).contains(&s.len())
        && s.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// The one rule for the names and ids an installer picks and the wire then
/// carries (doors in a grant's `doors`, PIN key ids in `pin_key_id`, signer
/// ids in an envelope's `signer`; serials, buses and readers too): 1..=64
/// characters, no control characters, no surrounding spaces. The hub's
/// config refuses any other; a grant naming one is `unknown_door` or
/// `unknown_pin_key`, since no config can hold it.
/// (The hub id is the id alphabet instead: [`is_key_id`].)
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars().count() <= MAX_ID_CHARS
        && !s.chars().any(char::is_control)
        && s.trim() == s
}

/// The other cloud ids (`check_in_id`, `reservation_id`, `holder_ref`): the
/// page gives no alphabet, so any text of 1..=64 characters without control
/// characters. Control characters (NUL above all) have no business in an id
/// and would travel into SQLite rows and audit lines.
fn is_ref_id(s: &str) -> bool {
    let n = s.chars().count();
    (1..=MAX_ID_CHARS).contains(&n) && !s.chars().any(char::is_control)
}

/// Free text up to [`MAX_TEXT_CHARS`] characters without control characters.
fn is_text(s: &str, min: usize) -> bool {
    let n = s.chars().count();
    (min..=MAX_TEXT_CHARS).contains(&n) && !s.chars().any(char::is_control)
}

type Obj = Map<String, Value>;

const BAD: Reason = Reason::InvalidGrant;

/// A required string field.
fn req_str<'v>(o: &'v Obj, k: &str) -> Result<&'v str, Reason> {
    o.get(k).and_then(Value::as_str).ok_or(BAD)
}

/// An optional string field: absent and `null` both mean "not given" (many
/// serialisers write `null` for a missing option); any other type is refused.
fn opt_str<'v>(o: &'v Obj, k: &str) -> Result<Option<&'v str>, Reason> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(BAD),
    }
}

fn req_key_id(o: &Obj, k: &str) -> Result<String, Reason> {
    let s = req_str(o, k)?;
    if is_key_id(s) {
        Ok(s.to_owned())
    } else {
        Err(BAD)
    }
}

fn req_ref_id(o: &Obj, k: &str) -> Result<String, Reason> {
    let s = req_str(o, k)?;
    if is_ref_id(s) {
        Ok(s.to_owned())
    } else {
        Err(BAD)
    }
}

fn opt_ref_id(o: &Obj, k: &str) -> Result<Option<String>, Reason> {
    match opt_str(o, k)? {
        None => Ok(None),
        Some(s) if is_ref_id(s) => Ok(Some(s.to_owned())),
        Some(_) => Err(BAD),
    }
}

fn req_version(o: &Obj, k: &str) -> Result<u64, Reason> {
    o.get(k).and_then(|v| json_int_in(v, 1, MAX_SEQ)).ok_or(BAD)
}

fn req_time(o: &Obj, k: &str) -> Result<Timestamp, Reason> {
    Timestamp::parse_rfc3339(req_str(o, k)?).map_err(|_| BAD)
}

/// The shape of a grant: every rule of mqtt.md 'Grant' that does not need
/// the config. Failing any of them is `invalid_grant`. Door names and the PIN
/// key id are checked afterwards by [`check_grant_refs`], so that a grant
/// that is both malformed and names an unknown door gets `invalid_grant`
/// (the page's order within step 4).
///
/// Beyond the page: a `pre_issued` grant must carry `reservation_id`. The
/// page says pre-issued keys carry it, and step 5 refuses a pre-issued key
/// whose reservation was checked in by looking up that reservation; a
/// pre-issued key without one would slip past the reservation tombstone.
fn parse_grant_shape(v: &Value) -> Result<Grant, Reason> {
    let o = v.as_object().ok_or(BAD)?;
    let key_id = req_key_id(o, "key_id")?;
    let version = req_version(o, "version")?;
    let state = match req_str(o, "state")? {
        "pre_issued" => GrantState::PreIssued,
        "active" => GrantState::Active,
        _ => return Err(BAD),
    };
    let check_in_id = opt_ref_id(o, "check_in_id")?;
    let reservation_id = opt_ref_id(o, "reservation_id")?;
    match state {
        GrantState::Active if check_in_id.is_none() => return Err(BAD),
        GrantState::PreIssued if reservation_id.is_none() => return Err(BAD),
        _ => {}
    }
    let doors_v = o.get("doors").and_then(Value::as_array).ok_or(BAD)?;
    if doors_v.is_empty() {
        return Err(BAD);
    }
    let mut doors = Vec::with_capacity(doors_v.len());
    let mut seen = BTreeSet::new();
    for d in doors_v {
        let d = d.as_str().ok_or(BAD)?;
        if !seen.insert(d) {
            return Err(BAD);
        }
        doors.push(d.to_owned());
    }
    let valid_from = req_time(o, "valid_from")?;
    let valid_until = req_time(o, "valid_until")?;
    if valid_from >= valid_until {
        return Err(BAD);
    }
    let pin_tag = crate::crypto::b64u_decode_32(req_str(o, "pin_tag")?)
        .map(PinTag)
        .ok_or(BAD)?;
    let pin_key_id = req_str(o, "pin_key_id")?.to_owned();
    let holder_ref = opt_ref_id(o, "holder_ref")?;
    let holder_name = match opt_str(o, "holder_name")? {
        None => None,
        Some(s) if is_text(s, 0) => Some(s.to_owned()),
        Some(_) => return Err(BAD),
    };
    let schedule = match o.get("schedule") {
        None | Some(Value::Null) => None,
        Some(v) => Some(Schedule::from_json(v).ok_or(BAD)?),
    };
    let max_uses = match o.get("max_uses") {
        None | Some(Value::Null) => None,
        Some(v) => Some(json_int_in(v, 1, u64::from(MAX_USES)).ok_or(BAD)? as u32),
    };
    Ok(Grant {
        key_id,
        version,
        state,
        check_in_id,
        reservation_id,
        doors,
        valid_from,
        valid_until,
        pin_tag,
        pin_key_id,
        holder_ref,
        holder_name,
        schedule,
        max_uses,
    })
}

/// The config-dependent grant rules, in the page's order: every door first
/// (`unknown_door`), then the PIN key (`unknown_pin_key`).
fn check_grant_refs(g: &Grant, ctx: &SchemaContext) -> Result<(), Reason> {
    if g.doors.iter().any(|d| !ctx.doors.contains(d)) {
        return Err(Reason::UnknownDoor);
    }
    if !ctx.pin_key_ids.contains(&g.pin_key_id) {
        return Err(Reason::UnknownPinKey);
    }
    Ok(())
}

/// One change (a top-level event or a batch item), `type` already read.
///
/// Malformed fields of non-grant changes (`key.revoked`, `guest.erased`)
/// are also `invalid_grant`: the contract has no other step-4 code for a
/// malformed field, and `bad_envelope` would wrongly tell the cloud that the
/// event was not authenticated (and so claimed nothing).
fn parse_change(ty: &str, o: &Obj, ctx: &SchemaContext) -> Result<Change, Reason> {
    let change = match ty {
        "key.issued" => {
            let key = parse_grant_shape(o.get("key").ok_or(BAD)?)?;
            let supersedes = match o.get("supersedes") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|v| v.as_str().filter(|s| is_key_id(s)).map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
                    .ok_or(BAD)?,
                Some(_) => return Err(BAD),
            };
            // Revoking the key being issued, in the same transaction, leaves
            // it final before it is written: a contradiction, not a request.
            if supersedes.contains(&key.key_id) {
                return Err(BAD);
            }
            check_grant_refs(&key, ctx)?;
            Change::KeyIssued { key, supersedes }
        }
        "key.revoked" => {
            let key_id = req_key_id(o, "key_id")?;
            let version = req_version(o, "version")?;
            let reason = req_str(o, "reason")?;
            if !is_text(reason, 1) {
                return Err(BAD);
            }
            Change::KeyRevoked {
                key_id,
                version,
                reason: reason.to_owned(),
            }
        }
        "checkin.completed" => {
            let reservation_id = req_ref_id(o, "reservation_id")?;
            let check_in_id = req_ref_id(o, "check_in_id")?;
            let mut key = parse_grant_shape(o.get("key").ok_or(BAD)?)?;
            // The page: the key is activated with the same check_in_id. A
            // body whose key says otherwise contradicts itself; the hub does
            // not guess which half the cloud meant.
            if key.state != GrantState::Active
                || key.check_in_id.as_deref() != Some(check_in_id.as_str())
            {
                return Err(BAD);
            }
            match key.reservation_id.as_deref() {
                None => key.reservation_id = Some(reservation_id.clone()),
                Some(r) if r == reservation_id => {}
                Some(_) => return Err(BAD),
            }
            check_grant_refs(&key, ctx)?;
            Change::CheckinCompleted {
                reservation_id,
                check_in_id,
                key,
            }
        }
        "guest.erased" => Change::GuestErased {
            holder_ref: req_ref_id(o, "holder_ref")?,
        },
        _ => return Err(Reason::UnsupportedType),
    };
    Ok(change)
}

/// Step 4: the body of an authenticated event, read against this hub's
/// doors and PIN keys.
///
/// - A batch holds 0..=[`MAX_BATCH_ITEMS`] items. The page says "up to 500";
///   an empty batch is a valid, signed request to change nothing (the store
///   answers it `noop`), and refusing it would only turn a harmless cloud
///   edge case into a rejection. More than 500 is `invalid_grant` with no
///   `item`.
/// - An item that is not an object, has no string `type`, or is a `batch` or
///   `checkpoint` is `unsupported_type` at its index: those are not types an
///   item may have.
/// - The first failing item, by index, decides: `SchemaError { reason, item }`.
/// - A body that is not a JSON object cannot reach here after
///   [`crate::verify::verify_envelope`]; if it does, it is `bad_envelope`.
pub fn parse_body(body: &[u8], ctx: &SchemaContext) -> Result<EventKind, SchemaError> {
    match parse_body_in_order(body, ctx)? {
        EventKind::BatchCutShort { invalid, .. } => Err(invalid),
        kind => Ok(kind),
    }
}

/// [`parse_body`] for the store: a batch whose item fails step 4 comes back
/// as [`EventKind::BatchCutShort`], with the items before it, so that an
/// earlier item failing a later step (5 to 7) is the one reported.
pub fn parse_body_in_order(body: &[u8], ctx: &SchemaContext) -> Result<EventKind, SchemaError> {
    let top = |reason| SchemaError { reason, item: None };
    let v = parse_json_strict(body).ok_or(top(Reason::BadEnvelope))?;
    let o = v.as_object().ok_or(top(Reason::BadEnvelope))?;
    let ty = o
        .get("type")
        .and_then(Value::as_str)
        .ok_or(top(Reason::BadEnvelope))?;
    match ty {
        "checkpoint" => {
            let head_seq = o
                .get("head_seq")
                .and_then(|v| json_int_in(v, 0, MAX_SEQ))
                .ok_or(top(BAD))?;
            let mirror = match o.get("mirror") {
                None | Some(Value::Null) => None,
                Some(v) => Some(crate::mirror::Claim::from_json(v).ok_or(top(BAD))?),
            };
            Ok(EventKind::Checkpoint { head_seq, mirror })
        }
        "mirror.request" => {
            let as_of = o
                .get("as_of")
                .and_then(Value::as_str)
                .and_then(|s| Timestamp::parse_rfc3339(s).ok())
                .ok_or(top(BAD))?;
            let list = o.get("buckets").and_then(Value::as_array).ok_or(top(BAD))?;
            if !(1..=MAX_REQUEST_BUCKETS).contains(&list.len()) {
                return Err(top(BAD));
            }
            let mut buckets = Vec::with_capacity(list.len());
            for b in list {
                let b = json_int_in(b, 0, 255).ok_or(top(BAD))? as u8;
                if buckets.contains(&b) {
                    return Err(top(BAD));
                }
                buckets.push(b);
            }
            Ok(EventKind::MirrorRequest { as_of, buckets })
        }
        "batch" => {
            let items = o.get("items").and_then(Value::as_array).ok_or(top(BAD))?;
            if items.len() > MAX_BATCH_ITEMS {
                return Err(top(BAD));
            }
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let parsed = item
                    .as_object()
                    .and_then(|io| Some((io, io.get("type").and_then(Value::as_str)?)))
                    .filter(|(_, ity)| *ity != "batch" && !has_no_seq(ity))
                    .ok_or(Reason::UnsupportedType)
                    .and_then(|(io, ity)| parse_change(ity, io, ctx));
                match parsed {
                    Ok(change) => out.push(change),
                    Err(reason) => {
                        return Ok(EventKind::BatchCutShort {
                            items: out,
                            invalid: SchemaError {
                                reason,
                                item: Some(i),
                            },
                        });
                    }
                }
            }
            Ok(EventKind::Batch(out))
        }
        _ => parse_change(ty, o, ctx).map(EventKind::Change).map_err(top),
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;
    use serde_json::json;

    const TAG: &str = "hvm_pP9YTc-eyIwtdnLrzLmxWn26dD2b6tlyRlDbl3Q";

    fn ctx() -> SchemaContext {
        SchemaContext::new(["101", "102"], ["k1"])
    }

    fn grant() -> Value {
        json!({
            "key_id": "k-1", "version": 1, "state": "active", "check_in_id": "c-1",
            "doors": ["101"], "valid_from": "2099-01-01T00:00:00Z",
            "valid_until": "2099-01-31T00:00:00Z", "pin_tag": TAG, "pin_key_id": "k1"
        })
    }

    fn grant_with(k: &str, v: Value) -> Value {
        let mut g = grant();
        g[k] = v;
        g
    }

    fn grant_without(k: &str) -> Value {
        let mut g = grant();
        g.as_object_mut().unwrap().remove(k);
        g
    }

    fn issued(key: Value) -> Value {
        json!({"type": "key.issued", "key": key})
    }

    fn parse(v: &Value) -> Result<EventKind, SchemaError> {
        parse_body(&serde_json::to_vec(v).unwrap(), &ctx())
    }

    fn err(v: &Value) -> Reason {
        let e = parse(v).expect_err("must be refused");
        assert_eq!(e.item, None);
        e.reason
    }

    fn issued_key(v: &Value) -> Grant {
        match parse(v).unwrap() {
            EventKind::Change(Change::KeyIssued { key, .. }) => key,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_well_formed_key_issued_parses_into_a_grant() {
        let mut g = grant();
        g["holder_ref"] = json!("g-1");
        g["holder_name"] = json!("Ada Guest");
        g["reservation_id"] = json!("r-1");
        g["future_field"] = json!({"x": 1});
        let key = issued_key(&issued(g));
        assert_eq!(key.key_id, "k-1");
        assert_eq!(key.version, 1);
        assert_eq!(key.state, GrantState::Active);
        assert_eq!(key.check_in_id.as_deref(), Some("c-1"));
        assert_eq!(key.reservation_id.as_deref(), Some("r-1"));
        assert_eq!(key.doors, ["101"]);
        assert_eq!(key.pin_tag.0, crate::crypto::b64u_decode_32(TAG).unwrap());
        assert_eq!(key.pin_key_id, "k1");
        assert_eq!(key.holder_ref.as_deref(), Some("g-1"));
        assert_eq!(key.holder_name.as_deref(), Some("Ada Guest"));
        assert!(key.valid_from < key.valid_until);
    }

    #[test]
    fn an_unknown_type_is_unsupported_type() {
        for ty in ["key.expired", "KEY.ISSUED", "", "batch.v2"] {
            assert_eq!(err(&json!({"type": ty})), Reason::UnsupportedType, "{ty}");
        }
    }

    #[test]
    fn key_ids_outside_the_alphabet_or_length_are_invalid_grant() {
        let long = "k".repeat(65);
        for id in ["", "k 1", "k/1", "ключ", "k\u{0}1", long.as_str()] {
            assert_eq!(
                err(&issued(grant_with("key_id", json!(id)))),
                Reason::InvalidGrant,
                "{id:?}"
            );
        }
        let max = "A.z_9-".repeat(10) + "abcd";
        assert_eq!(
            issued_key(&issued(grant_with("key_id", json!(max))))
                .key_id
                .len(),
            64
        );
    }

    #[test]
    fn a_version_that_is_not_an_integer_from_one_to_two_pow_53_minus_one_is_invalid_grant() {
        for v in [
            json!(0),
            json!(-1),
            json!(1.0),
            json!(MAX_SEQ + 1),
            json!(u64::MAX),
            json!("1"),
            Value::Null,
        ] {
            assert_eq!(
                err(&issued(grant_with("version", v.clone()))),
                Reason::InvalidGrant,
                "{v}"
            );
        }
        let body = br#"{"type":"key.issued","key":{"key_id":"k","version":1e400}}"#;
        assert!(parse_body(body, &ctx()).is_err());
        assert_eq!(
            issued_key(&issued(grant_with("version", json!(MAX_SEQ)))).version,
            MAX_SEQ
        );
    }

    #[test]
    fn a_state_other_than_pre_issued_or_active_is_invalid_grant() {
        for s in ["revoked", "expired", "ACTIVE", ""] {
            assert_eq!(
                err(&issued(grant_with("state", json!(s)))),
                Reason::InvalidGrant
            );
        }
    }

    #[test]
    fn an_active_grant_without_check_in_id_is_invalid_grant() {
        assert_eq!(
            err(&issued(grant_without("check_in_id"))),
            Reason::InvalidGrant
        );
        assert_eq!(
            err(&issued(grant_with("check_in_id", Value::Null))),
            Reason::InvalidGrant
        );
        assert_eq!(
            err(&issued(grant_with("check_in_id", json!("")))),
            Reason::InvalidGrant
        );
    }

    #[test]
    fn a_pre_issued_grant_must_name_its_reservation() {
        let mut g = grant_with("state", json!("pre_issued"));
        g.as_object_mut().unwrap().remove("check_in_id");
        assert_eq!(err(&issued(g.clone())), Reason::InvalidGrant);
        g["reservation_id"] = json!("r-1");
        let key = issued_key(&issued(g));
        assert_eq!(key.state, GrantState::PreIssued);
        assert_eq!(key.check_in_id, None);
    }

    #[test]
    fn doors_must_be_a_non_empty_list_of_distinct_strings() {
        for d in [
            json!([]),
            json!("101"),
            json!(["101", "101"]),
            json!([101]),
            Value::Null,
        ] {
            assert_eq!(
                err(&issued(grant_with("doors", d.clone()))),
                Reason::InvalidGrant,
                "{d}"
            );
        }
        assert_eq!(
            issued_key(&issued(grant_with("doors", json!(["102", "101"])))).doors,
            ["102", "101"]
        );
    }

    #[test]
    fn a_door_missing_from_the_config_is_unknown_door() {
        for d in [
            json!(["999"]),
            json!(["101", "999"]),
            json!([""]),
            json!(["101 "]),
        ] {
            assert_eq!(
                err(&issued(grant_with("doors", d.clone()))),
                Reason::UnknownDoor,
                "{d}"
            );
        }
    }

    #[test]
    fn the_window_must_be_two_rfc3339_instants_with_from_before_until() {
        let same = grant_with("valid_until", json!("2099-01-01T00:00:00Z"));
        assert_eq!(err(&issued(same)), Reason::InvalidGrant);
        let backwards = grant_with("valid_until", json!("2098-12-31T00:00:00Z"));
        assert_eq!(err(&issued(backwards)), Reason::InvalidGrant);
        // Compared as instants: 01:00+02:00 is before 00:00Z.
        let offset = grant_with("valid_until", json!("2099-01-01T01:00:00+02:00"));
        assert_eq!(err(&issued(offset)), Reason::InvalidGrant);
        let later = grant_with("valid_until", json!("2099-01-01T03:00:00+02:00"));
        assert!(parse(&issued(later)).is_ok());
        for bad in [
            json!("2099-01-31"),
            json!("tomorrow"),
            json!(4_070_908_800u64),
        ] {
            assert_eq!(
                err(&issued(grant_with("valid_from", bad))),
                Reason::InvalidGrant
            );
        }
    }

    #[test]
    fn a_pin_tag_that_is_not_base64url_of_32_bytes_is_invalid_grant() {
        let short = crate::crypto::b64u_encode(&[7; 31]);
        let long = crate::crypto::b64u_encode(&[7; 33]);
        let std = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, [0xfb; 32]);
        for (i, t) in [short.as_str(), long.as_str(), std.as_str(), "", "!!!"]
            .into_iter()
            .enumerate()
        {
            assert_eq!(
                err(&issued(grant_with("pin_tag", json!(t)))),
                Reason::InvalidGrant,
                "pin tag case {i}"
            );
        }
        let padded = format!("{TAG}=");
        assert!(parse(&issued(grant_with("pin_tag", json!(padded)))).is_ok());
    }

    #[test]
    fn a_pin_key_the_hub_does_not_have_is_unknown_pin_key() {
        assert_eq!(
            err(&issued(grant_with("pin_key_id", json!("k2")))),
            Reason::UnknownPinKey
        );
        assert_eq!(
            err(&issued(grant_with("pin_key_id", json!(1)))),
            Reason::InvalidGrant
        );
    }

    #[test]
    fn holder_fields_are_optional_bounded_strings() {
        assert!(parse(&issued(grant_with("holder_name", Value::Null))).is_ok());
        assert!(
            parse(&issued(grant_with(
                "holder_name",
                json!("Zoë O'Brien-Ñandú")
            )))
            .is_ok()
        );
        let long = "n".repeat(MAX_TEXT_CHARS + 1);
        for (k, v) in [
            ("holder_name", json!(long)),
            ("holder_name", json!(5)),
            ("holder_name", json!("Ada\u{0}Guest")),
            ("holder_ref", json!("")),
            ("holder_ref", json!("g".repeat(65))),
            ("holder_ref", json!(["g-1"])),
            ("reservation_id", json!(false)),
        ] {
            assert_eq!(
                err(&issued(grant_with(k, v.clone()))),
                Reason::InvalidGrant,
                "{k} = {v}"
            );
        }
    }

    #[test]
    fn schedule_and_max_uses_are_optional_and_read_as_sent() {
        let plain = issued_key(&issued(grant()));
        assert_eq!((plain.schedule, plain.max_uses), (None, None));
        let mut g = grant_with("schedule", Value::Null);
        g["max_uses"] = Value::Null;
        let nulls = issued_key(&issued(g));
        assert_eq!((nulls.schedule, nulls.max_uses), (None, None));
        let sched = json!([{"days": ["mon", "fri"], "from": "09:00", "until": "17:30"}]);
        let mut g = grant_with("schedule", sched.clone());
        g["max_uses"] = json!(2);
        let key = issued_key(&issued(g));
        assert_eq!(key.schedule.unwrap().to_json(), sched);
        assert_eq!(key.max_uses, Some(2));
        for n in [1, MAX_USES] {
            assert_eq!(
                issued_key(&issued(grant_with("max_uses", json!(n)))).max_uses,
                Some(n)
            );
        }
    }

    #[test]
    fn a_bad_schedule_or_max_uses_is_invalid_grant() {
        for (k, v) in [
            ("schedule", json!([])),
            (
                "schedule",
                json!({"days": ["mon"], "from": "09:00", "until": "10:00"}),
            ),
            (
                "schedule",
                json!([{"days": ["mon"], "from": "10:00", "until": "09:00"}]),
            ),
            (
                "schedule",
                json!([{"days": ["mon", "mon"], "from": "09:00", "until": "10:00"}]),
            ),
            ("schedule", json!("mon-fri 09:00-17:30")),
            ("max_uses", json!(0)),
            ("max_uses", json!(MAX_USES + 1)),
            ("max_uses", json!(-1)),
            ("max_uses", json!(2.0)),
            ("max_uses", json!("2")),
        ] {
            assert_eq!(
                err(&issued(grant_with(k, v.clone()))),
                Reason::InvalidGrant,
                "{k} = {v}"
            );
        }
    }

    #[test]
    fn a_missing_or_non_object_key_is_invalid_grant() {
        assert_eq!(err(&json!({"type": "key.issued"})), Reason::InvalidGrant);
        assert_eq!(err(&issued(json!("k-1"))), Reason::InvalidGrant);
        for k in [
            "key_id",
            "version",
            "state",
            "doors",
            "valid_from",
            "valid_until",
            "pin_tag",
            "pin_key_id",
        ] {
            assert_eq!(err(&issued(grant_without(k))), Reason::InvalidGrant, "{k}");
        }
    }

    #[test]
    fn within_one_event_invalid_grant_beats_unknown_door_which_beats_unknown_pin_key() {
        let mut g = grant_with("doors", json!(["999"]));
        g["pin_key_id"] = json!("k9");
        assert_eq!(err(&issued(g.clone())), Reason::UnknownDoor);
        g["version"] = json!(0);
        assert_eq!(err(&issued(g.clone())), Reason::InvalidGrant);
        // A malformed `supersedes` is also judged before the doors.
        let mut e = issued(grant_with("doors", json!(["999"])));
        e["supersedes"] = json!(["bad id"]);
        assert_eq!(err(&e), Reason::InvalidGrant);
    }

    #[test]
    fn supersedes_is_an_optional_list_of_key_ids_other_than_the_key_itself() {
        let mut e = issued(grant());
        e["supersedes"] = json!(["k-0", "k-old"]);
        match parse(&e).unwrap() {
            EventKind::Change(Change::KeyIssued { supersedes, .. }) => {
                assert_eq!(supersedes, ["k-0", "k-old"])
            }
            other => panic!("{other:?}"),
        }
        e["supersedes"] = Value::Null;
        assert!(parse(&e).is_ok());
        for bad in [json!("k-0"), json!([1]), json!([""]), json!(["k-1"])] {
            e["supersedes"] = bad.clone();
            assert_eq!(err(&e), Reason::InvalidGrant, "{bad}");
        }
    }

    #[test]
    fn key_revoked_needs_a_key_id_a_version_and_a_reason() {
        let ok =
            json!({"type": "key.revoked", "key_id": "k-1", "version": 3, "reason": "checkout"});
        assert_eq!(
            parse(&ok).unwrap(),
            EventKind::Change(Change::KeyRevoked {
                key_id: "k-1".into(),
                version: 3,
                reason: "checkout".into()
            })
        );
        for (k, v) in [
            ("key_id", json!("k 1")),
            ("version", json!(0)),
            ("version", json!(2.5)),
            ("reason", json!("")),
            ("reason", json!("r".repeat(MAX_TEXT_CHARS + 1))),
            ("reason", Value::Null),
        ] {
            let mut e = ok.clone();
            e[k] = v.clone();
            assert_eq!(err(&e), Reason::InvalidGrant, "{k} = {v}");
        }
    }

    fn checkin(key: Value) -> Value {
        json!({"type": "checkin.completed", "reservation_id": "r-1", "check_in_id": "c-1", "key": key})
    }

    #[test]
    fn checkin_completed_activates_a_key_with_the_same_check_in_and_reservation() {
        match parse(&checkin(grant())).unwrap() {
            EventKind::Change(Change::CheckinCompleted {
                reservation_id,
                check_in_id,
                key,
            }) => {
                assert_eq!(
                    (reservation_id.as_str(), check_in_id.as_str()),
                    ("r-1", "c-1")
                );
                // The key is filled in with the reservation it belongs to.
                assert_eq!(key.reservation_id.as_deref(), Some("r-1"));
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(&checkin(grant_with("reservation_id", json!("r-1")))).is_ok());
    }

    #[test]
    fn a_checkin_whose_key_is_pre_issued_or_names_another_check_in_or_reservation_is_invalid_grant()
    {
        let mut pre = grant_with("state", json!("pre_issued"));
        pre["reservation_id"] = json!("r-1");
        assert_eq!(err(&checkin(pre)), Reason::InvalidGrant);
        assert_eq!(
            err(&checkin(grant_with("check_in_id", json!("c-2")))),
            Reason::InvalidGrant
        );
        assert_eq!(
            err(&checkin(grant_with("reservation_id", json!("r-2")))),
            Reason::InvalidGrant
        );
        let mut e = checkin(grant());
        e.as_object_mut().unwrap().remove("reservation_id");
        assert_eq!(err(&e), Reason::InvalidGrant);
        assert_eq!(
            err(&checkin(grant_with("doors", json!(["999"])))),
            Reason::UnknownDoor
        );
    }

    #[test]
    fn guest_erased_needs_a_holder_ref() {
        assert_eq!(
            parse(&json!({"type": "guest.erased", "holder_ref": "g-1"})).unwrap(),
            EventKind::Change(Change::GuestErased {
                holder_ref: "g-1".into()
            })
        );
        for v in [json!(""), Value::Null, json!(1)] {
            assert_eq!(
                err(&json!({"type": "guest.erased", "holder_ref": v})),
                Reason::InvalidGrant
            );
        }
    }

    #[test]
    fn a_checkpoint_carries_a_head_seq_of_zero_or_more() {
        for n in [0, 12, MAX_SEQ] {
            assert_eq!(
                parse(&json!({"type": "checkpoint", "head_seq": n})).unwrap(),
                EventKind::Checkpoint {
                    head_seq: n,
                    mirror: None
                }
            );
        }
        for v in [
            json!(-1),
            json!(1.5),
            json!(MAX_SEQ + 1),
            json!("3"),
            Value::Null,
        ] {
            assert_eq!(
                err(&json!({"type": "checkpoint", "head_seq": v})),
                Reason::InvalidGrant
            );
        }
        assert_eq!(err(&json!({"type": "checkpoint"})), Reason::InvalidGrant);
    }

    fn batch(items: Vec<Value>) -> Value {
        json!({"type": "batch", "items": items})
    }

    fn revoke(id: &str) -> Value {
        json!({"type": "key.revoked", "key_id": id, "version": 1, "reason": "x"})
    }

    #[test]
    fn a_batch_parses_its_items_in_order() {
        let kind = parse(&batch(vec![issued(grant()), revoke("k-2")])).unwrap();
        match kind {
            EventKind::Batch(items) => {
                assert_eq!(items.len(), 2);
                assert!(matches!(items[0], Change::KeyIssued { .. }));
                assert!(matches!(items[1], Change::KeyRevoked { .. }));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_batch_failing_step_four_keeps_the_items_before_it_for_the_store() {
        let mut bad = grant();
        bad["doors"] = json!(["999"]);
        let body = batch(vec![
            revoke("k-0"),
            issued(grant()),
            issued(bad),
            revoke("k-9"),
        ]);
        let bytes = serde_json::to_vec(&body).unwrap();
        let invalid = SchemaError {
            reason: Reason::UnknownDoor,
            item: Some(2),
        };
        match parse_body_in_order(&bytes, &ctx()).unwrap() {
            EventKind::BatchCutShort { items, invalid: e } => {
                assert_eq!(e, invalid);
                assert_eq!(items.len(), 2);
                assert!(matches!(items[0], Change::KeyRevoked { .. }));
                assert!(matches!(items[1], Change::KeyIssued { .. }));
            }
            other => panic!("{other:?}"),
        }
        // The pure step-4 answer is unchanged.
        assert_eq!(parse_body(&bytes, &ctx()), Err(invalid));
    }

    #[test]
    fn an_empty_batch_is_accepted_and_more_than_500_items_is_invalid_grant() {
        assert_eq!(parse(&batch(vec![])).unwrap(), EventKind::Batch(vec![]));
        assert!(parse(&batch(vec![revoke("k-1"); MAX_BATCH_ITEMS])).is_ok());
        assert_eq!(
            err(&batch(vec![revoke("k-1"); MAX_BATCH_ITEMS + 1])),
            Reason::InvalidGrant
        );
        assert_eq!(err(&json!({"type": "batch"})), Reason::InvalidGrant);
        assert_eq!(
            err(&json!({"type": "batch", "items": {}})),
            Reason::InvalidGrant
        );
    }

    #[test]
    fn the_first_failing_batch_item_gives_the_reason_and_its_index() {
        let mut bad_door = issued(grant_with("doors", json!(["999"])));
        bad_door["type"] = json!("key.issued");
        let e = parse(&batch(vec![
            revoke("k-1"),
            bad_door,
            json!({"type": "nope"}),
        ]))
        .unwrap_err();
        assert_eq!(
            e,
            SchemaError {
                reason: Reason::UnknownDoor,
                item: Some(1)
            }
        );
        let e = parse(&batch(vec![revoke("k-1"), revoke("k-2"), revoke("bad id")])).unwrap_err();
        assert_eq!(
            e,
            SchemaError {
                reason: Reason::InvalidGrant,
                item: Some(2)
            }
        );
    }

    #[test]
    fn nested_batches_checkpoints_and_typeless_items_are_unsupported_type_at_their_index() {
        for item in [
            batch(vec![revoke("k-1")]),
            json!({"type": "checkpoint", "head_seq": 1}),
            json!({"key_id": "k-1"}),
            json!({"type": 7}),
            json!("key.revoked"),
            json!(null),
        ] {
            assert_eq!(
                parse(&batch(vec![revoke("k-0"), item.clone()])),
                Err(SchemaError {
                    reason: Reason::UnsupportedType,
                    item: Some(1)
                }),
                "{item}"
            );
        }
    }

    #[test]
    fn the_strict_parser_refuses_duplicate_keys_at_any_depth() {
        assert!(parse_json_strict(br#"{"a":1,"b":{"c":[{"d":1,"e":2}]}}"#).is_some());
        assert!(parse_json_strict(br#"{"a":1,"a":1}"#).is_none());
        assert!(parse_json_strict(br#"{"a":1,"\u0061":1}"#).is_none());
        assert!(parse_json_strict(br#"[{"x":{"y":1,"y":2}}]"#).is_none());
        assert!(parse_json_strict(br#"{"a":"\ud800"}"#).is_none());
        assert!(parse_json_strict(b"{\"a\":1e400}").is_none());
        assert!(parse_json_strict(b"{\"a\":18446744073709551616}").unwrap()["a"].is_f64());
    }

    #[test]
    fn duplicate_keys_in_a_grant_are_refused_by_parse_body_too() {
        let body = br#"{"type":"guest.erased","holder_ref":"g-1","holder_ref":"g-2"}"#;
        assert_eq!(
            parse_body(body, &ctx()).unwrap_err().reason,
            Reason::BadEnvelope
        );
    }

    #[test]
    fn names_are_any_1_to_64_characters_without_control_characters_or_surrounding_spaces() {
        for ok in ["101", "Room 101", "Tür 3", "board-a", &"é".repeat(64)] {
            assert!(is_name(ok), "{ok:?}");
        }
        for bad in ["", " 101", "101 ", "a\tb", "a\nb", "nul\0", &"a".repeat(65)] {
            assert!(!is_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_result_body_is_the_pages_shape_and_parses_back() {
        let r = EventResult {
            event_id: parse_uuid_strict("00000001-94a1-4c39-8f5e-6b1e2d3c4a0f"),
            seq: Some(17),
            outcome: Outcome::Rejected,
            reason: Some(Reason::UnknownDoor),
            duplicate: false,
            clamped: false,
            at: Timestamp::from_secs(1_795_953_600),
            valid_until: None,
            item: Some(1),
            items: Some(vec![
                ItemResult {
                    outcome: Outcome::Applied,
                    reason: None,
                    valid_until: None,
                },
                ItemResult {
                    outcome: Outcome::Rejected,
                    reason: Some(Reason::UnknownDoor),
                    valid_until: None,
                },
            ]),
        };
        assert_eq!(
            String::from_utf8(r.to_json()).unwrap(),
            r#"{"event_id":"00000001-94a1-4c39-8f5e-6b1e2d3c4a0f","seq":17,"outcome":"rejected","reason":"unknown_door","duplicate":false,"clamped":false,"at":"2026-11-29T12:00:00.000000Z","item":1,"items":[{"outcome":"applied","reason":null},{"outcome":"rejected","reason":"unknown_door"}]}"#
        );
        assert_eq!(
            serde_json::from_slice::<EventResult>(&r.to_json()).unwrap(),
            r
        );
        let single = EventResult {
            item: None,
            items: None,
            ..r
        };
        let text = String::from_utf8(single.to_json()).unwrap();
        assert!(!text.contains("item"), "{text}");
        assert_eq!(serde_json::from_str::<EventResult>(&text).unwrap(), single);
        assert!(
            serde_json::from_str::<EventResult>(&text.replace("unknown_door", "nope")).is_err()
        );
        let clamped = EventResult {
            outcome: Outcome::Applied,
            reason: None,
            clamped: true,
            valid_until: Some(Timestamp::from_secs(1_796_385_600)),
            ..single
        };
        let text = String::from_utf8(clamped.to_json()).unwrap();
        assert!(
            text.ends_with(r#""clamped":true,"at":"2026-11-29T12:00:00.000000Z","valid_until":"2026-12-04T12:00:00.000000Z"}"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<EventResult>(&text).unwrap(), clamped);
    }

    #[test]
    fn a_checkpoints_mirror_claim_is_optional_and_checked() {
        let claim = json!({"as_of": "2026-12-04T12:00:00Z", "count": 2,
                           "digest": "k9qDvy-4VLGaYbKz2gSJrRW7-eyIlf55eANq-XSx_R0"});
        match parse(&json!({"type": "checkpoint", "head_seq": 3, "mirror": claim})).unwrap() {
            EventKind::Checkpoint {
                head_seq: 3,
                mirror: Some(c),
            } => {
                assert_eq!(c.count, 2);
                assert_eq!(
                    c.as_of,
                    Timestamp::parse_rfc3339("2026-12-04T12:00:00Z").unwrap()
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse(&json!({"type": "checkpoint", "head_seq": 3, "mirror": null})).unwrap(),
            EventKind::Checkpoint {
                head_seq: 3,
                mirror: None
            }
        );
        for bad in [
            json!("x"),
            json!({"as_of": "2026-12-04T12:00:00.250Z", "count": 2, "digest": claim["digest"]}),
            json!({"as_of": "2026-12-04T12:00:00Z", "count": 2, "digest": "short"}),
        ] {
            assert_eq!(
                err(&json!({"type": "checkpoint", "head_seq": 3, "mirror": bad})),
                Reason::InvalidGrant,
                "{bad}"
            );
        }
    }

    #[test]
    fn a_mirror_request_asks_for_1_to_16_distinct_buckets_as_of_an_instant() {
        let ok = json!({"type": "mirror.request", "as_of": "2026-12-04T12:00:00Z", "buckets": [17, 0, 255]});
        assert_eq!(
            parse(&ok).unwrap(),
            EventKind::MirrorRequest {
                as_of: Timestamp::parse_rfc3339("2026-12-04T12:00:00Z").unwrap(),
                buckets: vec![17, 0, 255]
            }
        );
        let sixteen: Vec<u8> = (0..16).collect();
        let mut e = ok.clone();
        e["buckets"] = json!(sixteen);
        assert!(parse(&e).is_ok());
        for (k, bad) in [
            ("buckets", json!([])),
            ("buckets", json!((0..17).collect::<Vec<u8>>())),
            ("buckets", json!([3, 3])),
            ("buckets", json!([256])),
            ("buckets", json!([-1])),
            ("buckets", json!(["3"])),
            ("buckets", Value::Null),
            ("as_of", json!("soon")),
            ("as_of", Value::Null),
        ] {
            let mut e = ok.clone();
            e[k] = bad.clone();
            assert_eq!(err(&e), Reason::InvalidGrant, "{k} = {bad}");
        }
        // Not a batch item: it has no seq of its own.
        assert_eq!(
            parse(&batch(vec![ok])).unwrap_err(),
            SchemaError {
                reason: Reason::UnsupportedType,
                item: Some(0)
            }
        );
    }

    #[test]
    fn uuids_are_accepted_only_hyphenated_in_either_case() {
        let id = "00000001-94a1-4c39-8f5e-6b1e2d3c4a0f";
        assert_eq!(parse_uuid_strict(id), parse_uuid_strict(&id.to_uppercase()));
        assert!(parse_uuid_strict(id).is_some());
        assert!(parse_uuid_strict("0000000194a14c398f5e6b1e2d3c4a0f").is_none());
        assert!(parse_uuid_strict("00000001-94a1-4c39-8f5e-6b1e2d3c4a0f\n").is_none());
        assert!(parse_uuid_strict("00000001-94a1-4c39-8f5e+6b1e2d3c4a0f").is_none());
        assert!(parse_uuid_strict("0000000é-94a1-4c39-8f5e-6b1e2d3c4a0").is_none());
    }

    #[test]
    fn only_a_new_highest_seq_or_a_fresh_checkpoint_is_a_sign_of_life() {
        let now = Timestamp::from_secs(1_000_000);
        let ev = |seq, highest_before| Evidence::Event {
            seq,
            highest_before,
        };
        assert!(ev(8, 7).is_sign_of_life(now, 900));
        assert!(ev(20, 7).is_sign_of_life(now, 900), "above a gap: new");
        assert!(!ev(7, 7).is_sign_of_life(now, 900), "a stale_seq replay");
        assert!(!ev(3, 7).is_sign_of_life(now, 900), "a stale_seq replay");
        assert!(
            !ev(9, 12).is_sign_of_life(now, 900),
            "a re-sent event filling a gap"
        );
        assert!(!Evidence::SeenBefore.is_sign_of_life(now, 900));
        let cp = |age_s: i64| Evidence::Checkpoint {
            issued_at: Timestamp::from_secs(1_000_000 - age_s),
        };
        assert!(cp(0).is_sign_of_life(now, 900));
        assert!(cp(900).is_sign_of_life(now, 900));
        assert!(!cp(901).is_sign_of_life(now, 900), "an old checkpoint");
        assert!(!cp(-901).is_sign_of_life(now, 900), "issued far ahead");
    }
}
