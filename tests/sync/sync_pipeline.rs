//! The sync layer against a real Mosquitto, with a simple decider (verify,
//! then record the event id once): in-order acks after commit, exactly-once
//! effects across a broker restart, the outbox holding records while the
//! broker is down, signed results, TLS with client certificates, password
//! authentication. The full decision logic is tested with the daemon.

use lockhub::config::MqttConfig;
use lockhub::store::outbox::{self, Queued, Topic};
use lockhub::store::{Alone, Priority, Store, error::StoreError};
use lockhub::sync::ingest::{Decide, Decided};
use lockhub::sync::plan::{BacklogLimits, SeqStart};
use lockhub::sync::window::ReceiveWindow;
use lockhub::sync::{self, SyncHandle, SyncSettings};
use lockhub_proto::event::{EventResult, Outcome};
use lockhub_proto::time::Timestamp;
use lockhub_proto::topics::{DEFAULT_PREFIX, HubTopics};
use lockhub_proto::verify::Signer;
use lockhub_proto::verify::{self, VerifiedEvent, VerifyContext};
use rumqttc::v5::MqttOptions;
use rusqlite::Connection;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use testkit::broker::{BrokerOptions, Mosquitto, TestPki, password_file};
use testkit::cloud::{CloudClient, SIGNER_ID, assert_answered_once, cloud_key, hub_key};
use testkit::daemon::WAIT;
use testkit::files::{HUB_ID, SITE_ID};
use uuid::Uuid;

/// Verifies, then records each event id once in a table of its own and
/// queues a result; a repeat is answered `duplicate`.
struct RecordOnce {
    ring: Vec<Signer>,
    /// Extra time each commit takes, to make the hub slower than a flood.
    delay: Duration,
    /// Every n-th commit takes this long instead (longer than a job slice,
    /// so the job is cut short).
    spike: Option<(u64, Duration)>,
    commits: std::sync::atomic::AtomicU64,
    /// Events whose seq is a multiple of this go alone (`Decide::alone`),
    /// and their commit writes, starts its transaction over and writes
    /// again, as a rejected batch does.
    alone_every: Option<u64>,
    /// The event with this seq fails with a storage error the first time,
    /// after writing its row (which its job's rollback must take back).
    fail_once_at: Option<u64>,
    failed: std::sync::atomic::AtomicBool,
}

impl RecordOnce {
    /// A decider trusting the test cloud, each commit taking `delay` more,
    /// no spike, nothing alone, no failure.
    fn taking(delay: Duration) -> Self {
        RecordOnce {
            ring: vec![Signer {
                id: SIGNER_ID.into(),
                public_key: cloud_key().verifying_key(),
                not_after: None,
            }],
            delay,
            spike: None,
            commits: Default::default(),
            alone_every: None,
            fail_once_at: None,
            failed: Default::default(),
        }
    }
}

impl Decide for RecordOnce {
    type Checked = Result<VerifiedEvent, verify::Rejection>;

    fn check(&self, payload: &[u8]) -> Self::Checked {
        verify::verify_envelope(
            payload,
            &VerifyContext {
                ring: &self.ring,
                site_id: SITE_ID.parse().unwrap(),
                hub_id: HUB_ID,
                now: Timestamp::now_system(),
            },
        )
    }

    fn alone(&self, checked: &Self::Checked) -> bool {
        match (checked, self.alone_every) {
            (Ok(ev), Some(every)) => ev.header.seq.is_some_and(|s| s.is_multiple_of(every)),
            _ => false,
        }
    }

    fn commit_alone(&self, tx: &Alone<'_>, checked: Self::Checked) -> Result<Decided, StoreError> {
        // What the first try wrote is undone: only the second counts.
        tx.conn().execute_batch(
            "CREATE TABLE IF NOT EXISTS test_applied (event_id TEXT PRIMARY KEY);
             INSERT INTO test_applied (event_id) VALUES ('first try');",
        )?;
        tx.start_over()?;
        tx.conn().execute_batch(
            "CREATE TABLE IF NOT EXISTS test_alone (n INTEGER);
             INSERT INTO test_alone (n) VALUES (1);",
        )?;
        let mut out = Queued::default();
        let decided = self.commit(tx.conn(), &mut out, checked)?;
        out.flush(tx.conn())?;
        Ok(decided)
    }

