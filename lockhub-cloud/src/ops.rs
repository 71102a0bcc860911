//! The cloud's operations over a [`Store`]: set up the signer ring, add
//! hubs, and mint events (issue, checkin, revoke, erase, batch), each one
//! checked first, then signed and stored with its seq in one transaction.
//! Publishing is the caller's (`serve`, or a command given a broker).

use crate::reconcile::{self, Repair};
use crate::request::{Grant, GrantCommand, GrantRequest, InputError, check_grant, check_id};
use crate::signer::{self, ActiveSigner, SignerError};
use crate::store::{
    HubRecord, HubRef, KeyChange, KeyRecord, Mint, Minted, PinKey, Signed, SignerRecord, Store,
    StoreError,
};
use lockhub_proto::bundle::{BUNDLE_VERSION, Bundle, MqttSpec, PinKeySpec, TrustSpec};
use lockhub_proto::crypto::sha256;
use lockhub_proto::event::{SchemaContext, parse_body};
use lockhub_proto::mirror::{Claim, MirrorDigest, unix_seconds};
use lockhub_proto::sign::{EventSigner, GrantSpec, fields};
use lockhub_proto::time::Timestamp;
use serde_json::{Value, json};
use std::path::Path;

/// The most items a batch may hold (mqtt.md).
pub const MAX_BATCH_ITEMS: usize = 500;

