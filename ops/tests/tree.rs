//! Tree acceptance on the wgpu runtime: greedy equals a brute-force oracle,
//! sampling equals the reference (up to decisions within rounding of their
//! threshold), the first emitted token passes a chi-square test against the
//! target distribution whatever the draft distribution, and bad trees are
//! errors.

use draftc_ops::attention::TREE_ROOT;
use draftc_ops::testing::{config, random_f32, random_u32, test_client};
use draftc_ops::tree::{accept_ref, accept_tree, accept_trees, argmax, AcceptMode, Acceptance};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

type R = draftc_ops::testing::TestRuntime;

/// Random tree of `n` nodes whose siblings carry distinct tokens.
fn random_tree(n: usize, vocab: usize, seed: u64) -> (Vec<u32>, Vec<u32>) {
    let r = random_u32(seed, 2 * n, 1 << 20);
    let mut parents = vec![TREE_ROOT];
    let mut tokens = vec![r[0] % vocab as u32];
    for i in 1..n {
        let mut p = r[2 * i] % i as u32;
        if (1..i).filter(|&j| parents[j] == p).count() >= vocab {
            p = i as u32 - 1; // node i-1 has no children yet
        }
        let used: Vec<u32> = (1..i)
            .filter(|&j| parents[j] == p)
            .map(|j| tokens[j])
            .collect();
        let mut t = r[2 * i + 1] % vocab as u32;
        while used.contains(&t) && used.len() < vocab {
            t = (t + 1) % vocab as u32;
        }
        parents.push(p);
        tokens.push(t);
    }
    (tokens, parents)
}

/// Logits where each node's argmax is, with probability ~2/3, the token of
/// one of its children (so paths of several nodes get accepted).
fn steering_logits(
    tokens: &[u32],
    parents: &[u32],
    vocab: usize,
    dtype: DType,
    seed: u64,
) -> Vec<f32> {
    let n = tokens.len();
    let mut l = random_f32(seed, n * vocab, -1.0, 1.0, dtype);
    let r = random_u32(seed + 9, n, 3);
    for node in 0..n {
        let kids: Vec<usize> = (1..n).filter(|&c| parents[c] as usize == node).collect();
        if !kids.is_empty() && r[node] != 0 {
            l[node * vocab + tokens[kids[node % kids.len()]] as usize] = 4.0;
        }
    }
    l
}

/// Brute force: a node is consistent if every node on its root path carries
/// its parent's argmax; with distinct sibling tokens the consistent nodes form
/// one chain, and the answer is the deepest.
fn brute_force_greedy(tokens: &[u32], parents: &[u32], logits: &[f32], vocab: usize) -> Acceptance {
    let am = |i: usize| argmax(&logits[i * vocab..(i + 1) * vocab]);
    let mut best: Vec<u32> = Vec::new();
    for node in 1..tokens.len() {
        let mut path = vec![];
        let mut cur = node;
        let mut ok = true;
        while cur != 0 {
            let p = parents[cur] as usize;
            ok &= tokens[cur] == am(p);
            path.push(cur as u32);
            cur = p;
        }
        path.reverse();
        if ok && path.len() > best.len() {
            best = path;
        }
    }
    let last = best.last().map_or(0, |&x| x as usize);
    Acceptance {
        accepted: best,
        bonus: am(last),
    }
}

fn upload(data: &[f32], shape: &[usize], dtype: DType) -> DeviceTensor<R> {
    DeviceTensor::upload_f32(&test_client(), data, shape, dtype).unwrap()
}

/// A draft distribution per node: random, normalised.
fn random_q(n: usize, vocab: usize, seed: u64) -> Vec<f32> {
    let raw = random_f32(seed, n * vocab, 0.0, 1.0, DType::F32);
    raw.chunks(vocab)
        .flat_map(|r| {
            let s: f32 = r.iter().sum();
            r.iter().map(move |x| x / s)
        })
        .collect()
}

