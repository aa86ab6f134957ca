//! Grouped RMS norm (SpecFormer's per-tap norm): input `[rows, groups, d]`,
//! one scale vector per group (`weight` `[groups, d]`), every group of every
//! row normalised independently over its `d` elements, all in ONE launch.
//!
//! Layout: the output `[rows, groups, d]` is row-major contiguous, so it *is*
//! the concatenated `[rows, groups * d]` layout the following linear reads;
//! [`group_rms_norm_concat`] returns it under that shape (a metadata-only
//! reshape, no copy). The kernel is [`crate::rms_norm::rms_norm_kernel`] with
//! `groups > 1`.

use cubecl::prelude::*;

use crate::error::{OpsError, Result};
use crate::launch::{expect_dtype, expect_float, expect_nonempty, expect_rank, expect_shape};
use crate::rms_norm::launch_segments;
use crate::tensor::DeviceTensor;

/// Grouped RMS norm of `x` (`[rows, groups, d]`) with `weight`
/// (`[groups, d]`) into `out` (`[rows, groups, d]`, or the same memory viewed
/// as `[rows, groups * d]`).
pub fn group_rms_norm<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    eps: f32,
    out: &DeviceTensor<R>,
) -> Result<()> {
    const OP: &str = "group_rms_norm";
    expect_float(client, OP, "x", x)?;
    expect_nonempty(OP, "x", x)?;
    let s = expect_rank(OP, "x", x, 3, "[rows, groups, d]")?;
    let (rows, groups, d) = (s[0], s[1], s[2]);
    expect_shape(OP, "weight", weight, &[groups, d])?;
    expect_dtype(OP, "weight", weight, x.dtype())?;
    if out.shape() != [rows, groups, d] && out.shape() != [rows, groups * d] {
        return Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "out",
            expected: format!("[{rows}, {groups}, {d}] or [{rows}, {}]", groups * d),
            found: out.shape().to_vec(),
        });
    }
    expect_dtype(OP, "out", out, x.dtype())?;
    launch_segments(client, OP, x, weight, groups, d, eps, out)
}

/// Allocates the output, runs [`group_rms_norm`] and returns it viewed as the
/// concatenated `[rows, groups * d]` layout (same memory).
pub fn group_rms_norm_concat<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    eps: f32,
) -> Result<DeviceTensor<R>> {
    let rows = x.shape().first().copied().unwrap_or(0);
    let out = DeviceTensor::empty(client, &[rows, x.numel() / rows.max(1)], x.dtype());
    group_rms_norm(client, x, weight, eps, &out)?;
    Ok(out)
}

/// Plain-Rust oracle.
pub mod reference {
    /// Grouped RMS norm of `x` (`[rows, groups, d]`) with `w` (`[groups, d]`).
    pub fn group_rms_norm(x: &[f32], w: &[f32], d: usize, eps: f32) -> Vec<f32> {
        crate::rms_norm::reference::rms_norm_segments(x, w, d, eps)
    }
}
