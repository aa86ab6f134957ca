//! Building the drafter a command line names (`draftc generate`, `draftc
//! bench`): `prompt-lookup`; `early-exit:N`, a draft language model made of
//! the target's first `N` layers with its final norm and LM head (ids only,
//! its own KV cache); or a drafter description file compiled against
//! the target's config, with weights that are `random:SEED`, `pruned`
//! (copied from the target where the drafter's tensors have the target's
//! names and shapes, random elsewhere: SPIRe's pruned initialisation) or a
//! safetensors file. Tensors a drafter shares with the target (embedding,
//! LM head, the whole model for self-speculation) always come from the
//! target. Compile errors are rendered as diagnostics on stderr.
//!
//! `lookup` (model drafters only) puts prompt lookup in front of the model
//! (`engine::LookupFirst`): a sequence whose recent tokens occurred before
//! drafts their continuation, the model drafts the rest.
//!
//! `concurrent` (prompt lookup and early exit only: drafters that need no
//! target hidden states) runs the drafter on its own thread and wgpu client,
//! drafting round r+1 while the target verifies round r, with paper 003's
//! hardware-aware draft length.

use std::path::Path;

use cubecl::prelude::*;
use draftc_codegen::PlanDType;

use crate::engine::{
    compile_target, model_drafter, target_config, weight_specs, BudgetPolicy, ConcurrentDrafter,
    DraftWorker, Drafter, LmDrafter, LookupFirst, PromptLookupDrafter, SyncTokenDrafter,
    TargetModel, TokenDrafter,
};
use crate::exec::{file_specs, DraftVocab, HostWeights};
use crate::model::ConvertedModel;
use crate::speculation::{Confidence, PromptLookup, TreeShape};
use draftc_codegen::bind::WeightSpec;

/// What the command line says about the drafter.
#[derive(Clone, Debug)]
pub struct DrafterChoice {
    /// `prompt-lookup` or a `.draft` file.
    pub name: String,
    /// `random:SEED`, `pruned[:SEED]`, a safetensors file or an EAGLE-3
    /// head directory (SpecForge / EAGLE layout).
    pub weights: String,
    /// Draft tokens per sequence per round at most.
    pub budget: usize,
    /// Prompt lookup: continuations merged into a tree.
    pub branches: usize,
    /// Overrides the file's `tree` setting (autoregressive drafters; the
    /// tree of an early-exit drafter, default chain).
    pub tree: Option<TreeShape>,
    /// Draft on another thread while the target verifies (DuoDecoding).
    pub concurrent: bool,
    /// Cut the draft tree by the drafter's path probability.
    pub confidence: Option<Confidence>,
    /// Prompt lookup first (`--lookup N`, model drafters): the shortest
    /// n-gram match that drafts a round instead of the model.
    pub lookup: Option<usize>,
}

impl DrafterChoice {
    /// `name` with `weights`, drafting up to `budget` tokens a round in
    /// `tree` (a `--tree` value; the file's own when `None`), on the
    /// calling thread, with no confidence cut and no lookup in front.
    pub fn plain(
        name: &str,
        weights: &str,
        budget: usize,
        tree: Option<&str>,
    ) -> Result<DrafterChoice, String> {
        Ok(DrafterChoice {
            name: name.to_string(),
            weights: weights.to_string(),
            budget,
            branches: 1,
            tree: match tree {
                Some(t) => Some(t.parse::<TreeShape>().map_err(|e| e.to_string())?),
                None => None,
            },
            concurrent: false,
            confidence: None,
            lookup: None,
        })
    }
}

/// `--lookup` values: `N` (the shortest n-gram match, 1 to 3) or `off`.
pub fn parse_lookup(s: &str) -> Result<Option<usize>, String> {
    let max = crate::engine::LOOKUP_MAX_NGRAM;
    match s.trim() {
        "off" => Ok(None),
        t => match t.parse::<usize>() {
            Ok(n) if crate::engine::LOOKUP_MIN_NGRAMS.contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "--lookup `{s}`: expected the shortest n-gram match that drafts by lookup \
                 (1 to {max}) or `off`"
            )),
        },
    }
}

