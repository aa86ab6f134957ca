//! Sampling: kernel == reference exactly for the same (seed, step), greedy
//! at temperature 0, and a frequency check of the sampled distribution.

use draftc_ops::sampling::{reference, sample, SamplingParams};
use draftc_ops::testing::{awkward_size, config, float_dtype, random_f32, test_client};
use draftc_ops::{DType, DeviceTensor, OpsError};
use proptest::prelude::*;

fn params() -> impl Strategy<Value = SamplingParams> {
    (
        prop_oneof![Just(0.0f32), Just(0.6), Just(1.0), Just(1.7)],
        prop_oneof![Just(0usize), Just(1), Just(5), Just(40)],
        prop_oneof![Just(1.0f32), Just(0.9), Just(0.3)],
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(|(temperature, top_k, top_p, seed, step)| SamplingParams {
            temperature,
            top_k,
            top_p,
            seed,
            step,
        })
}

proptest! {
    #![proptest_config(config(24))]

    #[test]
    fn sample_matches_reference(rows in awkward_size(16), n in prop_oneof![awkward_size(3000), Just(49152usize)],
                                p in params(), dtype in float_dtype(), seed in any::<u64>()) {
        let rows = if n > 10_000 { rows.min(2) } else { rows };
        let client = test_client();
        let x = random_f32(seed, rows * n, -5.0, 5.0, dtype);
        let xt = DeviceTensor::upload_f32(&client, &x, &[rows, n], dtype).unwrap();
        let out = DeviceTensor::empty(&client, &[rows], DType::U32);
        sample(&client, &xt, p, &out).unwrap();
        prop_assert_eq!(out.download_u32(&client).unwrap(), reference::sample(&x, n, p), "{:?}", p);
    }
}

#[test]
fn frequencies_follow_the_distribution() {
    // 4 tokens with probabilities 0.1, 0.2, 0.3, 0.4; 2000 rows = 2000 draws.
    let client = test_client();
    let probs = [0.1f32, 0.2, 0.3, 0.4];
    let rows = 2000;
    let x: Vec<f32> = (0..rows)
        .flat_map(|_| probs.iter().map(|p| p.ln()))
        .collect();
    let xt = DeviceTensor::upload_f32(&client, &x, &[rows, 4], DType::F32).unwrap();
    let out = DeviceTensor::empty(&client, &[rows], DType::U32);
    let p = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: 11,
        step: 3,
    };
    sample(&client, &xt, p, &out).unwrap();
    let mut counts = [0usize; 4];
    out.download_u32(&client)
        .unwrap()
        .iter()
        .for_each(|&i| counts[i as usize] += 1);
    for (c, p) in counts.iter().zip(probs) {
        let f = *c as f32 / rows as f32;
        assert!((f - p).abs() < 0.04, "counts {counts:?}");
    }
    // top_k = 1 is greedy whatever the seed.
    let p1 = SamplingParams { top_k: 1, ..p };
    sample(&client, &xt, p1, &out).unwrap();
    assert!(out.download_u32(&client).unwrap().iter().all(|&i| i == 3));
}

#[test]
fn errors() {
    let client = test_client();
    let x = DeviceTensor::zeros(&client, &[2, 5], DType::F32);
    let out = DeviceTensor::empty(&client, &[2], DType::U32);
    let p = SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
        step: 0,
    };
    assert!(matches!(
        sample(&client, &x, SamplingParams { top_p: 0.0, ..p }, &out),
        Err(OpsError::InvalidArgument { .. })
    ));
    assert!(matches!(
        sample(
            &client,
            &x,
            SamplingParams {
                temperature: -1.0,
                ..p
            },
            &out
        ),
        Err(OpsError::InvalidArgument { .. })
    ));
    assert!(matches!(
        sample(&client, &x, SamplingParams { top_k: 1000, ..p }, &out),
        Err(OpsError::InvalidArgument { .. })
    ));
    let o3 = DeviceTensor::empty(&client, &[3], DType::U32);
    assert!(matches!(
        sample(&client, &x, p, &o3),
        Err(OpsError::ShapeMismatch { .. })
    ));
}
