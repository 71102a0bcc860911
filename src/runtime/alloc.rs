//! The heap's budget on a small hub: glibc malloc's settings, and giving
//! freed memory back when the hub goes idle.
//!
//! ## Why
//! A Raspberry Pi has 512 MiB to 1 GiB shared with everything else, and
//! lockhub's heap use comes in bursts: a resync parses 500-key batches of
//! ~170 KiB each, held in the receive window until they commit. With
//! glibc's defaults the memory freed after a burst stayed with the process
//! (RSS 73 MiB during a 100,000-key resync and still 70 MiB after it):
//! - every thread that allocates may get its own arena (up to 8 per core),
//!   each keeping its freed chunks;
//! - the mmap threshold rises to the largest block freed (up to 32 MiB), so
//!   after the first large payload every later one comes from an arena
//!   rather than its own mapping, and fragments it;
//! - an arena is only trimmed from its top.
//!
//! So at start lockhub caps the arenas at two, fixes the mmap threshold at
//! 128 KiB (large payloads get their own mapping, returned at `free`) and
//! the trim threshold at 256 KiB; and when the hub goes idle (the
//! checkpointer's idle checkpoint, see `store`) it asks malloc to return
//! every free page ([`trim`]). On other C libraries both are no-ops.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod glibc {
    use std::ffi::c_int;

    // The crate's one unsafe item outside tests (`unsafe_code` is denied
    // elsewhere): declaring two glibc functions. SAFETY: both are
    // thread-safe and take plain integers; any value is accepted (an
    // unknown `mallopt` parameter returns 0), so calling them is safe.
    #[allow(unsafe_code)]
    unsafe extern "C" {
        pub safe fn mallopt(param: c_int, value: c_int) -> c_int;
        pub safe fn malloc_trim(pad: usize) -> c_int;
    }

    /// `<malloc.h>`'s parameter numbers.
    pub const M_TRIM_THRESHOLD: c_int = -1;
    pub const M_MMAP_THRESHOLD: c_int = -3;
    pub const M_ARENA_MAX: c_int = -8;
}

/// At most this many malloc arenas (the runtime's workers and the writer
/// share them).
const ARENAS: i32 = 2;
/// Blocks from this size up get their own mapping, returned when freed.
const MMAP_THRESHOLD: i32 = 128 * 1024;
/// Free memory at an arena's top beyond this goes back to the system.
const TRIM_THRESHOLD: i32 = 256 * 1024;

/// Sets malloc's limits; call once, first thing in `main`.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        glibc::mallopt(glibc::M_ARENA_MAX, ARENAS);
        glibc::mallopt(glibc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        glibc::mallopt(glibc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// Returns every free page of the heap to the system (after a burst, when
/// the hub goes idle). Takes a few milliseconds on a large heap.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        glibc::malloc_trim(0);
    }
}
