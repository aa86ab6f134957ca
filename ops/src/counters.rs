//! What the host asks of the device, counted per thread: kernel launches,
//! flushes (submissions), device→host reads, host→device uploads, device
//! buffer allocations, and the wall time the host spent blocked in reads
//! and flushes (issue 31).
//!
//! Every safe launch function ends in [`launch::finish`](crate::launch::finish),
//! and every upload, allocation and read of a [`DeviceTensor`](crate::DeviceTensor)
//! goes through `tensor.rs`, so counting there sees all of them; a caller
//! that allocates a raw cubecl handle itself records it with
//! [`allocation`]. The counts are measured, not taken from a plan: a
//! decode step's real cost (argument uploads, scratch buffers, the selection
//! read) shows up, on every backend, so the default test suite can hold a
//! budget on lavapipe.
//!
//! Counters are thread-local: each thread drives its own compute stream
//! (concurrent drafting runs the drafter on a thread of its own), and tests
//! running in parallel do not see each other's work. Take a [`snapshot`]
//! before and after the work and subtract ([`Counts::since`]).
//!
//! One count is not of the device: host heap allocations
//! ([`Counts::heap`]), counted per thread by [`CountingAlloc`] when the
//! binary installs it as its global allocator (`draftc` does).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Instant;

/// Device requests made by one thread (monotonic; subtract two snapshots).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    /// Kernel launches (one per `finish`; a CUDA graph launch counts one).
    pub launches: u64,
    /// Flushes / submissions of queued work.
    pub flushes: u64,
    /// Device→host reads (each blocks until the work before it has run).
    pub reads: u64,
    /// Host→device uploads.
    pub uploads: u64,
    /// Device buffer allocations (an upload into a new buffer counts in
    /// both; one written into a kept buffer, `kept.rs`, counts as an upload).
    pub allocations: u64,
    /// Wall seconds the host spent inside reads and flushes, waiting for
    /// the device or its runner thread.
    pub blocked_s: f64,
    /// Host heap allocations made on this thread ([`CountingAlloc`]; 0
    /// where the binary does not install it): the host work of issuing
    /// passes, not the device runner's or the driver's threads.
    pub heap: u64,
}

impl Counts {
    /// The requests made since `earlier`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        self.zip(earlier, |a, b| a - b, |a, b| a - b)
    }

    /// The sum of two counts (aggregating passes).
    pub fn plus(&self, other: &Counts) -> Counts {
        self.zip(other, |a, b| a + b, |a, b| a + b)
    }

    /// `self` and `other` combined field by field: the counts by `count`,
    /// the blocked seconds by `seconds`.
    fn zip(
        &self,
        other: &Counts,
        count: impl Fn(u64, u64) -> u64,
        seconds: impl Fn(f64, f64) -> f64,
    ) -> Counts {
        Counts {
            launches: count(self.launches, other.launches),
            flushes: count(self.flushes, other.flushes),
            reads: count(self.reads, other.reads),
            uploads: count(self.uploads, other.uploads),
            allocations: count(self.allocations, other.allocations),
            blocked_s: seconds(self.blocked_s, other.blocked_s),
            heap: count(self.heap, other.heap),
        }
    }
}

thread_local! {
    static COUNTS: Cell<Counts> = const {
        Cell::new(Counts {
            launches: 0,
            flushes: 0,
            reads: 0,
            uploads: 0,
            allocations: 0,
            blocked_s: 0.0,
            heap: 0,
        })
    };
}

/// This thread's counts so far.
pub fn snapshot() -> Counts {
    let mut c = COUNTS.with(Cell::get);
    c.heap = HEAP.with(Cell::get);
    c
}

thread_local! {
    /// This thread's host heap allocations, counted by [`CountingAlloc`]
    /// (const-initialised, no destructor: safe to touch from an allocator).
    static HEAP: Cell<u64> = const { Cell::new(0) };
}

/// Counts one heap allocation on this thread.
fn heap_alloc() {
    // `try_with`: a thread being torn down no longer counts.
    let _ = HEAP.try_with(|h| h.set(h.get() + 1));
}

/// The system allocator, counting each thread's allocations (not frees)
/// for [`Counts::heap`]: what a decode step or a replayed pass costs the host
/// in allocations. A binary installs it with
/// `#[global_allocator] static A: CountingAlloc = CountingAlloc;`.
pub struct CountingAlloc;

// SAFETY: forwards every call to `System` unchanged; the counter is a
// const-initialised thread-local cell that neither allocates nor panics.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        heap_alloc();
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        heap_alloc();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        heap_alloc();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn bump(f: impl FnOnce(&mut Counts)) {
    COUNTS.with(|c| {
        let mut v = c.get();
        f(&mut v);
        c.set(v);
    });
}

pub(crate) fn launch() {
    bump(|c| c.launches += 1);
}

pub(crate) fn upload() {
    bump(|c| {
        c.uploads += 1;
        c.allocations += 1;
    });
}

/// An upload into a buffer that already exists (no allocation).
pub(crate) fn write() {
    bump(|c| c.uploads += 1);
}

/// Records a device allocation made outside [`DeviceTensor`](crate::DeviceTensor)
/// (a raw `client.empty` handle).
pub fn allocation() {
    bump(|c| c.allocations += 1);
}

/// Runs `f`, a blocking read, counting it and the time it blocked.
pub(crate) fn read<T>(f: impl FnOnce() -> T) -> T {
    blocking(f, |c| c.reads += 1)
}

/// Runs `f`, a flush, counting it and the time it blocked.
pub(crate) fn flush<T>(f: impl FnOnce() -> T) -> T {
    blocking(f, |c| c.flushes += 1)
}

fn blocking<T>(f: impl FnOnce() -> T, count: impl FnOnce(&mut Counts)) -> T {
    let t = Instant::now();
    let out = f();
    let s = t.elapsed().as_secs_f64();
    bump(|c| {
        count(c);
        c.blocked_s += s;
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_and_plus_are_inverse() {
        let a = snapshot();
        launch();
        upload();
        allocation();
        read(|| ());
        flush(|| ());
        let d = snapshot().since(&a);
        assert_eq!(
            (d.launches, d.flushes, d.reads, d.uploads, d.allocations),
            (1, 1, 1, 1, 2)
        );
        assert_eq!(a.plus(&d).launches, snapshot().launches);
    }

    #[test]
    fn counts_are_per_thread() {
        let before = snapshot();
        std::thread::spawn(|| {
            for _ in 0..5 {
                launch();
            }
        })
        .join()
        .unwrap();
        assert_eq!(snapshot().since(&before).launches, 0);
    }
}
