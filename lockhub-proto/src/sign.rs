//! The cloud's side of an event: a body built the way mqtt.md 'Body of a
//! cloud event' describes it, signed with a trust-ring key and wrapped in a
//! cloud envelope (`{"v":1,"event_id","signer","body","sig"}`).
//!
//! Pure: the event id, the issue time and the seq are inputs. Which seq comes
//! next is the cloud's durable counter, not this module's; a simulated cloud
//! keeps its own in memory on top of [`EventSigner`].

use crate::crypto::{self, ENVELOPE_VERSION, EVENT_CONTEXT};
use crate::schedule::Schedule;
use crate::time::Timestamp;
use ed25519_dalek::{SigningKey, VerifyingKey};
use serde_json::{Value, json};
use uuid::Uuid;

/// A key grant to send, in plain terms (the `key` object of mqtt.md
/// 'Grant'). It holds the PIN's tag, never the PIN; its Debug leaves the tag
/// out.
#[derive(Clone, PartialEq, Eq)]
pub struct GrantSpec {
    pub key_id: String,
    pub version: u64,
    /// `"active"` or `"pre_issued"`.
    pub state: &'static str,
    pub doors: Vec<String>,
    pub valid_from: Timestamp,
    pub valid_until: Timestamp,
    pub pin_tag: [u8; 32],
    pub pin_key_id: String,
    pub check_in_id: Option<String>,
    pub reservation_id: Option<String>,
    pub holder_ref: Option<String>,
    pub holder_name: Option<String>,
    /// The weekly hours it opens (the hub reads them in its own time zone).
    pub schedule: Option<Schedule>,
    /// How many entries it grants in all (1..=100000).
    pub max_uses: Option<u32>,
}

impl std::fmt::Debug for GrantSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantSpec")
            .field("key_id", &self.key_id)
            .field("version", &self.version)
            .field("state", &self.state)
            .field("doors", &self.doors)
            .field("valid_from", &self.valid_from)
            .field("valid_until", &self.valid_until)
            .field("pin_key_id", &self.pin_key_id)
            .field("schedule", &self.schedule)
            .field("max_uses", &self.max_uses)
            .finish_non_exhaustive()
    }
}

impl GrantSpec {
    /// An active key for one door, valid from an hour before `now` for
    /// seven days, with the tag of `pin` under `pin_key` (as the cloud
    /// computes it; the PIN itself goes nowhere).
    pub fn active_at(
        now: Timestamp,
        key_id: &str,
        check_in_id: &str,
        door: &str,
        pin: &str,
        pin_key: (&str, &[u8; 32]),
    ) -> Self {
        GrantSpec {
            key_id: key_id.to_owned(),
            version: 1,
            state: "active",
            doors: vec![door.to_owned()],
            valid_from: now.saturating_add_secs(-3600),
            valid_until: now.saturating_add_days(7),
            pin_tag: crypto::pin_tag(pin_key.1, pin.as_bytes()),
            pin_key_id: pin_key.0.to_owned(),
            check_in_id: Some(check_in_id.to_owned()),
            reservation_id: None,
            holder_ref: None,
            holder_name: None,
            schedule: None,
            max_uses: None,
        }
    }

    /// [`GrantSpec::active_at`] the system clock's now.
    pub fn active(
        key_id: &str,
        check_in_id: &str,
        door: &str,
        pin: &str,
        pin_key: (&str, &[u8; 32]),
    ) -> Self {
        Self::active_at(
            Timestamp::now_system(),
            key_id,
            check_in_id,
            door,
            pin,
            pin_key,
        )
    }

    /// A pre-issued key of a reservation, for one door, from the system
    /// clock's now (see [`GrantSpec::active_at`]).
    pub fn pre_issued(
        key_id: &str,
        reservation_id: &str,
        door: &str,
        pin: &str,
        pin_key: (&str, &[u8; 32]),
    ) -> Self {
        let mut g = Self::active(key_id, "", door, pin, pin_key);
        g.state = "pre_issued";
        g.check_in_id = None;
        g.reservation_id = Some(reservation_id.to_owned());
        g
    }

