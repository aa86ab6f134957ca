//! Per-head RMS norm then optional RoPE against the reference: ragged
//! token counts, head sizes 2 to 256, Qwen 3 (`w`) and Gemma 3 (`1 + w`)
//! scaling, large positions, both input layouts, out of place and in place
//! (bit for bit the same), f32 and f16; no launch for t = 0; errors.

use draftc_ops::counters;
use draftc_ops::head_norm::{head_norm_rope, reference};
use draftc_ops::rope::{rope_freqs, upload_freqs};
use draftc_ops::testing::{
    assert_close, awkward_size, config, float_dtype, random_f32, random_u32, test_client,
    TestRuntime,
};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

type Tensor = DeviceTensor<TestRuntime>;

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn head_norm_rope_matches_reference(
        t in awkward_size(50), heads in 1usize..6,
        hd in prop_oneof![Just(2usize), Just(24), Just(64), Just(256), (1usize..40).prop_map(|h| 2 * h)],
        with_rope in any::<bool>(), unit_offset in any::<bool>(), flat in any::<bool>(),
        max_pos in prop_oneof![Just(1u32), Just(8192), Just(1 << 16)],
        // A small input scale makes eps matter (mean square ≈ 3e-5).
        scale in prop_oneof![Just(2f32), Just(0.01)],
        eps in prop_oneof![Just(1e-6f32), Just(1e-5), Just(0.1)],
        dtype in float_dtype(), seed in any::<u64>(),
    ) {
        let client = test_client();
        let x = random_f32(seed, t * heads * hd, -scale, scale, dtype);
        let w = random_f32(seed ^ 1, hd, -1.0, 1.0, dtype);
        let pos = random_u32(seed ^ 3, t, max_pos);
        let shape = if flat { vec![t, heads * hd] } else { vec![t, heads, hd] };
        let xt = DeviceTensor::upload_f32(&client, &x, &shape, dtype).unwrap();
        let wt = DeviceTensor::upload_f32(&client, &w, &[hd], dtype).unwrap();
        let pt = DeviceTensor::upload_u32(&client, &pos, &[t]).unwrap();
        let freqs = rope_freqs(&client, hd, 1e6).unwrap();
        let host_freqs = draftc_ops::rope::reference::inv_freq(hd, 1e6);
        let rope = with_rope.then_some((&pt, &freqs));
        let want = reference::head_norm_rope(
            &x, &w, heads, hd, eps, unit_offset,
            with_rope.then_some((&pos[..], &host_freqs[..])),
        );

        // Out of place, into the other layout.
        let out = DeviceTensor::empty(&client, &[t, heads, hd], dtype);
        head_norm_rope(&client, &xt, &wt, rope, eps, unit_offset, &out).unwrap();
        let got = out.download_f32(&client).unwrap();
        assert_close("head_norm_rope", &got, &want, dtype)?;

        // In place (what the executor does): the same bits.
        head_norm_rope(&client, &xt, &wt, rope, eps, unit_offset, &xt).unwrap();
        prop_assert_eq!(xt.download_f32(&client).unwrap(), got);
    }
}

#[test]
fn gemma_zero_weight_is_plain_norm_and_tree_positions_repeat() {
    let client = test_client();
    let hd = 8;
    // Two tokens with the same head at the same depth: the same output.
    let h = random_f32(9, hd, -1.0, 1.0, DType::F32);
    let x: Vec<f32> = h.iter().chain(&h).copied().collect();
    let xt = DeviceTensor::upload_f32(&client, &x, &[2, 1, hd], DType::F32).unwrap();
    let zero = DeviceTensor::zeros(&client, &[hd], DType::F32);
    let pt = DeviceTensor::upload_u32(&client, &[7, 7], &[2]).unwrap();
    let freqs = upload_freqs(&client, &[1.0, 0.5, 0.25, 0.125]).unwrap();
    head_norm_rope(&client, &xt, &zero, Some((&pt, &freqs)), 0.0, true, &xt).unwrap();
    let got = xt.download_f32(&client).unwrap();
    assert_eq!(got[..hd], got[hd..]);
    // 1 + 0 scaling, no rotation: x / rms(x), whose mean square is 1.
    let xt = DeviceTensor::upload_f32(&client, &h, &[1, 1, hd], DType::F32).unwrap();
    head_norm_rope(&client, &xt, &zero, None, 0.0, true, &xt).unwrap();
    let got = xt.download_f32(&client).unwrap();
    let ms = got.iter().map(|v| v * v).sum::<f32>() / hd as f32;
    assert!((ms - 1.0).abs() < 1e-5, "mean square {ms}");
}

