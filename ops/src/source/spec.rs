//! [`KernelSpec`]: one kernel instance of this crate (family plus every
//! comptime choice its launch function makes), its constructors from launch
//! sizes, and the codes of the linear epilogue, elementwise op and mask.

use std::fmt;

use super::*;

/// The epilogue code of [`crate::linear::linear_kernel`] (`Epilogue` in `linear`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearEpilogue {
    None,
    Bias,
    Residual,
    SwiGlu,
    /// `gelu_tanh(gate) · up`.
    GeGlu,
    /// RoPE on q and k and the KV append: the kernels of
    /// [`crate::linear_rope`] (`cols` counts columns, two per pair, in
    /// the lanes layout, and pairs per plane in the planes layout).
    RopeQkv,
}

impl LinearEpilogue {
    /// The kernel's comptime code (`EPI_*` in `linear.rs`).
    pub(super) fn code(self) -> u32 {
        match self {
            LinearEpilogue::None => linear::EPI_NONE,
            LinearEpilogue::Bias => linear::EPI_BIAS,
            LinearEpilogue::Residual => linear::EPI_RESIDUAL,
            LinearEpilogue::SwiGlu => linear::EPI_SWIGLU,
            LinearEpilogue::RopeQkv => linear::EPI_ROPE_QKV,
            LinearEpilogue::GeGlu => linear::EPI_GEGLU,
        }
    }

    fn name(self) -> &'static str {
        match self {
            LinearEpilogue::None => "none",
            LinearEpilogue::Bias => "bias",
            LinearEpilogue::Residual => "residual",
            LinearEpilogue::SwiGlu => "swiglu",
            LinearEpilogue::GeGlu => "geglu",
            LinearEpilogue::RopeQkv => "rope_qkv",
        }
    }
}

/// The op code of [`crate::elementwise::elementwise_kernel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementwiseKind {
    Add,
    Mul,
    /// `silu(a) * b`.
    SwiGlu,
    /// `silu(a)` (no second operand).
    Silu,
    /// `gelu_tanh(a) * b`.
    GeGlu,
}

impl ElementwiseKind {
    /// The kernel's comptime code (`OP_*` in `elementwise.rs`).
    pub(super) fn code(self) -> u32 {
        match self {
            ElementwiseKind::Add => elementwise::OP_ADD,
            ElementwiseKind::Mul => elementwise::OP_MUL,
            ElementwiseKind::SwiGlu => elementwise::OP_SWIGLU,
            ElementwiseKind::Silu => elementwise::OP_SILU,
            ElementwiseKind::GeGlu => elementwise::OP_GEGLU,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ElementwiseKind::Add => "add",
            ElementwiseKind::Mul => "mul",
            ElementwiseKind::SwiGlu => "swiglu",
            ElementwiseKind::Silu => "silu",
            ElementwiseKind::GeGlu => "geglu",
        }
    }
}

/// The comptime mask kind of the attention kernel ([`Mask`] without its
/// runtime parameters: windows and offsets are kernel arguments).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MaskKind {
    Full,
    Causal,
    CrossDiagonal,
    InverseBlock,
    SlidingSink,
    Tree,
    /// Tree verification of a sliding-window layer (`Mask::TreeSliding`).
    TreeSliding,
}

impl MaskKind {
    /// A mask of this kind (parameters are irrelevant to the source).
    pub(super) fn representative(self) -> Mask {
        match self {
            MaskKind::Full => Mask::Full,
            MaskKind::Causal => Mask::Causal,
            MaskKind::CrossDiagonal => Mask::CrossDiagonal,
            MaskKind::InverseBlock => Mask::InverseBlock {
                window: 1,
                offset: 0,
            },
            MaskKind::SlidingSink => Mask::SlidingSink { window: 1, sink: 0 },
            MaskKind::Tree => Mask::Tree,
            MaskKind::TreeSliding => Mask::TreeSliding { window: 1, sink: 0 },
        }
    }

    /// The attention kernels' comptime mask code.
    pub(super) fn code(self) -> u32 {
        self.representative().kernel_args().0
    }

    /// Whether the kernel is compiled with its comptime `tree` flag.
    pub(super) fn is_tree(self) -> bool {
        self.representative().is_tree()
    }

