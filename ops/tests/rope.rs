//! RoPE against the reference (HF rotate_half), explicit positions incl.
//! large ones, f32 and f16.

use draftc_ops::kv::RowIndex;
use draftc_ops::rope::{
    reference, rope, rope_append, rope_freqs, rope_qkv_append, rope_with_freqs,
};
use draftc_ops::testing::{
    assert_close, awkward_size, config, distinct_slots, float_dtype, random_f32, random_u32,
    test_client, TestRuntime,
};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn rope_matches_reference(t in awkward_size(64), heads in 1usize..10, half in prop_oneof![Just(1usize), Just(3), Just(32), 1usize..70],
                              max_pos in prop_oneof![Just(1u32), Just(8192u32)], theta in prop_oneof![Just(10_000f32), Just(100_000f32)],
                              dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let hd = 2 * half;
        let x = random_f32(seed, t * heads * hd, -2.0, 2.0, dtype);
        let pos = random_u32(seed ^ 3, t, max_pos);
        let xt = DeviceTensor::upload_f32(&client, &x, &[t, heads, hd], dtype).unwrap();
        let pt = DeviceTensor::upload_u32(&client, &pos, &[t]).unwrap();
        let out = DeviceTensor::empty(&client, &[t, heads, hd], dtype);
        rope(&client, &xt, &pt, theta, &out).unwrap();
        let want = reference::rope(&x, &pos, heads, hd, theta);
        assert_close("rope", &out.download_f32(&client).unwrap(), &want, dtype)?;
        // The same with frequencies built once (what the executor keeps).
        let freqs = rope_freqs(&client, hd, theta).unwrap();
        rope_with_freqs(&client, &xt, &pt, &freqs, &out).unwrap();
        assert_close("rope_with_freqs", &out.download_f32(&client).unwrap(), &want, dtype)?;
    }
}

#[test]
fn position_zero_is_identity_and_tree_positions_repeat() {
    let client = test_client();
    // Two tree nodes at the same depth get the same rotation.
    let x = random_f32(4, 2 * 8, -1.0, 1.0, DType::F32);
    let x2: Vec<f32> = x[..8].iter().chain(&x[..8]).copied().collect();
    let xt = DeviceTensor::upload_f32(&client, &x2, &[2, 1, 8], DType::F32).unwrap();
    let pt = DeviceTensor::upload_u32(&client, &[5, 5], &[2]).unwrap();
    rope(&client, &xt, &pt, 1e4, &xt).unwrap();
    let got = xt.download_f32(&client).unwrap();
    assert_eq!(got[..8], got[8..]);
    let z = DeviceTensor::upload_f32(&client, &x[..8], &[1, 1, 8], DType::F32).unwrap();
    let p0 = DeviceTensor::upload_u32(&client, &[0], &[1]).unwrap();
    rope(&client, &z, &p0, 1e4, &z).unwrap();
    assert_eq!(z.download_f32(&client).unwrap(), x[..8]);
}

#[test]
fn errors() {
    let client = test_client();
    let x = DeviceTensor::zeros(&client, &[2, 1, 7], DType::F32);
    let p = DeviceTensor::upload_u32(&client, &[0, 1], &[2]).unwrap();
    assert!(matches!(
        rope(&client, &x, &p, 1e4, &x),
        Err(OpsError::InvalidArgument { .. })
    ));
    let x = DeviceTensor::zeros(&client, &[2, 1, 8], DType::F32);
    let p3 = DeviceTensor::upload_u32(&client, &[0, 1, 2], &[3]).unwrap();
    assert!(matches!(
        rope(&client, &x, &p3, 1e4, &x),
        Err(OpsError::ShapeMismatch {
            arg: "positions",
            ..
        })
    ));
    // Frequencies built for another head size.
    let f6 = rope_freqs(&client, 6, 1e4).unwrap();
    assert!(matches!(
        rope_with_freqs(&client, &x, &p, &f6, &x),
        Err(OpsError::ShapeMismatch { arg: "freqs", .. })
    ));
    assert!(rope_freqs::<TestRuntime>(&client, 7, 1e4).is_err());
    assert!(rope_freqs::<TestRuntime>(&client, 8, 0.5).is_err());
    let x2 = DeviceTensor::zeros(&client, &[2, 8], DType::F32);
    assert!(matches!(
        rope(&client, &x2, &p, 1e4, &x2),
        Err(OpsError::ShapeMismatch { arg: "x", .. })
    ));
}

