//! Size and cost of a graph for `draftc inspect`: parameters split as paper
//! 000 (SpecFormer, Eq. 4) counts them — `m_p` per draft position and `m_s`
//! shared by all positions — and FLOPs per token of one decoding step.

use std::collections::BTreeMap;

use crate::dim::Dim;
use crate::graph::{DrafterKind, Graph, Param};
use crate::op::{Axis, Cache, Mask, Op};

/// Parameter counts. A parameter is position-dependent when its size scales
/// with the draft length `l` (e.g. the positional FFN `[l*d, d]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamStats {
    /// Each tensor with its element count as a polynomial in `l`.
    pub tensors: Vec<(Param, Dim)>,
    /// `m_p`: parameters per draft position (coefficient of `l`).
    pub per_position: i64,
    /// `m_s`: parameters shared by all positions.
    pub shared: i64,
    /// Terms of degree ≥ 2 in `l` (none in the shipped drafters).
    pub higher_order: Dim,
    /// Total at the file's `l`.
    pub total: i64,
    /// Whether the weights are the target's own (self-speculation).
    pub from_target: bool,
}

pub fn param_stats(g: &Graph) -> ParamStats {
    let mut tensors = Vec::new();
    let mut sum = Dim::constant(0);
    for p in g.params() {
        let n = p
            .shape
            .iter()
            .try_fold(Dim::constant(1), |a, d| a.checked_mul(d))
            .unwrap_or_default();
        sum = sum.checked_add(&n).unwrap_or_default();
        tensors.push((p, n));
    }
    let per_position = sum.coeff(&["l"]);
    let shared = sum.coeff(&[]);
    let mut higher = Dim::constant(0);
    for (m, c) in sum.terms() {
        if m.len() >= 2 {
            let mut term = Dim::constant(c);
            for s in m {
                term = term.checked_mul(&Dim::symbol(s)).unwrap_or_default();
            }
            higher = higher.checked_add(&term).unwrap_or_default();
        }
    }
    let total = sum.eval(&g.symbol_values).unwrap_or(shared);
    ParamStats {
        tensors,
        per_position,
        shared,
        higher_order: higher,
        total,
        from_target: g.meta.drafter_kind == Some(DrafterKind::SelfSpeculative),
    }
}

/// FLOPs of one step that processes `t = 1` token per sequence (for parallel
/// drafters: per target position) with `context` tokens already cached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlopStats {
    pub context: i64,
    /// By op name, e.g. `linear`, `attention`.
    pub by_op: BTreeMap<&'static str, i64>,
    pub total: i64,
}

/// `target_dims` = (d, v) for `target.lm_head` costs.
pub fn flop_stats(g: &Graph, context: i64, target_dims: (i64, i64)) -> FlopStats {
    let mut vals = g.symbol_values.clone();
    vals.insert("t".into(), 1);
    vals.insert("b".into(), 1);
    let eval = |d: &Dim| d.eval(&vals).unwrap_or(0);
    let numel = |dims: &[Dim]| dims.iter().map(eval).product::<i64>();
    let live = g.live();
    let mut by_op: BTreeMap<&'static str, i64> = BTreeMap::new();
    for id in g.ids() {
        if !live[id.index()] {
            continue;
        }
        let node = g.node(id);
        let out = numel(&node.ty.dims);
        let in0 = node.inputs.first().map(|i| &g.node(*i).ty);
        let last_in = in0.and_then(|t| t.dims.last()).map(eval).unwrap_or(0);
        let f = match &node.op {
            Op::Linear { bias, .. } => 2 * out * last_in + if *bias { out } else { 0 },
            Op::RmsNorm { .. } | Op::GroupRmsNorm { .. } | Op::TargetNorm => 4 * out,
            Op::Rope { .. } => 3 * out,
            Op::Attention(a) => {
                let dm = last_in;
                let rows = if dm > 0 {
                    numel(&in0.map(|t| t.dims.clone()).unwrap_or_default()) / dm
                } else {
                    0
                };
                let dkv = node
                    .inputs
                    .get(1)
                    .and_then(|i| g.node(*i).ty.dims.last())
                    .map(eval)
                    .unwrap_or(dm);
                let proj = 2
                    * rows
                    * (dm * a.heads * a.head_dim
                        + 2 * dkv * a.kv_heads * a.head_dim
                        + a.heads * a.head_dim * dm);
                let keys = match (a.axis, &a.cache, a.mask, &a.memory) {
                    (Axis::Draft, ..) => vals.get("l").copied().unwrap_or(1),
                    (_, _, Mask::SlidingWindow { window, sink }, _) => context.min(window + sink),
                    (_, Cache::None, _, None) => 1,
                    _ => context,
                };
                proj + 4 * rows * a.heads * a.head_dim * keys
            }
            Op::SwiGlu { hidden, .. } => {
                let rows = if last_in > 0 { out / last_in } else { 0 };
                let f = eval(hidden);
                2 * rows * 3 * last_in * f + 5 * rows * f
            }
            Op::TargetLmHead => 2 * out * target_dims.0,
            Op::Add | Op::Mul => out,
            Op::Silu => 4 * out,
            Op::LayerSum => 2 * in0.map(|t| numel(&t.dims)).unwrap_or(0),
            Op::Input(_)
            | Op::Embedding { .. }
            | Op::TargetEmbed
            | Op::Reshape { .. }
            | Op::Concat { .. }
            | Op::Split { .. }
            | Op::Stack { .. } => 0,
        };
        *by_op.entry(node.op.name()).or_insert(0) += f;
    }
    let _ = target_dims.1;
    let total = by_op.values().sum();
    FlopStats {
        context,
        by_op,
        total,
    }
}

/// `1,234,567`: thousands separators for reports (`inspect`, `plan`).
pub fn thousands(n: i64) -> String {
    let s = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}
