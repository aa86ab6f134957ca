//! The closed set of graph operations and their attributes. Every pass
//! matches on `Op` exhaustively; `Display` prints an op in the description
//! syntax (without its inputs), which the printer and errors reuse.

use std::fmt;

use crate::dim::Dim;

/// An f64 attribute with bitwise `Eq`/`Hash` (eps, RoPE θ), printed as written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct F64(u64);

impl F64 {
    pub fn new(x: f64) -> F64 {
        F64(x.to_bits())
    }
    pub fn get(self) -> f64 {
        f64::from_bits(self.0)
    }
}

impl fmt::Display for F64 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `{:?}` keeps a `.0`/exponent so the value re-lexes as a float.
        write!(f, "{:?}", self.get())
    }
}

/// Which (query, key) position pairs may attend. Positions are token
/// positions in the original text (not cache slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mask {
    /// key ≤ query.
    Causal,
    /// Every key (bidirectional).
    Full,
    /// Beagle cross attention: key < query (the diagonal is masked).
    CrossDiagonal,
    /// Beagle training mask: a query in window `⌊(q−offset)/window⌋` sees keys
    /// strictly before its own window (keys of its own window are hidden).
    InverseBlock { window: i64, offset: i64 },
    /// StreamingLLM: the first `sink` positions plus the last `window` up to the query.
    SlidingWindow { window: i64, sink: i64 },
    /// Verification: committed prefix plus the node's ancestors in the draft tree.
    Tree,
}

impl fmt::Display for Mask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mask::Causal => write!(f, "causal"),
            Mask::Full => write!(f, "full"),
            Mask::CrossDiagonal => write!(f, "cross_diagonal"),
            Mask::InverseBlock { window, offset } => write!(f, "inverse_block({window}, {offset})"),
            Mask::SlidingWindow { window, sink } => write!(f, "sliding_window({window}, {sink})"),
            Mask::Tree => write!(f, "tree"),
        }
    }
}

/// The axis attention runs along.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    /// Over tokens of the sequence: input `[t, d]`.
    Sequence,
    /// Over the `l` draft positions of each token: input `[t, l, d]` (SpecFormer).
    Draft,
}

/// A named per-sequence state (KV cache or memory stream) with the loop
/// indices of its instance: `kv[3]` is layer 3's cache. Printed in the
/// description syntax.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StateName {
    pub name: String,
    pub index: Vec<i64>,
}

impl fmt::Display for StateName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name)?;
        if !self.index.is_empty() {
            let idx: Vec<String> = self.index.iter().map(|i| i.to_string()).collect();
            write!(f, "[{}]", idx.join(", "))?;
        }
        Ok(())
    }
}

/// Where an attention's keys and values live across decoding steps.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Cache {
    /// No cache: attend within this pass only.
    None,
    /// The graph's own KV cache (`cache=kv`; inside `repeat`, one per iteration).
    Own(StateName),
    /// The target's KV cache (self-speculation): `cache=target.kv[3]`.
    Target(StateName),
}

impl fmt::Display for Cache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cache::None => write!(f, "none"),
            Cache::Own(s) => write!(f, "{s}"),
            Cache::Target(s) => write!(f, "target.{s}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AttentionAttrs {
    pub heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
    pub mask: Mask,
    pub axis: Axis,
    /// Draft axis: rows of the effective batch per launch (paper 000: 3072).
    pub chunk: Option<i64>,
    pub cache: Cache,
    /// RoPE base θ applied to queries and keys; None = no rotary embedding.
    pub rope: Option<F64>,
    /// Keys/values come from a second input (`kv=`) instead of the query input.
    pub cross: bool,
    /// Keys/values come from a memory stream (SPIRe feedback memory, Beagle
    /// states); queries see only memory rows of earlier positions.
    pub memory: Option<StateName>,
    /// Output width (`out=`; `o_proj` is `[out, heads·head_dim]`): the
    /// input's width unless given (EAGLE-3 attends from a `2d`-wide input
    /// to a `d`-wide residual).
    pub out: Option<i64>,
    /// `train_mask=M`: the mask this attention uses when the drafter is
    /// trained (Beagle's inverse-block mask, paper 002 §4.2). Inference and
    /// every draftc plan use `mask`; only the PyTorch module emitted for
    /// training (`draftc emit --backend torch`) reads it.
    pub train_mask: Option<Mask>,
    /// `bias`: the q, k and v projections add biases (`q_proj.bias`, …;
    /// Qwen 2); the output projection has none.
    pub bias: bool,
    /// `rope_scaling=llama3`: Llama 3's scaled RoPE frequencies (boxed:
    /// rare, and it would double every op's size).
    pub rope_scaling: Option<Box<RopeScaling>>,
    /// `qk_norm` / `qk_norm=unit_offset`: an RMS norm over each query and
    /// key head (weights `q_norm.weight`, `k_norm.weight`, `[head_dim]`,
    /// shared by every head) between the projections and RoPE (Qwen 3,
    /// Gemma 3). Boxed: rare, and it would grow every op.
    pub qk_norm: Option<Box<QkNorm>>,
    /// `scale=`: the softmax scale of the scores (Gemma 3's
    /// `query_pre_attn_scalar ** -0.5`); `None`: `1/√head_dim`.
    pub scale: Option<F64>,
}

