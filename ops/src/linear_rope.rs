//! A self-attention's q, k and v projections with RoPE and the KV append
//! as the epilogue: one launch from the normed hidden state to the rotated
//! queries and the new cache rows (issue 31's ≤ 5 launches a layer).
//!
//! The weight is the q, k and v matrices stacked along the output
//! (`[(heads + 2 · kv_heads) · head_dim, k]`), so the product's columns are
//! the query heads, then the K heads, then the V heads. RoPE rotates each
//! column `j < half` of a head with column `j + half` (HF's rotate_half), so
//! a unit (lanes) or a plane (planes) owns *pairs* of columns: pair `p` is
//! column `head · head_dim + j` and the one `half` after it, `head = p /
//! half`, `j = p % half`. Owning pairs only changes which unit computes a
//! column, not how: each column's dot product is the plain linear's, in the
//! same order ([`crate::linear::accumulate`]), rounded to the storage dtype
//! as a separate projection would store it, then rotated exactly as
//! [`crate::rope::rope_qkv_append`] does. On the same layout the launch is
//! therefore bit for bit the plain linear followed by `rope_qkv_append`
//! (tested), in one launch instead of two.
//!
//! Epilogue per row and pair: a query pair is rotated into `q` (`[m, heads,
//! head_dim]`); a K pair rotated into `k_cache` and a V pair copied into
//! `v_cache` (`[rows, kv_heads · head_dim]`) at row `slots[row]`.
//!
//! Limits: one plain RMS norm prologue or none (no grouped norm, bias or
//! residual); the stacked weight must fit one binding (the lowering keeps
//! the two-launch form otherwise).

use cubecl::prelude::*;

use crate::block::vector_width;
use crate::error::{OpsError, Result};
use crate::launch::{
    cube_count, expect_bindable, expect_dtype, expect_dtypes, expect_float, expect_nonempty,
    expect_shape, finish,
};
use crate::linear::{accumulate, row_scale};
use crate::linear_plane::{plane_rows_per_block, plane_vector_width, reduce_group};
use crate::rope::store_qkv_pair;
use crate::tensor::DeviceTensor;

/// Units per cube of the lane layout (as [`crate::linear::BLOCK`]).
pub const BLOCK: usize = crate::linear::BLOCK;

/// The column of pair `p`'s first (`second == 0`) or second (`1`) member.
#[cube]
fn pair_column(p: usize, half: usize, second: usize) -> usize {
    (p / half) * 2 * half + p % half + second * half
}

/// The weight row offsets of a unit's (plane's) `2 · pp` columns: pairs
/// `p0 ..` (past the last pair clamped to it), first members then second.
#[cube]
fn pair_rows(
    wbase: &mut Array<usize>,
    p0: usize,
    pairs: usize,
    half: usize,
    in_v: usize,
    #[comptime] pp: usize,
) {
    #[unroll]
    for c in 0..comptime!(2 * pp) {
        let p = select(p0 + c % pp < pairs, p0 + c % pp, pairs - 1);
        wbase[c] = pair_column(p, half, c / pp) * in_v;
    }
}

/// Starts a block of `mb` rows at `row0`: their `x` offsets (rows past `m`
/// clamped) and zeroed sums.
#[cube]
#[allow(clippy::too_many_arguments)]
fn start_rows(
    xoff: &mut Array<usize>,
    sq: &mut Array<f32>,
    part: &mut Array<f32>,
    unused: &mut Array<f32>,
    row0: usize,
    m: usize,
    in_v: usize,
    #[comptime] mb: usize,
    #[comptime] cols: usize,
) {
    #[unroll]
    for r in 0..mb {
        xoff[r] = select(row0 + r < m, row0 + r, m - 1) * in_v;
        sq[r] = 0.0;
        #[unroll]
        for c in 0..cols {
            part[r * cols + c] = 0.0;
            unused[r * cols + c] = 0.0;
        }
    }
}

/// `acc = 0 + part · 1/rms` per row (the plain linear's arithmetic, so its
/// bits; [`crate::linear::row_scale`] from the sums of squares `sq`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn scale_rows(
    acc: &mut Array<f32>,
    part: &Array<f32>,
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
            acc[r * cols + c] = 0f32 + part[r * cols + c] * inv;
        }
    }
}

