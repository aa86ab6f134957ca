//! [`AutoregressiveDrafter`]: drafters that predict one token per step and
//! read memory streams (`memory states = target.hidden[n]`): Beagle (paper
//! 002: cross attention over target / predicted states) and SPIRe (paper
//! 004: sliding-window + sink attention over feedback memory).
//!
//! Per round, for every sequence:
//! 1. **Reset to true states**: the drafter's memory caches are truncated to
//!    the rows that came from the target (predicted states of the last round
//!    are dropped); the target states of the rows committed since then
//!    (hidden-state taps gathered in [`Drafter::observe`]) are appended in
//!    the first pass.
//! 2. **Draft level by level** ([`TreeBuilder`]): one pass per tree level
//!    over the nodes to expand of all sequences; the query of a node is its
//!    token at position `committed + depth + 1` (the root: the last committed
//!    token at `committed`). Each pass appends, as new memory rows, the
//!    states the previous pass predicted (`append states = s`), and every
//!    query sees only the predicted states of its own ancestors
//!    ([`MemoryTail`], on top of the file's memory mask).
//! 3. The builder's tree goes to verification; nothing of the drafting is
//!    committed.
//!
//! Drafters with their own self-attention caches (`cache=…`) are not
//! supported here (their draft rows would have to be re-keyed per branch).

mod levels;

use std::collections::HashMap;

use cubecl::prelude::*;
use draftc_ir::op::{Cache, InputSource, Op};
use draftc_ops::{DType, DeviceTensor};

use super::drafters::{live_rows, Build, DraftCall, Drafter, Observed};
use super::select::{SelectOut, TopOut};
use super::target::{EngineError, TargetModel};
use crate::exec::{ops_dtype, CacheStore, DraftVocab, Executor};
use crate::speculation::tree::Candidate;
use crate::speculation::{Confidence, DraftTree, TreeBuilder, TreeShape};

/// Rows of draft states a round may add per sequence beyond the target's
/// capacity (every expanded node adds one).
const DRAFT_ROWS: usize = 512;

/// A memory stream: its name as the graph prints it and the target tap
/// that holds its committed rows (through the target's final norm when
/// `normed`).
#[derive(Clone, Debug)]
struct Stream {
    name: String,
    tap: i64,
    normed: bool,
}

/// Committed target states not yet appended to the drafter's caches.
struct Pending<R: Runtime> {
    /// Per stream, the rows in the order they were committed.
    parts: Vec<Vec<Part<R>>>,
    positions: Vec<u32>,
}

/// Parts of one source tensor: (source, tensor, source rows, destination
/// rows).
type Group<'a, R> = (u64, &'a DeviceTensor<R>, Vec<u32>, Vec<u32>);

/// Rows `rows` of `tensor` (`[_, d]`) that feed a memory stream. Parts
/// with the same `source` are rows of one tensor: a pass's memory input
/// gathers each source once, for every sequence at once (one launch and
/// two index uploads a source instead of a sequence; issue 31).
pub(super) struct Part<R: Runtime> {
    pub(super) source: u64,
    pub(super) tensor: DeviceTensor<R>,
    pub(super) rows: Vec<u32>,
}

impl<R: Runtime> Clone for Part<R> {
    fn clone(&self) -> Self {
        Part {
            source: self.source,
            tensor: self.tensor.clone(),
            rows: self.rows.clone(),
        }
    }
}

impl<R: Runtime> Pending<R> {
    fn new(streams: usize) -> Self {
        Pending {
            parts: vec![Vec::new(); streams],
            positions: Vec::new(),
        }
    }
}

/// Where one sequence's queries sit in a pass: its first output row, the
/// tree nodes queried (`None`: the root, i.e. the last committed token),
/// their positions.
type QueriedRows = (usize, Vec<Option<usize>>, Vec<u32>);

