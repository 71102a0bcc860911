//! One tenant, one hub (mqtt.md 'Broker access'): the real daemon under the
//! ACL shipped in packaging/mosquitto/, on a real Mosquitto with a password
//! file. A hub works under exactly that ACL; another hub's credentials can
//! neither read its events nor publish on its topics; a hub the broker
//! refuses raises `broker_denied`, says so in its log, and gets back in by
//! itself once the password file is fixed and the broker reloaded (SIGHUP),
//! with nothing lost; and two hubs share one broker without stepping on each
//! other's client id, retained status or last will.
//!
//! What Mosquitto 2.0.11 (Debian) does, as these tests observed: a refused
//! login is CONNACK 5 (not authorised), whether the user is unknown or the
//! password wrong; a subscription the ACL forbids is *granted* (SUBACK 0 for
//! MQTT 3.1.1) and then delivers nothing; a publish the ACL forbids is
//! acknowledged and dropped. So the refusal a hub can see on this broker is
//! the CONNACK one; the SUBACK 0x80 that other brokers send is played by a
//! minimal fake broker here, and a silent ACL is what `cloud_stale` catches.

use lockhub::config::MqttConfig;
use lockhub::sim::cloud::Cloud;
use rumqttc::{AsyncClient, ConnectReturnCode, Event, MqttOptions, Packet, QoS};
use std::path::{Path, PathBuf};
use std::time::Duration;
use testkit::broker::{BrokerOptions, Mosquitto, TestPki, acl_with_cloud, password_file_users};
use testkit::cloud::{CloudClient, SIGNER_ID, cloud, issue_many, rogue_key};
use testkit::daemon::{Daemon, DaemonOptions, WAIT};
use testkit::files::{HUB_ID, SITE_ID, set_mode};

const HUB_PASS: &str = "hub-a-secret";
const HUB_B: &str = "hub-lobby-2";
const HUB_B_PASS: &str = "hub-b-secret";
const CLOUD_USER: &str = "cloud";
const CLOUD_PASS: &str = "cloud-secret";
const OBSERVER: &str = "observer";

fn identity(hub: &str) -> String {
    format!("{SITE_ID}/{hub}")
}

fn topic_of(hub: &str, leaf: &str) -> String {
    format!("lockhub/v1/{SITE_ID}/{hub}/{leaf}")
}

/// A broker with the shipped ACL (plus the cloud's block) and a password
/// file holding hub A (`hub_a_pass`), hub B and the cloud.
struct AclBroker {
    broker: Mosquitto,
    creds: tempfile::TempDir,
}

impl AclBroker {
    fn start(hub_a_pass: &str) -> AclBroker {
        let creds = tempfile::tempdir().unwrap();
        let acl = creds.path().join("lockhub.acl");
        // A second cloud-side identity that only reads, for the observer
        // (the client id is the username: it must not share the cloud's).
        let acl_text = format!(
            "{}\nuser {OBSERVER}\ntopic read lockhub/v1/{SITE_ID}/#\n",
            acl_with_cloud(CLOUD_USER, SITE_ID)
        );
        std::fs::write(&acl, acl_text).unwrap();
        let passwd = Self::write_passwd(creds.path(), hub_a_pass);
        let broker = Mosquitto::start_with(BrokerOptions {
            password_file: Some(passwd),
            acl_file: Some(acl),
            username_as_client_id: true,
            ..Default::default()
        });
        AclBroker { broker, creds }
    }

    fn write_passwd(dir: &Path, hub_a_pass: &str) -> PathBuf {
        password_file_users(
            dir,
            "lockhub.passwd",
            &[
                (&identity(HUB_ID), hub_a_pass),
                (&identity(HUB_B), HUB_B_PASS),
                (CLOUD_USER, CLOUD_PASS),
                (OBSERVER, CLOUD_PASS),
            ],
        )
    }

    /// Rewrites the password file with hub A's password `pass`, and SIGHUP.
    fn set_hub_a_password(&self, pass: &str) {
        Self::write_passwd(self.creds.path(), pass);
        self.broker.reload();
    }

    /// hub.toml lines for hub A's identity, with its password in a 0600 file.
    fn hub_a_mqtt(&self) -> String {
        let p = self.creds.path().join("hub-a.pass");
        std::fs::write(&p, format!("{HUB_PASS}\n")).unwrap();
        set_mode(&p, 0o600);
        format!(
            "username = \"{}\"\npassword_file = \"{}\"",
            identity(HUB_ID),
            p.display()
        )
    }

