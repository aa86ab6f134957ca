//! Fused attention kernel vs `attention_ref` on the wgpu runtime: every mask
//! kind, grouped-query heads, batches of ragged sequences, f32 and f16, on
//! both layouts; a softmax scale set on the metadata (both layouts) vs
//! `attention_ref_scaled`; draft-dim chunking is bit-identical to one launch;
//! invalid input is an `Err`, never a launch. Tree rows against decode rows
//! bit for bit, tree tails and trees over sliding windows: [`trees`].
use draftc_ops::attention::{
    attention, attention_planes, attention_ref, attention_ref_scaled, attention_rows,
    draft_dim_attention, AttnDims, AttnMeta, AttnPlaneShape, Mask, SeqBatch, TreeTail, TREE_ROOT,
};
use draftc_ops::testing::{assert_close, config, float_dtype, random_f32, random_u32, test_client};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

type R = draftc_ops::testing::TestRuntime;

mod trees;

/// Runs kernel and reference on random data and compares them.
fn check(
    dtype: DType,
    dims: AttnDims,
    batch: &SeqBatch,
    mask: Mask,
    seed: u64,
) -> Result<(), TestCaseError> {
    check_as(dtype, dims, batch, mask, seed, None)
}

/// Random queries for `tq` rows and keys and values for `tk` rows of
/// `dims` (seeds `seed`, `seed + 1`, `seed + 2`), rounded to `dtype`.
fn random_qkv(
    dims: AttnDims,
    tq: usize,
    tk: usize,
    seed: u64,
    dtype: DType,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (qn, kn) = (
        tq * dims.heads * dims.head_dim,
        tk * dims.kv_heads * dims.head_dim,
    );
    (
        random_f32(seed, qn, -2.0, 2.0, dtype),
        random_f32(seed + 1, kn, -2.0, 2.0, dtype),
        random_f32(seed + 2, kn, -1.0, 1.0, dtype),
    )
}

/// The K or V rows `key_rows` of `x` (`[rows, kv_heads · head_dim]`).
fn gather_rows(x: &[f32], key_rows: &[usize], dims: AttnDims) -> Vec<f32> {
    let w = dims.kv_heads * dims.head_dim;
    key_rows
        .iter()
        .flat_map(|&r| x[r * w..(r + 1) * w].to_vec())
        .collect()
}

/// `data` (f32 values, uploaded as `dtype`) as rows of `heads` heads of
/// `head_dim`.
fn heads_tensor(
    data: &[f32],
    heads: usize,
    head_dim: usize,
    dtype: DType,
) -> draftc_ops::Result<DeviceTensor<R>> {
    let rows = data.len() / (heads * head_dim);
    DeviceTensor::upload_f32(&test_client(), data, &[rows, heads, head_dim], dtype)
}

/// `q, k, v` (f32 values, uploaded as `dtype`) in their layouts, then an
/// output poisoned with NaN so that a kernel that never ran cannot pass.
fn upload(
    dims: AttnDims,
    dtype: DType,
    (q, k, v): (&[f32], &[f32], &[f32]),
) -> draftc_ops::Result<[DeviceTensor<R>; 4]> {
    let hd = dims.head_dim;
    Ok([
        heads_tensor(q, dims.heads, hd, dtype)?,
        heads_tensor(k, dims.kv_heads, hd, dtype)?,
        heads_tensor(v, dims.kv_heads, hd, dtype)?,
        heads_tensor(&vec![f32::NAN; q.len()], dims.heads, hd, dtype)?,
    ])
}

/// The test device's plane size (8 on lavapipe).
fn plane() -> u32 {
    test_client().properties().hardware.plane_size_max
}

/// [`check`] with the GPU layout `(planes, chunk)` when given.
fn check_as(
    dtype: DType,
    dims: AttnDims,
    batch: &SeqBatch,
    mask: Mask,
    seed: u64,
    layout: Option<(u32, u32)>,
) -> Result<(), TestCaseError> {
    check_scaled(dtype, dims, batch, mask, seed, layout, None)
}

