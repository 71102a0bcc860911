//! For the store tests: a store in a tempdir with the writer's apply
//! context, events built by hand, and a dump of every table for "nothing
//! changed" comparisons.

use lockhub::config::Policy;
use lockhub::store::apply::{Applied, ApplyContext, apply_event};
use lockhub::store::{Priority, Store};
use lockhub_proto::event::{
    Change, EventHeader, EventKind, Grant, GrantState, PinTag, SchemaError,
};
use lockhub_proto::time::Timestamp;
use lockhub_proto::verify::VerifiedEvent;
use rusqlite::Connection;
use uuid::Uuid;

pub fn now() -> Timestamp {
    Timestamp::parse_rfc3339("2026-11-29T12:00:00Z").unwrap()
}

pub struct Hub {
    pub dir: tempfile::TempDir,
    pub store: Store,
    pub ctx: ApplyContext,
}

impl Default for Hub {
    fn default() -> Self {
        Hub::new()
    }
}

impl Hub {
    pub fn new() -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let policy = Policy::default();
        let store = Store::open(&dir.path().join("lockhub.db"), &policy).unwrap();
        let ctx = ApplyContext {
            site_id: Uuid::parse_str(crate::files::SITE_ID).unwrap(),
            policy,
        };
        Hub { dir, store, ctx }
    }

    pub fn db_path(&self) -> std::path::PathBuf {
        self.dir.path().join("lockhub.db")
    }

    /// Applies an event on the writer. `body` stands for the signed bytes:
    /// only its SHA-256 matters to the store.
    pub fn apply(
        &self,
        id: u128,
        seq: Option<u64>,
        kind: Result<EventKind, SchemaError>,
        body: &str,
    ) -> Applied {
        self.apply_at(id, seq, kind, body, now(), now())
    }

    pub fn apply_at(
        &self,
        id: u128,
        seq: Option<u64>,
        kind: Result<EventKind, SchemaError>,
        body: &str,
        issued_at: Timestamp,
        at: Timestamp,
    ) -> Applied {
        let ev = event(id, seq, body, issued_at);
        let ctx = self.ctx.clone();
        self.store
            .write_blocking(Priority::Bulk, move |c| apply_event(c, &ctx, &ev, kind, at))
            .unwrap()
    }

    /// Shorthand for a one-change event whose body is unique to `id`.
    pub fn change(&self, id: u128, seq: u64, change: Change) -> Applied {
        self.apply(
            id,
            Some(seq),
            Ok(EventKind::Change(change)),
            &format!("body-{id}"),
        )
    }

    pub fn reader(&self) -> Connection {
        self.store.reader().unwrap()
    }

    pub fn state(&self, key_id: &str) -> Option<String> {
        self.reader()
            .query_row("SELECT state FROM keys WHERE key_id = ?1", [key_id], |r| {
                r.get(0)
            })
            .ok()
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.reader().query_row(sql, [], |r| r.get(0)).unwrap()
    }
}

pub fn event(id: u128, seq: Option<u64>, body: &str, issued_at: Timestamp) -> VerifiedEvent {
    VerifiedEvent {
        header: EventHeader {
            event_id: Uuid::from_u128(id),
            seq,
            issued_at,
        },
        body: body.as_bytes().to_vec(),
        body_sha256: lockhub_proto::crypto::sha256(body.as_bytes()),
        signer: "cloud-2026-11".into(),
    }
}

pub fn grant(key_id: &str, version: u64, state: GrantState, check_in: &str, tag: u8) -> Grant {
    Grant {
        key_id: key_id.into(),
        version,
        state,
        check_in_id: (state == GrantState::Active).then(|| check_in.to_owned()),
        reservation_id: None,
        doors: vec!["101".into()],
        valid_from: Timestamp::parse_rfc3339("2099-01-01T00:00:00Z").unwrap(),
        valid_until: Timestamp::parse_rfc3339("2099-01-31T00:00:00Z").unwrap(),
        pin_tag: PinTag([tag; 32]),
        pin_key_id: "k1".into(),
        holder_ref: Some("g-1".into()),
        holder_name: Some("Ada Guest".into()),
        schedule: None,
        max_uses: None,
    }
}

pub fn issue(key: Grant) -> Change {
    Change::KeyIssued {
        key,
        supersedes: vec![],
    }
}

pub fn revoke(key_id: &str, reason: &str) -> Change {
    Change::KeyRevoked {
        key_id: key_id.into(),
        version: 1,
        reason: reason.into(),
    }
}

/// Every row of every table, as text, in a stable order; `skip` names
/// tables left out of the comparison. `sqlite_sequence` (the AUTOINCREMENT
/// counters) follows the outbox, so it goes wherever the outbox goes.
pub fn dump(c: &Connection, skip: &[&str]) -> Vec<String> {
    let tables: Vec<String> = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut out = Vec::new();
    let skipped =
        |t: &str| skip.contains(&t) || (t == "sqlite_sequence" && skip.contains(&"outbox"));
    for t in tables.iter().filter(|t| !skipped(t)) {
        let mut stmt = c.prepare(&format!("SELECT * FROM \"{t}\"")).unwrap();
        let n = stmt.column_count();
        let mut rows: Vec<String> = stmt
            .query_map([], |r| {
                let vals: Vec<String> = (0..n)
                    .map(|i| format!("{:?}", r.get::<_, rusqlite::types::Value>(i).unwrap()))
                    .collect();
                Ok(format!("{t}: {}", vals.join(" | ")))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        rows.sort();
        out.extend(rows);
    }
    out
}
