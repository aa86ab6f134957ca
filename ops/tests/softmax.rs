//! Row softmax with temperature against the reference.

use draftc_ops::softmax::{reference, softmax};
use draftc_ops::testing::{
    assert_close, awkward_size, config, float_dtype, random_f32, test_client,
};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

proptest! {
    #![proptest_config(config(16))]

    #[test]
    fn softmax_matches_reference(rows in awkward_size(40), n in prop_oneof![awkward_size(2000), Just(49152usize)],
                                 t in prop_oneof![Just(1.0f32), Just(0.7), Just(2.5)],
                                 dtype in float_dtype(), seed in any::<u64>()) {
        let rows = if n > 10_000 { rows.min(3) } else { rows };
        let client = test_client();
        let x = random_f32(seed, rows * n, -8.0, 8.0, dtype);
        let xt = DeviceTensor::upload_f32(&client, &x, &[rows, n], dtype).unwrap();
        let out = DeviceTensor::empty(&client, &[rows, n], dtype);
        softmax(&client, &xt, t, &out).unwrap();
        let got = out.download_f32(&client).unwrap();
        let want = reference::softmax(&x, n, t);
        // Each row is judged against its own scale.
        for (r, (g, w)) in got.chunks(n).zip(want.chunks(n)).enumerate() {
            assert_close(&format!("softmax row {r}"), g, w, dtype)?;
        }
    }
}

#[test]
fn errors() {
    let client = test_client();
    let x = DeviceTensor::zeros(&client, &[2, 5], DType::F32);
    assert!(matches!(
        softmax(&client, &x, 0.0, &x),
        Err(OpsError::InvalidArgument { .. })
    ));
    let o = DeviceTensor::zeros(&client, &[2, 4], DType::F32);
    assert!(matches!(
        softmax(&client, &x, 1.0, &o),
        Err(OpsError::ShapeMismatch { .. })
    ));
    let e = DeviceTensor::zeros(&client, &[2, 0], DType::F32);
    assert!(matches!(
        softmax(&client, &e, 1.0, &e),
        Err(OpsError::EmptyInput { .. })
    ));
}
