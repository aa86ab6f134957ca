//! Rotary position embedding, HF "rotate_half" convention (Llama):
//! for `i < h = head_dim / 2`, with `f_i = 1 / θ^(2i / head_dim)` and angle
//! `a = pos · f_i`,
//! `out[i] = x[i]·cos a − x[i+h]·sin a`, `out[i+h] = x[i+h]·cos a + x[i]·sin a`.
//!
//! `x` is `[t, heads, head_dim]` and every token carries an explicit position
//! id (`[t]`, u32), so tree nodes can use depth-based positions. The
//! frequencies are computed on the host in f32 exactly like HF's `inv_freq`
//! and uploaded (`h` floats); the kernel reduces the angle modulo 2π in two
//! steps (Cody–Waite) before `sin`/`cos`, so large positions stay accurate
//! on backends with a short-range `sin`.
//!
//! [`rope_append`] fuses a pass's last steps before attention: it rotates
//! the new K rows and writes them, with the new V rows, straight into the
//! caches at their slots (one launch for RoPE on K and both KV appends).
//! [`rope_qkv_append`] goes one step further for self-attention, whose
//! q, k and v projections are one linear over concatenated weights: from
//! that linear's `[n, (heads + 2 · kv_heads) · head_dim]` output it writes
//! the rotated queries, and the rotated K rows and the V rows into the
//! caches (one launch for everything between the projection and attention).

use cubecl::prelude::*;

use crate::error::{OpsError, Result};
use crate::launch::{
    cube_count, expect_dtype, expect_dtypes, expect_float, expect_nonempty, expect_rank,
    expect_shape, finish,
};
use crate::tensor::{DType, DeviceTensor};

/// Units per cube.
pub const BLOCK: usize = 256;

// 2π split into a high part with few mantissa bits and a correction.
const TWO_PI_HI: f32 = 6.28125;
const TWO_PI_LO: f32 = 0.001_935_307_2;

/// The angle `pos · f` reduced modulo 2π in two steps (Cody–Waite), so
/// `sin`/`cos` stay accurate at large positions.
#[cube]
pub(crate) fn reduced_angle(pos: u32, f: f32) -> f32 {
    let a = f32::cast_from(pos) * f;
    let k = f32::round(a / comptime!(TWO_PI_HI + TWO_PI_LO));
    (a - k * TWO_PI_HI) - k * TWO_PI_LO
}

/// Rotates the pair `(x1, x2)` by the angle of position `pos` at
/// frequency `f` and stores it, as `F`, at `out[at]` and `out[at + half]`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn rotate_into<F: Float + CubeElement>(
    x1: f32,
    x2: f32,
    pos: u32,
    f: f32,
    out: &mut Array<F>,
    at: usize,
    half: usize,
) {
    let r = reduced_angle(pos, f);
    let (c, s) = (f32::cos(r), f32::sin(r));
    out[at] = F::cast_from(x1 * c - x2 * s);
    out[at + half] = F::cast_from(x2 * c + x1 * s);
}

/// Stores the pair `(x1, x2)`, columns `j` and `j + half` of head `head`
/// (of `hd = 2 · half`) of row `row` of a fused q/k/v projection (the query
/// heads, then the K heads, then the V heads), where the fused step puts
/// it: a query head rotated into `q` (`[rows, heads, hd]`), a K head
/// rotated into `k_cache` and a V head copied into `v_cache` (both `[.,
/// kv_heads · hd]`) at row `slots[row]`. Shared by
/// [`rope_qkv_append_kernel`] and the epilogue of `crate::linear_rope`.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_qkv_pair<F: Float + CubeElement>(
    x1: f32,
    x2: f32,
    row: usize,
    head: usize,
    j: usize,
    pos: &Array<u32>,
    inv_freq: &Array<f32>,
    slots: &Array<u32>,
    q: &mut Array<F>,
    k_cache: &mut Array<F>,
    v_cache: &mut Array<F>,
    hd: usize,
    half: usize,
    heads: usize,
    kv_heads: usize,
) {
    if head < heads {
        let dst = (row * heads + head) * hd + j;
        rotate_into::<F>(x1, x2, pos[row], inv_freq[j], q, dst, half);
    } else if head < heads + kv_heads {
        let dst = (slots[row] as usize * kv_heads + head - heads) * hd + j;
        rotate_into::<F>(x1, x2, pos[row], inv_freq[j], k_cache, dst, half);
    } else {
        let g = head - heads - kv_heads;
        let dst = (slots[row] as usize * kv_heads + g) * hd;
        v_cache[dst + j] = F::cast_from(x1);
        v_cache[dst + j + half] = F::cast_from(x2);
    }
}

