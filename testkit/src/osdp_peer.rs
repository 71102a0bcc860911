//! The OSDP tests' reader: `testkit/osdp/peer.py`, the PyPI `libosdp`
//! PeripheralDevice on a pseudo-terminal, driven line by line in JSON.
//!
//! The Python comes from `LOCKHUB_OSDP_PYTHON` (set by scripts/test), else
//! the virtual environment scripts/test makes in the build folder.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where the Python with `osdp` is expected: `LOCKHUB_OSDP_PYTHON`, else
/// the virtual environment scripts/test makes in the build folder.
pub fn python_path() -> PathBuf {
    if let Ok(p) = std::env::var("LOCKHUB_OSDP_PYTHON") {
        return PathBuf::from(p);
    }
    let target = option_env!("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("target"));
    target.join("osdp-venv/bin/python")
}

/// The Python with `osdp` installed; a test without it fails, saying how
/// to get it.
pub fn python() -> PathBuf {
    let p = python_path();
    assert!(
        p.exists(),
        "no OSDP test peer: run scripts/test (it installs PyPI libosdp into {}) or set LOCKHUB_OSDP_PYTHON",
        p.display()
    );
    p
}

/// A running peer reader.
pub struct Peer {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<Value>,
    /// Every line it printed so far.
    pub seen: Vec<Value>,
    /// The pty path the hub opens.
    pub port: PathBuf,
}

/// The peer's options: `--key HEX|none`, `--address N`, `--serial N`, ...
pub fn key_hex(k: &[u8; 16]) -> String {
    k.iter().map(|b| format!("{b:02x}")).collect()
}

impl Peer {
    pub fn start(args: &[&str]) -> Peer {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("osdp/peer.py");
        let mut child = Command::new(python())
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the OSDP peer");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send(v).is_err()
                {
                    break;
                }
            }
        });
        let mut p = Peer {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            port: PathBuf::new(),
        };
        let first = p.wait("its port", Duration::from_secs(20), |v| {
            v.get("port").is_some()
        });
        p.port = PathBuf::from(first["port"].as_str().unwrap());
        p
    }

    pub fn send(&mut self, v: Value) {
        writeln!(self.stdin, "{v}").expect("write to the peer");
        self.stdin.flush().unwrap();
    }

    /// Types keys (raw OSDP key codes).
    pub fn keys(&mut self, keys: &[u8]) {
        self.send(json!({ "keys": keys }));
    }

    /// Reads what arrived without waiting.
    pub fn drain(&mut self) {
        while let Ok(v) = self.lines.try_recv() {
            self.seen.push(v);
        }
    }

    /// Waits for a line that satisfies `f` (among those seen so far too).
    pub fn wait(&mut self, what: &str, timeout: Duration, f: impl Fn(&Value) -> bool) -> Value {
        if let Some(v) = self.seen.iter().find(|v| f(v)) {
            return v.clone();
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) => {
                    self.seen.push(v.clone());
                    if f(&v) {
                        return v;
                    }
                }
                Err(_) => panic!("the peer never showed {what}; it printed: {:?}", self.seen),
            }
        }
    }

    /// Waits for the peer's Secure Channel to be up.
    pub fn wait_sc(&mut self) {
        self.wait("a secure channel", Duration::from_secs(20), |v| {
            v["sc"] == true
        });
    }

    /// Every command line of `kind` ("output", "led", "buzzer", "keyset").
    pub fn commands(&mut self, kind: &str) -> Vec<Value> {
        self.drain();
        self.seen
            .iter()
            .filter(|v| v["cmd"] == kind)
            .cloned()
            .collect()
    }

    /// Forgets what was seen (the next waits look only at new lines).
    pub fn forget(&mut self) {
        self.drain();
        self.seen.clear();
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"quit": true}));
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
