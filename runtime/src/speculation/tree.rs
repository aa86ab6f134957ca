//! Draft trees on the host: [`DraftTree`] (tokens, parents, depths, draft
//! log-probabilities), its conversion into the arrays the verify kernels take,
//! greedy acceptance, and the builders that decide a round's tree shape.
//!
//! # Conventions (shared with `draftc_ops`)
//! * Nodes are stored **parents before children**. A node whose `parent` is
//!   `None` attaches to the **last committed token** (the "root"); its depth
//!   is 0. A node's position in the text is `committed + depth`, where
//!   `committed` is the number of committed tokens (the root sits at
//!   `committed - 1`). [`DraftTree::parents_u32`] writes `None` as
//!   [`TREE_ROOT`], so `SeqBatch::tree(committed, &tree.parents_u32())` gives
//!   exactly [`DraftTree::positions`].
//! * The verify forward and `draftc_ops::tree::accept_*` put the root itself
//!   at node 0 (`parents[0] = TREE_ROOT`, every draft node shifted by one):
//!   [`DraftTree::verify_tokens`] / [`DraftTree::verify_parents`].
//! * `logprob` is the drafter's log-probability of the node's token given its
//!   path, clamped to `<= 0` (NaN becomes −∞); `cum_logprob` is the sum along
//!   the path. Ranking by `cum_logprob` is EAGLE-2's global acceptance value.
//!
//! # Builders (each capped by a node budget `k`)
//! | builder | source |
//! | --- | --- |
//! | [`DraftTree::chain`], [`DraftTree::greedy_chain`] | one sequence of `k` tokens |
//! | [`DraftTree::static_from_candidates`] | Medusa/SpecFormer style: per-depth top-k candidates, per-depth branching `b0, b1, …` (paper 000) |
//! | [`DraftTree::expand_static`] | the same branching, children from an autoregressive drafter |
//! | [`DraftTree::dynamic`] | EAGLE-2 dynamic tree (paper 002 §5 uses it): expand the top-k of the newest layer by cumulative log-prob up to `depth`, then rerank and keep the best `nodes` |
//! | [`DraftTree::multi_sequence`] | DuoDecoding dynamic multi-sequence drafting (paper 003 §3.2) |
//! | [`DraftTree::from_sequences`] | several candidate sequences merged into one tree on shared prefixes |
//!
//! The budget `k` counts **draft nodes** (the root is not one) and is a hard
//! cap: under large batches the draft-token budget is the per-round total
//! (paper 000 §3, "fixed draft token budget"; paper 003's drafting budget).
//! Split a batch-wide budget with [`crate::speculation::budget::per_sequence_budgets`].
//!
//! # Greedy acceptance
//! [`DraftTree::longest_accepted_path`] is the host twin of
//! `draftc_ops::tree::accept_ref` in greedy mode: walk from the root, take the
//! first child (in index order) whose token equals the target's argmax at the
//! current node, stop when none does; the bonus is the argmax at the last
//! accepted node (or the root).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use draftc_ops::attention::TREE_ROOT;

use super::builder::{Confidence, TreeBuilder};
use super::SpecError;

/// A drafter's proposal for the next token: `(token, log-probability)`.
pub type Candidate = (u32, f32);

/// One drafted token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftNode {
    pub token: u32,
    /// Earlier node this one follows; `None` = the last committed token.
    pub parent: Option<usize>,
    /// 0 for a child of the last committed token.
    pub depth: usize,
    /// Draft log-probability of `token` given its path (`<= 0`).
    pub logprob: f32,
    /// Sum of `logprob` along the path from the root, this node included.
    pub cum_logprob: f32,
}

/// A draft tree, nodes stored parents before children (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftTree {
    nodes: Vec<DraftNode>,
}

/// Result of greedy acceptance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Accepted node indices in path order (root excluded).
    pub nodes: Vec<usize>,
    /// The target's token after the last accepted node (always emitted).
    pub bonus: u32,
}

impl Accepted {
    /// The tokens a round emits: the accepted nodes' tokens, then the bonus.
    pub fn emitted(&self, tree: &DraftTree) -> Vec<u32> {
        let mut out: Vec<u32> = self.nodes.iter().map(|&n| tree.nodes[n].token).collect();
        out.push(self.bonus);
        out
    }
}

