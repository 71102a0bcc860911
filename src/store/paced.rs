//! The checkpointer's writes to the database file, in steps bounded by
//! pages.
//!
//! Why: a checkpoint copies every new WAL frame into the database file
//! (page-cache writes, no I/O yet) and then fsyncs it, which submits all of
//! those pages to the disk at once. They are scattered index leaves, one
//! write each: on an SD card doing ~100 random writes a second
//! (`scripts/slow-disk 100 20`) a checkpoint of 1,000 pages put ten seconds
//! of writes in the device queue, and a door's commit (its WAL append and
//! fsync) queued behind them and missed its 2 s bound (BENCHMARKS.md, "A
//! slow disk"). So the checkpointer's connection opens the database through
//! this VFS, which is SQLite's own `unix` VFS with the main file's `xWrite`
//! and `xSync` wrapped: every [`STEP_PAGES`] pages it writes out what it
//! wrote (`sync_file_range`, waiting for it) before writing more, and
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
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The VFS's name, for `Connection::open_with_flags_and_vfs`.
pub(super) const VFS: &CStr = c"lockhub-paced";

/// Pages the checkpointer writes between two write-outs of its own: at 100
/// random writes a second, 16 pages are ~160 ms in the device queue ahead
/// of a door's commit (the door's whole bound is 2 s); on the VM's disk a
/// step is well under a millisecond. Smaller steps cost more syscalls for
/// the same pages.
pub(super) const STEP_PAGES: u32 = 16;

/// How long one step waits for door jobs before it goes out anyway, so a
/// steady stream of entries cannot stop the checkpoint (and grow the WAL)
/// for good. A door job waits at most its own deadline (2 s).
const DOOR_PAUSE_MAX: Duration = Duration::from_secs(2);

/// Counts the pages a checkpoint writes and says when a step is full.
#[derive(Debug, Default)]
pub(super) struct Steps {
    pending: u32,
}

impl Steps {
    /// Before writing a page: whether the pages written since the last
    /// write-out make a full step, to be written out first.
    pub(super) fn before_page(&mut self) -> bool {
        if self.pending >= STEP_PAGES {
            self.pending = 1;
            true
        } else {
            self.pending += 1;
            false
        }
    }

    /// SQLite synced the file: nothing is pending.
    pub(super) fn synced(&mut self) {
        self.pending = 0;
    }
}

/// The pacing state of the one thread that paces (the checkpointer's).
struct Pace {
    /// The database file, for writing a step out (`sync_file_range` acts
    /// on the file's pages whichever descriptor asks).
    file: std::fs::File,
    doors: DoorSignal,
    steps: Steps,
}

impl Pace {
    /// Waits while a door job waits for the writer, at most
    /// [`DOOR_PAUSE_MAX`].
    fn let_doors_go_first(&self) {
        let until = Instant::now() + DOOR_PAUSE_MAX;
        while self.doors.waiting() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Pace {
    /// Writes the file's dirty pages to the disk and waits for them, with
    /// no journal commit and no cache flush (`sync_file_range`): this only
    /// paces the writes; SQLite's own fsync at the end of the checkpoint
    /// makes them durable before the checkpoint counts. `fdatasync` per
    /// step would cost a device flush every 16 pages (~1,000 a second
    /// under a flood on the VM's disk), each one more wait for the door's
    /// own fsync. A failure only
    /// loses the pacing: that fsync reports any error that matters.
    fn write_out(&self) {
        use std::os::fd::AsRawFd;
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: a plain syscall on a descriptor `self.file` owns; offset
        // 0 and length 0 mean the whole file.
        let _ = unsafe { libc::sync_file_range(self.file.as_raw_fd(), 0, 0, flags) };
    }
}

thread_local! {
    static PACE: RefCell<Option<Pace>> = const { RefCell::new(None) };
}

/// Makes this thread's writes through [`VFS`] to the database at `path`
/// go in steps (see the module's doc).
pub(super) fn pace_this_thread(path: &std::path::Path, doors: DoorSignal) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    PACE.with(|p| {
        *p.borrow_mut() = Some(Pace {
            file,
            doors,
            steps: Steps::default(),
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
            && p.steps.before_page()
        {
            p.let_doors_go_first();
            p.write_out();
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

    #[test]
    fn a_checkpoint_writes_out_a_step_before_every_page_past_a_full_one_and_starts_over_after_a_sync()
     {
        let mut s = Steps::default();
        let outs: Vec<bool> = (0..3 * STEP_PAGES + 1).map(|_| s.before_page()).collect();
        // Nothing for the first step, then a write-out before the first page of
        // each next step.
        let at: Vec<usize> = (0..outs.len()).filter(|&i| outs[i]).collect();
        let step = STEP_PAGES as usize;
        assert_eq!(at, vec![step, 2 * step, 3 * step]);
        // SQLite's own sync wrote everything: a whole step before the next.
        s.synced();
        assert!((0..STEP_PAGES).all(|_| !s.before_page()));
        assert!(s.before_page());
    }
}
