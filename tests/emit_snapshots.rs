//! `draftc emit` output — the CUDA C++ and WGSL of every distinct kernel a
//! model's fused plan launches — for every model in `models/` (SmolLM2-135M
//! preset, t = 16, batch 1, context 0, f32: the configuration of
//! `snapshots/plans/`), as insta snapshots `snapshots/sources/<model>.<backend>.snap`.
//! A diff here means the kernels, the plan's kernel choices or cubecl
//! changed: review it like code.

use draftc_codegen::{DeviceProfile, Plan, PlanConfig, PlanDType, TargetWeights};
use draftc_ops::source::{Backend, KernelSpec};
use draftc_runtime::cli::emit::{emit, unique_kernels};
use draftc_tests::{compile_model, graph_models, repo, smollm2};

const BACKENDS: [Backend; 2] = [Backend::Cuda, Backend::Wgsl];

/// The target's weight exports (from `llama.draft`).
fn target() -> TargetWeights {
    TargetWeights::new(&smollm2(), &compile_model("llama").meta.exports)
}

/// `models/<name>.draft` planned fused for `device`: batch 1, context 0,
/// `tokens` per sequence, in `dtype`.
fn fused_plan(name: &str, tokens: i64, dtype: PlanDType, device: DeviceProfile) -> Plan {
    let config = PlanConfig {
        tokens,
        batch: 1,
        context: 0,
        dtype,
        fuse: true,
        device,
    };
    draftc_codegen::plan(&compile_model(name), &target(), &config)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The fused plan of `name`, configured like `snapshots/plans/`.
fn plan(name: &str) -> Plan {
    fused_plan(name, 16, PlanDType::F32, DeviceProfile::default())
}

#[test]
fn kernel_source_of_every_model() {
    let models = graph_models();
    assert!(models.len() >= 6, "{models:?}");
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(repo().join("snapshots/sources"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        for name in &models {
            let plan = plan(name);
            for backend in BACKENDS {
                let text = emit(&plan, backend).unwrap_or_else(|e| panic!("{name}: {e}"));
                insta::assert_snapshot!(format!("{name}.{backend}"), text);
            }
        }
    });
}

/// SmolLM2's decode step (t = 1, f16) planned for a GPU profile.
fn gpu_decode_plan(device: DeviceProfile) -> Plan {
    fused_plan("llama", 1, PlanDType::F16, device)
}

/// The GPU kernel family: SmolLM2's decode step planned for an H100
/// (`snapshots/plans/llama.decode.cuda.snap`: which layout each linear
/// gets) and the source of its GPU-layout kernels, CUDA for the H100 and
/// WGSL for a Vulkan / Metal GPU (`snapshots/sources/llama.decode.gpu.*`).
/// The other kernels are the lavapipe family's, snapshotted above.
#[test]
fn gpu_kernel_family_of_the_decode_step() {
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    let cuda = gpu_decode_plan(DeviceProfile::cuda_h100());
    settings.set_snapshot_path(repo().join("snapshots/plans"));
    settings.bind(|| insta::assert_snapshot!("llama.decode.cuda", cuda.to_string()));
    settings.set_snapshot_path(repo().join("snapshots/sources"));
    for (backend, plan) in [
        (Backend::Cuda, cuda.clone()),
        (Backend::Wgsl, gpu_decode_plan(DeviceProfile::wgpu_gpu())),
    ] {
        let mut text = String::new();
        for k in unique_kernels(&plan).expect("maps") {
            if matches!(
                k.spec,
                KernelSpec::LinearPlanes { .. } | KernelSpec::AttentionPlanes { .. }
            ) {
                let ids: Vec<String> = k
                    .launches
                    .iter()
                    .map(|&i| plan.launches[i].id.to_string())
                    .collect();
                text += &format!("// {} — launches {}\n", k.spec, ids.join(", "));
                text += &draftc_ops::source::source(&k.spec, backend).expect("emits");
                text += "\n";
            }
        }
        // The split merge runs when a context spans several key chunks.
        let dtype = draftc_ops::DType::F16;
        let combine = KernelSpec::AttentionCombine { dtype, vector: 2 };
        text += &format!("// {combine} — after split attention launches\n");
        text += &draftc_ops::source::source(&combine, backend).expect("emits");
        assert!(text.contains("linear_plane_kernel"), "{backend}");
        assert!(text.contains("decode_attention"), "{backend}");
        settings.bind(|| insta::assert_snapshot!(format!("llama.decode.gpu.{backend}"), text));
    }
    // Every linear and attention of the GPU plan has a plane layout;
    // lavapipe keeps none.
    let linears = |p: &Plan| {
        p.launches
            .iter()
            .filter(|l| l.kernel.to_string().contains(" planes("))
            .count()
    };
    // q/k/v (one linear over the stacked weights), o, gate·up, down and
    // attention per layer, and the LM head.
    assert_eq!(linears(&cuda), 30 * 5 + 1);
    assert_eq!(linears(&plan("llama")), 0);
}

#[test]
fn every_unique_kernel_is_printed_once_with_its_launches() {
    for name in graph_models() {
        let plan = plan(&name);
        let kernels = unique_kernels(&plan).expect("maps");
        let launches: usize = kernels.iter().map(|k| k.launches.len()).sum();
        assert_eq!(launches, plan.launches.len(), "{name}: every launch once");
        for (i, a) in kernels.iter().enumerate() {
            assert!(kernels[i + 1..].iter().all(|b| b.spec != a.spec), "{name}");
        }
        let firsts: Vec<usize> = kernels.iter().map(|k| k.launches[0]).collect();
        assert!(
            firsts.windows(2).all(|w| w[0] < w[1]),
            "{name}: first-use order"
        );
        for backend in BACKENDS {
            let text = emit(&plan, backend).expect("emits");
            let marker = match backend {
                Backend::Cuda => "__global__",
                Backend::Wgsl => "@compute",
            };
            assert_eq!(
                text.matches(marker).count(),
                kernels.len(),
                "{name} {backend}"
            );
            for l in &plan.launches {
                assert!(
                    text.contains(&format!("//   {} ", l.id)),
                    "{name}: {}",
                    l.id
                );
            }
        }
    }
}

#[test]
fn emission_is_deterministic() {
    for name in graph_models() {
        let a = plan(&name);
        let b = plan(&name);
        for backend in BACKENDS {
            assert_eq!(
                emit(&a, backend).expect("emits"),
                emit(&b, backend).expect("emits"),
                "{name} {backend}"
            );
        }
    }
}

#[test]
fn emission_is_deterministic_across_threads() {
    let name = "specformer";
    let expected = emit(&plan(name), Backend::Cuda).expect("emits");
    let threads: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(move || emit(&plan(name), Backend::Cuda).expect("emits")))
        .collect();
    for t in threads {
        assert_eq!(t.join().expect("no panic"), expected);
    }
}

