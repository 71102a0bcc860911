//! The WAL's care: the checkpointer thread beside the writer, what the
//! writer's commits tell it, and the TRUNCATE checkpoint that scrubs the WAL.

use super::*;

/// How often the checkpointer looks at the WAL.
pub(super) const CHECKPOINT_TICK: Duration = Duration::from_millis(100);
/// WAL pages (frames) past which the WAL starts over (4,096-byte pages:
/// 4 MiB). The checkpointer copies new frames into the database file every
/// [`CHECKPOINT_TICK`], but copying is not enough to bound the WAL: it
/// restarts only when a write transaction begins with every frame copied
/// and no reader on them. Under a flood the writer appends while the
/// checkpointer copies, so neither a PASSIVE checkpoint (it never catches
/// up) nor a RESTART from the checkpointer's connection (the writer takes
/// the lock back between every two groups; starved, it timed out) ever got
/// there: the WAL grew to 572 MiB in a 100,000-key resync. So once the WAL
/// is past this size and the checkpointer has copied nearly all of it, bulk
/// groups wait while the checkpointer copies the few frames left (and syncs
/// the database); with every frame copied the writer runs a RESTART
/// checkpoint between two groups, which then copies and syncs nothing and
/// only waits (briefly, giving up for a door job) for readers still on the
/// old frames, and its next commit starts the WAL from the beginning
/// (keeping up to [`WAL_KEPT`] of the file to write over).
///
/// The writer used to run that RESTART with the rest still to copy (copy
/// it, sync the WAL and the database, wait for readers): ~9 a second under
/// a flood, ~10 ms each on the VM's disk, and a door job that arrived
/// meanwhile waited for all of it. A door job that arrives while bulk work
/// waits for the copy goes first at once. (Without the writer's RESTART,
/// leaving the restart to SQLite's own at the next commit, which gives up
/// at once if a reader is on the old frames, the resync's WAL reached
/// 194 MiB: the publisher's readers nearly always were.)
///
/// Letting the WAL grow to 16 MiB between copies, so a page that many
/// commits rewrite is copied once, wrote only ~15 % fewer bytes (the pages
/// that dominate are random index leaves, copied once each either way), for
/// a WAL four times larger on the card and copy bursts of 16 MiB beside
/// the door's commits.
pub(super) const RESTART_PAGES: u64 = 1024;
/// Past [`RESTART_PAGES`], bulk groups wait for the checkpointer to copy
/// the rest once at most this many pages (128 KiB) are left: what they
/// wait for is that copy. (When the writer still copied the rest itself,
/// 12 MiB of it took ~100 ms on the VM's disk, a door entry's worst case in
/// the door benchmark; on a card doing 100 random writes a second,
/// `scripts/slow-disk`, 256 scattered pages are ~2.5 s of writes and 32 are
/// ~0.3 s.) With more left the checkpointer keeps copying beside the writer.
pub(super) const RESTART_REST: u64 = 32;
/// ...or once copying the rest would take at most this long, every page of
/// it charged the worst time per write the checkpointer's paced steps
/// measured lately ([`paced::Pace`]). On the VM's disk that is
/// microseconds, so the WAL restarts with the hundreds of pages a flood
/// adds between two of the checkpointer's looks; bounded by
/// [`RESTART_REST`] alone, bulk work was held for the checkpointer far more
/// often and the full-mirror ingest fell from ~4,950 to ~1,490 events/s. On
/// a card a write costs milliseconds and only the [`RESTART_REST`] rule
/// applies. (Judged by the checkpoint's average time per page instead, as
/// once tried, a copy of sequential pages would make the card look fast.)
/// The database's sync at the end of the copy comes on top.
pub(super) const RESTART_BUDGET: Duration = Duration::from_millis(3);
/// Past twice [`RESTART_PAGES`] with more than [`RESTART_REST`] left to
/// copy, the writer is outrunning the checkpointer. The writer used to
/// restart the WAL then whatever was left, copying it all itself while the
/// door jobs arriving meanwhile waited: at SD-card speed (100 random
/// writes a second) 2,000 pages are ~20 s of writes, far past a door's
/// 2 s commit bound. Now bulk groups wait (up to this long each) for the
/// checkpointer to catch up, as they do for a small rest, and door jobs go
/// ahead meanwhile: the WAL stays bounded by holding back the events, never
/// the door.
pub(super) const HOLD_BULK_MAX: Duration = Duration::from_millis(100);
/// The checkpointer's tick while the writer is holding bulk groups back for
/// it ([`HOLD_BULK_MAX`]): what it waits for is the copy, so the copy
/// follows closely (a door job committed meanwhile adds a few pages to it).
pub(super) const BEHIND_TICK: Duration = Duration::from_millis(1);
/// How long the writer's RESTART and the checkpointer's idle TRUNCATE may
/// wait for readers (and the TRUNCATE for the writer); past it they try
/// again later. The writer's RESTART also gives up the moment a door job
/// waits, so this bounds what a restart adds to a door's answer.
pub(super) const CHECKPOINT_PATIENCE: Duration = Duration::from_millis(50);
/// How often the writer tries a RESTART that readers held off.
pub(super) const RESTART_RETRY: Duration = Duration::from_millis(100);
/// With no commit for this long the hub is idle: the checkpointer copies
/// everything and truncates the WAL to nothing (an SD card's space is
/// better spent elsewhere).
pub(super) const IDLE_AFTER: Duration = Duration::from_secs(2);
/// The size the WAL file is cut back to when it restarts
/// (`journal_size_limit`): without it the file keeps its largest size
/// forever.
pub(super) const WAL_SIZE_LIMIT: i64 = 4 * 1024 * 1024;

