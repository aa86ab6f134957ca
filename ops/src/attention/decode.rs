//! Attention for real GPUs (the "planes" layout; flash-decoding): one plane
//! per (query row, KV head, key split) serves every query head of the KV
//! head's group, so each K/V row is read once per query row instead of once
//! per query head, and long contexts are split across cubes whose partial
//! results a second kernel merges with their (max, sum) pairs.
//!
//! * Lanes split the head dimension: lane `i` owns `per = head_dim / plane`
//!   consecutive elements of q, k, v and the output (vector loads of up to
//!   `N` elements; 64 f16 dims on 32 lanes are 4-byte loads, so a plane reads
//!   a 128-byte K row in one coalesced transaction).
//! * Scores: per key, each lane's partial dot product for each of the
//!   `group` query heads, then `plane_sum`. Online softmax per query head
//!   (FlashAttention), the running max `m` and sum `l` uniform across lanes.
//! * `planes` planes per cube take alternate keys of the cube's split; shared
//!   memory merges their (m, l, acc) at the end.
//! * With `splits > 1` every cube writes its unnormalised accumulator and
//!   (m, l) to scratch rows and [`attention_combine`] merges the splits.
//! * Masks: the same predicates as the lane kernel
//!   ([`super::kernel::key_visible`]); masked keys are tested, not loaded
//!   (their K/V rows are never read).
//!
//! Limits (the lowering falls back to the lane kernel otherwise):
//! `head_dim % plane == 0`, `head_dim / plane <= 8`, `group <= 8`,
//! `head_dim <= 128`.

// The comptime branches must stay separate from the runtime tests inside.
#![allow(clippy::collapsible_if)]

use std::ops::Range;

use cubecl::prelude::*;

use super::kernel::key_visible;
use super::launch::{check_rows, AttnMeta};
use super::AttnDims;
use crate::error::{OpsError, Result};
use crate::launch::{cube_count, finish};
use crate::tensor::{DType, DeviceTensor};

/// Most query heads per KV head a plane serves.
pub const MAX_GROUP: usize = 8;
/// Largest head dimension of this layout.
pub const MAX_HEAD_DIM: usize = 128;

/// Sentinel for the running max before any key (finite, see `kernel.rs`).
const NEG_BIG: f32 = -1.0e30;

/// One visible key (its K and V vectors at `k_base`) for every query head
/// of the group: the plane's dot products (`qv` pre-scaled), then the online
/// softmax's running max `m`, sum `l` and accumulator `acc` updated.
#[cube]
#[allow(clippy::too_many_arguments)]
fn attend_key<F: Float + CubeElement, N: Size>(
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    k_base: u32,
    qv: &Array<Vector<f32, N>>,
    acc: &mut Array<Vector<f32, N>>,
    m: &mut Array<f32>,
    l: &mut Array<f32>,
    group: u32,
    #[comptime] pv: usize,
) {
    let mut kv = Array::<Vector<f32, N>>::new(pv);
    let mut vv = Array::<Vector<f32, N>>::new(pv);
    #[unroll]
    for i in 0..pv {
        kv[i] = Vector::cast_from(k[(k_base + i as u32) as usize]);
        vv[i] = Vector::cast_from(v[(k_base + i as u32) as usize]);
    }
    for g in 0..group {
        let gb = (g as usize) * pv;
        let mut dotv = Vector::<f32, N>::new(0.0);
        #[unroll]
        for i in 0..pv {
            dotv += qv[gb + i] * kv[i];
        }
        let mut s = f32::new(0.0);
        #[unroll]
        for i in 0..N::value() {
            s += dotv[i];
        }
        let s = plane_sum(s);
        let mg = m[g as usize];
        let m_new = mg.max(s);
        let corr = f32::exp(mg - m_new);
        let p = f32::exp(s - m_new);
        l[g as usize] = l[g as usize] * corr + p;
        m[g as usize] = m_new;
        let corr_v = Vector::<f32, N>::new(corr);
        let p_v = Vector::<f32, N>::new(p);
        #[unroll]
        for i in 0..pv {
            acc[gb + i] = acc[gb + i] * corr_v + p_v * vv[i];
        }
    }
}

