//! The executor's attention launches: appending a pass's new K/V rows to
//! the [`CacheStore`] (`flush`) and attending over each sequence's cache
//! range or this pass's own rows, with the kernel layout the plan chose
//! (the lane kernel, or the GPU plane layout).

use cubecl::prelude::*;
use draftc_codegen::{AttentionLayout, BufferId, Kernel};
use draftc_ir::op::Mask as IrMask;
use draftc_ops::attention::{
    attention_planes, attention_rows, AttnDims, AttnMeta, AttnPlaneShape, Mask, SeqBatch,
};
use draftc_ops::DeviceTensor;

use super::cache::CacheStore;
use super::executor::{ops_mask, ExecError, RowSource, Run};
use super::step::Step;

impl<R: Runtime> Run<'_, R> {
    /// Cache half name of a state buffer and whether it lives in the target's store.
    pub(super) fn cache_name(&self, b: BufferId) -> (String, bool) {
        let name = &self.plan.buffer(b).name;
        match name.strip_prefix("target.") {
            Some(rest) => (rest.to_string(), true),
            None => (name.clone(), false),
        }
    }

    /// The cache of halves `k` (`….k`): its store-side name, whether it is
    /// the target's, and its store.
    pub(super) fn cache_store<'s>(
        &self,
        k: BufferId,
        caches: &'s mut CacheStore<R>,
        target: Option<&'s mut CacheStore<R>>,
    ) -> Result<(String, bool, &'s mut CacheStore<R>), ExecError> {
        let (k_half, in_target) = self.cache_name(k);
        let cache = k_half
            .strip_suffix(".k")
            .ok_or_else(|| ExecError::Internal(format!("cache half `{k_half}` is not `….k`")))?
            .to_string();
        let store = if in_target {
            target.ok_or_else(|| {
                ExecError::Unsupported(format!(
                    "`target.{cache}` read without the target's caches (run this drafter with a target)"
                ))
            })?
        } else {
            caches
        };
        Ok((cache, in_target, store))
    }

    /// Reserves the cache rows of `src`'s rows, sequence by sequence, in
    /// `store`'s `cache`: the rows their K/V go to.
    pub(super) fn reserve(
        &self,
        store: &mut CacheStore<R>,
        cache: &str,
        src: &RowSource,
    ) -> Result<Vec<u32>, ExecError> {
        let positions = self.positions_of(src)?;
        let lens = self.lens_of(src);
        let mut rows = Vec::with_capacity(positions.len());
        let mut at = 0;
        for (seq, &n) in self.step.seqs.iter().zip(&lens) {
            rows.extend(store.reserve(cache, seq.slot, &positions[at..at + n])?);
            at += n;
        }
        Ok(rows)
    }

    /// Appends the pending new rows of cache halves `k`, `v` (if any) and
    /// returns the store-side cache name.
    fn flush(
        &mut self,
        k: BufferId,
        v: BufferId,
        mask: Mask,
        caches: &mut CacheStore<R>,
        target: Option<&mut CacheStore<R>>,
    ) -> Result<(String, bool), ExecError> {
        let (k_half, _) = self.cache_name(k);
        let (v_half, _) = self.cache_name(v);
        let (cache, in_target, store) = self.cache_store(k, caches, target)?;
        let (Some((kt, src)), Some((vt, _))) = (self.pending.remove(&k), self.pending.remove(&v))
        else {
            return Ok((cache, in_target));
        };
        let ahead = self
            .reserved_ahead
            .take_if(|(c, _)| *c == cache && src == RowSource::Step);
        let rows = match ahead {
            Some((_, rows)) => rows,
            None => self.reserve(store, &cache, &src)?,
        };
        let width = kt.shape()[1];
        let kc = store.half(&k_half, width)?;
        let vc = store.half(&v_half, width)?;
        if rows.is_empty() {
            return Ok((cache, in_target));
        }
        // The attention that follows reads this cache: on the pass's first
        // append of these rows its metadata rides in one upload with the
        // rows' positions and slots.
        if !self.has_positions(&src) {
            let key = self.cache_meta_key(mask, store, &cache)?;
            self.upload_step(&src, key, &rows)?;
        }
        let n = kt.shape()[0];
        if let Some((heads, hd, theta)) = self.rope_pending.remove(&k) {
            let pos = self.positions_tensor(&src)?;
            let freqs = self.rope_freqs(hd, theta)?;
            let kt = kt.reshape(&[n, heads, hd])?;
            if vt.shape() == [n, heads * hd] {
                // RoPE on K and both appends in one launch.
                let dst = self.row_index(rows)?;
                let vt = vt.reshape(&[n, heads, hd])?;
                let slots = &self.row_indices[dst];
                draftc_ops::rope::rope_append(
                    self.client,
                    &kt,
                    &vt,
                    &pos,
                    &freqs,
                    slots,
                    &kc,
                    &vc,
                )?;
                return Ok((cache, in_target));
            }
            draftc_ops::rope::rope_with_freqs(self.client, &kt, &pos, &freqs, &kt)?;
        }
        let src = self.row_index((0..n as u32).collect())?;
        let dst = self.row_index(rows)?;
        let (src, dst) = (&self.row_indices[src], &self.row_indices[dst]);
        draftc_ops::kv::append_rows_indexed(self.client, &kt, src, dst, &kc)?;
        draftc_ops::kv::append_rows_indexed(self.client, &vt, src, dst, &vc)?;
        Ok((cache, in_target))
    }

    /// The step upload before anything of the pass needs the step's
    /// positions (a RoPE or a `qk_norm`'s RoPE that runs before the K rows
    /// are appended; the executor calls it ahead of both):
    /// the rows of the first cache the pass appends to are reserved now, and
    /// the metadata of the attention reading it rides in the one upload
    /// with the positions and slots, as when the append comes first. Does
    /// nothing once the positions are on the device, or in a pass that
    /// appends to no cache.
    pub(super) fn step_upload_ahead(
        &mut self,
        caches: &mut CacheStore<R>,
        target: Option<&mut CacheStore<R>>,
    ) -> Result<(), ExecError> {
        if self.has_positions(&RowSource::Step) || self.reserved_ahead.is_some() {
            return Ok(());
        }
        let plan = self.plan;
        let Some(kb) = plan.launches.iter().find_map(|l| match l.kernel {
            Kernel::KvAppend { .. } => l.outputs.first().copied(),
            _ => None,
        }) else {
            return Ok(());
        };
        let Some(mask) = plan.launches.iter().find_map(|l| match l.kernel {
            Kernel::Attention { mask, .. } if l.inputs.get(1) == Some(&kb) => Some(mask),
            _ => None,
        }) else {
            return Ok(());
        };
        let (cache, _, store) = self.cache_store(kb, caches, target)?;
        let rows = self.reserve(store, &cache, &RowSource::Step)?;
        let key = self.cache_meta_key(ops_mask(mask), store, &cache)?;
        self.upload_step(&RowSource::Step, key, &rows)?;
        self.reserved_ahead = Some((cache, rows));
        Ok(())
    }

    /// Uploads, in ONE upload, what a pass's first cache append and its
    /// attention need and every later layer reuses: the attention metadata
    /// of `key`, the positions of `src`'s rows and the cache `slots`. Does
    /// nothing when any of them is on the device already (a later layer,
    /// or a pass whose layers differ).
    pub(super) fn upload_step(
        &mut self,
        src: &RowSource,
        key: MetaKey,
        slots: &[u32],
    ) -> Result<(), ExecError> {
        let known = self.has_positions(src)
            || self.row_indices.iter().any(|r| r.as_slice() == slots)
            || self.attn_metas.iter().any(|(k, _)| *k == key);
        let Some((base, rows)) = key.key_base.as_ref() else {
            return Ok(());
        };
        if known || slots.is_empty() {
            return Ok(());
        }
        let positions = self.positions_of(src)?;
        let extra: [(&[u32], &[usize]); 2] =
            [(&positions, &[positions.len()]), (slots, &[slots.len()])];
        let (meta, parts) =
            AttnMeta::with_key_base_and(self.client, &key.batch, key.mask, base, *rows, &extra)?;
        // The write a replay builds anew (`replay.rs`, `step_upload_bytes`).
        draftc_ops::replay::mark_step_write();
        let [pos, dev] = <[DeviceTensor<R>; 2]>::try_from(parts)
            .map_err(|_| ExecError::Internal("a packed upload lost a part".into()))?;
        let meta = self.device_tail(&key, meta)?;
        self.positions.push((src.clone(), pos));
        self.row_indices
            .push(draftc_ops::kv::RowIndex::on_device(slots, dev)?);
        self.attn_metas.push((key, meta));
        Ok(())
    }

    /// The position in `row_indices` of `idx` on the device, uploaded once
    /// per pass: the K and V appends of every layer write the same rows.
    pub(super) fn row_index(&mut self, idx: Vec<u32>) -> Result<usize, ExecError> {
        if let Some(i) = self.row_indices.iter().position(|r| r.as_slice() == idx) {
            return Ok(i);
        }
        let dev = draftc_ops::kv::RowIndex::upload(self.client, &idx)?;
        self.row_indices.push(dev);
        Ok(self.row_indices.len() - 1)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention(
        &mut self,
        launch: &draftc_codegen::Launch,
        heads: i64,
        kv_heads: i64,
        head_dim: i64,
        mask: IrMask,
        layout: AttentionLayout,
        caches: &mut CacheStore<R>,
        mut target: Option<&mut CacheStore<R>>,
    ) -> Result<(), ExecError> {
        let dims = AttnDims {
            heads: heads as usize,
            kv_heads: kv_heads as usize,
            head_dim: head_dim as usize,
        };
        // `scale=` (Gemma 3): set per launch, since the metadata is shared
        // by every attention of the pass.
        let scale = match launch.kernel {
            draftc_codegen::Kernel::Attention { scale, .. } => scale.map(|s| s.get() as f32),
            _ => None,
        };
        let (qb, kb, vb) = (launch.inputs[0], launch.inputs[1], launch.inputs[2]);
        let q = self.tensor(qb)?;
        let rows = q.numel() / (dims.heads * dims.head_dim);
        let q = q.reshape(&[rows, dims.heads, dims.head_dim])?;
        let out = self
            .tensor(launch.outputs[0])?
            .reshape(&[rows, dims.heads, dims.head_dim])?;
        let mask = ops_mask(mask);
        if !self.is_cache(kb) {
            // No cache: keys are this pass's rows.
            let (q_lens, q_pos) = (self.step.lens(), self.step.positions());
            let k = self.tensor(kb)?;
            let v = self.tensor(vb)?;
            if k.numel() / (dims.kv_heads * dims.head_dim) != rows {
                return Err(ExecError::Unsupported(
                    "cross attention with a different number of key rows".into(),
                ));
            }
            let kshape = [rows, dims.kv_heads, dims.head_dim];
            let batch = SeqBatch {
                q_lens: q_lens.clone(),
                k_lens: q_lens,
                q_pos: q_pos.clone(),
                k_pos: q_pos,
                parents: Vec::new(),
                tail: None,
            };
            let key = MetaKey {
                batch,
                mask,
                key_base: None,
            };
            let client = self.client;
            let meta = self.attn_meta(key)?;
            let (k, v) = (k.reshape(&kshape)?, v.reshape(&kshape)?);
            return launch_attention(client, &q, &k, &v, dims, meta, rows, &out, layout, scale);
        }
        let (cache, in_target) = self.flush(kb, vb, mask, caches, target.as_deref_mut())?;
        let store: &mut CacheStore<R> = if in_target {
            target.ok_or_else(|| ExecError::Internal("target caches vanished".into()))?
        } else {
            caches
        };
        let (k_half, _) = self.cache_name(kb);
        let (v_half, _) = self.cache_name(vb);
        let width = dims.kv_heads * dims.head_dim;
        let kc = store.half(&k_half, width)?;
        let vc = store.half(&v_half, width)?;
        let kshape = [store.total_rows(), dims.kv_heads, dims.head_dim];
        let key = self.cache_meta_key(mask, store, &cache)?;
        let client = self.client;
        let meta = self.attn_meta(key)?;
        let (k, v) = (kc.reshape(&kshape)?, vc.reshape(&kshape)?);
        launch_attention(client, &q, &k, &v, dims, meta, rows, &out, layout, scale)
    }

    /// What an attention over `store`'s `cache` with `mask` needs of its
    /// metadata this pass (after the pass's rows are reserved): each
    /// sequence's keys, positions and first key row, and the tree.
    pub(super) fn cache_meta_key(
        &self,
        mask: Mask,
        store: &CacheStore<R>,
        cache: &str,
    ) -> Result<MetaKey, ExecError> {
        meta_key(self.step, mask, store, cache)
    }

    /// The attention metadata of `key`, uploaded once per pass: every layer
    /// of a pass attends over the same positions, so the layers after the
    /// first reuse the first one's device buffers instead of uploading
    /// three more.
    fn attn_meta(&mut self, key: MetaKey) -> Result<&AttnMeta<R>, ExecError> {
        let at = match self.attn_metas.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None if self.shared_meta(&key)? => self.attn_metas.len() - 1,
            None => {
                let meta = match &key.key_base {
                    None => AttnMeta::new(self.client, &key.batch, key.mask)?,
                    Some((base, rows)) => {
                        AttnMeta::with_key_base(self.client, &key.batch, key.mask, base, *rows)?
                    }
                };
                let meta = self.device_tail(&key, meta)?;
                self.attn_metas.push((key, meta));
                self.attn_metas.len() - 1
            }
        };
        Ok(&self.attn_metas[at].1)
    }
}

