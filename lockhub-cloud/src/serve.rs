//! `serve`, and the publishing every command shares.
//!
//! - **The database is the queue.** An event is published only after the
//!   transaction that stored it committed, and marked published only on the
//!   broker's PUBACK. The PUBACKs already waiting are marked together, in
//!   one commit (at most [`WINDOW`]), so the disk's `fsync` bounds commits,
//!   not events. On start, after every reconnect and on every poll
//!   tick, whatever is still unpublished goes out first, in seq order: a
//!   crash between storing and publishing is followed by publishing the
//!   stored event, never by signing a second one.
//! - **Sync answers are the stored envelopes**: the missing events with
//!   their original ids and bodies, byte for byte, then a checkpoint.
//! - **Every hub output is verified** under the hub's registered key
//!   before it is recorded; one that fails is refused: a `warn` line, a
//!   counter and a `refused` row (never its payload). The messages already
//!   waiting are recorded in one commit, then answered and acknowledged.
//! - Checkpoints go to every hub every `checkpoint_every` (5 minutes), and
//!   to a hub as soon as its status says it is online: a hub back from a
//!   long absence learns at once that its broker queue dropped events, and
//!   asks for them. Before each round's checkpoint, published events whose
//!   result never came are sent again (at most 100 per hub): the hub
//!   answers a repeat with its first result.
//! - **The mirror proof** (mqtt.md 'Mirror proof'): a checkpoint carries
//!   the cloud's claim once every result is in; results keep the cloud's
//!   key records (clamps, refusals); a revoke's result brings a prompt
//!   checkpoint, so its proof follows in seconds; a proof that differs is
//!   answered with `mirror.request` for the buckets that differ, and the
//!   hub's bucket answers with repairs (`reconcile`), ordinary events.
//! - **It follows the signer ring.** Given the database's path
//!   (`signer_db`), each poll tick looks at which signer is active: after
//!   `signer rotate`, what `serve` signs from then on (checkpoints,
//!   `mirror.request`, repairs) is signed by the new signer, without a
//!   restart. The old one ends at its `not_after`, and hubs refuse what it
//!   signs after that.

use crate::mqtt::{Backoff, BrokerSettings, Link, LinkEvent, Role, WINDOW, options};
use crate::ops::{self, CloudError};
use crate::reconcile;
use crate::signer::{self, ActiveSigner};
use crate::store::{HubRef, OutputRecord, Store};
use lockhub_proto::crypto::{open_hub_envelope, parse_public_key};
use lockhub_proto::event::EventResult;
use lockhub_proto::mirror::MirrorKey;
use lockhub_proto::outputs;
use lockhub_proto::time::Timestamp;
use lockhub_proto::topics::{Leaf, parse_topic, topic};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::time::Duration;
use tokio::time::{Instant, sleep_until};

/// The most events one sync answer re-sends; a hub further behind asks
/// again (the checkpoint after the answer shows it the head).
pub const MAX_SYNC_ANSWER: u32 = 10_000;
/// The most publishes queued at once (a sync answer that would go past it
/// is skipped: the hub repeats its request with backoff).
pub const MAX_QUEUE: usize = 4 * MAX_SYNC_ANSWER as usize;
/// The largest hub output recorded (a proof with 256 bucket digests is
/// ~12 KiB; anything far larger is not a hub's).
pub const MAX_OUTPUT_BYTES: usize = 256 * 1024;

/// `serve`'s settings.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub broker: BrokerSettings,
    pub checkpoint_every: Duration,
    /// How often the database is read for events other commands stored.
    pub poll_every: Duration,
    pub idempotency_retention_days: u32,
    /// The database the signer ring's seed files sit beside
    /// (`signer::key_dir`). When given, `serve` follows a `signer rotate`
    /// at its next poll tick; without it, it signs with the signer it was
    /// started with.
    pub signer_db: Option<std::path::PathBuf>,
}

/// What `serve` counted since it started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    pub published: u64,
    pub recorded: u64,
    pub refused: u64,
    pub sync_answers: u64,
    pub checkpoints: u64,
    /// `mirror.request`s sent for diverged proofs.
    pub mirror_requests: u64,
    /// Repair events signed from the hubs' bucket answers.
    pub repairs: u64,
}

type Tracked = (HubRef, u64);

struct Out {
    topic: String,
    payload: Vec<u8>,
    /// The stored event this is, to mark published on its PUBACK.
    track: Option<Tracked>,
    /// The checkpoint that ends a sync answer to this hub.
    ends_answer: Option<HubRef>,
}

/// The publisher's side: what to send, what is in flight, and which
/// stored events those are. Cleared whenever the connection is replaced.
#[derive(Default)]
struct Outbox {
    queue: VecDeque<Out>,
    /// Stored events queued or in flight (not queued twice by the poll).
    tracked: HashSet<Tracked>,
    /// Requested, not yet given a packet id (rumqttc reports ids in
    /// request order on one connection).
    requested: VecDeque<Option<Tracked>>,
    inflight: HashMap<u16, Option<Tracked>>,
    /// Stored events the broker acknowledged, to mark published in one
    /// commit ([`Outbox::mark_acked`]); still in `tracked` until then, so
    /// the poll does not queue them again.
    acked: Vec<Tracked>,
    /// Hubs whose sync answer is still queued, with its first seq: a
    /// repeated request it already covers is not answered twice (a hub
    /// repeats with backoff; a flood of requests must not multiply sends).
    answering: HashMap<HubRef, u64>,
}