/// The activation of a gated MLP's gate (`Op::SwiGlu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GateAct {
    /// `silu(g)`: `swiglu` (Llama, Qwen).
    Silu,
    /// `0.5·g·(1 + tanh(√(2/π)·(g + 0.044715·g³)))`: `geglu` (Gemma).
    GeluTanh,
}

/// How an RMS norm's weight scales the normalised values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormWeight {
    /// `x̂ · w` (Llama, Qwen).
    Plain,
    /// `x̂ · (1 + w)` (Gemma: its weights are stored as offsets from one).
    UnitOffset,
}

impl NormWeight {
    /// The description language's spelling.
    pub fn name(self) -> &'static str {
        match self {
            NormWeight::Plain => "plain",
            NormWeight::UnitOffset => "unit_offset",
        }
    }
}

/// A per-head RMS norm of queries and keys (`AttentionAttrs::qk_norm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QkNorm {
    pub eps: F64,
    pub weight: NormWeight,
}

/// Llama 3's RoPE frequency scaling (`rope_scaling=llama3`, the preset's
/// `rope_factor`, `rope_low_freq_factor`, `rope_high_freq_factor` and
/// `rope_original_context`; transformers' `rope_type: llama3`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RopeScaling {
    pub factor: F64,
    pub low_freq_factor: F64,
    pub high_freq_factor: F64,
    pub original_context: i64,
}

/// Where a graph input comes from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InputSource {
    /// Supplied by the runtime (token ids, positions).
    External,
    /// Target hidden-state taps `target.hidden[i, j, …]`: `[t, k, d]`, or `[t, d]` for one index.
    TargetHidden { indices: Vec<i64>, stacked: bool },
    /// `prev(NAME)`: for every query row, the row of memory stream `NAME`
    /// one position before it on its path, `[t, width]`: the target's
    /// (seed) row where that position is committed, the drafter's own
    /// appended row where it was drafted (its parent in a draft tree).
    /// EAGLE pairs token `t_n` with feature `f_{n-1}` this way.
    MemoryPrev(StateName),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Input(InputSource),
    /// `y = x·Wᵀ (+ b)`; weight `[out, in]`, bias `[out]`.
    Linear {
        out: Dim,
        bias: bool,
    },
    /// RMS norm over the last dim; weight `[d]` (`x̂·w`, or Gemma's
    /// `x̂·(1 + w)` with `unit_offset`).
    RmsNorm {
        eps: F64,
        weight: NormWeight,
    },
    /// RMS norm over the last dim with one scale vector per group (dim −2); weight `[g, d]`.
    GroupRmsNorm {
        eps: F64,
    },
    /// Rotary embedding of `[t, heads, head_dim]` at the tokens' positions.
    Rope {
        theta: F64,
    },
    /// Multi-head attention with q/k/v/o projections (HF names `q_proj` …).
    Attention(AttentionAttrs),
    /// `down(act(gate(x)) * up(x))` with hidden width `hidden`: SwiGLU
    /// (`swiglu`, act = SiLU) or GeGLU (`geglu`, act = tanh-approximated
    /// GELU, Gemma's `gelu_pytorch_tanh`).
    SwiGlu {
        hidden: Dim,
        act: GateAct,
    },
    /// Row gather from `[vocab, d]` by u32 ids, times `scale` when given
    /// (Gemma multiplies its embeddings by √d).
    Embedding {
        vocab: Dim,
        dim: Dim,
        scale: Option<F64>,
    },
    /// The target's token embedding (weights shared with the target).
    TargetEmbed,
    /// The target's LM head (weights shared with the target).
    TargetLmHead,
    /// The target's final RMS norm (weights shared with the target).
    TargetNorm,
    Reshape {
        shape: Vec<Dim>,
    },
    Concat {
        axis: usize,
    },
    /// Part `index` of `parts` equal parts along `axis`.
    Split {
        axis: usize,
        parts: usize,
        index: usize,
    },
    /// Stack equal-shaped inputs along a new axis at `axis`.
    Stack {
        axis: usize,
    },
    Add,
    Mul,
    Silu,
    /// `Σ_k softmax(w)_k · x[…, k, :]` over dim −2; weight `[k]` (SPIRe feedback memory).
    LayerSum,
}

impl Op {
    /// The call name in the description language.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input(_) => "input",
            Op::Linear { .. } => "linear",
            Op::RmsNorm { .. } => "rms_norm",
            Op::GroupRmsNorm { .. } => "group_rms_norm",
            Op::Rope { .. } => "rope",
            Op::Attention(_) => "attention",
            Op::SwiGlu {
                act: GateAct::Silu, ..
            } => "swiglu",
            Op::SwiGlu {
                act: GateAct::GeluTanh,
                ..
            } => "geglu",
            Op::Embedding { .. } => "embedding",
            Op::TargetEmbed => "target.embed",
            Op::TargetLmHead => "target.lm_head",
            Op::TargetNorm => "target.norm",
            Op::Reshape { .. } => "reshape",
            Op::Concat { .. } => "concat",
            Op::Split { .. } => "split",
            Op::Stack { .. } => "stack",
            Op::Add => "add",
            Op::Mul => "mul",
            Op::Silu => "silu",
            Op::LayerSum => "layer_sum",
        }
    }

    /// Ops whose weights belong to the target, not the drafter.
    pub fn uses_target_weights(&self) -> bool {
        matches!(self, Op::TargetEmbed | Op::TargetLmHead | Op::TargetNorm)
    }
}
