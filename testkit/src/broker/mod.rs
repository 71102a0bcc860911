//! The brokers: a real Mosquitto for one test or benchmark run (its own
//! config, persistence folder and free loopback port; killed on Drop;
//! restartable on the same port and persistence, to test reconnects and
//! persistent sessions), its TLS test PKI, password files and ACLs; and
//! rumqttd, the second broker ([`rumqttd`]); and Mosquitto with the
//! configs shipped in packaging/mosquitto/ ([`shipped`]).

pub mod rumqttd;
pub mod shipped;

pub use self::rumqttd::{AnyBroker, Rumqttd};
pub use crate::ports::free_port;

use std::io::Write;
use std::net::TcpStream;
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
    /// `acl_file` (re-read, like the password file, on [`Mosquitto::reload`]).
    pub acl_file: Option<PathBuf>,
    /// TLS only: the client certificate's CN is the username
    /// (`use_identity_as_username true`); anonymous refused.
    pub identity_as_username: bool,
    /// `use_username_as_clientid true` (the shipped configs set it).
    pub username_as_client_id: bool,
    /// Mosquitto's own `autosave_interval` (what a production broker does:
    /// the benchmarks). Tests save every second, so a restart keeps what
    /// a test just queued.
    pub default_autosave: bool,
}

pub struct Mosquitto {
    pub port: u16,
    pub dir: tempfile::TempDir,
    opts: BrokerOptions,
    child: Option<Child>,
}

/// The Mosquitto binary: `LOCKHUB_MOSQUITTO` when set (another build, e.g.
/// one whose in-flight window holds, for a benchmark), else the system's.
pub fn mosquitto_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LOCKHUB_MOSQUITTO") {
        return p.into();
    }
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

impl Mosquitto {
    pub fn start() -> Self {
        Self::start_with(BrokerOptions::default())
    }

    pub fn start_with(opts: impl Into<BrokerOptions>) -> Self {
        Self::start_in(tempfile::tempdir().expect("tempdir"), opts)
    }