impl Outbox {
    /// Forgets the queue and what is in flight (the connection was
    /// replaced). PUBACKs already received must be marked first.
    fn clear(&mut self) {
        debug_assert!(self.acked.is_empty(), "mark_acked before clear");
        *self = Outbox::default();
    }

    fn is_idle(&self) -> bool {
        self.queue.is_empty()
            && self.requested.is_empty()
            && self.inflight.is_empty()
            && self.acked.is_empty()
    }

    /// Queues every unpublished event of `hub` (or all hubs) not yet queued.
    fn load_unpublished(
        &mut self,
        store: &dyn Store,
        prefix: &str,
        hub: Option<&HubRef>,
    ) -> Result<usize, CloudError> {
        let mut n = 0;
        let room = MAX_QUEUE.saturating_sub(self.queue.len() + self.inflight.len());
        if room == 0 {
            return Ok(0);
        }
        // The oldest first: those already queued come back until their
        // PUBACK marks them published, and then the next ones do.
        for ev in store.unpublished(hub, u32::try_from(room).unwrap_or(u32::MAX))? {
            let key = (ev.hub.clone(), ev.seq);
            if self.tracked.insert(key.clone()) {
                self.queue.push_back(Out {
                    topic: events_topic(prefix, &ev.hub),
                    payload: ev.envelope,
                    track: Some(key),
                    ends_answer: None,
                });
                n += 1;
            }
        }
        Ok(n)
    }

    /// Sends what the window allows.
    fn pump(&mut self, link: &Link) {
        while self.requested.len() + self.inflight.len() < WINDOW {
            let Some(out) = self.queue.pop_front() else {
                return;
            };
            if !link.try_publish(&out.topic, out.payload.clone()) {
                self.queue.push_front(out);
                return;
            }
            if let Some(hub) = &out.ends_answer {
                self.answering.remove(hub);
            }
            self.requested.push_back(out.track);
        }
    }

    fn sent(&mut self, pkid: u16) {
        if let Some(track) = self.requested.pop_front() {
            self.inflight.insert(pkid, track);
        }
    }

    /// The broker acked `pkid`: its window slot is free at once; a stored
    /// event is marked published by the next [`Outbox::mark_acked`].
    fn acked(&mut self, pkid: u16) {
        if let Some(Some(track)) = self.inflight.remove(&pkid) {
            self.acked.push(track);
        }
    }

    /// Whether to mark now: nothing more is waiting on `link` (the PUBACKs
    /// that arrived together are all in), the link is gone, or a window's
    /// worth is waiting.
    fn should_mark(&self, link: Option<&Link>) -> bool {
        !self.acked.is_empty()
            && (self.acked.len() >= WINDOW || link.is_none_or(|l| l.events.is_empty()))
    }

    /// Marks the acknowledged events published, in one transaction.
    /// Returns how many.
    fn mark_acked(&mut self, store: &dyn Store) -> Result<u64, CloudError> {
        if self.acked.is_empty() {
            return Ok(0);
        }
        store.mark_published(&self.acked, &Timestamp::now_system().to_rfc3339())?;
        let n = self.acked.len() as u64;
        for t in self.acked.drain(..) {
            self.tracked.remove(&t);
        }
        Ok(n)
    }
}

fn site_uuid(hub: &HubRef) -> uuid::Uuid {
    uuid::Uuid::parse_str(&hub.site_id).unwrap_or_default()
}

fn events_topic(prefix: &str, hub: &HubRef) -> String {
    topic(prefix, site_uuid(hub), &hub.hub_id, Leaf::Events)
}

/// Publishes the stored, unpublished events of `hub` (all hubs when
/// `None`), in seq order, and waits for every PUBACK. Returns how many.
pub async fn publish_pending(
    store: &dyn Store,
    broker: &BrokerSettings,
    hub: Option<&HubRef>,
    timeout: Duration,
) -> Result<usize, CloudError> {
    let deadline = Instant::now() + timeout;
    let mut link = Link::start(options(broker, Role::Command)?, Vec::new());
    let mut out = Outbox::default();
    let mut published = 0;
    loop {
        let ev = tokio::select! {
            ev = link.events.recv() => ev,
            _ = sleep_until(deadline) => {
                published += out.mark_acked(store)? as usize;
                return Err(crate::mqtt::MqttError::Timeout(format!(
                    "{published} published, the rest stay stored for `serve` or a retry"
                ))
                .into());
            }
        };
        match ev {
            Some(LinkEvent::Up { .. }) => {
                out.clear();
                out.load_unpublished(store, &broker.topic_prefix, hub)?;
            }
            Some(LinkEvent::Sent(pkid)) => out.sent(pkid),
            Some(LinkEvent::Acked(pkid)) => out.acked(pkid),
            Some(LinkEvent::Down(e)) => {
                out.mark_acked(store)?;
                return Err(crate::mqtt::MqttError::Connection(e).into());
            }
            Some(_) => {}
            None => {
                out.mark_acked(store)?;
                return Err(crate::mqtt::MqttError::Connection("closed".into()).into());
            }
        }
        if out.should_mark(Some(&link)) {
            published += out.mark_acked(store)? as usize;
        }
        out.pump(&link);
        if out.is_idle() && (published > 0 || store.unpublished(hub, 1)?.is_empty()) {
            return Ok(published);
        }
    }
}

