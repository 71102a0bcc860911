//! `lockhub status` through the real binary, on a database with rows in it,
//! and while another connection holds the write lock (as the daemon does).

use lockhub::config::Policy;
use lockhub::store::alerts;
use lockhub::store::links::{self, LinkState};
use lockhub::store::outbox::{self, Topic};
use lockhub::store::{Priority, Store};
use lockhub_proto::outputs::Condition;
use lockhub_proto::time::Timestamp;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use testkit::db::{KeyRow, insert_row};

const BIN: &str = env!("CARGO_BIN_EXE_lockhub");

/// A hub.toml naming two serial ports (only [hub] and [[serial]] are read).
fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("hub.toml");
    std::fs::write(
        &path,
        r#"[hub]
site_id = "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10"
hub_id = "hub-lobby-1"
data_dir = "data"

[secrets]
file = "/nonexistent/secrets.toml"   # status never reads it

[[serial]]
name = "board-a"
port = "/dev/ttyAMA0"

[[serial]]
name = "board-b"
port = "/dev/serial/by-id/usb-lockhub_board-b-if00"
"#,
    )
    .unwrap();
    path
}

fn status(config: &Path, json: bool) -> Output {
    let mut c = Command::new(BIN);
    c.arg("status").arg("--config").arg(config);
    if json {
        c.arg("--json");
    }
    c.output().unwrap()
}

/// An hour ago, in seconds: the rows are in the past, the clock is trusted.
fn t_secs() -> i64 {
    Timestamp::now_system().0 / 1_000_000 - 3600
}

/// Fills a fresh database: keys in three states, a tombstone, a watermark,
/// unsent outbox rows (and the alerts' own), two alerts (one cleared), one link up with a board.
fn populate(dir: &Path, secs: i64) -> Store {
    let store = Store::open(&dir.join("data/lockhub.db"), &Policy::default()).unwrap();
    let t = Timestamp::from_secs(secs);
    store
        .write_blocking(Priority::Bulk, move |c| {
            for (id, state, check_in, reason) in [
                ("k-1", "active", Some("c-1"), None),
                ("k-2", "active", Some("c-2"), None),
                ("k-3", "pre_issued", None, None),
                ("k-4", "revoked", None, Some("superseded")),
            ] {
                insert_row(
                    c,
                    &KeyRow {
                        id,
                        state,
                        check_in_id: check_in,
                        reservation_id: None,
                        valid_from: t,
                        valid_until: t.saturating_add_days(2),
                        pin_tag: [id.as_bytes()[2]; 32],
                        pin_key_id: "k1",
                        holder_ref: None,
                        holder_name: None,
                        revoke_reason: reason,
                        updated_at: t,
                        doors: &[],
                    },
                )?;
            }
            c.execute(
                "INSERT INTO key_tombstones (key_id, reason, event_id, created_at)
                 VALUES ('k-gone', 'revoked', '00000000-0000-4000-8000-000000000001', ?1)",
                [t.0],
            )?;
            c.execute(
                "UPDATE seq_state SET watermark = 17, head_seq = 20, last_sign_of_life = ?1",
                [t.0],
            )?;
            c.execute("INSERT INTO seq_seen (seq) VALUES (19)", [])?;
            c.execute("UPDATE time_floor SET floor = ?1", [t.0])?;
            outbox::enqueue(c, Topic::Results, b"{}", None, t.saturating_add_secs(-30))?;
            outbox::enqueue(c, Topic::Sync, b"{}", None, t)?;
            alerts::raise(c, Condition::BoardOffline, "board-b", 1, t)?;
            alerts::raise(c, Condition::KeypadLockout, "101", 1, t)?;
            alerts::clear(c, Condition::KeypadLockout, "101", t)?;
            links::hello(c, "board-a", 3, 1, 4, t)?;
            links::set_state(c, "board-b", LinkState::Absent, t)?;
            links::set_state(c, "board-old", LinkState::Down, t)?;
            links::set_bad_frames(c, "board-a", 7, t)?;
            links::set_bad_frames(c, "board-b", 0, t)?;
            let seal = |serial: &str, sealed, since| links::SealRow {
                serial: serial.into(),
                sealed,
                session_since: since,
                bad_tag: 0,
                replayed: 0,
                plain: 0,
                bad_handshake: 0,
                forged_hello: 0,
                other: 0,
            };
            links::set_seal(
                c,
                &links::SealRow {
                    bad_tag: 2,
                    replayed: 1,
                    ..seal("board-a", true, Some(t.saturating_add_secs(-90)))
                },
                t,
            )?;
            links::set_seal(
                c,
                &links::SealRow {
                    bad_handshake: 4,
                    ..seal("board-b", true, None)
                },
                t,
            )?;
            links::set_seal(c, &seal("board-old", false, None), t)?;
            Ok(())
        })
        .unwrap();
    store
}

