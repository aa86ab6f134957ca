//! Safe launch functions of the fused attention kernel.
//!
//! [`AttnMeta`] uploads the per-row metadata of a [`SeqBatch`] once;
//! [`attention_rows`] launches the kernel over a range of query rows (what
//! chunking and the runtime need); [`attention`] is the one-call form;
//! [`draft_dim_attention`] is the paper-000 draft-axis attention in chunks.
//! Everything is validated on the host before anything is launched.

use std::ops::Range;

use cubecl::prelude::*;

use super::kernel::fused_attention;
use super::mask::{Mask, SeqBatch};
use super::AttnDims;
use crate::error::{OpsError, Result};
use crate::launch::{
    cube_count, expect_bindable, expect_dtype, expect_float, expect_shape, finish,
};
use crate::tensor::DeviceTensor;

/// Units per cube (one unit per query row and group of query heads).
const CUBE_UNITS: u32 = 64;

/// Per-row metadata of a [`SeqBatch`] in device memory, for one mask.
pub struct AttnMeta<R: Runtime> {
    /// `[total_q, 4]`: `(q_pos, k_begin, k_end, tree_base)` per query row.
    pub(super) meta: DeviceTensor<R>,
    pub(super) k_pos: DeviceTensor<R>,
    /// Tree ancestor bits `[total_q, words]` (a single zero word otherwise).
    pub(super) anc: DeviceTensor<R>,
    pub(super) words: usize,
    pub(super) total_q: usize,
    pub(super) total_k: usize,
    pub(super) mask: Mask,
    /// Most keys any query row scans (its sequence's key rows).
    pub(super) max_keys: usize,
    /// The softmax scale when set ([`AttnMeta::with_scale`]); `1/√head_dim`
    /// otherwise.
    pub(super) scale: Option<f32>,
}

// By hand: a derive would ask `R: Clone`. Clones share the device buffers.
impl<R: Runtime> Clone for AttnMeta<R> {
    fn clone(&self) -> Self {
        AttnMeta {
            meta: self.meta.clone(),
            k_pos: self.k_pos.clone(),
            anc: self.anc.clone(),
            words: self.words,
            total_q: self.total_q,
            total_k: self.total_k,
            mask: self.mask,
            max_keys: self.max_keys,
            scale: self.scale,
        }
    }
}

/// The metadata's tensors (per-row metadata, key positions, tree bits)
/// and one per `extra` array.
type Uploaded<R> = (
    DeviceTensor<R>,
    DeviceTensor<R>,
    DeviceTensor<R>,
    Vec<DeviceTensor<R>>,
);

/// The per-row metadata, key positions, tree bits and `extra` arrays in
/// one upload.
fn upload_meta<R: Runtime>(
    client: &ComputeClient<R>,
    batch: &SeqBatch,
    meta: &[u32],
    k_pos: &[u32],
    anc: &[u32],
    extra: &[(&[u32], &[usize])],
) -> Result<Uploaded<R>> {
    let (q, kp, a) = ([batch.total_q(), 4], [k_pos.len()], [anc.len()]);
    let mut parts: Vec<(&[u32], &[usize])> = vec![(meta, &q), (k_pos, &kp), (anc, &a)];
    parts.extend_from_slice(extra);
    let mut t = DeviceTensor::upload_u32_packed(client, &parts)?.into_iter();
    match (t.next(), t.next(), t.next()) {
        (Some(m), Some(k), Some(a)) => Ok((m, k, a, t.collect())),
        _ => Err(OpsError::Device {
            op: "attention",
            message: "a packed upload returned too few tensors".into(),
        }),
    }
}

