//! The writer thread: group commit, the door's place in the queue, and the
//! busy handler that lets a door job give up at its deadline.

use super::*;

/// How long the writer waits for another process's write lock: the
/// writer's busy handler.
///
/// Why not a plain `busy_timeout`: a bulk group waiting 5 s for the lock
/// (an operator's `lockhub alert clear`, a stuck second process) would hold
/// a door job behind it, and a door job must give up at its own deadline.
/// So a bulk group gives up as soon as a door job waits (and is tried again
/// after it), and a door group gives up at its deadline.
pub(super) struct Patience {
    pub(super) base: Instant,
    /// Give up at this many µs after `base`.
    pub(super) until_us: std::sync::atomic::AtomicU64,
    /// Give up as soon as a door job waits.
    pub(super) yield_to_doors: std::sync::atomic::AtomicBool,
    pub(super) doors: DoorSignal,
}

impl Patience {
    pub(super) fn new(doors: DoorSignal) -> Self {
        Patience {
            base: Instant::now(),
            until_us: std::sync::atomic::AtomicU64::new(0),
            yield_to_doors: std::sync::atomic::AtomicBool::new(false),
            doors,
        }
    }

    pub(super) fn set(&self, until: Instant, yield_to_doors: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let us = until.saturating_duration_since(self.base).as_micros();
        self.until_us
            .store(u64::try_from(us).unwrap_or(u64::MAX), Relaxed);
        self.yield_to_doors.store(yield_to_doors, Relaxed);
    }

    pub(super) fn elapsed_us(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    pub(super) fn yields(&self) -> bool {
        self.yield_to_doors
            .load(std::sync::atomic::Ordering::Relaxed)
            && self.doors.waiting()
    }

    /// SQLite's busy callback: sleep a little and try again, or give up.
    pub(super) fn busy(&self, attempt: i32) -> bool {
        let until = self.until_us.load(std::sync::atomic::Ordering::Relaxed);
        let left = until.saturating_sub(self.elapsed_us());
        if left == 0 || self.yields() {
            return false;
        }
        let step = if attempt < 10 { 1_000 } else { 5_000 };
        std::thread::sleep(Duration::from_micros(step.min(left)));
        self.elapsed_us() < until && !self.yields()
    }
}

/// The writer thread: group jobs into transactions until every sender is gone.
pub(super) fn writer_loop(
    conn: Connection,
    mut rx: mpsc::Receiver<Job>,
    patience: &Patience,
    wal: &WalState,
) {
    let mut pending: VecDeque<Job> = VecDeque::new();
    let mut restart_tried = Instant::now() - RESTART_RETRY;
    loop {
        if pending.is_empty() {
            match rx.blocking_recv() {
                Some(job) => pending.push_back(job),
                None => break,
            }
        }
        take_waiting(&mut rx, &mut pending);
        hold_bulk_while_behind(&mut rx, &mut pending, wal, HOLD_BULK_MAX);
        let door_first = pending
            .front()
            .is_some_and(|j| j.priority == Priority::Door);
        if wal.restart_due.load(std::sync::atomic::Ordering::Relaxed)
            && !door_first
            && restart_tried.elapsed() >= RESTART_RETRY
        {
            wal.restart(&conn, patience);
            restart_tried = Instant::now();
        }
        if pending.front().is_some_and(|j| j.outside) {
            if let Some(job) = pending.pop_front() {
                // The scrub's TRUNCATE waits for readers through the busy
                // handler, on the writer thread, with every door job behind
                // it: it gives up at once and is tried again later.
                patience.set(Instant::now(), false);
                let (_, finish) = (job.run)(Ok(&conn));
                finish(Ok(()));
            }
            continue;
        }
        run_group(&conn, &mut pending, &mut rx, patience);
    }
    // Dropping the connection checkpoints the WAL when it is the last one.
    patience.set(Instant::now() + BUSY_TIMEOUT, false);
    drop(conn);
}

/// While bulk work waits for the checkpointer's copy ([`WalStep::Restart`],
/// [`WalStep::HoldBulk`]), a bulk group waits for it, up to `max`
/// ([`HOLD_BULK_MAX`]); a door job that arrives meanwhile goes first at
/// once. The writer sleeps until woken ([`WalState::wake_writer`]: a door
/// job sent, the checkpointer caught up) or the hold ends; it used to look
/// every 1 ms, and a door job sent meanwhile waited for the look (0.25 ms
/// on average, up to 1 ms, traced in the door benchmark).
pub(super) fn hold_bulk_while_behind(
    rx: &mut mpsc::Receiver<Job>,
    pending: &mut VecDeque<Job>,
    wal: &WalState,
    max: Duration,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let bulk_next = |p: &VecDeque<Job>| p.front().is_some_and(|j| j.priority == Priority::Bulk);
    let until = Instant::now() + max;
    while wal.hold_bulk.load(Relaxed) && bulk_next(pending) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::park_timeout(left);
        take_waiting(rx, pending);
    }
}

