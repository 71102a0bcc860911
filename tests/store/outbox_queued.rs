//! The ingest path's outbox rows queued over a job (`outbox::Queued`,
//! `apply_event_queued`) against the same events applied one job each
//! (`apply_event`, which writes every row at once): the same rows, ids,
//! topics, bodies and times, in the same order, and the same seq
//! bookkeeping.

use lockhub::event::{Change, EventKind};
use lockhub::store::Priority;
use lockhub::store::apply::{Applied, apply_event_queued};
use lockhub::store::outbox::Queued;
use lockhub::time::Timestamp;
use testkit::store::*;

use lockhub::event::GrantState::Active;

/// A `pin_ambiguous` alert naming `k-1`, so that revoking `k-1` makes the
/// trigger `keys_end_pin_ambiguous` put its cleared message on the outbox
/// by a route of its own, between rows the job has queued.
fn ambiguous_alert_on_k1(hub: &Hub) {
    let at = now().0;
    hub.store
        .write_blocking(Priority::Bulk, move |c| {
            c.execute(
                "INSERT INTO alerts (condition, subject, alert_id, state, count, first_at, last_at, published_at)
                 VALUES ('pin_ambiguous', '101', '00000000-0000-7000-8000-000000000001', 'raised', 2, ?1, ?1, ?1)",
                [at],
            )?;
            c.execute(
                "INSERT INTO alert_keys (condition, subject, key_id) VALUES ('pin_ambiguous', '101', 'k-1')",
                [],
            )?;
            Ok(())
        })
        .unwrap();
}

/// (id, seq, kind, body) of each event: new keys, a revoke that ends the
/// alert, a superseding grant, a PIN collision (rejected: nothing of it
/// stays), a duplicate, an id conflict (its alert goes on the outbox at
/// once), seqs with a gap that a later one closes, and one more grant.
fn events() -> Vec<(u128, u64, Change, String)> {
    let body = |id: u128| format!("body-{id}");
    vec![
        (1, 1, issue(grant("k-1", 1, Active, "c-1", 1)), body(1)),
        (2, 3, issue(grant("k-2", 1, Active, "c-2", 2)), body(2)),
        (3, 2, revoke("k-1", "guest_left"), body(3)),
        (
            4,
            5,
            Change::KeyIssued {
                key: grant("k-4", 1, Active, "c-4", 4),
                supersedes: vec!["k-2".into()],
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

fn watermarks(applied: &[Applied]) -> Vec<(u64, bool)> {
    applied.iter().map(|a| (a.watermark, a.gap)).collect()
}

#[test]
fn outbox_rows_queued_over_a_job_are_the_rows_written_one_by_one_in_the_same_order() {
    let one_by_one = Hub::new();
    let queued = Hub::new();
    ambiguous_alert_on_k1(&one_by_one);
    ambiguous_alert_on_k1(&queued);

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

    let rows = outbox_rows(&one_by_one);
    assert_eq!(outbox_rows(&queued), rows);
    // What the comparison covers: 5 activations and 2 revocations (audit),
    // the alert's end and the conflict's alert, 9 results.
    let topics = |t: &str| rows.iter().filter(|r| r.1 == t).count();
    assert_eq!(
        (topics("audit"), topics("alerts"), topics("results")),
        (7, 2, 9)
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
            assert_eq!(a.result.reason, Some(lockhub::event::Reason::PinCollision));
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
