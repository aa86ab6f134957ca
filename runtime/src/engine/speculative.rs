//! The speculative decoding loop (DESIGN.md §6), batched: every round,
//! for every unfinished sequence,
//!
//! 1. **draft**: the [`Drafter`] proposes a tree (capped to the per-sequence
//!    budget; out-of-vocabulary nodes are dropped with their subtrees);
//! 2. **verify**: one target pass over `[last token, tree nodes…]` of all
//!    sequences with the tree mask (positions `committed + depth`);
//! 3. **accept**: greedy (the longest path whose tokens equal the target's
//!    argmax, host side) or lossless speculative sampling (`ops::tree`
//!    kernel, deterministic drafts: `q` one-hot);
//! 4. **commit**: the accepted path's KV rows are compacted next to the
//!    committed prefix, the bonus token becomes the next "last token";
//!    the drafter observes the committed rows (hidden-state taps).
//!
//! Every round emits at least one token (the bonus), so a useless or faulty
//! drafter degrades to autoregressive decoding, never to a wrong output.

use std::time::Instant;

use cubecl::prelude::*;
use draftc_ops::tree::{accept_tree, AcceptMode};
use draftc_ops::DeviceTensor;

use super::drafters::{Committed, Drafter, SeqView};
use super::select::{select_tokens, select_tokens_into, Sampling, SelectOut};
use super::target::{EngineError, TargetModel};
use super::Request;
use crate::exec::{SeqStep, Step};
use crate::spec::median::{median, Middle};
use crate::spec::{DraftTree, PlanMode, Planner, PlannerConfig};

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
    stop: Option<u32>,
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

