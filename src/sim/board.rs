//! A simulated lock board: [`firmware_bridge::Board`], the same state
//! machine the firmware runs, driven over a real byte stream (a serial port
//! or the master side of a pseudo-terminal).
//!
//! Three users:
//! - tests script it ([`SimBoard::enter_pin`], [`SimBoard::set_door`],
//!   [`SimBoard::run_until`], ...) and read what it saw and did from
//!   [`SimEvent`]s; filters lose chosen frames on purpose;
//! - the demo and installers run `lockhub sim-board --port PATH`, which reads
//!   commands from stdin ([`Command::parse`]) and prints one line per relay
//!   change or deny ([`SimEvent::line`]);
//! - nobody else: it is not firmware, just the firmware's logic on a PC.
//!
//! It never prints or logs a PIN: typed keys go into the board, and only
//! "entry sent" comes out.
//!
//! Plain or sealed: a sealed board ([`SimBoard::new_sealed`], `sim-board
//! --key-file`) holds a link key and talks in sessions the hub starts
//! (docs/protocol/serial.md, "Sealed link"). Its events and filters see the
//! messages as the board does (what it sealed, what verified), since
//! nobody can read them on the wire.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use firmware_bridge::board::{KeyAction, MAX_DOORS};
use firmware_bridge::{Board, BoardConfig, DenyReason, Downlink, LinkKey, Uplink, decode_frame};

use crate::drivers::OsRandom;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// How often the board state machine is polled while idle.
const STEP: Duration = Duration::from_millis(5);
/// Events kept for the caller; the oldest go first past this.
const EVENTS_MAX: usize = 4096;

/// Something the simulated board saw or did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SimEvent {
    /// A frame from the hub reached the board (after the downlink filter).
    Received(Downlink),
    /// The board wrote this frame (after the uplink filter).
    Sent(Uplink),
    /// The line lost this frame on purpose (a filter said so).
    LostDown(Downlink),
    /// The line lost this board frame on purpose.
    LostUp(Uplink),
    /// The board submitted an entry at `door` ('#' pressed).
    EntrySent {
        door: u8,
    },
    RelayOpened {
        door: u8,
    },
    RelayClosed {
        door: u8,
    },
    Denied {
        door: u8,
        locked_out: bool,
    },
    LinkUp,
    LinkDown,
}

impl SimEvent {
    /// The line `sim-board` prints, for the events a person cares about.
    pub fn line(&self) -> Option<String> {
        self.line_for(&[])
    }

    /// [`SimEvent::line`] with doors named as the hub's config names them
    /// (`--door-name 101=0`: `door 101`).
    pub fn line_for(&self, doors: &[(String, u8)]) -> Option<String> {
        let at = |door: &u8| door_label(*door, doors);
        Some(match self {
            SimEvent::EntrySent { door } => format!("{}: entry sent", at(door)),
            SimEvent::RelayOpened { door } => format!("{}: relay open", at(door)),
            SimEvent::RelayClosed { door } => format!("{}: relay closed", at(door)),
            SimEvent::Denied {
                door,
                locked_out: false,
            } => format!("{}: denied", at(door)),
            SimEvent::Denied {
                door,
                locked_out: true,
            } => format!("{}: denied (keypad locked out)", at(door)),
            SimEvent::LinkUp => "link up".to_owned(),
            SimEvent::LinkDown => "link down".to_owned(),
            _ => return None,
        })
    }
}

/// `door NAME` for a door the hub's config names, else `door INDEX`.
pub fn door_label(door: u8, doors: &[(String, u8)]) -> String {
    match doors.iter().find(|(_, i)| *i == door) {
        Some((name, _)) => format!("door {name}"),
        None => format!("door {door}"),
    }
}

/// Why the simulated board stopped.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("the port reads end-of-file")]
    Eof,
    #[error("port I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        source: tokio_serial::Error,
    },
}

/// Decides whether the line loses a frame: `true` = lose it.
pub type Filter<M> = Box<dyn FnMut(&M) -> bool + Send>;

