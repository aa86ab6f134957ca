//! `draftc bench spec`: speculative decoding against autoregressive
//! decoding of the same target, on the same backend, in the same process.
//!
//! Method per batch size `b` (the first `b` bench prompts, or the first
//! `--prompt-count N` in consecutive groups of `b`, chat template, the stop
//! token ignored so every sequence produces `max_tokens`):
//! one autoregressive run (the reference tokens and a baseline tokens/s),
//! then for every drafter × budget a warm-up of budget + 2 tokens (kernel
//! JIT for the drafter's shapes and the verification pass's) and a timed
//! speculative run. With `--repeat N` the timed runs of every configuration
//! are repeated N times. An autoregressive run comes before each drafter's
//! runs in every repeat, and one more after the last. Each run's speedup is
//! paired: its rate over the autoregressive rate at the time it ran
//! (interpolated between the baselines before and after its drafter's
//! runs), so a host that slows down for a minute slows both sides of the
//! ratio; the reported speedup is the median of a
//! configuration's paired speedups (of an even count, the lower middle),
//! its tokens/s the median of its rates, so single runs on a noisy host
//! neither make nor break a speedup. Reported per
//! configuration: τ (tokens per sequence-round), k (draft tokens per
//! sequence-round), κ (sequence-rounds per target pass), decode tokens/s,
//! speedup over the baseline, the share of time spent drafting and
//! verifying, acceptance per draft depth, and whether the output equalled
//! the baseline token for token (it must: greedy is lossless).

use cubecl::prelude::*;
use draftc_codegen::PlanDType;
use serde::Serialize;

use super::Progress;
use crate::cli::drafter::{make_drafter, DrafterChoice};
use crate::engine::{
    generate, generate_with_policy, warm_up, EngineError, Request, Sampling, SpecStats, TargetModel,
};
use crate::model::ConvertedModel;

/// What to measure.
#[derive(Clone, Debug)]
pub struct SpecConfig {
    /// Drafters. A drafter's `budget` of 0 runs every one of `budgets`;
    /// another value runs that budget alone (`bench spec --tuned`).
    pub drafters: Vec<DrafterChoice>,
    pub batches: Vec<usize>,
    /// Draft tokens per sequence per round.
    pub budgets: Vec<usize>,
    /// New tokens per sequence.
    pub max_tokens: usize,
    pub dtype: PlanDType,
    /// Prompts (each a conversation ending with the user's turn); a batch
    /// of `b` takes the first `b` (`--prompts`).
    pub prompts: Vec<super::prompts::Conversation>,
    /// Encode each prompt as raw text (the tokenizer's own special tokens
    /// added) instead of through the chat template (`--raw`: a base model).
    pub raw: bool,
    /// Prompts per measurement (at least `b`), run in groups of `b`.
    pub prompt_count: Option<usize>,
    /// Run each budget fixed, and one run planned up to the largest budget
    /// (`--speculate fixed,auto`).
    pub fixed: bool,
    pub auto: bool,
    /// Runs of every configuration, alternated with autoregressive runs;
    /// rates are medians over them (`--repeat`).
    pub repeat: usize,
}