/// What the writer's commits tell the checkpointer (SQLite's WAL hook runs
/// after each commit): how many pages the WAL holds and when the last
/// commit was.
#[derive(Debug, Default)]
pub(super) struct WalState {
    pub(super) pages: std::sync::atomic::AtomicU64,
    /// Commits so far: the checkpointer tells "idle" from "busy" by it.
    pub(super) commits: std::sync::atomic::AtomicU64,
    /// Bulk groups wait for the checkpointer's copy ([`WalStep::Restart`],
    /// [`WalStep::HoldBulk`]).
    pub(super) hold_bulk: std::sync::atomic::AtomicBool,
    /// Past [`RESTART_PAGES`] every frame is copied: the writer runs its
    /// RESTART between two groups ([`WalState::restart`]).
    pub(super) restart_due: std::sync::atomic::AtomicBool,
    /// What one page of a copy may cost, as the checkpointer's paced steps
    /// measured it.
    pub(super) worst_run: paced::WorstRun,
    /// The writer's thread, woken from its hold ([`hold_bulk_while_behind`])
    /// when a door job is sent or the checkpointer has caught up.
    pub(super) writer: std::sync::OnceLock<std::thread::Thread>,
}

/// What the checkpointer makes of the WAL after a PASSIVE copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WalStep {
    /// Keep copying beside the writer. Past [`RESTART_PAGES`] with nothing
    /// left to copy, the writer's next commit restarts the WAL by itself.
    Copy,
    /// The WAL is past [`RESTART_PAGES`] and what is left is small
    /// ([`WalStep::small_rest`]): bulk groups wait while the checkpointer
    /// copies it, and the commit after that restarts the WAL.
    Restart,
    /// The WAL is past twice [`RESTART_PAGES`] and more is left: bulk
    /// groups wait for the copy ([`HOLD_BULK_MAX`]).
    HoldBulk,
}

impl WalStep {
    /// `pages` in the WAL, `rest` of them not yet copied, each page of the
    /// rest costing at most `worst_per_page` to copy.
    pub(super) fn after_copy(pages: u64, rest: u64, worst_per_page: Duration) -> WalStep {
        if pages < RESTART_PAGES || rest == 0 {
            WalStep::Copy
        } else if WalStep::small_rest(rest, worst_per_page) {
            WalStep::Restart
        } else if pages >= 2 * RESTART_PAGES {
            WalStep::HoldBulk
        } else {
            WalStep::Copy
        }
    }

    /// A rest small enough for bulk groups to wait for its copy: at most
    /// [`RESTART_REST`] pages, or any that copies within [`RESTART_BUDGET`]
    /// with every page costing `worst_per_page`.
    pub(super) fn small_rest(rest: u64, worst_per_page: Duration) -> bool {
        rest <= RESTART_REST
            || worst_per_page.saturating_mul(u32::try_from(rest).unwrap_or(u32::MAX))
                <= RESTART_BUDGET
    }
}

