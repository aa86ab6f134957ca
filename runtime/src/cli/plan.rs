//! `draftc plan FILE`: the plan of fused kernel launches for a concrete
//! configuration (tokens, batch, context, dtype), with FLOPs and bytes
//! moved per launch and totals beside the unfused plan's; `--no-fuse`
//! prints the unfused plan. Target-owned weights (`target.embed`, …) are
//! named through the target family model's exports.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use draftc_codegen::{PlanConfig, PlanDType, TargetWeights};
use draftc_ir::{Resolver, TargetConfig};

use super::source::{compile_file, load_target, parse_sets, Compiled, DirResolver};

#[derive(Args)]
pub struct PlanArgs {
    /// A model or drafter file.
    pub file: PathBuf,
    /// Target preset: a name looked up next to the file or a path.
    #[arg(long, default_value = "smollm2-135m")]
    pub target: String,
    /// Plan every op as its own launch (no fusion).
    #[arg(long)]
    pub no_fuse: bool,
    /// Tokens per sequence in this pass (`t`).
    #[arg(long, default_value_t = 16)]
    pub tokens: i64,
    /// Sequences in the batch.
    #[arg(long, default_value_t = 1)]
    pub batch: i64,
    /// Tokens already in the KV caches and memory streams.
    #[arg(long, default_value_t = 0)]
    pub context: i64,
    /// Compute dtype of `float` values: f32 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Override an integer setting, e.g. `--set l=8`.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub sets: Vec<String>,
}

pub fn run(args: PlanArgs) -> ExitCode {
    let Some(dtype) = PlanDType::parse(&args.dtype) else {
        eprintln!("error: `--dtype {}`: expected f32 or f16", args.dtype);
        return ExitCode::FAILURE;
    };
    let Ok(sets) = parse_sets(&args.sets) else {
        return ExitCode::FAILURE;
    };
    let Ok((target, _)) = load_target(&args.target, Some(&args.file)) else {
        return ExitCode::FAILURE;
    };
    let graph = match compile_file(&args.file, &target, &sets) {
        Ok(Compiled::Graph(g)) => g,
        Ok(Compiled::Preset(cfg)) => {
            eprintln!(
                "error: {} is a preset; plan a model or drafter file (e.g. the family `{}`)",
                args.file.display(),
                cfg.family
            );
            return ExitCode::FAILURE;
        }
        Err(_) => return ExitCode::FAILURE,
    };
    let exports = if graph.meta.exports.is_empty() {
        family_exports(&args.file, &target)
    } else {
        graph.meta.exports.clone()
    };
    let config = PlanConfig {
        tokens: args.tokens,
        batch: args.batch,
        context: args.context,
        dtype,
        fuse: !args.no_fuse,
    };
    match draftc_codegen::plan(&graph, &TargetWeights::new(&target, &exports), &config) {
        Ok(plan) => {
            print!("{plan}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The target family model's weight exports (`embed`, `final_norm`,
/// `lm_head`); empty when the family file is not found or does not compile
/// (planning then reports the export it needs).
fn family_exports(file: &std::path::Path, target: &TargetConfig) -> BTreeMap<String, String> {
    let resolver = DirResolver::near(Some(file));
    let Some((_, src)) = resolver.resolve(&target.family) else {
        return BTreeMap::new();
    };
    draftc_ir::compile(&src, target, &BTreeMap::new(), &resolver)
        .map(|g| g.meta.exports)
        .unwrap_or_default()
}
