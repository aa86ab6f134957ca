//! The pretty-printer: a `Graph` back to description text. Every node is one
//! binding with its type annotation, loops unrolled and weight names
//! expanded; parsing the output yields an equal graph (tested).

use std::fmt::Write;

use crate::ast::ItemKind;
use crate::dim::fmt_shape;
use crate::graph::{DrafterKind, Graph, Node};
use crate::op::{Axis, Cache, InputSource, NormWeight, Op};

/// The whole file. Self-speculative drafters print as their settings (their
/// body is the base model's), which re-lowers to the same graph.
pub fn print(g: &Graph) -> String {
    let mut out = header(g);
    if g.meta.drafter_kind == Some(DrafterKind::SelfSpeculative) && g.meta.base.is_some() {
        return out;
    }
    out.push('\n');
    out.push_str(&body(g));
    out
}

fn header(g: &Graph) -> String {
    let mut out = format!("{} {}\n", g.kind.keyword(), g.name);
    let m = &g.meta;
    if let Some(k) = m.drafter_kind {
        let _ = writeln!(out, "kind {}", k.name());
    }
    if let Some(l) = m.draft_len {
        let _ = writeln!(out, "l {l}");
    }
    if let Some(t) = &m.tree {
        let _ = writeln!(out, "tree {t}");
    }
    if let Some(n) = m.draft_vocab {
        let _ = writeln!(out, "draft_vocab {n}");
    }
    let t = &m.train;
    if let Some(k) = t.steps {
        let _ = writeln!(out, "train_steps {k}");
    }
    if let Some(x) = t.decay {
        let _ = writeln!(out, "train_decay {x}");
    }
    if let Some(l) = t.loss {
        let _ = writeln!(out, "train_loss {}", l.name());
    }
    if let Some(x) = t.token_weight {
        let _ = writeln!(out, "train_token_weight {x}");
    }
    if let Some(x) = t.regression {
        let _ = writeln!(out, "train_regression {x}");
    }
    if m.prev_start != Default::default() {
        let _ = writeln!(out, "prev_start {}", m.prev_start.name());
    }
    if let Some(b) = &m.base {
        let _ = writeln!(out, "base {b}");
    }
    if let Some(mask) = &m.base_mask {
        let _ = writeln!(out, "mask {mask}");
    }
    let self_speculative = m.base.is_some();
    if g.kind == ItemKind::Model {
        for (k, v) in &m.exports {
            let _ = writeln!(out, "{k} {v}");
        }
    }
    for (k, v) in m.ints.iter().filter(|_| !self_speculative) {
        let _ = writeln!(out, "{k} {v}");
    }
    out
}

