//! Tree masks against the reference and, row for row, against decode rows:
//! every node's row of a verified tree has the bits of the decode row that
//! autoregressive decoding runs for it over its committed path, on both
//! layouts (plain tree masks, and tree masks over a sliding window); tree
//! tails; several trees in one batch. The helpers and strategies are the
//! parent module's.

use super::*;

/// Each node of `tree` (one sequence) as the decode row that autoregressive
/// decoding would run for it after committing its path: one sequence per
/// node, the committed keys then the path's keys (root first), the node's
/// query last (causal). Returns that batch and the rows of `tree`'s keys in
/// its key order.
fn paths_as_decode_rows(tree: &SeqBatch) -> (SeqBatch, Vec<usize>) {
    let n = tree.parents.len();
    let committed = tree.k_lens[0] - n;
    let mut b = SeqBatch::default();
    let mut key_rows = Vec::new();
    for node in 0..n {
        let mut path = vec![node];
        while tree.parents[*path.last().unwrap()] != TREE_ROOT {
            path.push(tree.parents[*path.last().unwrap()] as usize);
        }
        path.reverse();
        let tk = committed + path.len();
        key_rows.extend(0..committed);
        key_rows.extend(path.iter().map(|&p| committed + p));
        b.k_pos.extend(0..tk as u32);
        b.q_pos.push(tk as u32 - 1);
        b.q_lens.push(1);
        b.k_lens.push(tk);
    }
    (b, key_rows)
}

/// Runs a tree of `nodes` over `committed` keys (tree mask) and each node's
/// path as a decode row (causal mask) through `run` (a layout's launch on
/// `q, k, v` as f32 values), and fails unless every node's row has its
/// decode row's bits.
fn tree_rows_equal_decode_rows(
    dtype: DType,
    dims: AttnDims,
    committed: usize,
    nodes: usize,
    seed: u64,
    run: impl Fn(&SeqBatch, Mask, (&[f32], &[f32], &[f32])) -> draftc_ops::Result<Vec<f32>>,
) -> Result<(), TestCaseError> {
    let tree = tree_batch(committed, nodes, seed);
    let (decode, key_rows) = paths_as_decode_rows(&tree);
    let (q, k, v) = random_qkv(dims, nodes, tree.total_k(), seed, dtype);
    let (gk, gv) = (
        gather_rows(&k, &key_rows, dims),
        gather_rows(&v, &key_rows, dims),
    );
    let fail = |e: draftc_ops::OpsError| TestCaseError::fail(e.to_string());
    let got = run(&tree, Mask::Tree, (&q, &k, &v)).map_err(fail)?;
    let want = run(&decode, Mask::Causal, (&q, &gk, &gv)).map_err(fail)?;
    let w = dims.heads * dims.head_dim;
    for node in 0..nodes {
        let (a, b) = (&got[node * w..][..w], &want[node * w..][..w]);
        prop_assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{dims:?}: node {node} (parents {:?}) differs from its decode row: {:?} vs {:?}",
            tree.parents,
            &a[..4.min(w)],
            &b[..4.min(w)]
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(12))]

    /// Lossless speculation rests on this: the GPU layout gives a tree node's
    /// row the same bits as the decode row autoregressive decoding runs at
    /// that position over the same keys. The node's ancestors lie at gaps in
    /// the tree's key rows (siblings between them); a plane must still take
    /// the keys, and a split its keys, by their place on the path, as decode
    /// does, or the sums round differently and a near tie in f16 logits
    /// flips a greedy token (seen on an H100 at batch 16).
    #[test]
    fn plane_layout_tree_rows_equal_decode_rows_bit_for_bit(
        dtype in float_dtype(), dims in plane_dims_strategy(),
        committed in prop_oneof![Just(0usize), Just(37), 1..24usize],
        nodes in prop_oneof![Just(12usize), 2..40usize],
        seed in 0u64..1000,
        planes in prop_oneof![Just(2u32), Just(4)],
        chunk in prop_oneof![Just(3u32), Just(16), Just(256)],
    ) {
        tree_rows_equal_decode_rows(dtype, dims, committed, nodes, seed, |batch, mask, qkv| {
            run_planes(dtype, dims, batch, mask, qkv, planes, chunk)
        })?;
    }
}

