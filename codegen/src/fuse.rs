//! Pass 2, fuse: partitions the canonical graph into [`FusedGroup`]s ("fused
//! group" layer), each lowered together by `lower`. The rules, all around a
//! weight op (`linear`, `target.lm_head`, `attention`, `swiglu`) `M`:
//!
//! * **norm prologue** — `rms_norm`/`target.norm` feeding `M`'s input
//!   (through reshapes that keep the last dim), or `group_rms_norm` feeding a
//!   `linear` through the reshape that merges its groups (SpecFormer's
//!   downsampler), is folded into `M`'s input projections, when `M` is the
//!   norm's only user;
//! * **residual epilogue** — `x + M(…)` with equal shapes, `M`'s only user,
//!   is folded into `M`'s last projection (o_proj / down_proj / the linear);
//!   not for a linear with bias (ops has one epilogue per launch);
//! * inside `M` (applied by `lower` for fused groups): SwiGLU gate/up as one
//!   linear with the SwiGLU epilogue; attention K/V projections written
//!   straight into the cache's new rows (no separate KV append).
//!
//! With fusion off every node is its own group. Limits: a norm shared by
//! several consumers stays a launch of its own; `silu` has no linear
//! epilogue in ops and stays element-wise.

use std::fmt::Write;

use draftc_ir::graph::{Graph, ValueId};
use draftc_ir::op::Op;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// A graph input: no launch.
    Input,
    /// Pure layout (see `canonicalize::views`): no launch.
    View,
    /// One op lowered on its own.
    Single,
    /// A weight op with a norm prologue and/or residual epilogue folded in.
    Fused,
}

/// One fusion decision, inspectable in tests.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FusedGroup {
    pub kind: GroupKind,
    /// The op the group is built around.
    pub main: ValueId,
    /// Norm folded into `main`'s input projections.
    pub prologue: Option<ValueId>,
    /// Reshapes between the norm and `main` (views inside the group).
    pub prologue_views: Vec<ValueId>,
    /// Residual add folded into `main`'s last projection: (add, other operand).
    pub residual: Option<(ValueId, ValueId)>,
    /// Every node of the group, ascending.
    pub nodes: Vec<ValueId>,
}

impl FusedGroup {
    fn single(kind: GroupKind, id: ValueId) -> FusedGroup {
        FusedGroup {
            kind,
            main: id,
            prologue: None,
            prologue_views: Vec::new(),
            residual: None,
            nodes: vec![id],
        }
    }

    /// The value the group produces.
    pub fn output(&self) -> ValueId {
        self.residual.map(|r| r.0).unwrap_or(self.main)
    }

    /// `rms_norm → attention + residual: rms_norm_4, attention_5, x_1`
    pub fn describe(&self, g: &Graph) -> String {
        let mut s = String::new();
        if let Some(p) = self.prologue {
            let _ = write!(s, "{} → ", g.node(p).op.name());
        }
        s.push_str(g.node(self.main).op.name());
        if self.residual.is_some() {
            s.push_str(" + residual");
        }
        let names: Vec<&str> = self
            .nodes
            .iter()
            .map(|n| g.node(*n).name.as_str())
            .collect();
        let _ = write!(s, ": {}", names.join(", "));
        s
    }
}

/// Users of every value (with multiplicity) and whether it is a graph root.
struct Uses {
    users: Vec<Vec<ValueId>>,
    root: Vec<bool>,
}

impl Uses {
    fn new(g: &Graph) -> Uses {
        let mut users = vec![Vec::new(); g.nodes.len()];
        for id in g.ids() {
            for inp in &g.node(id).inputs {
                users[inp.index()].push(id);
            }
        }
        Uses {
            users,
            root: g.is_root(),
        }
    }

    /// `v`'s only consumer, if it has exactly one use and is not a root.
    fn sole_user(&self, v: ValueId) -> Option<ValueId> {
        match self.users[v.index()].as_slice() {
            [u] if !self.root[v.index()] => Some(*u),
            _ => None,
        }
    }
}

