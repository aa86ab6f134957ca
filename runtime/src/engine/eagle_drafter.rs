//! [`EagleDrafter`]: autoregressive drafters with a self-attention KV cache
//! of their own and `prev(stream)` reads, the EAGLE family
//! (`models/eagle.draft`, `models/eagle3.draft`).
//!
//! A step at position `p` reads token `t_p` and `prev(feats)`, the stream's
//! row at `p − 1`: the target's seed row (its final-normed last state for
//! EAGLE, the learned fusion `fc([HS[a], HS[b], HS[c]])` for EAGLE-3) where
//! `p − 1` is committed, the drafter's own appended row (`append feats = x`)
//! at its parent where `p − 1` was drafted. Its attention attends over its
//! own cache of earlier steps' keys.
//! At position 0 `prev` reads a zero row, or (`prev_start skip`, EAGLE-3
//! as its reference runs it) position 0 has no row at all: the first row is
//! token 1 with the stream's row at position 0.
//!
//! Per round, for every sequence:
//! 1. **Committed rows first.** The cache is truncated to the rows computed
//!    from committed tokens and target seeds (drafted rows of the last round
//!    are dropped; EAGLE recomputes them from the target's features). The
//!    first pass runs every committed position not yet in the cache (the
//!    rows committed since the last draft, and the last committed token, the
//!    root) as queries: their keys enter the cache for good, and the root's
//!    output predicts the first draft level.
//! 2. **Draft level by level** ([`TreeBuilder`]): a node at depth `k` runs at
//!    position `committed + k + 1` with its token and its parent's output
//!    row; its keys go to the cache's tail, and it sees the committed rows
//!    and, of the tail, only its ancestors' rows and its own
//!    ([`MemoryTail`] over the own cache).
//! 3. The tree goes to verification; nothing of the drafting is kept.
//!
//! Seeds are computed when the target commits rows ([`Drafter::observe`]):
//! the taps gathered, normed through the target's final norm or fused by
//! the drafter's `fc` weight (`Plan::seed_weights`), kept per position until
//! a first pass has read them.

use std::collections::{BTreeMap, HashMap};

use cubecl::prelude::*;
use draftc_ir::op::{Cache, InputSource, Op};
use draftc_ops::linear::{Epilogue, Prologue};
use draftc_ops::DeviceTensor;

use super::autoregressive_drafter::{final_norm_of, Part, StagedInputs, TreePlan};
use super::drafters::{live_rows, Build, DraftCall, Drafter, Observed, SeqView};
use super::select::{top_candidates_into, TopOut};
use super::target::EngineError;
use crate::exec::{
    ops_dtype, CacheStore, DraftVocab, Executor, MemoryTail, Outputs, SeqStep, Step,
};
use crate::speculation::tree::Candidate;
use crate::speculation::{DraftTree, TreeBuilder, TreeShape};

/// Draft rows a round may add per sequence beyond the target's capacity.
const DRAFT_ROWS: usize = 512;

/// A memory stream read through `prev`: how its committed rows are seeded.
struct Stream<R: Runtime> {
    name: String,
    width: usize,
    taps: Vec<i64>,
    /// Through the target's final norm (EAGLE).
    normed: bool,
    /// The learned fusion `[width, taps · d]` (EAGLE-3's `fc`).
    fuse: Option<DeviceTensor<R>>,
    /// One zero row: the predecessor of position 0 (`prev_start zero`).
    zero: DeviceTensor<R>,
}

/// A row of a device tensor.
type Row<R> = (u64, DeviceTensor<R>, u32);

/// EAGLE-style drafting (see the module docs).
pub struct EagleDrafter<R: Runtime> {
    exec: Executor<R>,
    caches: CacheStore<R>,
    tree: TreePlan,
    streams: Vec<Stream<R>>,
    /// `prev(stream)` inputs: graph input name and stream index.
    prevs: Vec<(String, usize)>,
    vocab: Option<DraftVocab>,
    final_norm: Option<(DeviceTensor<R>, f32)>,
    /// Per slot: committed positions whose keys are in the cache (or, with
    /// `prev_start skip`, that need none: position 0).
    in_cache: Vec<usize>,
    /// Per slot: the cache rows of those positions.
    in_rows: Vec<usize>,
    /// `prev_start skip`: position 0 has no row.
    skip_first: bool,
    /// Per slot and stream: seed rows of committed positions not yet read
    /// by a first pass (and the last one read), by position.
    seeds: Vec<Vec<BTreeMap<u32, Row<R>>>>,
    sources: u64,
    top: TopOut,
    /// Each `prev` input's packed rows (kept while replaying).
    staged: StagedInputs<R>,
}

