//! The ingest path's outbox rows queued over a job (`outbox::Queued`,
//! `apply_event_queued`) against the same events applied one job each
//! (`apply_event`, which writes every row at once): the same rows, ids,
//! topics, bodies and times, in the same order, and the same seq
//! bookkeeping.

use lockhub::store::Priority;
use lockhub::store::apply::{Applied, apply_event_queued};
use lockhub::store::outbox::Queued;
use lockhub_proto::event::{Change, EventKind};
use lockhub_proto::time::Timestamp;
use testkit::store::*;

use lockhub_proto::event::GrantState::Active;

/// `pin_ambiguous` alerts naming `k-1` and `k-3`, so that revoking either
/// makes the trigger `keys_end_pin_ambiguous` put its cleared message on
/// the outbox by a route of its own, between rows the job has queued.
fn ambiguous_alerts(hub: &Hub) {
    let at = now().0;
    hub.store
        .write_blocking(Priority::Bulk, move |c| {
            for (n, key) in [(1, "k-1"), (3, "k-3")] {
                c.execute(
                    "INSERT INTO alerts (condition, subject, alert_id, state, count, first_at, last_at, published_at)
                     VALUES ('pin_ambiguous', ?1, ?2, 'raised', 2, ?3, ?3, ?3)",
                    rusqlite::params![
                        format!("door-{n}"),
                        format!("00000000-0000-7000-8000-00000000000{n}"),
                        at
                    ],
                )?;
                c.execute(
                    "INSERT INTO alert_keys (condition, subject, key_id) VALUES ('pin_ambiguous', ?1, ?2)",
                    [format!("door-{n}"), key.to_owned()],
                )?;
            }
            Ok(())
        })
        .unwrap();
}

/// (id, seq, kind, body) of each event: new keys, a revoke that ends an
/// alert, a grant superseding two keys (the second ends the other alert,
/// after the first's revocation was queued), a PIN collision (rejected:
/// nothing of it stays), a duplicate, an id conflict (its alert goes on the
/// outbox at once), seqs with a gap that a later one closes, one more grant.
fn events() -> Vec<(u128, u64, Change, String)> {
    let body = |id: u128| format!("body-{id}");
    vec![
        (1, 1, issue(grant("k-1", 1, Active, "c-1", 1)), body(1)),
        (2, 3, issue(grant("k-2", 1, Active, "c-2", 2)), body(2)),
        (8, 8, issue(grant("k-3", 1, Active, "c-3", 3)), body(8)),
        (3, 2, revoke("k-1", "guest_left"), body(3)),
        (
            4,
            5,
            Change::KeyIssued {
                key: grant("k-4", 1, Active, "c-4", 4),
                supersedes: vec!["k-2".into(), "k-3".into()],
            },
            body(4),
        ),
        (5, 6, issue(grant("k-5", 1, Active, "c-5", 4)), body(5)),
        (1, 1, issue(grant("k-1", 1, Active, "c-1", 1)), body(1)),
        (
            2,
            3,
            issue(grant("k-2", 1, Active, "c-2", 2)),
            "other".into(),
        ),
        (6, 4, issue(grant("k-6", 1, Active, "c-6", 6)), body(6)),
        (7, 7, issue(grant("k-7", 1, Active, "c-7", 7)), body(7)),
    ]
}

