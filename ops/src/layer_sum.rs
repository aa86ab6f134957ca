//! Weighted layer sum (SPIRe's feedback memory):
//! `out = Σ_i softmax(w)_i · x_i` over `L` layer activations stacked as
//! `x` `[L, ...]` with mixing logits `w` `[L]`. The softmax of the `L`
//! logits is recomputed by every unit (L is small); the sum is element-wise
//! with `Vector<F, N>` loads, accumulated in f32.

use cubecl::prelude::*;

use crate::block::vector_width;
use crate::error::{OpsError, Result};
use crate::launch::{
    cube_count, expect_dtype, expect_float, expect_nonempty, expect_shape, finish,
};
use crate::tensor::DeviceTensor;

/// Units per cube.
pub const BLOCK: usize = 256;

#[cube(launch_unchecked)]
pub fn layer_sum_kernel<F: Float + CubeElement, N: Size>(
    x: &Array<Vector<F, N>>,
    w: &Array<F>,
    out: &mut Array<Vector<F, N>>,
    layers: usize,
    len_v: usize,
) {
    let j = CUBE_POS * comptime!(BLOCK) + UNIT_POS as usize;
    if j < len_v {
        let mut mx = comptime!(-f32::MAX).runtime(); // lowest finite f32
        for i in 0..layers {
            mx = f32::max(mx, f32::cast_from(w[i]));
        }
        let mut total = 0f32;
        for i in 0..layers {
            total += f32::exp(f32::cast_from(w[i]) - mx);
        }
        let mut acc = Vector::<f32, N>::new(0.0);
        for i in 0..layers {
            let p = f32::exp(f32::cast_from(w[i]) - mx) / total;
            acc += Vector::<f32, N>::cast_from(x[i * len_v + j]) * Vector::new(p);
        }
        out[j] = Vector::<F, N>::cast_from(acc);
    }
}

/// `out = Σ_i softmax(weights)_i · x[i]` for `x` `[L, ...]`, `weights` `[L]`,
/// `out` shaped like `x` without its first dim.
pub fn layer_sum<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weights: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "layer_sum";
    expect_float(client, OP, "x", x)?;
    expect_nonempty(OP, "x", x)?;
    if x.shape().len() < 2 {
        return Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "x",
            expected: "[L, ...] (rank >= 2)".into(),
            found: x.shape().to_vec(),
        });
    }
    let layers = x.shape()[0];
    expect_shape(OP, "weights", weights, &[layers])?;
    expect_dtype(OP, "weights", weights, x.dtype())?;
    expect_shape(OP, "out", out, &x.shape()[1..])?;
    expect_dtype(OP, "out", out, x.dtype())?;
    let len = out.numel();
    let n = vector_width(client, len);
    let count = cube_count(OP, (len / n).div_ceil(BLOCK))?;
    // Unchecked launch: no per-access bounds checks in the shader.
    crate::dispatch_float!(x.dtype(), OP, F => {
        // SAFETY: shapes validated above; every index is guarded or clamped in the kernel.
        unsafe {
            layer_sum_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32), n,
                x.array_arg(), weights.array_arg(), out.array_arg(), layers, len / n,
            )
        }
    })?;
    finish(client, OP)
}

/// Plain-Rust oracle.
pub mod reference {
    /// `Σ_i softmax(w)_i · x[i]`, `x` is `w.len()` stacked slices of equal length.
    pub fn layer_sum(x: &[f32], w: &[f32]) -> Vec<f32> {
        let len = x.len() / w.len();
        let mx = w.iter().copied().fold(f32::MIN, f32::max);
        let total: f32 = w.iter().map(|v| (v - mx).exp()).sum();
        let mut out = vec![0f32; len];
        for (i, layer) in x.chunks(len).enumerate() {
            let p = (w[i] - mx).exp() / total;
            out.iter_mut().zip(layer).for_each(|(o, v)| *o += v * p);
        }
        out
    }
}
