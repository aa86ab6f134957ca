//! Cube-level building blocks shared by kernels: reductions over all units of
//! a cube through shared memory, a vector's lane sum, and the vector widths
//! the launches pick.
//!
//! Plane (subgroup) operations run on lavapipe but cubecl does not advertise
//! them there, so these use shared memory and `sync_cube`, which works on
//! every backend. `block` is the cube size (units), a power of two; every unit
//! of the cube must call these functions (they contain barriers).

use cubecl::prelude::*;

/// Sum of `value` over the cube's units; every unit gets the result.
/// `smem` must hold at least `block` f32 and is free again on return.
#[cube]
pub fn cube_sum(smem: &mut SharedMemory<f32>, value: f32, #[comptime] block: usize) -> f32 {
    cube_reduce(smem, value, block, false)
}

/// Maximum of `value` over the cube's units; every unit gets the result.
#[cube]
pub fn cube_max(smem: &mut SharedMemory<f32>, value: f32, #[comptime] block: usize) -> f32 {
    cube_reduce(smem, value, block, true)
}

/// The tree reduction behind [`cube_sum`] (`max` false) and [`cube_max`].
#[cube]
fn cube_reduce(
    smem: &mut SharedMemory<f32>,
    value: f32,
    #[comptime] block: usize,
    #[comptime] max: bool,
) -> f32 {
    let tid = UNIT_POS as usize;
    smem[tid] = value;
    sync_cube();
    let mut stride = comptime!(block / 2).runtime();
    while stride > 0 {
        if tid < stride {
            if max {
                smem[tid] = f32::max(smem[tid], smem[tid + stride]);
            } else {
                smem[tid] += smem[tid + stride];
            }
        }
        sync_cube();
        stride /= 2;
    }
    let total = smem[0];
    sync_cube();
    total
}

/// Sum of the lanes of a vector, in f32.
#[cube]
pub fn lane_sum<F: Float, N: Size>(v: Vector<F, N>) -> f32 {
    let mut s = 0f32;
    #[unroll]
    for i in 0..N::value() {
        s += f32::cast_from(v[i]);
    }
    s
}

/// Largest vector width (4, 2 or 1) that divides `n` and the device allows.
pub fn vector_width<R: cubecl::Runtime>(client: &ComputeClient<R>, n: usize) -> usize {
    widest_vector(n, client.properties().hardware.max_vector_size)
}

/// Largest of 4, 2 and 1 that divides `n` and is at most `max` (the KV
/// copies and the attention kernels take `max` = 4 on every device).
pub fn widest_vector(n: usize, max: usize) -> usize {
    [4usize, 2, 1]
        .into_iter()
        .find(|&w| w <= max && n.is_multiple_of(w))
        .unwrap_or(1)
}
