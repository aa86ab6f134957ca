//! Embedding gather against the reference; out-of-range ids are errors
//! (`embedding`) or gather the last row (`embedding_clamped`). The scaled
//! gather (`embedding_scaled`, `embedding_clamped_scaled`) alike, its
//! product rounded once to the storage type. Tables over the binding
//! limit (a small limit passed to `embedding_with_binding_limit`) are
//! gathered chunk by chunk with the same results.

use draftc_ops::embedding::{
    embedding, embedding_clamped, embedding_clamped_scaled, embedding_scaled,
    embedding_with_binding_limit, lookup_u32, reference, rows_per_binding,
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

/// Rows whose bytes are a multiple of 256 (the chunk offset alignment).
fn align_rows(row_bytes: usize) -> usize {
    let mut a = 1;
    while !(a * row_bytes).is_multiple_of(256) {
        a *= 2;
    }
    a
}

/// Uploads `table` `[vocab, d]` and `ids` and runs the gather (`scale`
/// `None`: plain; `check`: ids read back, else clamped) under a binding
/// limit of `limit` bytes.
#[allow(clippy::too_many_arguments)]
fn run_split(
    table: &[f32],
    vocab: usize,
    d: usize,
    ids: &[u32],
    scale: Option<f32>,
    check: bool,
    dtype: DType,
    limit: usize,
) -> Result<Vec<f32>, OpsError> {
    let client = test_client();
    let tt = DeviceTensor::upload_f32(&client, table, &[vocab, d], dtype).unwrap();
    let it = DeviceTensor::upload_u32(&client, ids, &[ids.len()]).unwrap();
    let out = DeviceTensor::empty(&client, &[ids.len(), d], dtype);
    embedding_with_binding_limit(&client, &tt, &it, scale, check, &out, limit)?;
    Ok(out.download_f32(&client).unwrap())
}

/// The split gather's output for `ids` against the reference (ids clamped
/// to the last row): exact when plain, [`check_scaled`] when scaled.
fn check_split(
    got: &[f32],
    table: &[f32],
    vocab: usize,
    d: usize,
    ids: &[u32],
    scale: Option<f32>,
    dtype: DType,
) -> Result<(), TestCaseError> {
    let clamped: Vec<u32> = ids.iter().map(|&i| i.min(vocab as u32 - 1)).collect();
    match scale {
        None => prop_assert_eq!(got, &reference::embedding(table, d, &clamped)[..]),
        Some(s) => check_scaled(
            got,
            &reference::embedding_scaled(table, d, &clamped, s),
            dtype,
        )?,
    }
    Ok(())
}

/// Ids of every chunk of `max_rows` rows: each chunk's first and last row
/// (its boundaries with its neighbours), then random ids below `vocab`.
fn boundary_ids(seed: u64, vocab: usize, max_rows: usize, extra: usize) -> Vec<u32> {
    let mut ids = Vec::new();
    for r0 in (0..vocab).step_by(max_rows) {
        let last = (r0 + max_rows).min(vocab) - 1;
        ids.extend([r0 as u32, last as u32]);
    }
    ids.extend(random_u32(seed, extra, vocab as u32));
    ids
}

/// A table split into `chunks` (2–7) chunks of `max_rows` rows (a multiple
/// of the aligned row count), the last ragged (`last` rows), under a
/// limit at or a little above the chunk's bytes.
fn split_case() -> impl Strategy<Value = (usize, usize, DType, usize, usize, usize)> {
    (
        prop_oneof![
            Just(1usize),
            Just(2),
            Just(3),
            Just(4),
            Just(6),
            Just(8),
            Just(50),
            Just(130),
            Just(640)
        ],
        float_dtype(),
        2usize..=7,
        1usize..=40,
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(d, dtype, chunks, m, last, slack)| {
            let row_bytes = d * dtype.size();
            let max_rows = m.div_ceil(align_rows(row_bytes)) * align_rows(row_bytes);
            let last = last.index(max_rows) + 1;
            let vocab = (chunks - 1) * max_rows + last;
            let limit = max_rows * row_bytes + slack.index(row_bytes);
            (d, vocab, dtype, chunks, max_rows, limit)
        })
}

proptest! {
    #![proptest_config(config(16))]

    /// Split tables, all four gathers, f32 and f16: ids in every chunk and
    /// at every chunk boundary equal the reference; past the end they are
    /// an error (checked) or the last row (clamped).
    #[test]
    fn split_gathers_match_reference((d, vocab, dtype, chunks, max_rows, limit) in split_case(),
                                     scale in prop::option::of(any_scale()), seed in any::<u64>()) {
        let row_bytes = d * dtype.size();
        prop_assert_eq!(rows_per_binding(row_bytes, limit), max_rows);
        prop_assert_eq!(vocab.div_ceil(max_rows), chunks);
        prop_assert!(vocab * row_bytes > limit);
        let table = random_f32(seed, vocab * d, -1.0, 1.0, dtype);
        let ids = boundary_ids(seed ^ 5, vocab, max_rows, 9);
        for check in [true, false] {
            let got = run_split(&table, vocab, d, &ids, scale, check, dtype, limit).unwrap();
            check_split(&got, &table, vocab, d, &ids, scale, dtype)?;
        }
        let mut past = ids.clone();
        past.extend([vocab as u32, vocab as u32 + 7, u32::MAX]);
        let got = run_split(&table, vocab, d, &past, scale, false, dtype, limit).unwrap();
        check_split(&got, &table, vocab, d, &past, scale, dtype)?;
        let err = run_split(&table, vocab, d, &past, scale, true, dtype, limit);
        let is_index_error = matches!(
            err,
            Err(OpsError::IndexOutOfRange { position, index, bound, .. })
                if position == ids.len() && index == vocab as u64 && bound == vocab
        );
        prop_assert!(is_index_error, "{:?}", err);
    }
}

/// Gemma 3's width (640) and a vector-width-1 row, f32 and f16, all four
/// gathers: the split gather equals the single-binding one element for
/// element (the same rounding), and the reference.
#[test]
fn split_equals_single_binding() {
    for dtype in [DType::F32, DType::F16] {
        for (d, vocab) in [(640usize, 23usize), (3, 1000)] {
            let row_bytes = d * dtype.size();
            // Three full chunks and a ragged fourth.
            let max_rows =
                vocab.div_ceil(4).div_ceil(align_rows(row_bytes)) * align_rows(row_bytes);
            let limit = max_rows * row_bytes;
            assert_eq!(vocab.div_ceil(max_rows), 4, "{dtype:?} d={d}");
            let table = random_f32(d as u64, vocab * d, -2.0, 2.0, dtype);
            let ids = boundary_ids(7, vocab, max_rows, 20);
            let scale = half::f16::from_f32(640f32.sqrt()).to_f32();
            for scale in [None, Some(scale)] {
                for check in [true, false] {
                    let split = run_split(&table, vocab, d, &ids, scale, check, dtype, limit);
                    let whole = run_split(&table, vocab, d, &ids, scale, check, dtype, usize::MAX);
                    let split = split.unwrap();
                    assert_eq!(split, whole.unwrap(), "{dtype:?} d={d} {scale:?} {check}");
                    check_split(&split, &table, vocab, d, &ids, scale, dtype)
                        .unwrap_or_else(|e| panic!("{dtype:?} d={d} {scale:?}: {e}"));
                }
            }
        }
    }
}

/// The chunk sizes: as many rows as fit, in multiples of the rows whose
/// bytes are a multiple of 256 (so every chunk offset is aligned); Gemma 3
/// 270M's table in 6 chunks in f32 and 3 in f16 under 128 MiB.
#[test]
fn rows_per_binding_keeps_chunk_offsets_aligned() {
    let mib128 = 128 << 20;
    assert_eq!(rows_per_binding(640 * 4, mib128), 52_428);
    assert_eq!(262_144usize.div_ceil(52_428), 6);
    assert_eq!(rows_per_binding(640 * 2, mib128), 104_857);
    assert_eq!(262_144usize.div_ceil(104_857), 3);
    for row_bytes in [2, 4, 6, 12, 1280, 2560, 3132] {
        for limit in [1000, 4096, 5000, mib128] {
            let rows = rows_per_binding(row_bytes, limit);
            assert!(rows * row_bytes <= limit, "{row_bytes} {limit}");
            assert!(
                (rows * row_bytes).is_multiple_of(256),
                "{row_bytes} {limit}"
            );
            // The next aligned count would not fit.
            assert!((rows + align_rows(row_bytes)) * row_bytes > limit);
        }
    }
    assert_eq!(rows_per_binding(4, 1000), 192);
    assert_eq!(rows_per_binding(256 * 4, 1000), 0);
}

/// A limit under one aligned group of rows is an error, not a launch.
#[test]
fn rows_wider_than_a_binding_are_an_error() {
    let table = random_f32(1, 10 * 64, -1.0, 1.0, DType::F32);
    for scale in [None, Some(2.0)] {
        for check in [true, false] {
            let got = run_split(&table, 10, 64, &[1, 2], scale, check, DType::F32, 200);
            assert!(
                matches!(got, Err(OpsError::InvalidArgument { .. })),
                "{scale:?} {check}: {got:?}"
            );
        }
    }
}

/// The chunk kernel has its own source, plain and scaled, distinct from
/// the single-binding gathers (whose sources do not mention it).
#[test]
fn rows_source_is_a_kernel_of_its_own() {
    for dtype in [DType::F32, DType::F16] {
        let plain = KernelSpec::embedding_rows(dtype, 640, false);
        let scaled = KernelSpec::embedding_rows(dtype, 640, true);
        assert_eq!(
            scaled,
            KernelSpec::EmbeddingRows {
                dtype,
                vector: 4,
                scaled: true
            }
        );
        assert_eq!(
            plain.entry_point(),
            format!("embedding_rows_kernel_f_{dtype}_n_4")
        );
        assert!(scaled.to_string().ends_with(" scaled"), "{scaled}");
        assert!(!plain.to_string().contains("scaled"), "{plain}");
        for backend in [Backend::Cuda, Backend::Wgsl] {
            let p = source(&plain, backend).unwrap();
            let s = source(&scaled, backend).unwrap();
            assert!(p.contains(&plain.entry_point()), "{plain} {backend}\n{p}");
            assert_ne!(p, s, "{backend}");
            for single in [
                KernelSpec::embedding(dtype, 640),
                KernelSpec::embedding_scaled(dtype, 640),
            ] {
                let text = source(&single, backend).unwrap();
                assert!(!text.contains("embedding_rows"), "{single} {backend}");
            }
        }
    }
    assert_eq!(KernelSpec::embedding_rows(DType::F32, 6, true).vector(), 2);
    assert_eq!(
        KernelSpec::embedding_rows(DType::F32, 783, false).vector(),
        1
    );
}