/// A board on a byte stream. See the module docs.
pub struct SimBoard<Io> {
    io: Io,
    board: Board<OsRandom>,
    t0: Instant,
    relays: [bool; MAX_DOORS],
    denied: [Option<DenyReason>; MAX_DOORS],
    /// The door contacts, read every step as a firmware's HAL reads its
    /// inputs every loop: closed until a test or `open DOOR` says not.
    contacts: [bool; MAX_DOORS],
    link_up: bool,
    events: VecDeque<SimEvent>,
    lose_up: Option<Filter<Uplink>>,
    lose_down: Option<Filter<Downlink>>,
}

impl<Io: AsyncRead + AsyncWrite + Unpin> SimBoard<Io> {
    /// A plain board (no link key) that has just powered up (its Hello
    /// goes out on the first step).
    pub fn new(io: Io, cfg: BoardConfig) -> Self {
        Self::with_board(io, Board::new_plain_with(cfg, OsRandom, 0))
    }

    /// A board holding link key `key` that has just powered up: its plain
    /// Hello asks the hub for a session.
    pub fn new_sealed(io: Io, cfg: BoardConfig, key: [u8; 32]) -> Self {
        Self::with_board(
            io,
            Board::new_sealed(cfg, LinkKey::from_bytes(key), OsRandom, 0),
        )
    }

    /// A board powered up in pairing mode (`lockhub board pair`): the
    /// code goes in at door 0 ('#' ends it).
    pub fn new_pairing(io: Io, cfg: BoardConfig) -> Self {
        Self::with_board(io, Board::new_pairing(cfg, OsRandom, 0))
    }

    fn with_board(io: Io, board: Board<OsRandom>) -> Self {
        Self {
            io,
            board,
            t0: Instant::now(),
            relays: [false; MAX_DOORS],
            denied: [None; MAX_DOORS],
            contacts: [false; MAX_DOORS],
            link_up: false,
            events: VecDeque::new(),
            lose_up: None,
            lose_down: None,
        }
    }

    /// The board's clock: milliseconds since it powered up.
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Presses keys at `door` ('0'..='9', '*' clears, '#' submits).
    pub fn press(&mut self, door: u8, keys: &str) {
        let now = self.now_ms();
        for k in keys.chars() {
            if let KeyAction::Submitted(_) = self.board.on_key(door, k, now) {
                self.push(SimEvent::EntrySent { door });
            }
        }
    }

    /// Types `pin` and '#' at `door`.
    pub fn enter_pin(&mut self, door: u8, pin: &str) {
        self.press(door, pin);
        self.press(door, "#");
    }

    /// The door contact at `door` reads `open` from now on.
    pub fn set_door(&mut self, door: u8, open: bool) {
        if let Some(c) = self.contacts.get_mut(usize::from(door)) {
            *c = open;
        }
        let now = self.now_ms();
        self.board.on_door_sensor(door, open, now);
    }

    /// The tamper switch tripped.
    pub fn tamper(&mut self) {
        let now = self.now_ms();
        let _ = self.board.on_tamper(now);
    }

    /// Loses every board frame for which `f` says `true` (until replaced).
    pub fn lose_uplinks(&mut self, f: impl FnMut(&Uplink) -> bool + Send + 'static) {
        self.lose_up = Some(Box::new(f));
    }

    /// Loses every hub frame for which `f` says `true` (until replaced).
    pub fn lose_downlinks(&mut self, f: impl FnMut(&Downlink) -> bool + Send + 'static) {
        self.lose_down = Some(Box::new(f));
    }

    /// Writes bytes as they are, outside the board (garbage, broken frames).
    pub async fn write_raw(&mut self, bytes: &[u8]) -> Result<(), SimError> {
        self.io.write_all(bytes).await?;
        Ok(())
    }

    /// `msg` framed as the board would write it now, to put on the wire by
    /// hand ([`SimBoard::write_raw`]): plain, or sealed in the board's
    /// current session (empty without one). Nothing is stamped or resent:
    /// a test's own seq goes out as it is.
    pub fn frame_msg(&mut self, msg: &Uplink) -> Vec<u8> {
        self.board
            .frame_outside_link(msg)
            .map(|f| f.to_vec())
            .unwrap_or_default()
    }