/// States a pass predicted, to be appended in the next one.
struct Predicted<R: Runtime> {
    /// Per stream, `[rows, d]` (the pass's `append` outputs).
    rows: Vec<DeviceTensor<R>>,
    /// Their [`Part::source`].
    source: u64,
    /// Per sequence index: first row, the nodes queried, their positions.
    seqs: HashMap<usize, QueriedRows>,
}

/// Beagle / SPIRe drafting (see the module docs).
pub struct AutoregressiveDrafter<R: Runtime> {
    exec: Executor<R>,
    caches: CacheStore<R>,
    tree: TreePlan,
    streams: Vec<Stream>,
    /// A reduced draft vocabulary: draft ids map back to target ids, on
    /// the host and (`vocab_map`, its ids on the device) for the next
    /// depth of a chain or tree drafted on the device.
    vocab: Option<DraftVocab>,
    vocab_map: Option<DeviceTensor<R>>,
    /// The target's final norm (weight, eps) for streams seeded through it.
    final_norm: Option<(DeviceTensor<R>, f32)>,
    /// Per slot: target states already in the memory caches.
    in_cache: Vec<usize>,
    pending: Vec<Pending<R>>,
    /// The last [`Part::source`] handed out.
    sources: u64,
    /// The selection's and the candidates' buffers, kept across depths
    /// and rounds.
    selected: SelectOut,
    top: TopOut,
    /// A deferred chain's selections, one kept buffer per depth.
    chain_out: Vec<SelectOut>,
    /// A deferred chain's tokens with their probabilities, one kept set
    /// of buffers per depth (when `probabilities`).
    chain_top: Vec<TopOut>,
    /// Each memory stream's packed rows (kept while replaying).
    staged: StagedInputs<R>,
    /// A chain's tokens carry their probabilities
    /// (`Drafter::set_probabilities`); trees always do.
    probabilities: bool,
    /// A deferred tree's candidates, kept buffers per level.
    tree_out: Vec<TopOut>,
}

/// One depth of a deferred chain: its selection on the device, and per
/// sequence fed (in row order) how many of its rows it fed.
type ChainDepth<R> = (DeviceTensor<R>, Vec<(usize, usize)>);

/// Candidates of one token and its log-probability from a probability
/// read back (`None`: the drafter was not asked for probabilities).
fn chain_candidate(token: u32, prob: Option<f32>) -> Vec<(u32, f32)> {
    vec![(token, prob.map_or(0.0, |p| p.max(0.0).ln()))]
}

/// One level of a deferred tree on the device: its rows' candidates
/// (probabilities and ids, `[rows, w]`) and, when a level follows, the
/// entries it picked (`draftc_ops::tree_frontier`).
struct TreeLevel<R: Runtime> {
    probs: DeviceTensor<R>,
    ids: DeviceTensor<R>,
    picks: Option<DeviceTensor<R>>,
}

/// A deferred tree's next level on the device: ids, path log-probabilities
/// and memory-tail bits of its rows.
type NextLevel<R> = (DeviceTensor<R>, DeviceTensor<R>, DeviceTensor<R>);

/// The target's final RMS norm (weight, eps), for memory streams seeded
/// through `target.norm` (drafter `name`).
pub(super) fn final_norm_of<R: Runtime>(
    target: &TargetModel<R>,
    name: &str,
) -> Result<(DeviceTensor<R>, f32), EngineError> {
    let weight = target
        .weights
        .exports
        .get("final_norm")
        .map(|p| format!("{p}.weight"))
        .unwrap_or_default();
    // Gemma's final norm scales by 1 + w: bound under that name.
    let bound = match target.weights.final_norm {
        draftc_ir::op::NormWeight::Plain => weight.clone(),
        draftc_ir::op::NormWeight::UnitOffset => format!("1 + {weight}"),
    };
    let w = target.exec.weight(&bound).ok_or_else(|| {
        EngineError::Invalid(format!(
            "drafter `{name}` seeds a memory through `target.norm`, but the target binds no \
             final norm weight `{weight}`"
        ))
    })?;
    Ok((w.clone(), target.weights.eps.get() as f32))
}

