//! Shared fixtures for the ir tests: a tiny target preset and a resolver
//! over the repository's `models/` files.

#![allow(dead_code)]

use std::collections::BTreeMap;

use draftc_ir::{Diagnostic, Graph, Resolver, TargetConfig};

pub const TINY_PRESET: &str =
    "preset tiny\nfamily llama\nn 4\nd 64\nh 4\nhkv 2\nf 128\nv 100\ntheta 10000.0\neps 1e-5\ntied_embeddings true\nrope_llama3 false\n";

pub fn tiny() -> TargetConfig {
    draftc_ir::parse_preset(TINY_PRESET).expect("tiny preset parses")
}

pub fn smollm2() -> TargetConfig {
    draftc_ir::parse_preset(include_str!("../../models/smollm2-135m.draft"))
        .expect("smollm2 preset parses")
}

/// The shipped model files by name.
pub const MODELS: &[(&str, &str)] = &[
    ("llama", include_str!("../../models/llama.draft")),
    ("specformer", include_str!("../../models/specformer.draft")),
    ("medusa", include_str!("../../models/medusa.draft")),
    ("beagle", include_str!("../../models/beagle.draft")),
    ("spire", include_str!("../../models/spire.draft")),
    ("magicdec", include_str!("../../models/magicdec.draft")),
    ("eagle", include_str!("../../models/eagle.draft")),
    ("eagle3", include_str!("../../models/eagle3.draft")),
    ("qwen2", include_str!("../../models/qwen2.draft")),
    ("qwen3", include_str!("../../models/qwen3.draft")),
];

pub struct Models;

impl Resolver for Models {
    fn resolve(&self, name: &str) -> Option<(String, String)> {
        MODELS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(n, s)| (format!("models/{n}.draft"), s.to_string()))
    }
}

pub fn compile(src: &str, cfg: &TargetConfig) -> Result<Graph, Vec<Diagnostic>> {
    draftc_ir::compile(src, cfg, &BTreeMap::new(), &Models)
}

/// `line:col message` of each diagnostic.
pub fn errors(src: &str) -> Vec<String> {
    match compile(src, &tiny()) {
        Ok(_) => Vec::new(),
        Err(diags) => diags
            .iter()
            .map(|d| format!("{} {}", loc(src, d), d.message))
            .collect(),
    }
}

pub fn loc(src: &str, d: &Diagnostic) -> String {
    let (l, c) = draftc_ir::span::line_col(src, d.span.start as usize);
    format!("{l}:{c}")
}
