//! `lockhub osdp install --config FILE --reader NAME` (osdp.md, Secure
//! Channel): with the daemon stopped, open a Secure Channel with the
//! install key SCBK-D (install mode), send osdp_KEYSET with the reader's
//! own key from the secrets file, reconnect with that key to prove it, and
//! record the reader's identity (clearing `reader_replaced`).
//!
//! A reader that refuses SCBK-D but accepts its own key is already
//! installed (a re-run, or a replaced reader keyed by hand): its identity
//! is recorded the same way. This is the only place SCBK-D is ever used.

use std::time::{Duration, Instant};

use super::bus::wire::{Wire, exchange};
use super::cp::codec::cmd;
use super::cp::codec::{Command, NewKey};
use super::cp::{Event, Fault, Identity, Outcome, Reader, Security, Timing};
use super::packet::{self, Deframer};
use super::sc::Key;
use crate::config::Config;
use crate::drivers::open;
use crate::store::alerts;
use crate::store::osdp::{self as db, ReaderIdentity};
use crate::store::{Priority, Store, error::StoreError};
use lockhub_proto::outputs::Condition;
use lockhub_proto::time::Timestamp;

/// How long each step (a session with one key, the key change) may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an install failed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("no [[reader]] named `{0}` in the config")]
    UnknownReader(String),
    #[error("reader `{0}` has no [[reader_key]] in the secrets file")]
    NoKey(String),
    #[error("cannot open the bus {path}: {source} (is `lockhub run` still running? stop it first)")]
    Open {
        path: String,
        source: crate::drivers::OpenError,
    },
    #[error("bus I/O failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the reader did not answer (check its address, baud rate and wiring)")]
    NoAnswer,
    #[error(
        "the reader accepts neither the install key nor its own key: it holds another key (reset it to factory settings)"
    )]
    WrongKey,
    #[error("the reader does not offer a Secure Channel")]
    Refused,
    #[error("the reader refused the new key (osdp_KEYSET: {0:?})")]
    KeysetRefused(Outcome),
    #[error("the reader took the new key but a Secure Channel with it failed")]
    ProofFailed,
    #[error(
        "traffic on the bus before install started: another panel or `lockhub run` is talking on it; install only when the reader is alone (a bench cable, or the bus's other readers unplugged)"
    )]
    Traffic,
    #[error(
        "reader `{name}` answers at address {address} on the same bus: the key would cross the wire under the public install key with it listening; unplug the bus's other readers or use a bench cable"
    )]
    NotAlone { name: String, address: u8 },
    #[error(
        "the reader's osdp_PDID serial is {found:08x}, not {expected:08x}: not the reader you meant; no key was sent"
    )]
    SerialMismatch { expected: u32, found: u32 },
    #[error("the new key file {path}: {why}")]
    NewKeyFile { path: String, why: String },
    #[error(
        "the reader refused the new key and keeps its current one (osdp_KEYSET: {0:?}); nothing changed"
    )]
    RekeyRefused(Outcome),
    #[error("the reader kept its current key after osdp_KEYSET; nothing changed")]
    NotTaken,
    #[error(
        "the reader stopped answering after osdp_KEYSET: it holds its current key or the new one. Nothing was written; run the same rekey again once it answers (it tries both keys)"
    )]
    Unsettled,
    #[error(
        "cannot write the secrets file {path}: {source}; the reader now holds the new key from the new key file"
    )]
    SecretsWrite {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What the install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub identity: ReaderIdentity,
    /// False when the reader already had its key.
    pub key_changed: bool,
}

struct Link {
    port: tokio_serial::SerialStream,
    deframer: Deframer,
    epoch: Instant,
    addr: u8,
    baud: u32,
}

enum SessionEnd {
    Ready(Box<Reader>, Option<Identity>),
    WrongKey,
    Refused,
    Silent,
}

/// The reader's config and its key from the secrets file (wiped on drop).
fn reader_and_key<'c>(
    config: &'c Config,
    reader: &str,
) -> Result<(&'c crate::config::ReaderConfig, zeroize::Zeroizing<Key>), InstallError> {
    let r = config
        .reader(reader)
        .ok_or_else(|| InstallError::UnknownReader(reader.to_owned()))?;
    let key = config
        .reader_key(reader)
        .ok_or_else(|| InstallError::NoKey(reader.to_owned()))?
        .scbk;
    Ok((r, zeroize::Zeroizing::new(key)))
}

