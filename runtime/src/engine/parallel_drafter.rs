//! [`ParallelDrafter`]: SpecFormer / Medusa, drafting all `l` positions
//! at once from the target's hidden-state taps of every committed row.
//!
//! Observation is lazy: after each target pass the committed rows' taps are
//! gathered into the drafter's own buffers (one gather per graph input), and
//! the drafter pass over them runs when a draft is asked for. Every round
//! that drafts runs one pass over the rows the last round committed, as
//! before; a round the planner gives no draft (`--speculate auto`) costs
//! only the gathers, and the next draft catches up on every skipped row in
//! one pass (its own context cache needs them all, in order).

use std::collections::BTreeMap;

use cubecl::prelude::*;
use draftc_ir::op::{InputSource, Op};
use draftc_ops::DeviceTensor;

use super::drafters::{spec_err, Build, Committed, DraftCall, Drafter, Observed};
use super::select::{select_tokens_into, top_candidates_into, Kept, Sampling, SelectOut, TopOut};
use super::target::EngineError;
use crate::exec::{ops_dtype, CacheStore, DraftVocab, Executor, Outputs, Step};
use crate::speculation::tree::Candidate;
use crate::speculation::{Confidence, DraftTree, TreeBuilder, TreeShape};

/// Committed rows gathered from one target pass, not yet run through the
/// drafter.
struct Pending<R: Runtime> {
    /// Per graph input, the stacked tap rows `[rows · taps, width]`.
    inputs: BTreeMap<String, DeviceTensor<R>>,
    /// Per sequence: slot, positions, first row in `inputs`.
    seqs: Vec<(usize, Vec<u32>, usize)>,
    /// Rows in `inputs`.
    rows: usize,
}

/// A run of one sequence's pending rows: chunk, first row, positions.
type Segment = (usize, usize, usize, Vec<u32>);

/// SpecFormer / Medusa: parallel drafting from the target's hidden-state taps.
pub struct ParallelDrafter<R: Runtime> {
    exec: Executor<R>,
    caches: CacheStore<R>,
    l: usize,
    /// Graph inputs fed from taps: (input name, tap indices, stacked).
    taps: Vec<(String, Vec<i64>, bool)>,
    /// Chain, or a static tree over the per-position candidates.
    shape: TreeShape,
    /// Latest proposal per slot: candidates per draft position.
    proposals: BTreeMap<usize, Vec<Vec<Candidate>>>,
    /// Rows per pass, so that `[rows, l, vocab]` logits fit one binding.
    max_rows: usize,
    /// A reduced draft vocabulary: draft ids map back to target ids.
    vocab: Option<DraftVocab>,
    /// `--confidence`: cut the chain or static tree by the product of the
    /// positions' probabilities along a path.
    confidence: Option<Confidence>,
    /// A plain chain's tokens carry their probabilities (a planner cuts by
    /// them; `Drafter::set_probabilities`).
    probabilities: bool,
    /// Committed rows not yet run through the drafter, oldest first.
    pending: Vec<Pending<R>>,
    /// The picked logit rows, the selection's and the candidates'
    /// buffers, kept across passes.
    picked: Kept,
    selected: SelectOut,
    top: TopOut,
}

impl<R: Runtime> ParallelDrafter<R> {
    pub(super) fn new(b: &Build<'_, R>, shape: TreeShape) -> Result<Self, EngineError> {
        let (client, graph, target, dtype) = (b.client, b.graph, b.target, b.dtype);
        if !matches!(shape, TreeShape::Chain | TreeShape::Static(_)) {
            return Err(EngineError::Invalid(format!(
                "parallel drafter `{}` proposes candidates per draft position: use `--tree chain` \
                 or a static tree such as `--tree 3,2,1`, not `{shape}`",
                graph.name
            )));
        }
        let (exec, l, vocab) = b.parts(false)?;
        let mut taps = Vec::new();
        for &i in &graph.inputs {
            let n = graph.node(i);
            match &n.op {
                Op::Input(InputSource::TargetHidden { indices, stacked }) => {
                    taps.push((n.name.clone(), indices.clone(), *stacked))
                }
                _ => {
                    return Err(EngineError::Invalid(format!(
                        "parallel drafter `{}`: input `{}` is not a target hidden-state tap",
                        graph.name, n.name
                    )))
                }
            }
        }
        Ok(ParallelDrafter {
            exec,
            caches: CacheStore::new(
                client,
                target.caches.slots(),
                target.caches.capacity(),
                ops_dtype(dtype),
            ),
            max_rows: super::drafters::rows_within_binding(l * target.vocab, ops_dtype(dtype)),
            l,
            taps,
            shape,
            proposals: BTreeMap::new(),
            vocab,
            confidence: None,
            probabilities: false,
            pending: Vec::new(),
            picked: Kept::default(),
            selected: SelectOut::default(),
            top: TopOut::default(),
        })
    }
}

