//! File settings (`kind parallel`, `l 4`, `tree …`, preset values) and the
//! self-speculative form, which lowers a base model with its attention masks
//! and caches replaced.

use std::collections::BTreeMap;

use crate::ast::{ExprKind, File, ItemKind, Setting};
use crate::config::TargetConfig;
use crate::diagnostic::Diagnostic;
use crate::graph::{DrafterKind, Graph, PrevStart, TrainLoss, TreeSpec};
use crate::op::F64;

use super::{Lowerer, Overrides, Resolver};

/// The value of a setting as plain data.
enum SettingVal {
    Int(i64),
    Float(f64),
    Bool(bool),
    /// `[true, false, …]`: a per-layer flag (`sliding [true, …]`).
    Bools(Vec<bool>),
    /// A bare or dotted name: `parallel`, `model.embed_tokens`.
    Path(String),
    Other,
}

fn setting_val(s: &Setting) -> SettingVal {
    expr_val(&s.value)
}

fn expr_val(e: &crate::ast::Expr) -> SettingVal {
    fn path(e: &crate::ast::Expr) -> Option<String> {
        match &e.kind {
            ExprKind::Name(n) => Some(n.clone()),
            ExprKind::Field(b, f) => Some(format!("{}.{}", path(b)?, f.name)),
            _ => None,
        }
    }
    match &e.kind {
        ExprKind::Int(i) => SettingVal::Int(*i),
        ExprKind::Float(x) => SettingVal::Float(*x),
        ExprKind::Neg(inner) => match &inner.kind {
            ExprKind::Int(i) => SettingVal::Int(-i),
            ExprKind::Float(x) => SettingVal::Float(-x),
            _ => SettingVal::Other,
        },
        ExprKind::Name(n) if n == "true" => SettingVal::Bool(true),
        ExprKind::Name(n) if n == "false" => SettingVal::Bool(false),
        ExprKind::List(items) if !items.is_empty() => {
            let flags: Option<Vec<bool>> = items
                .iter()
                .map(|i| match expr_val(i) {
                    SettingVal::Bool(b) => Some(b),
                    _ => None,
                })
                .collect();
            flags.map_or(SettingVal::Other, SettingVal::Bools)
        }
        _ => path(e).map_or(SettingVal::Other, SettingVal::Path),
    }
}

/// A setting's value with a choice (`a if flag else b`) resolved against the
/// target preset's flags; `None` when the flag is not one (reported).
fn chosen_val(lw: &mut Lowerer, s: &Setting) -> Option<SettingVal> {
    Some(expr_val(lw.chosen(&s.value)?))
}

fn bad(s: &Setting, expected: &str) -> Diagnostic {
    Diagnostic::error(s.value.span, format!("bad value for `{}`", s.key.name))
        .with_label(format!("expected {expected}"))
}

fn check_duplicates(settings: &[Setting], diags: &mut Vec<Diagnostic>) {
    for (i, s) in settings.iter().enumerate() {
        if let Some(prev) = settings[..i].iter().find(|p| p.key.name == s.key.name) {
            diags.push(
                Diagnostic::error(
                    s.key.span,
                    format!("setting `{}` is given twice", s.key.name),
                )
                .with_label("repeated here")
                .with_secondary(prev.key.span, "first given here"),
            );
        }
    }
}

/// Read a preset file into a `TargetConfig`.
pub fn read_preset(file: &File) -> Result<TargetConfig, Vec<Diagnostic>> {
    let mut diags = Vec::new();
    let Some(h) = &file.header else {
        return Err(vec![super::missing_header(file)]);
    };
    if h.kind != ItemKind::Preset {
        return Err(vec![Diagnostic::error(
            h.span,
            format!("expected a preset, found a {}", h.kind.keyword()),
        )
        .with_label("`--target` takes a `preset NAME` file")]);
    }
    let mut cfg = TargetConfig {
        name: h.name.name.clone(),
        ..TargetConfig::default()
    };
    check_duplicates(&file.settings, &mut diags);
    for s in &file.settings {
        match (s.key.name.as_str(), setting_val(s)) {
            ("family", SettingVal::Path(p)) => cfg.family = p,
            ("family", _) => diags.push(bad(s, "a model name such as `llama`")),
            (_, SettingVal::Int(v)) => {
                cfg.ints.insert(s.key.name.clone(), v);
            }
            (_, SettingVal::Float(v)) => {
                cfg.floats.insert(s.key.name.clone(), v);
            }
            (_, SettingVal::Bool(v)) => {
                cfg.flags.insert(s.key.name.clone(), v);
            }
            // A per-layer flag: entries `name[0]`, `name[1]`, … that
            // `a if name[i] else b` reads.
            (_, SettingVal::Bools(v)) => {
                for (i, b) in v.into_iter().enumerate() {
                    cfg.flags.insert(format!("{}[{i}]", s.key.name), b);
                }
            }
            _ => diags.push(bad(
                s,
                "an integer, a number, `true`, `false` or a list of `true`/`false`",
            )),
        }
    }
    if cfg.family.is_empty() && diags.is_empty() {
        diags.push(
            Diagnostic::error(h.span, "preset has no `family`")
                .with_label("add e.g. `family llama`"),
        );
    }
    for (k, v) in &cfg.ints {
        if *v < 1 {
            let span = file
                .settings
                .iter()
                .find(|s| &s.key.name == k)
                .map(|s| s.value.span)
                .unwrap_or(h.span);
            diags.push(
                Diagnostic::error(span, format!("bad value for `{k}`: {v}"))
                    .with_label("sizes must be positive"),
            );
        }
    }
    if let Some(s) = file.stmts.first() {
        diags.push(
            Diagnostic::error(s.span, "a preset holds only settings")
                .with_label("statements belong in model or drafter files"),
        );
    }
    if diags.is_empty() {
        Ok(cfg)
    } else {
        Err(diags)
    }
}