    /// Whether `door`'s relay is energised now.
    pub fn relay_open(&self, door: u8) -> bool {
        self.board.relay_open(door, self.now_ms())
    }

    /// The state machine, for its counters.
    pub fn board(&self) -> &Board<OsRandom> {
        &self.board
    }

    /// A link key the board must now keep (pairing matched, or a rekey's
    /// first session under its new key verified), once.
    pub fn take_new_key(&mut self) -> Option<[u8; 32]> {
        self.board.take_new_key().map(|k| *k.as_bytes())
    }

    /// Events since the last call, oldest first.
    pub fn take_events(&mut self) -> Vec<SimEvent> {
        self.events.drain(..).collect()
    }

    /// Events not yet taken.
    pub fn events(&self) -> impl Iterator<Item = &SimEvent> {
        self.events.iter()
    }

    /// One step: read what arrived (waiting at most a few ms), poll the
    /// board, write its frames, note level changes.
    pub async fn step(&mut self) -> Result<(), SimError> {
        let mut buf = [0u8; 512];
        match tokio::time::timeout(STEP, self.io.read(&mut buf)).await {
            Err(_) => {}
            Ok(Ok(0)) => return Err(SimError::Eof),
            Ok(Ok(n)) => self.on_bytes(buf.get(..n).unwrap_or_default()),
            Ok(Err(e)) => return Err(e.into()),
        }
        let now = self.now_ms();
        let doors = self.board.config().door_count.min(MAX_DOORS as u8);
        for door in 0..doors {
            let open = self
                .contacts
                .get(usize::from(door))
                .copied()
                .unwrap_or(false);
            self.board.on_door_sensor(door, open, now);
        }
        let mut frames = Vec::new();
        {
            let mut polled = self.board.poll(now);
            while let Some(f) = polled.next_with_msg() {
                frames.push(f);
            }
        }
        let mut out = Vec::new();
        for (f, msg) in frames {
            // A plain frame (the handshake, a plain board's) shows its
            // message; a Hello's lead 0x00 (serial.md) is an empty frame
            // of its own, skipped by the decoder, written with the frame.
            let msg = msg.or_else(|| {
                let body = f.strip_prefix(&[0]).unwrap_or(&f);
                decode_frame::<Uplink>(body).ok()
            });
            match msg {
                Some(msg) if self.lose_up.as_mut().is_some_and(|lose| lose(&msg)) => {
                    self.push(SimEvent::LostUp(msg));
                }
                Some(msg) => {
                    out.extend_from_slice(&f);
                    self.push(SimEvent::Sent(msg));
                }
                None => out.extend_from_slice(&f),
            }
        }
        if !out.is_empty() {
            self.io.write_all(&out).await?;
        }
        self.note_levels(now);
        Ok(())
    }

    /// Steps for `d`.
    pub async fn run_for(&mut self, d: Duration) -> Result<(), SimError> {
        let end = Instant::now() + d;
        while Instant::now() < end {
            self.step().await?;
        }
        Ok(())
    }