/// Every node as a statement, then emits and appends.
pub fn body(g: &Graph) -> String {
    let mut out = String::new();
    for mem in &g.memories {
        let seed = format!("target.hidden[{}]", mem.seed);
        if let Some(f) = &mem.fuse {
            let taps: Vec<String> = f
                .taps
                .iter()
                .map(|t| format!("target.hidden[{t}]"))
                .collect();
            let _ = writeln!(
                out,
                "memory {} = linear(concat({}), {}) @{}",
                mem.name,
                taps.join(", "),
                mem.width,
                f.prefix
            );
        } else if mem.normed {
            let _ = writeln!(out, "memory {} = target.norm({seed})", mem.name);
        } else {
            let _ = writeln!(out, "memory {} = {seed}", mem.name);
        }
    }
    for id in g.ids() {
        let node = g.node(id);
        let ty = format!("{} {}", fmt_shape(&node.ty.dims), node.ty.dtype);
        if let Op::Input(src) = &node.op {
            match src {
                InputSource::External => {
                    let _ = writeln!(out, "input {} : {ty}", node.name);
                }
                InputSource::TargetHidden { indices, stacked } => {
                    let idx = if *stacked && indices.len() == 1 {
                        format!("{}..{}", indices[0], indices[0] + 1)
                    } else {
                        indices
                            .iter()
                            .map(|i| i.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    let _ = writeln!(out, "input {} = target.hidden[{idx}] : {ty}", node.name);
                }
                InputSource::MemoryPrev(stream) => {
                    let _ = writeln!(out, "input {} = prev({stream}) : {ty}", node.name);
                }
            }
            continue;
        }
        let kw = if g.outputs.contains(&id) {
            "output "
        } else {
            ""
        };
        let _ = writeln!(out, "{kw}{} = {} : {ty}", node.name, call(g, node));
    }
    for (stream, i, v) in &g.emits {
        let _ = writeln!(out, "emit {stream}[{i}] = {}", g.node(*v).name);
    }
    for (state, v) in &g.appends {
        let _ = writeln!(out, "append {state} = {}", g.node(*v).name);
    }
    out
}

/// A node's right-hand side: `linear(x, 576, bias) @w`.
pub fn call(g: &Graph, node: &Node) -> String {
    let arg = |i: usize| g.node(node.inputs[i]).name.clone();
    let all = || {
        node.inputs
            .iter()
            .map(|i| g.node(*i).name.clone())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let text = match &node.op {
        Op::Input(_) => "input".to_string(),
        Op::Linear { out, bias } => format!(
            "linear({}, {out}{})",
            arg(0),
            if *bias { ", bias" } else { "" }
        ),
        Op::RmsNorm { eps, weight } => format!(
            "rms_norm({}, eps={eps}{})",
            arg(0),
            match weight {
                NormWeight::Plain => "",
                NormWeight::UnitOffset => ", unit_offset",
            }
        ),
        Op::GroupRmsNorm { eps } => format!("group_rms_norm({}, eps={eps})", arg(0)),
        Op::Rope { theta } => format!("rope({}, theta={theta})", arg(0)),
        Op::Attention(a) => {
            let mut s = format!("attention({}", arg(0));
            if a.cross {
                let _ = write!(s, ", kv={}", arg(1));
            }
            let _ = write!(
                s,
                ", heads={}, kv_heads={}, head_dim={}, mask={}",
                a.heads, a.kv_heads, a.head_dim, a.mask
            );
            if a.axis == Axis::Draft {
                s.push_str(", axis=draft");
            }
            if let Some(m) = a.train_mask {
                let _ = write!(s, ", train_mask={m}");
            }
            if let Some(c) = a.chunk {
                let _ = write!(s, ", chunk={c}");
            }
            if a.cache != Cache::None {
                let _ = write!(s, ", cache={}", a.cache);
            }
            if let Some(r) = a.rope {
                let _ = write!(s, ", rope={r}");
            }
            if a.rope_scaling.is_some() {
                s.push_str(", rope_scaling=llama3");
            }
            if a.bias {
                s.push_str(", bias");
            }
            match a.qk_norm.as_ref().map(|n| n.weight) {
                Some(NormWeight::Plain) => s.push_str(", qk_norm"),
                Some(w) => {
                    let _ = write!(s, ", qk_norm={}", w.name());
                }
                None => {}
            }
            if let Some(x) = a.scale {
                let _ = write!(s, ", scale={x}");
            }
            if let Some(m) = &a.memory {
                let _ = write!(s, ", memory={m}");
            }
            if let Some(o) = a.out {
                let _ = write!(s, ", out={o}");
            }
            s.push(')');
            s
        }
        Op::SwiGlu { hidden, .. } => format!("{}({}, {hidden})", node.op.name(), arg(0)),
        Op::Embedding { vocab, dim, scale } => match scale {
            None => format!("embedding({}, {vocab}, {dim})", arg(0)),
            Some(s) => format!("embedding({}, {vocab}, {dim}, scale={s})", arg(0)),
        },
        Op::TargetEmbed | Op::TargetLmHead | Op::TargetNorm => {
            format!("{}({})", node.op.name(), arg(0))
        }
        Op::Reshape { shape } => format!("reshape({}, {})", arg(0), fmt_shape(shape)),
        Op::Concat { axis } => format!("concat({}, axis={axis})", all()),
        Op::Stack { axis } => format!("stack({}, axis={axis})", all()),
        Op::Split { axis, parts, index } => {
            format!("split({}, {parts}, axis={axis}, index={index})", arg(0))
        }
        Op::Add => format!("add({}, {})", arg(0), arg(1)),
        Op::Mul => format!("mul({}, {})", arg(0), arg(1)),
        Op::Silu => format!("silu({})", arg(0)),
        Op::LayerSum => format!("layer_sum({})", arg(0)),
    };
    match &node.weights {
        Some(w) => format!("{text} @{w}"),
        None => text,
    }
}

/// `drafter` / `model`, for messages.
pub fn kind_name(k: ItemKind) -> &'static str {
    k.keyword()
}
