//! # lockhub
//!
//! A daemon for a building's hub that decides, offline, who may open its
//! doors. It keeps a SQLite mirror of door keys that the cloud signs and
//! sends over MQTT, and answers lock boards that speak a framed serial
//! protocol.
//!
//! ## Layout
//! Pure decisions sit in the middle; I/O sits at the edges and only calls them.
//!
//! | module | what lives there |
//! |---|---|
//! | [`config`] | `hub.toml` + `secrets.toml`: parsing, every rule, spans for errors |
//! | [`time`] | [`time::Timestamp`], RFC 3339, the effective clock |
//! | [`crypto`] | PIN tags (HMAC-SHA256), base64url, hub signatures |
//! | [`event`] | the cloud's events and the hub's results as plain data |
//! | [`verify`] | step 1 of an event: size, envelope, signer, `verify_strict`, ids |
//! | [`lifecycle`] | the key state machine and the plan for one event (pure) |
//! | [`door`] | the door decision and the lockout rules (pure) |
//! | [`clock`] | the effective time: system clock, durable floor, monotonic time; trust (pure) |
//! | [`store`] | the SQLite mirror: migrations, the writer thread, reads |
//! | [`serial`] | the lock boards: one task per port, keypad -> decision -> Unlock/Deny, door sensors, liveness |
//! | [`provision`] | `lockhub provision`: writes hub.toml + secrets.toml safely, fresh keys |
//! | [`status`] | `lockhub status`: a read-only snapshot of the database for operators |
//! | [`notify`] | systemd `sd_notify` (READY, WATCHDOG, STOPPING) without libsystemd |
//! | [`logging`] | the tracing subscriber: text or JSON on stderr, the filter |
//! | [`sync`] | MQTT: the event loop, verify→apply ingest with in-order acks, the outbox publisher, sync requests |
//! | [`maintenance`] | housekeeping: clock trust, time floor, expiry sweep, retention, signer expiry |
//! | [`daemon`] | `run(config, shutdown)`: wires the store, sync and the serial ports together |
//! | [`sim`] | simulated peers (a signing cloud, a lock board) for tests, demo, benchmarks |
//!
//! `migrations/` holds the schema as append-only SQL files; the invariants of
//! mqtt.md are enforced there, by SQLite, as the last line of defence.

pub mod clock;
pub mod config;
pub mod crypto;
pub mod daemon;
pub mod door;
pub mod event;
pub mod lifecycle;
pub mod logging;
pub mod maintenance;
pub mod notify;
pub mod provision;
pub mod serial;
pub mod sim;
pub mod status;
pub mod store;
pub mod sync;
pub mod time;
pub mod verify;