    /// Steps until `done` holds (true) or `timeout` passes (false).
    pub async fn run_until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&Self) -> bool,
    ) -> Result<bool, SimError> {
        let end = Instant::now() + timeout;
        loop {
            if done(self) {
                return Ok(true);
            }
            if Instant::now() >= end {
                return Ok(false);
            }
            self.step().await?;
        }
    }

    /// Hands back the stream.
    pub fn into_inner(self) -> Io {
        self.io
    }

    /// Hands the bytes to the board; each message that reaches it (plain,
    /// or sealed once it verified) goes past the downlink filter first, so
    /// the filter loses whole messages. Bytes that do not decode or verify
    /// are the board's to drop.
    fn on_bytes(&mut self, bytes: &[u8]) {
        let now = self.now_ms();
        let lose_down = &mut self.lose_down;
        let events = &mut self.events;
        self.board.on_frame_bytes_tapped(bytes, now, &mut |msg| {
            let lost = lose_down.as_mut().is_some_and(|lose| lose(msg));
            if events.len() >= EVENTS_MAX {
                events.pop_front();
            }
            events.push_back(if lost {
                SimEvent::LostDown(msg.clone())
            } else {
                SimEvent::Received(msg.clone())
            });
            !lost
        });
    }

    fn note_levels(&mut self, now: u64) {
        let up = self.board.link_up(now);
        if up != self.link_up {
            self.link_up = up;
            self.push(if up {
                SimEvent::LinkUp
            } else {
                SimEvent::LinkDown
            });
        }
        let doors = self.board.config().door_count.min(MAX_DOORS as u8);
        for door in 0..doors {
            let i = usize::from(door);
            let open = self.board.relay_open(door, now);
            if self.relays.get(i).copied() != Some(open) {
                if let Some(r) = self.relays.get_mut(i) {
                    *r = open;
                }
                self.push(if open {
                    SimEvent::RelayOpened { door }
                } else {
                    SimEvent::RelayClosed { door }
                });
            }
            let deny = self.board.deny_feedback(door, now);
            if self.denied.get(i).copied() != Some(deny) {
                if let Some(d) = self.denied.get_mut(i) {
                    *d = deny;
                }
                if let Some(reason) = deny {
                    self.push(SimEvent::Denied {
                        door,
                        locked_out: reason == DenyReason::LOCKED_OUT,
                    });
                }
            }
        }
    }

    fn push(&mut self, ev: SimEvent) {
        if self.events.len() >= EVENTS_MAX {
            self.events.pop_front();
        }
        self.events.push_back(ev);
    }
}

impl SimBoard<tokio_serial::SerialStream> {
    /// A board on a serial device (a USB adapter wired to the hub's port,
    /// or one end of a pseudo-terminal pair).
    pub fn open(path: &str, baud: u32, cfg: BoardConfig) -> Result<Self, SimError> {
        Ok(Self::new(open_port(path, baud)?, cfg))
    }
}

fn open_port(path: &str, baud: u32) -> Result<tokio_serial::SerialStream, SimError> {
    use tokio_serial::SerialPortBuilderExt;
    tokio_serial::new(path, baud)
        .open_native_async()
        .map_err(|source| SimError::Open {
            path: path.to_owned(),
            source,
        })
}

/// One stdin command of `sim-board`.
#[derive(Clone, PartialEq, Eq)]
pub enum Command {
    /// `DOOR KEYS`: press keys at a door, e.g. `0 482913#`.
    Keys { door: u8, keys: String },
    /// `open DOOR` / `close DOOR`: the door contact.
    Sensor { door: u8, open: bool },
    /// `tamper`.
    Tamper,
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Keys may be a PIN: never shown.
            Command::Keys { door, .. } => write!(f, "Keys {{ door: {door}, keys: <redacted> }}"),
            Command::Sensor { door, open } => write!(f, "Sensor {{ door: {door}, open: {open} }}"),
            Command::Tamper => f.write_str("Tamper"),
        }
    }
}

impl Command {
    /// Parses one line. `doors` maps a door name to its index (from the
    /// hub's config, if given); a plain number is an index.
    pub fn parse(line: &str, doors: &[(String, u8)]) -> Result<Command, String> {
        let mut words = line.split_whitespace();
        let first = words.next().ok_or_else(|| "empty line".to_owned())?;
        let door_of = |w: Option<&str>| -> Result<u8, String> {
            let w = w.ok_or_else(|| "which door?".to_owned())?;
            if let Some((_, i)) = doors.iter().find(|(n, _)| n == w) {
                return Ok(*i);
            }
            w.parse::<u8>()
                .ok()
                .filter(|i| usize::from(*i) < MAX_DOORS)
                .ok_or_else(|| format!("unknown door {w:?}: use an index 0..=15 or a door name"))
        };
        let cmd = match first {
            "open" | "close" => Command::Sensor {
                door: door_of(words.next())?,
                open: first == "open",
            },
            "tamper" => Command::Tamper,
            _ => {
                let door = door_of(Some(first))?;
                let keys: String = words.by_ref().collect();
                if keys.is_empty()
                    || !keys
                        .chars()
                        .all(|c| c.is_ascii_digit() || c == '*' || c == '#')
                {
                    return Err("keys are 0-9, * and #".to_owned());
                }
                Command::Keys { door, keys }
            }
        };
        if words.next().is_some() {
            return Err("too many words".to_owned());
        }
        Ok(cmd)
    }

