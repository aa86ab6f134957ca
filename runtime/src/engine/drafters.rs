//! Drafters the speculative engine can use, behind one [`Drafter`] trait:
//!
//! * [`PromptLookupDrafter`] — n-gram lookup in the sequence's own tokens
//!   (`--drafter prompt-lookup`, `speculation::prompt_lookup`);
//! * [`SelfSpecDrafter`] — MagicDec self-speculation: the target's own
//!   graph compiled from `models/magicdec.draft` (sliding-window + sink
//!   attention over the target's KV cache) drafts a chain step by step,
//!   writing tentative rows into the target's caches that are dropped again
//!   before verification;
//! * [`ParallelDrafter`] (`parallel_drafter.rs`) — SpecFormer / Medusa: one
//!   pass over the target's hidden-state taps of every newly committed row
//!   (its own context cache grows with them), run lazily at the next draft;
//!   the last row's `l` logit rows are the chain.
//!   Convention (documented in docs/speculative.md): logit row `j` drafted
//!   at position `p` predicts position `p + 2 + j` — position `p + 1` is the
//!   target's own next token (the round's bonus), as in Medusa.
//!
//! Every drafter returns one [`DraftTree`] per sequence; the engine caps it
//! to the budget and drops nodes with out-of-vocabulary tokens (a faulty
//! drafter costs speed, never exactness).

use std::collections::BTreeMap;

use cubecl::prelude::*;
use draftc_codegen::PlanDType;
use draftc_ir::graph::Graph;
use draftc_ops::{DType, DeviceTensor};

use super::autoregressive_drafter::AutoregressiveDrafter;
use super::eagle_drafter::EagleDrafter;
use super::parallel_drafter::ParallelDrafter;
use super::select::{select_tokens, top_candidates, Sampling};
use super::target::{EngineError, TargetModel};
use crate::exec::{CacheStore, DraftVocab, Executor, HostWeights, Outputs, SeqStep, Step};
use crate::speculation::tree::Candidate;
use crate::speculation::{Confidence, DraftTree, PromptLookup, TreeShape};

/// What a model drafter is built from ([`model_drafter`]'s arguments).
pub(super) struct Build<'a, R: Runtime> {
    pub client: &'a ComputeClient<R>,
    pub graph: &'a Graph,
    pub target: &'a TargetModel<R>,
    pub weights: &'a HostWeights,
    pub dtype: PlanDType,
}

impl<R: Runtime> Build<'_, R> {
    /// What every model drafter starts from: its executor over the graph
    /// (its passes replay when the drafter keeps its inputs in buffers of
    /// its own, `staged`, or with `DRAFTC_REPLAY=all`:
    /// [`crate::exec::drafter_replay`]), its draft length `l` (the file's, 4
    /// without one) and its reduced draft vocabulary (`None`: the whole one).
    pub fn parts(
        &self,
        staged: bool,
    ) -> Result<(Executor<R>, usize, Option<DraftVocab>), EngineError> {
        let (g, t) = (self.graph, self.target);
        let vocab = DraftVocab::of(g, self.weights, t.vocab).map_err(EngineError::Invalid)?;
        let mut exec = Executor::new(self.client, g, &t.weights, self.weights, self.dtype, true)?;
        exec.set_replay(crate::exec::drafter_replay(staged));
        let l = g.meta.draft_len.unwrap_or(4).max(1) as usize;
        Ok((exec, l, vocab))
    }
}

/// [`Drafter::executor`] and [`Drafter::executor_mut`] of a drafter whose
/// executor is its field `exec`; `tree $r`: also [`Drafter::length`] and
/// [`Drafter::set_confidence`] of one that grows its trees level by level
/// by its field `tree` (`autoregressive_drafter::TreePlan`).
macro_rules! own_executor {
    ($r:ty) => {
        fn executor(&self) -> Option<&crate::exec::Executor<$r>> {
            Some(&self.exec)
        }

        fn executor_mut(&mut self) -> Option<&mut crate::exec::Executor<$r>> {
            Some(&mut self.exec)
        }
    };
    (tree $r:ty) => {
        super::drafters::own_executor!($r);

        fn length(&self) -> usize {
            self.tree.length()
        }

        fn set_confidence(
            &mut self,
            confidence: crate::speculation::Confidence,
        ) -> Result<(), EngineError> {
            self.tree.set_confidence(confidence)
        }
    };
}
pub(super) use own_executor;

