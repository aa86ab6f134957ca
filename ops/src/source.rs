//! Kernel source text without a GPU: the CUDA C++ or WGSL that a launch of
//! one of this crate's kernels compiles to, produced by CubeCL's own
//! compilers (`cubecl-cpp`'s CUDA dialect, `cubecl-wgpu`'s WGSL compiler)
//! from a kernel definition built with no client and no device (cubecl
//! guide §3.2). `draftc emit` prints it; `snapshots/sources/` keeps it.
//!
//! A [`KernelSpec`] names a kernel family and every **comptime** choice its
//! launch function makes (storage dtype, vector width `N`, register block,
//! prologue/epilogue/mask/op codes, accumulator capacity); runtime scalars
//! (sizes, offsets, eps, mask windows) are kernel arguments and do not change
//! the source. The constructors ([`KernelSpec::linear`], [`KernelSpec::rms_norm`],
//! …) take the sizes a launch sees and make the same choices the launch
//! functions make, so the text is what that launch would JIT-compile (with
//! `ExecutionMode::Unchecked`, as the launches use `launch_unchecked`).
//!
//! Determinism (guide §3.5): WGSL is stable. CUDA is not as printed by
//! cubecl-cpp 0.10 (vector struct typedefs in `HashSet` order, `_tmp_N`
//! names from a process-global counter that `Display` also advances), so
//! every CUDA compile + print runs under one process-wide lock and the text
//! is normalised: `_tmp_N` renumbered by first appearance, `struct
//! __align__` blocks sorted. The result is identical across runs, threads
//! and processes.
//!
//! Limits: CUDA text uses `cubecl-cpp`'s default `CompilationOptions`
//! (warp 32, no grid constants / clusters / fast math); the CUDA runtime
//! derives those from the device, so a real launch may differ in those
//! details. Vector widths assume a device that allows 4 (wgpu and CUDA do).

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use cubecl::ir::{ContiguousElements, MatrixLayout, MmaProperties, TargetProperties};
use cubecl::prelude::*;
use cubecl::wgpu::{WgpuRuntime, WgslCompiler};
use cubecl::{Compiler, ExecutionMode, WgpuCompilationOptions};
use cubecl_cpp::cuda::mma::{contiguous_elements_cuda, CudaWmmaCompiler};
use cubecl_cpp::cuda::CudaDialect;
use cubecl_cpp::shared::CppCompiler;

use crate::attention::{fused_attention, Mask, MAX_HEAD_DIM};
use crate::error::{OpsError, Result};
use crate::kv::copy_rows;
use crate::tensor::DType;
use crate::{elementwise, embedding, layer_sum, linear, rms_norm, rope};

/// The CUDA compiler the `cubecl-cuda` runtime uses (`CudaCompiler` there),
/// taken from `cubecl-cpp` directly so no CUDA driver is involved.
type CudaSourceCompiler = CppCompiler<CudaDialect<CudaWmmaCompiler>>;

const OP: &str = "source";

/// Which source language to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// CUDA C++ (`extern "C" __global__ void ...`), as `cubecl-cuda` compiles it.
    Cuda,
    /// WGSL (`@compute fn ...`), as `cubecl-wgpu` compiles it.
    Wgsl,
}

