//! Speculative generation over a static batch (docs/speculative.md, "The round"): the draft
//! policy ([`DraftPolicy`]: a fixed budget or the planner's per round), the
//! run's statistics ([`SpecStats`]: τ, k, κ, acceptance by depth, the
//! planner's budgets), the warm-up that compiles a run's kernels and seeds
//! the planner's costs ([`warm_up`]), and [`generate_with_policy`], the
//! engine's static run with a drafter. Every round, for every unfinished
//! sequence (`rounds.rs`):
//!
//! 1. **draft**: the [`Drafter`] proposes a tree (capped to the per-sequence
//!    budget; out-of-vocabulary nodes are dropped with their subtrees);
//! 2. **verify**: one target pass over `[last token, tree nodes…]` of all
//!    sequences with the tree mask (positions `committed + depth`);
//! 3. **accept**: the longest path whose tokens equal the target's own
//!    choice at their parents (its argmax, or its sample keyed by the
//!    sequence's seed and the position), then the bonus token;
//! 4. **commit**: the accepted path's KV rows are compacted next to the
//!    committed prefix, the bonus token becomes the next "last token";
//!    the drafter observes the committed rows (hidden-state taps).
//!
//! Every round emits at least one token (the bonus), so a useless or faulty
//! drafter degrades to autoregressive decoding, never to a wrong output.

use cubecl::prelude::*;

use super::drafters::Drafter;
use super::rounds::Parts;
use super::select::Sampling;
use super::static_run::{run_static, Stops};
use super::target::{EngineError, TargetModel};
use super::Request;
use crate::speculation::median::{median, Middle};
use crate::speculation::{DraftTree, PlanMode, Planner, PlannerConfig};

/// How a speculative run sizes each round's draft.
#[derive(Clone, Debug)]
pub enum DraftPolicy {
    /// The same budget for every sequence in every round (`--speculate fixed`).
    Fixed(usize),
    /// Per round and sequence, down to no draft, by the [`Planner`]
    /// (`--speculate auto`): its costs and estimates carry over between
    /// runs that share the policy.
    Planned(Box<Planner>),
}

impl DraftPolicy {
    /// `--speculate auto` with drafts of at most `max_budget` tokens.
    pub fn auto(max_budget: usize) -> Result<DraftPolicy, EngineError> {
        Planner::new(PlannerConfig::auto(max_budget))
            .map(|p| DraftPolicy::Planned(Box::new(p)))
            .map_err(|e| EngineError::Invalid(e.to_string()))
    }

    /// The largest budget a round may get.
    pub fn max_budget(&self) -> usize {
        match self {
            DraftPolicy::Fixed(b) => *b,
            DraftPolicy::Planned(p) => p.config().max_budget,
        }
    }
}

/// Round statistics of a speculative run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    pub sequences: usize,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Verification rounds summed over sequences.
    pub seq_rounds: usize,
    /// Target passes (prefill chunks included).
    pub target_passes: usize,
    /// Draft tokens proposed (tree nodes) and accepted.
    pub drafted: usize,
    pub accepted: usize,
    /// The drafter's chain length `l`.
    pub draft_len: usize,
    pub prefill_s: f64,
    pub decode_s: f64,
    pub draft_s: f64,
    pub verify_s: f64,
    /// Rounds whose drafter failed (each became a plain decoding step) and
    /// the last failure.
    pub draft_errors: usize,
    pub last_draft_error: Option<String>,
    /// Per draft depth `j` (0 = the first drafted token): sequence-rounds
    /// whose tree had a node at depth `j`, and those that accepted one.
    pub depth_drafted: Vec<usize>,
    pub depth_accepted: Vec<usize>,
    /// Sequence-rounds drafted by prompt lookup instead of the model
    /// drafter (`--lookup`; 0 otherwise).
    pub lookup_rounds: usize,
    /// Rounds (batch-wide, not per sequence) and what they asked of the
    /// device in all, measured (`draftc_ops::counters`, this thread only: a
    /// concurrent drafter's thread is not counted).
    pub rounds: usize,
    pub round_counts: draftc_ops::counters::Counts,
    /// Planned runs (`--speculate auto`): sequence-rounds per draft budget
    /// `0..=max`, rounds with no drafter call, and the speedup the planner
    /// predicted for the rounds it planned (over its own no-draft round).
    pub budget_histogram: Vec<usize>,
    pub no_draft_rounds: usize,
    pub predicted_speedup: Option<f64>,
    /// The round from which the planner kept the drafter off (0: the whole
    /// run), when it did.
    pub drafter_off_at: Option<usize>,
}

