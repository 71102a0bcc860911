//! The hub's small cryptographic vocabulary, in one place so every caller
//! uses the same encoding and the same domain separation.
//!
//! - base64url: the wire encoding of bodies, signatures, keys and PIN tags.
//! - PIN tags: HMAC-SHA256 under a per-hub PIN key over the ASCII digits.
//!   The hub never stores or logs a PIN; it only computes tags to compare.
//! - Signatures: Ed25519, always with a context prefix and a 0x00 separator so
//!   a cloud signature can never be replayed as a hub signature or vice versa.

use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use hmac::{KeyInit, Mac};
use sha2::{Digest, Sha256};

/// The version of both envelopes (the cloud's and the hub's): what `v` says
/// in every envelope made here, and the only one an opener accepts.
pub const ENVELOPE_VERSION: u64 = 1;

/// Domain separator for cloud event signatures.
pub const EVENT_CONTEXT: &[u8] = b"lockhub-event-v1";
/// Domain separator for everything the hub signs.
pub const HUB_CONTEXT: &[u8] = b"lockhub-hub-v1";

const B64U_ENCODE: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_encode_padding(false),
);
/// Decoders accept padding but do not require it (mqtt.md 'Envelopes').
const B64U_DECODE: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Encodes as base64url without padding.
pub fn b64u_encode(bytes: &[u8]) -> String {
    B64U_ENCODE.encode(bytes)
}

/// Decodes base64url, with or without padding. Standard-alphabet input
/// (`+`, `/`) is refused: the contract names base64url only.
pub fn b64u_decode(s: &str) -> Option<Vec<u8>> {
    B64U_DECODE.decode(s).ok()
}

/// Decodes base64url into exactly 32 bytes.
pub fn b64u_decode_32(s: &str) -> Option<[u8; 32]> {
    b64u_decode(s)?.try_into().ok()
}

/// HMAC-SHA256(PIN key, ASCII digits): what a grant's `pin_tag` holds.
pub fn pin_tag(pin_key: &[u8; 32], digits: &[u8]) -> [u8; 32] {
    let mut mac = <hmac::Hmac<Sha256> as KeyInit>::new_from_slice(pin_key)
        .expect("HMAC accepts keys of any length");
    mac.update(digits);
    mac.finalize().into_bytes().into()
}

/// SHA-256 of a body: the dedupe table's fingerprint of an event.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Why a public key was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("not base64url of 32 bytes")]
    NotThirtyTwoBytes,
    #[error("not a valid Ed25519 point")]
    InvalidPoint,
    #[error("a weak (small-order) Ed25519 key")]
    Weak,
}

/// Parses a trust-ring key: 32 bytes, a valid point, not of small order.
/// `verify_strict` would refuse every signature under a weak key anyway;
/// refusing it at load makes the installer's mistake visible at once.
pub fn parse_public_key(b64u: &str) -> Result<VerifyingKey, KeyError> {
    let bytes = b64u_decode_32(b64u).ok_or(KeyError::NotThirtyTwoBytes)?;
    let key = VerifyingKey::from_bytes(&bytes).map_err(|_| KeyError::InvalidPoint)?;
    if key.is_weak() {
        return Err(KeyError::Weak);
    }
    Ok(key)
}

/// The message a signature covers: `context || 0x00 || body`.
fn signed_message(context: &[u8], body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(context.len() + 1 + body.len());
    m.extend_from_slice(context);
    m.push(0);
    m.extend_from_slice(body);
    m
}

/// Strict Ed25519 verification under a domain context.
pub fn verify(context: &[u8], key: &VerifyingKey, body: &[u8], sig: &[u8; 64]) -> bool {
    let sig = Signature::from_bytes(sig);
    key.verify_strict(&signed_message(context, body), &sig)
        .is_ok()
}

/// Signs a body under a domain context.
pub fn sign(context: &[u8], key: &SigningKey, body: &[u8]) -> [u8; 64] {
    key.sign(&signed_message(context, body)).to_bytes()
}

/// A hub envelope (`{"v":1,"hub_id":..,"body":..,"sig":..}`) around a body.
pub fn hub_envelope(hub_id: &str, key: &SigningKey, body: &[u8]) -> Vec<u8> {
    let sig = sign(HUB_CONTEXT, key, body);
    serde_json::to_vec(&serde_json::json!({
        "v": ENVELOPE_VERSION,
        "hub_id": hub_id,
        "body": b64u_encode(body),
        "sig": b64u_encode(&sig),
    }))
    .unwrap_or_default()
}

/// Why a hub envelope was refused by [`open_hub_envelope`]. Names only the
/// part that failed: never the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("not a JSON object")]
    NotJson,
    #[error("not envelope version {ENVELOPE_VERSION}")]
    Version,
    #[error("another hub's envelope")]
    HubId,
    #[error("body is not base64url")]
    Body,
    #[error("sig is not base64url of 64 bytes")]
    Sig,
    #[error("the signature does not verify under the hub's key")]
    BadSignature,
}

