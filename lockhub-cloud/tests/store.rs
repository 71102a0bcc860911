//! The SQLite store's guarantees, on real files: seqs are dense and never
//! reused, an idempotency key gives one event however many writers race,
//! a conflict changes nothing, and one active key per check-in is SQLite's
//! own rule.

use lockhub_cloud::store::*;
use std::path::Path;
use std::sync::{Arc, Barrier};

fn hub(h: &str) -> HubRef {
    HubRef {
        site_id: "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10".into(),
        hub_id: h.into(),
    }
}

fn open(path: &Path) -> SqliteStore {
    SqliteStore::open(path, true).expect("open the store")
}

fn add(store: &SqliteStore, h: &str) {
    store
        .add_hub(
            &HubRecord {
                hub: hub(h),
                public_key: None,
                doors: vec!["101".into()],
                pin_keys: vec![PinKey {
                    id: "k1".into(),
                    secret: [7; 32],
                }],
                next_seq: 1,
            },
            "2026-12-01T00:00:00Z",
        )
        .expect("add hub");
}

fn key(key_id: &str, check_in: &str) -> KeyRecord {
    KeyRecord {
        key_id: key_id.into(),
        version: 1,
        state: "active".into(),
        check_in_id: Some(check_in.into()),
        reservation_id: None,
        doors: vec!["101".into()],
        valid_from: "2026-12-01T00:00:00Z".into(),
        valid_until: "2026-12-08T00:00:00Z".into(),
        holder_ref: None,
        seq: 0,
    }
}

fn mint(h: &str, idem: Option<(&str, u8)>, change: KeyChange, key_id: Option<&str>) -> Mint {
    Mint {
        hub: hub(h),
        idempotency: idem.map(|(k, sha)| Idempotency {
            key: k.into(),
            request_sha256: [sha; 32],
        }),
        change,
        key_id: key_id.map(str::to_owned),
        now: "2026-12-01T00:00:00Z".into(),
        now_unix: 1_764_547_200,
    }
}

/// The store treats what it signs as opaque bytes: a stand-in signer that
/// says which seq it was handed is enough to see what was stored.
fn signer(calls: &mut Vec<u64>) -> impl FnMut(u64) -> Signed + '_ {
    move |seq| {
        calls.push(seq);
        Signed {
            event_id: uuid::Uuid::new_v4().to_string(),
            kind: "key.issued".into(),
            body: format!("body {seq}").into_bytes(),
            envelope: format!("envelope {seq}").into_bytes(),
        }
    }
}

/// Mints `key.issued` for a new active key `key_id` of `check_in` on hub
/// `a`, with the stand-in [`signer`].
fn issue_key(
    s: &SqliteStore,
    idem: Option<(&str, u8)>,
    key_id: &str,
    check_in: &str,
    calls: &mut Vec<u64>,
) -> Result<Minted, StoreError> {
    s.mint(
        &mint(
            "a",
            idem,
            KeyChange::Insert(key(key_id, check_in)),
            Some(key_id),
        ),
        &mut signer(calls),
    )
}

#[test]
fn seqs_are_dense_per_hub_and_never_reused_across_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cloud.db");
    {
        let s = open(&db);
        add(&s, "a");
        add(&s, "b");
    }
    let mut calls = Vec::new();
    for round in 0..3 {
        // A reopen between rounds: the counter is the file's, not memory's.
        let s = open(&db);
        for n in 0..10 {
            for h in ["a", "b"] {
                s.mint(
                    &mint(h, None, KeyChange::None, None),
                    &mut signer(&mut calls),
                )
                .unwrap_or_else(|e| panic!("round {round} event {n}: {e}"));
            }
        }
    }
    let s = open(&db);
    for h in ["a", "b"] {
        let seqs: Vec<u64> = s
            .events_from(&hub(h), 1, 1000)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, (1..=30).collect::<Vec<_>>(), "hub {h}");
        assert_eq!(s.head_seq(&hub(h)).unwrap(), 30);
    }
}

#[test]
fn a_hundred_racing_writers_with_one_idempotency_key_make_one_event_and_one_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("cloud.db");
    add(&open(&db), "a");
    let barrier = Arc::new(Barrier::new(100));
    let threads: Vec<_> = (0..100)
        .map(|n| {
            let (db, barrier) = (db.clone(), barrier.clone());
            std::thread::spawn(move || {
                // Each thread its own connection, as each process would have.
                let s = open(&db);
                let mut calls = Vec::new();
                barrier.wait();
                let m = mint(
                    "a",
                    Some(("check-in:c-1", 9)),
                    KeyChange::Insert(key(&format!("k-{n}"), "c-1")),
                    Some(&format!("k-{n}")),
                );
                let out = s.mint(&m, &mut signer(&mut calls)).expect("mint");
                (out, calls.len())
            })
        })
        .collect();
    let outs: Vec<(Minted, usize)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(outs.iter().map(|o| o.1).sum::<usize>(), 1, "signed once");
    assert_eq!(outs.iter().filter(|o| !o.0.replayed).count(), 1);
    let first = &outs.iter().find(|o| !o.0.replayed).unwrap().0;
    for (o, _) in &outs {
        assert_eq!(
            (o.seq, &o.event_id, &o.key_id),
            (first.seq, &first.event_id, &first.key_id)
        );
    }
    let s = open(&db);
    assert_eq!(s.events_from(&hub("a"), 1, 1000).unwrap().len(), 1);
    assert_eq!(s.head_seq(&hub("a")).unwrap(), 1);
    let key_id = first.key_id.as_deref().unwrap();
    assert_eq!(s.key(&hub("a"), key_id).unwrap().unwrap().state, "active");
}