proptest! {
    #![proptest_config(config(16))]

    /// RoPE on new K rows fused with the K and V appends equals the
    /// reference's rotation then row writes, at distinct random slots.
    #[test]
    fn rope_append_matches_reference(n in awkward_size(24), heads in 1usize..5, half in prop_oneof![Just(1usize), Just(32), 1usize..40],
                                     extra in 0usize..40, dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let hd = 2 * half;
        let width = heads * hd;
        let rows = n + extra;
        let k = random_f32(seed, n * width, -2.0, 2.0, dtype);
        let v = random_f32(seed ^ 1, n * width, -2.0, 2.0, dtype);
        let pos = random_u32(seed ^ 3, n, 4096);
        let slots = distinct_slots(seed, rows, n);
        let k0 = random_f32(seed ^ 5, rows * width, -1.0, 1.0, dtype);
        let v0 = random_f32(seed ^ 7, rows * width, -1.0, 1.0, dtype);
        let kt = DeviceTensor::upload_f32(&client, &k, &[n, heads, hd], dtype).unwrap();
        let vt = DeviceTensor::upload_f32(&client, &v, &[n, heads, hd], dtype).unwrap();
        let pt = DeviceTensor::upload_u32(&client, &pos, &[n]).unwrap();
        let kc = DeviceTensor::upload_f32(&client, &k0, &[rows, width], dtype).unwrap();
        let vc = DeviceTensor::upload_f32(&client, &v0, &[rows, width], dtype).unwrap();
        let freqs = rope_freqs(&client, hd, 1e4).unwrap();
        let idx = RowIndex::upload(&client, &slots).unwrap();
        rope_append(&client, &kt, &vt, &pt, &freqs, &idx, &kc, &vc).unwrap();
        let (mut want_k, mut want_v) = (k0.clone(), v0.clone());
        reference::rope_append(&k, &v, &pos, &slots, heads, hd, 1e4, &mut want_k, &mut want_v);
        assert_close("rope_append k", &kc.download_f32(&client).unwrap(), &want_k, dtype)?;
        // V rows and untouched rows are copies: exact.
        prop_assert_eq!(vc.download_f32(&client).unwrap(), want_v);
    }
}

#[test]
fn rope_append_errors() {
    let client = test_client();
    let k = DeviceTensor::zeros(&client, &[2, 1, 8], DType::F32);
    let p = DeviceTensor::upload_u32(&client, &[0, 1], &[2]).unwrap();
    let f = rope_freqs(&client, 8, 1e4).unwrap();
    let cache = DeviceTensor::zeros(&client, &[4, 8], DType::F32);
    let twice = RowIndex::upload(&client, &[1, 1]).unwrap();
    assert!(matches!(
        rope_append(&client, &k, &k, &p, &f, &twice, &cache, &cache),
        Err(OpsError::InvalidArgument { .. })
    ));
    let far = RowIndex::upload(&client, &[0, 4]).unwrap();
    assert!(matches!(
        rope_append(&client, &k, &k, &p, &f, &far, &cache, &cache),
        Err(OpsError::IndexOutOfRange { .. })
    ));
    let one = RowIndex::upload(&client, &[0]).unwrap();
    assert!(matches!(
        rope_append(&client, &k, &k, &p, &f, &one, &cache, &cache),
        Err(OpsError::ShapeMismatch { arg: "slots", .. })
    ));
    let narrow = DeviceTensor::zeros(&client, &[4, 6], DType::F32);
    let ok = RowIndex::upload(&client, &[0, 3]).unwrap();
    assert!(matches!(
        rope_append(&client, &k, &k, &p, &f, &ok, &narrow, &cache),
        Err(OpsError::ShapeMismatch { arg: "k_cache", .. })
    ));
}

