//! Linear layer `y = prologue(x) · Wᵀ (+ epilogue)`, `W` stored `[out, in]`
//! as in safetensors/HF — the skinny GEMM used for drafting and verification
//! (m = 1..64 rows) and for everything else that multiplies by a weight.
//!
//! * **Prologue** (applied to `x` while it is loaded): none, RMS norm with a
//!   weight `[in]`, or grouped RMS norm with weights `[groups, d]`,
//!   `groups * d == in` (see [`crate::group_rms_norm`]). The per-row (per
//!   group) sum of squares is accumulated in the same pass over `x` as the
//!   dot products, and `1/rms` scales the group's partial sums at the end.
//! * **Epilogue**: none, `+ bias[out]`, `+ residual[m, out]`, or a gated
//!   unit, SwiGLU or GeGLU: `W` is the gate weight, the epilogue carries the
//!   up weight, and `out = silu(x·W_gateᵀ) * (x·W_upᵀ)` (SwiGLU, Llama/Qwen)
//!   or `out = gelu_tanh(x·W_gateᵀ) * (x·W_upᵀ)` (GeGLU, Gemma: PyTorch's
//!   `gelu(approximate="tanh")`, [`reference::gelu_tanh`]; the kernel's
//!   numerically safe form is `gelu_tanh` in this file).
//!
//! Kernel layout: each unit owns `cols` adjacent output columns (comptime,
//! one of [`UNIT_COLUMNS`]), [`BLOCK`] units per cube. A unit streams its
//! weight rows once per block of `mb` rows (`mb` = 1, 2, 4 or 8, comptime)
//! with `Vector<F, 4>` loads along the reduction dim and keeps `mb × cols`
//! accumulators in registers; each load of an `x` vector serves `cols`
//! columns, and `x` is read at the same index by all units of a cube. For
//! m ≤ 8 the weights are read exactly once. Weights larger than the 128 MiB
//! binding limit are split into chunks of output columns bound through
//! handle offsets, and grids are split over x/y so no dimension exceeds
//! 65,535. The layout is tuned for lavapipe (SIMD lanes = units); GPUs get
//! [`crate::linear_plane`]. Both layouts share this file's argument checks,
//! weight chunking and launch ([`linear_with_binding_limit`], by
//! [`Layout`]) and its reduction step, group scaling and epilogue.
//!
//! What lavapipe rewards (measured with `cargo bench -p draftc-ops --bench
//! ops`, 2 vCPU): time follows the number of vector loads, not bytes (f16
//! takes as long as f32) and not whether a load is uniform across the cube.
//! Per reduction step a unit makes `cols` weight loads and `mb` `x` loads,
//! so more columns per unit make extra rows cheaper (the LM head at m = 4:
//! 150 ms with 8 columns, 121 ms with 32), while fewer, wider cubes balance
//! worse over the threads (576 outputs: 12 columns beat 8 and 16). The
//! lowering picks the count per launch from that model
//! (`draftc_codegen::device::lane_columns`), with `mb × cols` ≤ 128.
//! Tried and not kept: rows as units with every weight load uniform (4x
//! slower: one load per MAC); `Vector` accumulators with `fma` (no change);
//! 16 columns per unit with 16-row blocks from m = 16 (1.5–1.85x faster at
//! m = 16 and 64, but lavapipe's JIT of those unrolled bodies made the
//! linear tests 10x slower, 38 s → 384 s, and would add that to every first
//! run of a new shape); 16-row blocks alone (8 columns) gained 1.3x at
//! m ≥ 16 for 2x the tests' time (80 s), which does not pay for batch-1
//! generation, whose prefill would compile the bigger kernels.
//! Accumulation is in f32.

use cubecl::prelude::*;

use crate::block::{lane_sum, vector_width};
use crate::error::{OpsError, Result};
use crate::launch::{
    cube_count, expect_dtype, expect_eps, expect_float, expect_nonempty, expect_shape, finish,
    MAX_BINDING_BYTES,
};
use crate::linear_plane::PlaneShape;
use crate::tensor::DeviceTensor;

