//! The board: what the lock-board firmware does, as a clock-free state
//! machine that a real HAL and the hub's `sim-board` drive the same way.
//!
//! Inputs are method calls ([`Board::on_frame_bytes`], [`Board::on_key`],
//! [`Board::on_door_sensor`], [`Board::on_tamper`]); time advances with
//! [`Board::poll`], which also yields the frames to write to the UART.
//! Outputs are *levels* the HAL reads every loop ([`Board::relay_open`],
//! [`Board::deny_feedback`], [`Board::link_up`]) rather than edge events:
//! a HAL that misses an iteration still ends up with the right relay state,
//! and "relay locked at power-up and when the link is lost" holds by
//! construction, because `relay_open` is false unless the link is alive.
//!
//! A typical main loop:
//! ```
//! use firmware_bridge::{Board, BoardConfig};
//! let mut board = Board::new(BoardConfig::new(1, 2), 0);
//! let now = 10;
//! // board.on_frame_bytes(&uart_rx_bytes, now);
//! // board.on_key(door, key, now); ...
//! for frame in board.poll(now) {
//!     // uart.write_all(&frame);
//!     let _ = frame;
//! }
//! let _relay0 = board.relay_open(0, now);
//! ```

use heapless::{Deque, Vec};

use crate::frame::{
    DecoderStats, FrameDecoder, PayloadDecoder, SealedFrame, decode_payload, to_frame,
};
use crate::link::{BoardLink, LinkConfig, LinkError, LinkEvent};
use crate::msg::{DenyReason, Downlink, PIN_MAX_DIGITS, Pin, Uplink};
use crate::pair::{BoardPairPhase, BoardPairing};
use crate::rng::RandomSource;
use crate::seal::{DropStats, LinkKey, SealError};
use crate::sealed::{BoardRx, BoardSeal};

/// Doors a board can have (`serial.md`: door index 0..=15).
pub const MAX_DOORS: usize = 16;

/// Keypad buffer per door: one more than the longest valid PIN, so an
/// over-long entry is still sent (as 13 digits) and the hub denies it as
/// `bad_format` and counts it toward the lockout, instead of the board
/// silently truncating it into something that might be valid.
pub const ENTRY_MAX: usize = PIN_MAX_DIGITS + 1;

/// Board identity and timings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BoardConfig {
    /// Sent in `Hello`.
    pub board_id: u8,
    /// Firmware version sent in `Hello`.
    pub fw_major: u8,
    /// Firmware version sent in `Hello`.
    pub fw_minor: u8,
    /// Doors wired to this board (clamped to [`MAX_DOORS`]); inputs and
    /// commands for other doors are ignored (commands are still acked).
    pub door_count: u8,
    /// Send `Heartbeat` this often. The contract sets no period.
    pub heartbeat_every_ms: u64,
    /// How long the deny indication stays on after a `Deny`.
    pub deny_feedback_ms: u64,
    /// A half-typed entry is cleared after this long without a key, so the
    /// next person does not inherit digits. The contract sets none.
    pub entry_timeout_ms: u64,
    /// Link timings (the contract's, normally).
    pub link: LinkConfig,
}

impl BoardConfig {
    /// Defaults: firmware 1.0, heartbeat every 10 s, deny shown 2 s, entry
    /// cleared after 15 s idle, contract link timings.
    pub const fn new(board_id: u8, door_count: u8) -> Self {
        Self {
            board_id,
            fw_major: 1,
            fw_minor: 0,
            door_count,
            heartbeat_every_ms: 10_000,
            deny_feedback_ms: 2_000,
            entry_timeout_ms: 15_000,
            link: LinkConfig::board(),
        }
    }
}

/// What a key press did; lets a simulator or a buzzer give feedback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAction {
    /// Unknown door, or a key that means nothing ('A'..'D' etc.), or '#'
    /// on an empty entry.
    Ignored,
    /// A digit was added to the entry (or dropped past [`ENTRY_MAX`]; the
    /// entry is then sent over-long so the hub denies it).
    Digit,
    /// '*' cleared the entry.
    Cleared,
    /// '#' sent the entry as `Keypad` with this seq.
    Submitted(u16),
    /// '#' could not send (pending table full); the entry is discarded.
    NotSent(LinkError),
    /// Pairing mode: '#' at door 0 checked the entry as the pairing code;
    /// [`Board::pairing_phase`] says whether it matched.
    CodeChecked,
}

/// Counters a firmware can expose for diagnostics (saturating).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BoardStats {
    /// Sequenced uplinks never acked after all resends.
    pub uplinks_failed: u32,
    /// Uplinks the link refused to queue (pending table or outbox full).
    pub uplinks_not_sent: u32,
    /// Commands for a door this board does not have.
    pub unknown_door_commands: u32,
    /// Frames that could not be encoded (never expected).
    pub encode_errors: u32,
}

#[derive(Clone, Default)]
struct Door {
    entry: Vec<u8, ENTRY_MAX>,
    last_key_ms: u64,
    relay_until: Option<u64>,
    deny: Option<(DenyReason, u64)>,
    /// The contact's level as the HAL last read it.
    sensor_level: Option<bool>,
    /// The level the hub was last told (since its last `Hello`).
    sensor_reported: Option<bool>,
}

impl Door {
    fn clear_entry(&mut self) {
        // Overwrite the digits, not only the length.
        for b in self.entry.iter_mut() {
            *b = 0;
        }
        self.entry.clear();
    }
}

/// The random source of a board on the plain link, which never needs one.
/// It cannot be built outside this crate, so no sealed board can be given
/// it by mistake.
pub struct Unseeded(());

impl RandomSource for Unseeded {
    fn fill_bytes(&mut self, out: &mut [u8]) {
        // Never called: only the sealed link and pairing draw random bytes,
        // and only `Board::new_sealed` / `Board::new_pairing` start them,
        // with the caller's source.
        out.fill(0);
    }
}