    fn commit(
        &self,
        conn: &Connection,
        out: &mut Queued,
        checked: Self::Checked,
    ) -> Result<Decided, StoreError> {
        let n = self
            .commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        match self.spike {
            Some((every, long)) if n.is_multiple_of(every) => std::thread::sleep(long),
            _ => std::thread::sleep(self.delay),
        }
        let now = Timestamp::now_system();
        let ev = match checked {
            Ok(ev) => ev,
            Err(r) => {
                let res = EventResult {
                    event_id: None,
                    seq: None,
                    outcome: Outcome::Rejected,
                    reason: Some(r.reason),
                    duplicate: false,
                    clamped: false,
                    at: now,
                    valid_until: None,
                    item: None,
                    items: None,
                };
                outbox::enqueue(conn, Topic::Results, &res.to_json(), None, now)?;
                return Ok(Decided::default());
            }
        };
        conn.execute_batch("CREATE TABLE IF NOT EXISTS test_applied (event_id TEXT PRIMARY KEY)")?;
        let id = ev.header.event_id.to_string();
        let fresh = conn.execute(
            "INSERT OR IGNORE INTO test_applied (event_id) VALUES (?1)",
            [&id],
        )? == 1;
        if self.fail_once_at.is_some()
            && self.fail_once_at == ev.header.seq
            && !self.failed.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            return Err(StoreError::Unreadable {
                what: "a storage failure the test injects".into(),
            });
        }
        let res = EventResult {
            event_id: Some(ev.header.event_id),
            seq: ev.header.seq,
            outcome: Outcome::Applied,
            reason: None,
            duplicate: !fresh,
            clamped: false,
            at: now,
            valid_until: None,
            item: None,
            items: None,
        };
        // Queued, as the hub's decider queues them: the job writes them.
        out.push(Topic::Results, res.to_json(), None, now);
        Ok(Decided {
            seq: None,
            checkpoint_head: None,
            sign_of_life: true,
            erased: false,
            proof_for: None,
        })
    }
}

struct Hub {
    _dir: tempfile::TempDir,
    store: Store,
    sync: Option<SyncHandle>,
}

fn mqtt_config(url: &str) -> MqttConfig {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (host, port) = rest.rsplit_once(':').unwrap();
    MqttConfig {
        url: url.to_owned(),
        tls: scheme == "mqtts",
        host: host.to_owned(),
        port: port.parse().unwrap(),
        client_id: HUB_ID.to_owned(),
        topic_prefix: "lockhub/v1".to_owned(),
        ca_file: None,
        cert_file: None,
        key_file: None,
        username: None,
        password_file: None,
    }
}

/// A hub with the default window and keep-alive, whose decider records each
/// event at once.
fn start_hub(mqtt: MqttConfig) -> Hub {
    start_hub_with(
        mqtt,
        ReceiveWindow::default(),
        RecordOnce::taking(Duration::ZERO),
        sync::client::KEEP_ALIVE,
    )
}

fn start_hub_with(
    mqtt: MqttConfig,
    window: ReceiveWindow,
    decider: RecordOnce,
    keep_alive: Duration,
) -> Hub {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("lockhub.db"), &Default::default()).unwrap();
    let settings = SyncSettings {
        mqtt,
        hub_id: HUB_ID.to_owned(),
        topics: HubTopics::new(DEFAULT_PREFIX, SITE_ID.parse().unwrap(), HUB_ID),
        hub_key: hub_key(),
        cloud_stale: Duration::from_secs(900),
        backlog: BacklogLimits::default(),
        window,
        keep_alive,
    };
    let sync = sync::start(
        settings,
        store.clone(),
        Arc::new(decider),
        SeqStart::default(),
        lockhub::clock::SharedClock::start(Default::default()),
    )
    .unwrap();
    Hub {
        _dir: dir,
        store,
        sync: Some(sync),
    }
}

impl Hub {
    fn applied(&self) -> usize {
        let r = self.store.reader().unwrap();
        r.query_row("SELECT count(*) FROM test_applied", [], |r| {
            r.get::<_, i64>(0)
        })
        .unwrap_or(0) as usize
    }

    /// Applied event ids in commit order.
    fn applied_order(&self) -> Vec<Uuid> {
        let r = self.store.reader().unwrap();
        let mut stmt = r
            .prepare("SELECT event_id FROM test_applied ORDER BY rowid")
            .unwrap();
        stmt.query_map([], |row| row.get::<_, String>(0))
            .unwrap()
            .map(|id| id.unwrap().parse().unwrap())
            .collect()
    }