impl WalState {
    /// The writer's side of [`RESTART_PAGES`], between two groups with no
    /// transaction open: a RESTART checkpoint, with (nearly) nothing left
    /// to copy, that waits for readers on the old frames so the next commit
    /// starts the WAL over. Gives up after [`CHECKPOINT_PATIENCE`] or as
    /// soon as a door job waits, to be tried again after
    /// [`RESTART_RETRY`].
    pub(super) fn restart(&self, conn: &Connection, patience: &Patience) {
        use std::sync::atomic::Ordering::Relaxed;
        patience.set(Instant::now() + CHECKPOINT_PATIENCE, true);
        match wal_checkpoint(conn, "RESTART") {
            Ok((0, log, done)) if log == done => self.restart_due.store(false, Relaxed),
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "WAL restart skipped"),
        }
    }

    /// Wakes the writer if it is holding bulk work (a spare wakeup only
    /// makes its hold look once more).
    pub(super) fn wake_writer(&self) {
        if let Some(t) = self.writer.get() {
            t.unpark();
        }
    }
}

/// Checkpoints the WAL from its own connection and thread.
///
/// SQLite's automatic checkpoint runs inside the commit that crosses 1,000
/// WAL pages, on the writer's thread: under a flood that was 11 % of the
/// writer's time (perf), and a door entry committing at that moment waited
/// for it. The checkpointer does it beside the writer instead (WAL mode
/// allows one writer and one checkpointer at once), so the writer only
/// appends, and bounds the WAL:
/// - every [`CHECKPOINT_TICK`], a PASSIVE checkpoint (which never waits)
///   of what is new; past [`RESTART_PAGES`] bulk groups wait for the last
///   of the copy, then the writer restarts the WAL ([`WalState::restart`],
///   which finds nothing left to copy);
/// - idle for [`IDLE_AFTER`], a TRUNCATE one: the WAL file goes back to
///   zero bytes.
pub(super) struct Checkpointer {
    pub(super) stop: std::sync::mpsc::Sender<()>,
    pub(super) thread: JoinHandle<()>,
}

/// `PRAGMA wal_checkpoint(MODE)`: (busy, pages in the WAL, pages copied).
pub(super) fn wal_checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(i64, i64, i64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get(2)?))
    })
}

