//! `draftc bench decode|spec|replay`: the benchmarks of [`crate::bench`] on the
//! default (or `--model`) target. Each prints a markdown table on stdout and
//! writes `<name>.json` and `<name>.svg` under `--out`; progress goes to
//! stderr. `--backend cuda` needs a build with the `cuda` feature.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use cubecl::prelude::*;
use draftc_codegen::PlanDType;
use serde::Serialize;

use super::drafter::DrafterChoice;
use crate::bench::decode::{run_decode, DecodeConfig};
use crate::bench::speculative::{run_spec, SpecConfig};
use crate::bench::Progress;
use crate::device::{Backend, OnClient};
use crate::model::ConvertedModel;
use crate::speculation::{Confidence, TreeShape};

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: BenchKind,
}

#[derive(Subcommand)]
pub enum BenchKind {
    /// Autoregressive decode tokens/s per batch size, bytes per token and
    /// the fraction of the measured memory bandwidth.
    Decode(DecodeArgs),
    /// Speculative vs autoregressive decoding: τ, k, κ, tokens/s, speedup,
    /// acceptance by depth, per drafter × batch size × budget.
    Spec(Box<SpecArgs>),
    /// Replayed target passes (decode steps, tree verifications) against
    /// eager ones, bit for bit, per batch size; exit 1 if any differs.
    Replay(ReplayArgs),
}

#[derive(Args, Clone)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Decode steps, and tree verifications, per batch size.
    #[arg(long, default_value_t = 8)]
    pub steps: usize,
}

/// Options every benchmark has.
#[derive(Args, Clone)]
pub struct CommonArgs {
    /// A converted model directory (default: SmolLM2-135M-Instruct).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Batch sizes (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16, 64])]
    pub batch: Vec<usize>,
    /// Compute dtype of the plans: f32, f16 (f32 accumulation), or auto
    /// (f16 on a GPU, f32 on lavapipe).
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// wgpu (Vulkan; lavapipe without a GPU) or cuda (`cuda` feature).
    #[arg(long, default_value = "wgpu")]
    pub backend: String,
    /// Directory for the JSON report and the SVG plot.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// No progress on stderr.
    #[arg(long)]
    pub quiet: bool,
}

#[derive(Args, Clone)]
pub struct DecodeArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Timed decode steps per batch size.
    #[arg(long, default_value_t = 16)]
    pub steps: usize,
    /// Replayed passes (`on`, the default), eager ones (`off`, as
    /// `DRAFTC_REPLAY=off`), or `both`: every batch size measured eagerly,
    /// then replayed, in one run.
    #[arg(long, default_value = "on", value_parser = ["on", "off", "both"])]
    pub replay: String,
}

