//! Shared helpers for the workspace integration tests: the repository's
//! model files, compiled against the SmolLM2-135M preset.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

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
    let src =
        std::fs::read_to_string(repo().join("models/smollm2-135m.draft")).expect("preset exists");
    draftc_ir::parse_preset(&src).expect("preset parses")
}

/// Names of the model and drafter files (not presets), sorted.
pub fn graph_models() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(repo().join("models"))
        .expect("models/ exists")
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

pub fn compile_model(name: &str) -> Graph {
    let src = std::fs::read_to_string(repo().join("models").join(format!("{name}.draft")))
        .expect("model exists");
    draftc_ir::compile(&src, &smollm2(), &BTreeMap::new(), &ModelsDir)
        .unwrap_or_else(|d| panic!("{name}: {d:?}"))
}
