//! Graphviz export of a graph (`draftc inspect --dot`).

use std::fmt::Write;

use crate::dim::fmt_shape;
use crate::graph::Graph;
use crate::op::Op;

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

pub fn to_dot(g: &Graph) -> String {
    let mut out = format!("digraph \"{}\" {{\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n", escape(&g.name));
    for id in g.ids() {
        let n = g.node(id);
        let color = match n.op {
            Op::Input(_) => "lightblue",
            Op::Attention(_) => "lightsalmon",
            Op::Linear { .. } | Op::SwiGlu { .. } | Op::TargetLmHead => "khaki",
            _ if g.outputs.contains(&id) => "palegreen",
            _ => "white",
        };
        let w = n
            .weights
            .as_deref()
            .map(|w| format!("\\n@{}", escape(w)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  n{} [label=\"{}\\n{}{}\\n{}\", style=filled, fillcolor={color}];",
            id.0,
            escape(&n.name),
            n.op.name(),
            w,
            escape(&fmt_shape(&n.ty.dims))
        );
        for i in &n.inputs {
            let _ = writeln!(out, "  n{} -> n{};", i.0, id.0);
        }
    }
    out.push_str("}\n");
    out
}
