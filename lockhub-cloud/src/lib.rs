//! # lockhub-cloud
//!
//! The cloud's half of lockhub's MQTT contract (docs/protocol/mqtt.md): a
//! reference for cloud teams, and a working cloud side for a site that runs
//! no cloud of its own. It signs key events with durable per-hub sequence
//! numbers, publishes them at QoS 1, answers the hubs' sync requests with the
//! original envelopes, sends checkpoints, and verifies and records what the
//! hubs sign back. Wire types, signing and verification are
//! `lockhub-proto`'s; this crate keeps state and talks to the broker.
//!
//! | layer | module | what lives there |
//! |---|---|---|
//! | state | [`store`] | the [`store::Store`] trait (one transaction per method) and its SQLite backend |
pub mod cli;
pub mod mqtt;
pub mod ops;
pub mod reconcile;
pub mod request;
pub mod serve;
pub mod signer;
pub mod store;
