//! A real Mosquitto for one benchmark run: its own folder, config and free
//! loopback port; stopped on Drop.
//!
//! Why the settings differ from Mosquitto's defaults (and what a production
//! broker for hubs should use, see BENCHMARKS.md 'Broker settings'):
//! - `max_queued_messages`: the default 1000 silently *drops* QoS 1 messages
//!   queued for a client beyond it. A benchmark that publishes 100,000
//!   events faster than the hub takes them would measure a loss, not a rate.
//! - `max_inflight_messages`: the default 20 unacked QoS 1 messages per
//!   client. Mosquitto 2.0 does not hold it for a client that acks in order
//!   (docs/performance-notes.md 'Findings'), and the hub keeps its own receive window,
//!   so it should not matter; the runs use 20 and 1000 to show that it
//!   does not.
//! - `persistence true` with the default autosave: what a production broker
//!   does; Mosquitto 2.0 keeps messages in memory and snapshots them.

use testkit::broker::BrokerOptions;

/// The one Mosquitto launcher (testkit's), which the runs start with
/// `Mosquitto::start_with(BrokerSettings { .. })`.
pub use testkit::broker::Mosquitto;

/// The broker settings a run asks for.
#[derive(Debug, Clone, Copy)]
pub struct BrokerSettings {
    pub max_inflight_messages: u32,
    pub max_queued_messages: u32,
}

impl BrokerSettings {
    /// Mosquitto's own default window, with a queue deep enough for the run.
    pub fn default_window(queue: u32) -> Self {
        BrokerSettings {
            max_inflight_messages: 20,
            max_queued_messages: queue,
        }
    }
}

/// Anonymous on loopback, persistence with Mosquitto's own autosave.
impl From<BrokerSettings> for BrokerOptions {
    fn from(s: BrokerSettings) -> BrokerOptions {
        BrokerOptions {
            max_inflight_messages: Some(s.max_inflight_messages),
            max_queued_messages: Some(s.max_queued_messages),
            default_autosave: true,
            ..BrokerOptions::default()
        }
    }
}
