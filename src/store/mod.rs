//! The SQLite mirror: one file, one writer thread, many readers.
//!
//! ## Why it is shaped like this
//! - **Durability.** WAL with `synchronous=FULL`: a commit that returned has
//!   reached the disk, so an MQTT ack sent after it can never outlive a power
//!   cut. `quick_check` at open turns a damaged file into a clear error.
//! - **One owner.** A single thread owns the write connection and runs every
//!   write inside `BEGIN IMMEDIATE`. Nothing else writes, so there is no
//!   writer-vs-writer `SQLITE_BUSY` and no interleaving to reason about.
//! - **Group commit.** Jobs queue on a bounded channel; the writer runs as
//!   many as are waiting (within a small time budget) in one transaction, each
//!   but the first inside its own savepoint so one failure rolls back alone
//!   (the first needs none: if it fails, the transaction holds nothing else),
//!   then commits once and only then answers every job. Under a flood many
//!   events share one fsync; each caller still learns of its own job only
//!   after the commit. A job sent with [`Store::write_alone`] (a batch
//!   event) has a transaction to itself instead, so its savepoints are the
//!   outermost and SQLite's sub-journal stays one item small.
//! - **The door first.** Jobs marked [`Priority::Door`] jump the queue; a
//!   waiting door job is visible to bulk jobs ([`Store::door_signal`]),
//!   which stop early for it, and it runs next inside the group in hand
//!   (in its own savepoint), which then commits at once: one commit for
//!   the bulk work and the door, not two (`GroupStep`). A keypad entry
//!   waits for one event of the flood, not the whole of it. A bulk job
//!   that fails rolls back alone (the first of a group, before any door
//!   joins it, takes the transaction with it and the door runs in the
//!   next one); a door job that fails or runs past its deadline rolls back
//!   to its savepoint and the bulk work before it commits.
//! - **A door job has a deadline** ([`Store::write_door`]): it commits by
//!   then or not at all, so the door is answered within 3 s whatever the
//!   storage does, and a denied door never leaves a committed grant. While
//!   another process holds the write lock, a bulk group waiting for it
//!   steps aside the moment a door job waits, and the door job waits for
//!   the lock only until its own deadline (`Patience`, the writer's busy
//!   handler). What the door side does on failure lives in [`door`]
//!   (`decide_entry`, `StorageFailures`).
//! - **Checkpoints beside the writer.** A second connection on its own thread
//!   copies the WAL into the database file, so the writer only appends.
//! - **Journals in memory.** Savepoint journals never go to temp files, which
//!   was slow and left page copies (guest names among them) on disk.
//! - **Invariants in SQL.** The schema (`migrations/`) refuses illegal states
//!   with constraints and triggers; the Rust code above it is not trusted to
//!   keep them.
//!
//! Store functions are plain `fn(&Connection, ...) -> Result<_, StoreError>`
//! in the submodules; callers run them on the writer with [`Store::write`].

mod checkpoint;
pub mod error;
pub mod keys;
mod migrate;
pub mod open;
mod paced;
mod writer;
internal! {
    mod alerts;
    mod apply;
    mod audit;
    mod door;
    mod floor;
    mod health;
    mod links;
    mod mirror;
    mod osdp;
    mod outbox;
    mod runtime;
    mod sweep;
}

pub use migrate::pending as migration_pending;
pub use migrate::{MIGRATIONS, schema_version};

use crate::config::Policy;
use checkpoint::*;
use error::StoreError;
use open::*;
use rusqlite::{Connection, OpenFlags};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use writer::*;

/// Prepared statements kept per connection (every store function's SQL fits).
///
/// A cached statement is compiled once only if its plan does not depend on
/// a bound value. SQLite's planner reads the value bound to a `LIMIT ?`, and
/// a statement whose plan used a bound value is recompiled after its
/// bindings are cleared, which the cache does each time it takes the
/// statement back: so a `LIMIT` takes its parameter as `+?N`, an expression
/// the planner does not read (same plan). The publisher's outbox read
/// recompiled on every call this way, ~5 % of the tokio workers' time under a
/// flood (docs/performance-notes.md, "The hub's CPU per event").
const STATEMENT_CACHE: usize = 256;
/// How long any connection waits on a lock before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Jobs that may wait for the writer; senders wait (asynchronously) past it.
const QUEUE_DEPTH: usize = 4096;
/// At most this many jobs share one transaction (door jobs aside)...
const MAX_GROUP: usize = 512;
/// ...and a group of bulk jobs stops taking more after this much work.
/// Each commit costs an fsync and rewrites every page the group dirtied, so
/// under a flood longer groups are cheaper per event. A door job does not
/// wait for the budget: it joins the group in hand, which commits as soon
/// as it has run (see [`GroupStep`]), so its wait is the event running
/// when it arrived plus that commit. (20 ms with 16 ingest jobs in flight
/// measured no fewer commits under a full-mirror flood: there the groups
/// end when the writer runs out of jobs, not at the budget.)
const GROUP_BUDGET: Duration = Duration::from_millis(6);
/// How long one bulk job should run before it hands the writer back (the
/// ingest pipeline sizes and cuts its jobs by it). A door job does not wait
/// for the slice: an ingest job that sees one waiting stops after the event
/// in hand. Every job after the first in a group runs in a savepoint, which
/// journals each page it touches once more: at 2 ms four jobs shared a
/// group under a flood, and 6 ms committed 24–36 % more events a second
/// into a full mirror with the loaded door's p99 unchanged within noise
/// (docs/performance-notes.md, "Issue 14 after the ingest and restart merges").
pub const JOB_SLICE: Duration = Duration::from_millis(6);

/// How long [`Store::write_until_written`] retries a record the schema
/// refuses (a trigger another process put in the way, say) before it gives
/// it up; a full disk or an I/O error is retried for as long as it lasts.
pub const REFUSED_FOR: Duration = Duration::from_secs(30);

