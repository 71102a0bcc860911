//! `lockhub provision` through the real binary: file contents and modes, the
//! refusal to overwrite, bundles, and the round trip through `check-config`.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_lockhub");
const SITE: &str = "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10";
const CLOUD_KEY: &str = "vpDAfBqmiMog0GAAR6GMchsmx2iCa19aGlMs764g2M0";
/// The vectors' hub key seed and its public key (spec/vectors/mqtt).
const HUB_SEED: &str = "qTouxiikSj0xOqGF1EY1r3wDRaCaaT-XQQUqNoXtCgU";
const HUB_PUBLIC: &str = "hnxZGkSHul8kFkNda3meL_Y5hD-IGBBTJ6T2hvrbnJI";
/// A PIN key from a bundle (the crypto test vector's).
const PIN_SECRET: &str = "7DSziFstzn18m4kT0DnCq0jReWQxAnkgKl6pfph4WsY";

struct Paths {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
    secrets: PathBuf,
    data: PathBuf,
}

fn paths() -> Paths {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_owned();
    Paths {
        config: root.join("etc/lockhub/hub.toml"),
        secrets: root.join("etc/lockhub/secrets.toml"),
        data: root.join("var/lib/lockhub"),
        root,
        _dir: dir,
    }
}

fn provision(p: &Paths, extra: &[&str]) -> Output {
    let mut c = Command::new(BIN);
    c.arg("provision")
        .arg("--config")
        .arg(&p.config)
        .arg("--data-dir")
        .arg(&p.data);
    c.args(extra).output().unwrap()
}

fn flags() -> Vec<String> {
    vec![
        "--site-id".into(),
        SITE.into(),
        "--hub-id".into(),
        "hub-lobby-1".into(),
        "--mqtt-url".into(),
        "mqtt://broker.example.net:1883".into(),
        "--trust".into(),
        format!("cloud-2026-11={CLOUD_KEY},2027-06-01T00:00:00Z"),
    ]
}

fn as_strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

fn check_config(config: &Path) -> Output {
    Command::new(BIN)
        .arg("check-config")
        .arg(config)
        .output()
        .unwrap()
}

/// Every `secret = "..."` value in a secrets file.
fn secrets_in(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("secret = \""))
        .map(|s| s.trim_end_matches('"').to_owned())
        .collect()
}

fn printed_public_key(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("hub_public_key = "))
        .expect("the public key is printed")
        .to_owned()
}