impl Backend {
    /// `cuda` or `wgsl`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Wgsl => "wgsl",
        }
    }

    /// Parses `cuda` or `wgsl`.
    pub fn parse(s: &str) -> Option<Backend> {
        match s {
            "cuda" => Some(Backend::Cuda),
            "wgsl" => Some(Backend::Wgsl),
            _ => None,
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The epilogue code of [`crate::linear::linear_kernel`] (`Epilogue` in `linear`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinearEpilogue {
    None,
    Bias,
    Residual,
    SwiGlu,
}

impl LinearEpilogue {
    /// The kernel's comptime code (`EPI_*` in `linear.rs`).
    fn code(self) -> u32 {
        match self {
            LinearEpilogue::None => 0,
            LinearEpilogue::Bias => 1,
            LinearEpilogue::Residual => 2,
            LinearEpilogue::SwiGlu => 3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            LinearEpilogue::None => "none",
            LinearEpilogue::Bias => "bias",
            LinearEpilogue::Residual => "residual",
            LinearEpilogue::SwiGlu => "swiglu",
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
}

impl ElementwiseKind {
    /// The kernel's comptime code (`OP_*` in `elementwise.rs`).
    fn code(self) -> u32 {
        match self {
            ElementwiseKind::Add => 0,
            ElementwiseKind::Mul => 1,
            ElementwiseKind::SwiGlu => 2,
            ElementwiseKind::Silu => 3,
        }
    }

    fn name(self) -> &'static str {
        match self {
            ElementwiseKind::Add => "add",
            ElementwiseKind::Mul => "mul",
            ElementwiseKind::SwiGlu => "swiglu",
            ElementwiseKind::Silu => "silu",
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
}

impl MaskKind {
    /// A mask of this kind (parameters are irrelevant to the source).
    fn representative(self) -> Mask {
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
        }
    }

    fn name(self) -> &'static str {
        match self {
            MaskKind::Full => "full",
            MaskKind::Causal => "causal",
            MaskKind::CrossDiagonal => "cross_diagonal",
            MaskKind::InverseBlock => "inverse_block",
            MaskKind::SlidingSink => "sliding_sink",
            MaskKind::Tree => "tree",
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
        }
    }
}

/// One kernel instance: the family and every comptime parameter. Two launches
/// with equal specs run the same compiled kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelSpec {
    /// [`crate::linear::linear_kernel`]: `vector` = `N` (divides the norm
    /// segment / `in`), `rows_per_block` = `mb`, `norm` = RMS-norm prologue
    /// (plain or grouped: the group count is a runtime argument).
    Linear {
        dtype: DType,
        vector: usize,
        rows_per_block: usize,
        norm: bool,
        epilogue: LinearEpilogue,
    },
    /// [`crate::rms_norm::rms_norm_kernel`] (also grouped RMS norm).
    RmsNorm { dtype: DType, vector: usize },
    /// [`crate::rope::rope_kernel`] (scalar loads, no `N`).
    Rope { dtype: DType },
    /// The KV row-copy kernel of [`crate::kv`] (append, compaction, block copies).
    CopyRows { dtype: DType, vector: usize },
    /// The fused attention kernel ([`crate::attention`]); `head_dim_cap` is
    /// the per-unit accumulator size in scalars (64 or 256).
    Attention {
        dtype: DType,
        vector: usize,
        mask: MaskKind,
        head_dim_cap: usize,
    },
    /// [`crate::embedding::embedding_kernel`].
    Embedding { dtype: DType, vector: usize },
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
    [4usize, 2, 1]
        .into_iter()
        .find(|&w| n.is_multiple_of(w))
        .unwrap_or(1)
}

/// Rows per register block of `linear` for `m` rows (as `linear` picks it).
pub fn linear_rows_per_block(m: usize) -> usize {
    match m {
        1 => 1,
        2 => 2,
        3 | 4 => 4,
        _ => 8,
    }
}

/// Units per cube of the KV copy kernel (`kv.rs`).
const COPY_UNITS: u32 = 256;
/// Units per cube of the attention kernel (`attention/launch.rs`).
const ATTENTION_UNITS: u32 = 64;

impl KernelSpec {
    /// `linear` for `m` rows whose vectorised reduction segment is `d`
    /// scalars (`in` without a prologue or with RMS norm, the group size with
    /// grouped RMS norm).
    pub fn linear(
        dtype: DType,
        m: usize,
        d: usize,
        norm: bool,
        epilogue: LinearEpilogue,
    ) -> KernelSpec {
        KernelSpec::Linear {
            dtype,
            vector: vector_width(d),
            rows_per_block: linear_rows_per_block(m),
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

    /// Row copies of `width` scalars (KV append, stack/concat block copies).
    pub fn copy_rows(dtype: DType, width: usize) -> KernelSpec {
        KernelSpec::CopyRows {
            dtype,
            vector: vector_width(width),
        }
    }

    /// Fused attention with heads of `head_dim` under a mask of kind `mask`
    /// (draft-dim attention is `MaskKind::Full`).
    pub fn attention(dtype: DType, head_dim: usize, mask: MaskKind) -> KernelSpec {
        KernelSpec::Attention {
            dtype,
            vector: vector_width(head_dim),
            mask,
            head_dim_cap: if head_dim <= 64 { 64 } else { MAX_HEAD_DIM },
        }
    }

    /// Embedding gather of rows of `d`.
    pub fn embedding(dtype: DType, d: usize) -> KernelSpec {
        KernelSpec::Embedding {
            dtype,
            vector: vector_width(d),
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
            | KernelSpec::RmsNorm { dtype, .. }
            | KernelSpec::Rope { dtype }
            | KernelSpec::CopyRows { dtype, .. }
            | KernelSpec::Attention { dtype, .. }
            | KernelSpec::Embedding { dtype, .. }
            | KernelSpec::Elementwise { dtype, .. }
            | KernelSpec::LayerSum { dtype, .. } => dtype,
        }
    }

    /// The vector width `N` (1 for kernels without one).
    pub fn vector(&self) -> usize {
        match *self {
            KernelSpec::Rope { .. } => 1,
            KernelSpec::Linear { vector, .. }
            | KernelSpec::RmsNorm { vector, .. }
            | KernelSpec::CopyRows { vector, .. }
            | KernelSpec::Attention { vector, .. }
            | KernelSpec::Embedding { vector, .. }
            | KernelSpec::Elementwise { vector, .. }
            | KernelSpec::LayerSum { vector, .. } => vector,
        }
    }

    /// The `#[cube]` function's name.
    pub fn kernel_fn(&self) -> &'static str {
        match self {
            KernelSpec::Linear { .. } => "linear_kernel",
            KernelSpec::RmsNorm { .. } => "rms_norm_kernel",
            KernelSpec::Rope { .. } => "rope_kernel",
            KernelSpec::CopyRows { .. } => "copy_rows",
            KernelSpec::Attention { .. } => "fused_attention",
            KernelSpec::Embedding { .. } => "embedding_kernel",
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
            KernelSpec::Rope { .. } => format!("{}_f_{f}", self.kernel_fn()),
            _ => format!("{}_f_{f}_n_{}", self.kernel_fn(), self.vector()),
        }
    }

    /// Units per cube of the launch.
    pub fn cube_units(&self) -> u32 {
        match self {
            KernelSpec::Linear { .. } => linear::BLOCK as u32,
            KernelSpec::RmsNorm { .. } => rms_norm::BLOCK as u32,
            KernelSpec::Rope { .. } => rope::BLOCK as u32,
            KernelSpec::CopyRows { .. } => COPY_UNITS,
            KernelSpec::Attention { .. } => ATTENTION_UNITS,
            KernelSpec::Embedding { .. } => embedding::BLOCK as u32,
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
        if ![1, 2, 4].contains(&self.vector()) {
            return bad(format!("vector width {} is not 1, 2 or 4", self.vector()));
        }
        match *self {
            KernelSpec::Linear { rows_per_block, .. }
                if ![1, 2, 4, 8].contains(&rows_per_block) =>
            {
                bad(format!(
                    "rows per block {rows_per_block} is not 1, 2, 4 or 8"
                ))
            }
            KernelSpec::Attention {
                vector,
                head_dim_cap,
                ..
            } if ![64, MAX_HEAD_DIM].contains(&head_dim_cap) || head_dim_cap % vector != 0 => bad(
                format!("attention accumulator size {head_dim_cap} is not 64 or {MAX_HEAD_DIM}"),
            ),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for KernelSpec {
    /// `linear_kernel<f32, N=4> mb=8 norm epilogue=residual`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}<{}", self.kernel_fn(), self.dtype())?;
        if !matches!(self, KernelSpec::Rope { .. }) {
            write!(f, ", N={}", self.vector())?;
        }
        write!(f, ">")?;
        match *self {
            KernelSpec::Linear {
                rows_per_block,
                norm,
                epilogue,
                ..
            } => {
                write!(f, " mb={rows_per_block}")?;
                if norm {
                    write!(f, " norm")?;
                }
                write!(f, " epilogue={}", epilogue.name())
            }
            KernelSpec::Attention {
                mask, head_dim_cap, ..
            } => write!(f, " mask={} cap={head_dim_cap}", mask.name()),
            KernelSpec::Elementwise { op, .. } => write!(f, " op={}", op.name()),
            _ => Ok(()),
        }
    }
}

/// Serialises CUDA compile + print: cubecl-cpp numbers `_tmp_N` temporaries
/// from a process-global counter (guide §3.5).
static CODEGEN: Mutex<()> = Mutex::new(());

/// The source text of `spec` for `backend`: non-empty, deterministic (same
/// text on every call, thread and process).
pub fn source(spec: &KernelSpec, backend: Backend) -> Result<String> {
    spec.validate()?;
    let err = |e: String| OpsError::InvalidArgument {
        op: OP,
        reason: format!("{backend} compilation of {spec} failed: {e}"),
    };
    let addr = AddressType::U32.unsigned_type();
    match backend {
        Backend::Wgsl => {
            let def = definition(spec, WgpuRuntime::target_properties())?;
            let repr = WgslCompiler::default()
                .compile(
                    def,
                    &WgpuCompilationOptions::default(),
                    ExecutionMode::Unchecked,
                    addr,
                )
                .map_err(|e| err(format!("{e:?}")))?;
            Ok(sort_local_declarations(&repr.to_string()))
        }
        Backend::Cuda => {
            let raw = {
                let _guard = CODEGEN.lock().unwrap_or_else(|e| e.into_inner());
                let def = definition(spec, cuda_target_properties())?;
                let repr = CudaSourceCompiler::default()
                    .compile(def, &Default::default(), ExecutionMode::Unchecked, addr)
                    .map_err(|e| err(format!("{e:?}")))?;
                // Display exactly once per compile, still under the lock.
                repr.to_string()
            };
            Ok(normalize_cuda(&raw))
        }
    }
}

/// `CudaRuntime::target_properties()` of cubecl-cuda 0.10, rebuilt here so
/// that no CUDA runtime is needed.
fn cuda_target_properties() -> TargetProperties {
    TargetProperties {
        mma: MmaProperties {
            register_size_bits: 32,
            const_plane_size: 32,
            register_layout_a: MatrixLayout::RowMajor,
            register_layout_b: MatrixLayout::ColMajor,
            register_layout_acc: MatrixLayout::RowMajor,
            register_duplication_a: 1,
            register_duplication_b: 1,
            register_duplication_acc: 1,
            contiguous_elements: ContiguousElements::new(contiguous_elements_cuda),
        },
    }
}

/// The id `N` of a declaration of a mutable local without initialiser
/// (`float_4 l_mut_N;` in CUDA, `var l_mut_N: vec4<f32>;` in WGSL).
fn local_declaration_id(line: &str) -> Option<u64> {
    let body = line.strip_suffix(';')?;
    if body.contains(['=', '(', '[']) {
        return None;
    }
    let (head, rest) = body.split_once("l_mut_")?;
    let head = head.strip_prefix("var ").unwrap_or(head);
    let is_type = |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !(head.is_empty() || head.ends_with(' ') && is_type(head.trim_end())) {
        return None;
    }
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let tail = &rest[digits..];
    if !(tail.is_empty() || tail.starts_with(": ")) {
        return None;
    }
    rest[..digits].parse().ok()
}

/// Sorts each run of consecutive mutable-local declarations by id: both
/// compilers print them in `HashMap` order (declarations without an
/// initialiser, so their order has no meaning).
fn sort_local_declarations(src: &str) -> String {
    let lines: Vec<&str> = src.lines().collect();
    let mut out: Vec<&str> = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let mut run: Vec<(u64, &str)> = Vec::new();
        while let Some(id) = lines.get(i).and_then(|l| local_declaration_id(l)) {
            run.push((id, lines[i]));
            i += 1;
        }
        if run.is_empty() {
            out.push(lines[i]);
            i += 1;
        } else {
            run.sort();
            out.extend(run.into_iter().map(|(_, l)| l));
        }
    }
    let mut text = out.join("\n");
    text.push('\n');
    text
}

/// Renumbers `_tmp_N` by first appearance, sorts the `struct __align__`
/// vector typedef blocks (emitted in `HashSet` order, kept where the first
/// one was) and the mutable-local declarations.
pub fn normalize_cuda(src: &str) -> String {
    let mut map: HashMap<&str, usize> = HashMap::new();
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(pos) = rest.find("_tmp_") {
        out.push_str(&rest[..pos + 5]);
        rest = &rest[pos + 5..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 {
            let next = map.len();
            let id = *map.entry(&rest[..digits]).or_insert(next);
            out.push_str(&id.to_string());
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);

    let lines: Vec<&str> = out.lines().collect();
    let mut blocks: Vec<String> = Vec::new();
    let mut at = None;
    let mut result: Vec<String> = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        if lines[i].starts_with("struct __align__(") {
            let start = i;
            while i + 1 < lines.len() && !lines[i].starts_with("};") {
                i += 1;
            }
            blocks.push(lines[start..=i].join("\n"));
            at.get_or_insert(result.len());
        } else {
            result.push(lines[i].to_string());
        }
        i += 1;
    }
    blocks.sort();
    if let Some(at) = at {
        result.insert(at, blocks.join("\n"));
    }
    sort_local_declarations(&result.join("\n"))
}

/// A kernel definition for `spec`, built the way the `#[cube(launch)]`
/// macro's `define()` builds it, minus the client.
fn definition(spec: &KernelSpec, props: TargetProperties) -> Result<KernelDefinition> {
    crate::dispatch_float!(spec.dtype(), OP, F => { define::<F>(spec, props) })
}

fn array_in<C: CubePrimitive>(b: &mut KernelBuilder) -> NativeExpand<Array<C>> {
    <Array<C> as LaunchArg>::expand(&ArrayCompilationArg { inplace: None }, b)
}

fn array_out<C: CubePrimitive>(b: &mut KernelBuilder) -> NativeExpand<Array<C>> {
    <Array<C> as LaunchArg>::expand_output(&ArrayCompilationArg { inplace: None }, b)
}

fn scalar<T: LaunchArg<CompilationArg = ()>>(b: &mut KernelBuilder) -> <T as CubeType>::ExpandType {
    T::expand(&(), b)
}

/// Expands the kernel of `spec` with storage type `F`. Runtime arguments are
/// registered in declaration order (inputs and outputs as buffers, scalars in
/// the info block); comptime ones are passed by value.
fn define<F: Float + CubeElement>(spec: &KernelSpec, props: TargetProperties) -> KernelDefinition {
    let mut b = KernelBuilder::default();
    b.runtime_properties(props);
    let n = spec.vector();
    match *spec {
        KernelSpec::Linear {
            rows_per_block,
            norm,
            epilogue,
            ..
        } => {
            use linear::linear_kernel as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let x = array_in::<Vector<F, k::N>>(&mut b);
            let w = array_in::<Vector<F, k::N>>(&mut b);
            let w_up = array_in::<Vector<F, k::N>>(&mut b);
            let gamma = array_in::<Vector<F, k::N>>(&mut b);
            let extra = array_in::<F>(&mut b);
            let out = array_out::<F>(&mut b);
            let m = scalar::<usize>(&mut b);
            let in_v = scalar::<usize>(&mut b);
            let n_cols = scalar::<usize>(&mut b);
            let col_offset = scalar::<usize>(&mut b);
            let out_stride = scalar::<usize>(&mut b);
            let groups = scalar::<usize>(&mut b);
            let dv = scalar::<usize>(&mut b);
            let d = scalar::<usize>(&mut b);
            let eps = scalar::<f32>(&mut b);
            k::expand::<F, k::N>(
                &mut b.scope,
                n,
                x,
                w,
                w_up,
                gamma,
                extra,
                out,
                m,
                in_v,
                n_cols,
                col_offset,
                out_stride,
                groups,
                dv,
                d,
                eps,
                rows_per_block,
                norm,
                epilogue.code(),
            );
        }
        KernelSpec::RmsNorm { .. } => {
            use rms_norm::rms_norm_kernel as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let x = array_in::<Vector<F, k::N>>(&mut b);
            let w = array_in::<Vector<F, k::N>>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let segments = scalar::<usize>(&mut b);
            let groups = scalar::<usize>(&mut b);
            let dv = scalar::<usize>(&mut b);
            let d = scalar::<usize>(&mut b);
            let eps = scalar::<f32>(&mut b);
            k::expand::<F, k::N>(
                &mut b.scope,
                n,
                x,
                w,
                out,
                segments,
                groups,
                dv,
                d,
                eps,
                rms_norm::BLOCK,
            );
        }
        KernelSpec::Rope { .. } => {
            use rope::rope_kernel as k;
            AddressType::U32.register(&mut b.scope);
            let x = array_in::<F>(&mut b);
            let pos = array_in::<u32>(&mut b);
            let inv_freq = array_in::<f32>(&mut b);
            let out = array_out::<F>(&mut b);
            let pairs = scalar::<usize>(&mut b);
            let heads = scalar::<usize>(&mut b);
            let half = scalar::<usize>(&mut b);
            k::expand::<F>(&mut b.scope, x, pos, inv_freq, out, pairs, heads, half);
        }
        KernelSpec::CopyRows { .. } => {
            use copy_rows as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let src = array_in::<Vector<F, k::N>>(&mut b);
            let src_idx = array_in::<u32>(&mut b);
            let dst = array_out::<Vector<F, k::N>>(&mut b);
            let dst_idx = array_in::<u32>(&mut b);
            let rows = scalar::<u32>(&mut b);
            let layers = scalar::<u32>(&mut b);
            let src_rows = scalar::<u32>(&mut b);
            let dst_rows = scalar::<u32>(&mut b);
            let width_v = scalar::<u32>(&mut b);
            k::expand::<F, k::N>(
                &mut b.scope,
                n,
                src,
                src_idx,
                dst,
                dst_idx,
                rows,
                layers,
                src_rows,
                dst_rows,
                width_v,
            );
        }
        KernelSpec::Attention {
            mask, head_dim_cap, ..
        } => {
            use fused_attention as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let q = array_in::<Vector<F, k::N>>(&mut b);
            let kk = array_in::<Vector<F, k::N>>(&mut b);
            let v = array_in::<Vector<F, k::N>>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let meta = array_in::<u32>(&mut b);
            let k_pos = array_in::<u32>(&mut b);
            let anc = array_in::<u32>(&mut b);
            let row_offset = scalar::<u32>(&mut b);
            let rows = scalar::<u32>(&mut b);
            let heads = scalar::<u32>(&mut b);
            let group = scalar::<u32>(&mut b);
            let kv_heads = scalar::<u32>(&mut b);
            let hdv = scalar::<u32>(&mut b);
            let scale = scalar::<f32>(&mut b);
            let p0 = scalar::<u32>(&mut b);
            let p1 = scalar::<u32>(&mut b);
            let words = scalar::<u32>(&mut b);
            let (code, _, _) = mask.representative().kernel_args();
            let tree = mask == MaskKind::Tree;
            k::expand::<F, k::N>(
                &mut b.scope,
                n,
                q,
                kk,
                v,
                out,
                meta,
                k_pos,
                anc,
                row_offset,
                rows,
                heads,
                group,
                kv_heads,
                hdv,
                scale,
                p0,
                p1,
                words,
                code,
                tree,
                head_dim_cap / n,
            );
        }
        KernelSpec::Embedding { .. } => {
            use embedding::embedding_kernel as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let table = array_in::<Vector<F, k::N>>(&mut b);
            let ids = array_in::<u32>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let tokens = scalar::<usize>(&mut b);
            let vocab = scalar::<usize>(&mut b);
            let dv = scalar::<usize>(&mut b);
            k::expand::<F, k::N>(&mut b.scope, n, table, ids, out, tokens, vocab, dv);
        }
        KernelSpec::Elementwise { op, .. } => {
            use elementwise::elementwise_kernel as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let a = array_in::<Vector<F, k::N>>(&mut b);
            let bb = array_in::<Vector<F, k::N>>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let len_v = scalar::<usize>(&mut b);
            k::expand::<F, k::N>(&mut b.scope, n, a, bb, out, len_v, op.code());
        }
        KernelSpec::LayerSum { .. } => {
            use layer_sum::layer_sum_kernel as k;
            b.scope.register_size::<k::N>(n);
            AddressType::U32.register(&mut b.scope);
            let x = array_in::<Vector<F, k::N>>(&mut b);
            let w = array_in::<F>(&mut b);
            let out = array_out::<Vector<F, k::N>>(&mut b);
            let layers = scalar::<usize>(&mut b);
            let len_v = scalar::<usize>(&mut b);
            k::expand::<F, k::N>(&mut b.scope, n, x, w, out, layers, len_v);
        }
    }
    b.build(
        KernelSettings::default()
            .cube_dim(CubeDim::new_1d(spec.cube_units()))
            .kernel_name(spec.entry_point()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One spec per family (f32 and f16 where the family is vectorised).
    fn every_family() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        for dtype in [DType::F32, DType::F16] {
            v.extend([
                KernelSpec::linear(dtype, 16, 576, true, LinearEpilogue::Residual),
                KernelSpec::linear(dtype, 1, 6, false, LinearEpilogue::SwiGlu),
                KernelSpec::rms_norm(dtype, 576),
                KernelSpec::rope(dtype),
                KernelSpec::copy_rows(dtype, 192),
                KernelSpec::attention(dtype, 64, MaskKind::Tree),
                KernelSpec::attention(dtype, 130, MaskKind::SlidingSink),
                KernelSpec::embedding(dtype, 576),
                KernelSpec::elementwise(dtype, 1001, ElementwiseKind::Silu),
                KernelSpec::layer_sum(dtype, 576),
            ]);
        }
        v
    }

    #[test]
    fn every_family_emits_cuda_and_wgsl() {
        for spec in every_family() {
            let cuda = source(&spec, Backend::Cuda).unwrap();
            assert!(cuda.contains("__global__"), "{spec}\n{cuda}");
            assert!(cuda.contains(&spec.entry_point()), "{spec}\n{cuda}");
            let wgsl = source(&spec, Backend::Wgsl).unwrap();
            assert!(wgsl.contains("@compute"), "{spec}\n{wgsl}");
            assert!(wgsl.contains(&spec.entry_point()), "{spec}\n{wgsl}");
        }
    }

    #[test]
    fn emission_is_deterministic_within_a_thread() {
        for spec in every_family() {
            for backend in [Backend::Cuda, Backend::Wgsl] {
                let a = source(&spec, backend).unwrap();
                let b = source(&spec, backend).unwrap();
                assert_eq!(a, b, "{spec} {backend}");
            }
        }
    }

    #[test]
    fn emission_is_deterministic_across_threads() {
        let specs = every_family();
        let expected: Vec<String> = specs
            .iter()
            .map(|s| source(s, Backend::Cuda).unwrap())
            .collect();
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let specs = specs.clone();
                std::thread::spawn(move || {
                    // Different start points so compiles interleave.
                    let mut got = vec![String::new(); specs.len()];
                    for i in 0..specs.len() {
                        let j = (i + t * 3) % specs.len();
                        got[j] = source(&specs[j], Backend::Cuda).unwrap();
                        let _ = source(&specs[j], Backend::Wgsl).unwrap();
                    }
                    got
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), expected);
        }
    }

    #[test]
    fn comptime_choices_change_the_source_and_runtime_ones_do_not() {
        let a = KernelSpec::linear(DType::F32, 16, 576, true, LinearEpilogue::None);
        let b = KernelSpec::linear(DType::F32, 9, 64, true, LinearEpilogue::None);
        assert_eq!(a, b, "same mb, same N");
        let c = KernelSpec::linear(DType::F32, 16, 576, true, LinearEpilogue::Bias);
        assert_ne!(
            source(&a, Backend::Wgsl).unwrap(),
            source(&c, Backend::Wgsl).unwrap()
        );
        let f16 = KernelSpec::rms_norm(DType::F16, 576);
        assert!(source(&f16, Backend::Cuda).unwrap().contains("__half"));
        assert!(source(&f16, Backend::Wgsl).unwrap().contains("f16"));
    }

    #[test]
    fn invalid_specs_are_errors() {
        let bad = [
            KernelSpec::RmsNorm {
                dtype: DType::U32,
                vector: 4,
            },
            KernelSpec::Embedding {
                dtype: DType::F32,
                vector: 3,
            },
            KernelSpec::Linear {
                dtype: DType::F32,
                vector: 4,
                rows_per_block: 5,
                norm: false,
                epilogue: LinearEpilogue::None,
            },
            KernelSpec::Attention {
                dtype: DType::F32,
                vector: 4,
                mask: MaskKind::Full,
                head_dim_cap: 100,
            },
        ];
        for spec in bad {
            assert!(source(&spec, Backend::Wgsl).is_err(), "{spec}");
        }
    }

    #[test]
    fn normalizer_renumbers_and_sorts() {
        let a = "x\nstruct __align__(8) b {\n};\nstruct __align__(4) a {\n};\n_tmp_7 = _tmp_3 + _tmp_7;\n";
        let b = "x\nstruct __align__(4) a {\n};\nstruct __align__(8) b {\n};\n_tmp_1 = _tmp_9 + _tmp_1;\n";
        assert_eq!(normalize_cuda(a), normalize_cuda(b));
        assert!(normalize_cuda(a).contains("_tmp_0 = _tmp_1 + _tmp_0;"));
    }

    #[test]
    fn local_declarations_are_sorted() {
        let cuda = "x;\nfloat_4 l_mut_140;\nuint32 l_mut_52;\nconst uint32 l_0 = 1;\n";
        assert_eq!(
            sort_local_declarations(cuda),
            "x;\nuint32 l_mut_52;\nfloat_4 l_mut_140;\nconst uint32 l_0 = 1;\n"
        );
        let wgsl = "var l_mut_146: f32;\nvar l_mut_52: u32;\nlet l_0 = 1;\n";
        assert_eq!(
            sort_local_declarations(wgsl),
            "var l_mut_52: u32;\nvar l_mut_146: f32;\nlet l_0 = 1;\n"
        );
        for not_decl in [
            "l_mut_5 = l_6;",
            "var l_mut_5: u32 = u32(0);",
            "float l_arr_3[8];",
        ] {
            assert_eq!(local_declaration_id(not_decl), None, "{not_decl}");
        }
    }
}