impl<R: Runtime> Run<'_, R> {
    /// Adds `key`'s metadata when an uploaded one differs from it only in a
    /// mask of the same kind ([`AttnMeta::for_mask`]: the same device
    /// arrays); whether it did.
    fn shared_meta(&mut self, key: &MetaKey) -> Result<bool, ExecError> {
        let same = self
            .attn_metas
            .iter()
            .find(|(k, _)| k.batch == key.batch && k.key_base == key.key_base);
        let Some((_, meta)) = same else {
            return Ok(false);
        };
        let Some(meta) = meta.for_mask(&key.batch, key.mask)? else {
            return Ok(false);
        };
        self.attn_metas.push((key.clone(), meta));
        Ok(true)
    }

    /// `meta` with the pass's memory-tail bits from the device, when the
    /// caller gave them ([`super::MEMORY_TAIL_BITS`]) and `key` has a tail.
    fn device_tail(&self, key: &MetaKey, meta: AttnMeta<R>) -> Result<AttnMeta<R>, ExecError> {
        match (&self.tail_bits, &key.batch.tail) {
            (Some(bits), Some(_)) => Ok(meta.with_tree_bits(bits.clone())?),
            _ => Ok(meta),
        }
    }
}

/// What an attention over `store`'s `cache` with `mask` needs of its
/// metadata for `step` (after the step's rows are reserved): each
/// sequence's keys, positions and first key row, and the tree.
pub(super) fn meta_key<R: Runtime>(
    step: &Step,
    mask: Mask,
    store: &CacheStore<R>,
    cache: &str,
) -> Result<MetaKey, ExecError> {
    let mut k_lens = Vec::new();
    let mut k_pos = Vec::new();
    let mut key_base = Vec::new();
    let is_memory = step.memory_rows_of(cache).is_some();
    for seq in &step.seqs {
        k_lens.push(store.len(cache, seq.slot));
        k_pos.extend_from_slice(store.positions(cache, seq.slot));
        key_base.push(seq.slot * store.capacity());
    }
    let (batch, mask) = step.cache_batch(mask, k_lens, k_pos, is_memory)?;
    Ok(MetaKey {
        batch,
        mask,
        key_base: Some((key_base, store.total_rows())),
    })
}