/// Plane 0's end of a row: each query head's sums merged across the
/// planes (their `m`, `l` and accumulators in `smem`, `sv` vectors a slot),
/// then the normalised output written, or this split's partial (`m`, `l`
/// and the unnormalised accumulator) when the keys are split.
#[cube]
#[allow(clippy::too_many_arguments)]
fn finish_group<F: Float + CubeElement, N: Size>(
    smem: &SharedMemory<Vector<f32, N>>,
    acc: &mut Array<Vector<f32, N>>,
    m: &Array<f32>,
    l: &Array<f32>,
    out: &mut Array<Vector<F, N>>,
    part_ml: &mut Array<f32>,
    part_acc: &mut Array<Vector<f32, N>>,
    row: u32,
    local: u32,
    heads: u32,
    group: u32,
    kvh: u32,
    hdv: u32,
    d0: u32,
    lane: u32,
    split: u32,
    splits: u32,
    #[comptime] pv: usize,
    #[comptime] planes: usize,
    #[comptime] sv: usize,
) {
    for g in 0..group {
        let gb = (g as usize) * pv;
        let mut mt = m[g as usize];
        let mut lt = l[g as usize];
        if comptime!(planes > 1) {
            for p in 1..planes {
                let slot = (p * MAX_GROUP + g as usize) * sv;
                let mp = smem[slot][0];
                let m_new = mt.max(mp);
                let ca = f32::exp(mt - m_new);
                let cb = f32::exp(mp - m_new);
                lt = lt * ca + smem[slot + 1][0] * cb;
                let ca_v = Vector::<f32, N>::new(ca);
                let cb_v = Vector::<f32, N>::new(cb);
                #[unroll]
                for i in 0..pv {
                    acc[gb + i] = acc[gb + i] * ca_v + smem[slot + 2 + d0 as usize + i] * cb_v;
                }
                mt = m_new;
            }
        }
        let head = kvh * group + g;
        if splits == 1 {
            let mut inv = f32::new(0.0);
            if lt > 0.0 {
                inv = f32::new(1.0) / lt;
            }
            let inv_v = Vector::<f32, N>::new(inv);
            let o_base = (row * heads + head) * hdv + d0;
            #[unroll]
            for i in 0..pv {
                out[(o_base + i as u32) as usize] = Vector::cast_from(acc[gb + i] * inv_v);
            }
        } else {
            // This split's partial: (m, l) and the unnormalised accumulator.
            let pr = (local * heads + head) * splits + split;
            if lane == 0 {
                part_ml[(pr * 2) as usize] = mt;
                part_ml[(pr * 2 + 1) as usize] = lt;
            }
            #[unroll]
            for i in 0..pv {
                part_acc[(pr * hdv + d0 + i as u32) as usize] = acc[gb + i];
            }
        }
    }
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn decode_attention<F: Float + CubeElement, N: Size>(
    q: &Array<Vector<F, N>>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    out: &mut Array<Vector<F, N>>,
    part_ml: &mut Array<f32>,
    part_acc: &mut Array<Vector<f32, N>>,
    meta: &Array<u32>,
    k_pos: &Array<u32>,
    anc: &Array<u32>,
    row_offset: u32,
    rows: u32,
    heads: u32,
    group: u32,
    kv_heads: u32,
    hdv: u32,
    scale: f32,
    p0: u32,
    p1: u32,
    words: u32,
    splits: u32,
    chunk: u32,
    #[comptime] pv: usize,
    #[comptime] planes: usize,
    #[comptime] hd_cap_v: usize,
    #[comptime] mask: u32,
    #[comptime] tree: bool,
) {
    let lane = UNIT_POS_X;
    let plane = UNIT_POS_Y;
    let cube = CUBE_POS as u32;
    let split = cube % splits;
    let kvh = (cube / splits) % kv_heads;
    let local = cube / (splits * kv_heads);
    // Cubes past the last row (grid rounding) still reach the barriers.
    let live = local < rows;
    let row = row_offset + select(live, local, 0);
    let mb = (row * 4) as usize;
    let qp = meta[mb];
    let k_begin = meta[mb + 1];
    let k_end = meta[mb + 2];
    let tree_base = meta[mb + 3];
    let d0 = lane * pv as u32;

    // This lane's slice of the group's queries, pre-scaled.
    let mut qv = Array::<Vector<f32, N>>::new(comptime!(MAX_GROUP * pv));
    let mut acc = Array::<Vector<f32, N>>::new(comptime!(MAX_GROUP * pv));
    let mut m = Array::<f32>::new(MAX_GROUP);
    let mut l = Array::<f32>::new(MAX_GROUP);
    let scale_v = Vector::<f32, N>::new(scale);
    for g in 0..group {
        let head = kvh * group + g;
        let q_base = (row * heads + head) * hdv + d0;
        #[unroll]
        for i in 0..pv {
            let gi = (g as usize) * pv + i;
            qv[gi] = Vector::cast_from(q[(q_base + i as u32) as usize]) * scale_v;
            acc[gi] = Vector::new(0.0);
        }
        m[g as usize] = f32::new(NEG_BIG);
        l[g as usize] = f32::new(0.0);
    }

    // A key's index `i` (its place among the sequence's keys) chooses its
    // split (`i / chunk`) and plane (`(i - split's first) % planes`), so
    // a row's sums round the same way whatever the batch around it. Below
    // `tree_base` that is its row: `k_begin + i`. A tree key takes the
    // index its node would have once its path is committed (tail start +
    // depth, depth = position - the first node's position), which is the
    // row autoregressive decoding reads it from: a tree node's output then
    // has the bits of the decode row at its position (lossless greedy
    // speculation). Tree keys the formula cannot place keep their row.
    let lo = split * chunk;
    let start = k_begin + lo;
    let flat_end = select(tree_base < k_end, tree_base, k_end);
    let stop = select(start + chunk < flat_end, start + chunk, flat_end);
    let mut j = start + plane;
    let mut t = k_end;
    if comptime!(tree) {
        t = tree_base;
    }
    while (j < stop || t < k_end) && live {
        let mut key = j;
        let mut take = true;
        if j < stop {
            j += planes as u32;
        } else {
            key = t;
            t += 1;
            let root = k_pos[tree_base as usize];
            let kp = k_pos[key as usize];
            let path_index = (tree_base - k_begin) + (kp - root);
            let mut i = key - k_begin;
            if kp >= root && path_index < k_end - k_begin {
                i = path_index;
            }
            take = i >= lo && i < lo + chunk && (i - lo) % (planes as u32) == plane;
        }
        if take
            && key_visible(
                key, qp, row, tree_base, k_pos, anc, words, p0, p1, mask, tree,
            )
        {
            let k_base = (key * kv_heads + kvh) * hdv + d0;
            attend_key::<F, N>(k, v, k_base, &qv, &mut acc, &mut m, &mut l, group, pv);
        }
    }

    // Merge the planes: per (plane, head) a slot of `2 + hd_cap_v` vectors,
    // m and l broadcast into the first two, then the accumulator. (One
    // shared array: cubecl-cpp lays several out in hash order, which would
    // make the emitted source differ between runs.)
    let sv = comptime!(2 + hd_cap_v);
    let mut smem =
        SharedMemory::<Vector<f32, N>>::new(comptime!(planes * MAX_GROUP * (2 + hd_cap_v)));
    if comptime!(planes > 1) {
        for g in 0..group {
            let slot = ((plane as usize) * MAX_GROUP + g as usize) * sv;
            if lane == 0 {
                smem[slot] = Vector::new(m[g as usize]);
                smem[slot + 1] = Vector::new(l[g as usize]);
            }
            #[unroll]
            for i in 0..pv {
                smem[slot + 2 + d0 as usize + i] = acc[(g as usize) * pv + i];
            }
        }
    }
    sync_cube();
    if plane == 0 && live {
        finish_group::<F, N>(
            &smem, &mut acc, &m, &l, out, part_ml, part_acc, row, local, heads, group, kvh, hdv,
            d0, lane, split, splits, pv, planes, sv,
        );
    }
}

/// Merges the `splits` partials of every (row, head): one unit per output
/// vector.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_combine<F: Float + CubeElement, N: Size>(
    part_ml: &Array<f32>,
    part_acc: &Array<Vector<f32, N>>,
    out: &mut Array<Vector<F, N>>,
    row_offset: u32,
    rows: u32,
    heads: u32,
    hdv: u32,
    splits: u32,
) {
    let idx = ABSOLUTE_POS as u32;
    if idx < rows * heads * hdv {
        let dv = idx % hdv;
        let rh = idx / hdv;
        let mut mt = f32::new(NEG_BIG);
        for s in 0..splits {
            mt = mt.max(part_ml[((rh * splits + s) * 2) as usize]);
        }
        let mut lt = f32::new(0.0);
        let mut acc = Vector::<f32, N>::new(0.0);
        for s in 0..splits {
            let pr = rh * splits + s;
            let c = f32::exp(part_ml[(pr * 2) as usize] - mt);
            lt += part_ml[(pr * 2 + 1) as usize] * c;
            acc += part_acc[(pr * hdv + dv) as usize] * Vector::<f32, N>::new(c);
        }
        let mut inv = f32::new(0.0);
        if lt > 0.0 {
            inv = f32::new(1.0) / lt;
        }
        let row = row_offset + rh / heads;
        let head = rh % heads;
        out[((row * heads + head) * hdv + dv) as usize] =
            Vector::cast_from(acc * Vector::<f32, N>::new(inv));
    }
}

