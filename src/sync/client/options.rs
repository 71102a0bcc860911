//! The connection options: rumqttc settings (persistent session, manual
//! acks, packet limits, the offline last will), credentials and TLS, and the
//! retained status payloads.

use crate::config::{IdentityError, MqttConfig, read_client_identity, read_roots};
use crate::sync::SyncError;
use lockhub_proto::outputs::{self, HubState, Status};
use lockhub_proto::time::Timestamp;
use rumqttc::{LastWill, MqttOptions, QoS, TlsConfiguration, Transport};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio_rustls::rustls;

/// Largest MQTT packet accepted from the broker.
pub const MAX_INCOMING_PACKET: usize = 2 * 1024 * 1024;
/// Largest packet the hub sends (its envelopes are small).
pub const MAX_OUTGOING_PACKET: usize = 256 * 1024;
/// rumqttc's request channel: the hub's own publishes (bounded by the
/// publisher's window, which fits: [`crate::sync::publisher::WINDOW`]),
/// subscriptions and the disconnect. Acks do not use it. If it is full,
/// `try_*` says so and the caller retries.
pub const REQUEST_CAPACITY: usize = 4224;
/// Unacked hub publishes rumqttc tracks (packet ids cycle through 1..=this;
/// MQTT allows 65,535). The publisher keeps fewer than this in flight (its
/// window of 4,096 and the status messages), so ids never collide
/// ([`crate::sync::publisher::WINDOW`]). rumqttc keeps a slot per id
/// (~100 B each, ~0.4 MiB in all) and a clone of each unacked publish, whose
/// bytes the publisher's window bounds.
pub const CLIENT_INFLIGHT: u16 = 4224;
pub const KEEP_ALIVE: Duration = Duration::from_secs(30);

/// The retained status payload (plain JSON, not signed: it is a hint).
pub fn status_payload(hub_id: &str, online: bool, at: Timestamp) -> Vec<u8> {
    outputs::to_body(&status(hub_id, online, at))
}

/// The retained online status with the hub's health (mqtt.md 'Status':
/// the contract's four fields, and `health` as an extra one; the last will
/// stays [`status_payload`]'s offline form).
pub fn online_status_payload(
    hub_id: &str,
    at: Timestamp,
    health: Option<&crate::status::Health>,
) -> Vec<u8> {
    let mut s = status(hub_id, true, at);
    s.health = health.map(|h| serde_json::to_value(h).unwrap_or_default());
    outputs::to_body(&s)
}

fn status(hub_id: &str, online: bool, at: Timestamp) -> Status {
    Status {
        at,
        health: None,
        hub_id: hub_id.to_owned(),
        state: if online {
            HubState::Online
        } else {
            HubState::Offline
        },
        version: env!("CARGO_PKG_VERSION").to_owned(),
    }
}

/// The offline last will: [`status_payload`]'s offline form, retained.
pub fn offline_will(status_topic: &str, offline_status: Vec<u8>) -> LastWill {
    LastWill::new(status_topic, offline_status, QoS::AtLeastOnce, true)
}

/// Gives the last will for the next connection. A will is fixed when the
/// connection is made, so its `at` is that moment: the poll loop asks for a
/// fresh one before each reconnect, or a hub up for days would leave
/// behind an offline status stamped with its start.
pub type WillSource = Box<dyn Fn() -> LastWill + Send + Sync>;

/// Builds the connection options: persistent session under a stable client
/// id, manual acks, offline last will, TLS and credentials from the config.
pub fn mqtt_options(
    cfg: &MqttConfig,
    status_topic: &str,
    offline_status: Vec<u8>,
) -> Result<MqttOptions, SyncError> {
    let mut o = MqttOptions::new(cfg.client_id.clone(), cfg.host.clone(), cfg.port);
    o.set_clean_session(false)
        .set_manual_acks(true)
        .set_keep_alive(KEEP_ALIVE)
        .set_inflight(CLIENT_INFLIGHT)
        .set_request_channel_capacity(REQUEST_CAPACITY)
        .set_max_packet_size(MAX_INCOMING_PACKET, MAX_OUTGOING_PACKET)
        .set_last_will(offline_will(status_topic, offline_status));
    if let Some(user) = &cfg.username {
        let password = match &cfg.password_file {
            Some(p) => read_password(p)?,
            None => String::new(),
        };
        o.set_credentials(user.clone(), password);
    }
    if cfg.tls {
        o.set_transport(Transport::Tls(TlsConfiguration::Rustls(Arc::new(
            tls_config(cfg)?,
        ))));
    }
    Ok(o)
}

fn read_password(path: &Path) -> Result<String, SyncError> {
    let raw = std::fs::read_to_string(path).map_err(|source| SyncError::File {
        path: path.to_owned(),
        source,
    })?;
    // One line; the trailing newline editors add is not part of it.
    Ok(raw.trim_end_matches(['\r', '\n']).to_owned())
}

fn tls_err(path: Option<&Path>, detail: impl std::fmt::Display) -> SyncError {
    SyncError::Tls {
        path: path.map(Path::to_owned),
        detail: detail.to_string(),
    }
}

/// rustls with the `ring` provider (no OpenSSL, no aws-lc): the CA from
/// `ca_file` only (a hub trusts its own broker, not the web PKI), and the
/// client certificate when both `cert_file` and `key_file` are set.
pub fn tls_config(cfg: &MqttConfig) -> Result<rustls::ClientConfig, SyncError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(None, e))?;

    let ca_path = cfg
        .ca_file
        .as_deref()
        .ok_or_else(|| tls_err(None, "mqtts needs mqtt.ca_file"))?;
    let roots = read_roots(ca_path).map_err(|m| tls_err(Some(ca_path), m))?;
    let builder = builder.with_root_certificates(roots);

    match (&cfg.cert_file, &cfg.key_file) {
        (Some(cert_path), Some(key_path)) => {
            let (chain, key) = read_client_identity(cert_path, key_path).map_err(|e| match e {
                IdentityError::Cert(m) => tls_err(Some(cert_path), m),
                IdentityError::Key(m) => tls_err(Some(key_path), m),
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_err(Some(key_path), e))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(tls_err(
            None,
            "mqtt.cert_file and mqtt.key_file go together",
        )),
    }
}
