//! Structural invariants of a `Graph`, checked after lowering and (in tests)
//! after every codegen pass: topological order, unique names, valid roots,
//! consistent weight shapes.

use std::collections::{HashMap, HashSet};

use crate::graph::Graph;

/// `Err` names the first broken invariant.
pub fn verify(g: &Graph) -> Result<(), String> {
    let mut names = HashSet::new();
    for (i, node) in g.nodes.iter().enumerate() {
        if !names.insert(node.name.as_str()) {
            return Err(format!("node name `{}` is not unique", node.name));
        }
        for inp in &node.inputs {
            if inp.index() >= i {
                return Err(format!(
                    "node `{}` uses {inp}, which is not defined before it",
                    node.name
                ));
            }
        }
    }
    if g.spans.0.len() != g.nodes.len() {
        return Err("span table length differs from node count".into());
    }
    let n = g.nodes.len();
    for r in g.roots().chain(g.inputs.iter().copied()) {
        if r.index() >= n {
            return Err(format!("root {r} is out of range"));
        }
    }
    let mut shapes: HashMap<String, Vec<crate::dim::Dim>> = HashMap::new();
    for id in g.ids() {
        let node = g.node(id);
        let Some(prefix) = &node.weights else {
            continue;
        };
        let inputs: Vec<_> = node.inputs.iter().map(|i| &g.node(*i).ty).collect();
        for (suffix, shape) in crate::lower::param_shapes(&node.op, &inputs, &node.ty) {
            let name = format!("{prefix}.{suffix}");
            if let Some(prev) = shapes.insert(name.clone(), shape.clone()) {
                if prev != shape {
                    return Err(format!("weight `{name}` has two shapes"));
                }
            }
        }
    }
    Ok(())
}
