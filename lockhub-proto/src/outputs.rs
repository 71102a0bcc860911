//! What the hub tells the cloud, as serde types: the hub serialises its
//! bodies through them and the cloud parses them back with the same types
//! (mqtt.md 'Results', 'Audit', 'Alerts', 'Status', 'Mirror proof' and the
//! sync request of 'Topics'). The result body itself is
//! [`crate::event::EventResult`].
//!
//! Field order is declaration order and is part of the bytes: every struct
//! here declares its fields in the order the hub has always written them
//! (sorted, as `serde_json`'s maps write them), so adopting a type changed
//! no byte on the wire. Optional extras are left out when absent.

use crate::event::GrantState;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Declares a fieldless enum of stable wire codes: `as_str`, `parse`, `ALL`,
/// and serde as the code string.
macro_rules! wire_codes {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $( $(#[$vmeta:meta])* $variant:ident = $code:literal, )+ }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $( $(#[$vmeta])* $variant, )+ }

        impl $name {
            pub const ALL: [$name; [$($code),+].len()] = [$($name::$variant),+];

            /// The stable wire code.
            pub fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $code, )+ }
            }

            /// The value named `s` in the contract's spelling.
            pub fn parse(s: &str) -> Option<Self> {
                Self::ALL.into_iter().find(|v| v.as_str() == s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                $name::parse(&s).ok_or_else(|| {
                    serde::de::Error::unknown_variant(&s, &[$($code),+])
                })
            }
        }
    };
}

wire_codes! {
    /// What an audit row records (mqtt.md 'Audit').
    pub enum AuditKind {
        DoorGranted = "door.granted",
        DoorUnlocked = "door.unlocked",
        DoorUnlockUnconfirmed = "door.unlock_unconfirmed",
        DoorDenied = "door.denied",
        DoorLockedOut = "door.locked_out",
        DoorForced = "door.forced",
        DoorHeldOpen = "door.held_open",
        BoardTamper = "board.tamper",
        /// An operator cleared an alert by hand (`lockhub alert clear`).
        AlertCleared = "alert.cleared",
        /// Keypad entries past the flood limit, one row per door per minute
        /// with their `count` (serial.md 'Door decisions').
        DoorFlood = "door.flood",
        KeyActivated = "key.activated",
        KeyRevoked = "key.revoked",
        KeyExpired = "key.expired",
        /// The grant that took the last of `max_uses` (mqtt.md 'Grant').
        KeyUsedUp = "key.used_up",
    }
}

wire_codes! {
    /// The alert conditions of mqtt.md 'Alerts' that the hub raises.
    pub enum Condition {
        KeypadLockout = "keypad_lockout",
        BoardOffline = "board_offline",
        DoorForced = "door_forced",
        DoorHeldOpen = "door_held_open",
        Tamper = "tamper",
        BadSignature = "bad_signature",
        MalformedEvent = "malformed_event",
        EventIdConflict = "event_id_conflict",
        PinAmbiguous = "pin_ambiguous",
        ClockUntrusted = "clock_untrusted",
        CloudStale = "cloud_stale",
        OutboxBacklog = "outbox_backlog",
        StorageFailure = "storage_failure",
        SignerExpiring = "signer_expiring",
        /// Keypad entries past the flood limit at a door (subject: the door).
        KeypadFlood = "keypad_flood",
        /// The board's Hello does not cover a configured door (subject: the door).
        BoardMismatch = "board_mismatch",
        LinkInsecure = "link_insecure",
        ReaderLinkFault = "reader_link_fault",
        ReaderReplaced = "reader_replaced",
        /// The broker refused the hub's connection or its subscription.
        BrokerDenied = "broker_denied",
        /// The hub's mirror proof differs from the cloud's claim (subject:
        /// the hub id); ends at the next proof that matches.
        MirrorDiverged = "mirror_diverged",
        /// Faults on a lock board's sealed link: frames that fail, failed
        /// handshakes, plain `Hello`s that were not the board's (serial.md,
        /// "Sealed link"; subject: the serial name).
        BoardLinkFault = "board_link_fault",
    }
}

impl Condition {
    /// Conditions that are occurrences rather than states: nothing reports
    /// their end, so they end after `policy.cloud_stale_s` without a new
    /// occurrence (mqtt.md 'Every alert ends').
    pub fn ends_when_quiet(self) -> bool {
        matches!(
            self,
            Condition::BadSignature
                | Condition::MalformedEvent
                | Condition::EventIdConflict
                | Condition::KeypadFlood
        )
    }
}

wire_codes! {
    /// Whether an alert holds.
    pub enum AlertState {
        Raised = "raised",
        Cleared = "cleared",
    }
}

