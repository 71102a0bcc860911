//! The MQTT vectors (spec/vectors/mqtt), replayed in order against a
//! fresh store: step 1 by `verify_envelope`, step 4 by `parse_body_in_order`, steps 2
//! to 8 by `store::apply`, with the effective time 2026-11-29T12:00:00Z.
//! Every expected outcome, reason, duplicate flag, item and items must
//! match, and afterwards the state the vectors' README describes must hold,
//! down to the bytes of the database and WAL files.

use lockhub::config::Policy;
use lockhub::store::apply::{ApplyContext, apply_event, record_step1_rejection, seq_status};
use lockhub::store::{Priority, Store};
use lockhub_proto::event::{EventResult, Outcome, Reason, SchemaContext, parse_body_in_order};
use lockhub_proto::time::Timestamp;
use lockhub_proto::verify::Signer;
use lockhub_proto::verify::{VerifyContext, verify_envelope};
use rusqlite::Connection;
use std::path::Path;
use uuid::Uuid;

const DIR: &str = testkit::files::VECTORS_DIR;
const SITE: &str = "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10";
const HUB: &str = "hub-lobby-1";
const NAME: &[u8] = b"Ada Guest";

fn ring() -> Vec<Signer> {
    testkit::files::vectors_trust_ring()
}

fn now() -> Timestamp {
    Timestamp::parse_rfc3339("2026-11-29T12:00:00Z").unwrap()
}

/// Runs one envelope through steps 1 to 8, as the daemon will.
fn feed(
    store: &Store,
    raw: &[u8],
    vctx: &VerifyContext<'_>,
    schema: &SchemaContext,
) -> (EventResult, bool) {
    let actx = ApplyContext {
        site_id: Uuid::parse_str(SITE).unwrap(),
        policy: Policy::default(),
    };
    match verify_envelope(raw, vctx) {
        Err(rej) => {
            let result = EventResult {
                event_id: rej.event_id_hint,
                seq: None,
                outcome: Outcome::Rejected,
                reason: Some(rej.reason),
                duplicate: false,
                clamped: false,
                at: now(),
                valid_until: None,
                item: None,
                items: None,
            };
            let r = result.clone();
            store
                .write_blocking(Priority::Bulk, move |c| {
                    record_step1_rejection(c, &r, now())
                })
                .unwrap();
            (result, false)
        }
        Ok(ev) => {
            let kind = parse_body_in_order(&ev.body, schema);
            let applied = store
                .write_blocking(Priority::Bulk, move |c| {
                    apply_event(c, &actx, &ev, kind, now())
                })
                .unwrap();
            (applied.result, applied.erased)
        }
    }
}

fn expected_reason(v: &serde_json::Value) -> Option<Reason> {
    v.as_str()
        .map(|s| Reason::parse(s).unwrap_or_else(|| panic!("unknown reason {s}")))
}

fn file_holds(path: &Path, needle: &[u8]) -> bool {
    match std::fs::read(path) {
        Ok(bytes) => bytes.windows(needle.len()).any(|w| w == needle),
        Err(_) => false,
    }
}

fn wal_of(db: &Path) -> std::path::PathBuf {
    let mut p = db.as_os_str().to_owned();
    p.push("-wal");
    p.into()
}

/// Every column of every row of every table, read as bytes, searched for
/// the needle.
fn rows_holding(c: &Connection, needle: &[u8]) -> Vec<String> {
    let tables: Vec<String> = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut hits = Vec::new();
    for t in tables {
        let mut stmt = c.prepare(&format!("SELECT * FROM \"{t}\"")).unwrap();
        let n = stmt.column_count();
        let mut rows = stmt.query([]).unwrap();
        while let Some(row) = rows.next().unwrap() {
            for i in 0..n {
                let bytes: Option<Vec<u8>> = match row.get_ref(i).unwrap() {
                    rusqlite::types::ValueRef::Text(b) | rusqlite::types::ValueRef::Blob(b) => {
                        Some(b.to_vec())
                    }
                    _ => None,
                };
                if bytes.is_some_and(|b| b.windows(needle.len()).any(|w| w == needle)) {
                    hits.push(format!("{t} column {i}"));
                }
            }
        }
    }
    hits
}