/// Partition `g` (canonical) into groups ordered by their output node, which
/// is a valid launch order. `views` comes from `canonicalize::views`.
pub fn fuse(g: &Graph, views: &[bool], enabled: bool) -> Vec<FusedGroup> {
    let uses = Uses::new(g);
    let mut claimed = vec![false; g.nodes.len()];
    let mut groups = Vec::new();
    if enabled {
        for id in g.ids() {
            if !is_weight_op(&g.node(id).op) || claimed[id.index()] {
                continue;
            }
            let (prologue, prologue_views) = match find_prologue(g, &uses, views, id) {
                Some((p, v)) if !claimed[p.index()] => (Some(p), v),
                _ => (None, Vec::new()),
            };
            let residual = find_residual(g, &uses, id).filter(|(a, _)| !claimed[a.index()]);
            if prologue.is_none() && residual.is_none() {
                continue;
            }
            let mut nodes = vec![id];
            nodes.extend(prologue);
            nodes.extend(prologue_views.iter().copied());
            nodes.extend(residual.map(|r| r.0));
            nodes.sort();
            for n in &nodes {
                claimed[n.index()] = true;
            }
            groups.push(FusedGroup {
                kind: GroupKind::Fused,
                main: id,
                prologue,
                prologue_views,
                residual,
                nodes,
            });
        }
    }
    for id in g.ids() {
        if claimed[id.index()] {
            continue;
        }
        let kind = match g.node(id).op {
            Op::Input(_) => GroupKind::Input,
            _ if views[id.index()] => GroupKind::View,
            _ => GroupKind::Single,
        };
        groups.push(FusedGroup::single(kind, id));
    }
    groups.sort_by_key(|gr| gr.output());
    groups
}

/// Whether `op` is a weight op, the ops `lower`'s `weight_op` lowers
/// (exhaustive: a new op is classified here).
fn is_weight_op(op: &Op) -> bool {
    match op {
        Op::Linear { .. } | Op::TargetLmHead | Op::Attention(_) | Op::SwiGlu { .. } => true,
        Op::Input(_)
        | Op::RmsNorm { .. }
        | Op::GroupRmsNorm { .. }
        | Op::Rope { .. }
        | Op::Embedding { .. }
        | Op::TargetEmbed
        | Op::TargetNorm
        | Op::Reshape { .. }
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Stack { .. }
        | Op::Add
        | Op::Mul
        | Op::Silu
        | Op::LayerSum => false,
    }
}

/// The norm feeding `m`'s input 0 (and the reshapes in between) that can be
/// `m`'s prologue.
fn find_prologue(
    g: &Graph,
    uses: &Uses,
    views: &[bool],
    m: ValueId,
) -> Option<(ValueId, Vec<ValueId>)> {
    let node = g.node(m);
    let first = *node.inputs.first()?;
    if node.inputs.iter().filter(|i| **i == first).count() != 1 {
        return None;
    }
    let mut x = first;
    let mut chain = Vec::new();
    let mut user = m;
    loop {
        if uses.sole_user(x) != Some(user) {
            return None;
        }
        let n = g.node(x);
        match n.op {
            Op::Reshape { .. } if views[x.index()] => {
                chain.push(x);
                user = x;
                x = *n.inputs.first()?;
            }
            _ => break,
        }
    }
    chain.reverse();
    let norm = g.node(x);
    let m_in = g.node(first).ty.dims.last()?;
    let ok = match norm.op {
        Op::RmsNorm { .. } | Op::TargetNorm => norm.ty.dims.last() == Some(m_in),
        Op::GroupRmsNorm { .. } => {
            let d = &norm.ty.dims;
            matches!(node.op, Op::Linear { .. })
                && d.len() >= 2
                && d[d.len() - 2].checked_mul(&d[d.len() - 1]).as_ref() == Some(m_in)
        }
        _ => false,
    };
    ok.then_some((x, chain))
}

/// `add(r, m)` / `add(m, r)` with equal shapes, `m`'s only use.
fn find_residual(g: &Graph, uses: &Uses, m: ValueId) -> Option<(ValueId, ValueId)> {
    if let Op::Linear { bias: true, .. } = g.node(m).op {
        return None;
    }
    let add = uses.sole_user(m)?;
    let a = g.node(add);
    if a.op != Op::Add || a.inputs.len() != 2 {
        return None;
    }
    let other = match (a.inputs[0] == m, a.inputs[1] == m) {
        (true, false) => a.inputs[1],
        (false, true) => a.inputs[0],
        _ => return None,
    };
    let same = |v: ValueId| g.node(v).ty.dims == a.ty.dims;
    (same(m) && same(other)).then_some((add, other))
}
