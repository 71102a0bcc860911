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

use crate::crypto;
use crate::event::{
    EventHeader, MAX_SEQ, Reason, json_int_in, parse_json_strict, parse_uuid_strict,
};
use crate::time::Timestamp;
use ed25519_dalek::VerifyingKey;
use serde_json::Value;
use uuid::Uuid;

/// The largest cloud envelope the hub will look at (mqtt.md 'Envelopes').
pub const MAX_ENVELOPE_BYTES: usize = 1024 * 1024;

/// How long before a signer's `not_after` the hub starts warning
/// (mqtt.md 'Alerts', `signer_expiring`).
pub const SIGNER_EXPIRING_DAYS: i64 = 30;

/// A cloud signing key the hub trusts: one entry of the trust ring
/// (`[[trust.signer]]` in the hub's config, which builds it).
#[derive(Debug, Clone)]
pub struct Signer {
    pub id: String,
    /// Checked at load ([`crypto::parse_public_key`]): a valid point, not of
    /// small order (weak).
    pub public_key: VerifyingKey,
    /// The last instant its signatures are accepted; `None`: no expiry.
    pub not_after: Option<Timestamp>,
}

/// An authenticated event, addressed to this hub: from step 2 on it claims
/// its id and counts toward the watermark, whatever else happens to it.
/// Its `Debug` leaves the body out (PIN tags, names).
#[derive(Clone, PartialEq, Eq)]
pub struct VerifiedEvent {
    pub header: EventHeader,
    /// The exact signed bytes; parsed again by [`crate::event`], never re-serialised.
    pub body: Vec<u8>,
    /// SHA-256 of `body`: the dedupe fingerprint.
    pub body_sha256: [u8; 32],
    /// The trust-ring id that signed it.
    pub signer: String,
}