/// Units per cube.
pub const BLOCK: usize = 8;
/// The output-column counts a unit may own (comptime variants of the
/// kernel): one load of an `x` vector serves this many columns. The
/// lowering picks one per launch (`DeviceProfile::linear_layout` in
/// draftc-codegen, which lists the same counts); [`linear`] uses the first.
pub const UNIT_COLUMNS: [usize; 5] = [8, 12, 16, 24, 32];

pub(crate) const EPI_NONE: u32 = 0;
pub(crate) const EPI_BIAS: u32 = 1;
pub(crate) const EPI_RESIDUAL: u32 = 2;
pub(crate) const EPI_SWIGLU: u32 = 3;
/// The stacked q/k/v projection with RoPE: the kernels of
/// `crate::linear_rope`, which `source::LinearEpilogue::RopeQkv` names; no
/// arm of `linear_kernel` takes it.
pub(crate) const EPI_ROPE_QKV: u32 = 4;
pub(crate) const EPI_GEGLU: u32 = 5;

/// Whether an epilogue code multiplies by an up projection (the launch
/// binds and accumulates a second weight).
pub(crate) const fn is_gated(epilogue: u32) -> bool {
    epilogue == EPI_SWIGLU || epilogue == EPI_GEGLU
}

/// What is applied to `x` as it is loaded.
#[derive(Debug, Clone, Copy)]
pub enum Prologue<'a, R: Runtime> {
    None,
    /// RMS norm over `in` with `weight` `[in]`.
    RmsNorm {
        weight: &'a DeviceTensor<R>,
        eps: f32,
    },
    /// Grouped RMS norm: `x` row is `groups` segments of `d`, `weight` is `[groups, d]`.
    GroupRmsNorm {
        weight: &'a DeviceTensor<R>,
        eps: f32,
    },
}

/// What is applied to the product before it is stored.
#[derive(Debug, Clone, Copy)]
pub enum Epilogue<'a, R: Runtime> {
    None,
    /// `+ bias`, `bias` `[out]`.
    Bias(&'a DeviceTensor<R>),
    /// `+ residual`, same shape as `out` (may be `out` itself).
    Residual(&'a DeviceTensor<R>),
    /// `silu(x·Wᵀ) * (x·W_upᵀ)`, `up` `[out, in]` like the gate weight.
    SwiGlu {
        up: &'a DeviceTensor<R>,
    },
    /// `gelu_tanh(x·Wᵀ) * (x·W_upᵀ)` (Gemma's MLP), `up` `[out, in]` like
    /// the gate weight; bound and validated exactly as for `SwiGlu`.
    GeGlu {
        up: &'a DeviceTensor<R>,
    },
}

/// The kernel layout of a linear launch (and of the q/k/v projection with
/// RoPE, [`crate::linear_rope::RopeQkvLayout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// [`linear_kernel`], units owning `cols` output columns (one of
    /// [`UNIT_COLUMNS`]).
    Lanes { cols: usize },
    /// [`crate::linear_plane::linear_plane_kernel`] with this plane shape.
    Planes(PlaneShape),
}

/// Rows per register block for `m` rows.
pub(crate) fn rows_per_block(m: usize) -> usize {
    match m {
        1 => 1,
        2 => 2,
        3 | 4 => 4,
        _ => 8,
    }
}

/// The weight row offsets (`in_v` vectors a row) of the `cols` output
/// columns `o0 ..` of both linear layouts, columns past `n_cols` clamped to
/// the last (loaded, never stored).
#[cube]
pub(crate) fn column_rows(
    wbase: &mut Array<usize>,
    o0: usize,
    n_cols: usize,
    in_v: usize,
    #[comptime] cols: usize,
) {
    #[unroll]
    for c in 0..cols {
        wbase[c] = select(o0 + c < n_cols, o0 + c, n_cols - 1) * in_v;
    }
}

