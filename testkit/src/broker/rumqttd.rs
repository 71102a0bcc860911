//! rumqttd, the second broker the sync tests run against (docs/broker.md,
//! 'What each broker needs'). In-process, on two free loopback ports: MQTT
//! 3.1.1 for the hub and MQTT 5 for the test cloud (which speaks 5).
//!
//! rumqttd's `Broker::start` never returns and cannot be stopped, so the
//! broker lives until the test process ends (loopback only; the process
//! ending ends it). It keeps nothing on disk: the cases that restart a
//! broker and expect its sessions back are Mosquitto's alone, and each
//! test that leaves rumqttd out says why. The demo runs the same listener
//! settings ([`server`]) in a child process of its own.

use crate::ports::free_port;
use ::rumqttd::{Broker, Config, ConnectionSettings, RouterConfig, ServerSettings};
use std::collections::HashMap;
use std::net::TcpStream;
use std::time::{Duration, Instant};

pub struct Rumqttd {
    /// MQTT 3.1.1 (the hub).
    pub port: u16,
    /// MQTT 5 (the test cloud).
    pub v5_port: u16,
}

/// A loopback listener on `port` that takes the hub's envelopes (a little
/// over 1 MiB), with no authentication.
pub fn server(name: &str, port: u16) -> ServerSettings {
    ServerSettings {
        name: name.to_owned(),
        listen: ([127, 0, 0, 1], port).into(),
        tls: None,
        next_connection_delay_ms: 1,
        connections: ConnectionSettings {
            connection_timeout_ms: 5000,
            // The hub accepts envelopes a little over 1 MiB.
            max_payload_size: 2 << 20,
            // What the broker sends a client before its PUBACKs: the hub
            // keeps its own receive window, so this only needs to be above it.
            max_inflight_count: 100,
            auth: None,
            external_auth: None,
            dynamic_filters: true,
        },
    }
}

impl Rumqttd {
    pub fn start() -> Rumqttd {
        let (port, v5_port) = (free_port(), free_port());
        let config = Config {
            id: 0,
            router: RouterConfig {
                max_connections: 64,
                // Queued for a client (offline or slow) before rumqttd stops
                // reading for it: well above what one test publishes.
                max_outgoing_packet_count: 20_000,
                max_segment_size: 64 << 20,
                max_segment_count: 10,
                ..RouterConfig::default()
            },
            v4: Some(HashMap::from([("v4".to_owned(), server("v4", port))])),
            v5: Some(HashMap::from([("v5".to_owned(), server("v5", v5_port))])),
            ..Config::default()
        };
        std::thread::Builder::new()
            .name(format!("rumqttd-{port}"))
            .spawn(move || {
                if let Err(e) = Broker::new(config).start() {
                    eprintln!("rumqttd: {e}");
                }
            })
            .expect("start rumqttd");
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in [port, v5_port] {
            while TcpStream::connect(("127.0.0.1", p)).is_err() {
                assert!(Instant::now() < deadline, "rumqttd did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Rumqttd { port, v5_port }
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }
}

/// Either broker, for a test that runs against both.
pub enum AnyBroker {
    Mosquitto(super::Mosquitto),
    Rumqttd(Rumqttd),
}

impl AnyBroker {
    /// Where the hub connects (MQTT 3.1.1).
    pub fn url(&self) -> String {
        match self {
            AnyBroker::Mosquitto(m) => m.url(),
            AnyBroker::Rumqttd(r) => r.url(),
        }
    }

    /// Where the MQTT 5 test cloud connects.
    pub fn cloud_port(&self) -> u16 {
        match self {
            AnyBroker::Mosquitto(m) => m.port,
            AnyBroker::Rumqttd(r) => r.v5_port,
        }
    }
}
