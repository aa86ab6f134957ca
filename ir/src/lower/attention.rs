//! `attention(…)` calls: heads and GQA, axis and chunking, masks, caches
//! (own, per loop iteration, or the target's), RoPE, cross (`kv=`) and
//! memory (`memory=`) sources, and the self-speculation overrides.

use crate::ast::{Expr, ExprKind};
use crate::diagnostic::Diagnostic;
use crate::dim::fmt_shape;
use crate::graph::ValueId;
use crate::op::{
    AttentionAttrs, Axis, Cache, Mask, NormWeight, Op, QkNorm, RopeScaling, StateName, F64,
};
use crate::span::Span;

use super::args::CallArgs;
use super::expr::is_target;
use super::ops::callee_name;
use super::{Lowerer, Val};

impl Lowerer<'_> {
    pub(super) fn attention(&mut self, a: &mut CallArgs, span: Span) -> Option<ValueId> {
        let x = self.tensor_arg(a, "x", Some(0), true, "attention(x, heads=h)")?;
        let kv = match a.get("kv", None) {
            Some(e) => Some(self.tensor_of(e, true)?),
            None => None,
        };
        let Some(he) = a.get("heads", None) else {
            let d = a.missing("heads", "attention(x, heads=h, kv_heads=hkv)");
            self.error(d);
            return None;
        };
        let heads = self.positive_attr(he, "heads")?;
        let kv_heads = match a.get("kv_heads", None) {
            Some(e) => {
                let k = self.positive_attr(e, "kv_heads")?;
                if heads % k != 0 {
                    self.error(Diagnostic::error(e.span, format!("bad value for `kv_heads`: {heads} heads are not a multiple of {k} KV heads")).with_label("grouped-query attention needs heads % kv_heads == 0"));
                    return None;
                }
                k
            }
            None => heads,
        };
        let axis = match a.get("axis", None) {
            None => Axis::Sequence,
            Some(e) => match &e.kind {
                ExprKind::Name(n) if n == "sequence" => Axis::Sequence,
                ExprKind::Name(n) if n == "draft" => Axis::Draft,
                _ => {
                    self.error(
                        Diagnostic::error(e.span, "bad value for `axis`")
                            .with_label("expected `sequence` or `draft`"),
                    );
                    return None;
                }
            },
        };
        let ty = self.ty(x).clone();
        let want_rank = if axis == Axis::Draft { 3 } else { 2 };
        if ty.rank() != want_rank {
            let want = if axis == Axis::Draft {
                "[t, l, d]"
            } else {
                "[t, d]"
            };
            self.error(
                Diagnostic::error(
                    span,
                    format!(
                        "shape mismatch: attention along the {} axis expects {want}, found {}",
                        if axis == Axis::Draft {
                            "draft"
                        } else {
                            "sequence"
                        },
                        fmt_shape(&ty.dims)
                    ),
                )
                .with_label("wrong rank"),
            );
            return None;
        }
        let dm = self.fixed_last(x, "attention", span)?;
        let head_dim = match a.get("head_dim", None) {
            Some(e) => self.positive_attr(e, "head_dim")?,
            None => match dm.as_const().filter(|d| d % heads == 0) {
                Some(d) => d / heads,
                None => {
                    self.error(
                        Diagnostic::error(he.span, format!("bad value for `heads`: the model width {dm} is not divisible by {heads} heads"))
                            .with_label("give `head_dim=` explicitly or change `heads`"),
                    );
                    return None;
                }
            },
        };
        let memory = match a.get("memory", None) {
            Some(e) => Some(self.state_ref(e, "memory")?),
            None => None,
        };
        if let Some(m) = &memory {
            if !self.graph.memories.iter().any(|d| &d.name == m) {
                if self.poisoned.contains(&super::memory::memory_key(m)) {
                    return None;
                }
                self.error(
                    Diagnostic::error(span, format!("undefined memory `{m}`"))
                        .with_label("declare it with `memory NAME = target.hidden[…]`"),
                );
                return None;
            }
            if kv.is_some() {
                self.error(
                    Diagnostic::error(span, "`kv=` and `memory=` cannot both be given")
                        .with_label("keys come from one source"),
                );
                return None;
            }
        }
        let mut mask = match a.get("mask", None) {
            Some(e) => self.mask(e)?,
            None if axis == Axis::Draft => Mask::Full,
            None if memory.is_some() || kv.is_some() => Mask::CrossDiagonal,
            None => Mask::Causal,
        };
        let train_mask = match a.get("train_mask", None) {
            Some(e) => Some(self.mask(e)?),
            None => None,
        };
        if matches!(train_mask, Some(Mask::Tree)) {
            self.error(
                Diagnostic::error(span, "`train_mask=tree` is not a training mask")
                    .with_label("the tree mask exists only during verification"),
            );
            return None;
        }
        let chunk = match a.get("chunk", None) {
            Some(e) if axis != Axis::Draft => {
                self.error(
                    Diagnostic::error(e.span, "`chunk` applies only to `axis=draft`")
                        .with_label("not chunkable"),
                );
                return None;
            }
            Some(e) => Some(self.positive_attr(e, "chunk")?),
            None => None,
        };
        let mut cache = match a.get("cache", None) {
            None => Cache::None,
            Some(e) => {
                let target = matches!(&e.kind, ExprKind::Index { base, .. } if matches!(&base.kind, ExprKind::Field(b, _) if is_target(b)))
                    || matches!(&e.kind, ExprKind::Field(b, _) if is_target(b));
                let s = self.state_ref(e, "cache")?;
                if target {
                    Cache::Target(s)
                } else {
                    Cache::Own(s)
                }
            }
        };
        if axis == Axis::Draft
            && (cache != Cache::None || !matches!(mask, Mask::Full | Mask::Causal))
        {
            self.error(
                Diagnostic::error(
                    span,
                    "draft-axis attention takes no cache and only `full` or `causal` masks",
                )
                .with_label("the draft axis is within one token's drafts"),
            );
            return None;
        }
        if mask == Mask::CrossDiagonal && kv.is_none() && memory.is_none() {
            self.error(
                Diagnostic::error(
                    span,
                    "`mask=cross_diagonal` needs keys from `kv=` or `memory=`",
                )
                .with_label("no cross-attention source"),
            );
            return None;
        }
        if mask == Mask::Tree && cache == Cache::None {
            self.error(
                Diagnostic::error(span, "`mask=tree` needs a cache (the committed prefix)")
                    .with_label("add `cache=NAME`"),
            );
            return None;
        }
        if let (Some(m), Cache::Own(s)) = (self.overrides.mask, &cache) {
            mask = m;
            if self.overrides.target_cache {
                cache = Cache::Target(s.clone());
            }
        }
        let rope = match a.get("rope", None) {
            None => None,
            Some(e) if matches!(&e.kind, ExprKind::Name(n) if n == "none") => None,
            Some(e) => match self.expr(e) {
                Val::Float(v) if v > 0.0 => Some(F64::new(v)),
                Val::Dim(d) if d.as_const().is_some_and(|c| c > 0) => {
                    d.as_const().map(|c| F64::new(c as f64))
                }
                Val::Error => return None,
                _ => {
                    self.error(
                        Diagnostic::error(e.span, "bad value for `rope`")
                            .with_label("expected a positive RoPE base θ or `none`"),
                    );
                    return None;
                }
            },
        };
        if rope.is_some() && head_dim % 2 != 0 {
            self.error(
                Diagnostic::error(
                    span,
                    format!("RoPE needs an even head_dim, found {head_dim}"),
                )
                .with_label("odd head_dim"),
            );
            return None;
        }
        let out_width = match a.get("out", None) {
            Some(e) if axis == Axis::Draft || memory.is_some() || kv.is_some() => {
                self.error(
                    Diagnostic::error(e.span, "`out` applies to self-attention along the sequence")
                        .with_label(
                            "cross, memory and draft-axis attention keep the query's width",
                        ),
                );
                return None;
            }
            Some(e) => Some(self.positive_attr(e, "out")?),
            None => None,
        };
        let bias = a.flag("bias", &mut self.diags);
        let rope_scaling = match a.get("rope_scaling", None) {
            None => None,
            Some(e) => {
                let e = self.chosen(e)?;
                match &e.kind {
                    ExprKind::Name(n) if n == "none" => None,
                    ExprKind::Name(n) if n == "llama3" => {
                        Some(Box::new(self.llama3_scaling(e.span)?))
                    }
                    _ => {
                        self.error(
                            Diagnostic::error(e.span, "bad value for `rope_scaling`")
                                .with_label("expected `llama3` or `none`"),
                        );
                        return None;
                    }
                }
            }
        };
        if rope_scaling.is_some() && rope.is_none() {
            self.error(
                Diagnostic::error(
                    span,
                    "`rope_scaling` scales RoPE, which this attention does not apply",
                )
                .with_label("add `rope=theta`"),
            );
            return None;
        }
        let qk_norm = self.qk_norm(a)?;
        let scale = self.positive_float(a, "scale")?.map(F64::new);
        if scale.is_some() && axis == Axis::Draft {
            self.error(
                Diagnostic::error(span, "`scale` applies to attention along the sequence")
                    .with_label("draft-axis attention scales by 1/√head_dim"),
            );
            return None;
        }
        if qk_norm.is_some() && (axis == Axis::Draft || memory.is_some() || kv.is_some()) {
            self.error(
                Diagnostic::error(
                    span,
                    "`qk_norm` applies to self-attention along the sequence",
                )
                .with_label("cross, memory and draft-axis attention take no head norms"),
            );
            return None;
        }
        let attrs = AttentionAttrs {
            heads,
            kv_heads,
            head_dim,
            mask,
            axis,
            chunk,
            cache,
            rope,
            cross: kv.is_some(),
            memory,
            train_mask,
            out: out_width.filter(|&o| dm.as_const() != Some(o)),
            bias,
            rope_scaling,
            qk_norm,
            scale,
        };
        let mut inputs = vec![x];
        if let Some(k) = kv {
            if self.ty(k).rank() != ty.rank() {
                let found = fmt_shape(&self.ty(k).dims);
                self.error(
                    Diagnostic::error(
                        span,
                        format!(
                            "shape mismatch: `kv` must have the query's rank {}, found {found}",
                            ty.rank()
                        ),
                    )
                    .with_label("rank differs"),
                );
                return None;
            }
            inputs.push(k);
        }
        if let Some(m) = &attrs.memory {
            let width = self
                .graph
                .memories
                .iter()
                .find(|d| &d.name == m)
                .map(|d| d.width.clone());
            if width.as_ref() != Some(&dm) {
                self.error(
                    Diagnostic::error(span, format!("shape mismatch: memory `{m}` rows are {} wide but the query is {dm} wide", width.unwrap_or_default()))
                        .with_label("memory attention needs equal widths"),
                );
                return None;
            }
        }
        let mut out = ty;
        out.dims[want_rank - 1] = attrs.out.map_or(dm, crate::dim::Dim::constant);
        Some(self.push(Op::Attention(attrs), inputs, out, span))
    }

    /// `name`, `name[i]`, `target.kv[i]`: inside `repeat`, a bare name gets the loop indices.
    pub(crate) fn state_ref(&mut self, e: &Expr, what: &str) -> Option<StateName> {
        let (base, explicit) = match &e.kind {
            ExprKind::Index { base, indices } => {
                let mut idx = Vec::new();
                for i in indices {
                    idx.push(self.const_int(i, "a state index")?);
                }
                (base.as_ref(), Some(idx))
            }
            _ => (e, None),
        };
        let name = match &base.kind {
            ExprKind::Name(n) => n.clone(),
            ExprKind::Field(b, f) if is_target(b) => f.name.clone(),
            _ => {
                self.error(
                    Diagnostic::error(e.span, format!("bad value for `{what}`"))
                        .with_label("expected a state name such as `kv` or `mem[i]`"),
                );
                return None;
            }
        };
        let index = explicit.unwrap_or_else(|| {
            if what == "cache" {
                self.loops.iter().map(|(_, v)| *v).collect()
            } else {
                Vec::new()
            }
        });
        Some(StateName { name, index })
    }

    pub(crate) fn mask(&mut self, e: &Expr) -> Option<Mask> {
        // `mask=sliding_window(w, 0) if sliding[i] else causal`.
        let e = self.chosen(e)?;
        let bad = |s: &mut Self| {
            s.error(
                Diagnostic::error(e.span, "bad value for `mask`")
                    .with_label("expected causal, full, cross_diagonal, tree, sliding_window(w, sink) or inverse_block(k, offset)"),
            );
            None
        };
        match &e.kind {
            ExprKind::Name(n) => match n.as_str() {
                "causal" => Some(Mask::Causal),
                "full" => Some(Mask::Full),
                "cross_diagonal" => Some(Mask::CrossDiagonal),
                "tree" => Some(Mask::Tree),
                _ => bad(self),
            },
            ExprKind::Call {
                callee,
                args,
                weights: None,
            } => {
                let Some(n) = callee_name(callee) else {
                    return bad(self);
                };
                let (first, second) = match n.as_str() {
                    "sliding_window" => ("window", "sink"),
                    "inverse_block" => ("window", "offset"),
                    _ => return bad(self),
                };
                let mut a = CallArgs::new(&n, e.span, args, &[first, second]);
                let (Some(x), y) = (a.get(first, Some(0)), a.get(second, Some(1))) else {
                    let d = a.missing(first, &format!("{n}(64, 1)"));
                    self.error(d);
                    return None;
                };
                let xv = self.positive_attr(x, first)?;
                let yv = match y {
                    Some(y) => self.const_int(y, second)?,
                    None if n == "inverse_block" => 0,
                    None => {
                        let d = a.missing(second, &format!("{n}(64, 1)"));
                        self.error(d);
                        return None;
                    }
                };
                a.finish(&mut self.diags);
                if yv < 0 {
                    self.error(
                        Diagnostic::error(e.span, format!("bad value for `{second}`: {yv}"))
                            .with_label("expected ≥ 0"),
                    );
                    return None;
                }
                Some(if n == "sliding_window" {
                    Mask::SlidingWindow {
                        window: xv,
                        sink: yv,
                    }
                } else {
                    Mask::InverseBlock {
                        window: xv,
                        offset: yv,
                    }
                })
            }
            _ => bad(self),
        }
    }
}

