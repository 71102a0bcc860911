//! The sealed link's two ends as state machines without I/O
//! (`serial.md`, "Sealed link"): [`BoardSeal`] answers handshakes and
//! rekeys, [`HubSeal`] starts them. Both take each received frame's
//! payload (from [`crate::frame::PayloadDecoder`]) and say what it was:
//! a verified message to act on, a frame to write back, a new session, or
//! a drop with its [`DropCause`] (also counted in [`DropStats`]).
//!
//! What each end accepts:
//! - a sealed frame, only if it opens under the current session with a
//!   counter above the last one accepted;
//! - plain, only the handshake: the board a `SealHello` or `SealConfirm`,
//!   the hub a `Hello` (which only asks for a session) or `SealHello`.
//!
//! A handshake answer is good once: the hub forgets its `hub_nonce` when a
//! session starts and the board its offers, so a recorded answer cannot
//! reset a session's counters. The board keeps its current session until a
//! new `SealConfirm` verifies, so a forged `SealHello` erases nothing.

use crate::frame::{SealedFrame, decode_payload, to_frame};
use crate::msg::{Downlink, Uplink};
use crate::pair::{KeyPair, rekey_key};
use crate::rng::RandomSource;
use crate::seal::{
    DropCause, DropStats, HandshakeNonce, LinkKey, NONCE_LEN, Role, SEAL_MARK, SealError, Session,
    SessionKeys, board_tag, hub_tag, verify_board_tag, verify_hub_tag,
};

/// A plain handshake message as a frame of the sealed link.
fn plain_frame<T: serde::Serialize>(msg: &T) -> Result<SealedFrame, SealError> {
    let f = to_frame(msg).map_err(|_| SealError::Encode)?;
    SealedFrame::from_slice(&f).map_err(|_| SealError::Encode)
}

/// What a received payload meant to the board.
#[derive(Debug)]
pub enum BoardRx {
    /// A sealed message from the hub that verified: hand it to the link.
    Message(Downlink),
    /// Write this frame: the answer to a `SealHello` (plain) or to a
    /// `RekeyStart` (sealed).
    Send(SealedFrame),
    /// A new session verified: forget the hub's seqs, drop unacked
    /// Keypads, then send (sealed) `Hello`, every door and an active
    /// tamper. With `new_key`, the pending rekey's key is now the link
    /// key: write it to flash (the old one is gone).
    SessionStarted {
        /// The new link key to persist, after a rekey.
        new_key: Option<LinkKey>,
    },
    /// Dropped and counted.
    Dropped(DropCause),
}

/// One answered `SealHello`, awaiting the hub's `SealConfirm`.
#[derive(Clone, Copy)]
struct Offer {
    hub_nonce: HandshakeNonce,
    board_nonce: HandshakeNonce,
}

/// The board's end of a sealed link. See the module docs.
pub struct BoardSeal {
    board_id: u8,
    key: LinkKey,
    /// A rekeyed LK not yet proven by a session.
    pending: Option<LinkKey>,
    /// The latest offer under `key`, and under `pending`.
    offers: [Option<Offer>; 2],
    /// While a key is pending, which key answers the next `SealHello`.
    next_under_pending: bool,
    session: Option<Session>,
    drops: DropStats,
}

impl BoardSeal {
    /// A board holding link key `key`, with no session yet.
    pub fn new(board_id: u8, key: LinkKey) -> Self {
        Self {
            board_id,
            key,
            pending: None,
            offers: [None, None],
            next_under_pending: true,
            session: None,
            drops: DropStats::default(),
        }
    }

    /// True while a confirmed session holds: only then does the board act
    /// on an `Unlock`.
    pub fn has_session(&self) -> bool {
        self.session.is_some()
    }

    /// True while a rekeyed key waits for its proof.
    pub fn rekey_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// The link key in force (to compare, or to store after pairing).
    pub fn key(&self) -> &LinkKey {
        &self.key
    }

    /// Drops so far, by cause.
    pub fn drops(&self) -> DropStats {
        self.drops
    }

    /// Count a frame the decoder dropped before it reached a payload.
    pub fn count_frame_error(&mut self, e: crate::frame::FrameError) {
        self.drops.count(DropCause::Frame(e));
    }

    /// Seal a message to the hub (in the current session).
    pub fn seal(&mut self, msg: &Uplink) -> Result<SealedFrame, SealError> {
        self.session
            .as_mut()
            .ok_or(SealError::NoSession)?
            .seal_frame(msg)
    }

    /// Handle one received payload (CRC already checked).
    pub fn on_payload(&mut self, payload: &[u8], rng: &mut impl RandomSource) -> BoardRx {
        let r = if payload.first() == Some(&SEAL_MARK) {
            self.on_sealed(payload, rng)
        } else {
            match decode_payload::<Downlink>(payload) {
                Ok(Downlink::SealHello { hub_nonce }) => self.answer_hello(hub_nonce, rng),
                Ok(Downlink::SealConfirm { tag }) => self.on_confirm(&tag),
                Ok(_) => BoardRx::Dropped(DropCause::Plain),
                Err(e) => BoardRx::Dropped(DropCause::Frame(e)),
            }
        };
        if let BoardRx::Dropped(cause) = r {
            self.drops.count(cause);
        }
        r
    }

