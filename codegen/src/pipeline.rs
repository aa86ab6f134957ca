//! The whole lowering, in order — the one place that lists the passes:
//!
//! 1. `canonicalize` — reshape folding, dead-code elimination; `views`
//! 2. `fuse`         — fusion decisions (`FusedGroup`s), or none with `--no-fuse`
//! 3. `lower`        — groups → kernel launches at a concrete configuration
//! 4. `schedule`     — liveness, slot reuse, in-place residuals
//! 5. `bind`         — the weight table (checked against a weights file by the caller)
//!
//! [`trace`] returns every intermediate so tests can verify each pass's
//! output (`draftc_ir::verify::verify` on the canonical graph,
//! `check::groups` on the partition, `check::plan` on the slots).

use draftc_ir::Graph;

use crate::bind::{self, BindError, WeightSpec};
use crate::canonicalize::{canonicalize, views};
use crate::error::CodegenError;
use crate::fuse::{fuse, FusedGroup};
use crate::lower::{lower, TargetWeights};
use crate::plan::{Plan, PlanConfig, Totals, WeightRef};
use crate::schedule::schedule;

/// Every pass's output.
pub struct Trace {
    pub canonical: Graph,
    pub views: Vec<bool>,
    pub groups: Vec<FusedGroup>,
    pub plan: Plan,
}

/// Run passes 1–4 on `graph` for `cfg`.
pub fn trace(
    graph: &Graph,
    target: &TargetWeights,
    cfg: &PlanConfig,
) -> Result<Trace, CodegenError> {
    let canonical = canonicalize(graph);
    let views = views(&canonical);
    let groups = fuse(&canonical, &views, cfg.fuse);
    let lowered = lower(&canonical, &groups, target, cfg)?;
    let mut plan = Plan {
        name: graph.name.clone(),
        config: cfg.clone(),
        symbols: lowered.symbols,
        node_names: canonical.nodes.iter().map(|n| n.name.clone()).collect(),
        groups: groups.clone(),
        launches: lowered.launches,
        buffers: lowered.buffers,
        slots: Vec::new(),
        totals: Totals::default(),
        unfused: None,
        seed_weights: seed_weights(graph, cfg)?,
    };
    plan.slots = schedule(&mut plan.launches, &mut plan.buffers);
    plan.compute_totals();
    Ok(Trace {
        canonical,
        views,
        groups,
        plan,
    })
}

/// The fusion weights of `graph`'s memory streams (`Plan::seed_weights`).
fn seed_weights(graph: &Graph, cfg: &PlanConfig) -> Result<Vec<WeightRef>, CodegenError> {
    let mut out = Vec::new();
    for m in &graph.memories {
        let Some(f) = &m.fuse else { continue };
        let eval = |d: &draftc_ir::dim::Dim| {
            d.eval(&graph.symbol_values).ok_or_else(|| {
                CodegenError::Internal(format!(
                    "memory `{}`: width `{d}` is not a constant",
                    m.name
                ))
            })
        };
        out.push(WeightRef {
            name: format!("{}.weight", f.prefix),
            shape: vec![eval(&m.width)?, f.taps.len() as i64 * eval(&f.tap_width)?],
            dtype: cfg.dtype,
            plus_one: false,
        });
    }
    Ok(out)
}

/// The plan of `graph`; a fused plan also carries the unfused totals.
pub fn plan(graph: &Graph, target: &TargetWeights, cfg: &PlanConfig) -> Result<Plan, CodegenError> {
    let mut plan = trace(graph, target, cfg)?.plan;
    if cfg.fuse {
        let unfused = PlanConfig {
            fuse: false,
            ..cfg.clone()
        };
        plan.unfused = Some(trace(graph, target, &unfused)?.plan.totals);
    }
    Ok(plan)
}

/// Pass 5: the plan's weight table.
pub fn weights(plan: &Plan) -> Result<Vec<WeightSpec>, Vec<BindError>> {
    bind::weight_table(plan)
}
