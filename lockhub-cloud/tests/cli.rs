//! The binary as operators and booking systems run it: idempotent issuance
//! under 100 concurrent processes, a crash between storing and publishing,
//! conflicts, and exit code 2 with a clear message for each input mistake.

mod common;

use common::*;
use std::process::Stdio;
use testkit::broker::Mosquitto;

#[test]
fn a_hundred_concurrent_issue_processes_for_one_check_in_make_one_key_and_one_event() {
    let cloud = Cloud::new();
    let pin = cloud.pin_file("482913");
    let args = cloud.issue_args("c-1", &pin, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let children: Vec<_> = (0..100)
        .map(|_| {
            cloud
                .command(&args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    let outs: Vec<serde_json::Value> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            json(&String::from_utf8(out.stdout).unwrap())
        })
        .collect();
    let fresh: Vec<_> = outs.iter().filter(|o| o["replayed"] == false).collect();
    assert_eq!(fresh.len(), 1, "exactly one process signed");
    for o in &outs {
        assert_eq!(o["key_id"], fresh[0]["key_id"]);
        assert_eq!(o["event_id"], fresh[0]["event_id"]);
        assert_eq!(o["seq"], 1);
    }
    assert_eq!(cloud.sql::<i64>("SELECT count(*) FROM events"), 1);
    assert_eq!(cloud.sql::<i64>("SELECT count(*) FROM keys"), 1);
    assert_eq!(cloud.sql::<i64>("SELECT next_seq FROM hubs"), 2);
}

#[test]
fn the_same_idempotency_key_with_another_pin_or_window_is_refused_and_changes_nothing() {
    let cloud = Cloud::new();
    let pin = cloud.pin_file("482913");
    let first = cloud.issue_args("c-1", &pin, &[]);
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    let stored = json(&cloud.ok(&first));
    let events_before = cloud.events();

    let other_pin = cloud.pin_file("482914");
    let other_window = cloud.issue_args("c-1", &pin, &["--valid-from", "2098-01-01T00:00:00Z"]);
    let other_door = cloud.issue_args("c-1", &pin, &["--door", "102"]);
    for args in [
        cloud.issue_args("c-1", &other_pin, &[]),
        other_window,
        other_door,
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = cloud.run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("idempotency key \"check-in:c-1\""), "{err}");
        assert!(!err.contains("48291"), "the PIN is never printed: {err}");
        assert_eq!(cloud.events(), events_before, "nothing changed");
        assert_eq!(cloud.sql::<i64>("SELECT count(*) FROM keys"), 1);
    }
    // The same request again is the stored result.
    let again = json(&cloud.ok(&first));
    assert_eq!(again["replayed"], true);
    assert_eq!(
        (&again["key_id"], &again["seq"]),
        (&stored["key_id"], &stored["seq"])
    );
}

#[test]
fn a_second_check_in_key_under_another_idempotency_key_is_refused_by_the_index() {
    let cloud = Cloud::new();
    let pin = cloud.pin_file("482913");
    let args = cloud.issue_args("c-1", &pin, &[]);
    cloud.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let args = cloud.issue_args("c-1", &pin, &["--idempotency-key", "retry-2"]);
    let out = cloud.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("already has an active key"));
    assert_eq!(cloud.sql::<i64>("SELECT count(*) FROM events"), 1);
    assert_eq!(
        cloud.sql::<i64>("SELECT next_seq FROM hubs"),
        2,
        "no seq spent"
    );
}

