//! Linear layer for real GPUs (the "planes" variant of [`crate::linear`]):
//! `y = prologue(x) · Wᵀ (+ epilogue)` with the same prologues (RMS norm,
//! grouped RMS norm) and epilogues (bias, residual, SwiGLU, GeGLU) and the same
//! `[out, in]` weight layout.
//!
//! Layout (docs/gpu.md; llama.cpp's `mul_mat_vec` is the model):
//! * a cube is `planes` planes (warps) of `plane` lanes: `CubeDim (plane,
//!   planes)`, so `UNIT_POS_Y` is the plane and `UNIT_POS_X` the lane;
//! * `ksplit` planes share one group of `cols` output columns and split the
//!   reduction dimension between them (split-K inside the cube, for narrow
//!   outputs with a long reduction such as `down_proj`); the other planes of
//!   the cube own further column groups;
//! * the lanes of a plane stream consecutive vectors of a weight row
//!   (`Vector<F, N>`, 16 bytes on CUDA: coalesced, each weight read once per
//!   step) and keep `mb × cols` accumulators, so for m ≤ 16 every weight
//!   element is loaded exactly once whatever m is;
//! * `plane_sum` reduces each accumulator over the lanes, then (ksplit > 1)
//!   shared memory combines the planes of a column group; lane 0 of the
//!   group's first plane applies the norm scale and the epilogue.
//!
//! The grouped RMS prologue reduces per group (ksplit = 1). Rows beyond 16
//! are processed in blocks of 16 (each block re-reads the weights: the
//! m > 16 tensor-core path is not built). The plane size is a launch
//! parameter ([`PlaneShape::plane`]); it must equal the device's plane
//! (subgroup) size: 32 on NVIDIA, 8 on lavapipe, where these kernels run in
//! the tests even though cubecl does not advertise plane ops there.
//!
//! This file holds what is the planes' own (the kernel, the plane
//! reduction, the launch shape); the arguments are checked and the kernel
//! launched by [`crate::linear::linear_with_binding_limit`] with
//! [`crate::linear::Layout::Planes`].

use cubecl::prelude::*;

use crate::error::{OpsError, Result};
use crate::linear::{accumulate, column_rows, Epilogue, Layout, Prologue};
use crate::tensor::DeviceTensor;

/// The launch shape of [`linear_planes`]: what the lowering chooses per
/// device (`codegen::device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaneShape {
    /// Lanes per plane: the device's plane size.
    pub plane: u32,
    /// Planes per cube.
    pub planes: u32,
    /// Planes that split the reduction of one column group (divides `planes`).
    pub ksplit: u32,
    /// Output columns per column group (1 or 2).
    pub cols: u32,
}

impl PlaneShape {
    pub(crate) fn validate(&self) -> Result<()> {
        let ok = self.plane > 0
            && self.plane.is_power_of_two()
            && self.planes > 0
            && self.ksplit > 0
            && self.planes.is_multiple_of(self.ksplit)
            && (1..=2).contains(&self.cols)
            && self.plane * self.planes <= 1024;
        if ok {
            Ok(())
        } else {
            Err(OpsError::InvalidArgument {
                op: "linear",
                reason: format!("invalid plane launch shape {self:?}"),
            })
        }
    }
}

/// Rows per register block for `m` rows (at most 16).
pub fn plane_rows_per_block(m: usize) -> usize {
    m.next_power_of_two().clamp(1, 16)
}

#[cube]
fn zero(a: &mut Array<f32>, #[comptime] n: usize) {
    #[unroll]
    for i in 0..n {
        a[i] = 0.0;
    }
}

/// Reduces a plane's partial sums over its lanes (`plane_sum`), then over
/// the `ksplit` planes that share its column group through `smem` (`mb ·
/// cols · 2 + mb` floats a plane): the group's sums end in its first plane
/// (`split == 0`). `part_u` is the gated epilogues' (SwiGLU's, GeGLU's)
/// up projection (reduced only with `gated`), `sq` the rows' sums of
/// squares (over lanes only with `norm`).
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_group(
    smem: &mut SharedMemory<f32>,
    part: &mut Array<f32>,
    part_u: &mut Array<f32>,
    sq: &mut Array<f32>,
    plane: usize,
    split: usize,
    lane: usize,
    #[comptime] mb: usize,
    #[comptime] cols: usize,
    #[comptime] ksplit: usize,
    #[comptime] norm: bool,
    #[comptime] gated: bool,
) {
    let slot = comptime!(mb * cols * 2 + mb);
    // Reduce over the plane's lanes.
    #[unroll]
    for i in 0..comptime!(mb * cols) {
        part[i] = plane_sum(part[i]);
        if gated {
            part_u[i] = plane_sum(part_u[i]);
        }
    }
    if norm {
        #[unroll]
        for r in 0..mb {
            sq[r] = plane_sum(sq[r]);
        }
    }
    // Combine the ksplit planes of this column group.
    if comptime!(ksplit > 1) {
        if lane == 0 {
            let base = plane * slot;
            #[unroll]
            for i in 0..comptime!(mb * cols) {
                smem[base + i] = part[i];
                if gated {
                    smem[base + comptime!(mb * cols) + i] = part_u[i];
                }
            }
            #[unroll]
            for r in 0..mb {
                smem[base + comptime!(mb * cols * 2) + r] = sq[r];
            }
        }
        sync_cube();
        if split == 0 {
            #[unroll]
            for s in 1..ksplit {
                let base = (plane + s) * slot;
                #[unroll]
                for i in 0..comptime!(mb * cols) {
                    part[i] += smem[base + i];
                    if gated {
                        part_u[i] += smem[base + comptime!(mb * cols) + i];
                    }
                }
                #[unroll]
                for r in 0..mb {
                    sq[r] += smem[base + comptime!(mb * cols * 2) + r];
                }
            }
        }
        sync_cube();
    }
}