/// One drafter × batch × budget measurement.
#[derive(Clone, Debug, Serialize)]
pub struct SpecPoint {
    /// The drafter's name, with its `--confidence` cut when one was set.
    pub drafter: String,
    /// The `--confidence` cut, `KEEP,EXPAND`.
    pub confidence: Option<String>,
    /// The draft tree when one replaced the file's (`--tree`, or tuned
    /// settings).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree: Option<String>,
    /// Where the drafter's weights came from: `none`, `target`, or the
    /// `--drafter-weights` choice (`pruned`, `random:SEED`, a file).
    pub weights: String,
    pub batch: usize,
    /// Prompts measured (consecutive groups of `batch`).
    pub prompts: usize,
    pub budget: usize,
    /// `fixed` (every round drafts `budget`) or `auto` (planned per round
    /// up to `budget`).
    pub speculate: String,
    /// Auto runs: sequence-rounds per planned budget `0..=budget`, the
    /// share of rounds with no drafter call, and the speedup the planner
    /// predicted from its own cost and acceptance estimates.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub budget_histogram: Vec<usize>,
    pub no_draft_share: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_speedup: Option<f64>,
    /// The round from which the planner kept the drafter off (0: whole
    /// runs), in the first run where it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drafter_off_at: Option<usize>,
    pub tau: f64,
    pub k: f64,
    pub kappa: f64,
    /// The median of `runs` (of two, the slower).
    pub tokens_per_s: f64,
    /// Tokens/s of each repeat (`--repeat`), in order.
    pub runs: Vec<f64>,
    /// The median of `autoregressive_runs` (of an even count, the faster
    /// middle one).
    pub autoregressive_tokens_per_s: f64,
    /// Autoregressive tokens/s: before the drafters, between repeats and
    /// after the last.
    pub autoregressive_runs: Vec<f64>,
    /// The median of `paired_speedups` (of two, the lower).
    pub speedup: f64,
    /// Each run's tokens/s over the autoregressive rate at the time it
    /// ran: interpolated in time between the autoregressive runs before
    /// and after its repeat, so a host that slows down for a while slows
    /// both sides of a ratio.
    pub paired_speedups: Vec<f64>,
    /// Fractions of the decode time spent drafting and verifying.
    pub draft_share: f64,
    pub verify_share: f64,
    pub target_passes: usize,
    pub seq_rounds: usize,
    /// Accepted / drafted at draft depth 1, 2, …
    pub acceptance_by_depth: Vec<f64>,
    pub draft_errors: usize,
    /// Prompt lookup in front of the drafter: the shortest n-gram match
    /// (`--lookup N`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lookup: Option<usize>,
    /// Sequence-rounds drafted by prompt lookup instead of the model.
    #[serde(skip_serializing_if = "is_zero")]
    pub lookup_rounds: usize,
    /// What one speculative round (draft, verify, accept, commit of the
    /// whole batch) asked of the device, measured (`draftc_ops::counters`):
    /// launches, flushes, reads, uploads and allocations per round.
    pub launches_per_round: f64,
    pub flushes_per_round: f64,
    pub reads_per_round: f64,
    pub uploads_per_round: f64,
    pub allocations_per_round: f64,
    /// The speculative tokens equalled the autoregressive ones.
    pub lossless: bool,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The whole report (`spec.json`).
#[derive(Clone, Debug, Serialize)]
pub struct SpecReport {
    pub device: String,
    pub model: String,
    pub dtype: String,
    pub max_tokens: usize,
    pub points: Vec<SpecPoint>,
}

/// Greedy autoregressive decoding of every group: the tokens (the
/// reference) and the decode rate over all groups.
fn baseline<R: Runtime>(
    target: &mut TargetModel<R>,
    groups: &[Vec<Request>],
    max_tokens: usize,
) -> Result<(Vec<Vec<u32>>, f64), String> {
    let (mut tokens, mut generated, mut secs) = (Vec::new(), 0, 0.0);
    for requests in groups {
        let base = generate(
            target,
            requests,
            max_tokens,
            &Sampling::GREEDY,
            None,
            &mut |_, _| {},
        )
        .map_err(|e| e.to_string())?;
        generated += base.stats.generated_tokens;
        secs += base.stats.decode_s;
        tokens.extend(base.tokens);
    }
    Ok((tokens, generated as f64 / f64::max(secs, 1e-9)))
}

/// Another autoregressive run, which must give the reference tokens.
fn again<R: Runtime>(
    target: &mut TargetModel<R>,
    groups: &[Vec<Request>],
    max_tokens: usize,
    reference: &[Vec<u32>],
) -> Result<f64, String> {
    let (tokens, tps) = baseline(target, groups, max_tokens)?;
    if tokens != reference {
        return Err("autoregressive decoding is not deterministic".into());
    }
    Ok(tps)
}

pub use crate::speculation::median::{median, Middle};

/// Each run's speedup over the autoregressive rate at its time: `rates[i]`
/// ended at `at[i]`; autoregressive runs gave `ar[j]`, ending at `ar_at[j]`
/// (increasing). Between two autoregressive runs the rate is interpolated
/// linearly; before the first or after the last, the nearest one.
pub fn paired_speedups(rates: &[f64], at: &[f64], ar: &[f64], ar_at: &[f64]) -> Vec<f64> {
    rates
        .iter()
        .zip(at)
        .map(|(&rate, &t)| {
            let j = ar_at.partition_point(|&x| x <= t);
            let base = match (j.checked_sub(1), ar.get(j)) {
                (Some(i), Some(&next)) => {
                    let (t0, t1) = (ar_at[i], ar_at[j]);
                    let w = if t1 > t0 { (t - t0) / (t1 - t0) } else { 0.5 };
                    ar[i] + w * (next - ar[i])
                }
                (Some(i), None) => ar[i],
                (None, Some(&next)) => next,
                (None, None) => f64::NAN,
            };
            rate / base.max(1e-9)
        })
        .collect()
}

/// One timed run of a batch size's schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    /// An autoregressive run.
    Baseline,
    /// Configuration `config`'s timed run of repeat `rep` (in repeat 0
    /// after its warm-up).
    Run { rep: usize, config: usize },
}

