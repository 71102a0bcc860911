//! One serial port: open it, talk to its board until the port goes away,
//! reopen it with backoff. The hub's end of the link runs here.
//!
//! ## The loop
//! One task per port owns the [`SerialStream`] and a fresh [`HubLink`] per
//! opening. Each iteration waits for whichever comes first: bytes from the
//! board, a finished door decision, a 20 ms tick (resends, pings, liveness,
//! held-open doors), or shutdown; then it writes whatever the link queued.
//! Nothing in that loop waits on the store: decisions run in their own
//! tasks (one at a time per door, see [`crate::door::entry::DecisionQueue`]) and audit writes
//! that need no answer go through the port's recorder. So a keypad at one
//! door never delays frames from another, and a slow disk never stops the
//! acks, pings and other ports.
//!
//! ## Losing the port
//! A USB adapter that is unplugged leaves a descriptor whose reads return
//! `Ok(0)` forever (or `EIO`); a pseudo-terminal whose master closed does the
//! same. Either ends the session: the port is closed and opened again by
//! path, with [`Backoff`](crate::runtime::backoff::Backoff), so a board that comes back under the same path
//! (`/dev/serial/by-id/...` is a symlink the kernel re-points) is picked up.
//!
//! ## Doors across openings
//! The link is per opening; the doors are not. The sensor watches and the
//! flood limit (`PortDoors`) carry over from one session to the next, and
//! each door's last reported state is also kept in `door_state`, read once
//! when the port task starts, so neither a port reset nor a hub restart
//! forgets an open or forced door. (The board reports levels only on
//! change, and every door again after the hub's Hello.) A session that ends
//! still finishes every decision it acked (see `Session::finish`).

use crate::drivers::open;
use crate::runtime::backoff::Backoff;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use firmware_bridge::link::PENDING_MAX;
use firmware_bridge::seal::DropCause;
use firmware_bridge::{
    Downlink, FrameDecoder, HubLink, LinkError, LinkEvent, LinkKey, PayloadDecoder, Uplink,
    to_frame,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_serial::SerialStream;

use super::doors::Reply;
use super::record::Record;
use super::{DoorSettings, LinkMode, PortShared, SerialError};
use crate::door::entry::{DecisionQueue, Queued};
use crate::door::sensor::{Admit, DoorWatch, FloodLimit};
use crate::store::alerts::Change;
use crate::store::door::DoorEvent;
use crate::store::links::{CounterWrites, LinkState};
use lockhub_proto::outputs::Condition;
use lockhub_proto::time::Timestamp;

mod keypad;
pub(crate) mod sealing;

use sealing::{FaultAlert, SealDrops, SealEnd, SealRx};

/// How often the loop advances timers when the line is quiet. Well under
/// the link's 250 ms resend period, so resends go out on time.
const TICK: Duration = Duration::from_millis(20);
/// A write that takes longer than this means the port is wedged.
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// serial.md: the person at the door gets the answer within 3 s of the
/// Keypad. A decided Unlock or Deny that the link cannot take yet (no Hello
/// answer, or eight messages already awaiting acks) waits until then at
/// most: after that the person has walked away, and an Unlock is recorded
/// unconfirmed.
const ANSWER_BY: Duration = Duration::from_secs(3);
/// Bound on decided commands waiting for the link (see [`ANSWER_BY`]).
const DEFER_QUEUE_MAX: usize = 32;
/// Finished decisions waiting for the loop; decision tasks wait past it.
const DECIDED_QUEUE: usize = 32;
/// Link slots awaiting an Ack that a flood's `Deny` answers may not take,
/// so the decisions at other doors (an Unlock among them) always find room.
const FLOOD_SPARE_SLOTS: usize = PENDING_MAX / 2;
/// Door indexes a board can have (serial.md: 0..=15).
const BOARD_DOORS: u8 = crate::config::MAX_DOOR_INDEX + 1;

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
    /// Bad frames dropped since the daemon started (serial.md: "dropped
    /// and counted"), and when `link_counters` is due to be written.
    bad_frames: u64,
    bad_frames_recorded: CounterWrites<u64>,
    /// The sealed link's drops in openings that ended (each opening counts
    /// its own), and when `link_seal` is due to be written.
    seal_drops_before: SealDrops,
    seal_recorded: CounterWrites<(Option<Timestamp>, SealDrops)>,
}

