//! `lockhub board pair` and `lockhub board rekey` (docs/protocol/serial.md,
//! "Pairing" and "Rekey"): give a lock board its link key, or a new one,
//! over its own serial line, with the daemon stopped (it owns the port).
//!
//! Both write the key into the secrets file only after a sealed session
//! under it has verified: the board's handshake tag proves it holds the key
//! and its first sealed message proves it took the hub's confirmation. The
//! write is atomic (a 0600 file beside the secrets file, renamed over it)
//! and keeps the file's other lines as they were. Both accept a config
//! whose only problem is this serial's missing key ([`Unkeyed`]).
//!
//! The protocol is `firmware_bridge::pair`'s and the session the serial
//! driver's own (`drivers::serial::port::sealing`); this module is the I/O
//! around them and the secrets file's edit. Nothing here prints a key; the
//! pairing code is shown on purpose (the installer types it on the board).

use std::path::{Path, PathBuf};
use std::time::Duration;

use firmware_bridge::frame::decode_payload;
use firmware_bridge::pair::{HubPairStep, HubPairing, HubRekey, PairError};
use firmware_bridge::seal::SEAL_MARK;
use firmware_bridge::{Downlink, LinkKey, PayloadDecoder, Uplink, to_frame};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_serial::SerialStream;

use crate::config::{Config, ConfigErrors, Unkeyed};
use crate::drivers::serial::port::sealing::{SealEnd, SealRx};
use crate::drivers::{OpenError, OsRandom, open};