#[derive(Args, Clone)]
pub struct SpecArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Drafters (repeatable): `prompt-lookup` or a description file.
    /// Default: prompt-lookup, models/magicdec.draft, and each of
    /// models/{specformer,beagle,medusa,spire}.draft whose trained weights ship
    /// (all of them with `--drafter-weights random:SEED` or `pruned`).
    #[arg(long = "drafter")]
    pub drafters: Vec<String>,
    /// Weights of model drafters: `shipped` (the trained weights beside each
    /// description), `random:SEED`, `pruned[:SEED]`, a safetensors file or
    /// an EAGLE-3 head trained elsewhere (a directory with config.json;
    /// docs/targets.md) (self-speculation always uses the target's).
    #[arg(long, default_value = "shipped")]
    pub drafter_weights: String,
    /// Tree of autoregressive drafters (overrides the files' `tree`).
    #[arg(long)]
    pub tree: Option<String>,
    /// Cut model drafters' trees by their confidence: `KEEP[,EXPAND]`
    /// (path probabilities, see `draftc generate --help`) or `off`. Repeat the
    /// flag to measure several cuts (and `off`) in one run.
    #[arg(long)]
    pub confidence: Vec<String>,
    /// Put prompt lookup in front of model drafters (description files;
    /// `prompt-lookup` and `early-exit:N` run without): `N` (the shortest
    /// n-gram match that drafts a round by lookup, 1 to 3) or `off`. Repeat
    /// the flag to measure several (and `off`) in one run.
    #[arg(long)]
    pub lookup: Vec<String>,
    /// Draft budgets (comma-separated; default 4).
    #[arg(long, value_delimiter = ',')]
    pub budget: Vec<usize>,
    /// Measure each drafter with shipped weights at the settings its
    /// weights manifest tunes for the device (`decode` in
    /// models/weights/<name>.json: tree, budget, confidence cut), the ones
    /// `draftc generate` uses by default; drafters without them run at
    /// `--budget`. Excludes `--tree` and `--confidence`; `--lookup`
    /// replaces the manifest's lookup setting.
    #[arg(long)]
    pub tuned: bool,
    /// How each drafter sizes its drafts, comma-separated: `fixed` (every
    /// budget of `--budget`, each run drafting it every round) and `auto`
    /// (one run planned per round up to the largest budget, the default of
    /// `draftc generate`). Default: both, so auto is measured beside the
    /// fixed settings it must match.
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("fixed"), String::from("auto")])]
    pub speculate: Vec<String>,
    /// New tokens per sequence.
    #[arg(long, default_value_t = 32)]
    pub max_tokens: usize,
    /// Prompt lookup: continuations merged into a tree.
    #[arg(long, default_value_t = 1)]
    pub branches: usize,
    /// Prompts: `builtin` (chat, code, summarisation, math), `mt-bench`
    /// (held-out MT-Bench first turns, data/eval/mt-bench.jsonl) or a file
    /// (one per line, or `.jsonl` with a `prompt` field, or `messages`: a
    /// conversation of `{"role", "content"}` ending with the user's turn, a
    /// prompt with its context). Batch `b` runs the first `b`, so
    /// `--batch 16` measures τ over 16 questions.
    #[arg(long, default_value = "builtin")]
    pub prompts: String,
    /// Give each prompt to the model as raw text, with the tokens its
    /// tokenizer adds around a text (Gemma's `<bos>`), as `draftc generate
    /// --raw` does, instead of through its chat template: a base model
    /// has none. Each prompt must be a single user turn.
    #[arg(long)]
    pub raw: bool,
    /// Prompts per measurement: a batch of `b` runs the first N prompts in
    /// consecutive groups of `b` (default: `b`, one group), so `--batch 1
    /// --prompt-count 16` measures τ and speedup at batch 1 over 16
    /// questions.
    #[arg(long)]
    pub prompt_count: Option<usize>,
    /// Timed runs of every configuration, alternated with autoregressive
    /// runs; each rate is the median of its runs, so one noisy run does not
    /// decide a speedup (lavapipe on a shared 2-core host varies by about
    /// ±6 % from run to run).
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
}

/// The drafters `draftc bench spec` runs when none is named: those that
/// need no trained weights, then the learned ones of [`LEARNED_DRAFTERS`]
/// whose weights ship (with `--drafter-weights shipped`, the default; any
/// other choice runs them all).
pub const DEFAULT_DRAFTERS: [&str; 2] = ["prompt-lookup", "models/magicdec.draft"];

/// Learned drafters `draftc bench spec` adds by default.
pub const LEARNED_DRAFTERS: [&str; 5] = [
    "models/specformer.draft",
    "models/beagle.draft",
    "models/medusa.draft",
    "models/spire.draft",
    "models/eagle.draft",
];

fn default_drafters(weights: &str) -> Vec<String> {
    let learned = LEARNED_DRAFTERS.iter().filter(|d| {
        weights != super::drafter::SHIPPED
            || super::drafter::shipped_weights(std::path::Path::new(d)).is_file()
    });
    DEFAULT_DRAFTERS
        .iter()
        .chain(learned)
        .map(|s| s.to_string())
        .collect()
}

