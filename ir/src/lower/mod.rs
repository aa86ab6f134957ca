//! Lowering: `ast::File` to a typed `Graph`. Resolves names, unrolls
//! `repeat`, expands weight-name templates, infers and checks every shape.
//! Errors are collected; a failed sub-expression becomes `Val::Error` so one
//! mistake does not cascade into many.

mod args;
mod attention;
mod expr;
mod memory;
mod ops;
mod settings;

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::ast::{File, ItemKind, Stmt, StmtKind};
use crate::config::TargetConfig;
use crate::diagnostic::Diagnostic;
use crate::dim::{fmt_shape, Dim};
use crate::graph::{Graph, Meta, Node, Spans, ValueId};
use crate::op::Op;
use crate::span::Span;
use crate::types::TensorType;

pub use ops::param_shapes;

/// Loops longer than this are almost certainly mistakes (and would unroll forever).
const MAX_REPEAT: i64 = 4096;
/// Upper bound on nodes in one graph, so hostile input cannot exhaust memory.
const MAX_NODES: usize = 200_000;

/// The value of a lowered expression.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    Tensor(ValueId),
    Dim(Dim),
    Float(f64),
    /// Already reported.
    Error,
}

#[derive(Clone, Debug)]
struct Binding {
    value: ValueId,
    span: Span,
}

/// Loads other description files by item name (`llama`, `smollm2-135m`).
pub trait Resolver {
    /// Returns (display path, source text) of the file defining `name`.
    fn resolve(&self, name: &str) -> Option<(String, String)>;
}

/// A resolver that finds nothing (files that reference no other file).
pub struct NoFiles;

impl Resolver for NoFiles {
    fn resolve(&self, _: &str) -> Option<(String, String)> {
        None
    }
}

pub(crate) struct Lowerer<'a> {
    pub(crate) config: &'a TargetConfig,
    pub(crate) graph: Graph,
    pub(crate) diags: Vec<Diagnostic>,
    scopes: Vec<HashMap<String, Binding>>,
    /// Loop variables in scope, innermost last.
    pub(crate) loops: Vec<(String, i64)>,
    /// Integer settings of this file (`l`, `w`, …).
    pub(crate) file_ints: BTreeMap<String, i64>,
    pub(crate) file_floats: BTreeMap<String, f64>,
    /// Weight tensors bound so far: name → (shape, where).
    pub(crate) bound_weights: HashMap<String, (Vec<Dim>, Span)>,
    used_names: HashSet<String>,
    /// Names whose definition failed: later uses stay silent (no cascades).
    poisoned: HashSet<String>,
    /// Top-level names defined anywhere in the file: for "used before defined" and cycles.
    later: HashMap<String, (Span, Vec<String>)>,
    /// Index of the statement being lowered (for cycle reports).
    current_binding: Option<String>,
    pub(crate) overrides: Overrides,
    too_big: bool,
    /// False when the parser reported errors: then a missing output is
    /// probably a consequence, not worth its own diagnostic.
    syntax_ok: bool,
    /// Where `prev_start` is set (it needs a `prev` read).
    pub(crate) prev_start_at: Option<Span>,
}

impl Lowerer<'_> {
    /// The value of the target preset's flag `flag` (`tied_embeddings`), or
    /// `None` after reporting that the preset has no such flag.
    pub(crate) fn flag(
        &mut self,
        flag: &crate::ast::Ident,
        index: Option<&crate::ast::Expr>,
    ) -> Option<bool> {
        // A per-layer flag's entries are the preset's `name[0]`, `name[1]`, ….
        let name = match index {
            None => flag.name.clone(),
            Some(i) => format!("{}[{}]", flag.name, self.const_int(i, "a layer index")?),
        };
        if let Some(&v) = self.config.flags.get(&name) {
            return Some(v);
        }
        let known: Vec<String> = self.config.flags.keys().cloned().collect();
        let mut d = Diagnostic::error(
            flag.span,
            format!(
                "`{name}` is not a flag of the target preset `{}`",
                self.config.name
            ),
        )
        .with_label("a choice reads a `true`/`false` setting of the preset");
        d = match expr::closest(&name, &known) {
            Some(c) => d.with_note(format!("did you mean `{c}`?")),
            None if known.is_empty() => d.with_note("the preset sets no flags"),
            None => d.with_note(format!("the preset's flags: {}", known.join(", "))),
        };
        self.error(d);
        None
    }

    /// `e` with its choices on preset flags (`a if flag else b`) made;
    /// `None` after reporting a flag the preset lacks.
    pub(crate) fn chosen<'e>(
        &mut self,
        mut e: &'e crate::ast::Expr,
    ) -> Option<&'e crate::ast::Expr> {
        while let crate::ast::ExprKind::Choose {
            then,
            flag,
            index,
            otherwise,
        } = &e.kind
        {
            e = if self.flag(flag, index.as_deref())? {
                then
            } else {
                otherwise
            };
        }
        Some(e)
    }
}