/// Frames of the handshake (and pairing) waiting to be written.
const HANDSHAKE_OUT_MAX: usize = 4;

/// How the board talks to the hub (`serial.md`, "Sealed link").
enum Mode {
    /// No link key: the plain messages only.
    Plain(FrameDecoder<Downlink>),
    /// A link key: every message sealed, in sessions the hub starts.
    Sealed {
        decoder: PayloadDecoder,
        seal: BoardSeal,
    },
    /// Pairing mode: the pairing messages and the code on door 0's keypad,
    /// nothing else.
    Pairing {
        decoder: PayloadDecoder,
        pairing: BoardPairing,
    },
}

/// The board state machine. See the module docs.
///
/// `R` is the random source of a sealed or pairing board (see
/// [`crate::rng::Rng`]); a plain board has none ([`Unseeded`]).
pub struct Board<R = Unseeded> {
    cfg: BoardConfig,
    link: BoardLink,
    mode: Mode,
    rng: R,
    /// Plain handshake answers, a sealed `RekeyReply`, pairing replies and
    /// the plain `Hello` that asks for a session: written before the
    /// link's messages.
    handshake_out: Deque<SealedFrame, HANDSHAKE_OUT_MAX>,
    /// A link key the firmware must write to flash (pairing, rekey).
    new_key: Option<LinkKey>,
    /// Sealed: when to send the next plain `Hello` while no verified frame
    /// arrives.
    next_plain_hello_ms: u64,
    doors: [Door; MAX_DOORS],
    boot_ms: u64,
    next_heartbeat_ms: u64,
    stats: BoardStats,
    /// A tamper the hub has not acked yet: it is sent again after its sends
    /// all failed, or after the hub's `Hello` dropped it, until it is.
    tamper_unacked: bool,
    /// That tamper waits to be (re)sent.
    tamper_to_send: bool,
}

impl Board<Unseeded> {
    /// Power-up at `now_ms` on the plain link (a board without a link
    /// key): all relays locked, `Hello` queued.
    pub fn new(cfg: BoardConfig, now_ms: u64) -> Self {
        let mut board =
            Self::with_mode(cfg, Mode::Plain(FrameDecoder::new()), Unseeded(()), now_ms);
        board.send_hello(now_ms);
        board
    }
}

impl<R: RandomSource> Board<R> {
    /// [`Board::new`] with a random source it never uses: a plain board of
    /// the same type as sealed ones, for a simulator that runs either.
    pub fn new_plain_with(cfg: BoardConfig, rng: R, now_ms: u64) -> Self {
        let mut board = Self::with_mode(cfg, Mode::Plain(FrameDecoder::new()), rng, now_ms);
        board.send_hello(now_ms);
        board
    }

    /// Power-up at `now_ms` holding link key `key`: all relays locked, a
    /// plain `Hello` (after a lone 0x00) asks the hub for a session, and
    /// nothing else goes out until one verifies. `rng` is the board's
    /// random source, seeded with a boot counter raised for this boot.
    pub fn new_sealed(cfg: BoardConfig, key: LinkKey, rng: R, now_ms: u64) -> Self {
        let seal = BoardSeal::new(cfg.board_id, key);
        let mode = Mode::Sealed {
            decoder: PayloadDecoder::new(),
            seal,
        };
        Self::with_mode(cfg, mode, rng, now_ms)
    }

    /// Power-up in pairing mode (how a board enters it is the firmware's
    /// own, e.g. a button held at power-up): it answers the pairing
    /// messages only, and takes the code typed at door 0 with '#'. On a
    /// match the new key is handed out by [`Board::take_new_key`] and the
    /// board goes on as a sealed board under it.
    pub fn new_pairing(cfg: BoardConfig, rng: R, now_ms: u64) -> Self {
        let mode = Mode::Pairing {
            decoder: PayloadDecoder::new(),
            pairing: BoardPairing::new(),
        };
        Self::with_mode(cfg, mode, rng, now_ms)
    }
}

impl<R: RandomSource> Board<R> {
    fn with_mode(cfg: BoardConfig, mode: Mode, rng: R, now_ms: u64) -> Self {
        Self {
            cfg: BoardConfig {
                door_count: cfg.door_count.min(MAX_DOORS as u8),
                ..cfg
            },
            link: BoardLink::new(cfg.link, now_ms),
            mode,
            rng,
            handshake_out: Deque::new(),
            new_key: None,
            next_plain_hello_ms: now_ms,
            doors: Default::default(),
            boot_ms: now_ms,
            next_heartbeat_ms: now_ms.saturating_add(cfg.heartbeat_every_ms),
            stats: BoardStats::default(),
            tamper_unacked: false,
            tamper_to_send: false,
        }
    }

    /// Bytes read from the UART, in order, any chunking.
    pub fn on_frame_bytes(&mut self, bytes: &[u8], now_ms: u64) {
        self.on_frame_bytes_tapped(bytes, now_ms, &mut |_| true);
    }

