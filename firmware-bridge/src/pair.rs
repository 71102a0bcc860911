//! Pairing and rekey (`serial.md`, "Pairing" and "Rekey"): how a board and
//! the hub agree on a new link key LK with X25519.
//!
//! Pairing, all plain:
//! 1. hub -> board `PairStart{commit}`, commit = SHA-256("lockhub-pair-commit"
//!    || hub_pub): the hub is bound to its key before it sees the board's,
//!    so a device in the middle cannot search for key pairs that give both
//!    sides the same code;
//! 2. board -> hub `PairReply{board_pub}`, only after a `PairStart`;
//! 3. hub -> board `PairReveal{hub_pub}`, only after the `PairReply`; the
//!    board checks it against the commit;
//! 4. both: Z = X25519 (all zero refused), 36 bytes = HKDF-SHA256(ikm = Z,
//!    salt = hub_pub || board_pub, info = "lockhub-pair-v1"): LK, then the
//!    code (u32 LE mod 1,000,000, six digits);
//! 5. the installer types the code the hub shows on the board's keypad; the
//!    board compares it locally (it never crosses the wire) and answers
//!    `PairDone{ok}`.
//!
//! Rekey, inside a sealed session: `RekeyStart{hub_pub}`,
//! `RekeyReply{board_pub}`, new LK = HKDF-SHA256(ikm = Z, salt = old LK,
//! info = "lockhub-rekey-v1"). The board side of rekey lives in
//! [`crate::sealed`], which holds the session and the pending key.
//!
//! [`BoardPairing`] and [`HubPairing`] are the two state machines; time is
//! an input, as everywhere in this crate.

use core::fmt;

use sha2::{Digest, Sha256};
use x25519_dalek::{PublicKey, StaticSecret};
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::msg::{Downlink, Uplink};
use crate::rng::RandomSource;
use crate::seal::{KEY_LEN, LinkKey, hkdf_sha256};

const LABEL_COMMIT: &[u8] = b"lockhub-pair-commit";
const INFO_PAIR: &[u8] = b"lockhub-pair-v1";
const INFO_REKEY: &[u8] = b"lockhub-rekey-v1";

/// Digits of a pairing code.
pub const CODE_DIGITS: usize = 6;
/// How long the hub waits for an awaited reply (`PairReply`, `PairDone`
/// after a refused reveal).
pub const REPLY_TIMEOUT_MS: u64 = 10_000;
/// How long the hub waits for the installer to type the code.
pub const CODE_TIMEOUT_MS: u64 = 60_000;

/// A 32-byte X25519 public key as it travels.
pub type PublicBytes = [u8; 32];

/// A fresh X25519 key pair; the private half is wiped on drop.
pub struct KeyPair {
    secret: StaticSecret,
    public: PublicBytes,
}

impl KeyPair {
    /// A new key pair from `rng`.
    pub fn generate(rng: &mut impl RandomSource) -> Self {
        let mut bytes = [0u8; 32];
        rng.fill_bytes(&mut bytes);
        let kp = Self::from_secret_bytes(bytes);
        bytes.zeroize();
        kp
    }

    /// The key pair of a known private key (the vectors; a tool's own
    /// entropy). The bytes are clamped as X25519 requires.
    pub fn from_secret_bytes(bytes: [u8; 32]) -> Self {
        let secret = StaticSecret::from(bytes);
        let public = PublicKey::from(&secret).to_bytes();
        Self { secret, public }
    }

    /// The public half.
    pub fn public(&self) -> PublicBytes {
        self.public
    }

    /// X25519 with `their_pub`, refusing an all-zero result (RFC 7748,
    /// 6.1: a low-order point from the peer would fix Z whatever our key).
    pub fn agree(&self, their_pub: &PublicBytes) -> Result<SharedZ, PairError> {
        let z = self.secret.diffie_hellman(&PublicKey::from(*their_pub));
        if !z.was_contributory() {
            return Err(PairError::LowOrderKey);
        }
        Ok(SharedZ(z.to_bytes()))
    }
}

impl fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPair")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

/// The X25519 shared secret Z. Wiped on drop; `Debug` is redacted.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct SharedZ([u8; 32]);

impl SharedZ {
    /// Z's bytes (for the vectors' check). Handle with care.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for SharedZ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedZ(<redacted>)")
    }
}

