//! Plain-Rust reference attention: the oracle the fused kernel is tested
//! against. Straightforward two-pass softmax in f64 over the visible keys.
//!
//! `out[r, h, :] = Σ_j softmax_j(s · q[r,h]·k[j,g(h)]) · v[j, g(h), :]` over
//! the keys `j` of row `r`'s sequence that the mask lets it see, where
//! `g(h) = h / (heads / kv_heads)` is the KV head shared by a group of query
//! heads (grouped-query attention). Tree keys (the nodes of a tree mask,
//! `Mask::Tree` / `Mask::TreeSliding`, or a [`super::TreeTail`]) also need
//! their bit. Rows that see no key are zero.
//! The scale `s` is `1/√hd` ([`attention_ref`]) or given
//! ([`attention_ref_scaled`], the kernels' `AttnMeta::with_scale`).

use super::mask::{Mask, SeqBatch};
use super::AttnDims;

/// Reference attention over packed f32 buffers (layouts: see [`SeqBatch`]).
/// Inputs must already be valid (`SeqBatch::validate`, buffer lengths).
/// The softmax scale is `1/√head_dim`.
pub fn attention_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: AttnDims,
    batch: &SeqBatch,
    mask: Mask,
) -> Vec<f32> {
    let scale = 1.0 / (dims.head_dim as f64).sqrt();
    attention_ref_scaled(q, k, v, dims, batch, mask, scale)
}

