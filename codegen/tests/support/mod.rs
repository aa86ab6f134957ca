//! Shared test helpers: the repository's model files compiled against the
//! SmolLM2-135M preset, the target's exports, and planning with the
//! passes' invariants checked after each pass.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use draftc_codegen::pipeline::Trace;
use draftc_codegen::{PlanConfig, TargetWeights};
use draftc_ir::{Graph, Resolver, TargetConfig};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Resolves names to `models/<name>.draft`.
pub struct ModelsDir;

impl Resolver for ModelsDir {
    fn resolve(&self, name: &str) -> Option<(String, String)> {
        let p = repo().join("models").join(format!("{name}.draft"));
        Some((p.display().to_string(), std::fs::read_to_string(p).ok()?))
    }
}

pub fn smollm2() -> TargetConfig {
    let src = std::fs::read_to_string(repo().join("models/smollm2-135m.draft")).expect("preset");
    draftc_ir::parse_preset(&src).expect("preset parses")
}

pub fn compile_src(src: &str) -> Graph {
    draftc_ir::compile(src, &smollm2(), &BTreeMap::new(), &ModelsDir)
        .unwrap_or_else(|d| panic!("{d:?}"))
}

pub fn compile_model(name: &str) -> Graph {
    let src = std::fs::read_to_string(repo().join("models").join(format!("{name}.draft")))
        .expect("model exists");
    compile_src(&src)
}

/// The target's weight exports (from `llama.draft`).
pub fn target() -> TargetWeights {
    let llama = compile_model("llama");
    TargetWeights::new(&smollm2(), &llama.meta.exports)
}

/// Model and drafter files (not presets), sorted.
pub fn graph_models() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(repo().join("models"))
        .expect("models/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "draft"))
        .filter(|p| {
            !matches!(
                std::fs::read_to_string(p)
                    .ok()
                    .and_then(|s| draftc_ir::header(&s)),
                Some((draftc_ir::ItemKind::Preset, _))
            )
        })
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    v.sort();
    v
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