/// Changes applied while lowering a base model for self-speculation.
#[derive(Clone, Debug, Default)]
pub(crate) struct Overrides {
    /// Replace the mask of every cached attention.
    pub mask: Option<crate::op::Mask>,
    /// Attend over the target's caches instead of own ones.
    pub target_cache: bool,
}

/// Lower a parsed file against a target preset. Drafter and model files
/// produce a graph; preset files are read with `settings::read_preset`.
pub fn lower(
    file: &File,
    syntax_ok: bool,
    config: &TargetConfig,
    symbol_overrides: &BTreeMap<String, i64>,
    resolver: &dyn Resolver,
) -> Result<Graph, Vec<Diagnostic>> {
    let Some(header) = &file.header else {
        return Err(vec![missing_header(file)]);
    };
    if header.kind == ItemKind::Preset {
        return Err(vec![Diagnostic::error(
            header.span,
            "a preset describes no graph",
        )
        .with_label("this file only sets symbol values")
        .with_note("check a model or drafter against it with `--target`")]);
    }
    let mut lw = Lowerer::new(config, header.kind, &header.name.name);
    lw.syntax_ok = syntax_ok;
    settings::lower_settings(&mut lw, file, symbol_overrides);
    if lw.graph.meta.base.is_some() {
        return settings::lower_self_speculative(lw, file, symbol_overrides, resolver);
    }
    lw.collect_definitions(&file.stmts);
    for stmt in &file.stmts {
        lw.stmt(stmt);
        if lw.too_big {
            break;
        }
    }
    lw.finish(header.span)
}

fn missing_header(file: &File) -> Diagnostic {
    let span = file
        .stmts
        .first()
        .map(|s| s.span)
        .or(file.settings.first().map(|s| s.span))
        .unwrap_or_default();
    let empty = file.stmts.is_empty() && file.settings.is_empty();
    Diagnostic::error(
        span,
        if empty {
            "empty description file"
        } else {
            "missing file header"
        },
    )
    .with_label("expected `model NAME`, `drafter NAME` or `preset NAME` on the first line")
}

