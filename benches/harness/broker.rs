//! A real Mosquitto for one benchmark run: its own folder, config and free
//! loopback port; stopped on Drop.
//!
//! Why the settings differ from Mosquitto's defaults (and what a production
//! broker for hubs should use, see BENCHMARKS.md 'Broker settings'):
//! - `max_queued_messages`: the default 1000 silently *drops* QoS 1 messages
//!   queued for a client beyond it. A benchmark that publishes 100,000
//!   events faster than the hub takes them would measure a loss, not a rate.
//! - `max_inflight_messages`: the default 20 unacked QoS 1 messages per
//!   client. Mosquitto 2.0 does not hold it for a client that acks in order
//!   (BENCHMARKS.md 'Findings'), and the hub keeps its own receive window,
//!   so it should not matter; the runs use 20 and 1000 to show that it
//!   does not.
//! - `persistence true` with the default autosave: what a production broker
//!   does; Mosquitto 2.0 keeps messages in memory and snapshots them.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The broker settings a run asks for.
#[derive(Debug, Clone, Copy)]
pub struct BrokerSettings {
    pub max_inflight_messages: u32,
    pub max_queued_messages: u32,
}

impl BrokerSettings {
    /// Mosquitto's own default window, with a queue deep enough for the run.
    pub fn default_window(queue: u32) -> Self {
        BrokerSettings {
            max_inflight_messages: 20,
            max_queued_messages: queue,
        }
    }
}

pub struct Mosquitto {
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub settings: BrokerSettings,
    child: Option<Child>,
}

pub fn mosquitto_bin() -> PathBuf {
    [
        "/usr/sbin/mosquitto",
        "/usr/bin/mosquitto",
        "/usr/local/sbin/mosquitto",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.exists())
    .unwrap_or_else(|| "mosquitto".into())
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl Mosquitto {
    pub fn start(settings: BrokerSettings) -> Mosquitto {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).expect("persistence dir");
        let mut c = String::new();
        // As root, Mosquitto drops to user `mosquitto`, which cannot write a
        // root-owned persistence folder.
        if is_root() {
            c.push_str("user root\n");
        }
        c.push_str("persistence true\n");
        c.push_str(&format!("persistence_location {}/\n", data.display()));
        c.push_str(&format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\n"
        ));
        c.push_str(&format!(
            "max_inflight_messages {}\nmax_queued_messages {}\n",
            settings.max_inflight_messages, settings.max_queued_messages
        ));
        c.push_str(&format!(
            "log_dest file {}/mosquitto.log\nlog_type error\nlog_type warning\n",
            dir.path().display()
        ));
        let conf = dir.path().join("mosquitto.conf");
        std::fs::write(&conf, c).expect("write mosquitto.conf");
        let mut m = Mosquitto {
            port,
            dir,
            settings,
            child: None,
        };
        m.spawn();
        m
    }

    /// Starts the process on the folder's config and waits for its port.
    fn spawn(&mut self) {
        let child = Command::new(mosquitto_bin())
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mosquitto (apt-get install mosquitto)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "mosquitto did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM (Mosquitto saves its persistence file: sessions and queued
    /// QoS 1 messages survive), waits for the exit, and starts it again on
    /// the same port after `down`.
    pub fn restart(&mut self, down: Duration) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !matches!(child.try_wait(), Ok(Some(_))) {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        std::thread::sleep(down);
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn folder(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
