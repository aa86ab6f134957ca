//! The typed graph ("typed graph" layer): SSA values in definition order,
//! each with its op, inputs, type and weight binding; plus the graph-level
//! facts (drafter settings, outputs, hidden-state emits, memory streams).
//!
//! **Invariant:** `nodes` is topologically ordered (inputs precede users) and
//! every node's `ty` satisfies its op's shape rule; `lower` guarantees both
//! and `verify` re-checks them.

use std::collections::BTreeMap;
use std::fmt;

use crate::ast::ItemKind;
use crate::dim::Dim;
use crate::op::{Mask, Op, StateName, F64};
use crate::span::Span;
use crate::types::TensorType;

/// Index of a node in `Graph::nodes`. `Display` is the `%N` form used in debug output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// Unique SSA name in the description syntax (the binding's name, or a
    /// generated `op_N` for nested calls).
    pub name: String,
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub ty: TensorType,
    /// Tensor-name prefix of this node's weights (`model.layers.3.mlp`).
    pub weights: Option<String>,
}

/// How a drafter produces drafts (docs/speculative.md, "Drafters").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DrafterKind {
    /// One pass proposes `l` tokens (SpecFormer, Medusa).
    Parallel,
    /// Step by step with its own state (Beagle, SPIRe).
    Autoregressive,
    /// The target itself with sparse attention (MagicDec).
    SelfSpeculative,
}

impl DrafterKind {
    pub fn name(self) -> &'static str {
        match self {
            DrafterKind::Parallel => "parallel",
            DrafterKind::Autoregressive => "autoregressive",
            DrafterKind::SelfSpeculative => "self_speculative",
        }
    }
}

/// Draft tree shape requested by a drafter.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TreeSpec {
    Chain,
    /// Branching factor per depth, e.g. `static(4, 2, 1)`.
    Static(Vec<i64>),
    /// EAGLE-2 style: expand top-k of the most probable nodes up to `depth`, keep `nodes`.
    Dynamic {
        depth: i64,
        topk: i64,
        nodes: i64,
    },
}

impl fmt::Display for TreeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeSpec::Chain => write!(f, "chain"),
            TreeSpec::Static(b) => {
                let v: Vec<String> = b.iter().map(|x| x.to_string()).collect();
                write!(f, "static({})", v.join(", "))
            }
            TreeSpec::Dynamic { depth, topk, nodes } => {
                write!(f, "dynamic(depth={depth}, topk={topk}, nodes={nodes})")
            }
        }
    }
}

/// File-level facts that are not values.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Meta {
    pub drafter_kind: Option<DrafterKind>,
    /// Draft length `l` (symbolic in dims; this is its value).
    pub draft_len: Option<i64>,
    pub tree: Option<TreeSpec>,
    /// Self-speculation: the model the drafter is built from and the mask it uses.
    pub base: Option<String>,
    pub base_mask: Option<Mask>,
    /// `draft_vocab N`: the drafter predicts over a subset of at most `N`
    /// target tokens (the rows `draft_vocab.ids` of its weights file select
    /// from the target's LM head). See [`Meta::reduced_vocab`].
    pub draft_vocab: Option<i64>,
    /// Model files: tensor prefixes that `target.embed`/`target.norm`/`target.lm_head` bind to.
    pub exports: BTreeMap<String, String>,
    /// Integer settings of the file itself (e.g. `w 64`), in source order of keys.
    pub ints: BTreeMap<String, i64>,
    /// How the drafter is trained (`train_*` settings, carried to the
    /// training tools as the emitted module's `TRAIN` table).
    pub train: TrainSchedule,
    /// `prev_start zero|skip`: what a `prev(stream)` read is at position 0,
    /// where the stream has no row before it.
    pub prev_start: PrevStart,
}

/// What a drafter's `prev(stream)` read sees at position 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum PrevStart {
    /// A zero row: position 0 runs like any other (draftc's EAGLE, whose
    /// shipped weights were trained so).
    #[default]
    Zero,
    /// Position 0 has no row: the drafter's first row is token 1 with the
    /// stream's row at position 0, as the EAGLE papers' code and vLLM and
    /// SGLang run EAGLE-3 heads (`input_ids[1:]` beside `hidden[:-1]`).
    Skip,
}

impl PrevStart {
    pub fn name(self) -> &'static str {
        match self {
            PrevStart::Zero => "zero",
            PrevStart::Skip => "skip",
        }
    }
}

/// A drafter's training schedule, as its file declares it (`None`: the
/// training tools' recipe for the drafter decides).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct TrainSchedule {
    /// `train_steps K`: training-time test, the drafter run `K` steps on
    /// its own outputs (its appended rows fed back through `prev` and its
    /// memory), step 1 teacher-forced (EAGLE-3: 7).
    pub steps: Option<i64>,
    /// `train_decay γ`: step `i`'s loss weighted `γ^i`, `i` from 0 (EAGLE-3: 0.8).
    pub decay: Option<F64>,
    /// `train_loss distill|ce`: soft cross-entropy against the target's
    /// distribution over the draft vocabulary, or cross-entropy against
    /// its argmax.
    pub loss: Option<TrainLoss>,
    /// `train_token_weight w`: the token loss's weight (EAGLE: 0.1).
    pub token_weight: Option<F64>,
    /// `train_regression w`: weight of a smooth-L1 regression of the
    /// appended stream rows against the target's next feature (EAGLE: 1.0;
    /// EAGLE-3 drops it).
    pub regression: Option<F64>,
}

impl TrainSchedule {
    pub fn is_empty(&self) -> bool {
        *self == TrainSchedule::default()
    }
}

/// The token loss of a training schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TrainLoss {
    Distill,
    CrossEntropy,
}