/// One reduction step of both linear layouts: at vector index `kv`, loads
/// the weight vectors of the `cols` columns (`wbase`: their row offsets;
/// with `gated`, i.e. SwiGLU or GeGLU, the up weights too) and each of the
/// `mb` rows' `x` vector (`xoff`: row offsets; one load serves every
/// column), and adds the dot products to `part` / `part_u` (`[r * cols +
/// c]`) and, with `norm`, the rows' sums of squares to `sq` (1/rms scales
/// the dot products later).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn accumulate<F: Float + CubeElement, N: Size>(
    x: &Array<Vector<F, N>>,
    w: &Array<Vector<F, N>>,
    w_up: &Array<Vector<F, N>>,
    gamma: &Array<Vector<F, N>>,
    wbase: &Array<usize>,
    xoff: &Array<usize>,
    kv: usize,
    part: &mut Array<f32>,
    part_u: &mut Array<f32>,
    sq: &mut Array<f32>,
    #[comptime] mb: usize,
    #[comptime] cols: usize,
    #[comptime] norm: bool,
    #[comptime] gated: bool,
) {
    let mut wv = Array::<Vector<f32, N>>::new(cols);
    let mut uv = Array::<Vector<f32, N>>::new(cols);
    #[unroll]
    for c in 0..cols {
        wv[c] = Vector::<f32, N>::cast_from(w[wbase[c] + kv]);
        if gated {
            uv[c] = Vector::<f32, N>::cast_from(w_up[wbase[c] + kv]);
        }
    }
    let mut gv = Vector::<f32, N>::new(1.0);
    if norm {
        gv = Vector::<f32, N>::cast_from(gamma[kv]);
    }
    #[unroll]
    for r in 0..mb {
        let xr = Vector::<f32, N>::cast_from(x[xoff[r] + kv]);
        if norm {
            sq[r] += lane_sum::<f32, N>(xr * xr);
        }
        let xv = xr * gv;
        #[unroll]
        for c in 0..cols {
            part[r * cols + c] += lane_sum::<f32, N>(xv * wv[c]);
            if gated {
                part_u[r * cols + c] += lane_sum::<f32, N>(xv * uv[c]);
            }
        }
    }
}

/// The epilogue of both linear layouts on output value `acc[at]` (its
/// SwiGLU/GeGLU up product `acc_u[at]`) stored at `out[idx]`: plus column
/// `col_offset + o` of `extra` (bias) or `extra[idx]` (residual). Each
/// operand is read inside its own comptime branch, so every layout and
/// epilogue compiles to the code it had inline.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn epilogue_of<F: Float + CubeElement>(
    acc: &Array<f32>,
    acc_u: &Array<f32>,
    at: usize,
    extra: &Array<F>,
    col_offset: usize,
    o: usize,
    idx: usize,
    #[comptime] epilogue: u32,
) -> f32 {
    let mut y = acc[at];
    if comptime!(epilogue == EPI_BIAS) {
        y += f32::cast_from(extra[col_offset + o]);
    }
    if comptime!(epilogue == EPI_RESIDUAL) {
        y += f32::cast_from(extra[idx]);
    }
    if comptime!(epilogue == EPI_SWIGLU) {
        y = y / (1f32 + f32::exp(-y)) * acc_u[at];
    }
    if comptime!(epilogue == EPI_GEGLU) {
        y = gelu_tanh(y) * acc_u[at];
    }
    y
}

/// `2·√(2/π)` = 1.5957691216… (this literal is the f32 nearest to it):
/// twice the factor of `gelu_tanh`'s `u = √(2/π)·(g + 0.044715·g³)`.
pub(crate) const GELU_TANH_2K: f32 = 1.595_769_2;
/// The cube term's coefficient of the tanh GELU.
pub(crate) const GELU_TANH_C: f32 = 0.044_715;
/// `gelu_tanh` takes `u` from `g` clamped to ±1e4, which keeps `g³` finite;
/// there `|2u|` ≈ 7e10, so `σ(2u)` is exactly 0 or 1 in f32 either way.
pub(crate) const GELU_TANH_CLAMP: f32 = 1.0e4;

