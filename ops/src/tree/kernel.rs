//! Tree-acceptance kernels: one cube of `BLOCK` units per tree (`CUBE_POS` =
//! tree index of a batch of same-size trees).
//!
//! Both kernels sweep the nodes once in index order (`parent < node`, so the
//! walk only ever moves to higher indices): node `c` is examined iff its
//! parent is the current node. Every unit makes the same decision from the
//! same global values, and every collective step (reductions with barriers)
//! is executed by all units at every `c`, with the work inside predicated,
//! so barriers never sit in data-dependent control flow. Unit `t` owns the
//! contiguous vocabulary chunk `t·⌈V/BLOCK⌉ ..`; the reference mirrors that.

// `(a + b - 1) / b` is spelled out: it is device code, expanded by `#[cube]`.
#![allow(clippy::manual_div_ceil)]

use cubecl::prelude::*;

use crate::block::{cube_max, cube_sum};
use crate::sampling::uniform;

const NEG_BIG: f32 = -3.0e38;

/// Argmax over the cube (value, then lowest index), every unit gets the index.
#[cube]
fn cube_argmax(
    sv: &mut SharedMemory<f32>,
    si: &mut SharedMemory<u32>,
    value: f32,
    index: u32,
    #[comptime] block: usize,
) -> u32 {
    let tid = UNIT_POS as usize;
    sv[tid] = value;
    si[tid] = index;
    sync_cube();
    let mut stride = comptime!(block / 2).runtime();
    while stride > 0 {
        if tid < stride {
            let (ov, oi) = (sv[tid + stride], si[tid + stride]);
            if ov > sv[tid] || (ov == sv[tid] && oi < si[tid]) {
                sv[tid] = ov;
                si[tid] = oi;
            }
        }
        sync_cube();
        stride /= 2;
    }
    let best = si[0];
    sync_cube();
    best
}

/// Argmax of logits row `node` over this unit's chunk (lowest index on ties).
#[cube]
fn chunk_argmax<F: Float>(logits: &Array<F>, row: usize, lo: usize, hi: usize) -> (f32, u32) {
    let mut bv = f32::new(NEG_BIG);
    let mut bi = lo as u32;
    for v in lo..hi {
        let x = f32::cast_from(logits[row + v]);
        if x > bv {
            bv = x;
            bi = v as u32;
        }
    }
    (bv, bi)
}

/// Where this unit works (both kernels' layout, see the module docs), for
/// trees of `n` nodes over `vocab` entries: `(tree, tid, v_len, chunk, lo,
/// hi, nodes, obase)` = the cube's tree, the unit, `vocab`, the chunk size
/// ⌈V/block⌉, the unit's chunk `lo..hi` of the vocabulary, the tree's
/// first node (`tree · n`) and its first word of `out`.
#[cube]
fn tree_unit(
    n: u32,
    vocab: u32,
    #[comptime] block: usize,
) -> (usize, usize, usize, usize, usize, usize, u32, usize) {
    let tree = CUBE_POS;
    let tid = UNIT_POS as usize;
    let v_len = vocab as usize;
    let chunk = (v_len + block - 1) / block;
    let lo = usize::min(tid * chunk, v_len);
    let hi = usize::min(lo + chunk, v_len);
    let nodes = (tree * n as usize) as u32;
    let obase = tree * (n as usize + 1);
    (tree, tid, v_len, chunk, lo, hi, nodes, obase)
}

/// `q(v)`: the draft probability of entry `v` in row `qrow` of `q`, or with
/// no `q` one-hot on the drafted token `x`.
#[cube]
fn draft_prob<F: Float>(
    q: &Array<F>,
    qrow: usize,
    v: usize,
    x: usize,
    #[comptime] has_q: bool,
) -> f32 {
    let mut qv = f32::new(0.0);
    if has_q {
        qv = f32::cast_from(q[qrow + v]);
    } else if v == x {
        qv = f32::new(1.0);
    }
    qv
}

/// Greedy acceptance. `out[tree]` = `[len, bonus, accepted nodes…]` (`n + 1` words).
#[cube(launch_unchecked)]
pub(crate) fn accept_greedy<F: Float + CubeElement>(
    logits: &Array<F>,
    tokens: &Array<u32>,
    parents: &Array<u32>,
    out: &mut Array<u32>,
    n: u32,
    vocab: u32,
    #[comptime] block: usize,
) {
    let (_, tid, v_len, _, lo, hi, nodes, obase) = tree_unit(n, vocab, block);
    let mut sv = SharedMemory::<f32>::new(block);
    let mut si = SharedMemory::<u32>::new(block);

    let (v0, i0) = chunk_argmax::<F>(logits, nodes as usize * v_len, lo, hi);
    let mut best = cube_argmax(&mut sv, &mut si, v0, i0, block);
    let mut cur = 0u32;
    let mut len = 0u32;
    for c in 1..n {
        let take = parents[(nodes + c) as usize] == cur && tokens[(nodes + c) as usize] == best;
        let mut bv = f32::new(NEG_BIG);
        let mut bi = 0u32;
        if take {
            let (a, b) = chunk_argmax::<F>(logits, (nodes + c) as usize * v_len, lo, hi);
            bv = a;
            bi = b;
        }
        let nb = cube_argmax(&mut sv, &mut si, bv, bi, block);
        if take {
            cur = c;
            len += 1;
            best = nb;
            if tid == 0 {
                out[obase + 1 + len as usize] = c;
            }
        }
    }
    if tid == 0 {
        out[obase] = len;
        out[obase + 1] = best;
    }
}