impl<R: Runtime> EagleDrafter<R> {
    /// `graph`: a compiled autoregressive drafter with a cache of its own
    /// or `prev` reads; `shape`: the round's tree.
    pub(super) fn new(b: &Build<'_, R>, shape: TreeShape) -> Result<Self, EngineError> {
        let (client, graph, target, dtype) = (b.client, b.graph, b.target, b.dtype);
        let invalid =
            |why: String| EngineError::Invalid(format!("drafter `{}`: {why}", graph.name));
        let mut prevs = Vec::new();
        for &i in &graph.inputs {
            let n = graph.node(i);
            match &n.op {
                Op::Input(InputSource::External) => {}
                Op::Input(InputSource::MemoryPrev(m)) => {
                    let k = graph
                        .memories
                        .iter()
                        .position(|d| &d.name == m)
                        .ok_or_else(|| invalid(format!("`prev({m})` reads no declared memory")))?;
                    prevs.push((n.name.clone(), k));
                }
                _ => {
                    return Err(invalid(format!(
                        "input `{}` must be token ids or `prev(…)` (target states come through \
                         memory streams)",
                        n.name
                    )))
                }
            }
        }
        for n in &graph.nodes {
            if let Op::Attention(a) = &n.op {
                if a.memory.is_some() || matches!(a.cache, Cache::Target(_)) {
                    return Err(invalid(format!(
                        "`{}` attends over a memory stream or the target's cache; a drafter with \
                         its own cache reads its streams through `prev(…)` only",
                        n.name
                    )));
                }
            }
        }
        let (exec, l, vocab) = b.parts(true)?;
        let dt = ops_dtype(dtype);
        let mut streams = Vec::new();
        for m in &graph.memories {
            if !graph.appends.iter().any(|(n, _)| n == &m.name) {
                return Err(invalid(format!(
                    "memory `{}` is never appended to (`append {} = …`)",
                    m.name, m.name
                )));
            }
            let width = m
                .width
                .eval(&graph.symbol_values)
                .ok_or_else(|| invalid(format!("memory `{}` has no constant width", m.name)))?
                as usize;
            let fuse = match &m.fuse {
                Some(f) => {
                    let name = format!("{}.weight", f.prefix);
                    Some(exec.weight(&name).cloned().ok_or_else(|| {
                        invalid(format!("the fusion weight `{name}` was not bound"))
                    })?)
                }
                None => None,
            };
            streams.push(Stream {
                name: m.name.to_string(),
                width,
                taps: m.taps(),
                normed: m.normed,
                fuse,
                zero: DeviceTensor::zeros(client, &[1, width], dt),
            });
        }
        let final_norm = if streams.iter().any(|s| s.normed) {
            Some(final_norm_of(target, &graph.name)?)
        } else {
            None
        };
        let slots = target.caches.slots();
        Ok(EagleDrafter {
            vocab,
            caches: CacheStore::new(client, slots, target.caches.capacity() + DRAFT_ROWS, dt),
            tree: TreePlan::new(shape, l),
            in_cache: vec![0; slots],
            in_rows: vec![0; slots],
            skip_first: graph.meta.prev_start == draftc_ir::graph::PrevStart::Skip,
            seeds: (0..slots)
                .map(|_| (0..streams.len()).map(|_| BTreeMap::new()).collect())
                .collect(),
            streams,
            prevs,
            final_norm,
            exec,
            sources: 0,
            top: TopOut::default(),
            staged: StagedInputs::new(),
        })
    }

