//! One task per `[[osdp]]` bus: it owns the port, polls its readers in
//! turn (one command on the wire at a time, as RS-485 half duplex needs),
//! and turns each reader's [`cp::Event`]s into alerts, identity checks,
//! link state and door actions. A bus that disappears is reopened with
//! backoff; a reader that is silent only costs the others its probe every
//! 5 s.
//!
//! Doors: a reader's keypad opens the first door configured on it. A
//! submitted entry goes through the flood limit ([`crate::door::sensor`]) and the
//! per-door decision queue and decision ([`crate::door::entry`]), exactly as a
//! lock board's Keypad does; a grant, committed, becomes an osdp_OUT, then
//! LED and buzzer feedback. The door contact is the reader's input, kept
//! durably like a board's door sensor (`door_state`).
//!
//! Trust: a reader's key presses and card reads are believed only
//! from a session that is up (Secure Channel, or plain text where the
//! config allows it) and from a reader that is not quarantined; outputs are
//! only driven under the same conditions.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, mpsc, watch};

use super::cp::{self, Caps, Event, Fault, Identity, Outcome, Reader, Security, Timing};
use super::door as cmds;
use super::keypad::{Entry, Submitted};
use super::packet::{self, Deframer};
use crate::config::{Config, PinKey, Policy, ReaderDoorConfig};
use crate::door::entry::{self, Answer, DecisionQueue, Queued};
use crate::door::recorder::{DoorRecord, Recordable, Recorder};
use crate::door::sensor::{Admit, DoorWatch, FloodLimit};
use crate::drivers::{BoardUnlock, BoardUnlocks, DriverHandle, TimeSource, open};
use crate::runtime::backoff::Backoff;
use crate::store::alerts::{self, Change};
use crate::store::door::{DoorEvent, record_door_event};
use crate::store::door::{door_states, record_card_denied};
use crate::store::links::CounterWrites;
use crate::store::osdp::{self as db, ReaderIdentity, ReaderLink};
use crate::store::{Store, error::StoreError};
use lockhub_proto::outputs::Condition;

mod doors;
mod restore;
pub mod settings;
pub(crate) mod wire;

use restore::*;
use settings::*;
use wire::{Wire, exchange};

/// A Secure Channel that has held this long clears `reader_link_fault`
/// (mqtt.md 'Alerts').
const LINK_FAULT_CLEARS_AFTER: Duration = Duration::from_secs(60);
/// Nothing to send (every reader waiting): look again after this.
const IDLE_TICK: Duration = Duration::from_millis(20);
/// Bytes read from the port at once.
const READ_CHUNK: usize = 256;
/// Decisions finished and not yet acted on, per bus (at most one in flight
/// per reader, so this only needs to hold a bus's worth).
const DECIDED_QUEUE: usize = 32;

/// The running OSDP driver. Drop it or call [`DriverHandle::shutdown`].
pub type OsdpHandle = DriverHandle;

type Job = Box<dyn Fn(&rusqlite::Connection) -> Result<(), StoreError> + Send + Sync>;

/// A bus's record for its recorder ([`crate::door::recorder`]): written in
/// order, and, unless it is bookkeeping, tried again until it is written.
struct BusRecord {
    what: String,
    job: Job,
    /// Link rows without an alert and counters: the next change writes
    /// them again, so a full queue may drop them.
    bookkeeping: bool,
}

impl From<DoorRecord> for BusRecord {
    fn from(rec: DoorRecord) -> Self {
        BusRecord {
            what: rec.what(),
            job: Box::new(move |c| rec.apply(c)),
            bookkeeping: false,
        }
    }
}

impl Recordable for BusRecord {
    fn apply(&self, conn: &rusqlite::Connection) -> Result<(), StoreError> {
        (self.job)(conn)
    }
    fn what(&self) -> String {
        self.what.clone()
    }
    fn droppable(&self) -> bool {
        self.bookkeeping
    }
}

