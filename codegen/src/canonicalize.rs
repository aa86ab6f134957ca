//! Pass 1, canonicalize: graph → graph. Folds reshape chains
//! (`reshape(reshape(x))` → `reshape(x)`), removes no-op reshapes (uses are
//! redirected to the input), and eliminates dead code (keeps what outputs,
//! emits and appends need, and every declared input). [`views`] marks the
//! nodes that are pure layout and cost no launch.
//!
//! Limits: no CSE, no constant folding (the IR has no constants); a split,
//! is a view only when every dim before its axis is the constant 1 (each
//! part is then one contiguous range of the whole); a concat or stack is a
//! view only with a single input (several inputs are copied: producers
//! writing straight into parts of one buffer is not done yet).

use draftc_ir::dim::Dim;
use draftc_ir::graph::{Graph, Spans, ValueId};
use draftc_ir::op::Op;

/// Canonical form of `g`. The result satisfies `draftc_ir::verify::verify`.
pub fn canonicalize(g: &Graph) -> Graph {
    // 1. Redirect through reshape chains and no-op reshapes.
    let mut repl: Vec<ValueId> = g.ids().collect();
    let mut nodes = g.nodes.clone();
    for id in g.ids() {
        let i = id.index();
        for inp in &mut nodes[i].inputs {
            *inp = repl[inp.index()];
        }
        if let Op::Reshape { .. } = nodes[i].op {
            let Some(&src) = nodes[i].inputs.first() else {
                continue;
            };
            if let Op::Reshape { .. } = nodes[src.index()].op {
                if let Some(&inner) = nodes[src.index()].inputs.first() {
                    nodes[i].inputs[0] = inner;
                }
            }
            let src = nodes[i].inputs[0];
            if nodes[src.index()].ty == nodes[i].ty {
                repl[i] = src;
            }
        }
    }
    let redirect = |v: &ValueId| repl[v.index()];
    let outputs: Vec<ValueId> = g.outputs.iter().map(redirect).collect();
    let emits: Vec<(String, i64, ValueId)> = g
        .emits
        .iter()
        .map(|(s, i, v)| (s.clone(), *i, redirect(v)))
        .collect();
    let appends: Vec<_> = g
        .appends
        .iter()
        .map(|(s, v)| (s.clone(), redirect(v)))
        .collect();

    // 2. Liveness from the roots (and declared inputs).
    let mut live = vec![false; nodes.len()];
    let roots = outputs
        .iter()
        .chain(emits.iter().map(|e| &e.2))
        .chain(appends.iter().map(|a| &a.1))
        .chain(g.inputs.iter());
    for r in roots {
        live[r.index()] = true;
    }
    for i in (0..nodes.len()).rev() {
        if live[i] {
            for inp in nodes[i].inputs.clone() {
                live[inp.index()] = true;
            }
        }
    }

    // 3. Renumber the survivors.
    let mut new_id: Vec<Option<ValueId>> = vec![None; nodes.len()];
    let mut out_nodes = Vec::new();
    let mut spans = Vec::new();
    for (i, node) in nodes.into_iter().enumerate() {
        if !live[i] {
            continue;
        }
        new_id[i] = Some(ValueId(out_nodes.len() as u32));
        let mut node = node;
        for inp in &mut node.inputs {
            *inp = new_id[inp.index()].unwrap_or(*inp);
        }
        spans.push(g.span(ValueId(i as u32)));
        out_nodes.push(node);
    }
    let map = |v: &ValueId| new_id[v.index()].unwrap_or(*v);
    Graph {
        kind: g.kind,
        name: g.name.clone(),
        meta: g.meta.clone(),
        nodes: out_nodes,
        inputs: g.inputs.iter().map(map).collect(),
        outputs: outputs.iter().map(map).collect(),
        emits: emits
            .iter()
            .map(|(s, i, v)| (s.clone(), *i, map(v)))
            .collect(),
        memories: g.memories.clone(),
        appends: appends.iter().map(|(s, v)| (s.clone(), map(v))).collect(),
        symbol_values: g.symbol_values.clone(),
        spans: Spans(spans),
    }
}

/// Whether each node is pure layout (no launch: its value is its input's
/// memory under another shape, or one contiguous part of it).
pub fn views(g: &Graph) -> Vec<bool> {
    let leading_ones =
        |dims: &[Dim], axis: usize| dims.iter().take(axis).all(|d| d.as_const() == Some(1));
    g.nodes
        .iter()
        .map(|n| match &n.op {
            Op::Reshape { .. } => true,
            Op::Split { axis, .. } => n
                .inputs
                .first()
                .is_some_and(|i| leading_ones(&g.node(*i).ty.dims, *axis)),
            Op::Concat { axis } | Op::Stack { axis } => {
                leading_ones(&n.ty.dims, *axis) && n.inputs.len() == 1
            }
            Op::Input(_)
            | Op::Linear { .. }
            | Op::RmsNorm { .. }
            | Op::GroupRmsNorm { .. }
            | Op::Rope { .. }
            | Op::Attention(_)
            | Op::SwiGlu { .. }
            | Op::Embedding { .. }
            | Op::TargetEmbed
            | Op::TargetLmHead
            | Op::TargetNorm
            | Op::Add
            | Op::Mul
            | Op::Silu
            | Op::LayerSum => false,
        })
        .collect()
}
