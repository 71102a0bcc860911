//! The Control Panel's state machine for one reader: what to send next,
//! what a reply means, when a reader is offline. No I/O, no clock, no
//! randomness of its own: the bus task passes the time (monotonic ms), the
//! random challenge and every packet, and acts on the [`Event`]s returned.
//!
//! A session is: osdp_CHLNG (sequence 0) -> osdp_CCRYPT (the reader's
//! cryptogram, checked) -> osdp_SCRYPT -> osdp_RMAC_I (checked), then, under
//! the channel, osdp_ID, osdp_CAP, osdp_LSTAT, osdp_ISTAT, then polls and
//! queued commands. Anything that breaks the channel ends the session; the
//! next one starts from sequence 0 after a backoff. Nothing here ever
//! retries with another key or in plain text: the key is fixed at
//! construction ([`Security`]).

use std::collections::VecDeque;
use std::time::Duration;

use super::packet::{self, Packet, scs};
use crate::runtime::backoff::Backoff;
use zeroize::{Zeroize, Zeroizing};
use super::sc::{Channel, Key, SCBK_D, SessionKeys};

pub mod codec;

use codec::*;

/// The contract's timings; tests may not shorten them (they are what the
/// reader sees), but they are in one place.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub reply_timeout_ms: u64,
    pub resends: u8,
    pub offline_after_ms: u64,
    pub probe_every_ms: u64,
    /// A session that ends early is restarted after this, doubling...
    pub backoff_initial_ms: u64,
    /// ...up to this.
    pub backoff_max_ms: u64,
    /// Early session ends are counted over this window...
    pub early_end_window_ms: u64,
    /// ...and this many raise `reader_link_fault`.
    pub early_ends_to_fault: usize,
}

impl Timing {
    /// osdp.md: 200 ms per reply, two resends, offline after 8 s, an
    /// offline reader probed at most every 5 s; sessions that end early
    /// restarted after 1 s doubling to 30 s, three in a minute a fault.
    pub const CONTRACT: Timing = Timing {
        reply_timeout_ms: 200,
        resends: 2,
        offline_after_ms: 8_000,
        probe_every_ms: 5_000,
        backoff_initial_ms: 1_000,
        backoff_max_ms: 30_000,
        early_end_window_ms: 60_000,
        early_ends_to_fault: 3,
    };
}

/// How a reader's link is protected; fixed for its lifetime.
#[derive(Clone)]
pub enum Security {
    /// A Secure Channel with this SCBK (`lockhub run`).
    Secure(Key),
    /// A Secure Channel with SCBK-D in install mode (`lockhub osdp install`).
    Install,
    /// No Secure Channel (`insecure_plaintext = true` and no key).
    Plaintext,
}

impl Drop for Security {
    fn drop(&mut self) {
        if let Security::Secure(k) = self {
            k.zeroize();
        }
    }
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Security::Secure(_) => "Secure(key redacted)",
            Security::Install => "Install",
            Security::Plaintext => "Plaintext",
        })
    }
}

/// osdp_PDID: who the reader says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    pub vendor: u32,
    pub model: u8,
    pub version: u8,
    pub serial: u32,
    pub firmware: u32,
}

/// What osdp_PDCAP says about the features the hub uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Caps {
    /// Function 1: contact status monitoring, number of inputs.
    pub inputs: u8,
    /// Function 2: output control, number of outputs.
    pub outputs: u8,
}

/// Why a session ended early ([`Event::SessionFault`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The reader's cryptogram or R-MAC_I did not verify: another key.
    /// Raises `reader_link_fault` at once.
    Cryptogram,
    /// A reply's MAC did not verify, or its data did not decrypt.
    Mac,
    /// A plaintext reply other than a NAK while the channel was up.
    Plaintext,
    /// The reader refused or does not offer a Secure Channel. Raises
    /// `reader_link_fault` at once.
    Refused,
    /// A handshake reply that makes no sense.
    Handshake,
    /// The reader dropped the channel: a plaintext NAK while it was up, or
    /// NAK(4) or NAK(6) (sequence or Secure Channel error).
    Dropped,
    /// The reader stopped answering inside its Secure Channel (no reply
    /// after the resends): reset, or its replies cut off.
    Reset,
}

impl Fault {
    /// Faults that say the reader holds another key or no Secure Channel:
    /// no count is needed to know the link is wrong (osdp.md).
    fn raises_at_once(self) -> bool {
        matches!(self, Fault::Cryptogram | Fault::Refused)
    }
}

/// How a queued command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ack,
    /// osdp_OSTATR: one byte per output, 1 = on.
    OutputStatus(Vec<u8>),
    Nak(u8),
    /// No reply after the resends, or the session ended first.
    Failed,
}

/// What happened, for the bus task to act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An authenticated reply after none for a while (or the first one).
    Online,
    /// No authenticated reply for `offline_after_ms`.
    Offline,
    /// The Secure Channel is up (or, for a plaintext reader, the session).
    SessionUp {
        secure: bool,
    },
    /// The session ended (the channel is down until a new handshake).
    SessionDown,
    /// A session ended early for this reason, and is restarted after a
    /// backoff; `recent` such ends in the window, this one included.
    SessionFault {
        fault: Fault,
        recent: usize,
    },
    /// Raise `reader_link_fault`: a fault that raises at once, or the
    /// early end that made the count (osdp.md, Supervision).
    LinkFault(Fault),
    Identity(Identity),
    Caps(Caps),
    /// The session's introduction is done: polls and commands from now on.
    Ready,
    /// osdp_LSTATR: tamper and power (`None` when the reader NAKed).
    Local {
        tamper: bool,
        power: bool,
    },
    /// osdp_ISTATR: one entry per input, true = active.
    Inputs(Vec<bool>),
    /// Key presses (osdp_KEYPAD), raw codes.
    Keys(KeyPresses),
    /// A card read (osdp_RAW or osdp_FMT); its data is not kept.
    Card,
    /// The plaintext no-op osdp_OUT before the handshake was ACKed
    /// (`accepted`): the reader would take a plaintext osdp_OUT that opens
    /// the door from anyone on the wire (`link_insecure`). A NAK, another
    /// reply or none passes.
    PlaintextProbe {
        accepted: bool,
    },
    /// A queued command finished.
    Done {
        token: u64,
        outcome: Outcome,
    },
}

/// Key presses as the reader sent them: PIN digits, so their `Debug`
/// shows only how many.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPresses(pub Vec<u8>);

impl Drop for KeyPresses {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl std::fmt::Debug for KeyPresses {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyPresses({} keys)", self.0.len())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Start,
    /// The plaintext no-op osdp_OUT is on the wire.
    Probe,
    /// The probe is answered (or not): osdp_CHLNG next.
    Challenge,
    Chlng,
    Scrypt,
    Id,
    Cap,
    Lstat,
    Istat,
    Ready,
}

#[derive(Debug)]
struct Pending {
    bytes: Vec<u8>,
    seq: u8,
    code: u8,
    /// Sends so far (the first one included).
    sends: u8,
    resend: bool,
    /// The queued command this is, if any.
    token: Option<u64>,
}

/// A handshake in progress. Its session keys wipe themselves; the rest is
/// wiped here.
struct Handshake {
    rnd_a: [u8; 8],
    keys: Option<SessionKeys>,
    cp_cryptogram: [u8; 16],
}

impl Drop for Handshake {
    fn drop(&mut self) {
        self.rnd_a.zeroize();
        self.cp_cryptogram.zeroize();
    }
}

/// Queued commands per reader: feedback and an output per decision, never
/// more than a few at once; past this a command is refused, not queued.
pub const COMMAND_QUEUE: usize = 8;

/// Why [`Reader::send`] refused a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error("the reader's session is not up")]
    NotReady,
    #[error("the reader's command queue is full")]
    Full,
}