wire_codes! {
    /// Why the hub asks for events (the `reason` of a sync request).
    pub enum SyncReason {
        /// An event arrived above a hole in the seqs.
        Gap = "gap",
        /// The broker session is new: queued events may have been lost.
        FreshSession = "fresh_session",
        /// A checkpoint's `head_seq` is above the watermark.
        BehindCheckpoint = "behind_checkpoint",
    }
}

wire_codes! {
    /// The retained status's `state`.
    pub enum HubState {
        Online = "online",
        /// Also the last will.
        Offline = "offline",
    }
}

/// Serialises a body the hub builds from plain data: it has no map with
/// non-string keys, so it cannot fail.
pub fn to_body<T: Serialize>(body: &T) -> Vec<u8> {
    serde_json::to_vec(body).unwrap_or_default()
}

/// An audit body (mqtt.md 'Audit'). `holder_name` is never in it: personal
/// data stays on the hub, where erasure can reach it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditBody {
    /// A UUIDv7, so ids sort by time; the cloud dedupes on it.
    pub audit_id: Uuid,
    pub at: Timestamp,
    pub kind: AuditKind,
    pub door: Option<String>,
    pub key_id: Option<String>,
    pub check_in_id: Option<String>,
    pub holder_ref: Option<String>,
    pub reason: Option<String>,
    pub event_id: Option<Uuid>,
    /// Only on `alert.cleared`: the alert's condition (its subject is in
    /// `door`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<Condition>,
    /// Only on `door.flood`: how many entries the row counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i64>,
}

/// An alert body (mqtt.md 'Alerts'): one per (condition, subject) while it
/// holds, the same `alert_id` for its bumps and its clearing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertBody {
    pub alert_id: String,
    pub condition: Condition,
    pub subject: String,
    pub state: AlertState,
    pub count: i64,
    pub first_at: Timestamp,
    pub last_at: Timestamp,
}

/// A sync request, signed on `P/S/H/sync`: `{"from_seq": N, "reason": ..}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRequest {
    pub from_seq: u64,
    pub reason: SyncReason,
}

impl SyncRequest {
    /// The body published (signed) on `P/S/H/sync`.
    pub fn to_json(&self) -> Vec<u8> {
        to_body(self)
    }
}

/// The retained status (mqtt.md 'Status'): plain JSON, not signed (a hint).
/// The hub's online form adds `health`, its figures as a JSON object; the
/// last will never carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<serde_json::Value>,
    pub hub_id: String,
    pub state: HubState,
    /// The hub's software version.
    pub version: String,
}

/// The proof for a checkpoint the hub has caught up with (mqtt.md 'Mirror
/// proof'). `buckets` (the 256 bucket digests, base64url) only when the
/// digests differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    pub head_seq: u64,
    pub as_of: Timestamp,
    /// The hub's effective time.
    pub hub_time: Timestamp,
    pub count: u64,
    /// base64url of the mirror digest.
    pub digest: String,
    #[serde(rename = "match")]
    pub matches: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<Vec<String>>,
}

/// The proof of a hub that is ahead of a checkpoint: the cloud lost events
/// it once sent and moves its counter past `watermark`. `match` is always
/// `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofAhead {
    pub head_seq: u64,
    pub watermark: u64,
    #[serde(rename = "match")]
    pub matches: (),
}

/// One key of a bucket answer: the values its proof line uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofKey {
    pub key_id: String,
    pub version: u64,
    pub state: GrantState,
    /// Whole Unix seconds (the line's `U`).
    pub valid_until: i64,
}