/// The timed runs after the reference autoregressive run, for
/// configurations of drafters `groups` (each configuration's index in
/// `--drafter`, configurations of one drafter adjacent): every repeat runs
/// every configuration in order, with an autoregressive run before each
/// drafter's configurations (but the very first, which follows the
/// reference run). A configuration is thus at most one drafter's runs from
/// a baseline, not a whole repeat.
fn schedule(groups: &[usize], repeat: usize) -> Vec<Slot> {
    let mut slots = Vec::new();
    for rep in 0..repeat {
        for (config, &group) in groups.iter().enumerate() {
            let starts_group = config == 0 || groups[config - 1] != group;
            if starts_group && (rep > 0 || config > 0) {
                slots.push(Slot::Baseline);
            }
            slots.push(Slot::Run { rep, config });
        }
    }
    slots
}

/// One configuration over the repeats: its drafter, its policy and what
/// its runs measured.
struct Measured<R: Runtime> {
    label: String,
    /// Which of `--drafter` it runs (its index): a baseline is timed
    /// before each drafter's configurations.
    group: usize,
    choice: DrafterChoice,
    mode: &'static str,
    drafter: Box<dyn crate::engine::Drafter<R>>,
    weights: String,
    policy: crate::engine::DraftPolicy,
    /// Every run's counters, merged.
    stats: SpecStats,
    /// Tokens/s of each run, and when it ended (seconds).
    rates: Vec<f64>,
    at: Vec<f64>,
    lossless: bool,
}

impl<R: Runtime> Measured<R> {
    fn point(
        self,
        batch: usize,
        prompts: usize,
        base_tps: f64,
        ar_runs: &[f64],
        paired: Vec<f64>,
    ) -> SpecPoint {
        let s = &self.stats;
        let decode = s.decode_s.max(1e-9);
        let per_round = |n: u64| n as f64 / s.rounds.max(1) as f64;
        let tokens_per_s = median(&self.rates, Middle::Lower);
        SpecPoint {
            drafter: match self.choice.confidence {
                Some(c) => format!("{} confidence {c}", self.drafter.name()),
                None => self.drafter.name(),
            },
            confidence: self.choice.confidence.map(|c| c.to_string()),
            tree: self.choice.tree.as_ref().map(|t| t.to_string()),
            weights: self.weights,
            batch,
            prompts,
            budget: self.choice.budget,
            speculate: self.mode.into(),
            no_draft_share: s.no_draft_rounds as f64 / s.rounds.max(1) as f64,
            budget_histogram: s.budget_histogram.clone(),
            predicted_speedup: s.predicted_speedup,
            drafter_off_at: s.drafter_off_at,
            tau: s.tau(),
            k: s.k(),
            kappa: s.kappa(),
            tokens_per_s,
            runs: self.rates.clone(),
            autoregressive_tokens_per_s: base_tps,
            autoregressive_runs: ar_runs.to_vec(),
            speedup: median(&paired, Middle::Lower),
            paired_speedups: paired,
            draft_share: s.draft_s / decode,
            verify_share: s.verify_s / decode,
            target_passes: s.target_passes,
            seq_rounds: s.seq_rounds,
            acceptance_by_depth: s.acceptance_by_depth(),
            draft_errors: s.draft_errors,
            lookup: self.choice.lookup,
            lookup_rounds: s.lookup_rounds,
            launches_per_round: per_round(s.round_counts.launches),
            flushes_per_round: per_round(s.round_counts.flushes),
            reads_per_round: per_round(s.round_counts.reads),
            uploads_per_round: per_round(s.round_counts.uploads),
            allocations_per_round: per_round(s.round_counts.allocations),
            lossless: self.lossless,
        }
    }
}

