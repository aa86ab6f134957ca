//! `draftc emit` output — the CUDA C++ and WGSL of every distinct kernel a
//! model's fused plan launches — for every model in `models/` (SmolLM2-135M
//! preset, t = 16, batch 1, context 0, f32: the configuration of
//! `snapshots/plans/`), as insta snapshots `snapshots/sources/<model>.<backend>.snap`.
//! A diff here means the kernels, the plan's kernel choices or cubecl
//! changed: review it like code.

use draftc_codegen::{Plan, PlanConfig, PlanDType, TargetWeights};
use draftc_ops::source::Backend;
use draftc_runtime::cli::emit::{emit, unique_kernels};
use draftc_tests::{compile_model, graph_models, repo, smollm2};

const BACKENDS: [Backend; 2] = [Backend::Cuda, Backend::Wgsl];

/// The fused plan of `name`, configured like `snapshots/plans/`.
fn plan(name: &str) -> Plan {
    let llama = compile_model("llama");
    let target = TargetWeights::new(&smollm2(), &llama.meta.exports);
    let config = PlanConfig {
        tokens: 16,
        batch: 1,
        context: 0,
        dtype: PlanDType::F32,
        fuse: true,
    };
    draftc_codegen::plan(&compile_model(name), &target, &config)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
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
