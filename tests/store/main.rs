//! The store suite: `store` on real SQLite files, no daemon: applying
//! events, erasure, the schema's invariants attacked with raw SQL, the
//! shared vectors (verify and store), the clock and the door decision.
//! One test binary, so the suite links once.

mod apply;
mod clock;
mod door;
mod door_group;
mod erasure;
mod invariants;
mod mirror;
mod outbox_queued;
mod vectors_store;
mod vectors_verify;