/// The bytes of a pass's one upload over a cache (`Run::upload_step`):
/// `key`'s attention metadata, the `positions` of the rows appended (the
/// step's, or a memory stream's) and the cache `slots` they go to. A replayed pass writes them into its recorded upload.
pub(super) fn step_upload_bytes(
    key: &MetaKey,
    positions: &[u32],
    slots: &[u32],
) -> Result<Vec<u8>, ExecError> {
    let Some((base, rows)) = key.key_base.as_ref() else {
        return Err(ExecError::Internal("a step upload without a cache".into()));
    };
    let extra: [(&[u32], &[usize]); 2] = [(positions, &[positions.len()]), (slots, &[slots.len()])];
    Ok(draftc_ops::attention::key_base_bytes(
        &key.batch, key.mask, base, *rows, &extra,
    )?)
}

/// What an attention's metadata is built from: the sequences, the mask and
/// (over a cache) each sequence's first key row and the cache's row count.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct MetaKey {
    batch: SeqBatch,
    mask: Mask,
    key_base: Option<(Vec<usize>, usize)>,
}

/// Launches the attention of `meta`'s rows 0..rows in `layout`.
#[allow(clippy::too_many_arguments)]
fn launch_attention<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    dims: AttnDims,
    meta: &AttnMeta<R>,
    rows: usize,
    out: &DeviceTensor<R>,
    layout: AttentionLayout,
    scale: Option<f32>,
) -> Result<(), ExecError> {
    let scaled;
    let meta = match scale {
        Some(s) => {
            scaled = meta.clone().with_scale(s)?;
            &scaled
        }
        None => meta,
    };
    match layout {
        AttentionLayout::Lanes => attention_rows(client, q, k, v, dims, meta, 0..rows, out)?,
        AttentionLayout::Planes {
            plane,
            planes,
            chunk,
        } => {
            let shape = AttnPlaneShape {
                plane,
                planes,
                chunk,
            };
            attention_planes(client, q, k, v, dims, meta, 0..rows, out, shape)?
        }
    }
    Ok(())
}