/// [`generate_speculative`] with each round's draft sized by `policy`.
#[allow(clippy::too_many_arguments)]
pub fn generate_with_policy<R: Runtime>(
    target: &mut TargetModel<R>,
    drafter: &mut dyn Drafter<R>,
    requests: &[Request],
    max_tokens: usize,
    sampling: &Sampling,
    policy: &mut DraftPolicy,
    stop: Option<u32>,
    on_token: &mut dyn FnMut(usize, u32),
) -> Result<SpecGeneration, EngineError> {
    sampling.validate()?;
    if !sampling.is_greedy() && (sampling.top_k != 0 || sampling.top_p < 1.0) {
        return Err(EngineError::Invalid(
            "speculative sampling preserves the temperature-scaled distribution; top-k / top-p \
             are supported with --no-spec only"
                .into(),
        ));
    }
    let b = requests.len();
    if b > target.caches.slots() {
        return Err(EngineError::Invalid(format!(
            "{b} sequences but the caches were sized for {}",
            target.caches.slots()
        )));
    }
    let mut stats = SpecStats {
        sequences: b,
        prompt_tokens: requests.iter().map(|r| r.prompt.len()).sum(),
        draft_len: drafter.length(),
        ..SpecStats::default()
    };
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); b];
    if b == 0 || max_tokens == 0 {
        return Ok(SpecGeneration { tokens: out, stats });
    }
    // A planner cuts drafts by the drafter's own confidences where it
    // reports them (a fixed budget verifies everything and needs none;
    // `DRAFTC_PLAN_CONFIDENCE=off` plans by depth alone, to measure what
    // they change).
    let by_confidence = std::env::var("DRAFTC_PLAN_CONFIDENCE").map_or(true, |v| v != "off");
    let confident =
        drafter.set_probabilities(by_confidence && matches!(policy, DraftPolicy::Planned(_)));
    for slot in 0..b {
        target.caches.reset(slot);
        drafter.reset(slot);
        if let DraftPolicy::Planned(p) = policy {
            p.reset_seq(slot);
        }
    }
    // A planner that switched the drafter off at this batch size keeps it
    // off: the run is autoregressive decoding itself, the baseline's code,
    // and the drafter does not even read the prompts.
    if let DraftPolicy::Planned(p) = &mut *policy {
        if p.start_run(b) {
            let g = super::generate(target, requests, max_tokens, sampling, stop, on_token)?;
            drafter.finished()?;
            return Ok(off_run(g, p, stats));
        }
    }
    let (hist0, no_draft0) = match policy {
        DraftPolicy::Planned(p) => (p.histogram().to_vec(), p.no_draft_rounds()),
        DraftPolicy::Fixed(_) => (Vec::new(), 0),
    };
    let lookups_before = drafter.lookup_rounds().map_or(0, |c| c.by_lookup);
    // On a GPU the run queues its launches; each pass flushes once and the
    // reads (acceptance, a drafter's selections) are the only waits.
    let _flushes = target.exec.flush_policy().defer();
    let t0 = Instant::now();
    let client = target.client().clone();
    let vocab = target.vocab;
    let prompts: Vec<(usize, Vec<u32>)> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| (i, r.prompt.clone()))
        .collect();
    let mut drafter_off = false;
    let (last, passes) = target.prefill(&prompts, |o, step, _| {
        if drafter_off {
            return Ok(());
        }
        let mut at = 0u32;
        let committed: Vec<Committed> = step
            .seqs
            .iter()
            .map(|s| {
                let n = s.positions.len() as u32;
                let c = Committed {
                    slot: s.slot,
                    rows: (at..at + n).collect(),
                    positions: s.positions.clone(),
                };
                at += n;
                c
            })
            .collect();
        drafter.observe(&client, o, &committed)
    })?;
    stats.target_passes += passes;
    let mut round = 0u32;
    let first = pick_first(&client, &last, sampling, round)?;
    stats.prefill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut seqs: Vec<Vec<u32>> = requests.iter().map(|r| r.prompt.clone()).collect();
    let mut active = Vec::new();
    for (i, &tok) in first.iter().enumerate() {
        out[i].push(tok);
        seqs[i].push(tok);
        on_token(i, tok);
        if Some(tok) != stop && max_tokens > 1 {
            active.push(i);
        }
    }
    let mut drafted_last = false;
    let trace_rounds = std::env::var("DRAFTC_PLAN_DEBUG").is_ok_and(|v| v == "rounds");
    let mut selected = SelectOut::default();
    // Whether the last round's greedy selection is this round's ids, in
    // order (a round without draft whose sequences all go on): a round
    // without draft then uploads no ids, like an autoregressive step.
    let mut ids_selected = false;
    while !active.is_empty() {
        round += 1;
        let counts0 = draftc_ops::counters::snapshot();
        // 1. Draft.
        let td = Instant::now();
        let views: Vec<SeqView<'_>> = active
            .iter()
            .map(|&i| SeqView {
                slot: i,
                tokens: &seqs[i],
                committed: seqs[i].len() - 1,
            })
            .collect();
        let room: Vec<usize> = active.iter().map(|&i| max_tokens - out[i].len()).collect();
        let budgets = match policy {
            DraftPolicy::Fixed(k) => vec![*k; active.len()],
            DraftPolicy::Planned(p) => {
                let ctx = active.iter().map(|&i| seqs[i].len()).sum::<usize>() as f64
                    / active.len() as f64;
                p.set_context(ctx);
                p.set_rooms(active.iter().copied().zip(room.iter().copied()));
                let plan = p.plan(&active);
                if plan.drafter_off && !drafter_off {
                    // Off from now on: drop what the drafter holds.
                    drafter_off = true;
                    stats.drafter_off_at = Some(round as usize);
                    for &i in &active {
                        drafter.reset(i);
                    }
                }
                plan.budgets
            }
        };
        let budget = budgets.iter().copied().max().unwrap_or(0);
        let skip = budget == 0 && matches!(policy, DraftPolicy::Planned(_));
        let drafted = if skip {
            Ok(views.iter().map(|_| DraftTree::new()).collect())
        } else {
            drafter.draft(target, &views, budget)
        };
        let trees: Vec<DraftTree> = match drafted {
            Ok(t) if t.len() == views.len() => t
                .into_iter()
                .zip(room.iter().zip(&budgets))
                // Never draft past max_tokens: the bonus needs one slot.
                .map(|(t, (&r, &k))| sanitize(t, vocab, k.min(r.saturating_sub(1))))
                .collect(),
            // A failing drafter costs a round of speed, not correctness.
            Ok(t) => {
                stats.draft_errors += 1;
                stats.last_draft_error =
                    Some(format!("{} trees for {} sequences", t.len(), views.len()));
                views.iter().map(|_| DraftTree::new()).collect()
            }
            Err(e) => {
                stats.draft_errors += 1;
                stats.last_draft_error = Some(e.to_string());
                views.iter().map(|_| DraftTree::new()).collect()
            }
        };
        // With its draft in hand, the planner decides how much of it to
        // verify (lookup drafts for free, only where the history matches).
        // The drafter's confidence along each tree's most likely path (a
        // pruned tree's is a prefix of it), for the cut and the estimates.
        let mut conf: Vec<Vec<f64>> = Vec::new();
        let trees = match &mut *policy {
            DraftPolicy::Planned(p) if !skip => {
                let depths: Vec<usize> = trees.iter().map(DraftTree::levels).collect();
                // (Near max_tokens the room, not the drafter, cut the trees.)
                if room.iter().all(|&r| r > budget) {
                    p.observe_depth(budget, depths.iter().copied().max().unwrap_or(0));
                }
                let spent = td.elapsed().as_secs_f64();
                if confident {
                    conf = trees.iter().map(DraftTree::path_confidences).collect();
                }
                match p.verify_counts(&active, &depths, spent, confident.then_some(&conf[..])) {
                    Some(keep) => trees
                        .into_iter()
                        .zip(keep)
                        .map(|(t, k)| {
                            if k >= t.levels() {
                                t
                            } else {
                                t.prune_to_depth(k)
                            }
                        })
                        .collect(),
                    None => trees,
                }
            }
            _ => trees,
        };
        // Whatever the drafter did to the target's caches (self-speculation
        // writes tentative rows), verification starts from the committed rows.
        for v in &views {
            target.caches.truncate(v.slot, v.committed);
        }
        let draft_s = td.elapsed().as_secs_f64();
        stats.draft_s += draft_s;
        let rows = views.len() + trees.iter().map(DraftTree::len).sum::<usize>();
        let batch = views.len();
        // 2. Verify all trees in one target pass.
        let tv = Instant::now();
        let mut step = Step::default();
        let mut ids = Vec::new();
        for (v, tree) in views.iter().zip(&trees) {
            let last_tok = *v.tokens.last().unwrap_or(&0);
            let mut positions = vec![v.committed as u32];
            positions.extend(tree.positions(v.committed + 1));
            step.seqs.push(SeqStep {
                slot: v.slot,
                positions,
                // No draft: the plain decoding step's causal pass (a batch
                // with no tree at all runs no tree-masked attention).
                parents: (!tree.is_empty()).then(|| tree.verify_parents()),
                memory_tail: None,
            });
            ids.extend(tree.verify_tokens(last_tok));
            stats.drafted += tree.len();
        }
        if !drafter_off {
            drafter.verifying(&views, &trees)?;
        }
        drop(views);
        let on_device = selected
            .last(ids.len())
            .filter(|_| ids_selected && rows == batch);
        let o = match on_device {
            Some(dev) => target.forward_on_device(&step, &ids, dev)?,
            None => target.forward(&step, &ids)?,
        };
        stats.target_passes += 1;
        let logits = o.get("logits")?;
        // 3. Accept.
        let accepted = accept(
            &client,
            logits,
            (&step, &ids, &trees),
            sampling,
            round,
            vocab,
            &mut selected,
        )?;
        let verify_s = tv.elapsed().as_secs_f64();
        stats.verify_s += verify_s;
        let per_seq: Vec<(usize, usize)> = trees
            .iter()
            .zip(&accepted)
            .map(|(t, (nodes, _))| (t.levels(), nodes.len()))
            .collect();
        drafter.verified(verify_s, trees.iter().map(DraftTree::len).sum(), &per_seq);
        // 4. Commit.
        let mut committed = Vec::new();
        let mut paths = Vec::new();
        let mut still = Vec::new();
        let mut base = 0u32;
        for (((&i, s), (nodes, bonus)), tree) in
            active.iter().zip(&step.seqs).zip(&accepted).zip(&trees)
        {
            let committed_len = seqs[i].len() - 1;
            let keep: Vec<usize> = std::iter::once(0).chain(nodes.iter().copied()).collect();
            paths.push((i, committed_len, keep.clone()));
            committed.push(Committed {
                slot: i,
                rows: keep.iter().map(|&k| base + k as u32).collect(),
                positions: (committed_len as u32..(committed_len + keep.len()) as u32).collect(),
            });
            base += s.positions.len() as u32;
            stats.seq_rounds += 1;
            stats.accepted += nodes.len();
            let levels = tree.levels();
            if stats.depth_drafted.len() < levels {
                stats.depth_drafted.resize(levels, 0);
                stats.depth_accepted.resize(levels, 0);
            }
            for j in 0..levels {
                stats.depth_drafted[j] += 1;
                if j < nodes.len() {
                    stats.depth_accepted[j] += 1;
                }
            }
            let emitted: Vec<u32> = nodes
                .iter()
                .map(|&k| ids[committed.last().map_or(0, |c| c.rows[0]) as usize + k])
                .chain(std::iter::once(*bonus))
                .collect();
            let mut done = false;
            for tok in emitted {
                out[i].push(tok);
                seqs[i].push(tok);
                on_token(i, tok);
                if Some(tok) == stop || out[i].len() >= max_tokens {
                    done = true;
                    break;
                }
            }
            if !done {
                still.push(i);
            }
        }
        // Every sequence's accepted path in one gather and one scatter per
        // cache half.
        target.caches.compact_all(&paths)?;
        if !drafter_off {
            drafter.observe(&client, &o, &committed)?;
        }
        if let DraftPolicy::Planned(p) = policy {
            if !skip {
                p.observe_draft(batch, budget, draft_s, drafted_last);
            }
            drafted_last = !skip;
            p.observe_verify(rows, tv.elapsed().as_secs_f64());
            for (j, (&i, (tree, (nodes, _)))) in
                active.iter().zip(trees.iter().zip(&accepted)).enumerate()
            {
                p.observe_seq(i, tree.levels(), nodes.len());
                if let Some(c) = conf.get(j) {
                    p.observe_confidence(&c[..c.len().min(tree.levels())], nodes.len());
                }
            }
            let emitted = accepted.iter().map(|(n, _)| n.len() + 1).sum();
            let round_s = td.elapsed().as_secs_f64();
            p.observe_round(batch, emitted, round_s, !skip);
            if trace_rounds {
                // DRAFTC_PLAN_DEBUG=rounds: one line a round, times in ms.
                let c = draftc_ops::counters::snapshot().since(&counts0);
                eprintln!(
                    "plan round {round}: seqs {batch} budget {budget} rows {rows} emitted {emitted} \
                     draft {:.3} pass+accept {:.3} commit+observe {:.3} round {:.3} \
                     V(seqs) {:?} off {drafter_off}{} launches {} flushes {} reads {} uploads {}",
                    draft_s * 1e3,
                    verify_s * 1e3,
                    (tv.elapsed().as_secs_f64() - verify_s) * 1e3,
                    round_s * 1e3,
                    p.verify_time(batch).map(|v| (v * 1e6).round() / 1e3),
                    // Why it is off, or went off in this round.
                    match (drafter_off, p.off_why(batch)) {
                        (true, Some(w)) => format!(" ({w})"),
                        (false, Some(w)) => format!(", then off ({w})"),
                        (_, None) => String::new(),
                    },
                    c.launches,
                    c.flushes,
                    c.reads,
                    c.uploads,
                );
            }
        }
        ids_selected = rows == batch && sampling.is_greedy() && still.len() == active.len();
        active = still;
        stats.rounds += 1;
        stats.round_counts = stats
            .round_counts
            .plus(&draftc_ops::counters::snapshot().since(&counts0));
    }
    drafter.finished()?;
    stats.lookup_rounds = drafter.lookup_rounds().map_or(0, |c| c.by_lookup) - lookups_before;
    stats.decode_s = t1.elapsed().as_secs_f64();
    stats.generated_tokens = out.iter().map(Vec::len).sum();
    if let DraftPolicy::Planned(p) = policy {
        stats.budget_histogram = p
            .histogram()
            .iter()
            .enumerate()
            .map(|(k, &n)| n - hist0.get(k).copied().unwrap_or(0))
            .collect();
        stats.no_draft_rounds = p.no_draft_rounds() - no_draft0;
        stats.predicted_speedup = p.predicted_speedup(b);
        let lengths: Vec<usize> = out.iter().map(Vec::len).collect();
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
    Ok(SpecGeneration { tokens: out, stats })
}