/// One unit per (token, head, i < half) pair.
#[cube(launch_unchecked)]
pub fn rope_kernel<F: Float + CubeElement>(
    x: &Array<F>,
    pos: &Array<u32>,
    inv_freq: &Array<f32>,
    out: &mut Array<F>,
    pairs: usize,
    heads: usize,
    half: usize,
) {
    let p = CUBE_POS * comptime!(BLOCK) + UNIT_POS as usize;
    if p < pairs {
        let i = p % half;
        let th = p / half; // token * heads + head
        let t = th / heads;
        let base = th * 2 * half;
        let x1 = f32::cast_from(x[base + i]);
        let x2 = f32::cast_from(x[base + i + half]);
        rotate_into::<F>(x1, x2, pos[t], inv_freq[i], out, base + i, half);
    }
}

/// One unit per (row, kv head, i < half): rotates `k` into `k_cache` and
/// copies `v` into `v_cache`, both at row `slots[row]`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn rope_append_kernel<F: Float + CubeElement>(
    k: &Array<F>,
    v: &Array<F>,
    pos: &Array<u32>,
    inv_freq: &Array<f32>,
    slots: &Array<u32>,
    k_cache: &mut Array<F>,
    v_cache: &mut Array<F>,
    pairs: usize,
    heads: usize,
    half: usize,
) {
    let p = CUBE_POS * comptime!(BLOCK) + UNIT_POS as usize;
    if p < pairs {
        let i = p % half;
        let th = p / half; // row * heads + head
        let t = th / heads;
        let head = th % heads;
        let src = th * 2 * half;
        let dst = (slots[t] as usize * heads + head) * 2 * half;
        let x1 = f32::cast_from(k[src + i]);
        let x2 = f32::cast_from(k[src + i + half]);
        rotate_into::<F>(x1, x2, pos[t], inv_freq[i], k_cache, dst + i, half);
        v_cache[dst + i] = v[src + i];
        v_cache[dst + i + half] = v[src + i + half];
    }
}

/// One unit per (row, head < heads + 2 · kv_heads, i < half) of a fused
/// projection's output `qkv` (`[n, (heads + 2 · kv_heads) · head_dim]`: the
/// query heads, then the K heads, then the V heads), stored by
/// [`store_qkv_pair`]: a query head rotated into `q`, a K head rotated into
/// `k_cache` and a V head copied into `v_cache`, both at row `slots[row]`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn rope_qkv_append_kernel<F: Float + CubeElement>(
    qkv: &Array<F>,
    pos: &Array<u32>,
    inv_freq: &Array<f32>,
    slots: &Array<u32>,
    q: &mut Array<F>,
    k_cache: &mut Array<F>,
    v_cache: &mut Array<F>,
    pairs: usize,
    heads: usize,
    kv_heads: usize,
    half: usize,
) {
    let p = CUBE_POS * comptime!(BLOCK) + UNIT_POS as usize;
    if p < pairs {
        let i = p % half;
        let rh = p / half; // row * (heads + 2 · kv_heads) + head
        let all = heads + 2 * kv_heads;
        let t = rh / all;
        let head = rh % all;
        let hd = 2 * half;
        let src = rh * hd;
        let x1 = f32::cast_from(qkv[src + i]);
        let x2 = f32::cast_from(qkv[src + i + half]);
        store_qkv_pair::<F>(
            x1, x2, t, head, i, pos, inv_freq, slots, q, k_cache, v_cache, hd, half, heads,
            kv_heads,
        );
    }
}