/// Starts one task per bus. What earlier runs left ([`Earlier`]) is read
/// here, once: install runs with the daemon stopped.
/// `board_unlocks`: the serial driver's queues, for doors whose PIN a
/// reader takes and whose strike is on a board.
pub fn spawn(
    settings: OsdpSettings,
    store: Store,
    now: TimeSource,
    outbox_wake: Option<Arc<Notify>>,
    board_unlocks: &BoardUnlocks,
) -> OsdpHandle {
    let (stop, stop_rx) = watch::channel(false);
    let (mut buses, mut recorders) = (Vec::new(), Vec::new());
    let readers = || settings.buses.iter().flat_map(|b| b.readers.iter());
    let earlier = Earlier::read(&store, readers().map(|r| r.name.as_str()));
    let ctx = Arc::new(DecideCtx {
        store: store.clone(),
        pin_keys: settings.pin_keys.clone(),
        policy: settings.policy,
        zone: settings.zone.clone(),
        now: now.clone(),
        wake: outbox_wake.clone(),
    });
    for bus in settings.buses.clone() {
        let (recorder, queue) = Recorder::new(&bus.name);
        recorders.push(tokio::spawn(crate::door::recorder::run(
            store.clone(),
            queue,
            outbox_wake.clone(),
        )));
        let task = BusTask::new(
            bus,
            &settings,
            &earlier,
            ctx.clone(),
            Arc::new(recorder),
            board_unlocks,
        );
        buses.push(tokio::spawn(task.run(stop_rx.clone())));
    }
    OsdpHandle::new(stop, buses, recorders)
}

/// The bus task's view of one reader, beyond the protocol.
struct Slot {
    cfg: ReaderSettings,
    cp: Reader,
    /// The identity to compare PDID with (recorded, or first seen).
    known: Recorded,
    quarantined: bool,
    /// `reader_replaced` is raised: quarantined until install, even when
    /// the recorded reader answers again.
    replaced: bool,
    seen_serial: Option<u32>,
    online: bool,
    secure_since: Option<Instant>,
    link_fault_raised: bool,
    /// The last plaintext probe's answer: `Some(true)` while the reader
    /// takes a plaintext osdp_OUT (`link_insecure` raised for that).
    plaintext_out: Option<bool>,
    tamper: Option<bool>,
    faults: u64,
    /// The door its keypad opens with its own output: the first door
    /// configured on it.
    door: Option<ReaderDoorConfig>,
    /// Or the board door its keypad opens through the serial driver.
    board: Option<BoardDoor>,
    entry: Entry,
    /// osdp_OUT commands awaiting their reply: token -> key id.
    outputs: HashMap<u64, String>,
    watch: DoorWatch,
}

/// A door on a board whose PIN a reader takes.
struct BoardDoor {
    name: String,
    unlock_ms: u16,
    /// The board's port queue and door index; `None` if the serial driver
    /// has no such door (then every grant is unconfirmed).
    unlock: Option<(mpsc::Sender<BoardUnlock>, u8)>,
}

impl Slot {
    /// Key presses, card reads and outputs count only now.
    fn trusted(&self) -> bool {
        self.cp.is_ready() && !self.quarantined
    }
}

struct BusTask {
    name: String,
    path: PathBuf,
    baud: u32,
    timing: Timing,
    backoff: Backoff,
    slots: Vec<Slot>,
    /// Round robin: the slot to offer the wire to first.
    turn: usize,
    epoch: Instant,
    now: TimeSource,
    records: Arc<Recorder<BusRecord>>,
    deframer: Deframer,
    counters: CounterWrites<(u64, u64)>,
    ctx: Arc<DecideCtx>,
    decided_tx: mpsc::Sender<(usize, Answer)>,
    decided_rx: mpsc::Receiver<(usize, Answer)>,
    /// One decision at a time per reader's door (keyed by slot index).
    queue: DecisionQueue<(Submitted, Instant)>,
    flood: FloodLimit<u8>,
}

