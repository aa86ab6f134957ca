//! Pass 4, schedule: launch order, buffer liveness and reuse. Launches keep
//! the order `fuse` gave their groups (topological). Every `Temp` buffer is
//! live from its first to its last launch and placed in a slot by a greedy
//! best-fit allocator over byte sizes (at the plan's concrete t/batch): a
//! free slot at least as large, else the largest free slot grown, else a new
//! one. A launch whose output may alias an input (residual epilogue,
//! element-wise add) computes **in place** when that input dies there.
//!
//! Limits: no reordering for lower peak memory; slots are separate
//! allocations (no offsets inside one arena); inputs, outputs and states
//! are owned by the runtime and never reused.

use crate::plan::{Buffer, BufferClass, BufferId, Launch};

/// Assign slots to temporaries; returns each slot's byte size.
pub fn schedule(launches: &mut [Launch], buffers: &mut [Buffer]) -> Vec<i64> {
    let (first, last) = live_ranges(launches, buffers.len());
    let mut slots: Vec<i64> = Vec::new();
    let mut owner: Vec<Option<BufferId>> = Vec::new();
    for (i, l) in launches.iter_mut().enumerate() {
        for out in l.outputs.clone() {
            let b = &buffers[out.index()];
            if b.class != BufferClass::Temp || first[out.index()] != Some(i) || b.slot.is_some() {
                continue;
            }
            let need = b.bytes();
            // In place: the aliasable input dies here and holds a big enough slot.
            let donor = l.alias.and_then(|j| l.inputs.get(j)).copied().filter(|d| {
                let db = &buffers[d.index()];
                db.class == BufferClass::Temp
                    && last[d.index()] == Some(i)
                    && db.slot.is_some_and(|s| slots[s as usize] >= need)
                    && !l.outputs.contains(d)
            });
            let slot = match donor.and_then(|d| buffers[d.index()].slot) {
                Some(s) => {
                    l.in_place = true;
                    s as usize
                }
                None => pick_slot(&mut slots, &owner, need),
            };
            if slot == owner.len() {
                owner.push(None);
            }
            owner[slot] = Some(out);
            buffers[out.index()].slot = Some(slot as u32);
        }
        for b in l.inputs.iter().chain(l.outputs.iter()) {
            if last[b.index()] == Some(i) {
                if let Some(s) = buffers[b.index()].slot {
                    if owner[s as usize] == Some(*b) {
                        owner[s as usize] = None;
                    }
                }
            }
        }
    }
    slots
}

/// First and last launch touching each buffer.
pub fn live_ranges(launches: &[Launch], n: usize) -> (Vec<Option<usize>>, Vec<Option<usize>>) {
    let mut first = vec![None; n];
    let mut last = vec![None; n];
    for (i, l) in launches.iter().enumerate() {
        for b in l.inputs.iter().chain(l.outputs.iter()) {
            first[b.index()].get_or_insert(i);
            last[b.index()] = Some(i);
        }
    }
    (first, last)
}

/// Best fit among free slots, else grow the largest free one, else a new slot.
fn pick_slot(slots: &mut Vec<i64>, owner: &[Option<BufferId>], need: i64) -> usize {
    let free = || (0..slots.len()).filter(|s| owner[*s].is_none());
    let fit = free()
        .filter(|s| slots[*s] >= need)
        .min_by_key(|s| (slots[*s], *s));
    if let Some(s) = fit {
        return s;
    }
    if let Some(s) = free().max_by_key(|s| (slots[*s], std::cmp::Reverse(*s))) {
        slots[s] = need;
        return s;
    }
    slots.push(need);
    slots.len() - 1
}
