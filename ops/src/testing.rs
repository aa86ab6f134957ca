//! Test support shared by every kernel family's tests: the test runtime and
//! its client (wgpu, or CUDA with the `cuda-tests` feature),
//! tolerance comparison against a reference, deterministic random data, and
//! proptest strategies for awkward sizes.
//!
//! Nothing here sets global state, so tests run on cargo's parallel threads
//! against one shared client.

use cubecl::prelude::*;
use cubecl::wgpu::{WgpuDevice, WgpuRuntime};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::tensor::DType;

/// The default wgpu device (lavapipe on a machine without a GPU). Every call
/// returns a handle to the same per-device server.
pub fn wgpu_client() -> ComputeClient<WgpuRuntime> {
    WgpuRuntime::client(&WgpuDevice::DefaultDevice)
}

/// The runtime the kernel tests run on: wgpu by default, CUDA's when the
/// crate is built with `--features cuda-tests` (the same tests, on a GPU).
#[cfg(not(feature = "cuda-tests"))]
pub type TestRuntime = WgpuRuntime;
/// CUDA under `--features cuda-tests` (see the wgpu twin above).
#[cfg(feature = "cuda-tests")]
pub type TestRuntime = cubecl::cuda::CudaRuntime;

/// A client of [`TestRuntime`]'s default device (wgpu's default adapter,
/// CUDA device 0); every call returns a handle to the same per-device server.
pub fn test_client() -> ComputeClient<TestRuntime> {
    TestRuntime::client(&Default::default())
}

/// Relative tolerance for a dtype: 1e-5 for f32, 1e-2 for f16.
pub fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => 1e-2,
        _ => 1e-5,
    }
}

/// Compares `actual` with `expected` element by element:
/// `|a - e| <= tol * (|e| + max|expected|)`, with `tol` from [`tolerance`].
/// The second term scales the absolute slack with the tensor's magnitude, so
/// values that cancel to near zero are judged against the whole tensor.
/// Reports the first bad element and the count of bad ones. In f16 a
/// difference of one step of its smallest subnormal (2⁻²⁴) always passes:
/// a tensor whose every value is below that cannot be told apart finer
/// (a one-element SwiGLU output of 3.4e-8 came back as 6.0e-8).
pub fn assert_close(
    what: &str,
    actual: &[f32],
    expected: &[f32],
    dtype: DType,
) -> Result<(), TestCaseError> {
    close(what, actual, expected, tolerance(dtype), floor(dtype))
}

/// [`assert_close`] for sums: `expected[i]` is a sum of terms whose
/// absolute values add up to `magnitude[i]`, and a sum in another order (or
/// with fused multiply-adds) may differ by a few roundings of those terms,
/// however far they cancel: `|a - e| <= tol * magnitude[i]` (plus the f16
/// floor of [`assert_close`]). Three weighted layers that cancel to 4.7e-4
/// from terms of about 1 differed by 3e-8, 6e-5 of the result.
pub fn assert_close_terms(
    what: &str,
    actual: &[f32],
    expected: &[f32],
    magnitude: &[f32],
    dtype: DType,
) -> Result<(), TestCaseError> {
    if magnitude.len() != expected.len() {
        return Err(TestCaseError::fail(format!(
            "{what}: {} magnitudes for {} expected values",
            magnitude.len(),
            expected.len()
        )));
    }
    let (tol, floor) = (tolerance(dtype), floor(dtype));
    compare(
        what,
        actual,
        expected,
        |i| tol * magnitude[i] + floor,
        |i| format!("tol {tol}, terms' magnitude {}", magnitude[i]),
    )
}

/// [`assert_close`] with an explicit relative tolerance.
pub fn assert_close_tol(
    what: &str,
    actual: &[f32],
    expected: &[f32],
    tol: f32,
) -> Result<(), TestCaseError> {
    close(what, actual, expected, tol, 0.0)
}

/// The absolute slack every comparison at `dtype` allows: one step of
/// f16's smallest subnormal, nothing in f32.
fn floor(dtype: DType) -> f32 {
    match dtype {
        DType::F16 => 2f32.powi(-24),
        _ => 0.0,
    }
}