/// One reader as the CP sees it.
pub struct Reader {
    addr: u8,
    security: Security,
    timing: Timing,
    step: Step,
    next_seq: u8,
    channel: Option<Channel>,
    handshake: Option<Handshake>,
    pending: Option<Pending>,
    queue: VecDeque<(u64, Command)>,
    next_token: u64,
    /// No new session before this time (backoff, offline probing).
    wait_until: u64,
    backoff: Backoff,
    /// Early session ends in the window (ms), oldest first; bounded by
    /// `early_ends_to_fault`.
    early_ends: VecDeque<u64>,
    /// When the current session reached `Ready`.
    ready_since: Option<u64>,
    /// The last authenticated reply (or the start, or the end of a backoff
    /// the hub chose: silence counts only while the hub is asking).
    last_valid_ms: u64,
    seen: bool,
    offline: bool,
    last_probe_ms: Option<u64>,
    /// The output the plaintext probe names, for a reader whose strike is
    /// on one of its outputs ([`Reader::with_probe`]).
    probe: Option<u8>,
    /// Replies dropped: wrong sequence, nothing pending, undecodable.
    pub stray_replies: u64,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("addr", &self.addr)
            .field("security", &self.security)
            .field("step", &self.step)
            .field("offline", &self.offline)
            .finish_non_exhaustive()
    }
}

impl Reader {
    pub fn new(addr: u8, security: Security, timing: Timing, now: u64) -> Self {
        assert!(addr < packet::BROADCAST, "a reader address is 0..=126");
        Reader {
            addr,
            security,
            timing,
            step: Step::Start,
            next_seq: 0,
            channel: None,
            handshake: None,
            pending: None,
            queue: VecDeque::new(),
            next_token: 0,
            wait_until: now,
            backoff: Backoff::new(
                Duration::from_millis(timing.backoff_initial_ms),
                Duration::from_millis(timing.backoff_max_ms),
            ),
            early_ends: VecDeque::new(),
            ready_since: None,
            last_valid_ms: now,
            seen: false,
            offline: false,
            last_probe_ms: None,
            probe: None,
            stray_replies: 0,
        }
    }

    /// Sends the plaintext no-op osdp_OUT for `output` before each
    /// handshake (osdp.md, Opening the door); only a keyed reader is probed.
    pub fn with_probe(mut self, output: Option<u8>) -> Self {
        self.probe = output;
        self
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn addr(&self) -> u8 {
        self.addr
    }

    /// The session is up and introduced: key presses count, outputs may be
    /// driven.
    pub fn is_ready(&self) -> bool {
        self.step == Step::Ready
    }

    pub fn is_secure(&self) -> bool {
        self.channel.is_some()
    }

    /// A command of this reader timed out (or was BUSY) and goes again
    /// next: the bus gives it the next turn, so an osdp_OUT fails within
    /// about a second whatever the other readers do (osdp.md).
    pub fn resend_due(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| p.resend)
    }