/// The statistics of a run the planner kept off from its start (`g`, an
/// autoregressive run), told to the planner as rounds without a draft.
fn off_run(g: super::Generation, p: &mut Planner, mut stats: SpecStats) -> SpecGeneration {
    let steps = g.stats.decode_pass_s.len();
    let seq_rounds: usize = g.tokens.iter().map(|t| t.len().saturating_sub(1)).sum();
    p.rounds_off(stats.sequences, steps, seq_rounds);
    let mut histogram = vec![0; p.config().max_budget + 1];
    histogram[0] = seq_rounds;
    stats.generated_tokens = g.stats.generated_tokens;
    stats.seq_rounds = seq_rounds;
    stats.target_passes = g.stats.target_passes;
    stats.prefill_s = g.stats.prefill_s;
    stats.decode_s = g.stats.decode_s;
    stats.verify_s = g.stats.decode_s;
    stats.rounds = steps;
    stats.round_counts = g
        .stats
        .decode_pass_counts
        .iter()
        .fold(Default::default(), |a, c| a.plus(c));
    stats.budget_histogram = histogram;
    stats.no_draft_rounds = steps;
    stats.predicted_speedup = p.predicted_speedup(stats.sequences);
    stats.drafter_off_at = Some(0);
    SpecGeneration {
        tokens: g.tokens,
        stats,
    }
}

