//! Embedding gather: `out[t, :] = table[ids[t], :]` for a `[vocab, d]` table
//! and u32 ids `[t]`. [`embedding`] validates the ids on the host (read
//! back, one sync): an out-of-range id is an [`OpsError::IndexOutOfRange`],
//! never a launch. [`embedding_clamped`] skips that read, for callers that
//! validated the ids before uploading them (a decode step must not wait on
//! the device mid-pass). The kernel clamps ids to the last row either way,
//! so memory stays safe whatever the ids hold.
//!
//! [`embedding_scaled`] and [`embedding_clamped_scaled`] multiply the
//! gathered row by a runtime `scale` (Gemma 3's `embed(ids) * sqrt(hidden)`):
//! `out = F(f32(table[id, :]) * scale)`, the product in f32 and rounded once
//! to the storage type at the store. A kernel of its own
//! ([`embedding_scaled_kernel`]), so the plain gather's source stays as it
//! was. transformers multiplies by `embed_scale.to(dtype)`: for its f16
//! results pass the scale rounded to f16 (the f16 × f16 product is exact in
//! f32, so the one rounding then matches torch's).
//!
//! **Tables over one binding.** A storage binding holds at most
//! [`MAX_BINDING_BYTES`] (lavapipe's `maxStorageBufferRange`, 128 MiB);
//! Gemma 3 270M's table is 640 MiB in f32. A larger table (one allocation)
//! is bound in chunks of whole rows `[r0, r0 + rows)` through handle
//! offsets, as `linear` binds its weight: one launch of
//! [`embedding_rows_kernel`] per chunk, each writing only the output rows
//! whose (clamped) id falls in its chunk, from chunk row `id - r0`. Every
//! chunk but the last holds a multiple of the rows that keep its byte
//! offset a multiple of [`PACK_ALIGN`] (256, wgpu's storage offset
//! alignment, which `linear`'s 256-row chunks also meet) and at most the
//! limit's bytes. Tables within the limit take the single launch above,
//! unchanged. [`embedding_with_binding_limit`] takes the limit as an
//! argument (tests split small tables with it).
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
    MAX_BINDING_BYTES,
};
use crate::tensor::{DType, DeviceTensor, PACK_ALIGN};

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

/// [`embedding_kernel`] times `scale`: every vector widened to f32,
/// multiplied, and cast back to `F` at the store.
#[cube(launch_unchecked)]
pub fn embedding_scaled_kernel<F: Float + CubeElement, N: Size>(
    table: &Array<Vector<F, N>>,
    ids: &Array<u32>,
    out: &mut Array<Vector<F, N>>,
    tokens: usize,
    vocab: usize,
    dv: usize,
    scale: f32,
) {
    let t = CUBE_POS;
    if t < tokens {
        let id = ids[t] as usize;
        let row = select(id < vocab, id, vocab - 1);
        let s = Vector::<f32, N>::new(scale);
        let mut j = UNIT_POS as usize;
        while j < dv {
            let x = Vector::<f32, N>::cast_from(table[row * dv + j]);
            out[t * dv + j] = Vector::<F, N>::cast_from(x * s);
            j += comptime!(BLOCK);
        }
    }
}