    /// [`Board::on_frame_bytes`], showing `tap` every message that reached
    /// the board (plain ones as decoded, sealed ones once they verified)
    /// before the board acts on it; `tap` returning false loses it, as if
    /// the line had. For simulators and tests, which cannot read a sealed
    /// frame on the wire.
    pub fn on_frame_bytes_tapped(
        &mut self,
        bytes: &[u8],
        now_ms: u64,
        tap: &mut impl FnMut(&Downlink) -> bool,
    ) {
        for &b in bytes {
            let got = match &mut self.mode {
                Mode::Plain(decoder) => match decoder.push(b) {
                    Some(Ok(msg)) if tap(&msg) => Rx::Plain(msg),
                    _ => continue,
                },
                Mode::Sealed { decoder, seal } => match decoder.push(b) {
                    None => continue,
                    Some(Err(e)) => {
                        seal.count_frame_error(e);
                        continue;
                    }
                    Some(Ok(payload)) => {
                        // Of the plain messages, only the handshake
                        // reaches a sealed board (the rest are dropped).
                        if payload.first() != Some(&crate::seal::SEAL_MARK)
                            && let Ok(
                                msg @ (Downlink::SealHello { .. } | Downlink::SealConfirm { .. }),
                            ) = decode_payload::<Downlink>(payload)
                            && !tap(&msg)
                        {
                            continue;
                        }
                        match seal.on_payload(payload, &mut self.rng) {
                            BoardRx::Message(msg) if !tap(&msg) => continue,
                            rx => Rx::Sealed(rx),
                        }
                    }
                },
                Mode::Pairing { decoder, pairing } => match decoder.push(b) {
                    Some(Ok(payload)) => match decode_payload::<Downlink>(payload) {
                        Ok(msg) if tap(&msg) => match pairing.on_msg(&msg, &mut self.rng) {
                            Some(reply) => Rx::Reply(reply),
                            None => continue,
                        },
                        _ => continue,
                    },
                    _ => continue,
                },
            };
            match got {
                Rx::Plain(msg) | Rx::Sealed(BoardRx::Message(msg)) => {
                    if let Some(msg) = self.link.on_rx(msg, now_ms) {
                        self.act(msg, now_ms);
                    }
                }
                Rx::Sealed(BoardRx::Send(frame)) => self.push_handshake(frame),
                Rx::Sealed(BoardRx::SessionStarted { new_key }) => {
                    if new_key.is_some() {
                        self.new_key = new_key;
                    }
                    self.on_new_session(now_ms);
                }
                Rx::Sealed(BoardRx::Dropped(_)) => {}
                Rx::Reply(reply) => self.push_plain(&reply),
            }
        }
    }

    /// A new sealed session verified (`serial.md`, "Session", step 4):
    /// only now does the board forget the hub's seqs and drop its unacked
    /// messages, then report `Hello`, every door and an active tamper,
    /// sealed.
    fn on_new_session(&mut self, now_ms: u64) {
        self.link.forget_peer_seqs();
        self.next_plain_hello_ms = now_ms.saturating_add(self.cfg.link.down_after_ms);
        self.report_all(now_ms);
    }

    /// A link key the board must now write to flash (after pairing, or
    /// after a rekey's first session under the new key), once.
    pub fn take_new_key(&mut self) -> Option<LinkKey> {
        self.new_key.take()
    }

    /// True on a sealed board while a confirmed session holds.
    pub fn has_session(&self) -> bool {
        matches!(&self.mode, Mode::Sealed { seal, .. } if seal.has_session())
    }

    /// `msg` framed as this board would write it now, outside its link (no
    /// seq stamped, nothing kept for resends): plain on a plain board,
    /// sealed in the current session on a sealed one (`None` without a
    /// session, and in pairing mode). For simulators and tests that put
    /// hand-made frames on the wire: a real board has no use for it.
    pub fn frame_outside_link(&mut self, msg: &Uplink) -> Option<SealedFrame> {
        match &mut self.mode {
            Mode::Plain(_) => plain_frame(msg),
            Mode::Sealed { seal, .. } => seal.seal(msg).ok(),
            Mode::Pairing { .. } => None,
        }
    }

    /// The sealed link's drops by cause (a sealed board only).
    pub fn seal_drops(&self) -> Option<DropStats> {
        match &self.mode {
            Mode::Sealed { seal, .. } => Some(seal.drops()),
            _ => None,
        }
    }

    /// Where pairing stands (a board in pairing mode only; `None` once a
    /// matching code made it a sealed board).
    pub fn pairing_phase(&self) -> Option<BoardPairPhase> {
        match &self.mode {
            Mode::Pairing { pairing, .. } => Some(pairing.phase()),
            _ => None,
        }
    }

    fn push_handshake(&mut self, frame: SealedFrame) {
        if self.handshake_out.push_back(frame).is_err() {
            self.stats.uplinks_not_sent = self.stats.uplinks_not_sent.saturating_add(1);
        }
    }

    /// Queue a plain message (a pairing reply, the `Hello` that asks for a
    /// session) ahead of the link's; a `Hello` after a lone 0x00.
    fn push_plain(&mut self, msg: &Uplink) {
        match plain_frame(msg) {
            Some(f) => self.push_handshake(f),
            None => self.stats.encode_errors = self.stats.encode_errors.saturating_add(1),
        }
    }

    /// Pairing mode: door 0's keypad takes the code.
    fn on_pairing_key(&mut self, door: u8, key: char) -> KeyAction {
        let Mode::Pairing { pairing, .. } = &mut self.mode else {
            return KeyAction::Ignored;
        };
        let Some(d) = self.doors.get_mut(0).filter(|_| door == 0) else {
            return KeyAction::Ignored;
        };
        match key {
            '0'..='9' => {
                let _ = d.entry.push(key as u8);
                KeyAction::Digit
            }
            '*' => {
                d.clear_entry();
                KeyAction::Cleared
            }
            '#' => {
                let done = pairing.enter_code(&d.entry);
                d.clear_entry();
                let Some((reply, key)) = done else {
                    return KeyAction::Ignored;
                };
                // Store first, then say so: the firmware writes the key
                // from `take_new_key` before it writes this frame.
                if let Some(lk) = key {
                    self.new_key = Some(lk.clone());
                    self.mode = Mode::Sealed {
                        decoder: PayloadDecoder::new(),
                        seal: BoardSeal::new(self.cfg.board_id, lk),
                    };
                }
                self.push_plain(&reply);
                KeyAction::CodeChecked
            }
            _ => KeyAction::Ignored,
        }
    }