    /// What `sim-board` says it did, at once (the board's answers follow as
    /// their own lines). Never the keys themselves: they may be a PIN.
    pub fn echo(&self, doors: &[(String, u8)]) -> String {
        match self {
            Command::Keys { door, keys } => {
                let at = door_label(*door, doors);
                let n = keys.chars().count();
                if keys.ends_with('#') {
                    format!("{at}: {n} keys pressed")
                } else {
                    format!(
                        "{at}: {n} keys pressed, no # at the end: the board sends the entry when # is pressed"
                    )
                }
            }
            Command::Sensor { door, open } => format!(
                "{}: contact {}",
                door_label(*door, doors),
                if *open { "open" } else { "closed" }
            ),
            Command::Tamper => "tamper switch tripped".to_owned(),
        }
    }

    /// Applies the command to the board.
    pub fn apply<Io: AsyncRead + AsyncWrite + Unpin>(self, sim: &mut SimBoard<Io>) {
        match self {
            Command::Keys { door, keys } => sim.press(door, &keys),
            Command::Sensor { door, open } => sim.set_door(door, open),
            Command::Tamper => sim.tamper(),
        }
    }
}

/// How `sim-board` talks: plain, sealed under a link key, or in pairing
/// mode (the code typed on stdin as keys at door 0, e.g. `0 123456#`).
#[derive(Clone)]
pub enum SimMode {
    Plain,
    Sealed([u8; 32]),
    /// On a matching code the new key is written to `save` (mode 0600), as
    /// a board writes it to flash, and the board goes on sealed under it.
    Pairing {
        save: Option<std::path::PathBuf>,
    },
}

impl fmt::Debug for SimMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimMode::Plain => f.write_str("Plain"),
            SimMode::Sealed(_) => f.write_str("Sealed(<redacted>)"),
            SimMode::Pairing { save } => write!(f, "Pairing {{ save: {save:?} }}"),
        }
    }
}

/// `lockhub sim-board`: a board on `path` driven by lines on stdin (see
/// [`Command::parse`]), printing one line per relay change, deny, link
/// change or refused command on stdout. Ends at end of input (after
/// `linger`, so the last answers are seen) or when the port goes away.
///
/// Why stdin is read on a thread: the runtime has no async stdin here, and
/// a blocking read must not stall the board's timers.
pub async fn run_interactive(
    path: &str,
    baud: u32,
    cfg: BoardConfig,
    mode: SimMode,
    doors: Vec<(String, u8)>,
    linger: Duration,
) -> Result<(), SimError> {
    let io = open_port(path, baud)?;
    let save = match &mode {
        SimMode::Pairing { save } => save.clone(),
        _ => None,
    };
    let mut sim = match mode {
        SimMode::Plain => SimBoard::new(io, cfg),
        SimMode::Sealed(key) => SimBoard::new_sealed(io, cfg, key),
        SimMode::Pairing { .. } => SimBoard::new_pairing(io, cfg),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<String>(64);
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    println!(
        "sim-board on {path}: board {} with {} doors; commands: DOOR KEYS (e.g. 0 1234#), open DOOR, close DOOR, tamper",
        cfg.board_id, cfg.door_count
    );
    let mut input_open = true;
    let mut end: Option<Instant> = None;
    let mut pairing_said = None;
    loop {
        while input_open {
            match rx.try_recv() {
                Ok(line) if line.trim().is_empty() => {}
                Ok(line) => match Command::parse(&line, &doors) {
                    Ok(cmd) => {
                        println!("{}", cmd.echo(&doors));
                        cmd.apply(&mut sim);
                    }
                    Err(why) => println!("? {why}"),
                },
                Err(tokio::sync::mpsc::error::TryRecvError::Empty) => break,
                Err(tokio::sync::mpsc::error::TryRecvError::Disconnected) => {
                    input_open = false;
                    end = Some(Instant::now() + linger);
                }
            }
        }
        sim.step().await?;
        for ev in sim.take_events() {
            if let Some(line) = ev.line_for(&doors) {
                println!("{line}");
            }
        }
        if let Some(phase) = sim.board().pairing_phase()
            && let firmware_bridge::pair::BoardPairPhase::Failed(why) = phase
            && pairing_said != Some(phase)
        {
            pairing_said = Some(phase);
            println!("pairing failed: {why}; the board keeps its old key");
        }
        if let Some(key) = sim.take_new_key() {
            match &save {
                Some(p) => match write_key_file(p, &key) {
                    Ok(()) => println!("paired: link key stored in {}", p.display()),
                    Err(e) => println!("paired, but the key could not be stored: {e}"),
                },
                None => println!("paired: link key held in memory"),
            }
        }
        if end.is_some_and(|e| Instant::now() >= e) {
            return Ok(());
        }
    }
}

/// Reads a link key file: base64url of 32 bytes on its first line (the
/// form of a `[[board_key]] key` and of a board's label).
pub fn read_key_file(path: &std::path::Path) -> Result<[u8; 32], String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    lockhub_proto::crypto::b64u_decode_32(text.trim()).ok_or_else(|| {
        format!(
            "{}: not a link key (base64url of 32 bytes, 43 characters)",
            path.display()
        )
    })
}