/// A drafter and where its weights came from.
pub struct BuiltDrafter<R: Runtime> {
    pub drafter: Box<dyn Drafter<R>>,
    /// For reports: `none` (prompt lookup), `target` (early exit, or a
    /// description whose every tensor is the target's, such as MagicDec),
    /// else `--drafter-weights` as given.
    pub weights: String,
}

/// Builds the drafter `choice` names for `target`.
pub fn make_drafter<R: Runtime>(
    client: &ComputeClient<R>,
    choice: &DrafterChoice,
    model: &ConvertedModel,
    target: &TargetModel<R>,
    dtype: PlanDType,
) -> Result<BuiltDrafter<R>, String> {
    if let Some((make, weights)) = token_drafter(choice, model, target, dtype)? {
        if choice.lookup.is_some() {
            return Err(format!(
                "--lookup puts prompt lookup in front of a model drafter (a description file \
                 such as models/beagle.draft); `{}` drafts from token ids already",
                choice.name
            ));
        }
        let mut drafter: Box<dyn Drafter<R>> = if choice.concurrent {
            let worker = DraftWorker::spawn(make)?;
            Box::new(ConcurrentDrafter::new(worker, BudgetPolicy::HardwareAware))
        } else {
            Box::new(SyncTokenDrafter(make()?))
        };
        if let Some(c) = choice.confidence {
            drafter.set_confidence(c).map_err(|e| e.to_string())?;
        }
        return Ok(BuiltDrafter {
            drafter,
            weights: weights.into(),
        });
    }
    if choice.concurrent {
        return Err(format!(
            "--concurrent needs a drafter that works from token ids alone (prompt-lookup, \
             early-exit:N); {} reads the target's hidden states",
            choice.name
        ));
    }
    // A head trained elsewhere (SpecForge, EAGLE's traineagle3) fixes the
    // description's draft vocabulary.
    let head = match crate::model::eagle3_head::head_files(Path::new(&choice.weights)) {
        Some(_) => Some(crate::model::eagle3_head::Eagle3Head::open(Path::new(
            &choice.weights,
        ))?),
        None => None,
    };
    let overrides = head.as_ref().map(|h| h.overrides()).unwrap_or_default();
    let graph = compile_drafter(choice, target, &overrides)?;
    let mut specs = weight_specs(&graph, &target.weights).map_err(|e| e.to_string())?;
    // A reduced draft vocabulary: its ids come with the drafter's weights,
    // its head rows from the target's head unless it has its own.
    let reduced = graph.meta.reduced_vocab(target.vocab as i64);
    let gathers = file_specs(&mut specs, reduced);
    // Tensors the drafter shares with the target always come from the target.
    let (shared, own): (Vec<_>, Vec<_>) = specs
        .iter()
        .cloned()
        .partition(|s| model.weights.shape(&s.name).is_ok());
    let source = resolve_weights(&choice.weights, Path::new(&choice.name), own.is_empty())?;
    let mut weights = match head {
        Some(h) => head_weights(h, &graph, &own, model, target)?,
        None => drafter_weights(&source, &specs, &own, model)?,
    };
    weights.extend(HostWeights::from_model(model, &shared).map_err(|e| e.to_string())?);
    if gathers {
        let vocab = DraftVocab::of(&graph, &weights, target.vocab)
            .map_err(|e| format!("drafter weights {source}: {e}"))?
            .ok_or("a reduced draft vocabulary without ids")?;
        let (name, rows) = target_rows(model, target, "lm_head")?;
        let head = rows.get(&name).ok_or("the target has no LM head")?;
        vocab.bind(&mut weights, head)?;
    }
    let mut drafter = model_drafter(client, &graph, target, &weights, dtype, choice.tree.clone())
        .map_err(|e| e.to_string())?;
    if let Some(c) = choice.confidence {
        drafter.set_confidence(c).map_err(|e| e.to_string())?;
    }
    if let Some(n) = choice.lookup {
        drafter = Box::new(LookupFirst::new(drafter, n).map_err(|e| e.to_string())?);
    }
    Ok(BuiltDrafter {
        drafter,
        weights: if own.is_empty() {
            "target".into()
        } else {
            source
        },
    })
}