impl std::fmt::Debug for VerifiedEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifiedEvent")
            .field("header", &self.header)
            .field("body_len", &self.body.len())
            .field("signer", &self.signer)
            .finish_non_exhaustive()
    }
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
///    keys, or a malformed header (see `parse_header`): `bad_envelope`.
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
    if v.as_u64() != Some(crypto::ENVELOPE_VERSION) {
        return Err(reject(Reason::UnsupportedVersion, hint));
    }
    let str_field = |k: &str| env.get(k).and_then(Value::as_str).ok_or(bad);
    let env_event_id = parse_uuid_strict(str_field("event_id")?).ok_or(bad)?;
    let signer_id = str_field("signer")?;
    let body_b64 = str_field("body")?;
    let sig_b64 = str_field("sig")?;

    // The envelope's own form first (mqtt.md's order: `bad_envelope`
    // before `unknown_signer`), then who signed it.
    let body = crypto::b64u_decode(body_b64).ok_or(bad)?;
    let sig: [u8; 64] = crypto::b64u_decode(sig_b64)
        .and_then(|s| s.try_into().ok())
        .ok_or(bad)?;
    let signer = ctx
        .ring
        .iter()
        .find(|s| s.id == signer_id)
        .filter(|s| s.not_after.is_none_or(|t| ctx.now <= t))
        .ok_or(reject(Reason::UnknownSigner, hint))?;
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
///   `checkpoint` or `mirror.request`; those must *not* carry one (the page: "no `seq`
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
    if crate::event::has_no_seq(ty) != seq.is_none() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{EVENT_CONTEXT, HUB_CONTEXT, b64u_encode, sign};
    use base64::Engine;
    use ed25519_dalek::{SigningKey, VerifyingKey};
    use serde_json::json;

    const SITE: &str = "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10";
    const HUB: &str = "hub-lobby-1";
    const ID: &str = "00000001-94a1-4c39-8f5e-6b1e2d3c4a01";
    const SIGNER: &str = "cloud-test";

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[1; 32])
    }

    fn now() -> Timestamp {
        Timestamp::parse_rfc3339("2026-11-29T12:00:00Z").unwrap()
    }

    fn ring() -> Vec<Signer> {
        vec![Signer {
            id: SIGNER.into(),
            public_key: key().verifying_key(),
            not_after: None,
        }]
    }

    fn ctx(ring: &[Signer]) -> VerifyContext<'_> {
        VerifyContext {
            ring,
            site_id: Uuid::parse_str(SITE).unwrap(),
            hub_id: HUB,
            now: now(),
        }
    }

    fn body_value() -> Value {
        json!({
            "event_id": ID, "site_id": SITE, "hub_id": HUB, "seq": 1,
            "type": "key.revoked", "issued_at": "2026-11-29T12:00:00Z",
            "key_id": "k-1", "version": 1, "reason": "checkout"
        })
    }

    fn body_with(k: &str, v: Value) -> Vec<u8> {
        let mut b = body_value();
        b[k] = v;
        serde_json::to_vec(&b).unwrap()
    }

    fn body_without(k: &str) -> Vec<u8> {
        let mut b = body_value();
        b.as_object_mut().unwrap().remove(k);
        serde_json::to_vec(&b).unwrap()
    }

    fn envelope_with_sig(body: &[u8], sig: &[u8]) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "v": 1, "event_id": ID, "signer": SIGNER,
            "body": b64u_encode(body), "sig": b64u_encode(sig),
        }))
        .unwrap()
    }

    fn envelope(body: &[u8]) -> Vec<u8> {
        envelope_with_sig(body, &sign(EVENT_CONTEXT, &key(), body))
    }

    fn good_body() -> Vec<u8> {
        serde_json::to_vec(&body_value()).unwrap()
    }

    fn run(raw: &[u8]) -> Result<VerifiedEvent, Rejection> {
        verify_envelope(raw, &ctx(&ring()))
    }

    fn reason(raw: &[u8]) -> Reason {
        run(raw).expect_err("must be rejected").reason
    }

    /// An envelope given as JSON text, with `body`/`sig` of a good signed body
    /// substituted for `BODY` and `SIG`.
    fn env_text(template: &str) -> Vec<u8> {
        let body = good_body();
        template
            .replace("BODY", &b64u_encode(&body))
            .replace("SIG", &b64u_encode(&sign(EVENT_CONTEXT, &key(), &body)))
            .into_bytes()
    }

    #[test]
    fn a_verified_events_debug_leaves_its_body_out() {
        let body = good_body();
        let shown = format!("{:?}", run(&envelope(&body)).unwrap());
        let bytes = format!("{body:?}");
        assert!(!shown.contains(&bytes[..20]), "{shown}");
        assert!(!shown.contains("checkout"), "{shown}");
        assert!(shown.contains("body_len"), "{shown}");
    }

    #[test]
    fn a_well_formed_signed_event_for_this_hub_verifies_with_its_exact_bytes() {
        let body = good_body();
        let ev = run(&envelope(&body)).unwrap();
        assert_eq!(ev.header.event_id, Uuid::parse_str(ID).unwrap());
        assert_eq!(ev.header.seq, Some(1));
        assert_eq!(ev.header.issued_at, now());
        assert_eq!(ev.body, body);
        assert_eq!(ev.body_sha256, crypto::sha256(&body));
        assert_eq!(ev.signer, SIGNER);
    }

    #[test]
    fn an_envelope_over_one_mebibyte_is_payload_too_large_without_parsing() {
        let raw = vec![b'x'; MAX_ENVELOPE_BYTES + 1];
        assert_eq!(
            run(&raw),
            Err(Rejection {
                reason: Reason::PayloadTooLarge,
                event_id_hint: None
            })
        );
        // At the limit it is parsed (and this one is not JSON).
        assert_eq!(reason(&vec![b'x'; MAX_ENVELOPE_BYTES]), Reason::BadEnvelope);
    }

    #[test]
    fn a_valid_envelope_padded_to_exactly_the_limit_still_verifies() {
        let mut raw = envelope(&good_body());
        raw.resize(MAX_ENVELOPE_BYTES, b' ');
        assert!(run(&raw).is_ok());
        raw.push(b' ');
        assert_eq!(reason(&raw), Reason::PayloadTooLarge);
    }

    #[test]
    fn truncated_json_is_bad_envelope() {
        let raw = envelope(&good_body());
        for cut in [0, 1, raw.len() / 2, raw.len() - 1] {
            assert_eq!(reason(&raw[..cut]), Reason::BadEnvelope, "cut at {cut}");
        }
    }

    #[test]
    fn an_envelope_that_is_not_an_object_is_bad_envelope() {
        for raw in [&b"[]"[..], b"\"x\"", b"1", b"null", b"{} {}"] {
            assert_eq!(reason(raw), Reason::BadEnvelope);
        }
    }

    #[test]
    fn a_version_of_the_wrong_json_type_is_bad_envelope_and_another_integer_is_unsupported() {
        let cases = [
            (r#""1""#, Reason::BadEnvelope),
            ("1.0", Reason::BadEnvelope),
            ("1e0", Reason::BadEnvelope),
            ("true", Reason::BadEnvelope),
            ("null", Reason::BadEnvelope),
            ("18446744073709551616", Reason::BadEnvelope),
            ("1e400", Reason::BadEnvelope),
            ("2", Reason::UnsupportedVersion),
            ("0", Reason::UnsupportedVersion),
            ("-1", Reason::UnsupportedVersion),
            ("18446744073709551615", Reason::UnsupportedVersion),
        ];
        for (v, want) in cases {
            let raw = env_text(&format!(
                r#"{{"v":{v},"event_id":"{ID}","signer":"{SIGNER}","body":"BODY","sig":"SIG"}}"#
            ));
            assert_eq!(reason(&raw), want, "v = {v}");
        }
        let raw = env_text(&format!(
            r#"{{"event_id":"{ID}","signer":"{SIGNER}","body":"BODY","sig":"SIG"}}"#
        ));
        assert_eq!(reason(&raw), Reason::BadEnvelope);
    }

    #[test]
    fn a_future_version_is_unsupported_even_when_its_other_fields_differ() {
        let raw = format!(r#"{{"v":2,"event_id":"{ID}","payload":{{}}}}"#);
        assert_eq!(
            run(raw.as_bytes()),
            Err(Rejection {
                reason: Reason::UnsupportedVersion,
                event_id_hint: Some(Uuid::parse_str(ID).unwrap())
            })
        );
    }

    #[test]
    fn missing_or_mistyped_envelope_fields_are_bad_envelope_and_keep_the_id_hint() {
        for field in ["event_id", "signer", "body", "sig"] {
            for bad in [Value::Null, json!(1), json!(["x"]), json!({})] {
                let mut env: Value = serde_json::from_slice(&envelope(&good_body())).unwrap();
                env[field] = bad.clone();
                let raw = serde_json::to_vec(&env).unwrap();
                let rej = run(&raw).unwrap_err();
                assert_eq!(rej.reason, Reason::BadEnvelope, "{field} = {bad}");
                let hint = (field != "event_id").then(|| Uuid::parse_str(ID).unwrap());
                assert_eq!(rej.event_id_hint, hint, "{field}");
            }
            let mut env: Value = serde_json::from_slice(&envelope(&good_body())).unwrap();
            env.as_object_mut().unwrap().remove(field);
            assert_eq!(
                reason(&serde_json::to_vec(&env).unwrap()),
                Reason::BadEnvelope
            );
        }
    }

    #[test]
    fn an_envelope_id_that_is_not_a_hyphenated_uuid_is_bad_envelope_without_a_hint() {
        for id in [
            "not-a-uuid",
            "",
            "0000000194a14c398f5e6b1e2d3c4a01",
            "{00000001-94a1-4c39-8f5e-6b1e2d3c4a01}",
            "urn:uuid:00000001-94a1-4c39-8f5e-6b1e2d3c4a01",
            "00000001-94a1-4c39-8f5e-6b1e2d3c4a0g",
            " 00000001-94a1-4c39-8f5e-6b1e2d3c4a01",
        ] {
            let mut env: Value = serde_json::from_slice(&envelope(&good_body())).unwrap();
            env["event_id"] = json!(id);
            let rej = run(&serde_json::to_vec(&env).unwrap()).unwrap_err();
            assert_eq!(
                rej,
                Rejection {
                    reason: Reason::BadEnvelope,
                    event_id_hint: None
                },
                "{id}"
            );
        }
    }

    #[test]
    fn duplicate_keys_in_the_envelope_are_bad_envelope() {
        let raw = env_text(&format!(
            r#"{{"v":1,"event_id":"{ID}","signer":"{SIGNER}","signer":"other","body":"BODY","sig":"SIG"}}"#
        ));
        assert_eq!(reason(&raw), Reason::BadEnvelope);
        // The same key spelled with an escape is still the same key.
        let raw = env_text(&format!(
            r#"{{"v":1,"\u0076":1,"event_id":"{ID}","signer":"{SIGNER}","body":"BODY","sig":"SIG"}}"#
        ));
        assert_eq!(reason(&raw), Reason::BadEnvelope);
    }

    #[test]
    fn unknown_envelope_fields_are_ignored() {
        let raw = env_text(&format!(
            r#"{{"v":1,"event_id":"{ID}","signer":"{SIGNER}","body":"BODY","sig":"SIG","trace":{{"x":[1]}}}}"#
        ));
        assert!(run(&raw).is_ok());
    }

    #[test]
    fn a_signer_outside_the_ring_is_unknown_signer() {
        let body = good_body();
        let raw = serde_json::to_vec(&json!({
            "v": 1, "event_id": ID, "signer": "cloud-unknown",
            "body": b64u_encode(&body), "sig": b64u_encode(&sign(EVENT_CONTEXT, &key(), &body)),
        }))
        .unwrap();
        assert_eq!(reason(&raw), Reason::UnknownSigner);
    }

    #[test]
    fn a_malformed_body_or_signature_is_bad_envelope_even_from_an_unknown_signer() {
        // mqtt.md's order: `bad_envelope` comes before `unknown_signer`.
        let raw = env_text(&format!(
            r#"{{"v":1,"event_id":"{ID}","signer":"cloud-unknown","body":"!!","sig":"SIG"}}"#
        ));
        assert_eq!(reason(&raw), Reason::BadEnvelope);
    }

    #[test]
    fn a_signer_past_its_not_after_is_unknown_signer_and_valid_up_to_that_instant() {
        let raw = envelope(&good_body());
        let mut ring = ring();
        ring[0].not_after = Some(now());
        assert!(verify_envelope(&raw, &ctx(&ring)).is_ok());
        ring[0].not_after = Some(now().saturating_add_micros(-1));
        assert_eq!(
            verify_envelope(&raw, &ctx(&ring)).unwrap_err().reason,
            Reason::UnknownSigner
        );
    }

    #[test]
    fn a_signature_by_a_key_outside_the_ring_is_bad_signature() {
        let body = good_body();
        let other = SigningKey::from_bytes(&[2; 32]);
        let raw = envelope_with_sig(&body, &sign(EVENT_CONTEXT, &other, &body));
        assert_eq!(reason(&raw), Reason::BadSignature);
    }

    #[test]
    fn a_signature_without_the_event_context_or_with_the_hub_context_is_bad_signature() {
        use ed25519_dalek::Signer as _;
        let body = good_body();
        let plain = key().sign(&body).to_bytes();
        assert_eq!(
            reason(&envelope_with_sig(&body, &plain)),
            Reason::BadSignature
        );
        let hub = sign(HUB_CONTEXT, &key(), &body);
        assert_eq!(
            reason(&envelope_with_sig(&body, &hub)),
            Reason::BadSignature
        );
    }

    #[test]
    fn a_signature_over_other_bytes_is_bad_signature() {
        let body = good_body();
        let other = body_with("seq", json!(2));
        let raw = envelope_with_sig(&other, &sign(EVENT_CONTEXT, &key(), &body));
        assert_eq!(reason(&raw), Reason::BadSignature);
    }

    #[test]
    fn a_signature_of_63_or_65_bytes_is_bad_envelope() {
        let body = good_body();
        let sig = sign(EVENT_CONTEXT, &key(), &body);
        assert_eq!(
            reason(&envelope_with_sig(&body, &sig[..63])),
            Reason::BadEnvelope
        );
        let mut long = sig.to_vec();
        long.push(0);
        assert_eq!(
            reason(&envelope_with_sig(&body, &long)),
            Reason::BadEnvelope
        );
        assert_eq!(reason(&envelope_with_sig(&body, &[])), Reason::BadEnvelope);
    }

    #[test]
    fn body_or_signature_that_is_not_base64url_is_bad_envelope() {
        for (body, sig) in [
            ("!!!", "SIG"),
            ("BODY", "!!!"),
            ("BODY", "SIG*"),
            ("B O D Y", "SIG"),
        ] {
            let raw = env_text(&format!(
                r#"{{"v":1,"event_id":"{ID}","signer":"{SIGNER}","body":"{body}","sig":"{sig}"}}"#
            ));
            assert_eq!(reason(&raw), Reason::BadEnvelope, "{body} {sig}");
        }
    }

    #[test]
    fn standard_alphabet_base64_is_bad_envelope() {
        let std = base64::engine::general_purpose::STANDARD_NO_PAD;
        // Find a signed body whose standard encoding really differs from base64url.
        let (body, sig) = (1..1000)
            .map(|n| {
                let body = body_with("seq", json!(n));
                let sig = sign(EVENT_CONTEXT, &key(), &body);
                (body, sig)
            })
            .find(|(_, sig)| std.encode(sig) != b64u_encode(sig))
            .expect("some signature has + or /");
        let raw = serde_json::to_vec(&json!({
            "v": 1, "event_id": ID, "signer": SIGNER,
            "body": b64u_encode(&body), "sig": std.encode(sig),
        }))
        .unwrap();
        assert_eq!(reason(&raw), Reason::BadEnvelope);
    }

    #[test]
    fn padded_base64url_is_accepted() {
        let url_pad = base64::engine::general_purpose::URL_SAFE;
        let body = good_body();
        let sig = sign(EVENT_CONTEXT, &key(), &body);
        let raw = serde_json::to_vec(&json!({
            "v": 1, "event_id": ID, "signer": SIGNER,
            "body": url_pad.encode(&body), "sig": url_pad.encode(sig),
        }))
        .unwrap();
        assert!(url_pad.encode(sig).ends_with("=="));
        assert!(run(&raw).is_ok());
    }

    #[test]
    fn a_non_canonical_signature_with_s_at_or_above_the_group_order_is_bad_signature() {
        // L = 2^252 + 27742317777372353535851937790883648493, little-endian.
        const L: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9,
            0xde, 0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let body = good_body();
        let mut sig = sign(EVENT_CONTEXT, &key(), &body);
        assert!(run(&envelope_with_sig(&body, &sig)).is_ok());
        // s + L: the same scalar mod L, a different (malleated) encoding.
        let mut carry = 0u16;
        for i in 0..32 {
            let t = u16::from(sig[32 + i]) + u16::from(L[i]) + carry;
            sig[32 + i] = t as u8;
            carry = t >> 8;
        }
        assert_eq!(carry, 0);
        assert_eq!(
            reason(&envelope_with_sig(&body, &sig)),
            Reason::BadSignature
        );
    }

    #[test]
    fn a_small_order_signer_key_cannot_sneak_in_even_if_the_ring_holds_it() {
        // The identity point: under it, R = identity and s = 0 "verifies" for
        // every message with plain (non-strict) Ed25519.
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let weak = VerifyingKey::from_bytes(&identity).unwrap();
        assert!(weak.is_weak());
        let mut forged = [0u8; 64];
        forged[0] = 1;
        let body = good_body();
        let mut msg = EVENT_CONTEXT.to_vec();
        msg.push(0);
        msg.extend_from_slice(&body);
        use ed25519_dalek::Verifier as _;
        assert!(
            weak.verify(&msg, &ed25519_dalek::Signature::from_bytes(&forged))
                .is_ok(),
            "the forgery works against non-strict verification"
        );
        // The config loader refuses such a key; this checks the second wall.
        let ring = vec![Signer {
            id: SIGNER.into(),
            public_key: weak,
            not_after: None,
        }];
        let raw = envelope_with_sig(&body, &forged);
        assert_eq!(
            verify_envelope(&raw, &ctx(&ring)).unwrap_err().reason,
            Reason::BadSignature
        );
    }

    #[test]
    fn a_valid_signature_over_a_non_json_body_is_bad_envelope() {
        for body in [
            &b""[..],
            b"not json",
            b"{\"event_id\":",
            b"[]",
            b"\"a string\"",
            b"\xef\xbb\xbf{}",
        ] {
            assert_eq!(reason(&envelope(body)), Reason::BadEnvelope);
        }
    }

    #[test]
    fn a_signed_body_that_is_not_utf8_is_bad_envelope() {
        let mut body = good_body();
        // Put an invalid byte inside the revoke reason string.
        let at = body.windows(8).position(|w| w == b"checkout").unwrap();
        body[at] = 0xff;
        assert_eq!(reason(&envelope(&body)), Reason::BadEnvelope);
    }

    #[test]
    fn raw_nul_bytes_in_the_body_are_bad_envelope_and_an_escaped_nul_does_not_match_the_hub() {
        let mut body = good_body();
        let at = body.windows(8).position(|w| w == b"checkout").unwrap();
        body[at] = 0;
        assert_eq!(reason(&envelope(&body)), Reason::BadEnvelope);
        let body = body_with("hub_id", json!(format!("{HUB}\u{0}")));
        assert_eq!(reason(&envelope(&body)), Reason::WrongHub);
    }

    #[test]
    fn duplicate_keys_in_the_signed_body_are_bad_envelope() {
        let good = String::from_utf8(good_body()).unwrap();
        let dup_hub = good.replacen('{', r#"{"hub_id":"hub-other","#, 1);
        assert_eq!(reason(&envelope(dup_hub.as_bytes())), Reason::BadEnvelope);
        let dup_escaped = good.replacen('{', r#"{"\u0073eq":7,"#, 1);
        assert_eq!(
            reason(&envelope(dup_escaped.as_bytes())),
            Reason::BadEnvelope
        );
        // Nested duplicates too: two parsers must never read different grants.
        let nested = good.replacen('{', r#"{"extra":{"a":1,"a":2},"#, 1);
        assert_eq!(reason(&envelope(nested.as_bytes())), Reason::BadEnvelope);
    }

    #[test]
    fn deep_nesting_is_bad_envelope_not_a_stack_overflow() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let good = String::from_utf8(good_body()).unwrap();
        let body = good.replacen('{', &format!(r#"{{"deep":{deep},"#), 1);
        assert_eq!(reason(&envelope(body.as_bytes())), Reason::BadEnvelope);
        let raw = format!(r#"{{"v":1,"x":{deep}}}"#);
        assert_eq!(reason(raw.as_bytes()), Reason::BadEnvelope);
        // Moderate nesting in an unknown field is fine.
        let ok = good.replacen('{', r#"{"meta":[[[{"a":[1]}]]],"#, 1);
        assert!(run(&envelope(ok.as_bytes())).is_ok());
    }

    #[test]
    fn a_seq_that_is_not_an_integer_in_range_is_bad_envelope() {
        for seq in [
            "1e400",
            "18446744073709551616",
            "-1",
            "1.0",
            "1e2",
            "0",
            "9007199254740992",
            "\"1\"",
            "true",
            "[1]",
        ] {
            let good = String::from_utf8(good_body()).unwrap();
            let body = good.replace(r#""seq":1"#, &format!(r#""seq":{seq}"#));
            assert_ne!(body, good);
            assert_eq!(
                reason(&envelope(body.as_bytes())),
                Reason::BadEnvelope,
                "seq {seq}"
            );
        }
        let max = body_with("seq", json!(crate::event::MAX_SEQ));
        assert_eq!(run(&envelope(&max)).unwrap().header.seq, Some(MAX_SEQ));
    }

    #[test]
    fn seq_is_required_except_on_a_checkpoint_which_must_not_carry_one() {
        assert_eq!(reason(&envelope(&body_without("seq"))), Reason::BadEnvelope);
        assert_eq!(
            reason(&envelope(&body_with("seq", Value::Null))),
            Reason::BadEnvelope
        );
        let mut cp = body_value();
        cp["type"] = json!("checkpoint");
        cp["head_seq"] = json!(3);
        assert_eq!(
            reason(&envelope(&serde_json::to_vec(&cp).unwrap())),
            Reason::BadEnvelope
        );
        cp.as_object_mut().unwrap().remove("seq");
        let ev = run(&envelope(&serde_json::to_vec(&cp).unwrap())).unwrap();
        assert_eq!(ev.header.seq, None);
        cp["seq"] = Value::Null;
        assert!(run(&envelope(&serde_json::to_vec(&cp).unwrap())).is_ok());
    }

    #[test]
    fn a_mirror_request_like_a_checkpoint_carries_no_seq() {
        let mut req = body_value();
        req["type"] = json!("mirror.request");
        req["as_of"] = json!("2026-12-04T12:00:00Z");
        req["buckets"] = json!([17]);
        assert_eq!(
            reason(&envelope(&serde_json::to_vec(&req).unwrap())),
            Reason::BadEnvelope
        );
        req.as_object_mut().unwrap().remove("seq");
        let ev = run(&envelope(&serde_json::to_vec(&req).unwrap())).unwrap();
        assert_eq!(ev.header.seq, None);
    }

    #[test]
    fn a_malformed_body_header_is_bad_envelope() {
        let cases = [
            ("event_id", json!("not-a-uuid")),
            ("event_id", json!(1)),
            ("site_id", json!("site")),
            ("site_id", Value::Null),
            ("hub_id", json!(7)),
            ("type", json!(["key.revoked"])),
            ("type", Value::Null),
            ("issued_at", json!("2026-11-29 12:00:00")),
            ("issued_at", json!("2026-11-29T12:00:00")),
            ("issued_at", json!(1_795_953_600)),
        ];
        for (k, v) in cases {
            assert_eq!(
                reason(&envelope(&body_with(k, v.clone()))),
                Reason::BadEnvelope,
                "{k} = {v}"
            );
        }
        for k in ["event_id", "site_id", "hub_id", "type", "issued_at"] {
            assert_eq!(
                reason(&envelope(&body_without(k))),
                Reason::BadEnvelope,
                "{k}"
            );
        }
    }

    #[test]
    fn an_unknown_type_passes_step_one_for_step_four_to_refuse() {
        assert!(run(&envelope(&body_with("type", json!("key.frobbed")))).is_ok());
    }

    #[test]
    fn a_body_id_other_than_the_envelope_id_is_event_id_mismatch() {
        let body = body_with("event_id", json!("00000002-94a1-4c39-8f5e-6b1e2d3c4a02"));
        assert_eq!(
            run(&envelope(&body)),
            Err(Rejection {
                reason: Reason::EventIdMismatch,
                event_id_hint: Some(Uuid::parse_str(ID).unwrap())
            })
        );
    }

    #[test]
    fn event_ids_compare_case_insensitively() {
        let body = body_with("event_id", json!(ID.to_uppercase()));
        let ev = run(&envelope(&body)).unwrap();
        assert_eq!(ev.header.event_id.to_string(), ID);
    }

    #[test]
    fn a_body_signed_for_another_site_is_wrong_site() {
        let body = body_with("site_id", json!("6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e11"));
        assert_eq!(reason(&envelope(&body)), Reason::WrongSite);
        let upper = body_with("site_id", json!(SITE.to_uppercase()));
        assert!(run(&envelope(&upper)).is_ok());
    }

    #[test]
    fn a_body_signed_for_another_hub_is_wrong_hub() {
        for hub in ["hub-other", "HUB-LOBBY-1", "hub-lobby-1 ", ""] {
            let body = body_with("hub_id", json!(hub));
            assert_eq!(reason(&envelope(&body)), Reason::WrongHub, "{hub:?}");
        }
    }

    #[test]
    fn the_id_checks_come_in_the_contract_order() {
        let mut b = body_value();
        b["event_id"] = json!("00000002-94a1-4c39-8f5e-6b1e2d3c4a02");
        b["site_id"] = json!("6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e11");
        b["hub_id"] = json!("hub-other");
        assert_eq!(
            reason(&envelope(&serde_json::to_vec(&b).unwrap())),
            Reason::EventIdMismatch
        );
        b["event_id"] = json!(ID);
        assert_eq!(
            reason(&envelope(&serde_json::to_vec(&b).unwrap())),
            Reason::WrongSite
        );
    }

    #[test]
    fn the_signature_is_checked_before_the_body_is_parsed() {
        // A forged non-JSON body is a bad signature, not a bad envelope.
        let other = SigningKey::from_bytes(&[2; 32]);
        let raw = envelope_with_sig(b"not json", &sign(EVENT_CONTEXT, &other, b"not json"));
        assert_eq!(reason(&raw), Reason::BadSignature);
    }

    #[test]
    fn a_rejection_displays_only_its_reason() {
        let rej = run(&envelope(b"secret stuff")).unwrap_err();
        assert_eq!(rej.to_string(), "event rejected at step 1: bad_envelope");
    }

    #[test]
    fn mutating_any_byte_of_a_signed_body_never_panics_and_never_passes_a_broken_header() {
        let schema = crate::event::SchemaContext::new(["101"], ["k1"]);
        let body = good_body();
        for i in 0..body.len() {
            for b in [0u8, b'"', b'1'] {
                let mut m = body.clone();
                m[i] = b;
                if let Ok(ev) = run(&envelope(&m)) {
                    // Whatever got through is a well-formed header for us.
                    assert_eq!(ev.header.event_id, Uuid::parse_str(ID).unwrap());
                    let _ = crate::event::parse_body(&ev.body, &schema);
                }
            }
        }
        // And the same for the envelope text around a fixed signature.
        let raw = envelope(&body);
        for i in 0..raw.len() {
            let mut m = raw.clone();
            m[i] = b'"';
            let _ = run(&m);
        }
    }

    /// The project's copy of the contract's vectors.
    fn vector(name: &str) -> String {
        let path = format!("{}/../spec/vectors/mqtt/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
    }

    #[test]
    fn the_first_vector_envelope_opens_under_the_vector_trust_ring() {
        let trust = vector("trust.toml");
        let field = |k: &str| {
            trust
                .lines()
                .find_map(|l| {
                    l.strip_prefix(k)?
                        .trim()
                        .strip_prefix("= ")?
                        .strip_prefix('"')?
                        .strip_suffix('"')
                })
                .unwrap_or_else(|| panic!("{k} in trust.toml"))
                .to_owned()
        };
        let ring = [Signer {
            id: field("id"),
            public_key: crypto::parse_public_key(&field("public_key")).unwrap(),
            not_after: None,
        }];
        let cases = vector("cases.jsonl");
        let case: Value = serde_json::from_str(cases.lines().next().unwrap()).unwrap();
        assert_eq!(case["n"], 1);
        let raw = case["envelope"].as_str().unwrap().as_bytes();
        let ev = verify_envelope(raw, &ctx(&ring)).unwrap();
        assert_eq!(ev.signer, "cloud-2026-11");
        assert_eq!(ev.header.event_id, Uuid::parse_str(ID).unwrap());
        assert_eq!(ev.header.seq, Some(1));
        // The exact bytes the envelope carries, not a re-serialisation.
        let env: Value = serde_json::from_slice(raw).unwrap();
        assert_eq!(
            Some(ev.body.clone()),
            crypto::b64u_decode(env["body"].as_str().unwrap())
        );
        let body: Value = serde_json::from_slice(&ev.body).unwrap();
        assert_eq!(body["type"], "key.issued");
        assert_eq!(body["key"]["key_id"], "k-101-a");
        assert_eq!(
            body["key"]["pin_tag"],
            "hvm_pP9YTc-eyIwtdnLrzLmxWn26dD2b6tlyRlDbl3Q"
        );
        // One flipped signature byte and it no longer opens.
        let mut sig = crypto::b64u_decode(env["sig"].as_str().unwrap()).unwrap();
        sig[0] ^= 1;
        let mut forged = env.clone();
        forged["sig"] = crypto::b64u_encode(&sig).into();
        assert_eq!(
            reason_in(&serde_json::to_vec(&forged).unwrap(), &ring),
            Reason::BadSignature
        );
    }

    fn reason_in(raw: &[u8], ring: &[Signer]) -> Reason {
        verify_envelope(raw, &ctx(ring)).unwrap_err().reason
    }

    #[test]
    fn signers_within_thirty_days_of_not_after_are_expiring() {
        let day = Timestamp::MICROS_PER_DAY;
        let mk = |id: &str, not_after: Option<Timestamp>| Signer {
            id: id.into(),
            public_key: key().verifying_key(),
            not_after,
        };
        let ring = vec![
            mk("forever", None),
            mk("in-31-days", Some(now().saturating_add_micros(31 * day))),
            mk("in-30-days", Some(now().saturating_add_micros(30 * day))),
            mk("tomorrow", Some(now().saturating_add_micros(day))),
            mk("now", Some(now())),
            mk("expired", Some(now().saturating_add_micros(-1))),
        ];
        assert_eq!(
            signer_expiring(&ring, now()),
            vec!["in-30-days", "tomorrow", "now"]
        );
        assert!(signer_expiring(&[], now()).is_empty());
    }
}
