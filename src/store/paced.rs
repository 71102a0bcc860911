//! The checkpointer's writes to the database file, in steps bounded by
//! pages.
//!
//! Why: a checkpoint copies every new WAL frame into the database file
//! (page-cache writes, no I/O yet) and then fsyncs it, which submits all of
//! those pages to the disk at once. They are scattered index leaves, one
//! write each: on an SD card doing ~100 random writes a second
//! (`scripts/slow-disk 100 20`) a checkpoint of 1,000 pages put ten seconds
//! of writes in the device queue, and a door's commit (its WAL append and
//! fsync) queued behind them and missed its 2 s bound (docs/performance-notes.md, "A
//! slow disk"). So the checkpointer's connection opens the database through
//! this VFS, which is SQLite's own `unix` VFS with the main file's `xWrite`
//! and `xSync` wrapped: every step of pages it writes out what it wrote
//! (`sync_file_range`, waiting for it) before writing more (a step is
//! [`STEP_PAGES`] at first, more only while even its worst case writes
//! out within [`STEP_BUDGET`]: [`Pace`]), and
//! before each step goes out it waits while a door job waits for the
//! writer ([`DoorSignal`]), so at most one step sits ahead of a door's
//! commit in the device queue.
//! SQLite's own fsync at the end of the checkpoint then finds at most one
//! step left, and still comes before the checkpoint is recorded as done,
//! so durability is unchanged.
//!
//! Only the checkpointer's thread paces ([`pace_this_thread`]); any other
//! connection opened through this VFS behaves exactly like `unix`.

// The crate's one VFS shim: SQLite's C interface has no safe wrapper for
// it. Every unsafe block says why it holds.
#![allow(unsafe_code)]

use super::DoorSignal;
use rusqlite::ffi;
use std::cell::RefCell;
use std::ffi::{CStr, c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The VFS's name, for `Connection::open_with_flags_and_vfs`.
pub(super) const VFS: &CStr = c"lockhub-paced";

/// Pages in a step at first and at least: at 100 random writes a second,
/// 16 pages are ~160 ms in the device queue ahead of a door's commit (the
/// door's whole bound is 2 s). Smaller steps cost more syscalls for the
/// same pages.
pub(super) const STEP_PAGES: u32 = 16;
/// The largest step. With 16-page steps on the VM's disk (a write-out well
/// under a millisecond) the checkpointer fell behind a full-mirror flood,
/// bulk work waited for it, and the ingest ran at ~1,500 instead of ~4,500
/// events/s (docs/performance-notes.md, "Issue 14 on the merged code").
pub(super) const STEP_PAGES_MAX: u32 = 4096;
/// What one step's write-out may take, predicted at its worst: every page
/// of it a run of its own, each costing the worst time per run measured
/// lately ([`Pace`]). This, not a page count, is what sits ahead of a
/// door's commit.
pub(super) const STEP_BUDGET: Duration = Duration::from_millis(15);
/// The time per run assumed until one is measured: an SD card's random
/// write (~10 ms at 100 IOPS), so a fresh hub starts with the smallest
/// steps and bulk work waits for a WAL restart's copy only by
/// [`STEP_PAGES`]' sibling rule (`RESTART_REST`).
pub(super) const RUN_COST_UNKNOWN: Duration = Duration::from_millis(10);
/// How fast the worst time per run is forgotten: a step of `runs` runs
/// that wrote out faster keeps `FORGET_RUNS / (FORGET_RUNS + runs)` of the
/// old worst. So only many runs measured fast (random writes, the kind a
/// step is budgeted by) bring it down; a step of one long sequential run
/// barely moves it, however quick.
const FORGET_RUNS: u32 = 256;

/// How long one step waits for door jobs before it goes out anyway, so a
/// steady stream of entries cannot stop the checkpoint (and grow the WAL)
/// for good. A door job waits at most its own deadline (2 s).
const DOOR_PAUSE_MAX: Duration = Duration::from_secs(2);

/// A step's pages and their runs: stretches of consecutive pages, each one
/// write for the device (SQLite writes a checkpoint's pages in page order,
/// so a gap starts a run).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Step {
    pub(super) pages: u32,
    pub(super) runs: u32,
}

/// Counts the pages and runs a checkpoint writes and says when a step is
/// full.
#[derive(Debug, Default)]
pub(super) struct Steps {
    step: Step,
    /// Where the last page written ended.
    next: Option<i64>,
}