    fn on_sealed(&mut self, payload: &[u8], rng: &mut impl RandomSource) -> BoardRx {
        let Some(session) = self.session.as_mut() else {
            return BoardRx::Dropped(DropCause::NoSession);
        };
        match session.open_msg::<Downlink>(payload) {
            Ok(Downlink::RekeyStart { hub_pub }) => self.on_rekey(&hub_pub, rng),
            Ok(msg) => BoardRx::Message(msg),
            Err(cause) => BoardRx::Dropped(cause),
        }
    }

    /// Answer `SealHello` under the link key, or, while a rekeyed key is
    /// pending, under the new and the old key in turn.
    fn answer_hello(&mut self, hub_nonce: HandshakeNonce, rng: &mut impl RandomSource) -> BoardRx {
        let under_pending = self.pending.is_some() && self.next_under_pending;
        if self.pending.is_some() {
            self.next_under_pending = !self.next_under_pending;
        }
        let key = match (&self.pending, under_pending) {
            (Some(p), true) => p,
            _ => &self.key,
        };
        let slot = usize::from(under_pending);
        // The same SealHello again (the hub resent it while our answer was
        // on its way) gets the same answer, so a SealConfirm for either
        // copy verifies. Offers are cleared once a session starts, so no
        // two sessions ever share a (hub_nonce, board_nonce) pair.
        let same = self
            .offers
            .get(slot)
            .copied()
            .flatten()
            .filter(|o| o.hub_nonce == hub_nonce);
        let board_nonce = match same {
            Some(o) => o.board_nonce,
            None => {
                let mut n = [0u8; NONCE_LEN];
                rng.fill_bytes(&mut n);
                n
            }
        };
        let tag = board_tag(key, &hub_nonce, &board_nonce, self.board_id);
        if let Some(o) = self.offers.get_mut(slot) {
            *o = Some(Offer {
                hub_nonce,
                board_nonce,
            });
        }
        let msg = Uplink::SealHello {
            board_id: self.board_id,
            board_nonce,
            tag,
        };
        match plain_frame(&msg) {
            Ok(f) => BoardRx::Send(f),
            // A SealHello is 35 bytes: it always fits a frame.
            Err(_) => BoardRx::Dropped(DropCause::BadHandshake),
        }
    }

    /// Check `SealConfirm` against the offer under each key; the first
    /// that verifies becomes the session (and, if it was the pending key,
    /// the link key).
    fn on_confirm(&mut self, tag: &[u8; 16]) -> BoardRx {
        let [under_key, under_pending] = self.offers;
        let verified_key = under_key
            .filter(|o| verify_hub_tag(&self.key, &o.hub_nonce, &o.board_nonce, tag))
            .map(|o| (o, false));
        let verified = verified_key.or_else(|| {
            let p = self.pending.as_ref()?;
            under_pending
                .filter(|o| verify_hub_tag(p, &o.hub_nonce, &o.board_nonce, tag))
                .map(|o| (o, true))
        });
        let Some((offer, was_pending)) = verified else {
            return BoardRx::Dropped(DropCause::BadHandshake);
        };
        let new_key = if was_pending {
            self.pending.take().inspect(|p| self.key = p.clone())
        } else {
            // The hub proved the old key: it does not hold the new one
            // (its rekey never finished), so the pending key is dropped.
            self.pending = None;
            None
        };
        let keys = SessionKeys::derive(&self.key, &offer.hub_nonce, &offer.board_nonce);
        self.session = Some(Session::new(&keys, Role::Board));
        self.offers = [None, None];
        self.next_under_pending = true;
        BoardRx::SessionStarted { new_key }
    }

    fn on_rekey(&mut self, hub_pub: &[u8; 32], rng: &mut impl RandomSource) -> BoardRx {
        let keys = KeyPair::generate(rng);
        let Ok(z) = keys.agree(hub_pub) else {
            return BoardRx::Dropped(DropCause::BadHandshake);
        };
        self.pending = Some(rekey_key(&z, &self.key));
        if let Some(o) = self.offers.get_mut(1) {
            *o = None;
        }
        self.next_under_pending = true;
        match self.seal(&Uplink::RekeyReply {
            board_pub: keys.public(),
        }) {
            Ok(f) => BoardRx::Send(f),
            // The counter ran out: the hub starts a new session and may
            // ask again.
            Err(_) => BoardRx::Dropped(DropCause::NoSession),
        }
    }
}

impl core::fmt::Debug for BoardSeal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("BoardSeal")
            .field("board_id", &self.board_id)
            .field("session", &self.session)
            .field("rekey_pending", &self.pending.is_some())
            .field("drops", &self.drops)
            .finish_non_exhaustive()
    }
}