    /// A key at `door`'s keypad: '0'..='9' add a digit, '*' clears, '#'
    /// submits. Other keys are ignored.
    pub fn on_key(&mut self, door: u8, key: char, now_ms: u64) -> KeyAction {
        if matches!(self.mode, Mode::Pairing { .. }) {
            return self.on_pairing_key(door, key);
        }
        let Some(d) = self.door_mut(door) else {
            return KeyAction::Ignored;
        };
        match key {
            '0'..='9' => {
                // Cannot fail: `key` is an ASCII digit.
                let _ = d.entry.push(key as u8);
                d.last_key_ms = now_ms;
                KeyAction::Digit
            }
            '*' => {
                d.clear_entry();
                KeyAction::Cleared
            }
            '#' if d.entry.is_empty() => KeyAction::Ignored,
            '#' => {
                let pin = Pin::from_wire_bytes(&d.entry).unwrap_or_default();
                d.clear_entry();
                let msg = Uplink::Keypad { seq: 0, door, pin };
                match self.send(msg, now_ms) {
                    Ok(Some(seq)) => KeyAction::Submitted(seq),
                    Ok(None) => KeyAction::Ignored,
                    Err(e) => KeyAction::NotSent(e),
                }
            }
            _ => KeyAction::Ignored,
        }
    }

    /// Door contact level. Sends `DoorSensor` only when the level differs
    /// from what the hub was last told (the first call always sends, and
    /// so does the first after the hub's `Hello`), so a HAL may call it
    /// every loop. A send the link refuses is retried by [`Board::poll`].
    pub fn on_door_sensor(&mut self, door: u8, open: bool, now_ms: u64) {
        let Some(d) = self.door_mut(door) else {
            return;
        };
        d.sensor_level = Some(open);
        self.report_sensor(door, now_ms);
    }

    /// Tells the hub `door`'s level if it has not heard it yet.
    fn report_sensor(&mut self, door: u8, now_ms: u64) {
        let Some(d) = self.door(door) else {
            return;
        };
        let Some(open) = d.sensor_level.filter(|l| d.sensor_reported != Some(*l)) else {
            return;
        };
        let msg = Uplink::DoorSensor { seq: 0, door, open };
        // Remember only what was reported, so a refused send is retried.
        if self.send(msg, now_ms).is_ok()
            && let Some(d) = self.door_mut(door)
        {
            d.sensor_reported = Some(open);
        }
    }

    /// The tamper switch fired (call on the edge, not every loop). The
    /// board reports it until the hub acks it: an error means it is not on
    /// the wire yet and [`Board::poll`] sends it; do not call again for it.
    pub fn on_tamper(&mut self, now_ms: u64) -> Result<u16, LinkError> {
        self.tamper_unacked = true;
        self.tamper_to_send = true;
        self.report_tamper(now_ms)
    }

    fn report_tamper(&mut self, now_ms: u64) -> Result<u16, LinkError> {
        match self.send(Uplink::Tamper { seq: 0 }, now_ms)? {
            Some(seq) => {
                self.tamper_to_send = false;
                Ok(seq)
            }
            None => Err(LinkError::OutboxFull),
        }
    }