pub fn run(args: BenchArgs) -> ExitCode {
    let got = match &args.which {
        BenchKind::Decode(a) => with_backend(&a.common, |c, m, p, d| decode(c, m, p, d, a)),
        BenchKind::Replay(a) => with_backend(&a.common, |c, m, p, d| replay(c, m, p, d, a)),
        // Flags and prompts are checked before the model is loaded: bad
        // ones fail fast.
        BenchKind::Spec(a) => check_spec_args(a)
            .and_then(|()| crate::bench::prompts::load_prompts(&a.prompts))
            .and_then(|prompts| {
                with_backend(&a.common, |c, m, p, d| spec(c, m, p, d, a, prompts.clone()))
            }),
    };
    match got {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Flag combinations `bench spec` refuses.
fn check_spec_args(args: &SpecArgs) -> Result<(), String> {
    if args.tuned && (args.tree.is_some() || !args.confidence.is_empty()) {
        return Err(
            "--tuned measures each drafter at its manifest's tree and confidence cut; \
             drop --tree and --confidence (or --tuned)"
                .into(),
        );
    }
    for l in &args.lookup {
        super::drafter::parse_lookup(l)?;
    }
    Ok(())
}

/// A compute client of whichever runtime `--backend` picked, so the
/// benchmark bodies need not be generic.
pub trait AnyClient {
    fn decode(
        &self,
        model: &ConvertedModel,
        cfg: &DecodeConfig,
        progress: &Progress,
    ) -> Result<crate::bench::decode::DecodeReport, String>;
    fn spec(
        &self,
        model: &ConvertedModel,
        cfg: &SpecConfig,
        progress: &Progress,
    ) -> Result<crate::bench::speculative::SpecReport, String>;
    fn replay(
        &self,
        model: &ConvertedModel,
        args: &ReplayArgs,
        dtype: PlanDType,
        progress: &Progress,
    ) -> Result<String, String>;
    /// The device class (the key of tuned settings).
    fn class(&self) -> draftc_codegen::DeviceClass;
}

struct Client<R: Runtime>(ComputeClient<R>);

impl<R: Runtime> AnyClient for Client<R> {
    fn decode(
        &self,
        model: &ConvertedModel,
        cfg: &DecodeConfig,
        progress: &Progress,
    ) -> Result<crate::bench::decode::DecodeReport, String> {
        run_decode(&self.0, model, cfg, progress).map_err(|e| e.to_string())
    }

    fn spec(
        &self,
        model: &ConvertedModel,
        cfg: &SpecConfig,
        progress: &Progress,
    ) -> Result<crate::bench::speculative::SpecReport, String> {
        run_spec(&self.0, model, cfg, progress)
    }

    fn replay(
        &self,
        model: &ConvertedModel,
        args: &ReplayArgs,
        dtype: PlanDType,
        progress: &Progress,
    ) -> Result<String, String> {
        use crate::bench::replay::{run_replay, table};
        let checks = run_replay(
            &self.0,
            model,
            &args.common.batch,
            args.steps,
            dtype,
            progress,
        )
        .map_err(|e| e.to_string())?;
        let device = crate::bench::device_name(&self.0);
        print!("{}", table(&device, &checks));
        save_json(&args.common.out, "replay", &checks)?;
        match checks.iter().find(|c| c.first_difference.is_some()) {
            Some(c) => Err(format!(
                "replayed {} passes at batch {} differ from the eager ones",
                c.pass, c.batch
            )),
            None => Ok(device),
        }
    }

    fn class(&self) -> draftc_codegen::DeviceClass {
        crate::device::profile(&self.0).class
    }
}

fn replay(
    client: &dyn AnyClient,
    model: &ConvertedModel,
    progress: &Progress,
    dtype: PlanDType,
    args: &ReplayArgs,
) -> Result<(), String> {
    client.replay(model, args, dtype, progress).map(|_| ())
}

/// Opens the model and the backend's client, then runs `body`.
fn with_backend(
    common: &CommonArgs,
    body: impl Fn(&dyn AnyClient, &ConvertedModel, &Progress, PlanDType) -> Result<(), String>,
) -> Result<(), String> {
    crate::device::check_dtype(&common.dtype)?;
    let backend = Backend::parse(&common.backend)?;
    let dir = super::generate::model_dir(common.model.as_deref(), common.quiet)?;
    let model = ConvertedModel::open(&dir).map_err(|e| e.to_string())?;
    let progress = Progress::new(!common.quiet);
    backend.run(Bench {
        body,
        model: &model,
        progress: &progress,
        dtype: &common.dtype,
    })
}

/// A benchmark body with its model and progress, for whichever runtime
/// `--backend` picked.
struct Bench<'a, F> {
    body: F,
    model: &'a ConvertedModel,
    progress: &'a Progress,
    /// `--dtype` as given (resolved on the client: `auto`).
    dtype: &'a str,
}

impl<F> OnClient for Bench<'_, F>
where
    F: Fn(&dyn AnyClient, &ConvertedModel, &Progress, PlanDType) -> Result<(), String>,
{
    type Output = ();
    fn on<R: Runtime>(self, client: &ComputeClient<R>) -> Result<(), String> {
        let dtype = crate::device::resolve_dtype(self.dtype, client)?;
        (self.body)(&Client(client.clone()), self.model, self.progress, dtype)
    }
}

fn decode(
    client: &dyn AnyClient,
    model: &ConvertedModel,
    progress: &Progress,
    dtype: PlanDType,
    args: &DecodeArgs,
) -> Result<(), String> {
    let replay = match args.replay.as_str() {
        "off" => vec![false],
        "both" => vec![false, true],
        _ => vec![true],
    };
    let cfg = DecodeConfig {
        batches: args.common.batch.clone(),
        steps: args.steps,
        dtype,
        replay,
    };
    let report = client.decode(model, &cfg, progress)?;
    print!("{}", report.table());
    save(&args.common.out, "decode", &report, |p| report.write_svg(p))
}

fn spec(
    client: &dyn AnyClient,
    model: &ConvertedModel,
    progress: &Progress,
    dtype: PlanDType,
    args: &SpecArgs,
    prompts: Vec<crate::bench::prompts::Conversation>,
) -> Result<(), String> {
    let names: Vec<String> = if args.drafters.is_empty() {
        default_drafters(&args.drafter_weights)
    } else {
        args.drafters.clone()
    };
    let tree = match &args.tree {
        Some(t) => Some(t.parse::<TreeShape>().map_err(|e| e.to_string())?),
        None => None,
    };
    let cuts: Vec<Option<Confidence>> = if args.confidence.is_empty() {
        vec![None]
    } else {
        args.confidence
            .iter()
            .map(|c| match c.trim() {
                "off" => Ok(None),
                c => c.parse::<Confidence>().map(Some).map_err(|e| e.to_string()),
            })
            .collect::<Result<_, _>>()?
    };
    let lookups: Vec<Option<usize>> = if args.lookup.is_empty() {
        vec![None]
    } else {
        args.lookup
            .iter()
            .map(|l| super::drafter::parse_lookup(l))
            .collect::<Result<_, _>>()?
    };
    let mut drafters: Vec<DrafterChoice> = Vec::new();
    for name in &names {
        // Lookup goes in front of model drafters only; the others run once.
        let lookups = if super::drafter::is_token_drafter(name) {
            &[None][..]
        } else {
            &lookups[..]
        };
        for &confidence in &cuts {
            for &lookup in lookups {
                drafters.push(DrafterChoice {
                    name: name.clone(),
                    weights: args.drafter_weights.clone(),
                    budget: 0,
                    branches: args.branches,
                    tree: tree.clone(),
                    concurrent: false,
                    confidence,
                    lookup,
                });
            }
        }
    }
    if args.tuned {
        let class = client.class();
        for c in &mut drafters {
            if let Some(t) = super::tuned::tuned_for(c, class)? {
                let lookup = c.lookup;
                t.apply(c);
                if !args.lookup.is_empty() {
                    c.lookup = lookup;
                }
            }
        }
    }
    let cfg = SpecConfig {
        drafters,
        batches: args.common.batch.clone(),
        budgets: if args.budget.is_empty() {
            vec![4]
        } else {
            args.budget.clone()
        },
        max_tokens: args.max_tokens,
        dtype,
        prompts,
        raw: args.raw,
        prompt_count: args.prompt_count,
        repeat: args.repeat,
        fixed: args.speculate.iter().any(|s| s == "fixed"),
        auto: args.speculate.iter().any(|s| s == "auto"),
    };
    if let Some(bad) = args
        .speculate
        .iter()
        .find(|s| !matches!(s.as_str(), "fixed" | "auto"))
    {
        return Err(format!(
            "--speculate {bad}: expected `fixed`, `auto` or both (`fixed,auto`)"
        ));
    }
    let report = client.spec(model, &cfg, progress)?;
    print!("{}{}", report.table(), report.auto_summary());
    save(&args.common.out, "spec", &report, |p| report.write_svg(p))?;
    if !report.all_lossless() {
        return Err("a speculative run did not reproduce the autoregressive output".into());
    }
    Ok(())
}

/// Writes `<out>/<name>.json` and `<out>/<name>.svg`.
fn save<T: Serialize>(
    out: &Path,
    name: &str,
    report: &T,
    svg: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<(), String> {
    let json = save_json(out, name, report)?;
    let plot = out.join(format!("{name}.svg"));
    svg(&plot)?;
    eprintln!("wrote {} and {}", json.display(), plot.display());
    Ok(())
}

/// Writes `<out>/<name>.json`; its path.
fn save_json<T: Serialize>(out: &Path, name: &str, report: &T) -> Result<PathBuf, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let json = out.join(format!("{name}.json"));
    let text = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
    std::fs::write(&json, text).map_err(|e| format!("{}: {e}", json.display()))?;
    Ok(json)
}
