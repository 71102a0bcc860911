//! The messages of the serial contract (`serial.md`, "Messages").
//!
//! The enum layout *is* the wire format: postcard encodes a variant as
//! `varint(index)` followed by its fields in declaration order, so the order
//! of variants and fields below must follow the tables in `serial.md` and
//! must never be reordered. The golden vectors test pins this down.

use core::fmt;

use heapless::Vec;
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// Fewest digits a well-formed PIN has (`serial.md`: 4..=12 ASCII digits).
pub const PIN_MIN_DIGITS: usize = 4;
/// Most digits a well-formed PIN has.
pub const PIN_MAX_DIGITS: usize = 12;
/// Most bytes the `pin` field may carry *on the wire* and still decode.
///
/// Why not 12: the contract says a Keypad whose pin is not 4..=12 ASCII
/// digits must still reach the hub, so it can be acked, denied and audited as
/// `bad_format` (and counted toward the lockout). If decoding stopped at 12
/// bytes, a 13-digit entry would be dropped as a bad frame, never acked, and
/// the board would resend it into the void. So the bound is what can fit in
/// a Keypad payload at all: 64 bytes minus variant (1), the shortest seq
/// varint (1, for seq 0..=127), door (1) and the length varint (1). Anything
/// longer cannot be inside a valid frame; the deserializer still rejects it
/// with an error.
pub const PIN_WIRE_MAX: usize = crate::frame::MAX_PAYLOAD - 4;

/// The `pin` field of [`Uplink::Keypad`], held as raw bytes.
///
/// On the wire it is a postcard `str` (varint length, then bytes), which is
/// byte-for-byte the same as a postcard byte slice. We read it as bytes so
/// that invalid UTF-8 or non-digits still decode (see [`PIN_WIRE_MAX`]); the
/// hub validates with [`Pin::as_digits`].
///
/// `Debug` never shows the digits, so a PIN cannot leak into a log through
/// `{:?}` of a message. Equality is constant-time in the contents.
#[derive(Clone, Default)]
pub struct Pin {
    bytes: Vec<u8, PIN_WIRE_MAX>,
}

impl Pin {
    /// A well-formed PIN (4..=12 ASCII digits), or `None`.
    pub fn from_digits(digits: &str) -> Option<Self> {
        let pin = Self::from_wire_bytes(digits.as_bytes())?;
        pin.as_digits().is_some().then_some(pin)
    }

    /// Any byte string that fits the wire bound, valid PIN or not.
    ///
    /// Why: a board sends what was typed and the hub judges it; tests and
    /// simulators also need to send malformed PINs on purpose.
    pub fn from_wire_bytes(bytes: &[u8]) -> Option<Self> {
        let mut v = Vec::new();
        v.extend_from_slice(bytes).ok()?;
        Some(Self { bytes: v })
    }

    /// The raw bytes as received. Handle with care: this is the secret.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The PIN as a digit string if it is 4..=12 ASCII digits, else `None`
    /// (the hub's `bad_format` case).
    pub fn as_digits(&self) -> Option<&str> {
        let b = self.as_bytes();
        let ok = (PIN_MIN_DIGITS..=PIN_MAX_DIGITS).contains(&b.len())
            && b.iter().all(u8::is_ascii_digit);
        if ok {
            core::str::from_utf8(b).ok()
        } else {
            None
        }
    }

    /// Number of bytes in the field (not secret-free, but not the digits).
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// True if the field is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl PartialEq for Pin {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.as_bytes(), other.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        // Constant time in the contents: no early exit on the first mismatch.
        a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}
impl Eq for Pin {}

impl fmt::Debug for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Pin(<redacted>)")
    }
}

impl Serialize for Pin {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // postcard: varint(len) + bytes, identical to how it encodes `str`.
        s.serialize_bytes(self.as_bytes())
    }
}

impl<'de> Deserialize<'de> for Pin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_bytes(PinVisitor)
    }
}

struct PinVisitor;