impl<'a> Lowerer<'a> {
    pub(crate) fn new(config: &'a TargetConfig, kind: ItemKind, name: &str) -> Lowerer<'a> {
        Lowerer {
            config,
            graph: Graph {
                kind,
                name: name.to_string(),
                meta: Meta::default(),
                nodes: Vec::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                emits: Vec::new(),
                memories: Vec::new(),
                appends: Vec::new(),
                symbol_values: BTreeMap::new(),
                spans: Spans::default(),
            },
            diags: Vec::new(),
            scopes: vec![HashMap::new()],
            loops: Vec::new(),
            file_ints: BTreeMap::new(),
            file_floats: BTreeMap::new(),
            bound_weights: HashMap::new(),
            used_names: HashSet::new(),
            poisoned: HashSet::new(),
            later: HashMap::new(),
            current_binding: None,
            overrides: Overrides::default(),
            too_big: false,
            syntax_ok: true,
            prev_start_at: None,
        }
    }

    pub(crate) fn error(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    pub(crate) fn finish(mut self, header: Span) -> Result<Graph, Vec<Diagnostic>> {
        if self.diags.is_empty() {
            if self.graph.outputs.is_empty() && self.syntax_ok {
                self.error(
                    Diagnostic::error(header, format!("`{}` has no output", self.graph.name))
                        .with_label("nothing is computed")
                        .with_note("add a line such as `output logits = target.lm_head(x)`"),
                );
            } else if let (Some(at), false) = (
                self.prev_start_at,
                self.graph.nodes.iter().any(|n| {
                    matches!(
                        n.op,
                        crate::op::Op::Input(crate::op::InputSource::MemoryPrev(_))
                    )
                }),
            ) {
                self.error(
                    Diagnostic::error(at, "`prev_start` without a `prev(…)` read")
                        .with_label("nothing reads a stream's previous row")
                        .with_note("it says what `prev(stream)` is at position 0"),
                );
            } else if let Err(msg) = crate::verify::verify(&self.graph) {
                self.error(Diagnostic::error(
                    header,
                    format!("internal error: graph failed verification: {msg}"),
                ));
            }
        }
        if self.diags.is_empty() {
            Ok(self.graph)
        } else {
            // Loop bodies are lowered once per iteration: report each mistake once.
            let mut seen = HashSet::new();
            self.diags
                .retain(|d| seen.insert((d.span, d.message.clone())));
            self.diags.sort_by_key(|d| d.span.start);
            Err(self.diags)
        }
    }

    /// Add a node; returns its id. `name` None generates `op_N`.
    pub(crate) fn push(
        &mut self,
        op: Op,
        inputs: Vec<ValueId>,
        ty: TensorType,
        span: Span,
    ) -> ValueId {
        if self.graph.nodes.len() >= MAX_NODES && !self.too_big {
            self.too_big = true;
            self.error(
                Diagnostic::error(
                    span,
                    format!("graph is too large (more than {MAX_NODES} nodes)"),
                )
                .with_label("stopped lowering here"),
            );
        }
        let id = ValueId(self.graph.nodes.len() as u32);
        let name = self.fresh_name(op.name().trim_start_matches("target."));
        self.graph.nodes.push(Node {
            name,
            op,
            inputs,
            ty,
            weights: None,
        });
        self.graph.spans.0.push(span);
        id
    }

    fn fresh_name(&mut self, base: &str) -> String {
        let mut k = self.graph.nodes.len();
        loop {
            let candidate = format!("{base}_{k}");
            if self.used_names.insert(candidate.clone()) {
                return candidate;
            }
            k += 1;
        }
    }

    /// Give a node the name of the binding that holds it (if still free).
    fn name_node(&mut self, id: ValueId, name: &str) {
        if self.graph.node(id).name == name {
            return;
        }
        let mut candidate = name.to_string();
        let mut k = 1;
        while self.used_names.contains(&candidate) {
            candidate = format!("{name}_{k}");
            k += 1;
        }
        let node = &mut self.graph.nodes[id.index()];
        self.used_names.remove(&node.name);
        self.used_names.insert(candidate.clone());
        node.name = candidate;
    }

    pub(crate) fn ty(&self, id: ValueId) -> &TensorType {
        &self.graph.node(id).ty
    }

    pub(crate) fn lookup(&self, name: &str) -> Option<ValueId> {
        self.scopes
            .iter()
            .rev()
            .find_map(|s| s.get(name))
            .map(|b| b.value)
    }

    /// Names a binding may not take: symbols, loop variables, `target`.
    fn reserved_reason(&self, name: &str) -> Option<String> {
        if self.loops.iter().any(|(v, _)| v == name) {
            return Some(format!("`{name}` is a loop variable"));
        }
        if self.file_ints.contains_key(name) || self.file_floats.contains_key(name) {
            return Some(format!("`{name}` is a setting of this file"));
        }
        if self.config.ints.contains_key(name) || self.config.floats.contains_key(name) {
            return Some(format!(
                "`{name}` is a symbol of the target preset `{}`",
                self.config.name
            ));
        }
        if name == "t" || name == "b" {
            return Some(format!(
                "`{name}` is the symbolic {} dimension",
                if name == "t" { "token" } else { "batch" }
            ));
        }
        None
    }

    fn bind(&mut self, name: &crate::ast::Ident, value: ValueId) {
        if let Some(reason) = self.reserved_reason(&name.name) {
            self.error(
                Diagnostic::error(name.span, format!("cannot bind `{}`: {reason}", name.name))
                    .with_label("pick another name"),
            );
            return;
        }
        if let Some(prev) = self.scopes.iter().rev().find_map(|s| s.get(&name.name)) {
            let prev_span = prev.span;
            self.error(
                Diagnostic::error(name.span, format!("`{}` is already defined", name.name))
                    .with_label("redefined here")
                    .with_secondary(prev_span, "first defined here")
                    .with_note(format!("each name is bound once; use `{} += …` for a residual update, or pick a new name", name.name)),
            );
            return;
        }
        // Aliases (`y = x`) keep the node's own name.
        if self.graph.node(value).name.starts_with(&format!(
            "{}_",
            self.graph
                .node(value)
                .op
                .name()
                .trim_start_matches("target.")
        )) {
            self.name_node(value, &name.name);
        }
        if let Some(scope) = self.scopes.last_mut() {
            scope.insert(
                name.name.clone(),
                Binding {
                    value,
                    span: name.span,
                },
            );
        }
    }

    /// Record top-level binding names with the names their values use, so a
    /// use before definition can be reported precisely (and cycles found).
    fn collect_definitions(&mut self, stmts: &[Stmt]) {
        for stmt in stmts {
            match &stmt.kind {
                StmtKind::Let { names, value, .. } => {
                    let mut used = Vec::new();
                    expr::free_names(value, &mut used);
                    for n in names {
                        self.later
                            .entry(n.name.clone())
                            .or_insert((n.span, used.clone()));
                    }
                }
                StmtKind::Repeat { body, .. } => self.collect_definitions(body),
                _ => {}
            }
        }
    }

    /// Diagnostic for a name that is not (yet) defined.
    pub(crate) fn undefined(&mut self, name: &str, span: Span) {
        if self.poisoned.contains(name) {
            return;
        }
        if let Some((def_span, _)) = self.later.get(name).cloned() {
            if let Some(cycle) = self
                .current_binding
                .clone()
                .and_then(|cur| self.find_cycle(name, &cur))
            {
                self.error(
                    Diagnostic::error(span, format!("cyclic definition: {}", cycle.join(" → ")))
                        .with_label(format!("`{name}` depends on this value"))
                        .with_secondary(def_span, format!("`{name}` is defined here"))
                        .with_note("a value cannot depend on itself; feedback across steps goes through `memory`/`append`"),
                );
            } else {
                self.error(
                    Diagnostic::error(span, format!("`{name}` is used before it is defined"))
                        .with_label("used here")
                        .with_secondary(def_span, "defined later here")
                        .with_note("statements run top to bottom; move the definition up"),
                );
            }
            return;
        }
        let mut candidates: Vec<String> =
            self.scopes.iter().flat_map(|s| s.keys().cloned()).collect();
        candidates.extend(self.config.ints.keys().cloned());
        candidates.extend(self.file_ints.keys().cloned());
        candidates.extend(self.loops.iter().map(|(v, _)| v.clone()));
        let mut d =
            Diagnostic::error(span, format!("undefined name `{name}`")).with_label("not defined");
        if let Some(s) = expr::closest(name, &candidates) {
            d = d.with_note(format!("did you mean `{s}`?"));
        }
        self.error(d);
    }

    /// Path `from → … → to` through later definitions, if `from` depends on `to`.
    fn find_cycle(&self, from: &str, to: &str) -> Option<Vec<String>> {
        let mut stack = vec![(from.to_string(), vec![to.to_string(), from.to_string()])];
        let mut seen = HashSet::new();
        while let Some((n, path)) = stack.pop() {
            if !seen.insert(n.clone()) {
                continue;
            }
            for dep in self.later.get(&n).map(|x| x.1.clone()).unwrap_or_default() {
                let mut p = path.clone();
                p.push(dep.clone());
                if dep == to {
                    return Some(p);
                }
                stack.push((dep, p));
            }
        }
        None
    }

    fn stmt(&mut self, stmt: &Stmt) {
        match &stmt.kind {
            StmtKind::Input { name, source, ty } => {
                self.current_binding = Some(name.name.clone());
                match self.input(name, source.as_ref(), ty.as_ref(), stmt.span) {
                    Some(id) => {
                        self.graph.inputs.push(id);
                        self.bind(name, id);
                    }
                    None => {
                        self.poisoned.insert(name.name.clone());
                    }
                }
            }
            StmtKind::Let {
                names,
                value,
                ty,
                output,
            } => {
                self.current_binding = names.first().map(|n| n.name.clone());
                if names.len() > 1 {
                    let ids = self.split_destructure(names.len(), value);
                    for (n, id) in names.iter().zip(ids) {
                        match id {
                            Some(id) => self.bind(n, id),
                            None => {
                                self.poisoned.insert(n.name.clone());
                            }
                        }
                    }
                    return;
                }
                let v = self.expr(value);
                let v = self.expect_tensor(v, value.span);
                if matches!(v, Val::Error) {
                    self.poisoned.extend(names.iter().map(|n| n.name.clone()));
                }
                if let Val::Tensor(id) = v {
                    if let Some(ann) = ty {
                        self.check_annotation(id, ann);
                    }
                    let Some(name) = names.first() else { return };
                    self.bind(name, id);
                    if *output {
                        if self.graph.outputs.contains(&id) {
                            self.error(
                                Diagnostic::error(name.span, "this value is already an output")
                                    .with_label("duplicate output"),
                            );
                        } else {
                            self.graph.outputs.push(id);
                        }
                    }
                }
            }
            StmtKind::AddAssign { name, value, ty } => {
                self.current_binding = Some(name.name.clone());
                let Some(old) = self.lookup(&name.name) else {
                    self.undefined(&name.name, name.span);
                    return;
                };
                let v = self.expr(value);
                if let Val::Tensor(rhs) = self.expect_tensor(v, value.span) {
                    if let Some(id) =
                        self.binary_tensor(crate::ast::BinOp::Add, old, rhs, stmt.span)
                    {
                        self.name_node(id, &name.name);
                        if let Some(ann) = ty {
                            self.check_annotation(id, ann);
                        }
                        for scope in self.scopes.iter_mut().rev() {
                            if let Some(b) = scope.get_mut(&name.name) {
                                b.value = id;
                                break;
                            }
                        }
                    }
                }
            }
            StmtKind::Emit {
                stream,
                index,
                value,
            } => self.emit(stream, index, value),
            StmtKind::Memory { name, index, init } => {
                self.memory(name, index.as_ref(), init, stmt.span)
            }
            StmtKind::Append { name, index, value } => self.append(name, index.as_ref(), value),
            StmtKind::Repeat {
                var,
                start,
                end,
                body,
                ..
            } => self.repeat(var, start, end, body, stmt.span),
        }
    }

    fn repeat(
        &mut self,
        var: &crate::ast::Ident,
        start: &crate::ast::Expr,
        end: &crate::ast::Expr,
        body: &[Stmt],
        span: Span,
    ) {
        if let Some(reason) = self.reserved_reason(&var.name).or_else(|| {
            self.lookup(&var.name)
                .map(|_| format!("`{}` is a value", var.name))
        }) {
            self.error(
                Diagnostic::error(
                    var.span,
                    format!("bad loop variable `{}`: {reason}", var.name),
                )
                .with_label("pick another name"),
            );
            return;
        }
        let (Some(a), Some(b)) = (
            self.const_int(start, "a loop bound"),
            self.const_int(end, "a loop bound"),
        ) else {
            return;
        };
        if b < a {
            self.error(
                Diagnostic::error(
                    start.span.to(end.span),
                    format!("bad repeat range {a}..{b}: the end is before the start"),
                )
                .with_label("expected start ≤ end"),
            );
            return;
        }
        if b - a > MAX_REPEAT {
            self.error(
                Diagnostic::error(
                    start.span.to(end.span),
                    format!("bad repeat range {a}..{b}: {} iterations", b - a),
                )
                .with_label(format!("at most {MAX_REPEAT} iterations")),
            );
            return;
        }
        let _ = span;
        for i in a..b {
            self.loops.push((var.name.clone(), i));
            self.scopes.push(HashMap::new());
            for s in body {
                self.stmt(s);
                if self.too_big {
                    break;
                }
            }
            self.scopes.pop();
            self.loops.pop();
            if self.too_big {
                return;
            }
        }
    }

    /// Compare a value's type with a `: [dims] dtype` annotation.
    pub(crate) fn check_annotation(&mut self, id: ValueId, ann: &crate::ast::TypeAnn) {
        let Some(dims) = self.dims(&ann.dims) else {
            return;
        };
        let found = self.ty(id).clone();
        if dims != found.dims {
            self.error(
                Diagnostic::error(
                    ann.span,
                    format!(
                        "shape mismatch: expected {}, found {}",
                        fmt_shape(&dims),
                        fmt_shape(&found.dims)
                    ),
                )
                .with_label(format!("the annotation says {}", fmt_shape(&dims)))
                .with_secondary(
                    self.graph.span(id),
                    format!("this value is {}", fmt_shape(&found.dims)),
                ),
            );
        }
        if let Some(dt) = &ann.dtype {
            match crate::types::DType::parse(&dt.name) {
                None => self.error(
                    Diagnostic::error(dt.span, format!("unknown dtype `{}`", dt.name)).with_label(
                        format!("expected one of {}", crate::types::DType::NAMES.join(", ")),
                    ),
                ),
                Some(want) if want != found.dtype => self.error(
                    Diagnostic::error(
                        dt.span,
                        format!("dtype mismatch: expected {want}, found {}", found.dtype),
                    )
                    .with_label("annotated dtype"),
                ),
                Some(_) => {}
            }
        }
    }

    pub(crate) fn dims(&mut self, exprs: &[crate::ast::Expr]) -> Option<Vec<Dim>> {
        let mut out = Vec::new();
        let mut ok = true;
        for e in exprs {
            match self.dim(e) {
                Some(d) => out.push(d),
                None => ok = false,
            }
        }
        ok.then_some(out)
    }
}

/// Read a parsed preset file.
pub fn settings_read_preset(file: &File) -> Result<TargetConfig, Vec<Diagnostic>> {
    settings::read_preset(file)
}
