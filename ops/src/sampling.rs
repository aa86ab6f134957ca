//! Sampling one token per row from logits `[rows, vocab]` with temperature,
//! top-k and top-p (applied in that order, as in HF `generate`), driven by
//! a deterministic counter-based RNG: `u = hash(seed, row, step)`
//! ([`reference::uniform`]), so a (seed, step) pair reproduces a sample
//! exactly and kernel and reference pick the same token.
//!
//! * `temperature == 0` → greedy ([`crate::argmax_topk::argmax`]).
//! * No top-k and no top-p → inverse CDF over the whole vocabulary: units
//!   own contiguous chunks of the row, chunk sums are scanned in order by one
//!   unit, then the chosen chunk is scanned element by element. The
//!   reference reproduces that summation order.
//! * Otherwise the `K` candidates are picked with the top-k selection of
//!   [`crate::argmax_topk`] (`K = top_k`, or [`MAX_CANDIDATES`] when only
//!   top-p is set: **top-p alone considers at most the 128 most likely
//!   tokens**), then one unit applies softmax, the top-p cut (smallest
//!   prefix with cumulative probability ≥ p) and the inverse CDF.

use cubecl::prelude::*;

use crate::argmax_topk::{argmax, cube_best_after};
use crate::block::cube_max;
use crate::error::{OpsError, Result};
use crate::launch::{cube_count, expect_float_rows, expect_row_u32, finish};
use crate::tensor::DeviceTensor;

/// Units per cube (also the chunk count of the full-vocabulary path).
pub const BLOCK: usize = 128;
/// Most candidates the top-k / top-p path keeps.
pub const MAX_CANDIDATES: usize = 128;

/// Sampling parameters for [`sample`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 disables (at most [`MAX_CANDIDATES`]).
    pub top_k: usize,
    /// Nucleus threshold in (0, 1]; 1 disables.
    pub top_p: f32,
    /// RNG seed.
    pub seed: u64,
    /// RNG counter (e.g. the decoding step); a new step gives new samples.
    pub step: u32,
}

#[cube]
fn fmix32(x: u32) -> u32 {
    let mut h = x;
    h ^= h >> 16;
    h *= 0x85eb_ca6bu32;
    h ^= h >> 13;
    h *= 0xc2b2_ae35u32;
    h ^= h >> 16;
    h
}

/// Uniform in `[0, 1)` from (seed, row, step); see [`reference::uniform`].
#[cube]
pub fn uniform(seed_lo: u32, seed_hi: u32, row: u32, step: u32) -> f32 {
    let mut h = fmix32(step ^ 0x9e37_79b9u32);
    h = fmix32(h ^ row);
    h = fmix32(h ^ seed_hi);
    h = fmix32(h ^ seed_lo);
    f32::cast_from(h >> 8) * comptime!(1.0f32 / 16_777_216.0)
}

/// Inverse-CDF sampling over the whole row.
#[cube(launch_unchecked)]
pub fn sample_full_kernel<F: Float + CubeElement>(
    x: &Array<F>,
    out: &mut Array<u32>,
    rows: usize,
    n: usize,
    inv_t: f32,
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
) {
    let mut smem = SharedMemory::<f32>::new(comptime!(BLOCK));
    let mut sums = SharedMemory::<f32>::new(comptime!(BLOCK));
    let valid = CUBE_POS < rows;
    let row = select(valid, CUBE_POS, 0usize);
    let base = row * n;
    let tid = UNIT_POS as usize;
    let chunk = n.div_ceil(comptime!(BLOCK));
    let lo = usize::min(tid * chunk, n);
    let hi = usize::min(lo + chunk, n);
    let mut m = comptime!(-f32::MAX).runtime(); // lowest finite f32
    for j in lo..hi {
        m = f32::max(m, f32::cast_from(x[base + j]) * inv_t);
    }
    let mx = cube_max(&mut smem, m, comptime!(BLOCK));
    let mut s = 0f32;
    for j in lo..hi {
        s += f32::exp(f32::cast_from(x[base + j]) * inv_t - mx);
    }
    sums[tid] = s;
    sync_cube();
    if valid && tid == 0 {
        let mut total = 0f32;
        for c in 0..comptime!(BLOCK) {
            total += sums[c];
        }
        let target = uniform(seed_lo, seed_hi, row as u32, step) * total;
        // First chunk whose inclusive cumulative sum exceeds the target.
        let mut acc = 0f32;
        let mut pick_chunk = comptime!(BLOCK - 1).runtime();
        let mut before = 0f32;
        let mut found = false;
        for c in 0..comptime!(BLOCK) {
            if !found && sums[c] > 0.0 {
                if acc + sums[c] > target {
                    pick_chunk = c;
                    before = acc;
                    found = true;
                }
                acc += sums[c];
            }
        }
        if !found {
            before = acc - sums[pick_chunk];
        }
        let clo = usize::min(pick_chunk * chunk, n);
        let chi = usize::min(clo + chunk, n);
        let mut pick = n - 1;
        let mut done = false;
        let mut a = before;
        for j in clo..chi {
            if !done {
                a += f32::exp(f32::cast_from(x[base + j]) * inv_t - mx);
                if a > target {
                    pick = j;
                    done = true;
                }
            }
        }
        out[row] = pick as u32;
    }
}