/// Moves every job already waiting on the channel into `pending`; door jobs
/// go ahead of every bulk job (behind earlier door jobs).
pub(super) fn take_waiting(rx: &mut mpsc::Receiver<Job>, pending: &mut VecDeque<Job>) {
    while pending.len() < QUEUE_DEPTH {
        match rx.try_recv() {
            Ok(job) if job.priority == Priority::Door => {
                let at = pending
                    .iter()
                    .position(|j| j.priority != Priority::Door)
                    .unwrap_or(pending.len());
                pending.insert(at, job);
            }
            Ok(job) => pending.push_back(job),
            Err(_) => break,
        }
    }
}

/// Whether a job's deadline has passed.
pub(super) fn late(job_deadline: Option<Instant>) -> bool {
    job_deadline.is_some_and(|d| Instant::now() >= d)
}

/// What a group has done so far, as [`GroupStep`] judges it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct GroupSoFar {
    /// Jobs run and kept (their savepoints released).
    pub(super) jobs: usize,
    /// Since the group began.
    pub(super) elapsed: Duration,
    /// A door job has run in it.
    pub(super) door_ran: bool,
    /// Its job was alone in the transaction ([`Store::write_alone`]).
    pub(super) alone: bool,
}

/// What the writer does after a job of its group has run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GroupStep {
    /// Run the next pending job in this transaction.
    Next,
    /// Commit now, and answer every job of the group.
    Commit,
}

impl GroupStep {
    /// `door_next`: the next pending job is a door job.
    ///
    /// A waiting door job joins the group in hand whatever the group has
    /// done (past the budget too, and behind a job alone): it waits for the
    /// event running when it arrived, never for a commit of its own behind
    /// the group's. Once a door job has run, the group commits without
    /// taking more bulk work, so the door's answer waits for nothing else.
    /// Otherwise the group takes bulk jobs until the budget, [`MAX_GROUP`],
    /// or a job alone ends it (or nothing is pending: it commits then
    /// whatever this says).
    pub(super) fn after_job(group: GroupSoFar, door_next: bool) -> GroupStep {
        if door_next {
            GroupStep::Next
        } else if group.door_ran
            || group.alone
            || group.elapsed >= GROUP_BUDGET
            || group.jobs >= MAX_GROUP
        {
            GroupStep::Commit
        } else {
            GroupStep::Next
        }
    }
}

