//! The binary as operators and booking systems run it: idempotent issuance
//! under 100 concurrent processes, a crash between storing and publishing,
//! conflicts, and exit code 2 with a clear message for each input mistake;
//! a signer rotation as hubs see it (which key signs, what the ring and a
//! new bundle carry), `erase`, `batch` from a file, and `watch` in text.

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

/// The ring as `signer list --json` prints it, oldest first.
fn ring(cloud: &Cloud) -> Vec<serde_json::Value> {
    cloud
        .ok(&["--json", "signer", "list"])
        .lines()
        .map(json)
        .collect()
}

/// `hub add SITE/HUB --door 1 --write-bundle` now: the bundle's trust ring.
fn bundle_trust(cloud: &Cloud, hub: &str) -> Vec<lockhub_proto::bundle::TrustSpec> {
    let path = cloud.dir.path().join(format!("{hub}.json"));
    cloud.ok(&[
        "hub",
        "add",
        &hub_ref(hub),
        "--door",
        "1",
        "--mqtt-url",
        "mqtt://10.0.0.1:1883",
        "--write-bundle",
        path.to_str().unwrap(),
    ]);
    lockhub_proto::bundle::Bundle::parse(&std::fs::read_to_string(&path).unwrap())
        .unwrap()
        .trust
}

