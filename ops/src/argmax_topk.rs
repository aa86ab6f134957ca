//! Row argmax and top-k.
//!
//! Order: larger value first; **ties go to the lower index**. Argmax returns
//! the lowest index among the maxima; top-k returns the `k` first elements
//! of the row in that order (values descending, equal values by ascending
//! index). Rows must not contain NaN (its order is unspecified).
//!
//! One cube per row. Top-k runs `k` selection rounds, each a full pass that
//! finds the best element strictly *after* the previous pick in the order
//! above, so no exclusion list is needed; meant for small `k` (sampling
//! candidates, draft-tree branching), cost `O(k · n)` per row.

use cubecl::prelude::*;

use crate::error::{OpsError, Result};
use crate::launch::{
    cube_count, expect_dtype, expect_float_rows, expect_row_u32, expect_shape, finish,
};
use crate::tensor::{DType, DeviceTensor};

/// Units per cube.
pub const BLOCK: usize = 128;

/// Whether `(v, i)` comes before `(bv, bi)`: larger value, ties to lower index.
#[cube]
pub fn before(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    v > bv || (v == bv && i < bi)
}

/// Finds the first element of `x[base..base+n]` (in the order of
/// [`before`]) that comes strictly after `(pv, pi)` (or the first of all
/// when `!has_prev`). Result in `sv[0]`, `si[0]` (index `u32::MAX` if none);
/// callers read it and `sync_cube()` before the next call.
#[cube]
pub fn cube_best_after<F: Float>(
    x: &Array<F>,
    base: usize,
    n: usize,
    pv: f32,
    pi: u32,
    has_prev: bool,
    sv: &mut SharedMemory<f32>,
    si: &mut SharedMemory<u32>,
    #[comptime] block: usize,
) {
    let tid = UNIT_POS as usize;
    let mut bv = comptime!(-f32::MAX).runtime(); // lowest finite f32
    let mut bi = 0xffff_ffffu32;
    let mut j = tid;
    while j < n {
        let v = f32::cast_from(x[base + j]);
        let ju = j as u32;
        let allowed = !has_prev || before(pv, pi, v, ju);
        if allowed && before(v, ju, bv, bi) {
            bv = v;
            bi = ju;
        }
        j += block;
    }
    sv[tid] = bv;
    si[tid] = bi;
    sync_cube();
    let mut stride = comptime!(block / 2).runtime();
    while stride > 0 {
        // CubeCL evaluates both sides of `&&`: the partner's slot is read
        // only inside the branch (reading `sv[tid + stride]` for every unit
        // ran past the shared memory, an illegal address on CUDA).
        if tid < stride {
            let ov = sv[tid + stride];
            let oi = si[tid + stride];
            if before(ov, oi, sv[tid], si[tid]) {
                sv[tid] = ov;
                si[tid] = oi;
            }
        }
        sync_cube();
        stride /= 2;
    }
}

/// Top-`k` of each row: values (if `write_values`) and indices, best first.
#[cube(launch_unchecked)]
pub fn topk_kernel<F: Float + CubeElement>(
    x: &Array<F>,
    values: &mut Array<F>,
    indices: &mut Array<u32>,
    rows: usize,
    n: usize,
    k: usize,
    #[comptime] write_values: bool,
    #[comptime] block: usize,
) {
    let mut sv = SharedMemory::<f32>::new(block);
    let mut si = SharedMemory::<u32>::new(block);
    let valid = CUBE_POS < rows;
    let row = select(valid, CUBE_POS, 0usize);
    let mut pv = 0f32;
    let mut pi = 0u32;
    for r in 0..k {
        cube_best_after::<F>(x, row * n, n, pv, pi, r > 0, &mut sv, &mut si, block);
        pv = sv[0];
        pi = si[0];
        if valid && UNIT_POS == 0 {
            indices[row * k + r] = pi;
            if write_values {
                values[row * k + r] = F::cast_from(pv);
            }
        }
        sync_cube();
    }
}

/// Index of the maximum of each row of `x` (`[..., n]`) into `out` (u32,
/// `x`'s shape without the last dim, or `[rows]`). Ties → lowest index.
pub fn argmax<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "argmax";
    let (rows, n) = expect_float_rows(client, OP, "x", x)?;
    expect_row_u32(OP, "out", out, rows)?;
    let count = cube_count(OP, rows)?;
    crate::dispatch_float!(x.dtype(), OP, F => {
        // SAFETY: as in `topk` below. `values` is never written (`write_values`
        // is false), so `x` stands in for it.
        unsafe {
            topk_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32),
                x.array_arg(), x.array_arg(), out.array_arg(), rows, n, 1, false, BLOCK,
            )
        }
    })?;
    finish(client, OP)
}

/// The `k` largest entries of each row of `x` (`[rows, n]` or `[..., n]`):
/// `values` (`[rows, k]`, `x`'s dtype) and `indices` (`[rows, k]`, u32),
/// sorted descending, ties by ascending index. `1 <= k <= n`.
pub fn topk<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    k: usize,
    values: &DeviceTensor<R>,
    indices: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "topk";
    let (rows, n) = expect_float_rows(client, OP, "x", x)?;
    if k == 0 || k > n {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!("k must be in 1..={n}, got {k}"),
        });
    }
    expect_shape(OP, "values", values, &[rows, k])?;
    expect_dtype(OP, "values", values, x.dtype())?;
    expect_shape(OP, "indices", indices, &[rows, k])?;
    expect_dtype(OP, "indices", indices, DType::U32)?;
    let count = cube_count(OP, rows)?;
    crate::dispatch_float!(x.dtype(), OP, F => {
        // SAFETY: shapes validated above. The kernel reads `x[row·n + j]`
        // with `j < n` and `row` clamped to 0 on cubes past the last row, and
        // writes `[row·k + r]`, `r < k`, only for real rows; shared memory is
        // indexed by unit (< BLOCK) and by strides below BLOCK/2.
        unsafe {
            topk_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32),
                x.array_arg(), values.array_arg(), indices.array_arg(), rows, n, k, true, BLOCK,
            )
        }
    })?;
    finish(client, OP)
}

/// Plain-Rust oracle.
pub mod reference {
    /// Argmax of each `n`-long row; ties → lowest index.
    pub fn argmax(x: &[f32], n: usize) -> Vec<u32> {
        x.chunks(n)
            .map(|row| {
                let mut best = 0;
                for (i, &v) in row.iter().enumerate() {
                    if v > row[best] {
                        best = i;
                    }
                }
                best as u32
            })
            .collect()
    }

    /// Top-k of each `n`-long row: (values, indices), descending, ties by index.
    pub fn topk(x: &[f32], n: usize, k: usize) -> (Vec<f32>, Vec<u32>) {
        let (mut vals, mut idx) = (Vec::new(), Vec::new());
        for row in x.chunks(n) {
            let mut order: Vec<usize> = (0..n).collect();
            // Stable sort keeps ascending index among equal values.
            order.sort_by(|&a, &b| {
                row[b]
                    .partial_cmp(&row[a])
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
            for &i in &order[..k] {
                vals.push(row[i]);
                idx.push(i as u32);
            }
        }
        (vals, idx)
    }
}