    /// The seed rows of `rows` of the target pass `out` for stream `s`.
    fn seed_rows(
        &self,
        c: &ComputeClient<R>,
        out: &Outputs<R>,
        s: &Stream<R>,
        rows: &[u32],
    ) -> Result<DeviceTensor<R>, EngineError> {
        let n = rows.len();
        let k = s.taps.len();
        let mut gathered: Option<(DeviceTensor<R>, usize)> = None;
        for (j, tap) in s.taps.iter().enumerate() {
            let src = out.get(&format!("hidden[{tap}]"))?;
            let d = *src.shape().last().unwrap_or(&1);
            let src = src.reshape(&[src.numel() / d, d])?;
            let (dst, _) = gathered
                .get_or_insert_with(|| (DeviceTensor::<R>::empty(c, &[n * k, d], src.dtype()), d));
            // Row r's taps side by side: `[n, k·d]` viewed as `[n·k, d]`.
            let to: Vec<u32> = (0..n as u32).map(|r| r * k as u32 + j as u32).collect();
            draftc_ops::kv::gather_rows(c, &src, rows, dst, &to)?;
        }
        let (taps, d) = gathered.ok_or_else(|| {
            EngineError::Invalid(format!("memory `{}` reads no target state", s.name))
        })?;
        let taps = taps.reshape(&[n, k * d])?;
        Ok(match (&s.fuse, &self.final_norm, s.normed) {
            (Some(w), _, _) => {
                let y = DeviceTensor::<R>::empty(c, &[n, s.width], taps.dtype());
                draftc_ops::linear::linear(c, &taps, w, Prologue::None, Epilogue::None, &y)?;
                y
            }
            (None, Some((w, eps)), true) => {
                let y = DeviceTensor::<R>::empty(c, taps.shape(), taps.dtype());
                draftc_ops::rms_norm::rms_norm(c, &taps, w, *eps, &y)?;
                y
            }
            _ => taps,
        })
    }

    /// Packs stream `k`'s `rows` (one device row each) into a `[rows,
    /// width]` tensor ([`StagedInputs`]).
    fn pack(
        &mut self,
        c: &ComputeClient<R>,
        k: usize,
        rows: &[Row<R>],
    ) -> Result<DeviceTensor<R>, EngineError> {
        let (width, dtype) = (self.streams[k].width, self.exec.dtype());
        let parts: Vec<Part<R>> = rows
            .iter()
            .map(|(source, t, r)| Part {
                source: *source,
                tensor: t.clone(),
                rows: vec![*r],
            })
            .collect();
        let staged = self.exec.replay_on();
        self.staged.pack(c, staged, k, &parts, width, dtype)
    }
}

/// One draft call's state across its levels: the builders, and per
/// sequence each queried node's output rows (`None`: the root) in the pass
/// that queried it, its tail index in the cache, and the tail's length.
struct EagleLevels<R: Runtime> {
    builders: Vec<TreeBuilder>,
    out_of: Vec<HashMap<Option<usize>, Vec<Row<R>>>>,
    tail_of: Vec<HashMap<usize, usize>>,
    tail: Vec<usize>,
    first_level: bool,
}

/// A level's pass: its step, ids, each stream's `prev` rows and, per
/// active sequence, what it queried.
type LevelRows<R> = (Step, Vec<u32>, Vec<Vec<Row<R>>>, Vec<(usize, Queried)>);

