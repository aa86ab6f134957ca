//! `draftc inspect FILE`: the typed graph (every node with its shape), the
//! parameter count split as paper 000 counts it (m_p per draft position, m_s
//! shared), FLOPs per token, or a Graphviz export with `--dot`.

use std::fmt::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use draftc_ir::stats::{flop_stats, param_stats, thousands as group};
use draftc_ir::{Graph, TargetConfig};

use super::source::{compile_file, load_target, parse_sets, Compiled};

#[derive(Args)]
pub struct InspectArgs {
    /// A model or drafter file.
    pub file: PathBuf,
    /// Target preset: a name looked up next to the file or a path.
    #[arg(long, default_value = "smollm2-135m")]
    pub target: String,
    /// Override an integer setting, e.g. `--set l=8`.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub sets: Vec<String>,
    /// Context length (cached tokens) at which FLOPs per token are counted.
    #[arg(long, default_value_t = 1024)]
    pub context: i64,
    /// Print the graph in Graphviz dot format instead.
    #[arg(long)]
    pub dot: bool,
}

pub fn run(args: InspectArgs) -> ExitCode {
    let Ok(sets) = parse_sets(&args.sets) else {
        return ExitCode::FAILURE;
    };
    let Ok((target, _)) = load_target(&args.target, Some(&args.file)) else {
        return ExitCode::FAILURE;
    };
    match compile_file(&args.file, &target, &sets) {
        Ok(Compiled::Graph(g)) if args.dot => {
            print!("{}", draftc_ir::dot::to_dot(&g));
            ExitCode::SUCCESS
        }
        Ok(Compiled::Graph(g)) => {
            print!("{}", report(&g, &target, args.context.max(1)));
            ExitCode::SUCCESS
        }
        Ok(Compiled::Preset(cfg)) => {
            println!("preset {} (family {})", cfg.name, cfg.family);
            for (k, v) in &cfg.ints {
                println!("  {k:<14} {v}");
            }
            for (k, v) in &cfg.floats {
                println!("  {k:<14} {v:?}");
            }
            for (k, v) in &cfg.flags {
                println!("  {k:<14} {v}");
            }
            ExitCode::SUCCESS
        }
        Err(_) => ExitCode::FAILURE,
    }
}

/// The full inspect report (also snapshot-tested).
pub fn report(g: &Graph, target: &TargetConfig, context: i64) -> String {
    let mut out = String::new();
    let kind = g
        .meta
        .drafter_kind
        .map(|k| format!(", {}", k.name()))
        .unwrap_or_default();
    let l = g
        .meta
        .draft_len
        .map(|l| format!(", l = {l}"))
        .unwrap_or_default();
    let tree = g
        .meta
        .tree
        .as_ref()
        .map(|t| format!(", tree {t}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "{} {}{kind}{l}{tree} — target preset {}",
        g.kind.keyword(),
        g.name,
        target.name
    );
    if let Some(base) = &g.meta.base {
        let mask = g.meta.base_mask.map(|m| m.to_string()).unwrap_or_default();
        let _ = writeln!(
            out,
            "self-speculative: the `{base}` graph with mask={mask} over the target's KV caches"
        );
    }
    let t = &g.meta.train;
    if !t.is_empty() {
        let mut parts = Vec::new();
        if let Some(k) = t.steps {
            let s = if k == 1 { "" } else { "s" };
            parts.push(format!("{k} step{s} (training-time test)"));
        }
        if let Some(x) = t.decay {
            parts.push(format!("step i weighted {x}^i, i from 0"));
        }
        if let Some(l) = t.loss {
            parts.push(format!("token loss {}", l.name()));
        }
        if let Some(x) = t.token_weight {
            parts.push(format!("token loss weight {x}"));
        }
        if let Some(x) = t.regression {
            parts.push(format!("feature regression weight {x}"));
        }
        let _ = writeln!(out, "training: {}", parts.join(", "));
    }
    let _ = writeln!(
        out,
        "\ngraph ({} nodes; `t` = tokens in this pass{}):",
        g.nodes.len(),
        if g.meta.draft_len.is_some() {
            ", `l` = draft length"
        } else {
            ""
        }
    );
    for line in draftc_ir::print::body(g).lines() {
        let _ = writeln!(out, "  {line}");
    }

    let ps = param_stats(g);
    let owner = if ps.from_target {
        "the target's own weights (nothing extra to load)"
    } else {
        "drafter-owned; target embed/norm/LM head excluded"
    };
    let _ = writeln!(out, "\nparameters ({owner}):");
    let width = ps
        .tensors
        .iter()
        .map(|(p, _)| p.name.len())
        .max()
        .unwrap_or(10)
        .max(10);
    for (p, n) in &ps.tensors {
        let count = n.eval(&g.symbol_values).unwrap_or(0);
        let _ = writeln!(
            out,
            "  {:<width$}  {:<16}  {:>13}",
            p.name,
            draftc_ir::dim::fmt_shape(&p.shape),
            group(count)
        );
    }
    if g.meta.draft_len.is_some() {
        let _ = writeln!(
            out,
            "  position-dependent m_p = {} per draft position (paper 000 Eq. 4)",
            group(ps.per_position)
        );
        let _ = writeln!(out, "  shared             m_s = {}", group(ps.shared));
        if ps.higher_order != draftc_ir::dim::Dim::constant(0) {
            let _ = writeln!(out, "  higher order in l      = {}", ps.higher_order);
        }
    }
    let _ = writeln!(out, "  total                  = {}", group(ps.total));
    let d = target.int("d").unwrap_or(0);
    let v = target.int("v").unwrap_or(0);
    let fs = flop_stats(g, context, (d, v));
    let _ = writeln!(
        out,
        "\nFLOPs per token (one decoding step, {} cached tokens):",
        group(fs.context)
    );
    for (op, f) in &fs.by_op {
        if *f > 0 {
            let _ = writeln!(out, "  {op:<16} {:>16}", group(*f));
        }
    }
    let _ = writeln!(out, "  {:<16} {:>16}", "total", group(fs.total));
    out
}
