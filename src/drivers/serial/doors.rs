//! The serial driver's answers to decided keypad entries. Which entry is
//! decided when, and deciding it, are [`crate::door::entry`]'s (shared with the
//! OSDP driver); the door sensor and the flood limit are [`crate::door::sensor`]'s.

use firmware_bridge::{DenyReason as WireDeny, Pin};

use super::PortShared;
use super::port::DoorTarget;
use crate::door::entry::{self, Answer};

/// What to answer a decided keypad entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    Unlock { key_id: String },
    Deny { reason: WireDeny },
}

/// Decides one keypad entry ([`entry::decide`]) and maps the answer to the
/// board's: `Unlock`, or `Deny` with `LOCKED_OUT` or `DENIED`. Returns only
/// after the audit row is committed; within the answer bound of `received`
/// (when the entry was acked, also for one that waited behind another).
pub(crate) async fn decide(
    shared: &PortShared,
    target: &DoorTarget,
    pin: Pin,
    received: std::time::Instant,
) -> Reply {
    let answer = entry::decide(
        &shared.store,
        &shared.pin_keys,
        shared.policy,
        &shared.zone,
        entry::Entry {
            driver: &shared.port.name,
            door: &target.name,
            known: target.known,
            pin: pin.as_bytes(),
            at: shared.now(),
            received,
        },
        None,
    )
    .await;
    // The PIN is dropped here.
    drop(pin);
    shared.wake_outbox();
    match answer {
        Answer::Unlock { key_id } => Reply::Unlock { key_id },
        Answer::LockedOut => Reply::Deny {
            reason: WireDeny::LOCKED_OUT,
        },
        Answer::Deny => Reply::Deny {
            reason: WireDeny::DENIED,
        },
    }
}
