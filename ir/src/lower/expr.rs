//! Expressions: names, dimension arithmetic, tensor `+`/`*`, target
//! references, and the statements that read target state (`input … =
//! target.hidden[…]`, `emit`, `memory`, `append`).

use crate::ast::{BinOp, Expr, ExprKind, Ident};
use crate::diagnostic::Diagnostic;
use crate::dim::{fmt_shape, Dim};
use crate::graph::ValueId;
use crate::op::{InputSource, Op};
use crate::span::Span;
use crate::types::{DType, TensorType};

use super::{Lowerer, Val};
use crate::ast::ItemKind;

/// Names an expression mentions (for definition-order analysis).
pub(super) fn free_names(e: &Expr, out: &mut Vec<String>) {
    match &e.kind {
        ExprKind::Name(n) => out.push(n.clone()),
        ExprKind::Int(_) | ExprKind::Float(_) => {}
        ExprKind::Neg(a) | ExprKind::Field(a, _) => free_names(a, out),
        ExprKind::Binary(_, a, b) | ExprKind::Range(a, b) => {
            free_names(a, out);
            free_names(b, out);
        }
        ExprKind::Call { args, .. } => args.iter().for_each(|a| free_names(&a.value, out)),
        ExprKind::Index { base, indices } => {
            free_names(base, out);
            indices.iter().for_each(|i| free_names(i, out));
        }
        ExprKind::List(items) => items.iter().for_each(|i| free_names(i, out)),
        ExprKind::Choose {
            then,
            index,
            otherwise,
            ..
        } => {
            free_names(then, out);
            if let Some(i) = index {
                free_names(i, out);
            }
            free_names(otherwise, out);
        }
    }
}

/// The candidate closest to `name` by edit distance, if close enough.
pub(super) fn closest(name: &str, candidates: &[String]) -> Option<String> {
    fn dist(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1];
            for (j, cb) in b.iter().enumerate() {
                cur.push(
                    (prev[j] + (ca != *cb) as usize)
                        .min(prev[j + 1] + 1)
                        .min(cur[j] + 1),
                );
            }
            prev = cur;
        }
        prev[b.len()]
    }
    candidates
        .iter()
        .map(|c| (dist(name, c), c))
        .filter(|(d, c)| *d <= (name.len().max(c.len()) / 3).max(1))
        .min()
        .map(|(_, c)| c.clone())
}