impl Steps {
    /// Before writing `len` bytes at `offset`: the step to write out first,
    /// if the pages written since the last write-out make a full one of
    /// `limit` pages. The page then starts the next step.
    pub(super) fn before_page(&mut self, offset: i64, len: i64, limit: u32) -> Option<Step> {
        let full = (self.step.pages >= limit).then(|| std::mem::take(&mut self.step));
        if self.step.pages == 0 || self.next != Some(offset) {
            self.step.runs += 1;
        }
        self.step.pages += 1;
        self.next = Some(offset.saturating_add(len));
        full
    }

    /// SQLite synced the file: nothing is pending.
    pub(super) fn synced(&mut self) {
        *self = Steps::default();
    }
}

/// How big the next step may be, from what the last ones cost.
///
/// Why the worst time per run, and not the last step's time per page: the
/// device's cost is per write, and a step of sequential pages is one write
/// however many pages it holds. Steps sized by their last time per page
/// (613ab61, reverted) grew to thousands of pages on the throttled card
/// and 8 of 200 loaded door entries were denied (docs/performance-notes.md, "Issue 14
/// on the merged code"): most likely steps of sequential pages wrote out
/// quickly, and the next step of scattered index leaves then sat seconds
/// in the device queue. Charged per run, a sequential step reads as one
/// slow write, only many runs measured fast bring the worst down, and a
/// step is sized as if every page were a run of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Pace {
    /// The worst write-out time per run lately ([`FORGET_RUNS`]).
    worst_run: Duration,
    /// Pages in the next step.
    limit: u32,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            worst_run: RUN_COST_UNKNOWN,
            limit: STEP_PAGES,
        }
    }
}

impl Pace {
    /// Pages in the next step.
    pub(super) fn limit(&self) -> u32 {
        self.limit
    }

    /// The worst time per run lately: what any one page written may cost.
    pub(super) fn worst_run(&self) -> Duration {
        self.worst_run
    }

    /// A full `step` took `took` to write out. A step over its budget
    /// shrinks the next one at once (its time per run is the new worst);
    /// steps grow at most twofold a step, and only as far as their
    /// worst case fits [`STEP_BUDGET`].
    pub(super) fn wrote_out(&mut self, step: Step, took: Duration) {
        let runs = step.runs.max(1);
        let sample = took / runs;
        let kept = self
            .worst_run
            .checked_mul(FORGET_RUNS)
            .map_or(self.worst_run, |d| d / (FORGET_RUNS + runs));
        self.worst_run = sample.max(kept).max(Duration::from_nanos(1));
        let fits = STEP_BUDGET.as_nanos() / self.worst_run.as_nanos();
        self.limit = u32::try_from(fits)
            .unwrap_or(u32::MAX)
            .min(self.limit.saturating_mul(2))
            .clamp(STEP_PAGES, STEP_PAGES_MAX);
    }
}

/// The checkpointer's [`Pace::worst_run`], to judge by how long bulk work
/// would wait for a copy (`WalStep::small_rest`). Cheap to clone and to read.
#[derive(Debug, Clone, Default)]
pub(super) struct WorstRun(Arc<AtomicU64>);

impl WorstRun {
    /// As last measured; [`RUN_COST_UNKNOWN`] until then.
    pub(super) fn get(&self) -> Duration {
        match self.0.load(Ordering::Relaxed) {
            0 => RUN_COST_UNKNOWN,
            ns => Duration::from_nanos(ns),
        }
    }

    fn set(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.0.store(ns, Ordering::Relaxed);
    }
}

/// The pacing state of the one thread that paces (the checkpointer's).
struct Paced {
    /// The database file, for writing a step out (`sync_file_range` acts
    /// on the file's pages whichever descriptor asks).
    file: std::fs::File,
    doors: DoorSignal,
    steps: Steps,
    pace: Pace,
    published: WorstRun,
}