proptest! {
    #![proptest_config(config(12))]

    #[test]
    fn greedy_matches_brute_force(
        n in prop_oneof![Just(1usize), Just(3), Just(33), Just(64), 1..20usize],
        vocab in prop_oneof![Just(3usize), Just(50), Just(783), 2..100usize],
        f16 in any::<bool>(), seed in 0u64..10_000,
    ) {
        let dtype = if f16 { DType::F16 } else { DType::F32 };
        let (tokens, parents) = random_tree(n, vocab, seed);
        let logits = steering_logits(&tokens, &parents, vocab, dtype, seed);
        let got = accept_tree(&test_client(), &tokens, &parents, &upload(&logits, &[n, vocab], dtype), None, AcceptMode::Greedy).unwrap();
        prop_assert_eq!(&got, &brute_force_greedy(&tokens, &parents, &logits, vocab));
        prop_assert_eq!(&got, &accept_ref(&tokens, &parents, &logits, None, vocab, AcceptMode::Greedy).acceptance);
    }

    #[test]
    fn sampling_matches_reference(
        n in prop_oneof![Just(1usize), Just(3), Just(33), 1..20usize],
        vocab in prop_oneof![Just(3usize), Just(50), Just(783), 2..100usize],
        with_q in any::<bool>(), f16 in any::<bool>(), temperature in 0.3f32..2.0, seed in 0u64..10_000,
    ) {
        let dtype = if f16 { DType::F16 } else { DType::F32 };
        let (tokens, parents) = random_tree(n, vocab, seed);
        let logits = steering_logits(&tokens, &parents, vocab, dtype, seed);
        let q = random_q(n, vocab, seed + 3);
        let q = draftc_ops::testing::round_to(dtype, &q);
        let mode = AcceptMode::Sampling { temperature, seed, step: 11 };
        let qt = with_q.then(|| upload(&q, &[n, vocab], dtype));
        let got = accept_tree(&test_client(), &tokens, &parents, &upload(&logits, &[n, vocab], dtype), qt.as_ref(), mode).unwrap();
        let want = accept_ref(&tokens, &parents, &logits, with_q.then_some(&q[..]), vocab, mode);
        prop_assert!(got == want.acceptance || want.margin < 1e-4, "kernel {:?} vs reference {:?}", got, want);
    }
}

