//! Binding a call's positional and named arguments to an op's signature,
//! with "wrong arity" and "unknown argument" diagnostics.

use crate::ast::{Arg, Expr, ExprKind};
use crate::diagnostic::Diagnostic;
use crate::span::Span;

/// One call's arguments, consumed parameter by parameter.
pub(super) struct CallArgs<'e> {
    pub op: String,
    pub span: Span,
    positional: Vec<&'e Expr>,
    named: Vec<(&'e str, Span, &'e Expr)>,
    used_pos: Vec<bool>,
    used_named: Vec<bool>,
    /// Parameter names, in order, for error messages.
    signature: Vec<&'static str>,
}

impl<'e> CallArgs<'e> {
    pub fn new(op: &str, span: Span, args: &'e [Arg], signature: &[&'static str]) -> CallArgs<'e> {
        let mut positional = Vec::new();
        let mut named = Vec::new();
        for a in args {
            match &a.name {
                Some(n) => named.push((n.name.as_str(), n.span, &a.value)),
                None => positional.push(&a.value),
            }
        }
        CallArgs {
            op: op.to_string(),
            span,
            used_pos: vec![false; positional.len()],
            used_named: vec![false; named.len()],
            positional,
            named,
            signature: signature.to_vec(),
        }
    }

    /// Parameter `name` at position `pos` (if it may be positional).
    pub fn get(&mut self, name: &str, pos: Option<usize>) -> Option<&'e Expr> {
        if let Some(i) = self.named.iter().position(|(n, _, _)| *n == name) {
            self.used_named[i] = true;
            return Some(self.named[i].2);
        }
        let p = pos?;
        if p < self.positional.len() {
            self.used_pos[p] = true;
            return Some(self.positional[p]);
        }
        None
    }

    /// All positional arguments from `from` on (variadic ops).
    pub fn rest(&mut self, from: usize) -> Vec<&'e Expr> {
        let mut out = Vec::new();
        for i in from..self.positional.len() {
            self.used_pos[i] = true;
            out.push(self.positional[i]);
        }
        out
    }

    /// A `bias`-style flag: positional bare name or `name=true|false`.
    pub fn flag(&mut self, name: &str, diags: &mut Vec<Diagnostic>) -> bool {
        if let Some(i) = self.named.iter().position(|(n, _, _)| *n == name) {
            self.used_named[i] = true;
            return match &self.named[i].2.kind {
                ExprKind::Name(v) if v == "true" => true,
                ExprKind::Name(v) if v == "false" => false,
                _ => {
                    diags.push(
                        Diagnostic::error(self.named[i].2.span, format!("bad value for `{name}`"))
                            .with_label("expected `true` or `false`"),
                    );
                    false
                }
            };
        }
        for (i, e) in self.positional.iter().enumerate() {
            if matches!(&e.kind, ExprKind::Name(v) if v == name) {
                self.used_pos[i] = true;
                return true;
            }
        }
        false
    }

    pub fn missing(&self, name: &str, example: &str) -> Diagnostic {
        Diagnostic::error(
            self.span,
            format!("wrong number of arguments: `{}` needs `{name}`", self.op),
        )
        .with_label(format!("missing `{name}`"))
        .with_note(format!(
            "signature: {}({}); e.g. `{example}`",
            self.op,
            self.signature.join(", ")
        ))
    }

    /// Report arguments nothing consumed.
    pub fn finish(&self, diags: &mut Vec<Diagnostic>) {
        let extra: Vec<&&Expr> = self
            .positional
            .iter()
            .zip(&self.used_pos)
            .filter(|(_, u)| !**u)
            .map(|(e, _)| e)
            .collect();
        if let Some(first) = extra.first() {
            let span = extra.iter().fold(first.span, |s, e| s.to(e.span));
            let used = self.used_pos.iter().filter(|u| **u).count();
            diags.push(
                Diagnostic::error(span, format!("wrong number of arguments: `{}` takes {used} positional argument{}, found {}", self.op, if used == 1 { "" } else { "s" }, self.positional.len()))
                    .with_label("unexpected argument")
                    .with_note(format!("signature: {}({})", self.op, self.signature.join(", "))),
            );
        }
        for ((n, span, _), used) in self.named.iter().zip(&self.used_named) {
            if !used {
                diags.push(
                    Diagnostic::error(*span, format!("unknown argument `{n}` for `{}`", self.op))
                        .with_label("not a parameter of this op")
                        .with_note(format!(
                            "signature: {}({})",
                            self.op,
                            self.signature.join(", ")
                        )),
                );
            }
        }
    }
}