pub(super) fn lower_settings(lw: &mut Lowerer, file: &File, overrides: &BTreeMap<String, i64>) {
    let mut diags = Vec::new();
    check_duplicates(&file.settings, &mut diags);
    let drafter = lw.graph.kind == ItemKind::Drafter;
    for s in &file.settings {
        let key = s.key.name.as_str();
        let Some(val) = chosen_val(lw, s) else {
            continue;
        };
        match (key, val, drafter) {
            ("kind", SettingVal::Path(p), true) => {
                lw.graph.meta.drafter_kind = Some(match p.as_str() {
                    "parallel" => DrafterKind::Parallel,
                    "autoregressive" => DrafterKind::Autoregressive,
                    "self_speculative" => DrafterKind::SelfSpeculative,
                    _ => {
                        diags.push(bad(s, "`parallel`, `autoregressive` or `self_speculative`"));
                        continue;
                    }
                })
            }
            ("kind", _, true) => {
                diags.push(bad(s, "`parallel`, `autoregressive` or `self_speculative`"))
            }
            ("l", SettingVal::Int(v), true) if v >= 1 => {
                lw.graph.meta.draft_len = Some(v);
            }
            ("l", _, true) => diags.push(bad(s, "a positive draft length")),
            ("draft_vocab", SettingVal::Int(v), true) if v >= 1 => {
                lw.graph.meta.draft_vocab = Some(v);
            }
            ("draft_vocab", _, true) => diags.push(bad(
                s,
                "a positive number of tokens, e.g. `draft_vocab 8192`",
            )),
            ("tree", _, true) => match tree_spec(lw, s) {
                Some(t) => lw.graph.meta.tree = Some(t),
                None => diags.push(bad(
                    s,
                    "`chain`, `static(b1, b2, …)` or `dynamic(depth=…, topk=…, nodes=…)`",
                )),
            },
            ("train_steps", SettingVal::Int(v), true) if (1..=16).contains(&v) => {
                lw.graph.meta.train.steps = Some(v);
            }
            ("train_steps", _, true) => diags.push(bad(
                s,
                "1 to 16 training-time-test steps, e.g. `train_steps 7`",
            )),
            ("train_decay", SettingVal::Float(v), true) if v > 0.0 && v <= 1.0 => {
                lw.graph.meta.train.decay = Some(F64::new(v));
            }
            ("train_decay", SettingVal::Int(1), true) => {
                lw.graph.meta.train.decay = Some(F64::new(1.0));
            }
            ("train_decay", _, true) => diags.push(bad(
                s,
                "a step weight decay in (0, 1], e.g. `train_decay 0.8`",
            )),
            ("train_loss", SettingVal::Path(p), true) if p == "distill" || p == "ce" => {
                lw.graph.meta.train.loss = Some(if p == "distill" {
                    TrainLoss::Distill
                } else {
                    TrainLoss::CrossEntropy
                });
            }
            ("train_loss", _, true) => diags.push(bad(s, "`distill` or `ce`")),
            ("train_token_weight" | "train_regression", v, true) => {
                let w = match v {
                    SettingVal::Float(x) if x >= 0.0 && x.is_finite() => x,
                    SettingVal::Int(i) if i >= 0 => i as f64,
                    _ => {
                        diags.push(bad(s, "a weight ≥ 0, e.g. `1.0`"));
                        continue;
                    }
                };
                let slot = if key == "train_regression" {
                    &mut lw.graph.meta.train.regression
                } else {
                    &mut lw.graph.meta.train.token_weight
                };
                *slot = Some(F64::new(w));
            }
            ("prev_start", SettingVal::Path(p), true) if p == "zero" || p == "skip" => {
                lw.prev_start_at = Some(s.key.span);
                lw.graph.meta.prev_start = if p == "skip" {
                    PrevStart::Skip
                } else {
                    PrevStart::Zero
                };
            }
            ("prev_start", _, true) => diags.push(bad(s, "`zero` or `skip`")),
            ("base", SettingVal::Path(p), true) => lw.graph.meta.base = Some(p),
            ("mask", _, true) => {
                if let Some(m) = lw.mask(&s.value) {
                    lw.graph.meta.base_mask = Some(m);
                }
            }
            ("embed" | "final_norm" | "lm_head", SettingVal::Path(p), false) => {
                lw.graph.meta.exports.insert(key.to_string(), p);
            }
            ("embed" | "final_norm" | "lm_head", _, false) => {
                diags.push(bad(s, "a tensor name prefix such as `model.embed_tokens`"))
            }
            (
                "kind" | "l" | "tree" | "base" | "mask" | "draft_vocab" | "train_steps"
                | "train_decay" | "train_loss" | "train_token_weight" | "train_regression"
                | "prev_start",
                _,
                false,
            ) => diags.push(
                Diagnostic::error(s.key.span, format!("`{key}` is a drafter setting"))
                    .with_label("not valid in a model file"),
            ),
            (_, SettingVal::Int(v), _) => {
                lw.file_ints.insert(key.to_string(), v);
                lw.graph.meta.ints.insert(key.to_string(), v);
            }
            (_, SettingVal::Float(v), _) => {
                lw.file_floats.insert(key.to_string(), v);
            }
            _ => diags.push(
                Diagnostic::error(s.key.span, format!("unknown setting `{key}`"))
                    .with_label("not a setting")
                    .with_note("settings are `key value` lines; a binding needs `=`"),
            ),
        }
    }
    for (k, v) in overrides {
        if k == "l" {
            lw.graph.meta.draft_len = Some(*v);
        } else if k == "draft_vocab" && drafter {
            lw.graph.meta.draft_vocab = Some(*v);
        } else {
            lw.file_ints.insert(k.clone(), *v);
            lw.graph.meta.ints.insert(k.clone(), *v);
        }
    }
    if let Some(l) = lw.graph.meta.draft_len {
        lw.file_ints.insert("l".into(), l);
        lw.graph.symbol_values.insert("l".into(), l);
    }
    if let (true, Some(v)) = (drafter, lw.config.int("v")) {
        // `vd`: the size of the vocabulary the drafter's `target.lm_head`
        // predicts over (`v` without `draft_vocab`).
        let n = lw.graph.meta.reduced_vocab(v).unwrap_or(v);
        lw.file_ints.insert("vd".into(), n);
    }
    if drafter {
        let header = file.header.as_ref().map(|h| h.span).unwrap_or_default();
        if lw.graph.meta.draft_vocab.is_some()
            && lw.graph.meta.drafter_kind == Some(DrafterKind::SelfSpeculative)
        {
            let span = file
                .settings
                .iter()
                .find(|s| s.key.name == "draft_vocab")
                .map_or(header, |s| s.key.span);
            diags.push(
                Diagnostic::error(span, "a self-speculative drafter has no draft vocabulary")
                    .with_label("it drafts with the target's own LM head")
                    .with_note("`draft_vocab` is for parallel and autoregressive drafters"),
            );
        }
        match lw.graph.meta.drafter_kind {
            None => diags.push(
                Diagnostic::error(header, "drafter has no `kind`").with_label(
                    "add `kind parallel`, `kind autoregressive` or `kind self_speculative`",
                ),
            ),
            Some(DrafterKind::Parallel) if lw.graph.meta.draft_len.is_none() => diags.push(
                Diagnostic::error(header, "parallel drafter has no draft length")
                    .with_label("add e.g. `l 4`"),
            ),
            Some(DrafterKind::SelfSpeculative)
                if lw.graph.meta.base.is_none() || lw.graph.meta.base_mask.is_none() =>
            {
                diags.push(
                    Diagnostic::error(header, "self-speculative drafter needs `base` and `mask`")
                        .with_label("add e.g. `base llama` and `mask sliding_window(64, 1)`"),
                )
            }
            _ => {}
        }
    }
    lw.diags.extend(diags);
}

