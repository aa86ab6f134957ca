//! Shared helpers for the workspace integration tests: the repository's
//! model files, compiled against the SmolLM2-135M preset
//! ([`draftc_ir::testing`], which every crate's tests share).

use draftc_ir::Graph;

pub use draftc_ir::testing::{graph_models, repo, smollm2, ModelsDir};

/// `models/<name>.draft` compiled against SmolLM2-135M.
pub fn compile_model(name: &str) -> Graph {
    draftc_ir::testing::compile_model(name, &smollm2(), &[])
}
