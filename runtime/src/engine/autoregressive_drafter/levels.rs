//! One draft call of the [`AutoregressiveDrafter`], level by level: each
//! level lays out the pending nodes' query rows and the memory rows they
//! append ([`AutoregressiveDrafter::level_rows`]), binds the pass's inputs
//! ([`AutoregressiveDrafter::level_inputs`]), runs the drafter's pass,
//! turns its logits into candidates ([`AutoregressiveDrafter::candidates`]:
//! on the host, or left on the device for a plain chain or a dynamic tree
//! expanded there) and feeds the tree builders
//! ([`AutoregressiveDrafter::feed_level`]); a chain drafted on the device
//! is read once at the end ([`AutoregressiveDrafter::read_chain`]).

use std::collections::{BTreeMap, HashMap};

use cubecl::prelude::*;
use draftc_ops::DeviceTensor;

use super::{
    chain_candidate, AutoregressiveDrafter, ChainDepth, NextLevel, Part, Pending, Predicted,
    TreeLevel,
};
use crate::device::TreePicks;
use crate::engine::drafters::SeqView;
use crate::engine::select::{
    argmax_on_device, select_tokens_into, top_candidates_into, top_candidates_on_device, SelectOut,
    TopOut,
};
use crate::engine::target::{EngineError, TargetModel};
use crate::engine::Sampling;
use crate::exec::{MemoryRows, MemoryTail, Outputs, SeqStep, Step, MEMORY_TAIL_BITS};
use crate::speculation::{DraftTree, TreeBuilder, TreeShape};

/// A draft call's state across its levels.
struct Levels<R: Runtime> {
    builders: Vec<TreeBuilder>,
    /// A deferred tree's levels on the device, and its next level's rows.
    levels: Vec<TreeLevel<R>>,
    frontier: Option<NextLevel<R>>,
    /// Per sequence: tail index of the predicted state of each queried
    /// node (`None` = the root), and the tail length.
    state_of: Vec<HashMap<Option<usize>, usize>>,
    tail: Vec<usize>,
    predicted: Option<Predicted<R>>,
    /// A plain chain (no confidence cut): only the argmax is needed.
    greedy_chain: bool,
    /// A plain chain drafted with its tokens left on the device: each
    /// depth's ids are the last depth's selection (mapped to target ids
    /// there for a reduced vocabulary), and every depth's ids are read at
    /// once at the end (one wait for the device, not one a depth) and fed
    /// to fresh builders. The builders that drive the loop get token 0 for
    /// every node meanwhile: a chain's shape (one node a depth, up to the
    /// budget) does not depend on its tokens, and those trees are dropped.
    deferred: bool,
    /// A dynamic tree without a confidence cut picks its frontiers on the
    /// device (`draftc_ops::tree_frontier`) when `DRAFTC_TREE_PICKS` asks
    /// for it (`TreePicks`; the host picks by default), and reads every
    /// level's candidates once, at the end. The builders that drive the
    /// loop expand every frontier node (no exact cut), so each level's rows
    /// are known ahead; they only count rows (their candidates are token
    /// numbers 0..w of equal score), and the tree itself is rebuilt from
    /// the device's picks.
    deferred_tree: bool,
    /// Per depth of a deferred chain: its selection on the device and whom
    /// its rows fed; and (when asked for) its tokens' probabilities.
    chain: Vec<ChainDepth<R>>,
    chain_probs: Vec<DeviceTensor<R>>,
}

/// One level's pass: its step and ids, the memory rows it appends (per
/// stream, with their lengths and positions) and, per sequence, the nodes
/// it queries with their positions.
struct LevelRows<R: Runtime> {
    step: Step,
    ids: Vec<u32>,
    mem_parts: Vec<Vec<Part<R>>>,
    mem_lens: Vec<usize>,
    mem_pos: Vec<u32>,
    queried: HashMap<usize, (Vec<Option<usize>>, Vec<u32>)>,
    width: usize,
}

