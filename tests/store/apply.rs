//! `store::apply` against real SQLite files: every type, every result code
//! this layer produces, batches, dedupe, the seq bookkeeping, and a race.

use lockhub::store::Priority;
use lockhub::store::apply::{record_step1_rejection, seq_status};
use lockhub_proto::event::{
    Change, EventKind, EventResult, GrantState, Outcome, Reason, SchemaError,
};
use lockhub_proto::time::Timestamp;
use std::sync::{Arc, Barrier};
use testkit::store::*;

use GrantState::{Active, PreIssued};

fn outcome(a: &lockhub::store::apply::Applied) -> (Outcome, Option<Reason>) {
    (a.result.outcome, a.result.reason)
}

const APPLIED: (Outcome, Option<Reason>) = (Outcome::Applied, None);
const NOOP: (Outcome, Option<Reason>) = (Outcome::Noop, None);

fn rejected(r: Reason) -> (Outcome, Option<Reason>) {
    (Outcome::Rejected, Some(r))
}

#[test]
fn issuing_a_new_key_applies_it_with_its_doors_and_an_activation_audit() {
    let hub = Hub::new();
    let a = hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    assert_eq!(outcome(&a), APPLIED);
    assert!(!a.result.duplicate && !a.result.clamped);
    assert_eq!(hub.state("k-1").as_deref(), Some("active"));
    assert_eq!(
        hub.count("SELECT count(*) FROM key_doors WHERE key_id = 'k-1' AND live = 1"),
        1
    );
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE kind = 'key.activated' AND key_id = 'k-1'"),
        1
    );
    assert_eq!(
        hub.count("SELECT count(*) FROM outbox WHERE topic = 'results'"),
        1,
        "the result is queued in the same transaction"
    );
}

#[test]
fn a_pre_issued_key_has_no_activation_audit_until_it_moves_to_active() {
    let hub = Hub::new();
    let mut g = grant("k-1", 1, PreIssued, "", 1);
    g.reservation_id = Some("r-1".into());
    assert_eq!(outcome(&hub.change(1, 1, issue(g))), APPLIED);
    assert_eq!(hub.count("SELECT count(*) FROM audit"), 0);
    let mut up = grant("k-1", 2, Active, "c-1", 2);
    up.doors = vec!["102".into(), "103".into()];
    assert_eq!(outcome(&hub.change(2, 2, issue(up))), APPLIED);
    assert_eq!(hub.state("k-1").as_deref(), Some("active"));
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE kind = 'key.activated'"),
        1
    );
    // The doors were replaced, with the new tag.
    let doors: Vec<String> = hub
        .reader()
        .prepare("SELECT door FROM key_doors WHERE key_id = 'k-1' AND pin_tag = X'0202020202020202020202020202020202020202020202020202020202020202' ORDER BY door")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(doors, ["102", "103"]);
}

#[test]
fn a_grant_at_or_below_the_live_version_is_a_noop() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 2, Active, "c-1", 1)));
    assert_eq!(
        outcome(&hub.change(2, 2, issue(grant("k-1", 2, Active, "c-1", 1)))),
        NOOP
    );
    assert_eq!(
        outcome(&hub.change(3, 3, issue(grant("k-1", 1, Active, "c-1", 9)))),
        NOOP
    );
    assert_eq!(
        hub.count("SELECT version FROM keys WHERE key_id = 'k-1'"),
        2
    );
}

#[test]
fn a_long_window_is_clamped_to_max_grant_days_and_the_result_says_so() {
    let hub = Hub::new();
    let mut g = grant("k-1", 1, Active, "c-1", 1);
    g.valid_until = g.valid_from.saturating_add_days(90);
    let limit = g.valid_from.saturating_add_days(60);
    let a = hub.change(1, 1, issue(g));
    assert_eq!(outcome(&a), APPLIED);
    assert!(a.result.clamped);
    assert_eq!(hub.count("SELECT valid_until FROM keys"), limit.0);
}

#[test]
fn a_window_that_has_ended_is_expired_and_nothing_is_stored() {
    let hub = Hub::new();
    let mut g = grant("k-1", 1, Active, "c-1", 1);
    g.valid_from = now().saturating_add_days(-5);
    g.valid_until = now();
    assert_eq!(
        outcome(&hub.change(1, 1, issue(g))),
        rejected(Reason::Expired)
    );
    assert_eq!(hub.state("k-1"), None);
    // Still claimed and counted.
    assert_eq!(
        hub.count("SELECT count(*) FROM dedupe WHERE reason = 'expired'"),
        1
    );
    assert_eq!(hub.count("SELECT watermark FROM seq_state"), 1);
}

