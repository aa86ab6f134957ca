//! KV append and compaction on the wgpu runtime against the sequential
//! reference, including compaction whose sources overlap its destinations.

use draftc_ops::kv::{append_rows, compact_rows, kv_append, kv_compact, move_rows, reference};
use draftc_ops::testing::{config, float_dtype, random_f32, random_u32, test_client};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

type R = draftc_ops::testing::TestRuntime;

fn upload(data: &[f32], shape: &[usize], dtype: DType) -> DeviceTensor<R> {
    DeviceTensor::upload_f32(&test_client(), data, shape, dtype).unwrap()
}

/// `k` distinct slots out of `0..bound` in random order.
fn distinct_slots(k: usize, bound: usize, seed: u64) -> Vec<u32> {
    let mut all: Vec<u32> = (0..bound as u32).collect();
    let r = random_u32(seed, bound, u32::MAX);
    for i in (1..bound).rev() {
        all.swap(i, r[i] as usize % (i + 1));
    }
    all.truncate(k);
    all
}

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn append_matches_reference(
        dtype in float_dtype(), layers in 1usize..4, slots in prop_oneof![Just(1usize), Just(3), Just(50), 1..80usize],
        width in prop_oneof![Just(1usize), Just(3), Just(64), Just(192), 1..70usize], frac in 0.0f64..1.0, seed in 0u64..1000,
    ) {
        let n = ((slots as f64 * frac) as usize).max(1);
        let at = distinct_slots(n, slots, seed);
        let mut cache = random_f32(seed, layers * slots * width, -1.0, 1.0, dtype);
        let new = random_f32(seed + 1, layers * n * width, -1.0, 1.0, dtype);
        let ct = upload(&cache, &[layers, slots, width], dtype);
        append_rows(&test_client(), &upload(&new, &[layers, n, width], dtype), &at, &ct).unwrap();
        reference::append(&mut cache, slots, width, &new, &at);
        prop_assert_eq!(ct.download_f32(&test_client()).unwrap(), cache);
    }

    /// Accepted tree nodes at increasing slots after a committed prefix move to
    /// the slots right after it: sources and destinations overlap.
    #[test]
    fn compaction_of_accepted_path_matches_reference(
        dtype in float_dtype(), layers in 1usize..3, committed in 0usize..40, nodes in 1usize..65,
        width in prop_oneof![Just(3usize), Just(64), 1..40usize], seed in 0u64..1000,
    ) {
        let slots = committed + nodes;
        let mut path: Vec<u32> = distinct_slots(nodes.min(8), nodes, seed).iter().map(|&s| (committed as u32) + s).collect();
        path.sort_unstable();
        let mut cache = random_f32(seed, layers * slots * width, -1.0, 1.0, dtype);
        let ct = upload(&cache, &[layers, slots, width], dtype);
        compact_rows(&test_client(), &path, committed, &ct).unwrap();
        reference::compact(&mut cache, slots, width, &path, committed);
        prop_assert_eq!(ct.download_f32(&test_client()).unwrap(), cache);
    }
}

proptest! {
    #![proptest_config(config(24))]

    /// Several sequences' accepted paths compacted in one call: sources and
    /// destinations anywhere in the cache, overlapping.
    #[test]
    fn moves_of_several_paths_match_reference(
        dtype in float_dtype(), layers in 1usize..3, slots in 2usize..90,
        width in prop_oneof![Just(3usize), Just(64), 1..40usize], seed in 0u64..1000,
        frac in 0.0f64..1.0,
    ) {
        let m = ((slots as f64 * frac) as usize).max(1).min(slots);
        let src = distinct_slots(m, slots, seed);
        let dst = distinct_slots(m, slots, seed ^ 77);
        let mut cache = random_f32(seed, layers * slots * width, -1.0, 1.0, dtype);
        let ct = upload(&cache, &[layers, slots, width], dtype);
        move_rows(&test_client(), &src, &dst, &ct).unwrap();
        reference::move_rows(&mut cache, slots, width, &src, &dst);
        prop_assert_eq!(ct.download_f32(&test_client()).unwrap(), cache);
    }
}

/// Worst cases for an in-place parallel copy: a chain where every
/// destination is the next row's source, and a reversal.
#[test]
fn compaction_with_adversarial_overlap() {
    let client = test_client();
    let (slots, width) = (12, 5);
    let base: Vec<f32> = (0..slots * width).map(|i| i as f32).collect();
    for (src, dst) in [
        (vec![1u32, 2, 3, 4, 5], 0),
        (vec![5, 4, 3, 2, 1], 1),
        (vec![0, 11, 6], 5),
        (vec![7, 3], 3),
    ] {
        let (k, v) = (
            upload(&base, &[slots, width], DType::F32),
            upload(&base, &[slots, width], DType::F32),
        );
        kv_compact(&client, &src, dst, &k, &v).unwrap();
        let mut want = base.clone();
        reference::compact(&mut want, slots, width, &src, dst);
        assert_eq!(
            k.download_f32(&client).unwrap(),
            want,
            "K, src {src:?} -> {dst}"
        );
        assert_eq!(
            v.download_f32(&client).unwrap(),
            want,
            "V, src {src:?} -> {dst}"
        );
    }
}

