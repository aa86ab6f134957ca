//! `draftc emit FILE --backend cuda|wgsl|torch`: the kernel source a plan
//! runs, or (`torch`) the graph as a PyTorch training module
//! ([`draftc_codegen::torch`]).
//!
//! The file is planned exactly as `draftc plan` plans it (same flags); each
//! launch's [`Kernel`] is mapped to the `draftc-ops` kernel instance it
//! launches ([`KernelSpec`]: family plus every comptime choice), identical
//! instances are merged, and each unique kernel is printed once, in
//! first-use order, with a header listing the plan launches that use it.
//! The text comes from CubeCL's own CUDA / WGSL compilers with no device
//! ([`draftc_ops::source`]) and is deterministic (`snapshots/sources/`).
//!
//! Limits: one kernel per launch, the one its family names; host-side
//! helper copies an executor may add (broadcast operands, layout moves)
//! are not listed.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use draftc_codegen::kernel::{ElementwiseOp, Epilogue, Prologue};
use draftc_codegen::{AttentionLayout, BufferClass, Kernel, LaunchId, Plan, PlanDType};
use draftc_ir::op::Mask;
use draftc_ops::source::{self, Backend, ElementwiseKind, KernelSpec, LinearEpilogue, MaskKind};
use draftc_ops::{DType, OpsError};

use super::plan::{build_plan, compile_graph, PlanOptions};
use crate::exec::LinearLaunch;

#[derive(Args)]
pub struct EmitArgs {
    /// A model or drafter file.
    pub file: PathBuf,
    /// Source language: cuda (CUDA C++), wgsl, or torch (a PyTorch module
    /// of the whole graph, for training: docs/training.md).
    #[arg(long, default_value = "cuda", value_name = "cuda|wgsl|torch")]
    pub backend: String,
    /// Emit the kernels of the unfused plan (every op its own launch).
    #[arg(long)]
    pub no_fuse: bool,
    #[command(flatten)]
    pub options: PlanOptions,
}

pub fn run(args: EmitArgs) -> ExitCode {
    let text = if args.backend == "torch" {
        // The graph (not the plan) as a PyTorch module.
        let Ok((graph, target)) = compile_graph(&args.file, &args.options) else {
            return ExitCode::FAILURE;
        };
        draftc_codegen::torch::torch_module(&graph, &target).map_err(|e| e.to_string())
    } else {
        let Some(backend) = Backend::parse(&args.backend) else {
            eprintln!(
                "error: `--backend {}`: expected cuda or wgsl (kernel source) or torch (training module)",
                args.backend
            );
            return ExitCode::FAILURE;
        };
        let Ok(plan) = build_plan(&args.file, &args.options, !args.no_fuse) else {
            return ExitCode::FAILURE;
        };
        emit(&plan, backend).map_err(|e| e.to_string())
    };
    match text {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}: {e}", args.file.display());
            ExitCode::FAILURE
        }
    }
}

/// Why a plan's source cannot be emitted.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    /// A launch's sizes do not fit the kernel it names.
    #[error("launch {launch} `{kernel}`: {reason}")]
    Launch {
        launch: LaunchId,
        kernel: String,
        reason: String,
    },
    /// The kernel library refused or failed to generate the source.
    #[error(transparent)]
    Source(#[from] OpsError),
}

/// One distinct kernel instance of a plan and the launches that run it
/// (indices into `plan.launches`, in plan order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UniqueKernel {
    pub spec: KernelSpec,
    pub launches: Vec<usize>,
}

/// The distinct kernel instances of `plan`, in first-use order.
pub fn unique_kernels(plan: &Plan) -> Result<Vec<UniqueKernel>, EmitError> {
    let mut out: Vec<UniqueKernel> = Vec::new();
    for (i, launch) in plan.launches.iter().enumerate() {
        let spec = kernel_spec(
            &launch.kernel,
            plan.config.dtype,
            plan.config.device.max_vector,
        )
        .map(|spec| match (&launch.kernel, launch.inputs.first()) {
            // RoPE on new cache rows runs fused with their append when the
            // attention reads the cache (`exec/attention.rs`).
            (Kernel::Rope { .. }, Some(&b)) if plan.buffer(b).class == BufferClass::State => {
                KernelSpec::rope_append(spec.dtype())
            }
            _ => spec,
        })
        .map_err(|reason| EmitError::Launch {
            launch: launch.id,
            kernel: launch.kernel.to_string(),
            reason,
        })?;
        match out.iter_mut().find(|u| u.spec == spec) {
            Some(u) => u.launches.push(i),
            None => out.push(UniqueKernel {
                spec,
                launches: vec![i],
            }),
        }
    }
    Ok(out)
}