#[test]
fn a_second_active_key_for_a_check_in_is_a_one_active_conflict() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    let a = hub.change(2, 2, issue(grant("k-2", 1, Active, "c-1", 2)));
    assert_eq!(outcome(&a), rejected(Reason::OneActiveConflict));
    assert_eq!(hub.state("k-2"), None);
    assert_eq!(
        hub.count("SELECT count(*) FROM key_doors"),
        1,
        "no orphan door rows"
    );
}

#[test]
fn a_second_live_key_with_the_same_tag_on_a_door_is_a_pin_collision() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 7)));
    let a = hub.change(2, 2, issue(grant("k-2", 1, Active, "c-2", 7)));
    assert_eq!(outcome(&a), rejected(Reason::PinCollision));
    assert_eq!(
        hub.state("k-2"),
        None,
        "the key row was rolled back with its doors"
    );
    // On another door the same tag is fine.
    let mut other = grant("k-3", 1, Active, "c-3", 7);
    other.doors = vec!["102".into()];
    assert_eq!(outcome(&hub.change(3, 3, issue(other))), APPLIED);
}

#[test]
fn a_revoke_wins_whatever_its_version_and_is_audited_with_its_reason() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 5, Active, "c-1", 1)));
    assert_eq!(
        outcome(&hub.change(2, 2, revoke("k-1", "checkout"))),
        APPLIED
    );
    assert_eq!(hub.state("k-1").as_deref(), Some("revoked"));
    assert_eq!(
        hub.count("SELECT count(*) FROM key_doors WHERE live = 1"),
        0
    );
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE kind = 'key.revoked' AND reason = 'checkout'"),
        1
    );
    // Again: a final key is left as it is.
    assert_eq!(outcome(&hub.change(3, 3, revoke("k-1", "again"))), NOOP);
    // A higher version of the revoked key is illegal; the same version a noop.
    assert_eq!(
        outcome(&hub.change(4, 4, issue(grant("k-1", 6, Active, "c-1", 1)))),
        rejected(Reason::IllegalTransition)
    );
    assert_eq!(
        outcome(&hub.change(5, 5, issue(grant("k-1", 5, Active, "c-1", 1)))),
        NOOP
    );
}

#[test]
fn a_revoke_for_an_unknown_key_leaves_a_tombstone_that_refuses_the_key_later() {
    let hub = Hub::new();
    assert_eq!(
        outcome(&hub.change(1, 1, revoke("k-ghost", "cancelled"))),
        APPLIED
    );
    assert_eq!(
        outcome(&hub.change(2, 2, revoke("k-ghost", "cancelled"))),
        NOOP
    );
    assert_eq!(
        outcome(&hub.change(3, 3, issue(grant("k-ghost", 1, Active, "c-5", 1)))),
        rejected(Reason::Revoked)
    );
    assert_eq!(hub.state("k-ghost"), None);
    assert_eq!(hub.count("SELECT count(*) FROM key_tombstones"), 1);
}

#[test]
fn superseded_keys_are_revoked_first_so_the_new_key_may_take_their_check_in() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    let a = hub.change(
        2,
        2,
        Change::KeyIssued {
            key: grant("k-2", 1, Active, "c-1", 1),
            supersedes: vec!["k-1".into(), "k-never".into()],
        },
    );
    assert_eq!(outcome(&a), APPLIED);
    assert_eq!(hub.state("k-1").as_deref(), Some("revoked"));
    assert_eq!(hub.state("k-2").as_deref(), Some("active"));
    assert_eq!(
        hub.count("SELECT count(*) FROM keys WHERE revoke_reason = 'superseded'"),
        1
    );
    assert_eq!(
        hub.count(
            "SELECT count(*) FROM key_tombstones WHERE key_id = 'k-never' AND reason = 'superseded'"
        ),
        1
    );
}

#[test]
fn a_rejected_grant_takes_its_supersede_revocations_with_it() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    hub.change(2, 2, issue(grant("k-9", 1, Active, "c-9", 9)));
    let a = hub.change(
        3,
        3,
        Change::KeyIssued {
            key: grant("k-2", 1, Active, "c-2", 9), // collides with k-9
            supersedes: vec!["k-1".into()],
        },
    );
    assert_eq!(outcome(&a), rejected(Reason::PinCollision));
    assert_eq!(hub.state("k-1").as_deref(), Some("active"));
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE kind = 'key.revoked'"),
        0
    );
}

fn pre(key_id: &str, reservation: &str, tag: u8) -> lockhub_proto::event::Grant {
    let mut g = grant(key_id, 1, PreIssued, "", tag);
    g.reservation_id = Some(reservation.into());
    g
}

fn checkin(reservation: &str, check_in: &str, mut key: lockhub_proto::event::Grant) -> Change {
    key.reservation_id = Some(reservation.into());
    key.check_in_id = Some(check_in.into());
    Change::CheckinCompleted {
        reservation_id: reservation.into(),
        check_in_id: check_in.into(),
        key,
    }
}

