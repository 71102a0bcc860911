//! OSDP Secure Channel (v2.2 Annex D): session keys, cryptograms, the
//! chained MAC and the payload cipher. Pure functions over AES-128.
//!
//! - Session keys from the SCBK and the CP's random RND.A:
//!   `S-ENC = AES(SCBK, 01 82 RND.A[0..6] 00..)`, `S-MAC1` with `01 01`,
//!   `S-MAC2` with `01 02`.
//! - The reader proves the key with `AES(S-ENC, RND.A || RND.B)` (in
//!   osdp_CCRYPT), the hub with `AES(S-ENC, RND.B || RND.A)` (osdp_SCRYPT);
//!   the reader's `R-MAC_I = AES(S-MAC2, AES(S-MAC1, CP cryptogram))` seeds
//!   the MAC chain.
//! - MAC: CBC-MAC over SOM..data padded with `80 00..` to 16 bytes (no pad
//!   when already aligned), every block under S-MAC1 except the last, under
//!   S-MAC2. A command's IV is the last reply MAC, a reply's the command
//!   MAC; the first 4 bytes go on the wire.
//! - Data: AES-CBC under S-ENC, padded with `80 00..` (always), IV the
//!   complement of the last MAC from the other side.

use aes::Aes128;
use aes::cipher::{BlockDecrypt, BlockEncrypt, KeyInit, generic_array::GenericArray};
use zeroize::{Zeroize, Zeroizing};

/// A 128-bit AES key (an SCBK or a session key).
pub type Key = [u8; 16];

pub use crate::config::SCBK_D;

// Each `Aes128` (its key schedule) is wiped when dropped: the `aes` crate's
// `zeroize` feature.
fn encrypt_block(key: &Key, block: &mut [u8; 16]) {
    let c = Aes128::new(GenericArray::from_slice(key));
    c.encrypt_block(GenericArray::from_mut_slice(block));
}

fn decrypt_block(key: &Key, block: &mut [u8; 16]) {
    let c = Aes128::new(GenericArray::from_slice(key));
    c.decrypt_block(GenericArray::from_mut_slice(block));
}

pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The three session keys of one Secure Channel session.
#[derive(Clone)]
pub struct SessionKeys {
    s_enc: Key,
    s_mac1: Key,
    s_mac2: Key,
}

impl Drop for SessionKeys {
    fn drop(&mut self) {
        self.s_enc.zeroize();
        self.s_mac1.zeroize();
        self.s_mac2.zeroize();
    }
}

impl std::fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKeys(redacted)")
    }
}

impl SessionKeys {
    pub fn derive(scbk: &Key, rnd_a: &[u8; 8]) -> Self {
        let k = |b1: u8| {
            let mut block = [0u8; 16];
            block[0] = 0x01;
            block[1] = b1;
            block[2..8].copy_from_slice(&rnd_a[..6]);
            encrypt_block(scbk, &mut block);
            block
        };
        SessionKeys {
            s_enc: k(0x82),
            s_mac1: k(0x01),
            s_mac2: k(0x02),
        }
    }

    pub(crate) fn cryptogram(&self, first: &[u8; 8], second: &[u8; 8]) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(first);
        b[8..].copy_from_slice(second);
        encrypt_block(&self.s_enc, &mut b);
        b
    }

    /// Whether the reader's cryptogram (osdp_CCRYPT) proves it holds the key.
    pub fn pd_cryptogram_ok(&self, rnd_a: &[u8; 8], rnd_b: &[u8; 8], got: &[u8]) -> bool {
        ct_eq(&self.cryptogram(rnd_a, rnd_b), got)
    }

    /// The hub's cryptogram for osdp_SCRYPT.
    pub fn cp_cryptogram(&self, rnd_a: &[u8; 8], rnd_b: &[u8; 8]) -> [u8; 16] {
        self.cryptogram(rnd_b, rnd_a)
    }

    /// The initial reply MAC the reader must send in osdp_RMAC_I.
    pub fn rmac_i(&self, cp_cryptogram: &[u8; 16]) -> [u8; 16] {
        let mut b = *cp_cryptogram;
        encrypt_block(&self.s_mac1, &mut b);
        encrypt_block(&self.s_mac2, &mut b);
        b
    }
}

/// An established channel: the session keys and the two ends of the MAC
/// chain.
#[derive(Clone)]
pub struct Channel {
    keys: SessionKeys,
    /// The last command MAC (the hub's).
    c_mac: [u8; 16],
    /// The last reply MAC (the reader's); R-MAC_I at first.
    r_mac: [u8; 16],
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Channel(redacted)")
    }
}

fn not(b: &[u8; 16]) -> [u8; 16] {
    let mut o = *b;
    o.iter_mut().for_each(|x| *x = !*x);
    o
}

