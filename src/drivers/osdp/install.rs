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
use super::cp::codec::{Command, NewKey};
use super::cp::{Event, Identity, Outcome, Reader, Security, Timing};
use super::packet::Deframer;
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

impl Link {
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
                    Event::SessionFault {
                        fault: super::cp::Fault::Refused,
                        ..
                    } => return Ok(SessionEnd::Refused),
                    Event::SessionFault { .. } => return Ok(SessionEnd::WrongKey),
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
pub async fn install(
    config: &Config,
    reader: &str,
    now: Timestamp,
) -> Result<Installed, InstallError> {
    let r = config
        .reader(reader)
        .ok_or_else(|| InstallError::UnknownReader(reader.to_owned()))?;
    let key: zeroize::Zeroizing<Key> = zeroize::Zeroizing::new(
        config
            .reader_key(reader)
            .ok_or_else(|| InstallError::NoKey(reader.to_owned()))?
            .scbk,
    );
    let bus = config
        .osdp
        .iter()
        .find(|b| b.name == r.bus)
        .expect("config::load checked the reader's bus");
    let port = open(&bus.port, bus.baud).map_err(|source| InstallError::Open {
        path: bus.port.display().to_string(),
        source,
    })?;
    let mut link = Link {
        port,
        deframer: Deframer::new(),
        epoch: Instant::now(),
        addr: r.address,
        baud: bus.baud,
    };
    let timing = Timing::CONTRACT;
    let own = |link: &Link| Reader::new(r.address, Security::Secure(*key), timing, link.ms());

    let installed = match link
        .session(Reader::new(r.address, Security::Install, timing, link.ms()))
        .await?
    {
        SessionEnd::Ready(mut fresh, _) => {
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
            SessionEnd::Ready(_, Some(id)) => Installed {
                identity: to_db(id),
                key_changed: false,
            },
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