impl Paced {
    /// Waits while a door job waits for the writer, at most
    /// [`DOOR_PAUSE_MAX`].
    fn let_doors_go_first(&self) {
        let until = Instant::now() + DOOR_PAUSE_MAX;
        while self.doors.waiting() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Writes the file's dirty pages to the disk and waits for them, with
    /// no journal commit and no cache flush (`sync_file_range`): this only
    /// paces the writes; SQLite's own fsync at the end of the checkpoint
    /// makes them durable before the checkpoint counts. `fdatasync` per
    /// step would cost a device flush every step (~1,000 a second under a
    /// flood on the VM's disk), each one more wait for the door's own
    /// fsync. A failure only loses the pacing: that fsync reports any
    /// error that matters.
    fn write_out(&self) {
        use std::os::fd::AsRawFd;
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: a plain syscall on a descriptor `self.file` owns; offset
        // 0 and length 0 mean the whole file.
        let _ = unsafe { libc::sync_file_range(self.file.as_raw_fd(), 0, 0, flags) };
    }

    /// Before SQLite writes `len` bytes at `offset`: a full step goes out
    /// first (after any waiting door job), timed for the next one's size.
    fn before_write(&mut self, offset: i64, len: i64) {
        if let Some(step) = self.steps.before_page(offset, len, self.pace.limit()) {
            self.let_doors_go_first();
            let started = Instant::now();
            self.write_out();
            self.pace.wrote_out(step, started.elapsed());
            self.published.set(self.pace.worst_run());
        }
    }
}

thread_local! {
    static PACE: RefCell<Option<Paced>> = const { RefCell::new(None) };
}

/// Makes this thread's writes through [`VFS`] to the database at `path`
/// go in steps (see the module's doc), publishing their worst time per
/// run to `published`.
pub(super) fn pace_this_thread(
    path: &std::path::Path,
    doors: DoorSignal,
    published: WorstRun,
) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    PACE.with(|p| {
        *p.borrow_mut() = Some(Paced {
            file,
            doors,
            steps: Steps::default(),
            pace: Pace::default(),
            published,
        })
    });
    Ok(())
}

/// `unix`'s io methods as found at the first open, and the copy whose
/// `xWrite`/`xSync` are wrapped.
struct Methods {
    real: *const ffi::sqlite3_io_methods,
    paced: ffi::sqlite3_io_methods,
}
// SAFETY: both point to immutable, 'static method tables (SQLite's own and
// this copy, never changed after it is built).
unsafe impl Send for Methods {}
// SAFETY: as above: read-only after construction.
unsafe impl Sync for Methods {}

static METHODS: OnceLock<Methods> = OnceLock::new();

/// The registered VFS and the one it wraps.
struct Registered {
    real: *mut ffi::sqlite3_vfs,
}
// SAFETY: SQLite's VFS objects are process-wide and immutable once
// registered.
unsafe impl Send for Registered {}
// SAFETY: as above.
unsafe impl Sync for Registered {}

static REGISTERED: OnceLock<Result<Registered, c_int>> = OnceLock::new();

/// Registers [`VFS`] (once per process). Fails only if SQLite has no
/// default VFS or refuses the registration.
pub(super) fn register() -> Result<(), c_int> {
    let done = REGISTERED.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find(NULL) returns the default VFS (`unix`)
        // or NULL; it initialises SQLite if needed.
        let real = unsafe { ffi::sqlite3_vfs_find(std::ptr::null()) };
        if real.is_null() {
            return Err(ffi::SQLITE_ERROR);
        }
        // SAFETY: `real` is a valid, registered VFS; the copy keeps its
        // pAppData (unix's locking-style finder, which its xOpen reads)
        // and every method but xOpen.
        let mut ours: ffi::sqlite3_vfs = unsafe { std::ptr::read(real) };
        ours.pNext = std::ptr::null_mut();
        ours.zName = VFS.as_ptr();
        ours.xOpen = Some(paced_open);
        let ours = Box::leak(Box::new(ours));
        // SAFETY: `ours` lives for the rest of the process (leaked) and is
        // a complete VFS; 0 = not the default.
        let rc = unsafe { ffi::sqlite3_vfs_register(ours, 0) };
        if rc == ffi::SQLITE_OK {
            Ok(Registered { real })
        } else {
            Err(rc)
        }
    });
    done.as_ref().map(|_| ()).map_err(|rc| *rc)
}

