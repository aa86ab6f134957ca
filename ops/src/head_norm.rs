//! Per-head RMS norm then optional RoPE, as Qwen 3 and Gemma 3 apply them
//! to the queries and keys after their projections (transformers:
//! `q = q_norm(q_proj(x).view(t, heads, head_dim))`, then
//! `apply_rotary_pos_emb`).
//!
//! For every (token, head) of `x` (`[t, heads, head_dim]`), in f32:
//! `x̂ = x / sqrt(mean(x²) + eps)`, `y = x̂ · w` (Qwen 3) or `x̂ · (1 + w)`
//! (Gemma 3, `unit_offset`), with one weight `w` (`[head_dim]`) shared by
//! every head; then, when given positions and frequencies, `y` is rotated
//! exactly as [`crate::rope`] does it (HF rotate_half, angle reduced modulo
//! 2π). Only the store rounds to the storage dtype: unlike transformers,
//! which rounds the norm's output to the model dtype before RoPE, the
//! rotation sees the f32 normed values (closer to the exact result; one
//! rounding fewer in f16).
//!
//! One unit per (token, head): it reads its whole head (the sum of squares)
//! before it writes any of it, and no other unit touches that head, so the
//! op runs in place (`out` may be `x`). Every element is read twice and
//! written once; heads are short (`head_dim` ≤ 256 in the models above),
//! and the launch is small next to the projection before it.
//!
//! Limits: `head_dim` even with RoPE (any positive size without); positions
//! u32 `[t]`, frequencies f32 `[head_dim / 2]` from [`crate::rope::rope_freqs`]
//! or [`crate::rope::upload_freqs`].

use cubecl::prelude::*;

use crate::error::{OpsError, Result};
use crate::launch::{cube_count, expect_dtype, expect_eps, expect_float, expect_rank, finish};
use crate::rope::{expect_head_dim, expect_positions_freqs, rotate_into};
use crate::tensor::DeviceTensor;

/// Units (heads) per cube.
pub const BLOCK: usize = 64;

/// One unit per head `r < rows` (`r = token · heads + head`) of `hd`
/// elements: RMS norm with `w + offset`, then (comptime `rope`) RoPE at
/// `pos[r / heads]` with `inv_freq`. Reads the whole head before writing
/// it, so `out` may alias `x`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn head_norm_rope_kernel<F: Float + CubeElement>(
    x: &Array<F>,
    w: &Array<F>,
    pos: &Array<u32>,
    inv_freq: &Array<f32>,
    out: &mut Array<F>,
    rows: usize,
    heads: usize,
    hd: usize,
    eps: f32,
    offset: f32,
    #[comptime] rope: bool,
) {
    let r = CUBE_POS * comptime!(BLOCK) + UNIT_POS as usize;
    if r < rows {
        let base = r * hd;
        let mut sq = 0f32;
        for i in 0..hd {
            let v = f32::cast_from(x[base + i]);
            sq += v * v;
        }
        let inv = 1f32 / f32::sqrt(sq / f32::cast_from(hd) + eps);
        if rope {
            let half = hd / 2;
            let p = pos[r / heads];
            for i in 0..half {
                let x1 = f32::cast_from(x[base + i]) * inv * (f32::cast_from(w[i]) + offset);
                let x2 = f32::cast_from(x[base + i + half])
                    * inv
                    * (f32::cast_from(w[i + half]) + offset);
                rotate_into::<F>(x1, x2, p, inv_freq[i], out, base + i, half);
            }
        } else {
            for i in 0..hd {
                let y = f32::cast_from(x[base + i]) * inv * (f32::cast_from(w[i]) + offset);
                out[base + i] = F::cast_from(y);
            }
        }
    }
}

