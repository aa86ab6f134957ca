//! Building the drafter a command line names (`draftc generate`, `draftc
//! bench`): `prompt-lookup`, or a drafter description file compiled against
//! the target's config, with weights that are `random:SEED`, `pruned`
//! (copied from the target where the drafter's tensors have the target's
//! names and shapes, random elsewhere: SPIRe's pruned initialisation) or a
//! safetensors file. Tensors a drafter shares with the target (embedding,
//! LM head, the whole model for self-speculation) always come from the
//! target. Compile errors are rendered as diagnostics on stderr.

use std::path::Path;

use cubecl::prelude::*;
use draftc_codegen::PlanDType;

use crate::engine::{model_drafter, weight_specs, Drafter, PromptLookupDrafter, TargetModel};
use crate::exec::HostWeights;
use crate::model::ConvertedModel;
use crate::spec::{PromptLookup, TreeShape};

/// What the command line says about the drafter.
#[derive(Clone, Debug)]
pub struct DrafterChoice {
    /// `prompt-lookup` or a `.draft` file.
    pub name: String,
    /// `random:SEED`, `pruned[:SEED]` or a safetensors file.
    pub weights: String,
    /// Draft tokens per sequence per round at most.
    pub budget: usize,
    /// Prompt lookup: continuations merged into a tree.
    pub branches: usize,
    /// Overrides the file's `tree` setting (autoregressive drafters).
    pub tree: Option<TreeShape>,
}

/// Builds the drafter `choice` names for `target`.
pub fn make_drafter<R: Runtime>(
    client: &ComputeClient<R>,
    choice: &DrafterChoice,
    model: &ConvertedModel,
    target: &TargetModel<R>,
    dtype: PlanDType,
) -> Result<Box<dyn Drafter<R>>, String> {
    if choice.name == "prompt-lookup" {
        let lookup = PromptLookup::new(1, 3, choice.budget.max(1)).map_err(|e| e.to_string())?;
        return Ok(Box::new(PromptLookupDrafter {
            lookup,
            branches: choice.branches.max(1),
        }));
    }
    let path = Path::new(&choice.name);
    let src = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "{}: {e} (a drafter is `prompt-lookup` or a description file such as models/specformer.draft)",
            path.display()
        )
    })?;
    let resolver = super::source::DirResolver::near(Some(path));
    let graph =
        match draftc_ir::compile(&src, &target.target_config, &Default::default(), &resolver) {
            Ok(g) => g,
            Err(diags) => {
                super::source::report(&choice.name, &src, &diags);
                return Err(format!("{} does not compile", path.display()));
            }
        };
    let specs = weight_specs(&graph, &target.weights).map_err(|e| e.to_string())?;
    let mut weights = drafter_weights(&choice.weights, &specs, model)?;
    // Tensors the drafter shares with the target always come from the target.
    let shared: Vec<_> = specs
        .iter()
        .filter(|s| model.weights.shape(&s.name).is_ok())
        .cloned()
        .collect();
    weights.extend(HostWeights::from_model(model, &shared).map_err(|e| e.to_string())?);
    model_drafter(client, &graph, target, &weights, dtype, choice.tree.clone())
        .map_err(|e| e.to_string())
}

/// The drafter's own weights from `--drafter-weights`.
fn drafter_weights(
    spec: &str,
    specs: &[draftc_codegen::bind::WeightSpec],
    model: &ConvertedModel,
) -> Result<HostWeights, String> {
    let seed = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("--drafter-weights: `{s}` is not an integer seed"))
    };
    if let Some(s) = spec.strip_prefix("random:") {
        return Ok(HostWeights::random(specs, seed(s)?));
    }
    if spec == "pruned" || spec.starts_with("pruned:") {
        let s = spec.strip_prefix("pruned:").unwrap_or("0");
        return HostWeights::pruned(specs, model, seed(s)?).map_err(|e| e.to_string());
    }
    let path = Path::new(spec);
    let f = crate::model::safetensors_io::SafetensorsFile::open(path).map_err(|e| {
        format!(
            "--drafter-weights {spec}: {e} (expected random:SEED, pruned or a .safetensors file)"
        )
    })?;
    let mut w = HostWeights::default();
    for s in specs {
        let shape: Vec<u64> = s.shape.iter().map(|&d| d as u64).collect();
        if let Ok(data) = f.tensor_f32(&s.name, &shape) {
            let dims = shape.iter().map(|&d| d as usize).collect();
            w.tensors.insert(s.name.clone(), (dims, data));
        }
    }
    Ok(w)
}
