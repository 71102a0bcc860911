//! Mosquitto run with the files shipped in `packaging/mosquitto/`, installed
//! the way docs/broker.md tells an installer to: the listener config in a
//! `conf.d` folder that a main config includes (Debian's layout), the ACL
//! and password file beside it, the broker's certificates under `certs/`,
//! and, when the test runs as root, the files Mosquitto reads after it
//! drops to user `mosquitto` owned by that user. Only the paths move to a
//! temporary folder and the port to a free one on loopback; every other
//! line is the shipped one, so a test of this broker tests what ships.

use super::{TestPki, is_root, mosquitto_bin, shipped_acl};
use crate::ports::free_port;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Which shipped listener config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `lockhub-password.conf`: TLS, one password per identity.
    Password,
    /// `lockhub-certificate.conf`: TLS, one client certificate per identity.
    Certificate,
}

impl Variant {
    pub fn file_name(self) -> &'static str {
        match self {
            Variant::Password => "lockhub-password.conf",
            Variant::Certificate => "lockhub-certificate.conf",
        }
    }
}

/// A shipped listener config as installed under `etc` (for
/// `/etc/mosquitto/`) with its persistence in `lib` (for
/// `/var/lib/mosquitto/`), listening on `port` on loopback instead of 8883
/// on every interface. Panics when the file has no such path or not exactly
/// one `listener` line: a test must notice when the shipped file changes
/// shape, not quietly test something else.
pub fn as_installed(conf: &str, etc: &Path, lib: &Path, port: u16) -> String {
    let listeners = conf
        .lines()
        .filter(|l| l.trim_start().starts_with("listener"))
        .count();
    assert_eq!(listeners, 1, "one listener line in the shipped config");
    for shipped in ["/etc/mosquitto/", "/var/lib/mosquitto/", "listener 8883\n"] {
        assert!(
            conf.contains(shipped),
            "the shipped config names {shipped:?}"
        );
    }
    let out = conf
        .replace("/etc/mosquitto/", &format!("{}/", etc.display()))
        .replace("/var/lib/mosquitto/", &format!("{}/", lib.display()))
        .replace("listener 8883\n", &format!("listener {port} 127.0.0.1\n"));
    for line in out.lines().filter(|l| !l.trim_start().starts_with('#')) {
        assert!(
            !line.contains(" /etc/") && !line.contains(" /var/"),
            "a system path left in the installed config: {line}"
        );
    }
    out
}

/// The shipped ACL with its cloud block filled in for `site`, as
/// `lockhub.acl` tells an installer: its commented `user` and `topic`
/// lines uncommented and `SITE_ID` replaced.
pub fn shipped_acl_for_site(site: &str) -> String {
    shipped_acl()
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rule) if rule.starts_with("user ") || rule.starts_with("topic ") => {
                rule.replace("SITE_ID", site)
            }
            _ => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// A running Mosquitto with a shipped config (killed on Drop).
pub struct ShippedBroker {
    pub dir: tempfile::TempDir,
    /// The test CA (by default also the broker's), and whatever client
    /// certificates the test issues with [`TestPki::client`].
    pub pki: TestPki,
    pub port: u16,
    pub variant: Variant,
    child: Option<Child>,
}

impl ShippedBroker {
    /// Installs and starts `variant` with the shipped ACL filled in for
    /// `site`, and (password variant) a password file holding `users`
    /// (name, password). Client certificates for the certificate variant
    /// come from [`ShippedBroker::pki`], before or after the start.
    pub fn start(variant: Variant, site: &str, users: &[(&str, &str)]) -> ShippedBroker {
        let pki = TestPki::generate();
        let certs = [
            pki.path("ca.crt"),
            pki.path("server.crt"),
            pki.path("server.key"),
        ];
        Self::start_with_certs(variant, site, users, pki, certs)
    }