    fn name(self) -> &'static str {
        match self {
            MaskKind::Full => "full",
            MaskKind::Causal => "causal",
            MaskKind::CrossDiagonal => "cross_diagonal",
            MaskKind::InverseBlock => "inverse_block",
            MaskKind::SlidingSink => "sliding_sink",
            MaskKind::Tree => "tree",
            MaskKind::TreeSliding => "tree_sliding",
        }
    }
}

impl From<Mask> for MaskKind {
    fn from(m: Mask) -> MaskKind {
        match m {
            Mask::Full => MaskKind::Full,
            Mask::Causal => MaskKind::Causal,
            Mask::CrossDiagonal => MaskKind::CrossDiagonal,
            Mask::InverseBlock { .. } => MaskKind::InverseBlock,
            Mask::SlidingSink { .. } => MaskKind::SlidingSink,
            Mask::Tree => MaskKind::Tree,
            Mask::TreeSliding { .. } => MaskKind::TreeSliding,
        }
    }
}

/// One kernel instance: the family and every comptime parameter. Two launches
/// with equal specs run the same compiled kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelSpec {
    /// [`crate::linear::linear_kernel`]: `vector` = `N` (divides the norm
    /// segment / `in`), `rows_per_block` = `mb`, `cols` = output columns per
    /// unit (one of [`crate::linear::UNIT_COLUMNS`]), `norm` = RMS-norm
    /// prologue (plain or grouped: the group count is a runtime argument).
    Linear {
        dtype: DType,
        vector: usize,
        rows_per_block: usize,
        cols: usize,
        norm: bool,
        epilogue: LinearEpilogue,
    },
    /// [`crate::linear_plane::linear_plane_kernel`], the GPU layout:
    /// `vector` = `N` (16 bytes where the reduction segment allows),
    /// `rows_per_block` = `mb` (1–16), and the plane shape's comptime parts
    /// (`planes` per cube, `ksplit`, `cols`); the plane size is a launch
    /// dimension, not part of the source.
    LinearPlanes {
        dtype: DType,
        vector: usize,
        rows_per_block: usize,
        cols: usize,
        planes: usize,
        ksplit: usize,
        norm: bool,
        epilogue: LinearEpilogue,
    },
    /// [`crate::rms_norm::rms_norm_kernel`] (also grouped RMS norm).
    RmsNorm { dtype: DType, vector: usize },
    /// [`crate::rope::rope_kernel`] (scalar loads, no `N`).
    Rope { dtype: DType },
    /// [`crate::rope::rope_append_kernel`]: RoPE on new K rows written
    /// into the cache with the new V rows (scalar loads, no `N`).
    RopeAppend { dtype: DType },
    /// [`crate::rope::rope_qkv_append_kernel`]: from a fused q/k/v
    /// projection, rotated queries, and rotated K rows and the V rows into
    /// the caches (scalar loads, no `N`).
    RopeQkvAppend { dtype: DType },
    /// [`crate::head_norm::head_norm_rope_kernel`]: every head RMS-normalised,
    /// then rotated with `rope` (scalar loads, no `N`).
    HeadNorm { dtype: DType, rope: bool },
    /// The KV row-copy kernel of [`crate::kv`] (append, compaction, block copies).
    CopyRows { dtype: DType, vector: usize },
    /// The fused attention kernel ([`crate::attention`]); `head_dim_cap` is
    /// the per-head accumulator size in scalars (one of
    /// [`crate::attention::HEAD_DIM_CAPS`]), `heads_per_unit` the query
    /// heads of one KV head each unit serves
    /// ([`crate::attention::lane_heads_per_unit`]).
    Attention {
        dtype: DType,
        vector: usize,
        mask: MaskKind,
        head_dim_cap: usize,
        heads_per_unit: usize,
    },
    /// The GPU attention layout's main kernel (`attention::decode`): `pv`
    /// vectors of `vector` per lane, `planes` planes per cube.
    AttentionPlanes {
        dtype: DType,
        vector: usize,
        pv: usize,
        planes: usize,
        mask: MaskKind,
    },
    /// The GPU attention layout's split merge (launched when a context
    /// spans several key chunks).
    AttentionCombine { dtype: DType, vector: usize },
    /// [`crate::embedding::embedding_kernel`].
    Embedding { dtype: DType, vector: usize },
    /// [`crate::embedding::embedding_scaled_kernel`]: the gather times a
    /// runtime scale (Gemma 3's `sqrt(hidden)`).
    EmbeddingScaled { dtype: DType, vector: usize },
    /// [`crate::embedding::embedding_rows_kernel`]: the gather from one
    /// chunk of rows of a table over the binding limit, times a runtime
    /// scale when `scaled`.
    EmbeddingRows {
        dtype: DType,
        vector: usize,
        scaled: bool,
    },
    /// [`crate::elementwise::elementwise_kernel`].
    Elementwise {
        dtype: DType,
        vector: usize,
        op: ElementwiseKind,
    },
    /// [`crate::layer_sum::layer_sum_kernel`].
    LayerSum { dtype: DType, vector: usize },
}

