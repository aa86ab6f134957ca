//! PyTorch emission: a typed [`Graph`] → a self-contained Python module
//! whose `Model(nn.Module)` computes the same values as draftc's executor,
//! for training (`draftc emit FILE --backend torch`, docs/training.md).
//!
//! The module is the prelude (`torch_prelude.py`: every op of the language
//! in PyTorch, with the kernels' semantics) followed by the graph, one
//! Python statement per node, each under a comment with the node in the
//! description syntax. Parameters are registered under their binder names,
//! so `state_dict()` is a weights file draftc loads with no renaming, and
//! metadata tables (`PARAMS`, `INPUTS`, `MEMORIES`, `MEMORIES_FUSED`, `APPENDS`, `EXPORTS`,
//! `SYMBOLS`, `TRAIN`) tell the training tools what the graph reads and writes.
//!
//! Differences from the plan, all training-only: every tensor has a leading
//! batch dimension; `train_mask=` replaces an attention's mask when the
//! forward runs with `ctx.train`; memory streams default to the target
//! states they are seeded with at every position (teacher forcing), and a
//! caller may pass other rows (Beagle's second stage, SPIRe's feedback).
//!
//! Limits: every value's first dimension must be `t` (true of every model
//! in `models/`); self-speculative drafters have no graph of their own and
//! are refused.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use draftc_ir::dim::Dim;
use draftc_ir::graph::{DrafterKind, Graph, ValueId};
use draftc_ir::op::{Axis, Cache, InputSource, Mask, NormWeight, Op};

use crate::lower::TargetWeights;

const PRELUDE: &str = include_str!("torch_prelude.py");

/// Why a graph cannot be emitted as PyTorch.
#[derive(Debug, thiserror::Error)]
pub enum TorchError {
    #[error("`{node}`: {reason}")]
    Unsupported { node: String, reason: String },
    #[error("{0}")]
    Graph(String),
}

/// The Python source of `graph` (see the module docs).
pub fn torch_module(graph: &Graph, target: &TargetWeights) -> Result<String, TorchError> {
    if graph.meta.drafter_kind == Some(DrafterKind::SelfSpeculative) {
        return Err(TorchError::Graph(format!(
            "`{}` is self-speculative: it is the target with another mask and has no weights to train",
            graph.name
        )));
    }
    let mut e = Emitter::new(graph, target);
    e.header();
    e.body()?;
    Ok(e.out)
}

struct Emitter<'a> {
    g: &'a Graph,
    target: &'a TargetWeights,
    out: String,
    names: Vec<String>,
}

fn py_mask(m: &Mask) -> Result<String, String> {
    Ok(match m {
        Mask::Causal => "(\"causal\",)".into(),
        Mask::Full => "(\"full\",)".into(),
        Mask::CrossDiagonal => "(\"cross_diagonal\",)".into(),
        Mask::InverseBlock { window, offset } => format!("(\"inverse_block\", {window}, {offset})"),
        Mask::SlidingWindow { window, sink } => format!("(\"sliding_window\", {window}, {sink})"),
        Mask::Tree => return Err("the tree mask exists only during verification".into()),
    })
}

fn py_str(s: &str) -> String {
    format!("{s:?}")
}

const RESERVED: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue",
    "def", "del", "elif", "else", "except", "finally", "for", "from", "global", "if", "import",
    "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return", "try", "while",
    "with", "yield", "F", "P", "nn", "torch", "math", "t", "out", "ctx", "inputs", "target",
    "self",
];

impl<'a> Emitter<'a> {
    fn new(g: &'a Graph, target: &'a TargetWeights) -> Self {
        // Python names: the SSA names, made identifiers and unique.
        let mut taken: BTreeMap<String, usize> = BTreeMap::new();
        let names = g
            .nodes
            .iter()
            .map(|n| {
                let mut base: String = n
                    .name
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .collect();
                if base.is_empty() || base.starts_with(|c: char| c.is_ascii_digit()) {
                    base.insert(0, '_');
                }
                if RESERVED.contains(&base.as_str()) {
                    base.push('_');
                }
                let k = taken.entry(base.clone()).or_insert(0);
                *k += 1;
                if *k == 1 {
                    base
                } else {
                    format!("{base}_{}", *k - 1)
                }
            })
            .collect();
        Emitter {
            g,
            target,
            out: String::new(),
            names,
        }
    }

