//! The broker connection: rumqttc options and TLS ([`options`]), the
//! [`Gate`] every other task talks to the broker through ([`gate`]), the
//! connection state as plain data ([`state`]: what happened in, what to do
//! out, unit-tested without a broker) and the event-loop task that does it
//! ([`poll`]).
//!
//! ## Rules this module keeps (rumqttc 0.25 pitfalls)
//! - **Nobody awaits the client in the poll task.** The event loop only
//!   makes progress while it is polled; a task that polls it and also waits
//!   on the bounded request channel deadlocks once the channel is full. The
//!   poll task only forwards events into bounded channels.
//! - **Acks and publishes belong to a connection.** When a connection drops,
//!   rumqttc drains queued requests into its `pending` list (dropping
//!   PubAcks) and replays them on a resumed session. We clear that list: the
//!   publisher re-publishes from the first unsent outbox row itself, and an
//!   ack is sent only on the connection that delivered the message (the
//!   broker redelivers the rest; dedupe makes that harmless). The [`Gate`]
//!   makes "is this still the connection?" and "queue the request" one
//!   atomic step, so no stale ack or publish can slip into the next
//!   connection, where its packet id could mean another message.
//! - **The hub bounds what it reads.** Mosquitto 2.0's in-flight window
//!   does not hold for a client that acks in order (see [`super::window`]),
//!   so the poll task stops reading the socket while the messages it has not
//!   acked fill the [`ReceiveWindow`](super::window::ReceiveWindow). PUBACKs therefore cannot go through
//!   rumqttc's request channel, which is only served by the same `poll()`
//!   that reads: the [`Gate`] queues their packet ids and the poll task
//!   writes them to the connection itself, paused or not.
//! - **The keep-alive outlives a paused read.** rumqttc reads PINGRESP
//!   from the same socket and pings only while polled: with reading paused
//!   it neither pings nor reads the answer, and it gives up on its next
//!   ping if the last answer is still unread. So while paused the poll
//!   task writes a PINGREQ itself, any packet read counts as the answer,
//!   and a ping unanswered across a pause is forgiven
//!   ([`PausedPings`](super::window::PausedPings)).
//! - **No reconnect storm.** rumqttc reconnects as fast as it is polled; the
//!   poll task sleeps a capped, jittered backoff between attempts.
//! - **Big envelopes.** The default incoming limit (10 KiB) is far below the
//!   1 MiB envelope limit. We accept packets up to [`MAX_INCOMING_PACKET`],
//!   so an envelope a little over 1 MiB still reaches step 1 and gets its
//!   `payload_too_large` result instead of killing the connection (which the
//!   broker would answer by redelivering it forever). Larger ones are the
//!   broker's to refuse: set Mosquitto's `max_packet_size`.

pub mod gate;
pub mod options;
pub mod poll;
pub mod state;

pub use gate::{FlowStats, Gate, GateRefusal};
pub use options::{
    CLIENT_INFLIGHT, KEEP_ALIVE, MAX_INCOMING_PACKET, MAX_OUTGOING_PACKET, REQUEST_CAPACITY,
    WillSource, mqtt_options, offline_will, online_status_payload, status_payload, tls_config,
};
pub use poll::{Inbound, LinkEvent, LinkNews, PollSettings, PollSinks, poll_loop};
pub use state::{Access, PollState};
