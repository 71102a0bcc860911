//! Step 1 of every cloud event: is this message genuine, and is it for us?
//!
//! Pure: bytes in, a [`VerifiedEvent`] or a stable [`Reason`] out. The size
//! limit comes before any parsing, the signature before the body is parsed,
//! and the body's ids are bound to this hub before anything is claimed.
//!
//! Every step-1 rejection means "nothing is claimed or counted" (mqtt.md
//! 'Deciding an event'): a forged or misrouted message must not block the
//! genuine event with the same id. So nothing from an unauthenticated
//! envelope leaves this module except the reason and an id *hint* used only
//! to correlate the rate-limited result.

use crate::config::Signer;
use crate::crypto;
use crate::event::{
    EventHeader, MAX_SEQ, Reason, json_int_in, parse_json_strict, parse_uuid_strict,
};
use crate::time::Timestamp;
use serde_json::Value;
use uuid::Uuid;

/// The largest cloud envelope the hub will look at (mqtt.md 'Envelopes').
pub const MAX_ENVELOPE_BYTES: usize = 1024 * 1024;

/// How long before a signer's `not_after` the hub starts warning
/// (mqtt.md 'Alerts', `signer_expiring`).
pub const SIGNER_EXPIRING_DAYS: i64 = 30;

/// An authenticated event, addressed to this hub: from step 2 on it claims
/// its id and counts toward the watermark, whatever else happens to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedEvent {
    pub header: EventHeader,
    /// The exact signed bytes; parsed again by [`crate::event`], never re-serialised.
    pub body: Vec<u8>,
    /// SHA-256 of `body`: the dedupe fingerprint.
    pub body_sha256: [u8; 32],
    /// The trust-ring id that signed it.
    pub signer: String,
}

/// What step 1 needs to know about this hub. `now` is the hub's effective
/// time, used only to retire signers past their `not_after`.
#[derive(Debug, Clone, Copy)]
pub struct VerifyContext<'a> {
    pub ring: &'a [Signer],
    pub site_id: Uuid,
    pub hub_id: &'a str,
    pub now: Timestamp,
}

/// A step-1 rejection. Its Display names only the reason: an unauthenticated
/// message's content is never echoed into logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("event rejected at step 1: {}", .reason.as_str())]
pub struct Rejection {
    pub reason: Reason,
    /// The envelope's `event_id`, when it was a well-formed UUID. Unsigned:
    /// good for correlating the result the cloud gets, never for claiming.
    pub event_id_hint: Option<Uuid>,
}

