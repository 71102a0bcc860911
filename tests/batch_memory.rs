//! A batch's memory: SQLite keeps every page journalled at any savepoint
//! level until the outermost savepoint is released, so a batch's items
//! nested inside one more savepoint journalled ~500 items' pages at once
//! (the resync's RSS peak). Alone in its transaction
//! (`Store::write_alone`, `apply_event_alone`), the in-memory sub-journal
//! holds one item at a time. Its own test binary: the figure measured
//! is the process's resident memory, and the tests of one binary run side
//! by side.

use lockhub::store::apply::apply_event_alone;
use lockhub_proto::event::{EventKind, GrantState, Outcome, PinTag, Reason};
use testkit::store::*;

const ITEMS: usize = 500;
/// Batches in the mirror before the one measured.
const PREFILL: usize = 60;

fn batch(first: usize, tag_base: u32) -> EventKind {
    EventKind::Batch(
        (first..first + ITEMS)
            .map(|i| {
                let mut key = grant(
                    &format!("key-{i}"),
                    1,
                    GrantState::Active,
                    &format!("ci-{i}"),
                    0,
                );
                let mut tag = [0u8; 32];
                tag[..4].copy_from_slice(
                    &(tag_base + i as u32)
                        .wrapping_mul(2_654_435_761)
                        .to_le_bytes(),
                );
                tag[4..8].copy_from_slice(&(i as u32).to_le_bytes());
                key.pin_tag = PinTag(tag);
                key.holder_ref = Some(format!("g-{i}"));
                issue(key)
            })
            .collect(),
    )
}

/// The process's resident memory now, in bytes, and its peak since the
/// last reset (`/proc/self/clear_refs`).
fn rss(reset: bool) -> (u64, u64) {
    if reset {
        std::fs::write("/proc/self/clear_refs", "5").expect("reset the RSS peak");
    }
    testkit::daemon::memory(std::process::id()).expect("this process's /proc status")
}

fn apply_alone(hub: &Hub, id: u128, seq: u64, kind: EventKind) -> lockhub::store::apply::Applied {
    let ev = event(id, Some(seq), &format!("body-{id}"), now());
    let ctx = hub.ctx.clone();
    hub.store
        .write_alone_blocking(move |tx| apply_event_alone(tx, &ctx, &ev, Ok(kind), now()))
        .unwrap()
}

#[test]
fn a_batch_alone_in_its_transaction_journals_one_item_at_a_time_and_a_rejected_one_leaves_nothing()
{
    let hub = Hub::new();
    // A mirror big enough that a batch rewrites existing pages (pages added
    // by the savepoint's own transaction need no journal).
    for b in 0..PREFILL {
        let applied = apply_alone(&hub, 1000 + b as u128, b as u64 + 1, batch(b * ITEMS, 0));
        assert_eq!(applied.result.outcome, Outcome::Applied);
    }
    let (before, _) = rss(true);
    let applied = apply_alone(
        &hub,
        20_000,
        PREFILL as u64 + 1,
        batch(PREFILL * ITEMS, 7_777),
    );
    let (_, peak) = rss(false);
    assert_eq!(applied.result.outcome, Outcome::Applied);
    assert_eq!(applied.result.items.as_ref().map(Vec::len), Some(ITEMS));
    let grew = (peak - before) as f64 / (1 << 20) as f64;
    // Nested as the pipeline nested it before (a savepoint per event, one
    // per batch, one per item) the same batch took the peak up by 26.5 MiB
    // here: the outer two levels journal every page the batch touches.
    // Alone, it stays within what the earlier batches used.
    assert!(
        grew < 6.0,
        "the RSS peak grew {grew:.1} MiB during one batch"
    );

    // An item that rejects the batch (its PIN tag collides with a live
    // key's at the same door) undoes the items before it: the transaction
    // starts over with only the verdict, dedupe row and result.
    let keys_before = hub.count("SELECT count(*) FROM keys");
    let mut items = match batch((PREFILL + 1) * ITEMS, 99) {
        EventKind::Batch(items) => items,
        _ => unreachable!(),
    };
    let taken = match batch(0, 0) {
        EventKind::Batch(items) => items.into_iter().next().unwrap(),
        _ => unreachable!(),
    };
    let mut clash = taken;
    if let lockhub_proto::event::Change::KeyIssued { key, .. } = &mut clash {
        key.key_id = "key-clash".into();
        key.check_in_id = Some("ci-clash".into());
    }
    items[300] = clash;
    let applied = apply_alone(&hub, 30_000, PREFILL as u64 + 2, EventKind::Batch(items));
    assert_eq!(applied.result.outcome, Outcome::Rejected);
    assert_eq!(applied.result.reason, Some(Reason::PinCollision));
    assert_eq!(applied.result.item, Some(300));
    assert_eq!(
        applied.watermark,
        PREFILL as u64 + 2,
        "the rejected batch's seq still counts"
    );
    assert_eq!(hub.count("SELECT count(*) FROM keys"), keys_before);
    assert_eq!(
        hub.count("SELECT count(*) FROM dedupe WHERE outcome = 'rejected'"),
        1
    );
}
