//! Kept buffers (`draftc_ops::kept`): a dropped buffer is written in place
//! by the next upload of its class, with no allocation, and the write
//! queues after the launches that read the buffer before (in-order
//! streams), flushed or not.

use draftc_ops::counters::snapshot;
use draftc_ops::embedding::embedding_clamped;
use draftc_ops::launch::defer_flushes;
use draftc_ops::testing::{config, random_f32, random_u32, test_client};
use draftc_ops::{DType, DeviceTensor};
use proptest::prelude::*;

/// Uploads after the first of each class allocate nothing, and every
/// upload reads back as written (a reused buffer holds the new data).
#[test]
fn reused_uploads_allocate_nothing_and_hold_their_data() {
    let client = test_client();
    let before = snapshot();
    for round in 0..4u32 {
        let ids: Vec<u32> = (0..37).map(|i| i * 7 + round).collect();
        let packed: Vec<u32> = (0..300).map(|i| i ^ round).collect();
        let t = DeviceTensor::upload_u32(&client, &ids, &[ids.len()]).unwrap();
        let p =
            DeviceTensor::upload_u32_packed(&client, &[(&packed, &[300]), (&ids, &[37])]).unwrap();
        let out = DeviceTensor::empty(&client, &[64], DType::F32);
        assert_eq!(t.download_u32(&client).unwrap(), ids);
        assert_eq!(p[0].download_u32(&client).unwrap(), packed);
        assert_eq!(p[1].download_u32(&client).unwrap(), ids);
        assert_eq!(out.shape(), &[64]);
        let c = snapshot().since(&before);
        // One buffer per class, made in round 0 and reused after.
        assert_eq!(c.allocations, 3, "round {round}: {c:?}");
        assert_eq!(c.uploads, 2 * (u64::from(round) + 1));
    }
}

/// A held buffer is never handed out: two live uploads of one class are
/// two buffers.
#[test]
fn held_buffers_are_not_shared() {
    let client = test_client();
    let a = DeviceTensor::upload_u32(&client, &[1, 2, 3], &[3]).unwrap();
    let b = DeviceTensor::upload_u32(&client, &[4, 5, 6], &[3]).unwrap();
    assert_eq!(a.download_u32(&client).unwrap(), [1, 2, 3]);
    assert_eq!(b.download_u32(&client).unwrap(), [4, 5, 6]);
}

proptest! {
    #![proptest_config(config(8))]

    /// Launch a gather reading ids A, drop A, upload ids B (same class:
    /// A's buffer, rewritten), gather again, all without a flush between:
    /// the first gather still saw A.
    #[test]
    fn a_rewrite_waits_for_the_launches_before_it(
        t in 1usize..40, d in 1usize..20, seed in any::<u64>(), deferred in any::<bool>()
    ) {
        let client = test_client();
        let vocab = 50;
        let table = random_f32(seed, vocab * d, -1.0, 1.0, DType::F32);
        let tt = DeviceTensor::upload_f32(&client, &table, &[vocab, d], DType::F32).unwrap();
        let (ids_a, ids_b) = (random_u32(seed ^ 1, t, vocab as u32), random_u32(seed ^ 2, t, vocab as u32));
        let (out_a, out_b) = (
            DeviceTensor::empty(&client, &[t, d], DType::F32),
            DeviceTensor::empty(&client, &[t, d], DType::F32),
        );
        {
            let _defer = deferred.then(defer_flushes);
            let a = DeviceTensor::upload_u32(&client, &ids_a, &[t]).unwrap();
            embedding_clamped(&client, &tt, &a, &out_a).unwrap();
            drop(a);
            let before = snapshot();
            let b = DeviceTensor::upload_u32(&client, &ids_b, &[t]).unwrap();
            prop_assert_eq!(snapshot().since(&before).allocations, 0, "A's buffer was not reused");
            embedding_clamped(&client, &tt, &b, &out_b).unwrap();
        }
        let gather = |ids: &[u32]| -> Vec<f32> {
            ids.iter().flat_map(|&i| table[i as usize * d..(i as usize + 1) * d].to_vec()).collect()
        };
        prop_assert_eq!(out_a.download_f32(&client).unwrap(), gather(&ids_a));
        prop_assert_eq!(out_b.download_f32(&client).unwrap(), gather(&ids_b));
    }
}