/// [`check_as`] with the softmax scale `scale` set on the metadata
/// ([`AttnMeta::with_scale`]) when given, against [`attention_ref_scaled`].
fn check_scaled(
    dtype: DType,
    dims: AttnDims,
    batch: &SeqBatch,
    mask: Mask,
    seed: u64,
    layout: Option<(u32, u32)>,
    scale: Option<f32>,
) -> Result<(), TestCaseError> {
    let client = test_client();
    let (tq, tk) = (batch.total_q(), batch.total_k());
    let (q, k, v) = random_qkv(dims, tq, tk, seed, dtype);
    let got = match layout {
        None => {
            let [qt, kt, vt, out] = upload(dims, dtype, (&q, &k, &v)).unwrap();
            match scale {
                None => attention(&client, &qt, &kt, &vt, dims, batch, mask, &out),
                Some(s) => AttnMeta::new(&client, batch, mask)
                    .and_then(|m| m.with_scale(s))
                    .and_then(|m| attention_rows(&client, &qt, &kt, &vt, dims, &m, 0..tq, &out)),
            }
            .and_then(|()| out.download_f32(&client))
        }
        Some((planes, chunk)) => {
            let qkv = (&q[..], &k[..], &v[..]);
            run_planes_scaled(dtype, dims, batch, mask, qkv, planes, chunk, scale)
        }
    }
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let want = match scale {
        None => attention_ref(&q, &k, &v, dims, batch, mask),
        Some(s) => attention_ref_scaled(&q, &k, &v, dims, batch, mask, s as f64),
    };
    assert_close(
        &format!("{mask:?} {dims:?} {dtype} {layout:?} scale {scale:?}"),
        &got,
        &want,
        dtype,
    )
}

/// The GPU layout (`planes` planes a cube, splits of `chunk` keys) on
/// `q, k, v` (f32 values, uploaded as `dtype`); the output as f32, poisoned
/// beforehand so that a kernel that never ran cannot pass.
fn run_planes(
    dtype: DType,
    dims: AttnDims,
    batch: &SeqBatch,
    mask: Mask,
    qkv: (&[f32], &[f32], &[f32]),
    planes: u32,
    chunk: u32,
) -> draftc_ops::Result<Vec<f32>> {
    run_planes_scaled(dtype, dims, batch, mask, qkv, planes, chunk, None)
}

/// [`run_planes`] with the softmax scale `scale` set on the metadata when
/// given.
#[allow(clippy::too_many_arguments)]
fn run_planes_scaled(
    dtype: DType,
    dims: AttnDims,
    batch: &SeqBatch,
    mask: Mask,
    (q, k, v): (&[f32], &[f32], &[f32]),
    planes: u32,
    chunk: u32,
    scale: Option<f32>,
) -> draftc_ops::Result<Vec<f32>> {
    let client = test_client();
    let [qt, kt, vt, out] = upload(dims, dtype, (q, k, v))?;
    let shape = AttnPlaneShape {
        plane: plane(),
        planes,
        chunk,
    };
    let mut meta = AttnMeta::new(&client, batch, mask)?;
    if let Some(s) = scale {
        meta = meta.with_scale(s)?;
    }
    let rows = 0..meta.total_q();
    attention_planes(&client, &qt, &kt, &vt, dims, &meta, rows, &out, shape)?;
    out.download_f32(&client)
}

/// Dimensions the plane layout takes on the test device's planes (8 lanes
/// on lavapipe, 32 on CUDA): head_dim a multiple of the plane size, at
/// most 8 per lane; groups of 1 or 3.
fn plane_dims_strategy() -> impl Strategy<Value = AttnDims> {
    let p = plane() as usize;
    (
        prop_oneof![Just(1usize), Just(3)],
        prop_oneof![Just(p), Just(2 * p), Just(64.max(p))],
        0..2usize,
    )
        .prop_map(|(kv_heads, head_dim, g)| AttnDims {
            heads: kv_heads * [1, 3][g],
            kv_heads,
            head_dim,
        })
}

fn plane_layout() -> impl Strategy<Value = (u32, u32)> {
    (
        prop_oneof![Just(1u32), Just(2), Just(4)],
        prop_oneof![Just(3u32), Just(16), Just(256)],
    )
}

