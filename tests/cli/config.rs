//! The config loader and `lockhub check-config` (config.md).

use lockhub::config::{self, Config, ConfigError, ConfigErrors, Policy};
use lockhub_proto::crypto;
use lockhub_proto::topics::Leaf;
use std::path::Path;
use std::process::Command;
use testkit::files::{Fixture, HUB_ID, HUB_PUBLIC_KEY, SECRETS_TOML, SITE_ID, edit, set_mode};

fn load(fx: &Fixture) -> Result<Config, ConfigErrors> {
    config::load(&fx.hub())
}

fn errors(fx: &Fixture) -> Vec<ConfigError> {
    match load(fx) {
        Ok(_) => panic!("config loaded, expected errors"),
        Err(e) => e.errors,
    }
}

/// Exactly one problem, in `file` at `line:col`, whose message has `fragment`.
#[track_caller]
fn only_error(fx: &Fixture, file: &Path, line: usize, col: usize, fragment: &str) {
    let errs = errors(fx);
    let shown: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(errs.len(), 1, "expected one problem, got {shown:#?}");
    let e = &errs[0];
    assert_eq!(e.file, file, "{shown:?}");
    assert_eq!((e.line, e.column), (Some(line), Some(col)), "{shown:?}");
    assert!(e.message.contains(fragment), "{shown:?} lacks {fragment:?}");
}

#[track_caller]
fn hub_error(edits: &[(&str, &str)], line: usize, col: usize, fragment: &str) {
    let fx = Fixture::with_hub_edits(edits);
    only_error(&fx, &fx.hub(), line, col, fragment);
}

#[track_caller]
fn secrets_error(secrets: &str, line: usize, col: usize, fragment: &str) {
    let fx = Fixture::new();
    fx.write_secrets(secrets);
    only_error(&fx, &fx.secrets(), line, col, fragment);
}

const SECOND_DOOR: &str =
    "\n[[door]]\nname = \"102\"\nserial = \"board-a\"\nindex = 1\nunlock_ms = 5000\n";
// Lines 26..=31 once appended: 27 [[door]], 28 name, 29 serial, 30 index, 31 unlock_ms.

// ---------------------------------------------------------------------------
// A valid config
// ---------------------------------------------------------------------------

#[test]
fn the_vectors_config_loads_with_defaults() {
    let fx = Fixture::new();
    let c = load(&fx).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.hub.site_id.to_string(), SITE_ID);
    assert_eq!(c.hub.hub_id, HUB_ID);
    // Relative paths resolve against the config's folder; data_dir need not exist.
    assert_eq!(c.hub.data_dir, fx.path("data"));
    assert!(!fx.path("data").exists());
    assert_eq!(c.database_path(), fx.path("data").join("lockhub.db"));
    assert_eq!(c.secrets_file, fx.secrets());
    assert!(!c.mqtt.tls);
    assert_eq!((c.mqtt.host.as_str(), c.mqtt.port), ("127.0.0.1", 1883));
    assert_eq!(c.mqtt.client_id, HUB_ID);
    assert_eq!(c.mqtt.topic_prefix, "lockhub/v1");
    assert_eq!(
        c.topic(Leaf::Events),
        format!("lockhub/v1/{SITE_ID}/{HUB_ID}/events")
    );
    assert_eq!(c.trust.len(), 1);
    assert_eq!(c.trust[0].id, "cloud-2026-11");
    assert_eq!(c.trust[0].not_after, None);
    assert_eq!(c.policy, Policy::default());
    assert_eq!(c.serials[0].port, Path::new("/dev/ttyAMA0"));
    assert_eq!(c.serials[0].baud, 115200);
    let door = c.door("101").expect("door 101");
    assert_eq!(
        (door.serial.as_str(), door.index, door.unlock_ms),
        ("board-a", 0, 5000)
    );
    assert!(c.door("102").is_none());
    assert_eq!(
        crypto::b64u_encode(c.secrets.hub_key.verifying_key().as_bytes()),
        HUB_PUBLIC_KEY
    );
    let k1 = c.pin_key("k1").expect("pin key k1");
    assert_eq!(
        crypto::b64u_encode(&crypto::pin_tag(&k1.secret, b"482913")),
        "hvm_pP9YTc-eyIwtdnLrzLmxWn26dD2b6tlyRlDbl3Q"
    );
    // Debug never shows a secret.
    let debug = format!("{c:?}");
    assert!(!debug.contains("7DSziFstzn18"), "{debug}");
    assert!(!debug.contains(&format!("{:?}", k1.secret)), "{debug}");
}

#[test]
fn policy_defaults_fill_in_absent_keys() {
    let fx = Fixture::new();
    let text = testkit::files::hub_toml() + "\n[policy]\nheld_open_s = 30\ncloud_stale_s = 0x384\n";
    fx.write_hub(&text);
    let c = load(&fx).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        c.policy,
        Policy {
            held_open_s: 30,
            cloud_stale_s: 900,
            ..Policy::default()
        }
    );
}

#[test]
fn optional_mqtt_keys_and_not_after_are_read() {
    let fx = Fixture::with_hub_edits(&[
        (
            "url = \"mqtt://127.0.0.1:1883\"",
            "url = \"mqtt://broker.local\"\nclient_id = \"lobby\"\ntopic_prefix = \"acme/lockhub\"\nusername = \"hub\"\npassword_file = \"secret/pw\"",
        ),
        (
            "M0\"\n",
            "M0\"\nnot_after = \"2027-06-01T02:00:00+02:00\"\n",
        ),
    ]);
    fx.write_private("secret/pw", "hunter2\n");
    let c = load(&fx).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.mqtt.port, 1883);
    assert_eq!(c.mqtt.client_id, "lobby");
    assert_eq!(
        c.topic(Leaf::Status),
        format!("acme/lockhub/{SITE_ID}/{HUB_ID}/status")
    );
    assert_eq!(c.mqtt.username.as_deref(), Some("hub"));
    assert_eq!(c.mqtt.password_file, Some(fx.path("secret/pw")));
    assert_eq!(
        c.trust[0].not_after.map(|t| t.to_rfc3339()),
        Some("2027-06-01T00:00:00.000000Z".to_owned())
    );
}

#[test]
fn a_bare_toml_datetime_is_accepted_for_not_after() {
    let fx = Fixture::with_hub_edits(&[("M0\"\n", "M0\"\nnot_after = 2027-06-01T00:00:00Z\n")]);
    let c = load(&fx).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.trust[0].not_after.is_some());
}

/// Real certificates (openssl), made once for this test binary: a CA, the
/// hub's client certificate and key, and a second client's pair.
static PKI: std::sync::LazyLock<testkit::broker::TestPki> = std::sync::LazyLock::new(|| {
    let pki = testkit::broker::TestPki::generate();
    pki.client("other", "someone-else");
    pki
});

