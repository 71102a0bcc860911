//! A board's keypad entry: through the flood limit and the per-door
//! decision queue to a committed decision, then the Unlock or Deny sent
//! back on the wire.

use super::*;

impl Session {
    pub(super) fn on_keypad(&mut self, door: u8, pin: firmware_bridge::Pin, now: u64) {
        let target = self.shared.door(door);
        if let Admit::Flood { row } = self.doors.flood.admit(door, now) {
            drop(pin);
            self.on_flood(door, &target.name, row);
            return;
        }
        tracing::info!(serial = %self.serial(), door = %target.name, known = target.known, "keypad entry");
        match self.queue.push(door, (pin, std::time::Instant::now())) {
            Queued::Start(entry) => self.start_decision(door, entry),
            Queued::Waiting => {}
            Queued::Full(_) => {
                // Fail closed: the entry is answered Deny without a
                // decision, and audited as the storage failure it is: only
                // a store that is not keeping up gets here.
                tracing::error!(serial = %self.serial(), door = %target.name, "too many keypad entries waiting; denied undecided");
                self.shared
                    .recorder
                    .undecided(&target.name, self.shared.now());
                self.command(
                    Downlink::Deny {
                        seq: 0,
                        door,
                        reason: firmware_bridge::DenyReason::DENIED,
                    },
                    None,
                    std::time::Instant::now(),
                );
            }
        }
    }

    /// A Keypad past the flood limit: `Deny` without a lookup if the link
    /// has room to spare (a flood never takes the slots other doors'
    /// answers need; the entry was acked either way), counted toward the
    /// door's next `door.flood` row.
    pub(super) fn on_flood(&mut self, door: u8, name: &str, row: Option<u64>) {
        if let Some(count) = row {
            tracing::warn!(serial = %self.serial(), door = %name, count, "keypad flood");
            self.shared.recorder.flood(name, count, self.shared.now());
        }
        if self.deferred.is_empty() && self.link.pending_len() < PENDING_MAX - FLOOD_SPARE_SLOTS {
            let _ = self.link.send(
                Downlink::Deny {
                    seq: 0,
                    door,
                    reason: firmware_bridge::DenyReason::DENIED,
                },
                self.now_ms(),
            );
        }
    }

    pub(super) fn start_decision(
        &mut self,
        door: u8,
        (pin, received): (firmware_bridge::Pin, std::time::Instant),
    ) {
        let shared = self.shared.clone();
        let target = self.shared.door(door);
        let tx = self.decided_tx.clone();
        let task = tokio::spawn(async move {
            let reply =
                crate::drivers::serial::doors::decide(&shared, &target, pin, received).await;
            let unlocked = match &reply {
                Reply::Unlock { key_id } => Some(key_id.clone()),
                Reply::Deny { .. } => None,
            };
            if tx
                .send(Decided {
                    door,
                    reply,
                    received,
                })
                .await
                .is_err()
                && let Some(key_id) = unlocked
            {
                // The port went away while deciding: the grant is on record
                // but the Unlock never went out.
                shared
                    .recorder
                    .unlock(&target.name, key_id, false, shared.now());
            }
        });
        self.inflight.insert(door, task);
    }

    /// A grant committed by another driver for one of this board's doors
    /// (a PIN typed on an OSDP reader): the same Unlock, and the same
    /// record of its outcome, as for a grant from this board's keypad.
    pub(super) fn on_board_unlock(&mut self, u: crate::drivers::BoardUnlock) {
        let target = self.shared.door(u.door);
        let msg = Downlink::Unlock {
            seq: 0,
            door: u.door,
            ms: target.unlock_ms,
        };
        self.command(msg, Some((target.name.clone(), u.key_id)), u.received);
    }

    pub(super) fn on_decided(&mut self, d: Decided) {
        let target = self.shared.door(d.door);
        match d.reply {
            Reply::Unlock { key_id } => {
                let msg = Downlink::Unlock {
                    seq: 0,
                    door: d.door,
                    ms: target.unlock_ms,
                };
                self.command(msg, Some((target.name.clone(), key_id)), d.received);
            }
            Reply::Deny { reason } => {
                self.command(
                    Downlink::Deny {
                        seq: 0,
                        door: d.door,
                        reason,
                    },
                    None,
                    d.received,
                );
            }
        }
        self.inflight.remove(&d.door);
        if let Some(entry) = self.queue.done(d.door) {
            self.start_decision(d.door, entry);
        }
    }
}
