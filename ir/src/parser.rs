//! The parser: tokens to `ast::File`. Recovers at line boundaries, so every
//! syntax error in a file is reported, not only the first.
//!
//! Grammar (see docs/language.md for the full reference):
//! ```text
//! file    := NL* header? line*
//! header  := ('model' | 'drafter' | 'preset') NAME
//! line    := setting | stmt
//! setting := IDENT expr
//! stmt    := 'input' IDENT ('=' expr)? type?
//!          | 'output'? IDENT (',' IDENT)* '=' expr type?
//!          | IDENT '+=' expr type?
//!          | 'emit' IDENT '[' expr ']' '=' expr
//!          | ('memory' | 'append') IDENT ('[' expr ']')? '=' expr
//!          | 'repeat' IDENT 'in' expr '..' expr '{' NL line* '}'
//! type    := ':' '[' expr,* ']' IDENT?
//! expr    := term (('+' | '-') term)*
//! term    := unary (('*' | '/' | '%') unary)*
//! unary   := '-' unary | postfix
//! postfix := primary ('.' IDENT | '(' args ')' '@path'? | '[' items ']')*
//! primary := IDENT | INT | FLOAT | '(' expr ')' | '[' expr,* ']'
//! ```

use crate::ast::*;
use crate::diagnostic::Diagnostic;
use crate::lexer::{lex, Token, TokenKind};
use crate::span::Span;

/// Parse a whole file. Always returns a (possibly partial) AST plus every
/// diagnostic found.
pub fn parse(src: &str) -> (File, Vec<Diagnostic>) {
    let (tokens, mut diags) = lex(src);
    let mut p = Parser {
        tokens,
        pos: 0,
        diags: Vec::new(),
        depth: 0,
    };
    let file = p.file();
    diags.append(&mut p.diags);
    diags.sort_by_key(|d| d.span.start);
    (file, diags)
}

/// Marker that a diagnostic was recorded and the line should be skipped.
struct Recover;

type PResult<T> = Result<T, Recover>;

const KEYWORDS: &[&str] = &[
    "input", "output", "emit", "memory", "append", "repeat", "in",
];