/// The tanh GELU (PyTorch `gelu(approximate="tanh")`, transformers'
/// `gelu_pytorch_tanh`) in f32:
/// `0.5·g·(1 + tanh(u))`, `u = √(2/π)·(g + 0.044715·g³)`, computed through
/// the exact identity `0.5·(1 + tanh(u)) = σ(2u)` as
/// `g · exp(min(2u, 0)) / (1 + exp(-|2u|))`.
///
/// Why not `f32::tanh`: CubeCL 0.10 has it (CUDA `tanh()`, f16 through
/// float; WGSL's built-in `tanh`; the GUIDE does not cover it), but on WGSL
/// its accuracy for large |u| is the driver's: GLSL.std.450 `Tanh` only
/// inherits the precision of `(eᵘ − e⁻ᵘ)/(eᵘ + e⁻ᵘ)`, which overflows to
/// inf/inf = NaN unless the driver clamps (Mesa does; Metal does not, which
/// cubecl patches on macOS only); and `1 + tanh(u)` cancels for g ≪ 0
/// (PyTorch's own f32 result at g = −5 is −2.98e-7 against a true
/// −2.29e-7). In the form used here both `exp` arguments are ≤ 0, so
/// nothing overflows for any finite `g` (an underflow to 0 is the right
/// limit), nothing cancels, and no backend's `tanh` is involved. The cost
/// is a second `exp` (`g / (1 + exp(-2u))`, the SiLU form, would need
/// `exp` to overflow to inf for g ≪ 0).
#[cube]
pub(crate) fn gelu_tanh(g: f32) -> f32 {
    let c = f32::clamp(g, comptime!(-GELU_TANH_CLAMP), comptime!(GELU_TANH_CLAMP));
    let t = comptime!(GELU_TANH_2K) * (c + comptime!(GELU_TANH_C) * c * c * c);
    g * f32::exp(f32::min(t, 0f32)) / (1f32 + f32::exp(-f32::abs(t)))
}

/// The scale of row `r`'s dot products over a reduction group of `d`
/// values: its 1/rms (`sq[r]`: its sum of squares) when the prologue
/// norms, else 1.
#[cube]
pub(crate) fn row_scale(
    sq: &Array<f32>,
    r: usize,
    d: usize,
    eps: f32,
    #[comptime] norm: bool,
) -> f32 {
    let mut inv = 1f32;
    if norm {
        inv = 1f32 / f32::sqrt(sq[r] / f32::cast_from(d) + eps);
    }
    inv
}

/// Adds a reduction group's partial sums (`part`, `part_u`: `[mb × cols]`)
/// to the accumulators, each row scaled by its [`row_scale`] (`sq`: the
/// rows' sums of squares).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn add_group(
    acc: &mut Array<f32>,
    acc_u: &mut Array<f32>,
    part: &Array<f32>,
    part_u: &Array<f32>,
    sq: &Array<f32>,
    d: usize,
    eps: f32,
    #[comptime] mb: usize,
    #[comptime] cols: usize,
    #[comptime] norm: bool,
) {
    #[unroll]
    for r in 0..mb {
        let inv = row_scale(sq, r, d, eps, norm);
        #[unroll]
        for c in 0..cols {
            acc[r * cols + c] += part[r * cols + c] * inv;
            acc_u[r * cols + c] += part_u[r * cols + c] * inv;
        }
    }
}

/// Stores a unit's block (rows `row0 ..`, columns `o0 ..`, `mb × cols`)
/// through the epilogue; rows past `m` and columns past `n_cols` are not
/// stored.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn store_block<F: Float + CubeElement>(
    acc: &Array<f32>,
    acc_u: &Array<f32>,
    extra: &Array<F>,
    out: &mut Array<F>,
    row0: usize,
    o0: usize,
    m: usize,
    n_cols: usize,
    out_stride: usize,
    col_offset: usize,
    #[comptime] mb: usize,
    #[comptime] cols: usize,
    #[comptime] epilogue: u32,
) {
    #[unroll]
    for r in 0..mb {
        #[unroll]
        for c in 0..cols {
            let row = row0 + r;
            let o = o0 + c;
            if o < n_cols && row < m {
                let idx = row * out_stride + col_offset + o;
                let y = epilogue_of::<F>(
                    acc,
                    acc_u,
                    r * cols + c,
                    extra,
                    col_offset,
                    o,
                    idx,
                    epilogue,
                );
                out[idx] = F::cast_from(y);
            }
        }
    }
}

