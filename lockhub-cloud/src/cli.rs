//! The command line: one grammar for every command (`lockhub-cloud
//! [--db FILE] COMMAND [SITE/HUB] [options]`), and what each prints.
//!
//! Exit codes: 0 done; 2 the caller's input is at fault (an unknown hub, a
//! door the hub does not have, a PIN that is not 4..=12 digits, a window
//! that ends before it starts, an idempotency conflict, a bad flag), and
//! nothing changed; 1 anything else (the disk, the broker). A PIN is read
//! from a file or standard input, never from the command line, and no
//! PIN, tag or secret is ever printed.

use crate::mqtt::BrokerSettings;
use crate::ops::{self, BatchItem, CloudError, NewHub, Revoked};
use crate::request::{GrantCommand, GrantRequest, InputError, Pin, parse_hub_ref};
use crate::serve::{self, ServeSettings};
use crate::signer;
use crate::store::{
    HubRef, Minted, OutputFilter, OutputRow, PinKey, ProofSummary, SqliteStore, Store,
};
use clap::{Args, Parser, Subcommand};
use lockhub_proto::time::Timestamp;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The environment variable a fault test sets to stop a command right
/// after its event is committed and before it is published
/// (`after_commit`): what a crash or a kill there leaves behind.
pub const FAULT_ENV: &str = "LOCKHUB_CLOUD_FAULT";