/// A drafter's pass inputs packed from rows of other tensors (Beagle's
/// memory rows, EAGLE's `prev` rows). While its executor replays, each
/// input goes into a buffer kept per (stream, rows) for the drafter's life,
/// so a replayed pass reads it where its recording did; otherwise into a
/// fresh tensor, or no copy at all ([`AutoregressiveDrafter::pack`]).
pub(super) struct StagedInputs<R: Runtime>(HashMap<(usize, usize), DeviceTensor<R>>);

impl<R: Runtime> StagedInputs<R> {
    pub fn new() -> Self {
        StagedInputs(HashMap::new())
    }

    /// Stream `k`'s `parts` packed into a `[Σ rows, d]` tensor; `staged`:
    /// the executor replays.
    pub fn pack(
        &mut self,
        client: &ComputeClient<R>,
        staged: bool,
        k: usize,
        parts: &[Part<R>],
        d: usize,
        dtype: DType,
    ) -> Result<DeviceTensor<R>, EngineError> {
        if !staged {
            return AutoregressiveDrafter::pack(client, parts, d, dtype);
        }
        let n = parts.iter().map(|p| p.rows.len()).sum();
        let out = self
            .0
            .entry((k, n))
            .or_insert_with(|| DeviceTensor::empty(client, &[n, d], dtype))
            .clone();
        let groups = AutoregressiveDrafter::groups(parts);
        AutoregressiveDrafter::gather_parts(client, &groups, d, &out)?;
        Ok(out)
    }
}

/// The trees an autoregressive drafter grows, level by level (it and
/// [`super::EagleDrafter`] share it): the round's shape, the draft length
/// `l` a chain runs to, and the confidence cut (`--confidence`).
pub(super) struct TreePlan {
    pub shape: TreeShape,
    pub l: usize,
    pub confidence: Option<Confidence>,
}

impl TreePlan {
    pub fn new(shape: TreeShape, l: usize) -> TreePlan {
        TreePlan {
            shape,
            l,
            confidence: None,
        }
    }

    /// The draft length it aims for ([`Drafter::length`]).
    pub fn length(&self) -> usize {
        match &self.shape {
            TreeShape::Chain | TreeShape::MultiSequence { .. } => self.l,
            TreeShape::Static(b) => b.len(),
            TreeShape::Dynamic { depth, .. } => *depth,
        }
    }

    /// Cuts its trees by `confidence` ([`Drafter::set_confidence`]); a
    /// multi-sequence tree has its own threshold.
    pub fn set_confidence(&mut self, confidence: Confidence) -> Result<(), EngineError> {
        if matches!(self.shape, TreeShape::MultiSequence { .. }) {
            return Err(EngineError::Invalid(format!(
                "--confidence cuts chain, static and dynamic trees; `{}` has its own threshold",
                self.shape
            )));
        }
        self.confidence = Some(confidence);
        Ok(())
    }

    /// A builder of one sequence's tree of at most `budget` nodes.
    pub fn builder(&self, budget: usize) -> TreeBuilder {
        TreeBuilder::new(&self.shape, budget).with_confidence(self.confidence)
    }
}