    /// The grant's `key` object; optional fields appear only when set.
    pub fn to_json(&self) -> Value {
        let mut key = json!({
            "key_id": self.key_id,
            "version": self.version,
            "state": self.state,
            "doors": self.doors,
            "valid_from": self.valid_from.to_rfc3339(),
            "valid_until": self.valid_until.to_rfc3339(),
            "pin_tag": crypto::b64u_encode(&self.pin_tag),
            "pin_key_id": self.pin_key_id,
        });
        let obj = key.as_object_mut().expect("a JSON object");
        for (name, value) in [
            ("check_in_id", &self.check_in_id),
            ("reservation_id", &self.reservation_id),
            ("holder_ref", &self.holder_ref),
            ("holder_name", &self.holder_name),
        ] {
            if let Some(v) = value {
                obj.insert(name.to_owned(), json!(v));
            }
        }
        if let Some(s) = &self.schedule {
            obj.insert("schedule".to_owned(), s.to_json());
        }
        if let Some(n) = self.max_uses {
            obj.insert("max_uses".to_owned(), json!(n));
        }
        key
    }
}

/// The type-specific fields of each event type, as a JSON object to merge
/// into a body ([`event_body`]).
pub mod fields {
    use super::GrantSpec;
    use serde_json::{Value, json};

    /// `key.issued`, optionally superseding other keys.
    pub fn key_issued(grant: &GrantSpec, supersedes: &[&str]) -> Value {
        let mut fields = json!({ "key": grant.to_json() });
        if !supersedes.is_empty() {
            fields["supersedes"] = json!(supersedes);
        }
        fields
    }

    /// `key.revoked`.
    pub fn key_revoked(key_id: &str, version: u64, reason: &str) -> Value {
        json!({ "key_id": key_id, "version": version, "reason": reason })
    }

    /// `checkin.completed`: the reservation's pre-issued keys give way to `grant`.
    pub fn checkin_completed(reservation_id: &str, check_in_id: &str, grant: &GrantSpec) -> Value {
        json!({ "reservation_id": reservation_id, "check_in_id": check_in_id, "key": grant.to_json() })
    }

    /// `guest.erased`.
    pub fn guest_erased(holder_ref: &str) -> Value {
        json!({ "holder_ref": holder_ref })
    }

    /// `batch` of `key.issued` items.
    pub fn batch_issue(grants: &[GrantSpec]) -> Value {
        let items: Vec<Value> = grants
            .iter()
            .map(|g| json!({ "type": "key.issued", "key": g.to_json() }))
            .collect();
        json!({ "items": items })
    }

    /// `checkpoint` at `head_seq` (the event itself carries no seq).
    pub fn checkpoint(head_seq: u64) -> Value {
        json!({ "head_seq": head_seq })
    }

    /// `checkpoint` at `head_seq` with the cloud's mirror claim.
    pub fn checkpoint_with_claim(head_seq: u64, claim: &crate::mirror::Claim) -> Value {
        json!({ "head_seq": head_seq, "mirror": claim.to_wire() })
    }

    /// `mirror.request`: the keys of `buckets` as of `as_of` (no seq).
    pub fn mirror_request(as_of: crate::time::Timestamp, buckets: &[u8]) -> Value {
        json!({ "as_of": as_of.to_rfc3339(), "buckets": buckets })
    }
}

/// The header fields every body carries (mqtt.md 'Body of a cloud event').
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyHeader<'a> {
    pub event_id: Uuid,
    pub site_id: Uuid,
    pub hub_id: &'a str,
    /// `None` only on a `checkpoint`.
    pub seq: Option<u64>,
    /// The event type: `key.issued`, `batch`, `checkpoint`, ...
    pub kind: &'a str,
    pub issued_at: Timestamp,
}

