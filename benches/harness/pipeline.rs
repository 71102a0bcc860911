//! The hub's ingest pipeline without the broker: step 1 (verify) and the
//! schema parse on this thread, then apply on the store's writer in jobs of
//! `batch` events, with at most `outstanding` jobs outstanding (two: one
//! committing while the next fills, which is the shape of `sync::ingest`;
//! one: each job is a commit of its own). It bounds what the daemon can
//! reach, and splits its time into verify vs. apply.

use super::fixture;
use lockhub::store::apply::{ApplyContext, apply_event_queued};
use lockhub::store::outbox::Queued;
use lockhub::store::{Priority, Store};
use lockhub_proto::event::parse_body_in_order;
use lockhub_proto::sign::SignedEvent;
use lockhub_proto::time::Timestamp;
use lockhub_proto::verify::verify_envelope;
use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

/// Where the time went.
#[derive(Debug, Clone, Copy)]
pub struct PipelineRun {
    pub total: Duration,
    /// Time this thread spent verifying and parsing.
    pub verify: Duration,
    /// Time this thread spent waiting for the writer.
    pub waiting: Duration,
}

pub async fn run(
    db: &Path,
    events: &[SignedEvent],
    batch: usize,
    outstanding: usize,
) -> PipelineRun {
    let policy = fixture::default_policy();
    let store = Store::open(db, &policy).expect("open store");
    let ctx = ApplyContext {
        site_id: fixture::SITE_ID,
        policy,
    };
    let ring = fixture::ring();
    let schema = fixture::schema();
    let mut jobs: VecDeque<tokio::task::JoinHandle<()>> = VecDeque::new();
    let (mut verify, mut waiting) = (Duration::ZERO, Duration::ZERO);
    let started = Instant::now();
    for chunk in events.chunks(batch) {
        let t = Instant::now();
        let vctx = fixture::verify_ctx(&ring);
        let checked: Vec<_> = chunk
            .iter()
            .map(|e| {
                let ev = verify_envelope(&e.envelope, &vctx).expect("genuine event");
                let kind = parse_body_in_order(&ev.body, &schema);
                (ev, kind)
            })
            .collect();
        verify += t.elapsed();
        let (s, c) = (store.clone(), ctx.clone());
        jobs.push_back(tokio::spawn(async move {
            s.write(Priority::Bulk, move |conn| {
                let now = Timestamp::now_system();
                // As `sync::ingest` does: the job's outbox rows written
                // once, after its last event.
                let mut out = Queued::default();
                for (ev, kind) in checked {
                    apply_event_queued(conn, &c, &ev, kind, now, &mut out)?;
                }
                out.flush(conn)
            })
            .await
            .expect("apply");
        }));
        if jobs.len() >= outstanding.max(1) {
            let t = Instant::now();
            if let Some(h) = jobs.pop_front() {
                h.await.expect("writer job");
            }
            waiting += t.elapsed();
        }
    }
    let t = Instant::now();
    for h in jobs {
        h.await.expect("writer job");
    }
    waiting += t.elapsed();
    let total = started.elapsed();
    store.close();
    PipelineRun {
        total,
        verify,
        waiting,
    }
}
