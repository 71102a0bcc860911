//! The README's first command, `cargo run --release --example demo`, as CI
//! runs it: the example binary that `cargo test` builds, run to the end
//! with a bound. It must exit 0 and report every outcome of the story, and
//! nothing it prints (story or daemon logs) may hold a secret or a PIN tag;
//! the daemon's log lines may not hold a PIN either.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use lockhub_proto::crypto;

/// The whole story takes a few seconds; this bound is for a loaded CI box.
const TIMEOUT: Duration = Duration::from_secs(120);

/// The demo's made-up PINs (examples/demo/main.rs). Each must appear in the
/// story, which proves this list is the one the demo used.
const PINS: [&str; 7] = [
    "482913", "517204", "735046", "111111", "222222", "333333", "444444",
];

/// `target/<profile>/examples/demo`, beside this test's own `deps/` folder.
/// `cargo test` builds examples before it runs tests; a binary older than
/// the sources it is built from would test old code, so that fails too.
fn demo_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    let bin = profile_dir.join("examples").join("demo");
    let hint = "build it with `cargo test` (which builds examples) or `cargo build --example demo`";
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is missing: {hint}", bin.display()));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let newest = newest_mtime(&root.join("src"))
        .max(newest_mtime(&root.join("examples/demo")))
        .max(newest_mtime(&root.join("testkit/src")))
        .max(newest_mtime(&root.join("lockhub-proto/src")));
    assert!(
        built >= newest,
        "{} is older than its sources: {hint}",
        bin.display()
    );
    bin
}