impl Channel {
    /// Opens the channel once R-MAC_I has been checked.
    pub fn new(keys: SessionKeys, rmac_i: [u8; 16]) -> Self {
        Channel {
            keys,
            c_mac: [0; 16],
            r_mac: rmac_i,
        }
    }

    fn mac(&self, iv: &[u8; 16], data: &[u8]) -> [u8; 16] {
        let mut padded = data.to_vec();
        if padded.is_empty() || !padded.len().is_multiple_of(16) {
            padded.push(0x80);
            padded.resize(padded.len().div_ceil(16) * 16, 0);
        }
        let n = padded.len() / 16;
        let mut chain = *iv;
        for (i, block) in padded.chunks_exact(16).enumerate() {
            for (c, b) in chain.iter_mut().zip(block) {
                *c ^= b;
            }
            let key = if i + 1 == n {
                &self.keys.s_mac2
            } else {
                &self.keys.s_mac1
            };
            encrypt_block(key, &mut chain);
        }
        chain
    }

    /// The MAC of a command (SOM..data); it becomes the chain's C-MAC.
    pub fn mac_command(&mut self, packet: &[u8]) -> [u8; 4] {
        self.c_mac = self.mac(&self.r_mac, packet);
        self.c_mac[..4].try_into().expect("4 bytes")
    }

    /// Checks a reply's MAC; on success it becomes the chain's R-MAC.
    pub fn verify_reply(&mut self, packet: &[u8], got: &[u8; 4]) -> bool {
        let m = self.mac(&self.c_mac, packet);
        if ct_eq(&m[..4], got) {
            self.r_mac = m;
            true
        } else {
            false
        }
    }

    /// Encrypts a command's data (IV: the complement of the last R-MAC).
    pub fn encrypt_command(&self, data: &[u8]) -> Vec<u8> {
        let mut out = data.to_vec();
        out.push(0x80);
        out.resize(out.len().div_ceil(16) * 16, 0);
        let mut iv = not(&self.r_mac);
        for block in out.chunks_exact_mut(16) {
            let b: &mut [u8; 16] = block.try_into().expect("16 bytes");
            for (x, v) in b.iter_mut().zip(&iv) {
                *x ^= v;
            }
            encrypt_block(&self.keys.s_enc, b);
            iv = *b;
        }
        out
    }

