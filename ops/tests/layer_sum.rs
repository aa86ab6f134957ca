//! Weighted layer sum against the reference.

use draftc_ops::layer_sum::{layer_sum, reference};
use draftc_ops::testing::{
    assert_close, awkward_size, config, float_dtype, random_f32, test_client,
};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn layer_sum_matches_reference(layers in 1usize..8, rows in awkward_size(50), d in awkward_size(800),
                                   dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let x = random_f32(seed, layers * rows * d, -2.0, 2.0, dtype);
        let w = random_f32(seed ^ 7, layers, -3.0, 3.0, dtype);
        let xt = DeviceTensor::upload_f32(&client, &x, &[layers, rows, d], dtype).unwrap();
        let wt = DeviceTensor::upload_f32(&client, &w, &[layers], dtype).unwrap();
        let out = DeviceTensor::empty(&client, &[rows, d], dtype);
        layer_sum(&client, &xt, &wt, &out).unwrap();
        assert_close("layer_sum", &out.download_f32(&client).unwrap(), &reference::layer_sum(&x, &w), dtype)?;
    }
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