#[test]
fn kv_append_writes_both_caches_and_validates() {
    let client = test_client();
    let (k, v) = (
        upload(&[0.0; 12], &[4, 3], DType::F16),
        upload(&[0.0; 12], &[4, 3], DType::F16),
    );
    let (kn, vn) = (
        upload(&[1.0; 6], &[2, 3], DType::F16),
        upload(&[2.0; 6], &[2, 3], DType::F16),
    );
    kv_append(&client, &kn, &vn, &[3, 1], &k, &v).unwrap();
    assert_eq!(
        k.download_f32(&client).unwrap(),
        [0., 0., 0., 1., 1., 1., 0., 0., 0., 1., 1., 1.]
    );
    assert_eq!(
        v.download_f32(&client).unwrap(),
        [0., 0., 0., 2., 2., 2., 0., 0., 0., 2., 2., 2.]
    );
    assert!(matches!(
        kv_append(&client, &kn, &vn, &[4, 1], &k, &v),
        Err(OpsError::IndexOutOfRange { .. })
    ));
    assert!(matches!(
        kv_append(&client, &kn, &vn, &[1, 1], &k, &v),
        Err(OpsError::InvalidArgument { .. })
    ));
    assert!(matches!(
        kv_append(&client, &kn, &vn, &[1], &k, &v),
        Err(OpsError::ShapeMismatch { .. })
    ));
    let wide = upload(&[0.0; 8], &[2, 4], DType::F16);
    assert!(matches!(
        append_rows(&client, &wide, &[0, 1], &k),
        Err(OpsError::ShapeMismatch { .. })
    ));
    let f32_rows = upload(&[0.0; 6], &[2, 3], DType::F32);
    assert!(matches!(
        append_rows(&client, &f32_rows, &[0, 1], &k),
        Err(OpsError::DTypeMismatch { .. })
    ));
    assert!(matches!(
        compact_rows(&client, &[0, 1], 3, &k),
        Err(OpsError::InvalidArgument { .. })
    ));
    assert!(matches!(
        compact_rows(&client, &[9], 0, &k),
        Err(OpsError::IndexOutOfRange { .. })
    ));
}

proptest! {
    #![proptest_config(config(16))]

    /// A packed upload gives back every part unchanged, at its own offset
    /// (reads and kernels see the part, not the buffer's start), as one
    /// upload and at most one allocation (none once a kept buffer of its
    /// size class is free, `draftc_ops::kept`).
    #[test]
    fn packed_upload_parts_are_independent_views(lens in proptest::collection::vec(0usize..300, 1..5),
                                                 seed in any::<u64>()) {
        let client = test_client();
        let parts: Vec<Vec<u32>> = lens
            .iter()
            .enumerate()
            .map(|(i, &n)| random_u32(seed ^ i as u64, n.max(1), 1 << 20))
            .collect();
        let shapes: Vec<[usize; 1]> = parts.iter().map(|p| [p.len()]).collect();
        let args: Vec<(&[u32], &[usize])> = parts
            .iter()
            .zip(&shapes)
            .map(|(p, s)| (p.as_slice(), s.as_slice()))
            .collect();
        let before = draftc_ops::counters::snapshot();
        let dev = DeviceTensor::<R>::upload_u32_packed(&client, &args).unwrap();
        let c = draftc_ops::counters::snapshot().since(&before);
        prop_assert_eq!(c.uploads, 1);
        prop_assert!(c.allocations <= 1);
        for (t, p) in dev.iter().zip(&parts) {
            prop_assert_eq!(&t.download_u32(&client).unwrap(), p);
        }
        // A kernel reading a later part as its row indices sees that part.
        let last = parts.len() - 1;
        let idx = draftc_ops::kv::RowIndex::on_device(&parts[last], dev[last].clone()).unwrap();
        let n = parts[last].len();
        let rows = (1 << 20) + 1;
        let src = upload(&vec![1.0; n * 4], &[n, 4], DType::F32);
        let dst = DeviceTensor::<R>::zeros(&client, &[rows, 4], DType::F32);
        let all = draftc_ops::kv::RowIndex::upload(&client, &(0..n as u32).collect::<Vec<_>>()).unwrap();
        if parts[last].iter().collect::<std::collections::HashSet<_>>().len() == n {
            draftc_ops::kv::append_rows_indexed(&client, &src, &all, &idx, &dst).unwrap();
            let got = dst.download_f32(&client).unwrap();
            for &r in &parts[last] {
                prop_assert_eq!(got[r as usize * 4], 1.0);
            }
            prop_assert_eq!(got.iter().filter(|&&x| x == 1.0).count(), n * 4);
        }
    }
}
