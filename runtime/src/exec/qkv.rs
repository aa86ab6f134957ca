//! A self-attention's fused q/k/v step: the stacked projection with RoPE
//! and both cache appends as its epilogue (`Kernel::Linear` with
//! `Epilogue::RopeQkv`, one launch), or, where that kernel does not apply,
//! RoPE and the appends after a plain stacked projection
//! (`Kernel::RopeQkvAppend`). Both reserve the pass's rows in the cache
//! and upload, once a pass, what the attention after them reads (its
//! metadata, the positions and the cache slots, in one upload).

use cubecl::prelude::*;
use draftc_codegen::kernel::Prologue;
use draftc_codegen::{BufferId, Kernel, LinearLayout};

use draftc_ops::linear_rope::{linear_rope_qkv, RopeQkvLayout, RopeQkvOut};
use draftc_ops::DeviceTensor;

use super::cache::CacheStore;
use super::executor::{ops_mask, ExecError, RowSource, Run};

/// What a q/k/v step writes with: the cache halves, the positions, the
/// slots' place in the pass's row indices, and the RoPE frequencies.
struct StepRows<R: Runtime> {
    k_cache: DeviceTensor<R>,
    v_cache: DeviceTensor<R>,
    positions: DeviceTensor<R>,
    slots: usize,
    freqs: DeviceTensor<R>,
}

/// The q, K-cache and V-cache buffers a q/k/v step writes.
fn outputs(launch: &draftc_codegen::Launch) -> Result<(BufferId, BufferId, BufferId), ExecError> {
    match launch.outputs[..] {
        [q, k, v] => Ok((q, k, v)),
        _ => Err(ExecError::Internal(format!(
            "launch #{}: a q/k/v step writes q, k and v",
            launch.id.0
        ))),
    }
}

impl<R: Runtime> Run<'_, R> {
    /// Reserves the pass's `n` rows in the cache of halves `kb`, `vb`
    /// (`width` each), uploads what the attention reading that cache needs
    /// (once a pass), and returns what the step writes with.
    #[allow(clippy::too_many_arguments)]
    fn step_rows(
        &mut self,
        kb: BufferId,
        vb: BufferId,
        n: usize,
        width: usize,
        head_dim: usize,
        theta_bits: u64,
        caches: &mut CacheStore<R>,
        target: Option<&mut CacheStore<R>>,
    ) -> Result<StepRows<R>, ExecError> {
        let (cache, _, store) = self.cache_store(kb, caches, target)?;
        let rows = self.reserve(store, &cache, &RowSource::Step)?;
        if rows.len() != n {
            return Err(ExecError::Unsupported(format!(
                "q/k/v of {n} rows but the pass has {} positions",
                rows.len()
            )));
        }
        let k_cache = store.half(&self.cache_name(kb).0, width)?;
        let v_cache = store.half(&self.cache_name(vb).0, width)?;
        // The attention this step feeds reads the same cache: on the pass's
        // first such step its metadata rides in one upload with the
        // positions and slots, which every later layer reuses.
        if !self.has_positions(&RowSource::Step) {
            let consumer = self.plan.launches.iter().find_map(|l| match l.kernel {
                Kernel::Attention { mask, .. } if l.inputs.get(1) == Some(&kb) => Some(mask),
                _ => None,
            });
            if let Some(mask) = consumer {
                let key = self.cache_meta_key(ops_mask(mask), store, &cache)?;
                self.upload_step(&RowSource::Step, key, &rows)?;
            }
        }
        Ok(StepRows {
            k_cache,
            v_cache,
            positions: self.positions_tensor(&RowSource::Step)?,
            slots: self.row_index(rows)?,
            freqs: self.rope_freqs(head_dim, theta_bits)?,
        })
    }

    /// `Kernel::RopeQkvAppend`: RoPE on q and k of a stacked projection's
    /// output (the launch's input) and both appends, in one launch.
    pub(super) fn rope_qkv_append(
        &mut self,
        launch: &draftc_codegen::Launch,
        heads: usize,
        head_dim: usize,
        theta_bits: u64,
        caches: &mut CacheStore<R>,
        target: Option<&mut CacheStore<R>>,
    ) -> Result<(), ExecError> {
        let (qb, kb, vb) = outputs(launch)?;
        let qkv = self.tensor(launch.inputs[0])?;
        let n = qkv.shape()[0];
        let q = self.tensor(qb)?.reshape(&[n, heads, head_dim])?;
        let width = (qkv.shape()[1] - heads * head_dim) / 2;
        let s = self.step_rows(kb, vb, n, width, head_dim, theta_bits, caches, target)?;
        let slots = &self.row_indices[s.slots];
        draftc_ops::rope::rope_qkv_append(
            self.client,
            &qkv,
            &s.positions,
            &s.freqs,
            slots,
            &q,
            &s.k_cache,
            &s.v_cache,
        )?;
        Ok(())
    }

    /// `Kernel::Linear` with `Epilogue::RopeQkv`: the stacked q/k/v
    /// projection of the launch's input (its norm fused), RoPE and both
    /// appends, in one launch.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn linear_rope_qkv(
        &mut self,
        launch: &draftc_codegen::Launch,
        k: usize,
        prologue: Prologue,
        layout: LinearLayout,
        (heads, kv_heads, head_dim): (usize, usize, usize),
        theta_bits: u64,
        caches: &mut CacheStore<R>,
        target: Option<&mut CacheStore<R>>,
    ) -> Result<(), ExecError> {
        let (qb, kb, vb) = outputs(launch)?;
        let x = self.tensor(launch.inputs[0])?;
        let m = x.numel() / k.max(1);
        let x = x.reshape(&[m, k])?;
        let (norm, wi) = match prologue {
            Prologue::None => (None, 0),
            Prologue::RmsNorm { eps } => (Some(eps.get() as f32), 1),
            Prologue::GroupRmsNorm { .. } => {
                return Err(ExecError::Internal(format!(
                    "launch #{}: the q/k/v projection with RoPE takes no grouped norm",
                    launch.id.0
                )))
            }
        };
        let gamma = match norm {
            Some(_) => Some(super::bound::weight(self.weights, launch, 0)?.clone()),
            None => None,
        };
        let w = super::bound::stacked(self.weights, launch, wi)?
            .ok_or_else(|| {
                ExecError::Internal(format!(
                    "launch #{}: the q/k/v projection has no stacked weight",
                    launch.id.0
                ))
            })?
            .clone();
        let q = self.tensor(qb)?.reshape(&[m, heads, head_dim])?;
        let width = kv_heads * head_dim;
        let s = self.step_rows(kb, vb, m, width, head_dim, theta_bits, caches, target)?;
        let out = RopeQkvOut {
            positions: &s.positions,
            freqs: &s.freqs,
            slots: &self.row_indices[s.slots],
            q: &q,
            k_cache: &s.k_cache,
            v_cache: &s.v_cache,
        };
        let layout: RopeQkvLayout = super::executor::linear_launch(layout);
        let norm = gamma.as_ref().zip(norm);
        linear_rope_qkv(self.client, &x, &w, norm, out, layout)?;
        Ok(())
    }
}