/// The exact body bytes: the header, then `fields` (a JSON object; anything
/// else adds nothing). Keys come out in sorted order, so the same input gives
/// the same bytes on any machine.
pub fn event_body(header: &BodyHeader<'_>, fields: Value) -> Vec<u8> {
    let mut body = json!({
        "event_id": header.event_id.to_string(),
        "site_id": header.site_id.to_string(),
        "hub_id": header.hub_id,
        "type": header.kind,
        "issued_at": header.issued_at.to_rfc3339(),
    });
    if let Some(seq) = header.seq {
        body["seq"] = json!(seq);
    }
    if let (Some(obj), Value::Object(extra)) = (body.as_object_mut(), fields) {
        obj.extend(extra);
    }
    serde_json::to_vec(&body).expect("JSON values serialize")
}

/// Signs `body` under [`EVENT_CONTEXT`] and wraps it in a cloud envelope.
/// `body` is sent as given: the bytes signed are the bytes the hub decodes.
pub fn cloud_envelope(signer_id: &str, key: &SigningKey, event_id: Uuid, body: &[u8]) -> Vec<u8> {
    let sig = crypto::sign(EVENT_CONTEXT, key, body);
    serde_json::to_vec(&json!({
        "v": ENVELOPE_VERSION,
        "event_id": event_id.to_string(),
        "signer": signer_id,
        "body": crypto::b64u_encode(body),
        "sig": crypto::b64u_encode(&sig),
    }))
    .expect("JSON values serialize")
}

/// A signed cloud event, ready to publish, with what was signed. Its Debug
/// leaves the body and envelope out (PIN tags, names).
#[derive(Clone, PartialEq, Eq)]
pub struct SignedEvent {
    pub event_id: Uuid,
    pub seq: Option<u64>,
    /// The exact signed body bytes.
    pub body: Vec<u8>,
    /// The envelope to publish on `P/S/H/events`.
    pub envelope: Vec<u8>,
}

impl std::fmt::Debug for SignedEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignedEvent")
            .field("event_id", &self.event_id)
            .field("seq", &self.seq)
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

/// One trust-ring key signing for one hub. Holds no counter: every seq is
/// given to it.
#[derive(Clone)]
pub struct EventSigner {
    key: SigningKey,
    signer_id: String,
    site_id: Uuid,
    hub_id: String,
}

impl std::fmt::Debug for EventSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventSigner")
            .field("signer_id", &self.signer_id)
            .field("site_id", &self.site_id)
            .field("hub_id", &self.hub_id)
            .finish_non_exhaustive()
    }
}

impl EventSigner {
    /// Signs as `signer_id` (its trust-ring id) with `key`, for one hub.
    pub fn new(key: SigningKey, signer_id: &str, site_id: Uuid, hub_id: &str) -> Self {
        EventSigner {
            key,
            signer_id: signer_id.to_owned(),
            site_id,
            hub_id: hub_id.to_owned(),
        }
    }

    /// The public key to put in the hub's trust ring.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// The public key as the trust ring writes it (base64url).
    pub fn public_key_b64u(&self) -> String {
        crypto::b64u_encode(self.key.verifying_key().as_bytes())
    }

    pub fn signer_id(&self) -> &str {
        &self.signer_id
    }

    pub fn site_id(&self) -> Uuid {
        self.site_id
    }

    pub fn hub_id(&self) -> &str {
        &self.hub_id
    }

    /// Builds the body of one event (`kind` with `fields`, see [`fields`])
    /// and signs it into an envelope.
    pub fn sign(
        &self,
        event_id: Uuid,
        issued_at: Timestamp,
        kind: &str,
        seq: Option<u64>,
        fields: Value,
    ) -> SignedEvent {
        let header = BodyHeader {
            event_id,
            site_id: self.site_id,
            hub_id: &self.hub_id,
            seq,
            kind,
            issued_at,
        };
        let body = event_body(&header, fields);
        let envelope = self.envelope(event_id, &body);
        SignedEvent {
            event_id,
            seq,
            body,
            envelope,
        }
    }

