//! The cloud's state behind one narrow interface, [`Store`].
//!
//! Everything the commands and `serve` keep goes through this trait, and
//! nothing else touches SQL: the embedded default is [`SqliteStore`] (one
//! file, WAL, `synchronous=FULL`, every write in `BEGIN IMMEDIATE`), and a
//! PostgreSQL backend for a large fleet implements the same methods with the
//! same transaction boundaries.
//!
//! The one method that carries the protocol's guarantees is [`Store::mint`]:
//! the seq is taken, the event signed and stored, the cloud's view of the
//! key changed and the idempotency record written in ONE transaction, so a
//! crash leaves either all of it or none, and a seq is never skipped or
//! used twice.

mod sqlite;

pub use sqlite::SqliteStore;

use std::fmt;
use std::path::PathBuf;

/// A hub's address: its site (a UUID, lowercase hyphenated) and hub id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HubRef {
    pub site_id: String,
    pub hub_id: String,
}

impl fmt::Display for HubRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.site_id, self.hub_id)
    }
}

/// A hub's PIN key. Debug never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct PinKey {
    pub id: String,
    pub secret: [u8; 32],
}

impl fmt::Debug for PinKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinKey")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// What the cloud knows of one hub.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubRecord {
    pub hub: HubRef,
    /// Base64url of the hub's Ed25519 public key; `None` until registered
    /// (its outputs are refused until then).
    pub public_key: Option<String>,
    pub doors: Vec<String>,
    /// In order: the first is the default for new grants.
    pub pin_keys: Vec<PinKey>,
    /// The seq the next event for this hub will carry.
    pub next_seq: u64,
}

/// A signer of the ring (public parts only; the seed is in a file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignerRecord {
    pub id: String,
    pub public_key: String,
    pub created_at: String,
    /// RFC 3339; set when the signer is retired.
    pub not_after: Option<String>,
    pub active: bool,
}

/// An event as the signer made it, to be stored.
#[derive(Clone)]
pub struct Signed {
    pub event_id: String,
    pub kind: String,
    /// The exact signed body.
    pub body: Vec<u8>,
    /// The envelope to publish (and to re-send, byte for byte).
    pub envelope: Vec<u8>,
}

/// A stored event.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub hub: HubRef,
    pub seq: u64,
    pub event_id: String,
    pub kind: String,
    pub envelope: Vec<u8>,
    pub published: bool,
}

impl fmt::Debug for StoredEvent {
    // The envelope holds a body with a PIN tag: never in Debug.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoredEvent")
            .field("hub", &self.hub)
            .field("seq", &self.seq)
            .field("event_id", &self.event_id)
            .field("kind", &self.kind)
            .field("published", &self.published)
            .finish_non_exhaustive()
    }
}

/// An idempotency claim: the caller's key and the SHA-256 of the canonical
/// request it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Idempotency {
    pub key: String,
    pub request_sha256: [u8; 32],
}

/// The cloud's view of one key (no PIN, no tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub key_id: String,
    pub version: u64,
    /// `pre_issued`, `active` or `revoked`.
    pub state: String,
    pub check_in_id: Option<String>,
    pub reservation_id: Option<String>,
    pub doors: Vec<String>,
    pub valid_from: String,
    pub valid_until: String,
    pub holder_ref: Option<String>,
    /// The seq of the event that last changed it.
    pub seq: u64,
}

/// How an event changes the cloud's view of keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyChange {
    /// Nothing (`guest.erased`).
    None,
    /// A new key (its `seq` is filled in by the store). An existing key_id
    /// is [`StoreError::KeyExists`]; a second active key for a check-in is
    /// [`StoreError::ActiveKeyExists`].
    Insert(KeyRecord),
    /// The key is revoked (an unknown key_id changes nothing here: the hub
    /// keeps the tombstone).
    Revoke { key_id: String },
    /// A repair (mqtt.md 'Mirror proof'): the key's grant is signed again
    /// at `version`, so its terms now come from this event's result.
    Reissue { key_id: String, version: u64 },
    /// `checkin.completed`: the reservation's pre-issued keys are revoked,
    /// then the active key inserted.
    CheckIn {
        reservation_id: String,
        key: KeyRecord,
    },
    /// A batch's items, in order.
    Batch(Vec<KeyChange>),
}

/// One event to mint.
#[derive(Debug, Clone)]
pub struct Mint {
    pub hub: HubRef,
    pub idempotency: Option<Idempotency>,
    pub change: KeyChange,
    /// The key id the result reports (issue, checkin).
    pub key_id: Option<String>,
    /// RFC 3339 and Unix seconds of now (stored with the rows).
    pub now: String,
    pub now_unix: i64,
}