fn pki_file(name: &str) -> String {
    std::fs::read_to_string(PKI.path(name)).unwrap()
}

fn mqtts_fixture() -> Fixture {
    let fx = Fixture::with_hub_edits(&[(
        "url = \"mqtt://127.0.0.1:1883\"",
        "url = \"mqtts://broker.example\"\nca_file = \"tls/ca.pem\"\ncert_file = \"tls/hub.pem\"\nkey_file = \"tls/hub.key\"",
    )]);
    fx.write("tls/ca.pem", &pki_file("ca.crt"));
    fx.write("tls/hub.pem", &pki_file("client.crt"));
    fx.write_private("tls/hub.key", &pki_file("client.key"));
    fx
}

#[test]
fn mqtts_defaults_to_port_8883_and_resolves_its_files() {
    let fx = mqtts_fixture();
    let c = load(&fx).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.mqtt.tls);
    assert_eq!(
        (c.mqtt.host.as_str(), c.mqtt.port),
        ("broker.example", 8883)
    );
    assert_eq!(c.mqtt.ca_file, Some(fx.path("tls/ca.pem")));
    assert_eq!(c.mqtt.key_file, Some(fx.path("tls/hub.key")));
}

#[test]
fn relative_paths_resolve_from_the_config_folder_not_the_working_directory() {
    let fx = Fixture::with_hub_edits(&[("file = \"secrets.toml\"", "file = \"keys/s.toml\"")]);
    fx.write_private("keys/s.toml", &SECRETS_TOML);
    // The test runs in the package root; the config lives elsewhere.
    assert_ne!(std::env::current_dir().unwrap(), fx.dir.path());
    let c = load(&fx).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.secrets_file, fx.path("keys/s.toml"));
}

// ---------------------------------------------------------------------------
// Refusals, each at its line and column
// ---------------------------------------------------------------------------

#[test]
fn a_secrets_file_readable_by_group_or_others_is_refused_by_path() {
    for mode in [0o644, 0o640, 0o604, 0o660] {
        let fx = Fixture::new();
        set_mode(&fx.secrets(), mode);
        let errs = errors(&fx);
        assert_eq!(errs.len(), 1, "{errs:?}");
        // At the key that names the file: a line and column like any other.
        assert_eq!(errs[0].file, fx.hub());
        assert_eq!((errs[0].line, errs[0].column), (Some(14), Some(8)));
        assert!(errs[0].message.contains("group or others"), "{errs:?}");
        assert!(errs[0].message.contains(&format!("{mode:04o}")), "{errs:?}");
        assert!(
            errs[0]
                .message
                .contains(&fx.secrets().display().to_string()),
            "{errs:?}"
        );
    }
    let fx = Fixture::new();
    set_mode(&fx.secrets(), 0o400);
    assert!(load(&fx).is_ok());
}

#[test]
fn a_missing_secrets_file_is_reported_where_hub_toml_names_it() {
    let fx = Fixture::with_hub_edits(&[("file = \"secrets.toml\"", "file = \"nope.toml\"")]);
    only_error(&fx, &fx.hub(), 14, 8, "does not exist");
}

fn weak_key() -> String {
    let mut identity = [0u8; 32];
    identity[0] = 1;
    crypto::b64u_encode(&identity)
}

/// 32 bytes that do not decode to a curve point.
fn invalid_point() -> String {
    (2u8..=255)
        .map(|y| {
            let mut b = [0u8; 32];
            b[0] = y;
            b
        })
        .find(|b| ed25519_dalek::VerifyingKey::from_bytes(b).is_err())
        .map(|b| crypto::b64u_encode(&b))
        .expect("some y is not on the curve")
}

#[test]
fn weak_invalid_or_short_trust_keys_are_refused() {
    let good = "vpDAfBqmiMog0GAAR6GMchsmx2iCa19aGlMs764g2M0";
    hub_error(&[(good, &weak_key())], 11, 14, "weak");
    hub_error(
        &[(good, &invalid_point())],
        11,
        14,
        "not a valid Ed25519 point",
    );
    hub_error(&[(good, "AAAA")], 11, 14, "32 bytes");
}

#[test]
fn a_door_on_an_unconfigured_serial_is_refused() {
    hub_error(
        &[("serial = \"board-a\"", "serial = \"board-b\"")],
        23,
        10,
        "serial `board-b` is not configured",
    );
}

#[test]
fn duplicate_door_names_are_refused_at_the_second() {
    let fx = Fixture::new();
    fx.write_hub(&(testkit::files::hub_toml() + &edit(SECOND_DOOR, &[("\"102\"", "\"101\"")])));
    only_error(
        &fx,
        &fx.hub(),
        28,
        8,
        "duplicate door name `101` (first on line 22)",
    );
}

#[test]
fn duplicate_serial_names_and_signer_ids_are_refused() {
    let fx = Fixture::new();
    fx.write_hub(
        &(testkit::files::hub_toml()
            + "\n[[serial]]\nname = \"board-a\"\nport = \"/dev/ttyUSB0\"\nbaud = 9600\n"),
    );
    only_error(&fx, &fx.hub(), 28, 8, "duplicate serial name `board-a`");

    let fx = Fixture::new();
    fx.write_hub(&(testkit::files::hub_toml() + "\n" + &*testkit::files::TRUST_TOML));
    only_error(&fx, &fx.hub(), 28, 6, "duplicate signer id `cloud-2026-11`");
}

#[test]
fn duplicate_pin_key_ids_are_refused_in_the_secrets_file() {
    let extra =
        "\n[[pin_key]]\nid = \"k1\"\nsecret = \"qTouxiikSj0xOqGF1EY1r3wDRaCaaT-XQQUqNoXtCgU\"\n";
    secrets_error(
        &testkit::files::secrets_with(extra),
        9,
        6,
        "duplicate pin key id `k1`",
    );
}

#[test]
fn keys_that_are_not_32_bytes_are_refused_in_the_secrets_file() {
    let short = crypto::b64u_encode(&[9u8; 31]);
    let pin = edit(
        &SECRETS_TOML,
        &[("7DSziFstzn18m4kT0DnCq0jReWQxAnkgKl6pfph4WsY", &short)],
    );
    secrets_error(&pin, 6, 10, "must be 32 bytes");
    let hub = edit(
        &SECRETS_TOML,
        &[("qTouxiikSj0xOqGF1EY1r3wDRaCaaT-XQQUqNoXtCgU", "not base64!")],
    );
    secrets_error(&hub, 2, 10, "not base64url");
}