/// Each outbox row as (id, topic, body without its random ids, has an
/// audit id, created_at); each audit row's id checked against its body.
fn outbox_rows(hub: &Hub) -> Vec<(i64, String, String, bool, i64)> {
    let c = hub.reader();
    let mut stmt = c
        .prepare("SELECT id, topic, body, audit_id, created_at FROM outbox ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| {
        let body: Vec<u8> = r.get(2)?;
        let audit_id: Option<String> = r.get(3)?;
        let mut v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        if let Some(id) = &audit_id {
            assert_eq!(
                v["audit_id"].as_str(),
                Some(id.as_str()),
                "the row's own audit id"
            );
            v.as_object_mut().unwrap().remove("audit_id");
        }
        // A raised alert's id is random too (the cleared one's is fixed).
        if v["state"] == "raised" {
            v.as_object_mut().unwrap().remove("alert_id");
        }
        Ok((
            r.get(0)?,
            r.get(1)?,
            v.to_string(),
            audit_id.is_some(),
            r.get(4)?,
        ))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// What each outbox row is, in id order: `audit KIND KEY`, `alert
/// CONDITION STATE SUBJECT` or `result EVENT OUTCOME`.
fn summaries(hub: &Hub) -> Vec<String> {
    let c = hub.reader();
    let mut stmt = c
        .prepare("SELECT topic, body FROM outbox ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| {
        let topic: String = r.get(0)?;
        let v: serde_json::Value = serde_json::from_slice(&r.get::<_, Vec<u8>>(1)?).unwrap();
        let f = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        Ok(match topic.as_str() {
            "audit" => format!("audit {} {}", f("kind"), f("key_id")),
            "alerts" => format!("alert {} {} {}", f("condition"), f("state"), f("subject")),
            _ => {
                let id = f("event_id");
                let dup = if v["duplicate"] == true {
                    " duplicate"
                } else {
                    ""
                };
                format!("result {} {}{dup}", &id[id.len() - 1..], f("outcome"))
            }
        })
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

fn watermarks(applied: &[Applied]) -> Vec<(u64, bool)> {
    applied.iter().map(|a| (a.watermark, a.gap)).collect()
}

#[test]
fn outbox_rows_queued_over_a_job_are_the_rows_written_one_by_one_in_the_same_order() {
    let one_by_one = Hub::new();
    let queued = Hub::new();
    ambiguous_alerts(&one_by_one);
    ambiguous_alerts(&queued);

    let mut each = Vec::new();
    for (id, seq, change, body) in events() {
        each.push(one_by_one.apply(id, Some(seq), Ok(EventKind::Change(change)), &body));
    }

    let ctx = queued.ctx.clone();
    let together = queued
        .store
        .write_blocking(Priority::Bulk, move |c| {
            let mut out = Queued::default();
            let mut applied = Vec::new();
            for (id, seq, change, body) in events() {
                let ev = event(id, Some(seq), &body, now());
                let kind = Ok(EventKind::Change(change));
                applied.push(apply_event_queued(c, &ctx, &ev, kind, now(), &mut out)?);
            }
            out.flush(c)?;
            assert!(out.is_empty());
            Ok(applied)
        })
        .unwrap();

    // Each row where its cause puts it: a cleared alert between the
    // revocations around it, an alert before its conflict's result.
    assert_eq!(
        summaries(&queued),
        [
            "audit key.activated k-1",
            "result 1 applied",
            "audit key.activated k-2",
            "result 2 applied",
            "audit key.activated k-3",
            "result 8 applied",
            "alert pin_ambiguous cleared door-1",
            "audit key.revoked k-1",
            "result 3 applied",
            "audit key.revoked k-2",
            "alert pin_ambiguous cleared door-3",
            "audit key.revoked k-3",
            "audit key.activated k-4",
            "result 4 applied",
            "result 5 rejected",
            "result 1 applied duplicate",
            "alert event_id_conflict raised 00000000-0000-0000-0000-000000000002",
            "result 2 conflict",
            "audit key.activated k-6",
            "result 6 applied",
            "audit key.activated k-7",
            "result 7 applied",
        ]
    );
    let rows = outbox_rows(&one_by_one);
    assert_eq!(outbox_rows(&queued), rows);
    // What the comparison covers: 6 activations and 3 revocations (audit),
    // two alerts' ends and the conflict's alert, 10 results.
    let topics = |t: &str| rows.iter().filter(|r| r.1 == t).count();
    assert_eq!(
        (topics("audit"), topics("alerts"), topics("results")),
        (9, 3, 10)
    );
    assert_eq!(
        together
            .iter()
            .map(|a| a.result.clone())
            .collect::<Vec<_>>(),
        each.iter().map(|a| a.result.clone()).collect::<Vec<_>>()
    );
    assert_eq!(watermarks(&together), watermarks(&each));
    // Every other table the same (audit rows and alerts differ only in
    // their random ids, checked in the outbox above).
    let skip = ["audit", "outbox", "alerts"];
    assert_eq!(
        dump(&queued.reader(), &skip),
        dump(&one_by_one.reader(), &skip)
    );
}

#[test]
fn the_watermark_and_gap_follow_each_seq_as_it_closes_a_gap() {
    let hub = Hub::new();
    let seqs = [1, 3, 5, 4, 2, 6, 9];
    let got: Vec<(u64, bool)> = seqs
        .iter()
        .enumerate()
        .map(|(i, &seq)| {
            let key = format!("k-{i}");
            let a = hub.change(
                100 + i as u128,
                seq,
                issue(grant(&key, 1, Active, &format!("c-{i}"), i as u8 + 1)),
            );
            (a.watermark, a.gap)
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, false),
            (1, true),
            (1, true),
            (1, true),
            (5, false),
            (6, false),
            (6, true)
        ]
    );
    let s = lockhub::store::apply::seq_status(&hub.reader()).unwrap();
    assert_eq!((s.watermark, s.first_missing), (6, Some(7)));
    assert_eq!(hub.count("SELECT count(*) FROM seq_seen"), 1);
}

#[test]
fn a_rejected_change_takes_its_queued_rows_with_it() {
    let hub = Hub::new();
    let ctx = hub.ctx.clone();
    let rows = hub
        .store
        .write_blocking(Priority::Bulk, move |c| {
            let mut out = Queued::default();
            let t: Timestamp = now();
            let first = event(1, Some(1), "a", t);
            let clash = event(2, Some(2), "b", t);
            let k1 = Ok(EventKind::Change(issue(grant("k-1", 1, Active, "c-1", 1))));
            // Same door and PIN tag: `pin_collision`, after its key row was
            // written and before its activation was queued.
            let k2 = Ok(EventKind::Change(issue(grant("k-2", 1, Active, "c-2", 1))));
            apply_event_queued(c, &ctx, &first, k1, t, &mut out)?;
            let a = apply_event_queued(c, &ctx, &clash, k2, t, &mut out)?;
            assert_eq!(
                a.result.reason,
                Some(lockhub_proto::event::Reason::PinCollision)
            );
            Ok(out.len())
        })
        .unwrap();
    // k-1's activation and result, k-2's result: nothing of k-2's grant.
    assert_eq!(rows, 3);
    assert_eq!(
        hub.count("SELECT count(*) FROM keys WHERE key_id = 'k-2'"),
        0
    );
}

#[test]
fn a_change_rejected_after_its_revoke_keeps_the_rows_queued_before_it() {
    let hub = Hub::new();
    let ctx = hub.ctx.clone();
    hub.store
        .write_blocking(Priority::Bulk, move |c| {
            let mut out = Queued::default();
            let t = now();
            let changes = [
                (1, issue(grant("k-1", 1, Active, "c-1", 1))),
                (2, issue(grant("k-2", 1, Active, "c-2", 2))),
                // Revokes k-1 (its rows reach the outbox by their own
                // route), then collides with k-2's PIN: all of it undone.
                (
                    3,
                    Change::KeyIssued {
                        key: grant("k-3", 1, Active, "c-3", 2),
                        supersedes: vec!["k-1".into()],
                    },
                ),
            ];
            for (id, change) in changes {
                let ev = event(id, Some(id as u64), &format!("body-{id}"), t);
                apply_event_queued(c, &ctx, &ev, Ok(EventKind::Change(change)), t, &mut out)?;
            }
            out.flush(c)
        })
        .unwrap();
    assert_eq!(
        summaries(&hub),
        [
            "audit key.activated k-1",
            "result 1 applied",
            "audit key.activated k-2",
            "result 2 applied",
            "result 3 rejected",
        ]
    );
    assert_eq!(hub.state("k-1").as_deref(), Some("active"));
}