#[cube(launch_unchecked)]
pub fn linear_kernel<F: Float + CubeElement, N: Size>(
    x: &Array<Vector<F, N>>,
    w: &Array<Vector<F, N>>,
    w_up: &Array<Vector<F, N>>,
    gamma: &Array<Vector<F, N>>,
    extra: &Array<F>,
    out: &mut Array<F>,
    m: usize,
    in_v: usize,
    n_cols: usize,
    col_offset: usize,
    out_stride: usize,
    groups: usize,
    dv: usize,
    d: usize,
    eps: f32,
    #[comptime] mb: usize,
    #[comptime] cols: usize,
    #[comptime] norm: bool,
    #[comptime] epilogue: u32,
) {
    // This unit's `cols` columns: o0, o0 + 1, ... (clamped for loads, guarded for stores).
    let o0 = (CUBE_POS * comptime!(BLOCK) + UNIT_POS as usize) * cols;
    let gated = comptime!(is_gated(epilogue));
    let mut wbase = Array::<usize>::new(cols);
    column_rows(&mut wbase, o0, n_cols, in_v, cols);

    let mut row0 = 0usize;
    while row0 < m {
        // acc[r * cols + c]: row r, column c of this unit.
        let mut acc = Array::<f32>::new(comptime!(mb * cols));
        let mut acc_u = Array::<f32>::new(comptime!(mb * cols));
        // Row offsets into x; rows past m are clamped (computed, never stored).
        let mut xoff = Array::<usize>::new(mb);
        #[unroll]
        for r in 0..mb {
            xoff[r] = select(row0 + r < m, row0 + r, m - 1) * in_v;
            #[unroll]
            for c in 0..cols {
                acc[r * cols + c] = 0.0;
                acc_u[r * cols + c] = 0.0;
            }
        }
        for g in 0..groups {
            let kbeg = g * dv;
            let mut sq = Array::<f32>::new(mb);
            let mut part = Array::<f32>::new(comptime!(mb * cols));
            let mut part_u = Array::<f32>::new(comptime!(mb * cols));
            #[unroll]
            for r in 0..mb {
                sq[r] = 0.0;
                #[unroll]
                for c in 0..cols {
                    part[r * cols + c] = 0.0;
                    part_u[r * cols + c] = 0.0;
                }
            }
            for kv in kbeg..kbeg + dv {
                accumulate::<F, N>(
                    x,
                    w,
                    w_up,
                    gamma,
                    &wbase,
                    &xoff,
                    kv,
                    &mut part,
                    &mut part_u,
                    &mut sq,
                    mb,
                    cols,
                    norm,
                    gated,
                );
            }
            add_group(
                &mut acc, &mut acc_u, &part, &part_u, &sq, d, eps, mb, cols, norm,
            );
        }
        store_block::<F>(
            &acc, &acc_u, extra, out, row0, o0, m, n_cols, out_stride, col_offset, mb, cols,
            epilogue,
        );
        row0 += mb;
    }
}

/// `out = epilogue(prologue(x) · weightᵀ)`, units owning 8 columns.
///
/// * `x`: `[..., in]` (all leading dims are rows, `m` = their product).
/// * `weight`: `[out, in]` (the gate weight for SwiGLU and GeGLU).
/// * `out`: `[..., out]` with `x`'s leading dims; same dtype as `x`.
pub fn linear<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    prologue: Prologue<'_, R>,
    epilogue: Epilogue<'_, R>,
    out: &DeviceTensor<R>,
) -> Result<()> {
    linear_lanes(client, x, weight, prologue, epilogue, out, UNIT_COLUMNS[0])
}

/// [`linear`] with `cols` output columns per unit (one of
/// [`UNIT_COLUMNS`]; anything else is an error).
pub fn linear_lanes<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    prologue: Prologue<'_, R>,
    epilogue: Epilogue<'_, R>,
    out: &DeviceTensor<R>,
    cols: usize,
) -> Result<()> {
    linear_in(
        client,
        x,
        weight,
        prologue,
        epilogue,
        out,
        Layout::Lanes { cols },
    )
}

/// [`linear`] in `layout`: lanes ([`linear_lanes`]) or planes
/// ([`crate::linear_plane::linear_planes`]), whichever the plan chose.
pub fn linear_in<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    prologue: Prologue<'_, R>,
    epilogue: Epilogue<'_, R>,
    out: &DeviceTensor<R>,
    layout: Layout,
) -> Result<()> {
    linear_with_binding_limit(
        client,
        x,
        weight,
        prologue,
        epilogue,
        out,
        layout,
        MAX_BINDING_BYTES,
    )
}