/// Opens through `unix`; for a main database file, swaps in the wrapped
/// methods (the file itself stays `unix`'s, so every other method works
/// on it unchanged).
unsafe extern "C" fn paced_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let Some(Ok(reg)) = REGISTERED.get() else {
        return ffi::SQLITE_ERROR;
    };
    // SAFETY: `reg.real` is `unix`, whose szOsFile this VFS copied, so
    // `file` is large enough for it; the arguments are SQLite's own.
    let rc = unsafe {
        match (*reg.real).xOpen {
            Some(open) => open(reg.real, name, file, flags, out_flags),
            None => ffi::SQLITE_ERROR,
        }
    };
    if rc != ffi::SQLITE_OK || flags & ffi::SQLITE_OPEN_MAIN_DB == 0 {
        return rc;
    }
    // SAFETY: a successful open set `file`'s methods to a static table.
    let real = unsafe { (*file).pMethods };
    if real.is_null() {
        return rc;
    }
    let methods = METHODS.get_or_init(|| {
        // SAFETY: `real` points to unix's static io-methods table.
        let mut paced: ffi::sqlite3_io_methods = unsafe { std::ptr::read(real) };
        paced.xWrite = Some(paced_write);
        paced.xSync = Some(paced_sync);
        Methods { real, paced }
    });
    // Another table (another locking style) than the one wrapped: leave
    // the file unpaced rather than mix the two.
    if methods.real == real {
        // SAFETY: `methods.paced` is 'static and a copy of `real` with two
        // methods wrapped; SQLite reads pMethods only through the file.
        unsafe { (*file).pMethods = &methods.paced };
    }
    rc
}

/// `unix`'s own method from the table that was wrapped.
fn real() -> Option<&'static ffi::sqlite3_io_methods> {
    // SAFETY: `real` points to unix's static table (see `paced_open`).
    METHODS.get().map(|m| unsafe { &*m.real })
}

unsafe extern "C" fn paced_write(
    file: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amount: c_int,
    offset: ffi::sqlite3_int64,
) -> c_int {
    let _ = PACE.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut()
            && let Some(p) = p.as_mut()
        {
            p.before_write(offset, i64::from(amount));
        }
    });
    match real().and_then(|m| m.xWrite) {
        // SAFETY: the arguments are SQLite's, for the `unix` file they
        // were opened as.
        Some(write) => unsafe { write(file, buf, amount, offset) },
        None => ffi::SQLITE_IOERR_WRITE,
    }
}

