//! One expansion of an EAGLE-2 dynamic draft tree on the device (issue 31:
//! a tree-building drafter that does not read its candidates every depth).
//!
//! A drafter pass queried `rows` nodes of each of `seqs` sequences (rows
//! packed by sequence) and produced, per queried row, its `w` best
//! candidates: token `ids` and probabilities `probs` (`[seqs·rows, w]`,
//! best first, as [`crate::argmax_topk::topk`] returns them). Each row
//! carries its path log-probability `cum` (`[seqs·rows]`, 0 for the root)
//! and which of the sequence's draft states it may see, as tail bits `vis`
//! (`[seqs·rows, words_in]`, the layout of `attention::TreeTail`).
//!
//! Per sequence, the candidates are the entries `e = r·w + c` (row `r` of
//! the sequence, candidate `c`), scored `cum[r] + ln probs[r, c]` (a
//! probability that is not positive scores `-1e30`). The `f` best entries,
//! **larger score first, ties to the lower entry** (EAGLE-2's frontier:
//! its node ids are created in entry order), become the next pass's rows,
//! in that order:
//! * `next_ids`: their tokens; `next_cum`: their scores; `picks`: their
//!   entries (the host rebuilds the tree from these after one read);
//! * `next_vis` (`[seqs·f, words_out]`): the parent row's bits plus the
//!   parent's own state, tail key `tail_base + r` (the states a pass
//!   queried are appended, in row order, to the sequence's tail).
//!
//! One unit per sequence: a frontier is a few dozen entries, so each unit
//! runs `f` selection rounds over its entries (the best strictly after the
//! last pick, as `argmax_topk` does), `O(f · rows · w)`.

use cubecl::prelude::*;

use crate::argmax_topk::before;
use crate::error::{OpsError, Result};
use crate::launch::{cube_count, expect_dtype, expect_float, expect_shape, finish};
use crate::tensor::{DType, DeviceTensor};

/// Units per cube (one per sequence).
const BLOCK: usize = 32;

/// Score of a candidate whose probability is not positive (finite, so
/// every entry can be picked and ties resolve by entry).
pub const FLOOR: f32 = -1.0e30;

#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn frontier_kernel<F: Float + CubeElement>(
    probs: &Array<F>,
    ids: &Array<u32>,
    cum: &Array<f32>,
    vis: &Array<u32>,
    next_ids: &mut Array<u32>,
    next_cum: &mut Array<f32>,
    next_vis: &mut Array<u32>,
    picks: &mut Array<u32>,
    seqs: usize,
    rows: usize,
    w: usize,
    f: usize,
    words_in: usize,
    words_out: usize,
    tail_base: u32,
) {
    let s = ABSOLUTE_POS;
    if s < seqs {
        let n = rows * w;
        let mut pv = 0f32;
        let mut pi = 0u32;
        for i in 0..f {
            let mut bv = comptime!(-f32::MAX).runtime();
            let mut bi = 0xffff_ffffu32;
            for e in 0..n {
                let row = s * rows + e / w;
                let p = f32::cast_from(probs[row * w + e % w]);
                let lp = select(p > 0.0, f32::ln(f32::max(p, 1.0e-38)), FLOOR);
                let v = f32::max(cum[row] + lp, FLOOR * 4.0);
                let eu = e as u32;
                let allowed = i == 0 || before(pv, pi, v, eu);
                if allowed && before(v, eu, bv, bi) {
                    bv = v;
                    bi = eu;
                }
            }
            // Every entry scores above -f32::MAX and f <= n, so a pick exists.
            let e = select(bi == 0xffff_ffffu32, 0u32, bi) as usize;
            let r = e / w;
            let row = s * rows + r;
            let o = s * f + i;
            next_ids[o] = ids[row * w + e % w];
            next_cum[o] = bv;
            picks[o] = e as u32;
            let t = tail_base + r as u32;
            for k in 0..words_out {
                let mut bits = 0u32;
                if k < words_in {
                    bits = vis[row * words_in + k];
                }
                if (t / 32) as usize == k {
                    bits |= 1u32 << (t % 32);
                }
                next_vis[o * words_out + k] = bits;
            }
            pv = bv;
            pi = bi;
        }
    }
}

/// Where one expansion's results go (see the module docs for each).
pub struct Frontier<'a, R: Runtime> {
    pub next_ids: &'a DeviceTensor<R>,
    pub next_cum: &'a DeviceTensor<R>,
    pub next_vis: &'a DeviceTensor<R>,
    pub picks: &'a DeviceTensor<R>,
}