/// The lane layout over `q, k, v` (f32 values, uploaded as `dtype`).
fn run_lanes(
    dtype: DType,
    dims: AttnDims,
    batch: &SeqBatch,
    mask: Mask,
    qkv: (&[f32], &[f32], &[f32]),
) -> draftc_ops::Result<Vec<f32>> {
    let client = test_client();
    let [qt, kt, vt, out] = upload(dims, dtype, qkv)?;
    attention(&client, &qt, &kt, &vt, dims, batch, mask, &out)?;
    out.download_f32(&client)
}

proptest! {
    #![proptest_config(config(8))]

    /// The lane layout keeps the same contract as the planes: a tree node's
    /// row has the bits of the decode row at its position, with a unit
    /// serving several query heads of one KV head (groups of 3 and 4).
    #[test]
    fn lane_layout_tree_rows_equal_decode_rows_bit_for_bit(
        dtype in float_dtype(), dims in dims_strategy(),
        committed in prop_oneof![Just(0usize), Just(37), 1..24usize],
        nodes in prop_oneof![Just(12usize), 2..30usize],
        seed in 0u64..1000,
    ) {
        tree_rows_equal_decode_rows(dtype, dims, committed, nodes, seed, |batch, mask, qkv| {
            run_lanes(dtype, dims, batch, mask, qkv)
        })?;
    }
}

proptest! {
    #![proptest_config(config(12))]

    /// Positional masks plus a tree tail (autoregressive tree drafting over
    /// a memory stream).
    #[test]
    fn tree_tail_matches_reference(
        dtype in float_dtype(), dims in dims_strategy(), mask in mask_strategy(),
        batch in batch_strategy(), seed in 0u64..1000,
    ) {
        check(dtype, dims, &with_tail(batch, seed), mask, seed)?;
    }
}

/// The tail is a real restriction: with every bit set it changes nothing,
/// with none set the tail keys are invisible (= the batch without them).
#[test]
fn tree_tail_semantics() {
    let dims = AttnDims {
        heads: 3,
        kv_heads: 1,
        head_dim: 8,
    };
    let base = SeqBatch::single(2, 6);
    let (q, k, v) = (
        random_f32(1, 2 * 3 * 8, -1.0, 1.0, DType::F32),
        random_f32(2, 6 * 8, -1.0, 1.0, DType::F32),
        random_f32(3, 6 * 8, -1.0, 1.0, DType::F32),
    );
    let all = SeqBatch {
        tail: Some(TreeTail::from_visible(vec![2], &[vec![0, 1], vec![0, 1]]).unwrap()),
        ..base.clone()
    };
    assert_eq!(
        attention_ref(&q, &k, &v, dims, &all, Mask::CrossDiagonal),
        attention_ref(&q, &k, &v, dims, &base, Mask::CrossDiagonal)
    );
    let none = SeqBatch {
        tail: Some(TreeTail::from_visible(vec![2], &[vec![], vec![]]).unwrap()),
        ..base.clone()
    };
    let mut short = SeqBatch::single(2, 4);
    short.q_pos = base.q_pos.clone();
    assert_eq!(
        attention_ref(&q, &k, &v, dims, &none, Mask::Full),
        attention_ref(&q, &k[..4 * 8], &v[..4 * 8], dims, &short, Mask::Full)
    );
    check(DType::F32, dims, &none, Mask::Full, 4).unwrap();
}

/// A random tree of `n` nodes over `committed` keys that is deep: node `i`
/// hangs off node `i - 1` or `i - 2` (two chains that keep branching), so
/// depths reach about `n / 2` and a sliding window shorter than the tree
/// cuts off ancestors as well as committed keys.
fn deep_tree_batch(committed: usize, n: usize, seed: u64) -> SeqBatch {
    let r = random_u32(seed, n, 1 << 16);
    let parents: Vec<u32> = (0..n)
        .map(|i| match i {
            0 => TREE_ROOT,
            1 if r[1].is_multiple_of(2) => TREE_ROOT,
            1 => 0,
            _ => (i - 1 - (r[i] % 2) as usize) as u32,
        })
        .collect();
    SeqBatch::tree(committed, &parents).unwrap()
}