#[test]
fn status_shows_every_part_in_text_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let t = t_secs();
    let _store = populate(dir.path(), t);

    let out = status(&config, false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "hub-lobby-1",
        "active 2, pre_issued 1, revoked 1, expired 0, used_up 0, tombstones 1",
        "watermark 17, cloud head 20 (1 seen above a gap)",
        "outbox   5 unsent, oldest",
        "(60 min ago)",
        "board-a up on /dev/ttyAMA0, board 3, firmware 1.4",
        "board-b absent",
        "board-old down",
        "(not in hub.toml)",
        "board_offline board-b x1",
        "clock    trusted",
        "zone     UTC: ",
        "link     board-a: 7 bad frames dropped",
        "link     board-a: sealed, session for ",
        "s, dropped: bad_tag 2, replayed 1",
        "link     board-b: sealed, NO SESSION, dropped: bad_handshake 4",
        "link     board-old: PLAIN (insecure_plaintext: not sealed)",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    assert!(
        !text.contains("keypad_lockout"),
        "a cleared alert is not open"
    );
    assert!(
        !text.contains("board-b: 0 bad frames"),
        "a clean link says nothing"
    );

    let out = status(&config, true);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json parses");
    assert_eq!(v["hub_id"], "hub-lobby-1");
    assert_eq!(v["keys"]["active"], 2);
    assert_eq!(v["keys"]["tombstones"], 1);
    assert_eq!(v["sync"]["watermark"], 17);
    assert_eq!(v["sync"]["head_seq"], 20);
    assert_eq!(
        v["sync"]["last_sign_of_life"],
        Timestamp::from_secs(t).to_rfc3339()
    );
    // Two rows, plus the alerts' raised, raised, cleared messages.
    assert_eq!(v["outbox"]["depth"], 5);
    assert_eq!(
        v["outbox"]["oldest_unsent"],
        Timestamp::from_secs(t - 30).to_rfc3339()
    );
    assert_eq!(v["alerts"].as_array().unwrap().len(), 1);
    assert_eq!(v["alerts"][0]["condition"], "board_offline");
    let links = v["links"].as_array().unwrap();
    assert_eq!(links.len(), 3);
    assert_eq!(links[0]["serial"], "board-a");
    assert_eq!(links[0]["state"], "up");
    assert_eq!(links[0]["board_id"], 3);
    assert_eq!(links[0]["firmware"], "1.4");
    assert_eq!(links[0]["bad_frames"], 7);
    assert_eq!(links[0]["seal"]["sealed"], true);
    assert_eq!(
        links[0]["seal"]["session_since"],
        Timestamp::from_secs(t - 90).to_rfc3339()
    );
    assert!(links[0]["seal"]["session_age_s"].as_i64().unwrap() >= 90);
    assert_eq!(
        links[0]["seal"]["dropped"],
        serde_json::json!({"bad_tag": 2, "replayed": 1})
    );
    assert_eq!(links[1]["seal"]["session_since"], serde_json::Value::Null);
    assert_eq!(links[2]["seal"]["sealed"], false);
    assert_eq!(links[1]["state"], "absent");
    assert_eq!(links[1]["bad_frames"], 0);
    assert_eq!(links[2]["configured"], false);
    assert_eq!(
        links[2]["bad_frames"],
        serde_json::Value::Null,
        "never reported"
    );
    assert_eq!(v["clock"]["floor"], Timestamp::from_secs(t).to_rfc3339());
    assert_eq!(v["clock"]["trusted"], true);
    assert_eq!(v["clock"]["timezone"], "UTC");
    assert!(
        v["clock"]["local"].as_str().unwrap().ends_with("+00:00"),
        "{}",
        v["clock"]
    );
    assert_eq!(v["keys"]["used_up"], 0);
    assert_eq!(v["schema_version"], v["schema_known"]);
}