/// The operations' errors: the caller's input (exit 2) or the machine.
#[derive(Debug, thiserror::Error)]
pub enum CloudError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Signer(#[from] SignerError),
    #[error(transparent)]
    Mqtt(#[from] crate::mqtt::MqttError),
    #[error("{path}: {detail}")]
    File {
        path: std::path::PathBuf,
        detail: String,
    },
    #[error("already initialised (signer {0} is active); use `signer rotate` for a new key")]
    AlreadyInitialised(String),
    #[error("no {what} for seq {seq} within {waited_s} s (is `serve` running and the hub online?)")]
    Unproven {
        seq: u64,
        waited_s: u64,
        what: String,
    },
}

impl CloudError {
    /// The process's exit code: 2 for the caller's input, 3 when
    /// `--wait-proof` saw no proof in time, 1 for anything else.
    pub fn exit_code(&self) -> u8 {
        if self.is_input_problem() {
            2
        } else if matches!(self, CloudError::Unproven { .. }) {
            3
        } else {
            1
        }
    }

    /// Whether the caller's input is at fault: exit 2 rather than 1.
    pub fn is_input_problem(&self) -> bool {
        match self {
            CloudError::Input(_) | CloudError::AlreadyInitialised(_) => true,
            CloudError::Store(e) | CloudError::Signer(SignerError::Store(e)) => {
                e.is_input_problem()
            }
            CloudError::Signer(SignerError::BadId(_)) => true,
            CloudError::Mqtt(crate::mqtt::MqttError::Url(_)) => true,
            _ => false,
        }
    }
}

fn now_parts(now: Timestamp) -> (String, i64) {
    (
        now.to_rfc3339(),
        now.0.div_euclid(Timestamp::MICROS_PER_SEC),
    )
}

/// A signer id from the date: `cloud-YYYY-MM-DD`.
pub fn default_signer_id(now: Timestamp) -> String {
    format!("cloud-{}", &now.to_rfc3339()[..10])
}

/// `init`: the first signer of the ring.
pub fn init(
    store: &dyn Store,
    db: &Path,
    signer_id: Option<&str>,
    now: Timestamp,
) -> Result<SignerRecord, CloudError> {
    if let Some(active) = store.signers()?.into_iter().find(|s| s.active) {
        return Err(CloudError::AlreadyInitialised(active.id));
    }
    let id = signer_id.map_or_else(|| default_signer_id(now), str::to_owned);
    Ok(signer::create(store, db, &id, &now.to_rfc3339(), None)?)
}

/// `signer rotate`: a new active signer; the old one stays valid until
/// `now + overlap_days`, long enough for every hub's trust ring to take the
/// new key (a new bundle, or an edited hub.toml) before the old one ends.
pub fn rotate(
    store: &dyn Store,
    db: &Path,
    signer_id: Option<&str>,
    overlap_days: u32,
    now: Timestamp,
) -> Result<SignerRecord, CloudError> {
    let id = signer_id.map_or_else(|| default_signer_id(now), str::to_owned);
    let not_after = now
        .saturating_add_days(i64::from(overlap_days))
        .to_rfc3339();
    Ok(signer::create(
        store,
        db,
        &id,
        &now.to_rfc3339(),
        Some(&not_after),
    )?)
}

/// A hub to add.
#[derive(Debug, Clone)]
pub struct NewHub {
    pub hub: HubRef,
    pub public_key: Option<String>,
    pub doors: Vec<String>,
    pub pin_keys: Vec<PinKey>,
}

/// `hub add`: checks names and keys, then stores the hub.
pub fn add_hub(store: &dyn Store, new: &NewHub, now: Timestamp) -> Result<HubRecord, CloudError> {
    if let Some(k) = &new.public_key {
        lockhub_proto::crypto::parse_public_key(k.trim()).map_err(|e| {
            InputError::Invalid(format!("--public-key: {e} (base64url of 32 bytes)"))
        })?;
    }
    for d in &new.doors {
        if !lockhub_proto::event::is_name(d) {
            return Err(InputError::BadId {
                what: "door name",
                value: d.clone(),
            }
            .into());
        }
    }
    if new.pin_keys.is_empty() {
        return Err(InputError::Invalid("a hub needs at least one PIN key".into()).into());
    }
    for (n, k) in new.pin_keys.iter().enumerate() {
        check_id("PIN key id", &k.id)?;
        if new.pin_keys[..n].iter().any(|o| o.id == k.id) {
            return Err(InputError::Invalid(format!("PIN key {:?} is given twice", k.id)).into());
        }
    }
    let record = HubRecord {
        hub: new.hub.clone(),
        public_key: new.public_key.as_ref().map(|k| k.trim().to_owned()),
        doors: new.doors.clone(),
        pin_keys: new.pin_keys.clone(),
        next_seq: 1,
    };
    store.add_hub(&record, &now.to_rfc3339())?;
    Ok(record)
}

/// The provisioning bundle for `hub` (what `lockhub provision --bundle`
/// reads): the hardware of `template` when given (its serials, doors,
/// readers, broker), `mqtt_url` when given, the hub's PIN keys, and the
/// trust ring: every signer not yet past its `not_after`.
pub fn bundle_for(
    hub: &HubRecord,
    ring: &[SignerRecord],
    template: Option<Bundle>,
    mqtt_url: Option<&str>,
    now: Timestamp,
) -> Result<Bundle, CloudError> {
    let mut b = template.unwrap_or_else(|| Bundle {
        v: BUNDLE_VERSION,
        site_id: hub.hub.site_id.clone(),
        hub_id: hub.hub.hub_id.clone(),
        mqtt: MqttSpec::default(),
        trust: Vec::new(),
        serials: Vec::new(),
        doors: Vec::new(),
        pin_keys: Vec::new(),
        osdp: Vec::new(),
        readers: Vec::new(),
        reader_doors: Vec::new(),
    });
    if let Some(url) = mqtt_url {
        b.mqtt.url = url.to_owned();
    }
    if b.mqtt.url.is_empty() {
        return Err(InputError::Invalid(
            "a bundle needs the hub's broker: give --mqtt-url (or a --bundle template with one)"
                .into(),
        )
        .into());
    }
    b.trust = ring
        .iter()
        .filter(|s| {
            s.not_after
                .as_deref()
                .is_none_or(|t| Timestamp::parse_rfc3339(t).is_ok_and(|t| t > now))
        })
        .map(|s| TrustSpec {
            id: s.id.clone(),
            public_key: s.public_key.clone(),
            not_after: s.not_after.clone(),
        })
        .collect();
    if b.trust.is_empty() {
        return Err(StoreError::NoSigner.into());
    }
    b.pin_keys = hub
        .pin_keys
        .iter()
        .map(|k| PinKeySpec {
            id: k.id.clone(),
            secret: lockhub_proto::crypto::b64u_encode(&k.secret),
        })
        .collect();
    Ok(b)
}

/// The door names a bundle gives its hub (board and reader doors).
pub fn bundle_doors(b: &Bundle) -> Vec<String> {
    b.doors
        .iter()
        .map(|d| d.name.clone())
        .chain(b.reader_doors.iter().map(|d| d.name.clone()))
        .collect()
}

/// `hub set-key`: registers the public key `lockhub provision` printed.
pub fn set_hub_key(store: &dyn Store, hub: &HubRef, public_key: &str) -> Result<(), CloudError> {
    lockhub_proto::crypto::parse_public_key(public_key.trim())
        .map_err(|e| InputError::Invalid(format!("public key: {e} (base64url of 32 bytes)")))?;
    Ok(store.set_hub_key(hub, public_key.trim())?)
}

/// The hub, or [`StoreError::UnknownHub`].
pub fn hub(store: &dyn Store, hub: &HubRef) -> Result<HubRecord, CloudError> {
    store
        .hub(hub)?
        .ok_or_else(|| StoreError::UnknownHub(hub.clone()).into())
}

fn site_uuid(hub: &HubRef) -> uuid::Uuid {
    // HubRef's site is a parsed UUID (request::parse_hub_ref).
    uuid::Uuid::parse_str(&hub.site_id).unwrap_or_default()
}

/// The proto signer for one hub.
pub fn event_signer(active: &ActiveSigner, hub: &HubRef) -> EventSigner {
    EventSigner::new(active.key.clone(), &active.id, site_uuid(hub), &hub.hub_id)
}

fn signed(ev: lockhub_proto::sign::SignedEvent, kind: &str) -> Signed {
    Signed {
        event_id: ev.event_id.to_string(),
        kind: kind.to_owned(),
        body: ev.body,
        envelope: ev.envelope,
    }
}

/// Signs a throwaway copy with the next seq and reads its body with the
/// hub's own step-4 parser: the cloud never signs, and never spends a seq
/// on, an event the hub would refuse as malformed.
fn check_with_hub_rules(
    signer: &EventSigner,
    hub: &HubRecord,
    kind: &str,
    fields: &Value,
) -> Result<(), InputError> {
    let ctx = SchemaContext::new(
        hub.doors.iter().cloned(),
        hub.pin_keys.iter().map(|k| k.id.clone()),
    );
    let probe = signer.sign(
        uuid::Uuid::new_v4(),
        Timestamp::now_system(),
        kind,
        Some(hub.next_seq.max(1)),
        fields.clone(),
    );
    parse_body(&probe.body, &ctx).map(|_| ()).map_err(|e| {
        InputError::HubWouldRefuse(match e.item {
            Some(i) => format!("{} at item {i}", e.reason.as_str()),
            None => e.reason.as_str().to_owned(),
        })
    })
}

/// One event to mint, before its seq.
struct Draft {
    kind: &'static str,
    fields: Value,
    change: KeyChange,
    key_id: Option<String>,
    idempotency: Option<crate::store::Idempotency>,
}

impl Draft {
    fn new(kind: &'static str, fields: Value, change: KeyChange) -> Self {
        Draft {
            kind,
            fields,
            change,
            key_id: None,
            idempotency: None,
        }
    }
}

fn mint(
    store: &dyn Store,
    active: &ActiveSigner,
    hub: &HubRecord,
    d: Draft,
    now: Timestamp,
) -> Result<Minted, CloudError> {
    let signer = event_signer(active, &hub.hub);
    check_with_hub_rules(&signer, hub, d.kind, &d.fields)?;
    let (now_s, now_unix) = now_parts(now);
    let m = Mint {
        hub: hub.hub.clone(),
        idempotency: d.idempotency,
        change: d.change,
        key_id: d.key_id,
        now: now_s,
        now_unix,
    };
    let (kind, fields) = (d.kind, d.fields);
    Ok(store.mint(&m, &mut |seq| {
        let ev = signer.sign(
            uuid::Uuid::new_v4(),
            Timestamp::now_system(),
            kind,
            Some(seq),
            fields.clone(),
        );
        signed(ev, kind)
    })?)
}

fn grant_spec(g: &Grant) -> GrantSpec {
    GrantSpec {
        key_id: g.key_id.clone(),
        version: 1,
        state: g.state,
        doors: g.doors.clone(),
        valid_from: g.valid_from,
        valid_until: g.valid_until,
        pin_tag: g.pin_tag,
        pin_key_id: g.pin_key_id.clone(),
        check_in_id: g.check_in_id.clone(),
        reservation_id: g.reservation_id.clone(),
        holder_ref: g.holder_ref.clone(),
        holder_name: None,
        schedule: g.schedule.clone(),
        max_uses: g.max_uses,
    }
}

fn key_record(g: &Grant) -> KeyRecord {
    KeyRecord {
        key_id: g.key_id.clone(),
        version: 1,
        state: g.state.to_owned(),
        check_in_id: g.check_in_id.clone(),
        reservation_id: g.reservation_id.clone(),
        doors: g.doors.clone(),
        valid_from: g.valid_from.to_rfc3339(),
        valid_until: g.valid_until.to_rfc3339(),
        holder_ref: g.holder_ref.clone(),
        seq: 0,
    }
}

/// A fresh key id: `k-` and a random UUID's 32 hex digits.
pub fn new_key_id() -> String {
    format!("k-{}", uuid::Uuid::new_v4().simple())
}

/// The type-specific fields and the key change of a checked grant.
fn grant_event(g: &Grant) -> (&'static str, Value, KeyChange) {
    let spec = grant_spec(g);
    match g.command {
        GrantCommand::Issue => (
            "key.issued",
            fields::key_issued(&spec, &[]),
            KeyChange::Insert(key_record(g)),
        ),
        GrantCommand::CheckIn => {
            let reservation_id = g.reservation_id.clone().unwrap_or_default();
            let check_in_id = g.check_in_id.as_deref().unwrap_or_default();
            (
                "checkin.completed",
                fields::checkin_completed(&reservation_id, check_in_id, &spec),
                KeyChange::CheckIn {
                    reservation_id,
                    key: key_record(g),
                },
            )
        }
    }
}

/// `issue` and `checkin`: one key, idempotent on the request's key.
pub fn grant(
    store: &dyn Store,
    active: &ActiveSigner,
    req: &GrantRequest,
    now: Timestamp,
) -> Result<Minted, CloudError> {
    let hub = hub(store, &req.hub)?;
    let g = check_grant(req, &hub, now, new_key_id)?;
    let (kind, fields, change) = grant_event(&g);
    let draft = Draft {
        key_id: Some(g.key_id.clone()),
        idempotency: Some(g.idempotency.clone()),
        ..Draft::new(kind, fields, change)
    };
    mint(store, active, &hub, draft, now)
}

/// What `revoke` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revoked {
    Minted(Minted),
    /// The cloud's view already has the key revoked: nothing new signed.
    AlreadyRevoked {
        seq: u64,
    },
}

