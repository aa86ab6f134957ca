//! Invariants of codegen's own layers, checked in tests after the passes
//! that produce them (the graph-level ones are `draftc_ir::verify`):
//! the groups partition the graph in a valid launch order, and no two
//! temporaries that are live at the same time share an allocator slot.

use draftc_ir::Graph;

use crate::fuse::FusedGroup;
use crate::plan::Plan;
use crate::schedule::live_ranges;

/// Every node in exactly one group; every group's outside inputs produced
/// by an earlier group.
pub fn groups(g: &Graph, groups: &[FusedGroup]) -> Result<(), String> {
    let mut owner: Vec<Option<usize>> = vec![None; g.nodes.len()];
    for (i, gr) in groups.iter().enumerate() {
        for n in &gr.nodes {
            if let Some(prev) = owner[n.index()].replace(i) {
                return Err(format!("`{}` is in groups {prev} and {i}", g.node(*n).name));
            }
        }
    }
    if let Some(n) = owner.iter().position(Option::is_none) {
        return Err(format!("`{}` is in no group", g.nodes[n].name));
    }
    for (i, gr) in groups.iter().enumerate() {
        for n in &gr.nodes {
            for inp in &g.node(*n).inputs {
                let o = owner[inp.index()].unwrap_or(i);
                if o > i {
                    return Err(format!(
                        "group {i} (`{}`) reads `{}` of the later group {o}",
                        g.node(gr.main).name,
                        g.node(*inp).name
                    ));
                }
            }
        }
    }
    Ok(())
}

/// No two simultaneously live temporaries share a slot, and every slot
/// is as large as the buffers placed in it.
pub fn plan(p: &Plan) -> Result<(), String> {
    let (first, last) = live_ranges(&p.launches, p.buffers.len());
    let placed: Vec<_> = p.buffers.iter().filter(|b| b.slot.is_some()).collect();
    for (i, a) in placed.iter().enumerate() {
        let s = a.slot.unwrap_or_default() as usize;
        if p.slots.get(s).is_none_or(|size| *size < a.bytes()) {
            return Err(format!("{} does not fit slot {s}", a.name));
        }
        for b in &placed[i + 1..] {
            if a.slot != b.slot {
                continue;
            }
            let (Some(fa), Some(la), Some(fb), Some(lb)) = (
                first[a.id.index()],
                last[a.id.index()],
                first[b.id.index()],
                last[b.id.index()],
            ) else {
                continue;
            };
            // Touching ranges are fine only as an in-place hand-over.
            let overlap = fa < lb && fb < la || fa == fb;
            if overlap {
                return Err(format!(
                    "{} and {} share slot {s} while both live",
                    a.name, b.name
                ));
            }
        }
    }
    Ok(())
}
