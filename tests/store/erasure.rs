//! A guest erasure sticks (mqtt.md 'Types: guest.erased'), against real
//! SQLite files: in the normal order and when the erasure overtakes its
//! grant, no byte of the name remains in the database file, its WAL or a
//! journal once the erasure's result can be published; the result waits for
//! a WAL scrub that succeeds.

use lockhub::store::Priority;
use lockhub::store::outbox;
use lockhub_proto::event::{Change, GrantState, Outcome};
use std::path::{Path, PathBuf};
use testkit::store::*;

const NAME: &[u8] = b"Ada Guest";

fn erase(holder_ref: &str) -> Change {
    Change::GuestErased {
        holder_ref: holder_ref.into(),
    }
}

fn with_suffix(db: &Path, suffix: &str) -> PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push(suffix);
    p.into()
}

/// The files that hold the name's bytes: the database, its WAL, a journal.
fn files_holding_the_name(db: &Path) -> Vec<PathBuf> {
    [
        db.to_owned(),
        with_suffix(db, "-wal"),
        with_suffix(db, "-journal"),
    ]
    .into_iter()
    .filter(|p| std::fs::read(p).is_ok_and(|bytes| bytes.windows(NAME.len()).any(|w| w == NAME)))
    .collect()
}

fn results_in_outbox(hub: &Hub) -> i64 {
    hub.count("SELECT count(*) FROM outbox WHERE topic = 'results'")
}

#[test]
fn an_erasure_that_overtakes_its_grant_keeps_the_name_out_of_every_file() {
    let hub = Hub::new();
    // The grant (seq 1) is lost; the erasure (seq 2) arrives first.
    let e = hub.change(2, 2, erase("g-1"));
    assert_eq!(
        e.result.outcome,
        Outcome::Applied,
        "the holder is remembered"
    );
    assert!(e.erased, "held for a scrub like every erasure's result");
    assert_eq!(results_in_outbox(&hub), 0);
    hub.store.scrub_wal_blocking().unwrap();
    assert_eq!(results_in_outbox(&hub), 1, "released by the scrub");
    // The grant is re-sent after the gap, with the name.
    let g = hub.change(1, 1, issue(grant("k-1", 1, GrantState::Active, "c-1", 1)));
    assert_eq!(g.result.outcome, Outcome::Applied);
    assert_eq!(
        hub.count("SELECT count(*) FROM keys WHERE key_id = 'k-1' AND holder_ref = 'g-1' AND holder_name IS NULL"),
        1,
        "stored, without the name"
    );
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE kind = 'key.activated' AND holder_ref = 'g-1' AND holder_name IS NULL"),
        1
    );
    assert_eq!(
        files_holding_the_name(&hub.db_path()),
        Vec::<PathBuf>::new(),
        "the name was never written"
    );
    // A higher version with the name again: still no name.
    hub.change(3, 3, issue(grant("k-1", 2, GrantState::Active, "c-1", 1)));
    assert_eq!(
        hub.count("SELECT count(*) FROM keys WHERE holder_name IS NOT NULL"),
        0
    );
    assert_eq!(
        files_holding_the_name(&hub.db_path()),
        Vec::<PathBuf>::new()
    );
    // The schema refuses the name of an erased holder, whatever the code does.
    let refused = hub.store.write_blocking(Priority::Bulk, |c| {
        Ok(c.execute(
            "UPDATE keys SET holder_name = 'Ada Guest' WHERE key_id = 'k-1'",
            [],
        ))
    });
    let err = refused.unwrap().unwrap_err().to_string();
    assert!(err.contains("erased_holder"), "{err}");
    // The memory survives a restart.
    let Hub { dir, store, ctx } = hub;
    store.close();
    let store = lockhub::store::Store::open(&dir.path().join("lockhub.db"), &ctx.policy).unwrap();
    let hub = Hub { dir, store, ctx };
    hub.change(4, 4, issue(grant("k-2", 1, GrantState::Active, "c-2", 2)));
    assert_eq!(
        hub.count("SELECT count(*) FROM keys WHERE holder_name IS NOT NULL"),
        0
    );
}

#[test]
fn an_erasure_result_waits_until_a_wal_scrub_succeeds_and_no_file_holds_the_name() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 1, GrantState::Active, "c-1", 1)));
    hub.change(2, 2, revoke("k-1", "checkout"));
    assert!(
        !files_holding_the_name(&hub.db_path()).is_empty(),
        "the test must see the name before the erasure"
    );
    let before = results_in_outbox(&hub);
    let e = hub.change(3, 3, erase("g-1"));
    assert_eq!(e.result.outcome, Outcome::Applied);
    assert!(e.erased);
    assert_eq!(results_in_outbox(&hub), before, "the result is held back");
    // A duplicate of the erasure gets no early answer either.
    let dup = hub.change(3, 3, erase("g-1"));
    assert!(dup.result.duplicate);
    assert_eq!(results_in_outbox(&hub), before);
    // Nor does a second erasure of the guest, under an id of its own: it
    // finds no name left, but the first one's pages are still in the WAL.
    let again = hub.change(4, 4, erase("g-1"));
    assert_eq!(again.result.outcome, Outcome::Noop);
    assert!(again.erased);
    assert_eq!(results_in_outbox(&hub), before);

    // A reader in the way: the scrub fails and nothing is released.
    let reader = hub.reader();
    reader.execute_batch("BEGIN").unwrap();
    reader
        .query_row("SELECT count(*) FROM keys", [], |r| r.get::<_, i64>(0))
        .unwrap();
    assert!(hub.store.scrub_wal_blocking().is_err());
    assert_eq!(outbox::held(&hub.reader()).unwrap(), 2);
    assert_eq!(results_in_outbox(&hub), before);
    reader.execute_batch("COMMIT").unwrap();

    // Retried, it succeeds: the results are released, and no file holds the name.
    hub.store.scrub_wal_blocking().unwrap();
    assert_eq!(outbox::held(&hub.reader()).unwrap(), 0);
    assert_eq!(results_in_outbox(&hub), before + 2);
    let body: Vec<u8> = hub
        .reader()
        .query_row(
            "SELECT body FROM outbox WHERE topic = 'results' ORDER BY id DESC LIMIT 1 OFFSET 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["event_id"], uuid::Uuid::from_u128(3).to_string());
    assert_eq!(body["outcome"], "applied");
    assert_eq!(
        files_holding_the_name(&hub.db_path()),
        Vec::<PathBuf>::new()
    );
}

/// A later erasure of the same guest renews the hub's memory of it: the
/// memory must outlast every grant from before the latest erasure that the
/// cloud could still re-send, not only those from before the first one.
#[test]
fn a_second_erasure_of_a_guest_renews_the_memory_of_it() {
    let hub = Hub::new();
    let first = now();
    let later = now().saturating_add_days(1);
    let kind = |c| Ok(lockhub_proto::event::EventKind::Change(c));
    hub.apply_at(1, Some(1), kind(erase("g-1")), "body-1", first, first);
    let again = hub.apply_at(2, Some(2), kind(erase("g-1")), "body-2", later, later);
    assert_eq!(again.result.outcome, Outcome::Noop, "no name was left");
    let (event_id, created_at): (String, i64) = hub
        .reader()
        .query_row(
            "SELECT event_id, created_at FROM erased_holders WHERE holder_ref = 'g-1'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(created_at, later.0, "remembered from the latest erasure");
    assert!(event_id.ends_with('2'), "{event_id}");
}
