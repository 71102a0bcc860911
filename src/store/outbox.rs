//! The outbox: everything the hub must tell the cloud, written in the same
//! transaction as what caused it, so a crash can neither lose a record nor
//! publish one for a change that never committed.
//!
//! Rows hold the *body*; the publisher signs it into a hub envelope when it
//! sends. A row is marked sent only after the broker's PUBACK; unsent rows are
//! never pruned (the schema refuses it).

use super::StoreError;
use lockhub_proto::time::Timestamp;
use lockhub_proto::topics::Leaf;
use rusqlite::{Connection, OptionalExtension, params};

/// The hub -> cloud topics that carry signed envelopes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Topic {
    Results,
    Audit,
    Alerts,
    Sync,
    /// Mirror proofs and the answers to `mirror.request`.
    Proof,
}

impl Topic {
    /// The topic leaf it is published on.
    pub fn leaf(self) -> Leaf {
        match self {
            Topic::Results => Leaf::Results,
            Topic::Audit => Leaf::Audit,
            Topic::Alerts => Leaf::Alerts,
            Topic::Sync => Leaf::Sync,
            Topic::Proof => Leaf::Proof,
        }
    }

    /// The topic's last path segment, also its name in the `outbox` table.
    pub fn as_str(self) -> &'static str {
        self.leaf().as_str()
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match Leaf::parse(s)? {
            Leaf::Results => Topic::Results,
            Leaf::Audit => Topic::Audit,
            Leaf::Alerts => Topic::Alerts,
            Leaf::Sync => Topic::Sync,
            Leaf::Proof => Topic::Proof,
            Leaf::Events | Leaf::Status => return None,
        })
    }
}

/// One unsent record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub id: i64,
    pub topic: Topic,
    pub body: Vec<u8>,
}

/// Queues a body for publication. Call inside the transaction that caused it.
pub fn enqueue(
    conn: &Connection,
    topic: Topic,
    body: &[u8],
    audit_id: Option<&str>,
    now: Timestamp,
) -> Result<i64, StoreError> {
    conn.prepare_cached(
        "INSERT INTO outbox (topic, body, audit_id, created_at) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![topic.as_str(), body, audit_id, now.0])?;
    Ok(conn.last_insert_rowid())
}

/// Outbox rows queued during one writer job and written together by
/// [`Queued::flush`], in the order they were queued: the same ids, topics,
/// bodies and times as [`enqueue`] one by one would have given them.
///
/// Why: a single-row insert into the outbox costs more than its row. Each
/// one rebuilds the `topic IN (...)` CHECK's list (an ephemeral table per
/// statement run), reads and writes `sqlite_sequence` (AUTOINCREMENT) and
/// opens a statement journal; a multi-row insert does each once. Under a
/// flood of `key.issued` that is two rows an event (the `key.activated`
/// audit record and the result), 11 % of the writer before this.
///
/// Ids follow the order rows reach the outbox, so anything that writes the
/// outbox by another route while rows are queued (an alert, the trigger
/// that ends `pin_ambiguous` when a key stops being live, a plain
/// [`enqueue`]) must [`Queued::flush`] first; `store::apply` does.
#[derive(Debug, Default)]
pub struct Queued {
    rows: Vec<QueuedRow>,
    /// How many times [`Queued::flush`] wrote rows (see [`Mark`]).
    flushes: u64,
}

/// Where the queue stood, for [`Queued::truncate`] after a rollback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    flushes: u64,
    len: usize,
}

#[derive(Debug)]
struct QueuedRow {
    topic: Topic,
    body: Vec<u8>,
    audit_id: Option<String>,
    created_at: Timestamp,
}

/// Rows per INSERT at most: the statements are of 1, 2, 4, .. this many
/// rows, so the statement cache holds at most seven of them.
const FLUSH_ROWS: usize = 64;

impl Queued {
    /// Queues a body, as [`enqueue`] would write it.
    pub fn push(&mut self, topic: Topic, body: Vec<u8>, audit_id: Option<String>, now: Timestamp) {
        self.rows.push(QueuedRow {
            topic,
            body,
            audit_id,
            created_at: now,
        });
    }

    /// How many rows are queued.
    #[cfg(any(test, feature = "testing"))]
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    #[cfg(any(test, feature = "testing"))]
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Where the queue stands: take it where a savepoint begins.
    pub fn mark(&self) -> Mark {
        Mark {
            flushes: self.flushes,
            len: self.rows.len(),
        }
    }