#[test]
fn after_signer_rotate_new_events_verify_only_under_the_new_key_and_the_ring_keeps_the_old_one_until_its_not_after()
 {
    use lockhub_proto::event::Reason;
    use lockhub_proto::time::Timestamp;
    let cloud = Cloud::new();
    let pin = cloud.pin_file("482913");
    let issue = |check_in: &str| {
        let args = cloud.issue_args(check_in, &pin, &[]);
        json(&cloud.ok(&args.iter().map(String::as_str).collect::<Vec<_>>()))
    };
    issue("c-1");
    let first = ring(&cloud);
    assert_eq!(first.len(), 1);
    let old = &first[0];
    assert_eq!(
        (&old["active"], &old["not_after"]),
        (&true.into(), &().into())
    );

    let before = Timestamp::now_system();
    let rotated = json(&cloud.ok(&["--json", "signer", "rotate", "--signer-id", "cloud-next"]));
    let after = Timestamp::now_system();
    assert_eq!(rotated["signer"], "cloud-next");
    assert_ne!(rotated["public_key"], old["public_key"], "a new key");
    let seed = cloud.dir.path().join("cloud.db.signers/cloud-next.key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&seed).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // The ring: the old signer retired with not_after = now + 30 days
    // (the default overlap), the new one active with none.
    let ring = ring(&cloud);
    assert_eq!(ring.len(), 2, "{ring:?}");
    assert_eq!(
        (&ring[0]["id"], &ring[0]["public_key"], &ring[0]["active"]),
        (&old["id"], &old["public_key"], &false.into())
    );
    let not_after = Timestamp::parse_rfc3339(ring[0]["not_after"].as_str().unwrap()).unwrap();
    assert!(
        before.saturating_add_days(30) <= not_after && not_after <= after.saturating_add_days(30),
        "{ring:?}"
    );
    assert_eq!(
        (&ring[1]["id"], &ring[1]["public_key"], &ring[1]["active"]),
        (&"cloud-next".into(), &rotated["public_key"], &true.into())
    );
    assert_eq!(ring[1]["not_after"], serde_json::Value::Null);

    // What is signed from now on is signed by the new signer, with the next seq.
    assert_eq!(issue("c-2")["seq"], 2);
    let events = cloud.events();
    assert_eq!(envelope_signer(&events[0].2), old["id"].as_str().unwrap());
    assert_eq!(envelope_signer(&events[1].2), "cloud-next");

    // A bundle written now carries both keys: the old one with its not_after.
    let trust = bundle_trust(&cloud, "hub-2");
    assert_eq!(
        trust
            .iter()
            .map(|t| (t.id.as_str(), t.public_key.as_str(), t.not_after.as_deref()))
            .collect::<Vec<_>>(),
        vec![
            (
                old["id"].as_str().unwrap(),
                old["public_key"].as_str().unwrap(),
                ring[0]["not_after"].as_str()
            ),
            ("cloud-next", rotated["public_key"].as_str().unwrap(), None),
        ]
    );
    // A hub with that ring takes both events; the new one only under the new key.
    let now = Timestamp::now_system();
    let new_event = verify(&events[1].2, &trust, now).expect("the new event verifies");
    assert_eq!(new_event.signer, "cloud-next");
    assert_eq!(new_event.header.seq, Some(2));
    let old_event = verify(&events[0].2, &trust, now).expect("the old event still verifies");
    assert_eq!(old_event.signer, old["id"].as_str().unwrap());
    assert_eq!(
        verify(&events[1].2, &trust[..1], now).unwrap_err().reason,
        Reason::UnknownSigner,
        "a hub that only has the old ring refuses what the new key signs"
    );
    // After its not_after, the hub no longer takes the old signer's events.
    let later = Timestamp(not_after.0 + 1);
    assert_eq!(
        verify(&events[0].2, &trust, later).unwrap_err().reason,
        Reason::UnknownSigner
    );
    assert!(verify(&events[1].2, &trust, later).is_ok());
}

#[test]
fn a_signer_past_its_not_after_is_left_out_of_new_bundles_and_an_id_already_in_the_ring_is_refused()
{
    let cloud = Cloud::new();
    let first = ring(&cloud)[0].clone();
    cloud.ok(&["signer", "rotate", "--signer-id", "cloud-b"]);
    // cloud-b retires at once: its not_after is the rotation's instant.
    cloud.ok(&[
        "signer",
        "rotate",
        "--signer-id",
        "cloud-c",
        "--overlap-days",
        "0",
    ]);
    let ring_now = ring(&cloud);
    assert_eq!(
        ring_now
            .iter()
            .map(|s| (s["id"].as_str().unwrap(), s["active"].as_bool().unwrap()))
            .collect::<Vec<_>>(),
        vec![
            (first["id"].as_str().unwrap(), false),
            ("cloud-b", false),
            ("cloud-c", true)
        ]
    );
    assert_ne!(ring_now[1]["not_after"], serde_json::Value::Null);
    let trust = bundle_trust(&cloud, "hub-2");
    assert_eq!(
        trust.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(),
        vec![first["id"].as_str().unwrap(), "cloud-c"],
        "cloud-b is past its not_after"
    );

    // Rotating to an id the ring has (the default, cloud-YYYY-MM-DD, on
    // the day of init) exits 2 and changes nothing.
    for id in [first["id"].as_str().unwrap(), "cloud-b", "bad id"] {
        let out = cloud.run(&["signer", "rotate", "--signer-id", id]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{id}: {err}");
        assert!(err.contains(&format!("{id:?}")), "{err}");
        assert_eq!(ring(&cloud), ring_now, "the ring is unchanged");
    }
    // cloud-c still signs.
    let pin = cloud.pin_file("482913");
    let args = cloud.issue_args("c-1", &pin, &[]);
    cloud.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(envelope_signer(&cloud.events()[0].2), "cloud-c");
}

#[test]
fn erase_signs_a_guest_erased_event_for_the_holder_with_the_next_seq() {
    let cloud = Cloud::new();
    let pin = cloud.pin_file("482913");
    let args = cloud.issue_args("c-1", &pin, &["--holder-ref", "g-17"]);
    cloud.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());

    let out = json(&cloud.ok(&["--json", "erase", &hub_ref("hub-1"), "g-17"]));
    assert_eq!(out["seq"], 2);
    assert_eq!(out["replayed"], false);
    assert_eq!(out["published"], false, "no broker: stored for serve");
    let events = cloud.events();
    assert_eq!(events.len(), 2);
    assert_eq!(
        (events[1].0, events[1].1.as_str()),
        (2, out["event_id"].as_str().unwrap())
    );
    let body = verified_body(&cloud, &events[1].2);
    assert_eq!(body["type"], "guest.erased");
    assert_eq!(body["holder_ref"], "g-17");
    assert_eq!(body["seq"], 2);
    assert_eq!(body["event_id"], out["event_id"]);
    assert_eq!(cloud.sql::<i64>("SELECT next_seq FROM hubs"), 3);
    // In text, the line names the hub, the seq and the event.
    let text = cloud.ok(&["erase", &hub_ref("hub-1"), "g-18"]);
    assert!(
        text.starts_with(&format!("erased on {}: seq 3 event ", hub_ref("hub-1"))),
        "{text}"
    );
}

#[test]
fn erase_with_a_bad_holder_ref_or_hub_exits_2_naming_it_and_spends_no_seq() {
    let cloud = Cloud::new();
    let h = hub_ref("hub-1");
    let long = "g".repeat(65);
    let unknown = hub_ref("hub-9");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["erase", &h, "g 17"], "holder ref \"g 17\""),
        (vec!["erase", &h, &long], "use 1..=64"),
        (vec!["erase", &h, "g/17"], "holder ref \"g/17\""),
        (vec!["erase", &unknown, "g-17"], "unknown hub"),
        (vec!["erase", "not-a-site/hub-1", "g-17"], "is not SITE/HUB"),
        (vec!["erase", &h], "required"),
    ];
    for (args, message) in cases {
        let out = cloud.run(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(message),
            "{args:?}: {err:?} should say {message:?}"
        );
    }
    assert!(cloud.events().is_empty(), "nothing was signed");
    assert_eq!(
        cloud.sql::<i64>("SELECT next_seq FROM hubs"),
        1,
        "no seq spent"
    );
    let out = json(&cloud.ok(&["--json", "erase", &h, "g-17"]));
    assert_eq!(out["seq"], 1, "the first erase takes seq 1");
}