/// What the subscriber knows of each hub: its key, when registered.
struct Hubs {
    keys: HashMap<HubRef, Option<ed25519_dalek::VerifyingKey>>,
    sites: BTreeSet<String>,
}

impl Hubs {
    fn read(store: &dyn Store) -> Result<Hubs, CloudError> {
        let mut keys = HashMap::new();
        let mut sites = BTreeSet::new();
        for h in store.hubs()? {
            sites.insert(h.hub.site_id.clone());
            let key = h
                .public_key
                .as_deref()
                .and_then(|k| parse_public_key(k).ok());
            keys.insert(h.hub, key);
        }
        Ok(Hubs { keys, sites })
    }
}

fn filters(prefix: &str, sites: &BTreeSet<String>) -> Vec<String> {
    let mut f = Vec::new();
    for site in sites {
        let site = uuid::Uuid::parse_str(site).unwrap_or_default();
        for leaf in Leaf::ALL.into_iter().filter(|l| !l.from_cloud()) {
            f.push(topic(prefix, site, "+", leaf));
        }
    }
    f
}

const UNKNOWN_HUB: &str = "unknown hub";

/// What a recorded output asks of `serve`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Follow {
    /// A sync request: the events from this seq, then a checkpoint.
    From(u64),
    /// A checkpoint only.
    Checkpoint,
    /// The hub has seen up to this seq: move the counter past it (mqtt.md
    /// 'Mirror proof': a cloud restored from a backup).
    Past(u64),
    /// A result: the cloud's records follow it (the claim uses them).
    Result(Box<EventResult>),
    /// A proof that differs: ask for the buckets that differ.
    Diverged(Box<outputs::Proof>),
    /// A proof that matches.
    Matched,
    /// A bucket the hub answered with: repair what differs.
    Bucket(Box<outputs::ProofBucket>),
}

/// Why a hub message was refused (the reason recorded and logged).
enum Verdict {
    Record(OutputRecord, Option<Follow>),
    Refuse(Option<HubRef>, String, String),
}

/// A hub output, read with the contract's own types (lockhub-proto).
enum Output {
    Audit(outputs::AuditBody),
    Sync(outputs::SyncRequest),
    Status(outputs::Status),
    Result(Box<EventResult>),
    /// The proof of a hub ahead of this cloud.
    Ahead(outputs::ProofAhead),
    Proof(Box<outputs::Proof>),
    Bucket(Box<outputs::ProofBucket>),
    /// Alerts: checked, recorded as they came.
    Other,
}

fn read_output(leaf: Leaf, body: &[u8]) -> Option<Output> {
    fn ok<T: serde::de::DeserializeOwned>(body: &[u8]) -> Option<T> {
        serde_json::from_slice(body).ok()
    }
    Some(match leaf {
        Leaf::Results => Output::Result(Box::new(ok(body)?)),
        Leaf::Audit => Output::Audit(ok(body)?),
        Leaf::Alerts => ok::<outputs::AlertBody>(body).map(|_| Output::Other)?,
        Leaf::Sync => Output::Sync(ok(body)?),
        Leaf::Status => Output::Status(ok(body)?),
        Leaf::Proof => match ok::<outputs::ProofAhead>(body) {
            Some(ahead) => Output::Ahead(ahead),
            None => match ok::<outputs::Proof>(body) {
                Some(p) => Output::Proof(Box::new(p)),
                None => Output::Bucket(Box::new(ok(body)?)),
            },
        },
        Leaf::Events => return None,
    })
}

/// Verifies one message from a hub. Pure but for the clock.
fn judge(hubs: &Hubs, prefix: &str, topic_name: &str, payload: &[u8]) -> Verdict {
    let now = Timestamp::now_system().to_rfc3339();
    let parsed = match parse_topic(prefix, topic_name) {
        Ok(p) => p,
        Err(e) => return Verdict::Refuse(None, "unknown".into(), format!("topic: {e}")),
    };
    let hub = HubRef {
        site_id: parsed.site_id.to_string(),
        hub_id: parsed.hub_id.to_owned(),
    };
    let leaf = parsed.leaf.as_str().to_owned();
    let refuse = |why: &str| Verdict::Refuse(Some(hub.clone()), leaf.clone(), why.to_owned());
    if payload.len() > MAX_OUTPUT_BYTES {
        return refuse("payload too large");
    }
    let Some(key) = hubs.keys.get(&hub) else {
        return refuse(UNKNOWN_HUB);
    };
    let body = if parsed.leaf.is_hub_envelope() {
        let Some(key) = key else {
            return refuse("the hub has no registered public key (`hub set-key`)");
        };
        match open_hub_envelope(payload, &hub.hub_id, key) {
            Ok(body) => body,
            Err(e) => return refuse(&e.to_string()),
        }
    } else {
        // The retained status is plain JSON (mqtt.md 'Status'): a hint.
        payload.to_vec()
    };
    let parsed_body = match read_output(parsed.leaf, &body) {
        Some(p) => p,
        None => return refuse(&format!("not a valid {} body", parsed.leaf)),
    };
    if let Output::Status(st) = &parsed_body
        && st.hub_id != hub.hub_id
    {
        return refuse("a status for another hub");
    }
    let audit_id = match &parsed_body {
        Output::Audit(a) => Some(a.audit_id.to_string()),
        _ => None,
    };
    // A sync request is answered; a hub that says it is online gets a
    // checkpoint at once, so it learns of events its broker queue dropped
    // without waiting for the next round.
    let need = match parsed_body {
        Output::Sync(r) => Some(Follow::From(r.from_seq)),
        Output::Status(st) if st.state == outputs::HubState::Online => Some(Follow::Checkpoint),
        Output::Ahead(a) => Some(Follow::Past(a.watermark)),
        Output::Result(r) => Some(Follow::Result(r)),
        Output::Proof(p) if p.matches => Some(Follow::Matched),
        Output::Proof(p) => Some(Follow::Diverged(p)),
        Output::Bucket(b) => Some(Follow::Bucket(b)),
        _ => None,
    };
    Verdict::Record(
        OutputRecord {
            hub,
            topic: leaf,
            body: String::from_utf8_lossy(&body).into_owned(),
            audit_id,
            received_at: now,
        },
        need,
    )
}