/// A random tree: bushy ([`tree_batch`]) or deep ([`deep_tree_batch`]).
fn some_tree(committed: usize, n: usize, seed: u64, deep: bool) -> SeqBatch {
    if deep {
        deep_tree_batch(committed, n, seed)
    } else {
        tree_batch(committed, n, seed)
    }
}

/// Sliding windows shorter than the deep trees (so the window cuts inside
/// the tree) and longer ones, with and without sink keys.
fn tree_sliding_strategy() -> impl Strategy<Value = Mask> {
    (prop_oneof![1u32..6, 6u32..40], 0u32..3)
        .prop_map(|(window, sink)| Mask::TreeSliding { window, sink })
}

proptest! {
    #![proptest_config(config(16))]

    /// Tree verification of a sliding-window layer (Gemma 3's local layers):
    /// the lane kernel and the GPU plane layout against the reference.
    #[test]
    fn tree_sliding_mask_matches_reference(
        dtype in float_dtype(), dims in dims_strategy(), plane_dims in plane_dims_strategy(),
        committed in prop_oneof![Just(0usize), Just(1), Just(50), 0..40usize],
        nodes in prop_oneof![Just(1usize), Just(3), Just(33), Just(64), 1..20usize],
        deep in any::<bool>(), mask in tree_sliding_strategy(), seed in 0u64..1000,
        layout in plane_layout(),
    ) {
        let batch = some_tree(committed, nodes, seed, deep);
        check(dtype, dims, &batch, mask, seed)?;
        check_as(dtype, plane_dims, &batch, mask, seed, Some(layout))?;
    }

    /// What lossless verification of a sliding-window layer needs: every
    /// node's row, on either kernel layout and in the reference, has the
    /// bits of the decode row autoregressive decoding runs at its position
    /// over its committed path under the plain sliding-window mask (the
    /// window covers ancestors and committed keys alike; sibling branches
    /// are never seen).
    #[test]
    fn tree_sliding_rows_equal_sliding_decode_rows(
        dtype in float_dtype(), dims in plane_dims_strategy(),
        committed in prop_oneof![Just(0usize), Just(37), 1..24usize],
        nodes in prop_oneof![Just(12usize), 2..40usize],
        deep in any::<bool>(), mask in tree_sliding_strategy(), seed in 0u64..1000,
        planes in prop_oneof![Just(2u32), Just(4)],
        chunk in prop_oneof![Just(3u32), Just(16), Just(256)],
    ) {
        let Mask::TreeSliding { window, sink } = mask else { unreachable!() };
        let tree = some_tree(committed, nodes, seed, deep);
        let (decode, key_rows) = paths_as_decode_rows(&tree);
        let sliding = Mask::SlidingSink { window, sink };
        let (hd, tk) = (dims.head_dim, tree.total_k());
        let (q, k, v) = random_qkv(dims, nodes, tk, seed, dtype);
        let gather = |x: &[f32]| gather_rows(x, &key_rows, dims);
        let (dk, dv) = (gather(&k), gather(&v));
        let fail = |e: draftc_ops::OpsError| TestCaseError::fail(e.to_string());
        let lanes = |b: &SeqBatch, m: Mask, k: &[f32], v: &[f32]| {
            let client = test_client();
            let [qt, kt, vt, out] = upload(dims, dtype, (&q, k, v))?;
            attention(&client, &qt, &kt, &vt, dims, b, m, &out)?;
            out.download_f32(&client)
        };
        let runs = [
            (
                "reference",
                attention_ref(&q, &k, &v, dims, &tree, mask),
                attention_ref(&q, &dk, &dv, dims, &decode, sliding),
            ),
            (
                "lanes",
                lanes(&tree, mask, &k, &v).map_err(fail)?,
                lanes(&decode, sliding, &dk, &dv).map_err(fail)?,
            ),
            (
                "planes",
                run_planes(dtype, dims, &tree, mask, (&q, &k, &v), planes, chunk)
                    .map_err(fail)?,
                run_planes(dtype, dims, &decode, sliding, (&q, &dk, &dv), planes, chunk)
                    .map_err(fail)?,
            ),
        ];
        let w = dims.heads * hd;
        for (what, got, want) in runs {
            for node in 0..nodes {
                let (a, b) = (&got[node * w..][..w], &want[node * w..][..w]);
                prop_assert!(
                    a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{what}: node {node} (parents {:?}, {mask:?}) differs from its decode row: \
                     {:?} vs {:?}",
                    tree.parents, &a[..4.min(w)], &b[..4.min(w)]
                );
            }
        }
    }
}

