//! Simulated peers, built from the same contract code as the daemon: a cloud
//! that signs events, and (elsewhere in this module) a lock board. Tests,
//! the demo and the benchmarks use them; so can an installer checking wiring.

pub mod board;
/// Only the tests, benchmarks and the demo sign events as a cloud.
#[cfg(feature = "testing")]
pub mod cloud;
