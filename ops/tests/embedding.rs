//! Embedding gather against the reference; out-of-range ids are errors
//! (`embedding`) or gather the last row (`embedding_clamped`). The scaled
//! gather (`embedding_scaled`, `embedding_clamped_scaled`) alike, its
//! product rounded once to the storage type.

use draftc_ops::embedding::{
    embedding, embedding_clamped, embedding_clamped_scaled, embedding_scaled, lookup_u32, reference,
};
use draftc_ops::source::{source, Backend, KernelSpec};
use draftc_ops::testing::{
    awkward_size, config, float_dtype, random_f32, random_u32, round_to, test_client,
};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

/// The scaled gather's `got` against the f32 reference `want`: equal in
/// f32 (one rounding of one product); in f16 within one step of `want`
/// rounded to f16 (the device's f32 → f16 conversion may round otherwise
/// than to nearest even).
fn check_scaled(got: &[f32], want: &[f32], dtype: DType) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    let want = round_to(dtype, want);
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let ok = match dtype {
            DType::F16 => {
                let (g, w) = (half::f16::from_f32(g), half::f16::from_f32(w));
                g == w || (g.to_bits() as i32 - w.to_bits() as i32).abs() <= 1
            }
            _ => g == w,
        };
        prop_assert!(ok, "element {}: got {}, expected {} ({:?})", i, g, w, dtype);
    }
    Ok(())
}

/// Uploads `table` `[vocab, d]` and `ids`, runs the scaled gather (checked
/// or clamped), and returns the output.
fn run_scaled(
    table: &[f32],
    vocab: usize,
    d: usize,
    ids: &[u32],
    scale: f32,
    dtype: DType,
    clamped: bool,
) -> Vec<f32> {
    let client = test_client();
    let tt = DeviceTensor::upload_f32(&client, table, &[vocab, d], dtype).unwrap();
    let it = DeviceTensor::upload_u32(&client, ids, &[ids.len()]).unwrap();
    let out = DeviceTensor::empty(&client, &[ids.len(), d], dtype);
    if clamped {
        embedding_clamped_scaled(&client, &tt, &it, scale, &out).unwrap();
    } else {
        embedding_scaled(&client, &tt, &it, scale, &out).unwrap();
    }
    out.download_f32(&client).unwrap()
}

/// Scales to try: 1 (a plain gather), Gemma 3's sqrt(640) = 25.3 and
/// sqrt(1152), its f16 rounding, and anything in [-40, 40].
fn any_scale() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(1.0f32),
        Just(25.3f32),
        Just(1152f32.sqrt()),
        Just(half::f16::from_f32(25.3).to_f32()),
        -40.0f32..40.0,
    ]
}

proptest! {
    #![proptest_config(config(16))]

    /// An id map on the device: every id, in range or past the end
    /// (clamped to the last entry), maps as the reference maps it.
    #[test]
    fn lookup_matches_reference(len in awkward_size(300), n in awkward_size(200), seed in any::<u64>()) {
        let client = test_client();
        let table = random_u32(seed, len, u32::MAX);
        let ids = random_u32(seed ^ 9, n, len as u32 + 5);
        let tt = DeviceTensor::upload_u32(&client, &table, &[len]).unwrap();
        let it = DeviceTensor::upload_u32(&client, &ids, &[n]).unwrap();
        let out = DeviceTensor::empty(&client, &[n], DType::U32);
        lookup_u32(&client, &tt, &it, &out).unwrap();
        prop_assert_eq!(out.download_u32(&client).unwrap(), reference::lookup(&table, &ids));
    }

    #[test]
    fn embedding_matches_reference(vocab in awkward_size(1000), d in awkward_size(800), t in awkward_size(64),
                                   dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let table = random_f32(seed, vocab * d, -1.0, 1.0, dtype);
        let ids = random_u32(seed ^ 5, t, vocab as u32);
        let tt = DeviceTensor::upload_f32(&client, &table, &[vocab, d], dtype).unwrap();
        let it = DeviceTensor::upload_u32(&client, &ids, &[t]).unwrap();
        let out = DeviceTensor::empty(&client, &[t, d], dtype);
        embedding(&client, &tt, &it, &out).unwrap();
        // A gather is exact.
        let want = reference::embedding(&table, d, &ids);
        prop_assert_eq!(out.download_f32(&client).unwrap(), want.clone());
        let out2 = DeviceTensor::empty(&client, &[t, d], dtype);
        embedding_clamped(&client, &tt, &it, &out2).unwrap();
        prop_assert_eq!(out2.download_f32(&client).unwrap(), want);
    }

    /// The scaled gather, checked and clamped, over ragged rows (every
    /// vector width), f32 and f16, any scale.
    #[test]
    fn embedding_scaled_matches_reference(vocab in awkward_size(1000), d in awkward_size(800),
                                          t in awkward_size(64), dtype in float_dtype(),
                                          scale in any_scale(), seed in any::<u64>()) {
        let table = random_f32(seed, vocab * d, -1.0, 1.0, dtype);
        let ids = random_u32(seed ^ 5, t, vocab as u32);
        let want = reference::embedding_scaled(&table, d, &ids, scale);
        check_scaled(&run_scaled(&table, vocab, d, &ids, scale, dtype, false), &want, dtype)?;
        check_scaled(&run_scaled(&table, vocab, d, &ids, scale, dtype, true), &want, dtype)?;
    }
}

