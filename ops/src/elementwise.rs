//! Element-wise ops on flat tensors of equal shape: `add` (residual), `mul`,
//! `silu` (`x·σ(x)`), `swiglu` (`silu(a)·b`) and `geglu` (`gelu_tanh(a)·b`,
//! PyTorch's tanh GELU, as in the linear GeGLU epilogue). Computed in f32,
//! stored in the tensors' dtype; `Vector<F, 4>` (or 2) loads when the
//! length allows.
//! The output may alias an input (in-place residual add).

use cubecl::prelude::*;

use crate::block::vector_width;
use crate::error::Result;
use crate::launch::{
    cube_count, expect_dtype, expect_float, expect_nonempty, expect_shape, finish,
};
use crate::linear::{GELU_TANH_2K, GELU_TANH_C, GELU_TANH_CLAMP};
use crate::tensor::DeviceTensor;

/// Units per cube.
pub const BLOCK: usize = 256;

/// The element-wise operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Mul,
    /// `silu(a) * b`.
    SwiGlu,
    /// `gelu_tanh(a) * b` (Gemma's MLP gate; PyTorch `gelu(approximate="tanh")`).
    GeGlu,
}

pub(crate) const OP_ADD: u32 = 0;
pub(crate) const OP_MUL: u32 = 1;
pub(crate) const OP_SWIGLU: u32 = 2;
pub(crate) const OP_SILU: u32 = 3;
pub(crate) const OP_GEGLU: u32 = 4;

#[cube]
fn silu_v<N: Size>(x: Vector<f32, N>) -> Vector<f32, N> {
    // `0 - x`, not `-x`: CubeCL 0.10's CUDA dialect emits unary minus on its
    // vector structs (`-float_4`), which NVRTC rejects (no such operator).
    x / (Vector::new(1f32) + Vector::exp(Vector::new(0f32) - x))
}

/// The tanh GELU lane by lane, written exactly as the linear epilogue's
/// scalar `gelu_tanh` in `linear.rs` (see there why it is the sigmoid form
/// `g · exp(min(2u, 0)) / (1 + exp(-|2u|))`, with `u` from `g` clamped to
/// ±1e4, and not `f32::tanh`: no overflow, no cancellation, on every backend).
#[cube]
fn gelu_tanh_v<N: Size>(g: Vector<f32, N>) -> Vector<f32, N> {
    let c = clamp(
        g,
        Vector::new(comptime!(-GELU_TANH_CLAMP)),
        Vector::new(comptime!(GELU_TANH_CLAMP)),
    );
    let t = Vector::new(comptime!(GELU_TANH_2K))
        * (c + Vector::new(comptime!(GELU_TANH_C)) * c * c * c);
    let zero = Vector::new(0f32);
    // `zero - |t|`, not `-|t|`: see `silu_v`.
    g * Vector::exp(min(t, zero)) / (Vector::new(1f32) + Vector::exp(zero - Vector::abs(t)))
}

/// `out[i] = op(a[i], b[i])` over `len_v` vectors; `b` is unused for SiLU.
#[cube(launch_unchecked)]
pub fn elementwise_kernel<F: Float + CubeElement, N: Size>(
    a: &Array<Vector<F, N>>,
    b: &Array<Vector<F, N>>,
    out: &mut Array<Vector<F, N>>,
    len_v: usize,
    #[comptime] op: u32,
) {
    let i = CUBE_POS * comptime!(BLOCK) + UNIT_POS as usize;
    if i < len_v {
        let x = Vector::<f32, N>::cast_from(a[i]);
        let y = if comptime!(op == OP_SILU) {
            silu_v::<N>(x)
        } else {
            let z = Vector::<f32, N>::cast_from(b[i]);
            if comptime!(op == OP_ADD) {
                x + z
            } else if comptime!(op == OP_MUL) {
                x * z
            } else if comptime!(op == OP_GEGLU) {
                gelu_tanh_v::<N>(x) * z
            } else {
                silu_v::<N>(x) * z
            }
        };
        out[i] = Vector::<F, N>::cast_from(y);
    }
}