    async fn cloud(&self) -> CloudClient {
        let mut o = rumqttc::v5::MqttOptions::new("cloud", "127.0.0.1", self.broker.port);
        o.set_credentials(CLOUD_USER, CLOUD_PASS);
        CloudClient::connect(o).await
    }
}

/// A plain MQTT 3.1.1 client (what a hub speaks) that records what it gets.
pub(crate) struct Raw {
    pub(crate) client: AsyncClient,
    rx: tokio::sync::mpsc::UnboundedReceiver<Result<Packet, String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Raw {
    async fn connect(port: u16, client_id: &str, user: &str, pass: &str) -> Raw {
        let mut o = MqttOptions::new(client_id, "127.0.0.1", port);
        o.set_credentials(user, pass);
        Raw::connect_with(o)
    }

    /// Connects with `o` (TLS, credentials: the caller's), keep alive 30 s.
    pub(crate) fn connect_with(mut o: MqttOptions) -> Raw {
        o.set_keep_alive(Duration::from_secs(30));
        let (client, mut el) = AsyncClient::new(o, 64);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            loop {
                match el.poll().await {
                    Ok(Event::Incoming(p)) => {
                        if tx.send(Ok(p)).is_err() {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        let _ = tx.send(Err(format!("{e:?}")));
                        break;
                    }
                }
            }
        });
        Raw { client, rx, task }
    }

    /// The next packet (bounded by WAIT); Err is the connection's error.
    pub(crate) async fn next(&mut self) -> Result<Packet, String> {
        tokio::time::timeout(WAIT, self.rx.recv())
            .await
            .expect("a packet in time")
            .expect("raw client alive")
    }

