//! The real daemon over the broker settings a site uses: `mqtts://` with a
//! CA and a client certificate (`require_certificate true`), and a
//! username with a `password_file`. Each test also shows the broker turning
//! away a hub without the credential, so a broker that let anyone in would
//! fail it.

use lockhub::config::MqttConfig;
use rumqttc::v5::MqttOptions;
use rumqttc::{TlsConfiguration, Transport};
use std::sync::Arc;
use std::time::Duration;
use testkit::broker::{BrokerOptions, Mosquitto, TestPki, password_file};
use testkit::cloud::{CloudClient, cloud, issue_many};
use testkit::daemon::{Daemon, DaemonOptions};
use testkit::files::set_mode;

/// Applies one event through the daemon and checks its signed result.
async fn one_event_round_trip(cc: &mut CloudClient) {
    cc.wait_online().await;
    let mut c = cloud();
    let events = issue_many(&mut c, 0, 1);
    cc.publish(&events).await;
    cc.wait_results(&events).await;
    testkit::cloud::assert_answered_once(cc, &events, "applied");
}

/// The daemon never connects: no status ever comes from it, and its log
/// says why.
async fn assert_refused(hub: &mut Daemon, cc: &mut CloudClient, why: &str) {
    hub.wait_db("the database", |_| true).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cc.drain();
    assert!(!cc.is_online(), "{why}: the broker let the hub in");
    assert!(!hub.log().contains("mqtt connected"), "{why}");
    hub.assert_running();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate_carries_events_and_results() {
    let pki = TestPki::generate();
    set_mode(&pki.path("client.key"), 0o600);
    let broker = Mosquitto::start_with(BrokerOptions {
        tls: Some(pki.server()),
        ..Default::default()
    });
    let tls_lines = format!(
        "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"",
        pki.path("ca.crt").display(),
        pki.path("client.crt").display(),
        pki.path("client.key").display()
    );

    // The cloud connects with the same CA and client certificate.
    let cfg = MqttConfig {
        url: broker.url(),
        tls: true,
        host: "127.0.0.1".into(),
        port: broker.port,
        client_id: "test-cloud".into(),
        topic_prefix: "lockhub/v1".into(),
        ca_file: Some(pki.path("ca.crt")),
        cert_file: Some(pki.path("client.crt")),
        key_file: Some(pki.path("client.key")),
        username: None,
        password_file: None,
    };
    let mut o = MqttOptions::new("test-cloud-tls", "127.0.0.1", broker.port);
    o.set_transport(Transport::Tls(TlsConfiguration::Rustls(Arc::new(
        lockhub::sync::client::tls_config(&cfg).unwrap(),
    ))));
    let mut cc = CloudClient::connect(o).await;

    // Without a client certificate the broker refuses the hub.
    let mut refused = Daemon::start(
        &broker.url(),
        DaemonOptions {
            mqtt_extra: format!("ca_file = \"{}\"", pki.path("ca.crt").display()),
            ..Default::default()
        },
    );
    assert_refused(&mut refused, &mut cc, "no client certificate").await;
    drop(refused);

    let _hub = Daemon::start(
        &broker.url(),
        DaemonOptions {
            mqtt_extra: tls_lines,
            ..Default::default()
        },
    );
    one_event_round_trip(&mut cc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_file_lets_the_hub_in_and_a_wrong_one_does_not() {
    let creds = tempfile::tempdir().unwrap();
    let passwd = password_file(creds.path(), "hub", "s3cret-pass");
    let broker = Mosquitto::start_with(BrokerOptions {
        password_file: Some(passwd),
        ..Default::default()
    });
    let write_pw = |name: &str, pw: &str| {
        let p = creds.path().join(name);
        std::fs::write(&p, format!("{pw}\n")).unwrap();
        set_mode(&p, 0o600);
        p
    };
    let good = write_pw("hub.pw", "s3cret-pass");
    let bad = write_pw("wrong.pw", "not-the-pass");

    let mut o = MqttOptions::new("test-cloud-pw", "127.0.0.1", broker.port);
    o.set_credentials("hub", "s3cret-pass");
    let mut cc = CloudClient::connect(o).await;

    let mut refused = Daemon::start(
        &broker.url(),
        DaemonOptions {
            mqtt_extra: format!("username = \"hub\"\npassword_file = \"{}\"", bad.display()),
            ..Default::default()
        },
    );
    assert_refused(&mut refused, &mut cc, "wrong password").await;
    drop(refused);

    let _hub = Daemon::start(
        &broker.url(),
        DaemonOptions {
            mqtt_extra: format!("username = \"hub\"\npassword_file = \"{}\"", good.display()),
            ..Default::default()
        },
    );
    one_event_round_trip(&mut cc).await;
}