/// What [`Store::mint`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minted {
    pub seq: u64,
    pub event_id: String,
    pub key_id: Option<String>,
    /// `true` when the idempotency key had been used for this same request:
    /// nothing new was signed, and this is the stored result.
    pub replayed: bool,
    /// Whether the event is already published (a replay can find it so).
    pub published: bool,
}

/// A hub output to record.
#[derive(Debug, Clone)]
pub struct OutputRecord {
    pub hub: HubRef,
    /// `results`, `audit`, `alerts`, `sync`, `status` or `proof`.
    pub topic: String,
    /// The verified body (JSON text).
    pub body: String,
    pub audit_id: Option<String>,
    pub received_at: String,
}

/// What a recorded result did to the cloud's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultApplied {
    /// The stored event's type.
    pub kind: String,
    /// Keys the hub holds a tombstone (or a final row) for, now recorded as
    /// revoked here.
    pub revoked: Vec<String>,
}

/// A hub's last proof for a checkpoint (not a bucket answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProofSummary {
    pub head_seq: u64,
    /// `None` for a hub that said it is ahead.
    pub as_of: Option<String>,
    /// `None` for a hub that said it is ahead.
    pub matches: Option<bool>,
    pub watermark: Option<u64>,
    pub received_at: String,
}

/// A recorded output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRow {
    pub id: i64,
    pub hub: HubRef,
    pub topic: String,
    pub body: String,
    pub received_at: String,
}

/// Which recorded outputs a query wants.
#[derive(Debug, Clone, Default)]
pub struct OutputFilter {
    pub hub: Option<HubRef>,
    pub topics: Vec<String>,
    /// Rows with an id above this one (for `watch`).
    pub after_id: i64,
    /// At most this many (the newest when `newest` is set).
    pub limit: u32,
    pub newest: bool,
}

/// One line of `hubs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubSummary {
    pub hub: HubRef,
    pub registered: bool,
    /// From the last status message: `online` / `offline`.
    pub state: Option<String>,
    pub state_at: Option<String>,
    /// The last seq the cloud has signed for the hub.
    pub head_seq: u64,
    pub unpublished: u64,
    /// The highest seq the hub has sent a result for.
    pub last_result_seq: Option<u64>,
    /// The `from_seq` of the hub's last sync request.
    pub last_sync_from: Option<u64>,
    pub open_alerts: u64,
    pub last_audit_at: Option<String>,
    pub refused: u64,
    pub last_proof: Option<ProofSummary>,
}

/// The store boundary's errors. None of them carries a secret or a body.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} was written by a newer lockhub-cloud (schema {found}, this one knows {known})")]
    TooNew {
        path: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("migration {name}: {source}")]
    Migration {
        name: &'static str,
        source: rusqlite::Error,
    },
    #[error("unknown hub {0} (add it with `lockhub-cloud hub add`)")]
    UnknownHub(HubRef),
    #[error("hub {0} is already registered")]
    HubExists(HubRef),
    #[error("key {0:?} already exists on this hub (revoke it and issue a new key)")]
    KeyExists(String),
    #[error("check-in {0:?} already has an active key on this hub (revoke it first)")]
    ActiveKeyExists(String),
    #[error(
        "idempotency key {0:?} was already used for a different request on this hub; nothing changed"
    )]
    IdempotencyConflict(String),
    #[error("no active signer (run `lockhub-cloud init`)")]
    NoSigner,
    #[error("signer {0:?} already exists")]
    SignerExists(String),
    #[error("the database is not initialised (run `lockhub-cloud init`)")]
    NotInitialised,
}

impl StoreError {
    /// Whether the caller's input is at fault (exit 2), not the machine.
    pub fn is_input_problem(&self) -> bool {
        matches!(
            self,
            StoreError::UnknownHub(_)
                | StoreError::HubExists(_)
                | StoreError::KeyExists(_)
                | StoreError::ActiveKeyExists(_)
                | StoreError::IdempotencyConflict(_)
                | StoreError::SignerExists(_)
        )
    }
}

/// The cloud's state. Every method is one transaction.
pub trait Store {
    /// Adds a signer; with `retire_others_at`, the active one is retired
    /// with that `not_after` and the new one becomes active, atomically.
    fn add_signer(
        &self,
        signer: &SignerRecord,
        retire_others_at: Option<&str>,
    ) -> Result<(), StoreError>;
    /// The ring, oldest first.
    fn signers(&self) -> Result<Vec<SignerRecord>, StoreError>;

    fn add_hub(&self, hub: &HubRecord, now: &str) -> Result<(), StoreError>;
    /// Registers (or replaces) a hub's public key.
    fn set_hub_key(&self, hub: &HubRef, public_key: &str) -> Result<(), StoreError>;
    fn hub(&self, hub: &HubRef) -> Result<Option<HubRecord>, StoreError>;
    fn hubs(&self) -> Result<Vec<HubRecord>, StoreError>;
    fn key(&self, hub: &HubRef, key_id: &str) -> Result<Option<KeyRecord>, StoreError>;