impl Lowerer<'_> {
    /// Llama 3's RoPE scaling from the preset's `rope_factor`,
    /// `rope_low_freq_factor`, `rope_high_freq_factor` (numbers) and
    /// `rope_original_context` (an integer); an error naming those missing.
    fn qk_norm(&mut self, a: &mut CallArgs) -> Option<Option<Box<QkNorm>>> {
        let weight = match a.get("qk_norm", None) {
            // A bare `qk_norm` (positional): the plain weight.
            None => a
                .flag("qk_norm", &mut self.diags)
                .then_some(NormWeight::Plain),
            Some(e) => {
                let e = self.chosen(e)?;
                match &e.kind {
                    ExprKind::Name(n) if n == "none" || n == "false" => None,
                    ExprKind::Name(n) if n == "plain" || n == "true" => Some(NormWeight::Plain),
                    ExprKind::Name(n) if n == "unit_offset" => Some(NormWeight::UnitOffset),
                    _ => {
                        self.error(
                            Diagnostic::error(e.span, "bad value for `qk_norm`")
                                .with_label("expected `plain`, `unit_offset` or `none`"),
                        );
                        return None;
                    }
                }
            }
        };
        Some(weight.map(|weight| {
            Box::new(QkNorm {
                eps: F64::new(self.default_eps()),
                weight,
            })
        }))
    }

    fn llama3_scaling(&mut self, span: Span) -> Option<RopeScaling> {
        let num = |k: &str| {
            self.config
                .floats
                .get(k)
                .copied()
                .or_else(|| self.config.int(k).map(|v| v as f64))
        };
        let names = [
            "rope_factor",
            "rope_low_freq_factor",
            "rope_high_freq_factor",
        ];
        let vals: Vec<Option<f64>> = names.iter().map(|k| num(k)).collect();
        let original = self.config.int("rope_original_context");
        let mut missing: Vec<&str> = names
            .iter()
            .zip(&vals)
            .filter(|(_, v)| !v.is_some_and(|x| x > 0.0 && x.is_finite()))
            .map(|(k, _)| *k)
            .collect();
        if original.is_none_or(|o| o <= 0) {
            missing.push("rope_original_context");
        }
        if let (Some(low), Some(high)) = (vals[1], vals[2]) {
            if high <= low {
                missing.push("rope_high_freq_factor (above rope_low_freq_factor)");
            }
        }
        if !missing.is_empty() {
            self.error(
                Diagnostic::error(
                    span,
                    "`rope_scaling=llama3` needs the preset's scaling values",
                )
                .with_label(format!("missing or out of range: {}", missing.join(", "))),
            );
            return None;
        }
        let v = |i: usize| F64::new(vals[i].unwrap_or(1.0));
        Some(RopeScaling {
            factor: v(0),
            low_freq_factor: v(1),
            high_freq_factor: v(2),
            original_context: original.unwrap_or(1),
        })
    }
}