/// The source of every distinct kernel of `plan` for `backend`, each after a
/// `//` header naming its instance and the launches (`#id part kernel`)
/// that use it.
pub fn emit(plan: &Plan, backend: Backend) -> Result<String, EmitError> {
    let kernels = unique_kernels(plan)?;
    let title = plan.to_string();
    let title = title.lines().next().unwrap_or_default();
    let mut out = String::new();
    let _ = writeln!(out, "// draftc emit --backend {backend}: {title}");
    let _ = writeln!(
        out,
        "// {} launches, {} distinct kernels (CubeCL {} compiler, unchecked launches)",
        plan.launches.len(),
        kernels.len(),
        match backend {
            Backend::Cuda => "CUDA C++",
            Backend::Wgsl => "WGSL",
        }
    );
    for (n, k) in kernels.iter().enumerate() {
        let text = source::source(&k.spec, backend)?;
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "// ---- kernel {}/{}: {}",
            n + 1,
            kernels.len(),
            k.spec
        );
        let _ = writeln!(
            out,
            "// entry point {}, {} units per cube; used by {} launch{}:",
            k.spec.entry_point(),
            k.spec.cube_units(),
            k.launches.len(),
            if k.launches.len() == 1 { "" } else { "es" }
        );
        for &i in &k.launches {
            let l = &plan.launches[i];
            let _ = if l.part.is_empty() {
                writeln!(out, "//   {} {}", l.id, l.kernel)
            } else {
                writeln!(out, "//   {} {} {}", l.id, l.part, l.kernel)
            };
        }
        let _ = writeln!(out);
        out.push_str(text.trim_end());
        out.push('\n');
    }
    Ok(out)
}