/// Largest of 4, 2, 1 dividing `n` (`block::vector_width` on a device that
/// allows 4-wide vectors, and the fixed choice of `kv` and `attention`).
pub fn vector_width(n: usize) -> usize {
    crate::block::widest_vector(n, 4)
}

/// Rows per register block of `linear` for `m` rows (as `linear` picks it).
pub fn linear_rows_per_block(m: usize) -> usize {
    linear::rows_per_block(m)
}

/// Units per cube of the KV copy kernel (`kv.rs`).
const COPY_UNITS: u32 = 256;
/// Units per cube of the attention kernel (`attention/launch.rs`).
const ATTENTION_UNITS: u32 = 64;

impl KernelSpec {
    /// `linear` for `m` rows whose vectorised reduction segment is `d`
    /// scalars (`in` without a prologue or with RMS norm, the group size with
    /// grouped RMS norm), `cols` output columns per unit.
    pub fn linear(
        dtype: DType,
        m: usize,
        d: usize,
        norm: bool,
        epilogue: LinearEpilogue,
        cols: usize,
    ) -> KernelSpec {
        KernelSpec::Linear {
            dtype,
            vector: vector_width(d),
            rows_per_block: linear_rows_per_block(m),
            cols,
            norm,
            epilogue,
        }
    }

