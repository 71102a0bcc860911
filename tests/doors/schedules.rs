//! Schedules and use-limited keys at a lock board on a real pseudo-terminal:
//! the serial driver decides with the hub's clock (here a test's own, so
//! hours pass without a sleep) in the hub's time zone.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use firmware_bridge::{DenyReason, Downlink};
use lockhub::config::Policy;
use lockhub::sim::board::SimEvent;
use lockhub_proto::time::Timestamp;
use testkit::board::pty::Pty;
use testkit::board::*;
use testkit::db::{Db, K, insert_key, regrant};

/// Distinct `Unlock` (or, with `deny`, `Deny` reason 1) commands, by seq,
/// the board received for `door`: every answer, also one that finds the
/// relay still open or the display already showing a denial.
fn answers(sim: &Sim, door: u8, deny: bool) -> usize {
    sim.events()
        .filter_map(|e| match e {
            SimEvent::Received(Downlink::Unlock { seq, door: d, .. }) if !deny && *d == door => {
                Some(*seq)
            }
            SimEvent::Received(Downlink::Deny {
                seq,
                door: d,
                reason,
            }) if deny && *d == door && *reason == DenyReason::DENIED => Some(*seq),
            _ => None,
        })
        .collect::<std::collections::BTreeSet<u16>>()
        .len()
}

fn unlocks(sim: &Sim, door: u8) -> usize {
    answers(sim, door, false)
}

fn denials(sim: &Sim, door: u8) -> usize {
    answers(sim, door, true)
}

/// A person's pace between entries: beyond 4 entries a second at a door,
/// the flood limit answers without a decision (serial.md).
async fn pace() {
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
}

fn at(s: &str) -> Timestamp {
    Timestamp::parse_rfc3339(s).unwrap()
}

/// Key `k-1` (PIN 482913, door 101) for the whole of December 2026, with
/// `max_uses` and a schedule (the wire's JSON), as a later version wrote them.
async fn key_with(db: &Db, max_uses: Option<u32>, schedule: Option<&'static str>) {
    let key = K {
        from: at("2026-11-01T00:00:00Z"),
        until: at("2027-01-01T00:00:00Z"),
        ..K::active("k-1", "482913", &["101"])
    };
    db.store
        .write(lockhub::store::Priority::Bulk, move |c| {
            insert_key(c, &key)?;
            regrant(c, "k-1", max_uses, schedule)?;
            Ok(())
        })
        .await
        .unwrap();
}