/// The `draftc-ops` kernel instance a launch of `kernel` runs at `dtype`
/// (the choices the ops launch function makes for these sizes).
pub fn kernel_spec(
    kernel: &Kernel,
    dtype: PlanDType,
    max_vector: usize,
) -> Result<KernelSpec, String> {
    let dt = match dtype {
        PlanDType::F32 => DType::F32,
        PlanDType::F16 => DType::F16,
    };
    let size = |what: &str, v: i64| -> Result<usize, String> {
        usize::try_from(v)
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| format!("{what} = {v} is not a positive size"))
    };
    let spec = match *kernel {
        Kernel::Linear {
            m,
            k,
            prologue,
            epilogue,
            layout,
            ..
        } => {
            let (m, k) = (size("m", m)?, size("k", k)?);
            let (norm, d, groups) = match prologue {
                Prologue::None => (false, k, 1),
                Prologue::RmsNorm { .. } => (true, k, 1),
                Prologue::GroupRmsNorm { groups, .. } => {
                    let groups = size("groups", groups)?;
                    if k % groups != 0 {
                        return Err(format!("k = {k} is not a multiple of {groups} groups"));
                    }
                    (true, k / groups, groups)
                }
            };
            let epilogue = match epilogue {
                Epilogue::None => LinearEpilogue::None,
                Epilogue::Bias => LinearEpilogue::Bias,
                Epilogue::Residual => LinearEpilogue::Residual,
                Epilogue::SwiGlu => LinearEpilogue::SwiGlu,
                Epilogue::GeGlu => LinearEpilogue::GeGlu,
                Epilogue::RopeQkv { .. } => LinearEpilogue::RopeQkv,
            };
            match crate::exec::linear_launch(layout) {
                LinearLaunch::Lanes { cols } => KernelSpec::linear(dt, m, d, norm, epilogue, cols),
                LinearLaunch::Planes(shape) => {
                    KernelSpec::linear_planes(dt, m, d, groups, norm, epilogue, shape, max_vector)
                }
            }
        }
        Kernel::RmsNorm { d, .. } | Kernel::GroupRmsNorm { d, .. } => {
            KernelSpec::rms_norm(dt, size("d", d)?)
        }
        Kernel::Rope { head_dim, .. } => {
            if size("head_dim", head_dim)? % 2 != 0 {
                return Err(format!("head_dim = {head_dim} is odd"));
            }
            KernelSpec::rope(dt)
        }
        Kernel::HeadNorm {
            head_dim, theta, ..
        } => {
            if theta.is_some() && size("head_dim", head_dim)? % 2 != 0 {
                return Err(format!("head_dim = {head_dim} is odd"));
            }
            KernelSpec::head_norm(dt, theta.is_some())
        }
        Kernel::RopeQkvAppend { head_dim, .. } => {
            if size("head_dim", head_dim)? % 2 != 0 {
                return Err(format!("head_dim = {head_dim} is odd"));
            }
            KernelSpec::rope_qkv_append(dt)
        }
        Kernel::KvAppend { width, .. } => KernelSpec::copy_rows(dt, size("width", width)?),
        Kernel::Attention {
            heads,
            kv_heads,
            head_dim,
            mask,
            layout,
            ..
        } => {
            let kind = match mask {
                Mask::Causal => MaskKind::Causal,
                Mask::Full => MaskKind::Full,
                Mask::CrossDiagonal => MaskKind::CrossDiagonal,
                Mask::InverseBlock { .. } => MaskKind::InverseBlock,
                Mask::SlidingWindow { .. } => MaskKind::SlidingSink,
                Mask::Tree => MaskKind::Tree,
            };
            match layout {
                AttentionLayout::Lanes => attention(dt, heads, kv_heads, head_dim, kind)?,
                AttentionLayout::Planes { plane, planes, .. } => KernelSpec::attention_planes(
                    dt,
                    size("head_dim", head_dim)?,
                    plane as usize,
                    planes as usize,
                    kind,
                ),
            }
        }
        Kernel::DraftDimAttention {
            heads,
            kv_heads,
            head_dim,
            ..
        } => attention(dt, heads, kv_heads, head_dim, MaskKind::Full)?,
        // A table above one binding is gathered in row chunks
        // (`ops::embedding`), by a kernel of its own.
        Kernel::Embedding {
            vocab, d, scale, ..
        } if size("vocab", vocab)? * size("d", d)? * dt.size()
            > draftc_ops::launch::MAX_BINDING_BYTES =>
        {
            KernelSpec::embedding_rows(dt, size("d", d)?, scale.is_some())
        }
        Kernel::Embedding { d, scale: None, .. } => KernelSpec::embedding(dt, size("d", d)?),
        Kernel::Embedding { d, .. } => KernelSpec::embedding_scaled(dt, size("d", d)?),
        Kernel::Elementwise { op, numel, .. } => {
            let op = match op {
                ElementwiseOp::Add => ElementwiseKind::Add,
                ElementwiseOp::Mul => ElementwiseKind::Mul,
                ElementwiseOp::Silu => ElementwiseKind::Silu,
                ElementwiseOp::SwiGlu => ElementwiseKind::SwiGlu,
                ElementwiseOp::GeGlu => ElementwiseKind::GeGlu,
            };
            KernelSpec::elementwise(dt, size("numel", numel)?, op)
        }
        Kernel::LayerSum { numel, .. } => KernelSpec::layer_sum(dt, size("numel", numel)?),
        Kernel::StridedCopy {
            block_len,
            src_stride,
            src_offset,
            dst_stride,
            dst_offset,
            ..
        } => {
            // Rows of the copy: the largest width dividing every block
            // boundary (a block copy is a row copy of that width).
            let row = [src_stride, src_offset, dst_stride, dst_offset]
                .into_iter()
                .fold(size("block_len", block_len)? as u64, |g, v| {
                    gcd(g, v.unsigned_abs())
                });
            KernelSpec::copy_rows(dt, row as usize)
        }
    };
    spec.validate().map_err(|e| e.to_string())?;
    Ok(spec)
}