/// The answer to a `mirror.request` for one bucket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProofBucket {
    pub head_seq: u64,
    pub as_of: Timestamp,
    pub bucket: u8,
    pub keys: Vec<ProofKey>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at() -> Timestamp {
        Timestamp::parse_rfc3339("2026-11-29T12:00:00Z").unwrap()
    }

    fn round_trip<T>(v: &T) -> T
    where
        T: Serialize + for<'de> Deserialize<'de>,
    {
        serde_json::from_slice(&to_body(v)).unwrap()
    }

    #[test]
    fn every_wire_code_parses_back_and_serialises_as_its_string() {
        for k in AuditKind::ALL {
            assert_eq!(AuditKind::parse(k.as_str()), Some(k));
            assert_eq!(serde_json::to_value(k).unwrap(), json!(k.as_str()));
            assert_eq!(round_trip(&k), k);
        }
        for c in Condition::ALL {
            assert_eq!(Condition::parse(c.as_str()), Some(c));
            assert_eq!(round_trip(&c), c);
        }
        assert_eq!(Condition::ALL.len(), 22);
        assert_eq!(AuditKind::ALL.len(), 14);
        assert!(serde_json::from_str::<AuditKind>(r#""door.opened""#).is_err());
        assert!(serde_json::from_str::<SyncReason>(r#""Gap""#).is_err());
    }

    #[test]
    fn an_audit_body_has_the_pages_fields_and_its_extras_only_when_set() {
        let mut b = AuditBody {
            audit_id: Uuid::from_u128(1),
            at: at(),
            kind: AuditKind::DoorGranted,
            door: Some("101".into()),
            key_id: Some("k-1".into()),
            check_in_id: None,
            holder_ref: None,
            reason: None,
            event_id: None,
            condition: None,
            count: None,
        };
        assert_eq!(
            String::from_utf8(to_body(&b)).unwrap(),
            r#"{"audit_id":"00000000-0000-0000-0000-000000000001","at":"2026-11-29T12:00:00.000000Z","kind":"door.granted","door":"101","key_id":"k-1","check_in_id":null,"holder_ref":null,"reason":null,"event_id":null}"#
        );
        assert_eq!(round_trip(&b), b);
        b.kind = AuditKind::AlertCleared;
        b.condition = Some(Condition::Tamper);
        b.count = Some(3);
        let v: serde_json::Value = serde_json::from_slice(&to_body(&b)).unwrap();
        assert_eq!(
            (v["condition"].clone(), v["count"].clone()),
            (json!("tamper"), json!(3))
        );
        assert_eq!(round_trip(&b), b);
    }

    #[test]
    fn an_alert_body_is_the_pages_shape() {
        let a = AlertBody {
            alert_id: "a-1".into(),
            condition: Condition::KeypadLockout,
            subject: "101".into(),
            state: AlertState::Raised,
            count: 1,
            first_at: at(),
            last_at: at(),
        };
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            json!({"alert_id": "a-1", "condition": "keypad_lockout", "subject": "101",
                   "state": "raised", "count": 1, "first_at": "2026-11-29T12:00:00.000000Z",
                   "last_at": "2026-11-29T12:00:00.000000Z"})
        );
        assert_eq!(round_trip(&a), a);
    }

    #[test]
    fn a_sync_request_and_a_status_are_written_in_sorted_key_order() {
        let r = SyncRequest {
            from_seq: 13,
            reason: SyncReason::BehindCheckpoint,
        };
        assert_eq!(
            r.to_json(),
            br#"{"from_seq":13,"reason":"behind_checkpoint"}"#
        );
        assert_eq!(round_trip(&r), r);
        let mut s = Status {
            at: at(),
            health: None,
            hub_id: "hub-1".into(),
            state: HubState::Offline,
            version: "1.2.3".into(),
        };
        assert_eq!(
            String::from_utf8(to_body(&s)).unwrap(),
            r#"{"at":"2026-11-29T12:00:00.000000Z","hub_id":"hub-1","state":"offline","version":"1.2.3"}"#
        );
        s.state = HubState::Online;
        s.health = Some(json!({"b": 1, "a": 2}));
        assert_eq!(
            String::from_utf8(to_body(&s)).unwrap(),
            r#"{"at":"2026-11-29T12:00:00.000000Z","health":{"a":2,"b":1},"hub_id":"hub-1","state":"online","version":"1.2.3"}"#
        );
        assert_eq!(round_trip(&s), s);
    }

    #[test]
    fn the_proof_bodies_are_the_pages_three_forms() {
        let p = Proof {
            head_seq: 40,
            as_of: at(),
            hub_time: at(),
            count: 1203,
            digest: "d".into(),
            matches: false,
            buckets: Some(vec!["b0".into()]),
        };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["match"], json!(false));
        assert_eq!(v["buckets"], json!(["b0"]));
        assert_eq!(round_trip(&p), p);
        let matched = Proof {
            matches: true,
            buckets: None,
            ..p
        };
        assert!(
            serde_json::to_value(&matched)
                .unwrap()
                .get("buckets")
                .is_none()
        );

        let ahead = ProofAhead {
            head_seq: 40,
            watermark: 45,
            matches: (),
        };
        assert_eq!(
            to_body(&ahead),
            br#"{"head_seq":40,"watermark":45,"match":null}"#
        );
        assert_eq!(round_trip(&ahead), ahead);

        let bucket = ProofBucket {
            head_seq: 45,
            as_of: at(),
            bucket: 17,
            keys: vec![ProofKey {
                key_id: "k-1".into(),
                version: 2,
                state: GrantState::PreIssued,
                valid_until: 1_796_385_600,
            }],
        };
        let v = serde_json::to_value(&bucket).unwrap();
        assert_eq!(
            v["keys"][0],
            json!({"key_id": "k-1", "version": 2, "state": "pre_issued", "valid_until": 1_796_385_600})
        );
        assert_eq!(round_trip(&bucket), bucket);
    }
}