/// Stores the projections of pairs `p0 .. p0 + pp` of rows `row0 ..
/// row0 + mb` (`acc[r * 2pp + c]` the first members, `acc[r * 2pp + pp +
/// c]` the second) as [`crate::rope::rope_qkv_append`] does
/// ([`store_qkv_pair`]): rotated queries into `q`, rotated K and plain V
/// rows into the caches at `slots[row]`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_pairs<F: Float + CubeElement>(
    acc: &Array<f32>,
    pos: &Array<u32>,
    inv_freq: &Array<f32>,
    slots: &Array<u32>,
    q: &mut Array<F>,
    k_cache: &mut Array<F>,
    v_cache: &mut Array<F>,
    row0: usize,
    p0: usize,
    m: usize,
    pairs: usize,
    half: usize,
    heads: usize,
    kv_heads: usize,
    #[comptime] mb: usize,
    #[comptime] pp: usize,
) {
    let hd = 2 * half;
    #[unroll]
    for r in 0..mb {
        #[unroll]
        for c in 0..pp {
            let row = row0 + r;
            let p = p0 + c;
            if p < pairs && row < m {
                let head = p / half;
                let j = p % half;
                // Rounded to the storage dtype, as a projection stores it.
                let x1 = f32::cast_from(F::cast_from(acc[r * comptime!(2 * pp) + c]));
                let x2 = f32::cast_from(F::cast_from(acc[r * comptime!(2 * pp) + pp + c]));
                store_qkv_pair::<F>(
                    x1, x2, row, head, j, pos, inv_freq, slots, q, k_cache, v_cache, hd, half,
                    heads, kv_heads,
                );
            }
        }
    }
}

/// Lanes: a unit owns `pp` consecutive pairs (`2 · pp` weight rows),
/// [`BLOCK`] units per cube, rows in blocks of `mb`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn linear_rope_qkv_kernel<F: Float + CubeElement, N: Size>(
    x: &Array<Vector<F, N>>,
    w: &Array<Vector<F, N>>,
    gamma: &Array<Vector<F, N>>,
    pos: &Array<u32>,
    inv_freq: &Array<f32>,
    slots: &Array<u32>,
    q: &mut Array<F>,
    k_cache: &mut Array<F>,
    v_cache: &mut Array<F>,
    m: usize,
    in_v: usize,
    pairs: usize,
    half: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    eps: f32,
    #[comptime] mb: usize,
    #[comptime] pp: usize,
    #[comptime] norm: bool,
) {
    let cols = comptime!(2 * pp);
    let p0 = (CUBE_POS * comptime!(BLOCK) + UNIT_POS as usize) * pp;
    let mut wbase = Array::<usize>::new(cols);
    pair_rows(&mut wbase, p0, pairs, half, in_v, pp);
    let mut row0 = 0usize;
    while row0 < m {
        let mut xoff = Array::<usize>::new(mb);
        let mut sq = Array::<f32>::new(mb);
        let mut part = Array::<f32>::new(comptime!(mb * cols));
        let mut unused = Array::<f32>::new(comptime!(mb * cols));
        start_rows(
            &mut xoff,
            &mut sq,
            &mut part,
            &mut unused,
            row0,
            m,
            in_v,
            mb,
            cols,
        );
        for kv in 0..in_v {
            accumulate::<F, N>(
                x,
                w,
                w,
                gamma,
                &wbase,
                &xoff,
                kv,
                &mut part,
                &mut unused,
                &mut sq,
                mb,
                cols,
                norm,
                false,
            );
        }
        let mut acc = Array::<f32>::new(comptime!(mb * cols));
        scale_rows(&mut acc, &part, &sq, d, eps, mb, cols, norm);
        store_pairs::<F>(
            &acc, pos, inv_freq, slots, q, k_cache, v_cache, row0, p0, m, pairs, half, heads,
            kv_heads, mb, pp,
        );
        row0 += mb;
    }
}

