//! The executor's buffer arena (issue 31, item 3): device buffers a pass
//! uses only internally (the plan's temporary slots, pending K/V rows) are
//! kept across passes and handed out again, so a steady-state decode step
//! allocates nothing for them.
//!
//! A buffer is reused only when nothing outside the arena still holds it
//! (cubecl's `Handle::can_mut`: the pass that used it has ended and no
//! tensor of it is alive), and only on the thread that made it: launches of
//! one thread go to one in-order stream, so the next pass's writes queue
//! after the last pass's reads; another thread's stream gives no such
//! order. Passes larger than [`MAX_ROWS`] rows (prefill chunks) allocate as
//! before: their buffers are large and rare, and cubecl's own pool serves
//! them.

use std::collections::HashMap;
use std::thread::ThreadId;

use cubecl::prelude::*;
use cubecl::server::Handle;

/// Largest pass (rows) whose buffers are kept.
pub(super) const MAX_ROWS: usize = 64;

/// Buffers kept per key: a pass holds one; a caller may keep a pass's
/// outputs alive across the next, which then takes another.
const PER_KEY: usize = 4;

/// What a buffer serves: (thread, pass rows, use, bytes).
type Key = (ThreadId, usize, Use, usize);

/// The uses an arena serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Use {
    /// The plan's temporary slot of this index.
    Slot(usize),
    /// New K/V rows of a pass before they are appended (by launch order).
    Pending(usize),
}

/// Kept buffers by key.
#[derive(Default)]
pub(super) struct Arena {
    kept: HashMap<Key, Vec<Handle>>,
}

impl Arena {
    /// A buffer of `bytes` for `what` in a pass of `rows` rows: a kept one
    /// that nothing else holds, or a new one (counted as an allocation),
    /// kept when the key has room.
    pub(super) fn take<R: Runtime>(
        &mut self,
        client: &ComputeClient<R>,
        rows: usize,
        what: Use,
        bytes: usize,
    ) -> Handle {
        let fresh = |client: &ComputeClient<R>| {
            draftc_ops::counters::allocation();
            client.empty(bytes)
        };
        if rows > MAX_ROWS {
            return fresh(client);
        }
        let list = self
            .kept
            .entry((std::thread::current().id(), rows, what, bytes))
            .or_default();
        if let Some(h) = list.iter().find(|h| h.can_mut()) {
            return h.clone();
        }
        let h = fresh(client);
        if list.len() < PER_KEY {
            list.push(h.clone());
        }
        h
    }
}
