//! [`TreeBuilder`]: the draft-tree shapes of [`TreeShape`] built level by
//! level, so that an autoregressive drafter can expand every node of a level
//! — of every sequence in a batch — in one forward pass.
//!
//! The protocol: while [`TreeBuilder::is_done`] is false, the drafter
//! computes continuations for each node of [`TreeBuilder::pending`] (`None`
//! is the root: the last committed token; `Some(i)` is node `i` of
//! [`TreeBuilder::work`]) and hands them to [`TreeBuilder::feed`], in the
//! same order. It needs at most [`TreeBuilder::wants`] candidates per node
//! (more are allowed; the builder keeps its top ones). [`TreeBuilder::finish`]
//! returns the round's tree, at most `budget` nodes.
//!
//! The sequential builders of [`DraftTree`] (`greedy_chain`, `dynamic`, …)
//! drive this same state machine with one `expand(path)` call per pending
//! node, so both paths build identical trees.
//!
//! [`Confidence`] makes a chain, static or dynamic tree adaptive: a node
//! whose path probability under the drafter is below `keep` is not drafted,
//! and one below `expand` gets no children, so a round verifies more tokens
//! where the drafter is sure and fewer (down to none) where it is not.

use std::fmt;
use std::str::FromStr;

use super::tree::{top_k, Candidate, DraftTree, TreeShape};
use super::SpecError;

/// Confidence cut on the drafter's path probability (the product of its
/// probabilities along a node's path, EAGLE-2's acceptance estimate): a
/// node below `keep` is left out of the tree, a node below `expand` is not
/// expanded (its children are never drafted). Like the draft length
/// policies of SpecDec++ and EAGLE-2's confidence, it only decides what is
/// drafted and verified, so decoding stays lossless. Text form
/// `KEEP[,EXPAND]` (`EXPAND` defaults to `KEEP`), each in `[0, 1]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Confidence {
    pub keep: f32,
    pub expand: f32,
}

impl Confidence {
    /// Log-space thresholds (`ln 0 = −∞`: no cut).
    fn log(self) -> (f32, f32) {
        (self.keep.ln(), self.expand.ln())
    }
}

impl fmt::Display for Confidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.keep, self.expand)
    }
}

impl FromStr for Confidence {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        let err = |reason: String| SpecError::InvalidConfig {
            what: "--confidence",
            reason: format!(
                "`{text}`: {reason}; expected KEEP[,EXPAND], \
                 probabilities in [0, 1] such as 0.1,0.5"
            ),
        };
        let prob = |v: &str| -> Result<f32, SpecError> {
            match v.trim().parse::<f32>() {
                Ok(x) if (0.0..=1.0).contains(&x) => Ok(x),
                _ => Err(err(format!("`{}` is not a probability", v.trim()))),
            }
        };
        let (keep, expand) = match text.split_once(',') {
            Some((k, e)) => (prob(k)?, prob(e)?),
            None => {
                let k = prob(text)?;
                (k, k)
            }
        };
        Ok(Confidence { keep, expand })
    }
}

/// Where a shape's construction stands.
#[derive(Clone, Debug)]
enum Phase {
    Done,
    /// Chain: extend the last node.
    Chain,
    /// Static: `level` is the depth whose children are being added.
    Static {
        branching: Vec<usize>,
        level: usize,
    },
    /// Dynamic (EAGLE-2): expansions so far, the newest layer.
    Dynamic {
        depth: usize,
        topk: usize,
        nodes: usize,
        expansions: usize,
    },
    /// DuoDecoding: the root's candidates are wanted first.
    MultiRoot {
        max_seqs: usize,
    },
    /// The top candidate's continuation (for the threshold).
    MultiSecond {
        first: Vec<Candidate>,
        max_seqs: usize,
    },
    /// Every sequence continues greedily up to its length.
    MultiGrow,
}

/// One DuoDecoding sequence: its tokens, its length goal and its tip node.
#[derive(Clone, Debug)]
struct Sequence {
    tokens: Vec<Candidate>,
    goal: usize,
    tip: usize,
    stopped: bool,
}

/// A draft tree under construction (see the module docs).
#[derive(Clone, Debug)]
pub struct TreeBuilder {
    budget: usize,
    work: DraftTree,
    phase: Phase,
    pending: Vec<Option<usize>>,
    wants: usize,
    seqs: Vec<Sequence>,
    /// [`Confidence`] in log space: (keep, expand); `None`: no cut.
    cut: Option<(f32, f32)>,
    /// A dynamic shape expands its whole frontier (no exact cut).
    full: bool,
}