/// Whether a job may jump the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// A door is waiting on this answer.
    Door,
    /// Ingest, outbox bookkeeping, sweeps.
    Bulk,
}

/// What a job gives back to the writer: did it succeed (keep its savepoint),
/// and how to answer its caller once the group's commit is known.
type Finish = Box<dyn FnOnce(Result<(), &StoreError>) + Send>;
/// Runs the job on the connection, or, given an error instead, answers it
/// with that error without running it (a transaction that could not begin,
/// a deadline that passed while it waited).
type JobFn = Box<dyn FnOnce(Result<&Connection, StoreError>) -> (bool, Finish) + Send>;

struct Job {
    priority: Priority,
    /// Runs as the only job of its transaction ([`Store::write_alone`]).
    alone: bool,
    /// Runs between transactions (for `wal_checkpoint`, which cannot run
    /// inside one) instead of inside the group transaction.
    outside: bool,
    /// A door job must have committed by then, or not at all
    /// ([`Store::write_door`]).
    deadline: Option<Instant>,
    run: JobFn,
}

/// A handle to the mirror. Cheap to clone; the writer thread stops when the
/// last handle is dropped or [`Store::close`] is called.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    /// What the writer and the checkpointer share; here to wake the writer
    /// when a door job is sent ([`Store::send`]).
    wal: Arc<WalState>,
    path: PathBuf,
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    checkpointer: Mutex<Option<Checkpointer>>,
    doors: DoorSignal,
    failures: Arc<door::StorageFailures>,
}

/// The writer's connection inside a transaction that holds one job's work
/// and nothing else ([`Store::write_alone`]).
pub struct Alone<'a>(&'a Connection);

impl Alone<'_> {
    pub fn conn(&self) -> &Connection {
        self.0
    }

    /// Undoes everything the job wrote and begins a new transaction, which
    /// only a job alone in its transaction may do: what a batch does when
    /// an item rejects it, with no savepoint around the batch to roll back.
    pub fn start_over(&self) -> Result<(), StoreError> {
        self.0.execute_batch("ROLLBACK")?;
        self.0.execute_batch("BEGIN IMMEDIATE")?;
        Ok(())
    }
}

/// Tells the writer's other work that a door job is in flight, from the
/// moment it is sent until it is answered (its commit included): long bulk
/// jobs stop at the next event instead of the end of their slice (the
/// ingest pipeline does), a bulk group waiting for another process's lock
/// steps aside, and the checkpointer holds its next step of writes to the
/// database file (`paced`). Cheap to clone and to read.
///
/// Why until the answer and not until the job starts: on the VM's disk a
/// commit's `fdatasync` flushes the device's cache, and with it every page
/// the checkpointer wrote out meanwhile; a checkpoint step let go the
/// moment the door job started landed inside the door's own commit
/// (traced: 1.0–1.6 ms of the slowest 2 % of entries' commits, idle and
/// under ingest, overlapped a checkpoint step).
#[derive(Clone, Debug, Default)]
pub struct DoorSignal(Arc<std::sync::atomic::AtomicUsize>);

impl DoorSignal {
    /// Whether a door job has been sent and not answered yet: it waits for
    /// the writer, runs, or waits for its commit.
    pub fn waiting(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed) > 0
    }

    fn ticket(&self) -> DoorTicket {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        DoorTicket(self.0.clone())
    }
}