    /// Forgets the rows queued since `mark`: what caused them was rolled
    /// back. If a flush came in between, every row queued now came after
    /// it, so after the mark, and goes; the rows that flush wrote were
    /// rolled back with the rest. (So a flush inside a savepoint is right
    /// only when the queue held nothing from before the savepoint: flush
    /// before one that may flush inside.)
    pub fn truncate(&mut self, mark: Mark) {
        if mark.flushes == self.flushes {
            self.rows.truncate(mark.len);
        } else {
            self.rows.clear();
        }
    }

    /// Runs `f` with a queue of its own and writes what it queued once it
    /// succeeded: for one piece of work with no job-wide queue.
    pub fn written_after<T>(
        conn: &Connection,
        f: impl FnOnce(&mut Queued) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let mut out = Queued::default();
        let done = f(&mut out)?;
        out.flush(conn)?;
        Ok(done)
    }

    /// Writes every queued row, in order, and empties the queue. Call in
    /// the transaction that caused them.
    pub fn flush(&mut self, conn: &Connection) -> Result<(), StoreError> {
        let mut rest = &self.rows[..];
        while !rest.is_empty() {
            // The largest power of two that fits.
            let n = 1usize << rest.len().min(FLUSH_ROWS).ilog2();
            let (chunk, tail) = rest.split_at(n);
            let mut stmt = conn.prepare_cached(&insert_rows_sql(n))?;
            for (i, row) in chunk.iter().enumerate() {
                let at = 4 * i;
                stmt.raw_bind_parameter(at + 1, row.topic.as_str())?;
                stmt.raw_bind_parameter(at + 2, &row.body[..])?;
                stmt.raw_bind_parameter(at + 3, row.audit_id.as_deref())?;
                stmt.raw_bind_parameter(at + 4, row.created_at.0)?;
            }
            stmt.raw_execute()?;
            rest = tail;
        }
        if !self.rows.is_empty() {
            self.flushes += 1;
            self.rows.clear();
        }
        Ok(())
    }
}

/// `INSERT INTO outbox ...` of `n` rows, in [`enqueue`]'s column order.
fn insert_rows_sql(n: usize) -> String {
    let mut sql = String::from("INSERT INTO outbox (topic, body, audit_id, created_at) VALUES ");
    for i in 0..n {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str("(?, ?, ?, ?)");
    }
    sql
}

/// `LIMIT +?2`, not `?2`, so that the cached statement is not compiled
/// again on every call (see `STATEMENT_CACHE` in store/mod.rs).
const UNSENT: &str =
    "SELECT id, topic, body FROM outbox WHERE sent_at IS NULL AND id > ?1 ORDER BY id LIMIT +?2";

/// The oldest unsent rows, in the order they were written.
pub fn unsent(
    conn: &Connection,
    after_id: i64,
    limit: usize,
) -> Result<Vec<OutboxRow>, StoreError> {
    let mut stmt = conn.prepare_cached(UNSENT)?;
    let rows = stmt.query_map(params![after_id, limit as i64], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Vec<u8>>(2)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (id, topic, body) = row?;
        let topic = Topic::parse(&topic).ok_or_else(|| StoreError::Unreadable {
            what: format!("outbox row {id}: topic"),
        })?;
        out.push(OutboxRow { id, topic, body });
    }
    Ok(out)
}

/// Marks rows sent (the broker acknowledged them); audit rows behind them
/// become eligible for retention. Rows already marked are left as they are
/// (a row sent again after a reconnect is acknowledged twice).
///
/// Set-based: two statements per run of consecutive ids ([`runs`]), not two
/// per row. The publisher sends rows in id order and the broker acknowledges
/// them in order, so a mark of hundreds of rows is usually one run.
pub fn mark_sent(conn: &Connection, ids: &[i64], now: Timestamp) -> Result<(), StoreError> {
    let mut audit = conn.prepare_cached(
        "UPDATE audit SET acked_at = ?3
          WHERE acked_at IS NULL
            AND audit_id IN (SELECT audit_id FROM outbox
                              WHERE id BETWEEN ?1 AND ?2 AND audit_id IS NOT NULL)",
    )?;
    let mut rows = conn.prepare_cached(
        "UPDATE outbox SET sent_at = ?3 WHERE id BETWEEN ?1 AND ?2 AND sent_at IS NULL",
    )?;
    for (first, last) in runs(ids) {
        audit.execute(params![first, last, now.0])?;
        rows.execute(params![first, last, now.0])?;
    }
    Ok(())
}