/// Two readers on a bus, and the secrets file with `keys` as their
/// `[[reader_key]]` tables, in order: where the second table's `scbk` is.
fn two_keyed_readers(keys: [&[u8; 16]; 2]) -> (Fixture, usize) {
    let fx = Fixture::new();
    fx.write_hub(
        &(testkit::files::hub_toml()
            + "\n[[osdp]]\nname = \"bus-a\"\nport = \"/dev/ttyUSB1\"\n"
            + "\n[[reader]]\nname = \"r-1\"\nbus = \"bus-a\"\naddress = 1\n"
            + "\n[[reader]]\nname = \"r-2\"\nbus = \"bus-a\"\naddress = 2\n"),
    );
    let mut text = SECRETS_TOML.to_owned();
    for (reader, key) in ["r-1", "r-2"].iter().zip(keys) {
        text += &format!(
            "\n[[reader_key]]\nreader = \"{reader}\"\nscbk = \"{}\"\n",
            crypto::b64u_encode(key)
        );
    }
    fx.write_secrets(&text);
    let line = text.lines().count();
    (fx, line)
}

#[test]
fn a_reader_key_equal_to_scbk_d_all_zero_or_shared_is_refused_with_line_and_column() {
    let own = [0x5A; 16];
    let (fx, line) = two_keyed_readers([&own, &config::SCBK_D]);
    only_error(&fx, &fx.secrets(), line, 8, "default install key SCBK-D");
    let (fx, line) = two_keyed_readers([&own, &[0; 16]]);
    only_error(&fx, &fx.secrets(), line, 8, "`scbk` is all zero");
    let (fx, line) = two_keyed_readers([&own, &own]);
    only_error(
        &fx,
        &fx.secrets(),
        line,
        8,
        &format!(
            "reader `r-2` has the same `scbk` as reader `r-1` (line {}): each reader needs its own key",
            line - 4
        ),
    );
    let (fx, _) = two_keyed_readers([&own, &[0xA5; 16]]);
    load(&fx).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn contact_inverted_without_contact_input_and_output_without_reader_are_refused() {
    let readers = "\n[[osdp]]\nname = \"bus-a\"\nport = \"/dev/ttyUSB1\"\n\
                   \n[[reader]]\nname = \"r-1\"\nbus = \"bus-a\"\naddress = 1\n";
    let fx = Fixture::new();
    let hub = testkit::files::hub_toml()
        + readers
        + "\n[[door]]\nname = \"201\"\nreader = \"r-1\"\noutput = 0\nunlock_ms = 5000\ncontact_inverted = true\n";
    fx.write_hub(&hub);
    let line = hub.lines().count();
    fx.write_secrets(
        &(SECRETS_TOML.to_owned()
            + "\n[[reader_key]]\nreader = \"r-1\"\nscbk = \"EBESExQVFhcYGRobHB0eHw\"\n"),
    );
    only_error(
        &fx,
        &fx.hub(),
        line,
        20,
        "`contact_inverted` needs `contact_input`",
    );
    // `output` on a board's door: the board has no reader outputs.
    hub_error(
        &[("index = 0\n", "index = 0\noutput = 1\n")],
        25,
        10,
        "`output` is for a door on an OSDP reader",
    );
}

#[test]
fn a_door_with_its_pin_on_a_reader_and_its_strike_on_a_board_is_accepted_without_reader_outputs() {
    let readers = "\n[[osdp]]\nname = \"bus-a\"\nport = \"/dev/ttyUSB1\"\n\
                   \n[[reader]]\nname = \"r-1\"\nbus = \"bus-a\"\naddress = 1\n";
    let key = "\n[[reader_key]]\nreader = \"r-1\"\nscbk = \"EBESExQVFhcYGRobHB0eHw\"\n";
    let mixed = "\n[[door]]\nname = \"201\"\nreader = \"r-1\"\nserial = \"board-a\"\nindex = 1\nunlock_ms = 5000\n";
    let fx = Fixture::new();
    fx.write_hub(&(testkit::files::hub_toml() + readers + mixed));
    fx.write_secrets(&(SECRETS_TOML.to_owned() + key));
    let c = load(&fx).unwrap_or_else(|e| panic!("{e}"));
    let d = c.door("201").expect("a board door");
    assert_eq!(
        (d.serial.as_str(), d.index, d.reader.as_deref()),
        ("board-a", 1, Some("r-1"))
    );
    assert!(c.reader_doors.is_empty());

    // Its contact is the board's: a reader input does not go with it.
    let hub = testkit::files::hub_toml() + readers + mixed + "contact_input = 0\n";
    let fx = Fixture::new();
    fx.write_hub(&hub);
    fx.write_secrets(&(SECRETS_TOML.to_owned() + key));
    only_error(
        &fx,
        &fx.hub(),
        hub.lines().count(),
        17,
        "door `201` has its strike and contact on its board (`serial`, `index`): `contact_input` is a reader's",
    );
}

#[test]
fn door_index_must_be_0_to_15() {
    hub_error(
        &[("index = 0", "index = 16")],
        24,
        9,
        "must be in 0..=15, found 16",
    );
    hub_error(
        &[("index = 0", "index = -1")],
        24,
        9,
        "must be in 0..=15, found -1",
    );
    let fx = Fixture::with_hub_edits(&[("index = 0", "index = 15")]);
    assert!(load(&fx).is_ok());
}

#[test]
fn two_doors_on_the_same_serial_and_index_are_refused() {
    let fx = Fixture::new();
    fx.write_hub(&(testkit::files::hub_toml() + &edit(SECOND_DOOR, &[("index = 1", "index = 0")])));
    only_error(
        &fx,
        &fx.hub(),
        30,
        9,
        "already used by door `101` (line 24)",
    );
    // The same index on another serial is fine.
    let fx = Fixture::new();
    fx.write_hub(
        &(testkit::files::hub_toml()
            + "\n[[serial]]\nname = \"board-b\"\nport = \"/dev/ttyUSB0\"\nbaud = 9600\ninsecure_plaintext = true\n"
            + &edit(
                SECOND_DOOR,
                &[("index = 1", "index = 0"), ("board-a", "board-b")],
            )),
    );
    assert!(load(&fx).is_ok());
}

#[test]
fn unlock_ms_must_be_1_to_65535() {
    hub_error(
        &[("unlock_ms = 5000", "unlock_ms = 0")],
        25,
        13,
        "must be in 1..=65535",
    );
    hub_error(
        &[("unlock_ms = 5000", "unlock_ms = 65536")],
        25,
        13,
        "must be in 1..=65535",
    );
}

#[test]
fn zero_or_negative_policy_values_are_refused() {
    for (value, shown) in [
        ("0", "found 0"),
        ("-5", "found -5"),
        ("4294967296", "found 4294967296"),
    ] {
        let fx = Fixture::new();
        fx.write_hub(&format!(
            "{}\n[policy]\nheld_open_s = {value}\n",
            testkit::files::hub_toml()
        ));
        only_error(&fx, &fx.hub(), 28, 15, shown);
        assert!(errors(&fx)[0].message.contains("positive integer"));
    }
}

#[test]
fn unknown_keys_are_refused_by_name() {
    hub_error(
        &[("hub_id =", "colour = 1\nhub_id =")],
        3,
        1,
        "unknown key `colour` in [hub]",
    );
    // A typo is unknown and leaves the real key missing: both are said.
    let fx = Fixture::with_hub_edits(&[("index = 0", "indx = 0")]);
    let errs: Vec<String> = errors(&fx)
        .iter()
        .map(|e| format!("{}:{}: {}", e.line.unwrap(), e.column.unwrap(), e.message))
        .collect();
    assert_eq!(
        errs,
        [
            "21:1: missing key `index` in [[door]]",
            "24:1: unknown key `indx` in [[door]] (did you mean `index`?)",
        ]
    );
    let fx = Fixture::new();
    fx.write_hub(&(testkit::files::hub_toml() + "\n[polcy]\nheld_open_s = 3\n"));
    only_error(&fx, &fx.hub(), 27, 2, "unknown key `polcy`");
    secrets_error(
        &testkit::files::secrets_with("note = \"x\"\n"),
        7,
        1,
        "unknown key `note`",
    );
}

#[test]
fn wrong_types_are_refused() {
    hub_error(
        &[("baud = 115200", "baud = \"115200\"")],
        19,
        8,
        "`baud` must be an integer, found string",
    );
    hub_error(
        &[("unlock_ms = 5000", "unlock_ms = 5.0")],
        25,
        13,
        "must be an integer, found float",
    );
    hub_error(
        &[("hub_id = \"hub-lobby-1\"", "hub_id = 1")],
        3,
        10,
        "`hub_id` must be a string, found integer",
    );
    hub_error(
        &[("[[serial]]", "[serial]")],
        16,
        1,
        "must be an array of tables: write [[serial]]",
    );
    let fx = Fixture::new();
    let text = edit(
        &testkit::files::hub_toml(),
        &[("[mqtt]\nurl = \"mqtt://127.0.0.1:1883\"\n", "")],
    );
    fx.write_hub(&format!("mqtt = 3\n{text}"));
    only_error(
        &fx,
        &fx.hub(),
        1,
        8,
        "[mqtt] must be a table, found integer",
    );
}

#[test]
fn missing_required_keys_and_tables_are_refused() {
    hub_error(
        &[("port = \"/dev/ttyAMA0\"\n", "")],
        16,
        1,
        "missing key `port` in [[serial]]",
    );
    hub_error(
        &[("site_id = \"6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10\"\n", "")],
        1,
        1,
        "missing key `site_id` in [hub]",
    );
    hub_error(
        &[("[secrets]\nfile = \"secrets.toml\"\n", "")],
        1,
        1,
        "missing table [secrets]",
    );
    secrets_error(
        &format!(
            "[hub_key]\nsecret = \"qTouxiikSj0xOqGF1EY1r3wDRaCaaT-XQQUqNoXtCgU\"\n{}",
            testkit::files::board_key_toml("board-a", &testkit::files::board_key_for("board-a"))
        ),
        1,
        1,
        "[[pin_key]]",
    );
    secrets_error(
        &format!(
            "pin_key = []\n[hub_key]\nsecret = \"qTouxiikSj0xOqGF1EY1r3wDRaCaaT-XQQUqNoXtCgU\"\n{}",
            testkit::files::board_key_toml("board-a", &testkit::files::board_key_for("board-a"))
        ),
        1,
        11,
        "no [[pin_key]]: the hub needs at least one PIN key",
    );
}

#[test]
fn site_id_must_be_a_uuid() {
    hub_error(&[(SITE_ID, "site-6f1c")], 2, 11, "`site_id` must be a UUID");
    // The simple (unhyphenated) form is refused too: topics use the hyphenated one.
    hub_error(
        &[(SITE_ID, "6f1c1c0e8a514d399d2e6a3c5a7d9e10")],
        2,
        11,
        "must be a UUID",
    );
}

#[test]
fn hub_id_must_be_1_to_64_safe_characters() {
    for bad in ["hub lobby", "", "hub/lobby", "hüb", &"h".repeat(65)] {
        hub_error(
            &[("\"hub-lobby-1\"", &format!("\"{bad}\""))],
            3,
            10,
            "`hub_id` must be 1..=64",
        );
    }
    let fx =
        Fixture::with_hub_edits(&[("\"hub-lobby-1\"", &format!("\"{}\"", "A._-9".repeat(12)))]);
    assert!(load(&fx).is_ok());
}

#[test]
fn timezone_defaults_to_utc_and_reads_an_iana_zone() {
    let c = load(&Fixture::new()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.hub.timezone_name(), "UTC");
    for zone in [
        "Europe/Berlin",
        "Australia/Lord_Howe",
        "America/New_York",
        "UTC",
    ] {
        let fx = Fixture::with_hub_edits(&[(
            "data_dir = \"data\"\n",
            &format!("data_dir = \"data\"\ntimezone = \"{zone}\"\n"),
        )]);
        let c = load(&fx).unwrap_or_else(|e| panic!("{zone}: {e}"));
        assert_eq!(c.hub.timezone_name(), zone);
    }
    // The zone decides: 08:30 UTC on a winter day is 09:30 in Berlin.
    let fx = Fixture::with_hub_edits(&[(
        "data_dir = \"data\"\n",
        "data_dir = \"data\"\ntimezone = \"Europe/Berlin\"\n",
    )]);
    let tz = load(&fx).unwrap().hub.timezone;
    let at = jiff::Timestamp::from_second(1_796_373_000).unwrap(); // 2026-12-04T08:30:00Z
    assert_eq!(tz.to_datetime(at).hour(), 9);
}

#[test]
fn a_zone_the_systems_zoneinfo_lacks_is_found_in_the_built_in_copy() {
    let fx = Fixture::with_hub_edits(&[(
        "data_dir = \"data\"\n",
        "data_dir = \"data\"\ntimezone = \"Australia/Lord_Howe\"\n",
    )]);
    // A zoneinfo folder that holds only UTC: the system's database is there
    // but lacks the zone, as an old or trimmed tzdata would.
    let only_utc = tempfile::tempdir().unwrap();
    std::fs::write(only_utc.path().join("UTC"), tzif_utc()).unwrap();
    let empty = tempfile::tempdir().unwrap();
    for tzdir in [only_utc.path(), empty.path()] {
        let out = Command::new(env!("CARGO_BIN_EXE_lockhub"))
            .arg("check-config")
            .arg(fx.hub())
            .env("TZDIR", tzdir)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "TZDIR={}: {}",
            tzdir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let fx = Fixture::with_hub_edits(&[(
        "data_dir = \"data\"\n",
        "data_dir = \"data\"\ntimezone = \"Australia/Lord_Howf\"\n",
    )]);
    let out = Command::new(env!("CARGO_BIN_EXE_lockhub"))
        .arg("check-config")
        .arg(fx.hub())
        .env("TZDIR", only_utc.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// A TZif (version 1) file of UTC: one type, offset 0, named "UTC".
fn tzif_utc() -> Vec<u8> {
    let mut f = b"TZif".to_vec();
    f.push(0); // version 1
    f.extend([0; 15]);
    // isutcnt, isstdcnt, leapcnt, timecnt, typecnt, charcnt
    for n in [0u32, 0, 0, 0, 1, 4] {
        f.extend(n.to_be_bytes());
    }
    f.extend(0i32.to_be_bytes()); // utoff
    f.extend([0, 0]); // isdst, desigidx
    f.extend(b"UTC\0");
    f
}

#[test]
fn a_timezone_the_database_does_not_know_is_refused_where_it_is_written() {
    for bad in [
        "Europe/Berln",
        "",
        "CET-1CEST,M3.5.0,M10.5.0/3",
        "/etc/localtime",
        "../zoneinfo/UTC",
        "Mars/Olympus_Mons",
    ] {
        hub_error(
            &[(
                "data_dir = \"data\"\n",
                &format!("data_dir = \"data\"\ntimezone = \"{bad}\"\n"),
            )],
            5,
            12,
            "is not a zone the hub's time zone database knows",
        );
    }
    hub_error(
        &[(
            "data_dir = \"data\"\n",
            "data_dir = \"data\"\ntimezone = 1\n",
        )],
        5,
        12,
        "`timezone` must be a string",
    );
    // check-config says so and exits 2.
    let fx = Fixture::with_hub_edits(&[(
        "data_dir = \"data\"\n",
        "data_dir = \"data\"\ntimezone = \"Europe/Berln\"\n",
    )]);
    let out = check_config(&fx.hub());
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let hub = fx.hub().display().to_string();
    let problem = stderr
        .lines()
        .find(|l| !l.contains(": warning: "))
        .unwrap_or_default();
    assert!(problem.starts_with(&format!("{hub}:5:12: ")), "{stderr}");
    assert!(problem.contains("Europe/Berln"), "{stderr}");
}

#[test]
fn mqtt_url_must_be_mqtt_or_mqtts_host_and_port() {
    let url = "mqtt://127.0.0.1:1883";
    for (bad, fragment) in [
        ("http://broker", "must start with mqtt:// or mqtts://"),
        ("mqtt://", "needs a host"),
        ("mqtt://broker:0", "port must be 1..=65535"),
        ("mqtt://broker:65536", "port must be 1..=65535"),
        ("mqtt://broker:", "port must be 1..=65535"),
        ("mqtt://broker/path", "no path"),
    ] {
        hub_error(&[(url, bad)], 7, 7, fragment);
    }
}

#[test]
fn mqtt_credentials_in_the_url_are_refused_without_echoing_them() {
    let fx = Fixture::with_hub_edits(&[("mqtt://127.0.0.1:1883", "mqtt://hub:S3cr3tPw@broker")]);
    only_error(&fx, &fx.hub(), 7, 7, "must not hold credentials");
    assert!(!errors(&fx)[0].to_string().contains("S3cr3tPw"));
}

#[test]
fn mqtts_files_must_exist_and_hold_pem() {
    let fx = mqtts_fixture();
    std::fs::remove_file(fx.path("tls/ca.pem")).unwrap();
    only_error(&fx, &fx.hub(), 8, 11, "does not exist");

    let fx = mqtts_fixture();
    fx.write("tls/hub.pem", "not a certificate\n");
    only_error(&fx, &fx.hub(), 9, 13, "holds no PEM certificate");

    let fx = mqtts_fixture();
    set_mode(&fx.path("tls/hub.key"), 0o644);
    only_error(&fx, &fx.hub(), 10, 12, "group or others");
}

/// check-config reads the TLS files as the connection will: a file it
/// passes is one `run` can connect with (else `run` failed with exit 1 and
/// systemd restarted it in a loop).
#[test]
fn mqtts_files_are_checked_as_the_connection_uses_them() {
    // A PEM block that is no certificate rustls can trust.
    let fx = mqtts_fixture();
    fx.write(
        "tls/ca.pem",
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    only_error(&fx, &fx.hub(), 8, 11, "not usable as a CA");

    // The key of another certificate: the usual mistake.
    let fx = mqtts_fixture();
    fx.write_private("tls/hub.key", &pki_file("other.key"));
    only_error(
        &fx,
        &fx.hub(),
        10,
        12,
        "does not match the certificate in `cert_file`",
    );

    // The same through the command: exit 2, and no key material shown.
    let out = Command::new(env!("CARGO_BIN_EXE_lockhub"))
        .arg("check-config")
        .arg(fx.hub())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("hub.toml:10:12:"), "{err}");
    assert!(
        !err.contains("PRIVATE KEY") && !err.contains("MII"),
        "{err}"
    );
}

#[test]
fn mqtts_needs_a_ca_and_tls_files_need_mqtts() {
    let fx = mqtts_fixture();
    fx.write_hub(&edit(
        &std::fs::read_to_string(fx.hub()).unwrap(),
        &[("ca_file = \"tls/ca.pem\"\n", "")],
    ));
    only_error(&fx, &fx.hub(), 6, 1, "mqtts:// needs `ca_file`");

    let fx = mqtts_fixture();
    fx.write_hub(&edit(
        &std::fs::read_to_string(fx.hub()).unwrap(),
        &[("mqtts://", "mqtt://")],
    ));
    let errs = errors(&fx);
    assert_eq!(errs.len(), 3, "{errs:?}");
    assert!(
        errs.iter()
            .all(|e| e.message.contains("only used with mqtts://"))
    );
}

#[test]
fn not_after_must_be_rfc3339() {
    for bad in [
        "\"2027-06-01\"",
        "\"2027-06-01T00:00:00\"",
        "\"soon\"",
        "2027-06-01T00:00:00",
    ] {
        hub_error(
            &[("M0\"\n", &format!("M0\"\nnot_after = {bad}\n"))],
            12,
            13,
            "`not_after` must be an RFC 3339 date-time",
        );
    }
    hub_error(
        &[("M0\"\n", "M0\"\nnot_after = 5\n")],
        12,
        13,
        "found integer",
    );
}

#[test]
fn a_serial_and_an_osdp_bus_without_baud_run_at_the_wire_contracts_defaults() {
    let fx = Fixture::new();
    fx.write_hub(
        &(testkit::files::edit(&testkit::files::hub_toml(), &[("baud = 115200\n", "")])
            + "\n[[osdp]]\nname = \"bus-a\"\nport = \"/dev/ttyUSB1\"\n"),
    );
    let c = load(&fx).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.serials[0].baud, 115_200, "serial.md 'Physical'");
    assert_eq!(c.osdp[0].baud, 9600, "osdp.md 'Physical and addressing'");
}

#[test]
fn a_reader_without_a_key_is_reported_beside_the_secrets_files_own_problems() {
    let reader = "\n[[osdp]]\nname = \"bus-a\"\nport = \"/dev/ttyUSB1\"\n\
                  \n[[reader]]\nname = \"r-1\"\nbus = \"bus-a\"\naddress = 1\n";
    let keyless = "reader `r-1` has no [[reader_key]]";
    // A group-readable file, and a file with a bad PIN key: neither hides
    // the missing reader key.
    let fx = Fixture::new();
    fx.write_hub(&(testkit::files::hub_toml() + reader));
    set_mode(&fx.secrets(), 0o640);
    let shown: Vec<String> = errors(&fx).iter().map(ToString::to_string).collect();
    assert_eq!(shown.len(), 2, "{shown:#?}");
    assert!(
        shown.iter().any(|e| e.contains("group or others")),
        "{shown:#?}"
    );
    assert!(shown.iter().any(|e| e.contains(keyless)), "{shown:#?}");

    let fx = Fixture::new();
    fx.write_hub(&(testkit::files::hub_toml() + reader));
    let secrets = std::fs::read_to_string(fx.secrets()).unwrap();
    let bad_pin_key = secrets.replacen("secret = \"", "secret = \"AAAA", 2);
    assert_ne!(bad_pin_key, secrets);
    fx.write_secrets(&bad_pin_key);
    let shown: Vec<String> = errors(&fx).iter().map(ToString::to_string).collect();
    assert!(shown.iter().any(|e| e.contains(keyless)), "{shown:#?}");
    assert!(shown.iter().any(|e| e.contains("32 bytes")), "{shown:#?}");

    // A [[reader_key]] whose reader cannot be read names no reader: then
    // nothing is said of keys missing, only of that table.
    fx.write_secrets(&(secrets + "\n[[reader_key]]\nscbk = \"EBESExQVFhcYGRobHB0eHw\"\n"));
    let shown: Vec<String> = errors(&fx).iter().map(ToString::to_string).collect();
    assert!(!shown.iter().any(|e| e.contains(keyless)), "{shown:#?}");
    assert_eq!(shown.len(), 1, "{shown:#?}");
}

#[test]
fn one_device_driven_by_a_board_and_an_osdp_bus_or_by_two_buses_is_refused() {
    // Line 26 is blank; 27 [[osdp]], 28 name, 29 port.
    let fx = Fixture::new();
    fx.write_hub(
        &(testkit::files::hub_toml() + "\n[[osdp]]\nname = \"bus-a\"\nport = \"/dev/ttyAMA0\"\n"),
    );
    only_error(
        &fx,
        &fx.hub(),
        29,
        8,
        "duplicate port (one [[serial]] or [[osdp]] per device) `/dev/ttyAMA0` (first on line 18)",
    );
    let fx = Fixture::new();
    fx.write_hub(
        &(testkit::files::hub_toml()
            + "\n[[osdp]]\nname = \"bus-a\"\nport = \"/dev/ttyUSB1\"\n\
               \n[[osdp]]\nname = \"bus-b\"\nport = \"/dev/ttyUSB1\"\n"),
    );
    only_error(&fx, &fx.hub(), 33, 8, "`/dev/ttyUSB1` (first on line 29)");
}

#[test]
fn a_serial_with_baud_0_is_refused() {
    hub_error(
        &[("baud = 115200", "baud = 0")],
        19,
        8,
        "`baud` must be in 1..=4294967295, found 0",
    );
}

#[test]
fn an_existing_data_dir_that_is_a_file_is_refused() {
    let fx = Fixture::new();
    fx.write("data", "");
    only_error(&fx, &fx.hub(), 4, 12, "is not a directory");
}

#[test]
fn toml_syntax_errors_come_with_line_and_column() {
    hub_error(&[("index = 0", "index = = 0")], 24, 9, "TOML syntax error");
    hub_error(
        &[("name = \"101\"", "name = \"101")],
        22,
        12,
        "TOML syntax error",
    );
    hub_error(
        &[("hub_id =", "site_id = \"x\"\nhub_id =")],
        3,
        1,
        "duplicate key `site_id`",
    );
}

#[test]
fn secrets_syntax_errors_carry_the_secrets_path() {
    let text = edit(&SECRETS_TOML, &[("id = \"k1\"", "id = k1")]);
    let fx = Fixture::new();
    fx.write_secrets(&text);
    let errs = errors(&fx);
    assert!(!errs.is_empty());
    assert!(errs.iter().all(|e| e.file == fx.secrets()), "{errs:?}");
    assert_eq!(
        (errs[0].line, errs[0].column),
        (Some(5), Some(6)),
        "{errs:?}"
    );
}

#[test]
fn columns_count_characters_not_bytes() {
    // "é" is two bytes; the error is at the 14th character of line 3.
    hub_error(
        &[("hub_id = \"hub-lobby-1\"", "hub_id = \"hé\" = 1")],
        3,
        15,
        "TOML syntax error",
    );
}

#[test]
fn three_problems_are_all_reported_in_order() {
    let fx = Fixture::with_hub_edits(&[
        (SITE_ID, "not-a-uuid"),
        ("baud = 115200", "baud = 0"),
        ("unlock_ms = 5000", "unlock_ms = 70000"),
    ]);
    let errs = load(&fx).unwrap_err();
    let at: Vec<(Option<usize>, Option<usize>)> = errs.iter().map(|e| (e.line, e.column)).collect();
    assert_eq!(
        at,
        [
            (Some(2), Some(11)),
            (Some(19), Some(8)),
            (Some(25), Some(13))
        ],
        "{errs}"
    );
    // Display: one FILE:LINE:COL: message per line.
    let shown = errs.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 3);
    let file = fx.hub().display().to_string();
    assert!(lines[0].starts_with(&format!("{file}:2:11: ")), "{shown}");
    assert!(lines[1].starts_with(&format!("{file}:19:8: ")), "{shown}");
    assert!(lines[2].starts_with(&format!("{file}:25:13: ")), "{shown}");
}

#[test]
fn problems_in_both_files_are_reported_together() {
    let fx = Fixture::with_hub_edits(&[("index = 0", "index = 99")]);
    fx.write_secrets(&edit(&SECRETS_TOML, &[("id = \"k1\"", "id = \"\"")]));
    set_mode(&fx.secrets(), 0o644);
    let errs = errors(&fx);
    let files: Vec<&Path> = errs.iter().map(|e| e.file.as_path()).collect();
    assert_eq!(
        files,
        [fx.hub().as_path(), &fx.hub(), &fx.secrets()],
        "{errs:?}"
    );
    // In file order: the mode at the key naming the secrets file, the index.
    assert_eq!((errs[0].line, errs[0].column), (Some(14), Some(8)));
    assert!(errs[0].message.contains("group or others"), "{errs:?}");
    assert_eq!((errs[1].line, errs[1].column), (Some(24), Some(9)));
    assert_eq!((errs[2].line, errs[2].column), (Some(5), Some(6)));
}

// ---------------------------------------------------------------------------
// Secrets never show
// ---------------------------------------------------------------------------

/// Every problem of a config that must not load, as printed, one a line.
fn shown_errors(fx: &Fixture) -> String {
    let errs = errors(fx)
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!errs.is_empty());
    errs
}

/// Wrong secrets in many shapes: none of them may appear in any message.
#[test]
fn a_wrong_secret_value_never_appears_in_output() {
    let wrong = "WRONGsecretWRONGsecretWRONGsecretWRONGsec"; // 41 chars: decodes to 30 bytes
    let cases = [
        edit(
            &SECRETS_TOML,
            &[("7DSziFstzn18m4kT0DnCq0jReWQxAnkgKl6pfph4WsY", wrong)],
        ),
        edit(
            &SECRETS_TOML,
            &[("\"7DSziFstzn18m4kT0DnCq0jReWQxAnkgKl6pfph4WsY\"", wrong)],
        ),
        edit(
            &SECRETS_TOML,
            &[(
                "\"7DSziFstzn18m4kT0DnCq0jReWQxAnkgKl6pfph4WsY\"",
                &format!("\"{wrong}"),
            )],
        ),
        edit(
            &SECRETS_TOML,
            &[(
                "7DSziFstzn18m4kT0DnCq0jReWQxAnkgKl6pfph4WsY",
                &format!("{wrong}!!"),
            )],
        ),
        testkit::files::secrets_with(&format!("{wrong} = 1\n")),
        testkit::files::secrets_with(&format!("{wrong}\n")),
        testkit::files::secrets_with(&format!("secret = \"{wrong}\"\n")),
        edit(
            &SECRETS_TOML,
            &[("[hub_key]\n", &format!("[hub_key]\nsecret = \"{wrong}\"\n"))],
        ),
    ];
    let bin = env!("CARGO_BIN_EXE_lockhub");
    for secrets in cases {
        let fx = Fixture::new();
        fx.write_secrets(&secrets);
        let errs = shown_errors(&fx);
        let out = Command::new(bin)
            .arg("check-config")
            .arg(fx.hub())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let all = format!(
            "{errs}\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for needle in [
            wrong,
            &wrong[..12],
            &wrong[20..32],
            "7DSziFstzn18",
            "qTouxiikSj0x",
        ] {
            assert!(!all.contains(needle), "{needle:?} leaked in:\n{all}");
        }
    }
}

/// A reader's SCBK is the shortest secret (22 characters): pasted where a
/// key name goes, it is not shown either.
#[test]
fn a_reader_key_pasted_as_a_key_name_never_appears_in_output() {
    let scbk = "AAECAwQFBgcICQoLDA0ODw";
    for secrets in [
        testkit::files::secrets_with(&format!("\n[[reader_key]]\nreader = \"r-1\"\n{scbk} = 1\n")),
        testkit::files::secrets_with(&format!("{scbk} = 1\n")),
        testkit::files::secrets_with(&format!("{scbk} = 1\n{scbk} = 2\n")),
    ] {
        let fx = Fixture::new();
        fx.write_secrets(&secrets);
        let errs = shown_errors(&fx);
        assert!(!errs.contains(&scbk[..12]), "leaked in:\n{errs}");
    }
}

// ---------------------------------------------------------------------------
// Robustness
// ---------------------------------------------------------------------------

#[test]
fn a_valid_config_cut_at_any_byte_or_missing_any_line_loads_or_fails_without_a_panic() {
    let fx = Fixture::new();
    let text = testkit::files::hub_toml();
    for end in (0..text.len()).filter(|i| text.is_char_boundary(*i)) {
        fx.write_hub(&text[..end]);
        let _ = load(&fx);
    }
    let lines: Vec<&str> = text.lines().collect();
    for skip in 0..lines.len() {
        let without: Vec<&str> = lines
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != skip)
            .map(|(_, l)| *l)
            .collect();
        fx.write_hub(&without.join("\n"));
        let _ = load(&fx);
    }
    for end in 0..SECRETS_TOML.len() {
        fx.write_secrets(&SECRETS_TOML[..end]);
        let _ = load(&fx);
    }
}

