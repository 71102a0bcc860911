//! What runs the daemon and keeps it well: wiring the parts together
//! ([`daemon`]), housekeeping ([`maintenance`]), stopping tasks ([`task`]),
//! retry delays ([`backoff`]), systemd ([`notify`]), the heap's budget
//! ([`alloc`]) and the log subscriber ([`logging`]).

pub mod alloc;
pub mod backoff;
pub mod daemon;
pub mod logging;
pub mod maintenance;
pub mod notify;
pub mod task;