#[test]
fn status_shows_the_hubs_time_zone_and_the_effective_time_on_its_wall_clock() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "data_dir = \"data\"\n",
        "data_dir = \"data\"\ntimezone = \"Australia/Lord_Howe\"\n",
    );
    std::fs::write(&config, text).unwrap();
    // 2026-12-04T08:00:00Z; Lord Howe is UTC+11 in its summer.
    let t = 1_796_371_200;
    let _store = populate(dir.path(), t);
    let out = status(&config, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["clock"]["timezone"], "Australia/Lord_Howe");
    // The effective time is at least the floor (t); it is shown in the zone.
    let local = v["clock"]["local"].as_str().unwrap();
    assert!(local.ends_with("+11:00"), "{local}");
    let back = Timestamp::parse_rfc3339(local).unwrap();
    let effective = Timestamp::parse_rfc3339(v["clock"]["effective"].as_str().unwrap()).unwrap();
    assert_eq!(back.0 / 1_000_000, effective.0 / 1_000_000);
    let out = status(&config, false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("zone     Australia/Lord_Howe: "), "{text}");
}

#[test]
fn status_answers_while_another_connection_holds_a_write_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let store = populate(dir.path(), t_secs());
    let db = store.path().to_owned();

    // Hold the write lock, with an uncommitted change, as the writer does mid-group.
    let writer = rusqlite::Connection::open(&db).unwrap();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    writer
        .execute("UPDATE seq_state SET watermark = 99", [])
        .unwrap();

    let started = Instant::now();
    let out = status(&config, true);
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        took < Duration::from_secs(2),
        "status waited {took:?} on the writer"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["sync"]["watermark"], 17, "the last committed snapshot");
    writer.execute_batch("COMMIT").unwrap();

    let v: serde_json::Value = serde_json::from_slice(&status(&config, true).stdout).unwrap();
    assert_eq!(v["sync"]["watermark"], 99);
}

#[test]
fn status_changes_nothing_and_a_clock_behind_the_floor_is_untrusted() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let store = populate(dir.path(), t_secs());
    // A floor far in the future: the system clock is behind it.
    store
        .write_blocking(Priority::Bulk, |c| {
            c.execute("UPDATE time_floor SET floor = ?1", [i64::MAX / 4])?;
            Ok(())
        })
        .unwrap();
    let db = store.path().to_owned();
    store.close();
    let before = std::fs::read(&db).unwrap();
    let out = status(&config, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["clock"]["trusted"], false);
    assert_eq!(v["clock"]["effective"], v["clock"]["floor"]);
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "status wrote to the database"
    );
}

#[test]
fn a_cloud_that_sent_no_checkpoint_reads_as_no_checkpoint_yet_not_as_a_head_of_0() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    // Events 1..=3 applied, no checkpoint ever.
    let store = Store::open(&dir.path().join("data/lockhub.db"), &Policy::default()).unwrap();
    store
        .write_blocking(Priority::Bulk, |c| {
            c.execute("UPDATE seq_state SET watermark = 3", [])?;
            Ok(())
        })
        .unwrap();
    store.close();
    let text = String::from_utf8(status(&config, false).stdout).unwrap();
    assert!(
        text.contains("sync     watermark 3, no checkpoint yet, last sign of life"),
        "{text}"
    );
    assert!(!text.contains("cloud head"), "{text}");
    let v: serde_json::Value = serde_json::from_slice(&status(&config, true).stdout).unwrap();
    assert_eq!(v["sync"]["head_seq"], 0, "the JSON keeps the figure");
}

