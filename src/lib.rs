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

//! ## Public surface
//! The library's public API is what the `lockhub` binary (`src/main.rs`)
//! needs. Every other module is declared with [`internal!`]: `pub` only
//! with the `testing` feature, which testkit turns on for the tests, the
//! benchmarks and the demo, and `pub(crate)` otherwise, so a build of the
//! daemon reports the code nothing uses.

/// Declares internal modules: `pub` with the `testing` feature (the tests,
/// benches and demo reach inside through testkit), `pub(crate)` without it.
macro_rules! internal {
    ($(mod $name:ident;)*) => {
        $(
            #[cfg(feature = "testing")]
            pub mod $name;
            #[cfg(not(feature = "testing"))]
            pub(crate) mod $name;
        )*
    };
}

pub mod config;
pub mod drivers;
pub mod ops;
pub mod runtime;
pub mod sim;
pub mod store;
internal! {
    mod clock;
    mod door;
    mod lifecycle;
    mod sync;
}