#[derive(Debug, Parser)]
#[command(
    name = "lockhub-cloud",
    version,
    about = "The cloud's half of lockhub: signs key events for hubs, publishes them, answers sync requests, records what hubs report"
)]
pub struct Cli {
    /// The state database (SQLite). Signer seeds live beside it in FILE.signers/.
    #[arg(
        long,
        env = "LOCKHUB_CLOUD_DB",
        default_value = "lockhub-cloud.db",
        global = true
    )]
    pub db: PathBuf,
    /// Print results as JSON (one object per line).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create the database and the first signer of the ring.
    Init {
        /// The signer's id (default: cloud-YYYY-MM-DD).
        #[arg(long)]
        signer_id: Option<String>,
    },
    /// The signer ring.
    #[command(subcommand)]
    Signer(SignerCommand),
    /// Hubs: add one, register its public key.
    #[command(subcommand)]
    Hub(HubCommand),
    /// Issue a key: active for a check-in, or pre-issued for a reservation.
    Issue(GrantArgs),
    /// Complete a check-in: the reservation's pre-issued keys give way to a new active key.
    Checkin(GrantArgs),
    /// Revoke a key (also one this cloud never issued: the hub keeps a tombstone).
    Revoke {
        /// SITE/HUB.
        hub: String,
        /// The key to revoke.
        key_id: String,
        /// The reason the hub records (1..=64 of [A-Za-z0-9._-]).
        #[arg(long, default_value = "revoked_by_operator")]
        reason: String,
        /// Then wait for the hub's result and for the first matching mirror
        /// proof that covers the revoke (recorded by `serve`), and print the
        /// receipt. Exit 3 when none comes within --timeout.
        #[arg(long)]
        wait_proof: bool,
        /// Seconds --wait-proof waits.
        #[arg(long, default_value_t = 120, requires = "wait_proof")]
        timeout: u64,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// Erase a guest's personal data on the hub (guest.erased).
    Erase {
        /// SITE/HUB.
        hub: String,
        /// The guest's pseudonymous reference.
        holder_ref: String,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// Sign up to 500 items (issue, revoke, erase) as one batch event.
    Batch {
        /// SITE/HUB.
        hub: String,
        /// A JSON array of items (see README.md); `-` reads standard input.
        #[arg(long)]
        file: PathBuf,
        /// Makes a retry of the same file return the stored result.
        #[arg(long)]
        idempotency_key: Option<String>,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// Publish the stored events not yet acknowledged by the broker.
    Publish {
        /// Only this hub (SITE/HUB).
        hub: Option<String>,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// Run the cloud side: publish, answer sync requests, send checkpoints, record hub outputs.
    Serve(ServeArgs),
    /// Print verified hub outputs as they are recorded (by `serve`).
    Watch {
        /// Only this hub (SITE/HUB).
        #[arg(long)]
        hub: Option<String>,
        /// Start with everything recorded, not only what comes next.
        #[arg(long)]
        from_start: bool,
        /// How often to look for new rows, in milliseconds.
        #[arg(long, default_value_t = 500)]
        poll_ms: u64,
    },
    /// One line per hub: online, head seq, what the hub has confirmed, open alerts, last audit.
    Hubs,
    /// Recorded audit rows, oldest first.
    Audit {
        /// Only this hub (SITE/HUB).
        #[arg(long)]
        hub: Option<String>,
        /// The newest N rows.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// Open alerts (the latest message of each condition and subject is `raised`).
    Alerts {
        /// Only this hub (SITE/HUB).
        #[arg(long)]
        hub: Option<String>,
        /// Every alert message recorded, not only the open ones.
        #[arg(long)]
        all: bool,
        /// With --all: the newest N messages.
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

#[derive(Debug, Subcommand)]
pub enum SignerCommand {
    /// A new active signer; the old one stays valid for --overlap-days.
    Rotate {
        /// The new signer's id (default: cloud-YYYY-MM-DD).
        #[arg(long)]
        signer_id: Option<String>,
        /// How long the retired signer stays valid (its not_after).
        #[arg(long, default_value_t = 30)]
        overlap_days: u32,
    },
    /// The ring: every signer with its public key and not_after.
    List,
}

#[derive(Debug, Subcommand)]
pub enum HubCommand {
    /// Register a hub: its doors, its PIN keys and (once known) its public key.
    Add(HubAddArgs),
    /// Register the public key `lockhub provision` printed for the hub.
    SetKey {
        /// SITE/HUB.
        hub: String,
        /// The hub's Ed25519 public key (base64url; it may start with `-`).
        #[arg(allow_hyphen_values = true)]
        public_key: String,
    },
}

#[derive(Debug, Args)]
pub struct HubAddArgs {
    /// SITE/HUB (optional with --bundle, which names it).
    #[arg(required_unless_present = "bundle")]
    pub hub: Option<String>,
    /// A provisioning bundle (JSON) to take the hub from: its site and hub,
    /// its door names, its PIN keys when it has any, and (for
    /// --write-bundle) its hardware and broker.
    #[arg(long, value_name = "FILE")]
    pub bundle: Option<PathBuf>,
    /// Write the hub's provisioning bundle here (mode 0600: it holds the PIN
    /// keys) for `lockhub provision --bundle`: the trust ring, the PIN keys,
    /// the broker and the template's hardware.
    #[arg(long, value_name = "FILE")]
    pub write_bundle: Option<PathBuf>,
    /// The hub's broker URL in a written bundle.
    #[arg(long, value_name = "URL")]
    pub mqtt_url: Option<String>,
    /// The hub's Ed25519 public key (base64url), as `lockhub provision` prints it.
    #[arg(long, allow_hyphen_values = true)]
    pub public_key: Option<String>,
    /// A door name of the hub's config (repeat for each door).
    #[arg(long = "door", value_name = "NAME")]
    pub doors: Vec<String>,
    /// A PIN key: ID (generated here) or ID=@FILE (base64url of 32 bytes read from FILE).
    #[arg(long = "pin-key", value_name = "ID[=@FILE]")]
    pub pin_keys: Vec<String>,
}

#[derive(Debug, Args)]
pub struct GrantArgs {
    /// SITE/HUB.
    pub hub: String,
    /// The check-in the key belongs to (issue: an active key; checkin: required).
    #[arg(long)]
    pub check_in: Option<String>,
    /// The reservation (issue: a pre-issued key; checkin: required).
    #[arg(long)]
    pub reservation: Option<String>,
    /// The key id (default: a fresh k-UUID).
    #[arg(long)]
    pub key_id: Option<String>,
    /// A door the key opens (repeat for several).
    #[arg(long = "door", value_name = "NAME", required = true)]
    pub doors: Vec<String>,
    /// A file holding the PIN (4..=12 digits); `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    pub pin_file: PathBuf,
    /// The hub's PIN key to tag the PIN with (default: the hub's first).
    #[arg(long)]
    pub pin_key: Option<String>,
    /// Start of the window, RFC 3339 (default: now).
    #[arg(long)]
    pub valid_from: Option<String>,
    /// End of the window, RFC 3339 (exclusive).
    #[arg(long)]
    pub valid_until: String,
    /// The guest's pseudonymous reference (for `erase`).
    #[arg(long)]
    pub holder_ref: Option<String>,
    /// Weekly hours in the hub's time zone, DAYS FROM-UNTIL (for example
    /// 'mon-fri 09:00-17:30'; repeat for several). Default: any hour.
    #[arg(long, value_name = "DAYS FROM-UNTIL")]
    pub schedule: Vec<String>,
    /// How many entries the key grants in all (1..=100000; 1 is a
    /// one-time code). Default: no limit.
    #[arg(long = "uses", value_name = "N")]
    pub max_uses: Option<u32>,
    /// Retries with this key and the same request return the stored result
    /// (default: check-in:ID, or reservation:ID for a pre-issued key).
    #[arg(long)]
    pub idempotency_key: Option<String>,
    #[command(flatten)]
    pub broker: BrokerArgs,
}

#[derive(Debug, Args, Clone)]
pub struct BrokerArgs {
    /// The broker, mqtt://HOST:PORT or mqtts://HOST:PORT. Without it a
    /// command only stores its event, and `serve` publishes it.
    #[arg(long, env = "LOCKHUB_CLOUD_BROKER")]
    pub broker: Option<String>,
    /// The topic prefix (mqtt.topic_prefix of the hubs).
    #[arg(long, default_value = lockhub_proto::topics::DEFAULT_PREFIX)]
    pub topic_prefix: String,
    /// The base of the two broker identities: NAME-pub publishes, NAME-sub subscribes.
    #[arg(long, default_value = "lockhub-cloud")]
    pub identity: String,
    /// Log in as USER-pub and USER-sub (the password from --password-file).
    #[arg(long)]
    pub username: Option<String>,
    /// A file holding the broker password.
    #[arg(long)]
    pub password_file: Option<PathBuf>,
    /// mqtts: the CA that signed the broker's certificate (PEM).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// mqtts: a client certificate (PEM), with --key-file.
    #[arg(long, requires = "key_file")]
    pub cert_file: Option<PathBuf>,
    /// mqtts: the key of --cert-file (PEM).
    #[arg(long, requires = "cert_file")]
    pub key_file: Option<PathBuf>,
    /// How long a command waits for the broker's acknowledgements, in seconds.
    #[arg(long, default_value_t = 30)]
    pub publish_timeout_s: u64,
}

impl BrokerArgs {
    fn settings(&self) -> Option<BrokerSettings> {
        Some(BrokerSettings {
            url: self.broker.clone()?,
            topic_prefix: self.topic_prefix.clone(),
            identity: self.identity.clone(),
            username: self.username.clone(),
            password_file: self.password_file.clone(),
            ca_file: self.ca_file.clone(),
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
        })
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// Seconds between checkpoints to every hub.
    #[arg(long, default_value_t = 300)]
    pub checkpoint_every_s: u64,
    /// Milliseconds between looks at the database for events other commands stored.
    #[arg(long, default_value_t = 1000)]
    pub poll_ms: u64,
    /// Days an idempotency record is kept (longer than any retry).
    #[arg(long, default_value_t = 30)]
    pub idempotency_retention_days: u32,
}

fn hub_arg(s: &str) -> Result<HubRef, CloudError> {
    Ok(parse_hub_ref(s)?)
}

fn read_text(path: &Path, what: &str) -> Result<String, CloudError> {
    let r = if path == Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map(|_| s)
    } else {
        std::fs::read_to_string(path)
    };
    r.map_err(|e| {
        CloudError::Input(InputError::Invalid(format!(
            "cannot read the {what} {}: {e}",
            path.display()
        )))
    })
}

fn fault_point(name: &str) {
    if std::env::var(FAULT_ENV).is_ok_and(|v| v == name) {
        // What a crash right here leaves behind, on purpose.
        std::process::abort();
    }
}

fn open(db: &Path) -> Result<SqliteStore, CloudError> {
    Ok(SqliteStore::open(db, false)?)
}

/// Runs one command; the text it prints goes to `out`.
pub fn run(cli: Cli, out: &mut dyn Write) -> Result<(), CloudError> {
    let now = Timestamp::now_system();
    let json = cli.json;
    let db = cli.db.as_path();
    match cli.command {
        Command::Init { signer_id } => {
            let store = SqliteStore::open(db, true)?;
            let s = ops::init(&store, db, signer_id.as_deref(), now)?;
            emit(
                out,
                json,
                &format!(
                    "initialised {}; signer {} public key {}",
                    db.display(),
                    s.id,
                    s.public_key
                ),
                serde_json::json!({"db": db, "signer": s.id, "public_key": s.public_key}),
            )
        }
        Command::Signer(SignerCommand::Rotate {
            signer_id,
            overlap_days,
        }) => {
            let store = open(db)?;
            let s = ops::rotate(&store, db, signer_id.as_deref(), overlap_days, now)?;
            emit(
                out,
                json,
                &format!(
                    "signer {} is active (public key {}); the previous one ends in {overlap_days} days: give every hub the new ring",
                    s.id, s.public_key
                ),
                serde_json::json!({"signer": s.id, "public_key": s.public_key}),
            )
        }
        Command::Signer(SignerCommand::List) => {
            let store = open(db)?;
            for s in store.signers()? {
                emit(
                    out,
                    json,
                    &format!(
                        "{} {} {} not_after={}",
                        s.id,
                        if s.active { "active" } else { "retired" },
                        s.public_key,
                        s.not_after.as_deref().unwrap_or("-")
                    ),
                    serde_json::json!({"id": s.id, "active": s.active, "public_key": s.public_key, "not_after": s.not_after}),
                )?;
            }
            Ok(())
        }
        Command::Hub(HubCommand::Add(args)) => hub_add(db, args, now, json, out),
        Command::Hub(HubCommand::SetKey { hub, public_key }) => {
            let store = open(db)?;
            let hub = hub_arg(&hub)?;
            ops::set_hub_key(&store, &hub, &public_key)?;
            emit(
                out,
                json,
                &format!("hub {hub}: public key registered"),
                serde_json::json!({"hub": hub.to_string()}),
            )
        }
        Command::Issue(args) => grant(db, GrantCommand::Issue, args, now, json, out),
        Command::Checkin(args) => grant(db, GrantCommand::CheckIn, args, now, json, out),
        Command::Revoke {
            hub,
            key_id,
            reason,
            wait_proof,
            timeout,
            broker,
        } => {
            let store = open(db)?;
            let hub = hub_arg(&hub)?;
            let active = signer::load_active(&store, db)?;
            let seq = match ops::revoke(&store, &active, &hub, &key_id, &reason, now)? {
                Revoked::Minted(m) => {
                    fault_point("after_commit");
                    let published = publish(&store, &broker, &hub)?;
                    report(out, json, "revoked", &hub, &m, published)?;
                    m.seq
                }
                Revoked::AlreadyRevoked { seq } => {
                    emit(
                        out,
                        json,
                        &format!("key {key_id} was already revoked (seq {seq}); nothing signed"),
                        serde_json::json!({"key_id": key_id, "already_revoked": true, "seq": seq}),
                    )?;
                    seq
                }
            };
            if wait_proof {
                receipt(&store, &hub, seq, Duration::from_secs(timeout), json, out)?;
            }
            Ok(())
        }
        Command::Erase {
            hub,
            holder_ref,
            broker,
        } => {
            let store = open(db)?;
            let hub = hub_arg(&hub)?;
            let active = signer::load_active(&store, db)?;
            let m = ops::erase(&store, &active, &hub, &holder_ref, now)?;
            fault_point("after_commit");
            let published = publish(&store, &broker, &hub)?;
            report(out, json, "erased", &hub, &m, published)
        }
        Command::Batch {
            hub,
            file,
            idempotency_key,
            broker,
        } => {
            let store = open(db)?;
            let hub = hub_arg(&hub)?;
            let items = read_batch(&read_text(&file, "batch file")?, &hub)?;
            let active = signer::load_active(&store, db)?;
            let m = ops::batch(&store, &active, &hub, &items, idempotency_key, now)?;
            fault_point("after_commit");
            let published = publish(&store, &broker, &hub)?;
            report(out, json, "batch", &hub, &m, published)
        }
        Command::Publish { hub, broker } => {
            let store = open(db)?;
            let hub = hub.as_deref().map(hub_arg).transpose()?;
            let settings = broker.settings().ok_or_else(|| {
                InputError::Invalid("publish needs --broker (or LOCKHUB_CLOUD_BROKER)".into())
            })?;
            let n = runtime()?.block_on(serve::publish_pending(
                &store,
                &settings,
                hub.as_ref(),
                Duration::from_secs(broker.publish_timeout_s),
            ))?;
            emit(
                out,
                json,
                &format!("published {n} stored events"),
                serde_json::json!({"published": n}),
            )
        }
        Command::Serve(args) => {
            let store = open(db)?;
            let active = signer::load_active(&store, db)?;
            let broker = args.broker.settings().ok_or_else(|| {
                InputError::Invalid("serve needs --broker (or LOCKHUB_CLOUD_BROKER)".into())
            })?;
            let settings = ServeSettings {
                broker,
                checkpoint_every: Duration::from_secs(args.checkpoint_every_s.max(1)),
                poll_every: Duration::from_millis(args.poll_ms.max(10)),
                idempotency_retention_days: args.idempotency_retention_days,
                signer_db: Some(db.to_owned()),
            };
            runtime()?.block_on(async {
                serve::serve(&store, &active, &settings, shutdown_signal()).await
            })?;
            Ok(())
        }
        Command::Watch {
            hub,
            from_start,
            poll_ms,
        } => {
            let store = open(db)?;
            let hub = hub.as_deref().map(hub_arg).transpose()?;
            let mut after = if from_start {
                0
            } else {
                store
                    .outputs(&OutputFilter {
                        hub: hub.clone(),
                        limit: 1,
                        newest: true,
                        ..OutputFilter::default()
                    })?
                    .last()
                    .map_or(0, |r| r.id)
            };
            loop {
                let rows = store.outputs(&OutputFilter {
                    hub: hub.clone(),
                    after_id: after,
                    limit: 1000,
                    ..OutputFilter::default()
                })?;
                for r in &rows {
                    print_output(out, json, r)?;
                    after = r.id;
                }
                out.flush().ok();
                if rows.is_empty() {
                    std::thread::sleep(Duration::from_millis(poll_ms.max(10)));
                }
            }
        }
        Command::Hubs => {
            let store = open(db)?;
            for h in store.hub_summaries()? {
                let text = format!(
                    "{} {} head={} unpublished={} results_up_to={} last_sync_from={} open_alerts={} last_audit={} refused={} proof={}{}",
                    h.hub,
                    h.state.as_deref().unwrap_or("unknown"),
                    h.head_seq,
                    h.unpublished,
                    opt(h.last_result_seq),
                    opt(h.last_sync_from),
                    h.open_alerts,
                    h.last_audit_at.as_deref().unwrap_or("-"),
                    h.refused,
                    proof_text(h.last_proof.as_ref()),
                    if h.registered {
                        ""
                    } else {
                        " (no public key: `hub set-key`)"
                    },
                );
                let v = serde_json::json!({
                    "hub": h.hub.to_string(), "state": h.state, "state_at": h.state_at,
                    "head_seq": h.head_seq, "unpublished": h.unpublished,
                    "last_result_seq": h.last_result_seq, "last_sync_from": h.last_sync_from,
                    "open_alerts": h.open_alerts, "last_audit_at": h.last_audit_at,
                    "refused": h.refused, "registered": h.registered,
                    "last_proof": h.last_proof.as_ref().map(|p| serde_json::json!({
                        "head_seq": p.head_seq, "as_of": p.as_of, "match": p.matches,
                        "watermark": p.watermark, "received_at": p.received_at,
                    })),
                });
                emit(out, json, &text, v)?;
            }
            Ok(())
        }
        Command::Audit { hub, limit } => {
            let store = open(db)?;
            let rows = store.outputs(&OutputFilter {
                hub: hub.as_deref().map(hub_arg).transpose()?,
                topics: vec!["audit".into()],
                limit,
                newest: true,
                ..OutputFilter::default()
            })?;
            rows.iter().try_for_each(|r| print_output(out, json, r))
        }
        Command::Alerts { hub, all, limit } => {
            let store = open(db)?;
            let hub = hub.as_deref().map(hub_arg).transpose()?;
            let rows = if all {
                store.outputs(&OutputFilter {
                    hub,
                    topics: vec!["alerts".into()],
                    limit,
                    newest: true,
                    ..OutputFilter::default()
                })?
            } else {
                store.open_alerts(hub.as_ref())?
            };
            rows.iter().try_for_each(|r| print_output(out, json, r))
        }
    }
}

/// How often `revoke --wait-proof` looks at what `serve` recorded.
const RECEIPT_POLL: Duration = Duration::from_millis(200);

/// `revoke --wait-proof`: the hub's result for `seq`, then the first
/// matching proof covering it. The proof is the hub's signed statement that
/// its live set as of `as_of`, with every event up to its `head_seq`
/// applied, is the one the cloud claimed, which holds no revoked key.
fn receipt(
    store: &dyn Store,
    hub: &HubRef,
    seq: u64,
    timeout: Duration,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CloudError> {
    let deadline = std::time::Instant::now() + timeout;
    let waited = |what: &str| CloudError::Unproven {
        seq,
        waited_s: timeout.as_secs(),
        what: what.to_owned(),
    };
    let body =
        |r: OutputRow| serde_json::from_str::<serde_json::Value>(&r.body).unwrap_or_default();
    let result = poll_until(deadline, || store.result_for(hub, seq))?
        .map(body)
        .ok_or_else(|| waited("result from the hub"))?;
    let s = |v: &serde_json::Value, k: &str| match &v[k] {
        serde_json::Value::String(t) => t.clone(),
        serde_json::Value::Null => "-".into(),
        other => other.to_string(),
    };
    emit(
        out,
        json,
        &format!(
            "result: {} at {} (seq {seq}{})",
            s(&result, "outcome"),
            s(&result, "at"),
            match &result["reason"] {
                serde_json::Value::String(r) => format!(", reason {r}"),
                _ => String::new(),
            }
        ),
        serde_json::json!({"result": result}),
    )?;
    let proof = poll_until(deadline, || store.first_matching_proof(hub, seq))?
        .map(body)
        .ok_or_else(|| waited("matching proof"))?;
    emit(
        out,
        json,
        &format!(
            "revoked at {}, proven absent at {} (proof at seq {})",
            s(&result, "at"),
            whole_seconds(&s(&proof, "as_of")),
            s(&proof, "head_seq")
        ),
        serde_json::json!({
            "revoked_at": result["at"], "proven_absent_at": proof["as_of"],
            "proof_head_seq": proof["head_seq"], "hub_time": proof["hub_time"],
            "count": proof["count"], "digest": proof["digest"],
        }),
    )
}

/// Looks every [`RECEIPT_POLL`] until `look` finds something or `deadline`
/// passes (`None`).
fn poll_until<T>(
    deadline: std::time::Instant,
    mut look: impl FnMut() -> Result<Option<T>, crate::store::StoreError>,
) -> Result<Option<T>, CloudError> {
    loop {
        if let Some(found) = look()? {
            return Ok(Some(found));
        }
        if std::time::Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(RECEIPT_POLL);
    }
}

/// An instant in whole seconds without its zero fraction (a proof's
/// `as_of` is one), for people.
fn whole_seconds(t: &str) -> String {
    t.strip_suffix(".000000Z")
        .map_or_else(|| t.to_owned(), |w| format!("{w}Z"))
}

fn proof_text(p: Option<&ProofSummary>) -> String {
    match p {
        None => "-".into(),
        Some(p) => match (p.matches, p.watermark) {
            (Some(m), _) => format!(
                "{}@{} as_of={}",
                if m { "match" } else { "differs" },
                p.head_seq,
                p.as_of.as_deref().map_or_else(|| "-".into(), whole_seconds)
            ),
            (None, w) => format!("ahead@{} watermark={}", p.head_seq, opt(w)),
        },
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

fn runtime() -> Result<tokio::runtime::Runtime, CloudError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CloudError::File {
            path: PathBuf::from("(tokio runtime)"),
            detail: e.to_string(),
        })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Publishes the hub's stored events when a broker is given; `Ok(false)`
/// when none is (the events wait for `serve`).
fn publish(store: &dyn Store, broker: &BrokerArgs, hub: &HubRef) -> Result<bool, CloudError> {
    let Some(settings) = broker.settings() else {
        return Ok(false);
    };
    runtime()?.block_on(serve::publish_pending(
        store,
        &settings,
        Some(hub),
        Duration::from_secs(broker.publish_timeout_s),
    ))?;
    Ok(true)
}

fn grant(
    db: &Path,
    command: GrantCommand,
    a: GrantArgs,
    now: Timestamp,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CloudError> {
    let hub = hub_arg(&a.hub)?;
    let pin = Pin::parse(&read_text(&a.pin_file, "PIN file")?)?;
    let store = open(db)?;
    let req = GrantRequest {
        command,
        hub: hub.clone(),
        check_in_id: a.check_in,
        reservation_id: a.reservation,
        key_id: a.key_id,
        doors: a.doors,
        pin,
        pin_key_id: a.pin_key,
        valid_from: a.valid_from,
        valid_until: a.valid_until,
        holder_ref: a.holder_ref,
        idempotency_key: a.idempotency_key,
        schedule: a.schedule,
        max_uses: a.max_uses,
    };
    let active = signer::load_active(&store, db)?;
    let m = ops::grant(&store, &active, &req, now)?;
    if !m.replayed {
        fault_point("after_commit");
    }
    let published = publish(&store, &a.broker, &hub)? || m.published;
    let what = match command {
        GrantCommand::Issue => "issued",
        GrantCommand::CheckIn => "checked in",
    };
    report(out, json, what, &hub, &m, published)
}

fn report(
    out: &mut dyn Write,
    json: bool,
    what: &str,
    hub: &HubRef,
    m: &Minted,
    published: bool,
) -> Result<(), CloudError> {
    let text = format!(
        "{what}{} on {hub}: seq {} event {}{}{}",
        m.key_id
            .as_deref()
            .map_or_else(String::new, |k| format!(" key {k}")),
        m.seq,
        m.event_id,
        if m.replayed {
            " (the stored result of an earlier identical request)"
        } else {
            ""
        },
        if published {
            ", published"
        } else {
            ", stored (serve publishes it)"
        },
    );
    let v = serde_json::json!({
        "hub": hub.to_string(), "key_id": m.key_id, "seq": m.seq, "event_id": m.event_id,
        "replayed": m.replayed, "published": published,
    });
    emit(out, json, &text, v)
}

fn emit(
    out: &mut dyn Write,
    json: bool,
    text: &str,
    value: serde_json::Value,
) -> Result<(), CloudError> {
    let r = if json {
        writeln!(out, "{value}")
    } else {
        writeln!(out, "{text}")
    };
    r.map_err(|e| CloudError::File {
        path: PathBuf::from("(stdout)"),
        detail: e.to_string(),
    })
}

/// One recorded output: a line for people, or a JSON line.
fn print_output(out: &mut dyn Write, json: bool, r: &OutputRow) -> Result<(), CloudError> {
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap_or_default();
    let text = format!(
        "{} {} {} {}",
        r.received_at,
        r.hub,
        r.topic,
        summary(&r.topic, &body)
    );
    let v = serde_json::json!({
        "id": r.id, "hub": r.hub.to_string(), "topic": r.topic,
        "received_at": r.received_at, "body": body,
    });
    emit(out, json, &text, v)
}

fn summary(topic: &str, b: &serde_json::Value) -> String {
    let s = |k: &str| match &b[k] {
        serde_json::Value::Null => "-".to_owned(),
        serde_json::Value::String(v) => v.clone(),
        v => v.to_string(),
    };
    match topic {
        "results" => format!("seq={} {} reason={}", s("seq"), s("outcome"), s("reason")),
        "audit" => format!(
            "{} {} door={} key={} reason={}",
            s("at"),
            s("kind"),
            s("door"),
            s("key_id"),
            s("reason")
        ),
        "alerts" => format!(
            "{} {} subject={} count={}",
            s("condition"),
            s("state"),
            s("subject"),
            s("count")
        ),
        "sync" => format!("from_seq={} reason={}", s("from_seq"), s("reason")),
        "status" => format!("{} version={}", s("state"), s("version")),
        "proof" if b.get("bucket").is_some() => format!(
            "bucket={} keys={} head_seq={}",
            s("bucket"),
            b["keys"].as_array().map_or(0, Vec::len),
            s("head_seq")
        ),
        "proof" => format!("head_seq={} match={}", s("head_seq"), s("match")),
        _ => String::new(),
    }
}

/// `hub add`.
fn hub_add(
    db: &Path,
    a: HubAddArgs,
    now: Timestamp,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CloudError> {
    let template = a
        .bundle
        .as_deref()
        .map(|path| {
            lockhub_proto::bundle::Bundle::parse(&read_text(path, "bundle")?).map_err(|m| {
                CloudError::Input(InputError::Invalid(format!(
                    "bundle {}: {m}",
                    path.display()
                )))
            })
        })
        .transpose()?;
    let hub = match (&a.hub, &template) {
        (Some(h), None) => hub_arg(h)?,
        (h, Some(b)) => {
            let from_bundle = hub_arg(&format!("{}/{}", b.site_id.trim(), b.hub_id))?;
            if let Some(h) = h
                && hub_arg(h)? != from_bundle
            {
                return Err(InputError::Invalid(format!(
                    "{h} is not the bundle's hub ({from_bundle})"
                ))
                .into());
            }
            from_bundle
        }
        (None, None) => return Err(InputError::Invalid("name the hub: SITE/HUB".into()).into()),
    };
    let mut doors = a.doors.clone();
    if let Some(b) = &template {
        doors.extend(ops::bundle_doors(b));
    }
    doors.sort();
    doors.dedup();
    let mut pin_keys = Vec::new();
    let bundle_keys: Vec<String> = template
        .iter()
        .flat_map(|b| &b.pin_keys)
        .map(|k| k.id.clone())
        .collect();
    for k in template.iter().flat_map(|b| &b.pin_keys) {
        let secret = lockhub_proto::crypto::b64u_decode_32(k.secret.trim()).ok_or_else(|| {
            InputError::Invalid(format!(
                "bundle PIN key {:?}: not base64url of 32 bytes",
                k.id
            ))
        })?;
        pin_keys.push(PinKey {
            id: k.id.clone(),
            secret,
        });
    }
    // Flags add PIN keys; with none given anywhere, one (k1) is generated.
    let specs = if a.pin_keys.is_empty() && bundle_keys.is_empty() {
        vec!["k1".to_owned()]
    } else {
        a.pin_keys.clone()
    };
    let mut generated = Vec::new();
    for spec in &specs {
        let (id, secret) = match spec.split_once('=') {
            None => {
                generated.push(spec.clone());
                (spec.clone(), random32()?)
            }
            Some((id, rest)) => {
                let file = rest.strip_prefix('@').ok_or_else(|| {
                    InputError::Invalid(format!(
                        "--pin-key {id}=...: give the secret as @FILE, never on the command line"
                    ))
                })?;
                let text = read_text(Path::new(file), "PIN key file")?;
                let secret = text
                    .lines()
                    .map(str::trim)
                    .find(|l| !l.is_empty() && !l.starts_with('#'))
                    .and_then(lockhub_proto::crypto::b64u_decode_32)
                    .ok_or_else(|| {
                        InputError::Invalid(format!(
                            "{file}: not base64url of 32 bytes (a PIN key)"
                        ))
                    })?;
                (id.to_owned(), secret)
            }
        };
        pin_keys.push(PinKey { id, secret });
    }
    let store = open(db)?;
    if let Some(path) = &a.write_bundle
        && path.exists()
    {
        return Err(InputError::Invalid(format!(
            "{} already exists; the bundle is never written over",
            path.display()
        ))
        .into());
    }
    let new = NewHub {
        hub: hub.clone(),
        public_key: a.public_key,
        doors,
        pin_keys,
    };
    // The bundle is checked before the hub is stored, written after.
    let bundle = a
        .write_bundle
        .as_ref()
        .map(|_| {
            let staged = crate::store::HubRecord {
                hub: new.hub.clone(),
                public_key: None,
                doors: new.doors.clone(),
                pin_keys: new.pin_keys.clone(),
                next_seq: 1,
            };
            ops::bundle_for(
                &staged,
                &store.signers()?,
                template.clone(),
                a.mqtt_url.as_deref(),
                now,
            )
        })
        .transpose()?;
    let rec = ops::add_hub(&store, &new, now)?;
    if let (Some(path), Some(b)) = (&a.write_bundle, &bundle) {
        write_private(path, b.to_json().as_bytes())?;
    }
    emit(
        out,
        json,
        &(format!(
            "hub {hub} added: doors {}; PIN keys {}{}{}",
            if rec.doors.is_empty() {
                "none".into()
            } else {
                rec.doors.join(", ")
            },
            rec.pin_keys
                .iter()
                .map(|k| k.id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            if generated.is_empty() {
                String::new()
            } else {
                format!(" (generated here: {})", generated.join(", "))
            },
            if rec.public_key.is_none() {
                "; register its public key with `hub set-key` once provisioned"
            } else {
                ""
            }
        ) + &a.write_bundle.as_ref().map_or_else(String::new, |p| {
            format!(
                "; bundle written to {} (it holds the PIN keys: hand it over safely, delete it after `lockhub provision --bundle`)",
                p.display()
            )
        })),
        serde_json::json!({"hub": hub.to_string(), "doors": rec.doors,
            "pin_keys": rec.pin_keys.iter().map(|k| &k.id).collect::<Vec<_>>(),
            "registered": rec.public_key.is_some()}),
    )
}

/// Creates `path` with mode 0600 (never over an existing file) and writes it.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), CloudError> {
    use std::os::unix::fs::OpenOptionsExt;
    let err = |e: std::io::Error| CloudError::File {
        path: path.to_owned(),
        detail: e.to_string(),
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    f.write_all(bytes).map_err(err)?;
    f.sync_all().map_err(err)
}

fn random32() -> Result<[u8; 32], CloudError> {
    use rand::TryRng;
    let mut b = [0u8; 32];
    rand::rngs::SysRng
        .try_fill_bytes(&mut b)
        .map_err(|e| CloudError::File {
            path: PathBuf::from("(OS random number generator)"),
            detail: e.to_string(),
        })?;
    Ok(b)
}

/// A batch file's item.
#[derive(serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum FileItem {
    Issue {
        check_in: Option<String>,
        reservation: Option<String>,
        key_id: Option<String>,
        doors: Vec<String>,
        pin: String,
        pin_key: Option<String>,
        valid_from: Option<String>,
        valid_until: String,
        holder_ref: Option<String>,
        /// As `--schedule`: one `DAYS FROM-UNTIL` string per interval.
        #[serde(default)]
        schedule: Vec<String>,
        max_uses: Option<u32>,
    },
    Revoke {
        key_id: String,
        #[serde(default = "default_reason")]
        reason: String,
    },
    Erase {
        holder_ref: String,
    },
}

fn default_reason() -> String {
    "revoked_by_operator".into()
}

fn read_batch(text: &str, hub: &HubRef) -> Result<Vec<BatchItem>, CloudError> {
    let items: Vec<FileItem> = serde_json::from_str(text).map_err(|e| {
        // serde's message can quote a value (a PIN): only where it failed.
        InputError::Invalid(format!(
            "the batch file is not a JSON array of items (line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    items
        .into_iter()
        .enumerate()
        .map(|(n, i)| {
            Ok(match i {
                FileItem::Issue {
                    check_in,
                    reservation,
                    key_id,
                    doors,
                    pin,
                    pin_key,
                    valid_from,
                    valid_until,
                    holder_ref,
                    schedule,
                    max_uses,
                } => BatchItem::Issue(Box::new(GrantRequest {
                    command: GrantCommand::Issue,
                    hub: hub.clone(),
                    check_in_id: check_in,
                    reservation_id: reservation,
                    key_id,
                    doors,
                    pin: Pin::parse(&pin)
                        .map_err(|e| InputError::Invalid(format!("item {n}: {e}")))?,
                    pin_key_id: pin_key,
                    valid_from,
                    valid_until,
                    holder_ref,
                    idempotency_key: None,
                    schedule,
                    max_uses,
                })),
                FileItem::Revoke { key_id, reason } => BatchItem::Revoke { key_id, reason },
                FileItem::Erase { holder_ref } => BatchItem::Erase { holder_ref },
            })
        })
        .collect()
}