impl<R: Runtime> EagleDrafter<R> {
    /// A level's rows: at the first level each sequence's committed
    /// positions not in the cache, then its root; later, its pending nodes,
    /// each fed its parent's predicted rows and seeing its ancestors' tail
    /// rows and its own.
    fn level_rows(
        &self,
        seqs: &[SeqView<'_>],
        st: &EagleLevels<R>,
        active: &[usize],
    ) -> Result<LevelRows<R>, EngineError> {
        let mut step = Step::default();
        let mut ids = Vec::new();
        let mut prev_rows: Vec<Vec<Row<R>>> = vec![Vec::new(); self.streams.len()];
        let mut queried = Vec::new();
        let mut row = 0;
        for &i in active {
            let s = &seqs[i];
            let b = &st.builders[i];
            let mut positions = Vec::new();
            let mut committed_rows = 0;
            if st.first_level {
                // Committed positions not in the cache, then the root;
                // with `prev_start skip` position 0 only as a root (a
                // sequence of one token: its `prev` reads zeros).
                let mut from = self.in_cache[s.slot].min(s.committed);
                if self.skip_first && s.committed > 0 {
                    from = from.max(1);
                }
                for p in from..=s.committed {
                    ids.push(*s.tokens.get(p).unwrap_or(&0));
                    positions.push(p as u32);
                    for (k, st) in self.streams.iter().enumerate() {
                        let r = match p.checked_sub(1) {
                            None => (0, st.zero.clone(), 0),
                            Some(q) => self.seeds[s.slot][k].get(&(q as u32)).cloned().ok_or_else(
                                || {
                                    EngineError::Invalid(format!(
                                        "drafter `{}`: no target state of position {q} \
                                             (sequence {})",
                                        self.exec.graph().name,
                                        s.slot
                                    ))
                                },
                            )?,
                        };
                        prev_rows[k].push(r);
                    }
                }
                committed_rows = positions.len() - 1;
                step.seqs.push(SeqStep {
                    slot: s.slot,
                    positions: positions.clone(),
                    parents: None,
                    memory_tail: None,
                });
            } else {
                let work = b.work();
                let mut visible = Vec::new();
                for (j, &n) in b.pending().iter().enumerate() {
                    let (tok, depth) = match n {
                        None => (*s.tokens.last().unwrap_or(&0), 0),
                        Some(n) => (work.node(n).token, work.node(n).depth + 1),
                    };
                    ids.push(tok);
                    positions.push((s.committed + depth) as u32);
                    let parent = n.and_then(|n| work.node(n).parent);
                    let from = st.out_of[i].get(&parent).cloned().ok_or_else(|| {
                        EngineError::Invalid("a draft node's parent was never run".into())
                    })?;
                    for (rows, r) in prev_rows.iter_mut().zip(from) {
                        rows.push(r);
                    }
                    // Ancestors' tail rows and its own.
                    let mut sees: Vec<usize> = Vec::new();
                    if let Some(n) = n {
                        let path = work.path_to(n);
                        sees.extend(
                            path[..path.len() - 1]
                                .iter()
                                .filter_map(|a| st.tail_of[i].get(a).copied()),
                        );
                    }
                    sees.push(st.tail[i] + j);
                    visible.push(sees);
                }
                step.seqs.push(SeqStep {
                    slot: s.slot,
                    positions: positions.clone(),
                    parents: None,
                    memory_tail: Some(MemoryTail {
                        len: st.tail[i] + positions.len(),
                        visible,
                    }),
                });
            }
            let nodes: Vec<Option<usize>> = if st.first_level {
                vec![None]
            } else {
                b.pending().to_vec()
            };
            queried.push((
                i,
                Queried {
                    first: row,
                    nodes,
                    committed_rows,
                },
            ));
            row += positions.len();
        }
        Ok((step, ids, prev_rows, queried))
    }

    /// Candidates for a level's node rows (not its committed ones), fed to
    /// the builders; each node's predicted stream rows are kept for its
    /// children.
    fn feed_level(
        &mut self,
        client: &ComputeClient<R>,
        out: &crate::exec::Outputs<R>,
        active: &[usize],
        queried: Vec<(usize, Queried)>,
        st: &mut EagleLevels<R>,
    ) -> Result<(), EngineError> {
        // The stream rows each node predicted (its children's `prev`).
        self.sources += 1;
        let predicted: Vec<DeviceTensor<R>> = self
            .streams
            .iter()
            .map(|st| out.get(&st.name).cloned())
            .collect::<Result<_, _>>()?;
        let logits = out.get("logits")?;
        let vocab = *logits.shape().last().unwrap_or(&1);
        let logits = logits.reshape(&[logits.numel() / vocab, vocab])?;
        // Only the node rows need candidates (not the committed ones).
        let mut pick = Vec::new();
        for (_, q) in &queried {
            let from = q.first + q.committed_rows;
            pick.extend((from..from + q.nodes.len()).map(|r| r as u32));
        }
        let picked = DeviceTensor::<R>::empty(client, &[pick.len(), vocab], logits.dtype());
        let to: Vec<u32> = (0..pick.len() as u32).collect();
        draftc_ops::kv::gather_rows(client, &logits, &pick, &picked, &to)?;
        let wants = active
            .iter()
            .map(|&i| st.builders[i].wants())
            .max()
            .unwrap_or(1);
        let mut cands: Vec<Vec<Candidate>> =
            top_candidates_into(client, &picked, wants, &mut self.top)?;
        if let Some(v) = &self.vocab {
            v.map_candidates(&mut cands);
        }
        let mut at = 0;
        for (i, q) in queried {
            let from = q.first + q.committed_rows;
            for (j, node) in q.nodes.iter().enumerate() {
                let rows = predicted
                    .iter()
                    .map(|t| (self.sources, t.clone(), (from + j) as u32))
                    .collect();
                st.out_of[i].insert(*node, rows);
                if let (false, Some(n)) = (st.first_level, node) {
                    st.tail_of[i].insert(*n, st.tail[i] + j);
                }
            }
            if !st.first_level {
                st.tail[i] += q.nodes.len();
            }
            let n = q.nodes.len();
            st.builders[i]
                .feed(cands[at..at + n].to_vec())
                .map_err(|e| EngineError::Invalid(e.to_string()))?;
            at += n;
        }
        Ok(())
    }
}

/// One pass's queries of a sequence: its first output row, the tree nodes
/// queried (`None`: the root), and how many committed rows came first.
struct Queried {
    first: usize,
    nodes: Vec<Option<usize>>,
    committed_rows: usize,
}

impl<R: Runtime> Drafter<R> for EagleDrafter<R> {
    super::drafters::own_executor!(tree R);