/// The emitted CUDA C++ of every model, f32 and f16, compiles with NVRTC
/// (`tools/nvrtc_check.py`; NVRTC comes from PyPI into a virtualenv under
/// `target/`, so no GPU or CUDA toolkit is needed). Slow and downloads:
/// `cargo test -p draftc-tests --test emit_snapshots -- --ignored`.
#[test]
#[ignore = "downloads NVRTC from PyPI (~100 MB); run with --ignored"]
fn emitted_cuda_compiles_with_nvrtc() {
    use std::process::Command;
    let venv = repo().join("target/nvrtc-venv");
    let python = venv.join("bin/python");
    if !python.exists() {
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .expect("python3 runs");
        assert!(ok.success(), "python3 -m venv failed");
        let ok = Command::new(&python)
            .args(["-m", "pip", "install", "-q"])
            .args(["nvidia-cuda-nvrtc-cu12", "nvidia-cuda-runtime-cu12"])
            .status()
            .expect("pip runs");
        assert!(ok.success(), "pip install of NVRTC failed");
    }
    let dir = std::env::temp_dir().join(format!("draftc-nvrtc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut files = Vec::new();
    // The GPU kernel family (plane layouts, 16-byte f16 vectors).
    for (i, device) in [DeviceProfile::cuda_h100(), DeviceProfile::wgpu_gpu()]
        .into_iter()
        .enumerate()
    {
        let path = dir.join(format!("llama.decode.gpu{i}.cu"));
        let text = emit(&gpu_decode_plan(device), Backend::Cuda).expect("emits");
        std::fs::write(&path, text).expect("write");
        files.push(path);
    }
    // The split merge of the GPU attention (not a plan launch of its own).
    for (dtype, vector) in [(draftc_ops::DType::F16, 2), (draftc_ops::DType::F32, 4)] {
        let spec = KernelSpec::AttentionCombine { dtype, vector };
        let path = dir.join(format!("attention_combine.{dtype}.cu"));
        let text = draftc_ops::source::source(&spec, Backend::Cuda).expect("emits");
        std::fs::write(&path, text).expect("write");
        files.push(path);
    }
    for name in graph_models() {
        for dtype in [PlanDType::F32, PlanDType::F16] {
            let plan = fused_plan(&name, 16, dtype, DeviceProfile::default());
            let path = dir.join(format!("{name}.{}.cu", dtype.name()));
            std::fs::write(&path, emit(&plan, Backend::Cuda).expect("emits")).expect("write");
            files.push(path);
        }
    }
    let out = Command::new(&python)
        .arg(repo().join("tools/nvrtc_check.py"))
        .args(&files)
        .args(["--arch", "compute_80"])
        .output()
        .expect("nvrtc_check runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `draftc emit --backend torch`: the PyTorch training module of every
/// model with weights of its own (self-speculation has none and is
/// refused), as `snapshots/torch/<model>.snap`. A diff means the graph or
/// the emitter changed what training computes: review it like code.
#[test]
fn torch_module_of_every_trainable_model() {
    let target = target();
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(repo().join("snapshots/torch"));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        for name in graph_models() {
            let graph = compile_model(&name);
            match draftc_codegen::torch::torch_module(&graph, &target) {
                Ok(text) => insta::assert_snapshot!(name.clone(), text),
                Err(e) => assert!(
                    graph.meta.drafter_kind == Some(draftc_ir::graph::DrafterKind::SelfSpeculative),
                    "{name}: {e}"
                ),
            }
        }
    });
}