/// `revoke`: a `key.revoked` for the key (also one the cloud never issued:
/// the hub then keeps a tombstone, so a late grant for it is refused).
pub fn revoke(
    store: &dyn Store,
    active: &ActiveSigner,
    hub_ref: &HubRef,
    key_id: &str,
    reason: &str,
    now: Timestamp,
) -> Result<Revoked, CloudError> {
    check_id("key id", key_id)?;
    check_id("reason", reason)?;
    let hub = hub(store, hub_ref)?;
    let known = store.key(hub_ref, key_id)?;
    if let Some(k) = &known
        && k.state == "revoked"
    {
        return Ok(Revoked::AlreadyRevoked { seq: k.seq });
    }
    let version = known.map_or(1, |k| k.version);
    let change = KeyChange::Revoke {
        key_id: key_id.to_owned(),
    };
    let draft = Draft::new(
        "key.revoked",
        fields::key_revoked(key_id, version, reason),
        change,
    );
    mint(store, active, &hub, draft, now).map(Revoked::Minted)
}

/// `erase`: a `guest.erased` for the holder.
pub fn erase(
    store: &dyn Store,
    active: &ActiveSigner,
    hub_ref: &HubRef,
    holder_ref: &str,
    now: Timestamp,
) -> Result<Minted, CloudError> {
    check_id("holder ref", holder_ref)?;
    let hub = hub(store, hub_ref)?;
    let draft = Draft::new(
        "guest.erased",
        fields::guest_erased(holder_ref),
        KeyChange::None,
    );
    mint(store, active, &hub, draft, now)
}

