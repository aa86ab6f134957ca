//! Kernel kinds of a plan ("launched kernel" layer): one variant per
//! `draftc-ops` launch function, carrying every size and attribute that
//! launch needs, evaluated for a concrete configuration. [`Kernel::family`]
//! names the ops function the executor calls; [`Kernel::cost`] counts FLOPs
//! and bytes moved (weights included).
//!
//! Limits: costs are first-order (every input element read once, every
//! output written once, weights read once per launch; the norm recomputed
//! by a linear prologue is counted once).

use std::fmt;

use draftc_ir::op::{Mask, NormWeight, F64};

use crate::device::{AttentionLayout, LinearLayout};

/// What a linear applies to `x` while loading it (`ops::linear::Prologue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prologue {
    None,
    /// RMS norm over `k`, weight `[k]`.
    RmsNorm {
        eps: F64,
    },
    /// Grouped RMS norm: `x` rows are `groups` segments, weight `[groups, k/groups]`.
    GroupRmsNorm {
        groups: i64,
        eps: F64,
    },
}

/// What a linear applies before storing (`ops::linear::Epilogue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Epilogue {
    None,
    /// `+ bias[n]`.
    Bias,
    /// `+ residual[m, n]` (the residual may be the output buffer itself).
    Residual,
    /// `silu(x·W_gateᵀ) · (x·W_upᵀ)`; the launch's second weight is `up`.
    SwiGlu,
    /// `gelu_tanh(x·W_gateᵀ) · (x·W_upᵀ)` (GeGLU); the second weight is `up`.
    GeGlu,
    /// A self-attention's stacked q/k/v projection: RoPE on q and k, the
    /// queries into the launch's first output, the K and V rows into the
    /// cache halves (its second and third) at the pass's new rows
    /// (`ops::linear_rope::linear_rope_qkv`).
    RopeQkv {
        heads: i64,
        kv_heads: i64,
        head_dim: i64,
        theta: F64,
    },
}

/// Element-wise operation (`ops::elementwise`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementwiseOp {
    Add,
    Mul,
    Silu,
    /// `silu(a) · b`.
    SwiGlu,
    /// `gelu_tanh(a) · b`.
    GeGlu,
}

impl ElementwiseOp {
    pub fn name(self) -> &'static str {
        match self {
            ElementwiseOp::Add => "add",
            ElementwiseOp::Mul => "mul",
            ElementwiseOp::Silu => "silu",
            ElementwiseOp::SwiGlu => "swiglu",
            ElementwiseOp::GeGlu => "geglu",
        }
    }
}

