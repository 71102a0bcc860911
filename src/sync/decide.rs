//! The hub's [`Decide`]: step 1 (verification, with the rate limit on its
//! results) on the async side, steps 2-8 (`store::apply`) in the writer.

use super::ingest::{Decide, Decided};
use super::plan::{SeqStart, SeqView};
use super::proof::Prover;
use super::ratelimit::TokenBucket;
use crate::clock::SharedClock;
use crate::config::Config;
use crate::store::apply::{self, ApplyContext};
use crate::store::mirror::ProofAsk;
use crate::store::outbox::Queued;
use crate::store::{Alone, Store, error::StoreError};
use lockhub_proto::event::{self, EventKind, EventResult, Outcome, SchemaContext, SchemaError};
use lockhub_proto::time::Timestamp;
use lockhub_proto::verify::Signer;
use lockhub_proto::verify::{self, VerifiedEvent, VerifyContext};
use rusqlite::Connection;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use uuid::Uuid;

/// What step 1 hands to the writer.
// Moved once per event into the writer's bounded queue: the parsed body
// inline (a grant with its schedule) costs no allocation, as in `EventKind`.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Checked {
    /// Authenticated and addressed to us, with step 4's parse of its body.
    Verified(Box<VerifiedEvent>, Result<EventKind, SchemaError>),
    /// Rejected at step 1. `publish` is the rate limiter's verdict: beyond
    /// it, the rejection is only counted in its alert.
    Rejected { result: EventResult, publish: bool },
}

pub struct HubDecider {
    ring: Vec<Signer>,
    site_id: Uuid,
    hub_id: String,
    schema: SchemaContext,
    apply: ApplyContext,
    /// For the WAL scrub after a guest erasure.
    store: Store,
    /// The hub's effective time, shared with the doors and housekeeping.
    clock: SharedClock,
    limiter: Mutex<TokenBucket>,
    origin: Instant,
    /// Wakes the one scrubber task (started with the first erasure): a
    /// wake-up while it runs makes it scrub once more, so no erasure is left
    /// behind and a flood of them costs one task.
    scrub: Arc<Notify>,
    scrubber: OnceLock<()>,
    /// Proof asks of events not yet known to be committed, by event id.
    pending: Mutex<Vec<(Uuid, ProofAsk)>>,
    /// Started with the first ask.
    prover: OnceLock<Prover>,
}

/// Proof asks kept for jobs not yet committed; beyond it the oldest go (an
/// ask of a job that rolled back is never claimed).
const PENDING_PROOFS: usize = 64;

impl HubDecider {
    pub fn new(config: &Config, store: Store, clock: SharedClock) -> Self {
        let origin = Instant::now();
        HubDecider {
            ring: config.trust.clone(),
            site_id: config.hub.site_id,
            hub_id: config.hub.hub_id.clone(),
            schema: config.schema_context(),
            apply: ApplyContext {
                site_id: config.hub.site_id,
                policy: config.policy,
            },
            store,
            clock,
            limiter: Mutex::new(TokenBucket::step1_results(Duration::ZERO)),
            origin,
            scrub: Arc::new(Notify::new()),
            scrubber: OnceLock::new(),
            pending: Mutex::new(Vec::new()),
            prover: OnceLock::new(),
        }
    }

    /// The hub's effective time.
    /// What the sync layer learns from an applied event.
    fn decided(&self, ev: &VerifiedEvent, applied: &apply::Applied) -> Decided {
        // Debug, not info: this runs inside the writer's transaction,
        // once per event; ingest logs each committed batch at info.
        tracing::debug!(
            event_id = %ev.header.event_id,
            seq = ?ev.header.seq,
            outcome = applied.result.outcome.as_str(),
            reason = applied.result.reason.map(|r| r.as_str()),
            duplicate = applied.result.duplicate,
            "event decided"
        );
        let proof_for = applied.proof.clone().map(|ask| {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if pending.len() >= PENDING_PROOFS {
                pending.remove(0);
            }
            pending.push((ev.header.event_id, ask));
            ev.header.event_id
        });
        Decided {
            proof_for,
            seq: Some(SeqView {
                watermark: applied.watermark,
                gap: applied.gap,
            }),
            checkpoint_head: applied.head_seq,
            sign_of_life: applied.sign_of_life,
            erased: applied.erased,
        }
    }

    fn now(&self) -> Timestamp {
        self.clock.now()
    }
}

impl Decide for HubDecider {
    type Checked = Checked;

