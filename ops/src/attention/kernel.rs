//! The fused flash-style attention kernel: Q·Kᵀ, mask, online softmax and ·V
//! in one launch, one unit per (query row, `gq` adjacent query heads of one
//! KV head), `gq` comptime ([`super::lane_heads_per_unit`]: the whole group
//! where its accumulators fit), so each K and V vector a unit loads serves
//! all `gq` heads; each head's arithmetic is the same, in the same order,
//! whatever `gq` is.
//!
//! Each unit keeps its queries (pre-scaled by the runtime `scale`: 1/√hd unless
//! the metadata sets another) and its output accumulators in local arrays of
//! `cap` vectors per head (f32, whatever the storage type), walks the keys of its
//! sequence in order, skips masked ones, and maintains the running max `m`
//! and denominator `l` of the online softmax (FlashAttention, Dao et al.
//! 2022). The mask kind is a comptime code (see `mask::code`);
//! its predicates are the ones in `mask.rs`. Grouped-query attention: query
//! head `h` reads KV head `h / group`.
//!
//! The loops over a head's vectors run to the comptime accumulator size
//! `cap` (the smallest of [`super::HEAD_DIM_CAPS`] that holds the head) and
//! are unrolled, with a runtime guard where the head is smaller than `cap`,
//! so every index into `qv` and `acc` is a constant. With loops bounded by
//! the runtime head size, lavapipe kept both arrays in memory rather than
//! registers and every case of `cargo bench -p draftc-ops --bench attention`
//! ran 1.6–2.4x slower (2-core AVX-512 Xeon, f32: decode over 4,096 keys
//! 8.70 → 4.60 ms, prefill of 512 rows 165 → 95 ms, a 64-node tree over
//! 1,024 keys 53 → 32 ms, sliding window 20.5 → 8.4 ms).
//!
//! Per-row metadata `meta[row * 4 ..]` = `(q_pos, k_begin, k_end, tree_base)`:
//! the query's position, the half-open key-row range of its sequence, and the
//! first key row holding tree keys (with the comptime `tree` flag: a tree
//! mask's nodes, or a [`super::TreeTail`]). Launches cover the query
//! rows `row_offset .. row_offset + rows`; chunked launches differ only in
//! `row_offset`, so every row is computed by the same code in the same order.

// The comptime mask branches must stay separate from the runtime tests inside.
#![allow(clippy::collapsible_if)]

use cubecl::prelude::*;

use super::mask::code;

/// Sentinel for the running max before any key was seen (finite, so that
/// `exp(m - m_new)` never sees `inf - inf` under fast math).
const NEG_BIG: f32 = -1.0e30;

