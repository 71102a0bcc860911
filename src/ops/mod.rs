//! The operator's commands beside the daemon: each reads or writes the
//! hub's files and database directly, and each is safe while the daemon runs.

pub mod alert_clear;
pub mod provision;
pub mod status;
