//! # lockhub
//!
//! A daemon for a building's hub that decides, offline, who may open its
//! doors. It keeps a SQLite mirror of door keys that the cloud signs and
//! sends over MQTT, and answers lock boards that speak a framed serial
//! protocol.
//!
//! ## Layout
//! Pure decisions sit in the middle; I/O sits at the edges and only calls
//! them. Read it top to bottom: each layer uses only the ones above it.
//!
//! | layer | module | what lives there |
//! |---|---|---|
//! | vocabulary | the crate `lockhub-proto` | the MQTT wire, shared with the cloud: `time` (µs timestamps, RFC 3339), `crypto` (PIN tags, base64url, domain-separated Ed25519, hub envelopes), `event` (events, results, id rules, body parsing: step 4), `verify` (step 1 of an event; the trust-ring `Signer`) |
//! | | [`config`] | `hub.toml` + `secrets.toml`: parsing, every rule, errors with line and column |
//! | pure decisions | [`lifecycle`] | the key state machine and the plan for one grant or revoke |
//! | | [`door`] | the door decision and the lockout arithmetic |
//! | | [`backoff`] | retry delays (capped doubling, full jitter) for every retry loop |
//! | | [`task`] | stopping a task at shutdown: a bounded wait, then abort |
//! | | [`watch`] | what a door driver watches besides the decision: the door sensor (forced, held open) and the keypad flood limit |
//! | | [`clock`] | the effective time (system clock, durable floor, monotonic time) and its trust |
//! | the mirror | [`store`] | SQLite: migrations, the one writer thread, applying events, door entries, audit, outbox, alerts, the daemon's run state |
//! | door drivers' common part | [`entry`] | a keypad entry at any door (board or reader): one decision at a time per door, decided by the store and committed before the driver answers |
//! | I/O edges | [`sync`] | MQTT: the event loop, verify → apply with in-order acks, the outbox publisher, sync requests |
//! | | [`serial`] | the lock boards: one task per port, keypad → committed decision → Unlock/Deny, sensors, liveness |
//! | | [`osdp`] | OSDP readers: one task per bus, Secure Channel, supervision, keypad → committed decision → osdp_OUT, `lockhub osdp install` |
//! | | [`maintenance`] | housekeeping: clock trust, time floor, expiry sweep, retention, signer expiry |
//! | | [`daemon`] | `run(config, shutdown)`: wires the store, sync, serial ports, OSDP buses and housekeeping |
//! | operators | [`provision`] | `lockhub provision`: writes hub.toml + secrets.toml safely, fresh keys |
//! | | [`status`] | `lockhub status`: a read-only snapshot for operators, and the health figures the retained status message carries |
//! | | [`alert_clear`] | `lockhub alert clear`: an operator ends a raised alert, audited; safe while the daemon runs |
//! | | [`notify`] | systemd `sd_notify` (READY, WATCHDOG, STOPPING) without libsystemd |
//! | | [`logging`] | the tracing subscriber: text or JSON on stderr |
//! | | [`alloc`] | the heap's budget: glibc malloc's limits, memory given back when idle |
//! | peers | [`sim`] | a simulated cloud that signs events and a simulated lock board, for tests, the demo, benchmarks |
//!
//! Each wire has one crate of types: the MQTT contract (what the hub and the
//! cloud share) lives in `lockhub-proto`, pure and without I/O; the serial
//! wire contract (messages, framing, link rules, the board's state machine)
//! in the `no_std` crate `firmware-bridge`.
//!
//! `migrations/` holds the schema as append-only SQL files; the invariants of
//! mqtt.md are enforced there, by SQLite, as the last line of defence.

pub mod alert_clear;
pub mod alloc;
pub mod backoff;
pub mod clock;
pub mod config;
pub mod daemon;
pub mod door;
pub mod entry;
pub mod lifecycle;
pub mod logging;
pub mod maintenance;
pub mod notify;
pub mod osdp;
pub mod provision;
pub(crate) mod recorder;
pub mod serial;
pub mod sim;
pub mod status;
pub mod store;
pub mod sync;
pub mod task;
pub mod watch;
