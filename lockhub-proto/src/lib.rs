//! # lockhub-proto
//!
//! The MQTT wire contract of lockhub (docs/protocol/mqtt.md), as the hub and
//! the cloud share it: one home for every wire type and every rule about one,
//! so the two sides cannot drift apart. Pure: no runtime, no database, no
//! I/O; bytes and plain data in, bytes and plain data out.
//!
//! | module | what lives there |
//! |---|---|
//! | [`time`] | [`time::Timestamp`] (µs since the epoch), RFC 3339 |
//! | [`bundle`] | the provisioning bundle the cloud writes and `lockhub provision` reads |
//! | [`crypto`] | PIN tags (HMAC-SHA256), base64url, domain-separated Ed25519, hub envelopes (made and opened) |
//! | [`event`] | the cloud's events and the hub's results as plain data; the id rules; body parsing (step 4) |
//! | [`mirror`] | the mirror proof: live filter, lines, buckets, bucket and mirror digests (incremental), the checkpoint claim |
//! | [`outputs`] | the hub's bodies as serde types (audit, alert, sync request, status, the three proof forms) and their wire codes (AuditKind, Condition, ...) |
//! | [`schedule`] | weekly schedules: the wire form, the text for people, and whether an instant's local wall time is inside |
//! | [`sign`] | the cloud's side, pure: `GrantSpec`, event bodies, `EventSigner` (seq, id and time given), cloud envelopes |
//! | [`topics`] | the seven topic leaves, `P/S/H/leaf` built and parsed back strictly |
//! | [`verify`] | step 1 of an event: size, envelope, signer, `verify_strict`, ids; the trust-ring entry [`verify::Signer`] |

pub mod bundle;
pub mod crypto;
pub mod event;
pub mod mirror;
pub mod outputs;
pub mod schedule;
pub mod sign;
pub mod time;
pub mod topics;
pub mod verify;
