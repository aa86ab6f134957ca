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
//! and processes. A kernel with two shared arrays is not: cubecl-cpp lays
//! them out (offsets included) in hash order, so every kernel a
//! [`KernelSpec`] names keeps its shared memory in one array.
//!
//! Limits: CUDA text uses `cubecl-cpp`'s default `CompilationOptions`
//! (warp 32, no grid constants / clusters / fast math); the CUDA runtime
//! derives those from the device, so a real launch may differ in those
//! details. Vector widths assume a device that allows 4 (wgpu and CUDA do).

mod define;
mod spec;

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

use crate::attention::{fused_attention, Mask};
use crate::error::{OpsError, Result};
use crate::kv::copy_rows;
use crate::tensor::DType;
use crate::{elementwise, embedding, head_norm, layer_sum, linear, rms_norm, rope};

use define::definition;
pub use spec::{
    linear_rows_per_block, vector_width, ElementwiseKind, KernelSpec, LinearEpilogue, MaskKind,
};

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

#[cfg(test)]
mod tests {
    use super::*;

    /// One spec per family (f32 and f16 where the family is vectorised).
    fn every_family() -> Vec<KernelSpec> {
        let mut v = Vec::new();
        for dtype in [DType::F32, DType::F16] {
            v.extend([
                KernelSpec::linear(dtype, 16, 576, true, LinearEpilogue::Residual, 8),
                KernelSpec::linear(dtype, 2, 576, false, LinearEpilogue::None, 16),
                KernelSpec::linear(dtype, 1, 6, false, LinearEpilogue::SwiGlu, 12),
                KernelSpec::linear_planes(
                    dtype,
                    1,
                    576,
                    1,
                    true,
                    LinearEpilogue::SwiGlu,
                    crate::linear_plane::PlaneShape {
                        plane: 32,
                        planes: 4,
                        ksplit: 1,
                        cols: 2,
                    },
                    8,
                ),
                KernelSpec::linear_planes(
                    dtype,
                    16,
                    1536,
                    1,
                    false,
                    LinearEpilogue::Residual,
                    crate::linear_plane::PlaneShape {
                        plane: 32,
                        planes: 4,
                        ksplit: 4,
                        cols: 1,
                    },
                    4,
                ),
                KernelSpec::linear(dtype, 1, 576, true, LinearEpilogue::RopeQkv, 16),
                KernelSpec::linear_planes(
                    dtype,
                    1,
                    576,
                    1,
                    true,
                    LinearEpilogue::RopeQkv,
                    crate::linear_plane::PlaneShape {
                        plane: 32,
                        planes: 4,
                        ksplit: 1,
                        cols: 1,
                    },
                    8,
                ),
                KernelSpec::rms_norm(dtype, 576),
                KernelSpec::rope(dtype),
                KernelSpec::rope_append(dtype),
                KernelSpec::rope_qkv_append(dtype),
                KernelSpec::copy_rows(dtype, 192),
                KernelSpec::attention(dtype, 64, 3, MaskKind::Tree),
                KernelSpec::attention(dtype, 130, 1, MaskKind::SlidingSink),
                KernelSpec::embedding(dtype, 576),
                KernelSpec::embedding_scaled(dtype, 640),
                KernelSpec::embedding_rows(dtype, 640, true),
                KernelSpec::embedding_rows(dtype, 576, false),
                KernelSpec::head_norm(dtype, true),
                KernelSpec::head_norm(dtype, false),
                KernelSpec::linear(dtype, 1, 640, true, LinearEpilogue::GeGlu, 12),
                KernelSpec::linear_planes(
                    dtype,
                    1,
                    640,
                    1,
                    true,
                    LinearEpilogue::GeGlu,
                    crate::linear_plane::PlaneShape {
                        plane: 32,
                        planes: 4,
                        ksplit: 1,
                        cols: 2,
                    },
                    8,
                ),
                KernelSpec::elementwise(dtype, 1001, ElementwiseKind::GeGlu),
                KernelSpec::elementwise(dtype, 1001, ElementwiseKind::Silu),
                KernelSpec::layer_sum(dtype, 576),
            ]);
        }
        v
    }

    /// The specs' comptime codes are the kernels' own.
    #[test]
    fn spec_codes_are_the_kernels_codes() {
        use crate::{elementwise as e, linear as l};
        for (spec, kernel) in [
            (LinearEpilogue::None, l::EPI_NONE),
            (LinearEpilogue::Bias, l::EPI_BIAS),
            (LinearEpilogue::Residual, l::EPI_RESIDUAL),
            (LinearEpilogue::SwiGlu, l::EPI_SWIGLU),
            (LinearEpilogue::GeGlu, l::EPI_GEGLU),
        ] {
            assert_eq!(spec.code(), kernel, "{spec:?}");
        }
        for (spec, kernel) in [
            (ElementwiseKind::Add, e::OP_ADD),
            (ElementwiseKind::Mul, e::OP_MUL),
            (ElementwiseKind::SwiGlu, e::OP_SWIGLU),
            (ElementwiseKind::Silu, e::OP_SILU),
            (ElementwiseKind::GeGlu, e::OP_GEGLU),
        ] {
            assert_eq!(spec.code(), kernel, "{spec:?}");
        }
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
        let a = KernelSpec::linear(DType::F32, 16, 576, true, LinearEpilogue::None, 8);
        let b = KernelSpec::linear(DType::F32, 9, 64, true, LinearEpilogue::None, 8);
        assert_eq!(a, b, "same mb, same N");
        let c = KernelSpec::linear(DType::F32, 16, 576, true, LinearEpilogue::Bias, 8);
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
                cols: 8,
                norm: false,
                epilogue: LinearEpilogue::None,
            },
            KernelSpec::Linear {
                dtype: DType::F32,
                vector: 4,
                rows_per_block: 4,
                cols: 7,
                norm: false,
                epilogue: LinearEpilogue::None,
            },
            KernelSpec::Attention {
                dtype: DType::F32,
                vector: 4,
                mask: MaskKind::Full,
                head_dim_cap: 100,
                heads_per_unit: 1,
            },
            KernelSpec::Attention {
                dtype: DType::F32,
                vector: 4,
                mask: MaskKind::Full,
                head_dim_cap: 256,
                heads_per_unit: 2,
            },
            KernelSpec::Attention {
                dtype: DType::F32,
                vector: 4,
                mask: MaskKind::Full,
                head_dim_cap: 64,
                heads_per_unit: 0,
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