/// The launch shape of [`attention_planes`], chosen per device by the
/// lowering (`codegen::device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttnPlaneShape {
    /// Lanes per plane: the device's plane size.
    pub plane: u32,
    /// Planes per cube (alternate keys of one split).
    pub planes: u32,
    /// Keys per split; contexts longer than this are split across cubes.
    pub chunk: u32,
}

/// Whether the plane layout handles `dims` with planes of `plane` lanes.
pub fn supports(dims: AttnDims, plane: u32) -> bool {
    let plane = plane as usize;
    plane > 0
        && dims.head_dim.is_multiple_of(plane)
        && dims.head_dim / plane <= 8
        && dims.head_dim <= MAX_HEAD_DIM
        && dims.kv_heads > 0
        && dims.heads / dims.kv_heads <= MAX_GROUP
}

/// [`super::attention_rows`] with the plane layout `shape` (same arguments,
/// same results up to f32 summation order): query rows `rows` of `meta`.
#[allow(clippy::too_many_arguments)]
pub fn attention_planes<R: Runtime>(
    client: &ComputeClient<R>,
    q: &DeviceTensor<R>,
    k: &DeviceTensor<R>,
    v: &DeviceTensor<R>,
    dims: AttnDims,
    meta: &AttnMeta<R>,
    rows: Range<usize>,
    out: &DeviceTensor<R>,
    shape: AttnPlaneShape,
) -> Result<()> {
    const OP: &str = "attention";
    if !check_rows(client, q, k, v, dims, meta, &rows, out)? {
        return Ok(());
    }
    if !supports(dims, shape.plane) || shape.planes == 0 || shape.chunk == 0 {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!("plane layout {shape:?} does not fit {dims:?}"),
        });
    }
    let AttnDims {
        heads,
        kv_heads,
        head_dim,
    } = dims;
    let per = head_dim / shape.plane as usize;
    let nv = crate::block::widest_vector(per, 4);
    let hdv = head_dim / nv;
    let splits = meta.max_keys.div_ceil(shape.chunk as usize).max(1);
    let n_rows = rows.len();
    let cubes = n_rows * kv_heads * splits;
    let count = cube_count(OP, cubes)?;
    let (code, p0, p1) = meta.mask.kernel_args();
    let tree = meta.words > 0;
    // Split partials: scratch only when the context spans several chunks;
    // otherwise the kernel never touches them and the metadata buffer
    // (at least 16 bytes) is bound in their place, so a decode step
    // allocates nothing here.
    let (part_ml, part_acc) = if splits > 1 {
        let partials = n_rows * heads * splits;
        (
            DeviceTensor::<R>::empty(client, &[partials * 2], DType::F32),
            DeviceTensor::<R>::empty(client, &[partials * head_dim], DType::F32),
        )
    } else {
        (meta.meta.clone(), meta.meta.clone())
    };
    // SAFETY: `check_rows` validated every buffer's shape against `meta`;
    // rows past `rows` (grid rounding) are masked by `live`; keys stay in
    // `meta`'s per-row ranges; lane slices end at `head_dim` (`supports`);
    // partial rows index `n_rows · heads · splits` entries.
    crate::dispatch_float!(q.dtype(), OP, F => {
        unsafe {
            decode_attention::launch_unchecked::<F, R>(
                client,
                count,
                CubeDim::new_2d(shape.plane, shape.planes),
                nv,
                q.array_arg(),
                k.array_arg(),
                v.array_arg(),
                out.array_arg(),
                part_ml.array_arg(),
                part_acc.array_arg(),
                meta.meta.array_arg(),
                meta.k_pos.array_arg(),
                meta.anc.array_arg(),
                rows.start as u32,
                n_rows as u32,
                heads as u32,
                (heads / kv_heads) as u32,
                kv_heads as u32,
                hdv as u32,
                meta.softmax_scale(head_dim),
                p0,
                p1,
                meta.words as u32,
                splits as u32,
                shape.chunk,
                per / nv,
                shape.planes as usize,
                MAX_HEAD_DIM / nv,
                code,
                tree,
            );
            if splits > 1 {
                let units = n_rows * heads * hdv;
                attention_combine::launch_unchecked::<F, R>(
                    client,
                    cube_count(OP, units.div_ceil(COMBINE_UNITS as usize))?,
                    CubeDim::new_1d(COMBINE_UNITS),
                    nv,
                    part_ml.array_arg(),
                    part_acc.array_arg(),
                    out.array_arg(),
                    rows.start as u32,
                    n_rows as u32,
                    heads as u32,
                    hdv as u32,
                    splits as u32,
                );
            }
        }
    })?;
    finish(client, OP)
}

/// Units per cube of the combine kernel.
const COMBINE_UNITS: u32 = 128;