    fn observe(&mut self, pass: Observed<'_, R>) -> Result<(), EngineError> {
        let (c, out, committed) = (pass.client, pass.out, pass.committed);
        let Some((live, rows)) = live_rows(committed) else {
            return Ok(());
        };
        for k in 0..self.streams.len() {
            let seeds = self.seed_rows(c, out, &self.streams[k], &rows)?;
            self.sources += 1;
            let mut at = 0u32;
            for x in &live {
                for &p in &x.positions {
                    self.seeds[x.slot][k].insert(p, (self.sources, seeds.clone(), at));
                    at += 1;
                }
            }
        }
        Ok(())
    }

    fn draft(&mut self, call: DraftCall<'_, '_, R>) -> Result<Vec<DraftTree>, EngineError> {
        let (target, seqs, budget) = (call.target, call.seqs, call.budget);
        let client = target.client().clone();
        for s in seqs {
            self.caches.truncate(s.slot, self.in_rows[s.slot]);
        }
        let mut st = EagleLevels {
            builders: seqs.iter().map(|_| self.tree.builder(budget)).collect(),
            out_of: vec![HashMap::new(); seqs.len()],
            tail_of: vec![HashMap::new(); seqs.len()],
            tail: vec![0; seqs.len()],
            first_level: true,
        };
        loop {
            let active: Vec<usize> = (0..seqs.len())
                .filter(|&i| !st.builders[i].is_done())
                .collect();
            if active.is_empty() || budget == 0 {
                break;
            }
            let (step, ids, prev_rows, queried) = self.level_rows(seqs, &st, &active)?;
            let mut inputs = BTreeMap::new();
            for (name, k) in self.prevs.clone() {
                inputs.insert(name, self.pack(&client, k, &prev_rows[k])?);
            }
            // The ids ride in the pass's own upload (a replay writes them
            // where its recording did).
            let uploads = [("ids", ids.as_slice())];
            let out = self
                .exec
                .run_uploading(&step, &uploads, &inputs, &mut self.caches, None)?;
            drop(inputs);
            if st.first_level {
                // Every cache of the drafter holds the same rows.
                let cache = self.caches.caches().into_iter().next();
                for &i in &active {
                    let s = &seqs[i];
                    self.in_cache[s.slot] = s.committed + 1;
                    self.in_rows[s.slot] = cache.as_ref().map_or(0, |c| self.caches.len(c, s.slot));
                    // Every seed so far is read for good: the next first
                    // pass starts at the position after the root.
                    let keep = s.committed as u32;
                    for m in &mut self.seeds[s.slot] {
                        m.retain(|&p, _| p >= keep);
                    }
                }
            }
            self.feed_level(&client, &out, &active, queried, &mut st)?;
            st.first_level = false;
        }
        Ok(st.builders.into_iter().map(TreeBuilder::finish).collect())
    }

    fn set_probabilities(&mut self, _on: bool) -> bool {
        // Its candidates always come with their probabilities.
        true
    }

    fn reset(&mut self, slot: usize) {
        self.caches.reset(slot);
        if let Some(c) = self.in_cache.get_mut(slot) {
            *c = 0;
        }
        if let Some(c) = self.in_rows.get_mut(slot) {
            *c = 0;
        }
        if let Some(s) = self.seeds.get_mut(slot) {
            s.iter_mut().for_each(BTreeMap::clear);
        }
    }
}
