//! OSDP v2.2 packet framing: build a command, find and check replies in a
//! byte stream. Pure: no I/O, no clock, no keys (the MAC is a closure the
//! Secure Channel supplies).
//!
//! ```text
//! [0xFF mark] 0x53 ADDR LEN_LSB LEN_MSB CTRL [SCB] CODE DATA.. [MAC(4)] CRC_LSB CRC_MSB
//! ```
//! `LEN` counts from the start of message (0x53) to the end of the CRC.
//! CTRL: bits 0-1 the sequence number, 0x04 a CRC-16 (not a checksum)
//! follows, 0x08 a security block is present. A reply's address has bit 7
//! set. The hub always sends a CRC and accepts only replies with one.

/// Start of message.
pub const SOM: u8 = 0x53;
/// The mark byte OSDP v2.2 puts before SOM; receivers skip it.
pub const MARK: u8 = 0xFF;
/// Broadcast address: never a reader's.
pub const BROADCAST: u8 = 0x7F;
/// The largest packet the hub accepts. Our commands are far smaller and a
/// reader's replies (PDID, PDCAP, a few key presses, a card) fit; anything
/// longer on the wire is garbage, and a bounded buffer is the point.
pub const MAX_PACKET: usize = 512;
/// SOM, ADDR, LEN(2), CTRL, CODE, CRC(2).
pub const MIN_PACKET: usize = 8;

const CTRL_CRC: u8 = 0x04;
const CTRL_SCB: u8 = 0x08;
const REPLY_BIT: u8 = 0x80;

/// Security block types (SCS_xx) of OSDP v2.2 Annex D.
pub mod scs {
    pub const CHLNG: u8 = 0x11;
    pub const CCRYPT: u8 = 0x12;
    pub const SCRYPT: u8 = 0x13;
    pub const RMAC_I: u8 = 0x14;
    /// Command with a MAC, no data.
    pub const CMD_MAC: u8 = 0x15;
    /// Reply with a MAC, no data.
    pub const REPLY_MAC: u8 = 0x16;
    /// Command with a MAC and encrypted data.
    pub const CMD_ENC: u8 = 0x17;
    /// Reply with a MAC and encrypted data.
    pub const REPLY_ENC: u8 = 0x18;

    /// Packets of these types carry a 4-byte MAC before the CRC.
    pub fn has_mac(t: u8) -> bool {
        (CMD_MAC..=REPLY_ENC).contains(&t)
    }
}

/// CRC-16 of OSDP (CCITT polynomial 0x1021, initial value 0x1D0F, MSB first).
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0x1D0F;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Computes a packet's MAC (Secure Channel) over SOM..data: its first 4 bytes.
pub type MacFn<'a> = &'a mut dyn FnMut(&[u8]) -> [u8; 4];

/// Builds one command packet (with the leading mark byte). `scb` is the
/// whole security block (length byte first) or empty; `mac`, when given,
/// computes the MAC over the packet so far (SOM .. data) and returns its
/// first 4 bytes, which are appended before the CRC.
pub fn encode(
    addr: u8,
    seq: u8,
    scb: &[u8],
    code: u8,
    data: &[u8],
    mac: Option<MacFn<'_>>,
) -> Vec<u8> {
    let mac_len = if mac.is_some() { 4 } else { 0 };
    let len = 5 + scb.len() + 1 + data.len() + mac_len + 2;
    let mut p = Vec::with_capacity(len + 1);
    p.push(MARK);
    p.push(SOM);
    p.push(addr);
    p.extend_from_slice(&(len as u16).to_le_bytes());
    let mut ctrl = (seq & 0x03) | CTRL_CRC;
    if !scb.is_empty() {
        ctrl |= CTRL_SCB;
    }
    p.push(ctrl);
    p.extend_from_slice(scb);
    p.push(code);
    p.extend_from_slice(data);
    if let Some(mac) = mac {
        let m = mac(&p[1..]);
        p.extend_from_slice(&m);
    }
    let crc = crc16(&p[1..]);
    p.extend_from_slice(&crc.to_le_bytes());
    p
}

/// One packet whose framing and CRC are right; nothing else is trusted yet.
/// Its `Debug` leaves the bytes out: a plaintext reader's KEYPAD reply
/// carries PIN digits.
#[derive(Clone, PartialEq, Eq)]
pub struct Packet {
    /// SOM through the CRC.
    raw: Vec<u8>,
    scb_len: usize,
    mac: bool,
}

impl std::fmt::Debug for Packet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packet")
            .field("len", &self.raw.len())
            .field("scb_len", &self.scb_len)
            .field("mac", &self.mac)
            .finish_non_exhaustive()
    }
}

/// Why bytes on the wire were not a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    #[error("length field out of range")]
    Length,
    #[error("bad CRC")]
    Crc,
    #[error("no CRC (checksum packets are not accepted)")]
    NoCrc,
    #[error("malformed security block")]
    Scb,
}