/// `ids` as runs of consecutive ids, `(first, last)` inclusive, ascending;
/// in any order and with repeats. Every id of a run is one of `ids`, so a
/// row between two runs (not acknowledged) is never marked.
pub fn runs(ids: &[i64]) -> Vec<(i64, i64)> {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<(i64, i64)> = Vec::new();
    for id in sorted {
        match out.last_mut() {
            Some((_, last)) if *last + 1 == id => *last = id,
            _ => out.push((id, id)),
        }
    }
    out
}

/// Holds the result of a guest erasure back until [`release_held`]: it
/// must not be published while the WAL may still hold the erased name
/// (mqtt.md 'Types: guest.erased'). Call inside the erasure's transaction.
pub fn hold(
    conn: &Connection,
    event_id: &str,
    body: &[u8],
    now: Timestamp,
) -> Result<(), StoreError> {
    conn.prepare_cached(
        "INSERT INTO held_results (event_id, body, created_at) VALUES (?1, ?2, ?3)",
    )?
    .execute(params![event_id, body, now.0])?;
    Ok(())
}

/// Whether an event's result is still held back.
pub fn is_held(conn: &Connection, event_id: &str) -> Result<bool, StoreError> {
    Ok(conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM held_results WHERE event_id = ?1)")?
        .query_row([event_id], |r| r.get(0))?)
}

/// Moves every held result to the end of the outbox, in the order they were
/// held. Call only once the WAL no longer holds a page from before them
/// ([`super::Store::scrub_wal`] does both). Returns how many moved.
pub fn release_held(conn: &Connection) -> Result<usize, StoreError> {
    conn.prepare_cached(
        "INSERT INTO outbox (topic, body, audit_id, created_at)
         SELECT 'results', body, NULL, created_at FROM held_results ORDER BY id",
    )?
    .execute([])?;
    Ok(conn
        .prepare_cached("DELETE FROM held_results")?
        .execute([])?)
}

/// How many results are held back (an erasure not yet scrubbed).
pub fn held(conn: &Connection) -> Result<u64, StoreError> {
    let n: i64 = conn
        .prepare_cached("SELECT count(*) FROM held_results")?
        .query_row([], |r| r.get(0))?;
    Ok(n as u64)
}

/// How many rows wait to be sent.
pub fn depth(conn: &Connection) -> Result<u64, StoreError> {
    let n: i64 = conn
        .prepare_cached("SELECT count(*) FROM outbox WHERE sent_at IS NULL")?
        .query_row([], |r| r.get(0))?;
    Ok(n as u64)
}

/// The oldest unsent row's creation time, if any.
pub fn oldest_unsent(conn: &Connection) -> Result<Option<Timestamp>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT min(created_at) FROM outbox WHERE sent_at IS NULL",
            [],
            |r| r.get::<_, Option<i64>>(0),
        )
        .optional()?
        .flatten()
        .map(Timestamp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;
    use crate::store::{Priority, Store};
    use rusqlite::StatementStatus;

    #[test]
    fn reading_the_unsent_rows_again_and_again_compiles_the_statement_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("lockhub.db"), &Policy::default()).unwrap();
        store
            .write_blocking(Priority::Bulk, |c| {
                for n in 0..20 {
                    enqueue(c, Topic::Results, b"{}", None, Timestamp(n))?;
                }
                Ok(())
            })
            .unwrap();
        let reader = store.reader().unwrap();
        for (after, limit) in [(0, 4), (4, 8), (12, 2), (14, 8)] {
            let rows = unsent(&reader, after, limit).unwrap();
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            let want: Vec<i64> = (after + 1..=20).take(limit).collect();
            assert_eq!(ids, want);
        }
        let stmt = reader.prepare_cached(UNSENT).unwrap();
        assert_eq!(stmt.get_status(StatementStatus::Run), 4);
        assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0);
    }

    #[test]
    fn consecutive_ids_make_one_run() {
        assert_eq!(runs(&[7, 8, 9, 10]), [(7, 10)]);
    }

    #[test]
    fn a_missing_id_splits_the_runs_so_it_is_never_marked() {
        assert_eq!(runs(&[1, 2, 4, 5, 9]), [(1, 2), (4, 5), (9, 9)]);
    }

    #[test]
    fn ids_in_any_order_and_repeated_give_the_same_runs() {
        assert_eq!(runs(&[5, 3, 4, 3, 1, 5]), [(1, 1), (3, 5)]);
        assert_eq!(runs(&[]), []);
    }
}