/// How long the proof (a session under the new key) may take.
const PROOF_TIMEOUT: Duration = Duration::from_secs(10);
/// A `PairStart` is sent again this often until the board answers.
const PAIR_START_EVERY: Duration = Duration::from_secs(1);
/// How long the rekey's own exchange may take (session, reply).
const REKEY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why `board pair` or `board rekey` stopped. The secrets file is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum BoardError {
    #[error("{0}")]
    Config(ConfigErrors),
    #[error("no [[serial]] named `{0}` in the config")]
    UnknownSerial(String),
    #[error(
        "serial `{0}` is `insecure_plaintext = true`: a plain board has no link key (remove the flag to pair it)"
    )]
    Insecure(String),
    #[error(
        "serial `{0}` has no [[board_key]] to rekey under: pair the board (`lockhub board pair`)"
    )]
    NoKey(String),
    #[error("{0}")]
    Open(#[from] OpenError),
    #[error("the serial line failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("pairing failed: {0}; the secrets file is unchanged")]
    Pairing(PairError),
    #[error("{0}; the secrets file is unchanged")]
    Timeout(&'static str),
    #[error("cannot write the secrets file {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot update the secrets file: {0}")]
    Secrets(String),
}

impl BoardError {
    /// 2 for a problem with the config or the request, 1 for the rest.
    pub fn exit_code(&self) -> u8 {
        match self {
            BoardError::Config(_)
            | BoardError::UnknownSerial(_)
            | BoardError::Insecure(_)
            | BoardError::NoKey(_) => 2,
            _ => 1,
        }
    }
}

/// What was done: the serial and the secrets file its key went into.
#[derive(Debug, Clone)]
pub struct Keyed {
    pub serial: String,
    pub secrets: PathBuf,
}

/// `lockhub board pair`: pairs the board on `serial` (in pairing mode) and
/// writes its new key. `show_code` gets the six digits to type on the
/// board's keypad (door 0, then '#').
pub async fn pair(
    config_path: &Path,
    serial: &str,
    show_code: &mut (dyn FnMut(&str) + Send),
) -> Result<Keyed, BoardError> {
    let config = load(config_path, serial)?;
    let mut line = Line::open(&config, serial)?;
    let t0 = Instant::now();
    let now = || u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut pairing = HubPairing::new(&mut OsRandom, now());
    line.send(&pairing.start_msg()).await?;
    let mut last_start = Instant::now();
    let mut revealed = false;
    let lk = loop {
        if let Some(p) = line.payload(Duration::from_millis(100)).await?
            && p.first() != Some(&SEAL_MARK)
            && let Ok(msg) = decode_payload::<Uplink>(&p)
        {
            match pairing.on_msg(&msg, now()).map_err(BoardError::Pairing)? {
                HubPairStep::Ignored => {}
                HubPairStep::Reveal(reveal, code) => {
                    line.send(&reveal).await?;
                    revealed = true;
                    let digits: String = code.digits().iter().map(|d| char::from(*d)).collect();
                    show_code(&digits);
                }
                HubPairStep::Paired(lk) => break lk,
            }
        }
        pairing.poll(now()).map_err(BoardError::Pairing)?;
        if !revealed && last_start.elapsed() >= PAIR_START_EVERY {
            // The same commit again: the board answers it with the same key.
            line.send(&pairing.start_msg()).await?;
            last_start = Instant::now();
        }
    };
    line.prove(&lk).await?;
    write_key(&config, serial, &lk)
}

/// `lockhub board rekey`: a new link key for the paired board on `serial`,
/// agreed inside a session under its current key.
pub async fn rekey(config_path: &Path, serial: &str) -> Result<Keyed, BoardError> {
    let config = load(config_path, serial)?;
    let old = config
        .board_key(serial)
        .map(|k| LinkKey::from_bytes(k.key))
        .ok_or_else(|| BoardError::NoKey(serial.to_owned()))?;
    let mut line = Line::open(&config, serial)?;
    let mut end = line.session(&old).await?;
    let rekey = HubRekey::new(&mut OsRandom);
    let started = Instant::now();
    let frame = end
        .seal(&rekey.start_msg(), line.now())
        .ok_or(BoardError::Timeout(
            "the session under the current key ended",
        ))?;
    line.write(&frame).await?;
    let new = loop {
        if started.elapsed() >= REKEY_TIMEOUT {
            return Err(BoardError::Timeout("the board did not answer the rekey"));
        }
        let Some(p) = line.payload(Duration::from_millis(100)).await? else {
            continue;
        };
        let t = line.now();
        if let (SealRx::Message(Uplink::RekeyReply { board_pub }), _) = end.on_payload(&p, t) {
            break rekey
                .finish(&board_pub, &old)
                .map_err(BoardError::Pairing)?;
        }
        line.drain(&mut end).await?;
    };
    // The board keeps the old key until a session under the new one
    // verifies; it answers our SealHellos under each in turn.
    line.prove(&new).await?;
    write_key(&config, serial, &new)
}

/// The config, accepting this serial's missing key; the serial must exist
/// and not be plain.
fn load(config_path: &Path, serial: &str) -> Result<Config, BoardError> {
    let config = crate::config::load_unkeyed(config_path, &Unkeyed::One(serial.to_owned()))
        .map_err(BoardError::Config)?;
    let s = config
        .serials
        .iter()
        .find(|s| s.name == serial)
        .ok_or_else(|| BoardError::UnknownSerial(serial.to_owned()))?;
    if s.insecure_plaintext {
        return Err(BoardError::Insecure(serial.to_owned()));
    }
    Ok(config)
}

/// The serial line to the board: frames out, payloads in.
struct Line {
    t0: Instant,
    io: SerialStream,
    decoder: PayloadDecoder,
    pending: std::collections::VecDeque<Vec<u8>>,
}

impl Line {
    fn open(config: &Config, serial: &str) -> Result<Line, BoardError> {
        let s = config
            .serials
            .iter()
            .find(|s| s.name == serial)
            .ok_or_else(|| BoardError::UnknownSerial(serial.to_owned()))?;
        Ok(Line {
            t0: Instant::now(),
            io: open(&s.port, s.baud)?,
            decoder: PayloadDecoder::new(),
            pending: Default::default(),
        })
    }

    /// Milliseconds since the line opened, the sealed end's clock.
    fn now(&self) -> u64 {
        u64::try_from(self.t0.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), BoardError> {
        self.io.write_all(bytes).await?;
        Ok(())
    }

    async fn send(&mut self, msg: &Downlink) -> Result<(), BoardError> {
        let f = to_frame(msg).map_err(|e| BoardError::Secrets(e.as_str().to_owned()))?;
        self.write(&f).await
    }

    /// The next payload, waiting at most `wait`.
    async fn payload(&mut self, wait: Duration) -> Result<Option<Vec<u8>>, BoardError> {
        if let Some(p) = self.pending.pop_front() {
            return Ok(Some(p));
        }
        let mut buf = [0u8; 256];
        let n = match tokio::time::timeout(wait, self.io.read(&mut buf)).await {
            Err(_) => return Ok(None),
            Ok(Ok(0)) => {
                return Err(BoardError::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the port reads end-of-file",
                )));
            }
            Ok(r) => r?,
        };
        for &b in buf.get(..n).unwrap_or_default() {
            if let Some(Ok(p)) = self.decoder.push(b) {
                self.pending.push_back(p.to_vec());
            }
        }
        Ok(self.pending.pop_front())
    }

    /// Writes what the sealed end queued (handshake frames).
    async fn drain(&mut self, end: &mut SealEnd) -> Result<(), BoardError> {
        while let Some(f) = end.pop_out() {
            self.write(&f).await?;
        }
        Ok(())
    }

    /// A sealed session under `key`, confirmed both ways: the board's tag
    /// verified and its first sealed message (its Hello) opened.
    async fn session(&mut self, key: &LinkKey) -> Result<SealEnd, BoardError> {
        let mut end = SealEnd::new(key.clone(), self.now());
        let started = Instant::now();
        let mut confirmed = false;
        loop {
            self.drain(&mut end).await?;
            if started.elapsed() >= PROOF_TIMEOUT {
                return Err(BoardError::Timeout(if confirmed {
                    "the board never spoke in the session under the key"
                } else {
                    "no session under the key: the board does not hold it"
                }));
            }
            end.poll(self.now());
            let Some(p) = self.payload(Duration::from_millis(50)).await? else {
                continue;
            };
            match end.on_payload(&p, self.now()).0 {
                SealRx::SessionStarted { .. } => confirmed = true,
                SealRx::Message(_) if confirmed => {
                    self.drain(&mut end).await?;
                    return Ok(end);
                }
                _ => {}
            }
        }
    }

    /// The proof that the board holds `key` (see [`Line::session`]).
    async fn prove(&mut self, key: &LinkKey) -> Result<(), BoardError> {
        self.session(key).await.map(drop)
    }
}

/// Writes `key` as `serial`'s `[[board_key]]` into the config's secrets
/// file: the file's text with that one value changed (or the table
/// appended), written 0600 beside it, synced, renamed over it.
fn write_key(config: &Config, serial: &str, key: &LinkKey) -> Result<Keyed, BoardError> {
    let path = config.secrets_file.clone();
    let err = |source| BoardError::Write {
        path: path.clone(),
        source,
    };
    let text = std::fs::read_to_string(&path).map_err(err)?;
    let new = crate::config::with_board_key(&text, serial, key.as_bytes())
        .map_err(BoardError::Secrets)?;
    let meta = std::fs::metadata(&path).map_err(err)?;
    write_atomic(&path, new.as_bytes(), &meta).map_err(err)?;
    Ok(Keyed {
        serial: serial.to_owned(),
        secrets: path,
    })
}

/// A private file replaced whole: a 0600 temporary beside it with the
/// original's owner, synced, renamed over it, the folder synced.
fn write_atomic(path: &Path, bytes: &[u8], was: &std::fs::Metadata) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.new", std::process::id()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        // The daemon's user keeps reading it (root may run this command).
        std::os::unix::fs::chown(&tmp, Some(was.uid()), Some(was.gid()))?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