/// A batch item: `{type, ...fields}`.
fn item(kind: &str, mut fields: Value) -> Value {
    if let Some(o) = fields.as_object_mut() {
        o.insert("type".into(), json!(kind));
    }
    fields
}

/// One item of a `batch` file.
#[derive(Debug, Clone)]
pub enum BatchItem {
    /// `issue` (a `key.issued` item).
    Issue(Box<GrantRequest>),
    Revoke {
        key_id: String,
        reason: String,
    },
    Erase {
        holder_ref: String,
    },
}

/// `batch`: up to 500 items in one event, one seq. With an idempotency key
/// (over the whole file), a retry returns the stored result.
pub fn batch(
    store: &dyn Store,
    active: &ActiveSigner,
    hub_ref: &HubRef,
    items: &[BatchItem],
    idempotency_key: Option<String>,
    now: Timestamp,
) -> Result<Minted, CloudError> {
    if items.is_empty() || items.len() > MAX_BATCH_ITEMS {
        return Err(InputError::Invalid(format!(
            "a batch holds 1..={MAX_BATCH_ITEMS} items, not {}",
            items.len()
        ))
        .into());
    }
    let hub = hub(store, hub_ref)?;
    let mut out = Vec::with_capacity(items.len());
    let mut changes = Vec::with_capacity(items.len());
    // The request's fingerprint: each item's, in order (an issue item's is
    // its canonical request, PIN as tag).
    let mut fingerprint = Vec::with_capacity(items.len() * 32);
    for (n, entry) in items.iter().enumerate() {
        let at = |e: InputError| InputError::Invalid(format!("item {n}: {e}"));
        match entry {
            BatchItem::Issue(req) => {
                let g = check_grant(req, &hub, now, new_key_id).map_err(at)?;
                fingerprint.extend_from_slice(&g.idempotency.request_sha256);
                let (kind, fields, change) = grant_event(&g);
                out.push(item(kind, fields));
                changes.push(change);
            }
            BatchItem::Revoke { key_id, reason } => {
                check_id("key id", key_id).map_err(at)?;
                check_id("reason", reason).map_err(at)?;
                let version = store.key(hub_ref, key_id)?.map_or(1, |k| k.version);
                fingerprint
                    .extend_from_slice(&sha256(format!("revoke\0{key_id}\0{reason}").as_bytes()));
                out.push(item(
                    "key.revoked",
                    fields::key_revoked(key_id, version, reason),
                ));
                changes.push(KeyChange::Revoke {
                    key_id: key_id.clone(),
                });
            }
            BatchItem::Erase { holder_ref } => {
                check_id("holder ref", holder_ref).map_err(at)?;
                fingerprint.extend_from_slice(&sha256(format!("erase\0{holder_ref}").as_bytes()));
                out.push(item("guest.erased", fields::guest_erased(holder_ref)));
                changes.push(KeyChange::None);
            }
        }
    }
    let idempotency = idempotency_key
        .map(|key| {
            if key.is_empty() || key.len() > crate::request::MAX_IDEMPOTENCY_KEY {
                return Err(InputError::BadIdempotencyKey);
            }
            Ok(crate::store::Idempotency {
                key,
                request_sha256: sha256(&fingerprint),
            })
        })
        .transpose()?;
    let draft = Draft {
        idempotency,
        ..Draft::new("batch", json!({ "items": out }), KeyChange::Batch(changes))
    };
    mint(store, active, &hub, draft, now)
}