#[test]
fn non_utf8_and_unreadable_files_are_reported() {
    let fx = Fixture::new();
    std::fs::write(fx.hub(), b"[hub]\nhub_id = \"\xff\"\n").unwrap();
    only_error(&fx, &fx.hub(), 2, 11, "not valid UTF-8");

    let missing = fx.path("missing.toml");
    let errs = config::load(&missing).unwrap_err();
    assert_eq!(errs.len(), 1);
    assert_eq!(errs.errors[0].line, None);
    assert_eq!(
        errs.to_string(),
        format!("{}: does not exist", missing.display())
    );

    let errs = config::load(fx.dir.path()).unwrap_err();
    assert_eq!(errs.len(), 1, "{errs}");
}

// ---------------------------------------------------------------------------
// lockhub check-config as a process
// ---------------------------------------------------------------------------

fn check_config(path: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lockhub"))
        .arg("check-config")
        .arg(path)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("run lockhub")
}

#[test]
fn check_config_exits_0_on_a_good_file_and_changes_nothing() {
    // A device that is there on every machine (an absent one is a warning).
    let fx = Fixture::with_hub_edits(&[("/dev/ttyAMA0", "/dev/null")]);
    let before = listing(fx.dir.path());
    let out = check_config(&fx.hub());
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stderr.is_empty());
    assert_eq!(listing(fx.dir.path()), before);
    assert!(!fx.path("data").exists());
}