/// From a fused q/k/v projection's output `qkv` (`[n, (heads + 2 ·
/// kv_heads) · head_dim]`) at `positions` (u32 `[n]`) with `freqs`
/// ([`rope_freqs`]): the rotated query heads into `q` (`[n, heads,
/// head_dim]`), the rotated K heads into `k_cache` and the V heads
/// unchanged into `v_cache` (both `[rows, kv_heads · head_dim]`) at row
/// `slots[i]` (distinct, `< rows`). It is [`rope_with_freqs`] on q and k,
/// then `kv::append_rows` of K and V, in one launch.
#[allow(clippy::too_many_arguments)]
pub fn rope_qkv_append<R: Runtime>(
    client: &ComputeClient<R>,
    qkv: &DeviceTensor<R>,
    positions: &DeviceTensor<R>,
    freqs: &DeviceTensor<R>,
    slots: &crate::kv::RowIndex<R>,
    q: &DeviceTensor<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "rope_qkv_append";
    let (n, heads, hd) = rope_rows(client, OP, "q", q)?;
    let (rows, kv_heads) = cache_heads(OP, k_cache, v_cache, hd)?;
    expect_shape(OP, "qkv", qkv, &[n, (heads + 2 * kv_heads) * hd])?;
    expect_dtypes(
        OP,
        q.dtype(),
        &[("qkv", qkv), ("k_cache", k_cache), ("v_cache", v_cache)],
    )?;
    let half = hd / 2;
    expect_positions_freqs(OP, positions, freqs, n, half)?;
    crate::kv::expect_slots(OP, slots, n, rows, [k_cache, v_cache])?;
    let Some(slot_dev) = slots.device() else {
        return Ok(()); // no rows
    };
    let pairs = n * (heads + 2 * kv_heads) * half;
    let count = cube_count(OP, pairs.div_ceil(BLOCK))?;
    crate::dispatch_float!(q.dtype(), OP, F => {
        // SAFETY: shapes validated above; every slot is < rows and distinct,
        // so each unit writes its own in-bounds elements; `p < pairs` guards.
        unsafe {
            rope_qkv_append_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32),
                qkv.array_arg(), positions.array_arg(), freqs.array_arg(),
                slot_dev.array_arg(), q.array_arg(), k_cache.array_arg(), v_cache.array_arg(),
                pairs, heads, kv_heads, half,
            )
        }
    })?;
    finish(client, OP)
}

/// Rotates the new K rows `k` (`[n, heads, head_dim]`) at `positions` (u32
/// `[n]`) with `freqs` ([`rope_freqs`]) and writes them into `k_cache`, and
/// the new V rows `v` (same shape) unchanged into `v_cache`, both
/// `[rows, heads · head_dim]`, at row `slots[i]` (distinct, `< rows`):
/// [`rope_with_freqs`] on K then `kv::append_rows` of K and V, in one launch.
#[allow(clippy::too_many_arguments)]
pub fn rope_append<R: Runtime>(
    client: &ComputeClient<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    positions: &DeviceTensor<R>,
    freqs: &DeviceTensor<R>,
    slots: &crate::kv::RowIndex<R>,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "rope_append";
    let (n, heads, hd) = rope_rows(client, OP, "k", k)?;
    expect_shape(OP, "v", v, k.shape())?;
    let half = hd / 2;
    expect_positions_freqs(OP, positions, freqs, n, half)?;
    let rows = cache_rows(OP, k_cache, v_cache, heads * hd)?;
    expect_dtypes(
        OP,
        k.dtype(),
        &[("v", v), ("k_cache", k_cache), ("v_cache", v_cache)],
    )?;
    crate::kv::expect_slots(OP, slots, n, rows, [k_cache, v_cache])?;
    let Some(slot_dev) = slots.device() else {
        return Ok(()); // no rows
    };
    let pairs = n * heads * half;
    let count = cube_count(OP, pairs.div_ceil(BLOCK))?;
    crate::dispatch_float!(k.dtype(), OP, F => {
        // SAFETY: shapes validated above; every slot is < rows and distinct,
        // so each unit writes its own in-bounds elements; `p < pairs` guards.
        unsafe {
            rope_append_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32),
                k.array_arg(), v.array_arg(), positions.array_arg(), freqs.array_arg(),
                slot_dev.array_arg(), k_cache.array_arg(), v_cache.array_arg(),
                pairs, heads, half,
            )
        }
    })?;
    finish(client, OP)
}

/// The rows of the cache halves `k_cache` and `v_cache`, both `[rows,
/// width]`.
fn cache_rows<R: Runtime>(
    op: &'static str,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    width: usize,
) -> Result<usize> {
    let rows = expect_rank(op, "k_cache", k_cache, 2, "[rows, kv_heads * head_dim]")?[0];
    expect_shape(op, "k_cache", k_cache, &[rows, width])?;
    expect_shape(op, "v_cache", v_cache, &[rows, width])?;
    Ok(rows)
}

/// The rows and KV heads of `head_dim` of the cache halves `k_cache` and
/// `v_cache` (both `[rows, kv_heads · head_dim]`).
pub(crate) fn cache_heads<R: Runtime>(
    op: &'static str,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
    head_dim: usize,
) -> Result<(usize, usize)> {
    let width = expect_rank(op, "k_cache", k_cache, 2, "[rows, kv_heads * head_dim]")?[1];
    if width == 0 || !width.is_multiple_of(head_dim) {
        return Err(OpsError::InvalidArgument {
            op,
            reason: format!(
                "cache width {width} is not a positive multiple of head_dim {head_dim}"
            ),
        });
    }
    let rows = cache_rows(op, k_cache, v_cache, width)?;
    Ok((rows, width / head_dim))
}