impl<R: Runtime> AutoregressiveDrafter<R> {
    /// The drafts of `seqs`, at most `budget` tokens each.
    pub(super) fn draft_levels(
        &mut self,
        target: &mut TargetModel<R>,
        seqs: &[SeqView<'_>],
        budget: usize,
    ) -> Result<Vec<DraftTree>, EngineError> {
        let client = target.client().clone();
        for s in seqs {
            self.caches.truncate(s.slot, self.in_cache[s.slot]);
        }
        let deferred_tree = matches!(self.tree.shape, TreeShape::Dynamic { .. })
            && self.tree.confidence.is_none()
            && TreePicks::chosen() == TreePicks::Device;
        let greedy_chain = self.tree.shape == TreeShape::Chain && self.tree.confidence.is_none();
        let mut st = Levels {
            builders: seqs
                .iter()
                .map(|_| {
                    let b = self.tree.builder(budget);
                    if deferred_tree {
                        b.without_cut()
                    } else {
                        b
                    }
                })
                .collect(),
            levels: Vec::new(),
            frontier: None,
            state_of: vec![HashMap::new(); seqs.len()],
            tail: vec![0; seqs.len()],
            predicted: None,
            greedy_chain,
            deferred: greedy_chain,
            deferred_tree,
            chain: Vec::new(),
            chain_probs: Vec::new(),
        };
        loop {
            let active: Vec<usize> = (0..seqs.len())
                .filter(|&i| !st.builders[i].is_done())
                .collect();
            if active.is_empty() {
                break;
            }
            let first_level = st.predicted.is_none();
            let mut rows = self.level_rows(seqs, &mut st, &active, first_level)?;
            let (inputs, host_ids) = self.level_inputs(&client, &st, &mut rows)?;
            // Ids known on the host ride in the pass's own upload (a
            // replay writes them where its recording did).
            let uploads = [("ids", rows.ids.as_slice())];
            let uploads: &[(&str, &[u32])] = if host_ids { &uploads } else { &[] };
            let out =
                self.exec
                    .run_uploading(&rows.step, uploads, &inputs, &mut self.caches, None)?;
            // The ids buffer is free again for this depth's selection.
            drop(inputs);
            if first_level {
                // The target states are in the caches now.
                for &i in &active {
                    let slot = seqs[i].slot;
                    self.in_cache[slot] += self.pending[slot].positions.len();
                    self.pending[slot] = Pending::new(self.streams.len());
                }
            }
            let wants = active
                .iter()
                .map(|&i| st.builders[i].wants())
                .max()
                .unwrap_or(1);
            let cands = self.candidates(&client, out.get("logits")?, wants, &mut st)?;
            self.feed_level(&out, &active, cands, rows.queried, &mut st)?;
            if st.deferred_tree {
                let frontier = st.frontier.take();
                st.frontier = self.expand_on_device(
                    &client,
                    &st.builders,
                    &active,
                    seqs.len(),
                    st.tail[active[0]],
                    &mut st.levels,
                    frontier,
                )?;
            }
        }
        if st.deferred_tree && !st.levels.is_empty() {
            return self.read_tree(&client, &st.levels, seqs.len(), budget);
        }
        if !st.deferred || st.chain.is_empty() {
            return Ok(st.builders.into_iter().map(TreeBuilder::finish).collect());
        }
        self.read_chain(&client, &st, seqs.len(), budget)
    }

    /// A level's rows: per active sequence, the memory rows it appends
    /// (the committed target states at the first level, the states the
    /// last level predicted after it) and its pending nodes' queries, each
    /// seeing the predicted states of its ancestors.
    fn level_rows(
        &self,
        seqs: &[SeqView<'_>],
        st: &mut Levels<R>,
        active: &[usize],
        first_level: bool,
    ) -> Result<LevelRows<R>, EngineError> {
        let mut r = LevelRows {
            step: Step::default(),
            ids: Vec::new(),
            mem_parts: vec![Vec::new(); self.streams.len()],
            mem_lens: Vec::new(),
            mem_pos: Vec::new(),
            queried: HashMap::new(),
            width: 0,
        };
        for &i in active {
            let s = &seqs[i];
            // New memory rows of this sequence.
            let (count, positions) = if first_level {
                let p = &self.pending[s.slot];
                for (k, parts) in p.parts.iter().enumerate() {
                    for part in parts {
                        r.width = *part.tensor.shape().last().unwrap_or(&1);
                        r.mem_parts[k].push(part.clone());
                    }
                }
                (p.positions.len(), p.positions.clone())
            } else {
                let pred = st
                    .predicted
                    .as_ref()
                    .ok_or_else(|| EngineError::Invalid("no predicted states to append".into()))?;
                let (first, nodes, pos) = pred.seqs.get(&i).cloned().unwrap_or_default();
                let rows: Vec<u32> = (first as u32..(first + nodes.len()) as u32).collect();
                for (k, t) in pred.rows.iter().enumerate() {
                    r.width = *t.shape().last().unwrap_or(&1);
                    r.mem_parts[k].push(Part {
                        source: pred.source,
                        tensor: t.clone(),
                        rows: rows.clone(),
                    });
                }
                for (j, node) in nodes.iter().enumerate() {
                    st.state_of[i].insert(*node, st.tail[i] + j);
                }
                st.tail[i] += nodes.len();
                (nodes.len(), pos)
            };
            r.mem_lens.push(count);
            r.mem_pos.extend(positions);
            // Query rows: the pending nodes.
            let b = &st.builders[i];
            let work = b.work();
            let mut positions = Vec::new();
            let mut visible = Vec::new();
            let last = *s.tokens.last().unwrap_or(&0);
            for &p in b.pending() {
                let (tok, depth) = match p {
                    None => (last, 0),
                    Some(n) => (work.node(n).token, work.node(n).depth + 1),
                };
                r.ids.push(tok);
                positions.push((s.committed + depth) as u32);
                let mut sees: Vec<usize> = st.state_of[i].get(&None).copied().into_iter().collect();
                if let Some(n) = p {
                    let path = work.path_to(n);
                    for a in &path[..path.len() - 1] {
                        sees.extend(st.state_of[i].get(&Some(*a)).copied());
                    }
                }
                visible.push(sees);
            }
            r.queried
                .insert(i, (b.pending().to_vec(), positions.clone()));
            r.step.seqs.push(SeqStep {
                slot: s.slot,
                positions,
                parents: None,
                memory_tail: (!first_level).then(|| MemoryTail {
                    len: st.tail[i],
                    visible,
                }),
            });
        }
        Ok(r)
    }

    /// A level pass's inputs: its ids when they are on the device already
    /// (the last depth's selection or the device's frontier; otherwise the
    /// pass uploads them itself: the flag) and each memory stream's new
    /// rows, packed (their lengths and positions go into the step).
    fn level_inputs(
        &mut self,
        client: &ComputeClient<R>,
        st: &Levels<R>,
        r: &mut LevelRows<R>,
    ) -> Result<(BTreeMap<String, DeviceTensor<R>>, bool), EngineError> {
        let mut inputs = BTreeMap::new();
        let ids = &r.ids;
        let ids_t = match (st.chain.last(), &st.frontier) {
            (None, Some((next, _, vis))) => {
                if next.numel() != ids.len() {
                    return Err(EngineError::Invalid(format!(
                        "a tree level of {} rows after a frontier of {}",
                        ids.len(),
                        next.numel()
                    )));
                }
                inputs.insert(MEMORY_TAIL_BITS.to_string(), vis.clone());
                Some(next.clone())
            }
            (chain, _) => match chain {
                Some((sel, _)) if sel.numel() == ids.len() => Some(sel.clone()),
                Some((sel, _)) => {
                    return Err(EngineError::Invalid(format!(
                        "a chain depth of {} rows after one of {}",
                        ids.len(),
                        sel.numel()
                    )))
                }
                None => None,
            },
        };
        let host_ids = ids_t.is_none();
        if let Some(t) = ids_t {
            inputs.insert("ids".to_string(), t);
        }
        let dtype = self.exec.dtype();
        for k in 0..self.streams.len() {
            let d = if r.width == 0 {
                self.exec.graph().memories[k]
                    .width
                    .eval(&self.exec.graph().symbol_values)
                    .unwrap_or(1) as usize
            } else {
                r.width
            };
            let name = self.streams[k].name.clone();
            let parts = &r.mem_parts[k];
            let staged = self.exec.replay_on();
            let rows = self.staged.pack(client, staged, k, parts, d, dtype)?;
            inputs.insert(name.clone(), rows);
            r.step.memory.insert(
                name,
                MemoryRows {
                    data: Vec::new(),
                    lens: r.mem_lens.clone(),
                    positions: r.mem_pos.clone(),
                },
            );
        }
        Ok((inputs, host_ids))
    }

    /// Candidates for every queried row of a level (`wants` per row): a
    /// deferred chain's selection and a deferred tree's candidates stay on
    /// the device (the driving builders get stand-in tokens that only
    /// count rows), a plain chain
    /// takes the argmax, a tree its top candidates; draft ids map to target
    /// ids for a reduced vocabulary.
    fn candidates(
        &mut self,
        client: &ComputeClient<R>,
        logits: &DeviceTensor<R>,
        wants: usize,
        st: &mut Levels<R>,
    ) -> Result<Vec<Vec<(u32, f32)>>, EngineError> {
        let depth = st.chain.len();
        let mut cands: Vec<Vec<(u32, f32)>> = if st.deferred {
            if self.chain_out.len() <= depth {
                self.chain_out.resize_with(depth + 1, SelectOut::default);
            }
            let sel = if self.probabilities {
                if self.chain_top.len() <= depth {
                    self.chain_top.resize_with(depth + 1, TopOut::default);
                }
                let (probs, ids) =
                    top_candidates_on_device(client, logits, 1, &mut self.chain_top[depth])?;
                let rows = ids.numel();
                st.chain_probs.push(probs);
                ids.reshape(&[rows])?
            } else {
                argmax_on_device(client, logits, &mut self.chain_out[depth])?
            };
            let sel = self.to_target_on_device(client, sel)?;
            // Token 0 for the driving builders; the real tokens come
            // with the one read after the last depth.
            let rows = sel.numel();
            st.chain.push((sel, Vec::new()));
            vec![vec![(0, 0.0)]; rows]
        } else if st.deferred_tree {
            let level = st.levels.len();
            if self.tree_out.len() <= level {
                self.tree_out.resize_with(level + 1, TopOut::default);
            }
            let (probs, ids) =
                top_candidates_on_device(client, logits, wants, &mut self.tree_out[level])?;
            let (rows, w) = (probs.shape()[0], probs.shape()[1]);
            st.levels.push(TreeLevel {
                probs,
                ids,
                picks: None,
            });
            // Token numbers 0..w of equal score: the driving builders'
            // frontier is then their first nodes, as many rows as the
            // device picks.
            vec![(0..w as u32).map(|t| (t, 0.0)).collect(); rows]
        } else if st.greedy_chain {
            select_tokens_into(client, logits, &Sampling::GREEDY, 0, &mut self.selected)?
                .into_iter()
                .map(|t| vec![(t, 0.0)])
                .collect()
        } else {
            top_candidates_into(client, logits, wants, &mut self.top)?
        };
        if let Some(v) = &self.vocab {
            v.map_candidates(&mut cands);
        }
        Ok(cands)
    }

    /// Feeds each active sequence's builder its rows' candidates and keeps
    /// the states the pass predicted (its `append` outputs) for the next
    /// level.
    fn feed_level(
        &mut self,
        out: &Outputs<R>,
        active: &[usize],
        cands: Vec<Vec<(u32, f32)>>,
        mut queried: HashMap<usize, (Vec<Option<usize>>, Vec<u32>)>,
        st: &mut Levels<R>,
    ) -> Result<(), EngineError> {
        let mut row = 0;
        self.sources += 1;
        let mut next = Predicted {
            source: self.sources,
            rows: self
                .streams
                .iter()
                .map(|s| out.get(&s.name).cloned())
                .collect::<Result<_, _>>()?,
            seqs: HashMap::new(),
        };
        for &i in active {
            let (nodes, positions) = queried.remove(&i).unwrap_or_default();
            let n = nodes.len();
            st.builders[i]
                .feed(cands[row..row + n].to_vec())
                .map_err(|e| EngineError::Invalid(e.to_string()))?;
            if let (true, Some((_, fed))) = (st.deferred, st.chain.last_mut()) {
                fed.push((i, n));
            }
            next.seqs.insert(i, (row, nodes, positions));
            row += n;
        }
        st.predicted = Some(next);
        Ok(())
    }

    /// A deferred chain's tokens, all depths in one read, fed to fresh
    /// builders as they were drafted.
    fn read_chain(
        &self,
        client: &ComputeClient<R>,
        st: &Levels<R>,
        n_seqs: usize,
        budget: usize,
    ) -> Result<Vec<DraftTree>, EngineError> {
        let sels: Vec<&DeviceTensor<R>> = st.chain.iter().map(|(t, _)| t).collect();
        let probs: Vec<&DeviceTensor<R>> = st.chain_probs.iter().collect();
        let (probs, tokens) = DeviceTensor::download_f32_u32_all(client, &probs, &sels)?;
        let mut builders: Vec<TreeBuilder> = (0..n_seqs)
            .map(|_| TreeBuilder::new(&self.tree.shape, budget))
            .collect();
        for (d, ((_, fed), toks)) in st.chain.iter().zip(&tokens).enumerate() {
            let mut row = 0;
            for &(i, n) in fed {
                let cands = (row..row + n).map(|r| {
                    chain_candidate(toks[r], probs.get(d).and_then(|p| p.get(r).copied()))
                });
                builders[i]
                    .feed(cands.collect())
                    .map_err(|e| EngineError::Invalid(e.to_string()))?;
                row += n;
            }
        }
        Ok(builders.into_iter().map(TreeBuilder::finish).collect())
    }
}