    /// Signs any bytes as a body and wraps them (tests of malformed bodies
    /// sign what no honest cloud would).
    pub fn envelope(&self, event_id: Uuid, body: &[u8]) -> Vec<u8> {
        cloud_envelope(&self.signer_id, &self.key, event_id, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Change, EventKind, SchemaContext, parse_body};
    use crate::verify::{Signer, VerifyContext, verify_envelope};

    const SITE: &str = "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10";
    const EVENT_ID: &str = "00000001-94a1-4c39-8f5e-6b1e2d3c4a01";

    fn signer() -> EventSigner {
        EventSigner::new(
            SigningKey::from_bytes(&[9; 32]),
            "cloud-test",
            Uuid::parse_str(SITE).unwrap(),
            "hub-lobby-1",
        )
    }

    fn issued_at() -> Timestamp {
        Timestamp::parse_rfc3339("2026-11-29T12:00:00Z").unwrap()
    }

    fn revoke() -> SignedEvent {
        signer().sign(
            Uuid::parse_str(EVENT_ID).unwrap(),
            issued_at(),
            "key.revoked",
            Some(7),
            fields::key_revoked("k-1", 2, "checkout"),
        )
    }

    fn ring() -> Vec<Signer> {
        vec![Signer {
            id: "cloud-test".into(),
            public_key: signer().verifying_key(),
            not_after: None,
        }]
    }

    fn ctx(ring: &[Signer]) -> VerifyContext<'_> {
        VerifyContext {
            ring,
            site_id: Uuid::parse_str(SITE).unwrap(),
            hub_id: "hub-lobby-1",
            now: issued_at(),
        }
    }

    /// Pinned: a change here changes the bytes every cloud sends. The
    /// signature was checked with another Ed25519 implementation (Python's
    /// `cryptography`) over `lockhub-event-v1 || 0x00 || GOLDEN_BODY`.
    const GOLDEN_BODY: &str = r#"{"event_id":"00000001-94a1-4c39-8f5e-6b1e2d3c4a01","hub_id":"hub-lobby-1","issued_at":"2026-11-29T12:00:00.000000Z","key_id":"k-1","reason":"checkout","seq":7,"site_id":"6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10","type":"key.revoked","version":2}"#;
    const GOLDEN_ENVELOPE: &str = r#"{"body":"eyJldmVudF9pZCI6IjAwMDAwMDAxLTk0YTEtNGMzOS04ZjVlLTZiMWUyZDNjNGEwMSIsImh1Yl9pZCI6Imh1Yi1sb2JieS0xIiwiaXNzdWVkX2F0IjoiMjAyNi0xMS0yOVQxMjowMDowMC4wMDAwMDBaIiwia2V5X2lkIjoiay0xIiwicmVhc29uIjoiY2hlY2tvdXQiLCJzZXEiOjcsInNpdGVfaWQiOiI2ZjFjMWMwZS04YTUxLTRkMzktOWQyZS02YTNjNWE3ZDllMTAiLCJ0eXBlIjoia2V5LnJldm9rZWQiLCJ2ZXJzaW9uIjoyfQ","event_id":"00000001-94a1-4c39-8f5e-6b1e2d3c4a01","sig":"jtVd2TnoV-lhS9PAc9J1g03nyz8Ud-lWHfo4g_2aeSJsh01nUp8v9cwqwWo9wLRw8zpABdm7Uc5bjo7khFtYBg","signer":"cloud-test","v":1}"#;

    #[test]
    fn a_fixed_event_signed_with_a_fixed_key_gives_the_pinned_bytes() {
        let ev = revoke();
        assert_eq!(std::str::from_utf8(&ev.body).unwrap(), GOLDEN_BODY);
        assert_eq!(std::str::from_utf8(&ev.envelope).unwrap(), GOLDEN_ENVELOPE);
        assert_eq!(ev.seq, Some(7));
        assert_eq!(ev.event_id, Uuid::parse_str(EVENT_ID).unwrap());
    }

