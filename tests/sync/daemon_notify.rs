//! The daemon speaks systemd's notify protocol: READY once it serves doors,
//! WATCHDOG while its writer answers, STOPPING on SIGTERM, then a clean exit.
//! No broker and no board are needed for that: a hub must come up (and keep
//! deciding) with both away.

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testkit::files::Fixture;

fn next_message(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 256];
    let n = sock
        .recv(&mut buf)
        .expect("a notify datagram within the timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn the_daemon_notifies_ready_pets_the_watchdog_and_says_stopping() {
    let fx = Fixture::new();
    let sock_path = fx.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_lockhub"))
        .args(["run", "--config"])
        .arg(fx.hub())
        .env("NOTIFY_SOCKET", &sock_path)
        // WatchdogSec=0.4s: a ping every 200 ms.
        .env("WATCHDOG_USEC", "400000")
        .env_remove("WATCHDOG_PID")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    assert_eq!(next_message(&sock), "READY=1");
    assert_eq!(next_message(&sock), "WATCHDOG=1");
    assert_eq!(next_message(&sock), "WATCHDOG=1");

    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let mut saw_stopping = false;
    for _ in 0..20 {
        if next_message(&sock) == "STOPPING=1" {
            saw_stopping = true;
            break;
        }
    }
    assert!(saw_stopping, "STOPPING=1 after SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "clean exit, got {status}");
}