fn sanitize(logprob: f32) -> f32 {
    if logprob.is_nan() {
        f32::NEG_INFINITY
    } else {
        logprob.min(0.0)
    }
}

/// Candidates sorted by log-prob (descending, stable), duplicate tokens
/// dropped (first kept), at most `k`.
pub(crate) fn top_k(mut cands: Vec<Candidate>, k: usize) -> Vec<Candidate> {
    for c in &mut cands {
        c.1 = sanitize(c.1);
    }
    cands.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut seen = std::collections::HashSet::new();
    cands.retain(|c| seen.insert(c.0));
    cands.truncate(k);
    cands
}

impl DraftTree {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a node; `parent` must be an earlier node. Returns its index.
    pub fn push(
        &mut self,
        parent: Option<usize>,
        token: u32,
        logprob: f32,
    ) -> Result<usize, SpecError> {
        let logprob = sanitize(logprob);
        let (depth, cum) = match parent {
            None => (0, 0.0),
            Some(p) => {
                let Some(pn) = self.nodes.get(p) else {
                    return Err(SpecError::InvalidParent {
                        node: self.nodes.len(),
                        parent: p,
                    });
                };
                (pn.depth + 1, pn.cum_logprob)
            }
        };
        self.nodes.push(DraftNode {
            token,
            parent,
            depth,
            logprob,
            cum_logprob: cum + logprob,
        });
        Ok(self.nodes.len() - 1)
    }

    /// Infallible push for builders whose parents are known to exist.
    pub(crate) fn add(&mut self, parent: Option<usize>, token: u32, logprob: f32) -> usize {
        self.push(parent, token, logprob)
            .expect("builders only attach to existing nodes")
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn nodes(&self) -> &[DraftNode] {
        &self.nodes
    }

    pub fn node(&self, i: usize) -> &DraftNode {
        &self.nodes[i]
    }

    pub fn tokens(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.token).collect()
    }

    /// Number of draft levels (0 for an empty tree; a chain of `k` has `k`).
    pub fn levels(&self) -> usize {
        self.nodes.iter().map(|n| n.depth + 1).max().unwrap_or(0)
    }

    /// True when every node has at most one child (a chain, or empty).
    pub fn is_chain(&self) -> bool {
        self.nodes
            .iter()
            .enumerate()
            .all(|(i, n)| n.parent == i.checked_sub(1))
    }

    /// Parents in the form `SeqBatch::tree` takes: `None` → [`TREE_ROOT`].
    pub fn parents_u32(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .map(|n| n.parent.map_or(TREE_ROOT, |p| p as u32))
            .collect()
    }

    /// Text positions `committed + depth` (RoPE positions for the verify pass).
    pub fn positions(&self, committed: usize) -> Vec<u32> {
        self.nodes
            .iter()
            .map(|n| (committed + n.depth) as u32)
            .collect()
    }

    /// Parents of the verify tree `[root, nodes…]` (`draftc_ops::tree`
    /// convention: node 0 is the last committed token).
    pub fn verify_parents(&self) -> Vec<u32> {
        std::iter::once(TREE_ROOT)
            .chain(
                self.nodes
                    .iter()
                    .map(|n| n.parent.map_or(0, |p| p as u32 + 1)),
            )
            .collect()
    }

    /// Tokens of the verify tree `[last_committed, nodes…]`.
    pub fn verify_tokens(&self, last_committed: u32) -> Vec<u32> {
        std::iter::once(last_committed)
            .chain(self.nodes.iter().map(|n| n.token))
            .collect()
    }

    /// Node indices from the root's child down to `node`, inclusive.
    pub fn path_to(&self, node: usize) -> Vec<usize> {
        let mut path = vec![node];
        let mut cur = node;
        while let Some(p) = self.nodes[cur].parent {
            path.push(p);
            cur = p;
        }
        path.reverse();
        path
    }

    /// Tokens along [`Self::path_to`].
    pub fn path_tokens(&self, node: usize) -> Vec<u32> {
        self.path_to(node)
            .into_iter()
            .map(|i| self.nodes[i].token)
            .collect()
    }

