//! A broker the hub cannot trust or cannot reach is never silent
//! (docs/protocol/mqtt.md 'Broker access'), against a real Mosquitto:
//! - a broker whose certificate is from another CA, for another name, or
//!   expired, raises `broker_denied` (subject `connect`), says why at warn, and
//!   `lockhub status` shows the reason;
//! - a broker that cannot be reached (nothing listens on its port) is a
//!   warn on the first failure and then quiet (debug) within the minute,
//!   raises no `broker_denied`, and `lockhub status` shows the link down
//!   with the last error and since when.

use std::time::Duration;
use testkit::broker::{BrokerOptions, Mosquitto, TestPki};
use testkit::daemon::{Daemon, DaemonOptions};

/// `[mqtt]` TLS lines: the CA the hub trusts, and a valid client certificate.
fn tls_lines(ca: &std::path::Path, pki: &TestPki) -> String {
    format!(
        "ca_file = \"{}\"\ncert_file = \"{}\"\nkey_file = \"{}\"",
        ca.display(),
        pki.path("client.crt").display(),
        pki.path("client.key").display()
    )
}

fn warn_lines<'a>(log: &'a str, needle: &'a str) -> Vec<&'a str> {
    log.lines()
        .filter(|l| l.contains("WARN") && l.contains(needle))
        .collect()
}

/// The daemon at `url` (a TLS broker it must not trust) raises
/// `broker_denied` with `reason`, at warn and in status.
async fn untrusted(url: &str, mqtt: String, reason: &str) {
    let mut hub = Daemon::start(
        url,
        DaemonOptions {
            mqtt_extra: mqtt,
            ..Default::default()
        },
    );
    hub.wait_db("broker_denied raised", |db| {
        testkit::db::raised(db, "broker_denied", "connect")
    })
    .await;
    let log = hub.log();
    let warned = warn_lines(&log, "not trusted");
    assert!(
        warned.iter().any(|l| l.contains(reason)),
        "no warn line with the reason {reason:?}:\n{}",
        hub.log_tail(20)
    );
    let v = hub.status_json();
    assert_eq!(v["broker"]["state"], "denied", "{v}");
    let error = v["broker"]["last_error"].as_str().unwrap_or_default();
    assert!(error.contains(reason), "status --json: {v}");
    assert!(v["broker"]["last_error_since"].is_string(), "{v}");
    let text = String::from_utf8(hub.lockhub(&["status"]).stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("broker   denied") && l.contains(reason)),
        "{text}"
    );
    assert!(text.contains("broker_denied connect"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_certificate_from_another_ca_raises_broker_denied_with_the_reason() {
    let pki = TestPki::generate();
    let stranger = TestPki::generate();
    let broker = Mosquitto::start_with(BrokerOptions {
        tls: Some(pki.server()),
        ..Default::default()
    });
    // The hub trusts another CA than the one that signed the broker's.
    let mqtt = tls_lines(&stranger.path("ca.crt"), &pki);
    untrusted(&broker.url(), mqtt, "not signed by the CA in mqtt.ca_file").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_certificate_for_another_name_raises_broker_denied_with_the_reason() {
    let pki = TestPki::generate();
    let broker = Mosquitto::start_with(BrokerOptions {
        tls: Some(pki.server()),
        ..Default::default()
    });
    // The broker's certificate names 127.0.0.1; the hub asks for localhost.
    let url = format!("mqtts://localhost:{}", broker.port);
    let mqtt = tls_lines(&pki.path("ca.crt"), &pki);
    untrusted(&url, mqtt, "does not name the host in mqtt.url").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_certificate_that_has_expired_raises_broker_denied_with_the_reason() {
    let pki = TestPki::generate();
    let broker = Mosquitto::start_with(BrokerOptions {
        tls: Some(pki.expired_server()),
        ..Default::default()
    });
    let mqtt = tls_lines(&pki.path("ca.crt"), &pki);
    untrusted(&broker.url(), mqtt, "it has expired").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_nobody_answers_for_is_a_warning_once_then_quiet_and_status_shows_the_last_error()
{
    // A port that was free a moment ago: connections to it are refused.
    let port = testkit::ports::free_port();
    let mut hub = Daemon::prepare(
        &format!("mqtt://127.0.0.1:{port}"),
        DaemonOptions::default(),
    );
    hub.set_log_filter("info,lockhub::sync::client=debug");
    hub.spawn();
    // The attempts back off 1, 2, 4 s (full jitter): three failures or
    // more within the minute, one of them loud.
    hub.wait_log("three failed attempts", Duration::from_secs(30), |log| {
        log.lines()
            .filter(|l| l.contains("cannot reach the broker") || l.contains("mqtt connect failed"))
            .count()
            >= 3
    })
    .await;
    let log = hub.log();
    let loud = warn_lines(&log, "cannot reach the broker");
    assert_eq!(loud.len(), 1, "one warning within the minute:\n{log}");
    assert!(loud[0].contains("refused"), "{}", loud[0]);
    assert!(
        log.lines()
            .filter(|l| l.contains("mqtt connect failed"))
            .all(|l| l.contains("DEBUG")),
        "{log}"
    );

    let v = hub.status_json();
    assert_eq!(v["broker"]["state"], "down", "{v}");
    let error = v["broker"]["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("refused"), "{v}");
    assert!(v["broker"]["last_error_since"].is_string(), "{v}");
    assert!(
        !hub.raised("broker_denied", "connect"),
        "unreachable is not denied"
    );
    let text = String::from_utf8(hub.lockhub(&["status"]).stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("broker   down since") && l.contains("last error since")),
        "{text}"
    );
}