fn newest_mtime(path: &Path) -> SystemTime {
    let Ok(meta) = std::fs::metadata(path) else {
        return SystemTime::UNIX_EPOCH;
    };
    let mut newest = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            newest = newest.max(newest_mtime(&entry.path()));
        }
    }
    newest
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// Runs the demo with `args` and `input` on stdin, killed after [`TIMEOUT`].
fn run_demo(args: &[&str], input: &str) -> Run {
    let t0 = Instant::now();
    let mut child = Command::new(demo_binary())
        .args(args)
        // Debug: as many daemon log lines as it ever prints, to scan them.
        .env("RUST_LOG", "lockhub=debug")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the demo");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(input.as_bytes()).expect("write stdin");
    drop(stdin);
    let reader = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = reader(Box::new(child.stdout.take().expect("stdout")));
    let err = reader(Box::new(child.stderr.take().expect("stderr")));
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if t0.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let run = Run {
        code: status.and_then(|s| s.code()),
        stdout: out.join().expect("stdout reader"),
        stderr: err.join().expect("stderr reader"),
        took: t0.elapsed(),
    };
    eprintln!("demo {args:?} took {:.1} s", run.took.as_secs_f64());
    run
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every way a 32-byte secret or tag could be printed: base64url (with
/// and without padding), standard base64, hex in either case.
fn spellings(bytes: &[u8]) -> Vec<String> {
    use base64::Engine as _;
    let b64u = crypto::b64u_encode(bytes);
    vec![
        b64u.clone(),
        base64::engine::general_purpose::STANDARD.encode(bytes),
        hex(bytes),
        hex(bytes).to_uppercase(),
    ]
}

fn secret_of(text: &str, path: &[&str]) -> [u8; 32] {
    let doc: toml::Table = toml::from_str(text).expect("secrets.toml parses");
    let mut v = toml::Value::Table(doc);
    for p in path {
        v = match p.parse::<usize>() {
            Ok(i) => v.get(i).cloned(),
            Err(_) => v.get(*p).cloned(),
        }
        .unwrap_or_else(|| panic!("no {path:?} in secrets.toml"));
    }
    crypto::b64u_decode_32(v.as_str().expect("a string")).expect("32 bytes")
}

#[test]
fn the_demo_tells_the_whole_story_and_leaks_no_secret() {
    let data = tempfile::tempdir().expect("tempdir");
    let dir = data.path().join("demo");
    let run = run_demo(&["--data-dir", dir.to_str().expect("utf-8 path")], "");
    let all = format!("{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        run.code,
        Some(0),
        "the demo did not finish cleanly in {:?}:\n{all}",
        run.took
    );

    for want in [
        "ok: key issued: result applied",
        "ok: door 101 opened: relay opened, audit door.granted + door.unlocked",
        "ok: wrong PIN denied: door.denied unknown_pin",
        "ok: hand-off: checkin.completed applied, pre-issued PIN denied, new PIN opened door 102",
        "ok: revoked key denied: door.denied unknown_pin",
        "ok: locked out: keypad_lockout alert raised, even the right PIN got Deny reason 2",
        "ok: offline open: door 102 opened with the broker down",
        "received 0 audit records while the broker was down",
        "the daemon stopped cleanly",
    ] {
        assert!(
            run.stdout.contains(want),
            "{want:?} not in:\n{}",
            run.stdout
        );
    }
    // The offline entry's door.granted and door.unlocked, at least.
    let delivered: usize = run
        .stdout
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("ok: audit delivered after reconnect: ")
                .and_then(|r| r.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or_else(|| panic!("no audit-after-reconnect line in:\n{}", run.stdout));
    assert!(delivered >= 2, "{delivered} audit records after reconnect");
    // Every message the cloud got was hub-signed, and it said so.
    assert!(!run.stdout.contains("REFUSED"), "{}", run.stdout);

    // stderr is lockhub's own: the daemon's log lines and the demo's notes,
    // no libosdp chatter from the reader; the planned outage says so.
    for line in run.stderr.lines().filter(|l| !l.trim().is_empty()) {
        let daemon = line
            .split_whitespace()
            .nth(2)
            .is_some_and(|target| target.starts_with("lockhub"));
        assert!(
            daemon || line.starts_with("demo"),
            "not lockhub's own line on stderr: {line}"
        );
    }
    assert!(
        run.stderr.contains("stops the broker on purpose"),
        "{}",
        run.stderr
    );

    // The secrets the demo generated, and the tags of the PINs it used.
    let secrets = std::fs::read_to_string(dir.join("secrets.toml")).expect("secrets.toml");
    let hub_key = secret_of(&secrets, &["hub_key", "secret"]);
    let pin_key = secret_of(&secrets, &["pin_key", "0", "secret"]);
    let password = std::fs::read_to_string(dir.join("mqtt-password")).expect("password");
    let cloud_key = std::fs::read_to_string(dir.join("cloud-signer.key")).expect("cloud key");
    let cloud_key = crypto::b64u_decode_32(cloud_key.trim()).expect("32 bytes");
    let mut forbidden = vec![password.trim().to_owned()];
    for bytes in [hub_key, pin_key, cloud_key] {
        forbidden.extend(spellings(&bytes));
    }
    for pin in PINS {
        assert!(
            run.stdout.contains(pin),
            "the story never used PIN {pin}: is PINS stale?"
        );
        forbidden.extend(spellings(&crypto::pin_tag(&pin_key, pin.as_bytes())));
    }
    for f in &forbidden {
        assert!(!all.contains(f.as_str()), "a secret or PIN tag was printed");
    }

    // The daemon logged (so the scan below saw its lines), and no line of
    // its log holds a PIN.
    assert!(
        run.stderr.contains("keypad entry") && run.stderr.contains("granted"),
        "no daemon log lines to check:\n{}",
        run.stderr
    );
    for pin in PINS {
        assert!(
            !run.stderr.contains(pin),
            "PIN {pin} in the daemon's log:\n{}",
            run.stderr
        );
    }
}

#[test]
fn the_interactive_demo_answers_a_typed_door_and_pin() {
    let run = run_demo(&["--interactive"], "101 482913\nlobby 999999\nquit\n");
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    for want in [
        "typed 482913# at door 101",
        "relay at door 101 opened",
        "audit door.granted door 101 key k-anna",
        "audit door.unlocked door 101 key k-anna",
        "typed 999999# at door lobby",
        "Deny reason 1 (denied)",
        "audit door.denied door lobby reason unknown_pin",
    ] {
        assert!(
            run.stdout.contains(want),
            "{want:?} not in:\n{}",
            run.stdout
        );
    }
    assert!(!run.stderr.contains("482913") && !run.stderr.contains("999999"));
}
