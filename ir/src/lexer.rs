//! The lexer: source text to tokens. Newlines are tokens (one statement per
//! line); `#` starts a comment; `@a.b.{i}.c` is one weight-path token.

use crate::diagnostic::Diagnostic;
use crate::span::Span;

#[derive(Clone, Debug, PartialEq)]
pub enum TokenKind {
    Ident(String),
    Int(i64),
    Float(f64),
    /// `@path.to.{i}.weight`, without the `@`.
    WeightPath(String),
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Comma,
    Colon,
    Dot,
    DotDot,
    Eq,
    PlusEq,
    Plus,
    Minus,
    Star,
    Slash,
    Percent,
    Newline,
    Eof,
}

impl TokenKind {
    /// How the token is named in "expected …, found …" messages.
    pub fn describe(&self) -> String {
        match self {
            TokenKind::Ident(s) => format!("`{s}`"),
            TokenKind::Int(i) => format!("`{i}`"),
            TokenKind::Float(x) => format!("`{x}`"),
            TokenKind::WeightPath(p) => format!("`@{p}`"),
            TokenKind::Newline => "end of line".into(),
            TokenKind::Eof => "end of file".into(),
            other => format!("`{}`", other.symbol()),
        }
    }

    fn symbol(&self) -> &'static str {
        match self {
            TokenKind::LParen => "(",
            TokenKind::RParen => ")",
            TokenKind::LBracket => "[",
            TokenKind::RBracket => "]",
            TokenKind::LBrace => "{",
            TokenKind::RBrace => "}",
            TokenKind::Comma => ",",
            TokenKind::Colon => ":",
            TokenKind::Dot => ".",
            TokenKind::DotDot => "..",
            TokenKind::Eq => "=",
            TokenKind::PlusEq => "+=",
            TokenKind::Plus => "+",
            TokenKind::Minus => "-",
            TokenKind::Star => "*",
            TokenKind::Slash => "/",
            TokenKind::Percent => "%",
            _ => "?",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Token {
    pub kind: TokenKind,
    pub span: Span,
}

/// Tokenise `src`. Unknown characters become diagnostics and are skipped, so
/// one stray byte does not hide the rest of the file's errors.
pub fn lex(src: &str) -> (Vec<Token>, Vec<Diagnostic>) {
    let bytes = src.as_bytes();
    let mut tokens = Vec::new();
    let mut diags = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        let single = |kind| Some((kind, 1));
        let simple = match c {
            b'(' => single(TokenKind::LParen),
            b')' => single(TokenKind::RParen),
            b'[' => single(TokenKind::LBracket),
            b']' => single(TokenKind::RBracket),
            b'{' => single(TokenKind::LBrace),
            b'}' => single(TokenKind::RBrace),
            b',' => single(TokenKind::Comma),
            b':' => single(TokenKind::Colon),
            b'=' => single(TokenKind::Eq),
            b'-' => single(TokenKind::Minus),
            b'*' => single(TokenKind::Star),
            b'/' => single(TokenKind::Slash),
            b'%' => single(TokenKind::Percent),
            b'\n' => single(TokenKind::Newline),
            b'+' if bytes.get(i + 1) == Some(&b'=') => Some((TokenKind::PlusEq, 2)),
            b'+' => single(TokenKind::Plus),
            b'.' if bytes.get(i + 1) == Some(&b'.') => Some((TokenKind::DotDot, 2)),
            b'.' => single(TokenKind::Dot),
            _ => None,
        };
        if let Some((kind, len)) = simple {
            tokens.push(Token {
                kind,
                span: Span::new(start, start + len),
            });
            i += len;
            continue;
        }
        match c {
            b' ' | b'\t' | b'\r' => i += 1,
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'@' if bytes.get(i + 1) == Some(&b'(') => {
                // `@(a if flag else b)`: the text up to the matching `)` on
                // this line; the lowering reads the choice.
                let mut j = i + 2;
                let mut depth = 1;
                while j < bytes.len() && bytes[j] != b'\n' && depth > 0 {
                    depth += (bytes[j] == b'(') as i32 - (bytes[j] == b')') as i32;
                    j += 1;
                }
                if depth > 0 {
                    diags.push(
                        Diagnostic::error(Span::new(start, j), "unclosed `(` in weight name")
                            .with_label("expected `)` before the end of the line"),
                    );
                }
                // Kept when unclosed too (the lowering skips it), so the
                // call does not also read as missing its weights.
                tokens.push(Token {
                    kind: TokenKind::WeightPath(src[start + 1..j].to_string()),
                    span: Span::new(start, j),
                });
                i = j;
            }
            b'@' => {
                i += 1;
                let mut depth = 0i32;
                while i < bytes.len() {
                    let b = bytes[i];
                    let ok = b.is_ascii_alphanumeric()
                        || b == b'_'
                        || b == b'.'
                        || b == b'{'
                        || b == b'}'
                        || (depth > 0 && (b"+-*/ ".contains(&b)));
                    if !ok || (b == b'}' && depth == 0) {
                        break;
                    }
                    depth += (b == b'{') as i32 - (b == b'}') as i32;
                    i += 1;
                }
                let text = &src[start + 1..i];
                if text.is_empty() {
                    diags.push(
                        Diagnostic::error(
                            Span::new(start, start + 1),
                            "empty weight name after `@`",
                        )
                        .with_label("expected a tensor name such as `@downsample`"),
                    );
                } else {
                    tokens.push(Token {
                        kind: TokenKind::WeightPath(text.to_string()),
                        span: Span::new(start, i),
                    });
                }
            }
            b'0'..=b'9' => {
                let (kind, len) = lex_number(&src[i..]);
                match kind {
                    Some(kind) => tokens.push(Token {
                        kind,
                        span: Span::new(start, start + len),
                    }),
                    None => diags.push(
                        Diagnostic::error(Span::new(start, start + len), "malformed number")
                            .with_label("this number does not fit or is not well formed"),
                    ),
                }
                i += len;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                let word = &src[start..i];
                let first_token = tokens.iter().all(|t| t.kind == TokenKind::Newline);
                tokens.push(Token {
                    kind: TokenKind::Ident(word.to_string()),
                    span: Span::new(start, i),
                });
                // The item name after a header keyword may hold `-` and `.` and
                // start with digits (`smollm2-135m`): lex it as one word.
                if first_token && matches!(word, "model" | "drafter" | "preset") {
                    while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
                        i += 1;
                    }
                    let name_start = i;
                    while i < bytes.len()
                        && (bytes[i].is_ascii_alphanumeric() || b"_-.".contains(&bytes[i]))
                    {
                        i += 1;
                    }
                    if i > name_start {
                        tokens.push(Token {
                            kind: TokenKind::Ident(src[name_start..i].to_string()),
                            span: Span::new(name_start, i),
                        });
                    }
                }
            }
            _ => {
                let ch = src[i..].chars().next().unwrap_or('\u{fffd}');
                let len = ch.len_utf8().max(1);
                diags.push(
                    Diagnostic::error(
                        Span::new(start, start + len),
                        format!("unexpected character {ch:?}"),
                    )
                    .with_label("not part of the description language"),
                );
                i += len;
            }
        }
    }
    tokens.push(Token {
        kind: TokenKind::Eof,
        span: Span::new(src.len(), src.len()),
    });
    (tokens, diags)
}

/// Lex an integer or float at the start of `s`; returns the token (None if
/// malformed) and the number of bytes consumed.
fn lex_number(s: &str) -> (Option<TokenKind>, usize) {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'_') {
        i += 1;
    }
    let mut is_float = false;
    // `1.5` is a float, `0..n` is a range: only a digit after the dot makes a float.
    if i + 1 < b.len() && b[i] == b'.' && b[i + 1].is_ascii_digit() {
        is_float = true;
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        let mut j = i + 1;
        if j < b.len() && (b[j] == b'+' || b[j] == b'-') {
            j += 1;
        }
        if j < b.len() && b[j].is_ascii_digit() {
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            is_float = true;
            i = j;
        }
    }
    // Letters glued to a number (`3d`) make it malformed rather than two tokens.
    let mut end = i;
    while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
        end += 1;
    }
    if end != i {
        return (None, end);
    }
    let text: String = s[..i].chars().filter(|c| *c != '_').collect();
    let kind = if is_float {
        text.parse::<f64>()
            .ok()
            .filter(|x| x.is_finite())
            .map(TokenKind::Float)
    } else {
        text.parse::<i64>().ok().map(TokenKind::Int)
    };
    (kind, i)
}
