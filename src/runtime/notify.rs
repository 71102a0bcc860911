//! systemd's service notification protocol (`sd_notify(3)`), without libsystemd.
//!
//! The unit is `Type=notify` with `WatchdogSec=`: systemd considers the hub
//! started only when it says `READY=1` (so `systemctl start` waits until the
//! database is open and the ports are up), and restarts it if `WATCHDOG=1`
//! stops arriving (a wedged writer thread or runtime is then a restart, not a
//! silent hub). The protocol is one datagram per message to the unix socket
//! named by `$NOTIFY_SOCKET`; a leading `@` means Linux's abstract namespace.
//!
//! Every function is a no-op returning `Ok(false)` when `$NOTIFY_SOCKET` is
//! unset (run by hand, in tests), so callers need not care.
//!
//! The daemon should call [`ready`] once it serves doors, [`watchdog`] every
//! [`watchdog_interval`] (half of `WatchdogSec`) from the loop whose progress
//! matters, and [`stopping`] when a shutdown begins.

use std::ffi::OsStr;
use std::io;
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// `READY=1`: startup is complete.
pub fn ready() -> io::Result<bool> {
    notify("READY=1")
}

/// `WATCHDOG=1`: still alive.
pub fn watchdog() -> io::Result<bool> {
    notify("WATCHDOG=1")
}

/// `STOPPING=1`: a clean shutdown has begun.
pub fn stopping() -> io::Result<bool> {
    notify("STOPPING=1")
}

/// `EXTEND_TIMEOUT_USEC=...`: the start (or stop) may take up to `by` more
/// from now, past the unit's `TimeoutStartSec`.
pub fn extend_timeout(by: std::time::Duration) -> io::Result<bool> {
    notify(&format!("EXTEND_TIMEOUT_USEC={}", by.as_micros()))
}

/// `STATUS=...`: a one-line status for `systemctl status`. Never put a secret here.
pub fn status(text: &str) -> io::Result<bool> {
    notify(&format!("STATUS={}", text.replace('\n', " ")))
}

/// Sends `state` to `$NOTIFY_SOCKET`; `Ok(false)` when it is unset.
pub fn notify(state: &str) -> io::Result<bool> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(socket) if !socket.is_empty() => send_to(&socket, state).map(|()| true),
        _ => Ok(false),
    }
}

/// Sends one datagram to a socket path, or an abstract name (`@name`).
pub fn send_to(socket: &OsStr, state: &str) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let sock = UnixDatagram::unbound()?;
    let bytes = socket.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
            return Ok(());
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        {
            let _ = name;
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "abstract sockets need Linux",
            ));
        }
    }
    sock.send_to(state.as_bytes(), socket)?;
    Ok(())
}

/// How often to send [`watchdog`]: half of `$WATCHDOG_USEC`, or `None` when
/// the watchdog is off or meant for another process (`$WATCHDOG_PID`).
pub fn watchdog_interval() -> Option<Duration> {
    interval_from(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

/// [`watchdog_interval`] from explicit values (testable without the
/// environment, which tests must not mutate: it is process-global).
pub fn interval_from(usec: Option<&str>, pid: Option<&str>, own_pid: u32) -> Option<Duration> {
    if let Some(pid) = pid
        && pid.trim().parse::<u32>().ok() != Some(own_pid)
    {
        return None;
    }
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    Some(Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_arrive_at_a_path_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let server = UnixDatagram::bind(&path).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        for msg in ["READY=1", "WATCHDOG=1", "STOPPING=1"] {
            send_to(path.as_os_str(), msg).unwrap();
            let mut buf = [0u8; 64];
            let n = server.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], msg.as_bytes());
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn messages_arrive_at_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("lockhub-notify-test-{}", uuid::Uuid::new_v4().simple());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let server = UnixDatagram::bind_addr(&addr).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        send_to(OsStr::new(&format!("@{name}")), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }

    #[test]
    fn watchdog_interval_is_half_and_respects_the_pid() {
        assert_eq!(
            interval_from(Some("10000000"), None, 7),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            interval_from(Some("10000000"), Some("7"), 7),
            Some(Duration::from_secs(5))
        );
        assert_eq!(interval_from(Some("10000000"), Some("8"), 7), None);
        assert_eq!(interval_from(None, None, 7), None);
        assert_eq!(interval_from(Some("0"), None, 7), None);
        assert_eq!(interval_from(Some("x"), None, 7), None);
    }
}