    fn check(&self, payload: &[u8]) -> Checked {
        let now = self.now();
        let ctx = VerifyContext {
            ring: &self.ring,
            site_id: self.site_id,
            hub_id: &self.hub_id,
            now,
        };
        match verify::verify_envelope(payload, &ctx) {
            Ok(ev) => {
                // A verified issued_at raises the effective time (mqtt.md
                // 'Time'); the applier raises the durable floor with it.
                self.clock.observe_issued_at(ev.header.issued_at);
                let kind = event::parse_body_in_order(&ev.body, &self.schema);
                tracing::debug!(event_id = %ev.header.event_id, seq = ?ev.header.seq, signer = %ev.signer, "event verified");
                Checked::Verified(Box::new(ev), kind)
            }
            Err(r) => {
                let publish = self
                    .limiter
                    .lock()
                    .map(|mut l| l.try_take(self.origin.elapsed()))
                    .unwrap_or(false);
                tracing::warn!(reason = r.reason.as_str(), event_id_hint = ?r.event_id_hint, publish, "event rejected at step 1");
                Checked::Rejected {
                    result: EventResult {
                        // A hint for the cloud's correlation only: nothing is claimed.
                        event_id: r.event_id_hint,
                        seq: None,
                        outcome: Outcome::Rejected,
                        reason: Some(r.reason),
                        duplicate: false,
                        clamped: false,
                        at: now,
                        valid_until: None,
                        item: None,
                        items: None,
                    },
                    publish,
                }
            }
        }
    }

    fn commit(
        &self,
        conn: &Connection,
        out: &mut Queued,
        checked: Checked,
    ) -> Result<Decided, StoreError> {
        let now = self.now();
        match checked {
            Checked::Rejected { result, publish } => {
                // The alert (and this result) go on the outbox at once:
                // what is queued goes first.
                out.flush(conn)?;
                if publish {
                    apply::record_step1_rejection(conn, &result, now)?;
                } else {
                    apply::count_step1_rejection(conn, result.reason, now)?;
                }
                Ok(Decided::default())
            }
            Checked::Verified(ev, kind) => {
                let applied = apply::apply_event_queued(conn, &self.apply, &ev, kind, now, out)?;
                Ok(self.decided(&ev, &applied))
            }
        }
    }

    fn alone(&self, checked: &Checked) -> bool {
        matches!(
            checked,
            Checked::Verified(_, Ok(EventKind::Batch(_) | EventKind::BatchCutShort { .. }))
        )
    }

    fn commit_alone(&self, tx: &Alone<'_>, checked: Checked) -> Result<Decided, StoreError> {
        match checked {
            Checked::Verified(ev, kind) => {
                let now = self.now();
                let applied = apply::apply_event_alone(tx, &self.apply, &ev, kind, now)?;
                Ok(self.decided(&ev, &applied))
            }
            other => Queued::written_after(tx.conn(), |out| self.commit(tx.conn(), out, other)),
        }
    }

    fn after_commit(&self, decided: &[Decided]) {
        let committed: Vec<Uuid> = decided.iter().filter_map(|d| d.proof_for).collect();
        if !committed.is_empty() {
            let asks: Vec<ProofAsk> = {
                let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                let mut taken = Vec::new();
                pending.retain(|(id, ask)| {
                    let mine = committed.contains(id);
                    if mine {
                        taken.push(ask.clone());
                    }
                    !mine
                });
                taken
            };
            let prover = self.prover.get_or_init(|| {
                Prover::start(self.store.clone(), self.clock.clone(), self.hub_id.clone())
            });
            for ask in asks {
                prover.ask(ask);
            }
        }
        if decided.iter().any(|d| d.erased) {
            // The writer runs the scrub between transactions, after this
            // commit; ingest does not wait for it. The erasure's result is
            // held until the scrub succeeds.
            self.scrubber.get_or_init(|| {
                let (store, wake) = (self.store.clone(), self.scrub.clone());
                tokio::spawn(async move {
                    loop {
                        wake.notified().await;
                        if !scrub_until_done(store.clone()).await {
                            return;
                        }
                    }
                });
            });
            self.scrub.notify_one();
        }
    }
}

/// First wait before retrying a WAL scrub that failed.
const SCRUB_RETRY_START: Duration = Duration::from_millis(100);
/// Retries never wait longer than this.
const SCRUB_RETRY_MAX: Duration = Duration::from_secs(5);

/// Runs [`Store::scrub_wal`] until it succeeds (a reader in the way, or a
/// storage error, fails it for now), with backoff; it releases the results
/// that erasures hold back. Also run at start-up when results are still held
/// (a crash between an erasure and its scrub). Returns false when the store
/// has closed.
pub async fn scrub_until_done(store: Store) -> bool {
    let mut wait = SCRUB_RETRY_START;
    loop {
        match store.scrub_wal().await {
            Ok(()) => return true,
            Err(StoreError::Closed) => return false,
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "WAL scrub after a guest erasure failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(SCRUB_RETRY_MAX);
            }
        }
    }
}

/// The seq state at start-up, for the planner: the watermark, whether a
/// seq above it was seen, and the last checkpoint's head.
pub fn initial_seq(conn: &Connection) -> Result<SeqStart, StoreError> {
    let s = apply::seq_status(conn)?;
    let (_, gap) = apply::seq::watermark_and_gap(conn)?;
    Ok(SeqStart {
        view: SeqView {
            watermark: s.watermark,
            gap,
        },
        checkpoint_head: s.head_seq,
    })
}