/// A window that covers every key makes `TreeSliding` the tree mask (same
/// bits on both kernels); a short one really restricts it.
#[test]
fn tree_sliding_with_a_wide_window_is_the_tree_mask() {
    let dims = AttnDims {
        heads: 3,
        kv_heads: 1,
        head_dim: 2 * plane() as usize,
    };
    let batch = deep_tree_batch(9, 20, 5);
    let (tq, tk) = (batch.total_q(), batch.total_k());
    let (q, k, v) = random_qkv(dims, tq, tk, 1, DType::F32);
    let client = test_client();
    let lanes = |mask: Mask| {
        let [qt, kt, vt, out] = upload(dims, DType::F32, (&q, &k, &v)).unwrap();
        attention(&client, &qt, &kt, &vt, dims, &batch, mask, &out).unwrap();
        out.download_f32(&client).unwrap()
    };
    let planes =
        |mask: Mask| run_planes(DType::F32, dims, &batch, mask, (&q, &k, &v), 2, 16).unwrap();
    let wide = Mask::TreeSliding {
        window: tk as u32,
        sink: 0,
    };
    let short = Mask::TreeSliding { window: 3, sink: 1 };
    let bits = |x: Vec<f32>| x.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(
        attention_ref(&q, &k, &v, dims, &batch, wide),
        attention_ref(&q, &k, &v, dims, &batch, Mask::Tree)
    );
    assert_eq!(bits(lanes(wide)), bits(lanes(Mask::Tree)), "lanes");
    assert_eq!(bits(planes(wide)), bits(planes(Mask::Tree)), "planes");
    assert_ne!(
        attention_ref(&q, &k, &v, dims, &batch, short),
        attention_ref(&q, &k, &v, dims, &batch, Mask::Tree)
    );
    check(DType::F32, dims, &batch, short, 6).unwrap();
}

/// `TreeSliding` compiles to its own kernels (the sliding-window predicate
/// with the tree flag), on both layouts and both backends; the tree and
/// sliding-window kernels keep their sources.
#[test]
fn tree_sliding_is_its_own_kernel_source() {
    use draftc_ops::source::{source, Backend, KernelSpec, MaskKind};
    for backend in [Backend::Wgsl, Backend::Cuda] {
        for gpu in [false, true] {
            let src = |m| {
                let spec = if gpu {
                    KernelSpec::attention_planes(DType::F16, 64, 8, 2, m)
                } else {
                    KernelSpec::attention(DType::F16, 64, 3, m)
                };
                source(&spec, backend).unwrap()
            };
            let (tree, sliding, both) = (
                src(MaskKind::Tree),
                src(MaskKind::SlidingSink),
                src(MaskKind::TreeSliding),
            );
            assert!(
                both != tree && both != sliding && tree != sliding,
                "{backend:?} planes {gpu}"
            );
        }
    }
    let m = Mask::TreeSliding { window: 3, sink: 1 };
    assert_eq!(MaskKind::from(m), MaskKind::TreeSliding);
    assert!(m.is_tree() && Mask::Tree.is_tree());
    assert!(!Mask::SlidingSink { window: 3, sink: 1 }.is_tree());
}

/// Two trees of different sizes in one batch (the runtime's batched verify).
#[test]
fn batched_trees_match_reference() {
    let (a, b) = (tree_batch(10, 7, 1), tree_batch(3, 40, 2));
    let mut batch = a.clone();
    batch.q_lens.extend(&b.q_lens);
    batch.k_lens.extend(&b.k_lens);
    batch.q_pos.extend(&b.q_pos);
    batch.k_pos.extend(&b.k_pos);
    batch.parents.extend(&b.parents);
    let dims = AttnDims {
        heads: 9,
        kv_heads: 3,
        head_dim: 64,
    };
    check(DType::F32, dims, &batch, Mask::Tree, 7).unwrap();
    for (window, sink) in [(1, 0), (4, 1), (12, 2)] {
        check(
            DType::F32,
            dims,
            &batch,
            Mask::TreeSliding { window, sink },
            8,
        )
        .unwrap();
    }
}