impl<R: Runtime> AttnMeta<R> {
    /// Validates `batch` for `mask` and uploads its metadata.
    pub fn new(client: &ComputeClient<R>, batch: &SeqBatch, mask: Mask) -> Result<Self> {
        batch.validate("attention", &mask)?;
        let (q_starts, k_starts) = (batch.q_starts(), batch.k_starts());
        let mut meta = Vec::with_capacity(batch.total_q() * 4);
        for s in 0..batch.batch() {
            let tree_base = k_starts[s + 1] - batch.tree_keys(s, &mask);
            for row in q_starts[s]..q_starts[s + 1] {
                meta.extend([
                    batch.q_pos[row],
                    k_starts[s] as u32,
                    k_starts[s + 1] as u32,
                    tree_base as u32,
                ]);
            }
        }
        let (anc, words) = batch.tree_bits(&mask).unwrap_or((vec![0], 0));
        let k_pos = if batch.k_pos.is_empty() {
            vec![0]
        } else {
            batch.k_pos.clone()
        };
        let (meta, k_pos, anc, _) = upload_meta(client, batch, &meta, &k_pos, &anc, &[])?;
        Ok(AttnMeta {
            meta,
            k_pos,
            anc,
            words,
            total_q: batch.total_q(),
            total_k: batch.total_k(),
            mask,
            max_keys: batch.k_lens.iter().copied().max().unwrap_or(0),
            scale: None,
        })
    }

    /// The same metadata with its tree bits replaced by `bits` (`[total_q,
    /// words]` u32, the layout of [`super::TreeTail`]), already on the
    /// device: a drafter that expands its tree on the device computes there
    /// which draft states each query row sees (`crate::tree_frontier`).
    /// Build the metadata from a batch with a tail of the same lengths and
    /// words; its host bits are then unused.
    pub fn with_tree_bits(mut self, bits: DeviceTensor<R>) -> Result<Self> {
        if bits.dtype() != crate::DType::U32 || bits.numel() != self.total_q * self.words {
            return Err(OpsError::ShapeMismatch {
                op: "attention",
                arg: "tree bits",
                expected: format!("[{}, {}] u32", self.total_q, self.words),
                found: bits.shape().to_vec(),
            });
        }
        self.anc = bits;
        Ok(self)
    }

    /// The same metadata with softmax scale `scale` instead of `1/√head_dim`:
    /// every launch over it ([`attention_rows`], [`super::attention_planes`])
    /// computes `softmax(scale · q·kᵀ)`. Gemma 3 scales by
    /// `query_pre_attn_scalar^-0.5`. The scale is a runtime scalar of the
    /// kernels, so no new kernel is compiled. `scale` must be finite and
    /// `> 0`, else [`OpsError::InvalidArgument`].
    pub fn with_scale(mut self, scale: f32) -> Result<Self> {
        if !scale.is_finite() || scale <= 0.0 {
            return Err(OpsError::InvalidArgument {
                op: "attention",
                reason: format!("softmax scale must be finite and > 0, got {scale}"),
            });
        }
        self.scale = Some(scale);
        Ok(self)
    }

    /// The scale set by [`AttnMeta::with_scale`], if any.
    pub fn scale(&self) -> Option<f32> {
        self.scale
    }

    /// The softmax scale of a launch over heads of `head_dim`: the one set
    /// by [`AttnMeta::with_scale`], else `1/√head_dim`.
    pub fn softmax_scale(&self, head_dim: usize) -> f32 {
        self.scale.unwrap_or_else(|| 1.0 / (head_dim as f32).sqrt())
    }

    /// Like [`AttnMeta::new`], but the keys of sequence `s` are the rows
    /// `key_base[s] .. key_base[s] + k_lens[s]` of a larger K/V buffer (a
    /// cache with a fixed capacity per sequence) instead of being packed.
    /// `k_pos` is given per sequence as in `batch` and scattered to those rows;
    /// `key_rows` is the row count of the K/V buffers the kernel will get.
    pub fn with_key_base(
        client: &ComputeClient<R>,
        batch: &SeqBatch,
        mask: Mask,
        key_base: &[usize],
        key_rows: usize,
    ) -> Result<Self> {
        Ok(Self::with_key_base_and(client, batch, mask, key_base, key_rows, &[])?.0)
    }