#[test]
fn odd_head_dim_without_rope() {
    let client = test_client();
    let (t, heads, hd) = (3, 2, 7);
    let x = random_f32(5, t * heads * hd, -2.0, 2.0, DType::F32);
    let w = random_f32(6, hd, 0.5, 1.5, DType::F32);
    let xt = DeviceTensor::upload_f32(&client, &x, &[t, heads, hd], DType::F32).unwrap();
    let wt = DeviceTensor::upload_f32(&client, &w, &[hd], DType::F32).unwrap();
    head_norm_rope(&client, &xt, &wt, None, 1e-6, false, &xt).unwrap();
    let want = reference::head_norm_rope(&x, &w, heads, hd, 1e-6, false, None);
    assert_close(
        "odd head_dim",
        &xt.download_f32(&client).unwrap(),
        &want,
        DType::F32,
    )
    .unwrap();
}

#[test]
fn no_tokens_launch_nothing() {
    let client = test_client();
    let x = DeviceTensor::empty(&client, &[0, 4, 8], DType::F32);
    let w = DeviceTensor::zeros(&client, &[8], DType::F32);
    let p = DeviceTensor::upload_u32(&client, &[], &[0]).unwrap();
    let f = rope_freqs(&client, 8, 1e4).unwrap();
    let before = counters::snapshot();
    head_norm_rope(&client, &x, &w, Some((&p, &f)), 1e-6, false, &x).unwrap();
    head_norm_rope(&client, &x, &w, None, 1e-6, true, &x).unwrap();
    assert_eq!(counters::snapshot().since(&before).launches, 0);
}

#[test]
fn errors() {
    let client = test_client();
    let x = DeviceTensor::zeros(&client, &[2, 3, 8], DType::F32);
    let w = DeviceTensor::zeros(&client, &[8], DType::F32);
    let p = DeviceTensor::upload_u32(&client, &[0, 1], &[2]).unwrap();
    let f = rope_freqs(&client, 8, 1e4).unwrap();
    let rope = Some((&p, &f));
    let call = |x: &Tensor, w: &Tensor, rope: Option<(&Tensor, &Tensor)>, out: &Tensor| {
        head_norm_rope(&client, x, w, rope, 1e-6, false, out)
    };
    call(&x, &w, rope, &x).unwrap();
    let shape_err = |r: Result<(), OpsError>, want: &str| match r {
        Err(OpsError::ShapeMismatch { arg, .. }) => assert_eq!(arg, want),
        other => panic!("expected a shape mismatch of `{want}`, got {other:?}"),
    };
    // Weight of another head size, or not [head_dim].
    let w6 = DeviceTensor::zeros(&client, &[6], DType::F32);
    shape_err(call(&x, &w6, rope, &x), "weight");
    let w2d = DeviceTensor::zeros(&client, &[1, 8], DType::F32);
    shape_err(call(&x, &w2d, rope, &x), "weight");
    // A flat x whose width is not a multiple of head_dim; a rank-1 x.
    let x20 = DeviceTensor::zeros(&client, &[2, 20], DType::F32);
    shape_err(call(&x20, &w, None, &x20), "x");
    let x1 = DeviceTensor::zeros(&client, &[48], DType::F32);
    shape_err(call(&x1, &w, None, &x1), "x");
    // An output of another size.
    let o = DeviceTensor::zeros(&client, &[2, 2, 8], DType::F32);
    shape_err(call(&x, &w, rope, &o), "out");
    // Positions not [t]; frequencies for another head size.
    let p3 = DeviceTensor::upload_u32(&client, &[0, 1, 2], &[3]).unwrap();
    shape_err(call(&x, &w, Some((&p3, &f)), &x), "positions");
    let f6 = rope_freqs(&client, 6, 1e4).unwrap();
    shape_err(call(&x, &w, Some((&p, &f6)), &x), "freqs");
    // An odd head_dim with RoPE (fine without: `odd_head_dim_without_rope`).
    let x7 = DeviceTensor::zeros(&client, &[2, 3, 7], DType::F32);
    let w7 = DeviceTensor::zeros(&client, &[7], DType::F32);
    assert!(matches!(
        call(&x7, &w7, rope, &x7),
        Err(OpsError::InvalidArgument { .. })
    ));
    // Dtypes: an f16 weight or output for f32 x; u32 positions given as f32.
    let wh = DeviceTensor::zeros(&client, &[8], DType::F16);
    assert!(matches!(
        call(&x, &wh, rope, &x),
        Err(OpsError::DTypeMismatch { arg: "weight", .. })
    ));
    let oh = DeviceTensor::zeros(&client, &[2, 3, 8], DType::F16);
    assert!(matches!(
        call(&x, &w, rope, &oh),
        Err(OpsError::DTypeMismatch { arg: "out", .. })
    ));
    let pf = DeviceTensor::zeros(&client, &[2], DType::F32);
    assert!(matches!(
        call(&x, &w, Some((&pf, &f)), &x),
        Err(OpsError::DTypeMismatch {
            arg: "positions",
            ..
        })
    ));
    // Bad eps.
    for eps in [-1e-6, f32::NAN, f32::INFINITY] {
        assert!(matches!(
            head_norm_rope(&client, &x, &w, None, eps, false, &x),
            Err(OpsError::InvalidArgument { .. })
        ));
    }
}
