//! The benchmark hub: its identity, config files, the simulated cloud that
//! signs its events, and a bulk loader for big mirrors.
//!
//! Every key here is a fixed, bench-only seed: nothing secret is involved,
//! and still no PIN, tag or secret is ever printed.

use ed25519_dalek::SigningKey;
use lockhub::config::{Policy, Signer};
use lockhub::crypto;
use lockhub::event::SchemaContext;
use lockhub::sim::cloud::{Cloud, GrantSpec, SignedEvent};
use lockhub::time::Timestamp;
use lockhub::verify::VerifyContext;
use rusqlite::{Connection, params};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use uuid::Uuid;

pub const SITE_ID: Uuid = Uuid::from_u128(0x6f1c_1c0e_8a51_4d39_9d2e_6a3c_5a7d_9e10);
pub const HUB_ID: &str = "hub-bench";
pub const SIGNER: &str = "cloud-bench";
pub const PIN_KEY_ID: &str = "k1";
/// Doors of the bench hub: `d0`..`d15`, board indices 0..15 on one serial
/// (a full board: the door scenario needs every door to stay within
/// serial.md's flood limit of 4 entries a second per door).
pub const DOORS: usize = 16;

const CLOUD_SEED: [u8; 32] = [7; 32];
const HUB_SEED: [u8; 32] = [11; 32];
const PIN_KEY: [u8; 32] = [5; 32];

pub fn door_name(i: usize) -> String {
    format!("d{}", i % DOORS)
}

pub fn pin_key() -> (&'static str, &'static [u8; 32]) {
    (PIN_KEY_ID, &PIN_KEY)
}

/// Key `i`'s PIN: unique per key, 8 digits. Bench data, never printed.
pub fn pin(i: usize) -> String {
    pin_for("k", i)
}

/// Key `prefix{i}`'s PIN: each prefix has its own range, so keys loaded
/// with plain SQL (`p`) and keys sent as events (`k`, `r`) never collide
/// on a (door, PIN).
pub fn pin_for(prefix: &str, i: usize) -> String {
    let base = match prefix {
        "p" => 20_000_000,
        "r" => 30_000_000,
        _ => 10_000_000,
    };
    format!("{:08}", base + i)
}

/// The bench hub's public key, as its cloud registered it.
pub fn hub_public_key() -> ed25519_dalek::VerifyingKey {
    SigningKey::from_bytes(&HUB_SEED).verifying_key()
}

pub fn cloud() -> Cloud {
    Cloud::new(SigningKey::from_bytes(&CLOUD_SEED), SIGNER, SITE_ID, HUB_ID)
}

pub fn ring() -> Vec<Signer> {
    vec![Signer {
        id: SIGNER.into(),
        public_key: SigningKey::from_bytes(&CLOUD_SEED).verifying_key(),
        not_after: None,
    }]
}

pub fn verify_ctx(ring: &[Signer]) -> VerifyContext<'_> {
    VerifyContext {
        ring,
        site_id: SITE_ID,
        hub_id: HUB_ID,
        now: Timestamp::now_system(),
    }
}

pub fn schema() -> SchemaContext {
    SchemaContext::new((0..DOORS).map(door_name), [PIN_KEY_ID.to_owned()])
}

/// An active key `i` on door `i % DOORS`, with its own check-in.
pub fn grant(prefix: &str, i: usize) -> GrantSpec {
    GrantSpec::active(
        &format!("{prefix}{i}"),
        &format!("c-{prefix}{i}"),
        &door_name(i),
        &pin_for(prefix, i),
        pin_key(),
    )
}

/// `n` signed `key.issued` events for keys `prefix0..`, seqs from the
/// cloud's counter. Signing happens here, before any timing.
pub fn issue_events(cloud: &mut Cloud, prefix: &str, n: usize) -> Vec<SignedEvent> {
    (0..n)
        .map(|i| cloud.key_issued(&grant(prefix, i), &[]))
        .collect()
}

