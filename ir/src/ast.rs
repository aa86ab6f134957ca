//! The parsed form of a description file ("parsed" layer): syntax only, with
//! spans. Names are not resolved and shapes are not checked here; `lower`
//! turns this into a typed `Graph`.

use crate::span::Span;

/// What a file describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ItemKind {
    /// A complete model, e.g. the Llama-family target (`model llama`).
    Model,
    /// A drafter that reads the target's states (`drafter specformer`).
    Drafter,
    /// Symbol values for a model family (`preset smollm2-135m`).
    Preset,
}

impl ItemKind {
    pub fn keyword(self) -> &'static str {
        match self {
            ItemKind::Model => "model",
            ItemKind::Drafter => "drafter",
            ItemKind::Preset => "preset",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub kind: ItemKind,
    pub name: Ident,
    pub span: Span,
}

/// `key value` line, e.g. `kind parallel`, `l 4`, `d 576`.
#[derive(Clone, Debug, PartialEq)]
pub struct Setting {
    pub key: Ident,
    pub value: Expr,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq, Default)]
pub struct File {
    pub header: Option<Header>,
    pub settings: Vec<Setting>,
    pub stmts: Vec<Stmt>,
}

/// `: [t, 4, d] f32`
#[derive(Clone, Debug, PartialEq)]
pub struct TypeAnn {
    pub dims: Vec<Expr>,
    pub dtype: Option<Ident>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    pub kind: StmtKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum StmtKind {
    /// `input NAME [= SOURCE] [: TYPE]`
    Input {
        name: Ident,
        source: Option<Expr>,
        ty: Option<TypeAnn>,
    },
    /// `[output] a[, b…] = EXPR [: TYPE]`
    Let {
        names: Vec<Ident>,
        value: Expr,
        ty: Option<TypeAnn>,
        output: bool,
    },
    /// `NAME += EXPR [: TYPE]` (residual update: a new SSA value replacing NAME)
    AddAssign {
        name: Ident,
        value: Expr,
        ty: Option<TypeAnn>,
    },
    /// `emit STREAM[INDEX] = EXPR` — a model exposes e.g. `hidden[i]` to drafters.
    Emit {
        stream: Ident,
        index: Expr,
        value: Expr,
    },
    /// `memory NAME[INDEX] = EXPR` — a per-sequence memory stream seeded for committed tokens.
    Memory {
        name: Ident,
        index: Option<Expr>,
        init: Expr,
    },
    /// `append NAME[INDEX] = EXPR` — add this step's rows to a memory stream.
    Append {
        name: Ident,
        index: Option<Expr>,
        value: Expr,
    },
    /// `repeat VAR in START..END { … }`
    Repeat {
        var: Ident,
        start: Expr,
        end: Expr,
        body: Vec<Stmt>,
        open: Span,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
}

#[derive(Clone, Debug, PartialEq)]
pub struct WeightPath {
    pub text: String,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Name(String),
    Int(i64),
    Float(f64),
    Neg(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `a.b` (only `target.x` is meaningful)
    Field(Box<Expr>, Ident),
    /// `callee(args) [@weights]`
    Call {
        callee: Box<Expr>,
        args: Vec<Arg>,
        weights: Option<WeightPath>,
    },
    /// `base[i, j, a..b]`
    Index {
        base: Box<Expr>,
        indices: Vec<Expr>,
    },
    /// `[a, b, c]`
    List(Vec<Expr>),
    /// `a..b` (inside index lists)
    Range(Box<Expr>, Box<Expr>),
    /// `a if flag else b`: one of two values by a flag of the target preset
    /// (`tied_embeddings`), or by one layer's entry of a per-layer flag
    /// (`a if sliding[i] else b`: the preset's `sliding[0]`, `sliding[1]`,
    /// …). A setting's value and a named argument's are parsed this way.
    Choose {
        then: Box<Expr>,
        flag: Ident,
        index: Option<Box<Expr>>,
        otherwise: Box<Expr>,
    },
}