    fn flow(&self) -> lockhub::sync::client::FlowStats {
        self.sync.as_ref().expect("running").flow()
    }

    fn unsent(&self) -> u64 {
        outbox::depth(&self.store.reader().unwrap()).unwrap()
    }

    /// Waits until every outbox row is marked sent (each one's PUBACK
    /// arrived and was recorded), or fails with `what` after WAIT.
    async fn wait_until_all_sent(&self, what: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.unsent() > 0 {
            assert!(tokio::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(mut self) {
        if let Some(s) = self.sync.take() {
            s.shutdown().await;
        }
        self.store.close();
    }
}

/// The `n` of each alert row the cloud heard, in arrival order (the
/// tests below queue rows `{"n": i}` on the alerts topic).
fn alert_ns(cloud: &CloudClient) -> Vec<i64> {
    cloud.on("alerts").filter_map(|b| b["n"].as_i64()).collect()
}

/// Once the hub is online, one signed event goes through it and is
/// answered `applied`.
async fn one_event_applied(cloud: &mut CloudClient) {
    cloud.wait_online().await;
    let e = testkit::cloud::cloud().event("guest.erased", serde_json::json!({"holder_ref": "g-1"}));
    cloud.publish(std::slice::from_ref(&e)).await;
    cloud.wait_results(std::slice::from_ref(&e)).await;
    assert_answered_once(cloud, &[e], "applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_across_a_broker_restart_is_applied_once_each_and_answered() {
    let mut broker = Mosquitto::start_with(BrokerOptions {
        max_inflight_messages: Some(50),
        ..Default::default()
    });
    let mut cloud = CloudClient::plain(broker.port).await;
    let hub = start_hub(mqtt_config(&broker.url()));
    cloud.wait_online().await;

    let mut signer = testkit::cloud::cloud();
    let events: Vec<_> = (0..600)
        .map(|i| {
            signer.event(
                "guest.erased",
                serde_json::json!({"holder_ref": format!("g-{i}")}),
            )
        })
        .collect();
    cloud.publish(&events[..300]).await;
    // The broker goes away mid-flood and comes back on the same port.
    broker.restart();
    cloud.publish(&events[300..]).await;
    cloud.wait_results(&events).await;
    assert_eq!(cloud.results_by_id().len(), 600);
    assert_answered_once(&cloud, &events, "applied");
    // Exactly once: the effect table has one row per event, none twice.
    let deadline = tokio::time::Instant::now() + WAIT;
    while hub.applied() < 600 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(hub.applied(), 600);
    // Every result row is eventually acknowledged by the broker.
    hub.wait_until_all_sent("outbox never drained").await;
    hub.stop().await;
    cloud
        .wait_until("the hub's offline status", |c| {
            c.on("status")
                .last()
                .is_some_and(|s| s["state"] == "offline")
        })
        .await;
    assert_eq!(cloud.on("status").last().unwrap()["hub_id"], HUB_ID);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_holds_every_record_while_the_broker_is_down_and_sends_them_once_it_is_back() {
    let mut broker = Mosquitto::start();
    // The cloud's persistent session (and subscription) exists before the
    // outage, as a real cloud's does: what the hub sends on its return is
    // queued for the cloud even if the hub reconnects first.
    let mut cloud = CloudClient::plain(broker.port).await;
    broker.stop();
    let hub = start_hub(mqtt_config(&broker.url()));
    let bodies: Vec<String> = (0..200)
        .map(|i| format!("{{\"audit_id\":\"{}\",\"n\":{i}}}", Uuid::new_v4()))
        .collect();
    for b in &bodies {
        let b = b.clone().into_bytes();
        hub.store
            .write(Priority::Bulk, move |c| {
                outbox::enqueue(c, Topic::Alerts, &b, None, Timestamp::now_system())
            })
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        hub.unsent(),
        200,
        "nothing is lost or marked while the broker is away"
    );

    broker.start_again();
    cloud
        .wait_until("every queued record", |c| {
            alert_ns(c).into_iter().collect::<HashSet<_>>() == (0..200).collect()
        })
        .await;
    hub.wait_until_all_sent("outbox never drained").await;
    hub.stop().await;
}

/// PUBACKs that arrive while another process holds SQLite's write lock
/// cannot be marked sent; the publisher retries them once writes work
/// again, on the same connection, instead of leaving them unsent until a
/// reconnect (nothing here makes the hub reconnect: without the retry this
/// test times out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_acknowledged_while_the_store_refuses_writes_are_marked_sent_once_it_takes_them() {
    let (_broker, mut cloud, hub, locker) = rows_queued_then_writer_stalled(20).await;
    cloud
        .wait_until("every queued row", |c| {
            alert_ns(c).into_iter().collect::<HashSet<_>>().len() >= 20
        })
        .await;
    // The writer fails the first waiting job after its BEGIN and then the
    // job itself each wait the busy timeout (5 s + 5 s): held for 25 s, the
    // two jobs queued at the reconnect (the fresh_session request, then the
    // marks) both fail.
    tokio::time::sleep(Duration::from_secs(25)).await;
    assert_eq!(hub.unsent(), 20, "nothing could be marked");
    release_and_wait_until_all_marked(locker, hub).await;
}

/// Marking rows sent is a write, and the writer can stall (here another
/// process holds SQLite's write lock): the publisher keeps publishing
/// meanwhile instead of waiting for its mark with a window of rows. Every
/// row arrives while the lock is held, in id order, none is marked sent
/// before a commit could say so, and all are marked once writes work again.
/// (Before, the publisher waited for each mark: one window of 64 rows went
/// out per failed mark, ~10 s each, so this test timed out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_publisher_keeps_publishing_while_its_marks_wait_for_a_stalled_writer() {
    const ROWS: i64 = 600;
    const HOLD_AT_MOST: Duration = Duration::from_secs(20);
    let (_broker, mut cloud, hub, locker) = rows_queued_then_writer_stalled(ROWS).await;
    let held = tokio::time::timeout(
        HOLD_AT_MOST,
        cloud.wait_until("every row", |c| alert_ns(c).len() >= ROWS as usize),
    )
    .await;
    cloud.drain();
    assert!(
        held.is_ok(),
        "only {} of {ROWS} rows went out while the writer was stalled",
        alert_ns(&cloud).len()
    );
    assert_eq!(
        alert_ns(&cloud),
        (0..ROWS).collect::<Vec<_>>(),
        "every row, in id order"
    );
    assert_eq!(
        hub.unsent(),
        ROWS as u64,
        "nothing is marked without a commit"
    );
    release_and_wait_until_all_marked(locker, hub).await;
}

/// The publisher's window: while the broker's PUBACKs are held back (here
/// the broker is stopped, as it effectively is for the hub while a flood
/// of events queues ahead of them on the one connection), the hub keeps
/// publishing up to its whole window, far past the 448 it used to stop at,
/// and no further; nothing is marked sent without its PUBACK; and once the
/// broker answers, every row arrives, in id order, and is marked sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_pubacks_held_back_the_hub_fills_its_whole_publish_window_and_no_more() {
    let window = sync::publisher::WINDOW.messages;
    let rows = window as i64 + 904;
    // Deep enough for the whole window at once: past Mosquitto's default
    // queue (1,000) it drops what it queues for the cloud.
    let broker = Mosquitto::start_with(BrokerOptions {
        max_queued_messages: Some(10_000),
        ..Default::default()
    });
    let mut cloud = CloudClient::plain(broker.port).await;
    let hub = start_hub(mqtt_config(&broker.url()));
    cloud.wait_online().await;
    broker.pause();
    hub.store
        .write(Priority::Bulk, move |c| {
            for i in 0..rows {
                let b = format!("{{\"n\":{i}}}").into_bytes();
                outbox::enqueue(c, Topic::Alerts, &b, None, Timestamp::now_system())?;
            }
            Ok(())
        })
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while hub.flow().peak_publishing < window {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the hub stopped at {} publishes awaiting their PUBACK; its window is {window}",
            hub.flow().peak_publishing
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A second's more of publishing could only overrun the window.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let peak = hub.flow().peak_publishing;
    assert!(
        peak <= window + 1,
        "{peak} publishes awaiting their PUBACK: past the window (and a status beside it)"
    );
    // (The hub's own rows, its sync request among them, are unsent too.)
    assert!(
        hub.unsent() >= rows as u64,
        "nothing marked without a PUBACK"
    );
    broker.resume();
    cloud
        .wait_until("every row, once the broker answers", |c| {
            alert_ns(c).len() >= rows as usize
        })
        .await;
    assert_eq!(
        alert_ns(&cloud),
        (0..rows).collect::<Vec<_>>(),
        "every row, in id order"
    );
    hub.wait_until_all_sent("acknowledged rows stayed unsent")
        .await;
    hub.stop().await;
}

/// A broker that queues a whole flood, a cloud on it, and an online hub
/// whose decider records each event once (200 µs each), with `spike` and
/// `alone_every` as [`RecordOnce`] takes them.
async fn recording_hub_for_a_flood(
    spike: Option<(u64, Duration)>,
    alone_every: Option<u64>,
    fail_once_at: Option<u64>,
) -> (Mosquitto, CloudClient, Hub) {
    let broker = Mosquitto::start_with(BrokerOptions {
        max_queued_messages: Some(10_000),
        ..Default::default()
    });
    let mut cloud = CloudClient::plain(broker.port).await;
    let hub = start_hub_with(
        mqtt_config(&broker.url()),
        ReceiveWindow::default(),
        RecordOnce {
            spike,
            alone_every,
            fail_once_at,
            ..RecordOnce::taking(Duration::from_micros(200))
        },
        sync::client::KEEP_ALIVE,
    );
    cloud.wait_online().await;
    (broker, cloud, hub)
}

/// `rows` alert rows queued while the broker is down; then another
/// process takes SQLite's write lock (the returned connection) and the
/// broker comes back, so the hub publishes them with its writer stalled.
async fn rows_queued_then_writer_stalled(rows: i64) -> (Mosquitto, CloudClient, Hub, Connection) {
    let mut broker = Mosquitto::start();
    let cloud = CloudClient::plain(broker.port).await;
    broker.stop();
    let hub = start_hub(mqtt_config(&broker.url()));
    for i in 0..rows {
        let b = format!("{{\"n\":{i}}}").into_bytes();
        hub.store
            .write(Priority::Bulk, move |c| {
                outbox::enqueue(c, Topic::Alerts, &b, None, Timestamp::now_system())
            })
            .await
            .unwrap();
    }
    let locker = Connection::open(hub._dir.path().join("lockhub.db")).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE").unwrap();
    broker.start_again();
    (broker, cloud, hub, locker)
}

/// Lets the stalled writer go and waits until every row is marked sent.
async fn release_and_wait_until_all_marked(locker: Connection, hub: Hub) {
    locker.execute_batch("ROLLBACK").unwrap();
    drop(locker);
    hub.wait_until_all_sent("acknowledged rows stayed unsent")
        .await;
    hub.stop().await;
}

/// Publishes `n` distinct events as fast as the broker takes them, then
/// waits until the hub has applied them all; returns their ids in order.
async fn flood_and_wait(cloud: &CloudClient, hub: &Hub, n: usize) -> Vec<Uuid> {
    let mut signer = testkit::cloud::cloud();
    let mut sent = Vec::with_capacity(n);
    for i in 0..n {
        let e = signer.event(
            "guest.erased",
            serde_json::json!({"holder_ref": format!("g-{i}")}),
        );
        sent.push(e.event_id);
        cloud.publish_raw(e.envelope).await;
    }
    tokio::time::timeout(WAIT, async {
        while hub.applied() < n {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("every event applied");
    sent
}

/// Mosquitto 2.0's `max_inflight_messages` lets in-order acks run far past
/// it, so the hub must bound its own intake: under a flood faster than it
/// commits, it never holds more than its window unacked, and since nothing
/// overflows, the connection is never recycled (each event arrives once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_faster_than_the_hub_commits_stays_within_its_receive_window() {
    const EVENTS: usize = 1500;
    const WINDOW: usize = 32;
    // rumqttc decodes up to 10 packets per read once it reads at all.
    const READ_BATCH: usize = 10;
    let broker = Mosquitto::start_with(BrokerOptions {
        max_queued_messages: Some(10_000),
        ..Default::default()
    });
    let mut cloud = CloudClient::plain(broker.port).await;
    let window = ReceiveWindow {
        messages: WINDOW,
        bytes: 1 << 20,
    };
    let hub = start_hub_with(
        mqtt_config(&broker.url()),
        window,
        RecordOnce::taking(Duration::from_micros(500)),
        sync::client::KEEP_ALIVE,
    );
    cloud.wait_online().await;

    flood_and_wait(&cloud, &hub, EVENTS).await;

    let flow = hub.flow();
    assert!(
        flow.peak_outstanding <= WINDOW + READ_BATCH,
        "the hub held {} messages unacked; its window is {WINDOW}",
        flow.peak_outstanding
    );
    assert!(
        flow.peak_outstanding >= WINDOW,
        "the flood should have filled the window (peak {})",
        flow.peak_outstanding
    );
    assert_eq!(
        flow.received, EVENTS as u64,
        "no redelivery: never recycled"
    );
    assert_eq!(hub.applied(), EVENTS);
    hub.stop().await;
}

/// With its receive window full and reading paused, the hub reads no
/// PINGRESP (it waits behind the backlog the broker queued), and while its
/// writer is stalled it writes no acks either: it must still keep the
/// connection alive. Here another connection holds the write lock for four
/// keep-alives, then a slow writer takes many keep-alives to read the
/// backlog (before the fix rumqttc gave up twice: "Last pingreq isn't
/// acked"). The connection survives, so nothing is delivered twice, and
/// the window still bounds what the hub took meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stalled_longer_than_the_keep_alive_with_the_window_full_keeps_the_connection() {
    const EVENTS: usize = 1500;
    const WINDOW: usize = 16;
    // rumqttc decodes up to 10 packets per read once it reads at all.
    const READ_BATCH: usize = 10;
    const KEEP_ALIVE: Duration = Duration::from_secs(1);
    // Longer than 1.5 keep-alives, shorter than the writer's own 5 s wait
    // for the lock (past it the job fails and the hub reconnects on purpose).
    const STALL: Duration = Duration::from_millis(4_200);
    let broker = Mosquitto::start_with(BrokerOptions {
        max_queued_messages: Some(10_000),
        ..Default::default()
    });
    let mut cloud = CloudClient::plain(broker.port).await;
    let window = ReceiveWindow {
        messages: WINDOW,
        bytes: 1 << 20,
    };
    let hub = start_hub_with(
        mqtt_config(&broker.url()),
        window,
        // A slow card: the backlog the broker queued ahead of its
        // PINGRESP takes many keep-alives to read.
        RecordOnce::taking(Duration::from_millis(3)),
        KEEP_ALIVE,
    );
    cloud.wait_online().await;
    // The table the decider writes, so `applied` counts from the start.
    hub.store
        .write(Priority::Bulk, |c| {
            c.execute_batch("CREATE TABLE test_applied (event_id TEXT PRIMARY KEY)")?;
            Ok(())
        })
        .await
        .unwrap();

    let path = hub.store.path().to_owned();
    let (locked_tx, locked_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let c = Connection::open(&path).unwrap();
        c.execute_batch("BEGIN IMMEDIATE").unwrap();
        locked_tx.send(()).unwrap();
        std::thread::sleep(STALL);
        c.execute_batch("ROLLBACK").unwrap();
    });
    locked_rx.recv().unwrap();
    flood_and_wait(&cloud, &hub, EVENTS).await;
    holder.join().unwrap();

    let flow = hub.flow();
    assert!(
        flow.peak_outstanding >= WINDOW && flow.peak_outstanding <= WINDOW + READ_BATCH,
        "the stall should have filled the window and no more (peak {})",
        flow.peak_outstanding
    );
    assert_eq!(
        flow.received,
        EVENTS as u64,
        "each event arrived once: the connection never dropped ({})",
        broker.log()
    );
    assert_eq!(hub.applied(), EVENTS);
    hub.stop().await;
}

/// Jobs that overrun their slice hand back the rest, and the jobs queued
/// behind them hand back everything: events still commit (and are acked)
/// in the order they arrived, each once, on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_cut_short_still_commit_every_event_once_in_arrival_order() {
    const EVENTS: usize = 600;
    // Longer than a job slice: that job is cut short.
    let spike = Some((23, lockhub::store::JOB_SLICE * 3));
    let (_broker, cloud, hub) = recording_hub_for_a_flood(spike, None, None).await;

    let sent = flood_and_wait(&cloud, &hub, EVENTS).await;
    let order = hub.applied_order();
    assert_eq!(order.len(), sent.len());
    let first_out_of_order = order.iter().zip(&sent).position(|(a, b)| a != b);
    assert_eq!(
        first_out_of_order, None,
        "committed in arrival order (the first difference is at that index)"
    );
    assert_eq!(
        hub.flow().received,
        EVENTS as u64,
        "no redelivery: the connection was never recycled"
    );
    hub.stop().await;
}

/// A storage error in one event fails its whole job: nothing of the job
/// commits or is acked (the row the failing event wrote included), the hub
/// reconnects, and the broker's redelivery commits every event once, in
/// arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_error_fails_its_job_and_the_redelivery_commits_every_event_once_in_order() {
    const EVENTS: usize = 300;
    let (_broker, cloud, hub) = recording_hub_for_a_flood(None, None, Some(150)).await;

    let sent = flood_and_wait(&cloud, &hub, EVENTS).await;
    assert!(
        hub.flow().received > EVENTS as u64,
        "the broker redelivered"
    );
    assert_eq!(
        hub.applied_order(),
        sent,
        "every event once, in arrival order"
    );
    hub.stop().await;
}

/// A batch goes to the writer as a transaction of its own, so it may undo
/// all it wrote by starting over (a rejected batch does) without taking
/// the events around it along; events still commit once each, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_must_be_alone_gets_a_transaction_of_its_own_and_may_start_it_over() {
    const EVENTS: usize = 300;
    let (_broker, cloud, hub) = recording_hub_for_a_flood(None, Some(7), None).await;