impl Link {
    /// Opens the reader's bus (the daemon must be stopped: it owns it).
    fn open(config: &Config, r: &crate::config::ReaderConfig) -> Result<Link, InstallError> {
        let bus = config
            .osdp
            .iter()
            .find(|b| b.name == r.bus)
            .expect("config::load checked the reader's bus");
        let port = open(&bus.port, bus.baud).map_err(|source| InstallError::Open {
            path: bus.port.display().to_string(),
            source,
        })?;
        Ok(Link {
            port,
            deframer: Deframer::new(),
            epoch: Instant::now(),
            addr: r.address,
            baud: bus.baud,
        })
    }

    fn ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Runs `reader` until its session is ready, a fault, or the timeout.
    async fn session(&mut self, mut reader: Reader) -> Result<SessionEnd, InstallError> {
        let deadline = Instant::now() + STEP_TIMEOUT;
        let mut identity = None;
        let mut answered = false;
        while Instant::now() < deadline {
            let Some(bytes) = reader.next(self.ms(), rand::random()) else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            for e in self.exchange(&mut reader, &bytes).await? {
                match e {
                    Event::Online => answered = true,
                    Event::Identity(id) => identity = Some(id),
                    Event::SessionFault { fault, .. } => match fault {
                        Fault::Refused => return Ok(SessionEnd::Refused),
                        Fault::Cryptogram => return Ok(SessionEnd::WrongKey),
                        // A broken session (a reset, a cut reply): the
                        // reader answered; it starts over after its backoff.
                        _ => answered = true,
                    },
                    _ => {}
                }
            }
            if reader.is_ready() {
                return Ok(SessionEnd::Ready(Box::new(reader), identity));
            }
        }
        Ok(if answered {
            SessionEnd::WrongKey
        } else {
            SessionEnd::Silent
        })
    }

    async fn exchange(
        &mut self,
        reader: &mut Reader,
        bytes: &[u8],
    ) -> Result<Vec<Event>, InstallError> {
        Ok(exchange(
            &mut self.port,
            reader,
            self.addr,
            &mut self.deframer,
            bytes,
            self.epoch,
            Wire {
                baud: self.baud,
                reply_timeout: Duration::from_millis(Timing::CONTRACT.reply_timeout_ms),
            },
        )
        .await?)
    }

    /// Whether anything arrives on the bus within `quiet`: install must be
    /// the only talker (osdp.md, Secure Channel).
    async fn heard(&mut self, quiet: Duration) -> Result<bool, InstallError> {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 64];
        match tokio::time::timeout(quiet, self.port.read(&mut buf)).await {
            Err(_) => Ok(false),
            Ok(Ok(n)) => Ok(n > 0),
            Ok(Err(e)) => Err(e.into()),
        }
    }

    /// Whether a reader answers a plaintext osdp_POLL at `addr` (any
    /// reply, a NAK included).
    async fn answers(&mut self, addr: u8) -> Result<bool, InstallError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let poll = packet::encode(addr, 0, &[], cmd::POLL, &[], None);
        self.port.write_all(&poll).await?;
        self.deframer.clear();
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(Timing::CONTRACT.reply_timeout_ms)
            + Duration::from_micros(10_000_000 / u64::from(self.baud.max(1)))
                * u32::try_from(packet::MAX_PACKET).unwrap_or(u32::MAX);
        let mut buf = [0u8; 256];
        loop {
            match tokio::time::timeout_at(deadline, self.port.read(&mut buf)).await {
                Err(_) | Ok(Ok(0)) => return Ok(false),
                Ok(Err(e)) => return Err(e.into()),
                Ok(Ok(n)) => {
                    if self
                        .deframer
                        .push(&buf[..n])
                        .iter()
                        .any(|p| p.is_reply() && p.addr() == addr)
                    {
                        return Ok(true);
                    }
                }
            }
        }
    }

    /// Sends one command on a ready session and waits for its outcome.
    async fn command(&mut self, reader: &mut Reader, c: Command) -> Result<Outcome, InstallError> {
        let token = reader.send(c).map_err(|_| InstallError::ProofFailed)?;
        let deadline = Instant::now() + STEP_TIMEOUT;
        while Instant::now() < deadline {
            let Some(bytes) = reader.next(self.ms(), rand::random()) else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            for e in self.exchange(reader, &bytes).await? {
                if let Event::Done { token: t, outcome } = e
                    && t == token
                {
                    return Ok(outcome);
                }
            }
        }
        Ok(Outcome::Failed)
    }
}

