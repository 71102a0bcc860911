//! The bytes of OSDP commands and replies: the codes the hub sends and
//! understands, each queued command's encoding, and the replies (osdp_PDID,
//! osdp_PDCAP) the state machine reads. Pure, like the state machine in
//! [`super`].

use super::*;

/// Command codes (OSDP v2.2 Annex A.1) the hub sends.
pub mod cmd {
    pub const POLL: u8 = 0x60;
    pub const ID: u8 = 0x61;
    pub const CAP: u8 = 0x62;
    pub const LSTAT: u8 = 0x64;
    pub const ISTAT: u8 = 0x65;
    pub const OUT: u8 = 0x68;
    pub const LED: u8 = 0x69;
    pub const BUZ: u8 = 0x6A;
    pub const KEYSET: u8 = 0x75;
    pub const CHLNG: u8 = 0x76;
    pub const SCRYPT: u8 = 0x77;
}

/// Reply codes (Annex A.2) the hub understands.
pub mod reply {
    pub const ACK: u8 = 0x40;
    pub const NAK: u8 = 0x41;
    pub const PDID: u8 = 0x45;
    pub const PDCAP: u8 = 0x46;
    pub const LSTATR: u8 = 0x48;
    pub const ISTATR: u8 = 0x49;
    pub const OSTATR: u8 = 0x4A;
    pub const RAW: u8 = 0x50;
    pub const FMT: u8 = 0x51;
    pub const KEYPAD: u8 = 0x53;
    pub const CCRYPT: u8 = 0x76;
    pub const RMAC_I: u8 = 0x78;
    pub const BUSY: u8 = 0x79;
}

/// NAK reasons with a rule of their own (osdp.md 'Sequence numbers').
pub mod nak {
    #[cfg(any(test, feature = "testing"))]
    pub const UNKNOWN_COMMAND: u8 = 3;
    pub const SEQUENCE: u8 = 4;
    pub const SECURE_CHANNEL: u8 = 6;
}

impl Identity {
    pub(super) fn parse(d: &[u8]) -> Option<Identity> {
        if d.len() < 12 {
            return None;
        }
        Some(Identity {
            vendor: u32::from_le_bytes([d[0], d[1], d[2], 0]),
            model: d[3],
            version: d[4],
            serial: u32::from_le_bytes([d[5], d[6], d[7], d[8]]),
            firmware: u32::from_be_bytes([0, d[9], d[10], d[11]]),
        })
    }
}

impl Caps {
    pub(super) fn parse(d: &[u8]) -> Caps {
        let mut c = Caps::default();
        for t in d.chunks_exact(3) {
            match t[0] {
                1 => c.inputs = t[2],
                2 => c.outputs = t[2],
                _ => {}
            }
        }
        c
    }
}

/// A command queued by the hub (not part of the session's own traffic).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// osdp_OUT for one output.
    Out { output: u8, control: u8, timer: u16 },
    /// osdp_LED, the 14-byte record for reader 0, LED 0.
    Led(LedSpec),
    /// osdp_BUZ for reader 0.
    Buzzer {
        tone: u8,
        on: u8,
        off: u8,
        count: u8,
    },
    /// osdp_KEYSET: a new SCBK (install only).
    Keyset(NewKey),
}

/// The SCBK an osdp_KEYSET carries; its `Debug` never shows it, and it
/// is wiped when dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct NewKey(pub Key);

impl Drop for NewKey {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl std::fmt::Debug for NewKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NewKey(redacted)")
    }
}

/// The temporary part of an osdp_LED (the permanent part is left as is).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedSpec {
    pub on: u8,
    pub off: u8,
    pub on_color: u8,
    pub off_color: u8,
    /// Units of 100 ms.
    pub timer: u16,
}

pub mod color {
    pub const BLACK: u8 = 0;
    pub const RED: u8 = 1;
    pub const GREEN: u8 = 2;
}

impl Command {
    pub(super) fn encode(&self) -> (u8, Vec<u8>) {
        match self {
            Command::Out {
                output,
                control,
                timer,
            } => {
                let t = timer.to_le_bytes();
                (cmd::OUT, vec![*output, *control, t[0], t[1]])
            }
            Command::Led(l) => {
                let t = l.timer.to_le_bytes();
                // reader, LED, temporary: set and start the timer (2), on,
                // off, on colour, off colour, timer; permanent: no change (0).
                (
                    cmd::LED,
                    vec![
                        0,
                        0,
                        2,
                        l.on,
                        l.off,
                        l.on_color,
                        l.off_color,
                        t[0],
                        t[1],
                        0,
                        0,
                        0,
                        0,
                        0,
                    ],
                )
            }
            Command::Buzzer {
                tone,
                on,
                off,
                count,
            } => (cmd::BUZ, vec![0, *tone, *on, *off, *count]),
            Command::Keyset(NewKey(k)) => {
                let mut d = vec![0x01, 16];
                d.extend_from_slice(k);
                (cmd::KEYSET, d)
            }
        }
    }

}