impl SpecStats {
    /// τ: mean tokens emitted per sequence per round (accepted + bonus).
    pub fn tau(&self) -> f64 {
        (self.accepted + self.seq_rounds) as f64 / self.seq_rounds.max(1) as f64
    }

    /// Mean draft tokens per sequence per round (`k`).
    pub fn k(&self) -> f64 {
        self.drafted as f64 / self.seq_rounds.max(1) as f64
    }

    /// κ = a·l/k (paper 000): mean accepted draft tokens `a` per round,
    /// scaled by the draft length over the draft tokens spent.
    pub fn kappa(&self) -> f64 {
        let a = self.accepted as f64 / self.seq_rounds.max(1) as f64;
        a * self.draft_len as f64 / self.k().max(1e-9)
    }

    pub fn decode_tokens_per_s(&self) -> f64 {
        self.generated_tokens as f64 / self.decode_s.max(1e-9)
    }

    /// Adds the counters and times of another run (of other sequences).
    pub fn merge(&mut self, o: &SpecStats) {
        self.sequences += o.sequences;
        self.prompt_tokens += o.prompt_tokens;
        self.generated_tokens += o.generated_tokens;
        self.seq_rounds += o.seq_rounds;
        self.target_passes += o.target_passes;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.draft_len = self.draft_len.max(o.draft_len);
        self.prefill_s += o.prefill_s;
        self.decode_s += o.decode_s;
        self.draft_s += o.draft_s;
        self.verify_s += o.verify_s;
        self.draft_errors += o.draft_errors;
        self.lookup_rounds += o.lookup_rounds;
        self.rounds += o.rounds;
        self.no_draft_rounds += o.no_draft_rounds;
        self.round_counts = self.round_counts.plus(&o.round_counts);
        if o.predicted_speedup.is_some() {
            self.predicted_speedup = o.predicted_speedup;
        }
        if self.drafter_off_at.is_none() {
            self.drafter_off_at = o.drafter_off_at;
        }
        if o.last_draft_error.is_some() {
            self.last_draft_error.clone_from(&o.last_draft_error);
        }
        for (mine, theirs) in [
            (&mut self.depth_drafted, &o.depth_drafted),
            (&mut self.depth_accepted, &o.depth_accepted),
            (&mut self.budget_histogram, &o.budget_histogram),
        ] {
            if mine.len() < theirs.len() {
                mine.resize(theirs.len(), 0);
            }
            for (m, t) in mine.iter_mut().zip(theirs) {
                *m += t;
            }
        }
    }

    /// Acceptance rate per draft position: accepted / drafted at depth `j`.
    pub fn acceptance_by_depth(&self) -> Vec<f64> {
        self.depth_drafted
            .iter()
            .zip(&self.depth_accepted)
            .map(|(&d, &a)| a as f64 / d.max(1) as f64)
            .collect()
    }
}

/// Output of [`generate_speculative`].
#[derive(Clone, Debug, Default)]
pub struct SpecGeneration {
    pub tokens: Vec<Vec<u32>>,
    pub stats: SpecStats,
}

/// Drops nodes whose token is outside the vocabulary (and their subtrees),
/// then keeps the best `budget` nodes.
pub(super) fn sanitize(tree: DraftTree, vocab: usize, budget: usize) -> DraftTree {
    let mut out = DraftTree::new();
    let mut map: Vec<Option<usize>> = vec![None; tree.len()];
    for (i, n) in tree.nodes().iter().enumerate() {
        let parent_ok = n.parent.is_none_or(|p| map[p].is_some());
        if (n.token as usize) < vocab && parent_ok {
            let parent = n.parent.and_then(|p| map[p]);
            if let Ok(j) = out.push(parent, n.token, n.logprob) {
                map[i] = Some(j);
            }
        }
    }
    out.prune_to_best(budget)
}