fn tree_spec(lw: &mut Lowerer, s: &Setting) -> Option<TreeSpec> {
    match &s.value.kind {
        ExprKind::Name(n) if n == "chain" => Some(TreeSpec::Chain),
        ExprKind::Call {
            callee,
            args,
            weights: None,
        } => {
            let name = match &callee.kind {
                ExprKind::Name(n) => n.as_str(),
                _ => return None,
            };
            match name {
                "static" => {
                    let mut b = Vec::new();
                    for a in args {
                        if a.name.is_some() {
                            return None;
                        }
                        let v = lw.const_int(&a.value, "a branching factor")?;
                        if v < 1 {
                            return None;
                        }
                        b.push(v);
                    }
                    (!b.is_empty()).then_some(TreeSpec::Static(b))
                }
                "dynamic" => {
                    let mut get = |key: &str| -> Option<i64> {
                        let a = args
                            .iter()
                            .find(|a| a.name.as_ref().is_some_and(|n| n.name == key))?;
                        lw.const_int(&a.value, key).filter(|v| *v >= 1)
                    };
                    let (depth, topk, nodes) = (get("depth")?, get("topk")?, get("nodes")?);
                    (args.len() == 3).then_some(TreeSpec::Dynamic { depth, topk, nodes })
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// `kind self_speculative`: lower the base model with the drafter's mask on
/// every cached attention, reading the target's caches (MagicDec).
pub(super) fn lower_self_speculative(
    lw: Lowerer,
    file: &File,
    symbol_overrides: &BTreeMap<String, i64>,
    resolver: &dyn Resolver,
) -> Result<Graph, Vec<Diagnostic>> {
    let header = file.header.as_ref().map(|h| h.span).unwrap_or_default();
    let mut diags = lw.diags;
    if let Some(s) = file.stmts.first() {
        diags.push(
            Diagnostic::error(s.span, "a self-speculative drafter has no statements")
                .with_label("its graph is the base model's"),
        );
    }
    // `base target`: the target's own model file (its preset's `family`), so
    // one self-speculative description serves Llama and Qwen 2 targets alike.
    let mut base = lw.graph.meta.base.clone().unwrap_or_default();
    if base == "target" {
        base = lw.config.family.clone();
    }
    let base_span = file
        .settings
        .iter()
        .find(|s| s.key.name == "base")
        .map(|s| s.value.span)
        .unwrap_or(header);
    if lw.graph.meta.drafter_kind != Some(DrafterKind::SelfSpeculative) {
        diags.push(
            Diagnostic::error(
                base_span,
                "`base` is only valid with `kind self_speculative`",
            )
            .with_label("unexpected base model"),
        );
    }
    if !diags.is_empty() {
        return Err(diags);
    }
    let Some((path, text)) = resolver.resolve(&base) else {
        return Err(vec![Diagnostic::error(
            base_span,
            format!("cannot find base model `{base}`"),
        )
        .with_label(format!(
            "expected a file `{base}.draft` next to this one"
        ))]);
    };
    let (base_file, parse_diags) = crate::parser::parse(&text);
    let failed = |what: &str| {
        vec![
            Diagnostic::error(base_span, format!("base model `{base}` ({path}) {what}"))
                .with_label("see its own diagnostics")
                .with_note(format!("run `draftc check {path}`")),
        ]
    };
    if !parse_diags.is_empty() {
        return Err(failed("has syntax errors"));
    }
    if base_file.header.as_ref().map(|h| h.kind) != Some(ItemKind::Model) {
        return Err(failed("is not a `model` file"));
    }
    let mut inner = Lowerer::new(lw.config, ItemKind::Model, &base);
    inner.overrides = Overrides {
        mask: lw.graph.meta.base_mask,
        target_cache: true,
    };
    lower_settings(&mut inner, &base_file, symbol_overrides);
    inner.collect_definitions(&base_file.stmts);
    for stmt in &base_file.stmts {
        inner.stmt(stmt);
    }
    let mut g = inner.finish(header).map_err(|_| failed("has errors"))?;
    g.kind = ItemKind::Drafter;
    g.name = lw.graph.name.clone();
    g.emits.clear();
    g.meta.drafter_kind = lw.graph.meta.drafter_kind;
    g.meta.draft_len = lw.graph.meta.draft_len;
    g.meta.tree = lw.graph.meta.tree.clone();
    g.meta.base = Some(base);
    g.meta.base_mask = lw.graph.meta.base_mask;
    g.meta.ints.extend(lw.graph.meta.ints.clone());
    g.symbol_values.extend(lw.graph.symbol_values.clone());
    Ok(g)
}