/// Compiles the description file `choice` names against the target's
/// config; diagnostics go to stderr.
fn compile_drafter<R: Runtime>(
    choice: &DrafterChoice,
    target: &TargetModel<R>,
    overrides: &std::collections::BTreeMap<String, i64>,
) -> Result<draftc_ir::Graph, String> {
    let path = Path::new(&choice.name);
    let src = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "{}: {e} (a drafter is `prompt-lookup` or a description file such as models/specformer.draft)",
            path.display()
        )
    })?;
    let resolver = super::source::DirResolver::near(Some(path));
    draftc_ir::compile(&src, &target.target_config, overrides, &resolver).map_err(|diags| {
        super::source::report(&choice.name, &src, &diags);
        format!("{} does not compile", path.display())
    })
}

/// The drafter's own weights from an EAGLE-3 head trained elsewhere,
/// checked against the target (its config, its taps, its embedding).
fn head_weights<R: Runtime>(
    head: crate::model::eagle3_head::Eagle3Head,
    graph: &draftc_ir::Graph,
    own: &[WeightSpec],
    model: &ConvertedModel,
    target: &TargetModel<R>,
) -> Result<HostWeights, String> {
    let taps: Vec<i64> = graph.memories.iter().flat_map(|m| m.taps()).collect();
    head.check(&target.target_config, &taps)?;
    // The target's embedding only where the head stores one to check.
    let embed = if head.stores_embedding() {
        Some(target_rows(model, target, "embed")?)
    } else {
        None
    };
    let embed = embed.as_ref().and_then(|(name, rows)| rows.get(name));
    head.into_weights(own, target.vocab, embed)
}

/// The target's `[vocab, d]` tensor exported as `export` (`embed`,
/// `lm_head`), read from the model in f32: its name, and the weights
/// holding it.
fn target_rows<R: Runtime>(
    model: &ConvertedModel,
    target: &TargetModel<R>,
    export: &str,
) -> Result<(String, HostWeights), String> {
    let spec = WeightSpec {
        name: format!(
            "{}.weight",
            target
                .weights
                .exports
                .get(export)
                .cloned()
                .unwrap_or_default()
        ),
        shape: vec![
            target.vocab as i64,
            target.target_config.int("d").unwrap_or(0),
        ],
        dtype: PlanDType::F32,
    };
    let rows =
        HostWeights::from_model(model, std::slice::from_ref(&spec)).map_err(|e| e.to_string())?;
    Ok((spec.name, rows))
}

/// Whether `name` drafts from token ids alone (`prompt-lookup`,
/// `early-exit:N`) rather than being a description file.
pub fn is_token_drafter(name: &str) -> bool {
    name == "prompt-lookup" || name.starts_with("early-exit:")
}

/// How to build a token-only drafter on whichever thread runs it.
type MakeTokenDrafter = Box<dyn FnOnce() -> Result<Box<dyn TokenDrafter>, String> + Send>;