/// [`linear`] in `layout` with an explicit per-binding byte limit for the
/// weight chunks (tests use a small one to exercise the split): the launch
/// of both layouts ([`linear_lanes`], [`crate::linear_plane::linear_planes`]).
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn linear_with_binding_limit<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    prologue: Prologue<'_, R>,
    epilogue: Epilogue<'_, R>,
    out: &DeviceTensor<R>,
    layout: Layout,
    max_binding_bytes: usize,
) -> Result<()> {
    const OP: &str = "linear";
    match layout {
        Layout::Lanes { cols } if !UNIT_COLUMNS.contains(&cols) => {
            return Err(OpsError::InvalidArgument {
                op: OP,
                reason: format!("columns per unit must be one of {UNIT_COLUMNS:?}, got {cols}"),
            });
        }
        Layout::Lanes { .. } => {}
        Layout::Planes(shape) => shape.validate()?,
    }
    let a = check_args(
        client,
        x,
        weight,
        prologue,
        epilogue,
        out,
        max_binding_bytes,
    )?;
    // The grouped prologue reduces per group inside one plane (planes).
    let ksplit = match layout {
        Layout::Planes(shape) if a.groups == 1 => shape.ksplit as usize,
        _ => 1,
    };
    // Vector width, rows per block, output columns per cube and cube shape.
    let (nv, mb, cube_cols, dim) = match layout {
        Layout::Lanes { cols } => (
            vector_width(client, a.d),
            rows_per_block(a.m),
            BLOCK * cols,
            CubeDim::new_1d(BLOCK as u32),
        ),
        Layout::Planes(shape) => (
            crate::linear_plane::plane_vector_width(client, a.d, a.dtype.size()),
            crate::linear_plane::plane_rows_per_block(a.m),
            shape.planes as usize / ksplit * shape.cols as usize,
            CubeDim::new_2d(shape.plane, shape.planes),
        ),
    };
    let mut c0 = 0;
    while c0 < a.n {
        let (n_cols, w_chunk, up_chunk) = a.chunk(x, weight, c0)?;
        let count = cube_count(OP, n_cols.div_ceil(cube_cols))?;
        // Kernel `$k` with the runtime arguments both layouts share, then
        // its comptime ones.
        macro_rules! launch {
            ($k:path, $($comptime:expr),+) => {{
                use $k as kernel;
                kernel::launch_unchecked::<F, R>(
                    client,
                    count,
                    dim,
                    nv,
                    x.array_arg(),
                    w_chunk.array_arg(),
                    up_chunk.array_arg(),
                    a.gamma.array_arg(),
                    a.extra.array_arg(),
                    out.array_arg(),
                    a.m,
                    a.k / nv,
                    n_cols,
                    c0,
                    a.n,
                    a.groups,
                    a.d / nv,
                    a.d,
                    a.eps,
                    mb,
                    $($comptime),+
                )
            }};
        }
        // SAFETY: every index the kernels form is in bounds for the shapes
        // validated above: weight rows clamped to `n_cols - 1`, x rows to
        // `m - 1`, reduction indices below `groups * dv = k / nv`, stores
        // guarded by `n_cols` and `m`, the planes' shared memory sized for
        // `planes` slots, optional inputs read only when their comptime
        // flag is set.
        crate::dispatch_float!(a.dtype, OP, F => {
            unsafe {
                match layout {
                    Layout::Lanes { cols } => launch!(linear_kernel, cols, a.norm, a.code),
                    Layout::Planes(shape) => launch!(
                        crate::linear_plane::linear_plane_kernel,
                        shape.cols as usize,
                        shape.planes as usize,
                        ksplit,
                        a.norm,
                        a.code
                    ),
                }
            }
        })?;
        c0 += n_cols;
    }
    finish(client, OP)
}

/// The validated arguments of a linear launch (shared by both layouts).
pub(crate) struct Checked<'a, R: Runtime> {
    pub dtype: crate::tensor::DType,
    pub k: usize,
    pub m: usize,
    pub n: usize,
    pub gamma: &'a DeviceTensor<R>,
    pub groups: usize,
    pub d: usize,
    pub eps: f32,
    pub norm: bool,
    pub extra: &'a DeviceTensor<R>,
    pub up: Option<&'a DeviceTensor<R>>,
    pub code: u32,
    pub row_bytes: usize,
    /// Most output columns one weight binding holds.
    pub max_cols: usize,
}