    /// Advance time: resends, link liveness, heartbeat, timeouts. Returns
    /// the frames to write, in order (drain it; frames left unread are
    /// returned by the next `poll`).
    pub fn poll(&mut self, now_ms: u64) -> Frames<'_, R> {
        if matches!(self.mode, Mode::Pairing { .. }) {
            // Pairing mode answers nothing else: no reports, no heartbeat.
            return Frames { board: self };
        }
        if matches!(self.mode, Mode::Sealed { .. })
            && !self.link.alive_at(now_ms)
            && now_ms >= self.next_plain_hello_ms
        {
            // serial.md, "Faults": restarted, or no verified frame for
            // 6 s: a lone 0x00 and a plain Hello ask for a session.
            self.next_plain_hello_ms = now_ms.saturating_add(self.cfg.link.down_after_ms);
            self.push_plain(&self.hello_msg());
        }
        self.link.poll(now_ms);
        while let Some(ev) = self.link.pop_event() {
            match ev {
                LinkEvent::Down => {
                    // Lock everything; an Unlock must come again once the
                    // link is back.
                    for d in self.doors.iter_mut() {
                        d.relay_until = None;
                    }
                }
                LinkEvent::Failed(msg) => {
                    self.stats.uplinks_failed = self.stats.uplinks_failed.saturating_add(1);
                    // A state the hub must not miss (a forced door, a
                    // tamper during a line glitch) is reported again; a
                    // Keypad is not: the guest types again.
                    match msg {
                        Uplink::DoorSensor { door, .. } => {
                            if let Some(d) = self.door_mut(door) {
                                d.sensor_reported = None;
                            }
                        }
                        Uplink::Tamper { .. } => self.tamper_to_send = true,
                        _ => {}
                    }
                }
                LinkEvent::Acked(Uplink::Tamper { .. }) => self.tamper_unacked = false,
                LinkEvent::Acked(_) | LinkEvent::Up => {}
            }
        }
        for door in 0..self.cfg.door_count {
            self.report_sensor(door, now_ms);
        }
        if self.tamper_to_send {
            let _ = self.report_tamper(now_ms);
        }
        let timeout = self.cfg.entry_timeout_ms;
        for d in self.doors.iter_mut() {
            if !d.entry.is_empty() && now_ms.saturating_sub(d.last_key_ms) >= timeout {
                d.clear_entry();
            }
        }
        if now_ms >= self.next_heartbeat_ms {
            let uptime_s = now_ms.saturating_sub(self.boot_ms) / 1000;
            let uptime_s = u32::try_from(uptime_s).unwrap_or(u32::MAX);
            let _ = self.send(Uplink::Heartbeat { uptime_s }, now_ms);
            self.next_heartbeat_ms = now_ms.saturating_add(self.cfg.heartbeat_every_ms);
        }
        Frames { board: self }
    }

    /// Whether `door`'s relay should be energised (open) at `now_ms`.
    /// False at power-up, after the `Unlock` time ran out, and whenever the
    /// link is not alive.
    pub fn relay_open(&self, door: u8, now_ms: u64) -> bool {
        let in_session = match &self.mode {
            Mode::Plain(_) => true,
            Mode::Sealed { seal, .. } => seal.has_session(),
            Mode::Pairing { .. } => false,
        };
        in_session
            && self.link.alive_at(now_ms)
            && self
                .door(door)
                .and_then(|d| d.relay_until)
                .is_some_and(|until| now_ms < until)
    }

    /// The deny indication to show at `door` (e.g. red LED; blink pattern
    /// for locked out), if one is active at `now_ms`.
    pub fn deny_feedback(&self, door: u8, now_ms: u64) -> Option<DenyReason> {
        match self.door(door)?.deny {
            Some((reason, until)) if now_ms < until => Some(reason),
            _ => None,
        }
    }

    /// Whether the hub has been heard from within the liveness window.
    pub fn link_up(&self, now_ms: u64) -> bool {
        self.link.alive_at(now_ms)
    }

    /// Digits typed so far at `door` (for a "***" display; never the digits).
    pub fn entry_len(&self, door: u8) -> usize {
        self.door(door).map_or(0, |d| d.entry.len())
    }

    /// The configuration in force (door count clamped).
    pub fn config(&self) -> &BoardConfig {
        &self.cfg
    }

    /// Board counters.
    pub fn stats(&self) -> BoardStats {
        self.stats
    }

    /// Frames received from the hub, good and dropped by reason.
    pub fn decoder_stats(&self) -> DecoderStats {
        match &self.mode {
            Mode::Plain(decoder) => decoder.stats(),
            Mode::Sealed { decoder, .. } | Mode::Pairing { decoder, .. } => decoder.stats(),
        }
    }

    /// The link, for diagnostics (pending count, liveness, counters).
    pub fn link(&self) -> &BoardLink {
        &self.link
    }

    fn act(&mut self, msg: Downlink, now_ms: u64) {
        match msg {
            Downlink::Unlock { door, ms, .. } => match self.door_mut(door) {
                Some(d) => {
                    let until = now_ms.saturating_add(u64::from(ms));
                    d.relay_until = Some(d.relay_until.map_or(until, |u| u.max(until)));
                    d.deny = None;
                }
                None => self.count_unknown_door(),
            },
            Downlink::Deny { door, reason, .. } => {
                let show = self.cfg.deny_feedback_ms;
                match self.door_mut(door) {
                    Some(d) => d.deny = Some((reason, now_ms.saturating_add(show))),
                    None => self.count_unknown_door(),
                }
            }
            // serial.md: the link has already forgotten the hub's seqs;
            // drop what still waits for an Ack (a Keypad typed before the
            // hub's Hello is never decided after it: the guest types
            // again), answer Hello, then report every door.
            Downlink::Hello { .. } => self.report_all(now_ms),
            // The link answered with Pong / consumed the Ack.
            Downlink::Ping { .. } | Downlink::Ack { .. } => {}
            // A board without a link key speaks only plain (serial.md,
            // "Sealed link"): the handshake, pairing and rekey messages
            // mean nothing to it.
            Downlink::SealHello { .. }
            | Downlink::SealConfirm { .. }
            | Downlink::PairStart { .. }
            | Downlink::PairReveal { .. }
            | Downlink::RekeyStart { .. } => {}
        }
    }

    /// The hub started over (plain `Hello`, or a new sealed session):
    /// drop what still waits for an Ack, answer `Hello`, report every door
    /// and an active tamper.
    fn report_all(&mut self, now_ms: u64) {
        self.link.drop_unacked();
        self.send_hello(now_ms);
        for door in 0..self.cfg.door_count {
            if let Some(d) = self.door_mut(door) {
                d.sensor_reported = None;
            }
            self.report_sensor(door, now_ms);
        }
        // A tamper is a state, like the doors: report it again.
        if self.tamper_unacked {
            self.tamper_to_send = true;
            let _ = self.report_tamper(now_ms);
        }
    }

    fn hello_msg(&self) -> Uplink {
        Uplink::Hello {
            board_id: self.cfg.board_id,
            fw_major: self.cfg.fw_major,
            fw_minor: self.cfg.fw_minor,
            door_count: self.cfg.door_count,
        }
    }

    fn send_hello(&mut self, now_ms: u64) {
        let _ = self.send(self.hello_msg(), now_ms);
    }

    fn send(&mut self, msg: Uplink, now_ms: u64) -> Result<Option<u16>, LinkError> {
        let r = self.link.send(msg, now_ms);
        if r.is_err() {
            self.stats.uplinks_not_sent = self.stats.uplinks_not_sent.saturating_add(1);
        }
        r
    }

    fn count_unknown_door(&mut self) {
        self.stats.unknown_door_commands = self.stats.unknown_door_commands.saturating_add(1);
    }

    fn door(&self, door: u8) -> Option<&Door> {
        if door >= self.cfg.door_count {
            return None;
        }
        self.doors.get(usize::from(door))
    }

    fn door_mut(&mut self, door: u8) -> Option<&mut Door> {
        if door >= self.cfg.door_count {
            return None;
        }
        self.doors.get_mut(usize::from(door))
    }
}

/// What one received frame meant, once the mode's decoder is done with it.
enum Rx {
    Plain(Downlink),
    Sealed(BoardRx),
    Reply(Uplink),
}

/// A plain frame as a frame of the sealed link's size; a `Hello` starts
/// with one extra 0x00 (serial.md): whatever half frame a reset cut short
/// ends there, and cannot swallow the `Hello`.
fn plain_frame(msg: &Uplink) -> Option<SealedFrame> {
    let f = to_frame(msg).ok()?;
    let mut out = SealedFrame::new();
    if matches!(msg, Uplink::Hello { .. }) {
        out.push(0).ok()?;
    }
    out.extend_from_slice(&f).ok()?;
    Some(out)
}

