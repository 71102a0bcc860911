//! `lockhub sim-board` as an installer runs it: a process on a tty path,
//! commands on stdin, feedback lines on stdout. The test plays the hub on
//! the pty's master with firmware_bridge's `HubLink`.

use testkit::board::pty;

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use firmware_bridge::{DenyReason, Downlink, FrameDecoder, HubLink, LinkConfig, Uplink, to_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_board_sends_typed_entries_and_prints_relay_and_deny_feedback_but_never_the_pin() {
    let pty = pty::Pty::open();
    let (mut master, _slave, path) = pty.into_parts();
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockhub"))
        .args(["sim-board", "--port"])
        .arg(&path)
        .args(["--doors", "2", "--door-name", "101=0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run lockhub sim-board");
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (line_tx, line_rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = line_tx.send(line);
        }
    });

    // The hub: answers door 0 with Unlock, door 1 with Deny.
    let t0 = Instant::now();
    let now = || t0.elapsed().as_millis() as u64;
    let mut link = HubLink::new(LinkConfig::hub(), now());
    link.open_session(Downlink::Hello { session: 9 }, now());
    let mut dec = FrameDecoder::<Uplink>::new();
    let mut lines = Vec::new();
    let mut typed = false;
    let mut pins_seen = Vec::new();
    // Generous: the loop ends as soon as both answers are printed, and a
    // loaded machine (a debug binary starting, two cores shared) once took
    // longer than 10 s.
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end {
        let mut buf = [0u8; 256];
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(10), master.read(&mut buf)).await
        {
            let msgs: Vec<Uplink> = dec.feed(&buf[..n]).filter_map(Result::ok).collect();
            for m in msgs {
                if let Some(Uplink::Keypad { door, pin, .. }) = link.on_rx(m, now()) {
                    pins_seen.push(pin.as_digits().map(str::to_owned));
                    let reply = if door == 0 {
                        Downlink::Unlock {
                            seq: 0,
                            door,
                            ms: 300,
                        }
                    } else {
                        Downlink::Deny {
                            seq: 0,
                            door,
                            reason: DenyReason::DENIED,
                        }
                    };
                    link.send(reply, now()).unwrap();
                }
            }
        }
        // Typed once the board says its link is up, as a person would: the
        // board's outbox is small, and seven commands typed into a link
        // still opening could overflow it.
        lines.extend(line_rx.try_iter());
        if link.ready() && !typed && lines.iter().any(|l| l == "link up") {
            stdin
                .write_all(
                    b"101 482913#\n1 55 55#\nbogus line\n1 9876\nopen 101\nclose 0\ntamper\n",
                )
                .unwrap();
            stdin.flush().unwrap();
            typed = true;
        }
        link.poll(now());
        while let Some(m) = link.pop_tx() {
            master.write_all(&to_frame(&m).unwrap()).await.unwrap();
        }
        lines.extend(line_rx.try_iter());
        if lines.iter().any(|l| l == "door 101: relay closed")
            && lines.iter().any(|l| l == "door 1: denied")
            && lines.iter().any(|l| l == "tamper switch tripped")
        {
            break;
        }
    }
    drop(stdin);
    let _ = child.kill();
    let _ = child.wait();
    lines.extend(line_rx.try_iter());

    assert_eq!(
        pins_seen,
        [Some("482913".to_owned()), Some("5555".to_owned())],
        "{lines:?}"
    );
    // Door 0 is named 101 (`--door-name 101=0`); door 1 has no name. Every
    // command is echoed; a PIN without # is said to be waiting for it.
    for want in [
        "door 101: 7 keys pressed",
        "door 101: entry sent",
        "door 101: relay open",
        "door 101: relay closed",
        "door 1: 5 keys pressed",
        "door 1: entry sent",
        "door 1: denied",
        "door 1: 4 keys pressed, no # at the end: the board sends the entry when # is pressed",
        "door 101: contact open",
        "door 101: contact closed",
        "tamper switch tripped",
    ] {
        assert!(lines.iter().any(|l| l == want), "{want:?} not in {lines:?}");
    }
    assert!(
        lines.iter().any(|l| l.starts_with("? ")),
        "a bad line is refused: {lines:?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| !l.contains("482913") && !l.contains("5555") && !l.contains("9876")),
        "a PIN was printed: {lines:?}"
    );
}