fn to_db(id: Identity) -> ReaderIdentity {
    ReaderIdentity {
        vendor: id.vendor,
        model: id.model,
        version: id.version,
        serial: id.serial,
        firmware: id.firmware,
    }
}

/// Installs `reader`'s key into it and records its identity.
/// Silence on the bus, before install starts, that says no one else talks.
const QUIET: Duration = Duration::from_secs(1);

/// Installs `reader`'s key into it and records its identity. Refuses,
/// before any key crosses the wire, unless the reader is alone on its bus
/// and, with `serial`, its osdp_PDID serial is that one (osdp.md, Secure
/// Channel).
pub async fn install(
    config: &Config,
    reader: &str,
    serial: Option<u32>,
    now: Timestamp,
) -> Result<Installed, InstallError> {
    let (r, key) = reader_and_key(config, reader)?;
    let mut link = Link::open(config, r)?;
    let timing = Timing::CONTRACT;
    let own = |link: &Link| Reader::new(r.address, Security::Secure(*key), timing, link.ms());

    // The only talker: nothing heard for a second, and none of the bus's
    // other configured readers answers.
    if link.heard(QUIET).await? {
        return Err(InstallError::Traffic);
    }
    for other in config
        .readers
        .iter()
        .filter(|o| o.bus == r.bus && o.name != r.name)
    {
        if link.answers(other.address).await? {
            return Err(InstallError::NotAlone {
                name: other.name.clone(),
                address: other.address,
            });
        }
    }
    let expected = |id: &Option<Identity>| match (serial, id) {
        (Some(want), Some(id)) if id.serial != want => Err(InstallError::SerialMismatch {
            expected: want,
            found: id.serial,
        }),
        _ => Ok(()),
    };

    let installed = match link
        .session(Reader::new(r.address, Security::Install, timing, link.ms()))
        .await?
    {
        SessionEnd::Ready(mut fresh, id) => {
            // Before KEYSET: the key goes to the reader meant, or nowhere.
            expected(&id)?;
            match link
                .command(&mut fresh, Command::Keyset(NewKey(*key)))
                .await?
            {
                Outcome::Ack => {}
                other => return Err(InstallError::KeysetRefused(other)),
            }
            // The proof: a new session (sequence 0) with the new key.
            match link.session(own(&link)).await? {
                SessionEnd::Ready(_, Some(id)) => Installed {
                    identity: to_db(id),
                    key_changed: true,
                },
                _ => return Err(InstallError::ProofFailed),
            }
        }
        SessionEnd::Silent => return Err(InstallError::NoAnswer),
        SessionEnd::Refused => return Err(InstallError::Refused),
        SessionEnd::WrongKey => match link.session(own(&link)).await? {
            SessionEnd::Ready(_, Some(id)) => {
                expected(&Some(id))?;
                Installed {
                    identity: to_db(id),
                    key_changed: false,
                }
            }
            SessionEnd::Silent => return Err(InstallError::NoAnswer),
            _ => return Err(InstallError::WrongKey),
        },
    };
    drop(link);

    let store = Store::open(&config.database_path(), &config.policy)?;
    let name = reader.to_owned();
    let id = installed.identity;
    let written = store
        .write(Priority::Bulk, move |c| {
            db::record_identity(c, &name, &id, now)?;
            alerts::clear(c, Condition::ReaderReplaced, &name, now)?;
            Ok(())
        })
        .await;
    store.close();
    written?;
    Ok(installed)
}

/// How long the proof after osdp_KEYSET keeps trying the new key, and the
/// current one, while the reader does not answer.
const PROOF_WINDOW: Duration = Duration::from_secs(30);

/// What a rekey did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rekeyed {
    /// osdp_KEYSET under the current key, then a session with the new one.
    Changed,
    /// An earlier rekey had already given the reader the new key (it was
    /// not written then): proven and written now.
    AlreadyNew,
}