/// `ceil(n / per)` signed `batch` events holding `n` keys.
pub fn batch_events(cloud: &mut Cloud, prefix: &str, n: usize, per: usize) -> Vec<SignedEvent> {
    let grants: Vec<GrantSpec> = (0..n).map(|i| grant(prefix, i)).collect();
    grants.chunks(per).map(|c| cloud.batch_issue(c)).collect()
}

/// Writes `hub.toml` and `secrets.toml` (0600) into `dir`; the database goes
/// to `dir/data`. `serial_port` is the pty the board simulator holds.
pub fn write_config(dir: &Path, mqtt_url: &str, serial_port: &Path, policy: &str) -> PathBuf {
    let b64 = crypto::b64u_encode;
    let public = b64(SigningKey::from_bytes(&CLOUD_SEED)
        .verifying_key()
        .as_bytes());
    let mut doors = String::new();
    for i in 0..DOORS {
        doors.push_str(&format!(
            "[[door]]\nname = \"{}\"\nserial = \"board-a\"\nindex = {i}\nunlock_ms = 3000\n\n",
            door_name(i)
        ));
    }
    let hub = format!(
        "[hub]\nsite_id = \"{SITE_ID}\"\nhub_id = \"{HUB_ID}\"\ndata_dir = \"data\"\n\n\
         [mqtt]\nurl = \"{mqtt_url}\"\n\n\
         [[trust.signer]]\nid = \"{SIGNER}\"\npublic_key = \"{public}\"\n\n\
         [secrets]\nfile = \"secrets.toml\"\n\n\
         [[serial]]\nname = \"board-a\"\nport = \"{port}\"\nbaud = 115200\n\n\
         {doors}[policy]\n{policy}\n",
        port = serial_port.display(),
    );
    let secrets = format!(
        "[hub_key]\nsecret = \"{}\"\n\n[[pin_key]]\nid = \"{PIN_KEY_ID}\"\nsecret = \"{}\"\n",
        b64(&HUB_SEED),
        b64(&PIN_KEY)
    );
    let hub_path = dir.join("hub.toml");
    std::fs::write(&hub_path, hub).expect("write hub.toml");
    let sec = dir.join("secrets.toml");
    std::fs::write(&sec, secrets).expect("write secrets.toml");
    std::fs::set_permissions(&sec, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    hub_path
}

/// A lockout threshold no benchmark reaches, so lockouts never interfere.
pub const NO_LOCKOUT_POLICY: &str = "lockout_threshold = 1000000\n";

pub fn default_policy() -> Policy {
    Policy::default()
}

/// Loads keys `0..n` straight into `conn` with plain SQL: a `keys` row, then
/// its `key_doors` row, so every trigger of the schema runs as it would for
/// an applied event. Key `i` opens door `i % DOORS` with [`pin`]`(i)`.
/// Run it as one job on the store's writer: that job is one transaction.
pub fn bulk_load_keys(conn: &Connection, prefix: &str, n: usize) -> rusqlite::Result<()> {
    let now = Timestamp::now_system();
    let from = now.saturating_add_secs(-3600).0;
    let until = now.saturating_add_days(30).0;
    {
        let mut key = conn.prepare(
            "INSERT INTO keys (key_id, version, state, check_in_id, valid_from, valid_until,
                               pin_tag, pin_key_id, holder_ref, updated_at)
             VALUES (?1, 1, 'active', ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        )?;
        let mut door = conn.prepare(
            "INSERT INTO key_doors (key_id, door, pin_tag, live) VALUES (?1, ?2, ?3, 1)",
        )?;
        for i in 0..n {
            let key_id = format!("{prefix}{i}");
            let tag = crypto::pin_tag(&PIN_KEY, pin_for(prefix, i).as_bytes());
            key.execute(params![
                key_id,
                format!("c-{prefix}{i}"),
                from,
                until,
                &tag[..],
                PIN_KEY_ID,
                format!("g-{i}"),
                now.0
            ])?;
            door.execute(params![key_id, door_name(i), &tag[..]])?;
        }
    }
    Ok(())
}
