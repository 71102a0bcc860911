//! The hub as an OSDP Control Panel (osdp.md): readers on RS-485 buses,
//! every frame after the handshake authenticated by the Secure Channel.
//!
//! - [`packet`]: framing, CRC-16, a bounded deframer (pure).
//! - [`sc`]: Secure Channel crypto: session keys, cryptograms, MAC chain,
//!   payload cipher (pure).
//! - [`cp`]: one reader's state machine: handshake, sequence numbers,
//!   resends, NAK rules, offline detection (pure: time and randomness are
//!   passed in).
//! - [`door`]: the osdp_OUT of a grant, LED and buzzer feedback, the door
//!   contact from an input (pure).
//! - [`bus`]: one tokio task per `[[osdp]]` bus: polls its readers in turn
//!   and turns their events into alerts, identity, link state and door
//!   actions (decided through [`crate::door::entry`], like a lock board's).
//! - [`keypad`]: PIN entry from key presses: digits, clear, submit, 10 s idle (pure).
//! - [`install`]: `lockhub osdp install`: SCBK-D -> osdp_KEYSET -> proof.
//!
//! ## Why the protocol layer is written here
//! Both crates on crates.io were read (December 2026) before writing it:
//! - `libosdp` 0.2.2 (bindings to the C LibOSDP 3.2.7): mature C core, but
//!   (1) it is the same implementation as the test peer (the PyPI
//!   `libosdp`), so a shared bug in its Secure Channel would pass every
//!   test: the hub would be tested against itself; (2) its CP owns timers,
//!   retries and the bus loop inside `osdp_cp_refresh()`, driven from a
//!   blocking channel trait, so it needs a thread per bus polling every few
//!   ms beside tokio, and osdp.md's rules (no fallback to SCBK-D, offline
//!   probing at most every 5 s, fail queued outputs when a session ends)
//!   would be its policy flags, not code we can test; (3) its CP command
//!   struct cuts the osdp_OUT timer to 8 bits (osdp.md says so), which
//!   breaks `unlock_ms` above 25.5 s; (4) a C build (`cc`, bindgen) in the
//!   cross-build for the Pi.
//! - `osdp` 0.3.1 (pure Rust, `no_std`): a young single-maintainer crate.
//!   Its Secure Channel session type is separate from its ACU (CP) driver,
//!   which does not use it (plain packets only), is synchronous over a
//!   blocking `Transport` and has no multi-drop supervision; we would have
//!   used only its AES helpers, which `aes` gives us directly.
//!
//! The part that must be right is small (framing, Annex D's key
//! derivation, MAC chain and padding: `packet` and `sc`, ~400 lines), and
//! it is checked against an independent implementation: every test in
//! `tests/doors/osdp.rs` talks to the PyPI `libosdp` PeripheralDevice.
//!
//! Logs carry bus and reader names and addresses; never a key, a PIN or a
//! key press.

pub mod install;
internal! {
    mod bus;
    mod cp;
    mod door;
    mod keypad;
    mod packet;
    mod sc;
}