impl TreeBuilder {
    /// A builder for `shape` with at most `budget` draft nodes.
    pub fn new(shape: &TreeShape, budget: usize) -> TreeBuilder {
        let mut b = TreeBuilder {
            budget,
            work: DraftTree::new(),
            phase: Phase::Done,
            pending: vec![None],
            wants: 1,
            seqs: Vec::new(),
            cut: None,
            full: false,
        };
        if budget == 0 {
            b.pending.clear();
            return b;
        }
        b.phase = match shape {
            TreeShape::Chain => Phase::Chain,
            TreeShape::Static(branching) if !branching.is_empty() => {
                b.wants = branching[0];
                Phase::Static {
                    branching: branching.clone(),
                    level: 0,
                }
            }
            TreeShape::Dynamic { depth, topk, nodes } if *depth > 0 && *topk > 0 => {
                // A node's children past the tree's size never rank in it.
                b.wants = (*topk).min((*nodes).min(budget)).max(1);
                Phase::Dynamic {
                    depth: *depth,
                    topk: *topk,
                    nodes: *nodes,
                    expansions: 0,
                }
            }
            TreeShape::MultiSequence { seqs } if *seqs > 0 => {
                b.wants = *seqs;
                Phase::MultiRoot { max_seqs: *seqs }
            }
            _ => Phase::Done,
        };
        if matches!(b.phase, Phase::Done) {
            b.pending.clear();
        }
        b
    }

    /// Applies a [`Confidence`] cut to chain, static and dynamic shapes
    /// (DuoDecoding's sequences have their own threshold and ignore it).
    /// Call before the first [`TreeBuilder::feed`].
    pub fn with_confidence(mut self, confidence: Option<Confidence>) -> Self {
        self.cut = confidence.map(Confidence::log);
        self
    }

    /// A dynamic shape expands every frontier node, without the exact cut
    /// of [`DraftTree::rank_floor`]: the rows each level queries then
    /// depend on the shape and the budget alone, not on the candidates'
    /// scores, which a drafter that picks its frontier on the device needs
    /// to know ahead. The finished tree is the same (the cut is exact).
    pub fn without_cut(mut self) -> Self {
        self.full = true;
        self
    }

    /// A dynamic tree whose frontiers were picked elsewhere (on the device,
    /// `draftc_ops::tree_frontier`), built as [`TreeBuilder::without_cut`]
    /// builds it. `layers[j]` holds the candidates (best first, `w` each)
    /// of every node level `j` queried (level 0: the root); `picks[j]` the
    /// entries (`row · w + candidate`) of level `j`'s candidates that level
    /// `j + 1` queried, in its row order.
    pub fn dynamic_from_picks(
        shape: &TreeShape,
        budget: usize,
        layers: &[Vec<Vec<Candidate>>],
        picks: &[Vec<u32>],
    ) -> Result<DraftTree, SpecError> {
        let TreeShape::Dynamic { nodes, .. } = shape else {
            return Err(SpecError::InvalidConfig {
                what: "dynamic_from_picks",
                reason: format!("`{shape}` is not a dynamic tree"),
            });
        };
        let mut work = DraftTree::new();
        let mut queried: Vec<Option<usize>> = vec![None];
        for (j, rows) in layers.iter().enumerate() {
            if rows.len() != queried.len() {
                return Err(SpecError::LengthMismatch {
                    what: "dynamic_from_picks: candidate lists of a level",
                    expected: queried.len(),
                    found: rows.len(),
                });
            }
            let w = rows.iter().map(Vec::len).max().unwrap_or(0);
            let mut entry = vec![None; rows.len() * w];
            for (r, (&parent, kids)) in queried.iter().zip(rows).enumerate() {
                for (c, &(tok, lp)) in kids.iter().enumerate() {
                    entry[r * w + c] = Some(work.push(parent, tok, lp)?);
                }
            }
            let Some(next) = picks.get(j) else { break };
            queried = next
                .iter()
                .map(|&e| {
                    entry.get(e as usize).copied().flatten().map(Some).ok_or(
                        SpecError::InvalidConfig {
                            what: "dynamic_from_picks",
                            reason: format!("level {j} picked entry {e} of {}", entry.len()),
                        },
                    )
                })
                .collect::<Result<_, _>>()?;
        }
        Ok(work.prune_to_best((*nodes).min(budget)))
    }