proptest! {
    #![proptest_config(config(16))]

    /// The GPU layout (a plane per row, KV head and key split; splits
    /// merged by the combine kernel) against the reference, every mask.
    #[test]
    fn plane_layout_matches_reference(
        dtype in float_dtype(), dims in plane_dims_strategy(), mask in mask_strategy(),
        batch in batch_strategy(), seed in 0u64..1000, layout in plane_layout(),
    ) {
        check_as(dtype, dims, &batch, mask, seed, Some(layout))?;
    }

    #[test]
    fn plane_layout_tree_masks_match_reference(
        dtype in float_dtype(), dims in plane_dims_strategy(),
        committed in prop_oneof![Just(0usize), Just(50), 0..40usize],
        nodes in prop_oneof![Just(1usize), Just(33), 1..20usize],
        seed in 0u64..1000, layout in plane_layout(), tail in any::<bool>(),
    ) {
        let batch = tree_batch(committed, nodes, seed);
        check_as(dtype, dims, &batch, Mask::Tree, seed, Some(layout))?;
        if tail {
            let b = with_tail(batch_from_tree(&batch), seed);
            check_as(dtype, dims, &b, Mask::Causal, seed, Some(layout))?;
        }
    }
}

proptest! {
    #![proptest_config(config(12))]

    /// A softmax scale set on the metadata (Gemma 3's
    /// `query_pre_attn_scalar^-0.5`) replaces `1/√head_dim` on the lane
    /// kernel (any head size) and on the GPU plane layout.
    #[test]
    fn metadata_scale_matches_scaled_reference(
        dtype in float_dtype(), dims in dims_strategy(), plane_dims in plane_dims_strategy(),
        mask in mask_strategy(), batch in batch_strategy(), seed in 0u64..1000,
        layout in plane_layout(), scale in 0.05f32..1.0,
    ) {
        check_scaled(dtype, dims, &batch, mask, seed, None, Some(scale))?;
        check_scaled(dtype, plane_dims, &batch, mask, seed, Some(layout), Some(scale))?;
    }
}

/// Setting the default scale `1/√head_dim` explicitly changes no bit on
/// either layout.
#[test]
fn default_scale_set_explicitly_is_bit_identical() {
    let client = test_client();
    let p = plane() as usize;
    let dims = AttnDims {
        heads: 6,
        kv_heads: 2,
        head_dim: 2 * p,
    };
    let batch = SeqBatch::single(5, 40);
    let (tq, tk, hd) = (batch.total_q(), batch.total_k(), dims.head_dim);
    let (q, k, v) = random_qkv(dims, tq, tk, 1, DType::F16);
    let default = 1.0 / (hd as f32).sqrt();
    let fused = |scale: Option<f32>| {
        let [qt, kt, vt, out] = upload(dims, DType::F16, (&q, &k, &v)).unwrap();
        let mut meta = AttnMeta::new(&client, &batch, Mask::Causal).unwrap();
        if let Some(s) = scale {
            meta = meta.with_scale(s).unwrap();
        }
        attention_rows(&client, &qt, &kt, &vt, dims, &meta, 0..tq, &out).unwrap();
        out.download_f32(&client).unwrap()
    };
    let bits = |x: Vec<f32>| x.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    assert_eq!(bits(fused(None)), bits(fused(Some(default))), "lane kernel");
    let planes = |scale| {
        let qkv = (&q[..], &k[..], &v[..]);
        run_planes_scaled(DType::F16, dims, &batch, Mask::Causal, qkv, 2, 16, scale).unwrap()
    };
    assert_eq!(bits(planes(None)), bits(planes(Some(default))), "planes");
}

/// The tree batch's sequences as plain causal sequences (for a tail test).
fn batch_from_tree(b: &SeqBatch) -> SeqBatch {
    SeqBatch {
        q_pos: b.q_pos.clone(),
        k_pos: b.k_pos.clone(),
        q_lens: b.q_lens.clone(),
        k_lens: b.k_lens.clone(),
        ..SeqBatch::default()
    }
}