/// Deeper expression nesting is an error rather than a stack overflow.
const MAX_DEPTH: usize = 128;

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    diags: Vec<Diagnostic>,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> &TokenKind {
        &self.tokens[self.pos].kind
    }

    fn peek_at(&self, n: usize) -> &TokenKind {
        let i = (self.pos + n).min(self.tokens.len() - 1);
        &self.tokens[i].kind
    }

    fn span(&self) -> Span {
        self.tokens[self.pos].span
    }

    fn prev_span(&self) -> Span {
        self.tokens[self.pos.saturating_sub(1)].span
    }

    fn bump(&mut self) -> Token {
        let t = self.tokens[self.pos].clone();
        if self.pos + 1 < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn at(&self, kind: &TokenKind) -> bool {
        self.peek() == kind
    }

    fn eat(&mut self, kind: &TokenKind) -> bool {
        if self.at(kind) {
            self.bump();
            true
        } else {
            false
        }
    }

    fn error_here(&mut self, expected: &str) -> Recover {
        let found = self.peek().describe();
        let span = self.span();
        self.diags.push(
            Diagnostic::error(span, format!("expected {expected}, found {found}"))
                .with_label(format!("expected {expected}")),
        );
        Recover
    }

    fn expect(&mut self, kind: TokenKind, expected: &str) -> PResult<Span> {
        if self.at(&kind) {
            Ok(self.bump().span)
        } else {
            Err(self.error_here(expected))
        }
    }

    fn ident(&mut self, expected: &str) -> PResult<Ident> {
        match self.peek().clone() {
            TokenKind::Ident(name) => {
                let span = self.bump().span;
                Ok(Ident { name, span })
            }
            _ => Err(self.error_here(expected)),
        }
    }

    fn skip_newlines(&mut self) {
        while self.eat(&TokenKind::Newline) {}
    }

    /// Skip to the start of the next line (error recovery). Stops before a
    /// `}` so an enclosing block still sees its end.
    fn recover_line(&mut self) {
        while !matches!(
            self.peek(),
            TokenKind::Newline | TokenKind::Eof | TokenKind::RBrace
        ) {
            self.bump();
        }
        self.eat(&TokenKind::Newline);
    }

    fn end_of_line(&mut self) -> PResult<()> {
        match self.peek() {
            TokenKind::Newline => {
                self.bump();
                Ok(())
            }
            TokenKind::Eof | TokenKind::RBrace => Ok(()),
            _ => Err(self.error_here("end of line")),
        }
    }

    fn file(&mut self) -> File {
        let mut file = File::default();
        self.skip_newlines();
        if let TokenKind::Ident(word) = self.peek().clone() {
            let kind = match word.as_str() {
                "model" => Some(ItemKind::Model),
                "drafter" => Some(ItemKind::Drafter),
                "preset" => Some(ItemKind::Preset),
                _ => None,
            };
            if let Some(kind) = kind {
                let start = self.bump().span;
                match self.item_name() {
                    Ok(name) => {
                        let span = start.to(name.span);
                        file.header = Some(Header { kind, name, span });
                        if self.end_of_line().is_err() {
                            self.recover_line();
                        }
                    }
                    Err(Recover) => self.recover_line(),
                }
            }
        }
        self.lines(&mut file.settings, &mut file.stmts, None);
        file
    }

    /// The item name; the lexer keeps `smollm2-135m` in one token.
    fn item_name(&mut self) -> PResult<Ident> {
        self.ident("a name after the item keyword")
    }

    /// Lines until EOF (top level) or `}` (inside a repeat block).
    fn lines(&mut self, settings: &mut Vec<Setting>, stmts: &mut Vec<Stmt>, block: Option<Span>) {
        loop {
            self.skip_newlines();
            match self.peek() {
                TokenKind::Eof => {
                    if let Some(open) = block {
                        self.diags.push(
                            Diagnostic::error(open, "unterminated `repeat` block")
                                .with_label("this `{` is never closed")
                                .with_note(
                                    "expected `}` on its own line before the end of the file",
                                ),
                        );
                    }
                    return;
                }
                TokenKind::RBrace => {
                    if block.is_some() {
                        return;
                    }
                    let span = self.bump().span;
                    self.diags.push(
                        Diagnostic::error(span, "unmatched `}`")
                            .with_label("no `repeat` block is open here"),
                    );
                }
                _ => match self.line(settings, stmts) {
                    Ok(()) => {
                        if self.end_of_line().is_err() {
                            self.recover_line();
                        }
                    }
                    Err(Recover) => self.recover_line(),
                },
            }
        }
    }

    fn line(&mut self, settings: &mut Vec<Setting>, stmts: &mut Vec<Stmt>) -> PResult<()> {
        let start = self.span();
        let word = match self.peek().clone() {
            TokenKind::Ident(w) => w,
            _ => {
                return Err(self.error_here(
                    "a statement (`name = …`, `input`, `output`, `repeat`) or a setting",
                ))
            }
        };
        let kind = match word.as_str() {
            "input" => {
                self.bump();
                let name = self.ident("an input name")?;
                let source = if self.eat(&TokenKind::Eq) {
                    Some(self.expr()?)
                } else {
                    None
                };
                let ty = self.type_ann()?;
                StmtKind::Input { name, source, ty }
            }
            "output" => {
                self.bump();
                self.let_stmt(true)?
            }
            "emit" => {
                self.bump();
                let stream = self.ident("a stream name such as `hidden`")?;
                self.expect(TokenKind::LBracket, "`[`")?;
                let index = self.expr()?;
                self.expect(TokenKind::RBracket, "`]`")?;
                self.expect(TokenKind::Eq, "`=`")?;
                let value = self.expr()?;
                StmtKind::Emit {
                    stream,
                    index,
                    value,
                }
            }
            "memory" | "append" => {
                self.bump();
                let name = self.ident("a memory name")?;
                let index = if self.eat(&TokenKind::LBracket) {
                    let e = self.expr()?;
                    self.expect(TokenKind::RBracket, "`]`")?;
                    Some(e)
                } else {
                    None
                };
                self.expect(TokenKind::Eq, "`=`")?;
                let value = self.expr()?;
                if word == "memory" {
                    StmtKind::Memory {
                        name,
                        index,
                        init: value,
                    }
                } else {
                    StmtKind::Append { name, index, value }
                }
            }
            "repeat" => {
                self.bump();
                let var = self.ident("a loop variable")?;
                match self.peek() {
                    TokenKind::Ident(w) if w == "in" => {
                        self.bump();
                    }
                    _ => return Err(self.error_here("`in`")),
                }
                let range = self.expr()?;
                let (start_e, end_e) = match range.kind {
                    ExprKind::Range(a, b) => (*a, *b),
                    _ => {
                        self.diags.push(
                            Diagnostic::error(range.span, "expected a range `start..end`")
                                .with_label("e.g. `repeat i in 0..n`"),
                        );
                        return Err(Recover);
                    }
                };
                let open = self.expect(TokenKind::LBrace, "`{`")?;
                self.end_of_line()?;
                let mut body = Vec::new();
                let mut inner_settings = Vec::new();
                self.lines(&mut inner_settings, &mut body, Some(open));
                for s in inner_settings {
                    self.diags.push(
                        Diagnostic::error(s.span, "settings are not allowed inside `repeat`")
                            .with_label("move this setting to the top of the file"),
                    );
                }
                if !self.eat(&TokenKind::RBrace) {
                    return Err(Recover); // unterminated; already reported
                }
                StmtKind::Repeat {
                    var,
                    start: start_e,
                    end: end_e,
                    body,
                    open,
                }
            }
            _ => match self.peek_at(1) {
                TokenKind::Eq | TokenKind::Comma => self.let_stmt(false)?,
                TokenKind::PlusEq => {
                    let name = self.ident("a name")?;
                    self.bump();
                    let value = self.expr()?;
                    let ty = self.type_ann()?;
                    StmtKind::AddAssign { name, value, ty }
                }
                TokenKind::Newline | TokenKind::Eof | TokenKind::RBrace => {
                    self.bump();
                    return Err(self.error_here_at_prev(&word));
                }
                _ => {
                    let key = self.ident("a setting name")?;
                    let value = self.expr()?;
                    let value = self.choice(value)?;
                    let span = start.to(self.prev_span());
                    settings.push(Setting { key, value, span });
                    return Ok(());
                }
            },
        };
        stmts.push(Stmt {
            kind,
            span: start.to(self.prev_span()),
        });
        Ok(())
    }

    /// `then if FLAG else otherwise` (or `if FLAG[i]`, a per-layer flag)
    /// after a setting's value `then`; `then` alone when no `if` follows.
    fn choice(&mut self, then: Expr) -> PResult<Expr> {
        if !matches!(self.peek(), TokenKind::Ident(w) if w == "if") {
            return Ok(then);
        }
        self.bump();
        let flag = self.ident("a flag of the target preset, e.g. `tied_embeddings`")?;
        let index = if self.eat(&TokenKind::LBracket) {
            let e = self.expr()?;
            self.expect(TokenKind::RBracket, "`]`")?;
            Some(Box::new(e))
        } else {
            None
        };
        if !matches!(self.peek(), TokenKind::Ident(w) if w == "else") {
            return Err(self.error_here("`else` and the value when the flag is false"));
        }
        self.bump();
        let otherwise = self.expr()?;
        let span = then.span.to(otherwise.span);
        Ok(Expr {
            kind: ExprKind::Choose {
                then: Box::new(then),
                flag,
                index,
                otherwise: Box::new(otherwise),
            },
            span,
        })
    }

    fn error_here_at_prev(&mut self, word: &str) -> Recover {
        let span = self.prev_span();
        self.diags.push(
            Diagnostic::error(
                span,
                format!("expected `=` or a value after `{word}`, found end of line"),
            )
            .with_label("a line is `name = expression` or a setting `key value`"),
        );
        Recover
    }

    fn let_stmt(&mut self, output: bool) -> PResult<StmtKind> {
        let mut names = vec![self.binding_name()?];
        while self.eat(&TokenKind::Comma) {
            names.push(self.binding_name()?);
        }
        self.expect(TokenKind::Eq, "`=`")?;
        let value = self.expr()?;
        let ty = self.type_ann()?;
        Ok(StmtKind::Let {
            names,
            value,
            ty,
            output,
        })
    }

    fn binding_name(&mut self) -> PResult<Ident> {
        let name = self.ident("a name to bind")?;
        if KEYWORDS.contains(&name.name.as_str()) || name.name == "target" {
            self.diags.push(
                Diagnostic::error(name.span, format!("`{}` is a reserved word", name.name))
                    .with_label("pick another name"),
            );
            return Err(Recover);
        }
        Ok(name)
    }

    fn type_ann(&mut self) -> PResult<Option<TypeAnn>> {
        if !self.eat(&TokenKind::Colon) {
            return Ok(None);
        }
        let start = self.prev_span();
        self.expect(TokenKind::LBracket, "`[` starting a shape such as `[t, d]`")?;
        let mut dims = Vec::new();
        if !self.at(&TokenKind::RBracket) {
            loop {
                dims.push(self.expr()?);
                if !self.eat(&TokenKind::Comma) {
                    break;
                }
            }
        }
        self.expect(TokenKind::RBracket, "`,` or `]`")?;
        let dtype = match self.peek() {
            TokenKind::Ident(_) => Some(self.ident("a dtype")?),
            _ => None,
        };
        Ok(Some(TypeAnn {
            dims,
            dtype,
            span: start.to(self.prev_span()),
        }))
    }

    fn expr(&mut self) -> PResult<Expr> {
        if self.depth >= MAX_DEPTH {
            let span = self.span();
            self.diags.push(
                Diagnostic::error(span, "expression nested too deeply")
                    .with_label(format!("more than {MAX_DEPTH} levels of nesting")),
            );
            return Err(Recover);
        }
        self.depth += 1;
        let e = self.expr_inner();
        self.depth -= 1;
        e
    }

    fn expr_inner(&mut self) -> PResult<Expr> {
        let lhs = self.sum()?;
        if self.eat(&TokenKind::DotDot) {
            let rhs = self.sum()?;
            let span = lhs.span.to(rhs.span);
            return Ok(Expr {
                kind: ExprKind::Range(Box::new(lhs), Box::new(rhs)),
                span,
            });
        }
        Ok(lhs)
    }

    fn sum(&mut self) -> PResult<Expr> {
        let mut lhs = self.term()?;
        loop {
            let op = match self.peek() {
                TokenKind::Plus => BinOp::Add,
                TokenKind::Minus => BinOp::Sub,
                _ => return Ok(lhs),
            };
            self.bump();
            let rhs = self.term()?;
            let span = lhs.span.to(rhs.span);
            lhs = Expr {
                kind: ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
                span,
            };
        }
    }

    fn term(&mut self) -> PResult<Expr> {
        let mut lhs = self.unary()?;
        loop {
            let op = match self.peek() {
                TokenKind::Star => BinOp::Mul,
                TokenKind::Slash => BinOp::Div,
                TokenKind::Percent => BinOp::Rem,
                _ => return Ok(lhs),
            };
            self.bump();
            let rhs = self.unary()?;
            let span = lhs.span.to(rhs.span);
            lhs = Expr {
                kind: ExprKind::Binary(op, Box::new(lhs), Box::new(rhs)),
                span,
            };
        }
    }

    fn unary(&mut self) -> PResult<Expr> {
        if self.at(&TokenKind::Minus) {
            let start = self.bump().span;
            if self.depth >= MAX_DEPTH {
                self.diags.push(
                    Diagnostic::error(start, "expression nested too deeply")
                        .with_label("too many `-`"),
                );
                return Err(Recover);
            }
            self.depth += 1;
            let inner = self.unary();
            self.depth -= 1;
            let inner = inner?;
            let span = start.to(inner.span);
            return Ok(Expr {
                kind: ExprKind::Neg(Box::new(inner)),
                span,
            });
        }
        self.postfix()
    }

    fn postfix(&mut self) -> PResult<Expr> {
        let mut e = self.primary()?;
        loop {
            match self.peek().clone() {
                TokenKind::Dot => {
                    self.bump();
                    let field = self.ident("a field name after `.`")?;
                    let span = e.span.to(field.span);
                    e = Expr {
                        kind: ExprKind::Field(Box::new(e), field),
                        span,
                    };
                }
                TokenKind::LParen => {
                    self.bump();
                    let args = self.args()?;
                    let close = self.expect(TokenKind::RParen, "`,` or `)`")?;
                    let mut span = e.span.to(close);
                    let weights = if let TokenKind::WeightPath(text) = self.peek().clone() {
                        let wspan = self.bump().span;
                        span = span.to(wspan);
                        Some(WeightPath { text, span: wspan })
                    } else {
                        None
                    };
                    e = Expr {
                        kind: ExprKind::Call {
                            callee: Box::new(e),
                            args,
                            weights,
                        },
                        span,
                    };
                }
                TokenKind::LBracket => {
                    self.bump();
                    let mut indices = Vec::new();
                    loop {
                        indices.push(self.expr()?);
                        if !self.eat(&TokenKind::Comma) {
                            break;
                        }
                    }
                    let close = self.expect(TokenKind::RBracket, "`,` or `]`")?;
                    let span = e.span.to(close);
                    e = Expr {
                        kind: ExprKind::Index {
                            base: Box::new(e),
                            indices,
                        },
                        span,
                    };
                }
                TokenKind::WeightPath(_) => {
                    let span = self.span();
                    self.diags.push(
                        Diagnostic::error(span, "weight names attach to op calls")
                            .with_label("put `@name` right after the `)` of the call it names"),
                    );
                    return Err(Recover);
                }
                _ => return Ok(e),
            }
        }
    }

    fn args(&mut self) -> PResult<Vec<Arg>> {
        let mut args = Vec::new();
        if self.at(&TokenKind::RParen) {
            return Ok(args);
        }
        loop {
            let name = match (self.peek().clone(), self.peek_at(1)) {
                (TokenKind::Ident(_), TokenKind::Eq) => {
                    let id = self.ident("an argument name")?;
                    self.bump();
                    Some(id)
                }
                _ => None,
            };
            let value = self.expr()?;
            // A named argument's value may choose by a preset flag.
            let value = match name {
                Some(_) => self.choice(value)?,
                None => value,
            };
            args.push(Arg { name, value });
            if !self.eat(&TokenKind::Comma) {
                return Ok(args);
            }
            if self.at(&TokenKind::RParen) {
                return Ok(args); // trailing comma
            }
        }
    }

    fn primary(&mut self) -> PResult<Expr> {
        let tok = self.peek().clone();
        let span = self.span();
        let kind = match tok {
            TokenKind::Ident(name) => {
                self.bump();
                ExprKind::Name(name)
            }
            TokenKind::Int(i) => {
                self.bump();
                ExprKind::Int(i)
            }
            TokenKind::Float(x) => {
                self.bump();
                ExprKind::Float(x)
            }
            TokenKind::LParen => {
                self.bump();
                let inner = self.expr()?;
                let close = self.expect(TokenKind::RParen, "`)`")?;
                return Ok(Expr {
                    kind: inner.kind,
                    span: span.to(close),
                });
            }
            TokenKind::LBracket => {
                self.bump();
                let mut items = Vec::new();
                if !self.at(&TokenKind::RBracket) {
                    loop {
                        items.push(self.expr()?);
                        if !self.eat(&TokenKind::Comma) {
                            break;
                        }
                    }
                }
                let close = self.expect(TokenKind::RBracket, "`,` or `]`")?;
                return Ok(Expr {
                    kind: ExprKind::List(items),
                    span: span.to(close),
                });
            }
            _ => return Err(self.error_here("an expression")),
        };
        Ok(Expr { kind, span })
    }
}

/// Parse one expression from `src` (a fragment of a larger file starting at
/// byte `offset`, e.g. the `i+1` inside `@layers.{i+1}`); spans are shifted by `offset`.
pub fn parse_expr_fragment(src: &str, offset: usize) -> Result<Expr, Vec<Diagnostic>> {
    let (mut tokens, mut diags) = lex(src);
    let shift = |s: Span| Span::new(s.start as usize + offset, s.end as usize + offset);
    for t in &mut tokens {
        t.span = shift(t.span);
    }
    for d in &mut diags {
        d.span = shift(d.span);
    }
    let mut p = Parser {
        tokens,
        pos: 0,
        diags: Vec::new(),
        depth: 0,
    };
    let e = p.expr();
    if !p.at(&TokenKind::Eof) && e.is_ok() {
        let _ = p.error_here("end of the expression");
    }
    diags.append(&mut p.diags);
    match e {
        Ok(e) if diags.is_empty() => Ok(e),
        _ => Err(diags),
    }
}