    /// Path log-probability a child of `parent` with `logprob` would have
    /// (`logprob` as [`top_k`] sanitised it).
    fn path_logprob(&self, parent: Option<usize>, logprob: f32) -> f32 {
        parent.map_or(0.0, |p| self.work.node(p).cum_logprob) + logprob
    }

    /// Whether a child of `parent` with `logprob` passes the keep cut.
    fn keeps(&self, parent: Option<usize>, logprob: f32) -> bool {
        self.cut
            .is_none_or(|(keep, _)| self.path_logprob(parent, logprob) >= keep)
    }

    /// Whether node `n` passes the expand cut.
    fn expands(&self, n: usize) -> bool {
        self.cut
            .is_none_or(|(_, expand)| self.work.score(n) >= expand)
    }

    /// Nodes to expand next (`None` = the root); empty once done.
    pub fn pending(&self) -> &[Option<usize>] {
        &self.pending
    }

    /// Candidates needed per pending node.
    pub fn wants(&self) -> usize {
        self.wants
    }

    /// The nodes built so far (pending ids index it).
    pub fn work(&self) -> &DraftTree {
        &self.work
    }

    pub fn is_done(&self) -> bool {
        self.pending.is_empty()
    }

    /// Continuations of every pending node, in `pending` order.
    pub fn feed(&mut self, children: Vec<Vec<Candidate>>) -> Result<(), SpecError> {
        if children.len() != self.pending.len() {
            return Err(SpecError::LengthMismatch {
                what: "TreeBuilder::feed: one candidate list per pending node",
                expected: self.pending.len(),
                found: children.len(),
            });
        }
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let wants = self.wants;
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        self.phase = match phase {
            Phase::Done => Phase::Done,
            Phase::Chain => {
                let parent = pending[0];
                match top_k(children.into_iter().next().unwrap_or_default(), 1).first() {
                    Some(&(tok, lp)) if self.keeps(parent, lp) => {
                        let n = self.work.add(parent, tok, lp);
                        if self.work.len() < self.budget && self.expands(n) {
                            self.pending = vec![Some(n)];
                        }
                        Phase::Chain
                    }
                    _ => Phase::Done,
                }
            }
            Phase::Static { branching, level } => {
                let mut next = self.add_children(&pending, children, wants);
                next.retain(|&n| self.expands(n));
                let level = level + 1;
                if level < branching.len() && !next.is_empty() {
                    self.wants = branching[level];
                    self.pending = next.into_iter().map(Some).collect();
                }
                Phase::Static { branching, level }
            }
            Phase::Dynamic {
                depth,
                topk,
                nodes,
                expansions,
            } => {
                let mut layer = self.add_children(&pending, children, wants);
                let expansions = expansions + 1;
                if expansions < depth && !layer.is_empty() {
                    let w = &self.work;
                    layer.sort_by(|&a, &b| {
                        w.node(b)
                            .cum_logprob
                            .total_cmp(&w.node(a).cum_logprob)
                            .then(a.cmp(&b))
                    });
                    layer.truncate(topk);
                    layer.retain(|&n| self.expands(n));
                    // Exact cut: a node no better than the tree's current
                    // `size`-th best cannot have a descendant in the final
                    // tree (see `DraftTree::rank_floor`), so it is not
                    // expanded; once none is left the tree is final. The
                    // kept tree is the one full expansion would prune to.
                    if let Some(floor) = self
                        .work
                        .rank_floor(nodes.min(self.budget))
                        .filter(|_| !self.full)
                    {
                        layer.retain(|&n| self.work.score(n) > floor);
                    }
                    self.pending = layer.into_iter().map(Some).collect();
                }
                Phase::Dynamic {
                    depth,
                    topk,
                    nodes,
                    expansions,
                }
            }
            Phase::MultiRoot { max_seqs } => {
                let first = top_k(children.into_iter().next().unwrap_or_default(), max_seqs);
                match first.first() {
                    None => Phase::Done,
                    Some(&(tok, lp)) => {
                        let top = self.work.add(None, tok, lp);
                        if self.budget >= 2 {
                            self.pending = vec![Some(top)];
                            self.wants = 1;
                            Phase::MultiSecond { first, max_seqs }
                        } else {
                            self.start_sequences(&first, None, max_seqs);
                            Phase::MultiGrow
                        }
                    }
                }
            }
            Phase::MultiSecond { first, max_seqs } => {
                let second = top_k(children.into_iter().next().unwrap_or_default(), 1);
                self.start_sequences(&first, second.first().copied(), max_seqs);
                Phase::MultiGrow
            }
            Phase::MultiGrow => {
                for (at, s) in self
                    .seqs
                    .iter_mut()
                    .filter(|s| !s.stopped && s.tokens.len() < s.goal)
                    .enumerate()
                {
                    match top_k(children[at].clone(), 1).first() {
                        Some(&(tok, lp)) => {
                            s.tip = self.work.add(Some(s.tip), tok, lp);
                            s.tokens.push((tok, lp));
                        }
                        None => s.stopped = true,
                    }
                }
                self.grow_pending();
                Phase::MultiGrow
            }
        };
        Ok(())
    }