/// A sequence as the drafter sees it at the start of a round.
#[derive(Clone, Debug)]
pub struct SeqView<'a> {
    pub slot: usize,
    /// Prompt and generated tokens; the last one is not in the target's cache yet.
    pub tokens: &'a [u32],
    /// Rows in the target's cache (`tokens.len() - 1`).
    pub committed: usize,
}

/// Rows a target pass committed for one sequence: packed row indices in
/// that pass and their positions.
#[derive(Clone, Debug)]
pub struct Committed {
    pub slot: usize,
    pub rows: Vec<u32>,
    pub positions: Vec<u32>,
}

/// The sequences of `committed` that committed rows, and all their rows in
/// order (`None`: no row at all): what a drafter gathers from the pass.
pub(super) fn live_rows(committed: &[Committed]) -> Option<(Vec<&Committed>, Vec<u32>)> {
    let live: Vec<&Committed> = committed.iter().filter(|x| !x.rows.is_empty()).collect();
    let rows: Vec<u32> = live.iter().flat_map(|x| x.rows.iter().copied()).collect();
    (!rows.is_empty()).then_some((live, rows))
}

/// Rows of one pass whose `width` floats of `dtype` per row fit a 128 MiB
/// binding, with room to spare (120 MiB): the most a pass of a graph whose
/// output is that wide may have.
pub(super) fn rows_within_binding(width: usize, dtype: draftc_ops::DType) -> usize {
    ((120usize << 20) / (width.max(1) * dtype.size())).max(1)
}

/// A target pass as a drafter sees it ([`Drafter::observe`]): the pass's
/// outputs and, per sequence, the rows it committed.
#[derive(Clone, Copy)]
pub struct Observed<'a, R: Runtime> {
    pub client: &'a ComputeClient<R>,
    pub out: &'a Outputs<R>,
    pub committed: &'a [Committed],
}

/// One round's drafting ([`Drafter::draft`]): the target (its client, and
/// its caches for self-speculation), the sequences to draft for and the
/// most nodes a tree may have.
pub struct DraftCall<'a, 's, R: Runtime> {
    pub target: &'a mut TargetModel<R>,
    pub seqs: &'a [SeqView<'s>],
    pub budget: usize,
}

/// Proposes draft trees; sees every target pass's committed rows.
pub trait Drafter<R: Runtime> {
    /// Its name: the graph's for drafters that run one.
    fn name(&self) -> String {
        self.executor()
            .map(|e| e.graph().name.clone())
            .unwrap_or_default()
    }

    /// The executor of the graph it runs, for drafters that run one (its
    /// name and profile come from there).
    fn executor(&self) -> Option<&crate::exec::Executor<R>> {
        None
    }

    /// The same executor, to change how it runs (`Executor::set_replay`).
    fn executor_mut(&mut self) -> Option<&mut crate::exec::Executor<R>> {
        None
    }

    /// Draft length `l` it aims for (the chain length of one round).
    fn length(&self) -> usize;

    /// Called after every target pass (prefill chunks included) with the
    /// rows that pass committed.
    fn observe(&mut self, _pass: Observed<'_, R>) -> Result<(), EngineError> {
        Ok(())
    }

    /// One tree per sequence of `call.seqs`, each of at most `call.budget`
    /// nodes.
    fn draft(&mut self, call: DraftCall<'_, '_, R>) -> Result<Vec<DraftTree>, EngineError>;