impl<R: Runtime> AutoregressiveDrafter<R> {
    /// `graph`: a compiled autoregressive drafter; `shape`: the round's tree.
    pub(super) fn new(b: &Build<'_, R>, shape: TreeShape) -> Result<Self, EngineError> {
        let (client, graph, target, dtype) = (b.client, b.graph, b.target, b.dtype);
        for &i in &graph.inputs {
            let n = graph.node(i);
            if !matches!(n.op, Op::Input(InputSource::External)) {
                return Err(EngineError::Invalid(format!(
                    "autoregressive drafter `{}`: input `{}` must be token ids (memory streams carry target states)",
                    graph.name, n.name
                )));
            }
        }
        if graph.nodes.iter().any(|n| match &n.op {
            Op::Attention(a) => a.cache != Cache::None,
            _ => false,
        }) {
            return Err(EngineError::Invalid(format!(
                "autoregressive drafter `{}` keeps its own KV cache; draftc drafts autoregressively \
                 over memory streams only (Beagle, SPIRe)",
                graph.name
            )));
        }
        if graph.memories.is_empty() {
            return Err(EngineError::Invalid(format!(
                "autoregressive drafter `{}` has no memory stream (`memory x = target.hidden[i]`)",
                graph.name
            )));
        }
        let streams: Vec<Stream> = graph
            .memories
            .iter()
            .map(|m| Stream {
                name: m.name.to_string(),
                tap: m.seed,
                normed: m.normed,
            })
            .collect();
        for s in &streams {
            if !graph.appends.iter().any(|(n, _)| n.to_string() == s.name) {
                return Err(EngineError::Invalid(format!(
                    "autoregressive drafter `{}`: memory `{}` is never appended to (`append {} = …`)",
                    graph.name, s.name, s.name
                )));
            }
        }
        let (exec, l, vocab) = b.parts(true)?;
        let final_norm = if streams.iter().any(|s| s.normed) {
            Some(final_norm_of(target, &graph.name)?)
        } else {
            None
        };
        let vocab_map = match &vocab {
            Some(v) => Some(DeviceTensor::upload_u32(client, v.ids(), &[v.ids().len()])?),
            None => None,
        };
        let slots = target.caches.slots();
        Ok(AutoregressiveDrafter {
            vocab,
            vocab_map,
            exec,
            caches: CacheStore::new(
                client,
                slots,
                target.caches.capacity() + DRAFT_ROWS,
                ops_dtype(dtype),
            ),
            tree: TreePlan::new(shape, l),
            in_cache: vec![0; slots],
            pending: (0..slots).map(|_| Pending::new(streams.len())).collect(),
            sources: 0,
            selected: SelectOut::default(),
            top: TopOut::default(),
            chain_out: Vec::new(),
            chain_top: Vec::new(),
            staged: StagedInputs::new(),
            probabilities: false,
            tree_out: Vec::new(),
            streams,
            final_norm,
        })
    }

    /// Packs the rows of `parts` into one `[Σ rows, d]` tensor, in order:
    /// one gather per source (destinations need not be contiguous), and no
    /// copy at all when the parts are one tensor's rows in order.
    pub(super) fn pack(
        client: &ComputeClient<R>,
        parts: &[Part<R>],
        d: usize,
        dtype: DType,
    ) -> Result<DeviceTensor<R>, EngineError> {
        let groups = Self::groups(parts);
        let at: usize = groups.iter().map(|g| g.3.len()).sum();
        if let [(_, t, src, _)] = groups.as_slice() {
            let n = t.numel() / d.max(1);
            if src.len() == n && src.iter().enumerate().all(|(i, &r)| r as usize == i) {
                return Ok(t.reshape(&[n, d])?);
            }
        }
        let out = DeviceTensor::<R>::empty(client, &[at, d], dtype);
        Self::gather_parts(client, &groups, d, &out)?;
        Ok(out)
    }