/// RMS norm of every head of `x` (`[t, heads, head_dim]`, or the same
/// memory as `[t, heads · head_dim]`, float) with `weight` (`[head_dim]`,
/// `x`'s dtype; shared by every head), scaled by `w` or, with
/// `unit_offset`, `1 + w` (Gemma 3), then RoPE when `rope` is
/// `Some((positions, freqs))` (u32 `[t]`, f32 `[head_dim / 2]` from
/// [`crate::rope::rope_freqs`] / [`crate::rope::upload_freqs`]), into
/// `out` (either shape, `x`'s dtype). `out` may be `x` itself (in place).
/// `t = 0` (or no heads) launches nothing.
#[allow(clippy::too_many_arguments)]
pub fn head_norm_rope<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    rope: Option<(&DeviceTensor<R>, &DeviceTensor<R>)>,
    eps: f32,
    unit_offset: bool,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "head_norm_rope";
    expect_float(client, OP, "x", x)?;
    let hd = expect_rank(OP, "weight", weight, 1, "[head_dim]")?[0];
    if hd == 0 {
        return Err(OpsError::EmptyInput {
            op: OP,
            arg: "weight",
            shape: weight.shape().to_vec(),
        });
    }
    expect_dtype(OP, "weight", weight, x.dtype())?;
    let (t, heads) = match *x.shape() {
        [t, heads, d] if d == hd => (t, heads),
        [t, width] if width.is_multiple_of(hd) => (t, width / hd),
        [_, _, d] => {
            return Err(OpsError::ShapeMismatch {
                op: OP,
                arg: "weight",
                expected: format!("[{d}] (x's head_dim)"),
                found: weight.shape().to_vec(),
            })
        }
        _ => {
            return Err(OpsError::ShapeMismatch {
                op: OP,
                arg: "x",
                expected: format!("[t, heads, {hd}] or [t, heads * {hd}]"),
                found: x.shape().to_vec(),
            })
        }
    };
    if out.shape() != [t, heads, hd] && out.shape() != [t, heads * hd] {
        return Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "out",
            expected: format!("[{t}, {heads}, {hd}] or [{t}, {}]", heads * hd),
            found: out.shape().to_vec(),
        });
    }
    expect_dtype(OP, "out", out, x.dtype())?;
    expect_eps(OP, eps)?;
    if let Some((positions, freqs)) = rope {
        let half = expect_head_dim(OP, hd)?;
        expect_positions_freqs(OP, positions, freqs, t, half)?;
    }
    let rows = t * heads;
    if rows == 0 {
        return Ok(()); // no tokens (or no heads): nothing to launch
    }
    // Without RoPE the kernel never reads `pos` or `inv_freq` (comptime
    // switch), but the bindings must exist: the weight's buffer stands in
    // (no allocation, so a recorded pass stays replayable).
    let (pos_arg, freq_arg) = match rope {
        Some((positions, freqs)) => (positions.array_arg(), freqs.array_arg()),
        // SAFETY: never read (see above); the weight's allocation holds at
        // least 16 bytes (`padded_bytes`), more than one u32 or f32.
        None => unsafe {
            (
                ArrayArg::from_raw_parts(weight.handle.clone(), 1),
                ArrayArg::from_raw_parts(weight.handle.clone(), 1),
            )
        },
    };
    let offset = if unit_offset { 1f32 } else { 0f32 };
    let count = cube_count(OP, rows.div_ceil(BLOCK))?;
    crate::dispatch_float!(x.dtype(), OP, F => {
        // SAFETY: shapes validated above: x and out hold rows · hd elements,
        // weight hd, positions t (= rows / heads) and freqs hd / 2 when
        // `rope`; units with `r >= rows` (the ragged last cube, a y-split
        // grid's overshoot) do nothing. Each unit reads and writes only its
        // own head, reading every element before writing it, so `out` may
        // be `x`.
        unsafe {
            head_norm_rope_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32),
                x.array_arg(), weight.array_arg(), pos_arg, freq_arg, out.array_arg(),
                rows, heads, hd, eps, offset, rope.is_some(),
            )
        }
    })?;
    finish(client, OP)
}

/// Plain-Rust oracle.
pub mod reference {
    /// [`head_norm_rope`](super::head_norm_rope) of `x` (`[t, heads,
    /// head_dim]`) with `w` (`[head_dim]`): RMS norm of every head scaled
    /// by `w` (or `1 + w` with `unit_offset`), then, when `rope` is
    /// `Some((positions [t], freqs [head_dim / 2]))`, RoPE.
    pub fn head_norm_rope(
        x: &[f32],
        w: &[f32],
        heads: usize,
        head_dim: usize,
        eps: f32,
        unit_offset: bool,
        rope: Option<(&[u32], &[f32])>,
    ) -> Vec<f32> {
        assert_eq!(w.len(), head_dim, "weight is [head_dim]");
        let scale: Vec<f32> = if unit_offset {
            w.iter().map(|w| 1.0 + w).collect()
        } else {
            w.to_vec()
        };
        let normed = crate::rms_norm::reference::rms_norm_segments(x, &scale, head_dim, eps);
        match rope {
            Some((pos, freqs)) => {
                crate::rope::reference::rope_with(&normed, pos, heads, head_dim, freqs)
            }
            None => normed,
        }
    }
}
