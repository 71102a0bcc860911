//! Events in: step 1 outside the writer, the rest inside it, acks after the
//! commit, in arrival order.
//!
//! ## The pipeline
//! Messages arrive from the poll task in broker order. Step 1 (size,
//! envelope, signature) is pure CPU and runs here as they arrive. The
//! checked messages then go to the store writer as one job per batch, the
//! events one after the other with no savepoint of their own (a rejected
//! change undoes itself inside `store::apply`), and the job's outbox rows
//! (results, audit records) written by one insert after its last event
//! (`outbox::Queued`). A lone event is committed at once;
//! under a flood up to [`MAX_IN_FLIGHT`] jobs wait at the writer, which
//! runs them back to back in one transaction, so the writer never idles
//! while we ack and one fsync covers several jobs. A message the decider
//! names [`Decide::alone`] (a batch event) goes as a job of its own, in a
//! transaction of its own ([`Store::write_alone`]), in its place in order.
//!
//! ## Job size, and jobs cut short
//! A job should take about [`JOB_SLICE`] (fewer, longer jobs share a group
//! with fewer savepoints): [`JobSizer`] sizes jobs from the cost per
//! event measured so far. A job that still runs over, or that sees a door
//! job waiting for the writer (`Store::door_signal`), stops after the
//! event in hand and hands back the events it did not reach; it also raises a flag that makes the
//! jobs queued behind it hand back everything, untouched, so no later event
//! commits (and is acked) before an earlier one. Nothing new is sent until
//! they are all back; then the handed-back events go first, in order.
//!
//! A message is acked only after its batch has committed, and acks go out in
//! arrival order (MQTT 3.1.1 §4.6). Acks belong to the connection that
//! delivered the message: one from an earlier connection is never sent (the
//! broker redelivers; the dedupe table answers `duplicate`).
//!
//! ## Flow control
//! The poll task stops reading once the messages not yet acked fill the
//! hub's receive window (`super::window`), so what reaches this task is
//! bounded whatever the broker does. Our own bounds on top: [`MAX_BATCH`]
//! events per job, and the bounded channel from the poll task.
//!
//! ## A storage failure
//! A storage error in any event fails its whole job: the writer rolls the
//! job back, so none of its events is committed and none may be acked
//! (they used to commit up to the failed one, at the cost of a savepoint
//! per event, one more level of SQLite's sub-journal for every page each
//! event touched). Since acks go in order, nothing more can be acked on
//! this connection. We drop the rest of it and ask the poll task to
//! reconnect, which makes the broker redeliver from the first unacked
//! message; the dedupe table answers whatever did commit before.

use super::client::{Gate, Inbound};
use super::plan::SeqView;
use crate::store::outbox::Queued;
use crate::store::{Alone, JOB_SLICE, Priority, Store, error::StoreError};
use rusqlite::Connection;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

/// Events per writer job at most.
pub const MAX_BATCH: usize = 256;
/// Jobs waiting at (or running in) the writer at once.
pub const MAX_IN_FLIGHT: usize = 4;
/// Checked (parsed) events kept ahead of the writer, in jobs: enough to
/// fill every in-flight slot at once after a drain, and no more; what waits
/// beyond it stays unparsed in the receive window. A 500-key batch parses
/// to several times its ~170 KiB payload, and checking the whole window
/// ahead (up to [`MAX_BATCH`] messages) held every batch of the receive
/// window parsed at once during a resync.
const CHECKED_AHEAD_JOBS: usize = MAX_IN_FLIGHT + 1;

/// Sizes jobs to fill about three quarters of [`JOB_SLICE`], from a moving
/// average of the writer's time per event.
#[derive(Debug, Clone, Copy)]
pub struct JobSizer {
    per_event: Duration,
}

impl Default for JobSizer {
    /// Starts from 100 µs an event (a Raspberry Pi 4 class guess); the
    /// first jobs correct it.
    fn default() -> Self {
        JobSizer {
            per_event: Duration::from_micros(100),
        }
    }
}

impl JobSizer {
    /// How many events the next job should take.
    pub fn batch(&self) -> usize {
        let per = self.per_event.as_nanos().max(1);
        let fit = JOB_SLICE.as_nanos() * 3 / 4 / per;
        (fit as usize).clamp(1, MAX_BATCH)
    }