    /// Children of `node` (`None` = of the root), in index order.
    pub fn children(&self, node: Option<usize>) -> Vec<usize> {
        (node.map_or(0, |n| n + 1)..self.nodes.len())
            .filter(|&c| self.nodes[c].parent == node)
            .collect()
    }

    /// The drafter's confidence depth by depth along the tree's most likely
    /// path: at each depth, the probability mass of the children of the
    /// path's node (a chain's token probability; a tree level covers what
    /// its siblings cover), then on to the most likely child (the first of
    /// equals). One value per level of that path.
    pub fn path_confidences(&self) -> Vec<f64> {
        let mut out = Vec::new();
        let mut at = None;
        loop {
            let kids = self.children(at);
            let Some(&best) = kids.iter().reduce(|a, b| {
                if self.nodes[*b].logprob > self.nodes[*a].logprob {
                    b
                } else {
                    a
                }
            }) else {
                return out;
            };
            let mass: f64 = kids
                .iter()
                .map(|&k| f64::from(self.nodes[k].logprob).exp())
                .sum();
            out.push(mass.min(1.0));
            at = Some(best);
        }
    }

    /// Nodes without children, in index order.
    pub fn leaves(&self) -> Vec<usize> {
        let mut has_child = vec![false; self.nodes.len()];
        for n in &self.nodes {
            if let Some(p) = n.parent {
                has_child[p] = true;
            }
        }
        (0..self.nodes.len()).filter(|&i| !has_child[i]).collect()
    }

    /// Greedy acceptance (the semantics of `draftc_ops::tree::accept_ref` in
    /// greedy mode). `root_argmax` is the target's argmax after the last
    /// committed token, `node_argmax[i]` its argmax after node `i`.
    pub fn longest_accepted_path(
        &self,
        root_argmax: u32,
        node_argmax: &[u32],
    ) -> Result<Accepted, SpecError> {
        if node_argmax.len() != self.nodes.len() {
            return Err(SpecError::LengthMismatch {
                what: "longest_accepted_path: node_argmax (one per draft node)",
                expected: self.nodes.len(),
                found: node_argmax.len(),
            });
        }
        let mut nodes = Vec::new();
        let mut cur = None;
        let mut best = root_argmax;
        // Children of `cur` all come after it, so one forward scan finds the
        // first matching child in index order at every step.
        for (c, node) in self.nodes.iter().enumerate() {
            if node.parent == cur && node.token == best {
                nodes.push(c);
                cur = Some(c);
                best = node_argmax[c];
            }
        }
        Ok(Accepted { nodes, bonus: best })
    }

    /// Keeps the best `n` nodes by cumulative log-prob, closed under
    /// ancestors (a kept node's parent is kept), in the original order.
    /// Ties go to shallower, then earlier nodes.
    pub fn prune_to_best(&self, n: usize) -> DraftTree {
        if n >= self.nodes.len() {
            return self.clone();
        }
        let mut keep = vec![false; self.nodes.len()];
        for &i in self.ranking().iter().take(n) {
            keep[i] = true;
        }
        self.subtree(&keep)
    }

    /// Keeps the nodes of the first `levels` levels (a chain's first
    /// `levels` tokens), in the original order.
    pub fn prune_to_depth(&self, levels: usize) -> DraftTree {
        let keep: Vec<bool> = self.nodes.iter().map(|n| n.depth < levels).collect();
        self.subtree(&keep)
    }

    /// Node `i`'s rank score in [`DraftTree::prune_to_best`]: the least
    /// cumulative log-probability on its path (a node never ranks above
    /// its parent).
    pub fn score(&self, i: usize) -> f32 {
        let mut s = self.nodes[i].cum_logprob;
        let mut at = self.nodes[i].parent;
        while let Some(p) = at {
            s = s.min(self.nodes[p].cum_logprob);
            at = self.nodes[p].parent;
        }
        s
    }

    /// The score of the `n`-th best node, `None` while the tree has fewer.
    /// A node added later, deeper than every node here, with a score at or
    /// below it, ranks below `n` nodes (ties go to the shallower node) and
    /// is never kept by `prune_to_best(n)`; nor is any of its descendants,
    /// whose scores are no higher.
    pub fn rank_floor(&self, n: usize) -> Option<f32> {
        if n == 0 {
            return Some(f32::INFINITY);
        }
        self.ranking().get(n - 1).map(|&i| self.score(i))
    }