/// Picks each sequence's `f` best candidates as the next frontier (see the
/// module docs). `probs` `[seqs·rows, w]` (f32 or f16), `ids` the same
/// shape (u32), `cum` `[seqs·rows]` (f32), `vis` `[seqs·rows, words_in]`
/// (u32); outputs `[seqs·f]` (`next_vis` `[seqs·f, words_out]`).
/// `1 <= f <= rows·w`, and tail key `tail_base + rows - 1` must fit in
/// `words_out` words.
#[allow(clippy::too_many_arguments)]
pub fn expand_frontier<R: Runtime>(
    client: &ComputeClient<R>,
    probs: &DeviceTensor<R>,
    ids: &DeviceTensor<R>,
    cum: &DeviceTensor<R>,
    vis: &DeviceTensor<R>,
    seqs: usize,
    f: usize,
    tail_base: u32,
    out: Frontier<'_, R>,
) -> Result<()> {
    const OP: &str = "expand_frontier";
    expect_float(client, OP, "probs", probs)?;
    let w = *probs.shape().last().unwrap_or(&0);
    let total = probs.numel() / w.max(1);
    if seqs == 0 || w == 0 || total == 0 || !total.is_multiple_of(seqs) {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!(
                "probs {:?} is not [seqs·rows, w] with {seqs} sequences",
                probs.shape()
            ),
        });
    }
    let rows = total / seqs;
    if f == 0 || f > rows * w {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!("f must be in 1..={}, got {f}", rows * w),
        });
    }
    expect_shape(OP, "ids", ids, &[total, w])?;
    expect_dtype(OP, "ids", ids, DType::U32)?;
    expect_shape(OP, "cum", cum, &[total])?;
    expect_dtype(OP, "cum", cum, DType::F32)?;
    expect_dtype(OP, "vis", vis, DType::U32)?;
    let words_in = vis.numel() / total;
    if words_in == 0 || vis.numel() != total * words_in {
        return Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "vis",
            expected: format!("[{total}, words]"),
            found: vis.shape().to_vec(),
        });
    }
    expect_dtype(OP, "next_vis", out.next_vis, DType::U32)?;
    let words_out = out.next_vis.numel() / (seqs * f);
    if words_out == 0 || out.next_vis.numel() != seqs * f * words_out {
        return Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "next_vis",
            expected: format!("[{}, words]", seqs * f),
            found: out.next_vis.shape().to_vec(),
        });
    }
    let last_key = tail_base as usize + rows - 1;
    if last_key >= words_out * 32 {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!("tail key {last_key} does not fit in {words_out} words"),
        });
    }
    for (arg, t, dtype) in [
        ("next_ids", out.next_ids, DType::U32),
        ("next_cum", out.next_cum, DType::F32),
        ("picks", out.picks, DType::U32),
    ] {
        expect_shape(OP, arg, t, &[seqs * f])?;
        expect_dtype(OP, arg, t, dtype)?;
    }
    let count = cube_count(OP, seqs.div_ceil(BLOCK))?;
    crate::dispatch_float!(probs.dtype(), OP, F => {
        // SAFETY: shapes validated above. A unit works only for `s < seqs`;
        // it reads rows `s·rows + r`, `r < rows`, candidates `c < w` and
        // words `k < words_in`, and writes outputs `s·f + i`, `i < f`, words
        // `k < words_out`; a pick is always an entry `< rows·w`.
        unsafe {
            frontier_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32),
                probs.array_arg(), ids.array_arg(), cum.array_arg(), vis.array_arg(),
                out.next_ids.array_arg(), out.next_cum.array_arg(), out.next_vis.array_arg(),
                out.picks.array_arg(), seqs, rows, w, f, words_in, words_out, tail_base,
            )
        }
    })?;
    finish(client, OP)
}

/// Plain-Rust oracle.
pub mod reference {
    use super::FLOOR;

    /// What one sequence's expansion gives: per pick, (entry, token,
    /// score, tail bits).
    pub type Pick = (u32, u32, f32, Vec<u32>);

    /// The expansion of the module docs for one sequence: `probs` and
    /// `ids` `[rows, w]`, `cum` `[rows]`, `vis` `[rows, words_in]`.
    #[allow(clippy::too_many_arguments)]
    pub fn expand(
        probs: &[f32],
        ids: &[u32],
        cum: &[f32],
        vis: &[u32],
        w: usize,
        f: usize,
        words_out: usize,
        tail_base: u32,
    ) -> Vec<Pick> {
        let rows = cum.len();
        let words_in = vis.len() / rows.max(1);
        let mut entries: Vec<(f32, usize)> = (0..rows * w)
            .map(|e| {
                let p = probs[e];
                let lp = if p > 0.0 { p.max(1.0e-38).ln() } else { FLOOR };
                ((cum[e / w] + lp).max(FLOOR * 4.0), e)
            })
            .collect();
        // Larger score first; a stable sort keeps the lower entry first.
        entries.sort_by(|a, b| b.0.total_cmp(&a.0));
        entries
            .into_iter()
            .take(f)
            .map(|(v, e)| {
                let r = e / w;
                let t = tail_base as usize + r;
                let bits = (0..words_out)
                    .map(|k| {
                        let mut b = if k < words_in {
                            vis[r * words_in + k]
                        } else {
                            0
                        };
                        if t / 32 == k {
                            b |= 1 << (t % 32);
                        }
                        b
                    })
                    .collect();
                (e as u32, ids[e], v, bits)
            })
            .collect()
    }
}