/// The six-digit pairing code. `Debug` is redacted: the code is shown to
/// the installer on purpose ([`PairCode::digits`]), never logged by
/// accident.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct PairCode([u8; CODE_DIGITS]);

impl PairCode {
    fn from_u32(n: u32) -> Self {
        let mut n = n % 1_000_000;
        let mut d = [b'0'; CODE_DIGITS];
        for slot in d.iter_mut().rev() {
            // `n % 10` is below 10.
            *slot = b'0' + (n % 10) as u8;
            n /= 10;
        }
        Self(d)
    }

    /// The code as six ASCII digits, leading zeros kept.
    pub fn digits(&self) -> &[u8; CODE_DIGITS] {
        &self.0
    }

    /// Whether `typed` is this code, in constant time for six digits.
    pub fn matches(&self, typed: &[u8]) -> bool {
        if typed.len() != CODE_DIGITS {
            return false;
        }
        self.0
            .iter()
            .zip(typed)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl fmt::Debug for PairCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PairCode(<redacted>)")
    }
}

/// SHA-256("lockhub-pair-commit" || hub_pub).
pub fn commit(hub_pub: &PublicBytes) -> [u8; 32] {
    Sha256::new()
        .chain_update(LABEL_COMMIT)
        .chain_update(hub_pub)
        .finalize()
        .into()
}

/// LK and the code from Z: HKDF-SHA256(ikm = Z, salt = hub_pub ||
/// board_pub, info = "lockhub-pair-v1"), 36 bytes.
pub fn pairing_key(
    z: &SharedZ,
    hub_pub: &PublicBytes,
    board_pub: &PublicBytes,
) -> (LinkKey, PairCode) {
    let mut salt = [0u8; 64];
    let (a, b) = salt.split_at_mut(32);
    a.copy_from_slice(hub_pub);
    b.copy_from_slice(board_pub);
    let mut okm: [u8; KEY_LEN + 4] = hkdf_sha256(z.as_bytes(), &salt, INFO_PAIR);
    let mut lk = [0u8; KEY_LEN];
    let mut code = [0u8; 4];
    let (k, c) = okm.split_at(KEY_LEN);
    lk.copy_from_slice(k);
    code.copy_from_slice(c);
    let out = (
        LinkKey::from_bytes(lk),
        PairCode::from_u32(u32::from_le_bytes(code)),
    );
    okm.zeroize();
    lk.zeroize();
    code.zeroize();
    out
}

/// The new LK of a rekey: HKDF-SHA256(ikm = Z, salt = old LK, info =
/// "lockhub-rekey-v1"), 32 bytes.
pub fn rekey_key(z: &SharedZ, old: &LinkKey) -> LinkKey {
    let mut lk: [u8; KEY_LEN] = hkdf_sha256(z.as_bytes(), old.as_bytes(), INFO_REKEY);
    let key = LinkKey::from_bytes(lk);
    lk.zeroize();
    key
}

/// Why pairing (or a rekey) stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairError {
    /// The revealed hub key does not match its commit (a device in the
    /// middle, or a broken hub).
    CommitMismatch,
    /// The peer's public key gives an all-zero Z.
    LowOrderKey,
    /// The code typed on the board is not the board's code.
    CodeMismatch,
    /// The board answered `PairDone{ok: false}`.
    Refused,
    /// An awaited reply did not come in time (10 s; 60 s for the code).
    Timeout,
}

impl fmt::Display for PairError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PairError::CommitMismatch => "the revealed hub key does not match its commitment",
            PairError::LowOrderKey => "the peer's public key is of low order",
            PairError::CodeMismatch => "the code typed on the board does not match",
            PairError::Refused => "the board refused the pairing",
            PairError::Timeout => "no reply in time",
        })
    }
}

#[cfg(feature = "std")]
impl std::error::Error for PairError {}

enum BoardState {
    AwaitStart,
    Replied { commit: [u8; 32], keys: KeyPair },
    AwaitCode { lk: LinkKey, code: PairCode },
    Paired,
    Failed(PairError),
}

/// The board in pairing mode. It answers nothing but the pairing messages
/// (the caller sends the replies plain), and keeps its old key unless the
/// code typed on its own keypad matches.
pub struct BoardPairing {
    state: BoardState,
}