#[test]
fn check_config_exits_2_with_every_problem_at_file_line_col() {
    let fx = Fixture::with_hub_edits(&[
        ("hub_id = \"hub-lobby-1\"", "hub_id = \"no spaces\""),
        ("serial = \"board-a\"", "serial = \"board-z\""),
        // Present, so that only the problems are printed.
        ("/dev/ttyAMA0", "/dev/null"),
    ]);
    set_mode(&fx.secrets(), 0o644);
    let out = check_config(&fx.hub());
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let hub = fx.hub().display().to_string();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(lines[0].starts_with(&format!("{hub}:3:10: ")), "{stderr}");
    assert!(lines[1].starts_with(&format!("{hub}:14:8: ")), "{stderr}");
    assert!(lines[2].starts_with(&format!("{hub}:23:10: ")), "{stderr}");
    for word in ["panicked", "backtrace", "RUST_BACKTRACE"] {
        assert!(!stderr.contains(word), "{stderr}");
    }
}

#[test]
fn check_config_exits_2_on_syntax_errors_and_missing_files() {
    let fx = Fixture::new();
    fx.write_hub("[hub\n");
    let out = check_config(&fx.hub());
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(&format!("{}:1:", fx.hub().display())),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    let out = check_config(&fx.path("nope.toml"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
}

fn listing(dir: &Path) -> Vec<(std::path::PathBuf, u64, std::time::SystemTime)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            (e.path(), m.len(), m.modified().unwrap())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_serial_baud_rate_that_is_not_standard_is_refused_at_its_value() {
    // 11520: a typo of 115200.
    hub_error(
        &[("baud = 115200", "baud = 11520")],
        19,
        8,
        "`baud` must be one of 9600, 19200, 38400, 57600, 115200, 230400; found 11520",
    );
}

#[test]
fn a_serial_device_absent_now_is_a_warning_at_its_line_and_the_config_is_still_valid() {
    let fx = Fixture::new();
    let absent = fx.path("ttyUSB-not-plugged-in");
    let present = fx.path("ttyUSB-here");
    std::fs::write(&present, "").unwrap();
    let hub = fx.write_hub(&testkit::files::edit(
        &testkit::files::hub_toml(),
        &[("/dev/ttyAMA0", absent.to_str().unwrap())],
    ));
    let out = check_config(&hub);
    assert_eq!(out.status.code(), Some(0), "a warning, not a problem");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{}:18:8: warning: [[serial]] `port` {} does not exist now",
            hub.display(),
            absent.display()
        )),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).ends_with(": ok\n"));

    // The device there: nothing to say.
    fx.write_hub(&testkit::files::edit(
        &testkit::files::hub_toml(),
        &[("/dev/ttyAMA0", present.to_str().unwrap())],
    ));
    let out = check_config(&hub);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

