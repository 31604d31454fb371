//! A counting global allocator: the system allocator, plus process-wide counts of the live heap
//! (bytes and blocks) and of every allocation made. The daemon's binary installs it; the
//! counters socket reports it (`"heap"`), and the soaks hold the live bytes flat — exactly,
//! where the resident set moves in pages and with the allocator's caching.
//!
//! Two relaxed atomic additions per allocation and one per free; in steady state the data
//! path allocates per work request (a WQE's scatter list), nothing per packet (a test holds
//! it under one allocation per four packets).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

/// The system allocator, counted. `#[global_allocator] static A: Counting = Counting;`
pub struct Counting;

static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);
static LIVE_BLOCKS: AtomicU64 = AtomicU64::new(0);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

fn counted_alloc(size: usize) {
    LIVE_BYTES.fetch_add(size as u64, Ordering::Relaxed);
    LIVE_BLOCKS.fetch_add(1, Ordering::Relaxed);
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` with the caller's arguments unchanged; the
// counters have no bearing on the memory handed out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is `System`'s.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            counted_alloc(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            counted_alloc(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        LIVE_BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`; `new_size` is the caller's, checked by its contract.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            // the block moved or grew in place: one block still, of the new size
            LIVE_BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
            LIVE_BYTES.fetch_sub(layout.size() as u64, Ordering::Relaxed);
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }
}

/// The counts at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes the process holds from the allocator (the sizes it asked for).
    pub live_bytes: u64,
    /// Blocks the process holds.
    pub live_blocks: u64,
    /// Allocations and reallocations since the start.
    pub allocations: u64,
}

/// The counts, or `None` when the process does not run [`Counting`] (nothing was counted).
pub fn stats() -> Option<HeapStats> {
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    (allocations > 0).then(|| HeapStats {
        live_bytes: LIVE_BYTES.load(Ordering::Relaxed),
        live_blocks: LIVE_BLOCKS.load(Ordering::Relaxed),
        allocations,
    })
}

/// Gives the allocator's free pages back to the kernel (glibc's `malloc_trim`), at most once
/// per `every`: called after control commands that free objects, so that memory a destroyed
/// QP, CQ or MR held leaves the resident set instead of staying cached in the allocator's
/// arenas, where the next objects' different sizes fragment it. Returns whether it trimmed.
pub fn trim_at_most_every(every: std::time::Duration) -> bool {
    use std::sync::Mutex;
    use std::time::Instant;
    static LAST: Mutex<Option<Instant>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    if last.is_some_and(|t| now.duration_since(t) < every) {
        return false;
    }
    *last = Some(now);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer and may be called at any time.
    unsafe {
        libc::malloc_trim(0);
    }
    true
}