proptest! {
    #![proptest_config(config(16))]

    /// The fused q/k/v step (RoPE on q and k, both appends) equals the
    /// reference: queries rotated, K rows rotated and V rows copied into
    /// the caches at distinct random slots, every other cache row kept.
    #[test]
    fn rope_qkv_append_matches_reference(n in awkward_size(24), kv_heads in 1usize..4, group in 1usize..4,
                                         half in prop_oneof![Just(1usize), Just(32), 1usize..40],
                                         extra in 0usize..40, dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let (heads, hd) = (kv_heads * group, 2 * half);
        let (qw, kw) = (heads * hd, kv_heads * hd);
        let rows = n + extra;
        let qkv = random_f32(seed, n * (qw + 2 * kw), -2.0, 2.0, dtype);
        let pos = random_u32(seed ^ 3, n, 8192);
        let slots = distinct_slots(seed, rows, n);
        let k0 = random_f32(seed ^ 5, rows * kw, -1.0, 1.0, dtype);
        let v0 = random_f32(seed ^ 7, rows * kw, -1.0, 1.0, dtype);
        let xt = DeviceTensor::upload_f32(&client, &qkv, &[n, qw + 2 * kw], dtype).unwrap();
        let pt = DeviceTensor::upload_u32(&client, &pos, &[n]).unwrap();
        let q = DeviceTensor::empty(&client, &[n, heads, hd], dtype);
        let kc = DeviceTensor::upload_f32(&client, &k0, &[rows, kw], dtype).unwrap();
        let vc = DeviceTensor::upload_f32(&client, &v0, &[rows, kw], dtype).unwrap();
        let freqs = rope_freqs(&client, hd, 1e5).unwrap();
        let idx = RowIndex::upload(&client, &slots).unwrap();
        rope_qkv_append(&client, &xt, &pt, &freqs, &idx, &q, &kc, &vc).unwrap();
        let (mut want_k, mut want_v) = (k0.clone(), v0.clone());
        let want_q = reference::rope_qkv_append(
            &qkv, &pos, &slots, heads, kv_heads, hd, 1e5, &mut want_k, &mut want_v,
        );
        assert_close("rope_qkv_append q", &q.download_f32(&client).unwrap(), &want_q, dtype)?;
        assert_close("rope_qkv_append k", &kc.download_f32(&client).unwrap(), &want_k, dtype)?;
        // V rows and untouched rows are copies: exact.
        prop_assert_eq!(vc.download_f32(&client).unwrap(), want_v);
    }
}

#[test]
fn rope_qkv_append_errors() {
    let client = test_client();
    // 2 query heads, 1 kv head of 8: the fused row is 32 wide.
    let qkv = DeviceTensor::zeros(&client, &[2, 32], DType::F32);
    let q = DeviceTensor::zeros(&client, &[2, 2, 8], DType::F32);
    let p = DeviceTensor::upload_u32(&client, &[0, 1], &[2]).unwrap();
    let f = rope_freqs(&client, 8, 1e4).unwrap();
    let cache = DeviceTensor::zeros(&client, &[4, 8], DType::F32);
    let ok = RowIndex::upload(&client, &[0, 3]).unwrap();
    rope_qkv_append(&client, &qkv, &p, &f, &ok, &q, &cache, &cache).unwrap();
    let wide = DeviceTensor::zeros(&client, &[2, 40], DType::F32);
    assert!(matches!(
        rope_qkv_append(&client, &wide, &p, &f, &ok, &q, &cache, &cache),
        Err(OpsError::ShapeMismatch { arg: "qkv", .. })
    ));
    let twice = RowIndex::upload(&client, &[1, 1]).unwrap();
    assert!(matches!(
        rope_qkv_append(&client, &qkv, &p, &f, &twice, &q, &cache, &cache),
        Err(OpsError::InvalidArgument { .. })
    ));
    let far = RowIndex::upload(&client, &[0, 4]).unwrap();
    assert!(matches!(
        rope_qkv_append(&client, &qkv, &p, &f, &far, &q, &cache, &cache),
        Err(OpsError::IndexOutOfRange { .. })
    ));
    let ragged = DeviceTensor::zeros(&client, &[4, 6], DType::F32);
    assert!(matches!(
        rope_qkv_append(&client, &qkv, &p, &f, &ok, &q, &ragged, &ragged),
        Err(OpsError::InvalidArgument { .. })
    ));
    let odd = DeviceTensor::zeros(&client, &[2, 2, 7], DType::F32);
    assert!(matches!(
        rope_qkv_append(&client, &qkv, &p, &f, &ok, &odd, &cache, &cache),
        Err(OpsError::InvalidArgument { .. })
    ));
}
