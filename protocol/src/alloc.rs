//! The process allocator: the system allocator, except that huge allocations are
//! reserved as address space only.
//!
//! Why: `kafka-protocol` decodes an array by first reserving room for as many elements
//! as the (client-supplied, up to 2^31-1) length prefix says. A 16-byte request claiming
//! two billion topics asks for ~150 GB; the system allocator refuses, and Rust aborts
//! the whole broker. Here any allocation of [`HUGE_BYTES`] or more is an anonymous
//! `MAP_NORESERVE` mapping: the kernel hands out address space without committing
//! memory, decoding fails a few bytes later (the frame runs out), and the untouched
//! mapping is returned. No legitimate allocation in the broker comes near the
//! threshold (frames are at most `socket.request.max.bytes`, 100 MiB by default).
//!
//! Limits: with `vm.overcommit_memory = 2` the kernel ignores `MAP_NORESERVE`, and
//! such a request would still abort the process.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations at least this large are mapped, not malloc'ed.
pub const HUGE_BYTES: usize = 1 << 30;
const PAGE: usize = 4096;

pub struct Allocator;

fn is_huge(size: usize, align: usize) -> bool {
    size >= HUGE_BYTES && align <= PAGE
}

unsafe fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping touches no existing memory.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p.cast()
    }
}

unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if is_huge(layout.size(), layout.align()) {
            unsafe { map(layout.size()) }
        } else {
            unsafe { System.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_huge(layout.size(), layout.align()) {
            // Fresh anonymous pages are zero.
            unsafe { map(layout.size()) }
        } else {
            unsafe { System.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_huge(layout.size(), layout.align()) {
            unsafe { libc::munmap(ptr.cast(), layout.size()) };
        } else {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !is_huge(layout.size(), layout.align()) && !is_huge(new_size, layout.align()) {
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        if is_huge(layout.size(), layout.align()) && is_huge(new_size, layout.align()) {
            // Move the mapping rather than copy (and so touch) gigabytes.
            let p =
                unsafe { libc::mremap(ptr.cast(), layout.size(), new_size, libc::MREMAP_MAYMOVE) };
            return if p == libc::MAP_FAILED {
                std::ptr::null_mut()
            } else {
                p.cast()
            };
        }
        // One side is small, so the copy is small.
        // SAFETY: the caller guarantees `new_size` is valid for `layout.align()`.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let new = unsafe { self.alloc(new_layout) };
        if !new.is_null() {
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }
}

/// Unit tests' allocator: [`Allocator`], counting each thread's allocations so a test
/// can assert that a path allocates nothing ([`counting::allocations`]).
#[cfg(test)]
pub(crate) mod counting {
    use super::*;
    use std::cell::Cell;

    thread_local! {
        static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    }

    /// Allocations (and reallocations) made so far by the calling thread.
    pub(crate) fn allocations() -> u64 {
        ALLOCATIONS.with(|c| c.get())
    }

    fn count() {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
    }

    pub(crate) struct Counting;

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count();
            unsafe { Allocator.alloc(layout) }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count();
            unsafe { Allocator.alloc_zeroed(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { Allocator.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count();
            unsafe { Allocator.realloc(ptr, layout, new_size) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_reservations_succeed_and_small_ones_use_the_system_allocator() {
        let a = Allocator;
        unsafe {
            let l = Layout::from_size_align(100 << 30, 8).unwrap();
            let p = a.alloc(l);
            assert!(!p.is_null(), "100 GiB of address space");
            *p = 7;
            let p2 = a.realloc(p, l, 200 << 30);
            assert_eq!(*p2, 7);
            a.dealloc(p2, Layout::from_size_align(200 << 30, 8).unwrap());
            let s = Layout::from_size_align(64, 8).unwrap();
            let q = a.alloc(s);
            let q = a.realloc(q, s, HUGE_BYTES);
            assert!(!q.is_null());
            a.dealloc(q, Layout::from_size_align(HUGE_BYTES, 8).unwrap());
        }
    }
}
