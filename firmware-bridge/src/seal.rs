//! The sealed link's cryptography (`serial.md`, "Sealed link"): the link
//! key, the handshake tags, the session keys, and sealing and opening
//! frames with their replay counters. Plain functions and two small state
//! holders ([`Sealer`], [`Opener`]); who sends what when is in
//! [`crate::sealed`].
//!
//! - handshake tags: the first 16 bytes of HMAC-SHA256(LK, label || ...),
//!   checked in constant time;
//! - session keys: 64 bytes of HKDF-SHA256(ikm = LK, salt = hub_nonce ||
//!   board_nonce, info = "lockhub-serial-v2 session"), board -> hub first;
//! - a sealed payload: `0xA5 || ctr_le || ChaCha20-Poly1305(key, nonce =
//!   dir || 7 zero bytes || ctr_le, aad = 0xA5 || ctr_le, message)`, the
//!   16-byte tag last. `ctr` starts at 1 and only rises; the receiver
//!   accepts a frame only above the last counter it accepted.
//!
//! Every secret (LK, session keys) is wiped when dropped ([`Zeroize`]) and
//! never shown by `Debug`.

use core::fmt;

use chacha20poly1305::aead::AeadInOut;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit, Nonce, Tag};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::frame::{FrameError, MAX_PAYLOAD, MAX_SEALED_PAYLOAD, SealedFrame, decode_payload};

/// First byte of every sealed payload. As a postcard varint it has its
/// continuation bit set and would name variant 37 or more, so no plain
/// message can start with it: a receiver tells the two apart by this byte.
pub const SEAL_MARK: u8 = 0xA5;
/// Bytes of the frame counter.
pub const CTR_LEN: usize = 4;
/// Bytes of the AEAD tag that ends a sealed payload.
pub const AEAD_TAG_LEN: usize = 16;
/// What sealing adds to a message: mark, counter and tag (21 bytes).
pub const SEAL_OVERHEAD: usize = 1 + CTR_LEN + AEAD_TAG_LEN;
/// Bytes of `hub_nonce` and `board_nonce`.
pub const NONCE_LEN: usize = 16;
/// Bytes of a handshake tag (HMAC-SHA256 cut to 16).
pub const HANDSHAKE_TAG_LEN: usize = 16;
/// Bytes of a link key.
pub const KEY_LEN: usize = 32;

const LABEL_BOARD: &[u8] = b"lockhub-seal-board";
const LABEL_HUB: &[u8] = b"lockhub-seal-hub";
const INFO_SESSION: &[u8] = b"lockhub-serial-v2 session";

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// A 16-byte handshake nonce (`hub_nonce`, `board_nonce`).
pub type HandshakeNonce = [u8; NONCE_LEN];
/// A 16-byte handshake tag.
pub type HandshakeTag = [u8; HANDSHAKE_TAG_LEN];

/// A board's 32-byte link key LK. Wiped on drop; `Debug` is redacted.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct LinkKey([u8; KEY_LEN]);

impl LinkKey {
    /// The key from its bytes (flash, the secrets file, a derivation).
    pub const fn from_bytes(bytes: [u8; KEY_LEN]) -> Self {
        Self(bytes)
    }

    /// The key's bytes, to persist it. Handle with care: this is the secret.
    pub fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// Constant-time comparison (which key verified, in tests and tools).
    pub fn ct_eq(&self, other: &Self) -> bool {
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("LinkKey(<redacted>)")
    }
}

/// HMAC-SHA256 keyed with `key` over the concatenation of `parts`.
pub(crate) fn hmac(key: &[u8], parts: &[&[u8]]) -> HmacSha256 {
    // HMAC takes a key of any length; `new_from_slice` cannot fail.
    #[allow(clippy::expect_used)]
    let mut mac = <HmacSha256 as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        mac.update(p);
    }
    mac
}

/// HKDF-SHA256 into a fixed-size output.
pub(crate) fn hkdf_sha256<const N: usize>(ikm: &[u8], salt: &[u8], info: &[u8]) -> [u8; N] {
    let mut okm = [0u8; N];
    // Every N used here is at most 64, far below HKDF-SHA256's 8160.
    #[allow(clippy::expect_used)]
    hkdf::Hkdf::<Sha256>::new(Some(salt), ikm)
        .expand(info, &mut okm)
        .expect("HKDF output within 255 hash lengths");
    okm
}

fn cut16(mac: HmacSha256) -> HandshakeTag {
    let full = mac.finalize().into_bytes();
    let mut tag = [0u8; HANDSHAKE_TAG_LEN];
    for (t, b) in tag.iter_mut().zip(full.iter()) {
        *t = *b;
    }
    tag
}

