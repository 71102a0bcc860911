//! What runs the daemon and keeps it well: wiring the parts together
//! ([`daemon`]), housekeeping ([`maintenance`]), stopping tasks ([`task`]),
//! retry delays ([`backoff`]), systemd ([`notify`]), the heap's budget
//! ([`alloc`]) and the log subscriber ([`logging`]).

pub mod alloc;
pub mod daemon;
pub mod logging;
internal! {
    mod backoff;
    mod maintenance;
    mod notify;
    mod task;
}