/// Lane-layout shapes: groups of 1, 3 and 4 query heads per KV head (a
/// unit serves its whole group where it fits, two heads of a group of 4
/// with 50-wide heads, one with 3-wide heads: `attention::lane_heads_per_unit`).
fn dims_strategy() -> impl Strategy<Value = AttnDims> {
    (
        prop_oneof![Just(1usize), Just(3), Just(9)],
        prop_oneof![Just(3usize), Just(8), Just(50), Just(64)],
        0..3usize,
    )
        .prop_map(|(kv_heads, head_dim, g)| AttnDims {
            heads: kv_heads * [1, 3, 4][g],
            kv_heads,
            head_dim,
        })
}

fn mask_strategy() -> impl Strategy<Value = Mask> {
    prop_oneof![
        Just(Mask::Full),
        Just(Mask::Causal),
        Just(Mask::CrossDiagonal),
        (1u32..6)
            .prop_flat_map(|w| (Just(w), 0..w))
            .prop_map(|(window, offset)| Mask::InverseBlock { window, offset }),
        (1u32..9, 0u32..3).prop_map(|(window, sink)| Mask::SlidingSink { window, sink }),
    ]
}

/// 1–3 sequences; each has `tk` keys at positions `base..base+tk` and its
/// queries are the last `tq` of them. Sizes include 1, 3, 50 and 783 keys.
fn batch_strategy() -> impl Strategy<Value = SeqBatch> {
    let seq = (
        prop_oneof![Just(1usize), Just(3), Just(50), Just(783), 1..80usize],
        1..8usize,
        0u32..40,
    );
    prop::collection::vec(seq, 1..=3).prop_map(|seqs| {
        let mut b = SeqBatch::default();
        for (tk, tq_raw, base) in seqs {
            let tq = if tk > 100 {
                tq_raw.min(3)
            } else {
                tq_raw.min(tk).max(1)
            };
            let k_pos: Vec<u32> = (base..base + tk as u32).collect();
            b.q_pos.extend_from_slice(&k_pos[tk - tq..]);
            b.k_pos.extend_from_slice(&k_pos);
            b.q_lens.push(tq);
            b.k_lens.push(tk);
        }
        b
    })
}

/// A random tree of `n` nodes over `committed` keys: each node's parent is an
/// earlier node or the root marker.
fn tree_batch(committed: usize, n: usize, seed: u64) -> SeqBatch {
    let r = random_u32(seed, n, 1 << 16);
    let parents: Vec<u32> = (0..n)
        .map(|i| {
            if i == 0 || r[i].is_multiple_of(5) {
                TREE_ROOT
            } else {
                r[i] % i as u32
            }
        })
        .collect();
    SeqBatch::tree(committed, &parents).unwrap()
}

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn positional_masks_match_reference(
        dtype in float_dtype(), dims in dims_strategy(), mask in mask_strategy(),
        batch in batch_strategy(), seed in 0u64..1000,
    ) {
        check(dtype, dims, &batch, mask, seed)?;
    }

    #[test]
    fn tree_mask_matches_reference(
        dtype in float_dtype(), dims in dims_strategy(),
        committed in prop_oneof![Just(0usize), Just(1), Just(50), 0..40usize],
        nodes in prop_oneof![Just(1usize), Just(3), Just(33), Just(64), 1..20usize],
        seed in 0u64..1000,
    ) {
        check(dtype, dims, &tree_batch(committed, nodes, seed), Mask::Tree, seed)?;
    }
}

/// `batch` with a random tree tail: up to 40 tail keys per sequence, each
/// query row seeing a random subset of them.
fn with_tail(mut batch: SeqBatch, seed: u64) -> SeqBatch {
    let r = random_u32(seed, batch.batch() + batch.total_q() * 40, 1 << 16);
    let lens: Vec<usize> = (0..batch.batch())
        .map(|s| (r[s] as usize % 41).min(batch.k_lens[s]))
        .collect();
    let mut visible = Vec::new();
    let mut at = batch.batch();
    for (s, &q) in batch.q_lens.iter().enumerate() {
        for _ in 0..q {
            visible.push(
                (0..lens[s])
                    .filter(|&j| !r[at + j].is_multiple_of(3))
                    .collect(),
            );
            at += 40;
        }
    }
    batch.tail = Some(TreeTail::from_visible(lens, &visible).unwrap());
    batch
}