/// One launch's kernel and its configuration. Sizes are element counts for
/// the whole batch (rows of all sequences packed, as ops expects).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `ops::linear::linear`: `[m, k] · [n, k]ᵀ → [m, n]`. `into_cache`: the
    /// output rows are the KV cache's new slots (contiguous append).
    Linear {
        m: i64,
        k: i64,
        n: i64,
        prologue: Prologue,
        epilogue: Epilogue,
        into_cache: bool,
        /// Weight matrices stacked along the output into one `[n, k]`
        /// weight (the q, k and v projections of a self-attention: 3;
        /// otherwise 1). The launch lists them in order; the executor
        /// binds their concatenation.
        parts: i64,
        /// The kernel layout for the plan's device (`ops::linear` for
        /// lanes, `ops::linear_plane` for planes).
        layout: LinearLayout,
    },
    /// `ops::rms_norm::rms_norm` over rows of `d`.
    RmsNorm { rows: i64, d: i64, eps: F64 },
    /// `ops::group_rms_norm::group_rms_norm`: `[rows, groups, d]`.
    GroupRmsNorm {
        rows: i64,
        groups: i64,
        d: i64,
        eps: F64,
    },
    /// `ops::rope::rope` on `[tokens, heads, head_dim]` (in place).
    Rope {
        tokens: i64,
        heads: i64,
        head_dim: i64,
        theta: F64,
    },
    /// `ops::head_norm::head_norm_rope` on `[tokens, heads, head_dim]` (in
    /// place): an RMS norm over every head with the launch's weight
    /// (`[head_dim]`), then RoPE at base `theta` where given (an
    /// attention's `qk_norm`).
    HeadNorm {
        tokens: i64,
        heads: i64,
        head_dim: i64,
        eps: F64,
        weight: NormWeight,
        theta: Option<F64>,
    },
    /// `ops::rope::rope_qkv_append`: from a fused q/k/v projection's
    /// `[tokens, (heads + 2 · kv_heads) · head_dim]` output, the rotated
    /// queries, and the rotated K rows and the V rows into the caches.
    RopeQkvAppend {
        tokens: i64,
        heads: i64,
        kv_heads: i64,
        head_dim: i64,
        theta: F64,
    },
    /// `ops::kv::kv_append`: `rows` new K and V rows of `width` into the caches.
    KvAppend { rows: i64, width: i64 },
    /// `ops::attention::attention`: fused QKᵀ, comptime mask, online softmax, ·V.
    /// `keys`: keys each query sees (upper bound), `kv_rows`: K/V rows read.
    Attention {
        q_rows: i64,
        kv_rows: i64,
        keys: i64,
        heads: i64,
        kv_heads: i64,
        head_dim: i64,
        mask: Mask,
        /// The kernel layout for the plan's device.
        layout: AttentionLayout,
        /// The scores' scale (`None`: `1/√head_dim`).
        scale: Option<F64>,
    },
    /// `ops::attention::draft_dim_attention`: `bt` rows of `l` drafts, full mask,
    /// launched `chunk` rows at a time.
    DraftDimAttention {
        bt: i64,
        l: i64,
        heads: i64,
        kv_heads: i64,
        head_dim: i64,
        chunk: i64,
    },
    /// `ops::embedding::embedding`: gather `tokens` rows of `[vocab, d]`.
    /// `ops::embedding::embedding`, rows times `scale` when given.
    Embedding {
        tokens: i64,
        vocab: i64,
        d: i64,
        scale: Option<F64>,
    },
    /// `ops::elementwise`: `numel` outputs; `b_numel` < `numel` is a broadcast operand.
    Elementwise {
        op: ElementwiseOp,
        numel: i64,
        b_numel: i64,
    },
    /// `ops::layer_sum::layer_sum`: `layers` stacked inputs of `numel` each.
    LayerSum { layers: i64, numel: i64 },
    /// Block copy for a stack/concat/split that is not a pure view: `blocks`
    /// blocks of `block_len` elements from `src` (stride, offset) to `dst`.
    /// Stacks map to `ops::kv::append_rows` (row copy).
    StridedCopy {
        blocks: i64,
        block_len: i64,
        src_stride: i64,
        src_offset: i64,
        dst_stride: i64,
        dst_offset: i64,
    },
}

/// FLOPs and bytes of one launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cost {
    pub flops: i64,
    /// Activation and weight bytes read (weights included).
    pub read: i64,
    pub written: i64,
    /// The weight part of `read`.
    pub weights: i64,
}

