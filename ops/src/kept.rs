//! Kept device buffers (issue 31, item 3): the small buffers a thread asks
//! for pass after pass (packed step parameters, index lists, selections,
//! drafter outputs) are kept once made and handed out again, so a steady
//! decode step or speculative round allocates nothing, and each buffer
//! keeps its device address from step to step.
//!
//! A kept buffer is handed out only when nothing but the pool holds it
//! (cubecl's `Handle::can_mut`: every tensor of it has been dropped), and
//! only to the thread that made it. A thread's launches, writes and reads
//! go to one in-order stream, so work queued by a new holder runs after
//! the work that the last holder queued. No tensor of a pass crosses
//! threads (a concurrent drafter works from token ids), which that order
//! needs.
//!
//! Buffers are sized by class (the next power of two), keyed by runtime
//! and device, and a class keeps as many as were ever in use at once:
//! what is kept is bounded by twice the most bytes of each class held at
//! once. Requests over [`MAX_KEPT_BYTES`] (prefill chunks, weights) are
//! not kept; cubecl's own pool serves them.

use std::any::TypeId;
use std::cell::RefCell;
use std::collections::HashMap;

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Largest request (bytes) served from kept buffers.
pub const MAX_KEPT_BYTES: usize = 16 << 20;

/// Smallest class: every kept buffer is at least this large.
const MIN_CLASS: usize = 256;

/// (runtime, device, class): a device is named by the address of its
/// properties, which every client of that device shares and which live
/// as long as the process (cubecl keeps a client per device).
type Key = (TypeId, usize, usize);

thread_local! {
    static KEPT: RefCell<HashMap<Key, Vec<Handle>>> = RefCell::new(HashMap::new());
}

/// A kept buffer by its place in its thread's pool. It does not hold the
/// buffer: a pass's recording (`crate::replay`) names what it used this
/// way, so the buffers stay free for other passes between replays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KeptRef {
    key: Key,
    index: usize,
}

thread_local! {
    /// The kept buffers taken while this thread records a pass, and how
    /// many of them were made then.
    static TAKEN: RefCell<Option<(Vec<KeptRef>, u64)>> = const { RefCell::new(None) };
}

/// Starts noting the kept buffers this thread takes (`false` if it
/// already is).
pub(crate) fn start_noting() -> bool {
    TAKEN.with(|t| {
        let mut t = t.borrow_mut();
        if t.is_some() {
            return false;
        }
        *t = Some((Vec::new(), 0));
        true
    })
}

/// Stops noting; the buffers taken since [`start_noting`], each once, and
/// how many of them were made meanwhile (allocations that stay in the pool).
pub(crate) fn finish_noting() -> (Vec<KeptRef>, u64) {
    let (mut refs, made) = TAKEN.with(|t| t.borrow_mut().take()).unwrap_or_default();
    let mut seen = std::collections::HashSet::new();
    refs.retain(|r| seen.insert(*r));
    (refs, made)
}

/// The whole kept buffer `r` names (a new holder of it), if this thread's
/// pool has it.
pub fn handle(r: &KeptRef) -> Option<Handle> {
    KEPT.with(|k| k.borrow().get(&r.key).and_then(|l| l.get(r.index)).cloned())
}

/// Whether nothing but the pool holds `r` (what [`take`] asks before
/// handing a buffer out).
pub fn is_free(r: &KeptRef) -> bool {
    KEPT.with(|k| {
        k.borrow()
            .get(&r.key)
            .and_then(|l| l.get(r.index))
            .is_some_and(|h| h.can_mut())
    })
}

/// Whether nothing holds kept buffer `h` but the pool and `pins` holders
/// that set it aside (a recording that pins its buffers, `crate::replay`).
pub fn free_but_for(h: &Handle, pins: usize) -> bool {
    // `can_mut`'s rule (two handles: the pool's and the memory manager's)
    // with the pins added.
    h.holders() <= 2 + pins
}

/// A buffer of exactly `bytes` (a view of a kept buffer of `bytes`' class
/// that nothing else holds, or of a new one that is kept and counted as an
/// allocation), or `None` when `bytes` is over [`MAX_KEPT_BYTES`].
pub fn take<R: Runtime>(client: &ComputeClient<R>, bytes: usize) -> Option<Handle> {
    take_kept(client, bytes, false).map(|(h, _)| h)
}

/// [`take`] for an upload, with which kept buffer it is. While this
/// thread records a pass, the upload gets none of the buffers the pass took
/// before: a buffer a launch used and let go of is not written before the
/// launches of a replay that writes first (a CUDA graph's writes all come
/// before its launches).
pub(crate) fn take_ref<R: Runtime>(
    client: &ComputeClient<R>,
    bytes: usize,
) -> Option<(Handle, KeptRef)> {
    take_kept(client, bytes, true)
}

/// [`take`], with which kept buffer it is; `for_write`: see [`take_ref`].
fn take_kept<R: Runtime>(
    client: &ComputeClient<R>,
    bytes: usize,
    for_write: bool,
) -> Option<(Handle, KeptRef)> {
    if bytes > MAX_KEPT_BYTES {
        return None;
    }
    let class = bytes.max(MIN_CLASS).next_power_of_two();
    let device = client.properties() as *const _ as usize;
    let key = (TypeId::of::<R>(), device, class);
    // An upload being recorded skips the buffers its pass took before.
    let taken_before = |index: usize| {
        for_write
            && TAKEN.with(|t| {
                t.borrow()
                    .as_ref()
                    .is_some_and(|(refs, _)| refs.contains(&KeptRef { key, index }))
            })
    };
    let (handle, index, made) = KEPT.with(|k| {
        let mut k = k.borrow_mut();
        let list = k.entry(key).or_default();
        let free = |(i, h): &(usize, &Handle)| h.can_mut() && !taken_before(*i);
        if let Some((i, _)) = list.iter().enumerate().find(free) {
            return (list[i].clone(), i, false);
        }
        crate::counters::allocation();
        let h = client.empty(class);
        list.push(h.clone());
        (h, list.len() - 1, true)
    });
    let r = KeptRef { key, index };
    TAKEN.with(|t| {
        if let Some((refs, n)) = t.borrow_mut().as_mut() {
            refs.push(r);
            *n += u64::from(made);
        }
    });
    Some((handle.offset_end((class - bytes) as u64), r))
}