/// Opens a hub envelope made by [`hub_envelope`]: version 1, `hub_id` as
/// expected, and a signature by `key` over the exact body bytes under
/// [`HUB_CONTEXT`] (`verify_strict`). Returns the body bytes, as signed.
/// What the cloud does with every hub message; the tests, benches and demo
/// stand for the cloud and use this one.
pub fn open_hub_envelope(
    payload: &[u8],
    hub_id: &str,
    key: &VerifyingKey,
) -> Result<Vec<u8>, EnvelopeError> {
    let env: serde_json::Value =
        serde_json::from_slice(payload).map_err(|_| EnvelopeError::NotJson)?;
    if !env.is_object() {
        return Err(EnvelopeError::NotJson);
    }
    if env["v"] != ENVELOPE_VERSION {
        return Err(EnvelopeError::Version);
    }
    if env["hub_id"] != hub_id {
        return Err(EnvelopeError::HubId);
    }
    let body = env["body"]
        .as_str()
        .and_then(b64u_decode)
        .ok_or(EnvelopeError::Body)?;
    let sig: [u8; 64] = env["sig"]
        .as_str()
        .and_then(b64u_decode)
        .and_then(|s| s.try_into().ok())
        .ok_or(EnvelopeError::Sig)?;
    if !verify(HUB_CONTEXT, key, &body, &sig) {
        return Err(EnvelopeError::BadSignature);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_envelope_opens_under_its_key_and_no_other() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let env = hub_envelope("hub-a", &key, b"{\"x\":1}");
        assert_eq!(
            open_hub_envelope(&env, "hub-a", &key.verifying_key()).unwrap(),
            b"{\"x\":1}"
        );
        let other = SigningKey::from_bytes(&[4; 32]).verifying_key();
        assert_eq!(
            open_hub_envelope(&env, "hub-a", &other),
            Err(EnvelopeError::BadSignature)
        );
        assert_eq!(
            open_hub_envelope(&env, "hub-b", &key.verifying_key()),
            Err(EnvelopeError::HubId)
        );
    }

    #[test]
    fn a_hub_envelope_with_a_changed_body_or_a_bad_part_is_refused() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let public = key.verifying_key();
        let env: serde_json::Value =
            serde_json::from_slice(&hub_envelope("hub-a", &key, b"{}")).unwrap();
        let with = |field: &str, v: serde_json::Value| {
            let mut e = env.clone();
            e[field] = v;
            serde_json::to_vec(&e).unwrap()
        };
        let open = |p: &[u8]| open_hub_envelope(p, "hub-a", &public);
        assert_eq!(
            open(&with("body", b64u_encode(b"{ }").into())),
            Err(EnvelopeError::BadSignature)
        );
        assert_eq!(open(&with("v", 2.into())), Err(EnvelopeError::Version));
        assert_eq!(open(&with("body", "+/".into())), Err(EnvelopeError::Body));
        assert_eq!(
            open(&with("sig", b64u_encode(&[0; 63]).into())),
            Err(EnvelopeError::Sig)
        );
        assert_eq!(open(b"[1]"), Err(EnvelopeError::NotJson));
        assert_eq!(open(b"not json"), Err(EnvelopeError::NotJson));
    }

    #[test]
    fn pin_tag_matches_the_vector() {
        let key = b64u_decode_32("7DSziFstzn18m4kT0DnCq0jReWQxAnkgKl6pfph4WsY").unwrap();
        assert_eq!(
            b64u_encode(&pin_tag(&key, b"482913")),
            "hvm_pP9YTc-eyIwtdnLrzLmxWn26dD2b6tlyRlDbl3Q"
        );
    }

    #[test]
    fn decoder_accepts_padding_and_refuses_the_standard_alphabet() {
        assert_eq!(b64u_decode("YQ==").unwrap(), b"a");
        assert_eq!(b64u_decode("YQ").unwrap(), b"a");
        assert!(b64u_decode("+/8").is_none());
        assert!(b64u_decode("Y Q").is_none());
    }

    #[test]
    fn the_vector_hub_key_has_the_registered_public_key() {
        let seed = b64u_decode_32("qTouxiikSj0xOqGF1EY1r3wDRaCaaT-XQQUqNoXtCgU").unwrap();
        let key = SigningKey::from_bytes(&seed);
        assert_eq!(
            b64u_encode(key.verifying_key().as_bytes()),
            "hnxZGkSHul8kFkNda3meL_Y5hD-IGBBTJ6T2hvrbnJI"
        );
    }

    #[test]
    fn weak_and_invalid_public_keys_are_refused() {
        // The identity point (small order).
        let mut identity = [0u8; 32];
        identity[0] = 1;
        assert_eq!(
            parse_public_key(&b64u_encode(&identity)),
            Err(KeyError::Weak)
        );
        assert_eq!(parse_public_key("AAAA"), Err(KeyError::NotThirtyTwoBytes));
        assert!(parse_public_key("vpDAfBqmiMog0GAAR6GMchsmx2iCa19aGlMs764g2M0").is_ok());
    }

    #[test]
    fn hub_and_event_signatures_do_not_cross() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let sig = sign(HUB_CONTEXT, &key, b"{}");
        assert!(verify(HUB_CONTEXT, &key.verifying_key(), b"{}", &sig));
        assert!(!verify(EVENT_CONTEXT, &key.verifying_key(), b"{}", &sig));
    }
}