/// [`attention_ref`] with softmax scale `scale` in place of `1/√head_dim`
/// (Gemma 3: `query_pre_attn_scalar^-0.5`).
pub fn attention_ref_scaled(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    dims: AttnDims,
    batch: &SeqBatch,
    mask: Mask,
    scale: f64,
) -> Vec<f32> {
    let AttnDims {
        heads,
        kv_heads,
        head_dim,
    } = dims;
    let group = heads / kv_heads;
    let mut out = vec![0.0f32; batch.total_q() * heads * head_dim];
    let q_starts = batch.q_starts();
    let k_starts = batch.k_starts();
    let bits = batch.tree_bits(&mask);
    let mut scores = Vec::new();
    for s in 0..batch.batch() {
        let (k0, k1) = (k_starts[s], k_starts[s + 1]);
        let tree_base = k1 - batch.tree_keys(s, &mask);
        for row in q_starts[s]..q_starts[s + 1] {
            let qp = batch.q_pos[row];
            for h in 0..heads {
                let g = h / group;
                let qv = &q[(row * heads + h) * head_dim..][..head_dim];
                scores.clear();
                for j in k0..k1 {
                    // Positional mask (`Tree`: always true; `TreeSliding`:
                    // the sliding window), then tree keys
                    // need their bit.
                    let vis = mask.visible(qp, batch.k_pos[j])
                        && match &bits {
                            Some((anc, words)) if j >= tree_base => {
                                let node = j - tree_base;
                                anc[row * words + node / 32] >> (node % 32) & 1 == 1
                            }
                            _ => true,
                        };
                    if vis {
                        let kv = &k[(j * kv_heads + g) * head_dim..][..head_dim];
                        let dot: f64 = qv.iter().zip(kv).map(|(a, b)| *a as f64 * *b as f64).sum();
                        scores.push((j, dot * scale));
                    }
                }
                if scores.is_empty() {
                    continue;
                }
                let m = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                let denom: f64 = scores.iter().map(|s| (s.1 - m).exp()).sum();
                let o = &mut out[(row * heads + h) * head_dim..][..head_dim];
                for d in 0..head_dim {
                    let acc: f64 = scores
                        .iter()
                        .map(|&(j, sc)| {
                            (sc - m).exp() * v[(j * kv_heads + g) * head_dim + d] as f64
                        })
                        .sum();
                    o[d] = (acc / denom) as f32;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::mask::TREE_ROOT;

    fn dims(h: usize, hkv: usize, hd: usize) -> AttnDims {
        AttnDims {
            heads: h,
            kv_heads: hkv,
            head_dim: hd,
        }
    }

    #[test]
    fn single_key_returns_its_value() {
        // One key: softmax is 1, output equals v regardless of q.
        let b = SeqBatch::single(1, 1);
        let out = attention_ref(
            &[3.0, -1.0],
            &[0.5, 2.0],
            &[7.0, -8.0],
            dims(1, 1, 2),
            &b,
            Mask::Causal,
        );
        assert_eq!(out, vec![7.0, -8.0]);
    }

    #[test]
    fn uniform_scores_average_values() {
        // q = 0: all scores equal, output is the mean of the visible values.
        let b = SeqBatch::single(3, 3);
        let v = [1.0, 2.0, 6.0];
        let under = |mask| attention_ref(&[0.0; 3], &[1.0, 2.0, 3.0], &v, dims(1, 1, 1), &b, mask);
        let out = under(Mask::Causal);
        let want = [1.0, 1.5, 3.0];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() < 1e-6, "{out:?}");
        }
        let full = under(Mask::Full);
        assert!(full.iter().all(|o| (o - 3.0).abs() < 1e-6));
        // Diagonal masked: row 0 sees nothing (zero), row 2 averages keys 0 and 1.
        let cross = under(Mask::CrossDiagonal);
        assert_eq!(cross[0], 0.0);
        assert!((cross[1] - 1.0).abs() < 1e-6 && (cross[2] - 1.5).abs() < 1e-6);
    }

    #[test]
    fn grouped_heads_share_kv() {
        // 2 query heads over 1 KV head: identical queries give identical outputs.
        let b = SeqBatch::single(1, 2);
        let out = attention_ref(
            &[1.0, 1.0],
            &[1.0, -1.0],
            &[4.0, 8.0],
            dims(2, 1, 1),
            &b,
            Mask::Full,
        );
        assert_eq!(out[0], out[1]);
    }

    #[test]
    fn mask_predicates_match_paper_definitions() {
        // Inverse block, window 3, offset 1: windows {0,1}, {2,3,4}, {5,6,7}, …
        let m = Mask::InverseBlock {
            window: 3,
            offset: 1,
        };
        assert!(!m.visible(4, 2) && !m.visible(4, 4) && m.visible(4, 1) && m.visible(5, 4));
        assert!(
            !m.visible(1, 0),
            "position 0 and 1 share the leading window"
        );
        // Offset 0, window 1 degenerates to the cross (diagonal-masked) mask.
        let w1 = Mask::InverseBlock {
            window: 1,
            offset: 0,
        };
        for qp in 0..6 {
            for kp in 0..6 {
                assert_eq!(w1.visible(qp, kp), Mask::CrossDiagonal.visible(qp, kp));
            }
        }
        // StreamingLLM window 2, sink 1: query 5 sees 0 (sink), 4, 5.
        let s = Mask::SlidingSink { window: 2, sink: 1 };
        let seen: Vec<u32> = (0..8).filter(|&kp| s.visible(5, kp)).collect();
        assert_eq!(seen, vec![0, 4, 5]);
    }

    #[test]
    fn tree_mask_sees_prefix_and_ancestors() {
        // Nodes: 0 root, 1 and 2 children of 0, 3 child of 2.
        let parents = [TREE_ROOT, 0, 0, 2];
        let b = SeqBatch::tree(2, &parents).unwrap();
        assert_eq!(b.q_pos, vec![2, 3, 3, 4]);
        let (bits, words) = b.ancestor_bits();
        assert_eq!(words, 1);
        assert_eq!(bits, vec![0b0001, 0b0011, 0b0101, 0b1101]);
        // Value = one-hot of the key index: output row shows which keys were seen.
        let n_keys = 6;
        let v: Vec<f32> = (0..n_keys * n_keys)
            .map(|i| if i % (n_keys + 1) == 0 { 1.0 } else { 0.0 })
            .collect();
        let q = vec![0.0; 4 * n_keys];
        let k = vec![0.0; n_keys * n_keys];
        let out = attention_ref(&q, &k, &v, dims(1, 1, n_keys), &b, Mask::Tree);
        let seen: Vec<Vec<usize>> = out
            .chunks(n_keys)
            .map(|r| (0..n_keys).filter(|&j| r[j] > 0.0).collect())
            .collect();
        assert_eq!(
            seen,
            vec![
                vec![0, 1, 2],
                vec![0, 1, 2, 3],
                vec![0, 1, 2, 4],
                vec![0, 1, 2, 4, 5]
            ]
        );
    }

    #[test]
    fn forward_parent_is_rejected() {
        assert!(SeqBatch::tree(0, &[TREE_ROOT, 2, 0]).is_err());
        assert!(
            SeqBatch::tree(0, &[0]).is_err(),
            "a node cannot be its own parent"
        );
    }
}
