//! The signer ring: which Ed25519 key signs new events, and the retired
//! ones the hubs' trust rings still carry until their `not_after`.
//!
//! A signer's seed never enters the database or a log: it is one 0600 file,
//! `<db>.signers/<id>.key` (the folder 0700), created by `open(2)` with that
//! mode and never rewritten. The database keeps the public half, the
//! created and `not_after` instants, and which signer is active. Back up
//! the folder with the database.

use crate::store::{SignerRecord, Store, StoreError};
use ed25519_dalek::SigningKey;
use lockhub_proto::crypto::{b64u_decode_32, b64u_encode};
use rand::TryRng;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The signer boundary's errors. None carries key material.
#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0} holds no valid signer seed (base64url of 32 bytes)")]
    BadKeyFile(PathBuf),
    #[error("signer id {0:?}: use 1..=64 of [A-Za-z0-9._-]")]
    BadId(String),
    #[error("the operating system's random number generator failed: {0}")]
    Random(String),
}

/// The signer that signs new events. Debug never shows the key.
pub struct ActiveSigner {
    pub id: String,
    pub key: SigningKey,
}

impl std::fmt::Debug for ActiveSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActiveSigner")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// The folder of seed files beside `db`.
pub fn key_dir(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_owned();
    name.push(".signers");
    db.with_file_name(name)
}

fn key_file(db: &Path, id: &str) -> PathBuf {
    key_dir(db).join(format!("{id}.key"))
}

/// Makes a fresh signer: its seed file (0600, never overwritten) and its
/// public record. `retire_at` retires the active one in the same
/// transaction as the new one becomes active (`signer rotate`).
pub fn create(
    store: &dyn Store,
    db: &Path,
    id: &str,
    now: &str,
    retire_at: Option<&str>,
) -> Result<SignerRecord, SignerError> {
    if !lockhub_proto::event::is_key_id(id) {
        return Err(SignerError::BadId(id.to_owned()));
    }
    let mut seed = [0u8; 32];
    rand::rngs::SysRng
        .try_fill_bytes(&mut seed)
        .map_err(|e| SignerError::Random(e.to_string()))?;
    let key = SigningKey::from_bytes(&seed);
    let dir = key_dir(db);
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| SignerError::Io { path, source }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io(&dir))?;
    let path = key_file(db, id);
    let record = SignerRecord {
        id: id.to_owned(),
        public_key: b64u_encode(key.verifying_key().as_bytes()),
        created_at: now.to_owned(),
        not_after: None,
        active: true,
    };
    // The row first: an id already in the ring is refused before its seed
    // file could be touched. A crash after the row and before the file
    // leaves a signer that cannot sign, which `load_active` reports.
    store.add_signer(&record, retire_at)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(io(&path))?;
    writeln!(f, "{}", b64u_encode(&seed)).map_err(io(&path))?;
    f.sync_all().map_err(io(&path))?;
    Ok(record)
}

/// The active signer with its key, read from its seed file.
pub fn load_active(store: &dyn Store, db: &Path) -> Result<ActiveSigner, SignerError> {
    let active = store
        .signers()?
        .into_iter()
        .find(|s| s.active)
        .ok_or(StoreError::NoSigner)?;
    let path = key_file(db, &active.id);
    let text = std::fs::read_to_string(&path).map_err(|source| SignerError::Io {
        path: path.clone(),
        source,
    })?;
    let seed = b64u_decode_32(text.trim()).ok_or_else(|| SignerError::BadKeyFile(path.clone()))?;
    let key = SigningKey::from_bytes(&seed);
    if b64u_encode(key.verifying_key().as_bytes()) != active.public_key {
        return Err(SignerError::BadKeyFile(path));
    }
    Ok(ActiveSigner { id: active.id, key })
}