/// First token after the prompt, from the prefill's last logits.
fn pick_first<R: Runtime>(
    client: &ComputeClient<R>,
    last: &DeviceTensor<R>,
    sampling: &Sampling,
    round: u32,
) -> Result<Vec<u32>, EngineError> {
    if sampling.is_greedy() {
        return select_tokens(client, last, sampling, 0);
    }
    // The same rule as every later round: a tree of only the root.
    let v = *last.shape().last().unwrap_or(&1);
    let rows = last.numel() / v;
    let mut firsts = Vec::with_capacity(rows);
    for r in 0..rows {
        let one = DeviceTensor::<R>::empty(client, &[1, v], last.dtype());
        draftc_ops::kv::gather_rows(client, &last.reshape(&[rows, v])?, &[r as u32], &one, &[0])?;
        let mode = AcceptMode::Sampling {
            temperature: sampling.temperature,
            seed: sampling.seed ^ (r as u64) << 32,
            step: round,
        };
        firsts.push(
            accept_tree(
                client,
                &[0],
                &[draftc_ops::attention::TREE_ROOT],
                &one,
                None,
                mode,
            )?
            .bonus,
        );
    }
    Ok(firsts)
}

/// Per sequence of `step`: accepted node indices (verify-tree numbering,
/// root = 0 excluded) and the bonus token.
fn accept<R: Runtime>(
    client: &ComputeClient<R>,
    logits: &DeviceTensor<R>,
    (step, ids, trees): (&Step, &[u32], &[DraftTree]),
    sampling: &Sampling,
    round: u32,
    vocab: usize,
    selected: &mut SelectOut,
) -> Result<Vec<(Vec<usize>, u32)>, EngineError> {
    let mut res = Vec::with_capacity(trees.len());
    if sampling.is_greedy() {
        let argmax = select_tokens_into(client, logits, &Sampling::GREEDY, 0, selected)?;
        let mut at = 0;
        for (s, tree) in step.seqs.iter().zip(trees) {
            let n = s.positions.len();
            let a = tree
                .longest_accepted_path(argmax[at], &argmax[at + 1..at + n])
                .map_err(|e| EngineError::Invalid(e.to_string()))?;
            res.push((a.nodes.iter().map(|&k| k + 1).collect(), a.bonus));
            at += n;
        }
        return Ok(res);
    }
    let all = logits.reshape(&[logits.numel() / vocab, vocab])?;
    let mut at = 0u32;
    for (si, (s, tree)) in step.seqs.iter().zip(trees).enumerate() {
        let n = s.positions.len() as u32;
        let part = DeviceTensor::<R>::empty(client, &[n as usize, vocab], logits.dtype());
        let rows: Vec<u32> = (at..at + n).collect();
        let dst: Vec<u32> = (0..n).collect();
        draftc_ops::kv::gather_rows(client, &all, &rows, &part, &dst)?;
        let mode = AcceptMode::Sampling {
            temperature: sampling.temperature,
            seed: sampling.seed ^ (s.slot as u64) << 32,
            step: round,
        };
        let toks = &ids[at as usize..(at + n) as usize];
        let a = accept_tree(client, toks, &tree.verify_parents(), &part, None, mode)?;
        let _ = si;
        res.push((a.accepted.iter().map(|&k| k as usize).collect(), a.bonus));
        at += n;
    }
    Ok(res)
}
