//! One serial port: open it, talk to its board until the port goes away,
//! reopen it with backoff. The hub's end of the link runs here.
//!
//! ## The loop
//! One task per port owns the [`SerialStream`] and a fresh [`HubLink`] per
//! opening. Each iteration waits for whichever comes first: bytes from the
//! board, a finished door decision, a 20 ms tick (resends, pings, liveness,
//! held-open doors), or shutdown; then it writes whatever the link queued.
//! Nothing in that loop waits on the store: decisions run in their own
//! tasks (one at a time per door, see [`DecisionQueue`]) and audit writes
//! that need no answer go through the port's recorder. So a keypad at one
//! door never delays frames from another, and a slow disk never stops the
//! acks, pings and other ports.
//!
//! ## Losing the port
//! A USB adapter that is unplugged leaves a descriptor whose reads return
//! `Ok(0)` forever (or `EIO`); a pseudo-terminal whose master closed does the
//! same. Either ends the session: the port is closed and opened again by
//! path, with [`Backoff`], so a board that comes back under the same path
//! (`/dev/serial/by-id/...` is a symlink the kernel re-points) is picked up.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use firmware_bridge::{Downlink, FrameDecoder, HubLink, LinkError, LinkEvent, Uplink, to_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_serial::{SerialPortBuilderExt, SerialStream};

use super::doors::{DecisionQueue, DoorAlarm, DoorWatch, Queued};
use super::record::Record;
use super::{DoorSettings, PortShared, SerialError};
use crate::store::alerts::Condition;
use crate::store::audit::AuditKind;
use crate::store::links::LinkState;

/// How often the loop advances timers when the line is quiet. Well under
/// the link's 250 ms resend period, so resends go out on time.
const TICK: Duration = Duration::from_millis(20);
/// A write that takes longer than this means the port is wedged.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// A decided Unlock or Deny that the link cannot take yet (no Hello answer,
/// or eight messages already awaiting acks) waits this long at most. After
/// that the person has walked away, and an Unlock is recorded unconfirmed.
const DEFER_MAX_MS: u64 = 1_000;
/// Bound on decided commands waiting for the link (see [`DEFER_MAX_MS`]).
const DEFER_QUEUE_MAX: usize = 32;
/// Finished decisions waiting for the loop; decision tasks wait past it.
const DECIDED_QUEUE: usize = 32;

/// Reopen delays: `initial`, doubling up to `max`.
///
/// Why reset only after the board answered: a port that opens and then fails
/// at once (a half-dead adapter) would otherwise be reopened every 100 ms
/// forever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// The delay before the next attempt; the one after is twice as long.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// The board answered: the next failure starts from `initial` again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// Opens a port the way production opens `/dev/ttyAMA0`: 8N1 at `baud`,
/// exclusive.
pub fn open(path: &std::path::Path, baud: u32) -> Result<SerialStream, SerialError> {
    tokio_serial::new(path.to_string_lossy(), baud)
        .data_bits(tokio_serial::DataBits::Eight)
        .parity(tokio_serial::Parity::None)
        .stop_bits(tokio_serial::StopBits::One)
        .flow_control(tokio_serial::FlowControl::None)
        .open_native_async()
        .map_err(|source| SerialError::Open {
            path: path.to_owned(),
            source,
        })
}

/// The port's view of its board across openings: `board_offline` is about
/// the board, not about one opening of the port.
struct Presence {
    /// This run raised `board_offline` and has not cleared it. (One left
    /// over from a previous run is cleared by the first valid frame, which
    /// always clears.)
    offline: bool,
    last_frame: Instant,
    /// When `links.last_frame_at` was last stamped: at most every
    /// `FRAME_SEEN_EVERY_S`, since each write costs an fsync.
    last_frame_recorded: Option<Instant>,
}

impl Presence {
    /// A valid frame arrived: note it, and stamp the links table now and then.
    fn frame(&mut self, shared: &PortShared) {
        self.last_frame = Instant::now();
        let every = Duration::from_secs(crate::store::links::FRAME_SEEN_EVERY_S as u64);
        if self
            .last_frame_recorded
            .is_none_or(|t| t.elapsed() >= every)
        {
            self.last_frame_recorded = Some(self.last_frame);
            shared.record(Record::FrameSeen {
                serial: shared.port.name.clone(),
                at: shared.now(),
            });
        }
    }
}

