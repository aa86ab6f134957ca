//! RMS norm and grouped RMS norm against their references on wgpu, at
//! awkward sizes, f32 and f16, plus argument errors.

use draftc_ops::group_rms_norm::{group_rms_norm, group_rms_norm_concat, reference as gref};
use draftc_ops::rms_norm::{reference, rms_norm};
use draftc_ops::testing::{
    assert_close, awkward_size, config, float_dtype, random_f32, test_client,
};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn rms_norm_matches_reference(rows in awkward_size(64), d in awkward_size(1024),
                                  dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let x = random_f32(seed, rows * d, -2.0, 2.0, dtype);
        let w = random_f32(seed ^ 1, d, 0.5, 1.5, dtype);
        let xt = DeviceTensor::upload_f32(&client, &x, &[rows, d], dtype).unwrap();
        let wt = DeviceTensor::upload_f32(&client, &w, &[d], dtype).unwrap();
        let out = DeviceTensor::empty(&client, &[rows, d], dtype);
        rms_norm(&client, &xt, &wt, 1e-5, &out).unwrap();
        let got = out.download_f32(&client).unwrap();
        assert_close("rms_norm", &got, &reference::rms_norm(&x, &w, 1e-5), dtype)?;
    }

    #[test]
    fn group_rms_norm_matches_reference(rows in awkward_size(40), groups in 1usize..6,
                                        d in awkward_size(800), dtype in float_dtype(),
                                        seed in any::<u64>()) {
        let client = test_client();
        let x = random_f32(seed, rows * groups * d, -3.0, 3.0, dtype);
        let w = random_f32(seed ^ 2, groups * d, -1.5, 1.5, dtype);
        let xt = DeviceTensor::upload_f32(&client, &x, &[rows, groups, d], dtype).unwrap();
        let wt = DeviceTensor::upload_f32(&client, &w, &[groups, d], dtype).unwrap();
        let out = group_rms_norm_concat(&client, &xt, &wt, 1e-6).unwrap();
        prop_assert_eq!(out.shape(), &[rows, groups * d][..]);
        let got = out.download_f32(&client).unwrap();
        assert_close("group_rms_norm", &got, &gref::group_rms_norm(&x, &w, d, 1e-6), dtype)?;
    }
}

#[test]
fn rms_norm_rank3_in_place() {
    let client = test_client();
    let x = random_f32(7, 2 * 3 * 8, -1.0, 1.0, DType::F32);
    let w = random_f32(8, 8, -1.0, 1.0, DType::F32);
    let xt = DeviceTensor::upload_f32(&client, &x, &[2, 3, 8], DType::F32).unwrap();
    let wt = DeviceTensor::upload_f32(&client, &w, &[8], DType::F32).unwrap();
    rms_norm(&client, &xt, &wt, 1e-5, &xt).unwrap();
    let got = xt.download_f32(&client).unwrap();
    assert_close(
        "in place",
        &got,
        &reference::rms_norm(&x, &w, 1e-5),
        DType::F32,
    )
    .unwrap();
}

#[test]
fn groups_use_their_own_weights() {
    // Two groups with identical inputs but different weights must differ.
    let client = test_client();
    let x = [1.0f32, 2.0, 1.0, 2.0];
    let w = [1.0f32, 1.0, 2.0, 2.0];
    let xt = DeviceTensor::upload_f32(&client, &x, &[1, 2, 2], DType::F32).unwrap();
    let wt = DeviceTensor::upload_f32(&client, &w, &[2, 2], DType::F32).unwrap();
    let out = DeviceTensor::empty(&client, &[1, 2, 2], DType::F32);
    group_rms_norm(&client, &xt, &wt, 0.0, &out).unwrap();
    let got = out.download_f32(&client).unwrap();
    let r = (2.5f32).sqrt();
    assert_close(
        "groups",
        &got,
        &[1.0 / r, 2.0 / r, 2.0 / r, 4.0 / r],
        DType::F32,
    )
    .unwrap();
}

#[test]
fn errors() {
    let client = test_client();
    let x = DeviceTensor::zeros(&client, &[4, 8], DType::F32);
    let w7 = DeviceTensor::zeros(&client, &[7], DType::F32);
    let w8 = DeviceTensor::zeros(&client, &[8], DType::F32);
    let w8h = DeviceTensor::zeros(&client, &[8], DType::F16);
    let out = DeviceTensor::empty(&client, &[4, 8], DType::F32);
    let bad_out = DeviceTensor::empty(&client, &[4, 9], DType::F32);
    let empty = DeviceTensor::zeros(&client, &[0, 8], DType::F32);
    let ids = DeviceTensor::upload_u32(&client, &[1, 2], &[2]).unwrap();

    assert!(matches!(
        rms_norm(&client, &x, &w7, 1e-5, &out),
        Err(OpsError::ShapeMismatch { arg: "weight", .. })
    ));
    assert!(matches!(
        rms_norm(&client, &x, &w8h, 1e-5, &out),
        Err(OpsError::DTypeMismatch { arg: "weight", .. })
    ));
    assert!(matches!(
        rms_norm(&client, &x, &w8, 1e-5, &bad_out),
        Err(OpsError::ShapeMismatch { arg: "out", .. })
    ));
    assert!(matches!(
        rms_norm(&client, &empty, &w8, 1e-5, &empty),
        Err(OpsError::EmptyInput { .. })
    ));
    assert!(matches!(
        rms_norm(&client, &x, &w8, f32::NAN, &out),
        Err(OpsError::InvalidArgument { .. })
    ));
    assert!(matches!(
        rms_norm(&client, &ids, &w8, 1e-5, &out),
        Err(OpsError::DTypeMismatch { arg: "x", .. })
    ));
    // grouped: rank and weight shape
    assert!(matches!(
        group_rms_norm(&client, &x, &w8, 1e-5, &out),
        Err(OpsError::ShapeMismatch { arg: "x", .. })
    ));
    let x3 = DeviceTensor::zeros(&client, &[2, 2, 4], DType::F32);
    let wg = DeviceTensor::zeros(&client, &[3, 4], DType::F32);
    let out3 = DeviceTensor::empty(&client, &[2, 8], DType::F32);
    assert!(matches!(
        group_rms_norm(&client, &x3, &wg, 1e-5, &out3),
        Err(OpsError::ShapeMismatch { arg: "weight", .. })
    ));
    // upload length mismatch
    assert!(DeviceTensor::upload_f32(&client, &[1.0, 2.0], &[3], DType::F32).is_err());
}
