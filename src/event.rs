//! The cloud's key events as plain data, and what the hub answers.
//!
//! An event arrives as a signed envelope ([`crate::verify`] checks it); once
//! its signature holds, its body is parsed here into an [`Event`]. Nothing in
//! this module touches the database: the store turns an [`Event`] into
//! changes, and every answer it gives is an [`EventResult`] built from the
//! stable codes below. Those codes are a contract with the cloud team
//! (mqtt.md 'Deciding an event'): never rename one.

use crate::time::Timestamp;
use serde::Serialize;
use uuid::Uuid;

/// What happened to an event (mqtt.md 'Results').
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrantState {
    PreIssued,
    Active,
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
}

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    Change(Change),
    /// Up to [`MAX_BATCH_ITEMS`] changes in one transaction.
    Batch(Vec<Change>),
    Checkpoint {
        head_seq: u64,
    },
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ItemResult {
    pub outcome: Outcome,
    pub reason: Option<Reason>,
}

/// The body of a result message (mqtt.md 'Results').
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventResult {
    /// `None` when a step-1 rejection could not read an id.
    pub event_id: Option<Uuid>,
    pub seq: Option<u64>,
    pub outcome: Outcome,
    pub reason: Option<Reason>,
    pub duplicate: bool,
    pub clamped: bool,
    #[serde(serialize_with = "ser_ts")]
    pub at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub item: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<ItemResult>>,
}

fn ser_ts<S: serde::Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&t.to_rfc3339())
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