/// The board's handshake tag: HMAC-SHA256(LK, "lockhub-seal-board" ||
/// hub_nonce || board_nonce || board_id), first 16 bytes.
pub fn board_tag(
    lk: &LinkKey,
    hub_nonce: &HandshakeNonce,
    board_nonce: &HandshakeNonce,
    board_id: u8,
) -> HandshakeTag {
    cut16(hmac(
        lk.as_bytes(),
        &[LABEL_BOARD, hub_nonce, board_nonce, &[board_id]],
    ))
}

/// Check a board's tag in constant time.
pub fn verify_board_tag(
    lk: &LinkKey,
    hub_nonce: &HandshakeNonce,
    board_nonce: &HandshakeNonce,
    board_id: u8,
    tag: &HandshakeTag,
) -> bool {
    hmac(
        lk.as_bytes(),
        &[LABEL_BOARD, hub_nonce, board_nonce, &[board_id]],
    )
    .verify_truncated_left(tag)
    .is_ok()
}

/// The hub's handshake tag: HMAC-SHA256(LK, "lockhub-seal-hub" ||
/// hub_nonce || board_nonce), first 16 bytes.
pub fn hub_tag(
    lk: &LinkKey,
    hub_nonce: &HandshakeNonce,
    board_nonce: &HandshakeNonce,
) -> HandshakeTag {
    cut16(hmac(lk.as_bytes(), &[LABEL_HUB, hub_nonce, board_nonce]))
}

/// Check the hub's tag in constant time.
pub fn verify_hub_tag(
    lk: &LinkKey,
    hub_nonce: &HandshakeNonce,
    board_nonce: &HandshakeNonce,
    tag: &HandshakeTag,
) -> bool {
    hmac(lk.as_bytes(), &[LABEL_HUB, hub_nonce, board_nonce])
        .verify_truncated_left(tag)
        .is_ok()
}

/// The two keys of one session. Wiped on drop; `Debug` is redacted.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct SessionKeys {
    board_to_hub: [u8; KEY_LEN],
    hub_to_board: [u8; KEY_LEN],
}

impl SessionKeys {
    /// HKDF-SHA256(ikm = LK, salt = hub_nonce || board_nonce, info =
    /// "lockhub-serial-v2 session"): 64 bytes, board -> hub key first.
    pub fn derive(lk: &LinkKey, hub_nonce: &HandshakeNonce, board_nonce: &HandshakeNonce) -> Self {
        let mut salt = [0u8; 2 * NONCE_LEN];
        let (a, b) = salt.split_at_mut(NONCE_LEN);
        a.copy_from_slice(hub_nonce);
        b.copy_from_slice(board_nonce);
        let mut okm: [u8; 2 * KEY_LEN] = hkdf_sha256(lk.as_bytes(), &salt, INFO_SESSION);
        let mut keys = Self {
            board_to_hub: [0; KEY_LEN],
            hub_to_board: [0; KEY_LEN],
        };
        let (up, down) = okm.split_at(KEY_LEN);
        keys.board_to_hub.copy_from_slice(up);
        keys.hub_to_board.copy_from_slice(down);
        okm.zeroize();
        keys
    }

    /// The key sealing board -> hub frames.
    pub fn board_to_hub(&self) -> &[u8; KEY_LEN] {
        &self.board_to_hub
    }

    /// The key sealing hub -> board frames.
    pub fn hub_to_board(&self) -> &[u8; KEY_LEN] {
        &self.hub_to_board
    }
}

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKeys(<redacted>)")
    }
}

/// The direction of a sealed frame; its byte starts the AEAD nonce, so a
/// frame cannot be reflected back to its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Board -> hub, nonce byte 0x01.
    BoardToHub,
    /// Hub -> board, nonce byte 0x02.
    HubToBoard,
}

impl Direction {
    /// The nonce's first byte.
    pub const fn nonce_byte(self) -> u8 {
        match self {
            Direction::BoardToHub => 0x01,
            Direction::HubToBoard => 0x02,
        }
    }
}

/// Which end of the link a session belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Seals board -> hub, opens hub -> board.
    Board,
    /// Seals hub -> board, opens board -> hub.
    Hub,
}