/// `lockhub osdp rekey` (osdp.md, Secure Channel): with the daemon stopped,
/// opens a Secure Channel with `reader`'s current key, sends osdp_KEYSET
/// with the key in `new_key_file` inside it, proves the new key with a new
/// session, and only then writes it to the secrets file (atomically, mode
/// 0600). A failure before the proof leaves the current key working on both
/// sides; a reader that stops answering after osdp_KEYSET is tried with
/// both keys, so whichever it holds is found and nothing is written on a
/// guess.
pub async fn rekey(
    config: &Config,
    reader: &str,
    new_key_file: &std::path::Path,
) -> Result<Rekeyed, InstallError> {
    let (r, old) = reader_and_key(config, reader)?;
    let new = read_new_key(config, reader, &old, new_key_file)?;
    let mut link = Link::open(config, r)?;
    let timing = Timing::CONTRACT;
    let with =
        |link: &Link, k: &Key| Reader::new(r.address, Security::Secure(*k), timing, link.ms());

    let done = match link.session(with(&link, &old)).await? {
        SessionEnd::Ready(mut current, _) => {
            // Refused: the reader keeps the current key. Taken, or no
            // answer (taken or not): the proof decides.
            if let Outcome::Nak(n) = link
                .command(&mut current, Command::Keyset(NewKey(*new)))
                .await?
            {
                return Err(InstallError::RekeyRefused(Outcome::Nak(n)));
            }
            drop(current);
            let deadline = Instant::now() + PROOF_WINDOW;
            loop {
                if let SessionEnd::Ready(..) = link.session(with(&link, &new)).await? {
                    break Rekeyed::Changed;
                }
                if let SessionEnd::Ready(..) = link.session(with(&link, &old)).await? {
                    return Err(InstallError::NotTaken);
                }
                if Instant::now() >= deadline {
                    return Err(InstallError::Unsettled);
                }
            }
        }
        SessionEnd::Refused => return Err(InstallError::Refused),
        // Not the current key: an earlier rekey may have given it the new
        // one and stopped before writing it.
        SessionEnd::WrongKey | SessionEnd::Silent => match link.session(with(&link, &new)).await? {
            SessionEnd::Ready(..) => Rekeyed::AlreadyNew,
            SessionEnd::Silent => return Err(InstallError::NoAnswer),
            _ => return Err(InstallError::WrongKey),
        },
    };
    drop(link);
    write_secrets(config, reader, &new)?;
    Ok(done)
}

/// The new key: base64url of 16 bytes (as `scbk` is written), from a file
/// only its owner can read, and a key fit to be a reader's (osdp.md: not
/// SCBK-D, not all zero, not the current one, not another reader's).
fn read_new_key(
    config: &Config,
    reader: &str,
    old: &Key,
    path: &std::path::Path,
) -> Result<zeroize::Zeroizing<Key>, InstallError> {
    use std::os::unix::fs::PermissionsExt;
    let bad = |why: &str| InstallError::NewKeyFile {
        path: path.display().to_string(),
        why: why.to_owned(),
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(&e.to_string()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(bad("group or others can read it (chmod 600)"));
    }
    let text =
        zeroize::Zeroizing::new(std::fs::read_to_string(path).map_err(|e| bad(&e.to_string()))?);
    let bytes = zeroize::Zeroizing::new(
        lockhub_proto::crypto::b64u_decode(text.trim())
            .ok_or_else(|| bad("not base64url of 16 bytes (22 characters)"))?,
    );
    let key: Key = bytes
        .as_slice()
        .try_into()
        .map_err(|_| bad("not 16 bytes (base64url, 22 characters)"))?;
    let key = zeroize::Zeroizing::new(key);
    if *key == crate::config::SCBK_D || key.iter().all(|&b| b == 0) {
        return Err(bad(
            "SCBK-D or all zero: give the reader its own random key",
        ));
    }
    if *key == *old {
        return Err(bad("the reader's current key"));
    }
    if config
        .secrets
        .reader_keys
        .iter()
        .any(|k| k.reader != reader && k.scbk == *key)
    {
        return Err(bad("another reader's key"));
    }
    Ok(key)
}

/// Writes the secrets file with `reader`'s new key: a temporary file
/// beside it at mode 0600, synced, renamed over it, the folder synced.
fn write_secrets(config: &Config, reader: &str, key: &Key) -> Result<(), InstallError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = &config.secrets_file;
    let err = |source| InstallError::SecretsWrite {
        path: path.display().to_string(),
        source,
    };
    let text = zeroize::Zeroizing::new(std::fs::read_to_string(path).map_err(err)?);
    let updated = zeroize::Zeroizing::new(
        crate::config::with_reader_key(&text, reader, key).ok_or_else(|| {
            err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "it changed since the config was read, or has no [[reader_key]] for this reader",
            ))
        })?,
    );
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let tmp = dir.join(format!(
        ".{}.rekey",
        path.file_name()
            .map_or("secrets".into(), |n| n.to_string_lossy())
    ));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(updated.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(err)
}