/// Verifies a cloud envelope, in the contract's order, and returns the
/// authenticated, correctly addressed event.
///
/// Order and the choices the page leaves open:
/// 1. Over [`MAX_ENVELOPE_BYTES`]: `payload_too_large`, before any parsing.
/// 2. Not JSON, not an object, duplicate keys anywhere, or `v` missing or
///    not an integer: `bad_envelope`. (`v` as a huge integer literal, which
///    serde_json reads as a float, is not an integer either.)
/// 3. `v != 1`: `unsupported_version`. This is checked *before* the other
///    v1 fields, so that a future envelope version with a different shape
///    is told "unsupported version" rather than "malformed".
/// 4. `event_id`, `signer`, `body`, `sig` not strings, or `event_id` not a
///    hyphenated UUID: `bad_envelope`. Unknown envelope fields are ignored.
/// 5. `signer` not in the ring, or the effective time is past its
///    `not_after` (the instant itself still counts as valid): `unknown_signer`.
/// 6. `body` or `sig` not base64url (padding accepted, the standard
///    alphabet refused), or `sig` not exactly 64 bytes: `bad_envelope`.
///    A signature of the wrong length is an encoding fault of the envelope,
///    like bad base64, not a signature that failed to verify: the cloud team
///    debugs an encoder when it sees `bad_envelope`/`malformed_event`, and
///    keeps `bad_signature` (and its alert) for well-formed signatures the
///    key does not vouch for, which is what forgery looks like.
/// 7. `verify_strict` over `"lockhub-event-v1" || 0x00 || body` fails:
///    `bad_signature` (non-canonical `s`, small-order keys and points
///    included).
/// 8. Only now the body is parsed: not UTF-8 JSON, not an object, duplicate
///    keys, or a malformed header (see [`parse_header`]): `bad_envelope`.
/// 9. Body `event_id` != envelope `event_id` (as UUIDs, so case-insensitive):
///    `event_id_mismatch`; then `site_id` (as a UUID): `wrong_site`; then
///    `hub_id` (exact, case-sensitive, as in topics): `wrong_hub`.
pub fn verify_envelope(raw: &[u8], ctx: &VerifyContext<'_>) -> Result<VerifiedEvent, Rejection> {
    if raw.len() > MAX_ENVELOPE_BYTES {
        return Err(Rejection {
            reason: Reason::PayloadTooLarge,
            event_id_hint: None,
        });
    }
    let reject = |reason, event_id_hint| Rejection {
        reason,
        event_id_hint,
    };
    let env = parse_json_strict(raw).ok_or(reject(Reason::BadEnvelope, None))?;
    let env = env.as_object().ok_or(reject(Reason::BadEnvelope, None))?;
    let hint = env
        .get("event_id")
        .and_then(Value::as_str)
        .and_then(parse_uuid_strict);
    let bad = reject(Reason::BadEnvelope, hint);

    let v = env.get("v").and_then(Value::as_number).ok_or(bad)?;
    if !(v.is_u64() || v.is_i64()) {
        return Err(bad);
    }
    if v.as_u64() != Some(1) {
        return Err(reject(Reason::UnsupportedVersion, hint));
    }
    let str_field = |k: &str| env.get(k).and_then(Value::as_str).ok_or(bad);
    let env_event_id = parse_uuid_strict(str_field("event_id")?).ok_or(bad)?;
    let signer_id = str_field("signer")?;
    let body_b64 = str_field("body")?;
    let sig_b64 = str_field("sig")?;

    let signer = ctx
        .ring
        .iter()
        .find(|s| s.id == signer_id)
        .filter(|s| s.not_after.is_none_or(|t| ctx.now <= t))
        .ok_or(reject(Reason::UnknownSigner, hint))?;

    let body = crypto::b64u_decode(body_b64).ok_or(bad)?;
    let sig: [u8; 64] = crypto::b64u_decode(sig_b64)
        .and_then(|s| s.try_into().ok())
        .ok_or(bad)?;
    if !crypto::verify(crypto::EVENT_CONTEXT, &signer.public_key, &body, &sig) {
        return Err(reject(Reason::BadSignature, hint));
    }

    // Authenticated bytes from here on; still not trusted until their header
    // names this hub.
    let parsed = parse_header(&body).ok_or(bad)?;
    if parsed.header.event_id != env_event_id {
        return Err(reject(Reason::EventIdMismatch, hint));
    }
    if parsed.site_id != ctx.site_id {
        return Err(reject(Reason::WrongSite, hint));
    }
    if parsed.hub_id != ctx.hub_id {
        return Err(reject(Reason::WrongHub, hint));
    }
    Ok(VerifiedEvent {
        header: parsed.header,
        body_sha256: crypto::sha256(&body),
        body,
        signer: signer.id.clone(),
    })
}

struct ParsedHeader {
    header: EventHeader,
    site_id: Uuid,
    hub_id: String,
}

/// The body's header (mqtt.md 'Body of a cloud event'), or `None` when it is
/// malformed:
/// - `event_id`, `site_id`: hyphenated UUID strings;
/// - `hub_id`, `type`: strings (their values are judged later: `wrong_hub`,
///   `unsupported_type`);
/// - `issued_at`: RFC 3339;
/// - `seq`: an integer in 1..=2^53-1. Required unless `type` is
///   `checkpoint`; a `checkpoint` must *not* carry one (the page: "no `seq`
///   of its own"). Accepting one would let a checkpoint move the watermark,
///   which is what the missing events would have done; refusing is the
///   visible choice. `null` counts as absent.
fn parse_header(body: &[u8]) -> Option<ParsedHeader> {
    let v = parse_json_strict(body)?;
    let o = v.as_object()?;
    let s = |k: &str| o.get(k).and_then(Value::as_str);
    let event_id = parse_uuid_strict(s("event_id")?)?;
    let site_id = parse_uuid_strict(s("site_id")?)?;
    let hub_id = s("hub_id")?.to_owned();
    let ty = s("type")?;
    let issued_at = Timestamp::parse_rfc3339(s("issued_at")?).ok()?;
    let seq = match o.get("seq") {
        None | Some(Value::Null) => None,
        Some(n) => Some(json_int_in(n, 1, MAX_SEQ)?),
    };
    if (ty == "checkpoint") != seq.is_none() {
        return None;
    }
    Some(ParsedHeader {
        header: EventHeader {
            event_id,
            seq,
            issued_at,
        },
        site_id,
        hub_id,
    })
}

/// The ids of signers whose `not_after` is at most 30 days after `now` and
/// not yet passed: the sync layer raises `signer_expiring` for them.
///
/// A signer already past `not_after` is not listed: it is simply no longer
/// trusted (its envelopes get `unknown_signer`), and an old signer left in
/// the ring after a rotation would otherwise hold the alert raised forever.
/// Signers without `not_after` never expire.
pub fn signer_expiring(ring: &[Signer], now: Timestamp) -> Vec<&str> {
    ring.iter()
        .filter(|s| {
            s.not_after
                .is_some_and(|t| now <= t && now >= t.saturating_add_days(-SIGNER_EXPIRING_DAYS))
        })
        .map(|s| s.id.as_str())
        .collect()
}