impl Packet {
    /// Checks one complete packet (SOM through CRC).
    pub fn parse(raw: &[u8]) -> Result<Packet, PacketError> {
        if raw.len() < MIN_PACKET || raw.len() > MAX_PACKET || raw[0] != SOM {
            return Err(PacketError::Length);
        }
        let len = usize::from(u16::from_le_bytes([raw[2], raw[3]]));
        if len != raw.len() {
            return Err(PacketError::Length);
        }
        if raw[4] & CTRL_CRC == 0 {
            return Err(PacketError::NoCrc);
        }
        let body = &raw[..len - 2];
        if crc16(body).to_le_bytes() != [raw[len - 2], raw[len - 1]] {
            return Err(PacketError::Crc);
        }
        let (scb_len, mac) = if raw[4] & CTRL_SCB != 0 {
            let l = usize::from(raw[5]);
            // The SCB is at least its length and type; the code must follow.
            if l < 2 || 5 + l + 1 > len - 2 {
                return Err(PacketError::Scb);
            }
            let mac = scs::has_mac(raw[6]);
            if mac && 5 + l + 1 + 4 > len - 2 {
                return Err(PacketError::Scb);
            }
            (l, mac)
        } else {
            (0, false)
        };
        Ok(Packet {
            raw: raw.to_vec(),
            scb_len,
            mac,
        })
    }

    /// The address without the reply bit.
    pub fn addr(&self) -> u8 {
        self.raw[1] & !REPLY_BIT
    }

    pub fn is_reply(&self) -> bool {
        self.raw[1] & REPLY_BIT != 0
    }

    pub fn seq(&self) -> u8 {
        self.raw[4] & 0x03
    }

    /// The security block type, if any.
    pub fn scb_type(&self) -> Option<u8> {
        (self.scb_len > 0).then(|| self.raw[6])
    }

    /// The security block's data (after its length and type).
    #[cfg(any(test, feature = "testing"))]
    pub fn scb_data(&self) -> &[u8] {
        if self.scb_len > 2 {
            &self.raw[7..5 + self.scb_len]
        } else {
            &[]
        }
    }

    pub fn code(&self) -> u8 {
        self.raw[5 + self.scb_len]
    }

    fn mac_len(&self) -> usize {
        if self.mac { 4 } else { 0 }
    }

    /// The data after the code (still encrypted if the SCB says so).
    pub fn data(&self) -> &[u8] {
        let end = self.raw.len() - 2 - self.mac_len();
        &self.raw[5 + self.scb_len + 1..end]
    }

    /// The MAC, when the packet carries one.
    pub fn mac(&self) -> Option<[u8; 4]> {
        self.mac.then(|| {
            let end = self.raw.len() - 2;
            self.raw[end - 4..end].try_into().expect("4 bytes")
        })
    }

    /// What the MAC covers: SOM through the data.
    pub fn mac_input(&self) -> &[u8] {
        &self.raw[..self.raw.len() - 2 - self.mac_len()]
    }
}

/// Finds packets in a byte stream. Bounded: it never holds more than
/// [`MAX_PACKET`] bytes; bytes that cannot start a packet are skipped and
/// counted, and a packet with a bad CRC is dropped by resynchronising one
/// byte after its start.
#[derive(Debug, Default)]
pub struct Deframer {
    buf: Vec<u8>,
    /// Bytes dropped as noise (outside a packet, or a packet that failed).
    pub garbage_bytes: u64,
    /// Candidate packets rejected (bad length, CRC or SCB).
    pub bad_packets: u64,
}