fn attention(
    dtype: DType,
    heads: i64,
    kv_heads: i64,
    head_dim: i64,
    mask: MaskKind,
) -> Result<KernelSpec, String> {
    let group = match (usize::try_from(heads), usize::try_from(kv_heads)) {
        (Ok(h), Ok(kv)) if h >= 1 && kv >= 1 && h % kv == 0 => h / kv,
        _ => {
            return Err(format!(
                "heads = {heads} is not a multiple of kv_heads = {kv_heads}"
            ))
        }
    };
    match usize::try_from(head_dim) {
        Ok(hd) if (1..=draftc_ops::attention::MAX_HEAD_DIM).contains(&hd) => {
            Ok(KernelSpec::attention(dtype, hd, group, mask))
        }
        _ => Err(format!(
            "head_dim = {head_dim} is outside 1..={}",
            draftc_ops::attention::MAX_HEAD_DIM
        )),
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use draftc_ir::op::F64;

    /// codegen cannot see ops (it lowers without kernels), so it keeps its
    /// own copy of the lane layout's column variants and row blocks: they
    /// must be the kernel's, or a plan could name a variant ops rejects.
    #[test]
    fn codegen_lane_variants_are_the_kernels() {
        use draftc_codegen::device::{lane_rows_per_block, LANE_COLUMNS};
        let codegen: Vec<usize> = LANE_COLUMNS.iter().map(|&c| c as usize).collect();
        assert_eq!(codegen, draftc_ops::linear::UNIT_COLUMNS);
        for m in 1..=64 {
            assert_eq!(
                lane_rows_per_block(m as i64) as usize,
                source::linear_rows_per_block(m),
                "m = {m}"
            );
        }
    }

    #[test]
    fn linear_segment_and_blocks_follow_the_launch() {
        let k = Kernel::Linear {
            m: 16,
            k: 2304,
            n: 576,
            prologue: Prologue::GroupRmsNorm {
                groups: 4,
                eps: F64::new(1e-5),
            },
            epilogue: Epilogue::None,
            into_cache: false,
            parts: 1,
            layout: draftc_codegen::LinearLayout::Lanes { cols: 24 },
        };
        let spec = kernel_spec(&k, PlanDType::F16, 4).unwrap();
        assert_eq!(
            spec,
            KernelSpec::Linear {
                dtype: DType::F16,
                vector: 4,
                rows_per_block: 8,
                cols: 24,
                norm: true,
                epilogue: LinearEpilogue::None,
            }
        );
    }

    #[test]
    fn strided_copy_rows_divide_every_boundary() {
        let k = Kernel::StridedCopy {
            blocks: 16,
            block_len: 576,
            src_stride: 576,
            src_offset: 0,
            dst_stride: 2304,
            dst_offset: 1730,
        };
        assert_eq!(
            kernel_spec(&k, PlanDType::F32, 4).unwrap(),
            KernelSpec::CopyRows {
                dtype: DType::F32,
                vector: 2,
            }
        );
    }

    #[test]
    fn bad_sizes_are_errors_not_panics() {
        let bad = [
            Kernel::Attention {
                q_rows: 1,
                kv_rows: 1,
                keys: 1,
                heads: 1,
                kv_heads: 1,
                head_dim: 512,
                mask: Mask::Causal,
                layout: AttentionLayout::Lanes,
                scale: None,
            },
            Kernel::Embedding {
                tokens: 1,
                vocab: 1,
                d: 0,
                scale: None,
            },
            Kernel::HeadNorm {
                tokens: 1,
                heads: 1,
                head_dim: 63,
                eps: F64::new(1e-6),
                weight: draftc_ir::op::NormWeight::Plain,
                theta: Some(F64::new(1e4)),
            },
            Kernel::Rope {
                tokens: 1,
                heads: 1,
                head_dim: 63,
                theta: F64::new(1e4),
            },
        ];
        for k in bad {
            assert!(kernel_spec(&k, PlanDType::F32, 4).is_err(), "{k}");
        }
    }
}