#[test]
fn each_input_mistake_exits_2_with_a_message_naming_it_and_signs_nothing() {
    let cloud = Cloud::new();
    let pin = cloud.pin_file("482913");
    let short = cloud.pin_file("12");
    let letters = cloud.pin_file("12ab56");
    let p = pin.to_str().unwrap();
    let h = hub_ref("hub-1");
    fn with<'a>(h: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["issue", h, "--check-in", "c-1", "--valid-until", UNTIL];
        v.extend_from_slice(extra);
        v
    }
    let unknown_hub = hub_ref("hub-9");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "issue",
                &unknown_hub,
                "--check-in",
                "c",
                "--door",
                "101",
                "--pin-file",
                p,
                "--valid-until",
                UNTIL,
            ],
            "unknown hub",
        ),
        (
            with(&h, &["--door", "999", "--pin-file", p]),
            "has no door \"999\"",
        ),
        (
            with(
                &h,
                &["--door", "101", "--pin-file", short.to_str().unwrap()],
            ),
            "4 to 12 digits",
        ),
        (
            with(
                &h,
                &["--door", "101", "--pin-file", letters.to_str().unwrap()],
            ),
            "4 to 12 digits",
        ),
        (
            with(
                &h,
                &[
                    "--door",
                    "101",
                    "--pin-file",
                    p,
                    "--valid-from",
                    "2099-02-01T00:00:00Z",
                ],
            ),
            "ends (2099-01-01",
        ),
        (
            with(
                &h,
                &[
                    "--door",
                    "101",
                    "--pin-file",
                    p,
                    "--schedule",
                    "weekdays 9-17",
                ],
            ),
            "'weekdays' is not a day",
        ),
        (
            with(
                &h,
                &[
                    "--door",
                    "101",
                    "--pin-file",
                    p,
                    "--schedule",
                    "mon-fri 17:30-09:00",
                ],
            ),
            "must end after it starts",
        ),
        (
            with(&h, &["--door", "101", "--pin-file", p, "--uses", "0"]),
            "--uses 0: use 1..=100000",
        ),
        (
            vec![
                "issue",
                &h,
                "--check-in",
                "c",
                "--door",
                "101",
                "--pin-file",
                p,
                "--valid-until",
                "2000-01-01T00:00:00Z",
            ],
            "before it starts",
        ),
        (
            vec![
                "issue",
                &h,
                "--check-in",
                "c",
                "--door",
                "101",
                "--pin-file",
                p,
                "--valid-from",
                "1999-01-01T00:00:00Z",
                "--valid-until",
                "2000-01-01T00:00:00Z",
            ],
            "already ended",
        ),
        (
            vec![
                "issue",
                &h,
                "--check-in",
                "c",
                "--door",
                "101",
                "--pin-file",
                p,
                "--valid-until",
                "next week",
            ],
            "not an RFC 3339 instant",
        ),
        (
            with(&h, &["--door", "101", "--pin-file", p, "--pin-key", "k9"]),
            "no PIN key \"k9\"",
        ),
        (
            with(
                &h,
                &["--door", "101", "--pin-file", p, "--key-id", "bad key"],
            ),
            "key id",
        ),
        (
            vec![
                "issue",
                "not-a-site/hub-1",
                "--check-in",
                "c",
                "--door",
                "101",
                "--pin-file",
                p,
                "--valid-until",
                UNTIL,
            ],
            "is not SITE/HUB",
        ),
        (
            vec![
                "checkin",
                &h,
                "--check-in",
                "c",
                "--door",
                "101",
                "--pin-file",
                p,
                "--valid-until",
                UNTIL,
            ],
            "checkin needs --reservation",
        ),
        (vec!["revoke", &unknown_hub, "k-1"], "unknown hub"),
        (
            vec!["hub", "add", &h, "--door", "101"],
            "already registered",
        ),
        (vec!["hub", "set-key", &h, "AAAA"], "public key"),
        (vec!["init"], "already initialised"),
        (vec!["serve"], "serve needs --broker"),
        (vec!["issue", &h], "required"),
    ];
    for (args, message) in cases {
        let out = cloud.run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(message),
            "{args:?}: {err:?} should say {message:?}"
        );
        assert!(
            !err.contains("482913"),
            "{args:?}: the PIN is never printed"
        );
    }
    assert!(cloud.events().is_empty(), "nothing was signed");
    // A missing database is the machine's problem, not a bad flag.
    let out = cloud
        .command(&["hubs"])
        .env("LOCKHUB_CLOUD_DB", cloud.dir.path().join("none.db"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not initialised"));
}

#[test]
fn a_kill_between_storing_and_publishing_then_a_retry_publishes_the_stored_event_once() {
    let broker = Mosquitto::start();
    let cloud = Cloud::new();
    let pin = cloud.pin_file("482913");
    let args = cloud.issue_args("c-1", &pin, &["--broker", &broker.url()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let crashed = cloud
        .command(&args)
        .env("LOCKHUB_CLOUD_FAULT", "after_commit")
        .output()
        .unwrap();
    assert!(
        !crashed.status.success(),
        "the fault hook aborts the process"
    );
    let stored = cloud.events();
    assert_eq!(stored.len(), 1);
    assert!(!stored[0].3, "committed, not published");

    // A later issue for another guest must not skip or reuse a seq either.
    let retry = json(&cloud.ok(&args));
    assert_eq!(retry["replayed"], true);
    assert_eq!(retry["event_id"], stored[0].1.as_str());
    assert_eq!(retry["published"], true);
    let other = cloud.issue_args("c-2", &pin, &["--broker", &broker.url()]);
    let other = json(&cloud.ok(&other.iter().map(String::as_str).collect::<Vec<_>>()));
    assert_eq!(other["seq"], 2);
    let events = cloud.events();
    assert_eq!(
        events.iter().map(|e| (e.0, e.3)).collect::<Vec<_>>(),
        vec![(1, true), (2, true)],
        "seqs 1 and 2, both published, none twice"
    );
    assert_eq!(
        events[0].1, stored[0].1,
        "the stored event, never a second one"
    );
    assert_eq!(events[0].2, stored[0].2, "byte for byte");
}

#[test]
fn hub_add_takes_a_hub_from_a_bundle_template_and_writes_its_provisioning_bundle_0600() {
    use std::os::unix::fs::PermissionsExt;
    let cloud = Cloud::new();
    let template = cloud.dir.path().join("template.json");
    std::fs::write(
        &template,
        format!(
            r#"{{"v":1,"site_id":"{SITE}","hub_id":"hub-2","mqtt":{{"url":"mqtt://10.0.0.1:1883"}},"trust":[],
               "serials":[{{"name":"board-a","port":"/dev/ttyAMA0"}}],
               "doors":[{{"name":"201","serial":"board-a","index":0}},{{"name":"202","serial":"board-a","index":1}}]}}"#
        ),
    )
    .unwrap();
    let out = cloud.dir.path().join("hub-2.json");
    let (t, o) = (template.to_str().unwrap(), out.to_str().unwrap());
    cloud.ok(&["hub", "add", "--bundle", t, "--write-bundle", o]);
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let b = lockhub_proto::bundle::Bundle::parse(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!((b.site_id.as_str(), b.hub_id.as_str()), (SITE, "hub-2"));
    assert_eq!(b.doors.len(), 2, "the template's hardware is kept");
    assert_eq!(b.mqtt.url, "mqtt://10.0.0.1:1883");
    let ring = cloud.ok(&["--json", "signer", "list"]);
    assert_eq!(b.trust.len(), 1);
    assert_eq!(json(&ring)["public_key"], b.trust[0].public_key.as_str());
    assert_eq!(b.pin_keys.len(), 1);
    let stored: Vec<u8> = cloud.sql("SELECT secret FROM pin_keys WHERE hub_id = 'hub-2'");
    assert_eq!(
        lockhub_proto::crypto::b64u_decode_32(&b.pin_keys[0].secret)
            .unwrap()
            .to_vec(),
        stored,
        "the hub gets the PIN key the cloud tags with"
    );
    // The doors came from the template: a grant for one of them is signed.
    let pin = cloud.pin_file("482913");
    cloud.ok(&[
        "issue",
        &hub_ref("hub-2"),
        "--check-in",
        "c-1",
        "--door",
        "202",
        "--pin-file",
        pin.to_str().unwrap(),
        "--valid-until",
        UNTIL,
    ]);
    // Never over an existing file, and a bundle needs a broker.
    let again = cloud.run(&[
        "hub",
        "add",
        &hub_ref("hub-3"),
        "--door",
        "1",
        "--write-bundle",
        o,
    ]);
    assert_eq!(again.status.code(), Some(2));
    let no_url = cloud.dir.path().join("hub-3.json");
    let out = cloud.run(&[
        "hub",
        "add",
        &hub_ref("hub-3"),
        "--door",
        "1",
        "--write-bundle",
        no_url.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mqtt-url"));
    assert!(!no_url.exists());
    assert_eq!(
        cloud.sql::<i64>("SELECT count(*) FROM hubs WHERE hub_id = 'hub-3'"),
        0
    );
}

#[test]
fn a_hub_public_key_that_starts_with_a_hyphen_is_taken_as_a_key_not_a_flag() {
    // Base64url uses '-': one key in 64 starts with it.
    let cloud = Cloud::new();
    let key = (0u8..=255)
        .map(|n| ed25519_dalek::SigningKey::from_bytes(&[n; 32]).verifying_key())
        .map(|k| lockhub_proto::crypto::b64u_encode(k.as_bytes()))
        .find(|k| k.starts_with('-'))
        .expect("a key starting with '-'");
    cloud.ok(&["hub", "set-key", &hub_ref("hub-1"), &key]);
    cloud.ok(&[
        "hub",
        "add",
        &hub_ref("hub-2"),
        "--door",
        "1",
        "--public-key",
        &key,
    ]);
    assert_eq!(
        cloud.sql::<i64>("SELECT count(*) FROM hubs WHERE public_key IS NOT NULL"),
        2
    );
}