/// Every vector width (4, 2, 1 from d = 8, 6, 3 and larger ragged rows), f32
/// and f16, at Gemma 3's scale; scale 1 is the plain gather exactly.
#[test]
fn scaled_rows_of_every_width() {
    for dtype in [DType::F32, DType::F16] {
        for d in [1, 2, 3, 4, 6, 8, 50, 130, 783] {
            let vocab = 7;
            let table = random_f32(d as u64, vocab * d, -2.0, 2.0, dtype);
            let ids = [6, 0, 3, 3, 1];
            let got = run_scaled(&table, vocab, d, &ids, 25.3, dtype, false);
            let want = reference::embedding_scaled(&table, d, &ids, 25.3);
            check_scaled(&got, &want, dtype).unwrap_or_else(|e| panic!("{dtype:?} d={d}: {e}"));
            assert_eq!(
                run_scaled(&table, vocab, d, &ids, 1.0, dtype, true),
                reference::embedding(&table, d, &ids),
                "{dtype:?} d={d}"
            );
        }
    }
}

/// An id past the end (clamped) gathers the last row, scaled; the
/// comparison tells the scaled rows from the plain ones.
#[test]
fn clamped_scaled_ids_gather_the_last_row() {
    let (vocab, d) = (10, 12);
    let table = random_f32(3, vocab * d, -1.0, 1.0, DType::F32);
    let got = run_scaled(
        &table,
        vocab,
        d,
        &[2, 10, 4_000_000_000, 9],
        25.3,
        DType::F32,
        true,
    );
    let want = reference::embedding_scaled(&table, d, &[2, 9, 9, 9], 25.3);
    check_scaled(&got, &want, DType::F32).unwrap();
    let plain = reference::embedding(&table, d, &[2, 9, 9, 9]);
    assert!(check_scaled(&plain, &want, DType::F32).is_err());
}

/// The scaled kernel has its own source (`draftc emit`), deterministic, and
/// more than the plain gather's renamed.
#[test]
fn scaled_source_is_a_kernel_of_its_own() {
    for dtype in [DType::F32, DType::F16] {
        let spec = KernelSpec::embedding_scaled(dtype, 576);
        assert_eq!(spec, KernelSpec::EmbeddingScaled { dtype, vector: 4 });
        assert_eq!(
            spec.entry_point(),
            format!("embedding_scaled_kernel_f_{dtype}_n_4")
        );
        let plain = KernelSpec::embedding(dtype, 576);
        for backend in [Backend::Cuda, Backend::Wgsl] {
            let text = source(&spec, backend).unwrap();
            assert!(
                text.contains(&spec.entry_point()),
                "{spec} {backend}\n{text}"
            );
            assert_eq!(text, source(&spec, backend).unwrap(), "{spec} {backend}");
            let plain_text = source(&plain, backend).unwrap();
            assert!(
                !plain_text.contains("embedding_scaled"),
                "{plain} {backend}"
            );
            assert_ne!(
                text,
                plain_text.replace("embedding_kernel", "embedding_scaled_kernel")
            );
        }
    }
    assert_eq!(KernelSpec::embedding_scaled(DType::F32, 6).vector(), 2);
    assert_eq!(KernelSpec::embedding_scaled(DType::F32, 783).vector(), 1);
}