/// The cloud's live set as of `as_of` for `hub`, and its mirror digest
/// (lockhub_proto::mirror's arithmetic).
pub fn mirror_digest(
    store: &dyn Store,
    hub: &HubRef,
    as_of: Timestamp,
) -> Result<(Vec<lockhub_proto::mirror::MirrorKey>, MirrorDigest), CloudError> {
    let live = reconcile::live_set(&store.claim_keys(hub)?, as_of);
    let digest = MirrorDigest::of_live(&live);
    Ok((live, digest))
}

/// The claim a checkpoint at `head` carries (mqtt.md 'Mirror proof'):
/// the live set as of `now` (whole seconds) after events 1..=`head` as
/// their results said. `None` while a result is missing, or when an event
/// was stored while the claim was read (the next checkpoint claims it).
pub fn claim(
    store: &dyn Store,
    hub: &HubRef,
    head: u64,
    now: Timestamp,
) -> Result<Option<Claim>, CloudError> {
    if store.results_pending(hub)? > 0 {
        return Ok(None);
    }
    let as_of = Timestamp::from_secs(unix_seconds(now));
    let (_, digest) = mirror_digest(store, hub, as_of)?;
    if store.head_seq(hub)? != head || store.results_pending(hub)? > 0 {
        return Ok(None);
    }
    Ok(Some(Claim::of(&digest, as_of)))
}