impl Kernel {
    /// The `draftc-ops` launch function this kernel maps to.
    pub fn family(&self) -> &'static str {
        match self {
            Kernel::Linear { .. } => "linear::linear",
            Kernel::RmsNorm { .. } => "rms_norm::rms_norm",
            Kernel::GroupRmsNorm { .. } => "group_rms_norm::group_rms_norm",
            Kernel::Rope { .. } => "rope::rope",
            Kernel::HeadNorm { .. } => "head_norm::head_norm_rope",
            Kernel::RopeQkvAppend { .. } => "rope::rope_qkv_append",
            Kernel::KvAppend { .. } => "kv::kv_append",
            Kernel::Attention { .. } => "attention::attention",
            Kernel::DraftDimAttention { .. } => "attention::draft_dim_attention",
            Kernel::Embedding { .. } => "embedding::embedding",
            Kernel::Elementwise { .. } => "elementwise::binary",
            Kernel::LayerSum { .. } => "layer_sum::layer_sum",
            Kernel::StridedCopy { .. } => "kv::append_rows",
        }
    }

    /// Costs with `e` bytes per float element (ids are 4 bytes).
    pub fn cost(&self, e: i64) -> Cost {
        match *self {
            Kernel::Linear {
                m,
                k,
                n,
                prologue,
                epilogue,
                ..
            } => {
                let gamma = match prologue {
                    Prologue::None => 0,
                    Prologue::RmsNorm { .. } | Prologue::GroupRmsNorm { .. } => k,
                };
                let (up, bias, resid) = match epilogue {
                    Epilogue::None => (0, 0, 0),
                    Epilogue::Bias => (0, n, 0),
                    Epilogue::Residual => (0, 0, m * n),
                    Epilogue::SwiGlu | Epilogue::GeGlu => (n * k, 0, 0),
                    Epilogue::RopeQkv { .. } => (0, 0, 0),
                };
                let weights = (n * k + up + gamma + bias) * e;
                let mats = if up > 0 { 2 } else { 1 };
                let mut flops = mats * 2 * m * k * n + bias.min(1) * m * n + resid;
                if gamma > 0 {
                    flops += 4 * m * k;
                }
                if up > 0 {
                    flops += 5 * m * n;
                }
                Cost {
                    flops,
                    read: (m * k + resid) * e + weights,
                    written: m * n * e,
                    weights,
                }
            }
            Kernel::RmsNorm { rows, d, .. } => Cost {
                flops: 4 * rows * d,
                read: (rows * d + d) * e,
                written: rows * d * e,
                weights: d * e,
            },
            Kernel::GroupRmsNorm {
                rows, groups, d, ..
            } => {
                let x = rows * groups * d;
                Cost {
                    flops: 4 * x,
                    read: (x + groups * d) * e,
                    written: x * e,
                    weights: groups * d * e,
                }
            }
            Kernel::Rope {
                tokens,
                heads,
                head_dim,
                ..
            } => {
                let x = tokens * heads * head_dim;
                Cost {
                    flops: 3 * x,
                    read: x * e + tokens * 4,
                    written: x * e,
                    weights: 0,
                }
            }
            Kernel::HeadNorm {
                tokens,
                heads,
                head_dim,
                theta,
                ..
            } => {
                let x = tokens * heads * head_dim;
                let rope = if theta.is_some() { 3 } else { 0 };
                Cost {
                    flops: (4 + rope) * x,
                    read: x * e + head_dim * e + tokens * 4,
                    written: x * e,
                    weights: head_dim * e,
                }
            }
            Kernel::RopeQkvAppend {
                tokens,
                heads,
                kv_heads,
                head_dim,
                ..
            } => {
                let rotated = tokens * (heads + kv_heads) * head_dim;
                let x = tokens * (heads + 2 * kv_heads) * head_dim;
                Cost {
                    flops: 3 * rotated,
                    read: x * e + 2 * tokens * 4,
                    written: x * e,
                    weights: 0,
                }
            }
            Kernel::KvAppend { rows, width } => Cost {
                flops: 0,
                read: 2 * rows * width * e,
                written: 2 * rows * width * e,
                weights: 0,
            },
            Kernel::Attention {
                q_rows,
                kv_rows,
                keys,
                heads,
                kv_heads,
                head_dim,
                ..
            } => Cost {
                flops: 4 * q_rows * heads * head_dim * keys,
                read: (q_rows * heads * head_dim + 2 * kv_rows * kv_heads * head_dim) * e,
                written: q_rows * heads * head_dim * e,
                weights: 0,
            },
            Kernel::DraftDimAttention {
                bt,
                l,
                heads,
                kv_heads,
                head_dim,
                ..
            } => Cost {
                flops: 4 * bt * l * heads * head_dim * l,
                read: bt * l * (heads + 2 * kv_heads) * head_dim * e,
                written: bt * l * heads * head_dim * e,
                weights: 0,
            },
            Kernel::Embedding { tokens, d, .. } => Cost {
                flops: 0,
                read: tokens * 4 + tokens * d * e,
                written: tokens * d * e,
                weights: tokens * d * e,
            },
            Kernel::Elementwise { op, numel, b_numel } => {
                let (flops, read) = match op {
                    ElementwiseOp::Add | ElementwiseOp::Mul => (numel, numel + b_numel),
                    ElementwiseOp::Silu => (4 * numel, numel),
                    ElementwiseOp::SwiGlu => (5 * numel, numel + b_numel),
                    ElementwiseOp::GeGlu => (9 * numel, numel + b_numel),
                };
                Cost {
                    flops,
                    read: read * e,
                    written: numel * e,
                    weights: 0,
                }
            }
            Kernel::LayerSum { layers, numel } => Cost {
                flops: 2 * layers * numel,
                read: (layers * numel + layers) * e,
                written: numel * e,
                weights: layers * e,
            },
            Kernel::StridedCopy {
                blocks, block_len, ..
            } => Cost {
                flops: 0,
                read: blocks * block_len * e,
                written: blocks * block_len * e,
                weights: 0,
            },
        }
    }
}

impl fmt::Display for Prologue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Prologue::None => write!(f, "none"),
            Prologue::RmsNorm { eps } => write!(f, "rms_norm(eps={eps})"),
            Prologue::GroupRmsNorm { groups, eps } => {
                write!(f, "group_rms_norm(groups={groups}, eps={eps})")
            }
        }
    }
}