impl TrainLoss {
    pub fn name(self) -> &'static str {
        match self {
            TrainLoss::Distill => "distill",
            TrainLoss::CrossEntropy => "ce",
        }
    }
}

impl Meta {
    /// The size of the reduced draft vocabulary against a target vocabulary
    /// of `vocab` tokens: `Some(N)` when `draft_vocab N` asks for fewer
    /// tokens than the target has, `None` when the drafter predicts over
    /// the whole vocabulary.
    pub fn reduced_vocab(&self, vocab: i64) -> Option<i64> {
        self.draft_vocab.filter(|&n| n < vocab)
    }
}

/// A memory stream (`memory mem[0] = target.hidden[28]`): rows of width
/// `width` per position; committed positions hold target hidden state `seed`,
/// or with `normed` its image under the target's final RMS norm
/// (`memory m = target.norm(target.hidden[n])`), or with `fuse` a learned
/// projection of several taps.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MemoryDecl {
    pub name: StateName,
    pub width: Dim,
    /// The tap of a plain or normed seed; the first of `fuse`'s taps.
    pub seed: i64,
    pub normed: bool,
    /// `memory f = linear(concat(target.hidden[a], target.hidden[b], …), d) @p`:
    /// the taps concatenated and projected by the drafter's weight
    /// `p.weight` (`[width, k·d]`, no bias; EAGLE-3's `fc`).
    pub fuse: Option<Fuse>,
}

/// The learned fusion of several target taps into a memory stream's seed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Fuse {
    pub taps: Vec<i64>,
    /// Weight prefix: the weight is `{prefix}.weight`.
    pub prefix: String,
    /// Width of one tap (the target's `d`).
    pub tap_width: Dim,
}

impl MemoryDecl {
    /// Every tap the seed reads.
    pub fn taps(&self) -> Vec<i64> {
        match &self.fuse {
            Some(f) => f.taps.clone(),
            None => vec![self.seed],
        }
    }
}

/// Source spans of nodes, parallel to `Graph::nodes`. Provenance, not
/// meaning: always equal, so a re-parsed graph compares equal to the original.
#[derive(Clone, Debug, Default)]
pub struct Spans(pub Vec<Span>);

impl PartialEq for Spans {
    fn eq(&self, _: &Spans) -> bool {
        true
    }
}

impl Eq for Spans {}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Graph {
    pub kind: ItemKind,
    pub name: String,
    pub meta: Meta,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// `emit hidden[i] = x`: (stream, index, value).
    pub emits: Vec<(String, i64, ValueId)>,
    pub memories: Vec<MemoryDecl>,
    /// `append mem[i] = x`.
    pub appends: Vec<(StateName, ValueId)>,
    /// Values of the symbols that stay symbolic in dims (`l`), for evaluation.
    pub symbol_values: BTreeMap<String, i64>,
    pub spans: Spans,
}

/// One weight tensor a graph needs.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Param {
    /// Full tensor name, e.g. `model.layers.3.self_attn.q_proj.weight`.
    pub name: String,
    pub shape: Vec<Dim>,
    /// First node that uses it (`None`: a memory stream's fusion weight,
    /// which no node reads; see [`MemoryDecl::fuse`]).
    pub node: Option<ValueId>,
}

impl Graph {
    pub fn node(&self, id: ValueId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn span(&self, id: ValueId) -> Span {
        self.spans.0.get(id.index()).copied().unwrap_or_default()
    }

    pub fn ids(&self) -> impl Iterator<Item = ValueId> {
        (0..self.nodes.len() as u32).map(ValueId)
    }

    /// Every weight tensor the graph binds, in first-use order, deduplicated
    /// (tied weights appear once).
    pub fn params(&self) -> Vec<Param> {
        let mut out: Vec<Param> = Vec::new();
        for id in self.ids() {
            let node = self.node(id);
            let Some(prefix) = &node.weights else {
                continue;
            };
            let inputs: Vec<&TensorType> = node.inputs.iter().map(|i| &self.node(*i).ty).collect();
            for (suffix, shape) in crate::lower::param_shapes(&node.op, &inputs, &node.ty) {
                let name = format!("{prefix}.{suffix}");
                if !out.iter().any(|p| p.name == name) {
                    out.push(Param {
                        name,
                        shape,
                        node: Some(id),
                    });
                }
            }
        }
        for m in &self.memories {
            if let Some(f) = &m.fuse {
                let name = format!("{}.weight", f.prefix);
                if !out.iter().any(|p| p.name == name) {
                    let taps = Dim::constant(f.taps.len() as i64);
                    out.push(Param {
                        name,
                        shape: vec![
                            m.width.clone(),
                            taps.checked_mul(&f.tap_width).unwrap_or_default(),
                        ],
                        node: None,
                    });
                }
            }
        }
        out
    }

    /// The values something outside the graph reads: its outputs, emits
    /// and appends (with repeats).
    pub fn roots(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.outputs
            .iter()
            .chain(self.emits.iter().map(|e| &e.2))
            .chain(self.appends.iter().map(|a| &a.1))
            .copied()
    }

    /// Whether each node is one of [`Graph::roots`].
    pub fn is_root(&self) -> Vec<bool> {
        let mut root = vec![false; self.nodes.len()];
        for r in self.roots() {
            root[r.index()] = true;
        }
        root
    }

    /// Whether each node is needed by an output, emit or append.
    pub fn live(&self) -> Vec<bool> {
        let mut live = self.is_root();
        for i in (0..self.nodes.len()).rev() {
            if live[i] {
                for inp in &self.nodes[i].inputs {
                    live[inp.index()] = true;
                }
            }
        }
        live
    }
}