/// Lossless speculative sampling over the tree (multi-draft: children of a
/// node are tried in index order, each rejection replaces `p` by
/// `norm(max(0, p - q))`). `work[tree]` (`vocab` f32) holds the current `p`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn accept_sampling<F: Float + CubeElement>(
    logits: &Array<F>,
    q: &Array<F>,
    tokens: &Array<u32>,
    parents: &Array<u32>,
    work: &mut Array<f32>,
    out: &mut Array<u32>,
    n: u32,
    vocab: u32,
    inv_t: f32,
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
    #[comptime] has_q: bool,
    #[comptime] block: usize,
) {
    let (tree, tid, v_len, chunk, lo, hi, nodes, obase) = tree_unit(n, vocab, block);
    let wbase = tree * v_len;
    let tstep = step + tree as u32;
    let mut smem = SharedMemory::<f32>::new(block);

    // p = softmax(logits[root] / T)
    let r0 = nodes as usize * v_len;
    let mut lm = f32::new(NEG_BIG);
    for v in lo..hi {
        lm = f32::max(lm, f32::cast_from(logits[r0 + v]));
    }
    let m0 = cube_max(&mut smem, lm, block);
    let mut ls = f32::new(0.0);
    for v in lo..hi {
        ls += f32::exp((f32::cast_from(logits[r0 + v]) - m0) * inv_t);
    }
    let s0 = cube_sum(&mut smem, ls, block);
    for v in lo..hi {
        work[wbase + v] = f32::exp((f32::cast_from(logits[r0 + v]) - m0) * inv_t) / s0;
    }
    sync_storage();
    sync_cube();

    let mut cur = 0u32;
    let mut len = 0u32;
    for c in 1..n {
        let node = (nodes + c) as usize;
        let is_child = parents[node] == cur;
        let x = tokens[node] as usize;
        let qrow = (nodes + cur) as usize * v_len;
        let mut qx = f32::new(1.0);
        if has_q {
            qx = f32::cast_from(q[qrow + x]);
        }
        let u = uniform(seed_lo, seed_hi, c, tstep);
        let accept = is_child && u * qx < work[wbase + x];
        let reject = is_child && !accept;
        let rc = node * v_len;

        // Collective 1: max of the new row (accept only).
        let mut lm = f32::new(NEG_BIG);
        if accept {
            for v in lo..hi {
                lm = f32::max(lm, f32::cast_from(logits[rc + v]));
            }
        }
        let m = cube_max(&mut smem, lm, block);
        // Collective 2: normaliser of the new row or of the residual.
        let mut ls = f32::new(0.0);
        if accept {
            for v in lo..hi {
                ls += f32::exp((f32::cast_from(logits[rc + v]) - m) * inv_t);
            }
        }
        if reject {
            for v in lo..hi {
                let qv = draft_prob::<F>(q, qrow, v, x, has_q);
                ls += f32::max(work[wbase + v] - qv, f32::new(0.0));
            }
        }
        let s = cube_sum(&mut smem, ls, block);
        if accept {
            for v in lo..hi {
                work[wbase + v] = f32::exp((f32::cast_from(logits[rc + v]) - m) * inv_t) / s;
            }
            cur = c;
            len += 1;
            if tid == 0 {
                out[obase + 1 + len as usize] = c;
            }
        }
        if reject && s > 0.0 {
            for v in lo..hi {
                let qv = draft_prob::<F>(q, qrow, v, x, has_q);
                work[wbase + v] = f32::max(work[wbase + v] - qv, f32::new(0.0)) / s;
            }
        }
        sync_storage();
        sync_cube();
    }

    // Bonus: inverse CDF of p over chunk sums, scanned by unit 0.
    let mut cs = f32::new(0.0);
    for v in lo..hi {
        cs += work[wbase + v];
    }
    smem[tid] = cs;
    sync_cube();
    if tid == 0 {
        let mut total = f32::new(0.0);
        for t in 0..block {
            total += smem[t];
        }
        let target = uniform(seed_lo, seed_hi, 0u32, tstep) * total;
        let mut last = 0u32;
        for v in 0..v_len {
            if work[wbase + v] > 0.0 {
                last = v as u32;
            }
        }
        let mut bonus = last;
        let mut acc = f32::new(0.0);
        let mut found = false;
        for t in 0..block {
            if !found {
                if acc + smem[t] > target {
                    let clo = usize::min(t * chunk, v_len);
                    let chi = usize::min(clo + chunk, v_len);
                    for v in clo..chi {
                        if !found {
                            acc += work[wbase + v];
                            if acc > target {
                                bonus = v as u32;
                                found = true;
                            }
                        }
                    }
                    found = true;
                } else {
                    acc += smem[t];
                }
            }
        }
        out[obase] = len;
        out[obase + 1] = bonus;
    }
}
