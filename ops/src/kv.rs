//! KV-cache ops: **append** (write new K/V rows at given slots) and
//! **compaction** (move the accepted tree nodes' K/V rows into contiguous
//! slots after the committed prefix; docs/speculative.md, "The round": commit).
//!
//! A cache is `[layers, slots, width]` (or `[slots, width]` = one layer),
//! `width = kv_heads · head_dim`, row-major; new rows are `[layers, n, width]`
//! (or `[n, width]`). Both ops are the one row-copy kernel
//! `dst[l, dst_idx[i]] = src[l, src_idx[i]]`, vectorised over the row.
//!
//! Compaction reads and writes the same cache, and a source slot may be the
//! destination of another row (accepted slots `[P+1, P+3]` → `[P, P+1]`:
//! row 1 writes slot `P+1` while row 0 reads it). Parallel rows give no
//! ordering, so compaction always **gathers into a temporary** first and then
//! writes the contiguous destination range: two launches, correct for any
//! overlap. Destination slots must be distinct (append and compaction).

use cubecl::prelude::*;

use crate::error::{OpsError, Result};
use crate::launch::{cube_count, expect_bindable, expect_dtype, expect_float, finish};
use crate::tensor::DeviceTensor;

const CUBE_UNITS: u32 = 256;

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy_rows<F: Float + CubeElement, N: Size>(
    src: &Array<Vector<F, N>>,
    src_idx: &Array<u32>,
    dst: &mut Array<Vector<F, N>>,
    dst_idx: &Array<u32>,
    rows: u32,
    layers: u32,
    src_rows_per_layer: u32,
    dst_rows_per_layer: u32,
    width_v: u32,
) {
    let idx = ABSOLUTE_POS;
    if idx < (layers * rows * width_v) as usize {
        let i = idx as u32;
        let j = i % width_v;
        let r = (i / width_v) % rows;
        let l = i / (width_v * rows);
        let s = (l * src_rows_per_layer + src_idx[r as usize]) * width_v + j;
        let d = (l * dst_rows_per_layer + dst_idx[r as usize]) * width_v + j;
        dst[d as usize] = src[s as usize];
    }
}

/// `(layers, rows, width)` of a rank-2 or rank-3 tensor.
fn dims3<R: Runtime>(
    op: &'static str,
    arg: &'static str,
    t: &DeviceTensor<R>,
) -> Result<(usize, usize, usize)> {
    match *t.shape() {
        [r, w] => Ok((1, r, w)),
        [l, r, w] => Ok((l, r, w)),
        _ => Err(OpsError::ShapeMismatch {
            op,
            arg,
            expected: "[slots, width] or [layers, slots, width]".into(),
            found: t.shape().to_vec(),
        }),
    }
}

/// Checks every index is `< bound` and (for destinations) distinct.
pub(crate) fn check_indices(
    op: &'static str,
    arg: &'static str,
    idx: &[u32],
    bound: usize,
    distinct: bool,
) -> Result<()> {
    for (position, &i) in idx.iter().enumerate() {
        if i as usize >= bound {
            return Err(OpsError::IndexOutOfRange {
                op,
                arg,
                position,
                index: i as u64,
                bound,
            });
        }
    }
    if distinct {
        // O(n log n) in the indices, not O(bound): a decode step's append
        // checks one row, not the whole cache.
        let mut sorted = idx.to_vec();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(OpsError::InvalidArgument {
                op,
                reason: format!("`{arg}` repeats slot {}", w[0]),
            });
        }
    }
    Ok(())
}

/// Checks that `slots` holds `n` distinct rows below `rows` (where a
/// launch writes its `n` new cache rows) and that both cache halves fit one
/// binding.
pub(crate) fn expect_slots<R: Runtime>(
    op: &'static str,
    slots: &RowIndex<R>,
    n: usize,
    rows: usize,
    halves: [&DeviceTensor<R>; 2],
) -> Result<()> {
    if slots.as_slice().len() != n {
        return Err(OpsError::ShapeMismatch {
            op,
            arg: "slots",
            expected: format!("[{n}]"),
            found: vec![slots.as_slice().len()],
        });
    }
    check_indices(op, "slots", slots.as_slice(), rows, true)?;
    for (arg, t) in ["k_cache", "v_cache"].into_iter().zip(halves) {
        crate::launch::expect_bindable(op, arg, t)?;
    }
    Ok(())
}

