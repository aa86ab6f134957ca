//! User-facing diagnostics: collected (never fail-fast), each with a primary
//! span, optional secondary labels and notes, rendered with file:line:col, the
//! source line and a caret by `codespan-reporting`.

use codespan_reporting::diagnostic::{Diagnostic as CsDiagnostic, Label as CsLabel};
use codespan_reporting::files::SimpleFile;
use codespan_reporting::term::{self, termcolor::Buffer, Config};

use crate::span::{line_col, Span};

/// One problem in a description file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub message: String,
    pub span: Span,
    /// Text under the caret at `span` ("expected X, found Y").
    pub label: String,
    pub secondary: Vec<(Span, String)>,
    pub notes: Vec<String>,
}

impl Diagnostic {
    pub fn error(span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            message: message.into(),
            span,
            label: String::new(),
            secondary: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn with_label(mut self, label: impl Into<String>) -> Diagnostic {
        self.label = label.into();
        self
    }

    pub fn with_secondary(mut self, span: Span, label: impl Into<String>) -> Diagnostic {
        self.secondary.push((span, label.into()));
        self
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// `file:line:col` of the primary span.
    pub fn location(&self, file: &str, src: &str) -> String {
        let (line, col) = line_col(src, self.span.start as usize);
        format!("{file}:{line}:{col}")
    }

    /// Render like a compiler: `error: msg`, `--> file:line:col`, the source
    /// line and a caret under the span. `color` enables ANSI colours.
    pub fn render(&self, file: &str, src: &str, color: bool) -> String {
        render_all(std::slice::from_ref(self), file, src, color)
    }
}

/// Render several diagnostics of one file, in order.
pub fn render_all(diags: &[Diagnostic], file: &str, src: &str, color: bool) -> String {
    let files = SimpleFile::new(file, src);
    let mut buffer = if color {
        Buffer::ansi()
    } else {
        Buffer::no_color()
    };
    let config = Config::default();
    let clamp = |s: Span| {
        let end = (s.end as usize).min(src.len());
        let start = (s.start as usize).min(end);
        start..end
    };
    for d in diags {
        let mut labels = vec![CsLabel::primary((), clamp(d.span)).with_message(&d.label)];
        for (span, text) in &d.secondary {
            labels.push(CsLabel::secondary((), clamp(*span)).with_message(text));
        }
        let cs = CsDiagnostic::error()
            .with_message(&d.message)
            .with_labels(labels)
            .with_notes(d.notes.clone());
        if term::emit_to_write_style(&mut buffer, &config, &files, &cs).is_err() {
            // Rendering can only fail on I/O to the in-memory buffer; fall back to one line.
            return format!("{}: error: {}\n", d.location(file, src), d.message);
        }
    }
    String::from_utf8_lossy(buffer.as_slice()).into_owned()
}