    #[test]
    fn what_the_signer_signs_the_hub_verifies_with_its_exact_body() {
        let ev = revoke();
        let ring = ring();
        let v = verify_envelope(&ev.envelope, &ctx(&ring)).unwrap();
        assert_eq!(v.body, ev.body);
        assert_eq!(v.header.seq, Some(7));
        assert_eq!(v.header.issued_at, issued_at());
        assert_eq!(v.signer, "cloud-test");
        let env: Value = serde_json::from_slice(&ev.envelope).unwrap();
        assert_eq!(env["v"], ENVELOPE_VERSION);
    }

    #[test]
    fn each_event_type_parses_back_into_what_was_asked() {
        let schema = SchemaContext::new(["101"], ["k1"]);
        let mut g =
            GrantSpec::active_at(issued_at(), "k-2", "c-1", "101", "482913", ("k1", &[1; 32]));
        g.schedule = Some(
            Schedule::new(vec![
                crate::schedule::Interval::parse_text("mon-fri 09:00-17:30").unwrap(),
            ])
            .unwrap(),
        );
        g.max_uses = Some(5);
        let ring = ring();
        let s = signer();
        let id = Uuid::parse_str(EVENT_ID).unwrap();
        let parsed = |kind: &str, seq, f| {
            let ev = s.sign(id, issued_at(), kind, seq, f);
            let v = verify_envelope(&ev.envelope, &ctx(&ring)).unwrap();
            parse_body(&v.body, &schema).unwrap()
        };
        match parsed("key.issued", Some(1), fields::key_issued(&g, &["k-0"])) {
            EventKind::Change(Change::KeyIssued { key, supersedes }) => {
                assert_eq!(key.key_id, "k-2");
                assert_eq!(key.pin_tag.0, g.pin_tag);
                assert_eq!(key.valid_until, g.valid_until);
                assert_eq!(key.schedule, g.schedule);
                assert_eq!(key.max_uses, Some(5));
                assert_eq!(supersedes, ["k-0"]);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parsed(
                "checkin.completed",
                Some(2),
                fields::checkin_completed("r-1", "c-1", &g)
            ),
            EventKind::Change(Change::CheckinCompleted { .. })
        ));
        assert!(matches!(
            parsed("guest.erased", Some(3), fields::guest_erased("g-1")),
            EventKind::Change(Change::GuestErased { .. })
        ));
        match parsed(
            "batch",
            Some(4),
            fields::batch_issue(&[g.clone(), g.clone()]),
        ) {
            EventKind::Batch(items) => assert_eq!(items.len(), 2),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parsed("checkpoint", None, fields::checkpoint(4)),
            EventKind::Checkpoint {
                head_seq: 4,
                mirror: None
            }
        );
    }

    #[test]
    fn a_pre_issued_grant_names_its_reservation_and_no_check_in() {
        let g = GrantSpec::pre_issued("k-3", "r-1", "101", "1234", ("k1", &[1; 32]));
        let j = g.to_json();
        assert_eq!(j["state"], "pre_issued");
        assert_eq!(j["reservation_id"], "r-1");
        assert!(j.get("check_in_id").is_none());
        assert!(j.get("holder_name").is_none());
    }

    #[test]
    fn debug_output_leaves_pin_tags_and_bodies_out() {
        let g = GrantSpec::active_at(issued_at(), "k-2", "c-1", "101", "482913", ("k1", &[1; 32]));
        let tag = crypto::b64u_encode(&g.pin_tag);
        let shown = format!("{g:?} {:?} {:?}", revoke(), signer());
        assert!(!shown.contains(&tag), "{shown}");
        assert!(!shown.contains(&format!("{:?}", g.pin_tag)), "{shown}");
        assert!(!shown.contains("checkout"), "{shown}");
    }
}