/// Why a received frame was dropped. Each is counted by whoever holds the
/// link (the hub: per serial port, toward `board_link_fault`); the labels
/// of [`DropCause::as_str`] are stable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropCause {
    /// The frame itself was bad (COBS, CRC, length): line noise or a cut.
    Frame(FrameError),
    /// A sealed payload too short to hold a counter and a tag.
    Short,
    /// A sealed frame whose counter is not above the last one accepted: a
    /// replay, or a reordering.
    Replay,
    /// A sealed frame whose tag does not verify: altered, or sealed with
    /// another key or for the other direction.
    BadTag,
    /// A sealed frame that verified but does not hold one message of this
    /// direction (a broken peer, never an attacker).
    NotAMessage,
    /// A plain message where only sealed ones count (an injected `Unlock`).
    Plain,
    /// A sealed frame with no session to open it.
    NoSession,
    /// A handshake message whose tag does not verify, or that answers
    /// nothing this side asked.
    BadHandshake,
}

impl DropCause {
    /// A stable snake_case label for counters and `lockhub status`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            DropCause::Frame(e) => e.as_str(),
            DropCause::Short => "sealed_too_short",
            DropCause::Replay => "replayed_ctr",
            DropCause::BadTag => "bad_tag",
            DropCause::NotAMessage => "sealed_not_a_message",
            DropCause::Plain => "plain_on_sealed_link",
            DropCause::NoSession => "no_session",
            DropCause::BadHandshake => "bad_handshake",
        }
    }
}

impl fmt::Display for DropCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Per-cause counts of dropped frames (saturating).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropStats {
    /// [`DropCause::Frame`].
    pub frame: u32,
    /// [`DropCause::Short`].
    pub short: u32,
    /// [`DropCause::Replay`].
    pub replay: u32,
    /// [`DropCause::BadTag`].
    pub bad_tag: u32,
    /// [`DropCause::NotAMessage`].
    pub not_a_message: u32,
    /// [`DropCause::Plain`].
    pub plain: u32,
    /// [`DropCause::NoSession`].
    pub no_session: u32,
    /// [`DropCause::BadHandshake`].
    pub bad_handshake: u32,
}

impl DropStats {
    /// Count one drop.
    pub fn count(&mut self, cause: DropCause) {
        let c = match cause {
            DropCause::Frame(_) => &mut self.frame,
            DropCause::Short => &mut self.short,
            DropCause::Replay => &mut self.replay,
            DropCause::BadTag => &mut self.bad_tag,
            DropCause::NotAMessage => &mut self.not_a_message,
            DropCause::Plain => &mut self.plain,
            DropCause::NoSession => &mut self.no_session,
            DropCause::BadHandshake => &mut self.bad_handshake,
        };
        *c = c.saturating_add(1);
    }

    /// All drops, whatever the cause.
    pub fn total(&self) -> u32 {
        [
            self.frame,
            self.short,
            self.replay,
            self.bad_tag,
            self.not_a_message,
            self.plain,
            self.no_session,
            self.bad_handshake,
        ]
        .iter()
        .fold(0u32, |a, b| a.saturating_add(*b))
    }
}

/// Why a message could not be sealed. Nothing was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealError {
    /// No confirmed session.
    NoSession,
    /// The counter reached its end: start a new session first.
    CounterExhausted,
    /// The message does not encode into 64 bytes.
    Encode,
}

impl fmt::Display for SealError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SealError::NoSession => "no sealed session",
            SealError::CounterExhausted => "frame counter exhausted",
            SealError::Encode => "message does not encode",
        })
    }
}

#[cfg(feature = "std")]
impl std::error::Error for SealError {}

fn aead_nonce(dir: Direction, ctr: u32) -> Nonce {
    let mut n = [0u8; 12];
    n[0] = dir.nonce_byte();
    n[8..].copy_from_slice(&ctr.to_le_bytes());
    Nonce::from(n)
}

/// The sending half of a session: one key, one direction, a rising counter.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct Sealer {
    key: [u8; KEY_LEN],
    #[zeroize(skip)]
    dir: Direction,
    /// The counter of the next frame; `None` once `u32::MAX` was used.
    #[zeroize(skip)]
    next_ctr: Option<u32>,
}

impl Sealer {
    /// A sealer whose first frame has counter 1.
    pub fn new(key: &[u8; KEY_LEN], dir: Direction) -> Self {
        Self {
            key: *key,
            dir,
            next_ctr: Some(1),
        }
    }

    /// The counter the next frame will carry, if any is left.
    pub fn next_ctr(&self) -> Option<u32> {
        self.next_ctr
    }