/// Whether key row `j` is visible to query row `row` (position `qp`): the
/// mask's predicate on positions (`mask.rs`), and with `tree` the ancestor
/// bit of a tree key (rows from `tree_base` on). Shared by every attention
/// kernel layout.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn key_visible(
    j: u32,
    qp: u32,
    row: u32,
    tree_base: u32,
    k_pos: &Array<u32>,
    anc: &Array<u32>,
    words: u32,
    p0: u32,
    p1: u32,
    #[comptime] mask: u32,
    #[comptime] tree: bool,
) -> bool {
    let mut vis = true;
    if comptime!(mask == code::CAUSAL) {
        vis = k_pos[j as usize] <= qp;
    }
    if comptime!(mask == code::CROSS_DIAGONAL) {
        vis = k_pos[j as usize] < qp;
    }
    if comptime!(mask == code::INVERSE_BLOCK) {
        // p0 = window k, p1 = offset ε; win(p) = (p + k - 1 - ε) / k.
        let kw = (k_pos[j as usize] + p0 - 1 - p1) / p0;
        let qw = (qp + p0 - 1 - p1) / p0;
        vis = kw < qw;
    }
    if comptime!(mask == code::SLIDING_SINK) {
        // p0 = window w, p1 = sink s.
        let kp = k_pos[j as usize];
        vis = kp <= qp && (kp < p1 || qp - kp < p0);
    }
    if tree {
        // Tree keys (the last keys of the sequence): only those whose bit
        // is set (ancestors of the query node).
        if j >= tree_base {
            let node = j - tree_base;
            let bits = anc[(row * words + node / 32) as usize];
            vis = vis && ((bits >> (node % 32)) & 1) == 1;
        }
    }
    vis
}

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fused_attention<F: Float + CubeElement, N: Size>(
    q: &Array<Vector<F, N>>,
    k: &Array<Vector<F, N>>,
    v: &Array<Vector<F, N>>,
    out: &mut Array<Vector<F, N>>,
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
    #[comptime] mask: u32,
    #[comptime] tree: bool,
    #[comptime] cap: usize,
    #[comptime] gq: usize,
) {
    // Unit = (query row, `gq` adjacent query heads of one KV head).
    let per_row = heads / comptime!(gq as u32);
    let idx = ABSOLUTE_POS;
    if idx < (rows * per_row) as usize {
        let local = idx as u32;
        let row = row_offset + local / per_row;
        let head0 = (local % per_row) * comptime!(gq as u32);
        let kvh = head0 / group;
        let mb = (row * 4) as usize;
        let qp = meta[mb];
        let k_begin = meta[mb + 1];
        let k_end = meta[mb + 2];
        let tree_base = meta[mb + 3];
        let hdv_u = hdv as usize;

        // qv[h * cap + d], acc[h * cap + d]: head h of the unit's group.
        let q_base = ((row * heads + head0) * hdv) as usize;
        let mut qv = Array::<Vector<f32, N>>::new(comptime!(cap * gq));
        let mut acc = Array::<Vector<f32, N>>::new(comptime!(cap * gq));
        let mut m = Array::<f32>::new(gq);
        let mut l = Array::<f32>::new(gq);
        let scale_v = Vector::<f32, N>::new(scale);
        #[unroll]
        for h in 0..gq {
            #[unroll]
            for d in 0..cap {
                if d < hdv_u {
                    qv[h * cap + d] = Vector::cast_from(q[q_base + h * hdv_u + d]) * scale_v;
                }
                acc[h * cap + d] = Vector::new(0.0);
            }
            m[h] = f32::new(NEG_BIG);
            l[h] = f32::new(0.0);
        }

        let mut corr = Array::<f32>::new(gq);
        let mut p = Array::<f32>::new(gq);
        for j in k_begin..k_end {
            let vis = key_visible(j, qp, row, tree_base, k_pos, anc, words, p0, p1, mask, tree);
            if vis {
                let k_base = ((j * kv_heads + kvh) * hdv) as usize;
                // Each K vector is loaded once for the group's heads.
                let mut dotv = Array::<Vector<f32, N>>::new(gq);
                #[unroll]
                for h in 0..gq {
                    dotv[h] = Vector::<f32, N>::new(0.0);
                }
                #[unroll]
                for d in 0..cap {
                    if d < hdv_u {
                        let kd = Vector::<f32, N>::cast_from(k[k_base + d]);
                        #[unroll]
                        for h in 0..gq {
                            dotv[h] += qv[h * cap + d] * kd;
                        }
                    }
                }
                #[unroll]
                for h in 0..gq {
                    let mut s = f32::new(0.0);
                    #[unroll]
                    for i in 0..N::value() {
                        s += dotv[h][i];
                    }
                    let m_new = m[h].max(s);
                    corr[h] = f32::exp(m[h] - m_new);
                    p[h] = f32::exp(s - m_new);
                    l[h] = l[h] * corr[h] + p[h];
                    m[h] = m_new;
                }
                // Each V vector likewise.
                #[unroll]
                for d in 0..cap {
                    if d < hdv_u {
                        let vd = Vector::<f32, N>::cast_from(v[k_base + d]);
                        #[unroll]
                        for h in 0..gq {
                            acc[h * cap + d] = acc[h * cap + d] * Vector::<f32, N>::new(corr[h])
                                + Vector::<f32, N>::new(p[h]) * vd;
                        }
                    }
                }
            }
        }

        #[unroll]
        for h in 0..gq {
            let mut inv = f32::new(0.0);
            if l[h] > 0.0 {
                inv = f32::new(1.0) / l[h];
            }
            let inv_v = Vector::<f32, N>::new(inv);
            #[unroll]
            for d in 0..cap {
                if d < hdv_u {
                    out[q_base + h * hdv_u + d] = Vector::cast_from(acc[h * cap + d] * inv_v);
                }
            }
        }
    }
}