/// What `bench spec` cannot run: no batch, prompt, drafter or budget, a
/// zero, no repeat, neither fixed budgets nor auto.
fn check_config(cfg: &SpecConfig) -> Result<(), String> {
    if cfg.batches.is_empty() || cfg.batches.contains(&0) || cfg.max_tokens == 0 {
        return Err("give batch sizes >= 1 and --max-tokens >= 1".into());
    }
    if cfg.prompts.is_empty() {
        return Err("no prompts".into());
    }
    if cfg.drafters.is_empty() || cfg.budgets.is_empty() || cfg.budgets.contains(&0) {
        return Err("give at least one drafter and budgets >= 1".into());
    }
    if cfg.repeat == 0 {
        return Err("--repeat must be at least 1".into());
    }
    if !cfg.fixed && !cfg.auto {
        return Err("measure fixed budgets, auto, or both".into());
    }
    Ok(())
}

/// One configuration to measure: drafter `choice` (the `group`-th of the
/// run) at `budget`, planned or fixed, built once for all its repeats.
#[allow(clippy::too_many_arguments)]
fn measured<R: Runtime>(
    client: &ComputeClient<R>,
    model: &ConvertedModel,
    target: &TargetModel<R>,
    cfg: &SpecConfig,
    choice: &DrafterChoice,
    group: usize,
    budget: usize,
    planned: bool,
) -> Result<Measured<R>, String> {
    let choice = DrafterChoice {
        budget,
        ..choice.clone()
    };
    let mode = if planned { "auto" } else { "fixed" };
    let built = make_drafter(client, &choice, model, target, cfg.dtype)?;
    let policy = crate::cli::generate::speculate_policy(mode, budget, choice.concurrent)?;
    Ok(Measured {
        label: format!("{} budget {budget} {mode}", choice.name),
        group,
        choice,
        mode,
        drafter: built.drafter,
        weights: built.weights,
        policy,
        stats: SpecStats::default(),
        rates: Vec::new(),
        at: Vec::new(),
        lossless: true,
    })
}

impl<R: Runtime> Measured<R> {
    /// One timed run over every group of prompts: its decode rate, its
    /// stats, and whether its tokens are the autoregressive ones.
    fn measure(
        &mut self,
        target: &mut TargetModel<R>,
        groups: &[Vec<Request>],
        max_tokens: usize,
        base_tokens: &[Vec<u32>],
    ) -> Result<(), String> {
        let mut s = SpecStats::default();
        let mut tokens = Vec::new();
        for requests in groups {
            let spec = generate_with_policy(
                target,
                self.drafter.as_mut(),
                requests,
                max_tokens,
                &Sampling::GREEDY,
                &mut self.policy,
                None,
                &mut |_, _| {},
            )
            .map_err(|e| e.to_string())?;
            s.merge(&spec.stats);
            tokens.extend(spec.tokens);
        }
        self.rates.push(s.decode_tokens_per_s());
        self.lossless &= tokens == base_tokens;
        self.stats.merge(&s);
        Ok(())
    }
}

const RAW_TURNS: &str = "--raw: every prompt must be a single user turn (raw text has no roles)";

