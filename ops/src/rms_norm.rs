//! RMS norm over the last dimension with a weight vector:
//! `out[r, i] = x[r, i] / sqrt(mean_j(x[r, j]^2) + eps) * w[i]` (Llama's
//! `LlamaRMSNorm`; statistics in f32 whatever the storage type).
//!
//! The kernel normalises *segments* of `d` contiguous elements, segment `s`
//! scaled by weight row `s % groups`; plain RMS norm is `groups = 1`, and
//! [`crate::group_rms_norm`] launches the same kernel with `groups > 1`.
//! One cube of [`BLOCK`] units per segment; units stride over the segment
//! with `Vector<F, N>` loads (N = 4 when `d` allows) and reduce through
//! shared memory.

use cubecl::prelude::*;

use crate::block::{cube_sum, lane_sum, vector_width};
use crate::error::Result;
use crate::launch::{
    cube_count, expect_dtype, expect_eps, expect_float, expect_nonempty, expect_shape, finish,
};
use crate::tensor::DeviceTensor;

/// Units per cube.
pub const BLOCK: usize = 64;

/// Normalises `segments` segments of `dv` vectors (`d` scalars) each.
/// Weight row for segment `s` is `s % groups`.
#[cube(launch_unchecked)]
pub fn rms_norm_kernel<F: Float + CubeElement, N: Size>(
    x: &Array<Vector<F, N>>,
    w: &Array<Vector<F, N>>,
    out: &mut Array<Vector<F, N>>,
    segments: usize,
    groups: usize,
    dv: usize,
    d: usize,
    eps: f32,
    #[comptime] block: usize,
) {
    let mut smem = SharedMemory::<f32>::new(block);
    let valid = CUBE_POS < segments;
    // Overshooting cubes (from a y-split grid) redo segment 0 but never
    // store, so every unit reaches the barriers.
    let seg = select(valid, CUBE_POS, 0usize);
    let base = seg * dv;
    let wbase = (seg % groups) * dv;
    let tid = UNIT_POS as usize;

    let mut sq = 0f32;
    let mut i = tid;
    while i < dv {
        let v = Vector::<f32, N>::cast_from(x[base + i]);
        sq += lane_sum::<f32, N>(v * v);
        i += block;
    }
    let total = cube_sum(&mut smem, sq, block);
    let inv = 1f32 / f32::sqrt(total / f32::cast_from(d) + eps);

    if valid {
        let mut j = tid;
        while j < dv {
            let v = Vector::<f32, N>::cast_from(x[base + j]) * Vector::new(inv);
            out[base + j] =
                Vector::<F, N>::cast_from(v * Vector::<f32, N>::cast_from(w[wbase + j]));
            j += block;
        }
    }
}

/// Shared launcher: `x` holds `segments * d` elements, `w` is `[groups, d]`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_segments<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    x: &DeviceTensor<R>,
    w: &DeviceTensor<R>,
    groups: usize,
    d: usize,
    eps: f32,
    out: &DeviceTensor<R>,
) -> Result<()> {
    expect_eps(op, eps)?;
    let segments = x.numel() / d;
    let n = vector_width(client, d);
    let count = cube_count(op, segments)?;
    // Unchecked launch: no per-access bounds checks in the shader.
    crate::dispatch_float!(x.dtype(), op, F => {
        // SAFETY: shapes validated above; every index is guarded or clamped in the kernel.
        unsafe {
            rms_norm_kernel::launch_unchecked::<F, R>(
                client,
                count,
                CubeDim::new_1d(BLOCK as u32),
                n,
                x.array_arg(),
                w.array_arg(),
                out.array_arg(),
                segments,
                groups,
                d / n,
                d,
                eps,
                BLOCK,
            )
        }
    })?;
    finish(client, op)
}

/// RMS norm of `x` (`[..., d]`, any rank ≥ 1) with `weight` (`[d]`) into
/// `out` (same shape and dtype as `x`). `out` may be `x` itself.
pub fn rms_norm<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    eps: f32,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "rms_norm";
    expect_float(client, OP, "x", x)?;
    expect_nonempty(OP, "x", x)?;
    let d = *x.shape().last().unwrap_or(&0);
    expect_shape(OP, "weight", weight, &[d])?;
    expect_dtype(OP, "weight", weight, x.dtype())?;
    expect_shape(OP, "out", out, x.shape())?;
    expect_dtype(OP, "out", out, x.dtype())?;
    launch_segments(client, OP, x, weight, 1, d, eps, out)
}

/// Plain-Rust oracle.
pub mod reference {
    /// RMS norm of each `d`-long segment of `x`; segment `s` uses row
    /// `s % groups` of `w` (`[groups, d]`).
    pub fn rms_norm_segments(x: &[f32], w: &[f32], d: usize, eps: f32) -> Vec<f32> {
        let groups = w.len() / d;
        let mut out = Vec::with_capacity(x.len());
        for (s, seg) in x.chunks(d).enumerate() {
            let g = s % groups;
            let ms = (seg.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / d as f64) as f32;
            let inv = 1.0 / (ms + eps).sqrt();
            out.extend(
                seg.iter()
                    .zip(&w[g * d..(g + 1) * d])
                    .map(|(v, w)| v * inv * w),
            );
        }
        out
    }

    /// RMS norm over the last dimension (`w` is `[d]`).
    pub fn rms_norm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
        rms_norm_segments(x, w, w.len(), eps)
    }
}
