//! # lockhub
//!
//! A daemon for a building's hub that decides, offline, who may open its
//! doors. It keeps a SQLite mirror of door keys that the cloud signs and
//! sends over MQTT, and answers lock boards that speak a framed serial
//! protocol.
//!
//! ## Layout
//! Pure decisions sit in the middle; I/O sits at the edges and only calls
//! them. The modules form layers, and each uses only its own layer and the
//! ones above it: the layer table, each module's job and the rule's check
//! (`scripts/check-layers`) are in `ARCHITECTURE.md`, the one place they
//! are written, so a new module gets its row there. The MQTT vocabulary
//! (time, crypto, events, step-1 verification, topics, output bodies, the
//! mirror proof) is the crate `lockhub-proto`, above every layer here.
//!
//! Each wire has one crate of types: the MQTT contract (what the hub and the
//! cloud share) lives in `lockhub-proto`, pure and without I/O; the serial
//! wire contract (messages, framing, link rules, the board's state machine)
//! in the `no_std` crate `firmware-bridge`.
//!
//! `migrations/` holds the schema as append-only SQL files; the invariants of
//! mqtt.md are enforced there, by SQLite, as the last line of defence.

pub mod clock;
pub mod config;
pub mod door;
pub mod drivers;
pub mod lifecycle;
pub mod ops;
pub mod runtime;
pub mod sim;
pub mod store;
pub mod sync;
