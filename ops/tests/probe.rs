//! The streaming-read probe against its reference: random unit counts and
//! chunk lengths (ragged, not multiples of the vector width), f32 and f16,
//! plus the divisibility error.

use draftc_ops::probe::{reference, stream_sum, stream_sum_strided};
use draftc_ops::testing::{
    assert_close_tol, awkward_size, config, float_dtype, random_f32, test_client,
};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

proptest! {
    #![proptest_config(config(12))]

    #[test]
    fn stream_sum_matches_reference(units in awkward_size(200), per in awkward_size(300),
                                    dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let x = random_f32(seed, units * per, -1.0, 1.0, dtype);
        let xt = DeviceTensor::upload_f32(&client, &x, &[units * per], dtype).unwrap();
        let out = DeviceTensor::empty(&client, &[units], DType::F32);
        stream_sum(&client, &xt, &out).unwrap();
        let got = out.download_f32(&client).unwrap();
        // Sums of up to 300 values in [-1, 1): absolute error, not relative.
        assert_close_tol("stream_sum", &got, &reference::stream_sum(&x, units), 1e-3)?;
    }
}

proptest! {
    #![proptest_config(config(12))]

    /// The GPU (coalesced) pattern against its reference.
    #[test]
    fn strided_stream_sum_matches_reference(units in awkward_size(200), per in awkward_size(300),
                                            dtype in float_dtype(), seed in any::<u64>()) {
        let client = test_client();
        let x = random_f32(seed, units * per, -1.0, 1.0, dtype);
        let xt = DeviceTensor::upload_f32(&client, &x, &[units * per], dtype).unwrap();
        let out = DeviceTensor::empty(&client, &[units], DType::F32);
        let w = stream_sum_strided(&client, &xt, &out).unwrap();
        let got = out.download_f32(&client).unwrap();
        let want = reference::stream_sum_strided(&x, units, w);
        assert_close_tol("stream_sum_strided", &got, &want, 1e-3)?;
    }
}

#[test]
fn stream_sum_rejects_uneven_chunks() {
    let client = test_client();
    let xt = DeviceTensor::upload_f32(&client, &[1.0; 10], &[10], DType::F32).unwrap();
    let out = DeviceTensor::empty(&client, &[3], DType::F32);
    let err = stream_sum(&client, &xt, &out).unwrap_err();
    assert!(matches!(err, OpsError::InvalidArgument { .. }), "{err}");
    assert!(
        err.to_string().contains("3 units do not divide 10"),
        "{err}"
    );
}

/// The GPU probe's whole path (120 MiB, sixteen launches a run) runs and
/// measures something finite; slow on lavapipe, so in the ignored tier.
#[test]
#[ignore = "reads about 12 GiB through lavapipe"]
fn gpu_probe_measures_a_bandwidth() {
    let bw = draftc_ops::probe::device_read_bandwidth(&test_client(), true).unwrap();
    assert!(bw.is_finite() && bw > 0.0, "{bw}");
}
