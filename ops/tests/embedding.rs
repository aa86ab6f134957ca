//! Embedding gather against the reference; out-of-range ids are errors
//! (`embedding`) or gather the last row (`embedding_clamped`).

use draftc_ops::embedding::{embedding, embedding_clamped, lookup_u32, reference};
use draftc_ops::testing::{awkward_size, config, float_dtype, random_f32, random_u32, test_client};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

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
}