    /// Seal `msg` (a message's postcard bytes, at most 64) into `out`;
    /// returns the sealed payload. Each call uses a new counter.
    pub fn seal<'a>(
        &mut self,
        msg: &[u8],
        out: &'a mut [u8; MAX_SEALED_PAYLOAD],
    ) -> Result<&'a [u8], SealError> {
        let ctr = self.next_ctr.ok_or(SealError::CounterExhausted)?;
        if msg.len() > MAX_PAYLOAD {
            return Err(SealError::Encode);
        }
        let end = 1 + CTR_LEN + msg.len() + AEAD_TAG_LEN;
        let mut head = [SEAL_MARK, 0, 0, 0, 0];
        head[1..].copy_from_slice(&ctr.to_le_bytes());
        let (head_out, rest) = out.split_at_mut(1 + CTR_LEN);
        head_out.copy_from_slice(&head);
        let (body, tail) = rest.split_at_mut(msg.len());
        body.copy_from_slice(msg);
        let cipher = ChaCha20Poly1305::new(&self.key.into());
        let tag = cipher
            .encrypt_inout_detached(&aead_nonce(self.dir, ctr), &head, body.into())
            .map_err(|_| SealError::Encode)?;
        for (t, b) in tail.iter_mut().zip(tag.iter()) {
            *t = *b;
        }
        self.next_ctr = ctr.checked_add(1);
        out.get(..end).ok_or(SealError::Encode)
    }
}

/// The receiving half of a session: one key, one direction, the highest
/// counter accepted so far.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct Opener {
    key: [u8; KEY_LEN],
    #[zeroize(skip)]
    dir: Direction,
    #[zeroize(skip)]
    last_ctr: u32,
}

impl Opener {
    /// An opener that accepts counters from 1.
    pub fn new(key: &[u8; KEY_LEN], dir: Direction) -> Self {
        Self {
            key: *key,
            dir,
            last_ctr: 0,
        }
    }

    /// The highest counter accepted so far (0: none yet).
    pub fn last_ctr(&self) -> u32 {
        self.last_ctr
    }

    /// Open a sealed payload into `out`; returns the message bytes. The
    /// tag is checked first, so a frame counts as a [`DropCause::Replay`]
    /// only when it is a genuine frame seen before (anything altered or
    /// forged is a [`DropCause::BadTag`], whatever its counter); the
    /// counter is raised only once both pass, so a forged frame cannot push
    /// the window forward.
    pub fn open<'a>(
        &mut self,
        payload: &[u8],
        out: &'a mut [u8; MAX_PAYLOAD],
    ) -> Result<&'a [u8], DropCause> {
        if payload.len() > MAX_SEALED_PAYLOAD {
            return Err(DropCause::Frame(FrameError::TooLong));
        }
        if payload.len() < SEAL_OVERHEAD || payload.first() != Some(&SEAL_MARK) {
            return Err(DropCause::Short);
        }
        let (head, rest) = payload.split_at(1 + CTR_LEN);
        let (ct, tag) = rest.split_at(rest.len() - AEAD_TAG_LEN);
        let mut ctr = [0u8; CTR_LEN];
        for (c, b) in ctr.iter_mut().zip(head.iter().skip(1)) {
            *c = *b;
        }
        let ctr = u32::from_le_bytes(ctr);
        let buf = out.get_mut(..ct.len()).ok_or(DropCause::Short)?;
        buf.copy_from_slice(ct);
        let cipher = ChaCha20Poly1305::new(&self.key.into());
        let tag = Tag::try_from(tag).map_err(|_| DropCause::Short)?;
        if cipher
            .decrypt_inout_detached(&aead_nonce(self.dir, ctr), head, (&mut *buf).into(), &tag)
            .is_err()
        {
            buf.zeroize();
            return Err(DropCause::BadTag);
        }
        if ctr <= self.last_ctr {
            buf.zeroize();
            return Err(DropCause::Replay);
        }
        self.last_ctr = ctr;
        Ok(buf)
    }
}

/// One confirmed session at one end: a [`Sealer`] for what this end sends
/// and an [`Opener`] for what it receives.
pub struct Session {
    tx: Sealer,
    rx: Opener,
}

impl Session {
    /// The session of `role` under `keys`.
    pub fn new(keys: &SessionKeys, role: Role) -> Self {
        let (up, down) = (keys.board_to_hub(), keys.hub_to_board());
        match role {
            Role::Board => Self {
                tx: Sealer::new(up, Direction::BoardToHub),
                rx: Opener::new(down, Direction::HubToBoard),
            },
            Role::Hub => Self {
                tx: Sealer::new(down, Direction::HubToBoard),
                rx: Opener::new(up, Direction::BoardToHub),
            },
        }
    }

