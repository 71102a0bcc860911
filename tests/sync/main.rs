//! The sync suite: the real `lockhub run` against real brokers (Mosquitto,
//! rumqttd) and a test cloud (testkit): the MQTT contract end to end,
//! faults, malformed input, TLS and ACLs, the effective clock, the live
//! status and systemd's notify socket. One test binary, so the suite links
//! once (each module was a binary of its own).

mod broker_acl;
mod daemon_notify;
mod effective_time;
mod link_failures;
mod mirror_proof;
mod shipped_broker;
mod status_live;
mod sync_faults;
mod sync_malformed;
mod sync_pipeline;
mod sync_transport;
mod sync_vectors;
