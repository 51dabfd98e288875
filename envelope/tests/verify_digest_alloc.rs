//! `verify_digest` on canonical bytes allocates nothing per call (issue 31
//! item 4): counted with a global allocator of this test binary's own. The
//! single pass keeps its id tables per thread, so the first call on a thread
//! may grow them; every later call of the same size allocates nothing.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use pstack_envelope::{example::example_with_threads, verify_digest, verify_digest_fast};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as for `alloc` and `dealloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made while `f` runs, on any thread (this binary holds one
/// test, so nothing else runs beside it).
fn allocations(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    f();
    ALLOCATIONS.load(Ordering::SeqCst) - before
}

/// One test function, so no other test's allocations are counted.
#[test]
fn verify_digest_allocates_nothing_per_call_on_canonical_bytes() {
    // Small, ~0.5 MiB and ~1 MiB.
    for threads in [0u32, 380, 760] {
        let e = example_with_threads(threads).seal().unwrap();
        let bytes = serde_json::to_vec(&e).unwrap();
        let digest = e.digest.clone();
        // Warm the per-thread tables.
        assert!(verify_digest_fast(&bytes).is_some());
        let made = allocations(|| {
            let d = verify_digest(&bytes).unwrap();
            assert!(d == *digest.as_str());
        });
        assert_eq!(made, 0, "{threads} threads, {} bytes", bytes.len());
    }
}