impl<R: Runtime> Checked<'_, R> {
    /// The weight chunk starting at output column `c0`: its column count and
    /// the gate (or only) and up weights over it (`x` stands in for a
    /// missing up weight; the kernel never reads it).
    pub(crate) fn chunk(
        &self,
        x: &DeviceTensor<R>,
        weight: &DeviceTensor<R>,
        c0: usize,
    ) -> Result<(usize, DeviceTensor<R>, DeviceTensor<R>)> {
        let cols = (self.n - c0).min(self.max_cols);
        let w = weight_chunk(weight, c0, cols, self.row_bytes)?;
        let up = match self.up {
            Some(u) => weight_chunk(u, c0, cols, self.row_bytes)?,
            None => x.clone(),
        };
        Ok((cols, w, up))
    }
}

/// Validates `linear`'s arguments; unused optional inputs are bound to `x`
/// (never read: comptime flags).
pub(crate) fn check_args<'a, R: Runtime>(
    client: &ComputeClient<R>,
    x: &'a DeviceTensor<R>,
    weight: &'a DeviceTensor<R>,
    prologue: Prologue<'a, R>,
    epilogue: Epilogue<'a, R>,
    out: &DeviceTensor<R>,
    max_binding_bytes: usize,
) -> Result<Checked<'a, R>> {
    const OP: &str = "linear";
    expect_float(client, OP, "x", x)?;
    expect_nonempty(OP, "x", x)?;
    expect_nonempty(OP, "weight", weight)?;
    let dtype = x.dtype();
    let k = *x.shape().last().unwrap_or(&0);
    let m = x.numel() / k;
    if weight.shape().len() != 2 || weight.shape()[1] != k {
        return Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "weight",
            expected: format!("[out, {k}]"),
            found: weight.shape().to_vec(),
        });
    }
    expect_dtype(OP, "weight", weight, dtype)?;
    let n = weight.shape()[0];
    let mut out_shape = x.shape().to_vec();
    *out_shape.last_mut().unwrap_or(&mut 0) = n;
    expect_shape(OP, "out", out, &out_shape)?;
    expect_dtype(OP, "out", out, dtype)?;

    // Unused optional inputs are bound to `x` (never read: comptime flags).
    let dummy = x;
    let (gamma, groups, d, eps, norm) = match prologue {
        Prologue::None => (dummy, 1, k, 0.0, false),
        Prologue::RmsNorm { weight: g, eps } => {
            expect_shape(OP, "prologue weight", g, &[k])?;
            (g, 1, k, eps, true)
        }
        Prologue::GroupRmsNorm { weight: g, eps } => {
            let s = g.shape();
            if s.len() != 2 || s[0] * s[1] != k || s[1] == 0 {
                return Err(OpsError::ShapeMismatch {
                    op: OP,
                    arg: "prologue weight",
                    expected: format!("[groups, d] with groups * d = {k}"),
                    found: s.to_vec(),
                });
            }
            (g, s[0], s[1], eps, true)
        }
    };
    if norm {
        expect_dtype(OP, "prologue weight", gamma, dtype)?;
        expect_eps(OP, eps)?;
    }
    let (extra, up, code) = match epilogue {
        Epilogue::None => (dummy, None, EPI_NONE),
        Epilogue::Bias(b) => {
            expect_shape(OP, "bias", b, &[n])?;
            (b, None, EPI_BIAS)
        }
        Epilogue::Residual(r) => {
            expect_shape(OP, "residual", r, &out_shape)?;
            (r, None, EPI_RESIDUAL)
        }
        Epilogue::SwiGlu { up } => {
            expect_shape(OP, "up weight", up, weight.shape())?;
            (dummy, Some(up), EPI_SWIGLU)
        }
        Epilogue::GeGlu { up } => {
            expect_shape(OP, "up weight", up, weight.shape())?;
            (dummy, Some(up), EPI_GEGLU)
        }
    };
    expect_dtype(OP, "epilogue tensor", extra, dtype)?;
    if let Some(up) = up {
        expect_dtype(OP, "up weight", up, dtype)?;
    }

    // Split the weight into chunks of output columns that fit one binding.
    let row_bytes = k * dtype.size();
    let max_cols = (max_binding_bytes / row_bytes) / 256 * 256;
    if max_cols == 0 {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!("in = {k} is too wide: 256 weight rows exceed one binding"),
        });
    }
    Ok(Checked {
        dtype,
        k,
        m,
        n,
        gamma,
        groups,
        d,
        eps,
        norm,
        extra,
        up,
        code,
        row_bytes,
        max_cols,
    })
}