impl<R: Runtime> Drafter<R> for ParallelDrafter<R> {
    super::drafters::own_executor!(R);

    fn length(&self) -> usize {
        self.l
    }

    /// Gathers the committed rows' taps (in chunks of at most `max_rows`
    /// rows: a long prefill would not fit its `l` logit rows per token in
    /// one binding); the drafter pass runs at the next draft.
    fn observe(&mut self, pass: Observed<'_, R>) -> Result<(), EngineError> {
        let (c, out, committed) = (pass.client, pass.out, pass.committed);
        let mut chunk: Vec<Committed> = Vec::new();
        let mut room = self.max_rows;
        for x in committed {
            let mut from = 0;
            while from < x.rows.len() {
                if room == 0 {
                    self.gather(c, out, &chunk)?;
                    chunk.clear();
                    room = self.max_rows;
                }
                let n = room.min(x.rows.len() - from);
                chunk.push(Committed {
                    slot: x.slot,
                    rows: x.rows[from..from + n].to_vec(),
                    positions: x.positions[from..from + n].to_vec(),
                });
                from += n;
                room -= n;
            }
        }
        self.gather(c, out, &chunk)
    }

    fn draft(&mut self, call: DraftCall<'_, '_, R>) -> Result<Vec<DraftTree>, EngineError> {
        let (target, seqs, budget) = (call.target, call.seqs, call.budget);
        let client = target.client().clone();
        self.catch_up(&client)?;
        seqs.iter()
            .map(|s| {
                let cands = self.proposals.get(&s.slot).cloned().unwrap_or_default();
                Ok(match (&self.shape, self.confidence) {
                    (TreeShape::Static(b), cut) => {
                        DraftTree::static_from_candidates(b, &cands, budget, cut)
                    }
                    // A cut chain: each position's top candidate with its
                    // probability (observe kept them); it ends with them.
                    (_, Some(cut)) => TreeBuilder::new(&TreeShape::Chain, budget)
                        .with_confidence(Some(cut))
                        .run(&mut |path| cands.get(path.len()).cloned().unwrap_or_default()),
                    // Probability 1 unless set_probabilities asked for them.
                    _ => {
                        let mut p: Vec<Candidate> =
                            cands.iter().filter_map(|c| c.first().copied()).collect();
                        p.truncate(budget);
                        let (tokens, logprobs): (Vec<u32>, Vec<f32>) = p.into_iter().unzip();
                        DraftTree::chain(&tokens, &logprobs).map_err(spec_err)?
                    }
                })
            })
            .collect()
    }

    fn reset(&mut self, slot: usize) {
        self.caches.reset(slot);
        self.proposals.remove(&slot);
        for p in &mut self.pending {
            p.seqs.retain(|s| s.0 != slot);
        }
        self.pending.retain(|p| !p.seqs.is_empty());
    }

    /// Parallel positions are predicted independently, so a path's
    /// probability is the product of its tokens' marginals at their
    /// positions: a confidence estimate, as Medusa's tree uses them.
    fn set_confidence(&mut self, confidence: Confidence) -> Result<(), EngineError> {
        self.confidence = Some(confidence);
        Ok(())
    }

    fn set_probabilities(&mut self, on: bool) -> bool {
        self.probabilities = on;
        true
    }
}

