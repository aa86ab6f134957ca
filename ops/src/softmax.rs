//! Row softmax with temperature: `out[r, :] = softmax(x[r, :] / T)`, max
//! subtracted first, statistics in f32. One cube per row; units stride over
//! the row with `Vector<F, N>` loads and reduce through shared memory.

use cubecl::prelude::*;

use crate::block::{cube_max, cube_sum, vector_width};
use crate::error::{OpsError, Result};
use crate::launch::{cube_count, expect_dtype, expect_float_rows, expect_shape, finish};
use crate::tensor::DeviceTensor;

/// Units per cube.
pub const BLOCK: usize = 128;

#[cube(launch_unchecked)]
pub fn softmax_kernel<F: Float + CubeElement, N: Size>(
    x: &Array<Vector<F, N>>,
    out: &mut Array<Vector<F, N>>,
    rows: usize,
    nv: usize,
    inv_t: f32,
    #[comptime] block: usize,
) {
    let mut smem = SharedMemory::<f32>::new(block);
    let valid = CUBE_POS < rows;
    let base = select(valid, CUBE_POS, 0usize) * nv;
    let tid = UNIT_POS as usize;
    let scale = Vector::<f32, N>::new(inv_t);

    let mut m = comptime!(-f32::MAX).runtime(); // lowest finite f32
    let mut j = tid;
    while j < nv {
        let v = Vector::<f32, N>::cast_from(x[base + j]) * scale;
        #[unroll]
        for l in 0..N::value() {
            m = f32::max(m, v[l]);
        }
        j += block;
    }
    let mx = cube_max(&mut smem, m, block);
    let mut s = 0f32;
    let mut j = tid;
    while j < nv {
        let e = Vector::exp(Vector::<f32, N>::cast_from(x[base + j]) * scale - Vector::new(mx));
        #[unroll]
        for l in 0..N::value() {
            s += e[l];
        }
        j += block;
    }
    let inv_total = 1f32 / cube_sum(&mut smem, s, block);
    if valid {
        let mut j = tid;
        while j < nv {
            let e = Vector::exp(Vector::<f32, N>::cast_from(x[base + j]) * scale - Vector::new(mx));
            out[base + j] = Vector::<F, N>::cast_from(e * Vector::new(inv_total));
            j += block;
        }
    }
}

/// Softmax over the last dim of `x` (`[..., n]`) at `temperature` (> 0)
/// into `out` (same shape and dtype; may be `x`).
pub fn softmax<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    temperature: f32,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "softmax";
    let (rows, n) = expect_float_rows(client, OP, "x", x)?;
    if !(temperature > 0.0 && temperature.is_finite()) {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!("temperature must be finite and > 0, got {temperature}"),
        });
    }
    expect_shape(OP, "out", out, x.shape())?;
    expect_dtype(OP, "out", out, x.dtype())?;
    let w = vector_width(client, n);
    let count = cube_count(OP, rows)?;
    // Unchecked launch: no per-access bounds checks in the shader.
    crate::dispatch_float!(x.dtype(), OP, F => {
        // SAFETY: shapes validated above; every index is guarded or clamped in the kernel.
        unsafe {
            softmax_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32), w,
                x.array_arg(), out.array_arg(), rows, n / w, 1.0 / temperature, BLOCK,
            )
        }
    })?;
    finish(client, OP)
}

/// Plain-Rust oracle.
pub mod reference {
    /// Softmax of each `n`-long row of `x` at temperature `t`.
    pub fn softmax(x: &[f32], n: usize, t: f32) -> Vec<f32> {
        let mut out = Vec::with_capacity(x.len());
        for row in x.chunks(n) {
            let it = 1.0 / t;
            let mx = row.iter().map(|v| v * it).fold(f32::MIN, f32::max);
            let e: Vec<f32> = row.iter().map(|v| (v * it - mx).exp()).collect();
            // f64 sum: a sequential f32 sum over a 49k vocabulary is itself
            // off by ~1e-5, more than the kernel's tree reduction.
            let s = e.iter().map(|&v| v as f64).sum::<f64>();
            out.extend(e.iter().map(|&v| (v as f64 / s) as f32));
        }
        out
    }
}