    /// [`Mosquitto::start_with`] in a folder of the caller's (a benchmark's
    /// slow disk).
    pub fn start_in(dir: tempfile::TempDir, opts: impl Into<BrokerOptions>) -> Self {
        let mut m = Mosquitto {
            port: free_port(),
            dir,
            opts: opts.into(),
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
        if is_root() {
            c.push_str("user root\n");
        }
        c.push_str("persistence true\n");
        c.push_str(&format!("persistence_location {}/\n", data.display()));
        if !self.opts.default_autosave {
            c.push_str("autosave_interval 1\n");
        }
        c.push_str(&format!("listener {} 127.0.0.1\n", self.port));
        match &self.opts.password_file {
            Some(p) => {
                c.push_str("allow_anonymous false\n");
                c.push_str(&format!("password_file {}\n", p.display()));
            }
            None if self.opts.identity_as_username => {
                c.push_str("allow_anonymous false\nuse_identity_as_username true\n")
            }
            None => c.push_str("allow_anonymous true\n"),
        }
        if self.opts.username_as_client_id {
            c.push_str("use_username_as_clientid true\n");
        }
        if let Some(p) = &self.opts.acl_file {
            c.push_str(&format!("acl_file {}\n", p.display()));
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
        // `information` logs "running" once every listener is bound: how
        // `spawn` knows the broker answering is this one.
        c.push_str("log_type error\nlog_type warning\nlog_type notice\nlog_type information\n");
        std::fs::write(self.dir.path().join("mosquitto.conf"), c).expect("write config");
    }

    fn spawn(&mut self) {
        let started_before = self.times_running();
        let child = Command::new(mosquitto_bin())
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start mosquitto");
        let (port, log) = (self.port, self.dir.path().join("mosquitto.log"));
        let child = self.child.insert(child);
        wait_running(
            child,
            port,
            || times_running(&read_log(&log)) > started_before,
            || read_log(&log),
        );
    }

    /// How many times this broker has logged that it runs.
    fn times_running(&self) -> usize {
        times_running(&self.log())
    }

    /// The broker's log so far (for assertion messages).
    pub fn log(&self) -> String {
        read_log(&self.dir.path().join("mosquitto.log"))
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

    /// SIGHUP: Mosquitto re-reads its password and ACL files (what an
    /// installer does after fixing them), keeping every connection.
    pub fn reload(&self) {
        let child = self.child.as_ref().expect("broker running");
        let _ = Command::new("kill")
            .arg("-HUP")
            .arg(child.id().to_string())
            .status();
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGSTOP: the broker keeps its connections but reads, acknowledges
    /// and delivers nothing until [`Mosquitto::resume`] (a broker that has
    /// stopped answering; Drop still kills it).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`Mosquitto::pause`].
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let child = self.child.as_ref().expect("broker running");
        let ok = Command::new("kill")
            .arg(sig)
            .arg(child.id().to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} the broker");
    }

    /// Starts it again on the same port with the same persistence.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// [`Mosquitto::restart`], down for `down` in between (a broker
    /// outage of that length).
    pub fn restart_after(&mut self, down: Duration) {
        self.stop();
        std::thread::sleep(down);
        self.spawn();
    }

    /// The broker's folder (config, log, `data/` persistence).
    pub fn folder(&self) -> &Path {
        self.dir.path()
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

/// A broker's log file so far ("" before it exists).
fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// How many times a Mosquitto `log` says it runs (all listeners bound).
fn times_running(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("mosquitto version") && l.ends_with(" running"))
        .count()
}

/// Waits (at most 10 s) until the Mosquitto `child` says it runs
/// (`running`, checked by the caller over its log) and answers on `port`.
/// Our broker must be the one answering: a port taken by someone else
/// between `free_port` and Mosquitto's bind makes it exit, which fails
/// the test with the broker's `log`.
fn wait_running(
    child: &mut Child,
    port: u16,
    running: impl Fn() -> bool,
    log: impl Fn() -> String,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let exited = child.try_wait().ok().flatten();
        assert!(
            exited.is_none(),
            "mosquitto exited ({exited:?}) before listening on {port}: {}",
            log()
        );
        if running() && TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "mosquitto did not start: {}",
            log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether this process runs as root (CI does).
pub fn is_root() -> bool {
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
        let run = |args: &[&str]| openssl(d, args);
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
        issue(d, "server", "/CN=127.0.0.1", "server.ext");
        issue(d, "client", "/CN=hub-lobby-1", "client.ext");
        TestPki { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// One more client certificate, `NAME.crt` and `NAME.key` (mode 0600),
    /// with subject CN `cn` (a `/` in it is escaped for openssl), signed by
    /// the CA. Returns (cert, key).
    pub fn client(&self, name: &str, cn: &str) -> (PathBuf, PathBuf) {
        let d = self.dir.path();
        let key = format!("{name}.key");
        issue(
            d,
            name,
            &format!("/CN={}", cn.replace('/', "\\/")),
            "client.ext",
        );
        std::fs::set_permissions(
            d.join(&key),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .expect("chmod key");
        (d.join(format!("{name}.crt")), d.join(key))
    }

    /// A server certificate for 127.0.0.1 from this CA that expired in
    /// 2020 (`openssl ca` with fixed dates: `x509 -days` cannot go back),
    /// as (ca, server cert, server key) for [`BrokerOptions::tls`].
    pub fn expired_server(&self) -> (PathBuf, PathBuf, PathBuf) {
        let d = self.dir.path();
        std::fs::write(
            d.join("ca.cnf"),
            "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\n\
             serial = ca.serial\ndefault_md = sha256\npolicy = p\n[p]\ncommonName = supplied\n",
        )
        .expect("ca config");
        std::fs::write(d.join("index.txt"), "").expect("ca index");
        std::fs::write(d.join("ca.serial"), "01\n").expect("ca serial");
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "expired.key",
                "-out",
                "expired.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        );
        openssl(
            d,
            &[
                "ca",
                "-batch",
                "-config",
                "ca.cnf",
                "-cert",
                "ca.crt",
                "-keyfile",
                "ca.key",
                "-in",
                "expired.csr",
                "-out",
                "expired.crt",
                "-notext",
                "-startdate",
                "20200101000000Z",
                "-enddate",
                "20200102000000Z",
                "-extfile",
                "server.ext",
            ],
        );
        (
            self.path("ca.crt"),
            self.path("expired.crt"),
            self.path("expired.key"),
        )
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

/// `NAME.key` and `NAME.crt` in `dir` for subject `subj`, signed by the
/// CA there (`ca.crt`, `ca.key`) with the extensions of `ext`.
fn issue(dir: &Path, name: &str, subj: &str, ext: &str) {
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subj,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            ext,
        ],
    );
}

/// Runs the openssl CLI in `dir`; a failure fails the test with its stderr.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Mosquitto password file with one user (`mosquitto_passwd -b`).
pub fn password_file(dir: &Path, user: &str, password: &str) -> PathBuf {
    password_file_users(dir, "passwd", &[(user, password)])
}

/// A Mosquitto password file `name` in `dir` with these users, replacing
/// whatever it held (so a test can fix one and [`Mosquitto::reload`]).
pub fn password_file_users(dir: &Path, name: &str, users: &[(&str, &str)]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, "").expect("create passwd");
    for (user, password) in users {
        let status = Command::new("mosquitto_passwd")
            .arg("-b")
            .arg(&p)
            .arg(user)
            .arg(password)
            .status()
            .expect("run mosquitto_passwd");
        assert!(status.success(), "mosquitto_passwd failed");
    }
    p
}

/// The ACL shipped for installers (packaging/mosquitto/lockhub.acl), read
/// from the repository so the tests check exactly what ships.
pub fn shipped_acl() -> String {
    let p = crate::repo_root().join("packaging/mosquitto/lockhub.acl");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// The shipped ACL plus one cloud identity `cloud_user` for `site` that
/// both publishes events and reads the hubs' topics, for every hub of that
/// site: the test cloud ([`crate::cloud::CloudClient`]) is one connection.
/// The shipped ACL's own cloud block has an identity per connection
/// ([`shipped::shipped_acl_for_site`]).
pub fn acl_with_cloud(cloud_user: &str, site: &str) -> String {
    format!(
        "{}\nuser {cloud_user}\n\
         topic write lockhub/v1/{site}/+/events\n\
         topic read lockhub/v1/{site}/+/results\n\
         topic read lockhub/v1/{site}/+/audit\n\
         topic read lockhub/v1/{site}/+/alerts\n\
         topic read lockhub/v1/{site}/+/sync\n\
         topic read lockhub/v1/{site}/+/status\n",
        shipped_acl()
    )
}
