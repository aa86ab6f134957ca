//! `draftc calibrate` and the per-device cost cache of `--speculate auto`.
//!
//! The planner (`speculation::planner`) needs what a round costs on this device:
//! a round without its drafter call by rows verified, and a drafter call by
//! batch size and budget. `draftc generate` measures them in its untimed
//! warm-up; without one (`--no-baseline`) it starts from this cache, and
//! every planned run writes what it measured back. `draftc calibrate`
//! measures them for a drafter at several batch sizes ahead of time.
//!
//! The cache is one JSON file, `$DRAFTC_CACHE/costs.json` (default
//! `~/.cache/draftc/costs.json`), keyed by device, model, dtype and the
//! drafter with its settings. A missing or unreadable file is an empty
//! cache (a warning on stderr), never an error: costs are re-measured.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use cubecl::prelude::*;

use super::drafter::{make_drafter, DrafterChoice};
use crate::device::{Backend, OnClient};
use crate::engine::{warm_up, DraftPolicy, Request, Sampling, TargetModel};
use crate::model::tokenizer::ChatMessage;
use crate::model::ConvertedModel;
use crate::speculation::planner::Costs;
use crate::speculation::TreeShape;

/// Where the cost cache lives.
pub fn cache_path() -> Option<PathBuf> {
    crate::model::fetch::cache_dir()
        .ok()
        .map(|d| d.join("costs.json"))
}

/// The cache key of a drafter's costs on a device.
pub fn cost_key(
    device: &str,
    model: &ConvertedModel,
    dtype: &str,
    choice: &DrafterChoice,
) -> String {
    let model = model
        .dir
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tree = choice
        .tree
        .as_ref()
        .map(|t| t.to_string())
        .unwrap_or_default();
    let cut = choice.confidence.map(|c| c.to_string()).unwrap_or_default();
    let lookup = choice.lookup.map(|l| l.to_string()).unwrap_or_default();
    format!(
        "{device} | {model} | {dtype} | {} tree={tree} confidence={cut} lookup={lookup} branches={}",
        choice.name, choice.branches
    )
}

fn read_all() -> BTreeMap<String, Costs> {
    let Some(path) = cache_path() else {
        return BTreeMap::new();
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
            eprintln!("warning: {}: {e}; measuring costs afresh", path.display());
            BTreeMap::new()
        }),
        Err(_) => BTreeMap::new(),
    }
}

/// The stored costs under `key`, if any.
pub fn load_costs(key: &str) -> Option<Costs> {
    read_all().remove(key)
}

/// Merges `costs` into the entry `key` (new measurements replace old ones
/// of the same shape). Failing to write is a warning: the run stands.
pub fn store_costs(key: &str, costs: &Costs) {
    let Some(path) = cache_path() else {
        return;
    };
    let mut all = read_all();
    all.entry(key.to_string()).or_default().merge(costs);
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let text = serde_json::to_string_pretty(&all).map_err(std::io::Error::other)?;
        // Write beside, then rename: a reader never sees half a file.
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(e) = write() {
        eprintln!("warning: could not store costs in {}: {e}", path.display());
    }
}

#[derive(Args, Clone, Debug)]
pub struct CalibrateArgs {
    /// Drafters (repeatable): `prompt-lookup` or a description file.
    #[arg(long = "drafter", default_values_t = [String::from("prompt-lookup")])]
    pub drafters: Vec<String>,
    /// Batch sizes to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16])]
    pub batch: Vec<usize>,
    /// The largest draft budget the planner may choose.
    #[arg(long, default_value_t = 4)]
    pub budget: usize,
    /// Tree of autoregressive drafters (overrides the files' `tree`).
    #[arg(long)]
    pub tree: Option<String>,
    /// A converted model directory (default: SmolLM2-135M-Instruct).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// f32, f16 or auto.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// wgpu or cuda.
    #[arg(long, default_value = "wgpu")]
    pub backend: String,
}