/// Planes: a plane owns `pp` pairs, lanes stream consecutive weight
/// vectors, `ksplit` planes of a cube share a pair group's reduction (as
/// [`crate::linear_plane::linear_plane_kernel`]).
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub fn linear_plane_rope_qkv_kernel<F: Float + CubeElement, N: Size>(
    x: &Array<Vector<F, N>>,
    w: &Array<Vector<F, N>>,
    gamma: &Array<Vector<F, N>>,
    pos: &Array<u32>,
    inv_freq: &Array<f32>,
    slots: &Array<u32>,
    q: &mut Array<F>,
    k_cache: &mut Array<F>,
    v_cache: &mut Array<F>,
    m: usize,
    in_v: usize,
    pairs: usize,
    half: usize,
    heads: usize,
    kv_heads: usize,
    d: usize,
    eps: f32,
    #[comptime] mb: usize,
    #[comptime] pp: usize,
    #[comptime] planes: usize,
    #[comptime] ksplit: usize,
    #[comptime] norm: bool,
) {
    let cols = comptime!(2 * pp);
    let lane = UNIT_POS_X as usize;
    let plane = UNIT_POS_Y as usize;
    let split = plane % ksplit;
    let p0 = (CUBE_POS * comptime!(planes / ksplit) + plane / ksplit) * pp;
    let pdim = PLANE_DIM as usize;
    let step = pdim * ksplit;
    // The plain plane linear's exchange layout (`reduce_group`).
    let mut smem = SharedMemory::<f32>::new(comptime!(planes * (mb * cols * 2 + mb)));
    let mut wbase = Array::<usize>::new(cols);
    pair_rows(&mut wbase, p0, pairs, half, in_v, pp);
    let mut row0 = 0usize;
    while row0 < m {
        let mut xoff = Array::<usize>::new(mb);
        let mut sq = Array::<f32>::new(mb);
        let mut part = Array::<f32>::new(comptime!(mb * cols));
        let mut unused = Array::<f32>::new(comptime!(mb * cols));
        start_rows(
            &mut xoff,
            &mut sq,
            &mut part,
            &mut unused,
            row0,
            m,
            in_v,
            mb,
            cols,
        );
        let mut kv = split * pdim + lane;
        while kv < in_v {
            accumulate::<F, N>(
                x,
                w,
                w,
                gamma,
                &wbase,
                &xoff,
                kv,
                &mut part,
                &mut unused,
                &mut sq,
                mb,
                cols,
                norm,
                false,
            );
            kv += step;
        }
        reduce_group(
            &mut smem,
            &mut part,
            &mut unused,
            &mut sq,
            plane,
            split,
            lane,
            mb,
            cols,
            ksplit,
            norm,
            false,
        );
        let mut acc = Array::<f32>::new(comptime!(mb * cols));
        scale_rows(&mut acc, &part, &sq, d, eps, mb, cols, norm);
        if split == 0 && lane == 0 {
            store_pairs::<F>(
                &acc, pos, inv_freq, slots, q, k_cache, v_cache, row0, p0, m, pairs, half, heads,
                kv_heads, mb, pp,
            );
        }
        row0 += mb;
    }
}

/// How [`linear_rope_qkv`] lays the work out: the linear's layouts, with
/// units owning `cols / 2` pairs (`cols` an even one of
/// [`crate::linear::UNIT_COLUMNS`]) or planes owning `shape.cols` pairs.
pub type RopeQkvLayout = crate::linear::Layout;

/// Where [`linear_rope_qkv`] puts its results and what it rotates with.
pub struct RopeQkvOut<'a, R: Runtime> {
    /// u32 `[m]`: each row's position.
    pub positions: &'a DeviceTensor<R>,
    /// f32 `[head_dim / 2]` ([`crate::rope::rope_freqs`]).
    pub freqs: &'a DeviceTensor<R>,
    /// The cache row of each row (distinct, `< rows`).
    pub slots: &'a crate::kv::RowIndex<R>,
    /// `[m, heads, head_dim]`: the rotated queries.
    pub q: &'a DeviceTensor<R>,
    /// `[rows, kv_heads · head_dim]` each.
    pub k_cache: &'a DeviceTensor<R>,
    pub v_cache: &'a DeviceTensor<R>,
}

impl<R: Runtime> Clone for RopeQkvOut<'_, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R: Runtime> Copy for RopeQkvOut<'_, R> {}

