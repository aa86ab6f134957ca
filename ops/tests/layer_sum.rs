//! Weighted layer sum against the reference.

use draftc_ops::layer_sum::{layer_sum, reference};
use draftc_ops::testing::{
    assert_close_terms, awkward_size, config, float_dtype, random_f32, test_client,
};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

/// The kernel's sum against the reference's, each element judged against
/// the magnitude of its terms (`Σ |w_l · x_l|`): weighted layers may
/// cancel to far below their terms.
fn check(
    layers: usize,
    rows: usize,
    d: usize,
    dtype: DType,
    seed: u64,
) -> Result<(), TestCaseError> {
    let client = test_client();
    let x = random_f32(seed, layers * rows * d, -2.0, 2.0, dtype);
    let w = random_f32(seed ^ 7, layers, -3.0, 3.0, dtype);
    let xt = DeviceTensor::upload_f32(&client, &x, &[layers, rows, d], dtype).unwrap();
    let wt = DeviceTensor::upload_f32(&client, &w, &[layers], dtype).unwrap();
    let out = DeviceTensor::empty(&client, &[rows, d], dtype);
    layer_sum(&client, &xt, &wt, &out).unwrap();
    let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
    let magnitude = reference::layer_sum(&abs(&x), &abs(&w));
    let got = out.download_f32(&client).unwrap();
    assert_close_terms(
        "layer_sum",
        &got,
        &reference::layer_sum(&x, &w),
        &magnitude,
        dtype,
    )
}

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn layer_sum_matches_reference(layers in 1usize..8, rows in awkward_size(50), d in awkward_size(800),
                                   dtype in float_dtype(), seed in any::<u64>()) {
        check(layers, rows, d, dtype, seed)?;
    }
}

/// The case CI drew (2026-11-27): three layers cancelling to -4.7e-4,
/// 3e-8 off, which a tolerance relative to the result (1e-5 of 4.7e-4)
/// failed.
#[test]
fn layers_that_cancel() {
    check(3, 1, 1, DType::F32, 6113641053615037648).unwrap();
}

#[test]
fn errors() {
    let client = test_client();
    let x = DeviceTensor::zeros(&client, &[3, 2, 4], DType::F32);
    let w2 = DeviceTensor::zeros(&client, &[2], DType::F32);
    let w3 = DeviceTensor::zeros(&client, &[3], DType::F32);
    let out = DeviceTensor::empty(&client, &[2, 4], DType::F32);
    assert!(matches!(
        layer_sum(&client, &x, &w2, &out),
        Err(OpsError::ShapeMismatch { arg: "weights", .. })
    ));
    let bad = DeviceTensor::empty(&client, &[3, 4], DType::F32);
    assert!(matches!(
        layer_sum(&client, &x, &w3, &bad),
        Err(OpsError::ShapeMismatch { arg: "out", .. })
    ));
    let flat = DeviceTensor::zeros(&client, &[3], DType::F32);
    assert!(matches!(
        layer_sum(&client, &flat, &w3, &out),
        Err(OpsError::ShapeMismatch { arg: "x", .. })
    ));
}