fn launch<R: Runtime>(
    client: &ComputeClient<R>,
    op_name: &'static str,
    a: &DeviceTensor<R>,
    b: Option<&DeviceTensor<R>>,
    out: &DeviceTensor<R>,
    code: u32,
) -> Result<()> {
    expect_float(client, op_name, "a", a)?;
    expect_nonempty(op_name, "a", a)?;
    if let Some(b) = b {
        expect_shape(op_name, "b", b, a.shape())?;
        expect_dtype(op_name, "b", b, a.dtype())?;
    }
    expect_shape(op_name, "out", out, a.shape())?;
    expect_dtype(op_name, "out", out, a.dtype())?;
    let n = vector_width(client, a.numel());
    let len_v = a.numel() / n;
    let count = cube_count(op_name, len_v.div_ceil(BLOCK))?;
    let b = b.unwrap_or(a);
    // Unchecked launch: no per-access bounds checks in the shader.
    crate::dispatch_float!(a.dtype(), op_name, F => {
        // SAFETY: shapes validated above; every index is guarded or clamped in the kernel.
        unsafe {
            elementwise_kernel::launch_unchecked::<F, R>(
                client, count, CubeDim::new_1d(BLOCK as u32), n,
                a.array_arg(), b.array_arg(), out.array_arg(), len_v, code,
            )
        }
    })?;
    finish(client, op_name)
}

/// `out = op(a, b)` element-wise; all three tensors have the same shape and dtype.
pub fn binary<R: Runtime>(
    client: &ComputeClient<R>,
    a: &DeviceTensor<R>,
    b: &DeviceTensor<R>,
    op: BinaryOp,
    out: &DeviceTensor<R>,
) -> Result<()> {
    let (name, code) = match op {
        BinaryOp::Add => ("add", OP_ADD),
        BinaryOp::Mul => ("mul", OP_MUL),
        BinaryOp::SwiGlu => ("swiglu", OP_SWIGLU),
        BinaryOp::GeGlu => ("geglu", OP_GEGLU),
    };
    launch(client, name, a, Some(b), out, code)
}

/// `out = a + b`.
pub fn add<R: Runtime>(
    c: &ComputeClient<R>,
    a: &DeviceTensor<R>,
    b: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    binary(c, a, b, BinaryOp::Add, out)
}

/// `out = a * b`.
pub fn mul<R: Runtime>(
    c: &ComputeClient<R>,
    a: &DeviceTensor<R>,
    b: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    binary(c, a, b, BinaryOp::Mul, out)
}

/// `out = silu(a) * b`.
pub fn swiglu<R: Runtime>(
    c: &ComputeClient<R>,
    a: &DeviceTensor<R>,
    b: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    binary(c, a, b, BinaryOp::SwiGlu, out)
}

/// `out = gelu_tanh(a) * b`, `gelu_tanh(g) = 0.5·g·(1 + tanh(√(2/π)·(g +
/// 0.044715·g³)))` (GeGLU).
pub fn geglu<R: Runtime>(
    c: &ComputeClient<R>,
    a: &DeviceTensor<R>,
    b: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    binary(c, a, b, BinaryOp::GeGlu, out)
}

/// `out = silu(a) = a / (1 + exp(-a))`.
pub fn silu<R: Runtime>(
    c: &ComputeClient<R>,
    a: &DeviceTensor<R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    launch(c, "silu", a, None, out, OP_SILU)
}

/// Plain-Rust oracle.
pub mod reference {
    pub fn silu(x: f32) -> f32 {
        x / (1.0 + (-x).exp())
    }

    /// The tanh GELU, as PyTorch writes it (see [`crate::linear::reference::gelu_tanh`]).
    pub use crate::linear::reference::gelu_tanh;

    /// `op(a, b)` element-wise.
    pub fn binary(a: &[f32], b: &[f32], op: super::BinaryOp) -> Vec<f32> {
        a.iter()
            .zip(b)
            .map(|(&x, &y)| match op {
                super::BinaryOp::Add => x + y,
                super::BinaryOp::Mul => x * y,
                super::BinaryOp::SwiGlu => silu(x) * y,
                super::BinaryOp::GeGlu => gelu_tanh(x) * y,
            })
            .collect()
    }
}