/// Speculative generation: same contract as [`super::generate`] — with
/// greedy sampling the tokens are exactly those of autoregressive decoding.
/// `budget`: draft tokens per sequence per round at most.
#[allow(clippy::too_many_arguments)]
pub fn generate_speculative<R: Runtime>(
    target: &mut TargetModel<R>,
    drafter: &mut dyn Drafter<R>,
    requests: &[Request],
    max_tokens: usize,
    sampling: &Sampling,
    budget: usize,
    stop: impl Into<Stops>,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<SpecGeneration, EngineError> {
    generate_with_policy(
        target,
        drafter,
        requests,
        max_tokens,
        sampling,
        &mut DraftPolicy::Fixed(budget),
        stop,
        on_token,
    )
}

/// Compiles the kernels a run of `requests` will use before anything is
/// timed: a speculative run on the same prompts that cycles the whole batch
/// through no draft, one token, the middle and the largest budget of
/// `policy`, then two autoregressive steps. The kernels' shapes depend on
/// the rows of each pass (the prompt's first drafter pass, every verify
/// width), so a warm-up on other prompts leaves some to compile inside the
/// timed run (on lavapipe with an empty shader cache, seconds).
///
/// A planned policy takes the warm-up's cost measurements (each shape's
/// first, compiling, round is discarded by the planner's tables), so its
/// timed run plans from its first round: the start-up calibration.
pub fn warm_up<R: Runtime>(
    target: &mut TargetModel<R>,
    drafter: &mut dyn Drafter<R>,
    requests: &[Request],
    sampling: &Sampling,
    policy: &mut DraftPolicy,
) -> Result<(), EngineError> {
    let cfg = PlannerConfig {
        mode: PlanMode::Cycle,
        ..PlannerConfig::auto(policy.max_budget().max(1))
    };
    // No more tokens than the caches hold after the longest prompt (the
    // run's own --max-tokens sized them): a short run's warm-up visits
    // fewer shapes instead of failing with a full cache.
    let longest = requests.iter().map(|r| r.prompt.len()).max().unwrap_or(0);
    let room = target.caches.capacity().saturating_sub(longest);
    let tokens: usize = (cfg.warm_budgets().iter().map(|k| k + 1).sum::<usize>() + 1).min(room);
    let mut cycle = DraftPolicy::Planned(Box::new(
        Planner::new(cfg).map_err(|e| EngineError::Invalid(e.to_string()))?,
    ));
    generate_with_policy(
        target,
        drafter,
        requests,
        tokens,
        sampling,
        &mut cycle,
        None,
        &mut |_, _| {},
    )?;
    // Rounds that draft one token every round: the drafter then meets the
    // one or two new rows a round commits (the cycle's rounds without a
    // draft leave it more), whose kernel variants (a lane linear's row
    // block) would otherwise compile inside the timed run.
    if policy.max_budget() > 0 {
        let steady = 8.min(room);
        generate_with_policy(
            target,
            drafter,
            requests,
            steady,
            sampling,
            &mut DraftPolicy::Fixed(1),
            None,
            &mut |_, _| {},
        )?;
    }
    // The plain decoder at this batch: compiled for the baseline, and, for
    // a planner, timed: its drafter-off choice runs it (the engine's
    // no-draft round also feeds the drafter and keeps its books, and can
    // cost more: docs/bench/cuda-h200/2026-11-27c).
    let plain_tokens = match policy {
        DraftPolicy::Planned(_) => PLAIN_STEPS.min(room).max(2),
        DraftPolicy::Fixed(_) => 2,
    };
    let plain = super::generate(
        target,
        requests,
        plain_tokens,
        sampling,
        None,
        &mut |_, _| {},
    )?;
    if let (DraftPolicy::Planned(p), DraftPolicy::Planned(w)) = (policy, &mut cycle) {
        if let Some(t) = plain_step(&plain.stats.decode_pass_s) {
            w.observe_plain_step(requests.len(), t);
        }
        p.adopt_costs(w);
    }
    Ok(())
}

/// Tokens the warm-up's plain decoder makes: its first decode pass may
/// compile (a run without a baseline before it), the others are timed.
const PLAIN_STEPS: usize = 5;

/// The median of the decode passes after the first (`None` with fewer than
/// two after it).
fn plain_step(passes: &[f64]) -> Option<f64> {
    let t: Vec<f64> = passes
        .iter()
        .skip(1)
        .copied()
        .filter(|x| x.is_finite())
        .collect();
    (t.len() >= 2).then(|| median(&t, Middle::Lower))
}

/// [`generate_speculative`] with each round's draft sized by `policy`: the
/// engine's static run with a drafter (`static_run.rs`); a planner judges
/// the batch when it starts and the run when it ends (`Planner::end_run`).
#[allow(clippy::too_many_arguments)]
pub fn generate_with_policy<R: Runtime>(
    target: &mut TargetModel<R>,
    drafter: &mut dyn Drafter<R>,
    requests: &[Request],
    max_tokens: usize,
    sampling: &Sampling,
    policy: &mut DraftPolicy,
    stop: impl Into<Stops>,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<SpecGeneration, EngineError> {
    let b = requests.len();
    let (hist0, no_draft0) = match policy {
        DraftPolicy::Planned(p) => (p.histogram().to_vec(), p.no_draft_rounds()),
        DraftPolicy::Fixed(_) => (Vec::new(), 0),
    };
    let lookups_before = drafter.lookup_rounds().map_or(0, |c| c.by_lookup);
    let mut cx = Parts {
        target,
        drafter: Some(&mut *drafter),
        policy: &mut *policy,
    };
    let stop = stop.into();
    let run = run_static(&mut cx, requests, max_tokens, sampling, stop, on_token)?;
    let e = &run.stats;
    let mut stats = SpecStats {
        sequences: b,
        prompt_tokens: requests.iter().map(|r| r.prompt.len()).sum(),
        generated_tokens: run.tokens.iter().map(Vec::len).sum(),
        seq_rounds: e.seq_rounds,
        target_passes: e.rounds,
        drafted: e.drafted,
        accepted: e.accepted,
        draft_len: drafter.length(),
        prefill_s: run.prefill_s,
        decode_s: run.decode_s,
        draft_s: e.draft_s,
        verify_s: e.verify_s,
        draft_errors: e.draft_errors,
        last_draft_error: e.last_draft_error.clone(),
        depth_drafted: e.depth_drafted.clone(),
        depth_accepted: e.depth_accepted.clone(),
        lookup_rounds: drafter.lookup_rounds().map_or(0, |c| c.by_lookup) - lookups_before,
        rounds: run.decode_rounds.len(),
        round_counts: run
            .decode_rounds
            .iter()
            .fold(Default::default(), |a, r| a.plus(&r.counts)),
        no_draft_rounds: e.no_draft_rounds,
        drafter_off_at: run.off_round(),
        ..SpecStats::default()
    };
    if let DraftPolicy::Planned(p) = policy {
        stats.budget_histogram = p
            .histogram()
            .iter()
            .enumerate()
            .map(|(k, &n)| n - hist0.get(k).copied().unwrap_or(0))
            .collect();
        stats.no_draft_rounds = p.no_draft_rounds() - no_draft0;
        stats.predicted_speedup = p.predicted_speedup(b);
        let lengths: Vec<usize> = run.tokens.iter().map(Vec::len).collect();
        let plain = p.end_run(&lengths, stats.decode_s);
        if std::env::var_os("DRAFTC_PLAN_DEBUG").is_some() {
            eprintln!("{}", p.describe(b));
            if let Some(plain) = plain {
                eprintln!(
                    "planner: run of {b} sequences {:.3} s, the plain decoder's estimate {plain:.3} s{}",
                    stats.decode_s,
                    if p.is_off(b) { ": drafter off" } else { "" }
                );
            }
        }
    }
    Ok(SpecGeneration {
        tokens: run.tokens,
        stats,
    })
}
