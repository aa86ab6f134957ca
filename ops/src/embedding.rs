//! Embedding gather: `out[t, :] = table[ids[t], :]` for a `[vocab, d]` table
//! and u32 ids `[t]`. [`embedding`] validates the ids on the host (read
//! back, one sync): an out-of-range id is an [`OpsError::IndexOutOfRange`],
//! never a launch. [`embedding_clamped`] skips that read, for callers that
//! validated the ids before uploading them (a decode step must not wait on
//! the device mid-pass). The kernel clamps ids to the last row either way,
//! so memory stays safe whatever the ids hold.
//!
//! [`lookup_u32`] is the same gather over a one-wide u32 table: an id map
//! applied on the device (a reduced draft vocabulary's ids to the
//! target's, so a drafter's next pass reads them without a round trip),
//! ids clamped to the last entry alike.

use cubecl::prelude::*;

use crate::block::vector_width;
use crate::error::{OpsError, Result};
use crate::launch::{
    cube_count, expect_dtype, expect_float, expect_nonempty, expect_rank, expect_shape, finish,
};
use crate::tensor::{DType, DeviceTensor};

/// Units per cube.
pub const BLOCK: usize = 64;

/// One cube per token; units stride over the row's `dv` vectors.
#[cube(launch_unchecked)]
pub fn embedding_kernel<F: Float + CubeElement, N: Size>(
    table: &Array<Vector<F, N>>,
    ids: &Array<u32>,
    out: &mut Array<Vector<F, N>>,
    tokens: usize,
    vocab: usize,
    dv: usize,
) {
    let t = CUBE_POS;
    if t < tokens {
        let id = ids[t] as usize;
        let row = select(id < vocab, id, vocab - 1);
        let mut j = UNIT_POS as usize;
        while j < dv {
            out[t * dv + j] = table[row * dv + j];
            j += comptime!(BLOCK);
        }
    }
}

/// Gathers rows of `table` (`[vocab, d]`) by `ids` (u32, `[t]`) into `out`
/// (`[t, d]`), after reading the ids back to check them.
pub fn embedding<R: Runtime>(
    client: &ComputeClient<R>,
    table: &DeviceTensor<R>,
    ids: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    launch(client, table, ids, out, true)
}

/// [`embedding`] without reading the ids back: an id `>= vocab` gathers the
/// last row instead of failing. For ids the caller checked on the host.
pub fn embedding_clamped<R: Runtime>(
    client: &ComputeClient<R>,
    table: &DeviceTensor<R>,
    ids: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    launch(client, table, ids, out, false)
}

fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    table: &DeviceTensor<R>,
    ids: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
    check_ids: bool,
) -> Result<()> {
    const OP: &str = "embedding";
    expect_float(client, OP, "table", table)?;
    expect_nonempty(OP, "table", table)?;
    let s = expect_rank(OP, "table", table, 2, "[vocab, d]")?;
    let (vocab, d) = (s[0], s[1]);
    expect_dtype(OP, "ids", ids, DType::U32)?;
    expect_nonempty(OP, "ids", ids)?;
    expect_rank(OP, "ids", ids, 1, "[t]")?;
    let tokens = ids.numel();
    expect_shape(OP, "out", out, &[tokens, d])?;
    expect_dtype(OP, "out", out, table.dtype())?;
    if check_ids {
        let host_ids = ids.download_u32(client)?;
        if let Some((position, &id)) = host_ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab)
        {
            return Err(OpsError::IndexOutOfRange {
                op: OP,
                arg: "ids",
                position,
                index: id as u64,
                bound: vocab,
            });
        }
    }
    let n = vector_width(client, d);
    let count = cube_count(OP, tokens)?;
    // Unchecked launch: no per-access bounds checks in the shader.
    crate::dispatch_float!(table.dtype(), OP, F => {
        // SAFETY: shapes validated above; every index is guarded or clamped in the kernel.
        unsafe {
            embedding_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32), n,
                table.array_arg(), ids.array_arg(), out.array_arg(), tokens, vocab, d / n,
            )
        }
    })?;
    finish(client, OP)
}

/// Plain-Rust oracle.
/// One unit per id.
#[cube(launch_unchecked)]
pub fn lookup_kernel(
    table: &Array<u32>,
    ids: &Array<u32>,
    out: &mut Array<u32>,
    n: usize,
    len: usize,
) {
    let t = ABSOLUTE_POS;
    if t < n {
        let id = ids[t] as usize;
        out[t] = table[select(id < len, id, len - 1)];
    }
}

/// `out[t] = table[min(ids[t], len - 1)]`: `table` u32 `[len]` (`len >= 1`),
/// `ids` and `out` u32 of one size.
pub fn lookup_u32<R: Runtime>(
    client: &ComputeClient<R>,
    table: &DeviceTensor<R>,
    ids: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "lookup_u32";
    expect_dtype(OP, "table", table, DType::U32)?;
    expect_nonempty(OP, "table", table)?;
    expect_dtype(OP, "ids", ids, DType::U32)?;
    expect_dtype(OP, "out", out, DType::U32)?;
    let n = ids.numel();
    if out.numel() != n {
        return Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "out",
            expected: format!("{n} elements"),
            found: out.shape().to_vec(),
        });
    }
    if n == 0 {
        return Ok(());
    }
    let count = cube_count(OP, n.div_ceil(BLOCK))?;
    // SAFETY: a unit works only for `t < n` (the size of `ids` and `out`)
    // and reads `table` at an index clamped below `len`, its size (>= 1).
    unsafe {
        lookup_kernel::launch_unchecked::<R>(
            client,
            count,
            CubeDim::new_1d(BLOCK as u32),
            table.array_arg(),
            ids.array_arg(),
            out.array_arg(),
            n,
            table.numel(),
        )
    };
    finish(client, OP)
}

pub mod reference {
    /// `table[min(id, len - 1)]` for every id.
    pub fn lookup(table: &[u32], ids: &[u32]) -> Vec<u32> {
        ids.iter()
            .map(|&i| table[(i as usize).min(table.len() - 1)])
            .collect()
    }

    /// Rows of `table` (`[vocab, d]`) picked by `ids`.
    pub fn embedding(table: &[f32], d: usize, ids: &[u32]) -> Vec<f32> {
        ids.iter()
            .flat_map(|&i| table[i as usize * d..(i as usize + 1) * d].iter().copied())
            .collect()
    }
}