/// A `checkpoint` at the hub's head (no seq of its own; never stored),
/// with the cloud's claim once every result is in. Returns the claim too.
pub fn checkpoint(
    store: &dyn Store,
    active: &ActiveSigner,
    hub: &HubRef,
) -> Result<(Signed, Option<Claim>), CloudError> {
    let head = store.head_seq(hub)?;
    let now = Timestamp::now_system();
    let claim = claim(store, hub, head, now)?;
    let fields = match &claim {
        Some(c) => fields::checkpoint_with_claim(head, c),
        None => fields::checkpoint(head),
    };
    let ev = event_signer(active, hub).sign(uuid::Uuid::new_v4(), now, "checkpoint", None, fields);
    Ok((signed(ev, "checkpoint"), claim))
}

/// A `mirror.request` for up to 16 buckets as of a proof's `as_of` (no
/// seq of its own; never stored).
pub fn mirror_request(
    active: &ActiveSigner,
    hub: &HubRef,
    as_of: Timestamp,
    buckets: &[u8],
) -> Signed {
    let ev = event_signer(active, hub).sign(
        uuid::Uuid::new_v4(),
        Timestamp::now_system(),
        "mirror.request",
        None,
        fields::mirror_request(as_of, buckets),
    );
    signed(ev, "mirror.request")
}

/// The key object of `key_id` in a stored grant body (`key.issued`,
/// `checkin.completed`, or a batch item).
fn grant_key(body: &[u8], key_id: &str) -> Option<Value> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let is_it = |k: &Value| k["key_id"] == key_id;
    if is_it(&v["key"]) {
        return Some(v["key"].clone());
    }
    v["items"]
        .as_array()?
        .iter()
        .map(|it| &it["key"])
        .find(|k| is_it(k))
        .cloned()
}

/// Signs and stores one repair (mqtt.md 'Mirror proof'). `None` when the
/// key's grant is no longer stored (nothing to sign again).
pub fn repair(
    store: &dyn Store,
    active: &ActiveSigner,
    hub_ref: &HubRef,
    r: &Repair,
    now: Timestamp,
) -> Result<Option<Minted>, CloudError> {
    let hub = hub(store, hub_ref)?;
    let draft = match r {
        Repair::Revoke { key_id, version } => Draft::new(
            "key.revoked",
            fields::key_revoked(key_id, *version, reconcile::RECONCILE),
            KeyChange::Revoke {
                key_id: key_id.clone(),
            },
        ),
        Repair::Issue { key_id, version } => {
            let Some(mut key) = store
                .grant_body(hub_ref, key_id)?
                .and_then(|b| grant_key(&b, key_id))
            else {
                return Ok(None);
            };
            key["version"] = json!(version);
            Draft::new(
                "key.issued",
                json!({ "key": key }),
                KeyChange::Reissue {
                    key_id: key_id.clone(),
                    version: *version,
                },
            )
        }
    };
    mint(store, active, &hub, draft, now).map(Some)
}