/// The gather from a table bound in chunks: `table` holds rows `[row0,
/// row0 + rows)` of a `[vocab, d]` table, and a cube writes output row `t`
/// only when its id (clamped to `vocab - 1`) falls in that range. With
/// `scaled` the row is multiplied by `scale` in f32 as in
/// [`embedding_scaled_kernel`]; without, copied unchanged (`scale` unread).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn embedding_rows_kernel<F: Float + CubeElement, N: Size>(
    table: &Array<Vector<F, N>>,
    ids: &Array<u32>,
    out: &mut Array<Vector<F, N>>,
    tokens: usize,
    vocab: usize,
    row0: usize,
    rows: usize,
    dv: usize,
    scale: f32,
    #[comptime] scaled: bool,
) {
    let t = CUBE_POS;
    if t < tokens {
        let id = ids[t] as usize;
        let row = select(id < vocab, id, vocab - 1);
        // Nested, not `&&`: `row - row0` only once `row >= row0`.
        if row >= row0 {
            let local = row - row0;
            if local < rows {
                let mut j = UNIT_POS as usize;
                if scaled {
                    let s = Vector::<f32, N>::new(scale);
                    while j < dv {
                        let x = Vector::<f32, N>::cast_from(table[local * dv + j]);
                        out[t * dv + j] = Vector::<F, N>::cast_from(x * s);
                        j += comptime!(BLOCK);
                    }
                } else {
                    while j < dv {
                        out[t * dv + j] = table[local * dv + j];
                        j += comptime!(BLOCK);
                    }
                }
            }
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
    embedding_with_binding_limit(client, table, ids, None, true, out, MAX_BINDING_BYTES)
}

/// [`embedding`] without reading the ids back: an id `>= vocab` gathers the
/// last row instead of failing. For ids the caller checked on the host.
pub fn embedding_clamped<R: Runtime>(
    client: &ComputeClient<R>,
    table: &DeviceTensor<R>,
    ids: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    embedding_with_binding_limit(client, table, ids, None, false, out, MAX_BINDING_BYTES)
}

/// [`embedding`] times `scale` (finite): `out[t, :] = table[ids[t], :] *
/// scale`, after reading the ids back to check them.
pub fn embedding_scaled<R: Runtime>(
    client: &ComputeClient<R>,
    table: &DeviceTensor<R>,
    ids: &DeviceTensor<R>,
    scale: f32,
    out: &DeviceTensor<R>,
) -> Result<()> {
    embedding_with_binding_limit(
        client,
        table,
        ids,
        Some(scale),
        true,
        out,
        MAX_BINDING_BYTES,
    )
}

/// [`embedding_clamped`] times `scale` (finite): no read-back, an id `>=
/// vocab` gathers the last row.
pub fn embedding_clamped_scaled<R: Runtime>(
    client: &ComputeClient<R>,
    table: &DeviceTensor<R>,
    ids: &DeviceTensor<R>,
    scale: f32,
    out: &DeviceTensor<R>,
) -> Result<()> {
    embedding_with_binding_limit(
        client,
        table,
        ids,
        Some(scale),
        false,
        out,
        MAX_BINDING_BYTES,
    )
}

/// Most rows of `row_bytes` one binding of `max_binding_bytes` holds, a
/// multiple of the rows whose bytes are a multiple of [`PACK_ALIGN`] (so
/// every chunk's byte offset is aligned); 0 when not even that many fit.
pub fn rows_per_binding(row_bytes: usize, max_binding_bytes: usize) -> usize {
    let align = PACK_ALIGN / gcd(PACK_ALIGN, row_bytes);
    (max_binding_bytes / row_bytes) / align * align
}

fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Rows `r0..r0+rows` of a `[vocab, d]` table as a tensor over a sub-range
/// of the same allocation (no copy).
fn table_rows<R: Runtime>(
    table: &DeviceTensor<R>,
    r0: usize,
    rows: usize,
    row_bytes: usize,
) -> Result<DeviceTensor<R>> {
    let total = table.handle.size_in_used();
    let start = (r0 * row_bytes) as u64;
    let end = start + (rows * row_bytes) as u64;
    let handle = table
        .handle
        .clone()
        .offset_start(start)
        .offset_end(total - end);
    DeviceTensor::from_handle(handle, &[rows, table.shape()[1]], table.dtype())
}

/// The four gathers with an explicit per-binding byte limit for the table
/// (tests use a small one to exercise the split): `scale` `None` is the
/// plain gather, `check_ids` reads the ids back ([`embedding`],
/// [`embedding_scaled`]) or clamps them ([`embedding_clamped`],
/// [`embedding_clamped_scaled`]). The public gathers pass
/// [`MAX_BINDING_BYTES`].
#[doc(hidden)]
pub fn embedding_with_binding_limit<R: Runtime>(
    client: &ComputeClient<R>,
    table: &DeviceTensor<R>,
    ids: &DeviceTensor<R>,
    scale: Option<f32>,
    check_ids: bool,
    out: &DeviceTensor<R>,
    max_binding_bytes: usize,
) -> Result<()> {
    let op = if scale.is_some() {
        "embedding_scaled"
    } else {
        "embedding"
    };
    expect_float(client, op, "table", table)?;
    expect_nonempty(op, "table", table)?;
    let s = expect_rank(op, "table", table, 2, "[vocab, d]")?;
    let (vocab, d) = (s[0], s[1]);
    expect_dtype(op, "ids", ids, DType::U32)?;
    expect_nonempty(op, "ids", ids)?;
    expect_rank(op, "ids", ids, 1, "[t]")?;
    let tokens = ids.numel();
    expect_shape(op, "out", out, &[tokens, d])?;
    expect_dtype(op, "out", out, table.dtype())?;
    if let Some(scale) = scale {
        if !scale.is_finite() {
            return Err(OpsError::InvalidArgument {
                op,
                reason: format!("scale must be finite, got {scale}"),
            });
        }
    }
    if check_ids {
        let host_ids = ids.download_u32(client)?;
        if let Some((position, &id)) = host_ids
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab)
        {
            return Err(OpsError::IndexOutOfRange {
                op,
                arg: "ids",
                position,
                index: id as u64,
                bound: vocab,
            });
        }
    }
    let n = vector_width(client, d);
    let count = cube_count(op, tokens)?;
    // Unchecked launch: no per-access bounds checks in the shader.
    let dim = CubeDim::new_1d(BLOCK as u32);
    let row_bytes = d * table.dtype().size();
    if vocab * row_bytes > max_binding_bytes {
        let max_rows = rows_per_binding(row_bytes, max_binding_bytes);
        if max_rows == 0 {
            return Err(OpsError::InvalidArgument {
                op,
                reason: format!(
                    "d = {d} is too wide: {} table rows exceed one binding",
                    PACK_ALIGN / gcd(PACK_ALIGN, row_bytes)
                ),
            });
        }
        let mut r0 = 0;
        while r0 < vocab {
            let rows = (vocab - r0).min(max_rows);
            let chunk = table_rows(table, r0, rows, row_bytes)?;
            crate::dispatch_float!(table.dtype(), op, F => {
                // SAFETY: shapes validated above; a cube works only for `t <
                // tokens` and reads chunk row `id - r0` only when the
                // clamped id is in `[r0, r0 + rows)`, the rows `chunk` holds;
                // its units index `j < d / n` within that row.
                unsafe {
                    embedding_rows_kernel::launch_unchecked::<F, R>(
                        client, count.clone(), dim, n,
                        chunk.array_arg(), ids.array_arg(), out.array_arg(), tokens, vocab,
                        r0, rows, d / n, scale.unwrap_or(1.0), scale.is_some(),
                    )
                }
            })?;
            r0 += rows;
        }
        return finish(client, op);
    }
    crate::dispatch_float!(table.dtype(), op, F => {
        // SAFETY: shapes validated above; a cube works only for `t <
        // tokens`, reads its row at an id clamped below `vocab` (>= 1), and
        // its units index `j < d / n` within that row.
        unsafe {
            match scale {
                None => embedding_kernel::launch_unchecked::<F, R>(
                    client, count, dim, n,
                    table.array_arg(), ids.array_arg(), out.array_arg(), tokens, vocab, d / n,
                ),
                Some(scale) => embedding_scaled_kernel::launch_unchecked::<F, R>(
                    client, count, dim, n,
                    table.array_arg(), ids.array_arg(), out.array_arg(), tokens, vocab, d / n,
                    scale,
                ),
            }
        }
    })?;
    finish(client, op)
}

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

/// Plain-Rust oracles.
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

    /// [`embedding`] times `scale`, in f32.
    pub fn embedding_scaled(table: &[f32], d: usize, ids: &[u32], scale: f32) -> Vec<f32> {
        embedding(table, d, ids)
            .into_iter()
            .map(|x| x * scale)
            .collect()
    }
}