    /// A job applied `events` in `busy`.
    pub fn observe(&mut self, events: usize, busy: Duration) {
        if events == 0 {
            return;
        }
        let sample = busy / events as u32;
        // A quarter of the way to each new sample: quick to follow a
        // slower disk, not thrown by one slow job.
        self.per_event = (self.per_event * 3 + sample) / 4;
    }
}

/// What one message did, as far as sync planning cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Decided {
    /// The seq state after it; `None` when it was rejected at step 1
    /// (nothing claimed, nothing counted).
    pub seq: Option<SeqView>,
    /// A checkpoint's `head_seq`.
    pub checkpoint_head: Option<u64>,
    /// It counts as a sign of life for `cloud_stale` (an authenticated
    /// event, or a checkpoint issued recently).
    pub sign_of_life: bool,
    /// A guest erasure committed: the decider scrubs the WAL afterwards.
    pub erased: bool,
    /// A checkpoint's claim or a `mirror.request` with this event id: the
    /// decider answers it once it committed.
    pub proof_for: Option<uuid::Uuid>,
}

/// How a message is decided: the daemon plugs in verification and the
/// store's apply; tests of the pipeline itself plug in simpler rules.
pub trait Decide: Send + Sync + 'static {
    /// What step 1 hands to the writer.
    type Checked: Send + 'static;

    /// Step 1: runs on the async side, before any database work.
    fn check(&self, payload: &[u8]) -> Self::Checked;

    /// Everything else, inside the writer's transaction: the effect, the
    /// dedupe record and the result (on the outbox) together. Outbox rows
    /// may go on `out`, which the job writes after its last event, in the
    /// same transaction ([`Queued::flush`]).
    fn commit(
        &self,
        conn: &Connection,
        out: &mut Queued,
        checked: Self::Checked,
    ) -> Result<Decided, StoreError>;

    /// Whether this message goes to the writer as a transaction of its own
    /// ([`Store::write_alone`], then [`Decide::commit_alone`]): a batch, so
    /// that SQLite's sub-journal holds one item's pages rather than the
    /// whole batch's.
    fn alone(&self, _checked: &Self::Checked) -> bool {
        false
    }

    /// [`Decide::commit`] for a message alone in its transaction.
    fn commit_alone(&self, tx: &Alone<'_>, checked: Self::Checked) -> Result<Decided, StoreError> {
        Queued::written_after(tx.conn(), |out| self.commit(tx.conn(), out, checked))
    }

    /// Runs after a batch committed (outside the transaction).
    fn after_commit(&self, _decided: &[Decided]) {}
}

/// What a commit job gives back.
struct CommitOutput<C> {
    /// What it decided, one per event applied, in order.
    decided: Vec<Decided>,
    /// A storage error stopped it after `decided`.
    failed: bool,
    /// The events it did not apply (its slice ran out, or a job ahead of it
    /// was cut short), in order.
    leftover: Vec<C>,
    /// Writer time spent applying.
    busy: Duration,
    /// It was a message alone in its transaction (a batch): its time says
    /// nothing about the cost of one event.
    alone: bool,
}
impl<C> CommitOutput<C> {
    /// A job ahead of this one stopped short: applying ours now would commit
    /// later events before earlier ones, so all of it is left over.
    fn untouched(checked: Vec<C>, alone: bool) -> Self {
        CommitOutput {
            decided: Vec::new(),
            failed: false,
            leftover: checked,
            busy: Duration::ZERO,
            alone,
        }
    }
}

type Commit<C> = Pin<Box<dyn Future<Output = Result<CommitOutput<C>, StoreError>> + Send>>;

/// Where the pipeline reports.
pub struct IngestSinks {
    /// The sync planner: one entry per committed message, in order, with
    /// the connection epoch it arrived on.
    pub decided: mpsc::Sender<(u64, Decided)>,
    /// The publisher: new results are on the outbox.
    pub outbox: Arc<Notify>,
    /// The poll task: drop this connection and reconnect.
    pub reconnect: Arc<Notify>,
}