    /// Node ids best first: score descending, then shallower, then older.
    fn ranking(&self) -> Vec<usize> {
        let mut score = vec![0.0f32; self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate() {
            score[i] = match node.parent {
                Some(p) => node.cum_logprob.min(score[p]),
                None => node.cum_logprob,
            };
        }
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.sort_by(|&a, &b| {
            score[b]
                .total_cmp(&score[a])
                .then(self.nodes[a].depth.cmp(&self.nodes[b].depth))
                .then(a.cmp(&b))
        });
        order
    }

    /// The nodes marked in `keep` (must be ancestor-closed), renumbered.
    fn subtree(&self, keep: &[bool]) -> DraftTree {
        let mut remap = vec![usize::MAX; self.nodes.len()];
        let mut out = DraftTree::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if keep[i] {
                let parent = node.parent.map(|p| remap[p]);
                debug_assert!(parent.is_none_or(|p| p != usize::MAX));
                remap[i] = out.add(parent, node.token, node.logprob);
            }
        }
        out
    }

    // ----------------------------------------------------------- builders

    /// One sequence: `tokens[i]` follows `tokens[i - 1]`.
    pub fn chain(tokens: &[u32], logprobs: &[f32]) -> Result<DraftTree, SpecError> {
        if tokens.len() != logprobs.len() {
            return Err(SpecError::LengthMismatch {
                what: "DraftTree::chain: logprobs (one per token)",
                expected: tokens.len(),
                found: logprobs.len(),
            });
        }
        let mut t = DraftTree::new();
        for (i, (&tok, &lp)) in tokens.iter().zip(logprobs).enumerate() {
            t.add(i.checked_sub(1), tok, lp);
        }
        Ok(t)
    }

    /// Greedy chain from an autoregressive drafter: `budget` times the top-1
    /// continuation of the path so far (stops early if `expand` proposes
    /// nothing).
    pub fn greedy_chain(
        budget: usize,
        expand: &mut dyn FnMut(&[u32]) -> Vec<Candidate>,
    ) -> DraftTree {
        TreeBuilder::new(&TreeShape::Chain, budget).run(expand)
    }