#[test]
fn a_check_in_revokes_the_pre_issued_keys_activates_its_key_and_closes_the_reservation() {
    let hub = Hub::new();
    hub.change(1, 1, issue(pre("k-pre-1", "r-1", 1)));
    hub.change(2, 2, issue(pre("k-pre-2", "r-1", 2)));
    let a = hub.change(
        3,
        3,
        checkin("r-1", "c-2", grant("k-act", 1, Active, "c-2", 3)),
    );
    assert_eq!(outcome(&a), APPLIED);
    assert_eq!(hub.state("k-pre-1").as_deref(), Some("revoked"));
    assert_eq!(hub.state("k-pre-2").as_deref(), Some("revoked"));
    assert_eq!(hub.state("k-act").as_deref(), Some("active"));
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE kind = 'key.revoked' AND reason = 'superseded_by_checkin'"),
        2
    );
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE kind = 'key.activated'"),
        1
    );
    assert_eq!(
        hub.count("SELECT count(*) FROM reservation_tombstones WHERE reservation_id = 'r-1'"),
        1
    );
    // A pre-issued key of r-1 arriving late is refused.
    assert_eq!(
        outcome(&hub.change(4, 4, issue(pre("k-pre-3", "r-1", 4)))),
        rejected(Reason::Revoked)
    );
}

#[test]
fn a_check_in_may_move_the_reservations_own_pre_issued_key_to_active() {
    let hub = Hub::new();
    hub.change(1, 1, issue(pre("k-1", "r-1", 1)));
    let a = hub.change(
        2,
        2,
        checkin("r-1", "c-1", grant("k-1", 2, Active, "c-1", 1)),
    );
    assert_eq!(outcome(&a), APPLIED);
    assert_eq!(hub.state("k-1").as_deref(), Some("active"));
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE kind = 'key.revoked'"),
        0
    );
}

#[test]
fn a_check_in_that_does_not_raise_its_pre_issued_keys_version_is_an_illegal_transition() {
    let hub = Hub::new();
    hub.change(1, 1, issue(pre("k-1", "r-1", 1)));
    let a = hub.change(
        2,
        2,
        checkin("r-1", "c-1", grant("k-1", 1, Active, "c-1", 1)),
    );
    assert_eq!(outcome(&a), rejected(Reason::IllegalTransition));
    assert_eq!(hub.state("k-1").as_deref(), Some("pre_issued"));
    assert_eq!(hub.count("SELECT count(*) FROM reservation_tombstones"), 0);
    // A lower version too; a higher one activates it.
    let mut v2 = pre("k-2", "r-2", 2);
    v2.version = 2;
    hub.change(3, 3, issue(v2));
    let lower = hub.change(
        4,
        4,
        checkin("r-2", "c-2", grant("k-2", 1, Active, "c-2", 2)),
    );
    assert_eq!(outcome(&lower), rejected(Reason::IllegalTransition));
    let higher = hub.change(
        5,
        5,
        checkin("r-2", "c-2", grant("k-2", 3, Active, "c-2", 2)),
    );
    assert_eq!(outcome(&higher), APPLIED);
    assert_eq!(hub.state("k-2").as_deref(), Some("active"));
}

#[test]
fn a_check_in_naming_another_reservations_pre_issued_key_at_its_version_is_a_plain_noop_for_that_key()
 {
    let hub = Hub::new();
    hub.change(1, 1, issue(pre("k-other", "r-2", 1)));
    hub.change(2, 2, issue(pre("k-own", "r-1", 2)));
    let a = hub.change(
        3,
        3,
        checkin("r-1", "c-1", grant("k-other", 1, Active, "c-1", 1)),
    );
    // mqtt.md step 5: only the reservation's own pre-issued keys need a
    // higher version; the rest of the check-in applies.
    assert_eq!(outcome(&a), APPLIED);
    assert_eq!(hub.state("k-other").as_deref(), Some("pre_issued"));
    assert_eq!(hub.state("k-own").as_deref(), Some("revoked"));
    assert_eq!(hub.count("SELECT count(*) FROM reservation_tombstones"), 1);
}

#[test]
fn guest_erasure_clears_the_name_from_live_and_final_keys_and_from_audit_rows() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    hub.change(2, 2, issue(grant("k-2", 1, Active, "c-2", 2)));
    hub.change(3, 3, revoke("k-1", "checkout"));
    let a = hub.change(
        4,
        4,
        Change::GuestErased {
            holder_ref: "g-1".into(),
        },
    );
    assert_eq!(outcome(&a), APPLIED);
    assert!(a.erased);
    assert_eq!(
        hub.count("SELECT count(*) FROM keys WHERE holder_name IS NOT NULL"),
        0
    );
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE holder_name IS NOT NULL"),
        0
    );
    assert_eq!(hub.count("SELECT count(*) FROM keys"), 2, "the rows stay");
    assert_eq!(hub.count("SELECT count(*) FROM audit"), 3, "the rows stay");
    // Nothing left to erase.
    let again = hub.change(
        5,
        5,
        Change::GuestErased {
            holder_ref: "g-1".into(),
        },
    );
    assert_eq!(outcome(&again), NOOP);
}

