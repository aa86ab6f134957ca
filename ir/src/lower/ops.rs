//! Op calls: the signature of every op, its shape rule, its weights, and the
//! expansion of `@weight.{i}` names. Adding an op means adding one arm here.

use crate::ast::{Arg, Expr, ExprKind, WeightPath};
use crate::diagnostic::Diagnostic;
use crate::dim::{fmt_shape, Dim};
use crate::graph::ValueId;
use crate::op::{GateAct, NormWeight, Op, F64};
use crate::span::Span;
use crate::types::{DType, TensorType};

use super::args::CallArgs;
use super::expr::{closest, is_target};
use super::{Lowerer, Val};
use crate::ast::ItemKind;

/// (call name, signature, has weights)
const OPS: &[(&str, &[&str], bool)] = &[
    ("linear", &["x", "out", "bias"], true),
    ("rms_norm", &["x", "eps", "unit_offset"], true),
    ("group_rms_norm", &["x", "eps"], true),
    ("rope", &["x", "theta"], false),
    (
        "attention",
        &[
            "x",
            "kv",
            "heads",
            "kv_heads",
            "head_dim",
            "mask",
            "axis",
            "chunk",
            "cache",
            "rope",
            "memory",
            "train_mask",
            "out",
            "bias",
            "rope_scaling",
            "qk_norm",
            "scale",
        ],
        true,
    ),
    ("prev", &["stream"], false),
    ("swiglu", &["x", "hidden"], true),
    ("geglu", &["x", "hidden"], true),
    ("embedding", &["ids", "vocab", "dim", "scale"], true),
    ("reshape", &["x", "shape"], false),
    ("concat", &["xs…", "axis"], false),
    ("split", &["x", "parts", "axis", "index"], false),
    ("stack", &["xs…", "axis"], false),
    ("add", &["a", "b"], false),
    ("mul", &["a", "b"], false),
    ("silu", &["x"], false),
    ("layer_sum", &["x"], true),
    ("target.embed", &["ids"], false),
    ("target.lm_head", &["x"], false),
    ("target.norm", &["x"], false),
];

/// Weight tensors of an op: (suffix after the `@prefix.`, shape).
pub fn param_shapes(op: &Op, inputs: &[&TensorType], out: &TensorType) -> Vec<(String, Vec<Dim>)> {
    let last = |t: &TensorType| t.dims.last().cloned().unwrap_or_default();
    let c = Dim::constant;
    match op {
        Op::Linear { out: o, bias } => {
            let mut v = vec![("weight".to_string(), vec![o.clone(), last(inputs[0])])];
            if *bias {
                v.push(("bias".to_string(), vec![o.clone()]));
            }
            v
        }
        Op::RmsNorm { .. } => vec![("weight".into(), vec![last(inputs[0])])],
        Op::GroupRmsNorm { .. } => {
            let d = &inputs[0].dims;
            vec![("weight".into(), d[d.len().saturating_sub(2)..].to_vec())]
        }
        Op::Attention(a) => {
            let dm = last(inputs[0]);
            let dkv = if a.cross {
                last(inputs[1])
            } else if a.memory.is_some() {
                last(out)
            } else {
                dm.clone()
            };
            let (qd, kvd) = (c(a.heads * a.head_dim), c(a.kv_heads * a.head_dim));
            let mut v = vec![
                ("q_proj.weight".into(), vec![qd.clone(), dm]),
                ("k_proj.weight".into(), vec![kvd.clone(), dkv.clone()]),
                ("v_proj.weight".into(), vec![kvd.clone(), dkv]),
                ("o_proj.weight".into(), vec![last(out), qd.clone()]),
            ];
            if a.qk_norm.is_some() {
                v.push(("q_norm.weight".into(), vec![c(a.head_dim)]));
                v.push(("k_norm.weight".into(), vec![c(a.head_dim)]));
            }
            if a.bias {
                v.push(("q_proj.bias".into(), vec![qd]));
                v.push(("k_proj.bias".into(), vec![kvd.clone()]));
                v.push(("v_proj.bias".into(), vec![kvd]));
            }
            v
        }
        Op::SwiGlu { hidden, .. } => {
            let dm = last(inputs[0]);
            vec![
                ("gate_proj.weight".into(), vec![hidden.clone(), dm.clone()]),
                ("up_proj.weight".into(), vec![hidden.clone(), dm.clone()]),
                ("down_proj.weight".into(), vec![dm, hidden.clone()]),
            ]
        }
        Op::Embedding { vocab, dim, .. } => {
            vec![("weight".into(), vec![vocab.clone(), dim.clone()])]
        }
        Op::LayerSum => {
            let d = &inputs[0].dims;
            vec![("weight".into(), vec![d[d.len() - 2].clone()])]
        }
        Op::Input(_)
        | Op::Rope { .. }
        | Op::TargetEmbed
        | Op::TargetLmHead
        | Op::TargetNorm
        | Op::Reshape { .. }
        | Op::Concat { .. }
        | Op::Split { .. }
        | Op::Stack { .. }
        | Op::Add
        | Op::Mul
        | Op::Silu => Vec::new(),
    }
}