    /// Candidate sequences merged on shared prefixes (a trie), inserted in
    /// order until the tree holds `budget` nodes. A shared node keeps the
    /// log-prob of the sequence that created it.
    pub fn from_sequences(seqs: &[Vec<Candidate>], budget: usize) -> DraftTree {
        let mut t = DraftTree::new();
        let mut index: HashMap<(Option<usize>, u32), usize> = HashMap::new();
        'seqs: for seq in seqs {
            let mut cur = None;
            for &(tok, lp) in seq {
                cur = Some(match index.get(&(cur, tok)) {
                    Some(&n) => n,
                    None => {
                        if t.len() >= budget {
                            continue 'seqs;
                        }
                        let n = t.add(cur, tok, lp);
                        index.insert((cur, tok), n);
                        n
                    }
                });
            }
        }
        t
    }

    /// Static tree from per-depth candidates (one list per draft position,
    /// as Medusa heads or SpecFormer's `l` outputs give): every node at depth
    /// `d - 1` (and the root for `d = 0`) gets the top `branching[d]`
    /// candidates of position `d` as children. Pruned to the best `budget`
    /// nodes; `confidence` cuts it by the product of the candidates'
    /// probabilities along a path ([`Confidence`]).
    pub fn static_from_candidates(
        branching: &[usize],
        candidates: &[Vec<Candidate>],
        budget: usize,
        confidence: Option<Confidence>,
    ) -> DraftTree {
        let shape = TreeShape::Static(branching[..branching.len().min(candidates.len())].to_vec());
        TreeBuilder::new(&shape, budget)
            .with_confidence(confidence)
            .run(&mut |path| candidates[path.len()].clone())
    }

    /// Static tree from an autoregressive drafter: each node at depth `d - 1`
    /// (and the root) gets the top `branching[d]` continuations of its path.
    /// Pruned to the best `budget` nodes.
    pub fn expand_static(
        branching: &[usize],
        budget: usize,
        expand: &mut dyn FnMut(&[u32]) -> Vec<Candidate>,
    ) -> DraftTree {
        TreeBuilder::new(&TreeShape::Static(branching.to_vec()), budget).run(expand)
    }

    /// EAGLE-2 dynamic tree (Li et al. 2024, used by Beagle, paper 002 §5):
    /// the root's top-`topk` children form layer 0; for each further layer up
    /// to `depth`, the `topk` nodes of the newest layer with the highest
    /// cumulative log-prob are expanded into their top-`topk` children. Then
    /// every generated node is reranked by cumulative log-prob and the best
    /// `min(nodes, budget)` are kept (ancestor-closed).
    pub fn dynamic(
        depth: usize,
        topk: usize,
        nodes: usize,
        budget: usize,
        expand: &mut dyn FnMut(&[u32]) -> Vec<Candidate>,
    ) -> DraftTree {
        TreeBuilder::new(&TreeShape::Dynamic { depth, topk, nodes }, budget).run(expand)
    }

    /// DuoDecoding dynamic multi-sequence drafting (paper 003 §3.2). With
    /// `p(i, j)` the draft probability of the `i`-th ranked token at position
    /// `j` (position 2 conditioned on the top-1 token at position 1), the
    /// threshold is `θ = p(1,1) · p(1,2)`, the probability of accepting the
    /// first two tokens of the top sequence. Every other first-position
    /// candidate with `p(i,1) > θ` starts its own sequence (at most
    /// `max_seqs` sequences in all), and each sequence continues greedily.
    /// The budget is split evenly between the sequences (as the reference
    /// implementation's `gamma / k`), the remainder going to the top one;
    /// the sequences share only the root, so the tree has exactly
    /// `min(budget, what the drafter proposes)` nodes.
    pub fn multi_sequence(
        max_seqs: usize,
        budget: usize,
        expand: &mut dyn FnMut(&[u32]) -> Vec<Candidate>,
    ) -> DraftTree {
        TreeBuilder::new(&TreeShape::MultiSequence { seqs: max_seqs }, budget).run(expand)
    }

    /// The tree for `shape` with at most `budget` nodes. `Chain` drafts
    /// `budget` tokens greedily.
    pub fn build(
        shape: &TreeShape,
        budget: usize,
        expand: &mut dyn FnMut(&[u32]) -> Vec<Candidate>,
    ) -> DraftTree {
        TreeBuilder::new(shape, budget).run(expand)
    }
}

// -------------------------------------------------------------- TreeShape

/// How a round's draft tree is shaped. Text form (`--tree`, and the
/// description language's `tree` setting, see docs/language.md):
/// `chain`, `static(3, 2, 1)` or just `3,2,1`,
/// `dynamic(depth=5, topk=8, nodes=60)`, `multi(seqs=4)`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TreeShape {
    Chain,
    /// Branching factor per depth.
    Static(Vec<usize>),
    /// EAGLE-2: expansion depth, children per expanded node and nodes kept.
    Dynamic {
        depth: usize,
        topk: usize,
        nodes: usize,
    },
    /// DuoDecoding: at most `seqs` sequences.
    MultiSequence {
        seqs: usize,
    },
}

impl TreeShape {
    /// Largest number of nodes the shape can produce before the budget cap
    /// (`None` = only the budget bounds it).
    pub fn max_nodes(&self) -> Option<usize> {
        match self {
            TreeShape::Chain | TreeShape::MultiSequence { .. } => None,
            TreeShape::Static(b) => {
                let mut total = 0usize;
                let mut width = 1usize;
                for &x in b {
                    width = width.saturating_mul(x);
                    total = total.saturating_add(width);
                }
                Some(total)
            }
            TreeShape::Dynamic { nodes, .. } => Some(*nodes),
        }
    }
}

impl fmt::Display for TreeShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeShape::Chain => write!(f, "chain"),
            TreeShape::Static(b) => {
                let v: Vec<String> = b.iter().map(|x| x.to_string()).collect();
                write!(f, "static({})", v.join(", "))
            }
            TreeShape::Dynamic { depth, topk, nodes } => {
                write!(f, "dynamic(depth={depth}, topk={topk}, nodes={nodes})")
            }
            TreeShape::MultiSequence { seqs } => write!(f, "multi(seqs={seqs})"),
        }
    }
}