    let sent = flood_and_wait(&cloud, &hub, EVENTS).await;
    let order = hub.applied_order();
    assert_eq!(
        order, sent,
        "every event once, in arrival order, no first try"
    );
    assert_eq!(
        hub.store
            .reader()
            .unwrap()
            .query_row("SELECT count(*) FROM test_alone", [], |r| r
                .get::<_, i64>(0))
            .unwrap(),
        (EVENTS / 7) as i64,
        "every seq divisible by 7 ran alone"
    );
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step1_rejection_is_answered_and_claims_nothing() {
    let broker = Mosquitto::start();
    let mut cloud = CloudClient::plain(broker.port).await;
    let hub = start_hub(mqtt_config(&broker.url()));
    cloud.wait_online().await;
    cloud.publish_raw(b"{not json".to_vec()).await;
    cloud
        .wait_until("the rejection", |c| !c.results().is_empty())
        .await;
    let body = cloud.results()[0];
    assert_eq!(cloud.results().len(), 1);
    assert_eq!(body["outcome"], "rejected");
    assert_eq!(body["reason"], "bad_envelope");
    assert_eq!(body["event_id"], serde_json::Value::Null);
    assert_eq!(hub.applied(), 0);
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates_carries_events_and_results() {
    let pki = TestPki::generate();
    let broker = Mosquitto::start_with(BrokerOptions {
        tls: Some(pki.server()),
        ..Default::default()
    });
    let mut cfg = mqtt_config(&broker.url());
    cfg.ca_file = Some(pki.path("ca.crt"));
    cfg.cert_file = Some(pki.path("client.crt"));
    cfg.key_file = Some(pki.path("client.key"));
    let hub = start_hub(cfg.clone());

    // The test cloud connects with the same client certificate (other id).
    let mut o = MqttOptions::new("test-cloud", "127.0.0.1", broker.port);
    let tls = lockhub::sync::client::tls_config(&cfg).unwrap();
    o.set_transport(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
        Arc::new(tls),
    )));
    let mut cloud = CloudClient::connect(o).await;
    one_event_applied(&mut cloud).await;
    hub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_protected_broker_accepts_the_hub_with_its_password_file() {
    let creds = tempfile::tempdir().unwrap();
    let passwd = password_file(creds.path(), "hub", "s3cret-pass");
    let broker = Mosquitto::start_with(BrokerOptions {
        password_file: Some(passwd),
        ..Default::default()
    });
    let pw: PathBuf = creds.path().join("hub.pw");
    std::fs::write(&pw, "s3cret-pass\n").unwrap();
    let mut cfg = mqtt_config(&broker.url());
    cfg.username = Some("hub".into());
    cfg.password_file = Some(pw);
    let hub = start_hub(cfg);

    let mut o = MqttOptions::new("test-cloud", "127.0.0.1", broker.port);
    o.set_credentials("hub", "s3cret-pass");
    let mut cloud = CloudClient::connect(o).await;
    one_event_applied(&mut cloud).await;
    hub.stop().await;
}