    fn v(&self, id: ValueId) -> &str {
        &self.names[id.index()]
    }

    fn arg(&self, id: ValueId, i: usize) -> &str {
        self.v(self.g.node(id).inputs[i])
    }

    fn w(&self, id: ValueId, suffix: &str) -> String {
        let prefix = self.g.node(id).weights.clone().unwrap_or_default();
        format!("P({})", py_str(&format!("{prefix}.{suffix}")))
    }

    /// A dimension as a Python expression (`t` is the pass's token count;
    /// `l` and other symbols of the file are constants).
    fn dim(&self, d: &Dim) -> String {
        let mut parts = Vec::new();
        for (mono, c) in d.terms() {
            let mut factors = Vec::new();
            let mut coeff = c;
            for s in mono {
                match self.g.symbol_values.get(s) {
                    Some(v) if s != "t" => coeff *= v,
                    _ => factors.push(s.clone()),
                }
            }
            if coeff != 1 || factors.is_empty() {
                factors.insert(0, coeff.to_string());
            }
            parts.push(factors.join("*"));
        }
        if parts.is_empty() {
            "0".into()
        } else {
            parts.join(" + ")
        }
    }

    /// The size of the drafter's reduced draft vocabulary, if it has one.
    fn reduced_vocab(&self) -> Option<i64> {
        self.g.meta.reduced_vocab(self.target.vocab)
    }

