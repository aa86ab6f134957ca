//! KV caches with a fixed capacity per sequence: [`CacheStore`] on the
//! device (what the executor reads and appends to) and [`HostCaches`] (the
//! interpreter's copy). A cache is named by its state (`kv[3]`, `context`,
//! `states.kv`) and has two halves, `{name}.k` and `{name}.v`, each
//! `[slots · capacity, width]`; slot `s` owns rows `s · capacity ..`.
//! Besides the rows, every cache keeps, per slot, its length and the text
//! position of each row (masks are defined on positions).
//!
//! The engine edits caches between passes: [`CacheStore::truncate`] drops
//! rejected rows, [`CacheStore::compact_all`] moves the accepted tree nodes
//! next to the committed prefix (ops `kv_compact`, safe for overlaps).

use std::collections::BTreeMap;

use cubecl::prelude::*;
use draftc_ops::{DType, DeviceTensor};

use super::executor::ExecError;

/// Per-slot bookkeeping of one cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Rows {
    /// Text position of every row, per slot (its length is the slot's length).
    pos: Vec<Vec<u32>>,
}

/// Device KV caches of one model (or drafter).
pub struct CacheStore<R: Runtime> {
    client: ComputeClient<R>,
    slots: usize,
    capacity: usize,
    dtype: DType,
    halves: BTreeMap<String, DeviceTensor<R>>,
    rows: BTreeMap<String, Rows>,
}

