//! A simulated cloud key service: it builds event bodies the way mqtt.md
//! describes them, signs them with a trust-ring key, and wraps them in cloud
//! envelopes. It keeps the per-hub `seq` counter, so a test or the demo can
//! say "issue this key" and get exactly the bytes a real cloud would send.

use ed25519_dalek::SigningKey;
use lockhub_proto::crypto::{self, EVENT_CONTEXT};
use lockhub_proto::time::Timestamp;
use serde_json::{Value, json};
use uuid::Uuid;

/// A key grant to send, in plain terms. The PIN is turned into its tag with
/// the hub's PIN key here, as the cloud would; the PIN itself goes nowhere.
#[derive(Debug, Clone)]
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
}

impl GrantSpec {
    /// An active key for one door, with the tag of `pin` under `pin_key`.
    pub fn active(
        key_id: &str,
        check_in_id: &str,
        door: &str,
        pin: &str,
        pin_key: (&str, &[u8; 32]),
    ) -> Self {
        let now = Timestamp::now_system();
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
        }
    }

    /// A pre-issued key of a reservation, for one door.
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

    fn to_json(&self) -> Value {
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
        key
    }
}

/// A signed cloud event, ready to publish, with what was signed.
#[derive(Debug, Clone)]
pub struct SignedEvent {
    pub event_id: Uuid,
    pub seq: Option<u64>,
    /// The exact signed body bytes.
    pub body: Vec<u8>,
    /// The envelope to publish on `P/S/H/events`.
    pub envelope: Vec<u8>,
}

/// The cloud's side of one hub.
pub struct Cloud {
    key: SigningKey,
    signer_id: String,
    site_id: Uuid,
    hub_id: String,
    next_seq: u64,
}

impl Cloud {
    /// A cloud that signs as `signer_id` with `key`, for one hub.
    pub fn new(key: SigningKey, signer_id: &str, site_id: Uuid, hub_id: &str) -> Self {
        Cloud {
            key,
            signer_id: signer_id.to_owned(),
            site_id,
            hub_id: hub_id.to_owned(),
            next_seq: 1,
        }
    }

    /// The public key to put in the hub's trust ring (base64url).
    pub fn public_key_b64u(&self) -> String {
        crypto::b64u_encode(self.key.verifying_key().as_bytes())
    }

    /// The seq the next event will carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The last seq used (the head a checkpoint reports).
    pub fn head_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Signs a body with the given type-specific fields, taking the next seq.
    pub fn event(&mut self, kind: &str, fields: Value) -> SignedEvent {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.sign(kind, Some(seq), fields)
    }

    /// `key.issued`, optionally superseding other keys.
    pub fn key_issued(&mut self, grant: &GrantSpec, supersedes: &[&str]) -> SignedEvent {
        let mut fields = json!({ "key": grant.to_json() });
        if !supersedes.is_empty() {
            fields["supersedes"] = json!(supersedes);
        }
        self.event("key.issued", fields)
    }

    /// `key.revoked`.
    pub fn key_revoked(&mut self, key_id: &str, version: u64, reason: &str) -> SignedEvent {
        self.event(
            "key.revoked",
            json!({ "key_id": key_id, "version": version, "reason": reason }),
        )
    }

    /// `checkin.completed`: the reservation's pre-issued keys give way to `grant`.
    pub fn checkin(
        &mut self,
        reservation_id: &str,
        check_in_id: &str,
        grant: &GrantSpec,
    ) -> SignedEvent {
        self.event(
            "checkin.completed",
            json!({ "reservation_id": reservation_id, "check_in_id": check_in_id, "key": grant.to_json() }),
        )
    }

    /// `guest.erased`.
    pub fn guest_erased(&mut self, holder_ref: &str) -> SignedEvent {
        self.event("guest.erased", json!({ "holder_ref": holder_ref }))
    }

    /// `batch` of `key.issued` items.
    pub fn batch_issue(&mut self, grants: &[GrantSpec]) -> SignedEvent {
        let items: Vec<Value> = grants
            .iter()
            .map(|g| json!({ "type": "key.issued", "key": g.to_json() }))
            .collect();
        self.event("batch", json!({ "items": items }))
    }

    /// `checkpoint` at the current head (no seq of its own).
    pub fn checkpoint(&mut self) -> SignedEvent {
        let head = self.head_seq();
        self.sign("checkpoint", None, json!({ "head_seq": head }))
    }

    /// Signs a body with an explicit seq (or none), without touching the counter.
    pub fn sign(&self, kind: &str, seq: Option<u64>, fields: Value) -> SignedEvent {
        let event_id = Uuid::new_v4();
        let mut body = json!({
            "event_id": event_id.to_string(),
            "site_id": self.site_id.to_string(),
            "hub_id": self.hub_id,
            "type": kind,
            "issued_at": Timestamp::now_system().to_rfc3339(),
        });
        if let Some(seq) = seq {
            body["seq"] = json!(seq);
        }
        if let (Some(obj), Value::Object(extra)) = (body.as_object_mut(), fields) {
            obj.extend(extra);
        }
        let body = serde_json::to_vec(&body).expect("JSON values serialize");
        let envelope = self.envelope(event_id, &body);
        SignedEvent {
            event_id,
            seq,
            body,
            envelope,
        }
    }

    /// Wraps already-signed-or-not bytes: signs `body` and builds the envelope.
    pub fn envelope(&self, event_id: Uuid, body: &[u8]) -> Vec<u8> {
        let sig = crypto::sign(EVENT_CONTEXT, &self.key, body);
        serde_json::to_vec(&json!({
            "v": 1,
            "event_id": event_id.to_string(),
            "signer": self.signer_id,
            "body": crypto::b64u_encode(body),
            "sig": crypto::b64u_encode(&sig),
        }))
        .expect("JSON values serialize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockhub_proto::event::{EventKind, SchemaContext, parse_body};
    use lockhub_proto::verify::Signer;
    use lockhub_proto::verify::{VerifyContext, verify_envelope};

    #[test]
    fn what_the_simulated_cloud_signs_the_hub_verifies_and_parses() {
        let site = Uuid::new_v4();
        let mut cloud = Cloud::new(SigningKey::from_bytes(&[9; 32]), "sim", site, "hub-1");
        let ring = [Signer {
            id: "sim".into(),
            public_key: crypto::parse_public_key(&cloud.public_key_b64u()).unwrap(),
            not_after: None,
        }];
        let ctx = VerifyContext {
            ring: &ring,
            site_id: site,
            hub_id: "hub-1",
            now: Timestamp::now_system(),
        };
        let schema = SchemaContext::new(["101".to_owned()], ["k1".to_owned()]);
        let grant = GrantSpec::active("k-1", "c-1", "101", "482913", ("k1", &[1; 32]));
        let ev = cloud.key_issued(&grant, &[]);
        let verified = verify_envelope(&ev.envelope, &ctx).unwrap();
        assert_eq!(verified.header.seq, Some(1));
        assert!(matches!(
            parse_body(&verified.body, &schema),
            Ok(EventKind::Change(_))
        ));
        let cp = cloud.checkpoint();
        let verified = verify_envelope(&cp.envelope, &ctx).unwrap();
        assert_eq!(verified.header.seq, None);
        assert_eq!(
            parse_body(&verified.body, &schema),
            Ok(EventKind::Checkpoint { head_seq: 1 })
        );
    }
}