/// Half of a rotated head's `head_dim`, which must be even and positive.
pub(crate) fn expect_head_dim(op: &'static str, head_dim: usize) -> Result<usize> {
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(OpsError::InvalidArgument {
            op,
            reason: format!("head_dim must be even and positive, got {head_dim}"),
        });
    }
    Ok(head_dim / 2)
}

/// A RoPE input `t` (`[n, heads, head_dim]`, float, `head_dim` even and
/// positive): `(n, heads, head_dim)`.
pub(crate) fn rope_rows<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    arg: &'static str,
    t: &DeviceTensor<R>,
) -> Result<(usize, usize, usize)> {
    expect_float(client, op, arg, t)?;
    let s = expect_rank(op, arg, t, 3, "[n, heads, head_dim]")?;
    let (n, heads, hd) = (s[0], s[1], s[2]);
    expect_head_dim(op, hd)?;
    Ok((n, heads, hd))
}

/// The rotation's other inputs: `positions` u32 `[n]` and `freqs` f32
/// `[half]` ([`rope_freqs`]).
pub(crate) fn expect_positions_freqs<R: Runtime>(
    op: &'static str,
    positions: &DeviceTensor<R>,
    freqs: &DeviceTensor<R>,
    n: usize,
    half: usize,
) -> Result<()> {
    expect_dtype(op, "positions", positions, DType::U32)?;
    expect_shape(op, "positions", positions, &[n])?;
    expect_dtype(op, "freqs", freqs, DType::F32)?;
    expect_shape(op, "freqs", freqs, &[half])
}

/// Applies RoPE to `x` (`[t, heads, head_dim]`) at `positions` (u32 `[t]`)
/// with base `theta`, into `out` (same shape; may be `x`). Uploads the
/// frequencies on every call: a caller that launches RoPE repeatedly keeps
/// [`rope_freqs`] and calls [`rope_with_freqs`].
pub fn rope<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    positions: &DeviceTensor<R>,
    theta: f32,
    out: &DeviceTensor<R>,
) -> Result<()> {
    let hd = x.shape().last().copied().unwrap_or(0);
    let freqs = rope_freqs(client, hd, theta)?;
    rope_with_freqs(client, x, positions, &freqs, out)
}

/// The frequencies of RoPE with base `theta` over `head_dim` (f32
/// `[head_dim / 2]`, HF's `inv_freq`), on the device: a per-model constant.
pub fn rope_freqs<R: Runtime>(
    client: &ComputeClient<R>,
    head_dim: usize,
    theta: f32,
) -> Result<DeviceTensor<R>> {
    const OP: &str = "rope";
    expect_head_dim(OP, head_dim)?;
    if !(theta > 1.0 && theta.is_finite()) {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!("theta must be finite and > 1, got {theta}"),
        });
    }
    upload_freqs(client, &reference::inv_freq(head_dim, theta))
}

/// Frequencies given as values (`[head_dim / 2]`, e.g.
/// [`reference::inv_freq_llama3`]) on the device, each finite and positive.
pub fn upload_freqs<R: Runtime>(
    client: &ComputeClient<R>,
    freqs: &[f32],
) -> Result<DeviceTensor<R>> {
    if freqs.is_empty() || freqs.iter().any(|f| !(f.is_finite() && *f > 0.0)) {
        return Err(OpsError::InvalidArgument {
            op: "rope",
            reason: "RoPE frequencies must be finite and positive".into(),
        });
    }
    DeviceTensor::<R>::upload_f32(client, freqs, &[freqs.len()], DType::F32)
}

/// [`rope`] with frequencies from [`rope_freqs`] (f32 `[head_dim / 2]`).
pub fn rope_with_freqs<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    positions: &DeviceTensor<R>,
    freqs: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "rope";
    expect_nonempty(OP, "x", x)?;
    let (t, heads, hd) = rope_rows(client, OP, "x", x)?;
    expect_shape(OP, "out", out, x.shape())?;
    expect_dtype(OP, "out", out, x.dtype())?;
    let half = hd / 2;
    expect_positions_freqs(OP, positions, freqs, t, half)?;
    let pairs = t * heads * half;
    let count = cube_count(OP, pairs.div_ceil(BLOCK))?;
    // Unchecked launch: no per-access bounds checks in the shader.
    crate::dispatch_float!(x.dtype(), OP, F => {
        // SAFETY: shapes validated above; every index is guarded or clamped in the kernel.
        unsafe {
            rope_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32),
                x.array_arg(), positions.array_arg(), freqs.array_arg(), out.array_arg(),
                pairs, heads, half,
            )
        }
    })?;
    finish(client, OP)
}