impl Deframer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets a partial packet (a new command starts a new exchange).
    pub fn clear(&mut self) {
        self.garbage_bytes += self.buf.len() as u64;
        self.buf.clear();
    }

    /// Adds bytes and returns every complete, CRC-valid packet in them.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<Packet> {
        let mut out = Vec::new();
        for &b in bytes {
            if self.buf.is_empty() {
                if b == SOM {
                    self.buf.push(b);
                } else if b != MARK {
                    self.garbage_bytes += 1;
                }
                continue;
            }
            self.buf.push(b);
            self.scan(&mut out);
        }
        out
    }

    fn scan(&mut self, out: &mut Vec<Packet>) {
        loop {
            if self.buf.len() < 4 {
                return;
            }
            let len = usize::from(u16::from_le_bytes([self.buf[2], self.buf[3]]));
            if !(MIN_PACKET..=MAX_PACKET).contains(&len) {
                self.bad_packets += 1;
                self.resync();
                continue;
            }
            if self.buf.len() < len {
                return;
            }
            match Packet::parse(&self.buf[..len]) {
                Ok(p) => {
                    out.push(p);
                    self.buf.drain(..len);
                    self.garbage_bytes += self.skip_to_som() as u64;
                }
                Err(_) => {
                    self.bad_packets += 1;
                    self.resync();
                }
            }
        }
    }

    /// Drops the SOM that started a failed candidate and looks for the next.
    fn resync(&mut self) {
        self.buf.remove(0);
        self.garbage_bytes += 1 + self.skip_to_som() as u64;
    }

    fn skip_to_som(&mut self) -> usize {
        let n = self
            .buf
            .iter()
            .position(|&b| b == SOM)
            .unwrap_or(self.buf.len());
        self.buf.drain(..n);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crc_is_crc16_aug_ccitt() {
        // The catalogue check value of CRC-16/AUG-CCITT.
        assert_eq!(crc16(b"123456789"), 0xE5CC);
    }

    #[test]
    fn a_packets_debug_shows_its_shape_but_not_its_bytes() {
        // A plaintext KEYPAD reply: PIN digits '4', '8', '2', '9'.
        let p = encode(0x81, 1, &[], 0x53, &[0, 4, 0x34, 0x38, 0x32, 0x39], None);
        let shown = format!("{:?}", Packet::parse(&p[1..]).unwrap());
        assert!(!shown.contains("52") && !shown.contains("0x34"), "{shown}");
        assert!(shown.contains("len"), "{shown}");
    }

    #[test]
    fn a_poll_encodes_as_the_spec_example() {
        // osdp_POLL to address 0, sequence 1, with CRC (OSDP v2.2 Annex).
        let p = encode(0x00, 1, &[], 0x60, &[], None);
        assert_eq!(&p[..7], &[0xFF, 0x53, 0x00, 0x08, 0x00, 0x05, 0x60]);
        assert_eq!(p.len(), 9);
        let parsed = Packet::parse(&p[1..]).unwrap();
        assert_eq!(parsed.seq(), 1);
        assert_eq!(parsed.code(), 0x60);
        assert!(parsed.data().is_empty());
    }

    #[test]
    fn a_packet_with_a_mac_and_scb_round_trips() {
        let mut mac = |_: &[u8]| [1, 2, 3, 4];
        let p = encode(5, 2, &[0x02, scs::CMD_ENC], 0x68, &[9; 16], Some(&mut mac));
        let parsed = Packet::parse(&p[1..]).unwrap();
        assert_eq!(parsed.addr(), 5);
        assert_eq!(parsed.scb_type(), Some(scs::CMD_ENC));
        assert_eq!(parsed.data(), &[9; 16]);
        assert_eq!(parsed.mac(), Some([1, 2, 3, 4]));
        assert_eq!(parsed.mac_input().len(), p.len() - 1 - 6);
    }

    #[test]
    fn the_deframer_skips_noise_and_finds_packets_split_across_reads() {
        let a = encode(1, 0, &[], 0x40, &[], None);
        let b = encode(2, 1, &[], 0x45, &[1, 2, 3], None);
        let mut stream = vec![0x00, 0x53, 0x99, 0x12];
        stream.extend_from_slice(&a);
        stream.extend_from_slice(&b);
        let mut d = Deframer::new();
        let mut got = Vec::new();
        for chunk in stream.chunks(3) {
            got.extend(d.push(chunk));
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].data(), &[1, 2, 3]);
        assert!(d.garbage_bytes > 0);
    }

    #[test]
    fn a_packet_with_a_flipped_bit_is_counted_and_dropped() {
        let mut a = encode(1, 0, &[], 0x40, &[], None);
        a[6] ^= 0x01;
        let good = encode(1, 0, &[], 0x40, &[], None);
        let mut d = Deframer::new();
        let mut got = d.push(&a);
        got.extend(d.push(&good));
        assert_eq!(got.len(), 1);
        assert_eq!(d.bad_packets, 1);
    }

    #[test]
    fn a_huge_length_field_never_grows_the_buffer() {
        let mut d = Deframer::new();
        let got = d.push(&[0x53, 0x81, 0xFF, 0xFF, 0x05, 0x40]);
        assert!(got.is_empty());
        assert!(d.buf.len() < MAX_PACKET);
        assert_eq!(d.bad_packets, 1);
    }

    #[test]
    fn every_truncation_and_corruption_of_a_packet_is_rejected_without_panic() {
        let p = encode(
            3,
            2,
            &[0x02, scs::REPLY_ENC],
            0x53,
            &[7; 16],
            Some(&mut |_| [0; 4]),
        );
        for n in 0..p.len() {
            let _ = Packet::parse(&p[1..1 + n.min(p.len() - 1)]);
            for bit in 0..8 {
                let mut q = p[1..].to_vec();
                if n < q.len() {
                    q[n] ^= 1 << bit;
                    assert!(Packet::parse(&q).is_err());
                }
            }
        }
    }
}
