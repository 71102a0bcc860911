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
            "max_uses",
            "reservation_id",
            "schedule",
            "state",
            "use_count",
            "valid_from",
            "valid_until",
            "version"
        ]
    );
    assert_eq!(k["schedule"], serde_json::Value::Null);
    assert_eq!(k["max_uses"], serde_json::Value::Null);
    assert_eq!(k["use_count"], 0);
    assert_eq!(v["timezone"], "UTC");
    assert_eq!(v["counts"]["used_up"], 0);
    assert_eq!(k["key_id"], "k-json-1");
    assert_eq!(k["state"], "active");
    assert_eq!(k["doors"], serde_json::json!(["101"]));
    assert!(k["valid_from"].as_str().unwrap().ends_with('Z'), "{k}");
    assert_eq!(v["counts"]["active"], 1);
    let tag = pin_tag(&pin_keys()[0].secret, b"482913");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains(&b64u_encode(&tag)) && !text.contains("482913"));
}

#[test]
fn keys_shows_each_schedule_in_the_hubs_zone_and_uses_taken_of_the_limit() {
    let fx = Fixture::with_hub_edits(&[(
        "data_dir = \"data\"\n",
        "data_dir = \"data\"\ntimezone = \"Europe/Berlin\"\n",
    )]);
    let config = lockhub::config::load(&fx.hub()).expect("valid fixture");
    let store = Store::open(&config.database_path(), &config.policy).unwrap();
    store
        .write_blocking(Priority::Bulk, |c| {
            insert_key(c, &K::active("k-sched", "482913", &["101"]))?;
            insert_key(c, &K::active("k-plain", "555555", &["101"]))?;
            // A later version brings the schedule and the limit; then one
            // entry takes a use.
            c.execute_batch(
                r#"UPDATE keys SET version = 2, max_uses = 5,
                       schedule = '[{"days":["mon","tue","wed","thu","fri"],"from":"09:00","until":"17:30"},{"days":["sat"],"from":"22:00","until":"24:00"}]'
                     WHERE key_id = 'k-sched';
                   UPDATE keys SET use_count = use_count + 1 WHERE key_id = 'k-sched';
                   UPDATE keys SET use_count = use_count + 1 WHERE key_id = 'k-plain';"#,
            )?;
            Ok(())
        })
        .unwrap();
    store.close();
    let out = keys_cmd(&fx);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let header = stdout.lines().next().unwrap();
    assert!(
        header.contains("USES") && header.contains("SCHEDULE"),
        "{stdout}"
    );
    let sched = stdout.lines().find(|l| l.starts_with("k-sched")).unwrap();
    assert!(
        sched.contains("1 of 5") && sched.ends_with("mon-fri 09:00-17:30; sat 22:00-24:00"),
        "{stdout}"
    );
    let plain = stdout.lines().find(|l| l.starts_with("k-plain")).unwrap();
    let tail: Vec<&str> = plain.split_whitespace().rev().take(2).collect();
    assert_eq!(tail, ["-", "1"], "{stdout}");
    assert!(
        stdout.contains("schedules are wall times in Europe/Berlin"),
        "{stdout}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_lockhub"))
        .args(["keys", "--json", "--config"])
        .arg(fx.hub())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["timezone"], "Europe/Berlin");
    let k = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key_id"] == "k-sched")
        .unwrap();
    assert_eq!(
        (k["use_count"].as_u64(), k["max_uses"].as_u64()),
        (Some(1), Some(5))
    );
    assert_eq!(
        k["schedule"][1],
        serde_json::json!({"days": ["sat"], "from": "22:00", "until": "24:00"})
    );
}