/// `prompt-lookup` and `early-exit:N` as a constructor that can run on the
/// drafter's own thread (the early-exit model gets its own wgpu client
/// there), with where its weights come from (`none` / `target`); `None`
/// for description files.
fn token_drafter<R: Runtime>(
    choice: &DrafterChoice,
    model: &ConvertedModel,
    target: &TargetModel<R>,
    dtype: PlanDType,
) -> Result<Option<(MakeTokenDrafter, &'static str)>, String> {
    if !is_token_drafter(&choice.name) {
        return Ok(None);
    }
    if choice.name == "prompt-lookup" {
        let lookup = PromptLookup::new(1, 3, choice.budget.max(1)).map_err(|e| e.to_string())?;
        let branches = choice.branches.max(1);
        let make: MakeTokenDrafter = Box::new(move || {
            Ok(Box::new(PromptLookupDrafter { lookup, branches }) as Box<dyn TokenDrafter>)
        });
        return Ok(Some((make, "none")));
    }
    let Some(n) = choice.name.strip_prefix("early-exit:") else {
        return Ok(None);
    };
    let layers = model.config.num_hidden_layers;
    let n: usize = match n.parse() {
        Ok(n) if n >= 1 && n <= layers => n,
        _ => {
            return Err(format!(
                "`{}`: early-exit:N needs 1 <= N <= {layers} (the target's layers)",
                choice.name
            ))
        }
    };
    let mut cfg = target_config(&model.config);
    cfg.ints.insert("n".into(), n as i64);
    let graph = compile_target(&cfg).map_err(|e| e.to_string())?;
    let tw = draftc_codegen::TargetWeights::new(&cfg, &graph.meta.exports);
    let specs = weight_specs(&graph, &tw).map_err(|e| e.to_string())?;
    let weights = HostWeights::from_model(model, &specs).map_err(|e| e.to_string())?;
    // A concurrent request's context runs ahead by the unverified path
    // (at most a budget) and drafts one more token than the budget.
    let (slots, capacity) = (
        target.caches.slots(),
        target.caches.capacity() + 2 * choice.budget + 2,
    );
    let shape = choice.tree.clone().unwrap_or(TreeShape::Chain);
    let name = format!("early-exit:{n}");
    let eos = target.eos.clone();
    let make: MakeTokenDrafter = Box::new(move || {
        let client = crate::device::wgpu_client()?;
        let mut lm = TargetModel::from_parts(&client, graph, cfg, weights, slots, capacity, dtype)
            .map_err(|e| e.to_string())?;
        lm.eos = eos;
        Ok(Box::new(LmDrafter::new(lm, shape, &name)) as Box<dyn TokenDrafter>)
    });
    Ok(Some((make, "target")))
}

/// `--drafter-weights` value meaning "the trained weights that ship with
/// the description": `weights/<stem>.safetensors` next to the `.draft` file.
pub const SHIPPED: &str = "shipped";

/// Where the trained weights of the description `drafter` ship.
pub fn shipped_weights(drafter: &Path) -> std::path::PathBuf {
    let stem = drafter.file_stem().unwrap_or_default().to_string_lossy();
    drafter
        .parent()
        .unwrap_or(Path::new("."))
        .join("weights")
        .join(format!("{stem}.safetensors"))
}

/// The concrete `--drafter-weights` source: `shipped` becomes the shipped
/// file's path (an error naming it and the alternatives when none ships),
/// or stays `shipped` for drafters with no tensors of their own.
fn resolve_weights(spec: &str, drafter: &Path, no_own: bool) -> Result<String, String> {
    if spec != SHIPPED || no_own {
        return Ok(spec.to_string());
    }
    let path = shipped_weights(drafter);
    if !path.is_file() {
        return Err(format!(
            "{}: no trained weights ship for this drafter (expected {}); train them \
             (docs/training.md) or pass --drafter-weights random:SEED, pruned[:SEED] or a .safetensors file",
            drafter.display(),
            path.display()
        ));
    }
    Ok(path.display().to_string())
}

/// The drafter's own weights from `--drafter-weights` (after
/// [`resolve_weights`]): random, pruned from the target, or a safetensors
/// file that must hold every tensor in `own` with its shape (the error
/// names the file and the tensor).
fn drafter_weights(
    spec: &str,
    specs: &[draftc_codegen::bind::WeightSpec],
    own: &[draftc_codegen::bind::WeightSpec],
    model: &ConvertedModel,
) -> Result<HostWeights, String> {
    let seed = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("--drafter-weights: `{s}` is not an integer seed"))
    };
    if spec == SHIPPED {
        return Ok(HostWeights::default());
    }
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
            "--drafter-weights {spec}: {e} (expected shipped, random:SEED, pruned, a .safetensors file or an EAGLE-3 head directory)"
        )
    })?;
    let mut w = HostWeights::default();
    for s in own {
        let shape: Vec<u64> = s.shape.iter().map(|&d| d as u64).collect();
        let data = f.tensor_f32(&s.name, &shape).map_err(|e| {
            format!(
                "drafter weights {}: tensor `{}`: {e}",
                path.display(),
                s.name
            )
        })?;
        let dims = shape.iter().map(|&d| d as usize).collect();
        w.tensors.insert(s.name.clone(), (dims, data));
    }
    Ok(w)
}
