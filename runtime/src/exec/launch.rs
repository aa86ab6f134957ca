//! The launches of one pass ([`Run`]) by kernel family: each method maps
//! a plan's launch of its family onto its `draftc-ops` kernel (the linear
//! layouts and epilogues, RoPE, KV appends, the draft-axis attention,
//! embeddings, elementwise ops, layer sums and strided copies).
//! [`Run::launch`](super::executor) dispatches; attention over caches is in
//! `attention.rs`, the fused Q/K/V projection in `qkv.rs`.

use cubecl::prelude::*;
use draftc_codegen::kernel::{ElementwiseOp, Epilogue, Prologue};
use draftc_codegen::{Kernel, Launch};
use draftc_ir::op::NormWeight;
use draftc_ops::attention::AttnDims;
use draftc_ops::elementwise::BinaryOp;
use draftc_ops::{linear, DeviceTensor};

use super::arena::pass_buffer;
use super::bound::weight;
use super::cache::CacheStore;
use super::executor::{gcd, linear_launch, ExecError, RowSource, Run};

/// A launch handed to the method of another family (a planner bug).
fn wrong(launch: &Launch, family: &str) -> ExecError {
    ExecError::Internal(format!(
        "launch #{} ({}) reached the {family} launcher",
        launch.id.0,
        launch.kernel.family()
    ))
}