    /// `parts` grouped by source tensor: (source, tensor, source rows,
    /// destination rows).
    fn groups(parts: &[Part<R>]) -> Vec<Group<'_, R>> {
        let mut groups: Vec<Group<'_, R>> = Vec::new();
        let mut at = 0u32;
        for p in parts.iter().filter(|p| !p.rows.is_empty()) {
            let g = match groups.iter().position(|g| g.0 == p.source) {
                Some(g) => g,
                None => {
                    groups.push((p.source, &p.tensor, Vec::new(), Vec::new()));
                    groups.len() - 1
                }
            };
            let n = p.rows.len() as u32;
            groups[g].2.extend_from_slice(&p.rows);
            groups[g].3.extend(at..at + n);
            at += n;
        }
        groups
    }

    fn gather_parts(
        client: &ComputeClient<R>,
        groups: &[Group<'_, R>],
        d: usize,
        out: &DeviceTensor<R>,
    ) -> Result<(), EngineError> {
        for (_, t, src, dst) in groups {
            let t = t.reshape(&[t.numel() / d, d])?;
            draftc_ops::kv::gather_rows(client, &t, src, out, dst)?;
        }
        Ok(())
    }

    /// A deferred tree's next frontier, picked on the device from the last
    /// level's candidates (`None` once the driving builders are done).
    /// Every sequence queries the same rows at every level (one budget, no
    /// cut); `tail` is the memory tail the last level saw.
    #[allow(clippy::too_many_arguments)]
    fn expand_on_device(
        &self,
        client: &ComputeClient<R>,
        builders: &[TreeBuilder],
        active: &[usize],
        n: usize,
        tail: usize,
        levels: &mut [TreeLevel<R>],
        last: Option<NextLevel<R>>,
    ) -> Result<Option<NextLevel<R>>, EngineError> {
        let f = builders.first().map_or(0, |b| b.pending().len());
        if f == 0 {
            return Ok(None);
        }
        let level = levels
            .last_mut()
            .ok_or_else(|| EngineError::Invalid("a tree frontier before any level".into()))?;
        let rows = level.probs.shape()[0];
        if active.len() != n || rows % n != 0 || builders.iter().any(|b| b.pending().len() != f) {
            return Err(EngineError::Invalid(format!(
                "a deferred tree needs every sequence at the same level: {} of {n} active,                  {rows} rows",
                active.len()
            )));
        }
        // The roots: path log-probability 0, no tail bits.
        let (cum, vis) = match last {
            Some((_, cum, vis)) => (cum, vis),
            None => (
                DeviceTensor::zeroed(client, &[n], DType::F32),
                DeviceTensor::zeroed(client, &[n, 1], DType::U32),
            ),
        };
        let words = (tail + rows / n).div_ceil(32).max(1);
        let next_ids = DeviceTensor::empty(client, &[n * f], DType::U32);
        let next_cum = DeviceTensor::empty(client, &[n * f], DType::F32);
        let next_vis = DeviceTensor::empty(client, &[n * f, words], DType::U32);
        let picks = DeviceTensor::empty(client, &[n * f], DType::U32);
        draftc_ops::tree_frontier::expand_frontier(
            client,
            &level.probs,
            &level.ids,
            &cum,
            &vis,
            n,
            f,
            tail as u32,
            draftc_ops::tree_frontier::Frontier {
                next_ids: &next_ids,
                next_cum: &next_cum,
                next_vis: &next_vis,
                picks: &picks,
            },
        )?;
        level.picks = Some(picks);
        let next_ids = self.to_target_on_device(client, next_ids)?;
        Ok(Some((next_ids, next_cum, next_vis)))
    }

    /// Draft ids on the device as target ids (a lookup through the reduced
    /// vocabulary's map; the ids themselves without one).
    fn to_target_on_device(
        &self,
        client: &ComputeClient<R>,
        ids: DeviceTensor<R>,
    ) -> Result<DeviceTensor<R>, EngineError> {
        let Some(map) = &self.vocab_map else {
            return Ok(ids);
        };
        let out = DeviceTensor::empty(client, ids.shape(), DType::U32);
        draftc_ops::embedding::lookup_u32(client, map, &ids, &out)?;
        Ok(out)
    }

    /// A deferred tree's levels, read in one request, rebuilt per sequence
    /// from the device's picks.
    fn read_tree(
        &self,
        client: &ComputeClient<R>,
        levels: &[TreeLevel<R>],
        n: usize,
        budget: usize,
    ) -> Result<Vec<DraftTree>, EngineError> {
        let floats: Vec<&DeviceTensor<R>> = levels.iter().map(|l| &l.probs).collect();
        let mut ints: Vec<&DeviceTensor<R>> = levels.iter().map(|l| &l.ids).collect();
        ints.extend(levels.iter().filter_map(|l| l.picks.as_ref()));
        let (probs, ints) = DeviceTensor::download_f32_u32_all(client, &floats, &ints)?;
        let (ids, picks) = ints.split_at(levels.len());
        (0..n)
            .map(|s| {
                let layers: Vec<Vec<Vec<Candidate>>> = levels
                    .iter()
                    .zip(probs.iter().zip(ids))
                    .map(|(l, (p, id))| {
                        let (rows, w) = (l.probs.shape()[0] / n, l.probs.shape()[1]);
                        let mut cands: Vec<Vec<Candidate>> = (s * rows..(s + 1) * rows)
                            .map(|r| {
                                (r * w..(r + 1) * w)
                                    .map(|e| (id[e], p[e].max(0.0).ln()))
                                    .collect()
                            })
                            .collect();
                        if let Some(v) = &self.vocab {
                            v.map_candidates(&mut cands);
                        }
                        cands
                    })
                    .collect();
                let picks: Vec<Vec<u32>> = picks
                    .iter()
                    .map(|pk| {
                        let f = pk.len() / n;
                        pk[s * f..(s + 1) * f].to_vec()
                    })
                    .collect();
                TreeBuilder::dynamic_from_picks(&self.tree.shape, budget, &layers, &picks)
                    .map_err(|e| EngineError::Invalid(e.to_string()))
            })
            .collect()
    }
}