/// Runs `serve` until `shutdown` resolves.
pub async fn serve(
    store: &dyn Store,
    active: &ActiveSigner,
    settings: &ServeSettings,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<Counters, CloudError> {
    let prefix = settings.broker.topic_prefix.clone();
    // Bad settings (URL, files) fail here, before anything runs.
    options(&settings.broker, Role::Publisher)?;
    let mut counters = Counters::default();
    let mut hubs = Hubs::read(store)?;
    let mut publisher: Option<Link> = None;
    // Nothing is queued before the CONNACK: the queue is (re)built from the
    // database at each connection, so a publish requested earlier would
    // only go out twice.
    let mut publisher_up = false;
    let mut subscriber: Option<Link> = None;
    let mut subscribed_sites = BTreeSet::new();
    let mut out = Outbox::default();
    // Hub messages received, not yet handled (at most a window's worth).
    let mut inbox: Vec<rumqttc::Publish> = Vec::new();
    let (mut pub_backoff, mut sub_backoff) = (backoff(), backoff());
    let (mut pub_retry, mut sub_retry) = (Instant::now(), Instant::now());
    let mut next_poll = Instant::now();
    let mut next_checkpoint = Instant::now() + settings.checkpoint_every;
    let mut next_prune = Instant::now();
    let mut mirror = Mirror::default();
    // The signer after a `signer rotate` (None: still the one given).
    let mut rotated: Option<ActiveSigner> = None;
    let mut next_signer_check = Instant::now() + settings.poll_every;
    tokio::pin!(shutdown);
    tracing::info!(hubs = hubs.keys.len(), "serve started");
    loop {
        if let Some(db) = &settings.signer_db
            && Instant::now() >= next_signer_check
        {
            next_signer_check = Instant::now() + settings.poll_every;
            let current = rotated.as_ref().unwrap_or(active).id.clone();
            if store.signers()?.iter().any(|s| s.active && s.id != current) {
                match signer::load_active(store, db) {
                    Ok(next) => {
                        tracing::info!(
                            from = %current,
                            to = %next.id,
                            "signer rotated: signing with the new signer"
                        );
                        rotated = Some(next);
                    }
                    // A seed file not (yet) readable: keep signing with
                    // the current one and look again at the next tick.
                    Err(e) => {
                        tracing::warn!(error = %e, "the rotated signer cannot be loaded");
                    }
                }
            }
        }
        let active = rotated.as_ref().unwrap_or(active);
        // (Re)connect what is down and due.
        let now = Instant::now();
        if publisher.is_none() && now >= pub_retry {
            out.clear();
            publisher_up = false;
            publisher = Some(Link::start(
                options(&settings.broker, Role::Publisher)?,
                Vec::new(),
            ));
        }
        if subscriber.is_none() && now >= sub_retry && !hubs.sites.is_empty() {
            subscribed_sites = hubs.sites.clone();
            subscriber = Some(Link::start(
                options(&settings.broker, Role::Subscriber)?,
                filters(&prefix, &subscribed_sites),
            ));
        }
        let wake = [next_poll, next_checkpoint, next_prune, pub_retry, sub_retry]
            .into_iter()
            .chain(mirror.next_prompt())
            .filter(|t| *t > now)
            .min()
            .unwrap_or(now + settings.poll_every);
        tokio::select! {
            _ = &mut shutdown => {
                counters.published += out.mark_acked(store)?;
                break;
            }
            ev = recv(&mut publisher) => match ev {
                LinkEvent::Up { .. } => {
                    pub_backoff.reset();
                    publisher_up = true;
                    tracing::info!("publisher connected");
                    out.clear();
                    out.load_unpublished(store, &prefix, None)?;
                }
                LinkEvent::Sent(pkid) => out.sent(pkid),
                LinkEvent::Acked(pkid) => out.acked(pkid),
                LinkEvent::Down(e) => {
                    counters.published += out.mark_acked(store)?;
                    publisher = None;
                    publisher_up = false;
                    let d = pub_backoff.next_delay();
                    tracing::warn!(error = %e, retry_in_ms = d.as_millis() as u64, "publisher connection lost");
                    pub_retry = Instant::now() + d;
                }
                _ => {}
            },
            ev = recv(&mut subscriber) => match ev {
                LinkEvent::Up { session_present } => {
                    sub_backoff.reset();
                    tracing::info!(session_present, "subscriber connected");
                }
                LinkEvent::Subscribed { granted: false } => {
                    tracing::warn!("the broker refused a subscription: check the cloud's ACL");
                }
                // Handled with those already waiting, below: one commit
                // records them all.
                LinkEvent::Message(p) => inbox.push(p),
                LinkEvent::Down(e) => {
                    subscriber = None;
                    let d = sub_backoff.next_delay();
                    tracing::warn!(error = %e, retry_in_ms = d.as_millis() as u64, "subscriber connection lost");
                    sub_retry = Instant::now() + d;
                }
                _ => {}
            },
            _ = sleep_until(wake) => {}
        }
        if out.should_mark(publisher.as_ref()) {
            counters.published += out.mark_acked(store)?;
        }
        // The hub messages that arrived together, once nothing more is
        // waiting (or a window's worth is): verified, recorded in one
        // commit, answered, then acknowledged. Those of a connection that
        // failed are handled too (the broker redelivers them, unacked).
        if !inbox.is_empty()
            && (inbox.len() >= WINDOW || subscriber.as_ref().is_none_or(|l| l.events.is_empty()))
        {
            // The outputs to record, and what each asks of serve after.
            let mut outputs = Vec::with_capacity(inbox.len());
            let mut follows = Vec::with_capacity(inbox.len());
            for p in &inbox {
                let mut verdict = judge(&hubs, &prefix, &p.topic, &p.payload);
                if matches!(&verdict, Verdict::Refuse(_, _, why) if why == UNKNOWN_HUB) {
                    // Perhaps a hub added since the last poll.
                    hubs = Hubs::read(store)?;
                    verdict = judge(&hubs, &prefix, &p.topic, &p.payload);
                }
                match verdict {
                    Verdict::Record(rec, need) => {
                        follows.push((rec.hub.clone(), need));
                        outputs.push(rec);
                    }
                    Verdict::Refuse(hub, leaf, why) => {
                        counters.refused += 1;
                        tracing::warn!(
                            hub = %hub.as_ref().map(ToString::to_string).unwrap_or_default(),
                            topic = %leaf, reason = %why, refused = counters.refused,
                            "refused a hub message"
                        );
                        let at = Timestamp::now_system().to_rfc3339();
                        store.record_refused(hub.as_ref(), &leaf, &why, &at)?;
                    }
                }
            }
            store.record_outputs(&outputs)?;
            counters.recorded += outputs.len() as u64;
            for (hub, need) in follows {
                match need {
                    Some(Follow::From(from)) => {
                        answer_sync(store, active, &prefix, &hub, from, &mut out)?;
                        counters.sync_answers += 1;
                    }
                    Some(Follow::Checkpoint) => {
                        queue_checkpoint(store, active, &prefix, &hub, &mut out)?;
                        counters.checkpoints += 1;
                    }
                    Some(Follow::Result(r)) => {
                        mirror.result(store, &hub, &r)?;
                    }
                    Some(Follow::Matched) => mirror.matched(&hub),
                    Some(Follow::Diverged(p)) => {
                        counters.mirror_requests +=
                            mirror.diverged(store, active, &prefix, &hub, &p, &mut out)?;
                    }
                    Some(Follow::Bucket(b)) => {
                        let n = mirror.bucket(store, active, &hub, &b)?;
                        counters.repairs += n;
                        if n > 0 && publisher_up {
                            out.load_unpublished(store, &prefix, Some(&hub))?;
                        }
                    }
                    Some(Follow::Past(watermark)) => {
                        let moved = store.advance_seq(&hub, watermark)?;
                        if moved {
                            tracing::warn!(
                                hub = %hub, watermark,
                                "the hub has seen seqs this cloud does not hold (restored from a backup?): the counter moves past them"
                            );
                            // Its mirror is compared at once: what the
                            // lost events did is repaired.
                            mirror.want_proof(&hub);
                        }
                    }
                    None => {}
                }
            }
            for p in inbox.drain(..) {
                if let Some(s) = &subscriber {
                    s.ack(&p);
                }
            }
        }
        let now = Instant::now();
        if now >= next_poll {
            next_poll = now + settings.poll_every;
            hubs = Hubs::read(store)?;
            if subscriber.is_some() && hubs.sites != subscribed_sites {
                subscriber = None; // resubscribe with the new sites
            }
            if publisher_up {
                out.load_unpublished(store, &prefix, None)?;
            }
        }
        if publisher_up {
            counters.checkpoints += mirror.prompt_due(store, active, &prefix, now, &mut out)?;
        }
        if now >= next_checkpoint {
            next_checkpoint = now + settings.checkpoint_every;
            if publisher_up {
                for hub in hubs.keys.keys() {
                    resend_without_result(store, &prefix, hub, &mut out)?;
                    queue_checkpoint(store, active, &prefix, hub, &mut out)?;
                    counters.checkpoints += 1;
                }
            }
        }
        if now >= next_prune {
            next_prune = now + Duration::from_secs(3600);
            let days = i64::from(settings.idempotency_retention_days);
            let before = Timestamp::now_system().saturating_add_days(-days);
            let n = store.prune_idempotency(before.0.div_euclid(Timestamp::MICROS_PER_SEC))?;
            if n > 0 {
                tracing::info!(pruned = n, "idempotency records past retention removed");
            }
        }
        if let Some(p) = publisher.as_ref().filter(|_| publisher_up) {
            out.pump(p);
        }
    }
    tracing::info!(
        published = counters.published,
        recorded = counters.recorded,
        refused = counters.refused,
        "serve stopped"
    );
    Ok(counters)
}

fn backoff() -> Backoff {
    Backoff::new(Duration::from_millis(500), Duration::from_secs(60))
}

/// The next event of an optional link; pending forever when there is none.
async fn recv(link: &mut Option<Link>) -> LinkEvent {
    match link {
        Some(l) => l
            .events
            .recv()
            .await
            .unwrap_or_else(|| LinkEvent::Down("the connection task ended".into())),
        None => std::future::pending().await,
    }
}

fn queue_checkpoint(
    store: &dyn Store,
    active: &ActiveSigner,
    prefix: &str,
    hub: &HubRef,
    out: &mut Outbox,
) -> Result<(), CloudError> {
    let (cp, claim) = ops::checkpoint(store, active, hub)?;
    tracing::debug!(hub = %hub, claim = claim.is_some(), "checkpoint");
    out.queue.push_back(Out {
        topic: events_topic(prefix, hub),
        payload: cp.envelope,
        track: None,
        ends_answer: None,
    });
    Ok(())
}

/// The most result-less events sent again to one hub per checkpoint round.
pub const MAX_RESEND: u32 = 100;

/// Sends again the published events whose result never reached the cloud
/// (a broker queue may drop a hub's outputs on their way): the hub answers
/// a repeat with its first result, and a claim waits for every result. The
/// stored envelopes, byte for byte, like a sync answer.
fn resend_without_result(
    store: &dyn Store,
    prefix: &str,
    hub: &HubRef,
    out: &mut Outbox,
) -> Result<(), CloudError> {
    if out.queue.len() + MAX_RESEND as usize > MAX_QUEUE {
        return Ok(());
    }
    let events = store.without_result(hub, MAX_RESEND)?;
    if !events.is_empty() {
        tracing::info!(hub = %hub, events = events.len(), from_seq = events[0].seq, "sending again events whose result has not come");
    }
    for ev in events {
        out.queue.push_back(Out {
            topic: events_topic(prefix, hub),
            payload: ev.envelope,
            track: None,
            ends_answer: None,
        });
    }
    Ok(())
}

/// How long after a revoke's (or a repair's) result the prompt checkpoint
/// follows: results that arrive together share one.
const PROMPT_AFTER: Duration = Duration::from_secs(1);
/// A prompt checkpoint still waiting for results after this long is left
/// to the regular round.
const PROMPT_GIVE_UP: Duration = Duration::from_secs(60);

/// `serve`'s side of the mirror proof (mqtt.md 'Mirror proof'): results
/// kept in the cloud's records, a prompt checkpoint (with its claim) after
/// a revoke so that its proof follows in seconds, and the repair of a
/// diverged proof. One entry per hub at most in each map.
#[derive(Default)]
struct Mirror {
    /// Hubs owed a checkpoint soon: when it is due, and when it was asked.
    prompt: HashMap<HubRef, (Instant, Instant)>,
    /// Hubs whose last proof differed and that are being repaired.
    repairing: HashSet<HubRef>,
    /// The buckets asked for after a hub's differing proof, still to be
    /// answered.
    rounds: HashMap<HubRef, Round>,
}

/// One repair round: a differing proof at `head`, the buckets asked for,
/// and the head once this round's own repairs are stored. A bucket's
/// repairs touch only that bucket's keys, so each answer is compared with
/// the cloud's records as long as nothing but this round's repairs was
/// signed since; a bucket is repaired once, however often it is answered.
struct Round {
    head: u64,
    expected_head: u64,
    /// The buckets still to be answered, with the cloud's live keys in
    /// each, read once when the round began.
    buckets: BTreeMap<u8, Vec<MirrorKey>>,
}

impl Mirror {
    fn next_prompt(&self) -> Option<Instant> {
        self.prompt.values().map(|(due, _)| *due).min()
    }

    fn matched(&mut self, hub: &HubRef) {
        self.rounds.remove(hub);
        if self.repairing.remove(hub) {
            tracing::info!(hub = %hub, "the hub's proof matches again: repaired");
        }
    }

    fn want_proof(&mut self, hub: &HubRef) {
        let now = Instant::now();
        self.prompt
            .entry(hub.clone())
            .or_insert((now + PROMPT_AFTER, now));
    }

    /// A verified result: the cloud's key records follow it.
    fn result(
        &mut self,
        store: &dyn Store,
        hub: &HubRef,
        r: &EventResult,
    ) -> Result<(), CloudError> {
        let Some(applied) = store.record_result(hub, r)? else {
            return Ok(());
        };
        for key_id in &applied.revoked {
            tracing::info!(hub = %hub, key_id, "the hub refuses this key (a tombstone, or final there): recorded as revoked");
        }
        if applied.kind == "key.revoked" || self.repairing.contains(hub) {
            self.want_proof(hub);
        }
        Ok(())
    }

    /// Queues the checkpoints that are due and whose claim can be made.
    fn prompt_due(
        &mut self,
        store: &dyn Store,
        active: &ActiveSigner,
        prefix: &str,
        now: Instant,
        out: &mut Outbox,
    ) -> Result<u64, CloudError> {
        let due: Vec<HubRef> = self
            .prompt
            .iter()
            .filter(|(_, (at, _))| *at <= now)
            .map(|(h, _)| h.clone())
            .collect();
        let mut n = 0;
        for hub in due {
            let asked = self.prompt.get(&hub).map_or(now, |(_, asked)| *asked);
            if store.results_pending(&hub)? == 0 {
                queue_checkpoint(store, active, prefix, &hub, out)?;
                n += 1;
                self.prompt.remove(&hub);
            } else if now.duration_since(asked) > PROMPT_GIVE_UP {
                self.prompt.remove(&hub);
            } else {
                self.prompt.insert(hub, (now + PROMPT_AFTER, asked));
            }
        }
        Ok(n)
    }

    /// Whether the cloud's records are those the hub's answer was made
    /// against: the same head, and every result in.
    fn comparable(store: &dyn Store, hub: &HubRef, head_seq: u64) -> Result<bool, CloudError> {
        Ok(store.head_seq(hub)? == head_seq && store.results_pending(hub)? == 0)
    }

    /// A proof that differs: asks for the buckets that differ from the
    /// cloud's, as of the proof's `as_of`. Returns how many requests.
    fn diverged(
        &mut self,
        store: &dyn Store,
        active: &ActiveSigner,
        prefix: &str,
        hub: &HubRef,
        p: &outputs::Proof,
        out: &mut Outbox,
    ) -> Result<u64, CloudError> {
        if !Self::comparable(store, hub, p.head_seq)? {
            tracing::debug!(hub = %hub, head_seq = p.head_seq, "a differing proof for another head: the next checkpoint's is compared");
            return Ok(0);
        }
        let (live, cloud) = ops::mirror_digest(store, hub, p.as_of)?;
        let buckets = reconcile::differing_buckets(&cloud, p.buckets.as_deref().unwrap_or(&[]));
        tracing::warn!(
            hub = %hub, head_seq = p.head_seq, hub_count = p.count, cloud_count = cloud.count,
            buckets = buckets.len(),
            "the hub's mirror differs from the cloud's: asking for the buckets that differ"
        );
        self.repairing.insert(hub.clone());
        self.rounds.insert(
            hub.clone(),
            Round {
                head: p.head_seq,
                expected_head: p.head_seq,
                buckets: reconcile::by_bucket(live, &buckets),
            },
        );
        let mut n = 0;
        for ask in reconcile::requests(&buckets) {
            let req = ops::mirror_request(active, hub, p.as_of, &ask);
            out.queue.push_back(Out {
                topic: events_topic(prefix, hub),
                payload: req.envelope,
                track: None,
                ends_answer: None,
            });
            n += 1;
        }
        Ok(n)
    }

    /// A bucket the hub answered with: signs the repairs. Returns how many.
    fn bucket(
        &mut self,
        store: &dyn Store,
        active: &ActiveSigner,
        hub: &HubRef,
        b: &outputs::ProofBucket,
    ) -> Result<u64, CloudError> {
        // An answer to no open round, for a bucket already repaired (a
        // repeated one), made against another head (a late one), or after
        // other events were signed repairs nothing.
        let Some(round) = self.rounds.get_mut(hub) else {
            return Ok(0);
        };
        if b.head_seq != round.head {
            return Ok(0);
        }
        let Some(live) = round.buckets.remove(&b.bucket) else {
            return Ok(0);
        };
        if store.head_seq(hub)? != round.expected_head {
            tracing::debug!(hub = %hub, "events signed since the differing proof: the next checkpoint's proof is compared");
            self.rounds.remove(hub);
            return Ok(0);
        }
        let mut n = 0;
        for r in reconcile::repairs(b.bucket, &live, &b.keys) {
            match ops::repair(store, active, hub, &r, Timestamp::now_system()) {
                Ok(Some(m)) => {
                    tracing::warn!(hub = %hub, bucket = b.bucket, repair = ?r, seq = m.seq, "mirror repair signed");
                    n += 1;
                }
                Ok(None) => {
                    tracing::warn!(hub = %hub, repair = ?r, "no stored grant to sign again for this key");
                }
                Err(e) if e.is_input_problem() => {
                    tracing::warn!(hub = %hub, repair = ?r, error = %e, "a repair the hub would refuse: skipped");
                }
                Err(e) => return Err(e),
            }
        }
        let head = store.head_seq(hub)?;
        if let Some(round) = self.rounds.get_mut(hub) {
            round.expected_head = head;
            if round.buckets.is_empty() {
                self.rounds.remove(hub);
            }
        }
        Ok(n)
    }
}

/// Re-sends the stored events from `from_seq` (original envelopes), then a
/// checkpoint.
fn answer_sync(
    store: &dyn Store,
    active: &ActiveSigner,
    prefix: &str,
    hub: &HubRef,
    from_seq: u64,
    out: &mut Outbox,
) -> Result<(), CloudError> {
    if out
        .answering
        .get(hub)
        .is_some_and(|queued| *queued <= from_seq)
    {
        tracing::debug!(hub = %hub, from_seq, "a sync answer covering this request is already queued");
        return Ok(());
    }
    if out.queue.len() + MAX_SYNC_ANSWER as usize > MAX_QUEUE {
        tracing::warn!(hub = %hub, from_seq, queued = out.queue.len(), "publish queue full: sync request left for the hub to repeat");
        return Ok(());
    }
    let events = store.events_from(hub, from_seq.max(1), MAX_SYNC_ANSWER)?;
    tracing::info!(hub = %hub, from_seq, events = events.len(), "answering a sync request");
    for ev in events {
        let key = (hub.clone(), ev.seq);
        let track = (!ev.published && out.tracked.insert(key.clone())).then_some(key);
        out.queue.push_back(Out {
            topic: events_topic(prefix, hub),
            payload: ev.envelope,
            track,
            ends_answer: None,
        });
    }
    queue_checkpoint(store, active, prefix, hub, out)?;
    if let Some(last) = out.queue.back_mut() {
        last.ends_answer = Some(hub.clone());
    }
    out.answering.insert(hub.clone(), from_seq);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{HubRecord, KeyChange, Mint, PinKey, Signed, SqliteStore};

    /// A store with one hub and `n` stored, unpublished events.
    fn store_with_events(n: u64) -> (tempfile::TempDir, SqliteStore, HubRef) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("c.db"), true).unwrap();
        let hub = HubRef {
            site_id: "6f1c1c0e-8a51-4d39-9d2e-6a3c5a7d9e10".into(),
            hub_id: "h".into(),
        };
        let record = HubRecord {
            hub: hub.clone(),
            public_key: None,
            doors: vec![],
            pin_keys: vec![PinKey {
                id: "k1".into(),
                secret: [1; 32],
            }],
            next_seq: 1,
        };
        store.add_hub(&record, "2026-12-01T00:00:00Z").unwrap();
        for _ in 0..n {
            let m = Mint {
                hub: hub.clone(),
                idempotency: None,
                change: KeyChange::None,
                key_id: None,
                now: "2026-12-01T00:00:00Z".into(),
                now_unix: 0,
            };
            store
                .mint(&m, &mut |seq| Signed {
                    event_id: uuid::Uuid::new_v4().to_string(),
                    kind: "guest.erased".into(),
                    body: vec![],
                    envelope: format!("e{seq}").into_bytes(),
                })
                .unwrap();
        }
        (dir, store, hub)
    }

    #[test]
    fn a_repeated_sync_request_is_not_answered_twice_while_the_first_answer_is_queued() {
        let (_dir, store, hub) = store_with_events(3);
        let active = ActiveSigner {
            id: "s".into(),
            key: ed25519_dalek::SigningKey::from_bytes(&[5; 32]),
        };
        let mut out = Outbox::default();
        answer_sync(&store, &active, "p", &hub, 2, &mut out).unwrap();
        assert_eq!(out.queue.len(), 3, "seqs 2 and 3, then a checkpoint");
        answer_sync(&store, &active, "p", &hub, 3, &mut out).unwrap();
        assert_eq!(out.queue.len(), 3, "covered by the queued answer");
        answer_sync(&store, &active, "p", &hub, 1, &mut out).unwrap();
        assert_eq!(out.queue.len(), 7, "an earlier start is answered");
    }

    #[test]
    fn pubacks_are_marked_published_together_and_the_acked_events_are_not_queued_again_meanwhile() {
        let (_dir, store, _hub) = store_with_events(3);
        let mut out = Outbox::default();
        assert_eq!(out.load_unpublished(&store, "p", None).unwrap(), 3);
        // What `pump` and the link do: requested in order, then packet ids.
        while let Some(o) = out.queue.pop_front() {
            out.requested.push_back(o.track);
        }
        for pkid in 1..=3 {
            out.sent(pkid);
        }
        out.acked(1);
        out.acked(2);
        let unpublished = |s: &SqliteStore| -> Vec<u64> {
            s.unpublished(None, 10)
                .unwrap()
                .iter()
                .map(|e| e.seq)
                .collect()
        };
        assert_eq!(
            unpublished(&store),
            vec![1, 2, 3],
            "not marked before mark_acked"
        );
        assert_eq!(
            out.load_unpublished(&store, "p", None).unwrap(),
            0,
            "acknowledged, not yet marked: not queued a second time"
        );
        assert!(out.should_mark(None), "no link: mark what was acknowledged");
        assert_eq!(out.mark_acked(&store).unwrap(), 2);
        assert_eq!(unpublished(&store), vec![3]);
        assert!(!out.should_mark(None), "nothing left to mark");
        assert_eq!(
            out.load_unpublished(&store, "p", None).unwrap(),
            0,
            "seq 3 is still in flight"
        );
        out.acked(3);
        assert_eq!(out.mark_acked(&store).unwrap(), 1);
        assert!(unpublished(&store).is_empty());
        assert!(out.is_idle());
    }
}