impl<R: Runtime> Run<'_, R> {
    pub(super) fn linear(
        &mut self,
        launch: &Launch,
        caches: &mut CacheStore<R>,
        target: Option<&mut CacheStore<R>>,
    ) -> Result<(), ExecError> {
        let Kernel::Linear {
            k,
            n,
            prologue,
            epilogue,
            layout,
            parts,
            ..
        } = launch.kernel
        else {
            return Err(wrong(launch, "linear"));
        };
        let c = self.client;
        if let Epilogue::RopeQkv {
            heads,
            kv_heads,
            head_dim,
            theta,
        } = epilogue
        {
            let dims = (heads as usize, kv_heads as usize, head_dim as usize);
            let theta = theta.get().to_bits();
            return self.linear_rope_qkv(
                launch, k as usize, prologue, layout, dims, theta, caches, target,
            );
        }
        let (k, n) = (k as usize, n as usize);
        let xb = launch.inputs[0];
        let (x, src) = match self.memory_name(xb) {
            Some(name) => (self.memory[&name].clone(), RowSource::Memory(name)),
            None => (self.tensor(xb)?, RowSource::Step),
        };
        let (x, m) = match self.head_rows(launch, &src, epilogue, &x, k, n)? {
            Some((_, 0)) => return Ok(()),
            Some(picked) => picked,
            None => {
                let m = x.numel() / k.max(1);
                (x, m)
            }
        };
        if m == 0 {
            // No new memory rows in this pass: nothing to project.
            if self.is_cache(launch.outputs[0]) {
                let t = DeviceTensor::empty(c, &[0, n], self.dtype);
                self.pending.insert(launch.outputs[0], (t, src));
            }
            return Ok(());
        }
        let x = x.reshape(&[m, k])?;
        let mut wi = 0;
        let pro = match prologue {
            Prologue::None => linear::Prologue::None,
            Prologue::RmsNorm { eps } => {
                wi += 1;
                linear::Prologue::RmsNorm {
                    weight: weight(self.weights, launch, 0)?,
                    eps: eps.get() as f32,
                }
            }
            Prologue::GroupRmsNorm { eps, .. } => {
                wi += 1;
                linear::Prologue::GroupRmsNorm {
                    weight: weight(self.weights, launch, 0)?,
                    eps: eps.get() as f32,
                }
            }
        };
        let w = match super::bound::stacked(self.weights, launch, wi)? {
            Some(w) => w.clone(),
            None => weight(self.weights, launch, wi)?.clone(),
        };
        // The epilogue's weight follows the matrices.
        let wi = wi + parts.max(1) as usize - 1;
        let ob = launch.outputs[0];
        let out = if self.is_cache(ob) {
            // Consumed within the pass (RoPE, then the append).
            let bytes = draftc_ops::tensor::padded_bytes(m * n, self.dtype);
            let h = pass_buffer(c, self.step.rows(), bytes);
            let t = DeviceTensor::from_handle(h, &[m, n], self.dtype)?;
            self.pending.insert(ob, (t.clone(), src));
            t
        } else {
            if launch.in_place && self.bufs[ob.index()].is_none() {
                if let Some(a) = launch.alias {
                    let t = self.tensor(launch.inputs[a])?;
                    self.bufs[ob.index()] = Some(t);
                }
            }
            self.tensor(ob)?.reshape(&[m, n])?
        };
        let residual;
        let extra;
        let epi = match epilogue {
            Epilogue::None => linear::Epilogue::None,
            Epilogue::Bias => {
                extra = weight(self.weights, launch, wi + 1)?.clone();
                linear::Epilogue::Bias(&extra)
            }
            Epilogue::Residual => {
                residual = self.tensor(launch.inputs[1])?.reshape(&[m, n])?;
                linear::Epilogue::Residual(&residual)
            }
            Epilogue::SwiGlu => {
                extra = weight(self.weights, launch, wi + 1)?.clone();
                linear::Epilogue::SwiGlu { up: &extra }
            }
            Epilogue::GeGlu => {
                extra = weight(self.weights, launch, wi + 1)?.clone();
                linear::Epilogue::GeGlu { up: &extra }
            }
            Epilogue::RopeQkv { .. } => {
                return Err(ExecError::Internal(
                    "rope_qkv reached a plain linear".into(),
                ))
            }
        };
        linear::linear_in(c, &x, &w, pro, epi, &out, linear_launch(layout))?;
        Ok(())
    }

    /// The LM head of a pass that reads a few rows' logits
    /// (`Step::output_rows`): those rows of `x` (`[_, k]`; a row-wise
    /// prologue, no residual to gather) and their count, with the graph
    /// output's buffer set to `[rows, n]`. `None`: every row.
    fn head_rows(
        &mut self,
        launch: &Launch,
        src: &RowSource,
        epilogue: Epilogue,
        x: &DeviceTensor<R>,
        k: usize,
        n: usize,
    ) -> Result<Option<(DeviceTensor<R>, usize)>, ExecError> {
        let ob = launch.outputs[0];
        let rows = match (&self.step.output_rows, src, epilogue) {
            (Some(rows), RowSource::Step, Epilogue::None | Epilogue::Bias)
                if self.output_bufs.contains(&ob) =>
            {
                rows.clone()
            }
            _ => return Ok(None),
        };
        let c = self.client;
        let m = rows.len();
        let picked = DeviceTensor::empty(c, &[m, k], self.dtype);
        if m > 0 {
            let all = x.numel() / k.max(1);
            let dst: Vec<u32> = (0..m as u32).collect();
            draftc_ops::kv::gather_rows(c, &x.reshape(&[all, k])?, &rows, &picked, &dst)?;
        }
        let dtype = self.buffer_dtype(ob);
        let bytes = draftc_ops::tensor::padded_bytes(m * n, dtype);
        let h = pass_buffer(c, self.step.rows(), bytes.max(16));
        self.bufs[ob.index()] = Some(DeviceTensor::from_handle(h, &[m, n], dtype)?);
        self.selected.push(ob);
        Ok(Some((picked, m)))
    }

    pub(super) fn rope(&mut self, launch: &Launch) -> Result<(), ExecError> {
        let Kernel::Rope {
            heads,
            head_dim,
            theta,
            ..
        } = launch.kernel
        else {
            return Err(wrong(launch, "rope"));
        };
        let c = self.client;
        let (h, hd) = (heads as usize, head_dim as usize);
        let (ib, ob) = (launch.inputs[0], launch.outputs[0]);
        let (x, out, src, new_cache_rows) = match self.pending.get(&ib) {
            Some((t, src)) => (t.clone(), t.clone(), src.clone(), true),
            None => (self.tensor(ib)?, self.tensor(ob)?, RowSource::Step, false),
        };
        let rows = self.positions_of(&src)?.len();
        let tokens = x.numel() / (h * hd);
        if tokens == 0 && rows == 0 {
            return Ok(());
        }
        if tokens != rows {
            return Err(ExecError::Unsupported(format!(
                "rope over {tokens} rows but the pass has {rows} positions"
            )));
        }
        if new_cache_rows {
            // New cache rows: rotated as they are appended, in one
            // launch with the V rows (`attention.rs`, `flush`).
            self.rope_pending.insert(ib, (h, hd, theta.get().to_bits()));
            return Ok(());
        }
        let pos = self.positions_tensor(&src)?;
        let x = x.reshape(&[tokens, h, hd])?;
        let out = out.reshape(&[tokens, h, hd])?;
        let freqs = self.rope_freqs(hd, theta.get().to_bits())?;
        draftc_ops::rope::rope_with_freqs(c, &x, &pos, &freqs, &out)?;
        Ok(())
    }

    /// An attention's `qk_norm`: every head of the queries or new keys
    /// normalised with the launch's weight, then rotated, in place.
    pub(super) fn head_norm(&mut self, launch: &Launch) -> Result<(), ExecError> {
        let Kernel::HeadNorm {
            heads,
            head_dim,
            eps,
            weight: w,
            theta,
            ..
        } = launch.kernel
        else {
            return Err(wrong(launch, "head_norm"));
        };
        let c = self.client;
        let (h, hd) = (heads as usize, head_dim as usize);
        let (ib, ob) = (launch.inputs[0], launch.outputs[0]);
        if self.pending.contains_key(&ib) {
            return Err(ExecError::Unsupported(
                "a head norm over rows already appended to a cache".into(),
            ));
        }
        let x = self.tensor(ib)?;
        let tokens = x.numel() / (h * hd).max(1);
        if tokens == 0 {
            return Ok(());
        }
        let x = x.reshape(&[tokens, h, hd])?;
        let out = self.tensor(ob)?.reshape(&[tokens, h, hd])?;
        let gamma = weight(self.weights, launch, 0)?;
        let unit_offset = w == NormWeight::UnitOffset;
        let eps = eps.get() as f32;
        match theta {
            Some(theta) => {
                let rows = self.positions_of(&RowSource::Step)?.len();
                if tokens != rows {
                    return Err(ExecError::Unsupported(format!(
                        "a head norm with RoPE over {tokens} rows but the pass has {rows} positions"
                    )));
                }
                let pos = self.positions_tensor(&RowSource::Step)?;
                let freqs = self.rope_freqs(hd, theta.get().to_bits())?;
                draftc_ops::head_norm::head_norm_rope(
                    c,
                    &x,
                    gamma,
                    Some((&pos, &freqs)),
                    eps,
                    unit_offset,
                    &out,
                )?;
            }
            None => {
                draftc_ops::head_norm::head_norm_rope(c, &x, gamma, None, eps, unit_offset, &out)?
            }
        }
        Ok(())
    }

    pub(super) fn kv_append(&mut self, launch: &Launch) -> Result<(), ExecError> {
        let Kernel::KvAppend { width, .. } = launch.kernel else {
            return Err(wrong(launch, "kv_append"));
        };
        let c = self.client;
        let width = width as usize;
        for i in 0..2 {
            let t = self.tensor(launch.inputs[i])?;
            let rows = t.numel() / width;
            // Copy out of the (reusable) temporary now, into a kept buffer
            // (an allocation inside a recorded pass would refuse replay).
            let bytes = draftc_ops::tensor::padded_bytes(rows * width, self.dtype);
            let h = super::arena::pass_buffer(c, self.step.rows(), bytes);
            let own = DeviceTensor::from_handle(h, &[rows, width], self.dtype)?;
            let all: Vec<u32> = (0..rows as u32).collect();
            draftc_ops::kv::gather_rows(c, &t.reshape(&[rows, width])?, &all, &own, &all)?;
            self.pending
                .insert(launch.outputs[i], (own, RowSource::Step));
        }
        Ok(())
    }

    pub(super) fn draft_dim_attention(&mut self, launch: &Launch) -> Result<(), ExecError> {
        let Kernel::DraftDimAttention {
            bt,
            l,
            heads,
            kv_heads,
            head_dim,
            chunk,
        } = launch.kernel
        else {
            return Err(wrong(launch, "draft_dim_attention"));
        };
        let c = self.client;
        let (bt, l) = (bt as usize, l as usize);
        let dims = AttnDims {
            heads: heads as usize,
            kv_heads: kv_heads as usize,
            head_dim: head_dim as usize,
        };
        let (qw, kvw) = (dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim);
        let q = self.tensor(launch.inputs[0])?.reshape(&[bt, l, qw])?;
        let k = self.tensor(launch.inputs[1])?.reshape(&[bt, l, kvw])?;
        let v = self.tensor(launch.inputs[2])?.reshape(&[bt, l, kvw])?;
        let out = self.tensor(launch.outputs[0])?.reshape(&[bt, l, qw])?;
        draftc_ops::attention::draft_dim_attention(c, &q, &k, &v, dims, chunk as usize, &out)?;
        Ok(())
    }

    pub(super) fn embedding(&mut self, launch: &Launch) -> Result<(), ExecError> {
        let Kernel::Embedding { d, scale, .. } = launch.kernel else {
            return Err(wrong(launch, "embedding"));
        };
        let c = self.client;
        let ids = self.tensor(launch.inputs[0])?;
        let n = ids.numel();
        let ids = ids.reshape(&[n])?;
        let out = self.tensor(launch.outputs[0])?.reshape(&[n, d as usize])?;
        // Ids are checked on the host where they are uploaded
        // (`TargetModel::forward`) or come from the device's own
        // selections; reading them back here would stall the pass.
        let table = weight(self.weights, launch, 0)?;
        match scale {
            None => draftc_ops::embedding::embedding_clamped(c, table, &ids, &out)?,
            // Gemma's √d, as transformers multiplies: in the table's dtype.
            Some(s) => {
                let s = match self.dtype {
                    draftc_ops::DType::F16 => half::f16::from_f64(s.get()).to_f32(),
                    _ => s.get() as f32,
                };
                draftc_ops::embedding::embedding_clamped_scaled(c, table, &ids, s, &out)?
            }
        }
        Ok(())
    }

    pub(super) fn elementwise(&mut self, launch: &Launch) -> Result<(), ExecError> {
        let Kernel::Elementwise { op, numel, b_numel } = launch.kernel else {
            return Err(wrong(launch, "elementwise"));
        };
        let c = self.client;
        let out = self.tensor(launch.outputs[0])?;
        let out = out.reshape(&[out.numel()])?;
        let a = self.tensor(launch.inputs[0])?;
        let a = a.reshape(&[a.numel()])?;
        match op {
            ElementwiseOp::Silu => draftc_ops::elementwise::silu(c, &a, &out)?,
            ElementwiseOp::Add
            | ElementwiseOp::Mul
            | ElementwiseOp::SwiGlu
            | ElementwiseOp::GeGlu => {
                let b = self.tensor(launch.inputs[1])?;
                let b = if b_numel < numel {
                    self.broadcast(launch, &b)?
                } else {
                    b.reshape(&[b.numel()])?
                };
                let bop = match op {
                    ElementwiseOp::Add => BinaryOp::Add,
                    ElementwiseOp::Mul => BinaryOp::Mul,
                    ElementwiseOp::GeGlu => BinaryOp::GeGlu,
                    ElementwiseOp::SwiGlu | ElementwiseOp::Silu => BinaryOp::SwiGlu,
                };
                draftc_ops::elementwise::binary(c, &a, &b, bop, &out)?;
            }
        }
        Ok(())
    }

    pub(super) fn layer_sum(&mut self, launch: &Launch) -> Result<(), ExecError> {
        let Kernel::LayerSum { layers, numel } = launch.kernel else {
            return Err(wrong(launch, "layer_sum"));
        };
        let c = self.client;
        let (layers, numel) = (layers as usize, numel as usize);
        let x = self.tensor(launch.inputs[0])?;
        let shape = &self.plan.buffer(launch.inputs[0]).shape;
        let d = *shape.last().unwrap_or(&1) as usize;
        let t = numel / d.max(1);
        // Graph layout `[t, layers, d]` → ops layout `[layers, t, d]`.
        let moved = DeviceTensor::empty(c, &[layers * t, d], self.dtype);
        let src: Vec<u32> = (0..(layers * t) as u32).collect();
        let dst: Vec<u32> = src
            .iter()
            .map(|&r| {
                let (ti, j) = (r as usize / layers, r as usize % layers);
                (j * t + ti) as u32
            })
            .collect();
        draftc_ops::kv::gather_rows(c, &x.reshape(&[layers * t, d])?, &src, &moved, &dst)?;
        let moved = moved.reshape(&[layers, t, d])?;
        let out = self.tensor(launch.outputs[0])?.reshape(&[t, d])?;
        draftc_ops::layer_sum::layer_sum(c, &moved, weight(self.weights, launch, 0)?, &out)?;
        Ok(())
    }

    pub(super) fn strided_copy(&mut self, launch: &Launch) -> Result<(), ExecError> {
        let Kernel::StridedCopy {
            blocks,
            block_len,
            src_stride,
            src_offset,
            dst_stride,
            dst_offset,
        } = launch.kernel
        else {
            return Err(wrong(launch, "strided_copy"));
        };
        let c = self.client;
        let g = [block_len, src_stride, src_offset, dst_stride, dst_offset]
            .into_iter()
            .fold(0, gcd)
            .max(1);
        let per = block_len / g;
        let mut src = Vec::new();
        let mut dst = Vec::new();
        for b in 0..blocks {
            for r in 0..per {
                src.push(((b * src_stride + src_offset) / g + r) as u32);
                dst.push(((b * dst_stride + dst_offset) / g + r) as u32);
            }
        }
        let x = self.tensor(launch.inputs[0])?;
        let out = self.tensor(launch.outputs[0])?;
        let g = g as usize;
        let x = x.reshape(&[x.numel() / g, g])?;
        let out = out.reshape(&[out.numel() / g, g])?;
        draftc_ops::kv::gather_rows(c, &x, &src, &out, &dst)?;
        Ok(())
    }
}