impl Presence {
    fn new() -> Presence {
        Presence {
            offline: false,
            last_frame: Instant::now(),
            last_frame_recorded: None,
            bad_frames: 0,
            bad_frames_recorded: CounterWrites::default(),
            seal_drops_before: SealDrops::default(),
            seal_recorded: CounterWrites::default(),
        }
    }

    /// Writes the link's sealing for `lockhub status` when due (`force`:
    /// the session changed, or at stop). `since`: when the current sealed
    /// session started; `now_drops`: the current opening's drops.
    fn write_seal(
        &mut self,
        shared: &PortShared,
        since: Option<Timestamp>,
        now_drops: SealDrops,
        force: bool,
    ) {
        let drops = self.seal_drops_before.plus(now_drops);
        if self.seal_recorded.due((since, drops), force) {
            shared.record(Record::Seal {
                serial: shared.port.name.clone(),
                sealed: matches!(shared.port.link_mode, LinkMode::Sealed(_)),
                session_since: since,
                drops,
                at: shared.now(),
            });
        }
    }

    /// Writes the bad-frame count when [`CounterWrites`] says it is due
    /// (`force`: at stop).
    fn write_bad_frames(&mut self, shared: &PortShared, force: bool) {
        if self.bad_frames_recorded.due(self.bad_frames, force) {
            shared.record(Record::BadFrames {
                serial: shared.port.name.clone(),
                count: self.bad_frames,
                at: shared.now(),
            });
        }
    }

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
pub(crate) async fn run_port(
    shared: Arc<PortShared>,
    mut stop: watch::Receiver<bool>,
    mut unlocks: mpsc::Receiver<crate::drivers::BoardUnlock>,
) {
    let serial = shared.port.name.clone();
    // Reopen delays: `backoff_initial`, doubling up to `backoff_max`, reset
    // only after the board answered: a port that opens and then fails at
    // once (a half-dead adapter) would otherwise be reopened every 100 ms
    // forever. No jitter: one hub alone waits on its port.
    let mut backoff = Backoff::new(shared.backoff_initial, shared.backoff_max);
    let mut presence = Presence::new();
    presence.write_bad_frames(&shared, false);
    presence.write_seal(&shared, None, SealDrops::default(), true);
    if shared.port.link_mode == LinkMode::Plain {
        // serial.md, "Sealed link": a plain board raises `link_insecure`
        // while it is in use (housekeeping ends it once the config keys
        // the serial or drops it).
        tracing::warn!(serial = %serial, "insecure_plaintext: this board's link is not sealed");
        shared.record(Record::Alert {
            change: Change::Raise,
            condition: Condition::LinkInsecure,
            subject: serial.clone(),
            at: shared.now(),
        });
    }
    let mut reported_absent = false;
    let mut doors = Some(PortDoors::load(&shared).await);
    // Sessions still finishing their decisions (see `Session::finish`).
    let mut finishing: Vec<JoinHandle<()>> = Vec::new();
    loop {
        if *stop.borrow() {
            break;
        }
        match open(&shared.port.path, shared.port.baud) {
            Ok(stream) => {
                reported_absent = false;
                tracing::info!(serial = %serial, path = %shared.port.path.display(), "serial port open");
                let carried = doors.take().unwrap_or_else(PortDoors::new);
                let mut session = Session::new(shared.clone(), carried);
                let end = session
                    .run(stream, &mut stop, &mut presence, &mut unlocks)
                    .await;
                if session.heard_board {
                    backoff.reset();
                }
                if let Some(seal) = &session.seal {
                    presence.seal_drops_before = presence.seal_drops_before.plus(seal.drops());
                }
                presence.write_seal(&shared, None, SealDrops::default(), true);
                let (carried, rest) = session.finish();
                doors = Some(carried);
                finishing.retain(|t| !t.is_finished());
                finishing.push(rest);
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
                        board_offline: None,
                        at: shared.now(),
                    });
                } else {
                    tracing::debug!(serial = %serial, error = %e, "serial port still absent");
                }
            }
        }
        // Board grants from another driver (a reader's PIN) that can no
        // longer reach the board: on record unconfirmed at once.
        while let Ok(u) = unlocks.try_recv() {
            let door = shared.door(u.door).name;
            tracing::warn!(serial = %serial, door = %door, key_id = %u.key_id, "unlock never sent: the port is away");
            shared.recorder.unlock(&door, u.key_id, false, shared.now());
        }
        // No frames while the port is away: the board is offline after the
        // same silence as on an open port.
        let silent = presence.last_frame.elapsed();
        if silent >= Duration::from_millis(shared.link.down_after_ms) && !presence.offline {
            presence.offline = true;
            shared.record(Record::Alert {
                change: Change::Raise,
                condition: Condition::BoardOffline,
                subject: serial.clone(),
                at: shared.now(),
            });
        }
        let delay = backoff.next_step();
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.changed() => break,
        }
    }
    presence.write_bad_frames(&shared, true);
    presence.write_seal(&shared, None, SealDrops::default(), true);
    for task in finishing {
        let _ = task.await;
    }
    tracing::info!(serial = %serial, "serial port task stopped");
}