#[test]
fn flags_write_safe_files_that_check_config_accepts() {
    let p = paths();
    let out = provision(&p, &as_strs(&flags()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    assert_eq!(mode(&p.config), 0o644);
    assert_eq!(mode(&p.secrets), 0o600);
    assert_eq!(mode(&p.data), 0o700);
    assert_eq!(mode(p.config.parent().unwrap()), 0o755);
    let leftovers: Vec<_> = std::fs::read_dir(p.config.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let hub = std::fs::read_to_string(&p.config).unwrap();
    assert!(hub.contains(&format!("site_id = \"{SITE}\"")));
    assert!(hub.contains(&format!("file = \"{}\"", p.secrets.display())));
    let secrets = secrets_in(&p.secrets);
    assert_eq!(secrets.len(), 2, "hub key + one generated PIN key");

    // The printed key is the public half of the written seed; no secret is printed.
    let seed: [u8; 32] = base64_url(&secrets[0]);
    let public = ed25519_dalek::SigningKey::from_bytes(&seed).verifying_key();
    assert_eq!(
        printed_public_key(&out),
        lockhub_proto::crypto::b64u_encode(public.as_bytes())
    );
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for s in &secrets {
        assert!(!printed.contains(s.as_str()), "a secret was printed");
        assert!(!hub.contains(s.as_str()), "a secret is in hub.toml");
    }

    let check = check_config(&p.config);
    assert!(
        check.status.success(),
        "check-config refused the provisioned files: {}",
        String::from_utf8_lossy(&check.stderr)
    );
}

fn base64_url(s: &str) -> [u8; 32] {
    lockhub_proto::crypto::b64u_decode_32(s).unwrap()
}

#[test]
fn it_refuses_to_overwrite_without_force_and_replaces_with_it() {
    let p = paths();
    assert!(provision(&p, &as_strs(&flags())).status.success());
    let before_hub = std::fs::read(&p.config).unwrap();
    let before_secrets = std::fs::read(&p.secrets).unwrap();

    let again = provision(&p, &as_strs(&flags()));
    assert_eq!(again.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&again.stderr).contains("--force"));
    assert_eq!(std::fs::read(&p.config).unwrap(), before_hub);
    assert_eq!(std::fs::read(&p.secrets).unwrap(), before_secrets);

    // Only the secrets file in the way: still nothing is written.
    std::fs::remove_file(&p.config).unwrap();
    assert_eq!(provision(&p, &as_strs(&flags())).status.code(), Some(2));
    assert!(!p.config.exists());

    let mut f = flags();
    f.push("--force".into());
    let forced = provision(&p, &as_strs(&f));
    assert!(forced.status.success());
    assert_ne!(
        std::fs::read(&p.secrets).unwrap(),
        before_secrets,
        "a fresh hub key"
    );
    assert_eq!(mode(&p.secrets), 0o600);
}

#[test]
fn the_secrets_file_is_0600_and_the_config_0644_whatever_the_umask() {
    let p = paths();
    let mut args = vec![
        "provision".to_owned(),
        "--config".into(),
        p.config.display().to_string(),
        "--data-dir".into(),
        p.data.display().to_string(),
    ];
    args.extend(flags());
    for umask in ["000", "077"] {
        let _ = std::fs::remove_dir_all(p.root.join("etc"));
        let script = format!("umask {umask}; exec \"$0\" \"$@\"");
        let out = Command::new("sh")
            .arg("-c")
            .arg(&script)
            .arg(BIN)
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(mode(&p.secrets), 0o600, "umask {umask}");
        assert_eq!(mode(&p.config), 0o644, "umask {umask}");
    }
}

#[test]
fn a_bundle_with_doors_and_pin_keys_round_trips_and_json_output_is_public() {
    let p = paths();
    std::fs::create_dir_all(&p.root).unwrap();
    let bundle = p.root.join("bundle.json");
    std::fs::write(
        &bundle,
        format!(
            r#"{{
  "v": 1,
  "site_id": "{SITE}",
  "hub_id": "hub-lobby-1",
  "mqtt": {{"url": "mqtt://10.0.0.2:1883", "topic_prefix": "lockhub/v1"}},
  "trust": [{{"id": "cloud-2026-11", "public_key": "{CLOUD_KEY}", "not_after": "2027-06-01T00:00:00Z"}}],
  "serials": [{{"name": "board-a", "port": "/dev/ttyAMA0"}},
              {{"name": "board-b", "port": "/dev/serial/by-id/usb-lockhub_board-b-if00", "baud": 57600}}],
  "doors": [{{"name": "101", "serial": "board-a", "index": 0}},
            {{"name": "102", "serial": "board-a", "index": 1, "unlock_ms": 3000}},
            {{"name": "lobby", "serial": "board-b", "index": 0}}],
  "pin_keys": [{{"id": "k7", "secret": "{PIN_SECRET}"}}]
}}"#
        ),
    )
    .unwrap();
    let key_file = p.root.join("hub.key");
    std::fs::write(&key_file, format!("{HUB_SEED}\n")).unwrap();

    let out = provision(
        &p,
        &[
            "--bundle",
            bundle.to_str().unwrap(),
            "--hub-key-file",
            key_file.to_str().unwrap(),
            "--json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["hub_public_key"], HUB_PUBLIC);
    assert_eq!(v["hub_key_generated"], false);
    assert_eq!(v["pin_key_ids"], serde_json::json!(["k7"]));
    assert_eq!(v["pin_keys_generated"], serde_json::json!([]));
    assert!(!stdout.contains(PIN_SECRET) && !stdout.contains(HUB_SEED));
    assert_eq!(secrets_in(&p.secrets), vec![HUB_SEED, PIN_SECRET]);

    let hub = std::fs::read_to_string(&p.config).unwrap();
    assert!(hub.contains("[[door]]") && hub.contains("name = \"lobby\""));
    assert!(hub.contains("baud = 115200") && hub.contains("baud = 57600"));
    // The boards are sealed, and their keys come from pairing: until then
    // check-config refuses them, and only them.
    assert_eq!(
        v["boards_to_pair"],
        serde_json::json!(["board-a", "board-b"])
    );
    let check = check_config(&p.config);
    let said = String::from_utf8_lossy(&check.stderr);
    assert_eq!(check.status.code(), Some(2), "{said}");
    let problems: Vec<&str> = said.lines().filter(|l| !l.contains("warning:")).collect();
    assert_eq!(problems.len(), 2, "{said}");
    assert!(
        said.contains("serial `board-a` has no [[board_key]]"),
        "{said}"
    );
    assert!(
        said.contains("serial `board-b` has no [[board_key]]"),
        "{said}"
    );
    // Paired (here: the keys typed in): the round trip is whole.
    let mut secrets = std::fs::read_to_string(&p.secrets).unwrap();
    for b in ["board-a", "board-b"] {
        secrets.push_str(&testkit::files::board_key_toml(
            b,
            &testkit::files::board_key_for(b),
        ));
    }
    testkit::files::write_private(&p.secrets, &secrets).unwrap();
    let check = check_config(&p.config);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn bad_input_exits_2_and_writes_nothing() {
    let p = paths();
    let mut bad_key = flags();
    bad_key[7] = "cloud=AAAA".into();
    let mut bad_site = flags();
    bad_site[1] = "not-a-uuid".into();
    for args in [bad_key, bad_site] {
        let out = provision(&p, &as_strs(&args));
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!p.root.join("etc").exists());
    }
    // A secret on the command line is refused (other users can read argv).
    let mut inline = flags();
    inline.extend(["--pin-key".into(), format!("k1={PIN_SECRET}")]);
    let out = provision(&p, &as_strs(&inline));
    assert_eq!(out.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(PIN_SECRET));

    // An unknown bundle field is a clear error, not a silent drop.
    std::fs::create_dir_all(&p.root).unwrap();
    let bundle = p.root.join("b.json");
    std::fs::write(
        &bundle,
        r#"{"v":1,"site_id":"x","hub_id":"h","mqtt":{"url":"mqtt://b"},"trust":[],"dors":[]}"#,
    )
    .unwrap();
    let out = provision(&p, &["--bundle", bundle.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("dors"));
}

#[test]
fn an_owner_that_does_not_exist_says_how_to_create_it_and_writes_nothing() {
    let p = paths();
    let mut f = flags();
    f.extend(["--owner".into(), "no-such-lockhub-user".into()]);
    let out = provision(&p, &as_strs(&f));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown user \"no-such-lockhub-user\""),
        "{err}"
    );
    assert!(
        err.contains("adduser --system --group") && err.contains("leave out --owner"),
        "{err}"
    );
    let mut f = flags();
    f.extend(["--owner".into(), "65534:no-such-lockhub-group".into()]);
    let err = String::from_utf8_lossy(&provision(&p, &as_strs(&f)).stderr).into_owned();
    assert!(err.contains("unknown group"), "{err}");
    assert!(!p.root.join("etc").exists());
}

#[test]
fn owner_gets_the_secrets_file_and_the_data_folder() {
    if unsafe_is_not_root() {
        eprintln!("skipped: chown needs root");
        return;
    }
    let p = paths();
    let mut f = flags();
    f.extend(["--owner".into(), "65534:65534".into()]);
    let out = provision(&p, &as_strs(&f));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = std::fs::metadata(&p.secrets).unwrap();
    assert_eq!((s.uid(), s.gid()), (65534, 65534));
    let d = std::fs::metadata(&p.data).unwrap();
    assert_eq!((d.uid(), d.gid()), (65534, 65534));
    let c = std::fs::metadata(&p.config).unwrap();
    assert_eq!(
        c.uid(),
        std::fs::metadata(&p.root).unwrap().uid(),
        "config stays the installer's"
    );
}

fn unsafe_is_not_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() != 0)
        .unwrap_or(true)
}