impl fmt::Display for Epilogue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Epilogue::None => "none",
            Epilogue::Bias => "bias",
            Epilogue::Residual => "residual",
            Epilogue::SwiGlu => "swiglu",
            Epilogue::GeGlu => "geglu",
            Epilogue::RopeQkv {
                heads,
                kv_heads,
                head_dim,
                theta,
            } => {
                return write!(
                    f,
                    "rope_qkv(heads={heads}, hkv={kv_heads}, hd={head_dim}, theta={theta})"
                )
            }
        })
    }
}

impl fmt::Display for Kernel {
    /// `linear m=16 k=2304 n=576 pro=group_rms_norm(groups=4, eps=1e-5) epi=none`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kernel::Linear {
                m,
                k,
                n,
                prologue,
                epilogue,
                into_cache,
                parts,
                layout,
            } => {
                write!(f, "linear m={m} k={k} n={n}")?;
                if *parts > 1 {
                    write!(f, " w=concat({parts})")?;
                }
                if *prologue != Prologue::None {
                    write!(f, " pro={prologue}")?;
                }
                if *epilogue != Epilogue::None {
                    write!(f, " epi={epilogue}")?;
                }
                if *into_cache {
                    write!(f, " out=cache")?;
                }
                write!(f, " {layout}")?;
                Ok(())
            }
            Kernel::RmsNorm { rows, d, eps } => write!(f, "rms_norm rows={rows} d={d} eps={eps}"),
            Kernel::GroupRmsNorm {
                rows,
                groups,
                d,
                eps,
            } => write!(
                f,
                "group_rms_norm rows={rows} groups={groups} d={d} eps={eps}"
            ),
            Kernel::Rope {
                tokens,
                heads,
                head_dim,
                theta,
            } => write!(
                f,
                "rope t={tokens} heads={heads} hd={head_dim} theta={theta}"
            ),
            Kernel::HeadNorm {
                tokens,
                heads,
                head_dim,
                eps,
                weight,
                theta,
            } => {
                write!(f, "head_norm t={tokens} heads={heads} hd={head_dim} eps={eps}")?;
                if *weight != NormWeight::Plain {
                    write!(f, " weight={}", weight.name())?;
                }
                if let Some(theta) = theta {
                    write!(f, " theta={theta}")?;
                }
                Ok(())
            }
            Kernel::RopeQkvAppend {
                tokens,
                heads,
                kv_heads,
                head_dim,
                theta,
            } => write!(
                f,
                "rope_qkv_append t={tokens} heads={heads} hkv={kv_heads} hd={head_dim} theta={theta}"
            ),
            Kernel::KvAppend { rows, width } => write!(f, "kv_append rows={rows} width={width}"),
            Kernel::Attention {
                q_rows,
                kv_rows,
                keys,
                heads,
                kv_heads,
                head_dim,
                mask,
                layout,
                scale,
            } => {
                write!(
                    f,
                    "attention q={q_rows} kv={kv_rows} keys<={keys} h={heads} hkv={kv_heads} hd={head_dim} mask={mask}"
                )?;
                if let Some(s) = scale {
                    write!(f, " scale={s}")?;
                }
                if *layout != AttentionLayout::Lanes {
                    write!(f, " {layout}")?;
                }
                Ok(())
            }
            Kernel::DraftDimAttention {
                bt,
                l,
                heads,
                kv_heads,
                head_dim,
                chunk,
            } => write!(
                f,
                "draft_dim_attention bt={bt} l={l} h={heads} hkv={kv_heads} hd={head_dim} chunk={chunk}"
            ),
            Kernel::Embedding {
                tokens,
                vocab,
                d,
                scale,
            } => {
                write!(f, "embedding t={tokens} vocab={vocab} d={d}")?;
                if let Some(s) = scale {
                    write!(f, " scale={s}")?;
                }
                Ok(())
            }
            Kernel::Elementwise { op, numel, b_numel } => {
                write!(f, "{} n={numel}", op.name())?;
                if *b_numel != *numel && *op != ElementwiseOp::Silu {
                    write!(f, " broadcast={b_numel}")?;
                }
                Ok(())
            }
            Kernel::LayerSum { layers, numel } => {
                write!(f, "layer_sum layers={layers} n={numel}")
            }
            Kernel::StridedCopy {
                blocks,
                block_len,
                src_stride,
                src_offset,
                dst_stride,
                dst_offset,
            } => write!(
                f,
                "copy blocks={blocks} len={block_len} src={src_stride}+{src_offset} dst={dst_stride}+{dst_offset}"
            ),
        }
    }
}