impl<R: Runtime> Drafter<R> for AutoregressiveDrafter<R> {
    super::drafters::own_executor!(tree R);

    fn observe(&mut self, pass: Observed<'_, R>) -> Result<(), EngineError> {
        let (c, out, committed) = (pass.client, pass.out, pass.committed);
        // Every sequence's committed rows at once: one gather (and norm)
        // per stream, each sequence keeping its rows of the result.
        let Some((live, rows)) = live_rows(committed) else {
            return Ok(());
        };
        let to: Vec<u32> = (0..rows.len() as u32).collect();
        for (i, s) in self.streams.iter().enumerate() {
            let src = out.get(&format!("hidden[{}]", s.tap))?;
            let d = *src.shape().last().unwrap_or(&1);
            let src = src.reshape(&[src.numel() / d, d])?;
            let dst = DeviceTensor::<R>::empty(c, &[rows.len(), d], src.dtype());
            draftc_ops::kv::gather_rows(c, &src, &rows, &dst, &to)?;
            let dst = match (&self.final_norm, s.normed) {
                (Some((w, eps)), true) => {
                    let normed = DeviceTensor::<R>::empty(c, dst.shape(), dst.dtype());
                    draftc_ops::rms_norm::rms_norm(c, &dst, w, *eps, &normed)?;
                    normed
                }
                _ => dst,
            };
            self.sources += 1;
            let mut at = 0u32;
            for x in &live {
                let n = x.rows.len() as u32;
                self.pending[x.slot].parts[i].push(Part {
                    source: self.sources,
                    tensor: dst.clone(),
                    rows: (at..at + n).collect(),
                });
                at += n;
            }
        }
        for x in &live {
            self.pending[x.slot]
                .positions
                .extend_from_slice(&x.positions);
        }
        Ok(())
    }

    fn draft(&mut self, call: DraftCall<'_, '_, R>) -> Result<Vec<DraftTree>, EngineError> {
        let (target, seqs, budget) = (call.target, call.seqs, call.budget);
        self.draft_levels(target, seqs, budget)
    }

    fn set_probabilities(&mut self, on: bool) -> bool {
        self.probabilities = on;
        true
    }

    fn reset(&mut self, slot: usize) {
        self.caches.reset(slot);
        if let Some(c) = self.in_cache.get_mut(slot) {
            *c = 0;
        }
        if let Some(p) = self.pending.get_mut(slot) {
            *p = Pending::new(self.streams.len());
        }
    }
}