/// Runs every configuration of `cfg`.
pub fn run_spec<R: Runtime>(
    client: &ComputeClient<R>,
    model: &ConvertedModel,
    cfg: &SpecConfig,
    progress: &Progress,
) -> Result<SpecReport, String> {
    check_config(cfg)?;
    let err = |e: EngineError| e.to_string();
    let max_b = *cfg.batches.iter().max().unwrap_or(&1);
    let count = |b: usize| cfg.prompt_count.unwrap_or(b).max(b).div_ceil(b) * b;
    let n_prompts = cfg.batches.iter().map(|&b| count(b)).max().unwrap_or(1);
    if !cfg.raw && model.tokenizer.chat_template().is_none() {
        return Err(format!(
            "{} has no chat template (tokenizer_config.json's chat_template): pass --raw to give \
             the prompts as plain text (a base model)",
            model.dir.display()
        ));
    }
    let mut prompts = Vec::with_capacity(n_prompts);
    for i in 0..n_prompts {
        let conv = &cfg.prompts[i % cfg.prompts.len().max(1)];
        let ids = match (cfg.raw, conv.as_slice()) {
            (false, _) => model.tokenizer.encode_chat(conv),
            (true, [m]) if m.role == "user" => model.tokenizer.encode(&m.content),
            (true, _) => return Err(RAW_TURNS.into()),
        }
        .map_err(|e| e.to_string())?;
        prompts.push(ids);
    }
    let capacity = prompts.iter().map(Vec::len).max().unwrap_or(0) + cfg.max_tokens + 2;
    progress.message(&format!("loading {} …", model.dir.display()));
    let mut target = TargetModel::load(client, model, max_b, capacity, cfg.dtype).map_err(err)?;
    // (budget, planned) per run of a drafter: each fixed budget, then auto
    // up to the largest.
    let budgets_of = |c: &DrafterChoice| {
        let budgets = match c.budget {
            0 => cfg.budgets.clone(),
            b => vec![b],
        };
        let mut runs: Vec<(usize, bool)> = Vec::new();
        if cfg.fixed {
            runs.extend(budgets.iter().map(|&k| (k, false)));
        }
        if cfg.auto {
            runs.push((budgets.iter().copied().max().unwrap_or(1), true));
        }
        runs
    };
    let runs: usize = cfg.drafters.iter().map(|c| budgets_of(c).len()).sum();
    let repeat = cfg.repeat;
    // Per batch and repeat: a baseline before each drafter's runs.
    let total = cfg.batches.len() * (cfg.drafters.len() + runs) * repeat;
    let mut done = 0;
    let mut points = Vec::new();
    for &b in &cfg.batches {
        // Consecutive groups of `b` prompts; one measurement over all.
        let groups: Vec<Vec<Request>> = prompts[..count(b)]
            .chunks(b)
            .map(|g| g.iter().map(|p| Request { prompt: p.clone() }).collect())
            .collect();
        progress.step(done, total, &format!("batch {b}: autoregressive baseline"));
        generate(
            &mut target,
            &groups[0],
            2,
            &Sampling::GREEDY,
            None,
            &mut |_, _| {},
        )
        .map_err(err)?;
        let (base_tokens, first_tps) = baseline(&mut target, &groups, cfg.max_tokens)?;
        let clock = std::time::Instant::now();
        let mut ar_runs = vec![first_tps];
        // When each autoregressive run ended (seconds on `clock`).
        let mut ar_at = vec![0.0];
        done += 1;
        // Every configuration keeps its drafter and policy over the
        // repeats (a planner goes on learning, as in a server).
        let mut configs: Vec<Measured<R>> = Vec::new();
        for (group, choice) in cfg.drafters.iter().enumerate() {
            for (budget, planned) in budgets_of(choice) {
                configs.push(measured(
                    client, model, &target, cfg, choice, group, budget, planned,
                )?);
            }
        }
        let groups_of: Vec<usize> = configs.iter().map(|m| m.group).collect();
        for slot in schedule(&groups_of, repeat) {
            let (rep, m) = match slot {
                Slot::Baseline => {
                    progress.step(
                        done,
                        total,
                        &format!("batch {b}: autoregressive baseline ({})", ar_runs.len() + 1),
                    );
                    ar_runs.push(again(&mut target, &groups, cfg.max_tokens, &base_tokens)?);
                    ar_at.push(clock.elapsed().as_secs_f64());
                    done += 1;
                    continue;
                }
                Slot::Run { rep, config } => (rep, &mut configs[config]),
            };
            let of = if repeat > 1 {
                format!(" (run {} of {repeat})", rep + 1)
            } else {
                String::new()
            };
            progress.step(done, total, &format!("batch {b}: {}{of}", m.label));
            if rep == 0 {
                // Warm-up on the first group: every shape compiles
                // here, and a planned run measures its start-up costs.
                warm_up(
                    &mut target,
                    m.drafter.as_mut(),
                    &groups[0],
                    &Sampling::GREEDY,
                    &mut m.policy,
                )
                .map_err(err)?;
            }
            m.measure(&mut target, &groups, cfg.max_tokens, &base_tokens)?;
            m.at.push(clock.elapsed().as_secs_f64());
            done += 1;
        }
        // A last baseline after the drafters: a noisy host (lavapipe
        // shares its cores) shows as different rates; speedups are over
        // their median.
        if !configs.is_empty() {
            progress.message(&format!("batch {b}: autoregressive baseline again"));
            ar_runs.push(again(&mut target, &groups, cfg.max_tokens, &base_tokens)?);
            ar_at.push(clock.elapsed().as_secs_f64());
        }
        let base_tps = median(&ar_runs, Middle::Upper);
        for m in configs {
            let paired = paired_speedups(&m.rates, &m.at, &ar_runs, &ar_at);
            points.push(m.point(b, count(b), base_tps, &ar_runs, paired));
        }
    }
    progress.finish();
    Ok(SpecReport {
        device: super::device_name(client),
        model: model.dir.display().to_string(),
        dtype: cfg.dtype.name().into(),
        max_tokens: cfg.max_tokens,
        points,
    })
}