unsafe extern "C" fn paced_sync(file: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    let _ = PACE.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut()
            && let Some(p) = p.as_mut()
        {
            p.let_doors_go_first();
            p.steps.synced();
        }
    });
    match real().and_then(|m| m.xSync) {
        // SAFETY: as in `paced_write`.
        Some(sync) => unsafe { sync(file, flags) },
        None => ffi::SQLITE_IOERR_FSYNC,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: i64 = 4096;

    /// A full step at `p`'s limit whose every page is a run of its own.
    fn scattered_step(p: &Pace) -> Step {
        Step {
            pages: p.limit(),
            runs: p.limit(),
        }
    }

    /// Pages at `first`, `first + 1`, ... written with `limit`-page steps:
    /// the steps that went out.
    fn write_sequential(s: &mut Steps, first: i64, n: i64, limit: u32) -> Vec<Step> {
        (first..first + n)
            .filter_map(|p| s.before_page(p * PAGE, PAGE, limit))
            .collect()
    }

    #[test]
    fn a_checkpoint_writes_out_a_step_before_every_page_past_a_full_one_and_starts_over_after_a_sync()
     {
        let mut s = Steps::default();
        let step = i64::from(STEP_PAGES);
        let outs: Vec<bool> = (0..3 * step + 1)
            .map(|p| s.before_page(p * PAGE, PAGE, STEP_PAGES).is_some())
            .collect();
        // Nothing for the first step, then a write-out before the first page of
        // each next step.
        let at: Vec<i64> = (0..3 * step + 1).filter(|&i| outs[i as usize]).collect();
        assert_eq!(at, vec![step, 2 * step, 3 * step]);
        // SQLite's own sync wrote everything: a whole step before the next.
        s.synced();
        assert!(write_sequential(&mut s, 0, step, STEP_PAGES).is_empty());
        assert!(s.before_page(step * PAGE, PAGE, STEP_PAGES).is_some());
    }

    #[test]
    fn a_step_counts_each_stretch_of_consecutive_pages_as_one_run() {
        let mut s = Steps::default();
        // Pages 0-3, then 10-11, then 20 alone: three runs in seven pages.
        for p in [0, 1, 2, 3, 10, 11, 20] {
            assert_eq!(s.before_page(p * PAGE, PAGE, 8), None);
        }
        // The eighth page continues the last run; the ninth finds a full step.
        assert_eq!(s.before_page(21 * PAGE, PAGE, 8), None);
        assert_eq!(
            s.before_page(22 * PAGE, PAGE, 8),
            Some(Step { pages: 8, runs: 3 })
        );
        // The page that found the step full starts a run of the next, even
        // though it follows on from the last page written.
        let steps = write_sequential(&mut s, 23, 8, 8);
        assert_eq!(steps, vec![Step { pages: 8, runs: 1 }]);
    }

    #[test]
    fn until_a_step_is_measured_steps_are_the_smallest_and_a_page_costs_a_cards_random_write() {
        let p = Pace::default();
        assert_eq!(p.limit(), STEP_PAGES);
        assert_eq!(p.worst_run(), RUN_COST_UNKNOWN);
        assert_eq!(WorstRun::default().get(), RUN_COST_UNKNOWN);
    }

    #[test]
    fn on_a_card_steps_stay_at_their_smallest() {
        let mut p = Pace::default();
        // 16 scattered pages at 100 IOPS: 160 ms, 10 ms a run.
        for _ in 0..1000 {
            p.wrote_out(
                Step {
                    pages: 16,
                    runs: 16,
                },
                Duration::from_millis(160),
            );
            assert_eq!(p.limit(), STEP_PAGES);
        }
        assert_eq!(p.worst_run(), Duration::from_millis(10));
    }

    #[test]
    fn a_fast_sequential_step_does_not_let_the_next_random_step_grow_past_the_budget() {
        let mut p = Pace::default();
        // What the throttled card measured for scattered pages: 8 ms a run.
        p.wrote_out(
            Step {
                pages: 16,
                runs: 16,
            },
            Duration::from_millis(128),
        );
        // Then steps of the file's new pages at its end: one run each,
        // written out in 0.4 ms (the device merged them into one write).
        // Per page that is 25 µs, which would allow a 600-page step.
        for _ in 0..100 {
            p.wrote_out(Step { pages: 16, runs: 1 }, Duration::from_micros(400));
            // The next step, if every page is a scattered one at the worst
            // cost seen, still writes out within the budget.
            let worst_case = p.worst_run() * p.limit();
            assert!(
                p.limit() == STEP_PAGES || worst_case <= STEP_BUDGET,
                "{} pages at {:?} each",
                p.limit(),
                p.worst_run()
            );
        }
        // A hundred such steps forgot little of the card's cost: the steps
        // never grew, and the next random step is the smallest again.
        assert_eq!(p.limit(), STEP_PAGES);
        assert!(
            p.worst_run() > Duration::from_millis(5),
            "{:?}",
            p.worst_run()
        );
    }

    #[test]
    fn on_a_fast_disk_steps_double_while_their_worst_case_fits_the_budget() {
        let mut p = Pace::default();
        // Scattered pages at 20 µs a run: 750 fit in 15 ms, but the card's
        // assumed cost is forgotten gradually and a step at most doubles.
        let mut limits = vec![p.limit()];
        for _ in 0..200 {
            let step = scattered_step(&p);
            p.wrote_out(step, Duration::from_micros(20) * step.runs);
            limits.push(p.limit());
        }
        assert!(limits.windows(2).all(|w| w[1] <= 2 * w[0]), "{limits:?}");
        assert_eq!(p.limit(), 750, "{limits:?}");
        assert!(p.worst_run() * p.limit() <= STEP_BUDGET);
        // Faster still: never past the largest step.
        for _ in 0..20 {
            let step = scattered_step(&p);
            p.wrote_out(step, Duration::from_nanos(100) * step.runs);
        }
        assert_eq!(p.limit(), STEP_PAGES_MAX);
    }

    #[test]
    fn a_step_over_its_budget_shrinks_the_next_one_at_once() {
        let mut p = Pace::default();
        for _ in 0..200 {
            let step = scattered_step(&p);
            p.wrote_out(step, Duration::from_micros(2) * step.runs);
        }
        assert_eq!(p.limit(), STEP_PAGES_MAX);
        // The disk slows down: 4,096 pages in 1,000 runs took 400 ms, 0.4 ms
        // a run, so 37 pages fit in 15 ms.
        p.wrote_out(
            Step {
                pages: STEP_PAGES_MAX,
                runs: 1000,
            },
            Duration::from_millis(400),
        );
        assert_eq!(p.limit(), 37);
        // Slower still: the smallest step.
        p.wrote_out(Step { pages: 37, runs: 1 }, Duration::from_millis(10));
        assert_eq!(p.limit(), STEP_PAGES);
        assert_eq!(p.worst_run(), Duration::from_millis(10));
    }

    #[test]
    fn the_writer_reads_the_worst_time_per_run_the_checkpointer_published() {
        let shared = WorstRun::default();
        let writer = shared.clone();
        shared.set(Duration::from_micros(7));
        assert_eq!(writer.get(), Duration::from_micros(7));
    }
}
