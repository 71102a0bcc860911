//! Ports and boards coming and going, over real pseudo-terminals: hub
//! restarts, unplugged boards, a second port that keeps deciding, liveness.

use testkit::board::pty;

use std::time::Duration;

use firmware_bridge::{Downlink, LinkConfig};
use lockhub::sim::board::SimEvent;
use testkit::board::pty::Pty;
use testkit::board::*;
use testkit::db::Db;
use tokio::time::Instant;

/// Hub timings shortened so offline/online shows within a test: ping every
/// 300 ms, down after 1.5 s of silence.
fn quick_link() -> LinkConfig {
    LinkConfig {
        ping_every_ms: Some(300),
        down_after_ms: 1_500,
        ..LinkConfig::hub()
    }
}

/// Waits (without stepping any board) until the store satisfies `f`.
async fn until_db_idle(db: &Db, f: impl Fn(&Db) -> bool) -> bool {
    let end = Instant::now() + WAIT;
    while Instant::now() < end {
        if f(db) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_hub_restart_the_next_pin_still_unlocks() {
    let db = Db::open();
    db.add_key("k-1", "482913", &["101"]).await;
    let pty = Pty::open();
    let s = one_door(&db, by_id(&db, "board-a", &pty));
    let hub = start(&db, s.clone());
    let (mut sim, _keep) = board(pty, 1);
    until_linked(&mut sim).await;
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 2).await);
    let closed = |s: &Sim| count(s, |e| *e == SimEvent::RelayClosed { door: 0 });
    assert!(sim.run_until(WAIT, |s| closed(s) == 1).await.unwrap());

    // The hub goes away and comes back; the board never restarts.
    hub.shutdown().await;
    let hub = start(&db, s);
    assert!(sim.run_until(WAIT, |s| hub_hellos(s) == 2).await.unwrap());
    sim.run_for(Duration::from_millis(200)).await.unwrap();
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 2)
            .await
            .unwrap()
    );
    // The new hub's seqs start at 1 again, like the old one's: only its
    // Hello kept the board from taking the Unlock for a resend.
    let seqs: Vec<u16> = sim
        .events()
        .filter_map(|e| match e {
            SimEvent::Received(Downlink::Unlock { seq, .. }) => Some(*seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs, [1, 1]);
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 4).await);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unplugged_board_is_offline_and_picked_up_again_when_its_path_returns() {
    let db = Db::open();
    db.add_key("k-1", "482913", &["101"]).await;
    // Like /dev/serial/by-id/...: a symlink the kernel re-points.
    let link = db.dir.path().join("board-a");
    let pty = Pty::open();
    pty::point(&link, &pty.path);
    let mut s = one_door(&db, link.clone());
    s.link = quick_link();
    let hub = start(&db, s);
    let (mut sim, keep) = board(pty, 1);
    until_linked(&mut sim).await;
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );

    // The Ack reached the hub before the plug was pulled.
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 2).await);
    // Unplug: both sides of the pty close; the hub reads EIO or end-of-file.
    unplug(&link, sim, keep);
    assert!(until_db_idle(&db, |db| db.raised("board_offline", "board-a")).await);

    // Plugged back in, under a new device node behind the same path.
    let pty = Pty::open();
    pty::point(&link, &pty.path);
    let (mut sim, _keep) = board(pty, 1);
    until_linked(&mut sim).await;
    assert!(until_db(&mut sim, &db, |db| !db.raised("board_offline", "board-a")).await);
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );
    assert!(until_db(&mut sim, &db, |db| db.audit().len() == 4).await);
    assert_eq!(
        db.audit(),
        [
            "door.granted@101",
            "door.unlocked@101",
            "door.granted@101",
            "door.unlocked@101"
        ]
    );
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_one_of_two_ports_dies_the_other_keeps_deciding() {
    let db = Db::open();
    db.add_key("k-a", "111222", &["101"]).await;
    db.add_key("k-b", "333444", &["201"]).await;
    let (pa, pb) = (Pty::open(), Pty::open());
    let mut s = settings(
        vec![
            port("board-a", by_id(&db, "board-a", &pa), vec![door("101", 0)]),
            port("board-b", by_id(&db, "board-b", &pb), vec![door("201", 0)]),
        ],
        db.policy,
    );
    s.link = quick_link();
    let hub = start(&db, s);
    let (mut a, keep_a) = board(pa, 1);
    let (mut b, _keep_b) = board_named(pb, 1, "board-b");
    // Both boards live at once: step them in turn.
    let end = Instant::now() + WAIT;
    while Instant::now() < end && !(a.board().link_up(a.now_ms()) && b.board().link_up(b.now_ms()))
    {
        a.step().await.unwrap();
        b.step().await.unwrap();
    }
    a.run_for(Duration::from_millis(100)).await.unwrap();
    b.run_for(Duration::from_millis(100)).await.unwrap();

    unplug(&db.dir.path().join("board-a"), a, keep_a);
    // Board B keeps deciding while A is gone, and A goes offline.
    b.enter_pin(0, "333444");
    assert!(
        b.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );
    assert!(until_db(&mut b, &db, |db| db.raised("board_offline", "board-a")).await);
    assert!(!db.raised("board_offline", "board-b"));
    b.enter_pin(0, "333444");
    assert!(
        b.run_until(WAIT, |s| count(s, relay_opened(0)) == 2)
            .await
            .unwrap()
    );
    assert!(until_db(&mut b, &db, |db| db.audit().len() == 4).await);
    assert!(db.audit().iter().all(|a| a.ends_with("@201")));
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_board_is_offline_and_its_next_frame_clears_the_alert() {
    let db = Db::open();
    let pty = Pty::open();
    let mut s = one_door(&db, by_id(&db, "board-a", &pty));
    s.link = quick_link();
    let hub = start(&db, s);
    let (mut sim, _keep) = board(pty, 1);
    until_linked(&mut sim).await;
    // The board stops answering (its loop is not run): no Pong, nothing.
    assert!(until_db_idle(&db, |db| db.raised("board_offline", "board-a")).await);
    assert!(until_db(&mut sim, &db, |db| !db.raised("board_offline", "board-a")).await);
    // One alert for the episode: raised once, cleared once.
    assert_eq!(
        db.count("SELECT count(*) FROM outbox WHERE topic = 'alerts' AND CAST(body AS TEXT) LIKE '%board_offline%'"),
        2
    );
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_is_missing_at_start_is_opened_once_it_appears() {
    let db = Db::open();
    db.add_key("k-1", "482913", &["101"]).await;
    let link = db.dir.path().join("ttyUSB-later");
    let mut s = one_door(&db, link.clone());
    s.link = quick_link();
    let hub = start(&db, s);
    // Absent long enough to count as offline; status shows the port absent.
    assert!(until_db_idle(&db, |db| db.raised("board_offline", "board-a")).await);
    assert_eq!(db.link("board-a"), Some(("absent".to_owned(), None)));
    let pty = Pty::open();
    pty::point(&link, &pty.path);
    let (mut sim, _keep) = board(pty, 1);
    until_linked(&mut sim).await;
    sim.enter_pin(0, "482913");
    assert!(
        sim.run_until(WAIT, |s| count(s, relay_opened(0)) == 1)
            .await
            .unwrap()
    );
    assert!(until_db(&mut sim, &db, |db| !db.raised("board_offline", "board-a")).await);
    // The board's Hello put its id in the links table.
    assert!(
        until_db(&mut sim, &db, |db| db.link("board-a")
            == Some(("up".to_owned(), Some(1))))
        .await
    );
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_door_is_remembered_across_hub_restarts_and_its_alert_ends_when_it_closes() {
    let db = Db::open();
    let pty = Pty::open();
    let s = one_door(&db, by_id(&db, "board-a", &pty));
    let hub = start(&db, s.clone());
    let (mut sim, _keep) = board(pty, 1);
    until_linked(&mut sim).await;
    sim.set_door(0, true);
    assert!(until_db(&mut sim, &db, |db| db.raised("door_forced", "101")).await);

    // The hub restarts while the door stands open: the board re-reports it
    // after the new Hello, which is the same opening, not a new one.
    hub.shutdown().await;
    let hub = start(&db, s.clone());
    assert!(sim.run_until(WAIT, |s| hub_hellos(s) == 2).await.unwrap());
    sim.run_for(Duration::from_millis(500)).await.unwrap();
    assert_eq!(db.audit(), ["door.forced@101"]);
    assert!(db.raised("door_forced", "101"));
    assert_eq!(
        db.count("SELECT count(*) FROM door_state WHERE door = '101' AND open = 1 AND forced = 1"),
        1
    );

    // The hub restarts again, and the door closes while it is away: the
    // board's report of it is lost with the old session, but the board
    // reports every door after the new Hello.
    hub.shutdown().await;
    sim.set_door(0, false);
    sim.run_for(Duration::from_millis(300)).await.unwrap();
    let hub = start(&db, s);
    assert!(until_db(&mut sim, &db, |db| !db.raised("door_forced", "101")).await);
    assert_eq!(
        db.count("SELECT count(*) FROM door_state WHERE door = '101' AND open = 0"),
        1
    );
    assert_eq!(db.audit(), ["door.forced@101"]);
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_door_is_remembered_across_a_port_reset_and_its_alert_ends_when_it_closes() {
    let db = Db::open();
    let link = db.dir.path().join("board-a");
    let pty = Pty::open();
    pty::point(&link, &pty.path);
    let mut s = one_door(&db, link.clone());
    s.link = quick_link();
    let hub = start(&db, s);
    let (mut sim, keep) = board(pty, 1);
    until_linked(&mut sim).await;
    sim.set_door(0, true);
    assert!(until_db(&mut sim, &db, |db| db.raised("door_forced", "101")).await);

    // The USB adapter resets (the board with it) while the door stands
    // open; the hub's port session ends and a new one starts.
    unplug(&link, sim, keep);
    assert!(until_db_idle(&db, |db| db.raised("board_offline", "board-a")).await);
    let pty = Pty::open();
    pty::point(&link, &pty.path);
    let (mut sim, _keep) = board(pty, 1);
    sim.set_door(0, true);
    until_linked(&mut sim).await;
    sim.run_for(Duration::from_millis(300)).await.unwrap();
    // The same opening, not a new forced one.
    assert_eq!(db.audit(), ["door.forced@101"]);
    assert!(db.raised("door_forced", "101"));

    sim.set_door(0, false);
    assert!(until_db(&mut sim, &db, |db| !db.raised("door_forced", "101")).await);
    assert_eq!(db.audit(), ["door.forced@101"]);
    hub.shutdown().await;
}