impl<R: Runtime> CacheStore<R> {
    /// Empty caches for `slots` sequences of up to `capacity` rows each;
    /// halves are allocated on first use.
    pub fn new(client: &ComputeClient<R>, slots: usize, capacity: usize, dtype: DType) -> Self {
        CacheStore {
            client: client.clone(),
            slots,
            capacity,
            dtype,
            halves: BTreeMap::new(),
            rows: BTreeMap::new(),
        }
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Rows of the K/V buffers (`slots · capacity`).
    pub fn total_rows(&self) -> usize {
        self.slots * self.capacity
    }

    /// The half `{cache}.k` or `{cache}.v` of width `width`, allocated (zeros) on first use.
    pub(crate) fn half(&mut self, half: &str, width: usize) -> Result<DeviceTensor<R>, ExecError> {
        if let Some(t) = self.halves.get(half) {
            if t.shape()[1] != width {
                return Err(ExecError::Internal(format!(
                    "cache `{half}` has width {} but a launch needs {width}",
                    t.shape()[1]
                )));
            }
            return Ok(t.clone());
        }
        let t = DeviceTensor::zeros(&self.client, &[self.total_rows(), width], self.dtype);
        self.halves.insert(half.to_string(), t.clone());
        Ok(t)
    }

    fn rows_mut(&mut self, cache: &str) -> &mut Rows {
        let slots = self.slots;
        self.rows.entry(cache.to_string()).or_insert_with(|| Rows {
            pos: vec![Vec::new(); slots],
        })
    }

    /// Committed rows of `cache` in `slot` (0 for a cache never written).
    pub fn len(&self, cache: &str, slot: usize) -> usize {
        self.rows
            .get(cache)
            .and_then(|r| r.pos.get(slot))
            .map_or(0, Vec::len)
    }

    /// Positions of the rows of `cache` in `slot`.
    pub fn positions(&self, cache: &str, slot: usize) -> &[u32] {
        self.rows
            .get(cache)
            .and_then(|r| r.pos.get(slot))
            .map_or(&[], Vec::as_slice)
    }

    /// The memory ids of the halves allocated so far, in name order (a
    /// replayed pass binds them; `replay.rs`).
    pub(crate) fn half_ids(&self) -> Vec<usize> {
        self.halves.values().map(|t| t.handle.memory_id()).collect()
    }

    /// Cache names in use.
    pub fn caches(&self) -> Vec<String> {
        self.rows.keys().cloned().collect()
    }

    /// Reserve `positions.len()` rows after the current ones in `slot`;
    /// returns their global row indices.
    pub(crate) fn reserve(
        &mut self,
        cache: &str,
        slot: usize,
        positions: &[u32],
    ) -> Result<Vec<u32>, ExecError> {
        let (cap, slots) = (self.capacity, self.slots);
        if slot >= slots {
            return Err(ExecError::Internal(format!(
                "sequence slot {slot} out of range: the caches have {slots} slots"
            )));
        }
        let rows = self.rows_mut(cache);
        let len = rows.pos[slot].len();
        if len + positions.len() > cap {
            return Err(ExecError::CacheFull {
                cache: cache.to_string(),
                slot,
                need: len + positions.len(),
                capacity: cap,
            });
        }
        rows.pos[slot].extend_from_slice(positions);
        Ok((len..len + positions.len())
            .map(|r| (slot * cap + r) as u32)
            .collect())
    }

    /// Keep the first `len` rows of every cache in `slot`.
    pub fn truncate(&mut self, slot: usize, len: usize) {
        for rows in self.rows.values_mut() {
            if let Some(p) = rows.pos.get_mut(slot) {
                p.truncate(len);
            }
        }
    }

    /// Truncate only the caches whose name starts with `prefix`.
    pub fn truncate_prefix(&mut self, prefix: &str, slot: usize, len: usize) {
        for (name, rows) in self.rows.iter_mut() {
            if name.starts_with(prefix) {
                if let Some(p) = rows.pos.get_mut(slot) {
                    p.truncate(len);
                }
            }
        }
    }

    /// For every `(slot, committed, keep)` (slots distinct), in every cache
    /// of the slot: rows `committed + keep[i]` move to `committed + i`, and
    /// the slot's length becomes `committed + keep.len()` (the accepted tree
    /// path; docs/speculative.md, "The round": commit). The rows that move in every slot go in
    /// one gather and one scatter per cache half, not two launches a slot
    /// (issue 31: a round's commit at batch 16).
    pub fn compact_all(&mut self, paths: &[(usize, usize, Vec<usize>)]) -> Result<(), ExecError> {
        for (name, rows) in self.rows.iter_mut() {
            let (mut src, mut dst) = (Vec::new(), Vec::new());
            for (slot, committed, keep) in paths {
                let pos = &mut rows.pos[*slot];
                if pos.len() < committed + keep.iter().max().map_or(0, |m| m + 1) {
                    continue;
                }
                let base = slot * self.capacity + committed;
                for (i, &k) in keep.iter().enumerate() {
                    if i != k {
                        src.push((base + k) as u32);
                        dst.push((base + i) as u32);
                    }
                }
                let kept: Vec<u32> = keep.iter().map(|&k| pos[committed + k]).collect();
                pos.truncate(*committed);
                pos.extend(kept);
            }
            if !src.is_empty() {
                for half in ["k", "v"] {
                    if let Some(t) = self.halves.get(&format!("{name}.{half}")) {
                        draftc_ops::kv::move_rows(&self.client, &src, &dst, t)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Copies the first `n` rows of every cache of slot `from` into slot
    /// `to`, which held nothing: a prompt prefix computed once and reused
    /// (its K/V rows depend only on its tokens and positions).
    pub fn copy_prefix(&mut self, from: usize, to: usize, n: usize) -> Result<(), ExecError> {
        if from >= self.slots || to >= self.slots || from == to {
            return Err(ExecError::Internal(format!(
                "copy_prefix: slots {from} -> {to} of {}",
                self.slots
            )));
        }
        for (name, rows) in self.rows.iter_mut() {
            let n = n.min(rows.pos[from].len()).min(self.capacity);
            let src: Vec<u32> = (0..n).map(|i| (from * self.capacity + i) as u32).collect();
            let dst: Vec<u32> = (0..n).map(|i| (to * self.capacity + i) as u32).collect();
            if n > 0 {
                for half in ["k", "v"] {
                    if let Some(t) = self.halves.get(&format!("{name}.{half}")) {
                        draftc_ops::kv::move_rows(&self.client, &src, &dst, t)?;
                    }
                }
            }
            rows.pos[to] = rows.pos[from][..n].to_vec();
        }
        Ok(())
    }

    /// Forget everything in `slot`.
    pub fn reset(&mut self, slot: usize) {
        self.truncate(slot, 0);
    }

    /// Device bytes held by the caches.
    pub fn bytes(&self) -> usize {
        self.halves
            .values()
            .map(|t| t.numel() * t.dtype().size())
            .sum()
    }
}

/// The interpreter's caches: per cache and slot, the K rows, V rows and positions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HostCaches {
    caches: BTreeMap<String, Vec<HostRows>>,
    slots: usize,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct HostRows {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub pos: Vec<u32>,
}

impl HostCaches {
    pub fn new(slots: usize) -> HostCaches {
        HostCaches {
            caches: BTreeMap::new(),
            slots,
        }
    }

    pub(crate) fn slot_mut(&mut self, cache: &str, slot: usize) -> &mut HostRows {
        let slots = self.slots.max(slot + 1);
        let v = self
            .caches
            .entry(cache.to_string())
            .or_insert_with(|| vec![HostRows::default(); slots]);
        if v.len() <= slot {
            v.resize(slot + 1, HostRows::default());
        }
        &mut v[slot]
    }

    pub fn len(&self, cache: &str, slot: usize) -> usize {
        self.caches
            .get(cache)
            .and_then(|v| v.get(slot))
            .map_or(0, |r| r.pos.len())
    }

    /// Keep the first `len` rows of every cache in `slot`.
    pub fn truncate(&mut self, slot: usize, len: usize) {
        for v in self.caches.values_mut() {
            if let Some(r) = v.get_mut(slot) {
                if r.pos.len() > len {
                    let w = r.k.len() / r.pos.len().max(1);
                    r.k.truncate(len * w);
                    r.v.truncate(len * w);
                    r.pos.truncate(len);
                }
            }
        }
    }
}