impl<R: Runtime> ParallelDrafter<R> {
    /// Gathers `committed`'s tap rows of the pass `out` into a pending chunk.
    fn gather(
        &mut self,
        c: &ComputeClient<R>,
        out: &Outputs<R>,
        committed: &[Committed],
    ) -> Result<(), EngineError> {
        let rows: Vec<u32> = committed
            .iter()
            .flat_map(|x| x.rows.iter().copied())
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        let t = rows.len();
        let mut inputs = BTreeMap::new();
        for (name, idx, _) in &self.taps {
            let k = idx.len();
            let d = out.get(&format!("hidden[{}]", idx[0]))?;
            let width = *d.shape().last().unwrap_or(&1);
            let dst = DeviceTensor::<R>::empty(c, &[t * k, width], d.dtype());
            for (j, i) in idx.iter().enumerate() {
                let src = out.get(&format!("hidden[{i}]"))?;
                let src = src.reshape(&[src.numel() / width, width])?;
                let to: Vec<u32> = (0..t).map(|r| (r * k + j) as u32).collect();
                draftc_ops::kv::gather_rows(c, &src, &rows, &dst, &to)?;
            }
            inputs.insert(name.clone(), dst);
        }
        let mut at = 0;
        let seqs = committed
            .iter()
            .filter(|x| !x.rows.is_empty())
            .map(|x| {
                let s = (x.slot, x.positions.clone(), at);
                at += x.rows.len();
                s
            })
            .collect();
        self.pending.push(Pending {
            inputs,
            seqs,
            rows: t,
        });
        Ok(())
    }

    /// Runs the drafter over every pending row: one pass when they fit
    /// (a chunk as gathered, or the chunks of skipped rounds merged per
    /// sequence, oldest rows first), more of at most `max_rows` rows.
    fn catch_up(&mut self, c: &ComputeClient<R>) -> Result<(), EngineError> {
        let chunks = std::mem::take(&mut self.pending);
        if chunks.is_empty() {
            return Ok(());
        }
        // Each sequence's segments in order, sequences in order of first
        // appearance.
        let mut order: Vec<usize> = Vec::new();
        let mut segs: BTreeMap<usize, Vec<Segment>> = BTreeMap::new();
        for (ci, ch) in chunks.iter().enumerate() {
            for (slot, pos, first) in &ch.seqs {
                if !segs.contains_key(slot) {
                    order.push(*slot);
                }
                segs.entry(*slot)
                    .or_default()
                    .push((ci, *first, pos.len(), pos.clone()));
            }
        }
        // Passes of at most max_rows rows (a sequence may span two).
        let mut passes: Vec<Vec<(usize, Segment)>> = vec![Vec::new()];
        let mut room = self.max_rows;
        for slot in &order {
            for (ci, first, n, pos) in &segs[slot] {
                let mut from = 0;
                while from < *n {
                    if room == 0 {
                        passes.push(Vec::new());
                        room = self.max_rows;
                    }
                    let m = room.min(n - from);
                    let seg = (*ci, first + from, m, pos[from..from + m].to_vec());
                    if let Some(p) = passes.last_mut() {
                        p.push((*slot, seg));
                    }
                    from += m;
                    room -= m;
                }
            }
        }
        // The usual case, a draft every round: one chunk gathered whole
        // (no sequence reset since), run as it is.
        let whole = chunks.len() == 1
            && passes.len() == 1
            && chunks[0].seqs.iter().map(|s| s.1.len()).sum::<usize>() == chunks[0].rows;
        for pass in passes.iter().filter(|p| !p.is_empty()) {
            let inputs = if whole {
                chunks[0].inputs.clone()
            } else {
                self.merge(c, &chunks, pass)?
            };
            // One sequence entry per slot: merge adjacent segments.
            let mut seqs: Vec<(usize, Vec<u32>)> = Vec::new();
            for (slot, s) in pass {
                match seqs.last_mut() {
                    Some(last) if last.0 == *slot => last.1.extend(&s.3),
                    _ => seqs.push((*slot, s.3.clone())),
                }
            }
            self.run_pass(c, &inputs, &seqs)?;
        }
        Ok(())
    }