    /// [`AttnMeta::with_key_base`] that also uploads the u32 arrays
    /// `extra` (`(data, shape)` each), all in ONE upload: a pass's other
    /// per-step arrays (positions, cache slots) ride with its attention
    /// metadata. Returns the metadata and a tensor per `extra` array.
    pub fn with_key_base_and(
        client: &ComputeClient<R>,
        batch: &SeqBatch,
        mask: Mask,
        key_base: &[usize],
        key_rows: usize,
        extra: &[(&[u32], &[usize])],
    ) -> Result<(Self, Vec<DeviceTensor<R>>)> {
        let h = KeyBaseArrays::new(batch, mask, key_base, key_rows)?;
        let (meta, k_pos, anc, rest) =
            upload_meta(client, batch, &h.meta, &h.k_pos, &h.anc, extra)?;
        let m = AttnMeta {
            meta,
            k_pos,
            anc,
            words: h.words,
            total_q: batch.total_q(),
            total_k: key_rows,
            mask,
            max_keys: batch.k_lens.iter().copied().max().unwrap_or(0),
            scale: None,
        };
        Ok((m, rest))
    }

    /// Total query rows of the batch.
    pub fn total_q(&self) -> usize {
        self.total_q
    }

    /// Total key rows of the batch.
    pub fn total_k(&self) -> usize {
        self.total_k
    }

    /// The mask this metadata was built for.
    pub fn mask(&self) -> Mask {
        self.mask
    }

    /// The same metadata for `mask`, another mask of the same kind (tree or
    /// not) over the same `batch`: its device arrays depend on the mask only
    /// through that kind (`SeqBatch::tree_keys`, `SeqBatch::tree_bits`), so
    /// they are shared and nothing is uploaded (Gemma 3's sliding and global
    /// layers in one pass). `None` for a mask of the other kind.
    pub fn for_mask(&self, batch: &SeqBatch, mask: Mask) -> Result<Option<Self>> {
        if mask.is_tree() != self.mask.is_tree() {
            return Ok(None);
        }
        batch.validate("attention", &mask)?;
        Ok(Some(AttnMeta {
            mask,
            ..self.clone()
        }))
    }
}

/// Fused attention over a whole batch: `out = softmax(mask(q·kᵀ/√hd))·v`
/// (for another scale, build an [`AttnMeta`] with [`AttnMeta::with_scale`]
/// and call [`attention_rows`]).
///
/// `q`, `out`: `[Σ q_lens, heads, head_dim]`; `k`, `v`: `[Σ k_lens, kv_heads,
/// head_dim]`; all the same float dtype. Masks: see [`Mask`].
#[allow(clippy::too_many_arguments)]
pub fn attention<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    dims: AttnDims,
    batch: &SeqBatch,
    mask: Mask,
    out: &DeviceTensor<R>,
) -> Result<()> {
    dims.validate("attention")?;
    let meta = AttnMeta::new(client, batch, mask)?;
    attention_rows(client, q, k, v, dims, &meta, 0..meta.total_q, out)
}

/// Launches the kernel for the query rows `rows` of the batch behind `meta`
/// only (other rows of `out` are left untouched). Tensor shapes as in
/// [`attention`]; the softmax scale is [`AttnMeta::softmax_scale`].
#[allow(clippy::too_many_arguments)]
pub fn attention_rows<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    dims: AttnDims,
    meta: &AttnMeta<R>,
    rows: Range<usize>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "attention";
    if !check_rows(client, q, k, v, dims, meta, &rows, out)? {
        return Ok(());
    }
    let AttnDims {
        heads,
        kv_heads,
        head_dim,
    } = dims;
    let vec = crate::block::widest_vector(head_dim, 4);
    let cap_scalars = super::head_dim_cap(head_dim);
    let gq = super::lane_heads_per_unit(heads / kv_heads, head_dim);
    let units = rows.len() * heads / gq;
    let count = cube_count(OP, units.div_ceil(CUBE_UNITS as usize))?;
    let (code, p0, p1) = meta.mask.kernel_args();
    let tree = meta.words > 0;
    crate::dispatch_float!(q.dtype(), OP, F => {
        // SAFETY: shapes, metadata ranges (built by `AttnMeta::new` from a
        // validated batch) and the row range were checked above; the kernel
        // guards `idx < rows * heads` and reads only inside those ranges.
        unsafe {
            fused_attention::launch_unchecked::<F, R>(
                client,
                count,
                CubeDim::new_1d(CUBE_UNITS),
                vec,
                q.array_arg(),
                k.array_arg(),
                v.array_arg(),
                out.array_arg(),
                meta.meta.array_arg(),
                meta.k_pos.array_arg(),
                meta.anc.array_arg(),
                rows.start as u32,
                rows.len() as u32,
                heads as u32,
                (heads / kv_heads) as u32,
                kv_heads as u32,
                (head_dim / vec) as u32,
                meta.softmax_scale(head_dim),
                p0,
                p1,
                meta.words as u32,
                code,
                tree,
                cap_scalars / vec,
                gq,
            )
        }
    })?;
    finish(client, OP)
}

