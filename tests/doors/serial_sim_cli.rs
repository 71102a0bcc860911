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

/// Runs `lockhub` with `args`; its stdout lines arrive on the channel.
fn spawn_lines(args: &[&std::ffi::OsStr]) -> (std::process::Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockhub"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run lockhub");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    (child, rx)
}

/// Waits for a line that `f` accepts, collecting every line into `seen`.
fn line_where(
    rx: &mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    f: impl Fn(&str) -> bool,
) -> Option<String> {
    let end = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < end {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(50)) {
            seen.push(l.clone());
            if f(&l) {
                return Some(l);
            }
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn board_pair_and_sim_board_in_pairing_mode_agree_a_key_typed_as_a_code_and_prove_it_in_a_sealed_session()
 {
    use std::ffi::OsStr;
    // `lockhub board pair` and `lockhub sim-board --pair` on the two ends
    // of a relay (each opens a tty path, as on a real machine).
    let (relay, board_path, _keep) = testkit::board::relay::Relay::start_for_path();
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("board-a");
    pty::point(&link, &relay.hub_path);
    let fx = testkit::files::Fixture::new();
    fx.write_hub(
        &testkit::files::HubToml {
            serial: vec![("board-a".into(), link.display().to_string())],
            ..testkit::files::HubToml::vectors()
        }
        .render(),
    );
    fx.write_secrets(&testkit::files::read_secrets_vector());
    let key_file = dir.path().join("board-a.key");

    let (mut board, board_lines) = spawn_lines(&[
        OsStr::new("sim-board"),
        OsStr::new("--port"),
        board_path.as_os_str(),
        OsStr::new("--pair"),
        OsStr::new("--key-file"),
        key_file.as_os_str(),
    ]);
    let (mut pair, pair_lines) = spawn_lines(&[
        OsStr::new("board"),
        OsStr::new("pair"),
        OsStr::new("--config"),
        fx.hub().as_os_str(),
        OsStr::new("--serial"),
        OsStr::new("board-a"),
    ]);
    let mut said = Vec::new();
    let code = line_where(&pair_lines, &mut said, |l| l.starts_with("pairing code: "))
        .unwrap_or_else(|| panic!("no code: {said:?}"))
        .trim_start_matches("pairing code: ")
        .to_owned();
    assert_eq!(code.len(), 6, "{code}");
    let mut stdin = board.stdin.take().unwrap();
    writeln!(stdin, "0 {code}#").unwrap();
    stdin.flush().unwrap();
    let mut board_said = Vec::new();
    assert!(
        line_where(&board_lines, &mut board_said, |l| l
            .starts_with("paired: link key stored"))
        .is_some(),
        "{board_said:?}"
    );
    let status = tokio::task::spawn_blocking(move || pair.wait())
        .await
        .unwrap()
        .unwrap();
    said.extend(pair_lines.try_iter());
    assert!(status.success(), "{said:?}");
    assert!(
        said.iter()
            .any(|l| l.contains("a sealed session under the new link key verified")),
        "{said:?}"
    );
    // The board's key file and the hub's secrets hold the same key, and the
    // key is printed nowhere.
    let stored = lockhub::sim::board::read_key_file(&key_file).unwrap();
    let config = lockhub::config::load(&fx.hub()).expect("the config loads, keyed");
    assert_eq!(config.board_key("board-a").unwrap().key, stored);
    let b64 = lockhub_proto::crypto::b64u_encode(&stored);
    assert!(
        said.iter().chain(&board_said).all(|l| !l.contains(&b64)),
        "a key was printed"
    );
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    drop(stdin);
    let _ = board.kill();
    let _ = board.wait();
    drop(relay);
}