    /// The pending rows of `pass` copied into one input set, in pass order.
    fn merge(
        &self,
        c: &ComputeClient<R>,
        chunks: &[Pending<R>],
        pass: &[(usize, Segment)],
    ) -> Result<BTreeMap<String, DeviceTensor<R>>, EngineError> {
        let n: usize = pass.iter().map(|(_, s)| s.2).sum();
        let mut inputs = BTreeMap::new();
        for (name, idx, _) in &self.taps {
            let k = idx.len();
            let proto = chunks[pass[0].1 .0]
                .inputs
                .get(name)
                .ok_or_else(|| EngineError::Invalid(format!("no pending input `{name}`")))?;
            let width = *proto.shape().last().unwrap_or(&1);
            let dst = DeviceTensor::<R>::empty(c, &[n * k, width], proto.dtype());
            // Per chunk: its rows and where they go.
            let mut per_chunk: BTreeMap<usize, (Vec<u32>, Vec<u32>)> = BTreeMap::new();
            let mut at = 0;
            for (_, (ci, first, m, _)) in pass {
                let e = per_chunk.entry(*ci).or_default();
                for r in 0..*m {
                    for j in 0..k {
                        e.0.push(((first + r) * k + j) as u32);
                        e.1.push(((at + r) * k + j) as u32);
                    }
                }
                at += m;
            }
            for (ci, (from, to)) in &per_chunk {
                let src = chunks[*ci]
                    .inputs
                    .get(name)
                    .ok_or_else(|| EngineError::Invalid(format!("no pending input `{name}`")))?;
                draftc_ops::kv::gather_rows(c, src, from, &dst, to)?;
            }
            inputs.insert(name.clone(), dst);
        }
        Ok(inputs)
    }

    /// One drafter pass over `inputs` (rows of `seqs` in order); each
    /// sequence's last row gives its proposals.
    fn run_pass(
        &mut self,
        c: &ComputeClient<R>,
        inputs: &BTreeMap<String, DeviceTensor<R>>,
        seqs: &[(usize, Vec<u32>)],
    ) -> Result<(), EngineError> {
        let step = Step {
            seqs: seqs
                .iter()
                .map(|(slot, positions)| crate::exec::SeqStep {
                    slot: *slot,
                    positions: positions.clone(),
                    parents: None,
                    memory_tail: None,
                })
                .collect(),
            ..Step::default()
        };
        let o = self.exec.run(&step, inputs, &mut self.caches, None)?;
        let logits = o.get("logits")?;
        let vocab = *logits.shape().last().unwrap_or(&1);
        let all = logits.reshape(&[logits.numel() / vocab, vocab])?;
        // Last row of each sequence: its l logit rows.
        let mut at = 0;
        let mut pick_rows = Vec::new();
        let mut owners = Vec::new();
        for (slot, positions) in seqs {
            at += positions.len();
            for j in 0..self.l {
                pick_rows.push(((at - 1) * self.l + j) as u32);
            }
            owners.push(*slot);
        }
        let picked = self.picked.take(c, &[pick_rows.len(), vocab], all.dtype());
        let dst: Vec<u32> = (0..pick_rows.len() as u32).collect();
        draftc_ops::kv::gather_rows(c, &all, &pick_rows, &picked, &dst)?;
        let top = &mut self.top;
        let mut cands: Vec<Vec<Candidate>> = match &self.shape {
            TreeShape::Static(b) => {
                top_candidates_into(c, &picked, b.iter().copied().max().unwrap_or(1), top)?
            }
            // A cut chain needs each token's probability.
            _ if self.confidence.is_some() || self.probabilities => {
                top_candidates_into(c, &picked, 1, top)?
            }
            _ => select_tokens_into(c, &picked, &Sampling::GREEDY, 0, &mut self.selected)?
                .into_iter()
                .map(|t| vec![(t, 0.0)])
                .collect(),
        };
        if let Some(v) = &self.vocab {
            v.map_candidates(&mut cands);
        }
        for (i, slot) in owners.iter().enumerate() {
            self.proposals
                .insert(*slot, cands[i * self.l..(i + 1) * self.l].to_vec());
        }
        Ok(())
    }
}