impl TryFrom<&draftc_ir::graph::TreeSpec> for TreeShape {
    type Error = SpecError;

    fn try_from(spec: &draftc_ir::graph::TreeSpec) -> Result<Self, SpecError> {
        // The IR only admits values >= 1; re-check rather than cast blindly.
        let text = spec.to_string();
        let pos = |v: i64, what: &str| {
            usize::try_from(v)
                .ok()
                .filter(|&x| x >= 1)
                .ok_or_else(|| SpecError::TreeShape {
                    text: text.clone(),
                    reason: format!("{what} must be a positive integer, found {v}"),
                })
        };
        Ok(match spec {
            draftc_ir::graph::TreeSpec::Chain => TreeShape::Chain,
            draftc_ir::graph::TreeSpec::Static(b) => TreeShape::Static(
                b.iter()
                    .map(|&x| pos(x, "a branching factor"))
                    .collect::<Result<_, _>>()?,
            ),
            draftc_ir::graph::TreeSpec::Dynamic { depth, topk, nodes } => TreeShape::Dynamic {
                depth: pos(*depth, "depth")?,
                topk: pos(*topk, "topk")?,
                nodes: pos(*nodes, "nodes")?,
            },
        })
    }
}

impl FromStr for TreeShape {
    type Err = SpecError;

    fn from_str(text: &str) -> Result<Self, SpecError> {
        let err = |reason: String| SpecError::TreeShape {
            text: text.to_string(),
            reason,
        };
        let s = text.trim();
        if s.is_empty() {
            return Err(err("the text is empty".into()));
        }
        if s == "chain" {
            return Ok(TreeShape::Chain);
        }
        let positive = |v: &str, what: &str| -> Result<usize, SpecError> {
            match v.trim().parse::<usize>() {
                Ok(x) if x >= 1 => Ok(x),
                _ => Err(err(format!(
                    "{what} is `{}`, expected a positive integer",
                    v.trim()
                ))),
            }
        };
        let (name, args) = match s.split_once('(') {
            Some((name, rest)) => {
                let Some(args) = rest.trim_end().strip_suffix(')') else {
                    return Err(err("missing closing `)`".into()));
                };
                (name.trim(), args)
            }
            None if s.starts_with(|c: char| c.is_ascii_digit()) => ("static", s),
            None => return Err(err(format!("unknown shape `{s}`"))),
        };
        match name {
            "static" => {
                let b = args
                    .split(',')
                    .enumerate()
                    .map(|(d, v)| positive(v, &format!("the branching at depth {d}")))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(TreeShape::Static(b))
            }
            "dynamic" | "multi" => {
                let keys: &[&str] = if name == "dynamic" {
                    &["depth", "topk", "nodes"]
                } else {
                    &["seqs"]
                };
                let mut vals = vec![None; keys.len()];
                for part in args.split(',') {
                    let Some((k, v)) = part.split_once('=') else {
                        return Err(err(format!(
                            "`{}` is not KEY=VALUE (keys: {})",
                            part.trim(),
                            keys.join(", ")
                        )));
                    };
                    let k = k.trim();
                    let Some(i) = keys.iter().position(|&x| x == k) else {
                        return Err(err(format!(
                            "unknown key `{k}` for {name} (keys: {})",
                            keys.join(", ")
                        )));
                    };
                    if vals[i].is_some() {
                        return Err(err(format!("`{k}` given twice")));
                    }
                    vals[i] = Some(positive(v, &format!("`{k}`"))?);
                }
                let mut out = Vec::new();
                for (k, v) in keys.iter().zip(vals) {
                    out.push(v.ok_or_else(|| err(format!("missing `{k}=…`")))?);
                }
                Ok(if name == "dynamic" {
                    TreeShape::Dynamic {
                        depth: out[0],
                        topk: out[1],
                        nodes: out[2],
                    }
                } else {
                    TreeShape::MultiSequence { seqs: out[0] }
                })
            }
            "chain" => Err(err("`chain` takes no arguments".into())),
            other => Err(err(format!("unknown shape `{other}`"))),
        }
    }
}

#[cfg(test)]
#[path = "tree_tests.rs"]
mod tests;