/// Draft-dim attention (paper 000 §3.3, SpecFormer's "Draft Bidirectional
/// Attention"): `q`/`out` `[bt, l, heads·head_dim]`, `k`/`v`
/// `[bt, l, kv_heads·head_dim]`; each of the `bt` rows attends
/// bidirectionally within its own `l` draft positions. At most `chunk` rows
/// are launched at a time (the paper used 3072); the result is bit-identical
/// to a single launch. `chunk == 0` is an error.
#[allow(clippy::too_many_arguments)]
pub fn draft_dim_attention<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    dims: AttnDims,
    chunk: usize,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "draft_dim_attention";
    dims.validate(OP)?;
    if chunk == 0 {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: "chunk size must be >= 1".into(),
        });
    }
    let &[bt, l, width] = q.shape() else {
        return Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "q",
            expected: "[bt, l, heads*head_dim]".into(),
            found: q.shape().to_vec(),
        });
    };
    if width != dims.heads * dims.head_dim || bt == 0 || l == 0 {
        return Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "q",
            expected: format!("[bt >= 1, l >= 1, {}]", dims.heads * dims.head_dim),
            found: q.shape().to_vec(),
        });
    }
    let kv_shape = [bt, l, dims.kv_heads * dims.head_dim];
    expect_shape(OP, "k", k, &kv_shape)?;
    expect_shape(OP, "v", v, &kv_shape)?;
    expect_shape(OP, "out", out, q.shape())?;
    expect_dtype(OP, "out", out, q.dtype())?;
    let meta = AttnMeta::new(client, &SeqBatch::uniform(bt, l), Mask::Full)?;
    let q3 = q.reshape(&[bt * l, dims.heads, dims.head_dim])?;
    let k3 = k.reshape(&[bt * l, dims.kv_heads, dims.head_dim])?;
    let v3 = v.reshape(&[bt * l, dims.kv_heads, dims.head_dim])?;
    let o3 = out.reshape(&[bt * l, dims.heads, dims.head_dim])?;
    let mut start = 0;
    while start < bt {
        let end = (start + chunk).min(bt);
        attention_rows(client, &q3, &k3, &v3, dims, &meta, start * l..end * l, &o3)?;
        start = end;
    }
    Ok(())
}