/// Plain-Rust oracle.
pub mod reference {
    /// HF `inv_freq`: `1 / θ^(2i / head_dim)` for `i < head_dim / 2`, in f32.
    pub fn inv_freq(head_dim: usize, theta: f32) -> Vec<f32> {
        (0..head_dim / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
            .collect()
    }

    /// Llama 3's scaled `inv_freq` (transformers'
    /// `_compute_llama3_parameters`): a frequency whose wavelength is
    /// longer than `original / low_freq_factor` is divided by `factor`, one
    /// shorter than `original / high_freq_factor` kept, and one between
    /// blended, with `original` the pre-training context.
    pub fn inv_freq_llama3(
        head_dim: usize,
        theta: f32,
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original: f32,
    ) -> Vec<f32> {
        let (low_wavelen, high_wavelen) = (original / low_freq_factor, original / high_freq_factor);
        inv_freq(head_dim, theta)
            .into_iter()
            .map(|f| {
                let wavelen = 2.0 * std::f32::consts::PI / f;
                if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / factor
                } else {
                    let smooth = (original / wavelen - low_freq_factor)
                        / (high_freq_factor - low_freq_factor);
                    (1.0 - smooth) * f / factor + smooth * f
                }
            })
            .collect()
    }

    /// [`rope_append`](super::rope_append) on host caches (`[rows, heads ·
    /// head_dim]`): rotated `k` rows and `v` rows written at `slots`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_append(
        k: &[f32],
        v: &[f32],
        pos: &[u32],
        slots: &[u32],
        heads: usize,
        head_dim: usize,
        theta: f32,
        k_cache: &mut [f32],
        v_cache: &mut [f32],
    ) {
        let width = heads * head_dim;
        let rotated = rope(k, pos, heads, head_dim, theta);
        for (i, &s) in slots.iter().enumerate() {
            let (src, dst) = (i * width, s as usize * width);
            k_cache[dst..dst + width].copy_from_slice(&rotated[src..src + width]);
            v_cache[dst..dst + width].copy_from_slice(&v[src..src + width]);
        }
    }

    /// [`rope_qkv_append`](super::rope_qkv_append) on host tensors: the
    /// rotated query heads of `qkv` (returned, `[n, heads, head_dim]`), and
    /// its rotated K heads and its V heads written into the caches (`[rows,
    /// kv_heads · head_dim]`) at `slots`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_qkv_append(
        qkv: &[f32],
        pos: &[u32],
        slots: &[u32],
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        theta: f32,
        k_cache: &mut [f32],
        v_cache: &mut [f32],
    ) -> Vec<f32> {
        let (qw, kw) = (heads * head_dim, kv_heads * head_dim);
        let cols = |from: usize, width: usize| -> Vec<f32> {
            qkv.chunks(qw + 2 * kw)
                .flat_map(|r| r[from..from + width].to_vec())
                .collect()
        };
        let (q, k, v) = (cols(0, qw), cols(qw, kw), cols(qw + kw, kw));
        rope_append(
            &k, &v, pos, slots, kv_heads, head_dim, theta, k_cache, v_cache,
        );
        rope(&q, pos, heads, head_dim, theta)
    }

    /// RoPE of `x` (`[t, heads, head_dim]`) at `pos` (`[t]`).
    pub fn rope(x: &[f32], pos: &[u32], heads: usize, head_dim: usize, theta: f32) -> Vec<f32> {
        rope_with(x, pos, heads, head_dim, &inv_freq(head_dim, theta))
    }

    /// [`rope`] with the frequencies `f` (`[head_dim / 2]`) given.
    pub fn rope_with(x: &[f32], pos: &[u32], heads: usize, head_dim: usize, f: &[f32]) -> Vec<f32> {
        let half = head_dim / 2;
        let mut out = x.to_vec();
        for (th, v) in out.chunks_mut(head_dim).enumerate() {
            let p = pos[th / heads] as f32;
            for i in 0..half {
                let a = (p * f[i]) as f64;
                let (s, c) = (a.sin() as f32, a.cos() as f32);
                let (x1, x2) = (x[th * head_dim + i], x[th * head_dim + i + half]);
                v[i] = x1 * c - x2 * s;
                v[i + half] = x2 * c + x1 * s;
            }
        }
        out
    }
}