impl SpecReport {
    /// The markdown table `draftc bench spec` prints.
    pub fn table(&self) -> String {
        let mut s = format!(
            "## speculative vs autoregressive decoding — {}, {}, {} new tokens per sequence\n\n\
             | drafter | weights | batch | prompts | budget | τ | k | κ | tokens/s | AR tokens/s | speedup | draft % | verify % | acceptance by depth | planned: no draft % · predicted speedup | launches / flushes / reads / uploads / allocs per round | lossless |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
            self.device, self.dtype, self.max_tokens
        );
        for p in &self.points {
            let depth: Vec<String> = p
                .acceptance_by_depth
                .iter()
                .take(6)
                .map(|a| format!("{a:.2}"))
                .collect();
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2}x | {:.0} | {:.0} | {} | {} | {:.0} / {:.1} / {:.1} / {:.0} / {:.0} | {} |\n",
                p.drafter,
                p.weights,
                p.batch,
                p.prompts,
                p.budget_label(),
                p.tau,
                p.k,
                p.kappa,
                p.tokens_per_s,
                p.autoregressive_tokens_per_s,
                p.speedup,
                100.0 * p.draft_share,
                100.0 * p.verify_share,
                depth.join(" "),
                match (p.speculate.as_str(), p.predicted_speedup) {
                    ("auto", x) => format!(
                        "{:.0} · {}{}",
                        100.0 * p.no_draft_share,
                        x.map_or("-".into(), |x| format!("{x:.2}x")),
                        p.drafter_off_at
                            .map_or(String::new(), |r| format!(" · off from round {r}"))
                    ),
                    _ => "-".into(),
                },
                p.launches_per_round,
                p.flushes_per_round,
                p.reads_per_round,
                p.uploads_per_round,
                p.allocations_per_round,
                if p.lossless { "yes" } else { "NO" },
            ));
        }
        s
    }

    /// Per drafter and batch size with an `auto` run: auto's speedup
    /// against the best of autoregressive decoding (1.0x) and every fixed
    /// budget measured beside it, and whether it meets issue 34's bars
    /// (at least 0.95 of that best, at least 0.97x of autoregressive).
    /// Empty without auto runs.
    pub fn auto_summary(&self) -> String {
        let same = |a: &SpecPoint, b: &SpecPoint| {
            a.drafter == b.drafter && a.batch == b.batch && a.tree == b.tree && a.lookup == b.lookup
        };
        let mut rows = Vec::new();
        let (mut near, mut above) = (0, 0);
        for auto in self.points.iter().filter(|p| p.speculate == "auto") {
            let fixed: Vec<&SpecPoint> = self
                .points
                .iter()
                .filter(|p| p.speculate == "fixed" && same(p, auto))
                .collect();
            let best = fixed.iter().map(|p| p.speedup).fold(1.0f64, f64::max);
            let ratio = auto.speedup / best;
            near += usize::from(ratio >= 0.95);
            above += usize::from(auto.speedup >= 0.97);
            let fixed: Vec<String> = fixed
                .iter()
                .map(|p| format!("{}: {:.2}x", p.budget, p.speedup))
                .collect();
            rows.push(format!(
                "| {} | {} | {} | {:.2}x | {:.2}x | {:.2} | {} | {} |\n",
                auto.drafter,
                auto.batch,
                fixed.join(", "),
                auto.speedup,
                best,
                ratio,
                if ratio >= 0.95 { "yes" } else { "NO" },
                if auto.speedup >= 0.97 { "yes" } else { "NO" },
            ));
        }
        if rows.is_empty() {
            return String::new();
        }
        format!(
            "\n## auto against the best of autoregressive and the fixed budgets\n\n\
             | drafter | batch | fixed | auto | best | auto / best | ≥ 0.95 best | ≥ 0.97x AR |\n\
             |---|---|---|---|---|---|---|---|\n{}\n\
             auto ≥ 0.95 × best in {near} of {n}; auto ≥ 0.97x autoregressive in {above} of {n}\n",
            rows.concat(),
            n = rows.len()
        )
    }

    /// Whether every configuration reproduced the autoregressive output.
    pub fn all_lossless(&self) -> bool {
        self.points.iter().all(|p| p.lossless)
    }

    /// Three panels: speedup and τ against batch size (one series per
    /// drafter and budget), and acceptance per draft depth at the smallest
    /// batch size.
    pub fn write_svg(&self, path: &std::path::Path) -> Result<(), String> {
        use crate::plot::{Panel, Series};
        let mut keys: Vec<(String, String)> = Vec::new();
        for p in &self.points {
            let key = (p.drafter.clone(), p.budget_label());
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        let series = |f: &dyn Fn(&SpecPoint) -> f64| -> Vec<Series> {
            keys.iter()
                .map(|(d, k)| Series {
                    label: format!("{d}, budget {k}"),
                    points: self
                        .points
                        .iter()
                        .filter(|p| &p.drafter == d && &p.budget_label() == k)
                        .map(|p| (p.batch as f64, f(p)))
                        .collect(),
                })
                .collect()
        };
        let smallest = self.points.iter().map(|p| p.batch).min().unwrap_or(1);
        let depth_series =
            keys.iter()
                .filter_map(|(d, k)| {
                    let p = self.points.iter().find(|p| {
                        &p.drafter == d && &p.budget_label() == k && p.batch == smallest
                    })?;
                    Some(Series {
                        label: format!("{d}, budget {k}"),
                        points: p
                            .acceptance_by_depth
                            .iter()
                            .enumerate()
                            .map(|(i, &a)| ((i + 1) as f64, a))
                            .collect(),
                    })
                })
                .collect();
        let panels = [
            self.predicted_panel(),
            Panel {
                title: "speedup over autoregressive (same backend)".into(),
                x_label: "batch size".into(),
                y_label: "speedup (x)".into(),
                log_x: true,
                series: series(&|p| p.speedup),
                reference: Some((1.0, "autoregressive".into())),
            },
            Panel {
                title: "tau: tokens per sequence-round".into(),
                x_label: "batch size".into(),
                y_label: "tau".into(),
                log_x: true,
                series: series(&|p| p.tau),
                reference: Some((1.0, "no draft accepted".into())),
            },
            Panel {
                title: format!("acceptance by draft depth (batch {smallest})"),
                x_label: "draft depth".into(),
                y_label: "accepted / drafted".into(),
                log_x: false,
                series: depth_series,
                reference: None,
            },
        ];
        let panels: Vec<Panel> = panels
            .into_iter()
            .filter(|p| !p.series.is_empty())
            .collect();
        crate::plot::write_svg(
            path,
            &format!("draftc bench spec — {}", self.device),
            &panels,
        )
    }

    /// Auto runs: the speedup the planner predicted against the measured
    /// one, a point per drafter and batch, beside the line `y = x`.
    fn predicted_panel(&self) -> crate::plot::Panel {
        use crate::plot::{Panel, Series};
        let mut series: Vec<Series> = Vec::new();
        for p in self.points.iter().filter(|p| p.speculate == "auto") {
            let Some(x) = p.predicted_speedup else {
                continue;
            };
            let label = format!("{} (auto)", p.drafter);
            match series.iter_mut().find(|s| s.label == label) {
                Some(s) => s.points.push((x, p.speedup)),
                None => series.push(Series {
                    label,
                    points: vec![(x, p.speedup)],
                }),
            }
        }
        for s in &mut series {
            s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        if !series.is_empty() {
            let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
            let (lo, hi) = xs.fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(x), h.max(x)));
            series.push(Series {
                label: "predicted = measured".into(),
                points: vec![(lo, lo), (hi, hi)],
            });
        }
        Panel {
            title: "planner: predicted vs measured speedup".into(),
            x_label: "predicted speedup (x)".into(),
            y_label: "measured speedup (x)".into(),
            log_x: false,
            series,
            reference: Some((1.0, "autoregressive".into())),
        }
    }
}