/// Top-k / top-p sampling over `k` selected candidates.
#[cube(launch_unchecked)]
pub fn sample_candidates_kernel<F: Float + CubeElement>(
    x: &Array<F>,
    out: &mut Array<u32>,
    rows: usize,
    n: usize,
    k: usize,
    inv_t: f32,
    top_p: f32,
    seed_lo: u32,
    seed_hi: u32,
    step: u32,
) {
    let mut sv = SharedMemory::<f32>::new(comptime!(BLOCK));
    let mut si = SharedMemory::<u32>::new(comptime!(BLOCK));
    let mut cv = SharedMemory::<f32>::new(comptime!(MAX_CANDIDATES));
    let mut ci = SharedMemory::<u32>::new(comptime!(MAX_CANDIDATES));
    let valid = CUBE_POS < rows;
    let row = select(valid, CUBE_POS, 0usize);
    let mut pv = 0f32;
    let mut pi = 0u32;
    for r in 0..k {
        cube_best_after::<F>(
            x,
            row * n,
            n,
            pv,
            pi,
            r > 0,
            &mut sv,
            &mut si,
            comptime!(BLOCK),
        );
        pv = sv[0];
        pi = si[0];
        if UNIT_POS == 0 {
            cv[r] = pv;
            ci[r] = pi;
        }
        sync_cube();
    }
    if valid && UNIT_POS == 0 {
        let mx = cv[0] * inv_t;
        let mut total = 0f32;
        for r in 0..k {
            total += f32::exp(cv[r] * inv_t - mx);
        }
        let mut kept = k;
        let mut cum = 0f32;
        let mut cut = false;
        for r in 0..k {
            if !cut {
                cum += f32::exp(cv[r] * inv_t - mx);
                if cum >= top_p * total {
                    kept = r + 1;
                    cut = true;
                }
            }
        }
        let mut mass = 0f32;
        for r in 0..kept {
            mass += f32::exp(cv[r] * inv_t - mx);
        }
        let target = uniform(seed_lo, seed_hi, row as u32, step) * mass;
        let mut pick = ci[kept - 1];
        let mut a = 0f32;
        let mut done = false;
        for r in 0..kept {
            if !done {
                a += f32::exp(cv[r] * inv_t - mx);
                if a > target {
                    pick = ci[r];
                    done = true;
                }
            }
        }
        out[row] = pick;
    }
}

/// Samples one token per row of `logits` (`[rows, vocab]` or `[..., vocab]`)
/// into `out` (u32, `rows` elements).
pub fn sample<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    params: SamplingParams,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "sample";
    let (rows, n) = expect_float_rows(client, OP, "logits", logits)?;
    expect_row_u32(OP, "out", out, rows)?;
    let SamplingParams {
        temperature,
        top_k,
        top_p,
        seed,
        step,
    } = params;
    let bad = |reason: String| Err(OpsError::InvalidArgument { op: OP, reason });
    if !(temperature >= 0.0 && temperature.is_finite()) {
        return bad(format!(
            "temperature must be finite and >= 0, got {temperature}"
        ));
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        return bad(format!("top_p must be in (0, 1], got {top_p}"));
    }
    if top_k > MAX_CANDIDATES {
        return bad(format!(
            "top_k must be at most {MAX_CANDIDATES}, got {top_k}"
        ));
    }
    if temperature == 0.0 {
        return argmax(client, logits, out);
    }
    let (seed_lo, seed_hi) = (seed as u32, (seed >> 32) as u32);
    let inv_t = 1.0 / temperature;
    let count = cube_count(OP, rows)?;
    let dim = CubeDim::new_1d(BLOCK as u32);
    if top_k == 0 && top_p >= 1.0 {
        crate::dispatch_float!(logits.dtype(), OP, F => {
            // SAFETY: shapes validated above. Reads `x[row·n + j]`, `j < n`,
            // `row` clamped to 0 past the last row; writes `out[row]` for
            // real rows only; shared memory indexed below BLOCK.
            unsafe {
                sample_full_kernel::launch_unchecked::<F, R>(client, count, dim, logits.array_arg(),
                    out.array_arg(), rows, n, inv_t, seed_lo, seed_hi, step)
            }
        })?;
    } else {
        let k = if top_k == 0 { MAX_CANDIDATES } else { top_k }.min(n);
        crate::dispatch_float!(logits.dtype(), OP, F => {
            // SAFETY: as above; candidates `r < k <= MAX_CANDIDATES` index
            // the candidate shared memory.
            unsafe {
                sample_candidates_kernel::launch_unchecked::<F, R>(client, count, dim, logits.array_arg(),
                    out.array_arg(), rows, n, k, inv_t, top_p, seed_lo, seed_hi, step)
            }
        })?;
    }
    finish(client, OP)
}