/// What a received payload meant to the hub.
#[derive(Debug)]
pub enum HubRx {
    /// A sealed message from the board that verified.
    Message(Uplink),
    /// A plain `Hello`: the board asks for a session (its fields are
    /// ignored). During a session, check it with a sealed `Ping` first.
    PlainHello,
    /// The board's `SealHello` verified: write `confirm` (plain); the new
    /// session is already in force for what follows.
    SessionStarted {
        /// The board's id, as bound into its tag.
        board_id: u8,
        /// The `SealConfirm` frame to write.
        confirm: SealedFrame,
    },
    /// Dropped and counted.
    Dropped(DropCause),
}

/// The hub's end of a sealed link. See the module docs.
pub struct HubSeal {
    key: LinkKey,
    hub_nonce: Option<HandshakeNonce>,
    session: Option<Session>,
    drops: DropStats,
}

impl HubSeal {
    /// A hub end under `key`, with no session yet.
    pub fn new(key: LinkKey) -> Self {
        Self {
            key,
            hub_nonce: None,
            session: None,
            drops: DropStats::default(),
        }
    }

    /// True while a confirmed session holds.
    pub fn has_session(&self) -> bool {
        self.session.is_some()
    }

    /// Drops so far, by cause.
    pub fn drops(&self) -> DropStats {
        self.drops
    }

    /// Count a frame the decoder dropped before it reached a payload.
    pub fn count_frame_error(&mut self, e: crate::frame::FrameError) {
        self.drops.count(DropCause::Frame(e));
    }

    /// Ask for a session: the plain `SealHello{hub_nonce}` to write.
    /// `hub_nonce` must be fresh (16 bytes from a [`RandomSource`]); a
    /// later call replaces it, and the current session holds meanwhile.
    pub fn start(&mut self, hub_nonce: HandshakeNonce) -> Result<SealedFrame, SealError> {
        self.hub_nonce = Some(hub_nonce);
        plain_frame(&Downlink::SealHello { hub_nonce })
    }

    /// [`HubSeal::start`] with a nonce drawn from `rng`.
    pub fn start_with(&mut self, rng: &mut impl RandomSource) -> Result<SealedFrame, SealError> {
        let mut n = [0u8; NONCE_LEN];
        rng.fill_bytes(&mut n);
        self.start(n)
    }

    /// Seal a message to the board (in the current session).
    pub fn seal(&mut self, msg: &Downlink) -> Result<SealedFrame, SealError> {
        self.session
            .as_mut()
            .ok_or(SealError::NoSession)?
            .seal_frame(msg)
    }

    /// Forget the session (the port closed; a new one starts with
    /// [`HubSeal::start`]).
    pub fn end_session(&mut self) {
        self.session = None;
        self.hub_nonce = None;
    }

    /// Handle one received payload (CRC already checked).
    pub fn on_payload(&mut self, payload: &[u8]) -> HubRx {
        let r = if payload.first() == Some(&SEAL_MARK) {
            match self.session.as_mut() {
                Some(s) => match s.open_msg::<Uplink>(payload) {
                    Ok(msg) => HubRx::Message(msg),
                    Err(cause) => HubRx::Dropped(cause),
                },
                None => HubRx::Dropped(DropCause::NoSession),
            }
        } else {
            match decode_payload::<Uplink>(payload) {
                Ok(Uplink::Hello { .. }) => HubRx::PlainHello,
                Ok(Uplink::SealHello {
                    board_id,
                    board_nonce,
                    tag,
                }) => self.on_board_hello(board_id, &board_nonce, &tag),
                Ok(_) => HubRx::Dropped(DropCause::Plain),
                Err(e) => HubRx::Dropped(DropCause::Frame(e)),
            }
        };
        if let HubRx::Dropped(cause) = r {
            self.drops.count(cause);
        }
        r
    }

    fn on_board_hello(
        &mut self,
        board_id: u8,
        board_nonce: &HandshakeNonce,
        tag: &[u8; 16],
    ) -> HubRx {
        let Some(hub_nonce) = self.hub_nonce else {
            return HubRx::Dropped(DropCause::BadHandshake);
        };
        if !verify_board_tag(&self.key, &hub_nonce, board_nonce, board_id, tag) {
            return HubRx::Dropped(DropCause::BadHandshake);
        }
        let confirm = hub_tag(&self.key, &hub_nonce, board_nonce);
        let Ok(confirm) = plain_frame(&Downlink::SealConfirm { tag: confirm }) else {
            return HubRx::Dropped(DropCause::BadHandshake);
        };
        let keys = SessionKeys::derive(&self.key, &hub_nonce, board_nonce);
        self.session = Some(Session::new(&keys, Role::Hub));
        self.hub_nonce = None;
        HubRx::SessionStarted { board_id, confirm }
    }
}

impl core::fmt::Debug for HubSeal {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("HubSeal")
            .field("session", &self.session)
            .field("drops", &self.drops)
            .finish_non_exhaustive()
    }
}