    /// Adds the top `k` of each pending node's candidates that pass the
    /// keep cut as its children; returns the new nodes in order.
    fn add_children(
        &mut self,
        pending: &[Option<usize>],
        children: Vec<Vec<Candidate>>,
        k: usize,
    ) -> Vec<usize> {
        let mut added = Vec::new();
        for (&parent, kids) in pending.iter().zip(children) {
            for (tok, lp) in top_k(kids, k) {
                if !self.keeps(parent, lp) {
                    break; // best first: the rest score no higher
                }
                added.push(self.work.add(parent, tok, lp));
            }
        }
        added
    }

    /// DuoDecoding (paper 003 §3.2): θ = p(1,1)·p(1,2); every runner-up
    /// first token with p > θ starts a sequence (at most `max_seqs` in all);
    /// the budget is split evenly, the remainder to the top sequence.
    fn start_sequences(&mut self, first: &[Candidate], second: Option<Candidate>, max_seqs: usize) {
        let top = first[0];
        let threshold = second.map(|s| top.1 + s.1);
        let extra: Vec<Candidate> = match threshold {
            Some(th) => first[1..]
                .iter()
                .copied()
                .filter(|c| c.1 > th)
                .take((max_seqs - 1).min(self.budget - 1))
                .collect(),
            None => Vec::new(),
        };
        let m = 1 + extra.len();
        let each = self.budget / m;
        let mut main = Sequence {
            tokens: vec![top],
            goal: each + self.budget % m,
            tip: 0,
            stopped: false,
        };
        if let Some(s) = second {
            if main.goal >= 2 {
                main.tip = self.work.add(Some(0), s.0, s.1);
                main.tokens.push(s);
            }
        }
        self.seqs.push(main);
        for c in extra {
            let tip = self.work.add(None, c.0, c.1);
            self.seqs.push(Sequence {
                tokens: vec![c],
                goal: each,
                tip,
                stopped: false,
            });
        }
        self.wants = 1;
        self.grow_pending();
    }

    fn grow_pending(&mut self) {
        self.pending = self
            .seqs
            .iter()
            .filter(|s| !s.stopped && s.tokens.len() < s.goal)
            .map(|s| Some(s.tip))
            .collect();
    }

    /// The round's tree: at most `budget` nodes, parents before children.
    pub fn finish(self) -> DraftTree {
        match self.phase {
            Phase::Dynamic { nodes, .. } => self.work.prune_to_best(nodes.min(self.budget)),
            Phase::MultiGrow | Phase::MultiSecond { .. } | Phase::MultiRoot { .. }
                if !self.seqs.is_empty() =>
            {
                let seqs: Vec<Vec<Candidate>> = self.seqs.into_iter().map(|s| s.tokens).collect();
                DraftTree::from_sequences(&seqs, self.budget)
            }
            _ => self.work.prune_to_best(self.budget),
        }
    }

    /// Drives the builder with one `expand(path)` call per pending node (the
    /// sequential form; `path` holds the tokens from the root's child down).
    pub fn run(mut self, expand: &mut dyn FnMut(&[u32]) -> Vec<Candidate>) -> DraftTree {
        while !self.is_done() {
            let kids: Vec<Vec<Candidate>> = self
                .pending
                .iter()
                .map(|p| {
                    let path = p.map_or_else(Vec::new, |n| self.work.path_tokens(n));
                    expand(&path)
                })
                .collect();
            if self.feed(kids).is_err() {
                break;
            }
        }
        self.finish()
    }
}