#[test]
fn an_idempotency_key_reused_for_another_request_is_a_conflict_that_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir.path().join("cloud.db"));
    add(&s, "a");
    let mut calls = Vec::new();
    let first = issue_key(&s, Some(("k", 1)), "k-1", "c-1", &mut calls).unwrap();
    let again = issue_key(&s, Some(("k", 1)), "k-1", "c-1", &mut calls).unwrap();
    assert!(again.replayed);
    assert_eq!((again.seq, &again.event_id), (first.seq, &first.event_id));
    let err = issue_key(&s, Some(("k", 2)), "k-2", "c-2", &mut calls).unwrap_err();
    assert!(matches!(err, StoreError::IdempotencyConflict(_)), "{err}");
    assert!(err.is_input_problem());
    assert_eq!(calls, vec![1], "nothing signed after the first");
    assert_eq!(s.head_seq(&hub("a")).unwrap(), 1);
    assert!(s.key(&hub("a"), "k-2").unwrap().is_none());
}

#[test]
fn a_second_active_key_for_a_check_in_is_refused_by_the_index_and_takes_no_seq() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir.path().join("cloud.db"));
    add(&s, "a");
    let mut calls = Vec::new();
    issue_key(&s, Some(("one", 1)), "k-1", "c-1", &mut calls).unwrap();
    let err = issue_key(&s, Some(("two", 2)), "k-2", "c-1", &mut calls).unwrap_err();
    assert!(
        matches!(err, StoreError::ActiveKeyExists(ref c) if c == "c-1"),
        "{err}"
    );
    // Revoked, the check-in may have a new key, with the next seq.
    s.mint(
        &mint(
            "a",
            None,
            KeyChange::Revoke {
                key_id: "k-1".into(),
            },
            None,
        ),
        &mut signer(&mut calls),
    )
    .unwrap();
    let third = issue_key(&s, Some(("two", 2)), "k-2", "c-1", &mut calls).unwrap();
    assert_eq!(calls, vec![1, 2, 3]);
    assert_eq!(third.seq, 3);
}

#[test]
fn published_events_leave_the_queue_and_only_done_idempotency_records_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir.path().join("cloud.db"));
    add(&s, "a");
    let mut calls = Vec::new();
    for n in 1..=3 {
        s.mint(
            &mint(
                "a",
                Some((&format!("i-{n}"), n)),
                KeyChange::Insert(key(&format!("k-{n}"), &format!("c-{n}"))),
                None,
            ),
            &mut signer(&mut calls),
        )
        .unwrap();
    }
    let queued: Vec<u64> = s
        .unpublished(None, 100)
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(queued, vec![1, 2, 3]);
    s.mark_published(&[(hub("a"), 2)], "2026-12-01T00:00:01Z")
        .unwrap();
    let queued: Vec<u64> = s
        .unpublished(Some(&hub("a")), 100)
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(queued, vec![1, 3]);
    let first: Vec<u64> = s
        .unpublished(None, 1)
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(first, vec![1], "the oldest first, at most the limit");
    // Only seq 2's record is done; the in-progress ones outlive any age.
    assert_eq!(s.prune_idempotency(i64::MAX).unwrap(), 1);
    assert_eq!(s.prune_idempotency(i64::MAX).unwrap(), 0);
    // PUBACKs that arrived together are marked in one call; one marked
    // twice changes nothing.
    s.mark_published(
        &[(hub("a"), 3), (hub("a"), 1), (hub("a"), 2)],
        "2026-12-01T00:00:02Z",
    )
    .unwrap();
    assert!(s.unpublished(None, 100).unwrap().is_empty());
    assert_eq!(s.prune_idempotency(i64::MAX).unwrap(), 2);
}

#[test]
fn outputs_recorded_together_keep_one_row_per_audit_id() {
    let dir = tempfile::tempdir().unwrap();
    let s = open(&dir.path().join("cloud.db"));
    add(&s, "a");
    let out = |topic: &str, audit_id: Option<&str>| OutputRecord {
        hub: hub("a"),
        topic: topic.into(),
        body: "{}".into(),
        audit_id: audit_id.map(str::to_owned),
        received_at: "2026-12-01T00:00:00Z".into(),
    };
    let batch = [
        out("sync", None),
        out("audit", Some("0193a5a0-0000-7000-8000-000000000001")),
        out("audit", Some("0193a5a0-0000-7000-8000-000000000001")),
        out("sync", None),
    ];
    assert_eq!(
        s.record_outputs(&batch).unwrap(),
        3,
        "the second copy of the audit row is a repeat"
    );
    assert_eq!(s.record_outputs(&batch[1..2]).unwrap(), 0);
    assert_eq!(s.record_outputs(&[]).unwrap(), 0);
    let rows = s
        .outputs(&OutputFilter {
            hub: Some(hub("a")),
            limit: 100,
            ..OutputFilter::default()
        })
        .unwrap();
    let topics: Vec<&str> = rows.iter().map(|r| r.topic.as_str()).collect();
    assert_eq!(topics, vec!["sync", "audit", "sync"]);
}