/// Draft-dim attention: every chunk size gives exactly the unchunked bits,
/// and both match the reference (b·t sequences of l rows, full mask).
#[test]
fn draft_dim_chunking_is_bit_identical() {
    let client = test_client();
    for (dtype, bt, l, dims) in [
        (
            DType::F32,
            50,
            3,
            AttnDims {
                heads: 3,
                kv_heads: 1,
                head_dim: 8,
            },
        ),
        (
            DType::F16,
            37,
            8,
            AttnDims {
                heads: 9,
                kv_heads: 3,
                head_dim: 64,
            },
        ),
        (
            DType::F32,
            7,
            1,
            AttnDims {
                heads: 2,
                kv_heads: 2,
                head_dim: 3,
            },
        ),
    ] {
        let (q, k, v) = random_qkv(dims, bt * l, bt * l, 1, dtype);
        let up = |d: &[f32], w: usize| {
            DeviceTensor::<R>::upload_f32(&client, d, &[bt, l, w * dims.head_dim], dtype).unwrap()
        };
        let (qt, kt, vt) = (
            up(&q, dims.heads),
            up(&k, dims.kv_heads),
            up(&v, dims.kv_heads),
        );
        let run = |chunk: usize| {
            let out = up(&vec![f32::NAN; q.len()], dims.heads);
            draft_dim_attention(&client, &qt, &kt, &vt, dims, chunk, &out).unwrap();
            out.download_f32(&client).unwrap()
        };
        let whole = run(bt);
        let want = attention_ref(&q, &k, &v, dims, &SeqBatch::uniform(bt, l), Mask::Full);
        assert_close("draft-dim", &whole, &want, dtype).unwrap();
        for chunk in [1, 3, bt - 1, bt + 5].into_iter().filter(|&c| c >= 1) {
            let got = run(chunk);
            let same = got
                .iter()
                .zip(&whole)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "chunk {chunk} differs from the unchunked result ({dtype}, bt {bt}, l {l})"
            );
        }
    }
}