// ---------------------------------------------------------------------------
// Lock boards' link keys (docs/protocol/serial.md, "Sealed link")
// ---------------------------------------------------------------------------

/// The 1-based line of `needle`'s first occurrence in `text`.
fn line_of(text: &str, needle: &str) -> usize {
    let at = text.find(needle).unwrap_or_else(|| panic!("{needle:?}"));
    text[..at].lines().count() + usize::from(text[..at].ends_with('\n'))
}

#[test]
fn a_serial_is_keyed_or_insecure_plaintext_never_neither_nor_both() {
    // Neither: the vector's secrets have no [[board_key]].
    let fx = Fixture::new();
    fx.write_secrets(&testkit::files::read_secrets_vector());
    only_error(
        &fx,
        &fx.hub(),
        17,
        8,
        "serial `board-a` has no [[board_key]] in the secrets file",
    );
    // Insecure alone is accepted, and says so.
    let fx = Fixture::with_hub_edits(&[(
        "baud = 115200\n",
        "baud = 115200\ninsecure_plaintext = true\n",
    )]);
    fx.write_secrets(&testkit::files::read_secrets_vector());
    let c = load(&fx).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.serials[0].insecure_plaintext);
    assert!(c.board_key("board-a").is_none());
    // Both.
    let fx = Fixture::with_hub_edits(&[(
        "baud = 115200\n",
        "baud = 115200\ninsecure_plaintext = true\n",
    )]);
    only_error(
        &fx,
        &fx.hub(),
        17,
        8,
        "has `insecure_plaintext = true` and a [[board_key]]",
    );
    // The key alone: loaded, and never shown.
    let c = load(&Fixture::new()).unwrap();
    assert!(!c.serials[0].insecure_plaintext);
    let key = testkit::files::board_key_for("board-a");
    assert_eq!(c.board_key("board-a").unwrap().key, key);
    let shown = format!("{c:?}");
    assert!(
        !shown.contains(&crypto::b64u_encode(&key))
            && !shown.contains(&format!("{:?}", key[0..4].to_vec()))
    );
}