/// A list of row indices on the device, with its host copy (launches
/// validate against it): uploaded once, then shared by every copy that
/// uses the same rows (the K and V appends of every layer of a pass).
pub struct RowIndex<R: Runtime> {
    host: Vec<u32>,
    /// `None` for an empty list (nothing to upload; no launch reads it).
    dev: Option<DeviceTensor<R>>,
}

impl<R: Runtime> RowIndex<R> {
    /// Uploads `idx`.
    pub fn upload(client: &ComputeClient<R>, idx: &[u32]) -> Result<Self> {
        let dev = if idx.is_empty() {
            None
        } else {
            Some(DeviceTensor::upload_u32(client, idx, &[idx.len()])?)
        };
        Ok(RowIndex {
            host: idx.to_vec(),
            dev,
        })
    }

    /// Uploads two lists (a copy's source and destination rows) in one
    /// upload.
    pub fn upload_pair(client: &ComputeClient<R>, a: &[u32], b: &[u32]) -> Result<(Self, Self)> {
        if a.is_empty() || b.is_empty() {
            return Ok((Self::upload(client, a)?, Self::upload(client, b)?));
        }
        let mut t = DeviceTensor::upload_u32_packed(client, &[(a, &[a.len()]), (b, &[b.len()])])?
            .into_iter();
        match (t.next(), t.next()) {
            (Some(da), Some(db)) => Ok((Self::on_device(a, da)?, Self::on_device(b, db)?)),
            _ => Err(crate::OpsError::Device {
                op: "row_index",
                message: "a packed upload returned too few tensors".into(),
            }),
        }
    }

    /// `idx` already on the device as `dev` (a part of a packed upload,
    /// [`DeviceTensor::upload_u32_packed`]); `dev` must hold `idx`.
    pub fn on_device(idx: &[u32], dev: DeviceTensor<R>) -> Result<Self> {
        if dev.dtype() != crate::DType::U32 || dev.numel() != idx.len() {
            return Err(crate::OpsError::ShapeMismatch {
                op: "row_index",
                arg: "dev",
                expected: format!("[{}] u32", idx.len()),
                found: dev.shape().to_vec(),
            });
        }
        Ok(RowIndex {
            host: idx.to_vec(),
            dev: (!idx.is_empty()).then_some(dev),
        })
    }

    /// The indices.
    pub fn as_slice(&self) -> &[u32] {
        &self.host
    }

    /// The device copy (`None` for an empty list).
    pub(crate) fn device(&self) -> Option<&DeviceTensor<R>> {
        self.dev.as_ref()
    }
}

/// Launches `dst[l, dst_idx[i]] = src[l, src_idx[i]]` after validation.
fn launch_copy<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    src: &DeviceTensor<R>,
    src_idx: &[u32],
    dst: &DeviceTensor<R>,
    dst_idx: &[u32],
) -> Result<()> {
    let (si, di) = RowIndex::upload_pair(client, src_idx, dst_idx)?;
    launch_copy_indexed(client, op, src, &si, dst, &di)
}

