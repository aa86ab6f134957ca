//! draftc-ops: the CubeCL kernels draftc launches, each with a plain-Rust
//! reference implementation that serves as its test oracle.
//!
//! # Conventions (read before adding a kernel family)
//!
//! * **One file per kernel family** under `src/` (or a folder for a large
//!   family, e.g. `attention/`), `//!` header first: what it computes, the
//!   layouts, and its limits.
//! * **Reference in the same file**: a `pub mod reference` (or `reference_*`
//!   fns) in plain f32 Rust on slices, written for clarity, not speed. Tests
//!   compare the kernel against it; it is the spec.
//! * **Kernels** are `#[cube(launch)]` fns generic over
//!   `F: Float + CubeElement` (storage type: f32 or f16); accumulate in f32.
//!   Prefer runtime scalars over `#[comptime]` ones: every distinct comptime
//!   value is another JIT compile (40 ms–2 s on lavapipe).
//! * **Launch fns are safe and validate everything on the host**, returning
//!   [`OpsError`] rather than launching out of bounds:
//!   ```ignore
//!   pub fn rms_norm<R: Runtime>(
//!       client: &ComputeClient<R>,
//!       x: &DeviceTensor<R>,       // inputs by reference
//!       weight: &DeviceTensor<R>,
//!       eps: f32,                  // scalars by value
//!       out: &DeviceTensor<R>,     // outputs are allocated by the caller
//!   ) -> Result<(), OpsError>
//!   ```
//!   Inputs first, then scalars/options, then outputs. Steps: the `expect_*`
//!   helpers in [`launch`] → [`launch::cube_count`] (splits grids over x/y so
//!   no dimension exceeds 65,535; kernels then index cubes by `CUBE_POS` and
//!   skip `CUBE_POS >= cubes`) → [`dispatch_float!`] to pick `f32`/`f16` →
//!   [`launch::finish`] (count the launch, flush unless the thread defers
//!   flushes with [`launch::defer_flushes`], map server errors).
//! * **Checked vs unchecked**: `launch_unchecked` drops the per-access bounds
//!   checks from the shader (≈3× faster for `linear` on lavapipe). Use it
//!   only when host validation plus in-kernel guards/clamps keep every index
//!   in bounds, and say so in a `// SAFETY:` comment at the call.
//! * **`&&` and `||` do not short-circuit in `#[cube]` code**: both sides are
//!   evaluated. Never guard an index with them (`if i < n && x[i] > 0`);
//!   index inside the branch instead. lavapipe's robust buffer access hides
//!   such reads; CUDA faults on them (found by running the tests on an H100).
//! * **Tensors** are [`DeviceTensor`]: handle + row-major contiguous shape +
//!   [`DType`]. Pass them to kernels with `array_arg()`/`tensor_arg()`.
//! * **Tests** live in `tests/<family>.rs`, use [`testing`] (`test_client`,
//!   `assert_close`, `awkward_size`, `random_f32`, `config(16)`), run f32 and
//!   f16, cover ragged sizes (1, 3, 50, 783) and error cases, and keep case
//!   counts modest so the whole suite stays within a few minutes on lavapipe.
//!
//! # Families
//! Basic: [`rms_norm`], [`group_rms_norm`], [`head_norm`] (per-head RMS norm
//! then RoPE, Qwen 3 / Gemma 3 q/k norms), [`linear`] (skinny GEMM with
//! fused prologue/epilogue), [`rope`], [`elementwise`], [`embedding`],
//! [`softmax`], [`argmax_topk`], [`sampling`], [`layer_sum`]. Measurement:
//! [`probe`] (the device's streaming-read roofline), [`counters`] (what the
//! host asks of the device, per thread). CUDA only: `cuda_graph` (capture launches
//! once, replay them with one driver call).

pub mod attention;
pub mod block;
pub mod counters;
#[cfg(feature = "cuda")]
pub mod cuda_graph;
pub mod error;
pub mod kept;
pub mod kv;
pub mod launch;
pub mod replay;
pub mod tensor;
pub mod tree;

pub mod argmax_topk;
pub mod elementwise;
pub mod embedding;
pub mod group_rms_norm;
pub mod head_norm;
pub mod layer_sum;
pub mod linear;
pub mod linear_plane;
pub mod linear_rope;
pub mod probe;
pub mod rms_norm;
pub mod rope;
pub mod sampling;
pub mod softmax;
pub mod source;
#[doc(hidden)]
pub mod testing;
pub mod tree_frontier;

pub use error::{OpsError, Result};
pub use tensor::{DType, DeviceTensor};