#[test]
fn the_twenty_vectors_replayed_against_the_store_give_their_results_and_final_state() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("lockhub.db");
    let store = Store::open(&db, &Policy::default()).unwrap();
    let ring = ring();
    let vctx = VerifyContext {
        ring: &ring,
        site_id: Uuid::parse_str(SITE).unwrap(),
        hub_id: HUB,
        now: now(),
    };
    let schema = SchemaContext::new(["101"], ["k1"]);
    let cases = std::fs::read_to_string(format!("{DIR}/cases.jsonl")).expect("cases.jsonl");
    let mut seen = 0;
    for line in cases.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let n = case["n"].as_u64().unwrap();
        let raw = case["envelope"].as_str().unwrap().as_bytes();
        let (result, erased) = feed(&store, raw, &vctx, &schema);
        let what = case["what"].as_str().unwrap_or("");
        assert_eq!(
            result.outcome.as_str(),
            case["outcome"].as_str().unwrap(),
            "case {n}: {what}"
        );
        assert_eq!(
            result.reason,
            expected_reason(&case["reason"]),
            "case {n}: {what}"
        );
        assert_eq!(
            result.duplicate,
            case["duplicate"].as_bool().unwrap(),
            "case {n}: {what}"
        );
        assert_eq!(
            result.item,
            case["item"].as_u64().map(|i| i as usize),
            "case {n}: {what}"
        );
        let items = case["items"].as_array().map(|a| {
            a.iter()
                .map(|p| (p[0].as_str().unwrap().to_owned(), expected_reason(&p[1])))
                .collect::<Vec<_>>()
        });
        let got = result.items.as_ref().map(|a| {
            a.iter()
                .map(|i| (i.outcome.as_str().to_owned(), i.reason))
                .collect::<Vec<_>>()
        });
        assert_eq!(got, items, "case {n}: {what}");
        if erased {
            // What the daemon does after an erasure commits: no page that
            // held the name may stay in the WAL. It retries a scrub that
            // something was in the way of (sync::decide::scrub_until_done):
            // the store's own checkpointer may be copying at that moment,
            // and a TRUNCATE beside it reports busy.
            let mut tries = 0;
            while let Err(e) = store.scrub_wal_blocking() {
                tries += 1;
                assert!(tries < 50, "case {n}: the WAL scrub kept failing: {e}");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            assert!(
                !file_holds(&db, NAME),
                "case {n}: the database file holds the name"
            );
            assert!(
                !file_holds(&wal_of(&db), NAME),
                "case {n}: the WAL holds the name"
            );
        }
        seen += 1;
    }
    assert_eq!(seen, 20);

    let r = store.reader().unwrap();
    let status = seq_status(&r).unwrap();
    assert_eq!(status.watermark, 12);
    assert_eq!(status.first_missing, None);
    assert_eq!(status.head_seq, 12);
    let live: Vec<(String, String)> = r
        .prepare("SELECT key_id, state FROM keys WHERE state IN ('pre_issued', 'active') ORDER BY key_id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        live,
        [
            ("k-act-2".to_owned(), "active".to_owned()),
            ("k-b1".to_owned(), "active".to_owned())
        ]
    );
    let state = |k: &str| -> Option<String> {
        r.query_row("SELECT state FROM keys WHERE key_id = ?1", [k], |r| {
            r.get(0)
        })
        .ok()
    };
    assert_eq!(state("k-101-a").as_deref(), Some("revoked"));
    assert_eq!(state("k-pre-1").as_deref(), Some("revoked"));
    assert_eq!(state("k-ghost"), None);
    assert_eq!(state("k-b2"), None, "the rejected batch left nothing");
    let ghost: i64 = r
        .query_row(
            "SELECT count(*) FROM key_tombstones WHERE key_id = 'k-ghost'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(ghost, 1);
    assert_eq!(
        rows_holding(&r, NAME),
        Vec::<String>::new(),
        "no stored row holds the name"
    );
    // The id conflict (case 3) and the step-1 rejections were counted.
    let alerts: Vec<(String, i64)> = r
        .prepare("SELECT condition, count FROM alerts ORDER BY condition")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        alerts,
        [
            ("bad_signature".to_owned(), 2),
            ("event_id_conflict".to_owned(), 1),
            ("malformed_event".to_owned(), 2)
        ]
    );
    drop(r);
    assert!(!file_holds(&db, NAME));
    assert!(!file_holds(&wal_of(&db), NAME));
    store.close();
    assert!(
        !file_holds(&db, NAME),
        "the database file after close holds the name"
    );
    assert!(!file_holds(&wal_of(&db), NAME));
}