/// [`launch_copy`] with indices already on the device.
fn launch_copy_indexed<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    src: &DeviceTensor<R>,
    src_index: &RowIndex<R>,
    dst: &DeviceTensor<R>,
    dst_index: &RowIndex<R>,
) -> Result<()> {
    let (src_idx, dst_idx) = (src_index.as_slice(), dst_index.as_slice());
    let (ls, rs, ws) = dims3(op, "src", src)?;
    let (ld, rd, wd) = dims3(op, "dst", dst)?;
    expect_float(client, op, "src", src)?;
    expect_dtype(op, "dst", dst, src.dtype())?;
    if ls != ld || ws != wd || src.shape().len() != dst.shape().len() {
        return Err(OpsError::ShapeMismatch {
            op,
            arg: "dst",
            expected: format!("[{ld}, _, {ws}] (layers and width of the source)"),
            found: dst.shape().to_vec(),
        });
    }
    if src_idx.len() != dst_idx.len() {
        return Err(OpsError::ShapeMismatch {
            op,
            arg: "slots",
            expected: format!("[{}]", src_idx.len()),
            found: vec![dst_idx.len()],
        });
    }
    check_indices(op, "src slots", src_idx, rs, false)?;
    check_indices(op, "dst slots", dst_idx, rd, true)?;
    expect_bindable(op, "src", src)?;
    expect_bindable(op, "dst", dst)?;
    let n = src_idx.len();
    if n == 0 || ws == 0 || ls == 0 {
        return Ok(());
    }
    let vec = crate::block::widest_vector(ws, 4);
    let units = ls * n * (ws / vec);
    let count = cube_count(op, units.div_ceil(CUBE_UNITS as usize))?;
    let (Some(si), Some(di)) = (src_index.device(), dst_index.device()) else {
        return Ok(()); // n > 0 here, so both lists were uploaded
    };
    crate::dispatch_float!(src.dtype(), op, F => {
        // SAFETY: every index was checked against its tensor's slot count,
        // layers and widths match, and the kernel guards `idx < units`.
        unsafe {
            copy_rows::launch_unchecked::<F, R>(client, count, CubeDim::new_1d(CUBE_UNITS), vec,
                src.array_arg(), si.array_arg(), dst.array_arg(), di.array_arg(),
                n as u32, ls as u32, rs as u32, rd as u32, (ws / vec) as u32)
        }
    })?;
    finish(client, op)
}

/// Writes the rows of `new` (`[n, width]` or `[layers, n, width]`) into
/// `cache` at `slots[i]` (distinct, `< slots`).
pub fn append_rows<R: Runtime>(
    client: &ComputeClient<R>,
    new: &DeviceTensor<R>,
    slots: &[u32],
    cache: &DeviceTensor<R>,
) -> Result<()> {
    let (_, n, _) = dims3("kv_append", "new", new)?;
    let identity: Vec<u32> = (0..n as u32).collect();
    launch_copy(client, "kv_append", new, &identity, cache, slots)
}

/// [`append_rows`] with the row lists on the device: `rows` must be
/// `0..n` for the `n` rows of `new` (its identity list), `slots` the
/// destination slots. Several appends of one pass share both lists.
pub fn append_rows_indexed<R: Runtime>(
    client: &ComputeClient<R>,
    new: &DeviceTensor<R>,
    rows: &RowIndex<R>,
    slots: &RowIndex<R>,
    cache: &DeviceTensor<R>,
) -> Result<()> {
    launch_copy_indexed(client, "kv_append", new, rows, cache, slots)
}

/// General row gather/scatter: `dst[dst_rows[i]] = src[src_rows[i]]` for
/// `[rows, width]` tensors of equal width and dtype (destinations distinct).
/// The executor uses it for block copies (stack, concat, split, broadcast).
pub fn gather_rows<R: Runtime>(
    client: &ComputeClient<R>,
    src: &DeviceTensor<R>,
    src_rows: &[u32],
    dst: &DeviceTensor<R>,
    dst_rows: &[u32],
) -> Result<()> {
    launch_copy(client, "gather_rows", src, src_rows, dst, dst_rows)
}

/// Appends new K and V rows at `slots` (see [`append_rows`]).
pub fn kv_append<R: Runtime>(
    client: &ComputeClient<R>,
    k_new: &DeviceTensor<R>,
    v_new: &DeviceTensor<R>,
    slots: &[u32],
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
) -> Result<()> {
    append_rows(client, k_new, slots, k_cache)?;
    append_rows(client, v_new, slots, v_cache)
}

