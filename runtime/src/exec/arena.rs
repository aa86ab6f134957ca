//! The executor's buffer arena (issue 31, item 3): device buffers of a
//! pass (the plan's temporary slots, pending K/V rows, and its outputs:
//! logits and emitted hidden states) are kept across passes, by size class,
//! and handed out again, so a steady-state decode step allocates nothing
//! for them, and passes of any size up to [`MAX_ROWS`] rows share them.
//!
//! A buffer is reused only when nothing outside the arena still holds it
//! (cubecl's `Handle::can_mut`: the pass that used it has ended and no
//! tensor of it is alive, e.g. a caller still holding last pass's logits
//! gets a fresh buffer), and only on the thread that made it: launches of
//! one thread go to one in-order stream, so the next pass's writes queue
//! after the last pass's reads; another thread's stream gives no such
//! order (and no target tensor crosses threads: a concurrent drafter works
//! from token ids). Passes larger than [`MAX_ROWS`] rows (prefill chunks)
//! allocate as before: their buffers are large and rare, and cubecl's own
//! pool serves them. What is kept is bounded by the most buffers of each
//! class ever held at once, at most twice their bytes.

use std::collections::HashMap;
use std::thread::ThreadId;

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Largest pass (rows) whose buffers are kept.
pub(super) const MAX_ROWS: usize = 64;

/// Kept buffers by (thread, size class): a pass's buffers of one class are
/// many (every layer's hidden state), so a class keeps as many as were
/// ever in use at once.
#[derive(Default)]
pub(super) struct Arena {
    kept: HashMap<(ThreadId, usize), Vec<Handle>>,
}

impl Arena {
    /// A buffer of at least `bytes` for a pass of `rows` rows: a kept one
    /// of its size class (the next power of two) that nothing else holds,
    /// or a new one of the class's size (counted as an allocation) that is
    /// kept. Passes over [`MAX_ROWS`] rows (prefill chunks) get a new
    /// buffer of `bytes` that is not kept.
    pub(super) fn take<R: Runtime>(
        &mut self,
        client: &ComputeClient<R>,
        rows: usize,
        bytes: usize,
    ) -> Handle {
        if rows > MAX_ROWS {
            draftc_ops::counters::allocation();
            return client.empty(bytes);
        }
        let class = bytes.max(16).next_power_of_two();
        let list = self
            .kept
            .entry((std::thread::current().id(), class))
            .or_default();
        if let Some(h) = list.iter().find(|h| h.can_mut()) {
            return h.clone();
        }
        draftc_ops::counters::allocation();
        let h = client.empty(class);
        list.push(h.clone());
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use draftc_ops::counters::snapshot;
    use draftc_ops::testing::wgpu_client;

    /// Allocations `f` made on this thread.
    fn allocations<T>(f: impl FnOnce() -> T) -> (T, u64) {
        let before = snapshot();
        let out = f();
        (out, snapshot().since(&before).allocations)
    }

    /// A buffer someone still holds is never handed out again (the second
    /// take allocates); once both are dropped, takes allocate nothing.
    #[test]
    fn a_held_buffer_is_not_reused() {
        let client = wgpu_client();
        let mut arena = Arena::default();
        let (first, n) = allocations(|| arena.take(&client, 1, 256));
        assert_eq!(n, 1);
        let (second, n) = allocations(|| arena.take(&client, 1, 256));
        assert_eq!(n, 1, "handed out a buffer that is still held");
        drop((first, second));
        let ((_a, _b), n) =
            allocations(|| (arena.take(&client, 1, 256), arena.take(&client, 1, 256)));
        assert_eq!(n, 0, "kept buffers were not reused");
    }

    /// Buffers are shared within a size class (any pass size), never
    /// across; passes over MAX_ROWS rows always allocate.
    #[test]
    fn size_classes_share_and_large_passes_allocate() {
        let client = wgpu_client();
        let mut arena = Arena::default();
        drop(arena.take(&client, 1, 256));
        let (small, n) = allocations(|| arena.take(&client, 2, 200));
        assert_eq!(n, 0, "a free buffer of the class was not reused");
        assert!(small.size() >= 200);
        let (larger, n) = allocations(|| arena.take(&client, 1, 300));
        assert_eq!(n, 1);
        assert!(larger.size() >= 300);
        let (big, n) = allocations(|| arena.take(&client, MAX_ROWS + 1, 256));
        assert_eq!(n, 1);
        drop(big);
        let (_big, n) = allocations(|| arena.take(&client, MAX_ROWS + 1, 256));
        assert_eq!(n, 1);
    }
}