impl<'de> de::Visitor<'de> for PinVisitor {
    type Value = Pin;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at most {PIN_WIRE_MAX} bytes")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Pin, E> {
        Pin::from_wire_bytes(v).ok_or_else(|| E::invalid_length(v.len(), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Pin, E> {
        self.visit_bytes(v.as_bytes())
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Pin, A::Error> {
        let mut v: Vec<u8, PIN_WIRE_MAX> = Vec::new();
        while let Some(b) = seq.next_element::<u8>()? {
            v.push(b)
                .map_err(|_| de::Error::invalid_length(PIN_WIRE_MAX + 1, &self))?;
        }
        Ok(Pin { bytes: v })
    }
}

/// Why a hub denied an entry (`Downlink::Deny.reason`).
///
/// A newtype over the wire `u8` rather than an enum, so a reason this
/// firmware does not know still decodes (and is shown as a plain deny)
/// instead of dropping the whole frame.
#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq, Debug)]
pub struct DenyReason(pub u8);

impl DenyReason {
    /// Wrong PIN, unknown door or bad format: `serial.md` allows no finer hint.
    pub const DENIED: Self = Self(1);
    /// The door's keypad is locked out after too many denials.
    pub const LOCKED_OUT: Self = Self(2);
}

/// Board -> hub messages. Variant and field order are the wire format.
///
/// Sequenced variants (`Keypad`, `DoorSensor`, `Tamper`) are normally built
/// with `seq: 0` and sent through [`crate::link::Link::send`], which stamps
/// the real seq.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
pub enum Uplink {
    /// The board (re)started, or answers the hub's `Hello`.
    Hello {
        /// Board identity, as configured on the board.
        board_id: u8,
        /// Firmware major version.
        fw_major: u8,
        /// Firmware minor version.
        fw_minor: u8,
        /// Doors wired to this board.
        door_count: u8,
    },
    /// '#' was pressed at `door` after typing `pin`.
    Keypad {
        /// Board's seq; the hub acks it.
        seq: u16,
        /// Board-local door index.
        door: u8,
        /// What was typed, unvalidated.
        pin: Pin,
    },
    /// A door contact changed.
    DoorSensor {
        /// Board's seq; the hub acks it.
        seq: u16,
        /// Board-local door index.
        door: u8,
        /// True if the door is open.
        open: bool,
    },
    /// Acknowledges a hub command with this seq.
    Ack {
        /// The hub's seq being acknowledged.
        seq: u16,
    },
    /// Periodic sign of life with the board's uptime.
    Heartbeat {
        /// Seconds since the board started.
        uptime_s: u32,
    },
    /// The enclosure tamper switch fired.
    Tamper {
        /// Board's seq; the hub acks it.
        seq: u16,
    },
    /// Answer to `Downlink::Ping`, echoing its nonce.
    Pong {
        /// The nonce of the Ping being answered.
        nonce: u32,
    },
    /// Sealed link, plain: the board's answer to the hub's `SealHello`
    /// (see [`crate::seal`]).
    SealHello {
        /// Board identity, also bound into `tag`.
        board_id: u8,
        /// 16 fresh random bytes.
        board_nonce: [u8; 16],
        /// First 16 bytes of HMAC-SHA256(LK, "lockhub-seal-board" ||
        /// hub_nonce || board_nonce || board_id).
        tag: [u8; 16],
    },
    /// Pairing, plain: the board's fresh X25519 public key, sent only after
    /// a `PairStart` (see [`crate::pair`]).
    PairReply {
        /// The board's X25519 public key.
        board_pub: [u8; 32],
    },
    /// Pairing, plain: whether the code typed on the board matched (and the
    /// new key is stored), or why pairing stopped.
    PairDone {
        /// True only when the board stored the new link key.
        ok: bool,
    },
    /// Rekey, sealed: the board's fresh X25519 public key.
    RekeyReply {
        /// The board's X25519 public key.
        board_pub: [u8; 32],
    },
}

/// Hub -> board messages. Variant and field order are the wire format.
#[derive(Serialize, Deserialize, Clone, PartialEq, Eq, Debug)]
pub enum Downlink {
    /// Open the relay of `door` for `ms` milliseconds.
    Unlock {
        /// Hub's seq; the board acks it.
        seq: u16,
        /// Board-local door index.
        door: u8,
        /// Relay open time in milliseconds.
        ms: u16,
    },
    /// Show that the entry at `door` was refused.
    Deny {
        /// Hub's seq; the board acks it.
        seq: u16,
        /// Board-local door index.
        door: u8,
        /// Denied (1) or locked out (2); nothing finer, by design.
        reason: DenyReason,
    },
    /// Acknowledges a board event with this seq.
    Ack {
        /// The board's seq being acknowledged.
        seq: u16,
    },
    /// Liveness probe; the board answers `Pong` with the same nonce.
    Ping {
        /// Echoed in the Pong.
        nonce: u32,
    },
    /// The hub opened the port: the board forgets the hub's seqs and
    /// answers with its own `Hello`.
    Hello {
        /// Random per port opening.
        session: u32,
    },
    /// Sealed link, plain: the hub asks for a session (replaces `Hello`
    /// on a sealed link).
    SealHello {
        /// 16 fresh random bytes.
        hub_nonce: [u8; 16],
    },
    /// Sealed link, plain: the hub's proof of the link key; once it
    /// verifies, both sides switch to the new session.
    SealConfirm {
        /// First 16 bytes of HMAC-SHA256(LK, "lockhub-seal-hub" ||
        /// hub_nonce || board_nonce).
        tag: [u8; 16],
    },
    /// Pairing, plain: the hub's commitment to its X25519 public key.
    PairStart {
        /// SHA-256("lockhub-pair-commit" || hub_pub).
        commit: [u8; 32],
    },
    /// Pairing, plain: the hub's X25519 public key, sent only after the
    /// board's `PairReply`.
    PairReveal {
        /// The hub's X25519 public key.
        hub_pub: [u8; 32],
    },
    /// Rekey, sealed: the hub's fresh X25519 public key.
    RekeyStart {
        /// The hub's X25519 public key.
        hub_pub: [u8; 32],
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_debug_never_shows_the_digits() {
        let pin = Pin::from_digits("123456").unwrap();
        let msg = Uplink::Keypad {
            seq: 1,
            door: 0,
            pin,
        };
        let mut s: heapless::String<128> = heapless::String::new();
        core::fmt::write(&mut s, format_args!("{msg:?}")).unwrap();
        assert!(!s.contains("123456"), "{s}");
        assert!(s.contains("redacted"));
    }

    #[test]
    fn pin_accepts_only_4_to_12_ascii_digits_as_digits() {
        assert!(Pin::from_digits("123").is_none());
        assert!(Pin::from_digits("1234").is_some());
        assert!(Pin::from_digits("123456789012").is_some());
        assert!(Pin::from_digits("1234567890123").is_none());
        assert!(Pin::from_digits("12a4").is_none());
        let bad = Pin::from_wire_bytes(&[0xff, 0xfe, b'1', b'2']).unwrap();
        assert_eq!(bad.as_digits(), None);
        assert_eq!(bad.len(), 4);
    }

    #[test]
    fn keypad_with_invalid_utf8_pin_still_decodes() {
        // Keypad{seq:1, door:0, pin: ff fe 31 32}
        let payload = [0x01, 0x01, 0x00, 0x04, 0xff, 0xfe, 0x31, 0x32];
        let msg: Uplink = postcard::from_bytes(&payload).unwrap();
        match msg {
            Uplink::Keypad { seq, door, pin } => {
                assert_eq!((seq, door), (1, 0));
                assert_eq!(pin.as_bytes(), &[0xff, 0xfe, 0x31, 0x32]);
                assert_eq!(pin.as_digits(), None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn keypad_with_13_digit_pin_decodes_so_the_hub_can_deny_it() {
        let pin = Pin::from_wire_bytes(b"1234567890123").unwrap();
        let msg = Uplink::Keypad {
            seq: 9,
            door: 1,
            pin,
        };
        let mut buf = [0u8; 64];
        let bytes = postcard::to_slice(&msg, &mut buf).unwrap();
        let back: Uplink = postcard::from_bytes(bytes).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn the_longest_pin_a_payload_can_hold_still_decodes_as_a_keypad() {
        // Variant, a one-byte seq, door and length: 60 bytes are left.
        let mut payload = [b'7'; crate::frame::MAX_PAYLOAD];
        payload[..4].copy_from_slice(&[0x01, 0x05, 0x00, PIN_WIRE_MAX as u8]);
        let msg = postcard::from_bytes::<Uplink>(&payload).unwrap();
        match &msg {
            Uplink::Keypad { seq, door, pin } => {
                assert_eq!((*seq, *door, pin.as_bytes().len()), (5, 0, PIN_WIRE_MAX));
                assert_eq!(pin.as_digits(), None, "decided bad_format by the hub");
            }
            other => panic!("{other:?}"),
        }
        let mut buf = [0u8; crate::frame::MAX_PAYLOAD];
        assert_eq!(postcard::to_slice(&msg, &mut buf).unwrap(), &payload[..]);
        let mut out = [0u8; crate::frame::MAX_FRAME];
        assert!(
            crate::frame::encode_frame(&msg, &mut out).is_ok(),
            "it fits a frame"
        );
    }

    #[test]
    fn pin_longer_than_the_wire_bound_fails_cleanly() {
        let mut payload = [b'1'; 80];
        payload[0] = 0x01; // Keypad
        payload[1] = 0x01; // seq
        payload[2] = 0x00; // door
        payload[3] = (PIN_WIRE_MAX + 1) as u8; // len 61
        assert!(postcard::from_bytes::<Uplink>(&payload).is_err());
        // A huge length varint must not panic or allocate either.
        let huge = [0x01, 0x01, 0x00, 0xff, 0xff, 0xff, 0xff, 0x0f, b'1'];
        assert!(postcard::from_bytes::<Uplink>(&huge).is_err());
    }

    #[test]
    fn pin_field_is_encoded_exactly_like_a_postcard_str() {
        let mut a = [0u8; 32];
        let mut b = [0u8; 32];
        let pin = Pin::from_digits("0042").unwrap();
        let x = postcard::to_slice(&pin, &mut a).unwrap();
        let y = postcard::to_slice("0042", &mut b).unwrap();
        assert_eq!(x, y);
    }

    #[test]
    fn unknown_deny_reason_still_decodes() {
        let payload = [0x01, 0x05, 0x00, 0x09];
        let msg: Downlink = postcard::from_bytes(&payload).unwrap();
        assert_eq!(
            msg,
            Downlink::Deny {
                seq: 5,
                door: 0,
                reason: DenyReason(9)
            }
        );
    }
}
