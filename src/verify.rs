//! Step 1 of every cloud event: is this message genuine, and is it for us?
//!
//! Pure: bytes in, a [`VerifiedEvent`] or a stable [`Reason`] out. The size
//! limit comes before any parsing, the signature before the body is parsed,
//! and the body's ids are bound to this hub before anything is claimed.

use crate::event::EventHeader;

/// The largest cloud envelope the hub will look at (mqtt.md 'Envelopes').
pub const MAX_ENVELOPE_BYTES: usize = 1024 * 1024;

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