/// A batch file in the folder of `cloud`.
fn batch_file(cloud: &Cloud, name: &str, text: &str) -> String {
    let p = cloud.dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_owned()
}

#[test]
fn a_batch_file_is_one_event_with_the_next_seq_and_a_retry_with_its_idempotency_key_is_the_stored_result()
 {
    let cloud = Cloud::new();
    let pin = cloud.pin_file("482913");
    let args = cloud.issue_args("c-1", &pin, &["--key-id", "k-old"]);
    cloud.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let items = format!(
        r#"[
  {{"type": "issue", "check_in": "c-7", "doors": ["101"], "pin": "482913",
   "valid_until": "{UNTIL}", "holder_ref": "g-7"}},
  {{"type": "issue", "reservation": "r-9", "doors": ["102"], "pin": "551203",
   "valid_from": "2098-12-12T15:00:00Z", "valid_until": "{UNTIL}"}},
  {{"type": "revoke", "key_id": "k-old", "reason": "checked_out"}},
  {{"type": "erase", "holder_ref": "g-17"}}
]"#
    );
    let file = batch_file(&cloud, "batch.json", &items);
    let h = hub_ref("hub-1");
    let args = [
        "--json",
        "batch",
        &h,
        "--file",
        &file,
        "--idempotency-key",
        "b-1",
    ];
    let stored = json(&cloud.ok(&args));
    assert_eq!(stored["seq"], 2);
    assert_eq!(stored["replayed"], false);
    let events = cloud.events();
    assert_eq!(events.len(), 2, "one event for the whole batch");
    assert_eq!(events[1].1, stored["event_id"].as_str().unwrap());
    let body = verified_body(&cloud, &events[1].2);
    assert_eq!((&body["type"], &body["seq"]), (&"batch".into(), &2.into()));
    let items = body["items"].as_array().unwrap();
    assert_eq!(
        items
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["key.issued", "key.issued", "key.revoked", "guest.erased"]
    );
    assert_eq!(items[0]["key"]["check_in_id"], "c-7");
    assert_eq!(items[0]["key"]["state"], "active");
    assert_eq!(items[1]["key"]["reservation_id"], "r-9");
    assert_eq!(items[1]["key"]["state"], "pre_issued");
    assert_eq!(
        (&items[2]["key_id"], &items[2]["reason"]),
        (&"k-old".into(), &"checked_out".into())
    );
    assert_eq!(items[3]["holder_ref"], "g-17");
    let body_text = body.to_string();
    assert!(
        !body_text.contains("482913") && !body_text.contains("551203"),
        "PINs go as tags"
    );
    // The cloud's view of the keys changed with the event.
    assert_eq!(
        cloud.sql::<String>("SELECT state FROM keys WHERE key_id = 'k-old'"),
        "revoked"
    );
    assert_eq!(cloud.sql::<i64>("SELECT count(*) FROM keys"), 3);
    assert_eq!(cloud.sql::<i64>("SELECT next_seq FROM hubs"), 3);

    // The same file again with the same key: the stored result, no new seq.
    let again = json(&cloud.ok(&args));
    assert_eq!(again["replayed"], true);
    assert_eq!(
        (&again["seq"], &again["event_id"]),
        (&stored["seq"], &stored["event_id"])
    );
    assert_eq!(cloud.events(), events, "nothing new stored");
    // The same key with another file (another PIN) is refused.
    let other = std::fs::read_to_string(&file)
        .unwrap()
        .replace("482913", "482914");
    let other = batch_file(&cloud, "other.json", &other);
    let out = cloud.run(&["batch", &h, "--file", &other, "--idempotency-key", "b-1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("idempotency key \"b-1\""), "{err}");
    assert!(!err.contains("48291"), "no PIN printed: {err}");
    assert_eq!(cloud.events(), events, "nothing changed");
    assert_eq!(cloud.sql::<i64>("SELECT next_seq FROM hubs"), 3);
}

