//! `lockhub keys --config FILE` against a real database: it lists what the
//! mirror holds, safely while a writer has the database open, and never a
//! PIN tag or a holder name.

use lockhub::store::{Priority, Store};
use lockhub_proto::crypto::{b64u_encode, pin_tag};
use std::process::Command;
use testkit::db::{K, insert_key, pin_keys};
use testkit::files::Fixture;

fn keys_cmd(fx: &Fixture) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lockhub"))
        .args(["keys", "--config"])
        .arg(fx.hub())
        .output()
        .expect("run lockhub keys")
}

#[test]
fn keys_lists_the_mirror_without_tags_or_names_while_the_store_is_open() {
    let fx = Fixture::new();
    let config = lockhub::config::load(&fx.hub()).expect("valid fixture");
    let store = Store::open(&config.database_path(), &config.policy).unwrap();
    store
        .write_blocking(Priority::Bulk, |c| {
            insert_key(c, &K::active("k-list-1", "482913", &["101"]))?;
            let mut revoked = K::active("k-list-2", "555555", &["101"]);
            revoked.state = "revoked";
            insert_key(c, &revoked)?;
            Ok(())
        })
        .unwrap();

    // The writer (the "daemon") still has the database open.
    let out = keys_cmd(&fx);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line1 = stdout
        .lines()
        .find(|l| l.starts_with("k-list-1"))
        .expect("k-list-1 listed");
    assert!(line1.contains("active") && line1.contains("101"), "{line1}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("k-list-2") && l.contains("revoked"))
    );
    assert!(
        stdout.contains("2 keys: 0 pre_issued, 1 active, 1 revoked, 0 expired"),
        "{stdout}"
    );

    let tag = pin_tag(&pin_keys()[0].secret, b"482913");
    let hex: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    for secret in [
        b64u_encode(&tag),
        hex,
        "482913".to_owned(),
        "Guest Name".to_owned(),
    ] {
        assert!(
            !stdout.contains(&secret),
            "the listing leaks a tag, PIN or name"
        );
    }
    store.close();
}

#[test]
fn keys_without_a_database_says_so_and_creates_nothing() {
    let fx = Fixture::new();
    let out = keys_cmd(&fx);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no database at"));
    assert!(!fx.path("data").join("lockhub.db").exists());
}

#[test]
fn keys_with_a_bad_config_exits_2_with_the_position() {
    let fx = Fixture::with_hub_edits(&[("index = 0", "index = 16")]);
    let out = keys_cmd(&fx);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("hub.toml:24:"));
}

#[test]
fn keys_json_has_the_documented_fields_and_no_tags() {
    let fx = Fixture::new();
    let config = lockhub::config::load(&fx.hub()).expect("valid fixture");
    let store = Store::open(&config.database_path(), &config.policy).unwrap();
    store
        .write_blocking(Priority::Bulk, |c| {
            insert_key(c, &K::active("k-json-1", "482913", &["101"]))?;
            Ok(())
        })
        .unwrap();
    store.close();
    let out = Command::new(env!("CARGO_BIN_EXE_lockhub"))
        .args(["keys", "--json", "--config"])
        .arg(fx.hub())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let k = &v["keys"][0];
    let mut fields: Vec<&str> = k.as_object().unwrap().keys().map(String::as_str).collect();
    fields.sort_unstable();
    // docs/protocol/config.md, `keys --json`.
    assert_eq!(
        fields,
        [
            "check_in_id",
            "doors",
            "key_id",
            "reservation_id",
            "state",
            "valid_from",
            "valid_until",
            "version"
        ]
    );
    assert_eq!(k["key_id"], "k-json-1");
    assert_eq!(k["state"], "active");
    assert_eq!(k["doors"], serde_json::json!(["101"]));
    assert!(k["valid_from"].as_str().unwrap().ends_with('Z'), "{k}");
    assert_eq!(v["counts"]["active"], 1);
    let tag = pin_tag(&pin_keys()[0].secret, b"482913");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains(&b64u_encode(&tag)) && !text.contains("482913"));
}
