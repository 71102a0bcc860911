//! # firmware-bridge: lockhub's serial wire contract, board side
//!
//! The hub and each lock board talk over a UART using the contract in
//! `docs/protocol/serial.md`. This crate is the Rust implementation of that
//! page: the board firmware runs it, and the hub uses the same types and the
//! same link rules for its end, so both sides cannot drift apart.
//!
//! Layout, one module per idea, lowest layer first:
//! - [`msg`]: the [`Uplink`] (board -> hub) and [`Downlink`] (hub -> board)
//!   messages. Their declaration order *is* the postcard wire format. The
//!   PIN is a [`Pin`] read as bytes, so malformed entries still reach the hub
//!   to be denied and audited, and it never shows up in `Debug` output.
//! - [`frame`]: `COBS(payload || crc32_le(payload)) || 0x00`, an encoder and
//!   a streaming [`FrameDecoder`] with a fixed buffer that resynchronises at
//!   every `0x00` and reports why each bad frame was dropped.
//! - [`link`]: the reliability rules (seqs, acks, resends, duplicate
//!   suppression, Hello, ping/pong, liveness) as a clock-free state machine
//!   generic over the direction: [`BoardLink`] and [`HubLink`].
//! - [`seal`]: the sealed link's cryptography: the link key, handshake tags,
//!   session keys, sealing and opening with replay counters, and the
//!   [`DropCause`] of every dropped frame.
//! - [`rng`]: the random source of nonces and key pairs; on a board, its
//!   hardware source through an HMAC-DRBG seeded with a boot counter.
//! - [`pair`]: pairing (commit first, X25519, the six-digit code typed on
//!   the board) and rekey.
//! - [`sealed`]: the two ends of a sealed link as state machines,
//!   [`BoardSeal`] and [`HubSeal`]: handshake, sessions, rekey fallback.
//! - [`board`]: what a board does with all that (keypad entry, relays, door
//!   sensors, tamper, deny feedback, heartbeat; plain, sealed or pairing),
//!   as a state machine a real HAL or a simulator drives with inputs,
//!   `poll(now_ms)` and queries.
//!
//! Design rules: `no_std`, no allocator, every buffer bounded; no panic on
//! any input from the wire; time is always passed in as `now_ms`; secrets
//! are wiped on drop and never shown by `Debug`.
//! The `std` feature only adds `std::error::Error` impls for the hub.

#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

#[cfg(feature = "std")]
extern crate std;

pub mod board;
pub mod frame;
pub mod link;
pub mod msg;
pub mod pair;
pub mod rng;
pub mod seal;
pub mod sealed;

pub use board::{Board, BoardConfig};
pub use frame::{
    DecoderStats, Frame, FrameDecoder, FrameError, MAX_FRAME, MAX_PAYLOAD, MAX_SEALED_FRAME,
    MAX_SEALED_PAYLOAD, PayloadDecoder, SealedFrame, decode_frame, encode_frame, to_frame,
};
pub use link::{BoardLink, HubLink, Link, LinkConfig, LinkError, LinkEvent, Liveness, Wire};
pub use msg::{DenyReason, Downlink, Pin, Uplink};
pub use seal::{DropCause, DropStats, LinkKey};
pub use sealed::{BoardSeal, HubSeal};