/// Runs one port until `stop` says so: open, session, backoff, repeat.
pub(crate) async fn run_port(shared: Arc<PortShared>, mut stop: watch::Receiver<bool>) {
    let serial = shared.port.name.clone();
    let mut backoff = Backoff::new(shared.backoff_initial, shared.backoff_max);
    let mut presence = Presence {
        offline: false,
        last_frame: Instant::now(),
        last_frame_recorded: None,
    };
    let mut reported_absent = false;
    loop {
        if *stop.borrow() {
            break;
        }
        match open(&shared.port.path, shared.port.baud) {
            Ok(stream) => {
                reported_absent = false;
                tracing::info!(serial = %serial, path = %shared.port.path.display(), "serial port open");
                let mut session = Session::new(shared.clone());
                let end = session.run(stream, &mut stop, &mut presence).await;
                if session.heard_board {
                    backoff.reset();
                }
                session.finish();
                match end {
                    Ok(()) => break,
                    Err(e) => {
                        tracing::warn!(serial = %serial, error = %e, "serial port lost; reopening")
                    }
                }
            }
            Err(e) => {
                if !reported_absent {
                    tracing::warn!(serial = %serial, error = %e, "serial port cannot be opened; retrying");
                    reported_absent = true;
                    shared.record(Record::Link {
                        serial: serial.clone(),
                        state: LinkState::Absent,
                        at: shared.now(),
                    });
                } else {
                    tracing::debug!(serial = %serial, error = %e, "serial port still absent");
                }
            }
        }
        // No frames while the port is away: the board is offline after the
        // same silence as on an open port.
        let silent = presence.last_frame.elapsed();
        if silent >= Duration::from_millis(shared.link.down_after_ms) && !presence.offline {
            presence.offline = true;
            shared.record(Record::RaiseAlert {
                condition: Condition::BoardOffline,
                subject: serial.clone(),
                at: shared.now(),
            });
        }
        let delay = backoff.next_delay();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => break,
        }
    }
    tracing::info!(serial = %serial, "serial port task stopped");
}

/// A decided command waiting for the link to take it.
struct Deferred {
    msg: Downlink,
    /// For an Unlock: the door name and key, to record it unconfirmed.
    unlock: Option<(String, String)>,
    until_ms: u64,
}

/// What a decision task hands back.
pub(crate) struct Decided {
    pub door: u8,
    pub reply: super::doors::Reply,
}

/// One opening of the port: a fresh link, decoder and door state.
struct Session {
    shared: Arc<PortShared>,
    t0: Instant,
    link: HubLink,
    decoder: FrameDecoder<Uplink>,
    queue: DecisionQueue<firmware_bridge::Pin>,
    decided_tx: mpsc::Sender<Decided>,
    decided_rx: mpsc::Receiver<Decided>,
    /// Unlocks awaiting the board's Ack: seq -> (door name, key id).
    unlocks: HashMap<u16, (String, String)>,
    deferred: VecDeque<Deferred>,
    watches: HashMap<u8, DoorWatch>,
    /// A valid frame arrived during this session.
    heard_board: bool,
}

