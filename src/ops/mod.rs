//! The operator's commands beside the daemon: each reads or writes the
//! hub's files and database directly, and each is safe while the daemon
//! runs, except `board` (pairing and rekey talk on a board's serial line,
//! which the daemon owns while it runs).

pub mod alert_clear;
pub mod board;
pub mod provision;
pub mod status;