/// What the port knows of its doors across openings: the sensor watches
/// (durable through `door_state`, so a restart does not forget an open or
/// forced door) and the flood limit, on one monotonic clock.
struct PortDoors {
    t0: Instant,
    watches: HashMap<u8, DoorWatch>,
    flood: FloodLimit<u8>,
}

impl PortDoors {
    fn new() -> Self {
        Self {
            t0: Instant::now(),
            watches: HashMap::new(),
            flood: FloodLimit::new(),
        }
    }

    /// Every door index's last reported state, as the previous run left it.
    /// Read on a reader connection (WAL: it never waits on the writer), so
    /// a stalled store does not keep the port closed; if it fails, the
    /// doors start unknown, as before the table existed.
    async fn load(shared: &PortShared) -> Self {
        let mut doors = Self::new();
        let names: Vec<String> = (0..BOARD_DOORS).map(|i| shared.door(i).name).collect();
        let store = shared.store.clone();
        let wanted = names.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let conn = store.reader()?;
            crate::store::door::door_states(&conn, &wanted)
        })
        .await;
        match loaded {
            Ok(Ok(states)) => {
                let now = shared.now();
                for (name, state) in states {
                    let Some(i) = names
                        .iter()
                        .position(|n| *n == name)
                        .and_then(|i| u8::try_from(i).ok())
                    else {
                        continue;
                    };
                    // A state left for an index no door names (an older
                    // run watched them) is housekeeping's to forget, with
                    // its alerts (`maintenance::Configured`).
                    if shared.door(i).known {
                        doors.watches.insert(i, DoorWatch::restore(state, 0, now));
                    }
                }
            }
            Ok(Err(e)) => {
                tracing::error!(serial = %shared.port.name, error = %e, "cannot read the doors' last states")
            }
            Err(e) => {
                tracing::error!(serial = %shared.port.name, error = %e, "cannot read the doors' last states")
            }
        }
        doors
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
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
    /// When the Keypad arrived: the answer is due [`ANSWER_BY`] after it.
    pub received: std::time::Instant,
}