fn start_commit<D: Decide>(
    store: &Store,
    decider: &Arc<D>,
    checked: Vec<D::Checked>,
    cut: &Arc<AtomicBool>,
) -> Commit<D::Checked> {
    let doors = store.door_signal();
    let store = store.clone();
    let decider = decider.clone();
    let cut = cut.clone();
    if checked.len() == 1 && decider.alone(&checked[0]) {
        return Box::pin(async move {
            store
                .write_alone(move |tx| {
                    let started = std::time::Instant::now();
                    if cut.load(Ordering::Relaxed) {
                        return Ok(CommitOutput::untouched(checked, true));
                    }
                    // No savepoint: an error rolls the whole transaction
                    // back, which holds this event alone.
                    let item = checked.into_iter().next().expect("one event");
                    let decided = decider.commit_alone(tx, item)?;
                    Ok(CommitOutput {
                        decided: vec![decided],
                        failed: false,
                        leftover: Vec::new(),
                        busy: started.elapsed(),
                        alone: true,
                    })
                })
                .await
        });
    }
    Box::pin(async move {
        store
            .write(Priority::Bulk, move |conn| {
                let started = std::time::Instant::now();
                if cut.load(Ordering::Relaxed) {
                    return Ok(CommitOutput::untouched(checked, false));
                }
                let mut decided = Vec::with_capacity(checked.len());
                let mut items = checked.into_iter();
                let mut out = Queued::default();
                for item in items.by_ref() {
                    // No savepoint per event: a storage error fails the
                    // whole job (the writer rolls it back, nothing of it is
                    // acked, the broker redelivers it), so the events share
                    // one savepoint level less, and their outbox rows can
                    // wait for one insert at the end.
                    match decider.commit(conn, &mut out, item) {
                        Ok(d) => decided.push(d),
                        Err(e) => {
                            tracing::error!(error = %e, "cannot commit an event; will reconnect");
                            cut.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    }
                    // Hand the writer back when a door waits, or at the
                    // end of the slice in case one comes.
                    if doors.waiting() || started.elapsed() >= JOB_SLICE {
                        break;
                    }
                }
                if let Err(e) = out.flush(conn) {
                    cut.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                let leftover: Vec<_> = items.collect();
                if !leftover.is_empty() {
                    cut.store(true, Ordering::Relaxed);
                }
                Ok(CommitOutput {
                    decided,
                    failed: false,
                    leftover,
                    busy: started.elapsed(),
                    alone: false,
                })
            })
            .await
    })
}

/// Runs until the poll task's channel closes, then finishes what it holds.
pub async fn run<D: Decide>(
    decider: Arc<D>,
    store: Store,
    gate: Arc<Gate>,
    mut rx: mpsc::Receiver<Inbound>,
    sinks: IngestSinks,
) {
    // Checked, not yet sent to the writer, in arrival order.
    let mut next: VecDeque<(Inbound, D::Checked)> = VecDeque::new();
    // Sent, oldest first; they complete in this order.
    let mut in_flight: VecDeque<(Commit<D::Checked>, Vec<Inbound>)> = VecDeque::new();
    // A job was cut short (or failed): set by the job, cleared here once
    // every job sent before it is back.
    let cut = Arc::new(AtomicBool::new(false));
    // Events handed back while the pipeline drains, in order.
    let mut returned: Vec<(Inbound, D::Checked)> = Vec::new();
    let mut draining = false;
    let mut sizer = JobSizer::default();
    // A connection on which a commit failed: nothing more is acked on it.
    let mut poisoned: Option<u64> = None;
    let mut open = true;

    loop {
        if draining && in_flight.is_empty() {
            // Everything sent before the cut is back: the handed-back events
            // go first, then what arrived meanwhile.
            let mut requeued: VecDeque<_> = returned.drain(..).collect();
            requeued.append(&mut next);
            next = requeued;
            if let Some(p) = poisoned {
                next.retain(|(m, _)| m.epoch > p);
            }
            cut.store(false, Ordering::Relaxed);
            draining = false;
        }
        // A lone event goes at once; otherwise wait for a full job, so a
        // flood makes few big jobs rather than many small ones.
        // A message that must be alone (a batch) goes as a job of its own,
        // and ends the job before it.
        while !draining && in_flight.len() < MAX_IN_FLIGHT && !next.is_empty() {
            let limit = next.len().min(sizer.batch());
            let take = match next.iter().take(limit).position(|(_, c)| decider.alone(c)) {
                Some(0) => 1,
                Some(before) => before,
                None if in_flight.is_empty() || next.len() >= sizer.batch() || !open => limit,
                None => break,
            };
            let (inbound, checked): (Vec<_>, Vec<_>) = next.drain(..take).unzip();
            in_flight.push_back((start_commit(&store, &decider, checked, &cut), inbound));
        }
        if !open && in_flight.is_empty() {
            break;
        }
        tokio::select! {
            msg = rx.recv(), if open && next.len() < sizer.batch() * CHECKED_AHEAD_JOBS => match msg {
                Some(inbound) => {
                    if poisoned.is_some_and(|p| inbound.epoch <= p) {
                        continue;
                    }
                    let checked = decider.check(&inbound.publish.payload);
                    next.push_back((inbound, checked));
                }
                None => open = false,
            },
            res = async { in_flight.front_mut().expect("guarded").0.as_mut().await }, if !in_flight.is_empty() => {
                let (_, mut inbound) = in_flight.pop_front().expect("guarded");
                let out = match res {
                    Ok(out) => out,
                    Err(e) => {
                        tracing::error!(error = %e, "event batch did not commit; will reconnect");
                        // Nothing of it committed; the jobs behind it may
                        // have (they ran in a later transaction), so treat
                        // it as a failure at its first event.
                        cut.store(true, Ordering::Relaxed);
                        CommitOutput {
                            decided: Vec::new(),
                            failed: true,
                            leftover: Vec::new(),
                            busy: Duration::ZERO,
                            alone: false,
                        }
                    }
                };
                let committed = out.decided.len();
                if !out.alone {
                    sizer.observe(committed, out.busy);
                }
                if out.failed || !out.leftover.is_empty() {
                    draining = true;
                }
                if !out.leftover.is_empty() {
                    let rest = inbound.split_off(committed);
                    returned.extend(rest.into_iter().zip(out.leftover));
                }
                for msg in &inbound[..committed] {
                    // Past a failure on this connection, acks would skip the
                    // failed events: the broker redelivers all of them.
                    if poisoned.is_some_and(|p| msg.epoch <= p) {
                        continue;
                    }
                    // Refused only when the connection is gone: the broker
                    // will redeliver.
                    if gate.ack(msg.epoch, &msg.publish).is_err() {
                        tracing::debug!(epoch = msg.epoch, "connection gone; the broker will redeliver");
                    }
                }
                if committed > 0 {
                    let watermark = out.decided.iter().rev().find_map(|d| d.seq.map(|s| s.watermark));
                    tracing::debug!(events = committed, ?watermark, "events committed and acked");
                    sinks.outbox.notify_one();
                    decider.after_commit(&out.decided);
                }
                for (d, msg) in out.decided.into_iter().zip(&inbound) {
                    let _ = sinks.decided.send((msg.epoch, d)).await;
                }
                if out.failed {
                    let epoch = inbound.get(committed).map_or(0, |m| m.epoch);
                    poisoned = Some(poisoned.map_or(epoch, |p| p.max(epoch)));
                    next.retain(|(m, _)| m.epoch > epoch);
                    sinks.reconnect.notify_one();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_sized_to_three_quarters_of_a_slice() {
        let mut s = JobSizer::default();
        for _ in 0..32 {
            s.observe(10, Duration::from_micros(1000)); // 100 µs an event
        }
        let three_quarters = JOB_SLICE.as_micros() * 3 / 4;
        assert_eq!(s.batch() as u128, three_quarters / 100);
    }

    #[test]
    fn the_size_follows_a_slower_writer_within_a_few_jobs() {
        let mut s = JobSizer::default();
        for _ in 0..8 {
            s.observe(10, Duration::from_millis(10)); // 1 ms an event
        }
        assert!(s.batch() <= 4, "{}", s.batch());
    }

    #[test]
    fn a_job_is_never_empty_nor_bigger_than_the_maximum() {
        let mut slow = JobSizer::default();
        slow.observe(1, Duration::from_secs(5));
        assert_eq!(slow.batch(), 1);
        let mut fast = JobSizer::default();
        for _ in 0..64 {
            fast.observe(1000, Duration::from_micros(100));
        }
        assert_eq!(fast.batch(), MAX_BATCH);
    }

    #[test]
    fn a_job_that_applied_nothing_teaches_nothing() {
        let mut s = JobSizer::default();
        let before = s.batch();
        s.observe(0, Duration::from_secs(1));
        assert_eq!(s.batch(), before);
    }
}