impl Session {
    fn new(shared: Arc<PortShared>) -> Self {
        let t0 = Instant::now();
        let mut link = HubLink::new(shared.link, 0);
        // A fresh session id per opening: the board forgets our old seqs.
        link.open_session(
            Downlink::Hello {
                session: rand::random::<u32>(),
            },
            0,
        );
        let (decided_tx, decided_rx) = mpsc::channel(DECIDED_QUEUE);
        Self {
            shared,
            t0,
            link,
            decoder: FrameDecoder::new(),
            queue: DecisionQueue::new(),
            decided_tx,
            decided_rx,
            unlocks: HashMap::new(),
            deferred: VecDeque::new(),
            watches: HashMap::new(),
            heard_board: false,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn serial(&self) -> &str {
        &self.shared.port.name
    }

    /// Talks to the board until the port fails (`Err`) or `stop` (`Ok`).
    async fn run(
        &mut self,
        mut stream: SerialStream,
        stop: &mut watch::Receiver<bool>,
        presence: &mut Presence,
    ) -> Result<(), SerialError> {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut buf = [0u8; 256];
        self.flush(&mut stream).await?;
        loop {
            tokio::select! {
                r = stream.read(&mut buf) => match r {
                    Ok(0) => return Err(SerialError::Eof),
                    Ok(n) => self.on_bytes(buf.get(..n).unwrap_or_default(), presence),
                    Err(e) => return Err(SerialError::Read(e)),
                },
                Some(d) = self.decided_rx.recv() => self.on_decided(d),
                _ = tick.tick() => {}
                _ = stop.changed() => return Ok(()),
            }
            self.poll(presence);
            self.flush(&mut stream).await?;
        }
    }

    /// Encodes and writes everything the link queued.
    async fn flush(&mut self, stream: &mut SerialStream) -> Result<(), SerialError> {
        let mut out = Vec::new();
        while let Some(msg) = self.link.pop_tx() {
            match to_frame(&msg) {
                Ok(f) => out.extend_from_slice(&f),
                Err(e) => {
                    tracing::error!(serial = %self.serial(), error = e.as_str(), "cannot encode a command")
                }
            }
        }
        if out.is_empty() {
            return Ok(());
        }
        match tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(&out)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(SerialError::Write(e)),
            Err(_) => Err(SerialError::WriteTimeout),
        }
    }

    fn on_bytes(&mut self, bytes: &[u8], presence: &mut Presence) {
        let now = self.now_ms();
        let mut msgs = Vec::new();
        for r in self.decoder.feed(bytes) {
            match r {
                Ok(m) => msgs.push(m),
                Err(e) => {
                    tracing::debug!(serial = %self.shared.port.name, reason = e.as_str(), "bad frame dropped")
                }
            }
        }
        for m in msgs {
            self.heard_board = true;
            presence.frame(&self.shared);
            if let Some(m) = self.link.on_rx(m, now) {
                self.on_uplink(m, now);
            }
        }
    }

    /// One message the link delivered (each seq once).
    fn on_uplink(&mut self, msg: Uplink, now: u64) {
        match msg {
            Uplink::Hello {
                board_id,
                fw_major,
                fw_minor,
                door_count,
            } => {
                tracing::info!(serial = %self.serial(), board_id, fw_major, fw_minor, door_count, "board hello");
                self.shared.record(Record::Hello {
                    serial: self.serial().to_owned(),
                    board_id,
                    fw: (fw_major, fw_minor),
                    at: self.shared.now(),
                });
            }
            Uplink::Keypad { door, pin, .. } => self.on_keypad(door, pin),
            Uplink::DoorSensor { door, open, .. } => {
                let target = self.shared.door(door);
                let alarm = self.watches.entry(door).or_default().sensor(open, now);
                tracing::info!(serial = %self.serial(), door = %target.name, open, "door sensor");
                if let Some(a) = alarm {
                    self.on_alarm(&target.name, a);
                }
            }
            Uplink::Tamper { .. } => {
                tracing::warn!(serial = %self.serial(), "board tamper");
                self.shared.record(Record::DoorEvent {
                    kind: AuditKind::BoardTamper,
                    door: self.serial().to_owned(),
                    at: self.shared.now(),
                });
            }
            Uplink::Heartbeat { .. } | Uplink::Pong { .. } | Uplink::Ack { .. } => {}
        }
    }

    fn on_keypad(&mut self, door: u8, pin: firmware_bridge::Pin) {
        let target = self.shared.door(door);
        tracing::info!(serial = %self.serial(), door = %target.name, known = target.known, "keypad entry");
        match self.queue.push(door, pin) {
            Queued::Start(pin) => self.start_decision(door, pin),
            Queued::Waiting => {}
            Queued::Full(_) => {
                // Fail closed: the entry is answered Deny without a
                // decision. Only a stuck store gets here.
                tracing::error!(serial = %self.serial(), door = %target.name, "too many keypad entries waiting; denied undecided");
                self.command(
                    Downlink::Deny {
                        seq: 0,
                        door,
                        reason: firmware_bridge::DenyReason::DENIED,
                    },
                    None,
                );
            }
        }
    }

    fn start_decision(&mut self, door: u8, pin: firmware_bridge::Pin) {
        let shared = self.shared.clone();
        let target = self.shared.door(door);
        let tx = self.decided_tx.clone();
        tokio::spawn(async move {
            let reply = super::doors::decide(&shared, &target, pin).await;
            let unlocked = match &reply {
                super::doors::Reply::Unlock { key_id } => Some(key_id.clone()),
                super::doors::Reply::Deny { .. } => None,
            };
            if tx.send(Decided { door, reply }).await.is_err()
                && let Some(key_id) = unlocked
            {
                // The port went away while deciding: the grant is on record
                // but the Unlock never went out.
                shared.record(Record::Unlock {
                    door: target.name.clone(),
                    key_id,
                    confirmed: false,
                    at: shared.now(),
                });
            }
        });
    }

    fn on_decided(&mut self, d: Decided) {
        let target = self.shared.door(d.door);
        match d.reply {
            super::doors::Reply::Unlock { key_id } => {
                let msg = Downlink::Unlock {
                    seq: 0,
                    door: d.door,
                    ms: target.unlock_ms,
                };
                self.command(msg, Some((target.name.clone(), key_id)));
            }
            super::doors::Reply::Deny { reason } => {
                self.command(
                    Downlink::Deny {
                        seq: 0,
                        door: d.door,
                        reason,
                    },
                    None,
                );
            }
        }
        if let Some(pin) = self.queue.done(d.door) {
            self.start_decision(d.door, pin);
        }
    }

    /// Hands a decided command to the link, or keeps it for a moment if the
    /// link cannot take it yet.
    fn command(&mut self, msg: Downlink, unlock: Option<(String, String)>) {
        let now = self.now_ms();
        match self.link.send(msg.clone(), now) {
            Ok(seq) => self.sent(msg, seq, unlock, now),
            Err(e @ (LinkError::NotReady | LinkError::PendingFull | LinkError::OutboxFull)) => {
                if self.deferred.len() >= DEFER_QUEUE_MAX {
                    tracing::error!(serial = %self.serial(), error = %e, "command queue full; dropped");
                    self.give_up(unlock);
                    return;
                }
                tracing::debug!(serial = %self.serial(), error = %e, "command deferred");
                self.deferred.push_back(Deferred {
                    msg,
                    unlock,
                    until_ms: now.saturating_add(DEFER_MAX_MS),
                });
            }
        }
    }

    fn sent(
        &mut self,
        msg: Downlink,
        seq: Option<u16>,
        unlock: Option<(String, String)>,
        now: u64,
    ) {
        if let (Downlink::Unlock { door, ms, .. }, Some(seq), Some((name, key_id))) =
            (&msg, seq, unlock)
        {
            tracing::info!(serial = %self.serial(), door = %name, key_id = %key_id, "unlock sent");
            self.watches.entry(*door).or_default().unlock_sent(now, *ms);
            self.unlocks.insert(seq, (name, key_id));
        }
    }

    fn give_up(&self, unlock: Option<(String, String)>) {
        if let Some((door, key_id)) = unlock {
            tracing::warn!(serial = %self.serial(), door = %door, key_id = %key_id, "unlock never sent");
            self.shared.record(Record::Unlock {
                door,
                key_id,
                confirmed: false,
                at: self.shared.now(),
            });
        }
    }

    /// Timers: link resends and liveness, deferred commands, doors.
    fn poll(&mut self, presence: &mut Presence) {
        let now = self.now_ms();
        // Deferred commands first, oldest first, while the link takes them.
        let mut waiting = std::mem::take(&mut self.deferred);
        while let Some(d) = waiting.pop_front() {
            if now >= d.until_ms {
                tracing::warn!(serial = %self.serial(), "command expired before the board was ready");
                self.give_up(d.unlock);
                continue;
            }
            match self.link.send(d.msg.clone(), now) {
                Ok(seq) => self.sent(d.msg, seq, d.unlock, now),
                Err(_) => {
                    self.deferred.push_back(d);
                    self.deferred.extend(waiting.drain(..));
                }
            }
        }

        self.link.poll(now);
        while let Some(ev) = self.link.pop_event() {
            self.on_link_event(ev, presence);
        }

        let held_ms = u64::from(self.shared.policy.held_open_s).saturating_mul(1000);
        let mut alarms = Vec::new();
        for (door, w) in &mut self.watches {
            if let Some(a) = w.poll(now, held_ms) {
                alarms.push((*door, a));
            }
        }
        for (door, a) in alarms {
            let name = self.shared.door(door).name;
            self.on_alarm(&name, a);
        }
    }

    fn on_link_event(&mut self, ev: LinkEvent<Downlink>, presence: &mut Presence) {
        let at = self.shared.now();
        match ev {
            LinkEvent::Acked(Downlink::Unlock { seq, .. }) => {
                if let Some((door, key_id)) = self.unlocks.remove(&seq) {
                    tracing::info!(serial = %self.serial(), door = %door, key_id = %key_id, "unlock confirmed");
                    self.shared.record(Record::Unlock {
                        door,
                        key_id,
                        confirmed: true,
                        at,
                    });
                }
            }
            LinkEvent::Failed(Downlink::Unlock { seq, .. }) => {
                if let Some((door, key_id)) = self.unlocks.remove(&seq) {
                    tracing::warn!(serial = %self.serial(), door = %door, key_id = %key_id, "unlock unconfirmed");
                    self.shared.record(Record::Unlock {
                        door,
                        key_id,
                        confirmed: false,
                        at,
                    });
                }
            }
            LinkEvent::Failed(Downlink::Deny { door, .. }) => {
                tracing::debug!(serial = %self.serial(), door, "deny unacknowledged");
            }
            LinkEvent::Acked(_) | LinkEvent::Failed(_) => {}
            LinkEvent::Down => {
                tracing::warn!(serial = %self.serial(), "board offline");
                self.shared.record(Record::Link {
                    serial: self.serial().to_owned(),
                    state: LinkState::Down,
                    at,
                });
                if !presence.offline {
                    presence.offline = true;
                    self.shared.record(Record::RaiseAlert {
                        condition: Condition::BoardOffline,
                        subject: self.serial().to_owned(),
                        at,
                    });
                }
            }
            LinkEvent::Up => {
                tracing::info!(serial = %self.serial(), "board online");
                presence.offline = false;
                self.shared.record(Record::Link {
                    serial: self.serial().to_owned(),
                    state: LinkState::Up,
                    at,
                });
                // Always: the alert may be left over from before a restart.
                self.shared.record(Record::ClearAlert {
                    condition: Condition::BoardOffline,
                    subject: self.serial().to_owned(),
                    at,
                });
            }
        }
    }

    fn on_alarm(&self, door: &str, alarm: DoorAlarm) {
        let at = self.shared.now();
        match alarm {
            DoorAlarm::Forced => {
                tracing::warn!(serial = %self.serial(), door = %door, "door forced");
                self.shared.record(Record::DoorEvent {
                    kind: AuditKind::DoorForced,
                    door: door.to_owned(),
                    at,
                });
            }
            DoorAlarm::HeldOpen => {
                tracing::warn!(serial = %self.serial(), door = %door, "door held open");
                self.shared.record(Record::DoorEvent {
                    kind: AuditKind::DoorHeldOpen,
                    door: door.to_owned(),
                    at,
                });
            }
            DoorAlarm::Closed { forced, held_open } => {
                for (raised, condition) in [
                    (forced, Condition::DoorForced),
                    (held_open, Condition::DoorHeldOpen),
                ] {
                    if raised {
                        self.shared.record(Record::ClearAlert {
                            condition,
                            subject: door.to_owned(),
                            at,
                        });
                    }
                }
            }
        }
    }

    /// The session is over: Unlocks still awaiting an Ack, or never sent,
    /// are recorded unconfirmed.
    fn finish(&mut self) {
        let pending: Vec<_> = self.unlocks.drain().map(|(_, v)| v).collect();
        for u in pending {
            self.give_up(Some(u));
        }
        for d in std::mem::take(&mut self.deferred) {
            self.give_up(d.unlock);
        }
    }
}

/// What a door index on this port is called.
#[derive(Debug, Clone)]
pub(crate) struct DoorTarget {
    pub name: String,
    pub known: bool,
    pub unlock_ms: u16,
}

impl DoorTarget {
    pub(crate) fn for_index(serial: &str, doors: &[DoorSettings], index: u8) -> Self {
        match doors.iter().find(|d| d.index == index) {
            Some(d) => DoorTarget {
                name: d.name.clone(),
                known: true,
                unlock_ms: d.unlock_ms,
            },
            // A label for the audit row and the logs. Whatever it reads,
            // the entry is decided `unknown_door` (`known: false`), which
            // consults and counts no lockout.
            None => DoorTarget {
                name: format!("{serial}:{index}"),
                known: false,
                unlock_ms: 0,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_starts_small_and_doubles_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let got: Vec<u64> = (0..9).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(got, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
    }

    #[test]
    fn backoff_starts_over_after_a_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        b.next_delay();
        b.next_delay();
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn an_unconfigured_door_index_gets_a_label_no_door_can_have() {
        let doors = [DoorSettings {
            name: "101".into(),
            index: 0,
            unlock_ms: 5000,
        }];
        let t = DoorTarget::for_index("board-a", &doors, 0);
        assert!(t.known);
        assert_eq!(t.name, "101");
        let t = DoorTarget::for_index("board-a", &doors, 7);
        assert!(!t.known);
        assert_eq!(t.name, "board-a:7");
    }
}