/// Pearson chi-square statistic of `counts` against probabilities `p`.
fn chi_square(counts: &[u64], p: &[f64]) -> f64 {
    let total: u64 = counts.iter().sum();
    counts
        .iter()
        .zip(p)
        .map(|(&c, &pi)| {
            let e = pi * total as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

/// 99.9% quantile of chi-square with 7 degrees of freedom (V = 8 bins).
const CHI2_7_999: f64 = 24.32;

/// The first emitted token (first accepted child's token, else the bonus)
/// must be distributed as the target's `p = softmax(logits[root] / T)`,
/// whatever `q` is. 4000 trials, one batched launch per scenario, fixed seeds.
#[test]
fn sampling_first_token_has_target_distribution() {
    const V: usize = 8;
    const TRIALS: usize = 4000;
    let temperature = 0.8f32;
    // Tree: root, 3 children drafted from q[root], each child has 1 child.
    let parents1 = [TREE_ROOT, 0, 0, 0, 1, 2, 3];
    let n = parents1.len();
    let logits1: Vec<f32> = random_f32(42, n * V, -2.0, 2.0, DType::F32);
    let p: Vec<f64> = {
        let e: Vec<f64> = logits1[..V]
            .iter()
            .map(|&l| ((l / temperature) as f64).exp())
            .collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|x| x / s).collect()
    };
    // q: far from p (peaked on the least likely target token), and random.
    let mut peaked = vec![0.02f32; V];
    let low = (0..V).min_by(|&a, &b| p[a].total_cmp(&p[b])).unwrap();
    peaked[low] = 1.0 - 0.02 * (V - 1) as f32;
    for (name, q_root) in [
        ("peaked q", Some(peaked)),
        ("random q", Some(random_q(1, V, 7))),
        ("no q", None),
    ] {
        let draws = random_u32(1000, TRIALS * n, 1 << 24);
        let mut tokens = Vec::with_capacity(TRIALS * n);
        let mut drafted_first = vec![0u64; V];
        for t in 0..TRIALS {
            for i in 0..n {
                let tok = match &q_root {
                    // inverse CDF of q_root with a host uniform: an i.i.d. draft
                    Some(q) => {
                        let u = draws[t * n + i] as f32 / (1u32 << 24) as f32;
                        let mut acc = 0.0;
                        (0..V)
                            .find(|&v| {
                                acc += q[v];
                                acc > u
                            })
                            .unwrap_or(V - 1) as u32
                    }
                    None => [0u32, 3, 5, 1, 2, 4, 6][i],
                };
                tokens.push(tok);
            }
            drafted_first[tokens[t * n + 1] as usize] += 1;
        }
        let q_all: Option<Vec<f32>> = q_root
            .as_ref()
            .map(|q| (0..TRIALS * n).flat_map(|_| q.clone()).collect());
        let logits_all: Vec<f32> = (0..TRIALS).flat_map(|_| logits1.clone()).collect();
        let parents_all: Vec<u32> = (0..TRIALS).flat_map(|_| parents1).collect();
        let qt = q_all
            .as_ref()
            .map(|q| upload(q, &[TRIALS, n, V], DType::F32));
        let mode = AcceptMode::Sampling {
            temperature,
            seed: 0x5eed,
            step: 0,
        };
        let out = accept_trees(
            &test_client(),
            &tokens,
            &parents_all,
            &upload(&logits_all, &[TRIALS, n, V], DType::F32),
            qt.as_ref(),
            mode,
        )
        .unwrap();
        let mut counts = vec![0u64; V];
        for (t, a) in out.iter().enumerate() {
            let first = a
                .accepted
                .first()
                .map_or(a.bonus, |&c| tokens[t * n + c as usize]);
            counts[first as usize] += 1;
        }
        let chi2 = chi_square(&counts, &p);
        assert!(
            chi2 < CHI2_7_999,
            "{name}: chi-square {chi2:.2} >= {CHI2_7_999} (counts {counts:?}, p {p:?})"
        );
        if q_root.is_some() {
            // Power check: the drafted tokens themselves are far from p.
            let chi2_draft = chi_square(&drafted_first, &p);
            assert!(chi2_draft > 10.0 * CHI2_7_999, "{name}: draft distribution too close to p for the test to mean anything ({chi2_draft:.1})");
        }
    }
}

#[test]
fn invalid_trees_are_errors() {
    let client = test_client();
    let logits = upload(&[0.0; 12], &[3, 4], DType::F32);
    let g = AcceptMode::Greedy;
    let ok = accept_tree(&client, &[0, 1, 2], &[TREE_ROOT, 0, 1], &logits, None, g);
    assert!(ok.is_ok(), "{ok:?}");
    let empty = upload(&[], &[0, 4], DType::F32);
    assert!(matches!(
        accept_tree(&client, &[], &[], &empty, None, g),
        Err(OpsError::EmptyInput { .. })
    ));
    assert!(matches!(
        accept_tree(&client, &[0, 1, 2], &[TREE_ROOT, 2, 0], &logits, None, g),
        Err(OpsError::IndexOutOfRange { .. })
    ));
    assert!(
        accept_tree(&client, &[0, 1, 2], &[0, 0, 1], &logits, None, g).is_err(),
        "root must be TREE_ROOT"
    );
    assert!(matches!(
        accept_tree(&client, &[0, 1], &[TREE_ROOT, 0], &logits, None, g),
        Err(OpsError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        accept_tree(&client, &[0, 9, 2], &[TREE_ROOT, 0, 1], &logits, None, g),
        Err(OpsError::IndexOutOfRange { .. })
    ));
    let q_bad = upload(&[0.25; 8], &[2, 4], DType::F32);
    let s = AcceptMode::Sampling {
        temperature: 1.0,
        seed: 1,
        step: 0,
    };
    assert!(matches!(
        accept_tree(
            &client,
            &[0, 1, 2],
            &[TREE_ROOT, 0, 1],
            &logits,
            Some(&q_bad),
            s
        ),
        Err(OpsError::ShapeMismatch { .. })
    ));
    let t0 = AcceptMode::Sampling {
        temperature: 0.0,
        seed: 1,
        step: 0,
    };
    assert!(matches!(
        accept_tree(&client, &[0, 1, 2], &[TREE_ROOT, 0, 1], &logits, None, t0),
        Err(OpsError::InvalidArgument { .. })
    ));
}
