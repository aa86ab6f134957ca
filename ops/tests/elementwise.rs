//! Element-wise ops against the reference at awkward lengths, f32 and f16.

use draftc_ops::elementwise::{binary, reference, silu, BinaryOp};
use draftc_ops::testing::{
    assert_close, awkward_size, config, float_dtype, random_f32, test_client,
};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

fn op() -> impl Strategy<Value = BinaryOp> {
    prop_oneof![
        Just(BinaryOp::Add),
        Just(BinaryOp::Mul),
        Just(BinaryOp::SwiGlu)
    ]
}

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn binary_matches_reference(n in awkward_size(5000), op in op(), dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let a = random_f32(seed, n, -6.0, 6.0, dtype);
        let b = random_f32(seed ^ 9, n, -2.0, 2.0, dtype);
        let at = DeviceTensor::upload_f32(&client, &a, &[n], dtype).unwrap();
        let bt = DeviceTensor::upload_f32(&client, &b, &[n], dtype).unwrap();
        let out = DeviceTensor::empty(&client, &[n], dtype);
        binary(&client, &at, &bt, op, &out).unwrap();
        assert_close(&format!("{op:?}"), &out.download_f32(&client).unwrap(), &reference::binary(&a, &b, op), dtype)?;
    }

    #[test]
    fn silu_matches_reference(n in awkward_size(3000), dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let a = random_f32(seed, n, -10.0, 10.0, dtype);
        let at = DeviceTensor::upload_f32(&client, &a, &[n], dtype).unwrap();
        silu(&client, &at, &at).unwrap(); // in place
        let want: Vec<f32> = a.iter().map(|&x| reference::silu(x)).collect();
        assert_close("silu", &at.download_f32(&client).unwrap(), &want, dtype)?;
    }
}

#[test]
fn errors() {
    let client = test_client();
    let a = DeviceTensor::zeros(&client, &[4, 3], DType::F32);
    let b = DeviceTensor::zeros(&client, &[3, 4], DType::F32);
    let e = DeviceTensor::zeros(&client, &[0], DType::F32);
    assert!(matches!(
        binary(&client, &a, &b, BinaryOp::Add, &a),
        Err(OpsError::ShapeMismatch { arg: "b", .. })
    ));
    assert!(matches!(
        binary(&client, &e, &e, BinaryOp::Add, &e),
        Err(OpsError::EmptyInput { .. })
    ));
    let h = DeviceTensor::zeros(&client, &[4, 3], DType::F16);
    assert!(matches!(
        binary(&client, &a, &h, BinaryOp::Mul, &a),
        Err(OpsError::DTypeMismatch { .. })
    ));
}