impl SpecPoint {
    /// The budget as the table prints it: `3`, `3 chain`, `auto ≤ 3`.
    pub fn budget_label(&self) -> String {
        let k = match self.speculate.as_str() {
            "auto" => format!("auto ≤ {}", self.budget),
            _ => self.budget.to_string(),
        };
        match &self.tree {
            Some(t) => format!("{k} {t}"),
            None => k,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_baseline_runs_before_each_drafters_runs_in_every_repeat() {
        use Slot::{Baseline as B, Run};
        let r = |rep, config| Run { rep, config };
        // Two drafters: three configurations, then two; two repeats.
        let got = schedule(&[0, 0, 0, 1, 1], 2);
        let want = [
            r(0, 0),
            r(0, 1),
            r(0, 2),
            B,
            r(0, 3),
            r(0, 4),
            B,
            r(1, 0),
            r(1, 1),
            r(1, 2),
            B,
            r(1, 3),
            r(1, 4),
        ];
        assert_eq!(got, want);
        // One drafter, one repeat: no baseline beyond the reference run.
        assert_eq!(schedule(&[0, 0], 1), [r(0, 0), r(0, 1)]);
        // The progress count: a baseline per drafter and repeat, the
        // reference run standing for the first.
        let baselines = schedule(&[0, 1, 2, 3], 3)
            .iter()
            .filter(|s| **s == B)
            .count();
        assert_eq!(baselines + 1, 4 * 3);
    }

    #[test]
    fn a_run_is_paired_with_the_baseline_of_its_time() {
        // Autoregressive 10 tokens/s at t = 0, 8 at t = 10 (the host slowed
        // down), 8 at t = 20.
        let (ar, ar_at) = ([10.0, 8.0, 8.0], [0.0, 10.0, 20.0]);
        let got = paired_speedups(&[9.0, 8.0, 4.0, 8.0], &[5.0, 15.0, 25.0, 0.0], &ar, &ar_at);
        let want = [1.0, 1.0, 0.5, 0.8];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?}");
        }
    }
}