    /// Decrypts a reply's data (IV: the complement of the command's MAC) and
    /// strips its padding; `None` when it is not a whole number of blocks
    /// or the padding is wrong.
    pub fn decrypt_reply(&self, data: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
        if data.is_empty() || !data.len().is_multiple_of(16) {
            return None;
        }
        // Plaintext (key presses, a new key): wiped when dropped, padding
        // and failed decryptions included.
        let mut out = Zeroizing::new(data.to_vec());
        let mut iv = not(&self.c_mac);
        for block in out.chunks_exact_mut(16) {
            let b: &mut [u8; 16] = block.try_into().expect("16 bytes");
            let ct = *b;
            decrypt_block(&self.keys.s_enc, b);
            for (x, v) in b.iter_mut().zip(&iv) {
                *x ^= v;
            }
            iv = ct;
        }
        let end = out.iter().rposition(|&b| b != 0)?;
        if out[end] != 0x80 || out.len() - end > 16 {
            return None;
        }
        out.truncate(end);
        Some(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The reader's half of the channel, for round-trip tests only.
    pub(crate) struct PdSide {
        keys: SessionKeys,
        c_mac: [u8; 16],
        r_mac: [u8; 16],
    }

    impl PdSide {
        pub(crate) fn new(scbk: &Key, rnd_a: &[u8; 8], cp_cryptogram: &[u8; 16]) -> Self {
            let keys = SessionKeys::derive(scbk, rnd_a);
            let r_mac = keys.rmac_i(cp_cryptogram);
            PdSide {
                keys,
                c_mac: [0; 16],
                r_mac,
            }
        }

        fn as_channel(&self) -> Channel {
            Channel {
                keys: self.keys.clone(),
                c_mac: self.c_mac,
                r_mac: self.r_mac,
            }
        }

        pub(crate) fn verify_command(&mut self, packet: &[u8], got: &[u8; 4]) -> bool {
            let m = self.as_channel().mac(&self.r_mac, packet);
            self.c_mac = m;
            ct_eq(&m[..4], got)
        }

        pub(crate) fn mac_reply(&mut self, packet: &[u8]) -> [u8; 4] {
            self.r_mac = self.as_channel().mac(&self.c_mac, packet);
            self.r_mac[..4].try_into().unwrap()
        }

        pub(crate) fn encrypt_reply(&self, data: &[u8]) -> Vec<u8> {
            // The reply's IV is the complement of the command MAC: the
            // hub's encrypt with the roles swapped.
            let mut ch = self.as_channel();
            ch.r_mac = self.c_mac;
            ch.encrypt_command(data)
        }

        pub(crate) fn decrypt_command(&self, data: &[u8]) -> Option<Vec<u8>> {
            let mut ch = self.as_channel();
            ch.c_mac = self.r_mac;
            ch.decrypt_reply(data).map(|d| d.to_vec())
        }
    }

    const RND_A: [u8; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
    const RND_B: [u8; 8] = [9, 10, 11, 12, 13, 14, 15, 16];

    #[test]
    fn session_keys_follow_annex_d_with_the_install_key() {
        // S-ENC for SCBK-D and this RND.A, by the formula: one AES block.
        let keys = SessionKeys::derive(&SCBK_D, &RND_A);
        let mut expect = [0x01, 0x82, 1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0, 0, 0];
        encrypt_block(&SCBK_D, &mut expect);
        assert_eq!(keys.s_enc, expect);
        assert_ne!(keys.s_mac1, keys.s_mac2);
        // Only the first 6 bytes of RND.A enter the keys.
        let mut other = RND_A;
        other[7] = 0xEE;
        assert_eq!(SessionKeys::derive(&SCBK_D, &other).s_mac1, keys.s_mac1);
    }

    #[test]
    fn a_cryptogram_made_with_another_key_does_not_verify() {
        let right = SessionKeys::derive(&[7; 16], &RND_A);
        let wrong = SessionKeys::derive(&[8; 16], &RND_A);
        let from_reader = right.cryptogram(&RND_A, &RND_B);
        assert!(right.pd_cryptogram_ok(&RND_A, &RND_B, &from_reader));
        assert!(!wrong.pd_cryptogram_ok(&RND_A, &RND_B, &from_reader));
        // The hub's cryptogram is the reverse order, so a reader's cannot
        // be replayed as the hub's.
        assert_ne!(right.cp_cryptogram(&RND_A, &RND_B), from_reader);
    }

    #[test]
    fn macs_chain_and_payloads_round_trip_between_the_two_sides() {
        let scbk = [0x42; 16];
        let keys = SessionKeys::derive(&scbk, &RND_A);
        let cp_c = keys.cp_cryptogram(&RND_A, &RND_B);
        let mut pd = PdSide::new(&scbk, &RND_A, &cp_c);
        let mut cp = Channel::new(keys.clone(), keys.rmac_i(&cp_c));
        for round in 0..3u8 {
            let data = vec![round; 5 + usize::from(round) * 7];
            let enc = cp.encrypt_command(&data);
            assert_eq!(enc.len() % 16, 0);
            let mut pkt = vec![0x53, round];
            pkt.extend_from_slice(&enc);
            let m = cp.mac_command(&pkt);
            assert!(pd.verify_command(&pkt, &m));
            assert_eq!(pd.decrypt_command(&enc).unwrap(), data);

            let reply = vec![0xA0 | round; 16];
            let enc = pd.encrypt_reply(&reply);
            let mut rpkt = vec![0x53, 0x80 | round];
            rpkt.extend_from_slice(&enc);
            let rm = pd.mac_reply(&rpkt);
            let mut bad = rm;
            bad[0] ^= 1;
            assert!(!cp.clone().verify_reply(&rpkt, &bad));
            assert!(cp.verify_reply(&rpkt, &rm));
            assert_eq!(*cp.decrypt_reply(&enc).unwrap(), reply);
        }
    }

    #[test]
    fn a_replayed_reply_fails_the_mac_chain() {
        let scbk = [0x11; 16];
        let keys = SessionKeys::derive(&scbk, &RND_A);
        let cp_c = keys.cp_cryptogram(&RND_A, &RND_B);
        let mut pd = PdSide::new(&scbk, &RND_A, &cp_c);
        let mut cp = Channel::new(keys.clone(), keys.rmac_i(&cp_c));
        let cmd = [0x53, 1, 0x60];
        let m = cp.mac_command(&cmd);
        assert!(pd.verify_command(&cmd, &m));
        let reply = [0x53, 0x81, 0x40];
        let rm = pd.mac_reply(&reply);
        assert!(cp.verify_reply(&reply, &rm));
        // Next command; the old reply replayed must not verify.
        let _ = cp.mac_command(&[0x53, 2, 0x60]);
        assert!(!cp.verify_reply(&reply, &rm));
    }

    #[test]
    fn bad_padding_or_length_is_refused_when_decrypting() {
        let keys = SessionKeys::derive(&[1; 16], &RND_A);
        let ch = Channel::new(keys, [0; 16]);
        assert!(ch.decrypt_reply(&[]).is_none());
        assert!(ch.decrypt_reply(&[0; 15]).is_none());
        // Random bytes almost never decrypt to a valid pad.
        let mut refused = 0;
        for i in 0..32u8 {
            if ch.decrypt_reply(&[i; 16]).is_none() {
                refused += 1;
            }
        }
        assert!(refused > 24);
    }
}