/// One opening of the port: a fresh link and decoder; the doors carried
/// over from the previous opening.
struct Session {
    shared: Arc<PortShared>,
    link: HubLink,
    decoder: Decoder,
    /// The hub's end of the sealed link; `None` on a plain port.
    seal: Option<SealEnd>,
    /// When the current sealed session was confirmed.
    session_at: Option<Timestamp>,
    /// This opening logged a failed handshake already.
    said_bad_handshake: bool,
    /// Encoded frames to write, moved out of the link after every message
    /// so a burst of frames never overflows the link's outbox.
    out: Vec<u8>,
    /// Each entry with the moment it was acked: its 3 s answer bound
    /// (serial.md 'Door decisions') counts from there, not from when its
    /// turn at the door comes.
    queue: DecisionQueue<(firmware_bridge::Pin, std::time::Instant)>,
    /// The decision in flight at each door.
    inflight: HashMap<u8, JoinHandle<()>>,
    decided_tx: mpsc::Sender<Decided>,
    decided_rx: mpsc::Receiver<Decided>,
    /// Unlocks awaiting the board's Ack: seq -> (door index, door name, key id).
    unlocks: HashMap<u16, (u8, String, String)>,
    deferred: VecDeque<Deferred>,
    doors: PortDoors,
    /// The `door_count` of this opening's board Hello, once it came.
    board_doors: Option<u8>,
    /// A valid frame arrived during this session.
    heard_board: bool,
}

/// The port's frame decoder: messages on a plain port, payloads (sealed
/// or the plain handshake) on a sealed one.
enum Decoder {
    Plain(FrameDecoder<Uplink>),
    Sealed(PayloadDecoder),
}

impl Session {
    fn new(shared: Arc<PortShared>, doors: PortDoors) -> Self {
        let now = doors.now_ms();
        let mut link = HubLink::new(shared.link, now);
        let (decoder, seal) = match &shared.port.link_mode {
            LinkMode::Plain => {
                // A fresh session id per opening: the board forgets our old seqs.
                link.open_session(
                    Downlink::Hello {
                        session: rand::random::<u32>(),
                    },
                    now,
                );
                (Decoder::Plain(FrameDecoder::new()), None)
            }
            // The SealHello replaces the plain Hello; the link is not
            // ready (no Unlock) until the board's sealed Hello.
            LinkMode::Sealed(key) => (
                Decoder::Sealed(PayloadDecoder::new()),
                Some(SealEnd::new(LinkKey::from_bytes(*key), now)),
            ),
        };
        let (decided_tx, decided_rx) = mpsc::channel(DECIDED_QUEUE);
        Self {
            shared,
            link,
            decoder,
            seal,
            session_at: None,
            said_bad_handshake: false,
            out: Vec::new(),
            queue: DecisionQueue::new(),
            inflight: HashMap::new(),
            decided_tx,
            decided_rx,
            unlocks: HashMap::new(),
            deferred: VecDeque::new(),
            doors,
            board_doors: None,
            heard_board: false,
        }
    }