    /// The engine is about to verify `trees` (one per sequence of `seqs`).
    /// A concurrent drafter starts drafting the next round here.
    fn verifying(
        &mut self,
        _seqs: &[SeqView<'_>],
        _trees: &[DraftTree],
    ) -> Result<(), EngineError> {
        Ok(())
    }

    /// The round's verification (target pass and acceptance) took
    /// `seconds` for `draft_tokens` draft tokens in all; per sequence, the
    /// tree's depth and the accepted length.
    fn verified(&mut self, _seconds: f64, _draft_tokens: usize, _rounds: &[(usize, usize)]) {}

    /// The generation is over (no more rounds will be verified).
    fn finished(&mut self) -> Result<(), EngineError> {
        Ok(())
    }

    /// Forget the sequence in `slot`.
    fn reset(&mut self, _slot: usize) {}

    /// Whether it reads the target's passes over committed rows
    /// ([`Drafter::observe`]); one that drafts from token ids alone (prompt
    /// lookup) lets the engine reuse a cached prompt prefix without running
    /// the target over it.
    fn observes_rows(&self) -> bool {
        true
    }

    /// Its executor's per-kernel profile (`DRAFTC_PROFILE=1`), for drafters
    /// that run a graph of their own.
    fn profile(&self) -> Option<&crate::exec::Profile> {
        self.executor().and_then(|e| e.profile())
    }

    /// Rounds drafted so far and how many of them by prompt lookup, for
    /// drafters that put lookup first ([`super::LookupFirst`]).
    fn lookup_rounds(&self) -> Option<super::LookupRounds> {
        None
    }

    /// Whether its trees should carry its own probability of each token
    /// (`on`: a planner cuts drafts by them; off: the cheapest selection,
    /// an argmax, will do). Returns whether they will: a drafter without
    /// probabilities of its own (prompt lookup) returns false.
    fn set_probabilities(&mut self, _on: bool) -> bool {
        false
    }

    /// Cut its draft trees by the drafter's confidence (`--confidence`);
    /// only drafters that build trees from their own probabilities can.
    fn set_confidence(&mut self, _confidence: Confidence) -> Result<(), EngineError> {
        Err(EngineError::Invalid(format!(
            "--confidence: drafter `{}` has no per-token probabilities to cut its drafts by; \
             it applies to model drafters (models/beagle.draft, models/spire.draft, \
             models/specformer.draft, models/medusa.draft)",
            self.name()
        )))
    }
}

pub(super) fn spec_err(e: crate::speculation::SpecError) -> EngineError {
    EngineError::Invalid(e.to_string())
}

/// Prompt-lookup drafting (chain, or a tree of up to `branches` continuations).
pub struct PromptLookupDrafter {
    pub lookup: PromptLookup,
    pub branches: usize,
}

impl<R: Runtime> Drafter<R> for PromptLookupDrafter {
    fn observes_rows(&self) -> bool {
        false
    }

    fn name(&self) -> String {
        "prompt-lookup".into()
    }

    fn length(&self) -> usize {
        self.lookup.max_tokens
    }

    fn draft(&mut self, call: DraftCall<'_, '_, R>) -> Result<Vec<DraftTree>, EngineError> {
        let (seqs, budget) = (call.seqs, call.budget);
        seqs.iter()
            .map(|s| self.propose(s.tokens, budget).map_err(spec_err))
            .collect()
    }
}

impl PromptLookupDrafter {
    /// The chain (or tree of `branches` continuations) continuing `tokens`.
    pub fn propose(
        &self,
        tokens: &[u32],
        budget: usize,
    ) -> Result<DraftTree, crate::speculation::SpecError> {
        if self.branches <= 1 {
            let mut t = self.lookup.propose(tokens);
            t.truncate(budget);
            DraftTree::chain(&t, &vec![0.0; t.len()])
        } else {
            Ok(self.lookup.propose_tree(tokens, self.branches, budget))
        }
    }
}

/// MagicDec self-speculation over the target's own caches.
pub struct SelfSpecDrafter<R: Runtime> {
    exec: Executor<R>,
    own: CacheStore<R>,
    l: usize,
    /// Its chains carry the probability of each token
    /// (`Drafter::set_probabilities`).
    probabilities: bool,
}

impl<R: Runtime> SelfSpecDrafter<R> {
    /// `graph`: a compiled self-speculative drafter (`base llama` + mask),
    /// with the target's weights.
    pub(super) fn new(b: &Build<'_, R>) -> Result<Self, EngineError> {
        // Self-speculation has no draft vocabulary (the IR refuses one).
        let (exec, l, _) = b.parts(false)?;
        let client = b.client;
        Ok(SelfSpecDrafter {
            exec,
            own: CacheStore::new(client, 1, 1, DType::F32),
            l,
            probabilities: false,
        })
    }
}

impl<R: Runtime> Drafter<R> for SelfSpecDrafter<R> {
    own_executor!(R);

    fn length(&self) -> usize {
        self.l
    }

    fn draft(&mut self, call: DraftCall<'_, '_, R>) -> Result<Vec<DraftTree>, EngineError> {
        let (target, seqs, budget) = (call.target, call.seqs, call.budget);
        let chains = self.draft_chains(target, seqs, budget);
        // Drop the tentative rows, also after an error: verification writes
        // these positions again.
        for s in seqs {
            target.caches.truncate(s.slot, s.committed);
        }
        chains?
            .iter()
            .map(|c| {
                let (tokens, logprobs): (Vec<u32>, Vec<f32>) = c.iter().copied().unzip();
                DraftTree::chain(&tokens, &logprobs).map_err(spec_err)
            })
            .collect()
    }

