//! Shared test helpers: the repository's model files compiled against the
//! SmolLM2-135M preset, the target's exports, and planning with the
//! passes' invariants checked after each pass.

#![allow(dead_code)]

use draftc_codegen::pipeline::Trace;
use draftc_codegen::{PlanConfig, TargetWeights};
use draftc_ir::Graph;

#[allow(unused_imports)]
pub use draftc_ir::testing::{graph_models, repo, smollm2};

/// Source text compiled against SmolLM2-135M.
pub fn compile_src(src: &str) -> Graph {
    draftc_ir::testing::compile_src(src, &smollm2(), &[])
}

/// `models/<name>.draft` compiled against SmolLM2-135M.
pub fn compile_model(name: &str) -> Graph {
    draftc_ir::testing::compile_model(name, &smollm2(), &[])
}

/// The target's weight exports (from `llama.draft`).
pub fn target() -> TargetWeights {
    let llama = compile_model("llama");
    TargetWeights::new(&smollm2(), &llama.meta.exports)
}

/// Every pass run, every invariant checked after the pass that must keep it.
pub fn checked_trace(g: &Graph, cfg: &PlanConfig) -> Trace {
    draftc_ir::verify::verify(g).expect("input graph verifies");
    let tr = draftc_codegen::trace(g, &target(), cfg).expect("plans");
    draftc_ir::verify::verify(&tr.canonical).expect("canonicalize keeps the graph valid");
    draftc_codegen::check::groups(&tr.canonical, &tr.groups).expect("fuse partitions the graph");
    draftc_codegen::check::plan(&tr.plan).expect("schedule keeps live buffers apart");
    tr
}

pub fn small(fuse: bool) -> PlanConfig {
    PlanConfig {
        tokens: 16,
        batch: 1,
        context: 0,
        dtype: draftc_codegen::PlanDType::F32,
        fuse,
        ..Default::default()
    }
}
