//! The one error enum of codegen: what went wrong, with the context needed
//! to act on it (the node, the symbol, the tensor). Binding errors of weight
//! tensors live in `bind.rs` (`BindError`) because they are collected, not
//! fail-fast.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum CodegenError {
    /// A dimension of `node` could not be evaluated at the plan's configuration.
    #[error("cannot evaluate dimension `{dim}` of `{node}`: {reason}")]
    Dim {
        node: String,
        dim: String,
        reason: String,
    },
    /// `target.embed`/`target.norm`/`target.lm_head` used, but the target model
    /// file does not export the tensor prefix it binds to.
    #[error("`{op}` in `{node}` needs the target model's `{export}` export, which is not set")]
    MissingExport {
        op: &'static str,
        node: String,
        export: &'static str,
    },
    /// A broken invariant between passes (a bug in codegen, not in the input).
    #[error("codegen invariant broken: {0}")]
    Internal(String),
    /// A plan configuration value is out of range.
    #[error("invalid plan configuration: {0}")]
    Config(String),
}
