//! What the cloud's tests share: the binary in a temp folder with its own
//! database, and a site with one hub.

#![allow(dead_code)]

use lockhub_proto::bundle::TrustSpec;
use lockhub_proto::time::Timestamp;
use lockhub_proto::verify::{Rejection, Signer, VerifiedEvent, VerifyContext, verify_envelope};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

pub const SITE: &str = "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10";
pub const UNTIL: &str = "2099-01-01T00:00:00Z";

pub fn hub_ref(hub: &str) -> String {
    format!("{SITE}/{hub}")
}

/// One cloud: a folder with its database (and signer folder).
pub struct Cloud {
    pub dir: tempfile::TempDir,
}

impl Cloud {
    /// `init`, then `hub add SITE/hub-1 --door 101 --door 102`.
    pub fn new() -> Cloud {
        let c = Cloud {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        c.ok(&["init"]);
        c.ok(&[
            "hub",
            "add",
            &hub_ref("hub-1"),
            "--door",
            "101",
            "--door",
            "102",
        ]);
        c
    }

    pub fn db(&self) -> PathBuf {
        self.dir.path().join("cloud.db")
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_lockhub-cloud"));
        c.args(args)
            .env("LOCKHUB_CLOUD_DB", self.db())
            .env_remove("LOCKHUB_CLOUD_BROKER")
            .env("RUST_LOG", "warn")
            // A fault test aborts the process: any core file lands here.
            .current_dir(self.dir.path())
            .stdin(Stdio::null());
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run lockhub-cloud")
    }

    /// Runs and expects success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    }

    /// A file holding `pin`.
    pub fn pin_file(&self, pin: &str) -> PathBuf {
        let p = self.dir.path().join(format!("pin-{pin}"));
        std::fs::write(&p, format!("{pin}\n")).unwrap();
        p
    }

    pub fn sql<T: rusqlite::types::FromSql>(&self, query: &str) -> T {
        rusqlite::Connection::open(self.db())
            .unwrap()
            .query_row(query, [], |r| r.get(0))
            .unwrap_or_else(|e| panic!("{query}: {e}"))
    }

    /// Every stored event: (seq, event_id, envelope, published).
    pub fn events(&self) -> Vec<(i64, String, Vec<u8>, bool)> {
        let c = rusqlite::Connection::open(self.db()).unwrap();
        let mut st = c
            .prepare(
                "SELECT seq, event_id, envelope, published_at IS NOT NULL FROM events ORDER BY seq",
            )
            .unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// `issue` for a check-in with the PIN in a file, plus `extra`.
    pub fn issue_args(&self, check_in: &str, pin: &Path, extra: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = [
            "--json",
            "issue",
            &hub_ref("hub-1"),
            "--check-in",
            check_in,
            "--door",
            "101",
            "--pin-file",
            pin.to_str().unwrap(),
            "--valid-until",
            UNTIL,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    }
}

pub fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{stdout:?}: {e}"))
}

/// A child process killed when the test ends, also when it fails (else its
/// inherited stderr would keep the test harness waiting).
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Checks a cloud envelope for hub-1 the way the hub does (step 1): under
/// the trust ring `trust` (as a bundle gives it), at the hub's time `now`.
pub fn verify(
    envelope: &[u8],
    trust: &[TrustSpec],
    now: Timestamp,
) -> Result<VerifiedEvent, Rejection> {
    let ring: Vec<Signer> = trust
        .iter()
        .map(|t| Signer {
            id: t.id.clone(),
            public_key: lockhub_proto::crypto::parse_public_key(&t.public_key).unwrap(),
            not_after: t
                .not_after
                .as_deref()
                .map(|n| Timestamp::parse_rfc3339(n).unwrap()),
        })
        .collect();
    let ctx = VerifyContext {
        ring: &ring,
        site_id: SITE.parse().unwrap(),
        hub_id: "hub-1",
        now,
    };
    verify_envelope(envelope, &ctx)
}

/// Checks a cloud envelope under the cloud's active signer the way the hub
/// does (step 1) and returns its body as JSON.
pub fn verified_body(cloud: &Cloud, envelope: &[u8]) -> serde_json::Value {
    let c = rusqlite::Connection::open(cloud.db()).unwrap();
    let (id, public_key): (String, String) = c
        .query_row(
            "SELECT id, public_key FROM signers WHERE active = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let ring = [TrustSpec {
        id,
        public_key,
        not_after: None,
    }];
    let v = verify(envelope, &ring, Timestamp::now_system()).expect("the hub accepts it");
    serde_json::from_slice(&v.body).unwrap()
}

/// The `signer` field of a cloud envelope: the trust-ring id that signed it.
pub fn envelope_signer(envelope: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(envelope).unwrap();
    v["signer"].as_str().unwrap().to_owned()
}