impl Default for BoardPairing {
    fn default() -> Self {
        Self::new()
    }
}

/// What the board's pairing says about its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoardPairPhase {
    /// Waiting for `PairStart`.
    AwaitStart,
    /// `PairReply` sent; waiting for `PairReveal`.
    AwaitReveal,
    /// The keys agree; waiting for the installer's code on the keypad.
    AwaitCode,
    /// The code matched and the new key was handed out to be stored.
    Paired,
    /// Pairing stopped; the board keeps its old key.
    Failed(PairError),
}

impl BoardPairing {
    /// A board that has just entered pairing mode.
    pub const fn new() -> Self {
        Self {
            state: BoardState::AwaitStart,
        }
    }

    /// Where pairing stands.
    pub fn phase(&self) -> BoardPairPhase {
        match &self.state {
            BoardState::AwaitStart => BoardPairPhase::AwaitStart,
            BoardState::Replied { .. } => BoardPairPhase::AwaitReveal,
            BoardState::AwaitCode { .. } => BoardPairPhase::AwaitCode,
            BoardState::Paired => BoardPairPhase::Paired,
            BoardState::Failed(e) => BoardPairPhase::Failed(*e),
        }
    }

    /// A message from the hub; returns the reply to send plain, if any.
    ///
    /// A `PairStart` is answered with a fresh key; a resent one (same
    /// commit, before the reveal) with the same key, a new one with a new
    /// key. A `PairReveal` that does not match the commit,
    /// or that gives an all-zero Z, stops pairing with `PairDone{ok:
    /// false}`. Everything else, in any state, is ignored.
    pub fn on_msg(&mut self, msg: &Downlink, rng: &mut impl RandomSource) -> Option<Uplink> {
        match (msg, &self.state) {
            // The same PairStart again (our reply was slow or lost): the
            // same key, so whichever reply the hub takes, the keys agree.
            (Downlink::PairStart { commit }, BoardState::Replied { commit: c, keys })
                if commit == c =>
            {
                Some(Uplink::PairReply {
                    board_pub: keys.public(),
                })
            }
            (
                Downlink::PairStart { commit },
                BoardState::AwaitStart | BoardState::Replied { .. },
            ) => {
                let keys = KeyPair::generate(rng);
                let board_pub = keys.public();
                self.state = BoardState::Replied {
                    commit: *commit,
                    keys,
                };
                Some(Uplink::PairReply { board_pub })
            }
            (Downlink::PairReveal { hub_pub }, BoardState::Replied { commit: c, keys }) => {
                let ours = commit(hub_pub);
                let same = ours.iter().zip(c).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
                if !same {
                    self.state = BoardState::Failed(PairError::CommitMismatch);
                    return Some(Uplink::PairDone { ok: false });
                }
                match keys.agree(hub_pub) {
                    Ok(z) => {
                        let (lk, code) = pairing_key(&z, hub_pub, &keys.public());
                        self.state = BoardState::AwaitCode { lk, code };
                        None
                    }
                    Err(e) => {
                        self.state = BoardState::Failed(e);
                        Some(Uplink::PairDone { ok: false })
                    }
                }
            }
            _ => None,
        }
    }

    /// The installer typed `typed` and '#' at door 0. Returns the reply
    /// (`PairDone`) and, on a match, the new key for the board to store
    /// in flash *before* it sends the reply. One try: a wrong code stops
    /// pairing, so the code cannot be guessed over the keypad. `None`
    /// when no code is awaited.
    pub fn enter_code(&mut self, typed: &[u8]) -> Option<(Uplink, Option<LinkKey>)> {
        let BoardState::AwaitCode { lk, code } = &self.state else {
            return None;
        };
        if code.matches(typed) {
            let lk = lk.clone();
            self.state = BoardState::Paired;
            Some((Uplink::PairDone { ok: true }, Some(lk)))
        } else {
            self.state = BoardState::Failed(PairError::CodeMismatch);
            Some((Uplink::PairDone { ok: false }, None))
        }
    }
}

enum HubState {
    AwaitReply,
    AwaitDone { lk: LinkKey, code: PairCode },
    Done,
}