impl Lowerer<'_> {
    pub(crate) fn expr(&mut self, e: &Expr) -> Val {
        match &e.kind {
            ExprKind::Name(n) => self.name(n, e.span),
            ExprKind::Int(i) => Val::Dim(Dim::constant(*i)),
            ExprKind::Float(x) => Val::Float(*x),
            ExprKind::Neg(inner) => match self.expr(inner) {
                Val::Dim(d) => self.dim_result(d.checked_neg(), e.span),
                Val::Float(x) => Val::Float(-x),
                Val::Tensor(_) => {
                    self.error(
                        Diagnostic::error(e.span, "tensors cannot be negated")
                            .with_label("`-` applies to sizes and numbers"),
                    );
                    Val::Error
                }
                Val::Error => Val::Error,
            },
            ExprKind::Binary(op, a, b) => {
                let (va, vb) = (self.expr(a), self.expr(b));
                self.binary(*op, va, vb, a.span, b.span, e.span)
            }
            ExprKind::Call {
                callee,
                args,
                weights,
            } => self.call(e, callee, args, weights.as_ref()),
            ExprKind::Index { base, indices } => self.index(base, indices, e.span),
            ExprKind::Field(base, field) => {
                let what = if is_target(base) {
                    format!("`target.{}` must be called or indexed", field.name)
                } else {
                    "field access is only valid on `target`".to_string()
                };
                self.error(
                    Diagnostic::error(e.span, what)
                        .with_label("e.g. `target.lm_head(x)` or `target.hidden[n]`"),
                );
                Val::Error
            }
            ExprKind::List(_) => {
                self.error(
                    Diagnostic::error(e.span, "a list is only valid as a shape argument")
                        .with_label("e.g. `reshape(x, [t, 4*d])`"),
                );
                Val::Error
            }
            ExprKind::Range(..) => {
                self.error(
                    Diagnostic::error(e.span, "a range is only valid in `repeat` or an index list")
                        .with_label("unexpected range"),
                );
                Val::Error
            }
            // A choice on a flag: the chosen value (a named argument's,
            // e.g. `rope=local_theta if sliding[i] else theta`).
            ExprKind::Choose { .. } => match self.chosen(e) {
                Some(c) => self.expr(c),
                None => Val::Error,
            },
        }
    }

    fn name(&mut self, n: &str, span: Span) -> Val {
        if let Some(id) = self.lookup(n) {
            return Val::Tensor(id);
        }
        if let Some((_, v)) = self.loops.iter().rev().find(|(v, _)| v == n) {
            return Val::Dim(Dim::constant(*v));
        }
        if n == "l" && self.file_ints.contains_key("l") {
            return Val::Dim(Dim::symbol("l"));
        }
        if let Some(v) = self.file_ints.get(n) {
            return Val::Dim(Dim::constant(*v));
        }
        if let Some(v) = self.file_floats.get(n) {
            return Val::Float(*v);
        }
        if let Some(v) = self.config.ints.get(n) {
            return Val::Dim(Dim::constant(*v));
        }
        if let Some(v) = self.config.floats.get(n) {
            return Val::Float(*v);
        }
        if n == "t" || n == "b" {
            return Val::Dim(Dim::symbol(n));
        }
        if n == "target" {
            self.error(
                Diagnostic::error(span, "`target` must be followed by a field")
                    .with_label("e.g. `target.hidden[n]`"),
            );
            return Val::Error;
        }
        self.undefined(n, span);
        Val::Error
    }

    fn dim_result(&mut self, d: Option<Dim>, span: Span) -> Val {
        match d {
            Some(d) => Val::Dim(d),
            None => {
                self.error(
                    Diagnostic::error(span, "size arithmetic overflows")
                        .with_label("this size is too large"),
                );
                Val::Error
            }
        }
    }

    fn binary(&mut self, op: BinOp, a: Val, b: Val, sa: Span, sb: Span, span: Span) -> Val {
        match (a, b) {
            (Val::Error, _) | (_, Val::Error) => Val::Error,
            (Val::Dim(x), Val::Dim(y)) => match op {
                BinOp::Add => self.dim_result(x.checked_add(&y), span),
                BinOp::Sub => self.dim_result(x.checked_sub(&y), span),
                BinOp::Mul => self.dim_result(x.checked_mul(&y), span),
                BinOp::Div | BinOp::Rem => {
                    let Some(divisor) = y.as_const() else {
                        self.error(
                            Diagnostic::error(
                                sb,
                                format!("cannot divide by the symbolic size `{y}`"),
                            )
                            .with_label("expected a constant divisor"),
                        );
                        return Val::Error;
                    };
                    if divisor == 0 {
                        self.error(
                            Diagnostic::error(sb, "division by zero").with_label("this is 0"),
                        );
                        return Val::Error;
                    }
                    if op == BinOp::Rem {
                        return match x.as_const() {
                            Some(c) => Val::Dim(Dim::constant(c.rem_euclid(divisor))),
                            None => {
                                self.error(
                                    Diagnostic::error(sa, "`%` needs a constant size")
                                        .with_label("symbolic"),
                                );
                                Val::Error
                            }
                        };
                    }
                    match x.checked_div_exact(divisor) {
                        Some(d) => Val::Dim(d),
                        None => {
                            self.error(
                                Diagnostic::error(
                                    span,
                                    format!("`{x}` is not divisible by {divisor}"),
                                )
                                .with_label("sizes must divide exactly"),
                            );
                            Val::Error
                        }
                    }
                }
            },
            (Val::Float(x), Val::Float(y)) => Val::Float(match op {
                BinOp::Add => x + y,
                BinOp::Sub => x - y,
                BinOp::Mul => x * y,
                BinOp::Div => x / y,
                BinOp::Rem => x % y,
            }),
            (Val::Tensor(x), Val::Tensor(y)) => match self.binary_tensor(op, x, y, span) {
                Some(id) => Val::Tensor(id),
                None => Val::Error,
            },
            (a, _) => {
                let (kind_a, kind_b) = (val_kind(&a), "the other side");
                self.error(
                    Diagnostic::error(
                        span,
                        format!(
                            "`{}` between a {kind_a} and {kind_b} of another kind",
                            op.symbol()
                        ),
                    )
                    .with_label("both sides must be tensors, or both sizes"),
                );
                Val::Error
            }
        }
    }

    /// `a + b` / `a * b` on tensors with right-aligned broadcasting.
    pub(crate) fn binary_tensor(
        &mut self,
        op: BinOp,
        a: ValueId,
        b: ValueId,
        span: Span,
    ) -> Option<ValueId> {
        let op = match op {
            BinOp::Add => Op::Add,
            BinOp::Mul => Op::Mul,
            other => {
                self.error(
                    Diagnostic::error(
                        span,
                        format!("`{}` is not defined on tensors", other.symbol()),
                    )
                    .with_label("tensors support `+` (residual add) and `*` (elementwise product)"),
                );
                return None;
            }
        };
        let (ta, tb) = (self.ty(a).clone(), self.ty(b).clone());
        if !ta.dtype.is_float() || ta.dtype != tb.dtype {
            self.error(
                Diagnostic::error(
                    span,
                    format!(
                        "dtype mismatch: expected two equal float dtypes, found {} and {}",
                        ta.dtype, tb.dtype
                    ),
                )
                .with_label("operands differ"),
            );
            return None;
        }
        let Some(dims) = broadcast(&ta.dims, &tb.dims) else {
            self.error(
                Diagnostic::error(
                    span,
                    format!(
                        "shape mismatch: cannot broadcast {} with {}",
                        fmt_shape(&ta.dims),
                        fmt_shape(&tb.dims)
                    ),
                )
                .with_label("dims must be equal or 1, aligned from the right")
                .with_secondary(
                    self.graph.span(a),
                    format!("this is {}", fmt_shape(&ta.dims)),
                )
                .with_secondary(
                    self.graph.span(b),
                    format!("this is {}", fmt_shape(&tb.dims)),
                ),
            );
            return None;
        };
        Some(self.push(op, vec![a, b], TensorType::new(dims, ta.dtype), span))
    }

    pub(crate) fn expect_tensor(&mut self, v: Val, span: Span) -> Val {
        match v {
            Val::Tensor(_) | Val::Error => v,
            other => {
                self.error(
                    Diagnostic::error(
                        span,
                        format!("expected a tensor, found a {}", val_kind(&other)),
                    )
                    .with_label("this is not a tensor value"),
                );
                Val::Error
            }
        }
    }

    /// A dimension-valued expression.
    pub(crate) fn dim(&mut self, e: &Expr) -> Option<Dim> {
        match self.expr(e) {
            Val::Dim(d) => Some(d),
            Val::Error => None,
            other => {
                self.error(
                    Diagnostic::error(
                        e.span,
                        format!("expected a size, found a {}", val_kind(&other)),
                    )
                    .with_label("expected an integer size expression"),
                );
                None
            }
        }
    }

    /// A constant integer (loop bounds, indices, attribute values).
    pub(crate) fn const_int(&mut self, e: &Expr, what: &str) -> Option<i64> {
        let d = self.dim(e)?;
        let subst = d.substitute(&self.graph.symbol_values);
        match subst.as_ref().and_then(|d| d.as_const()) {
            Some(c) => Some(c),
            None => {
                self.error(
                    Diagnostic::error(
                        e.span,
                        format!("expected {what} known before running, found `{d}`"),
                    )
                    .with_label("depends on a runtime size"),
                );
                None
            }
        }
    }

    fn index(&mut self, base: &Expr, indices: &[Expr], span: Span) -> Val {
        if let ExprKind::Name(stream) = &base.kind {
            if self.graph.emits.iter().any(|(s, _, _)| s == stream) {
                return self.stream_values(stream, indices, span);
            }
        }
        match &base.kind {
            ExprKind::Field(b, field) if is_target(b) && field.name == "hidden" => {
                self.error(
                    Diagnostic::error(span, "`target.hidden[…]` is a graph input")
                        .with_label("bind it with `input NAME = target.hidden[…]`"),
                );
            }
            _ => {
                self.error(
                    Diagnostic::error(
                        span,
                        "indexing is only valid on `target.hidden` and state names",
                    )
                    .with_label("unexpected index"),
                );
            }
        }
        let _ = indices;
        Val::Error
    }

    /// `act[i]` is the value emitted as `act[i]`; `act[0..3]` or `act[0, 2]`
    /// stacks the emitted values along a new dim −2 (`[t, k, d]`).
    fn stream_values(&mut self, stream: &str, indices: &[Expr], span: Span) -> Val {
        let mut wanted = Vec::new();
        let mut ranged = false;
        for e in indices {
            match &e.kind {
                ExprKind::Range(a, b) => {
                    ranged = true;
                    let (Some(a), Some(b)) = (
                        self.const_int(a, "a stream index"),
                        self.const_int(b, "a stream index"),
                    ) else {
                        return Val::Error;
                    };
                    wanted.extend((a..b).map(|i| (i, e.span)));
                }
                _ => match self.const_int(e, "a stream index") {
                    Some(i) => wanted.push((i, e.span)),
                    None => return Val::Error,
                },
            }
        }
        let mut ids = Vec::new();
        for (i, s) in wanted {
            match self
                .graph
                .emits
                .iter()
                .find(|(n, j, _)| n == stream && *j == i)
            {
                Some((_, _, id)) => ids.push(*id),
                None => {
                    self.error(
                        Diagnostic::error(s, format!("`{stream}[{i}]` was never emitted"))
                            .with_label("no such element"),
                    );
                    return Val::Error;
                }
            }
        }
        if ids.len() == 1 && !ranged {
            return Val::Tensor(ids[0]);
        }
        if ids.is_empty() {
            self.error(
                Diagnostic::error(span, "no elements selected")
                    .with_label("the index list is empty"),
            );
            return Val::Error;
        }
        let first = self.ty(ids[0]).clone();
        for id in &ids {
            if self.ty(*id) != &first {
                let found = fmt_shape(&self.ty(*id).dims);
                self.error(
                    Diagnostic::error(
                        span,
                        format!(
                            "shape mismatch: stacked elements of `{stream}` differ: {} and {found}",
                            fmt_shape(&first.dims)
                        ),
                    )
                    .with_label("cannot stack"),
                );
                return Val::Error;
            }
        }
        let axis = first.rank().saturating_sub(1);
        let mut dims = first.dims.clone();
        dims.insert(axis, Dim::constant(ids.len() as i64));
        Val::Tensor(self.push(
            Op::Stack { axis },
            ids,
            TensorType::new(dims, first.dtype),
            span,
        ))
    }

    /// `input NAME = target.hidden[…] : TYPE` or `input NAME : TYPE`.
    pub(crate) fn input(
        &mut self,
        name: &Ident,
        source: Option<&Expr>,
        ty: Option<&crate::ast::TypeAnn>,
        span: Span,
    ) -> Option<ValueId> {
        let Some(src) = source else {
            let Some(ann) = ty else {
                self.error(
                    Diagnostic::error(name.span, format!("input `{}` needs a type", name.name))
                        .with_label("add a type, e.g. `input ids : [t] u32`"),
                );
                return None;
            };
            let dims = self.dims(&ann.dims)?;
            let dtype = match &ann.dtype {
                None => DType::Float,
                Some(d) => match DType::parse(&d.name) {
                    Some(dt) => dt,
                    None => {
                        self.error(
                            Diagnostic::error(d.span, format!("unknown dtype `{}`", d.name))
                                .with_label(format!("expected one of {}", DType::NAMES.join(", "))),
                        );
                        return None;
                    }
                },
            };
            return Some(self.push(
                Op::Input(InputSource::External),
                vec![],
                TensorType::new(dims, dtype),
                span,
            ));
        };
        if let ExprKind::Call {
            callee,
            args,
            weights: None,
        } = &src.kind
        {
            if matches!(&callee.kind, ExprKind::Name(n) if n == "prev")
                && args.len() == 1
                && args[0].name.is_none()
            {
                let id = self.memory_prev(&args[0].value, span)?;
                if let Some(ann) = ty {
                    self.check_annotation(id, ann);
                }
                return Some(id);
            }
        }
        let ExprKind::Index { base, indices } = &src.kind else {
            self.error(
                Diagnostic::error(
                    src.span,
                    "expected an input source such as `target.hidden[n]` or `prev(states)`",
                )
                .with_label("not an input source"),
            );
            return None;
        };
        let ok_base =
            matches!(&base.kind, ExprKind::Field(b, f) if is_target(b) && f.name == "hidden");
        if !ok_base {
            self.error(
                Diagnostic::error(base.span, "unknown input source")
                    .with_label("expected `target.hidden`"),
            );
            return None;
        }
        if self.graph.kind != ItemKind::Drafter {
            self.error(
                Diagnostic::error(
                    src.span,
                    "`target` references are only valid in drafter files",
                )
                .with_label("a model reads no target"),
            );
            return None;
        }
        let taps = self.tap_indices(indices, src.span)?;
        let stacked = indices.len() > 1
            || matches!(indices.first().map(|e| &e.kind), Some(ExprKind::Range(..)));
        let d = self.config_dim("d", src.span)?;
        let mut dims = vec![Dim::symbol("t")];
        if stacked {
            dims.push(Dim::constant(taps.len() as i64));
        }
        dims.push(d);
        let id = self.push(
            Op::Input(InputSource::TargetHidden {
                indices: taps,
                stacked,
            }),
            vec![],
            TensorType::new(dims, DType::Float),
            span,
        );
        if let Some(ann) = ty {
            self.check_annotation(id, ann);
        }
        Some(id)
    }

    /// Indices into the target's hidden states `0..=n`.
    pub(super) fn tap_indices(&mut self, indices: &[Expr], span: Span) -> Option<Vec<i64>> {
        let n = self.config_dim("n", span)?.as_const()?;
        let mut taps = Vec::new();
        for e in indices {
            let range = match &e.kind {
                ExprKind::Range(a, b) => {
                    let (a, b) = (
                        self.const_int(a, "a tap index")?,
                        self.const_int(b, "a tap index")?,
                    );
                    a..b
                }
                _ => {
                    let i = self.const_int(e, "a tap index")?;
                    i..i + 1
                }
            };
            for i in range {
                if !(0..=n).contains(&i) {
                    self.error(
                        Diagnostic::error(e.span, format!("tap index {i} is out of range"))
                            .with_label(format!("the target has hidden states 0..={n} (HS[0] is the embedding, HS[{n}] the last layer)")),
                    );
                    return None;
                }
                taps.push(i);
            }
        }
        if taps.is_empty() {
            self.error(
                Diagnostic::error(span, "no hidden states selected")
                    .with_label("the index list is empty"),
            );
            return None;
        }
        Some(taps)
    }

    /// A target symbol that must exist (`d`, `n`, `v`).
    pub(crate) fn config_dim(&mut self, name: &str, span: Span) -> Option<Dim> {
        match self.config.int(name) {
            Some(v) => Some(Dim::constant(v)),
            None => {
                self.error(
                    Diagnostic::error(
                        span,
                        format!(
                            "the target preset `{}` does not define `{name}`",
                            self.config.name
                        ),
                    )
                    .with_label(format!("needs the target's `{name}`"))
                    .with_note(format!(
                        "it defines: {}",
                        self.config.defined_names().join(", ")
                    )),
                );
                None
            }
        }
    }

    pub(crate) fn emit(&mut self, stream: &Ident, index: &Expr, value: &Expr) {
        let Some(i) = self.const_int(index, "an emit index") else {
            return;
        };
        let v = self.expr(value);
        let Val::Tensor(id) = self.expect_tensor(v, value.span) else {
            return;
        };
        if self
            .graph
            .emits
            .iter()
            .any(|(s, j, _)| s == &stream.name && *j == i)
        {
            self.error(
                Diagnostic::error(
                    index.span,
                    format!("`{}[{i}]` is emitted twice", stream.name),
                )
                .with_label("already emitted"),
            );
            return;
        }
        self.graph.emits.push((stream.name.clone(), i, id));
    }

    /// `a, b = split(x, 2, axis=…)`.
    pub(crate) fn split_destructure(&mut self, count: usize, value: &Expr) -> Vec<Option<ValueId>> {
        let none = vec![None; count];
        let ExprKind::Call {
            callee,
            args,
            weights,
        } = &value.kind
        else {
            self.error(
                Diagnostic::error(value.span, "only `split` returns several values")
                    .with_label("expected `split(…)`"),
            );
            return none;
        };
        if !matches!(&callee.kind, ExprKind::Name(n) if n == "split") {
            self.error(
                Diagnostic::error(value.span, "only `split` returns several values")
                    .with_label("expected `split(…)`"),
            );
            return none;
        }
        if let Some(w) = weights {
            self.error(
                Diagnostic::error(w.span, "`split` has no weights")
                    .with_label("remove this `@name`"),
            );
        }
        match self.split_parts(value, args, Some(count)) {
            Some(ids) => ids.into_iter().map(Some).collect(),
            None => none,
        }
    }
}

pub(super) fn is_target(e: &Expr) -> bool {
    matches!(&e.kind, ExprKind::Name(n) if n == "target")
}

pub(super) fn val_kind(v: &Val) -> &'static str {
    match v {
        Val::Tensor(_) => "tensor",
        Val::Dim(_) => "size",
        Val::Float(_) => "number",
        Val::Error => "invalid value",
    }
}

/// Right-aligned broadcast of two shapes (numpy rules, symbolic dims must match).
pub(crate) fn broadcast(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let n = a.len().max(b.len());
    let one = Dim::constant(1);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = if i + a.len() >= n {
            &a[i + a.len() - n]
        } else {
            &one
        };
        let db = if i + b.len() >= n {
            &b[i + b.len() - n]
        } else {
            &one
        };
        out.push(if da == db || *db == one {
            da.clone()
        } else if *da == one {
            db.clone()
        } else {
            return None;
        });
    }
    Some(out)
}
