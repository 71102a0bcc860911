//! Events in: step 1 outside the writer, the rest inside it, acks after the
//! commit, in arrival order.
//!
//! ## The pipeline
//! Messages arrive from the poll task in broker order. Step 1 (size,
//! envelope, signature) is pure CPU and runs here as they arrive. The
//! checked messages then go to the store writer as one job per batch: each
//! event inside its own savepoint, so a storage error rolls back that event
//! alone and stops the batch there. While one batch is committing, the next
//! fills up, so under a flood many events share a transaction (and the
//! writer may group our job with the door's and the publisher's) while a
//! lone event is committed at once.
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
//! The events after the failed one are not committed, so they must not be
//! acked; since acks go in order, nothing more can be acked on this
//! connection. We drop the rest of it and ask the poll task to reconnect,
//! which makes the broker redeliver from the first unacked message.

use super::client::{Gate, GateRefusal, Inbound};
use super::plan::SeqView;
use crate::store::{JOB_SLICE, Priority, Store, StoreError};
use rusqlite::Connection;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{Notify, mpsc};

/// Events per writer job at most.
pub const MAX_BATCH: usize = 256;

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
}

/// How a message is decided: the daemon plugs in verification and the
/// store's apply; tests of the pipeline itself plug in simpler rules.
pub trait Decide: Send + Sync + 'static {
    /// What step 1 hands to the writer.
    type Checked: Send + 'static;

    /// Step 1: runs on the async side, before any database work.
    fn check(&self, payload: &[u8]) -> Self::Checked;

    /// Everything else, inside the writer's transaction: the effect, the
    /// dedupe record and the result (on the outbox) together.
    fn commit(&self, conn: &Connection, checked: Self::Checked) -> Result<Decided, StoreError>;

    /// Runs after a batch committed (outside the transaction).
    fn after_commit(&self, _decided: &[Decided]) {}
}

/// What a commit job gives back: what it decided, whether a storage error
/// stopped it, and the events it left for the next job (its time slice ran
/// out), in order.
type CommitOutput<C> = (Vec<Decided>, bool, Vec<C>);
type Commit<C> = Pin<Box<dyn Future<Output = Result<CommitOutput<C>, StoreError>> + Send>>;

/// Where the pipeline reports.
pub struct IngestSinks {
    /// The sync planner: one entry per committed message, in order.
    pub decided: mpsc::Sender<Decided>,
    /// The publisher: new results are on the outbox.
    pub outbox: Arc<Notify>,
    /// The poll task: drop this connection and reconnect.
    pub reconnect: Arc<Notify>,
}

fn start_commit<D: Decide>(
    store: &Store,
    decider: &Arc<D>,
    checked: Vec<D::Checked>,
) -> Commit<D::Checked> {
    let store = store.clone();
    let decider = decider.clone();
    Box::pin(async move {
        store
            .write(Priority::Bulk, move |conn| {
                let started = std::time::Instant::now();
                let mut done = Vec::with_capacity(checked.len());
                let mut items = checked.into_iter();
                for item in items.by_ref() {
                    conn.execute_batch("SAVEPOINT ingest_event")?;
                    match decider.commit(conn, item) {
                        Ok(d) => {
                            conn.execute_batch("RELEASE ingest_event")?;
                            done.push(d);
                        }
                        Err(e) => {
                            conn.execute_batch("ROLLBACK TO ingest_event; RELEASE ingest_event")?;
                            tracing::error!(error = %e, "cannot commit an event; will reconnect");
                            return Ok((done, true, Vec::new()));
                        }
                    }
                    // Hand the writer back: a door may be waiting.
                    if started.elapsed() >= JOB_SLICE {
                        break;
                    }
                }
                Ok((done, false, items.collect()))
            })
            .await
    })
}

/// Queues one ack. Returns false when the connection is gone (the broker
/// will redeliver).
fn ack(gate: &Gate, inbound: &Inbound) -> bool {
    match gate.ack(inbound.epoch, &inbound.publish) {
        Ok(()) => true,
        Err(GateRefusal::Full | GateRefusal::Stale | GateRefusal::Closed) => false,
    }
}

/// Runs until the poll task's channel closes, then finishes what it holds.
pub async fn run<D: Decide>(
    decider: Arc<D>,
    store: Store,
    gate: Arc<Gate>,
    mut rx: mpsc::Receiver<Inbound>,
    sinks: IngestSinks,
) {
    let mut next: Vec<(Inbound, D::Checked)> = Vec::new();
    let mut committing: Option<(Commit<D::Checked>, Vec<Inbound>)> = None;
    // A connection on which a commit failed: nothing more is acked on it.
    let mut poisoned: Option<u64> = None;
    let mut open = true;

    loop {
        if committing.is_none() && !next.is_empty() {
            // At most MAX_BATCH per job; the rest waits in `next`, which the
            // guard below keeps from growing (leftovers come back in front).
            let take = next.len().min(MAX_BATCH);
            let (inbound, checked): (Vec<_>, Vec<_>) = next.drain(..take).unzip();
            committing = Some((start_commit(&store, &decider, checked), inbound));
        }
        if !open && committing.is_none() {
            break;
        }
        tokio::select! {
            msg = rx.recv(), if open && next.len() < MAX_BATCH => match msg {
                Some(inbound) => {
                    if poisoned.is_some_and(|p| inbound.epoch <= p) {
                        continue;
                    }
                    let checked = decider.check(&inbound.publish.payload);
                    next.push((inbound, checked));
                }
                None => open = false,
            },
            res = async { committing.as_mut().expect("guarded").0.as_mut().await }, if committing.is_some() => {
                let (_, mut inbound) = committing.take().expect("guarded");
                let (decided, failed, leftover) = match res {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(error = %e, "event batch did not commit; will reconnect");
                        (Vec::new(), true, Vec::new())
                    }
                };
                let committed = decided.len();
                // Events the job's time slice did not reach go first in the
                // next batch, in their order.
                if !leftover.is_empty() {
                    let rest = inbound.split_off(committed);
                    let mut requeued: Vec<_> = rest.into_iter().zip(leftover).collect();
                    requeued.append(&mut next);
                    next = requeued;
                }
                for msg in &inbound[..committed] {
                    if !ack(&gate, msg) {
                        tracing::debug!(epoch = msg.epoch, "connection gone; the broker will redeliver");
                    }
                }
                if committed > 0 {
                    let watermark = decided.iter().rev().find_map(|d| d.seq.map(|s| s.watermark));
                    tracing::info!(events = committed, ?watermark, "events committed and acked");
                    sinks.outbox.notify_one();
                    decider.after_commit(&decided);
                }
                for d in decided {
                    let _ = sinks.decided.send(d).await;
                }
                if failed {
                    let epoch = inbound.get(committed).map_or(0, |m| m.epoch);
                    poisoned = Some(poisoned.map_or(epoch, |p| p.max(epoch)));
                    next.retain(|(m, _)| m.epoch > epoch);
                    sinks.reconnect.notify_one();
                }
            }
        }
    }
}