/// What the hub's pairing asks of its caller after a message.
#[derive(Debug)]
pub enum HubPairStep {
    /// Nothing to do (a message pairing does not await).
    Ignored,
    /// Send this `PairReveal` and show the code to the installer.
    Reveal(Downlink, PairCode),
    /// The board stored this key. Prove it with a session under it before
    /// writing it anywhere (`serial.md`, "Pairing", step 5).
    Paired(LinkKey),
}

/// The hub's end of pairing (`lockhub board pair`).
pub struct HubPairing {
    keys: KeyPair,
    state: HubState,
    deadline_ms: u64,
}

impl HubPairing {
    /// Start with a fresh key pair from `rng`; send [`HubPairing::start_msg`].
    pub fn new(rng: &mut impl RandomSource, now_ms: u64) -> Self {
        Self::with_keys(KeyPair::generate(rng), now_ms)
    }

    /// Start with a given key pair (the vectors).
    pub fn with_keys(keys: KeyPair, now_ms: u64) -> Self {
        Self {
            keys,
            state: HubState::AwaitReply,
            deadline_ms: now_ms.saturating_add(REPLY_TIMEOUT_MS),
        }
    }

    /// `PairStart{commit}` for this hub key (send it, and again if it
    /// seems lost: the commit does not change).
    pub fn start_msg(&self) -> Downlink {
        Downlink::PairStart {
            commit: commit(&self.keys.public()),
        }
    }

    /// A message from the board. The reveal is sent only after the
    /// board's reply; a second `PairReply` is ignored, so the key the code
    /// binds cannot be swapped after the code was shown.
    pub fn on_msg(&mut self, msg: &Uplink, now_ms: u64) -> Result<HubPairStep, PairError> {
        match (msg, &self.state) {
            (Uplink::PairReply { board_pub }, HubState::AwaitReply) => {
                let z = self.keys.agree(board_pub)?;
                let hub_pub = self.keys.public();
                let (lk, code) = pairing_key(&z, &hub_pub, board_pub);
                let shown = code.clone();
                self.state = HubState::AwaitDone { lk, code };
                self.deadline_ms = now_ms.saturating_add(CODE_TIMEOUT_MS);
                Ok(HubPairStep::Reveal(Downlink::PairReveal { hub_pub }, shown))
            }
            (Uplink::PairDone { ok: true }, HubState::AwaitDone { lk, .. }) => {
                let lk = lk.clone();
                self.state = HubState::Done;
                Ok(HubPairStep::Paired(lk))
            }
            (Uplink::PairDone { ok: false }, HubState::AwaitReply | HubState::AwaitDone { .. }) => {
                self.state = HubState::Done;
                Err(PairError::Refused)
            }
            _ => Ok(HubPairStep::Ignored),
        }
    }

    /// The code being shown, once the reveal was sent.
    pub fn code(&self) -> Option<&PairCode> {
        match &self.state {
            HubState::AwaitDone { code, .. } => Some(code),
            _ => None,
        }
    }

    /// `Err(Timeout)` once an awaited reply is late (10 s for the board's
    /// key, 60 s for the code).
    pub fn poll(&self, now_ms: u64) -> Result<(), PairError> {
        match self.state {
            HubState::Done => Ok(()),
            _ if now_ms >= self.deadline_ms => Err(PairError::Timeout),
            _ => Ok(()),
        }
    }
}

/// The hub's end of a rekey (`lockhub board rekey`), inside a session.
pub struct HubRekey {
    keys: KeyPair,
}

impl HubRekey {
    /// A fresh key pair from `rng`.
    pub fn new(rng: &mut impl RandomSource) -> Self {
        Self::with_keys(KeyPair::generate(rng))
    }

    /// A given key pair (the vectors).
    pub fn with_keys(keys: KeyPair) -> Self {
        Self { keys }
    }

    /// `RekeyStart{hub_pub}`, to send sealed.
    pub fn start_msg(&self) -> Downlink {
        Downlink::RekeyStart {
            hub_pub: self.keys.public(),
        }
    }

    /// The new LK from the board's `RekeyReply`. Write it only after a
    /// session under it verifies; until then the board keeps the old one.
    pub fn finish(&self, board_pub: &PublicBytes, old: &LinkKey) -> Result<LinkKey, PairError> {
        let z = self.keys.agree(board_pub)?;
        Ok(rekey_key(&z, old))
    }
}