/// Frames to write, returned by [`Board::poll`]. Encodes lazily from the
/// link's outbox, so nothing is lost if the caller stops early. Handshake
/// frames go first. A sealed board seals every message while a session
/// holds and sends none without one; in pairing mode only the pairing
/// replies go out.
pub struct Frames<'a, R> {
    board: &'a mut Board<R>,
}

impl<R: RandomSource> Frames<'_, R> {
    /// The next frame and, for a message of the link, that message (a
    /// plain handshake or pairing frame has none): what a simulator shows
    /// of a sealed frame it cannot read on the wire.
    pub fn next_with_msg(&mut self) -> Option<(SealedFrame, Option<Uplink>)> {
        if let Some(f) = self.board.handshake_out.pop_front() {
            return Some((f, None));
        }
        loop {
            let msg = self.board.link.pop_tx()?;
            let framed = match &mut self.board.mode {
                Mode::Plain(_) => plain_frame(&msg),
                Mode::Sealed { seal, .. } => match seal.seal(&msg) {
                    Ok(f) => Some(f),
                    // No session: nothing goes out but the plain Hello
                    // that asks for one (queued by `poll`).
                    Err(SealError::NoSession) => continue,
                    // The counter ran out: ask for a new session.
                    Err(SealError::CounterExhausted) => {
                        let hello = self.board.hello_msg();
                        self.board.push_plain(&hello);
                        return self.board.handshake_out.pop_front().map(|f| (f, None));
                    }
                    Err(SealError::Encode) => None,
                },
                Mode::Pairing { .. } => continue,
            };
            match framed {
                Some(f) => return Some((f, Some(msg))),
                None => {
                    self.board.stats.encode_errors =
                        self.board.stats.encode_errors.saturating_add(1);
                }
            }
        }
    }
}

