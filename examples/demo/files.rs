//! The files the demo writes for the daemon: `hub.toml`, `secrets.toml`
//! and the broker password, the way an installer would (secrets at 0600).

use super::*;

/// Secrets are written as an installer writes them (0600 from the start).
pub fn write_private(path: &Path, contents: &str) -> Result<(), Failure> {
    Ok(testkit::files::write_private(path, contents)?)
}

/// Writes hub.toml, secrets.toml, the MQTT password and the simulated
/// cloud's signing key; returns hub.toml's path.
/// Where the doors are: the board's pty link and, for step 8, the OSDP
/// reader's pty and its Secure Channel key.
pub struct Wiring<'a> {
    pub serial: &'a Path,
    /// The board's link key, as an installer types it from the board's
    /// label into `[[board_key]]` (docs/protocol/serial.md, "Keys").
    pub board_key: &'a [u8; 32],
    pub reader: Option<(&'a Path, &'a [u8; 16])>,
}

pub fn write_files(
    dir: &Path,
    port: u16,
    site_id: uuid::Uuid,
    cloud_key: &SigningKey,
    pin_key: &[u8; 32],
    doors: Wiring<'_>,
) -> Result<PathBuf, Failure> {
    let Wiring {
        serial,
        board_key,
        reader,
    } = doors;
    let hub_key: [u8; 32] = rand::random();
    let password = crypto::b64u_encode(&rand::random::<[u8; 18]>());
    let reader_key = reader
        .map(|(_, k)| {
            format!(
                "\n[[reader_key]]\nreader = \"r-201\"\nscbk = \"{}\"\n",
                crypto::b64u_encode(k)
            )
        })
        .unwrap_or_default();
    write_private(
        &dir.join("secrets.toml"),
        &testkit::files::secrets_toml(
            &hub_key,
            &[(PIN_KEY_ID, pin_key)],
            &(reader_key + &testkit::files::board_key_toml("board-a", board_key)),
        ),
    )?;
    write_private(&dir.join("mqtt-password"), &format!("{password}\n"))?;
    // Not the hub's: the simulated cloud's key, kept beside the rest so the
    // folder tells the whole story (and the test can check nothing leaks).
    write_private(
        &dir.join("cloud-signer.key"),
        &format!("{}\n", crypto::b64u_encode(&cloud_key.to_bytes())),
    )?;
    let osdp = reader
        .map(|(port, _)| {
            format!(
                "[[osdp]]\nname = \"bus-a\"\nport = \"{}\"\nbaud = 9600\n\n\
                 [[reader]]\nname = \"r-201\"\nbus = \"bus-a\"\naddress = 1\n\n\
                 [[door]]\nname = \"201\"\nreader = \"r-201\"\noutput = 0\nunlock_ms = {UNLOCK_MS}\n",
                port.display()
            )
        })
        .unwrap_or_default();
    // `board-a` is a symlink to the pseudo-terminal, as /dev/serial/by-id/...
    // is to a tty.
    let hub = testkit::files::HubToml {
        site_id: site_id.to_string(),
        hub_id: HUB_ID.into(),
        data_dir: dir.display().to_string(),
        mqtt_url: format!("mqtt://127.0.0.1:{port}"),
        mqtt_extra: format!("username = \"{HUB_ID}\"\npassword_file = \"mqtt-password\"\n"),
        trust: testkit::files::trust_signer(SIGNER_ID, &cloud_key.verifying_key()),
        serial: vec![("board-a".into(), serial.display().to_string())],
        insecure_serials: false,
        doors: DOORS
            .iter()
            .map(|(name, index)| {
                (
                    (*name).to_owned(),
                    "board-a".into(),
                    usize::from(*index),
                    u32::from(UNLOCK_MS),
                )
            })
            .collect(),
        policy: format!(
            "lockout_threshold = {LOCKOUT_THRESHOLD}\nlockout_window_s = 300\nlockout_base_s = {LOCKOUT_BASE_S}"
        ),
        extra: osdp,
    };
    let path = dir.join("hub.toml");
    std::fs::write(
        &path,
        format!(
            "# Written by the lockhub demo: a hub on loopback with a simulated board.\n{}",
            hub.render()
        ),
    )?;
    Ok(path)
}