#[cube(launch_unchecked)]
pub fn linear_plane_kernel<F: Float + CubeElement, N: Size>(
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
    #[comptime] planes: usize,
    #[comptime] ksplit: usize,
    #[comptime] norm: bool,
    #[comptime] epilogue: u32,
) {
    let gated = comptime!(crate::linear::is_gated(epilogue));
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    let split = plane % ksplit;
    let group_in_cube = plane / ksplit;
    let o0 = (CUBE_POS * comptime!(planes / ksplit) + group_in_cube) * cols;
    let pdim = PLANE_DIM as usize;
    let step = pdim * ksplit;
    // Per plane: mb * cols dot products (+ as many for SwiGLU's/GeGLU's up) and mb
    // sums of squares, exchanged when ksplit planes share a column group.
    let slot = comptime!(mb * cols * 2 + mb);
    let mut smem = SharedMemory::<f32>::new(comptime!(planes * slot));

    let mut wbase = Array::<usize>::new(cols);
    column_rows(&mut wbase, o0, n_cols, in_v, cols);

    let mut row0 = 0usize;
    while row0 < m {
        let mut acc = Array::<f32>::new(comptime!(mb * cols));
        let mut acc_u = Array::<f32>::new(comptime!(mb * cols));
        zero(&mut acc, comptime!(mb * cols));
        zero(&mut acc_u, comptime!(mb * cols));
        let mut xoff = Array::<usize>::new(mb);
        #[unroll]
        for r in 0..mb {
            xoff[r] = select(row0 + r < m, row0 + r, m - 1) * in_v;
        }
        for g in 0..groups {
            let kend = g * dv + dv;
            let mut part = Array::<f32>::new(comptime!(mb * cols));
            let mut part_u = Array::<f32>::new(comptime!(mb * cols));
            let mut sq = Array::<f32>::new(mb);
            zero(&mut part, comptime!(mb * cols));
            zero(&mut part_u, comptime!(mb * cols));
            zero(&mut sq, mb);
            let mut kv = g * dv + split * pdim + lane;
            while kv < kend {
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
                kv += step;
            }
            reduce_group(
                &mut smem,
                &mut part,
                &mut part_u,
                &mut sq,
                plane,
                split,
                lane,
                mb,
                cols,
                ksplit,
                norm,
                gated,
            );
            crate::linear::add_group(
                &mut acc, &mut acc_u, &part, &part_u, &sq, d, eps, mb, cols, norm,
            );
        }
        if split == 0 && lane == 0 {
            crate::linear::store_block::<F>(
                &acc, &acc_u, extra, out, row0, o0, m, n_cols, out_stride, col_offset, mb, cols,
                epilogue,
            );
        }
        row0 += mb;
    }
}

/// [`crate::linear::linear`] with the plane layout `shape` (same arguments,
/// same results up to f32 summation order).
pub fn linear_planes<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    prologue: Prologue<'_, R>,
    epilogue: Epilogue<'_, R>,
    out: &DeviceTensor<R>,
    shape: PlaneShape,
) -> Result<()> {
    crate::linear::linear_in(
        client,
        x,
        weight,
        prologue,
        epilogue,
        out,
        Layout::Planes(shape),
    )
}

/// The widest vector of at most 16 bytes (8 f16 or 4 f32 elements) that
/// divides the reduction segment `d` and the device allows.
pub fn plane_vector_width<R: Runtime>(client: &ComputeClient<R>, d: usize, elem: usize) -> usize {
    plane_vector_width_for(d, elem, client.properties().hardware.max_vector_size)
}

/// [`plane_vector_width`] for a device allowing vectors of `max` elements.
pub fn plane_vector_width_for(d: usize, elem: usize, max: usize) -> usize {
    [8usize, 4, 2, 1]
        .into_iter()
        .find(|&w| w * elem <= 16 && w <= max && d.is_multiple_of(w))
        .unwrap_or(1)
}
