//! The Mosquitto configs shipped in packaging/mosquitto/, run as shipped
//! (testkit's `broker::shipped`: only the paths moved to a temporary folder
//! and the port to a free loopback one). For each variant, password and
//! client certificate:
//! - the broker listens on the configured listener and nowhere else (no
//!   default listener on 1883, on any interface);
//! - the real hub logs in over TLS and works end to end with the cloud's
//!   two connections (`cloud-pub` publishes events, `cloud-sub` reads what
//!   the hub says), which coexist;
//! - the ACL holds: another hub reads none of this hub's events;
//! - a client cannot choose its own client id: another hub borrowing this
//!   hub's client id does not take over its session, and two connections
//!   under one identity are one client (the second drops the first).
//!
//! Before the fix of issue 25, the shipped files set
//! `use_username_as_clientid` before their `listener` line: Mosquitto 2.0
//! applied it to a default listener it then opened on port 1883, in plain
//! text on every interface, and not to the TLS listener.

use crate::broker_acl::Raw;
use lockhub::config::MqttConfig;
use rumqttc::{MqttOptions, Packet, QoS};
use std::path::PathBuf;
use std::time::Duration;
use testkit::broker::shipped::{ShippedBroker, Variant, tcp_listeners_of};
use testkit::cloud::{CloudClient, cloud, issue_many};
use testkit::daemon::{Daemon, DaemonOptions};
use testkit::files::{HUB_ID, SITE_ID, set_mode};

const HUB_B: &str = "hub-lobby-2";
/// Every identity's password in the password variant (what is tested is
/// who may do what, not the passwords).
const PASS: &str = "not-the-point";

fn identity(hub: &str) -> String {
    format!("{SITE_ID}/{hub}")
}

fn topic_of(hub: &str, leaf: &str) -> String {
    format!("lockhub/v1/{SITE_ID}/{hub}/{leaf}")
}

/// A shipped broker and how each identity logs in to it.
struct Fleet {
    broker: ShippedBroker,
    /// Client certificates by identity (certificate variant).
    certs: std::collections::HashMap<String, (PathBuf, PathBuf)>,
}

impl Fleet {
    fn start(variant: Variant) -> Fleet {
        let (a, b) = (identity(HUB_ID), identity(HUB_B));
        let names = [a.as_str(), b.as_str(), "cloud-pub", "cloud-sub"];
        let users: Vec<(&str, &str)> = names.iter().map(|n| (*n, PASS)).collect();
        let broker = ShippedBroker::start(variant, SITE_ID, &users);
        let mut certs = std::collections::HashMap::new();
        if variant == Variant::Certificate {
            for (i, n) in names.iter().enumerate() {
                certs.insert(n.to_string(), broker.pki.client(&format!("c{i}"), n));
            }
        }
        Fleet { broker, certs }
    }

    /// The client side of TLS for `who` (with its certificate, if any).
    fn mqtt_config(&self, who: &str) -> MqttConfig {
        let cert = self.certs.get(who);
        MqttConfig {
            url: self.broker.url(),
            tls: true,
            host: "127.0.0.1".into(),
            port: self.broker.port,
            client_id: who.into(),
            topic_prefix: "lockhub/v1".into(),
            ca_file: Some(self.broker.ca()),
            cert_file: cert.map(|c| c.0.clone()),
            key_file: cert.map(|c| c.1.clone()),
            username: None,
            password_file: None,
        }
    }

