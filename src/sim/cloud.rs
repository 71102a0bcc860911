//! A simulated cloud key service: a per-hub `seq` counter, in memory, on top
//! of `lockhub_proto::sign` (which builds and signs the bodies the way
//! mqtt.md describes them), so a test or the demo can say "issue this key"
//! and get exactly the bytes a real cloud would send.

use ed25519_dalek::SigningKey;
use lockhub_proto::sign::{EventSigner, GrantSpec, SignedEvent, fields};
use lockhub_proto::time::Timestamp;
use serde_json::Value;
use uuid::Uuid;

/// The cloud's side of one hub.
pub struct Cloud {
    signer: EventSigner,
    next_seq: u64,
}

impl Cloud {
    /// A cloud that signs as `signer_id` with `key`, for one hub.
    pub fn new(key: SigningKey, signer_id: &str, site_id: Uuid, hub_id: &str) -> Self {
        Cloud {
            signer: EventSigner::new(key, signer_id, site_id, hub_id),
            next_seq: 1,
        }
    }

    /// The public key to put in the hub's trust ring (base64url).
    pub fn public_key_b64u(&self) -> String {
        self.signer.public_key_b64u()
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
        self.event("key.issued", fields::key_issued(grant, supersedes))
    }

    /// `key.revoked`.
    pub fn key_revoked(&mut self, key_id: &str, version: u64, reason: &str) -> SignedEvent {
        self.event("key.revoked", fields::key_revoked(key_id, version, reason))
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
            fields::checkin_completed(reservation_id, check_in_id, grant),
        )
    }

    /// `guest.erased`.
    pub fn guest_erased(&mut self, holder_ref: &str) -> SignedEvent {
        self.event("guest.erased", fields::guest_erased(holder_ref))
    }

    /// `batch` of `key.issued` items.
    pub fn batch_issue(&mut self, grants: &[GrantSpec]) -> SignedEvent {
        self.event("batch", fields::batch_issue(grants))
    }

    /// `checkpoint` at the current head (no seq of its own).
    pub fn checkpoint(&mut self) -> SignedEvent {
        let head = self.head_seq();
        self.sign("checkpoint", None, fields::checkpoint(head))
    }

    /// Signs a body with an explicit seq (or none), without touching the
    /// counter: a fresh v4 event id, issued now by the system clock.
    pub fn sign(&self, kind: &str, seq: Option<u64>, fields: Value) -> SignedEvent {
        self.signer
            .sign(Uuid::new_v4(), Timestamp::now_system(), kind, seq, fields)
    }

    /// Signs any bytes as a body and builds the envelope.
    pub fn envelope(&self, event_id: Uuid, body: &[u8]) -> Vec<u8> {
        self.signer.envelope(event_id, body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockhub_proto::crypto;
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
            Ok(EventKind::Checkpoint {
                head_seq: 1,
                mirror: None
            })
        );
    }
}
