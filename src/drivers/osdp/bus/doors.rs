//! A reader's door: a submitted entry through the flood limit and the
//! decision queue, the unlock (osdp_OUT) once committed, feedback, and the
//! door contact on the reader's inputs.

use super::*;

impl BusTask {
    /// A submitted entry: past the flood limit it is denied undecided;
    /// otherwise decided now, or queued behind the one in flight.
    pub(super) fn submit(&mut self, i: usize, entry: Submitted) {
        let (door, _) = self.target(i);
        let key = i as u8;
        let now = self.ms();
        if let Admit::Flood { row } = self.flood.admit(key, now) {
            drop(entry);
            if let Some(count) = row {
                tracing::warn!(bus = %self.name, door = %door, count, "keypad flood");
                self.records.flood(&door, count, (self.now)());
            }
            self.feedback(i, &cmds::denied());
            return;
        }
        tracing::info!(bus = %self.name, reader = %self.slots[i].cfg.name, door = %door, "keypad entry");
        match self.queue.push(key, (entry, Instant::now())) {
            Queued::Start(e) => self.start_decision(i, e),
            Queued::Waiting => {}
            Queued::Full(_) => {
                // Fail closed: only a stuck store gets here. Still on record.
                tracing::error!(bus = %self.name, door = %door, "too many keypad entries waiting; denied undecided");
                self.records.undecided(&door, (self.now)());
                self.feedback(i, &cmds::denied());
            }
        }
    }

    /// What reader `i`'s PIN entries are decided for: its door, or, for a
    /// reader that serves none, its place on the bus, which is decided
    /// `unknown_door` like a serial Keypad for a door index no door has
    /// (serial.md): denied, audited, no lockout consulted or counted.
    pub(super) fn target(&self, i: usize) -> (String, bool) {
        let s = &self.slots[i];
        match (&s.door, &s.board) {
            (Some(d), _) => (d.name.clone(), true),
            (None, Some(b)) => (b.name.clone(), true),
            (None, None) => (format!("{}:{}", self.name, s.cfg.address), false),
        }
    }

    pub(super) fn start_decision(&mut self, i: usize, (entry, received): (Submitted, Instant)) {
        let (door, known) = self.target(i);
        let ctx = self.ctx.clone();
        let tx = self.decided_tx.clone();
        let records = self.records.clone();
        let bus = self.name.clone();
        tokio::spawn(async move {
            let pin: &[u8] = match &entry {
                Submitted::Pin(p) => p,
                // Not 4..=12 digits: the decision's own bad_format.
                Submitted::BadFormat => &[],
            };
            let answer = entry::decide(
                &ctx.store,
                &ctx.pin_keys,
                ctx.policy,
                &ctx.zone,
                entry::Entry {
                    driver: &bus,
                    door: &door,
                    known,
                    pin,
                    at: (ctx.now)(),
                    received,
                },
                ctx.wake.as_deref(),
            )
            .await;
            drop(entry);
            if let Err(mpsc::error::SendError((_, Answer::Unlock { key_id }))) =
                tx.send((i, answer)).await
            {
                // The bus task is gone: the grant is on record, the output
                // never went out.
                records.unlock(&door, key_id, false, (ctx.now)());
            }
        });
    }

    pub(super) fn on_decided(&mut self, i: usize, answer: Answer) {
        match answer {
            // Only a known door is ever granted (`target`).
            Answer::Unlock { key_id } => {
                if let Some(door) = self.slots[i].door.clone() {
                    self.unlock(i, &door, key_id);
                } else if self.slots[i].board.is_some() {
                    self.board_unlock(i, key_id);
                }
            }
            Answer::Deny => self.feedback(i, &cmds::denied()),
            Answer::LockedOut => self.feedback(i, &cmds::locked_out()),
        }
        if let Some(next) = self.queue.done(i as u8) {
            self.start_decision(i, next);
        }
    }

    /// Sends a committed grant's output to the reader, then its feedback.
    pub(super) fn unlock(&mut self, i: usize, door: &ReaderDoorConfig, key_id: String) {
        let sent = if self.slots[i].trusted() {
            self.slots[i].cp.send(cmds::unlock(door)).ok()
        } else {
            None
        };
        match sent {
            Some(token) => {
                let now = self.ms();
                let s = &mut self.slots[i];
                s.outputs.insert(token, key_id);
                s.watch.unlock_sent(now, door.unlock_ms);
                self.feedback(i, &cmds::granted(door.unlock_ms));
            }
            None => {
                tracing::warn!(bus = %self.name, door = %door.name, "the reader's session ended before the output went out");
                self.record_unlock(&door.name, key_id, false);
            }
        }
    }

    /// A committed grant for a door on a board: the board's port drives the
    /// relay and records the outcome (as for its own keypad); the reader
    /// shows the feedback. Nothing on the reader's side of the wall opens
    /// the door.
    pub(super) fn board_unlock(&mut self, i: usize, key_id: String) {
        let Some(b) = &self.slots[i].board else {
            return;
        };
        let (name, unlock_ms) = (b.name.clone(), b.unlock_ms);
        let sent = match &b.unlock {
            Some((tx, door)) => tx
                .try_send(BoardUnlock {
                    door: *door,
                    key_id,
                    received: Instant::now(),
                })
                .map_err(|e| match e {
                    mpsc::error::TrySendError::Full(u) | mpsc::error::TrySendError::Closed(u) => {
                        u.key_id
                    }
                }),
            None => Err(key_id),
        };
        match sent {
            Ok(()) => self.feedback(i, &cmds::granted(unlock_ms)),
            Err(key_id) => {
                tracing::error!(bus = %self.name, door = %name, "the board's port cannot take the unlock");
                self.record_unlock(&name, key_id, false);
            }
        }
    }

    /// LED and buzzer after the output, best effort: a reader without them
    /// NAKs and is not faulted.
    pub(super) fn feedback(&mut self, i: usize, commands: &[cp::codec::Command]) {
        for c in commands {
            if self.slots[i].cp.send(c.clone()).is_err() {
                break;
            }
        }
    }

    pub(super) fn output_done(&mut self, i: usize, token: u64, outcome: Outcome) {
        let Some(key_id) = self.slots[i].outputs.remove(&token) else {
            return;
        };
        let Some(door) = self.slots[i].door.clone() else {
            return;
        };
        let confirmed = match &outcome {
            Outcome::Ack => true,
            Outcome::OutputStatus(status) => cmds::output_on(status, door.output),
            Outcome::Nak(_) | Outcome::Failed => false,
        };
        if !confirmed {
            tracing::warn!(bus = %self.name, door = %door.name, outcome = ?outcome, "osdp_OUT not confirmed");
        }
        self.record_unlock(&door.name, key_id, confirmed);
    }

    pub(super) fn record_unlock(&self, door: &str, key_id: String, confirmed: bool) {
        self.records.unlock(door, key_id, confirmed, (self.now)());
    }

    /// An input report: the door contact, when the door has one. A
    /// quarantined reader's reports still count: they come from an
    /// authenticated session, and the door contact stays supervised
    /// (osdp.md, a replaced reader).
    pub(super) fn inputs(&mut self, i: usize, inputs: &[bool]) {
        let Some(door) = self.slots[i].door.clone() else {
            return;
        };
        let Some(open) = cmds::contact_open(&door, inputs) else {
            return;
        };
        let now = self.ms();
        let at = (self.now)();
        let report = self.slots[i].watch.report(open, now, at);
        tracing::info!(bus = %self.name, door = %door.name, open, "door contact");
        if let Some((state, alarm)) = report {
            self.records.door_state(&door.name, state, alarm, at);
        }
    }
}