/// `rms_norm(x) · Wᵀ` (no norm when `norm` is `None`; `(gamma [k], eps)`
/// otherwise) over the stacked q/k/v weight `weight` (`[(heads + 2 ·
/// kv_heads) · head_dim, k]`), then RoPE on q and k and the K/V rows into
/// the caches, in one launch (see the module docs).
pub fn linear_rope_qkv<R: Runtime>(
    client: &ComputeClient<R>,
    x: &DeviceTensor<R>,
    weight: &DeviceTensor<R>,
    norm: Option<(&DeviceTensor<R>, f32)>,
    out: RopeQkvOut<'_, R>,
    layout: RopeQkvLayout,
) -> Result<()> {
    const OP: &str = "linear_rope_qkv";
    expect_float(client, OP, "x", x)?;
    expect_nonempty(OP, "x", x)?;
    let [m, k] = x.shape()[..] else {
        return Err(OpsError::ShapeMismatch {
            op: OP,
            arg: "x",
            expected: "[m, k]".into(),
            found: x.shape().to_vec(),
        });
    };
    let dtype = x.dtype();
    let (qm, heads, hd) = crate::rope::rope_rows(client, OP, "q", out.q)?;
    if qm != m {
        return Err(OpsError::InvalidArgument {
            op: OP,
            reason: format!("q has {qm} rows, x has {m}"),
        });
    }
    let (rows, kv_heads) = crate::rope::cache_heads(OP, out.k_cache, out.v_cache, hd)?;
    let n = (heads + 2 * kv_heads) * hd;
    expect_shape(OP, "weight", weight, &[n, k])?;
    expect_dtypes(
        OP,
        dtype,
        &[
            ("weight", weight),
            ("q", out.q),
            ("k_cache", out.k_cache),
            ("v_cache", out.v_cache),
        ],
    )?;
    expect_bindable(OP, "weight", weight)?;
    let half = hd / 2;
    crate::rope::expect_positions_freqs(OP, out.positions, out.freqs, m, half)?;
    crate::kv::expect_slots(OP, out.slots, m, rows, [out.k_cache, out.v_cache])?;
    let (gamma, eps) = match norm {
        Some((g, eps)) => {
            expect_shape(OP, "gamma", g, &[k])?;
            expect_dtype(OP, "gamma", g, dtype)?;
            (g, eps)
        }
        None => (x, 0.0),
    };
    let Some(slots) = out.slots.device() else {
        return Ok(());
    };
    let pairs = n / 2;
    // Pairs per unit (plane), vector width, rows per block, split planes,
    // pairs per cube and cube shape.
    let (pp, nv, mb, ksplit, cube_pairs, dim) = match layout {
        RopeQkvLayout::Lanes { cols } => {
            if !crate::linear::UNIT_COLUMNS.contains(&cols) || !cols.is_multiple_of(2) {
                return Err(OpsError::InvalidArgument {
                    op: OP,
                    reason: format!(
                        "columns per unit must be an even one of the unit counts, got {cols}"
                    ),
                });
            }
            let pp = cols / 2;
            let nv = vector_width(client, k);
            let mb = crate::linear::rows_per_block(m);
            (pp, nv, mb, 1, BLOCK * pp, CubeDim::new_1d(BLOCK as u32))
        }
        RopeQkvLayout::Planes(shape) => {
            shape.validate()?;
            let pp = shape.cols as usize;
            let ksplit = shape.ksplit as usize;
            let groups_per_cube = shape.planes as usize / ksplit;
            let nv = plane_vector_width(client, k, dtype.size());
            let mb = plane_rows_per_block(m);
            let dim = CubeDim::new_2d(shape.plane, shape.planes);
            (pp, nv, mb, ksplit, groups_per_cube * pp, dim)
        }
    };
    let count = cube_count(OP, pairs.div_ceil(cube_pairs))?;
    // Kernel `$k` with the runtime arguments both layouts share, then its
    // comptime ones.
    macro_rules! launch {
        ($k:path, $($comptime:expr),+) => {{
            use $k as kernel;
            kernel::launch_unchecked::<F, R>(
                client, count, dim, nv,
                x.array_arg(), weight.array_arg(), gamma.array_arg(),
                out.positions.array_arg(), out.freqs.array_arg(), slots.array_arg(),
                out.q.array_arg(), out.k_cache.array_arg(), out.v_cache.array_arg(),
                m, k / nv, pairs, half, heads, kv_heads, k, eps,
                mb, pp, $($comptime),+
            )
        }};
    }
    crate::dispatch_float!(dtype, OP, F => {
        // SAFETY: shapes validated above; weight rows clamped to the last
        // pair, x rows to m - 1, stores guarded by `pairs` and `m`, slots
        // distinct and < rows, the planes' shared memory sized for
        // `planes` slots.
        unsafe {
            match layout {
                RopeQkvLayout::Lanes { .. } => launch!(linear_rope_qkv_kernel, norm.is_some()),
                RopeQkvLayout::Planes(shape) => launch!(
                    linear_plane_rope_qkv_kernel,
                    shape.planes as usize,
                    ksplit,
                    norm.is_some()
                ),
            }
        }
    })?;
    finish(client, OP)
}

/// Plain-Rust oracle.
pub mod reference {
    /// `rms_norm(x) · Wᵀ` (`gamma` `None`: no norm) over the stacked q/k/v
    /// weight, each output rounded by `round` (the storage dtype), then
    /// [`crate::rope::reference::rope_qkv_append`]: returns the rotated
    /// queries and writes the caches.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_rope_qkv(
        x: &[f32],
        w: &[f32],
        k: usize,
        gamma: Option<(&[f32], f32)>,
        round: impl Fn(f32) -> f32,
        pos: &[u32],
        slots: &[u32],
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        theta: f32,
        k_cache: &mut [f32],
        v_cache: &mut [f32],
    ) -> Vec<f32> {
        use crate::linear::reference::{linear, Epilogue, Prologue};
        let pro = match gamma {
            Some((g, eps)) => Prologue::RmsNorm { weight: g, eps },
            None => Prologue::None,
        };
        let qkv: Vec<f32> = linear(x, w, k, pro, Epilogue::None)
            .into_iter()
            .map(round)
            .collect();
        crate::rope::reference::rope_qkv_append(
            &qkv, pos, slots, heads, kv_heads, head_dim, theta, k_cache, v_cache,
        )
    }
}