#[test]
fn a_malformed_batch_file_exits_2_naming_the_mistake_and_stores_nothing() {
    let cloud = Cloud::new();
    let h = hub_ref("hub-1");
    let issue = |check_in: &str, extra: &str| {
        format!(
            r#"{{"type": "issue", "check_in": "{check_in}", "doors": ["101"], "pin": "482913", "valid_until": "{UNTIL}"{extra}}}"#
        )
    };
    let erase = r#"{"type": "erase", "holder_ref": "g-1"}"#;
    let too_many = format!("[{}]", vec![erase; 501].join(","));
    let cases: Vec<(String, &str)> = vec![
        (
            "not json".into(),
            "not a JSON array of items (line 1, column",
        ),
        (erase.into(), "not a JSON array of items"),
        (
            r#"[{"type": "delete", "key_id": "k-1"}]"#.into(),
            "not a JSON array of items",
        ),
        (
            format!("[{}]", issue("c-1", r#", "colour": "red""#)),
            "not a JSON array of items",
        ),
        // serde would quote the value: only the place is named.
        (
            format!("[{}]", issue("c-1", "").replace(r#""482913""#, "482913")),
            "not a JSON array of items",
        ),
        ("[]".into(), "a batch holds 1..=500 items, not 0"),
        (too_many, "not 501"),
        (
            format!(
                "[{erase}, {}]",
                issue("c-1", "").replace("482913", "4829131234567")
            ),
            "item 1: the PIN must be 4 to 12 digits",
        ),
        (
            format!("[{erase}, {}]", issue("c-1", "").replace("101", "999")),
            "item 1: hub",
        ),
        (
            format!(
                "[{}]",
                issue("c-1", "").replace(UNTIL, "2000-01-01T00:00:00Z")
            ),
            "item 0: the window",
        ),
        (
            r#"[{"type": "revoke", "key_id": "bad key"}]"#.into(),
            "item 0: key id \"bad key\"",
        ),
        (
            format!(r#"[{erase}, {{"type": "erase", "holder_ref": "g 2"}}]"#),
            "item 1: holder ref \"g 2\"",
        ),
        (
            format!("[{}, {}]", issue("c-1", ""), issue("c-1", "")),
            "already has an active key",
        ),
    ];
    for (n, (text, message)) in cases.iter().enumerate() {
        let file = batch_file(&cloud, &format!("batch-{n}.json"), text);
        let out = cloud.run(&["batch", &h, "--file", &file, "--idempotency-key", "b-1"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {n}: {err}");
        assert!(
            err.contains(message),
            "case {n}: {err:?} should say {message:?}"
        );
        assert!(!err.contains("48291"), "case {n}: no PIN printed: {err}");
    }
    // A file that is not there, and an empty idempotency key.
    let missing = cloud.dir.path().join("none.json");
    let out = cloud.run(&["batch", &h, "--file", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the batch file"));
    let good = batch_file(&cloud, "good.json", &format!("[{erase}]"));
    let out = cloud.run(&["batch", &h, "--file", &good, "--idempotency-key", ""]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("idempotency key must be"));

    assert!(cloud.events().is_empty(), "no event stored");
    assert_eq!(
        cloud.sql::<i64>("SELECT next_seq FROM hubs"),
        1,
        "no seq spent"
    );
    assert_eq!(cloud.sql::<i64>("SELECT count(*) FROM keys"), 0);
    assert_eq!(cloud.sql::<i64>("SELECT count(*) FROM idempotency"), 0);
    // The key b-1 was never taken: a good file under it is signed, seq 1.
    let out = json(&cloud.ok(&[
        "--json",
        "batch",
        &h,
        "--file",
        &good,
        "--idempotency-key",
        "b-1",
    ]));
    assert_eq!((&out["seq"], &out["replayed"]), (&1.into(), &false.into()));
}

/// Records a hub output the way `serve` does (a row in `outputs`).
fn record_output(cloud: &Cloud, hub: &str, topic: &str, body: &str) {
    rusqlite::Connection::open(cloud.db())
        .unwrap()
        .execute(
            "INSERT INTO outputs (site_id, hub_id, topic, body, received_at) \
             VALUES (?1, ?2, ?3, ?4, '2026-12-04T10:00:00.000000Z')",
            [SITE, hub, topic, body],
        )
        .unwrap();
}

/// `watch` with `args`, and its output lines as they come.
fn watch(cloud: &Cloud, args: &[&str]) -> (KillOnDrop, std::sync::mpsc::Receiver<String>) {
    let mut child = cloud
        .command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (KillOnDrop(child), rx)
}

#[test]
fn watch_in_text_mode_prints_a_line_per_recorded_output_of_the_hub_asked_for_as_it_arrives() {
    use std::time::Duration;
    let cloud = Cloud::new();
    cloud.ok(&["hub", "add", &hub_ref("hub-2"), "--door", "1"]);
    record_output(
        &cloud,
        "hub-1",
        "results",
        r#"{"seq":1,"outcome":"applied"}"#,
    );
    record_output(
        &cloud,
        "hub-2",
        "results",
        r#"{"seq":7,"outcome":"applied"}"#,
    );
    record_output(
        &cloud,
        "hub-1",
        "alerts",
        r#"{"condition":"board_offline","state":"raised","subject":"board-a","count":1}"#,
    );
    let h = hub_ref("hub-1");
    let wait = Duration::from_secs(20);
    let (_w, lines) = watch(
        &cloud,
        &["watch", "--hub", &h, "--from-start", "--poll-ms", "50"],
    );
    let prefix = format!("2026-12-04T10:00:00.000000Z {h} ");
    assert_eq!(
        lines.recv_timeout(wait).unwrap(),
        format!("{prefix}results seq=1 applied reason=-")
    );
    assert_eq!(
        lines.recv_timeout(wait).unwrap(),
        format!("{prefix}alerts board_offline raised subject=board-a count=1")
    );
    // What is recorded later comes too; another hub's does not.
    record_output(&cloud, "hub-2", "status", r#"{"state":"offline"}"#);
    record_output(
        &cloud,
        "hub-1",
        "status",
        r#"{"state":"online","version":"1.2.0"}"#,
    );
    assert_eq!(
        lines.recv_timeout(wait).unwrap(),
        format!("{prefix}status online version=1.2.0")
    );
    assert!(
        lines.recv_timeout(Duration::from_millis(300)).is_err(),
        "nothing else"
    );

    // Without --from-start, only what is recorded after it starts.
    let (_w, lines) = watch(&cloud, &["watch", "--poll-ms", "50"]);
    let mut n = 0;
    let first = loop {
        n += 1;
        record_output(
            &cloud,
            "hub-2",
            "sync",
            &format!(r#"{{"from_seq":{n},"reason":"gap"}}"#),
        );
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
            break line;
        }
        assert!(n < 100, "watch printed nothing");
    };
    assert!(
        first.contains(&format!("{} sync from_seq=", hub_ref("hub-2")))
            && first.ends_with(" reason=gap"),
        "{first}"
    );
}