/// What every decision of the driver shares.
struct DecideCtx {
    store: Store,
    pin_keys: Arc<[PinKey]>,
    policy: Policy,
    zone: jiff::tz::TimeZone,
    now: TimeSource,
    wake: Option<Arc<Notify>>,
}

impl BusTask {
    fn new(
        bus: BusSettings,
        settings: &OsdpSettings,
        earlier: &Earlier,
        ctx: Arc<DecideCtx>,
        records: Arc<Recorder<BusRecord>>,
        board_unlocks: &BoardUnlocks,
    ) -> Self {
        let (decided_tx, decided_rx) = mpsc::channel(DECIDED_QUEUE);
        let slots = bus
            .readers
            .into_iter()
            .map(|r| {
                let known = earlier
                    .known
                    .get(&r.name)
                    .copied()
                    .unwrap_or(Recorded::Unread);
                let replaced = earlier.replaced.contains(&r.name);
                Slot {
                    // A door whose strike is on this reader's output: the
                    // reader must refuse that output in plain text.
                    cp: Reader::new(r.address, r.security.clone(), settings.timing, 0)
                        .with_probe(r.doors.first().map(|d| d.output)),
                    plaintext_out: None,
                    known,
                    link_fault_raised: earlier.faulty.contains(&r.name),
                    replaced,
                    door: r.doors.first().cloned(),
                    board: r.board_door.as_ref().map(|b| BoardDoor {
                        name: b.name.clone(),
                        unlock_ms: b.unlock_ms,
                        unlock: board_unlocks.get(&b.name).cloned(),
                    }),
                    quarantined: replaced || matches!(known, Recorded::Unread),
                    cfg: r,
                    seen_serial: None,
                    online: false,
                    secure_since: None,
                    tamper: None,
                    faults: 0,
                    entry: Entry::new(),
                    outputs: HashMap::new(),
                    watch: DoorWatch::new(),
                }
            })
            .collect();
        BusTask {
            name: bus.name,
            path: bus.path,
            baud: bus.baud,
            timing: settings.timing,
            backoff: Backoff::new(settings.backoff_initial, settings.backoff_max),
            slots,
            turn: 0,
            epoch: Instant::now(),
            now: ctx.now.clone(),
            records,
            deframer: Deframer::new(),
            counters: CounterWrites::default(),
            ctx,
            decided_tx,
            decided_rx,
            queue: DecisionQueue::new(),
            flood: FloodLimit::new(),
        }
    }

