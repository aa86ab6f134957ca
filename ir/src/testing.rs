//! What the workspace's tests share about the repository (for tests, not
//! for the product): its root, its model files (`models/*.draft`, and a
//! [`Resolver`] that finds them), the SmolLM2-135M preset they compile
//! against, and the tiny target configuration the runtime's tests run
//! (d = 32, 2 layers, vocabulary 97). Each crate's test support adds its
//! own layer on top (codegen: checked plans; runtime: a tiny model with
//! weights).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::{Graph, ItemKind, Resolver, TargetConfig};

/// The repository's root (this crate's parent directory).
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

/// The default target preset as it ships (`models/smollm2-135m.draft`),
/// plus the settings Gemma 3's model file reads ([`gemma_settings`]), so
/// every model file in `models/` compiles against one preset.
pub fn smollm2() -> TargetConfig {
    let src = std::fs::read_to_string(repo().join("models/smollm2-135m.draft"))
        .expect("models/smollm2-135m.draft exists");
    let mut cfg = crate::parse_preset(&src).expect("the preset parses");
    gemma_settings(&mut cfg);
    cfg
}

/// What `models/gemma3.draft` reads beyond a Llama preset, chosen so a test
/// sees each of them act: an embedding scale, a local RoPE base, a scores'
/// scale other than 1/√hd, a window of 4 keys, and layers 0–4 of every 6
/// sliding (Gemma 3's pattern), for up to 64 layers.
pub fn gemma_settings(cfg: &mut TargetConfig) {
    cfg.floats.insert("embed_scale".into(), 3.0);
    cfg.floats.insert("local_theta".into(), 10_000.0);
    cfg.floats.insert("attn_scale".into(), 0.1);
    cfg.ints.insert("window".into(), 4);
    for i in 0..64 {
        cfg.flags.insert(format!("sliding[{i}]"), (i + 1) % 6 != 0);
    }
}

/// SmolLM2's preset shrunk to a tiny target: 2 layers, d = 32, 4 heads
/// over 2 KV heads, f = 48, vocabulary 97.
pub fn tiny() -> TargetConfig {
    let mut cfg = smollm2();
    for (k, v) in [
        ("n", 2),
        ("d", 32),
        ("h", 4),
        ("hkv", 2),
        ("f", 48),
        ("v", 97),
    ] {
        cfg.ints.insert(k.into(), v);
    }
    cfg
}

/// Source text `src` compiled against `cfg`, with symbol or setting
/// overrides (`l`, `draft_vocab`); panics with the diagnostics.
pub fn compile_src(src: &str, cfg: &TargetConfig, overrides: &[(&str, i64)]) -> Graph {
    let o: BTreeMap<String, i64> = overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    crate::compile(src, cfg, &o, &ModelsDir).unwrap_or_else(|d| panic!("{d:?}"))
}

/// `models/<name>.draft` compiled against `cfg` (see [`compile_src`]).
pub fn compile_model(name: &str, cfg: &TargetConfig, overrides: &[(&str, i64)]) -> Graph {
    let path = repo().join("models").join(format!("{name}.draft"));
    let src = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    compile_src(&src, cfg, overrides)
}

/// Names of the model and drafter files in `models/` (not presets), sorted.
pub fn graph_models() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(repo().join("models"))
        .expect("models/ exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "draft"))
        .filter(|p| {
            !matches!(
                std::fs::read_to_string(p)
                    .ok()
                    .and_then(|s| crate::header(&s)),
                Some((ItemKind::Preset, _))
            )
        })
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    v.sort();
    v
}
