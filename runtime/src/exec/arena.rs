//! A pass's device buffers (issue 31, item 3): the plan's temporary slots,
//! pending K/V rows and outputs (logits, emitted hidden states) come from
//! the thread's kept buffers (`draftc_ops::kept`), so a steady-state pass
//! allocates nothing for them, every pass up to [`MAX_ROWS`] rows shares
//! them, and each keeps its device address from pass to pass.
//!
//! A kept buffer is handed out again only once nothing else holds it: a
//! caller still holding last pass's logits makes the next pass take
//! another. Passes larger than [`MAX_ROWS`] rows (prefill chunks) allocate
//! buffers that are not kept: they are large and rare, and cubecl's own
//! pool serves them.

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Largest pass (rows) whose buffers are kept: a verification or drafter
/// pass of a large batch (a tree drafted on the device queries up to
/// `topk` rows a sequence, 128 at batch 16 for Beagle's file tree), not a
/// prefill chunk (up to 512 rows). Buffers over `draftc_ops::kept`'s size
/// limit (a large vocabulary's logits) are not kept whatever the rows.
pub(super) const MAX_ROWS: usize = 256;

/// A buffer of `bytes` for a pass of `rows` rows: kept (`draftc_ops::kept`)
/// unless the pass has over [`MAX_ROWS`] rows.
pub(super) fn pass_buffer<R: Runtime>(
    client: &ComputeClient<R>,
    rows: usize,
    bytes: usize,
) -> Handle {
    if rows <= MAX_ROWS {
        if let Some(h) = draftc_ops::kept::take(client, bytes) {
            return h;
        }
    }
    draftc_ops::counters::allocation();
    client.empty(bytes)
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
        let (first, n) = allocations(|| pass_buffer(&client, 1, 4096));
        assert_eq!(n, 1);
        let (second, n) = allocations(|| pass_buffer(&client, 1, 4096));
        assert_eq!(n, 1, "handed out a buffer that is still held");
        drop((first, second));
        let ((_a, _b), n) =
            allocations(|| (pass_buffer(&client, 1, 4096), pass_buffer(&client, 1, 4096)));
        assert_eq!(n, 0, "kept buffers were not reused");
    }

    /// Buffers are shared within a size class (any pass size), never
    /// across; passes over MAX_ROWS rows always allocate.
    #[test]
    fn size_classes_share_and_large_passes_allocate() {
        let client = wgpu_client();
        drop(pass_buffer(&client, 1, 8192));
        let (small, n) = allocations(|| pass_buffer(&client, 2, 8000));
        assert_eq!(n, 0, "a free buffer of the class was not reused");
        assert_eq!(small.size_in_used(), 8000);
        let (larger, n) = allocations(|| pass_buffer(&client, 1, 9000));
        assert_eq!(n, 1);
        assert_eq!(larger.size_in_used(), 9000);
        let (big, n) = allocations(|| pass_buffer(&client, MAX_ROWS + 1, 8192));
        assert_eq!(n, 1);
        drop(big);
        let (_big, n) = allocations(|| pass_buffer(&client, MAX_ROWS + 1, 8192));
        assert_eq!(n, 1);
    }
}