impl<R: RandomSource> Iterator for Frames<'_, R> {
    type Item = SealedFrame;

    fn next(&mut self) -> Option<SealedFrame> {
        self.next_with_msg().map(|(f, _)| f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::decode_frame;

    const T0: u64 = 1_000;

    fn frames(board: &mut Board, now: u64) -> heapless::Vec<Uplink, 32> {
        let mut v = heapless::Vec::new();
        for f in board.poll(now) {
            // A Hello's lead 0x00 (serial.md) is an empty frame on its own.
            let f = f.strip_prefix(&[0]).unwrap_or(&f);
            v.push(decode_frame::<Uplink>(f).unwrap()).unwrap();
        }
        v
    }

    fn send(board: &mut Board, msg: &Downlink, now: u64) {
        board.on_frame_bytes(&to_frame(msg).unwrap(), now);
    }

    fn hello() -> Uplink {
        Uplink::Hello {
            board_id: 3,
            fw_major: 1,
            fw_minor: 0,
            door_count: 2,
        }
    }

    fn board() -> Board {
        let mut b = Board::new(BoardConfig::new(3, 2), T0);
        frames(&mut b, T0);
        b
    }

    fn type_keys(b: &mut Board, door: u8, keys: &str, now: u64) -> KeyAction {
        let mut last = KeyAction::Ignored;
        for k in keys.chars() {
            last = b.on_key(door, k, now);
        }
        last
    }

    #[test]
    fn power_up_sends_hello_and_keeps_relays_locked() {
        let mut b = Board::new(BoardConfig::new(3, 2), T0);
        assert_eq!(frames(&mut b, T0).as_slice(), &[hello()]);
        assert!(!b.relay_open(0, T0));
        assert!(!b.relay_open(1, T0));
    }

    #[test]
    fn digits_are_submitted_as_keypad_on_hash() {
        let mut b = board();
        assert_eq!(type_keys(&mut b, 1, "2468#", T0), KeyAction::Submitted(1));
        let out = frames(&mut b, T0);
        match &out[..] {
            [
                Uplink::Keypad {
                    seq: 1,
                    door: 1,
                    pin,
                },
            ] => {
                assert_eq!(pin.as_digits(), Some("2468"))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(b.entry_len(1), 0);
    }

    #[test]
    fn star_clears_the_entry() {
        let mut b = board();
        type_keys(&mut b, 0, "99*1234#", T0);
        match &frames(&mut b, T0)[..] {
            [Uplink::Keypad { pin, .. }] => assert_eq!(pin.as_digits(), Some("1234")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn entries_are_kept_per_door() {
        let mut b = board();
        b.on_key(0, '1', T0);
        b.on_key(1, '9', T0);
        b.on_key(0, '2', T0);
        assert_eq!(b.entry_len(0), 2);
        assert_eq!(b.entry_len(1), 1);
    }

    #[test]
    fn hash_on_an_empty_entry_sends_nothing() {
        let mut b = board();
        assert_eq!(b.on_key(0, '#', T0), KeyAction::Ignored);
        assert!(frames(&mut b, T0).is_empty());
    }

    #[test]
    fn overlong_entry_is_sent_as_13_digits_so_the_hub_denies_bad_format() {
        let mut b = board();
        type_keys(&mut b, 0, "12345678901234567890#", T0);
        match &frames(&mut b, T0)[..] {
            [Uplink::Keypad { pin, .. }] => {
                assert_eq!(pin.len(), ENTRY_MAX);
                assert_eq!(pin.as_digits(), None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn half_typed_entry_is_forgotten_after_the_entry_timeout() {
        let mut b = board();
        type_keys(&mut b, 0, "12", T0);
        frames(&mut b, T0 + 14_999);
        assert_eq!(b.entry_len(0), 2);
        frames(&mut b, T0 + 15_000);
        assert_eq!(b.entry_len(0), 0);
    }

    #[test]
    fn keys_for_a_door_the_board_does_not_have_are_ignored() {
        let mut b = board();
        assert_eq!(b.on_key(2, '1', T0), KeyAction::Ignored);
        assert_eq!(b.on_key(200, '#', T0), KeyAction::Ignored);
    }

    #[test]
    fn unlock_opens_the_relay_for_ms_then_locks_it() {
        let mut b = board();
        let u = Downlink::Unlock {
            seq: 1,
            door: 1,
            ms: 3000,
        };
        send(&mut b, &u, T0);
        assert_eq!(frames(&mut b, T0).as_slice(), &[Uplink::Ack { seq: 1 }]);
        assert!(b.relay_open(1, T0));
        assert!(b.relay_open(1, T0 + 2999));
        assert!(!b.relay_open(1, T0 + 3000));
        assert!(!b.relay_open(0, T0), "other door untouched");
    }

    #[test]
    fn resent_unlock_is_acked_again_but_does_not_extend_the_relay_time() {
        let mut b = board();
        let u = Downlink::Unlock {
            seq: 1,
            door: 0,
            ms: 1000,
        };
        send(&mut b, &u, T0);
        send(&mut b, &u, T0 + 500);
        let acks = frames(&mut b, T0 + 500);
        assert_eq!(
            acks.as_slice(),
            &[Uplink::Ack { seq: 1 }, Uplink::Ack { seq: 1 }]
        );
        assert!(!b.relay_open(0, T0 + 1000));
    }

    #[test]
    fn hub_hello_clears_board_memory_of_hub_seqs() {
        let mut b = board();
        let u = Downlink::Unlock {
            seq: 1,
            door: 0,
            ms: 1000,
        };
        send(&mut b, &u, T0);
        send(&mut b, &Downlink::Hello { session: 77 }, T0 + 2000);
        let out = frames(&mut b, T0 + 2000);
        assert_eq!(out.as_slice(), &[Uplink::Ack { seq: 1 }, hello()]);
        assert!(!b.relay_open(0, T0 + 2000));
        // The new session's seq 1 is a new command.
        send(&mut b, &u, T0 + 2001);
        assert!(b.relay_open(0, T0 + 2001));
    }

    #[test]
    fn relay_locks_when_the_link_is_lost_and_stays_locked_when_it_returns() {
        let mut b = board();
        let u = Downlink::Unlock {
            seq: 1,
            door: 0,
            ms: 60_000,
        };
        send(&mut b, &u, T0);
        assert!(b.relay_open(0, T0 + 5_999));
        // Locked the instant the link is quiet for 6 s, even before poll.
        assert!(!b.relay_open(0, T0 + 6_000));
        frames(&mut b, T0 + 6_000);
        send(&mut b, &Downlink::Ping { nonce: 5 }, T0 + 7_000);
        assert!(b.link_up(T0 + 7_000));
        assert!(!b.relay_open(0, T0 + 7_000));
    }

    #[test]
    fn ping_is_answered_with_pong() {
        let mut b = board();
        send(&mut b, &Downlink::Ping { nonce: 0xdead }, T0);
        assert_eq!(
            frames(&mut b, T0).as_slice(),
            &[Uplink::Pong { nonce: 0xdead }]
        );
    }

    #[test]
    fn deny_shows_feedback_with_its_reason_for_a_while() {
        let mut b = board();
        let d = Downlink::Deny {
            seq: 4,
            door: 1,
            reason: DenyReason::LOCKED_OUT,
        };
        send(&mut b, &d, T0);
        assert_eq!(frames(&mut b, T0).as_slice(), &[Uplink::Ack { seq: 4 }]);
        assert_eq!(b.deny_feedback(1, T0 + 1), Some(DenyReason::LOCKED_OUT));
        assert_eq!(b.deny_feedback(0, T0 + 1), None);
        assert_eq!(b.deny_feedback(1, T0 + 2_000), None);
    }

    #[test]
    fn command_for_an_unknown_door_is_acked_and_ignored() {
        let mut b = board();
        let u = Downlink::Unlock {
            seq: 9,
            door: 7,
            ms: 1000,
        };
        send(&mut b, &u, T0);
        assert_eq!(frames(&mut b, T0).as_slice(), &[Uplink::Ack { seq: 9 }]);
        assert_eq!(b.stats().unknown_door_commands, 1);
    }

    #[test]
    fn door_sensor_sends_only_changes() {
        let mut b = board();
        b.on_door_sensor(0, false, T0);
        b.on_door_sensor(0, false, T0);
        b.on_door_sensor(0, true, T0);
        let out = frames(&mut b, T0);
        assert_eq!(
            out.as_slice(),
            &[
                Uplink::DoorSensor {
                    seq: 1,
                    door: 0,
                    open: false
                },
                Uplink::DoorSensor {
                    seq: 2,
                    door: 0,
                    open: true
                },
            ]
        );
    }

    #[test]
    fn tamper_is_resent_until_acked() {
        let mut b = board();
        assert_eq!(b.on_tamper(T0), Ok(1));
        assert_eq!(frames(&mut b, T0).as_slice(), &[Uplink::Tamper { seq: 1 }]);
        assert_eq!(
            frames(&mut b, T0 + 250).as_slice(),
            &[Uplink::Tamper { seq: 1 }]
        );
        send(&mut b, &Downlink::Ack { seq: 1 }, T0 + 300);
        assert!(frames(&mut b, T0 + 1000).is_empty());
        assert_eq!(b.stats().uplinks_failed, 0);
    }

    #[test]
    fn a_tamper_whose_every_send_fails_is_sent_again_until_acked() {
        let mut b = board();
        assert_eq!(b.on_tamper(T0), Ok(1));
        let mut seqs: heapless::Vec<u16, 16> = heapless::Vec::new();
        for t in (T0..=T0 + 1_500).step_by(50) {
            for m in frames(&mut b, t) {
                if let Uplink::Tamper { seq } = m
                    && !seqs.contains(&seq)
                {
                    seqs.push(seq).unwrap();
                }
            }
        }
        assert_eq!(seqs.as_slice(), &[1, 2], "the failed one, then again");
        assert_eq!(b.stats().uplinks_failed, 1);
        send(&mut b, &Downlink::Ack { seq: 2 }, T0 + 1_600);
        for t in [1_900, 2_200, 2_500, 3_000, 4_000] {
            assert!(
                !frames(&mut b, T0 + t)
                    .iter()
                    .any(|m| matches!(m, Uplink::Tamper { .. })),
                "acked: not sent again"
            );
        }
    }

    #[test]
    fn a_door_level_whose_every_send_fails_is_reported_again() {
        let mut b = board();
        b.on_door_sensor(0, true, T0);
        let mut reports = 0;
        for t in (T0..=T0 + 1_500).step_by(50) {
            let out = frames(&mut b, t);
            reports += out
                .iter()
                .filter(
                    |m| matches!(m, Uplink::DoorSensor { door: 0, open: true, seq } if *seq > 1),
                )
                .count();
        }
        assert!(reports >= 1, "reported again with a new seq");
        assert_eq!(b.stats().uplinks_failed, 1);
    }

    #[test]
    fn a_tamper_the_hubs_hello_dropped_is_reported_after_the_answer() {
        let mut b = board();
        b.on_tamper(T0).unwrap();
        frames(&mut b, T0);
        send(&mut b, &Downlink::Hello { session: 9 }, T0 + 100);
        let out = frames(&mut b, T0 + 100);
        assert_eq!(out[0], hello());
        assert!(
            out.iter().any(|m| matches!(m, Uplink::Tamper { .. })),
            "{out:?}"
        );
    }

    #[test]
    fn unacked_keypad_is_counted_as_failed_after_4_sends() {
        let mut b = board();
        type_keys(&mut b, 0, "1234#", T0);
        let mut sends = 0;
        for t in (T0..=T0 + 1_000).step_by(50) {
            sends += frames(&mut b, t)
                .iter()
                .filter(|m| matches!(m, Uplink::Keypad { .. }))
                .count();
        }
        assert_eq!(sends, 4);
        assert_eq!(b.stats().uplinks_failed, 1);
    }

    #[test]
    fn heartbeat_carries_uptime_periodically() {
        let mut b = board();
        assert!(frames(&mut b, T0 + 9_999).is_empty());
        assert_eq!(
            frames(&mut b, T0 + 10_000).as_slice(),
            &[Uplink::Heartbeat { uptime_s: 10 }]
        );
        assert_eq!(
            frames(&mut b, T0 + 20_500).as_slice(),
            &[Uplink::Heartbeat { uptime_s: 20 }]
        );
    }

    #[test]
    fn garbage_from_the_hub_is_counted_and_ignored() {
        let mut b = board();
        b.on_frame_bytes(&[0x05, 0x01, 0x00, 0xff, 0xff, 0x00, 0x02, 0x00], T0);
        assert!(frames(&mut b, T0).is_empty());
        assert_eq!(b.decoder_stats().frames_ok, 0);
        assert!(b.decoder_stats().dropped() >= 2);
        assert!(!b.link_up(T0));
    }

    #[test]
    fn hello_frames_start_with_a_lone_zero_byte_and_others_do_not() {
        let mut b = Board::new(BoardConfig::new(3, 2), T0);
        let f: heapless::Vec<SealedFrame, 4> = b.poll(T0).collect();
        assert_eq!(f.len(), 1);
        assert_eq!(f[0][0], 0x00);
        assert_eq!(&f[0][1..], to_frame(&hello()).unwrap().as_slice());
        b.on_tamper(T0).unwrap();
        let f: heapless::Vec<SealedFrame, 4> = b.poll(T0).collect();
        assert_ne!(f[0][0], 0x00);
    }

    #[test]
    fn the_hubs_hello_drops_an_unacked_keypad_and_is_answered_with_hello_and_every_door() {
        let mut b = board();
        b.on_door_sensor(0, true, T0);
        b.on_door_sensor(1, false, T0);
        frames(&mut b, T0);
        type_keys(&mut b, 0, "1234#", T0);
        frames(&mut b, T0);
        send(&mut b, &Downlink::Hello { session: 9 }, T0 + 100);
        let out = frames(&mut b, T0 + 100);
        assert_eq!(out[0], hello());
        assert!(
            !out.iter().any(|m| matches!(m, Uplink::Keypad { .. })),
            "{out:?}"
        );
        let doors: heapless::Vec<(u8, bool), 4> = out
            .iter()
            .filter_map(|m| match m {
                Uplink::DoorSensor { door, open, .. } => Some((*door, *open)),
                _ => None,
            })
            .collect();
        assert_eq!(doors.as_slice(), &[(0, true), (1, false)]);
        // And the dropped Keypad is never resent.
        for t in [350, 600, 850, 1100] {
            assert!(
                !frames(&mut b, T0 + t)
                    .iter()
                    .any(|m| matches!(m, Uplink::Keypad { .. }))
            );
        }
    }

    #[test]
    fn every_door_is_reported_after_the_hubs_hello_even_past_the_pending_table() {
        let mut b = Board::new(BoardConfig::new(3, 16), T0);
        for door in 0..16 {
            b.on_door_sensor(door, door.is_multiple_of(2), T0);
        }
        let mut reported = [false; 16];
        send(&mut b, &Downlink::Hello { session: 9 }, T0);
        for step in 0..10u64 {
            let now = T0 + step * 10;
            for m in frames(&mut b, now) {
                if let Uplink::DoorSensor { seq, door, open } = m {
                    assert_eq!(open, door.is_multiple_of(2));
                    reported[usize::from(door)] = true;
                    send(&mut b, &Downlink::Ack { seq }, now);
                }
            }
        }
        assert_eq!(reported, [true; 16]);
    }
}