/// One door job in flight; its drop (once its commit is known, just before
/// its caller is answered, or if it never runs) ends it.
struct DoorTicket(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for DoorTicket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Inner {
    /// Stops the checkpointer, then the writer (after its queued jobs): the
    /// writer's connection closes last, so it checkpoints and removes the WAL.
    fn stop(&self) {
        if let Some(c) = self.checkpointer.lock().ok().and_then(|mut c| c.take()) {
            c.stop();
        }
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        if let Some(h) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = h.join();
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Store {
    /// Opens (creating if needed) the database at `path`, migrates it, writes
    /// the retention policy the triggers use, and starts the writer thread.
    pub fn open(path: &Path, policy: &Policy) -> Result<Store, StoreError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::DataDir {
                path: dir.to_owned(),
                source,
            })?;
        }
        let mut conn = connect_writer(path)?;
        migrate::migrate(&mut conn, path)?;
        conn.execute(
            "UPDATE policy SET dedupe_retention_days = ?1, audit_retention_days = ?2, max_grant_days = ?3
             WHERE id = 1",
            (policy.dedupe_retention_days, policy.audit_retention_days, policy.max_grant_days),
        )?;

        // The checkpointer does this instead, off the writer's thread (this
        // pragma replaces the WAL hook, so it goes first).
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        // Only the writer's limit cuts the file (at its first commit after
        // a restart); the checkpointer's TRUNCATE empties it when idle.
        conn.pragma_update(None, "journal_size_limit", WAL_KEPT)?;
        let wal = Arc::new(WalState::default());
        let counts = wal.clone();
        conn.wal_hook(Some(move |_: &mut rusqlite::hooks::Wal, pages: i32| {
            use std::sync::atomic::Ordering::Relaxed;
            counts
                .pages
                .store(u64::try_from(pages).unwrap_or(0), Relaxed);
            counts.commits.fetch_add(1, Relaxed);
            Ok(())
        }))?;
        let doors = DoorSignal::default();
        let checkpointer = Checkpointer::start(path, wal.clone(), doors.clone())?;
        let woken = wal.clone();

        let (tx, rx) = mpsc::channel::<Job>(QUEUE_DEPTH);
        let patience = Arc::new(Patience::new(doors.clone()));
        let waits = patience.clone();
        conn.busy_handler(Some(move |n| waits.busy(n)))?;
        let thread = std::thread::Builder::new()
            .name("lockhub-writer".into())
            .spawn(move || writer_loop(conn, rx, &patience, &wal))
            .map_err(|source| StoreError::Thread {
                name: "writer",
                source,
            })?;
        let _ = woken.writer.set(thread.thread().clone());
        Ok(Store {
            inner: Arc::new(Inner {
                wal: woken,
                path: path.to_owned(),
                tx: Mutex::new(Some(tx)),
                thread: Mutex::new(Some(thread)),
                checkpointer: Mutex::new(Some(checkpointer)),
                doors,
                failures: Arc::default(),
            }),
        })
    }

    /// Whether a door job waits for the writer (see [`DoorSignal`]).
    pub fn door_signal(&self) -> DoorSignal {
        self.inner.doors.clone()
    }

    /// Door entries denied because this store failed, kept in memory until
    /// they can be written ([`door::decide_entry`]).
    pub fn storage_failures(&self) -> Arc<door::StorageFailures> {
        self.inner.failures.clone()
    }

    /// A door job's ticket: it counts as in flight ([`DoorSignal`]) until
    /// its answer.
    fn ticket(&self, priority: Priority) -> Option<DoorTicket> {
        (priority == Priority::Door).then(|| self.inner.doors.ticket())
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// A new read-only connection (WAL readers never block the writer).
    pub fn reader(&self) -> Result<Connection, StoreError> {
        let conn = connect(&self.inner.path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        conn.pragma_update(None, "query_only", true)?;
        Ok(conn)
    }

    fn sender(&self) -> Result<mpsc::Sender<Job>, StoreError> {
        self.inner
            .tx
            .lock()
            .map_err(|_| StoreError::Closed)?
            .clone()
            .ok_or(StoreError::Closed)
    }

    /// Queues a job for the writer; a door job also wakes it, should it be
    /// holding bulk work for the checkpointer (`hold_bulk_while_behind`).
    async fn send(&self, job: Job) -> Result<(), StoreError> {
        let door = job.priority == Priority::Door;
        self.sender()?
            .send(job)
            .await
            .map_err(|_| StoreError::Closed)?;
        if door {
            self.inner.wal.wake_writer();
        }
        Ok(())
    }

    /// [`Store::send`] for threads outside the async runtime.
    fn send_blocking(&self, job: Job) -> Result<(), StoreError> {
        let door = job.priority == Priority::Door;
        self.sender()?
            .blocking_send(job)
            .map_err(|_| StoreError::Closed)?;
        if door {
            self.inner.wal.wake_writer();
        }
        Ok(())
    }

    fn job<T, F>(
        &self,
        priority: Priority,
        outside: bool,
        deadline: Option<Instant>,
        f: F,
    ) -> (Job, oneshot::Receiver<Result<T, StoreError>>)
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        Self::job_of(priority, outside, false, deadline, self.ticket(priority), f)
    }

    fn job_of<T, F>(
        priority: Priority,
        outside: bool,
        alone: bool,
        deadline: Option<Instant>,
        ticket: Option<DoorTicket>,
        f: F,
    ) -> (Job, oneshot::Receiver<Result<T, StoreError>>)
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let run: JobFn = Box::new(move |conn| {
            let result = conn.and_then(f);
            let ok = result.is_ok();
            let finish: Finish = Box::new(move |commit| {
                // The commit is known: the door job is no longer in flight
                // by the time its caller hears of it.
                drop(ticket);
                let out = match (result, commit) {
                    (Ok(v), Ok(())) => Ok(v),
                    (Ok(_), Err(StoreError::Deadline)) => Err(StoreError::Deadline),
                    (Ok(_), Err(e)) => Err(StoreError::Commit(e.to_string())),
                    (Err(e), _) => Err(e),
                };
                let _ = reply.send(out);
            });
            (ok, finish)
        });
        (
            Job {
                priority,
                alone,
                outside,
                deadline,
                run,
            },
            rx,
        )
    }

    /// Writes a record that is the only trace of something at a door (an
    /// Unlock confirmed, a forced door, a flood count, a tamper): when the
    /// write fails (disk full, I/O error) it is tried again, 100 ms doubling
    /// to 5 s apart, until it is written, so it lands once storage takes
    /// writes again; a driver's records queue behind it, in order. A record
    /// the schema itself refuses (a constraint or trigger) is given up after
    /// [`REFUSED_FOR`], so one bad record cannot hold the rest back for
    /// ever. Once `stopping()` holds, a failed try is the last, so a
    /// shutdown never waits on a broken disk (each record left is tried
    /// once). Returns whether it was written.
    pub async fn write_until_written<F>(
        &self,
        what: &str,
        f: F,
        stopping: impl Fn() -> bool,
    ) -> bool
    where
        F: Fn(&Connection) -> Result<(), StoreError> + Send + Sync + 'static,
    {
        let f = Arc::new(f);
        let mut backoff = crate::runtime::backoff::Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(5),
        );
        let mut failures = 0u32;
        let mut refused_since: Option<tokio::time::Instant> = None;
        loop {
            let attempt = f.clone();
            match self.write(Priority::Bulk, move |c| attempt(c)).await {
                Ok(()) => {
                    if failures > 0 {
                        tracing::info!(record = %what, failures, "recorded once storage took writes again");
                    }
                    return true;
                }
                Err(StoreError::Closed) => {
                    tracing::error!(record = %what, "cannot record: the store is closed");
                    return false;
                }
                Err(e) => {
                    failures += 1;
                    if failures == 1 {
                        tracing::error!(record = %what, error = %e, "cannot record; trying again until storage takes it");
                    }
                    if stopping() {
                        tracing::error!(record = %what, error = %e, failures, "stopping: record given up");
                        return false;
                    }
                    if e.constraint_message().is_some()
                        && refused_since
                            .get_or_insert_with(tokio::time::Instant::now)
                            .elapsed()
                            >= REFUSED_FOR
                    {
                        tracing::error!(record = %what, error = %e, failures, "the schema keeps refusing it: record given up");
                        return false;
                    }
                    tokio::time::sleep(backoff.next_step()).await;
                }
            }
        }
    }

    /// Runs `f` on the writer thread inside the current group transaction and
    /// resolves once that transaction has committed (or with the job's own
    /// error, in which case everything `f` did was rolled back).
    pub async fn write<T, F>(&self, priority: Priority, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (job, rx) = self.job(priority, false, None, f);
        self.send(job).await?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// A door job: [`Store::write`] with [`Priority::Door`] that commits by
    /// `deadline` or not at all, and then fails with [`StoreError::Deadline`].
    /// It is refused unrun if it reaches the writer after the deadline, it
    /// waits for another process's write lock only until the deadline (and
    /// never behind a bulk job's wait for it), and it is rolled back if it
    /// finishes after the deadline. So a caller that denies on any error
    /// never leaves a committed grant behind a denial. (A commit that has
    /// begun cannot be stopped: a disk that hangs inside fsync holds the
    /// answer; bound the wait with [`door::decide_entry`]'s timeout.)
    pub async fn write_door<T, F>(&self, deadline: Instant, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let priority = Priority::Door;
        let (job, rx) = self.job(priority, false, Some(deadline), f);
        self.send(job).await?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// [`Store::write`] for a bulk job that gets a transaction to itself: it
    /// runs first in its group, with no savepoint around it, and the group
    /// takes no other bulk job after it. So a savepoint `f` opens is the
    /// outermost one, and SQLite drops its in-memory sub-journal each time
    /// one is released (it keeps every page journalled at any level until
    /// the outermost savepoint ends: 500 batch items nested in one
    /// savepoint held ~30 MiB). `f` may also undo everything it wrote and
    /// start over ([`Alone::start_over`]); an error rolls the whole
    /// transaction back.
    pub async fn write_alone<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Alone<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let (job, rx) = Self::alone_job(move |c| f(&Alone(c)));
        self.send(job).await?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// [`Store::write_alone`] for threads outside the async runtime (tests).
    pub fn write_alone_blocking<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Alone<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let (job, rx) = Self::alone_job(move |c| f(&Alone(c)));
        self.send_blocking(job)?;
        rx.blocking_recv().map_err(|_| StoreError::Closed)?
    }

    fn alone_job<T, F>(f: F) -> (Job, oneshot::Receiver<Result<T, StoreError>>)
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        Self::job_of(Priority::Bulk, false, true, None, None, f)
    }

    /// [`Store::write`] for threads outside the async runtime (CLI, tests).
    pub fn write_blocking<T, F>(&self, priority: Priority, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let (job, rx) = self.job(priority, false, None, f);
        self.send_blocking(job)?;
        rx.blocking_recv().map_err(|_| StoreError::Closed)?
    }

    /// Moves every committed page out of the WAL file and truncates it, on
    /// the writer between transactions, then releases the results held back
    /// by guest erasures ([`outbox::release_held`]). Call it after an
    /// erasure: the WAL still holds the pages from before it, and
    /// `secure_delete` only reaches the main file. A reader in the way makes
    /// it fail (retryable), and then nothing is released.
    pub async fn scrub_wal(&self) -> Result<(), StoreError> {
        let (job, rx) = self.job(Priority::Bulk, true, None, scrub_and_release);
        self.send(job).await?;
        rx.await.map_err(|_| StoreError::Closed)?
    }

    /// [`Store::scrub_wal`] for threads outside the async runtime.
    pub fn scrub_wal_blocking(&self) -> Result<(), StoreError> {
        let (job, rx) = self.job(Priority::Bulk, true, None, scrub_and_release);
        self.send_blocking(job)?;
        rx.blocking_recv().map_err(|_| StoreError::Closed)?
    }

    /// Stops the writer after the jobs already queued, and waits for it: the
    /// database is closed cleanly when this returns (if no other handle is
    /// still open).
    pub fn close(self) {
        self.inner.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::checkpoint::*;
    use super::open::*;
    use super::writer::*;
    use super::*;

    fn open_temp() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("lockhub.db"), &Policy::default()).unwrap();
        (dir, store)
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_the_schema_keeps_refusing_is_given_up_and_the_next_one_goes_in() {
        let (_dir, store) = open_temp();
        store
            .write(Priority::Bulk, |c| {
                c.execute_batch(
                    "CREATE TRIGGER refuse_floor BEFORE UPDATE ON time_floor
                     BEGIN SELECT RAISE(ABORT, 'refused'); END;",
                )?;
                Ok(())
            })
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let refused = store
            .write_until_written(
                "a floor",
                |c| floor::raise_to(c, lockhub_proto::time::Timestamp(5)).map(drop),
                || false,
            )
            .await;
        assert!(!refused, "given up");
        assert!(started.elapsed() >= REFUSED_FOR);
        assert!(started.elapsed() < REFUSED_FOR + Duration::from_secs(6));
        let next = store
            .write_until_written(
                "an outbox row",
                |c| {
                    outbox::enqueue(
                        c,
                        outbox::Topic::Sync,
                        b"{}",
                        None,
                        lockhub_proto::time::Timestamp(1),
                    )
                    .map(drop)
                },
                || false,
            )
            .await;
        assert!(next, "the next record is not held back");
    }

    #[test]
    fn an_operator_command_refuses_a_database_the_daemon_has_not_upgraded() {
        let (dir, store) = open_temp();
        drop(store);
        let path = dir.path().join("lockhub.db");
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", 1)
            .unwrap();
        match open_operator(&path) {
            Err(StoreError::NotUpgraded {
                found: 1, known, ..
            }) => {
                assert_eq!(known, MIGRATIONS.len() as i64)
            }
            other => panic!("expected NotUpgraded, got {:?}", other.err()),
        }
    }

    #[test]
    fn a_reader_command_refuses_a_database_not_yet_migrated_with_the_reason_not_a_missing_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lockhub.db");
        // What `lockhub run` leaves for a moment as it starts: the file,
        // no schema yet.
        drop(Connection::open(&path).unwrap());
        let e = open_read_only(&path).expect_err("refused");
        assert!(
            matches!(e, StoreError::NotUpgraded { found: 0, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("start the daemon once"), "{e}");
        let (dir, store) = open_temp();
        drop(store);
        assert!(open_read_only(&dir.path().join("lockhub.db")).is_ok());
    }

    #[test]
    fn a_truncate_checkpoint_behind_a_reader_says_so_at_once() {
        let (_dir, store) = open_temp();
        let floor = |v: i64| {
            move |c: &Connection| {
                c.execute("UPDATE time_floor SET floor = ?1 WHERE id = 1", [v])?;
                Ok(())
            }
        };
        store.write_blocking(Priority::Bulk, floor(10)).unwrap();
        let reader = store.reader().unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let _: i64 = reader
            .query_row("SELECT floor FROM time_floor", [], |r| r.get(0))
            .unwrap();
        store.write_blocking(Priority::Bulk, floor(11)).unwrap();
        let started = Instant::now();
        assert!(matches!(
            store.scrub_wal_blocking(),
            Err(StoreError::CheckpointBlocked)
        ));
        assert!(started.elapsed() < Duration::from_secs(1));
        reader.execute_batch("COMMIT").unwrap();
        store.scrub_wal_blocking().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_wal_scrub_a_door_job_still_waits_for_another_process_s_write_lock() {
        let (dir, store) = open_temp();
        store.scrub_wal().await.unwrap();
        let (locked_tx, locked_rx) = std::sync::mpsc::channel();
        let path = dir.path().join("lockhub.db");
        let holder = std::thread::spawn(move || {
            let other = rusqlite::Connection::open(&path).unwrap();
            other.execute_batch("BEGIN IMMEDIATE").unwrap();
            locked_tx.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            other.execute_batch("COMMIT").unwrap();
        });
        locked_rx.recv().unwrap();
        let started = Instant::now();
        let res = store
            .write_door(Instant::now() + Duration::from_secs(2), |c| {
                c.execute("UPDATE time_floor SET floor = 12 WHERE id = 1", [])?;
                Ok(())
            })
            .await;
        holder.join().unwrap();
        assert!(
            res.is_ok(),
            "the door job gave up on a 300 ms lock: {res:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(250));
    }

    #[test]
    fn a_fresh_database_is_wal_full_and_at_the_latest_schema() {
        let (_dir, store) = open_temp();
        let r = store.reader().unwrap();
        let mode: String = r
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        assert_eq!(schema_version(&r).unwrap(), MIGRATIONS.len() as i64);
    }

    #[test]
    fn a_failed_job_rolls_back_alone_and_its_neighbours_commit() {
        let (_dir, store) = open_temp();
        let ok = store.write_blocking(Priority::Bulk, |c| {
            c.execute("UPDATE time_floor SET floor = 10 WHERE id = 1", [])?;
            Ok(())
        });
        assert!(ok.is_ok());
        let bad = store.write_blocking(Priority::Bulk, |c| {
            c.execute("UPDATE time_floor SET floor = 20 WHERE id = 1", [])?;
            Err::<(), _>(StoreError::Closed)
        });
        assert!(bad.is_err());
        let floor: i64 = store
            .reader()
            .unwrap()
            .query_row("SELECT floor FROM time_floor", [], |r| r.get(0))
            .unwrap();
        assert_eq!(floor, 10);
    }

    #[test]
    fn a_failed_job_inside_a_group_rolls_back_alone_and_the_group_commits() {
        let (_dir, store) = open_temp();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // `join!` queues all three before the writer finishes the first, so
        // they share one transaction: the first without a savepoint of its
        // own, the others each in one.
        let (a, b, c) = rt.block_on(async {
            tokio::join!(
                store.write(Priority::Bulk, |c| {
                    c.execute("UPDATE time_floor SET floor = 10 WHERE id = 1", [])?;
                    std::thread::sleep(Duration::from_millis(1));
                    Ok(())
                }),
                store.write(Priority::Bulk, |c| {
                    c.execute("UPDATE seq_state SET head_seq = 99 WHERE id = 1", [])?;
                    Err::<(), _>(StoreError::Closed)
                }),
                store.write(Priority::Bulk, |c| {
                    c.execute("UPDATE time_floor SET floor = 30 WHERE id = 1", [])?;
                    Ok(())
                }),
            )
        });
        assert!(a.is_ok() && b.is_err() && c.is_ok(), "{a:?} {b:?} {c:?}");
        let r = store.reader().unwrap();
        let floor: i64 = r
            .query_row("SELECT floor FROM time_floor", [], |r| r.get(0))
            .unwrap();
        let head: i64 = r
            .query_row("SELECT head_seq FROM seq_state", [], |r| r.get(0))
            .unwrap();
        assert_eq!((floor, head), (30, 0));
    }

    #[test]
    fn committed_pages_reach_the_database_file_while_the_store_is_open() {
        // The writer never checkpoints; the checkpointer thread must.
        let (dir, store) = open_temp();
        let db = dir.path().join("lockhub.db");
        let before = std::fs::metadata(&db).unwrap().len();
        commit_kib(&store, 500);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::metadata(&db).unwrap().len() < before + 500 * 1024 {
            assert!(
                Instant::now() < deadline,
                "the WAL was not checkpointed into the database file"
            );
            std::thread::sleep(CHECKPOINT_TICK);
        }
        store.close();
    }

    #[test]
    fn the_wal_stays_bounded_under_a_stream_of_commits_beside_readers_and_is_emptied_when_idle() {
        let (dir, store) = open_temp();
        let wal = dir.path().join("lockhub.db-wal");
        let size = || std::fs::metadata(&wal).map_or(0, |m| m.len());
        // Readers come and go all the time (the door, the publisher).
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2)
            .map(|_| {
                let (r, stop) = (store.reader().unwrap(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _: i64 = r
                            .query_row("SELECT count(*) FROM outbox", [], |r| r.get(0))
                            .unwrap();
                    }
                })
            })
            .collect();
        let peak = wal_peak_over_96_mib(&store, size);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        readers.into_iter().for_each(|r| r.join().unwrap());
        assert!(peak <= 64 << 20, "the WAL reached {peak} bytes");
        // Idle: back to at most 4 MiB within a minute (issue 14's bound).
        let deadline = Instant::now() + Duration::from_secs(60);
        while size() > 4 << 20 {
            assert!(
                Instant::now() < deadline,
                "the WAL is still {} bytes after a minute idle",
                size()
            );
            std::thread::sleep(CHECKPOINT_TICK);
        }
        store.close();
    }

    /// Commits 96 MiB of outbox bodies, 128 KiB a commit, back to back, and
    /// returns the WAL file's largest `size` seen after a commit.
    fn wal_peak_over_96_mib(store: &Store, size: impl Fn() -> u64) -> u64 {
        let mut peak = 0;
        for _ in 0..768 {
            commit_kib(store, 128);
            peak = peak.max(size());
        }
        peak
    }

    /// One bulk commit of `kib` outbox bodies of 1 KiB each: what the
    /// checkpoint and WAL tests write.
    fn commit_kib(store: &Store, kib: usize) {
        store
            .write_blocking(Priority::Bulk, move |c| {
                for _ in 0..kib {
                    outbox::enqueue(
                        c,
                        outbox::Topic::Audit,
                        &[7u8; 1024],
                        None,
                        lockhub_proto::time::Timestamp(0),
                    )?;
                }
                Ok(())
            })
            .unwrap();
    }

    #[test]
    fn after_a_restart_the_writer_writes_over_the_wal_file_instead_of_cutting_it_back_and_growing_it()
     {
        let (dir, store) = open_temp();
        let wal = dir.path().join("lockhub.db-wal");
        let size = || std::fs::metadata(&wal).map_or(0, |m| m.len());
        // The WAL header's checkpoint sequence number (bytes 12..16, big
        // endian) goes up by one each time the WAL starts over.
        let restarts = || {
            use std::io::Read;
            let mut head = [0u8; 16];
            std::fs::File::open(&wal)
                .and_then(|mut f| f.read_exact(&mut head))
                .map_or(0, |()| {
                    u32::from_be_bytes([head[12], head[13], head[14], head[15]])
                })
        };
        // The WAL's header and [`RESTART_PAGES`] frames of 4 KiB pages.
        let filled = 32 + RESTART_PAGES * (4096 + 24);
        let first = restarts();
        let (mut last, mut shrank, mut after_restart) = (0, None, 0);
        // 128 KiB a commit, back to back, until a few commits after the
        // first restart (at most 48 MiB).
        for _ in 0..384 {
            commit_kib(&store, 128);
            // A file cut back at all is cut to at least what the WAL
            // fills between two restarts, so commits after one do not
            // grow it again.
            let now = size();
            if now < last.min(filled) {
                shrank.get_or_insert((last, now));
            }
            last = now;
            if restarts() != first {
                after_restart += 1;
                if after_restart == 8 {
                    break;
                }
            }
        }
        assert_eq!(after_restart, 8, "the WAL never started over");
        assert_eq!(
            shrank, None,
            "the file was cut back (bytes before, after) and will grow again"
        );
        store.close();
    }

    #[test]
    fn the_wal_restarts_while_readers_on_its_old_frames_keep_coming_and_going() {
        let (dir, store) = open_temp();
        let wal = dir.path().join("lockhub.db-wal");
        let size = || std::fs::metadata(&wal).map_or(0, |m| m.len());
        // Two readers, each holding a read transaction for a few ms at a
        // time, staggered: nearly always one of them began before the
        // checkpointer's last copy (the publisher during a resync). Left
        // to SQLite's own restart at the next commit, which gives up at
        // once if a reader is on the old frames, the WAL reached 106 MiB.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> = (0..2u64)
            .map(|i| {
                let (r, stop) = (store.reader().unwrap(), stop.clone());
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(2 * i));
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        r.execute_batch("BEGIN").unwrap();
                        let _: i64 = r
                            .query_row("SELECT count(*) FROM policy", [], |r| r.get(0))
                            .unwrap();
                        std::thread::sleep(Duration::from_millis(4));
                        r.execute_batch("COMMIT").unwrap();
                    }
                })
            })
            .collect();
        let peak = wal_peak_over_96_mib(&store, size);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        readers.into_iter().for_each(|r| r.join().unwrap());
        assert!(peak <= 64 << 20, "the WAL reached {peak} bytes");
        store.close();
    }

    #[test]
    fn bulk_work_waits_for_the_checkpointer_to_copy_a_small_rest_or_any_rest_far_past_the_threshold()
     {
        // A card's cost per write: only the page rule makes a rest small.
        let step = |pages, rest| WalStep::after_copy(pages, rest, paced::RUN_COST_UNKNOWN);
        // Below the threshold: keep copying.
        assert_eq!(step(RESTART_PAGES - 1, 0), WalStep::Copy);
        // Past it with little left: bulk groups wait for that copy.
        assert_eq!(step(RESTART_PAGES, RESTART_REST), WalStep::Restart);
        assert_eq!(step(RESTART_PAGES, RESTART_REST + 1), WalStep::Copy);
        // Far past it with much left: bulk groups wait for the checkpointer
        // to catch up.
        assert_eq!(
            step(2 * RESTART_PAGES, 2 * RESTART_PAGES),
            WalStep::HoldBulk
        );
        assert_eq!(step(3 * RESTART_PAGES, RESTART_REST + 1), WalStep::HoldBulk);
        assert_eq!(step(3 * RESTART_PAGES, RESTART_REST), WalStep::Restart);
    }

    #[test]
    fn with_every_frame_copied_nothing_waits_and_the_next_commit_restarts_the_wal_by_itself() {
        for worst in [paced::RUN_COST_UNKNOWN, Duration::from_micros(3)] {
            for pages in [RESTART_PAGES, 3 * RESTART_PAGES] {
                assert_eq!(WalStep::after_copy(pages, 0, worst), WalStep::Copy);
            }
        }
    }

    #[test]
    fn a_door_job_sent_while_bulk_work_waits_for_the_checkpointer_wakes_the_writer_at_once() {
        let wal = Arc::new(WalState::default());
        wal.hold_bulk
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = wal.writer.set(std::thread::current());
        let (tx, mut rx) = mpsc::channel::<Job>(8);
        let bulk = Store::job_of(Priority::Bulk, false, false, None, None, |_| Ok(()));
        let mut pending = VecDeque::from([bulk.0]);
        let sender = {
            let wal = wal.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                let door = Store::job_of(Priority::Door, false, false, None, None, |_| Ok(()));
                tx.blocking_send(door.0).unwrap();
                wal.wake_writer();
            })
        };
        // A hold far longer than the test may take: only the wakeup ends it.
        let started = Instant::now();
        hold_bulk_while_behind(&mut rx, &mut pending, &wal, Duration::from_secs(60));
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the writer slept through the door job"
        );
        assert!(
            pending
                .front()
                .is_some_and(|j| j.priority == Priority::Door)
        );
        sender.join().unwrap();
    }

    #[test]
    fn on_a_fast_disk_a_rest_that_copies_within_the_budget_is_restarted_instead_of_holding_bulk_work()
     {
        let fast = Duration::from_micros(3);
        let fits = u64::try_from(RESTART_BUDGET.as_nanos() / fast.as_nanos()).unwrap();
        let step = |pages, rest| WalStep::after_copy(pages, rest, fast);
        assert_eq!(step(3 * RESTART_PAGES, fits), WalStep::Restart);
        assert_eq!(step(3 * RESTART_PAGES, fits + 1), WalStep::HoldBulk);
        assert_eq!(step(RESTART_PAGES - 1, 0), WalStep::Copy);
    }

    fn so_far(jobs: usize, elapsed_ms: u64, door_ran: bool, alone: bool) -> GroupSoFar {
        GroupSoFar {
            jobs,
            elapsed: Duration::from_millis(elapsed_ms),
            door_ran,
            alone,
        }
    }

    #[test]
    fn a_waiting_door_job_joins_the_group_in_hand_whatever_the_group_has_done() {
        for group in [
            so_far(1, 0, false, false),
            so_far(3, 10 * GROUP_BUDGET.as_millis() as u64, false, false),
            so_far(MAX_GROUP, 0, false, false),
            so_far(1, 0, false, true),
            so_far(2, 0, true, false),
        ] {
            assert_eq!(
                GroupStep::after_job(group, true),
                GroupStep::Next,
                "{group:?}"
            );
        }
    }

    #[test]
    fn once_a_door_job_has_run_the_group_commits_without_more_bulk_work() {
        assert_eq!(
            GroupStep::after_job(so_far(1, 0, true, false), false),
            GroupStep::Commit
        );
    }

    #[test]
    fn a_bulk_group_takes_jobs_until_its_budget_or_its_size_runs_out() {
        let budget = GROUP_BUDGET.as_millis() as u64;
        assert_eq!(
            GroupStep::after_job(so_far(4, budget - 1, false, false), false),
            GroupStep::Next
        );
        assert_eq!(
            GroupStep::after_job(so_far(4, budget, false, false), false),
            GroupStep::Commit
        );
        assert_eq!(
            GroupStep::after_job(so_far(MAX_GROUP, 0, false, false), false),
            GroupStep::Commit
        );
    }

    #[test]
    fn a_job_alone_ends_its_group_unless_a_door_job_waits() {
        assert_eq!(
            GroupStep::after_job(so_far(1, 0, false, true), false),
            GroupStep::Commit
        );
    }

    #[test]
    fn a_fast_sequential_step_does_not_let_bulk_work_wait_for_more_than_a_few_pages_on_a_card() {
        // The card measured 8 ms a scattered page, then a hundred steps of
        // sequential pages wrote out in 0.4 ms each.
        let mut pace = paced::Pace::default();
        let random = paced::Step {
            pages: 16,
            runs: 16,
        };
        pace.wrote_out(random, Duration::from_millis(128));
        let sequential = paced::Step { pages: 16, runs: 1 };
        for _ in 0..100 {
            pace.wrote_out(sequential, Duration::from_micros(400));
        }
        let worst = pace.worst_run();
        assert!(!WalStep::small_rest(RESTART_REST + 1, worst));
    }

    #[test]
    fn a_door_job_is_signalled_as_in_flight_from_its_sending_until_its_answer() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (_dir, store) = open_temp();
        let signal = store.door_signal();
        let release = Arc::new(AtomicBool::new(false));
        let hold = release.clone();
        let (bulk_store, door_store) = (store.clone(), store.clone());
        let bulk = std::thread::spawn(move || {
            bulk_store.write_blocking(Priority::Bulk, move |_| {
                while !hold.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                Ok(())
            })
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!signal.waiting(), "no door job yet");
        let in_job = door_store.door_signal();
        let door = std::thread::spawn(move || {
            door_store.write_blocking(Priority::Door, move |c| {
                c.execute("UPDATE time_floor SET floor = 5 WHERE id = 1", [])?;
                // Running, its commit still to come: the checkpointer
                // must not start a step that the commit would wait for.
                Ok(in_job.waiting())
            })
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        while !signal.waiting() {
            assert!(
                Instant::now() < deadline,
                "the door job never showed as waiting"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        release.store(true, Ordering::Relaxed);
        bulk.join().unwrap().unwrap();
        assert!(
            door.join().unwrap().unwrap(),
            "a running door job still counts until it has committed"
        );
        assert!(!signal.waiting(), "the door job has been answered");
        store.close();
    }

    #[test]
    fn a_file_that_is_not_a_database_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lockhub.db");
        std::fs::write(&path, vec![0x42u8; 8192]).unwrap();
        let err = Store::open(&path, &Policy::default())
            .err()
            .expect("must refuse");
        assert!(
            matches!(err, StoreError::Corrupt { .. } | StoreError::Open { .. }),
            "{err}"
        );
    }

    #[test]
    fn a_database_newer_than_the_binary_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lockhub.db");
        drop(Store::open(&path, &Policy::default()).unwrap());
        let c = Connection::open(&path).unwrap();
        c.pragma_update(None, "user_version", 999).unwrap();
        drop(c);
        let err = Store::open(&path, &Policy::default())
            .err()
            .expect("must refuse");
        assert!(
            matches!(err, StoreError::TooNew { found: 999, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("newer than this lockhub knows"));
    }

    #[test]
    fn a_door_job_queued_behind_bulk_jobs_runs_before_them() {
        let (_dir, store) = open_temp();
        let order = Arc::new(Mutex::new(Vec::new()));
        // Hold the writer inside a first job while the others queue up.
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let blocker = {
            let (s, o) = (store.clone(), order.clone());
            std::thread::spawn(move || {
                s.write_blocking(Priority::Bulk, move |_| {
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    o.lock().unwrap().push("first");
                    Ok(())
                })
            })
        };
        started_rx.recv().unwrap();
        let mut queued = Vec::new();
        for (name, priority) in [
            ("bulk", Priority::Bulk),
            ("bulk", Priority::Bulk),
            ("door", Priority::Door),
        ] {
            let (s, o) = (store.clone(), order.clone());
            queued.push(std::thread::spawn(move || {
                s.write_blocking(priority, move |_| {
                    o.lock().unwrap().push(name);
                    Ok(())
                })
            }));
            // Each is on the channel before the next is sent.
            std::thread::sleep(Duration::from_millis(50));
        }
        release_tx.send(()).unwrap();
        blocker.join().unwrap().unwrap();
        queued.into_iter().for_each(|t| t.join().unwrap().unwrap());
        assert_eq!(*order.lock().unwrap(), ["first", "door", "bulk", "bulk"]);
    }

    fn floor(store: &Store) -> i64 {
        store
            .reader()
            .unwrap()
            .query_row("SELECT floor FROM time_floor", [], |r| r.get(0))
            .unwrap()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn a_door_job_that_reaches_the_writer_after_its_deadline_is_refused_unrun() {
        let (_dir, store) = open_temp();
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = ran.clone();
        let past = Instant::now() - Duration::from_millis(1);
        let res = runtime().block_on(store.write_door(past, move |c| {
            r.store(true, std::sync::atomic::Ordering::Relaxed);
            c.execute("UPDATE time_floor SET floor = 7 WHERE id = 1", [])?;
            Ok(())
        }));
        assert!(matches!(res, Err(StoreError::Deadline)), "{res:?}");
        assert!(!ran.load(std::sync::atomic::Ordering::Relaxed));
        assert_eq!(floor(&store), 0);
    }

    #[test]
    fn a_door_job_that_finishes_after_its_deadline_is_rolled_back() {
        let (_dir, store) = open_temp();
        let deadline = Instant::now() + Duration::from_millis(50);
        let res = runtime().block_on(store.write_door(deadline, move |c| {
            c.execute("UPDATE time_floor SET floor = 7 WHERE id = 1", [])?;
            std::thread::sleep(Duration::from_millis(100));
            Ok(())
        }));
        assert!(matches!(res, Err(StoreError::Deadline)), "{res:?}");
        assert_eq!(floor(&store), 0, "nothing of a late door job commits");
        // The writer goes on.
        store
            .write_blocking(Priority::Bulk, |c| {
                c.execute("UPDATE time_floor SET floor = 8 WHERE id = 1", [])?;
                Ok(())
            })
            .unwrap();
        assert_eq!(floor(&store), 8);
    }

    #[test]
    fn with_the_write_lock_held_elsewhere_a_door_job_gives_up_at_its_deadline_ahead_of_a_waiting_bulk_job()
     {
        let (_dir, store) = open_temp();
        let other = Connection::open(store.path()).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        // A bulk job starts waiting for the lock (up to the busy timeout)...
        let bulk = {
            let s = store.clone();
            std::thread::spawn(move || {
                s.write_blocking(Priority::Bulk, |c| {
                    c.execute("UPDATE time_floor SET floor = 3 WHERE id = 1", [])?;
                    Ok(())
                })
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        // ...and a door job arriving behind it is answered by its deadline,
        // not after the bulk job's wait.
        let deadline = Instant::now() + Duration::from_millis(300);
        let res = runtime().block_on(store.write_door(deadline, |c| {
            c.execute("UPDATE time_floor SET floor = 9 WHERE id = 1", [])?;
            Ok(())
        }));
        assert!(matches!(res, Err(StoreError::Deadline)), "{res:?}");
        assert!(
            Instant::now() < deadline + BUSY_TIMEOUT,
            "the door job waited for the bulk job's busy timeout"
        );
        other.execute_batch("ROLLBACK").unwrap();
        // The bulk job, tried again after the door, commits once the lock is free.
        bulk.join().unwrap().unwrap();
        assert_eq!(floor(&store), 3);
    }

    #[test]
    fn many_concurrent_writers_all_commit() {
        let (_dir, store) = open_temp();
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let s = store.clone();
                std::thread::spawn(move || {
                    for i in 0..50i64 {
                        s.write_blocking(Priority::Bulk, move |c| {
                            c.execute(
                                "INSERT INTO seq_seen (seq) VALUES (?1)",
                                [t * 1000 + i + 1],
                            )?;
                            Ok(())
                        })
                        .unwrap();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let n: i64 = store
            .reader()
            .unwrap()
            .query_row("SELECT count(*) FROM seq_seen", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 400);
    }
}
