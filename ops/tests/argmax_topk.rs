//! Argmax (ties → lowest index) and top-k against the reference.

use draftc_ops::argmax_topk::{argmax, reference, topk};
use draftc_ops::testing::{awkward_size, config, float_dtype, random_f32, test_client};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn argmax_matches_reference(rows in awkward_size(40), n in awkward_size(3000), coarse in any::<bool>(),
                                dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let mut x = random_f32(seed, rows * n, -4.0, 4.0, dtype);
        if coarse { x.iter_mut().for_each(|v| *v = v.round()); } // many ties
        let xt = DeviceTensor::upload_f32(&client, &x, &[rows, n], dtype).unwrap();
        let out = DeviceTensor::empty(&client, &[rows], DType::U32);
        argmax(&client, &xt, &out).unwrap();
        prop_assert_eq!(out.download_u32(&client).unwrap(), reference::argmax(&x, n));
    }

    #[test]
    fn topk_matches_reference(rows in awkward_size(20), n in awkward_size(2000), k in 1usize..20, coarse in any::<bool>(),
                              dtype in float_dtype(), seed in any::<u64>()) {
        let k = k.min(n);
        let client = test_client();
        let mut x = random_f32(seed, rows * n, -4.0, 4.0, dtype);
        if coarse { x.iter_mut().for_each(|v| *v = v.round()); }
        let xt = DeviceTensor::upload_f32(&client, &x, &[rows, n], dtype).unwrap();
        let vals = DeviceTensor::empty(&client, &[rows, k], dtype);
        let idx = DeviceTensor::empty(&client, &[rows, k], DType::U32);
        topk(&client, &xt, k, &vals, &idx).unwrap();
        let (wv, wi) = reference::topk(&x, n, k);
        prop_assert_eq!(idx.download_u32(&client).unwrap(), wi);
        prop_assert_eq!(vals.download_f32(&client).unwrap(), wv);
    }
}

#[test]
fn ties_go_to_lowest_index() {
    let client = test_client();
    let x =
        DeviceTensor::upload_f32(&client, &[1.0, 3.0, 3.0, 0.0, 3.0], &[1, 5], DType::F32).unwrap();
    let out = DeviceTensor::empty(&client, &[1], DType::U32);
    argmax(&client, &x, &out).unwrap();
    assert_eq!(out.download_u32(&client).unwrap(), [1]);
    let v = DeviceTensor::empty(&client, &[1, 4], DType::F32);
    let i = DeviceTensor::empty(&client, &[1, 4], DType::U32);
    topk(&client, &x, 4, &v, &i).unwrap();
    assert_eq!(i.download_u32(&client).unwrap(), [1, 2, 4, 0]);
}

#[test]
fn errors() {
    let client = test_client();
    let x = DeviceTensor::zeros(&client, &[2, 5], DType::F32);
    let v = DeviceTensor::empty(&client, &[2, 6], DType::F32);
    let i = DeviceTensor::empty(&client, &[2, 6], DType::U32);
    assert!(matches!(
        topk(&client, &x, 6, &v, &i),
        Err(OpsError::InvalidArgument { .. })
    ));
    assert!(matches!(
        topk(&client, &x, 0, &v, &i),
        Err(OpsError::InvalidArgument { .. })
    ));
    let o = DeviceTensor::empty(&client, &[3], DType::U32);
    assert!(matches!(
        argmax(&client, &x, &o),
        Err(OpsError::ShapeMismatch { .. })
    ));
    let of = DeviceTensor::empty(&client, &[2], DType::F32);
    assert!(matches!(
        argmax(&client, &x, &of),
        Err(OpsError::DTypeMismatch { .. })
    ));
}

/// Top-k values and indices read back in one request equal two reads, in
/// f32 and f16; wrong dtypes are errors.
#[test]
fn values_and_ids_in_one_read() {
    let client = test_client();
    for dtype in [DType::F32, DType::F16] {
        let (rows, n, k) = (3, 50, 4);
        let x = random_f32(11, rows * n, -3.0, 3.0, dtype);
        let xt = DeviceTensor::upload_f32(&client, &x, &[rows, n], dtype).unwrap();
        let values = DeviceTensor::empty(&client, &[rows, k], dtype);
        let ids = DeviceTensor::empty(&client, &[rows, k], DType::U32);
        topk(&client, &xt, k, &values, &ids).unwrap();
        let before = draftc_ops::counters::snapshot();
        let (v, i) = DeviceTensor::download_f32_and_u32(&client, &values, &ids).unwrap();
        assert_eq!(draftc_ops::counters::snapshot().since(&before).reads, 1);
        assert_eq!(v, values.download_f32(&client).unwrap());
        assert_eq!(i, ids.download_u32(&client).unwrap());
        assert!(DeviceTensor::download_f32_and_u32(&client, &ids, &ids).is_err());
        assert!(DeviceTensor::download_f32_and_u32(&client, &values, &values).is_err());
    }
}