/// Moves rows `src_slots[i]` of `cache` to `dst_start + i`, for every layer,
/// correct for any overlap between sources and destinations.
pub fn compact_rows<R: Runtime>(
    client: &ComputeClient<R>,
    src_slots: &[u32],
    dst_start: usize,
    cache: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "kv_compact";
    let (_, slots, _) = dims3(OP, "cache", cache)?;
    let m = src_slots.len();
    if dst_start + m > slots {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!(
                "destination {dst_start}..{} exceeds the cache's {slots} slots",
                dst_start + m
            ),
        });
    }
    let dst: Vec<u32> = (dst_start as u32..(dst_start + m) as u32).collect();
    move_rows(client, src_slots, &dst, cache)
}

/// Moves rows `src_slots[i]` of `cache` to `dst_slots[i]` (distinct), for
/// every layer, correct for any overlap between sources and destinations:
/// compaction of several sequences' accepted paths in one gather and one
/// scatter.
pub fn move_rows<R: Runtime>(
    client: &ComputeClient<R>,
    src_slots: &[u32],
    dst_slots: &[u32],
    cache: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "kv_compact";
    let (layers, _, width) = dims3(OP, "cache", cache)?;
    let m = src_slots.len();
    if dst_slots.len() != m {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!("{m} source slots for {} destinations", dst_slots.len()),
        });
    }
    if m == 0 {
        return Ok(());
    }
    let shape: Vec<usize> = if cache.shape().len() == 3 {
        vec![layers, m, width]
    } else {
        vec![m, width]
    };
    let temp = DeviceTensor::<R>::empty(client, &shape, cache.dtype());
    let identity: Vec<u32> = (0..m as u32).collect();
    launch_copy(client, OP, cache, src_slots, &temp, &identity)?;
    launch_copy(client, OP, &temp, &identity, cache, dst_slots)
}

/// Compacts both caches (see [`compact_rows`]).
pub fn kv_compact<R: Runtime>(
    client: &ComputeClient<R>,
    src_slots: &[u32],
    dst_start: usize,
    k_cache: &DeviceTensor<R>,
    v_cache: &DeviceTensor<R>,
) -> Result<()> {
    compact_rows(client, src_slots, dst_start, k_cache)?;
    compact_rows(client, src_slots, dst_start, v_cache)
}

/// Plain-Rust oracles on `[layers · slots, width]` row-major data.
pub mod reference {
    /// `cache[l, slots[i]] = new[l, i]`.
    pub fn append(
        cache: &mut [f32],
        slots_per_layer: usize,
        width: usize,
        new: &[f32],
        slots: &[u32],
    ) {
        let n = slots.len();
        for l in 0..cache.len() / (slots_per_layer * width).max(1) {
            for (i, &s) in slots.iter().enumerate() {
                let d = (l * slots_per_layer + s as usize) * width;
                cache[d..d + width].copy_from_slice(&new[(l * n + i) * width..][..width]);
            }
        }
    }

    /// Sequential-semantics moves: all sources are read before any
    /// destination is written.
    pub fn move_rows(
        cache: &mut [f32],
        slots_per_layer: usize,
        width: usize,
        src: &[u32],
        dst: &[u32],
    ) {
        for l in 0..cache.len() / (slots_per_layer * width).max(1) {
            let rows: Vec<Vec<f32>> = src
                .iter()
                .map(|&s| cache[(l * slots_per_layer + s as usize) * width..][..width].to_vec())
                .collect();
            for (&d, row) in dst.iter().zip(&rows) {
                let d = (l * slots_per_layer + d as usize) * width;
                cache[d..d + width].copy_from_slice(row);
            }
        }
    }

    /// Sequential-semantics compaction: all sources are read before any
    /// destination is written.
    pub fn compact(
        cache: &mut [f32],
        slots_per_layer: usize,
        width: usize,
        src: &[u32],
        dst_start: usize,
    ) {
        let dst: Vec<u32> = (dst_start as u32..(dst_start + src.len()) as u32).collect();
        move_rows(cache, slots_per_layer, width, src, &dst);
    }
}
