//! Shared launch plumbing: argument validation, grid sizing within wgpu's
//! limits, dtype dispatch and error mapping after a launch.
//!
//! Every safe launch function in this crate follows the same steps:
//! validate with the `expect_*` helpers → size the grid with [`cube_count`] →
//! launch through [`dispatch_float!`](crate::dispatch_float) → [`finish`].
//! The flush policy lives here too: [`finish`] flushes after each launch
//! unless the thread is inside [`defer_flushes`] (a GPU pass flushes once).

use std::cell::Cell;

use cubecl::prelude::*;

use crate::error::{OpsError, Result};
use crate::tensor::{DType, DeviceTensor};

/// Most workgroups per dispatch dimension on wgpu (and the CUDA y/z limit).
pub const MAX_CUBES_PER_DIM: usize = 65_535;

/// Largest single storage binding on lavapipe (`maxStorageBufferRange`).
pub const MAX_BINDING_BYTES: usize = 128 << 20;

/// A grid of at least `cubes` cubes that respects [`MAX_CUBES_PER_DIM`],
/// spread over x then y. Kernels index cubes with the flattened `CUBE_POS`
/// and must skip `CUBE_POS >= cubes` (the y-split can overshoot).
pub fn cube_count(op: &'static str, cubes: usize) -> Result<CubeCount> {
    let cubes = cubes.max(1);
    let x = cubes.min(MAX_CUBES_PER_DIM);
    let y = cubes.div_ceil(x);
    if y > MAX_CUBES_PER_DIM {
        return Err(OpsError::InvalidArgument {
            op,
            reason: format!("{cubes} workgroups exceed the 65535x65535 grid"),
        });
    }
    Ok(CubeCount::Static(x as u32, y as u32, 1))
}

/// Ends a launch: counts it ([`counters`](crate::counters)) and, unless
/// this thread is inside [`defer_flushes`], submits the queued work and
/// surfaces server errors (resource limits, launch failures) with the op
/// that caused them. Panics while a kernel is expanded are *not* reported
/// by cubecl (see the cubecl guide §5.4); tests catch those by comparing
/// outputs.
pub fn finish<R: Runtime>(client: &ComputeClient<R>, op: &'static str) -> Result<()> {
    crate::counters::launch();
    if DEFER_FLUSH.with(Cell::get) {
        return Ok(());
    }
    flush(client, op)
}

/// Submits the work queued so far (counted as a flush). On cubecl-cuda 0.10
/// this is a round trip to the device's runner thread that waits for the
/// previous flush's fence, so a GPU pass flushes once, at its end; on
/// lavapipe a flush after each launch overlaps the host's encoding with
/// execution and is faster (docs/gpu.md).
pub fn flush<R: Runtime>(client: &ComputeClient<R>, op: &'static str) -> Result<()> {
    crate::counters::flush(|| client.flush()).map_err(|e| OpsError::device(op, e))
}

thread_local! {
    static DEFER_FLUSH: Cell<bool> = const { Cell::new(false) };
}

/// While the returned guard lives, [`finish`] on this thread queues launches
/// without flushing; the caller flushes once with [`flush`] (a device error
/// then names the pass, not the op). Dropping the guard restores the
/// previous policy, so guards nest.
#[must_use = "launches flush again as soon as the guard is dropped"]
pub fn defer_flushes() -> DeferFlushes {
    DeferFlushes {
        previous: DEFER_FLUSH.with(|d| d.replace(true)),
    }
}

/// Guard of [`defer_flushes`].
pub struct DeferFlushes {
    previous: bool,
}

impl Drop for DeferFlushes {
    fn drop(&mut self) {
        DEFER_FLUSH.with(|d| d.set(self.previous));
    }
}

/// Fails unless `t` is a float tensor the device supports.
pub fn expect_float<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    arg: &'static str,
    t: &DeviceTensor<R>,
) -> Result<()> {
    if !t.dtype().is_float() {
        return Err(OpsError::DTypeMismatch {
            op,
            arg,
            expected: DType::F32,
            found: t.dtype(),
        });
    }
    if !t.dtype().is_supported(client) {
        return Err(OpsError::UnsupportedDType {
            op,
            dtype: t.dtype(),
        });
    }
    Ok(())
}

/// Fails unless `t` has exactly `dtype`.
pub fn expect_dtype<R: Runtime>(
    op: &'static str,
    arg: &'static str,
    t: &DeviceTensor<R>,
    dtype: DType,
) -> Result<()> {
    if t.dtype() != dtype {
        return Err(OpsError::DTypeMismatch {
            op,
            arg,
            expected: dtype,
            found: t.dtype(),
        });
    }
    Ok(())
}

