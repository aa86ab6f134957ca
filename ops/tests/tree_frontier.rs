//! One dynamic-tree expansion on the device against the reference: picks
//! (ties to the lower entry), tokens and tail bits exactly, scores to
//! rounding (the device's and the host's `ln` may differ in the last bit);
//! zero probabilities and exact ties included; bad shapes are errors.

use draftc_ops::testing::{config, float_dtype, random_f32, random_u32, test_client, TestRuntime};
use draftc_ops::tree_frontier::{expand_frontier, reference, Frontier};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

type T = DeviceTensor<TestRuntime>;

struct Case {
    seqs: usize,
    rows: usize,
    w: usize,
    f: usize,
    words_in: usize,
    words_out: usize,
    tail_base: u32,
    probs: Vec<f32>,
    ids: Vec<u32>,
    cum: Vec<f32>,
    vis: Vec<u32>,
}

/// Picks, tokens, scores and tail bits read back.
type Expanded = (Vec<u32>, Vec<u32>, Vec<f32>, Vec<u32>);

fn run(c: &Case, dtype: DType) -> Result<Expanded, OpsError> {
    let client = test_client();
    let total = c.seqs * c.rows;
    let probs = T::upload_f32(&client, &c.probs, &[total, c.w], dtype)?;
    let ids = T::upload_u32(&client, &c.ids, &[total, c.w])?;
    let cum = T::upload_f32(&client, &c.cum, &[total], DType::F32)?;
    let vis = T::upload_u32(&client, &c.vis, &[total, c.words_in])?;
    let n = c.seqs * c.f;
    let next_ids = T::empty(&client, &[n], DType::U32);
    let next_cum = T::empty(&client, &[n], DType::F32);
    let next_vis = T::empty(&client, &[n, c.words_out], DType::U32);
    let picks = T::empty(&client, &[n], DType::U32);
    let out = Frontier {
        next_ids: &next_ids,
        next_cum: &next_cum,
        next_vis: &next_vis,
        picks: &picks,
    };
    expand_frontier(
        &client,
        &probs,
        &ids,
        &cum,
        &vis,
        c.seqs,
        c.f,
        c.tail_base,
        out,
    )?;
    Ok((
        picks.download_u32(&client)?,
        next_ids.download_u32(&client)?,
        next_cum.download_f32(&client)?,
        next_vis.download_u32(&client)?,
    ))
}

fn case(
    seed: u64,
    seqs: usize,
    rows: usize,
    w: usize,
    f_frac: f64,
    tail_base: u32,
    dtype: DType,
) -> Case {
    let total = seqs * rows;
    let f = 1 + ((rows * w - 1) as f64 * f_frac) as usize;
    let words_in = 1 + (seed % 2) as usize;
    let words_out = (tail_base as usize + rows).div_ceil(32).max(1) + (seed >> 1) as usize % 2;
    let mut probs = random_f32(seed, total * w, 0.0, 1.0, dtype);
    for (i, p) in probs.iter_mut().enumerate() {
        match (seed >> 2).wrapping_add(i as u64) % 7 {
            0 => *p = 0.0,              // never positive: the floor
            1 if i % w > 0 => *p = -*p, // negative: the floor too
            _ => {}
        }
    }
    if seed.is_multiple_of(3) {
        // Exact ties within a row: equal scores, the lower entry first.
        for r in 0..total {
            if w > 1 {
                probs[r * w + 1] = probs[r * w];
            }
        }
    }
    Case {
        seqs,
        rows,
        w,
        f,
        words_in,
        words_out,
        tail_base,
        ids: random_u32(seed ^ 3, total * w, 50_000),
        cum: random_f32(seed ^ 1, total, -6.0, 0.0, DType::F32),
        vis: random_u32(seed ^ 2, total * words_in, u32::MAX),
        probs,
    }
}

proptest! {
    #![proptest_config(config(24))]

    #[test]
    fn expansion_matches_reference(seqs in 1usize..6, rows in 1usize..6, w in 1usize..7,
                                   f_frac in 0.0f64..1.0, tail_base in 0u32..40,
                                   dtype in float_dtype(), seed in any::<u64>()) {
        let c = case(seed, seqs, rows, w, f_frac, tail_base, dtype);
        let (picks, ids, cum, vis) = run(&c, dtype).unwrap();
        for s in 0..c.seqs {
            let rs = s * c.rows..(s + 1) * c.rows;
            let want = reference::expand(
                &c.probs[rs.start * c.w..rs.end * c.w],
                &c.ids[rs.start * c.w..rs.end * c.w],
                &c.cum[rs.clone()],
                &c.vis[rs.start * c.words_in..rs.end * c.words_in],
                c.w, c.f, c.words_out, c.tail_base,
            );
            for (i, (e, tok, score, bits)) in want.iter().enumerate() {
                let o = s * c.f + i;
                prop_assert_eq!(picks[o], *e, "seq {} pick {}", s, i);
                prop_assert_eq!(ids[o], *tok);
                prop_assert!((cum[o] - score).abs() <= 1e-5 * score.abs().max(1.0),
                             "seq {s} pick {i}: {} vs {}", cum[o], score);
                prop_assert_eq!(&vis[o * c.words_out..(o + 1) * c.words_out], bits.as_slice());
            }
        }
    }
}

#[test]
fn bad_shapes_are_errors() {
    let mut c = case(5, 2, 3, 2, 0.5, 0, DType::F32);
    c.f = 7; // more than rows · w = 6
    assert!(matches!(
        run(&c, DType::F32),
        Err(OpsError::InvalidArgument { .. })
    ));
    let mut c = case(5, 2, 3, 2, 0.5, 30, DType::F32);
    c.words_out = 1; // tail keys 30..=32 need two words
    assert!(matches!(
        run(&c, DType::F32),
        Err(OpsError::InvalidArgument { .. })
    ));
}