#[test]
fn schema_rejections_from_the_caller_are_recorded_with_their_reason_and_item() {
    let hub = Hub::new();
    let codes = [
        Reason::UnsupportedType,
        Reason::InvalidGrant,
        Reason::UnknownDoor,
        Reason::UnknownPinKey,
    ];
    for (i, reason) in codes.into_iter().enumerate() {
        let n = i as u64 + 1;
        let a = hub.apply(
            n as u128,
            Some(n),
            Err(SchemaError {
                reason,
                item: (i == 2).then_some(1),
            }),
            &format!("b{n}"),
        );
        assert_eq!(outcome(&a), rejected(reason));
        assert_eq!(a.result.item, (i == 2).then_some(1));
        assert_eq!(a.watermark, n, "the seq counts whatever the outcome");
    }
    assert_eq!(
        hub.count("SELECT count(*) FROM dedupe WHERE outcome = 'rejected'"),
        4
    );
    assert_eq!(hub.count("SELECT count(*) FROM keys"), 0);
}

#[test]
fn the_same_event_twice_returns_its_first_result_and_changes_nothing() {
    let hub = Hub::new();
    let first = hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    let before = dump(&hub.reader(), &["outbox"]);
    let outbox_before = hub.count("SELECT count(*) FROM outbox");
    let again = hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    assert_eq!(
        again.result,
        EventResult {
            duplicate: true,
            ..first.result.clone()
        }
    );
    assert_eq!(dump(&hub.reader(), &["outbox"]), before);
    assert_eq!(hub.count("SELECT count(*) FROM outbox"), outbox_before + 1);
    let last: String = hub
        .reader()
        .query_row(
            "SELECT CAST(body AS TEXT) FROM outbox ORDER BY id DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(last.contains(r#""duplicate":true"#) && last.contains(r#""outcome":"applied""#));
    // A rejected first result is replayed as such, too.
    let r = hub.change(2, 2, issue(grant("k-2", 1, Active, "c-1", 2)));
    let r2 = hub.change(2, 2, issue(grant("k-2", 1, Active, "c-1", 2)));
    assert_eq!(outcome(&r2), rejected(Reason::OneActiveConflict));
    assert_eq!(
        r2.result,
        EventResult {
            duplicate: true,
            ..r.result
        }
    );
}

/// The dedupe row keeps the result's JSON only when its columns cannot say
/// it all (a clamp, a batch's items, a failing item): the replay is the
/// same first result either way.
#[test]
fn a_dedupe_row_stores_the_result_json_only_when_its_columns_cannot_rebuild_it() {
    let hub = Hub::new();
    let plain = hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    let stale = hub.change(2, 1, issue(grant("k-2", 1, Active, "c-2", 2)));
    assert_eq!(outcome(&stale), rejected(Reason::StaleSeq));
    let mut long = grant("k-3", 1, Active, "c-3", 3);
    long.valid_until = long.valid_from.saturating_add_days(90);
    let clamped = hub.change(3, 2, issue(long.clone()));
    assert!(clamped.result.clamped);
    let batch = hub.apply(
        4,
        Some(3),
        Ok(EventKind::Batch(vec![issue(grant(
            "k-4", 1, Active, "c-4", 4,
        ))])),
        "body-4",
    );
    let stored = |id: u128| -> Option<String> {
        hub.reader()
            .query_row(
                "SELECT result FROM dedupe WHERE event_id = ?1",
                [uuid::Uuid::from_u128(id).to_string()],
                |r| r.get(0),
            )
            .unwrap()
    };
    assert_eq!(stored(1), None, "an applied change: the columns say it all");
    assert_eq!(stored(2), None, "a rejection with its reason, too");
    assert!(stored(3).is_some_and(|j| j.contains(r#""clamped":true"#)));
    assert!(stored(4).is_some_and(|j| j.contains(r#""items""#)));
    for (id, seq, kind, body, first) in [
        (
            1,
            Some(1),
            Ok(EventKind::Change(issue(grant("k-1", 1, Active, "c-1", 1)))),
            "body-1",
            plain,
        ),
        (
            2,
            Some(1),
            Ok(EventKind::Change(issue(grant("k-2", 1, Active, "c-2", 2)))),
            "body-2",
            stale,
        ),
        (
            3,
            Some(2),
            Ok(EventKind::Change(issue(long.clone()))),
            "body-3",
            clamped,
        ),
        (
            4,
            Some(3),
            Ok(EventKind::Batch(vec![issue(grant(
                "k-4", 1, Active, "c-4", 4,
            ))])),
            "body-4",
            batch,
        ),
    ] {
        let again = hub.apply(id, seq, kind, body);
        assert_eq!(
            again.result,
            EventResult {
                duplicate: true,
                ..first.result
            },
            "event {id}"
        );
    }
}

#[test]
fn a_different_body_under_a_seen_id_is_a_conflict_and_the_first_record_stands() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    let before = dump(
        &hub.reader(),
        &["outbox", "alerts", "seq_state", "time_floor"],
    );
    let a = hub.apply(
        1,
        Some(1),
        Ok(EventKind::Change(issue(grant("k-1", 2, Active, "c-1", 1)))),
        "another body",
    );
    assert_eq!(outcome(&a), (Outcome::Conflict, None));
    assert!(!a.result.duplicate);
    assert_eq!(
        dump(
            &hub.reader(),
            &["outbox", "alerts", "seq_state", "time_floor"]
        ),
        before
    );
    assert_eq!(
        hub.count(&format!(
            "SELECT count(*) FROM alerts WHERE condition = 'event_id_conflict' AND subject = '{}' AND state = 'raised'",
            uuid::Uuid::from_u128(1)
        )),
        1
    );
    // The original is still answered as a duplicate of its first result.
    let dup = hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    assert_eq!(outcome(&dup), APPLIED);
    assert!(dup.result.duplicate);
}

#[test]
fn a_new_id_under_a_seen_seq_is_stale() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    hub.change(2, 3, issue(grant("k-3", 1, Active, "c-3", 3)));
    let below = hub.change(10, 1, issue(grant("k-x", 1, Active, "c-x", 10)));
    assert_eq!(outcome(&below), rejected(Reason::StaleSeq));
    let above = hub.change(11, 3, issue(grant("k-y", 1, Active, "c-y", 11)));
    assert_eq!(
        outcome(&above),
        rejected(Reason::StaleSeq),
        "3 was seen above the watermark"
    );
    assert_eq!(hub.state("k-x"), None);
    assert_eq!(hub.state("k-y"), None);
}

#[test]
fn the_watermark_advances_over_contiguous_seqs_and_gaps_are_reported() {
    let hub = Hub::new();
    let a = hub.change(1, 1, revoke("a", "x"));
    assert_eq!((a.watermark, a.gap), (1, false));
    let b = hub.change(2, 4, revoke("b", "x"));
    assert_eq!((b.watermark, b.gap), (1, true));
    let c = hub.change(3, 3, revoke("c", "x"));
    assert_eq!((c.watermark, c.gap), (1, true));
    let r = hub.reader();
    assert_eq!(seq_status(&r).unwrap().first_missing, Some(2));
    let d = hub.change(4, 2, revoke("d", "x"));
    assert_eq!((d.watermark, d.gap), (4, false));
    assert_eq!(hub.count("SELECT count(*) FROM seq_seen"), 0);
    let s = seq_status(&r).unwrap();
    assert_eq!((s.watermark, s.first_missing), (4, None));
    assert_eq!(s.last_sign_of_life, Some(now()));
}

#[test]
fn duplicates_conflicts_stale_seqs_and_gap_fillers_are_no_sign_of_life() {
    let hub = Hub::new();
    let life = |hub: &Hub| seq_status(&hub.reader()).unwrap().last_sign_of_life;
    let first = hub.change(1, 1, revoke("a", "x"));
    assert!(first.sign_of_life);
    assert_eq!(life(&hub), Some(now()));
    let later = now().saturating_add_secs(600);
    let replay = |id: u128, seq: u64, body: &str| {
        hub.apply_at(
            id,
            Some(seq),
            Ok(EventKind::Change(revoke("a", "x"))),
            body,
            now(),
            later,
        )
    };
    let dup = replay(1, 1, "body-1");
    assert!(dup.result.duplicate && !dup.sign_of_life, "a duplicate");
    let conflict = replay(1, 1, "another body");
    assert!(
        conflict.result.outcome == Outcome::Conflict && !conflict.sign_of_life,
        "a conflict"
    );
    let stale = replay(2, 1, "body-2");
    assert!(
        stale.result.reason == Some(Reason::StaleSeq) && !stale.sign_of_life,
        "a stale_seq replay"
    );
    assert_eq!(life(&hub), Some(now()), "the durable sign of life stayed");
    // Above a gap is new; the re-sent event that fills the gap is not.
    assert!(replay(3, 5, "body-3").sign_of_life);
    assert_eq!(life(&hub), Some(later));
    let filler = hub.apply_at(
        4,
        Some(2),
        Ok(EventKind::Change(revoke("b", "x"))),
        "body-4",
        now(),
        later.saturating_add_secs(60),
    );
    assert_eq!(outcome(&filler), APPLIED);
    assert!(!filler.sign_of_life);
    assert_eq!(life(&hub), Some(later));
}

#[test]
fn a_checkpoint_is_a_noop_that_records_its_head_and_only_a_fresh_one_is_a_sign_of_life() {
    let hub = Hub::new();
    let old = Timestamp(now().0 - 3600 * 1_000_000);
    let a = hub.apply_at(
        1,
        None,
        Ok(EventKind::Checkpoint {
            head_seq: 7,
            mirror: None,
        }),
        "cp1",
        old,
        now(),
    );
    assert_eq!(outcome(&a), NOOP);
    assert_eq!(a.result.seq, None);
    assert_eq!(a.head_seq, Some(7));
    let s = seq_status(&hub.reader()).unwrap();
    assert_eq!(
        (s.head_seq, s.first_missing, s.last_sign_of_life),
        (7, Some(1), None)
    );
    let later = now().saturating_add_secs(60);
    hub.apply_at(
        2,
        None,
        Ok(EventKind::Checkpoint {
            head_seq: 5,
            mirror: None,
        }),
        "cp2",
        later,
        later,
    );
    let s = seq_status(&hub.reader()).unwrap();
    assert_eq!(s.head_seq, 7, "the highest head stands");
    assert_eq!(s.last_sign_of_life, Some(later));
    // The time floor rose to the newest issued_at.
    assert_eq!(hub.count("SELECT floor FROM time_floor"), later.0);
}

#[test]
fn a_batch_applies_its_items_and_skips_revoked_and_noop_items() {
    let hub = Hub::new();
    hub.change(1, 1, revoke("k-ghost", "x"));
    hub.change(2, 2, issue(grant("k-old", 1, Active, "c-0", 9)));
    hub.change(3, 3, revoke("k-old", "x"));
    let a = hub.change(
        4,
        4,
        Change::KeyIssued {
            key: grant("ignored", 1, Active, "c-z", 0),
            supersedes: vec![],
        },
    );
    assert_eq!(outcome(&a), APPLIED);
    let items = vec![
        issue(grant("k-b1", 1, Active, "c-3", 1)),
        issue(grant("k-ghost", 1, Active, "c-6", 2)),
        revoke("k-old", "again"),
        issue(grant("k-old", 2, Active, "c-0", 9)),
    ];
    let b = hub.apply(5, Some(5), Ok(EventKind::Batch(items)), "batch");
    assert_eq!(outcome(&b), APPLIED);
    let got: Vec<_> = b
        .result
        .items
        .unwrap()
        .iter()
        .map(|i| (i.outcome, i.reason))
        .collect();
    assert_eq!(
        got,
        [
            APPLIED,
            rejected(Reason::Revoked),
            NOOP,
            rejected(Reason::IllegalTransition)
        ]
    );
    assert_eq!(b.result.item, None);
    assert_eq!(hub.state("k-b1").as_deref(), Some("active"));
}

#[test]
fn a_batch_with_a_hard_rejection_applies_nothing_and_names_the_item() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    let items = vec![
        issue(grant("k-2", 1, Active, "c-2", 2)),
        revoke("k-1", "x"),
        issue(grant("k-3", 1, Active, "c-3", 2)), // pin collision with k-2
    ];
    let before = dump(
        &hub.reader(),
        &["outbox", "dedupe", "seq_state", "time_floor", "seq_seen"],
    );
    let b = hub.apply(2, Some(2), Ok(EventKind::Batch(items)), "batch");
    assert_eq!(outcome(&b), rejected(Reason::PinCollision));
    assert_eq!(b.result.item, Some(2));
    assert_eq!(b.result.items, None);
    assert_eq!(
        dump(
            &hub.reader(),
            &["outbox", "dedupe", "seq_state", "time_floor", "seq_seen"]
        ),
        before,
        "nothing applied but the dedupe and seq records"
    );
    assert_eq!(hub.state("k-1").as_deref(), Some("active"));
}

#[test]
fn batch_items_are_decided_in_order_so_an_earlier_item_failing_a_later_step_is_the_one_reported() {
    let hub = Hub::new();
    hub.change(1, 1, issue(grant("k-1", 1, Active, "c-1", 1)));
    let unknown_door = SchemaError {
        reason: Reason::UnknownDoor,
        item: Some(2),
    };
    // Item 1 collides with k-1's PIN (step 7); item 2 failed step 4.
    let items = vec![
        revoke("k-ghost", "x"),
        issue(grant("k-2", 1, Active, "c-2", 1)),
    ];
    let b = hub.apply(
        2,
        Some(2),
        Ok(EventKind::BatchCutShort {
            items,
            invalid: unknown_door,
        }),
        "batch-1",
    );
    assert_eq!(outcome(&b), rejected(Reason::PinCollision));
    assert_eq!(b.result.item, Some(1));
    assert_eq!(
        hub.count("SELECT count(*) FROM key_tombstones"),
        0,
        "rolled back"
    );
    // With nothing failing before it, the step-4 failure is reported.
    let b = hub.apply(
        3,
        Some(3),
        Ok(EventKind::BatchCutShort {
            items: vec![revoke("k-ghost", "x")],
            invalid: unknown_door,
        }),
        "batch-2",
    );
    assert_eq!(outcome(&b), rejected(Reason::UnknownDoor));
    assert_eq!(b.result.item, Some(2));
    assert_eq!(b.result.items, None);
    assert_eq!(
        hub.count("SELECT count(*) FROM key_tombstones"),
        0,
        "rolled back"
    );
}

#[test]
fn a_batch_of_only_noops_is_a_noop() {
    let hub = Hub::new();
    hub.change(1, 1, revoke("k-ghost", "x"));
    let b = hub.apply(
        2,
        Some(2),
        Ok(EventKind::Batch(vec![revoke("k-ghost", "y")])),
        "b",
    );
    assert_eq!(outcome(&b), NOOP);
    let e = hub.apply(3, Some(3), Ok(EventKind::Batch(vec![])), "e");
    assert_eq!(outcome(&e), NOOP);
}

#[test]
fn step1_rejections_are_published_and_counted_without_claiming_anything() {
    let hub = Hub::new();
    for (i, reason) in [
        Reason::BadSignature,
        Reason::UnknownSigner,
        Reason::WrongHub,
    ]
    .into_iter()
    .enumerate()
    {
        let result = EventResult {
            event_id: Some(uuid::Uuid::from_u128(i as u128)),
            seq: None,
            outcome: Outcome::Rejected,
            reason: Some(reason),
            duplicate: false,
            clamped: false,
            at: now(),
            valid_until: None,
            item: None,
            items: None,
        };
        hub.store
            .write_blocking(Priority::Bulk, move |c| {
                record_step1_rejection(c, &result, now())
            })
            .unwrap();
    }
    assert_eq!(
        hub.count(
            "SELECT count FROM alerts WHERE condition = 'bad_signature' AND subject = 'cloud'"
        ),
        2
    );
    assert_eq!(
        hub.count(
            "SELECT count FROM alerts WHERE condition = 'malformed_event' AND subject = 'cloud'"
        ),
        1
    );
    assert_eq!(
        hub.count("SELECT count(*) FROM outbox WHERE topic = 'results'"),
        3
    );
    assert_eq!(hub.count("SELECT count(*) FROM dedupe"), 0);
    assert_eq!(hub.count("SELECT watermark FROM seq_state"), 0);
}

#[test]
fn two_threads_racing_to_activate_keys_for_one_check_in_never_leave_two_active() {
    let hub = Arc::new(Hub::new());
    let rounds = 200u64;
    for round in 0..rounds {
        let barrier = Arc::new(Barrier::new(2));
        let handles: Vec<_> = (0..2u64)
            .map(|side| {
                let hub = hub.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let seq = round * 2 + side + 1;
                    let key = format!("k-{round}-{side}");
                    let check_in = format!("c-{round}");
                    let g = grant(&key, 1, Active, &check_in, (seq % 251) as u8);
                    let mut g = g;
                    g.pin_tag.0[1] = side as u8; // distinct tags: only the check-in collides
                    g.pin_tag.0[2] = (round >> 8) as u8;
                    g.pin_tag.0[3] = round as u8;
                    barrier.wait();
                    hub.change(seq as u128 + 1000, seq, issue(g))
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let mut got: Vec<_> = results.iter().map(outcome).collect();
        got.sort_by_key(|o| o.0 as u8);
        assert_eq!(
            got,
            [APPLIED, rejected(Reason::OneActiveConflict)],
            "round {round}"
        );
        assert_eq!(
            hub.count(&format!(
                "SELECT count(*) FROM keys WHERE check_in_id = 'c-{round}' AND state = 'active'"
            )),
            1
        );
    }
    assert_eq!(
        hub.count("SELECT count(*) FROM (SELECT check_in_id FROM keys WHERE state = 'active' GROUP BY check_in_id HAVING count(*) > 1)"),
        0
    );
    assert_eq!(
        hub.count("SELECT watermark FROM seq_state"),
        (rounds * 2) as i64
    );
}

/// Takes one use of `key_id` the way a door entry does (the schema's rules
/// hold for it too).
fn take_use(hub: &Hub, key_id: &'static str) {
    hub.store
        .write_blocking(Priority::Bulk, move |c| {
            Ok(c.execute(
                "UPDATE keys SET use_count = use_count + 1 WHERE key_id = ?1",
                [key_id],
            )?)
        })
        .unwrap();
}

fn limited(
    key_id: &str,
    version: u64,
    tag: u8,
    max_uses: Option<u32>,
) -> lockhub_proto::event::Grant {
    let mut g = grant(key_id, version, Active, "c-1", tag);
    g.max_uses = max_uses;
    g.schedule = lockhub_proto::schedule::Schedule::new(vec![
        lockhub_proto::schedule::Interval::parse_text("mon-fri 09:00-17:30").unwrap(),
    ]);
    g
}

#[test]
fn a_grant_stores_its_schedule_and_max_uses_and_starts_with_no_use_taken() {
    let hub = Hub::new();
    assert_eq!(
        outcome(&hub.change(1, 1, issue(limited("k-1", 1, 1, Some(3))))),
        APPLIED
    );
    let (schedule, max, uses): (String, i64, i64) = hub
        .reader()
        .query_row(
            "SELECT schedule, max_uses, use_count FROM keys WHERE key_id = 'k-1'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(
        schedule,
        r#"[{"days":["mon","tue","wed","thu","fri"],"from":"09:00","until":"17:30"}]"#
    );
    assert_eq!((max, uses), (3, 0));
}

#[test]
fn a_higher_version_keeps_the_count_and_applies_its_own_limit() {
    let hub = Hub::new();
    hub.change(1, 1, issue(limited("k-1", 1, 1, Some(5))));
    take_use(&hub, "k-1");
    take_use(&hub, "k-1");
    // Raised, then lifted: the count stays.
    assert_eq!(
        outcome(&hub.change(2, 2, issue(limited("k-1", 2, 1, Some(9))))),
        APPLIED
    );
    assert_eq!(
        outcome(&hub.change(3, 3, issue(limited("k-1", 3, 1, None)))),
        APPLIED
    );
    assert_eq!(
        hub.count(
            "SELECT use_count FROM keys WHERE key_id = 'k-1' AND max_uses IS NULL AND version = 3"
        ),
        2
    );
    assert_eq!(hub.state("k-1").as_deref(), Some("active"));
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE kind = 'key.used_up'"),
        0
    );
    // Lowered to the count: used up at once, audited with the event.
    let a = hub.change(4, 4, issue(limited("k-1", 4, 1, Some(2))));
    assert_eq!(outcome(&a), APPLIED);
    assert_eq!(hub.state("k-1").as_deref(), Some("used_up"));
    assert_eq!(
        hub.count(
            "SELECT count(*) FROM audit WHERE kind = 'key.used_up' AND key_id = 'k-1'
                     AND event_id = '00000000-0000-0000-0000-000000000004'"
        ),
        1
    );
    assert_eq!(
        hub.count("SELECT count(*) FROM key_doors WHERE key_id = 'k-1' AND live = 0"),
        1,
        "its doors stay, out of service"
    );
}

#[test]
fn a_used_up_key_refuses_a_higher_version_and_is_only_revoked() {
    let hub = Hub::new();
    hub.change(1, 1, issue(limited("k-1", 1, 1, Some(1))));
    hub.change(2, 2, issue(limited("k-1", 2, 1, Some(1))));
    take_use_to_the_end(&hub);
    assert_eq!(hub.state("k-1").as_deref(), Some("used_up"));
    assert_eq!(
        outcome(&hub.change(3, 3, issue(limited("k-1", 3, 1, Some(9))))),
        rejected(Reason::IllegalTransition)
    );
    assert_eq!(
        outcome(&hub.change(4, 4, issue(limited("k-1", 2, 1, Some(9))))),
        NOOP
    );
    assert_eq!(
        outcome(&hub.change(5, 5, revoke("k-1", "checkout"))),
        APPLIED
    );
    assert_eq!(hub.state("k-1").as_deref(), Some("revoked"));
    assert_eq!(
        hub.count("SELECT count(*) FROM audit WHERE kind = 'key.revoked' AND key_id = 'k-1'"),
        1
    );
    assert_eq!(outcome(&hub.change(6, 6, revoke("k-1", "again"))), NOOP);
}

/// The one use of `k-1` taken by an entry: the last, so it ends the key.
fn take_use_to_the_end(hub: &Hub) {
    hub.store
        .write_blocking(Priority::Bulk, |c| {
            Ok(c.execute(
                "UPDATE keys SET use_count = use_count + 1, state = 'used_up' WHERE key_id = 'k-1'",
                [],
            )?)
        })
        .unwrap();
}