#[test]
fn a_board_key_that_is_short_zero_shared_or_for_no_serial_is_refused() {
    let b64 = crypto::b64u_encode;
    let table = |serial: &str, key: &str| {
        format!("\n[[board_key]]\nserial = \"{serial}\"\nkey = \"{key}\"\n")
    };
    let vector = testkit::files::read_secrets_vector();
    let first = vector.lines().count() + 4; // the `key` line of the first table

    let short = vector.clone() + &table("board-a", &b64(&[7u8; 31]));
    secrets_error(&short, first, 7, "`key` must be 32 bytes");
    let zero = vector.clone() + &table("board-a", &b64(&[0u8; 32]));
    secrets_error(&zero, first, 7, "all zero");
    let junk = vector.clone() + &table("board-a", "not base64!");
    secrets_error(&junk, first, 7, "not base64url");

    // Two boards with one key: the second is refused, naming the first.
    let fx = Fixture::new();
    fx.write_hub(
        &(testkit::files::hub_toml()
            + "\n[[serial]]\nname = \"board-b\"\nport = \"/dev/ttyUSB0\"\n"),
    );
    let same = b64(&testkit::files::board_key_for("board-a"));
    let text = vector.clone() + &table("board-a", &same) + &table("board-b", &same);
    fx.write_secrets(&text);
    let second = line_of(&text, "serial = \"board-b\"") + 1;
    only_error(
        &fx,
        &fx.secrets(),
        second,
        7,
        &format!("the same as serial `board-a`'s (line {first})"),
    );

    // A key for a serial the config does not have.
    let text = testkit::files::SECRETS_TOML.clone()
        + &table("board-z", &b64(&testkit::files::board_key_for("board-z")));
    let at = line_of(&text, "serial = \"board-z\"");
    secrets_error(
        &text,
        at,
        10,
        "board_key serial `board-z` is not configured",
    );

    // Twice for one serial.
    let text = testkit::files::SECRETS_TOML.clone()
        + &table("board-a", &b64(&testkit::files::board_key_for("board-z")));
    let dup_at = text.rfind("serial = \"board-a\"").unwrap();
    let dup_line = text[..dup_at].lines().count() + 1;
    secrets_error(&text, dup_line, 10, "duplicate board_key serial `board-a`");
}