#[test]
fn an_old_schema_shows_links_as_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let store = populate(dir.path(), t_secs());
    let db = store.path().to_owned();
    store.close();
    let c = rusqlite::Connection::open(&db).unwrap();
    c.execute_batch("DROP TABLE links; PRAGMA user_version = 1;")
        .unwrap();
    drop(c);
    let out = status(&config, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["links"][0]["state"], "unknown");
    assert_eq!(v["links"][1]["state"], "unknown");
}

#[test]
fn missing_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = status(&dir.path().join("nope.toml"), false);
    assert_eq!(out.status.code(), Some(2));
    let config = write_config(dir.path());
    let out = status(&config, false);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no database at"), "{err}");
    assert!(!dir.path().join("data").exists(), "status created nothing");
}

#[test]
fn a_bad_config_is_reported_at_its_line_and_column_by_status_and_alert_clear() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hub.toml");
    std::fs::write(
        &config,
        "[hub]\nsite_id = \"x\"\nhub_id = \"H\"\ndata_dir = 5\n",
    )
    .unwrap();
    let out = status(&config, false);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hub.toml:4:12: "), "{err}");
    let out = Command::new(BIN)
        .args(["alert", "clear", "tamper", "board-a", "--reason", "checked"])
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hub.toml:4:12: "), "{err}");
}

#[test]
fn global_log_flags_are_accepted_anywhere_and_a_bad_filter_is_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let _store = populate(dir.path(), t_secs());
    let out = Command::new(BIN)
        .args([
            "status",
            "--json",
            "--log-format",
            "json",
            "--log-level",
            "debug",
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("stdout is only the JSON");
    let out = Command::new(BIN)
        .args(["--log-level", "lockhub=nonsense", "status", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid log filter"));
}

#[test]
fn status_json_carries_the_health_figures_the_retained_status_publishes() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let t = t_secs();
    let store = populate(dir.path(), t);
    let started = Timestamp::from_secs(t + 600);
    store
        .write_blocking(Priority::Bulk, move |c| {
            lockhub::store::runtime::record_start(c, started)?;
            lockhub::store::runtime::record_broker(
                c,
                lockhub::store::runtime::BrokerState::Denied,
                started,
            )
        })
        .unwrap();

    let out = status(&config, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let h = &v["health"];
    // The same figures as the rest of the status, from the same snapshot.
    assert_eq!(h["watermark"], 17);
    assert_eq!(h["head_seq"], 20);
    assert_eq!(h["outbox_depth"], v["outbox"]["depth"]);
    assert_eq!(h["outbox_oldest_age_s"], v["outbox"]["oldest_unsent_age_s"]);
    assert_eq!(h["alerts"], serde_json::json!({"board_offline": 1}));
    assert_eq!(
        h["links"],
        serde_json::json!({"board-a": "up", "board-b": "absent", "board-old": "down", "broker": "denied"})
    );
    assert_eq!(h["clock_trusted"], true);
    assert_eq!(h["started_at"], started.to_rfc3339());
    assert_eq!(h["daemon_version"], env!("CARGO_PKG_VERSION"));
    let up = h["uptime_s"].as_i64().unwrap();
    assert!((3000..3100).contains(&up), "started 50 min ago: {up}");
    let db_bytes = std::fs::metadata(store.path()).unwrap().len();
    assert_eq!(h["db_bytes"], db_bytes);
    assert!(
        h["wal_bytes"].as_u64().unwrap() > 0,
        "the WAL holds the writes"
    );
    assert!(h["disk_free_bytes"].as_u64().unwrap() > 0);

    let text = String::from_utf8_lossy(&status(&config, false).stdout).into_owned();
    assert!(text.contains("broker denied"), "{text}");
    assert!(text.contains("(up 50 min)"), "{text}");
    assert!(text.contains("storage  database "), "{text}");
}
