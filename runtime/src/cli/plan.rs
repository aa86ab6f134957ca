//! `draftc plan FILE`: the plan of fused kernel launches for a concrete
//! configuration (tokens, batch, context, dtype), with FLOPs and bytes
//! moved per launch and totals beside the unfused plan's; `--no-fuse`
//! prints the unfused plan. Target-owned weights (`target.embed`, …) are
//! named through the target family model's exports.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use draftc_codegen::{DeviceProfile, Plan, PlanConfig, PlanDType, TargetWeights};
use draftc_ir::graph::Graph;
use draftc_ir::{Resolver, TargetConfig};

use super::source::{compile_file, load_target, parse_sets, Compiled, DirResolver, Reported};

#[derive(Args)]
pub struct PlanArgs {
    /// A model or drafter file.
    pub file: PathBuf,
    /// Plan every op as its own launch (no fusion).
    #[arg(long)]
    pub no_fuse: bool,
    #[command(flatten)]
    pub options: PlanOptions,
}

/// The configuration to plan for, shared by `draftc plan` and `draftc emit`.
#[derive(Args)]
pub struct PlanOptions {
    /// Target preset: a name looked up next to the file or a path, or a
    /// converted checkpoint directory (its `config.json`, as the runtime
    /// reads it).
    #[arg(long, default_value = "smollm2-135m")]
    pub target: String,
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
    /// The device whose kernel variants to plan: lavapipe (the lane
    /// layouts), cuda (an H100: plane layouts) or wgpu-gpu (a Vulkan / Metal
    /// GPU: plane layouts).
    #[arg(
        long,
        default_value = "lavapipe",
        value_name = "cuda|lavapipe|wgpu-gpu"
    )]
    pub device: String,
    /// Override an integer setting, e.g. `--set l=8`.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub sets: Vec<String>,
}

pub fn run(args: PlanArgs) -> ExitCode {
    match build_plan(&args.file, &args.options, !args.no_fuse) {
        Ok(plan) => {
            print!("{plan}");
            ExitCode::SUCCESS
        }
        Err(Reported) => ExitCode::FAILURE,
    }
}

/// Compiles `file` against the `--target` preset and plans it for the
/// configuration in `options`; every failure is reported on stderr first.
pub fn build_plan(file: &Path, options: &PlanOptions, fuse: bool) -> Result<Plan, Reported> {
    let Some(dtype) = PlanDType::parse(&options.dtype) else {
        eprintln!("error: `--dtype {}`: expected f32 or f16", options.dtype);
        return Err(Reported);
    };
    let Some(device) = DeviceProfile::preset(&options.device) else {
        eprintln!(
            "error: `--device {}`: expected {}",
            options.device,
            DeviceProfile::PRESETS
        );
        return Err(Reported);
    };
    let (graph, target) = compile_graph(file, options)?;
    let config = PlanConfig {
        tokens: options.tokens,
        batch: options.batch,
        context: options.context,
        dtype,
        fuse,
        device,
    };
    draftc_codegen::plan(&graph, &target, &config).map_err(|e| {
        eprintln!("error: {e}");
        Reported
    })
}

/// Compiles a model or drafter `file` against the `--target` preset (with
/// `--set` overrides) and names the target's exported weights; presets are
/// refused with a hint.
pub fn compile_graph(
    file: &Path,
    options: &PlanOptions,
) -> Result<(Graph, TargetWeights), Reported> {
    let sets = parse_sets(&options.sets)?;
    let (target, _) = load_target(&options.target, Some(file))?;
    let graph = match compile_file(file, &target, &sets)? {
        Compiled::Graph(g) => *g,
        Compiled::Preset(cfg) => {
            eprintln!(
                "error: {} is a preset; plan a model or drafter file (e.g. the family `{}`)",
                file.display(),
                cfg.family
            );
            return Err(Reported);
        }
    };
    // What `target.embed` / `target.norm` / `target.lm_head` bind to, and
    // how the target's final norm scales (Gemma's `x̂·(1 + w)`), from the
    // target's own graph: the file itself when it is a model file.
    let weights = if graph.meta.exports.is_empty() {
        match family_graph(file, &target) {
            Some(family) => {
                TargetWeights::new(&target, &family.meta.exports).with_final_norm_of(&family)
            }
            None => TargetWeights::new(&target, &BTreeMap::new()),
        }
    } else {
        TargetWeights::new(&target, &graph.meta.exports).with_final_norm_of(&graph)
    };
    Ok((graph, weights))
}

/// The target family's model graph (its weight exports: `embed`,
/// `final_norm`, `lm_head`); none when the family file is not found or
/// does not compile (planning then reports the export it needs).
fn family_graph(file: &Path, target: &TargetConfig) -> Option<Graph> {
    let resolver = DirResolver::near(Some(file));
    let (_, src) = resolver.resolve(&target.family)?;
    draftc_ir::compile(&src, target, &BTreeMap::new(), &resolver).ok()
}