    fn header(&mut self) {
        let g = self.g;
        let kind = g.meta.drafter_kind.map_or("model", |k| k.name());
        let _ = writeln!(
            self.out,
            "# Generated by `draftc emit --backend torch` from the description of `{}` ({kind}).",
            g.name
        );
        self.out.push_str(
            "# Do not edit: change the .draft file and emit again. Parameter names are the\n\
             # binder's names, so `state_dict()` saves a weights file draftc loads as is.\n",
        );
        self.out.push_str(PRELUDE);
        self.out.push_str(
            "\n# ---------------------------------------------------------------------------\n",
        );
        let _ = writeln!(self.out, "NAME = {}", py_str(&g.name));
        let _ = writeln!(self.out, "KIND = {}", py_str(kind));
        let syms: Vec<String> = g
            .symbol_values
            .iter()
            .map(|(k, v)| format!("{}: {v}", py_str(k)))
            .collect();
        let _ = writeln!(self.out, "SYMBOLS = {{{}}}", syms.join(", "));
        let _ = writeln!(
            self.out,
            "TREE = {}",
            py_str(
                &g.meta
                    .tree
                    .as_ref()
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            )
        );
        let _ = writeln!(self.out, "EPS = {:?}", self.target.eps.get());
        // `target.norm` scales by FINAL_NORM_OFFSET + w: 1 for a target
        // whose final norm is Gemma's x̂·(1 + w).
        let offset = match self.target.final_norm {
            NormWeight::UnitOffset => 1.0,
            _ => 0.0,
        };
        let _ = writeln!(self.out, "FINAL_NORM_OFFSET = {offset:?}");
        let _ = writeln!(
            self.out,
            "DRAFT_VOCAB = {}",
            self.reduced_vocab()
                .map_or("None".to_string(), |n| n.to_string())
        );
        let exports: Vec<String> = self
            .target
            .exports
            .iter()
            .map(|(k, p)| format!("{}: {}", py_str(k), py_str(&format!("{p}.weight"))))
            .collect();
        let _ = writeln!(self.out, "EXPORTS = {{{}}}", exports.join(", "));
        // The file's training schedule (`train_*` settings); keys it does
        // not give are the training tools' recipe's.
        let t = &g.meta.train;
        let mut train = Vec::new();
        if let Some(k) = t.steps {
            train.push(format!("\"steps\": {k}"));
        }
        if let Some(x) = t.decay {
            train.push(format!("\"decay\": {x}"));
        }
        if let Some(l) = t.loss {
            train.push(format!("\"loss\": {}", py_str(l.name())));
        }
        if let Some(x) = t.token_weight {
            train.push(format!("\"token_weight\": {x}"));
        }
        if let Some(x) = t.regression {
            train.push(format!("\"regression\": {x}"));
        }
        let _ = writeln!(self.out, "TRAIN = {{{}}}", train.join(", "));
        // What `prev(stream)` is at position 0 (`prev_start`), and whether
        // the logits come from a head of the drafter's own (EAGLE-3's
        // `lm_head`) rather than `target.lm_head`: the module then returns
        // logits over the draft vocabulary, not features for the target's head.
        let _ = writeln!(
            self.out,
            "PREV_START = {}",
            py_str(g.meta.prev_start.name())
        );
        let own_head = g
            .outputs
            .iter()
            .any(|&o| !matches!(g.node(o).op, Op::TargetLmHead));
        let _ = writeln!(
            self.out,
            "OWN_HEAD = {}",
            if own_head { "True" } else { "False" }
        );
        let mut inputs = Vec::new();
        for &id in &g.inputs {
            let n = g.node(id);
            let src = match &n.op {
                Op::Input(InputSource::External) => {
                    format!("(\"external\", {})", py_str(n.ty.dtype.name()))
                }
                Op::Input(InputSource::TargetHidden { indices, .. }) => {
                    let idx: Vec<String> = indices.iter().map(|i| i.to_string()).collect();
                    format!("(\"hidden\", [{}])", idx.join(", "))
                }
                Op::Input(InputSource::MemoryPrev(m)) => {
                    format!("(\"prev\", {})", py_str(&m.to_string()))
                }
                _ => continue,
            };
            inputs.push(format!("{}: {src}", py_str(&n.name)));
        }
        let _ = writeln!(self.out, "INPUTS = {{{}}}", inputs.join(", "));
        let mems: Vec<String> = g
            .memories
            .iter()
            .map(|m| format!("{}: {}", py_str(&m.name.to_string()), m.seed))
            .collect();
        let _ = writeln!(self.out, "MEMORIES = {{{}}}", mems.join(", "));
        // Streams seeded through the target's final norm.
        let normed: Vec<String> = g
            .memories
            .iter()
            .filter(|m| m.normed)
            .map(|m| py_str(&m.name.to_string()))
            .collect();
        let _ = writeln!(self.out, "MEMORIES_NORMED = [{}]", normed.join(", "));
        // Streams seeded by a learned fusion of several taps: every tap it
        // reads (a trainer caches them all) and the fusion's weight.
        let fused: Vec<String> = g
            .memories
            .iter()
            .filter_map(|m| {
                let f = m.fuse.as_ref()?;
                let taps: Vec<String> = f.taps.iter().map(|t| t.to_string()).collect();
                Some(format!(
                    "{}: ([{}], {})",
                    py_str(&m.name.to_string()),
                    taps.join(", "),
                    py_str(&format!("{}.weight", f.prefix))
                ))
            })
            .collect();
        let _ = writeln!(self.out, "MEMORIES_FUSED = {{{}}}", fused.join(", "));
        let outs: Vec<String> = g.outputs.iter().map(|o| py_str(&g.node(*o).name)).collect();
        let _ = writeln!(self.out, "OUTPUTS = [{}]", outs.join(", "));
        let apps: Vec<String> = g
            .appends
            .iter()
            .map(|(s, _)| py_str(&s.to_string()))
            .collect();
        let _ = writeln!(self.out, "APPENDS = [{}]", apps.join(", "));
        self.out.push_str("PARAMS = [\n");
        for p in g.params() {
            let shape: Vec<String> = p.shape.iter().map(|d| self.dim(d)).collect();
            let init = match p.node.map(|n| &g.node(n).op) {
                Some(Op::RmsNorm { .. } | Op::GroupRmsNorm { .. }) => "ones",
                Some(Op::LayerSum) => "zeros",
                // An attention's head norms: x̂·w starts at w = 1,
                // Gemma's x̂·(1 + w) at w = 0.
                Some(Op::Attention(at)) if p.name.ends_with("_norm.weight") => {
                    match at.qk_norm.as_ref().map(|n| n.weight) {
                        Some(NormWeight::UnitOffset) => "zeros",
                        _ => "ones",
                    }
                }
                _ if p.name.ends_with(".bias") => "zeros",
                _ => "normal",
            };
            let _ = writeln!(
                self.out,
                "    ({}, [{}], {}),",
                py_str(&p.name),
                shape.join(", "),
                py_str(init)
            );
        }
        self.out.push_str("]\n\n\n");
    }