#[test]
fn clamped_ids_gather_the_last_row() {
    let client = test_client();
    let host = random_f32(2, 40, -1.0, 1.0, DType::F32);
    let table = DeviceTensor::upload_f32(&client, &host, &[10, 4], DType::F32).unwrap();
    let ids = DeviceTensor::upload_u32(&client, &[3, 10, 4_000_000_000], &[3]).unwrap();
    let out = DeviceTensor::empty(&client, &[3, 4], DType::F32);
    embedding_clamped(&client, &table, &ids, &out).unwrap();
    assert_eq!(
        out.download_f32(&client).unwrap(),
        reference::embedding(&host, 4, &[3, 9, 9])
    );
}

#[test]
fn errors() {
    let client = test_client();
    let table = DeviceTensor::upload_f32(
        &client,
        &random_f32(1, 40, -1.0, 1.0, DType::F32),
        &[10, 4],
        DType::F32,
    )
    .unwrap();
    let ids = DeviceTensor::upload_u32(&client, &[3, 10, 2], &[3]).unwrap();
    let out = DeviceTensor::empty(&client, &[3, 4], DType::F32);
    assert_eq!(
        embedding(&client, &table, &ids, &out),
        Err(OpsError::IndexOutOfRange {
            op: "embedding",
            arg: "ids",
            position: 1,
            index: 10,
            bound: 10
        })
    );
    let ok = DeviceTensor::upload_u32(&client, &[3, 9, 2], &[3]).unwrap();
    let bad_out = DeviceTensor::empty(&client, &[3, 5], DType::F32);
    assert!(matches!(
        embedding(&client, &table, &ok, &bad_out),
        Err(OpsError::ShapeMismatch { arg: "out", .. })
    ));
    let fids = DeviceTensor::zeros(&client, &[3], DType::F32);
    assert!(matches!(
        embedding(&client, &table, &fids, &out),
        Err(OpsError::DTypeMismatch { arg: "ids", .. })
    ));
    let none = DeviceTensor::upload_u32(&client, &[], &[0]).unwrap();
    assert!(matches!(
        embedding(&client, &table, &none, &out),
        Err(OpsError::EmptyInput { .. })
    ));

    // The scaled gather shares the checks, under its own name.
    assert_eq!(
        embedding_scaled(&client, &table, &ids, 2.0, &out),
        Err(OpsError::IndexOutOfRange {
            op: "embedding_scaled",
            arg: "ids",
            position: 1,
            index: 10,
            bound: 10
        })
    );
    assert!(matches!(
        embedding_clamped_scaled(&client, &table, &ok, 2.0, &bad_out),
        Err(OpsError::ShapeMismatch {
            op: "embedding_scaled",
            arg: "out",
            ..
        })
    ));
    assert!(matches!(
        embedding_clamped_scaled(&client, &table, &fids, 2.0, &out),
        Err(OpsError::DTypeMismatch { arg: "ids", .. })
    ));
    let f16_out = DeviceTensor::empty(&client, &[3, 4], DType::F16);
    assert!(matches!(
        embedding_clamped_scaled(&client, &table, &ok, 2.0, &f16_out),
        Err(OpsError::DTypeMismatch { arg: "out", .. })
    ));
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for clamped in [false, true] {
            let got = if clamped {
                embedding_clamped_scaled(&client, &table, &ok, bad, &out)
            } else {
                embedding_scaled(&client, &table, &ok, bad, &out)
            };
            assert!(
                matches!(
                    got,
                    Err(OpsError::InvalidArgument {
                        op: "embedding_scaled",
                        ..
                    })
                ),
                "scale {bad}: {got:?}"
            );
        }
    }
}