pub fn run(args: CalibrateArgs) -> ExitCode {
    match run_inner(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_inner(args: &CalibrateArgs) -> Result<(), String> {
    if args.batch.is_empty() || args.batch.contains(&0) || args.budget == 0 {
        return Err("give batch sizes >= 1 and --budget >= 1".into());
    }
    if let Some(t) = &args.tree {
        t.parse::<TreeShape>().map_err(|e| e.to_string())?;
    }
    crate::device::check_dtype(&args.dtype)?;
    let backend = Backend::parse(&args.backend)?;
    let dir = super::generate::model_dir(args.model.as_deref(), false)?;
    let model = ConvertedModel::open(&dir).map_err(|e| e.to_string())?;
    backend.run(Calibrate {
        args,
        model: &model,
    })
}

struct Calibrate<'a> {
    args: &'a CalibrateArgs,
    model: &'a ConvertedModel,
}

impl OnClient for Calibrate<'_> {
    type Output = ();
    fn on<R: Runtime>(self, client: &ComputeClient<R>) -> Result<(), String> {
        calibrate_on(client, self.args, self.model)
    }
}

fn calibrate_on<R: Runtime>(
    client: &ComputeClient<R>,
    args: &CalibrateArgs,
    model: &ConvertedModel,
) -> Result<(), String> {
    let dtype = crate::device::resolve_dtype(&args.dtype, client)?;
    let max_b = args.batch.iter().copied().max().unwrap_or(1);
    let mut prompts = Vec::new();
    for i in 0..max_b {
        let text = crate::bench::prompts::prompt(i).text;
        prompts.push(
            model
                .tokenizer
                .encode_chat(&[ChatMessage::new("user", text)])
                .map_err(|e| e.to_string())?,
        );
    }
    let capacity = prompts.iter().map(Vec::len).max().unwrap_or(0) + 64;
    eprintln!("loading {} …", model.dir.display());
    let mut target =
        TargetModel::load(client, model, max_b, capacity, dtype).map_err(|e| e.to_string())?;
    let device = crate::bench::device_name(client);
    for name in &args.drafters {
        let choice = DrafterChoice::plain(name, "shipped", args.budget, args.tree.as_deref())?;
        let mut drafter = make_drafter(client, &choice, model, &target, dtype)?.drafter;
        let key = cost_key(&device, model, dtype.name(), &choice);
        let mut all = Costs::default();
        for &b in &args.batch {
            let requests: Vec<Request> = prompts[..b]
                .iter()
                .map(|p| Request { prompt: p.clone() })
                .collect();
            let mut policy = DraftPolicy::auto(args.budget).map_err(|e| e.to_string())?;
            warm_up(
                &mut target,
                drafter.as_mut(),
                &requests,
                &Sampling::GREEDY,
                &mut policy,
            )
            .map_err(|e| e.to_string())?;
            if let DraftPolicy::Planned(p) = &policy {
                let c = p.costs();
                let v: Vec<String> = c
                    .verify
                    .iter()
                    .map(|(n, t)| format!("{n} rows {:.1} ms", t * 1e3))
                    .collect();
                let d: Vec<String> = c
                    .draft
                    .iter()
                    .filter(|e| e.0 == b)
                    .map(|(_, k, t)| format!("budget {k} {:.1} ms", t * 1e3))
                    .collect();
                let plain = c
                    .step
                    .iter()
                    .find(|e| e.0 == b)
                    .map_or("not measured".to_string(), |(_, r)| {
                        format!("{:.0} % of a round without draft", r * 100.0)
                    });
                eprintln!(
                    "{name} batch {b}: round without draft: {}; drafter call: {}; plain decoder step: {plain}",
                    v.join(", "),
                    d.join(", ")
                );
                all.merge(&c);
            }
        }
        store_costs(&key, &all);
    }
    if let Some(p) = cache_path() {
        println!("costs stored in {}", p.display());
    }
    Ok(())
}