    fn body(&mut self) -> Result<(), TorchError> {
        let g = self.g;
        self.out.push_str(
            "class Model(Params):\n    def __init__(self):\n        super().__init__()\n        for name, shape, init in PARAMS:\n            self.add(name, shape, INITS[init])\n",
        );
        if self.reduced_vocab().is_some() {
            let _ = writeln!(
                self.out,
                "        # The reduced draft vocabulary: draft id i is target id ids[i].\n        self.add_ids({}, DRAFT_VOCAB)",
                py_str(crate::bind::DRAFT_VOCAB_IDS)
            );
        }
        self.out.push('\n');
        self.out.push_str(
            "    def forward(self, inputs, target, ctx):\n        \"\"\"inputs: graph inputs by name ([B, T] token ids); target: `Target`;\n        ctx: `Ctx`. Returns outputs, emits (`stream[i]`) and appends (`append:NAME`).\"\"\"\n        P = self.get_parameter\n        B, t = ctx.positions.shape\n        out = {}\n",
        );
        let t = Dim::symbol("t");
        for id in g.ids() {
            let node = g.node(id);
            if node.ty.dims.first() != Some(&t) {
                return Err(TorchError::Unsupported {
                    node: node.name.clone(),
                    reason: format!(
                        "its first dimension is not `t` ({:?}); the torch module batches over sequences",
                        node.ty.dims.first().map(|d| d.to_string())
                    ),
                });
            }
            let rhs = self.expr(id).map_err(|reason| TorchError::Unsupported {
                node: node.name.clone(),
                reason,
            })?;
            let comment = match &node.op {
                Op::Input(_) => format!("input {}", node.name),
                _ => format!("{} = {}", node.name, draftc_ir::print::call(g, node)),
            };
            let _ = writeln!(self.out, "        # {comment}");
            let lhs = self.v(id).to_string();
            let _ = writeln!(self.out, "        {lhs} = {rhs}");
        }
        for &o in &g.outputs {
            let line = format!("        out[{}] = {}", py_str(&g.node(o).name), self.v(o));
            let _ = writeln!(self.out, "{line}");
        }
        for (s, i, v) in &g.emits {
            let line = format!(
                "        out[{}] = {}",
                py_str(&format!("{s}[{i}]")),
                self.v(*v)
            );
            let _ = writeln!(self.out, "{line}");
        }
        for (s, v) in &g.appends {
            let line = format!(
                "        out[{}] = {}",
                py_str(&format!("append:{s}")),
                self.v(*v)
            );
            let _ = writeln!(self.out, "{line}");
        }
        self.out.push_str("        return out\n\n\n");
        self.out.push_str(
            "INITS = {\"ones\": nn.init.ones_, \"zeros\": nn.init.zeros_, \"normal\": lambda x: nn.init.normal_(x, std=0.02)}\n",
        );
        Ok(())
    }