    fn set_probabilities(&mut self, on: bool) -> bool {
        self.probabilities = on;
        true
    }
}

impl<R: Runtime> SelfSpecDrafter<R> {
    /// The greedy chains, step by step, writing tentative rows into the
    /// target's caches (the caller drops them): each token with its
    /// log-probability (0 unless asked for probabilities).
    fn draft_chains(
        &mut self,
        target: &mut TargetModel<R>,
        seqs: &[SeqView<'_>],
        budget: usize,
    ) -> Result<Vec<Vec<Candidate>>, EngineError> {
        let steps = self.l.min(budget);
        let mut chains: Vec<Vec<Candidate>> = vec![Vec::new(); seqs.len()];
        let mut last: Vec<u32> = seqs
            .iter()
            .map(|s| *s.tokens.last().unwrap_or(&0))
            .collect();
        for j in 0..steps {
            let step = Step {
                seqs: seqs
                    .iter()
                    .map(|s| SeqStep::chain(s.slot, (s.committed + j) as u32, 1))
                    .collect(),
                ..Step::default()
            };
            let ids = DeviceTensor::upload_u32(target.client(), &last, &[last.len()])?;
            let inputs = BTreeMap::from([("ids".to_string(), ids)]);
            let out = self
                .exec
                .run(&step, &inputs, &mut self.own, Some(&mut target.caches))?;
            let logits = out.get("logits")?;
            let next: Vec<Candidate> = if self.probabilities {
                top_candidates(target.client(), logits, 1)?
                    .into_iter()
                    .map(|c| c.first().copied().unwrap_or((u32::MAX, f32::NEG_INFINITY)))
                    .collect()
            } else {
                select_tokens(target.client(), logits, &Sampling::GREEDY, 0)?
                    .into_iter()
                    .map(|t| (t, 0.0))
                    .collect()
            };
            for (c, &t) in chains.iter_mut().zip(&next) {
                c.push(t);
            }
            let next: Vec<u32> = next.into_iter().map(|c| c.0).collect();
            if next.iter().any(|&t| t as usize >= target.vocab) {
                // Non-finite logits: nothing sensible to feed back.
                break;
            }
            last = next;
        }
        Ok(chains)
    }
}

/// Whether an autoregressive drafter keeps a KV cache of its own or reads
/// `prev(…)` (EAGLE, EAGLE-3): [`EagleDrafter`] drafts it.
fn eagle_like(graph: &Graph) -> bool {
    use draftc_ir::op::{Cache, InputSource, Op};
    graph.nodes.iter().any(|n| match &n.op {
        Op::Attention(a) => matches!(a.cache, Cache::Own(_)),
        Op::Input(InputSource::MemoryPrev(_)) => true,
        _ => false,
    })
}

/// Builds the drafter a `models/*.draft` file describes. `tree` overrides
/// the file's `tree` setting (autoregressive drafters; parallel drafters
/// take a static shape, drawing each depth's candidates from their `l`
/// outputs).
pub fn model_drafter<R: Runtime>(
    client: &ComputeClient<R>,
    graph: &Graph,
    target: &TargetModel<R>,
    weights: &HostWeights,
    dtype: PlanDType,
    tree: Option<TreeShape>,
) -> Result<Box<dyn Drafter<R>>, EngineError> {
    use draftc_ir::graph::DrafterKind;
    let b = Build {
        client,
        graph,
        target,
        weights,
        dtype,
    };
    let shape = match (tree, &graph.meta.tree) {
        (Some(t), _) => t,
        (None, Some(spec)) => TreeShape::try_from(spec).map_err(spec_err)?,
        (None, None) => TreeShape::Chain,
    };
    match graph.meta.drafter_kind {
        Some(DrafterKind::SelfSpeculative) => {
            if shape != TreeShape::Chain {
                return Err(EngineError::Invalid(format!(
                    "self-speculative drafter `{}` drafts a chain; `--tree {shape}` needs an \
                     autoregressive or parallel drafter",
                    graph.name
                )));
            }
            Ok(Box::new(SelfSpecDrafter::new(&b)?))
        }
        Some(DrafterKind::Parallel) => Ok(Box::new(ParallelDrafter::new(&b, shape)?)),
        // A cache of its own or `prev` reads: the EAGLE family.
        Some(DrafterKind::Autoregressive) if eagle_like(graph) => {
            Ok(Box::new(EagleDrafter::new(&b, shape)?))
        }
        Some(DrafterKind::Autoregressive) => Ok(Box::new(AutoregressiveDrafter::new(&b, shape)?)),
        None => Err(EngineError::Invalid(format!(
            "`{}` is a model, not a drafter",
            graph.name
        ))),
    }
}
