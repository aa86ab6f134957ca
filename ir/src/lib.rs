//! draftc-ir: the description language. Source text is lexed, parsed into
//! an AST (`ast`), lowered against a target preset into a typed SSA `Graph`
//! (`lower`), verified (`verify`), printed back (`print`), measured (`stats`)
//! and exported (`dot`). Every user mistake is a `Diagnostic`.
//!
//! **Invariant:** this crate does not depend on cubecl or any device.

pub mod ast;
pub mod config;
pub mod diagnostic;
pub mod dim;
pub mod dot;
pub mod graph;
pub mod lexer;
pub mod lower;
pub mod op;
pub mod parser;
pub mod print;
pub mod span;
pub mod stats;
#[cfg(feature = "testing")]
pub mod testing;
pub mod types;
pub mod verify;

use std::collections::BTreeMap;

pub use ast::ItemKind;
pub use config::TargetConfig;
pub use diagnostic::{render_all, Diagnostic};
pub use graph::{Graph, Node, ValueId};
pub use lower::{NoFiles, Resolver};
pub use span::Span;

/// Source bytes as text; invalid UTF-8 is a diagnostic at the first bad byte.
pub fn decode(bytes: &[u8]) -> Result<&str, Diagnostic> {
    std::str::from_utf8(bytes).map_err(|e| {
        let at = e.valid_up_to();
        let bad = bytes[at];
        Diagnostic::error(
            Span::new(at, at + 1),
            format!("file is not valid UTF-8: byte 0x{bad:02x}"),
        )
        .with_label("invalid byte here")
        .with_note("description files are UTF-8 text")
    })
}

/// What a file declares in its header, if it parses that far.
pub fn header(src: &str) -> Option<(ItemKind, String)> {
    let (file, _) = parser::parse(src);
    file.header.map(|h| (h.kind, h.name.name))
}

/// Parse a preset file.
pub fn parse_preset(src: &str) -> Result<TargetConfig, Vec<Diagnostic>> {
    let (file, diags) = parser::parse(src);
    if !diags.is_empty() {
        return Err(diags);
    }
    lower::settings_read_preset(&file)
}

/// Parse and lower a model or drafter file against a target preset.
/// `symbols` overrides integer settings (`l=8`).
pub fn compile(
    src: &str,
    target: &TargetConfig,
    symbols: &BTreeMap<String, i64>,
    resolver: &dyn Resolver,
) -> Result<Graph, Vec<Diagnostic>> {
    let (file, mut diags) = parser::parse(src);
    match lower::lower(&file, diags.is_empty(), target, symbols, resolver) {
        Ok(g) if diags.is_empty() => Ok(g),
        Ok(_) => Err(diags),
        Err(more) => {
            diags.extend(more);
            let mut seen = std::collections::HashSet::new();
            diags.retain(|d| seen.insert((d.span, d.message.clone())));
            diags.sort_by_key(|d| d.span.start);
            Err(diags)
        }
    }
}