    fn expr(&self, id: ValueId) -> Result<String, String> {
        let g = self.g;
        let node = g.node(id);
        let a = |i: usize| self.arg(id, i).to_string();
        let eps = |e: f64| format!("{e:?}");
        Ok(match &node.op {
            Op::Input(InputSource::External) => {
                format!("inputs[{}]", py_str(&node.name))
            }
            Op::Input(InputSource::MemoryPrev(m)) => {
                let decl = g
                    .memories
                    .iter()
                    .find(|d| &d.name == m)
                    .ok_or_else(|| format!("memory `{m}` is not declared"))?;
                let seed = match &decl.fuse {
                    Some(f) => {
                        let taps: Vec<String> =
                            f.taps.iter().map(|i| format!("ctx.tap({i})")).collect();
                        format!(
                            "fuse=lambda: F.linear(torch.cat([{}], dim=-1), P({}))",
                            taps.join(", "),
                            py_str(&format!("{}.weight", f.prefix))
                        )
                    }
                    None if decl.normed => "norm=target".to_string(),
                    None => "norm=None".to_string(),
                };
                format!(
                    "memory_prev(ctx, {}, {}, {seed})",
                    py_str(&m.to_string()),
                    decl.seed
                )
            }
            Op::Input(InputSource::TargetHidden { indices, stacked }) => {
                if *stacked {
                    let taps: Vec<String> =
                        indices.iter().map(|i| format!("ctx.tap({i})")).collect();
                    format!("torch.stack([{}], dim=2)", taps.join(", "))
                } else {
                    format!("ctx.tap({})", indices[0])
                }
            }
            Op::Linear { bias, .. } => {
                if *bias {
                    format!(
                        "F.linear({}, {}, {})",
                        a(0),
                        self.w(id, "weight"),
                        self.w(id, "bias")
                    )
                } else {
                    format!("F.linear({}, {})", a(0), self.w(id, "weight"))
                }
            }
            Op::RmsNorm { eps: e, weight } => format!(
                "rms_norm({}, {}, {}{})",
                a(0),
                self.w(id, "weight"),
                eps(e.get()),
                match weight {
                    NormWeight::Plain => "",
                    NormWeight::UnitOffset => ", 1.0",
                }
            ),
            Op::GroupRmsNorm { eps: e } => {
                format!(
                    "group_rms_norm({}, {}, {})",
                    a(0),
                    self.w(id, "weight"),
                    eps(e.get())
                )
            }
            Op::Rope { theta } => format!("rope({}, ctx.positions, {:?})", a(0), theta.get()),
            Op::Attention(at) => {
                let mut w: Vec<String> = ["q_proj", "k_proj", "v_proj", "o_proj"]
                    .iter()
                    .map(|p| format!("{}: {}", py_str(p), self.w(id, &format!("{p}.weight"))))
                    .collect();
                if at.bias {
                    for p in ["q_proj", "k_proj", "v_proj"] {
                        let b = format!("{p}.bias");
                        w.push(format!("{}: {}", py_str(&b), self.w(id, &b)));
                    }
                }
                if at.qk_norm.is_some() {
                    for p in ["q_norm", "k_norm"] {
                        let n = format!("{p}.weight");
                        w.push(format!("{}: {}", py_str(p), self.w(id, &n)));
                    }
                }
                let w = w.join(", ");
                let scale = match at.scale {
                    None => String::new(),
                    Some(s) => format!(", scale={:?}", s.get()),
                };
                let qk_norm = match at.qk_norm.as_deref() {
                    None => String::new(),
                    Some(n) => {
                        let offset = match n.weight {
                            NormWeight::Plain => 0.0,
                            NormWeight::UnitOffset => 1.0,
                        };
                        format!(", qk_norm=({}, {offset:?})", eps(n.eps.get()))
                    }
                };
                let mask = py_mask(&at.mask)?;
                let mask = match &at.train_mask {
                    Some(m) => format!("({} if ctx.train else {mask})", py_mask(m)?),
                    None => mask,
                };
                let theta = match (at.rope, at.rope_scaling.as_deref()) {
                    (None, _) => "None".to_string(),
                    (Some(r), None) => format!("{:?}", r.get()),
                    (Some(r), Some(s)) => format!(
                        "({:?}, {:?}, {:?}, {:?}, {})",
                        r.get(),
                        s.factor.get(),
                        s.low_freq_factor.get(),
                        s.high_freq_factor.get(),
                        s.original_context
                    ),
                };
                match at.axis {
                    Axis::Draft => format!(
                        "attention_draft({}, {{{w}}}, {}, {}, {}, {mask}, {})",
                        a(0),
                        at.heads,
                        at.kv_heads,
                        at.head_dim,
                        at.chunk.map_or("None".to_string(), |c| c.to_string())
                    ),
                    Axis::Sequence => {
                        let kv = if at.cross { a(1) } else { a(0) };
                        let memory = match &at.memory {
                            Some(m) => {
                                let decl = g
                                    .memories
                                    .iter()
                                    .find(|d| &d.name == m)
                                    .ok_or_else(|| format!("memory `{m}` is not declared"))?;
                                let norm = if decl.normed { ", target" } else { "" };
                                format!(
                                    ", memory=default_memory(ctx, {}, {}{norm})",
                                    py_str(&m.to_string()),
                                    decl.seed
                                )
                            }
                            None => String::new(),
                        };
                        let cache = match &at.cache {
                            Cache::None => String::new(),
                            Cache::Own(s) => format!(", cache={}", py_str(&s.to_string())),
                            Cache::Target(_) => {
                                return Err("reads the target's cache (self-speculation)".into())
                            }
                        };
                        format!(
                            "attention_seq({}, {kv}, {{{w}}}, {}, {}, {}, {mask}, {theta}, ctx{memory}{cache}{qk_norm}{scale})",
                            a(0),
                            at.heads,
                            at.kv_heads,
                            at.head_dim
                        )
                    }
                }
            }
            Op::SwiGlu { .. } => format!(
                "{}({}, {}, {}, {})",
                node.op.name(),
                a(0),
                self.w(id, "gate_proj.weight"),
                self.w(id, "up_proj.weight"),
                self.w(id, "down_proj.weight")
            ),
            Op::Embedding { scale: None, .. } => {
                format!("F.embedding({}, {})", a(0), self.w(id, "weight"))
            }
            // Gemma: the scale in the embedding's dtype, as transformers.
            Op::Embedding { scale: Some(s), .. } => format!(
                "scaled_embedding({}, {}, {:?})",
                a(0),
                self.w(id, "weight"),
                s.get()
            ),
            Op::TargetEmbed => format!("F.embedding({}, target.embed)", a(0)),
            Op::TargetNorm => format!("target.norm({})", a(0)),
            Op::TargetLmHead if self.reduced_vocab().is_some() => format!(
                "target.head({}, self.get_buffer({}))",
                a(0),
                py_str(crate::bind::DRAFT_VOCAB_IDS)
            ),
            Op::TargetLmHead => format!("target.head({})", a(0)),
            Op::Reshape { shape } => {
                let dims: Vec<String> = shape.iter().map(|d| self.dim(d)).collect();
                format!("{}.reshape(B, {})", a(0), dims.join(", "))
            }
            Op::Concat { axis } => {
                let xs: Vec<String> = (0..node.inputs.len()).map(a).collect();
                format!("torch.cat([{}], dim={})", xs.join(", "), axis + 1)
            }
            Op::Stack { axis } => {
                let xs: Vec<String> = (0..node.inputs.len()).map(a).collect();
                format!("torch.stack([{}], dim={})", xs.join(", "), axis + 1)
            }
            Op::Split { axis, parts, index } => {
                format!("torch.chunk({}, {parts}, dim={})[{index}]", a(0), axis + 1)
            }
            Op::Add | Op::Mul => {
                let sym = if node.op == Op::Add { "+" } else { "*" };
                let rank = node.ty.rank();
                let side = |i: usize| {
                    let r = g.node(node.inputs[i]).ty.rank();
                    let mut s = a(i);
                    for _ in r..rank {
                        s = format!("{s}.unsqueeze(1)");
                    }
                    s
                };
                format!("{} {sym} {}", side(0), side(1))
            }
            Op::Silu => format!("F.silu({})", a(0)),
            Op::LayerSum => format!("layer_sum({}, {})", a(0), self.w(id, "weight")),
        })
    }
}