    /// Seal one message and frame it.
    pub fn seal_frame<T: serde::Serialize>(&mut self, msg: &T) -> Result<SealedFrame, SealError> {
        let mut plain = [0u8; MAX_PAYLOAD];
        let plain = postcard::to_slice(msg, &mut plain).map_err(|_| SealError::Encode)?;
        let mut sealed = [0u8; MAX_SEALED_PAYLOAD];
        let sealed = self.tx.seal(plain, &mut sealed)?;
        plain.zeroize();
        let mut out = [0u8; crate::frame::MAX_SEALED_FRAME];
        let wire = crate::frame::frame_payload(sealed, &mut out).map_err(|_| SealError::Encode)?;
        SealedFrame::from_slice(wire).map_err(|_| SealError::Encode)
    }

    /// Open one sealed payload into a message of this end's receive
    /// direction.
    pub fn open_msg<T: serde::de::DeserializeOwned>(
        &mut self,
        payload: &[u8],
    ) -> Result<T, DropCause> {
        let mut plain = [0u8; MAX_PAYLOAD];
        let r = match self.rx.open(payload, &mut plain) {
            Ok(bytes) => decode_payload(bytes).map_err(|_| DropCause::NotAMessage),
            Err(e) => Err(e),
        };
        plain.zeroize();
        r
    }

    /// Frames sealed so far cannot exceed this counter; `None` when the
    /// session must be replaced before the next send.
    pub fn next_tx_ctr(&self) -> Option<u32> {
        self.tx.next_ctr()
    }

    /// The highest counter accepted from the peer.
    pub fn last_rx_ctr(&self) -> u32 {
        self.rx.last_ctr()
    }
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("next_tx_ctr", &self.tx.next_ctr)
            .field("last_rx_ctr", &self.rx.last_ctr)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn debug_of(x: &impl fmt::Debug) -> heapless::String<128> {
        let mut s = heapless::String::new();
        fmt::write(&mut s, format_args!("{x:?}")).unwrap();
        s
    }

    #[test]
    fn a_sealer_at_the_last_counter_seals_once_more_then_asks_for_a_new_session() {
        let mut tx = Sealer::new(&[1; KEY_LEN], Direction::BoardToHub);
        let mut rx = Opener::new(&[1; KEY_LEN], Direction::BoardToHub);
        tx.next_ctr = Some(u32::MAX);
        rx.last_ctr = u32::MAX - 1;
        let mut out = [0u8; MAX_SEALED_PAYLOAD];
        let last = tx.seal(&[0x04, 0x01], &mut out).unwrap().to_vec();
        assert_eq!(last[1..5], u32::MAX.to_le_bytes());
        let mut plain = [0u8; MAX_PAYLOAD];
        assert_eq!(rx.open(&last, &mut plain), Ok(&[0x04, 0x01][..]));
        assert_eq!(tx.next_ctr(), None);
        assert_eq!(
            tx.seal(&[0x04, 0x01], &mut out),
            Err(SealError::CounterExhausted)
        );
    }

    #[test]
    fn a_frame_with_counter_zero_is_never_accepted() {
        // ctr starts at 1: a zero counter can only be forged or replayed
        // from nowhere, and it is not above the initial window.
        let key = [3; KEY_LEN];
        let mut tx = Sealer::new(&key, Direction::HubToBoard);
        tx.next_ctr = Some(0);
        let mut out = [0u8; MAX_SEALED_PAYLOAD];
        let sealed = tx.seal(&[0x03, 0x00], &mut out).unwrap().to_vec();
        let mut rx = Opener::new(&key, Direction::HubToBoard);
        let mut plain = [0u8; MAX_PAYLOAD];
        assert_eq!(rx.open(&sealed, &mut plain), Err(DropCause::Replay));
    }

    #[test]
    fn a_truncated_sealed_payload_is_dropped_as_short() {
        let mut rx = Opener::new(&[3; KEY_LEN], Direction::HubToBoard);
        let mut plain = [0u8; MAX_PAYLOAD];
        let short = [SEAL_MARK, 1, 0, 0, 0, 9, 9];
        assert_eq!(rx.open(&short, &mut plain), Err(DropCause::Short));
    }

    #[test]
    fn keys_never_show_in_debug_output() {
        let lk = LinkKey::from_bytes([0xab; KEY_LEN]);
        let keys = SessionKeys::derive(&lk, &[1; 16], &[2; 16]);
        for s in [debug_of(&lk), debug_of(&keys)] {
            assert!(s.contains("redacted"), "{s}");
            assert!(!s.contains("ab, ab") && !s.contains("171"), "{s}");
        }
    }
}