    /// Takes the hub's next seq, calls `sign` with it, and stores the event,
    /// the key change and the idempotency record, all in one transaction.
    /// An idempotency key seen before with the same request returns the
    /// stored result without calling `sign`; with another request it is
    /// [`StoreError::IdempotencyConflict`] and nothing changes.
    fn mint(&self, mint: &Mint, sign: &mut dyn FnMut(u64) -> Signed) -> Result<Minted, StoreError>;
    /// Events not yet acknowledged by the broker, in seq order per hub
    /// (all hubs when `hub` is `None`), at most `limit`.
    fn unpublished(&self, hub: Option<&HubRef>, limit: u32)
    -> Result<Vec<StoredEvent>, StoreError>;
    /// The broker acknowledged these events: they and their idempotency
    /// records are done. One transaction for all of them: `serve` marks
    /// the PUBACKs that arrived together in one commit, not one each.
    fn mark_published(&self, events: &[(HubRef, u64)], now: &str) -> Result<(), StoreError>;
    /// Stored events with `seq >= from_seq`, in order, at most `limit`.
    fn events_from(
        &self,
        hub: &HubRef,
        from_seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredEvent>, StoreError>;
    /// A hub has seen every seq up to `watermark`, more than this cloud
    /// holds (a cloud restored from a backup): the counter moves past it,
    /// so no seq the hub has seen is signed again. `true` when it moved.
    fn advance_seq(&self, hub: &HubRef, watermark: u64) -> Result<bool, StoreError>;
    /// The last seq signed for the hub (0 before the first event).
    fn head_seq(&self, hub: &HubRef) -> Result<u64, StoreError>;

    /// Applies a hub's verified result to the cloud's records: the event's
    /// outcome, and for grants whether the hub took the key and where its
    /// window ends after the clamp (mqtt.md 'Mirror proof'). A grant the hub
    /// refused because it holds a tombstone, or a repair's grant for a key
    /// it holds final, records the key as revoked. `None` when the result is
    /// not for a stored event (another event_id at that seq: a cloud
    /// restored from a backup). A `stale_seq` replay or a `conflict` says
    /// nothing about the key and only counts as the result being in.
    fn record_result(
        &self,
        hub: &HubRef,
        result: &lockhub_proto::event::EventResult,
    ) -> Result<Option<ResultApplied>, StoreError>;
    /// How many stored events of the hub have no result yet. A mirror claim
    /// waits until this is 0.
    fn results_pending(&self, hub: &HubRef) -> Result<u64, StoreError>;
    /// Published events of the hub with no result yet, oldest first, at
    /// most `limit` (sent again: the hub answers a repeat with its first
    /// result).
    fn without_result(&self, hub: &HubRef, limit: u32) -> Result<Vec<StoredEvent>, StoreError>;
    /// The keys the hub should hold unless their window ended: not revoked,
    /// and not refused by the hub, with `valid_until` after the hub's clamp.
    fn claim_keys(&self, hub: &HubRef) -> Result<Vec<KeyRecord>, StoreError>;
    /// The signed body of the event that made the key's current terms
    /// (what a repair signs again).
    fn grant_body(&self, hub: &HubRef, key_id: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Deletes idempotency records created before `before_unix` whose event
    /// is published; returns how many.
    fn prune_idempotency(&self, before_unix: i64) -> Result<usize, StoreError>;

    /// Records verified outputs, in one transaction (`serve` records the
    /// messages that arrived together in one commit); returns how many
    /// were new (an audit row already recorded is a repeat).
    fn record_outputs(&self, outs: &[OutputRecord]) -> Result<usize, StoreError>;
    /// Records a refused hub message (never its payload).
    fn record_refused(
        &self,
        hub: Option<&HubRef>,
        topic: &str,
        reason: &str,
        at: &str,
    ) -> Result<(), StoreError>;
    fn outputs(&self, filter: &OutputFilter) -> Result<Vec<OutputRow>, StoreError>;
    /// The raised alerts whose latest message is not `cleared`, oldest first.
    fn open_alerts(&self, hub: Option<&HubRef>) -> Result<Vec<OutputRow>, StoreError>;
    /// The latest recorded result for the stored event at the hub's `seq`
    /// (its event_id, not only its seq).
    fn result_for(&self, hub: &HubRef, seq: u64) -> Result<Option<OutputRow>, StoreError>;
    /// The first recorded proof that matches and covers `seq` (its
    /// `head_seq` at or above it).
    fn first_matching_proof(&self, hub: &HubRef, seq: u64)
    -> Result<Option<OutputRow>, StoreError>;
    fn hub_summaries(&self) -> Result<Vec<HubSummary>, StoreError>;
}