    /// [`ShippedBroker::start`] with the broker's own (CA, certificate,
    /// key), made elsewhere (docs/broker.md's commands); `pki` still
    /// issues client certificates.
    pub fn start_with_certs(
        variant: Variant,
        site: &str,
        users: &[(&str, &str)],
        pki: TestPki,
        [ca, cert, key]: [PathBuf; 3],
    ) -> ShippedBroker {
        let dir = tempfile::tempdir().expect("tempdir");
        let etc = dir.path().join("etc");
        let lib = dir.path().join("lib");
        for d in [etc.join("conf.d"), etc.join("certs"), lib.clone()] {
            std::fs::create_dir_all(&d).expect("mkdir");
        }
        let certs = etc.join("certs");
        for (from, to) in [(ca, "ca.pem"), (cert, "broker.pem"), (key, "broker.key")] {
            std::fs::copy(from, certs.join(to)).expect("copy certificate");
        }
        crate::files::set_mode(&certs.join("broker.key"), 0o600);
        std::fs::write(etc.join("lockhub.acl"), shipped_acl_for_site(site)).expect("write acl");
        let passwd = etc.join("lockhub.passwd");
        if variant == Variant::Password {
            super::password_file_users(&etc, "lockhub.passwd", users);
            crate::files::set_mode(&passwd, 0o600);
        }
        let port = free_port();
        let shipped = crate::repo_root()
            .join("packaging/mosquitto")
            .join(variant.file_name());
        let conf = std::fs::read_to_string(&shipped)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", shipped.display()));
        std::fs::write(
            etc.join("conf.d/lockhub.conf"),
            as_installed(&conf, &etc, &lib, port),
        )
        .expect("write conf");
        // Debian's /etc/mosquitto/mosquitto.conf, minus its pid and log
        // files (the log goes to stderr, which the broker's folder keeps).
        std::fs::write(
            etc.join("mosquitto.conf"),
            format!("include_dir {}/conf.d\n", etc.display()),
        )
        .expect("write main conf");
        // Started as root, Mosquitto drops to user `mosquitto` before it
        // reads the password file, the ACL and its key, and writes its
        // persistence as that user (docs/broker.md, "File ownership").
        if is_root() && user_exists("mosquitto") {
            crate::files::set_mode(dir.path(), 0o755);
            let owned: Vec<PathBuf> = [
                "etc/lockhub.passwd",
                "etc/lockhub.acl",
                "etc/certs/broker.key",
                "lib",
            ]
            .iter()
            .map(|p| dir.path().join(p))
            .filter(|p| p.exists())
            .collect();
            let ok = Command::new("chown")
                .arg("mosquitto:")
                .args(&owned)
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "chown mosquitto: {owned:?}");
        }
        let mut b = ShippedBroker {
            dir,
            pki,
            port,
            variant,
            child: None,
        };
        b.spawn();
        b
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.log_path()).expect("create log");
        let child = Command::new(mosquitto_bin())
            .arg("-c")
            .arg(self.dir.path().join("etc/mosquitto.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start mosquitto");
        let (port, log) = (self.port, self.log_path());
        let child = self.child.insert(child);
        super::wait_running(
            child,
            port,
            || super::times_running(&super::read_log(&log)) > 0,
            || super::read_log(&log),
        );
    }

    pub fn url(&self) -> String {
        format!("mqtts://127.0.0.1:{}", self.port)
    }

    /// The CA the broker's certificate comes from (as installed).
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("etc/certs/ca.pem")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("mosquitto.log")
    }

    /// What the broker wrote to stderr so far.
    pub fn log(&self) -> String {
        super::read_log(&self.log_path())
    }

    /// The ports the broker says it opened ("Opening ipv4 listen socket on
    /// port N."), in order, one per address family.
    pub fn opened_ports(&self) -> Vec<u16> {
        self.log()
            .lines()
            .filter_map(|l| l.split(" listen socket on port ").nth(1))
            .filter_map(|rest| rest.trim_end_matches('.').parse().ok())
            .collect()
    }
}

impl Drop for ShippedBroker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn user_exists(name: &str) -> bool {
    Command::new("id")
        .arg(name)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The local addresses (`127.0.0.1:1883`, `[::]:1883`) on which process
/// `pid` listens for TCP, from `ss -ltnp`; `None` when `ss` is not there
/// or shows no processes (then the caller relies on the other checks).
pub fn tcp_listeners_of(pid: u32) -> Option<BTreeSet<String>> {
    let out = Command::new("ss").args(["-Hltnp"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains("pid=") {
        return None;
    }
    let tag = format!("pid={pid},");
    Some(
        text.lines()
            .filter(|l| l.contains(&tag))
            .filter_map(|l| l.split_whitespace().nth(3).map(str::to_owned))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installing_moves_paths_and_the_port_and_nothing_else() {
        let conf = "a 1\nacl_file /etc/mosquitto/x.acl\npersistence_location /var/lib/mosquitto/\n\
                    listener 8883\nkeyfile /etc/mosquitto/certs/k\n";
        let out = as_installed(conf, Path::new("/t/etc"), Path::new("/t/lib"), 4242);
        assert_eq!(
            out,
            "a 1\nacl_file /t/etc/x.acl\npersistence_location /t/lib/\n\
             listener 4242 127.0.0.1\nkeyfile /t/etc/certs/k\n"
        );
    }

    #[test]
    fn the_cloud_block_is_filled_for_the_site_and_the_hub_lines_kept() {
        let acl = shipped_acl_for_site("s1");
        assert!(acl.contains("\npattern read  lockhub/v1/%u/events\n"));
        assert!(acl.contains("\nuser cloud-pub\n"), "{acl}");
        assert!(
            acl.contains("\ntopic write lockhub/v1/s1/+/events\n"),
            "{acl}"
        );
        assert!(!acl.contains("SITE_ID/+"), "{acl}");
    }
}