/// Validates an attention launch over query rows `rows`; `Ok(false)` when
/// there is nothing to compute. Shared by every kernel layout.
#[allow(clippy::too_many_arguments)]
pub(super) fn check_rows<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    dims: AttnDims,
    meta: &AttnMeta<R>,
    rows: &Range<usize>,
    out: &DeviceTensor<R>,
) -> Result<bool> {
    const OP: &str = "attention";
    dims.validate(OP)?;
    let AttnDims {
        heads,
        kv_heads,
        head_dim,
    } = dims;
    expect_float(client, OP, "q", q)?;
    expect_shape(OP, "q", q, &[meta.total_q, heads, head_dim])?;
    expect_shape(OP, "k", k, &[meta.total_k, kv_heads, head_dim])?;
    expect_shape(OP, "v", v, &[meta.total_k, kv_heads, head_dim])?;
    expect_shape(OP, "out", out, &[meta.total_q, heads, head_dim])?;
    for (arg, t) in [("k", k), ("v", v), ("out", out)] {
        expect_dtype(OP, arg, t, q.dtype())?;
    }
    for (arg, t) in [
        ("q", q),
        ("k", k),
        ("v", v),
        ("out", out),
        ("meta", &meta.meta),
        ("anc", &meta.anc),
    ] {
        expect_bindable(OP, arg, t)?;
    }
    if meta.total_k == 0 {
        return Err(OpsError::EmptyInput {
            op: OP,
            arg: "k",
            shape: k.shape().to_vec(),
        });
    }
    if rows.start > rows.end || rows.end > meta.total_q {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!("row range {rows:?} is not within 0..{}", meta.total_q),
        });
    }
    Ok(!rows.is_empty())
}

/// The bytes [`AttnMeta::with_key_base_and`] uploads for the same
/// arguments, without uploading: what a replayed pass writes into its
/// recorded upload (`crate::replay`).
pub fn key_base_bytes(
    batch: &SeqBatch,
    mask: Mask,
    key_base: &[usize],
    key_rows: usize,
    extra: &[(&[u32], &[usize])],
) -> Result<Vec<u8>> {
    let h = KeyBaseArrays::new(batch, mask, key_base, key_rows)?;
    let (q, kp, a) = ([batch.total_q(), 4], [h.k_pos.len()], [h.anc.len()]);
    let mut parts: Vec<(&[u32], &[usize])> = vec![(&h.meta, &q), (&h.k_pos, &kp), (&h.anc, &a)];
    parts.extend_from_slice(extra);
    let (words, _) = crate::tensor::pack_u32(&parts)?;
    Ok(bytemuck::cast_slice::<u32, u8>(&words).to_vec())
}

/// The host arrays of [`AttnMeta::with_key_base_and`]: per-row metadata,
/// key positions scattered to their cache rows, tree bits and their words.
struct KeyBaseArrays {
    meta: Vec<u32>,
    k_pos: Vec<u32>,
    anc: Vec<u32>,
    words: usize,
}

impl KeyBaseArrays {
    fn new(batch: &SeqBatch, mask: Mask, key_base: &[usize], key_rows: usize) -> Result<Self> {
        batch.validate("attention", &mask)?;
        if key_base.len() != batch.batch() {
            return Err(OpsError::ShapeMismatch {
                op: "attention",
                arg: "key_base",
                expected: format!("[{}] (one base row per sequence)", batch.batch()),
                found: vec![key_base.len()],
            });
        }
        let (q_starts, k_starts) = (batch.q_starts(), batch.k_starts());
        let rows = (0..batch.batch())
            .map(|s| key_base[s] + batch.k_lens[s])
            .max()
            .unwrap_or(0);
        if rows > key_rows {
            return Err(OpsError::InvalidArgument {
                op: "attention",
                reason: format!("keys reach row {rows} but the K/V buffers have {key_rows} rows"),
            });
        }
        let mut k_pos = vec![0u32; key_rows.max(1)];
        let mut meta = Vec::with_capacity(batch.total_q() * 4);
        for s in 0..batch.batch() {
            let (base, len) = (key_base[s], batch.k_lens[s]);
            k_pos[base..base + len].copy_from_slice(&batch.k_pos[k_starts[s]..k_starts[s + 1]]);
            let tree_base = base + len - batch.tree_keys(s, &mask);
            for row in q_starts[s]..q_starts[s + 1] {
                meta.extend([
                    batch.q_pos[row],
                    base as u32,
                    (base + len) as u32,
                    tree_base as u32,
                ]);
            }
        }
        let (anc, words) = batch.tree_bits(&mask).unwrap_or((vec![0], 0));
        Ok(KeyBaseArrays {
            meta,
            k_pos,
            anc,
            words,
        })
    }
}