    fn transport(&self, who: &str) -> rumqttc::Transport {
        let tls = lockhub::sync::client::tls_config(&self.mqtt_config(who)).expect("tls config");
        rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(std::sync::Arc::new(tls)))
    }

    /// A hub-like (MQTT 3.1.1) connection as `who`, asking for `client_id`.
    fn raw(&self, who: &str, client_id: &str) -> Raw {
        let mut o = MqttOptions::new(client_id, "127.0.0.1", self.broker.port);
        o.set_transport(self.transport(who));
        if self.broker.variant == Variant::Password {
            o.set_credentials(who, PASS);
        }
        Raw::connect_with(o)
    }

    /// One of the cloud's connections, as `who`.
    async fn cloud(&self, who: &str) -> CloudClient {
        let mut o = rumqttc::v5::MqttOptions::new(who, "127.0.0.1", self.broker.port);
        o.set_transport(self.transport(who));
        if self.broker.variant == Variant::Password {
            o.set_credentials(who, PASS);
        }
        CloudClient::connect(o).await
    }

    /// `[mqtt]` lines for hub A's login, as docs/broker.md gives them.
    fn hub_a_mqtt(&self) -> String {
        let ca = format!("ca_file = \"{}\"", self.broker.ca().display());
        match self.certs.get(&identity(HUB_ID)) {
            Some((crt, key)) => format!(
                "{ca}\ncert_file = \"{}\"\nkey_file = \"{}\"",
                crt.display(),
                key.display()
            ),
            None => {
                let p = self.broker.dir.path().join("hub-a.pass");
                std::fs::write(&p, format!("{PASS}\n")).unwrap();
                set_mode(&p, 0o600);
                format!(
                    "{ca}\nusername = \"{}\"\npassword_file = \"{}\"",
                    identity(HUB_ID),
                    p.display()
                )
            }
        }
    }
}

/// Nothing listens but the configured listener: the broker's own account
/// of the sockets it opened, `ss` (when it shows processes), and the port a
/// default listener would take.
fn assert_only_the_configured_listener(b: &ShippedBroker) {
    let opened = b.opened_ports();
    assert_eq!(
        opened,
        [b.port],
        "the broker opened other listeners than the configured one: {}",
        b.log()
    );
    let ours = tcp_listeners_of(b.pid());
    if let Some(ours) = &ours {
        let want: std::collections::BTreeSet<String> = [format!("127.0.0.1:{}", b.port)].into();
        assert_eq!(ours, &want, "the broker listens elsewhere too: {}", b.log());
    } else {
        eprintln!("ss shows no processes here: relying on the broker's log and a connect");
    }
    for host in ["127.0.0.1", "::1"] {
        let addr = std::net::SocketAddr::new(host.parse().unwrap(), 1883);
        let open = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok();
        // Something else may own 1883 on this machine; `ss` says it is not us.
        assert!(
            !open || ours.is_some(),
            "port 1883 answers on {host} and ss cannot tell whose"
        );
    }
}

async fn connected(raw: &mut Raw, who: &str) {
    match raw.next().await {
        Ok(Packet::ConnAck(_)) => {}
        other => panic!("{who} could not log in: {other:?}"),
    }
}