    fn now_ms(&self) -> u64 {
        self.doors.now_ms()
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
        unlocks: &mut mpsc::Receiver<crate::drivers::BoardUnlock>,
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
                Some(u) = unlocks.recv() => self.on_board_unlock(u),
                _ = tick.tick() => {}
                _ = stop.changed() => return Ok(()),
            }
            self.poll(presence);
            self.flush(&mut stream).await?;
        }
    }

    /// Encodes what the link queued into `out`: plain, or sealed in the
    /// current session after the handshake's own frames. Without a session
    /// nothing of the link goes out (serial.md: an Unlock is never sent
    /// outside a confirmed session; the link resends what needs it).
    fn take_tx(&mut self) {
        let now = self.now_ms();
        if let Some(seal) = &mut self.seal {
            while let Some(f) = seal.pop_out() {
                self.out.extend_from_slice(&f);
            }
            while let Some(msg) = self.link.pop_tx() {
                if let Some(f) = seal.seal(&msg, now) {
                    self.out.extend_from_slice(&f);
                }
            }
            // Sealing may have asked for a new session (counter exhausted).
            while let Some(f) = seal.pop_out() {
                self.out.extend_from_slice(&f);
            }
            return;
        }
        while let Some(msg) = self.link.pop_tx() {
            match to_frame(&msg) {
                Ok(f) => self.out.extend_from_slice(&f),
                Err(e) => {
                    tracing::error!(serial = %self.serial(), error = e.as_str(), "cannot encode a command")
                }
            }
        }
    }

    /// Encodes and writes everything queued.
    async fn flush(&mut self, stream: &mut SerialStream) -> Result<(), SerialError> {
        self.take_tx();
        let out = std::mem::take(&mut self.out);
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
        match &mut self.decoder {
            Decoder::Plain(decoder) => {
                for r in decoder.feed(bytes) {
                    match r {
                        Ok(m) => msgs.push(m),
                        Err(e) => {
                            presence.bad_frames += 1;
                            tracing::debug!(serial = %self.shared.port.name, reason = e.as_str(), "bad frame dropped")
                        }
                    }
                }
            }
            Decoder::Sealed(decoder) => {
                let Some(seal) = &mut self.seal else {
                    return;
                };
                let mut got = Vec::new();
                for &b in bytes {
                    match decoder.push(b) {
                        None => {}
                        Some(Ok(payload)) => got.push(seal.on_payload(payload, now)),
                        Some(Err(e)) => {
                            seal.frame_error(e);
                            presence.bad_frames += 1;
                            tracing::debug!(serial = %self.shared.port.name, reason = e.as_str(), "bad frame dropped")
                        }
                    }
                }
                for (rx, alert) in got {
                    if let Some(m) = self.on_sealed(rx, presence) {
                        msgs.push(m);
                    }
                    self.fault_alert(alert);
                }
            }
        }
        for m in msgs {
            self.heard_board = true;
            presence.frame(&self.shared);
            if let Some(m) = self.link.on_rx(m, now) {
                self.on_uplink(m, now);
            }
            self.take_tx();
        }
        self.take_tx();
    }

    /// What the sealed end made of a payload; a verified message is
    /// returned for supervision and the link (only those count).
    fn on_sealed(&mut self, rx: SealRx, presence: &mut Presence) -> Option<Uplink> {
        match rx {
            SealRx::Message(m) => Some(m),
            SealRx::Quiet => None,
            SealRx::SessionStarted { board_id } => {
                tracing::info!(serial = %self.serial(), board_id, "sealed session confirmed");
                self.new_link();
                self.session_at = Some(self.shared.now());
                let drops = self.seal.as_ref().map(SealEnd::drops).unwrap_or_default();
                presence.write_seal(&self.shared, self.session_at, drops, true);
                None
            }
            SealRx::Dropped { cause, fault } => {
                // Once per opening at error level (a board with another
                // key retries every few seconds); each drop at debug, as
                // a flood of frames must not flood the log: the counts
                // are in `lockhub status` and the alert says it happens.
                if cause == DropCause::BadHandshake && !self.said_bad_handshake {
                    self.said_bad_handshake = true;
                    tracing::error!(serial = %self.serial(), "the board's handshake does not verify: it holds another link key than this serial's [[board_key]] (or something on the wire answers for it); no session, no Unlock");
                } else {
                    tracing::debug!(serial = %self.serial(), cause = cause.as_str(), fault, "sealed link: frame dropped");
                }
                None
            }
        }
    }

    /// A new sealed session: the link starts afresh (seqs from 1, not
    /// ready until the board's sealed Hello); an Unlock the old session
    /// never saw acked is recorded unconfirmed (serial.md, "Session").
    fn new_link(&mut self) {
        let pending: Vec<_> = self.unlocks.drain().map(|(_, v)| v).collect();
        for (_, door, key_id) in pending {
            self.give_up(Some((door, key_id)));
        }
        self.link = HubLink::new(self.shared.link, self.now_ms());
        self.board_doors = None;
    }

    fn fault_alert(&mut self, alert: Option<FaultAlert>) {
        let Some(alert) = alert else {
            return;
        };
        let change = match alert {
            FaultAlert::Raise => {
                tracing::warn!(serial = %self.serial(), "board_link_fault raised");
                Change::Raise
            }
            FaultAlert::Clear => Change::Clear,
        };
        self.shared.record(Record::Alert {
            change,
            condition: Condition::BoardLinkFault,
            subject: self.serial().to_owned(),
            at: self.shared.now(),
        });
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
                self.on_door_count(door_count);
            }
            Uplink::Keypad { door, pin, .. } => self.on_keypad(door, pin, now),
            Uplink::DoorSensor { door, open, .. } => self.on_sensor(door, open, now),
            Uplink::Tamper { .. } => {
                tracing::warn!(serial = %self.serial(), "board tamper");
                self.shared.record(Record::DoorEvent {
                    kind: DoorEvent::Tamper,
                    door: self.serial().to_owned(),
                    at: self.shared.now(),
                });
            }
            Uplink::Heartbeat { .. } | Uplink::Pong { .. } | Uplink::Ack { .. } => {}
            // The handshake is the sealed end's (`sealing`), before the
            // link; pairing and rekey are `lockhub board`'s, with the
            // daemon stopped. Sealed inside a session they mean nothing.
            Uplink::SealHello { .. }
            | Uplink::PairReply { .. }
            | Uplink::PairDone { .. }
            | Uplink::RekeyReply { .. } => {}
        }
    }

    /// serial.md: a configured door at or past the board's `door_count` is
    /// a `board_mismatch`; a Hello that covers it clears it (always, as the
    /// alert may be left over from before a restart).
    fn on_door_count(&mut self, door_count: u8) {
        self.board_doors = Some(door_count);
        let at = self.shared.now();
        for d in &self.shared.port.doors {
            let subject = d.name.clone();
            if d.index >= door_count {
                tracing::error!(serial = %self.serial(), door = %d.name, index = d.index, door_count, "the board does not have this door");
                self.shared.record(Record::Alert {
                    change: Change::Raise,
                    condition: Condition::BoardMismatch,
                    subject,
                    at,
                });
            } else {
                self.shared.record(Record::Alert {
                    change: Change::Clear,
                    condition: Condition::BoardMismatch,
                    subject,
                    at,
                });
            }
        }
    }

    /// Whether this opening's board said it has door `index`.
    fn board_has(&self, index: u8) -> bool {
        self.board_doors.is_some_and(|n| index < n)
    }

    fn on_sensor(&mut self, door: u8, open: bool, now: u64) {
        let target = self.shared.door(door);
        if !target.known {
            // An input no [[door]] names (an unused contact often reads
            // open): no door, so no forced or held-open door to raise.
            tracing::debug!(serial = %self.serial(), door = %target.name, open, "sensor of an unnamed door index ignored");
            return;
        }
        let at = self.shared.now();
        let report = self
            .doors
            .watches
            .entry(door)
            .or_default()
            .report(open, now, at);
        tracing::info!(serial = %self.serial(), door = %target.name, open, "door sensor");
        if let Some((state, alarm)) = report {
            self.shared
                .recorder
                .door_state(&target.name, state, alarm, at);
        }
    }

    /// Hands a decided command to the link, or keeps it until [`ANSWER_BY`]
    /// after the Keypad (`received`) if the link cannot take it yet.
    fn command(
        &mut self,
        msg: Downlink,
        unlock: Option<(String, String)>,
        received: std::time::Instant,
    ) {
        let now = self.now_ms();
        let sent = if self.seal.as_ref().is_some_and(|s| !s.has_session()) {
            Err(LinkError::NotReady)
        } else {
            self.link.send(msg.clone(), now)
        };
        match sent {
            Ok(seq) => self.sent(msg, seq, unlock, now),
            Err(e @ (LinkError::NotReady | LinkError::PendingFull | LinkError::OutboxFull)) => {
                if self.deferred.len() >= DEFER_QUEUE_MAX {
                    // Room for an Unlock at the expense of the oldest Deny
                    // (its entry is on record; only its red light is lost).
                    let deny = self.deferred.iter().position(|d| d.unlock.is_none());
                    match deny {
                        Some(i) if unlock.is_some() => {
                            self.deferred.remove(i);
                            tracing::warn!(serial = %self.serial(), "command queue full; the oldest deferred Deny dropped for an Unlock");
                        }
                        _ => {
                            tracing::error!(serial = %self.serial(), error = %e, "command queue full; dropped");
                            self.give_up(unlock);
                            return;
                        }
                    }
                }
                tracing::debug!(serial = %self.serial(), error = %e, "command deferred");
                self.deferred.push_back(Deferred {
                    msg,
                    unlock,
                    until_ms: now.saturating_add(
                        (received + ANSWER_BY)
                            .saturating_duration_since(std::time::Instant::now())
                            .as_millis() as u64,
                    ),
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
            self.doors
                .watches
                .entry(*door)
                .or_default()
                .unlock_sent(now, *ms);
            self.unlocks.insert(seq, (*door, name, key_id));
        }
    }

    fn give_up(&self, unlock: Option<(String, String)>) {
        if let Some((door, key_id)) = unlock {
            tracing::warn!(serial = %self.serial(), door = %door, key_id = %key_id, "unlock never sent");
            self.shared
                .recorder
                .unlock(&door, key_id, false, self.shared.now());
        }
    }

    /// Timers: link resends and liveness, deferred commands, doors.
    fn poll(&mut self, presence: &mut Presence) {
        presence.write_bad_frames(&self.shared, false);
        let now = self.now_ms();
        // Deferred commands first, oldest first, while the link takes them.
        let mut waiting = std::mem::take(&mut self.deferred);
        while let Some(d) = waiting.pop_front() {
            if now >= d.until_ms {
                tracing::warn!(serial = %self.serial(), "command expired before the board was ready");
                self.give_up(d.unlock);
                continue;
            }
            let sent = if self.seal.as_ref().is_some_and(|s| !s.has_session()) {
                Err(LinkError::NotReady)
            } else {
                self.link.send(d.msg.clone(), now)
            };
            match sent {
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
        if let Some(seal) = &mut self.seal {
            let alert = seal.poll(now);
            let drops = seal.drops();
            if !seal.has_session() {
                self.session_at = None;
            }
            self.fault_alert(alert);
            presence.write_seal(&self.shared, self.session_at, drops, false);
        }

        let held_ms = u64::from(self.shared.policy.held_open_s).saturating_mul(1000);
        let mut alarms = Vec::new();
        for (door, w) in &mut self.doors.watches {
            if let Some(a) = w.poll(now, held_ms) {
                alarms.push((*door, w.state(), a));
            }
        }
        for (door, state, a) in alarms {
            let name = self.shared.door(door).name;
            self.shared
                .recorder
                .door_state(&name, state, Some(a), self.shared.now());
        }

        for (door, count) in self.doors.flood.poll(now) {
            let name = self.shared.door(door).name;
            self.shared.recorder.flood(&name, count, self.shared.now());
        }
    }

    fn on_link_event(&mut self, ev: LinkEvent<Downlink>, presence: &mut Presence) {
        let at = self.shared.now();
        match ev {
            LinkEvent::Acked(Downlink::Unlock { seq, .. }) => {
                if let Some((index, door, key_id)) = self.unlocks.remove(&seq) {
                    // A board acks every command, also for a door it does
                    // not have (serial.md 'board_mismatch'): that Ack
                    // confirms nothing.
                    let confirmed = self.board_has(index);
                    if confirmed {
                        tracing::info!(serial = %self.serial(), door = %door, key_id = %key_id, "unlock confirmed");
                    } else {
                        tracing::warn!(serial = %self.serial(), door = %door, key_id = %key_id, "unlock acked by a board without this door; unconfirmed");
                    }
                    self.shared.recorder.unlock(&door, key_id, confirmed, at);
                }
            }
            LinkEvent::Failed(Downlink::Unlock { seq, .. }) => {
                if let Some((_, door, key_id)) = self.unlocks.remove(&seq) {
                    tracing::warn!(serial = %self.serial(), door = %door, key_id = %key_id, "unlock unconfirmed");
                    self.shared.recorder.unlock(&door, key_id, false, at);
                }
            }
            LinkEvent::Failed(Downlink::Deny { door, .. }) => {
                tracing::debug!(serial = %self.serial(), door, "deny unacknowledged");
            }
            LinkEvent::Acked(_) | LinkEvent::Failed(_) => {}
            LinkEvent::Down => {
                tracing::warn!(serial = %self.serial(), "board offline");
                let raise = !presence.offline;
                presence.offline = true;
                self.shared.record(Record::Link {
                    serial: self.serial().to_owned(),
                    state: LinkState::Down,
                    board_offline: raise.then_some(Change::Raise),
                    at,
                });
            }
            LinkEvent::Up => {
                tracing::info!(serial = %self.serial(), "board online");
                presence.offline = false;
                // Always clears: the alert may be left over from before a restart.
                self.shared.record(Record::Link {
                    serial: self.serial().to_owned(),
                    state: LinkState::Up,
                    board_offline: Some(Change::Clear),
                    at,
                });
            }
        }
    }

    /// The session is over, and every acked Keypad still ends in an audit
    /// row (serial.md 'Door decisions'): the decisions in flight finish,
    /// the entries waiting behind them are decided in order, and the flood
    /// counts are written. A grant that can no longer reach the board, and
    /// every Unlock awaiting an Ack, is recorded unconfirmed. Returns the
    /// doors for the next opening, and the task finishing the decisions:
    /// the port reopens without waiting for it (a slow store must not keep
    /// the doors off the line), and the port task awaits it before it stops.
    fn finish(mut self) -> (PortDoors, JoinHandle<()>) {
        let pending: Vec<_> = self.unlocks.drain().map(|(_, v)| v).collect();
        for (_, door, key_id) in pending {
            self.give_up(Some((door, key_id)));
        }
        for d in std::mem::take(&mut self.deferred) {
            self.give_up(d.unlock);
        }
        let now = self.now_ms();
        for (door, count) in self.doors.flood.drain(now) {
            let name = self.shared.door(door).name;
            self.shared.recorder.flood(&name, count, self.shared.now());
        }

        let mut inflight = std::mem::take(&mut self.inflight);
        let mut doors = JoinSet::new();
        for (door, waiting) in self.queue.take_waiting() {
            let shared = self.shared.clone();
            let before = inflight.remove(&door);
            doors.spawn(async move {
                if let Some(task) = before {
                    let _ = task.await;
                }
                let target = shared.door(door);
                for (pin, received) in waiting {
                    if let Reply::Unlock { key_id } =
                        super::doors::decide(&shared, &target, pin, received).await
                    {
                        tracing::warn!(serial = %shared.port.name, door = %target.name, key_id = %key_id, "granted after the port closed; unlock never sent");
                        shared.recorder.unlock(&target.name, key_id, false, shared.now());
                    }
                }
            });
        }
        let shared = self.shared.clone();
        let mut decided_rx = self.decided_rx;
        drop(self.decided_tx);
        let rest = tokio::spawn(async move {
            // Closed first: a decision finishing now records its own grant
            // unconfirmed (its send fails) instead of waiting for room in a
            // queue nobody reads any more (more doors may be deciding than
            // it holds).
            decided_rx.close();
            for (_, task) in inflight {
                let _ = task.await;
            }
            while doors.join_next().await.is_some() {}
            // Decided, but the loop never took them: the grants are on
            // record, their Unlocks never went out.
            while let Ok(d) = decided_rx.try_recv() {
                if let Reply::Unlock { key_id } = d.reply {
                    let door = shared.door(d.door).name;
                    tracing::warn!(serial = %shared.port.name, door = %door, key_id = %key_id, "unlock never sent");
                    shared.recorder.unlock(&door, key_id, false, shared.now());
                }
            }
        });
        (self.doors, rest)
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
