//! Loopback ports for the brokers and daemons a test starts.

use std::net::TcpListener;

/// A loopback port free now and never handed out before in this process.
///
/// The kernel may hand the same ephemeral port to two tests of one binary
/// that ask at nearly the same time (one bound and released it, the other
/// got it next): two brokers then race for it, the loser exits, and both
/// tests talk to the winner. Remembering what was handed out rules that out
/// within a process; [`crate::broker::Mosquitto`] also waits until the
/// broker answering is its own, for a port taken from outside meanwhile.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_port_is_handed_out_twice_in_a_process() {
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            assert!(seen.insert(free_port()));
        }
    }
}