/// Runs jobs from the front of `pending` in one transaction and commits.
/// Between jobs it looks at the channel again, so a door job that arrives
/// mid-group runs next and shares this group's commit, even past the budget;
/// once a door job has run, the group commits without taking more bulk
/// work, so the door's answer waits for nothing else. A door job past its
/// deadline is answered [`StoreError::Deadline`] and leaves nothing behind.
pub(super) fn run_group(
    conn: &Connection,
    pending: &mut VecDeque<Job>,
    rx: &mut mpsc::Receiver<Job>,
    patience: &Patience,
) {
    // Door jobs whose deadline passed while they queued are refused unrun.
    while pending.front().is_some_and(|j| late(j.deadline)) {
        if let Some(job) = pending.pop_front() {
            let (_, finish) = (job.run)(Err(StoreError::Deadline));
            finish(Ok(()));
        }
    }
    let Some(front) = pending.front() else {
        return;
    };
    let door_deadline = front.deadline;
    // Only a bulk group steps aside: a door job counts as waiting until it
    // starts, so a door group would step aside for itself.
    let bulk = front.priority == Priority::Bulk;
    let wait_until = Instant::now() + BUSY_TIMEOUT;
    patience.set(
        door_deadline.map_or(wait_until, |d| d.min(wait_until)),
        bulk,
    );
    if let Err(e) = conn.execute_batch("BEGIN IMMEDIATE") {
        if bulk && patience.doors.waiting() {
            // Another process holds the write lock and a door job waits:
            // it goes first (`take_waiting`), with its own deadline; this
            // group is tried again after it.
            std::thread::yield_now();
            return;
        }
        let err = if late(door_deadline) {
            StoreError::Deadline
        } else {
            StoreError::Sqlite(e)
        };
        // Nothing ran; fail just the first job, unrun, so a persistent
        // error cannot spin, and let the rest try again.
        if let Some(job) = pending.pop_front() {
            let (_, finish) = (job.run)(Err(err));
            finish(Ok(()));
        }
        return;
    }
    let started = Instant::now();
    let mut finishes: Vec<Finish> = Vec::new();
    let mut door_ran = false;
    while let Some(job) = pending.pop_front() {
        let first = finishes.is_empty();
        if job.outside || (job.alone && !first) {
            pending.push_front(job);
            break;
        }
        if late(job.deadline) {
            let (_, finish) = (job.run)(Err(StoreError::Deadline));
            finish(Ok(()));
            continue;
        }
        // The first job of a group runs without a savepoint of its own: if
        // it fails, the transaction holds nothing else and is rolled back
        // whole. Every savepoint level makes SQLite journal once more each
        // page a job touches, and the first job is most of the writer's work
        // (an ingest slice fills a group), so this saves a level where it
        // counts. The jobs that join the group get their savepoint.
        if !first && conn.execute_batch("SAVEPOINT job").is_err() {
            pending.push_front(job);
            break;
        }
        door_ran |= job.priority == Priority::Door;
        let alone = job.alone;
        let deadline = job.deadline;
        let (ok, finish) = (job.run)(Ok(conn));
        // A door job that finished after its deadline is undone: its
        // caller has denied already.
        let overdue = ok && late(deadline);
        if first && (!ok || overdue) {
            let _ = conn.execute_batch("ROLLBACK");
            // The job reports its own error; nothing was committed.
            finish(if overdue {
                Err(&StoreError::Deadline)
            } else {
                Ok(())
            });
            return;
        }
        let closed = if first {
            Ok(())
        } else if ok && !overdue {
            conn.execute_batch("RELEASE job")
        } else {
            conn.execute_batch("ROLLBACK TO job; RELEASE job")
        };
        if overdue {
            finish(Err(&StoreError::Deadline));
        } else {
            finishes.push(finish);
        }
        if closed.is_err() {
            break;
        }
        take_waiting(rx, pending);
        let door_next = pending
            .front()
            .is_some_and(|j| j.priority == Priority::Door && !j.outside);
        let group = GroupSoFar {
            jobs: finishes.len(),
            elapsed: started.elapsed(),
            door_ran,
            alone,
        };
        if GroupStep::after_job(group, door_next) == GroupStep::Commit {
            break;
        }
    }
    match conn.execute_batch("COMMIT") {
        Ok(()) => finishes.into_iter().for_each(|f| f(Ok(()))),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            let err = StoreError::Sqlite(e);
            finishes.into_iter().for_each(|f| f(Err(&err)));
        }
    }
}