#[test]
fn invalid_arguments_are_errors() {
    let client = test_client();
    let t = |shape: &[usize]| DeviceTensor::<R>::zeros(&client, shape, DType::F32);
    let dims = AttnDims {
        heads: 2,
        kv_heads: 1,
        head_dim: 4,
    };
    let (q, kv) = (t(&[3, 2, 4]), t(&[3, 1, 4]));
    let batch = SeqBatch::single(3, 3);
    // heads not a multiple of kv_heads
    let bad = AttnDims {
        heads: 3,
        kv_heads: 2,
        head_dim: 4,
    };
    assert!(matches!(
        attention(&client, &q, &kv, &kv, bad, &batch, Mask::Causal, &q),
        Err(OpsError::InvalidArgument { .. })
    ));
    // head_dim too large, wrong k shape, wrong out dtype
    let big = AttnDims {
        heads: 2,
        kv_heads: 1,
        head_dim: 300,
    };
    assert!(attention(&client, &q, &kv, &kv, big, &batch, Mask::Causal, &q).is_err());
    assert!(matches!(
        attention(&client, &q, &q, &kv, dims, &batch, Mask::Causal, &q),
        Err(OpsError::ShapeMismatch { .. })
    ));
    let out16 = DeviceTensor::<R>::zeros(&client, &[3, 2, 4], DType::F16);
    assert!(matches!(
        attention(&client, &q, &kv, &kv, dims, &batch, Mask::Causal, &out16),
        Err(OpsError::DTypeMismatch { .. })
    ));
    // positions of the wrong length; mask parameters out of their domain
    let mut short = batch.clone();
    short.q_pos.pop();
    assert!(attention(&client, &q, &kv, &kv, dims, &short, Mask::Causal, &q).is_err());
    for mask in [
        Mask::InverseBlock {
            window: 0,
            offset: 0,
        },
        Mask::InverseBlock {
            window: 2,
            offset: 2,
        },
        Mask::SlidingSink { window: 0, sink: 1 },
    ] {
        assert!(
            attention(&client, &q, &kv, &kv, dims, &batch, mask, &q).is_err(),
            "{mask:?}"
        );
    }
    // tree: a parent pointing forward, and more nodes than keys; a tree
    // over a sliding window of 0, or without parents
    let mut tree = SeqBatch::tree(0, &[TREE_ROOT, 0, 1]).unwrap();
    let sliding = Mask::TreeSliding { window: 2, sink: 0 };
    assert!(attention(&client, &q, &kv, &kv, dims, &tree, sliding, &q).is_ok());
    let zero = Mask::TreeSliding { window: 0, sink: 1 };
    assert!(matches!(
        attention(&client, &q, &kv, &kv, dims, &tree, zero, &q),
        Err(OpsError::InvalidArgument { .. })
    ));
    assert!(attention(&client, &q, &kv, &kv, dims, &batch, sliding, &q).is_err());
    tree.parents[1] = 2;
    for mask in [Mask::Tree, sliding] {
        assert!(
            matches!(
                attention(&client, &q, &kv, &kv, dims, &tree, mask, &q),
                Err(OpsError::IndexOutOfRange { .. })
            ),
            "{mask:?}"
        );
    }
    let mut few_keys = SeqBatch::tree(0, &[TREE_ROOT, 0, 1]).unwrap();
    few_keys.k_lens = vec![2];
    few_keys.k_pos.pop();
    assert!(attention(
        &client,
        &q,
        &t(&[2, 1, 4]),
        &t(&[2, 1, 4]),
        dims,
        &few_keys,
        Mask::Tree,
        &q
    )
    .is_err());
    // tree tail: longer than the sequence, wrong bit count, with Mask::Tree
    let mut long = batch.clone();
    long.tail = Some(TreeTail::from_visible(vec![4], &[vec![], vec![], vec![]]).unwrap());
    assert!(attention(&client, &q, &kv, &kv, dims, &long, Mask::Causal, &q).is_err());
    let mut bits = batch.clone();
    bits.tail = Some(TreeTail::from_visible(vec![2], &[vec![0]]).unwrap());
    assert!(attention(&client, &q, &kv, &kv, dims, &bits, Mask::Causal, &q).is_err());
    let mut both = SeqBatch::tree(0, &[TREE_ROOT, 0, 1]).unwrap();
    both.tail = Some(TreeTail::from_visible(vec![1], &[vec![], vec![], vec![]]).unwrap());
    assert!(attention(&client, &q, &kv, &kv, dims, &both, Mask::Tree, &q).is_err());
    assert!(attention(&client, &q, &kv, &kv, dims, &both, sliding, &q).is_err());
    // draft-dim: chunk 0
    let (q3, kv3) = (t(&[3, 1, 8]), t(&[3, 1, 4]));
    assert!(matches!(
        draft_dim_attention(&client, &q3, &kv3, &kv3, dims, 0, &q3),
        Err(OpsError::InvalidArgument { .. })
    ));
}

/// A softmax scale that is not finite and positive is an `Err`; a valid one
/// is kept, and the metadata has none until one is set.
#[test]
fn bad_scale_is_an_error() {
    let client = test_client();
    let meta = || AttnMeta::<R>::new(&client, &SeqBatch::single(3, 3), Mask::Causal).unwrap();
    assert_eq!(meta().scale(), None);
    assert_eq!(meta().softmax_scale(16), 0.25);
    for bad in [
        0.0,
        -0.0,
        -0.125,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ] {
        assert!(
            matches!(
                meta().with_scale(bad),
                Err(OpsError::InvalidArgument { .. })
            ),
            "scale {bad}"
        );
    }
    let m = meta().with_scale(0.0625).unwrap();
    assert_eq!((m.scale(), m.softmax_scale(16)), (Some(0.0625), 0.0625));
    assert_eq!(m.clone().scale(), Some(0.0625), "a clone keeps the scale");
}
