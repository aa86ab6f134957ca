//! Memory streams: their declarations (`memory NAME = …`, plain, normed
//! or fused from several taps), `append`, and `prev(STREAM)` reads.

use crate::ast::{Arg, Expr, ExprKind, Ident, WeightPath};
use crate::diagnostic::Diagnostic;
use crate::dim::{fmt_shape, Dim};
use crate::graph::{Fuse, MemoryDecl, ValueId};
use crate::op::{InputSource, Op, StateName};
use crate::span::Span;
use crate::types::{DType, TensorType};

use super::expr::is_target;
use super::{Lowerer, Val};
use crate::ast::ItemKind;

impl Lowerer<'_> {
    /// `prev(STREAM)`: every query row's predecessor row of a memory
    /// stream, an input the runtime supplies (`InputSource::MemoryPrev`).
    pub(crate) fn memory_prev(&mut self, stream: &Expr, span: Span) -> Option<ValueId> {
        if self.graph.kind != ItemKind::Drafter {
            self.error(
                Diagnostic::error(span, "`prev` is only valid in drafter files")
                    .with_label("it reads a memory stream"),
            );
            return None;
        }
        let state = self.state_ref(stream, "prev")?;
        let width = self.memory_width(&state, stream.span, " before `prev`")?;
        Some(self.push(
            Op::Input(InputSource::MemoryPrev(state)),
            vec![],
            TensorType::new(vec![Dim::symbol("t"), width], DType::Float),
            span,
        ))
    }

    /// The row width of memory `state`, or an error at `span` (none when
    /// its declaration already failed); `when` ends the hint.
    fn memory_width(&mut self, state: &StateName, span: Span, when: &str) -> Option<Dim> {
        let width = self
            .graph
            .memories
            .iter()
            .find(|m| &m.name == state)
            .map(|m| m.width.clone());
        if width.is_none() && !self.poisoned.contains(&memory_key(state)) {
            self.error(
                Diagnostic::error(span, format!("undefined memory `{state}`")).with_label(format!(
                    "declare it with `memory NAME = target.hidden[…]`{when}"
                )),
            );
        }
        width
    }

    fn state_name(&mut self, name: &Ident, index: Option<&Expr>) -> Option<StateName> {
        let index = match index {
            Some(e) => vec![self.const_int(e, "a state index")?],
            None => Vec::new(),
        };
        Some(StateName {
            name: name.name.clone(),
            index,
        })
    }

    pub(crate) fn memory(&mut self, name: &Ident, index: Option<&Expr>, init: &Expr, span: Span) {
        if self.graph.kind != ItemKind::Drafter {
            self.error(
                Diagnostic::error(span, "`memory` is only valid in drafter files")
                    .with_label("memory streams are seeded from the target"),
            );
            return;
        }
        let Some(state) = self.state_name(name, index) else {
            return;
        };
        // Until it is declared, uses of a stream whose declaration failed
        // report nothing more.
        self.poisoned.insert(memory_key(&state));
        // `linear(concat(target.hidden[a], …), W) @p`: several taps fused.
        if let ExprKind::Call {
            callee,
            args,
            weights,
        } = &init.kind
        {
            if matches!(&callee.kind, ExprKind::Name(n) if n == "linear") {
                if let Some(decl) =
                    self.fused_seed(state.clone(), args, weights.as_ref(), init.span)
                {
                    self.declare_memory(name, decl);
                }
                return;
            }
        }
        // `target.norm(target.hidden[i])`: the seed through the final norm.
        let (init, normed) = match &init.kind {
            ExprKind::Call {
                callee,
                args,
                weights: None,
            } if matches!(&callee.kind, ExprKind::Field(b, f) if is_target(b) && f.name == "norm")
                && args.len() == 1
                && args[0].name.is_none() =>
            {
                (&args[0].value, true)
            }
            _ => (init, false),
        };
        let seed = match &init.kind {
            ExprKind::Index { base, indices }
                if matches!(&base.kind, ExprKind::Field(b, f) if is_target(b) && f.name == "hidden")
                    && indices.len() == 1 =>
            {
                match self.tap_indices(indices, init.span) {
                    Some(t) if t.len() == 1 => t[0],
                    Some(_) => {
                        self.error(
                            Diagnostic::error(
                                init.span,
                                "a memory stream is seeded by one hidden state",
                            )
                            .with_label("expected one index"),
                        );
                        return;
                    }
                    None => return,
                }
            }
            _ => {
                self.error(
                    Diagnostic::error(
                        init.span,
                        "expected `target.hidden[INDEX]` or `target.norm(target.hidden[INDEX])`",
                    )
                    .with_label("memory streams start from a target hidden state"),
                );
                return;
            }
        };
        let Some(width) = self.config_dim("d", span) else {
            return;
        };
        self.declare_memory(
            name,
            MemoryDecl {
                name: state,
                width,
                seed,
                normed,
                fuse: None,
            },
        );
    }

    fn declare_memory(&mut self, name: &Ident, decl: MemoryDecl) {
        self.poisoned.remove(&memory_key(&decl.name));
        if self.graph.memories.iter().any(|m| m.name == decl.name) {
            self.error(
                Diagnostic::error(
                    name.span,
                    format!("memory `{}` is declared twice", decl.name),
                )
                .with_label("already declared"),
            );
            return;
        }
        self.graph.memories.push(decl);
    }

    /// The seed `linear(concat(target.hidden[a], target.hidden[b], …), W) @p`
    /// (EAGLE-3's fusion of low, middle and high taps).
    fn fused_seed(
        &mut self,
        state: StateName,
        args: &[Arg],
        weights: Option<&WeightPath>,
        span: Span,
    ) -> Option<MemoryDecl> {
        let form = "linear(concat(target.hidden[a], target.hidden[b], …), d) @fc";
        let bad = |s: &mut Self, at: Span, label: &str| {
            s.error(
                Diagnostic::error(at, format!("a fused memory seed is `{form}`"))
                    .with_label(label.to_string()),
            );
            None
        };
        let Some(w) = weights else {
            return bad(self, span, "the fusion's weights need a name: add `@fc`");
        };
        if args.len() != 2 || args.iter().any(|a| a.name.is_some()) {
            return bad(
                self,
                span,
                "expected the taps and the width, no other arguments",
            );
        }
        let ExprKind::Call {
            callee,
            args: parts,
            weights: None,
        } = &args[0].value.kind
        else {
            return bad(
                self,
                args[0].value.span,
                "expected `concat(…)` of target taps",
            );
        };
        if !matches!(&callee.kind, ExprKind::Name(n) if n == "concat") || parts.len() < 2 {
            return bad(
                self,
                args[0].value.span,
                "expected `concat(…)` of two or more target taps",
            );
        }
        let mut taps = Vec::new();
        for p in parts {
            match &p.value.kind {
                ExprKind::Index { base, indices }
                    if p.name.is_none()
                        && matches!(&base.kind, ExprKind::Field(b, f) if is_target(b) && f.name == "hidden")
                        && indices.len() == 1 =>
                {
                    match self.tap_indices(indices, p.value.span)?.as_slice() {
                        [t] => taps.push(*t),
                        _ => return bad(self, p.value.span, "one hidden state per tap"),
                    }
                }
                _ => return bad(self, p.value.span, "expected `target.hidden[INDEX]`"),
            }
        }
        let width = self.positive_attr(&args[1].value, "width")?;
        let prefix = self.weight_prefix(w)?;
        let tap_width = self.config_dim("d", span)?;
        Some(MemoryDecl {
            name: state,
            width: Dim::constant(width),
            seed: taps[0],
            normed: false,
            fuse: Some(Fuse {
                taps,
                prefix,
                tap_width,
            }),
        })
    }

    pub(crate) fn append(&mut self, name: &Ident, index: Option<&Expr>, value: &Expr) {
        let Some(state) = self.state_name(name, index) else {
            return;
        };
        let Some(width) = self.memory_width(&state, name.span, "") else {
            return;
        };
        let v = self.expr(value);
        let Val::Tensor(id) = self.expect_tensor(v, value.span) else {
            return;
        };
        let want = vec![Dim::symbol("t"), width];
        if self.ty(id).dims != want {
            let found = fmt_shape(&self.ty(id).dims);
            self.error(
                Diagnostic::error(
                    value.span,
                    format!(
                        "shape mismatch: expected {}, found {found}",
                        fmt_shape(&want)
                    ),
                )
                .with_label("rows appended to the memory"),
            );
            return;
        }
        if self.graph.appends.iter().any(|(s, _)| s == &state) {
            self.error(
                Diagnostic::error(name.span, format!("memory `{state}` is appended twice"))
                    .with_label("one append per step"),
            );
            return;
        }
        self.graph.appends.push((state, id));
    }
}

/// The key of a memory stream in `Lowerer::poisoned` (binding names never
/// contain a `:`).
pub(crate) fn memory_key(state: &StateName) -> String {
    format!("memory:{state}")
}