pub(super) fn callee_name(callee: &Expr) -> Option<String> {
    match &callee.kind {
        ExprKind::Name(n) => Some(n.clone()),
        ExprKind::Field(b, f) if is_target(b) => Some(format!("target.{}", f.name)),
        _ => None,
    }
}

impl Lowerer<'_> {
    pub(crate) fn call(
        &mut self,
        e: &Expr,
        callee: &Expr,
        args: &[Arg],
        weights: Option<&WeightPath>,
    ) -> Val {
        let Some(name) = callee_name(callee) else {
            self.error(
                Diagnostic::error(callee.span, "expected an op name before `(`")
                    .with_label("not callable"),
            );
            return Val::Error;
        };
        let Some(&(_, sig, has_weights)) = OPS.iter().find(|(n, _, _)| *n == name) else {
            let names: Vec<String> = OPS.iter().map(|o| o.0.to_string()).collect();
            let mut d = Diagnostic::error(callee.span, format!("unknown op `{name}`"))
                .with_label("no such op");
            d = match closest(&name, &names) {
                Some(s) => d.with_note(format!("did you mean `{s}`?")),
                None => d.with_note(format!("ops: {}", names.join(", "))),
            };
            self.error(d);
            return Val::Error;
        };
        if name.starts_with("target.") && self.graph.kind != ItemKind::Drafter {
            self.error(
                Diagnostic::error(
                    callee.span,
                    "`target` references are only valid in drafter files",
                )
                .with_label("a model reads no target"),
            );
            return Val::Error;
        }
        let prefix = match (has_weights, weights) {
            (true, None) => {
                self.error(
                    Diagnostic::error(e.span, format!("`{name}` has weights but no weight name"))
                        .with_label(format!(
                            "add `@name` after the `)`, e.g. `{name}(…) @my_{name}`"
                        )),
                );
                None
            }
            (false, Some(w)) => {
                self.error(
                    Diagnostic::error(w.span, format!("`{name}` has no weights"))
                        .with_label("remove this `@name`"),
                );
                None
            }
            (true, Some(w)) => self.weight_prefix(w),
            (false, None) => None,
        };
        let mut a = CallArgs::new(&name, e.span, args, sig);
        let errors_before = self.diags.len();
        let result = self.op(&name, &mut a, e.span);
        // After a failed argument (or an input poisoned by an earlier
        // error) the rest went unread: reporting them as extra would mislead.
        if result.is_some() && self.diags.len() == errors_before {
            a.finish(&mut self.diags);
        }
        let Some(id) = result else { return Val::Error };
        if has_weights {
            let Some(prefix) = prefix else {
                return Val::Error;
            };
            self.bind_weights(id, prefix, weights.map(|w| w.span).unwrap_or(e.span));
        }
        Val::Tensor(id)
    }

    /// Expand `{expr}` segments of a weight path, after choosing one side of
    /// `(a if flag else b)` by the target preset's flag.
    pub(crate) fn weight_prefix(&mut self, w: &WeightPath) -> Option<String> {
        if w.text.starts_with('(') {
            let chosen = self.weight_choice(w)?;
            return self.weight_prefix(&chosen);
        }
        let mut out = String::new();
        let text = &w.text;
        let base = w.span.start as usize + 1; // after '@'
        let mut i = 0;
        let mut ok = true;
        while i < text.len() {
            let rest = &text[i..];
            if let Some(stripped) = rest.strip_prefix('{') {
                let Some(close) = stripped.find('}') else {
                    self.error(
                        Diagnostic::error(w.span, "unclosed `{` in weight name")
                            .with_label("expected `}`"),
                    );
                    return None;
                };
                let inner = &stripped[..close];
                match crate::parser::parse_expr_fragment(inner, base + i + 1) {
                    Ok(expr) => match self.const_int(&expr, "a weight-name index") {
                        Some(v) => out.push_str(&v.to_string()),
                        None => ok = false,
                    },
                    Err(d) => {
                        self.diags.extend(d);
                        ok = false;
                    }
                }
                i += close + 2;
            } else {
                let ch = rest.chars().next().unwrap_or('.');
                out.push(ch);
                i += ch.len_utf8();
            }
        }
        if out.split('.').any(|s| s.is_empty()) {
            self.error(
                Diagnostic::error(w.span, format!("bad weight name `{out}`"))
                    .with_label("empty segment between dots"),
            );
            return None;
        }
        ok.then_some(out)
    }

    /// The side of `@(a if flag else b)` that the preset's `flag` picks, as
    /// a weight path of its own (spans into the source kept).
    fn weight_choice(&mut self, w: &WeightPath) -> Option<WeightPath> {
        let start = w.span.start as usize + 2; // after `@(`
                                               // Without its `)` (the lexer reported it): nothing more to say.
        let inner = w.text.strip_prefix('(')?.strip_suffix(')')?;
        // Words at brace depth 0, with their byte offsets in `inner`.
        let mut words: Vec<(usize, &str)> = Vec::new();
        let (mut depth, mut begin) = (0i32, None);
        for (i, c) in inner.char_indices().chain([(inner.len(), ' ')]) {
            depth += (c == '{') as i32 - (c == '}') as i32;
            match (c.is_whitespace() && depth == 0, begin) {
                (true, Some(b)) => {
                    words.push((b, &inner[b..i]));
                    begin = None;
                }
                (false, None) => begin = Some(i),
                _ => {}
            }
        }
        let path = |(at, text): (usize, &str)| WeightPath {
            text: text.to_string(),
            span: Span::new(start + at - 1, start + at + text.len()),
        };
        match words.as_slice() {
            [a, (_, "if"), f, (_, "else"), b] => {
                let flag = crate::ast::Ident {
                    name: f.1.to_string(),
                    span: Span::new(start + f.0, start + f.0 + f.1.len()),
                };
                Some(path(if self.flag(&flag, None)? { *a } else { *b }))
            }
            _ => {
                self.error(
                    Diagnostic::error(w.span, "a weight-name choice is `@(a if flag else b)`")
                        .with_label("e.g. `@(model.embed_tokens if tied_embeddings else lm_head)`"),
                );
                None
            }
        }
    }

    fn bind_weights(&mut self, id: ValueId, prefix: String, span: Span) {
        let node = self.graph.node(id).clone();
        let inputs: Vec<&TensorType> = node
            .inputs
            .iter()
            .map(|i| &self.graph.node(*i).ty)
            .collect();
        let shapes = param_shapes(&node.op, &inputs, &node.ty);
        for (suffix, shape) in shapes {
            let full = format!("{prefix}.{suffix}");
            match self.bound_weights.get(&full) {
                Some((prev, prev_span)) if *prev != shape => {
                    let (prev, prev_span) = (prev.clone(), *prev_span);
                    self.error(
                        Diagnostic::error(
                            span,
                            format!("weight `{full}` is bound twice with different shapes"),
                        )
                        .with_label(format!("here it is {}", fmt_shape(&shape)))
                        .with_secondary(prev_span, format!("here it is {}", fmt_shape(&prev))),
                    );
                }
                Some(_) => {} // tied weights (same tensor, same shape)
                None => {
                    self.bound_weights.insert(full, (shape, span));
                }
            }
        }
        self.graph.nodes[id.index()].weights = Some(prefix);
    }

    /// A tensor argument; `float` requires a float dtype.
    pub(super) fn tensor_arg(
        &mut self,
        a: &mut CallArgs,
        name: &str,
        pos: Option<usize>,
        float: bool,
        example: &str,
    ) -> Option<ValueId> {
        let Some(e) = a.get(name, pos) else {
            let d = a.missing(name, example);
            self.error(d);
            return None;
        };
        self.tensor_of(e, float)
    }

    pub(super) fn tensor_of(&mut self, e: &Expr, float: bool) -> Option<ValueId> {
        let v = self.expr(e);
        let Val::Tensor(id) = self.expect_tensor(v, e.span) else {
            return None;
        };
        let dt = self.ty(id).dtype;
        if float && !dt.is_float() {
            self.error(
                Diagnostic::error(
                    e.span,
                    format!("dtype mismatch: expected a float tensor, found {dt}"),
                )
                .with_label("token ids need `embedding` first"),
            );
            return None;
        }
        if !float && dt != DType::U32 {
            self.error(
                Diagnostic::error(
                    e.span,
                    format!("dtype mismatch: expected u32 token ids, found {dt}"),
                )
                .with_label("expected ids"),
            );
            return None;
        }
        Some(id)
    }

    pub(super) fn require_rank(
        &mut self,
        id: ValueId,
        min: usize,
        op: &str,
        span: Span,
    ) -> Option<()> {
        let r = self.ty(id).rank();
        if r < min {
            let shape = fmt_shape(&self.ty(id).dims);
            self.error(
                Diagnostic::error(
                    span,
                    format!("`{op}` needs a tensor of rank ≥ {min}, found {shape}"),
                )
                .with_label("rank too small"),
            );
            return None;
        }
        Some(())
    }

    /// A fixed (constant) last dim, e.g. a linear's input features.
    pub(super) fn fixed_last(&mut self, id: ValueId, op: &str, span: Span) -> Option<Dim> {
        let last = self.ty(id).last().cloned()?;
        if last.symbols().any(|s| s != "l") {
            self.error(
                Diagnostic::error(
                    span,
                    format!("`{op}` needs a fixed feature size, found `{last}`"),
                )
                .with_label("the last dim depends on the token count"),
            );
            return None;
        }
        Some(last)
    }

    pub(super) fn float_attr(
        &mut self,
        a: &mut CallArgs,
        name: &str,
        default: Option<f64>,
    ) -> Option<f64> {
        let Some(e) = a.get(name, None) else {
            if default.is_none() {
                let d = a.missing(name, &format!("{}(x, {name}=1e-6)", a.op));
                self.error(d);
            }
            return default;
        };
        match self.expr(e) {
            Val::Float(x) if x.is_finite() => Some(x),
            Val::Dim(d) if d.as_const().is_some() => d.as_const().map(|c| c as f64),
            Val::Error => None,
            _ => {
                self.error(
                    Diagnostic::error(e.span, format!("bad value for `{name}`"))
                        .with_label("expected a number"),
                );
                None
            }
        }
    }

    /// A positive number given as `name=` (`None` after reporting why not;
    /// `Some(None)` when absent).
    pub(super) fn positive_float(&mut self, a: &mut CallArgs, name: &str) -> Option<Option<f64>> {
        let Some(e) = a.get(name, None) else {
            return Some(None);
        };
        match self.expr(e) {
            Val::Float(x) if x.is_finite() && x > 0.0 => Some(Some(x)),
            Val::Dim(d) if d.as_const().is_some_and(|c| c > 0) => {
                Some(d.as_const().map(|c| c as f64))
            }
            Val::Error => None,
            _ => {
                self.error(
                    Diagnostic::error(e.span, format!("bad value for `{name}`"))
                        .with_label("expected a positive number"),
                );
                None
            }
        }
    }

    pub(super) fn positive_attr(&mut self, e: &Expr, name: &str) -> Option<i64> {
        let v = self.const_int(e, name)?;
        if v < 1 {
            self.error(
                Diagnostic::error(e.span, format!("bad value for `{name}`: {v}"))
                    .with_label("expected a positive integer"),
            );
            return None;
        }
        Some(v)
    }

    pub(super) fn default_eps(&self) -> f64 {
        self.file_floats
            .get("eps")
            .or(self.config.floats.get("eps"))
            .copied()
            .unwrap_or(1e-6)
    }

    fn op(&mut self, name: &str, a: &mut CallArgs, span: Span) -> Option<ValueId> {
        match name {
            "linear" => {
                let x = self.tensor_arg(a, "x", Some(0), true, "linear(x, d)")?;
                let Some(oe) = a.get("out", Some(1)) else {
                    let d = a.missing("out", "linear(x, d)");
                    self.error(d);
                    return None;
                };
                let out = self.dim(oe)?;
                if out.symbols().any(|s| s != "l") || out.as_const().is_some_and(|c| c < 1) {
                    self.error(
                        Diagnostic::error(oe.span, format!("bad output size `{out}`"))
                            .with_label("expected a positive fixed size"),
                    );
                    return None;
                }
                let bias = a.flag("bias", &mut self.diags);
                self.require_rank(x, 1, "linear", span)?;
                self.fixed_last(x, "linear", span)?;
                let mut ty = self.ty(x).clone();
                *ty.dims.last_mut()? = out.clone();
                Some(self.push(Op::Linear { out, bias }, vec![x], ty, span))
            }
            "rms_norm" | "group_rms_norm" => {
                let x = self.tensor_arg(a, "x", Some(0), true, &format!("{name}(x)"))?;
                let eps = self.float_attr(a, "eps", Some(self.default_eps()))?;
                let grouped = name == "group_rms_norm";
                let weight = if !grouped && a.flag("unit_offset", &mut self.diags) {
                    NormWeight::UnitOffset
                } else {
                    NormWeight::Plain
                };
                self.require_rank(x, if grouped { 2 } else { 1 }, name, span)?;
                self.fixed_last(x, name, span)?;
                let ty = self.ty(x).clone();
                let op = if grouped {
                    Op::GroupRmsNorm { eps: F64::new(eps) }
                } else {
                    Op::RmsNorm {
                        eps: F64::new(eps),
                        weight,
                    }
                };
                if grouped && ty.dims[ty.rank() - 2].symbols().any(|s| s != "l") {
                    self.error(
                        Diagnostic::error(
                            span,
                            "`group_rms_norm` needs a fixed group count (dim −2)",
                        )
                        .with_label("groups depend on the token count"),
                    );
                    return None;
                }
                Some(self.push(op, vec![x], ty, span))
            }
            "rope" => {
                let x = self.tensor_arg(a, "x", Some(0), true, "rope(x, theta=10000.0)")?;
                let default = self.config.floats.get("theta").copied();
                let theta = self.float_attr(a, "theta", default)?;
                let ty = self.ty(x).clone();
                if ty.rank() != 3 || ty.dims[2].as_const().is_none_or(|hd| hd % 2 != 0) {
                    self.error(
                        Diagnostic::error(span, format!("shape mismatch: `rope` expects [t, heads, head_dim] with an even head_dim, found {}", fmt_shape(&ty.dims)))
                            .with_label("reshape to [t, heads, head_dim] first"),
                    );
                    return None;
                }
                Some(self.push(
                    Op::Rope {
                        theta: F64::new(theta),
                    },
                    vec![x],
                    ty,
                    span,
                ))
            }
            "attention" => self.attention(a, span),
            "swiglu" | "geglu" => {
                let example = format!("{name}(x, f)");
                let x = self.tensor_arg(a, "x", Some(0), true, &example)?;
                let Some(he) = a.get("hidden", Some(1)) else {
                    let d = a.missing("hidden", &example);
                    self.error(d);
                    return None;
                };
                let hidden = Dim::constant(self.positive_attr(he, "hidden")?);
                self.require_rank(x, 1, name, span)?;
                self.fixed_last(x, name, span)?;
                let ty = self.ty(x).clone();
                let act = if name == "geglu" {
                    GateAct::GeluTanh
                } else {
                    GateAct::Silu
                };
                Some(self.push(Op::SwiGlu { hidden, act }, vec![x], ty, span))
            }
            "embedding" => {
                let ids = self.tensor_arg(a, "ids", Some(0), false, "embedding(ids, v, d)")?;
                let (Some(ve), Some(de)) = (a.get("vocab", Some(1)), a.get("dim", Some(2))) else {
                    let d = a.missing("vocab` and `dim", "embedding(ids, v, d)");
                    self.error(d);
                    return None;
                };
                let (vocab, dim) = (
                    Dim::constant(self.positive_attr(ve, "vocab")?),
                    Dim::constant(self.positive_attr(de, "dim")?),
                );
                // `scale=`: every row multiplied (Gemma's √d).
                let scale = self.positive_float(a, "scale")?.map(F64::new);
                let mut dims = self.ty(ids).dims.clone();
                dims.push(dim.clone());
                Some(self.push(
                    Op::Embedding { vocab, dim, scale },
                    vec![ids],
                    TensorType::new(dims, DType::Float),
                    span,
                ))
            }
            "target.embed" => {
                let ids = self.tensor_arg(a, "ids", Some(0), false, "target.embed(ids)")?;
                let d = self.config_dim("d", span)?;
                let mut dims = self.ty(ids).dims.clone();
                dims.push(d);
                Some(self.push(
                    Op::TargetEmbed,
                    vec![ids],
                    TensorType::new(dims, DType::Float),
                    span,
                ))
            }
            "target.lm_head" | "target.norm" => {
                let x = self.tensor_arg(a, "x", Some(0), true, &format!("{name}(x)"))?;
                let d = self.config_dim("d", span)?;
                let ty = self.ty(x).clone();
                if ty.last() != Some(&d) {
                    self.error(
                        Diagnostic::error(
                            span,
                            format!(
                                "shape mismatch: `{name}` expects [..., {d}], found {}",
                                fmt_shape(&ty.dims)
                            ),
                        )
                        .with_label(format!("the last dim must be the target's d = {d}")),
                    );
                    return None;
                }
                if name == "target.norm" {
                    return Some(self.push(Op::TargetNorm, vec![x], ty, span));
                }
                let v = self.config_dim("v", span)?;
                // A reduced draft vocabulary predicts over its own rows.
                let v = match self.graph.meta.reduced_vocab(v.as_const()?) {
                    Some(n) => Dim::constant(n),
                    None => v,
                };
                let mut out = ty;
                *out.dims.last_mut()? = v;
                Some(self.push(Op::TargetLmHead, vec![x], out, span))
            }
            "reshape" => {
                let x = self.tensor_arg(a, "x", Some(0), true, "reshape(x, [t, 4*d])")?;
                let Some(se) = a.get("shape", Some(1)) else {
                    let d = a.missing("shape", "reshape(x, [t, 4*d])");
                    self.error(d);
                    return None;
                };
                let ExprKind::List(items) = &se.kind else {
                    self.error(
                        Diagnostic::error(se.span, "bad value for `shape`")
                            .with_label("expected a list such as `[t, 4*d]`"),
                    );
                    return None;
                };
                let shape = self.dims(items)?;
                let ty = self.ty(x).clone();
                let (from, to) = (
                    ty.numel()?,
                    TensorType::new(shape.clone(), ty.dtype).numel()?,
                );
                if from != to {
                    self.error(
                        Diagnostic::error(se.span, format!("shape mismatch: cannot reshape {} ({from} elements) to {} ({to} elements)", fmt_shape(&ty.dims), fmt_shape(&shape)))
                            .with_label("element counts differ"),
                    );
                    return None;
                }
                Some(self.push(
                    Op::Reshape {
                        shape: shape.clone(),
                    },
                    vec![x],
                    TensorType::new(shape, ty.dtype),
                    span,
                ))
            }
            "concat" | "stack" => self.concat_or_stack(name, a, span),
            "split" => {
                let e = a.get("index", None);
                let Some(e) = e else {
                    self.error(
                        Diagnostic::error(span, "`split` returns several values").with_label(
                            "bind them with `a, b = split(x, 2)` or pick one with `index=`",
                        ),
                    );
                    return None;
                };
                let index = self.const_int(e, "`index`")?;
                let parts = self.split_core(a, span)?;
                let (x, axis, n, part_ty) = parts;
                if index < 0 || index >= n as i64 {
                    self.error(
                        Diagnostic::error(e.span, format!("bad value for `index`: {index}"))
                            .with_label(format!("expected 0..{n}")),
                    );
                    return None;
                }
                Some(self.push(
                    Op::Split {
                        axis,
                        parts: n,
                        index: index as usize,
                    },
                    vec![x],
                    part_ty,
                    span,
                ))
            }
            "add" | "mul" => {
                let x = self.tensor_arg(a, "a", Some(0), true, &format!("{name}(a, b)"))?;
                let y = self.tensor_arg(a, "b", Some(1), true, &format!("{name}(a, b)"))?;
                let op = if name == "add" {
                    crate::ast::BinOp::Add
                } else {
                    crate::ast::BinOp::Mul
                };
                self.binary_tensor(op, x, y, span)
            }
            "silu" => {
                let x = self.tensor_arg(a, "x", Some(0), true, "silu(x)")?;
                let ty = self.ty(x).clone();
                Some(self.push(Op::Silu, vec![x], ty, span))
            }
            "prev" => {
                let Some(stream) = a.get("stream", Some(0)) else {
                    let d = a.missing("stream", "prev(states)");
                    self.error(d);
                    return None;
                };
                let id = self.memory_prev(stream, span)?;
                // An input of the graph, as `input g = prev(…)` declares it.
                self.graph.inputs.push(id);
                Some(id)
            }
            "layer_sum" => {
                let x = self.tensor_arg(a, "x", Some(0), true, "layer_sum(x)")?;
                self.require_rank(x, 2, "layer_sum", span)?;
                let mut dims = self.ty(x).dims.clone();
                let k = dims.remove(dims.len() - 2);
                if k.as_const().is_none() {
                    self.error(
                        Diagnostic::error(
                            span,
                            format!("`layer_sum` needs a fixed layer count (dim −2), found `{k}`"),
                        )
                        .with_label("symbolic layer count"),
                    );
                    return None;
                }
                let dtype = self.ty(x).dtype;
                Some(self.push(Op::LayerSum, vec![x], TensorType::new(dims, dtype), span))
            }
            _ => None,
        }
    }

    /// Shared part of `split`: (input, axis, parts, type of one part).
    fn split_core(
        &mut self,
        a: &mut CallArgs,
        span: Span,
    ) -> Option<(ValueId, usize, usize, TensorType)> {
        let x = self.tensor_arg(a, "x", Some(0), true, "split(x, 2)")?;
        let Some(pe) = a.get("parts", Some(1)) else {
            let d = a.missing("parts", "split(x, 2)");
            self.error(d);
            return None;
        };
        let parts = self.positive_attr(pe, "parts")?;
        let ty = self.ty(x).clone();
        let axis = self.axis_attr(a, ty.rank(), ty.rank().saturating_sub(1))?;
        let Some(size) = ty.dims[axis].checked_div_exact(parts) else {
            self.error(
                Diagnostic::error(
                    span,
                    format!("cannot split `{}` into {parts} equal parts", ty.dims[axis]),
                )
                .with_label("not divisible"),
            );
            return None;
        };
        let mut part = ty;
        part.dims[axis] = size;
        Some((x, axis, parts as usize, part))
    }

    pub(crate) fn split_parts(
        &mut self,
        e: &Expr,
        args: &[Arg],
        count: Option<usize>,
    ) -> Option<Vec<ValueId>> {
        let mut a = CallArgs::new("split", e.span, args, &["x", "parts", "axis"]);
        let core = self.split_core(&mut a, e.span);
        a.finish(&mut self.diags);
        let (x, axis, parts, ty) = core?;
        if let Some(c) = count {
            if c != parts {
                self.error(
                    Diagnostic::error(
                        e.span,
                        format!("`split` makes {parts} parts but {c} names are bound"),
                    )
                    .with_label("counts differ"),
                );
                return None;
            }
        }
        Some(
            (0..parts)
                .map(|i| {
                    self.push(
                        Op::Split {
                            axis,
                            parts,
                            index: i,
                        },
                        vec![x],
                        ty.clone(),
                        e.span,
                    )
                })
                .collect(),
        )
    }

    /// `axis=` (negative counts from the end) within `rank`, or `default`.
    fn axis_attr(&mut self, a: &mut CallArgs, rank: usize, default: usize) -> Option<usize> {
        let Some(e) = a.get("axis", None) else {
            return Some(default);
        };
        let v = self.const_int(e, "an axis")?;
        let r = rank as i64;
        let idx = if v < 0 { v + r } else { v };
        if !(0..r).contains(&idx) {
            self.error(
                Diagnostic::error(e.span, format!("bad value for `axis`: {v}"))
                    .with_label(format!("expected -{r}..{r}")),
            );
            return None;
        }
        Some(idx as usize)
    }

    fn concat_or_stack(&mut self, name: &str, a: &mut CallArgs, span: Span) -> Option<ValueId> {
        let exprs = a.rest(0);
        if exprs.len() < 2 {
            self.error(
                Diagnostic::error(
                    span,
                    format!("wrong number of arguments: `{name}` needs at least two tensors"),
                )
                .with_label("too few inputs"),
            );
            return None;
        }
        let mut ids = Vec::new();
        for e in &exprs {
            ids.push(self.tensor_of(e, true)?);
        }
        let first = self.ty(ids[0]).clone();
        let stack = name == "stack";
        let rank = first.rank() + stack as usize;
        let axis = self.axis_attr(
            a,
            rank,
            if stack {
                rank.saturating_sub(2)
            } else {
                rank - 1
            },
        )?;
        let mut total = Dim::constant(0);
        for (id, e) in ids.iter().zip(&exprs) {
            let t = self.ty(*id).clone();
            let same = t.rank() == first.rank()
                && t.dtype == first.dtype
                && t.dims
                    .iter()
                    .zip(&first.dims)
                    .enumerate()
                    .all(|(i, (x, y))| (!stack && i == axis) || x == y);
            if !same {
                self.error(
                    Diagnostic::error(
                        e.span,
                        format!(
                            "shape mismatch: expected {} like the first input, found {}",
                            fmt_shape(&first.dims),
                            fmt_shape(&t.dims)
                        ),
                    )
                    .with_label(if stack {
                        "stacked tensors must have equal shapes"
                    } else {
                        "only the concat axis may differ"
                    }),
                );
                return None;
            }
            if !stack {
                total = total.checked_add(&t.dims[axis])?;
            }
        }
        let mut dims = first.dims.clone();
        if stack {
            dims.insert(axis, Dim::constant(ids.len() as i64));
            Some(self.push(
                Op::Stack { axis },
                ids,
                TensorType::new(dims, first.dtype),
                span,
            ))
        } else {
            dims[axis] = total;
            Some(self.push(
                Op::Concat { axis },
                ids,
                TensorType::new(dims, first.dtype),
                span,
            ))
        }
    }
}