    /// Whether a command is on the wire awaiting its reply.
    pub fn awaiting_reply(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| !p.resend)
    }

    /// Queues a command; only while the session is ready. An osdp_OUT goes
    /// ahead of any queued feedback (behind earlier outputs), and makes room
    /// by dropping the newest feedback if it must: feedback goes after the
    /// osdp_OUT and never delays it (osdp.md 'Opening the door'), and a
    /// committed grant must not become `door.unlock_unconfirmed` because
    /// LED and buzzer commands filled the queue.
    pub fn send(&mut self, command: Command) -> Result<u64, SendError> {
        if !self.is_ready() {
            return Err(SendError::NotReady);
        }
        let is_out = |c: &Command| matches!(c, Command::Out { .. });
        let output = is_out(&command);
        if self.queue.len() >= COMMAND_QUEUE {
            let feedback = self.queue.iter().rposition(|(_, c)| !is_out(c));
            match feedback {
                Some(at) if output => {
                    self.queue.remove(at);
                }
                _ => return Err(SendError::Full),
            }
        }
        self.next_token += 1;
        let at = if output {
            self.queue
                .iter()
                .position(|(_, c)| !is_out(c))
                .unwrap_or(self.queue.len())
        } else {
            self.queue.len()
        };
        self.queue.insert(at, (self.next_token, command));
        Ok(self.next_token)
    }

    /// Offline detection; call on every turn.
    pub fn tick(&mut self, now: u64) -> Vec<Event> {
        let mut ev = Vec::new();
        if !self.offline && now.saturating_sub(self.last_valid_ms) >= self.timing.offline_after_ms {
            self.offline = true;
            ev.push(Event::Offline);
            if self.step != Step::Start || self.pending.is_some() {
                self.end_session(now, 0, &mut ev);
            }
        }
        ev
    }

    /// The bytes to put on the wire now, if any: a resend, or the next
    /// command. `rnd` is a fresh random challenge, used when a session
    /// starts.
    pub fn next(&mut self, now: u64, rnd: [u8; 8]) -> Option<Vec<u8>> {
        if let Some(p) = &mut self.pending {
            if p.resend {
                p.resend = false;
                p.sends += 1;
                return Some(p.bytes.clone());
            }
            return None;
        }
        if now < self.wait_until {
            return None;
        }
        // `data` may be a new key (osdp_KEYSET): wiped once encrypted.
        let (code, scb, data, token): (u8, Vec<u8>, Zeroizing<Vec<u8>>, Option<u64>) = match self
            .step
        {
            Step::Start => {
                if self.offline {
                    if let Some(t) = self.last_probe_ms
                        && now < t + self.timing.probe_every_ms
                    {
                        return None;
                    }
                    self.last_probe_ms = Some(now);
                }
                self.next_seq = 0;
                match (&self.security, self.probe) {
                    (Security::Plaintext, _) => {
                        self.step = Step::Id;
                        (cmd::ID, vec![], vec![0].into(), None)
                    }
                    (Security::Secure(_), Some(output)) => {
                        // osdp.md, Opening the door: a plaintext no-op
                        // osdp_OUT (control code 0x00) for the strike's
                        // output, before the handshake.
                        self.step = Step::Probe;
                        (cmd::OUT, vec![], vec![output, 0x00, 0, 0].into(), None)
                    }
                    _ => self.challenge(rnd),
                }
            }
            Step::Challenge => {
                self.next_seq = 0;
                self.challenge(rnd)
            }
            Step::Probe => return None,
            Step::Scrypt => {
                let hs = self.handshake.as_ref()?;
                (
                    cmd::SCRYPT,
                    vec![3, scs::SCRYPT, self.key_byte()],
                    hs.cp_cryptogram.to_vec().into(),
                    None,
                )
            }
            Step::Chlng => return None,
            Step::Id => (cmd::ID, vec![], vec![0].into(), None),
            Step::Cap => (cmd::CAP, vec![], vec![0].into(), None),
            Step::Lstat => (cmd::LSTAT, vec![], Vec::new().into(), None),
            Step::Istat => (cmd::ISTAT, vec![], Vec::new().into(), None),
            Step::Ready => match self.queue.pop_front() {
                Some((token, c)) => {
                    let (code, data) = c.encode();
                    (code, vec![], data.into(), Some(token))
                }
                None => (cmd::POLL, vec![], Vec::new().into(), None),
            },
        };
        let seq = self.next_seq;
        self.next_seq = if seq == 3 { 1 } else { seq + 1 };
        let bytes = self.encode(seq, &scb, code, &data);
        self.pending = Some(Pending {
            bytes: bytes.clone(),
            seq,
            code,
            sends: 1,
            resend: false,
            token,
        });
        Some(bytes)
    }

    /// osdp_CHLNG with a fresh challenge: the handshake's first command.
    fn challenge(&mut self, rnd: [u8; 8]) -> (u8, Vec<u8>, Zeroizing<Vec<u8>>, Option<u64>) {
        self.handshake = Some(Handshake {
            rnd_a: rnd,
            keys: None,
            cp_cryptogram: [0; 16],
        });
        self.step = Step::Chlng;
        (
            cmd::CHLNG,
            vec![3, scs::CHLNG, self.key_byte()],
            rnd.to_vec().into(),
            None,
        )
    }

    fn key_byte(&self) -> u8 {
        match self.security {
            Security::Install => 0x00,
            _ => 0x01,
        }
    }

    fn key(&self) -> Zeroizing<Key> {
        Zeroizing::new(match &self.security {
            Security::Secure(k) => *k,
            _ => SCBK_D,
        })
    }

    fn encode(&mut self, seq: u8, scb: &[u8], code: u8, data: &[u8]) -> Vec<u8> {
        match &mut self.channel {
            Some(ch) if scb.is_empty() => {
                let (scb, body) = if data.is_empty() {
                    ([2, scs::CMD_MAC], Vec::new())
                } else {
                    ([2, scs::CMD_ENC], ch.encrypt_command(data))
                };
                let mut mac = |p: &[u8]| ch.mac_command(p);
                packet::encode(self.addr, seq, &scb, code, &body, Some(&mut mac))
            }
            _ => packet::encode(self.addr, seq, scb, code, data, None),
        }
    }

    /// No reply within the reply timeout.
    pub fn on_timeout(&mut self, now: u64) -> Vec<Event> {
        let mut ev = Vec::new();
        let Some(p) = &mut self.pending else {
            return ev;
        };
        if self.step == Step::Probe {
            // No reply to the probe passes; it is not sent again.
            self.pending = None;
            self.step = Step::Challenge;
            ev.push(Event::PlaintextProbe { accepted: false });
            return ev;
        }
        if p.sends <= self.timing.resends {
            p.resend = true;
            return ev;
        }
        // Whether the reader acted on it is unknown, and with it the MAC
        // chain: start over. A reader that goes quiet inside its Secure
        // Channel was reset (or its replies are being cut off): an early
        // end, counted (osdp.md, Supervision). Silence outside one is the
        // offline timer's to judge (an unplugged reader is `board_offline`,
        // not a link fault). Either way the command is settled.
        if self.channel.is_some() {
            self.fault(now, Fault::Reset, &mut ev);
            return ev;
        }
        // An offline reader's probe is followed by the probe interval's rest.
        let wait = if self.offline {
            self.timing.probe_every_ms
        } else {
            self.timing.backoff_initial_ms
        };
        self.end_session(now, wait, &mut ev);
        ev
    }

    fn end_session(&mut self, now: u64, wait_ms: u64, ev: &mut Vec<Event>) {
        let was_up = self.step == Step::Ready || self.channel.is_some();
        self.channel = None;
        self.handshake = None;
        self.step = Step::Start;
        self.next_seq = 0;
        self.ready_since = None;
        // Whatever ends a session settles what it had in flight: an
        // osdp_OUT whose reply never verified is unconfirmed now
        // (osdp.md, Supervision).
        if let Some(p) = self.pending.take()
            && let Some(token) = p.token
        {
            ev.push(Event::Done {
                token,
                outcome: Outcome::Failed,
            });
        }
        // A queued output must not fire after a new handshake, seconds
        // after the grant: it fails now (door.unlock_unconfirmed).
        for (token, _) in self.queue.drain(..) {
            ev.push(Event::Done {
                token,
                outcome: Outcome::Failed,
            });
        }
        self.wait_until = now + wait_ms;
        if was_up {
            ev.push(Event::SessionDown);
        }
    }

    /// A session ended early (osdp.md, Supervision): counted, unless it had
    /// been up for the whole window; restarted after the backoff; the end
    /// that makes the count, or a fault that needs none, raises
    /// `reader_link_fault`.
    fn fault(&mut self, now: u64, fault: Fault, ev: &mut Vec<Event>) {
        let window = self.timing.early_end_window_ms;
        let early = self
            .ready_since
            .is_none_or(|t| now.saturating_sub(t) < window);
        if early {
            while self
                .early_ends
                .front()
                .is_some_and(|&t| now.saturating_sub(t) >= window)
                || self.early_ends.len() >= self.timing.early_ends_to_fault
            {
                self.early_ends.pop_front();
            }
            self.early_ends.push_back(now);
        } else {
            self.backoff.reset();
        }
        let recent = self.early_ends.len();
        ev.push(Event::SessionFault { fault, recent });
        if fault.raises_at_once() || (early && recent >= self.timing.early_ends_to_fault) {
            ev.push(Event::LinkFault(fault));
        }
        let wait = u64::try_from(self.backoff.next_step().as_millis()).unwrap_or(u64::MAX);
        self.end_session(now, wait, ev);
        // The hub chose not to ask for this long after an answer: silence
        // meanwhile is not the reader's (a reader that answers with the
        // wrong key is a link fault, not offline). Anyone keeping sessions
        // short this way raises `reader_link_fault` by the count. A reader
        // that stopped answering keeps its 8 s.
        if fault != Fault::Reset {
            self.last_valid_ms = self.last_valid_ms.max(now + wait);
        }
    }

    /// A CRC-valid reply from this reader's address.
    pub fn on_reply(&mut self, pkt: &Packet, now: u64) -> Vec<Event> {
        let mut ev = Vec::new();
        let Some(p) = &self.pending else {
            self.stray_replies += 1;
            return ev;
        };
        if !pkt.is_reply() || pkt.addr() != self.addr {
            self.stray_replies += 1;
            return ev;
        }
        if pkt.code() == reply::BUSY && (pkt.seq() == p.seq || pkt.seq() == 0) {
            // Resend, but a BUSY is no sign of life: it is plain text and
            // carries no MAC, so anything spliced onto the wire could keep
            // a dead or stolen reader from going offline by saying it.
            let p = self.pending.as_mut().expect("pending");
            p.resend = true;
            if p.sends > self.timing.resends {
                return self.on_timeout(now);
            }
            return ev;
        }
        if pkt.seq() != p.seq {
            self.stray_replies += 1;
            return ev;
        }
        let p = self.pending.take().expect("pending");
        // Nothing below counts as a sign of life until it is authenticated
        // (`alive`): a MAC, or the handshake's cryptograms.

        // Authenticate before anything is believed. On a failure the
        // command goes back to `pending`, so ending the session settles it.
        let data: Zeroizing<Vec<u8>> = match (&mut self.channel, pkt.scb_type()) {
            (Some(ch), Some(t)) if t == scs::REPLY_MAC || t == scs::REPLY_ENC => {
                let mac = pkt.mac().expect("SCB 16/18 carries a MAC");
                if !ch.verify_reply(pkt.mac_input(), &mac) {
                    self.pending = Some(p);
                    self.fault(now, Fault::Mac, &mut ev);
                    return ev;
                }
                let data = if t == scs::REPLY_ENC {
                    ch.decrypt_reply(pkt.data())
                } else if pkt.data().is_empty() || pkt.code() == reply::NAK {
                    Some(pkt.data().to_vec().into())
                } else {
                    // Authentic but in the clear: payloads are encrypted
                    // (osdp.md), or a reader's PIN digits cross the wire as
                    // they are. Treated like a plaintext reply.
                    self.pending = Some(p);
                    self.fault(now, Fault::Plaintext, &mut ev);
                    return ev;
                };
                let Some(data) = data else {
                    self.pending = Some(p);
                    self.fault(now, Fault::Mac, &mut ev);
                    return ev;
                };
                self.alive(now, &mut ev);
                data
            }
            (Some(_), None) if pkt.code() == reply::NAK => {
                // The reader lost the channel (or someone on the wire says
                // so): a new session after the backoff, counted.
                if let Some(token) = p.token {
                    ev.push(Event::Done {
                        token,
                        outcome: Outcome::Nak(pkt.data().first().copied().unwrap_or(0)),
                    });
                }
                self.fault(now, Fault::Dropped, &mut ev);
                return ev;
            }
            (Some(_), _) => {
                self.pending = Some(p);
                self.fault(now, Fault::Plaintext, &mut ev);
                return ev;
            }
            (None, _) => match self.step {
                Step::Probe => {
                    // Not a sign of life: plain text, anyone could say it.
                    let accepted = pkt.code() == reply::ACK && pkt.scb_type().is_none();
                    self.step = Step::Challenge;
                    ev.push(Event::PlaintextProbe { accepted });
                    return ev;
                }
                Step::Chlng | Step::Scrypt => {
                    return self.handshake_reply(pkt, now, ev);
                }
                _ if matches!(self.security, Security::Plaintext) && pkt.scb_type().is_none() => {
                    // No Secure Channel by config: a valid reply is all
                    // there is to go by (osdp.md, Supervision).
                    self.alive(now, &mut ev);
                    pkt.data().to_vec().into()
                }
                _ => {
                    self.pending = Some(p);
                    self.fault(now, Fault::Plaintext, &mut ev);
                    return ev;
                }
            },
        };
        self.dispatch(p, pkt.code(), &data, now, &mut ev);
        ev
    }

    /// An authenticated reply: the reader is there (osdp.md, Supervision).
    /// A session that has held for the whole window has proved itself: the
    /// next early end backs off from the start again.
    fn alive(&mut self, now: u64, ev: &mut Vec<Event>) {
        self.last_valid_ms = self.last_valid_ms.max(now);
        if self
            .ready_since
            .is_some_and(|t| now.saturating_sub(t) >= self.timing.early_end_window_ms)
        {
            self.backoff.reset();
        }
        if self.offline || !self.seen {
            self.offline = false;
            self.seen = true;
            self.last_probe_ms = None;
            ev.push(Event::Online);
        }
    }

    fn handshake_reply(&mut self, pkt: &Packet, now: u64, mut ev: Vec<Event>) -> Vec<Event> {
        let key = self.key();
        let Some(hs) = &mut self.handshake else {
            self.fault(now, Fault::Handshake, &mut ev);
            return ev;
        };
        match (self.step, pkt.code(), pkt.scb_type()) {
            (Step::Chlng, reply::CCRYPT, Some(scs::CCRYPT)) if pkt.data().len() >= 32 => {
                let d = pkt.data();
                let rnd_b: [u8; 8] = d[8..16].try_into().expect("8 bytes");
                let keys = SessionKeys::derive(&key, &hs.rnd_a);
                if !keys.pd_cryptogram_ok(&hs.rnd_a, &rnd_b, &d[16..32]) {
                    // The answer to this session's fresh challenge, under
                    // another key: the reader is there and holds the wrong
                    // key. That raises `reader_link_fault` at once, and so
                    // it is not `board_offline` as well (osdp.md). Anyone
                    // faking it raises the same alert: never silence.
                    self.alive(now, &mut ev);
                    self.fault(now, Fault::Cryptogram, &mut ev);
                    return ev;
                }
                hs.cp_cryptogram = keys.cp_cryptogram(&hs.rnd_a, &rnd_b);
                hs.keys = Some(keys);
                self.step = Step::Scrypt;
            }
            (Step::Scrypt, reply::RMAC_I, Some(scs::RMAC_I)) if pkt.data().len() >= 16 => {
                let keys = hs.keys.take().expect("keys after CCRYPT");
                let expect = keys.rmac_i(&hs.cp_cryptogram);
                let got: [u8; 16] = pkt.data()[..16].try_into().expect("16 bytes");
                if super::sc::ct_eq(&expect, &got) {
                    self.channel = Some(Channel::new(keys, got));
                    self.handshake = None;
                    self.step = Step::Id;
                    // R-MAC_I is the reader's MAC over this session's
                    // cryptogram: the first authenticated reply.
                    self.alive(now, &mut ev);
                    ev.push(Event::SessionUp { secure: true });
                } else {
                    self.fault(now, Fault::Cryptogram, &mut ev);
                }
            }
            (_, reply::NAK, None) => self.fault(now, Fault::Refused, &mut ev),
            _ => self.fault(now, Fault::Handshake, &mut ev),
        }
        ev
    }

    fn dispatch(&mut self, p: Pending, code: u8, data: &[u8], now: u64, ev: &mut Vec<Event>) {
        if code == reply::NAK {
            let reason = data.first().copied().unwrap_or(0);
            if let Some(token) = p.token {
                ev.push(Event::Done {
                    token,
                    outcome: Outcome::Nak(reason),
                });
            }
            match (reason, p.code) {
                (nak::SEQUENCE | nak::SECURE_CHANNEL, _) => self.fault(now, Fault::Dropped, ev),
                // Missing feature: state unknown, not a fault.
                (_, cmd::LSTAT | cmd::ISTAT) => self.advance(now, ev),
                (_, cmd::ID | cmd::CAP) => self.fault(now, Fault::Handshake, ev),
                _ => {}
            }
            return;
        }
        match self.step {
            Step::Id => {
                if code == reply::PDID
                    && let Some(id) = Identity::parse(data)
                {
                    ev.push(Event::Identity(id));
                    self.step = Step::Cap;
                } else {
                    self.fault(now, Fault::Handshake, ev);
                }
                return;
            }
            Step::Cap => {
                if code == reply::PDCAP {
                    ev.push(Event::Caps(Caps::parse(data)));
                    self.step = Step::Lstat;
                } else {
                    self.fault(now, Fault::Handshake, ev);
                }
                return;
            }
            Step::Lstat | Step::Istat => {
                self.report(code, data, ev);
                self.advance(now, ev);
                return;
            }
            _ => {}
        }
        match p.token {
            Some(token) => {
                let outcome = match code {
                    reply::ACK => Outcome::Ack,
                    reply::OSTATR => Outcome::OutputStatus(data.to_vec()),
                    // Not a confirmation (osdp.md: ACK, or OSTATR showing the
                    // output on); whatever news it carries still counts.
                    _ => {
                        self.report(code, data, ev);
                        Outcome::Failed
                    }
                };
                ev.push(Event::Done { token, outcome });
            }
            None => self.report(code, data, ev),
        }
    }

    /// Replies that carry the reader's news (to a poll, or solicited).
    fn report(&mut self, code: u8, data: &[u8], ev: &mut Vec<Event>) {
        match code {
            reply::LSTATR if data.len() >= 2 => ev.push(Event::Local {
                tamper: data[0] != 0,
                power: data[1] != 0,
            }),
            reply::ISTATR => ev.push(Event::Inputs(data.iter().map(|&b| b != 0).collect())),
            reply::KEYPAD if data.len() >= 2 => {
                let n = usize::from(data[1]).min(data.len() - 2);
                ev.push(Event::Keys(KeyPresses(data[2..2 + n].to_vec())));
            }
            reply::RAW | reply::FMT => ev.push(Event::Card),
            _ => {}
        }
    }

    fn advance(&mut self, now: u64, ev: &mut Vec<Event>) {
        self.step = match self.step {
            Step::Lstat => Step::Istat,
            Step::Istat => {
                ev.push(Event::Ready);
                self.ready_since = Some(now);
                Step::Ready
            }
            s => s,
        };
        if self.step == Step::Ready && matches!(self.security, Security::Plaintext) {
            ev.push(Event::SessionUp { secure: false });
        }
    }

}