/// Fails unless every tensor of `args` (`(arg, tensor)` pairs) has exactly
/// `dtype`.
pub fn expect_dtypes<R: Runtime>(
    op: &'static str,
    dtype: DType,
    args: &[(&'static str, &DeviceTensor<R>)],
) -> Result<()> {
    args.iter()
        .try_for_each(|&(arg, t)| expect_dtype(op, arg, t, dtype))
}

/// Fails unless `eps` (a norm's epsilon) is finite and `>= 0`.
pub fn expect_eps(op: &'static str, eps: f32) -> Result<()> {
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(OpsError::InvalidArgument {
            op,
            reason: format!("eps must be finite and >= 0, got {eps}"),
        });
    }
    Ok(())
}

/// Fails unless `t` has exactly `shape`.
pub fn expect_shape<R: Runtime>(
    op: &'static str,
    arg: &'static str,
    t: &DeviceTensor<R>,
    shape: &[usize],
) -> Result<()> {
    if t.shape() != shape {
        return Err(OpsError::ShapeMismatch {
            op,
            arg,
            expected: format!("{shape:?}"),
            found: t.shape().to_vec(),
        });
    }
    Ok(())
}

/// Fails unless `t` has rank `rank`; returns its shape.
pub fn expect_rank<'a, R: Runtime>(
    op: &'static str,
    arg: &'static str,
    t: &'a DeviceTensor<R>,
    rank: usize,
    expected: &str,
) -> Result<&'a [usize]> {
    if t.shape().len() != rank {
        return Err(OpsError::ShapeMismatch {
            op,
            arg,
            expected: expected.to_string(),
            found: t.shape().to_vec(),
        });
    }
    Ok(t.shape())
}

/// Fails if `t` has no elements.
pub fn expect_nonempty<R: Runtime>(
    op: &'static str,
    arg: &'static str,
    t: &DeviceTensor<R>,
) -> Result<()> {
    if t.numel() == 0 || t.shape().is_empty() {
        return Err(OpsError::EmptyInput {
            op,
            arg,
            shape: t.shape().to_vec(),
        });
    }
    Ok(())
}

/// A nonempty float tensor `t` (`[..., n]`) as `(rows, n)`: its last
/// dimension and the product of the others.
pub fn expect_float_rows<R: Runtime>(
    client: &ComputeClient<R>,
    op: &'static str,
    arg: &'static str,
    t: &DeviceTensor<R>,
) -> Result<(usize, usize)> {
    expect_float(client, op, arg, t)?;
    expect_nonempty(op, arg, t)?;
    let n = *t.shape().last().unwrap_or(&1);
    Ok((t.numel() / n, n))
}

/// Fails unless `out` is u32 with one element per row (`rows`; any shape).
pub fn expect_row_u32<R: Runtime>(
    op: &'static str,
    arg: &'static str,
    out: &DeviceTensor<R>,
    rows: usize,
) -> Result<()> {
    expect_dtype(op, arg, out, DType::U32)?;
    if out.numel() != rows {
        return Err(OpsError::ShapeMismatch {
            op,
            arg,
            expected: format!("[{rows}]"),
            found: out.shape().to_vec(),
        });
    }
    Ok(())
}

/// Fails if the tensor's binding would exceed [`MAX_BINDING_BYTES`].
pub fn expect_bindable<R: Runtime>(
    op: &'static str,
    arg: &'static str,
    t: &DeviceTensor<R>,
) -> Result<()> {
    let bytes = t.numel() * t.dtype().size();
    if bytes > MAX_BINDING_BYTES {
        return Err(OpsError::InvalidArgument {
            op,
            reason: format!("`{arg}` is {bytes} bytes, over the 128 MiB binding limit"),
        });
    }
    Ok(())
}

/// Runs `$body` with the type alias `$F` bound to the Rust element type of
/// the float dtype `$dtype` (`f32` or `half::f16`); evaluates to
/// `Err(DTypeMismatch)` for non-float dtypes.
///
/// ```ignore
/// dispatch_float!(x.dtype(), "rms_norm", F => {
///     rms_norm_kernel::launch::<F, R>(client, count, dim, ...);
/// })
/// ```
#[macro_export]
macro_rules! dispatch_float {
    ($dtype:expr, $op:expr, $F:ident => $body:block) => {
        match $dtype {
            $crate::tensor::DType::F32 => {
                type $F = f32;
                Ok($body)
            }
            $crate::tensor::DType::F16 => {
                type $F = ::half::f16;
                Ok($body)
            }
            other => Err($crate::error::OpsError::DTypeMismatch {
                op: $op,
                arg: "input",
                expected: $crate::tensor::DType::F32,
                found: other,
            }),
        }
    };
}