impl Checkpointer {
    pub(super) fn start(
        path: &Path,
        wal: Arc<WalState>,
        doors: DoorSignal,
    ) -> Result<Checkpointer, StoreError> {
        // Its writes to the database file go in steps of a few pages, each
        // flushed before the next and after any waiting door job
        // (`paced`): a checkpoint's fsync no longer puts thousands of
        // random writes ahead of a door's commit in the device's queue.
        let vfs = match paced::register() {
            Ok(()) => Some(paced::VFS),
            Err(rc) => {
                tracing::warn!(
                    rc,
                    "paced checkpoint VFS unavailable; checkpoints flush at once"
                );
                None
            }
        };
        let conn = connect_through(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            vfs,
        )?;
        let paced_path = path.to_owned();
        // The checkpoint syncs the WAL before it copies and the database
        // after, as the writer's setting asks.
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
        // TRUNCATE waits for readers through the busy handler, and holds
        // new writes back meanwhile, so it gives up soon.
        conn.busy_timeout(CHECKPOINT_PATIENCE)?;
        let (stop, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("lockhub-checkpt".into())
            .spawn(move || {
                use std::sync::atomic::Ordering::Relaxed;
                if let Err(e) = paced::pace_this_thread(&paced_path, doors, wal.worst_run.clone()) {
                    tracing::warn!(error = %e, "checkpoints not paced");
                }
                let (mut seen, mut quiet_since) = (0u64, Instant::now());
                let tick = |wal: &WalState| {
                    if wal.hold_bulk.load(Relaxed) {
                        BEHIND_TICK
                    } else {
                        CHECKPOINT_TICK
                    }
                };
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    rx.recv_timeout(tick(&wal))
                {
                    let commits = wal.commits.load(Relaxed);
                    if commits != seen {
                        (seen, quiet_since) = (commits, Instant::now());
                    }
                    let pages = wal.pages.load(Relaxed);
                    if pages > 0 {
                        // Copy what is new, beside the writer, in small
                        // steps (a burst of many MiB made the door's own
                        // fsync wait behind it). Once the WAL is past the
                        // threshold and little is left to copy, or past twice
                        // the threshold with more left, bulk groups wait for
                        // the copy, so a writer outrunning it cannot grow the
                        // WAL without bound; with every frame copied (and the
                        // database synced, which PASSIVE does before it counts
                        // them as copied) the writer's next commit restarts
                        // the WAL (see `WalStep`).
                        let (now, rest) = match wal_checkpoint(&conn, "PASSIVE") {
                            // What it reports left is as of its start: the
                            // writer's commits since count too (a rest of
                            // nothing that is not would never restart).
                            Ok((_, _, done)) => {
                                let now = wal.pages.load(Relaxed);
                                (now, now.saturating_sub(u64::try_from(done).unwrap_or(0)))
                            }
                            Err(_) => (pages, pages),
                        };
                        let step = WalStep::after_copy(now, rest, wal.worst_run.get());
                        let hold = step != WalStep::Copy;
                        // Set before the hold ends: the writer let go sees it.
                        wal.restart_due
                            .store(now >= RESTART_PAGES && rest == 0, Relaxed);
                        if wal.hold_bulk.swap(hold, Relaxed) && !hold {
                            wal.wake_writer();
                        }
                        if hold {
                            continue;
                        }
                    }
                    if pages == 0 || quiet_since.elapsed() < IDLE_AFTER {
                        continue;
                    }
                    let mode = "TRUNCATE";
                    match wal_checkpoint(&conn, mode) {
                        // Copied everything, the WAL file is empty.
                        Ok((0, log, done)) if log == done => {
                            let _ = wal.pages.compare_exchange(pages, 0, Relaxed, Relaxed);
                            // The hub has gone idle: the heap too gives back
                            // what the burst left.
                            crate::runtime::alloc::trim();
                        }
                        // A reader or the writer was in the way: next tick.
                        Ok(_) => {}
                        Err(e) => tracing::debug!(error = %e, mode, "WAL checkpoint skipped"),
                    }
                }
            })
            .map_err(|source| StoreError::Thread {
                name: "checkpoint",
                source,
            })?;
        Ok(Checkpointer { stop, thread })
    }

    pub(super) fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

/// What the writer's commits leave of the WAL file when they start it over
/// after a restart (its `journal_size_limit`): up to 16 MiB of it is kept
/// and written over, not cut back to [`WAL_SIZE_LIMIT`] and grown again.
///
/// Why: a commit that makes the file longer needs a journal commit of the
/// file system inside its `fdatasync` (the new size), which waits for the
/// other files' data that journal carries. Cut to 4 MiB at each restart,
/// the WAL grew again with 31 % of all commits and 75 % of the door's
/// commits under ingest (traced in the door benchmark: the loaded WAL ran
/// to 5–19 MiB between restarts), and a growing commit took a median
/// 1.34 ms against 0.73 ms for one written over old frames. 16 MiB is
/// above the WAL's usual high water (15.7 MiB in the resync, 14.7 MiB in
/// the full-mirror ingests) and far below issue 14's 64 MiB bound; the
/// idle TRUNCATE still empties the file after [`IDLE_AFTER`].
pub(super) const WAL_KEPT: i64 = 16 * 1024 * 1024;

/// The TRUNCATE checkpoint, then (only if it emptied the WAL) the held
/// erasure results move to the outbox in a transaction of their own; its
/// pages hold no name.
pub(super) fn scrub_and_release(conn: &Connection) -> Result<(), StoreError> {
    checkpoint_truncate(conn)?;
    let tx = conn.unchecked_transaction()?;
    let n = outbox::release_held(&tx)?;
    tx.commit()?;
    if n > 0 {
        tracing::info!(results = n, "erasure results released after the WAL scrub");
    }
    Ok(())
}

/// `PRAGMA wal_checkpoint(TRUNCATE)`; readers in the way make it a retryable
/// error (the writer runs it with a busy handler that gives up at once).
/// The caller retries. It must not touch `PRAGMA busy_timeout`: setting it
/// replaces the writer's own busy handler ([`Patience`]) for good.
pub(super) fn checkpoint_truncate(conn: &Connection) -> Result<(), StoreError> {
    let busy = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
        r.get::<_, i64>(0)
    })?;
    if busy != 0 {
        return Err(StoreError::CheckpointBlocked);
    }
    Ok(())
}