/// Plain-Rust oracle, mirroring the kernels' summation order.
pub mod reference {
    use super::{SamplingParams, BLOCK, MAX_CANDIDATES};

    fn fmix32(mut h: u32) -> u32 {
        h ^= h >> 16;
        h = h.wrapping_mul(0x85eb_ca6b);
        h ^= h >> 13;
        h = h.wrapping_mul(0xc2b2_ae35);
        h ^ (h >> 16)
    }

    /// The RNG: uniform in `[0, 1)` from (seed, row, step), 24 random bits.
    pub fn uniform(seed: u64, row: u32, step: u32) -> f32 {
        let mut h = fmix32(step ^ 0x9e37_79b9);
        h = fmix32(h ^ row);
        h = fmix32(h ^ (seed >> 32) as u32);
        h = fmix32(h ^ seed as u32);
        (h >> 8) as f32 * (1.0 / 16_777_216.0)
    }

    /// One sample per `n`-long row of `x`.
    pub fn sample(x: &[f32], n: usize, p: SamplingParams) -> Vec<u32> {
        if p.temperature == 0.0 {
            return crate::argmax_topk::reference::argmax(x, n);
        }
        let it = 1.0 / p.temperature;
        x.chunks(n)
            .enumerate()
            .map(|(r, row)| {
                let u = uniform(p.seed, r as u32, p.step);
                if p.top_k == 0 && p.top_p >= 1.0 {
                    full(row, it, u)
                } else {
                    let k = if p.top_k == 0 {
                        MAX_CANDIDATES
                    } else {
                        p.top_k
                    }
                    .min(n);
                    candidates(row, k, it, p.top_p, u)
                }
            })
            .collect()
    }

    fn full(row: &[f32], it: f32, u: f32) -> u32 {
        let n = row.len();
        let chunk = n.div_ceil(BLOCK);
        let mx = row.iter().map(|v| v * it).fold(f32::MIN, f32::max);
        let e = |j: usize| (row[j] * it - mx).exp();
        let sums: Vec<f32> = (0..BLOCK)
            .map(|c| ((c * chunk).min(n)..((c + 1) * chunk).min(n)).map(e).sum())
            .collect();
        let total: f32 = sums.iter().sum();
        let target = u * total;
        let (mut acc, mut pick_chunk, mut before, mut found) = (0f32, BLOCK - 1, 0f32, false);
        for (c, &s) in sums.iter().enumerate() {
            if !found && s > 0.0 {
                if acc + s > target {
                    (pick_chunk, before, found) = (c, acc, true);
                }
                acc += s;
            }
        }
        if !found {
            before = acc - sums[pick_chunk];
        }
        let lo = (pick_chunk * chunk).min(n);
        let mut a = before;
        for j in lo..(lo + chunk).min(n) {
            a += e(j);
            if a > target {
                return j as u32;
            }
        }
        (n - 1) as u32
    }

    fn candidates(row: &[f32], k: usize, it: f32, top_p: f32, u: f32) -> u32 {
        let (cv, ci) = crate::argmax_topk::reference::topk(row, row.len(), k);
        let mx = cv[0] * it;
        let e: Vec<f32> = cv.iter().map(|v| (v * it - mx).exp()).collect();
        let total: f32 = e.iter().sum();
        let mut kept = k;
        let mut cum = 0f32;
        for (r, v) in e.iter().enumerate() {
            cum += v;
            if cum >= top_p * total {
                kept = r + 1;
                break;
            }
        }
        let mass: f32 = e[..kept].iter().sum();
        let target = u * mass;
        let mut a = 0f32;
        for r in 0..kept {
            a += e[r];
            if a > target {
                return ci[r];
            }
        }
        ci[kept - 1]
    }
}