#[test]
fn a_config_check_config_would_refuse_is_reported_and_nothing_is_left() {
    let p = paths();
    let mut f = flags();
    f[5] = "mqtts://broker.example.net:8883".into();
    let out = provision(&p, &as_strs(&f));
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ca_file"), "{err}");
    // The field and its flag, not a line of a hub.toml that was never
    // written (nor the staged file's name).
    assert!(
        err.contains(
            "bundle field `mqtt` (--mqtt-url and the TLS flags): mqtts:// needs `ca_file`"
        ),
        "{err}"
    );
    assert!(!err.contains("hub.toml"), "{err}");
    // Nothing left: the folders provision made for the files go with them.
    assert!(!p.root.join("etc").exists(), "folders left behind");
}

#[test]
fn a_bundle_check_config_would_refuse_names_each_field_at_fault() {
    let p = paths();
    std::fs::create_dir_all(&p.root).unwrap();
    let bundle = p.root.join("b.json");
    let body = serde_json::json!({
        "v": 1, "site_id": SITE, "hub_id": "hub-lobby-1",
        "mqtt": {"url": "mqtt://broker.example.net"},
        "trust": [{"id": "cloud-2026-11", "public_key": CLOUD_KEY}],
        "serials": [{"name": "board-a", "port": "/dev/null", "baud": 11520}],
        "doors": [
            {"name": "101", "serial": "board-a", "index": 0},
            {"name": "102", "serial": "board-a", "index": 16}
        ]
    });
    std::fs::write(&bundle, body.to_string()).unwrap();
    let out = provision(&p, &["--bundle", bundle.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bundle field `serials[0].baud`: `baud` must be one of"),
        "{err}"
    );
    assert!(
        err.contains("bundle field `doors[1].index`: `index` must be in 0..=15, found 16"),
        "{err}"
    );
    assert!(!err.contains("hub.toml"), "{err}");
    assert!(!p.root.join("etc").exists());
}

#[test]
fn a_bundle_with_osdp_readers_gets_a_fresh_key_per_secure_reader() {
    let p = paths();
    std::fs::create_dir_all(&p.root).unwrap();
    let bundle = p.root.join("bundle.json");
    std::fs::write(
        &bundle,
        format!(
            r#"{{
  "v": 1,
  "site_id": "{SITE}",
  "hub_id": "hub-lobby-1",
  "mqtt": {{"url": "mqtt://10.0.0.2:1883"}},
  "trust": [{{"id": "cloud-2026-11", "public_key": "{CLOUD_KEY}"}}],
  "osdp": [{{"name": "bus-a", "port": "/dev/ttyUSB0"}}],
  "readers": [{{"name": "r-201", "bus": "bus-a", "address": 1}},
              {{"name": "r-202", "bus": "bus-a", "address": 2}},
              {{"name": "r-inside", "bus": "bus-a", "address": 3, "insecure_plaintext": true}}],
  "reader_doors": [{{"name": "201", "reader": "r-201", "output": 0, "contact_input": 1}},
                   {{"name": "202", "reader": "r-202", "output": 0, "unlock_ms": 3000}}]
}}"#
        ),
    )
    .unwrap();
    let out = provision(&p, &["--bundle", bundle.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("OSDP reader keys generated for: r-201, r-202"),
        "{stdout}"
    );
    assert!(stdout.contains("lockhub osdp install"));

    let secrets: toml::Table =
        toml::from_str(&std::fs::read_to_string(&p.secrets).unwrap()).unwrap();
    let keys = secrets["reader_key"].as_array().unwrap();
    assert_eq!(keys.len(), 2, "no key for the insecure_plaintext reader");
    let scbk =
        |i: usize| lockhub_proto::crypto::b64u_decode(keys[i]["scbk"].as_str().unwrap()).unwrap();
    assert_eq!(scbk(0).len(), 16);
    assert_ne!(scbk(0), scbk(1), "each reader its own random key");
    for k in keys {
        assert!(
            !stdout.contains(k["scbk"].as_str().unwrap()),
            "a key was printed"
        );
    }
    assert_eq!(mode(&p.secrets), 0o600);
    let check = check_config(&p.config);
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let config = lockhub::config::load(&p.config).unwrap();
    assert_eq!(config.readers.len(), 3);
    assert_eq!(config.reader_doors[0].contact_input, Some(1));
    assert_eq!(config.reader_doors[1].unlock_ms, 3000);
}