    fn ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Queues an audit row or an alert (see [`crate::door::recorder`] for when a
    /// full queue drops one).
    fn record(&self, what: String, job: Job) {
        self.push(what, job, false);
    }

    /// Queues bookkeeping for `lockhub status`, which a full queue drops first.
    fn bookkeeping(&self, what: String, job: Job) {
        self.push(what, job, true);
    }

    fn push(&self, what: String, job: Job, bookkeeping: bool) {
        self.records.push(BusRecord {
            what,
            job,
            bookkeeping,
        });
    }

    fn raise(&self, condition: Condition, subject: &str) {
        self.alert(condition, subject, Change::Raise);
    }

    fn clear(&self, condition: Condition, subject: &str) {
        self.alert(condition, subject, Change::Clear);
    }

    fn alert(&self, condition: Condition, subject: &str, alert: Change) {
        let at = (self.now)();
        let s = subject.to_owned();
        self.record(
            format!("{} {} for {subject}", alert.as_str(), condition.as_str()),
            Box::new(move |c| alert.write(c, condition, &s, at)),
        );
    }

    fn write_link(&self, i: usize) {
        self.write_link_and(i, None);
    }

    /// [`Self::write_link`], with the alert the change raises or clears
    /// written in the same transaction: a reader's `online` and its
    /// `board_offline` never disagree in the database, where `lockhub
    /// status` and the tests read them (two records were two commits).
    fn write_link_and(&self, i: usize, alert: Option<(Condition, Change)>) {
        let s = &self.slots[i];
        let link = ReaderLink {
            reader: s.cfg.name.clone(),
            bus: self.name.clone(),
            address: s.cfg.address,
            online: s.online,
            secure: s.cp.is_secure() && s.cp.is_ready(),
            quarantined: s.quarantined,
            seen_serial: s.seen_serial,
            since: (self.now)(),
        };
        let at = link.since;
        self.push(
            format!("link of reader {}", s.cfg.name),
            Box::new(move |c| {
                if let Some((condition, alert)) = alert {
                    alert.write(c, condition, &link.reader, at)?;
                }
                db::set_link(c, &link)
            }),
            alert.is_none(),
        );
    }

    fn write_counters(&mut self, force: bool) {
        let (bad, garbage) = (self.deframer.bad_packets, self.deframer.garbage_bytes);
        if !self.counters.due((bad, garbage), force) {
            return;
        }
        let bus = self.name.clone();
        let at = (self.now)();
        self.bookkeeping(
            format!("counters of bus {bus}"),
            Box::new(move |c| db::set_bus_counters(c, &bus, bad, garbage, at)),
        );
    }

    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut reported_absent = false;
        for i in 0..self.slots.len() {
            self.write_link(i);
        }
        self.restore_doors().await;
        loop {
            if *stop.borrow() {
                break;
            }
            match open(&self.path, self.baud) {
                Ok(stream) => {
                    reported_absent = false;
                    tracing::info!(bus = %self.name, path = %self.path.display(), "osdp bus open");
                    let end = self.session(stream, &mut stop).await;
                    let now = self.ms();
                    for i in 0..self.slots.len() {
                        let ev = self.slots[i].cp.restart(now);
                        self.handle(i, ev);
                    }
                    match end {
                        Ok(()) => break,
                        Err(e) => {
                            tracing::warn!(bus = %self.name, error = %e, "osdp bus lost; reopening")
                        }
                    }
                }
                Err(e) => {
                    if !reported_absent {
                        tracing::warn!(bus = %self.name, error = %e, "osdp bus cannot be opened; retrying");
                        reported_absent = true;
                    }
                }
            }
            // Silence while the port is away still makes readers offline,
            // and a grant decided meanwhile is on record unconfirmed now,
            // not when the port comes back.
            let now = self.ms();
            for i in 0..self.slots.len() {
                let ev = self.slots[i].cp.tick(now);
                self.handle(i, ev);
            }
            while let Ok((i, answer)) = self.decided_rx.try_recv() {
                self.on_decided(i, answer);
            }
            let delay = self.backoff.next_step();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = stop.changed() => break,
            }
        }
        self.finish().await;
        self.write_counters(true);
        tracing::info!(bus = %self.name, "osdp bus task stopped");
    }

    /// The task is stopping: every entry still waiting is decided and on
    /// record (a grant that can no longer reach the reader is recorded
    /// unconfirmed), and the flood counts are written.
    async fn finish(&mut self) {
        // Grants decided but not yet taken in can no longer reach a
        // reader: on record as unconfirmed. Closed first, so a decision
        // that ends after this records itself (`start_decision`).
        self.decided_rx.close();
        while let Ok((i, answer)) = self.decided_rx.try_recv() {
            if let (Answer::Unlock { key_id }, (door, true)) = (answer, self.target(i)) {
                self.record_unlock(&door, key_id, false);
            }
        }
        let now = self.ms();
        for (key, count) in self.flood.drain(now) {
            if usize::from(key) < self.slots.len() {
                let (door, _) = self.target(usize::from(key));
                self.records.flood(&door, count, (self.now)());
            }
        }
        for (key, waiting) in self.queue.take_waiting() {
            if usize::from(key) >= self.slots.len() {
                continue;
            }
            let (door, known) = self.target(usize::from(key));
            for (entry, received) in waiting {
                let pin: &[u8] = match &entry {
                    Submitted::Pin(p) => p,
                    Submitted::BadFormat => &[],
                };
                let answer = entry::decide(
                    &self.ctx.store,
                    &self.ctx.pin_keys,
                    self.ctx.policy,
                    &self.ctx.zone,
                    entry::Entry {
                        driver: &self.name,
                        door: &door,
                        known,
                        pin,
                        at: (self.now)(),
                        received,
                    },
                    self.ctx.wake.as_deref(),
                )
                .await;
                if let Answer::Unlock { key_id } = answer {
                    self.record_unlock(&door, key_id, false);
                }
            }
        }
    }

    /// One opening of the port: poll until it fails or `stop`.
    async fn session(
        &mut self,
        mut port: tokio_serial::SerialStream,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), std::io::Error> {
        loop {
            if *stop.borrow() {
                return Ok(());
            }
            while let Ok((i, answer)) = self.decided_rx.try_recv() {
                self.on_decided(i, answer);
            }
            let now = self.ms();
            for i in 0..self.slots.len() {
                let ev = self.slots[i].cp.tick(now);
                self.handle(i, ev);
                self.periodic(i);
            }
            self.write_counters(false);
            let n = self.slots.len();
            let mut chosen = None;
            for k in 0..n {
                let i = (self.turn + k) % n;
                if let Some(bytes) = self.slots[i].cp.next(now, rand::random()) {
                    chosen = Some((i, bytes));
                    break;
                }
            }
            let Some((i, bytes)) = chosen else {
                tokio::select! {
                    _ = tokio::time::sleep(IDLE_TICK) => {}
                    _ = stop.changed() => return Ok(()),
                }
                continue;
            };
            let addr = self.slots[i].cfg.address;
            let epoch = self.epoch;
            let ev = exchange(
                &mut port,
                &mut self.slots[i].cp,
                addr,
                &mut self.deframer,
                &bytes,
                epoch,
                Wire {
                    baud: self.baud,
                    reply_timeout: Duration::from_millis(self.timing.reply_timeout_ms),
                },
            )
            .await?;
            self.turn = if self.slots[i].cp.resend_due() {
                i
            } else {
                (i + 1) % n
            };
            self.handle(i, ev);
        }
    }

    /// Time-based alert endings, idle entries, doors held open.
    fn periodic(&mut self, i: usize) {
        let now = self.ms();
        let held_open_ms = u64::from(self.ctx.policy.held_open_s) * 1_000;
        self.slots[i].entry.tick(now);
        if let Some(alarm) = self.slots[i].watch.poll(now, held_open_ms) {
            let state = self.slots[i].watch.state();
            if let Some(door) = self.slots[i].door.as_ref().map(|d| d.name.clone()) {
                self.records
                    .door_state(&door, state, Some(alarm), (self.now)());
            }
        }
        if i == 0 {
            for (key, count) in self.flood.poll(now) {
                if let Some(door) = self
                    .slots
                    .get(usize::from(key))
                    .and_then(|s| s.door.clone())
                {
                    self.records.flood(&door.name, count, (self.now)());
                }
            }
        }
        let s = &self.slots[i];
        if s.link_fault_raised
            && s.secure_since
                .is_some_and(|t| t.elapsed() >= LINK_FAULT_CLEARS_AFTER)
        {
            let name = s.cfg.name.clone();
            self.slots[i].link_fault_raised = false;
            self.clear(Condition::ReaderLinkFault, &name);
        }
    }

    fn handle(&mut self, i: usize, events: Vec<Event>) {
        for e in events {
            self.event(i, e);
        }
    }

    fn event(&mut self, i: usize, e: Event) {
        let name = self.slots[i].cfg.name.clone();
        match e {
            Event::Online => {
                // The port works: a later loss starts its backoff afresh.
                self.backoff.reset();
                self.slots[i].online = true;
                tracing::info!(bus = %self.name, reader = %name, "reader answers");
                self.write_link_and(i, Some((Condition::BoardOffline, Change::Clear)));
            }
            Event::Offline => {
                self.slots[i].online = false;
                tracing::warn!(bus = %self.name, reader = %name, "reader offline");
                self.write_link_and(i, Some((Condition::BoardOffline, Change::Raise)));
            }
            Event::SessionUp { secure } => {
                if secure {
                    tracing::info!(bus = %self.name, reader = %name, "secure channel up");
                    self.slots[i].secure_since = Some(Instant::now());
                    // A reader that ran in plain text earlier (another
                    // config) is no longer in use so; unless it takes
                    // osdp_OUT in plain text (the probe's own alert).
                    if self.slots[i].plaintext_out != Some(true) {
                        self.clear(Condition::LinkInsecure, &name);
                    }
                } else {
                    tracing::warn!(bus = %self.name, reader = %name, "reader in plain text (insecure_plaintext)");
                    self.raise(Condition::LinkInsecure, &name);
                }
                self.write_link(i);
            }
            Event::SessionDown => {
                self.slots[i].secure_since = None;
                // A half-typed PIN does not outlive its session: the next
                // session may not be the same reader's (osdp.md).
                self.slots[i].entry.clear();
                tracing::info!(bus = %self.name, reader = %name, "reader session ended");
                self.write_link(i);
            }
            Event::SessionFault { fault, recent } => {
                let s = &mut self.slots[i];
                s.faults += 1;
                s.secure_since = None;
                tracing::warn!(bus = %self.name, reader = %name, fault = ?fault, recent, faults = s.faults, "reader session ended early");
                if fault == Fault::Refused {
                    tracing::warn!(bus = %self.name, reader = %name, "the reader refuses a Secure Channel; it is not used in plain text");
                }
            }
            Event::LinkFault(f) => {
                self.slots[i].link_fault_raised = true;
                tracing::warn!(bus = %self.name, reader = %name, fault = ?f, "reader link fault");
                self.raise(Condition::ReaderLinkFault, &name);
            }
            Event::PlaintextProbe { accepted } => {
                let before = self.slots[i].plaintext_out.replace(accepted);
                if accepted && before != Some(true) {
                    tracing::warn!(bus = %self.name, reader = %name, "the reader accepts osdp_OUT in plain text: anyone on the wire could open its door; turn on its secure-channel-only setting or move the strike to a board");
                    self.raise(Condition::LinkInsecure, &name);
                } else if !accepted && before == Some(true) {
                    self.clear(Condition::LinkInsecure, &name);
                }
            }
            Event::Identity(id) => self.identity(i, id),
            Event::Caps(caps) => self.caps(i, caps),
            Event::Ready => {
                tracing::info!(bus = %self.name, reader = %name, quarantined = self.slots[i].quarantined, "reader ready");
                self.write_link(i);
            }
            Event::Local { tamper, .. } => self.tamper(i, tamper),
            Event::Inputs(inputs) => self.inputs(i, &inputs),
            Event::Keys(keys) => {
                if !self.slots[i].trusted() {
                    tracing::warn!(bus = %self.name, reader = %name, "key presses from an untrusted reader ignored");
                    return;
                }
                let now = self.ms();
                let submitted = self.slots[i].entry.keys(&keys.0, now);
                for s in submitted {
                    self.submit(i, s);
                }
            }
            Event::Card => {
                if !self.slots[i].trusted() {
                    tracing::warn!(bus = %self.name, reader = %name, "card read from an untrusted reader ignored");
                    return;
                }
                let (door, _) = self.target(i);
                tracing::info!(bus = %self.name, reader = %name, door = %door, "card read: denied, PINs only");
                let at = (self.now)();
                self.record(
                    format!("door.denied/unsupported_credential at {door}"),
                    Box::new(move |c| record_card_denied(c, &door, at).map(drop)),
                );
                self.feedback(i, &cmds::denied());
            }
            Event::Done { token, outcome } => self.output_done(i, token, outcome),
        }
    }

    fn identity(&mut self, i: usize, id: Identity) {
        let name = self.slots[i].cfg.name.clone();
        let seen = ReaderIdentity {
            vendor: id.vendor,
            model: id.model,
            version: id.version,
            serial: id.serial,
            firmware: id.firmware,
        };
        self.slots[i].seen_serial = Some(id.serial);
        if matches!(self.slots[i].known, Recorded::Unread) {
            // Asked again at each new session; a small indexed read.
            match self
                .ctx
                .store
                .reader()
                .and_then(|c| Recorded::read(&c, &name))
            {
                Ok(known) => self.slots[i].known = known,
                Err(e) => {
                    tracing::error!(bus = %self.name, reader = %name, error = %e, "cannot read the reader's recorded identity: quarantined until it can be read");
                    self.slots[i].quarantined = true;
                    return;
                }
            }
        }
        let s = &mut self.slots[i];
        match s.known {
            Recorded::Unread => {}
            Recorded::Nothing => {
                // Keyed by hand, never installed: its first authenticated
                // identity is the reference from now on.
                s.known = Recorded::Identity(seen);
                s.quarantined = false;
                let at = (self.now)();
                self.record(
                    format!("identity of reader {name}"),
                    Box::new(move |c| db::adopt_identity(c, &name, &seen, at).map(drop)),
                );
            }
            // Vendor, model and serial: any of them changed is another
            // reader (the version and firmware change with an update).
            Recorded::Identity(k)
                if (k.vendor, k.model, k.serial) != (id.vendor, id.model, id.serial) =>
            {
                s.replaced = true;
                if !s.quarantined {
                    s.quarantined = true;
                    tracing::error!(bus = %self.name, reader = %name, "reader identity changed: quarantined until `lockhub osdp install`");
                }
                self.raise(Condition::ReaderReplaced, &name);
            }
            Recorded::Identity(_) => s.quarantined = s.replaced,
        }
    }

    fn caps(&mut self, i: usize, caps: Caps) {
        let s = &self.slots[i];
        let name = s.cfg.name.clone();
        let mismatch =
            s.cfg.doors.iter().any(|d| {
                d.output >= caps.outputs || d.contact_input.is_some_and(|c| c >= caps.inputs)
            });
        if mismatch {
            tracing::error!(bus = %self.name, reader = %name, outputs = caps.outputs, inputs = caps.inputs, "the reader lacks an output or input a door on it needs");
            self.raise(Condition::BoardMismatch, &name);
        } else {
            self.clear(Condition::BoardMismatch, &name);
        }
    }

    fn tamper(&mut self, i: usize, tamper: bool) {
        let name = self.slots[i].cfg.name.clone();
        let before = self.slots[i].tamper.replace(tamper);
        if tamper && before != Some(true) {
            let at = (self.now)();
            let n = name.clone();
            self.record(
                format!("board.tamper at {name}"),
                Box::new(move |c| record_door_event(c, DoorEvent::Tamper, &n, at).map(drop)),
            );
        } else if !tamper && before != Some(false) {
            // Back to normal (also after a restart, for an alert raised
            // before it): the alert ends (mqtt.md 'Alerts').
            self.clear(Condition::Tamper, &name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_timeout_starts_once_the_command_has_left_the_wire() {
        let slow = Wire {
            baud: 9600,
            reply_timeout: Duration::from_millis(200),
        };
        // Ten bits a character: a 30-byte command takes 31 ms at 9600 baud.
        assert_eq!(slow.char_time(), Duration::from_micros(1041));
        assert_eq!((slow.char_time() * 30).as_millis(), 31);
        let fast = Wire {
            baud: 230_400,
            ..slow
        };
        assert!(fast.char_time() < Duration::from_micros(50));
    }
}