/// One board with door 101 (index 0), in `zone`, on the clock `now`.
async fn board_in(
    db: &Db,
    zone: &str,
    now: lockhub::drivers::TimeSource,
) -> (lockhub::drivers::serial::SerialHandle, Sim, PtyKeep) {
    let pty = Pty::open();
    let mut s = settings(
        vec![port(
            "board-a",
            by_id(db, "board-a", &pty),
            vec![door("101", 0)],
        )],
        db.policy,
    );
    s.zone = lockhub::config::time_zone(zone).unwrap();
    let hub = start_with_clock(db, s, now);
    let (mut sim, keep) = board(pty, 1);
    until_linked(&mut sim).await;
    (hub, sim, keep)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_key_opens_inside_its_hours_and_is_denied_outside_them_by_the_hubs_clock() {
    let db = Db::open_with(Policy::default());
    key_with(
        &db,
        None,
        Some(r#"[{"days":["mon","tue","wed","thu","fri"],"from":"09:00","until":"17:30"}]"#),
    )
    .await;
    let clock = Arc::new(AtomicI64::new(at("2026-12-04T08:30:00Z").0));
    let c = clock.clone();
    let (hub, mut sim, _keep) = board_in(
        &db,
        "Europe/Berlin",
        Arc::new(move || Timestamp(c.load(Ordering::SeqCst))),
    )
    .await;

    // Friday 09:30 in Berlin: inside.
    sim.enter_pin(0, "482913");
    assert!(sim.run_until(WAIT, |s| unlocks(s, 0) == 1).await.unwrap());
    // Saturday 11:00 in Berlin, a day later on the hub's clock: outside.
    clock.store(at("2026-12-05T10:00:00Z").0, Ordering::SeqCst);
    sim.enter_pin(0, "482913");
    assert!(sim.run_until(WAIT, |s| denials(s, 0) == 1).await.unwrap());
    // Friday 18:00 in Berlin: outside; Monday 09:00 sharp: inside.
    clock.store(at("2026-12-11T17:00:00Z").0, Ordering::SeqCst);
    sim.enter_pin(0, "482913");
    assert!(sim.run_until(WAIT, |s| denials(s, 0) == 2).await.unwrap());
    clock.store(at("2026-12-14T08:00:00Z").0, Ordering::SeqCst);
    sim.enter_pin(0, "482913");
    assert!(sim.run_until(WAIT, |s| unlocks(s, 0) == 2).await.unwrap());
    assert!(
        until_db(&mut sim, &db, |db| db
            .audit()
            .iter()
            .filter(|a| a.starts_with("door."))
            .count()
            == 6)
        .await
    );
    let decisions: Vec<String> = db
        .audit()
        .into_iter()
        .filter(|a| a.starts_with("door.granted") || a.starts_with("door.denied"))
        .collect();
    assert_eq!(
        decisions,
        [
            "door.granted@101",
            "door.denied/outside_schedule@101",
            "door.denied/outside_schedule@101",
            "door.granted@101"
        ]
    );
    assert_eq!(unlocks(&sim, 0), 2);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_use_key_opens_twice_then_is_denied_used_up_with_key_used_up_audited_once() {
    let db = Db::open_with(Policy::default());
    key_with(&db, Some(2), None).await;
    let (hub, mut sim, _keep) = board_in(
        &db,
        "UTC",
        Arc::new(|| Timestamp::parse_rfc3339("2026-12-04T12:00:00Z").unwrap()),
    )
    .await;
    for n in 1..=2 {
        pace().await;
        sim.enter_pin(0, "482913");
        assert!(sim.run_until(WAIT, |s| unlocks(s, 0) == n).await.unwrap());
    }
    for n in 1..=6 {
        pace().await;
        sim.enter_pin(0, "482913");
        assert!(sim.run_until(WAIT, |s| denials(s, 0) == n).await.unwrap());
    }
    let settled = until_db(&mut sim, &db, |db| {
        db.audit()
            .iter()
            .filter(|a| a.starts_with("door.denied"))
            .count()
            == 6
    })
    .await;
    let audit = db.audit();
    assert!(settled, "{audit:?}");
    assert_eq!(audit.iter().filter(|a| *a == "door.granted@101").count(), 2);
    assert_eq!(
        audit
            .iter()
            .filter(|a| a.starts_with("key.used_up"))
            .count(),
        1
    );
    assert_eq!(
        audit
            .iter()
            .filter(|a| *a == "door.denied/used_up@101")
            .count(),
        6
    );
    // Six denials of a real PIN lock nothing: the seventh try is not locked out.
    assert!(!audit.iter().any(|a| a.starts_with("door.locked_out")));
    assert_eq!(unlocks(&sim, 0), 2);
    let (state, uses): (String, i64) = db
        .reader()
        .query_row(
            "SELECT state, use_count FROM keys WHERE key_id = 'k-1'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((state.as_str(), uses), ("used_up", 2));
    hub.shutdown().await;
}

/// The same weekly hours at an OSDP reader: the libosdp peer on a pty,
/// over a Secure Channel, with the OSDP driver deciding on the test's clock
/// in the hub's time zone (the daemon's own clock cannot be driven, so the
/// driver runs in this process, as the serial tests above run theirs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_an_osdp_reader_a_scheduled_key_opens_inside_its_hours_and_is_denied_outside_them_by_the_hubs_clock()
 {
    use crate::osdp::{KEY_1, PIN, audit_rows, trusted, typed};
    use lockhub::config::ReaderDoorConfig;
    use lockhub::drivers::osdp::bus::settings::{BusSettings, OsdpSettings, ReaderSettings};
    use lockhub::drivers::osdp::cp::{Security, Timing};
    use std::time::Duration;
    use testkit::osdp_peer::{Peer, key_hex};

    let db = Db::open_with(Policy::default());
    key_with(
        &db,
        None,
        Some(r#"[{"days":["mon","tue","wed","thu","fri"],"from":"09:00","until":"17:30"}]"#),
    )
    .await;
    // Friday 09:30 in Berlin.
    let clock = Arc::new(AtomicI64::new(at("2026-12-04T08:30:00Z").0));
    let c = clock.clone();
    let mut peer = Peer::start(&["--key", &key_hex(&KEY_1), "--address", "1"]);
    let settings = OsdpSettings {
        buses: vec![BusSettings {
            name: "bus-a".into(),
            path: peer.port.clone(),
            baud: 9600,
            readers: vec![ReaderSettings {
                name: "r-1".into(),
                address: 1,
                security: Security::Secure(KEY_1),
                doors: vec![ReaderDoorConfig {
                    name: "101".into(),
                    reader: "r-1".into(),
                    output: 1,
                    contact_input: None,
                    contact_inverted: false,
                    unlock_ms: 2000,
                }],
                board_door: None,
            }],
        }],
        policy: db.policy,
        pin_keys: testkit::db::pin_keys().into(),
        zone: lockhub::config::time_zone("Europe/Berlin").unwrap(),
        timing: Timing::CONTRACT,
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_secs(1),
    };
    let hub = lockhub::drivers::osdp::bus::spawn(
        settings,
        db.store.clone(),
        Arc::new(move || Timestamp(c.load(Ordering::SeqCst))),
        None,
        &Default::default(),
    );
    let until = |what: &str, f: &dyn Fn(&rusqlite::Connection) -> bool| {
        let end = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if f(&db.store.reader().unwrap()) {
                return;
            }
            assert!(std::time::Instant::now() < end, "never: {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    until("the reader on a Secure Channel", &|db| trusted(db, "r-1"));

    peer.forget();
    peer.keys(&typed(PIN));
    peer.wait("the strike's osdp_OUT", Duration::from_secs(3), |v| {
        v["cmd"] == "output"
    });
    until("the grant and its unlock", &|db| {
        audit_rows(db, "101") == ["door.granted:k-1", "door.unlocked:k-1"]
    });

    // Saturday 11:00 in Berlin, a day later on the hub's clock: outside.
    clock.store(at("2026-12-05T10:00:00Z").0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    peer.forget();
    peer.keys(&typed(PIN));
    let led = peer.wait("the red LED", Duration::from_secs(3), |v| v["cmd"] == "led");
    assert_eq!(led["on_color"], 1, "{led}");
    until("the denial outside the schedule", &|db| {
        audit_rows(db, "101")
            == [
                "door.granted:k-1",
                "door.unlocked:k-1",
                "door.denied/outside_schedule",
            ]
    });
    assert!(peer.commands("output").is_empty(), "no opening outside");

    // Monday 09:00 sharp in Berlin: inside again.
    clock.store(at("2026-12-07T08:00:00Z").0, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    peer.forget();
    peer.keys(&typed(PIN));
    peer.wait("the strike's osdp_OUT", Duration::from_secs(3), |v| {
        v["cmd"] == "output"
    });
    until("the second grant", &|db| {
        audit_rows(db, "101")
            .iter()
            .filter(|r| *r == "door.granted:k-1")
            .count()
            == 2
    });
    hub.shutdown().await;
}
