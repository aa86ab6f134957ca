//! Plain-Rust oracle for tree acceptance. It mirrors the kernel's arithmetic
//! order (per-unit contiguous chunks of the vocabulary, pairwise reduction of
//! the chunk partials, the same exp/normalise formulas, the same RNG
//! counters), so kernel and reference agree except where a decision sits
//! within rounding of its threshold; [`Outcome::margin`] reports how close the
//! closest decision was.

use super::{AcceptMode, Acceptance, BLOCK};
use crate::sampling::reference::uniform;

/// The reference's answer plus the smallest distance of any random decision
/// (`u·q(x)` vs `p(x)`, or the inverse-CDF target vs a bucket edge) from its
/// threshold; `f32::INFINITY` in greedy mode.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub acceptance: Acceptance,
    pub margin: f32,
}

fn chunk(vocab: usize, t: usize) -> std::ops::Range<usize> {
    let c = vocab.div_ceil(BLOCK);
    (t * c).min(vocab)..((t + 1) * c).min(vocab)
}

/// Sum of per-unit partials in the kernel's pairwise (stride-halving) order.
fn cube_sum(mut partial: Vec<f32>) -> f32 {
    let mut stride = BLOCK / 2;
    while stride > 0 {
        for t in 0..stride {
            partial[t] += partial[t + stride];
        }
        stride /= 2;
    }
    partial[0]
}

fn chunked_sum(vocab: usize, f: impl Fn(usize) -> f32) -> f32 {
    cube_sum(
        (0..BLOCK)
            .map(|t| chunk(vocab, t).fold(0.0f32, |s, v| s + f(v)))
            .collect(),
    )
}

/// First index of the maximum (ties → lowest index).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// `softmax(row · inv_t)`, written into `p` in the kernel's order.
fn softmax(row: &[f32], inv_t: f32, p: &mut [f32]) {
    let m = row.iter().fold(f32::MIN, |a, &b| a.max(b));
    let s = chunked_sum(row.len(), |v| ((row[v] - m) * inv_t).exp());
    for v in 0..row.len() {
        p[v] = ((row[v] - m) * inv_t).exp() / s;
    }
}

/// Tree acceptance on host data: `tokens`, `parents` `[n]`, `logits` and
/// (optionally) `q` `[n, vocab]`. Inputs must be valid (see `validate`).
pub fn accept_ref(
    tokens: &[u32],
    parents: &[u32],
    logits: &[f32],
    q: Option<&[f32]>,
    vocab: usize,
    mode: AcceptMode,
) -> Outcome {
    let n = tokens.len();
    let row = |i: usize| &logits[i * vocab..(i + 1) * vocab];
    let mut accepted = Vec::new();
    let mut cur = 0usize;
    let AcceptMode::Sampling {
        temperature,
        seed,
        step,
    } = mode
    else {
        let mut best = argmax(row(0));
        for c in 1..n {
            if parents[c] as usize == cur && tokens[c] == best {
                cur = c;
                accepted.push(c as u32);
                best = argmax(row(c));
            }
        }
        return Outcome {
            acceptance: Acceptance {
                accepted,
                bonus: best,
            },
            margin: f32::INFINITY,
        };
    };
    let inv_t = 1.0 / temperature;
    let mut margin = f32::INFINITY;
    let mut p = vec![0.0f32; vocab];
    softmax(row(0), inv_t, &mut p);
    for c in 1..n {
        if parents[c] as usize != cur {
            continue;
        }
        let x = tokens[c] as usize;
        let qrow = |v: usize| match q {
            Some(q) => q[cur * vocab + v],
            None => f32::from(v == x),
        };
        let u = uniform(seed, c as u32, step);
        margin = margin.min((u * qrow(x) - p[x]).abs());
        if u * qrow(x) < p[x] {
            cur = c;
            accepted.push(c as u32);
            softmax(row(c), inv_t, &mut p);
        } else {
            let s = chunked_sum(vocab, |v| (p[v] - qrow(v)).max(0.0));
            if s > 0.0 {
                for (v, pv) in p.iter_mut().enumerate() {
                    *pv = (*pv - qrow(v)).max(0.0) / s;
                }
            }
        }
    }
    let (bonus, m) = inverse_cdf(&p, uniform(seed, 0, step));
    Outcome {
        acceptance: Acceptance { accepted, bonus },
        margin: margin.min(m),
    }
}

/// Inverse CDF in the kernel's order: chunk sums, scanned chunk by chunk,
/// then element by element inside the chosen chunk. Falls back to the last
/// token with nonzero mass when rounding leaves the target uncovered.
fn inverse_cdf(p: &[f32], u: f32) -> (u32, f32) {
    let vocab = p.len();
    let sums: Vec<f32> = (0..BLOCK)
        .map(|t| chunk(vocab, t).fold(0.0f32, |s, v| s + p[v]))
        .collect();
    let total = sums.iter().fold(0.0f32, |a, b| a + b);
    let target = u * total;
    let mut acc = 0.0f32;
    let mut margin = f32::INFINITY;
    for (t, &s) in sums.iter().enumerate() {
        margin = margin.min((acc + s - target).abs());
        if acc + s > target {
            for v in chunk(vocab, t) {
                acc += p[v];
                margin = margin.min((acc - target).abs());
                if acc > target {
                    return (v as u32, margin);
                }
            }
            break;
        }
        acc += s;
    }
    let last = (0..vocab).rev().find(|&v| p[v] > 0.0).unwrap_or(0);
    (last as u32, 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::TREE_ROOT;

    #[test]
    fn greedy_walks_first_matching_child() {
        // vocab 4; node 0 predicts 2, node 2 (token 2) predicts 1, node 3 (token 1) predicts 3.
        let mut logits = vec![0.0; 5 * 4];
        for (node, best) in [(0, 2), (1, 0), (2, 1), (3, 3), (4, 0)] {
            logits[node * 4 + best] = 1.0;
        }
        let tokens = [9, 1, 2, 1, 3];
        let parents = [TREE_ROOT, 0, 0, 2, 2];
        let out = accept_ref(&tokens, &parents, &logits, None, 4, AcceptMode::Greedy);
        assert_eq!(
            out.acceptance,
            Acceptance {
                accepted: vec![2, 3],
                bonus: 3
            }
        );
    }

    #[test]
    fn inverse_cdf_picks_the_bucket_holding_the_target() {
        let p = [0.25, 0.0, 0.5, 0.25];
        assert_eq!(inverse_cdf(&p, 0.0).0, 0);
        assert_eq!(inverse_cdf(&p, 0.3).0, 2);
        assert_eq!(inverse_cdf(&p, 0.8).0, 3);
    }

    #[test]
    fn sampling_with_q_equal_p_always_accepts() {
        // q = p exactly: u·q(x) < p(x) for every u < 1, so every proposed child is accepted.
        let vocab = 3;
        let logits = vec![0.1, 0.7, -0.3, 0.2, 0.2, 0.9];
        let mut q = vec![0.0; 6];
        softmax(&logits[..3], 1.0, &mut q[..3]);
        let tokens = [0, 2];
        let mode = AcceptMode::Sampling {
            temperature: 1.0,
            seed: 5,
            step: 0,
        };
        for step in 0..20 {
            let mode = if let AcceptMode::Sampling {
                temperature, seed, ..
            } = mode
            {
                AcceptMode::Sampling {
                    temperature,
                    seed,
                    step,
                }
            } else {
                unreachable!()
            };
            let out = accept_ref(&tokens, &[TREE_ROOT, 0], &logits, Some(&q), vocab, mode);
            assert_eq!(out.acceptance.accepted, vec![1]);
        }
    }
}