impl Reader {
    /// The port was lost or reopened: the session is over (the reader will
    /// see sequence 0 and a new handshake).
    pub fn restart(&mut self, now: u64) -> Vec<Event> {
        let mut ev = Vec::new();
        self.end_session(now, 0, &mut ev);
        ev
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drivers::osdp::sc::tests::PdSide;

    const KEY: Key = [0x42; 16];
    const T: Timing = Timing::CONTRACT;

    #[test]
    fn key_presses_and_a_new_key_never_show_in_debug_output() {
        let keys = format!("{:?}", Event::Keys(KeyPresses(b"4829".to_vec())));
        assert!(!keys.contains("52") && !keys.contains("4829"), "{keys}");
        assert!(keys.contains("4 keys"), "{keys}");
        let keyset = format!("{:?}", Command::Keyset(NewKey([0xAB; 16])));
        assert!(
            !keyset.contains("171") && !keyset.contains("AB"),
            "{keyset}"
        );
    }

    /// A reader's side, just enough to answer the CP: the handshake, MACs,
    /// encryption, and canned replies.
    struct FakePd {
        addr: u8,
        key: Key,
        rnd_a: [u8; 8],
        pd: Option<PdSide>,
        /// The next reply to a poll (code, data).
        poll_reply: (u8, Vec<u8>),
        /// Answer this command code with a NAK of this reason.
        nak: Option<(u8, u8)>,
        /// Send reply data under a MAC but unencrypted (SCS_16).
        data_in_clear: bool,
        /// Answer osdp_OUT with this instead of an ACK.
        out_reply: Option<(u8, Vec<u8>)>,
        seqs: Vec<u8>,
        key_bytes: Vec<u8>,
    }

    impl FakePd {
        fn new(key: Key) -> Self {
            FakePd {
                addr: 5,
                key,
                rnd_a: [0; 8],
                pd: None,
                poll_reply: (reply::ACK, vec![]),
                nak: None,
                data_in_clear: false,
                out_reply: None,
                seqs: vec![],
                key_bytes: vec![],
            }
        }

        fn answer(&mut self, cmd: &[u8]) -> Packet {
            let c = Packet::parse(&cmd[1..]).expect("the CP sends valid packets");
            assert_eq!(c.addr(), self.addr);
            assert!(!c.is_reply());
            self.seqs.push(c.seq());
            let seq = c.seq();
            let rnd_b = [7u8; 8];
            let plain = |code: u8, scb: &[u8], data: &[u8]| {
                Packet::parse(&packet::encode(self.addr | 0x80, seq, scb, code, data, None)[1..])
                    .unwrap()
            };
            if let Some((code, reason)) = self.nak
                && code == c.code()
                && self.pd.is_none()
            {
                return plain(reply::NAK, &[], &[reason]);
            }
            match c.code() {
                cmd::CHLNG => {
                    self.key_bytes.push(c.scb_data()[0]);
                    self.rnd_a = c.data().try_into().unwrap();
                    self.pd = None;
                    let keys = SessionKeys::derive(&self.key, &self.rnd_a);
                    let mut d = vec![0xCC; 8];
                    d.extend_from_slice(&rnd_b);
                    d.extend_from_slice(&keys.cryptogram(&self.rnd_a, &rnd_b));
                    return plain(reply::CCRYPT, &[3, scs::CCRYPT, 1], &d);
                }
                cmd::SCRYPT => {
                    let keys = SessionKeys::derive(&self.key, &self.rnd_a);
                    let cp_c: [u8; 16] = c.data().try_into().unwrap();
                    self.pd = Some(PdSide::new(&self.key, &self.rnd_a, &cp_c));
                    return plain(reply::RMAC_I, &[3, scs::RMAC_I, 1], &keys.rmac_i(&cp_c));
                }
                _ => {}
            }
            let pd = self
                .pd
                .as_mut()
                .expect("commands after the handshake are secure");
            assert!(
                pd.verify_command(c.mac_input(), &c.mac().unwrap()),
                "the CP's MAC"
            );
            let data = if c.scb_type() == Some(scs::CMD_ENC) {
                pd.decrypt_command(c.data()).unwrap()
            } else {
                c.data().to_vec()
            };
            let (code, rdata) = match (self.nak, c.code()) {
                (Some((n, reason)), code) if n == code => (reply::NAK, vec![reason]),
                (_, cmd::ID) => (
                    reply::PDID,
                    vec![1, 2, 3, 4, 5, 0xDD, 0xCC, 0xBB, 0xAA, 1, 2, 3],
                ),
                (_, cmd::CAP) => (reply::PDCAP, vec![1, 1, 2, 2, 1, 1]),
                (_, cmd::LSTAT) => (reply::LSTATR, vec![0, 0]),
                (_, cmd::ISTAT) => (reply::ISTATR, vec![0, 1]),
                (_, cmd::POLL) => self.poll_reply.clone(),
                (_, cmd::OUT) => {
                    assert_eq!(data.len(), 4);
                    self.out_reply.clone().unwrap_or((reply::ACK, vec![]))
                }
                _ => (reply::ACK, vec![]),
            };
            let (scb, body) = if rdata.is_empty() || self.data_in_clear {
                ([2, scs::REPLY_MAC], rdata)
            } else {
                ([2, scs::REPLY_ENC], pd.encrypt_reply(&rdata))
            };
            let mut mac = |p: &[u8]| pd.mac_reply(p);
            Packet::parse(
                &packet::encode(self.addr | 0x80, seq, &scb, code, &body, Some(&mut mac))[1..],
            )
            .unwrap()
        }
    }

    /// Runs exchanges until `until` holds or `max` exchanges; returns every
    /// event. Time advances 10 ms per exchange.
    fn drive(
        r: &mut Reader,
        pd: &mut FakePd,
        now: &mut u64,
        max: usize,
        until: impl Fn(&Reader) -> bool,
    ) -> Vec<Event> {
        let mut ev = Vec::new();
        for _ in 0..max {
            if until(r) {
                break;
            }
            *now += 10;
            ev.extend(r.tick(*now));
            if let Some(bytes) = r.next(*now, [9; 8]) {
                let reply = pd.answer(&bytes);
                ev.extend(r.on_reply(&reply, *now));
            }
        }
        ev
    }

    /// A reader at address 5 with its Secure Channel up against a fake
    /// with the right key, and the time the handshake ended.
    fn secure_session() -> (Reader, FakePd, u64) {
        let mut r = Reader::new(5, Security::Secure(KEY), T, 0);
        let mut pd = FakePd::new(KEY);
        let mut now = 0;
        drive(&mut r, &mut pd, &mut now, 20, Reader::is_ready);
        assert!(r.is_ready(), "the session opens");
        (r, pd, now)
    }

    /// The door's unlock as the door driver sends it (control 0x05, 5 s).
    fn unlock() -> Command {
        Command::Out {
            output: 0,
            control: 5,
            timer: 50,
        }
    }

    #[test]
    fn a_session_opens_the_channel_then_introduces_the_reader() {
        let mut r = Reader::new(5, Security::Secure(KEY), T, 0);
        let mut pd = FakePd::new(KEY);
        let mut now = 0;
        let ev = drive(&mut r, &mut pd, &mut now, 20, Reader::is_ready);
        assert!(r.is_ready() && r.is_secure());
        assert!(ev.contains(&Event::SessionUp { secure: true }));
        assert!(ev.contains(&Event::Caps(Caps {
            inputs: 2,
            outputs: 1
        })));
        assert!(ev.iter().any(
            |e| matches!(e, Event::Identity(id) if id.serial == 0xAABBCCDD && id.vendor == 0x030201)
        ));
        assert!(ev.contains(&Event::Inputs(vec![false, true])));
        assert_eq!(pd.key_bytes, [1], "the reader's own key, never SCBK-D");
    }

    #[test]
    fn sequence_numbers_go_0_1_2_3_1_2_and_a_resend_reuses_its_number() {
        let mut r = Reader::new(5, Security::Secure(KEY), T, 0);
        let mut pd = FakePd::new(KEY);
        let mut now = 0;
        drive(&mut r, &mut pd, &mut now, 9, |_| false);
        assert_eq!(pd.seqs, [0, 1, 2, 3, 1, 2, 3, 1, 2]);
        let first = r.next(now, [9; 8]).unwrap();
        assert!(r.on_timeout(now + 200).is_empty());
        let again = r.next(now + 200, [9; 8]).unwrap();
        assert_eq!(
            first, again,
            "a resend is the same packet, same sequence number"
        );
    }

    #[test]
    fn a_reader_with_another_key_is_faulted_and_never_tried_with_the_install_key() {
        let mut r = Reader::new(5, Security::Secure(KEY), T, 0);
        let mut pd = FakePd::new([0x43; 16]);
        let mut now = 0;
        let ev = drive(&mut r, &mut pd, &mut now, 500, |_| false);
        assert!(!r.is_ready() && !r.is_secure());
        let faults = ev
            .iter()
            .filter(|e| **e == Event::LinkFault(Fault::Cryptogram))
            .count();
        assert!(
            faults >= 3,
            "it keeps trying with its own key, with backoff ({faults})"
        );
        assert!(faults < 50, "backoff between attempts ({faults})");
        assert!(
            pd.key_bytes.iter().all(|&b| b == 1),
            "never SCBK-D: {:?}",
            pd.key_bytes
        );
        assert!(
            !ev.iter()
                .any(|e| matches!(e, Event::Keys(_) | Event::Identity(_)))
        );
        assert!(!ev.contains(&Event::Offline), "it answers: not offline");
        assert_eq!(r.send(unlock()), Err(SendError::NotReady));
    }

    /// A reply to `bytes` as `pd` answers it, with one bit of its MAC
    /// flipped and its CRC fixed up: what a man in the middle can make.
    fn forge_mac(pd: &mut FakePd, bytes: &[u8]) -> Packet {
        let good = pd.answer(bytes);
        let mut raw = good.mac_input().to_vec();
        let mut mac = good.mac().unwrap();
        mac[0] ^= 1;
        raw.extend_from_slice(&mac);
        let crc = packet::crc16(&raw);
        raw.extend_from_slice(&crc.to_le_bytes());
        Packet::parse(&raw).unwrap()
    }

    #[test]
    fn a_reply_with_a_bad_mac_ends_the_session_counted_and_three_in_a_minute_raise_a_link_fault() {
        let (mut r, mut pd, mut now) = secure_session();
        let mut raised = Vec::new();
        for round in 1..=3 {
            let bytes = r.next(now, [9; 8]).unwrap();
            let ev = r.on_reply(&forge_mac(&mut pd, &bytes), now);
            assert!(
                ev.contains(&Event::SessionFault {
                    fault: Fault::Mac,
                    recent: round
                }),
                "{ev:?}"
            );
            assert!(!ev.contains(&Event::Online), "a bad MAC is no sign of life");
            assert!(!r.is_ready() && !r.is_secure());
            raised.push(ev.contains(&Event::LinkFault(Fault::Mac)));
            // Back up after the backoff, for the next round.
            let up = drive(&mut r, &mut pd, &mut now, 10_000, Reader::is_ready);
            assert!(r.is_ready(), "{up:?}");
        }
        assert_eq!(raised, [false, false, true], "counted, then raised");
    }

    #[test]
    fn an_output_whose_reply_fails_its_mac_is_settled_unconfirmed_at_once() {
        let (mut r, mut pd, now) = secure_session();
        let token = r.send(unlock()).unwrap();
        let bytes = r.next(now, [9; 8]).unwrap();
        assert_eq!(Packet::parse(&bytes[1..]).unwrap().code(), cmd::OUT);
        let ev = r.on_reply(&forge_mac(&mut pd, &bytes), now);
        assert!(
            ev.contains(&Event::Done {
                token,
                outcome: Outcome::Failed
            }),
            "{ev:?}"
        );
        assert!(!r.awaiting_reply() && !r.resend_due());
    }

    #[test]
    fn a_reader_is_alive_only_once_a_mac_or_its_cryptogram_verifies() {
        let mut r = Reader::new(5, Security::Secure(KEY), T, 0);
        let mut pd = FakePd::new(KEY);
        let mut now = 0;
        // 40 s of handshakes that never finish: a genuine osdp_CCRYPT, then
        // whatever a man in the middle answers osdp_SCRYPT with (plaintext
        // NAKs, BUSY, an R-MAC_I with one bit flipped). None is life.
        let mut ev = Vec::new();
        let mut round = 0;
        while now < 40_000 {
            now += 10;
            ev.extend(r.tick(now));
            let Some(bytes) = r.next(now, [9; 8]) else {
                continue;
            };
            let c = Packet::parse(&bytes[1..]).unwrap();
            let plain = |code, scb: &[u8], data: &[u8]| {
                Packet::parse(&packet::encode(5 | 0x80, c.seq(), scb, code, data, None)[1..])
                    .unwrap()
            };
            let reply = if c.code() == cmd::CHLNG {
                pd.answer(&bytes)
            } else {
                round += 1;
                match round % 3 {
                    0 => plain(reply::NAK, &[], &[6]),
                    1 => plain(reply::BUSY, &[], &[]),
                    _ => {
                        let mut rmac = pd.answer(&bytes).data().to_vec();
                        rmac[15] ^= 1;
                        plain(reply::RMAC_I, &[3, scs::RMAC_I, 1], &rmac)
                    }
                }
            };
            ev.extend(r.on_reply(&reply, now));
        }
        assert!(round >= 6, "{round} handshakes");
        assert!(!ev.contains(&Event::Online), "alive without a MAC: {ev:?}");
        assert!(ev.contains(&Event::LinkFault(Fault::Cryptogram)), "{ev:?}");
        assert!(!r.is_ready());

        // The genuine R-MAC_I is the first authenticated reply.
        let mut r = Reader::new(5, Security::Secure(KEY), T, 0);
        let mut now = 10;
        let chlng = r.next(now, [9; 8]).unwrap();
        let ev = r.on_reply(&pd.answer(&chlng), now);
        assert!(!ev.contains(&Event::Online), "{ev:?}");
        now += 10;
        let scrypt = r.next(now, [9; 8]).unwrap();
        let ev = r.on_reply(&pd.answer(&scrypt), now);
        assert!(ev.contains(&Event::Online), "{ev:?}");
    }

    #[test]
    fn sessions_that_end_early_restart_after_1_s_doubling_to_30_s() {
        let (mut r, _, mut now) = secure_session();
        let mut gaps = Vec::new();
        for _ in 0..7 {
            // Every command gets a plaintext NAK: the channel is dropped.
            let bytes = loop {
                if let Some(b) = r.next(now, [9; 8]) {
                    break b;
                }
                now += 10;
            };
            let p = Packet::parse(&bytes[1..]).unwrap();
            if p.code() == cmd::CHLNG {
                // The handshake is not the attacker's target here: let it
                // through with a fresh fake of the right key.
                let mut pd = FakePd::new(KEY);
                let ended = now;
                r.on_reply(&pd.answer(&bytes), now);
                let scrypt = r.next(now, [9; 8]).unwrap();
                r.on_reply(&pd.answer(&scrypt), now);
                let id = r.next(now, [9; 8]).unwrap();
                let seq = Packet::parse(&id[1..]).unwrap().seq();
                let nak = Packet::parse(
                    &packet::encode(5 | 0x80, seq, &[], reply::NAK, &[6], None)[1..],
                )
                .unwrap();
                r.on_reply(&nak, now);
                gaps.push(ended);
                continue;
            }
            let nak =
                Packet::parse(&packet::encode(5 | 0x80, p.seq(), &[], reply::NAK, &[6], None)[1..])
                    .unwrap();
            let ev = r.on_reply(&nak, now);
            assert!(ev.contains(&Event::SessionDown), "{ev:?}");
            gaps.push(now);
        }
        let waits: Vec<u64> = gaps.windows(2).map(|w| (w[1] - w[0]) / 1000).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30]);
    }

    #[test]
    fn key_presses_in_plain_text_while_the_channel_is_up_are_a_fault_not_keys() {
        let (mut r, _, now) = secure_session();
        let bytes = r.next(now, [9; 8]).unwrap();
        let seq = Packet::parse(&bytes[1..]).unwrap().seq();
        let forged = Packet::parse(
            &packet::encode(5 | 0x80, seq, &[], reply::KEYPAD, &[0, 2, 0x31, 0x0D], None)[1..],
        )
        .unwrap();
        let ev = r.on_reply(&forged, now);
        assert!(
            ev.contains(&Event::SessionFault {
                fault: Fault::Plaintext,
                recent: 1
            }),
            "{ev:?}"
        );
        assert!(!ev.iter().any(|e| matches!(e, Event::Keys(_))));
    }

    #[test]
    fn key_presses_under_a_good_mac_but_not_encrypted_are_a_fault_not_keys() {
        let (mut r, mut pd, mut now) = secure_session();
        pd.data_in_clear = true;
        pd.poll_reply = (reply::KEYPAD, vec![0, 2, 0x31, 0x0D]);
        let ev = drive(&mut r, &mut pd, &mut now, 3, |_| false);
        assert!(
            ev.contains(&Event::SessionFault {
                fault: Fault::Plaintext,
                recent: 1
            }),
            "{ev:?}"
        );
        assert!(!ev.iter().any(|e| matches!(e, Event::Keys(_))));
        assert!(!r.is_secure());
    }

    #[test]
    fn an_output_answered_by_anything_but_ack_or_its_status_is_not_confirmed_and_the_news_is_kept()
    {
        let (mut r, mut pd, mut now) = secure_session();
        pd.out_reply = Some((reply::KEYPAD, vec![0, 1, 0x31]));
        let token = r.send(unlock()).unwrap();
        let ev = drive(&mut r, &mut pd, &mut now, 5, |_| false);
        assert!(
            ev.contains(&Event::Done {
                token,
                outcome: Outcome::Failed
            }),
            "{ev:?}"
        );
        assert!(ev.contains(&Event::Keys(KeyPresses(vec![0x31]))), "{ev:?}");
    }

    #[test]
    fn an_output_goes_ahead_of_queued_feedback_and_a_full_queue_of_feedback_makes_room_for_it() {
        let (mut r, _, now) = secure_session();
        let beep = || Command::Buzzer {
            tone: 2,
            on: 1,
            off: 1,
            count: 2,
        };
        for _ in 0..COMMAND_QUEUE {
            r.send(beep()).unwrap();
        }
        assert_eq!(
            r.send(beep()),
            Err(SendError::Full),
            "feedback waits its turn"
        );
        r.send(unlock()).unwrap();
        let bytes = r.next(now, [9; 8]).unwrap();
        assert_eq!(Packet::parse(&bytes[1..]).unwrap().code(), cmd::OUT);
    }

    #[test]
    fn a_plaintext_nak_restarts_the_session_after_a_backoff_counted_not_raised() {
        let (mut r, _, now) = secure_session();
        let bytes = r.next(now, [9; 8]).unwrap();
        let seq = Packet::parse(&bytes[1..]).unwrap().seq();
        let nak = Packet::parse(&packet::encode(5 | 0x80, seq, &[], reply::NAK, &[6], None)[1..])
            .unwrap();
        let ev = r.on_reply(&nak, now);
        assert!(ev.contains(&Event::SessionDown));
        assert!(ev.contains(&Event::SessionFault {
            fault: Fault::Dropped,
            recent: 1
        }));
        assert!(!ev.iter().any(|e| matches!(e, Event::LinkFault(_))));
        assert_eq!(r.next(now + 990, [9; 8]), None, "the backoff first");
        // Then a new handshake from sequence 0.
        let next = r.next(now + 1_000, [9; 8]).unwrap();
        let p = Packet::parse(&next[1..]).unwrap();
        assert_eq!((p.code(), p.seq()), (cmd::CHLNG, 0));
    }

    #[test]
    fn a_nak_to_local_status_means_unknown_and_the_session_goes_on() {
        let mut r = Reader::new(5, Security::Secure(KEY), T, 0);
        let mut pd = FakePd::new(KEY);
        pd.nak = Some((cmd::LSTAT, nak::UNKNOWN_COMMAND));
        let mut now = 0;
        let ev = drive(&mut r, &mut pd, &mut now, 20, Reader::is_ready);
        assert!(r.is_ready());
        assert!(!ev.iter().any(|e| matches!(e, Event::Local { .. })));
    }

    #[test]
    fn an_output_is_acknowledged_or_fails_after_two_resends() {
        let (mut r, mut pd, mut now) = secure_session();
        let token = r.send(unlock()).unwrap();
        let ev = drive(&mut r, &mut pd, &mut now, 1, |_| false);
        assert!(
            ev.contains(&Event::Done {
                token,
                outcome: Outcome::Ack
            }),
            "{ev:?}"
        );

        let token = r
            .send(Command::Out {
                output: 1,
                control: 5,
                timer: 656,
            })
            .unwrap();
        let first = r.next(now, [9; 8]).unwrap();
        let mut sends = 1;
        let mut ev = Vec::new();
        for k in 1..=3 {
            ev.extend(r.on_timeout(now + 200 * k));
            // The bus gives a resend the next turn (`resend_due`).
            assert_eq!(r.resend_due(), k < 3, "after timeout {k}");
            if let Some(b) = r.next(now + 200 * k, [9; 8]) {
                assert!(!r.resend_due());
                assert_eq!(b, first);
                sends += 1;
            }
        }
        assert_eq!(sends, 3, "the first send and two resends");
        assert!(ev.contains(&Event::Done {
            token,
            outcome: Outcome::Failed
        }));
        assert!(!r.is_ready(), "the session starts over");
    }

    #[test]
    fn queued_outputs_fail_when_the_session_ends_rather_than_fire_later() {
        let (mut r, _, now) = secure_session();
        let token = r.send(unlock()).unwrap();
        let ev = r.restart(now);
        assert!(ev.contains(&Event::Done {
            token,
            outcome: Outcome::Failed
        }));
    }

    #[test]
    fn a_silent_reader_goes_offline_after_8_s_and_is_probed_at_most_every_5_s() {
        let (mut r, mut pd, mut now) = secure_session();
        let last_reply = now;
        let mut sent_at = Vec::new();
        let mut offline_at = None;
        while now < last_reply + 30_000 {
            now += 10;
            for e in r.tick(now) {
                if e == Event::Offline {
                    offline_at = Some(now);
                }
            }
            if r.next(now, [9; 8]).is_some() {
                sent_at.push(now);
            }
            if r.awaiting_reply() {
                now += 200;
                r.on_timeout(now);
            }
        }
        let off = offline_at.expect("offline");
        assert_eq!(off - last_reply, 8_000);
        let probes: Vec<u64> = sent_at.into_iter().filter(|&t| t > off).collect();
        assert!(probes.len() >= 4, "{probes:?}");
        // 22 s offline: at most one probe (three sends) per 5 s.
        assert!(probes.len() <= 3 * (22_000 / 5_000 + 1), "{probes:?}");
        // Each probe is a CHLNG and its two resends, then at least 5 s of rest.
        let starts: Vec<u64> = probes
            .windows(2)
            .filter(|w| w[1] - w[0] > 1_000)
            .map(|w| w[1] - w[0])
            .collect();
        assert!(
            starts.iter().all(|&gap| gap >= 5_000),
            "probes too often: {starts:?}"
        );
        // It comes back on the first authenticated reply: osdp_RMAC_I, the
        // second reply of the probe's handshake.
        let mut online_at = Vec::new();
        for reply in 1..=2 {
            let bytes = loop {
                now += 10;
                if let Some(b) = r.next(now, [9; 8]) {
                    break b;
                }
            };
            if r.on_reply(&pd.answer(&bytes), now).contains(&Event::Online) {
                online_at.push(reply);
            }
        }
        assert_eq!(online_at, [2]);
    }

    #[test]
    fn a_device_that_only_ever_answers_busy_does_not_keep_the_reader_online() {
        let (mut r, _, mut now) = secure_session();
        let last_reply = now;
        let mut ev = Vec::new();
        while now < last_reply + 20_000 {
            now += 10;
            ev.extend(r.tick(now));
            if let Some(bytes) = r.next(now, [9; 8]) {
                let seq = Packet::parse(&bytes[1..]).unwrap().seq();
                let raw = packet::encode(5 | 0x80, seq, &[], reply::BUSY, &[], None);
                ev.extend(r.on_reply(&Packet::parse(&raw[1..]).unwrap(), now));
            }
        }
        let offline = ev.iter().position(|e| *e == Event::Offline);
        assert!(offline.is_some(), "{ev:?}");
        assert!(
            !ev[offline.unwrap()..].contains(&Event::Online),
            "BUSY is no sign of life: {ev:?}"
        );
        assert!(!r.is_ready());
    }

    /// Sends the next command and lets it time out with its resends.
    fn silence(r: &mut Reader, now: &mut u64) -> Vec<Event> {
        let mut ev = Vec::new();
        let first = loop {
            *now += 10;
            if let Some(b) = r.next(*now, [9; 8]) {
                break b;
            }
        };
        drop(first);
        for _ in 0..3 {
            *now += 200;
            ev.extend(r.on_timeout(*now));
            if r.resend_due() {
                r.next(*now, [9; 8]);
            }
        }
        ev
    }

    #[test]
    fn a_reader_that_goes_quiet_inside_its_channel_is_counted_but_silence_before_one_is_not() {
        let (mut r, mut pd, mut now) = secure_session();
        let mut raised = Vec::new();
        for round in 1..=3 {
            let ev = silence(&mut r, &mut now);
            assert!(
                ev.contains(&Event::SessionFault {
                    fault: Fault::Reset,
                    recent: round
                }),
                "{ev:?}"
            );
            raised.push(ev.contains(&Event::LinkFault(Fault::Reset)));
            drive(&mut r, &mut pd, &mut now, 10_000, Reader::is_ready);
            assert!(r.is_ready());
        }
        assert_eq!(raised, [false, false, true]);

        // Unplugged before any Secure Channel: offline's to judge, not a
        // link fault.
        let mut r = Reader::new(5, Security::Secure(KEY), T, 0);
        let mut now = 0;
        let mut ev = Vec::new();
        for _ in 0..10 {
            ev.extend(silence(&mut r, &mut now));
        }
        assert!(
            !ev.iter()
                .any(|e| matches!(e, Event::SessionFault { .. } | Event::LinkFault(_))),
            "{ev:?}"
        );
    }

    #[test]
    fn a_strike_output_is_probed_in_plain_text_before_each_handshake_and_an_ack_is_reported() {
        let mut r = Reader::new(5, Security::Secure(KEY), T, 0).with_probe(Some(1));
        let mut pd = FakePd::new(KEY);
        let mut now = 10;
        let probe = r.next(now, [9; 8]).unwrap();
        let p = Packet::parse(&probe[1..]).unwrap();
        assert_eq!(
            (p.code(), p.seq(), p.scb_type(), p.data()),
            (cmd::OUT, 0, None, &[1, 0x00, 0, 0][..]),
            "a no-op osdp_OUT (control code 0x00) for the strike's output"
        );
        let ack = Packet::parse(&packet::encode(5 | 0x80, 0, &[], reply::ACK, &[], None)[1..])
            .unwrap();
        let ev = r.on_reply(&ack, now);
        assert_eq!(ev, [Event::PlaintextProbe { accepted: true }], "and no sign of life");
        // The handshake follows, from sequence 0, and the session opens.
        let chlng = r.next(now, [9; 8]).unwrap();
        let c = Packet::parse(&chlng[1..]).unwrap();
        assert_eq!((c.code(), c.seq()), (cmd::CHLNG, 0));
        r.on_reply(&pd.answer(&chlng), now);
        drive(&mut r, &mut pd, &mut now, 20, Reader::is_ready);
        assert!(r.is_ready() && r.is_secure());

        // The next session probes again; silence passes, without resends.
        r.restart(now);
        let probe = r.next(now, [9; 8]).unwrap();
        assert_eq!(Packet::parse(&probe[1..]).unwrap().code(), cmd::OUT);
        let ev = r.on_timeout(now + 200);
        assert_eq!(ev, [Event::PlaintextProbe { accepted: false }]);
        let next = r.next(now + 200, [9; 8]).unwrap();
        assert_eq!(Packet::parse(&next[1..]).unwrap().code(), cmd::CHLNG);
    }

    #[test]
    fn a_plaintext_reader_is_introduced_without_a_handshake() {
        let mut r = Reader::new(5, Security::Plaintext, T, 0);
        let now = 10;
        let bytes = r.next(now, [9; 8]).unwrap();
        let p = Packet::parse(&bytes[1..]).unwrap();
        assert_eq!((p.code(), p.scb_type()), (cmd::ID, None));
    }
}