/// Whether `raw`'s connection ends within `within` (the broker dropped it).
async fn dropped_within(raw: &mut Raw, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, raw.next()).await {
            Err(_) => return false,
            Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

async fn shipped_config_holds(variant: Variant) {
    let fleet = Fleet::start(variant);
    assert_only_the_configured_listener(&fleet.broker);

    // The cloud's two connections, then the real hub over TLS.
    let mut sub = fleet.cloud("cloud-sub").await;
    let mut publisher = fleet.cloud("cloud-pub").await;
    let hub = Daemon::start(
        &fleet.broker.url(),
        DaemonOptions {
            mqtt_extra: fleet.hub_a_mqtt(),
            ..Default::default()
        },
    );
    sub.wait_online().await;

    // Hub B, logged in as itself and asking for hub A's client id (the
    // hub's default client id is its hub id), listens on all of A's topics.
    let mut spy = fleet.raw(&identity(HUB_B), HUB_ID);
    connected(&mut spy, "hub B").await;
    spy.client
        .subscribe(topic_of(HUB_ID, "#"), QoS::AtLeastOnce)
        .await
        .unwrap();
    spy.client.subscribe("#", QoS::AtLeastOnce).await.unwrap();

    // Events from one cloud connection, results heard on the other.
    let mut c = cloud();
    let events = issue_many(&mut c, 0, 2);
    publisher.publish(&events).await;
    sub.wait_results(&events).await;
    testkit::cloud::assert_answered_once(&sub, &events, "applied");

    // The ACL held: hub B heard nothing of hub A's, events or otherwise
    // (SUBACKs aside).
    let heard = spy.publishes_within(Duration::from_millis(500)).await;
    assert!(
        heard.is_empty(),
        "hub B read hub A's topics: {:?}",
        heard.iter().map(|p| p.topic.clone()).collect::<Vec<_>>()
    );

    // Takeover protection: hub A was never dropped for hub B's borrowed id.
    let log = hub.log();
    assert!(
        !log.contains("mqtt connection lost"),
        "hub A lost its connection: {}",
        hub.log_tail(20)
    );
    // And the broker, not the client, names the client: a second
    // connection as hub B, with another client id, replaces the first.
    let mut second = fleet.raw(&identity(HUB_B), "another-id");
    connected(&mut second, "hub B again").await;
    assert!(
        dropped_within(&mut spy, Duration::from_secs(5)).await,
        "two connections under one identity coexist: the client chose its own client id"
    );

    // The cloud's two connections were each made once and never replaced.
    sub.drain();
    publisher.drain();
    assert_eq!(
        (sub.connects, publisher.connects),
        (1, 1),
        "the cloud's connections dropped each other"
    );
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_password_config_listens_only_on_tls_and_names_each_client_by_its_identity() {
    shipped_config_holds(Variant::Password).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_certificate_config_listens_only_on_tls_and_names_each_client_by_its_identity()
{
    shipped_config_holds(Variant::Certificate).await;
}

/// The `sh` blocks of docs/broker.md that run openssl, in order.
fn openssl_blocks_of_broker_md() -> Vec<String> {
    let doc = std::fs::read_to_string(testkit::repo_root().join("docs/broker.md")).unwrap();
    let mut blocks = vec![];
    let mut rest = doc.as_str();
    while let Some(i) = rest.find("```sh\n") {
        let body = &rest[i + 6..];
        let end = body.find("```").expect("a closed block");
        if body[..end].contains("openssl ") {
            blocks.push(body[..end].to_owned());
        }
        rest = &body[end + 3..];
    }
    blocks
}

/// docs/broker.md, followed: its openssl commands make a CA, the broker's
/// certificate and a hub's client certificate; the shipped certificate
/// config takes the broker's; the hub logs in with its own, by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificates_made_as_docs_broker_md_says_let_a_hub_in() {
    let blocks = openssl_blocks_of_broker_md();
    assert_eq!(blocks.len(), 2, "the broker's and a hub's: {blocks:?}");
    let script = blocks
        .join("\n")
        .replace("BROKER=broker.example.net", "BROKER=localhost");
    assert!(script.contains("BROKER=localhost"), "{script}");
    let work = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("sh")
        .args(["-ec", &script])
        .current_dir(work.path())
        .env("SITE_ID", SITE_ID)
        .env("HUB_ID", HUB_ID)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let made = |f: &str| work.path().join(f);
    let broker = ShippedBroker::start_with_certs(
        Variant::Certificate,
        SITE_ID,
        &[],
        testkit::broker::TestPki::generate(),
        [made("ca.pem"), made("broker.pem"), made("broker.key")],
    );
    // The hub's view: the broker by name, the docs' CA, its certificate.
    let cfg = MqttConfig {
        url: format!("mqtts://localhost:{}", broker.port),
        tls: true,
        host: "localhost".into(),
        port: broker.port,
        client_id: HUB_ID.into(),
        topic_prefix: "lockhub/v1".into(),
        ca_file: Some(made("ca.pem")),
        cert_file: Some(made("hub.pem")),
        key_file: Some(made("hub.key")),
        username: None,
        password_file: None,
    };
    let tls = lockhub::sync::client::tls_config(&cfg).expect("the docs' files load");
    let mut o = MqttOptions::new(HUB_ID, "localhost", broker.port);
    o.set_transport(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
        std::sync::Arc::new(tls),
    )));
    let mut hub = Raw::connect_with(o);
    connected(&mut hub, "the hub with the docs' certificate").await;
    // Its identity is the CN: it may subscribe to its own events, and the
    // broker logged the CN as the username.
    hub.client
        .subscribe(topic_of(HUB_ID, "events"), QoS::AtLeastOnce)
        .await
        .unwrap();
    assert!(matches!(hub.next().await, Ok(Packet::SubAck(_))));
    let log = broker.log();
    assert!(
        log.contains(&format!("u'{}'", identity(HUB_ID))),
        "the CN is not the username: {log}"
    );
}