/// Writes a link key file (created 0600, then renamed into place).
pub fn write_key_file(path: &std::path::Path, key: &[u8; 32]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    writeln!(f, "{}", lockhub_proto::crypto::b64u_encode(key))?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_of_keys_names_a_door_by_index_or_by_name() {
        let doors = [("101".to_owned(), 0u8)];
        assert_eq!(
            Command::parse("101 482913#", &doors),
            Ok(Command::Keys {
                door: 0,
                keys: "482913#".into()
            })
        );
        assert_eq!(
            Command::parse("3 12 34#", &[]),
            Ok(Command::Keys {
                door: 3,
                keys: "1234#".into()
            })
        );
    }

    #[test]
    fn door_and_tamper_commands_parse() {
        assert_eq!(
            Command::parse("open 0", &[]),
            Ok(Command::Sensor {
                door: 0,
                open: true
            })
        );
        assert_eq!(
            Command::parse("close 2", &[]),
            Ok(Command::Sensor {
                door: 2,
                open: false
            })
        );
        assert_eq!(Command::parse("tamper", &[]), Ok(Command::Tamper));
    }

    #[test]
    fn bad_lines_are_refused_with_a_reason() {
        assert!(Command::parse("", &[]).is_err());
        assert!(Command::parse("open", &[]).is_err());
        assert!(Command::parse("16 1234#", &[]).is_err());
        assert!(Command::parse("0 12a4#", &[]).is_err());
        assert!(Command::parse("tamper now", &[]).is_err());
    }

    #[test]
    fn a_command_never_shows_its_keys() {
        let c = Command::parse("0 482913#", &[]).unwrap();
        assert!(!format!("{c:?}").contains("482913"));
    }

    #[test]
    fn every_command_is_echoed_with_the_doors_name_and_never_its_keys() {
        let doors = [("101".to_owned(), 0u8)];
        let echo = |l: &str| Command::parse(l, &doors).unwrap().echo(&doors);
        assert_eq!(echo("101 482913#"), "door 101: 7 keys pressed");
        assert_eq!(
            echo("101 482913"),
            "door 101: 6 keys pressed, no # at the end: the board sends the entry when # is pressed"
        );
        assert_eq!(echo("1 5#"), "door 1: 2 keys pressed");
        assert_eq!(echo("open 101"), "door 101: contact open");
        assert_eq!(echo("close 0"), "door 101: contact closed");
        assert_eq!(echo("tamper"), "tamper switch tripped");
        assert_eq!(
            SimEvent::RelayOpened { door: 0 }
                .line_for(&doors)
                .as_deref(),
            Some("door 101: relay open")
        );
    }

    #[test]
    fn only_feedback_events_become_lines() {
        assert_eq!(
            SimEvent::Denied {
                door: 1,
                locked_out: true
            }
            .line()
            .as_deref(),
            Some("door 1: denied (keypad locked out)")
        );
        assert_eq!(
            SimEvent::Sent(Uplink::Heartbeat { uptime_s: 1 }).line(),
            None
        );
    }
}
