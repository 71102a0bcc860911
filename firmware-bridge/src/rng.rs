//! Randomness for the sealed link (`serial.md`, "Randomness"): every
//! `hub_nonce`, `board_nonce` and X25519 private key is fresh.
//!
//! On a board the bytes come from its hardware random source through a
//! DRBG (HMAC-DRBG with SHA-256, NIST SP 800-90A) seeded with that source
//! *and a boot counter*: the board keeps the counter in flash, raises and
//! writes it before the first use, and passes the raised value here. So
//! even a random source that repeats itself after a reset (a weak ring
//! oscillator, a seed latched at power-up) never yields a nonce of an
//! earlier boot. The crate does not touch flash: the counter is an input.
//!
//! The state machines take any [`RandomSource`]; [`Rng`] is the board's.
//! Tests may implement the trait with fixed bytes to replay the vectors.

use hmac::Mac;
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::seal::hmac;

/// Where the random bytes of handshakes and key pairs come from.
pub trait RandomSource {
    /// Fill `out` with random bytes.
    fn fill_bytes(&mut self, out: &mut [u8]);
}

/// A board's hardware random source (the HAL's TRNG). It should block
/// until it has fresh bytes; the DRBG mixes it into every request.
pub trait EntropySource {
    /// Fill `out` with bytes from the hardware.
    fn fill_entropy(&mut self, out: &mut [u8]);
}

const PERSONALISATION: &[u8] = b"lockhub-board-drbg";
const LEN: usize = 32;

/// HMAC-DRBG state (SP 800-90A, 10.1.2). Wiped on drop.
#[derive(Zeroize, ZeroizeOnDrop)]
struct HmacDrbg {
    k: [u8; LEN],
    v: [u8; LEN],
}

impl HmacDrbg {
    fn mac(key: &[u8; LEN], parts: &[&[u8]]) -> [u8; LEN] {
        hmac(key, parts).finalize().into_bytes().into()
    }

    /// HMAC_DRBG_Update: K = HMAC(K, V || round || data), V = HMAC(K, V),
    /// round 0x00 and, when there is data, round 0x01. `data` is at most
    /// four pieces, concatenated.
    fn update(&mut self, data: &[&[u8]]) {
        let rounds: &[u8] = if data.iter().all(|d| d.is_empty()) {
            &[0x00]
        } else {
            &[0x00, 0x01]
        };
        for round in rounds {
            let mut parts: [&[u8]; 6] = [&[]; 6];
            parts[0] = &self.v;
            parts[1] = core::slice::from_ref(round);
            for (slot, d) in parts.iter_mut().skip(2).zip(data) {
                *slot = d;
            }
            let k = Self::mac(&self.k, &parts);
            self.k = k;
            self.v = Self::mac(&self.k, &[&self.v]);
        }
    }

    /// Instantiate from up to four pieces of seed material.
    fn new(seed: &[&[u8]]) -> Self {
        let mut d = Self {
            k: [0x00; LEN],
            v: [0x01; LEN],
        };
        d.update(seed);
        d
    }

    fn generate(&mut self, additional: &[u8], out: &mut [u8]) {
        if !additional.is_empty() {
            self.update(&[additional]);
        }
        for chunk in out.chunks_mut(LEN) {
            self.v = Self::mac(&self.k, &[&self.v]);
            for (o, b) in chunk.iter_mut().zip(self.v.iter()) {
                *o = *b;
            }
        }
        self.update(&[additional]);
    }
}

/// The board's random source: its hardware entropy through an HMAC-DRBG
/// seeded with the boot counter. See the module docs.
pub struct Rng<E> {
    source: E,
    drbg: HmacDrbg,
}

impl<E: EntropySource> Rng<E> {
    /// Seed from `source` and `boot_counter`: the counter as stored in
    /// flash, already raised for this boot and written back before this
    /// call (a board that cannot write it must not start the link).
    pub fn new(mut source: E, boot_counter: u32) -> Self {
        let mut entropy = [0u8; LEN];
        source.fill_entropy(&mut entropy);
        let drbg = HmacDrbg::new(&[&entropy, &boot_counter.to_le_bytes(), PERSONALISATION]);
        entropy.zeroize();
        Self { source, drbg }
    }
}

impl<E: EntropySource> RandomSource for Rng<E> {
    /// Every request also mixes in fresh hardware bytes (prediction
    /// resistance against a state read out between requests).
    fn fill_bytes(&mut self, out: &mut [u8]) {
        let mut fresh = [0u8; LEN];
        self.source.fill_entropy(&mut fresh);
        self.drbg.generate(&fresh, out);
        fresh.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// HMAC-DRBG with SHA-256, NIST CAVP (HMAC_DRBG.rsp, SHA-256, no
    /// prediction resistance, no reseed, no personalisation, no
    /// additional input), COUNT = 0: the first vector of the file.
    #[test]
    fn hmac_drbg_matches_the_nist_vector() {
        let entropy = hex32("ca851911349384bffe89de1cbdc46e6831e44d34a4fb935ee285dd14b71a7488");
        let nonce: [u8; 16] = hex32_prefix("659ba96c601dc69fc902940805ec0ca8");
        let mut d = HmacDrbg::new(&[&entropy, &nonce]);
        let mut out = [0u8; 128];
        d.generate(&[], &mut out);
        d.generate(&[], &mut out);
        let expect = "e528e9abf2dece54d47c7e75e5fe302149f817ea9fb4bee6f4199697d04d5b89\
                      d54fbb978a15b5c443c9ec21036d2460b6f73ebad0dc2aba6e624abf07745bc1\
                      07694bb7547bb0995f70de25d6b29e2d3011bb19d27676c07162c8b5ccde0668\
                      961df86803482cb37ed6d5c0bb8d50cf1f50d476aa0458bdaba806f48be9dcb8";
        let mut want = [0u8; 128];
        for (i, w) in want.iter_mut().enumerate() {
            *w = u8::from_str_radix(&expect[2 * i..2 * i + 2], 16).unwrap();
        }
        assert_eq!(out, want);
    }

    fn hex32(s: &str) -> [u8; 32] {
        let mut a = [0u8; 32];
        for (i, b) in a.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        a
    }

    fn hex32_prefix(s: &str) -> [u8; 16] {
        let mut a = [0u8; 16];
        for (i, b) in a.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
        }
        a
    }
}