    /// `linear_planes` for `m` rows, reduction segment `d` (as in
    /// [`KernelSpec::linear`]), `groups` norm groups, with `shape`, on a
    /// device whose vectors are at most `max_vector` wide (CUDA: any, wgpu: 4).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_planes(
        dtype: DType,
        m: usize,
        d: usize,
        groups: usize,
        norm: bool,
        epilogue: LinearEpilogue,
        shape: crate::linear_plane::PlaneShape,
        max_vector: usize,
    ) -> KernelSpec {
        KernelSpec::LinearPlanes {
            dtype,
            vector: crate::linear_plane::plane_vector_width_for(d, dtype.size(), max_vector),
            rows_per_block: crate::linear_plane::plane_rows_per_block(m),
            cols: shape.cols as usize,
            planes: shape.planes as usize,
            ksplit: if groups > 1 { 1 } else { shape.ksplit as usize },
            norm,
            epilogue,
        }
    }

    /// RMS norm (or grouped RMS norm) over segments of `d`.
    pub fn rms_norm(dtype: DType, d: usize) -> KernelSpec {
        KernelSpec::RmsNorm {
            dtype,
            vector: vector_width(d),
        }
    }

    /// RoPE.
    pub fn rope(dtype: DType) -> KernelSpec {
        KernelSpec::Rope { dtype }
    }

    /// RoPE on new K rows fused with the KV append.
    pub fn rope_append(dtype: DType) -> KernelSpec {
        KernelSpec::RopeAppend { dtype }
    }

    /// RoPE on q and k of a fused projection, with the KV append.
    pub fn rope_qkv_append(dtype: DType) -> KernelSpec {
        KernelSpec::RopeQkvAppend { dtype }
    }

    /// Per-head RMS norm (an attention's `qk_norm`), then RoPE with `rope`.
    pub fn head_norm(dtype: DType, rope: bool) -> KernelSpec {
        KernelSpec::HeadNorm { dtype, rope }
    }

    /// Row copies of `width` scalars (KV append, stack/concat block copies).
    pub fn copy_rows(dtype: DType, width: usize) -> KernelSpec {
        KernelSpec::CopyRows {
            dtype,
            vector: vector_width(width),
        }
    }

    /// Fused attention with heads of `head_dim`, `group` query heads per KV
    /// head, under a mask of kind `mask` (draft-dim attention is
    /// `MaskKind::Full`).
    pub fn attention(dtype: DType, head_dim: usize, group: usize, mask: MaskKind) -> KernelSpec {
        KernelSpec::Attention {
            dtype,
            vector: vector_width(head_dim),
            mask,
            head_dim_cap: crate::attention::head_dim_cap(head_dim),
            heads_per_unit: crate::attention::lane_heads_per_unit(group, head_dim),
        }
    }

    /// The GPU attention layout for `head_dim` on planes of `plane` lanes
    /// with `planes` planes per cube (as `attention_planes` picks it).
    pub fn attention_planes(
        dtype: DType,
        head_dim: usize,
        plane: usize,
        planes: usize,
        mask: MaskKind,
    ) -> KernelSpec {
        let per = head_dim / plane.max(1);
        let vector = vector_width(per.max(1));
        KernelSpec::AttentionPlanes {
            dtype,
            vector,
            pv: (per / vector).max(1),
            planes,
            mask,
        }
    }

    /// Embedding gather of rows of `d`.
    pub fn embedding(dtype: DType, d: usize) -> KernelSpec {
        KernelSpec::Embedding {
            dtype,
            vector: vector_width(d),
        }
    }

    /// Embedding gather of rows of `d` times a runtime scale.
    pub fn embedding_scaled(dtype: DType, d: usize) -> KernelSpec {
        KernelSpec::EmbeddingScaled {
            dtype,
            vector: vector_width(d),
        }
    }

    /// Embedding gather of rows of `d` from a table bound in chunks of
    /// rows (one over the binding limit), times a runtime scale when
    /// `scaled`.
    pub fn embedding_rows(dtype: DType, d: usize, scaled: bool) -> KernelSpec {
        KernelSpec::EmbeddingRows {
            dtype,
            vector: vector_width(d),
            scaled,
        }
    }

    /// Element-wise `op` over `numel` elements.
    pub fn elementwise(dtype: DType, numel: usize, op: ElementwiseKind) -> KernelSpec {
        KernelSpec::Elementwise {
            dtype,
            vector: vector_width(numel),
            op,
        }
    }

    /// Weighted layer sum producing `numel` elements.
    pub fn layer_sum(dtype: DType, numel: usize) -> KernelSpec {
        KernelSpec::LayerSum {
            dtype,
            vector: vector_width(numel),
        }
    }

    /// The storage dtype.
    pub fn dtype(&self) -> DType {
        match *self {
            KernelSpec::Linear { dtype, .. }
            | KernelSpec::LinearPlanes { dtype, .. }
            | KernelSpec::RmsNorm { dtype, .. }
            | KernelSpec::Rope { dtype }
            | KernelSpec::RopeAppend { dtype }
            | KernelSpec::RopeQkvAppend { dtype }
            | KernelSpec::HeadNorm { dtype, .. }
            | KernelSpec::CopyRows { dtype, .. }
            | KernelSpec::Attention { dtype, .. }
            | KernelSpec::AttentionPlanes { dtype, .. }
            | KernelSpec::AttentionCombine { dtype, .. }
            | KernelSpec::Embedding { dtype, .. }
            | KernelSpec::EmbeddingScaled { dtype, .. }
            | KernelSpec::EmbeddingRows { dtype, .. }
            | KernelSpec::Elementwise { dtype, .. }
            | KernelSpec::LayerSum { dtype, .. } => dtype,
        }
    }

    /// The vector width `N` (1 for kernels without one).
    pub fn vector(&self) -> usize {
        match *self {
            KernelSpec::Rope { .. }
            | KernelSpec::RopeAppend { .. }
            | KernelSpec::RopeQkvAppend { .. }
            | KernelSpec::HeadNorm { .. } => 1,
            KernelSpec::Linear { vector, .. }
            | KernelSpec::LinearPlanes { vector, .. }
            | KernelSpec::RmsNorm { vector, .. }
            | KernelSpec::CopyRows { vector, .. }
            | KernelSpec::Attention { vector, .. }
            | KernelSpec::AttentionPlanes { vector, .. }
            | KernelSpec::AttentionCombine { vector, .. }
            | KernelSpec::Embedding { vector, .. }
            | KernelSpec::EmbeddingScaled { vector, .. }
            | KernelSpec::EmbeddingRows { vector, .. }
            | KernelSpec::Elementwise { vector, .. }
            | KernelSpec::LayerSum { vector, .. } => vector,
        }
    }

    /// The `#[cube]` function's name.
    pub fn kernel_fn(&self) -> &'static str {
        match self {
            KernelSpec::Linear {
                epilogue: LinearEpilogue::RopeQkv,
                ..
            } => "linear_rope_qkv_kernel",
            KernelSpec::LinearPlanes {
                epilogue: LinearEpilogue::RopeQkv,
                ..
            } => "linear_plane_rope_qkv_kernel",
            KernelSpec::Linear { .. } => "linear_kernel",
            KernelSpec::LinearPlanes { .. } => "linear_plane_kernel",
            KernelSpec::RmsNorm { .. } => "rms_norm_kernel",
            KernelSpec::Rope { .. } => "rope_kernel",
            KernelSpec::RopeAppend { .. } => "rope_append_kernel",
            KernelSpec::RopeQkvAppend { .. } => "rope_qkv_append_kernel",
            KernelSpec::HeadNorm { .. } => "head_norm_rope_kernel",
            KernelSpec::CopyRows { .. } => "copy_rows",
            KernelSpec::Attention { .. } => "fused_attention",
            KernelSpec::AttentionPlanes { .. } => "decode_attention",
            KernelSpec::AttentionCombine { .. } => "attention_combine",
            KernelSpec::Embedding { .. } => "embedding_kernel",
            KernelSpec::EmbeddingScaled { .. } => "embedding_scaled_kernel",
            KernelSpec::EmbeddingRows { .. } => "embedding_rows_kernel",
            KernelSpec::Elementwise { .. } => "elementwise_kernel",
            KernelSpec::LayerSum { .. } => "layer_sum_kernel",
        }
    }

    /// The entry point's name as the `#[cube(launch)]` macro builds it
    /// (`linear_kernel_f_f32_n_4`).
    pub fn entry_point(&self) -> String {
        let f = match self.dtype() {
            DType::F16 => "f16",
            DType::F32 | DType::U32 => "f32",
        };
        match self {
            KernelSpec::Rope { .. }
            | KernelSpec::RopeAppend { .. }
            | KernelSpec::RopeQkvAppend { .. }
            | KernelSpec::HeadNorm { .. } => {
                format!("{}_f_{f}", self.kernel_fn())
            }
            _ => format!("{}_f_{f}_n_{}", self.kernel_fn(), self.vector()),
        }
    }

    /// Units per cube of the launch.
    pub fn cube_units(&self) -> u32 {
        match self {
            KernelSpec::Linear { .. } => linear::BLOCK as u32,
            // 32-lane planes (the CUDA warp).
            KernelSpec::LinearPlanes { planes, .. } => 32 * *planes as u32,
            KernelSpec::RmsNorm { .. } => rms_norm::BLOCK as u32,
            KernelSpec::Rope { .. }
            | KernelSpec::RopeAppend { .. }
            | KernelSpec::RopeQkvAppend { .. } => rope::BLOCK as u32,
            KernelSpec::HeadNorm { .. } => head_norm::BLOCK as u32,
            KernelSpec::CopyRows { .. } => COPY_UNITS,
            KernelSpec::Attention { .. } => ATTENTION_UNITS,
            KernelSpec::AttentionPlanes { planes, .. } => 32 * *planes as u32,
            KernelSpec::AttentionCombine { .. } => 128,
            KernelSpec::Embedding { .. }
            | KernelSpec::EmbeddingScaled { .. }
            | KernelSpec::EmbeddingRows { .. } => embedding::BLOCK as u32,
            KernelSpec::Elementwise { .. } => elementwise::BLOCK as u32,
            KernelSpec::LayerSum { .. } => layer_sum::BLOCK as u32,
        }
    }

    /// Checks the dtype is a float type and the comptime values are ones the
    /// launch functions can pick.
    pub fn validate(&self) -> Result<()> {
        if !self.dtype().is_float() {
            return Err(OpsError::DTypeMismatch {
                op: OP,
                arg: "dtype",
                expected: DType::F32,
                found: self.dtype(),
            });
        }
        let bad = |reason: String| Err(OpsError::InvalidArgument { op: OP, reason });
        let widths: &[usize] = match self {
            KernelSpec::LinearPlanes { .. } => &[1, 2, 4, 8],
            _ => &[1, 2, 4],
        };
        if !widths.contains(&self.vector()) {
            return bad(format!(
                "vector width {} is not one of {widths:?}",
                self.vector()
            ));
        }
        match *self {
            KernelSpec::LinearPlanes {
                rows_per_block,
                cols,
                planes,
                ksplit,
                ..
            } if ![1, 2, 4, 8, 16].contains(&rows_per_block)
                || !(1..=2).contains(&cols)
                || planes == 0
                || ksplit == 0
                || planes % ksplit != 0 =>
            {
                bad(format!(
                    "plane layout mb={rows_per_block} cols={cols} planes={planes} ksplit={ksplit}"
                ))
            }
            KernelSpec::Linear { rows_per_block, .. }
                if ![1, 2, 4, 8].contains(&rows_per_block) =>
            {
                bad(format!(
                    "rows per block {rows_per_block} is not 1, 2, 4 or 8"
                ))
            }
            KernelSpec::Linear { cols, .. } if !crate::linear::UNIT_COLUMNS.contains(&cols) => {
                bad(format!(
                    "columns per unit {cols} is not one of {:?}",
                    crate::linear::UNIT_COLUMNS
                ))
            }
            KernelSpec::Attention {
                vector,
                head_dim_cap,
                ..
            } if !crate::attention::HEAD_DIM_CAPS.contains(&head_dim_cap)
                || head_dim_cap % vector != 0 =>
            {
                bad(format!(
                    "attention accumulator size {head_dim_cap} is not one of {:?}",
                    crate::attention::HEAD_DIM_CAPS
                ))
            }
            KernelSpec::Attention {
                vector,
                head_dim_cap,
                heads_per_unit,
                ..
            } if heads_per_unit == 0
                || (heads_per_unit > 1
                    && heads_per_unit * (head_dim_cap / vector)
                        > crate::attention::LANE_UNIT_VECTORS) =>
            {
                bad(format!(
                    "attention heads per unit {heads_per_unit} (accumulators of {head_dim_cap} \
                     in vectors of {vector}) is 0, or several holding more than {} vectors",
                    crate::attention::LANE_UNIT_VECTORS
                ))
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for KernelSpec {
    /// `linear_kernel<f32, N=4> mb=8 norm epilogue=residual`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}<{}", self.kernel_fn(), self.dtype())?;
        if !matches!(
            self,
            KernelSpec::Rope { .. }
                | KernelSpec::RopeAppend { .. }
                | KernelSpec::RopeQkvAppend { .. }
                | KernelSpec::HeadNorm { .. }
        ) {
            write!(f, ", N={}", self.vector())?;
        }
        write!(f, ">")?;
        match *self {
            KernelSpec::Linear {
                rows_per_block,
                cols,
                norm,
                epilogue,
                ..
            } => {
                write!(f, " mb={rows_per_block} cols={cols}")?;
                if norm {
                    write!(f, " norm")?;
                }
                write!(f, " epilogue={}", epilogue.name())
            }
            KernelSpec::LinearPlanes {
                rows_per_block,
                cols,
                planes,
                ksplit,
                norm,
                epilogue,
                ..
            } => {
                write!(
                    f,
                    " mb={rows_per_block} cols={cols} planes={planes} ksplit={ksplit}"
                )?;
                if norm {
                    write!(f, " norm")?;
                }
                write!(f, " epilogue={}", epilogue.name())
            }
            KernelSpec::Attention {
                mask,
                head_dim_cap,
                heads_per_unit,
                ..
            } => write!(
                f,
                " mask={} cap={head_dim_cap} heads={heads_per_unit}",
                mask.name()
            ),
            KernelSpec::AttentionPlanes {
                pv, planes, mask, ..
            } => write!(f, " pv={pv} planes={planes} mask={}", mask.name()),
            KernelSpec::Elementwise { op, .. } => write!(f, " op={}", op.name()),
            KernelSpec::HeadNorm { rope: true, .. } => write!(f, " rope"),
            KernelSpec::EmbeddingRows { scaled: true, .. } => write!(f, " scaled"),
            _ => Ok(()),
        }
    }
}
