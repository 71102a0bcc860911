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
    pub reader: Option<(&'a Path, &'a [u8; 16])>,
}

pub fn write_files(
    dir: &Path,
    port: u16,
    site_id: uuid::Uuid,
    cloud: &Cloud,
    cloud_key: &SigningKey,
    pin_key: &[u8; 32],
    doors: Wiring<'_>,
) -> Result<PathBuf, Failure> {
    let Wiring { serial, reader } = doors;
    let hub_key: [u8; 32] = rand::random();
    let password = crypto::b64u_encode(&rand::random::<[u8; 18]>());
    write_private(
        &dir.join("secrets.toml"),
        &format!(
            "[hub_key]\nsecret = \"{}\"\n\n[[pin_key]]\nid = \"{PIN_KEY_ID}\"\nsecret = \"{}\"\n{}",
            crypto::b64u_encode(&hub_key),
            crypto::b64u_encode(pin_key),
            reader
                .map(|(_, k)| format!(
                    "\n[[reader_key]]\nreader = \"r-201\"\nscbk = \"{}\"\n",
                    crypto::b64u_encode(k)
                ))
                .unwrap_or_default()
        ),
    )?;
    write_private(&dir.join("mqtt-password"), &format!("{password}\n"))?;
    // Not the hub's: the simulated cloud's key, kept beside the rest so the
    // folder tells the whole story (and the test can check nothing leaks).
    write_private(
        &dir.join("cloud-signer.key"),
        &format!("{}\n", crypto::b64u_encode(&cloud_key.to_bytes())),
    )?;
    let mut doors = String::new();
    for (name, index) in DOORS {
        doors.push_str(&format!(
            "\n[[door]]\nname = \"{name}\"\nserial = \"board-a\"\nindex = {index}\nunlock_ms = {UNLOCK_MS}\n"
        ));
    }
    if let Some((port, _)) = reader {
        doors.push_str(&format!(
            "\n[[osdp]]\nname = \"bus-a\"\nport = \"{}\"\nbaud = 9600\n\n\
             [[reader]]\nname = \"r-201\"\nbus = \"bus-a\"\naddress = 1\n\n\
             [[door]]\nname = \"201\"\nreader = \"r-201\"\noutput = 0\nunlock_ms = {UNLOCK_MS}\n",
            port.display()
        ));
    }
    let hub = format!(
        "# Written by the lockhub demo: a hub on loopback with a simulated board.
[hub]
site_id = \"{site_id}\"
hub_id = \"{HUB_ID}\"
data_dir = \"{dir}\"

[mqtt]
url = \"mqtt://127.0.0.1:{port}\"
username = \"{HUB_ID}\"
password_file = \"mqtt-password\"

[[trust.signer]]
id = \"{SIGNER_ID}\"
public_key = \"{cloud_pub}\"

[secrets]
file = \"secrets.toml\"

[[serial]]
name = \"board-a\"
# A symlink to the pseudo-terminal, as /dev/serial/by-id/... is to a tty.
port = \"{serial}\"
baud = 115200
{doors}
[policy]
lockout_threshold = {LOCKOUT_THRESHOLD}
lockout_window_s = 300
lockout_base_s = {LOCKOUT_BASE_S}
",
        dir = dir.display(),
        cloud_pub = cloud.public_key_b64u(),
        serial = serial.display(),
    );
    let path = dir.join("hub.toml");
    std::fs::write(&path, hub)?;
    Ok(path)
}
