//! Helpers the sealed-link test suites share.

#![allow(dead_code)]

use firmware_bridge::frame::PayloadDecoder;
use firmware_bridge::rng::{EntropySource, Rng};

/// A hardware source that never repeats within a run (a real TRNG's
/// stand-in); seeded so each test's bytes are its own.
pub struct Counting(pub u64);

impl EntropySource for Counting {
    fn fill_entropy(&mut self, out: &mut [u8]) {
        for b in out {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = (self.0 >> 33) as u8;
        }
    }
}

/// A board's random source over [`Counting`], boot 1.
pub fn rng(seed: u64) -> Rng<Counting> {
    Rng::new(Counting(seed), 1)
}

/// The payloads (CRC checked) of every good frame in `wire`, in order.
pub fn payloads(wire: &[u8]) -> Vec<Vec<u8>> {
    let mut d = PayloadDecoder::new();
    let mut out = Vec::new();
    for &b in wire {
        if let Some(Ok(p)) = d.push(b) {
            out.push(p.to_vec());
        }
    }
    out
}

/// The payload of the one frame in `wire`; panics unless there is exactly
/// one, and it is good.
pub fn payload(wire: &[u8]) -> Vec<u8> {
    let mut d = PayloadDecoder::new();
    let mut got = None;
    for &b in wire {
        if let Some(r) = d.push(b) {
            assert!(got.is_none(), "one frame per wire");
            got = Some(r.expect("a good frame").to_vec());
        }
    }
    got.expect("a complete frame")
}