/// [`assert_close_tol`] with an absolute slack `floor` added.
fn close(
    what: &str,
    actual: &[f32],
    expected: &[f32],
    tol: f32,
    floor: f32,
) -> Result<(), TestCaseError> {
    let scale = expected.iter().fold(0f32, |m, x| m.max(x.abs()));
    compare(
        what,
        actual,
        expected,
        |i| tol * (expected[i].abs() + scale) + floor,
        |_| format!("tol {tol}, scale {scale}"),
    )
}

/// Element `i` passes when `|a - e| <= slack(i)` (or both are NaN); reports
/// the first bad element, with `detail(i)`, and the count of bad ones.
fn compare(
    what: &str,
    actual: &[f32],
    expected: &[f32],
    slack: impl Fn(usize) -> f32,
    detail: impl Fn(usize) -> String,
) -> Result<(), TestCaseError> {
    if actual.len() != expected.len() {
        return Err(TestCaseError::fail(format!(
            "{what}: length {} != expected {}",
            actual.len(),
            expected.len()
        )));
    }
    let mut first = None;
    let mut bad = 0usize;
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        let ok = (a - e).abs() <= slack(i) || (a.is_nan() && e.is_nan());
        if !ok {
            bad += 1;
            first.get_or_insert((i, *a, *e));
        }
    }
    match first {
        None => Ok(()),
        Some((i, a, e)) => Err(TestCaseError::fail(format!(
            "{what}: {bad}/{} elements differ; first at {i}: got {a}, expected {e} ({})",
            actual.len(),
            detail(i)
        ))),
    }
}

/// Rounds host data the way an upload at `dtype` does, so references see the
/// same inputs as the kernel.
pub fn round_to(dtype: DType, data: &[f32]) -> Vec<f32> {
    match dtype {
        DType::F16 => data
            .iter()
            .map(|&x| half::f16::from_f32(x).to_f32())
            .collect(),
        _ => data.to_vec(),
    }
}

/// `n` distinct row indices below `rows` (a seeded shuffle of `0..rows`,
/// first `n`): where a test writes new cache rows.
pub fn distinct_slots(seed: u64, rows: usize, n: usize) -> Vec<u32> {
    let mut slots: Vec<u32> = (0..rows as u32).collect();
    let mut x = seed | 1;
    for i in (1..slots.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        slots.swap(i, (x % (i as u64 + 1)) as usize);
    }
    slots.truncate(n);
    slots
}

/// `n` deterministic pseudo-random values in `[lo, hi)` (splitmix64), rounded
/// to `dtype`. Cheap for large `n`, unlike a proptest vector strategy.
pub fn random_f32(seed: u64, n: usize, lo: f32, hi: f32, dtype: DType) -> Vec<f32> {
    let mut state = seed;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            let u = (splitmix64(&mut state) >> 40) as f32 / (1u64 << 24) as f32;
            lo + (hi - lo) * u
        })
        .collect();
    round_to(dtype, &v)
}

/// `n` deterministic pseudo-random integers in `0..bound`.
pub fn random_u32(seed: u64, n: usize, bound: u32) -> Vec<u32> {
    let mut state = seed;
    (0..n)
        .map(|_| (splitmix64(&mut state) % bound.max(1) as u64) as u32)
        .collect()
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Sizes where kernels break: 1, 3, 50, 783 (ragged against every vector and
/// block width), plus uniform in `1..=max`. Values above `max` are clamped.
pub fn awkward_size(max: usize) -> impl Strategy<Value = usize> {
    let max = max.max(1);
    prop_oneof![
        Just(1usize),
        Just(3usize),
        Just(50usize),
        Just(783usize),
        1..=max,
    ]
    .prop_map(move |n| n.min(max))
}

/// f32 or f16.
pub fn float_dtype() -> impl Strategy<Value = DType> {
    prop_oneof![Just(DType::F32), Just(DType::F16)]
}

/// A proptest config with `cases` cases and no regression files written into
/// the source tree.
pub fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