    /// Every publish that arrives within `window`.
    pub(crate) async fn publishes_within(&mut self, window: Duration) -> Vec<rumqttc::Publish> {
        let mut got = vec![];
        let deadline = tokio::time::Instant::now() + window;
        while let Ok(Some(p)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            if let Ok(Packet::Publish(p)) = p {
                got.push(p);
            }
        }
        got
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn broker_denied_raised(db: &rusqlite::Connection) -> bool {
    db.query_row(
        "SELECT count(*) FROM alerts WHERE condition = 'broker_denied' AND state = 'raised'",
        [],
        |r| r.get::<_, i64>(0),
    )
    .unwrap()
        > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_works_end_to_end_under_the_shipped_acl() {
    let b = AclBroker::start(HUB_PASS);
    let mut cc = b.cloud().await;
    let mut hub = Daemon::start(
        &b.broker.url(),
        DaemonOptions {
            mqtt_extra: b.hub_a_mqtt(),
            ..Default::default()
        },
    );

    // Status (retained, with its health), through the hub's write right.
    cc.wait_online().await;
    let online = cc.on("status").last().unwrap().clone();
    assert_eq!(online["hub_id"], HUB_ID);
    assert_eq!(online["health"]["links"]["broker"], "up", "{online}");

    // Events in (read right), results and audit out.
    let mut c = cloud();
    let events = issue_many(&mut c, 0, 2);
    cc.publish(&events).await;
    cc.wait_results(&events).await;
    let revoke = c.key_revoked("k-0", 1, "guest_left");
    cc.publish(std::slice::from_ref(&revoke)).await;
    cc.wait_results(std::slice::from_ref(&revoke)).await;
    cc.wait_until("the key.revoked audit record", |c| {
        c.on("audit").any(|a| a["kind"] == "key.revoked")
    })
    .await;

    // A gap: the hub asks for the missing seq on its sync topic.
    let skipped = issue_many(&mut c, 10, 1);
    let after = issue_many(&mut c, 11, 1);
    cc.publish(&after).await;
    cc.wait_until("a gap sync request", |c| {
        c.sync_requests()
            .iter()
            .any(|r| r["reason"] == "gap" && r["from_seq"] == serde_json::json!(skipped[0].seq))
    })
    .await;
    cc.publish(&skipped).await;
    cc.wait_results(&skipped).await;

    // An alert: a forged event raises bad_signature, and the retained
    // status is republished at once with it counted.
    let mut forger = Cloud::new(rogue_key(), SIGNER_ID, SITE_ID.parse().unwrap(), HUB_ID);
    let forged = issue_many(&mut forger, 50, 1);
    cc.publish(&forged).await;
    cc.wait_until("the bad_signature alert", |c| {
        c.on("alerts").any(|a| a["condition"] == "bad_signature")
    })
    .await;
    cc.wait_until("a status counting the alert", |c| {
        c.on("status")
            .any(|s| s["health"]["alerts"]["bad_signature"] == 1)
    })
    .await;

    // The last will, through the hub's status write right.
    hub.kill9();
    cc.wait_until("the offline will", |c| !c.is_online()).await;
    let will = cc.on("status").last().unwrap();
    assert_eq!(will["state"], "offline");
    assert_eq!(will["hub_id"], HUB_ID);
    // The will is mqtt.md's offline form, unchanged: no health figures.
    assert!(will.get("health").is_none(), "{will}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_b_cannot_read_hub_a_events_nor_publish_on_its_topics() {
    let b = AclBroker::start(HUB_PASS);
    let mut cc = b.cloud().await;
    let mut hub = Daemon::start(
        &b.broker.url(),
        DaemonOptions {
            mqtt_extra: b.hub_a_mqtt(),
            ..Default::default()
        },
    );
    cc.wait_online().await;

    // Hub B's credentials with hub A's identity: refused outright.
    let mut imposter = Raw::connect(b.broker.port, HUB_ID, &identity(HUB_ID), HUB_B_PASS).await;
    let refused = imposter.next().await;
    assert!(
        refused.as_ref().is_err_and(|e| e.contains("NotAuthorized")
            || e.contains(&format!("{:?}", ConnectReturnCode::NotAuthorized))),
        "{refused:?}"
    );

    // Hub B, logged in as itself, even borrowing hub A's client id (the
    // broker makes the client id the username, so A is not kicked off).
    let mut spy = Raw::connect(b.broker.port, HUB_ID, &identity(HUB_B), HUB_B_PASS).await;
    assert!(matches!(spy.next().await, Ok(Packet::ConnAck(_))));
    for t in [
        topic_of(HUB_ID, "events"),
        topic_of(HUB_ID, "#"),
        "#".to_owned(),
    ] {
        spy.client.subscribe(t, QoS::AtLeastOnce).await.unwrap();
    }
    // An observer with read rights on the site sees everything under hub A.
    let mut observer = Raw::connect(b.broker.port, "observer", OBSERVER, CLOUD_PASS).await;
    assert!(matches!(observer.next().await, Ok(Packet::ConnAck(_))));
    observer
        .client
        .subscribe(topic_of(HUB_ID, "#"), QoS::AtLeastOnce)
        .await
        .unwrap();

    // Hub B tries to inject a genuine cloud-signed event into A's events,
    // and to speak on A's results and status topics.
    let mut c = cloud();
    let events = issue_many(&mut c, 0, 3);
    let injected = issue_many(&mut c, 3, 1);
    let marker = b"{\"state\":\"offline\",\"hub_id\":\"spy-was-here\"}".to_vec();
    for (leaf, payload) in [
        ("events", injected[0].envelope.clone()),
        ("results", marker.clone()),
        ("status", marker.clone()),
        ("alerts", marker.clone()),
    ] {
        spy.client
            .publish(topic_of(HUB_ID, leaf), QoS::AtLeastOnce, false, payload)
            .await
            .unwrap();
    }

    // The cloud's events reach hub A, and its results reach the cloud...
    cc.publish(&events).await;
    cc.wait_results(&events).await;
    // ...and the observer, after everything hub B sent: by then the broker
    // has routed hub B's publishes too.
    let seen = observer.publishes_within(Duration::from_secs(3)).await;
    assert!(
        seen.iter().any(|p| p.topic == topic_of(HUB_ID, "results")),
        "the observer hears hub A's results"
    );
    assert!(
        !seen.iter().any(|p| p.payload.as_ref() == marker.as_slice()),
        "the broker delivered what hub B published on hub A's topics"
    );
    // Hub B got none of hub A's traffic, though the broker granted its
    // subscriptions (Mosquitto 2.0.11 says 0 and delivers nothing).
    let leaked = spy.publishes_within(Duration::from_secs(1)).await;
    assert!(
        leaked.is_empty(),
        "hub B received {} messages on {:?}",
        leaked.len(),
        leaked.iter().map(|p| &p.topic).collect::<Vec<_>>()
    );
    // The injected event never reached hub A.
    let injected_id = injected[0].event_id.to_string();
    let n: i64 = hub
        .db()
        .query_row(
            "SELECT count(*) FROM dedupe WHERE event_id = ?1",
            [&injected_id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 0, "hub B's publish reached hub A's events");
    // And hub A was never kicked off by the borrowed client id.
    assert_eq!(
        hub.log().matches("mqtt connected").count(),
        1,
        "{}",
        hub.log()
    );
    hub.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_hub_raises_broker_denied_and_gets_back_in_once_the_broker_is_fixed() {
    let b = AclBroker::start(HUB_PASS);
    let mut cc = b.cloud().await;
    let mut hub = Daemon::start(
        &b.broker.url(),
        DaemonOptions {
            mqtt_extra: b.hub_a_mqtt(),
            ..Default::default()
        },
    );
    cc.wait_online().await;
    let mut c = cloud();
    let first = issue_many(&mut c, 0, 2);
    cc.publish(&first).await;
    cc.wait_results(&first).await;
    assert!(hub.sigterm(), "clean stop");

    // An installer's mistake: the broker's password for hub A changes.
    b.set_hub_a_password("rotated-but-not-on-the-hub");
    // Events queue in hub A's persistent session meanwhile.
    let queued = issue_many(&mut c, 2, 3);
    cc.publish(&queued).await;
    cc.wait_acked(first.len() + queued.len()).await;

    hub.spawn();
    hub.wait_db("broker_denied raised", broker_denied_raised)
        .await;
    let log = hub.log();
    assert!(
        log.contains("broker_denied") && log.contains("connection refused: not authorised"),
        "the log says what was refused: {log}"
    );
    // Kept locally and shown by `lockhub status`.
    let s = hub.status_json();
    assert!(
        s["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["condition"] == "broker_denied" && a["subject"] == "connect"),
        "{s}"
    );
    assert_eq!(s["health"]["alerts"]["broker_denied"], 1, "{s}");
    assert_eq!(s["health"]["links"]["broker"], "denied", "{s}");

    // Fixed and reloaded: the hub gets in at its next retry, by itself.
    b.set_hub_a_password(HUB_PASS);
    cc.wait_results(&queued).await;
    testkit::cloud::assert_answered_once(&cc, &queued, "applied");
    // The alert was kept and is published now that the broker lets it,
    // raised and then cleared.
    cc.wait_until("broker_denied raised and cleared", |c| {
        let states: Vec<_> = c
            .on("alerts")
            .filter(|a| a["condition"] == "broker_denied")
            .map(|a| a["state"].as_str().unwrap_or("").to_owned())
            .collect();
        states.first().is_some_and(|s| s == "raised") && states.iter().any(|s| s == "cleared")
    })
    .await;
    hub.wait_db("broker_denied cleared", |db| !broker_denied_raised(db))
        .await;
    assert_eq!(hub.watermark(), 5, "nothing lost");
    cc.wait_online().await;
}

/// The broker lets the hub in again while storage refuses the clear (an
/// alert row cannot be written): the alert does not stay raised for good
/// behind that one failed write; it is cleared once storage takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_denied_clear_that_storage_refused_is_written_once_storage_takes_it() {
    let b = AclBroker::start(HUB_PASS);
    b.set_hub_a_password("rotated-but-not-on-the-hub");
    let mut hub = Daemon::start(
        &b.broker.url(),
        DaemonOptions {
            mqtt_extra: b.hub_a_mqtt(),
            ..Default::default()
        },
    );
    hub.wait_db("broker_denied raised", broker_denied_raised)
        .await;
    let fault = rusqlite::Connection::open(hub.db_path()).unwrap();
    fault
        .execute_batch(
            "CREATE TRIGGER test_refuse_clear BEFORE UPDATE ON alerts
             WHEN NEW.state = 'cleared' BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .unwrap();
    b.set_hub_a_password(HUB_PASS);
    let mut cc = b.cloud().await;
    cc.wait_online().await;
    hub.wait_log("the refused clear", Duration::from_secs(30), |log| {
        log.contains("cannot record the alert")
    })
    .await;
    assert!(broker_denied_raised(&hub.db()), "the clear was refused");
    fault
        .execute_batch("DROP TRIGGER test_refuse_clear")
        .unwrap();
    hub.wait_db("broker_denied cleared", |db| !broker_denied_raised(db))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hubs_with_the_same_hub_id_at_two_sites_share_a_broker_without_clashing() {
    // Default client ids (lockhub's is hub_id): the same at both sites.
    // The shipped config makes the client id the username, so neither
    // takes over the other's session; retained status and wills are per
    // site and hub.
    let creds = tempfile::tempdir().unwrap();
    let other_site = "0b7c2f8e-1d2a-4c3b-9e8f-7a6b5c4d3e21";
    let id_a = identity(HUB_ID);
    let id_b = format!("{other_site}/{HUB_ID}");
    let passwd = password_file_users(
        creds.path(),
        "passwd",
        &[
            (&id_a, HUB_PASS),
            (&id_b, HUB_B_PASS),
            (CLOUD_USER, CLOUD_PASS),
        ],
    );
    let acl = creds.path().join("acl");
    std::fs::write(&acl, acl_with_cloud(CLOUD_USER, "+")).unwrap();
    let broker = Mosquitto::start_with(BrokerOptions {
        password_file: Some(passwd),
        acl_file: Some(acl),
        username_as_client_id: true,
        ..Default::default()
    });
    let hub_opts = |site: Option<&str>, user: &str, pass: &str| {
        let p = creds.path().join(format!("{}.pass", pass));
        std::fs::write(&p, pass).unwrap();
        set_mode(&p, 0o600);
        DaemonOptions {
            mqtt_extra: format!("username = \"{user}\"\npassword_file = \"{}\"", p.display()),
            site_id: site.map(str::to_owned),
            ..Default::default()
        }
    };
    let mut hub_a = Daemon::start(&broker.url(), hub_opts(None, &id_a, HUB_PASS));
    let mut hub_b = Daemon::start(&broker.url(), hub_opts(Some(other_site), &id_b, HUB_B_PASS));

    let mut watcher = Raw::connect(broker.port, "watcher", CLOUD_USER, CLOUD_PASS).await;
    assert!(matches!(watcher.next().await, Ok(Packet::ConnAck(_))));
    watcher
        .client
        .subscribe("lockhub/v1/+/+/status", QoS::AtLeastOnce)
        .await
        .unwrap();
    let status_of = |ps: &[rumqttc::Publish], site: &str| -> Option<serde_json::Value> {
        ps.iter()
            .rev()
            .find(|p| p.topic == format!("lockhub/v1/{site}/{HUB_ID}/status"))
            .map(|p| serde_json::from_slice(&p.payload).unwrap())
    };
    let mut heard = vec![];
    let deadline = tokio::time::Instant::now() + WAIT;
    while !(status_of(&heard, SITE_ID).is_some_and(|s| s["state"] == "online")
        && status_of(&heard, other_site).is_some_and(|s| s["state"] == "online"))
    {
        assert!(tokio::time::Instant::now() < deadline, "both hubs online");
        heard.extend(watcher.publishes_within(Duration::from_millis(200)).await);
    }
    // Neither was kicked off by the other (each connected exactly once).
    tokio::time::sleep(Duration::from_secs(2)).await;
    for hub in [&mut hub_a, &mut hub_b] {
        hub.assert_running();
        assert_eq!(
            hub.log().matches("mqtt connected").count(),
            1,
            "{}",
            hub.log()
        );
    }
    // One hub's will is its own: hub B dies, hub A stays online.
    hub_b.kill9();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !status_of(&heard, other_site).is_some_and(|s| s["state"] == "offline") {
        assert!(tokio::time::Instant::now() < deadline, "hub B's will");
        heard.extend(watcher.publishes_within(Duration::from_millis(200)).await);
    }
    assert_eq!(status_of(&heard, SITE_ID).unwrap()["state"], "online");
    hub_a.assert_running();
}

/// The client-certificate variant: the certificate's CN is the identity
/// (`use_identity_as_username true`), and the same ACL applies. A hub whose
/// certificate names another hub is let in (its certificate is valid) but
/// hears nothing and is heard by no one: Mosquitto 2.0.11 grants the
/// subscription and delivers nothing, and drops its publishes; the hub
/// raises `cloud_stale` after its period of silence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_client_certificates_the_cn_is_the_identity_the_acl_names() {
    let pki = TestPki::generate();
    let (hub_crt, hub_key) = pki.client("hub-a", &identity(HUB_ID));
    let (wrong_crt, wrong_key) = pki.client("hub-b", &identity(HUB_B));
    let (cloud_crt, cloud_key) = pki.client("cloud", CLOUD_USER);
    let acl = pki.path("lockhub.acl");
    std::fs::write(&acl, acl_with_cloud(CLOUD_USER, SITE_ID)).unwrap();
    let broker = Mosquitto::start_with(BrokerOptions {
        tls: Some(pki.server()),
        acl_file: Some(acl),
        identity_as_username: true,
        username_as_client_id: true,
        ..Default::default()
    });
    let tls = |crt: &Path, key: &Path| {
        format!(
            "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"",
            pki.path("ca.crt").display(),
            crt.display(),
            key.display()
        )
    };
    let cfg = MqttConfig {
        url: broker.url(),
        tls: true,
        host: "127.0.0.1".into(),
        port: broker.port,
        client_id: "cloud".into(),
        topic_prefix: "lockhub/v1".into(),
        ca_file: Some(pki.path("ca.crt")),
        cert_file: Some(cloud_crt),
        key_file: Some(cloud_key),
        username: None,
        password_file: None,
    };
    let mut o = rumqttc::v5::MqttOptions::new("cloud", "127.0.0.1", broker.port);
    o.set_transport(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
        std::sync::Arc::new(lockhub::sync::client::tls_config(&cfg).unwrap()),
    )));
    let mut cc = CloudClient::connect(o).await;
    let mut c = cloud();

    // Hub A's config with hub B's certificate (and a short cloud_stale
    // period: that silence is what the hub can notice).
    let mut wrong = Daemon::start(
        &broker.url(),
        DaemonOptions {
            mqtt_extra: tls(&wrong_crt, &wrong_key),
            policy: "cloud_stale_s = 2".into(),
            ..Default::default()
        },
    );
    let log = wrong.log_path();
    wrong
        .wait_db("connected", |_| {
            std::fs::read_to_string(&log).is_ok_and(|l| l.contains("mqtt connected"))
        })
        .await;
    let unheard = issue_many(&mut c, 0, 1);
    cc.publish(&unheard).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    cc.drain();
    assert!(
        cc.heard.is_empty(),
        "the broker carried traffic for a hub with another hub's certificate: {:?}",
        cc.summary()
    );
    assert_eq!(wrong.count("SELECT count(*) FROM dedupe"), 0);
    wrong
        .wait_db("cloud_stale raised", |db| {
            db.query_row(
                "SELECT count(*) FROM alerts WHERE condition = 'cloud_stale' AND state = 'raised'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
                > 0
        })
        .await;
    wrong.kill9();

    // The right certificate: in, online, events and results.
    let _hub = Daemon::start(
        &broker.url(),
        DaemonOptions {
            mqtt_extra: tls(&hub_crt, &hub_key),
            ..Default::default()
        },
    );
    cc.wait_online().await;
    let events = issue_many(&mut c, 1, 2);
    cc.publish(&events).await;
    cc.wait_results(&events).await;
    testkit::cloud::assert_answered_once(&cc, &events, "applied");
}

/// mqtt.md 'Broker access': a refused connection is never silent. A
/// broker that refuses the hub's client certificate (here: one from
/// another CA) ends the TLS handshake, and the hub raises `broker_denied`
/// and says so in its log, as for a CONNACK refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_the_broker_refuses_raises_broker_denied() {
    let pki = TestPki::generate();
    let stranger = TestPki::generate();
    let (crt, key) = stranger.client("hub-a", &identity(HUB_ID));
    let broker = Mosquitto::start_with(BrokerOptions {
        tls: Some(pki.server()),
        identity_as_username: true,
        username_as_client_id: true,
        ..Default::default()
    });
    let mut hub = Daemon::prepare(
        &broker.url(),
        DaemonOptions {
            mqtt_extra: format!(
                "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"",
                pki.path("ca.crt").display(),
                crt.display(),
                key.display()
            ),
            ..Default::default()
        },
    );
    hub.spawn();
    hub.wait_db("broker_denied raised", |db| {
        testkit::db::raised(db, "broker_denied", "connect")
    })
    .await;
    let log = hub.log();
    assert!(
        log.contains("TLS handshake refused"),
        "{}",
        hub.log_tail(20)
    );
    assert!(log.contains("WARN"), "a warning, not a debug line");
}

/// What a fake broker saw of the hub.
#[derive(Default)]
struct FakeSeen {
    connects: usize,
    subscribes: usize,
    /// (topic, payload) of every PUBLISH.
    publishes: Vec<(String, Vec<u8>)>,
}

/// Reads one MQTT packet: (first byte, body).
async fn read_packet(s: &mut tokio::net::TcpStream) -> Option<(u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let first = s.read_u8().await.ok()?;
    let (mut len, mut shift) = (0usize, 0);
    loop {
        let b = s.read_u8().await.ok()?;
        len |= usize::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    let mut body = vec![0; len];
    s.read_exact(&mut body).await.ok()?;
    Some((first, body))
}

/// A broker that speaks just enough MQTT 3.1.1 to answer the hub's first
/// subscription with SUBACK `first_code` (0x80: refused, as brokers other than
/// Mosquitto 2.0 do; 0x00: granted at QoS 0 only, as a broker with
/// `max_qos 0` does), and grant every later one at QoS 1. It acks every
/// QoS 1 publish.
async fn fake_broker_answering_the_first_subscribe_with(
    seen: std::sync::Arc<std::sync::Mutex<FakeSeen>>,
    first_code: u8,
) -> u16 {
    use tokio::io::AsyncWriteExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                while let Some((first, body)) = read_packet(&mut s).await {
                    let reply: Vec<u8> = match first >> 4 {
                        1 => {
                            seen.lock().unwrap().connects += 1;
                            vec![0x20, 2, 0, 0]
                        }
                        8 => {
                            let n = {
                                let mut g = seen.lock().unwrap();
                                g.subscribes += 1;
                                g.subscribes
                            };
                            let code = if n == 1 { first_code } else { 0x01 };
                            vec![0x90, 3, body[0], body[1], code]
                        }
                        3 => {
                            let tlen = usize::from(u16::from_be_bytes([body[0], body[1]]));
                            let topic = String::from_utf8_lossy(&body[2..2 + tlen]).into_owned();
                            let qos = (first >> 1) & 3;
                            let mut at = 2 + tlen;
                            let mut ack = vec![];
                            if qos > 0 {
                                ack = vec![0x40, 2, body[at], body[at + 1]];
                                at += 2;
                            }
                            seen.lock()
                                .unwrap()
                                .publishes
                                .push((topic, body[at..].to_vec()));
                            ack
                        }
                        12 => vec![0xd0, 0],
                        _ => vec![],
                    };
                    if !reply.is_empty() && s.write_all(&reply).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_refused_with_0x80_raises_broker_denied_and_is_asked_for_again() {
    subscription_answered_first_with(0x80, "subscription to the events topic refused").await;
}

/// Granted at QoS 0 only, events would be neither acked after their commit
/// nor kept while the hub is away: never silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_granted_at_qos_0_only_raises_broker_denied_and_is_asked_for_again() {
    subscription_answered_first_with(0x00, "granted at QoS 0 only").await;
}

async fn subscription_answered_first_with(code: u8, logged: &str) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(FakeSeen::default()));
    let port = fake_broker_answering_the_first_subscribe_with(seen.clone(), code).await;
    let mut hub = Daemon::start(
        &format!("mqtt://127.0.0.1:{port}"),
        DaemonOptions::default(),
    );
    let alerts = |seen: &FakeSeen| -> Vec<serde_json::Value> {
        seen.publishes
            .iter()
            .filter(|(t, _)| *t == topic_of(HUB_ID, "alerts"))
            .map(|(_, p)| testkit::cloud::open_hub_envelope(p))
            .filter(|a| a["condition"] == "broker_denied")
            .collect()
    };
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let states: Vec<String> = alerts(&seen.lock().unwrap())
            .iter()
            .map(|a| {
                assert_eq!(a["subject"], "subscribe", "{a}");
                a["state"].as_str().unwrap().to_owned()
            })
            .collect();
        // Published while the subscription was still refused (the broker
        // took the hub's publishes), then cleared once it was granted.
        if states.first().is_some_and(|s| s == "raised") && states.iter().any(|s| s == "cleared") {
            break;
        }
        hub.assert_running();
        assert!(
            tokio::time::Instant::now() < deadline,
            "broker_denied raised then cleared; heard {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (connects, subscribes) = {
        let g = seen.lock().unwrap();
        (g.connects, g.subscribes)
    };
    assert_eq!(connects, 1, "asked again on the same connection");
    assert!(subscribes >= 2);
    assert!(hub.log().contains(logged), "{}", hub.log());
    hub.wait_db("broker_denied cleared", |db| !broker_denied_raised(db))
        .await;
}
