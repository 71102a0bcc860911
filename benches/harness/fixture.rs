//! The benchmark hub: its identity, config files, the simulated cloud that
//! signs its events, and a bulk loader for big mirrors.
//!
//! Every key here is a fixed, bench-only seed: nothing secret is involved,
//! and still no PIN, tag or secret is ever printed.

use ed25519_dalek::SigningKey;
use lockhub::config::Policy;
use lockhub::sim::cloud::Cloud;
use lockhub_proto::crypto;
use lockhub_proto::event::SchemaContext;
use lockhub_proto::sign::{GrantSpec, SignedEvent};
use lockhub_proto::time::Timestamp;
use lockhub_proto::verify::Signer;
use lockhub_proto::verify::VerifyContext;
use rusqlite::Connection;
use std::path::{Path, PathBuf};
use testkit::db::KeyRow;
use testkit::files::{HubToml, secrets_toml, trust_signer, write_private};
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
    let public = SigningKey::from_bytes(&CLOUD_SEED).verifying_key();
    let path = HubToml {
        site_id: SITE_ID.to_string(),
        hub_id: HUB_ID.into(),
        data_dir: "data".into(),
        mqtt_url: mqtt_url.into(),
        mqtt_extra: String::new(),
        trust: trust_signer(SIGNER, &public),
        serial: vec![("board-a".into(), serial_port.display().to_string())],
        insecure_serials: true,
        doors: (0..DOORS)
            .map(|i| (door_name(i), "board-a".into(), i, 3000))
            .collect(),
        policy: policy.into(),
        extra: String::new(),
    }
    .write(dir);
    write_private(
        &dir.join("secrets.toml"),
        &secrets_toml(&HUB_SEED, &[(PIN_KEY_ID, &PIN_KEY)], ""),
    )
    .expect("write secrets.toml");
    path
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
    for i in 0..n {
        let (key_id, check_in, holder, door) = (
            format!("{prefix}{i}"),
            format!("c-{prefix}{i}"),
            format!("g-{i}"),
            door_name(i),
        );
        testkit::db::insert_row(
            conn,
            &KeyRow {
                id: &key_id,
                state: "active",
                check_in_id: Some(&check_in),
                reservation_id: None,
                valid_from: now.saturating_add_secs(-3600),
                valid_until: now.saturating_add_days(30),
                pin_tag: crypto::pin_tag(&PIN_KEY, pin_for(prefix, i).as_bytes()),
                pin_key_id: PIN_KEY_ID,
                holder_ref: Some(&holder),
                holder_name: None,
                revoke_reason: None,
                updated_at: now,
                doors: &[&door],
            },
        )?;
    }
    Ok(())
}
