//! Element-wise ops against the reference at awkward lengths, f32 and f16;
//! GeGLU's tanh GELU also value by value over its tails, and its reference
//! against PyTorch's numbers.

use draftc_ops::elementwise::{binary, geglu, reference, silu, BinaryOp};
use draftc_ops::testing::{
    assert_close, assert_close_terms, awkward_size, config, float_dtype, random_f32, round_to,
    test_client,
};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

fn op() -> impl Strategy<Value = BinaryOp> {
    prop_oneof![
        Just(BinaryOp::Add),
        Just(BinaryOp::Mul),
        Just(BinaryOp::SwiGlu),
        Just(BinaryOp::GeGlu)
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

    #[test]
    fn geglu_matches_reference(n in awkward_size(3000), dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let a = random_f32(seed, n, -10.0, 10.0, dtype);
        let b = random_f32(seed ^ 5, n, -2.0, 2.0, dtype);
        let at = DeviceTensor::upload_f32(&client, &a, &[n], dtype).unwrap();
        let bt = DeviceTensor::upload_f32(&client, &b, &[n], dtype).unwrap();
        geglu(&client, &at, &bt, &at).unwrap(); // in place
        let want = reference::binary(&a, &b, BinaryOp::GeGlu);
        assert_close("geglu", &at.download_f32(&client).unwrap(), &want, dtype)?;
    }
}

/// `reference::gelu_tanh` is PyTorch's `gelu(x, approximate="tanh")`: the
/// values PyTorch 2 prints for f32 inputs, to PyTorch's own rounding.
#[test]
fn gelu_tanh_reference_is_pytorchs() {
    for (x, torch) in [
        (-5.0f32, -2.980_232_2e-7),
        (-3.0, -0.003_637_433),
        (-1.0, -0.158_808),
        (-1e-3, -4.996_010_7e-4),
        (0.0, 0.0),
        (0.5, 0.345_714),
        (1.0, 0.841_192),
        (3.0, 2.996_362_7),
        (5.0, 4.999_999_5),
        (10.0, 10.0),
    ] {
        // PyTorch's f32 `1 + tanh(u)` cancels below g ≈ −3 (−2.98e-7 at
        // −5, true −2.29e-7): agreement to 1e-6 absolute, as close as
        // PyTorch's own rounding allows.
        let r = reference::gelu_tanh(x);
        assert!(
            (r - torch).abs() <= 1e-6 * torch.abs() + 1e-6,
            "gelu_tanh({x}) = {r}, PyTorch {torch}"
        );
    }
}

/// `geglu` value by value where the tanh GELU is hard: a dense grid over
/// [-6, 6] and the tails, where `exp(±2u)` or `g³` overflow f32, with slack
/// `tol · (|expected| + 1)` per element (an erf GELU, 4.7e-4 off, fails in
/// f32), and never a non-finite output for a finite input.
#[test]
fn geglu_tails_and_grid() {
    let client = test_client();
    let grid = (0..2401).map(|i| -6.0 + i as f32 * 0.005);
    let tails = [
        -60000.0, -1000.0, -88.0, -20.0, -10.5, -10.0, -9.5, -7.0, -5.0, -3.0, -1e-3, 0.0, 1e-3,
        3.0, 5.0, 9.5, 10.0, 10.5, 20.0, 88.0, 1000.0, 60000.0,
    ];
    let f32_only = [-3e38, -1e13, -1e4, 1e4, 1e13, 3e38];
    for dtype in [DType::F32, DType::F16] {
        let mut a: Vec<f32> = grid.clone().chain(tails).collect();
        if dtype == DType::F32 {
            a.extend(f32_only);
        }
        let a = round_to(dtype, &a);
        // Up factors in [0.5, 2] on the grid, 1 on the tails (3e38 · 2 is inf).
        let mut b = random_f32(3, 2401, 0.5, 2.0, dtype);
        b.resize(a.len(), 1.0);
        let n = a.len();
        let at = DeviceTensor::upload_f32(&client, &a, &[n], dtype).unwrap();
        let bt = DeviceTensor::upload_f32(&client, &b, &[n], dtype).unwrap();
        let out = DeviceTensor::empty(&client, &[n], dtype);
        geglu(&client, &at, &bt, &out).unwrap();
        let got = out.download_f32(&client).unwrap();
        let want = reference::binary(&a, &b, BinaryOp::GeGlu);
        assert!(got.iter().all(|v| v.is_finite()), "non-finite geglu output");
        let magnitude: Vec<f32> = want.iter().map(|e| e.abs() + 1.0).collect();
        assert_close_terms(&format!("geglu {dtype}"), &got, &want, &magnitude, dtype).unwrap();
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
