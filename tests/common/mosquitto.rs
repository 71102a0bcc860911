//! A real Mosquitto broker for one test: its own config, persistence folder
//! and free loopback port; killed on Drop; restartable on the same port and
//! persistence (to test reconnects and persistent sessions).
#![allow(dead_code)]

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How a test wants its broker.
#[derive(Debug, Clone, Default)]
pub struct BrokerOptions {
    /// Mosquitto's `max_queued_messages` (default 1000).
    pub max_queued_messages: Option<u32>,
    /// Mosquitto's `max_inflight_messages` (default 20).
    pub max_inflight_messages: Option<u32>,
    /// TLS listener: (ca, server cert, server key), client certs required.
    pub tls: Option<(PathBuf, PathBuf, PathBuf)>,
    /// `password_file` (made with `mosquitto_passwd -b`); anonymous refused.
    pub password_file: Option<PathBuf>,
}

pub struct Mosquitto {
    pub port: u16,
    pub dir: tempfile::TempDir,
    opts: BrokerOptions,
    child: Option<Child>,
}

pub fn mosquitto_bin() -> PathBuf {
    for p in [
        "/usr/sbin/mosquitto",
        "/usr/bin/mosquitto",
        "/usr/local/sbin/mosquitto",
    ] {
        if Path::new(p).exists() {
            return p.into();
        }
    }
    "mosquitto".into()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Mosquitto {
    pub fn start() -> Self {
        Self::start_with(BrokerOptions::default())
    }

    pub fn start_with(opts: BrokerOptions) -> Self {
        let mut m = Mosquitto {
            port: free_port(),
            dir: tempfile::tempdir().expect("tempdir"),
            opts,
            child: None,
        };
        m.write_config();
        m.spawn();
        m
    }

    pub fn url(&self) -> String {
        let scheme = if self.opts.tls.is_some() {
            "mqtts"
        } else {
            "mqtt"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    fn write_config(&self) {
        let data = self.dir.path().join("data");
        std::fs::create_dir_all(&data).expect("persistence dir");
        let mut c = String::new();
        // As root, Mosquitto drops to user `mosquitto` unless told otherwise,
        // and then cannot write a root-owned persistence folder.
        if unsafe_euid_is_root() {
            c.push_str("user root\n");
        }
        c.push_str("persistence true\n");
        c.push_str(&format!("persistence_location {}/\n", data.display()));
        c.push_str("autosave_interval 1\n");
        c.push_str(&format!("listener {} 127.0.0.1\n", self.port));
        match &self.opts.password_file {
            Some(p) => {
                c.push_str("allow_anonymous false\n");
                c.push_str(&format!("password_file {}\n", p.display()));
            }
            None => c.push_str("allow_anonymous true\n"),
        }
        if let Some((ca, cert, key)) = &self.opts.tls {
            c.push_str(&format!(
                "cafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate true\n",
                ca.display(),
                cert.display(),
                key.display()
            ));
        }
        if let Some(n) = self.opts.max_queued_messages {
            c.push_str(&format!("max_queued_messages {n}\n"));
        }
        if let Some(n) = self.opts.max_inflight_messages {
            c.push_str(&format!("max_inflight_messages {n}\n"));
        }
        c.push_str(&format!(
            "log_dest file {}/mosquitto.log\n",
            self.dir.path().display()
        ));
        c.push_str("log_type error\nlog_type warning\nlog_type notice\n");
        std::fs::write(self.dir.path().join("mosquitto.conf"), c).expect("write config");
    }

    fn spawn(&mut self) {
        let child = Command::new(mosquitto_bin())
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mosquitto");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "mosquitto did not start: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The broker's log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    /// Stops the broker (SIGTERM, so it saves its persistence), waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe_sigterm(child.id());
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Starts it again on the same port with the same persistence.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "already running");
        self.spawn();
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

fn unsafe_euid_is_root() -> bool {
    // `id -u` avoids a libc dependency for one syscall.
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn unsafe_sigterm(pid: u32) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status();
}

/// Test certificates made with the openssl CLI: a CA, a server certificate
/// for 127.0.0.1 (subjectAltName IP:127.0.0.1) and a client certificate.
pub struct TestPki {
    pub dir: tempfile::TempDir,
}

impl TestPki {
    pub fn generate() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=lockhub test CA",
        ]);
        std::fs::File::create(d.join("server.ext"))
            .and_then(|mut f| f.write_all(b"subjectAltName=IP:127.0.0.1\n"))
            .expect("ext file");
        // Extensions make it an X.509 v3 certificate; webpki refuses v1.
        std::fs::File::create(d.join("client.ext"))
            .and_then(|mut f| f.write_all(b"extendedKeyUsage=clientAuth\n"))
            .expect("ext file");
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "client.key",
            "-out",
            "client.csr",
            "-subj",
            "/CN=hub-lobby-1",
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            "client.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "client.crt",
            "-days",
            "2",
            "-extfile",
            "client.ext",
        ]);
        TestPki { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// (ca, server cert, server key) for [`BrokerOptions::tls`].
    pub fn server(&self) -> (PathBuf, PathBuf, PathBuf) {
        (
            self.path("ca.crt"),
            self.path("server.crt"),
            self.path("server.key"),
        )
    }
}

/// A Mosquitto password file with one user (`mosquitto_passwd -b`).
pub fn password_file(dir: &Path, user: &str, password: &str) -> PathBuf {
    let p = dir.join("passwd");
    std::fs::write(&p, "").expect("create passwd");
    let status = Command::new("mosquitto_passwd")
        .arg("-b")
        .arg(&p)
        .arg(user)
        .arg(password)
        .status()
        .expect("run mosquitto_passwd");
    assert!(status.success(), "mosquitto_passwd failed");
    p
}
