//! The one error type of `draftc-ops`.
//!
//! Every launch function validates its arguments on the host and returns an
//! [`OpsError`] instead of launching a kernel that would read or write out of
//! bounds. Each variant names the op and carries enough context (argument,
//! expected vs found shape or dtype) to be reported to a user unchanged.

use crate::tensor::DType;

/// Errors from the kernel library. `op` is the launch function's name
/// (`"rms_norm"`, `"linear"`, ...); `arg` the offending argument's name.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum OpsError {
    /// An argument's shape does not fit the op or the other arguments.
    #[error("{op}: argument `{arg}` expected shape {expected}, found {found:?}")]
    ShapeMismatch {
        op: &'static str,
        arg: &'static str,
        /// Human-readable expected shape, e.g. `[rows, 576]` or `[12]`.
        expected: String,
        found: Vec<usize>,
    },
    /// An argument has no elements (or a zero-sized dimension) where the op needs some.
    #[error("{op}: argument `{arg}` is empty (shape {shape:?})")]
    EmptyInput {
        op: &'static str,
        arg: &'static str,
        shape: Vec<usize>,
    },
    /// A scalar argument is out of its domain (chunk size 0, odd head_dim, k > n, ...).
    #[error("{op}: invalid argument: {reason}")]
    InvalidArgument { op: &'static str, reason: String },
    /// An argument has the wrong element type for this op or for the other arguments.
    #[error("{op}: argument `{arg}` expected dtype {expected}, found {found}")]
    DTypeMismatch {
        op: &'static str,
        arg: &'static str,
        expected: DType,
        found: DType,
    },
    /// The device cannot run this op at this dtype (e.g. bf16 on wgpu).
    #[error("{op}: dtype {dtype} is not supported on this device")]
    UnsupportedDType { op: &'static str, dtype: DType },
    /// An index read from user data (token id, parent index) is out of range.
    #[error(
        "{op}: argument `{arg}` has index {index} at position {position}, out of range 0..{bound}"
    )]
    IndexOutOfRange {
        op: &'static str,
        arg: &'static str,
        position: usize,
        index: u64,
        bound: usize,
    },
    /// The compute server reported an error (launch, resource limit, read-back).
    #[error("{op}: device error: {message}")]
    Device { op: &'static str, message: String },
}

impl OpsError {
    /// Wraps a cubecl `ServerError` (kept as text: it is not `Clone`/`PartialEq`).
    pub fn device(op: &'static str, err: impl std::fmt::Debug) -> Self {
        OpsError::Device {
            op,
            message: format!("{err:?}"),
        }
    }
}

/// Result alias used throughout the crate.
pub type Result<T, E = OpsError> = std::result::Result<T, E>;
