//! The daemon speaks systemd's notify protocol: READY once it serves doors,
//! WATCHDOG while its writer answers, STOPPING on SIGTERM, then a clean exit;
//! a start that migrates the database first asks for more time.
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

/// A daemon started by a test; killed if the test fails before [`Daemon::stop`].
struct Daemon(Option<std::process::Child>);

impl Daemon {
    fn start(
        config: &std::path::Path,
        notify: &std::path::Path,
        watchdog_usec: Option<&str>,
    ) -> Daemon {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_lockhub"));
        cmd.args(["run", "--config"])
            .arg(config)
            .env("NOTIFY_SOCKET", notify)
            .env_remove("WATCHDOG_PID")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        match watchdog_usec {
            Some(usec) => cmd.env("WATCHDOG_USEC", usec),
            None => cmd.env_remove("WATCHDOG_USEC"),
        };
        Daemon(Some(cmd.spawn().unwrap()))
    }

    /// SIGTERM, then its exit status.
    fn stop(mut self) -> std::process::ExitStatus {
        let mut child = self.0.take().expect("running");
        Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the daemon did not exit after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn a_start_that_migrates_the_database_asks_systemd_for_time_and_says_why() {
    let fx = Fixture::new();
    // A hub's database left at schema version 2 by an older lockhub.
    std::fs::create_dir_all(fx.path("data")).unwrap();
    let db = fx.path("data/lockhub.db");
    let old = rusqlite::Connection::open(&db).unwrap();
    for (_, sql) in &lockhub::store::MIGRATIONS[..2] {
        old.execute_batch(sql).unwrap();
    }
    old.pragma_update(None, "user_version", 2).unwrap();
    drop(old);
    let sock_path = fx.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();

    let daemon = Daemon::start(&fx.hub(), &sock_path, None);

    assert_eq!(next_message(&sock), "EXTEND_TIMEOUT_USEC=1800000000");
    assert_eq!(
        next_message(&sock),
        "STATUS=migrating the database; doors are served once it is done"
    );
    assert_eq!(next_message(&sock), "READY=1");
    assert_eq!(next_message(&sock), "STATUS=serving doors");
    let version: i64 = rusqlite::Connection::open(&db)
        .unwrap()
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, lockhub::store::MIGRATIONS.len() as i64);
    assert!(daemon.stop().success());
    assert_eq!(next_message(&sock), "STOPPING=1");

    // Started again at the current version: nothing to ask for.
    let daemon = Daemon::start(&fx.hub(), &sock_path, None);
    assert_eq!(next_message(&sock), "READY=1");
    assert!(daemon.stop().success());
}

#[test]
fn the_daemon_notifies_ready_pets_the_watchdog_and_says_stopping() {
    let fx = Fixture::new();
    let sock_path = fx.path("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();

    // WatchdogSec=0.4s: a ping every 200 ms.
    let daemon = Daemon::start(&fx.hub(), &sock_path, Some("400000"));

    assert_eq!(next_message(&sock), "READY=1");
    assert_eq!(next_message(&sock), "WATCHDOG=1");
    assert_eq!(next_message(&sock), "WATCHDOG=1");

    let status = daemon.stop();
    let saw_stopping = (0..20).any(|_| next_message(&sock) == "STOPPING=1");
    assert!(saw_stopping, "STOPPING=1 after SIGTERM");
    assert!(status.success(), "clean exit, got {status}");
}