/// Rows `c0..c0+cols` of a `[out, in]` weight as a tensor over a sub-range of
/// the same allocation (no copy).
fn weight_chunk<R: Runtime>(
    w: &DeviceTensor<R>,
    c0: usize,
    cols: usize,
    row_bytes: usize,
) -> Result<DeviceTensor<R>> {
    if c0 == 0 && cols == w.shape()[0] {
        return Ok(w.clone());
    }
    let total = w.handle.size_in_used();
    let start = (c0 * row_bytes) as u64;
    let end = start + (cols * row_bytes) as u64;
    let handle = w.handle.clone().offset_start(start).offset_end(total - end);
    DeviceTensor::from_handle(handle, &[cols, w.shape()[1]], w.dtype())
}

/// Plain-Rust oracle (f32, row-major slices).
pub mod reference {
    /// Prologue of the reference: `None`, RMS norm with `[in]` weights, or
    /// grouped RMS norm with `[groups, d]` weights (`groups * d = in`).
    pub enum Prologue<'a> {
        None,
        RmsNorm {
            weight: &'a [f32],
            eps: f32,
        },
        GroupRmsNorm {
            weight: &'a [f32],
            d: usize,
            eps: f32,
        },
    }

    /// Epilogue of the reference.
    pub enum Epilogue<'a> {
        None,
        Bias(&'a [f32]),
        Residual(&'a [f32]),
        SwiGlu { up: &'a [f32] },
        GeGlu { up: &'a [f32] },
    }

    /// The tanh GELU (PyTorch's `gelu(approximate="tanh")`):
    /// `0.5·g·(1 + tanh(u))`, `u = √(2/π)·(g + 0.044715·g³)`, computed in f64
    /// as `g / (1 + e^(−2u))` (the same identity as the kernel's, so the
    /// reference is exact where PyTorch's f32 `1 + tanh(u)` cancels: for
    /// g ≲ −3 PyTorch gives −2.98e-7 at g = −5, the true value is −2.29e-7;
    /// the difference is below 1e-6 absolute everywhere).
    pub fn gelu_tanh(g: f32) -> f32 {
        let g = f64::from(g);
        let u = (2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g);
        (g / (1.0 + (-2.0 * u).exp())) as f32
    }

    /// `x` `[m, k]`, `w` `[n, k]` → `[m, n]`.
    pub fn linear(x: &[f32], w: &[f32], k: usize, pro: Prologue, epi: Epilogue) -> Vec<f32> {
        let n = w.len() / k;
        let xn: Vec<f32> = match pro {
            Prologue::None => x.to_vec(),
            Prologue::RmsNorm { weight, eps } => {
                crate::rms_norm::reference::rms_norm(x, weight, eps)
            }
            Prologue::GroupRmsNorm { weight, d, eps } => {
                crate::rms_norm::reference::rms_norm_segments(x, weight, d, eps)
            }
        };
        let matmul = |w: &[f32]| -> Vec<f32> {
            let mut y = Vec::with_capacity(x.len() / k * n);
            for row in xn.chunks(k) {
                for wrow in w.chunks(k) {
                    y.push(
                        row.iter()
                            .zip(wrow)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>() as f32,
                    );
                }
            }
            y
        };
        let mut y = matmul(w);
        match epi {
            Epilogue::None => {}
            Epilogue::Bias(b) => y.iter_mut().enumerate().for_each(|(i, v)| *v += b[i % n]),
            Epilogue::Residual(r) => y.iter_mut().zip(r).for_each(|(v, r)| *v += r),
            Epilogue::SwiGlu { up } => {
                let u = matmul(up);
                y.iter_mut()
                    .zip(u)
                    .for_each(|(g, u)| *g = *g / (1.0 + (-*g).exp()) * u);
            }
            Epilogue::GeGlu { up } => {
                let u = matmul(up);
                y.iter_mut()
                    .zip(u)
                    .for_each(|(g, u)| *g = gelu_tanh(*g) * u);
            }
        }
        y
    }
}
